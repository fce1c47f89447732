//! The ledger's behaviour, written once against `&dyn Ledger` and run on both backends: SQLite on a
//! temporary file, PostgreSQL in a fresh schema per test (so tests run in parallel) on the server
//! named by `EVAL_TEST_PG_URL` (default: the local one `scripts/services.sh up` starts, whose URL is in
//! its 0600 secrets file — see `tests/common/pg.rs`). Without a
//! reachable PostgreSQL the PostgreSQL half prints `skipping: no PostgreSQL` — and fails in CI.

#![allow(clippy::print_stderr, clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use submitter::ledger::{
    AttemptId, AttemptStatus, DEFAULT_FAMILIES, ImportedAttempt, Ledger, LedgerError, NewAttempt, TrialSet,
    latest_schema_version, now, open_ledger,
};
use submitter::stats::Trial;
use tempfile::TempDir;

// ------------------------------------------------------------------------------------ stores

/// A fresh, empty ledger for one test that can be opened any number of times (several
/// connections, several processes). Dropping it removes the file or the schema.
pub(crate) struct Store {
    pub(crate) spec: String,
    _dir: Option<TempDir>,
    pg_schema: Option<PgSchema>,
}

struct PgSchema {
    admin_url: String,
    name: String,
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        if let Ok(mut admin) = ::postgres::Client::connect(&self.admin_url, ::postgres::NoTls) {
            let _ = admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
        }
    }
}

/// The test server's URL (from the environment or the 0600 secrets file, never the source); without
/// one, a password-less URL that fails to connect, so the PostgreSQL half skips (or fails in CI).
pub(crate) fn pg_url() -> String {
    crate::pg::test_pg_url().unwrap_or_else(|| "postgres://evaltest@127.0.0.1:5432/evaltest".to_string())
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// `url` with `name=value` appended to its query string.
pub(crate) fn with_param(url: &str, param: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{param}")
}

pub(crate) fn pg_admin() -> Option<::postgres::Client> {
    let mut config: ::postgres::Config = pg_url().parse().expect("EVAL_TEST_PG_URL is a PostgreSQL URL");
    config.connect_timeout(Duration::from_secs(5));
    match config.connect(::postgres::NoTls) {
        Ok(client) => Some(client),
        Err(error) if in_ci() => panic!("PostgreSQL unreachable at {} in CI: {error}", redact(&pg_url())),
        Err(_) => {
            eprintln!("skipping: no PostgreSQL");
            None
        }
    }
}

fn redact(url: &str) -> String {
    submitter::ledger::redact_url(url)
}

impl Store {
    pub(crate) fn sqlite() -> Store {
        let dir = tempfile::tempdir().expect("temp dir");
        // An existing state dir: a read-only command (`plan`) refuses one that does not exist.
        std::fs::create_dir(dir.path().join("state")).expect("state dir");
        let spec = format!("sqlite:{}", dir.path().join("state/ledger.sqlite").display());
        Store { spec, _dir: Some(dir), pg_schema: None }
    }

    pub(crate) fn postgres(test: &str) -> Option<Store> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let mut admin = pg_admin()?;
        let short: String = test.chars().take(32).collect();
        let name = format!("ledger_{short}_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        admin
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"))
            .expect("create schema");
        // The schema is selected per connection through the startup `options`, like any URL user
        // could.
        let spec = with_param(&pg_url(), &format!("options=-c%20search_path%3D{name}"));
        Some(Store { spec, _dir: None, pg_schema: Some(PgSchema { admin_url: pg_url(), name }) })
    }

    fn open(&self) -> Box<dyn Ledger> {
        open_ledger(&self.spec).unwrap_or_else(|e| panic!("open {}: {e}", redact(&self.spec)))
    }

    /// The PostgreSQL schema this store lives in (tests that plant a fault in it).
    pub(crate) fn pg_schema(&self) -> Option<&str> {
        self.pg_schema.as_ref().map(|s| s.name.as_str())
    }

    fn is_postgres(&self) -> bool {
        self.pg_schema.is_some()
    }
}

/// Generates `ledger::sqlite::NAME` and `ledger::postgres::NAME` for each test function:
/// `ledger:` functions take `&dyn Ledger`, `store:` functions take the `&Store` (several opens).
macro_rules! on_both_backends {
    (ledger: $($ledger_test:ident),* ; store: $($store_test:ident),* $(;)?) => {
        mod sqlite {
            $( #[test] fn $ledger_test() { super::$ledger_test(&*super::Store::sqlite().open()); } )*
            $( #[test] fn $store_test() { super::$store_test(&super::Store::sqlite()); } )*
        }
        mod postgres {
            $( #[test] fn $ledger_test() {
                if let Some(store) = super::Store::postgres(stringify!($ledger_test)) {
                    super::$ledger_test(&*store.open());
                }
            } )*
            $( #[test] fn $store_test() {
                if let Some(store) = super::Store::postgres(stringify!($store_test)) {
                    super::$store_test(&store);
                }
            } )*
        }
    };
}

on_both_backends! {
    ledger: lifecycle_with_utc_timestamps, second_active_attempt_is_refused, families_count_as_one_benchmark,
            set_family_moves_attempts_and_refuses_merging_active_ones, latest_per_pair_picks_latest_and_counts,
            catalogue_and_unevaluated, lookups_by_run_tag_and_active, import_keeps_the_active_rule,
            heartbeats_per_submitter_and_cluster, imported_rows_are_tracked_by_source,
            remediation_records_once_per_attempt_and_fold_into_holds,
            gpu_seconds_are_recorded_per_attempt, a_job_id_handed_out_twice_is_refused,
            a_release_starts_the_failure_count_afresh, a_vanished_attempt_takes_its_late_finish,
            trials_are_recorded_per_attempt;
    store: migrations_are_idempotent, racing_threads_one_wins, racing_processes_one_wins, tls_require_and_verify,
           wrong_password_is_a_clear_error, a_ledger_before_the_agent_column_keeps_reading;
}

/// Remediation records (migration 0006): written once per attempt (a second loop's act on the same
/// attempt writes nothing), read back with the adjustment, stamped by the ledger's clock; a release
/// (no attempt) clears the pair's hold and adjustment.
fn remediation_records_once_per_attempt_and_fold_into_holds(ledger: &dyn Ledger) {
    let id = ledger.insert_pending(&new_attempt("org/M-8B", "terminal_bench_2")).unwrap();
    let record = |attempt: Option<AttemptId>, action: &str| submitter::ledger::NewRemediation {
        model: "org/M-8B".into(),
        family: "terminal_bench_2".into(),
        agent: "terminus-2".into(),
        cluster: "jupiter".into(),
        attempt,
        finding: "outcome.engine_start.oom".into(),
        action: action.parse().unwrap(),
        change: "serve.gpu_memory_utilization 0.90 → 0.85".into(),
        adjustment: (action == "retry").then(|| submitter::domain::PairAdjustment {
            gpu_memory_utilization: Some(0.85),
            exclude_nodes: vec!["n1".into()],
            ..Default::default()
        }),
        reason: "why".into(),
        username: "alice".into(),
    };
    let before = now();
    assert!(ledger.record_remediation(&record(Some(id), "retry")).unwrap());
    assert!(!ledger.record_remediation(&record(Some(id), "hold")).unwrap(), "one act per attempt");
    let second = {
        ledger.transition(id, AttemptStatus::Failed, "oom", None).unwrap();
        ledger.insert_pending(&new_attempt("org/M-8B", "terminal_bench_2")).unwrap()
    };
    assert!(ledger.record_remediation(&record(Some(second), "hold")).unwrap());
    let rows = ledger.remediations().unwrap();
    assert_eq!(rows.len(), 2, "{rows:#?}");
    assert_eq!((rows[0].attempt, rows[0].action.as_str()), (Some(id), "retry"));
    assert_eq!(rows[0].adjustment.as_ref().unwrap().gpu_memory_utilization, Some(0.85));
    assert_eq!(rows[0].adjustment.as_ref().unwrap().exclude_nodes, ["n1"]);
    assert_eq!(rows[0].change, "serve.gpu_memory_utilization 0.90 → 0.85");
    assert!(rows[0].created_at >= before - chrono::Duration::seconds(5), "{:?}", rows[0].created_at);
    let key = ("org/M-8B".to_string(), "terminal_bench_2".to_string(), "terminus-2".to_string());
    let state = submitter::ledger::fold_remediations(&rows).remove(&key).unwrap();
    assert!(state.held.is_some() && state.retries == 1 && !state.adjustment.is_empty(), "{state:?}");
    // Releases carry no attempt, so several are allowed.
    assert!(ledger.record_remediation(&record(None, "release")).unwrap());
    assert!(ledger.record_remediation(&record(None, "release")).unwrap());
    let state = submitter::ledger::fold_remediations(&ledger.remediations().unwrap()).remove(&key).unwrap();
    assert!(state.held.is_none() && state.adjustment.is_empty() && state.retries == 0, "{state:?}");
}

/// Issue 32 item 6: a job id Slurm hands out twice binds one submission only. A second attempt of
/// the same cluster given the same id is refused (the id stays the first attempt's); the legs of
/// one shared job (one submission tag) share their job's id; another cluster's job 1 is another job.
fn a_job_id_handed_out_twice_is_refused(ledger: &dyn Ledger) {
    let tagged = |model: &str, tag: &str| {
        let mut new = new_attempt(model, "terminal_bench_2");
        new.config["submission_tag"] = tag.into();
        new
    };
    let first = ledger.insert_pending(&tagged("org/A-8B", "tag-a")).unwrap();
    ledger.set_job_id(first, "4711").unwrap();
    let second = ledger.insert_pending(&tagged("org/B-8B", "tag-b")).unwrap();
    let refused = ledger.set_job_id(second, "4711").unwrap_err();
    assert!(
        matches!(&refused, LedgerError::JobIdTaken { holder, job, .. } if *holder == first && job == "4711"),
        "{refused}"
    );
    assert!(refused.to_string().contains("handed out a job id twice"), "{refused}");
    assert_eq!(ledger.attempt(second).unwrap().unwrap().slurm_job_id, None);
    // The legs of one shared job: one tag, one job id.
    let leg_one = ledger.insert_pending(&tagged("org/C-8B", "tag-shared")).unwrap();
    let leg_two = ledger.insert_pending(&tagged("org/D-8B", "tag-shared")).unwrap();
    ledger.set_job_id(leg_one, "4712").unwrap();
    ledger.set_job_id(leg_two, "4712").unwrap();
    // Another cluster's job 4711 is another job.
    let mut elsewhere = tagged("org/E-8B", "tag-e");
    elsewhere.cluster = "leonardo".into();
    let elsewhere = ledger.insert_pending(&elsewhere).unwrap();
    ledger.set_job_id(elsewhere, "4711").unwrap();
}

/// Issue 32 item 4: after a retry chain used the pair's attempts (3 failures, the planner's bound),
/// `submitter release` means it — the failures before the release no longer count, so the next
/// launch submits the pair again; a failure after the release counts again.
fn a_release_starts_the_failure_count_afresh(ledger: &dyn Ledger) {
    let (model, bench) = ("org/R-8B", "terminal_bench_2");
    let fail_one = || {
        let id = ledger.insert_pending(&new_attempt(model, bench)).unwrap();
        ledger.transition(id, AttemptStatus::Failed, "remediation retry (oom)", None).unwrap();
        id
    };
    let failed = || {
        let pairs = ledger.latest_per_pair().unwrap();
        pairs.iter().find(|p| p.model == model).map(|p| (p.failed_attempts, p.total_attempts)).unwrap()
    };
    fail_one();
    fail_one();
    let last = fail_one();
    assert_eq!(failed(), (3, 3));
    let release = submitter::ledger::NewRemediation {
        model: model.into(),
        family: bench.into(),
        agent: "terminus-2".into(),
        cluster: "jupiter".into(),
        attempt: None,
        finding: "release".into(),
        action: submitter::domain::RemediationAct::Release,
        change: String::new(),
        adjustment: None,
        reason: "released by alice".into(),
        username: "alice".into(),
    };
    let hold = submitter::ledger::NewRemediation {
        attempt: Some(last),
        finding: "outcome.engine_start.oom".into(),
        action: submitter::domain::RemediationAct::Hold,
        reason: "retried 2 time(s)".into(),
        ..release.clone()
    };
    assert!(ledger.record_remediation(&hold).unwrap());
    // Another pair's release changes nothing here.
    assert!(
        ledger
            .record_remediation(&submitter::ledger::NewRemediation { model: "org/Other-8B".into(), ..release.clone() })
            .unwrap()
    );
    assert_eq!(failed(), (3, 3));
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert!(ledger.record_remediation(&release).unwrap());
    assert_eq!(failed(), (0, 3), "a release starts the pair afresh");
    std::thread::sleep(std::time::Duration::from_millis(5));
    fail_one();
    assert_eq!(failed(), (1, 4), "a failure after the release counts");
}

/// Issue 32 item 2: the one way out of a terminal status — a vanished attempt whose final record
/// came late becomes `finished` with its metrics; any other failure stays final.
fn a_vanished_attempt_takes_its_late_finish(ledger: &dyn Ledger) {
    let vanished = ledger.insert_pending(&new_attempt("org/V-8B", "terminal_bench_2")).unwrap();
    ledger
        .transition(vanished, AttemptStatus::Failed, "vanished (job 7: no longer listed, no outcome recorded)", None)
        .unwrap();
    let failed = ledger.insert_pending(&new_attempt("org/F-8B", "terminal_bench_2")).unwrap();
    ledger.transition(failed, AttemptStatus::Failed, "engine_start/oom: out of memory", None).unwrap();
    let since = now() - chrono::Duration::hours(1);
    let listed: Vec<AttemptId> = ledger.vanished("jupiter", since).unwrap().iter().map(|a| a.id).collect();
    assert_eq!(listed, [vanished]);
    assert!(ledger.vanished("leonardo", since).unwrap().is_empty());
    assert!(ledger.vanished("jupiter", now() + chrono::Duration::hours(1)).unwrap().is_empty());
    let refused = ledger.finish_vanished(failed, "finished", None).unwrap_err();
    assert!(matches!(refused, LedgerError::IllegalTransition { .. }), "{refused}");
    ledger.finish_vanished(vanished, "finished (late)", Some(&json!({"mean_reward": 0.5}))).unwrap();
    let after = ledger.attempt(vanished).unwrap().unwrap();
    assert_eq!((after.status, after.metrics.unwrap()["mean_reward"].as_f64()), (AttemptStatus::Finished, Some(0.5)));
    assert!(ledger.vanished("jupiter", since).unwrap().is_empty());
}

// ------------------------------------------------------------------------------------ helpers

fn new_attempt(model: &str, benchmark: &str) -> NewAttempt {
    NewAttempt {
        model: model.to_string(),
        benchmark: benchmark.to_string(),
        cluster: "jupiter".to_string(),
        username: "alice".to_string(),
        run_tag: format!("{benchmark}__{}", model.replace('/', "__")),
        agent: "terminus-2".into(),
        reason: "no previous attempt".to_string(),
        config: json!({"timeout_multiplier": 2.0, "agent": "terminus-2", "overrides": {"override_cpus": 4}}),
    }
}

fn imported(model: &str, benchmark: &str, status: AttemptStatus, submitted_at: DateTime<Utc>) -> ImportedAttempt {
    ImportedAttempt {
        model: model.to_string(),
        benchmark: benchmark.to_string(),
        cluster: "leonardo".to_string(),
        username: "bob".to_string(),
        run_tag: format!("{benchmark}__{model}"),
        slurm_job_id: Some("4242".to_string()),
        status,
        reason: "imported".to_string(),
        config: json!({"timeout_multiplier": 1.0}),
        metrics: (status == AttemptStatus::Finished).then(|| json!({"mean_reward": 0.5})),
        submitted_at,
        started_at: None,
        ended_at: None,
        source_id: None,
    }
}

fn at(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600 + seconds, 0).unwrap()
}

/// Asserts `t` is within a few seconds of the window [before, after] (the PostgreSQL backend
/// stamps with the server's clock; here that is this machine's).
fn assert_near(t: DateTime<Utc>, before: DateTime<Utc>, after: DateTime<Utc>) {
    let slack = chrono::Duration::seconds(5);
    assert!(t >= before - slack && t <= after + slack, "{t} not within [{before}, {after}]");
}

// ------------------------------------------------------------------------------------ tests

fn migrations_are_idempotent(store: &Store) {
    let first = store.open();
    assert_eq!(first.schema_version().unwrap(), latest_schema_version());
    first.insert_pending(&new_attempt("org/M-8B", "terminal_bench_2")).unwrap();
    drop(first);
    // Reopening applies nothing again: the seeded families are not duplicated, rows survive.
    let second = store.open();
    assert_eq!(second.schema_version().unwrap(), latest_schema_version());
    assert_eq!(second.families().unwrap().len(), DEFAULT_FAMILIES.len());
    assert_eq!(second.active().unwrap().len(), 1);
    // Concurrent openers of a migrated store, and of a brand-new one, all succeed.
    let fresh = if store.is_postgres() { Store::postgres("fresh_concurrent_open") } else { Some(Store::sqlite()) };
    for target in [Some(store), fresh.as_ref()].into_iter().flatten() {
        std::thread::scope(|scope| {
            let openers: Vec<_> = (0..4).map(|_| scope.spawn(|| target.open().schema_version())).collect();
            for opener in openers {
                assert_eq!(opener.join().unwrap().unwrap(), latest_schema_version());
            }
        });
        assert_eq!(target.open().families().unwrap().len(), DEFAULT_FAMILIES.len());
    }
}

/// A ledger written before migration 4 (an eval's identity includes its harness, issue 20) opens,
/// keeps every row, and gives each the agent its config recorded, else terminus-2; after it another
/// harness of the same (model, family) gets an active attempt of its own, the same harness does not.
fn a_ledger_before_the_agent_column_keeps_reading(store: &Store) {
    let (sqlite, postgres) = (
        [
            include_str!("../../src/ledger/migrations/0001_initial.sqlite.sql"),
            include_str!("../../src/ledger/migrations/0002_team.sqlite.sql"),
            include_str!("../../src/ledger/migrations/0003_continuation.sqlite.sql"),
        ],
        [
            include_str!("../../src/ledger/migrations/0001_initial.postgres.sql"),
            include_str!("../../src/ledger/migrations/0002_team.postgres.sql"),
            include_str!("../../src/ledger/migrations/0003_continuation.postgres.sql"),
        ],
    );
    // Two rows of one pair as the old submitter wrote them: a finished openhands eval (its config
    // names the agent) and an active one whose config names none.
    let rows = "INSERT INTO schema_migrations (version, name, applied_at) VALUES
            (1, 'initial', '2026-01-01T00:00:00.000000Z'), (2, 'team', '2026-01-01T00:00:00.000000Z'),
            (3, 'continuation', '2026-01-01T00:00:00.000000Z');
        INSERT INTO attempts (model, benchmark, benchmark_family, cluster, username, run_tag, status, reason,
                              config, attempt, submitted_at, updated_at)
        VALUES ('org/M-8B', 'terminal_bench_2', 'terminal_bench_2', 'c', 'u', 'old-1', 'finished', 'finished',
                '{\"agent\": \"openhands\"}', 1, '2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z'),
               ('org/M-8B', 'terminal_bench_2', 'terminal_bench_2', 'c', 'u', 'old-2', 'pending', 'submit',
                '{}', 2, '2026-01-02T00:00:00.000000Z', '2026-01-02T00:00:00.000000Z');";
    if store.is_postgres() {
        let mut config: ::postgres::Config = store.spec.parse().unwrap();
        config.connect_timeout(Duration::from_secs(5));
        let mut db = config.connect(::postgres::NoTls).unwrap();
        let preamble = "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,
                                                        applied_at TIMESTAMPTZ NOT NULL DEFAULT now());";
        db.batch_execute(&[preamble, &postgres.join("\n"), rows].join("\n")).unwrap();
    } else {
        let path = PathBuf::from(store.spec.strip_prefix("sqlite:").unwrap());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let db = rusqlite::Connection::open(&path).unwrap();
        let preamble = "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,
                                                        applied_at TEXT NOT NULL);";
        db.execute_batch(&[preamble, &sqlite.join("\n"), rows].join("\n")).unwrap();
    }
    let ledger = store.open();
    assert_eq!(ledger.schema_version().unwrap(), latest_schema_version());
    let rows = ledger.attempts_for("org/M-8B", "terminal_bench_2").unwrap();
    let agents: Vec<(&str, &str)> = rows.iter().map(|a| (a.run_tag.as_str(), a.agent.as_str())).collect();
    assert_eq!(agents, [("old-1", "openhands"), ("old-2", "terminus-2")]);
    let pairs = ledger.latest_per_pair().unwrap();
    let latest: Vec<(&str, &str)> = pairs.iter().map(|p| (p.agent.as_str(), p.latest.run_tag.as_str())).collect();
    assert_eq!(latest, [("openhands", "old-1"), ("terminus-2", "old-2")], "one pair per agent");
    let mut other = new_attempt("org/M-8B", "terminal_bench_2");
    other.agent = "openhands".into();
    ledger.insert_pending(&other).expect("another harness has its own active attempt");
    let same = ledger.insert_pending(&new_attempt("org/M-8B", "terminal_bench_2")).unwrap_err();
    assert!(matches!(same, LedgerError::AlreadyActive { existing_id, .. } if existing_id == rows[1].id), "{same}");
}

fn lifecycle_with_utc_timestamps(ledger: &dyn Ledger) {
    ledger.ping().unwrap();
    let new = new_attempt("laion/Qwen3-8B-sft", "dev_set_v2_2.0x");
    let before = now();
    let id = ledger.insert_pending(&new).unwrap();
    let after = now();

    let row = ledger.attempt(id).unwrap().expect("inserted row");
    assert_eq!(row.status, AttemptStatus::Pending);
    assert_eq!(row.benchmark, "dev_set_v2_2.0x");
    assert_eq!(row.benchmark_family, "dev_set_v2");
    assert_eq!((row.cluster.as_str(), row.username.as_str()), ("jupiter", "alice"));
    assert_eq!(row.run_tag, new.run_tag);
    assert_eq!(row.config, new.config);
    assert_eq!(row.reason, "no previous attempt");
    assert_eq!(row.attempt, 1);
    assert_eq!(row.slurm_job_id, None);
    assert_eq!((row.started_at, row.ended_at, row.metrics.as_ref()), (None, None, None));
    assert_near(row.submitted_at, before, after);
    assert_eq!(row.updated_at, row.submitted_at);
    // UTC on the wire too: RFC 3339 with `Z`.
    let json = serde_json::to_value(&row).unwrap();
    assert!(json["submitted_at"].as_str().unwrap().ends_with('Z'), "{json}");
    assert_eq!(json["status"], "pending");

    ledger.set_job_id(id, "123456").unwrap();
    ledger.set_job_id(id, "123456").unwrap(); // same id again: a no-op
    let conflict = ledger.set_job_id(id, "999").unwrap_err();
    assert!(matches!(&conflict, LedgerError::JobIdConflict { existing, .. } if existing == "123456"), "{conflict}");

    ledger.transition(id, AttemptStatus::Started, "payload running", None).unwrap();
    let started = ledger.attempt(id).unwrap().unwrap();
    assert_eq!((started.status, started.slurm_job_id.as_deref()), (AttemptStatus::Started, Some("123456")));
    let started_at = started.started_at.expect("started_at stamped");
    assert_near(started_at, before, now());
    assert!(started_at >= started.submitted_at);

    // Re-entering `started` (a repeated sync) keeps the first stamp.
    ledger.transition(id, AttemptStatus::Started, "still running", None).unwrap();
    assert_eq!(ledger.attempt(id).unwrap().unwrap().started_at, Some(started_at));

    let metrics = json!({"mean_reward": 0.41, "n_trials": 100, "n_errors": 2});
    ledger.transition(id, AttemptStatus::Finished, "harbor finished", Some(&metrics)).unwrap();
    let finished = ledger.attempt(id).unwrap().unwrap();
    assert_eq!(finished.status, AttemptStatus::Finished);
    assert_eq!(finished.metrics.as_ref(), Some(&metrics));
    assert_eq!(finished.reason, "harbor finished");
    let ended_at = finished.ended_at.expect("ended_at stamped");
    assert!(ended_at >= started_at && finished.updated_at >= ended_at);

    // Terminal is final.
    let illegal = ledger.transition(id, AttemptStatus::Started, "resurrect", None).unwrap_err();
    assert!(
        matches!(
            illegal,
            LedgerError::IllegalTransition { from: AttemptStatus::Finished, to: AttemptStatus::Started, .. }
        ),
        "{illegal}"
    );
    let illegal = ledger.transition(id, AttemptStatus::Failed, "late failure", None).unwrap_err();
    assert!(matches!(illegal, LedgerError::IllegalTransition { from: AttemptStatus::Finished, .. }), "{illegal}");
    // Re-entering `finished` may clear the metrics (`Some(Null)`); `None` leaves them.
    ledger.transition(id, AttemptStatus::Finished, "metrics cleared: infra errors", Some(&Value::Null)).unwrap();
    let cleared = ledger.attempt(id).unwrap().unwrap();
    assert_eq!((cleared.metrics, cleared.ended_at), (None, Some(ended_at)));

    let missing = AttemptId(id.0 + 1000);
    assert!(matches!(ledger.transition(missing, AttemptStatus::Failed, "x", None), Err(LedgerError::NotFound { .. })));
    assert!(matches!(ledger.set_job_id(missing, "1"), Err(LedgerError::NotFound { .. })));
    assert_eq!(ledger.attempt(missing).unwrap(), None);

    // Pending straight to failed (sbatch refused): ended, never started.
    let second = ledger.insert_pending(&new).unwrap();
    ledger.transition(second, AttemptStatus::Failed, "sbatch: invalid account", None).unwrap();
    let failed = ledger.attempt(second).unwrap().unwrap();
    assert_eq!((failed.started_at, failed.attempt), (None, 2));
    assert!(failed.ended_at.is_some());
}

fn second_active_attempt_is_refused(ledger: &dyn Ledger) {
    let first = ledger.insert_pending(&new_attempt("org/A-32B", "dev_set_v2")).unwrap();
    let refused = ledger.insert_pending(&new_attempt("org/A-32B", "dev_set_v2")).unwrap_err();
    match &refused {
        LedgerError::AlreadyActive { model, family, existing_id } => {
            assert_eq!((model.as_str(), family.as_str(), *existing_id), ("org/A-32B", "dev_set_v2", first));
        }
        other => panic!("expected AlreadyActive, got {other}"),
    }
    assert!(refused.to_string().contains("org/A-32B"), "{refused}");
    // Another member of the family is the same pair; started blocks like pending.
    ledger.transition(first, AttemptStatus::Started, "running", None).unwrap();
    let refused = ledger.insert_pending(&new_attempt("org/A-32B", "openthoughts-tblite")).unwrap_err();
    assert!(matches!(refused, LedgerError::AlreadyActive { existing_id, .. } if existing_id == first), "{refused}");
    // Other models and other families are independent.
    ledger.insert_pending(&new_attempt("org/B-32B", "dev_set_v2")).unwrap();
    ledger.insert_pending(&new_attempt("org/A-32B", "terminal_bench_2")).unwrap();
    // Once the active attempt ends, the next one goes in — numbered per pair.
    ledger.transition(first, AttemptStatus::Failed, "vanished", None).unwrap();
    let second = ledger.insert_pending(&new_attempt("org/A-32B", "DCAgent_dev_set_v2")).unwrap();
    ledger.transition(second, AttemptStatus::Finished, "done", Some(&json!({"mean_reward": 1.0}))).unwrap();
    let third = ledger.insert_pending(&new_attempt("org/A-32B", "dev_set_v2")).unwrap();
    let numbers: Vec<u32> = ledger.attempts_for("org/A-32B", "dev_set_v2").unwrap().iter().map(|a| a.attempt).collect();
    assert_eq!(numbers, vec![1, 2, 3]);
    assert_eq!(ledger.attempt(third).unwrap().unwrap().attempt, 3);
    assert_eq!(ledger.active().unwrap().len(), 3);
}

fn families_count_as_one_benchmark(ledger: &dyn Ledger) {
    for (benchmark, family) in DEFAULT_FAMILIES {
        assert_eq!(ledger.family_of(benchmark).unwrap(), *family);
    }
    assert_eq!(ledger.family_of("dev_set_v2_2.0x").unwrap(), "dev_set_v2");
    assert_eq!(ledger.family_of("terminal_bench_2").unwrap(), "terminal_bench_2");
    let mut families = ledger.families().unwrap();
    families.sort();
    let mut expected: Vec<(String, String)> =
        DEFAULT_FAMILIES.iter().map(|(b, f)| (b.to_string(), f.to_string())).collect();
    expected.sort();
    assert_eq!(families, expected);

    ledger.set_family("swebench-verified-random-100-folders", "swebench-verified-random-100").unwrap();
    assert_eq!(ledger.family_of("swebench-verified-random-100-folders").unwrap(), "swebench-verified-random-100");
    // Changing a mapping is an upsert.
    ledger.set_family("swebench-verified-random-100-folders", "swe").unwrap();
    assert_eq!(ledger.family_of("swebench-verified-random-100-folders").unwrap(), "swe");
    // attempts_for and unevaluated accept a member benchmark for its family.
    let id = ledger.insert_pending(&new_attempt("m", "dev_set_v2_2.0x")).unwrap();
    assert_eq!(ledger.attempts_for("m", "DCAgent_dev_set_v2").unwrap()[0].id, id);
}

fn set_family_moves_attempts_and_refuses_merging_active_ones(ledger: &dyn Ledger) {
    let old = ledger.insert_pending(&new_attempt("m", "tb2_hard")).unwrap();
    ledger.transition(old, AttemptStatus::Failed, "x", None).unwrap();
    ledger.insert_pending(&new_attempt("m", "tb2_hard")).unwrap();
    ledger.insert_pending(&new_attempt("m", "terminal_bench_2")).unwrap();
    // Both pairs have an active attempt: merging them would break the one-active rule.
    let refused = ledger.set_family("tb2_hard", "terminal_bench_2").unwrap_err();
    assert!(matches!(refused, LedgerError::AlreadyActive { .. }), "{refused}");
    assert_eq!(ledger.family_of("tb2_hard").unwrap(), "tb2_hard", "refused change must roll back");
    for attempt in ledger.active().unwrap() {
        if attempt.benchmark == "terminal_bench_2" {
            ledger.transition(attempt.id, AttemptStatus::Cancelled, "make room", None).unwrap();
        }
    }
    ledger.set_family("tb2_hard", "terminal_bench_2").unwrap();
    let moved = ledger.attempts_for("m", "terminal_bench_2").unwrap();
    assert_eq!(moved.len(), 3);
    assert!(moved.iter().all(|a| a.benchmark_family == "terminal_bench_2"));
    assert!(ledger.attempts_for("m", "tb2_hard").unwrap().len() == 3, "tb2_hard now resolves to its family");
}

fn latest_per_pair_picks_latest_and_counts(ledger: &dyn Ledger) {
    assert!(ledger.latest_per_pair().unwrap().is_empty());
    // History with out-of-order submission times: latest is by submitted_at, not insertion order.
    ledger
        .import_attempts(&[
            imported("m1", "dev_set_v2", AttemptStatus::Failed, at(100)),
            imported("m1", "dev_set_v2_2.0x", AttemptStatus::Finished, at(300)),
            imported("m1", "DCAgent_dev_set_v2", AttemptStatus::Failed, at(200)),
            imported("m1", "terminal_bench_2", AttemptStatus::Cancelled, at(50)),
            imported("m2", "dev_set_v2", AttemptStatus::Failed, at(10)),
            imported("m2", "dev_set_v2", AttemptStatus::Failed, at(20)),
        ])
        .unwrap();
    // Ties on submitted_at go to the higher id.
    ledger
        .import_attempts(&[
            imported("m3", "swe", AttemptStatus::Failed, at(500)),
            imported("m3", "swe", AttemptStatus::Finished, at(500)),
        ])
        .unwrap();
    // A live attempt is newer than all history.
    let live = ledger.insert_pending(&new_attempt("m2", "dev_set_v2")).unwrap();

    let pairs = ledger.latest_per_pair().unwrap();
    let summary: Vec<(&str, &str, AttemptStatus, u32, u32)> = pairs
        .iter()
        .map(|p| (p.model.as_str(), p.family.as_str(), p.latest.status, p.failed_attempts, p.total_attempts))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("m1", "dev_set_v2", AttemptStatus::Finished, 2, 3),
            ("m1", "terminal_bench_2", AttemptStatus::Cancelled, 0, 1),
            ("m2", "dev_set_v2", AttemptStatus::Pending, 2, 3),
            ("m3", "swe", AttemptStatus::Finished, 1, 2),
        ]
    );
    assert_eq!(pairs[0].latest.benchmark, "dev_set_v2_2.0x");
    assert_eq!(pairs[0].latest.submitted_at, at(300));
    assert_eq!(pairs[0].latest.attempt, 3, "attempt numbers follow submission time");
    assert_eq!(pairs[0].latest.metrics, Some(json!({"mean_reward": 0.5})));
    assert_eq!(pairs[2].latest.id, live);
    assert_eq!(pairs[2].latest.attempt, 3);
}

fn catalogue_and_unevaluated(ledger: &dyn Ledger) {
    assert!(ledger.add_model("org/Alpha-8B", None).unwrap());
    assert!(ledger.add_model("org/Beta-32B-sft", Some("Qwen/Qwen3-32B")).unwrap());
    assert!(ledger.add_model("org/Gamma-8B-v2", None).unwrap());
    assert!(ledger.add_model("org/no-size-token", None).unwrap());
    assert!(ledger.add_model("org/Qwen3-30B-A3B-x", None).unwrap());
    // Idempotent; a base model given later fills in.
    assert!(!ledger.add_model("org/Alpha-8B", None).unwrap());
    assert!(!ledger.add_model("org/Alpha-8B", Some("Qwen/Qwen3-8B")).unwrap());
    assert!(!ledger.add_model("org/Alpha-8B", None).unwrap());

    let models = ledger.list_models().unwrap();
    let ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(
        ids,
        ["org/Alpha-8B", "org/Beta-32B-sft", "org/Gamma-8B-v2", "org/no-size-token", "org/Qwen3-30B-A3B-x"]
    );
    let sizes: Vec<Option<&str>> = models.iter().map(|m| m.size_class.as_deref()).collect();
    assert_eq!(sizes, [Some("8"), Some("32"), Some("8"), None, Some("30")]);
    assert_eq!(models[0].base_model.as_deref(), Some("Qwen/Qwen3-8B"));
    assert_eq!(models[1].base_model.as_deref(), Some("Qwen/Qwen3-32B"));
    assert!(models.windows(2).all(|w| w[0].registered_at <= w[1].registered_at));

    // Alpha finished on a family member; Gamma only failed; Beta is running.
    let alpha = ledger.insert_pending(&new_attempt("org/Alpha-8B", "dev_set_v2_2.0x")).unwrap();
    ledger.transition(alpha, AttemptStatus::Finished, "done", Some(&json!({"mean_reward": 0.3}))).unwrap();
    let gamma = ledger.insert_pending(&new_attempt("org/Gamma-8B-v2", "dev_set_v2")).unwrap();
    ledger.transition(gamma, AttemptStatus::Failed, "oom", None).unwrap();
    ledger.insert_pending(&new_attempt("org/Beta-32B-sft", "dev_set_v2")).unwrap();

    assert_eq!(
        ledger.unevaluated("dev_set_v2", None).unwrap(),
        ["org/Beta-32B-sft", "org/Gamma-8B-v2", "org/no-size-token", "org/Qwen3-30B-A3B-x"]
    );
    assert_eq!(ledger.unevaluated("dev_set_v2", Some("8")).unwrap(), ["org/Gamma-8B-v2"]);
    assert_eq!(ledger.unevaluated("openthoughts-tblite", Some("8")).unwrap(), ["org/Gamma-8B-v2"]);
    // The 32B class is a band (28–42B, MoE by total size): the 30B-A3B MoE is in it.
    assert_eq!(ledger.unevaluated("dev_set_v2", Some("32")).unwrap(), ["org/Beta-32B-sft", "org/Qwen3-30B-A3B-x"]);
    assert_eq!(ledger.unevaluated("terminal_bench_2", Some("8")).unwrap(), ["org/Alpha-8B", "org/Gamma-8B-v2"]);
    assert!(ledger.unevaluated("dev_set_v2", Some("70")).unwrap().is_empty());
    // An id without a size token falls back to its base model's.
    assert!(ledger.unevaluated("dev_set_v2", Some("32")).unwrap().iter().all(|m| m != "org/no-size-token"));
    assert!(!ledger.add_model("org/no-size-token", Some("Qwen/Qwen2.5-32B-Instruct")).unwrap());
    assert_eq!(
        ledger.unevaluated("dev_set_v2", Some("32")).unwrap(),
        ["org/Beta-32B-sft", "org/no-size-token", "org/Qwen3-30B-A3B-x"]
    );
}

fn heartbeats_per_submitter_and_cluster(ledger: &dyn Ledger) {
    assert!(ledger.heartbeats().unwrap().is_empty());
    ledger.record_heartbeat("vista", "alice@login1", 3600).unwrap();
    ledger.record_heartbeat("jupiter", "bob@jrlogin", 0).unwrap();
    ledger.record_heartbeat("vista", "alice@login1", 7200).unwrap(); // refresh: one row, new bound
    let beats = ledger.heartbeats().unwrap();
    let rows: Vec<(&str, &str, u64)> =
        beats.iter().map(|h| (h.cluster.as_str(), h.submitter.as_str(), h.stale_after_s)).collect();
    assert_eq!(rows, [("jupiter", "bob@jrlogin", 0), ("vista", "alice@login1", 7200)]);
    assert!(beats.iter().all(|h| h.age_s < 60), "{beats:?}");
    assert!(!beats[1].is_stale());
}

fn imported_rows_are_tracked_by_source(ledger: &dyn Ledger) {
    let source = "postgres://team@db:5432/postgres";
    assert_eq!(ledger.import_watermark(source).unwrap(), None);
    let mut done = imported("org/A-8B", "terminal_bench_2", AttemptStatus::Finished, at(0));
    done.source_id = Some(format!("{source}#1"));
    let mut running = imported("org/B-8B", "terminal_bench_2", AttemptStatus::Started, at(10));
    running.source_id = Some(format!("{source}#2"));
    let mut other = imported("org/C-8B", "terminal_bench_2", AttemptStatus::Failed, at(20));
    other.source_id = Some("postgres://else@db/x#1".to_string());
    assert_eq!(ledger.import_attempts(&[done, running.clone(), other]).unwrap(), 3);
    let mut states = ledger.imported(source).unwrap();
    states.sort_by(|a, b| a.source_id.cmp(&b.source_id));
    let summary: Vec<(&str, AttemptStatus, bool)> =
        states.iter().map(|s| (s.source_id.as_str(), s.status, s.has_metrics)).collect();
    assert_eq!(
        summary,
        [
            (format!("{source}#1").as_str(), AttemptStatus::Finished, true),
            (format!("{source}#2").as_str(), AttemptStatus::Started, false)
        ]
    );
    // The source says it finished: the row follows, metrics included.
    let mut finished = running;
    finished.status = AttemptStatus::Finished;
    finished.metrics = Some(json!({"mean_reward": 0.25}));
    finished.ended_at = Some(at(100));
    assert_eq!(ledger.update_imported(&[(states[1].id, finished)]).unwrap(), 1);
    let row = ledger.attempt(states[1].id).unwrap().unwrap();
    assert_eq!((row.status, row.ended_at), (AttemptStatus::Finished, Some(at(100))));
    assert_eq!(row.metrics, Some(json!({"mean_reward": 0.25})));
    // A finished import may go back to active (the team's resume path resets rows in place), but
    // never next to another active attempt of its pair.
    ledger.insert_pending(&new_attempt("org/A-8B", "terminal_bench_2")).unwrap();
    let mut reset = imported("org/A-8B", "terminal_bench_2", AttemptStatus::Pending, at(200));
    reset.source_id = Some(format!("{source}#1"));
    assert!(ledger.update_imported(&[(states[0].id, reset)]).is_err());
    assert_eq!(ledger.attempt(states[0].id).unwrap().unwrap().status, AttemptStatus::Finished, "rolled back");

    ledger.set_import_watermark(source, Some(at(100))).unwrap();
    ledger.set_import_watermark(source, Some(at(150))).unwrap();
    assert_eq!(ledger.import_watermark(source).unwrap(), Some(at(150)));
}

fn lookups_by_run_tag_and_active(ledger: &dyn Ledger) {
    let new = new_attempt("org/M-8B", "terminal_bench_2");
    let first = ledger.insert_pending(&new).unwrap();
    ledger.transition(first, AttemptStatus::Failed, "vanished", None).unwrap();
    let second = ledger.insert_pending(&new).unwrap();
    ledger.insert_pending(&new_attempt("org/N-8B", "terminal_bench_2")).unwrap();
    let by_tag: Vec<AttemptId> = ledger.find_by_run_tag(&new.run_tag).unwrap().iter().map(|a| a.id).collect();
    assert_eq!(by_tag, [first, second]);
    assert!(ledger.find_by_run_tag("no-such-tag").unwrap().is_empty());
    let active: Vec<(String, AttemptStatus)> =
        ledger.active().unwrap().into_iter().map(|a| (a.model, a.status)).collect();
    assert_eq!(
        active,
        [("org/M-8B".to_string(), AttemptStatus::Pending), ("org/N-8B".to_string(), AttemptStatus::Pending)]
    );
}

/// Migration 5 (issue 24): an attempt's GPU-seconds record is written, replaced, read back with
/// what identifies the attempt, for finished and failed attempts alike; an unknown id is NotFound.
fn gpu_seconds_are_recorded_per_attempt(ledger: &dyn Ledger) {
    let new = new_attempt("org/M-32B", "terminal_bench_2");
    let failed = ledger.insert_pending(&new).unwrap();
    ledger.transition(failed, AttemptStatus::Failed, "walltime", None).unwrap();
    let finished = ledger.insert_pending(&new).unwrap();
    ledger.transition(finished, AttemptStatus::Finished, "finished", Some(&json!({"mean_reward": 0.5}))).unwrap();
    ledger.insert_pending(&new_attempt("org/N-8B", "terminal_bench_2")).unwrap();
    assert!(ledger.gpu_seconds().unwrap().is_empty());
    let record = |serving: f64| {
        json!({"gpus": 4, "shared": null, "complete": true, "slurm_elapsed_s": 100.5,
                                       "by_phase": {"load": 240.0, "serving": serving}})
    };
    ledger.record_gpu_seconds(failed, &record(1.0)).unwrap();
    ledger.record_gpu_seconds(finished, &record(2.0)).unwrap();
    ledger.record_gpu_seconds(finished, &record(3.25)).unwrap();
    let rows = ledger.gpu_seconds().unwrap();
    let got: Vec<(AttemptId, AttemptStatus, f64)> =
        rows.iter().map(|r| (r.id, r.status, r.record["by_phase"]["serving"].as_f64().unwrap())).collect();
    assert_eq!(got, [(failed, AttemptStatus::Failed, 1.0), (finished, AttemptStatus::Finished, 3.25)]);
    assert_eq!((rows[1].model.as_str(), rows[1].benchmark.as_str()), ("org/M-32B", "terminal_bench_2"));
    assert_eq!(rows[1].run_tag, new.run_tag);
    assert_eq!(rows[1].record, record(3.25));
    let missing = ledger.record_gpu_seconds(AttemptId(987_654), &record(1.0));
    assert!(matches!(missing, Err(LedgerError::NotFound { .. })), "{missing:?}");
}

/// Migration 7 (issue 35): an attempt's trials and Harbor version are written, replaced whole,
/// read back in task order with fractional rewards and validity intact; an unknown id is NotFound.
fn trials_are_recorded_per_attempt(ledger: &dyn Ledger) {
    let id = ledger.insert_pending(&new_attempt("org/M-8B", "terminal_bench_2")).unwrap();
    assert_eq!(ledger.trials(id).unwrap(), None);
    let trial =
        |task: &str, attempt: u32, reward: f64, valid: bool| Trial { task: task.into(), attempt, reward, valid };
    let first = TrialSet {
        harbor_version: Some("0.25.0".into()),
        trials: vec![trial("b-task", 1, 0.25, true), trial("a-task", 2, 0.0, false), trial("a-task", 1, 1.0, true)],
    };
    ledger.record_trials(id, &first).unwrap();
    let read = ledger.trials(id).unwrap().unwrap();
    assert_eq!(read.harbor_version.as_deref(), Some("0.25.0"));
    assert_eq!(read.trials, [first.trials[2].clone(), first.trials[1].clone(), first.trials[0].clone()]);
    let second = TrialSet { harbor_version: None, trials: vec![trial("c-task", 1, 1.0, true)] };
    ledger.record_trials(id, &second).unwrap();
    assert_eq!(ledger.trials(id).unwrap().unwrap(), second);
    let missing = ledger.record_trials(AttemptId(987_654), &second);
    assert!(matches!(missing, Err(LedgerError::NotFound { .. })), "{missing:?}");
}

fn import_keeps_the_active_rule(ledger: &dyn Ledger) {
    let live = ledger.insert_pending(&new_attempt("m", "dev_set_v2")).unwrap();
    let clash = ledger.import_attempts(&[
        imported("other", "x", AttemptStatus::Finished, at(1)),
        imported("m", "dev_set_v2_2.0x", AttemptStatus::Started, at(2)),
    ]);
    assert!(matches!(clash, Err(LedgerError::AlreadyActive { existing_id, .. }) if existing_id == live), "{clash:?}");
    let twice = ledger.import_attempts(&[
        imported("n", "x", AttemptStatus::Pending, at(1)),
        imported("n", "x", AttemptStatus::Started, at(2)),
    ]);
    assert!(matches!(twice, Err(LedgerError::InvalidImport { .. })), "{twice:?}");
    // All or nothing: the refused batches left no rows.
    assert!(ledger.attempts_for("other", "x").unwrap().is_empty());
    assert!(ledger.attempts_for("n", "x").unwrap().is_empty());
    assert_eq!(ledger.import_attempts(&[imported("n", "x", AttemptStatus::Started, at(1))]).unwrap(), 1);
    assert_eq!(ledger.import_attempts(&[]).unwrap(), 0);
}

/// Threads, each with its own connection, insert the same pair at once, round after round.
fn racing_threads_one_wins(store: &Store) {
    const RACERS: usize = 6;
    let ledgers: Vec<Box<dyn Ledger>> = (0..RACERS).map(|_| store.open()).collect();
    for round in 0..5 {
        let barrier = Arc::new(Barrier::new(RACERS));
        let results: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = ledgers
                .iter()
                .map(|ledger| {
                    let barrier = Arc::clone(&barrier);
                    scope.spawn(move || {
                        barrier.wait();
                        ledger.insert_pending(&new_attempt("org/Race-8B", "dev_set_v2"))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<AttemptId> = results.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        for result in &results {
            match result {
                Ok(_) => {}
                Err(LedgerError::AlreadyActive { existing_id, .. }) => assert_eq!(*existing_id, winners[0]),
                Err(other) => panic!("round {round}: unexpected {other}"),
            }
        }
        ledgers[0].transition(winners[0], AttemptStatus::Failed, "next round", None).unwrap();
    }
    assert_eq!(ledgers[0].attempts_for("org/Race-8B", "dev_set_v2").unwrap().len(), 5);
}

/// The same race across processes: this test binary re-runs itself as `race_child`.
fn racing_processes_one_wins(store: &Store) {
    const RACERS: usize = 4;
    drop(store.open()); // migrate first so the children race on the insert, not on the schema
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..RACERS)
        .map(|n| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "ledger::race_child", "--nocapture", "--test-threads=1", "--quiet"])
                .env("LEDGER_RACE_SPEC", &store.spec)
                .env("LEDGER_RACE_DIR", dir.path())
                .env("LEDGER_RACE_INDEX", n.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while (0..RACERS).any(|n| !dir.path().join(format!("ready-{n}")).exists()) {
        assert!(Instant::now() < deadline, "race children did not get ready");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::write(dir.path().join("go"), b"").unwrap();
    let mut won = Vec::new();
    let mut lost = Vec::new();
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout
            .lines()
            .find_map(|l| l.split_once("RACE-RESULT ").map(|(_, r)| r))
            .unwrap_or_else(|| panic!("no result from child: {stdout}\n{}", String::from_utf8_lossy(&output.stderr)));
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["won", id, ..] => won.push(id.to_string()),
            ["lost", id, ..] => lost.push(id.to_string()),
            _ => panic!("child failed: {line}"),
        }
    }
    assert_eq!(won.len(), 1, "won {won:?}, lost {lost:?}");
    assert!(lost.iter().all(|id| *id == won[0]), "won {won:?}, lost {lost:?}");
    assert_eq!(store.open().active().unwrap().len(), 1);
}

/// The child half of `racing_processes_one_wins`; a no-op when run as an ordinary test.
#[test]
fn race_child() {
    let (Ok(spec), Ok(dir), Ok(index)) =
        (std::env::var("LEDGER_RACE_SPEC"), std::env::var("LEDGER_RACE_DIR"), std::env::var("LEDGER_RACE_INDEX"))
    else {
        return;
    };
    let dir = PathBuf::from(dir);
    let ledger = open_ledger(&spec).unwrap();
    ledger.ping().unwrap();
    std::fs::write(dir.join(format!("ready-{index}")), b"").unwrap();
    while !dir.join("go").exists() {
        std::thread::sleep(Duration::from_millis(1));
    }
    match ledger.insert_pending(&new_attempt("org/Race-8B", "dev_set_v2")) {
        Ok(id) => println!("RACE-RESULT won {id}"),
        Err(LedgerError::AlreadyActive { existing_id, .. }) => println!("RACE-RESULT lost {existing_id}"),
        Err(other) => println!("RACE-RESULT error {other}"),
    }
}

/// `sslmode=require` encrypts against the local server's self-signed certificate (as libpq does);
/// `verify-full` must refuse that certificate. SQLite has no TLS: nothing to check.
fn tls_require_and_verify(store: &Store) {
    if !store.is_postgres() {
        return;
    }
    let mut admin = pg_admin().unwrap();
    let ssl: String = admin.query_one("SHOW ssl", &[]).unwrap().get(0);
    if ssl != "on" {
        eprintln!("note: the PostgreSQL server has ssl off; TLS not exercised");
        return;
    }
    let name = format!("ledger_tls_{}", std::process::id());
    let require = open_ledger(&with_param(&store.spec, &format!("sslmode=require&application_name={name}"))).unwrap();
    require.ping().unwrap();
    let encrypted: Option<bool> = admin
        .query_one(
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE a.application_name = $1",
            &[&name],
        )
        .unwrap()
        .get(0);
    assert_eq!(encrypted, Some(true), "the ledger connection is not encrypted");
    let verify = open_ledger(&with_param(&store.spec, "sslmode=verify-full&sslrootcert=system"));
    let error = verify.err().expect("verify-full must reject a self-signed certificate");
    assert!(matches!(error, LedgerError::Unreachable { .. }), "{error}");
    assert!(error.to_string().contains("sslmode"), "{error}");
}

fn wrong_password_is_a_clear_error(store: &Store) {
    if !store.is_postgres() {
        return;
    }
    let url = pg_url();
    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let user = rest.rsplit_once('@').and_then(|(info, _)| info.split(':').next()).unwrap_or("evaltest");
    let error = open_ledger(&format!("{scheme}://{user}:Wr0ng-Pa55word@{host}")).err().expect("bad password refused");
    assert!(matches!(error, LedgerError::Rejected { .. }), "{error}");
    let (text, debug) = (error.to_string(), format!("{error:?}"));
    assert!(!text.contains("Wr0ng-Pa55word") && !debug.contains("Wr0ng-Pa55word"), "{text} / {debug}");
    assert!(text.contains("password"), "{text}");
}

// ------------------------------------------------------------------------------------ down

#[test]
fn postgres_down_is_a_clear_error_without_the_password() {
    // Port 1 on loopback: nothing listens, the connection is refused at once.
    let password = crate::pg::test_password();
    let started = Instant::now();
    let error = open_ledger(&format!("postgres://alice:{password}@127.0.0.1:1/ledger?sslmode=require"))
        .err()
        .expect("nothing listens on port 1");
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
    let (text, debug) = (error.to_string(), format!("{error:?}"));
    // Failure messages show the error with the (real) password masked, so a failing run cannot leak it.
    let shown = text.replace(&password, "<password>");
    assert!(matches!(error, LedgerError::Unreachable { .. }), "{shown}");
    assert!(text.starts_with("ledger postgres://alice@127.0.0.1:1/ledger unreachable: "), "{shown}");
    assert!(text.contains("is PostgreSQL running"), "{shown}");
    assert!(!text.contains('\n'), "{shown}");
    assert!(!text.contains(&password) && !debug.contains(&password), "the password is in the error");
}

#[test]
fn bad_specs_are_clear_errors_without_the_password() {
    let password = crate::pg::test_password();
    for spec in [format!("mysql://u:{password}@h/db"), format!("postgres://u:{password}@h:notaport/db"), String::new()]
    {
        let error = open_ledger(&spec).err().expect("refused");
        let (text, debug) = (error.to_string(), format!("{error:?}"));
        assert!(matches!(error, LedgerError::BadSpec { .. }), "{}", text.replace(&password, "<password>"));
        assert!(!text.contains(&password) && !debug.contains(&password), "the password is in the error");
    }
}

#[test]
fn sqlite_in_an_unusable_place_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let error = open_ledger(&format!("sqlite:{}/ledger.sqlite", file.display())).err().expect("refused");
    let text = error.to_string();
    assert!(matches!(error, LedgerError::Unreachable { .. }), "{text}");
    assert!(text.contains("not-a-dir/ledger.sqlite") && text.contains("writable"), "{text}");

    // A file that is not a database is refused on open, not on first use.
    let junk = dir.path().join("junk.sqlite");
    std::fs::write(&junk, vec![7u8; 4096]).unwrap();
    let error = open_ledger(junk.to_str().unwrap()).err().expect("refused");
    assert!(error.to_string().contains("junk.sqlite"), "{error}");
}

#[test]
fn sqlite_default_location_is_in_the_state_dir() {
    let dir = tempfile::tempdir().unwrap();
    let path = submitter::ledger::default_path(&dir.path().join("state"));
    assert!(path.ends_with("state/ledger.sqlite"));
    let ledger = open_ledger(path.to_str().unwrap()).unwrap();
    assert!(Path::new(&path).is_file());
    assert_eq!(ledger.location(), format!("sqlite:{}", path.display()));
    let memory = open_ledger(":memory:").unwrap();
    memory.insert_pending(&new_attempt("m", "b")).unwrap();
    assert_eq!(memory.active().unwrap().len(), 1);
}

/// Issue 21 item 7: `SUBMITTER_LEDGER="host=… dbname=… user=…"`, a libpq keyword string, is the
/// PostgreSQL ledger it names (the real test server, its schema migrated), never a new empty SQLite
/// file of that name in the current directory; the password is never printed.
#[test]
fn a_libpq_keyword_string_is_the_postgres_ledger_never_a_new_file() {
    let Some(store) = Store::postgres("keyword_string") else { return };
    let schema = store.pg_schema.as_ref().map(|s| s.name.clone()).unwrap();
    let config: ::postgres::Config = pg_url().parse().unwrap();
    let host = match &config.get_hosts()[0] {
        ::postgres::config::Host::Tcp(host) => host.clone(),
        ::postgres::config::Host::Unix(path) => path.display().to_string(),
    };
    let quote = |text: &str| format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"));
    let mut keywords = format!(
        "host={host} port={} dbname={} user={} options={}",
        config.get_ports().first().copied().unwrap_or(5432),
        config.get_dbname().unwrap_or("postgres"),
        config.get_user().unwrap_or("postgres"),
        quote(&format!("-c search_path={schema}"))
    );
    let password = config.get_password().map(|p| String::from_utf8_lossy(p).into_owned()).filter(|p| !p.is_empty());
    if let Some(password) = &password {
        keywords += &format!(" password={}", quote(password));
    }
    let cluster = crate::queueing::TestCluster::new("keywords", |_| {});
    let out =
        cluster.command_without_ledger(&["status"], &[], &[("SUBMITTER_LEDGER", keywords.as_str())]).output().unwrap();
    let printed = crate::queueing::text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(password.is_none_or(|p| !printed.contains(&p)), "the password was printed: {printed}");
    let stray: Vec<_> = std::fs::read_dir(cluster.root())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains('='))
        .collect();
    // Not printed: the name would hold the password.
    assert!(stray.is_empty(), "{} file(s) were made of the connection string", stray.len());
    let mut admin = pg_admin().unwrap();
    let row = admin
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name = 'attempts'",
            &[&schema],
        )
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 1, "the ledger was created in the named database's schema");
    // A keyword the driver does not know is one line naming it, not a file.
    let out = cluster
        .command_without_ledger(&["status"], &[], &[("SUBMITTER_LEDGER", "host=h dbnme=x password=s3cret")])
        .output()
        .unwrap();
    let printed = crate::queueing::text(&out);
    assert!(!out.status.success() && printed.contains("unknown keyword `dbnme`"), "{printed}");
    assert!(!printed.contains("s3cret") && printed.trim().lines().count() == 1, "{printed}");
}

/// Issue 21 item 12: a file holding another program's `attempts` table is refused in one line
/// naming what it is, not with the submitter's 60-line migration script.
#[test]
fn another_programs_attempts_table_is_one_line_of_error() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("other.db");
    let other = rusqlite::Connection::open(&file).unwrap();
    other.execute_batch("CREATE TABLE attempts (id INTEGER PRIMARY KEY, foo TEXT)").unwrap();
    drop(other);
    let out = crate::support::submitter(&[
        "status",
        "--cluster",
        "local",
        "--ledger",
        file.to_str().unwrap(),
        "--state-dir",
        tmp.path().to_str().unwrap(),
    ]);
    let err = crate::support::stderr(&out);
    assert_eq!(out.status.code(), Some(3), "the ledger is unusable (docs/exit-codes.md): {err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("another program's tables") && !err.contains("CREATE TABLE"), "{err}");
}
