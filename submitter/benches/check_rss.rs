//! Peak RSS of `submitter check` on run dirs holding one 2 GB file where a small one belongs
//! (target ≤ 64 MB each): a job `result.json`, a trial `result.json`, a `vllm.log` without a
//! newline, `events.jsonl` and `status.json`, and a trial `result.json` linked to `/dev/zero`; and
//! valid files just under their caps (issue 21): a 16 MiB job `result.json` (also read as `sync` and
//! `results` read it) and a 16 MB `events.jsonl`.
//! The 2 GB files are sparse (no disk is written; reading one returns zeros as fast as a cached
//! file), so the bench is quick and needs no free space.
//!
//! `cargo bench -p submitter --bench check_rss`. Each case runs in a fresh process (this bench
//! re-executed with `CHECK_RSS_DIR` set) that runs the check as `submitter check` does —
//! `check_run_dir`, then a rendering of the whole report — and prints its own high-water mark (`VmHWM` of
//! `/proc/self/status`) before exiting, so nothing earlier in the bench counts and nothing is
//! missed between samples.

#![allow(clippy::print_stdout)]

use std::path::Path;
use std::process::{Command, Stdio};

use std::time::{Duration, Instant};
use submitter::verify::{VerifySettings, check};

const TWO_GB: u64 = 2 << 30;
const TARGET_MB: f64 = 64.0;

fn sparse(path: &Path, len: u64) {
    std::fs::File::create(path).unwrap().set_len(len).unwrap();
}

fn run_dir(root: &Path, name: &str) -> std::path::PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"job_name": "x", "agents": [{"name": "terminus-2", "kwargs": {"api_base": "http://127.0.0.1:8000/v1"}}]}"#,
    )
    .unwrap();
    dir
}

fn trial(dir: &Path) -> std::path::PathBuf {
    let trial = dir.join("task-1__abc");
    std::fs::create_dir_all(trial.join("agent")).unwrap();
    trial
}

/// Just under the 16 MiB record cap.
const NEAR_CAP: usize = (16 << 20) - 4096;

/// A job `result.json` of `len` bytes: Harbor's shape, `reward_stats` holding that many trial ids
/// (what a very large job writes; every id was a `Value` before).
fn big_job_result(len: usize) -> String {
    let mut ids = String::with_capacity(len);
    let mut i = 0u64;
    while ids.len() + 200 < len {
        if i > 0 {
            ids.push(',');
        }
        ids += &format!("\"task-{i:08}__aBcDeF\"");
        i += 1;
    }
    format!(
        r#"{{"started_at": "2026-12-01T10:00:00", "n_total_trials": {i}, "stats": {{"n_completed_trials": {i}, "evals": {{"e": {{"n_trials": {i}, "n_errors": 0, "metrics": [{{"mean": 0.5}}], "reward_stats": {{"reward": {{"1.0": [{ids}]}}}}, "exception_stats": {{}}}}}}}}}}"#
    )
}

/// A job `result.json` of `len` bytes whose bulk is a field nobody reads: an array of `0`s, the most
/// `Value`s per byte.
fn padded_job_result(len: usize) -> String {
    let zeros = "0,".repeat((len - 200) / 2);
    format!(r#"{{"n_total_trials": 1, "padding": [{zeros}0], "stats": {{"evals": {{}}}}}}"#)
}

/// An `events.jsonl` of `len` bytes of small events: `kind` lines with one field each.
fn many_events(len: usize, kind: &str) -> String {
    let mut out = String::with_capacity(len + 200);
    let mut i = 0u64;
    while out.len() < len {
        out += &format!(
            "{{\"at\":\"2026-12-01T10:00:00.000Z\",\"event\":\"{kind}\",\"fields\":{{\"phase\":\"running\",\"n\":{i}}}}}\n"
        );
        i += 1;
    }
    out
}

/// Runs the check of `dir` in a fresh process; returns (peak RSS in MB, wall time).
fn measure(dir: &Path) -> (f64, Duration) {
    measure_as(dir, "check")
}

/// Runs `what` (`check`: as `submitter check` and `report` read a dir; `summary`: as `sync` and
/// `results` read a job result.json) on `dir` in a fresh process.
fn measure_as(dir: &Path, what: &str) -> (f64, Duration) {
    let start = Instant::now();
    let out = Command::new(std::env::current_exe().unwrap())
        .env("CHECK_RSS_DIR", dir)
        .env("CHECK_RSS_WHAT", what)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let kb: u64 = text.trim().parse().unwrap_or_else(|_| panic!("child printed {text:?}"));
    (kb as f64 / 1024.0, start.elapsed())
}

/// The child: one check, then its own peak RSS in kB on stdout.
fn child(dir: &Path) {
    let settings = VerifySettings::default();
    if std::env::var("CHECK_RSS_WHAT").as_deref() == Ok("summary") {
        let summary = submitter::verify::results::score_summary(dir).expect("a summary");
        std::hint::black_box(format!("{summary:?}"));
    } else {
        let report = check::check_run_dir(dir, &settings, chrono::Utc::now()).unwrap();
        // Everything the report holds is touched, as printing it would (its JSON is built in the binary).
        std::hint::black_box(format!("{report:?}"));
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap();
    println!("{kb}");
}

fn main() {
    if let Some(dir) = std::env::var_os("CHECK_RSS_DIR") {
        return child(Path::new(&dir));
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let mut cases: Vec<(&str, std::path::PathBuf)> = Vec::new();

    let dir = run_dir(root, "job-result");
    sparse(&dir.join("result.json"), TWO_GB);
    cases.push(("2 GB job result.json", dir));

    let dir = run_dir(root, "trial-result");
    sparse(&trial(&dir).join("result.json"), TWO_GB);
    cases.push(("2 GB trial result.json", dir));

    let dir = run_dir(root, "dev-zero");
    std::os::unix::fs::symlink("/dev/zero", trial(&dir).join("result.json")).unwrap();
    cases.push(("trial result.json → /dev/zero", dir));

    let dir = run_dir(root, "engine-log");
    sparse(&dir.join("vllm.log"), TWO_GB);
    cases.push(("2 GB vllm.log, no newline", dir));

    let dir = run_dir(root, "records");
    sparse(&dir.join("events.jsonl"), TWO_GB);
    sparse(&dir.join("status.json"), TWO_GB);
    sparse(&dir.join("launch.json"), TWO_GB);
    cases.push(("2 GB events.jsonl, status.json, launch.json", dir));

    // Issue 21 item 8: files just under their caps, all of them valid.
    let dir = run_dir(root, "near-cap-result");
    std::fs::write(dir.join("result.json"), big_job_result(NEAR_CAP)).unwrap();
    cases.push(("16 MiB job result.json (trial ids)", dir.clone()));
    let near_cap_result = dir;

    let dir = run_dir(root, "padded-result");
    std::fs::write(dir.join("result.json"), padded_job_result(NEAR_CAP)).unwrap();
    cases.push(("16 MiB job result.json (an unread array)", dir.clone()));
    let padded_result = dir;

    let dir = run_dir(root, "many-events");
    std::fs::write(dir.join("events.jsonl"), many_events(16 << 20, "tunnel_up")).unwrap();
    cases.push(("16 MB events.jsonl (small events)", dir));

    let dir = run_dir(root, "many-phase-events");
    std::fs::write(dir.join("events.jsonl"), many_events(16 << 20, "phase")).unwrap();
    cases.push(("16 MB events.jsonl (phase events)", dir));

    let baseline = run_dir(root, "baseline");
    let (base_mb, _) = measure(&baseline);
    println!("check peak RSS on an empty run dir: {base_mb:.1} MB");
    let mut worst: f64 = 0.0;
    for (what, dir) in &cases {
        let (mb, took) = measure(dir);
        worst = worst.max(mb);
        println!(
            "check peak RSS, {what:<45} {mb:>6.1} MB in {:>5.2} s{}",
            took.as_secs_f64(),
            if mb > TARGET_MB { "  OVER TARGET" } else { "" }
        );
    }
    for (what, dir) in [
        ("16 MiB job result.json (trial ids)", &near_cap_result),
        ("16 MiB job result.json (an unread array)", &padded_result),
    ] {
        let (mb, took) = measure_as(dir, "summary");
        worst = worst.max(mb);
        println!(
            "sync/results summary peak RSS, {what:<32} {mb:>6.1} MB in {:>5.2} s{}",
            took.as_secs_f64(),
            if mb > TARGET_MB { "  OVER TARGET" } else { "" }
        );
    }
    println!("worst: {worst:.1} MB (target ≤ {TARGET_MB} MB)");
}
