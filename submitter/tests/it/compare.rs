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

/// Reads CSV the way a spreadsheet would: a header and its records, every field unquoted.
fn csv_rows(text: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let header = reader.headers().unwrap().iter().map(str::to_string).collect();
    let rows = reader.records().map(|r| r.unwrap().iter().map(str::to_string).collect()).collect();
    (header, rows)
}

/// Three or more models: each ranked benchmark's ranking, ties where the 95% intervals overlap,
/// in text, `--json` (`compare.ranking`) and `--csv`; `results` ranks on the same intervals; two
/// models give one CSV row per common task.
#[test]
fn compare_several_models_ranks_them_with_ties_where_intervals_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let base: Vec<f64> = (0..40).map(|i| f64::from(u8::from(i % 2 == 0))).collect();
    let mut close = base.clone();
    close.swap(0, 1);
    close[3] = 1.0; // 21 of 40: within A's interval
    let weak: Vec<f64> = (0..40).map(|i| f64::from(u8::from(i < 3))).collect(); // 3 of 40
    finished(&state, "org/A-8B", &base);
    finished(&state, "org/B-8B", &close);
    finished(&state, "org/C-8B", &weak);

    let out = run(&state, &["compare", "org/A-8B", "org/B-8B", "org/C-8B"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("terminal_bench_2: 3 model(s) ranked"), "{text}");
    let lines: Vec<&str> = text.lines().skip(2).collect();
    assert!(lines[0].trim_start().starts_with("1=") && lines[0].contains("org/B-8B"), "{text}");
    assert!(lines[0].contains("tied with org/A-8B"), "{text}");
    assert!(lines[1].trim_start().starts_with("1=") && lines[1].contains("org/A-8B"), "{text}");
    assert!(lines[2].trim_start().starts_with("3 ") && lines[2].contains("org/C-8B"), "{text}");
    assert!(!lines[2].contains("tied"), "{text}");

    let out = run(&state, &["compare", "org/A-8B", "org/B-8B", "org/C-8B", "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((doc["format_version"].as_u64(), doc["kind"].as_str()), (Some(1), Some("compare.ranking")), "{doc}");
    let standings = &doc["rankings"][0]["standings"];
    assert_eq!(standings[2]["model"], "org/C-8B");
    assert_eq!(standings[2]["rank"], 3);
    assert_eq!(standings[2]["interval_basis"], "bootstrap_over_tasks");
    assert!(standings[2]["interval"]["upper"].as_f64().unwrap() < standings[0]["interval"]["lower"].as_f64().unwrap());
    assert_eq!(standings[0]["tied_with"], json!(["org/A-8B"]));

    let out = run(&state, &["compare", "org/A-8B", "org/B-8B", "org/C-8B", "--csv"]);
    let (header, rows) = csv_rows(&stdout(&out));
    assert_eq!(header[..5], ["benchmark", "model", "rank", "rank_label", "position"]);
    assert_eq!(rows.len(), 3);
    assert_eq!((rows[2][1].as_str(), rows[2][3].as_str(), rows[2][9].as_str()), ("org/C-8B", "3", ""));

    // `results` ranks on the same rule: A and B share rank 1, C is 3rd.
    let out = run(&state, &["results", "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ranks"], json!({"org/A-8B": 1, "org/B-8B": 1, "org/C-8B": 3}), "{doc}");
    assert_eq!(doc["rankings"][0]["standings"][0]["rank_label"], "1=");
    let (header, rows) = csv_rows(&stdout(&run(&state, &["results", "--csv"])));
    let column = |name: &str| header.iter().position(|h| h == name).unwrap_or_else(|| panic!("{name}: {header:?}"));
    let c_row = rows.iter().find(|r| r[0] == "org/C-8B").unwrap();
    assert_eq!(c_row[column("terminal_bench_2_rank")], "3");
    assert_eq!(c_row[column("terminal_bench_2_harbor_version")], "0.25.0");
    assert_eq!(c_row[column("terminal_bench_2_invalid_as_0")], "0.075000");

    // Two models: one row per common task, both treatments of invalid trials.
    let (header, rows) = csv_rows(&stdout(&run(&state, &["compare", "org/A-8B", "org/C-8B", "--csv"])));
    assert_eq!(
        header[..7],
        ["benchmark", "a", "b", "task", "a_invalid_as_0", "b_invalid_as_0", "difference_invalid_as_0"]
    );
    assert_eq!(rows.len(), 40);
    assert_eq!(rows[4][3..7], ["t04", "1.000000", "0.000000", "1.000000"]);

    // A partial-credit benchmark ranks nobody; a model named twice is refused.
    let out = run(&state, &["compare", "org/A-8B", "org/B-8B", "org/C-8B", "--benchmark", "dev_set_v2"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("not a ranked benchmark"), "{}", stderr(&out));
    let out = run(&state, &["compare", "org/A-8B", "org/A-8B"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// Issue 35's reference check: a ledger with known per-task rewards (two models, three attempts
/// per task, one invalid trial) gives, through `results --json` and `compare --json`, the clustered
/// SE, the bootstrap interval, pass@k and the paired difference that the computation written here
/// gives.
#[test]
fn statistics_through_the_ledger_match_a_reference_computation() {
    const TASKS: usize = 12;
    // Per task, A's and B's three rewards; A's task 5 attempt 3 is invalid.
    let a_rewards: [[f64; 3]; TASKS] = [
        [1.0, 1.0, 1.0],
        [1.0, 0.0, 1.0],
        [0.0, 0.0, 0.0],
        [1.0, 1.0, 0.0],
        [0.0, 1.0, 0.0],
        [1.0, 1.0, 0.0],
        [0.0, 0.0, 0.0],
        [1.0, 1.0, 1.0],
        [0.0, 0.0, 1.0],
        [1.0, 1.0, 1.0],
        [0.0, 0.0, 0.0],
        [1.0, 0.0, 0.0],
    ];
    let b_rewards: [[f64; 3]; TASKS] = [
        [1.0, 0.0, 1.0],
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [1.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [1.0, 1.0, 1.0],
        [0.0, 0.0, 0.0],
        [1.0, 0.0, 1.0],
        [0.0, 0.0, 0.0],
        [1.0, 1.0, 0.0],
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
    ];
    let invalid = (5, 2);
    let trials = |rewards: &[[f64; 3]; TASKS], invalid: Option<(usize, usize)>| -> Vec<Trial> {
        let mut out = Vec::new();
        for (task, row) in rewards.iter().enumerate() {
            for (attempt, reward) in row.iter().enumerate() {
                let valid = invalid != Some((task, attempt));
                let reward = if valid { *reward } else { 0.0 };
                out.push(Trial { task: format!("t{task:02}"), attempt: attempt as u32 + 1, reward, valid });
            }
        }
        out
    };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    finished_with(&state, "org/A-8B", trials(&a_rewards, Some(invalid)));
    finished_with(&state, "org/B-8B", trials(&b_rewards, None));

    // The reference, "invalid as 0": per task the sum over its three attempts.
    let a_sums: Vec<f64> =
        (0..TASKS).map(|t| (0..3).map(|i| if (t, i) == invalid { 0.0 } else { a_rewards[t][i] }).sum()).collect();
    let b_sums: Vec<f64> = b_rewards.iter().map(|r| r.iter().sum()).collect();
    let mean = a_sums.iter().sum::<f64>() / (3 * TASKS) as f64;
    let g = TASKS as f64;
    let cr1 = (g / (g - 1.0) * a_sums.iter().map(|s| (s - 3.0 * mean).powi(2)).sum::<f64>()).sqrt() / (3.0 * g);
    // Percentile bootstrap (type 7) of `statistic` over 2,000 resamples of the tasks, seed 35.
    let bootstrap = |statistic: &dyn Fn(&[usize]) -> f64| -> (f64, f64) {
        let mut rng = fastrand::Rng::with_seed(35);
        let mut values: Vec<f64> = (0..2000)
            .map(|_| {
                let draw: Vec<usize> = (0..TASKS).map(|_| rng.usize(..TASKS)).collect();
                statistic(&draw)
            })
            .collect();
        values.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let p = q * 1999.0;
            values[p.floor() as usize] + (values[p.ceil() as usize] - values[p.floor() as usize]) * p.fract()
        };
        (at(0.025), at(0.975))
    };
    let interval = bootstrap(&|draw| draw.iter().map(|&t| a_sums[t]).sum::<f64>() / (3 * draw.len()) as f64);
    // pass@2 would need k = 2 columns; results reports pass@k for k = attempts per task = 3:
    // a task passes when any attempt passed (the invalid one counts as failed).
    let pass_at_3 = a_sums.iter().filter(|s| **s > 0.0).count() as f64 / g;
    let differences: Vec<f64> = (0..TASKS).map(|t| (a_sums[t] - b_sums[t]) / 3.0).collect();
    let mean_difference = differences.iter().sum::<f64>() / g;
    let paired = bootstrap(&|draw| draw.iter().map(|&t| differences[t]).sum::<f64>() / draw.len() as f64);

    let close = |actual: &Value, expected: f64| {
        let actual = actual.as_f64().unwrap_or_else(|| panic!("not a number: {actual}"));
        assert!((actual - expected).abs() < 1e-12, "{actual} is not {expected}");
    };
    let out = run(&state, &["results", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cell = doc["cells"].as_array().unwrap().iter().find(|c| c["model"] == "org/A-8B").unwrap();
    let zero = &cell["trials"]["estimates"][0];
    assert_eq!(zero["label"], "invalid as 0");
    close(&zero["mean"], mean);
    close(&zero["clustered_se"], cr1);
    close(&zero["interval"]["lower"], interval.0);
    close(&zero["interval"]["upper"], interval.1);
    assert_eq!(cell["trials"]["pass_at_k"][0], 3);
    close(&cell["trials"]["pass_at_k"][1], pass_at_3);
    close(&cell["trials"]["estimates"][1]["mean"], a_sums.iter().sum::<f64>() / (3 * TASKS - 1) as f64);

    let out = run(&state, &["compare", "org/A-8B", "org/B-8B", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let primary = &doc["benchmarks"][0]["comparisons"][0];
    close(&primary["mean_difference"], mean_difference);
    close(&primary["interval"]["lower"], paired.0);
    close(&primary["interval"]["upper"], paired.1);
    assert!(primary["mcnemar"].is_null(), "three attempts per task: no McNemar");
}
