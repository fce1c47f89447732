//! `submitter status`: the ledger's attempts joined with Slurm's state and payload's records, one
//! verdict per job ([`super::verdict::judge`]). It reads and never writes: cancelling is
//! remediation's (`crate::remediate`).

use std::collections::HashMap;
use std::path::Path;

use chrono::{DateTime, Utc};

use super::verdict::{self, Inputs, JobVerdict, StatusRow, VerdictKind};
use super::{VerifySettings, check, human_duration, results};
use crate::domain::SlurmView;
use crate::ledger::{Attempt, AttemptId, AttemptStatus, Ledger};
use crate::observe::{Observation, SyncError, run_dir_of, view_of};
use crate::slurm::{JobId, JobInfo, Slurm};
use serde_json::Value;

/// What to collect.
pub struct Collect<'a> {
    pub cluster: &'a str,
    /// Observation files live here (`<state dir>/observations/`).
    pub state_dir: &'a Path,
    pub settings: &'a VerifySettings,
    /// Also list attempts of this cluster that ended within this many hours.
    pub(crate) ended_within_h: Option<u64>,
    pub now: DateTime<Utc>,
    /// Write the observations back: only the reconcile (a launch iteration, `remediate`) does;
    /// `status` and the report only read them.
    pub persist: bool,
    /// Slurm's answers and the run dirs' records, each asked once per iteration.
    pub world: &'a Observation,
}

/// Every active attempt of the cluster (plus recently ended ones), with its verdict. Slurm is asked
/// through the observation (one `squeue` for all jobs per iteration). Ledger and Slurm errors stop it.
pub fn collect(ledger: &dyn Ledger, slurm: &dyn Slurm, opts: &Collect) -> Result<Vec<StatusRow>, SyncError> {
    let mut attempts: Vec<Attempt> = ledger.active()?.into_iter().filter(|a| a.cluster == opts.cluster).collect();
    if let Some(hours) = opts.ended_within_h {
        let cutoff = opts.now - chrono::Duration::hours(hours as i64);
        let active: std::collections::HashSet<AttemptId> = attempts.iter().map(|a| a.id).collect();
        for pair in ledger.latest_per_pair()? {
            let a = pair.latest;
            if a.cluster == opts.cluster
                && a.status.is_terminal()
                && a.ended_at.is_some_and(|t| t >= cutoff)
                && !active.contains(&a.id)
            {
                attempts.push(a);
            }
        }
    }
    let ids: Vec<JobId> = attempts
        .iter()
        .filter(|a| a.status.is_active())
        .filter_map(|a| a.slurm_job_id.as_deref()?.parse().ok())
        .collect();
    let jobs: HashMap<String, JobInfo> = opts.world.jobs(slurm, &ids)?;
    let mut rows = Vec::with_capacity(attempts.len());
    for attempt in &attempts {
        rows.push(row_for(attempt, jobs.get(attempt.slurm_job_id.as_deref().unwrap_or("")), opts));
    }
    if opts.persist {
        let active: std::collections::HashSet<i64> =
            attempts.iter().filter(|a| a.status.is_active()).map(|a| a.id.0).collect();
        verdict::prune_observations(opts.state_dir, &active);
    }
    Ok(rows)
}

/// What `status` knows of one job besides its run dir.
pub struct JobSide<'a> {
    pub status: AttemptStatus,
    pub reason: &'a str,
    pub job_id: Option<&'a str>,
    /// `None` while the row has no job id.
    pub slurm: Option<SlurmView>,
    pub slurm_state: Option<String>,
    /// When sync saw the job start (ledger `started_at`).
    pub started_at: Option<DateTime<Utc>>,
    pub metrics: Option<&'a Value>,
}

/// The verdict `status` gives one job: its run dir read as `check` reads it (records and configs
/// only), payload's heartbeat, the previous observation, Slurm and the ledger — one rule engine.
/// Returns the verdict, the observation to keep, and payload's phase (`-` without a status.json).
pub fn judge_job(
    run_dir: Option<&Path>,
    job: &JobSide,
    previous: Option<&verdict::Observation>,
    settings: &VerifySettings,
    now: DateTime<Utc>,
) -> (JobVerdict, verdict::Observation, String) {
    let record = run_dir.map(launch_spec::rundir::read_status).unwrap_or_default();
    judge_observed(run_dir, record, job, previous, settings, now)
}

/// [`judge_job`] with the run dir's `status.json` already read (`record`).
pub(crate) fn judge_observed(
    run_dir: Option<&Path>,
    record: launch_spec::rundir::StatusRecord,
    job: &JobSide,
    previous: Option<&verdict::Observation>,
    settings: &VerifySettings,
    now: DateTime<Utc>,
) -> (JobVerdict, verdict::Observation, String) {
    let status_error = match &record {
        launch_spec::rundir::StatusRecord::Unusable(e) => Some(e.clone()),
        _ => None,
    };
    // A resubmission reuses the run dir: a status.json is this job's only when it names its job.
    let status = record.clone().of_job(job.job_id);
    // The run dir's records and configs, read by the same code as `check` (no log or trial scan).
    let files = match run_dir {
        Some(dir) if job.status.is_active() => {
            check::evidence_from_dir(dir, Some(record.clone()), settings, now, check::Depth::Records).ok()
        }
        _ => None,
    };
    let running_since = files.as_ref().and_then(|f| f.evidence.running_since);
    let expected = files.as_ref().and_then(|f| f.evidence.expected_trials);
    let wiring = files.and_then(|f| f.evidence.wiring);
    let audit =
        job.metrics.filter(|m| !m.is_null()).map(|m| results::audit_of(&results::summary_from_metrics(m), settings));
    let (v, obs) = verdict::judge(&Inputs {
        status: status.as_ref(),
        status_error: status_error.as_ref(),
        slurm: job.slurm,
        slurm_state: job.slurm_state.clone(),
        job_id: job.job_id.map(str::to_string),
        attempt_status: job.status,
        attempt_reason: job.reason,
        started_at: job.started_at,
        running_since,
        expected_trials: expected,
        wiring: wiring.as_ref(),
        audit: audit.as_ref(),
        previous,
        now,
        settings,
    });
    let phase = status.as_ref().map_or("-".into(), |s| format!("{:?}", s.phase).to_lowercase());
    (v, obs, phase)
}

fn row_for(attempt: &Attempt, job: Option<&JobInfo>, opts: &Collect) -> StatusRow {
    let run_dir = run_dir_of(attempt);
    let slurm_view = attempt.slurm_job_id.as_ref().map(|_| view_of(job));
    let previous =
        if attempt.status.is_active() { verdict::load_observation(opts.state_dir, attempt.id.0) } else { None };
    let side = JobSide {
        status: attempt.status,
        reason: &attempt.reason,
        job_id: attempt.slurm_job_id.as_deref(),
        slurm: slurm_view,
        slurm_state: job.map(|j| j.state.to_string()),
        started_at: attempt.started_at,
        metrics: attempt.metrics.as_ref(),
    };
    let record = run_dir.as_deref().map(|d| opts.world.record(d)).unwrap_or_default();
    let (v, obs, phase) = judge_observed(run_dir.as_deref(), record, &side, previous.as_ref(), opts.settings, opts.now);
    if opts.persist {
        if attempt.status.is_active() {
            if let Err(err) = verdict::save_observation(opts.state_dir, attempt.id.0, &obs) {
                tracing::warn!("cannot keep the observation of attempt {}: {err}", attempt.id);
            }
        } else {
            verdict::remove_observation(opts.state_dir, attempt.id.0);
        }
    }
    StatusRow {
        attempt: attempt.id.0,
        model: attempt.model.clone(),
        benchmark: attempt.benchmark.clone(),
        family: attempt.benchmark_family.clone(),
        agent: attempt.agent.clone(),
        cluster: attempt.cluster.clone(),
        run_tag: attempt.run_tag.clone(),
        run_dir: run_dir.map(|d| d.display().to_string()),
        ledger_status: attempt.status,
        ledger_reason: attempt.reason.clone(),
        slurm_job_id: attempt.slurm_job_id.clone(),
        slurm: match (&attempt.slurm_job_id, job) {
            (None, _) => "-".into(),
            (Some(_), Some(j)) => j.state.to_string(),
            (Some(_), None) if attempt.status.is_active() => "gone".into(),
            (Some(_), None) => "-".into(),
        },
        phase,
        verdict: v,
        remedy: None,
        continues: crate::domain::Continuation::of_config(&attempt.config),
    }
}

fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        text.chars().take(width.saturating_sub(1)).collect::<String>() + "…"
    }
}

/// The table of `status`.
pub(crate) fn render_table(rows: &[StatusRow], cluster: &str, now: DateTime<Utc>, verbose: bool) -> String {
    let mut out = format!(
        "{:<8} {:<34} {:<22} {:<10} {:<9} {:>9} {:>8}  {:<13} {}\n",
        "job", "model", "benchmark", "slurm", "phase", "trials", "rate", "verdict", "why"
    );
    for r in rows {
        let v = &r.verdict;
        let trials = match (v.trials_finished, v.trials_expected) {
            (Some(f), Some(e)) => format!("{f}/{e}"),
            (Some(f), None) => f.to_string(),
            _ => "-".into(),
        };
        let rate = v.rate.as_ref().map_or("-".into(), |r| format!("{:.1}/m", r.per_min));
        let held = if v.verdict.is_bad() {
            format!(" [{}]", human_duration((now - v.since).num_seconds()))
        } else {
            String::new()
        };
        out += &format!(
            "{:<8} {:<34} {:<22} {:<10} {:<9} {:>9} {:>8}  {:<13} {}{held}\n",
            r.slurm_job_id.as_deref().unwrap_or("-"),
            truncate(&r.model, 34),
            truncate(&results::short_name(&r.benchmark), 22),
            truncate(&r.slurm, 10),
            r.phase,
            trials,
            rate,
            v.verdict.as_str(),
            super::printable(&v.summary)
        );
        if verbose || v.verdict.is_bad() {
            for e in &v.evidence {
                out += &format!("{:>10}· {}\n", "", super::printable(e));
            }
            if let Some(a) = &v.action {
                out += &format!("{:>10}→ {}\n", "", super::printable(a));
            }
        }
        if let Some(remedy) = &r.remedy {
            out += &format!("{:>10}⚕ remediation: {}\n", "", super::printable(remedy));
        }
        if let Some(c) = &r.continues {
            out += &format!(
                "{:>10}↻ continuation {} of attempt {} (it ended by the walltime; {})\n",
                "",
                c.number,
                c.attempt,
                c.first.map_or("a chain".to_string(), |first| format!("chain from attempt {first}"))
            );
        }
    }
    let count = |k: VerdictKind| rows.iter().filter(|r| r.verdict.verdict == k).count();
    let active = rows.iter().filter(|r| r.ledger_status.is_active()).count();
    out += &format!(
        "{active} active attempt(s) on {cluster}: {} healthy, {} starting, {} stalled, {} dead, {} misconfigured\n",
        count(VerdictKind::Healthy),
        count(VerdictKind::Starting),
        count(VerdictKind::Stalled),
        count(VerdictKind::Dead),
        count(VerdictKind::Misconfigured)
    );
    out
}
