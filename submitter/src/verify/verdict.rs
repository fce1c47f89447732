//! One verdict per job, continuously: payload's heartbeat (status.json), Slurm's state and the
//! previous observation → `starting`, `healthy`, `stalled`, `dead`, `misconfigured`, `finished` or
//! `failed`, with the evidence. [`judge`] is a pure function; the observation files that carry
//! the previous heartbeats between `status` calls are at the bottom.
//!
//! Heartbeat counters are cumulative, so rates need an earlier reading: each `status` call keeps
//! the distinct heartbeats it saw (at most an hour) in `<state dir>/observations/attempt-<id>.json`,
//! and [`judge`] measures over the shortest recent window holding at least `min_requests`
//! completions (the cumulative counts since Harbor started when there is no earlier reading).

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use launch_spec::records::{Heartbeat, OutcomeClass, Phase, RunStatus};
use serde::{Deserialize, Serialize};

use super::results::Audit;
use super::{Finding, VerifySettings, human_duration, parse_time, percent};
use crate::config::cluster::AutoCancel;
use crate::domain::SlurmView;
use crate::ledger::Status;

/// A job's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// Queued, or payload is preparing / loading the engine.
    Starting,
    /// Completions arriving, trials progressing.
    Healthy,
    /// No completions and no trial progress for `stall_after_s`, or all trials done while the job runs.
    Stalled,
    /// The engine fails its health probe, payload stopped writing, or Slurm lost the job.
    Dead,
    /// A 400 storm, zero 200s after `zero_ok_after_s`, or a wrong `api_base` / locked tunnel.
    Misconfigured,
    Finished,
    Failed,
}

impl VerdictKind {
    pub fn as_str(self) -> &'static str {
        match self {
            VerdictKind::Starting => "starting",
            VerdictKind::Healthy => "healthy",
            VerdictKind::Stalled => "stalled",
            VerdictKind::Dead => "dead",
            VerdictKind::Misconfigured => "misconfigured",
            VerdictKind::Finished => "finished",
            VerdictKind::Failed => "failed",
        }
    }

    /// The verdicts an operator must act on.
    pub fn is_bad(self) -> bool {
        matches!(self, VerdictKind::Stalled | VerdictKind::Dead | VerdictKind::Misconfigured)
    }
}

impl std::fmt::Display for VerdictKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One heartbeat reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub at: DateTime<Utc>,
    pub ok: u64,
    pub c4xx: u64,
    pub c5xx: u64,
    pub trials_started: u64,
    pub trials_finished: u64,
    pub trials_errored: u64,
    pub healthy: bool,
}

impl Sample {
    pub fn from_heartbeat(hb: &Heartbeat) -> Option<Sample> {
        Some(Sample {
            at: parse_time(&hb.at)?,
            ok: hb.completions_ok,
            c4xx: hb.completions_4xx,
            c5xx: hb.completions_5xx,
            trials_started: hb.trials_started,
            trials_finished: hb.trials_finished,
            trials_errored: hb.trials_errored,
            healthy: hb.engine_healthy,
        })
    }

    fn total(&self) -> u64 {
        self.ok + self.c4xx + self.c5xx
    }
}

/// What `status` remembers about one attempt between calls.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Distinct heartbeats, oldest first (at most an hour, at most [`MAX_SAMPLES`]).
    #[serde(default)]
    pub samples: Vec<Sample>,
    /// When this attempt was first observed, and first observed RUNNING in Slurm.
    #[serde(default)]
    pub first_seen: Option<DateTime<Utc>>,
    #[serde(default)]
    pub running_seen_at: Option<DateTime<Utc>>,
    /// The last verdict and since when it has held without interruption.
    #[serde(default)]
    pub verdict: Option<VerdictKind>,
    #[serde(default)]
    pub verdict_since: Option<DateTime<Utc>>,
    #[serde(default)]
    pub observed_at: Option<DateTime<Utc>>,
}

pub const MAX_SAMPLES: usize = 256;
const SAMPLE_HORIZON_S: i64 = 3600;

/// Everything [`judge`] looks at.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// payload's status.json, only when it belongs to this attempt (same Slurm job id).
    pub status: Option<&'a RunStatus>,
    /// Slurm's view of the job; `None` while the attempt has no job id.
    pub slurm: Option<SlurmView>,
    /// Slurm's state name, for the evidence (`RUNNING`, `CANCELLED`, …).
    pub slurm_state: Option<String>,
    pub job_id: Option<String>,
    /// The ledger row.
    pub attempt_status: Status,
    pub attempt_reason: &'a str,
    /// When sync saw the job start (ledger `started_at`).
    pub started_at: Option<DateTime<Utc>>,
    /// When Harbor started (events.jsonl).
    pub running_since: Option<DateTime<Utc>>,
    /// n_tasks × n_attempts when known.
    pub expected_trials: Option<u64>,
    /// Tunnel / api_base problems from the run dir's files ([`super::check::config_problems`]).
    pub config_problems: &'a [Finding],
    /// The completion audit of a finished attempt (from its ledger metrics).
    pub audit: Option<&'a Audit>,
    pub previous: Option<&'a Observation>,
    pub now: DateTime<Utc>,
    pub settings: &'a VerifySettings,
}

/// Completions and trials over a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rate {
    pub window_s: i64,
    pub completions: u64,
    pub ok: u64,
    pub c4xx: u64,
    pub c5xx: u64,
    pub per_min: f64,
    pub trials_finished: u64,
    /// Whether the window starts at an earlier heartbeat (else: cumulative since Harbor started).
    pub from_previous: bool,
}

/// A job's verdict with the evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobVerdict {
    pub verdict: VerdictKind,
    pub summary: String,
    pub evidence: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Since when this verdict has held (as observed).
    pub since: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// Trials finished / expected, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trials_finished: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trials_expected: Option<u64>,
}

/// One line of `status`: the ledger row joined with Slurm and payload's records, and its verdict.
#[derive(Debug, Clone, Serialize)]
pub struct StatusRow {
    pub attempt: i64,
    pub model: String,
    pub benchmark: String,
    pub cluster: String,
    pub run_tag: String,
    pub run_dir: Option<String>,
    pub ledger_status: Status,
    pub ledger_reason: String,
    pub slurm_job_id: Option<String>,
    /// Slurm's state (`PENDING`, `RUNNING`, …), `gone` when Slurm no longer lists the job, `-`
    /// without a job id.
    pub slurm: String,
    #[serde(skip)]
    pub slurm_view: Option<SlurmView>,
    /// payload's phase from status.json, `-` without one.
    pub phase: String,
    pub verdict: JobVerdict,
    /// Set when `status --watch` cancelled the job under the profile's `verify.auto_cancel`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<String>,
    /// For a walltime continuation: the attempt it continues and its place in the chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continues: Option<crate::domain::Continuation>,
}

struct Draft {
    verdict: VerdictKind,
    summary: String,
    evidence: Vec<String>,
    action: Option<String>,
}

fn draft(verdict: VerdictKind, summary: impl Into<String>) -> Draft {
    Draft { verdict, summary: summary.into(), evidence: Vec::new(), action: None }
}

impl Draft {
    fn ev(mut self, e: impl Into<String>) -> Self {
        self.evidence.push(e.into());
        self
    }
    fn act(mut self, a: impl Into<String>) -> Self {
        self.action = Some(a.into());
        self
    }
}

/// The verdict for one job and the observation to keep for the next call. Pure.
pub fn judge(inputs: &Inputs) -> (JobVerdict, Observation) {
    let now = inputs.now;
    let mut obs = inputs.previous.cloned().unwrap_or_default();
    obs.first_seen.get_or_insert(now);
    obs.observed_at = Some(now);
    if inputs.slurm == Some(SlurmView::Running) {
        obs.running_seen_at.get_or_insert(now);
    }
    let heartbeat = inputs.status.and_then(|s| s.heartbeat.as_ref());
    let current = heartbeat.and_then(Sample::from_heartbeat);
    let (draft, rate) = decide(inputs, &obs, current.as_ref());
    if let Some(sample) = current
        && obs.samples.last().is_none_or(|last| sample.at > last.at)
    {
        obs.samples.push(sample);
    }
    if let Some(newest) = obs.samples.last().map(|s| s.at) {
        obs.samples.retain(|s| (newest - s.at).num_seconds() <= SAMPLE_HORIZON_S);
    }
    if obs.samples.len() > MAX_SAMPLES {
        let cut = obs.samples.len() - MAX_SAMPLES;
        obs.samples.drain(..cut);
    }
    let since = match (obs.verdict, obs.verdict_since) {
        (Some(v), Some(since)) if v == draft.verdict => since,
        _ => now,
    };
    obs.verdict = Some(draft.verdict);
    obs.verdict_since = Some(since);
    let verdict = JobVerdict {
        verdict: draft.verdict,
        summary: draft.summary,
        evidence: draft.evidence,
        action: draft.action,
        since,
        rate,
        trials_finished: heartbeat.map(|h| h.trials_finished),
        trials_expected: inputs.expected_trials,
    };
    (verdict, obs)
}

fn decide(inputs: &Inputs, obs: &Observation, current: Option<&Sample>) -> (Draft, Option<Rate>) {
    let now = inputs.now;
    let s = inputs.settings;
    let job = inputs.job_id.clone().unwrap_or_else(|| "?".into());
    // The ledger's word on a terminal attempt is final.
    match inputs.attempt_status {
        Status::Finished => {
            let mut d = draft(VerdictKind::Finished, "finished");
            if let Some(audit) = inputs.audit
                && !audit.complete
            {
                d.summary = format!("finished, incomplete: {}", audit.reasons.join("; "));
                d = d.act("resume rather than accept: resubmit the pair");
            }
            return (d, None);
        }
        Status::Failed | Status::Cancelled => {
            return (draft(VerdictKind::Failed, format!("{}: {}", inputs.attempt_status, inputs.attempt_reason)), None);
        }
        Status::Pending | Status::Started => {}
    }
    let status = inputs.status;
    if let Some(outcome) = status.and_then(|st| st.outcome.as_ref()) {
        let d = if outcome.class == OutcomeClass::Finished {
            draft(VerdictKind::Finished, format!("finished (payload: {})", outcome.message))
                .act("`submitter sync` folds the scores into the ledger")
        } else {
            let cause = outcome.cause.as_ref().map(|c| format!("/{c}")).unwrap_or_default();
            let mut d = draft(VerdictKind::Failed, format!("{}{cause}: {}", outcome.class.as_str(), outcome.message))
                .ev(format!("payload exit code {}", outcome.exit_code))
                .act("`submitter sync` marks the attempt failed; the next launch resubmits it");
            if let Some(line) = outcome.engine_log_tail.last() {
                d = d.ev(format!("vllm.log: {line}"));
            }
            d
        };
        return (d, None);
    }
    match inputs.slurm {
        None => return (draft(VerdictKind::Starting, "not yet in Slurm (no job id on the row)"), None),
        Some(SlurmView::Queued) => return (draft(VerdictKind::Starting, format!("queued (job {job})")), None),
        Some(SlurmView::Gone) => {
            return (
                draft(VerdictKind::Dead, format!("Slurm no longer runs job {job} and payload recorded no outcome"))
                    .ev(format!("Slurm: {}", inputs.slurm_state.clone().unwrap_or_else(|| "not listed".into())))
                    .ev(status.map_or("no status.json".into(), |st| format!("status.json phase {}, updated {}", phase_name(st.phase), st.updated_at)))
                    .act("killed hard (OOM, node failure, KILL after KillWait): `submitter sync` marks it failed (vanished) and the next launch resubmits"),
                None,
            );
        }
        Some(SlurmView::Running) => {}
    }
    let seen_running = [obs.running_seen_at, inputs.started_at].into_iter().flatten().min().unwrap_or(now);
    let Some(status) = status else {
        let for_s = (now - seen_running).num_seconds();
        if for_s >= s.no_status_after_s as i64 {
            return (
                draft(
                    VerdictKind::Dead,
                    format!(
                        "RUNNING for {} without a status.json: the batch script never reached payload",
                        human_duration(for_s)
                    ),
                )
                .ev(format!("job {job}: no status.json in the run dir"))
                .act(format!(
                    "read the job's Slurm output (`submitter logs {job}`); cancel and fix the script or prelude"
                )),
                None,
            );
        }
        return (
            draft(VerdictKind::Starting, format!("job {job} running, waiting for payload's first status.json")),
            None,
        );
    };
    let age = super::check::status_age_s(status, now).unwrap_or(i64::MAX);
    if age > s.heartbeat_timeout_s as i64 {
        return (
            draft(VerdictKind::Dead, format!("no heartbeat for {} while Slurm says RUNNING", human_duration(age)))
                .ev(format!("status.json updated_at {}, phase {}", status.updated_at, phase_name(status.phase)))
                .ev(format!("heartbeat timeout {}s", s.heartbeat_timeout_s))
                .act(format!("payload is hung or lost its file system: cancel job {job} (`submitter cancel --job {job}`) and resubmit")),
            None,
        );
    }
    match status.phase {
        Phase::Preparing | Phase::Serving | Phase::Ready => {
            let since = parse_time(&status.started_at)
                .map(|t| human_duration((now - t).num_seconds()))
                .unwrap_or_else(|| "?".into());
            return (
                draft(VerdictKind::Starting, format!("payload {} (started {since} ago)", phase_name(status.phase))),
                None,
            );
        }
        Phase::Stopping => return (draft(VerdictKind::Healthy, "stopping: payload is tearing down"), None),
        Phase::Done => {
            return (
                draft(VerdictKind::Failed, "payload finished without recording an outcome")
                    .ev(format!("status.json updated_at {}", status.updated_at)),
                None,
            );
        }
        Phase::Running => {}
    }
    let Some(current) = current else {
        return (draft(VerdictKind::Starting, "Harbor started; no heartbeat yet"), None);
    };
    let harbor_since = inputs.running_since.or_else(|| parse_time(&status.started_at)).unwrap_or(current.at);
    let rate = window(obs, current, harbor_since, s.min_requests);
    let counts = format!(
        "{} completions ({} × 2xx, {} × 4xx, {} × 5xx); trials {} started, {} finished, {} errored",
        current.total(),
        current.ok,
        current.c4xx,
        current.c5xx,
        current.trials_started,
        current.trials_finished,
        current.trials_errored
    );
    let rate_text = |r: &Rate| {
        format!(
            "last {}: {} completions ({:.1}/min), {} × 4xx, {} × 5xx, {} trials finished",
            human_duration(r.window_s),
            r.completions,
            r.per_min,
            r.c4xx,
            r.c5xx,
            r.trials_finished
        )
    };
    if !current.healthy {
        let mut d = draft(VerdictKind::Dead, "the engine fails its /health probe")
            .ev(format!("heartbeat at {}: engine_healthy false", current.at.to_rfc3339()))
            .act(format!(
                "payload ends the run after its consecutive-failure limit; if the job stays RUNNING, cancel job {job}"
            ));
        if let Some(prev) = obs.samples.iter().rev().find(|p| p.healthy) {
            d = d.ev(format!("last healthy heartbeat at {}", prev.at.to_rfc3339()));
        }
        return (d, Some(rate));
    }
    if let Some(problem) = inputs.config_problems.first() {
        let mut d = draft(VerdictKind::Misconfigured, problem.summary.clone());
        for e in &problem.evidence {
            d = d.ev(e.clone());
        }
        if let Some(a) = &problem.action {
            d = d.act(a.clone());
        }
        return (d, Some(rate));
    }
    // The 400 share: over the window when it holds enough completions, else cumulative.
    let share_basis = if rate.completions >= s.min_requests {
        Some((rate.c4xx, rate.completions, rate_text(&rate)))
    } else if current.total() >= s.min_requests {
        Some((current.c4xx, current.total(), counts.clone()))
    } else {
        None
    };
    if let Some((bad, total, text)) = share_basis {
        let share = bad as f64 / total as f64;
        if share > s.bad_request_share {
            return (
                draft(VerdictKind::Misconfigured, format!("context overflow: {} of completions answered 400 (> {})", percent(share), percent(s.bad_request_share)))
                    .ev(text)
                    .ev(counts)
                    .act("max_model_len or the output budget is too large for the prompts: cancel, lower them in the registry, resubmit"),
                Some(rate),
            );
        }
    }
    let harbor_for = (now - harbor_since).num_seconds();
    if current.ok == 0 && harbor_for >= s.zero_ok_after_s as i64 {
        return (
            draft(
                VerdictKind::Misconfigured,
                format!(
                    "Harbor running for {} with zero 200 completions: broken agent setup (missing model_info?)",
                    human_duration(harbor_for)
                ),
            )
            .ev(counts)
            .act("check the agent kwargs (model_info, api_base) with `submitter check RUN_DIR`; cancel and resubmit"),
            Some(rate),
        );
    }
    let last_progress = status
        .heartbeat
        .as_ref()
        .and_then(|h| h.last_progress_at.as_deref())
        .and_then(parse_time)
        .unwrap_or(harbor_since);
    let quiet = (now - last_progress).num_seconds();
    if let Some(expected) = inputs.expected_trials
        && current.trials_finished >= expected
        && current.trials_started <= current.trials_finished
        && quiet >= s.zombie_after_s as i64
    {
        return (
            draft(VerdictKind::Stalled, format!("all {expected} trials done {} ago but the job still runs (zombie)", human_duration(quiet)))
                .ev(counts)
                .act(format!("Harbor hangs after its last trial: cancel job {job}; the results are complete (`submitter sync` after it ends)")),
            Some(rate),
        );
    }
    if quiet >= s.stall_after_s as i64 {
        return (
            draft(VerdictKind::Stalled, format!("no completion and no trial progress for {}", human_duration(quiet)))
                .ev(format!("last progress at {}", last_progress.to_rfc3339()))
                .ev(counts)
                .act(format!("look at `submitter logs {job} --harbor` and `--engine`; cancel and resubmit (it resumes) if nothing moves")),
            Some(rate),
        );
    }
    let progress = inputs
        .expected_trials
        .map(|e| format!(", trials {}/{e}", current.trials_finished))
        .unwrap_or_else(|| format!(", {} trials done", current.trials_finished));
    let summary = if current.total() == 0 {
        format!("Harbor running for {}, no completions yet{progress}", human_duration(harbor_for))
    } else {
        let ok_share = if rate.completions > 0 {
            rate.ok as f64 / rate.completions as f64
        } else {
            current.ok as f64 / current.total().max(1) as f64
        };
        format!("{:.1} completions/min, {} answered 200{progress}", rate.per_min, percent(ok_share))
    };
    (draft(VerdictKind::Healthy, summary).ev(rate_text(&rate)).ev(counts), Some(rate))
}

/// The window: from the newest earlier reading that leaves at least `min_requests` completions
/// in it (else the oldest reading), or from Harbor's start with zero counts.
fn window(obs: &Observation, current: &Sample, harbor_since: DateTime<Utc>, min_requests: u64) -> Rate {
    let earlier: Vec<&Sample> = obs.samples.iter().filter(|p| p.at < current.at).collect();
    let base = earlier
        .iter()
        .rev()
        .find(|p| current.total().saturating_sub(p.total()) >= min_requests)
        .or(earlier.first())
        .copied();
    let (from, ok, c4xx, c5xx, trials, previous) = match base {
        Some(p) => (
            p.at,
            current.ok.saturating_sub(p.ok),
            current.c4xx.saturating_sub(p.c4xx),
            current.c5xx.saturating_sub(p.c5xx),
            current.trials_finished.saturating_sub(p.trials_finished),
            true,
        ),
        None => (harbor_since.min(current.at), current.ok, current.c4xx, current.c5xx, 0, false),
    };
    let window_s = (current.at - from).num_seconds().max(0);
    let completions = ok + c4xx + c5xx;
    Rate {
        window_s,
        completions,
        ok,
        c4xx,
        c5xx,
        per_min: if window_s > 0 { completions as f64 * 60.0 / window_s as f64 } else { 0.0 },
        trials_finished: trials,
        from_previous: previous,
    }
}

fn phase_name(phase: Phase) -> String {
    format!("{phase:?}").to_lowercase()
}

/// Whether the watch loop should cancel the job now, and why: the job is still RUNNING in Slurm
/// and has been `dead` / `stalled` longer than the profile's bound.
pub fn cancel_due(
    verdict: &JobVerdict,
    slurm: Option<SlurmView>,
    policy: Option<&AutoCancel>,
    now: DateTime<Utc>,
) -> Option<String> {
    let policy = policy?;
    if slurm != Some(SlurmView::Running) {
        return None;
    }
    let bound = match verdict.verdict {
        VerdictKind::Dead => policy.dead_after_s?,
        VerdictKind::Stalled => policy.stalled_after_s?,
        _ => return None,
    };
    let held = (now - verdict.since).num_seconds();
    (held >= bound as i64)
        .then(|| format!("{} for {} (bound {}s): {}", verdict.verdict, human_duration(held), bound, verdict.summary))
}

// ---------------------------------------------------------------------------------------------
// Observation files

fn observation_path(state_dir: &Path, attempt: i64) -> PathBuf {
    state_dir.join("observations").join(format!("attempt-{attempt}.json"))
}

pub fn load_observation(state_dir: &Path, attempt: i64) -> Option<Observation> {
    super::read_record(&observation_path(state_dir, attempt))
}

/// Replaces the observation file atomically (two `status` processes may run at once).
pub fn save_observation(state_dir: &Path, attempt: i64, obs: &Observation) -> std::io::Result<()> {
    let json = serde_json::to_vec(obs).expect("observation serialises");
    launch_spec::records::write_atomically(&observation_path(state_dir, attempt), &json)
}

pub fn remove_observation(state_dir: &Path, attempt: i64) {
    let _ = std::fs::remove_file(observation_path(state_dir, attempt));
}

/// Removes the observation files of attempts not in `keep` (they ended since they were last seen).
pub fn prune_observations(state_dir: &Path, keep: &std::collections::HashSet<i64>) {
    let Ok(entries) = std::fs::read_dir(state_dir.join("observations")) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let id =
            name.strip_prefix("attempt-").and_then(|n| n.strip_suffix(".json")).and_then(|n| n.parse::<i64>().ok());
        if id.is_some_and(|id| !keep.contains(&id)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use launch_spec::records::Outcome;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn status(phase: Phase, at: i64, hb: Option<Heartbeat>) -> RunStatus {
        RunStatus {
            version: 1,
            run_tag: "tb2__m".into(),
            phase,
            started_at: t(0).to_rfc3339(),
            updated_at: t(at).to_rfc3339(),
            slurm_job_id: Some("7".into()),
            node: None,
            gpu: None,
            port: None,
            pids: Default::default(),
            resume: None,
            heartbeat: hb,
            outcome: None,
            post_run: None,
        }
    }

    fn hb(at: i64, ok: u64, c4xx: u64, finished: u64, progress: i64) -> Heartbeat {
        Heartbeat {
            at: t(at).to_rfc3339(),
            completions_ok: ok,
            completions_4xx: c4xx,
            completions_5xx: 0,
            trials_started: finished + 2,
            trials_finished: finished,
            trials_errored: 0,
            last_progress_at: Some(t(progress).to_rfc3339()),
            engine_healthy: true,
        }
    }

    struct Case {
        status: Option<RunStatus>,
        slurm: Option<SlurmView>,
        attempt: Status,
        previous: Option<Observation>,
        now: i64,
        expected: Option<u64>,
        problems: Vec<Finding>,
    }

    impl Case {
        fn new(status: Option<RunStatus>, now: i64) -> Case {
            Case {
                status,
                slurm: Some(SlurmView::Running),
                attempt: Status::Started,
                previous: None,
                now,
                expected: None,
                problems: Vec::new(),
            }
        }

        fn judge(&self) -> (JobVerdict, Observation) {
            let settings = VerifySettings::default();
            judge(&Inputs {
                status: self.status.as_ref(),
                slurm: self.slurm,
                slurm_state: None,
                job_id: Some("7".into()),
                attempt_status: self.attempt,
                attempt_reason: "x",
                started_at: Some(t(0)),
                running_since: Some(t(10)),
                expected_trials: self.expected,
                config_problems: &self.problems,
                audit: None,
                previous: self.previous.as_ref(),
                now: t(self.now),
                settings: &settings,
            })
        }
    }

    #[test]
    fn healthy_then_misconfigured_when_400s_start() {
        let (v, obs) = Case::new(Some(status(Phase::Running, 100, Some(hb(100, 200, 0, 20, 100)))), 105).judge();
        assert_eq!(v.verdict, VerdictKind::Healthy, "{v:?}");
        // 100 s later: 30 more 200s and 40 400s — cumulative share 40/270 < 15%, the window's 57%.
        let mut case = Case::new(Some(status(Phase::Running, 200, Some(hb(200, 230, 40, 25, 200)))), 205);
        case.previous = Some(obs.clone());
        let (v, obs2) = case.judge();
        assert_eq!(v.verdict, VerdictKind::Misconfigured, "{v:?}");
        assert!(v.summary.contains("context overflow"), "{}", v.summary);
        assert!(v.rate.as_ref().unwrap().from_previous);
        assert_eq!(obs2.samples.len(), 2);
        // Without the earlier reading the cumulative share (14.8%) stays under the threshold.
        let (v, _) = Case::new(Some(status(Phase::Running, 200, Some(hb(200, 230, 40, 25, 200)))), 205).judge();
        assert_eq!(v.verdict, VerdictKind::Healthy, "{v:?}");
    }

    #[test]
    fn no_heartbeat_while_running_is_dead() {
        let (v, _) = Case::new(Some(status(Phase::Running, 100, Some(hb(100, 5, 0, 1, 100)))), 100 + 121).judge();
        assert_eq!(v.verdict, VerdictKind::Dead);
        assert!(v.summary.contains("no heartbeat"), "{}", v.summary);
        let (v, _) = Case::new(None, 700).judge();
        assert_eq!(v.verdict, VerdictKind::Dead, "no status.json after no_status_after_s");
        let (v, _) = Case::new(None, 60).judge();
        assert_eq!(v.verdict, VerdictKind::Starting);
    }

    #[test]
    fn unhealthy_engine_is_dead() {
        let mut beat = hb(100, 5, 0, 1, 100);
        beat.engine_healthy = false;
        let (v, _) = Case::new(Some(status(Phase::Running, 100, Some(beat))), 101).judge();
        assert_eq!(v.verdict, VerdictKind::Dead);
        assert!(v.summary.contains("/health"));
    }

    #[test]
    fn gone_from_slurm_without_outcome_is_dead_with_outcome_failed() {
        let mut case = Case::new(Some(status(Phase::Running, 100, Some(hb(100, 5, 0, 1, 100)))), 101);
        case.slurm = Some(SlurmView::Gone);
        assert_eq!(case.judge().0.verdict, VerdictKind::Dead);
        let mut st = status(Phase::Done, 100, None);
        st.outcome = Some(Outcome {
            class: OutcomeClass::EngineDied,
            cause: Some("unhealthy".into()),
            exit_code: 12,
            message: "vLLM failed 3 consecutive /health probes; Harbor stopped".into(),
            harbor_exit_code: None,
            signal: None,
            engine_log_tail: vec![],
        });
        case.status = Some(st);
        let (v, _) = case.judge();
        assert_eq!(v.verdict, VerdictKind::Failed);
        assert!(v.summary.starts_with("engine_died/unhealthy"), "{}", v.summary);
    }

    #[test]
    fn zero_200s_after_nine_minutes_is_misconfigured() {
        let (v, _) = Case::new(Some(status(Phase::Running, 600, Some(hb(600, 0, 0, 0, 10)))), 600).judge();
        assert_eq!(v.verdict, VerdictKind::Misconfigured, "{v:?}");
        assert!(v.summary.contains("zero 200"));
        let (v, _) = Case::new(Some(status(Phase::Running, 300, Some(hb(300, 0, 0, 0, 10)))), 300).judge();
        assert_eq!(v.verdict, VerdictKind::Healthy, "too early to tell: {v:?}");
    }

    #[test]
    fn stalled_and_zombie() {
        let (v, _) = Case::new(Some(status(Phase::Running, 2000, Some(hb(2000, 50, 0, 10, 100)))), 2000).judge();
        assert_eq!(v.verdict, VerdictKind::Stalled, "{v:?}");
        let mut beat = hb(1000, 50, 0, 12, 300);
        beat.trials_started = 12;
        let mut case = Case::new(Some(status(Phase::Running, 1000, Some(beat))), 1000);
        case.expected = Some(12);
        let (v, _) = case.judge();
        assert_eq!(v.verdict, VerdictKind::Stalled);
        assert!(v.summary.contains("zombie"), "{}", v.summary);
    }

    #[test]
    fn config_problems_make_it_misconfigured() {
        let mut case = Case::new(Some(status(Phase::Running, 100, Some(hb(100, 50, 0, 10, 100)))), 100);
        case.problems = vec![
            Finding::new("api_base", "api_base.private", super::super::Level::Fail, "private api_base")
                .evidence("config.json: 10.0.0.1"),
        ];
        let (v, _) = case.judge();
        assert_eq!(v.verdict, VerdictKind::Misconfigured);
        assert_eq!(v.evidence, vec!["config.json: 10.0.0.1"]);
    }

    #[test]
    fn starting_phases_queue_and_terminal_rows() {
        let (v, _) = Case::new(Some(status(Phase::Serving, 30, None)), 31).judge();
        assert_eq!(v.verdict, VerdictKind::Starting);
        let mut case = Case::new(None, 10);
        case.slurm = Some(SlurmView::Queued);
        assert_eq!(case.judge().0.verdict, VerdictKind::Starting);
        case.attempt = Status::Finished;
        assert_eq!(case.judge().0.verdict, VerdictKind::Finished);
        case.attempt = Status::Cancelled;
        assert_eq!(case.judge().0.verdict, VerdictKind::Failed);
    }

    #[test]
    fn since_carries_over_and_cancel_policy_applies() {
        let case = Case::new(Some(status(Phase::Running, 100, Some(hb(100, 5, 0, 1, 100)))), 300);
        let (v1, obs) = case.judge();
        assert_eq!(v1.verdict, VerdictKind::Dead);
        let mut later = Case::new(Some(status(Phase::Running, 100, Some(hb(100, 5, 0, 1, 100)))), 1000);
        later.previous = Some(obs);
        let (v2, _) = later.judge();
        assert_eq!(v2.since, t(300), "the dead verdict holds since its first observation");
        let policy = AutoCancel { dead_after_s: Some(600), stalled_after_s: None };
        assert!(
            cancel_due(&v2, Some(SlurmView::Running), Some(&policy), t(1000))
                .is_some_and(|r| r.starts_with("dead for"))
        );
        assert!(cancel_due(&v2, Some(SlurmView::Running), Some(&policy), t(800)).is_none());
        assert!(cancel_due(&v2, Some(SlurmView::Gone), Some(&policy), t(1000)).is_none());
        assert!(cancel_due(&v2, Some(SlurmView::Running), None, t(1000)).is_none());
    }

    #[test]
    fn observation_files_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let (_, obs) = Case::new(Some(status(Phase::Running, 100, Some(hb(100, 5, 0, 1, 100)))), 101).judge();
        save_observation(dir.path(), 9, &obs).unwrap();
        assert_eq!(load_observation(dir.path(), 9), Some(obs.clone()));
        remove_observation(dir.path(), 9);
        assert_eq!(load_observation(dir.path(), 9), None);
        save_observation(dir.path(), 9, &obs).unwrap();
        save_observation(dir.path(), 10, &obs).unwrap();
        prune_observations(dir.path(), &std::collections::HashSet::from([10]));
        assert_eq!(load_observation(dir.path(), 9), None);
        assert!(load_observation(dir.path(), 10).is_some());
    }
}
