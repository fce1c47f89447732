//! Snapshots (`insta`) of the human and JSON outputs of the registry, catalogue and families
//! commands through the real binary: a changed output shows up as a reviewed diff
//! (`cargo insta review`, or `INSTA_UPDATE=always` then `git diff`), and a JSON document without
//! its `format_version` cannot slip through. Volatile parts (temp paths, registration times) are
//! replaced by placeholders before the comparison. In CI (`CI=true`) a missing or different snapshot
//! fails.

use std::process::{Command, Output};

use crate::support::{SUBMITTER, on_local as run_in, stdout, workspace_root};

/// `text` with RFC 3339 times and human `YYYY-MM-DD HH:MM` times as placeholders.
pub(crate) fn stable(text: &str) -> String {
    let rfc3339 = regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)").unwrap();
    let human = regex::Regex::new(r"\d{4}-\d\d-\d\d \d\d:\d\d").unwrap();
    human.replace_all(&rfc3339.replace_all(text, "<time>"), "<time>").into_owned()
}

/// An existing, empty state dir: `plan` reads only, and a typo'd one is an error (issue 36).
fn state_dir(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    state
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}{}", stdout(out), String::from_utf8_lossy(&out.stderr));
    stdout(out)
}

#[test]
fn registry_resolve() {
    let args = ["registry", "resolve", "--gpus-per-node", "4", "Qwen/Qwen3-32B", "probe/Foo-7B"];
    let out = Command::new(SUBMITTER).args(args).current_dir(workspace_root()).env_remove("SUBMITTER_HOME").output();
    insta::assert_snapshot!("registry_resolve_human", ok(&out.unwrap()));
    let out = Command::new(SUBMITTER)
        .args(args)
        .args(["--format", "json"])
        .current_dir(workspace_root())
        .env_remove("SUBMITTER_HOME")
        .output();
    insta::assert_snapshot!("registry_resolve_json", ok(&out.unwrap()));
}

#[test]
fn registry_check_on_a_broken_registry() {
    let corpus = workspace_root().join("submitter/tests/corpus/typo-key/model_config");
    for format in ["human", "json"] {
        let out = Command::new(SUBMITTER)
            .args(["registry", "check", "--registry"])
            .arg(&corpus)
            .args(["--format", format])
            .current_dir(workspace_root())
            .env_remove("SUBMITTER_HOME")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
        let root = workspace_root().display().to_string();
        insta::assert_snapshot!(format!("registry_check_{format}"), stdout(&out).replace(&root, "<root>"));
    }
}

#[test]
fn catalogue_families_and_unevaluated() {
    let dir = tempfile::tempdir().unwrap();
    let state = state_dir(&dir);
    ok(&run_in(&state, &["models", "add", "org/Alpha-8B", "org/Beta-32B"]));
    ok(&run_in(&state, &["models", "add", "--base", "Qwen/Qwen3-8B", "org/my-sft"]));
    ok(&run_in(&state, &["families", "add", "dev_set_v2_3.0x", "dev_set_v2"]));
    for format in ["human", "json"] {
        let f = ["--format", format];
        insta::assert_snapshot!(
            format!("models_list_{format}"),
            stable(&ok(&run_in(&state, &[&["models", "list"][..], &f].concat())))
        );
        insta::assert_snapshot!(
            format!("families_list_{format}"),
            ok(&run_in(&state, &[&["families", "list"][..], &f].concat()))
        );
        let unevaluated = ["unevaluated", "--benchmark", "dev_set_v2_3.0x", "--size", "8"];
        insta::assert_snapshot!(format!("unevaluated_{format}"), ok(&run_in(&state, &[&unevaluated[..], &f].concat())));
    }
}

#[test]
fn plan_on_an_empty_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let state = state_dir(&dir);
    let plan = ["plan", "--preset", "tb2", "--model", "Qwen/Qwen3-8B", "--model", "probe/Foo-7B"];
    for format in ["human", "json"] {
        let out = ok(&run_in(&state, &[&plan[..], &["--format", format]].concat()));
        // The local profile's run dirs and batch script live under the checkout.
        let root = workspace_root().display().to_string();
        insta::assert_snapshot!(format!("plan_{format}"), out.replace(&root, "<root>"));
    }
}

/// `plan` names the source of every setting: the command line's, the preset's and the profile's
/// each say so, in the text and in the JSON.
#[test]
fn plan_says_where_each_setting_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let state = state_dir(&dir);
    let plan = ["plan", "--preset", "swebench_full", "--model", "Qwen/Qwen3-8B", "--n-concurrent", "2"];
    let json: serde_json::Value =
        serde_json::from_str(&ok(&run_in(&state, &[&plan[..], &["--format", "json"]].concat()))).unwrap();
    let settings = &json["jobs"][0]["settings"];
    let got =
        |name: &str| (settings[name]["value"].clone(), settings[name]["source"].as_str().unwrap_or("?").to_string());
    assert_eq!(got("n_concurrent"), (serde_json::json!(2), "command line".into()), "{settings}");
    assert_eq!(got("agent_parser"), (serde_json::json!("xml"), "preset swebench_full".into()), "{settings}");
    assert_eq!(got("partition"), (serde_json::json!("debug"), "profile local".into()), "{settings}");
    assert_eq!(got("time"), (serde_json::json!("48:00:00"), "preset swebench_full".into()), "{settings}");
    let text = ok(&run_in(&state, &[&plan[..], &["-v"]].concat()));
    let line = text.lines().find(|l| l.starts_with("settings  Qwen/Qwen3-8B")).unwrap_or_default();
    for want in
        ["n_concurrent 2 (command line)", "agent_parser xml (preset swebench_full)", "partition debug (profile local)"]
    {
        assert!(line.contains(want), "{want} in {text}");
    }
}

/// The precedence between the levels: the command line beats the preset, which beats the
/// profile; the value the job runs with is the winner's (the sbatch argv), not only its label.
#[test]
fn plan_the_command_line_beats_the_preset_beats_the_profile() {
    let dir = tempfile::tempdir().unwrap();
    let state = state_dir(&dir);
    let job = |extra: &[&str]| {
        let args = [&["plan", "--preset", "swebench_full", "--model", "Qwen/Qwen3-8B", "--format", "json"][..], extra]
            .concat();
        let json: serde_json::Value = serde_json::from_str(&ok(&run_in(&state, &args))).unwrap();
        json["jobs"][0].clone()
    };
    let time = |job: &serde_json::Value| {
        let argv: Vec<String> = serde_json::from_value(job["sbatch"].clone()).unwrap_or_default();
        (
            job["settings"]["time"]["source"].as_str().unwrap_or("?").to_string(),
            argv.iter().find(|a| a.starts_with("--time=")).cloned(),
        )
    };
    // The preset's 48:00:00 over the profile's 00:30:00.
    assert_eq!(time(&job(&[])), ("preset swebench_full".into(), Some("--time=2-00:00:00".into())));
    // The command line's over the preset's.
    assert_eq!(time(&job(&["--time", "01:00:00"])), ("command line".into(), Some("--time=0-01:00:00".into())));
    // The profile's where neither sets one: the partition.
    let plain = job(&[]);
    assert_eq!(plain["settings"]["partition"]["source"], "profile local");
    let cli = job(&["--partition", "other"]);
    assert_eq!(
        (cli["settings"]["partition"]["source"].as_str(), cli["resources"]["partition"].as_str()),
        (Some("command line"), Some("other"))
    );
}

/// Each skip says where its evidence came from: an attempt of this ledger, or a row of the team's
/// history (folded in as an imported attempt; its `sandbox_jobs.id` named).
#[test]
fn plan_names_each_skips_evidence() {
    use submitter::ledger::{AttemptStatus, ImportedAttempt, NewAttempt, now};
    let dir = tempfile::tempdir().unwrap();
    let state = state_dir(&dir);
    std::fs::create_dir_all(&state).unwrap();
    let ledger =
        submitter::ledger::open_ledger(&submitter::ledger::default_path(&state).display().to_string()).unwrap();
    let own = ledger
        .insert_pending(&NewAttempt {
            model: "Qwen/Qwen3-8B".into(),
            benchmark: "terminal_bench_2".into(),
            cluster: "local".into(),
            username: "tester".into(),
            run_tag: "terminal_bench_2__Qwen__Qwen3-8B".into(),
            agent: "terminus-2".into(),
            reason: "no previous attempt".into(),
            config: serde_json::json!({"timeout_multiplier": 2.0, "agent": "terminus-2"}),
        })
        .unwrap();
    let metrics = serde_json::json!({"mean_reward": 0.5, "n_trials": 2});
    ledger.transition(own, AttemptStatus::Finished, "finished", Some(&metrics)).unwrap();
    let team_row = ImportedAttempt {
        model: "probe/Foo-7B".into(),
        benchmark: "terminal_bench_2".into(),
        cluster: "ot-agent".into(),
        username: "alice".into(),
        run_tag: "terminal_bench_2__probe__Foo-7B".into(),
        slurm_job_id: Some("881".into()),
        status: AttemptStatus::Finished,
        reason: "imported: Finished in the team history".into(),
        config: serde_json::json!({"source": "ot-agent", "timeout_multiplier": 2.0}),
        metrics: Some(metrics.clone()),
        submitted_at: now(),
        started_at: None,
        ended_at: None,
        source_id: Some("postgres://team@db.invalid:6543/postgres#20000000-0000-0000-0000-00000000000a".into()),
    };
    ledger.import_attempts(&[team_row]).unwrap();
    drop(ledger);
    let plan = ["plan", "--preset", "tb2", "--model", "Qwen/Qwen3-8B", "--model", "probe/Foo-7B"];
    for format in ["human", "json"] {
        let out = ok(&run_in(&state, &[&plan[..], &["--format", format]].concat()));
        insta::assert_snapshot!(format!("plan_evidence_{format}"), out);
    }
}

/// `plan --allocation shared` over ID: which pairs share a job, its time and capacity, its argv once
/// (docs/submitter.md, "Shared allocation").
#[test]
fn plan_with_shared_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let state = state_dir(&dir);
    let plan = ["plan", "--preset", "ID", "--allocation", "shared", "--model", "Qwen/Qwen3-8B"];
    for format in ["human", "json"] {
        let out = ok(&run_in(&state, &[&plan[..], &["--format", format]].concat()));
        let root = workspace_root().display().to_string();
        insta::assert_snapshot!(format!("plan_shared_{format}"), out.replace(&root, "<root>"));
    }
}
