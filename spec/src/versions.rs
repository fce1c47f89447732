//! Declared program versions: which vLLM and which Harbor an environment runs, and what follows
//! from them (vLLM's `--swap-space`, the environment variables vLLM still knows, the form of
//! terminus-2's kwargs, Harbor's `--yes`). docs/real-programs.md ("Declared versions") says which
//! versions are verified against the real programs and how to declare another.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The vLLM release the argv is verified against (its own parser accepts every argv we build).
pub const VERIFIED_VLLM: Version = Version::new(0, 33, 0);
/// The Harbor release the harness is verified against (run end to end).
pub const VERIFIED_HARBOR: Version = Version::new(0, 25, 0);
/// The first vLLM without `--swap-space` (0.17.1 still had it; 0.18.0 dropped it from EngineArgs).
pub const VLLM_SWAP_SPACE_REMOVED: Version = Version::new(0, 18, 0);
/// The first vLLM known to take `--distributed-timeout-seconds` (0.16.0's parser refuses it; 0.33.0
/// takes it; releases between are unchecked, so they go without it and keep vLLM's default).
pub const VLLM_DISTRIBUTED_TIMEOUT_ADDED: Version = Version::new(0, 33, 0);
/// The oldest Harbor whose terminus-2 has the kwargs schema this crate writes (`parser_name`,
/// `llm_call_kwargs`, unknown options refused).
pub const HARBOR_MIN: Version = Version::new(0, 25, 0);

/// vLLM environment variables a declared vLLM no longer knows, with the first release known
/// without it (verified against 0.33.0; the real removal may be earlier).
pub const RETIRED_VLLM_ENV: &[(&str, Version)] =
    &[("VLLM_USE_V1", Version::new(0, 33, 0)), ("VLLM_ALL2ALL_BACKEND", Version::new(0, 33, 0))];

/// `major.minor.patch`; a suffix after the numbers (`.post1`, `rc2`, `+cu124`) is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self { major, minor, patch }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl FromStr for Version {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("`{text}` is not a version (write it as MAJOR.MINOR.PATCH, e.g. \"0.33.0\")");
        let mut parts = text.trim().trim_start_matches('v').splitn(3, '.');
        let number = |part: Option<&str>, whole: bool| -> Result<u32, String> {
            let part = part.ok_or_else(bad)?;
            let digits: String = part.chars().take_while(|c| c.is_ascii_digit()).collect();
            if digits.is_empty() || (whole && digits.len() != part.len()) {
                return Err(bad());
            }
            digits.parse().map_err(|_| bad())
        };
        let major = number(parts.next(), true)?;
        let minor = number(parts.next(), true)?;
        // The patch may carry a suffix: `0.10.1.post1`, `0.11.0rc2`.
        let patch = number(parts.next(), false)?;
        Ok(Version::new(major, minor, patch))
    }
}

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// What a declared vLLM can do.
pub fn vllm_has_swap_space(vllm: Version) -> bool {
    vllm < VLLM_SWAP_SPACE_REMOVED
}

/// Whether a declared vLLM takes `--distributed-timeout-seconds` (multi-node engines).
pub fn vllm_has_distributed_timeout(vllm: Version) -> bool {
    vllm >= VLLM_DISTRIBUTED_TIMEOUT_ADDED
}

/// The entries of `RETIRED_VLLM_ENV` that `vllm` no longer knows.
pub fn vllm_retired_env(vllm: Version) -> impl Iterator<Item = &'static str> {
    RETIRED_VLLM_ENV.iter().filter(move |(_, since)| vllm >= *since).map(|(name, _)| *name)
}

/// The Harbor command-line and terminus-2 kwargs a Harbor speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum HarborDialect {
    /// Upstream Harbor ≥ 0.25: terminus-2 refuses unknown options, the parser option is
    /// `parser_name`, request-body extras go in `llm_call_kwargs={"extra_body": …}`, `--yes`
    /// answers confirmation prompts, `--print-config` prints the resolved job config.
    #[default]
    #[serde(rename = "harbor-0.25")]
    Harbor025,
    /// The team's Harbor fork the old scripts ran: terminus-2 takes `extra_body=…` and `parser=…`;
    /// no `--yes` (the old argv never passed it). Unverified against a real install: it is what the
    /// replaced scripts passed.
    #[serde(rename = "extra-body-fork")]
    ExtraBodyFork,
}

/// Named Harbor flavours a cluster profile may declare instead of a version.
pub const HARBOR_FLAVOURS: &[(&str, HarborDialect)] = &[("extra-body-fork", HarborDialect::ExtraBodyFork)];

impl HarborDialect {
    /// From a declared Harbor: a release (`"0.25.0"`) or a flavour name (`extra-body-fork`).
    pub fn from_declared(text: &str) -> Result<(Self, Option<Version>), String> {
        if let Some((_, dialect)) = HARBOR_FLAVOURS.iter().find(|(name, _)| *name == text.trim()) {
            return Ok((*dialect, None));
        }
        let flavours = HARBOR_FLAVOURS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
        let version: Version = text.parse().map_err(|e| format!("{e}, or name a Harbor flavour ({flavours})"))?;
        if version < HARBOR_MIN {
            return Err(format!(
                "Harbor {version} is older than {HARBOR_MIN}, the oldest release this launcher speaks; upgrade it, or declare the flavour it is ({flavours})"
            ));
        }
        Ok((HarborDialect::Harbor025, Some(version)))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            HarborDialect::Harbor025 => "harbor-0.25",
            HarborDialect::ExtraBodyFork => "extra-body-fork",
        }
    }

    /// terminus-2's parser option.
    pub fn parser_kwarg(self) -> &'static str {
        match self {
            HarborDialect::Harbor025 => "parser_name",
            HarborDialect::ExtraBodyFork => "parser",
        }
    }

    /// Whether `jobs start` takes `--yes` (and needs it: host-variable prompts abort on /dev/null).
    pub fn has_yes(self) -> bool {
        matches!(self, HarborDialect::Harbor025)
    }

    /// Whether `jobs start --print-config` prints the resolved job config and exits.
    pub fn has_print_config(self) -> bool {
        matches!(self, HarborDialect::Harbor025)
    }

    /// Options terminus-2 accepts, when the dialect's schema is known (Harbor 0.25.0's
    /// `Terminus2Options` plus the shared `AgentOptions`, aliases included).
    pub fn terminus2_options(self) -> Option<&'static [&'static str]> {
        match self {
            HarborDialect::Harbor025 => Some(TERMINUS2_025_OPTIONS),
            HarborDialect::ExtraBodyFork => None,
        }
    }
}

/// Harbor 0.25.0's terminus-2 options (`harbor/agents/terminus_2/terminus_2.py`, `Terminus2Options`
/// with `extra="forbid"`, and `harbor/agents/options.py`, `AgentOptions`).
pub const TERMINUS2_025_OPTIONS: &[&str] = &[
    "base_url",
    "disable_web_search",
    "reasoning_effort",
    "max_turns",
    "episodes",
    "max_episodes",
    "parser_name",
    "api_base",
    "temperature",
    "collect_rollout_details",
    "session_id",
    "enable_summarize",
    "proactive_summarization_threshold",
    "max_thinking_tokens",
    "model_info",
    "trajectory_config",
    "tmux_pane_width",
    "tmux_pane_height",
    "store_all_messages",
    "record_terminal_session",
    "interleaved_thinking",
    "suppress_max_turns_warning",
    "use_responses_api",
    "llm_backend",
    "llm_kwargs",
    "llm_call_kwargs",
    "session_id_headers",
];

/// Why an agent kwarg cannot be given to a Harbor, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KwargError {
    #[error("agent kwarg `{0}` is not KEY=VALUE")]
    NotKeyValue(String),
    #[error("agent kwarg `{key}`: its value is not JSON ({reason}); write it as {key}={{\"…\": …}}")]
    NotJson { key: String, reason: String },
    #[error(
        "agent kwarg `llm_call_kwargs` carries {keys}, which the extra-body-fork Harbor cannot take (it has only `extra_body`); keep only extra_body or declare harbor \"0.25.0\""
    )]
    ForkCallKwargs { keys: String },
}

fn key_value(kv: &str) -> Result<(&str, &str), KwargError> {
    kv.split_once('=')
        .map(|(k, v)| (k.trim(), v.trim()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| KwargError::NotKeyValue(kv.to_string()))
}

fn json_value(key: &str, value: &str) -> Result<serde_json::Value, KwargError> {
    serde_json::from_str(value).map_err(|e| KwargError::NotJson { key: key.to_string(), reason: e.to_string() })
}

/// Rewrites `KEY=VALUE` agent kwargs written in either form into the form `dialect` takes.
/// Harbor 0.25: `extra_body=X` → `llm_call_kwargs={"extra_body":X}` (merged with any other
/// `llm_call_kwargs`, later keys winning), `parser=P` → `parser_name=P`. The fork: the reverse.
/// Idempotent; other kwargs pass unchanged, in order (the merged one at the first one's place).
pub fn translate_agent_kwargs(kwargs: &[String], dialect: HarborDialect) -> Result<Vec<String>, KwargError> {
    let mut out: Vec<String> = Vec::new();
    let mut call: Option<(usize, serde_json::Map<String, serde_json::Value>)> = None;
    for kv in kwargs {
        let (key, value) = key_value(kv)?;
        match (dialect, key) {
            (HarborDialect::Harbor025, "extra_body") | (HarborDialect::Harbor025, "llm_call_kwargs") => {
                let parsed = json_value(key, value)?;
                let slot = call.get_or_insert_with(|| {
                    out.push(String::new());
                    (out.len() - 1, serde_json::Map::new())
                });
                if key == "extra_body" {
                    slot.1.insert("extra_body".to_string(), parsed);
                } else if let serde_json::Value::Object(map) = parsed {
                    slot.1.extend(map);
                } else {
                    return Err(KwargError::NotJson { key: key.to_string(), reason: "not an object".to_string() });
                }
            }
            (HarborDialect::Harbor025, "parser") => out.push(format!("parser_name={value}")),
            (HarborDialect::ExtraBodyFork, "llm_call_kwargs") => {
                let parsed = json_value(key, value)?;
                let map = match parsed {
                    serde_json::Value::Object(map) => map,
                    _ => {
                        return Err(KwargError::NotJson { key: key.to_string(), reason: "not an object".to_string() });
                    }
                };
                let others: Vec<&String> = map.keys().filter(|k| *k != "extra_body").collect();
                if !others.is_empty() {
                    let keys = others.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
                    return Err(KwargError::ForkCallKwargs { keys });
                }
                if let Some(body) = map.get("extra_body") {
                    out.push(format!("extra_body={body}"));
                }
            }
            (HarborDialect::ExtraBodyFork, "parser_name") => out.push(format!("parser={value}")),
            _ => out.push(kv.clone()),
        }
    }
    if let Some((index, map)) = call {
        out[index] = format!("llm_call_kwargs={}", serde_json::Value::Object(map));
    }
    Ok(out)
}

/// Keys of translated kwargs that the dialect's terminus-2 would refuse ("Unknown option").
pub fn unknown_terminus2_options(kwargs: &[String], dialect: HarborDialect) -> Vec<String> {
    let Some(known) = dialect.terminus2_options() else { return Vec::new() };
    kwargs
        .iter()
        .filter_map(|kv| key_value(kv).ok().map(|(k, _)| k.to_string()))
        .filter(|k| !known.contains(&k.as_str()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn versions_parse_and_order() {
        assert_eq!("0.33.0".parse::<Version>().unwrap(), Version::new(0, 33, 0));
        assert_eq!("0.10.1.post1".parse::<Version>().unwrap(), Version::new(0, 10, 1));
        assert_eq!("0.11.0rc2".parse::<Version>().unwrap(), Version::new(0, 11, 0));
        assert_eq!("v0.25.0".parse::<Version>().unwrap(), Version::new(0, 25, 0));
        for bad in ["", "0.33", "latest", "0.x.1", "1..2"] {
            assert!(bad.parse::<Version>().is_err(), "{bad}");
        }
        assert!(vllm_has_swap_space("0.17.1".parse().unwrap()));
        assert!(!vllm_has_swap_space("0.18.0".parse().unwrap()));
        assert!(!vllm_has_swap_space(VERIFIED_VLLM));
        assert_eq!(vllm_retired_env(VERIFIED_VLLM).collect::<Vec<_>>(), ["VLLM_USE_V1", "VLLM_ALL2ALL_BACKEND"]);
        assert_eq!(vllm_retired_env(Version::new(0, 10, 1)).count(), 0);
    }

    #[test]
    fn declared_harbor() {
        assert_eq!(HarborDialect::from_declared("0.25.0").unwrap(), (HarborDialect::Harbor025, Some(VERIFIED_HARBOR)));
        assert_eq!(HarborDialect::from_declared("extra-body-fork").unwrap(), (HarborDialect::ExtraBodyFork, None));
        let old = HarborDialect::from_declared("0.1.9").unwrap_err();
        assert!(old.contains("older than 0.25.0") && old.contains("extra-body-fork"), "{old}");
        assert!(HarborDialect::from_declared("forked").unwrap_err().contains("extra-body-fork"));
    }

    #[test]
    fn thinking_kwarg_takes_the_form_of_harbor_025() {
        let think = r#"extra_body={"chat_template_kwargs":{"enable_thinking":true}}"#;
        let out =
            translate_agent_kwargs(&s(&["temperature=0.7", think, "parser=xml"]), HarborDialect::Harbor025).unwrap();
        assert_eq!(
            out,
            s(&[
                "temperature=0.7",
                r#"llm_call_kwargs={"extra_body":{"chat_template_kwargs":{"enable_thinking":true}}}"#,
                "parser_name=xml",
            ])
        );
        // Idempotent, and merges with an explicit llm_call_kwargs.
        assert_eq!(translate_agent_kwargs(&out, HarborDialect::Harbor025).unwrap(), out);
        let merged = translate_agent_kwargs(
            &s(&[r#"llm_call_kwargs={"top_k":20}"#, r#"extra_body={"a":1}"#]),
            HarborDialect::Harbor025,
        )
        .unwrap();
        assert_eq!(merged, s(&[r#"llm_call_kwargs={"top_k":20,"extra_body":{"a":1}}"#]));
        assert!(unknown_terminus2_options(&out, HarborDialect::Harbor025).is_empty());
        assert_eq!(unknown_terminus2_options(&s(&[think]), HarborDialect::Harbor025), ["extra_body"]);
    }

    #[test]
    fn the_fork_gets_the_old_form_back() {
        let new = s(&[r#"llm_call_kwargs={"extra_body":{"x":1}}"#, "parser_name=xml", "temperature=1"]);
        let out = translate_agent_kwargs(&new, HarborDialect::ExtraBodyFork).unwrap();
        assert_eq!(out, s(&[r#"extra_body={"x":1}"#, "parser=xml", "temperature=1"]));
        assert_eq!(translate_agent_kwargs(&out, HarborDialect::ExtraBodyFork).unwrap(), out);
        let err =
            translate_agent_kwargs(&s(&[r#"llm_call_kwargs={"top_k":1}"#]), HarborDialect::ExtraBodyFork).unwrap_err();
        assert!(err.to_string().contains("`top_k`"), "{err}");
        assert!(translate_agent_kwargs(&s(&["extra_body={oops"]), HarborDialect::Harbor025).is_err());
        assert!(translate_agent_kwargs(&s(&["novalue"]), HarborDialect::Harbor025).is_err());
    }
}
