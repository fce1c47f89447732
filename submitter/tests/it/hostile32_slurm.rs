//! Issue 32 items 11 and 12 on the real Slurm: a job remediation cannot `scancel` blocks no other
//! submission and is not asked again every `--watch` iteration; a listener tick whose `sbatch`
//! answers are lost queues one successor and still runs its own launch. Slurm's failures come from
//! wrappers on PATH in front of the real commands (`launch_path::wrapper`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use submitter::ledger::{AttemptStatus, open_ledger};

use crate::launch_path::{CancelFrom, wrapper};
use crate::ledger::Store;
use crate::queueing::{TestCluster, text};
use crate::remediation::{instant_failure_cluster, launch_until_a_hold_is_due};
use crate::support::{SUBMITTER, slurm_up, workspace_root, write_tasks};

const MODEL: &str = "test/Tiny-1B";
const OTHER: &str = "test/Small-3B";

/// The real `sbatch` queues the job, then its answer is lost (slurmctld's socket message, exit 1).
const LOST_ANSWER: &str = "/usr/bin/sbatch \"$@\" >/dev/null\n\
     echo 'sbatch: error: Batch job submission failed: Socket timed out on send/recv operation' >&2\nexit 1\n";

/// Iteration summaries (`N submitted, M skipped by dedup`) a `launch` printed.
fn summaries(printed: &str) -> usize {
    printed
        .lines()
        .filter(|line| line.split_once(" submitted, ").is_some_and(|(n, _)| n.parse::<u32>().is_ok()))
        .count()
}

/// Item 11: remediation decides to hold a pair whose job Slurm refuses to cancel (a `scancel`
/// wrapper that answers "Access/permission denied" and logs each call). `remediate` exits 4, as
/// `cancel` does for the same refusal (docs/exit-codes.md); then `launch --watch` submits the other
/// model in its first iteration and asks Slurm to cancel the stuck job once, not every iteration.
#[test]
fn a_job_remediation_cannot_cancel_blocks_no_submission_and_is_not_asked_every_iteration() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let cluster = instant_failure_cluster("rm-stuck");
    // Enough tasks that the stuck job still runs through the whole test (it is cancelled at the end).
    let names: Vec<String> = (0..600).map(|i| format!("t{i}")).collect();
    write_tasks(&cluster.root().join("datasets/DCAgent2_terminal_bench_2"), &names);
    let _cleanup = CancelFrom(cluster.root());
    let ledger = open_ledger(&store.spec).unwrap();
    let (attempt, job) = launch_until_a_hold_is_due(&cluster, &store.spec, &*ledger);
    let calls = cluster.root().join("scancel-calls.txt");
    let refusing = wrapper(
        &cluster,
        "scancel",
        &format!(
            "echo \"$@\" >> '{}'\necho \"scancel: error: Kill job error on job id {job}: Access/permission denied\" >&2\nexit 1\n",
            calls.display()
        ),
    );
    let remediate = cluster.run(&["remediate"], &store.spec, &[], &[("PATH", &refusing)]);
    let cancel = cluster.run(&["cancel"], &store.spec, &["--job", &job], &[("PATH", &refusing)]);
    assert_eq!(cancel.status.code(), Some(4), "cancel: {}", text(&cancel));
    assert_eq!(remediate.status.code(), cancel.status.code(), "remediate as cancel: {}", text(&remediate));
    let asked = |calls: &std::path::Path| {
        std::fs::read_to_string(calls).unwrap_or_default().lines().filter(|l| l.contains(job.as_str())).count()
    };
    let before_watch = asked(&calls);
    assert_eq!(before_watch, 2, "one scancel by remediate, one by cancel");

    let models = cluster.models_file(&[MODEL, OTHER]);
    let printed = cluster.root().join("watch.out");
    let mut watch = cluster.command(
        &["launch"],
        &store.spec,
        &["--watch", "--interval", "3s", "--preset", "tb2", "--models-file", models.to_str().unwrap()],
        &[("PATH", &refusing)],
    );
    let log = std::fs::File::create(&printed).unwrap();
    let mut child = watch.stdout(log.try_clone().unwrap()).stderr(log).stdin(Stdio::null()).spawn().unwrap();
    // Four iterations (or 60 s: an iteration that fails prints no summary).
    let started = Instant::now();
    while summaries(&std::fs::read_to_string(&printed).unwrap_or_default()) < 4
        && started.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(500));
    }
    let watched = started.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    let printed = std::fs::read_to_string(&printed).unwrap_or_default();
    assert!(summaries(&printed) >= 4, "the watch's iterations went on: {printed}");
    assert_eq!(
        ledger.attempts_for(OTHER, "terminal_bench_2").unwrap().len(),
        1,
        "the other model was submitted despite the stuck job: {printed}"
    );
    assert!(ledger.attempt(attempt.id).unwrap().unwrap().status.is_active(), "the stuck job ran throughout");
    // The first back-off is 60 s (`remediate::ScancelBackoff::FIRST`): one call within it, two past it.
    let allowed = if watched < Duration::from_secs(60) { 1 } else { 2 };
    let in_watch = asked(&calls) - before_watch;
    assert!((1..=allowed).contains(&in_watch), "scancel asked {in_watch} time(s) in {watched:?}: {printed}");
}

/// Item 12: every `sbatch` queues its job and loses the answer. A listener tick (run here as the
/// listener job runs it) queues exactly one successor — it finds the one it queued by the
/// listener's name instead of queuing a copy per retry — and still runs its own launch.
#[test]
fn a_listener_tick_whose_sbatch_answers_are_lost_queues_one_successor_and_still_launches() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let cluster = TestCluster::new("lsn-lost", |_| {});
    let _cleanup = CancelFrom(cluster.root());
    let models = cluster.models_file(&[MODEL]);
    let selection = ["--interval", "1h", "--", "--preset", "tb2", "--models-file", models.to_str().unwrap()];
    // `start` records the listener's state; its own job is refused, so the tick below is the only one.
    let refusing = wrapper(
        &cluster,
        "sbatch",
        "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2\nexit 1\n",
    );
    let start = cluster.run(&["listener", "start"], &store.spec, &selection, &[("PATH", &refusing)]);
    assert_eq!(start.status.code(), Some(4), "{}", text(&start));
    let state = cluster.root().join("state/listener.json");
    assert!(state.is_file(), "{}", text(&start));

    let losing = wrapper(&cluster, "sbatch", LOST_ANSWER);
    let tick = Command::new(SUBMITTER)
        .args(["listener", "tick", "--state-file"])
        .arg(&state)
        .env_clear()
        .env("PATH", &losing)
        .env("HOME", std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
        .env("USER", "tester")
        .env("SUBMITTER_HOME", workspace_root())
        .env("SUBMITTER_LEDGER", &store.spec)
        .env("PAYLOAD_GPU_FIXTURE", workspace_root().join("tests/fixtures/gpus-4x-a100-64gb.json"))
        .current_dir(cluster.root())
        .output()
        .unwrap();
    let printed = text(&tick);
    let name = "eval-listener-lsn-lost";
    let queued = Command::new("squeue").args(["-h", "-n", name, "-o", "%i"]).output().unwrap();
    let queued: Vec<String> = String::from_utf8_lossy(&queued.stdout).lines().map(str::to_string).collect();
    assert_eq!(queued.len(), 1, "one successor queued, not {queued:?}: {printed}");
    assert!(printed.contains("sbatch's answer was lost, job found by its name"), "{printed}");
    let attempts = open_ledger(&store.spec).unwrap().attempts_for(MODEL, "terminal_bench_2").unwrap();
    assert_eq!(attempts.len(), 1, "the tick ran its launch: {printed}");
    assert!(tick.status.success(), "{printed}");
    let stop = cluster.run(&["listener", "stop"], &store.spec, &[], &[]);
    assert!(stop.status.success(), "{}", text(&stop));
}

/// Item 12: remediation retried a pair with a lowered memory ceiling under which the weights no
/// longer fit (its retry record written here as a pass writes it). The next launch is refused by
/// preflight once and the pair is held with preflight's reason: the launch after it submits
/// nothing and runs no preflight into the same refusal; `plan` shows the hold.
#[test]
fn a_retry_whose_new_spec_fails_preflight_becomes_a_hold() {
    if !slurm_up() {
        return;
    }
    const BIG: &str = "test/Mini-7B";
    let store = Store::sqlite();
    let cluster = TestCluster::new("retry-refused", |p| {
        *p = p.replace("  gpus_per_node: 1\n", "  gpus_per_node: 1\n  gpu_memory_gib: 64\n");
    });
    let _cleanup = CancelFrom(cluster.root());
    let ledger = open_ledger(&store.spec).unwrap();
    // The attempt that ran out of memory (a retry follows a failed attempt of the pair).
    let failed = ledger
        .insert_pending(&submitter::ledger::NewAttempt {
            model: BIG.into(),
            benchmark: "terminal_bench_2".into(),
            cluster: "retry-refused".into(),
            username: "tester".into(),
            run_tag: "terminal_bench_2__test__Mini-7B".into(),
            agent: submitter::config::preset::DEFAULT_AGENT.into(),
            reason: "no previous attempt".into(),
            config: serde_json::json!({"run_dir": cluster.root().join("jobs/oom"), "timeout_multiplier": 1.0}),
        })
        .unwrap();
    ledger.transition(failed, AttemptStatus::Failed, "outcome.engine.oom: CUDA out of memory", None).unwrap();
    let lowered = 0.15;
    ledger
        .record_remediation(&submitter::ledger::NewRemediation {
            model: BIG.into(),
            family: "terminal_bench_2".into(),
            agent: submitter::config::preset::DEFAULT_AGENT.into(),
            cluster: "retry-refused".into(),
            attempt: Some(failed),
            finding: "outcome.engine.oom".into(),
            action: submitter::domain::RemediationAct::Retry,
            change: format!("serve.gpu_memory_utilization 0.90 → {lowered:.2}"),
            adjustment: Some(submitter::domain::PairAdjustment {
                gpu_memory_utilization: Some(lowered),
                ..Default::default()
            }),
            reason: "outcome.engine.oom: payload ended the run: CUDA out of memory".into(),
            username: "tester".into(),
        })
        .unwrap();
    let models = cluster.models_file(&[BIG]);
    let selection = ["--once", "--preset", "tb2", "--models-file", models.to_str().unwrap()];
    let refused = cluster.run(&["launch"], &store.spec, &selection, &[]);
    assert_eq!(refused.status.code(), Some(6), "{}", text(&refused));
    assert!(
        text(&refused).contains("preflight failed") && text(&refused).contains("may not fit"),
        "{}",
        text(&refused)
    );
    let records = ledger.remediations().unwrap();
    let hold = records.last().unwrap();
    assert_eq!((hold.action.as_str(), hold.finding.as_str()), ("hold", "retry.refused"), "{records:?}");
    assert!(hold.reason.contains("fails preflight") && hold.reason.contains("may not fit"), "{}", hold.reason);

    let again = cluster.run(&["launch"], &store.spec, &selection, &[]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(!text(&again).contains("preflight failed") && text(&again).contains("0 submitted"), "{}", text(&again));
    let plan = cluster.run(&["plan"], &store.spec, &["--preset", "tb2", "--model", BIG, "--json"], &[]);
    let doc: serde_json::Value =
        serde_json::from_slice(&plan.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&plan)));
    assert_eq!(doc["jobs"][0]["blocked"]["kind"], "held", "{doc:#}");
    assert_eq!(ledger.attempts_for(BIG, "terminal_bench_2").unwrap().len(), 1, "nothing was submitted");
}
