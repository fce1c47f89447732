//! Ledger speed on the planner's query. For 10k / 100k / 1M attempt rows spread over 1,000 models ×
//! 3 benchmark families (3,000 pairs, as a planner run over ~1,000 models × 3 presets sees them):
//! fill time (bulk import, one transaction per 50k rows), the median of `latest_per_pair()` (target
//! ≤ 1 s at 100k), and the median `insert_pending` on the filled ledger. SQLite on a temp file;
//! PostgreSQL in a scratch schema on `EVAL_TEST_PG_URL` (default: the local test server), skipped
//! with a note when unreachable.
//!
//! Run: `cargo bench -p submitter --bench ledger`; `LEDGER_BENCH_SIZES=10000,100000` to shorten.

#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::json;
use submitter::ledger::{AttemptStatus, ImportedAttempt, Ledger, NewAttempt, open_ledger};

const MODELS: usize = 1_000;
const BENCHMARKS: [&str; 3] = ["dev_set_v2", "terminal_bench_2", "swebench-verified-random-100"];
const IMPORT_BATCH: usize = 50_000;
#[path = "../tests/common/pg.rs"]
mod pg;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// Row `i` of a deterministic history: pairs take turns, so every pair's attempts are spread over
/// the whole table and submission times increase with `i`.
fn row(i: usize, base: DateTime<Utc>) -> ImportedAttempt {
    let pair = i % (MODELS * BENCHMARKS.len());
    let model = pair % MODELS;
    let benchmark = BENCHMARKS[pair / MODELS];
    let size = if model.is_multiple_of(2) { 8 } else { 32 };
    let status = match i % 10 {
        0..=2 => AttemptStatus::Failed,
        3 => AttemptStatus::Cancelled,
        _ => AttemptStatus::Finished,
    };
    let submitted_at = base + chrono::Duration::seconds(i as i64);
    ImportedAttempt {
        model: format!("org/Model-{model:04}-{size}B-sft"),
        benchmark: benchmark.to_string(),
        cluster: "jupiter".to_string(),
        username: "bench".to_string(),
        run_tag: format!("{benchmark}__org__Model-{model:04}-{size}B-sft"),
        slurm_job_id: Some((1_000_000 + i).to_string()),
        status,
        reason: "imported".to_string(),
        config: json!({"timeout_multiplier": if size == 8 { 2.0 } else { 16.0 }, "agent": "terminus-2",
                       "harbor_config": format!("{benchmark}.yaml"), "overrides": {}}),
        metrics: (status == AttemptStatus::Finished)
            .then(|| json!({"mean_reward": 0.4, "n_trials": 100, "n_errors": 1})),
        submitted_at,
        started_at: Some(submitted_at + chrono::Duration::seconds(60)),
        ended_at: Some(submitted_at + chrono::Duration::seconds(3600)),
        source_id: None,
    }
}

fn fill(ledger: &dyn Ledger, rows: usize) -> Duration {
    let base = DateTime::from_timestamp(1_750_000_000, 0).unwrap();
    let started = Instant::now();
    for start in (0..rows).step_by(IMPORT_BATCH) {
        let batch: Vec<ImportedAttempt> = (start..rows.min(start + IMPORT_BATCH)).map(|i| row(i, base)).collect();
        ledger.import_attempts(&batch).expect("import");
    }
    started.elapsed()
}

/// Median and minimum of `latest_per_pair()` over `runs` runs, and the number of pairs returned.
fn time_latest(ledger: &dyn Ledger, runs: usize) -> (Duration, Duration, usize) {
    let mut pairs = 0;
    let samples: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            pairs = ledger.latest_per_pair().expect("latest_per_pair").len();
            started.elapsed()
        })
        .collect();
    (median(samples.clone()), *samples.iter().min().unwrap(), pairs)
}

/// Fills, times the planner query, then 100 `insert_pending` calls on the filled table (each its
/// own transaction, as the submitter makes them).
fn measure(backend: &str, rows: usize, ledger: &dyn Ledger) {
    let fill_time = fill(ledger, rows);
    let runs = if rows >= 1_000_000 { 5 } else { 9 };
    let (latest_median, latest_min, pairs) = time_latest(ledger, runs);
    let inserts: Vec<Duration> = (0..100usize)
        .map(|n| {
            let size = if n.is_multiple_of(2) { 8 } else { 32 };
            let new = NewAttempt {
                model: format!("org/Model-{n:04}-{size}B-sft"),
                benchmark: "dev_set_v2_2.0x".to_string(),
                cluster: "jupiter".to_string(),
                username: "bench".to_string(),
                run_tag: format!("bench-{n}"),
                agent: "terminus-2".into(),
                reason: "bench".to_string(),
                config: json!({"timeout_multiplier": 2.0}),
            };
            let started = Instant::now();
            ledger.insert_pending(&new).expect("insert_pending");
            started.elapsed()
        })
        .collect();
    println!(
        "{backend:<9} {rows:>8} rows  fill {:>6.1} s  latest_per_pair median {:>8} (min {:>8}, {runs} runs, {pairs} pairs)  insert_pending median {}",
        fill_time.as_secs_f64(),
        ms(latest_median),
        ms(latest_min),
        ms(median(inserts)),
    );
}

fn sizes() -> Vec<usize> {
    std::env::var("LEDGER_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').map(|n| n.trim().parse().expect("LEDGER_BENCH_SIZES: numbers")).collect())
        .unwrap_or_else(|| vec![10_000, 100_000, 1_000_000])
}

fn bench_sqlite(rows: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = open_ledger(&format!("sqlite:{}", dir.path().join("ledger.sqlite").display())).expect("open sqlite");
    measure("sqlite", rows, &*ledger);
}

fn bench_postgres(url: &str, rows: usize) -> bool {
    let Ok(mut admin) = postgres::Client::connect(url, postgres::NoTls) else {
        println!("postgres   skipped: no PostgreSQL at {}", submitter::ledger::redact_url(url));
        return false;
    };
    let schema = format!("ledger_bench_{}_{rows}", std::process::id());
    admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")).expect("schema");
    let separator = if url.contains('?') { '&' } else { '?' };
    let spec = format!("{url}{separator}options=-c%20search_path%3D{schema}");
    {
        let ledger = open_ledger(&spec).expect("open postgres");
        measure("postgres", rows, &*ledger);
    }
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).expect("drop schema");
    true
}

fn main() {
    let url = pg::test_pg_url().unwrap_or_default();
    println!("ledger bench: {MODELS} models × {} families; medians of latest_per_pair()", BENCHMARKS.len());
    for rows in sizes() {
        bench_sqlite(rows);
    }
    for rows in sizes() {
        if !bench_postgres(&url, rows) {
            break;
        }
    }
}
