//! The corpus of broken inputs (`tests/corpus/<case>/`): every one gets a one-line error that
//! names the file (with line and column where there is one) and the fix, exit code 2, no panic.

use std::path::PathBuf;

use crate::support::{stderr, stdout, submitter, workspace_root};

fn corpus(case: &str) -> PathBuf {
    workspace_root().join("submitter/tests/corpus").join(case)
}

/// Runs `args`, expects exit 2 and a single `error:` line containing every `needles` item.
pub(crate) fn fails_with(args: &[&str], needles: &[&str]) {
    let out = submitter(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "args {args:?}\nstderr: {err}\nstdout: {}", stdout(&out));
    assert!(!err.contains("panicked"), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "exactly one error line: {err}");
    for needle in needles {
        assert!(errors[0].contains(needle), "`{needle}` missing from: {}", errors[0]);
    }
    assert!(stdout(&out).is_empty(), "nothing half-written to stdout: {}", stdout(&out));
}

fn resolve_on(case: &str, model: &str) -> Vec<String> {
    let registry = corpus(case).join("model_config");
    ["registry", "resolve", "--gpus-per-node", "4", "--json", "--registry", registry.to_str().unwrap(), model]
        .map(str::to_string)
        .to_vec()
}

fn run_resolve(case: &str, needles: &[&str]) {
    let args = resolve_on(case, "org/Model-8B");
    fails_with(&args.iter().map(String::as_str).collect::<Vec<_>>(), needles);
}

#[test]
fn unknown_key_suggests_the_right_one() {
    run_resolve(
        "typo-key",
        &["org/m.yaml:4:", "unknown field `tensor_paralel_size`", "did you mean `tensor_parallel_size`"],
    );
}

#[test]
fn wrong_type_names_line_and_column() {
    run_resolve("wrong-type", &["org/m.yaml:2:", "max_model_len"]);
}

#[test]
fn bad_regex_names_the_pattern() {
    run_resolve("bad-regex", &["_patterns.yaml", "pattern #1 `(?i)qwen(3`", "not a valid regular expression"]);
}

#[test]
fn duplicate_key_is_rejected() {
    run_resolve("duplicate-key", &["org/m.yaml:3:", "duplicate"]);
}

#[test]
fn non_mapping_file_is_rejected() {
    // It names no model: `registry check` fails on it; `resolve` of another model goes on and says
    // the file was skipped (one bad file never takes down the commands that do not need it).
    let registry = corpus("not-a-mapping").join("model_config");
    let check = submitter(&["registry", "check", "--registry", registry.to_str().unwrap()]);
    assert_eq!(check.status.code(), Some(1), "{}", stdout(&check));
    assert!(stdout(&check).contains("org/m.yaml"), "{}", stdout(&check));
    let args = resolve_on("not-a-mapping", "org/Model-8B");
    let out = submitter(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("registry file skipped") && stderr(&out).contains("org/m.yaml"), "{}", stderr(&out));
}

#[test]
fn missing_registry_dir() {
    run_resolve("does-not-exist", &["cannot read registry directory", "--registry"]);
}

#[test]
fn impossible_parallelism_names_the_model_and_fix() {
    let args = resolve_on("impossible-parallelism", "org/Huge-400B");
    fails_with(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &["org/Huge-400B", "TP 8", "4", "tensor_parallel_size"],
    );
}

#[test]
fn unknown_cluster_lists_valid_ones() {
    fails_with(
        &["registry", "resolve", "--cluster", "leonardoo", "Qwen/Qwen3-8B"],
        &["unknown cluster `leonardoo`", "leonardo", "vista (alias tacc)", "local"],
    );
}

#[test]
fn cluster_with_wrong_type() {
    let clusters = corpus("bad-cluster").join("clusters");
    fails_with(
        &["registry", "resolve", "--clusters", clusters.to_str().unwrap(), "--cluster", "mini", "Qwen/Qwen3-8B"],
        &["mini.yaml:6:", "gpus_per_node"],
    );
}

#[test]
fn missing_models_file() {
    fails_with(
        &["registry", "resolve", "--gpus-per-node", "4", "--models-file", "/nonexistent/list.txt"],
        &["/nonexistent/list.txt", "cannot read model list"],
    );
}

#[test]
fn missing_gpus_per_node_says_what_to_give() {
    fails_with(&["registry", "resolve", "Qwen/Qwen3-8B"], &["--gpus-per-node", "--cluster"]);
}

/// `registry check` lists every problem of a broken tree and exits 1.
#[test]
fn check_lists_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("model_config");
    for case in ["typo-key", "wrong-type", "bad-json"] {
        let target = registry.join(case);
        std::fs::create_dir_all(&target).unwrap();
        std::fs::copy(corpus(case).join("model_config/org/m.yaml"), target.join("m.yaml")).unwrap();
    }
    std::fs::copy(corpus("bad-regex").join("model_config/_patterns.yaml"), registry.join("_patterns.yaml")).unwrap();
    let clusters = corpus("bad-cluster").join("clusters");
    let presets = corpus("bad-preset").join("presets");
    let out = submitter(&[
        "registry",
        "check",
        "--registry",
        registry.to_str().unwrap(),
        "--clusters",
        clusters.to_str().unwrap(),
        "--presets",
        presets.to_str().unwrap(),
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}{}", stderr(&out));
    for needle in [
        "typo-key/m.yaml: unknown field `tensor_paralel_size`",
        "wrong-type/m.yaml",
        "bad-json/m.yaml: hf_overrides is not valid JSON",
        "bad regular expression",
        "mini.yaml",
        "broken.yaml",
    ] {
        assert!(text.contains(needle), "`{needle}` missing:\n{text}");
    }
    let gpus = corpus("bad-gpus").join("clusters");
    let out = submitter(&["registry", "check", "--clusters", gpus.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("did you mean `gpu_memory_utilization`"), "{}", stdout(&out));
}

/// Selection mistakes stop before anything touches the ledger or Slurm.
#[test]
fn no_priority_list_means_no_submissions() {
    fails_with(
        &["plan", "--cluster", "local", "--preset", "tb2"],
        &["no priority list", "--models-file", "--all-models"],
    );
}

#[test]
fn force_needs_an_explicit_model_list() {
    fails_with(
        &["launch", "--once", "--cluster", "local", "--preset", "tb2", "--all-models", "--force"],
        &["--force needs an explicit model list"],
    );
}

#[test]
fn launch_needs_once_or_watch() {
    fails_with(&["launch", "--cluster", "local", "--preset", "tb2", "--model", "org/M-8B"], &["--once", "--watch"]);
}

#[test]
fn listener_refuses_a_ledger_password_without_echoing_it() {
    let out = submitter(&[
        "listener",
        "start",
        "--cluster",
        "local",
        "--interval",
        "1m",
        "--ledger",
        "postgres://evaltest:not-a-real-password@127.0.0.1:5432/evaltest",
        "--",
        "--preset",
        "tb2",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("~/.pgpass"), "{err}");
    assert!(!err.contains("not-a-real-password"), "{err}");
}

/// Issue 21 item 12, the submitter's small refusals, each a one-line error and nothing done: a
/// zero `--interval`, a job id that is none, `report --html` into a missing directory (not created),
/// a ledger password on argv (as `import --from` refuses one; never echoed), and lint refusing an
/// exported secret name and a clock time past its ranges.
#[test]
fn small_refusals_of_issue_21() {
    let out = submitter(&["launch", "--cluster", "local", "--watch", "--interval", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("an interval is at least 1s"), "{}", stderr(&out));
    for bad in ["--job=-1", "--job=0", "--job=12a"] {
        let out = submitter(&["cancel", "--cluster", "local", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
        assert!(stderr(&out).contains("is not a Slurm job id"), "{bad}: {}", stderr(&out));
    }
    let tmp = tempfile::tempdir().unwrap();
    let html = tmp.path().join("missing/sub/report.html");
    let out = submitter(&["report", "--cluster", "local", "--html", html.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
    assert!(!tmp.path().join("missing").exists(), "the missing directory was created");
    let secret = format!("pw{}", std::process::id());
    let url = format!("postgres://u:{secret}@127.0.0.1:1/db");
    let out = submitter(&["status", "--cluster", "local", "--ledger", &url]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("a password on the command line"), "{}", stderr(&out));
    assert!(!stderr(&out).contains(&secret) && !stdout(&out).contains(&secret), "the password was echoed");

    let clusters = tmp.path().join("clusters");
    std::fs::create_dir_all(&clusters).unwrap();
    let shipped = crate::support::workspace_root().join("clusters");
    std::fs::copy(shipped.join("gpus.yaml"), clusters.join("gpus.yaml")).unwrap();
    let profile = std::fs::read_to_string(shipped.join("local.yaml"))
        .unwrap()
        .replace("  time: \"00:30:00\"", "  time: \"99999:99:99\"")
        .replace("  export_env: [PAYLOAD_GPU_FIXTURE]", "  export_env: [PAYLOAD_GPU_FIXTURE, DAYTONA_API_KEY]");
    std::fs::write(clusters.join("local.yaml"), profile).unwrap();
    let out = submitter(&["registry", "check", "--clusters", clusters.to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}{}", stderr(&out));
    assert!(text.contains("`DAYTONA_API_KEY` looks like a secret"), "{text}");
    assert!(text.contains("99999:99:99"), "{text}");
}

/// Issue 21 item 12: `models add` refuses an id with an escape sequence, a newline or another
/// control character (stored nothing), and `models list` escapes what an older ledger holds.
#[test]
fn models_add_refuses_control_characters_and_list_escapes_them() {
    let tmp = tempfile::tempdir().unwrap();
    let ledger = format!("sqlite:{}", tmp.path().join("ledger.sqlite").display());
    let ledger_flag = ["--ledger", ledger.as_str(), "--state-dir", tmp.path().to_str().unwrap()];
    for bad in ["org/\u{1b}[31mred", "org/two\nlines", "org/bell\u{7}"] {
        let out = submitter(&[&["models", "add", "--cluster", "local"][..], &ledger_flag, &[bad]].concat());
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("control character"), "{bad:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains('\u{1b}'), "the escape reached the terminal raw");
    }
    let stored = submitter::ledger::open_ledger(&ledger).unwrap();
    assert!(stored.list_models().unwrap().is_empty(), "nothing stored");
    stored.add_model("org/\u{1b}[2Jwipe", None).unwrap();
    let out = submitter(&[&["models", "list", "--cluster", "local"][..], &ledger_flag].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(!text.contains('\u{1b}') && text.contains("org/\\u{1b}[2Jwipe"), "{text:?}");
}
