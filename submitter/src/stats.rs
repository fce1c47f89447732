//! Statistics over per-trial facts (docs/results.md "Statistics"): the two labelled means, a
//! task-clustered standard error, a seeded bootstrap interval over tasks, the unbiased pass@k, a
//! paired comparison of two runs on their common tasks, the exact McNemar test, and the ranking of
//! several models with ties where their intervals overlap ([`ranking`]). Pure: no I/O, no
//! clock; the same trials and seed give the same numbers.
//!
//! Why clustered: the attempts of one task are correlated (an easy task is solved on every attempt),
//! so the task, not the trial, is the independent unit; the standard error and every resample are
//! taken over tasks.

use std::collections::BTreeMap;

use serde::Serialize;

pub mod ranking;
pub use ranking::{Contender, IntervalBasis, Standing, rank};

/// One trial as the ledger keeps it (docs/ledger.md "trials").
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Trial {
    pub task: String,
    /// 1, 2, … within the task.
    pub attempt: u32,
    pub reward: f64,
    /// Harbor's verdict on whether the reward counts (an infrastructure error makes it invalid).
    pub valid: bool,
}

/// What an invalid trial contributes: Harbor 0.25 counted it as 0, Harbor 0.26 drops it. Both are
/// reported, labelled, so a run with many infrastructure errors cannot look better than it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InvalidTrials {
    CountedAsZero,
    Dropped,
}

impl InvalidTrials {
    pub const BOTH: [Self; 2] = [Self::CountedAsZero, Self::Dropped];

    pub fn label(self) -> &'static str {
        match self {
            Self::CountedAsZero => "invalid as 0",
            Self::Dropped => "invalid dropped",
        }
    }

    /// The reward a trial contributes, or `None` when it does not count at all.
    fn reward(self, trial: &Trial) -> Option<f64> {
        match (trial.valid, self) {
            (true, _) => Some(trial.reward),
            (false, Self::CountedAsZero) => Some(0.0),
            (false, Self::Dropped) => None,
        }
    }
}

/// The resampling that gives every interval: seeded, so a result printed twice is the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Bootstrap {
    pub seed: u64,
    pub(crate) resamples: usize,
}

impl Default for Bootstrap {
    fn default() -> Self {
        Self { seed: 35, resamples: 2000 }
    }
}

/// Two-sided 95% percentile interval.
pub(crate) const CONFIDENCE: f64 = 0.95;

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Interval {
    pub lower: f64,
    pub upper: f64,
}

impl Interval {
    pub(crate) fn spans_zero(self) -> bool {
        self.lower <= 0.0 && self.upper >= 0.0
    }
}

/// A run's mean under one treatment of invalid trials.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    pub invalid_trials: InvalidTrials,
    pub label: &'static str,
    pub mean: f64,
    /// `None` with fewer than two tasks (no spread to estimate).
    pub clustered_se: Option<f64>,
    pub interval: Option<Interval>,
    pub tasks: usize,
    pub trials: usize,
}

/// Per task: the sum of its counted rewards and how many counted, in task order.
fn clusters(trials: &[Trial], policy: InvalidTrials) -> BTreeMap<&str, (f64, usize)> {
    let mut by_task: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for trial in trials {
        if let Some(reward) = policy.reward(trial) {
            let entry = by_task.entry(trial.task.as_str()).or_default();
            entry.0 += reward;
            entry.1 += 1;
        }
    }
    by_task
}

fn pooled_mean(clusters: &[(f64, usize)]) -> f64 {
    let (sum, count) = clusters.iter().fold((0.0, 0usize), |(s, n), (cs, cn)| (s + cs, n + cn));
    sum / count as f64
}

/// Cluster-robust (CR1) standard error of the pooled mean: `sqrt(G/(G-1) · Σ_g (S_g − n_g·μ)²) / N`.
/// With one trial per task this is the ordinary `s/√n`.
pub fn clustered_se(clusters: &[(f64, usize)]) -> Option<f64> {
    let groups = clusters.len();
    if groups < 2 {
        return None;
    }
    let mean = pooled_mean(clusters);
    let total: usize = clusters.iter().map(|(_, n)| n).sum();
    let squares: f64 = clusters.iter().map(|(sum, n)| (sum - *n as f64 * mean).powi(2)).sum();
    let g = groups as f64;
    Some((g / (g - 1.0) * squares).sqrt() / total as f64)
}

/// Linear-interpolated quantile (R's type 7) of sorted values.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let position = q * (sorted.len() - 1) as f64;
    let below = position.floor() as usize;
    let above = position.ceil() as usize;
    sorted[below] + (sorted[above] - sorted[below]) * (position - below as f64)
}

/// Percentile interval of `statistic` over resamples of `units` drawn with replacement.
fn bootstrap_interval<T>(units: &[T], bootstrap: Bootstrap, statistic: impl Fn(&[&T]) -> f64) -> Option<Interval> {
    if units.len() < 2 || bootstrap.resamples < 2 {
        return None;
    }
    let mut rng = fastrand::Rng::with_seed(bootstrap.seed);
    let mut draw = Vec::with_capacity(units.len());
    let mut values: Vec<f64> = (0..bootstrap.resamples)
        .map(|_| {
            draw.clear();
            draw.extend((0..units.len()).map(|_| &units[rng.usize(..units.len())]));
            statistic(&draw)
        })
        .collect();
    values.sort_by(f64::total_cmp);
    let tail = (1.0 - CONFIDENCE) / 2.0;
    Some(Interval { lower: quantile(&values, tail), upper: quantile(&values, 1.0 - tail) })
}

/// The run's mean under `policy` with its clustered SE and bootstrap interval over tasks; `None`
/// when no trial counts.
pub(crate) fn estimate(trials: &[Trial], policy: InvalidTrials, bootstrap: Bootstrap) -> Option<Estimate> {
    let clusters: Vec<(f64, usize)> = clusters(trials, policy).into_values().collect();
    if clusters.is_empty() {
        return None;
    }
    let interval = bootstrap_interval(&clusters, bootstrap, |draw| {
        let (sum, count) = draw.iter().fold((0.0, 0usize), |(s, n), (cs, cn)| (s + cs, n + cn));
        sum / count as f64
    });
    Some(Estimate {
        invalid_trials: policy,
        label: policy.label(),
        mean: pooled_mean(&clusters),
        clustered_se: clustered_se(&clusters),
        interval,
        tasks: clusters.len(),
        trials: clusters.iter().map(|(_, n)| n).sum(),
    })
}

/// True when every valid reward is 0 or 1 (invalid trials count as failures either way).
pub fn binary(trials: &[Trial]) -> bool {
    trials.iter().filter(|t| t.valid).all(|t| t.reward == 0.0 || t.reward == 1.0)
}

/// The number of attempts every task has, when all have the same number.
pub(crate) fn attempts_per_task(trials: &[Trial]) -> Option<usize> {
    let counts = clusters(trials, InvalidTrials::CountedAsZero);
    let mut sizes = counts.values().map(|(_, n)| *n);
    let first = sizes.next()?;
    sizes.all(|n| n == first).then_some(first)
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum StatsError {
    #[error("pass@k needs binary rewards (0 or 1); this run has partial credit")]
    NotBinary,
    #[error("pass@{k} needs at least {k} attempts per task; task `{task}` has {n}")]
    TooFewAttempts { k: usize, task: String, n: usize },
    #[error("pass@k needs k ≥ 1 and at least one task")]
    Empty,
}

/// The unbiased estimator for one task with `n` attempts of which `correct` passed:
/// `1 − C(n−c, k)/C(n, k)`, computed as the product `Π_{i=n−c+1}^{n} (1 − k/i)` so no binomial
/// coefficient overflows.
pub(crate) fn pass_at_k_task(n: usize, correct: usize, k: usize) -> f64 {
    if n - correct < k {
        return 1.0;
    }
    1.0 - ((n - correct + 1)..=n).map(|i| 1.0 - k as f64 / i as f64).product::<f64>()
}

/// pass@k over the run's tasks (their mean); an invalid trial is a failed attempt.
pub fn pass_at_k(trials: &[Trial], k: usize) -> Result<f64, StatsError> {
    if !binary(trials) {
        return Err(StatsError::NotBinary);
    }
    let mut tasks: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for trial in trials {
        let entry = tasks.entry(trial.task.as_str()).or_default();
        entry.0 += 1;
        entry.1 += usize::from(trial.valid && trial.reward == 1.0);
    }
    if k == 0 || tasks.is_empty() {
        return Err(StatsError::Empty);
    }
    let mut total = 0.0;
    for (task, (n, correct)) in &tasks {
        if *n < k {
            return Err(StatsError::TooFewAttempts { k, task: (*task).to_string(), n: *n });
        }
        total += pass_at_k_task(*n, *correct, k);
    }
    Ok(total / tasks.len() as f64)
}

/// Exact two-sided McNemar p-value from the discordant pairs: `b` tasks only the first run solved,
/// `c` only the second. Under no difference each discordant task is a fair coin, so
/// `p = min(1, 2·P(X ≤ min(b, c)))` with `X ~ Binomial(b + c, ½)`.
pub(crate) fn mcnemar_exact(b: u64, c: u64) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    // Σ C(n, i) / 2^n for i ≤ min(b, c), with each term built from the previous in log-free form.
    let mut term = 0.5f64.powi(i32::try_from(n).unwrap_or(i32::MAX));
    let mut tail = term;
    for i in 1..=b.min(c) {
        term *= (n - i + 1) as f64 / i as f64;
        tail += term;
    }
    (2.0 * tail).min(1.0)
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TaskDifference {
    pub task: String,
    pub a: f64,
    pub b: f64,
    /// `a − b`.
    pub difference: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct McNemar {
    /// Tasks only A solved.
    pub a_only: u64,
    /// Tasks only B solved.
    pub b_only: u64,
    pub p_value: f64,
}

/// Two runs on the tasks both ran: per-task means under one treatment of invalid trials.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PairedComparison {
    pub invalid_trials: InvalidTrials,
    pub tasks: Vec<TaskDifference>,
    /// Mean of the per-task differences (A − B).
    pub(crate) mean_difference: f64,
    /// Paired bootstrap over the common tasks.
    pub interval: Option<Interval>,
    /// Tasks where A scored higher (for one binary attempt: A solved, B did not).
    pub a_better: Vec<String>,
    pub(crate) b_better: Vec<String>,
    /// Only with binary rewards and one attempt per task in both runs.
    pub mcnemar: Option<McNemar>,
    pub(crate) only_in_a: usize,
    pub(crate) only_in_b: usize,
}

fn task_means(trials: &[Trial], policy: InvalidTrials) -> BTreeMap<&str, f64> {
    clusters(trials, policy).into_iter().map(|(task, (sum, n))| (task, sum / n as f64)).collect()
}

/// Compares A with B on the tasks both ran; `None` when they share no task.
pub(crate) fn paired(
    a: &[Trial],
    b: &[Trial],
    policy: InvalidTrials,
    bootstrap: Bootstrap,
) -> Option<PairedComparison> {
    let a_means = task_means(a, policy);
    let b_means = task_means(b, policy);
    let tasks: Vec<TaskDifference> = a_means
        .iter()
        .filter_map(|(task, a_mean)| {
            b_means.get(task).map(|b_mean| TaskDifference {
                task: (*task).to_string(),
                a: *a_mean,
                b: *b_mean,
                difference: a_mean - b_mean,
            })
        })
        .collect();
    if tasks.is_empty() {
        return None;
    }
    let differences: Vec<f64> = tasks.iter().map(|t| t.difference).collect();
    let mean = |draw: &[&f64]| draw.iter().copied().sum::<f64>() / draw.len() as f64;
    let mean_difference = differences.iter().sum::<f64>() / differences.len() as f64;
    let interval = bootstrap_interval(&differences, bootstrap, mean);
    let flipped = |keep: fn(f64) -> bool| -> Vec<String> {
        tasks.iter().filter(|t| keep(t.difference)).map(|t| t.task.clone()).collect()
    };
    let a_better = flipped(|d| d > 0.0);
    let b_better = flipped(|d| d < 0.0);
    let one_binary_attempt = |trials: &[Trial]| binary(trials) && attempts_per_task(trials) == Some(1);
    let mcnemar = (one_binary_attempt(a) && one_binary_attempt(b)).then(|| {
        let (a_only, b_only) = (a_better.len() as u64, b_better.len() as u64);
        McNemar { a_only, b_only, p_value: mcnemar_exact(a_only, b_only) }
    });
    Some(PairedComparison {
        invalid_trials: policy,
        only_in_a: a_means.len() - tasks.len(),
        only_in_b: b_means.len() - tasks.len(),
        tasks,
        mean_difference,
        interval,
        a_better,
        b_better,
        mcnemar,
    })
}

/// A difference of means in percentage points, signed (`+3.4`).
pub fn points(x: f64) -> String {
    format!("{:+.1}", 100.0 * x)
}

/// The one-line verdict: a difference only when the interval excludes 0.
pub fn verdict(comparison: &PairedComparison, a: &str, b: &str) -> String {
    match comparison.interval {
        None => {
            format!("no detectable difference: {} common task(s) are too few for an interval", comparison.tasks.len())
        }
        Some(interval) if interval.spans_zero() => format!(
            "no detectable difference between {a} and {b}: {} points, 95% interval [{}, {}] spans 0",
            points(comparison.mean_difference),
            points(interval.lower),
            points(interval.upper)
        ),
        Some(interval) => {
            let (better, worse) = if comparison.mean_difference > 0.0 { (a, b) } else { (b, a) };
            format!(
                "{better} scores higher than {worse}: {} points (A − B), 95% interval [{}, {}] excludes 0",
                points(comparison.mean_difference),
                points(interval.lower),
                points(interval.upper)
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(task: &str, attempt: u32, reward: f64, valid: bool) -> Trial {
        Trial { task: task.to_string(), attempt, reward, valid }
    }

    /// One attempt per task, binary, valid.
    fn run(rewards: &[(&str, f64)]) -> Vec<Trial> {
        rewards.iter().map(|(task, reward)| trial(task, 1, *reward, true)).collect()
    }

    fn close(actual: f64, expected: f64, tolerance: f64) {
        assert!((actual - expected).abs() <= tolerance, "{actual} is not within {tolerance} of {expected}");
    }

    /// Three tasks × several attempts, one invalid trial.
    fn clustered_run() -> Vec<Trial> {
        vec![
            trial("t1", 1, 1.0, true),
            trial("t1", 2, 1.0, true),
            trial("t1", 3, 1.0, true),
            trial("t2", 1, 0.0, true),
            trial("t2", 2, 1.0, true),
            trial("t2", 3, 0.0, false),
            trial("t3", 1, 0.0, true),
            trial("t3", 2, 0.0, true),
            trial("t3", 3, 0.0, true),
        ]
    }

    #[test]
    fn both_means_are_labelled_and_differ_by_the_invalid_trial() {
        let trials = clustered_run();
        let zero = estimate(&trials, InvalidTrials::CountedAsZero, Bootstrap::default()).unwrap();
        let dropped = estimate(&trials, InvalidTrials::Dropped, Bootstrap::default()).unwrap();
        close(zero.mean, 4.0 / 9.0, 1e-12);
        close(dropped.mean, 4.0 / 8.0, 1e-12);
        assert_eq!((zero.trials, dropped.trials), (9, 8));
        assert_eq!(zero.label, "invalid as 0");
        assert_eq!(dropped.label, "invalid dropped");
    }

    #[test]
    fn clustered_se_matches_a_hand_computation_and_exceeds_the_naive_one() {
        let trials = clustered_run();
        let zero = estimate(&trials, InvalidTrials::CountedAsZero, Bootstrap::default()).unwrap();
        // Reference: μ = 4/9; task sums 3, 1, 0 over 3 trials each; residual sums 3 − 4/3, 1 − 4/3,
        // 0 − 4/3; SE = sqrt(3/2 · Σ r²) / 9.
        let mu = 4.0 / 9.0;
        let residuals: [f64; 3] = [3.0 - 3.0 * mu, 1.0 - 3.0 * mu, -3.0 * mu];
        let reference = (1.5 * residuals.iter().map(|r| r * r).sum::<f64>()).sqrt() / 9.0;
        close(zero.clustered_se.unwrap(), reference, 1e-12);
        // Independent-trials SE (s/√N) is smaller: the correlation within tasks is what it misses.
        let values = [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0];
        let variance = values.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / 8.0;
        assert!(zero.clustered_se.unwrap() > (variance / 9.0).sqrt());
    }

    #[test]
    fn clustered_se_with_one_trial_per_task_is_the_ordinary_standard_error() {
        let rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0];
        let names: Vec<String> = (0..rewards.len()).map(|i| format!("t{i}")).collect();
        let trials: Vec<Trial> = names.iter().zip(rewards).map(|(n, r)| trial(n, 1, r, true)).collect();
        let se = estimate(&trials, InvalidTrials::CountedAsZero, Bootstrap::default()).unwrap().clustered_se.unwrap();
        let mean = 0.6;
        let s2 = rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / 9.0;
        close(se, (s2 / 10.0).sqrt(), 1e-12);
    }

    #[test]
    fn bootstrap_is_reproducible_by_seed_and_close_to_the_normal_interval() {
        // 60 tasks, 2 attempts each, rewards varying by task.
        let trials: Vec<Trial> = (0..60)
            .flat_map(|t| {
                let name = format!("task{t:02}");
                [
                    trial(&name, 1, f64::from(u8::from(t % 3 != 0)), true),
                    trial(&name, 2, f64::from(u8::from(t % 2 == 0)), true),
                ]
            })
            .collect();
        let bootstrap = Bootstrap { seed: 7, resamples: 4000 };
        let first = estimate(&trials, InvalidTrials::CountedAsZero, bootstrap).unwrap();
        let again = estimate(&trials, InvalidTrials::CountedAsZero, bootstrap).unwrap();
        assert_eq!(first, again);
        let other = estimate(&trials, InvalidTrials::CountedAsZero, Bootstrap { seed: 8, ..bootstrap }).unwrap();
        assert_ne!(first.interval, other.interval);
        // The percentile interval of a mean over 60 clusters is close to mean ± 1.96·SE.
        let se = first.clustered_se.unwrap();
        let interval = first.interval.unwrap();
        close(interval.lower, first.mean - 1.96 * se, 0.35 * se);
        close(interval.upper, first.mean + 1.96 * se, 0.35 * se);
    }

    #[test]
    fn pass_at_k_is_the_unbiased_estimator() {
        // Reference with binomial coefficients: task t1 3/3, t2 1/3 (the invalid is a failure), t3 0/3.
        fn choose(n: u64, k: u64) -> f64 {
            if k > n {
                return 0.0;
            }
            (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
        }
        let reference = |k: u64| {
            [(3u64, 3u64), (3, 1), (3, 0)].iter().map(|(n, c)| 1.0 - choose(n - c, k) / choose(*n, k)).sum::<f64>()
                / 3.0
        };
        let trials = clustered_run();
        for k in 1..=3 {
            close(pass_at_k(&trials, k).unwrap(), reference(k as u64), 1e-12);
        }
        close(pass_at_k(&trials, 1).unwrap(), 4.0 / 9.0, 1e-12);
        assert_eq!(pass_at_k(&trials, 4), Err(StatsError::TooFewAttempts { k: 4, task: "t1".into(), n: 3 }));
        // Large n: the product form does not overflow.
        close(pass_at_k_task(200, 10, 100), 1.0 - choose(190, 100) / choose(200, 100), 1e-9);
        let partial = vec![trial("t", 1, 0.5, true)];
        assert_eq!(pass_at_k(&partial, 1), Err(StatsError::NotBinary));
    }

    #[test]
    fn mcnemar_matches_textbook_values() {
        // b = 1, c = 10: 2 · (1 + 11) / 2^11 = 0.01171875.
        close(mcnemar_exact(1, 10), 0.011_718_75, 1e-12);
        close(mcnemar_exact(10, 1), 0.011_718_75, 1e-12);
        // b = 3, c = 3: symmetric, p = 1. b = 0, c = 5: 2/32.
        close(mcnemar_exact(3, 3), 1.0, 1e-12);
        close(mcnemar_exact(0, 5), 0.0625, 1e-12);
        close(mcnemar_exact(0, 0), 1.0, 0.0);
        // b = 2, c = 12: 2 · (1 + 14 + 91) / 2^14.
        close(mcnemar_exact(2, 12), 2.0 * 106.0 / 16384.0, 1e-12);
    }

    #[test]
    fn paired_comparison_names_the_flipped_tasks_and_runs_mcnemar() {
        let names: Vec<String> = (0..40).map(|i| format!("t{i:02}")).collect();
        // A solves every task; B fails t00..t11 and additionally solves nothing A misses.
        let a: Vec<Trial> = names.iter().map(|n| trial(n, 1, 1.0, true)).collect();
        let b: Vec<Trial> =
            names.iter().enumerate().map(|(i, n)| trial(n, 1, f64::from(u8::from(i >= 12)), true)).collect();
        let cmp = paired(&a, &b, InvalidTrials::CountedAsZero, Bootstrap::default()).unwrap();
        close(cmp.mean_difference, 12.0 / 40.0, 1e-12);
        assert_eq!(cmp.a_better, names[..12].to_vec());
        assert!(cmp.b_better.is_empty());
        let mcnemar = cmp.mcnemar.unwrap();
        assert_eq!((mcnemar.a_only, mcnemar.b_only), (12, 0));
        close(mcnemar.p_value, 2.0 / 4096.0, 1e-15);
        assert!(!cmp.interval.unwrap().spans_zero());
        let line = verdict(&cmp, "A", "B");
        assert!(line.starts_with("A scores higher than B: +30.0 points"), "{line}");
    }

    #[test]
    fn paired_comparison_without_a_real_difference_says_so() {
        let names: Vec<String> = (0..30).map(|i| format!("t{i:02}")).collect();
        // Same 15/30 solved; two tasks swapped each way.
        let a: Vec<Trial> =
            names.iter().enumerate().map(|(i, n)| trial(n, 1, f64::from(u8::from(i < 15)), true)).collect();
        let mut b = a.clone();
        for (i, reward) in [(0, 0.0), (1, 0.0), (20, 1.0), (21, 1.0)] {
            b[i].reward = reward;
        }
        let cmp = paired(&a, &b, InvalidTrials::CountedAsZero, Bootstrap::default()).unwrap();
        close(cmp.mean_difference, 0.0, 1e-12);
        assert_eq!(cmp.a_better, ["t00", "t01"]);
        assert_eq!(cmp.b_better, ["t20", "t21"]);
        close(cmp.mcnemar.unwrap().p_value, 1.0, 1e-12);
        assert!(verdict(&cmp, "A", "B").starts_with("no detectable difference"));
    }

    #[test]
    fn paired_comparison_uses_only_common_tasks_and_a_paired_bootstrap() {
        let a = run(&[("x", 1.0), ("y", 0.0), ("z", 1.0), ("only-a", 1.0)]);
        let b = run(&[("x", 0.0), ("y", 0.0), ("z", 1.0), ("only-b", 0.0)]);
        let bootstrap = Bootstrap { seed: 3, resamples: 500 };
        let cmp = paired(&a, &b, InvalidTrials::CountedAsZero, bootstrap).unwrap();
        assert_eq!((cmp.only_in_a, cmp.only_in_b, cmp.tasks.len()), (1, 1, 3));
        // Reference paired bootstrap: resample the three differences (1, 0, 0) with the same draws.
        let differences = [1.0, 0.0, 0.0];
        let mut rng = fastrand::Rng::with_seed(3);
        let mut means: Vec<f64> =
            (0..500).map(|_| (0..3).map(|_| differences[rng.usize(..3)]).sum::<f64>() / 3.0).collect();
        means.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let p = q * 499.0;
            means[p.floor() as usize] + (means[p.ceil() as usize] - means[p.floor() as usize]) * p.fract()
        };
        let interval = cmp.interval.unwrap();
        close(interval.lower, at(0.025), 1e-12);
        close(interval.upper, at(0.975), 1e-12);
        // Several attempts: no McNemar.
        let multi = vec![trial("x", 1, 1.0, true), trial("x", 2, 0.0, true)];
        let cmp = paired(&multi, &b, InvalidTrials::CountedAsZero, bootstrap).unwrap();
        assert!(cmp.mcnemar.is_none());
        assert!(paired(&run(&[("p", 1.0)]), &run(&[("q", 1.0)]), InvalidTrials::Dropped, bootstrap).is_none());
    }
}
