//! Harbor (docs/design.md §6.4): argv for a fresh run and for a resume, `model_info`, agent envs, and the
//! structural `api_base` rewrite of the job's and every trial's `config.json` on resume.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use launch_spec::spec::AgentEnv;
use launch_spec::versions::Version;
use launch_spec::{LaunchSpec, OutcomeClass};

use crate::failure::Failure;
use crate::secrets::Secrets;

/// Default `max_output_tokens` for `model_info` (the registry's value wins).
pub(crate) const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 16384;
/// `max_input_tokens` when the spec has no `max_model_len`.
pub(crate) const DEFAULT_MAX_INPUT_TOKENS: u64 = 32768;

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
    #[error(
        "{path}: agent `{agent}` has no kwargs.model_info, so every hosted_vllm trial of this job would fail before its first request; move the run dir aside to start fresh (payload passes model_info on fresh runs)"
    )]
    NoModelInfo { path: PathBuf, agent: String },
    #[error("{0} (field `harbor.agent_kwargs` of the launch spec)")]
    Kwarg(launch_spec::versions::KwargError),
    #[error(
        "{run_dir} already holds a Harbor job (config.json) and the spec starts a fresh one (harbor.start: fresh): it is never overwritten; a re-evaluation gets a run dir of its own from `submitter launch`, or move this one aside"
    )]
    JobExists { run_dir: PathBuf },
    #[error(
        "the Harbor job in {run_dir} finished ({finished_at}): resuming it would run no trial and record its old scores as new; a re-evaluation runs fresh in a run dir of its own (`submitter launch --force`), or move this one aside"
    )]
    Finished { run_dir: PathBuf, finished_at: String },
    #[error(
        "the Harbor job in {run_dir} ran with {field} {stored}, the spec says {wanted}: a changed setting is never applied by resuming (Harbor's resume keeps the stored config); a changed config runs fresh in a run dir of its own (`submitter launch --config-aware`), or set harbor.{field} back to {stored}"
    )]
    SettingsChanged { run_dir: PathBuf, field: &'static str, stored: String, wanted: String },
    #[error(
        "the Harbor job in {run_dir} was written by Harbor {writer}, newer than the Harbor {resuming} this job runs: the older Harbor would resume it under its own rules (0.25 scores a trial with an invalid reward as 0, 0.26 drops it) while lock.json still names {writer}; run it with Harbor {writer} (`environments.{environment}.harbor` in the cluster profile), or re-evaluate fresh in a run dir of its own (`submitter launch --force`)"
    )]
    NewerHarbor { run_dir: PathBuf, writer: Version, resuming: Version, environment: String },
    #[error(
        "the Harbor job in {run_dir} was written by Harbor {writer} with its retry defaults, which Harbor {resuming} changed: Harbor {resuming} refuses its lock.json (`does not match the resolved job lock`), after the model has loaded; re-evaluate fresh in a run dir of its own (`submitter launch --force`), or run it with Harbor {writer} (`environments.{environment}.harbor` in the cluster profile)"
    )]
    RetryDefaultsChanged { run_dir: PathBuf, writer: Version, resuming: Version, environment: String },
}

impl From<HarborError> for Failure {
    fn from(err: HarborError) -> Self {
        Failure::new(OutcomeClass::Harbor, err.to_string()).with_cause("config")
    }
}

/// `model_info` for hosted_vllm: O = max_output_tokens or 16384; if O ≥ L then O = L/2, where
/// L = max_model_len or 32768. Without it Harbor 0.25's terminus-2 assumes LiteLLM's fallback context
/// of 1,000,000 tokens (never summarises, so long trials end in 400s); older Harbor rejected the agent.
pub(crate) fn model_info(max_model_len: Option<u64>, max_output_tokens: Option<u64>) -> serde_json::Value {
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
pub(crate) fn format_multiplier(value: f64) -> String {
    if value.fract() == 0.0 { format!("{value:.1}") } else { format!("{value}") }
}

/// Fresh run when the run dir has no `config.json`.
pub(crate) fn is_resume(run_dir: &Path) -> bool {
    run_dir.join("config.json").is_file()
}

/// Whether the Harbor job in the run dir may be resumed under this spec (docs/decisions.md, "A
/// re-evaluation is a new run"): only an unfinished job whose stored settings are the spec's, and
/// only when the spec allows a resume. `jobs resume` takes none of these settings from its command
/// line, so resuming under another value would run the old one while the records say the new one.
pub(crate) fn check_resumable(spec: &LaunchSpec) -> Result<(), HarborError> {
    use launch_spec::rundir::harbor::{self as files, JobConfig, JobResult};
    use launch_spec::spec::HarborStart;
    let run_dir = &spec.run_dir;
    if spec.harbor.start == HarborStart::Fresh {
        return Err(HarborError::JobExists { run_dir: run_dir.clone() });
    }
    let read_error = |path: PathBuf, reason: String| HarborError::Read { path, reason };
    let result_path = run_dir.join(files::RESULT_FILE);
    let result: Option<JobResult> =
        files::read_rewritten(&result_path).map_err(|e| read_error(result_path.clone(), e))?;
    if let Some(finished_at) = result.and_then(|r| r.finished_at) {
        return Err(HarborError::Finished { run_dir: run_dir.clone(), finished_at });
    }
    let config_path = run_dir.join(files::CONFIG_FILE);
    let Some(config) = files::read::<JobConfig>(&config_path).map_err(|e| read_error(config_path.clone(), e))? else {
        return Ok(());
    };
    check_harbor_release(spec, &config)?;
    let changed = |field: &'static str, stored: String, wanted: String| {
        Err(HarborError::SettingsChanged { run_dir: run_dir.clone(), field, stored, wanted })
    };
    // Harbor writes only non-default fields: absent is its default (1.0, 1).
    let stored_multiplier = config.timeout_multiplier.unwrap_or(1.0);
    if stored_multiplier != spec.harbor.timeout_multiplier {
        return changed(
            "timeout_multiplier",
            format_multiplier(stored_multiplier),
            format_multiplier(spec.harbor.timeout_multiplier),
        );
    }
    let stored_attempts = config.n_attempts.unwrap_or(1);
    if stored_attempts != u64::from(spec.harbor.n_attempts) {
        return changed("n_attempts", stored_attempts.to_string(), spec.harbor.n_attempts.to_string());
    }
    let agents: Vec<&str> = config.agents.iter().filter_map(|a| a.name.as_deref()).collect();
    if !agents.is_empty() && !agents.contains(&spec.harbor.agent.as_str()) {
        return changed("agent", agents.join(","), spec.harbor.agent.clone());
    }
    Ok(())
}

/// A resume across Harbor releases (docs/real-programs.md, "Resuming across Harbor releases"), as
/// measured with the real 0.25.0 and 0.26.0: an older Harbor resumes a dir a newer one wrote, silently
/// under its own scoring rules, so it is refused; a newer Harbor resumes an older one's dir when the
/// job pinned `retry.exclude_exceptions`, and refuses it (after the engine loaded) when the job
/// ran with the older release's retry defaults and the newer one changed them, so that is refused
/// here first. Compared by release (`major.minor`); only when the profile declared a release (a
/// flavour names none).
fn check_harbor_release(spec: &LaunchSpec, config: &launch_spec::rundir::harbor::JobConfig) -> Result<(), HarborError> {
    use launch_spec::versions::HARBOR_026;
    let Some(declared) = &spec.declared else { return Ok(()) };
    let Ok(resuming) = declared.harbor.parse::<Version>() else { return Ok(()) };
    let Some(writer) = launch_spec::rundir::harbor::newest_writer(&spec.run_dir) else { return Ok(()) };
    let release = |v: Version| (v.major(), v.minor());
    let (run_dir, environment) = (spec.run_dir.clone(), declared.harbor_environment.clone());
    if release(writer) > release(resuming) {
        return Err(HarborError::NewerHarbor { run_dir, writer, resuming, environment });
    }
    let pinned = config.retry.as_ref().is_some_and(|r| r.exclude_exceptions.is_some());
    if writer < HARBOR_026 && resuming >= HARBOR_026 && !pinned {
        return Err(HarborError::RetryDefaultsChanged { run_dir, writer, resuming, environment });
    }
    Ok(())
}

/// The `--ae` arguments and what Harbor's environment must carry for them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct AgentEnvPlan {
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
pub(crate) fn agent_envs(list: &[AgentEnv], secrets: &Secrets, env: &dyn Fn(&str) -> Option<String>) -> AgentEnvPlan {
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

pub(crate) use launch_spec::records::MERGED_HARBOR_CONFIG_FILE as MERGED_CONFIG_FILE;

/// The shipped job config with the model put into its agent: `--agent`/`--model` would replace
/// the YAML's `agents[]` and drop its agent settings (`max_timeout_sec`, kwargs, …), so payload
/// passes neither. It keeps the YAML's entries for the spec's agent, each with
/// `model_name = hosted_vllm/<served name>`, or one bare entry when the YAML has none for it
/// (another agent's settings do not apply). Kwargs stay on the command line (`--agent-kwarg`),
/// where Harbor merges them key by key into that agent's YAML kwargs.
pub(crate) fn merged_job_config(spec: &LaunchSpec) -> Result<serde_json::Value, HarborError> {
    let path = &spec.harbor.config;
    let mut config: serde_json::Value = launch_spec::yaml::from_yaml_file(path)
        .map_err(|e| HarborError::Read { path: path.clone(), reason: e.to_string() })?;
    let Some(map) = config.as_object_mut() else {
        return Err(HarborError::Read { path: path.clone(), reason: "must contain a mapping".to_string() });
    };
    let model = format!("hosted_vllm/{}", spec.model.served_name);
    let mut agents: Vec<serde_json::Value> = map
        .get("agents")
        .and_then(|a| a.as_array())
        .map(|list| {
            list.iter()
                .filter(|a| a.get("name").and_then(|n| n.as_str()) == Some(spec.harbor.agent.as_str()))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    if agents.is_empty() {
        agents.push(serde_json::json!({ "name": spec.harbor.agent }));
    }
    for agent in &mut agents {
        agent["model_name"] = serde_json::Value::String(model.clone());
    }
    map.insert("agents".to_string(), serde_json::Value::Array(agents));
    Ok(config)
}

/// Writes a merged job config ([`merged_job_config`]) to `path`, atomically.
pub(crate) fn write_job_config(path: &Path, config: &serde_json::Value) -> Result<(), HarborError> {
    write_json_atomic(path, config)
}

/// The agent kwargs in the form the spec's Harbor takes (crate `launch_spec::versions`).
pub(crate) fn agent_kwargs(spec: &LaunchSpec) -> Result<Vec<String>, HarborError> {
    let h = &spec.harbor;
    let mut kwargs: Vec<String> =
        h.agent_kwargs.iter().filter(|kv| !matches!(kwarg_key(kv), "api_base" | "model_info")).cloned().collect();
    if let Some(parser) = &h.agent_parser {
        kwargs.push(format!("{}={parser}", h.dialect.parser_kwarg()));
    }
    launch_spec::versions::translate_agent_kwargs(&kwargs, h.dialect).map_err(HarborError::Kwarg)
}

/// `harbor jobs start …` for a fresh run (docs/payload.md), program first. `config` is the merged
/// job config ([`write_job_config`]); no `--agent`/`--model`, which would drop its agent.
pub(crate) fn fresh_argv(
    spec: &LaunchSpec,
    program: &str,
    api_base: &str,
    agent_env_args: &[String],
    config: &Path,
) -> Result<Vec<String>, HarborError> {
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
        &config.display().to_string(),
        "--env",
        "daytona",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if h.dialect.has_yes() {
        // Host-variable prompts (`Proceed? (Y/n)`) abort on payload's /dev/null stdin.
        a.push("--yes".to_string());
    }
    a.extend([
        "--agent-kwarg".to_string(),
        format!("api_base={api_base}"),
        "--agent-kwarg".to_string(),
        format!("model_info={}", serde_json::to_string(&info).expect("json")),
        "--timeout-multiplier".to_string(),
        format_multiplier(h.timeout_multiplier),
    ]);
    for kv in agent_kwargs(spec)? {
        a.push("--agent-kwarg".to_string());
        a.push(kv);
    }
    for kv in agent_env_args {
        a.push("--ae".to_string());
        a.push(kv.clone());
    }
    a.extend(h.extra_args.iter().cloned());
    Ok(a)
}

/// `harbor jobs resume -p <run dir> --filter-error-type T …`, program first.
pub(crate) fn resume_argv(spec: &LaunchSpec, program: &str) -> Vec<String> {
    let mut a: Vec<String> =
        vec![program.to_string(), "jobs".into(), "resume".into(), "-p".into(), spec.run_dir.display().to_string()];
    for t in &spec.harbor.resume_filter_error_types {
        a.push("--filter-error-type".to_string());
        a.push(t.clone());
    }
    a
}

/// What Harbor's own `--print-config` said about the fresh-run argv.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ConfigCheck {
    /// Not asked: the dialect has no `--print-config`, or the check could not run (the reason).
    Skipped(String),
    /// Harbor resolved the job config; the agents' model and kwargs are what payload meant.
    Passed { agents: usize },
    /// Harbor (or the resolved config) refuses the argv: its message, one line.
    Rejected(String),
}

impl ConfigCheck {
    /// The `harbor_config_check` event's fields: `result` (`passed`, `skipped`, `rejected`) and its
    /// detail, typed rather than Rust's debug text.
    pub(crate) fn event_fields(&self) -> launch_spec::rundir::events::HarborConfigCheck {
        let (result, reason, agents) = match self {
            Self::Skipped(why) => ("skipped", Some(why.clone()), None),
            Self::Passed { agents } => ("passed", None, Some(*agents as u64)),
            Self::Rejected(why) => ("rejected", Some(why.clone()), None),
        };
        launch_spec::rundir::events::HarborConfigCheck { result: result.to_string(), reason, agents }
    }
}

/// How long Harbor may take to print its config (imports dominate: seconds).
pub(crate) const CONFIG_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);
/// The most of each stream of `--print-config` kept (a resolved job config is a few kB).
pub(crate) const CONFIG_CHECK_OUTPUT_CAP: u64 = 4 << 20;

/// Judges Harbor's `jobs start … --print-config` (exit code, stdout, stderr) against the spec:
/// Harbor itself must accept the argv (options, config layers, JobConfig), every agent must carry
/// the model and `api_base`, and a terminus-2's kwargs must be options of the dialect's schema —
/// what Harbor's preflight refuses later ("Invalid kwargs for agent 'terminus-2': Unknown option").
pub(crate) fn judge_print_config(spec: &LaunchSpec, code: Option<i32>, stdout: &str, stderr: &str) -> ConfigCheck {
    let last_line = |text: &str| text.lines().map(str::trim).rfind(|l| !l.is_empty()).map(str::to_string);
    if code != Some(0) {
        let why = last_line(stderr).or_else(|| last_line(stdout)).unwrap_or_else(|| "no output".to_string());
        return ConfigCheck::Rejected(format!("harbor --print-config exited {code:?}: {why}"));
    }
    // The first JSON value on stdout (Harbor may print a line before it or after it).
    let first_json =
        |i: usize| serde_json::Deserializer::from_str(&stdout[i..]).into_iter::<serde_json::Value>().next();
    let Some(config) = stdout.find('{').and_then(first_json).and_then(Result::ok) else {
        return ConfigCheck::Rejected("harbor --print-config printed no JSON job config".to_string());
    };
    let model = format!("hosted_vllm/{}", spec.model.served_name);
    let agents = config.get("agents").and_then(|a| a.as_array()).cloned().unwrap_or_default();
    if agents.is_empty() {
        return ConfigCheck::Rejected("Harbor's resolved job config has no agents".to_string());
    }
    for agent in &agents {
        let name = agent.get("name").and_then(|n| n.as_str()).unwrap_or("?");
        if agent.get("model_name").and_then(|m| m.as_str()) != Some(model.as_str()) {
            return ConfigCheck::Rejected(format!("Harbor's resolved agent `{name}` does not use model {model}"));
        }
        let kwargs = agent.get("kwargs").and_then(|k| k.as_object()).cloned().unwrap_or_default();
        if !kwargs.contains_key("api_base") {
            return ConfigCheck::Rejected(format!("Harbor's resolved agent `{name}` has no kwargs.api_base"));
        }
        if name == "terminus-2"
            && let Some(known) = spec.harbor.dialect.terminus2_options()
            && let Some(bad) = kwargs.keys().find(|k| !known.contains(&k.as_str()))
        {
            return ConfigCheck::Rejected(format!(
                "Invalid kwargs for agent 'terminus-2': Unknown option '{bad}' (Harbor {} refuses it at start; fix the registry's agent_kwargs or the job config {})",
                spec.harbor.dialect.as_str(),
                spec.harbor.config.display()
            ));
        }
    }
    ConfigCheck::Passed { agents: agents.len() }
}

/// Runs the installed Harbor's `jobs start … --print-config` on the fresh-run argv (config file
/// written beforehand) with Harbor's environment, bounded by [`CONFIG_CHECK_TIMEOUT`] and
/// [`CONFIG_CHECK_OUTPUT_CAP`] in its own process group (crate::bounded), and judges it. A check
/// that cannot give an answer in bounds is skipped with the reason: Harbor's own start decides.
pub(crate) async fn check_with_print_config(
    spec: &LaunchSpec,
    argv: &[String],
    env: &BTreeMap<String, String>,
) -> ConfigCheck {
    check_with_print_config_within(spec, argv, env, CONFIG_CHECK_TIMEOUT).await
}

/// [`check_with_print_config`] with its time limit handed in.
pub(crate) async fn check_with_print_config_within(
    spec: &LaunchSpec,
    argv: &[String],
    env: &BTreeMap<String, String>,
    limit: std::time::Duration,
) -> ConfigCheck {
    if !spec.harbor.dialect.has_print_config() {
        return check_against_schema(spec, argv);
    }
    let Some((program, args)) = argv.split_first() else { return ConfigCheck::Skipped("empty argv".to_string()) };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).arg("--print-config").env_clear().envs(env);
    let answer = match crate::bounded::run(cmd, limit, CONFIG_CHECK_OUTPUT_CAP).await {
        Ok(answer) => answer,
        Err(e) => return ConfigCheck::Skipped(format!("cannot run {program}: {e}")),
    };
    let Some(status) = answer.status else {
        return ConfigCheck::Skipped(format!("harbor --print-config did not finish within {limit:?} (killed)"));
    };
    if answer.truncated {
        return ConfigCheck::Skipped(format!(
            "harbor --print-config printed more than {CONFIG_CHECK_OUTPUT_CAP} bytes on one stream"
        ));
    }
    judge_print_config(
        spec,
        status.code(),
        &String::from_utf8_lossy(&answer.stdout),
        &String::from_utf8_lossy(&answer.stderr),
    )
}

/// A Harbor without `--print-config` (the fork): the merged job config the argv's `--config` names,
/// judged by the schema kept in the repo (`launch_spec::versions::job_config_problems`).
fn check_against_schema(spec: &LaunchSpec, argv: &[String]) -> ConfigCheck {
    let dialect = spec.harbor.dialect.as_str();
    let Some(file) = argv.iter().position(|a| a == "--config").and_then(|i| argv.get(i + 1)) else {
        return ConfigCheck::Skipped(format!(
            "Harbor dialect {dialect} has no --print-config and the argv no --config"
        ));
    };
    let config = match std::fs::read(file)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).map_err(|e| e.to_string()))
    {
        Ok(config) => config,
        Err(e) => return ConfigCheck::Skipped(format!("cannot read the merged job config {file}: {e}")),
    };
    match launch_spec::versions::job_config_problems(spec.harbor.dialect, &config).first() {
        Some(problem) => ConfigCheck::Rejected(format!(
            "{problem} (the {dialect} Harbor's job config schema; fix the job config {})",
            spec.harbor.config.display()
        )),
        None => ConfigCheck::Passed { agents: config.get("agents").and_then(|a| a.as_array()).map_or(0, Vec::len) },
    }
}

/// Sets every `api_base` string field, at any depth, to `new`. Returns how many changed.
pub(crate) fn rewrite_api_base_value(value: &mut serde_json::Value, new: &str) -> usize {
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

/// The job's `config.json` and every trial's (`<run_dir>/<trial>/config.json`), then the job's
/// `lock.json` and every trial's: Harbor 0.25 compares the job lock's trials (their full agent
/// config, `kwargs.api_base` included) with the resumed config, and each trial's lock must equal
/// its entry in the job lock.
pub(crate) fn config_files(run_dir: &Path) -> Vec<PathBuf> {
    let mut trials: Vec<PathBuf> = std::fs::read_dir(run_dir)
        .map(|rd| {
            rd.filter_map(Result::ok).filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()).collect()
        })
        .unwrap_or_default();
    trials.sort();
    let mut files = Vec::new();
    for name in [launch_spec::rundir::harbor::CONFIG_FILE, launch_spec::rundir::harbor::LOCK_FILE] {
        files.extend(
            std::iter::once(run_dir.join(name)).chain(trials.iter().map(|t| t.join(name))).filter(|p| p.is_file()),
        );
    }
    files
}

/// `kwargs.api_base` of a lock's agent (`agent` in a trial lock, `trials[].agent` in the job lock),
/// the only place Harbor's lock records it; every other lock field stays byte-for-byte.
fn rewrite_lock_api_base(lock: &mut serde_json::Value, new: &str) -> usize {
    let mut agents: Vec<&mut serde_json::Value> = Vec::new();
    let is_job_lock = lock.get("trials").is_some_and(|t| t.is_array());
    if is_job_lock {
        if let Some(trials) = lock.get_mut("trials").and_then(|t| t.as_array_mut()) {
            agents.extend(trials.iter_mut().filter_map(|t| t.get_mut("agent")));
        }
    } else if let Some(agent) = lock.get_mut("agent") {
        agents.push(agent);
    }
    let mut n = 0;
    for agent in agents {
        if let Some(slot) = agent.get_mut("kwargs").and_then(|k| k.get_mut("api_base"))
            && slot.is_string()
            && slot.as_str() != Some(new)
        {
            *slot = serde_json::Value::String(new.to_string());
            n += 1;
        }
    }
    n
}

/// Rewrites `api_base` structurally in the job's and every trial's `config.json` and `lock.json`
/// (parsed as JSON, written back atomically with Harbor's 4-space indent, key order kept).
/// Returns (file, fields changed) per file.
pub(crate) fn rewrite_api_base(run_dir: &Path, new: &str) -> Result<Vec<(PathBuf, usize)>, HarborError> {
    let mut out = Vec::new();
    for path in config_files(run_dir) {
        let mut value = read_config(&path)?;
        let changed = if path.file_name().is_some_and(|n| n == launch_spec::rundir::harbor::LOCK_FILE) {
            rewrite_lock_api_base(&mut value, new)
        } else {
            rewrite_api_base_value(&mut value, new)
        };
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
/// Also, the job's stored agents must carry `kwargs.model_info` when they call a hosted_vllm
/// model: without it the agent misjudges its context (see [`model_info`]), and a resume re-uses
/// the stored config as it is.
pub(crate) fn check_resume_configs(run_dir: &Path) -> Result<usize, HarborError> {
    let files = config_files(run_dir);
    for path in &files {
        let value = read_config(path)?;
        if *path != run_dir.join("config.json") {
            continue;
        }
        // Harbor's job config through its typed model in launch_spec::rundir, the one `check` reads.
        let job: launch_spec::rundir::harbor::JobConfig = serde::Deserialize::deserialize(&value)
            .map_err(|e| HarborError::Json { path: path.clone(), reason: e.to_string() })?;
        for agent in &job.agents {
            let hosted = agent.model_name.as_deref().is_some_and(|m| m.starts_with("hosted_vllm/"));
            if hosted && !agent.kwargs.has_model_info() {
                let name = agent.name.clone().unwrap_or_else(|| "?".to_string());
                return Err(HarborError::NoModelInfo { path: path.clone(), agent: name });
            }
        }
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
    use launch_spec::testkit::unit_spec as spec;

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
        spec.harbor.agent_kwargs = s(&[
            "temperature=0.7",
            "api_base=http://evil/v1",
            r#"extra_body={"chat_template_kwargs":{"enable_thinking":true}}"#,
        ]);
        spec.harbor.agent_parser = Some("xml".into());
        spec.harbor.extra_args = s(&["--export-traces", "--ek", "auto_snapshot=true"]);
        let a = fresh_argv(
            &spec,
            "/env/bin/harbor",
            "http://127.0.0.1:23456/v1",
            &s(&["MODEL_FOR_TOOLS=openai/gpt", "KEY=${KEY}"]),
            Path::new("/jobs/tb2_qwen3-8b/harbor-job-config.json"),
        )
        .unwrap();
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
                "/jobs/tb2_qwen3-8b/harbor-job-config.json",
                "--env",
                "daytona",
                "--yes",
                "--agent-kwarg",
                "api_base=http://127.0.0.1:23456/v1",
                "--agent-kwarg",
                r#"model_info={"max_input_tokens":32768,"max_output_tokens":16384,"input_cost_per_token":0,"output_cost_per_token":0}"#,
                "--timeout-multiplier",
                "2.0",
                "--agent-kwarg",
                "temperature=0.7",
                "--agent-kwarg",
                r#"llm_call_kwargs={"extra_body":{"chat_template_kwargs":{"enable_thinking":true}}}"#,
                "--agent-kwarg",
                "parser_name=xml",
                "--ae",
                "MODEL_FOR_TOOLS=openai/gpt",
                "--ae",
                "KEY=${KEY}",
                "--export-traces",
                "--ek",
                "auto_snapshot=true",
            ])
        );
        assert!(!a.iter().any(|x| x == "--agent" || x == "--model"), "they would drop the YAML's agent");
    }

    #[test]
    fn the_fork_gets_its_own_forms_and_no_yes() {
        let mut spec = spec();
        spec.harbor.dialect = launch_spec::versions::HarborDialect::ExtraBodyFork;
        spec.harbor.agent_kwargs = s(&[r#"llm_call_kwargs={"extra_body":{"a":1}}"#]);
        spec.harbor.agent_parser = Some("xml".into());
        let a = fresh_argv(&spec, "harbor", "http://h/v1", &[], Path::new("/c.json")).unwrap();
        assert!(!a.contains(&"--yes".to_string()));
        assert!(a.contains(&r#"extra_body={"a":1}"#.to_string()), "{a:?}");
        assert!(a.contains(&"parser=xml".to_string()), "{a:?}");
        spec.harbor.agent_kwargs = s(&[r#"llm_call_kwargs={"top_k":1}"#]);
        let err = fresh_argv(&spec, "harbor", "http://h/v1", &[], Path::new("/c.json")).unwrap_err().to_string();
        assert!(err.contains("top_k") && err.contains("harbor.agent_kwargs"), "{err}");
    }

    #[test]
    fn merged_config_keeps_the_yaml_agent_and_adds_the_model() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = dir.path().join("eval.yaml");
        std::fs::write(
            &yaml,
            "n_attempts: 3\nagents:\n  - name: terminus-2\n    max_timeout_sec: 7200\n    kwargs:\n      proactive_summarization_threshold: 2048\n      llm_kwargs:\n        timeout: 1800\n  - name: oracle\n",
        )
        .unwrap();
        let mut spec = spec();
        spec.harbor.config = yaml.clone();
        spec.run_dir = dir.path().join("run");
        std::fs::create_dir(&spec.run_dir).unwrap();
        let path = spec.run_dir.join(MERGED_CONFIG_FILE);
        write_job_config(&path, &merged_job_config(&spec).unwrap()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["n_attempts"], 3);
        let agents = v["agents"].as_array().unwrap();
        assert_eq!(agents.len(), 1, "only the spec's agent runs: {v}");
        assert_eq!(agents[0]["model_name"], "hosted_vllm/Qwen3-8B");
        assert_eq!(agents[0]["max_timeout_sec"], 7200);
        assert_eq!(agents[0]["kwargs"]["llm_kwargs"]["timeout"], 1800);
        // Another agent: the YAML's terminus-2 settings do not apply to it.
        spec.harbor.agent = "openhands".into();
        let v = merged_job_config(&spec).unwrap();
        assert_eq!(v["agents"], serde_json::json!([{"name": "openhands", "model_name": "hosted_vllm/Qwen3-8B"}]));
        spec.harbor.config = dir.path().join("missing.yaml");
        assert!(merged_job_config(&spec).unwrap_err().to_string().contains("missing.yaml"));
    }

    #[test]
    fn a_resume_without_model_info_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let job = |kwargs: serde_json::Value| {
            let v = serde_json::json!({"agents": [{"name": "terminus-2", "model_name": "hosted_vllm/Q", "kwargs": kwargs}]});
            std::fs::write(dir.path().join("config.json"), v.to_string()).unwrap();
        };
        job(serde_json::json!({"api_base": "http://h/v1"}));
        let err = check_resume_configs(dir.path()).unwrap_err().to_string();
        assert!(err.contains("model_info") && err.contains("config.json"), "{err}");
        job(serde_json::json!({"api_base": "http://h/v1", "model_info": {"max_input_tokens": 1}}));
        assert_eq!(check_resume_configs(dir.path()).unwrap(), 1);
    }

    #[test]
    fn only_an_unfinished_job_under_the_same_settings_is_resumable() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = spec();
        spec.run_dir = dir.path().to_path_buf();
        let job = serde_json::json!({"agents": [{"name": "terminus-2"}], "n_attempts": 3, "timeout_multiplier": 2.0});
        std::fs::write(dir.path().join("config.json"), job.to_string()).unwrap();
        std::fs::write(dir.path().join("result.json"), r#"{"finished_at": null}"#).unwrap();
        check_resumable(&spec).unwrap();
        spec.harbor.timeout_multiplier = 4.0;
        let err = check_resumable(&spec).unwrap_err().to_string();
        assert!(err.contains("timeout_multiplier 2.0, the spec says 4.0") && err.contains("never applied"), "{err}");
        spec.harbor.timeout_multiplier = 2.0;
        spec.harbor.agent = "openhands".into();
        assert!(check_resumable(&spec).unwrap_err().to_string().contains("ran with agent terminus-2"));
        spec.harbor.agent = "terminus-2".into();
        std::fs::write(dir.path().join("result.json"), r#"{"finished_at": "2026-01-01T00:00:00"}"#).unwrap();
        let err = check_resumable(&spec).unwrap_err().to_string();
        assert!(err.contains("finished (2026-01-01T00:00:00)") && err.contains("run no trial"), "{err}");
        spec.harbor.start = launch_spec::spec::HarborStart::Fresh;
        assert!(check_resumable(&spec).unwrap_err().to_string().contains("never overwritten"));
    }

    /// Issue 35, the real Harbors' behaviour (tests/tests/real_harbor.rs holds it): an older Harbor
    /// never resumes a dir a newer one touched; a newer one resumes an older one's dir only when the
    /// job pinned its retry exclusions.
    #[test]
    fn a_resume_across_harbor_releases_is_refused_where_the_real_harbors_differ() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = spec();
        spec.run_dir = dir.path().to_path_buf();
        let declare = |spec: &mut LaunchSpec, harbor: &str| {
            spec.declared = Some(launch_spec::versions::Declared {
                engine_environment: "otagent".into(),
                vllm: launch_spec::versions::VERIFIED_VLLM,
                harbor_environment: "otagent".into(),
                harbor: harbor.into(),
            });
        };
        let write = |name: &str, v: serde_json::Value| std::fs::write(dir.path().join(name), v.to_string()).unwrap();
        let unpinned = serde_json::json!({"agents": [{"name": "terminus-2"}], "n_attempts": spec.harbor.n_attempts, "timeout_multiplier": spec.harbor.timeout_multiplier});
        write("config.json", unpinned.clone());
        write("result.json", serde_json::json!({"finished_at": null}));
        write("lock.json", serde_json::json!({"schema_version": 3, "harbor": {"version": "0.26.0"}}));
        declare(&mut spec, "0.25.0");
        let err = check_resumable(&spec).unwrap_err().to_string();
        assert!(
            err.contains("written by Harbor 0.26.0, newer than the Harbor 0.25.0 this job runs")
                && err.contains("`environments.otagent.harbor`")
                && err.ends_with("(`submitter launch --force`)"),
            "{err}"
        );
        declare(&mut spec, "0.26.0");
        check_resumable(&spec).unwrap();
        declare(&mut spec, "extra-body-fork");
        check_resumable(&spec).unwrap();

        write("lock.json", serde_json::json!({"schema_version": 3, "harbor": {"version": "0.25.0"}}));
        declare(&mut spec, "0.26.0");
        let err = check_resumable(&spec).unwrap_err().to_string();
        assert!(err.contains("written by Harbor 0.25.0 with its retry defaults, which Harbor 0.26.0 changed"), "{err}");
        let mut pinned = unpinned;
        pinned["retry"] = serde_json::json!({"max_retries": 2, "exclude_exceptions": ["AgentTimeoutError"]});
        write("config.json", pinned);
        check_resumable(&spec).unwrap();
        declare(&mut spec, "0.25.0");
        check_resumable(&spec).unwrap();
        // A trial 0.26 wrote (its `reward_valid`) marks the dir, whatever the job lock names.
        std::fs::create_dir_all(dir.path().join("t__1")).unwrap();
        write("t__1/config.json", serde_json::json!({}));
        write("t__1/result.json", serde_json::json!({"task_name": "t", "finished_at": "x", "reward_valid": true}));
        let err = check_resumable(&spec).unwrap_err().to_string();
        assert!(err.contains("written by Harbor 0.26.0, newer than the Harbor 0.25.0"), "{err}");
    }

    #[test]
    fn print_config_verdicts() {
        let spec = spec();
        let printed = |kwargs: serde_json::Value| {
            serde_json::json!({"job_name": "x", "agents": [{"name": "terminus-2", "model_name": "hosted_vllm/Qwen3-8B", "kwargs": kwargs}]})
                .to_string()
        };
        let ok = printed(serde_json::json!({"api_base": "http://h/v1", "parser_name": "xml"}));
        assert_eq!(judge_print_config(&spec, Some(0), &ok, ""), ConfigCheck::Passed { agents: 1 });
        let bad = printed(serde_json::json!({"api_base": "http://h/v1", "extra_body": {}}));
        let ConfigCheck::Rejected(why) = judge_print_config(&spec, Some(0), &bad, "") else { panic!() };
        assert!(why.contains("Unknown option 'extra_body'"), "{why}");
        let no_base = printed(serde_json::json!({}));
        assert!(
            matches!(judge_print_config(&spec, Some(0), &no_base, ""), ConfigCheck::Rejected(w) if w.contains("api_base"))
        );
        let other_model = ok.replace("hosted_vllm/Qwen3-8B", "openai/gpt");
        assert!(
            matches!(judge_print_config(&spec, Some(0), &other_model, ""), ConfigCheck::Rejected(w) if w.contains("model"))
        );
        let ConfigCheck::Rejected(why) =
            judge_print_config(&spec, Some(2), "", "Usage: harbor jobs start\nError: No such option: --swap\n")
        else {
            panic!()
        };
        assert!(why.contains("exited Some(2)") && why.contains("No such option: --swap"), "{why}");
        assert!(matches!(judge_print_config(&spec, Some(0), "not json", ""), ConfigCheck::Rejected(_)));
        let chatty = format!("Loading config…\n{ok}\nDone.\n");
        assert_eq!(judge_print_config(&spec, Some(0), &chatty, ""), ConfigCheck::Passed { agents: 1 });
    }

    /// The fork has no `--print-config`: its merged job config is judged by the repo's schema of
    /// it, so a stale metric ends the run while vLLM loads instead of after (issue 31).
    #[tokio::test]
    async fn the_forks_config_is_checked_by_its_schema_without_print_config() {
        let mut spec = spec();
        spec.harbor.dialect = launch_spec::versions::HarborDialect::ExtraBodyFork;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("harbor-job-config.json");
        let argv =
            |f: &Path| vec!["harbor".into(), "jobs".into(), "start".into(), "--config".into(), f.display().to_string()];
        std::fs::write(&file, r#"{"agents": [{"name": "terminus-2"}], "metrics": [{"type": "mean-drop-ei"}]}"#)
            .unwrap();
        let check = check_with_print_config(&spec, &argv(&file), &BTreeMap::new()).await;
        assert!(
            matches!(&check, ConfigCheck::Rejected(w) if w.contains("metrics[0].type `mean-drop-ei`") && w.contains("extra-body-fork")),
            "{check:?}"
        );
        std::fs::write(&file, r#"{"agents": [{"name": "terminus-2"}], "metrics": [{"type": "mean"}]}"#).unwrap();
        assert_eq!(
            check_with_print_config(&spec, &argv(&file), &BTreeMap::new()).await,
            ConfigCheck::Passed { agents: 1 }
        );
    }

    /// A Harbor whose `--print-config` never ends, and one that floods: the check answers within its
    /// limit, skipped with the reason (the run then goes on and Harbor's own start decides).
    #[tokio::test]
    async fn print_config_that_hangs_or_floods_is_skipped_within_bounds() {
        use std::time::Duration;
        let spec = spec();
        assert!(spec.harbor.dialect.has_print_config());
        let sh = |body: &str| vec!["sh".to_string(), "-c".to_string(), body.to_string(), "harbor".to_string()];
        let started = std::time::Instant::now();
        let hung =
            check_with_print_config_within(&spec, &sh("sleep 60"), &BTreeMap::new(), Duration::from_secs(1)).await;
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
        assert!(matches!(&hung, ConfigCheck::Skipped(w) if w.contains("did not finish within 1s")), "{hung:?}");
        let flood = check_with_print_config_within(
            &spec,
            &sh("head -c 6000000 /dev/zero"),
            &BTreeMap::new(),
            Duration::from_secs(30),
        )
        .await;
        assert!(matches!(&flood, ConfigCheck::Skipped(w) if w.contains("printed more than")), "{flood:?}");
    }

    #[test]
    fn shipped_yaml_holds_only_options_terminus2_025_accepts() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../presets/harbor/dcagent_eval_config_no_override.yaml");
        let v: serde_json::Value = launch_spec::yaml::from_yaml_file(&path).unwrap();
        let known = launch_spec::versions::TERMINUS2_025_OPTIONS;
        for agent in v["agents"].as_array().unwrap() {
            for key in agent["kwargs"].as_object().unwrap().keys() {
                assert!(known.contains(&key.as_str()), "{key} is unknown to terminus-2 0.25");
            }
            // Harbor's AgentConfig ignores unknown fields silently: only its own fields here.
            for key in agent.as_object().unwrap().keys() {
                assert!(["name", "max_timeout_sec", "kwargs"].contains(&key.as_str()), "agent field {key}");
            }
        }
        assert!(v.get("orchestrator").is_none(), "deprecated in 0.25: top-level n_concurrent_trials/quiet/retry");
    }

    #[test]
    fn resume_argv_exact() {
        let a = resume_argv(&spec(), "harbor");
        let mut want = s(&["harbor", "jobs", "resume", "-p", "/jobs/tb2_qwen3-8b"]);
        for t in launch_spec::spec::INFRA_ERROR_TYPES {
            want.push("--filter-error-type".into());
            want.push(t.to_string());
        }
        assert_eq!(a, want);
        assert_eq!(a.len(), 5 + 2 * 13);
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
        // Harbor 0.25's lock shapes: JobLock.trials[].agent and a trial's TrialLock.agent.
        let agent = serde_json::json!({"name": "terminus-2", "model_name": "hosted_vllm/Q",
            "kwargs": {"api_base": "http://127.0.0.1:31000/v1", "parser_name": "xml"}});
        let job_lock = serde_json::json!({"schema_version": 3, "created_at": "2026-01-01T00:00:00Z",
            "harbor": {"version": "0.25.0"}, "n_concurrent_trials": 4, "retry": {"max_retries": 0},
            "trials": [{"schema_version": 2, "task": {"name": "a"}, "agent": agent.clone(),
                        "note": {"api_base": "untouched"}},
                       {"schema_version": 2, "task": {"name": "b"}, "agent": agent.clone()}]});
        std::fs::write(run.join("lock.json"), serde_json::to_string_pretty(&job_lock).unwrap()).unwrap();
        let trial_lock = serde_json::json!({"schema_version": 2, "task": {"name": "a"}, "agent": agent});
        std::fs::write(run.join("task-a__1").join("lock.json"), serde_json::to_string(&trial_lock).unwrap()).unwrap();
        let changed = rewrite_api_base(run, "http://127.0.0.1:40000/v1").unwrap();
        assert_eq!(changed.len(), 5);
        let counts: Vec<usize> = changed.iter().map(|(_, n)| *n).collect();
        assert_eq!(counts, [1, 1, 1, 2, 1], "{changed:?}");
        let lock: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("lock.json")).unwrap()).unwrap();
        assert_eq!(lock["trials"][1]["agent"]["kwargs"]["api_base"], "http://127.0.0.1:40000/v1");
        assert_eq!(lock["trials"][0]["note"]["api_base"], "untouched", "only the fields Harbor compares");
        assert_eq!(lock["created_at"], "2026-01-01T00:00:00Z");
        let keys: Vec<&String> = lock.as_object().unwrap().keys().collect();
        assert_eq!(keys[0], "schema_version", "key order kept");
        let tl: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("task-a__1/lock.json")).unwrap()).unwrap();
        assert_eq!(tl["agent"], lock["trials"][0]["agent"], "the trial lock equals its job-lock entry");
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
