//! Site facts of issue 20 (Build 6) through the real binary: the secrets variable first, a
//! reservation cleared or changed per launch, pending jobs moved onto one, the stale-pending bound.

use std::process::Command;

use serde_json::Value;

use crate::ledger::Store;
use submitter::ledger::open_ledger;

use crate::queueing::{TestCluster, cancel_all, scancel, text, wait_until};
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

/// Every path under `dir` with its kind and content (symlinks by target), sorted.
fn tree(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let rel = path.strip_prefix(dir).unwrap().display().to_string();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.file_type().is_symlink() {
            out.push((rel, std::fs::read_link(&path).unwrap().display().to_string().into_bytes()));
        } else if meta.is_dir() {
            out.push((rel + "/", Vec::new()));
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else {
            out.push((rel, std::fs::read(&path).unwrap()));
        }
    }
    out.sort();
    out
}

/// `launch --dry-run` on a cluster that stages models and datasets: the file tree (run dirs,
/// the HF cache, the datasets, the state dir) is byte-identical afterwards, the download command
/// only ever ran with `--dry-run`, and the output says what would be staged and how big it is.
#[test]
fn dry_run_writes_nothing_and_downloads_nothing() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let outside = tempfile::tempdir().unwrap();
    let log = outside.path().join("hf.log");
    let bin = outside.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // The Hub CLI's stand-in: a real download writes into the cache; `--dry-run` only reports.
    std::fs::write(
        bin.join("hf"),
        format!(
            "#!/bin/sh\necho \"$@\" >> {log}\ncase \" $* \" in *' --dry-run '*) echo '[dry-run] Will download 5 files totalling 16.4G.'; exit 0;; esac\n\
             while [ $# -gt 0 ]; do case $1 in --cache-dir|--local-dir) mkdir -p \"$2\" && echo weights > \"$2/blob\";; esac; shift; done\n",
            log = log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(bin.join("hf"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let hf = bin.join("hf").display().to_string();
    let cluster = TestCluster::new("facts", |p| {
        let r = p.lines().find_map(|l| l.strip_prefix("  jobs_dir: ")).unwrap().trim_end_matches("/jobs").to_string();
        *p = p.replace("  jobs_dir:", &format!("  hf_cache: {r}/hf\n  jobs_dir:"))
            + &format!(
                "pre_download:\n  enabled: true\n  command: [{hf}, download, \"{{model}}\", --cache-dir, \"{{cache}}\"]\n  dataset_command: [{hf}, download, \"{{dataset}}\", --repo-type, dataset, --local-dir, \"{{dir}}\"]\n"
            );
    });
    std::fs::remove_dir_all(cluster.root().join("datasets/DCAgent2_terminal_bench_2")).unwrap();
    let models = cluster.models_file(&["Qwen/Qwen3-8B"]);
    let before = tree(cluster.root());
    let out = cluster.run(
        &["launch"],
        &store.spec,
        &["--once", "--dry-run", "--preset", "tb2", "--models-file", models.to_str().unwrap()],
        &[],
    );
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    let after = tree(cluster.root());
    let changed: Vec<&String> =
        after.iter().chain(&before).filter(|e| !(before.contains(e) && after.contains(e))).map(|e| &e.0).collect();
    assert!(changed.is_empty(), "the dry run changed {changed:?}:\n{printed}");
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!calls.is_empty() && calls.lines().all(|l| l.ends_with("--dry-run")), "{calls}");
    assert!(printed.contains("would stage model Qwen/Qwen3-8B") && printed.contains("16.4G"), "{printed}");
    assert!(printed.contains("would stage dataset DCAgent2/terminal_bench_2"), "{printed}");
    assert!(printed.contains("dry run: would submit"), "{printed}");
}

/// Files the vLLM argv names (a chat template, a parser plugin, from the registry's extra_args)
/// are checked by preflight on the login node: a missing one fails it, naming the option.
#[test]
fn preflight_checks_the_files_the_vllm_argv_names() {
    let cluster = TestCluster::new("facts", |_| {});
    let registry = cluster.root().join("model_config");
    std::fs::create_dir_all(registry.join("probe")).unwrap();
    let template = cluster.root().join("chat.jinja");
    std::fs::write(&template, "{{ messages }}").unwrap();
    std::fs::write(
        registry.join("probe/Tpl-7B.yaml"),
        format!("model: probe/Tpl-7B\nsubsystems:\n  eval:\n    extra_args: --chat-template {}\n", template.display()),
    )
    .unwrap();
    std::fs::write(
        registry.join("probe/Plugin-7B.yaml"),
        "model: probe/Plugin-7B\nsubsystems:\n  eval:\n    extra_args: --tool-parser-plugin=/nonexistent/plugin.py --enable-prefix-caching\n",
    )
    .unwrap();
    let preflight = |model: &str| {
        let mut cmd = Command::new(SUBMITTER);
        cmd.args(["preflight", "--cluster", "facts", "--preset", "tb2", "--model", model, "--clusters"])
            .arg(cluster.root().join("clusters"))
            .arg("--registry")
            .arg(&registry)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .env("HOME", cluster.root())
            .env("SUBMITTER_HOME", workspace_root())
            .env("PAYLOAD_GPU_FIXTURE", workspace_root().join("tests/fixtures/gpus-4x-a100-64gb.json"))
            .current_dir(cluster.root());
        cmd.output().unwrap()
    };
    let good = preflight("probe/Tpl-7B");
    let line = |out: &std::process::Output| {
        text(out).lines().find(|l| l.contains("serve files")).unwrap_or_default().to_string()
    };
    assert!(line(&good).contains("chat.jinja") && !line(&good).contains("FAIL"), "{}", text(&good));
    let bad = preflight("probe/Plugin-7B");
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
    assert!(line(&bad).contains("--tool-parser-plugin /nonexistent/plugin.py"), "{}", text(&bad));
}

/// The Slurm field `scontrol -o show job J` prints as `key=value` (`None` when absent or `(null)`).
fn job_field(job: &str, key: &str) -> Option<String> {
    let out = Command::new("scontrol").args(["-o", "show", "job", job]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find_map(|f| f.strip_prefix(&format!("{key}=")).map(str::to_string))
        .filter(|v| v != "(null)")
}

/// Deletes the test's reservation however the test ends.
struct Reservation(String);

impl Drop for Reservation {
    fn drop(&mut self) {
        let _ = Command::new("scontrol").args(["delete", &format!("reservationname={}", self.0)]).output();
    }
}

/// `move --reservation R` puts the ledger's PENDING jobs onto R (`scontrol update`), one line per
/// job; a job no longer pending is named and left alone; a reservation Slurm does not know is a
/// failing line and exit 1.
#[test]
#[allow(clippy::print_stderr)]
fn pending_attempts_are_moved_onto_a_reservation() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let cluster = TestCluster::new("facts", |p| {
        // Held in the queue for an hour: PENDING for the whole test.
        *p = p.replace("  export_env:", "  extra_args: [\"--begin=now+3600\"]\n  export_env:");
    });
    let name = format!("evalci-move-{}", std::process::id());
    let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout).unwrap();
    let created = Command::new("scontrol")
        .args(["create", "reservation", &format!("reservationname={name}"), "starttime=now", "duration=30"])
        .args([&format!("users={}", user.trim()), "nodes=ALL", "flags=ignore_jobs"])
        .output()
        .unwrap();
    if !created.status.success() {
        eprintln!("note: skipping: this Slurm does not let the test create a reservation: {}", text(&created));
        return;
    }
    let _reservation = Reservation(name.clone());
    let models = cluster.models_file(&["test/Tiny-1B", "test/Small-3B"]);
    let launched = cluster.run(
        &["launch"],
        &store.spec,
        &["--once", "--preset", "tb2", "--models-file", models.to_str().unwrap()],
        &[],
    );
    assert!(text(&launched).contains("2 submitted"), "{}", text(&launched));
    let ledger = open_ledger(&store.spec).unwrap();
    let job_of =
        |model: &str| ledger.active().unwrap().into_iter().find(|a| a.model == model).unwrap().slurm_job_id.unwrap();
    let (pending, gone) = (job_of("test/Tiny-1B"), job_of("test/Small-3B"));
    // One job leaves the queue behind the ledger's back: it is no longer pending.
    scancel(&gone);
    wait_until("the cancelled job to leave PENDING", std::time::Duration::from_secs(60), || {
        job_field(&gone, "JobState").is_some_and(|s| s != "PENDING")
    });

    let out = cluster.run(&["move"], &store.spec, &["--reservation", &name], &[]);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert_eq!(job_field(&pending, "Reservation").as_deref(), Some(name.as_str()), "{printed}");
    assert_eq!(job_field(&gone, "Reservation"), None, "{printed}");
    assert!(printed.contains(&format!("moved job {pending} ")), "{printed}");
    assert!(printed.contains(&format!("left alone: job {gone} ")) && printed.contains("not pending"), "{printed}");
    assert!(printed.contains("1 job(s) moved"), "{printed}");

    let unknown = cluster.run(&["move"], &store.spec, &["--reservation", "no-such-reservation"], &[]);
    assert_eq!(unknown.status.code(), Some(1), "{}", text(&unknown));
    assert!(text(&unknown).contains(&format!("not moved: job {pending} ")), "{}", text(&unknown));
    assert_eq!(job_field(&pending, "Reservation").as_deref(), Some(name.as_str()));

    let bad = cluster.run(&["move"], &store.spec, &["--reservation", "a b"], &[]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(text(&bad).contains("bad reservation name") && text(&bad).lines().count() == 1, "{}", text(&bad));
    cancel_all(&*ledger);
}

/// `HF_TOKEN` goes to vLLM (by name: `secrets.pass_to_engine`) only where the job downloads the
/// weights itself: compute nodes with internet and nothing staged from the login side.
#[test]
fn hf_token_is_handed_to_the_engine_where_the_job_downloads() {
    let offline = TestCluster::new("facts", |_| {});
    assert!(spec(&offline, &[])["secrets"].get("pass_to_engine").is_none());
    let online = TestCluster::new("facts", |p| p.push_str("network:\n  internet: true\n"));
    assert_eq!(spec(&online, &[])["secrets"]["pass_to_engine"], serde_json::json!(["HF_TOKEN"]));
    let staged = TestCluster::new("facts", |p| {
        let r = p.lines().find_map(|l| l.strip_prefix("  jobs_dir: ")).unwrap().trim_end_matches("/jobs").to_string();
        *p = p.replace("  jobs_dir:", &format!("  hf_cache: {r}/hf\n  jobs_dir:"))
            + "network:\n  internet: true\npre_download:\n  enabled: true\n";
    });
    assert!(spec(&staged, &[])["secrets"].get("pass_to_engine").is_none());
}
