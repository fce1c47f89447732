//! `submitter compare A B` through the real binary on a SQLite ledger holding per-trial facts
//! (issue 35): the verdict, the flipped tasks, McNemar, the versioned `--json` document, bad input.

use serde_json::{Value, json};
use submitter::ledger::{AttemptStatus, NewAttempt, TrialSet, open_ledger};
use submitter::stats::Trial;

use crate::support::{on_local as run, stderr, stdout};

/// A finished terminal_bench_2 attempt of `model` with one trial per task (`t00`, `t01`, …).
fn finished(state: &std::path::Path, model: &str, rewards: &[f64]) {
    let trials = rewards
        .iter()
        .enumerate()
        .map(|(i, r)| Trial { task: format!("t{i:02}"), attempt: 1, reward: *r, valid: true })
        .collect();
    finished_with(state, model, trials);
}

fn finished_with(state: &std::path::Path, model: &str, trials: Vec<Trial>) {
    let ledger = open_ledger(&format!("sqlite:{}", state.join("ledger.sqlite").display())).unwrap();
    let id = ledger
        .insert_pending(&NewAttempt {
            model: model.into(),
            benchmark: "terminal_bench_2".into(),
            cluster: "local".into(),
            username: "t".into(),
            run_tag: format!("tb2__{model}"),
            agent: "terminus-2".into(),
            reason: "test".into(),
            config: json!({}),
        })
        .unwrap();
    ledger.transition(id, AttemptStatus::Finished, "finished", Some(&json!({"mean_reward": 0.5}))).unwrap();
    ledger.record_trials(id, &TrialSet { harbor_version: Some("0.25.0".into()), trials }).unwrap();
}

#[test]
fn compare_names_the_flipped_tasks_and_says_when_there_is_no_difference() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let base: Vec<f64> = (0..40).map(|i| f64::from(u8::from(i % 2 == 0))).collect();
    let mut same = base.clone();
    same.swap(0, 1); // t00 flips to B's side, t01 to A's: no real difference
    let mut worse = base.clone();
    for r in worse.iter_mut().step_by(2).take(12) {
        *r = 0.0; // 12 tasks A solved and C does not
    }
    finished(&state, "org/A-8B", &base);
    finished(&state, "org/B-8B", &same);
    finished(&state, "org/C-8B", &worse);

    let out = run(&state, &["compare", "org/A-8B", "org/B-8B"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("terminal_bench_2: no detectable difference"), "{text}");
    assert!(text.contains("better under org/A-8B: t00\n") && text.contains("better under org/B-8B: t01\n"), "{text}");

    let out = run(&state, &["compare", "org/A-8B", "org/C-8B", "--benchmark", "terminal_bench_2", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((doc["format_version"].as_u64(), doc["kind"].as_str()), (Some(1), Some("compare")), "{doc}");
    let bench = &doc["benchmarks"][0];
    assert!(bench["verdict"].as_str().unwrap().starts_with("org/A-8B scores higher than org/C-8B: +30.0"), "{bench}");
    let flipped: Vec<String> = (0..12).map(|i| format!("t{:02}", 2 * i)).collect();
    assert_eq!(bench["comparisons"][0]["a_better"], json!(flipped), "{bench}");
    assert_eq!(bench["comparisons"][0]["invalid_trials"], "counted_as_zero");
    assert_eq!(bench["comparisons"][1]["invalid_trials"], "dropped");
    let mcnemar = &bench["comparisons"][0]["mcnemar"];
    assert_eq!((mcnemar["a_only"].as_u64(), mcnemar["b_only"].as_u64()), (Some(12), Some(0)), "{mcnemar}");
    assert!((mcnemar["p_value"].as_f64().unwrap() - 2.0 / 4096.0).abs() < 1e-12, "{mcnemar}");
    assert_eq!(bench["a_harbor_version"], "0.25.0");

    // Bad input: a model with no finished attempt is a one-line error and exit 2.
    let out = run(&state, &["compare", "org/A-8B", "org/Nope-8B"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no benchmark where both have a finished attempt"), "{}", stderr(&out));
}

/// `results` on a run with invalid trials and several attempts per task: both means, labelled,
/// each with the task-clustered SE (checked against a hand computation) and a bootstrap interval,
/// pass@k, and the Harbor version that produced it — in the text and in `--json`.
#[test]
fn results_show_both_means_the_clustered_se_and_the_harbor_version() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // 20 tasks × 2 attempts: tasks 0–9 solved twice, 10–19 failed twice, except that task 19's
    // second attempt is invalid (no reward).
    let mut trials = Vec::new();
    for task in 0..20 {
        for attempt in 1..=2 {
            let valid = !(task == 19 && attempt == 2);
            let reward = if task < 10 { 1.0 } else { 0.0 };
            trials.push(Trial { task: format!("t{task:02}"), attempt, reward, valid });
        }
    }
    finished_with(&state, "org/D-8B", trials);
    let out = run(&state, &["results", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &doc["cells"][0]["trials"];
    assert_eq!(t["harbor_version"], "0.25.0", "{t}");
    let (zero, dropped) = (&t["estimates"][0], &t["estimates"][1]);
    assert_eq!((zero["label"].as_str(), dropped["label"].as_str()), (Some("invalid as 0"), Some("invalid dropped")));
    assert!((zero["mean"].as_f64().unwrap() - 20.0 / 40.0).abs() < 1e-12, "{zero}");
    assert!((dropped["mean"].as_f64().unwrap() - 20.0 / 39.0).abs() < 1e-12, "{dropped}");
    // Reference CR1 SE for "invalid as 0": μ = ½, task sums 2 (×10) and 0 (×10) over 2 trials each:
    // residuals ±1, SE = sqrt(20/19 · 20) / 40.
    let reference = (20.0_f64 / 19.0 * 20.0).sqrt() / 40.0;
    assert!((zero["clustered_se"].as_f64().unwrap() - reference).abs() < 1e-12, "{zero}");
    assert!(zero["interval"]["lower"].as_f64().unwrap() < 0.5 && zero["interval"]["upper"].as_f64().unwrap() > 0.5);
    assert_eq!(t["pass_at_k"], json!([2, 0.5]), "{t}");
    let out = run(&state, &["results"]);
    let text = stdout(&out);
    assert!(text.contains("org/D-8B tb2: invalid as 0 50.0 ± 11.5"), "{text}");
    assert!(text.contains("invalid dropped 51.3") && text.contains("Harbor 0.25.0"), "{text}");
}
