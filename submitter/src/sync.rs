//! Sync: fold payload's records (`status.json`, Harbor's `result.json`) and Slurm's state into the
//! ledger (docs/design.md §7.2–7.3). A job Slurm no longer has, with no recorded outcome, becomes `failed`
//! (`vanished`) at once; a pending row without a job id is repaired by finding its job in Slurm by its
//! submission tag, or withdrawn when none carries the tag after the grace.

use std::path::Path;

use launch_spec::records::{OutcomeClass, RunStatus};
use serde_json::Value;

use crate::decide::MISSING_JOB_GRACE_S;
use crate::domain::{POOL_KEY, SHARED_KEY, SUBMISSION_TAG_KEY, SlurmView, VANISHED};
use crate::gpuhours::{AttemptGpu, SharedRef, attempt_gpu, elapsed_s};
use crate::ledger::{Attempt, AttemptStatus, Ledger, TrialSet, now};
use crate::slurm::{JobId, JobInfo, JobState, Slurm, SlurmError, best_match};
use crate::stats::Trial;
use crate::transition::{Origin, Recorder};
use crate::verify::{VerifySettings, results};

pub use crate::observe::{
    Observation, SyncError, VANISHED_AFTER_QUIET_S, belongs_to, records_fresh, run_dir_of, view_of,
};

/// What one sync changed, for the operator: the transitions it applied (`sync`'s document is its
/// own output type, in the command layer).
#[derive(Debug, Default, Clone)]
pub struct SyncReport {
    pub changes: Vec<Change>,
}

/// One change sync made: the reconcile's one event type.
pub use crate::transition::Transition as Change;

/// GPU-hours of a run as payload recorded it: its GPU count × (last update − start).
pub fn gpu_hours(status: &RunStatus) -> Option<f64> {
    let at = |t: &str| chrono::DateTime::parse_from_rfc3339(t).ok();
    let seconds = (at(&status.updated_at)? - at(&status.started_at)?).num_seconds();
    let gpus = status.gpu.as_ref()?.gpu_count;
    (seconds >= 0).then(|| f64::from(gpus) * seconds as f64 / 3600.0)
}

/// Whether an attempt that ended without finishing is continued rather than failed: payload saw
/// the walltime warning (`walltime`) or stopped a hung engine (`engine_hung`: the engine, not the
/// configuration, failed; Harbor resumes the trials in a fresh job), or Slurm ended the job by its
/// time limit or preempted it (payload then records `interrupted`, or nothing when it was killed
/// outright).
pub(crate) fn is_resumable(outcome: Option<OutcomeClass>, slurm_state: Option<&JobState>) -> bool {
    let slurm_ended_it = matches!(slurm_state, Some(JobState::Timeout | JobState::Preempted));
    match outcome {
        Some(OutcomeClass::Walltime | OutcomeClass::EngineHung) => true,
        Some(OutcomeClass::Interrupted) | None => slurm_ended_it,
        Some(_) => false,
    }
}

/// What an ending attempt's job spent on its GPUs, as its share: the job's `gpu_time` (a per-leg
/// job's from the run dir's `status.json`; a shared job's from its group dir's, divided among the
/// legs its config names) and Slurm's start and end (`job`). `None` when payload recorded no GPU
/// time (an older payload, a job that never ran).
pub fn gpu_record(
    attempt: &Attempt,
    world: &Observation,
    status: Option<&RunStatus>,
    job: Option<&JobInfo>,
) -> Option<AttemptGpu> {
    let shared = attempt.config.get(SHARED_KEY).and_then(SharedRef::from_json);
    let host = match &shared {
        Some(s) => world.record(&s.group_dir).into_status().filter(|st| st.run_tag == s.group_tag),
        None => status.cloned(),
    }?;
    // Slurm's end once it has ended the job, else payload's last record: payload writes its
    // outcome moments before it exits, while Slurm still lists the job.
    let last_record =
        chrono::DateTime::parse_from_rfc3339(&host.updated_at).ok().map(|t| t.with_timezone(&chrono::Utc));
    let elapsed = job.and_then(|j| {
        let (start, end) = j.ran();
        elapsed_s(start, end.or(last_record))
    });
    // A per-leg job's record gets no better; a shared host's is final once it wrote its outcome.
    let complete = shared.is_none() || host.outcome.is_some();
    attempt_gpu(host.gpu_time.as_ref()?, &attempt.run_tag, elapsed, shared.as_ref(), complete)
}

/// Recomputes the records of shared jobs' legs that ended before their engine host did, once
/// the host's record is final (one read of the records, one Slurm query for their jobs).
fn complete_shared_records(ledger: &dyn Ledger, world: &Observation, slurm: &dyn Slurm) -> Result<(), SyncError> {
    let open: Vec<_> = ledger
        .gpu_seconds()?
        .into_iter()
        .filter(|r| AttemptGpu::from_json(&r.record).is_some_and(|g| !g.complete && g.shared.is_some()))
        .collect();
    if open.is_empty() {
        return Ok(());
    }
    let attempts: Vec<Attempt> =
        open.iter().filter_map(|r| ledger.attempt(r.id).transpose()).collect::<Result<_, _>>()?;
    let ids: Vec<JobId> = attempts.iter().filter_map(|a| a.slurm_job_id.as_deref()?.parse().ok()).collect();
    let jobs = world.jobs(slurm, &ids)?;
    for attempt in &attempts {
        let job = attempt.slurm_job_id.as_ref().and_then(|id| jobs.get(id));
        if let Some(rec) = gpu_record(attempt, world, None, job).filter(|r| r.complete) {
            ledger.record_gpu_seconds(attempt.id, &rec.to_json())?;
        }
    }
    Ok(())
}

pub fn read_status(run_dir: &Path) -> Option<RunStatus> {
    // A regular file of bounded size, never through a symlink: a FIFO never hangs sync or status.
    launch_spec::rundir::read_status(run_dir).into_status()
}

/// Harbor's `result.json` summarised for the ledger: mean reward, trials valid/errored, errors and
/// infrastructure errors by type, and the completion audit (`audit.status` = `incomplete` when
/// fewer than 90% of n_tasks × n_attempts are valid or more than 10% errored). See
/// [`crate::verify::results`], with the thresholds of the cluster profile — the ones `check` and
/// `results` use. `None` without a result.json holding `stats`.
pub fn harbor_metrics(run_dir: &Path, settings: &VerifySettings) -> Option<Value> {
    let summary = results::score_summary(run_dir)?;
    let audit = results::audit_of(&summary, settings);
    Some(results::metrics_json(&summary, &audit))
}

/// A finished run dir's per-trial facts and the Harbor that wrote them (its job lock), for the
/// ledger's `trials` (docs/ledger.md, migration 7); `None` when the dir has no finished trial.
pub(crate) fn trial_set(run_dir: &Path) -> Option<TrialSet> {
    use launch_spec::rundir::harbor;
    let trials: Vec<Trial> = harbor::trial_facts(run_dir)
        .ok()?
        .into_iter()
        .map(|f| Trial { task: f.task, attempt: f.attempt, reward: f.reward, valid: f.valid })
        .collect();
    if trials.is_empty() {
        return None;
    }
    let lock: Option<harbor::JobLock> = harbor::read(&run_dir.join(harbor::LOCK_FILE)).ok().flatten();
    let harbor_version = lock.as_ref().and_then(|l| l.harbor_version()).map(str::to_string);
    Some(TrialSet { harbor_version, trials })
}

/// The metrics with what payload found on the node (`provenance`: GPU, and the model revision and
/// program versions where payload recorded them), so a result says what it ran under.
fn with_node_provenance(mut metrics: Value, status: Option<&RunStatus>) -> Value {
    let Some(status) = status else { return metrics };
    let mut provenance = serde_json::Map::new();
    if let Some(gpu) = &status.gpu {
        let name = gpu.gpu_name.as_deref().map(|n| format!(" ({n})")).unwrap_or_default();
        provenance.insert("gpu".into(), format!("{}{name}", gpu.profile).into());
    }
    if let Some(node) = &status.provenance {
        for (key, value) in [
            ("model_revision", &node.model_revision),
            ("vllm_version", &node.vllm_version),
            ("harbor_version", &node.harbor_version),
            ("dataset_digest", &node.dataset_digest),
        ] {
            if let Some(value) = value {
                provenance.insert(key.into(), value.clone().into());
            }
        }
    }
    if let Some(map) = metrics.as_object_mut() {
        map.insert("provenance".into(), Value::Object(provenance));
    }
    metrics
}

/// The staleness bound a submitter records with its heartbeat unless told otherwise: an attempt of
/// a cluster whose submitters have all been quiet for longer is flagged on the other clusters.
pub(crate) const DEFAULT_STALE_AFTER_S: u64 = 3600;

/// Who is reconciling: `user@host` (one heartbeat row per submitter and cluster).
pub(crate) fn submitter_identity() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".to_string());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".to_string());
    format!("{user}@{host}")
}

/// [`sync`], then the heartbeat that tells the other clusters this cluster's attempts are
/// attended (only after a sync that succeeded: a submitter that cannot reach its Slurm must go stale).
pub(crate) fn sync_and_heartbeat(
    recorder: &Recorder,
    world: &Observation,
    slurm: &dyn Slurm,
    cluster: &str,
    stale_after_s: u64,
    settings: &VerifySettings,
) -> Result<SyncReport, SyncError> {
    let report = sync(recorder, world, slurm, cluster, settings)?;
    recorder.ledger().record_heartbeat(cluster, &submitter_identity(), stale_after_s)?;
    Ok(report)
}

/// Syncs every active attempt of `cluster`: Slurm's state and payload's records as `world`
/// observed them, every change applied through `recorder` (ledger, team mirror, event). Any ledger
/// or Slurm error stops the sync (fail closed). `settings` are the cluster profile's `verify:`
/// thresholds (the completion audit stored with a finished attempt uses them).
pub fn sync(
    recorder: &Recorder,
    world: &Observation,
    slurm: &dyn Slurm,
    cluster: &str,
    settings: &VerifySettings,
) -> Result<SyncReport, SyncError> {
    let ledger = recorder.ledger();
    let before = recorder.events().len();
    let active: Vec<Attempt> = ledger.active()?.into_iter().filter(|a| a.cluster == cluster).collect();
    let ids: Vec<JobId> = active.iter().filter_map(|a| a.slurm_job_id.as_deref()?.parse().ok()).collect();
    let jobs = world.jobs(slurm, &ids)?;
    for attempt in &active {
        let run_dir = run_dir_of(attempt);
        let status = world.status_of(attempt);
        let outcome = status.as_ref().and_then(|s| s.outcome.clone());
        let job = attempt.slurm_job_id.as_ref().and_then(|id| jobs.get(id));
        let slurm_state = job.map(|j| &j.state);
        let change =
            |to: AttemptStatus, reason: String, metrics: Option<Value>, resumable: bool| -> Result<(), SyncError> {
                let gpu = to.is_terminal().then(|| gpu_record(attempt, world, status.as_ref(), job)).flatten();
                let event = Change {
                    resumable,
                    metrics,
                    gpu_hours: gpu.as_ref().map(|g| g.hours()).or_else(|| status.as_ref().and_then(gpu_hours)),
                    ..Change::of(attempt.into(), to, reason, Origin::Sync)
                };
                recorder.apply(event, attempt.slurm_job_id.as_deref())?;
                if let Some(gpu) = &gpu {
                    ledger.record_gpu_seconds(attempt.id, &gpu.to_json())?;
                }
                Ok(())
            };
        if let Some(outcome) = outcome {
            if outcome.class == OutcomeClass::Finished {
                let metrics = run_dir
                    .as_deref()
                    .and_then(|d| harbor_metrics(d, settings))
                    .map(|m| with_node_provenance(m, status.as_ref()));
                change(AttemptStatus::Finished, "finished".to_string(), metrics, false)?;
                if let Some(set) = run_dir.as_deref().and_then(trial_set) {
                    ledger.record_trials(attempt.id, &set)?;
                }
            } else {
                let cause = outcome.cause.map(|c| format!("/{c}")).unwrap_or_default();
                let resumable = is_resumable(Some(outcome.class), slurm_state);
                let reason = format!("{}{cause}: {}", outcome.class.as_str(), outcome.message);
                change(AttemptStatus::Failed, reason, None, resumable)?;
            }
            continue;
        }
        let Some(job_id) = attempt.slurm_job_id.clone() else {
            // Crash between the ledger insert and sbatch, or sbatch still running elsewhere.
            if let Some(found) = find_job_for(slurm, attempt)? {
                match ledger.set_job_id(attempt.id, &found.to_string()) {
                    Ok(()) => {}
                    // Another attempt of this cluster holds the job: this one is not bound to it.
                    Err(taken @ crate::ledger::LedgerError::JobIdTaken { .. }) => {
                        change(AttemptStatus::Failed, format!("sbatch failed: {taken}"), None, false)?;
                        continue;
                    }
                    Err(err) => return Err(err.into()),
                }
                let repaired = format!("repaired: job {found} found in Slurm");
                recorder.note(Change::of(attempt.into(), attempt.status, repaired, Origin::Sync));
            } else if (now() - attempt.submitted_at).num_seconds() > MISSING_JOB_GRACE_S as i64 {
                match submission_tag_of(attempt) {
                    // No job carries its tag: the submission never reached Slurm (a lost sbatch
                    // answer, a crash before sbatch). The pair did not fail; withdraw the attempt
                    // (not counted as a failure) and let the plan resubmit it.
                    Some(tag) => change(
                        AttemptStatus::Cancelled,
                        format!("withdrawn: never queued (no Slurm job carries its tag {tag})"),
                        None,
                        false,
                    )?,
                    None => change(
                        AttemptStatus::Failed,
                        "submission interrupted: no Slurm job for this attempt".to_string(),
                        None,
                        false,
                    )?,
                }
            }
            continue;
        };
        let view = view_of(jobs.get(&job_id));
        match view {
            SlurmView::Running if attempt.status == AttemptStatus::Pending => {
                change(AttemptStatus::Started, format!("running as job {job_id}"), None, false)?;
            }
            SlurmView::Queued | SlurmView::Running => {}
            // Slurm does not list it, but payload's heartbeat is fresh: not vanished (yet).
            SlurmView::Gone if status.as_ref().is_some_and(|s| records_fresh(s, world.now)) => {}
            // A pool's leg that never wrote a record: its model's turn did not come (walltime, an
            // engine lost under an earlier model). Continued in another pool, not failed.
            SlurmView::Gone if status.is_none() && attempt.config.get(POOL_KEY).is_some() => {
                let reason = format!(
                    "not started: pool job {job_id} ended ({}) before this model's turn: continued in another pool",
                    pool_host_ending(attempt, world)
                );
                change(AttemptStatus::Failed, reason, None, true)?;
            }
            SlurmView::Gone => {
                let state = jobs.get(&job_id).map_or("no longer listed".to_string(), |j| j.state.to_string());
                let resumable = is_resumable(None, slurm_state);
                let reason = if resumable {
                    format!("ended by Slurm (job {job_id}: {state}), no outcome recorded: resumable")
                } else {
                    format!("{VANISHED} (job {job_id}: {state}, no outcome recorded)")
                };
                change(AttemptStatus::Failed, reason, None, resumable)?;
            }
        }
    }
    fold_late_finishes(recorder, world, cluster, settings)?;
    complete_shared_records(ledger, world, slurm)?;
    Ok(SyncReport { changes: recorder.events().split_off(before) })
}

/// How a pool leg's host (the pool job's own record in its group dir) ended, in words.
fn pool_host_ending(attempt: &Attempt, world: &Observation) -> String {
    let host = attempt
        .config
        .get(SHARED_KEY)
        .and_then(SharedRef::from_json)
        .and_then(|s| world.record(&s.group_dir).into_status().filter(|st| st.run_tag == s.group_tag));
    match host.and_then(|h| h.outcome) {
        Some(o) => format!("{}: {}", o.class.as_str(), o.message),
        None => "no outcome recorded by the pool's engine host".to_string(),
    }
}

/// How far back a vanished attempt's run dir is looked at for a late final record.
const LATE_RECORD_WITHIN_DAYS: i64 = 7;

/// A final record that came after its attempt was marked vanished (its records were quiet for the
/// window, then payload wrote `finished`: a node that froze, a file system that caught up) is
/// folded in: the attempt becomes `finished` with its Harbor metrics. A late failure changes
/// nothing (the attempt is failed already).
fn fold_late_finishes(
    recorder: &Recorder,
    world: &Observation,
    cluster: &str,
    settings: &VerifySettings,
) -> Result<(), SyncError> {
    for attempt in recorder.ledger().vanished(cluster, now() - chrono::Duration::days(LATE_RECORD_WITHIN_DAYS))? {
        let Some(run_dir) = run_dir_of(&attempt) else { continue };
        let Some(status) = world.status_of(&attempt) else { continue };
        if status.outcome.as_ref().is_none_or(|o| o.class != OutcomeClass::Finished) {
            continue;
        }
        let metrics = harbor_metrics(&run_dir, settings).map(|m| with_node_provenance(m, Some(&status)));
        let reason = "finished (its final record came after it was marked vanished)";
        let event = Change {
            metrics,
            gpu_hours: gpu_hours(&status),
            ..Change::of((&attempt).into(), AttemptStatus::Finished, reason, Origin::Sync)
        };
        recorder.apply(event, None)?;
    }
    Ok(())
}

fn submission_tag_of(attempt: &Attempt) -> Option<&str> {
    attempt.config.get(SUBMISSION_TAG_KEY).and_then(Value::as_str)
}

/// The job of an attempt that has no job id yet: the one carrying its submission tag (`--comment`);
/// for an attempt recorded before tags, same job name and output in the attempt's run dir.
fn find_job_for(slurm: &dyn Slurm, attempt: &Attempt) -> Result<Option<JobId>, SlurmError> {
    if let Some(tag) = submission_tag_of(attempt) {
        return Ok(best_match(&slurm.find_by_comment(tag)?));
    }
    let (Some(name), Some(run_dir)) = (attempt.config.get("job_name").and_then(Value::as_str), run_dir_of(attempt))
    else {
        return Ok(None);
    };
    for job in slurm.find_by_name(name)? {
        if let Some(info) = slurm.show(job.id)?
            && info.std_out.as_deref().is_some_and(|out| out.starts_with(&run_dir))
        {
            return Ok(Some(job.id));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hung engine is continued like a walltime end (the configuration did not fail); an engine
    /// that died or never started is a failure, whatever Slurm says.
    #[test]
    fn a_hung_engine_is_continued_like_a_walltime_end() {
        assert!(is_resumable(Some(OutcomeClass::EngineHung), None));
        assert!(is_resumable(Some(OutcomeClass::Walltime), None));
        assert!(!is_resumable(Some(OutcomeClass::EngineDied), None));
        assert!(!is_resumable(Some(OutcomeClass::EngineStart), Some(&JobState::Timeout)));
        assert!(is_resumable(None, Some(&JobState::Timeout)));
    }

    /// What sync stores for a finished attempt: each finished trial's facts and the Harbor
    /// version from the job lock; nothing for a dir without a finished trial.
    #[test]
    fn a_finished_run_dir_gives_its_trials_and_harbor_version() {
        use launch_spec::testkit::rundir::{Finished, HarborJob, RunDir, Stage, Trial as TrialDir};
        let t0 = chrono::Utc::now();
        let d = RunDir::temp("job");
        d.job(&HarborJob::started("job", t0 - chrono::Duration::minutes(60), 3, None));
        assert_eq!(trial_set(d.path()), None);
        let done = |reward: Option<f64>, minutes: i64| {
            Stage::Done(Finished { reward, ..Finished::ok(t0 - chrono::Duration::minutes(minutes)) })
        };
        d.trial(&TrialDir::new("fix-git__a", done(Some(1.0), 9)))
            .trial(&TrialDir::new("fix-git__b", done(Some(0.0), 5)))
            .trial(&TrialDir::new("build-c__c", done(None, 7)));
        let set = trial_set(d.path()).unwrap();
        assert_eq!(set.harbor_version.as_deref(), Some("0.25.0"));
        let got: Vec<(&str, u32, f64, bool)> =
            set.trials.iter().map(|t| (t.task.as_str(), t.attempt, t.reward, t.valid)).collect();
        assert_eq!(got, [("build-c", 1, 0.0, false), ("fix-git", 1, 1.0, true), ("fix-git", 2, 0.0, true)]);
    }
}
