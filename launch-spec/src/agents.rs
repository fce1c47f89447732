//! Where each Harbor agent looks for the model: the environment variables it reads for the base
//! URL and the API key. payload sets them in Harbor's environment (never argv) to the `api_base`
//! it hands Harbor and, when the model is exposed through a tunnel, the per-job key; `submitter
//! plan` shows them. One table, here.
//!
//! The names are Harbor 0.25's (`harbor/agents/installed/<agent>.py`, each agent's
//! `MODEL_CONNECTION.agent_provider_access`: `base_url_candidate_names` and
//! `api_key_candidate_names`, which Harbor resolves from its own environment); the contract test
//! `tests/tests/harbor_agent_vars.rs` checks every entry against the installed Harbor.

/// One agent's variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelVars {
    pub agent: &'static str,
    /// Set to Harbor's `api_base` (`…/v1`).
    pub base_url: &'static [&'static str],
    /// Set to the per-job key when the model is exposed.
    pub api_key: &'static [&'static str],
}

const OPENAI: (&[&str], &[&str]) = (&["OPENAI_BASE_URL"], &["OPENAI_API_KEY"]);

const fn openai(agent: &'static str) -> ModelVars {
    ModelVars { agent, base_url: OPENAI.0, api_key: OPENAI.1 }
}

/// The agents payload knows, by Harbor name. terminus-2 is not listed: it runs in Harbor's own
/// process and takes `api_base` as its kwarg, as it always has.
pub const MODEL_VARS: &[ModelVars] = &[
    ModelVars { agent: "openhands", base_url: &["LLM_BASE_URL"], api_key: &["LLM_API_KEY"] },
    ModelVars { agent: "openhands-sdk", base_url: &["LLM_BASE_URL"], api_key: &["LLM_API_KEY"] },
    ModelVars { agent: "mini-swe-agent", base_url: &["OPENAI_BASE_URL"], api_key: &["MSWEA_API_KEY"] },
    // swe-agent reads no key variable of its own (its hosted_vllm path takes OPENAI_API_KEY from the provider).
    ModelVars { agent: "swe-agent", base_url: &["OPENAI_BASE_URL"], api_key: &[] },
    openai("codex"),
    openai("opencode"),
    openai("qwen-coder"),
    openai("goose"),
    openai("trae-agent"),
    openai("hermes"),
    openai("kimi-cli"),
    openai("langgraph"),
    openai("deerflow"),
    openai("nemo-agent"),
    openai("mimo"),
    openai("pi"),
    openai("strands"),
];

/// Read by litellm's `hosted_vllm` provider, which Harbor itself uses for `hosted_vllm/<model>`:
/// always set with the key, whatever the agent.
pub const HOSTED_VLLM_KEY: &str = "HOSTED_VLLM_API_KEY";

/// The variables of `agent`; an agent not in the table gets only `api_base` and [`HOSTED_VLLM_KEY`].
pub(crate) fn model_vars(agent: &str) -> Option<&'static ModelVars> {
    MODEL_VARS.iter().find(|v| v.agent == agent)
}

/// `(name, value)` for Harbor's environment: the base-URL variables set to `api_base`, the key
/// variables (and [`HOSTED_VLLM_KEY`]) to `key` when there is one.
pub fn model_env(agent: &str, api_base: &str, key: Option<&str>) -> Vec<(String, String)> {
    let mut env = Vec::new();
    let vars = model_vars(agent);
    for name in vars.map(|v| v.base_url).unwrap_or_default() {
        env.push((name.to_string(), api_base.to_string()));
    }
    if let Some(key) = key {
        env.push((HOSTED_VLLM_KEY.to_string(), key.to_string()));
        for name in vars.map(|v| v.api_key).unwrap_or_default() {
            env.push((name.to_string(), key.to_string()));
        }
    }
    env
}

/// One line for plans: which variables `agent` gets.
pub fn describe(agent: &str, exposed: bool) -> String {
    let names: Vec<String> = model_env(agent, "", exposed.then_some("")).into_iter().map(|(n, _)| n).collect();
    if names.is_empty() {
        format!("agent {agent}: api_base only (no base-URL variables known for it)")
    } else {
        format!("agent {agent} reads {}", names.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openhands_gets_its_own_names_and_the_key_only_when_exposed() {
        let env = model_env("openhands", "https://a.a.pinggy.link/v1", Some("sk-1"));
        assert_eq!(
            env,
            [
                ("LLM_BASE_URL".to_string(), "https://a.a.pinggy.link/v1".to_string()),
                ("HOSTED_VLLM_API_KEY".to_string(), "sk-1".to_string()),
                ("LLM_API_KEY".to_string(), "sk-1".to_string()),
            ]
        );
        assert_eq!(model_env("openhands", "http://127.0.0.1:1/v1", None).len(), 1);
        let mswea: Vec<_> = model_env("mini-swe-agent", "u", Some("k")).into_iter().map(|(n, _)| n).collect();
        assert_eq!(mswea, ["OPENAI_BASE_URL", "HOSTED_VLLM_API_KEY", "MSWEA_API_KEY"]);
        assert_eq!(model_env("unknown-agent", "u", Some("k")), [("HOSTED_VLLM_API_KEY".to_string(), "k".to_string())]);
        assert_eq!(describe("codex", true), "agent codex reads OPENAI_BASE_URL, HOSTED_VLLM_API_KEY, OPENAI_API_KEY");
    }

    #[test]
    fn one_entry_per_agent() {
        let mut names: Vec<_> = MODEL_VARS.iter().map(|v| v.agent).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), MODEL_VARS.len());
    }
}
