//! Domain types shared by the layers of the submitter (planning, ledger, sync, verification), so
//! the pure deciding code depends on none of the effectful modules: an attempt's lifecycle and
//! Slurm's view of its job.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An attempt's status. Active: `pending` (row written, job queued or being submitted) and
/// `started` (payload is running). Terminal: `finished`, `failed`, `cancelled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttemptStatus {
    Pending,
    Started,
    Finished,
    Failed,
    Cancelled,
}

impl AttemptStatus {
    pub const ALL: [AttemptStatus; 5] = [
        AttemptStatus::Pending,
        AttemptStatus::Started,
        AttemptStatus::Finished,
        AttemptStatus::Failed,
        AttemptStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AttemptStatus::Pending => "pending",
            AttemptStatus::Started => "started",
            AttemptStatus::Finished => "finished",
            AttemptStatus::Failed => "failed",
            AttemptStatus::Cancelled => "cancelled",
        }
    }

    pub fn is_active(self) -> bool {
        matches!(self, AttemptStatus::Pending | AttemptStatus::Started)
    }

    pub fn is_terminal(self) -> bool {
        !self.is_active()
    }

    /// Legal moves: forward only (pending → started → a terminal status, or pending straight to
    /// one), plus re-entering the current status (an idempotent sync updating reason or metrics).
    /// A terminal status is final: a new try is a new attempt row, never a revived one.
    pub(crate) fn can_become(self, to: AttemptStatus) -> bool {
        self == to
            || match self {
                AttemptStatus::Pending => true,
                AttemptStatus::Started => to.is_terminal(),
                AttemptStatus::Finished | AttemptStatus::Failed | AttemptStatus::Cancelled => false,
            }
    }

    /// The statuses from which `to` may be entered.
    pub(crate) fn sources_of(to: AttemptStatus) -> Vec<AttemptStatus> {
        AttemptStatus::ALL.into_iter().filter(|from| from.can_become(to)).collect()
    }
}

impl fmt::Display for AttemptStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AttemptStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        AttemptStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| format!("unknown attempt status {s:?}"))
    }
}

/// What remediation (or a person) did about a pair, as the ledger records it (`remediations.action`):
/// typed from the decision to the ledger and back (issue 34).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RemediationAct {
    Cancel,
    Retry,
    Hold,
    /// A person's `release`: the pair starts afresh.
    Release,
}

impl RemediationAct {
    pub const ALL: [RemediationAct; 4] =
        [RemediationAct::Cancel, RemediationAct::Retry, RemediationAct::Hold, RemediationAct::Release];

    pub fn as_str(self) -> &'static str {
        match self {
            RemediationAct::Cancel => "cancel",
            RemediationAct::Retry => "retry",
            RemediationAct::Hold => "hold",
            RemediationAct::Release => "release",
        }
    }
}

impl fmt::Display for RemediationAct {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RemediationAct {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        RemediationAct::ALL
            .into_iter()
            .find(|act| act.as_str() == s)
            .ok_or_else(|| format!("unknown remediation action {s:?}"))
    }
}

/// What Slurm says about an attempt's job right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SlurmView {
    /// Pending in the queue.
    Queued,
    /// Running (or completing).
    Running,
    /// Slurm no longer lists it, or lists it as ended.
    Gone,
}

/// The key of an attempt's config holding its submission tag: the job's `--comment`, by which a job
/// whose sbatch answer was lost is found again (docs/decisions.md, idempotent submission).
pub(crate) const SUBMISSION_TAG_KEY: &str = "submission_tag";

/// How the reason of an attempt failed as vanished starts (sync, the executor's prerequisite):
/// the ledger finds them by it to fold in a late final record.
pub(crate) const VANISHED: &str = "vanished";

/// The key of a shared job's leg's config (issue 24): `{group_tag, group_dir, legs}` (the legs'
/// run tags). Its attempts share one Slurm job id and one submission tag.
pub(crate) const SHARED_KEY: &str = "shared";

/// The key of a pool's leg's config (issue 37), beside [`SHARED_KEY`] (whose `legs` are every leg
/// of the pool, so its GPU time is divided among them all): `{group_tag, member, model}`. A leg
/// with no record when the pool's job ended was never started (its member's turn did not come) and
/// is continued, not failed (docs/allocation.md "Pools").
pub(crate) const POOL_KEY: &str = "pool";

/// The cluster name under which the team's imported history lives in the ledger.
pub const TEAM_CLUSTER: &str = "ot-agent";

/// An attempt's place in a walltime chain, recorded in its config when it was submitted
/// (`continues`, `continuation`, `chain_from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Continuation {
    /// The attempt this one continues.
    pub attempt: i64,
    /// 1 for the first continuation, …
    pub number: u32,
    /// The chain's first attempt (the fresh one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first: Option<i64>,
}

impl Continuation {
    /// Reads it from an attempt's recorded config; None for a fresh attempt.
    pub(crate) fn of_config(config: &serde_json::Value) -> Option<Continuation> {
        let attempt = config.get("continues")?.as_i64()?;
        let number = u32::try_from(config.get("continuation")?.as_u64()?).ok()?;
        Some(Continuation { attempt, number, first: config.get("chain_from").and_then(serde_json::Value::as_i64) })
    }

    /// Writes it into an attempt's config.
    pub fn record(&self, config: &mut serde_json::Value) {
        config["continues"] = self.attempt.into();
        config["continuation"] = self.number.into();
        if let Some(first) = self.first {
            config["chain_from"] = first.into();
        }
    }
}

/// What remediation changed in a pair's next launch (docs/verification.md "Remediation"): recorded
/// with each retry in the ledger (the whole adjustment after that retry), applied by spec building.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PairAdjustment {
    /// `serve.gpu_memory_utilization` for the next attempt (an out-of-memory at start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_utilization: Option<f64>,
    /// `serve.health_timeout_s` for the next attempt (a load still progressing at the deadline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_timeout_s: Option<u64>,
    /// Pinggy pairs (by public URL) left out of the next spec's bank (their token was locked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skip_pinggy: Vec<String>,
    /// Nodes for `sbatch --exclude` (a node-level fault).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_nodes: Vec<String>,
    /// Not queued before this instant (the sandbox provider failed the last attempt's trials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<chrono::DateTime<chrono::Utc>>,
}

impl PairAdjustment {
    pub fn is_empty(&self) -> bool {
        *self == PairAdjustment::default()
    }
}

/// When a team row still Pending or Started counts as dead: the team's rule (issue 31; the seed's
/// `--stale-pending-hours 6`, `--stale-started-hours 24`), the one place these bounds live. A
/// profile's `team.stale_pending_hours`/`stale_started_hours` change them for its fold-ins.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Staleness {
    pub(crate) pending_s: i64,
    pub(crate) started_s: i64,
}

impl Staleness {
    pub(crate) const DEFAULT_PENDING_HOURS: f64 = 6.0;
    pub(crate) const DEFAULT_STARTED_HOURS: f64 = 24.0;

    pub(crate) fn from_hours(pending: f64, started: f64) -> Staleness {
        Staleness { pending_s: (pending * 3600.0) as i64, started_s: (started * 3600.0) as i64 }
    }
}

impl Default for Staleness {
    fn default() -> Self {
        Staleness::from_hours(Self::DEFAULT_PENDING_HOURS, Self::DEFAULT_STARTED_HOURS)
    }
}
