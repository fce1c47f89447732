//! The launch path end to end (issue 10 items 4–6): a listener that lasts (a real `squeue` that
//! times out, through a wrapper on PATH), one bad pair refused while the others go on, `plan` and
//! `launch` agreeing on the exact sbatch argv, configuration keys that do something or are refused,
//! the listener job's own placement, and walltime continuation on the real local Slurm; an sbatch
//! whose answer is lost never makes a second job (issue 21).

#![allow(clippy::print_stderr)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use submitter::ledger::{AttemptStatus, open_ledger};

use crate::ledger::Store;
use crate::queueing::{TestCluster, cancel_all, text, wait_until};
use crate::support::{slurm_up, stderr, stdout, submitter, workspace_root};

/// A registry with the shipped entries plus `test/Broken-1B`, which names an environment no
/// cluster has.
fn registry_with_a_broken_model(root: &Path) -> std::path::PathBuf {
    let dir = root.join("model_config");
    let copy = Command::new("cp").arg("-r").arg(workspace_root().join("model_config")).arg(&dir).status().unwrap();
    assert!(copy.success());
    std::fs::create_dir_all(dir.join("test")).unwrap();
    std::fs::write(
        dir.join("test/Broken-1B.yaml"),
        "model: test/Broken-1B\nsubsystems:\n  eval:\n    conda_env: no-such-env\n",
    )
    .unwrap();
    dir
}

/// A test cluster whose engine takes `load_s` to start (jobs stay running while the test looks).
fn slow_cluster(name: &str, load_s: u32, tweak: impl Fn(&mut String)) -> TestCluster {
    TestCluster::new(name, |p| {
        *p = p.replace("  STANDIN_LOAD_SECONDS: \"0.3\"", &format!("  STANDIN_LOAD_SECONDS: \"{load_s}\""));
        tweak(p);
    })
}

/// `<cluster>/wrap/<name>`, an executable shell script: put the dir first on PATH to stand in front
/// of the real Slurm command it `exec`s.
pub(crate) fn wrapper(cluster: &TestCluster, name: &str, body: &str) -> String {
    let bin = cluster.root().join("wrap");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join(name), format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(bin.join(name), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    format!("{}:{}", bin.display(), std::env::var("PATH").unwrap())
}

fn plan_json(cluster: &TestCluster, ledger: &str, args: &[&str]) -> Vec<Value> {
    let out = cluster.run(&["plan"], ledger, &[args, &["--json"]].concat(), &[]);
    assert!(out.status.success(), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["kind"], "plan", "{doc}");
    serde_json::from_value(doc["jobs"].clone()).unwrap()
}

#[test]
fn retired_preset_keys_are_refused_with_their_replacement_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let presets = dir.path().join("presets");
    std::fs::create_dir_all(presets.join("harbor")).unwrap();
    std::fs::copy(
        workspace_root().join("presets/harbor/dcagent_eval_config_no_override.yaml"),
        presets.join("harbor/dcagent_eval_config_no_override.yaml"),
    )
    .unwrap();
    for (key, line, replacement) in [
        ("tp_size", "tp_size: 2", "tensor_parallel_size"),
        ("error_threshold", "error_threshold: 10", "verify.max_error_share"),
        ("check_hf_exists", "check_hf_exists: true", "pre_download"),
        ("sbatch_script", "sbatch_script: eval.sbatch", "slurm.script"),
        ("vllm_max_retries", "vllm_max_retries: 10", "engine.health_timeout_s"),
    ] {
        std::fs::write(presets.join("old.yaml"), format!("datasets:\n  - DCAgent2/terminal_bench_2\n{line}\n"))
            .unwrap();
        let p = presets.to_str().unwrap();
        let check = submitter(&["registry", "check", "--presets", p]);
        assert_eq!(check.status.code(), Some(1), "{key}: registry check must fail: {}", stdout(&check));
        let report = stdout(&check);
        assert!(report.contains(&format!("preset key `{key}` is retired")) && report.contains(replacement), "{report}");
        let spec =
            submitter(&["spec", "--cluster", "local", "--preset", "old", "--model", "Qwen/Qwen3-8B", "--presets", p]);
        let err = stderr(&spec);
        assert_eq!(spec.status.code(), Some(2), "{key}: {err}");
        assert!(err.contains("old.yaml:3:") && err.contains(replacement) && err.lines().count() == 1, "{err}");
    }
}

#[test]
fn preset_with_datasets_is_refused_and_spec_takes_the_launch_options() {
    let both = submitter(&[
        "plan",
        "--cluster",
        "local",
        "--preset",
        "tb2",
        "--datasets",
        "DCAgent2/terminal_bench_2",
        "--model",
        "Qwen/Qwen3-8B",
        "--state-dir",
        "/nonexistent/never-created-h-listener",
    ]);
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
    // Refused before anything is created; a read-only `plan` names the missing state dir first.
    let said = stderr(&both);
    assert!(said.contains("--preset and --datasets together") || said.contains("no such directory"), "{said}");
    assert!(!std::path::Path::new("/nonexistent/never-created-h-listener").exists());
    let tb2_spec = |extra: &[&str]| {
        let out = submitter(
            &[&["spec", "--cluster", "local", "--preset", "tb2", "--model", "Qwen/Qwen3-8B"], extra].concat(),
        );
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let concurrency = ["--n-concurrent", "3", "--n-concurrent", "tb2=2"];
    let job_dir = tempfile::tempdir().unwrap();
    let job = job_dir.path().join("job.yaml");
    std::fs::write(&job, "timeout_multiplier: 4.0\n").unwrap();
    let job = job.to_str().unwrap();
    let options = ["--harbor-config", job, "--agent-parser", "json", "--max-output-tokens", "4096"];
    let spec = tb2_spec(&[&options[..], &concurrency].concat());
    let harbor = &spec["harbor"];
    assert_eq!(harbor["config"], job);
    assert_eq!(harbor["timeout_multiplier"], 4.0, "an explicit config's own multiplier");
    assert_eq!(harbor["agent_parser"], "json");
    assert_eq!(harbor["max_output_tokens"], 4096);
    assert_eq!(harbor["n_concurrent"], 2, "the leg's own value wins over the global one");
    // The profile's ceiling holds (local: 4), and without an override the preset's value (tb2: 64)
    // is clamped to it; `--config-yaml` replaces the preset's base config, and the multiplier
    // still comes from the size (an 8B: 2.0).
    let spec = tb2_spec(&["--config-yaml", "x.yaml"]);
    assert_eq!(spec["harbor"]["n_concurrent"], 4);
    assert!(spec["harbor"]["config"].as_str().unwrap().ends_with("presets/harbor/x.yaml"));
    assert_eq!(spec["harbor"]["timeout_multiplier"], 2.0);
    let id = submitter(&["spec", "--cluster", "local", "--preset", "ID", "--model", "Qwen/Qwen3-8B"]);
    assert!(stderr(&id).contains("`spec` writes one spec"), "{}", stderr(&id));
}

/// `test/Broken-1B` names an unknown environment: `plan` refuses that pair and plans the others,
/// `launch --dry-run` shows the same argv as `plan --json` and submits nothing, and `launch --once`
/// submits exactly those argv (recorded by an sbatch wrapper that then runs the real sbatch).
#[test]
fn one_bad_pair_is_refused_the_others_go_on_and_plan_equals_launch() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let cluster = slow_cluster("badpair", 300, |_| {});
    let registry = registry_with_a_broken_model(cluster.root());
    let models = cluster.models_file(&["test/Broken-1B", "test/Tiny-1B"]);
    let sel = ["--preset", "tb2", "--models-file", models.to_str().unwrap(), "--registry", registry.to_str().unwrap()];
    let sel_overrides = [&sel[..], &["--time", "00:07:00", "--n-concurrent", "1"]].concat();
    let planned = plan_json(&cluster, &store.spec, &sel_overrides);
    assert_eq!(planned.len(), 2, "{planned:?}");
    let broken = &planned[0];
    assert_eq!(broken["blocked"]["kind"], "refused", "{broken}");
    assert!(broken["blocked"]["why"].as_str().unwrap().contains("no-such-env"), "{broken}");
    let tiny = &planned[1];
    assert_eq!(tiny["decision"], "submit", "{tiny}");
    let argv: Vec<String> = serde_json::from_value(tiny["sbatch"].clone()).unwrap();
    assert!(argv.contains(&"--time=0-00:07:00".to_string()), "--time reaches sbatch: {argv:?}");
    // A wrapper that records sbatch's argv, then runs the real one.
    let log = cluster.root().join("sbatch.argv");
    let path = wrapper(
        &cluster,
        "sbatch",
        &format!("printf '%s\\n' sbatch \"$@\" > {}\nexec /usr/bin/sbatch \"$@\"\n", log.display()),
    );
    let dry = cluster.run(
        &["launch"],
        &store.spec,
        &[&sel_overrides[..], &["--once", "--dry-run"]].concat(),
        &[("PATH", &path)],
    );
    let shown = text(&dry);
    assert_eq!(dry.status.code(), Some(6), "a refused pair is a partial failure (docs/exit-codes.md): {shown}");
    assert!(shown.contains("refused: ") && shown.contains("dry run: would submit"), "{shown}");
    assert!(shown.contains(&shell_words::join(&argv)), "dry run shows plan's argv:\n{shown}");
    assert!(!log.exists(), "a dry run never runs sbatch");
    let ledger = open_ledger(&store.spec).unwrap();
    assert!(ledger.latest_per_pair().unwrap().is_empty(), "a dry run writes no ledger row");
    let out = cluster.run(&["launch"], &store.spec, &[&sel_overrides[..], &["--once"]].concat(), &[("PATH", &path)]);
    let printed = text(&out);
    assert_eq!(out.status.code(), Some(6), "{printed}");
    assert!(printed.contains("1 submitted"), "the good pair went on: {printed}");
    assert!(printed.contains("test/Broken-1B") && printed.contains("refused: "), "{printed}");
    let mut ran: Vec<String> = std::fs::read_to_string(&log).unwrap().lines().map(str::to_string).collect();
    // The attempt's submission tag exists only once its row does: the one argument plan cannot show.
    let tag = ran.iter().position(|a| a.starts_with("--comment=evalsub-")).expect("the job carries its tag");
    ran.remove(tag);
    assert_eq!(ran, argv, "launch ran exactly the argv plan showed, and its tag");
    assert!(ledger.attempts_for("test/Broken-1B", "terminal_bench_2").unwrap().is_empty());
    cancel_all(&*ledger);
}

/// `launch --watch` against a `squeue` that times out twice (the real message, through a wrapper in
/// front of the real squeue): each failed iteration is reported and retried, the listener never
/// exits, and once Slurm answers it submits the next model.
#[test]
fn watch_outlasts_squeue_timeouts() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let cluster = slow_cluster("lasts", 300, |_| {});
    // One active attempt, so every iteration asks squeue about it.
    let first = cluster.models_file(&["test/Tiny-1B"]);
    let out = cluster.run(
        &["launch"],
        &store.spec,
        &["--once", "--preset", "tb2", "--models-file", first.to_str().unwrap()],
        &[],
    );
    assert!(out.status.success() && text(&out).contains("1 submitted"), "{}", text(&out));
    let count = cluster.root().join("squeue.count");
    let path = wrapper(
        &cluster,
        "squeue",
        &format!(
            "n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}\n\
             if [ $n -le 2 ]; then echo 'squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation' >&2; exit 1; fi\n\
             exec /usr/bin/squeue \"$@\"\n",
            c = count.display()
        ),
    );
    let both = cluster.models_file(&["test/Tiny-1B", "test/Small-3B"]);
    let out_file = cluster.root().join("watch.out");
    let err_file = cluster.root().join("watch.err");
    let models = both.to_str().unwrap();
    let mut child = cluster
        .command(
            &["launch"],
            &store.spec,
            &["--watch", "--interval", "1s", "--preset", "tb2", "--models-file", models],
            &[("PATH", &path)],
        )
        .stdout(std::fs::File::create(&out_file).unwrap())
        .stderr(std::fs::File::create(&err_file).unwrap())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let ledger = open_ledger(&store.spec).unwrap();
    let submitted = || !ledger.attempts_for("test/Small-3B", "terminal_bench_2").unwrap_or_default().is_empty();
    wait_until("the watch to submit after two squeue timeouts", Duration::from_secs(90), || {
        submitted() || child.try_wait().unwrap().is_some()
    });
    let still_running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    let errors = std::fs::read_to_string(&err_file).unwrap();
    assert!(still_running, "the listener exited: {errors}");
    assert!(submitted(), "{errors}");
    assert!(errors.contains("iteration failed (1 in a row); retrying in 1 s"), "{errors}");
    assert!(errors.contains("iteration failed (2 in a row)") && errors.contains("Socket timed out"), "{errors}");
    assert_eq!(ledger.attempts_for("test/Tiny-1B", "terminal_bench_2").unwrap().len(), 1, "no duplicate on doubt");
    cancel_all(&*ledger);
}

/// The test profile's `listener:` section (`queueing::TestCluster`).
const LISTENER: &str = "listener: {partition: debug, time: \"00:05:00\", internet: true}\n";

/// The listener job's placement comes from the profile's `listener:` section, with the variables
/// the profile's paths use; without the section, or staging without internet, or a path variable
/// unset, `listener start` refuses with the reason and submits nothing.
#[test]
fn listener_job_has_its_own_placement_and_environment_or_is_refused() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let no_section = TestCluster::new("lsnnone", |p| {
        *p = p.replace(LISTENER, "");
    });
    let args = ["--interval", "1h", "--", "--preset", "tb2", "--model", "test/Tiny-1B"];
    let out = no_section.run(&["listener", "start"], &store.spec, &args, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no `listener:` section") && text(&out).contains("GPU node"), "{}", text(&out));
    let offline = TestCluster::new("lsnoff", |p| {
        *p = p.replace(LISTENER, "listener: {partition: debug, internet: false}\n");
    });
    let out = offline.run(&["listener", "start"], &store.spec, &args, &[]);
    assert!(text(&out).contains("has no internet") && text(&out).contains("missing datasets"), "{}", text(&out));
    let site = TestCluster::new("lsnvar", |p| {
        *p = p
            .replace("  logs_dir: ", "  logs_dir: ${LSN_SITE_SCRATCH}/")
            .replace(LISTENER, "listener: {partition: debug, time: \"00:04:00\", mem_mb: 300, internet: true}\n");
    });
    let out = site.run(&["listener", "start"], &store.spec, &args, &[]);
    assert!(text(&out).contains("uses ${LSN_SITE_SCRATCH}, which is not set here"), "{}", text(&out));
    let scratch = site.root().join("scratch");
    let out = site.run(&["listener", "start"], &store.spec, &args, &[("LSN_SITE_SCRATCH", scratch.to_str().unwrap())]);
    assert!(out.status.success(), "{}", text(&out));
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(site.root().join("state/listener.json")).unwrap()).unwrap();
    let stop = site.run(&["listener", "stop"], &store.spec, &[], &[]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert_eq!(
        (state["partition"].as_str(), state["time"].as_str(), state["mem_mb"].as_u64()),
        (Some("debug"), Some("00:04:00"), Some(300))
    );
    let export = state["export"].as_array().unwrap();
    assert!(
        export.iter().any(|kv| kv[0] == "LSN_SITE_SCRATCH" && kv[1] == scratch.to_str().unwrap()),
        "the tick gets the profile's path variable: {export:?}"
    );
}

/// An attempt whose job ends by its walltime (`--time 00:01:00` with a long engine start: Slurm's
/// USR1 warning reaches payload, which records `walltime`) is synced as resumable, does not count
/// as a failure, and the next launch continues it with the same run tag; `status` shows the chain.
#[test]
fn walltime_end_is_continued_not_failed() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let cluster = slow_cluster("wall", 600, |p| {
        *p = p.replace("  max_attempts: 3\n", "  max_attempts: 1\n  max_continuations: 1\n");
    });
    let models = cluster.models_file(&["test/Tiny-1B"]);
    let sel = ["--preset", "tb2", "--models-file", models.to_str().unwrap()];
    let out = cluster.run(&["launch"], &store.spec, &[&sel[..], &["--once", "--time", "00:01:00"]].concat(), &[]);
    assert!(out.status.success() && text(&out).contains("1 submitted"), "{}", text(&out));
    let ledger = open_ledger(&store.spec).unwrap();
    let first = ledger.active().unwrap().pop().unwrap();
    let job = first.slurm_job_id.clone().unwrap();
    wait_until("the job to end by its walltime", Duration::from_secs(240), || {
        let q = Command::new("squeue").args(["-h", "-j", &job, "-o", "%T"]).output().unwrap();
        let state = String::from_utf8_lossy(&q.stdout).trim().to_string();
        !["PENDING", "RUNNING", "COMPLETING", "CONFIGURING"].contains(&state.as_str())
    });
    let out = cluster.run(&["sync"], &store.spec, &["--json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let after = ledger.attempt(first.id).unwrap().unwrap();
    assert_eq!(after.status, AttemptStatus::Failed, "{after:?}");
    let pair = ledger.latest_per_pair().unwrap().pop().unwrap();
    assert!(pair.latest_resumable, "ended by the walltime: {} ({})", after.reason, text(&out));
    assert_eq!(pair.failed_attempts, 0, "a walltime end is not a failure (max_attempts 1 would block)");
    let planned = plan_json(&cluster, &store.spec, &sel);
    assert_eq!(planned[0]["decision"], "continue", "{:?}", planned[0]);
    let out = cluster.run(&["launch"], &store.spec, &[&sel[..], &["--once"]].concat(), &[]);
    assert!(out.status.success() && text(&out).contains("1 submitted"), "{}", text(&out));
    let second = ledger.active().unwrap().pop().unwrap();
    assert_eq!(second.run_tag, first.run_tag, "same run dir: payload resumes the Harbor job");
    assert_eq!(second.config["continues"], first.id.0);
    assert_eq!(second.config["continuation"], 1);
    let status = cluster.run(&["status"], &store.spec, &[], &[]);
    assert!(text(&status).contains(&format!("continuation 1 of attempt {}", first.id)), "{}", text(&status));
    let json = cluster.run(&["status"], &store.spec, &["--json"], &[]);
    let doc: Value = serde_json::from_slice(&json.stdout).unwrap();
    let rows: Vec<Value> = serde_json::from_value(doc["jobs"].clone()).unwrap();
    let row = rows.iter().find(|r| r["attempt"] == second.id.0).expect("the continuation's row");
    assert_eq!(row["continues"]["attempt"], first.id.0, "{row}");
    cancel_all(&*ledger);
}

/// The ids of the jobs Slurm holds (queued or running) that were submitted from `dir`: every job of
/// one test cluster, whichever attempt, tag or name it has.
pub(crate) fn active_jobs_from(dir: &Path) -> Vec<String> {
    let out = Command::new("squeue").args(["-h", "--states=all", "-o", "%A|%T|%Z"]).output().unwrap();
    assert!(out.status.success(), "squeue: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, '|');
            let (id, state, work_dir) = (fields.next()?, fields.next()?, fields.next()?);
            let active = ["PENDING", "RUNNING", "CONFIGURING", "COMPLETING"].contains(&state);
            (active && Path::new(work_dir) == dir).then(|| id.to_string())
        })
        .collect()
}

/// Cancels every job submitted from a test cluster's dir, duplicates included (test hygiene).
pub(crate) struct CancelFrom<'a>(pub(crate) &'a Path);

impl Drop for CancelFrom<'_> {
    fn drop(&mut self) {
        for job in active_jobs_from(self.0) {
            crate::queueing::scancel(&job);
        }
    }
}

/// Issue 21 item 2: `sbatch` queues the job and its answer is lost — the real sbatch runs behind a
/// wrapper that then exits 1 with slurmctld's socket message, prints garbage instead of the id, or
/// sleeps past `slurm.command_timeout_s`. Each time the attempt finds its job by its tag
/// (`--comment`) and keeps it: after three launches exactly one job is queued for the pair, one
/// active attempt holds its id, none failed, and `status` counts it active.
#[test]
fn lost_sbatch_answers_never_duplicate_a_job() {
    if !slurm_up() {
        return;
    }
    let lost = [
        (
            "socket",
            "/usr/bin/sbatch \"$@\" >/dev/null\n\
             echo 'sbatch: error: Batch job submission failed: Socket timed out on send/recv operation' >&2\nexit 1\n",
        ),
        ("garbage", "/usr/bin/sbatch \"$@\" >/dev/null\necho '<html>502 Bad Gateway</html>'\n"),
        ("timeout", "/usr/bin/sbatch \"$@\" >/dev/null\nexec sleep 60\n"),
    ];
    for (how, body) in lost {
        let store = Store::sqlite();
        let cluster = slow_cluster(&format!("lost-{how}"), 300, |p| {
            if how == "timeout" {
                *p = p.replace("  time: \"00:10:00\"\n", "  time: \"00:10:00\"\n  command_timeout_s: 8\n");
            }
        });
        let _cleanup = CancelFrom(cluster.root());
        let path = wrapper(&cluster, "sbatch", body);
        let models = cluster.models_file(&["test/Tiny-1B"]);
        let sel = ["--once", "--preset", "tb2", "--models-file", models.to_str().unwrap()];
        let mut outputs = String::new();
        for _ in 0..3 {
            let out = cluster.run(&["launch"], &store.spec, &sel, &[("PATH", &path)]);
            outputs += &text(&out);
            assert!(out.status.success(), "{how}: {outputs}");
        }
        let jobs = active_jobs_from(cluster.root());
        assert_eq!(jobs.len(), 1, "{how}: one queued job for the pair, not {jobs:?}: {outputs}");
        let ledger = open_ledger(&store.spec).unwrap();
        let attempts = ledger.attempts_for("test/Tiny-1B", "terminal_bench_2").unwrap();
        assert_eq!(attempts.len(), 1, "{how}: one attempt: {attempts:?}");
        assert!(attempts[0].status.is_active(), "{how}: {:?}", attempts[0]);
        assert_eq!(attempts[0].slurm_job_id.as_deref(), Some(jobs[0].as_str()), "{how}: the attempt holds the job");
        assert!(outputs.contains("sbatch's answer was lost, job found by its tag"), "{how}: {outputs}");
        let pair = ledger.latest_per_pair().unwrap().pop().unwrap();
        assert_eq!(pair.failed_attempts, 0, "{how}: a lost answer is no failure");
        let status = cluster.run(&["status"], &store.spec, &[], &[]);
        assert!(text(&status).contains("1 active attempt(s)"), "{how}: {}", text(&status));
    }
}
