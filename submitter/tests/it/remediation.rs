//! Remediation on the real local Slurm with the stand-ins (docs/verification.md "Remediation"):
//! an engine that runs out of memory at start is retried once with a lower ceiling and finishes; a
//! job whose trials fail instantly is cancelled and its pair held until `submitter release`; every
//! step is a ledger record and a `status` line; a dry run prints the same decisions and changes
//! nothing. Without a reachable Slurm these print `skipping: no local Slurm` (and fail in CI).

#![allow(clippy::print_stderr)]

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use submitter::ledger::{AttemptStatus, Ledger, open_ledger};

use crate::ledger::Store;
use crate::queueing::{TestCluster, cancel_all, text, wait_until};
use crate::support::{slurm_up, write_tasks};

const MODEL: &str = "test/Tiny-1B";

fn launch_once(cluster: &TestCluster, ledger: &str, extra: &[&str]) -> String {
    let args = [&["--once", "--preset", "tb2", "--model", MODEL][..], extra].concat();
    let out = cluster.run(&["launch"], ledger, &args, &[]);
    let t = text(&out);
    assert!(out.status.success() || extra.contains(&"--dry-run"), "launch {extra:?}: {t}");
    t
}

fn attempts(ledger: &dyn Ledger) -> Vec<submitter::ledger::Attempt> {
    ledger.attempts_for(MODEL, "terminal_bench_2").unwrap()
}

fn wait_idle(cluster: &TestCluster, ledger_spec: &str, ledger: &dyn Ledger, what: &str) {
    wait_until(what, Duration::from_secs(180), || {
        cluster.run(&["sync"], ledger_spec, &[], &[]);
        ledger.active().unwrap().is_empty()
    });
}

/// The decision lines a command printed (`remediation: …`), without the dry-run marker.
fn decision_lines(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|l| l.trim_start_matches("(dry run) ").strip_prefix("remediation: ").map(str::to_string))
        .collect()
}

/// OOM at start → the pair is retried once with `serve.gpu_memory_utilization` a step lower
/// (explicit in the new launch spec and in `plan`) → the second attempt finishes. The dry run
/// before it prints the very decision the real pass then takes, and writes nothing.
#[test]
fn an_engine_oom_at_start_is_retried_once_with_a_lower_ceiling_and_finishes() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let cluster = TestCluster::new("rm-oom", |p| {
        *p = p
            .replace("  arch: x86_64\n", "  arch: x86_64\n  gpu_memory_utilization: 0.9\n")
            .replace("STANDIN_LOAD_SECONDS: \"0.3\"", "STANDIN_LOAD_SECONDS: \"0.3\"\n    STANDIN_OOM_ABOVE: \"0.87\"");
        p.push_str("remediation: {enabled: true, gpu_memory_step: 0.05}\n");
    });
    let ledger_spec = &store.spec;
    let ledger = open_ledger(ledger_spec).unwrap();
    assert!(launch_once(&cluster, ledger_spec, &[]).contains("1 submitted"));
    wait_idle(&cluster, ledger_spec, &*ledger, "the OOM job to end and sync");
    let first = attempts(&*ledger).pop().unwrap();
    assert_eq!(first.status, AttemptStatus::Failed, "{}", first.reason);

    // Dry runs: `remediate --dry-run` and `launch --dry-run` print the decision, change nothing.
    let before = (ledger.remediations().unwrap(), attempts(&*ledger));
    let dry = cluster.run(&["remediate"], ledger_spec, &["--dry-run"], &[]);
    assert!(dry.status.success(), "{}", text(&dry));
    let dry_lines = decision_lines(&text(&dry));
    assert_eq!(dry_lines.len(), 1, "{}", text(&dry));
    assert!(
        dry_lines[0].starts_with(&format!("retry {MODEL} on "))
            && dry_lines[0].contains("[serve.gpu_memory_utilization 0.90 → 0.85]")
            && dry_lines[0].contains("outcome.engine_start.oom"),
        "{}",
        dry_lines[0]
    );
    let dry_launch = launch_once(&cluster, ledger_spec, &["--dry-run"]);
    assert_eq!(decision_lines(&dry_launch), dry_lines, "{dry_launch}");
    assert_eq!((ledger.remediations().unwrap(), attempts(&*ledger)), before, "a dry run wrote");

    // The real iteration: remediation, then the plan resubmits with the change.
    let real = launch_once(&cluster, ledger_spec, &[]);
    assert_eq!(decision_lines(&real), dry_lines, "the real pass decided what the dry run printed: {real}");
    assert!(real.contains("1 submitted"), "{real}");
    let records = ledger.remediations().unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    let r = &records[0];
    assert_eq!((r.action.as_str(), r.finding.as_str()), ("retry", "outcome.engine_start.oom"));
    assert_eq!(r.attempt.map(|a| a.0), Some(first.id.0));
    assert_eq!(r.adjustment.as_ref().and_then(|a| a.gpu_memory_utilization), Some(0.85));
    let second = attempts(&*ledger).pop().unwrap();
    assert_ne!(second.id, first.id);
    let spec: Value = serde_json::from_slice(
        &std::fs::read(PathBuf::from(second.config["spec"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    assert_eq!(spec["serve"]["gpu_memory_utilization"].as_f64(), Some(0.85), "{}", spec["serve"]);
    // `status` shows the step on the attempt it launched.
    let status = cluster.run(&["status"], ledger_spec, &["--json"], &[]);
    let doc: Value = serde_json::from_slice(&status.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&status)));
    let row = doc["jobs"].as_array().unwrap().iter().find(|j| j["attempt"] == second.id.0).cloned();
    let remedy = row.as_ref().and_then(|r| r["remedy"].as_str()).unwrap_or_default().to_string();
    assert!(
        remedy.contains(&format!("after the retry of attempt {} (outcome.engine_start.oom)", first.id.0))
            && remedy.contains("serve.gpu_memory_utilization 0.85"),
        "{doc:#}"
    );

    wait_idle(&cluster, ledger_spec, &*ledger, "the retried job to finish and sync");
    let second = ledger.attempt(second.id).unwrap().unwrap();
    assert_eq!(second.status, AttemptStatus::Finished, "{}", second.reason);
    // Once: the finished pair is a skip, and no new record.
    let again = launch_once(&cluster, ledger_spec, &[]);
    assert!(decision_lines(&again).is_empty(), "{again}");
    assert_eq!(ledger.remediations().unwrap().len(), 1);
    // `plan` shows the pair's adjustment; `status` the record on the attempt it acted on.
    let plan = cluster.run(&["plan"], ledger_spec, &["--preset", "tb2", "--model", MODEL], &[]);
    assert!(text(&plan).contains("remedied") && text(&plan).contains("serve.gpu_memory_utilization 0.85"), "{}", text(&plan));
    cancel_all(&*ledger);
}

/// Trials that fail instantly (the engine generates no token: every trial ends at once without
/// output) → the running job is cancelled, its attempt failed with the diagnosis, its pair held:
/// `plan` says so and how to clear it, `launch` does not resubmit it, `status` shows the record;
/// `submitter release` clears it and the next launch submits the pair again.
#[test]
fn instant_trial_failures_cancel_the_job_and_hold_the_pair_until_released() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let cluster = TestCluster::new("rm-instant", |p| {
        *p = p
            .replace("STANDIN_LOAD_SECONDS: \"0.3\"", "STANDIN_LOAD_SECONDS: \"0.3\"\n    STANDIN_COMPLETION_TOKENS: \"0\"")
            .replace("STANDIN_TRIAL_SECONDS: \"0.05\"", "STANDIN_TRIAL_SECONDS: \"2\"");
        p.push_str("remediation: {enabled: true}\n");
    });
    // Enough trials that the job still runs when the failures have piled up.
    let names: Vec<String> = (0..60).map(|i| format!("t{i}")).collect();
    write_tasks(&cluster.root().join("datasets/DCAgent2_terminal_bench_2"), &names);
    let ledger_spec = &store.spec;
    let ledger = open_ledger(ledger_spec).unwrap();
    assert!(launch_once(&cluster, ledger_spec, &[]).contains("1 submitted"));
    let attempt = attempts(&*ledger).pop().unwrap();
    let mut dry_lines = Vec::new();
    wait_until("three instant failures to be diagnosed", Duration::from_secs(240), || {
        cluster.run(&["sync"], ledger_spec, &[], &[]);
        let dry = cluster.run(&["remediate"], ledger_spec, &["--dry-run"], &[]);
        dry_lines = decision_lines(&text(&dry));
        assert!(ledger.attempt(attempt.id).unwrap().unwrap().status.is_active(), "ended before the diagnosis");
        !dry_lines.is_empty()
    });
    assert!(ledger.remediations().unwrap().is_empty(), "the dry runs wrote");
    assert!(dry_lines[0].starts_with("hold ") && dry_lines[0].contains("trials.instant_fail"), "{dry_lines:?}");
    let job = attempt.slurm_job_id.clone().unwrap();
    assert!(dry_lines[0].contains(&format!("cancels job {job}")), "{dry_lines:?}");

    let real = cluster.run(&["remediate"], ledger_spec, &[], &[]);
    assert!(real.status.success(), "{}", text(&real));
    assert!(decision_lines(&text(&real))[0].starts_with("hold "), "{}", text(&real));
    let after = ledger.attempt(attempt.id).unwrap().unwrap();
    assert_eq!(after.status, AttemptStatus::Failed);
    assert!(after.reason.starts_with("remediation hold (trials.instant_fail:"), "{}", after.reason);
    wait_until("Slurm to end the cancelled job", Duration::from_secs(120), || {
        let out = std::process::Command::new("squeue").args(["-h", "-j", &job, "-o", "%T"]).output().unwrap();
        let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
        state.is_empty() || state == "CANCELLED"
    });
    let records = ledger.remediations().unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!((records[0].action.as_str(), records[0].finding.as_str()), ("hold", "trials.instant_fail"));

    // Held: plan says so with the clear command; launch submits nothing; status shows the record.
    let plan = cluster.run(&["plan"], ledger_spec, &["--preset", "tb2", "--model", MODEL, "--json"], &[]);
    let doc: Value = serde_json::from_slice(&plan.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&plan)));
    let pair = &doc["jobs"][0];
    assert_eq!(pair["blocked"]["kind"], "held", "{pair:#}");
    let why = pair["blocked"]["why"].as_str().unwrap();
    assert!(why.starts_with("held: trials.instant_fail") && why.contains("submitter release --model test/Tiny-1B"), "{why}");
    let launched = launch_once(&cluster, ledger_spec, &[]);
    assert!(launched.contains("0 submitted"), "{launched}");
    assert_eq!(attempts(&*ledger).len(), 1, "a held pair was resubmitted");
    let status = cluster.run(&["status"], ledger_spec, &["--hours", "1"], &[]);
    assert!(text(&status).contains("⚕ remediation: hold"), "{}", text(&status));

    // A person clears it: the next launch submits the pair again.
    let release = cluster.run(&["release"], ledger_spec, &["--model", MODEL, "--benchmark", "terminal_bench_2"], &[]);
    assert!(release.status.success(), "{}", text(&release));
    let again = cluster.run(&["release"], ledger_spec, &["--model", MODEL, "--benchmark", "terminal_bench_2"], &[]);
    assert!(!again.status.success() && text(&again).contains("is not held"), "{}", text(&again));
    let plan = cluster.run(&["plan"], ledger_spec, &["--preset", "tb2", "--model", MODEL, "--json"], &[]);
    let doc: Value = serde_json::from_slice(&plan.stdout).unwrap();
    assert!(doc["jobs"][0]["blocked"].is_null(), "{doc:#}");
    assert_eq!(doc["jobs"][0]["decision"], "resubmit", "{doc:#}");
    cancel_all(&*ledger);
}
