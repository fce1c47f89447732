//! Issue 36's footguns, through the real binary: unknown benchmark names are errors naming the
//! known ones, the short names `status` prints are accepted wherever the long ones are, read-only
//! commands create no state, `hold` is `release`'s counterpart, and `cancel`/`move --dry-run`
//! change neither Slurm nor the ledger.

use std::path::Path;
use std::process::Command;

use serde_json::json;
use submitter::ledger::{AttemptStatus, Ledger, NewAttempt, open_ledger};

use crate::support::{on_local as run, stderr, stdout};

fn ledger_at(state: &Path) -> Box<dyn Ledger> {
    std::fs::create_dir_all(state).unwrap();
    open_ledger(&format!("sqlite:{}", state.join("ledger.sqlite").display())).unwrap()
}

fn attempt(ledger: &dyn Ledger, model: &str, benchmark: &str) -> submitter::ledger::AttemptId {
    ledger
        .insert_pending(&NewAttempt {
            model: model.into(),
            benchmark: benchmark.into(),
            cluster: "local".into(),
            username: "t".into(),
            run_tag: format!("{benchmark}__{model}"),
            agent: "terminus-2".into(),
            reason: "test".into(),
            config: json!({}),
        })
        .unwrap()
}

#[test]
fn an_unknown_benchmark_is_an_error_naming_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let ledger = ledger_at(&state);
    ledger.add_model("org/Alpha-8B", None).unwrap();
    let out = run(&state, &["unevaluated", "--benchmark", "dev_set_vv2"]);
    assert!(!out.status.success(), "a typo listed every model: {}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("unknown benchmark `dev_set_vv2`") && err.contains("did you mean `dev_set_v2`?"), "{err}");
    assert!(err.contains("tb2") && err.contains("swebench"), "names the known ones: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    for (given, family) in [("v2", "dev_set_v2"), ("dev_set_v2", "dev_set_v2"), ("tb2", "terminal_bench_2")] {
        let out = run(&state, &["unevaluated", "--benchmark", given]);
        assert!(out.status.success(), "{given}: {}", stderr(&out));
        assert!(stdout(&out).contains(&format!("benchmark family {family}\n")), "{given}: {}", stdout(&out));
    }
    let out = run(&state, &["cancel", "--model", "org/Alpha-8B", "--benchmark", "tb3"]);
    assert!(!out.status.success() && stderr(&out).contains("did you mean `tb2`?"), "{}", stderr(&out));
    let out = run(&state, &["plan", "--preset", "tb3", "--model", "org/Alpha-8B"]);
    assert!(stderr(&out).contains("unknown preset `tb3` (did you mean `tb2`?)"), "{}", stderr(&out));
}

#[test]
fn hold_and_release_take_the_short_names_status_prints() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let ledger = ledger_at(&state);
    let id = attempt(&*ledger, "org/Alpha-8B", "terminal_bench_2");
    ledger.transition(id, AttemptStatus::Failed, "test", None).unwrap();
    let out = run(&state, &["hold", "--model", "org/Alpha-8B", "--benchmark", "tb2", "--reason", "bad template"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let states = submitter::remediate::pair_states(&*ledger).unwrap();
    let key = ("org/Alpha-8B".to_string(), "terminal_bench_2".to_string(), "terminus-2".to_string());
    let held = states.get(&key).and_then(|s| s.held.clone()).expect("held under the pair's family and agent");
    assert!(held.reason.contains("bad template"), "{held:?}");
    let again = run(&state, &["hold", "--model", "org/Alpha-8B", "--benchmark", "terminal_bench_2"]);
    assert!(!again.status.success() && stderr(&again).contains("already held"), "{}", stderr(&again));
    let out = run(&state, &["release", "--model", "org/Alpha-8B", "--benchmark", "tb2"]);
    assert!(out.status.success(), "`release --benchmark tb2` (the name status prints): {}", stderr(&out));
    let states = submitter::remediate::pair_states(&*ledger).unwrap();
    assert!(states.get(&key).is_none_or(|s| s.held.is_none()), "released");
}

#[test]
fn read_only_commands_create_no_state() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("stat");
    let html = dir.path().join("r.html");
    let commands: [&[&str]; 6] = [
        &["status"],
        &["results"],
        &["report", "--html", html.to_str().unwrap()],
        &["plan", "--preset", "tb2", "--model", "org/Alpha-8B", "--offline-ledger"],
        &["unevaluated", "--benchmark", "tb2"],
        &["models", "list"],
    ];
    for args in commands {
        let out = run(&typo, args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} on a typo'd --state-dir succeeded: {}", stdout(&out));
        assert!(err.contains("--state-dir") && err.contains("no such directory"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
        assert!(!typo.exists(), "{args:?} created {}", typo.display());
    }
    // A state dir with no ledger yet reads as empty, and stays empty.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = run(&empty, &["results"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0, "results wrote into the state dir");
    let named = dir.path().join("nope").join("ledger.sqlite");
    let out = run(&empty, &["results", "--ledger", named.to_str().unwrap()]);
    assert!(!out.status.success() && stderr(&out).contains("no such directory"), "{}", stderr(&out));
    assert!(!named.exists());
    let unmade = empty.join("ledger.sqlite");
    let out = run(&empty, &["results", "--ledger", unmade.to_str().unwrap()]);
    assert!(out.status.success() && !unmade.exists(), "{}", stderr(&out));
}

/// A first `plan --offline-ledger` on a profile that names a team database, with a ledger that never
/// imported the team's history, warns that everything the team ran plans as submit (on main it said
/// only "offline").
#[test]
fn a_first_offline_plan_on_a_team_profile_warns_that_the_history_was_never_imported() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let plan = |state: &Path, format: &[&str]| {
        let out = Command::new(crate::support::SUBMITTER)
            .args(["plan", "--cluster", "leonardo", "--preset", "tb2", "--model", "org/Alpha-8B", "--offline-ledger"])
            .args(format)
            .arg("--state-dir")
            .arg(state)
            .env("SUBMITTER_HOME", crate::support::workspace_root())
            .env("WORK", dir.path())
            .env("SCRATCH", dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let text = plan(&state, &[]);
    assert!(text.contains("never imported the team's history") && text.contains("submitter import"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&plan(&state, &["--json"])).unwrap();
    assert_eq!(json["team"]["never_imported"], true, "{json}");
    // Once a row of the team's history is in the ledger, the plain offline line.
    let ledger = ledger_at(&state);
    let mut row = submitter::ledger::ImportedAttempt {
        model: "org/Other-1B".into(),
        benchmark: "terminal_bench_2".into(),
        cluster: "jupiter".into(),
        username: "team".into(),
        run_tag: "t".into(),
        slurm_job_id: None,
        status: AttemptStatus::Finished,
        reason: "imported".into(),
        config: json!({}),
        metrics: None,
        submitted_at: chrono::Utc::now(),
        started_at: None,
        ended_at: None,
        source_id: Some("postgres://team@db/ot#1".into()),
    };
    row.ended_at = Some(row.submitted_at);
    ledger.import_attempts(&[row]).unwrap();
    drop(ledger);
    let text = plan(&state, &[]);
    assert!(text.contains("team      offline (--offline-ledger)") && !text.contains("never imported"), "{text}");
}

/// A held Slurm job (it stays PENDING) behind a pending attempt: `cancel --dry-run` and `move
/// --dry-run` say what they would do, and the job, its reservation and the ledger row are unchanged.
#[test]
fn cancel_and_move_dry_runs_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let ledger = ledger_at(&state);
    let sbatch = Command::new("sbatch")
        .args(["--parsable", "--hold", "-J", "footgun_dry_run", "-o", "/dev/null", "--wrap", "sleep 1"])
        .output()
        .expect("sbatch (scripts/services.sh up)");
    assert!(sbatch.status.success(), "{}", String::from_utf8_lossy(&sbatch.stderr));
    let job = String::from_utf8_lossy(&sbatch.stdout).trim().split(';').next().unwrap().to_string();
    let id = attempt(&*ledger, "org/Alpha-8B", "terminal_bench_2");
    ledger.set_job_id(id, &job).unwrap();
    let job_state = || {
        let out = Command::new("squeue").args(["-h", "-j", &job, "-o", "%T %v"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let before = job_state();
    assert!(before.starts_with("PENDING"), "{before}");

    let out = run(&state, &["move", "--reservation", "elsewhere", "--dry-run", "--benchmark", "tb2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&format!("would move job {job}")) && stdout(&out).contains("nothing changed"));
    let out = run(&state, &["cancel", "--model", "org/Alpha-8B", "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&format!("would cancel attempt {}", id.0)), "{}", stdout(&out));
    assert!(stdout(&out).contains("1 attempt(s) would be cancelled, nothing changed"), "{}", stdout(&out));

    assert_eq!(job_state(), before, "Slurm changed by a dry run");
    let row = ledger.attempt(id).unwrap().unwrap();
    assert_eq!(row.status, AttemptStatus::Pending, "the ledger changed by a dry run");

    // The real cancel then does it (and cleans the job up).
    let out = run(&state, &["cancel", "--model", "org/Alpha-8B"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(ledger.attempt(id).unwrap().unwrap().status, AttemptStatus::Cancelled);
}

/// `$SUBMITTER_CLUSTER` stands for `--cluster` (the flag wins); without either the error names both.
#[test]
fn the_cluster_comes_from_submitter_cluster_when_not_given() {
    let dir = tempfile::tempdir().unwrap();
    let run = |env: Option<&str>| {
        let mut command = Command::new(crate::support::SUBMITTER);
        command
            .args(["results", "--state-dir"])
            .arg(dir.path())
            .env("SUBMITTER_HOME", crate::support::workspace_root());
        command.env_remove("SUBMITTER_CLUSTER");
        if let Some(cluster) = env {
            command.env("SUBMITTER_CLUSTER", cluster);
        }
        command.output().unwrap()
    };
    let out = run(Some("local"));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(None);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("--cluster") && err.contains("$SUBMITTER_CLUSTER"), "{err}");
    let out = run(Some("locl"));
    assert!(stderr(&out).contains("unknown cluster `locl` (did you mean `local`?)"), "{}", stderr(&out));
}

/// Without `--cluster` or `$SUBMITTER_CLUSTER`, the profile whose `hosts:` matches this machine's
/// hostname is used, and said in one line on stderr.
#[test]
fn the_cluster_comes_from_the_profile_whose_hosts_match_this_machine() {
    let dir = tempfile::tempdir().unwrap();
    let clusters = dir.path().join("clusters");
    let copied =
        Command::new("cp").arg("-r").arg(crate::support::workspace_root().join("clusters")).arg(&clusters).status();
    assert!(copied.unwrap().success());
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    let local = clusters.join("local.yaml");
    let text = std::fs::read_to_string(&local).unwrap();
    let pattern = format!("{}*", &hostname[..hostname.len().min(3)]);
    std::fs::write(&local, format!("{}\nhosts: [\"{pattern}\"]\n", text.trim_end())).unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let out = Command::new(crate::support::SUBMITTER)
        .args(["results", "--clusters"])
        .arg(&clusters)
        .arg("--state-dir")
        .arg(&state)
        .env("SUBMITTER_HOME", crate::support::workspace_root())
        .env_remove("SUBMITTER_CLUSTER")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let said = format!("cluster: local (host {hostname} matches its hosts: `{pattern}`)");
    assert_eq!(stderr(&out).trim(), said);
}
