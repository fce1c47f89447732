//! The dedup decision per (model, benchmark family), docs/design.md §7.3, as a pure function of a ledger
//! snapshot and a Slurm snapshot. Fail-closed handling of errors happens before this is called:
//! without both snapshots there is no decision at all. Depends on the domain types only (no ledger,
//! no Slurm, no files, no clock).

use serde::Serialize;

use crate::domain::{AttemptStatus, SlurmView, TEAM_CLUSTER};

/// What the ledger knows about one pair: its latest attempt and how many attempts failed.
#[derive(Debug, Clone, PartialEq)]
pub struct PairHistory {
    pub latest: Option<LatestAttempt>,
    pub failed_attempts: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LatestAttempt {
    pub id: i64,
    pub status: AttemptStatus,
    pub slurm_job_id: Option<String>,
    /// Seconds since submission (for pending staleness and "in progress" age).
    pub age_s: u64,
    pub has_metrics: bool,
    /// The completion audit found too few valid trials or too many errors: resume, don't accept.
    pub incomplete: bool,
    /// Whether the attempt ran under the config that would be used now (timeout, overrides).
    pub(crate) config_matches: bool,
    /// Whether payload recorded an outcome for it (status.json `outcome`).
    pub(crate) has_recorded_outcome: bool,
    /// Its `status.json` (no outcome) was written within the vanishing window: the job is alive
    /// even if Slurm does not list it this once.
    pub(crate) records_fresh: bool,
    /// Set when the attempt belongs to another cluster: only that cluster's submitter can see its
    /// Slurm job, so this one never reconciles, cancels or resubmits it.
    pub elsewhere: Option<Elsewhere>,
    /// It ended by the walltime (or was otherwise resumable): continue it, not a failure.
    pub resumable: bool,
    /// Its place in a walltime chain: 0 for a fresh attempt, n for the n-th continuation.
    pub continuation: u32,
}

/// Another cluster holding a pair's active attempt, and how recently its submitter refreshed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Elsewhere {
    pub cluster: String,
    /// The freshest heartbeat of that cluster's submitters: (age, staleness bound) in seconds;
    /// None when no submitter of that cluster ever recorded one.
    pub heartbeat: Option<(u64, u64)>,
}

/// Seconds a pending row may lack a job id before it counts as an interrupted submission (another
/// submitter may be between its insert and its sbatch right now).
pub(crate) const MISSING_JOB_GRACE_S: u64 = 120;

#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub max_failed_attempts: u32,
    pub stale_pending_s: u64,
    /// Resubmit finished pairs whose config differs from now (docs/design.md §7.3: only when asked).
    pub config_aware: bool,
    /// `--force`: bypass everything for the explicitly selected pairs.
    pub force: bool,
    /// Continuations of a walltime chain (`limits.max_continuations`); past it the pair is skipped.
    pub max_continuations: u32,
}

/// What to do with one pair. (The verification verdicts are `verify::verdict`; this is only the
/// queueing decision.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Submit,
    Skip,
    Resubmit,
    /// Resubmit an attempt that ended by the walltime: same run tag, so payload resumes the
    /// Harbor job; not a failure.
    Continue,
}

impl Action {
    /// Whether carrying it out queues a job.
    pub fn submits(self) -> bool {
        !matches!(self, Action::Skip)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Action::Submit => "submit",
            Action::Skip => "skip",
            Action::Resubmit => "resubmit",
            Action::Continue => "continue",
        }
    }
}

/// Side effects the caller performs before submitting (recorded in the ledger first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub(crate) enum Prerequisite {
    /// The latest attempt vanished from Slurm without an outcome: mark it failed (`vanished`).
    MarkVanished { attempt_id: i64 },
    /// The latest attempt has been pending too long: cancel its job, mark it cancelled.
    CancelStale { attempt_id: i64, slurm_job_id: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub action: Action,
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prerequisite: Option<Prerequisite>,
    /// Something an operator should look at (an unattended attempt on another cluster).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flag: Option<String>,
}

impl Decision {
    fn new(action: Action, reason: impl Into<String>) -> Self {
        Decision { action, reason: reason.into(), prerequisite: None, flag: None }
    }

    fn flagged(mut self, flag: String) -> Self {
        self.flag = Some(flag);
        self
    }

    fn with(mut self, prerequisite: Prerequisite) -> Self {
        self.prerequisite = Some(prerequisite);
        self
    }
}

fn age(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{:.1}h", s as f64 / 3600.0),
    }
}

/// What refreshes another cluster's attempts: its submitter, or for the team's imported history
/// another import.
fn refresh_hint(cluster: &str) -> String {
    if cluster == TEAM_CLUSTER {
        "re-run `submitter import` to refresh the team's history".to_string()
    } else {
        format!("run `submitter sync --cluster {cluster}` there, or cancel it there")
    }
}

/// Decides one pair. `slurm` is the job's state when the latest attempt has a job id.
pub fn decide(history: &PairHistory, slurm: Option<SlurmView>, policy: &Policy) -> Decision {
    if policy.force {
        // `--force` bypasses dedup, never an active attempt: the ledger holds one active attempt per
        // pair, so a second job would be refused at its insert after preflight made its run dir
        // (issue 31). Refused here, so `plan` and `launch` say the same.
        if let Some(active) = history.latest.as_ref().filter(|l| l.status.is_active()) {
            let job = active.slurm_job_id.as_ref().map_or("no job id yet".to_string(), |j| format!("job {j}"));
            let place = active.elsewhere.as_ref().map_or(String::new(), |e| format!(" on {}", e.cluster));
            let why = format!(
                "--force refused: attempt {} is still {}{place} ({job}); cancel it first (`submitter cancel`), then --force",
                active.id,
                active.status.as_str()
            );
            // Flagged too: `launch` prints its flags (not its skips' reasons), as `plan` does.
            return Decision::new(Action::Skip, why.clone()).flagged(why);
        }
        return Decision::new(Action::Submit, "forced (--force)");
    }
    let Some(latest) = &history.latest else {
        return Decision::new(Action::Submit, "no previous attempt");
    };
    let too_many = || history.failed_attempts >= policy.max_failed_attempts;
    match latest.status {
        AttemptStatus::Finished if !latest.has_metrics => {
            Decision::new(Action::Resubmit, "finished but metrics cleared")
        }
        // A finished Harbor job is never resumed (it would run nothing and overwrite its result):
        // every trial runs again, in a run dir of its own (`continues_latest`).
        AttemptStatus::Finished if latest.incomplete => {
            Decision::new(Action::Resubmit, "finished but incomplete (completion audit): a fresh run")
        }
        AttemptStatus::Finished if policy.config_aware && !latest.config_matches => {
            Decision::new(Action::Resubmit, "finished under a different config")
        }
        AttemptStatus::Finished => Decision::new(Action::Skip, "finished"),
        // Another cluster's attempt: its Slurm is not ours to read, so it is never reconciled,
        // cancelled or resubmitted from here — at most flagged when its submitter went quiet.
        AttemptStatus::Pending | AttemptStatus::Started if latest.elsewhere.is_some() => {
            let elsewhere = latest.elsewhere.as_ref().expect("checked");
            let cluster = &elsewhere.cluster;
            let job = latest.slurm_job_id.as_ref().map_or("no job id yet".to_string(), |j| format!("job {j}"));
            let skip = Decision::new(Action::Skip, format!("in progress on {cluster}, {job}"));
            match elsewhere.heartbeat {
                Some((age_s, bound)) if age_s <= bound => skip,
                Some((age_s, bound)) => skip.flagged(format!(
                    "attempt {} on {cluster} is unattended: its submitter last refreshed it {} ago (bound {}) — \
                     {}; it is not resubmitted from here",
                    latest.id,
                    age(age_s),
                    age(bound),
                    refresh_hint(cluster)
                )),
                None => skip.flagged(format!(
                    "attempt {} on {cluster} is unattended: no submitter of {cluster} has recorded a heartbeat — \
                     {}; it is not resubmitted from here",
                    latest.id,
                    refresh_hint(cluster)
                )),
            }
        }
        // Another submitter is between its ledger insert and its sbatch: leave it alone.
        AttemptStatus::Pending if latest.slurm_job_id.is_none() && latest.age_s <= MISSING_JOB_GRACE_S => {
            Decision::new(Action::Skip, format!("being submitted (attempt {}, no job id yet)", latest.id))
        }
        AttemptStatus::Pending | AttemptStatus::Started => {
            let job = latest.slurm_job_id.clone().unwrap_or_else(|| "?".to_string());
            match slurm {
                Some(SlurmView::Queued)
                    if latest.status == AttemptStatus::Pending && latest.age_s > policy.stale_pending_s =>
                {
                    Decision::new(
                        Action::Resubmit,
                        format!("stale pending (job {job} queued for {})", age(latest.age_s)),
                    )
                    .with(Prerequisite::CancelStale { attempt_id: latest.id, slurm_job_id: job })
                }
                Some(SlurmView::Queued | SlurmView::Running) => {
                    Decision::new(Action::Skip, format!("in progress (job {job}, {})", age(latest.age_s)))
                }
                // Slurm does not list it, but payload's heartbeat is fresh: one empty answer is not
                // the job ending (vanished needs both to agree over the window).
                Some(SlurmView::Gone) | None if latest.records_fresh && !latest.has_recorded_outcome => Decision::new(
                    Action::Skip,
                    format!(
                        "in progress (job {job} not listed by Slurm, but its run dir's heartbeat is fresh: \
                             not vanished until both agree for {})",
                        age(crate::observe::VANISHED_AFTER_QUIET_S as u64)
                    ),
                ),
                // Gone without a recorded outcome (or never got a job id and Slurm has no job
                // with its run tag): the job is dead — no waiting 24–48 h for a stale row.
                Some(SlurmView::Gone) | None if !latest.has_recorded_outcome => {
                    // Marking it failed adds one more failure to the pair.
                    if history.failed_attempts + 1 >= policy.max_failed_attempts {
                        return Decision::new(
                            Action::Skip,
                            format!("too many failures ({})", history.failed_attempts + 1),
                        )
                        .with(Prerequisite::MarkVanished { attempt_id: latest.id });
                    }
                    Decision::new(Action::Resubmit, format!("vanished (job {job} no longer in Slurm, no outcome)"))
                        .with(Prerequisite::MarkVanished { attempt_id: latest.id })
                }
                // An outcome exists but sync has not folded it yet: wait for sync, never guess.
                Some(SlurmView::Gone) | None => Decision::new(Action::Skip, "ended, awaiting sync"),
            }
        }
        // Ended by the walltime, but the config changed since: a resume would run the old one.
        AttemptStatus::Failed if latest.resumable && !latest.config_matches => Decision::new(
            Action::Resubmit,
            format!("ended by the walltime under a different config: a fresh run (attempt {})", latest.id),
        ),
        // Ended by the walltime: continue the chain (the run dir resumes), bounded by the profile.
        AttemptStatus::Failed if latest.resumable && latest.continuation < policy.max_continuations => Decision::new(
            Action::Continue,
            format!(
                "continue after the walltime (continuation {} of at most {}, attempt {})",
                latest.continuation + 1,
                policy.max_continuations,
                latest.id
            ),
        ),
        AttemptStatus::Failed if latest.resumable => Decision::new(
            Action::Skip,
            format!(
                "walltime chain ended: {} continuation(s), limits.max_continuations {} (raise it or the preset's slurm_time)",
                latest.continuation, policy.max_continuations
            ),
        ),
        AttemptStatus::Failed | AttemptStatus::Cancelled if too_many() => {
            Decision::new(Action::Skip, format!("too many failures ({})", history.failed_attempts))
        }
        AttemptStatus::Failed => Decision::new(Action::Resubmit, "previous attempt failed"),
        AttemptStatus::Cancelled => Decision::new(Action::Resubmit, "previous attempt cancelled"),
    }
}

/// Whether a decision that queues a job continues the latest attempt's Harbor job in its run dir,
/// rather than starting a fresh one in a run dir of its own (docs/decisions.md, "A re-evaluation is
/// a new run"): only a job that did not finish — interrupted, vanished, failed, cancelled, ended by
/// the walltime — under the config that would be used now, and never when forced. A finished job
/// (metrics cleared, incomplete, another config) is re-evaluated, not resumed: resuming it would
/// run no trial and overwrite its result.
pub(crate) fn continues_latest(history: &PairHistory, action: Action, policy: &Policy) -> bool {
    let Some(latest) = &history.latest else { return false };
    let unfinished = latest.status != AttemptStatus::Finished;
    match action {
        Action::Continue | Action::Resubmit => !policy.force && unfinished && latest.config_matches,
        Action::Submit | Action::Skip => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            max_failed_attempts: 3,
            stale_pending_s: 3600,
            config_aware: false,
            force: false,
            max_continuations: 2,
        }
    }

    fn latest(status: AttemptStatus) -> LatestAttempt {
        LatestAttempt {
            id: 7,
            status,
            slurm_job_id: Some("42".into()),
            age_s: 60,
            has_metrics: true,
            incomplete: false,
            config_matches: true,
            has_recorded_outcome: false,
            records_fresh: false,
            elsewhere: None,
            resumable: false,
            continuation: 0,
        }
    }

    fn history(latest: Option<LatestAttempt>, failed: u32) -> PairHistory {
        PairHistory { latest, failed_attempts: failed }
    }

    #[test]
    fn none_submits() {
        assert_eq!(decide(&history(None, 0), None, &policy()).action, Action::Submit);
    }

    #[test]
    fn finished_skips_unless_metrics_cleared_or_config_aware() {
        let h = history(Some(latest(AttemptStatus::Finished)), 0);
        assert_eq!(decide(&h, None, &policy()).action, Action::Skip);
        let mut cleared = latest(AttemptStatus::Finished);
        cleared.has_metrics = false;
        assert_eq!(decide(&history(Some(cleared), 0), None, &policy()).action, Action::Resubmit);
        let mut other = latest(AttemptStatus::Finished);
        other.config_matches = false;
        assert_eq!(decide(&history(Some(other.clone()), 0), None, &policy()).action, Action::Skip);
        let aware = Policy { config_aware: true, ..policy() };
        assert_eq!(decide(&history(Some(other), 0), None, &aware).action, Action::Resubmit);
    }

    #[test]
    fn incomplete_finished_run_is_run_again_fresh() {
        let mut l = latest(AttemptStatus::Finished);
        l.incomplete = true;
        let h = history(Some(l), 0);
        let d = decide(&h, None, &policy());
        assert_eq!(d.action, Action::Resubmit);
        assert!(d.reason.contains("incomplete"), "{}", d.reason);
        assert!(!continues_latest(&h, d.action, &policy()));
    }

    #[test]
    fn only_an_unfinished_attempt_under_the_same_config_is_continued() {
        let forced = Policy { force: true, ..policy() };
        let mut walltime = latest(AttemptStatus::Failed);
        walltime.resumable = true;
        let cases = [
            (latest(AttemptStatus::Failed), &policy(), true),
            (walltime.clone(), &policy(), true),
            (latest(AttemptStatus::Started), &policy(), true),
            (latest(AttemptStatus::Failed), &forced, false),
            (latest(AttemptStatus::Finished), &forced, false),
        ];
        for (l, p, continues) in cases {
            let h = history(Some(l.clone()), 0);
            let d = decide(&h, Some(SlurmView::Gone), p);
            assert!(d.action.submits(), "{l:?}: {d:?}");
            assert_eq!(continues_latest(&h, d.action, p), continues, "{l:?} {p:?}");
        }
        // Another config: a fresh run, for a failed attempt and for one ended by the walltime.
        for mut l in [latest(AttemptStatus::Failed), walltime] {
            l.config_matches = false;
            let h = history(Some(l), 0);
            let d = decide(&h, None, &policy());
            assert_eq!(d.action, Action::Resubmit, "{d:?}");
            assert!(!continues_latest(&h, d.action, &policy()));
        }
        let mut cleared = latest(AttemptStatus::Finished);
        cleared.has_metrics = false;
        let h = history(Some(cleared), 0);
        assert!(!continues_latest(&h, decide(&h, None, &policy()).action, &policy()));
    }

    #[test]
    fn active_in_slurm_skips_and_vanished_resubmits_at_once() {
        let h = history(Some(latest(AttemptStatus::Started)), 0);
        let d = decide(&h, Some(SlurmView::Running), &policy());
        assert_eq!(d.action, Action::Skip);
        assert!(d.reason.contains("job 42"), "{}", d.reason);
        let d = decide(&h, Some(SlurmView::Gone), &policy());
        assert_eq!(d.action, Action::Resubmit);
        assert_eq!(d.prerequisite, Some(Prerequisite::MarkVanished { attempt_id: 7 }));
    }

    /// Issue 32 item 2: Slurm's one empty answer and a fresh heartbeat disagree: nothing is marked
    /// vanished and nothing is submitted beside the running job.
    #[test]
    fn gone_from_slurm_with_fresh_records_is_not_vanished() {
        let mut alive = latest(AttemptStatus::Started);
        alive.records_fresh = true;
        for view in [Some(SlurmView::Gone), None] {
            let d = decide(&history(Some(alive.clone()), 0), view, &policy());
            assert_eq!((d.action, d.prerequisite.clone()), (Action::Skip, None), "{view:?}: {}", d.reason);
            assert!(d.reason.contains("heartbeat is fresh"), "{}", d.reason);
        }
    }

    #[test]
    fn stale_pending_is_cancelled_and_resubmitted() {
        let mut old = latest(AttemptStatus::Pending);
        old.age_s = 7200;
        let d = decide(&history(Some(old), 0), Some(SlurmView::Queued), &policy());
        assert_eq!(d.action, Action::Resubmit);
        assert_eq!(d.prerequisite, Some(Prerequisite::CancelStale { attempt_id: 7, slurm_job_id: "42".into() }));
        // Started rows are never "stale pending", however old.
        let mut running = latest(AttemptStatus::Started);
        running.age_s = 7200;
        assert_eq!(decide(&history(Some(running), 0), Some(SlurmView::Queued), &policy()).action, Action::Skip);
    }

    #[test]
    fn failures_are_bounded() {
        let h = history(Some(latest(AttemptStatus::Failed)), 2);
        assert_eq!(decide(&h, None, &policy()).action, Action::Resubmit);
        let h = history(Some(latest(AttemptStatus::Failed)), 3);
        let d = decide(&h, None, &policy());
        assert_eq!(d.action, Action::Skip);
        assert!(d.reason.starts_with("too many failures"));
    }

    #[test]
    fn outcome_recorded_but_not_synced_waits() {
        let mut l = latest(AttemptStatus::Started);
        l.has_recorded_outcome = true;
        assert_eq!(decide(&history(Some(l), 0), Some(SlurmView::Gone), &policy()).action, Action::Skip);
    }

    #[test]
    fn a_row_being_submitted_elsewhere_is_left_alone() {
        let mut l = latest(AttemptStatus::Pending);
        l.slurm_job_id = None;
        l.age_s = 5;
        assert_eq!(decide(&history(Some(l.clone()), 0), None, &policy()).action, Action::Skip);
        l.age_s = MISSING_JOB_GRACE_S + 1;
        assert_eq!(decide(&history(Some(l), 0), None, &policy()).action, Action::Resubmit);
    }

    #[test]
    fn another_clusters_attempt_is_skipped_and_flagged_only_when_unattended() {
        let mut l = latest(AttemptStatus::Pending);
        l.slurm_job_id = Some("1007".into());
        l.age_s = 10 * 24 * 3600; // far beyond stale_pending_s: still never ours to cancel
        for (heartbeat, flagged) in [(Some((30, 3600)), false), (Some((7200, 3600)), true), (None, true)] {
            l.elsewhere = Some(Elsewhere { cluster: "vista".into(), heartbeat });
            // Slurm here knows nothing of it: that must not read as vanished.
            for slurm in [None, Some(SlurmView::Gone)] {
                let d = decide(&history(Some(l.clone()), 0), slurm, &policy());
                assert_eq!(d.action, Action::Skip, "{d:?}");
                assert_eq!(d.reason, "in progress on vista, job 1007");
                assert_eq!(d.prerequisite, None);
                assert_eq!(d.flag.is_some(), flagged, "{heartbeat:?}: {d:?}");
            }
        }
    }

    #[test]
    fn a_walltime_end_continues_without_counting_as_a_failure_up_to_the_bound() {
        let mut l = latest(AttemptStatus::Failed);
        l.resumable = true;
        // Two real failures already: a third would block, a walltime end does not.
        let d = decide(&history(Some(l.clone()), 2), None, &policy());
        assert_eq!(d.action, Action::Continue, "{d:?}");
        assert!(d.reason.contains("continuation 1 of at most 2"), "{}", d.reason);
        l.continuation = 1;
        assert_eq!(decide(&history(Some(l.clone()), 5), None, &policy()).action, Action::Continue);
        l.continuation = 2;
        let d = decide(&history(Some(l), 0), None, &policy());
        assert_eq!(d.action, Action::Skip);
        assert!(d.reason.contains("walltime chain ended"), "{}", d.reason);
    }

    #[test]
    fn force_bypasses_everything_but_an_active_attempt() {
        let force = Policy { force: true, ..policy() };
        for status in [AttemptStatus::Finished, AttemptStatus::Failed, AttemptStatus::Cancelled] {
            let h = history(Some(latest(status)), 9);
            assert_eq!(decide(&h, None, &force).action, Action::Submit, "{status:?}");
        }
        // Issue 31: a running pair is refused, by plan and launch alike (both decide here).
        for status in [AttemptStatus::Started, AttemptStatus::Pending] {
            let h = history(Some(latest(status)), 9);
            let d = decide(&h, Some(SlurmView::Running), &force);
            assert_eq!(d.action, Action::Skip, "{status:?}");
            assert!(d.reason.contains("--force refused") && d.reason.contains("cancel it first"), "{}", d.reason);
            assert_eq!(d.flag.as_deref(), Some(d.reason.as_str()), "launch prints flags, not skip reasons");
        }
    }
}
