//! A re-evaluation through `submitter launch` with the **real Harbor 0.25.0** (issue 20): the local
//! Slurm runs payload with the vLLM stand-in (answering as terminus-2, `STANDIN_CHAT_AGENT=terminus`)
//! and the real Harbor, whose trials run on the host (`tests/harbor_env/host_env.py`, the test-only
//! environment `tests/tests/real_harbor.rs` uses). Skipped with a note without the local Slurm or the
//! real Harbor (`scripts/install-harbor.sh`); required in CI.

#![allow(clippy::print_stderr)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use submitter::ledger::{Attempt, AttemptStatus, open_ledger};

use crate::ledger::Store;
use crate::queueing::{TestCluster, cancel_all, text, wait_until};
use crate::support::{slurm_up, workspace_root};

const MODEL: &str = "test/Tiny-1B";
const BENCHMARK: &str = "terminal_bench_2";

/// The wrapper `scripts/install-harbor.sh` writes, when the real Harbor is installed.
fn real_harbor() -> Option<PathBuf> {
    let bin = PathBuf::from(
        std::env::var("EVALCI_HARBOR_BIN").unwrap_or_else(|_| "/var/cache/evalci/bin/harbor".to_string()),
    );
    let script = workspace_root().join("scripts/install-harbor.sh");
    if Command::new("bash").arg(script).arg("--check").status().is_ok_and(|s| s.success()) {
        return Some(bin);
    }
    assert!(std::env::var("CI").map_or(true, |v| v != "true"), "CI=true but the real Harbor is not installed");
    eprintln!("skipping: the real Harbor is not installed (run scripts/install-harbor.sh as root)");
    None
}

/// The trial dirs of a Harbor job dir (those with a `config.json`), by name, with their rewards.
fn trials(run_dir: &Path) -> Vec<(String, String, Option<f64>)> {
    let read = |p: PathBuf| std::fs::read(p).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    let mut out: Vec<_> = std::fs::read_dir(run_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("config.json").is_file())
        .map(|e| {
            let result = read(e.path().join("result.json"));
            let task = result.as_ref().and_then(|r| r["task_name"].as_str()).unwrap_or("?").to_string();
            let reward = result.as_ref().and_then(|r| r.pointer("/verifier_result/rewards/reward")?.as_f64());
            (e.file_name().to_string_lossy().to_string(), task, reward)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Done when (issue 20): a forced re-evaluation of a finished pair, end to end through `submitter
/// launch` on the local Slurm with the real Harbor, runs every trial again — a fresh run dir
/// (`<tag>-r<N>-<8hex>`), new trial dirs each scored by Harbor's verifier, the first run's files
/// untouched — and the ledger has two finished attempts, each with its own metrics and provenance.
#[test]
fn a_forced_re_evaluation_runs_the_real_harbor_again_in_a_run_dir_of_its_own() {
    if !slurm_up() {
        return;
    }
    let Some(harbor) = real_harbor() else { return };
    let repo = workspace_root();
    let cluster = TestCluster::new("rh-launch", |profile| {
        *profile = profile
            .replace(
                "    STANDIN_LOAD_SECONDS: \"0.3\"\n",
                "    STANDIN_LOAD_SECONDS: \"0.3\"\n    STANDIN_CHAT_AGENT: terminus\n",
            )
            .replace(
                "    STANDIN_EXTRAS: daytona\n",
                &format!("    STANDIN_EXTRAS: daytona\n    EVALCI_HARBOR_BINDS: {}\n", repo.display()),
            )
            .replace("  time: \"00:10:00\"\n", "  time: \"00:20:00\"\n");
    });
    let root = cluster.root();
    // The host environment module from the cluster's own dir (no bytecode written into the repo).
    std::fs::create_dir_all(root.join("py")).unwrap();
    std::fs::copy(repo.join("tests/harbor_env/host_env.py"), root.join("py/host_env.py")).unwrap();
    let profile = root.join("clusters/rh-launch.yaml");
    let edited = std::fs::read_to_string(&profile).unwrap().replace(
        "    STANDIN_EXTRAS: daytona\n",
        &format!("    STANDIN_EXTRAS: daytona\n    PYTHONPATH: {}\n", root.join("py").display()),
    );
    std::fs::write(&profile, edited).unwrap();
    // `bin/harbor` is the real Harbor; `jobs start` gets the host environment last (the last `--env`
    // wins in Harbor), as tests/tests/real_harbor.rs passes it.
    let wrapper = root.join("env/bin/harbor");
    std::fs::remove_file(&wrapper).unwrap();
    let script = format!(
        "#!/bin/sh\n# Test-only: the trials run on this host, not in a Daytona sandbox.\nif [ \"$1\" = jobs ] && [ \"$2\" = start ]; then exec {h} \"$@\" --env host_env:HostEnvironment; fi\nexec {h} \"$@\"\n",
        h = harbor.display()
    );
    std::fs::write(&wrapper, script).unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let dataset = root.join("datasets/DCAgent2_terminal_bench_2");
    std::fs::remove_dir_all(&dataset).unwrap();
    launch_spec::testkit::world::harbor_task(&dataset, "alpha", "word-alpha", "word-alpha", "");
    launch_spec::testkit::world::harbor_task(&dataset, "beta", "word-beta", "something-else", "");

    let store = Store::sqlite();
    let ledger = open_ledger(&store.spec).unwrap();
    let launch_and_finish = |extra: &[&str]| -> Attempt {
        let args = [&["--once", "--preset", "tb2", "--model", MODEL][..], extra].concat();
        let out = cluster.run(&["launch"], &store.spec, &args, &[]);
        assert!(out.status.success() && text(&out).contains("1 submitted"), "{extra:?}: {}", text(&out));
        wait_until("the real-Harbor job to finish and sync", Duration::from_secs(900), || {
            cluster.run(&["sync"], &store.spec, &[], &[]);
            ledger.active().unwrap().is_empty()
        });
        let latest = ledger.attempts_for(MODEL, BENCHMARK).unwrap().into_iter().max_by_key(|a| a.id.0).unwrap();
        assert_eq!(latest.status, AttemptStatus::Finished, "{extra:?}: {}", latest.reason);
        latest
    };
    let run_dir = |a: &Attempt| PathBuf::from(a.config["run_dir"].as_str().unwrap());

    let first = launch_and_finish(&[]);
    let first_dir = run_dir(&first);
    let first_trials = trials(&first_dir);
    let first_result = std::fs::read(first_dir.join("result.json")).unwrap();
    let scored = |t: &[(String, String, Option<f64>)]| {
        let mut by_task: Vec<(String, Option<f64>)> = t.iter().map(|(_, task, r)| (task.clone(), *r)).collect();
        by_task.sort_by(|a, b| a.0.cmp(&b.0));
        by_task.dedup();
        by_task
    };
    let want = [("alpha".to_string(), Some(1.0)), ("beta".to_string(), Some(0.0))];
    assert_eq!(scored(&first_trials), want, "Harbor's verifier scored every trial: {first_trials:?}");

    let forced = launch_and_finish(&["--force"]);
    let dir = run_dir(&forced);
    assert_ne!(dir, first_dir);
    let suffix =
        forced.run_tag.strip_prefix(&format!("{}-r", first.run_tag)).expect("the pair's tag plus -r<N>-<8hex>");
    let (n, hex) = suffix.split_once('-').unwrap();
    assert!(
        n.parse::<u32>().is_ok() && hex.len() == 8 && hex.chars().all(|c| c.is_ascii_hexdigit()),
        "{}",
        forced.run_tag
    );
    assert_eq!(dir.file_name().unwrap().to_str(), Some(forced.run_tag.as_str()));
    let again = trials(&dir);
    assert_eq!(again.len(), first_trials.len(), "every trial ran again: {again:?}");
    assert_eq!(scored(&again), want, "{again:?}");
    let names = |t: &[(String, String, Option<f64>)]| t.iter().map(|x| x.0.clone()).collect::<BTreeSet<_>>();
    assert!(names(&again).is_disjoint(&names(&first_trials)), "new trial dirs: {again:?} vs {first_trials:?}");
    let status: Value = serde_json::from_slice(&std::fs::read(dir.join("status.json")).unwrap()).unwrap();
    assert_eq!(status["resume"], false, "Harbor ran fresh: {status}");
    assert_eq!(std::fs::read(first_dir.join("result.json")).unwrap(), first_result, "the first result is kept");
    assert_eq!(trials(&first_dir), first_trials, "the first run's trials are untouched");

    let attempts = ledger.attempts_for(MODEL, BENCHMARK).unwrap();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    for attempt in &attempts {
        assert_eq!(attempt.status, AttemptStatus::Finished);
        let metrics = attempt.metrics.as_ref().expect("metrics");
        assert_eq!(metrics["n_trials"].as_u64(), Some(first_trials.len() as u64), "{metrics}");
    }
    let out = cluster.run(&["results"], &store.spec, &["--json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let results: Vec<&Value> =
        doc["cells"].as_array().unwrap().iter().chain(doc["earlier"].as_array().unwrap()).collect();
    let ids: BTreeSet<i64> = results.iter().map(|r| r["attempt_id"].as_i64().unwrap()).collect();
    assert_eq!(ids, [first.id.0, forced.id.0].into(), "{doc:#}");
    for result in results {
        let p = &result["provenance"];
        assert_eq!(p["harbor_version"], "0.25.0", "what the real Harbor reported: {p}");
        assert_eq!(p["vllm_version"], "0.33.0", "{p}");
        assert!(p["dataset_digest"].as_str().is_some_and(|d| d.starts_with("sha1:")), "{p}");
    }
    cancel_all(&*ledger);
}
