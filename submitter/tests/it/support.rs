//! Shared helpers for the submitter integration tests: run the real binary, find fixtures.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use launch_spec::testkit::world;

pub(crate) const SUBMITTER: &str = env!("CARGO_BIN_EXE_submitter");

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// `../shared/fixtures/otagent`: required in CI (the test fails there without it), skipped with a
/// printed note elsewhere. Never copied into the repository.
#[allow(clippy::print_stderr)]
pub(crate) fn fixtures() -> Option<PathBuf> {
    let dir = std::env::var_os("EVAL_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("../shared/fixtures/otagent"));
    if dir.join("model_config").is_dir() {
        return Some(dir);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("fixtures missing at {} (required in CI)", dir.display());
    }
    eprintln!("note: skipping, fixtures not found at {}", dir.display());
    None
}

pub(crate) fn submitter(args: &[&str]) -> Output {
    Command::new(SUBMITTER)
        .args(args)
        .current_dir(workspace_root())
        .env_remove("SUBMITTER_HOME")
        .output()
        .expect("run submitter")
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Whether the local Slurm answers; in CI it must (`scripts/services.sh up` starts it), elsewhere a
/// test without it prints `skipping: no local Slurm`.
#[allow(clippy::print_stderr)]
pub(crate) fn slurm_up() -> bool {
    let up = Command::new("scontrol")
        .arg("ping")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("UP"));
    if !up {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "no local Slurm in CI: scripts/services.sh up must start it"
        );
        eprintln!("skipping: no local Slurm");
    }
    up
}

/// The directory of the workspace's binaries (payload and the vLLM/Harbor stand-ins), each checked
/// to be fresh, never built here (`tests/src/fresh.rs`).
pub(crate) fn binaries() -> PathBuf {
    for (package, bin) in [("payload", "payload"), ("e2e", "vllm-standin"), ("e2e", "harbor-standin")] {
        crate::fresh::bin(package, bin);
    }
    PathBuf::from(SUBMITTER).parent().expect("target dir").to_path_buf()
}

/// `<root>/env/bin/{vllm,harbor}` pointing at the stand-ins: the environment prefix of a test
/// cluster profile (`environments: {otagent: <root>/env}`).
pub(crate) fn standin_environment(root: &Path) {
    let bins = binaries();
    let (vllm, harbor) = (bins.join("vllm-standin"), bins.join("harbor-standin"));
    world::link_programs(&root.join("env"), &[("vllm", &vllm), ("harbor", &harbor)]);
}

/// `<root>/secrets.env`, mode 0600, with keys for both Daytona orgs made up per run (no
/// credential-shaped literal in the source).
pub(crate) fn test_secrets_file(root: &Path) {
    let run = format!("{}-{}", std::process::id(), root.display().to_string().len());
    let keys = format!("DAYTONA_API_KEY=test-org1-{run}\nDAYTONA_DATA_API_KEY=test-org2-{run}\n");
    world::write_secrets(&root.join("secrets.env"), &keys, 0o600);
}

/// One Harbor task directory (with an `instruction.md`) per name under `dataset`.
pub(crate) fn write_tasks<S: AsRef<str>>(dataset: &Path, tasks: impl IntoIterator<Item = S>) {
    world::write_tasks(dataset, tasks, |_| "Say hello.\n".to_string(), None);
}

/// `submitter ARGS --cluster local --state-dir STATE`, the workspace as `SUBMITTER_HOME`.
pub(crate) fn on_local(state: &Path, args: &[&str]) -> Output {
    Command::new(SUBMITTER)
        .args(args)
        .args(["--cluster", "local", "--state-dir"])
        .arg(state)
        .env("SUBMITTER_HOME", workspace_root())
        .output()
        .unwrap()
}

/// `submitter spec --cluster local --preset PRESET --model MODEL`, then `rest` (`--out FILE`, …).
pub(crate) fn spec_on_local(preset: &str, model: &str, rest: &[&str]) -> Output {
    submitter(&[&["spec", "--cluster", "local", "--preset", preset, "--model", model][..], rest].concat())
}

/// `submitter registry resolve --registry DIR --profile P --gpus-per-node N --json`, then `rest`
/// (model ids, or `--models-file FILE`), which must succeed: its `models` object.
pub(crate) fn resolved_models(registry: &Path, profile: &str, gpus_per_node: &str, rest: &[&str]) -> serde_json::Value {
    let registry = registry.to_str().unwrap();
    let args = [
        &[
            "registry",
            "resolve",
            "--registry",
            registry,
            "--profile",
            profile,
            "--gpus-per-node",
            gpus_per_node,
            "--json",
        ][..],
        rest,
    ]
    .concat();
    let out = submitter(&args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_str::<serde_json::Value>(&stdout(&out)).unwrap()["models"].clone()
}
