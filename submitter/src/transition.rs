//! The one path of a state change (docs/design.md §0, "The reconcile"): every change of an
//! attempt's ledger status — a result `sync` folds in, a submission that failed, a stale job
//! cancelled for its resubmission, remediation's cancel, retry or hold, `submitter cancel` — goes
//! through [`Recorder::apply`], which writes the ledger, mirrors the change to the team database
//! when one is configured, and emits one typed [`Transition`] event. Text output, `--json`,
//! notifications and the report consume the events (the reporter pattern); nothing else writes an
//! attempt's status.

use std::cell::RefCell;

use serde::Serialize;
use serde_json::Value;

use crate::domain::RemediationAct;
use crate::ledger::{AttemptId, AttemptStatus, Ledger, LedgerError};
use crate::team::mirror::Mirror;
use crate::team::publish;

/// What caused a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "by", content = "action")]
pub enum Origin {
    /// `sync` (the command, or the first step of a launch iteration) folded payload's records and
    /// Slurm's state in.
    Sync,
    /// The executor of a launch: a submission that failed or was left unconfirmed, a stale
    /// pending job cancelled for its resubmission.
    Submission,
    /// Remediation's act (`cancel`, `retry`, `hold`; the profile's `remediation:` policy).
    Remediation(RemediationAct),
    /// `submitter cancel`.
    Operator,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Sync => "sync",
            Origin::Submission => "submission",
            Origin::Remediation(_) => "remediation",
            Origin::Operator => "operator",
        }
    }
}

/// One change of an attempt's state: the event every consumer hears. A repair that changes no
/// status (a job id found for a row without one) has `from == to`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Transition {
    pub attempt: i64,
    pub model: String,
    pub benchmark: String,
    pub from: AttemptStatus,
    pub to: AttemptStatus,
    pub reason: String,
    /// It ended by the walltime: the next plan continues it, and it is not counted as a failure.
    pub resumable: bool,
    /// What was stored with it (a finished attempt's Harbor metrics).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Value>,
    /// The attempt's GPU-hours, where its records give them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_hours: Option<f64>,
    pub origin: Origin,
}

impl Transition {
    /// A change of `attempt` (its id, pair and current status) to `to`, for `reason`.
    pub fn of(attempt: Subject<'_>, to: AttemptStatus, reason: impl Into<String>, origin: Origin) -> Transition {
        Transition {
            attempt: attempt.id.0,
            model: attempt.model.to_string(),
            benchmark: attempt.benchmark.to_string(),
            from: attempt.status,
            to,
            reason: reason.into(),
            resumable: false,
            metrics: None,
            gpu_hours: None,
            origin,
        }
    }

    /// Whether the ledger status changes (a repair or a reason update does not).
    pub fn changes_status(&self) -> bool {
        self.from != self.to
    }
}

/// The attempt a transition is about, as its caller knows it.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub id: AttemptId,
    pub model: &'a str,
    pub benchmark: &'a str,
    pub status: AttemptStatus,
    /// Its Slurm job, re-published with every move (one the team database missed while it was
    /// down is filled in once it is back).
    pub job_id: Option<&'a str>,
}

impl<'a> From<&'a crate::ledger::Attempt> for Subject<'a> {
    fn from(a: &'a crate::ledger::Attempt) -> Self {
        Subject {
            id: a.id,
            model: &a.model,
            benchmark: &a.benchmark,
            status: a.status,
            job_id: a.slurm_job_id.as_deref(),
        }
    }
}

/// The one writer of attempts' states for one command (or one launch iteration): the ledger, the
/// team mirror, and the events heard by the command's outputs and the notifier.
pub struct Recorder<'a> {
    ledger: &'a dyn Ledger,
    mirror: Option<&'a Mirror>,
    events: RefCell<Vec<Transition>>,
}

impl<'a> Recorder<'a> {
    pub fn new(ledger: &'a dyn Ledger, mirror: Option<&'a Mirror>) -> Recorder<'a> {
        Recorder { ledger, mirror, events: RefCell::new(Vec::new()) }
    }

    pub fn ledger(&self) -> &'a dyn Ledger {
        self.ledger
    }

    pub fn mirror(&self) -> Option<&'a Mirror> {
        self.mirror
    }

    /// Applies `change`: the ledger first (it is the authority; its error stops the caller), then
    /// the team mirror (a failure only warns), then the event. A finished record that came after
    /// its attempt was marked vanished (`from` failed, `to` finished) is the ledger's
    /// `finish_vanished`; a walltime end is also marked resumable.
    pub fn apply(&self, change: Transition, job_id: Option<&str>) -> Result<(), LedgerError> {
        let id = AttemptId(change.attempt);
        if change.from == AttemptStatus::Failed && change.to == AttemptStatus::Finished {
            self.ledger.finish_vanished(id, &change.reason, change.metrics.as_ref())?;
        } else {
            self.ledger.transition(id, change.to, &change.reason, change.metrics.as_ref())?;
        }
        if change.resumable {
            self.ledger.mark_resumable(id)?;
        }
        if change.to != AttemptStatus::Pending {
            publish(self.mirror, &format!("attempt {id} → {}", change.to), |m| {
                if let Some(job) = job_id {
                    m.submitted(id, job)?;
                }
                m.transition(id, change.to, change.metrics.as_ref())
            });
        }
        self.events.borrow_mut().push(change);
        Ok(())
    }

    /// Moves attempt `id` to `to` for `reason`: its pair, current status and job are the
    /// ledger's (one read), for callers that hold only the id.
    pub fn apply_to(&self, id: AttemptId, to: AttemptStatus, reason: &str, origin: Origin) -> Result<(), LedgerError> {
        let attempt =
            self.ledger.attempt(id)?.ok_or_else(|| LedgerError::NotFound { location: "the ledger".into(), id })?;
        self.apply(Transition::of((&attempt).into(), to, reason, origin), attempt.slurm_job_id.as_deref())
    }

    /// An event that writes no status (a repair: the job id of a row that had none, which the
    /// caller bound in the ledger).
    pub fn note(&self, change: Transition) {
        self.events.borrow_mut().push(change);
    }

    /// The events so far, in order (and no more: the next call starts empty).
    pub fn take(&self) -> Vec<Transition> {
        std::mem::take(&mut *self.events.borrow_mut())
    }

    /// The events so far, without taking them.
    pub fn events(&self) -> Vec<Transition> {
        self.events.borrow().clone()
    }
}
