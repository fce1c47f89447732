//! `submitter compare A B`: two models paired on the tasks both ran, per benchmark column
//! (docs/results.md "Comparing two runs", docs/submitter.md "compare"). Each model's newest
//! finished attempt with per-trial facts (the ledger's `trials`) is compared; the numbers come from
//! [`crate::stats`].

use serde::Serialize;

use crate::ledger::{Attempt, Ledger, LedgerError};
use crate::stats::{self, Bootstrap, InvalidTrials, PairedComparison, points};

use super::VerifySettings;
use super::results::{
    BenchmarkRanking, Scorings, attach_trials, build_matrix, column_of, csv_document, csv_number, csv_text,
    finished_attempts,
};

/// One benchmark column compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchmarkComparison {
    pub benchmark: String,
    pub(crate) a_attempt: i64,
    pub(crate) b_attempt: i64,
    pub a_harbor_version: Option<String>,
    pub(crate) b_harbor_version: Option<String>,
    /// Under "invalid as 0" (the verdict's) and "invalid dropped".
    pub comparisons: Vec<PairedComparison>,
    pub verdict: String,
}

/// A column one of the models lacks facts for, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Skipped {
    pub benchmark: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub a: String,
    pub b: String,
    pub bootstrap: Bootstrap,
    pub(crate) confidence: f64,
    pub benchmarks: Vec<BenchmarkComparison>,
    pub skipped: Vec<Skipped>,
}

/// The newest finished attempt of `model` in each column, `benchmark` (a column, family or
/// benchmark name) narrowing them.
fn newest_per_column<'a>(
    attempts: &'a [Attempt],
    model: &str,
    benchmark: Option<&str>,
) -> std::collections::BTreeMap<String, &'a Attempt> {
    let mut newest: std::collections::BTreeMap<String, &Attempt> = std::collections::BTreeMap::new();
    for attempt in attempts.iter().filter(|a| a.model == model) {
        let column = column_of(attempt);
        if benchmark.is_some_and(|b| b != column && b != attempt.benchmark && b != attempt.benchmark_family) {
            continue;
        }
        let slot = newest.entry(column).or_insert(attempt);
        if (attempt.submitted_at, attempt.id.0) > (slot.submitted_at, slot.id.0) {
            *slot = attempt;
        }
    }
    newest
}

/// Compares `a` with `b` on every column both have a finished attempt in.
pub fn compare(
    ledger: &dyn Ledger,
    a: &str,
    b: &str,
    benchmark: Option<&str>,
    bootstrap: Bootstrap,
) -> Result<Comparison, LedgerError> {
    let attempts = finished_attempts(ledger)?;
    let a_columns = newest_per_column(&attempts, a, benchmark);
    let b_columns = newest_per_column(&attempts, b, benchmark);
    let mut out = Comparison {
        a: a.to_string(),
        b: b.to_string(),
        bootstrap,
        confidence: stats::CONFIDENCE,
        benchmarks: Vec::new(),
        skipped: Vec::new(),
    };
    for (column, a_attempt) in &a_columns {
        let Some(b_attempt) = b_columns.get(column) else { continue };
        let (Some(a_set), Some(b_set)) = (ledger.trials(a_attempt.id)?, ledger.trials(b_attempt.id)?) else {
            out.skipped.push(Skipped {
                benchmark: column.clone(),
                reason: "no per-trial facts for one of the attempts (synced before they were stored, or imported)"
                    .to_string(),
            });
            continue;
        };
        let comparisons: Vec<PairedComparison> = InvalidTrials::BOTH
            .iter()
            .filter_map(|policy| stats::paired(&a_set.trials, &b_set.trials, *policy, bootstrap))
            .collect();
        let Some(primary) = comparisons.first() else {
            out.skipped.push(Skipped { benchmark: column.clone(), reason: "no task in common".to_string() });
            continue;
        };
        out.benchmarks.push(BenchmarkComparison {
            benchmark: column.clone(),
            a_attempt: a_attempt.id.0,
            b_attempt: b_attempt.id.0,
            a_harbor_version: a_set.harbor_version,
            b_harbor_version: b_set.harbor_version,
            verdict: stats::verdict(primary, a, b),
            comparisons,
        });
    }
    Ok(out)
}

/// `compare` with three or more models: each ranked benchmark's ranking over them
/// (docs/results.md "Ranking several models").
#[derive(Debug, Clone, PartialEq)]
pub struct Ranking {
    pub models: Vec<String>,
    pub bootstrap: Bootstrap,
    pub rankings: Vec<BenchmarkRanking>,
    /// Per ranking, the named models with no score on its benchmark.
    pub unranked: Vec<(String, Vec<String>)>,
}

/// Ranks `models` on every ranked benchmark column they have results in (their newest finished
/// attempt each, as `results` shows), `benchmark` narrowing the columns as in [`compare`].
pub fn rank_models(
    ledger: &dyn Ledger,
    models: &[String],
    benchmark: Option<&str>,
    settings: &VerifySettings,
    scorings: &Scorings,
    bootstrap: Bootstrap,
) -> Result<Ranking, LedgerError> {
    let attempts: Vec<Attempt> = finished_attempts(ledger)?
        .into_iter()
        .filter(|a| models.contains(&a.model))
        .filter(|a| benchmark.is_none_or(|b| b == column_of(a) || b == a.benchmark || b == a.benchmark_family))
        .collect();
    let mut matrix = build_matrix(&attempts, None, settings, scorings).expect("no rank_by given: nothing to refuse");
    attach_trials(&mut matrix, ledger, bootstrap)?;
    let unranked = matrix
        .rankings
        .iter()
        .map(|r| {
            let missing = models.iter().filter(|m| !r.standings.iter().any(|s| &&s.model == m)).cloned().collect();
            (r.benchmark.clone(), missing)
        })
        .collect();
    Ok(Ranking { models: models.to_vec(), bootstrap, rankings: matrix.rankings, unranked })
}

/// The rankings for people: per benchmark, the models in ranking order with the interval each was
/// ranked on and whom it is tied with. Names are printed inert ([`crate::text::printable`]).
pub fn render_ranking_text(r: &Ranking) -> String {
    use crate::text::printable;
    let mut out = String::new();
    for (ranking, (_, missing)) in r.rankings.iter().zip(&r.unranked) {
        out += &format!(
            "{}: {} model(s) ranked; rank = 1 + models whose 95% interval lies wholly above, = tied (intervals overlap)\n",
            printable(&ranking.benchmark),
            ranking.standings.len()
        );
        let width = ranking.standings.iter().map(|s| printable(&s.model).chars().count()).max().unwrap_or(5).max(5);
        out += &format!("  {:<5} {:<width$}  {:>6}  {:<16}  interval from\n", "rank", "model", "mean", "95% interval");
        for s in &ranking.standings {
            let interval =
                s.interval.map_or("-".to_string(), |i| format!("[{:.1}, {:.1}]", 100.0 * i.lower, 100.0 * i.upper));
            let tied = if s.tied() {
                format!("; tied with {}", s.tied_with.iter().map(|m| printable(m)).collect::<Vec<_>>().join(", "))
            } else {
                String::new()
            };
            out += &format!(
                "  {:<5} {:<width$}  {:>6.1}  {interval:<16}  {}{tied}\n",
                s.rank_label(),
                printable(&s.model),
                100.0 * s.mean,
                s.basis.describe()
            );
        }
        if !missing.is_empty() {
            out += &format!("  no result: {}\n", missing.iter().map(|m| printable(m)).collect::<Vec<_>>().join(", "));
        }
    }
    out
}

/// The rankings as CSV (docs/submitter.md "compare"): one row per (benchmark, model) in ranking
/// order: `benchmark,model,rank,rank_label,position,mean,ci_lower,ci_upper,interval_basis,tied_with`.
pub fn render_ranking_csv(r: &Ranking) -> String {
    let header = [
        "benchmark",
        "model",
        "rank",
        "rank_label",
        "position",
        "mean",
        "ci_lower",
        "ci_upper",
        "interval_basis",
        "tied_with",
    ];
    let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    for ranking in &r.rankings {
        for s in &ranking.standings {
            rows.push(vec![
                csv_text(&ranking.benchmark),
                csv_text(&s.model),
                s.rank.to_string(),
                s.rank_label(),
                s.position.to_string(),
                csv_number(Some(s.mean)),
                csv_number(s.interval.map(|i| i.lower)),
                csv_number(s.interval.map(|i| i.upper)),
                s.basis.describe().to_string(),
                csv_text(&s.tied_with.join("; ")),
            ]);
        }
    }
    csv_document(rows)
}

/// The paired comparison as CSV (docs/submitter.md "compare"): one row per (benchmark, common
/// task): `benchmark,a,b,task`, then per treatment of invalid trials the two per-task means and
/// their difference (`a_invalid_as_0,b_invalid_as_0,difference_invalid_as_0`, the same for
/// `invalid_dropped`, empty where the task has no valid trial).
pub fn render_csv(c: &Comparison) -> String {
    let mut header: Vec<String> = ["benchmark", "a", "b", "task"].iter().map(|h| h.to_string()).collect();
    for policy in InvalidTrials::BOTH {
        let suffix = policy.label().replace(' ', "_");
        header.extend([format!("a_{suffix}"), format!("b_{suffix}"), format!("difference_{suffix}")]);
    }
    let mut rows = vec![header];
    for bench in &c.benchmarks {
        let Some(primary) = bench.comparisons.first() else { continue };
        for task in &primary.tasks {
            let mut row = vec![csv_text(&bench.benchmark), csv_text(&c.a), csv_text(&c.b), csv_text(&task.task)];
            for policy in InvalidTrials::BOTH {
                let same = bench
                    .comparisons
                    .iter()
                    .find(|cmp| cmp.invalid_trials == policy)
                    .and_then(|cmp| cmp.tasks.iter().find(|t| t.task == task.task));
                row.extend([
                    csv_number(same.map(|t| t.a)),
                    csv_number(same.map(|t| t.b)),
                    csv_number(same.map(|t| t.difference)),
                ]);
            }
            rows.push(row);
        }
    }
    csv_document(rows)
}

fn task_list(tasks: &[String]) -> String {
    if tasks.is_empty() { "none".to_string() } else { tasks.join(", ") }
}

/// The comparison for people: per benchmark, the verdict first, then the evidence.
pub(crate) fn render_text(c: &Comparison) -> String {
    let mut out = String::new();
    for bench in &c.benchmarks {
        out.push_str(&format!("{}: {}\n", bench.benchmark, bench.verdict));
        out.push_str(&format!(
            "  attempts {} (Harbor {}) vs {} (Harbor {})\n",
            bench.a_attempt,
            bench.a_harbor_version.as_deref().unwrap_or("?"),
            bench.b_attempt,
            bench.b_harbor_version.as_deref().unwrap_or("?")
        ));
        for cmp in &bench.comparisons {
            let interval = cmp.interval.map_or("no interval".to_string(), |i| {
                format!("95% interval [{}, {}]", points(i.lower), points(i.upper))
            });
            out.push_str(&format!(
                "  {}: {} common tasks ({} only in A, {} only in B), mean difference A − B {} points, {interval}\n",
                cmp.invalid_trials.label(),
                cmp.tasks.len(),
                cmp.only_in_a,
                cmp.only_in_b,
                points(cmp.mean_difference)
            ));
        }
        let primary = &bench.comparisons[0];
        out.push_str(&format!("  better under {}: {}\n", c.a, task_list(&primary.a_better)));
        out.push_str(&format!("  better under {}: {}\n", c.b, task_list(&primary.b_better)));
        if let Some(m) = primary.mcnemar {
            out.push_str(&format!(
                "  exact McNemar: {} solved only by A, {} only by B, p = {:.4}\n",
                m.a_only, m.b_only, m.p_value
            ));
        }
    }
    for skipped in &c.skipped {
        out.push_str(&format!("{}: not compared — {}\n", skipped.benchmark, skipped.reason));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{AttemptStatus, NewAttempt, SqliteLedger, TrialSet};
    use crate::stats::Trial;

    fn finished(ledger: &dyn Ledger, model: &str, rewards: &[f64], attempts: u32) -> crate::ledger::AttemptId {
        let new = NewAttempt {
            benchmark: "terminal_bench_2".into(),
            model: model.into(),
            cluster: "c".into(),
            username: "u".into(),
            run_tag: format!("tag-{model}"),
            reason: "test".into(),
            config: serde_json::json!({}),
            agent: launch_spec::spec::DEFAULT_AGENT.into(),
        };
        let id = ledger.insert_pending(&new).unwrap();
        ledger
            .transition(id, AttemptStatus::Finished, "finished", Some(&serde_json::json!({"mean_reward": 0.5})))
            .unwrap();
        let trials = rewards
            .iter()
            .enumerate()
            .flat_map(|(i, r)| {
                (1..=attempts).map(move |attempt| Trial { task: format!("t{i:02}"), attempt, reward: *r, valid: true })
            })
            .collect();
        ledger.record_trials(id, &TrialSet { harbor_version: Some("0.25.0".into()), trials }).unwrap();
        id
    }

    #[test]
    fn two_models_with_no_real_difference_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = SqliteLedger::open(&dir.path().join("l.sqlite")).unwrap();
        let a: Vec<f64> = (0..30).map(|i| f64::from(u8::from(i % 2 == 0))).collect();
        let mut b = a.clone();
        b.swap(0, 1);
        b.swap(2, 3);
        finished(&ledger, "org/A-8B", &a, 1);
        finished(&ledger, "org/B-8B", &b, 1);
        let c = compare(&ledger, "org/A-8B", "org/B-8B", None, Bootstrap::default()).unwrap();
        assert_eq!(c.benchmarks.len(), 1);
        let bench = &c.benchmarks[0];
        assert!(bench.verdict.starts_with("no detectable difference"), "{}", bench.verdict);
        assert_eq!(bench.comparisons[0].a_better, ["t00", "t02"]);
        assert_eq!(bench.comparisons[0].b_better, ["t01", "t03"]);
        let text = render_text(&c);
        assert!(text.contains("exact McNemar: 2 solved only by A, 2 only by B, p = 1.0000"), "{text}");
    }

    #[test]
    fn two_models_that_differ_name_the_flipped_tasks() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = SqliteLedger::open(&dir.path().join("l.sqlite")).unwrap();
        let a = vec![1.0; 30];
        let b: Vec<f64> = (0..30).map(|i| f64::from(u8::from(i >= 10))).collect();
        finished(&ledger, "org/A-8B", &a, 3);
        finished(&ledger, "org/B-8B", &b, 3);
        let c = compare(&ledger, "org/A-8B", "org/B-8B", Some("terminal_bench_2"), Bootstrap::default()).unwrap();
        let bench = &c.benchmarks[0];
        assert!(bench.verdict.starts_with("org/A-8B scores higher than org/B-8B: +33.3 points"), "{}", bench.verdict);
        let flipped: Vec<String> = (0..10).map(|i| format!("t{i:02}")).collect();
        assert_eq!(bench.comparisons[0].a_better, flipped);
        assert!(bench.comparisons[0].mcnemar.is_none(), "three attempts per task: no McNemar");
        let text = render_text(&c);
        assert!(text.contains(&format!("better under org/A-8B: {}", flipped.join(", "))), "{text}");
        let none = compare(&ledger, "org/A-8B", "org/B-8B", Some("swebench"), Bootstrap::default()).unwrap();
        assert!(none.benchmarks.is_empty());
    }
}
