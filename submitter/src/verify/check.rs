//! `submitter check`: the launch checks of docs/design.md §8 from the files of one run directory.
//!
//! Works on payload's run dirs and on the ones the old scripts left: Harbor's job layout
//! (`config.json`, `result.json`, `<task>__<id>/` trial dirs), a `vllm.log` with uvicorn access
//! lines, a tunnel log (`tunnel.log` or `pinggy_*.log`), and — when payload ran — `launch.json`,
//! `status.json` and `events.jsonl`. Nothing here talks to Slurm or the ledger.
//!
//! Checks, each producing [`Finding`]s: `tunnel` (authenticated, not locked, traffic), `api_base`
//! (agent URL and `model_info` in the job and trial configs), `engine` (completions per minute,
//! 200/400/5xx shares, zero 200s, engine death), `trials` (active vs done, instant failures, time
//! since the last result, zombie), `outcome` (payload's record) and `audit` (completion audit).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use launch_spec::fsread::{self, Links};
use launch_spec::records::{ENGINE_LOG, EVENTS_FILE, RunStatus, SPEC_FILE, STATUS_FILE, TUNNEL_LOG};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::logscan::{self, EngineLog};
use super::results::{self, Audit};
use super::{
    Finding, Level, VerifySettings, human_duration, is_installed_agent, is_private_url, mtime, parse_time, percent,
};

/// Why a path cannot be checked (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("{0}: not a directory")]
    NotADirectory(PathBuf),
    #[error(
        "{0}: not a run directory (none of config.json, result.json, status.json, launch.json, vllm.log, trial directories)"
    )]
    NotARunDir(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// Whether the job that writes this run dir still runs, as far as the files tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// payload's heartbeat is fresh (or, without payload, Harbor's result.json was just updated).
    Running,
    /// payload recorded an outcome, or Harbor recorded `finished_at`.
    Ended,
    /// Neither: payload stopped writing without an outcome, or an old run dir without records.
    Unknown,
}

/// The numbers behind the findings, for scripts (`check --json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Facts {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_log: Option<EngineLog>,
    pub completions_per_min: Option<f64>,
    pub trials: TrialScan,
    pub expected_trials: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<Audit>,
}

/// The result of checking one run dir.
#[derive(Debug, Clone, Serialize)]
pub struct RunCheck {
    pub run_dir: PathBuf,
    pub run_tag: Option<String>,
    /// The worst finding's level.
    pub verdict: Level,
    pub state: RunState,
    pub findings: Vec<Finding>,
    pub facts: Facts,
}

/// What the trial directories hold.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TrialScan {
    /// Trial directories (`<task>__<id>/` with any of Harbor's trial files).
    pub dirs: u64,
    /// With `result.json`.
    pub done: u64,
    /// With `agent/` and no `result.json`.
    pub active: u64,
    /// With neither `config.json` nor `result.json`: the trial was never constructed.
    pub unconstructed: u64,
    pub errored: u64,
    /// A numeric reward.
    pub valid: u64,
    pub errors_by_type: BTreeMap<String, u64>,
    /// No output tokens and finished within `instant_fail_s` of its start.
    pub instant_failures: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instant_example: Option<String>,
    /// Exception types of the instant failures.
    pub instant_types: BTreeMap<String, u64>,
    /// The newest `result.json` (modification time) and its trial.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_result_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_result_trial: Option<String>,
    /// `api_base` of the trial configs: value → (count, example trial).
    pub api_bases: BTreeMap<String, (u64, String)>,
    /// trial.log lines saying `model_info` is missing (terminus-2's warning), with one example.
    pub model_info_warnings: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_info_example: Option<String>,
}

/// The agent as the job's `config.json` (or `launch.json`) names it.
#[derive(Debug, Clone, Default)]
struct Agent {
    name: Option<String>,
    model_name: Option<String>,
    api_base: Option<String>,
    has_model_info: bool,
    from: &'static str,
}

#[derive(Debug, Clone, Default)]
struct Launch {
    run_tag: Option<String>,
    tunnel_kind: Option<String>,
    public_url: Option<String>,
    dataset: Option<PathBuf>,
    n_attempts: Option<u64>,
    agent: Option<String>,
    /// The Pinggy pair payload took (last `tunnel_pair` event): with a pair bank it may differ
    /// from the spec's first pair.
    held_url: Option<String>,
}

/// Checks one run dir at `now`.
pub fn check_run_dir(dir: &Path, settings: &VerifySettings, now: DateTime<Utc>) -> Result<RunCheck, CheckError> {
    let meta = std::fs::metadata(dir).map_err(|source| CheckError::Io { path: dir.to_path_buf(), source })?;
    if !meta.is_dir() {
        return Err(CheckError::NotADirectory(dir.to_path_buf()));
    }
    let engine_log_path = find_engine_log(dir);
    // The two expensive parts — the engine log and the trial dirs — run side by side.
    let (log, trials) = std::thread::scope(|scope| {
        let trials = scope.spawn(|| scan_trials(dir, settings.instant_fail_s));
        let log = engine_log_path.as_deref().map(logscan::scan_file);
        (log, trials.join().expect("trial scan panicked"))
    });
    let trials = trials.map_err(|source| CheckError::Io { path: dir.to_path_buf(), source })?;
    let log = match log {
        Some(Ok(log)) => log,
        Some(Err(source)) => return Err(CheckError::Io { path: engine_log_path.unwrap_or_default(), source }),
        None => None,
    };
    let status: Option<RunStatus> = read_json(&dir.join(STATUS_FILE));
    let launch = read_launch(dir);
    let job_config: Option<Value> = read_json(&dir.join("config.json"));
    let harbor_result: Option<Value> = read_json(&dir.join("result.json"));
    let is_run_dir = status.is_some()
        || job_config.is_some()
        || harbor_result.is_some()
        || log.is_some()
        || trials.dirs > 0
        || dir.join(SPEC_FILE).is_file()
        || find_tunnel_log(dir).is_some();
    if !is_run_dir {
        return Err(CheckError::NotARunDir(dir.to_path_buf()));
    }

    let agent = agent_of(job_config.as_ref(), &launch);
    let state = run_state(status.as_ref(), harbor_result.as_ref(), dir, settings, now);
    let expected = expected_trials(harbor_result.as_ref(), &launch, job_config.as_ref());
    let running_since = running_since(dir, status.as_ref());

    let mut findings = Vec::new();
    let tunnel = tunnel_findings(dir, &agent, &launch, TUNNEL_TAIL_CHECK, &mut findings);
    api_base_findings(&agent, &launch, &trials, tunnel.as_ref(), &mut findings);
    let per_min = engine_findings(
        log.as_ref(),
        status.as_ref(),
        engine_log_path.as_deref(),
        state,
        running_since,
        &trials,
        settings,
        now,
        &mut findings,
    );
    trial_findings(&trials, expected, state, status.as_ref(), running_since, settings, now, &mut findings);
    outcome_findings(status.as_ref(), harbor_result.as_ref(), state, settings, now, &mut findings);
    let audit = harbor_result.as_ref().map(|r| results::audit_of(&results::summary_from_result(r, expected), settings));
    if let Some(audit) = &audit
        && state == RunState::Ended
    {
        findings.push(audit_finding(audit));
    }
    let verdict = findings.iter().map(|f| f.level).max().unwrap_or(Level::Ok);
    Ok(RunCheck {
        run_dir: dir.to_path_buf(),
        run_tag: launch.run_tag.clone().or_else(|| status.as_ref().map(|s| s.run_tag.clone())).or_else(|| {
            job_config.as_ref().and_then(|c| c.get("job_name")).and_then(Value::as_str).map(str::to_string)
        }),
        verdict,
        state,
        findings,
        facts: Facts { engine_log: log, completions_per_min: per_min, trials, expected_trials: expected, audit },
    })
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    super::read_record(path)
}

fn read_launch(dir: &Path) -> Launch {
    let held_url = super::tail_lines(&dir.join(EVENTS_FILE)).and_then(|text| {
        text.lines()
            .filter(|l| l.contains("\"tunnel_pair\""))
            .filter_map(|l| serde_json::from_str::<launch_spec::records::Event>(l).ok())
            .filter(|e| e.event == "tunnel_pair")
            .filter_map(|e| e.fields.get("public_url").and_then(Value::as_str).map(str::to_string))
            .next_back()
    });
    let Some(spec) = read_json::<Value>(&dir.join(SPEC_FILE)) else { return Launch { held_url, ..Launch::default() } };
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    Launch {
        held_url,
        run_tag: s(spec.get("run_tag")),
        tunnel_kind: s(spec.pointer("/tunnel/kind")),
        public_url: s(spec.pointer("/tunnel/public_url")),
        dataset: s(spec.pointer("/harbor/dataset")).map(PathBuf::from),
        n_attempts: spec.pointer("/harbor/n_attempts").and_then(Value::as_u64),
        agent: s(spec.pointer("/harbor/agent")),
    }
}

/// `vllm.log`, else another `vllm*.log` (old scripts: `vllm_<jobid>.log`), never `*.prev`.
fn find_engine_log(dir: &Path) -> Option<PathBuf> {
    let main = dir.join(ENGINE_LOG);
    if main.is_file() {
        return Some(main);
    }
    newest_matching(dir, |name| name.starts_with("vllm") && name.ends_with(".log"))
}

/// `tunnel.log`, else the newest `pinggy*.log` (the old scripts' `pinggy_<jobid>.log`).
pub fn find_tunnel_log(dir: &Path) -> Option<PathBuf> {
    let main = dir.join(TUNNEL_LOG);
    if main.is_file() {
        return Some(main);
    }
    newest_matching(dir, |name| name.starts_with("pinggy") && name.ends_with(".log"))
}

fn newest_matching(dir: &Path, wanted: impl Fn(&str) -> bool) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()) && wanted(&e.file_name().to_string_lossy()))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
}

fn agent_of(config: Option<&Value>, launch: &Launch) -> Agent {
    if let Some(agent) = config.and_then(|c| c.pointer("/agents/0")) {
        let kwargs = agent.get("kwargs");
        return Agent {
            name: agent.get("name").and_then(Value::as_str).map(str::to_string),
            model_name: agent.get("model_name").and_then(Value::as_str).map(str::to_string),
            api_base: kwargs.and_then(|k| k.get("api_base")).and_then(Value::as_str).map(str::to_string),
            has_model_info: kwargs
                .and_then(|k| k.get("model_info"))
                .is_some_and(|m| m.as_object().is_some_and(|o| !o.is_empty())),
            from: "config.json",
        };
    }
    Agent { name: launch.agent.clone(), from: "launch.json", ..Agent::default() }
}

fn run_state(
    status: Option<&RunStatus>,
    result: Option<&Value>,
    dir: &Path,
    settings: &VerifySettings,
    now: DateTime<Utc>,
) -> RunState {
    if let Some(status) = status {
        if status.outcome.is_some() {
            return RunState::Ended;
        }
        let fresh = status_age_s(status, now).is_some_and(|age| age <= settings.heartbeat_timeout_s as i64);
        return if fresh { RunState::Running } else { RunState::Unknown };
    }
    if result.and_then(|r| r.get("finished_at")).is_some_and(|f| !f.is_null()) {
        return RunState::Ended;
    }
    let recent =
        mtime(&dir.join("result.json")).is_some_and(|t| (now - t).num_seconds() <= settings.heartbeat_timeout_s as i64);
    if recent { RunState::Running } else { RunState::Unknown }
}

/// Seconds since payload last wrote status.json (its `updated_at` or heartbeat, whichever is newer).
pub fn status_age_s(status: &RunStatus, now: DateTime<Utc>) -> Option<i64> {
    let updated = parse_time(&status.updated_at);
    let beat = status.heartbeat.as_ref().and_then(|h| parse_time(&h.at));
    let last = updated.into_iter().chain(beat).max()?;
    Some((now - last).num_seconds())
}

/// When Harbor started: the last `phase: running` event of events.jsonl, else status.json's
/// `started_at` when its phase is running.
pub fn running_since(dir: &Path, status: Option<&RunStatus>) -> Option<DateTime<Utc>> {
    let from_events = super::tail_lines(&dir.join(EVENTS_FILE)).and_then(|text| {
        text.lines()
            .filter_map(|l| serde_json::from_str::<launch_spec::records::Event>(l).ok())
            .filter(|e| e.event == "phase" && e.fields.get("phase").and_then(Value::as_str) == Some("running"))
            .filter_map(|e| parse_time(&e.at))
            .next_back()
    });
    from_events.or_else(|| {
        status
            .filter(|s| matches!(s.phase, launch_spec::records::Phase::Running))
            .and_then(|s| parse_time(&s.started_at))
    })
}

/// n_tasks × n_attempts for a run dir (see [`expected_trials`]).
pub fn expected_trials_in(dir: &Path, result: Option<&Value>) -> Option<u64> {
    let config: Option<Value> = read_json(&dir.join("config.json"));
    expected_trials(result, &read_launch(dir), config.as_ref())
}

/// The tunnel and `api_base` problems of a run dir (level `fail` only), without scanning the
/// trials: what `status` folds into `misconfigured`.
pub fn config_problems(dir: &Path) -> Vec<Finding> {
    let launch = read_launch(dir);
    let config: Option<Value> = read_json(&dir.join("config.json"));
    let agent = agent_of(config.as_ref(), &launch);
    let mut findings = Vec::new();
    let tunnel = tunnel_findings(dir, &agent, &launch, TUNNEL_TAIL_STATUS, &mut findings);
    let trials = TrialScan::default();
    if config.is_some() {
        api_base_findings(&agent, &launch, &trials, tunnel.as_ref(), &mut findings);
    }
    findings.retain(|f| f.level == Level::Fail);
    findings
}

/// n_tasks × n_attempts: Harbor's `n_total_trials`, else the dataset's task dirs × n_attempts.
fn expected_trials(result: Option<&Value>, launch: &Launch, config: Option<&Value>) -> Option<u64> {
    if let Some(n) = result.and_then(|r| r.get("n_total_trials")).and_then(Value::as_u64).filter(|n| *n > 0) {
        return Some(n);
    }
    let dataset = launch
        .dataset
        .clone()
        .or_else(|| config.and_then(|c| c.pointer("/datasets/0/path")).and_then(Value::as_str).map(PathBuf::from))?;
    let attempts =
        launch.n_attempts.or_else(|| config.and_then(|c| c.get("n_attempts")).and_then(Value::as_u64)).unwrap_or(1);
    let tasks = count_tasks(&dataset)?;
    Some(tasks * attempts)
}

/// Task directories of a dataset: subdirectories holding `instruction.md` (or `task.toml`).
pub fn count_tasks(dataset: &Path) -> Option<u64> {
    let entries = std::fs::read_dir(dataset).ok()?;
    let n = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| e.path().join("instruction.md").is_file() || e.path().join("task.toml").is_file())
        .count() as u64;
    (n > 0).then_some(n)
}

// ---------------------------------------------------------------------------------------------
// Trials

#[derive(Deserialize)]
struct TrialResult {
    #[serde(default)]
    exception_info: Option<ExceptionInfo>,
    #[serde(default)]
    verifier_result: Option<VerifierResult>,
    #[serde(default)]
    agent_result: Option<AgentResult>,
    #[serde(default)]
    started_at: Option<String>,
    #[serde(default)]
    finished_at: Option<String>,
}

#[derive(Deserialize)]
struct ExceptionInfo {
    #[serde(default)]
    exception_type: Option<String>,
}

#[derive(Deserialize)]
struct VerifierResult {
    #[serde(default)]
    rewards: Option<BTreeMap<String, Value>>,
}

#[derive(Deserialize)]
struct AgentResult {
    #[serde(default)]
    n_output_tokens: Option<f64>,
}

/// Scans the trial directories of a run dir.
pub fn scan_trials(dir: &Path, instant_fail_s: f64) -> std::io::Result<TrialScan> {
    let mut scan = TrialScan::default();
    let api_base_key = memchr::memmem::Finder::new(b"\"api_base\"");
    let model_info_warning = memchr::memmem::Finder::new(b"Model info is required");
    let mut buf = Vec::with_capacity(16 << 10);
    for entry in std::fs::read_dir(dir)? {
        let Ok(entry) = entry else { continue };
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let trial = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let result_path = trial.join("result.json");
        // Never through a symlink, never a FIFO or device (a result.json linked to /dev/zero).
        let result_file = fsread::open_regular(&result_path, Links::Refuse).ok();
        let config = read_into(&trial.join("config.json"), &mut buf)
            .then(|| api_base_key.find(&buf).map(|at| json_string_after(&buf[at + 10..])));
        let has_agent = result_file.is_none() && trial.join("agent").is_dir();
        if result_file.is_none()
            && config.is_none()
            && !has_agent
            && !trial.join("trial.log").is_file()
            && !trial.join("lock.json").is_file()
        {
            continue; // not a trial directory
        }
        scan.dirs += 1;
        match config {
            Some(Some(Some(api_base))) => {
                let slot = scan.api_bases.entry(api_base).or_insert((0, name.clone()));
                slot.0 += 1;
            }
            Some(_) => {}
            None if result_file.is_none() => {
                scan.unconstructed += 1;
                if read_into(&trial.join("trial.log"), &mut buf)
                    && let Some(at) = model_info_warning.find(&buf)
                {
                    scan.model_info_warnings += 1;
                    if scan.model_info_example.is_none() {
                        let end = memchr::memchr(b'\n', &buf[at..]).map_or(buf.len(), |e| at + e);
                        let start = memchr::memrchr(b'\n', &buf[..at]).map_or(0, |s| s + 1);
                        scan.model_info_example =
                            Some(format!("{name}/trial.log: {}", String::from_utf8_lossy(&buf[start..end]).trim()));
                    }
                }
            }
            None => {}
        }
        let Some(mut file) = result_file else {
            if has_agent {
                scan.active += 1;
            }
            continue;
        };
        scan.done += 1;
        let modified = file.metadata().ok().and_then(|m| m.modified().ok()).map(DateTime::<Utc>::from);
        if let Some(t) = modified
            && scan.last_result_at.is_none_or(|last| t > last)
        {
            scan.last_result_at = Some(t);
            scan.last_result_trial = Some(name.clone());
        }
        buf.clear();
        // An oversized result is not read at all (fstat on the open file), and never past the cap.
        if file.metadata().is_ok_and(|m| m.len() > fsread::RECORD_CAP)
            || std::io::Read::read_to_end(&mut std::io::Read::take(&mut file, fsread::RECORD_CAP + 1), &mut buf)
                .is_err()
            || buf.len() as u64 > fsread::RECORD_CAP
        {
            continue;
        }
        let Ok(result) = serde_json::from_slice::<TrialResult>(&buf) else { continue };
        if let Some(info) = &result.exception_info {
            scan.errored += 1;
            *scan.errors_by_type.entry(info.exception_type.clone().unwrap_or_else(|| "Unknown".into())).or_default() +=
                1;
        }
        if result
            .verifier_result
            .as_ref()
            .and_then(|v| v.rewards.as_ref())
            .is_some_and(|r| r.values().any(Value::is_number))
        {
            scan.valid += 1;
        }
        let no_output = result.agent_result.as_ref().and_then(|a| a.n_output_tokens).is_none_or(|n| n <= 0.0);
        let took = match (
            result.started_at.as_deref().and_then(parse_time),
            result.finished_at.as_deref().and_then(parse_time),
        ) {
            (Some(s), Some(f)) => Some((f - s).num_milliseconds() as f64 / 1000.0),
            _ => None,
        };
        if no_output && took.is_some_and(|t| t <= instant_fail_s) {
            scan.instant_failures += 1;
            let kind =
                result.exception_info.as_ref().and_then(|e| e.exception_type.clone()).unwrap_or_else(|| "none".into());
            *scan.instant_types.entry(kind).or_default() += 1;
            if scan.instant_example.is_none() {
                let kind = result
                    .exception_info
                    .as_ref()
                    .and_then(|e| e.exception_type.clone())
                    .unwrap_or_else(|| "no exception".into());
                scan.instant_example = Some(format!(
                    "{name}/result.json: n_output_tokens null, finished {:.1}s after start ({kind})",
                    took.unwrap_or(0.0)
                ));
            }
        }
    }
    Ok(scan)
}

/// Reads a trial file (`config.json`, `trial.log`) into `buf`: a regular file, at most its first
/// [`fsread::RECORD_CAP`] bytes (what is looked for sits at the start).
fn read_into(path: &Path, buf: &mut Vec<u8>) -> bool {
    buf.clear();
    match fsread::open_regular(path, Links::Refuse) {
        Ok(f) => std::io::Read::read_to_end(&mut std::io::Read::take(f, fsread::RECORD_CAP), buf).is_ok(),
        Err(_) => false,
    }
}

/// The JSON string value after a key: `: "…"` (`None` for `null` or anything else).
fn json_string_after(rest: &[u8]) -> Option<String> {
    let rest = rest.trim_ascii_start().strip_prefix(b":")?.trim_ascii_start();
    if !rest.starts_with(b"\"") {
        return None;
    }
    let mut i = 1;
    while i < rest.len() {
        match rest[i] {
            b'\\' => i += 2,
            b'"' => return serde_json::from_slice::<String>(&rest[..=i]).ok(),
            _ => i += 1,
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Tunnel

/// What a tunnel log says.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TunnelLog {
    pub path: PathBuf,
    pub authenticated: Option<String>,
    pub not_authenticated: Option<String>,
    /// The lock message that is still in force at the end of the log.
    pub locked: Option<String>,
    /// A lock message followed by a working session (payload moved to the next pair, or forced).
    pub recovered_lock: Option<String>,
    pub allocated: Option<String>,
    /// payload's end-to-end check passed (`[…] payload: verified: …`).
    pub verified: Option<String>,
    pub public_url: Option<String>,
    pub errors: Vec<String>,
    /// (first, last, samples) of each counter seen (`RB:`, `SB:`, `TC:`).
    pub counters: BTreeMap<String, (f64, f64, u64)>,
}

/// Parses a Pinggy (or plain `ssh -R`) log.
pub fn parse_tunnel_log(path: &Path, text: &str) -> TunnelLog {
    let mut log = TunnelLog { path: path.to_path_buf(), ..TunnelLog::default() };
    let url = regex::Regex::new(r"https://[A-Za-z0-9.-]+(?::[0-9]+)?").expect("static regex");
    let counter = regex::Regex::new(r"\b(RB|SB|TC):\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)i?B?\b").expect("static regex");
    for raw in text.lines() {
        // The TUI repaints with escape sequences; drop them.
        let line: String = strip_ansi(raw);
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let lower = line.to_ascii_lowercase();
        // payload's own notes (`[time] payload: …`): only "verified" and "giving up" count.
        if let Some((_, note)) = line.split_once("] payload: ") {
            if note.starts_with("verified") {
                log.verified = Some(line.to_string());
                if let Some(lock) = log.locked.take() {
                    log.recovered_lock = Some(lock);
                }
            } else if note.starts_with("giving up") && log.errors.len() < 5 {
                log.errors.push(line.to_string());
            }
            continue;
        }
        if lower.contains("already active")
            || (lower.contains("same token") && (lower.contains("already") || lower.contains("active")))
        {
            log.locked = Some(line.to_string());
            continue;
        }
        let mut up = false;
        if lower.contains("not authenticated") {
            log.not_authenticated = Some(line.to_string());
        } else if lower.contains("you are authenticated") || lower.contains("authenticated as") {
            log.authenticated = Some(line.to_string());
            log.not_authenticated = None;
            up = true;
        }
        if lower.contains("allocated port") {
            log.allocated = Some(line.to_string());
            up = true;
        }
        // The last URL announced is the one in use; a Pinggy URL beats any other.
        if let Some(m) = url.find(line)
            && (m.as_str().contains(".pinggy.") || log.public_url.as_ref().is_none_or(|u| !u.contains(".pinggy.")))
        {
            log.public_url = Some(m.as_str().trim_end_matches(['.', ',', ')']).to_string());
            up = true;
        }
        if up && let Some(lock) = log.locked.take() {
            log.recovered_lock = Some(lock);
        }
        if (lower.contains("permission denied")
            || lower.contains("connection refused")
            || lower.contains("could not resolve")
            || lower.contains("connection closed")
            || lower.contains("remote port forwarding failed")
            || lower.contains("broken pipe"))
            && log.errors.len() < 5
        {
            log.errors.push(line.to_string());
        }
        for c in counter.captures_iter(line) {
            let value: f64 = c[2].parse().unwrap_or(0.0);
            let scale = match &c[3] {
                "K" => 1e3,
                "M" => 1e6,
                "G" => 1e9,
                "T" => 1e12,
                _ => 1.0,
            };
            let v = value * scale;
            let slot = log.counters.entry(c[1].to_string()).or_insert((v, v, 0));
            slot.1 = v;
            slot.2 += 1;
        }
    }
    log
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        if c == '\r' {
            out.push(' ');
            continue;
        }
        out.push(c);
    }
    out
}

/// How much of the tunnel log's end `check` reads, and `status` (every job, every refresh).
const TUNNEL_TAIL_CHECK: u64 = 4 << 20;
const TUNNEL_TAIL_STATUS: u64 = 256 << 10;

fn tunnel_findings(
    dir: &Path,
    agent: &Agent,
    launch: &Launch,
    tail: u64,
    findings: &mut Vec<Finding>,
) -> Option<TunnelLog> {
    let agent_name = agent.name.clone().unwrap_or_else(|| "terminus-2".into());
    let needed = launch.tunnel_kind.as_deref() == Some("pinggy") || is_installed_agent(&agent_name);
    let path = find_tunnel_log(dir);
    let Some(path) = path else {
        findings.push(if needed {
            Finding::new(
                "tunnel",
                "tunnel.missing",
                Level::Fail,
                format!("{agent_name} runs in the sandbox and needs a public tunnel, but there is no tunnel log"),
            )
            .evidence(format!("no {TUNNEL_LOG} or pinggy_*.log in {}", dir.display()))
            .action("configure a Pinggy pair for this cluster (network.pinggy) and resubmit")
        } else {
            Finding::new(
                "tunnel",
                "tunnel.not_needed",
                Level::Ok,
                format!("not needed: {agent_name} calls vLLM on the node"),
            )
        });
        return None;
    };
    let text = String::from_utf8_lossy(&tail_bytes(&path, tail)).into_owned();
    let log = parse_tunnel_log(&path, &text);
    let file = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if let Some(line) = &log.locked {
        findings.push(
            Finding::new("tunnel", "tunnel.locked", Level::Fail, "token locked: a tunnel with the same token is already active elsewhere")
                .evidence(format!("{file}: {line}"))
                .action("cancel this job and resubmit with the next free Pinggy pair (or end the stale session holding the token)"),
        );
        return Some(log);
    }
    let established =
        log.authenticated.is_some() || log.allocated.is_some() || log.public_url.is_some() || log.verified.is_some();
    if !established {
        let mut f = Finding::new(
            "tunnel",
            "tunnel.not_established",
            if needed { Level::Fail } else { Level::Warn },
            "the tunnel never came up (no `You are authenticated`, no URL, no allocated port)",
        );
        for e in &log.errors {
            f = f.evidence(format!("{file}: {e}"));
        }
        findings
            .push(f.action("read the tunnel log; check the token secret and that port 443 egress works from the node"));
        return Some(log);
    }
    let mut ok = Finding::new("tunnel", "tunnel.authenticated", Level::Ok, "tunnel up");
    if let Some(line) = log.authenticated.as_ref().or(log.allocated.as_ref()) {
        ok = ok.evidence(format!("{file}: {line}"));
    }
    if let Some(url) = &log.public_url {
        ok = ok.evidence(format!("public URL {url}"));
    }
    if let Some(line) = &log.verified {
        ok = ok.evidence(format!("{file}: {line}"));
    }
    if let Some(lock) = &log.recovered_lock {
        ok = ok.evidence(format!("an earlier session was locked and payload moved on: {lock}"));
    }
    if let Some(line) = &log.not_authenticated {
        ok.level = Level::Warn;
        ok.summary = "tunnel up, but not authenticated: a free tunnel expires after 60 minutes".into();
        ok = ok
            .evidence(format!("{file}: {line}"))
            .action("use a persistent token (pro.pinggy.io) for runs longer than an hour");
    }
    findings.push(ok);
    if !log.counters.is_empty() {
        let growing: Vec<String> = log
            .counters
            .iter()
            .filter(|(_, (first, last, _))| last > first)
            .map(|(k, (f, l, _))| format!("{k}: {f} → {l}"))
            .collect();
        let samples = log.counters.values().map(|c| c.2).max().unwrap_or(0);
        if !growing.is_empty() {
            findings.push(
                Finding::new("tunnel", "tunnel.traffic", Level::Ok, "traffic counters growing")
                    .evidence(growing.join(", ")),
            );
        } else if samples >= 2 && needed {
            let flat: Vec<String> =
                log.counters.iter().map(|(k, (_, l, n))| format!("{k}: {l} ({n} readings)")).collect();
            findings.push(
                Finding::new("tunnel", "tunnel.traffic", Level::Warn, "no traffic through the tunnel: counters flat")
                    .evidence(flat.join(", "))
                    .action("check that the agent's api_base is the tunnel URL and that the sandbox can reach it"),
            );
        }
    }
    Some(log)
}

/// The last `max` bytes of a file.
fn tail_bytes(path: &Path, max: u64) -> Vec<u8> {
    fsread::read_tail(path, max, Links::Refuse).map(|(bytes, _)| bytes).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// api_base and model_info

fn api_base_findings(
    agent: &Agent,
    launch: &Launch,
    trials: &TrialScan,
    tunnel: Option<&TunnelLog>,
    findings: &mut Vec<Finding>,
) {
    let agent_name = agent.name.clone().unwrap_or_else(|| "terminus-2".into());
    let installed = launch.tunnel_kind.as_deref() == Some("pinggy") || is_installed_agent(&agent_name);
    let hosted = agent.model_name.as_deref().is_some_and(|m| m.to_ascii_lowercase().starts_with("hosted_vllm/"));
    if agent.from != "config.json" {
        if trials.dirs == 0 {
            findings.push(Finding::new(
                "api_base",
                "api_base.unknown",
                Level::Ok,
                "Harbor has not written its job config.json yet",
            ));
            return;
        }
    } else if hosted && !agent.has_model_info {
        let mut f = Finding::new(
            "api_base",
            "api_base.model_info",
            Level::Fail,
            "model_info missing from the agent kwargs: every hosted_vllm trial dies before its first request",
        )
        .evidence(format!(
            "config.json: agents[0].model_name {} has no kwargs.model_info",
            agent.model_name.as_deref().unwrap_or("?")
        ));
        if let Some(line) = &trials.model_info_example {
            f = f.evidence(line.clone());
        }
        findings.push(f.action("pass --agent-kwarg model_info={max_input_tokens, max_output_tokens, input/output_cost_per_token} (payload does this), or upgrade Harbor"));
    }
    let public = launch
        .held_url
        .clone()
        .or_else(|| tunnel.and_then(|t| t.public_url.clone()))
        .or_else(|| launch.public_url.clone());
    let mut bad = false;
    let judge = |url: &str, place: String, count: u64| -> Option<Finding> {
        if installed && is_private_url(url) {
            return Some(
                Finding::new("api_base", "api_base.private", Level::Fail, format!("{agent_name} runs in the remote sandbox but api_base is a private address: the tunnel is not wired"))
                    .evidence(format!("{place}: \"api_base\": \"{url}\"{}", if count > 1 { format!(" ({count} trials)") } else { String::new() }))
                    .action("set api_base to the tunnel's public URL (https://<id>.a.pinggy.link/v1) and resume"),
            );
        }
        if installed
            && let Some(public) = &public
            && !url.starts_with(public.trim_end_matches('/'))
        {
            return Some(
                Finding::new("api_base", "api_base.not_tunnel", Level::Fail, "api_base is not the tunnel's public URL")
                    .evidence(format!("{place}: \"api_base\": \"{url}\"; tunnel URL {public}"))
                    .action("rewrite api_base in the job and every trial config.json to the tunnel URL, then resume"),
            );
        }
        None
    };
    if let Some(url) = &agent.api_base {
        if let Some(f) = judge(url, "config.json".into(), 1) {
            findings.push(f);
            bad = true;
        }
    } else if agent.from == "config.json" && hosted {
        findings.push(
            Finding::new(
                "api_base",
                "api_base.missing",
                Level::Fail,
                "no api_base in the agent kwargs: the agent cannot reach vLLM",
            )
            .evidence("config.json: agents[0].kwargs has no api_base")
            .action("pass --agent-kwarg api_base=<server>/v1 (payload does this)"),
        );
        bad = true;
    }
    for (url, (count, example)) in &trials.api_bases {
        if let Some(f) = judge(url, format!("{example}/config.json"), *count) {
            findings.push(f);
            bad = true;
        } else if let Some(job_url) = &agent.api_base
            && url != job_url
        {
            findings.push(
                Finding::new("api_base", "api_base.stale", Level::Fail, format!("{count} trial config(s) point at another server than the job config: a stale api_base from an earlier run"))
                    .evidence(format!("{example}/config.json: \"api_base\": \"{url}\"; config.json: \"{job_url}\""))
                    .action("rewrite api_base in every trial config.json (payload does this on resume), or Harbor refuses to resume / calls a dead server"),
            );
            bad = true;
        }
    }
    if !bad {
        let url = agent.api_base.clone().or_else(|| trials.api_bases.keys().next().cloned());
        let mut f = Finding::new(
            "api_base",
            "api_base.ok",
            Level::Ok,
            match &url {
                Some(u) if installed => format!("api_base {u} is the public tunnel URL"),
                Some(u) => format!("api_base {u} ({agent_name} calls vLLM on the node)"),
                None => "no api_base recorded yet".to_string(),
            },
        );
        if !trials.api_bases.is_empty() {
            let n: u64 = trials.api_bases.values().map(|v| v.0).sum();
            f = f.evidence(format!("{n} trial config(s) agree with the job config"));
        }
        findings.push(f);
    }
}

// ---------------------------------------------------------------------------------------------
// Engine

#[allow(clippy::too_many_arguments)]
fn engine_findings(
    log: Option<&EngineLog>,
    status: Option<&RunStatus>,
    log_path: Option<&Path>,
    state: RunState,
    running_since: Option<DateTime<Utc>>,
    trials: &TrialScan,
    settings: &VerifySettings,
    now: DateTime<Utc>,
    findings: &mut Vec<Finding>,
) -> Option<f64> {
    let file = log_path
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| ENGINE_LOG.into());
    let beat = status.and_then(|s| s.heartbeat.as_ref());
    // Counts: the access log when it has any, else payload's heartbeat (vLLM's /metrics).
    let (ok, c4xx, c5xx, source) = match (log, beat) {
        (Some(l), _) if l.completions() > 0 => (l.ok, l.c4xx, l.c5xx, format!("{file} access lines")),
        (_, Some(b)) => (b.completions_ok, b.completions_4xx, b.completions_5xx, "status.json heartbeat".to_string()),
        (Some(l), None) => (l.ok, l.c4xx, l.c5xx, format!("{file} access lines")),
        (None, None) => {
            findings.push(
                Finding::new(
                    "engine",
                    "engine.no_log",
                    if trials.dirs > 0 { Level::Warn } else { Level::Ok },
                    "no engine log and no heartbeat: completions cannot be checked",
                )
                .evidence("no vllm.log and no status.json in the run dir"),
            );
            return None;
        }
    };
    let total = ok + c4xx + c5xx;
    // How long the engine has served: Harbor's running time (payload) or the log's own span.
    let served_s = running_since
        .map(|t| {
            (if state == RunState::Running {
                now
            } else {
                status.and_then(|s| parse_time(&s.updated_at)).unwrap_or(now)
            } - t)
                .num_seconds()
        })
        .or_else(|| log.and_then(EngineLog::anchored_span_s))
        .or_else(|| {
            let p = log_path?;
            let meta = std::fs::metadata(p).ok()?;
            let born = DateTime::<Utc>::from(meta.created().ok()?);
            Some((DateTime::<Utc>::from(meta.modified().ok()?) - born).num_seconds())
        });
    let per_min = match (log.and_then(EngineLog::anchored_span_s), served_s) {
        (Some(span), _) if span >= 60 && log.is_some_and(|l| l.completions() > 0) => {
            Some(log.map_or(0, EngineLog::completions) as f64 / (span as f64 / 60.0))
        }
        (_, Some(s)) if s >= 60 => Some(total as f64 / (s as f64 / 60.0)),
        _ => None,
    };
    if let Some(fatal) = log.and_then(|l| l.fatal.clone()) {
        findings.push(
            Finding::new("engine", "engine.died", Level::Fail, "the engine died")
                .evidence(format!("{file}: {fatal}"))
                .action("read the end of vllm.log (`submitter logs RUN --engine`); resubmit after fixing the cause"),
        );
    }
    if let Some(b) = beat
        && !b.engine_healthy
        && state == RunState::Running
    {
        findings.push(
            Finding::new("engine", "engine.unhealthy", Level::Fail, "the engine's last /health probe failed")
                .evidence(format!("status.json heartbeat at {}: engine_healthy false", b.at))
                .action("payload stops the run after 3 failed probes; if the job stays RUNNING, cancel it"),
        );
    }
    let rate_text = per_min.map(|r| format!(", {r:.1}/min")).unwrap_or_default();
    let span_text = served_s.map(|s| format!(" over {}", human_duration(s))).unwrap_or_default();
    let counts =
        format!("{total} completions{span_text}{rate_text}: {ok} × 2xx, {c4xx} × 4xx, {c5xx} × 5xx ({source})");
    let share = |n: u64| if total > 0 { n as f64 / total as f64 } else { 0.0 };
    // The recent window catches a run that went bad midway.
    let recent = log.map(EngineLog::recent_counts).filter(|r| r.0 >= settings.min_requests);
    let recent_400_share = recent.map(|(n, _, c4, _)| c4 as f64 / n as f64);
    let overall_400 = share(c4xx);
    let bad_overall = total >= settings.min_requests && overall_400 > settings.bad_request_share;
    let bad_recent = recent_400_share.is_some_and(|s| s > settings.bad_request_share);
    if bad_overall || bad_recent {
        let mut f = Finding::new(
            "engine",
            "engine.bad_requests",
            Level::Fail,
            format!(
                "context overflow: {} of completions answered 400 (> {}){}",
                percent(if bad_overall { overall_400 } else { recent_400_share.unwrap_or(0.0) }),
                percent(settings.bad_request_share),
                if bad_overall { "" } else { " among the latest" }
            ),
        )
        .evidence(counts.clone());
        if let Some((n, _, c4, _)) = recent {
            f = f.evidence(format!("latest {n} completions: {c4} × 4xx ({})", percent(c4 as f64 / n as f64)));
        }
        if let Some(line) = log.and_then(|l| l.example_400.clone()) {
            f = f.evidence(format!("{file}: {line}"));
        }
        if let Some(line) = log.and_then(|l| l.context_error.clone()) {
            f = f.evidence(format!("{file}: {line}"));
        }
        findings.push(f.action("max_model_len or the output budget (max_output_tokens in model_info) is too large for the prompts: lower it in the registry and resubmit"));
    }
    let zero_ok_for = served_s.unwrap_or(0);
    if ok == 0 && zero_ok_for >= settings.zero_ok_after_s as i64 {
        let mut f = Finding::new(
            "engine",
            "engine.zero_ok",
            Level::Fail,
            format!(
                "{} served with zero 200 completions: broken agent setup (missing model_info, or an old Harbor)",
                human_duration(zero_ok_for)
            ),
        )
        .evidence(counts.clone());
        if let Some(line) = &trials.model_info_example {
            f = f.evidence(line.clone());
        }
        findings.push(f.action(
            "check the agent kwargs (model_info, api_base) in config.json and Harbor's version, then resubmit",
        ));
    } else if !bad_overall && !bad_recent {
        let c5 = share(c5xx);
        if total >= settings.min_requests && c5 > settings.server_error_share {
            let mut f = Finding::new(
                "engine",
                "engine.server_errors",
                Level::Warn,
                format!("{} of completions failed with 5xx", percent(c5)),
            )
            .evidence(counts.clone());
            if let Some(line) = log.and_then(|l| l.example_5xx.clone()) {
                f = f.evidence(format!("{file}: {line}"));
            }
            findings.push(f.action("read vllm.log around the errors (`submitter logs RUN --engine`)"));
        } else {
            let slow = state == RunState::Running
                && trials.active > 0
                && per_min.is_some_and(|r| r < 1.0)
                && served_s.is_some_and(|s| s >= 600);
            let mut f = Finding::new(
                "engine",
                "engine.completions",
                if slow { Level::Warn } else { Level::Ok },
                if total == 0 {
                    "no completions yet".to_string()
                } else if slow {
                    format!(
                        "completions arrive slowly ({}/min) while {} trials are active",
                        per_min.map_or("?".into(), |r| format!("{r:.2}")),
                        trials.active
                    )
                } else {
                    format!("completions arriving, {} answered 200", percent(share(ok)))
                },
            )
            .evidence(counts);
            if let Some((n, r2, r4, r5)) = log.map(EngineLog::recent_counts).filter(|r| r.0 > 0) {
                f = f.evidence(format!("latest {n}: {r2} × 2xx, {r4} × 4xx, {r5} × 5xx"));
            }
            if slow {
                f = f.action("look at the agent's trial.log files and vLLM's throughput lines");
            }
            findings.push(f);
        }
    }
    per_min
}

// ---------------------------------------------------------------------------------------------
// Trials

#[allow(clippy::too_many_arguments)]
fn trial_findings(
    trials: &TrialScan,
    expected: Option<u64>,
    state: RunState,
    status: Option<&RunStatus>,
    running_since: Option<DateTime<Utc>>,
    settings: &VerifySettings,
    now: DateTime<Utc>,
    findings: &mut Vec<Finding>,
) {
    let expected_text = expected.map(|e| format!(" of {e}")).unwrap_or_default();
    let infra: u64 = trials
        .errors_by_type
        .iter()
        .filter(|(k, _)| launch_spec::launch::INFRA_ERROR_TYPES.contains(&k.as_str()))
        .map(|(_, v)| v)
        .sum();
    let mut progress = Finding::new(
        "trials",
        "trials.progress",
        Level::Ok,
        format!(
            "{} done{expected_text}, {} active, {} errored ({infra} infra)",
            trials.done, trials.active, trials.errored
        ),
    );
    if !trials.errors_by_type.is_empty() {
        let types: Vec<String> = trials.errors_by_type.iter().map(|(k, v)| format!("{k} × {v}")).collect();
        progress = progress.evidence(format!("errors: {}", types.join(", ")));
    }
    let since_last = trials.last_result_at.map(|t| (now - t).num_seconds());
    if let (Some(s), Some(trial)) = (since_last, &trials.last_result_trial) {
        progress = progress.evidence(format!("last result.json {} ago ({trial})", human_duration(s)));
    }
    findings.push(progress);

    if trials.instant_failures > 0 {
        let fail = trials.instant_failures >= 3
            && trials.instant_failures as f64 > settings.instant_fail_share * trials.done.max(1) as f64;
        let mut f = Finding::new(
            "trials",
            "trials.instant_fail",
            if fail { Level::Fail } else { Level::Warn },
            format!(
                "{} of {} finished trials failed instantly (no output tokens, finished ≈ started)",
                trials.instant_failures, trials.done
            ),
        );
        if let Some(e) = &trials.instant_example {
            f = f.evidence(e.clone());
        }
        let types: Vec<String> = trials.instant_types.iter().map(|(k, v)| format!("{k} × {v}")).collect();
        f = f.evidence(format!("by exception: {}", types.join(", ")));
        let overflow: u64 = trials
            .instant_types
            .iter()
            .filter(|(k, _)| k.contains("ContextLength") || k.contains("BadRequest"))
            .map(|(_, v)| v)
            .sum();
        findings.push(f.action(if overflow * 2 > trials.instant_failures {
            "they died on their first request's 400 (context overflow): lower max_model_len / the output budget, see the engine check"
        } else {
            "the agent never got an answer from the model: check api_base, model_info and the sandbox provider (Daytona) errors"
        }));
    }
    if trials.unconstructed > 0 && trials.model_info_warnings > 0 {
        let mut f = Finding::new(
            "trials",
            "trials.never_started",
            Level::Fail,
            format!(
                "{} trial dir(s) were never constructed: the agent rejected its configuration",
                trials.unconstructed
            ),
        );
        if let Some(e) = &trials.model_info_example {
            f = f.evidence(e.clone());
        }
        findings.push(f.action("pass model_info in the agent kwargs (payload does this) and resubmit"));
    }
    let all_done = expected.is_some_and(|e| trials.done >= e) && trials.active == 0;
    if state == RunState::Running {
        let quiet = since_last.unwrap_or(i64::MAX);
        // payload's heartbeat knows when any counter (completions, trials) last moved.
        let progress =
            status.and_then(|s| s.heartbeat.as_ref()).and_then(|h| h.last_progress_at.as_deref()).and_then(parse_time);
        let no_progress = progress.or(running_since).map(|t| (now - t).num_seconds());
        if all_done && since_last.is_some_and(|s| s >= settings.zombie_after_s as i64) {
            findings.push(
                Finding::new("trials", "trials.zombie", Level::Fail, format!("all {} trials are done but the job still runs (zombie)", trials.done))
                    .evidence(format!("last result.json {} ago; payload phase {}", human_duration(quiet), status.map_or("-".into(), |s| format!("{:?}", s.phase).to_lowercase())))
                    .action("Harbor is hung after its last trial: cancel the job (`submitter cancel --job ID`); its results are complete"),
            );
        } else if !all_done && no_progress.is_some_and(|q| q >= settings.stall_after_s as i64) {
            let q = no_progress.unwrap_or(0);
            findings.push(
                Finding::new("trials", "trials.stalled", Level::Fail, format!("no completion and no trial progress for {} while {} trials are active (stalled)", human_duration(q), trials.active))
                    .evidence(format!(
                        "status.json heartbeat: last progress at {}",
                        progress.map_or_else(|| "never (since Harbor started)".to_string(), |t| t.to_rfc3339())
                    ))
                    .action("look at an active trial's trial.log and the engine log; cancel and resubmit (resume) if nothing moves"),
            );
        } else if trials.active > 0
            && quiet.min(running_since.map_or(i64::MAX, |t| (now - t).num_seconds()))
                >= settings.no_result_after_s as i64
        {
            findings.push(
                Finding::new("trials", "trials.stalled", Level::Fail, format!("no new result.json for {} while {} trials are active (stalled)", human_duration(quiet), trials.active))
                    .evidence(format!("last result.json: {}", trials.last_result_trial.as_deref().unwrap_or("?")))
                    .action("look at an active trial's trial.log and the engine log; cancel and resubmit (resume) if nothing moves"),
            );
        }
    } else if state == RunState::Unknown && all_done && trials.done > 0 {
        findings.push(
            Finding::new(
                "trials",
                "trials.done_unrecorded",
                Level::Warn,
                "all trials are done but no outcome was recorded",
            )
            .evidence("no payload outcome and no finished_at in result.json")
            .action(
                "check `squeue`: a job still RUNNING is a zombie (cancel it); a gone one died after its last trial",
            ),
        );
    }
}

fn outcome_findings(
    status: Option<&RunStatus>,
    result: Option<&Value>,
    state: RunState,
    settings: &VerifySettings,
    now: DateTime<Utc>,
    findings: &mut Vec<Finding>,
) {
    let Some(status) = status else {
        if let Some(finished) = result.and_then(|r| r.get("finished_at")).and_then(Value::as_str) {
            findings.push(Finding::new(
                "outcome",
                "outcome.harbor_finished",
                Level::Ok,
                format!("Harbor finished at {finished}"),
            ));
        }
        return;
    };
    match &status.outcome {
        Some(o) if o.class == launch_spec::records::OutcomeClass::Finished => {
            findings.push(Finding::new(
                "outcome",
                "outcome.finished",
                Level::Ok,
                format!("payload: finished ({})", o.message),
            ));
        }
        Some(o) => {
            let mut f = Finding::new(
                "outcome",
                "outcome.failed",
                Level::Fail,
                format!(
                    "payload: {}{} (exit {}): {}",
                    o.class.as_str(),
                    o.cause.as_ref().map(|c| format!("/{c}")).unwrap_or_default(),
                    o.exit_code,
                    o.message
                ),
            );
            for line in o.engine_log_tail.iter().rev().take(3).rev() {
                f = f.evidence(format!("vllm.log: {line}"));
            }
            findings.push(f.action(match o.class {
                launch_spec::records::OutcomeClass::Walltime | launch_spec::records::OutcomeClass::Interrupted => {
                    "resubmit: Harbor resumes the run"
                }
                launch_spec::records::OutcomeClass::EngineStart => {
                    "fix the serve settings for this model (registry) before resubmitting"
                }
                _ => "read the logs (`submitter logs RUN`), fix the cause, resubmit",
            }));
        }
        None => {
            let age = status_age_s(status, now).unwrap_or(i64::MAX);
            let phase = format!("{:?}", status.phase).to_lowercase();
            if state == RunState::Running {
                findings.push(Finding::new(
                    "outcome",
                    "outcome.running",
                    Level::Ok,
                    format!("payload phase {phase}, last status {} ago", human_duration(age)),
                ));
            } else {
                findings.push(
                    Finding::new("outcome", "outcome.silent", Level::Warn, format!("payload stopped writing status.json {} ago without an outcome", human_duration(age)))
                        .evidence(format!("status.json phase {phase}, updated_at {} (heartbeat timeout {}s)", status.updated_at, settings.heartbeat_timeout_s))
                        .action("the job was killed hard (OOM, node failure, KILL after KillWait) or is hung: check squeue; `submitter sync` marks a gone job failed"),
                );
            }
        }
    }
}

fn audit_finding(audit: &Audit) -> Finding {
    let mut f = Finding::new(
        "audit",
        "audit.completion",
        if audit.complete { Level::Ok } else { Level::Warn },
        if audit.complete { "complete".to_string() } else { format!("incomplete: {}", audit.reasons.join("; ")) },
    );
    f = f.evidence(format!(
        "{} valid of {} expected (need {}), {} errored ({})",
        audit.valid,
        audit.expected.map_or("?".into(), |e| e.to_string()),
        audit.needed.map_or("?".into(), |e| e.to_string()),
        audit.errored,
        percent(audit.error_share)
    ));
    if !audit.complete {
        f = f.action("resume rather than accept: resubmit the pair (Harbor reruns the errored and missing trials)");
    }
    f
}

use super::printable;

/// The human form of a set of checks; run-dir text is printed escaped ([`printable`]).
pub fn render_text(checks: &[RunCheck]) -> String {
    let mut out = String::new();
    for c in checks {
        out += &format!(
            "{}{}  {}  ({})\n",
            printable(&c.run_dir.display().to_string()),
            c.run_tag.as_ref().map(|t| format!("  [{}]", printable(t))).unwrap_or_default(),
            c.verdict.as_str().to_uppercase(),
            match c.state {
                RunState::Running => "running",
                RunState::Ended => "ended",
                RunState::Unknown => "state unknown",
            }
        );
        for f in &c.findings {
            out += &format!("  {:<4}  {:<9} {}\n", f.level.as_str(), f.check, printable(&f.summary));
            for e in &f.evidence {
                out += &format!("              · {}\n", printable(e));
            }
            if let Some(a) = &f.action {
                out += &format!("              → {}\n", printable(a));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_string_extraction() {
        assert_eq!(json_string_after(b": \"http://x/v1\", ").as_deref(), Some("http://x/v1"));
        assert_eq!(json_string_after(b"  :\"a\\\"b\"").as_deref(), Some("a\"b"));
        assert_eq!(json_string_after(b": null"), None);
    }

    #[test]
    fn tunnel_log_parsing() {
        let text = "\u{1b}[2JYou are authenticated as user@example.org\nhttps://abc-1.a.pinggy.link\nRB: 10 SB: 5 TC: 1\nRB: 1.5K SB: 900 TC: 3\n";
        let log = parse_tunnel_log(Path::new("tunnel.log"), text);
        assert!(log.authenticated.is_some());
        assert_eq!(log.public_url.as_deref(), Some("https://abc-1.a.pinggy.link"));
        assert_eq!(log.counters["RB"], (10.0, 1500.0, 2));
        let locked = parse_tunnel_log(Path::new("t"), "A tunnel with the same token is already active\n");
        assert!(locked.locked.is_some());
        // A pair bank: the first pair is locked, payload moves on and the next one works.
        let moved = parse_tunnel_log(
            Path::new("t"),
            "[2026-01-01T00:00:00.000Z] payload: attempt 1: ssh -F cfg pro.pinggy.io (public URL https://one.a.pinggy.link)\n\
             A tunnel with the same token is already active.\n\
             [2026-01-01T00:00:01.000Z] payload: pair https://one.a.pinggy.link is unusable (token_locked); moving to the next free pair\n\
             You are authenticated as ops\nhttps://two.a.pinggy.link\n\
             [2026-01-01T00:00:03.000Z] payload: verified: GET https://two.a.pinggy.link/v1/models → 200\n",
        );
        assert!(moved.locked.is_none() && moved.recovered_lock.is_some(), "{moved:?}");
        assert_eq!(moved.public_url.as_deref(), Some("https://two.a.pinggy.link"));
        assert!(moved.verified.is_some());
    }
}
