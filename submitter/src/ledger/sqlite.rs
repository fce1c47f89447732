//! The embedded backend: one SQLite file in the cluster's state dir (bundled SQLite, so login
//! nodes need no system library and nothing runs in the background).
//!
//! Every write is a `BEGIN IMMEDIATE` transaction: the write lock is taken before anything is read,
//! so read-then-write sequences (the next attempt number, the migration check) cannot interleave
//! with another process, and a busy database waits ([`BUSY_TIMEOUT`]) instead of failing with
//! SQLite's unretryable "snapshot" error. The journal stays in SQLite's default rollback mode, not
//! WAL: state dirs often sit on NFS or GPFS shared by several login nodes, where WAL's shared-memory
//! index is unsafe.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OptionalExtension, Row, Transaction, TransactionBehavior, params};
use serde_json::Value;

use super::migrations::{self, Migration};
use super::{
    ATTEMPT_COLUMNS, Attempt, AttemptId, Heartbeat, ImportedAttempt, ImportedState, LATEST_PER_PAIR_SQL, Ledger,
    LedgerError, Model, NewAttempt, PairState, Result, Status, Timestamp, filter_by_size, number_imports, size_class,
    sql_status_list,
};

/// How long a write waits for another process's transaction before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Timestamps as fixed-width RFC 3339 UTC with microseconds: text order is time order, which the
/// recency index and every `ORDER BY submitted_at` rely on.
const TIMESTAMP_FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.6fZ";

pub struct SqliteLedger {
    conn: Mutex<Connection>,
    location: String,
}

impl std::fmt::Debug for SqliteLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SqliteLedger({})", self.location)
    }
}

/// Errors inside a closure run by [`SqliteLedger::read`] / [`SqliteLedger::write`]: driver errors
/// get the ledger's location and the operation attached once, at the boundary.
enum Failure {
    Db(rusqlite::Error),
    Ledger(LedgerError),
}

impl From<rusqlite::Error> for Failure {
    fn from(error: rusqlite::Error) -> Self {
        Failure::Db(error)
    }
}

impl From<LedgerError> for Failure {
    fn from(error: LedgerError) -> Self {
        Failure::Ledger(error)
    }
}

type Step<T> = std::result::Result<T, Failure>;

impl SqliteLedger {
    /// Opens or creates the ledger file (and its directory), then applies pending migrations.
    /// `:memory:` gives a private in-memory ledger.
    pub fn open(path: &Path) -> Result<Self> {
        let location = format!("sqlite:{}", path.display());
        let unreachable = |detail: String| LedgerError::Unreachable {
            location: location.clone(),
            detail,
            hint: "check that the state dir exists and is writable",
        };
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| unreachable(format!("cannot create {}: {e}", dir.display())))?;
        }
        let conn = Connection::open(path).map_err(|e| unreachable(e.to_string()))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| unreachable(e.to_string()))?;
        let ledger = SqliteLedger { conn: Mutex::new(conn), location };
        ledger.migrate()?;
        Ok(ledger)
    }

    fn migrate(&self) -> Result<()> {
        let location = self.location.clone();
        self.write("apply migrations", |tx| {
            // Under the write lock: a second opener waits here, then finds nothing left to do.
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS schema_migrations (
                     version    INTEGER PRIMARY KEY,
                     name       TEXT NOT NULL,
                     applied_at TEXT NOT NULL)",
            )?;
            let applied: Vec<(i64, String)> = tx
                .prepare("SELECT version, name FROM schema_migrations ORDER BY version")?
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            for migration in migrations::pending(&location, &applied)? {
                apply(tx, migration).map_err(|e| LedgerError::Migration {
                    location: location.clone(),
                    version: migration.version,
                    detail: e.to_string(),
                })?;
            }
            Ok(())
        })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic elsewhere cannot leave the connection mid-transaction (rusqlite rolls back on
        // drop), so a poisoned lock is still a usable connection.
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn read<T>(&self, operation: &'static str, body: impl FnOnce(&Connection) -> Step<T>) -> Result<T> {
        let conn = self.lock();
        body(&conn).map_err(|failure| self.fail(operation, failure))
    }

    fn write<T>(&self, operation: &'static str, body: impl FnOnce(&Transaction<'_>) -> Step<T>) -> Result<T> {
        let mut conn = self.lock();
        let run = || -> Step<T> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let value = body(&tx)?;
            tx.commit()?;
            Ok(value)
        };
        run().map_err(|failure| self.fail(operation, failure))
    }

    fn fail(&self, operation: &'static str, failure: Failure) -> LedgerError {
        match failure {
            Failure::Ledger(error) => error,
            Failure::Db(error) => {
                let detail = match error.sqlite_error_code() {
                    Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => format!(
                        "{error} (waited {} s for another process — is another submitter writing?)",
                        BUSY_TIMEOUT.as_secs()
                    ),
                    _ => error.to_string(),
                };
                LedgerError::Backend { location: self.location.clone(), operation, detail }
            }
        }
    }

    fn corrupt(&self, detail: String) -> Failure {
        Failure::Ledger(LedgerError::Corrupt { location: self.location.clone(), detail })
    }

    fn attempts_where(&self, conn: &Connection, condition: &str, args: &[&dyn rusqlite::ToSql]) -> Step<Vec<Attempt>> {
        let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE {condition} ORDER BY submitted_at, id");
        let raws: Vec<RawAttempt> =
            conn.prepare_cached(&sql)?.query_map(args, RawAttempt::from_row)?.collect::<rusqlite::Result<_>>()?;
        raws.into_iter().map(|raw| raw.parse().map_err(|e| self.corrupt(e))).collect()
    }
}

fn apply(tx: &Transaction<'_>, migration: &Migration) -> rusqlite::Result<()> {
    tx.execute_batch(migration.sqlite)?;
    tx.execute(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
        params![migration.version, migration.name, format_ts(super::now())],
    )?;
    Ok(())
}

fn format_ts(ts: Timestamp) -> String {
    ts.format(TIMESTAMP_FORMAT).to_string()
}

fn parse_ts(text: &str) -> std::result::Result<Timestamp, String> {
    chrono::DateTime::parse_from_rfc3339(text).map(|t| t.to_utc()).map_err(|e| format!("timestamp {text:?}: {e}"))
}

fn parse_json(text: &str) -> std::result::Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("JSON {text:?}: {e}"))
}

/// SQL NULL for an absent or JSON-null value: "no metrics" is one state, not two.
fn json_text(value: Option<&Value>) -> Option<String> {
    value.filter(|v| !v.is_null()).map(Value::to_string)
}

fn is_unique_violation(error: &rusqlite::Error) -> bool {
    matches!(error, rusqlite::Error::SqliteFailure(e, _)
        if e.code == ErrorCode::ConstraintViolation && e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE)
}

/// A row as stored, converted outside the driver's closure so that conversion errors can name the
/// ledger.
struct RawAttempt {
    id: i64,
    model: String,
    benchmark: String,
    benchmark_family: String,
    cluster: String,
    username: String,
    run_tag: String,
    slurm_job_id: Option<String>,
    status: String,
    reason: String,
    config: String,
    metrics: Option<String>,
    attempt: i64,
    submitted_at: String,
    started_at: Option<String>,
    ended_at: Option<String>,
    updated_at: String,
}

impl RawAttempt {
    fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(RawAttempt {
            id: row.get(0)?,
            model: row.get(1)?,
            benchmark: row.get(2)?,
            benchmark_family: row.get(3)?,
            cluster: row.get(4)?,
            username: row.get(5)?,
            run_tag: row.get(6)?,
            slurm_job_id: row.get(7)?,
            status: row.get(8)?,
            reason: row.get(9)?,
            config: row.get(10)?,
            metrics: row.get(11)?,
            attempt: row.get(12)?,
            submitted_at: row.get(13)?,
            started_at: row.get(14)?,
            ended_at: row.get(15)?,
            updated_at: row.get(16)?,
        })
    }

    fn parse(self) -> std::result::Result<Attempt, String> {
        let optional_ts = |t: Option<String>| t.as_deref().map(parse_ts).transpose();
        Ok(Attempt {
            id: AttemptId(self.id),
            status: self.status.parse()?,
            config: parse_json(&self.config)?,
            metrics: self.metrics.as_deref().map(parse_json).transpose()?,
            attempt: u32::try_from(self.attempt).map_err(|_| format!("attempt number {}", self.attempt))?,
            submitted_at: parse_ts(&self.submitted_at)?,
            started_at: optional_ts(self.started_at)?,
            ended_at: optional_ts(self.ended_at)?,
            updated_at: parse_ts(&self.updated_at)?,
            model: self.model,
            benchmark: self.benchmark,
            benchmark_family: self.benchmark_family,
            cluster: self.cluster,
            username: self.username,
            run_tag: self.run_tag,
            slurm_job_id: self.slurm_job_id,
            reason: self.reason,
        })
    }
}

const FAMILY_OF_SQL: &str = "SELECT COALESCE((SELECT family FROM benchmark_families WHERE benchmark = ?1), ?1)";

fn family_of(conn: &Connection, benchmark: &str) -> rusqlite::Result<String> {
    conn.prepare_cached(FAMILY_OF_SQL)?.query_row([benchmark], |row| row.get(0))
}

fn active_id(conn: &Connection, model: &str, family: &str) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached(
        "SELECT id FROM attempts WHERE model = ?1 AND benchmark_family = ?2 AND status IN ('pending', 'started')",
    )?
    .query_row([model, family], |row| row.get(0))
    .optional()
}

impl Ledger for SqliteLedger {
    fn location(&self) -> &str {
        &self.location
    }

    fn ping(&self) -> Result<()> {
        self.read("ping", |conn| Ok(conn.query_row("SELECT 1", [], |_| Ok(()))?))
    }

    fn schema_version(&self) -> Result<i64> {
        self.read("read the schema version", |conn| {
            Ok(conn.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |row| row.get(0))?)
        })
    }

    fn family_of(&self, benchmark: &str) -> Result<String> {
        self.read("look up a benchmark family", |conn| Ok(family_of(conn, benchmark)?))
    }

    fn set_family(&self, benchmark: &str, family: &str) -> Result<()> {
        self.write("set a benchmark family", |tx| {
            // Moving the benchmark's attempts must not merge two active attempts into one pair.
            let clash = tx
                .query_row(
                    "SELECT moving.model, staying.id
                     FROM attempts moving
                     JOIN attempts staying
                       ON staying.model = moving.model AND staying.benchmark_family = ?2
                      AND staying.status IN ('pending', 'started') AND staying.benchmark <> ?1
                     WHERE moving.benchmark = ?1 AND moving.benchmark_family <> ?2
                       AND moving.status IN ('pending', 'started')
                     LIMIT 1",
                    [benchmark, family],
                    |row| Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?)),
                )
                .optional()?;
            if let Some((model, existing)) = clash {
                return Err(LedgerError::AlreadyActive {
                    model,
                    family: family.to_string(),
                    existing_id: AttemptId(existing),
                }
                .into());
            }
            tx.execute(
                "INSERT INTO benchmark_families (benchmark, family) VALUES (?1, ?2)
                 ON CONFLICT (benchmark) DO UPDATE SET family = excluded.family",
                [benchmark, family],
            )?;
            tx.execute(
                "UPDATE attempts SET benchmark_family = ?2, updated_at = ?3
                 WHERE benchmark = ?1 AND benchmark_family <> ?2",
                params![benchmark, family, format_ts(super::now())],
            )?;
            Ok(())
        })
    }

    fn families(&self) -> Result<Vec<(String, String)>> {
        self.read("list benchmark families", |conn| {
            Ok(conn
                .prepare("SELECT benchmark, family FROM benchmark_families ORDER BY benchmark")?
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?)
        })
    }

    fn insert_pending(&self, new: &NewAttempt) -> Result<AttemptId> {
        self.write("insert a pending attempt", |tx| {
            let family = family_of(tx, &new.benchmark)?;
            let now = format_ts(super::now());
            let inserted = tx
                .prepare_cached(
                    "INSERT INTO attempts (model, benchmark, benchmark_family, cluster, username, run_tag, status,
                                       reason, config, attempt, submitted_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', ?7, ?8,
                         (SELECT COALESCE(MAX(attempt), 0) + 1 FROM attempts
                          WHERE model = ?1 AND benchmark_family = ?3),
                         ?9, ?9)",
                )?
                .execute(params![
                    new.model,
                    new.benchmark,
                    family,
                    new.cluster,
                    new.username,
                    new.run_tag,
                    new.reason,
                    new.config.to_string(),
                    now,
                ]);
            match inserted {
                Ok(_) => Ok(AttemptId(tx.last_insert_rowid())),
                // The partial unique index said no: the pair has an active attempt.
                Err(e) if is_unique_violation(&e) => {
                    let existing = active_id(tx, &new.model, &family)?.ok_or(Failure::Db(e))?;
                    Err(LedgerError::AlreadyActive {
                        model: new.model.clone(),
                        family,
                        existing_id: AttemptId(existing),
                    }
                    .into())
                }
                Err(e) => Err(e.into()),
            }
        })
    }

    fn set_job_id(&self, id: AttemptId, slurm_job_id: &str) -> Result<()> {
        self.write("set a Slurm job id", |tx| {
            let updated = tx.execute(
                "UPDATE attempts SET slurm_job_id = ?2, updated_at = ?3
                 WHERE id = ?1 AND (slurm_job_id IS NULL OR slurm_job_id = ?2)",
                params![id.0, slurm_job_id, format_ts(super::now())],
            )?;
            if updated == 1 {
                return Ok(());
            }
            let existing: Option<Option<String>> =
                tx.query_row("SELECT slurm_job_id FROM attempts WHERE id = ?1", [id.0], |row| row.get(0)).optional()?;
            Err(match existing {
                None => LedgerError::NotFound { location: self.location.clone(), id },
                Some(existing) => LedgerError::JobIdConflict {
                    location: self.location.clone(),
                    id,
                    existing: existing.unwrap_or_default(),
                    requested: slurm_job_id.to_string(),
                },
            }
            .into())
        })
    }

    fn transition(&self, id: AttemptId, to: Status, reason: &str, metrics: Option<&Value>) -> Result<()> {
        let sql = format!(
            "UPDATE attempts SET
                 status = ?2,
                 reason = ?3,
                 metrics = CASE WHEN ?4 THEN ?5 ELSE metrics END,
                 started_at = CASE WHEN ?2 = 'started' THEN COALESCE(started_at, ?6) ELSE started_at END,
                 ended_at = CASE WHEN ?2 IN ('finished', 'failed', 'cancelled') THEN COALESCE(ended_at, ?6)
                                 ELSE ended_at END,
                 updated_at = ?6
             WHERE id = ?1 AND status IN {}",
            sql_status_list(&Status::sources_of(to))
        );
        self.write("change an attempt's status", |tx| {
            let updated = tx.execute(
                &sql,
                params![id.0, to.as_str(), reason, metrics.is_some(), json_text(metrics), format_ts(super::now())],
            )?;
            if updated == 1 {
                return Ok(());
            }
            let from: Option<String> =
                tx.query_row("SELECT status FROM attempts WHERE id = ?1", [id.0], |row| row.get(0)).optional()?;
            Err(match from {
                None => LedgerError::NotFound { location: self.location.clone(), id },
                Some(from) => LedgerError::IllegalTransition {
                    location: self.location.clone(),
                    id,
                    from: from.parse().map_err(|e| self.corrupt(e))?,
                    to,
                },
            }
            .into())
        })
    }

    fn mark_resumable(&self, id: AttemptId) -> Result<()> {
        self.write("mark an attempt resumable", |tx| {
            let updated = tx.execute(
                "UPDATE attempts SET resumable = 1, updated_at = ?2 WHERE id = ?1 AND status = 'failed'",
                params![id.0, format_ts(super::now())],
            )?;
            if updated == 1 {
                return Ok(());
            }
            let from: Option<String> =
                tx.query_row("SELECT status FROM attempts WHERE id = ?1", [id.0], |row| row.get(0)).optional()?;
            Err(match from {
                None => LedgerError::NotFound { location: self.location.clone(), id },
                Some(from) => LedgerError::IllegalTransition {
                    location: self.location.clone(),
                    id,
                    from: from.parse().map_err(|e| self.corrupt(e))?,
                    to: Status::Failed,
                },
            }
            .into())
        })
    }

    fn attempt(&self, id: AttemptId) -> Result<Option<Attempt>> {
        self.read("read an attempt", |conn| Ok(self.attempts_where(conn, "id = ?1", &[&id.0])?.pop()))
    }

    fn attempts_for(&self, model: &str, family: &str) -> Result<Vec<Attempt>> {
        self.read("read a pair's attempts", |conn| {
            let family = family_of(conn, family)?;
            self.attempts_where(conn, "model = ?1 AND benchmark_family = ?2", &[&model, &family])
        })
    }

    fn latest_per_pair(&self) -> Result<Vec<PairState>> {
        self.read("read the latest attempt per pair", |conn| {
            let sql = format!("{LATEST_PER_PAIR_SQL} ORDER BY a.model, a.benchmark_family");
            let mut statement = conn.prepare_cached(&sql)?;
            let rows = statement.query_map([], |row| {
                Ok((RawAttempt::from_row(row)?, row.get::<_, i64>(17)?, row.get::<_, i64>(18)?, row.get::<_, i64>(19)?))
            })?;
            let mut pairs = Vec::new();
            for row in rows {
                let (raw, failed, total, resumable) = row?;
                let latest = raw.parse().map_err(|e| self.corrupt(e))?;
                pairs.push(PairState {
                    model: latest.model.clone(),
                    family: latest.benchmark_family.clone(),
                    latest,
                    failed_attempts: u32::try_from(failed).unwrap_or(u32::MAX),
                    total_attempts: u32::try_from(total).unwrap_or(u32::MAX),
                    latest_resumable: resumable == 1,
                });
            }
            Ok(pairs)
        })
    }

    fn active(&self) -> Result<Vec<Attempt>> {
        self.read("read active attempts", |conn| self.attempts_where(conn, "status IN ('pending', 'started')", &[]))
    }

    fn find_by_run_tag(&self, run_tag: &str) -> Result<Vec<Attempt>> {
        self.read("find attempts by run tag", |conn| self.attempts_where(conn, "run_tag = ?1", &[&run_tag]))
    }

    fn import_attempts(&self, rows: &[ImportedAttempt]) -> Result<usize> {
        self.write("import attempts", |tx| {
            let families: std::collections::HashMap<String, String> = tx
                .prepare("SELECT benchmark, family FROM benchmark_families")?
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            let mut max_attempt = tx.prepare_cached(
                "SELECT COALESCE(MAX(attempt), 0) FROM attempts WHERE model = ?1 AND benchmark_family = ?2",
            )?;
            let numbered = number_imports(
                &self.location,
                rows,
                |benchmark| families.get(benchmark).cloned().unwrap_or_else(|| benchmark.to_string()),
                |model, family| {
                    max_attempt.query_row([model, family], |row| row.get(0)).map_err(|e| LedgerError::Backend {
                        location: self.location.clone(),
                        operation: "import attempts",
                        detail: e.to_string(),
                    })
                },
            )?;
            let now = format_ts(super::now());
            let mut insert = tx.prepare_cached(
                "INSERT INTO attempts (model, benchmark, benchmark_family, cluster, username, run_tag, slurm_job_id,
                                       status, reason, config, metrics, attempt, submitted_at, started_at,
                                       ended_at, updated_at, source_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
            )?;
            for (row, (family, attempt)) in rows.iter().zip(&numbered) {
                let inserted = insert.execute(params![
                    row.model,
                    row.benchmark,
                    family,
                    row.cluster,
                    row.username,
                    row.run_tag,
                    row.slurm_job_id,
                    row.status.as_str(),
                    row.reason,
                    row.config.to_string(),
                    json_text(row.metrics.as_ref()),
                    attempt,
                    format_ts(row.submitted_at),
                    row.started_at.map(format_ts),
                    row.ended_at.map(format_ts),
                    now,
                    row.source_id,
                ]);
                if let Err(e) = inserted {
                    if is_unique_violation(&e) {
                        let existing = active_id(tx, &row.model, family)?.ok_or(Failure::Db(e))?;
                        return Err(LedgerError::AlreadyActive {
                            model: row.model.clone(),
                            family: family.clone(),
                            existing_id: AttemptId(existing),
                        }
                        .into());
                    }
                    return Err(e.into());
                }
            }
            Ok(rows.len())
        })
    }

    fn add_model(&self, id: &str, base_model: Option<&str>) -> Result<bool> {
        self.write("add a model", |tx| {
            let added = tx.execute(
                "INSERT INTO models (id, size_class, registered_at, base_model) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (id) DO NOTHING",
                params![id, size_class(id), format_ts(super::now()), base_model],
            )? == 1;
            if !added && base_model.is_some() {
                tx.execute("UPDATE models SET base_model = ?2 WHERE id = ?1", params![id, base_model])?;
            }
            Ok(added)
        })
    }

    fn add_models(&self, models: &[(String, Option<String>)]) -> Result<usize> {
        self.write("add models", |tx| {
            let now = format_ts(super::now());
            let mut insert = tx.prepare_cached(
                "INSERT INTO models (id, size_class, registered_at, base_model) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (id) DO NOTHING",
            )?;
            let mut update =
                tx.prepare_cached("UPDATE models SET base_model = ?2 WHERE id = ?1 AND base_model IS NOT ?2")?;
            let mut added = 0;
            for (id, base) in models {
                if insert.execute(params![id, size_class(id), now, base])? == 1 {
                    added += 1;
                } else if base.is_some() {
                    update.execute(params![id, base])?;
                }
            }
            Ok(added)
        })
    }

    fn list_models(&self) -> Result<Vec<Model>> {
        self.read("list models", |conn| {
            let raws: Vec<(String, Option<String>, String, Option<String>)> = conn
                .prepare("SELECT id, size_class, registered_at, base_model FROM models ORDER BY registered_at, id")?
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))?
                .collect::<rusqlite::Result<_>>()?;
            raws.into_iter()
                .map(|(id, size_class, registered_at, base_model)| {
                    let registered_at = parse_ts(&registered_at).map_err(|e| self.corrupt(e))?;
                    Ok(Model { id, size_class, registered_at, base_model })
                })
                .collect()
        })
    }

    fn unevaluated(&self, family: &str, size_class: Option<&str>) -> Result<Vec<String>> {
        let rows = self.read("list unevaluated models", |conn| {
            let family = family_of(conn, family)?;
            Ok(conn
                .prepare_cached(
                    "SELECT m.id, m.base_model FROM models m
                     WHERE NOT EXISTS (SELECT 1 FROM attempts a
                                       WHERE a.model = m.id AND a.benchmark_family = ?1 AND a.status = 'finished')
                     ORDER BY m.registered_at, m.id",
                )?
                .query_map(params![family], |row| Ok((row.get(0)?, row.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?)
        })?;
        Ok(filter_by_size(rows, size_class))
    }

    fn record_heartbeat(&self, cluster: &str, submitter: &str, stale_after_s: u64) -> Result<()> {
        let bound = i64::try_from(stale_after_s).unwrap_or(i64::MAX);
        self.write("record a heartbeat", |tx| {
            tx.execute(
                "INSERT INTO heartbeats (cluster, submitter, refreshed_at, stale_after_s) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (cluster, submitter) DO UPDATE
                 SET refreshed_at = excluded.refreshed_at, stale_after_s = excluded.stale_after_s",
                params![cluster, submitter, format_ts(super::now()), bound],
            )?;
            Ok(())
        })
    }

    fn heartbeats(&self) -> Result<Vec<Heartbeat>> {
        let now = super::now();
        self.read("read heartbeats", |conn| {
            let rows: Vec<(String, String, String, i64)> = conn
                .prepare_cached(
                    "SELECT cluster, submitter, refreshed_at, stale_after_s FROM heartbeats ORDER BY cluster, submitter",
                )?
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))?
                .collect::<rusqlite::Result<_>>()?;
            rows.into_iter()
                .map(|(cluster, submitter, refreshed, bound)| {
                    let refreshed_at = parse_ts(&refreshed).map_err(|e| self.corrupt(e))?;
                    Ok(Heartbeat {
                        cluster,
                        submitter,
                        refreshed_at,
                        stale_after_s: u64::try_from(bound).unwrap_or(0),
                        age_s: u64::try_from((now - refreshed_at).num_seconds()).unwrap_or(0),
                    })
                })
                .collect()
        })
    }

    fn imported(&self, source: &str) -> Result<Vec<ImportedState>> {
        let prefix = format!("{source}#");
        self.read("read imported attempts", |conn| {
            let rows: Vec<(i64, String, String, bool, Option<String>)> = conn
                .prepare_cached(
                    "SELECT id, source_id, status, metrics IS NOT NULL AND metrics != 'null', slurm_job_id
                     FROM attempts WHERE source_id IS NOT NULL AND substr(source_id, 1, length(?1)) = ?1",
                )?
                .query_map([&prefix], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?)))?
                .collect::<rusqlite::Result<_>>()?;
            rows.into_iter()
                .map(|(id, source_id, status, has_metrics, slurm_job_id)| {
                    Ok(ImportedState {
                        id: AttemptId(id),
                        source_id,
                        status: status.parse().map_err(|e: String| self.corrupt(e))?,
                        has_metrics,
                        slurm_job_id,
                    })
                })
                .collect()
        })
    }

    fn update_imported(&self, updates: &[(AttemptId, ImportedAttempt)]) -> Result<usize> {
        self.write("update imported attempts", |tx| {
            let now = format_ts(super::now());
            let mut update = tx.prepare_cached(
                "UPDATE attempts SET status = ?2, reason = ?3, metrics = ?4, slurm_job_id = ?5, submitted_at = ?6,
                                     started_at = ?7, ended_at = ?8, config = ?9, updated_at = ?10
                 WHERE id = ?1 AND source_id IS NOT NULL",
            )?;
            let mut changed = 0;
            for (id, row) in updates {
                let result = update.execute(params![
                    id.0,
                    row.status.as_str(),
                    row.reason,
                    json_text(row.metrics.as_ref()),
                    row.slurm_job_id,
                    format_ts(row.submitted_at),
                    row.started_at.map(format_ts),
                    row.ended_at.map(format_ts),
                    row.config.to_string(),
                    now,
                ]);
                match result {
                    Ok(n) => changed += n,
                    Err(e) if is_unique_violation(&e) => {
                        let family = family_of(tx, &row.benchmark)?;
                        let existing = active_id(tx, &row.model, &family)?.ok_or(Failure::Db(e))?;
                        return Err(LedgerError::AlreadyActive {
                            model: row.model.clone(),
                            family,
                            existing_id: AttemptId(existing),
                        }
                        .into());
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(changed)
        })
    }

    fn import_watermark(&self, source: &str) -> Result<Option<Timestamp>> {
        self.read("read the import watermark", |conn| {
            let text: Option<Option<String>> = conn
                .query_row("SELECT watermark FROM import_sources WHERE source = ?1", [source], |row| row.get(0))
                .optional()?;
            text.flatten().map(|t| parse_ts(&t).map_err(|e| self.corrupt(e))).transpose()
        })
    }

    fn set_import_watermark(&self, source: &str, watermark: Option<Timestamp>) -> Result<()> {
        self.write("record the import watermark", |tx| {
            tx.execute(
                "INSERT INTO import_sources (source, watermark, imported_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (source) DO UPDATE SET watermark = excluded.watermark, imported_at = excluded.imported_at",
                params![source, watermark.map(format_ts), format_ts(super::now())],
            )?;
            Ok(())
        })
    }
}
