//! How an attempt is observed, shared by `sync` (which folds it into the ledger) and
//! `verify::status` (which judges it): its run dir, whether a `status.json` is its own, and
//! Slurm's view of its job. A leaf module, so neither of the two depends on the other.

use std::path::PathBuf;

use launch_spec::records::RunStatus;
use serde_json::Value;

use crate::domain::SlurmView;
use crate::ledger::{Attempt, LedgerError};
use crate::slurm::{JobInfo, JobState, SlurmError};

/// What stops `sync` and `status`: the ledger or Slurm cannot be read (fail closed).
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Slurm(#[from] SlurmError),
}

/// The run dir an attempt recorded in its config.
pub fn run_dir_of(attempt: &Attempt) -> Option<PathBuf> {
    attempt.config.get("run_dir").and_then(Value::as_str).map(PathBuf::from)
}

/// The group dir of the shared job an attempt is a leg of (issue 24): the engine's log and the
/// job's Slurm output are there, not in the leg's run dir.
pub(crate) fn shared_group_dir(attempt: &Attempt) -> Option<PathBuf> {
    attempt
        .config
        .pointer(&format!("/{}/group_dir", crate::domain::SHARED_KEY))
        .and_then(Value::as_str)
        .map(PathBuf::from)
}

/// A resubmission reuses the run dir (so Harbor resumes): a `status.json` is this attempt's only
/// when it names this attempt's Slurm job.
pub fn belongs_to(status: &RunStatus, attempt: &Attempt) -> bool {
    launch_spec::rundir::is_attempts_status(status, attempt.slurm_job_id.as_deref())
}

/// How long payload's records (`status.json`, rewritten every heartbeat: 15 s by default) must
/// have been quiet before a job Slurm no longer lists counts as vanished. One empty `squeue` answer
/// (a controller restarting, a query cut short) for a job whose heartbeat is fresh is not the job
/// ending: "vanished" needs Slurm's answer and the run dir's records to agree over this window.
pub const VANISHED_AFTER_QUIET_S: i64 = 300;

/// Whether `status` (the attempt's own, without an outcome) was written within
/// [`VANISHED_AFTER_QUIET_S`] of `now`: the job is alive, whatever one Slurm answer says.
pub fn records_fresh(status: &RunStatus, now: chrono::DateTime<chrono::Utc>) -> bool {
    status.outcome.is_none()
        && chrono::DateTime::parse_from_rfc3339(&status.updated_at)
            .is_ok_and(|at| (now - at.with_timezone(&chrono::Utc)).num_seconds() < VANISHED_AFTER_QUIET_S)
}

pub fn view_of(job: Option<&JobInfo>) -> SlurmView {
    match job {
        Some(info) if info.state == JobState::Pending => SlurmView::Queued,
        Some(info) if info.state.is_active() => SlurmView::Running,
        _ => SlurmView::Gone,
    }
}

/// One look at the world per iteration (docs/design.md §0, "The reconcile"): Slurm's answer about
/// every active job of the cluster — one `squeue` — and each run dir's `status.json`, read at most
/// once. Sync, remediation, the verdicts and the plan's snapshot all read it, so one iteration asks
/// Slurm once and reads each attempt's record once. The ledger is not part of it: each stage reads
/// the ledger as the stages before it left it.
pub struct Observation {
    pub now: chrono::DateTime<chrono::Utc>,
    /// Slurm's answer by job id, for the ids asked.
    jobs: std::sync::Mutex<std::collections::HashMap<String, Option<JobInfo>>>,
    /// Run dir → its `status.json` as read.
    records: std::sync::Mutex<std::collections::HashMap<PathBuf, launch_spec::rundir::StatusRecord>>,
}

impl Observation {
    /// Asks Slurm once about every job of `cluster`'s active attempts (ledger order: the ledger
    /// first, so every job id asked about was submitted before Slurm is asked).
    pub fn take(
        ledger: &dyn crate::ledger::Ledger,
        slurm: &dyn crate::slurm::Slurm,
        cluster: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Observation, SyncError> {
        let ids: Vec<crate::slurm::JobId> = ledger
            .active()?
            .iter()
            .filter(|a| a.cluster == cluster)
            .filter_map(|a| a.slurm_job_id.as_deref()?.parse().ok())
            .collect();
        let world = Observation::empty(now);
        world.jobs(slurm, &ids)?;
        Ok(world)
    }

    /// An observation that has asked nothing yet (each question is asked once, when first needed).
    pub fn empty(now: chrono::DateTime<chrono::Utc>) -> Observation {
        Observation { now, jobs: Default::default(), records: Default::default() }
    }

    /// Slurm's view of `ids`, by job id (a job Slurm does not list is absent). Ids asked before
    /// are answered from the observation; only the others (a job id a repair bound during this
    /// iteration) go to Slurm, in one `squeue`.
    pub fn jobs(
        &self,
        slurm: &dyn crate::slurm::Slurm,
        ids: &[crate::slurm::JobId],
    ) -> Result<std::collections::HashMap<String, JobInfo>, SlurmError> {
        let mut known = self.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let new: Vec<crate::slurm::JobId> = ids
            .iter()
            .filter(|id| !known.contains_key(&id.to_string()))
            .copied()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !new.is_empty() {
            let listed = slurm.jobs(&new)?;
            for id in &new {
                known.insert(id.to_string(), listed.iter().find(|j| j.id == *id).cloned());
            }
        }
        Ok(ids
            .iter()
            .filter_map(|id| known.get(&id.to_string()).cloned().flatten())
            .map(|j| (j.id.to_string(), j))
            .collect())
    }

    /// A run dir's `status.json`, read once per observation.
    pub fn record(&self, run_dir: &std::path::Path) -> launch_spec::rundir::StatusRecord {
        let mut records = self.records.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        records
            .entry(run_dir.to_path_buf())
            .or_insert_with(|| {
                // Counted by the tests (`SUBMITTER_LOG=submitter::observe=debug`): one per run dir.
                tracing::debug!(run_dir = %run_dir.display(), "read status.json");
                launch_spec::rundir::read_status(run_dir)
            })
            .clone()
    }

    /// The attempt's own `status.json` (its run dir's, when it names the attempt's job).
    pub fn status_of(&self, attempt: &Attempt) -> Option<RunStatus> {
        let dir = run_dir_of(attempt)?;
        self.record(&dir).into_status().filter(|s| belongs_to(s, attempt))
    }
}
