//! The validation edge (issue 11): every number, id and path from a cluster profile, preset,
//! registry file, list or the command line is checked where it enters, by the same rule for every
//! command — what `registry check` reports stops `spec` with one line naming file and field, and
//! the launch spec `spec` writes is one payload accepts. Also: reads of run dirs and configuration
//! never hang on a FIFO nor grow on `/dev/zero`, and run-dir text is printed escaped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::broken::fails_with;
use crate::support::{SUBMITTER, spec_on_local, stderr, stdout, submitter, workspace_root};

/// A copy of the shipped configuration (clusters/, presets/, model_config/) to break one file of.
struct Tree {
    dir: tempfile::TempDir,
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["clusters", "presets", "model_config"] {
            copy_dir(&workspace_root().join(sub), &dir.path().join(sub));
        }
        Tree { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn edit(&self, rel: &str, from: &str, to: &str) {
        let path = self.path(rel);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{rel} has no `{from}`");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    }

    fn dirs(&self) -> Vec<String> {
        ["--registry", "model_config", "--clusters", "clusters", "--presets", "presets"]
            .iter()
            .enumerate()
            .map(|(i, a)| if i % 2 == 1 { self.path(a).display().to_string() } else { (*a).to_string() })
            .collect()
    }

    fn check(&self) -> Output {
        let mut args = vec!["registry".to_string(), "check".to_string()];
        args.extend(self.dirs());
        submitter(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// `registry check` reports the problem (exit 1) and `spec` stops on it (exit 2, one line).
    fn refused_everywhere(&self, model: &str, needles: &[&str]) {
        let out = self.check();
        assert_eq!(out.status.code(), Some(1), "registry check: {}{}", stdout(&out), stderr(&out));
        let report = stdout(&out);
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
        for needle in needles {
            assert!(
                report.lines().any(|l| l.starts_with("error:") && l.contains(needle)),
                "`{needle}` not reported:\n{report}"
            );
        }
        let mut args: Vec<String> = ["spec", "--cluster", "local", "--preset", "tb2", "--model", model]
            .iter()
            .map(|a| (*a).to_string())
            .collect();
        args.extend(self.dirs());
        fails_with(&args.iter().map(String::as_str).collect::<Vec<_>>(), needles);
    }
}

#[test]
fn registry_values_are_refused_by_check_spec_and_resolve() {
    let corpus = workspace_root().join("submitter/tests/corpus/registry-values");
    let cases = [
        ("quoted-bool", "trust_remote_code"),
        ("yes-bool", "trust_remote_code"),
        ("quoted-int", "tensor_parallel_size"),
        ("hex-int", "tensor_parallel_size"),
        ("number-as-string", "tool_call_parser"),
        ("nan-timeout", "timeout_multiplier"),
        ("negative-timeout", "timeout_multiplier"),
        ("parallel-overflow", "tensor_parallel_size 65536 × pipeline_parallel_size 1 × data_parallel_size 65536"),
        ("zero-seqs", "max_num_seqs"),
        ("zero-timeout-in-variant", "timeout_multiplier 0 must be a number"),
    ];
    // A file whose id is no model id names no model another command asks for: `registry check`
    // fails on it, and the commands that do not need it go on, saying it was skipped (issue 20).
    for (case, needle) in [("path-as-id", "model id \"../../etc/passwd\""), ("option-as-id", "starts with `-`")] {
        let tree = Tree::new();
        std::fs::create_dir_all(tree.path("model_config/org")).unwrap();
        std::fs::copy(corpus.join(format!("{case}.yaml")), tree.path("model_config/org/m.yaml")).unwrap();
        let check = tree.check();
        assert_eq!(check.status.code(), Some(1), "{case}: {}", stdout(&check));
        assert!(stdout(&check).lines().any(|l| l.starts_with("error:") && l.contains(needle)), "{}", stdout(&check));
        let mut args: Vec<String> =
            ["spec", "--cluster", "local", "--preset", "tb2", "--model", "org/Model-8B"].map(String::from).to_vec();
        args.extend(tree.dirs());
        let out = crate::support::submitter(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(out.status.success(), "{case}: {}", stderr(&out));
        assert!(stderr(&out).contains("registry file skipped") && stderr(&out).contains("m.yaml"), "{}", stderr(&out));
    }
    for (case, needle) in cases {
        let tree = Tree::new();
        std::fs::create_dir_all(tree.path("model_config/org")).unwrap();
        std::fs::copy(corpus.join(format!("{case}.yaml")), tree.path("model_config/org/m.yaml")).unwrap();
        tree.refused_everywhere("org/Model-8B", &["m.yaml", needle]);
        let registry = tree.path("model_config");
        fails_with(
            &["registry", "resolve", "--gpus-per-node", "4", "--registry", registry.to_str().unwrap(), "org/Model-8B"],
            &["m.yaml", needle],
        );
    }
}

#[test]
fn cluster_preset_and_gpu_values_are_refused_by_check_and_spec() {
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "clusters/local.yaml",
            "arch: x86_64",
            "arch: x86_64\n  gpu_memory_utilization: 7.5",
            "hardware.gpu_memory_utilization",
        ),
        (
            "clusters/local.yaml",
            "arch: x86_64",
            "arch: x86_64\n  gpu_memory_utilization: -1",
            "hardware.gpu_memory_utilization",
        ),
        (
            "clusters/local.yaml",
            "health_timeout_s: 120",
            "health_timeout_s: 18446744073709551615",
            "engine.health_timeout_s",
        ),
        ("clusters/local.yaml", "health_timeout_s: 120", "health_timeout_s: \"120\"", "health_timeout_s"),
        ("clusters/local.yaml", "n_concurrent: 4", "n_concurrent: 0", "limits.n_concurrent"),
        ("clusters/local.yaml", "walltime_lead_s: 60", "walltime_lead_s: 99999999999", "limits.walltime_lead_s"),
        ("clusters/local.yaml", "kill_wait_s: 30", "kill_wait_s: 99999999999", "slurm.kill_wait_s"),
        ("clusters/local.yaml", "submission_delay_s: 0.2", "submission_delay_s: 1e20", "limits.submission_delay_s"),
        ("presets/tb2.yaml", "n_concurrent: 64", "n_concurrent: 0", "n_concurrent"),
        ("presets/tb2.yaml", "log_suffix: tb2", "log_suffix: tb2\nn_attempts: 0", "n_attempts"),
        ("presets/tb2.yaml", "log_suffix: tb2", "log_suffix: tb2\ngpu_memory_util: 5", "gpu_memory_util"),
        ("presets/tb2.yaml", "log_suffix: tb2", "log_suffix: tb2\ngpu_memory_util: .inf", "gpu_memory_util"),
        ("presets/tb2.yaml", "auto_snapshot: true", "auto_snapshot: \"false\"", "auto_snapshot"),
    ];
    for (file, from, to, needle) in cases {
        let tree = Tree::new();
        tree.edit(file, from, to);
        let name = Path::new(file).file_name().unwrap().to_str().unwrap();
        tree.refused_everywhere("Qwen/Qwen3-8B", &[name, needle]);
    }
    let tree = Tree::new();
    tree.edit("clusters/gpus.yaml", "gpu_memory_utilization: ", "gpu_memory_utilization: .nan #");
    tree.refused_everywhere("Qwen/Qwen3-8B", &["gpus.yaml", "gpu_memory_utilization"]);
}

#[test]
fn command_line_values_and_model_ids_are_refused() {
    let spec = |extra: &[&str], needles: &[&str]| {
        let mut args = vec!["spec", "--cluster", "local", "--preset", "tb2"];
        args.extend_from_slice(extra);
        if !extra.iter().any(|a| a.starts_with("--model")) {
            args.extend(["--model", "Qwen/Qwen3-8B"]);
        }
        fails_with(&args, needles);
    };
    spec(&["--gpu-memory-utilization", "5"], &["--gpu-memory-utilization", "(0, 1]"]);
    spec(&["--gpu-memory-utilization", "NaN"], &["--gpu-memory-utilization"]);
    spec(&["--n-concurrent", "0"], &["--n-concurrent", "≥ 1"]);
    spec(&["--timeout-multiplier=-1"], &["--timeout-multiplier"]);
    spec(&["--timeout-multiplier", "inf"], &["--timeout-multiplier"]);
    let long = format!("org/{}", "x".repeat(10_000));
    for (id, why) in [
        ("--model=--chat-template=/etc/passwd", "starts with `-`"),
        ("--model=", "is empty"),
        ("--model= ", "is empty"),
        ("--model=../../etc/passwd", "`..`"),
        ("--model=/etc/passwd", "absolute path"),
        ("--model=Qwen/Qwen3\n8B", "control character"),
        ("--model=Qwen/Qwen3 8B", "whitespace"),
        (&format!("--model={long}"), "too long"),
    ] {
        spec(&[id], &["--model", why]);
    }
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("list.txt");
    std::fs::write(&list, "# models\nQwen/Qwen3-8B\n../../etc/passwd\n").unwrap();
    fails_with(
        &["registry", "resolve", "--gpus-per-node", "4", "--models-file", list.to_str().unwrap()],
        &["list.txt:3:", "model id \"../../etc/passwd\""],
    );
}

/// `spec --out` never replaces something that is not a regular file (a FIFO, a directory; the
/// issue's `/dev/full` is the same case, not exercised here so a regression cannot break the box).
#[test]
fn spec_out_refuses_special_files() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for target in [&fifo, &dir.path().to_path_buf()] {
        let out = spec_on_local("tb2", "Qwen/Qwen3-8B", &["--out", target.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains("not a regular file"), "{}", stderr(&out));
    }
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
}

/// Colliding readable tags get distinct run dirs; ordinary ids keep theirs.
#[test]
fn plan_gives_colliding_ids_distinct_run_tags() {
    let state = tempfile::tempdir().unwrap();
    let out = submitter(&[
        "plan",
        "--cluster",
        "local",
        "--preset",
        "tb2",
        "--json",
        "--state-dir",
        state.path().to_str().unwrap(),
        "--model",
        "a/b__c-8B",
        "--model",
        "a__b/c-8B",
        "--model",
        "Qwen/Qwen3-8B",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let tags: Vec<&str> = plan
        .as_array()
        .or_else(|| plan["jobs"].as_array())
        .unwrap()
        .iter()
        .filter_map(|j| j["run_tag"].as_str())
        .collect();
    assert_eq!(tags.len(), 3, "{plan}");
    assert_ne!(tags[0], tags[1], "a/b__c-8B and a__b/c-8B share a run dir");
    assert!(tags.contains(&"terminal_bench_2__Qwen__Qwen3-8B"), "{tags:?}");
}

/// Runs `args` and fails the test (instead of hanging it) when it is not done within a minute.
fn run_bounded(args: &[&str]) -> Output {
    let mut child = Command::new(SUBMITTER)
        .args(args)
        .current_dir(workspace_root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} hung (a FIFO was read as a file)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn mkfifo(path: &Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success(), "mkfifo {}", path.display());
}

/// FIFOs for every record and a trial `result.json` linked to `/dev/zero`: `check` finishes at
/// once with bounded memory.
#[test]
fn check_never_hangs_on_fifos_nor_reads_dev_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("terminal_bench_2__org__Model-8B");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["status.json", "config.json", "result.json", "events.jsonl", "launch.json", "vllm.log", "tunnel.log"] {
        mkfifo(&dir.join(name));
    }
    let fifo_trial = dir.join("task-a__fifo");
    std::fs::create_dir_all(fifo_trial.join("agent")).unwrap();
    mkfifo(&fifo_trial.join("result.json"));
    mkfifo(&fifo_trial.join("config.json"));
    mkfifo(&fifo_trial.join("trial.log"));
    let zero_trial = dir.join("task-b__zero");
    std::fs::create_dir_all(zero_trial.join("agent")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", zero_trial.join("result.json")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", zero_trial.join("config.json")).unwrap();
    let out = run_bounded(&["check", dir.to_str().unwrap()]);
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    assert!(matches!(out.status.code(), Some(0..=2)), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("FAIL") || stdout(&out).contains("WARN"), "{}", stdout(&out));
}

/// A trial name and an `api_base` with terminal escapes (printed as evidence of a stale
/// api_base) come out escaped in the text output.
#[test]
fn check_prints_run_dir_text_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let trial = dir.join("task-c__\u{1b}[31mred");
    std::fs::create_dir_all(trial.join("agent")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"job_name": "x", "agents": [{"name": "terminus-2", "kwargs": {"api_base": "http://127.0.0.1:8000/v1"}}]}"#,
    )
    .unwrap();
    std::fs::write(
        trial.join("config.json"),
        r#"{"agent": {"kwargs": {"api_base": "http://127.0.0.1:9/v1\u001b[2J"}}}"#,
    )
    .unwrap();
    let out = run_bounded(&["check", dir.to_str().unwrap()]);
    let text = stdout(&out);
    assert!(text.contains("api_base.stale") || text.contains("another server"), "{text}");
    assert!(text.contains("\\u{1b}[31mred"), "trial name not shown escaped:\n{text}");
    assert!(!text.contains('\u{1b}'), "raw escape printed:\n{text}");
}

/// A FIFO `_patterns.yaml` or `gpus.yaml` makes `registry check` report it, not hang.
#[test]
fn registry_check_reports_fifo_config_files() {
    let tree = Tree::new();
    for file in ["model_config/_patterns.yaml", "clusters/gpus.yaml", "presets/tb2.yaml"] {
        std::fs::remove_file(tree.path(file)).unwrap();
        mkfifo(&tree.path(file));
    }
    let mut args = vec!["registry", "check"];
    let dirs = tree.dirs();
    args.extend(dirs.iter().map(String::as_str));
    let out = run_bounded(&args);
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), stderr(&out));
    let report = stdout(&out);
    for file in ["_patterns.yaml", "gpus.yaml", "tb2.yaml"] {
        assert!(report.lines().any(|l| l.contains(file) && l.contains("FIFO")), "{file}:\n{report}");
    }
}
