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

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use launch_spec::fsread::{self, Links};
use launch_spec::records::{ENGINE_LOG, SPEC_FILE, TUNNEL_LOG};
use launch_spec::rundir::harbor::{self as hf, JobConfig, JobResult, TrialStage};
use launch_spec::rundir::vocab::{self, TunnelLine};
use launch_spec::rundir::{self, LaunchView, StatusRecord};

use super::logscan::{self, EngineLog};
use super::results::{self, Audit};
pub use super::rules::RunState;
use super::rules::{Agent, EngineFacts, Evidence, HarborFacts, TrialFacts, Window, Wiring};
use super::verdict::VerdictKind;
use super::{Finding, Level, VerifySettings, is_installed_agent, mtime, parse_time};

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

/// The numbers behind the findings, for scripts (`check --json`).
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub engine_log: Option<EngineLog>,
    pub completions_per_min: Option<f64>,
    pub trials: TrialScan,
    pub expected_trials: Option<u64>,
    pub audit: Option<Audit>,
}

/// The result of checking one run dir.
#[derive(Debug, Clone)]
pub struct RunCheck {
    pub run_dir: PathBuf,
    pub run_tag: Option<String>,
    /// The worst finding's level.
    pub verdict: Level,
    /// What `status` calls the same evidence (one rule engine: [`super::rules::evaluate`]).
    pub status_verdict: VerdictKind,
    pub state: RunState,
    pub findings: Vec<Finding>,
    pub facts: Facts,
}

pub use super::rules::{TrialScan, TunnelLog};

/// The agent runs in the remote sandbox and calls the model back over the tunnel: an installed
/// harness, or any run whose spec asked for a Pinggy tunnel.
fn runs_remote(agent: &Agent, launch: &Launch) -> bool {
    launch.tunnel_kind.as_deref() == Some("pinggy") || is_installed_agent(&agent.display_name())
}

#[derive(Debug, Clone, Default)]
struct Launch {
    run_tag: Option<String>,
    tunnel_kind: Option<String>,
    public_url: Option<String>,
    agent: Option<String>,
    /// The Pinggy pair payload took (last `tunnel_pair` event): with a pair bank it may differ
    /// from the spec's first pair.
    held_url: Option<String>,
}

/// How much of a run dir is read: everything (`check`), or the records and configs only
/// (`status`, every job on every refresh: no engine log or trial scan).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    Full,
    Records,
}

/// A run dir's evidence and what `check --json` shows beside the findings.
pub(crate) struct DirEvidence {
    pub evidence: Evidence,
    pub run_tag: Option<String>,
    pub engine_log: Option<EngineLog>,
}

/// Reads a run dir into [`Evidence`] for the reference time `now`. `payload` is its `status.json`
/// when the caller read it already (the reconcile reads each once, `observe::Observation`).
pub(crate) fn evidence_from_dir(
    dir: &Path,
    payload: Option<StatusRecord>,
    settings: &VerifySettings,
    now: DateTime<Utc>,
    depth: Depth,
) -> Result<DirEvidence, CheckError> {
    let meta = std::fs::metadata(dir).map_err(|source| CheckError::Io { path: dir.to_path_buf(), source })?;
    if !meta.is_dir() {
        return Err(CheckError::NotADirectory(dir.to_path_buf()));
    }
    let engine_log_path = if depth == Depth::Full { find_engine_log(dir) } else { None };
    // The two expensive parts — the engine log and the trial dirs — run side by side.
    let (log, trials) = if depth == Depth::Full {
        std::thread::scope(|scope| {
            let trials = scope.spawn(|| scan_trials(dir, settings.instant_fail_s));
            let log = engine_log_path.as_deref().map(logscan::scan_file);
            (log, trials.join().expect("trial scan panicked"))
        })
    } else {
        (None, Ok(TrialScan::default()))
    };
    let trials = trials.map_err(|source| CheckError::Io { path: dir.to_path_buf(), source })?;
    // An engine log that cannot be read is this dir's finding, not the end of the command: the
    // other checks of the dir, and the other dirs, still run.
    let (log, log_unreadable) = match log {
        Some(Ok(log)) => (log, None),
        Some(Err(source)) => (None, Some(source)),
        None => (None, None),
    };
    let payload = payload.unwrap_or_else(|| rundir::read_status(dir));
    // Only the kinds verification reads (the engine's start, the tunnel's pair, the outcome).
    let events = rundir::read_events_where(dir, |kind| {
        matches!(kind, rundir::EventKind::Phase | rundir::EventKind::TunnelPair | rundir::EventKind::Outcome)
    });
    let launch_view = rundir::read_launch(dir);
    let launch = read_launch(launch_view.clone(), &events);
    let job_config: Option<JobConfig> = hf::read(&dir.join(hf::CONFIG_FILE)).ok().flatten();
    // The typed partial model, read once: a 16 MiB result.json costs little more than its bytes.
    let job_result: Option<JobResult> = hf::read_rewritten(&dir.join(hf::RESULT_FILE)).ok().flatten();
    if depth == Depth::Full {
        let is_run_dir = payload != StatusRecord::Absent
            || job_config.is_some()
            || job_result.is_some()
            || log.is_some()
            || log_unreadable.is_some()
            || trials.dirs > 0
            || dir.join(SPEC_FILE).is_file()
            || find_tunnel_log(dir).is_some();
        if !is_run_dir {
            return Err(CheckError::NotARunDir(dir.to_path_buf()));
        }
    }
    let status = payload.status();
    let agent = agent_of(job_config.as_ref(), &launch);
    let expected = rundir::expected_trials(job_result.as_ref(), launch_view.as_ref(), job_config.as_ref());
    let running_since = rundir::running_since(&events, status);
    let harbor = HarborFacts {
        started_at: job_result.as_ref().and_then(|r| r.started_at.as_deref()).and_then(parse_time),
        finished_at: job_result.as_ref().and_then(|r| r.finished_at.clone()),
        present: job_result.is_some(),
    };

    let tail = if depth == Depth::Full { TUNNEL_TAIL_CHECK } else { TUNNEL_TAIL_STATUS };
    let wiring = Wiring {
        remote: runs_remote(&agent, &launch),
        agent,
        run_dir: dir.display().to_string(),
        tunnel: tunnel_facts(dir, tail),
        held_url: launch.held_url.clone(),
        launch_public_url: launch.public_url.clone(),
        api_base_read: depth == Depth::Full || job_config.is_some(),
        engine_log_unreadable: log_unreadable
            .as_ref()
            .zip(engine_log_path.as_ref())
            .map(|(err, path)| (err.to_string(), path.display().to_string())),
        fails_only: depth == Depth::Records,
    };

    let beat = status.and_then(|s| s.heartbeat.as_ref());
    let engine = engine_facts(log.as_ref(), beat, engine_log_path.as_deref(), running_since, &harbor);
    let audit = job_result.as_ref().map(|r| results::audit_of(&results::summary_from_result(r, expected), settings));
    let evidence = Evidence {
        now: Some(now),
        running_since,
        harbor,
        engine,
        trials: TrialFacts {
            beat: beat.map(|b| (b.trials_started, b.trials_finished, b.trials_errored)),
            last_progress_at: beat.and_then(|b| b.last_progress_at.as_deref()).and_then(parse_time),
            scan: (depth == Depth::Full).then(|| trials.clone()),
        },
        has_trials: trials.dirs > 0,
        installed_agent: wiring.remote,
        expected_trials: expected,
        wiring: Some(wiring),
        audit,
        job: None,
        payload: payload.clone(),
    };
    let run_tag = launch
        .run_tag
        .clone()
        .or_else(|| status.map(|s| s.run_tag.clone()))
        .or_else(|| job_config.as_ref().and_then(|c| c.job_name.clone()));
    Ok(DirEvidence { evidence, run_tag, engine_log: log })
}

/// The engine's evidence: the access log when it has completions, else payload's heartbeat.
fn engine_facts(
    log: Option<&EngineLog>,
    beat: Option<&launch_spec::records::Heartbeat>,
    log_path: Option<&Path>,
    running_since: Option<DateTime<Utc>>,
    harbor: &HarborFacts,
) -> Option<EngineFacts> {
    let file = log_path
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| ENGINE_LOG.into());
    let written_at = log_path.and_then(mtime);
    let mut e = EngineFacts { file: file.clone(), written_at, ..EngineFacts::default() };
    match (log, beat) {
        (Some(l), _) if l.completions() > 0 => {
            (e.ok, e.c4xx, e.c5xx, e.source) = (l.ok, l.c4xx, l.c5xx, format!("{file} access lines"));
        }
        (_, Some(b)) => {
            (e.ok, e.c4xx, e.c5xx) = (b.completions_ok, b.completions_4xx, b.completions_5xx);
            e.source = "status.json heartbeat".into();
        }
        (Some(l), None) => (e.ok, e.c4xx, e.c5xx, e.source) = (l.ok, l.c4xx, l.c5xx, format!("{file} access lines")),
        (None, None) => return None,
    }
    if let Some(b) = beat {
        let last_ok = (b.engine_healthy).then(|| parse_time(&b.at)).flatten();
        e.probe =
            Some(super::rules::Probe { failed: b.failed_probes, limit: b.probe_limit, at: b.at.clone(), last_ok });
        e.counters = b.engine.clone().map(|c| (c, b.at.clone()));
    }
    let anchor_at = |anchor: Option<i64>| -> Option<DateTime<Utc>> { log?.anchor_instant(anchor?, written_at?) };
    if let Some(l) = log {
        let (n, ok, c4, c5) = l.recent_counts();
        e.recent = (n > 0).then(|| Window { n, ok, c4xx: c4, c5xx: c5, label: format!("latest {n} completions") });
        (e.example_400, e.example_5xx, e.context_error, e.fatal) =
            (l.example_400.clone(), l.example_5xx.clone(), l.context_error.clone(), l.fatal.clone());
        if l.completions() > 0 {
            e.last_completion_at = anchor_at(l.last_completion_anchor);
        }
    }
    // Serving since Harbor started (payload's event), else since the earliest start the files show:
    // the server's start line, Harbor's job start. An idle server logs only untimestamped health
    // checks, so the log's own stamped span says nothing about how long it has served.
    e.serving_since = running_since.or_else(|| {
        let server = log.and_then(|l| anchor_at(l.server_start.or(l.first_anchor)));
        [server, harbor.started_at].into_iter().flatten().min()
    });
    let span = log.and_then(EngineLog::anchored_span_s);
    e.per_min = match (span, log) {
        (Some(span), Some(l)) if span >= 60 && l.completions() > 0 => {
            Some(l.completions() as f64 / (span as f64 / 60.0))
        }
        _ => None,
    };
    Some(e)
}

/// Checks one run dir at the reference time `now`.
pub fn check_run_dir(dir: &Path, settings: &VerifySettings, now: DateTime<Utc>) -> Result<RunCheck, CheckError> {
    check_run_dir_with(dir, None, settings, now)
}

/// [`check_run_dir`] with the dir's `status.json` already read (`payload`), else read here.
pub fn check_run_dir_with(
    dir: &Path,
    payload: Option<StatusRecord>,
    settings: &VerifySettings,
    now: DateTime<Utc>,
) -> Result<RunCheck, CheckError> {
    let d = evidence_from_dir(dir, payload, settings, now, Depth::Full)?;
    let assessment = super::rules::evaluate(&d.evidence, settings);
    let (status_verdict, _) = assessment.verdict();
    let e = &d.evidence;
    let per_min = e.engine.as_ref().and_then(|x| x.per_min).or_else(|| {
        let x = e.engine.as_ref()?;
        let since = x.serving_since?;
        let until = if assessment.state == RunState::Running { now } else { x.written_at.unwrap_or(now).min(now) };
        let s = (until - since).num_seconds();
        (s >= 60).then(|| x.total() as f64 / (s as f64 / 60.0))
    });
    Ok(RunCheck {
        run_dir: dir.to_path_buf(),
        run_tag: d.run_tag,
        verdict: assessment.level(),
        status_verdict,
        state: assessment.state,
        findings: assessment.findings,
        facts: Facts {
            engine_log: d.engine_log,
            completions_per_min: per_min,
            trials: e.trials.scan.clone().unwrap_or_default(),
            expected_trials: e.expected_trials,
            audit: e.audit.clone(),
        },
    })
}

fn read_launch(view: Option<LaunchView>, events: &[rundir::Event]) -> Launch {
    let held_url = events.iter().rev().find_map(|e| e.pair_url());
    let Some(spec) = view else { return Launch { held_url, ..Launch::default() } };
    let LaunchView { run_tag, tunnel, harbor, .. } = spec;
    Launch { held_url, run_tag, tunnel_kind: tunnel.kind, public_url: tunnel.public_url, agent: harbor.agent }
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
pub(crate) fn find_tunnel_log(dir: &Path) -> Option<PathBuf> {
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

fn agent_of(config: Option<&JobConfig>, launch: &Launch) -> Agent {
    if let Some(agent) = config.and_then(|c| c.agents.first()) {
        return Agent {
            name: agent.name.clone(),
            model_name: agent.model_name.clone(),
            api_base: agent.kwargs.api_base.clone(),
            has_model_info: agent.kwargs.has_model_info(),
            from: "config.json",
        };
    }
    Agent { name: launch.agent.clone(), from: "launch.json", ..Agent::default() }
}

// ---------------------------------------------------------------------------------------------
// Trials

/// Scans the trial directories of a run dir ([`hf::read_trial`] for each, the reader payload's
/// heartbeat counts with, then the file its stage says to read: `config.json` up to its
/// `api_base`, `trial.log` for the model-info warning).
pub fn scan_trials(dir: &Path, instant_fail_s: f64) -> std::io::Result<TrialScan> {
    let mut scan = TrialScan::default();
    let api_base_key = memchr::memmem::Finder::new(b"\"api_base\"");
    let model_info_warning = memchr::memmem::Finder::new(b"Model info is required");
    let mut buf = Vec::with_capacity(16 << 10);
    for entry in std::fs::read_dir(dir)? {
        let Ok(entry) = entry else { continue };
        if !hf::is_trial_entry(&entry) {
            continue;
        }
        let trial = entry.path();
        let read = hf::read_trial(&trial, &mut buf);
        if read.stage == TrialStage::NotATrial {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        scan.dirs += 1;
        if read_into(&trial.join(hf::CONFIG_FILE), &mut buf)
            && let Some(Some(api_base)) = api_base_key.find(&buf).map(|at| json_string_after(&buf[at + 10..]))
        {
            let slot = scan.api_bases.entry(api_base).or_insert((0, name.clone()));
            slot.0 += 1;
        }
        match read.stage {
            TrialStage::Queued => scan.queued += 1,
            TrialStage::Running | TrialStage::Verifying => {
                scan.active += 1;
                scan.running.push((name, read));
            }
            TrialStage::Unconstructed => {
                scan.unconstructed += 1;
                if read_into(&trial.join(hf::TRIAL_LOG), &mut buf)
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
            TrialStage::Done => done_trial(&read, &name, instant_fail_s, &mut scan),
            TrialStage::NotATrial => {}
        }
    }
    Ok(scan)
}

fn done_trial(read: &hf::TrialRead, name: &str, instant_fail_s: f64, scan: &mut TrialScan) {
    scan.done += 1;
    if let Some(t) = read.result_modified.map(DateTime::<Utc>::from)
        && scan.last_result_at.is_none_or(|last| t > last)
    {
        scan.last_result_at = Some(t);
        scan.last_result_trial = Some(name.to_string());
    }
    let Some(result) = &read.result else { return };
    if let Some(kind) = result.exception_type() {
        scan.errored += 1;
        *scan.errors_by_type.entry(kind.to_string()).or_default() += 1;
    }
    if result.has_reward() {
        scan.valid += 1;
    }
    if let Some(kind) = result.exception_type().filter(|k| hf::is_sandbox_provider_error(k)) {
        scan.sandbox_failures += 1;
        if scan.sandbox_example.is_none() {
            let message = result.exception_message().map(|m| format!(": {m}")).unwrap_or_default();
            scan.sandbox_example = Some((name.to_string(), format!("{kind}{message}")));
        }
        return;
    }
    let no_output = result.output_tokens().is_none_or(|n| n <= 0.0);
    let took = result.agent_seconds(launch_spec::rundir::parse_time_ms);
    if no_output && took.is_some_and(|(t, _)| t <= instant_fail_s) {
        scan.instant_failures += 1;
        let kind = result.exception_type().unwrap_or("none").to_string();
        *scan.instant_types.entry(kind.clone()).or_default() += 1;
        if scan.instant_example.is_none() {
            let (t, agent) = took.unwrap_or((0.0, false));
            let kind = if kind == "none" { "no exception".to_string() } else { kind };
            scan.instant_example = Some(if agent {
                format!("{name}/result.json: no output tokens, the agent ran {t:.1}s (agent_execution; {kind})")
            } else {
                format!("{name}/result.json: no output tokens, finished {t:.1}s after its start ({kind})")
            });
        }
    }
}

/// Reads a trial file (`config.json`, `trial.log`) into `buf`: a regular file, at most its first
/// [`fsread::RECORD_CAP`] bytes (what is looked for sits at the start).
fn read_into(path: &Path, buf: &mut Vec<u8>) -> bool {
    buf.clear();
    let Ok((file, meta)) = fsread::open_regular_meta(path, Links::Refuse) else { return false };
    let ok = fsread::read_open(&file, meta.len(), fsread::RECORD_CAP, buf).is_ok();
    buf.truncate(fsread::RECORD_CAP as usize);
    ok
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

/// Parses a Pinggy (or plain `ssh -R`) log.
pub(crate) fn parse_tunnel_log(path: &Path, text: &str) -> TunnelLog {
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
        // One vocabulary with payload's tunnel supervisor (`launch_spec::rundir::vocab`).
        let kind = vocab::classify_tunnel_line(line);
        if kind == TunnelLine::Locked {
            log.locked = Some(line.to_string());
            continue;
        }
        let mut up = false;
        match kind {
            TunnelLine::NotAuthenticated => log.not_authenticated = Some(line.to_string()),
            TunnelLine::Authenticated => {
                log.authenticated = Some(line.to_string());
                log.not_authenticated = None;
                up = true;
            }
            TunnelLine::AllocatedPort(_) => {
                log.allocated = Some(line.to_string());
                up = true;
            }
            _ => {}
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
        if kind.is_error() && log.errors.len() < 5 {
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

/// The tunnel log's facts (`None`: there is none), from its last `tail` bytes.
fn tunnel_facts(dir: &Path, tail: u64) -> Option<TunnelLog> {
    let path = find_tunnel_log(dir)?;
    let text = String::from_utf8_lossy(&tail_bytes(&path, tail)).into_owned();
    Some(parse_tunnel_log(&path, &text))
}

/// The last `max` bytes of a file.
fn tail_bytes(path: &Path, max: u64) -> Vec<u8> {
    fsread::read_tail(path, max, Links::Refuse).map(|(bytes, _)| bytes).unwrap_or_default()
}

use super::printable;

/// The human form of a set of checks; run-dir text is printed escaped ([`printable`]).
pub(crate) fn render_text(checks: &[RunCheck]) -> String {
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
        out += &format!("  status verdict: {}\n", c.status_verdict);
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

    /// Issue 22's drift: `check` did not count these as tunnel errors while payload did (and only
    /// `check` knew "broken pipe"); one vocabulary now.
    #[test]
    fn tunnel_errors_are_payloads_vocabulary() {
        let text = "Host key verification failed.\nssh: connect to host a.pinggy.io port 443: Connection timed out\n\
                    ssh: connect to host a.pinggy.io port 443: No route to host\nclient_loop: send disconnect: Broken pipe\n";
        let log = parse_tunnel_log(Path::new("tunnel.log"), text);
        assert_eq!(log.errors.len(), 4, "{:?}", log.errors);
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
