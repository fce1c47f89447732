//! Carrying out a plan (docs/design.md §7.4): for each queued pair, in priority order — the
//! decision's prerequisite, the preparation hook (staging, preflight), the ledger row, the spec
//! file, `sbatch`, the job id onto the row. The plan itself ([`crate::planner`]) is not revisited:
//! what `plan` showed is what runs.
//!
//! A ledger or Slurm error stops the run (fail closed); an sbatch rejection of one job marks that
//! row failed (so it never blocks the pair) and goes on; a failed preparation submits nothing for
//! that pair and burns no attempt. With `dry_run` everything is checked and nothing is written: no
//! ledger row, no spec file, no sbatch.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::decide::{MISSING_JOB_GRACE_S, Prerequisite};
use crate::domain::{POOL_KEY, SHARED_KEY, SUBMISSION_TAG_KEY};
use crate::ledger::{AttemptId, AttemptStatus, LedgerError, NewAttempt};
use crate::planner::{Blocked, Plan, PlannedJob, SharedJob, attempt_config};
use crate::queue::run_dir_free_for;
use crate::slurm::{JobId, Slurm, best_match};
use crate::team::publish;
use crate::transition::{Origin, Recorder};

/// Runs before a pair's ledger row, with the spec that would be written: staging and preflight
/// (docs/site.md). An error means "do not submit this pair now" and does not count as an attempt.
pub type Prepare<'a> = &'a dyn Fn(&PlannedJob, &launch_spec::LaunchSpec) -> Result<(), NotSubmitted>;

/// Why [`Executor::prepare`] held a job back.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NotSubmitted {
    #[error("not submitted: staging failed: {0}")]
    Staging(String),
    #[error("not submitted: preflight failed: {0}")]
    Preflight(String),
}

pub struct Executor<'a> {
    /// Writes every state change (ledger, team mirror, event); its ledger takes the new rows.
    pub recorder: &'a Recorder<'a>,
    pub slurm: &'a dyn Slurm,
    pub cluster: &'a str,
    pub username: String,
    /// `limits.submission_delay_s` between sbatch calls.
    pub delay: Duration,
    /// Chain submissions in batches with `--dependency=afterany:` (0 = off).
    pub chain_batch: usize,
    pub prepare: Prepare<'a>,
    /// Check everything, write nothing (`launch --dry-run`).
    pub dry_run: bool,
}

/// What happened to one pair (`launch`'s document is its own output type, in the command layer).
#[derive(Debug, Clone)]
pub struct Submitted {
    pub model: String,
    pub benchmark: String,
    pub attempt: Option<i64>,
    pub job_id: Option<String>,
    pub outcome: String,
    /// For a dry run: the sbatch argv that would have run.
    pub sbatch: Option<Vec<String>>,
}

impl Submitted {
    /// A submission that was meant to happen and did not (its configuration refused, sbatch refused
    /// it, the preparation or the run dir stood in the way); throttled and already-active pairs are
    /// not failures.
    pub fn failed(&self) -> bool {
        ["sbatch failed", "not submitted", "refused"].iter().any(|p| self.outcome.starts_with(p))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Slurm(#[from] crate::slurm::SlurmError),
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

impl Executor<'_> {
    /// Carries out `plan`: returns one entry per pair the plan acted on (queued, refused,
    /// throttled), in order; a shared job's legs at its last leg's place.
    pub fn execute(&self, plan: &Plan) -> Result<Vec<Submitted>, SubmitError> {
        let mut results = Vec::new();
        let mut chain: Vec<JobId> = Vec::new();
        for (index, job) in plan.jobs.iter().enumerate().filter(|(_, j)| j.action.submits() || j.prerequisite.is_some())
        {
            let record = |outcome: String, attempt: Option<AttemptId>, job_id: Option<String>| {
                Submitted::new(job, outcome, attempt, job_id)
            };
            // A vanished attempt is failed whatever happens next.
            if let Some(Prerequisite::MarkVanished { attempt_id }) = &job.prerequisite
                && !self.dry_run
            {
                let id = AttemptId(*attempt_id);
                let reason = format!("{} (no Slurm job, no outcome)", crate::domain::VANISHED);
                self.recorder.apply_to(id, AttemptStatus::Failed, &reason, Origin::Submission)?;
            }
            match &job.blocked {
                Some(Blocked::Refused(why)) => {
                    results.push(record(format!("refused: {why}"), None, None));
                    continue;
                }
                Some(Blocked::Throttled(why)) => {
                    results.push(record(format!("throttled: {why}"), None, None));
                    continue;
                }
                Some(Blocked::Held(why)) => {
                    results.push(record(why.clone(), None, None));
                    continue;
                }
                None if !job.action.submits() => continue,
                None => {}
            }
            if let Some(group) = plan.shared_of(job) {
                // Every leg's previous attempt is settled (above) before the group's rows go in.
                if group.legs.iter().max() == Some(&index) {
                    self.execute_shared(plan, group, &mut chain, &mut results)?;
                }
                continue;
            }
            let (Some(spec), Some(request)) = (&job.spec, &job.request) else { continue };
            if let Some(refusal) = self.make_way(job, spec)? {
                results.push(record(refusal, None, None));
                continue;
            }
            if self.dry_run {
                let mut dry = record(format!("dry run: would {} ({})", job.action.as_str(), job.reason), None, None);
                dry.sbatch = job.sbatch.clone();
                results.push(dry);
                continue;
            }
            // Ledger row first: it reserves the pair (the database refuses a second active attempt).
            let mut config = attempt_config(job, spec);
            let tag = submission_tag(&job.model, &job.benchmark, self.cluster);
            config[SUBMISSION_TAG_KEY] = tag.clone().into();
            let new = self.new_attempt(job, spec, config);
            let attempt = match self.recorder.ledger().insert_pending(&new) {
                Ok(id) => id,
                Err(LedgerError::AlreadyActive { existing_id, .. }) => {
                    let why = format!("skipped: attempt {existing_id} is already active (another submitter)");
                    results.push(record(why, None, None));
                    continue;
                }
                Err(err) => return Err(err.into()),
            };
            let mut spec = spec.clone();
            spec.ledger_job_id = Some(attempt.0.to_string());
            self.publish_pending(attempt, &new);
            let spec_file = crate::queue::spec_path(&spec);
            if let Err(err) = write_spec(&spec_file, &spec.to_json()) {
                self.end(attempt, AttemptStatus::Failed, &format!("not submitted: {err}"))?;
                return Err(err);
            }
            let mut request = request.clone();
            request.options.comment = Some(tag.clone());
            if self.chain_batch > 0 && chain.len() >= self.chain_batch {
                request.options.dependency = Some(format!("afterany:{}", chain[chain.len() - self.chain_batch]));
            }
            match self.submit_once(&request, &tag, &job.reason) {
                Landed::Queued(job_id, outcome) => {
                    if let Some(refusal) = self.bind_job(attempt, job_id)? {
                        results.push(record(refusal, Some(attempt), Some(job_id.to_string())));
                        continue;
                    }
                    publish(self.recorder.mirror(), &format!("attempt {attempt} job id"), |m| {
                        m.submitted(attempt, &job_id.to_string())
                    });
                    chain.push(job_id);
                    results.push(record(outcome, Some(attempt), Some(job_id.to_string())));
                    std::thread::sleep(self.delay);
                }
                Landed::Unconfirmed(why) => {
                    // Active, no job id, no failure: the next sync adopts the job or withdraws it.
                    self.end(attempt, AttemptStatus::Pending, &why)?;
                    results.push(record(why, Some(attempt), None));
                }
                Landed::Refused(problem) => {
                    // The row must not block the pair: it failed, with sbatch's reason.
                    self.end(attempt, AttemptStatus::Failed, &format!("sbatch failed: {problem}"))?;
                    results.push(record(format!("sbatch failed: {problem}"), Some(attempt), None));
                }
            }
        }
        Ok(results)
    }
}

impl Executor<'_> {
    /// A row this run inserted moves on (failed, or pending again with why), through the one path.
    fn end(&self, attempt: AttemptId, to: AttemptStatus, why: &str) -> Result<(), LedgerError> {
        self.recorder.apply_to(attempt, to, why, Origin::Submission)
    }

    /// Binds a queued job to its attempt. `Some(why)` when the ledger refuses because another
    /// attempt of this cluster holds that job id (Slurm handed it out twice): the new attempt is
    /// failed with the reason and the job left alone — cancelling it would cancel the other
    /// attempt's job, which has the same id.
    fn bind_job(&self, attempt: AttemptId, job_id: JobId) -> Result<Option<String>, SubmitError> {
        match self.recorder.ledger().set_job_id(attempt, &job_id.to_string()) {
            Ok(()) => Ok(None),
            Err(taken @ LedgerError::JobIdTaken { .. }) => {
                let why = format!("sbatch failed: {taken}");
                self.end(attempt, AttemptStatus::Failed, &why)?;
                Ok(Some(why))
            }
            Err(err) => Err(err.into()),
        }
    }
}

impl Submitted {
    fn new(job: &PlannedJob, outcome: String, attempt: Option<AttemptId>, job_id: Option<String>) -> Submitted {
        Submitted {
            model: job.model.clone(),
            benchmark: job.benchmark.clone(),
            attempt: attempt.map(|a| a.0),
            job_id,
            outcome,
            sbatch: None,
        }
    }
}

impl Executor<'_> {
    /// Before a queued pair's row: its stale attempt cancelled (only now that the replacement has
    /// a slot), its run dir free, its preparation (staging, preflight) done. `Some(why)`: not
    /// submitted now, no attempt burnt.
    fn make_way(&self, job: &PlannedJob, spec: &launch_spec::LaunchSpec) -> Result<Option<String>, SubmitError> {
        if let Some(Prerequisite::CancelStale { attempt_id, slurm_job_id }) = &job.prerequisite
            && !self.dry_run
        {
            if let Ok(id) = slurm_job_id.parse() {
                self.slurm.cancel(id, None, false)?;
            }
            let id = AttemptId(*attempt_id);
            let why = "stale pending: cancelled for resubmission";
            self.recorder.apply_to(id, AttemptStatus::Cancelled, why, Origin::Submission)?;
        }
        if let Err(why) = run_dir_free_for(spec) {
            return Ok(Some(format!("not submitted: {why}")));
        }
        Ok((self.prepare)(job, spec).err().map(|refusal| refusal.to_string()))
    }

    /// One shared job (issue 24) or pool (issue 37; `pool.json` instead of `shared.json`): each leg made way for and given its own ledger row (pending, one
    /// submission tag for them all) and its own spec, then `shared.json` naming the legs that got a
    /// row, then one `sbatch`, whose job id goes onto every leg's row. A leg held back (its
    /// preparation, its run dir, another submitter's attempt) leaves the others to run.
    fn execute_shared(
        &self,
        plan: &Plan,
        group: &SharedJob,
        chain: &mut Vec<JobId>,
        results: &mut Vec<Submitted>,
    ) -> Result<(), SubmitError> {
        let in_group = match &group.pool {
            Some(pool) => {
                format!("pool {} of {} models, {} legs", group.group_tag, pool.members.len(), group.legs.len())
            }
            None => format!("shared job {} of {} legs", group.group_tag, group.legs.len()),
        };
        let mut ready = Vec::new();
        for job in group.legs.iter().map(|&i| &plan.jobs[i]) {
            let Some(spec) = &job.spec else { continue };
            match self.make_way(job, spec)? {
                Some(refusal) => results.push(Submitted::new(job, refusal, None, None)),
                None => ready.push((job, spec)),
            }
        }
        if self.dry_run {
            for (n, (job, _)) in ready.iter().enumerate() {
                let outcome = format!("dry run: would {} ({}) in {in_group}", job.action.as_str(), job.reason);
                let mut dry = Submitted::new(job, outcome, None, None);
                // The job's argv once, with its first leg.
                dry.sbatch = (n == 0).then(|| group.sbatch.clone());
                results.push(dry);
            }
            return Ok(());
        }
        let tag = submission_tag(&group.model, &group.group_tag, self.cluster);
        let legs: Vec<&str> = ready.iter().map(|(_, spec)| spec.run_tag.as_str()).collect();
        let mut rows = Vec::new();
        for (job, spec) in &ready {
            let mut config = attempt_config(job, spec);
            config[SUBMISSION_TAG_KEY] = tag.clone().into();
            config[SHARED_KEY] = serde_json::json!({
                "group_tag": group.group_tag,
                "group_dir": group.group_dir,
                "legs": legs,
            });
            if let Some(pool) = &group.pool {
                let member = pool.members.iter().position(|(model, _)| *model == job.model);
                config[POOL_KEY] = serde_json::json!({
                    "group_tag": group.group_tag,
                    "member": member,
                    "model": job.model,
                });
            }
            let new = self.new_attempt(job, spec, config);
            let attempt = match self.recorder.ledger().insert_pending(&new) {
                Ok(id) => id,
                Err(LedgerError::AlreadyActive { existing_id, .. }) => {
                    let why = format!("skipped: attempt {existing_id} is already active (another submitter)");
                    results.push(Submitted::new(job, why, None, None));
                    continue;
                }
                Err(err) => return Err(err.into()),
            };
            self.publish_pending(attempt, &new);
            rows.push((*job, (*spec).clone(), attempt));
        }
        if rows.is_empty() {
            return Ok(());
        }
        let attempts: Vec<AttemptId> = rows.iter().map(|(_, _, a)| *a).collect();
        let fail_all = |why: &str| -> Result<(), SubmitError> {
            for attempt in &attempts {
                self.end(*attempt, AttemptStatus::Failed, why)?;
            }
            Ok(())
        };
        let mut doc = group.doc.clone();
        doc.legs.clear();
        for (_, spec, attempt) in &mut rows {
            spec.ledger_job_id = Some(attempt.0.to_string());
            let path = crate::queue::spec_path(spec);
            if let Err(err) = write_spec(&path, &spec.to_json()) {
                fail_all(&format!("not submitted: {err}"))?;
                return Err(err);
            }
            doc.legs.push(path);
        }
        let (doc_path, text) = match &group.pool {
            // A pool's document: each member with the legs that got a row; a member with none left out.
            Some(pool) => {
                let mut pool_doc = pool.doc.clone();
                for member in &mut pool_doc.members {
                    member.legs.retain(|leg| doc.legs.contains(leg));
                }
                pool_doc.members.retain(|m| !m.legs.is_empty());
                let path = group.group_dir.join(launch_spec::pool::POOL_SPEC_FILE);
                (path, serde_json::to_string_pretty(&pool_doc).unwrap_or_default() + "\n")
            }
            None => (
                group.group_dir.join(launch_spec::shared::SHARED_SPEC_FILE),
                serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n",
            ),
        };
        if let Err(err) = write_spec(&doc_path, &text) {
            fail_all(&format!("not submitted: {err}"))?;
            return Err(err);
        }
        let mut request = group.request.clone();
        request.options.comment = Some(tag.clone());
        if self.chain_batch > 0 && chain.len() >= self.chain_batch {
            request.options.dependency = Some(format!("afterany:{}", chain[chain.len() - self.chain_batch]));
        }
        let reason = |job: &PlannedJob| format!("{}; {in_group}", job.reason);
        match self.submit_once(&request, &tag, &reason(rows[0].0)) {
            Landed::Queued(job_id, _) => {
                for (job, _, attempt) in &rows {
                    if let Some(refusal) = self.bind_job(*attempt, job_id)? {
                        results.push(Submitted::new(job, refusal, Some(*attempt), Some(job_id.to_string())));
                        continue;
                    }
                    publish(self.recorder.mirror(), &format!("attempt {attempt} job id"), |m| {
                        m.submitted(*attempt, &job_id.to_string())
                    });
                    let outcome = format!("submitted ({})", reason(job));
                    results.push(Submitted::new(job, outcome, Some(*attempt), Some(job_id.to_string())));
                }
                chain.push(job_id);
                std::thread::sleep(self.delay);
            }
            Landed::Unconfirmed(why) => {
                for (job, _, attempt) in &rows {
                    self.end(*attempt, AttemptStatus::Pending, &why)?;
                    results.push(Submitted::new(job, why.clone(), Some(*attempt), None));
                }
            }
            Landed::Refused(problem) => {
                let why = format!("sbatch failed: {problem}");
                for (job, _, attempt) in &rows {
                    self.end(*attempt, AttemptStatus::Failed, &why)?;
                    results.push(Submitted::new(job, why.clone(), Some(*attempt), None));
                }
            }
        }
        Ok(())
    }

    fn new_attempt(&self, job: &PlannedJob, spec: &launch_spec::LaunchSpec, config: serde_json::Value) -> NewAttempt {
        NewAttempt {
            model: job.model.clone(),
            benchmark: job.benchmark.clone(),
            cluster: self.cluster.to_string(),
            username: self.username.clone(),
            run_tag: spec.run_tag.clone(),
            agent: spec.harbor.agent.clone(),
            reason: job.reason.clone(),
            config,
        }
    }

    /// The team's row, like the ledger's, exists before sbatch.
    fn publish_pending(&self, attempt: AttemptId, new: &NewAttempt) {
        publish(self.recorder.mirror(), &format!("attempt {attempt} (Pending)"), |m| {
            if !m.pending(attempt, new)? {
                tracing::warn!(
                    "mirror: {} or {} is not in the team's models/benchmarks: not published",
                    new.model,
                    new.benchmark
                );
            }
            Ok(())
        });
    }
}

/// Where one sbatch call left an attempt.
enum Landed {
    /// Queued as this job (the outcome line says how it was learnt).
    Queued(JobId, String),
    /// sbatch's answer was lost and no job with the attempt's tag is known yet (why).
    Unconfirmed(String),
    /// The controller refused it, or sbatch never ran: nothing queued.
    Refused(crate::slurm::SlurmError),
}

impl Executor<'_> {
    /// One `sbatch` of `request`, whose job carries `tag` as its comment. When sbatch may have
    /// queued the job and lost only its answer, it is never guessed: the job is looked for by its tag
    /// (docs/decisions.md, idempotent submission).
    fn submit_once(&self, request: &crate::slurm::SubmitRequest, tag: &str, reason: &str) -> Landed {
        let problem = match self.slurm.submit(request) {
            Ok(job_id) => return Landed::Queued(job_id, format!("submitted ({reason})")),
            Err(problem) if problem.submission_unknown() => problem,
            Err(problem) => return Landed::Refused(problem),
        };
        let lookup = match self.slurm.find_by_comment(tag) {
            Ok(jobs) => match best_match(&jobs) {
                Some(job_id) => {
                    let outcome = format!("submitted ({reason}; sbatch's answer was lost, job found by its tag)");
                    return Landed::Queued(job_id, outcome);
                }
                None => format!("no job carries its tag {tag} yet"),
            },
            Err(err) => format!("looking for it failed too: {err}"),
        };
        Landed::Unconfirmed(format!(
            "unconfirmed: sbatch's answer was lost ({problem}); {lookup}: the next sync adopts the job or, after \
             {MISSING_JOB_GRACE_S}s without one, withdraws the attempt"
        ))
    }
}

/// A tag no other attempt's job carries, on this Slurm or any other sharing the ledger: the moment,
/// the process and the pair, hashed. It is the job's `--comment`, so a job whose sbatch answer was
/// lost is found again without confusing it with an earlier attempt of the same pair (same job
/// name, same run dir).
pub fn submission_tag(model: &str, benchmark: &str, cluster: &str) -> String {
    use sha1::Digest;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let seed = format!(
        "{nanos}/{}/{}/{cluster}/{model}/{benchmark}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    format!("evalsub-{}", &hex::encode(sha1::Sha1::digest(seed.as_bytes()))[..20])
}

fn write_spec(path: &Path, text: &str) -> Result<(), SubmitError> {
    launch_spec::records::write_atomically(path, text.as_bytes())
        .map_err(|source| SubmitError::Write { path: path.to_path_buf(), source })
}
