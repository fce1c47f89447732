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
    let args = ["--once", "--preset", "tb2", "--model", MODEL, "--dry-run", "--json"];
    let out = cluster.run(&["launch"], ledger_spec, &args, &[]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    let decision = &doc["remediation"][0];
    assert_eq!(
        (decision["action"].as_str(), decision["attempt"].as_i64()),
        (Some("retry"), Some(first.id.0)),
        "{doc:#}"
    );
    assert_eq!(decision["adjustment"]["gpu_memory_utilization"].as_f64(), Some(0.85), "{doc:#}");
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
    let spec: Value =
        serde_json::from_slice(&std::fs::read(PathBuf::from(second.config["spec"].as_str().unwrap())).unwrap())
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
    assert!(
        text(&plan).contains("remedied") && text(&plan).contains("serve.gpu_memory_utilization 0.85"),
        "{}",
        text(&plan)
    );
    cancel_all(&*ledger);
}

/// A cluster whose engine generates no token (every trial fails at once), with remediation on and
/// enough trials that the job still runs when the failures have piled up.
pub(crate) fn instant_failure_cluster(name: &str) -> TestCluster {
    let cluster = TestCluster::new(name, |p| {
        *p = p
            .replace(
                "STANDIN_LOAD_SECONDS: \"0.3\"",
                "STANDIN_LOAD_SECONDS: \"0.3\"\n    STANDIN_COMPLETION_TOKENS: \"0\"",
            )
            .replace("STANDIN_TRIAL_SECONDS: \"0.05\"", "STANDIN_TRIAL_SECONDS: \"2\"");
        p.push_str("remediation: {enabled: true}\n");
    });
    let names: Vec<String> = (0..60).map(|i| format!("t{i}")).collect();
    write_tasks(&cluster.root().join("datasets/DCAgent2_terminal_bench_2"), &names);
    cluster
}

/// Launches `MODEL` on an [`instant_failure_cluster`] and waits until remediation's dry run decides
/// to hold it (its job still running); returns the attempt and its job id.
pub(crate) fn launch_until_a_hold_is_due(
    cluster: &TestCluster,
    spec: &str,
    ledger: &dyn Ledger,
) -> (submitter::ledger::Attempt, String) {
    let out = cluster.run(&["launch"], spec, &["--once", "--preset", "tb2", "--model", MODEL], &[]);
    assert!(text(&out).contains("1 submitted"), "{}", text(&out));
    let attempt = ledger.attempts_for(MODEL, "terminal_bench_2").unwrap().pop().unwrap();
    let job = attempt.slurm_job_id.clone().unwrap();
    wait_until("instant failures to be diagnosed", Duration::from_secs(240), || {
        cluster.run(&["sync"], spec, &[], &[]);
        let dry = cluster.run(&["remediate"], spec, &["--dry-run"], &[]);
        assert!(ledger.attempt(attempt.id).unwrap().unwrap().status.is_active(), "ended before the diagnosis");
        text(&dry).contains("remediation: hold ")
    });
    (attempt, job)
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
    let cluster = instant_failure_cluster("rm-instant");
    // People are told of the hold (the notifier's command gets each message's JSON body on stdin).
    let told = cluster.root().join("told.txt");
    let profile = cluster.root().join("clusters/rm-instant.yaml");
    let notify = format!("notify: {{command: [\"/usr/bin/tee\", \"-a\", \"{}\"], digest_after: 20}}\n", told.display());
    std::fs::write(&profile, std::fs::read_to_string(&profile).unwrap() + &notify).unwrap();
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
    assert!(
        why.starts_with("held: trials.instant_fail") && why.contains("submitter release --model test/Tiny-1B"),
        "{why}"
    );
    let launched = launch_once(&cluster, ledger_spec, &[]);
    assert!(launched.contains("0 submitted"), "{launched}");
    launch_once(&cluster, ledger_spec, &[]);
    let messages = std::fs::read_to_string(&told).unwrap_or_default();
    let held_line = format!("held: {MODEL} on terminal_bench_2: held: trials.instant_fail");
    assert_eq!(messages.matches(&held_line).count(), 1, "told once while it stays held: {messages}");
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

/// A locked Pinggy token → the pair is retried on the next pair of the bank: the locked one is left
/// out of the new launch spec, whose first pair is the next. The failed job's run dir is written as
/// payload leaves it when every try of its pair met Pinggy's lock message (outcome `tunnel` /
/// `token_locked`, the pair in its `tunnel_pair` event) — the lock itself needs Pinggy's servers,
/// which this machine cannot reach (payload's side is tests/tests/tunnels_e2e.rs with the sshd
/// stand-in); the decision, the ledger record and the relaunch on Slurm are the real ones.
#[test]
fn a_locked_pinggy_token_moves_the_pair_to_the_next_pinggy_pair() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let cluster = TestCluster::new("rm-locked", |p| {
        p.push_str(
            "network:\n  internet: true\n  pinggy:\n    - {url: https://rm-a.a.pinggy.link, token_secret: PINGGY_TOKEN_A}\n    - {url: https://rm-b.a.pinggy.link, token_secret: PINGGY_TOKEN_B}\nremediation: {enabled: true}\n",
        );
    });
    let secrets = cluster.root().join("secrets.env");
    let run = std::process::id();
    let keys = std::fs::read_to_string(&secrets).unwrap() + &format!("PINGGY_TOKEN_A=a{run}\nPINGGY_TOKEN_B=b{run}\n");
    launch_spec::testkit::world::write_secrets(&secrets, &keys, 0o600);
    let openhands = cluster.root().join("openhands_eval.yaml");
    std::fs::write(
        &openhands,
        "orchestrator:\n  type: local\n  quiet: true\nenvironment:\n  type: daytona\n  delete: true\nagents:\n  - name: openhands\n",
    )
    .unwrap();
    let openhands = openhands.display().to_string();
    let ledger_spec = &store.spec;
    let ledger = open_ledger(ledger_spec).unwrap();

    // The first attempt as `launch` records it (its real spec, from `launch --dry-run`'s plan), and
    // its run dir as payload leaves it after the lock.
    let selection = ["--preset", "tb2", "--model", MODEL, "--harbor-config", &openhands];
    let plan = cluster.run(&["plan"], ledger_spec, &[&selection[..], &["--json"]].concat(), &[]);
    let doc: Value = serde_json::from_slice(&plan.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&plan)));
    let job = &doc["jobs"][0];
    assert!(job["blocked"].is_null(), "{job:#}");
    let run_tag = job["run_tag"].as_str().unwrap().to_string();
    let run_dir = PathBuf::from(job["spec_path"].as_str().unwrap()).parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&run_dir).unwrap();
    let pinggy: launch_spec::spec::PinggySpec = serde_json::from_value(serde_json::json!({
        "host": "pro.pinggy.io", "public_url": "https://rm-a.a.pinggy.link", "token_secret": "PINGGY_TOKEN_A",
        "bank": [{"public_url": "https://rm-b.a.pinggy.link", "token_secret": "PINGGY_TOKEN_B"}],
    }))
    .unwrap();
    launch_spec::testkit::TestSpec::new(cluster.root(), &run_tag)
        .agent("openhands")
        .tunnel(launch_spec::spec::TunnelSpec::Pinggy(pinggy))
        .write(run_dir.join("launch.json"))
        .unwrap();
    let id = ledger
        .insert_pending(&submitter::ledger::NewAttempt {
            model: MODEL.into(),
            benchmark: "terminal_bench_2".into(),
            cluster: "rm-locked".into(),
            username: "test".into(),
            run_tag: run_tag.clone(),
            agent: "openhands".into(),
            reason: "no previous attempt".into(),
            config: serde_json::json!({"run_dir": run_dir, "spec": run_dir.join("launch.json"), "agent": "openhands"}),
        })
        .unwrap();
    ledger.set_job_id(id, "4242").unwrap();
    ledger.transition(id, AttemptStatus::Started, "started", None).unwrap();
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let status: launch_spec::records::RunStatus = serde_json::from_value(serde_json::json!({
        "version": 1, "run_tag": run_tag, "phase": "done", "started_at": now, "updated_at": now,
        "slurm_job_id": "4242", "node": "node1",
        "outcome": {"class": "tunnel", "cause": "token_locked", "exit_code": 13,
                    "message": "Pinggy: https://rm-a.a.pinggy.link (PINGGY_TOKEN_A): A tunnel with the same token is already active"},
    }))
    .unwrap();
    std::fs::write(run_dir.join("status.json"), serde_json::to_vec(&status).unwrap()).unwrap();
    let event =
        serde_json::json!({"at": now, "event": "tunnel_pair", "fields": {"public_url": "https://rm-a.a.pinggy.link"}});
    std::fs::write(run_dir.join("events.jsonl"), format!("{event}\n")).unwrap();
    ledger.transition(id, AttemptStatus::Failed, "tunnel/token_locked (exit 13)", None).unwrap();

    // Dry run, then the real pass: the same decision; the record names the locked pair.
    let dry = cluster.run(&["remediate"], ledger_spec, &["--dry-run"], &[]);
    let dry_lines = decision_lines(&text(&dry));
    assert_eq!(dry_lines.len(), 1, "{}", text(&dry));
    assert!(
        dry_lines[0].contains("[tunnel.pinggy: https://rm-a.a.pinggy.link left out, https://rm-b.a.pinggy.link first]")
            && dry_lines[0].contains("outcome.tunnel.token_locked"),
        "{dry_lines:?}"
    );
    assert!(ledger.remediations().unwrap().is_empty(), "the dry run wrote");
    let real = cluster.run(&["remediate"], ledger_spec, &[], &[]);
    assert_eq!(decision_lines(&text(&real)), dry_lines, "{}", text(&real));
    let records = ledger.remediations().unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].adjustment.as_ref().unwrap().skip_pinggy, vec!["https://rm-a.a.pinggy.link".to_string()]);

    // The relaunch: its spec's first pair is the next one, the locked one gone from the bank.
    let out = cluster.run(&["launch"], ledger_spec, &[&["--once"][..], &selection[..]].concat(), &[]);
    assert!(text(&out).contains("1 submitted"), "{}", text(&out));
    let second = attempts(&*ledger).into_iter().filter(|a| a.agent == "openhands").max_by_key(|a| a.id.0).unwrap();
    assert_ne!(second.id, id);
    let spec: Value =
        serde_json::from_slice(&std::fs::read(PathBuf::from(second.config["spec"].as_str().unwrap())).unwrap())
            .unwrap();
    let tunnel = &spec["tunnel"];
    assert_eq!(tunnel["kind"], "pinggy", "{spec:#}");
    assert_eq!(tunnel["public_url"], "https://rm-b.a.pinggy.link", "{spec:#}");
    assert_eq!(tunnel["token_secret"], "PINGGY_TOKEN_B", "{spec:#}");
    assert!(tunnel["bank"].as_array().is_none_or(|b| b.is_empty()), "{tunnel:#}");
    cancel_all(&*ledger);
}
