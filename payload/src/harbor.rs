//! Harbor (SPEC §6.4): argv for a fresh run and for a resume, `model_info`, agent envs, and the
//! structural `api_base` rewrite of the job's and every trial's `config.json` on resume.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use launch_spec::launch::AgentEnv;
use launch_spec::{LaunchSpec, OutcomeClass};

use crate::failure::Failure;
use crate::secrets::Secrets;

/// Default `max_output_tokens` for `model_info` (the registry's value wins).
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 16384;
/// `max_input_tokens` when the spec has no `max_model_len`.
pub const DEFAULT_MAX_INPUT_TOKENS: u64 = 32768;

#[derive(Debug, thiserror::Error)]
pub enum HarborError {
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error(
        "{path} is not valid JSON ({reason}): Harbor cannot resume this job; move the run dir aside to start fresh"
    )]
    Json { path: PathBuf, reason: String },
    #[error("cannot write {path}: {reason}")]
    Write { path: PathBuf, reason: String },
}

impl From<HarborError> for Failure {
    fn from(err: HarborError) -> Self {
        Failure::new(OutcomeClass::Harbor, err.to_string()).with_cause("config")
    }
}

/// `model_info` for hosted_vllm: O = max_output_tokens or 16384; if O ≥ L then O = L/2, where
/// L = max_model_len or 32768. Without it every hosted_vllm trial dies before its first request.
pub fn model_info(max_model_len: Option<u64>, max_output_tokens: Option<u64>) -> serde_json::Value {
    let input = max_model_len.unwrap_or(DEFAULT_MAX_INPUT_TOKENS);
    let mut output = max_output_tokens.unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS);
    if output >= input {
        output = input / 2;
    }
    serde_json::json!({
        "max_input_tokens": input,
        "max_output_tokens": output,
        "input_cost_per_token": 0,
        "output_cost_per_token": 0,
    })
}

/// `2.0` rather than `2` (Harbor parses a float either way; the former reads as one).
pub fn format_multiplier(value: f64) -> String {
    if value.fract() == 0.0 { format!("{value:.1}") } else { format!("{value}") }
}

/// Fresh run when the run dir has no `config.json`.
pub fn is_resume(run_dir: &Path) -> bool {
    run_dir.join("config.json").is_file()
}

/// The `--ae` arguments and what Harbor's environment must carry for them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentEnvPlan {
    /// `NAME=VALUE` items, one `--ae` each.
    pub args: Vec<String>,
    /// Sources, handed to Harbor's environment (never argv): `--ae NAME=${SOURCE}`.
    pub harbor_env: BTreeMap<String, String>,
    pub warnings: Vec<String>,
}

/// Resolves agent envs with the old scripts' semantics: a source variable (`from`, default: the
/// name) set in the secrets file or else in payload's environment gives its value; otherwise the
/// literal `value` (`MODEL_API_KEY=OPENAI_API_KEY` is the key when `OPENAI_API_KEY` is set, the text
/// otherwise). A value from a variable never reaches argv: argv carries the template `${SOURCE}`
/// and Harbor's environment the value (Harbor 0.25 resolves `${VAR}` agent-env templates from its
/// own environment when it builds the agent, and stores the template, not the value, in the job's
/// `config.json`). Only a literal is written into argv.
pub fn agent_envs(list: &[AgentEnv], secrets: &Secrets, env: &dyn Fn(&str) -> Option<String>) -> AgentEnvPlan {
    let mut plan = AgentEnvPlan::default();
    for item in list {
        let source = match (&item.from, &item.value) {
            (None, Some(value)) => {
                plan.args.push(format!("{}={value}", item.name));
                continue;
            }
            (Some(from), _) => from.as_str(),
            (None, None) => item.name.as_str(),
        };
        if let Some(value) = secrets.get(source).map(str::to_string).or_else(|| env(source)) {
            plan.args.push(format!("{}=${{{source}}}", item.name));
            plan.harbor_env.insert(source.to_string(), value);
        } else if let Some(value) = &item.value {
            plan.args.push(format!("{}={value}", item.name));
        } else {
            plan.warnings.push(format!(
                "agent env {}: {source} is set neither in the secrets file nor in payload's environment; not passed",
                item.name
            ));
        }
    }
    plan
}

fn kwarg_key(kv: &str) -> &str {
    kv.split_once('=').map(|(k, _)| k).unwrap_or(kv).trim()
}

/// `harbor jobs start …` for a fresh run (SPEC §6.4), program first.
pub fn fresh_argv(spec: &LaunchSpec, program: &str, api_base: &str, agent_env_args: &[String]) -> Vec<String> {
    let h = &spec.harbor;
    let info = model_info(spec.serve.max_model_len, h.max_output_tokens);
    let mut a: Vec<String> = [
        program,
        "jobs",
        "start",
        "-p",
        &h.dataset.display().to_string(),
        "--n-concurrent",
        &h.n_concurrent.to_string(),
        "--n-attempts",
        &h.n_attempts.to_string(),
        "--job-name",
        &spec.run_tag,
        "--jobs-dir",
        &spec.jobs_dir.display().to_string(),
        "--config",
        &h.config.display().to_string(),
        "--env",
        "daytona",
        "--agent",
        &h.agent,
        "--model",
        &format!("hosted_vllm/{}", spec.model.served_name),
        "--agent-kwarg",
        &format!("api_base={api_base}"),
        "--agent-kwarg",
        &format!("model_info={}", serde_json::to_string(&info).expect("json")),
        "--timeout-multiplier",
        &format_multiplier(h.timeout_multiplier),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for kv in &h.agent_kwargs {
        if matches!(kwarg_key(kv), "api_base" | "model_info") {
            continue;
        }
        a.push("--agent-kwarg".to_string());
        a.push(kv.clone());
    }
    if let Some(parser) = &h.agent_parser {
        a.push("--agent-kwarg".to_string());
        a.push(format!("parser={parser}"));
    }
    for kv in agent_env_args {
        a.push("--ae".to_string());
        a.push(kv.clone());
    }
    a.extend(h.extra_args.iter().cloned());
    a
}

/// `harbor jobs resume -p <run dir> --filter-error-type T …`, program first.
pub fn resume_argv(spec: &LaunchSpec, program: &str) -> Vec<String> {
    let mut a: Vec<String> =
        vec![program.to_string(), "jobs".into(), "resume".into(), "-p".into(), spec.run_dir.display().to_string()];
    for t in &spec.harbor.resume_filter_error_types {
        a.push("--filter-error-type".to_string());
        a.push(t.clone());
    }
    a
}

/// Sets every `api_base` string field, at any depth, to `new`. Returns how many changed.
pub fn rewrite_api_base_value(value: &mut serde_json::Value, new: &str) -> usize {
    match value {
        serde_json::Value::Object(map) => {
            let mut n = 0;
            for (key, item) in map.iter_mut() {
                if key == "api_base" && item.is_string() {
                    if item.as_str() != Some(new) {
                        *item = serde_json::Value::String(new.to_string());
                        n += 1;
                    }
                } else {
                    n += rewrite_api_base_value(item, new);
                }
            }
            n
        }
        serde_json::Value::Array(items) => items.iter_mut().map(|i| rewrite_api_base_value(i, new)).sum(),
        _ => 0,
    }
}

/// The job's `config.json` and every trial's (`<run_dir>/<trial>/config.json`).
pub fn config_files(run_dir: &Path) -> Vec<PathBuf> {
    let mut files = vec![run_dir.join("config.json")];
    let mut trials: Vec<PathBuf> = std::fs::read_dir(run_dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path().join("config.json"))
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    trials.sort();
    files.extend(trials);
    files
}

/// Rewrites `api_base` structurally in the job's and every trial's `config.json` (parsed as JSON,
/// written back atomically with Harbor's 4-space indent). Returns (file, fields changed) per file.
pub fn rewrite_api_base(run_dir: &Path, new: &str) -> Result<Vec<(PathBuf, usize)>, HarborError> {
    let mut out = Vec::new();
    for path in config_files(run_dir) {
        let mut value = read_config(&path)?;
        let changed = rewrite_api_base_value(&mut value, new);
        if changed > 0 {
            write_json_atomic(&path, &value)?;
        }
        out.push((path, changed));
    }
    Ok(out)
}

/// One `config.json`: a regular file of bounded size, parsed as JSON.
fn read_config(path: &Path) -> Result<serde_json::Value, HarborError> {
    let text = launch_spec::records::read_regular(path, launch_spec::records::MAX_INPUT_BYTES)
        .map_err(|e| HarborError::Read { path: path.to_path_buf(), reason: e.to_string() })?;
    serde_json::from_str(&text).map_err(|e| HarborError::Json { path: path.to_path_buf(), reason: e.to_string() })
}

/// Checks, before the engine starts, that every `config.json` a resume rewrites can be read and
/// parsed (a corrupt trial config found only after a 20–30 min cold load wastes the allocation).
pub fn check_resume_configs(run_dir: &Path) -> Result<usize, HarborError> {
    let files = config_files(run_dir);
    for path in &files {
        read_config(path)?;
    }
    Ok(files.len())
}

fn write_json_atomic(path: &Path, value: &serde_json::Value) -> Result<(), HarborError> {
    use serde::Serialize;
    let mut buf = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, formatter);
    value.serialize(&mut ser).map_err(|e| HarborError::Write { path: path.to_path_buf(), reason: e.to_string() })?;
    launch_spec::records::write_atomically(path, &buf)
        .map_err(|e| HarborError::Write { path: path.to_path_buf(), reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::spec;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn model_info_clamp() {
        let v = model_info(None, None);
        assert_eq!(v["max_input_tokens"], 32768);
        assert_eq!(v["max_output_tokens"], 16384);
        assert_eq!(model_info(Some(8192), None)["max_output_tokens"], 4096);
        assert_eq!(model_info(Some(16384), None)["max_output_tokens"], 8192);
        assert_eq!(model_info(Some(16385), None)["max_output_tokens"], 16384);
        assert_eq!(model_info(Some(131072), Some(32768))["max_output_tokens"], 32768);
        assert_eq!(model_info(Some(32768), Some(40000))["max_output_tokens"], 16384);
        assert_eq!(model_info(None, Some(32768))["max_output_tokens"], 16384);
        assert_eq!(
            serde_json::to_string(&model_info(Some(40960), None)).unwrap(),
            r#"{"max_input_tokens":40960,"max_output_tokens":16384,"input_cost_per_token":0,"output_cost_per_token":0}"#
        );
    }

    #[test]
    fn fresh_argv_exact() {
        let mut spec = spec();
        spec.serve.max_model_len = Some(32768);
        spec.harbor.agent_kwargs = s(&["temperature=0.7", "api_base=http://evil/v1", r#"extra_body={"a":1}"#]);
        spec.harbor.agent_parser = Some("xml".into());
        spec.harbor.extra_args = s(&["--export-traces", "--ek", "auto_snapshot=true"]);
        let a = fresh_argv(
            &spec,
            "/env/bin/harbor",
            "http://127.0.0.1:23456/v1",
            &s(&["MODEL_FOR_TOOLS=openai/gpt", "KEY=${KEY}"]),
        );
        assert_eq!(
            a,
            s(&[
                "/env/bin/harbor",
                "jobs",
                "start",
                "-p",
                "/data/tb2",
                "--n-concurrent",
                "32",
                "--n-attempts",
                "3",
                "--job-name",
                "tb2_qwen3-8b",
                "--jobs-dir",
                "/jobs",
                "--config",
                "/cfg/eval.yaml",
                "--env",
                "daytona",
                "--agent",
                "terminus-2",
                "--model",
                "hosted_vllm/Qwen3-8B",
                "--agent-kwarg",
                "api_base=http://127.0.0.1:23456/v1",
                "--agent-kwarg",
                r#"model_info={"max_input_tokens":32768,"max_output_tokens":16384,"input_cost_per_token":0,"output_cost_per_token":0}"#,
                "--timeout-multiplier",
                "2.0",
                "--agent-kwarg",
                "temperature=0.7",
                "--agent-kwarg",
                r#"extra_body={"a":1}"#,
                "--agent-kwarg",
                "parser=xml",
                "--ae",
                "MODEL_FOR_TOOLS=openai/gpt",
                "--ae",
                "KEY=${KEY}",
                "--export-traces",
                "--ek",
                "auto_snapshot=true",
            ])
        );
    }

    #[test]
    fn resume_argv_exact() {
        let a = resume_argv(&spec(), "harbor");
        let mut want = s(&["harbor", "jobs", "resume", "-p", "/jobs/tb2_qwen3-8b"]);
        for t in launch_spec::launch::INFRA_ERROR_TYPES {
            want.push("--filter-error-type".into());
            want.push(t.to_string());
        }
        assert_eq!(a, want);
        assert_eq!(a.len(), 5 + 2 * 12);
    }

    #[test]
    fn multiplier_format() {
        assert_eq!(format_multiplier(2.0), "2.0");
        assert_eq!(format_multiplier(16.0), "16.0");
        assert_eq!(format_multiplier(1.5), "1.5");
    }

    #[test]
    fn agent_envs_keep_secrets_out_of_argv() {
        let secrets =
            Secrets::from_pairs(Path::new("/s.env"), [("SERPAPI_API_KEY".to_string(), "serp-secret".to_string())]);
        let list = vec![
            AgentEnv { name: "SERPAPI_API_KEY".into(), from: None, value: None },
            AgentEnv { name: "MODEL_FOR_TOOLS".into(), from: None, value: Some("openai/gpt-5.2".into()) },
            AgentEnv { name: "MODEL_API_KEY".into(), from: Some("OPENAI_API_KEY".into()), value: None },
            AgentEnv { name: "SEC_EDGAR_API_KEY".into(), from: Some("SEC_EDGAR_API_KEY".into()), value: None },
        ];
        let env = |k: &str| (k == "SEC_EDGAR_API_KEY").then(|| "edgar-secret".to_string());
        let plan = agent_envs(&list, &secrets, &env);
        assert_eq!(
            plan.args,
            s(&[
                "SERPAPI_API_KEY=${SERPAPI_API_KEY}",
                "MODEL_FOR_TOOLS=openai/gpt-5.2",
                "SEC_EDGAR_API_KEY=${SEC_EDGAR_API_KEY}"
            ])
        );
        assert_eq!(plan.harbor_env["SERPAPI_API_KEY"], "serp-secret");
        assert_eq!(plan.harbor_env["SEC_EDGAR_API_KEY"], "edgar-secret");
        assert_eq!(plan.warnings.len(), 1);
        assert!(plan.warnings[0].contains("OPENAI_API_KEY"));
        assert!(!plan.args.iter().any(|a| a.contains("serp-secret") || a.contains("edgar-secret")));
    }

    #[test]
    fn name_equals_variable_takes_the_value_else_the_literal() {
        // The preset's `MODEL_API_KEY=OPENAI_API_KEY` (submitter writes from and value).
        let item = AgentEnv {
            name: "MODEL_API_KEY".into(),
            from: Some("OPENAI_API_KEY".into()),
            value: Some("OPENAI_API_KEY".into()),
        };
        let with = Secrets::from_pairs(Path::new("/s.env"), [("OPENAI_API_KEY".to_string(), "sk-1".to_string())]);
        let plan = agent_envs(std::slice::from_ref(&item), &with, &|_| None);
        assert_eq!(plan.args, s(&["MODEL_API_KEY=${OPENAI_API_KEY}"]));
        assert_eq!(plan.harbor_env["OPENAI_API_KEY"], "sk-1");
        let plan = agent_envs(std::slice::from_ref(&item), &Secrets::none(), &|_| None);
        assert_eq!(plan.args, s(&["MODEL_API_KEY=OPENAI_API_KEY"]));
        assert!(plan.harbor_env.is_empty() && plan.warnings.is_empty());
    }

    #[test]
    fn rewrites_api_base_in_job_and_every_trial_structurally() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        let job = serde_json::json!({
            "job_name": "x",
            "agents": [{"name": "terminus-2", "kwargs": {"api_base": "http://localhost:8000/v1", "model_info": {"max_input_tokens": 1}}}],
            "note": "api_base http://localhost:8000/v1 stays in text"
        });
        std::fs::write(run.join("config.json"), serde_json::to_string_pretty(&job).unwrap()).unwrap();
        for t in ["task-a__1", "task-b__2"] {
            std::fs::create_dir(run.join(t)).unwrap();
            let trial = serde_json::json!({"agent": {"kwargs": {"api_base": "http://127.0.0.1:31000/v1"}}});
            std::fs::write(run.join(t).join("config.json"), serde_json::to_string(&trial).unwrap()).unwrap();
        }
        std::fs::create_dir(run.join("no-config")).unwrap();
        let changed = rewrite_api_base(run, "http://127.0.0.1:40000/v1").unwrap();
        assert_eq!(changed.len(), 3);
        assert!(changed.iter().all(|(_, n)| *n == 1));
        let job: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("config.json")).unwrap()).unwrap();
        assert_eq!(job["agents"][0]["kwargs"]["api_base"], "http://127.0.0.1:40000/v1");
        assert_eq!(job["note"], "api_base http://localhost:8000/v1 stays in text");
        assert_eq!(job["agents"][0]["kwargs"]["model_info"]["max_input_tokens"], 1);
        for t in ["task-a__1", "task-b__2"] {
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(run.join(t).join("config.json")).unwrap()).unwrap();
            assert_eq!(v["agent"]["kwargs"]["api_base"], "http://127.0.0.1:40000/v1");
        }
        assert!(
            std::fs::read_dir(run).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().contains("payload-tmp"))
        );
        let again = rewrite_api_base(run, "http://127.0.0.1:40000/v1").unwrap();
        assert!(again.iter().all(|(_, n)| *n == 0));
    }

    #[test]
    fn broken_config_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{not json").unwrap();
        let err = rewrite_api_base(dir.path(), "x").unwrap_err().to_string();
        assert!(err.contains("config.json"), "{err}");
    }
}
