//! Queueing on the real local Slurm (docs/design.md §7.3–7.4): jobs really submitted through `submitter
//! launch`, really running `payload` with the stand-ins, really cancelled; the same scenarios on a
//! SQLite ledger and on PostgreSQL. Without a reachable Slurm these print `skipping: no local Slurm`
//! (and fail in CI).

#![allow(clippy::print_stderr)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use submitter::ledger::{AttemptStatus, Ledger, open_ledger};
use tempfile::TempDir;

use crate::ledger::Store;
use crate::support::{SUBMITTER, slurm_up, standin_environment, test_secrets_file, workspace_root, write_tasks};

/// Small models: size default TP1; with `gpus_per_node: 1` each job takes one of the node's 4 GPUs.
const MODELS: [&str; 3] = ["test/Tiny-1B", "test/Small-3B", "test/Mini-7B"];

/// One isolated cluster profile on the real local Slurm: its own jobs/state/dataset dirs, an
/// environment prefix holding the stand-ins, a 0600 secrets file.
pub(crate) struct TestCluster {
    dir: TempDir,
    name: String,
}

impl TestCluster {
    pub(crate) fn new(name: &str, tweak: impl Fn(&mut String)) -> TestCluster {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        standin_environment(root);
        for dataset in
            ["DCAgent2_terminal_bench_2", "DCAgent_dev_set_v2", "DCAgent2_swebench-verified-random-100-folders"]
        {
            write_tasks(&root.join("datasets").join(dataset), ["t1", "t2"]);
        }
        std::fs::create_dir_all(root.join("clusters")).unwrap();
        std::fs::copy(workspace_root().join("clusters/gpus.yaml"), root.join("clusters/gpus.yaml")).unwrap();
        test_secrets_file(root);
        let r = root.display();
        let mut profile = format!(
            "name: {name}
slurm:
  partition: debug
  time: \"00:10:00\"
  export_env: [PAYLOAD_GPU_FIXTURE]
hardware:
  gpus_per_node: 1
  cpus_per_node: 1
  mem_per_node_mb: 400
  arch: x86_64
environments:
  otagent: {r}/env
engine:
  default_environment: otagent
  health_timeout_s: 60
  env:
    STANDIN_LOAD_SECONDS: \"0.3\"
harbor:
  environment: otagent
  env:
    STANDIN_TRIAL_SECONDS: \"0.05\"
    STANDIN_EXTRAS: daytona
paths:
  jobs_dir: {r}/jobs
  logs_dir: {r}/logs
  datasets_dirs:
    - {r}/datasets
  state_dir: {r}/state
secrets:
  file: {r}/secrets.env
limits:
  max_jobs_in_flight: 20
  submission_delay_s: 0
  n_concurrent: 2
  walltime_lead_s: 60
  max_attempts: 3
listener: {{partition: debug, time: \"00:05:00\", internet: true}}
"
        );
        tweak(&mut profile);
        std::fs::write(root.join("clusters").join(format!("{name}.yaml")), profile).unwrap();
        TestCluster { dir, name: name.to_string() }
    }

    pub(crate) fn root(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn models_file(&self, models: &[&str]) -> PathBuf {
        let path = self.root().join("models.txt");
        std::fs::write(&path, models.join("\n") + "\n").unwrap();
        path
    }

    /// Runs `submitter <command> --cluster <name> --clusters … --ledger … <args>` with a clean,
    /// explicit environment plus `extra_env`.
    pub(crate) fn run(&self, command: &[&str], ledger: &str, args: &[&str], extra_env: &[(&str, &str)]) -> Output {
        self.command(command, ledger, args, extra_env).output().unwrap()
    }

    /// [`TestCluster::run`]'s command, not started (for a long-running `launch --watch`).
    pub(crate) fn command(&self, command: &[&str], ledger: &str, args: &[&str], extra_env: &[(&str, &str)]) -> Command {
        // Through the variable, not argv: a PostgreSQL URL holds the test role's password.
        self.command_without_ledger(command, args, &[&[("SUBMITTER_LEDGER", ledger)][..], extra_env].concat())
    }

    /// [`TestCluster::command`] for a command that takes no `--ledger` (`preflight`).
    pub(crate) fn command_without_ledger(
        &self,
        command: &[&str],
        args: &[&str],
        extra_env: &[(&str, &str)],
    ) -> Command {
        let mut cmd = Command::new(SUBMITTER);
        cmd.args(command)
            .args(["--cluster", &self.name, "--clusters"])
            .arg(self.root().join("clusters"))
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .env("HOME", std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
            .env("USER", "tester")
            .env("SUBMITTER_HOME", workspace_root())
            .env("PAYLOAD_GPU_FIXTURE", workspace_root().join("tests/fixtures/gpus-4x-a100-64gb.json"))
            .current_dir(self.root());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        cmd
    }

    fn launch(&self, ledger: &str, selection: &[&str]) -> Output {
        let models = self.models_file(&MODELS);
        let mut args = vec!["--once", "--models-file", models.to_str().unwrap()];
        args.extend_from_slice(selection);
        self.run(&["launch"], ledger, &args, &[])
    }
}

pub(crate) fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

pub(crate) fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

pub(crate) fn scancel(job: &str) {
    let _ = Command::new("scancel").arg(job).status();
}

/// Cancels every job an attempt in this ledger still holds (test hygiene).
pub(crate) fn cancel_all(ledger: &dyn Ledger) {
    for attempt in ledger.active().unwrap_or_default() {
        if let Some(job) = attempt.slurm_job_id {
            scancel(&job);
        }
    }
}

/// Runs `test`, then [`cancel_all`] whether it passed or panicked.
pub(crate) fn cancel_all_on_drop(ledger: &dyn Ledger, test: impl FnOnce()) {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(test));
    cancel_all(ledger);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

fn counts(ledger: &dyn Ledger) -> BTreeMap<(String, String), usize> {
    let mut map = BTreeMap::new();
    for pair in ledger.latest_per_pair().unwrap() {
        map.insert((pair.model.clone(), pair.family.clone()), pair.total_attempts as usize);
    }
    map
}

/// Runs `scenario` on SQLite and, when reachable, PostgreSQL.
fn on_both(test: &str, scenario: fn(&TestCluster, &str)) {
    if !slurm_up() {
        return;
    }
    let sqlite = Store::sqlite();
    let cluster = TestCluster::new(&format!("{test}-sq"), |_| {});
    scenario(&cluster, &sqlite.spec);
    cancel_all(&*open_ledger(&sqlite.spec).unwrap());
    if let Some(pg) = Store::postgres(test) {
        let cluster = TestCluster::new(&format!("{test}-pg"), |_| {});
        scenario(&cluster, &pg.spec);
        cancel_all(&*open_ledger(&pg.spec).unwrap());
    }
}

/// Three models × the three ID presets are submitted once and only once; a second launch while
/// they run submits nothing; `scancel` of one → the next launch marks it vanished and resubmits it.
fn once_and_only_once(cluster: &TestCluster, ledger_spec: &str) {
    let slow = [("STANDIN_LOAD_SECONDS", "300")];
    let _ = slow; // the engine loads slowly through the profile below
    let first = cluster.launch(ledger_spec, &["--preset", "ID"]);
    assert!(first.status.success(), "{}", text(&first));
    let ledger = open_ledger(ledger_spec).unwrap();
    let active = ledger.active().unwrap();
    assert_eq!(active.len(), 9, "3 models × 3 benchmarks: {}", text(&first));
    assert!(active.iter().all(|a| a.slurm_job_id.is_some()), "every row has its job id");
    let second = cluster.launch(ledger_spec, &["--preset", "ID"]);
    assert!(second.status.success(), "{}", text(&second));
    assert!(text(&second).contains("0 submitted, 9 skipped"), "{}", text(&second));
    assert!(counts(&*ledger).values().all(|&n| n == 1), "{:?}", counts(&*ledger));
    // Cancel one job behind the submitter's back. A job still queued has no payload to record an
    // outcome, so its attempt must read as vanished; a running one is recorded as interrupted.
    let queued_state = |job: &str| {
        let out = Command::new("squeue").args(["-h", "-j", job, "-o", "%T"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let victim = active
        .iter()
        .find(|a| queued_state(a.slurm_job_id.as_deref().unwrap()) == "PENDING")
        .unwrap_or(&active[0])
        .clone();
    let was_queued = queued_state(victim.slurm_job_id.as_deref().unwrap()) == "PENDING";
    scancel(victim.slurm_job_id.as_deref().unwrap());
    wait_until("the cancelled job to leave the queue", Duration::from_secs(60), || {
        let state = queued_state(victim.slurm_job_id.as_deref().unwrap());
        !state.contains("PENDING") && !state.contains("RUNNING")
    });
    let third = cluster.launch(ledger_spec, &["--preset", "ID"]);
    let out = text(&third);
    assert!(third.status.success(), "{out}");
    assert!(out.contains("1 submitted"), "{out}");
    let old = ledger.attempt(victim.id).unwrap().unwrap();
    assert_eq!(old.status, AttemptStatus::Failed);
    let expected = if was_queued { "vanished" } else { "interrupted" };
    assert!(old.reason.contains(expected), "{} (queued when cancelled: {was_queued})", old.reason);
    let history = ledger.attempts_for(&victim.model, &victim.benchmark_family).unwrap();
    assert_eq!(history.len(), 2, "resubmitted once");
}

#[test]
fn three_models_times_id_presets_once_and_only_once() {
    // Slow engines keep every job active while the second launch runs.
    on_both("once", |cluster, ledger| {
        let profile = cluster.root().join("clusters").join(format!("{}.yaml", cluster.name));
        let text = std::fs::read_to_string(&profile)
            .unwrap()
            .replace("STANDIN_LOAD_SECONDS: \"0.3\"", "STANDIN_LOAD_SECONDS: \"300\"");
        std::fs::write(&profile, text).unwrap();
        once_and_only_once(cluster, ledger);
    });
}

/// Two `launch` processes started at the same moment on one ledger (separate state dirs, so only
/// the database arbitrates): every pair is submitted exactly once.
#[test]
fn two_concurrent_launches_submit_each_pair_once() {
    on_both("race", |cluster, ledger_spec| {
        let profile = cluster.root().join("clusters").join(format!("{}.yaml", cluster.name));
        let text_profile = std::fs::read_to_string(&profile)
            .unwrap()
            .replace("STANDIN_LOAD_SECONDS: \"0.3\"", "STANDIN_LOAD_SECONDS: \"300\"");
        std::fs::write(&profile, text_profile).unwrap();
        let models = cluster.models_file(&MODELS);
        let spawn = |state: &str| {
            Command::new(SUBMITTER)
                .args([
                    "launch",
                    "--once",
                    "--preset",
                    "tb2",
                    "--preset",
                    "v2",
                    "--cluster",
                    &cluster.name,
                    "--clusters",
                ])
                .arg(cluster.root().join("clusters"))
                .env("SUBMITTER_LEDGER", ledger_spec)
                .arg("--state-dir")
                .arg(cluster.root().join(state))
                .arg("--models-file")
                .arg(&models)
                .env("SUBMITTER_HOME", workspace_root())
                .env("PAYLOAD_GPU_FIXTURE", workspace_root().join("tests/fixtures/gpus-4x-a100-64gb.json"))
                .spawn()
                .unwrap()
        };
        let (a, b) = (spawn("state-a"), spawn("state-b"));
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        assert!(a.status.success() && b.status.success(), "{}\n{}", text(&a), text(&b));
        let ledger = open_ledger(ledger_spec).unwrap();
        let per_pair = counts(&*ledger);
        assert_eq!(per_pair.len(), 6, "{per_pair:?}");
        let rows: Vec<String> = per_pair
            .keys()
            .flat_map(|(m, f)| ledger.attempts_for(m, f).unwrap())
            .map(|a| format!("{} {} {} {:?} {}", a.id, a.model, a.benchmark, a.status, a.reason))
            .collect();
        assert!(
            per_pair.values().all(|&n| n == 1),
            "each pair exactly once: {per_pair:?}\n{}\n{}\n{}",
            rows.join("\n"),
            text(&a),
            text(&b)
        );
        assert_eq!(ledger.active().unwrap().len(), 6);
    });
}

/// Ledger down → nothing submitted, a clear one-line error, non-zero exit.
#[test]
fn ledger_down_submits_nothing() {
    if !slurm_up() {
        return;
    }
    let cluster = TestCluster::new("down", |_| {});
    // This cluster's jobs only (their working dir is under its root): other tests queue jobs of
    // the same name meanwhile.
    let ours = || {
        let out = Command::new("squeue").args(["-h", "--states=all", "-o", "%i %Z"]).output().unwrap();
        let root = cluster.dir.path().display().to_string();
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains(&root)).map(String::from).collect::<Vec<_>>()
    };
    let before = ours();
    let out = cluster.launch("postgres://evaltest:not-a-real-password@127.0.0.1:1/evaltest", &["--preset", "tb2"]);
    let message = text(&out);
    assert_eq!(out.status.code(), Some(3), "ledger unavailable: {message}");
    assert!(message.contains("unreachable") && message.contains("127.0.0.1:1"), "{message}");
    assert!(!message.contains("not-a-real-password"), "password leaked: {message}");
    assert_eq!(before, ours(), "nothing was submitted");
}

/// sbatch rejects the job (a feature no node has; a bad partition is caught by preflight before
/// sbatch, see submitter/tests/it/site.rs) → the row is failed with sbatch's reason and does not
/// block the pair: the next launch with a good profile submits it.
#[test]
fn sbatch_failure_does_not_block_the_pair() {
    on_both("badpart", |cluster, ledger_spec| {
        let profile = cluster.root().join("clusters").join(format!("{}.yaml", cluster.name));
        let good = std::fs::read_to_string(&profile).unwrap();
        let bad = good
            .replace("  partition: debug\n", "  partition: debug\n  extra_args: [\"--constraint=no-such-feature\"]\n");
        std::fs::write(&profile, bad).unwrap();
        let out = cluster.run(&["launch"], ledger_spec, &["--once", "--preset", "tb2", "--model", "test/Tiny-1B"], &[]);
        // 6: a submission failed — not 0, as if all were well (docs/exit-codes.md).
        assert_eq!(out.status.code(), Some(6), "{}", text(&out));
        assert!(text(&out).contains("sbatch failed") && text(&out).contains("1 failed"), "{}", text(&out));
        let ledger = open_ledger(ledger_spec).unwrap();
        assert!(ledger.active().unwrap().is_empty(), "no blocking row");
        std::fs::write(&profile, good).unwrap();
        let out = cluster.run(&["launch"], ledger_spec, &["--once", "--preset", "tb2", "--model", "test/Tiny-1B"], &[]);
        assert!(text(&out).contains("1 submitted"), "{}", text(&out));
        assert!(out.status.success(), "{}", text(&out));
    });
}

/// A finished attempt with metrics is skipped; a failed pair past the attempt bound is skipped
/// with that reason.
#[test]
fn finished_is_skipped_and_failures_are_bounded() {
    on_both("done", |cluster, ledger_spec| {
        let model = ["--model", "test/Tiny-1B"];
        let out = cluster.run(&["launch"], ledger_spec, &[&["--once", "--preset", "tb2"][..], &model].concat(), &[]);
        assert!(text(&out).contains("1 submitted"), "{}", text(&out));
        let ledger = open_ledger(ledger_spec).unwrap();
        wait_until("the job to finish and sync", Duration::from_secs(120), || {
            cluster.run(&["sync"], ledger_spec, &[], &[]);
            ledger.active().unwrap().is_empty()
        });
        let attempt = &ledger.attempts_for("test/Tiny-1B", "terminal_bench_2").unwrap()[0];
        assert_eq!(attempt.status, AttemptStatus::Finished, "{}", attempt.reason);
        assert!(attempt.metrics.as_ref().is_some_and(|m| m["n_trials"].as_u64() > Some(0)), "{:?}", attempt.metrics);
        // Issue 24: sync recorded its GPU-seconds from payload's record and Slurm's start; the
        // stand-in loads for 0.3 s, so the engine's load phase is at least that per GPU.
        let gpu = ledger.gpu_seconds().unwrap().into_iter().find(|r| r.id == attempt.id).expect("a GPU-seconds record");
        let gpus = gpu.record["gpus"].as_f64().unwrap();
        assert!(gpus >= 1.0, "{}", gpu.record);
        assert!(gpu.record["by_phase"]["load"].as_f64().unwrap() >= 0.3 * gpus, "{}", gpu.record);
        assert!(gpu.record["by_phase"]["serving"].as_f64().unwrap() > 0.0, "{}", gpu.record);
        assert!(gpu.record["slurm_elapsed_s"].as_f64().is_some(), "Slurm's start is known: {}", gpu.record);
        let results = cluster.run(&["results"], ledger_spec, &["--json"], &[]);
        let results: Value = serde_json::from_slice(&results.stdout).unwrap();
        assert!(results["cells"][0]["gpu_hours"].as_f64().is_some_and(|h| h > 0.0), "{results}");
        let plan = cluster.run(&["plan"], ledger_spec, &[&["--preset", "tb2", "--json"][..], &model].concat(), &[]);
        let decisions: Value = serde_json::from_slice(&plan.stdout).unwrap();
        assert_eq!(decisions["jobs"][0]["decision"], "skip");
        assert_eq!(decisions["jobs"][0]["reason"], "finished");

        // A missing dataset is caught on the login node (staging cannot fetch it here): nothing
        // is submitted and no attempt is burnt.
        let dataset = cluster.root().join("datasets/DCAgent_dev_set_v2");
        let parked = cluster.root().join("datasets/parked_dev_set_v2");
        std::fs::rename(&dataset, &parked).unwrap();
        let out = cluster.run(&["launch"], ledger_spec, &[&["--once", "--preset", "v2"][..], &model].concat(), &[]);
        assert!(text(&out).contains("not submitted: staging failed"), "{}", text(&out));
        assert!(ledger.attempts_for("test/Tiny-1B", "dev_set_v2").unwrap().is_empty(), "preflight burnt an attempt");
        std::fs::rename(&parked, &dataset).unwrap();

        // An engine that fails on the node fails every attempt; after max_attempts: skip.
        let profile = cluster.root().join("clusters").join(format!("{}.yaml", cluster.name));
        let text_profile =
            std::fs::read_to_string(&profile).unwrap().replace("max_attempts: 3", "max_attempts: 2").replace(
                "STANDIN_LOAD_SECONDS: \"0.3\"",
                "STANDIN_LOAD_SECONDS: \"0.3\"\n    STANDIN_FAIL_AT_START: other",
            );
        std::fs::write(&profile, text_profile).unwrap();
        for _ in 0..2 {
            cluster.run(&["launch"], ledger_spec, &[&["--once", "--preset", "v2"][..], &model].concat(), &[]);
            wait_until("the failing job to end and sync", Duration::from_secs(90), || {
                cluster.run(&["sync"], ledger_spec, &[], &[]);
                ledger.active().unwrap().is_empty()
            });
        }
        let plan = cluster.run(&["plan"], ledger_spec, &[&["--preset", "v2", "--json"][..], &model].concat(), &[]);
        let decisions: Value = serde_json::from_slice(&plan.stdout).unwrap();
        assert_eq!(decisions["jobs"][0]["decision"], "skip", "{decisions}");
        assert!(decisions["jobs"][0]["reason"].as_str().unwrap().starts_with("too many failures"), "{decisions}");
    });
}

/// A re-evaluation is a new run (issue 20): a forced launch of a finished pair and a
/// `--config-aware` one under another timeout multiplier each run every trial again — Harbor
/// fresh (`jobs start`), in a run dir of its own, under the multiplier the ledger records — while
/// the earlier run dirs and results stay as they were and readable by `check` and `logs`;
/// `results --json` has every result, each with its provenance.
#[test]
fn a_re_evaluation_runs_every_trial_again_in_a_run_dir_of_its_own() {
    on_both("reeval", |cluster, ledger_spec| {
        // The weights in the profile's HF cache, as staging leaves them: the revision is refs/main.
        let revision = "5f0b02c75b57c5855da9ae460ce51323ea669d8a";
        let repo = cluster.root().join("hf/models--test--Tiny-1B");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::create_dir_all(repo.join("snapshots").join(revision)).unwrap();
        std::fs::write(repo.join("refs/main"), revision).unwrap();
        std::fs::write(repo.join("snapshots").join(revision).join("config.json"), "{}").unwrap();
        let profile = cluster.root().join("clusters").join(format!("{}.yaml", cluster.name));
        let hf = format!("paths:\n  hf_cache: {}\n", cluster.root().join("hf").display());
        std::fs::write(&profile, std::fs::read_to_string(&profile).unwrap().replace("paths:\n", &hf)).unwrap();
        let ledger = open_ledger(ledger_spec).unwrap();
        let launch_and_finish = |extra: &[&str]| {
            let args = [&["--once", "--preset", "tb2", "--model", "test/Tiny-1B"][..], extra].concat();
            let out = cluster.run(&["launch"], ledger_spec, &args, &[]);
            assert!(out.status.success() && text(&out).contains("1 submitted"), "{extra:?}: {}", text(&out));
            wait_until("the job to finish and sync", Duration::from_secs(120), || {
                cluster.run(&["sync"], ledger_spec, &[], &[]);
                ledger.active().unwrap().is_empty()
            });
            let latest =
                ledger.attempts_for("test/Tiny-1B", "terminal_bench_2").unwrap().into_iter().max_by_key(|a| a.id.0);
            let latest = latest.unwrap();
            assert_eq!(latest.status, AttemptStatus::Finished, "{extra:?}: {}", latest.reason);
            latest
        };
        let run_dir = |a: &submitter::ledger::Attempt| PathBuf::from(a.config["run_dir"].as_str().unwrap());
        let first = launch_and_finish(&[]);
        let first_result = std::fs::read(run_dir(&first).join("result.json")).unwrap();
        let trials = first.metrics.as_ref().unwrap()["n_trials"].as_u64().unwrap();
        assert!(trials > 0, "{:?}", first.metrics);
        // Sync stored each finished trial's facts and the Harbor that produced them (issue 35).
        let facts = ledger.trials(first.id).unwrap().expect("sync stored the finished attempt's trials");
        assert_eq!(facts.trials.len() as u64, trials, "{facts:?}");
        assert!(facts.harbor_version.is_some(), "{facts:?}");
        let forced = launch_and_finish(&["--force"]);
        let aware = launch_and_finish(&["--config-aware", "--timeout-multiplier", "4"]);
        for (again, multiplier) in [(&forced, first.config["timeout_multiplier"].as_f64().unwrap()), (&aware, 4.0)] {
            let dir = run_dir(again);
            assert_ne!(again.run_tag, first.run_tag);
            assert_ne!(dir, run_dir(&first));
            assert_eq!(dir.file_name().unwrap().to_str(), Some(again.run_tag.as_str()));
            let status: Value = serde_json::from_slice(&std::fs::read(dir.join("status.json")).unwrap()).unwrap();
            assert_eq!(status["resume"], false, "Harbor ran fresh: {status}");
            let events = std::fs::read_to_string(dir.join("events.jsonl")).unwrap();
            let spawned = events
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .rfind(|e| e["event"] == "harbor_spawned");
            let argv = spawned.expect("harbor_spawned")["fields"]["argv"].clone();
            assert_eq!((argv[1].as_str(), argv[2].as_str()), (Some("jobs"), Some("start")), "{argv}");
            assert_eq!(again.metrics.as_ref().unwrap()["n_trials"].as_u64(), Some(trials), "every trial ran again");
            let done = std::fs::read_dir(&dir)
                .unwrap()
                .filter(|e| e.as_ref().unwrap().path().join("result.json").is_file())
                .count();
            assert_eq!(done as u64, trials, "trial dirs with a result in {}", dir.display());
            let job: Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
            assert_eq!(job["timeout_multiplier"].as_f64().unwrap_or(1.0), multiplier, "what Harbor ran: {job}");
            assert_eq!(again.config["timeout_multiplier"].as_f64(), Some(multiplier), "what the ledger says");
        }
        assert_eq!(std::fs::read(run_dir(&first).join("result.json")).unwrap(), first_result, "first result kept");
        let check = Command::new(SUBMITTER).args(["check", "--json"]).arg(run_dir(&first)).output().unwrap();
        let doc: Value = serde_json::from_slice(&check.stdout).unwrap_or(Value::Null);
        assert_eq!(doc["runs"][0]["facts"]["trials"]["done"].as_u64(), Some(trials), "{}", text(&check));
        let logs = cluster.run(&["logs"], ledger_spec, &[&first.run_tag, "--harbor"], &[]);
        assert!(logs.status.success() && !logs.stdout.is_empty(), "{}", text(&logs));

        let out = cluster.run(&["results"], ledger_spec, &["--json"], &[]);
        assert!(out.status.success(), "{}", text(&out));
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        let cell = &doc["cells"][0];
        assert_eq!(cell["attempt_id"], aware.id.0, "the latest is the cell: {doc:#}");
        let earlier: Vec<i64> =
            doc["earlier"].as_array().unwrap().iter().map(|c| c["attempt_id"].as_i64().unwrap()).collect();
        assert_eq!(earlier, [first.id.0, forced.id.0], "{doc:#}");
        assert_eq!(cell["provenance"]["timeout_multiplier"], 4.0, "{cell:#}");
        assert_eq!(
            cell["other_settings"],
            serde_json::json!([first.id.0, forced.id.0]),
            "another multiplier: {cell:#}"
        );
        for result in doc["earlier"].as_array().unwrap().iter().chain([cell]) {
            let p = &result["provenance"];
            assert_eq!(p["agent"], "terminus-2", "{p}");
            assert_eq!(p["n_attempts"].as_u64(), Some(trials / 2), "2 tasks × n_attempts: {p}");
            assert!(p["dataset"].as_str().is_some_and(|d| d.ends_with("DCAgent2_terminal_bench_2")), "{p}");
            assert!(p["gpu"].as_str().is_some_and(|g| g.contains("A100")), "{p}");
            assert!(p["vllm_version"].as_str().is_some() && p["harbor_version"].as_str().is_some(), "{p}");
            assert_eq!(p["model_revision"], revision, "{p}");
            assert!(p["dataset_digest"].as_str().is_some_and(|d| d.starts_with("sha1:")), "{p}");
        }
        let human = cluster.run(&["results"], ledger_spec, &[], &[]);
        assert!(text(&human).contains("2 earlier result(s)") && text(&human).contains('~'), "{}", text(&human));
    });
}

/// An eval's identity includes its harness (issue 20): the agent comes from the Harbor config's
/// `agents`, as Harbor runs it, and another agent on the same model and benchmark is another eval —
/// its own run tag, ledger row and dedup slot — not "already active (another submitter)"; an
/// installed harness (openhands) selected that way needs its tunnel and is refused without one,
/// never run as terminus-2.
#[test]
fn another_harness_is_another_eval_with_its_own_run_tag_and_dedup() {
    on_both("harness", |cluster, ledger_spec| {
        let config = |agent: &str| {
            let path = cluster.root().join(format!("{agent}_eval.yaml"));
            let yaml = format!(
                "orchestrator:\n  type: local\n  quiet: true\nenvironment:\n  type: daytona\n  delete: true\nagents:\n  - name: {agent}\n"
            );
            std::fs::write(&path, yaml).unwrap();
            path.display().to_string()
        };
        let oracle = config("oracle");
        let ledger = open_ledger(ledger_spec).unwrap();
        let model = ["--once", "--preset", "tb2", "--model", "test/Tiny-1B"];
        let first = cluster.run(&["launch"], ledger_spec, &model, &[]);
        assert!(text(&first).contains("1 submitted"), "{}", text(&first));
        let second = cluster.run(&["launch"], ledger_spec, &[&model[..], &["--harbor-config", &oracle]].concat(), &[]);
        assert!(text(&second).contains("1 submitted"), "another harness is another eval: {}", text(&second));
        wait_until("both jobs to finish and sync", Duration::from_secs(180), || {
            cluster.run(&["sync"], ledger_spec, &[], &[]);
            ledger.active().unwrap().is_empty()
        });
        let rows = ledger.attempts_for("test/Tiny-1B", "terminal_bench_2").unwrap();
        let agents: Vec<&str> = rows.iter().map(|a| a.agent.as_str()).collect();
        assert_eq!(agents, ["terminus-2", "oracle"], "{rows:#?}");
        assert_ne!(rows[0].run_tag, rows[1].run_tag);
        assert!(rows.iter().all(|a| a.status == AttemptStatus::Finished), "{rows:#?}");
        let dir = PathBuf::from(rows[1].config["run_dir"].as_str().unwrap());
        let job: Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(job["agents"][0]["name"], "oracle", "what Harbor ran: {job}");
        // Each eval is deduplicated on its own.
        let again = cluster.run(
            &["plan"],
            ledger_spec,
            &["--preset", "tb2", "--model", "test/Tiny-1B", "--harbor-config", &oracle, "--json"],
            &[],
        );
        let doc: Value = serde_json::from_slice(&again.stdout).unwrap();
        assert_eq!(
            (doc["jobs"][0]["decision"].as_str(), doc["jobs"][0]["reason"].as_str()),
            (Some("skip"), Some("finished")),
            "{doc}"
        );
        let results = cluster.run(&["results"], ledger_spec, &["--json"], &[]);
        let doc: Value = serde_json::from_slice(&results.stdout).unwrap();
        let columns: Vec<&str> =
            doc["cells"].as_array().unwrap().iter().map(|c| c["benchmark"].as_str().unwrap()).collect();
        assert_eq!(columns, ["terminal_bench_2", "terminal_bench_2@oracle"], "{doc:#}");
        assert_eq!(doc["cells"][1]["mean"], 1.0, "oracle solves every task: {doc:#}");

        // An installed harness named by its Harbor config needs the Pinggy tunnel this cluster lacks.
        let openhands = config("openhands");
        let plan = cluster.run(
            &["plan"],
            ledger_spec,
            &["--preset", "tb2", "--model", "test/Tiny-1B", "--harbor-config", &openhands, "--json"],
            &[],
        );
        let doc: Value = serde_json::from_slice(&plan.stdout).unwrap();
        let job = &doc["jobs"][0];
        assert_eq!(job["decision"], "submit", "a third eval: {doc}");
        assert!(
            job["blocked"].to_string().contains("openhands") && job["blocked"].to_string().contains("Pinggy"),
            "{job:#}"
        );
    });
}

/// A pending attempt older than the stale-pending limit whose job is still queued is cancelled
/// and resubmitted.
#[test]
fn stale_pending_is_cancelled_and_resubmitted() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let cluster = TestCluster::new("stale", |p| {
        // Jobs held in the queue for an hour; "stale" after 2 seconds.
        *p = p.replace("  export_env:", "  extra_args: [\"--begin=now+3600\"]\n  export_env:");
        *p = p.replace("  max_attempts: 3", "  max_attempts: 3\n  stale_pending_hours: 0.0005");
    });
    let model = ["--once", "--preset", "tb2", "--model", "test/Tiny-1B"];
    assert!(text(&cluster.run(&["launch"], &store.spec, &model, &[])).contains("1 submitted"));
    let ledger = open_ledger(&store.spec).unwrap();
    let first = ledger.active().unwrap()[0].clone();
    std::thread::sleep(Duration::from_secs(3));
    let out = cluster.run(&["launch"], &store.spec, &model, &[]);
    assert!(text(&out).contains("stale pending") && text(&out).contains("1 submitted"), "{}", text(&out));
    assert_eq!(ledger.attempt(first.id).unwrap().unwrap().status, AttemptStatus::Cancelled);
    let state = Command::new("squeue")
        .args(["-h", "--states=all", "-j", first.slurm_job_id.as_deref().unwrap(), "-o", "%T"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&state.stdout).contains("CANCELLED"), "{:?}", state);
    cancel_all(&*ledger);
}

/// Inside the job: no secret and none of the submitter's unrelated variables.
#[test]
fn job_environment_has_no_secrets_or_unrelated_variables() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let dump = tempfile::tempdir().unwrap();
    let script = dump.path().join("dump-env.sbatch");
    std::fs::write(&script, format!("#!/bin/bash\nenv > {}/env.txt\n", dump.path().display())).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cluster = TestCluster::new("envcheck", |p| {
        *p = p.replace("  time: \"00:10:00\"", &format!("  time: \"00:10:00\"\n  script: {}", script.display()));
    });
    let out = cluster.run(
        &["launch"],
        &store.spec,
        &["--once", "--preset", "tb2", "--model", "test/Tiny-1B"],
        &[("DAYTONA_API_KEY", "leaky-daytona-value"), ("SUBMITTER_UNRELATED_SETTING", "should-not-travel")],
    );
    assert!(text(&out).contains("1 submitted"), "{}", text(&out));
    let env_file = dump.path().join("env.txt");
    wait_until("the job to dump its environment", Duration::from_secs(60), || {
        env_file.exists() && std::fs::metadata(&env_file).is_ok_and(|m| m.len() > 0)
    });
    std::thread::sleep(Duration::from_millis(300));
    let env = std::fs::read_to_string(&env_file).unwrap();
    assert!(env.contains("PAYLOAD_BIN="), "{env}");
    assert!(!env.contains("leaky-daytona-value") && !env.contains("DAYTONA"), "secret in the job environment:\n{env}");
    assert!(!env.contains("SUBMITTER_UNRELATED_SETTING"), "unrelated variable travelled:\n{env}");
    cancel_all(&*open_ledger(&store.spec).unwrap());
}

/// The self-re-queuing listener runs two iterations on the local Slurm, never has two copies
/// queued, and stops on command.
#[test]
fn listener_requeues_itself_and_stops() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let cluster = TestCluster::new("lsn", |_| {});
    let models = cluster.models_file(&["test/Tiny-1B"]);
    let out = cluster.run(
        &["listener", "start"],
        &store.spec,
        &["--interval", "3s", "--", "--preset", "tb2", "--models-file", models.to_str().unwrap()],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let again = cluster.run(
        &["listener", "start"],
        &store.spec,
        &["--interval", "3s", "--", "--preset", "tb2", "--models-file", models.to_str().unwrap()],
        &[],
    );
    assert_eq!(again.status.code(), Some(2), "a second listener is refused: {}", text(&again));
    assert!(text(&again).contains("already queued or running"), "{}", text(&again));
    let name = format!("eval-listener-{}", cluster.name);
    let state = cluster.root().join("state/listener.json");
    let mut max_pending = 0;
    wait_until("two listener iterations", Duration::from_secs(120), || {
        let queued = Command::new("squeue").args(["-h", "-n", &name, "-t", "PENDING", "-o", "%i"]).output().unwrap();
        max_pending = max_pending.max(String::from_utf8_lossy(&queued.stdout).lines().count());
        std::fs::read_to_string(&state)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|s| s["iterations"].as_u64() >= Some(2))
    });
    assert!(max_pending <= 1, "never two queued copies (saw {max_pending})");
    // The iterations really launched: the model's tb2 attempt exists.
    let ledger = open_ledger(&store.spec).unwrap();
    let outputs: String = std::fs::read_dir(cluster.root().join("state"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("listener-")))
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    assert_eq!(
        ledger.attempts_for("test/Tiny-1B", "terminal_bench_2").unwrap().len(),
        1,
        "submitted once across iterations:\n{outputs}"
    );
    let out = cluster.run(&["listener", "stop"], &store.spec, &[], &[]);
    assert!(out.status.success(), "{}", text(&out));
    std::thread::sleep(Duration::from_secs(1));
    let left = Command::new("squeue").args(["-h", "-n", &name, "-o", "%i"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&left.stdout).trim().is_empty(),
        "listener jobs left: {}",
        String::from_utf8_lossy(&left.stdout)
    );
    cancel_all(&*ledger);
}

/// Pre-download on the login node: a failing command does not submit that job; chaining puts
/// `afterany:` on the next job; one submitter per state dir (advisory lock).
#[test]
fn pre_download_gate_chaining_and_state_dir_lock() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    // The pre-download command fails for one model only (its id is in the argv).
    let cluster = TestCluster::new("predl", |p| {
        *p = p.replace("  STANDIN_LOAD_SECONDS: \"0.3\"", "  STANDIN_LOAD_SECONDS: \"300\"");
        *p = p.replace(
            "  state_dir:",
            &format!(
                "  hf_cache: {}/hf_cache\n  state_dir:",
                p.split("jobs_dir: ").nth(1).unwrap().split("/jobs").next().unwrap()
            ),
        );
        // The command stages nothing: with internet the job fetches what is not cached.
        p.push_str("network:\n  internet: true\n");
        p.push_str("pre_download:\n  enabled: true\n  command: [sh, -c, 'test \"$0\" != test/Small-3B', \"{model}\"]\n  timeout_s: 20\n");
    });
    let models = cluster.models_file(&MODELS);
    let out = cluster.run(
        &["launch"],
        &store.spec,
        &["--once", "--preset", "tb2", "--chain-batch", "1", "--models-file", models.to_str().unwrap()],
        &[],
    );
    let printed = text(&out);
    assert_eq!(out.status.code(), Some(6), "one submission failed: {printed}");
    assert!(printed.contains("not submitted: staging failed"), "{printed}");
    assert!(printed.contains("2 submitted"), "{printed}");
    let ledger = open_ledger(&store.spec).unwrap();
    assert!(
        ledger.attempts_for("test/Small-3B", "terminal_bench_2").unwrap().is_empty(),
        "no row for the failed pre-download"
    );
    let mut jobs: Vec<String> = ledger.active().unwrap().into_iter().filter_map(|a| a.slurm_job_id).collect();
    jobs.sort_by_key(|j| j.parse::<u64>().unwrap());
    let show = Command::new("scontrol").args(["-o", "show", "job", &jobs[1]]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&show.stdout).contains(&format!("Dependency=afterany:{}", jobs[0])),
        "{}",
        String::from_utf8_lossy(&show.stdout)
    );

    // A second submitter on the same state dir is refused while the first holds the lock.
    let lock = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cluster.root().join("state/submitter.lock"))
        .unwrap();
    lock.lock().unwrap();
    let out = cluster.launch(&store.spec, &["--preset", "tb2"]);
    assert_eq!(out.status.code(), Some(5), "lock held: {}", text(&out));
    assert!(text(&out).contains("another submitter holds"), "{}", text(&out));
    drop(lock);
    cancel_all(&*ledger);
}

/// `<dir>/bin` with `sbatch` and `squeue` wrapping the real ones so that `squeue` lists only the
/// jobs submitted through this `sbatch`: the Slurm view of a second cluster, which cannot see the
/// first one's jobs. (`scontrol`/`scancel` are the real ones; the first cluster uses the real Slurm
/// unwrapped.)
fn own_slurm_view(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let view = dir.join("own-jobs");
    std::fs::write(&view, "").unwrap();
    let real = |name: &str| {
        let out = Command::new("sh").args(["-c", &format!("command -v {name}")]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let (sbatch, squeue, view) = (real("sbatch"), real("squeue"), view.display().to_string());
    let scripts = [
        (
            "sbatch",
            format!(
                "#!/bin/sh\nout=$(\"{sbatch}\" \"$@\"); rc=$?\nprintf '%s\\n' \"$out\"\n\
                 [ $rc -eq 0 ] && printf '%s\\n' \"${{out%%;*}}\" >> \"{view}\"\nexit $rc\n"
            ),
        ),
        (
            "squeue",
            format!(
                "#!/bin/sh\nout=$(\"{squeue}\" \"$@\"); rc=$?\n\
                 printf '%s\\n' \"$out\" | awk -F'|' 'NR==FNR {{ own[$1] = 1; next }} ($1 in own)' \"{view}\" -\nexit $rc\n"
            ),
        ),
    ];
    for (name, script) in scripts {
        let path = bin.join(name);
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    bin
}

/// Two submitters on two clusters (two profiles with their own state, jobs and dataset dirs) share
/// one ledger and run at the same moment: every pair is submitted exactly once across both. vista
/// sees its own Slurm view (`own_slurm_view`: none of jupiter's jobs), jupiter the real Slurm. Each
/// then sees the other's attempts as "in progress on <cluster>, job N" and leaves them alone — no
/// "vanished" for a job its own Slurm view does not hold. When one cluster's submitter records a
/// heartbeat bound it then outlives, the other flags its attempts and still does not resubmit them.
#[test]
fn two_clusters_one_ledger_each_pair_once() {
    if !slurm_up() {
        return;
    }
    let sqlite = Store::sqlite();
    two_clusters(&sqlite.spec, "sq");
    cancel_all(&*open_ledger(&sqlite.spec).unwrap());
    if let Some(pg) = Store::postgres("twoclusters") {
        two_clusters(&pg.spec, "pg");
        cancel_all(&*open_ledger(&pg.spec).unwrap());
    }
}

fn two_clusters(ledger_spec: &str, tag: &str) {
    let slow = |profile: &mut String| {
        *profile = profile.replace("STANDIN_LOAD_SECONDS: \"0.3\"", "STANDIN_LOAD_SECONDS: \"300\"")
    };
    let jupiter = TestCluster::new(&format!("jupiter-{tag}"), slow);
    let vista = TestCluster::new(&format!("vista-{tag}"), slow);
    // Each list has a model of its own, so each cluster surely holds attempts.
    let (only_vista, only_jupiter) = ("test/OnlyVista-2B", "test/OnlyJupiter-2B");
    let mut vista_models = MODELS.to_vec();
    vista_models.push(only_vista);
    let mut jupiter_models = MODELS.to_vec();
    jupiter_models.push(only_jupiter);
    let jupiter_list = jupiter.models_file(&jupiter_models);
    let vista_list = vista.models_file(&vista_models);
    let vista_path = format!("{}:{}", own_slurm_view(vista.root()).display(), std::env::var("PATH").unwrap());
    let path_of = |cluster: &TestCluster| {
        if cluster.name == vista.name { vista_path.clone() } else { std::env::var("PATH").unwrap() }
    };
    let spawn = |cluster: &TestCluster, list: &Path, extra: &[&str]| {
        Command::new(SUBMITTER)
            .env("PATH", path_of(cluster))
            .args(["launch", "--once", "--preset", "tb2", "--preset", "v2", "--cluster", &cluster.name, "--clusters"])
            .arg(cluster.root().join("clusters"))
            .env("SUBMITTER_LEDGER", ledger_spec)
            .arg("--models-file")
            .arg(list)
            .args(extra)
            .env("SUBMITTER_HOME", workspace_root())
            .env("PAYLOAD_GPU_FIXTURE", workspace_root().join("tests/fixtures/gpus-4x-a100-64gb.json"))
            .output_async()
    };
    let both = |extra_vista: &[&str]| {
        let (a, b) = (spawn(&jupiter, &jupiter_list, &[]), spawn(&vista, &vista_list, extra_vista));
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        assert!(a.status.success() && b.status.success(), "{}\n{}", text(&a), text(&b));
        (text(&a), text(&b))
    };
    let (a, b) = both(&[]);
    let ledger = open_ledger(ledger_spec).unwrap();
    let per_pair = counts(&*ledger);
    assert_eq!(per_pair.len(), 10, "5 models × 2 benchmarks: {per_pair:?}\n{a}\n{b}");
    assert!(per_pair.values().all(|&n| n == 1), "each pair exactly once across both: {per_pair:?}\n{a}\n{b}");
    let active = ledger.active().unwrap();
    assert_eq!(active.len(), 10, "{a}\n{b}");
    assert!(active.iter().all(|x| x.slurm_job_id.is_some()));
    let on = |cluster: &str| active.iter().filter(|x| x.cluster == cluster).count();
    assert_eq!(on(&jupiter.name) + on(&vista.name), 10);
    assert!(on(&vista.name) >= 2 && on(&jupiter.name) >= 2, "each holds at least its own model's pairs");
    // vista's Slurm view really lacks jupiter's jobs (the real squeue lists them).
    {
        let theirs = active.iter().find(|x| x.cluster == jupiter.name).unwrap();
        let job = theirs.slurm_job_id.as_deref().unwrap();
        let listed = |path: &str| {
            let out = Command::new("squeue")
                .args(["-h", &format!("--jobs={job}"), "--format=%A|%T"])
                .env("PATH", path)
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        assert!(listed(&std::env::var("PATH").unwrap()).starts_with(&format!("{job}|")));
        assert_eq!(listed(&vista_path), "", "vista's view must not see jupiter's job {job}");
    }

    // Second round, concurrently again: nothing new, nothing marked vanished, the other
    // cluster's attempts named with their cluster and job.
    let (a, b) = both(&[]);
    assert!(a.contains("0 submitted") && b.contains("0 submitted"), "{a}\n{b}");
    let vista_job = active.iter().find(|x| x.cluster == vista.name && x.model == only_vista).unwrap();
    let shown = format!("in progress on {}, job {}", vista.name, vista_job.slurm_job_id.as_deref().unwrap());
    assert!(!a.contains(&shown), "jupiter's list does not hold {only_vista}: {a}");
    let jupiter_job = active.iter().find(|x| x.cluster == jupiter.name && x.model == only_jupiter).unwrap();
    assert!(
        !b.contains(&format!("job {}\n", jupiter_job.slurm_job_id.as_deref().unwrap())),
        "not on vista's list: {b}"
    );
    if active.iter().any(|x| x.cluster == jupiter.name && x.model != only_jupiter) {
        assert!(b.contains(&format!("in progress on {}, job ", jupiter.name)), "{b}");
    }
    assert!(counts(&*ledger).values().all(|&n| n == 1), "{:?}", counts(&*ledger));
    assert_eq!(ledger.active().unwrap().len(), 10, "no attempt closed by the other cluster:\n{a}\n{b}");

    // vista's submitter records a 0 s bound and then stays quiet: jupiter (now listing vista's
    // model too) flags vista's attempts and still submits nothing.
    let (_, b) = both(&["--stale-after", "0s"]);
    assert!(b.contains("0 submitted"), "{b}");
    std::thread::sleep(Duration::from_millis(1500)); // heartbeat ages are whole seconds
    let out =
        jupiter.run(&["plan"], ledger_spec, &["--preset", "tb2", "--models-file", vista_list.to_str().unwrap()], &[]);
    let plan = text(&out);
    assert!(out.status.success(), "{plan}");
    assert!(plan.contains(&shown), "{plan}");
    assert!(plan.contains("flagged") && plan.contains("unattended"), "{plan}");
    let out = jupiter.run(
        &["launch"],
        ledger_spec,
        &["--once", "--preset", "tb2", "--preset", "v2", "--models-file", vista_list.to_str().unwrap()],
        &[],
    );
    let launch = text(&out);
    assert!(out.status.success() && launch.contains("0 submitted"), "{launch}");
    assert!(launch.contains("unattended"), "{launch}");
    assert_eq!(ledger.active().unwrap().len(), 10, "flagged, never resubmitted: {launch}");
    assert!(counts(&*ledger).values().all(|&n| n == 1));
}

/// `Command::output` without waiting: spawn with piped output, collect later.
trait OutputAsync {
    fn output_async(&mut self) -> std::process::Child;
}

impl OutputAsync for Command {
    fn output_async(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap()
    }
}
