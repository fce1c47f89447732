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
