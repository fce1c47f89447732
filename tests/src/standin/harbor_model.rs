//! Harbor 0.25's configuration and result shapes, as JSON trees: the defaults
//! of `JobConfig`, `AgentConfig`, `EnvironmentConfig`, `VerifierConfig`,
//! `DatasetConfig`, `TaskConfig`, `TrialConfig` (from `harbor/models/...`), the
//! pydantic behaviours the stand-in needs (unknown keys dropped, legacy
//! `orchestrator` migrated, `model_dump_json(exclude_defaults=True)`, equality
//! that ignores identity fields), and `JobStats` bookkeeping. Test support only.

use serde_json::{Map, Value, json};

/// Retry exceptions excluded by default (`RetryConfig.exclude_exceptions`).
pub(crate) const RETRY_EXCLUDE_DEFAULT: [&str; 10] = [
    "AgentAuthenticationError",
    "AgentSafetyRefusalError",
    "AgentTimeoutError",
    "ApiUsageLimitError",
    "ModelNotFoundError",
    "RewardFileEmptyError",
    "RewardFileNotFoundError",
    "UnsupportedModelParametersError",
    "VerifierOutputParseError",
    "VerifierTimeoutError",
];

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

pub(crate) fn retry_defaults() -> Map<String, Value> {
    obj(json!({
        "max_retries": 0, "include_exceptions": null, "exclude_exceptions": RETRY_EXCLUDE_DEFAULT,
        "wait_multiplier": 1.0, "min_wait_sec": 1.0, "max_wait_sec": 60.0
    }))
}

pub(crate) fn environment_defaults() -> Map<String, Value> {
    obj(json!({
        "type": "docker", "import_path": null, "force_build": false, "delete": true, "stream": false,
        "cpu_enforcement_policy": "auto", "memory_enforcement_policy": "auto",
        "override_cpus": null, "override_memory_mb": null, "override_storage_mb": null, "override_gpus": null,
        "override_tpu": null, "mounts": null, "extra_docker_compose": [], "env": {}, "kwargs": {}, "extra_allowed_hosts": []
    }))
}

pub(crate) fn verifier_defaults() -> Map<String, Value> {
    obj(json!({
        "override_timeout_sec": null, "max_timeout_sec": null, "include_logs": [], "exclude_logs": [], "env": {},
        "import_path": null, "kwargs": {}, "disable": false, "extra_allowed_hosts": []
    }))
}

pub(crate) fn agent_defaults() -> Map<String, Value> {
    obj(json!({
        "name": null, "import_path": null, "model_name": null, "base_url": null, "model_api_key_name": null,
        "model_api_format": null, "skip_model_parsing": false, "n_concurrent": null, "concurrency_group": null,
        "skills": [], "override_timeout_sec": null, "override_setup_timeout_sec": null, "max_timeout_sec": null,
        "resume_trajectory": false, "load_trajectory": null, "extra_allowed_hosts": [], "include_logs": [],
        "exclude_logs": [], "kwargs": {}, "env": {}, "mcp_servers": []
    }))
}

pub(crate) fn dataset_defaults() -> Map<String, Value> {
    obj(json!({
        "path": null, "name": null, "version": null, "ref": null, "registry_url": null, "registry_path": null,
        "repo": null, "overwrite": false, "download_dir": null, "task_names": null, "exclude_task_names": null, "n_tasks": null
    }))
}

pub(crate) fn task_defaults() -> Map<String, Value> {
    obj(json!({
        "path": null, "git_url": null, "git_commit_id": null, "name": null, "ref": null,
        "overwrite": false, "download_dir": null, "source": null
    }))
}

/// Top-level `JobConfig` fields in declaration order (nested models filled in
/// by [`normalize_job`]).
pub(crate) fn job_defaults() -> Map<String, Value> {
    obj(json!({
        "job_name": null, "jobs_dir": "jobs", "n_attempts": 1, "install_only": false, "skip_credential_checks": false,
        "timeout_multiplier": 1.0, "agent_timeout_multiplier": null, "verifier_timeout_multiplier": null,
        "agent_setup_timeout_multiplier": null, "environment_build_timeout_multiplier": null, "debug": false,
        "n_concurrent_trials": 4, "quiet": false, "retry": {}, "environment": {}, "verifier": {}, "metrics": [],
        "agents": [{"name": "oracle"}], "user_agent": null, "datasets": [], "tasks": [], "artifacts": [],
        "extra_instruction_paths": [], "extra_instructions": [], "source_jobs": []
    }))
}

/// `TrialConfig` fields in declaration order.
pub(crate) fn trial_defaults() -> Map<String, Value> {
    obj(json!({
        "task": {}, "trial_name": "", "trials_dir": "trials", "install_only": false, "timeout_multiplier": 1.0,
        "agent_timeout_multiplier": null, "verifier_timeout_multiplier": null, "agent_setup_timeout_multiplier": null,
        "environment_build_timeout_multiplier": null, "agent": {}, "user_agent": null, "environment": {}, "verifier": {},
        "artifacts": [], "extra_instruction_paths": [], "extra_instructions": [], "job_id": null, "source_trial": null
    }))
}

const FLOAT_KEYS: [&str; 8] = [
    "timeout_multiplier",
    "agent_timeout_multiplier",
    "verifier_timeout_multiplier",
    "agent_setup_timeout_multiplier",
    "environment_build_timeout_multiplier",
    "wait_multiplier",
    "min_wait_sec",
    "max_wait_sec",
];

fn coerce_floats(m: &mut Map<String, Value>) {
    for k in FLOAT_KEYS {
        if let Some(v) = m.get_mut(k) {
            if let Some(f) = v.as_f64() {
                *v = json!(f);
            } else if let Some(s) = v.as_str().and_then(|s| s.parse::<f64>().ok()) {
                *v = json!(s);
            }
        }
    }
    for k in ["max_timeout_sec", "override_timeout_sec", "override_setup_timeout_sec"] {
        if let Some(v) = m.get_mut(k)
            && let Some(f) = v.as_f64()
        {
            *v = json!(f);
        }
    }
}

/// Keep the known fields of `defaults` (in their order), fill missing ones
/// with defaults, drop unknown keys (pydantic's default `extra="ignore"`).
fn fill(value: &Value, defaults: &Map<String, Value>) -> Map<String, Value> {
    let given = value.as_object().cloned().unwrap_or_default();
    let mut out = Map::new();
    for (k, d) in defaults {
        out.insert(k.clone(), given.get(k).cloned().unwrap_or_else(|| d.clone()));
    }
    coerce_floats(&mut out);
    out
}

fn normalize_agent(v: &Value) -> Value {
    let mut a = fill(v, &agent_defaults());
    if a["name"].is_null() && a["import_path"].is_null() {
        a.insert("name".into(), json!("oracle"));
    }
    Value::Object(a)
}

fn normalize_env(v: &Value) -> Value {
    let mut e = fill(v, &environment_defaults());
    if e["type"].is_null() && e["import_path"].is_null() {
        e.insert("type".into(), json!("docker"));
    }
    Value::Object(e)
}

fn normalize_retry(v: &Value) -> Value {
    let mut r = fill(v, &retry_defaults());
    for k in ["include_exceptions", "exclude_exceptions"] {
        if let Some(Value::Array(a)) = r.get_mut(k) {
            let mut items: Vec<String> = a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect();
            items.sort();
            items.dedup();
            *a = items.into_iter().map(Value::String).collect();
        }
    }
    Value::Object(r)
}

/// `migrate_legacy_job_config`: `orchestrator.{n_concurrent_trials,quiet,retry}`
/// move to the top level (setdefault), `plugins` is dropped.
pub fn migrate_legacy(mut m: Map<String, Value>) -> Map<String, Value> {
    m.shift_remove("plugins");
    if let Some(orch) = m.shift_remove("orchestrator")
        && let Some(o) = orch.as_object()
    {
        if !m.contains_key("n_concurrent_trials") {
            m.insert("n_concurrent_trials".into(), o.get("n_concurrent_trials").cloned().unwrap_or(json!(4)));
        }
        for k in ["quiet", "retry"] {
            if let Some(v) = o.get(k)
                && !m.contains_key(k)
            {
                m.insert(k.into(), v.clone());
            }
        }
    }
    m
}

/// A `JobConfig` with every field present (defaults filled, unknown keys dropped).
pub fn normalize_job(v: &Value) -> Value {
    let migrated = migrate_legacy(v.as_object().cloned().unwrap_or_default());
    let mut m = fill(&Value::Object(migrated), &job_defaults());
    m.insert("retry".into(), normalize_retry(&m["retry"]));
    m.insert("environment".into(), normalize_env(&m["environment"]));
    m.insert("verifier".into(), Value::Object(fill(&m["verifier"], &verifier_defaults())));
    let agents: Vec<Value> = m["agents"].as_array().cloned().unwrap_or_default().iter().map(normalize_agent).collect();
    m.insert("agents".into(), Value::Array(agents));
    let datasets: Vec<Value> = m["datasets"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|d| Value::Object(fill(d, &dataset_defaults())))
        .collect();
    m.insert("datasets".into(), Value::Array(datasets));
    let tasks: Vec<Value> = m["tasks"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|d| Value::Object(fill(d, &task_defaults())))
        .collect();
    m.insert("tasks".into(), Value::Array(tasks));
    Value::Object(m)
}

/// A `TrialConfig` with every field present.
pub fn normalize_trial(v: &Value) -> Value {
    let mut m = fill(v, &trial_defaults());
    m.insert("task".into(), Value::Object(fill(&m["task"], &task_defaults())));
    m.insert("agent".into(), normalize_agent(&m["agent"]));
    m.insert("environment".into(), normalize_env(&m["environment"]));
    m.insert("verifier".into(), Value::Object(fill(&m["verifier"], &verifier_defaults())));
    for (section, fields) in EXCLUDED_WHEN_EMPTY {
        if let Some(map) = m.get_mut(section).and_then(Value::as_object_mut) {
            map.retain(|key, value| !(fields.contains(&key.as_str()) && is_empty(value)));
        }
    }
    Value::Object(m)
}

/// Fields Harbor 0.25's trial config models declare `exclude_if=lambda v: not v` (or `v is None`):
/// every dump (config.json, result.json's `config`, lock.json) leaves them out when empty.
const EXCLUDED_WHEN_EMPTY: [(&str, &[&str]); 3] = [
    ("agent", &["include_logs", "exclude_logs", "env"]),
    ("environment", &["env"]),
    ("verifier", &["include_logs", "exclude_logs", "env", "import_path", "kwargs", "extra_allowed_hosts"]),
];

fn is_empty(value: &Value) -> bool {
    value.is_null() || value.as_array().is_some_and(Vec::is_empty) || value.as_object().is_some_and(Map::is_empty)
}

fn prune_map(full: &Map<String, Value>, defaults: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in full {
        match defaults.get(k) {
            Some(d) if d == v => {}
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

fn prune_agent(a: &Value) -> Value {
    Value::Object(prune_map(a.as_object().unwrap_or(&Map::new()), &agent_defaults()))
}

fn prune_nested(
    m: &mut Map<String, Value>,
    key: &str,
    defaults: Map<String, Value>,
    extra_default: Option<(&str, Value)>,
) {
    if let Some(Value::Object(inner)) = m.get(key).cloned() {
        let mut d = defaults;
        if let Some((k, v)) = extra_default {
            d.insert(k.into(), v);
        }
        let p = prune_map(&inner, &d);
        if p.is_empty() {
            m.shift_remove(key);
        } else {
            m.insert(key.into(), Value::Object(p));
        }
    }
}

/// `JobConfig.model_dump_json(indent=4, exclude_defaults=True)`.
pub fn dump_job(full: &Value) -> Value {
    let full = normalize_job(full);
    let mut m = prune_map(full.as_object().unwrap_or(&Map::new()), &job_defaults());
    // job_name has a default_factory: it is written whenever set.
    if let Some(n) = full.get("job_name").filter(|v| !v.is_null()) {
        m.insert("job_name".into(), n.clone());
    }
    let mut ordered = Map::new();
    for k in job_defaults().keys() {
        if let Some(v) = m.get(k) {
            ordered.insert(k.clone(), v.clone());
        }
    }
    let mut m = ordered;
    prune_nested(&mut m, "retry", retry_defaults(), None);
    prune_nested(&mut m, "environment", environment_defaults(), None);
    prune_nested(&mut m, "verifier", verifier_defaults(), None);
    if let Some(Value::Array(a)) = m.get("agents").cloned() {
        let pruned: Vec<Value> = a.iter().map(prune_agent).collect();
        if pruned == vec![json!({"name": "oracle"})] {
            m.shift_remove("agents");
        } else {
            m.insert("agents".into(), Value::Array(pruned));
        }
    }
    for (key, d) in [("datasets", dataset_defaults()), ("tasks", task_defaults())] {
        if let Some(Value::Array(a)) = m.get(key).cloned() {
            let pruned: Vec<Value> =
                a.iter().map(|x| Value::Object(prune_map(x.as_object().unwrap_or(&Map::new()), &d))).collect();
            m.insert(key.into(), Value::Array(pruned));
        }
    }
    Value::Object(m)
}

/// `TrialConfig.model_dump_json(indent=4, exclude_defaults=True)`.
pub fn dump_trial(full: &Value) -> Value {
    let full = normalize_trial(full);
    let mut m = prune_map(full.as_object().unwrap_or(&Map::new()), &trial_defaults());
    if let Some(Value::Object(t)) = m.get("task").cloned() {
        m.insert("task".into(), Value::Object(prune_map(&t, &task_defaults())));
    }
    if let Some(a) = m.get("agent").cloned() {
        m.insert("agent".into(), prune_agent(&a));
    }
    prune_nested(&mut m, "environment", environment_defaults(), None);
    prune_nested(&mut m, "verifier", verifier_defaults(), None);
    Value::Object(m)
}

/// `JobConfig.__eq__`: everything but `job_name` and `debug` (and the
/// location, which the caller rebinds).
pub fn same_job(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut n = normalize_job(v);
        if let Some(m) = n.as_object_mut() {
            m.shift_remove("job_name");
            m.shift_remove("debug");
            m.shift_remove("jobs_dir");
        }
        n
    };
    strip(a) == strip(b)
}

/// `TrialConfig.__eq__`: everything but `trial_name` and `job_id` (and the
/// trials directory, which is rebound to the job directory).
pub fn same_trial(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut n = normalize_trial(v);
        if let Some(m) = n.as_object_mut() {
            m.shift_remove("trial_name");
            m.shift_remove("job_id");
            m.shift_remove("trials_dir");
        }
        n
    };
    strip(a) == strip(b)
}

/// `JobStats.format_agent_evals_key`.
pub fn evals_key(agent: &str, model: Option<&str>, dataset: &str) -> String {
    match model {
        Some(m) if !m.is_empty() => format!("{agent}__{m}__{dataset}"),
        _ => format!("{agent}__{dataset}"),
    }
}

/// Python's `str(float)` for reward keys: `1.0`, `0.5`.
pub fn py_float(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e16 { format!("{f:.1}") } else { format!("{f}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dump_excludes_defaults_and_migrates_orchestrator() {
        let cfg = json!({
            "job_name": "j", "jobs_dir": "jobs", "n_attempts": 3, "timeout_multiplier": 2,
            "orchestrator": {"type": "local", "n_concurrent_trials": 8, "plain_output": true},
            "environment": {"type": "daytona", "force_build": true, "delete": true},
            "agents": [{"name": "terminus-2", "max_timeout_sec": 7200, "trajectory_config": {"raw_content": true}, "kwargs": {"api_base": "http://x/v1"}}],
            "datasets": [{"path": "/d"}]
        });
        let d = dump_job(&cfg);
        assert_eq!(
            d,
            json!({
                "job_name": "j", "n_attempts": 3, "timeout_multiplier": 2.0, "n_concurrent_trials": 8,
                "environment": {"type": "daytona", "force_build": true},
                "agents": [{"name": "terminus-2", "max_timeout_sec": 7200.0, "kwargs": {"api_base": "http://x/v1"}}],
                "datasets": [{"path": "/d"}]
            })
        );
        assert!(same_job(&cfg, &d));
        let mut other = d.clone();
        other["agents"][0]["kwargs"]["api_base"] = json!("http://y/v1");
        assert!(!same_job(&cfg, &other));
    }
}
