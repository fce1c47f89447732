//! Output that scales (issue 36 item 2): `plan` and `results` for 200 models, on a terminal 120
//! columns wide (`SUBMITTER_WIDTH=120`, what `COLUMNS=120` gives on a real terminal) and in a pipe,
//! through the real binary. A terminal gets a table that fits its width (long model ids wrap);
//! a pipe gets plain columns, one line per pair; `results` lists the ranked models first.

use std::path::Path;
use std::process::{Command, Output};

use chrono::Utc;
use serde_json::json;
use submitter::ledger::{AttemptStatus, ImportedAttempt, open_ledger};

use crate::support::{SUBMITTER, stderr, stdout, workspace_root};

/// 200 model ids: sizes from 1B to 70B (other parallelism and timeouts), every 25th a long id.
fn models() -> Vec<String> {
    (0..200)
        .map(|i| {
            let size = [1, 3, 7, 8, 14, 32, 70][i % 7];
            if i % 25 == 0 {
                format!(
                    "an-organisation-with-a-long-name/a-fine-tuned-model-with-a-long-descriptive-name-{i:03}-{size}B"
                )
            } else {
                format!("org{}/Model-{i:03}-{size}B", i % 4)
            }
        })
        .collect()
}

fn run(state: &Path, args: &[&str], width: Option<&str>) -> String {
    let mut command = Command::new(SUBMITTER);
    command
        .args(args)
        .args(["--cluster", "local", "--state-dir"])
        .arg(state)
        .env("SUBMITTER_HOME", workspace_root())
        .env_remove("COLUMNS")
        .env_remove("SUBMITTER_WIDTH");
    if let Some(width) = width {
        command.env("SUBMITTER_WIDTH", width);
    }
    let out: Output = command.output().unwrap();
    assert!(out.status.success(), "{args:?}: {}{}", stdout(&out), stderr(&out));
    stdout(&out)
}

fn fits(text: &str, width: usize) {
    for line in text.lines() {
        assert!(line.chars().count() <= width, "wider than {width}: {line}");
    }
}

#[test]
fn plan_for_200_models_on_a_terminal_and_in_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let list = dir.path().join("models.txt");
    std::fs::write(&list, models().join("\n") + "\n").unwrap();
    let plan = ["plan", "--preset", "tb2", "--offline-ledger", "--models-file", list.to_str().unwrap()];
    let root = workspace_root().display().to_string();
    let piped = run(&state, &plan, None).replace(&root, "<root>");
    let pairs = |label: &str| piped.lines().filter(|l| l.split_whitespace().next() == Some(label)).count();
    // The local profile's limits.max_jobs_in_flight (8) throttles the rest: one problem, grouped.
    assert_eq!((pairs("submit"), pairs("throttled")), (8, 192), "one line per pair in a pipe: {piped}");
    assert!(piped.contains("blocked   192 pairs: throttled: "), "the shared problem once, with its count: {piped}");
    assert!(piped.contains(" and 187 more\n"), "and the pairs it hit: {piped}");
    assert!(piped.lines().count() < 200 + 10, "no per-pair detail lines without -v: {piped}");
    assert!(!piped.contains('\u{1b}') && !piped.contains('─'), "plain columns in a pipe");
    insta::assert_snapshot!("plan_200_pipe", piped);
    let terminal = run(&state, &plan, Some("120")).replace(&root, "<root>");
    fits(&terminal, 120);
    assert!(terminal.contains('─'), "the header underlined on a terminal");
    insta::assert_snapshot!("plan_200_terminal_120", terminal);
    let verbose = run(&state, &[&plan[..], &["-v"]].concat(), None);
    assert_eq!(verbose.lines().filter(|l| l.starts_with("settings  ")).count(), 200, "-v: the details");
}

fn finished(model: &str, benchmark: &str, mean: f64) -> ImportedAttempt {
    let t = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z").unwrap().with_timezone(&Utc);
    ImportedAttempt {
        model: model.into(),
        benchmark: benchmark.into(),
        cluster: "local".into(),
        username: "tester".into(),
        run_tag: format!("{benchmark}__{}", model.replace('/', "__")),
        slurm_job_id: Some("100".into()),
        status: AttemptStatus::Finished,
        reason: "finished".into(),
        config: json!({}),
        metrics: Some(json!({"mean_reward": mean, "n_trials": 89, "n_errors": 0, "n_valid": 89, "n_expected": 89})),
        submitted_at: t,
        started_at: Some(t),
        ended_at: Some(t + chrono::Duration::minutes(40)),
        source_id: None,
    }
}

#[test]
fn results_for_200_models_ranked_on_a_terminal_and_in_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let ledger = open_ledger(&format!("sqlite:{}", state.join("ledger.sqlite").display())).unwrap();
    let rows: Vec<ImportedAttempt> = models()
        .iter()
        .enumerate()
        .flat_map(|(i, model)| {
            // Scores that do not follow the names: the ranking, not the name order, decides.
            let tb2 = ((i * 37) % 89) as f64 / 89.0;
            let mut rows = vec![finished(model, "terminal_bench_2", tb2)];
            if i % 3 == 0 {
                rows.push(finished(model, "DCAgent_dev_set_v2", ((i * 11) % 100) as f64 / 100.0));
            }
            rows
        })
        .chain([finished("zz/Unranked-7B", "DCAgent_dev_set_v2", 0.5)])
        .collect();
    ledger.import_attempts(&rows).unwrap();
    drop(ledger);
    let piped = run(&state, &["results"], None);
    let body: Vec<&str> = piped.lines().skip(1).take(201).collect();
    // A rank label: `3`, or `3=` when tied (issue 35's ranking).
    let rank = |line: &str| line.split_whitespace().last().and_then(|r| r.trim_end_matches('=').parse::<usize>().ok());
    let ranks: Vec<usize> = body.iter().filter_map(|l| rank(l)).collect();
    assert_eq!(ranks.len(), 200, "{piped}");
    assert!(ranks.windows(2).all(|w| w[0] <= w[1]), "ranked, best first: {piped}");
    assert!(body[200].starts_with("zz/Unranked-7B"), "the unranked model after the ranked ones: {piped}");
    insta::assert_snapshot!("results_200_pipe", piped);
    let terminal = run(&state, &["results"], Some("120"));
    fits(&terminal, 120);
    insta::assert_snapshot!("results_200_terminal_120", terminal);
}
