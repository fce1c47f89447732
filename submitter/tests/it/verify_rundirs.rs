//! `check` and `status` on run directories shaped like real ones (docs/verification.md, "Judged at
//! a reference time"): Harbor 0.25's trial layouts, sandbox setups that take minutes, idle servers
//! that log only untimestamped health checks, multi-line tracebacks after 400s, runs without
//! payload's records. Every run dir is written for a fixed reference time `T` and judged with
//! `check --now T`; where payload's records exist, `status`'s verdict on the same run dir (through
//! `verify::status::judge_job`, what `submitter status` runs per job) is asserted to equal
//! `check`'s `status_verdict`.

use std::path::Path;
use std::process::Command;

use chrono::{DateTime, Duration, Utc};
use launch_spec::records::{Outcome, OutcomeClass, Phase, RunStatus};
use launch_spec::testkit::rundir::{
    Counters, Finished, HarborJob, JobResult, RunDir, Stage, Trial, VllmLog, iso, naive, phase_event, running_status,
    write_file,
};
use serde_json::{Value, json};
use submitter::domain::SlurmView;
use submitter::ledger::{AttemptStatus, ImportedAttempt, open_ledger};
use submitter::verify::VerifySettings;
use submitter::verify::status::{JobSide, judge_job};

use crate::support::{SUBMITTER, slurm_up};

const JOB: &str = "terminal_bench_2__org__Model-8B";

/// The reference time every run dir here is written for.
fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-30T06:00:00Z").unwrap().with_timezone(&Utc)
}

fn at(minutes_before: f64) -> DateTime<Utc> {
    t0() - Duration::milliseconds((minutes_before * 60_000.0) as i64)
}

fn write(path: &Path, text: &str, modified: DateTime<Utc>) {
    write_file(path, text, Some(modified));
}

/// A Harbor 0.25 job dir: `config.json`, `lock.json`, `result.json` (`finished_at` null until
/// `finished`), started `started_min` minutes before T with `n_total` trials.
fn job(started_min: f64, n_total: u64, finished: Option<f64>) -> RunDir {
    let d = RunDir::temp(JOB);
    d.job(&HarborJob::started(JOB, at(started_min), n_total, finished.map(at)));
    d
}

/// A trial Harbor queued: what `Trial.__init__` leaves before the environment starts.
fn queued_trial(dir: &Path, name: &str, made_min: f64) {
    Trial::new(name, Stage::Queued(at(made_min))).write(dir);
}

/// A trial whose sandbox is up and whose agent runs (`config.json`, a tmux pane log).
fn running_trial(dir: &Path, name: &str, started_min: f64) {
    Trial::new(name, Stage::Running(at(started_min))).write(dir);
}

/// A finished trial like `ok_trial()` (95 s sandbox setup, 4 min agent, reward 1.0).
fn ok_trial() -> Finished {
    Finished::ok(t0())
}

/// A finished trial, its `result.json` written `finished_min` minutes before T.
fn done_trial(dir: &Path, name: &str, finished_min: f64, d: &Finished) {
    Trial::new(name, Stage::Done(Finished { at: at(finished_min), ..d.clone() })).write(dir);
}

/// vLLM's log: the server started `start_min` before T; while `busy` (minutes before T, from →
/// to) a throughput line every 10 s and the completions `codes` per line; afterwards only the
/// untimestamped `GET /health` lines of payload's probe until T.
fn engine_log(dir: &Path, start_min: f64, busy: Option<(f64, f64)>, codes: &[u16]) {
    let start = at(start_min);
    let mut log = VllmLog::new(4242);
    log.startup(
        start,
        [
            ("api_server.py:1880", "vLLM API server version 0.33.0"),
            ("api_server.py:1912", "Starting vLLM API server 0 on http://127.0.0.1:8000"),
        ],
    );
    let mut port = 40000;
    let mut last = start;
    if let Some((from, to)) = busy {
        let mut t = at(from);
        while t <= at(to) {
            log.throughput(t, "812.4", "Running: 12 reqs");
            for code in codes {
                port += 1;
                if *code == 400 {
                    log.traceback_400(t, port);
                } else {
                    log.completion(port, *code, "OK");
                }
            }
            last = t;
            t += Duration::seconds(10);
        }
        log.throughput(last + Duration::seconds(10), "0.0", "Running: 0 reqs");
    }
    // An idle server: health checks every 5 s, no stamp on any of them.
    let idle_from = busy.map_or(start_min, |b| b.1);
    for _ in 0..((idle_from * 60.0 / 5.0) as usize) {
        log.health();
    }
    RunDir::at(dir).engine_log(&log, Some(t0()));
}

/// payload's records: Harbor running since `running_min`, a heartbeat `beat_ago_s` old.
fn payload(
    dir: &Path,
    running_min: f64,
    beat_ago_s: i64,
    counters: (u64, u64, u64),
    trials: (u64, u64, u64),
    progress_min: f64,
) {
    let beat = t0() - Duration::seconds(beat_ago_s);
    let counters = Counters { completions: counters, trials };
    let d = RunDir::at(dir);
    d.status(&running_status(JOB, "4242", at(running_min + 4.0), beat, counters, at(progress_min)), Some(beat));
    d.events(
        &[phase_event(at(running_min + 4.0), Phase::Serving), phase_event(at(running_min), Phase::Running)],
        Some(at(running_min)),
    );
}

/// `check --now T --json` on one run dir: (report of the run, exit code).
fn check(dir: &Path) -> (Value, Option<i32>) {
    let out = Command::new(SUBMITTER).arg("check").arg(dir).args(["--json", "--now", &iso(t0())]).output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (report["runs"][0].clone(), out.status.code())
}

fn finding<'a>(run: &'a Value, id: &str) -> Option<&'a Value> {
    run["findings"].as_array()?.iter().find(|f| f["id"] == id)
}

fn text(f: &Value) -> String {
    let ev: Vec<&str> =
        f["evidence"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    format!("{} | {}", f["summary"].as_str().unwrap_or(""), ev.join(" | "))
}

/// `status`'s verdict on the same run dir at T: Slurm RUNNING job 4242, started 3 h before.
fn status_verdict(dir: &Path) -> submitter::verify::verdict::JobVerdict {
    let side = JobSide {
        status: AttemptStatus::Started,
        reason: "running as job 4242",
        job_id: Some("4242"),
        slurm: Some(SlurmView::Running),
        slurm_state: Some("RUNNING".into()),
        started_at: Some(at(180.0)),
        metrics: None,
    };
    judge_job(Some(dir), &side, None, &VerifySettings::default(), t0()).0
}

fn assert_same_verdict(dir: &Path, run: &Value) {
    let v = status_verdict(dir);
    assert_eq!(run["status_verdict"], v.verdict.as_str(), "check vs status: {run:#}\nstatus: {v:#?}");
}

// ---------------------------------------------------------------------------------------------

/// A hung Harbor without payload's records: 20 trials done, 12 active, `finished_at` null, the
/// last POST 50 min ago, the newest result an hour old.
fn hung_harbor_job() -> RunDir {
    let d = job(180.0, 40, None);
    for i in 0..20 {
        done_trial(&d.path, &format!("task-{i:02}__done{i:03}"), 60.0 + f64::from(i) * 3.0, &ok_trial());
    }
    for i in 20..32 {
        running_trial(&d.path, &format!("task-{i:02}__hang{i:03}"), 70.0);
    }
    engine_log(&d.path, 175.0, Some((120.0, 50.0)), &[200, 200, 200]);
    d
}

/// Fix 1 and 4: a hung Harbor without payload's records. 12 trials active, `finished_at` null,
/// the last POST 50 min ago, the newest result an hour old: stalled, not "completions arriving".
#[test]
fn hung_harbor_without_payload_records_is_stalled() {
    let d = hung_harbor_job();
    let (run, code) = check(&d.path);
    assert_eq!(code, Some(1), "{run:#}");
    assert_eq!(run["state"], "running", "Harbor's files say it has not finished: {run:#}");
    let f = finding(&run, "trials.stalled").expect("trials.stalled");
    assert!(text(f).contains("no completion and no trial progress for 50m while 12 trials are active"), "{f:#}");
    assert!(text(f).contains("last completion"), "{f:#}");
    let engine = finding(&run, "engine.completions").unwrap();
    assert_eq!(engine["level"], "warn", "{engine:#}");
    assert!(text(engine).contains("no completion for 50m"), "{engine:#}");
    assert_eq!(run["status_verdict"], "stalled");
}

/// Fix 2: an idle server logs only untimestamped `GET /health` lines; it has served since the job
/// started 13 min ago (the server's start line and Harbor's `started_at`), not for ~1 s.
#[test]
fn an_idle_engine_is_as_old_as_its_job() {
    let d = job(13.0, 10, None);
    for i in 0..4 {
        running_trial(&d.path, &format!("task-{i}__idle{i:03}"), 12.0);
    }
    engine_log(&d.path, 13.0, None, &[]);
    let (run, code) = check(&d.path);
    assert_eq!(code, Some(1), "{run:#}");
    let f = finding(&run, "engine.zero_ok").expect("engine.zero_ok");
    assert!(text(f).contains("13m served with zero 200 completions"), "{f:#}");
    assert_eq!(run["status_verdict"], "misconfigured");
}

/// Fix 3: the agent died 0.3 s after a 2-minute sandbox setup, without output tokens: 47 instant
/// failures, timed on `agent_execution`, not on the whole trial.
#[test]
fn instant_failures_are_timed_on_the_agent_not_the_sandbox_setup() {
    let d = job(60.0, 60, None);
    let dead = Finished {
        setup_s: Some(120.0),
        agent_s: 0.3,
        output_tokens: None,
        exception: Some("BadRequestError".into()),
        reward: None,
        ..ok_trial()
    };
    for i in 0..47 {
        done_trial(&d.path, &format!("task-{i:02}__inst{i:03}"), 10.0 + f64::from(i) * 0.1, &dead);
    }
    for i in 47..57 {
        done_trial(&d.path, &format!("task-{i:02}__good{i:03}"), 5.0, &ok_trial());
    }
    running_trial(&d.path, "task-58__run0058", 3.0);
    engine_log(&d.path, 58.0, Some((55.0, 1.0)), &[200, 200]);
    payload(&d.path, 55.0, 10, (600, 47, 0), (58, 57, 47), 1.0);
    let (run, code) = check(&d.path);
    assert_eq!(code, Some(1), "{run:#}");
    let f = finding(&run, "trials.instant_fail").expect("trials.instant_fail");
    assert_eq!(f["level"], "fail");
    assert!(text(f).contains("47 of 57 finished trials failed instantly"), "{f:#}");
    assert!(text(f).contains("the agent ran 0.3s (agent_execution; BadRequestError)"), "{f:#}");
    assert_same_verdict(&d.path, &run);
}

/// Fix 4 with payload's records: the heartbeat is fresh, but nothing moved for 50 min.
#[test]
fn completions_that_stopped_are_not_arriving() {
    let d = job(120.0, 30, None);
    for i in 0..10 {
        done_trial(&d.path, &format!("task-{i}__d{i:03}"), 55.0 + f64::from(i), &ok_trial());
    }
    for i in 10..14 {
        running_trial(&d.path, &format!("task-{i}__r{i:03}"), 60.0);
    }
    engine_log(&d.path, 118.0, Some((115.0, 50.0)), &[200]);
    payload(&d.path, 115.0, 8, (391, 0, 0), (14, 10, 0), 50.0);
    let (run, code) = check(&d.path);
    assert_eq!(code, Some(1), "{run:#}");
    let engine = finding(&run, "engine.completions").unwrap();
    assert!(text(engine).contains("no completion for 50m"), "{engine:#}");
    assert!(finding(&run, "trials.stalled").is_some(), "{run:#}");
    assert_same_verdict(&d.path, &run);
    assert_eq!(run["status_verdict"], "stalled");
}

/// Fix 5: a status.json that does not parse is reported with the parser's words; the evidence
/// never claims "no payload outcome".
#[test]
fn an_unparseable_status_json_is_evidence_not_silence() {
    let d = job(30.0, 10, None);
    done_trial(&d.path, "task-0__a0000", 5.0, &ok_trial());
    running_trial(&d.path, "task-1__b0001", 8.0);
    engine_log(&d.path, 29.0, Some((28.0, 0.2)), &[200]);
    payload(&d.path, 28.0, 5, (150, 0, 0), (2, 1, 0), 0.5);
    let full = std::fs::read_to_string(d.path.join("status.json")).unwrap();
    write(&d.path.join("status.json"), &full[..full.len() / 2], t0());
    let (run, _) = check(&d.path);
    let f = finding(&run, "outcome.unreadable").expect("outcome.unreadable");
    assert!(text(f).contains("status.json does not parse: EOF while parsing"), "{f:#}");
    let all = run["findings"].as_array().unwrap().iter().map(text).collect::<Vec<_>>().join("\n");
    assert!(!all.contains("no payload outcome"), "{all}");
    // status names the same problem instead of waiting for a first status.json.
    let v = status_verdict(&d.path);
    assert_eq!(v.verdict.as_str(), "dead", "{v:#?}");
    assert!(v.summary.contains("unusable status.json (status.json does not parse"), "{v:#?}");
    // A newer payload's status.json is refused by version.
    write(&d.path.join("status.json"), r#"{"version": 7, "run_tag": "x"}"#, t0());
    let (run, _) = check(&d.path);
    assert!(text(finding(&run, "outcome.unreadable").unwrap()).contains("has version 7, newer than this build reads"));
}

/// Fix 7: Harbor 0.25's layouts. A queued trial (lock.json, empty trial.log, empty agent/,
/// verifier/, artifacts/) is neither active nor "never constructed"; a verifying trial is active;
/// output tokens counted only in `model_usage` are output tokens.
#[test]
fn harbor_025_trial_layouts_read_correctly() {
    let d = job(40.0, 10, None);
    for i in 0..3 {
        queued_trial(&d.path, &format!("task-{i}__q{i:04}"), 39.0);
    }
    running_trial(&d.path, "task-3__r0003", 20.0);
    running_trial(&d.path, "task-4__v0004", 25.0);
    write(&d.path.join("task-4__v0004/verifier/test-stdout.txt"), "running tests\n", at(1.0));
    let quick =
        Finished { setup_s: Some(100.0), agent_s: 3.0, output_tokens: Some(96), usage_only: true, ..ok_trial() };
    for i in 5..9 {
        done_trial(&d.path, &format!("task-{i}__d{i:04}"), 2.0 + f64::from(i), &quick);
    }
    engine_log(&d.path, 39.0, Some((38.0, 0.5)), &[200]);
    payload(&d.path, 38.0, 5, (230, 0, 0), (6, 4, 0), 0.5);
    let (run, code) = check(&d.path);
    assert_eq!(code, Some(0), "{run:#}");
    let p = finding(&run, "trials.progress").unwrap();
    assert!(text(p).starts_with("4 done of 10, 2 active, 3 queued, 0 errored"), "{p:#}");
    assert!(finding(&run, "trials.instant_fail").is_none(), "model_usage holds the output tokens: {run:#}");
    assert!(finding(&run, "trials.never_started").is_none(), "{run:#}");
    assert_eq!(run["facts"]["trials"]["unconstructed"], 0);
    assert_eq!(run["facts"]["trials"]["valid"], 4);
    assert_same_verdict(&d.path, &run);
    assert_eq!(run["status_verdict"], "healthy");
}

/// A healthy run and a 400 storm whose tracebacks make up most of the log: the two commands agree.
#[test]
fn a_traceback_heavy_400_storm_is_misconfigured_for_both_commands() {
    let d = job(30.0, 20, None);
    for i in 0..6 {
        done_trial(&d.path, &format!("task-{i}__s{i:04}"), 1.0 + f64::from(i), &ok_trial());
    }
    running_trial(&d.path, "task-9__r0009", 10.0);
    engine_log(&d.path, 29.0, Some((25.0, 0.3)), &[200, 400, 400]);
    let (n, c4) = {
        let text = std::fs::read_to_string(d.path.join("vllm.log")).unwrap();
        (
            text.matches("\" 200 OK").count() as u64 - text.matches("GET /health").count() as u64,
            text.matches("\" 400 Bad").count() as u64,
        )
    };
    payload(&d.path, 25.0, 5, (n, c4, 0), (7, 6, 0), 0.3);
    let (run, code) = check(&d.path);
    assert_eq!(code, Some(1), "{run:#}");
    let f = finding(&run, "engine.bad_requests").expect("engine.bad_requests");
    assert!(text(f).contains("maximum context length is 32768"), "{f:#}");
    assert_eq!(run["facts"]["engine_log"]["tracebacks"], c4);
    assert_same_verdict(&d.path, &run);
    assert_eq!(run["status_verdict"], "misconfigured");
    // The same run before the storm (only 200s so far) is healthy for both.
    let h = job(30.0, 20, None);
    done_trial(&h.path, "task-0__h0000", 2.0, &ok_trial());
    running_trial(&h.path, "task-1__h0001", 10.0);
    engine_log(&h.path, 29.0, Some((25.0, 0.3)), &[200]);
    let n = std::fs::read_to_string(h.path.join("vllm.log")).unwrap().matches("POST").count() as u64;
    payload(&h.path, 25.0, 5, (n, 0, 0), (2, 1, 0), 0.3);
    let (run, code) = check(&h.path);
    assert_eq!(code, Some(0), "{run:#}");
    assert_same_verdict(&h.path, &run);
    assert_eq!(run["status_verdict"], "healthy");
}

/// `--now` is validated like any other input: a one-line error, exit 2.
#[test]
fn check_now_must_be_an_rfc3339_instant() {
    let d = job(5.0, 1, None);
    let out = Command::new(SUBMITTER).arg("check").arg(&d.path).args(["--now", "yesterday"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--now") && err.contains("RFC 3339"), "{err}");
}

/// Fix 6: `sync` stores the completion audit with the profile's thresholds — the ones `results`
/// and `check` use — so the planner and `results` agree on a run being complete.
#[test]
fn sync_audits_with_the_profiles_thresholds() {
    if !slurm_up() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let clusters =
        crate::verify::profile_dir(tmp.path(), "aud", "verify:\n  min_valid_share: 0.5\n  max_error_share: 0.5\n");
    let d = job(90.0, 10, Some(1.0));
    // 6 of 10 valid, 4 errored: complete at 50 %, incomplete at the default 90 %.
    JobResult {
        id: "e113".into(),
        started_at: naive(at(90.0)),
        updated_at: None,
        finished_at: Some(naive(at(1.0))),
        n_total_trials: 10,
        stats: json!({"n_completed_trials": 10, "n_errored_trials": 4,
                  "evals": {"terminus-2__Model-8B__tb2": {"n_trials": 10, "n_errors": 4, "metrics": [{"mean": 0.4}],
                            "reward_stats": {"reward": {"1.0": ["a", "b", "c", "d"], "0.0": ["e", "f"]}},
                            "exception_stats": {"DaytonaError": ["g", "h", "i", "j"]}}}}),
        written: Some(at(1.0)),
    }
    .write(&d.path);
    let done = RunStatus {
        phase: Phase::Done,
        started_at: iso(at(95.0)),
        updated_at: iso(at(0.5)),
        slurm_job_id: Some("999999901".into()),
        heartbeat: None,
        outcome: Some(Outcome {
            class: OutcomeClass::Finished,
            cause: None,
            exit_code: 0,
            message: "Harbor finished".into(),
            harbor_exit_code: None,
            signal: None,
            engine_log_tail: vec![],
        }),
        ..running_status(JOB, "", t0(), t0(), Counters::default(), t0())
    };
    d.status(&done, Some(at(0.5)));
    let spec = format!("sqlite:{}", tmp.path().join("ledger.sqlite").display());
    let ledger = open_ledger(&spec).unwrap();
    ledger
        .import_attempts(&[ImportedAttempt {
            model: "org/Model-8B".into(),
            benchmark: "terminal_bench_2".into(),
            cluster: "aud".into(),
            username: "tester".into(),
            run_tag: "terminal_bench_2__org__Model-8B".into(),
            slurm_job_id: Some("999999901".into()),
            status: AttemptStatus::Started,
            reason: "running as job 999999901".into(),
            config: json!({"run_dir": d.path.display().to_string()}),
            metrics: None,
            submitted_at: at(100.0),
            started_at: Some(at(95.0)),
            ended_at: None,
            source_id: None,
        }])
        .unwrap();
    let run = |cmd: &str, extra: &[&str]| {
        let out = Command::new(SUBMITTER)
            .arg(cmd)
            .args(["--cluster", "aud", "--clusters"])
            .arg(&clusters)
            .env("SUBMITTER_LEDGER", &spec)
            .args(extra)
            .env("SUBMITTER_HOME", crate::support::workspace_root())
            .current_dir(tmp.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run("sync", &[]);
    let row = open_ledger(&spec).unwrap().latest_per_pair().unwrap().into_iter().next().unwrap().latest;
    assert_eq!(row.status, AttemptStatus::Finished);
    let metrics = row.metrics.unwrap();
    assert_eq!(metrics["audit"]["status"], "complete", "sync used other thresholds than the profile's: {metrics:#}");
    // `results` re-audits with the same profile: the cell is complete there too.
    let csv = run("results", &["--csv"]);
    assert!(csv.contains("_incomplete") && !csv.contains("true"), "{csv}");
}

/// The output contract for `check`: its human report and its versioned JSON document on the hung
/// run dir above, judged at the fixed reference time (snapshots under `it/snapshots/`; the temp
/// dir's path is `<run>`).
#[test]
fn check_outputs_are_snapshotted() {
    let d = hung_harbor_job();
    let run_dir = d.path.display().to_string();
    for format in ["human", "json"] {
        let out = Command::new(SUBMITTER)
            .arg("check")
            .arg(&d.path)
            .args(["--format", format, "--now", &iso(t0())])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
        let printed = String::from_utf8_lossy(&out.stdout).replace(&run_dir, "<run>");
        if format == "json" {
            let doc: Value = serde_json::from_str(&printed).unwrap();
            assert_eq!(doc["format_version"], 1, "{doc}");
        }
        insta::assert_snapshot!(format!("check_{format}"), printed);
    }
}

/// `submitter check DIR…` under `/usr/bin/time`: its exit status, output and peak RSS in MB.
fn check_with_peak_rss(dirs: &[&Path]) -> (Option<i32>, String, f64) {
    let out = Command::new("/usr/bin/time")
        .args(["-f", "peak-rss-kb %M", SUBMITTER, "check", "--json"])
        .args(dirs)
        .output()
        .expect("/usr/bin/time (Debian's `time`, in scripts/services.sh's packages)");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let kb: f64 = stderr
        .lines()
        .find_map(|l| l.strip_prefix("peak-rss-kb "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak RSS from time: {stderr}"));
    let stdout: String = String::from_utf8_lossy(&out.stdout).split_whitespace().collect();
    (out.status.code(), format!("{stdout}{stderr}"), kb / 1024.0)
}

/// Issue 21 item 8: valid records just under their caps — a 16 MiB job `result.json` of trial ids,
/// a 16 MB `events.jsonl` of small events — keep `check` (the reader `report` and, for the
/// result, `sync` share) at ≤ 64 MB peak RSS (it was 794 MB and 214 MB); the result is still read:
/// its audit counts every id.
#[test]
fn check_stays_small_on_records_near_their_caps() {
    let d = RunDir::temp("big-records");
    let mut ids = String::new();
    let mut n = 0u64;
    while ids.len() < (16 << 20) - 4096 {
        if n > 0 {
            ids.push(',');
        }
        ids += &format!("\"task-{n:08}__aBcDeF\"");
        n += 1;
    }
    let result = format!(
        r#"{{"n_total_trials": {n}, "finished_at": "2026-12-01T11:00:00", "stats": {{"n_completed_trials": {n}, "evals": {{"e": {{"n_trials": {n}, "n_errors": 0, "metrics": [{{"mean": 1.0}}], "reward_stats": {{"reward": {{"1.0": [{ids}]}}}}}}}}}}}}"#
    );
    std::fs::write(d.path.join("result.json"), result).unwrap();
    let line =
        "{\"at\":\"2026-12-01T10:00:00.000Z\",\"event\":\"tunnel_up\",\"fields\":{\"phase\":\"running\",\"n\":1}}\n";
    std::fs::write(d.path.join("events.jsonl"), line.repeat((16 << 20) / line.len())).unwrap();
    let (code, printed, mb) = check_with_peak_rss(&[&d.path]);
    assert!(code.is_some_and(|c| c != 2), "{printed}");
    assert!(printed.contains(&format!("\"valid\":{n},")), "every id counted ({n}): {printed}");
    assert!(mb <= 64.0, "check peaked at {mb:.1} MB (target ≤ 64 MB): {printed}");
}

/// Issue 21 item 11: a run dir whose `vllm.log` cannot be read (a symlink planted in its place) is
/// that dir's failed finding; `check` still checks the other dirs given with it and exits 1, not 2.
#[test]
fn an_unreadable_engine_log_fails_its_dir_and_the_others_are_checked() {
    let bad = job(30.0, 4, None);
    std::fs::write(bad.path.join("elsewhere.log"), "INFO vLLM\n").unwrap();
    std::os::unix::fs::symlink(bad.path.join("elsewhere.log"), bad.path.join("vllm.log")).unwrap();
    let good = job(30.0, 4, None);
    let out = Command::new(SUBMITTER)
        .arg("check")
        .args([&bad.path, &good.path])
        .args(["--json", "--now", &iso(t0())])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "both dirs checked: {doc}");
    let unreadable = finding(&runs[0], "engine.log_unreadable").unwrap_or_else(|| panic!("{}", runs[0]));
    assert_eq!(unreadable["level"], "fail");
    assert!(unreadable["summary"].as_str().unwrap().contains("symlink"), "{unreadable}");
    assert!(finding(&runs[1], "engine.log_unreadable").is_none(), "{}", runs[1]);
}

/// Issue 21 item 11: `status.json` still says `running` (its last rewrite failed on a full disk)
/// while `events.jsonl` holds this run's `outcome` event: `check` reads the outcome, not the stale
/// record; an `outcome` event of an earlier run in the same dir (before this run started) is not it.
#[test]
fn check_prefers_the_events_final_outcome_to_a_stale_running_record() {
    let stale = |outcome_min: f64| {
        let d = job(30.0, 4, None);
        let beat = at(20.0);
        d.status(&running_status(JOB, "4242", at(40.0), beat, Counters::default(), beat), Some(beat));
        let outcome = launch_spec::records::Outcome {
            class: OutcomeClass::Harbor,
            cause: None,
            exit_code: 14,
            message: "harbor exited 1".into(),
            harbor_exit_code: Some(1),
            signal: None,
            engine_log_tail: Vec::new(),
        };
        let fields = match serde_json::to_value(&outcome).unwrap() {
            Value::Object(map) => map,
            _ => unreachable!(),
        };
        let event = launch_spec::rundir::Event {
            at: iso(at(outcome_min)),
            event: launch_spec::rundir::EventKind::Outcome,
            fields,
        };
        d.events(&[phase_event(at(35.0), Phase::Running), event], Some(at(outcome_min)));
        d
    };
    let (run, _) = check(&stale(10.0).path);
    assert_eq!(run["state"], "ended", "the outcome event wins over phase running: {run}");
    assert!(run.to_string().contains("harbor exited 1"), "{run}");
    let (run, _) = check(&stale(50.0).path);
    assert_ne!(run["state"], "ended", "an earlier run's outcome is not this run's: {run}");
}

/// Issue 22's example rule (the team's 15-minute check, step 4): an installed harness whose running
/// trials have no `agent/command-0/` 30 minutes after their start never finished its setup. A
/// trial that reached its first command, a younger one, and a local agent are not stalled.
#[test]
fn an_installed_harness_that_never_ran_its_first_command_is_setup_stalled() {
    let openhands = |started_min: f64| {
        let d = RunDir::temp(JOB);
        let mut harbor = HarborJob::started(JOB, at(started_min), 4, None);
        harbor.agent = "openhands".into();
        harbor.api_base = "https://abc.a.pinggy.link/v1".into();
        d.job(&harbor);
        d.file(
            "tunnel.log",
            "You are authenticated as ops\nhttps://abc.a.pinggy.link\nRB: 10 SB: 5 TC: 1\nRB: 20 SB: 9 TC: 2\n",
            Some(at(1.0)),
        );
        d
    };
    let tunnelled = |d: &RunDir, name: &str, started_min: f64| {
        Trial::new(name, Stage::Running(at(started_min))).api_base("https://abc.a.pinggy.link/v1").write(&d.path);
    };
    let d = openhands(50.0);
    tunnelled(&d, "task-0__setup000", 45.0);
    tunnelled(&d, "task-1__setup001", 40.0);
    let (run, code) = check(&d.path);
    assert_eq!(code, Some(1), "{run:#}");
    let f = finding(&run, "trials.setup_stalled").unwrap_or_else(|| panic!("no trials.setup_stalled: {run:#}"));
    assert!(text(f).contains("2 running trial(s)") && text(f).contains("the oldest for 45m"), "{f:#}");
    assert!(text(f).contains("task-0__setup000/config.json"), "{f:#}");
    assert_eq!(run["status_verdict"], "stalled", "{run:#}");

    // Past its setup: the harness ran its first command.
    let d = openhands(50.0);
    tunnelled(&d, "task-0__setup000", 45.0);
    std::fs::create_dir_all(d.path.join("task-0__setup000/agent/command-0")).unwrap();
    let (run, _) = check(&d.path);
    assert!(finding(&run, "trials.setup_stalled").is_none(), "{run:#}");

    // Still within the window.
    let d = openhands(20.0);
    tunnelled(&d, "task-0__setup000", 10.0);
    let (run, _) = check(&d.path);
    assert!(finding(&run, "trials.setup_stalled").is_none(), "{run:#}");

    // terminus-2 has no setup phase in the sandbox.
    let d = job(50.0, 4, None);
    running_trial(&d.path, "task-0__setup000", 45.0);
    let (run, _) = check(&d.path);
    assert!(finding(&run, "trials.setup_stalled").is_none(), "{run:#}");
}

/// Issue 31: a sandbox-provider outage. Every trial ended in Harbor 0.25's record of a Daytona
/// error at sandbox creation (`DaytonaError`, `Bearer token is invalid`; no agent run) and the
/// engine saw no request in 15 minutes: the provider's finding with its message, not the agent's
/// setup (`engine.zero_ok`: "broken agent setup"), nor instant failures of the agent.
#[test]
fn a_daytona_outage_is_the_sandbox_providers_finding_not_the_agent_setup() {
    let d = job(15.0, 12, Some(1.0));
    let message = "Failed to create sandbox: Bearer token is invalid";
    for i in 0..12 {
        let failed = Finished::sandbox_failed(t0(), 2.5, "DaytonaError", message);
        done_trial(&d.path, &format!("task-{i:02}__dayt{i:03}"), 14.0 - f64::from(i), &failed);
    }
    engine_log(&d.path, 15.0, None, &[]);
    let (run, code) = check(&d.path);
    assert_eq!(code, Some(1), "{run:#}");
    let f = finding(&run, "trials.sandbox_provider").expect("trials.sandbox_provider");
    assert_eq!(f["level"], "fail", "{f:#}");
    assert!(text(f).contains("the sandbox provider failed 12 of 12 finished trials"), "{f:#}");
    assert!(text(f).contains("DaytonaError: Failed to create sandbox: Bearer token is invalid"), "{f:#}");
    assert!(f["action"].as_str().unwrap_or("").contains("DAYTONA_API_KEY"), "{f:#}");
    assert!(finding(&run, "engine.zero_ok").is_none(), "the agent's setup is not to blame: {run:#}");
    assert!(finding(&run, "trials.instant_fail").is_none(), "the agent never ran: {run:#}");
    assert!(!run.to_string().contains("broken agent setup"), "{run:#}");
    // One provider failure among good trials: a warning, and nothing hides the rest.
    let d = job(60.0, 10, None);
    for i in 0..9 {
        done_trial(&d.path, &format!("task-{i}__good{i:03}"), 5.0, &ok_trial());
    }
    done_trial(
        &d.path,
        "task-9__dayt009",
        4.0,
        &Finished::sandbox_failed(
            t0(),
            300.0,
            "EnvironmentStartTimeoutError",
            "Environment start timed out after 300.0 seconds",
        ),
    );
    engine_log(&d.path, 58.0, Some((55.0, 1.0)), &[200, 200]);
    let (run, _) = check(&d.path);
    let f = finding(&run, "trials.sandbox_provider").expect("trials.sandbox_provider");
    assert_eq!(f["level"], "warn", "{f:#}");
    assert!(text(f).contains("1 of 10") && text(f).contains("Environment start timed out"), "{f:#}");
}
