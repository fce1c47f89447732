//! Remediation (docs/verification.md "Remediation"): what the loop does about a diagnosis — cancel
//! the job, retry the pair with the change the diagnosis implies, or hold the pair until a person
//! releases it. [`decide`] is pure (a job's diagnoses, its pair's remediation state and the
//! profile's `remediation:` section → at most one [`Decision`]); [`cases`] gathers the inputs from
//! `status`'s rows and the run dirs; [`carry_out`] does the effects (scancel, ledger). The change of
//! a retry is recorded in the ledger as the pair's [`PairAdjustment`], which spec building applies
//! to the pair's next launch spec (`spec_build::apply_adjustment`).

use std::path::Path;

use chrono::{DateTime, Utc};
use serde::Serialize;

pub use crate::config::remediation::{Change, Policy, RemediationSettings, TABLE};
use crate::domain::{PairAdjustment, RemediationAct};
use crate::ledger::{AttemptId, AttemptStatus, Ledger, LedgerError, NewRemediation, PairRemedy, Remediation};
use crate::observe::Observation;
use crate::slurm::{JobId, Slurm, SlurmError};
use crate::transition::{Origin, Recorder};
use crate::verify::verdict::StatusRow;
use crate::verify::{Level, VerdictKind, VerifySettings, check, human_duration};

/// One thing wrong with a job: a finding id (or `outcome.<class>[.<cause>]`) and its summary.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Diag {
    pub id: String,
    pub summary: String,
    /// Set when `status`'s verdict stands on it: dead and stalled verdicts must have held for the
    /// profile's bound before anything is done.
    pub verdict: Option<(VerdictKind, i64)>,
}

/// What the failed launch ran with, for the change of a retry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LaunchFacts {
    /// The ceiling payload used (status.json `gpu`), else the spec's.
    pub gpu_memory_utilization: Option<f64>,
    pub health_timeout_s: Option<u64>,
    /// The spec's Pinggy pairs (public URLs), first pair first.
    pub(crate) pinggy_pairs: Vec<String>,
    /// The pair the job took (its last `tunnel_pair` event).
    pub(crate) pinggy_taken: Option<String>,
    /// The node it ran on (status.json `node`).
    pub node: Option<String>,
}

/// One job to judge: its pair, whether it still holds a Slurm job, what is wrong with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub attempt: i64,
    pub model: String,
    pub benchmark: String,
    pub family: String,
    pub agent: String,
    pub cluster: String,
    /// The Slurm job to cancel when the attempt is still active.
    pub(crate) active_job: Option<String>,
    pub(crate) diagnoses: Vec<Diag>,
    pub facts: LaunchFacts,
    /// When the diagnoses were made (a wait runs from here).
    pub(crate) judged_at: DateTime<Utc>,
}

/// What to do about one attempt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    pub attempt: i64,
    pub model: String,
    pub benchmark: String,
    pub family: String,
    pub agent: String,
    pub cluster: String,
    /// The diagnosis that caused it.
    pub finding: String,
    /// `cancel`, `retry` or `hold`.
    pub action: Policy,
    /// The retry's change in words (empty otherwise).
    pub change: String,
    /// For a retry: the pair's whole adjustment after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adjustment: Option<PairAdjustment>,
    pub reason: String,
    /// The Slurm job cancelled first (the attempt was still active).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cancels_job: Option<String>,
}

impl Decision {
    /// Whether carrying it out ended an active attempt (its job cancelled, the attempt failed).
    pub fn ended_an_attempt(&self) -> bool {
        self.cancels_job.is_some()
    }

    /// One line for people: what, why, the change.
    pub fn line(&self) -> String {
        let job = self.cancels_job.as_ref().map(|j| format!(", cancels job {j}")).unwrap_or_default();
        let change = if self.change.is_empty() { String::new() } else { format!(" [{}]", self.change) };
        format!(
            "remediation: {} {} on {} (attempt {}{job}){change}: {}",
            self.action.as_str(),
            self.model,
            self.benchmark,
            self.attempt,
            self.reason
        )
    }
}

/// The decision for one job, or none (pure). The first diagnosis in the table's order whose
/// policy is not `off` (and, for a dead or stalled verdict, that has held past its bound) decides;
/// a cancel needs a job to cancel. A retry past `max_retries`, or whose change cannot be made (the
/// ceiling at its floor, no other Pinggy pair, no node to exclude), becomes a hold.
pub fn decide(case: &Case, pair: &PairRemedy, s: &RemediationSettings) -> Option<Decision> {
    if !s.enabled || pair.acted_on.contains(&case.attempt) || pair.held.is_some() {
        return None;
    }
    for row in TABLE {
        let Some(diag) = case.diagnoses.iter().find(|d| d.id == row.id) else { continue };
        let due = match diag.verdict {
            Some((VerdictKind::Dead, held)) => held >= s.dead_after_s as i64,
            Some((VerdictKind::Stalled, held)) => held >= s.stalled_after_s as i64,
            _ => true,
        };
        if !due {
            continue;
        }
        let why = format!("{}: {}", diag.id, diag.summary);
        let decision = |action, change: String, adjustment, reason: String| Decision {
            attempt: case.attempt,
            model: case.model.clone(),
            benchmark: case.benchmark.clone(),
            family: case.family.clone(),
            agent: case.agent.clone(),
            cluster: case.cluster.clone(),
            finding: diag.id.clone(),
            action,
            change,
            adjustment,
            reason,
            cancels_job: case.active_job.clone(),
        };
        match s.policy(row.id) {
            Policy::Off => continue,
            Policy::Cancel if case.active_job.is_none() => continue,
            Policy::Cancel => return Some(decision(Policy::Cancel, String::new(), None, why)),
            Policy::Hold => return Some(decision(Policy::Hold, String::new(), None, why)),
            Policy::Retry => {
                if pair.retries >= s.max_retries {
                    let reason = format!(
                        "{why} (retried {} time(s), remediation.max_retries {}: a person should look)",
                        pair.retries, s.max_retries
                    );
                    return Some(decision(Policy::Hold, String::new(), None, reason));
                }
                let Some(change) = row.change else { continue };
                return Some(match retry_change(change, &case.facts, &pair.adjustment, s, case.judged_at) {
                    Ok((text, adjustment)) => decision(Policy::Retry, text, Some(adjustment), why),
                    Err(cannot) => decision(Policy::Hold, String::new(), None, format!("{why} ({cannot})")),
                });
            }
        }
    }
    None
}

/// The change a retry makes, from what the failed launch ran with: its words and the pair's whole
/// adjustment after it; or why it cannot be made.
pub(crate) fn retry_change(
    change: Change,
    facts: &LaunchFacts,
    before: &PairAdjustment,
    s: &RemediationSettings,
    now: DateTime<Utc>,
) -> Result<(String, PairAdjustment), String> {
    let mut after = before.clone();
    let text = match change {
        Change::WaitForProvider => {
            let at = now + chrono::Duration::seconds(s.provider_wait_s as i64);
            after.not_before = Some(at);
            format!("wait for the sandbox provider: not before {} (remediation.provider_wait_s)", at.to_rfc3339())
        }
        Change::LowerGpuMemory => {
            let current = facts.gpu_memory_utilization.or(before.gpu_memory_utilization).unwrap_or(0.9);
            // Two decimals: the ceiling is a setting people read and type.
            let lowered = ((current - s.gpu_memory_step) * 100.0).round() / 100.0;
            if lowered < s.gpu_memory_floor - 1e-9 {
                return Err(format!(
                    "serve.gpu_memory_utilization {current:.2} cannot go below remediation.gpu_memory_floor {:.2}",
                    s.gpu_memory_floor
                ));
            }
            after.gpu_memory_utilization = Some(lowered);
            format!("serve.gpu_memory_utilization {current:.2} → {lowered:.2}")
        }
        Change::LongerReadiness => {
            let current = facts
                .health_timeout_s
                .or(before.health_timeout_s)
                .unwrap_or(launch_spec::spec::DEFAULT_HEALTH_TIMEOUT_S);
            let longer = (current as f64 * s.ready_budget_factor).ceil() as u64;
            after.health_timeout_s = Some(longer);
            format!("serve.health_timeout_s {current} → {longer}")
        }
        Change::NextPinggyPair => {
            if facts.pinggy_pairs.is_empty() {
                return Err("the spec has no Pinggy pairs".into());
            }
            let skipped = &before.skip_pinggy;
            let locked = facts
                .pinggy_taken
                .clone()
                .filter(|u| facts.pinggy_pairs.contains(u))
                .or_else(|| facts.pinggy_pairs.iter().find(|u| !skipped.contains(u)).cloned())
                .ok_or("every Pinggy pair of the bank was locked: free a token or add pairs")?;
            if !after.skip_pinggy.contains(&locked) {
                after.skip_pinggy.push(locked.clone());
            }
            let Some(next) = facts.pinggy_pairs.iter().find(|u| !after.skip_pinggy.contains(u)) else {
                return Err(format!("{locked} was the bank's last usable Pinggy pair: free a token or add pairs"));
            };
            format!("tunnel.pinggy: {locked} left out, {next} first")
        }
        Change::ExcludeNode => {
            let node = facts.node.clone().ok_or("the node it ran on is unknown (no status.json node)")?;
            if !after.exclude_nodes.contains(&node) {
                after.exclude_nodes.push(node);
            }
            format!("sbatch --exclude={}", after.exclude_nodes.join(","))
        }
    };
    Ok((text, after))
}

/// The diagnosis id of payload's recorded end: `outcome.<class>` and `outcome.<class>.<cause>`.
fn outcome_diagnoses(outcome: &launch_spec::records::Outcome) -> Vec<Diag> {
    let class = format!("outcome.{}", outcome.class.as_str());
    let summary = format!("payload ended the run: {}", outcome.message);
    let mut ids = vec![class.clone()];
    if let Some(cause) = &outcome.cause {
        ids.insert(0, format!("{class}.{cause}"));
    }
    ids.into_iter().map(|id| Diag { id, summary: summary.clone(), verdict: None }).collect()
}

/// What a run dir says the job ran with.
fn launch_facts(dir: &Path, status: Option<&launch_spec::records::RunStatus>) -> LaunchFacts {
    let spec = launch_spec::LaunchSpec::from_file(&dir.join(launch_spec::records::SPEC_FILE)).ok();
    let pinggy_pairs = match spec.as_ref().map(|s| &s.tunnel) {
        Some(launch_spec::spec::TunnelSpec::Pinggy(p)) => {
            p.pairs().into_iter().map(|pair| pair.public_url.trim_end_matches('/').to_string()).collect()
        }
        _ => Vec::new(),
    };
    let pinggy_taken =
        launch_spec::rundir::read_events_where(dir, |k| *k == launch_spec::rundir::EventKind::TunnelPair)
            .iter()
            .rev()
            .find_map(|e| e.pair_url().map(|u| u.trim_end_matches('/').to_string()));
    LaunchFacts {
        gpu_memory_utilization: status
            .and_then(|s| s.gpu.as_ref().map(|g| g.gpu_memory_utilization))
            .or(spec.as_ref().and_then(|s| s.serve.gpu_memory_utilization.or(s.serve.cluster_gpu_memory_utilization))),
        health_timeout_s: spec.as_ref().map(|s| s.serve.health_timeout_s),
        pinggy_pairs,
        pinggy_taken,
        node: status.and_then(|s| s.node.clone()),
    }
}

/// The jobs to judge, from `status`'s rows (active attempts and recently ended ones): an active
/// job's verdict when it is bad, `check`'s failing findings of its run dir (a full read: instant
/// trial failures are `check`'s alone), and payload's recorded end; an ended attempt's recorded end
/// when the ledger says it failed. Reads the run dirs; decides nothing.
pub fn cases(rows: &[StatusRow], world: &Observation, settings: &VerifySettings) -> Vec<Case> {
    let now = world.now;
    let mut out = Vec::new();
    for row in rows {
        let active = row.ledger_status.is_active();
        if !active && row.ledger_status != AttemptStatus::Failed {
            continue;
        }
        let dir = row.run_dir.as_deref().map(Path::new);
        // A resubmission reuses the run dir: its records are this attempt's only when they name its job.
        let record = dir.map(|d| world.record(d));
        let status = record.clone().and_then(|r| r.of_job(row.slurm_job_id.as_deref()));
        let mut diagnoses = Vec::new();
        if active
            && row.verdict.verdict.is_bad()
            && let Some(id) = row.verdict.finding
        {
            diagnoses.push(Diag {
                id: id.to_string(),
                summary: row.verdict.summary.clone(),
                verdict: Some((row.verdict.verdict, (now - row.verdict.since).num_seconds())),
            });
        }
        if active
            && row.slurm == "RUNNING"
            && let Some(d) = dir
            && let Ok(run) = check::check_run_dir_with(d, record.clone(), settings, now)
        {
            for f in run.findings.iter().filter(|f| f.level == Level::Fail) {
                if !diagnoses.iter().any(|d| d.id == f.id) {
                    diagnoses.push(Diag { id: f.id.to_string(), summary: f.summary.clone(), verdict: None });
                }
            }
        }
        if let Some(outcome) = status.as_ref().and_then(|s| s.outcome.as_ref()) {
            diagnoses.extend(outcome_diagnoses(outcome));
        }
        if diagnoses.is_empty() {
            continue;
        }
        out.push(Case {
            attempt: row.attempt,
            model: row.model.clone(),
            benchmark: row.benchmark.clone(),
            family: row.family.clone(),
            agent: row.agent.clone(),
            cluster: row.cluster.clone(),
            active_job: row.slurm_job_id.clone().filter(|_| active),
            diagnoses,
            facts: dir.map(|d| launch_facts(d, status.as_ref())).unwrap_or_default(),
            judged_at: now,
        });
    }
    out
}

/// Every pair's remediation state from the ledger.
pub fn pair_states(
    ledger: &dyn Ledger,
) -> Result<std::collections::HashMap<(String, String, String), PairRemedy>, LedgerError> {
    Ok(crate::ledger::fold_remediations(&ledger.remediations()?))
}

/// The decisions for `status`'s rows (pure but for reading the run dirs).
pub fn plan(
    rows: &[StatusRow],
    world: &Observation,
    states: &std::collections::HashMap<(String, String, String), PairRemedy>,
    remediation: &RemediationSettings,
    verify: &VerifySettings,
) -> Vec<Decision> {
    if !remediation.enabled {
        return Vec::new();
    }
    let empty = PairRemedy::default();
    cases(rows, world, verify)
        .iter()
        .filter_map(|case| {
            let key = (case.model.clone(), case.family.clone(), case.agent.clone());
            decide(case, states.get(&key).unwrap_or(&empty), remediation)
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum RemediateError {
    #[error("the ledger")]
    Ledger(#[from] LedgerError),
    /// Its cause stays in the error's chain, so the exit status is Slurm's (4), as for `cancel`
    /// (issue 32 item 11).
    #[error("Slurm")]
    Slurm(#[from] SlurmError),
}

/// Carries out one decision: records the act first, then cancels the job (and marks the attempt
/// failed with the reason) when it is still active. `Ok(false)` when another loop recorded this
/// attempt first (nothing is cancelled then). The record goes first so that a failure after it —
/// `scancel` refused, the ledger gone between `scancel` and the attempt's status — leaves a hold or
/// retry that [`reconcile`] completes on the next pass, never a cancelled job with no hold.
pub(crate) fn carry_out(
    decision: &Decision,
    recorder: &Recorder,
    slurm: &dyn Slurm,
    username: &str,
) -> Result<bool, RemediateError> {
    // A decision is never `off` (`decide` skips those): nothing to record.
    let Some(action) = decision.action.act() else { return Ok(false) };
    let recorded = recorder.ledger().record_remediation(&NewRemediation {
        model: decision.model.clone(),
        family: decision.family.clone(),
        agent: decision.agent.clone(),
        cluster: decision.cluster.clone(),
        attempt: Some(AttemptId(decision.attempt)),
        finding: decision.finding.clone(),
        action,
        change: decision.change.clone(),
        adjustment: decision.adjustment.clone(),
        reason: decision.reason.clone(),
        username: username.to_string(),
    })?;
    if recorded && let Some(job) = decision.cancels_job.as_deref() {
        let reason = act_reason(action, &decision.reason);
        end_attempt(recorder, slurm, AttemptId(decision.attempt), Some(job), &reason, action)?;
    }
    Ok(recorded)
}

/// The reason an attempt remediation ended carries.
fn act_reason(action: RemediationAct, reason: &str) -> String {
    format!("remediation {action} ({reason})")
}

/// Cancels the attempt's job and fails the attempt (the side effect first: a failed attempt whose
/// job still runs would let the pair be submitted beside it).
fn end_attempt(
    recorder: &Recorder,
    slurm: &dyn Slurm,
    attempt: AttemptId,
    job: Option<&str>,
    reason: &str,
    action: RemediationAct,
) -> Result<(), RemediateError> {
    if let Some(id) = job.and_then(|j| j.parse::<JobId>().ok()) {
        slurm.cancel(id, None, false)?;
    }
    recorder.apply_to(attempt, AttemptStatus::Failed, reason, Origin::Remediation(action))?;
    Ok(())
}

/// Completes the acts an earlier pass recorded but could not finish: an attempt remediation
/// recorded an act on that is still active in the ledger has its job cancelled (again: `scancel` of
/// an ended job is harmless) and is failed with the act's reason. Only `cluster`'s attempts: another
/// cluster's job ids mean nothing to this Slurm. A `scancel` that fails is `backoff`'s as in a
/// pass (issue 32 item 11): not asked again before its time, and no reason to stop the others.
pub(crate) fn reconcile(
    recorder: &Recorder,
    slurm: &dyn Slurm,
    cluster: &str,
    backoff: &mut ScancelBackoff,
    now: DateTime<Utc>,
) -> Result<Reconciled, RemediateError> {
    let ledger = recorder.ledger();
    let records = ledger.remediations()?;
    let mut done = Reconciled::default();
    let active = ledger.active()?;
    for attempt in active.into_iter().filter(|a| a.cluster == cluster) {
        if !backoff.due(attempt.id.0, now) {
            continue;
        }
        let Some(record) =
            records.iter().find(|r| r.attempt == Some(attempt.id) && r.action != RemediationAct::Release)
        else {
            continue;
        };
        let reason = act_reason(record.action, &record.reason);
        match end_attempt(recorder, slurm, attempt.id, attempt.slurm_job_id.as_deref(), &reason, record.action) {
            Ok(()) => {
                backoff.succeeded(attempt.id.0);
                done.completed.push(attempt.id);
            }
            Err(RemediateError::Slurm(error)) => {
                let next = backoff.failed(attempt.id.0, now);
                done.cancel_failed.push((attempt.id, error, next));
            }
            Err(error) => return Err(error),
        }
    }
    Ok(done)
}

/// What [`reconcile`] did.
#[derive(Debug, Default)]
pub(crate) struct Reconciled {
    /// The attempts whose recorded act was completed.
    pub completed: Vec<AttemptId>,
    /// The attempts whose job Slurm would not cancel, why, and when it is asked next.
    pub cancel_failed: Vec<(AttemptId, SlurmError, DateTime<Utc>)>,
}

/// When remediation asks Slurm again to cancel a job it could not cancel (issue 32 item 11): a
/// failed `scancel` is not retried on every `--watch` iteration but after a back-off that doubles
/// from [`ScancelBackoff::FIRST`] up to [`ScancelBackoff::LONGEST`], per attempt; one that
/// succeeds is forgotten. Pure: the caller passes the time.
#[derive(Debug)]
pub(crate) struct ScancelBackoff {
    /// attempt → (failures so far, not before).
    failed: std::collections::BTreeMap<i64, (u32, DateTime<Utc>)>,
}

impl Default for ScancelBackoff {
    fn default() -> Self {
        Self::new()
    }
}

impl ScancelBackoff {
    pub(crate) const fn new() -> Self {
        ScancelBackoff { failed: std::collections::BTreeMap::new() }
    }

    pub(crate) const FIRST: chrono::Duration = chrono::Duration::seconds(60);
    pub(crate) const LONGEST: chrono::Duration = chrono::Duration::seconds(3600);

    /// Whether the decision for `attempt` may be carried out at `now`.
    pub(crate) fn due(&self, attempt: i64, now: DateTime<Utc>) -> bool {
        self.failed.get(&attempt).is_none_or(|(_, not_before)| now >= *not_before)
    }

    /// `scancel` failed for `attempt` at `now`; returns when it is tried next.
    pub(crate) fn failed(&mut self, attempt: i64, now: DateTime<Utc>) -> DateTime<Utc> {
        let entry = self.failed.entry(attempt).or_insert((0, now));
        entry.0 += 1;
        let wait = (1..entry.0).fold(Self::FIRST, |wait, _| (wait * 2).min(Self::LONGEST));
        entry.1 = now + wait;
        entry.1
    }

    /// The decision for `attempt` was carried out.
    pub(crate) fn succeeded(&mut self, attempt: i64) {
        self.failed.remove(&attempt);
    }
}

/// A person's release of a held pair (`submitter release`): the pair starts afresh.
pub fn release(
    ledger: &dyn Ledger,
    key: &(String, String, String),
    cluster: &str,
    username: &str,
) -> Result<(), LedgerError> {
    operator_record(ledger, key, cluster, username, RemediationAct::Release, format!("released by {username}"))
}

/// `submitter hold`: a person holds the pair as remediation would (`finding` `operator`), so no
/// launch submits it until `release`.
pub fn hold(
    ledger: &dyn Ledger,
    key: &(String, String, String),
    cluster: &str,
    username: &str,
    why: &str,
) -> Result<(), LedgerError> {
    let reason = if why.is_empty() { format!("held by {username}") } else { format!("held by {username}: {why}") };
    operator_record(ledger, key, cluster, username, RemediationAct::Hold, reason)
}

/// The finding of the hold a retried pair gets when its next launch is refused by preflight.
pub(crate) const RETRY_REFUSED: &str = "retry.refused";

/// Holds a pair remediation retried whose next launch preflight refuses (the lowered ceiling no
/// longer fits the weights, …): held with preflight's reason, rather than refused again on every
/// iteration (issue 32 item 12). `submitter release` clears it as any hold.
pub(crate) fn hold_refused_retry(
    ledger: &dyn Ledger,
    key: &(String, String, String),
    cluster: &str,
    username: &str,
    refusal: &str,
) -> Result<(), LedgerError> {
    let reason = format!("{RETRY_REFUSED}: the retried launch fails preflight: {refusal}");
    pair_record(ledger, key, cluster, username, (RETRY_REFUSED, RemediationAct::Hold), reason)
}

/// A person's `release` or `hold` of a pair: a remediation record with no attempt.
fn operator_record(
    ledger: &dyn Ledger,
    key: &(String, String, String),
    cluster: &str,
    username: &str,
    action: RemediationAct,
    reason: String,
) -> Result<(), LedgerError> {
    let finding = if action == RemediationAct::Release { "release" } else { "operator" };
    pair_record(ledger, key, cluster, username, (finding, action), reason)
}

/// A remediation record of a pair with no attempt: `(finding, action)` and the reason.
fn pair_record(
    ledger: &dyn Ledger,
    key: &(String, String, String),
    cluster: &str,
    username: &str,
    (finding, action): (&str, RemediationAct),
    reason: String,
) -> Result<(), LedgerError> {
    ledger.record_remediation(&NewRemediation {
        model: key.0.clone(),
        family: key.1.clone(),
        agent: key.2.clone(),
        cluster: cluster.to_string(),
        attempt: None,
        finding: finding.into(),
        action,
        change: String::new(),
        adjustment: None,
        reason,
        username: username.to_string(),
    })?;
    Ok(())
}

/// What `plan` says of a held pair.
pub(crate) fn held_text(hold: &Remediation, benchmark: &str) -> String {
    format!(
        "held: {} (attempt {}), clear with `submitter release --model {} --benchmark {benchmark}`",
        hold.reason,
        hold.attempt.map_or("-".to_string(), |a| a.to_string()),
        hold.model
    )
}

/// What `status` says of an attempt remediation acted on.
pub(crate) fn record_text(r: &Remediation, now: DateTime<Utc>) -> String {
    let change = if r.change.is_empty() { String::new() } else { format!(" [{}]", r.change) };
    format!("{}{change} {} ago: {}", r.action, human_duration((now - r.created_at).num_seconds()), r.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 32 item 11: a job scancel cannot cancel is asked again after 60 s, 120 s, … ≤ 1 h,
    /// not on every iteration.
    #[test]
    fn a_failed_scancel_backs_off_per_attempt() {
        let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let mut backoff = ScancelBackoff::default();
        assert!(backoff.due(7, t0));
        assert_eq!(backoff.failed(7, t0), t0 + chrono::Duration::seconds(60));
        assert!(!backoff.due(7, t0 + chrono::Duration::seconds(25)), "not retried within the back-off");
        assert!(backoff.due(8, t0), "another attempt is not held back");
        let t1 = t0 + chrono::Duration::seconds(60);
        assert!(backoff.due(7, t1));
        assert_eq!(backoff.failed(7, t1), t1 + chrono::Duration::seconds(120));
        for _ in 0..20 {
            backoff.failed(7, t1);
        }
        assert_eq!(backoff.failed(7, t1), t1 + ScancelBackoff::LONGEST);
        backoff.succeeded(7);
        assert!(backoff.due(7, t1));
    }

    fn case(ids: &[&str]) -> Case {
        Case {
            attempt: 7,
            model: "m".into(),
            benchmark: "b".into(),
            family: "b".into(),
            agent: "terminus-2".into(),
            cluster: "c".into(),
            active_job: None,
            diagnoses: ids.iter().map(|id| Diag { id: id.to_string(), summary: "s".into(), verdict: None }).collect(),
            facts: LaunchFacts { gpu_memory_utilization: Some(0.9), ..LaunchFacts::default() },
            judged_at: DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
        }
    }

    fn on() -> RemediationSettings {
        RemediationSettings { enabled: true, ..Default::default() }
    }

    #[test]
    fn oom_lowers_the_ceiling_by_a_step_down_to_the_floor() {
        let d = decide(&case(&["outcome.engine_start.oom", "outcome.engine_start"]), &PairRemedy::default(), &on())
            .unwrap();
        assert_eq!(d.action, Policy::Retry);
        assert_eq!(d.change, "serve.gpu_memory_utilization 0.90 → 0.85");
        assert_eq!(d.adjustment.unwrap().gpu_memory_utilization, Some(0.85));
        assert_eq!(d.cancels_job, None, "the job already ended");
        let mut at_floor = case(&["outcome.engine_start.oom"]);
        at_floor.facts.gpu_memory_utilization = Some(0.62);
        let d = decide(&at_floor, &PairRemedy::default(), &on()).unwrap();
        assert_eq!(d.action, Policy::Hold, "{d:?}");
        assert!(d.reason.contains("cannot go below remediation.gpu_memory_floor 0.60"), "{}", d.reason);
    }

    /// A sandbox-provider outage (issue 31): the pair waits and runs again, bounded, instead of
    /// being held — even beside the zero-200 and instant-failure findings the same outage raises.
    #[test]
    fn a_sandbox_provider_failure_waits_and_retries_then_holds_past_the_bound() {
        let ids = ["engine.zero_ok", "trials.instant_fail", "trials.sandbox_provider"];
        let mut running = case(&ids);
        running.active_job = Some("42".into());
        let d = decide(&running, &PairRemedy::default(), &on()).unwrap();
        assert_eq!(
            (d.action, d.finding.as_str(), d.cancels_job.as_deref()),
            (Policy::Retry, "trials.sandbox_provider", Some("42"))
        );
        let at = running.judged_at + chrono::Duration::seconds(1800);
        assert_eq!(d.adjustment.as_ref().unwrap().not_before, Some(at), "{d:?}");
        assert!(d.change.contains("not before") && d.change.contains("provider_wait_s"), "{}", d.change);
        let spent = PairRemedy { retries: 2, ..PairRemedy::default() };
        assert_eq!(decide(&running, &spent, &on()).unwrap().action, Policy::Hold, "bounded by max_retries");
    }

    #[test]
    fn retries_are_bounded_per_pair_then_held() {
        let pair = PairRemedy { retries: 2, ..PairRemedy::default() };
        let d = decide(&case(&["outcome.engine_start.oom"]), &pair, &on()).unwrap();
        assert_eq!(d.action, Policy::Hold);
        assert!(d.reason.contains("retried 2 time(s), remediation.max_retries 2"), "{}", d.reason);
    }

    #[test]
    fn off_acted_on_held_and_disabled_decide_nothing() {
        let c = case(&["api_base.private"]);
        assert!(decide(&c, &PairRemedy::default(), &RemediationSettings::default()).is_none());
        let acted = PairRemedy { acted_on: [7].into(), ..PairRemedy::default() };
        assert!(decide(&c, &acted, &on()).is_none());
        let mut s = on();
        s.overrides.insert("api_base.private".into(), Policy::Off);
        assert!(decide(&c, &PairRemedy::default(), &s).is_none());
        assert_eq!(decide(&c, &PairRemedy::default(), &on()).unwrap().action, Policy::Hold);
    }

    #[test]
    fn a_cancel_needs_a_job_and_dead_must_have_held_past_its_bound() {
        let mut c = case(&[]);
        c.diagnoses.push(Diag {
            id: "engine.hung".into(),
            summary: "hung".into(),
            verdict: Some((VerdictKind::Dead, 60)),
        });
        assert!(decide(&c, &PairRemedy::default(), &on()).is_none(), "no job to cancel");
        c.active_job = Some("42".into());
        assert!(decide(&c, &PairRemedy::default(), &on()).is_none(), "dead for 60 s < 600 s");
        c.diagnoses[0].verdict = Some((VerdictKind::Dead, 600));
        let d = decide(&c, &PairRemedy::default(), &on()).unwrap();
        assert_eq!((d.action, d.cancels_job.as_deref()), (Policy::Cancel, Some("42")));
    }

    #[test]
    fn instant_failures_on_a_running_job_cancel_it_and_hold_the_pair() {
        let mut c = case(&["trials.instant_fail"]);
        c.active_job = Some("9".into());
        let d = decide(&c, &PairRemedy::default(), &on()).unwrap();
        assert_eq!((d.action, d.cancels_job.as_deref()), (Policy::Hold, Some("9")));
    }

    #[test]
    fn a_locked_token_leaves_its_pair_out_and_the_next_one_goes_first() {
        let mut c = case(&["outcome.tunnel.token_locked", "outcome.tunnel"]);
        c.facts.pinggy_pairs = vec!["https://a.pinggy.link".into(), "https://b.pinggy.link".into()];
        c.facts.pinggy_taken = Some("https://a.pinggy.link".into());
        let d = decide(&c, &PairRemedy::default(), &on()).unwrap();
        assert_eq!(d.action, Policy::Retry);
        assert_eq!(d.change, "tunnel.pinggy: https://a.pinggy.link left out, https://b.pinggy.link first");
        let adjustment = d.adjustment.unwrap();
        assert_eq!(adjustment.skip_pinggy, vec!["https://a.pinggy.link".to_string()]);
        // The second pair locked too: nothing is left.
        c.facts.pinggy_taken = Some("https://b.pinggy.link".into());
        let pair = PairRemedy { adjustment, retries: 1, ..PairRemedy::default() };
        let d = decide(&c, &pair, &on()).unwrap();
        assert_eq!(d.action, Policy::Hold, "{d:?}");
        assert!(d.reason.contains("last usable Pinggy pair"), "{}", d.reason);
    }

    #[test]
    fn readiness_and_node_changes() {
        let mut facts = LaunchFacts { health_timeout_s: Some(1200), node: Some("n1".into()), ..LaunchFacts::default() };
        let (text, a) =
            retry_change(Change::LongerReadiness, &facts, &PairAdjustment::default(), &on(), Utc::now()).unwrap();
        assert_eq!((text.as_str(), a.health_timeout_s), ("serve.health_timeout_s 1200 → 1800", Some(1800)));
        let (text, a) = retry_change(Change::ExcludeNode, &facts, &a, &on(), Utc::now()).unwrap();
        assert_eq!((text.as_str(), a.exclude_nodes.len()), ("sbatch --exclude=n1", 1));
        facts.node = Some("n2".into());
        let (text, _) = retry_change(Change::ExcludeNode, &facts, &a, &on(), Utc::now()).unwrap();
        assert_eq!(text, "sbatch --exclude=n1,n2");
        facts.node = None;
        assert!(retry_change(Change::ExcludeNode, &facts, &a, &on(), Utc::now()).is_err());
    }

    #[test]
    fn records_fold_into_held_adjusted_and_released_pairs() {
        let record = |id: i64, attempt: Option<i64>, action: &str, adjustment: Option<PairAdjustment>| Remediation {
            id,
            model: "m".into(),
            family: "f".into(),
            agent: "a".into(),
            cluster: "c".into(),
            attempt: attempt.map(AttemptId),
            finding: "x".into(),
            action: action.parse().expect("an act"),
            change: String::new(),
            adjustment,
            reason: "r".into(),
            username: "u".into(),
            created_at: Utc::now(),
        };
        let lowered = PairAdjustment { gpu_memory_utilization: Some(0.8), ..PairAdjustment::default() };
        let mut records = vec![
            record(
                1,
                Some(10),
                "retry",
                Some(PairAdjustment { gpu_memory_utilization: Some(0.85), ..Default::default() }),
            ),
            record(2, Some(11), "retry", Some(lowered.clone())),
            record(3, Some(12), "hold", None),
        ];
        let key = ("m".to_string(), "f".to_string(), "a".to_string());
        let state = crate::ledger::fold_remediations(&records).remove(&key).unwrap();
        assert_eq!((state.retries, state.adjustment.clone(), state.held.map(|h| h.id)), (2, lowered, Some(3)));
        assert_eq!(state.acted_on, [10, 11, 12].into());
        records.push(record(4, None, "release", None));
        let state = crate::ledger::fold_remediations(&records).remove(&key).unwrap();
        assert_eq!((state.retries, state.adjustment.is_empty(), state.held.is_none()), (0, true, true));
        assert_eq!(state.acted_on, [10, 11, 12].into(), "a released pair's old attempts stay acted on");
    }

    #[test]
    fn the_table_order_decides_between_diagnoses() {
        // A dead engine and a private api_base: the cancel comes first in the table.
        let mut c = case(&["api_base.private"]);
        c.active_job = Some("3".into());
        c.diagnoses.insert(
            0,
            Diag { id: "engine.hung".into(), summary: "h".into(), verdict: Some((VerdictKind::Dead, 9999)) },
        );
        assert_eq!(decide(&c, &PairRemedy::default(), &on()).unwrap().finding, "engine.hung");
    }
}
