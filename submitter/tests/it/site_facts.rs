//! Site facts of issue 20 (Build 6) through the real binary: the secrets variable first, a
//! reservation cleared or changed per launch, the stale-pending bound.

use std::process::Command;

use serde_json::Value;

use crate::ledger::Store;
use crate::queueing::{TestCluster, text};
use crate::support::{SUBMITTER, slurm_up, workspace_root};

fn spec(cluster: &TestCluster, env: &[(&str, &std::path::Path)]) -> Value {
    let mut cmd = Command::new(SUBMITTER);
    cmd.args(["spec", "--cluster", "facts", "--preset", "tb2", "--model", "Qwen/Qwen3-8B", "--clusters"])
        .arg(cluster.root().join("clusters"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("HOME", cluster.root())
        .env("SUBMITTER_HOME", workspace_root())
        .current_dir(cluster.root());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// As the team's scripts: `$DC_AGENT_SECRET_ENV` wins over the profile's `secrets.file`.
#[test]
fn the_secrets_variable_wins_over_the_profiles_file() {
    let cluster = TestCluster::new("facts", |_| {});
    let profile_file = cluster.root().join("secrets.env");
    assert_eq!(spec(&cluster, &[])["secrets"]["file"], profile_file.to_str().unwrap());
    let mine = cluster.root().join("mine.env");
    std::fs::write(&mine, "DAYTONA_API_KEY=x\n").unwrap();
    assert_eq!(spec(&cluster, &[("DC_AGENT_SECRET_ENV", &mine)])["secrets"]["file"], mine.to_str().unwrap());
}

/// A profile's reservation reaches sbatch; `--reservation R` changes it, `--no-reservation` and
/// `--reservation ''` drop it (a reservation that has ended).
#[test]
fn the_reservation_is_changed_or_cleared_per_launch() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let cluster = TestCluster::new("facts", |p| {
        *p = p.replace("  partition: debug\n", "  partition: debug\n  reservation: ended\n")
    });
    let models = cluster.models_file(&["Qwen/Qwen3-8B"]);
    let argv = |extra: &[&str]| -> Vec<String> {
        let args = [&["--preset", "tb2", "--models-file", models.to_str().unwrap(), "--json"][..], extra].concat();
        let out = cluster.run(&["plan"], &store.spec, &args, &[]);
        assert!(out.status.success(), "{extra:?}: {}", text(&out));
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        serde_json::from_value(doc["jobs"][0]["sbatch"].clone()).unwrap_or_else(|_| panic!("{doc:#}"))
    };
    let reservations =
        |argv: Vec<String>| -> Vec<String> { argv.into_iter().filter(|a| a.starts_with("--reservation")).collect() };
    assert_eq!(reservations(argv(&[])), ["--reservation=ended"]);
    assert_eq!(reservations(argv(&["--reservation", "fresh"])), ["--reservation=fresh"]);
    assert!(reservations(argv(&["--no-reservation"])).is_empty());
    assert!(reservations(argv(&["--reservation", ""])).is_empty());
}

/// A concurrency ceiling that exists (Vista's 8, the local profile's 4) is never silent: `plan`
/// says that it capped the preset's value, and the spec carries the capped one.
#[test]
fn a_concurrency_cap_says_so_in_plan() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let cluster = TestCluster::new("facts", |p| {
        *p = p.replace("  n_concurrent: 2\n", "  n_concurrent: 2\n  n_concurrent_ceiling: 3\n")
    });
    let models = cluster.models_file(&["Qwen/Qwen3-8B"]);
    let out = cluster.run(&["plan"], &store.spec, &["--preset", "tb2", "--models-file", models.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let printed = text(&out);
    assert!(printed.contains("concurrency 64 capped to 3 trials by limits.n_concurrent_ceiling"), "{printed}");
}
