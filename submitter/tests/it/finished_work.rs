//! Issue 32 items 1–8: finished work is never lost or duplicated and no result is invented — a
//! future-dated team row cannot hide later rows from the import, one empty Slurm answer does not
//! make a heartbeating job "vanished", a remediation hold survives a ledger failure after
//! `scancel`, `release` means it, redirected webhooks, a job id handed out twice, scores outside
//! their range, and the loose ends of item 8. Real PostgreSQL and real Slurm where the behaviour
//! lives there; each prints `skipping: …` without them (and fails in CI).

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use launch_spec::OutcomeClass;
use launch_spec::records::Outcome;
use launch_spec::testkit::rundir::running_status;
use launch_spec::testkit::{Counters, RunDir};
use serde_json::{Value, json};
use submitter::ledger::{AttemptId, AttemptStatus, Ledger, NewAttempt, open_ledger};

use crate::ledger::{Store, pg_admin};
use crate::queueing::{TestCluster, cancel_all, text, wait_until};
use crate::remediation::{instant_failure_cluster, launch_until_a_hold_is_due};
use crate::support::slurm_up;
use crate::team::{TeamDb, four_gpus};

/// The team's catalogue for the import tests: one model, one benchmark.
const CATALOGUE: &str = "
INSERT INTO models (id, name, created_by) VALUES ('00000000-0000-0000-0000-000000000001', 'Qwen/Qwen3-8B', 'hf');
INSERT INTO benchmarks (id, name) VALUES ('10000000-0000-0000-0000-000000000001', 'terminal_bench_2'),
                                         ('10000000-0000-0000-0000-000000000002', 'dev_set_v2');
";

/// A finished `sandbox_jobs` row of Qwen3-8B on `benchmark` (1 or 2) with all its times at `at`
/// (an SQL expression) and `metrics` (JSON text).
fn finished_row(id: &str, benchmark: u8, at: &str, metrics: &str) -> String {
    format!(
        "INSERT INTO sandbox_jobs (id, job_name, username, job_status, submitted_at, started_at, ended_at, created_at,
                                   slurm_job_id, config, metrics, stats, model_id, benchmark_id, n_trials)
         VALUES ('{id}', 'row-{id}', 'alice', 'Finished', {at}, {at}, {at}, {at}, '77',
                 '{{\"agent\": \"terminus-2\"}}', '{metrics}', '{{\"n_trials\": 10}}',
                 '00000000-0000-0000-0000-000000000001', '10000000-0000-0000-0000-00000000000{benchmark}', 10);"
    )
}

fn import(cluster: &TestCluster, ledger: &str, team: &TeamDb) -> String {
    let out = cluster.run(&["import"], ledger, &[], &[("SUBMITTER_TEAM_DB", &team.url)]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    t
}

/// Item 1: a row dated in the future (2099, or an hour ahead: a cluster whose clock runs fast)
/// must not move the import's mark past the rows the team adds after it.
#[test]
fn a_future_dated_team_row_does_not_hide_later_rows_from_the_import() {
    for (tag, future) in [("y2099", "'2099-01-01T00:00:00Z'"), ("hour", "now() + interval '1 hour'")] {
        let Some(mut team) = TeamDb::new(&format!("future{tag}")) else { return };
        team.exec(CATALOGUE);
        team.exec(&finished_row("20000000-0000-0000-0000-000000000001", 1, future, "[{\"mean\": 0.4}]"));
        let store = Store::sqlite();
        let cluster = TestCluster::new(&format!("future-{tag}"), four_gpus);
        assert!(import(&cluster, &store.spec, &team).contains("1 new"));
        // The team finishes another pair afterwards, stamped by a correct clock.
        team.exec(&finished_row("20000000-0000-0000-0000-000000000002", 2, "now()", "[{\"mean\": 0.3}]"));
        let second = import(&cluster, &store.spec, &team);
        assert!(second.contains("1 new"), "{tag}: the later row was hidden behind the future one: {second}");
        let ledger = open_ledger(&store.spec).unwrap();
        let dev = ledger.attempts_for("Qwen/Qwen3-8B", "dev_set_v2").unwrap();
        assert_eq!(dev.iter().map(|a| a.status).collect::<Vec<_>>(), [AttemptStatus::Finished], "{tag}");
        // And `plan` does not resubmit the pair the team finished.
        let out = cluster.run(&["plan"], &store.spec, &["--preset", "v2", "--model", "Qwen/Qwen3-8B"], &[]);
        assert!(text(&out).lines().any(|l| l.starts_with("skip") && l.contains("dev_set_v2")), "{}", text(&out));
    }
}

/// A ledger row for `run_tag` of test/Tiny-1B on `cluster`, queued as Slurm job `job` (and started,
/// with `started`), its run dir under `root` (written by the test, as payload would).
fn queued_attempt(
    ledger: &dyn Ledger,
    cluster: &str,
    root: &Path,
    run_tag: &str,
    job: &str,
    started: bool,
) -> (AttemptId, PathBuf) {
    let run_dir = root.join("jobs").join(run_tag);
    std::fs::create_dir_all(&run_dir).unwrap();
    let new = NewAttempt {
        model: MODEL.into(),
        benchmark: "terminal_bench_2".into(),
        cluster: cluster.into(),
        username: "tester".into(),
        run_tag: run_tag.into(),
        agent: "terminus-2".into(),
        reason: "no previous attempt".into(),
        config: json!({"run_dir": run_dir, "timeout_multiplier": 1.0, "agent": "terminus-2",
                       "submission_tag": format!("tag-{run_tag}")}),
    };
    let id = ledger.insert_pending(&new).unwrap();
    ledger.set_job_id(id, job).unwrap();
    if started {
        ledger.transition(id, AttemptStatus::Started, &format!("running as job {job}"), None).unwrap();
    }
    (id, run_dir)
}

const MODEL: &str = "test/Tiny-1B";

/// Item 2 on the real Slurm: a job Slurm does not list (a real empty `squeue` answer: the id is
/// one Slurm never handed out) whose run dir's heartbeat is fresh is not vanished — `sync` leaves
/// it running and `plan` submits nothing beside it; once the records have been quiet for the
/// window as well, it is vanished; and a final record that still comes later is folded in.
#[test]
fn one_empty_squeue_answer_for_a_heartbeating_job_is_not_vanished() {
    if !slurm_up() {
        return;
    }
    let store = Store::sqlite();
    let cluster = TestCluster::new("vanish", |_| {});
    let ledger = open_ledger(&store.spec).unwrap();
    let job = "987654321";
    let (id, run_dir) = queued_attempt(&*ledger, "vanish", cluster.root(), "tb2-vanish", job, true);
    let beat = |at: chrono::DateTime<Utc>| {
        RunDir::at(&run_dir).status(&running_status("tb2-vanish", job, at, at, Counters::default(), at), Some(at));
    };
    beat(Utc::now());
    let out = cluster.run(&["sync"], &store.spec, &[], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let after = ledger.attempt(id).unwrap().unwrap();
    assert_eq!(after.status, AttemptStatus::Started, "marked on one Slurm answer: {}", after.reason);
    let out = cluster.run(&["plan"], &store.spec, &["--preset", "tb2", "--model", MODEL], &[]);
    let plan = text(&out);
    assert!(plan.contains("not listed by Slurm, but its run dir's heartbeat is fresh"), "{plan}");
    assert!(plan.lines().any(|l| l.starts_with("skip")), "{plan}");
    // Quiet past the window too: now both agree.
    beat(Utc::now() - chrono::Duration::minutes(10));
    let out = cluster.run(&["sync"], &store.spec, &[], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let after = ledger.attempt(id).unwrap().unwrap();
    assert_eq!(after.status, AttemptStatus::Failed);
    assert!(after.reason.starts_with("vanished"), "{}", after.reason);
    // Its final record comes late after all (a node that froze, then caught up): folded in.
    let at = Utc::now();
    let mut done = running_status("tb2-vanish", job, at, at, Counters::default(), at);
    done.outcome = Some(Outcome {
        class: OutcomeClass::Finished,
        cause: None,
        exit_code: 0,
        message: "harbor finished".into(),
        harbor_exit_code: Some(0),
        signal: None,
        engine_log_tail: Vec::new(),
    });
    RunDir::at(&run_dir).status(&done, Some(at));
    let result = json!({"id": "late", "started_at": "2026-12-01T10:00:00", "finished_at": "2026-12-01T11:00:00",
        "n_total_trials": 2, "stats": {"n_completed_trials": 2, "n_errored_trials": 0, "evals": {"e": {
            "n_trials": 2, "n_errors": 0, "metrics": [{"mean": 0.5}],
            "reward_stats": {"reward": {"1.0": ["t1"], "0.0": ["t2"]}}, "exception_stats": {}}}}});
    std::fs::write(run_dir.join("result.json"), result.to_string()).unwrap();
    let out = cluster.run(&["sync"], &store.spec, &[], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let after = ledger.attempt(id).unwrap().unwrap();
    assert_eq!(after.status, AttemptStatus::Finished, "the late final record was lost: {}", after.reason);
    assert_eq!(after.metrics.unwrap()["mean_reward"].as_f64(), Some(0.5));
}

/// Item 7, the team's door: a team score of 1e308 or −7 is refused — the attempt is recorded with
/// the reason and no score, in no mean or ranking; the honest one next to it is kept. Item 8: a
/// team model with no name is nothing to attribute a job to (no attempt for model "").
#[test]
fn impossible_team_scores_and_nameless_models_are_refused_at_import() {
    let Some(mut team) = TeamDb::new("scores") else { return };
    team.exec(CATALOGUE);
    team.exec(
        "INSERT INTO models (id, name, created_by) VALUES
           ('00000000-0000-0000-0000-000000000002', 'org/Huge-8B', 'eve'),
           ('00000000-0000-0000-0000-000000000003', 'org/Neg-8B', 'eve'),
           ('00000000-0000-0000-0000-000000000004', '', 'eve');",
    );
    team.exec(&finished_row("20000000-0000-0000-0000-000000000001", 1, "now()", "[{\"mean\": 0.4}]"));
    let row = |id: &str, model: &str, mean: &str| {
        finished_row(id, 1, "now()", &format!("[{{\"mean\": {mean}}}]"))
            .replace("'00000000-0000-0000-0000-000000000001'", &format!("'{model}'"))
    };
    team.exec(&row("20000000-0000-0000-0000-000000000002", "00000000-0000-0000-0000-000000000002", "1e308"));
    team.exec(&row("20000000-0000-0000-0000-000000000003", "00000000-0000-0000-0000-000000000003", "-7"));
    team.exec(&row("20000000-0000-0000-0000-000000000004", "00000000-0000-0000-0000-000000000004", "0.5"));
    let store = Store::sqlite();
    let cluster = TestCluster::new("scores", four_gpus);
    let out = cluster.run(&["import"], &store.spec, &["--json"], &[("SUBMITTER_TEAM_DB", &team.url)]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!((report["attempts_new"].as_u64(), report["skipped_unknown"].as_u64()), (Some(3), Some(1)), "{report}");
    let ledger = open_ledger(&store.spec).unwrap();
    assert!(ledger.attempts_for("", "terminal_bench_2").unwrap().is_empty(), "an attempt for model \"\"");
    assert!(ledger.list_models().unwrap().iter().all(|m| !m.id.is_empty()));
    for (model, bad) in [("org/Huge-8B", "1e308"), ("org/Neg-8B", "-7")] {
        let attempt = ledger.attempts_for(model, "terminal_bench_2").unwrap().remove(0);
        let metrics = attempt.metrics.unwrap();
        assert!(metrics["mean_reward"].is_null(), "{model}: {metrics}");
        let why = metrics["invalid_score"].as_str().unwrap_or_default();
        assert!(why.contains("outside the benchmark's range [0, 1]"), "{model} ({bad}): {metrics}");
    }
    let out = cluster.run(&["results"], &store.spec, &["--json"], &[]);
    let results = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!results.contains("1e308") && !results.contains("1e+308") && !results.contains("-7.0"), "{results}");
    let doc: Value = serde_json::from_str(&results).unwrap();
    let ranks = &doc["ranks"];
    assert_eq!(ranks["Qwen/Qwen3-8B"], 1, "the honest score is ranked: {doc:#}");
    assert!(ranks.get("org/Huge-8B").is_none() && ranks.get("org/Neg-8B").is_none(), "ranked: {ranks}");
}

/// Item 3 on the real Slurm and a real PostgreSQL ledger: the ledger fails right after remediation's
/// `scancel` (a trigger refuses the attempt's move to failed). The hold is not lost: it is
/// recorded before the cancel, the command exits 3 (the ledger could not be used), and the next
/// pass, with the ledger back, completes the act; the pair stays held.
#[test]
fn a_remediation_hold_survives_a_ledger_failure_after_scancel() {
    if !slurm_up() {
        return;
    }
    let Some(store) = Store::postgres("rmfault") else { return };
    let schema = store.pg_schema().unwrap().to_string();
    let cluster = instant_failure_cluster("rm-fault");
    let ledger = open_ledger(&store.spec).unwrap();
    let (attempt, job) = launch_until_a_hold_is_due(&cluster, &store.spec, &*ledger);
    let mut admin = pg_admin().unwrap();
    admin
        .batch_execute(&format!(
            "CREATE FUNCTION {schema}.refuse_fail() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.status = 'failed' AND NEW.reason LIKE 'remediation%' THEN
                 RAISE EXCEPTION 'could not extend file: No space left on device';
               END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_fail BEFORE UPDATE ON {schema}.attempts
               FOR EACH ROW EXECUTE FUNCTION {schema}.refuse_fail();"
        ))
        .unwrap();
    let out = cluster.run(&["remediate"], &store.spec, &[], &[]);
    assert_eq!(out.status.code(), Some(3), "the ledger failed: exit 3 (docs/exit-codes.md): {}", text(&out));
    let records = ledger.remediations().unwrap();
    assert_eq!(records.len(), 1, "the hold was lost: {records:?}");
    assert_eq!((records[0].action.as_str(), records[0].attempt), ("hold", Some(attempt.id)));
    wait_until("Slurm to end the cancelled job", Duration::from_secs(120), || {
        let out = std::process::Command::new("squeue").args(["-h", "-j", &job, "-o", "%T"]).output().unwrap();
        let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
        state.is_empty() || state == "CANCELLED"
    });
    // The ledger is back: the next pass completes the recorded act.
    admin.batch_execute(&format!("DROP TRIGGER refuse_fail ON {schema}.attempts")).unwrap();
    let out = cluster.run(&["remediate"], &store.spec, &[], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let after = ledger.attempt(attempt.id).unwrap().unwrap();
    assert_eq!(after.status, AttemptStatus::Failed, "{}", after.reason);
    assert!(after.reason.starts_with("remediation hold ("), "{}", after.reason);
    let out = cluster.run(&["launch"], &store.spec, &["--once", "--preset", "tb2", "--model", MODEL], &[]);
    assert!(text(&out).contains("0 submitted"), "a held pair was resubmitted: {}", text(&out));
    assert_eq!(ledger.attempts_for(MODEL, "terminal_bench_2").unwrap().len(), 1);
    cancel_all(&*ledger);
}

/// Item 8 on the real Slurm and PostgreSQL: the mirrored row of a job whose job id the team
/// database missed (it was down when `sbatch` answered: the row kept `"pending"`) gets its job id
/// with the next lifecycle move `sync --mirror` publishes.
#[test]
fn a_mirrored_row_gets_the_job_id_the_team_database_missed() {
    if !slurm_up() {
        return;
    }
    let Some(mut team) = TeamDb::new("pendingid") else { return };
    team.exec(
        "INSERT INTO models (id, name, created_by) VALUES ('00000000-0000-0000-0000-000000000001', 'test/Tiny-1B', 'hf');
         INSERT INTO benchmarks (id, name) VALUES ('10000000-0000-0000-0000-000000000001', 'terminal_bench_2');",
    );
    let store = Store::sqlite();
    let cluster = TestCluster::new("pendingid", |_| {});
    let ledger = open_ledger(&store.spec).unwrap();
    let out = std::process::Command::new("sbatch")
        .args([
            "--parsable",
            "--partition",
            "debug",
            "--time",
            "00:05:00",
            "--output",
            "/dev/null",
            "--wrap",
            "sleep 120",
        ])
        .output()
        .unwrap();
    let job = String::from_utf8_lossy(&out.stdout).trim().split(';').next().unwrap_or_default().to_string();
    assert!(out.status.success() && !job.is_empty(), "{}", text(&out));
    let (id, _) = queued_attempt(&*ledger, "pendingid", cluster.root(), "tb2-pendingid", &job, false);
    // The team's row was written before sbatch and missed the job id (the database was down when
    // sbatch answered).
    let mirror = submitter::team::mirror::Mirror::connect(
        &team.url,
        "tester",
        ledger.location(),
        submitter::team::mirror::WriteBounds::default(),
    )
    .unwrap();
    let attempt = ledger.attempt(id).unwrap().unwrap();
    let new = NewAttempt {
        model: attempt.model.clone(),
        benchmark: attempt.benchmark.clone(),
        cluster: attempt.cluster.clone(),
        username: attempt.username.clone(),
        run_tag: attempt.run_tag.clone(),
        agent: attempt.agent.clone(),
        reason: attempt.reason.clone(),
        config: attempt.config.clone(),
    };
    assert!(mirror.pending(id, &new).unwrap());
    drop(mirror);
    let team_job = |team: &mut TeamDb| -> (String, String) {
        let row = team.client.query_one("SELECT slurm_job_id, job_status::text FROM sandbox_jobs", &[]).unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(team_job(&mut team).0, "pending");
    wait_until("sync --mirror to publish the started job", Duration::from_secs(120), || {
        let out = cluster.run(&["sync"], &store.spec, &["--mirror"], &[("SUBMITTER_TEAM_DB", &team.url)]);
        assert!(out.status.success(), "{}", text(&out));
        team_job(&mut team).1 == "Started"
    });
    assert_eq!(team_job(&mut team), (job.clone(), "Started".to_string()), "the job id stayed \"pending\"");
    crate::queueing::scancel(&job);
}
