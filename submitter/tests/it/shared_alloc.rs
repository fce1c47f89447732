//! Shared allocation (issue 24), the submitter's side, on the real local Slurm: `--allocation
//! shared` puts each model's legs into one job (one sbatch, one job id on every leg's attempt,
//! `shared.json` in the group dir naming each leg's own spec), `cancel` of one leg writes its
//! `cancel.request` and leaves the job to the others, the last leg cancels the job; sync maps each
//! leg's records to its own attempt, and a walltime continues the unfinished legs — in a shared job
//! again — and never touches the finished one. The jobs are submitted held (`--hold`), so they stay
//! `PENDING` and each leg's outcome is written by hand in its run dir, as payload writes it; the
//! runs with payload's side end to end are in `tests/tests/` once payload runs `--shared`.

#![allow(clippy::print_stderr)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use chrono::Utc;
use launch_spec::records::{Outcome, OutcomeClass, Phase};
use launch_spec::shared::{CANCEL_REQUEST_FILE, SharedJobSpec};
use launch_spec::testkit::rundir::{Counters, running_status};
use serde_json::Value;
use submitter::ledger::{Attempt, AttemptStatus, Ledger, open_ledger};

use crate::ledger::Store;
use crate::queueing::{TestCluster, cancel_all, scancel, text, wait_until};
use crate::support::{slurm_up, write_tasks};

pub(crate) fn held_cluster(name: &str) -> TestCluster {
    TestCluster::new(name, |p| {
        *p = p.replace("  time: \"00:10:00\"\n", "  time: \"00:10:00\"\n  extra_args: [\"--hold\"]\n");
    })
}

pub(crate) fn run_ok(cluster: &TestCluster, ledger: &str, command: &[&str], args: &[&str]) -> String {
    let out = cluster.run(command, ledger, args, &[]);
    assert!(out.status.success(), "{command:?} {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn shared_launch(cluster: &TestCluster, ledger: &str, models: &Path) -> String {
    let models = models.to_str().unwrap();
    run_ok(
        cluster,
        ledger,
        &["launch"],
        &["--once", "--preset", "ID", "--allocation", "shared", "--models-file", models],
    )
}

pub(crate) fn in_squeue(job: &str) -> bool {
    let out = Command::new("squeue").args(["-h", "-j", job, "-o", "%T"]).output().unwrap();
    let state = String::from_utf8_lossy(&out.stdout);
    state.contains("PENDING") || state.contains("RUNNING")
}

pub(crate) fn run_dir(attempt: &Attempt) -> PathBuf {
    PathBuf::from(attempt.config["run_dir"].as_str().unwrap())
}

/// Per model: its active attempts, all carrying one job id.
fn jobs_by_model(ledger: &dyn Ledger) -> Vec<(String, String, Vec<Attempt>)> {
    let active = ledger.active().unwrap();
    let models: BTreeSet<String> = active.iter().map(|a| a.model.clone()).collect();
    models
        .into_iter()
        .map(|model| {
            let legs: Vec<Attempt> = active.iter().filter(|a| a.model == model).cloned().collect();
            let jobs: BTreeSet<&str> = legs.iter().filter_map(|a| a.slurm_job_id.as_deref()).collect();
            assert_eq!(jobs.len(), 1, "{model}: one job for every leg: {jobs:?}");
            let job = jobs.into_iter().next().unwrap().to_string();
            (model, job, legs)
        })
        .collect()
}

/// What Slurm says of a job: `scontrol show job -o` as key=value words.
fn scontrol(job: &str) -> String {
    let out = Command::new("scontrol").args(["show", "job", "-o", job]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `plan` shows which pairs share a job and its argv once; `launch` submits one held job per model
/// whose three legs each have their own attempt, run dir and spec; a second launch submits nothing;
/// cancel of one leg leaves the job, of the rest cancels it; `cancel --job` cancels every leg.
/// On SQLite and, when reachable, PostgreSQL (the ledger several clusters share).
#[test]
fn one_job_per_model_each_leg_its_own_attempt_and_cancel_per_leg() {
    if !slurm_up() {
        eprintln!("skipping: no local Slurm");
        return;
    }
    let sqlite = Store::sqlite();
    one_job_per_model(&held_cluster("shared-launch-sq"), &sqlite.spec);
    if let Some(pg) = Store::postgres("shared_launch") {
        one_job_per_model(&held_cluster("shared-launch-pg"), &pg.spec);
    }
}

fn one_job_per_model(cluster: &TestCluster, ledger_spec: &str) {
    let models = cluster.models_file(&["test/Tiny-1B", "test/Small-3B"]);
    let list = models.to_str().unwrap();
    let plan =
        run_ok(cluster, ledger_spec, &["plan"], &["--preset", "ID", "--allocation", "shared", "--models-file", list]);
    assert_eq!(plan.lines().filter(|l| l.starts_with("shared    ")).count(), 2, "{plan}");
    assert!(plan.contains("3 legs in one job, one engine (allocation shared, from --allocation)"), "{plan}");
    assert!(plan.contains("capacity: max_num_seqs") && plan.contains("load allowance 60 s"), "{plan}");
    let json: Value = serde_json::from_str(&run_ok(
        cluster,
        ledger_spec,
        &["plan"],
        &["--preset", "ID", "--allocation", "shared", "--models-file", list, "--json"],
    ))
    .unwrap();
    let shared = json["shared"].as_array().unwrap();
    assert_eq!(shared.len(), 2, "{json:#}");
    let argv: Vec<&str> = shared[0]["sbatch"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(argv[argv.len() - 2], "--shared", "{argv:?}");
    assert!(argv.contains(&"--time=0-00:11:00"), "the profile's 10 min + the 60 s readiness deadline: {argv:?}");
    for job in json["jobs"].as_array().unwrap() {
        assert!(job.get("sbatch").is_none(), "a leg's argv is its shared job's: {job:#}");
        assert_eq!(job["allocation"]["mode"], "shared", "{job:#}");
    }
    // A dry run shows each job's argv once, with its first leg.
    let dry = run_ok(
        cluster,
        ledger_spec,
        &["launch"],
        &["--once", "--dry-run", "--preset", "ID", "--allocation", "shared", "--models-file", list],
    );
    assert_eq!(dry.matches("in shared job").count(), 6, "{dry}");
    assert_eq!(dry.matches(" --shared ").count(), 2, "{dry}");
    let out = shared_launch(cluster, ledger_spec, &models);
    let ledger = open_ledger(ledger_spec).unwrap();
    let _cleanup = Cleanup(ledger_spec.to_string());
    assert_eq!(ledger.active().unwrap().len(), 6, "2 models × 3 legs: {out}");
    let jobs = jobs_by_model(&*ledger);
    assert_eq!(jobs.len(), 2);
    assert_ne!(jobs[0].1, jobs[1].1, "one job per model: {out}");
    for (model, job, legs) in &jobs {
        assert_eq!(legs.len(), 3, "{model}");
        let info = scontrol(job);
        assert!(info.contains("JobState=PENDING"), "{info}");
        let group_dir = PathBuf::from(legs[0].config["shared"]["group_dir"].as_str().unwrap());
        assert!(info.contains(&format!("StdOut={}/slurm-{job}.out", group_dir.display())), "{info}");
        let doc = SharedJobSpec::from_file(&group_dir.join("shared.json")).unwrap();
        assert_eq!(doc.legs.len(), 3);
        let tags: BTreeSet<&str> = legs.iter().map(|a| a.config["submission_tag"].as_str().unwrap()).collect();
        assert_eq!(tags.len(), 1, "one submission tag, the job's comment: {tags:?}");
        for leg in legs {
            let spec_path = run_dir(leg).join("launch.json");
            assert!(doc.legs.contains(&spec_path), "{} in {:?}", spec_path.display(), doc.legs);
            let spec = launch_spec::LaunchSpec::from_file(&spec_path).unwrap();
            assert_eq!(spec.ledger_job_id.as_deref(), Some(leg.id.0.to_string().as_str()), "each leg its own attempt");
            assert_eq!((spec.benchmark.as_str(), spec.model.hf_id.as_str()), (leg.benchmark.as_str(), model.as_str()));
        }
    }
    let again = shared_launch(cluster, ledger_spec, &models);
    assert!(again.contains("0 submitted, 6 skipped"), "{again}");
    // One leg of the first model's job: its cancel.request, the job stays for the other two.
    let (model, job, legs) = &jobs[0];
    let tb2 = legs.iter().find(|a| a.benchmark == "terminal_bench_2").unwrap();
    let out = run_ok(cluster, ledger_spec, &["cancel"], &["--model", model, "--benchmark", "terminal_bench_2"]);
    assert!(out.contains("this leg only"), "{out}");
    let request: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir(tb2).join(CANCEL_REQUEST_FILE)).unwrap()).unwrap();
    assert_eq!(request["attempt"], tb2.id.0, "{request}");
    let after = ledger.attempt(tb2.id).unwrap().unwrap();
    assert_eq!(after.status, AttemptStatus::Cancelled);
    assert!(after.reason.contains("this leg only"), "{}", after.reason);
    assert!(in_squeue(job), "the shared job goes on for the other legs");
    for other in legs.iter().filter(|a| a.id != tb2.id) {
        assert_eq!(ledger.attempt(other.id).unwrap().unwrap().status, AttemptStatus::Pending);
        assert!(!run_dir(other).join(CANCEL_REQUEST_FILE).exists());
    }
    // The last two legs: the job itself is cancelled.
    let out = cluster.run(&["cancel"], ledger_spec, &["--model", model, "--json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cancelled = doc["cancelled"].as_array().unwrap();
    assert_eq!(cancelled.len(), 2, "{doc:#}");
    assert!(cancelled.iter().all(|c| c.get("leg_only").is_none()), "{doc:#}");
    wait_until("the shared job to leave the queue", Duration::from_secs(60), || !in_squeue(job));
    // The other model by its job id: every leg, one scancel.
    let (_, job, _) = &jobs[1];
    let out = run_ok(cluster, ledger_spec, &["cancel"], &["--job", job]);
    assert!(out.contains("3 attempt(s) cancelled") && !out.contains("this leg only"), "{out}");
    wait_until("the second shared job to leave the queue", Duration::from_secs(60), || !in_squeue(job));
    assert!(ledger.active().unwrap().is_empty());
}

/// A leg's record as payload writes it in its run dir: the shared job's id, its outcome.
pub(crate) fn write_outcome(attempt: &Attempt, class: OutcomeClass, message: &str) {
    let now = Utc::now();
    let mut status =
        running_status(&attempt.run_tag, attempt.slurm_job_id.as_deref().unwrap(), now, now, Counters::default(), now);
    status.phase = Phase::Done;
    status.outcome = Some(Outcome {
        class,
        cause: None,
        exit_code: class.exit_code(),
        message: message.into(),
        harbor_exit_code: None,
        signal: None,
        engine_log_tail: Vec::new(),
    });
    let text = serde_json::to_string_pretty(&status).unwrap();
    std::fs::write(run_dir(attempt).join("status.json"), text).unwrap();
}

/// Sync maps each leg's records to its own attempt: one finished with its own metrics, one ended
/// by the walltime (resumable), one refused inside the job (its own failure only). The next launch
/// continues the walltime leg and resubmits the refused one, together in a new shared job; the
/// finished leg is never re-run and keeps its metrics.
#[test]
fn each_leg_is_synced_to_its_own_attempt_and_continued_on_its_own() {
    if !slurm_up() {
        eprintln!("skipping: no local Slurm");
        return;
    }
    let store = Store::sqlite();
    let cluster = held_cluster("shared-continue");
    let ledger_spec = &store.spec;
    let models = cluster.models_file(&["test/Tiny-1B"]);
    shared_launch(&cluster, ledger_spec, &models);
    let ledger = open_ledger(ledger_spec).unwrap();
    let _cleanup = Cleanup(ledger_spec.clone());
    let (_, job, legs) = jobs_by_model(&*ledger).remove(0);
    let leg = |benchmark: &str| legs.iter().find(|a| a.benchmark.contains(benchmark)).unwrap().clone();
    let (swe, v2, tb2) = (leg("swebench"), leg("dev_set_v2"), leg("terminal_bench_2"));
    write_outcome(&swe, OutcomeClass::Finished, "harbor finished");
    std::fs::write(
        run_dir(&swe).join("result.json"),
        r#"{"n_total_trials": 2, "finished_at": "2026-12-01T11:00:00", "stats": {"n_completed_trials": 2, "n_errored_trials": 0,
            "evals": {"e": {"n_trials": 2, "n_errors": 0, "metrics": [{"mean": 0.5}], "reward_stats": {"reward": {"1.0": ["a__x"], "0.0": ["b__y"]}}}}}}"#,
    )
    .unwrap();
    write_outcome(&v2, OutcomeClass::Walltime, "walltime: Harbor stopped, resumable");
    write_outcome(&tb2, OutcomeClass::Spec, "harbor.dataset: no such dataset dir");
    scancel(&job);
    wait_until("the shared job to leave the queue", Duration::from_secs(60), || !in_squeue(&job));
    run_ok(&cluster, ledger_spec, &["sync"], &[]);
    let swe_after = ledger.attempt(swe.id).unwrap().unwrap();
    assert_eq!(swe_after.status, AttemptStatus::Finished, "{}", swe_after.reason);
    assert_eq!(swe_after.metrics.as_ref().unwrap()["mean_reward"], 0.5, "{:?}", swe_after.metrics);
    let v2_after = ledger.attempt(v2.id).unwrap().unwrap();
    assert_eq!(v2_after.status, AttemptStatus::Failed);
    assert!(v2_after.reason.starts_with("walltime"), "{}", v2_after.reason);
    let tb2_after = ledger.attempt(tb2.id).unwrap().unwrap();
    assert_eq!(tb2_after.status, AttemptStatus::Failed);
    assert!(tb2_after.reason.contains("no such dataset dir"), "{}", tb2_after.reason);
    // The next launch: two legs left, one shared job again; the walltime leg resumes in its run dir.
    let out = shared_launch(&cluster, ledger_spec, &models);
    let (_, second_job, again) = jobs_by_model(&*ledger).remove(0);
    assert_eq!(again.len(), 2, "{out}");
    assert_ne!(second_job, job);
    let v2_next = again.iter().find(|a| a.benchmark == v2.benchmark).unwrap();
    assert_eq!((v2_next.run_tag.as_str(), v2_next.config["continues"].as_i64()), (v2.run_tag.as_str(), Some(v2.id.0)));
    let tb2_next = again.iter().find(|a| a.benchmark == tb2.benchmark).unwrap();
    // A failed leg is resubmitted (a failure counted), not continued: its unfinished Harbor job resumes.
    assert_eq!((tb2_next.run_tag.as_str(), tb2_next.config.get("continues")), (tb2.run_tag.as_str(), None));
    assert_eq!(ledger.attempts_for(&tb2.model, &tb2.benchmark_family).unwrap().len(), 2);
    assert!(!again.iter().any(|a| a.benchmark == swe.benchmark), "the finished leg is not re-run: {out}");
    assert_eq!(ledger.attempt(swe.id).unwrap().unwrap().metrics, swe_after.metrics, "untouched");
    let doc_dir = PathBuf::from(v2_next.config["shared"]["group_dir"].as_str().unwrap());
    assert_ne!(
        doc_dir.display().to_string(),
        swe.config["shared"]["group_dir"].as_str().unwrap(),
        "a group dir of its own"
    );
    assert_eq!(SharedJobSpec::from_file(&doc_dir.join("shared.json")).unwrap().legs.len(), 2);
}

/// Cancels every job the ledger still holds when the test ends, pass or fail.
pub(crate) struct Cleanup(pub(crate) String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(ledger) = open_ledger(&self.0) {
            cancel_all(&*ledger);
        }
    }
}

// End to end: payload's side runs the shared job (`payload run --shared`) with the stand-ins.

/// A cluster whose jobs run: `tweak` edits its profile (trial time, held jobs).
fn running_cluster(name: &str, tweak: impl Fn(&mut String)) -> TestCluster {
    TestCluster::new(name, tweak)
}

fn slow_trials(profile: &mut String, seconds: &str) {
    *profile = profile.replace("STANDIN_TRIAL_SECONDS: \"0.05\"", &format!("STANDIN_TRIAL_SECONDS: \"{seconds}\""));
}

/// Syncs until none of `ids` is active (each leg's outcome folded into its own attempt).
fn sync_until_done(cluster: &TestCluster, ledger_spec: &str, ledger: &dyn Ledger, ids: &[Attempt], what: &str) {
    wait_until(what, Duration::from_secs(300), || {
        run_ok(cluster, ledger_spec, &["sync"], &[]);
        ids.iter().all(|a| !ledger.attempt(a.id).unwrap().unwrap().status.is_active())
    });
}

fn the_job(ledger: &dyn Ledger) -> (String, Vec<Attempt>) {
    let (_, job, legs) = jobs_by_model(ledger).remove(0);
    (job, legs)
}

fn by_benchmark<'a>(legs: &'a [Attempt], benchmark: &str) -> &'a Attempt {
    legs.iter().find(|a| a.benchmark.contains(benchmark)).unwrap()
}

fn group_dir_of(attempt: &Attempt) -> PathBuf {
    PathBuf::from(attempt.config["shared"]["group_dir"].as_str().unwrap())
}

/// The leg's `status.json` outcome class once payload wrote one.
fn leg_outcome(attempt: &Attempt) -> Option<String> {
    let text = std::fs::read_to_string(run_dir(attempt).join("status.json")).ok()?;
    let status: Value = serde_json::from_str(&text).ok()?;
    status["outcome"]["class"].as_str().map(String::from)
}

/// `launch --preset ID --allocation shared --once`: one job; it starts the engine once (one
/// `vllm.log`, in the group dir) and finishes three Harbor jobs; three attempts finished, each
/// with the metrics of its own run dir.
#[test]
fn a_shared_job_loads_the_engine_once_and_finishes_three_legs() {
    if !slurm_up() {
        eprintln!("skipping: no local Slurm");
        return;
    }
    let store = Store::sqlite();
    let cluster = running_cluster("shared-e2e", |_| {});
    // Each leg a dataset of its own size, so each attempt's metrics are seen to be its own.
    let tasks = [("DCAgent_dev_set_v2", 3usize), ("DCAgent2_terminal_bench_2", 4)];
    for (dataset, n) in tasks {
        write_tasks(&cluster.root().join("datasets").join(dataset), (1..=n).map(|i| format!("t{i}")));
    }
    let ledger_spec = &store.spec;
    let out = shared_launch(&cluster, ledger_spec, &cluster.models_file(&["test/Tiny-1B"]));
    let ledger = open_ledger(ledger_spec).unwrap();
    let _cleanup = Cleanup(ledger_spec.clone());
    let (job, legs) = the_job(&*ledger);
    assert_eq!(legs.len(), 3, "{out}");
    sync_until_done(&cluster, ledger_spec, &*ledger, &legs, "the three legs to finish");
    let group = group_dir_of(&legs[0]);
    for leg in &legs {
        let after = ledger.attempt(leg.id).unwrap().unwrap();
        assert_eq!(after.status, AttemptStatus::Finished, "{}: {}", leg.benchmark, after.reason);
        let metrics = after.metrics.unwrap();
        let spec = launch_spec::LaunchSpec::from_file(&run_dir(leg).join("launch.json")).unwrap();
        let n_tasks = tasks.iter().find(|(d, _)| d.ends_with(&leg.benchmark)).map_or(2, |(_, n)| *n);
        let expected = n_tasks as u64 * u64::from(spec.harbor.n_attempts);
        assert_eq!(metrics["n_total_trials"], expected, "{}: its own dataset's trials: {metrics}", leg.benchmark);
        assert_eq!(after.slurm_job_id.as_deref(), Some(job.as_str()));
        assert!(run_dir(leg).join("result.json").is_file(), "{}: its own Harbor job", leg.benchmark);
        assert!(!run_dir(leg).join("vllm.log").exists(), "{}: no engine of its own", leg.benchmark);
    }
    let log = std::fs::read_to_string(group.join("vllm.log")).unwrap();
    assert_eq!(log.matches("non-default args:").count(), 1, "one cold load: {log}");
    // results: each cell is its own attempt's, from its own run dir.
    let doc: Value = serde_json::from_str(&run_ok(&cluster, ledger_spec, &["results"], &["--json"])).unwrap();
    let cells = doc["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 3, "{doc:#}");
    for leg in &legs {
        let cell = cells.iter().find(|c| c["benchmark"] == leg.benchmark.as_str()).unwrap();
        assert_eq!(
            (cell["attempt_id"].as_i64(), cell["run_tag"].as_str()),
            (Some(leg.id.0), Some(leg.run_tag.as_str()))
        );
    }
    // logs: a leg's engine log and the job's Slurm output are the group dir's, its payload log its own.
    let engine = run_ok(&cluster, ledger_spec, &["logs"], &[&legs[0].run_tag, "--engine"]);
    assert!(engine.contains("non-default args:"), "{engine}");
    let own = run_ok(&cluster, ledger_spec, &["logs"], &[&legs[0].run_tag]);
    assert_eq!(own, std::fs::read_to_string(run_dir(&legs[0]).join("payload.log")).unwrap());
    let host = run_ok(&cluster, ledger_spec, &["logs"], &[&job]);
    assert_eq!(host, std::fs::read_to_string(group.join(format!("slurm-{job}.out"))).unwrap());
}

/// Writes `n` tasks into each of the three ID datasets of `cluster`.
fn tasks_everywhere(cluster: &TestCluster, n: usize) {
    for dataset in ["DCAgent2_terminal_bench_2", "DCAgent_dev_set_v2", "DCAgent2_swebench-verified-random-100-folders"]
    {
        write_tasks(&cluster.root().join("datasets").join(dataset), (1..=n).map(|i| format!("t{i}")));
    }
}

fn leg_phase(attempt: &Attempt) -> Option<String> {
    let text = std::fs::read_to_string(run_dir(attempt).join("status.json")).ok()?;
    serde_json::from_str::<Value>(&text).ok()?["phase"].as_str().map(String::from)
}

/// One leg's dataset is gone when the job starts: that leg is refused inside the job with the
/// reason, the two others finish.
#[test]
fn a_leg_whose_dataset_is_missing_is_refused_and_the_others_finish() {
    if !slurm_up() {
        eprintln!("skipping: no local Slurm");
        return;
    }
    let store = Store::sqlite();
    let cluster = held_cluster("shared-nodata");
    let ledger_spec = &store.spec;
    shared_launch(&cluster, ledger_spec, &cluster.models_file(&["test/Tiny-1B"]));
    let ledger = open_ledger(ledger_spec).unwrap();
    let _cleanup = Cleanup(ledger_spec.clone());
    let (job, legs) = the_job(&*ledger);
    std::fs::remove_dir_all(cluster.root().join("datasets/DCAgent2_terminal_bench_2")).unwrap();
    let released = Command::new("scontrol").args(["release", &job]).status().unwrap();
    assert!(released.success());
    sync_until_done(&cluster, ledger_spec, &*ledger, &legs, "the legs to end");
    for leg in &legs {
        let after = ledger.attempt(leg.id).unwrap().unwrap();
        if leg.benchmark == "terminal_bench_2" {
            assert_eq!(after.status, AttemptStatus::Failed, "{}", after.reason);
            assert!(
                after.reason.contains("DCAgent2_terminal_bench_2"),
                "the reason names the dataset: {}",
                after.reason
            );
        } else {
            assert_eq!(after.status, AttemptStatus::Finished, "{}: {}", leg.benchmark, after.reason);
            assert!(after.metrics.is_some());
        }
    }
}

/// `cancel` of one pair while the shared job runs: that leg stops (its attempt cancelled, its
/// outcome `interrupted/cancel_requested`), the others finish on the same engine.
#[test]
fn cancel_of_one_running_leg_stops_it_alone() {
    if !slurm_up() {
        eprintln!("skipping: no local Slurm");
        return;
    }
    let store = Store::sqlite();
    let cluster = running_cluster("shared-cancel", |p| slow_trials(p, "0.4"));
    tasks_everywhere(&cluster, 12);
    let ledger_spec = &store.spec;
    shared_launch(&cluster, ledger_spec, &cluster.models_file(&["test/Tiny-1B"]));
    let ledger = open_ledger(ledger_spec).unwrap();
    let _cleanup = Cleanup(ledger_spec.clone());
    let (job, legs) = the_job(&*ledger);
    let tb2 = by_benchmark(&legs, "terminal_bench_2").clone();
    wait_until("the tb2 leg to run", Duration::from_secs(180), || leg_phase(&tb2).as_deref() == Some("running"));
    let out = run_ok(&cluster, ledger_spec, &["cancel"], &["--model", &tb2.model, "--benchmark", "terminal_bench_2"]);
    assert!(out.contains("this leg only"), "{out}");
    wait_until("the tb2 leg to stop", Duration::from_secs(120), || leg_outcome(&tb2).is_some());
    let status: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir(&tb2).join("status.json")).unwrap()).unwrap();
    assert_eq!(
        (status["outcome"]["class"].as_str(), status["outcome"]["cause"].as_str()),
        (Some("interrupted"), Some("cancel_requested"))
    );
    assert!(in_squeue(&job), "the job goes on for the other legs");
    let others: Vec<Attempt> = legs.iter().filter(|a| a.id != tb2.id).cloned().collect();
    sync_until_done(&cluster, ledger_spec, &*ledger, &others, "the other legs to finish");
    for leg in &others {
        let after = ledger.attempt(leg.id).unwrap().unwrap();
        assert_eq!(after.status, AttemptStatus::Finished, "{}: {}", leg.benchmark, after.reason);
    }
    assert_eq!(ledger.attempt(tb2.id).unwrap().unwrap().status, AttemptStatus::Cancelled);
}

/// The engine killed (SIGKILL to the stand-in's pid, as the OOM killer would) while every leg runs:
/// every leg's attempt fails `engine_died`.
#[test]
fn the_engine_killed_ends_every_leg_as_engine_died() {
    if !slurm_up() {
        eprintln!("skipping: no local Slurm");
        return;
    }
    let store = Store::sqlite();
    let cluster = running_cluster("shared-kill", |p| slow_trials(p, "0.4"));
    tasks_everywhere(&cluster, 12);
    let ledger_spec = &store.spec;
    shared_launch(&cluster, ledger_spec, &cluster.models_file(&["test/Tiny-1B"]));
    let ledger = open_ledger(ledger_spec).unwrap();
    let _cleanup = Cleanup(ledger_spec.clone());
    let (_, legs) = the_job(&*ledger);
    wait_until("every leg to run", Duration::from_secs(180), || {
        legs.iter().all(|l| leg_phase(l).as_deref() == Some("running"))
    });
    let host: Value =
        serde_json::from_str(&std::fs::read_to_string(group_dir_of(&legs[0]).join("status.json")).unwrap()).unwrap();
    let engine = host["pids"]["engine"].as_i64().unwrap_or_else(|| panic!("the engine's pid: {host:#}"));
    let killed = Command::new("kill").args(["-KILL", &engine.to_string()]).status().unwrap();
    assert!(killed.success());
    sync_until_done(&cluster, ledger_spec, &*ledger, &legs, "every leg to end");
    for leg in &legs {
        let after = ledger.attempt(leg.id).unwrap().unwrap();
        assert_eq!(after.status, AttemptStatus::Failed, "{}", leg.benchmark);
        assert!(after.reason.starts_with("engine_died"), "{}: {}", leg.benchmark, after.reason);
    }
}

/// The walltime warning (USR1 to the batch step, as Slurm sends it) after one leg finished: the
/// finished leg is never re-run; the two others end `walltime` and the next launch continues them
/// in one shared job again, where they finish.
#[test]
fn a_walltime_in_the_middle_continues_each_unfinished_leg() {
    if !slurm_up() {
        eprintln!("skipping: no local Slurm");
        return;
    }
    let store = Store::sqlite();
    let cluster = running_cluster("shared-wall", |p| slow_trials(p, "0.4"));
    // The others 60 tasks each: at 0.4 s a trial, 2 at a time, they run for many seconds after v2 ends.
    tasks_everywhere(&cluster, 60);
    // v2 one task: it finishes long before the others.
    std::fs::remove_dir_all(cluster.root().join("datasets/DCAgent_dev_set_v2")).unwrap();
    write_tasks(&cluster.root().join("datasets/DCAgent_dev_set_v2"), ["t1"]);
    let ledger_spec = &store.spec;
    let models = cluster.models_file(&["test/Tiny-1B"]);
    shared_launch(&cluster, ledger_spec, &models);
    let ledger = open_ledger(ledger_spec).unwrap();
    let _cleanup = Cleanup(ledger_spec.clone());
    let (job, legs) = the_job(&*ledger);
    let v2 = by_benchmark(&legs, "dev_set_v2").clone();
    wait_until("the v2 leg to finish", Duration::from_secs(180), || leg_outcome(&v2).as_deref() == Some("finished"));
    let warned = Command::new("scancel").args(["--signal=USR1", "--batch", &job]).status().unwrap();
    assert!(warned.success());
    sync_until_done(&cluster, ledger_spec, &*ledger, &legs, "the legs to wind down");
    let v2_done = ledger.attempt(v2.id).unwrap().unwrap();
    assert_eq!(v2_done.status, AttemptStatus::Finished, "{}", v2_done.reason);
    let unfinished: Vec<Attempt> = legs.iter().filter(|a| a.id != v2.id).cloned().collect();
    for leg in &unfinished {
        let after = ledger.attempt(leg.id).unwrap().unwrap();
        assert_eq!(after.status, AttemptStatus::Failed, "{}", leg.benchmark);
        assert!(after.reason.starts_with("walltime"), "{}: {}", leg.benchmark, after.reason);
    }
    // The continuation runs fast: the trials' time is the cluster's, not part of the resumed config.
    let profile = cluster.root().join("clusters/shared-wall.yaml");
    let text = std::fs::read_to_string(&profile)
        .unwrap()
        .replace("STANDIN_TRIAL_SECONDS: \"0.4\"", "STANDIN_TRIAL_SECONDS: \"0.05\"");
    std::fs::write(&profile, text).unwrap();
    let out = shared_launch(&cluster, ledger_spec, &models);
    let (second, continued) = the_job(&*ledger);
    assert_ne!(second, job);
    assert_eq!(continued.len(), 2, "{out}");
    for leg in &continued {
        let before = unfinished.iter().find(|a| a.benchmark == leg.benchmark).unwrap();
        assert_eq!(
            (leg.run_tag.as_str(), leg.config["continues"].as_i64()),
            (before.run_tag.as_str(), Some(before.id.0))
        );
    }
    sync_until_done(&cluster, ledger_spec, &*ledger, &continued, "the continued legs to finish");
    for leg in &continued {
        let after = ledger.attempt(leg.id).unwrap().unwrap();
        assert_eq!(after.status, AttemptStatus::Finished, "{}: {}", leg.benchmark, after.reason);
    }
    assert_eq!(ledger.attempt(v2.id).unwrap().unwrap().metrics, v2_done.metrics, "the finished leg untouched");
}
