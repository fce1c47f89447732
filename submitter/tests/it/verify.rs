//! Launch verification (docs/verification.md): `check` on run directories built in temp dirs for
//! every failure signature, `logs`, `results`, the HTML report in a real headless browser, and —
//! on the local Slurm — `status` flipping to `misconfigured` when the engine starts answering 400s
//! and a hung engine ending as `engine_died`.

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use launch_spec::testkit::rundir::{
    Counters, Finished, HarborJob, JobResult, RunDir, Stage, VllmLog, phase_event, running_status, write_json,
};
use serde_json::{Value, json};
use submitter::ledger::{AttemptStatus, ImportedAttempt, open_ledger};

use crate::support::{SUBMITTER, slurm_up, standin_environment, test_secrets_file, workspace_root, write_tasks};

// ---------------------------------------------------------------------------------------------
// Run-dir fixtures (launch_spec::testkit), relative to now

const JOB: &str = "terminal_bench_2__org__Model-8B";

fn ago(seconds: i64) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::seconds(seconds)
}

/// A Harbor job dir as harbor 0.25 and payload leave it.
struct Run {
    d: RunDir,
    dir: PathBuf,
    api_base: String,
}

/// One trial: `result` None = still running.
struct Trial<'a> {
    name: &'a str,
    api_base: Option<&'a str>,
    result: Option<TrialResult>,
    finished_ago_s: i64,
}

#[derive(Clone)]
struct TrialResult {
    reward: Option<f64>,
    exception: Option<&'static str>,
    output_tokens: Option<u64>,
    duration_s: f64,
}

fn ok_result(reward: f64) -> TrialResult {
    TrialResult { reward: Some(reward), exception: None, output_tokens: Some(420), duration_s: 95.0 }
}

impl Run {
    fn new(agent: &str, api_base: &str) -> Run {
        let d = RunDir::temp(JOB);
        let run = Run { dir: d.path.clone(), d, api_base: api_base.to_string() };
        run.job_config(agent, true);
        run
    }

    /// The job `config.json` alone (no `lock.json`: which Harbor wrote the dir is unknown).
    fn job_config(&self, agent: &str, model_info: bool) {
        let mut info = launch_spec::testkit::rundir::model_info(32768, 16384);
        info["input_cost_per_token"] = json!(0);
        info["output_cost_per_token"] = json!(0);
        self.d.job(&HarborJob {
            n_concurrent: 4,
            agent: agent.into(),
            api_base: self.api_base.clone(),
            model_info: model_info.then_some(info),
            dataset: "/data/DCAgent2_terminal_bench_2".into(),
            harbor_version: None,
            result: None,
            written: None,
            ..HarborJob::started(JOB, Utc::now(), 0, None)
        });
    }

    fn harbor_result(&self, n_total: u64, finished: bool) {
        JobResult {
            id: "x".into(),
            started_at: "2026-11-30T05:00:00.000000".into(),
            updated_at: None,
            finished_at: finished.then(|| "2026-11-30T06:00:00.000000".into()),
            n_total_trials: n_total,
            stats: json!({"n_completed_trials": 0, "evals": {}}),
            written: None,
        }
        .write(&self.dir);
    }

    fn trial(&self, t: Trial) {
        let stage = match t.result {
            None => Stage::Running(ago(0)),
            // Only the trial's `started_at`/`finished_at`, `duration_s` apart.
            Some(r) => Stage::Done(Finished {
                at: ago(t.finished_ago_s),
                setup_s: None,
                agent_s: r.duration_s,
                input_tokens: r.output_tokens.map(|n| n * 3),
                output_tokens: r.output_tokens,
                exception: r.exception.map(str::to_string),
                reward: r.reward,
                ..Finished::ok(ago(t.finished_ago_s))
            }),
        };
        let trial = launch_spec::testkit::rundir::Trial::new(t.name, stage);
        self.d.trial(&trial.api_base(t.api_base.unwrap_or(&self.api_base)));
    }

    /// vLLM's log: startup, then per minute a throughput line and `per_minute` access lines
    /// (status codes cycling through the list), for `minutes` minutes ending now.
    fn engine_log(&self, minutes: i64, per_minute: &[u16]) {
        let start = ago(minutes * 60 + 30);
        let mut log = VllmLog::new(4242);
        log.startup(
            start,
            [
                ("startup.py:33", "vLLM server version 0.33.0, serving model org/Model-8B"),
                ("entry.py:139", "Starting vLLM server on http://127.0.0.1:8000"),
            ],
        );
        let mut port = 40000;
        for m in 0..=minutes {
            let t = start + chrono::Duration::seconds(30 + m * 60);
            log.throughput(t, "812.4", "Running: 4 reqs, Waiting: 0 reqs");
            log.health();
            for code in per_minute {
                port += 1;
                let reason = match code {
                    200 => "OK",
                    400 => "Bad Request",
                    _ => "Internal Server Error",
                };
                log.completion(port, *code, reason);
                if *code == 400 && port % 7 == 0 {
                    log.logger("ERROR", t, "serving_chat.py:212", "Error in preprocessing prompt inputs: VLLMValidationError: This model's maximum context length is 32768 tokens. However, your request has 40123 input tokens.");
                }
            }
        }
        self.d.engine_log(&log, None);
    }

    /// payload's status.json (+ events.jsonl) for a run in phase `running` since `running_s`.
    fn payload_status(
        &self,
        running_s: i64,
        updated_ago_s: i64,
        counters: (u64, u64, u64),
        trials: (u64, u64, u64),
        progress_ago_s: i64,
    ) {
        let counters = Counters { completions: counters, trials };
        let status =
            running_status(JOB, "4242", ago(running_s + 120), ago(updated_ago_s), counters, ago(progress_ago_s));
        self.d.status(&status, None);
        self.d.events(&[phase_event(ago(running_s), launch_spec::Phase::Running)], None);
    }
}

fn check(dirs: &[&Path], extra: &[&str]) -> (Value, Option<i32>, String) {
    let out = Command::new(SUBMITTER).arg("check").args(dirs).arg("--json").args(extra).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let value = serde_json::from_str(&text).unwrap_or(Value::Null);
    (value, out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `status`'s verdict on the first run's dir (Slurm RUNNING job 4242, the id payload_status
/// records) equals `check`'s `status_verdict`: one rule engine behind both.
fn agrees_with_status(dir: &Path, report: &Value) {
    use submitter::verify::status::{JobSide, judge_job};
    let side = JobSide {
        status: AttemptStatus::Started,
        reason: "running as job 4242",
        job_id: Some("4242"),
        slurm: Some(submitter::domain::SlurmView::Running),
        slurm_state: Some("RUNNING".into()),
        started_at: Some(ago(4 * 3600)),
        metrics: None,
    };
    let (v, _, _) = judge_job(Some(dir), &side, None, &submitter::verify::VerifySettings::default(), Utc::now());
    assert_eq!(report["runs"][0]["status_verdict"], v.verdict.as_str(), "check vs status: {report:#}\n{v:#?}");
}

/// The findings of the first run, by id.
fn finding<'a>(report: &'a Value, id: &str) -> Option<&'a Value> {
    report["runs"][0]["findings"].as_array()?.iter().find(|f| f["id"] == id)
}

fn evidence(f: &Value) -> String {
    f["evidence"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}

fn healthy_trials(run: &Run, n: usize) {
    for i in 0..n {
        let name = format!("task-{i}__abc{i:04}");
        run.trial(Trial {
            name: &name,
            api_base: None,
            result: Some(ok_result(if i % 2 == 0 { 1.0 } else { 0.0 })),
            finished_ago_s: 60 + i as i64,
        });
    }
}

#[test]
fn healthy_run_passes_every_check() {
    let run = Run::new("terminus-2", "http://127.0.0.1:8000/v1");
    healthy_trials(&run, 8);
    run.trial(Trial { name: "task-8__run0001", api_base: None, result: None, finished_ago_s: 0 });
    run.harbor_result(10, false);
    run.engine_log(12, &[200, 200, 200, 200]);
    run.payload_status(12 * 60, 5, (52, 0, 0), (9, 8, 0), 20);
    let (report, code, stderr) = check(&[&run.dir], &[]);
    assert_eq!(code, Some(0), "{report:#}\n{stderr}");
    assert_eq!(report["verdict"], "ok", "{report:#}");
    assert_eq!(report["runs"][0]["state"], "running");
    let engine = finding(&report, "engine.completions").unwrap();
    assert_eq!(engine["level"], "ok");
    assert!(evidence(engine).contains("52 completions"), "{engine:#}");
    let trials = finding(&report, "trials.progress").unwrap();
    assert!(trials["summary"].as_str().unwrap().starts_with("8 done of 10, 1 active"), "{trials:#}");
    assert_eq!(report["runs"][0]["facts"]["trials"]["valid"], 8);
    assert_eq!(report["runs"][0]["status_verdict"], "healthy");
    agrees_with_status(&run.dir, &report);
}

#[test]
fn locked_tunnel_in_an_old_layout_fails_with_the_log_line() {
    // Old scripts: no launch.json/status.json, `pinggy_<jobid>.log`, an installed agent.
    let run = Run::new("openhands", "https://abc123.a.pinggy.link/v1");
    std::fs::write(
        run.dir.join("pinggy_4242.log"),
        "Warning: Permanently added '[pro.pinggy.io]:443' (RSA) to the list of known hosts.\n\
         A tunnel with the same token is already active. Close it or use the force keyword.\n\
         Connection to pro.pinggy.io closed.\n",
    )
    .unwrap();
    let (report, code, _) = check(&[&run.dir], &[]);
    assert_eq!(code, Some(1), "{report:#}");
    let f = finding(&report, "tunnel.locked").expect("tunnel.locked");
    assert_eq!(f["level"], "fail");
    assert!(evidence(f).contains("pinggy_4242.log: A tunnel with the same token is already active"), "{f:#}");
    assert!(f["action"].as_str().unwrap().contains("next free Pinggy pair"));
}

#[test]
fn working_tunnel_with_traffic_is_ok_and_flat_counters_warn() {
    let run = Run::new("openhands", "https://abc123.a.pinggy.link/v1");
    std::fs::write(
        run.dir.join("tunnel.log"),
        "You are authenticated as ops@example.org\nhttp://abc123.a.pinggy.link\nhttps://abc123.a.pinggy.link\nRB: 120 SB: 80 TC: 1\nRB: 9.5K SB: 12K TC: 14\n",
    )
    .unwrap();
    let (report, _, _) = check(&[&run.dir], &[]);
    assert_eq!(finding(&report, "tunnel.authenticated").unwrap()["level"], "ok", "{report:#}");
    assert_eq!(finding(&report, "tunnel.traffic").unwrap()["level"], "ok");
    assert_eq!(finding(&report, "api_base.ok").unwrap()["level"], "ok", "{report:#}");
    std::fs::write(run.dir.join("tunnel.log"), "You are authenticated as ops@example.org\nhttps://abc123.a.pinggy.link\nRB: 0 SB: 0 TC: 0\nRB: 0 SB: 0 TC: 0\n").unwrap();
    let (report, code, _) = check(&[&run.dir], &[]);
    assert_eq!(finding(&report, "tunnel.traffic").unwrap()["level"], "warn", "{report:#}");
    assert_eq!(code, Some(0), "warnings alone exit 0");
    let (_, strict, _) = check(&[&run.dir], &["--strict"]);
    assert_eq!(strict, Some(1), "--strict: warnings exit 1");
}

#[test]
fn private_api_base_for_an_installed_agent_fails() {
    let run = Run::new("openhands", "http://10.12.0.7:8000/v1");
    std::fs::write(
        run.dir.join("tunnel.log"),
        "You are authenticated as ops@example.org\nhttps://abc123.a.pinggy.link\n",
    )
    .unwrap();
    run.trial(Trial { name: "task-0__aaa0001", api_base: None, result: None, finished_ago_s: 0 });
    let (report, code, _) = check(&[&run.dir], &[]);
    assert_eq!(code, Some(1));
    let f = finding(&report, "api_base.private").expect("api_base.private");
    assert!(evidence(f).contains("\"api_base\": \"http://10.12.0.7:8000/v1\""), "{f:#}");
    assert!(f["summary"].as_str().unwrap().contains("private address"));
    // terminus-2 on the node may use the same address.
    let local = Run::new("terminus-2", "http://10.12.0.7:8000/v1");
    let (report, _, _) = check(&[&local.dir], &[]);
    assert!(finding(&report, "api_base.private").is_none(), "{report:#}");
}

#[test]
fn stale_api_base_in_trial_configs_fails() {
    let run = Run::new("terminus-2", "http://127.0.0.1:8123/v1");
    healthy_trials(&run, 3);
    run.trial(Trial {
        name: "task-9__old0001",
        api_base: Some("http://127.0.0.1:8000/v1"),
        result: None,
        finished_ago_s: 0,
    });
    let (report, code, _) = check(&[&run.dir], &[]);
    assert_eq!(code, Some(1));
    let f = finding(&report, "api_base.stale").expect("api_base.stale");
    assert!(evidence(f).contains("task-9__old0001/config.json"), "{f:#}");
}

#[test]
fn a_400_storm_is_context_overflow_with_the_log_lines() {
    let run = Run::new("terminus-2", "http://127.0.0.1:8000/v1");
    healthy_trials(&run, 4);
    run.engine_log(10, &[200, 400, 400, 200, 400]);
    let (report, code, _) = check(&[&run.dir], &[]);
    assert_eq!(code, Some(1), "{report:#}");
    let f = finding(&report, "engine.bad_requests").expect("engine.bad_requests");
    let ev = evidence(f);
    assert!(f["summary"].as_str().unwrap().contains("context overflow: 60.0%"), "{f:#}");
    assert!(ev.contains("\"POST /v1/chat/completions HTTP/1.1\" 400 Bad Request"), "{ev}");
    assert!(ev.contains("maximum context length is 32768"), "{ev}");
    assert!(ev.contains("/min"), "completions per minute in the evidence: {ev}");
    let per_min = report["runs"][0]["facts"]["completions_per_min"].as_f64().unwrap();
    assert!((4.0..=6.0).contains(&per_min), "{per_min}");
}

#[test]
fn a_run_that_goes_bad_midway_is_caught_by_the_recent_window() {
    let run = Run::new("terminus-2", "http://127.0.0.1:8000/v1");
    // 20 minutes of 200s (1,000 completions), then the latest 100 are 400s: 9% overall.
    run.engine_log(19, &[200; 50]);
    let mut text = std::fs::read_to_string(run.dir.join("vllm.log")).unwrap();
    for i in 0..100 {
        text +=
            &format!("INFO:     127.0.0.1:{} - \"POST /v1/chat/completions HTTP/1.1\" 400 Bad Request\n", 50000 + i);
    }
    std::fs::write(run.dir.join("vllm.log"), text).unwrap();
    let (report, _, _) = check(&[&run.dir], &[]);
    let f = finding(&report, "engine.bad_requests").expect("recent 400s caught");
    assert!(f["summary"].as_str().unwrap().contains("among the latest"), "{f:#}");
}

#[test]
fn instant_failures_fail_the_trials_check() {
    let run = Run::new("terminus-2", "http://127.0.0.1:8000/v1");
    healthy_trials(&run, 2);
    for i in 0..6 {
        let name = format!("task-{i}__inst{i:03}");
        // Harbor's record of a refused connection to api_base (a provider's error is not the agent's:
        // `trials.sandbox_provider`, verify_rundirs.rs).
        let r =
            TrialResult { reward: None, exception: Some("InternalServerError"), output_tokens: None, duration_s: 0.4 };
        run.trial(Trial { name: &name, api_base: None, result: Some(r), finished_ago_s: 30 });
    }
    let (report, code, _) = check(&[&run.dir], &[]);
    assert_eq!(code, Some(1));
    let f = finding(&report, "trials.instant_fail").expect("trials.instant_fail");
    assert_eq!(f["level"], "fail");
    assert!(f["summary"].as_str().unwrap().starts_with("6 of 8 finished trials failed instantly"), "{f:#}");
    assert!(evidence(f).contains("no output tokens, finished 0.4s after its start (InternalServerError)"), "{f:#}");
    let progress = finding(&report, "trials.progress").unwrap();
    assert!(evidence(progress).contains("InternalServerError × 6"), "{progress:#}");
    assert!(progress["summary"].as_str().unwrap().contains("6 errored (0 infra)"), "{progress:#}");
}

#[test]
fn stalled_trials_fail_when_no_result_arrives_for_an_hour() {
    let run = Run::new("terminus-2", "http://127.0.0.1:8000/v1");
    for i in 0..3 {
        let name = format!("task-{i}__old{i:04}");
        run.trial(Trial { name: &name, api_base: None, result: Some(ok_result(1.0)), finished_ago_s: 2 * 3600 + i });
    }
    for i in 3..7 {
        let name = format!("task-{i}__hang{i:03}");
        run.trial(Trial { name: &name, api_base: None, result: None, finished_ago_s: 0 });
    }
    run.harbor_result(10, false);
    run.payload_status(3 * 3600, 10, (300, 0, 0), (7, 3, 0), 2 * 3600);
    // Both layouts give the same finding, each with its own evidence.
    let stalled = |evidence_says: &str| {
        let (report, code, _) = check(&[&run.dir], &[]);
        assert_eq!(code, Some(1), "{report:#}");
        let f = finding(&report, "trials.stalled").expect("trials.stalled");
        let summary = f["summary"].as_str().unwrap();
        assert!(summary.contains("no completion and no trial progress for 2.0h while 4 trials are active"), "{f:#}");
        assert!(evidence(f).contains(evidence_says), "{f:#}");
        report
    };
    agrees_with_status(&run.dir, &stalled("payload's last progress"));
    // The old scripts' layout (no payload records): Harbor has not finished, trials are active,
    // and the newest trial result.json is two hours old.
    std::fs::remove_file(run.dir.join("status.json")).unwrap();
    std::fs::remove_file(run.dir.join("events.jsonl")).unwrap();
    run.harbor_result(10, false);
    let report = stalled("last result.json");
    assert_eq!(report["runs"][0]["state"], "running", "Harbor's files say it runs: {report:#}");
}

#[test]
fn zombie_all_trials_done_while_the_job_runs() {
    let run = Run::new("terminus-2", "http://127.0.0.1:8000/v1");
    for i in 0..6 {
        let name = format!("task-{i}__done{i:03}");
        run.trial(Trial { name: &name, api_base: None, result: Some(ok_result(1.0)), finished_ago_s: 1500 + i });
    }
    run.harbor_result(6, false);
    run.payload_status(3600, 8, (90, 0, 0), (6, 6, 0), 1500);
    let (report, code, _) = check(&[&run.dir], &[]);
    assert_eq!(code, Some(1));
    let f = finding(&report, "trials.zombie").expect("trials.zombie");
    assert!(
        f["summary"].as_str().unwrap().contains("all 6 trials are done 25m ago but the job still runs (zombie)"),
        "{f:#}"
    );
    assert!(evidence(f).contains("payload's last progress"), "{f:#}");
    assert_eq!(report["runs"][0]["status_verdict"], "stalled");
    agrees_with_status(&run.dir, &report);
}

#[test]
fn missing_model_info_zero_200s_is_a_broken_agent_setup() {
    let run = Run::new("terminus-2", "http://127.0.0.1:8000/v1");
    run.job_config("terminus-2", false);
    // Harbor created the trial dirs but never constructed the trials (no config.json).
    for i in 0..3 {
        let dir = run.dir.join(format!("task-{i}__nomi{i:03}"));
        for sub in ["agent", "verifier", "artifacts"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::fs::write(dir.join("trial.log"), "Model info is required when using hosted_vllm models. Please set `model_info` in your Terminus 2 configuration\n").unwrap();
    }
    run.engine_log(10, &[]);
    run.payload_status(10 * 60, 5, (0, 0, 0), (3, 0, 0), 10 * 60);
    let (report, code, _) = check(&[&run.dir], &[]);
    assert_eq!(code, Some(1));
    let zero = finding(&report, "engine.zero_ok").expect("engine.zero_ok");
    assert!(zero["summary"].as_str().unwrap().contains("zero 200 completions: broken agent setup"), "{zero:#}");
    assert!(evidence(zero).contains("Model info is required"), "{zero:#}");
    let mi = finding(&report, "api_base.model_info").expect("api_base.model_info");
    assert!(evidence(mi).contains("has no kwargs.model_info"), "{mi:#}");
    assert!(finding(&report, "trials.never_started").is_some(), "{report:#}");
    // Eight minutes in: too early to call.
    let early = Run::new("terminus-2", "http://127.0.0.1:8000/v1");
    early.engine_log(3, &[]);
    early.payload_status(3 * 60, 5, (0, 0, 0), (0, 0, 0), 180);
    let (report, _, _) = check(&[&early.dir], &[]);
    assert!(finding(&report, "engine.zero_ok").is_none(), "{report:#}");
}

#[test]
fn silent_payload_and_failed_outcome() {
    let run = Run::new("terminus-2", "http://127.0.0.1:8000/v1");
    run.payload_status(3600, 1800, (10, 0, 0), (2, 1, 0), 1800);
    let (report, _, _) = check(&[&run.dir], &[]);
    assert_eq!(report["runs"][0]["state"], "unknown");
    assert_eq!(finding(&report, "outcome.silent").unwrap()["level"], "warn", "{report:#}");
    agrees_with_status(&run.dir, &report);
    let mut status: Value =
        serde_json::from_str(&std::fs::read_to_string(run.dir.join("status.json")).unwrap()).unwrap();
    status["phase"] = json!("done");
    status["outcome"] = json!({"class": "engine_died", "cause": "unhealthy", "exit_code": 12,
                               "message": "vLLM failed 3 consecutive /health probes; Harbor stopped", "engine_log_tail": ["last engine line"]});
    write_json(&run.dir.join("status.json"), &status, None);
    let (report, code, _) = check(&[&run.dir], &[]);
    assert_eq!(code, Some(1));
    let f = finding(&report, "outcome.failed").unwrap();
    assert!(f["summary"].as_str().unwrap().starts_with("engine_died/unhealthy (exit 12)"), "{f:#}");
    assert_eq!(report["runs"][0]["status_verdict"], "failed");
    agrees_with_status(&run.dir, &report);
}

#[test]
fn completion_audit_flags_incomplete_runs() {
    let run = Run::new("terminus-2", "http://127.0.0.1:8000/v1");
    let result = json!({"n_total_trials": 10, "finished_at": "2026-11-30T06:00:00.000000",
        "stats": {"evals": {"terminus-2__Model-8B__tb2": {"n_trials": 10, "n_errors": 4, "metrics": [{"mean": 0.3}],
            "reward_stats": {"reward": {"1.0": ["a", "b", "c"], "0.0": ["d", "e", "f"]}},
            "exception_stats": {"DaytonaError": ["g", "h"], "AgentTimeoutError": ["i", "j"]}}}}});
    write_json(&run.dir.join("result.json"), &result, None);
    let (report, code, _) = check(&[&run.dir], &[]);
    assert_eq!(code, Some(0), "an incomplete audit warns: {report:#}");
    let f = finding(&report, "audit.completion").unwrap();
    assert_eq!(f["level"], "warn");
    assert!(f["summary"].as_str().unwrap().starts_with("incomplete: 6 valid trials of 10 expected"), "{f:#}");
    assert_eq!(report["runs"][0]["facts"]["audit"]["status"], "incomplete");
    // sync's metrics carry the same audit.
    let metrics = submitter::sync::harbor_metrics(&run.dir, &submitter::verify::VerifySettings::default()).unwrap();
    assert_eq!(metrics["audit"]["status"], "incomplete");
    assert_eq!(metrics["infra_errors"], json!({"DaytonaError": 2}));
    assert_eq!(metrics["n_valid"], 6);
    assert_eq!(metrics["n_trials"], 10, "the original keys stay");
}

#[test]
fn bad_input_exits_2_and_text_output_reads_well() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(SUBMITTER).args(["check"]).arg(tmp.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a run directory"));
    let out = Command::new(SUBMITTER).args(["check", "/no/such/dir"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let run = Run::new("terminus-2", "http://127.0.0.1:8000/v1");
    run.engine_log(10, &[200, 400, 400]);
    let out = Command::new(SUBMITTER).arg("check").arg(&run.dir).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("FAIL") && text.contains("fail  engine    context overflow"), "{text}");
    assert!(text.contains("→ max_model_len"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// logs

#[test]
fn logs_picks_the_right_file_and_follows() {
    let run = Run::new("openhands", "https://abc123.a.pinggy.link/v1");
    run.engine_log(1, &[200]);
    std::fs::write(run.dir.join("harbor.log"), "harbor says hi\n").unwrap();
    std::fs::write(run.dir.join("pinggy_77.log"), "You are authenticated as ops\n").unwrap();
    std::fs::write(run.dir.join("slurm-77.out"), "{\"level\":\"INFO\",\"msg\":\"payload\"}\n").unwrap();
    let logs = |args: &[&str]| Command::new(SUBMITTER).arg("logs").arg(&run.dir).args(args).output().unwrap();
    assert!(String::from_utf8_lossy(&logs(&["--engine"]).stdout).contains("Starting vLLM server"));
    assert_eq!(String::from_utf8_lossy(&logs(&["--harbor"]).stdout), "harbor says hi\n");
    assert!(String::from_utf8_lossy(&logs(&["--tunnel"]).stdout).contains("authenticated"));
    assert!(String::from_utf8_lossy(&logs(&[]).stdout).contains("payload"));
    let tail = logs(&["--engine", "-n", "2"]);
    assert_eq!(String::from_utf8_lossy(&tail.stdout).lines().count(), 2);
    std::fs::remove_file(run.dir.join("harbor.log")).unwrap();
    let missing = logs(&["--harbor"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no Harbor log"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );

    // -f prints what is appended.
    let mut child = Command::new(SUBMITTER)
        .arg("logs")
        .arg(&run.dir)
        .args(["--engine", "-f"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let mut f = std::fs::OpenOptions::new().append(true).open(run.dir.join("vllm.log")).unwrap();
    std::io::Write::write_all(&mut f, b"APPENDED-LINE\n").unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("APPENDED-LINE") {
                let _ = tx.send(());
                return;
            }
        }
    });
    let seen = rx.recv_timeout(Duration::from_secs(10)).is_ok();
    let _ = child.kill();
    let _ = child.wait();
    assert!(seen, "logs -f did not print the appended line");
}

// ---------------------------------------------------------------------------------------------
// results and the report (a ledger with finished attempts; no Slurm needed)

/// A cluster profile dir for commands that open a session.
pub(crate) fn profile_dir(root: &Path, name: &str, extra: &str) -> PathBuf {
    let clusters = root.join("clusters");
    std::fs::create_dir_all(&clusters).unwrap();
    std::fs::copy(workspace_root().join("clusters/gpus.yaml"), clusters.join("gpus.yaml")).unwrap();
    let r = root.display();
    std::fs::create_dir_all(root.join("env/bin")).unwrap();
    std::fs::write(
        clusters.join(format!("{name}.yaml")),
        format!(
            "name: {name}\nslurm:\n  partition: debug\n  time: \"00:10:00\"\nhardware:\n  gpus_per_node: 1\n  cpus_per_node: 1\n  mem_per_node_mb: 400\n  arch: x86_64\n\
             environments:\n  otagent: {r}/env\nengine:\n  default_environment: otagent\nharbor:\n  environment: otagent\n\
             paths:\n  jobs_dir: {r}/jobs\n  logs_dir: {r}/logs\n  state_dir: {r}/state\n{extra}"
        ),
    )
    .unwrap();
    clusters
}

fn finished(model: &str, benchmark: &str, mean: f64, n: u64, errors: u64, run_dir: Option<&Path>) -> ImportedAttempt {
    let t = Utc::now() - chrono::Duration::hours(2);
    let valid = n - errors;
    ImportedAttempt {
        model: model.into(),
        benchmark: benchmark.into(),
        cluster: "rep".into(),
        username: "tester".into(),
        run_tag: format!("{benchmark}__{}", model.replace('/', "__")),
        slurm_job_id: Some("100".into()),
        status: AttemptStatus::Finished,
        reason: "finished".into(),
        config: json!({"run_dir": run_dir.map(|d| d.display().to_string())}),
        metrics: Some(
            json!({"mean_reward": mean, "n_trials": n, "n_errors": errors, "n_valid": valid, "n_expected": n,
                             "errors_by_type": {"DaytonaError": errors}, "infra_errors": {"DaytonaError": errors}}),
        ),
        submitted_at: t,
        started_at: Some(t),
        ended_at: Some(t + chrono::Duration::minutes(40)),
        source_id: None,
    }
}

struct LedgerFixture {
    tmp: tempfile::TempDir,
    spec: String,
    clusters: PathBuf,
    _runs: Vec<Run>,
}

fn ledger_fixture() -> LedgerFixture {
    let tmp = tempfile::tempdir().unwrap();
    let clusters = profile_dir(tmp.path(), "rep", "");
    let spec = format!("sqlite:{}", tmp.path().join("ledger.sqlite").display());
    let ledger = open_ledger(&spec).unwrap();
    // One real run dir, so the report's evidence section has `check` findings.
    let run = Run::new("terminus-2", "http://127.0.0.1:8000/v1");
    healthy_trials(&run, 6);
    run.engine_log(5, &[200, 200, 400]);
    let rows = vec![
        finished("org/Alpha-8B", "terminal_bench_2", 0.42, 89, 3, Some(&run.dir)),
        finished("org/Alpha-8B", "swebench-verified-random-100-folders", 0.31, 300, 10, None),
        finished("org/Alpha-8B", "DCAgent_dev_set_v2", 0.55, 300, 5, None),
        finished("org/Beta-32B", "terminal_bench_2", 0.61, 89, 2, None),
        finished("org/Beta-32B", "DCAgent_dev_set_v2", 0.70, 300, 60, None),
        finished("org/Gamma-7B", "terminal_bench_2", 0.12, 89, 1, None),
    ];
    ledger.import_attempts(&rows).unwrap();
    // An in-flight attempt: pending, no Slurm job yet → `starting`.
    ledger
        .insert_pending(&submitter::ledger::NewAttempt {
            model: "org/Gamma-7B".into(),
            benchmark: "swebench-verified-random-100-folders".into(),
            cluster: "rep".into(),
            username: "tester".into(),
            run_tag: "swebench__org__Gamma-7B".into(),
            agent: "terminus-2".into(),
            reason: "no previous attempt".into(),
            config: json!({"run_dir": tmp.path().join("jobs/swebench__org__Gamma-7B")}),
        })
        .unwrap();
    LedgerFixture { tmp, spec, clusters, _runs: vec![run] }
}

fn session_cmd(fx: &LedgerFixture, command: &str, args: &[&str]) -> Output {
    Command::new(SUBMITTER)
        .arg(command)
        .args(["--cluster", "rep", "--clusters"])
        .arg(&fx.clusters)
        .env("SUBMITTER_LEDGER", &fx.spec)
        .args(args)
        .env("SUBMITTER_HOME", workspace_root())
        .current_dir(fx.tmp.path())
        .output()
        .unwrap()
}

#[test]
fn results_matrix_in_text_json_and_csv() {
    let fx = ledger_fixture();
    let out = session_cmd(&fx, "results", &["--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(m["benchmarks"], json!(["swebench-verified-random-100-folders", "terminal_bench_2", "dev_set_v2"]));
    assert_eq!(m["rank_by"], "terminal_bench_2");
    // Alpha 0.42 and Beta 0.61 over 89 trials: their 95% intervals overlap, a tie; Gamma's lies below.
    assert_eq!(m["ranks"], json!({"org/Alpha-8B": 1, "org/Beta-32B": 1, "org/Gamma-7B": 3}));
    let tb2 = m["rankings"].as_array().unwrap().iter().find(|r| r["benchmark"] == "terminal_bench_2").unwrap();
    assert_eq!(tb2["standings"][0]["model"], "org/Beta-32B");
    assert_eq!(tb2["standings"][0]["rank_label"], "1=");
    assert_eq!(tb2["standings"][0]["interval_basis"], "normal_over_trials");
    let cell = m["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["model"] == "org/Beta-32B" && c["benchmark"] == "dev_set_v2")
        .unwrap();
    assert!(cell["stderr"].is_null(), "dev_set_v2 has no standard error");
    assert_eq!(cell["incomplete"], true, "60 of 300 errored");
    let id = m["id_mean"]["org/Alpha-8B"].as_f64().unwrap();
    assert!((id - (0.42 + 0.31 + 0.55) / 3.0).abs() < 1e-9);
    let text = String::from_utf8_lossy(&session_cmd(&fx, "results", &[]).stdout).into_owned();
    assert!(text.contains("0.420 ±0.052"), "{text}");
    assert!(text.contains("0.700!"), "incomplete marked: {text}");
    let csv = String::from_utf8_lossy(&session_cmd(&fx, "results", &["--csv"]).stdout).into_owned();
    assert!(csv.lines().next().unwrap().contains("terminal_bench_2_stderr"), "{csv}");
    assert!(!csv.contains("dev_set_v2_stderr"), "{csv}");
    assert_eq!(csv.lines().count(), 4);
    let refused = session_cmd(&fx, "results", &["--rank-by", "dev_set_v2"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("partial-credit"));
}

pub(crate) fn chromium() -> Option<PathBuf> {
    for candidate in ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"] {
        if Path::new(candidate).is_file() {
            return Some(PathBuf::from(candidate));
        }
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "chromium missing in CI: scripts/services.sh install installs it"
    );
    eprintln!("skipping: chromium not installed (scripts/services.sh install)");
    None
}

pub(crate) fn headless(browser: &Path, profile: &Path, args: &[&str], page: &Path) -> Output {
    Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
        ])
        .args(["--disable-component-update", "--disable-sync", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap()
}

/// The page as headless chromium renders it (its DOM), checked to have loaded without a script
/// error and with every in-page link's target present (the report's own `data-anchors-ok`).
pub(crate) fn rendered_dom(browser: &Path, profile: &Path, page: &Path) -> String {
    let dom = headless(browser, profile, &["--dump-dom"], page);
    let log = String::from_utf8_lossy(&dom.stderr);
    assert!(dom.status.success(), "chromium failed: {log}");
    assert!(!log.contains("Uncaught"), "script error on the page: {log}");
    let dump = String::from_utf8_lossy(&dom.stdout).into_owned();
    assert!(dump.contains("data-anchors-ok=\"1\""), "every in-page link must have its target:\n{dump}");
    dump
}

/// A 1280×900 screenshot of the page into `png`, checked not to be blank; with
/// `UPDATE_REPORT_SCREENSHOT` set it becomes `docs/<docs_name>`.
pub(crate) fn screenshot(browser: &Path, profile: &Path, page: &Path, png: &Path, docs_name: &str) {
    screenshot_sized(browser, profile, page, png, docs_name, (1280, 900));
}

/// [`screenshot`] of a window `size` (width, height) large.
pub(crate) fn screenshot_sized(
    browser: &Path,
    profile: &Path,
    page: &Path,
    png: &Path,
    docs_name: &str,
    (width, height): (u32, u32),
) {
    let window = format!("--window-size={width},{height}");
    let shot = headless(browser, profile, &[&format!("--screenshot={}", png.display()), &window], page);
    assert!(shot.status.success(), "{}", String::from_utf8_lossy(&shot.stderr));
    let bytes = std::fs::read(png).expect("screenshot written");
    assert_eq!(png_size(&bytes), Some((width, height)));
    assert!(bytes.len() > 20_000, "a blank page compresses to almost nothing: {} bytes", bytes.len());
    if std::env::var_os("UPDATE_REPORT_SCREENSHOT").is_some() {
        std::fs::copy(png, workspace_root().join("docs").join(docs_name)).unwrap();
    }
}

/// Width and height from a PNG's IHDR.
pub(crate) fn png_size(bytes: &[u8]) -> Option<(u32, u32)> {
    if bytes.len() < 24 || &bytes[..8] != b"\x89PNG\r\n\x1a\n" || &bytes[12..16] != b"IHDR" {
        return None;
    }
    Some((u32::from_be_bytes(bytes[16..20].try_into().ok()?), u32::from_be_bytes(bytes[20..24].try_into().ok()?)))
}

/// A model name that would inject an element into the page were it not escaped.
const HOSTILE_MODEL: &str = "org/<img src=x onerror=alert(1)>";

/// Per-trial facts for the fixture's tb2 results (one attempt per task over 89 tasks; `solved` of
/// them solved) and a fourth, hostile-named model: the report then has bootstrap intervals to rank
/// on and a pair to draw per task.
fn with_trial_facts(fx: &LedgerFixture) {
    use submitter::ledger::TrialSet;
    use submitter::stats::Trial;
    let ledger = open_ledger(&fx.spec).unwrap();
    ledger.import_attempts(&[finished(HOSTILE_MODEL, "terminal_bench_2", 0.34, 89, 0, None)]).unwrap();
    let attempts = submitter::verify::results::finished_attempts(&*ledger).unwrap();
    for (model, solved) in [("org/Alpha-8B", 37), ("org/Beta-32B", 54), ("org/Gamma-7B", 11), (HOSTILE_MODEL, 30)] {
        let attempt = attempts.iter().find(|a| a.model == model && a.benchmark == "terminal_bench_2").unwrap();
        // Spread the solved tasks so the two models differ on some tasks each way.
        let trials = (0..89)
            .map(|t| Trial {
                task: format!("task-{t:02}"),
                attempt: 1,
                reward: f64::from(u8::from((t * 7 + solved) % 89 < solved)),
                // Gamma's first task errored before its verifier ran (unsolved either way).
                valid: !(model == "org/Gamma-7B" && t == 0),
            })
            .collect();
        ledger.record_trials(attempt.id, &TrialSet { harbor_version: Some("0.25.0".into()), trials }).unwrap();
    }
}

#[test]
fn report_renders_in_a_real_browser() {
    let fx = ledger_fixture();
    with_trial_facts(&fx);
    let page = fx.tmp.path().join("out/report.html");
    // `report --html` writes into an existing directory only (issue 21).
    std::fs::create_dir_all(page.parent().unwrap()).unwrap();
    let out = session_cmd(&fx, "report", &["--html", page.to_str().unwrap(), "--title", "Nightly evals"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    for external in ["<link ", "src=\"http", "href=\"http", "@import", "url("] {
        assert!(!html.contains(external), "external asset `{external}` in the report");
    }
    let Some(browser) = chromium() else { return };
    let profile = tempfile::tempdir().unwrap();
    let dump = rendered_dom(&browser, profile.path(), &page);
    assert!(dump.contains("<title>Nightly evals</title>"));
    for expected in ["0.420", "±0.052", "0.610", "0.700", "org/Gamma-7B", "swebench-100", "In-flight jobs", "starting"]
    {
        assert!(dump.contains(expected), "`{expected}` missing from the rendered page");
    }
    // The Alpha tb2 cell links to its run's evidence, which holds `check`'s findings.
    let alpha =
        dump.split("data-model=\"org/Alpha-8B\" data-benchmark=\"terminal_bench_2\"").nth(1).expect("Alpha tb2 cell");
    let target = alpha.split("href=\"#").nth(1).unwrap().split('"').next().unwrap();
    let section = dump.split(&format!("id=\"{target}\"")).nth(1).expect("the cell's section");
    assert!(
        section.contains("Checks:") && section.contains("completions"),
        "evidence section: {}",
        &section[..section.len().min(2000)]
    );

    // Gamma's evidence shows both means, labelled, and the Harbor that produced them (11 solved
    // of 89 trials, one of them invalid: 12.4 with it counted as 0, 12.5 without it).
    let gamma =
        dump.split("data-model=\"org/Gamma-7B\" data-benchmark=\"terminal_bench_2\"").nth(1).expect("Gamma tb2 cell");
    let target = gamma.split("href=\"#").nth(1).unwrap().split('"').next().unwrap();
    let section = dump.split(&format!("id=\"{target}\"")).nth(1).expect("the cell's section");
    let section = &section[..section.find("</section>").unwrap()];
    assert!(
        section.contains("invalid as 0 12.4")
            && section.contains("invalid dropped 12.5")
            && section.contains("Harbor 0.25.0"),
        "{section}"
    );

    // It opens with the ranking, then the matrix (rows in rank order), then the plots.
    let at = |id: &str| dump.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no #{id}"));
    assert!(at("ranking") < at("matrix") && at("matrix") < at("plots") && at("plots") < at("team"));
    let matrix = &dump[at("matrix")..at("plots")];
    assert!(matrix.find("org/Beta-32B").unwrap() < matrix.find("org/Alpha-8B").unwrap(), "rank order");
    // The plots, as the browser built them: tb2's ranking of four models on bootstrap intervals, one
    // scatter (tb2 against dev_set_v2: Alpha and Beta have both), Beta against Alpha per task.
    let tb2 = dump.split("class=\"plot intervals\" data-benchmark=\"terminal_bench_2\"").nth(1).expect("tb2 ranking");
    let tb2 = &tb2[..tb2.find("</svg>").unwrap()];
    assert_eq!(tb2.matches("<g class=\"standing\"").count(), 4, "{tb2}");
    assert_eq!(tb2.matches("<line class=\"ci\"").count(), 4, "{tb2}");
    assert!(tb2.contains("bootstrap over tasks"), "{tb2}");
    assert_eq!(dump.matches("class=\"plot scatter\"").count(), 1);
    assert_eq!(dump.matches("class=\"plot heatmap\" data-a=\"org/Beta-32B\" data-b=\"org/Alpha-8B\"").count(), 1);
    assert_eq!(dump.matches("<rect class=\"task\"").count(), 2 * 89);
    // The hostile name is text, never an element.
    assert!(!dump.contains("<img"), "an injected element");
    assert!(dump.contains("org/&lt;img src=x onerror=alert(1)&gt;"));

    screenshot(&browser, profile.path(), &page, &fx.tmp.path().join("report.png"), "report.png");
    // The page down to its plots: a taller window (a headless screenshot at the `#plots` anchor
    // paints only the top of the page).
    screenshot_sized(
        &browser,
        profile.path(),
        &page,
        &fx.tmp.path().join("plots.png"),
        "report-plots.png",
        (1280, 1500),
    );
}

// ---------------------------------------------------------------------------------------------
// Live: the local Slurm, payload and the stand-ins

/// A cluster on the local Slurm whose engine reads a control file and whose dataset is long
/// enough (1,000 tasks × 0.6 s, 2 at a time) to outlast the test.
struct LiveCluster {
    tmp: tempfile::TempDir,
    name: String,
    ledger: String,
    control: PathBuf,
}

impl LiveCluster {
    fn new(name: &str) -> LiveCluster {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        standin_environment(root);
        write_tasks(&root.join("datasets/DCAgent2_terminal_bench_2"), (0..1000).map(|task| format!("task-{task:03}")));
        test_secrets_file(root);
        let control = root.join("engine-control");
        std::fs::write(&control, "normal\n").unwrap();
        let r = root.display();
        let extra = format!(
            "  datasets_dirs:\n    - {r}/datasets\nsecrets:\n  file: {r}/secrets.env\nlimits:\n  max_jobs_in_flight: 4\n  submission_delay_s: 0\n  n_concurrent: 2\n  n_concurrent_ceiling: 2\n  walltime_lead_s: 60\n"
        );
        let clusters = profile_dir(root, name, &extra);
        let profile = clusters.join(format!("{name}.yaml"));
        let text = std::fs::read_to_string(&profile)
            .unwrap()
            .replace("  time: \"00:10:00\"\n", "  time: \"00:10:00\"\n  export_env: [PAYLOAD_GPU_FIXTURE]\n")
            .replace(
                "engine:\n  default_environment: otagent\n",
                &format!("engine:\n  default_environment: otagent\n  health_timeout_s: 60\n  env:\n    STANDIN_LOAD_SECONDS: \"0.3\"\n    STANDIN_CONTROL_FILE: {}\n", control.display()),
            )
            .replace("harbor:\n  environment: otagent\n", "harbor:\n  environment: otagent\n  env:\n    STANDIN_TRIAL_SECONDS: \"0.6\"\n    STANDIN_REQUEST_TIMEOUT: \"5\"\n    STANDIN_EXTRAS: daytona\n");
        std::fs::write(&profile, text).unwrap();
        let ledger = format!("sqlite:{}", root.join("ledger.sqlite").display());
        LiveCluster { tmp, name: name.to_string(), ledger, control }
    }

    fn run(&self, command: &str, args: &[&str]) -> Output {
        Command::new(SUBMITTER)
            .arg(command)
            .args(["--cluster", &self.name, "--clusters"])
            .arg(self.tmp.path().join("clusters"))
            .args(args)
            .env_clear()
            .env("SUBMITTER_LEDGER", &self.ledger)
            .env("PATH", std::env::var("PATH").unwrap())
            .env("HOME", std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
            .env("USER", "tester")
            .env("SUBMITTER_HOME", workspace_root())
            .env("PAYLOAD_GPU_FIXTURE", workspace_root().join("tests/fixtures/gpus-4x-a100-64gb.json"))
            .current_dir(self.tmp.path())
            .output()
            .unwrap()
    }

    fn launch(&self) -> String {
        let out = self.run("launch", &["--once", "--preset", "tb2", "--model", "test/Tiny-1B"]);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("1 submitted"), "{text}");
        let ledger = open_ledger(&self.ledger).unwrap();
        ledger.active().unwrap()[0].slurm_job_id.clone().expect("job id")
    }

    /// One `status --json` row.
    fn status(&self) -> Value {
        let out = self.run("status", &["--json", "--hours", "0"]);
        let rows: Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
        rows["jobs"][0].clone()
    }

    /// Polls `status` until `done` holds; returns the row, the time it took and every verdict seen.
    fn wait_status(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> (Value, Duration, Vec<String>) {
        let start = Instant::now();
        let mut seen = Vec::new();
        loop {
            let row = self.status();
            let v = row["verdict"]["verdict"].as_str().unwrap_or("-").to_string();
            if seen.last() != Some(&v) {
                seen.push(v);
            }
            if done(&row) {
                return (row, start.elapsed(), seen);
            }
            assert!(
                start.elapsed() < timeout,
                "timed out after {timeout:?} waiting for {what}; verdicts seen {seen:?}; last row {row:#}"
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

impl Drop for LiveCluster {
    fn drop(&mut self) {
        if let Ok(ledger) = open_ledger(&self.ledger) {
            for a in ledger.active().unwrap_or_default() {
                if let Some(job) = a.slurm_job_id {
                    let _ = Command::new("scancel").arg(job).status();
                }
            }
        }
    }
}

/// The engine starts answering 400s mid-run: `status` says `misconfigured` within two heartbeats
/// (payload writes one every 15 s).
#[test]
fn live_status_flips_to_misconfigured_when_400s_start() {
    if !slurm_up() {
        return;
    }
    let cluster = LiveCluster::new("vfy400");
    let job = cluster.launch();
    let (row, _, _) = cluster.wait_status("a healthy run with completions", Duration::from_secs(120), |r| {
        r["verdict"]["verdict"] == "healthy" && r["verdict"]["rate"]["completions"].as_u64() > Some(0)
    });
    assert_eq!(row["slurm_job_id"], job.as_str());
    std::fs::write(&cluster.control, "bad_request\n").unwrap();
    let (row, took, seen) =
        cluster.wait_status("misconfigured", Duration::from_secs(60), |r| r["verdict"]["verdict"] == "misconfigured");
    eprintln!("misconfigured after {took:?} (verdicts {seen:?})");
    assert!(took <= Duration::from_secs(2 * 15 + 5), "took {took:?}: more than two heartbeats");
    let summary = row["verdict"]["summary"].as_str().unwrap();
    assert!(summary.starts_with("context overflow"), "{row:#}");
    assert_eq!(row["slurm"], "RUNNING");
    // The text form names it too, and exits 1.
    let out = cluster.run("status", &["--hours", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("misconfigured"), "{}", String::from_utf8_lossy(&out.stdout));
    // And check on the run dir agrees from the files alone.
    let (report, code, _) = check(&[Path::new(row["run_dir"].as_str().unwrap())], &[]);
    assert_eq!(code, Some(1));
    assert!(finding(&report, "engine.bad_requests").is_some(), "{report:#}");
}

/// The engine hangs (health fails, process alive): payload ends the run as `engine_died` at its
/// limit of failed probes, `status` says `failed` (and `dead` only by that same rule, while payload
/// tears down: issue 31's one death rule), and after `sync` the ledger row is failed.
#[test]
fn live_hung_engine_ends_as_engine_died_and_a_failed_row() {
    if !slurm_up() {
        return;
    }
    let cluster = LiveCluster::new("vfyhang");
    cluster.launch();
    cluster.wait_status("a healthy run", Duration::from_secs(120), |r| r["verdict"]["verdict"] == "healthy");
    std::fs::write(&cluster.control, "hang\n").unwrap();
    let (row, took, seen) =
        cluster.wait_status("the run to end", Duration::from_secs(180), |r| r["verdict"]["verdict"] == "failed");
    eprintln!("failed after {took:?} (verdicts {seen:?})");
    let expected = ["healthy", "dead", "failed"];
    assert!(seen.iter().all(|v| expected.contains(&v.as_str())), "{seen:?}");
    assert!(
        seen.windows(2).all(|w| expected.iter().position(|e| *e == w[0]) < expected.iter().position(|e| *e == w[1])),
        "{seen:?}"
    );
    assert!(row["verdict"]["summary"].as_str().unwrap().starts_with("engine_died/unhealthy"), "{row:#}");
    let ledger = open_ledger(&cluster.ledger).unwrap();
    let attempt = ledger.active().unwrap()[0].clone();
    let out = cluster.run("sync", &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let after = ledger.attempt(attempt.id).unwrap().unwrap();
    assert_eq!(after.status, AttemptStatus::Failed);
    assert!(after.reason.starts_with("engine_died/unhealthy"), "{}", after.reason);
    let out = cluster.run("status", &["--json", "--hours", "1"]);
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows["jobs"][0]["verdict"]["verdict"], "failed");
    // `logs JOB` finds the job's files through the ledger.
    let out = cluster.run("logs", &[attempt.slurm_job_id.as_deref().unwrap(), "--engine"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Starting vLLM server"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One cancel rule (issue 34): `status --watch` only looks — a job that stays dead is left running
/// and its attempt untouched. Remediation cancels it (`remediate`, as each launch iteration does)
/// once the dead verdict has held past `remediation.dead_after_s`, and records why, so dedup
/// resubmits it.
#[test]
fn a_job_that_stays_dead_is_cancelled_by_remediation_never_by_status_watch() {
    if !slurm_up() {
        return;
    }
    let cluster = LiveCluster::new("vfycancel");
    // A batch script that never reaches payload: RUNNING without status.json → dead at once.
    let script = cluster.tmp.path().join("sleep.sbatch");
    std::fs::write(&script, "#!/bin/bash\nsleep 300\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let profile = cluster.tmp.path().join("clusters/vfycancel.yaml");
    let text = std::fs::read_to_string(&profile)
        .unwrap()
        .replace("  time: \"00:10:00\"\n", &format!("  time: \"00:10:00\"\n  script: {}\n", script.display()))
        + "verify:\n  no_status_after_s: 0\nremediation:\n  enabled: true\n  dead_after_s: 2\n";
    std::fs::write(&profile, text).unwrap();
    let job = cluster.launch();
    cluster.wait_status("the job to run and look dead", Duration::from_secs(60), |r| r["verdict"]["verdict"] == "dead");
    let mut watch = Command::new(SUBMITTER)
        .args(["status", "--watch", "--interval", "1s", "--hours", "0", "--cluster", &cluster.name, "--clusters"])
        .arg(cluster.tmp.path().join("clusters"))
        .env("SUBMITTER_LEDGER", &cluster.ledger)
        .env("SUBMITTER_HOME", workspace_root())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let _ = watch.kill();
    let _ = watch.wait();
    let ledger = open_ledger(&cluster.ledger).unwrap();
    assert_eq!(ledger.active().unwrap().len(), 1, "status --watch changed the attempt");
    let start = Instant::now();
    while !ledger.active().unwrap().is_empty() && start.elapsed() < Duration::from_secs(60) {
        let out = cluster.run("remediate", &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_secs(1));
    }
    let attempt = &ledger.attempts_for("test/Tiny-1B", "terminal_bench_2").unwrap()[0];
    assert_eq!(attempt.status, AttemptStatus::Failed, "{}", attempt.reason);
    assert!(attempt.reason.starts_with("remediation cancel ("), "{}", attempt.reason);
    // A cancelled job passes through COMPLETING while Slurm ends its step (under proctrack/cgroup,
    // the whole cgroup): wait for it to leave that state.
    let squeue_state = || {
        let out = Command::new("squeue").args(["-h", "--states=all", "-j", &job, "-o", "%T"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut state = squeue_state();
    let waited = Instant::now();
    while state.contains("COMPLETING") && waited.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
        state = squeue_state();
    }
    assert!(state.contains("CANCELLED") || state.trim().is_empty(), "job {job}: {state}");
    let plan = cluster.run("plan", &["--preset", "tb2", "--model", "test/Tiny-1B", "--json"]);
    let decisions: Value = serde_json::from_slice(&plan.stdout).unwrap();
    assert_eq!(decisions["jobs"][0]["decision"], "resubmit", "{decisions}");
}

/// Issue 21 item 12: `logs --engine -n 5` on a 20 GB sparse `vllm.log` (no newline but in its last
/// bytes) prints its last lines at once; with no newline at all it stops looking 16 MiB back
/// instead of reading 20 GB backwards.
#[test]
fn logs_tail_of_a_huge_sparse_log_is_quick() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("vllm.log");
    let file = std::fs::File::create(&log).unwrap();
    file.set_len(20 << 30).unwrap();
    let tail = |n: &str| {
        let started = std::time::Instant::now();
        let out = Command::new(SUBMITTER).arg("logs").arg(tmp.path()).args(["--engine", "-n", n]).output().unwrap();
        (out, started.elapsed())
    };
    let (out, took) = tail("5");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.len() as u64 <= 16 << 20, "at most the 16 MiB window: {} bytes", out.stdout.len());
    assert!(took < std::time::Duration::from_secs(20), "took {took:?}");
    use std::io::Write;
    let mut append = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    append.write_all(b"\nl1\nl2\nl3\nl4\nl5\nl6\n").unwrap();
    let (out, took) = tail("5");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "l2\nl3\nl4\nl5\nl6\n");
    assert!(took < std::time::Duration::from_secs(20), "took {took:?}");
}

/// A job's `status.json` with a final outcome and the GPU time payload recorded.
fn status_with_gpu(run_tag: &str, gpu: launch_spec::shared::GpuTime, done: bool) -> launch_spec::records::RunStatus {
    let t = Utc::now() - chrono::Duration::hours(2);
    let mut st = running_status(run_tag, "100", t, t + chrono::Duration::seconds(60), Counters::default(), t);
    st.gpu_time = Some(gpu);
    if done {
        st.phase = launch_spec::records::Phase::Done;
        st.outcome = Some(launch_spec::records::Outcome {
            class: launch_spec::records::OutcomeClass::Finished,
            cause: None,
            exit_code: 0,
            message: "finished".into(),
            harbor_exit_code: Some(0),
            signal: None,
            engine_log_tail: Vec::new(),
        });
    }
    st
}

/// A Slurm job that started at 05:00:00 and ended `elapsed_s` later (the controller's local time).
fn ended_job(elapsed_s: i64) -> submitter::slurm::JobInfo {
    let start = chrono::NaiveDate::from_ymd_opt(2026, 11, 30).unwrap().and_hms_opt(5, 0, 0).unwrap();
    let fmt = |t: chrono::NaiveDateTime| t.format("%Y-%m-%dT%H:%M:%S").to_string();
    submitter::slurm::JobInfo {
        id: submitter::slurm::JobId(100),
        name: "eval".into(),
        state: submitter::slurm::JobState::Completed,
        reason: None,
        submit_time: Some(fmt(start - chrono::Duration::hours(3))),
        start_time: Some(fmt(start)),
        end_time: Some(fmt(start + chrono::Duration::seconds(elapsed_s))),
        node_list: None,
        partition: None,
        exit: None,
        std_out: None,
        details: Default::default(),
    }
}

/// Issue 24: GPU-hours per result with known timings, from hand-written run dirs (a per-leg job,
/// a shared job of two legs, a failed attempt) through sync's record to `results` (JSON and
/// text) and the report. Queue wait (3 h before the start) is never counted.
#[test]
fn gpu_hours_per_result_with_known_timings() {
    use launch_spec::shared::{GpuTime, LegSpan};
    let tmp = tempfile::tempdir().unwrap();
    let clusters = profile_dir(tmp.path(), "rep", "");
    let spec = format!("sqlite:{}", tmp.path().join("ledger.sqlite").display());
    let ledger = open_ledger(&spec).unwrap();
    let span = |tag: &str, a: f64, b: f64| LegSpan { run_tag: tag.into(), start_s: a, end_s: b };
    let (tb2, swe, v2) = ("tb2__Alpha", "swe__Alpha", "v2__Alpha");
    let jobs = tmp.path().join("jobs");
    // Per-leg, 2 GPUs: 10 + 290 + 3000 + 10 s of phases, Slurm ran it 3330 s → 2 × 3330 = 1.85 h.
    let per_leg = RunDir::at(jobs.join(tb2));
    let per_leg_gpu = GpuTime {
        gpus: 2,
        prepare_s: 10.0,
        load_s: 290.0,
        serving_s: 3000.0,
        teardown_s: 10.0,
        legs: vec![span(tb2, 300.0, 3300.0)],
        ..GpuTime::default()
    };
    per_leg.status(&status_with_gpu(tb2, per_leg_gpu, true), None);
    // Shared, 4 GPUs, 600 s load, swe serves 600–4200 and v2 600–2400; Slurm 4230 s. swe: 1200
    // load + 4 × (900 + 1800) serving + 60 remainder = 12060 (3.35 h); v2: 1200 + 3600 + 60 (1.35 h).
    let group = jobs.join("Alpha-shared-0123abcd");
    let shared_gpu = GpuTime {
        gpus: 4,
        load_s: 600.0,
        serving_s: 3600.0,
        legs: vec![span(swe, 600.0, 4200.0), span(v2, 600.0, 2400.0)],
        ..GpuTime::default()
    };
    // Written first as a heartbeat (a leg ended while the other still runs), then final.
    RunDir::at(&group).status(&status_with_gpu("Alpha-shared-0123abcd", shared_gpu.clone(), false), None);
    let shared = json!({"group_tag": "Alpha-shared-0123abcd", "group_dir": group, "legs": [swe, v2]});
    let mut rows = vec![
        finished("org/Alpha-8B", "terminal_bench_2", 0.42, 89, 3, Some(per_leg.path())),
        finished("org/Alpha-8B", "swebench-verified-random-100-folders", 0.31, 300, 10, None),
        finished("org/Alpha-8B", "DCAgent_dev_set_v2", 0.55, 300, 5, None),
        finished("org/Beta-32B", "terminal_bench_2", 0.61, 89, 2, None),
    ];
    for (row, tag) in rows.iter_mut().zip([tb2, swe, v2, "tb2__Beta"]) {
        row.run_tag = tag.into();
    }
    rows[1].config["shared"] = shared.clone();
    rows[2].config["shared"] = shared;
    rows[3].status = AttemptStatus::Failed;
    rows[3].metrics = None;
    ledger.import_attempts(&rows).unwrap();
    let attempt = |tag: &str| ledger.find_by_run_tag(tag).unwrap().pop().unwrap();
    let status = submitter::sync::read_status(per_leg.path());
    // Each call is its own sync: its own observation of the group dir's record.
    let world = || submitter::sync::Observation::empty(chrono::Utc::now());
    let early = submitter::sync::gpu_record(&attempt(v2), &world(), None, Some(&ended_job(4230))).unwrap();
    assert!(!early.complete, "the host's record is not final yet: a later sync recomputes it");
    RunDir::at(&group).status(&status_with_gpu("Alpha-shared-0123abcd", shared_gpu, true), None);
    for (tag, elapsed) in [(tb2, 3330), (swe, 4230), (v2, 4230)] {
        let a = attempt(tag);
        let rec = submitter::sync::gpu_record(
            &a,
            &world(),
            status.as_ref().filter(|_| tag == tb2),
            Some(&ended_job(elapsed)),
        )
        .unwrap_or_else(|| panic!("no record for {tag}"));
        assert!(rec.complete, "{tag}: {rec:?}");
        ledger.record_gpu_seconds(a.id, &rec.to_json()).unwrap();
    }
    // The failed attempt: 1 GPU, 100 s load + 260 s serving, Slurm's times unknown: 0.1 h.
    let failed = json!({"gpus": 1, "shared": null, "complete": true, "slurm_elapsed_s": null,
                        "by_phase": {"load": 100.0, "serving": 260.0}});
    ledger.record_gpu_seconds(attempt("tb2__Beta").id, &failed).unwrap();
    let fx = LedgerFixture { tmp, spec, clusters, _runs: Vec::new() };

    let out = session_cmd(&fx, "results", &["--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cell = |bench: &str| {
        m["cells"].as_array().unwrap().iter().find(|c| c["model"] == "org/Alpha-8B" && c["benchmark"] == bench).unwrap()
    };
    assert_eq!(cell("terminal_bench_2")["gpu_hours"], 1.85, "{m}");
    assert_eq!(cell("terminal_bench_2")["gpu_seconds_by_phase"]["slurm_other"], 40.0, "{m}");
    assert_eq!(cell("terminal_bench_2")["gpu_seconds_by_phase"]["load"], 580.0, "{m}");
    assert_eq!(cell("swebench-verified-random-100-folders")["gpu_hours"], 3.35, "{m}");
    assert_eq!(cell("swebench-verified-random-100-folders")["gpu_seconds_by_phase"]["serving"], 10800.0);
    assert_eq!(cell("dev_set_v2")["gpu_hours"], 1.35, "{m}");
    assert_eq!(cell("dev_set_v2")["gpu_seconds_by_phase"]["load"], 1200.0, "{m}");
    let totals = &m["gpu_hours"];
    assert_eq!(totals["gpu_hours"], 6.65, "every recorded attempt, the failed one too: {totals}");
    assert_eq!(totals["attempts"], 4);
    assert_eq!(totals["by_benchmark"]["terminal_bench_2"], 1.95, "{totals}");
    assert_eq!(totals["by_model"]["org/Alpha-8B"], 6.55, "{totals}");

    let text = String::from_utf8_lossy(&session_cmd(&fx, "results", &[]).stdout).into_owned();
    assert!(text.contains("GPU-hours per result"), "{text}");
    let alpha = text.lines().filter(|l| l.starts_with("org/Alpha-8B")).nth(1).unwrap_or_default();
    for v in ["1.85", "3.35", "1.35"] {
        assert!(alpha.contains(v), "{v} in {alpha:?}:\n{text}");
    }
    assert!(text.contains("total: 6.65 GPU-hours over 4 attempt(s)"), "{text}");

    let html = fx.tmp.path().join("report.html");
    let out = session_cmd(&fx, "report", &["--html", html.to_str().unwrap(), "--no-check"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("3.35 GPU-h"), "per score");
    assert!(page.contains("data-total=\"6.650\""), "the total");
    assert!(page.contains(">1.95</td>"), "per benchmark (tb2: 1.85 + 0.10)");

    // A leg recorded while its host still ran (`complete: false`, stale figures) is recomputed by
    // the next `sync` once the host's record is final (its job long gone from Slurm: no remainder).
    if !slurm_up() {
        return;
    }
    let v2_id = attempt(v2).id;
    let mut stale = early.to_json();
    stale["by_phase"] = json!({"load": 1.0});
    ledger.record_gpu_seconds(v2_id, &stale).unwrap();
    let ledger_v2 = |l: &dyn submitter::ledger::Ledger| l.gpu_seconds().unwrap().into_iter().find(|r| r.id == v2_id);
    let out = session_cmd(&fx, "sync", &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rec = submitter::gpuhours::AttemptGpu::from_json(&ledger_v2(&*ledger).unwrap().record).unwrap();
    assert!(rec.complete, "{rec:?}");
    assert_eq!(rec.by_phase.0["load"], 1200.0, "{rec:?}");
    assert_eq!(rec.by_phase.0["serving"], 3600.0, "{rec:?}");
}
