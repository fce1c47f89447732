//! The readiness budget `plan` and `spec` show (issue 23; docs/payload.md "Readiness budget"):
//! an 8B and a 235B MoE on Leonardo, first estimated from the ids (the weights not staged yet),
//! then from an HF cache holding their snapshots as sparse files of the checkpoints' sizes, linked
//! into `blobs/` as huggingface_hub lays them out.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::{SUBMITTER, stderr, stdout, workspace_root};

const MODELS: [&str; 2] = ["Qwen/Qwen3-8B", "Qwen/Qwen3-235B-A22B-Instruct-2507"];

fn leonardo(work: &Path, args: &[&str]) -> Output {
    Command::new(SUBMITTER)
        .args(args)
        .args(["--cluster", "leonardo"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", work.join("home"))
        .env("WORK", work)
        .env("SCRATCH", work.join("scratch"))
        .current_dir(workspace_root())
        .output()
        .unwrap()
}

fn plan(work: &Path) -> String {
    std::fs::create_dir_all(work.join("state")).unwrap();
    let state = work.join("state").display().to_string();
    // The budget, not the team's history: Leonardo's profile names a team database.
    let mut args = vec!["plan", "-v", "--preset", "tb2", "--offline-ledger", "--state-dir", &state];
    for m in MODELS {
        args.extend(["--model", m]);
    }
    let out = leonardo(work, &args);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    stdout(&out).lines().filter(|l| l.starts_with("ready ")).map(|l| format!("{l}\n")).collect()
}

/// A snapshot of `bytes` in `shards` sparse safetensors files (no disk used), huggingface_hub's
/// layout: `refs/main` names the revision, the snapshot's files link into `blobs/`.
fn stage(cache: &Path, model: &str, bytes: u64, shards: u64) {
    let repo = cache.join(format!("models--{}", model.replace('/', "--")));
    let revision = "0123456789abcdef0123456789abcdef01234567";
    let snapshot = repo.join("snapshots").join(revision);
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::write(repo.join("refs/main"), revision).unwrap();
    std::fs::write(snapshot.join("config.json"), "{}").unwrap();
    for i in 0..shards {
        let blob = repo.join("blobs").join(format!("blob{i}"));
        let len = bytes / shards + if i == 0 { bytes % shards } else { 0 };
        std::fs::File::create(&blob).unwrap().set_len(len).unwrap();
        std::os::unix::fs::symlink(&blob, snapshot.join(format!("model-{i:05}-of-{shards:05}.safetensors"))).unwrap();
    }
}

#[test]
fn plan_shows_the_budget_of_an_8b_and_a_235b_on_leonardo() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let root = work.display().to_string();
    let estimated = plan(work);
    insta::assert_snapshot!("readiness_estimated", estimated);
    // The checkpoints as the Hub lists them: 16.4 GB in 5 shards, 470 GB in 118.
    stage(&work.join("hf_cache"), MODELS[0], 16_400_000_000, 5);
    stage(&work.join("hf_cache"), MODELS[1], 470_000_000_000, 118);
    let on_disk = plan(work).replace(&root, "<WORK>");
    insta::assert_snapshot!("readiness_on_disk", on_disk);
    assert_ne!(estimated, on_disk, "the sizes on disk replace the estimates");

    // `spec` writes the same budget into the spec and says it on stderr.
    let out = leonardo(work, &["spec", "--preset", "tb2", "--model", MODELS[1]]);
    assert!(out.status.success(), "{}", stderr(&out));
    let spec: launch_spec::LaunchSpec = serde_json::from_str(&stdout(&out)).unwrap();
    let budget = spec.serve.ready_budget.clone().expect("a budget");
    assert_eq!(
        (budget.weights_bytes, budget.cap_s),
        (470_000_000_000 + "{}".len() as u64, 3000),
        "shards + config.json"
    );
    assert_eq!(budget.seconds, budget.load_s + budget.compile_s + budget.graph_capture_s);
    assert!(stderr(&out).contains(&spec.serve.readiness_line()), "{}", stderr(&out));
}

#[test]
fn a_model_without_a_size_gets_no_budget_and_plan_says_the_cap_applies() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("state")).unwrap();
    let state = dir.path().join("state").display().to_string();
    let out = leonardo(dir.path(), &["spec", "--preset", "tb2", "--model", "org/my-sft"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let spec: launch_spec::LaunchSpec = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(spec.serve.ready_budget, None);
    let out = leonardo(
        dir.path(),
        &["plan", "-v", "--preset", "tb2", "--offline-ledger", "--model", "org/my-sft", "--state-dir", &state],
    );
    assert!(
        stdout(&out).contains(
            "ready     org/my-sft terminal_bench_2: deadline 3000 s, serve.health_timeout_s: no budget (checkpoint size unknown"
        ),
        "{}",
        stdout(&out)
    );
}

#[test]
fn bad_budget_settings_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let clusters = dir.path().join("clusters");
    std::fs::create_dir_all(&clusters).unwrap();
    for f in ["leonardo.yaml", "gpus.yaml"] {
        std::fs::copy(workspace_root().join("clusters").join(f), clusters.join(f)).unwrap();
    }
    let profile = std::fs::read_to_string(clusters.join("leonardo.yaml")).unwrap();
    let clusters_arg = clusters.display().to_string();
    let line = 1 + profile.lines().position(|l| l.contains("load_bandwidth_mib_s: 1000")).unwrap();
    let at_nan = format!("leonardo.yaml:{line}:25: `load_bandwidth_mib_s`");
    for (from, to, field) in [
        ("load_bandwidth_mib_s: 1000", "load_bandwidth_mib_s: 0", "engine.load_bandwidth_mib_s"),
        // The YAML reader refuses it first, at its line and column.
        ("load_bandwidth_mib_s: 1000", "load_bandwidth_mib_s: .nan", at_nan.as_str()),
        ("compile_allowance_s: 300", "compile_allowance_s: 99999999999", "engine.compile_allowance_s"),
    ] {
        std::fs::write(clusters.join("leonardo.yaml"), profile.replacen(from, to, 1)).unwrap();
        let out = leonardo(dir.path(), &["spec", "--preset", "tb2", "--model", MODELS[0], "--clusters", &clusters_arg]);
        assert!(!out.status.success(), "{to}: accepted");
        let err = stderr(&out);
        assert!(err.contains(field) && err.trim().lines().count() == 1, "{to}: {err}");
    }
}
