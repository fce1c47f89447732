//! # harbor-standin — a test stand-in for Harbor 0.25's `harbor jobs start|resume`
//! (test support, never shipped)
//!
//! Invoked as `harbor-standin jobs start …`, `harbor-standin jobs resume …`
//! (also `job start|resume` and `run`, as harbor 0.25 registers them). It
//! accepts exactly harbor 0.25's options for those commands
//! (`e2e::standin::harbor_opts`, extracted from the released wheel) and
//! rejects others with click/typer's error (`No such option: --foo`, exit 2).
//! It builds harbor's `JobConfig` from `--config` YAML layers plus the flags,
//! runs every task × attempt of a local dataset as a trial whose "agent" sends
//! chat completions to `{api_base}/chat/completions`, and writes harbor's job
//! and trial layout and JSON shapes.
//!
//! Behaviour knobs (environment variables):
//!
//! | variable | meaning |
//! |---|---|
//! | `STANDIN_TRIAL_SECONDS` | wall time of one trial outside the model calls (default 0.05) |
//! | `STANDIN_TURNS` | chat completions per trial (default 2) |
//! | `STANDIN_PROMPT_CHARS` | extra characters appended to the first user message (default 0), to provoke context overflow |
//! | `STANDIN_MAX_TOKENS` | send `max_tokens` with every request (default: not sent, like terminus-2) |
//! | `STANDIN_AGENT_TIMEOUT` | agent timeout in seconds before the multiplier (default: the task's `[agent] timeout_sec`, else 600); exceeding it records `AgentTimeoutError` |
//! | `STANDIN_RETRY_SCALE` | factor applied to harbor's retry back-off and litellm's 4–15 s waits (default 0.01) |
//! | `STANDIN_CRASH=<code>` | exit with that code right after writing the job's config.json, with a Python traceback |
//! | `STANDIN_IGNORE_SIGTERM=1` | ignore SIGTERM |
//! | `STANDIN_EXTRAS=daytona` | extras of this "install" (`harbor[daytona]`); without `daytona`, every `--env daytona` trial fails to construct its environment with `MissingExtraError` |
//! | `STANDIN_IGNORE_SIGINT=1` | ignore SIGINT (a Harbor that does not stop; payload stops Harbor with SIGINT) |
//! | `STANDIN_HARBOR_VERSION` | what `--version` prints (default 0.25.0, the real Harbor's form: the bare version) |
//! | `STANDIN_LEGACY_RESULT=1` | also write the pre-0.2x top-level `stats.n_trials` / `stats.n_errors` in the job result.json |
//!
//! The reward of a trial is read from a `reward` file in the task directory
//! (a number), else it is 1.0 or 0.0 from a hash of the task name.
//! SIGTERM (jobs start) and SIGINT: running trials end as `CancelledError`,
//! result files are written, exit 130 with nothing more printed — what the real
//! harbor does with its KeyboardInterrupt. `jobs resume` installs no SIGTERM
//! handler in harbor 0.25, so SIGTERM kills it outright (faithfully).
//! Before running, terminus-2's kwargs are checked against its 0.25 option schema ("Invalid kwargs
//! for agent 'terminus-2': Unknown option 'x'.", exit 1), and the job's `lock.json` (one entry per
//! planned trial, full agent config included) must equal the stored one on resume, as in harbor.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use e2e::standin::click::{self, CParsed, ClickExit};
use e2e::standin::common as c;
use e2e::standin::harbor_files::{self as files, Doc};
use e2e::standin::harbor_model as hm;
use e2e::standin::harbor_opts::{RESUME_OPTS, START_OPTS};
use launch_spec::rundir::harbor as hf;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

const HARBOR_VERSION: &str = "0.25.0";
const SITE: &str = "/opt/harbor/.venv/lib/python3.12/site-packages/harbor";

const AGENT_NAMES: &[&str] = &[
    "oracle",
    "nop",
    "acp",
    "claude-code",
    "cline-cli",
    "cortex-code",
    "terminus",
    "terminus-1",
    "terminus-2",
    "aider",
    "codex",
    "cursor-cli",
    "gemini-cli",
    "antigravity-cli",
    "rovodev-cli",
    "goose",
    "grok-build",
    "hermes",
    "junie",
    "mini-swe-agent",
    "nemo-agent",
    "swe-agent",
    "opencode",
    "openclaw",
    "openhands",
    "openhands-sdk",
    "antigravity-sdk",
    "kimi-code",
    "kimi-cli",
    "langgraph",
    "deerflow",
    "mimo",
    "mcode",
    "pi",
    "qwen-coder",
    "copilot-cli",
    "code-puppy",
    "devin",
    "trae-agent",
    "computer-1",
    "eve",
    "fx",
    "fx-dev",
    "dspy-rlm",
    "vibe",
    "muse-code",
    "strands",
    "fabric",
];

const ENV_TYPES: &[&str] = &[
    "docker",
    "sbx",
    "podman",
    "daytona",
    "e2b",
    "modal",
    "runloop",
    "langsmith",
    "ec2",
    "gke",
    "ack",
    "openshift",
    "novita",
    "apple-container",
    "singularity",
    "islo",
    "tensorlake",
    "cwsandbox",
    "use-computer",
    "cua-cloud",
    "blaxel",
    "opensandbox",
    "beam",
    "skypilot",
    "hf-sandbox",
    "hyperbrowser",
    "vercel",
    "runta",
    "prime",
    "kata",
    "mosaic",
    "smol",
    "sail",
    "kernel",
];

fn prog() -> String {
    std::env::args()
        .next()
        .map(|a| Path::new(&a).file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or(a))
        .unwrap_or_else(|| "harbor".into())
}

fn usage_exit(usage: &str, path: &str, msg: &str) -> ! {
    eprint!("{}", click::render_usage_error_with(usage, path, msg));
    std::process::exit(2);
}

/// A Python traceback (typer prints uncaught exceptions and exits 1).
fn traceback_text(frames: &[(&str, u32, &str, &str)], last: &str) -> String {
    let mut s = String::from("Traceback (most recent call last):\n");
    for (file, line, func, code) in frames {
        s.push_str(&format!("  File \"{file}\", line {line}, in {func}\n    {code}\n"));
    }
    s.push_str(last);
    s.push('\n');
    s
}

fn die_with_traceback(frames: &[(&str, u32, &str, &str)], last: &str) -> ! {
    eprint!("{}", traceback_text(frames, last));
    std::process::exit(1);
}

fn print_help(path: &str, opts: &[click::Opt]) {
    println!("Usage: {path} [OPTIONS]\n");
    println!("Options:");
    for o in opts {
        let mut names = o.names.join(", ");
        if !o.secondary.is_empty() {
            names = format!("{names} / {}", o.secondary.join(", "));
        }
        println!("  {names}");
    }
    println!("  -h, --help");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let p = prog();
    let strs: Vec<&str> = args.iter().map(String::as_str).collect();
    match strs.as_slice() {
        [] | ["-h"] | ["--help"] => {
            println!(
                "Usage: {p} [OPTIONS] COMMAND [ARGS]...\n\nCommands:\n  run   Start a job. Alias for `harbor job start`.\n  job   Manage jobs."
            );
        }
        // Harbor 0.25's `--version` prints the bare version (checked against the real one).
        // STANDIN_HARBOR_VERSION: another release (tests of a declaration that disagrees).
        ["--version" | "-v"] => {
            println!("{}", std::env::var("STANDIN_HARBOR_VERSION").unwrap_or_else(|_| HARBOR_VERSION.to_string()))
        }
        ["jobs" | "job"] | ["jobs" | "job", "-h" | "--help"] => {
            println!("Usage: {p} {} [OPTIONS] COMMAND [ARGS]...\n\nCommands:\n  start\n  resume", strs[0]);
        }
        ["jobs" | "job", "start", ..] => start(&args[2..], &format!("{p} {} start", strs[0])),
        ["run", ..] => start(&args[1..], &format!("{p} run")),
        ["jobs" | "job", "resume", ..] => resume(&args[2..], &format!("{p} {} resume", strs[0])),
        ["jobs" | "job", other, ..] => {
            let path = format!("{p} {}", strs[0]);
            usage_exit(&format!("{path} [OPTIONS] COMMAND [ARGS]..."), &path, &format!("No such command '{other}'."));
        }
        [other, ..] => {
            usage_exit(&format!("{p} [OPTIONS] COMMAND [ARGS]..."), &p, &format!("No such command '{other}'."))
        }
    }
}

fn parse_or_exit(args: &[String], opts: &[click::Opt], path: &str) -> CParsed {
    match click::parse(args, opts) {
        Ok(p) => p,
        Err(ClickExit::Help) => {
            print_help(path, opts);
            std::process::exit(0);
        }
        Err(ClickExit::Usage(msg)) => usage_exit(&format!("{path} [OPTIONS]"), path, &msg),
    }
}

/// `parse_kwargs`: JSON, then Python literals, else the string.
fn parse_kwargs(items: &[String]) -> Result<Map<String, Value>, String> {
    let mut out = Map::new();
    for kw in items {
        let Some((k, v)) = kw.split_once('=') else {
            return Err(format!("Invalid kwarg format: {kw}. Expected key=value"));
        };
        let v = v.trim();
        let val = match serde_json::from_str::<Value>(v) {
            Ok(j) => j,
            Err(_) => match v {
                "True" => json!(true),
                "False" => json!(false),
                "None" => Value::Null,
                s => json!(s),
            },
        };
        out.insert(k.trim().to_string(), val);
    }
    Ok(out)
}

/// `parse_env_vars`: values stay strings.
fn parse_env_vars(items: &[String]) -> Result<Map<String, Value>, String> {
    let mut out = Map::new();
    for kv in items {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(format!("Invalid env var format: {kv}. Expected KEY=VALUE"));
        };
        out.insert(k.trim().to_string(), json!(v.trim()));
    }
    Ok(out)
}

fn red_error(msg: &str) -> ! {
    // console.print(...) then SystemExit(1): harbor's console writes to stdout.
    println!("{msg}");
    std::process::exit(1);
}

fn deep_merge(base: &mut Value, layer: &Value, path: &mut Vec<String>) {
    const APPEND: [&str; 7] =
        ["agents", "datasets", "tasks", "metrics", "extra_instruction_paths", "extra_instructions", "artifacts"];
    match (base, layer) {
        (Value::Object(b), Value::Object(l)) => {
            for (k, v) in l {
                path.push(k.clone());
                let top_append = path.len() == 1 && APPEND.contains(&k.as_str());
                match (b.get_mut(k), v) {
                    (Some(Value::Array(existing)), Value::Array(new)) if top_append && !new.is_empty() => {
                        existing.extend(new.iter().cloned())
                    }
                    (Some(existing @ Value::Object(_)), Value::Object(_)) => deep_merge(existing, v, path),
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
                path.pop();
            }
        }
        (b, l) => *b = l.clone(),
    }
}

/// `build_job_config`: YAML layers, migration, then the CLI overrides.
fn build_job_config(o: &CParsed, path: &str) -> Value {
    if o.flag("launch") == Some(true) && o.flag("upload") == Some(true) {
        red_error("Error: --launch and --upload are mutually exclusive.");
    }
    if o.flag("public").is_some() && o.flag("upload") != Some(true) {
        red_error("Error: --public / --private requires --upload.");
    }
    if (o.list("share_org").is_some() || o.list("share_user").is_some())
        && o.flag("upload") != Some(true)
        && o.flag("launch") != Some(true)
    {
        red_error("Error: --share / --share-user requires --upload or --launch.");
    }
    if o.str("org").is_some() && o.flag("upload") != Some(true) && o.flag("launch") != Some(true) {
        red_error("Error: --org requires --upload or --launch.");
    }
    for (dest, flag) in [
        ("one_off_secret", "--one-off-secret"),
        ("stored_secret", "--stored-secret"),
        ("registry_credential", "--registry-secret"),
    ] {
        if o.list(dest).is_some() && o.flag("launch") != Some(true) {
            red_error(&format!("Error: {flag} requires --launch."));
        }
    }
    if o.flag("launch") == Some(true) || o.flag("upload") == Some(true) {
        red_error(
            "Error: harbor-standin cannot reach Harbor Hub (--launch/--upload are not supported by the stand-in).",
        );
    }
    if let Some(f) = o.str("env_file")
        && !Path::new(&f).exists()
    {
        red_error(&format!("❌ Env file not found: {f}"));
    }
    let mut data = json!({});
    for src in o.list("config_path").unwrap_or_default() {
        let text = match std::fs::read_to_string(&src) {
            Ok(t) => t,
            Err(e) => red_error(&format!("Error: Failed to load config from {src}: [Errno 2] {e}")),
        };
        let layer: Value = match serde_saphyr::from_str::<Value>(&text) {
            Ok(v) => v,
            Err(e) => red_error(&format!("Error: Failed to load config from {src}: {e}")),
        };
        if !layer.is_object() {
            red_error(&format!("Error: Config {src} must contain a mapping"));
        }
        deep_merge(&mut data, &layer, &mut Vec::new());
    }
    let mut cfg = hm::migrate_legacy(data.as_object().cloned().unwrap_or_default());
    cfg.entry("agents").or_insert(json!([{}]));
    cfg.entry("retry").or_insert(json!({}));
    cfg.entry("environment").or_insert(json!({}));
    cfg.entry("verifier").or_insert(json!({}));
    let set = |cfg: &mut Map<String, Value>, k: &str, v: Value| {
        cfg.insert(k.to_string(), v);
    };
    if let Some(v) = o.str("job_name") {
        set(&mut cfg, "job_name", json!(v));
    }
    if let Some(v) = o.str("jobs_dir") {
        set(&mut cfg, "jobs_dir", json!(v));
    }
    if let Some(v) = o.int("n_attempts") {
        set(&mut cfg, "n_attempts", json!(v));
    }
    for k in [
        "timeout_multiplier",
        "agent_timeout_multiplier",
        "verifier_timeout_multiplier",
        "agent_setup_timeout_multiplier",
        "environment_build_timeout_multiplier",
    ] {
        if let Some(v) = o.float(k) {
            set(&mut cfg, k, json!(v));
        }
    }
    if o.flag("skip_credential_checks") == Some(true) {
        set(&mut cfg, "skip_credential_checks", json!(true));
    }
    if o.flag("debug") == Some(true) {
        set(&mut cfg, "debug", json!(true));
    }
    if let Some(v) = o.int("n_concurrent_trials") {
        set(&mut cfg, "n_concurrent_trials", json!(v));
    }
    if o.flag("quiet") == Some(true) {
        set(&mut cfg, "quiet", json!(true));
    }
    if let Some(v) = o.int("max_retries") {
        cfg["retry"]["max_retries"] = json!(v);
    }
    if let Some(v) = o.list("retry_include_exceptions") {
        cfg["retry"]["include_exceptions"] = json!(v);
    }
    if let Some(v) = o.list("retry_exclude_exceptions") {
        cfg["retry"]["exclude_exceptions"] = json!(v);
    }
    let kwargs = parse_kwargs(&o.list("agent_kwargs").unwrap_or_default()).unwrap_or_else(|e| red_error(&e));
    let env = parse_env_vars(&o.list("agent_env").unwrap_or_default()).unwrap_or_else(|e| red_error(&e));
    let skills = o.list("skills").unwrap_or_default();
    let hosts = o.list("allow_agent_hosts").unwrap_or_default();
    let agent_name = o.str("agent_name");
    let import_path = o.str("agent_import_path");
    if agent_name.is_some() || import_path.is_some() {
        let base = json!({
            "name": agent_name, "import_path": if agent_name.is_none() { json!(import_path) } else { Value::Null },
            "skills": skills, "extra_allowed_hosts": hosts,
            "include_logs": o.list("agent_include_logs").unwrap_or_default(), "exclude_logs": o.list("agent_exclude_logs").unwrap_or_default(),
            "kwargs": kwargs, "env": env, "mcp_servers": []
        });
        let agents: Vec<Value> = match o.list("model_names") {
            Some(models) => models
                .iter()
                .map(|m| {
                    let mut a = base.clone();
                    a["model_name"] = json!(m);
                    a
                })
                .collect(),
            None => vec![base],
        };
        set(&mut cfg, "agents", Value::Array(agents));
    } else if (!kwargs.is_empty() || !env.is_empty() || !skills.is_empty() || !hosts.is_empty())
        && let Some(Value::Array(agents)) = cfg.get_mut("agents")
    {
        for a in agents.iter_mut() {
            if !a.is_object() {
                *a = json!({});
            }
            if !kwargs.is_empty() {
                let k = a.as_object_mut().map(|m| m.entry("kwargs").or_insert(json!({}))).filter(|k| k.is_object());
                if let Some(Value::Object(km)) = k {
                    for (key, v) in &kwargs {
                        km.insert(key.clone(), v.clone());
                    }
                }
            }
            if !env.is_empty()
                && let Some(Value::Object(em)) = a.as_object_mut().map(|m| m.entry("env").or_insert(json!({})))
            {
                for (key, v) in &env {
                    em.insert(key.clone(), v.clone());
                }
            }
        }
    }
    for (dest, key) in
        [("base_url", "base_url"), ("api_key_name", "model_api_key_name"), ("api_format", "model_api_format")]
    {
        if let Some(v) = o.str(dest)
            && let Some(Value::Array(agents)) = cfg.get_mut("agents")
        {
            for a in agents.iter_mut() {
                a[key] = json!(v);
            }
        }
    }
    if let Some(e) = o.str("effort")
        && let Some(Value::Array(agents)) = cfg.get_mut("agents")
    {
        for a in agents.iter_mut() {
            if !a["kwargs"].is_object() {
                a["kwargs"] = json!({});
            }
            a["kwargs"]["reasoning_effort"] = json!(e);
        }
    }
    if let Some(n) = o.int("n_concurrent_agents")
        && let Some(Value::Array(agents)) = cfg.get_mut("agents")
    {
        for a in agents.iter_mut() {
            a["n_concurrent"] = json!(n);
        }
    }
    if let Some(env_type) = o.str("environment") {
        if env_type.contains(':') {
            cfg["environment"]["type"] = Value::Null;
            cfg["environment"]["import_path"] = json!(env_type);
        } else if ENV_TYPES.contains(&env_type.as_str()) {
            cfg["environment"]["type"] = json!(env_type);
            cfg["environment"]["import_path"] = Value::Null;
        } else {
            usage_exit(
                &format!("{path} [OPTIONS]"),
                path,
                &format!(
                    "Invalid value: Unknown environment '{env_type}'. Valid types: {}. Pass a custom environment as an import path (module.path:ClassName).",
                    ENV_TYPES.join(", ")
                ),
            );
        }
    }
    if let Some(b) = o.flag("environment_force_build") {
        cfg["environment"]["force_build"] = json!(b);
    }
    if let Some(b) = o.flag("environment_delete") {
        cfg["environment"]["delete"] = json!(b);
    }
    if let Some(b) = o.flag("stream") {
        cfg["environment"]["stream"] = json!(b);
    }
    if let Some(v) = o.str("cpus") {
        cfg["environment"]["cpu_enforcement_policy"] = json!(v);
    }
    if let Some(v) = o.str("memory") {
        cfg["environment"]["memory_enforcement_policy"] = json!(v);
    }
    if let Some(v) = o.float("override_cpus") {
        cfg["environment"]["override_cpus"] = if v.fract() == 0.0 { json!(v as i64) } else { json!(v) };
    }
    for k in ["override_memory_mb", "override_storage_mb", "override_gpus"] {
        if let Some(v) = o.int(k) {
            cfg["environment"][k] = json!(v);
        }
    }
    if let Some(m) = o.str("mounts") {
        match serde_json::from_str::<Value>(&m) {
            Ok(v) => cfg["environment"]["mounts"] = v,
            Err(e) => red_error(&format!("{e}")),
        }
    }
    if let Some(ek) = o.list("environment_kwargs") {
        let parsed = parse_kwargs(&ek).unwrap_or_else(|e| red_error(&e));
        if !cfg["environment"]["kwargs"].is_object() {
            cfg["environment"]["kwargs"] = json!({});
        }
        for (k, v) in parsed {
            cfg["environment"]["kwargs"][k] = v;
        }
    }
    if let Some(ve) = o.list("verifier_env") {
        let parsed = parse_env_vars(&ve).unwrap_or_else(|e| red_error(&e));
        if !cfg["verifier"]["env"].is_object() {
            cfg["verifier"]["env"] = json!({});
        }
        for (k, v) in parsed {
            cfg["verifier"]["env"][k] = v;
        }
    }
    if let Some(v) = o.str("verifier").or_else(|| o.str("verifier_import_path")) {
        cfg["verifier"]["import_path"] = json!(v);
    }
    let mut disable_verification = o.flag("disable_verification") == Some(true);
    if o.flag("install_only") == Some(true) {
        set(&mut cfg, "install_only", json!(true));
        disable_verification = true;
    }
    if disable_verification {
        cfg["verifier"]["disable"] = json!(true);
    }
    if let Some(a) = o.list("artifact_paths") {
        set(&mut cfg, "artifacts", json!(a));
    }
    if let Some(a) = o.list("extra_instruction_paths") {
        set(&mut cfg, "extra_instruction_paths", json!(a));
    }
    if let Some(a) = o.list("extra_instructions") {
        set(&mut cfg, "extra_instructions", json!(a));
    }
    let task_names = o.list("dataset_task_names");
    let exclude = o.list("dataset_exclude_task_names");
    let n_tasks = o.int("n_tasks");
    if let Some(p) = o.str("path") {
        if o.str("task_git_url").is_some() || is_task_dir(Path::new(&p)) {
            set(&mut cfg, "tasks", json!([{"path": p}]));
            set(&mut cfg, "datasets", json!([]));
        } else {
            set(&mut cfg, "tasks", json!([]));
            set(
                &mut cfg,
                "datasets",
                json!([{"path": p, "task_names": task_names, "exclude_task_names": exclude, "n_tasks": n_tasks}]),
            );
        }
    } else if let Some(d) = o.str("dataset_name_version") {
        let (name, version) = match d.split_once('@') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (d.clone(), None),
        };
        set(&mut cfg, "tasks", json!([]));
        if name.contains('/') {
            set(&mut cfg, "datasets", json!([{"name": name, "ref": version.unwrap_or_else(|| "latest".into())}]));
        } else {
            set(
                &mut cfg,
                "datasets",
                json!([{"name": name, "version": version, "registry_url": o.str("registry_url")}]),
            );
        }
    } else if task_names.is_some()
        || exclude.is_some()
        || n_tasks.is_some()
        || o.str("registry_url").is_some()
        || o.str("registry_path").is_some()
    {
        red_error(
            "Cannot specify --registry-url, --registry-path, --include-task-name, or --exclude-task-name without also specifying --dataset, --task, or --path.",
        );
    }
    Value::Object(cfg)
}

/// A task directory: holds `instruction.md` (the real harbor also wants
/// `task.toml` and an environment; the stand-in only needs the instruction).
fn is_task_dir(p: &Path) -> bool {
    p.is_dir() && p.join("instruction.md").is_file()
}

fn fnmatch(pat: &str, s: &str) -> bool {
    let p: Vec<char> = pat.chars().collect();
    let t: Vec<char> = s.chars().collect();
    fn rec(p: &[char], t: &[char]) -> bool {
        match p.first() {
            None => t.is_empty(),
            Some('*') => (0..=t.len()).any(|i| rec(&p[1..], &t[i..])),
            Some('?') => !t.is_empty() && rec(&p[1..], &t[1..]),
            Some(c) => t.first() == Some(c) && rec(&p[1..], &t[1..]),
        }
    }
    rec(&p, &t)
}

// ------------------------------------------------------------------- trials

/// One planned trial: its full `TrialConfig` plus what the agent reads.
#[derive(Clone)]
struct Plan {
    config: Value,
    task_dir: PathBuf,
    task_name: String,
}

fn resolve_tasks(cfg: &Value) -> Result<Vec<(Value, PathBuf, String)>, String> {
    let mut out = Vec::new();
    for ds in cfg["datasets"].as_array().cloned().unwrap_or_default() {
        let Some(path) = ds["path"].as_str() else {
            return Err(format!(
                "RuntimeError: harbor-standin only runs local datasets (-p/--path or datasets[].path); got {}",
                ds
            ));
        };
        let dir = PathBuf::from(path);
        let entries = std::fs::read_dir(&dir)
            .map_err(|_| format!("FileNotFoundError: [Errno 2] No such file or directory: '{path}'"))?;
        let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        children.sort();
        let source = std::fs::canonicalize(&dir)
            .ok()
            .and_then(|p| p.file_name().map(|f| f.to_string_lossy().to_string()))
            .unwrap_or_default();
        let mut ids: Vec<PathBuf> = children.into_iter().filter(|c| is_task_dir(c)).collect();
        let name_of = |p: &PathBuf| p.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default();
        if let Some(pats) = ds["task_names"].as_array() {
            let pats: Vec<String> = pats.iter().filter_map(|v| v.as_str().map(str::to_string)).collect();
            let before = ids.clone();
            ids.retain(|p| pats.iter().any(|pat| fnmatch(pat, &name_of(p))));
            if ids.is_empty() {
                let mut avail: Vec<String> = before.iter().map(name_of).collect();
                avail.sort();
                avail.truncate(5);
                return Err(format!(
                    "ValueError: No tasks matched the filter(s) {:?}. There are {} tasks available in this dataset. Example task names: {:?}",
                    pats,
                    before.len(),
                    avail
                ));
            }
        }
        if let Some(pats) = ds["exclude_task_names"].as_array() {
            let pats: Vec<String> = pats.iter().filter_map(|v| v.as_str().map(str::to_string)).collect();
            ids.retain(|p| !pats.iter().any(|pat| fnmatch(pat, &name_of(p))));
        }
        if let Some(n) = ds["n_tasks"].as_u64() {
            ids.truncate(n as usize);
        }
        for p in ids {
            let name = name_of(&p);
            out.push((json!({"path": p.to_string_lossy(), "source": source}), p, name));
        }
    }
    for t in cfg["tasks"].as_array().cloned().unwrap_or_default() {
        let Some(path) = t["path"].as_str() else { continue };
        let p = PathBuf::from(path);
        let name = std::fs::canonicalize(&p)
            .ok()
            .and_then(|c| c.file_name().map(|f| f.to_string_lossy().to_string()))
            .unwrap_or_default();
        let mut task = t.clone();
        if task.get("source").is_none() {
            task["source"] = Value::Null;
        }
        out.push((task, p, name));
    }
    Ok(out)
}

fn trial_name_for(task_name: &str) -> String {
    let cut: String = task_name.chars().take(32).collect();
    format!("{}__{}", cut.trim_end_matches(['_', '-']), c::shortuuid(7))
}

fn build_trial_configs(cfg: &Value, job_dir: &Path, job_id: &str, tasks: &[(Value, PathBuf, String)]) -> Vec<Plan> {
    let mut plans = Vec::new();
    let attempts = cfg["n_attempts"].as_u64().unwrap_or(1).max(1);
    for _ in 0..attempts {
        for (task, dir, name) in tasks {
            for agent in cfg["agents"].as_array().cloned().unwrap_or_default() {
                let tc = json!({
                    "task": task,
                    "trial_name": trial_name_for(name),
                    "trials_dir": job_dir.to_string_lossy(),
                    "install_only": cfg["install_only"],
                    "timeout_multiplier": cfg["timeout_multiplier"],
                    "agent_timeout_multiplier": cfg["agent_timeout_multiplier"],
                    "verifier_timeout_multiplier": cfg["verifier_timeout_multiplier"],
                    "agent_setup_timeout_multiplier": cfg["agent_setup_timeout_multiplier"],
                    "environment_build_timeout_multiplier": cfg["environment_build_timeout_multiplier"],
                    "agent": agent,
                    "user_agent": cfg["user_agent"],
                    "environment": cfg["environment"],
                    "verifier": cfg["verifier"],
                    "artifacts": cfg["artifacts"],
                    "extra_instruction_paths": cfg["extra_instruction_paths"],
                    "extra_instructions": cfg["extra_instructions"],
                    "job_id": job_id,
                });
                plans.push(Plan { config: hm::normalize_trial(&tc), task_dir: dir.clone(), task_name: name.clone() });
            }
        }
    }
    plans
}

/// A trial's entry in Harbor 0.25's lock (`TrialLock`): the fields its equality compares that
/// the stand-in models (task, multiplier, the full agent config — `kwargs.api_base` included —,
/// environment, verifier). The job lock lists one per planned trial; each trial's own `lock.json`
/// equals its entry.
fn trial_lock(tc: &Value) -> Value {
    json!({
        "schema_version": 2,
        "task": {"name": tc["task"]["path"], "source": tc["task"]["source"]},
        "timeout_multiplier": tc["timeout_multiplier"],
        "agent": tc["agent"],
        "environment": tc["environment"],
        "verifier": tc["verifier"],
    })
}

/// The comparable part of a job lock (`JobLock._equality_key`): n_concurrent_trials, retry and
/// the unordered trial entries.
fn job_lock_key(lock: &Value) -> (Value, Value, Vec<String>) {
    let mut trials: Vec<String> = lock["trials"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| {
                    let mut t = t.clone();
                    if let Some(m) = t.as_object_mut() {
                        m.remove("created_at");
                    }
                    serde_json::to_string(&t).unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_default();
    trials.sort();
    (lock["n_concurrent_trials"].clone(), lock["retry"].clone(), trials)
}

/// terminus-2 0.25's options (`Terminus2Options` + `AgentOptions`, `extra="forbid"`): the product's
/// table, so the contract test against the real Harbor (`tests/harbor_contract.rs`) checks it too.
const TERMINUS2_OPTIONS: &[&str] = launch_spec::versions::TERMINUS2_025_OPTIONS;

/// `_run_preflight` → `BaseAgent.parse_options`: terminus-2 refuses unknown kwargs; the CLI prints
/// the ValueError in red and exits 1 (both `jobs start` and `jobs resume`).
fn preflight_agent_options(cfg: &Value) {
    for a in cfg["agents"].as_array().cloned().unwrap_or_default() {
        if a["name"].as_str() != Some("terminus-2") {
            continue;
        }
        let unknown: Vec<String> = a["kwargs"]
            .as_object()
            .map(|k| k.keys().filter(|k| !TERMINUS2_OPTIONS.contains(&k.as_str())).cloned().collect())
            .unwrap_or_default();
        if !unknown.is_empty() {
            let details: Vec<String> = unknown.iter().map(|k| format!("  Unknown option '{k}'.")).collect();
            red_error(&format!(
                "Invalid kwargs for agent 'terminus-2':\n{}\nSee harbor agent schema terminus-2 for available options.",
                details.join("\n")
            ));
        }
    }
}

/// The harbor extra an environment type needs (the stand-in models the one payload uses).
fn env_extra(env_type: &str) -> Option<&'static str> {
    (env_type == "daytona").then_some("daytona")
}

/// Extras of this stand-in "install": `STANDIN_EXTRAS` (comma-separated, like
/// `pip install 'harbor[daytona]'`); none when unset, as after `pip install harbor`.
fn extra_installed(extra: &str) -> bool {
    c::env_str("STANDIN_EXTRAS").is_some_and(|v| v.split(',').any(|e| e.trim() == extra || e.trim() == "cloud"))
}

/// A host variable a task reads: its name and `:-` default.
type HostVar = (String, Option<String>);

/// `${VAR}` / `${VAR:-default}` as a whole value (`harbor.utils.env._TEMPLATE_PATTERN` fullmatch).
fn host_var_template(value: &str) -> Option<HostVar> {
    let inner = value.strip_prefix("${")?.strip_suffix('}')?;
    let end = inner.find([':', '}']).unwrap_or(inner.len());
    let (name, rest) = inner.split_at(end);
    if name.is_empty() {
        return None;
    }
    match rest {
        "" => Some((name.to_string(), None)),
        _ => rest.strip_prefix(":-").map(|d| (name.to_string(), Some(d.to_string()))),
    }
}

/// `_confirm_host_env_access` (jobs start only): tasks whose `task.toml` `[environment.env]` /
/// `[verifier.env]` read host variables. Missing ones (no default, unset) → a table and exit 1;
/// otherwise, without `--yes`, harbor asks `Proceed? (Y/n):` on the console — "n" exits 0, and
/// end of input (payload's stdin is /dev/null) is typer's `Aborted.`, exit 1.
fn confirm_host_env_access(cfg: &Value, yes: bool) {
    let Ok(tasks) = resolve_tasks(cfg) else { return };
    // Job.create ran first: the job dir and its job.log exist whatever the answer.
    if let Some(job_dir) = cfg["jobs_dir"].as_str().zip(cfg["job_name"].as_str()).map(|(d, n)| Path::new(d).join(n)) {
        let _ = std::fs::create_dir_all(&job_dir);
        let _ = std::fs::OpenOptions::new().create(true).append(true).open(job_dir.join(hf::JOB_LOG));
    }
    let explicit = |section: &str| -> BTreeSet<String> {
        cfg[section]["env"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
    };
    let mut sections: Vec<(String, Vec<HostVar>)> = Vec::new();
    for (_, dir, _) in &tasks {
        let Ok(text) = std::fs::read_to_string(dir.join("task.toml")) else { continue };
        let Ok(toml) = text.parse::<toml::Table>() else { continue };
        for section in ["environment", "verifier"] {
            let skip = explicit(section);
            let Some(env) = toml.get(section).and_then(|s| s.get("env")).and_then(|e| e.as_table()) else { continue };
            let key = format!("[{section}.env]");
            for (name, value) in env {
                let Some(template) = value.as_str().and_then(host_var_template) else { continue };
                if skip.contains(name) {
                    continue;
                }
                let slot = match sections.iter().position(|(k, _)| *k == key) {
                    Some(i) => &mut sections[i].1,
                    None => {
                        sections.push((key.clone(), Vec::new()));
                        &mut sections.last_mut().expect("pushed").1
                    }
                };
                if !slot.contains(&template) {
                    slot.push(template);
                }
            }
        }
    }
    if sections.is_empty() {
        return;
    }
    let missing: Vec<(&String, &String)> = sections
        .iter()
        .flat_map(|(s, vars)| vars.iter().map(move |v| (s, v)))
        .filter(|(_, (name, default))| default.is_none() && std::env::var_os(name).is_none())
        .map(|(s, (name, _))| (name, s))
        .collect();
    if !missing.is_empty() {
        println!();
        println!("Missing Environment Variables");
        for (name, section) in missing {
            println!("  {name}  {section}");
        }
        println!("\nExport them in your shell or pass --env-file.");
        std::process::exit(1);
    }
    if yes {
        return;
    }
    println!();
    println!("Environment Variables");
    for (section, vars) in &sections {
        for (name, _) in vars {
            println!("  {name}  {section}");
        }
    }
    println!();
    print!("Tasks in this run will load these from your environment. Proceed? (Y/n): ");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    match std::io::stdin().read_line(&mut line) {
        Ok(0) | Err(_) => {
            eprintln!();
            eprintln!("Aborted.");
            std::process::exit(1);
        }
        Ok(_) if matches!(line.trim().to_lowercase().as_str(), "n" | "no") => std::process::exit(0),
        Ok(_) => {}
    }
}

/// Agents that do not call a model in the stand-in.
fn is_model_free(agent: &str) -> bool {
    matches!(agent, "oracle" | "nop")
}

fn split_model(model: &str) -> (Option<String>, String) {
    match model.split_once('/') {
        Some((p, rest)) => (Some(p.to_ascii_lowercase()), rest.to_string()),
        None => (None, model.to_string()),
    }
}

/// `validate_hosted_vllm_model_config` (harbor/llms/utils.py).
fn validate_hosted_vllm(model: &str, model_info: &Value) -> Result<(), String> {
    if !model.starts_with("hosted_vllm/") {
        return Err(format!("hosted_vllm models must start with 'hosted_vllm/'. Got '{model}'."));
    }
    if model.matches('/').count() != 1 {
        return Err(format!("hosted_vllm model names must contain exactly one '/'. Got '{model}'."));
    }
    let canonical = &model["hosted_vllm/".len()..];
    let ok = !canonical.is_empty()
        && canonical.chars().count() <= 64
        && canonical.chars().all(|ch| ch.is_ascii_alphanumeric() || "._-".contains(ch));
    if !ok {
        return Err(format!(
            "hosted_vllm canonical model names may only contain letters, numbers, '.', '-', '_' and must be fewer than 64 characters with no spaces. Got '{canonical}'."
        ));
    }
    let empty = match model_info {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    if empty {
        return Err("hosted_vllm models require `model_info` specifying token limits and costs. Please provide max_input_tokens, max_output_tokens, input_cost_per_token, and output_cost_per_token.".into());
    }
    for f in ["max_input_tokens", "max_output_tokens"] {
        match model_info.get(f) {
            None | Some(Value::Null) => return Err(format!("hosted_vllm model_info missing '{f}'.")),
            Some(v) if v.as_f64().is_none() && v.as_str().and_then(|s| s.parse::<f64>().ok()).is_none() => {
                return Err(format!(
                    "hosted_vllm model_info field '{f}' must be a number. Got '{}'.",
                    v.as_str().map(str::to_string).unwrap_or(v.to_string())
                ));
            }
            _ => {}
        }
    }
    for f in ["input_cost_per_token", "output_cost_per_token"] {
        match model_info.get(f) {
            None | Some(Value::Null) => return Err(format!("hosted_vllm model_info missing '{f}'.")),
            Some(v) if v.as_f64().is_none() && v.as_str().and_then(|s| s.parse::<f64>().ok()).is_none() => {
                return Err(format!(
                    "hosted_vllm model_info field '{f}' must be a float. Got '{}'.",
                    v.as_str().map(str::to_string).unwrap_or(v.to_string())
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

struct CallErr {
    typ: String,
    msg: String,
    retriable: bool,
}

fn classify_status(status: u16, body: &str) -> CallErr {
    let lower = body.to_ascii_lowercase();
    let ctx = [
        "context length exceeded",
        "context_length_exceeded",
        "maximum context length",
        "`inputs` tokens + `max_new_tokens`",
        "model's context length",
        "prompt is too long",
        "input is too long for requested model",
    ];
    let (typ, prefix) = match status {
        400 if ctx.iter().any(|p| lower.contains(p)) => {
            return CallErr { typ: "ContextLengthExceededError".into(), msg: String::new(), retriable: false };
        }
        400 => ("BadRequestError", "litellm.BadRequestError: Hosted_vllmException"),
        401 => ("AuthenticationError", "litellm.AuthenticationError: AuthenticationError: Hosted_vllmException"),
        403 => ("PermissionDeniedError", "litellm.PermissionDeniedError: Hosted_vllmException"),
        404 => ("NotFoundError", "litellm.NotFoundError: NotFoundError: Hosted_vllmException"),
        408 => ("Timeout", "litellm.Timeout: Hosted_vllmException"),
        422 => ("UnprocessableEntityError", "litellm.UnprocessableEntityError: Hosted_vllmException"),
        429 => ("RateLimitError", "litellm.RateLimitError: RateLimitError: Hosted_vllmException"),
        500 => ("InternalServerError", "litellm.InternalServerError: InternalServerError: Hosted_vllmException"),
        503 => ("ServiceUnavailableError", "litellm.ServiceUnavailableError: Hosted_vllmException"),
        _ => ("APIError", "litellm.APIError: APIError: Hosted_vllmException"),
    };
    CallErr { typ: typ.into(), msg: format!("{prefix} - {body}"), retriable: status != 401 }
}

struct TurnOk {
    prompt: u64,
    completion: u64,
    content: String,
}

enum CallOutcome {
    Ok(TurnOk),
    Err(CallErr),
    Timeout,
}

/// litellm's error for a connection refused at `url` (what Harbor 0.25 records; the object
/// address is Python's, any will do).
fn cannot_connect(url: &str) -> CallErr {
    let authority = url.split("://").nth(1).and_then(|r| r.split('/').next()).unwrap_or("");
    let (host, port) = authority.rsplit_once(':').unwrap_or((authority, "80"));
    CallErr {
        typ: "InternalServerError".into(),
        msg: format!(
            "litellm.InternalServerError: InternalServerError: Hosted_vllmException - Cannot connect to host {host}:{port} ssl:<ssl.SSLContext object at 0x7f62a3b3be30> [Connect call failed ('{host}', {port})]"
        ),
        retriable: true,
    }
}

fn call_model(url: &str, key: &str, body: &Value, timeout: Duration) -> CallOutcome {
    let agent: ureq::Agent =
        ureq::Agent::config_builder().timeout_global(Some(timeout)).http_status_as_error(false).build().into();
    match agent.post(url).header("Authorization", &format!("Bearer {key}")).send_json(body) {
        Ok(mut r) => {
            let status = r.status().as_u16();
            let text = r.body_mut().read_to_string().unwrap_or_default();
            if status != 200 {
                return CallOutcome::Err(classify_status(status, &text));
            }
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            CallOutcome::Ok(TurnOk {
                prompt: v.pointer("/usage/prompt_tokens").and_then(Value::as_u64).unwrap_or(0),
                completion: v.pointer("/usage/completion_tokens").and_then(Value::as_u64).unwrap_or(0),
                content: v.pointer("/choices/0/message/content").and_then(Value::as_str).unwrap_or("").to_string(),
            })
        }
        Err(ureq::Error::Timeout(_)) => CallOutcome::Timeout,
        // Nothing listens: litellm's aiohttp transport maps the refused connect to a 500
        // (`InternalServerError`, "Cannot connect to host"), as the real Harbor records it.
        Err(ureq::Error::ConnectionFailed) => CallOutcome::Err(cannot_connect(url)),
        Err(ureq::Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            CallOutcome::Err(cannot_connect(url))
        }
        Err(e) => CallOutcome::Err(CallErr {
            typ: "APIConnectionError".into(),
            msg: format!("litellm.APIConnectionError: Hosted_vllmException - Connection error. ({e})"),
            retriable: true,
        }),
    }
}

// -------------------------------------------------------------- job runtime

struct TrialRec {
    result: Value,
    dir: PathBuf,
    finalized: bool,
}

struct Acc {
    results: BTreeMap<String, Value>,
    order: Vec<String>,
    running: BTreeSet<String>,
    n_retries: u64,
    done: usize,
}

struct Job {
    cfg: Value,
    job_dir: PathBuf,
    id: String,
    started_at: String,
    n_total: usize,
    acc: Mutex<Acc>,
    live: Mutex<BTreeMap<String, Arc<Mutex<TrialRec>>>>,
    cancel: AtomicBool,
    crash: Mutex<Option<String>>,
    create_lock: Mutex<()>,
    log: Mutex<Option<std::fs::File>>,
    quiet: bool,
}

fn now() -> SystemTime {
    SystemTime::now()
}

fn trial_log(dir: &Path, line: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(hf::TRIAL_LOG)) {
        let _ = writeln!(f, "{line}");
    }
}

/// The task's agent timeout (`[agent] timeout_sec` of its `task.toml`; Harbor's default 600 s).
fn task_agent_timeout(task_dir: &Path) -> f64 {
    std::fs::read_to_string(task_dir.join("task.toml"))
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .and_then(|t| t.get("agent")?.get("timeout_sec")?.as_float())
        .unwrap_or(600.0)
}

fn reward_for(task_dir: &Path, task_name: &str) -> f64 {
    if let Ok(s) = std::fs::read_to_string(task_dir.join("reward"))
        && let Ok(v) = s.trim().parse::<f64>()
    {
        return v;
    }
    let h = task_name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    if h % 2 == 0 { 1.0 } else { 0.0 }
}

fn exception_info(typ: &str, msg: &str, frames: &[(&str, u32, &str, &str)]) -> Value {
    let last = if msg.is_empty() { typ.to_string() } else { format!("{typ}: {msg}") };
    json!({
        "exception_type": typ,
        "exception_message": msg,
        "exception_traceback": traceback_text(frames, &last),
        "occurred_at": c::iso_utc(now()),
    })
}

impl Job {
    fn jlog(&self, line: &str) {
        if let Some(f) = self.log.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            let _ = writeln!(f, "{line}");
        }
    }

    fn stats(&self, acc: &Acc) -> Value {
        let legacy = c::env_flag("STANDIN_LEGACY_RESULT");
        let mut evals: Map<String, Value> = Map::new();
        let mut rewards_by_eval: BTreeMap<String, Vec<Option<f64>>> = BTreeMap::new();
        let mut per_task: BTreeMap<String, BTreeMap<String, Vec<Option<f64>>>> = BTreeMap::new();
        let (mut completed, mut errored, mut cancelled) = (0u64, 0u64, 0u64);
        let (mut tin, mut tout, mut tcache, mut cost): (Option<u64>, Option<u64>, Option<u64>, Option<f64>) =
            (None, None, None, None);
        for name in &acc.order {
            let Some(r) = acc.results.get(name) else { continue };
            completed += 1;
            let agent = r.pointer("/agent_info/name").and_then(Value::as_str).unwrap_or("oracle");
            let model = r.pointer("/agent_info/model_info/name").and_then(Value::as_str);
            let ds = r["source"].as_str().unwrap_or("adhoc");
            let key = hm::evals_key(agent, model, ds);
            let e = evals.entry(key.clone()).or_insert_with(|| {
                json!({"n_trials": 0, "n_errors": 0, "metrics": [], "pass_at_k": {}, "reward_stats": {}, "exception_stats": {}})
            });
            let reward = r.pointer("/verifier_result/rewards/reward").and_then(Value::as_f64);
            if !r["verifier_result"].is_null() {
                e["n_trials"] = json!(e["n_trials"].as_u64().unwrap_or(0) + 1);
                if let Some(rw) = reward {
                    let k = hm::py_float(rw);
                    if let Some(rs) = e["reward_stats"].as_object_mut() {
                        let per = rs.entry("reward").or_insert(json!({}));
                        match per.get_mut(&k) {
                            Some(Value::Array(a)) => a.push(json!(name)),
                            _ => per[&k] = json!([name]),
                        }
                    }
                }
            }
            if let Some(t) = r.pointer("/exception_info/exception_type").and_then(Value::as_str) {
                e["n_errors"] = json!(e["n_errors"].as_u64().unwrap_or(0) + 1);
                errored += 1;
                if t == "CancelledError" {
                    cancelled += 1;
                }
                let mut stats = e["exception_stats"].clone();
                match stats.get_mut(t) {
                    Some(Value::Array(a)) => a.push(json!(name)),
                    _ => stats[t] = json!([name]),
                }
                e["exception_stats"] = stats;
            }
            rewards_by_eval.entry(key.clone()).or_default().push(reward);
            per_task
                .entry(key)
                .or_default()
                .entry(r["task_name"].as_str().unwrap_or("").to_string())
                .or_default()
                .push(reward);
            if let Some(ar) = r.get("agent_result").filter(|v| v.is_object()) {
                if let Some(v) = ar["n_input_tokens"].as_u64() {
                    tin = Some(tin.unwrap_or(0) + v);
                }
                if let Some(v) = ar["n_cache_tokens"].as_u64() {
                    tcache = Some(tcache.unwrap_or(0) + v);
                }
                if let Some(v) = ar["n_output_tokens"].as_u64() {
                    tout = Some(tout.unwrap_or(0) + v);
                }
                if let Some(v) = ar["cost_usd"].as_f64() {
                    cost = Some(cost.unwrap_or(0.0) + v);
                }
            }
        }
        for (key, rewards) in &rewards_by_eval {
            let mean = rewards.iter().map(|r| r.unwrap_or(0.0)).sum::<f64>() / rewards.len().max(1) as f64;
            evals[key]["metrics"] = json!([{"mean": mean}]);
            // pass@k for binary rewards (harbor/utils/pass_at_k.py).
            let tasks = &per_task[key];
            let binary = tasks.values().flatten().all(|r| r.is_none_or(|v| v == 0.0 || v == 1.0));
            if binary && !tasks.is_empty() {
                let min_n = tasks.values().map(Vec::len).min().unwrap_or(0);
                let mut ks: BTreeSet<usize> = BTreeSet::new();
                let mut k = 2;
                while k <= min_n {
                    ks.insert(k);
                    k *= 2;
                }
                let mut k = 5;
                while k <= min_n {
                    ks.insert(k);
                    k += 5;
                }
                let mut pak = Map::new();
                for k in ks {
                    let mut total = 0.0;
                    for succ in tasks.values() {
                        let n = succ.len();
                        let cc = succ.iter().filter(|r| **r == Some(1.0)).count();
                        total += if n - cc < k {
                            1.0
                        } else {
                            1.0 - (0..k).map(|i| (n - cc - i) as f64 / (n - i) as f64).product::<f64>()
                        };
                    }
                    pak.insert(k.to_string(), json!(total / tasks.len() as f64));
                }
                evals[key]["pass_at_k"] = Value::Object(pak);
            }
        }
        let running = acc.running.len() as u64;
        let pending = (self.n_total as u64).saturating_sub(completed + running);
        let mut stats = Map::new();
        stats.insert("n_completed_trials".into(), json!(completed));
        stats.insert("n_errored_trials".into(), json!(errored));
        stats.insert("n_running_trials".into(), json!(running));
        stats.insert("n_pending_trials".into(), json!(pending));
        stats.insert("n_cancelled_trials".into(), json!(cancelled));
        stats.insert("n_retries".into(), json!(acc.n_retries));
        if legacy {
            stats.insert("n_trials".into(), json!(completed));
            stats.insert("n_errors".into(), json!(errored));
        }
        stats.insert("evals".into(), Value::Object(evals));
        stats.insert("n_input_tokens".into(), json!(tin));
        stats.insert("n_cache_tokens".into(), json!(tcache));
        stats.insert("n_output_tokens".into(), json!(tout));
        stats.insert("cost_usd".into(), json!(cost));
        Value::Object(stats)
    }

    fn write_result(&self, finished: bool) {
        let acc = self.acc.lock().unwrap_or_else(|e| e.into_inner());
        let ts = c::iso_local(now());
        let v = json!({
            "id": self.id,
            "started_at": self.started_at,
            "updated_at": ts,
            "finished_at": if finished { json!(ts) } else { Value::Null },
            "n_total_trials": self.n_total,
            "stats": self.stats(&acc),
        });
        files::write(&self.job_dir, Doc::JobResult, &v, true);
    }

    fn on_start(&self, name: &str) {
        {
            let mut acc = self.acc.lock().unwrap_or_else(|e| e.into_inner());
            if acc.results.remove(name).is_some() {
                acc.n_retries += 1;
                acc.order.retain(|n| n != name);
            }
            acc.running.insert(name.to_string());
        }
        self.write_result(false);
    }

    fn on_end(&self, name: &str, result: Value) {
        let (done, mean) = {
            let mut acc = self.acc.lock().unwrap_or_else(|e| e.into_inner());
            acc.running.remove(name);
            if acc.results.insert(name.to_string(), result).is_none() {
                acc.order.push(name.to_string());
            }
            acc.done = acc.results.len();
            let rewards: Vec<f64> = acc
                .results
                .values()
                .map(|r| r.pointer("/verifier_result/rewards/reward").and_then(Value::as_f64).unwrap_or(0.0))
                .collect();
            (acc.done, rewards.iter().sum::<f64>() / rewards.len().max(1) as f64)
        };
        self.write_result(false);
        if !self.quiet {
            println!("Mean: {mean:.3} {done}/{}", self.n_total);
        }
    }

    /// Finalize a live trial as cancelled (KeyboardInterrupt / TaskGroup abort).
    fn cancel_live(&self) {
        let live: Vec<(String, Arc<Mutex<TrialRec>>)> =
            self.live.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (name, rec) in live {
            let mut r = rec.lock().unwrap_or_else(|e| e.into_inner());
            if r.finalized {
                continue;
            }
            let frames = [(
                "/usr/lib/python3.12/asyncio/tasks.py",
                314,
                "__step_run_and_handle_result",
                "result = coro.send(None)",
            )];
            r.result["exception_info"] = exception_info("CancelledError", "", &frames);
            if r.result["agent_execution"].is_object() && r.result["agent_execution"]["finished_at"].is_null() {
                r.result["agent_execution"]["finished_at"] = json!(c::iso_utc(now()));
            }
            // A cancelled agent still stores its chat's totals (0 before any completion).
            if r.result["agent_execution"].is_object() {
                store_chat_totals(&mut r.result, 0, 0);
            }
            r.result["finished_at"] = json!(c::iso_utc(now()));
            let _ = std::fs::write(
                r.dir.join(hf::EXCEPTION_FILE),
                r.result["exception_info"]["exception_traceback"].as_str().unwrap_or(""),
            );
            files::write(&r.dir, Doc::TrialResult, &r.result, false);
            trial_log(&r.dir, &format!("Trial {name} cancelled"));
            r.finalized = true;
            let res = r.result.clone();
            drop(r);
            self.on_end(&name, res);
        }
    }
}

enum TrialEnd {
    Done(Value),
    Crash(String),
    Cancelled,
}

/// terminus-2 stores its chat's token totals when the agent ends, however it ends (an error, a
/// timeout, a cancellation): counts, 0 when no completion came — never `null` once it ran.
fn store_chat_totals(result: &mut Value, input: u64, output: u64) {
    if !result["agent_result"].is_object() {
        return;
    }
    for (key, n) in [("n_input_tokens", input), ("n_cache_tokens", 0), ("n_output_tokens", output)] {
        if result["agent_result"][key].is_null() {
            result["agent_result"][key] = json!(n);
        }
    }
}

fn set_phase(rec: &Arc<Mutex<TrialRec>>, key: &str, field: &str) {
    let mut r = rec.lock().unwrap_or_else(|e| e.into_inner());
    if !r.result[key].is_object() {
        r.result[key] = json!({"started_at": null, "finished_at": null});
    }
    r.result[key][field] = json!(c::iso_utc(now()));
}

fn run_trial(job: &Job, plan: &Plan) -> TrialEnd {
    let cfg = &plan.config;
    let name = cfg["trial_name"].as_str().unwrap_or("").to_string();
    let dir = job.job_dir.join(&name);
    // Trial.__init__ runs without an await point: the directory, lock.json and
    // trial.log appear together (the main thread takes this lock before exiting).
    let creating = job.create_lock.lock().unwrap_or_else(|e| e.into_inner());
    for sub in hf::TRIAL_SUBDIRS {
        let _ = std::fs::create_dir_all(dir.join(sub));
    }
    files::write(&dir, Doc::TrialLock, &trial_lock(cfg), false);
    let _ = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(hf::TRIAL_LOG));
    let agent = cfg["agent"].clone();
    let agent_name = agent["name"].as_str().unwrap_or("oracle").to_string();
    if !AGENT_NAMES.contains(&agent_name.as_str()) && agent["import_path"].is_null() {
        return TrialEnd::Crash(format!(
            "ValueError: Unknown agent type: {agent_name}. This could be because the agent is not registered in the AgentFactory or because the agent name is invalid."
        ));
    }
    let model_name = agent["model_name"].as_str().map(str::to_string);
    let kwargs = agent["kwargs"].clone();
    // Agent construction: terminus-2 builds its LiteLLM client here, which
    // validates hosted_vllm names and model_info (harbor/llms/lite_llm.py).
    if !is_model_free(&agent_name) {
        match &model_name {
            None => {
                return TrialEnd::Crash(format!(
                    "ValueError: model_name is required for {}",
                    if agent_name == "terminus-2" { "Terminus 2" } else { agent_name.as_str() }
                ));
            }
            Some(m) if m.to_ascii_lowercase().contains("hosted_vllm") => {
                let info = kwargs.get("model_info").cloned().unwrap_or(Value::Null);
                if info.is_null() || info.as_object().is_some_and(|o| o.is_empty()) {
                    trial_log(
                        &dir,
                        "Model info is required when using hosted_vllm models. Please set `model_info` in your Terminus 2 configuration with `max_input_tokens`, `max_output_tokens`, and cost fields. Falling back to LiteLLM defaults, which may cause context or pricing issues.",
                    );
                }
                if let Err(e) = validate_hosted_vllm(m, &info) {
                    return TrialEnd::Crash(format!("ValueError: {e}"));
                }
            }
            _ => {}
        }
    }
    // Trial.__init__ → _init_agent_environment: the environment class needs its extra
    // (`pip install 'harbor[daytona]'`); the preflight only checked credentials.
    if let Some(extra) = env_extra(cfg["environment"]["type"].as_str().unwrap_or("docker"))
        && !extra_installed(extra)
    {
        return TrialEnd::Crash(format!(
            "harbor.utils.optional_import.MissingExtraError: The '{extra}' package is required but not installed. Install it with:\n  pip install 'harbor[{extra}]'\n  uv tool install 'harbor[{extra}]'\nOr install all cloud environments with 'harbor[cloud]'."
        ));
    }
    drop(creating);
    let (provider, parsed_model) = match &model_name {
        Some(m) => {
            let (p, n) = split_model(m);
            (p, Some(n))
        }
        None => (None, None),
    };
    let version = if agent_name.starts_with("terminus") { "2.0.0" } else { "unknown" };
    let model_info = parsed_model.as_ref().map(|n| json!({"name": n, "provider": provider})).unwrap_or(Value::Null);
    let task_path = cfg["task"]["path"].clone();
    let uri = format!("file://{}", std::fs::canonicalize(&dir).unwrap_or(dir.clone()).to_string_lossy());
    let checksum = {
        let mut h = String::new();
        for i in 0..4u64 {
            let x = plan
                .task_name
                .bytes()
                .fold(0xcbf2_9ce4_8422_2325u64 ^ i, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
            h.push_str(&format!("{x:016x}"));
        }
        h
    };
    files::write(&dir, Doc::TrialConfig, &hm::dump_trial(cfg), false);
    let result = json!({
        "id": c::uuid4(),
        "task_name": plan.task_name,
        "trial_name": name,
        "trial_uri": uri,
        "task_id": {"path": task_path},
        "source": cfg["task"]["source"],
        "task_checksum": checksum,
        "config": cfg,
        "agent_info": {"name": agent_name, "version": version, "model_info": model_info},
        "agent_result": null,
        "verifier_result": null,
        "verifier_environment_mode": "shared",
        "exception_info": null,
        "started_at": c::iso_utc(now()),
        "finished_at": null,
        "environment_setup": null,
        "agent_setup": null,
        "agent_execution": null,
        "verifier": null,
        "step_results": null,
    });
    let rec = Arc::new(Mutex::new(TrialRec { result, dir: dir.clone(), finalized: false }));
    job.live.lock().unwrap_or_else(|e| e.into_inner()).insert(name.clone(), rec.clone());
    job.on_start(&name);
    trial_log(&dir, &format!("Trial {name} started (task {})", plan.task_name));
    let total = c::env_f64("STANDIN_TRIAL_SECONDS", 0.05);
    set_phase(&rec, "environment_setup", "started_at");
    c::sleep_secs(total * 0.2);
    set_phase(&rec, "environment_setup", "finished_at");
    set_phase(&rec, "agent_setup", "started_at");
    set_phase(&rec, "agent_setup", "finished_at");
    if job.cancel.load(Ordering::SeqCst) {
        return TrialEnd::Cancelled;
    }
    set_phase(&rec, "agent_execution", "started_at");
    rec.lock().unwrap_or_else(|e| e.into_inner()).result["agent_result"] = json!({"n_input_tokens": null, "n_cache_tokens": null, "n_output_tokens": null, "cost_usd": null, "model_usage": null, "rollout_details": null, "metadata": null});
    let mult = cfg["agent_timeout_multiplier"].as_f64().or_else(|| cfg["timeout_multiplier"].as_f64()).unwrap_or(1.0);
    let agent_timeout = c::env_f64("STANDIN_AGENT_TIMEOUT", task_agent_timeout(&plan.task_dir)) * mult;
    let agent_started = Instant::now();
    let mut failure: Option<(String, String)> = None;
    let mut timed_out = false;
    let turns = c::env_u64("STANDIN_TURNS").unwrap_or(2);
    let scale = c::env_f64("STANDIN_RETRY_SCALE", 0.01);
    if !is_model_free(&agent_name) {
        let api_base = kwargs
            .get("api_base")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| agent["base_url"].as_str().map(str::to_string))
            .or_else(|| c::env_str("HOSTED_VLLM_API_BASE"));
        let model_str = model_name.clone().unwrap_or_default();
        let is_hosted = model_str.to_ascii_lowercase().contains("hosted_vllm");
        let key = kwargs
            .pointer("/llm_kwargs/api_key")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| if is_hosted { c::env_str("HOSTED_VLLM_API_KEY") } else { c::env_str("OPENAI_API_KEY") })
            .unwrap_or_else(|| "fake-api-key".into());
        let instruction = std::fs::read_to_string(plan.task_dir.join("instruction.md")).unwrap_or_default();
        let pad = "x".repeat(c::env_u64("STANDIN_PROMPT_CHARS").unwrap_or(0) as usize);
        let mut messages = vec![
            json!({"role": "system", "content": "You are an AI assistant tasked with solving command-line tasks in a Linux environment."}),
            json!({"role": "user", "content": format!("{instruction}\n{pad}")}),
        ];
        let (mut tin, mut tout) = (0u64, 0u64);
        let mut any_ok = false;
        // terminus-2 summarises on a context overflow (`enable_summarize`, default on): the
        // overflow is never raised, the agent goes on until its timeout.
        let summarize = kwargs.get("enable_summarize").and_then(Value::as_bool) != Some(false);
        'turns: for turn in 0..turns {
            if job.cancel.load(Ordering::SeqCst) {
                return TrialEnd::Cancelled;
            }
            let Some(base) = api_base.clone() else {
                failure = Some((
                    "APIConnectionError".into(),
                    "litellm.APIConnectionError: Hosted_vllmException - Connection error.".into(),
                ));
                break;
            };
            let url = format!("{}/chat/completions", base.trim_end_matches('/'));
            let mut body = json!({"model": parsed_model.clone().unwrap_or_default(), "messages": messages});
            if let Some(mt) = c::env_u64("STANDIN_MAX_TOKENS") {
                body["max_tokens"] = json!(mt);
            }
            if let Some(t) = kwargs.get("temperature").filter(|v| !v.is_null()) {
                body["temperature"] = t.clone();
            }
            // terminus-2 passes `llm_call_kwargs` to every LiteLLM call; LiteLLM merges its
            // `extra_body` into the top level of the request (`chat_template_kwargs` …).
            if let Some(Value::Object(extra)) = kwargs.pointer("/llm_call_kwargs/extra_body") {
                for (k, v) in extra {
                    body[k.as_str()] = v.clone();
                }
            }
            // LiteLLM.call: 3 attempts, exponential wait 4..15 s, no retry on
            // context-length and authentication errors.
            let mut attempt = 0;
            loop {
                attempt += 1;
                let remaining = agent_timeout - agent_started.elapsed().as_secs_f64();
                if remaining <= 0.0 {
                    timed_out = true;
                    break 'turns;
                }
                trial_log(&dir, &format!("turn {turn}: POST {url} (attempt {attempt})"));
                match call_model(
                    &url,
                    &key,
                    &body,
                    Duration::from_secs_f64(remaining.min(c::env_f64("STANDIN_REQUEST_TIMEOUT", 600.0))),
                ) {
                    CallOutcome::Ok(ok) => {
                        any_ok = true;
                        tin += ok.prompt;
                        tout += ok.completion;
                        messages.push(json!({"role": "assistant", "content": ok.content}));
                        messages.push(json!({"role": "user", "content": "New Terminal Output:\n$ "}));
                        let mut r = rec.lock().unwrap_or_else(|e| e.into_inner());
                        r.result["agent_result"]["n_input_tokens"] = json!(tin);
                        r.result["agent_result"]["n_cache_tokens"] = json!(0);
                        r.result["agent_result"]["n_output_tokens"] = json!(tout);
                        let ic =
                            kwargs.pointer("/model_info/input_cost_per_token").and_then(Value::as_f64).unwrap_or(0.0);
                        let oc =
                            kwargs.pointer("/model_info/output_cost_per_token").and_then(Value::as_f64).unwrap_or(0.0);
                        // terminus-2 records a zero cost as null (`total_cost if total_cost > 0 else None`).
                        let cost = tin as f64 * ic + tout as f64 * oc;
                        r.result["agent_result"]["cost_usd"] = if cost > 0.0 { json!(cost) } else { Value::Null };
                        break;
                    }
                    CallOutcome::Timeout => {
                        if agent_started.elapsed().as_secs_f64() >= agent_timeout {
                            timed_out = true;
                            break 'turns;
                        }
                        if attempt >= 3 {
                            failure = Some(("Timeout".into(), "litellm.Timeout: Connection timed out.".into()));
                            break 'turns;
                        }
                    }
                    CallOutcome::Err(e) if summarize && e.typ == "ContextLengthExceededError" => {
                        // Unwinding, summarising and the fallback chat all overflow again
                        // ("Even fallback chat failed"): the turn is tried anew, until the timeout.
                        trial_log(&dir, "Context length exceeded. Using fallback summarization.");
                        if job.cancel.load(Ordering::SeqCst) {
                            return TrialEnd::Cancelled;
                        }
                        attempt = 0;
                        c::sleep_secs(0.02);
                        continue;
                    }
                    CallOutcome::Err(e) => {
                        trial_log(&dir, &format!("turn {turn}: {}: {}", e.typ, e.msg));
                        if !e.retriable || attempt >= 3 {
                            failure = Some((e.typ, e.msg));
                            break 'turns;
                        }
                    }
                }
                if job.cancel.load(Ordering::SeqCst) {
                    return TrialEnd::Cancelled;
                }
                c::sleep_secs((4.0 * 2f64.powi(attempt - 1)).min(15.0) * scale);
            }
            c::sleep_secs(total * 0.6 / turns.max(1) as f64);
        }
        let _ = any_ok;
        store_chat_totals(&mut rec.lock().unwrap_or_else(|e| e.into_inner()).result, tin, tout);
    } else {
        c::sleep_secs(total * 0.6);
    }
    if job.cancel.load(Ordering::SeqCst) {
        return TrialEnd::Cancelled;
    }
    set_phase(&rec, "agent_execution", "finished_at");
    let _ = std::fs::write(
        dir.join(hf::AGENT_TRAJECTORY),
        c::json_pretty4(
            &json!({"schema_version": "ATIF-v1.5", "session_id": format!("{name}__agent"), "agent": {"name": agent_name, "model_name": model_name}, "steps": []}),
        ),
    );
    let agent_frames = [
        (
            concat!("/opt/harbor/.venv/lib/python3.12/site-packages/harbor", "/trial/trial.py"),
            612u32,
            "run",
            "await self._run()",
        ),
        (
            "/opt/harbor/.venv/lib/python3.12/site-packages/harbor/agents/terminus_2/terminus_2.py",
            1228,
            "_query_llm",
            "llm_response = await chat.chat(",
        ),
        (
            "/opt/harbor/.venv/lib/python3.12/site-packages/harbor/llms/lite_llm.py",
            654,
            "_handle_litellm_error",
            "raise e",
        ),
    ];
    if let Some((typ, msg)) = failure {
        let mut r = rec.lock().unwrap_or_else(|e| e.into_inner());
        if r.finalized {
            return TrialEnd::Cancelled;
        }
        r.result["exception_info"] = exception_info(&typ, &msg, &agent_frames);
        let _ = std::fs::write(
            dir.join(hf::EXCEPTION_FILE),
            r.result["exception_info"]["exception_traceback"].as_str().unwrap_or(""),
        );
        trial_log(&dir, &format!("Trial {name} failed: {typ}: {msg}"));
    } else {
        if timed_out {
            let mut r = rec.lock().unwrap_or_else(|e| e.into_inner());
            let msg = format!("Agent execution timed out after {} seconds", hm::py_float(agent_timeout));
            r.result["exception_info"] = exception_info("AgentTimeoutError", &msg, &agent_frames[..1]);
            let _ = std::fs::write(
                dir.join(hf::EXCEPTION_FILE),
                r.result["exception_info"]["exception_traceback"].as_str().unwrap_or(""),
            );
        }
        let disabled =
            cfg["verifier"]["disable"].as_bool() == Some(true) || cfg["install_only"].as_bool() == Some(true);
        if !disabled {
            set_phase(&rec, "verifier", "started_at");
            // Harbor runs the task's tests with their stdout in `verifier/test-stdout.txt`: the file
            // is there while the verifier runs (a trial dir that reads as verifying).
            let _ = std::fs::write(dir.join(hf::VERIFIER_STDOUT), "");
            c::sleep_secs(total * 0.2);
            let reward = if agent_name == "nop" {
                0.0
            } else if agent_name == "oracle" {
                1.0
            } else {
                reward_for(&plan.task_dir, &plan.task_name)
            };
            let _ = std::fs::write(dir.join(hf::VERIFIER_REWARD), format!("{}\n", hm::py_float(reward)));
            set_phase(&rec, "verifier", "finished_at");
            rec.lock().unwrap_or_else(|e| e.into_inner()).result["verifier_result"] =
                json!({"rewards": {"reward": reward}});
        }
    }
    let mut r = rec.lock().unwrap_or_else(|e| e.into_inner());
    if r.finalized {
        return TrialEnd::Cancelled;
    }
    r.result["finished_at"] = json!(c::iso_utc(now()));
    files::write(&dir, Doc::TrialResult, &r.result, false);
    r.finalized = true;
    trial_log(&dir, &format!("Trial {name} finished"));
    let out = r.result.clone();
    drop(r);
    job.live.lock().unwrap_or_else(|e| e.into_inner()).remove(&name);
    TrialEnd::Done(out)
}

fn should_retry(cfg: &Value, typ: &str) -> bool {
    let retry = &cfg["retry"];
    if let Some(ex) = retry["exclude_exceptions"].as_array()
        && ex.iter().any(|v| v.as_str() == Some(typ))
    {
        return false;
    }
    if let Some(inc) = retry["include_exceptions"].as_array()
        && !inc.iter().any(|v| v.as_str() == Some(typ))
    {
        return false;
    }
    true
}

/// Run one trial with harbor's TrialQueue retry policy.
fn run_with_retries(job: &Job, plan: &Plan) -> Option<String> {
    let max_retries = job.cfg["retry"]["max_retries"].as_u64().unwrap_or(0);
    let scale = c::env_f64("STANDIN_RETRY_SCALE", 0.01);
    let mut attempt = 0u64;
    loop {
        match run_trial(job, plan) {
            TrialEnd::Crash(msg) => return Some(msg),
            TrialEnd::Cancelled => return None,
            TrialEnd::Done(result) => {
                let name = result["trial_name"].as_str().unwrap_or("").to_string();
                let typ = result.pointer("/exception_info/exception_type").and_then(Value::as_str).map(str::to_string);
                job.on_end(&name, result);
                let typ = typ?;
                if !should_retry(&job.cfg, &typ) || attempt >= max_retries || job.cancel.load(Ordering::SeqCst) {
                    return None;
                }
                let _ = std::fs::remove_dir_all(job.job_dir.join(&name));
                let r = &job.cfg["retry"];
                let delay = (r["min_wait_sec"].as_f64().unwrap_or(1.0)
                    * r["wait_multiplier"].as_f64().unwrap_or(1.0).powi(attempt as i32))
                .min(r["max_wait_sec"].as_f64().unwrap_or(60.0));
                job.jlog(&format!("Trial {name} failed with exception {typ}. Retrying in {delay:.2} seconds..."));
                c::sleep_secs(delay * scale);
                attempt += 1;
            }
        }
    }
}

fn fmt_duration(secs: u64) -> String {
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    if h > 0 {
        format!("{h}h {m}m {s}s")
    } else if m > 0 {
        format!("{m}m {s}s")
    } else {
        format!("{s}s")
    }
}

fn print_tables(stats: &Value) {
    let Some(evals) = stats["evals"].as_object() else { return };
    for (key, e) in evals {
        let parts: Vec<&str> = key.split("__").collect();
        let title = match parts.as_slice() {
            [a, m, d] => format!("{d} • {a} • {m}"),
            [a, d] => format!("{d} • {a}"),
            _ => key.clone(),
        };
        println!("{title}");
        let mut cols = vec![
            ("Trials".to_string(), e["n_trials"].to_string()),
            ("Exceptions".to_string(), e["n_errors"].to_string()),
        ];
        if let Some(m) = e["metrics"].as_array() {
            for metric in m {
                if let Some(o) = metric.as_object() {
                    for (k, v) in o {
                        cols.push((
                            format!("{}{}", k[..1].to_uppercase(), &k[1..]),
                            format!("{:.3}", v.as_f64().unwrap_or(0.0)),
                        ));
                    }
                }
            }
        }
        if let Some(p) = e["pass_at_k"].as_object() {
            for (k, v) in p {
                cols.push((format!("Pass@{k}"), format!("{:.3}", v.as_f64().unwrap_or(0.0))));
            }
        }
        let widths: Vec<usize> = cols.iter().map(|(h, v)| h.chars().count().max(v.chars().count())).collect();
        let line = |l: &str, m: &str, r: &str, fill: &str| {
            format!("{l}{}{r}", widths.iter().map(|w| fill.repeat(w + 2)).collect::<Vec<_>>().join(m))
        };
        println!("{}", line("┏", "┳", "┓", "━"));
        println!(
            "┃{}┃",
            cols.iter().zip(&widths).map(|((h, _), w)| format!(" {h:>w$} ")).collect::<Vec<_>>().join("┃")
        );
        println!("{}", line("┡", "╇", "┩", "━"));
        println!(
            "│{}│",
            cols.iter().zip(&widths).map(|((_, v), w)| format!(" {v:>w$} ")).collect::<Vec<_>>().join("│")
        );
        println!("{}", line("└", "┴", "┘", "─"));
        if let Some(exc) = e["exception_stats"].as_object().filter(|m| !m.is_empty()) {
            println!("Exception │ Count");
            for (t, names) in exc {
                println!("{t} │ {}", names.as_array().map(Vec::len).unwrap_or(0));
            }
        }
        println!();
    }
}

fn exception_group(msg: &str) -> String {
    format!(
        "  + Exception Group Traceback (most recent call last):\n  |   File \"{SITE}/cli/jobs.py\", line 2392, in _execute_job\n  |     job, job_result = run_async(_run_job())\n  |   File \"{SITE}/job.py\", line 1284, in _run_trials_with_queue\n  |     async with asyncio.TaskGroup() as tg:\n  | ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)\n  +-+---------------- 1 ----------------\n    | Traceback (most recent call last):\n    |   File \"{SITE}/trial/queue.py\", line 213, in _execute_trial_with_retries\n    |     trial = await Trial.create(trial_config)\n    |   File \"{SITE}/trial/trial.py\", line 1334, in _init_agent\n    |     self.agent = AgentFactory.create_agent_from_config(\n    |   File \"{SITE}/llms/lite_llm.py\", line 91, in __init__\n    |     hosted_vllm_validation = validate_hosted_vllm_model_config(\n    | {msg}\n    +------------------------------------\n"
    )
}

/// Create (or re-open) the job directory and run the remaining trials.
fn run_job(cfg: Value, is_resume: bool) -> ! {
    let cfg = hm::normalize_job(&cfg);
    let jobs_dir = PathBuf::from(cfg["jobs_dir"].as_str().unwrap_or("jobs"));
    let job_name = cfg["job_name"].as_str().unwrap_or("").to_string();
    let job_dir = jobs_dir.join(&job_name);
    let frames_create = [
        (
            concat!("/opt/harbor/.venv/lib/python3.12/site-packages/harbor", "/cli/jobs.py"),
            2392u32,
            "_execute_job",
            "job, job_result = run_async(_run_job())",
        ),
        ("/opt/harbor/.venv/lib/python3.12/site-packages/harbor/job.py", 205, "create", "job = cls("),
    ];
    let tasks = match resolve_tasks(&cfg) {
        Ok(t) => t,
        Err(e) => die_with_traceback(&frames_create, &e),
    };
    if tasks.is_empty() {
        die_with_traceback(&frames_create, "ValueError: No datasets or tasks remain after resolution.");
    }
    let existing_result: Option<Value> =
        std::fs::read_to_string(job_dir.join(hf::RESULT_FILE)).ok().and_then(|t| serde_json::from_str(&t).ok());
    let job_id = existing_result.as_ref().and_then(|r| r["id"].as_str().map(str::to_string)).unwrap_or_else(c::uuid4);
    let mut plans = build_trial_configs(&cfg, &job_dir, &job_id, &tasks);
    let job_lock = json!({
        "schema_version": 3,
        "created_at": c::iso_local(now()),
        "harbor": {"version": HARBOR_VERSION},
        "n_concurrent_trials": cfg["n_concurrent_trials"],
        "retry": cfg["retry"],
        "trials": plans.iter().map(|p| trial_lock(&p.config)).collect::<Vec<_>>(),
    });
    let _ = std::fs::create_dir_all(&job_dir);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(existing_result.is_some())
        .write(true)
        .truncate(existing_result.is_none())
        .open(job_dir.join(hf::JOB_LOG))
        .ok();
    // _maybe_init_existing_job.
    let mut existing: Vec<(String, Value, Value)> = Vec::new();
    if job_dir.join(hf::CONFIG_FILE).exists() {
        let stored: Value = std::fs::read_to_string(job_dir.join(hf::CONFIG_FILE))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        if !hm::same_job(&stored, &cfg) {
            die_with_traceback(
                &frames_create,
                &format!(
                    "FileExistsError: Job directory {} already exists and cannot be resumed with a different config.",
                    job_dir.display()
                ),
            );
        }
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&job_dir)
            .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        dirs.sort();
        for d in dirs.into_iter().filter(|d| d.is_dir()) {
            let rp = d.join(hf::RESULT_FILE);
            if !rp.exists() {
                let _ = std::fs::remove_dir_all(&d);
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&rp) else { continue };
            if text.trim().is_empty() {
                continue;
            }
            let Ok(result) = serde_json::from_str::<Value>(&text) else { continue };
            let tc: Value = std::fs::read_to_string(d.join(hf::CONFIG_FILE))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or(Value::Null);
            let name = result["trial_name"].as_str().unwrap_or("").to_string();
            existing.push((name, tc, result));
        }
    }
    // _init_remaining_trial_configs: match stored trial configs against the plan.
    let mut matched = vec![false; existing.len()];
    let mut remaining = Vec::new();
    for plan in plans.drain(..) {
        let hit =
            existing.iter().enumerate().position(|(i, (_, tc, _))| !matched[i] && hm::same_trial(tc, &plan.config));
        match hit {
            Some(i) => matched[i] = true,
            None => remaining.push(plan),
        }
    }
    let n_total = remaining.len() + existing.len();
    if matched.iter().any(|m| !m) {
        let frames = [(
            "/opt/harbor/.venv/lib/python3.12/site-packages/harbor/job.py",
            422u32,
            "_init_remaining_trial_configs",
            "raise ValueError(\"Existing trial config does not match planned job config.\")",
        )];
        die_with_traceback(&frames, "ValueError: Existing trial config does not match planned job config.");
    }
    let quiet = cfg["quiet"].as_bool() == Some(true);
    let started_at = existing_result
        .as_ref()
        .and_then(|r| r["started_at"].as_str().map(str::to_string))
        .unwrap_or_else(|| c::iso_local(now()));
    let n_retries =
        existing_result.as_ref().and_then(|r| r.pointer("/stats/n_retries").and_then(Value::as_u64)).unwrap_or(0);
    let mut acc = Acc { results: BTreeMap::new(), order: Vec::new(), running: BTreeSet::new(), n_retries, done: 0 };
    for (name, _, result) in &existing {
        acc.results.insert(name.clone(), result.clone());
        acc.order.push(name.clone());
    }
    let job = Arc::new(Job {
        cfg: cfg.clone(),
        job_dir: job_dir.clone(),
        id: job_id,
        started_at,
        n_total,
        acc: Mutex::new(acc),
        live: Mutex::new(BTreeMap::new()),
        cancel: AtomicBool::new(false),
        crash: Mutex::new(None),
        create_lock: Mutex::new(()),
        log: Mutex::new(log),
        quiet,
    });
    files::write(&job_dir, Doc::JobConfig, &hm::dump_job(&cfg), false);
    if let Some(code) = c::env_str("STANDIN_CRASH") {
        let code: i32 = code.trim().parse().unwrap_or(1);
        eprint!(
            "{}",
            traceback_text(
                &frames_create,
                &format!("RuntimeError: harbor-standin crash requested (STANDIN_CRASH={code})")
            )
        );
        std::process::exit(code);
    }
    // Job._write_job_lock: an existing lock must equal the resolved one (created_at and harbor
    // are taken from the existing lock), else FileExistsError.
    let lock_path = job_dir.join(hf::LOCK_FILE);
    let mut job_lock = job_lock;
    if lock_path.exists() {
        let existing: Option<Value> =
            std::fs::read_to_string(&lock_path).ok().and_then(|t| serde_json::from_str(&t).ok());
        let Some(existing) = existing else {
            die_with_traceback(
                &frames_create,
                &format!(
                    "ValueError: Existing lock file at {} could not be parsed; refusing to overwrite it.",
                    lock_path.display()
                ),
            )
        };
        job_lock["created_at"] = existing["created_at"].clone();
        job_lock["harbor"] = existing["harbor"].clone();
        if job_lock_key(&existing) != job_lock_key(&job_lock) {
            die_with_traceback(
                &frames_create,
                &format!(
                    "FileExistsError: Job directory {} already has a lock.json that does not match the resolved job lock.",
                    job_dir.display()
                ),
            );
        }
    }
    files::write(&job_dir, Doc::JobLock, &job_lock, false);
    job.write_result(false);
    job.jlog(&format!("Job {} started: {} trials ({} remaining)", job_name, n_total, remaining.len()));
    // Run with n_concurrent_trials workers.
    let queue = Arc::new(Mutex::new(remaining.into_iter().collect::<VecDeque<Plan>>()));
    let workers = cfg["n_concurrent_trials"].as_u64().unwrap_or(4).max(1) as usize;
    let mut handles = Vec::new();
    for _ in 0..workers {
        let job = job.clone();
        let queue = queue.clone();
        handles.push(std::thread::spawn(move || {
            loop {
                if job.cancel.load(Ordering::SeqCst) {
                    return;
                }
                let Some(plan) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else { return };
                if let Some(msg) = run_with_retries(&job, &plan) {
                    job.crash.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(msg);
                    job.cancel.store(true, Ordering::SeqCst);
                    return;
                }
            }
        }));
    }
    let t0 = Instant::now();
    loop {
        if let Some(msg) = job.crash.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            job.cancel.store(true, Ordering::SeqCst);
            let _quiesce = job.create_lock.lock().unwrap_or_else(|e| e.into_inner());
            job.cancel_live();
            eprint!("{}", exception_group(&msg));
            std::process::exit(1);
        }
        if c::pending_signal().is_some() {
            job.cancel.store(true, Ordering::SeqCst);
            let _quiesce = job.create_lock.lock().unwrap_or_else(|e| e.into_inner());
            job.cancel_live();
            job.jlog("Job cancelled (KeyboardInterrupt)");
            // harbor 0.25 exits 130 after a KeyboardInterrupt and prints nothing more
            // (docs/harbor-facts.md, observed with the real program).
            std::process::exit(130);
        }
        if handles.iter().all(|h| h.is_finished()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for h in handles {
        let _ = h.join();
    }
    if let Some(msg) = job.crash.lock().unwrap_or_else(|e| e.into_inner()).clone() {
        eprint!("{}", exception_group(&msg));
        std::process::exit(1);
    }
    job.write_result(true);
    let stats = {
        let acc = job.acc.lock().unwrap_or_else(|e| e.into_inner());
        job.stats(&acc)
    };
    job.jlog(&format!("Job {job_name} finished"));
    println!();
    print_tables(&stats);
    if !is_resume {
        println!("Job Info");
        println!("Total runtime: {}", fmt_duration(t0.elapsed().as_secs()));
        println!("Results written to {}", job_dir.join(hf::RESULT_FILE).display());
        println!("Inspect results by running `harbor view {}`", jobs_dir.display());
        println!("Share results by running `harbor upload {}`", job_dir.display());
        println!();
        if EXPORT_TRACES.load(Ordering::SeqCst) {
            println!("[traces] Exporting traces from job dir: {}", job_dir.display());
            let rows = stats["n_completed_trials"].as_u64().unwrap_or(0);
            println!("[traces] Exported {rows} rows from {}", job_dir.display());
        }
    }
    std::process::exit(0);
}

fn start(args: &[String], path: &str) -> ! {
    let o = parse_or_exit(args, START_OPTS, path);
    if c::env_flag("STANDIN_IGNORE_SIGTERM") {
        c::ignore_signal(libc::SIGTERM);
    } else {
        c::catch_signal(libc::SIGTERM);
    }
    catch_or_ignore_sigint();
    let mut cfg = build_job_config(&o, path);
    if cfg.get("job_name").is_none_or(Value::is_null) {
        let t = c::local_now();
        cfg["job_name"] =
            json!(format!("{:04}-{:02}-{:02}__{:02}-{:02}-{:02}", t.year, t.month, t.day, t.hour, t.minute, t.second));
    }
    let norm = hm::normalize_job(&cfg);
    // Preflight: agent names (AgentFactory), as start() prints ValueErrors in red and exits 1.
    for a in norm["agents"].as_array().cloned().unwrap_or_default() {
        if let Some(n) = a["name"].as_str()
            && !AGENT_NAMES.contains(&n)
            && a["import_path"].is_null()
        {
            let list: Vec<String> = AGENT_NAMES.iter().map(|x| format!("'{x}'")).collect();
            red_error(&format!("Agent name {n} is not valid. Valid agent names: {{{}}}", list.join(", ")));
        }
    }
    if norm["datasets"].as_array().is_none_or(Vec::is_empty) && norm["tasks"].as_array().is_none_or(Vec::is_empty) {
        red_error("No datasets or tasks specified: pass -p/--path, -d/--dataset or a config with datasets/tasks.");
    }
    if o.flag("dry_run") == Some(true) {
        println!("Dry run OK — nothing was run.");
        std::process::exit(0);
    }
    if o.flag("print_config") == Some(true) {
        println!("{}", serde_json::to_string_pretty(&hm::dump_job(&norm)).unwrap_or_default());
        std::process::exit(0);
    }
    preflight_agent_options(&norm);
    confirm_host_env_access(&norm, o.flag("yes") == Some(true));
    if o.flag("export_traces") == Some(true) {
        EXPORT_TRACES.store(true, Ordering::SeqCst);
    }
    run_job(cfg, false)
}

/// SIGINT raises KeyboardInterrupt in both commands (Python's default handler) — unless SIGINT
/// was already ignored when harbor started: Python then installs no handler and SIGINT stays
/// ignored (docs/harbor-facts.md), so whoever starts Harbor must hand it SIGINT at its default.
fn catch_or_ignore_sigint() {
    if c::env_flag("STANDIN_IGNORE_SIGINT") || c::signal_ignored(libc::SIGINT) {
        c::ignore_signal(libc::SIGINT);
    } else {
        c::catch_signal(libc::SIGINT);
    }
}

static EXPORT_TRACES: AtomicBool = AtomicBool::new(false);

fn resume(args: &[String], path: &str) -> ! {
    let o = parse_or_exit(args, RESUME_OPTS, path);
    // harbor 0.25's resume installs no SIGTERM handler: SIGTERM kills it.
    if c::env_flag("STANDIN_IGNORE_SIGTERM") {
        c::ignore_signal(libc::SIGTERM);
    }
    catch_or_ignore_sigint();
    if o.flag("public").is_some() && o.flag("upload") != Some(true) {
        red_error("Error: --public / --private requires --upload.");
    }
    if (o.list("share_org").is_some() || o.list("share_user").is_some()) && o.flag("upload") != Some(true) {
        red_error("Error: --share / --share-user requires --upload.");
    }
    if o.str("org").is_some() && o.flag("upload") != Some(true) {
        red_error("Error: --org requires --upload.");
    }
    if o.flag("upload") == Some(true) {
        red_error("Error: harbor-standin cannot reach Harbor Hub (--upload is not supported by the stand-in).");
    }
    let job_dir = PathBuf::from(o.str("job_path").unwrap_or_default());
    let frames = [(
        concat!("/opt/harbor/.venv/lib/python3.12/site-packages/harbor", "/cli/jobs.py"),
        2576u32,
        "resume",
        "raise ValueError(f\"Job directory does not exist: {job_dir}\")",
    )];
    if !job_dir.exists() {
        die_with_traceback(&frames, &format!("ValueError: Job directory does not exist: {}", job_dir.display()));
    }
    let config_path = job_dir.join(hf::CONFIG_FILE);
    if !config_path.exists() {
        die_with_traceback(&frames, &format!("ValueError: Config file not found: {}", config_path.display()));
    }
    let filters: BTreeSet<String> =
        o.list("filter_error_types").unwrap_or_else(|| vec!["CancelledError".into()]).into_iter().collect();
    if !filters.is_empty() {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(&job_dir)
            .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        dirs.sort();
        for d in dirs.into_iter().filter(|d| d.is_dir()) {
            // The product's reader of a trial result: what resume removes is what `check` counts.
            let Ok(Some(r)) = hf::read::<hf::TrialResult>(&d.join(hf::RESULT_FILE)) else { continue };
            if let Some(t) = r.exception_info.and_then(|e| e.exception_type)
                && filters.contains(&t)
            {
                println!(
                    "Removing trial directory with {t}: {}",
                    d.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default()
                );
                let _ = std::fs::remove_dir_all(&d);
            }
        }
    }
    let mut cfg: Value = match std::fs::read_to_string(&config_path).ok().and_then(|t| serde_json::from_str(&t).ok()) {
        Some(v) => v,
        None => die_with_traceback(
            &frames,
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for JobConfig\n  Invalid JSON",
        ),
    };
    let parent = job_dir.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    cfg["jobs_dir"] =
        json!(if parent.as_os_str().is_empty() { ".".to_string() } else { parent.to_string_lossy().to_string() });
    cfg["job_name"] = json!(job_dir.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default());
    preflight_agent_options(&hm::normalize_job(&cfg));
    run_job(cfg, true)
}
