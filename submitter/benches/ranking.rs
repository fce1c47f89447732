//! The statistics behind `results`, `compare A B C …` and the report at the team's scale: 200 models
//! on two ranked benchmarks, 89 tasks × 5 attempts each (terminal_bench_2's leaderboard shape).
//! Per result: both means with the clustered SE and a 2,000-resample bootstrap over tasks, pass@5;
//! then each benchmark's ranking and the report's plot of it. Prints the median of a few runs of
//! each step (docs/results.md records them); no target is asserted.
//!
//! `cargo bench -p submitter --bench ranking` (env `RANKING_BENCH_MODELS` to resize).

#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use submitter::ledger::TrialSet;
use submitter::stats::{self, Bootstrap, Contender, IntervalBasis, InvalidTrials, Trial};
use submitter::verify::plots;
use submitter::verify::results::{BenchmarkRanking, TrialStatistics};

const TASKS: usize = 89;
const ATTEMPTS: u32 = 5;

/// A model's trials: its skill sets how many tasks it tends to solve; one trial in 50 is invalid.
fn trials(model: usize, rng: &mut fastrand::Rng) -> Vec<Trial> {
    let skill = 0.2 + 0.5 * (model as f64 / 200.0);
    let mut out = Vec::with_capacity(TASKS * ATTEMPTS as usize);
    for task in 0..TASKS {
        let easy = (task as f64 + 0.5) / TASKS as f64;
        for attempt in 1..=ATTEMPTS {
            let solved = rng.f64() < (skill + 0.4 * (0.5 - easy)).clamp(0.02, 0.98);
            out.push(Trial {
                task: format!("task-{task:03}"),
                attempt,
                reward: f64::from(u8::from(solved)),
                valid: rng.usize(..50) != 0,
            });
        }
    }
    out
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut samples = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs {
        let start = Instant::now();
        last = Some(f());
        samples.push(start.elapsed());
    }
    (median(samples), last.expect("at least one run"))
}

fn main() {
    let models: usize = std::env::var("RANKING_BENCH_MODELS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let mut rng = fastrand::Rng::with_seed(35);
    let sets: Vec<TrialSet> = (0..models * 2)
        .map(|i| TrialSet { harbor_version: Some("0.25.0".into()), trials: trials(i % models, &mut rng) })
        .collect();

    let (per_results, statistics) =
        time(3, || sets.iter().map(|set| TrialStatistics::of(set, Bootstrap::default())).collect::<Vec<_>>());
    let rankings: Vec<BenchmarkRanking> = ["terminal_bench_2", "swebench-verified-random-100-folders"]
        .iter()
        .enumerate()
        .map(|(b, name)| {
            let contenders: Vec<Contender> = (0..models)
                .map(|m| {
                    let e = statistics[b * models + m]
                        .estimates
                        .iter()
                        .find(|e| e.invalid_trials == InvalidTrials::CountedAsZero)
                        .expect("every result has trials");
                    Contender {
                        model: format!("org/Model-{m:03}-8B"),
                        mean: e.mean,
                        interval: e.interval,
                        basis: IntervalBasis::BootstrapOverTasks,
                    }
                })
                .collect();
            BenchmarkRanking { benchmark: name.to_string(), standings: stats::rank(&contenders) }
        })
        .collect();
    let (per_ranking, _) = time(5, || {
        rankings
            .iter()
            .map(|r| {
                let contenders: Vec<Contender> = r
                    .standings
                    .iter()
                    .map(|s| Contender { model: s.model.clone(), mean: s.mean, interval: s.interval, basis: s.basis })
                    .collect();
                stats::rank(&contenders).len()
            })
            .sum::<usize>()
    });
    let (per_plots, bytes) = time(5, || rankings.iter().map(|r| plots::intervals_svg(r).len()).sum::<usize>());
    let tied: usize = rankings[0].standings.iter().filter(|s| s.tied()).count();
    let distinct: std::collections::BTreeSet<usize> = rankings[0].standings.iter().map(|s| s.rank).collect();
    println!(
        "{} results ({models} models × 2 benchmarks, {TASKS} tasks × {ATTEMPTS} attempts): statistics {:.0} ms \
         (both means, clustered SE, 2,000-resample bootstrap, pass@{ATTEMPTS})",
        sets.len(),
        per_results.as_secs_f64() * 1e3
    );
    println!(
        "rankings of both benchmarks: {:.1} ms; their plots: {:.1} ms ({} kB of SVG)",
        per_ranking.as_secs_f64() * 1e3,
        per_plots.as_secs_f64() * 1e3,
        bytes / 1024
    );
    println!("terminal_bench_2: {tied} of {models} models tied with another; {} distinct ranks", distinct.len());
}
