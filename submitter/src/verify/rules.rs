//! The one rule engine: a run's [`Evidence`] — from its files (`check`), from payload's heartbeat,
//! Slurm and the ledger (`status`), or both — goes through one [`evaluate`], which gives the
//! findings. `check`'s report and `status`'s verdict both derive from them: every finding names
//! the status verdict it stands for ([`Finding::status`]) and [`Assessment::verdict`] picks the
//! most severe. Pure: no file, clock or Slurm is touched here; the reference time is an input.

use std::collections::BTreeMap;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use launch_spec::records::{OutcomeClass, Phase, RunStatus};
use launch_spec::rundir::{RecordError, StatusRecord};
use serde::Serialize;

use super::findings::{self, FindingId};
use super::results::Audit;
use super::{Finding, Level, VerifySettings, human_duration, is_private_url, parse_time, percent};
use crate::domain::SlurmView;
use crate::ledger::AttemptStatus;

pub use super::VerdictKind;

/// What the trial directories hold.
#[derive(Debug, Clone, Default)]
pub struct TrialScan {
    /// Trial directories (`<task>__<id>/` with any of Harbor's trial files).
    pub dirs: u64,
    /// With `result.json`.
    pub done: u64,
    /// Started and not done ([`TrialStage::is_active`]: `config.json`, no `result.json`).
    pub active: u64,
    /// Made by Harbor but its environment not started yet (`lock.json` only).
    pub queued: u64,
    /// With neither `config.json` nor `result.json`: the trial was never constructed.
    pub unconstructed: u64,
    pub errored: u64,
    /// A numeric reward.
    pub valid: u64,
    pub errors_by_type: BTreeMap<String, u64>,
    /// No output tokens and the agent's execution (`agent_execution`; older Harbor: the whole
    /// trial) took at most `instant_fail_s`.
    pub instant_failures: u64,
    pub(crate) instant_example: Option<String>,
    /// Exception types of the instant failures.
    pub instant_types: BTreeMap<String, u64>,
    /// Trials the sandbox provider failed (`launch_spec::rundir::harbor::is_sandbox_provider_error`;
    /// never counted as instant failures: the agent never ran), with one example and its message.
    pub(crate) sandbox_failures: u64,
    /// (trial, `Type: the provider's message`) of the first.
    pub(crate) sandbox_example: Option<(String, String)>,
    /// The newest `result.json` (modification time) and its trial.
    pub last_result_at: Option<DateTime<Utc>>,
    pub(crate) last_result_trial: Option<String>,
    /// `api_base` of the trial configs: value → (count, example trial).
    pub api_bases: BTreeMap<String, (u64, String)>,
    /// trial.log lines saying `model_info` is missing (terminus-2's warning), with one example.
    pub model_info_warnings: u64,
    pub(crate) model_info_example: Option<String>,
    /// Every active trial's facts by name (`launch_spec::rundir::harbor::read_trial`): a rule on a
    /// new per-trial fact folds over these, and the scan does not change.
    pub running: Vec<(String, launch_spec::rundir::harbor::TrialRead)>,
}

/// The agent as the job's `config.json` (or `launch.json`) names it.
#[derive(Debug, Clone, Default)]
pub struct Agent {
    pub name: Option<String>,
    pub model_name: Option<String>,
    pub api_base: Option<String>,
    pub has_model_info: bool,
    pub from: &'static str,
}

impl Agent {
    /// The agent's name, terminus-2 (Harbor's default) when the files name none.
    pub(crate) fn display_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| "terminus-2".into())
    }
}

/// What a tunnel log says.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TunnelLog {
    pub path: PathBuf,
    pub authenticated: Option<String>,
    pub not_authenticated: Option<String>,
    /// The lock message that is still in force at the end of the log.
    pub locked: Option<String>,
    /// A lock message followed by a working session (payload moved to the next pair, or forced).
    pub(crate) recovered_lock: Option<String>,
    pub allocated: Option<String>,
    /// payload's end-to-end check passed (`[…] payload: verified: …`).
    pub verified: Option<String>,
    pub public_url: Option<String>,
    pub errors: Vec<String>,
    /// (first, last, samples) of each counter seen (`RB:`, `SB:`, `TC:`).
    pub counters: BTreeMap<String, (f64, f64, u64)>,
}

/// Whether the job that writes this run dir still runs, as far as the evidence tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// payload's heartbeat is fresh, Slurm runs the job, or — without payload's records — Harbor
    /// has not finished (`finished_at` null) and trials are active or missing.
    Running,
    /// payload recorded an outcome, or Harbor recorded `finished_at`.
    Ended,
    /// Neither: payload stopped writing without an outcome, or nothing says.
    Unknown,
}

/// What the ledger and Slurm say of the job (`status`; `check` has none).
#[derive(Debug, Clone)]
pub(crate) struct JobFacts {
    pub(crate) ledger_status: AttemptStatus,
    pub(crate) ledger_reason: String,
    /// When the job was first seen running (ledger `started_at`, or the first observation).
    pub(crate) running_seen_at: Option<DateTime<Utc>>,
    /// `None` while the attempt has no job id.
    pub slurm: Option<SlurmView>,
    pub slurm_state: Option<String>,
    pub job_id: Option<String>,
}

/// Harbor's job `result.json`.
#[derive(Debug, Clone, Default)]
pub(crate) struct HarborFacts {
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<String>,
    /// The job `result.json` exists (Harbor started the job).
    pub present: bool,
}

/// The latest completions: the access log's last [`super::logscan::RECENT`], or the heartbeat
/// window since an earlier reading.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Window {
    pub n: u64,
    pub ok: u64,
    pub c4xx: u64,
    pub c5xx: u64,
    /// How the evidence names it (`latest 200 completions`, `last 2m`).
    pub label: String,
}

/// What the engine did.
#[derive(Debug, Clone, Default)]
pub(crate) struct EngineFacts {
    /// The log file's name, for evidence lines.
    pub file: String,
    /// Where the counts come from (`vllm.log access lines`, `status.json heartbeat`).
    pub source: String,
    pub ok: u64,
    pub c4xx: u64,
    pub c5xx: u64,
    pub recent: Option<Window>,
    /// Completions per minute when measurable.
    pub per_min: Option<f64>,
    /// When the engine began serving: Harbor's start, the server's start line, the job's start.
    pub(crate) serving_since: Option<DateTime<Utc>>,
    /// When the log was last written (its modification time).
    pub(crate) written_at: Option<DateTime<Utc>>,
    /// When the last completion was answered (at or after this instant).
    pub(crate) last_completion_at: Option<DateTime<Utc>>,
    pub example_400: Option<String>,
    pub example_5xx: Option<String>,
    pub context_error: Option<String>,
    pub fatal: Option<String>,
    /// payload's health probe, from its heartbeat.
    pub probe: Option<Probe>,
    /// vLLM's own counters in payload's heartbeat (running/waiting requests, tokens, KV usage, how
    /// long requests have run with no token), with the heartbeat's time.
    pub counters: Option<(launch_spec::records::EngineCounters, String)>,
}

/// The sandbox provider failed at least half of the finished trials: an outage or a bad key of the
/// provider, which also leaves the engine without requests.
fn sandbox_outage(scan: &TrialScan) -> bool {
    scan.sandbox_failures > 0 && scan.sandbox_failures * 2 >= scan.done.max(1)
}

/// payload's health probe as its heartbeat records it: dead only by payload's own rule
/// (`launch_spec::records::probes_say_dead`), never by one unhealthy reading.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Probe {
    /// Failed `/health` probes in a row.
    pub failed: u32,
    /// payload's limit (`limits.health_failures`); 0 when its records carry none.
    pub limit: u32,
    /// The heartbeat's time.
    pub at: String,
    /// The last healthy reading.
    pub(crate) last_ok: Option<DateTime<Utc>>,
}

impl Probe {
    fn dead(&self) -> bool {
        self.limit > 0 && launch_spec::records::probes_say_dead(self.failed, self.limit)
    }
}

/// The heartbeat's vLLM counters on one line, for evidence.
pub(crate) fn counters_text(c: &launch_spec::records::EngineCounters) -> String {
    let rate = c.tokens_per_s.map(|r| format!(", {r:.1} tokens/s")).unwrap_or_default();
    let kv = c.kv_cache_usage.map(|k| format!(", KV cache {}", percent(k))).unwrap_or_default();
    let quiet = c
        .no_tokens_for_s
        .map(|s| format!(", no token for {s:.0} s (hung after {} s)", c.hang_after_s))
        .unwrap_or_default();
    format!(
        "vLLM: {} running, {} waiting, {} tokens generated{rate}{kv}{quiet}",
        c.requests_running, c.requests_waiting, c.generation_tokens
    )
}

impl EngineFacts {
    pub(crate) fn total(&self) -> u64 {
        self.ok + self.c4xx + self.c5xx
    }
}

/// What the trials did: the trial dirs (`check`) and/or payload's heartbeat counters.
#[derive(Debug, Clone, Default)]
pub(crate) struct TrialFacts {
    pub scan: Option<TrialScan>,
    /// (started, finished, errored) from the heartbeat.
    pub beat: Option<(u64, u64, u64)>,
    /// payload's `last_progress_at`: the last time a completion or trial counter moved.
    pub last_progress_at: Option<DateTime<Utc>>,
}

impl TrialFacts {
    pub(crate) fn done(&self) -> u64 {
        self.scan.as_ref().map(|s| s.done).or(self.beat.map(|b| b.1)).unwrap_or(0)
    }

    pub(crate) fn active(&self) -> u64 {
        self.scan.as_ref().map(|s| s.active).or(self.beat.map(|b| b.0.saturating_sub(b.1))).unwrap_or(0)
    }

    fn last_result_at(&self) -> Option<DateTime<Utc>> {
        self.scan.as_ref().and_then(|s| s.last_result_at)
    }
}

/// Everything [`evaluate`] looks at.
#[derive(Debug, Clone, Default)]
pub(crate) struct Evidence {
    /// The reference time the run is judged at (`check --now`, the clock by default).
    pub now: Option<DateTime<Utc>>,
    pub payload: StatusRecord,
    pub job: Option<JobFacts>,
    /// When Harbor started (payload's `phase: running` event).
    pub running_since: Option<DateTime<Utc>>,
    pub harbor: HarborFacts,
    pub engine: Option<EngineFacts>,
    pub trials: TrialFacts,
    pub expected_trials: Option<u64>,
    /// The agent's wiring as the files show it (tunnel log, `api_base`, `model_info`); `None`
    /// when no run dir was read.
    pub(crate) wiring: Option<Wiring>,
    /// The completion audit (Harbor's result, or the ledger's metrics).
    pub audit: Option<Audit>,
    /// Whether the run dir has any trial dir (an engine without a log then warns).
    pub(crate) has_trials: bool,
    /// The agent runs in the remote sandbox (openhands, claude-code, …), not on the node.
    pub(crate) installed_agent: bool,
}

/// What [`evaluate`] concluded.
#[derive(Debug, Clone)]
pub(crate) struct Assessment {
    pub state: RunState,
    pub findings: Vec<Finding>,
    /// The summary `status` shows for a healthy run.
    pub(crate) healthy_summary: String,
}

impl Assessment {
    /// The worst finding's level (`check`'s verdict).
    pub(crate) fn level(&self) -> Level {
        self.findings.iter().map(|f| f.level).max().unwrap_or(Level::Ok)
    }

    /// `status`'s verdict: the most severe verdict a finding stands for, and that finding.
    pub(crate) fn verdict(&self) -> (VerdictKind, Option<&Finding>) {
        // The first of equally severe findings wins.
        let mut decisive: Option<&Finding> = None;
        for f in self.findings.iter().filter(|f| f.status.is_some()) {
            if decisive.is_none_or(|d| f.status.map_or(0, rank) > d.status.map_or(0, rank)) {
                decisive = Some(f);
            }
        }
        match decisive {
            Some(f) => (f.status.unwrap_or(VerdictKind::Healthy), Some(f)),
            None if self.state == RunState::Ended => (VerdictKind::Finished, None),
            None => (VerdictKind::Healthy, None),
        }
    }
}

/// Severity order of the verdicts: a terminal record beats everything, then the bad verdicts.
fn rank(v: VerdictKind) -> u8 {
    match v {
        VerdictKind::Healthy => 0,
        VerdictKind::Starting => 1,
        VerdictKind::Stalled => 2,
        VerdictKind::Misconfigured => 3,
        VerdictKind::Dead => 4,
        VerdictKind::Finished => 5,
        VerdictKind::Failed => 6,
    }
}

fn finding(which: FindingId, level: Level, status: VerdictKind, summary: String) -> Finding {
    Finding::new(which, level, summary).stands_for(status)
}

/// Seconds since payload last wrote status.json (its `updated_at` or heartbeat, whichever is newer).
pub(crate) fn status_age_s(status: &RunStatus, now: DateTime<Utc>) -> Option<i64> {
    let updated = parse_time(&status.updated_at);
    let beat = status.heartbeat.as_ref().and_then(|h| parse_time(&h.at));
    let last = updated.into_iter().chain(beat).max()?;
    Some((now - last).num_seconds())
}

/// The findings for one run. Pure.
pub(crate) fn evaluate(ev: &Evidence, s: &VerifySettings) -> Assessment {
    let now = ev.now.unwrap_or_else(Utc::now);
    let mut out = Vec::new();
    let job_text = ev.job.as_ref().and_then(|j| j.job_id.clone()).unwrap_or_else(|| "?".into());
    let done = |state, findings| Assessment { state, findings, healthy_summary: String::new() };

    // 1. The ledger's word on a terminal attempt is final.
    if let Some(f) = ledger_word(ev) {
        return done(RunState::Ended, vec![f]);
    }

    // 2. payload's record.
    let status = ev.payload.status();
    let outcome = status.and_then(|st| st.outcome.as_ref());
    if let Some(o) = outcome {
        out.push(outcome_finding(o));
    }
    if let StatusRecord::Unusable(err) = &ev.payload {
        out.push(unusable_status(err));
    }

    // 3. Slurm (status only), unless payload already recorded how the run ended.
    if outcome.is_none()
        && let Some(state) = slurm_word(ev, s, status, now, &job_text, &mut out)
    {
        return done(state, out);
    }

    // 4. The run's state, and payload's phase.
    let slurm_running = ev.job.as_ref().is_some_and(|j| j.slurm == Some(SlurmView::Running));
    let state = run_state(ev, s, status, outcome.is_some(), slurm_running, now, &job_text, &mut out);

    // 5. Tunnel and api_base: they decide the verdict once Harbor runs (a tunnel still coming up
    //    during startup is not yet a misconfiguration).
    let harbor_runs =
        state == RunState::Running && status.is_none_or(|st| st.phase == Phase::Running && st.heartbeat.is_some());
    let no_scan = TrialScan::default();
    let wiring = ev.wiring.as_ref().map(|w| wiring_findings(w, ev.trials.scan.as_ref().unwrap_or(&no_scan)));
    for mut f in wiring.unwrap_or_default() {
        if f.level == Level::Fail && harbor_runs {
            f.status = Some(VerdictKind::Misconfigured);
        }
        out.push(f);
    }

    // 6. The engine and the trials.
    let served_until = if state == RunState::Running {
        now
    } else {
        status
            .and_then(|st| parse_time(&st.updated_at))
            .or(ev.engine.as_ref().and_then(|e| e.written_at))
            .unwrap_or(now)
            .min(now)
    };
    let judge_running = state == RunState::Running && status.is_none_or(|st| st.phase == Phase::Running);
    let healthy_summary = engine_findings(ev, s, state, judge_running, served_until, now, &mut out);
    trial_findings(ev, s, state, judge_running, now, &mut out);
    if let Some(audit) = ev.audit.as_ref().filter(|_| state == RunState::Ended && ev.job.is_none()) {
        out.push(audit_finding(audit));
    }
    Assessment { state, findings: out, healthy_summary }
}

/// Step 1: the ledger's word on a terminal attempt is final.
fn ledger_word(ev: &Evidence) -> Option<Finding> {
    let job = ev.job.as_ref()?;
    match job.ledger_status {
        AttemptStatus::Finished => {
            let mut f = finding(findings::JOB_FINISHED, Level::Ok, VerdictKind::Finished, "finished".into());
            if let Some(audit) = ev.audit.as_ref().filter(|a| !a.complete) {
                f.summary = format!("finished, incomplete: {}", audit.reasons.join("; "));
                f = f.action("resume rather than accept: resubmit the pair");
            }
            Some(f)
        }
        AttemptStatus::Failed | AttemptStatus::Cancelled => Some(finding(
            findings::JOB_FAILED,
            Level::Fail,
            VerdictKind::Failed,
            format!("{}: {}", job.ledger_status, job.ledger_reason),
        )),
        AttemptStatus::Pending | AttemptStatus::Started => None,
    }
}

/// Step 3: Slurm's word (`status` only) while payload recorded no outcome: a job not yet running, gone,
/// or running without payload's records is judged here, and nothing after.
fn slurm_word(
    ev: &Evidence,
    s: &VerifySettings,
    status: Option<&RunStatus>,
    now: DateTime<Utc>,
    job_text: &str,
    out: &mut Vec<Finding>,
) -> Option<RunState> {
    let job = ev.job.as_ref()?;
    match job.slurm {
        None => {
            out.push(finding(
                findings::JOB_NO_JOB_ID,
                Level::Ok,
                VerdictKind::Starting,
                "not yet in Slurm (no job id on the row)".into(),
            ));
            return Some(RunState::Unknown);
        }
        Some(SlurmView::Queued) => {
            out.push(finding(
                findings::JOB_QUEUED,
                Level::Ok,
                VerdictKind::Starting,
                format!("queued (job {job_text})"),
            ));
            return Some(RunState::Unknown);
        }
        Some(SlurmView::Gone) => {
            out.push(
                finding(findings::JOB_GONE, Level::Fail, VerdictKind::Dead, format!("Slurm no longer runs job {job_text} and payload recorded no outcome"))
                    .evidence(format!("Slurm: {}", job.slurm_state.clone().unwrap_or_else(|| "not listed".into())))
                    .evidence(status.map_or("no status.json".into(), |st| format!("status.json phase {}, updated {}", st.phase.as_str(), st.updated_at)))
                    .action("killed hard (OOM, node failure, KILL after KillWait): `submitter sync` marks it failed (vanished) and the next launch resubmits"),
            );
            return Some(RunState::Ended);
        }
        Some(SlurmView::Running) => {
            if status.is_none() {
                let seen = job.running_seen_at.unwrap_or(now);
                let for_s = (now - seen).num_seconds();
                let why = match &ev.payload {
                    StatusRecord::Unusable(e) => format!("an unusable status.json ({e})"),
                    _ => "a status.json".to_string(),
                };
                if for_s >= s.no_status_after_s as i64 {
                    out.push(
                        finding(findings::JOB_NO_STATUS, Level::Fail, VerdictKind::Dead, format!("RUNNING for {} with {why}: payload's records are missing", human_duration(for_s)))
                            .evidence(format!("job {job_text}: no usable status.json in the run dir"))
                            .action(format!("read the job's Slurm output (`submitter logs {job_text}`); cancel and fix the script or prelude")),
                    );
                } else {
                    out.push(finding(
                        findings::JOB_WAITING,
                        Level::Ok,
                        VerdictKind::Starting,
                        format!("job {job_text} running, waiting for payload's first status.json"),
                    ));
                }
                return Some(RunState::Running);
            }
        }
    }

    None
}

#[allow(clippy::too_many_arguments)]
/// Step 4: the run's state: payload's record (its age and phase), else Harbor's files and Slurm.
fn run_state(
    ev: &Evidence,
    s: &VerifySettings,
    status: Option<&RunStatus>,
    ended: bool,
    slurm_running: bool,
    now: DateTime<Utc>,
    job_text: &str,
    out: &mut Vec<Finding>,
) -> RunState {
    if ended {
        RunState::Ended
    } else if let Some(st) = status {
        let age = status_age_s(st, now).unwrap_or(i64::MAX);
        if age > s.heartbeat_timeout_s as i64 {
            out.push(
                finding(findings::OUTCOME_SILENT, if slurm_running { Level::Fail } else { Level::Warn },
                    VerdictKind::Dead,
                    if slurm_running {
                        format!("no heartbeat for {} while Slurm says RUNNING", human_duration(age))
                    } else {
                        format!("payload stopped writing status.json {} ago without an outcome", human_duration(age))
                    },
                )
                .evidence(format!("status.json phase {}, updated_at {} (heartbeat timeout {}s)", st.phase.as_str(), st.updated_at, s.heartbeat_timeout_s))
                .action(if slurm_running {
                    format!("payload is hung or lost its file system: cancel job {job_text} (`submitter cancel --job {job_text}`) and resubmit")
                } else {
                    "the job was killed hard (OOM, node failure, KILL after KillWait) or is hung: check squeue; `submitter sync` marks a gone job failed".to_string()
                }),
            );
            RunState::Unknown
        } else {
            let (kind, text) = match st.phase {
                Phase::Preparing | Phase::Serving | Phase::Ready => {
                    let since =
                        parse_time(&st.started_at).map_or("?".into(), |t| human_duration((now - t).num_seconds()));
                    (VerdictKind::Starting, format!("payload {} (started {since} ago)", st.phase.as_str()))
                }
                Phase::Stopping => (VerdictKind::Healthy, "stopping: payload is tearing down".to_string()),
                Phase::Done => (VerdictKind::Failed, "payload finished without recording an outcome".to_string()),
                Phase::Running if st.heartbeat.is_none() => {
                    (VerdictKind::Starting, "Harbor started; no heartbeat yet".to_string())
                }
                Phase::Running => {
                    (VerdictKind::Healthy, format!("payload phase running, last status {} ago", human_duration(age)))
                }
            };
            let level = if kind == VerdictKind::Failed { Level::Fail } else { Level::Ok };
            out.push(finding(findings::OUTCOME_RUNNING, level, kind, text));
            RunState::Running
        }
    } else if ev.harbor.finished_at.is_some() {
        out.push(Finding::new(
            findings::OUTCOME_HARBOR_FINISHED,
            Level::Ok,
            format!("Harbor finished at {}", ev.harbor.finished_at.as_deref().unwrap_or("?")),
        ));
        RunState::Ended
    } else if slurm_running {
        RunState::Running
    } else if ev.harbor.present && (ev.trials.active() > 0 || ev.expected_trials.is_some_and(|e| ev.trials.done() < e))
    {
        // No payload records: Harbor has not finished and trials are active or missing. Whether it
        // still moves is the stall rule's question, judged on the last completion and result.
        RunState::Running
    } else {
        RunState::Unknown
    }
}

fn unusable_status(err: &RecordError) -> Finding {
    Finding::new(findings::OUTCOME_UNREADABLE, Level::Warn, format!("payload's status.json is unusable: {err}"))
        .evidence("the run is judged on Harbor's files and the engine log alone")
        .action("a truncated file means payload was killed mid-write or the disk is full; a newer version needs a newer submitter")
}

fn outcome_finding(o: &launch_spec::records::Outcome) -> Finding {
    if o.class == OutcomeClass::Finished {
        return finding(
            findings::OUTCOME_FINISHED,
            Level::Ok,
            VerdictKind::Finished,
            format!("payload: finished ({})", o.message),
        )
        .action("`submitter sync` folds the scores into the ledger");
    }
    let cause = o.cause.as_ref().map(|c| format!("/{c}")).unwrap_or_default();
    let mut f = finding(
        findings::OUTCOME_FAILED,
        Level::Fail,
        VerdictKind::Failed,
        format!("{}{cause} (exit {}): {}", o.class.as_str(), o.exit_code, o.message),
    );
    for line in o.engine_log_tail.iter().rev().take(3).rev() {
        f = f.evidence(format!("vllm.log: {line}"));
    }
    f.action(match o.class {
        OutcomeClass::Walltime | OutcomeClass::Interrupted => "resubmit: Harbor resumes the run",
        OutcomeClass::EngineHung => {
            "the next plan continues the attempt (Harbor resumes the run); if it hangs again, read vllm.log (`submitter logs RUN --engine`)"
        }
        OutcomeClass::EngineStart => "fix the serve settings for this model (registry) before resubmitting",
        _ => "read the logs (`submitter logs RUN`), fix the cause, resubmit; `submitter sync` marks the attempt failed",
    })
}

/// "the engine died", with the cause its fatal line names in payload's words
/// (`launch_spec::rundir::vocab`: the table payload classifies with), when it names one.
fn engine_died_summary(fatal: &str) -> String {
    match launch_spec::rundir::vocab::fatal_cause(fatal) {
        Some(cause) => format!("the engine died (cause: {cause})"),
        None => "the engine died".to_string(),
    }
}

#[allow(clippy::too_many_arguments)]
fn engine_findings(
    ev: &Evidence,
    s: &VerifySettings,
    state: RunState,
    judge_running: bool,
    served_until: DateTime<Utc>,
    now: DateTime<Utc>,
    out: &mut Vec<Finding>,
) -> String {
    let Some(e) = &ev.engine else {
        out.push(
            Finding::new(
                findings::ENGINE_NO_LOG,
                if ev.has_trials { Level::Warn } else { Level::Ok },
                "no engine log and no heartbeat: completions cannot be checked",
            )
            .evidence("no vllm.log and no status.json in the run dir"),
        );
        return "no engine log".into();
    };
    let total = e.total();
    let file = &e.file;
    // How long the engine has served: from Harbor's start (payload), else from the earliest start
    // the files show (server start line, Harbor's job start), to now — or to the end of the run.
    let served_s = e.serving_since.map(|t| (served_until - t).num_seconds().max(0));
    let rate_text = e.per_min.map(|r| format!(", {r:.1}/min")).unwrap_or_default();
    let span_text = served_s.map(|x| format!(" over {}", human_duration(x))).unwrap_or_default();
    let counts = format!(
        "{total} completions{span_text}{rate_text}: {} × 2xx, {} × 4xx, {} × 5xx ({})",
        e.ok, e.c4xx, e.c5xx, e.source
    );
    let share = |n: u64| if total > 0 { n as f64 / total as f64 } else { 0.0 };
    if let Some(fatal) = &e.fatal {
        out.push(
            finding(findings::ENGINE_DIED, Level::Fail, VerdictKind::Dead, engine_died_summary(fatal))
                .evidence(format!("{file}: {fatal}"))
                .action("read the end of vllm.log (`submitter logs RUN --engine`); resubmit after fixing the cause"),
        );
    }
    if let Some(probe) = e.probe.as_ref().filter(|p| p.dead())
        && state == RunState::Running
    {
        let mut f = finding(
            findings::ENGINE_UNHEALTHY,
            Level::Fail,
            VerdictKind::Dead,
            format!("the engine failed {} /health probes in a row", probe.failed),
        )
        .evidence(format!(
            "status.json heartbeat at {}: {} consecutive failed probes (payload's limit, limits.health_failures = {})",
            probe.at, probe.failed, probe.limit
        ))
        .action("payload ends the run at this limit; if the job stays RUNNING, cancel it");
        if let Some(t) = &probe.last_ok {
            f = f.evidence(format!("last healthy heartbeat at {}", t.to_rfc3339()));
        }
        out.push(f);
    }
    // payload's liveness rule, read from its heartbeat: requests in flight and no token for the
    // window is a dead engine at once (payload ends the run at its next beat).
    if let Some((c, at)) = &e.counters
        && c.hung()
        && state == RunState::Running
    {
        out.push(
            finding(
                findings::ENGINE_HUNG,
                Level::Fail,
                VerdictKind::Dead,
                format!(
                    "the engine is hung: {} request(s) in flight and no token for {:.0} s (serve.hang_after_s = {} s)",
                    c.requests_running + c.requests_waiting,
                    c.no_tokens_for_s.unwrap_or(0.0),
                    c.hang_after_s
                ),
            )
            .evidence(format!("status.json heartbeat at {at}: {}", counters_text(c)))
            .action(
                "payload ends the run as engine_hung and the attempt is continued; if the job stays RUNNING, cancel it",
            ),
        );
    }
    let recent = e.recent.as_ref().filter(|r| r.n >= s.min_requests);
    let recent_share = recent.map(|r| r.c4xx as f64 / r.n as f64);
    let overall = share(e.c4xx);
    let bad_overall = total >= s.min_requests && overall > s.bad_request_share;
    let bad_recent = recent_share.is_some_and(|x| x > s.bad_request_share);
    let mut healthy = String::new();
    if bad_overall || bad_recent {
        let mut f = finding(
            findings::ENGINE_BAD_REQUESTS,
            Level::Fail,
            VerdictKind::Misconfigured,
            format!(
                "context overflow: {} of completions answered 400 (> {}){}",
                percent(if bad_recent && !bad_overall { recent_share.unwrap_or(0.0) } else { overall }),
                percent(s.bad_request_share),
                if bad_overall { "" } else { " among the latest" }
            ),
        )
        .evidence(counts.clone());
        if let Some(r) = recent {
            f = f.evidence(format!("{}: {} × 4xx ({})", r.label, r.c4xx, percent(r.c4xx as f64 / r.n as f64)));
        }
        if let Some(line) = &e.example_400 {
            f = f.evidence(format!("{file}: {line}"));
        }
        if let Some(line) = &e.context_error {
            f = f.evidence(format!("{file}: {line}"));
        }
        out.push(f.action("max_model_len or the output budget (max_output_tokens in model_info) is too large for the prompts: lower it in the registry and resubmit"));
    }
    let zero_for = served_s.unwrap_or(0);
    // Zero 200s while the sandbox provider fails the trials are the provider's (their own finding,
    // `trials.sandbox_provider`), not a broken agent setup.
    let provider_outage = ev.trials.scan.as_ref().is_some_and(sandbox_outage);
    if e.ok == 0 && zero_for >= s.zero_ok_after_s as i64 && !provider_outage {
        let mut f = Finding::new(
            findings::ENGINE_ZERO_OK,
            Level::Fail,
            format!(
                "{} served with zero 200 completions: broken agent setup (missing model_info, or an old Harbor)",
                human_duration(zero_for)
            ),
        )
        .evidence(counts.clone());
        // An ended run's outcome decides its verdict; a running one is misconfigured.
        if state != RunState::Ended {
            f.status = Some(VerdictKind::Misconfigured);
        }
        if let Some(since) = e.serving_since {
            f = f.evidence(format!("serving since {}", since.to_rfc3339()));
        }
        if let Some(line) = ev.trials.scan.as_ref().and_then(|t| t.model_info_example.clone()) {
            f = f.evidence(line);
        }
        out.push(f.action(
            "check the agent kwargs (model_info, api_base) in config.json and Harbor's version, then resubmit",
        ));
    } else if !bad_overall && !bad_recent {
        if total >= s.min_requests && share(e.c5xx) > s.server_error_share {
            let mut f = Finding::new(
                findings::ENGINE_SERVER_ERRORS,
                Level::Warn,
                format!("{} of completions failed with 5xx", percent(share(e.c5xx))),
            )
            .evidence(counts.clone());
            if let Some(line) = &e.example_5xx {
                f = f.evidence(format!("{file}: {line}"));
            }
            out.push(f.action("read vllm.log around the errors (`submitter logs RUN --engine`)"));
        } else {
            let active = ev.trials.active();
            let quiet = e.last_completion_at.map(|t| (now - t).num_seconds());
            let slow =
                judge_running && active > 0 && e.per_min.is_some_and(|r| r < 1.0) && served_s.is_some_and(|x| x >= 600);
            let stopped =
                judge_running && active > 0 && total > 0 && quiet.is_some_and(|q| q >= s.stall_after_s as i64);
            let summary = if total == 0 {
                "no completions yet".to_string()
            } else if stopped {
                format!("no completion for {} while {active} trials are active", human_duration(quiet.unwrap_or(0)))
            } else if slow {
                format!(
                    "completions arrive slowly ({}/min) while {active} trials are active",
                    e.per_min.map_or("?".into(), |r| format!("{r:.2}"))
                )
            } else if state == RunState::Running {
                format!("completions arriving, {} answered 200", percent(share(e.ok)))
            } else {
                format!("{total} completions, {} answered 200", percent(share(e.ok)))
            };
            let mut f = Finding::new(
                findings::ENGINE_COMPLETIONS,
                if slow || stopped { Level::Warn } else { Level::Ok },
                summary,
            )
            .evidence(counts.clone());
            if let Some(r) = e.recent.as_ref().filter(|r| r.n > 0) {
                f = f.evidence(format!("{}: {} × 2xx, {} × 4xx, {} × 5xx", r.label, r.ok, r.c4xx, r.c5xx));
            }
            if let Some((c, _)) = &e.counters {
                f = f.evidence(counters_text(c));
            }
            if let Some(t) = e.last_completion_at {
                f = f.evidence(format!(
                    "last completion at {} ({} before the reference time)",
                    t.to_rfc3339(),
                    human_duration((now - t).num_seconds())
                ));
            }
            if slow || stopped {
                f = f.action("look at the agent's trial.log files and vLLM's throughput lines");
            }
            out.push(f);
        }
        let rate = e.per_min.map_or_else(|| "-".to_string(), |r| format!("{r:.1} completions/min"));
        let ok_share = match e.recent.as_ref().filter(|r| r.n > 0) {
            Some(r) => r.ok as f64 / r.n as f64,
            None => share(e.ok),
        };
        healthy = if total == 0 {
            "no completions yet".into()
        } else {
            format!("{rate}, {} answered 200", percent(ok_share))
        };
    }
    healthy
}

fn trial_findings(
    ev: &Evidence,
    s: &VerifySettings,
    state: RunState,
    judge_running: bool,
    now: DateTime<Utc>,
    out: &mut Vec<Finding>,
) {
    let t = &ev.trials;
    let expected = ev.expected_trials;
    let expected_text = expected.map(|e| format!(" of {e}")).unwrap_or_default();
    let (done, active) = (t.done(), t.active());
    if let Some(scan) = &t.scan {
        let infra: u64 = scan
            .errors_by_type
            .iter()
            .filter(|(k, _)| launch_spec::spec::INFRA_ERROR_TYPES.contains(&k.as_str()))
            .map(|(_, v)| v)
            .sum();
        let queued = if scan.queued > 0 { format!(", {} queued", scan.queued) } else { String::new() };
        let mut progress = Finding::new(
            findings::TRIALS_PROGRESS,
            Level::Ok,
            format!(
                "{} done{expected_text}, {} active{queued}, {} errored ({infra} infra)",
                scan.done, scan.active, scan.errored
            ),
        );
        if !scan.errors_by_type.is_empty() {
            let types: Vec<String> = scan.errors_by_type.iter().map(|(k, v)| format!("{k} × {v}")).collect();
            progress = progress.evidence(format!("errors: {}", types.join(", ")));
        }
        if let (Some(at), Some(trial)) = (scan.last_result_at, &scan.last_result_trial) {
            progress = progress
                .evidence(format!("last result.json {} ago ({trial})", human_duration((now - at).num_seconds())));
        }
        out.push(progress);
        if let Some((trial, error)) = scan.sandbox_example.as_ref().filter(|_| scan.sandbox_failures > 0) {
            let level = if sandbox_outage(scan) { Level::Fail } else { Level::Warn };
            out.push(
                Finding::new(
                    findings::TRIALS_SANDBOX_PROVIDER,
                    level,
                    format!(
                        "the sandbox provider failed {} of {} finished trials (not the agent's setup): {error}",
                        scan.sandbox_failures, scan.done
                    ),
                )
                .evidence(format!("{trial}/result.json: {error}"))
                .action("the provider refused or timed out: check its key in the secrets file (`Bearer token is invalid`: a wrong or expired DAYTONA_API_KEY) and its status; remediation retries the pair after remediation.provider_wait_s, at most remediation.max_retries times"),
            );
        }
        if scan.instant_failures > 0 {
            let fail = scan.instant_failures >= 3
                && scan.instant_failures as f64 > s.instant_fail_share * scan.done.max(1) as f64;
            let mut f = Finding::new(
                findings::TRIALS_INSTANT_FAIL,
                if fail { Level::Fail } else { Level::Warn },
                format!(
                    "{} of {} finished trials failed instantly (no output tokens, the agent ended ≈ when it started)",
                    scan.instant_failures, scan.done
                ),
            );
            // `check`'s alone: `status` reads no trial dirs, and the verdicts must agree.
            if let Some(e) = &scan.instant_example {
                f = f.evidence(e.clone());
            }
            let types: Vec<String> = scan.instant_types.iter().map(|(k, v)| format!("{k} × {v}")).collect();
            f = f.evidence(format!("by exception: {}", types.join(", ")));
            let overflow: u64 = scan
                .instant_types
                .iter()
                .filter(|(k, _)| k.contains("ContextLength") || k.contains("BadRequest"))
                .map(|(_, v)| v)
                .sum();
            out.push(f.action(if overflow * 2 > scan.instant_failures {
                "they died on their first request's 400 (context overflow): lower max_model_len / the output budget, see the engine check"
            } else {
                "the agent never got an answer from the model: check api_base, model_info and the sandbox provider (Daytona) errors"
            }));
        }
        if scan.unconstructed > 0 && scan.model_info_warnings > 0 {
            let mut f = Finding::new(
                findings::TRIALS_NEVER_STARTED,
                Level::Fail,
                format!(
                    "{} trial dir(s) were never constructed: the agent rejected its configuration",
                    scan.unconstructed
                ),
            );
            if let Some(e) = &scan.model_info_example {
                f = f.evidence(e.clone());
            }
            out.push(f.action("pass model_info in the agent kwargs (payload does this) and resubmit"));
        }
    }
    // Active trials without the harness's first command dir; the oldest by its config.json time.
    let setup_pending = t.scan.iter().flat_map(|scan| &scan.running).filter(|(_, r)| !r.agent_started);
    let oldest_setup = setup_pending
        .clone()
        .filter_map(|(name, r)| Some((DateTime::<Utc>::from(r.config_modified?), name)))
        .min_by_key(|(since, _)| *since);
    if judge_running
        && ev.installed_agent
        && let Some((since, trial)) = oldest_setup
        && (now - since).num_seconds() >= s.setup_stalled_after_s as i64
    {
        out.push(
            finding(
                findings::TRIALS_SETUP_STALLED,
                Level::Fail,
                VerdictKind::Stalled,
                format!(
                    "{} running trial(s) of an installed agent have no {}/ (setup stalled): the oldest for {}",
                    setup_pending.count(),
                    launch_spec::rundir::harbor::AGENT_FIRST_COMMAND,
                    human_duration((now - since).num_seconds())
                ),
            )
            .evidence(format!("{trial}/config.json written {}", since.to_rfc3339()))
            .action("the harness never finished installing in the sandbox: read the trial's trial.log and agent/ setup output; check the sandbox provider, then cancel and resubmit"),
        );
    }
    let all_done = expected.is_some_and(|e| done >= e) && active == 0;
    if judge_running {
        // The last sign of life: payload's last progress, the last completion, the newest result.
        let last_completion = ev.engine.as_ref().and_then(|e| e.last_completion_at);
        let last_result = t.last_result_at();
        let last = [t.last_progress_at, last_completion, last_result].into_iter().flatten().max();
        let since_start =
            ev.running_since.or(ev.engine.as_ref().and_then(|e| e.serving_since)).or(ev.harbor.started_at);
        let quiet = last.or(since_start).map(|x| (now - x).num_seconds());
        let basis = || {
            let mut parts = Vec::new();
            if let Some(x) = t.last_progress_at {
                parts.push(format!("payload's last progress {}", x.to_rfc3339()));
            }
            if let Some(x) = last_completion {
                parts.push(format!("last completion {}", x.to_rfc3339()));
            }
            if let (Some(x), Some(name)) = (last_result, t.scan.as_ref().and_then(|s| s.last_result_trial.as_ref())) {
                parts.push(format!("last result.json {} ({name})", x.to_rfc3339()));
            }
            if parts.is_empty() {
                parts.push("nothing moved since Harbor started".into());
            }
            parts.join("; ")
        };
        let result_quiet = last_result.map(|x| (now - x).num_seconds());
        if all_done && done > 0 && quiet.is_some_and(|q| q >= s.zombie_after_s as i64) {
            out.push(
                finding(findings::TRIALS_ZOMBIE, Level::Fail, VerdictKind::Stalled, format!("all {done} trials are done {} ago but the job still runs (zombie)", human_duration(quiet.unwrap_or(0))))
                    .evidence(basis())
                    .action("Harbor is hung after its last trial: cancel the job (`submitter cancel --job ID`); its results are complete"),
            );
        } else if !all_done && quiet.is_some_and(|q| q >= s.stall_after_s as i64) {
            out.push(
                finding(findings::TRIALS_STALLED, Level::Fail, VerdictKind::Stalled, format!("no completion and no trial progress for {} while {active} trials are active (stalled)", human_duration(quiet.unwrap_or(0))))
                    .evidence(basis())
                    .action("look at an active trial's trial.log and the engine log; cancel and resubmit (resume) if nothing moves"),
            );
        } else if active > 0
            && result_quiet
                .or(since_start.map(|x| (now - x).num_seconds()))
                .is_some_and(|q| q >= s.no_result_after_s as i64)
            && t.scan.is_some()
        {
            out.push(
                Finding::new(findings::TRIALS_STALLED, Level::Fail, format!("no new result.json for {} while {active} trials are active (stalled)", human_duration(result_quiet.unwrap_or(0))))
                    .evidence(basis())
                    .action("completions arrive but no trial finishes: look at an active trial's trial.log (an agent looping?); cancel and resubmit if nothing moves"),
            );
        }
    } else if state == RunState::Unknown && all_done && done > 0 && ev.job.is_none() {
        out.push(
            Finding::new(
                findings::TRIALS_DONE_UNRECORDED,
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

fn audit_finding(audit: &Audit) -> Finding {
    let mut f = Finding::new(
        findings::AUDIT_COMPLETION,
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

// ---------------------------------------------------------------------------------------------
// The agent's wiring: tunnel, api_base, model_info

/// What the files say of the agent's wiring (`check::evidence_from_dir` gathers it); the tunnel
/// and `api_base` rules judge it in [`evaluate`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Wiring {
    pub agent: Agent,
    /// The agent runs in the remote sandbox and calls the model back over the tunnel.
    pub remote: bool,
    /// The run dir, for evidence lines.
    pub run_dir: String,
    /// The tunnel log's reading; `None` when the run dir has none.
    pub tunnel: Option<TunnelLog>,
    /// The Pinggy pair payload took (last `tunnel_pair` event).
    pub(crate) held_url: Option<String>,
    /// `launch.json`'s `tunnel.public_url`.
    pub(crate) launch_public_url: Option<String>,
    /// Whether the `api_base` rules apply (`check` always; `status` once Harbor wrote its config).
    pub(crate) api_base_read: bool,
    /// The engine log could not be read: (error, path).
    pub(crate) engine_log_unreadable: Option<(String, String)>,
    /// `status` reads only the failures of these rules (every job, every refresh).
    pub(crate) fails_only: bool,
}

/// The wiring rules' findings, in `check`'s order.
fn wiring_findings(w: &Wiring, trials: &TrialScan) -> Vec<Finding> {
    let mut out = Vec::new();
    tunnel_findings(w, &mut out);
    if w.api_base_read {
        api_base_findings(w, trials, &mut out);
    }
    if let Some((err, path)) = &w.engine_log_unreadable {
        out.push(
            Finding::new(findings::ENGINE_LOG_UNREADABLE, Level::Fail, format!("engine log cannot be read: {err}"))
                .evidence(path.clone())
                .action("make it a regular file payload can write and this user can read; the engine was not judged"),
        );
    }
    if w.fails_only {
        out.retain(|f| f.level == Level::Fail);
    }
    out
}

/// The tunnel rules, on the tunnel log's facts.
fn tunnel_findings(w: &Wiring, findings: &mut Vec<Finding>) {
    let agent_name = w.agent.display_name();
    let needed = w.remote;
    let Some(log) = &w.tunnel else {
        findings.push(if needed {
            Finding::new(
                findings::TUNNEL_MISSING,
                Level::Fail,
                format!("{agent_name} runs in the sandbox and needs a public tunnel, but there is no tunnel log"),
            )
            .evidence(format!("no {} or pinggy_*.log in {}", launch_spec::records::TUNNEL_LOG, w.run_dir))
            .action("configure a Pinggy pair for this cluster (network.pinggy) and resubmit")
        } else {
            Finding::new(
                findings::TUNNEL_NOT_NEEDED,
                Level::Ok,
                format!("not needed: {agent_name} calls vLLM on the node"),
            )
        });
        return;
    };
    let path = &log.path;
    let file = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if let Some(line) = &log.locked {
        findings.push(
            Finding::new(findings::TUNNEL_LOCKED, Level::Fail, "token locked: a tunnel with the same token is already active elsewhere")
                .evidence(format!("{file}: {line}"))
                .action("cancel this job and resubmit with the next free Pinggy pair (or end the stale session holding the token)"),
        );
        return;
    }
    let established =
        log.authenticated.is_some() || log.allocated.is_some() || log.public_url.is_some() || log.verified.is_some();
    if !established {
        let mut f = Finding::new(
            findings::TUNNEL_NOT_ESTABLISHED,
            if needed { Level::Fail } else { Level::Warn },
            "the tunnel never came up (no `You are authenticated`, no URL, no allocated port)",
        );
        for e in &log.errors {
            f = f.evidence(format!("{file}: {e}"));
        }
        findings
            .push(f.action("read the tunnel log; check the token secret and that port 443 egress works from the node"));
        return;
    }
    let mut ok = Finding::new(findings::TUNNEL_AUTHENTICATED, Level::Ok, "tunnel up");
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
                Finding::new(findings::TUNNEL_TRAFFIC, Level::Ok, "traffic counters growing")
                    .evidence(growing.join(", ")),
            );
        } else if samples >= 2 && needed {
            let flat: Vec<String> =
                log.counters.iter().map(|(k, (_, l, n))| format!("{k}: {l} ({n} readings)")).collect();
            findings.push(
                Finding::new(findings::TUNNEL_TRAFFIC, Level::Warn, "no traffic through the tunnel: counters flat")
                    .evidence(flat.join(", "))
                    .action("check that the agent's api_base is the tunnel URL and that the sandbox can reach it"),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// api_base and model_info

/// The `api_base` and `model_info` rules, on the agent's config and the trial configs' values.
fn api_base_findings(w: &Wiring, trials: &TrialScan, findings: &mut Vec<Finding>) {
    let agent = &w.agent;
    let agent_name = agent.display_name();
    let installed = w.remote;
    let hosted = agent.model_name.as_deref().is_some_and(|m| m.to_ascii_lowercase().starts_with("hosted_vllm/"));
    if agent.from != "config.json" {
        if trials.dirs == 0 {
            findings.push(Finding::new(
                findings::API_BASE_UNKNOWN,
                Level::Ok,
                "Harbor has not written its job config.json yet",
            ));
            return;
        }
    } else if hosted && !agent.has_model_info {
        let mut f = Finding::new(findings::API_BASE_MODEL_INFO, Level::Fail,
            "model_info missing from the agent kwargs: terminus-2 then assumes LiteLLM's 1,000,000-token context, never summarises and its long trials end in context-overflow 400s (Harbor before 0.25 rejected the agent outright)",
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
    let public = w
        .held_url
        .clone()
        .or_else(|| w.tunnel.as_ref().and_then(|t| t.public_url.clone()))
        .or_else(|| w.launch_public_url.clone());
    let mut bad = false;
    let judge = |url: &str, place: String, count: u64| -> Option<Finding> {
        if installed && is_private_url(url) {
            return Some(
                Finding::new(findings::API_BASE_PRIVATE, Level::Fail, format!("{agent_name} runs in the remote sandbox but api_base is a private address: the tunnel is not wired"))
                    .evidence(format!("{place}: \"api_base\": \"{url}\"{}", if count > 1 { format!(" ({count} trials)") } else { String::new() }))
                    .action("set api_base to the tunnel's public URL (https://<id>.a.pinggy.link/v1) and resume"),
            );
        }
        if installed
            && let Some(public) = &public
            && !url.starts_with(public.trim_end_matches('/'))
        {
            return Some(
                Finding::new(findings::API_BASE_NOT_TUNNEL, Level::Fail, "api_base is not the tunnel's public URL")
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
                findings::API_BASE_MISSING,
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
                Finding::new(findings::API_BASE_STALE, Level::Fail, format!("{count} trial config(s) point at another server than the job config: a stale api_base from an earlier run"))
                    .evidence(format!("{example}/config.json: \"api_base\": \"{url}\"; config.json: \"{job_url}\""))
                    .action("rewrite api_base in every trial config.json (payload does this on resume), or Harbor refuses to resume / calls a dead server"),
            );
            bad = true;
        }
    }
    if !bad {
        let url = agent.api_base.clone().or_else(|| trials.api_bases.keys().next().cloned());
        let mut f = Finding::new(
            findings::API_BASE_OK,
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
