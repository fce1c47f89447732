//! `cancel`: how each selected attempt is stopped (docs/submitter.md, "Shared allocation"). A
//! per-leg job is `scancel`led; a leg of a shared job whose other legs still run is stopped alone
//! by a `cancel.request` in its run dir (payload stops that leg's Harbor and leaves the engine
//! serving the others: `launch_spec::shared`); the last running leg, or all of them, `scancel`s
//! the job. Deciding is pure ([`decide`]); the request file is written by [`request_leg_stop`].

use std::path::{Path, PathBuf};

use launch_spec::shared::CANCEL_REQUEST_FILE;

use crate::ledger::{Attempt, AttemptId};
use crate::observe::run_dir_of;

/// How one selected attempt is stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stop {
    /// `scancel` its job (once per job, however many of its attempts are selected).
    Job(String),
    /// Only this leg: `<run dir>/cancel.request`; `others` legs of job `job` go on.
    Leg { job: String, run_dir: PathBuf, others: usize },
    /// It has no Slurm job yet: only the ledger row.
    NoJob,
}

/// `selected` (active attempts of this cluster the operator named) against every `active` one of
/// this cluster: a shared job's attempts carry its one job id. `running(a)`: whether attempt `a`'s
/// leg is still running (no outcome in its run dir yet); a leg that ended does not keep the job.
pub(crate) fn decide(
    selected: &[Attempt],
    active: &[Attempt],
    running: &dyn Fn(&Attempt) -> bool,
) -> Vec<(AttemptId, Stop)> {
    let chosen = |a: &Attempt| selected.iter().any(|s| s.id == a.id);
    selected
        .iter()
        .map(|attempt| {
            let Some(job) = attempt.slurm_job_id.clone() else { return (attempt.id, Stop::NoJob) };
            let others = active
                .iter()
                .filter(|a| a.slurm_job_id.as_deref() == Some(job.as_str()) && !chosen(a) && running(a))
                .count();
            let stop = match run_dir_of(attempt) {
                Some(run_dir) if others > 0 => Stop::Leg { job, run_dir, others },
                _ => Stop::Job(job),
            };
            (attempt.id, stop)
        })
        .collect()
}

/// Writes `<run_dir>/cancel.request` atomically: who asked, when, for which attempt (no secret).
pub(crate) fn request_leg_stop(run_dir: &Path, attempt: AttemptId, by: &str) -> std::io::Result<PathBuf> {
    let path = run_dir.join(CANCEL_REQUEST_FILE);
    let body = serde_json::json!({
        "attempt": attempt.0,
        "requested_by": by,
        "requested_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    });
    launch_spec::records::write_atomically(&path, format!("{body}\n").as_bytes())?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ledger::AttemptStatus;

    fn attempt(id: i64, job: Option<&str>) -> Attempt {
        let mut a = crate::testkit::attempt(id, "org/M", &format!("b{id}"), AttemptStatus::Started);
        a.run_tag = format!("b{id}__org__M");
        a.slurm_job_id = job.map(String::from);
        a.config = json!({"run_dir": format!("/jobs/b{id}__org__M")});
        a
    }

    #[test]
    fn one_leg_of_a_running_shared_job_is_stopped_alone_and_the_last_one_cancels_the_job() {
        let active = vec![attempt(1, Some("7")), attempt(2, Some("7")), attempt(3, Some("7")), attempt(4, Some("8"))];
        let all = |_: &Attempt| true;
        let one = decide(&active[..1], &active, &all);
        assert_eq!(one, [(AttemptId(1), Stop::Leg { job: "7".into(), run_dir: "/jobs/b1__org__M".into(), others: 2 })]);
        // Every leg selected: the job is cancelled (each attempt names it; the caller scancels once).
        let every = decide(&active[..3], &active, &all);
        assert!(every.iter().all(|(_, s)| *s == Stop::Job("7".into())), "{every:?}");
        // The other legs ended (their outcomes recorded): the last running one cancels the job.
        let only_1_runs = |a: &Attempt| a.id == AttemptId(1);
        assert_eq!(decide(&active[..1], &active, &only_1_runs), [(AttemptId(1), Stop::Job("7".into()))]);
        // A per-leg job, and an attempt without a job yet.
        assert_eq!(decide(&active[3..], &active, &all), [(AttemptId(4), Stop::Job("8".into()))]);
        assert_eq!(decide(&[attempt(5, None)], &active, &all), [(AttemptId(5), Stop::NoJob)]);
    }

    /// A pool (issue 37): one model's legs stopped by file while the other models' legs, running
    /// or not yet started (no outcome either way), keep the job; never a scancel for one model.
    #[test]
    fn one_model_of_a_pool_is_stopped_by_file_and_the_pool_goes_on() {
        let leg = |id: i64, model: &str| {
            let mut a = attempt(id, Some("9"));
            a.model = model.into();
            a
        };
        let active = vec![leg(1, "org/A"), leg(2, "org/A"), leg(3, "org/B"), leg(4, "org/B"), leg(5, "org/C")];
        // org/A finished its turn; org/B is the one cancelled; org/C has not started.
        let running = |a: &Attempt| a.model != "org/A";
        let b: Vec<Attempt> = active.iter().filter(|a| a.model == "org/B").cloned().collect();
        let stops = decide(&b, &active, &running);
        assert_eq!(stops.len(), 2);
        for (id, stop) in &stops {
            assert!(matches!(stop, Stop::Leg { job, others: 1, .. } if job == "9"), "{id}: {stop:?}");
        }
    }

    #[test]
    fn the_request_file_is_written_whole_and_names_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = request_leg_stop(dir.path(), AttemptId(12), "tester").unwrap();
        assert_eq!(path, dir.path().join(CANCEL_REQUEST_FILE));
        let body: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!((body["attempt"].as_i64(), body["requested_by"].as_str()), (Some(12), Some("tester")));
        assert_eq!(body.as_object().unwrap().len(), 3, "{body}");
    }
}
