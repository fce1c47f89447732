//! One snapshot of everything planning reads — the ledger, Slurm, payload's records and the clock —
//! taken once per iteration (docs/submitter.md, "Snapshot, decide, act"). The planner is a pure
//! function of it; nothing here writes. Within a launch iteration, Slurm's answer and the run
//! records are the iteration's one observation (`observe::Observation`).
//!
//! Order matters: the ledger first, then Slurm about the active attempts in it, so every job id
//! asked about was submitted before Slurm is asked (a job another submitter just queued is never
//! mistaken for a vanished one).

use std::collections::{HashMap, HashSet};

use crate::decide::Elsewhere;
use crate::domain::SlurmView;
use crate::ledger::{AttemptId, Heartbeat, Ledger, LedgerError, PairState, Timestamp};
use crate::observe::{Observation, view_of};
use crate::slurm::{Slurm, SlurmError};

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Slurm(#[from] SlurmError),
}

/// A pair's key: (model, benchmark family, Harbor agent), an eval's identity.
pub(crate) type PairKey = (String, String, String);

/// The state the planner decides over.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The cluster this submitter reconciles.
    pub cluster: String,
    /// When it was taken (ages are measured from here).
    pub now: Timestamp,
    /// Benchmark → family.
    pub families: HashMap<String, String>,
    /// (model, family, agent) → the pair's latest attempt and counts.
    pub pairs: HashMap<PairKey, PairState>,
    /// Per cluster, its freshest heartbeat.
    pub heartbeats: HashMap<String, Heartbeat>,
    /// Slurm's view of the jobs of this cluster's active attempts, by job id; an active attempt's
    /// job missing here is gone.
    pub jobs: HashMap<String, SlurmView>,
    /// Active attempts whose `status.json` records an outcome that sync has not folded in yet.
    pub(crate) recorded_outcome: HashSet<AttemptId>,
    /// Active attempts whose `status.json` was written within
    /// [`crate::observe::VANISHED_AFTER_QUIET_S`]: alive, whatever Slurm's one answer says.
    pub(crate) records_fresh: HashSet<AttemptId>,
    /// Active attempts of this cluster (the throttle counts them).
    pub in_flight: u32,
    /// Each pair's remediation state (held, the adjustment of its next launch).
    pub(crate) remedies: HashMap<PairKey, crate::ledger::PairRemedy>,
}

impl Snapshot {
    /// Reads the snapshot: ledger, then Slurm (one `squeue` for this cluster's active jobs), then
    /// the run records of the active attempts. `now` is the caller's clock.
    pub fn read(
        ledger: &dyn Ledger,
        slurm: &dyn Slurm,
        cluster: &str,
        now: Timestamp,
    ) -> Result<Snapshot, SnapshotError> {
        Snapshot::observed(ledger, slurm, cluster, &Observation::empty(now))
    }

    /// [`Snapshot::read`] within a reconcile: Slurm and the run records as `world` observed them
    /// (a launch iteration asks Slurm once for sync, remediation and the plan).
    pub fn observed(
        ledger: &dyn Ledger,
        slurm: &dyn Slurm,
        cluster: &str,
        world: &Observation,
    ) -> Result<Snapshot, SnapshotError> {
        let now = world.now;
        let families = ledger.families()?.into_iter().collect();
        let pairs: HashMap<_, _> = ledger
            .latest_per_pair()?
            .into_iter()
            .map(|p| ((p.model.clone(), p.family.clone(), p.agent.clone()), p))
            .collect();
        let mut heartbeats: HashMap<String, Heartbeat> = HashMap::new();
        for beat in ledger.heartbeats()? {
            match heartbeats.get(&beat.cluster) {
                Some(known) if known.age_s <= beat.age_s => {}
                _ => {
                    heartbeats.insert(beat.cluster.clone(), beat);
                }
            }
        }
        let remedies = crate::ledger::fold_remediations(&ledger.remediations()?);
        let in_flight = ledger.active()?.iter().filter(|a| a.cluster == cluster).count() as u32;
        let active: Vec<_> =
            pairs.values().map(|p| &p.latest).filter(|a| a.status.is_active() && a.cluster == cluster).collect();
        let ids: Vec<_> = active.iter().filter_map(|a| a.slurm_job_id.as_deref()?.parse().ok()).collect();
        let jobs = world.jobs(slurm, &ids)?.values().map(|j| (j.id.to_string(), view_of(Some(j)))).collect();
        let mut recorded_outcome = HashSet::new();
        let mut records_fresh = HashSet::new();
        for attempt in &active {
            let Some(status) = world.status_of(attempt) else { continue };
            if status.outcome.is_some() {
                recorded_outcome.insert(attempt.id);
            } else if crate::observe::records_fresh(&status, now) {
                records_fresh.insert(attempt.id);
            }
        }
        Ok(Snapshot {
            cluster: cluster.to_string(),
            now,
            families,
            pairs,
            heartbeats,
            jobs,
            recorded_outcome,
            records_fresh,
            in_flight,
            remedies,
        })
    }

    /// How `cluster` looks from here: None for our own cluster, else the other cluster with the
    /// freshest heartbeat of its submitters.
    pub fn elsewhere(&self, cluster: &str) -> Option<Elsewhere> {
        (cluster != self.cluster).then(|| Elsewhere {
            cluster: cluster.to_string(),
            heartbeat: self.heartbeats.get(cluster).map(|h| (h.age_s, h.stale_after_s)),
        })
    }

    pub fn family_of(&self, benchmark: &str) -> String {
        self.families.get(benchmark).cloned().unwrap_or_else(|| benchmark.to_string())
    }
}
