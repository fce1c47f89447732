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
use launch_spec::records::{Heartbeat, RunStatus};
use serde::{Deserialize, Serialize};

use launch_spec::rundir::{RecordError, StatusRecord};

use super::results::Audit;
use super::rules::{EngineFacts, Evidence, JobFacts, Probe, TrialFacts, Window};
use super::{VerifySettings, human_duration, parse_time};
use crate::domain::SlurmView;
use crate::ledger::AttemptStatus;

pub use super::VerdictKind;

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
    /// payload's failed `/health` probes in a row, and its limit (`launch_spec::records::Heartbeat`).
    #[serde(default)]
    pub(crate) failed_probes: u32,
    #[serde(default)]
    pub(crate) probe_limit: u32,
}

impl Sample {
    pub(crate) fn from_heartbeat(hb: &Heartbeat) -> Option<Sample> {
        Some(Sample {
            at: parse_time(&hb.at)?,
            ok: hb.completions_ok,
            c4xx: hb.completions_4xx,
            c5xx: hb.completions_5xx,
            trials_started: hb.trials_started,
            trials_finished: hb.trials_finished,
            trials_errored: hb.trials_errored,
            healthy: hb.engine_healthy,
            failed_probes: hb.failed_probes,
            probe_limit: hb.probe_limit,
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
    pub(crate) first_seen: Option<DateTime<Utc>>,
    #[serde(default)]
    pub(crate) running_seen_at: Option<DateTime<Utc>>,
    /// The last verdict and since when it has held without interruption.
    #[serde(default)]
    pub verdict: Option<VerdictKind>,
    #[serde(default)]
    pub(crate) verdict_since: Option<DateTime<Utc>>,
    #[serde(default)]
    pub(crate) observed_at: Option<DateTime<Utc>>,
}

pub(crate) const MAX_SAMPLES: usize = 256;
const SAMPLE_HORIZON_S: i64 = 3600;

/// Everything [`judge`] looks at.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// payload's status.json, only when it belongs to this attempt (same Slurm job id).
    pub status: Option<&'a RunStatus>,
    /// Why the run dir's status.json could not be used (truncated, a newer version), when it could not.
    pub(crate) status_error: Option<&'a RecordError>,
    /// Slurm's view of the job; `None` while the attempt has no job id.
    pub slurm: Option<SlurmView>,
    /// Slurm's state name, for the evidence (`RUNNING`, `CANCELLED`, …).
    pub slurm_state: Option<String>,
    pub job_id: Option<String>,
    /// The ledger row.
    pub(crate) attempt_status: AttemptStatus,
    pub(crate) attempt_reason: &'a str,
    /// When sync saw the job start (ledger `started_at`).
    pub started_at: Option<DateTime<Utc>>,
    /// When Harbor started (events.jsonl).
    pub running_since: Option<DateTime<Utc>>,
    /// n_tasks × n_attempts when known.
    pub expected_trials: Option<u64>,
    /// The agent's wiring as the run dir's files show it ([`super::check::evidence_from_dir`]),
    /// judged by the tunnel and api_base rules.
    pub(crate) wiring: Option<&'a super::rules::Wiring>,
    /// The completion audit of a finished attempt (from its ledger metrics).
    pub audit: Option<&'a Audit>,
    pub previous: Option<&'a Observation>,
    pub now: DateTime<Utc>,
    pub settings: &'a VerifySettings,
}

/// Completions and trials over a window.
#[derive(Debug, Clone, PartialEq)]
pub struct Rate {
    pub(crate) window_s: i64,
    pub completions: u64,
    pub ok: u64,
    pub c4xx: u64,
    pub c5xx: u64,
    pub per_min: f64,
    pub trials_finished: u64,
    /// Whether the window starts at an earlier heartbeat (else: cumulative since Harbor started).
    pub(crate) from_previous: bool,
}

/// A job's verdict with the evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct JobVerdict {
    pub verdict: VerdictKind,
    pub summary: String,
    pub evidence: Vec<String>,
    pub action: Option<String>,
    /// Since when this verdict has held (as observed).
    pub since: DateTime<Utc>,
    pub rate: Option<Rate>,
    /// Trials finished / expected, when known.
    pub trials_finished: Option<u64>,
    pub trials_expected: Option<u64>,
    /// The id of the finding that decided the verdict (`engine.hung`, `tunnel.locked`, …), for a
    /// verdict other than `healthy`: what remediation keys its policy on.
    pub finding: Option<&'static str>,
}

/// One line of `status`: the ledger row joined with Slurm and payload's records, and its verdict.
#[derive(Debug, Clone)]
pub struct StatusRow {
    pub attempt: i64,
    pub model: String,
    pub benchmark: String,
    /// The ledger's family and agent: with the model, the pair.
    pub family: String,
    pub agent: String,
    pub cluster: String,
    pub run_tag: String,
    pub run_dir: Option<String>,
    pub(crate) ledger_status: AttemptStatus,
    pub(crate) ledger_reason: String,
    pub slurm_job_id: Option<String>,
    /// Slurm's state (`PENDING`, `RUNNING`, …), `gone` when Slurm no longer lists the job, `-`
    /// without a job id.
    pub slurm: String,
    /// payload's phase from status.json, `-` without one.
    pub phase: String,
    pub verdict: JobVerdict,
    /// What remediation did about this attempt (its ledger record, in words), and whether its pair is held.
    pub remedy: Option<String>,
    /// For a walltime continuation: the attempt it continues and its place in the chain.
    pub continues: Option<crate::domain::Continuation>,
}

struct Draft {
    verdict: VerdictKind,
    finding: Option<&'static str>,
    summary: String,
    evidence: Vec<String>,
    action: Option<String>,
}

fn draft(verdict: VerdictKind, summary: impl Into<String>) -> Draft {
    Draft { verdict, finding: None, summary: summary.into(), evidence: Vec::new(), action: None }
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
    let (draft, rate) = draft_verdict(inputs, &obs, current.as_ref());
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
        finding: draft.finding,
    };
    (verdict, obs)
}

/// The evidence `status` has of one job — payload's heartbeat, the rate window over earlier
/// readings, Slurm, the ledger and the run dir's config problems — through the one rule engine
/// ([`super::rules::evaluate`]), and the verdict its most severe finding stands for.
fn draft_verdict(inputs: &Inputs, obs: &Observation, current: Option<&Sample>) -> (Draft, Option<Rate>) {
    let now = inputs.now;
    let s = inputs.settings;
    let status = inputs.status;
    let harbor_since = inputs
        .running_since
        .or_else(|| status.and_then(|st| parse_time(&st.started_at)))
        .or(current.map(|c| c.at))
        .unwrap_or(now);
    let rate = current.map(|c| window(obs, c, harbor_since, s.min_requests));
    let engine = current.map(|c| {
        let r = rate.as_ref();
        EngineFacts {
            file: launch_spec::records::ENGINE_LOG.into(),
            source: "status.json heartbeat".into(),
            ok: c.ok,
            c4xx: c.c4xx,
            c5xx: c.c5xx,
            recent: r.filter(|r| r.from_previous).map(|r| Window {
                n: r.completions,
                ok: r.ok,
                c4xx: r.c4xx,
                c5xx: r.c5xx,
                label: format!("last {}", human_duration(r.window_s)),
            }),
            per_min: r.filter(|r| r.window_s > 0).map(|r| r.per_min),
            serving_since: Some(harbor_since),
            probe: Some(Probe {
                failed: c.failed_probes,
                limit: c.probe_limit,
                at: c.at.to_rfc3339(),
                last_ok: obs.samples.iter().rev().find(|p| p.healthy).map(|p| p.at),
            }),
            counters: status
                .and_then(|st| st.heartbeat.as_ref())
                .and_then(|h| h.engine.clone().map(|e| (e, h.at.clone()))),
            ..EngineFacts::default()
        }
    });
    let heartbeat = status.and_then(|st| st.heartbeat.as_ref());
    let evidence = Evidence {
        now: Some(now),
        payload: match (status, inputs.status_error) {
            (Some(st), _) => StatusRecord::Present(st.clone()),
            (None, Some(e)) => StatusRecord::Unusable(e.clone()),
            (None, None) => StatusRecord::Absent,
        },
        job: Some(JobFacts {
            ledger_status: inputs.attempt_status,
            ledger_reason: inputs.attempt_reason.to_string(),
            running_seen_at: [obs.running_seen_at, inputs.started_at].into_iter().flatten().min(),
            slurm: inputs.slurm,
            slurm_state: inputs.slurm_state.clone(),
            job_id: inputs.job_id.clone(),
        }),
        running_since: Some(harbor_since).filter(|_| current.is_some()).or(inputs.running_since),
        engine,
        trials: TrialFacts {
            scan: None,
            beat: heartbeat.map(|h| (h.trials_started, h.trials_finished, h.trials_errored)),
            last_progress_at: heartbeat.and_then(|h| h.last_progress_at.as_deref()).and_then(parse_time),
        },
        expected_trials: inputs.expected_trials,
        wiring: inputs.wiring.cloned(),
        audit: inputs.audit.cloned(),
        ..Evidence::default()
    };
    let assessment = super::rules::evaluate(&evidence, s);
    let (kind, decisive) = assessment.verdict();
    let rate =
        rate.filter(|_| kind != VerdictKind::Finished && kind != VerdictKind::Failed && kind != VerdictKind::Starting);
    let mut d = match decisive.filter(|_| kind != VerdictKind::Healthy) {
        Some(f) => Draft {
            verdict: kind,
            finding: Some(f.id),
            summary: f.summary.clone(),
            evidence: f.evidence.clone(),
            action: f.action.clone(),
        },
        None => draft(kind, String::new()),
    };
    if kind == VerdictKind::Healthy {
        let job = inputs.job_id.clone().unwrap_or_else(|| "?".into());
        d.summary = match (current, &rate) {
            (Some(c), Some(r)) => {
                let progress = inputs
                    .expected_trials
                    .map(|e| format!(", trials {}/{e}", c.trials_finished))
                    .unwrap_or_else(|| format!(", {} trials done", c.trials_finished));
                let harbor_for = (now - harbor_since).num_seconds();
                d.evidence = vec![rate_text(r), counts_text(c)];
                if let Some(counters) = heartbeat.and_then(|h| h.engine.as_ref()) {
                    d.evidence.push(super::rules::counters_text(counters));
                }
                if c.total() == 0 {
                    format!("Harbor running for {}, no completions yet{progress}", human_duration(harbor_for))
                } else {
                    format!("{}{progress}", assessment.healthy_summary)
                }
            }
            _ => decisive.map_or_else(|| format!("job {job} running"), |f| f.summary.clone()),
        };
    }
    (d, rate)
}

fn counts_text(c: &Sample) -> String {
    format!(
        "{} completions ({} × 2xx, {} × 4xx, {} × 5xx); trials {} started, {} finished, {} errored",
        c.total(),
        c.ok,
        c.c4xx,
        c.c5xx,
        c.trials_started,
        c.trials_finished,
        c.trials_errored
    )
}

fn rate_text(r: &Rate) -> String {
    format!(
        "last {}: {} completions ({:.1}/min), {} × 4xx, {} × 5xx, {} trials finished",
        human_duration(r.window_s),
        r.completions,
        r.per_min,
        r.c4xx,
        r.c5xx,
        r.trials_finished
    )
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

// ---------------------------------------------------------------------------------------------
// Observation files

fn observation_path(state_dir: &Path, attempt: i64) -> PathBuf {
    state_dir.join("observations").join(format!("attempt-{attempt}.json"))
}

pub(crate) fn load_observation(state_dir: &Path, attempt: i64) -> Option<Observation> {
    super::read_record(&observation_path(state_dir, attempt))
}

/// Replaces the observation file atomically (two `status` processes may run at once).
pub(crate) fn save_observation(state_dir: &Path, attempt: i64, obs: &Observation) -> std::io::Result<()> {
    let json = serde_json::to_vec(obs).expect("observation serialises");
    launch_spec::records::write_atomically(&observation_path(state_dir, attempt), &json)
}

pub(crate) fn remove_observation(state_dir: &Path, attempt: i64) {
    let _ = std::fs::remove_file(observation_path(state_dir, attempt));
}

/// Removes the observation files of attempts not in `keep` (they ended since they were last seen).
pub(crate) fn prune_observations(state_dir: &Path, keep: &std::collections::HashSet<i64>) {
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
    use launch_spec::records::{Outcome, OutcomeClass, Phase};

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
            provenance: None,
            gpu_time: None,
            readiness: None,
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
            failed_probes: 0,
            probe_limit: 3,
            engine: None,
        }
    }

    struct Case {
        status: Option<RunStatus>,
        slurm: Option<SlurmView>,
        attempt: AttemptStatus,
        previous: Option<Observation>,
        now: i64,
        expected: Option<u64>,
        wiring: Option<super::super::rules::Wiring>,
    }

    impl Case {
        fn new(status: Option<RunStatus>, now: i64) -> Case {
            Case {
                status,
                slurm: Some(SlurmView::Running),
                attempt: AttemptStatus::Started,
                previous: None,
                now,
                expected: None,
                wiring: None,
            }
        }

        fn judge(&self) -> (JobVerdict, Observation) {
            let settings = VerifySettings::default();
            judge(&Inputs {
                status: self.status.as_ref(),
                status_error: None,
                slurm: self.slurm,
                slurm_state: None,
                job_id: Some("7".into()),
                attempt_status: self.attempt,
                attempt_reason: "x",
                started_at: Some(t(0)),
                running_since: Some(t(10)),
                expected_trials: self.expected,
                wiring: self.wiring.as_ref(),
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

    /// Dead by payload's rule only: its limit of failed probes in a row, as its heartbeat counts them.
    #[test]
    fn unhealthy_engine_is_dead_at_payloads_limit_not_before() {
        let mut beat = hb(100, 5, 0, 1, 100);
        beat.engine_healthy = false;
        beat.failed_probes = 3;
        let (v, _) = Case::new(Some(status(Phase::Running, 100, Some(beat.clone()))), 101).judge();
        assert_eq!(v.verdict, VerdictKind::Dead);
        assert!(v.summary.contains("3 /health probes in a row"), "{}", v.summary);
        assert!(v.evidence.iter().any(|e| e.contains("limits.health_failures = 3")), "{:?}", v.evidence);
        // One or two failures: payload goes on, so does `status`.
        for failed in [1, 2] {
            beat.failed_probes = failed;
            let (v, _) = Case::new(Some(status(Phase::Running, 100, Some(beat.clone()))), 101).judge();
            assert_eq!(v.verdict, VerdictKind::Healthy, "{failed} failed probe(s): {v:?}");
        }
    }

    /// The false-dead race (issue 31): right after Harbor starts, status.json said `phase: running`
    /// beside the loading-time heartbeat (`engine_healthy: false`: not probed for health yet), and
    /// `status` called the job dead until the next beat, up to 15 s later.
    #[test]
    fn the_loading_time_heartbeat_beside_harbor_running_is_not_dead() {
        let mut loading = hb(95, 0, 0, 0, 95);
        (loading.engine_healthy, loading.trials_started) = (false, 0);
        for beat in [loading.clone(), Heartbeat { probe_limit: 0, ..loading }] {
            let (v, _) = Case::new(Some(status(Phase::Running, 96, Some(beat))), 97).judge();
            assert_ne!(v.verdict, VerdictKind::Dead, "{v:?}");
        }
    }

    /// payload's heartbeat says requests have been in flight with no token for the whole window:
    /// dead at once (not after the stall rule's `stall_after_s`), with the counters as evidence;
    /// the same counters short of the window, or an idle engine, stay healthy.
    #[test]
    fn hung_engine_in_the_heartbeat_is_dead_at_once() {
        let counters = |no_tokens_for_s: Option<f64>, running: u64| launch_spec::records::EngineCounters {
            requests_running: running,
            requests_waiting: 0,
            generation_tokens: 640,
            prompt_tokens: 9000,
            tokens_per_s: Some(0.0),
            kv_cache_usage: Some(0.12),
            no_tokens_for_s,
            hang_after_s: 600,
        };
        let mut beat = hb(100, 5, 0, 1, 100);
        beat.engine = Some(counters(Some(600.4), 3));
        let (v, _) = Case::new(Some(status(Phase::Running, 100, Some(beat.clone()))), 101).judge();
        assert_eq!(v.verdict, VerdictKind::Dead, "{v:?}");
        assert!(v.summary.contains("hung") && v.summary.contains("3 request(s)"), "{}", v.summary);
        assert!(v.evidence.iter().any(|e| e.contains("3 running") && e.contains("KV cache 12")), "{:?}", v.evidence);
        for c in [counters(Some(599.0), 3), counters(None, 0)] {
            beat.engine = Some(c);
            let (v, _) = Case::new(Some(status(Phase::Running, 100, Some(beat.clone()))), 101).judge();
            assert_ne!(v.verdict, VerdictKind::Dead, "{v:?}");
        }
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
        // An installed harness whose job config calls a private address (the facts; the rule judges).
        let agent = super::super::rules::Agent {
            name: Some("openhands".into()),
            model_name: Some("hosted_vllm/m".into()),
            api_base: Some("http://10.0.0.1:8000/v1".into()),
            has_model_info: true,
            from: "config.json",
        };
        case.wiring = Some(super::super::rules::Wiring {
            agent,
            remote: true,
            tunnel: Some(super::super::check::TunnelLog {
                path: "tunnel.log".into(),
                authenticated: Some("You are authenticated".into()),
                ..Default::default()
            }),
            api_base_read: true,
            fails_only: true,
            ..Default::default()
        });
        let (v, _) = case.judge();
        assert_eq!(v.verdict, VerdictKind::Misconfigured);
        assert_eq!(v.evidence, vec![r#"config.json: "api_base": "http://10.0.0.1:8000/v1""#], "{v:?}");
    }

    #[test]
    fn starting_phases_queue_and_terminal_rows() {
        let (v, _) = Case::new(Some(status(Phase::Serving, 30, None)), 31).judge();
        assert_eq!(v.verdict, VerdictKind::Starting);
        let mut case = Case::new(None, 10);
        case.slurm = Some(SlurmView::Queued);
        assert_eq!(case.judge().0.verdict, VerdictKind::Starting);
        case.attempt = AttemptStatus::Finished;
        assert_eq!(case.judge().0.verdict, VerdictKind::Finished);
        case.attempt = AttemptStatus::Cancelled;
        assert_eq!(case.judge().0.verdict, VerdictKind::Failed);
    }

    #[test]
    fn since_carries_over() {
        let case = Case::new(Some(status(Phase::Running, 100, Some(hb(100, 5, 0, 1, 100)))), 300);
        let (v1, obs) = case.judge();
        assert_eq!(v1.verdict, VerdictKind::Dead);
        let mut later = Case::new(Some(status(Phase::Running, 100, Some(hb(100, 5, 0, 1, 100)))), 1000);
        later.previous = Some(obs);
        let (v2, _) = later.judge();
        assert_eq!(v2.since, t(300), "the dead verdict holds since its first observation");
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
