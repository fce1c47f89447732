//! The one implementation of [`Ledger`], written once over a small dialect layer ([`Backend`]) that
//! each driver implements: SQLite (`sqlite.rs`) and PostgreSQL (`postgres.rs`).
//!
//! What the layer hides, and nothing more:
//! - **placeholders**: statements here are written with `$1`, `$2`, …; SQLite's side rewrites them
//!   to `?1`, `?2` (SQLite would read `$1` as a *named* parameter, numbered by first use);
//! - **clock**: `now()` in a statement is the ledger's clock, fixed for one call — PostgreSQL's
//!   transaction time (one clock for every cluster sharing the ledger); on SQLite a `now()` SQL
//!   function the backend registers, set once per call from this machine's clock;
//! - **types**: parameters are [`Arg`]s (PostgreSQL's side sends them typed, SQLite's as text for
//!   JSON and timestamps) and rows come back as [`Cell`]s that read either representation;
//! - **locking**: SQLite's writes are `BEGIN IMMEDIATE` (the whole file is locked before anything is
//!   read); PostgreSQL locks the attempts table where a check must stay true until commit
//!   ([`Backend::lock_attempts`]);
//! - **byte order** of text in `ORDER BY` ([`Backend::BYTE_ORDER`]).
//!
//! The retry of `insert_pending` (the pair's active attempt ended between the refused insert and
//! the look-up of its id) is here, so both backends have it. Two methods are the backends' own
//! where PostgreSQL does a bulk operation in one round trip ([`Backend::import_attempts`],
//! [`Backend::add_models`]); the portable versions here are SQLite's.

use std::collections::HashMap;

use serde_json::Value;

use super::migrations::{self, Migration};
use crate::stats::Trial;

use super::{
    ATTEMPT_COLUMNS, Attempt, AttemptId, AttemptStatus, GpuSecondsRow, Heartbeat, ImportedAttempt, ImportedState,
    LATEST_PER_PAIR_SQL, Ledger, LedgerError, Model, NewAttempt, NewRemediation, PairState, Remediation, Result,
    Timestamp, TrialSet, filter_by_size, number_imports, size_class, sql_status_list,
};
use crate::domain::{SUBMISSION_TAG_KEY, VANISHED};

/// One statement parameter.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Text(&'a str),
    OptText(Option<&'a str>),
    Int(i64),
    /// An integer or SQL NULL.
    OptInt(Option<i64>),
    Float(f64),
    Bool(bool),
    /// A JSON document; None is SQL NULL.
    Json(Option<&'a Value>),
    Ts(Option<Timestamp>),
}

/// One column value as a driver returned it. SQLite keeps JSON and timestamps as text; the readers
/// below accept both forms.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    Float(f64),
    Bool(bool),
    Text(String),
    Json(Value),
    Ts(Timestamp),
}

/// One result row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row(pub Vec<Cell>);

/// A driver error, already made safe to print (no password) by the backend.
#[derive(Debug)]
pub struct DbError {
    pub detail: String,
    /// The unique index `attempts_one_active` refused a row: the pair already has an active attempt.
    pub(crate) active_clash: bool,
}

/// What a step inside a call can fail with: a driver error (given its location and operation once,
/// at the boundary) or a ledger error as it is.
#[derive(Debug)]
pub enum Failure {
    Db(DbError),
    Ledger(LedgerError),
}

impl From<LedgerError> for Failure {
    fn from(error: LedgerError) -> Self {
        Failure::Ledger(error)
    }
}

pub(super) type Step<T> = std::result::Result<T, Failure>;

/// A connection or a transaction, as the statements here see it.
pub trait Db {
    fn query(&mut self, sql: &str, args: &[Arg<'_>]) -> Step<Vec<Row>>;
    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Step<u64>;
    /// Several statements, no parameters (migrations).
    fn batch(&mut self, sql: &str) -> Step<()>;
}

/// The dialect layer: connection handling, transactions, the clock and what only one backend does.
pub trait Backend: Send + Sync {
    /// Appended to a text column in `ORDER BY` for byte order (SQLite's default collation is).
    const BYTE_ORDER: &'static str;
    /// Run before reading `schema_migrations`: creates it, and on PostgreSQL serialises openers.
    const MIGRATIONS_PREAMBLE: &'static str;

    /// Where the ledger lives, safe to print.
    fn location(&self) -> &str;
    /// The migration's SQL in this dialect.
    fn migration_sql(migration: &Migration) -> &'static str;
    /// `body` on the connection, outside a transaction (`now()` fixed for the call).
    fn read<T>(&self, body: impl FnOnce(&mut dyn Db) -> Step<T>) -> Step<T>;
    /// `body` in one transaction, committed when it returns `Ok`.
    fn write<T>(&self, body: impl FnOnce(&mut dyn Db) -> Step<T>) -> Step<T>;
    /// Inside [`Backend::write`]: keeps other writers from inserting attempts until commit, so a check
    /// of the one-active rule stays true. SQLite's immediate transactions already hold the file's
    /// write lock.
    fn lock_attempts(&self, db: &mut dyn Db) -> Step<()>;

    /// [`Ledger::import_attempts`]; the portable version does a statement per row.
    fn import_attempts(&self, rows: &[ImportedAttempt]) -> Result<usize> {
        portable_import(self, rows)
    }

    /// [`Ledger::add_models`]; the portable version does a statement per model.
    fn add_models(&self, models: &[(String, Option<String>)]) -> Result<usize> {
        portable_add_models(self, models)
    }
}

/// A ledger over one backend.
pub struct SqlLedger<B> {
    pub(crate) backend: B,
}

impl<B: Backend> std::fmt::Debug for SqlLedger<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ledger({})", self.backend.location())
    }
}

/// A driver error as the ledger reports it.
pub(crate) fn fail(location: &str, operation: &'static str, failure: Failure) -> LedgerError {
    match failure {
        Failure::Ledger(error) => error,
        Failure::Db(error) => LedgerError::Backend { location: location.to_string(), operation, detail: error.detail },
    }
}

pub(crate) fn read<B: Backend, T>(
    backend: &B,
    operation: &'static str,
    body: impl FnOnce(&mut dyn Db) -> Step<T>,
) -> Result<T> {
    backend.read(body).map_err(|failure| fail(backend.location(), operation, failure))
}

pub(crate) fn write<B: Backend, T>(
    backend: &B,
    operation: &'static str,
    body: impl FnOnce(&mut dyn Db) -> Step<T>,
) -> Result<T> {
    backend.write(body).map_err(|failure| fail(backend.location(), operation, failure))
}

/// Applies pending migrations, under the backend's write lock (a second opener waits, then finds
/// nothing left to do).
pub(crate) fn migrate<B: Backend>(backend: &B) -> Result<()> {
    let location = backend.location().to_string();
    write(backend, "apply migrations", |db| {
        db.batch(B::MIGRATIONS_PREAMBLE)?;
        let applied = db
            .query("SELECT version, name FROM schema_migrations ORDER BY version", &[])?
            .iter()
            .map(|row| {
                Ok((row.int(0).map_err(|e| corrupt(&location, e))?, row.text(1).map_err(|e| corrupt(&location, e))?))
            })
            .collect::<Step<Vec<(i64, String)>>>()?;
        for migration in migrations::pending(&location, &applied)? {
            let applied = db.batch(B::migration_sql(migration)).and_then(|()| {
                db.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, now())",
                    &[Arg::Int(migration.version), Arg::Text(migration.name)],
                )
            });
            if let Err(Failure::Db(error)) = applied {
                return Err(LedgerError::Migration {
                    location: location.clone(),
                    version: migration.version,
                    detail: migration_detail(&error.detail),
                }
                .into());
            }
            applied?;
        }
        Ok(())
    })
}

/// A failed migration's driver message as one line: SQLite quotes the whole script after ` in `,
/// which is the submitter's own SQL, not news to the operator. A table that already exists means
/// the file or schema is another program's.
fn migration_detail(detail: &str) -> String {
    let first = detail.split(" in ").next().unwrap_or(detail);
    let first = first.lines().next().unwrap_or(first).trim();
    if first.contains("already exists") {
        format!(
            "{first}: this database holds another program's tables (not a submitter ledger): point --ledger \
             at the submitter's own file or database"
        )
    } else {
        first.to_string()
    }
}

fn corrupt(location: &str, detail: String) -> Failure {
    Failure::Ledger(LedgerError::Corrupt { location: location.to_string(), detail })
}

// ------------------------------------------------------------------------------------ cells

impl Row {
    fn cell(&self, i: usize) -> std::result::Result<&Cell, String> {
        self.0.get(i).ok_or_else(|| format!("column {i} missing"))
    }

    fn opt<T>(
        &self,
        i: usize,
        read: impl FnOnce(&Cell) -> Option<T>,
        what: &str,
    ) -> std::result::Result<Option<T>, String> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            cell => read(cell).map(Some).ok_or_else(|| format!("column {i}: expected {what}, found {cell:?}")),
        }
    }

    pub(crate) fn opt_text(&self, i: usize) -> std::result::Result<Option<String>, String> {
        self.opt(i, |c| if let Cell::Text(s) = c { Some(s.clone()) } else { None }, "text")
    }

    pub(crate) fn text(&self, i: usize) -> std::result::Result<String, String> {
        self.opt_text(i)?.ok_or_else(|| format!("column {i}: unexpected NULL"))
    }

    pub(crate) fn int(&self, i: usize) -> std::result::Result<i64, String> {
        self.opt(i, |c| if let Cell::Int(n) = c { Some(*n) } else { None }, "an integer")?
            .ok_or_else(|| format!("column {i}: unexpected NULL"))
    }

    pub(crate) fn float(&self, i: usize) -> std::result::Result<f64, String> {
        self.opt(
            i,
            |c| match c {
                Cell::Float(x) => Some(*x),
                Cell::Int(n) => Some(*n as f64),
                _ => None,
            },
            "a number",
        )?
        .ok_or_else(|| format!("column {i}: unexpected NULL"))
    }

    pub(crate) fn boolean(&self, i: usize) -> std::result::Result<bool, String> {
        let value = self.opt(
            i,
            |c| match c {
                Cell::Bool(b) => Some(*b),
                Cell::Int(n) => Some(*n != 0),
                _ => None,
            },
            "a boolean",
        )?;
        Ok(value.unwrap_or(false))
    }

    pub(crate) fn opt_json(&self, i: usize) -> std::result::Result<Option<Value>, String> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            Cell::Json(value) => Ok(Some(value.clone())),
            Cell::Text(text) => serde_json::from_str(text).map(Some).map_err(|e| format!("JSON {text:?}: {e}")),
            other => Err(format!("column {i}: expected JSON, found {other:?}")),
        }
    }

    pub(crate) fn json(&self, i: usize) -> std::result::Result<Value, String> {
        self.opt_json(i)?.ok_or_else(|| format!("column {i}: unexpected NULL"))
    }

    pub(crate) fn opt_ts(&self, i: usize) -> std::result::Result<Option<Timestamp>, String> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            Cell::Ts(ts) => Ok(Some(*ts)),
            Cell::Text(text) => chrono::DateTime::parse_from_rfc3339(text)
                .map(|t| Some(t.to_utc()))
                .map_err(|e| format!("timestamp {text:?}: {e}")),
            other => Err(format!("column {i}: expected a timestamp, found {other:?}")),
        }
    }

    pub(crate) fn ts(&self, i: usize) -> std::result::Result<Timestamp, String> {
        self.opt_ts(i)?.ok_or_else(|| format!("column {i}: unexpected NULL"))
    }

    /// An attempt from the first 19 columns ([`ATTEMPT_COLUMNS`] order).
    fn attempt(&self) -> std::result::Result<Attempt, String> {
        let attempt = self.int(12)?;
        Ok(Attempt {
            id: AttemptId(self.int(0)?),
            model: self.text(1)?,
            benchmark: self.text(2)?,
            benchmark_family: self.text(3)?,
            cluster: self.text(4)?,
            username: self.text(5)?,
            run_tag: self.text(6)?,
            slurm_job_id: self.opt_text(7)?,
            status: self.text(8)?.parse()?,
            reason: self.text(9)?,
            config: self.json(10)?,
            metrics: self.opt_json(11)?,
            attempt: u32::try_from(attempt).map_err(|_| format!("attempt number {attempt}"))?,
            submitted_at: self.ts(13)?,
            started_at: self.opt_ts(14)?,
            ended_at: self.opt_ts(15)?,
            updated_at: self.ts(16)?,
            agent: self.text(17)?,
            source_id: self.opt_text(18)?,
        })
    }
}

/// SQL NULL for an absent or JSON-null value: "no metrics" is one state, not two.
fn metrics_arg(value: Option<&Value>) -> Arg<'_> {
    Arg::Json(value.filter(|v| !v.is_null()))
}

fn count(n: i64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

// ------------------------------------------------------------------------------------ statements

/// The family a benchmark counts toward, as an SQL expression over `$1`.
const FAMILY_SQL: &str = "COALESCE((SELECT family FROM benchmark_families WHERE benchmark = $1), $1)";

const ACTIVE_ID_SQL: &str = "SELECT id FROM attempts WHERE model = $1 AND benchmark_family = $2 AND agent = $3 \
     AND status IN ('pending', 'started')";

impl<B: Backend> SqlLedger<B> {
    fn location_string(&self) -> String {
        self.backend.location().to_string()
    }

    /// Runs `sql`, an UPDATE of attempt `id` that changes one row when it is allowed. When it
    /// changed none, the attempt is missing, or `column` of it (read back) says why: `refused`.
    fn update_attempt(
        &self,
        db: &mut dyn Db,
        id: AttemptId,
        sql: &str,
        args: &[Arg<'_>],
        column: &str,
        refused: impl FnOnce(&Row) -> std::result::Result<LedgerError, String>,
    ) -> Step<()> {
        if db.execute(sql, args)? == 1 {
            return Ok(());
        }
        let rows = db.query(&format!("SELECT {column} FROM attempts WHERE id = $1"), &[Arg::Int(id.0)])?;
        Err(match rows.first() {
            None => LedgerError::NotFound { location: self.location_string(), id },
            Some(row) => refused(row).map_err(|e| self.corrupt(e))?,
        }
        .into())
    }

    /// The error for a transition the attempt's current status (`row`'s first column) does not allow.
    fn illegal_transition(
        &self,
        id: AttemptId,
        row: &Row,
        to: AttemptStatus,
    ) -> std::result::Result<LedgerError, String> {
        let from = row.text(0).and_then(|s| s.parse())?;
        Ok(LedgerError::IllegalTransition { location: self.location_string(), id, from, to })
    }

    fn corrupt(&self, detail: String) -> Failure {
        corrupt(self.backend.location(), detail)
    }

    fn family_of_in(&self, db: &mut dyn Db, benchmark: &str) -> Step<String> {
        let rows = db.query(&format!("SELECT {FAMILY_SQL}"), &[Arg::Text(benchmark)])?;
        rows.first().map(|row| row.text(0)).unwrap_or_else(|| Err("no family row".into())).map_err(|e| self.corrupt(e))
    }

    fn attempts_where(&self, db: &mut dyn Db, condition: &str, args: &[Arg<'_>]) -> Step<Vec<Attempt>> {
        let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE {condition} ORDER BY submitted_at, id");
        db.query(&sql, args)?.iter().map(|row| row.attempt().map_err(|e| self.corrupt(e))).collect()
    }
}

/// Inserts one imported attempt (both the portable import and nothing else; PostgreSQL copies).
fn insert_imported(db: &mut dyn Db, row: &ImportedAttempt, family: &str, attempt: u32) -> Step<u64> {
    db.execute(
        "INSERT INTO attempts (model, benchmark, benchmark_family, cluster, username, run_tag, slurm_job_id,
                               status, reason, config, metrics, attempt, submitted_at, started_at,
                               ended_at, updated_at, source_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, now(), $16)",
        &[
            Arg::Text(&row.model),
            Arg::Text(&row.benchmark),
            Arg::Text(family),
            Arg::Text(&row.cluster),
            Arg::Text(&row.username),
            Arg::Text(&row.run_tag),
            Arg::OptText(row.slurm_job_id.as_deref()),
            Arg::Text(row.status.as_str()),
            Arg::Text(&row.reason),
            Arg::Json(Some(&row.config)),
            metrics_arg(row.metrics.as_ref()),
            Arg::Int(i64::from(attempt)),
            Arg::Ts(Some(row.submitted_at)),
            Arg::Ts(row.started_at),
            Arg::Ts(row.ended_at),
            Arg::OptText(row.source_id.as_deref()),
        ],
    )
}

/// The import as a statement per pair and per row, in one transaction.
fn portable_import<B: Backend + ?Sized>(backend: &B, rows: &[ImportedAttempt]) -> Result<usize> {
    let location = backend.location().to_string();
    let mut clashed = None;
    let result = backend.write(|db| {
        backend.lock_attempts(db)?;
        let families: HashMap<String, String> = db
            .query("SELECT benchmark, family FROM benchmark_families", &[])?
            .iter()
            .map(|row| Ok((row.text(0)?, row.text(1)?)))
            .collect::<std::result::Result<_, String>>()
            .map_err(|e| corrupt(&location, e))?;
        let mut max_attempt = |model: &str, family: &str| -> Result<u32> {
            let rows = db
                .query(
                    "SELECT COALESCE(MAX(attempt), 0) FROM attempts WHERE model = $1 AND benchmark_family = $2",
                    &[Arg::Text(model), Arg::Text(family)],
                )
                .map_err(|failure| fail(&location, "import attempts", failure))?;
            let max = rows
                .first()
                .map(|row| row.int(0))
                .transpose()
                .map_err(|detail| LedgerError::Corrupt { location: location.clone(), detail })?;
            Ok(count(max.unwrap_or(0)))
        };
        let numbered = number_imports(
            &location,
            rows,
            |benchmark| families.get(benchmark).cloned().unwrap_or_else(|| benchmark.to_string()),
            &mut max_attempt,
        )?;
        for (index, (row, (family, attempt))) in rows.iter().zip(&numbered).enumerate() {
            clashed = Some(index);
            insert_imported(db, row, family, *attempt)?;
        }
        Ok(rows.len())
    });
    match result {
        Ok(imported) => Ok(imported),
        // The transaction rolled back; name the attempt that holds the pair.
        Err(Failure::Db(error)) if error.active_clash => {
            let row = &rows[clashed.unwrap_or_default()];
            Err(clash_error(backend, &row.model, &row.benchmark))
        }
        Err(failure) => Err(fail(&location, "import attempts", failure)),
    }
}

/// After a write the one-active index refused (its transaction rolled back): the attempt that
/// holds the pair now, if any.
fn holder<B: Backend + ?Sized>(backend: &B, model: &str, benchmark: &str, agent: &str) -> Result<Option<LedgerError>> {
    let location = backend.location().to_string();
    let found = backend.read(|db| {
        let rows = db.query(&format!("SELECT {FAMILY_SQL}"), &[Arg::Text(benchmark)])?;
        let family = rows.first().map(|r| r.text(0)).transpose().map_err(|e| corrupt(&location, e))?;
        let family = family.unwrap_or_else(|| benchmark.to_string());
        let rows = db.query(ACTIVE_ID_SQL, &[Arg::Text(model), Arg::Text(&family), Arg::Text(agent)])?;
        let id = rows.first().map(|row| row.int(0)).transpose().map_err(|e| corrupt(&location, e))?;
        Ok((family, id))
    });
    match found.map_err(|failure| fail(&location, "look up a pair's active attempt", failure))? {
        (family, Some(id)) => {
            Ok(Some(LedgerError::AlreadyActive { model: model.to_string(), family, existing_id: AttemptId(id) }))
        }
        (_, None) => Ok(None),
    }
}

/// The error for an import or update the one-active index refused.
fn clash_error<B: Backend + ?Sized>(backend: &B, model: &str, benchmark: &str) -> LedgerError {
    // Imports carry no agent: their rows are the default agent's.
    match holder(backend, model, benchmark, super::DEFAULT_AGENT) {
        Ok(Some(error)) | Err(error) => error,
        Ok(None) => LedgerError::InvalidImport {
            location: backend.location().to_string(),
            detail: format!("{model} on {benchmark} would have two active attempts"),
        },
    }
}

fn add_model_in(db: &mut dyn Db, id: &str, base_model: Option<&str>) -> Step<bool> {
    let size = size_class(id);
    let added = db.execute(
        "INSERT INTO models (id, size_class, registered_at, base_model) VALUES ($1, $2, now(), $3)
         ON CONFLICT (id) DO NOTHING",
        &[Arg::Text(id), Arg::OptText(size.as_deref()), Arg::OptText(base_model)],
    )? == 1;
    if !added && base_model.is_some() {
        db.execute("UPDATE models SET base_model = $2 WHERE id = $1", &[Arg::Text(id), Arg::OptText(base_model)])?;
    }
    Ok(added)
}

fn portable_add_models<B: Backend + ?Sized>(backend: &B, models: &[(String, Option<String>)]) -> Result<usize> {
    backend
        .write(|db| {
            let mut added = 0;
            for (id, base) in models {
                added += usize::from(add_model_in(db, id, base.as_deref())?);
            }
            Ok(added)
        })
        .map_err(|failure| fail(backend.location(), "add models", failure))
}

impl<B: Backend> Ledger for SqlLedger<B> {
    fn location(&self) -> &str {
        self.backend.location()
    }

    fn ping(&self) -> Result<()> {
        read(&self.backend, "ping", |db| db.query("SELECT 1", &[]).map(drop))
    }

    fn schema_version(&self) -> Result<i64> {
        read(&self.backend, "read the schema version", |db| {
            let rows = db.query("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", &[])?;
            rows.first().map_or(Ok(0), |row| row.int(0)).map_err(|e| self.corrupt(e))
        })
    }

    fn family_of(&self, benchmark: &str) -> Result<String> {
        read(&self.backend, "look up a benchmark family", |db| self.family_of_in(db, benchmark))
    }

    fn set_family(&self, benchmark: &str, family: &str) -> Result<()> {
        write(&self.backend, "set a benchmark family", |db| {
            // A rare admin change; the lock keeps the clash check below true until commit.
            self.backend.lock_attempts(db)?;
            let args = [Arg::Text(benchmark), Arg::Text(family)];
            // Moving the benchmark's attempts must not merge two active attempts into one pair.
            let clash = db.query(
                "SELECT moving.model, staying.id
                 FROM attempts moving
                 JOIN attempts staying
                   ON staying.model = moving.model AND staying.benchmark_family = $2
                  AND staying.status IN ('pending', 'started') AND staying.benchmark <> $1
                 WHERE moving.benchmark = $1 AND moving.benchmark_family <> $2
                   AND moving.status IN ('pending', 'started')
                 LIMIT 1",
                &args,
            )?;
            if let Some(row) = clash.first() {
                return Err(LedgerError::AlreadyActive {
                    model: row.text(0).map_err(|e| self.corrupt(e))?,
                    family: family.to_string(),
                    existing_id: AttemptId(row.int(1).map_err(|e| self.corrupt(e))?),
                }
                .into());
            }
            db.execute(
                "INSERT INTO benchmark_families (benchmark, family) VALUES ($1, $2)
                 ON CONFLICT (benchmark) DO UPDATE SET family = excluded.family",
                &args,
            )?;
            db.execute(
                "UPDATE attempts SET benchmark_family = $2, updated_at = now()
                 WHERE benchmark = $1 AND benchmark_family <> $2",
                &args,
            )?;
            Ok(())
        })
    }

    fn families(&self) -> Result<Vec<(String, String)>> {
        read(&self.backend, "list benchmark families", |db| {
            db.query("SELECT benchmark, family FROM benchmark_families ORDER BY benchmark", &[])?
                .iter()
                .map(|row| Ok((row.text(0)?, row.text(1)?)))
                .collect::<std::result::Result<_, String>>()
                .map_err(|e| self.corrupt(e))
        })
    }

    fn insert_pending(&self, new: &NewAttempt) -> Result<AttemptId> {
        let sql = format!(
            "INSERT INTO attempts (model, benchmark, benchmark_family, cluster, username, run_tag, status, reason,
                                   config, attempt, submitted_at, updated_at, agent)
             SELECT $2, $1, f.family, $3, $4, $5, 'pending', $6, $7,
                    (SELECT COALESCE(MAX(attempt), 0) + 1 FROM attempts
                     WHERE model = $2 AND benchmark_family = f.family AND agent = $8),
                    now(), now(), $8
             FROM (SELECT {FAMILY_SQL} AS family) f
             RETURNING id"
        );
        const OPERATION: &str = "insert a pending attempt";
        // A refusal whose active row is gone by the time we look (it just ended) is retried.
        for _ in 0..3 {
            let inserted = self.backend.write(|db| {
                let rows = db.query(
                    &sql,
                    &[
                        Arg::Text(&new.benchmark),
                        Arg::Text(&new.model),
                        Arg::Text(&new.cluster),
                        Arg::Text(&new.username),
                        Arg::Text(&new.run_tag),
                        Arg::Text(&new.reason),
                        Arg::Json(Some(&new.config)),
                        Arg::Text(&new.agent),
                    ],
                )?;
                let id = rows.first().map(|row| row.int(0)).transpose().map_err(|e| self.corrupt(e))?;
                id.map(AttemptId).ok_or_else(|| self.corrupt("INSERT … RETURNING gave no row".into()))
            });
            match inserted {
                Ok(id) => return Ok(id),
                // The partial unique index said no (the transaction rolled back): who holds the pair?
                Err(Failure::Db(error)) if error.active_clash => {
                    if let Some(holder) = holder(&self.backend, &new.model, &new.benchmark, &new.agent)? {
                        return Err(holder);
                    }
                }
                Err(failure) => return Err(fail(self.backend.location(), OPERATION, failure)),
            }
        }
        Err(LedgerError::Backend {
            location: self.location_string(),
            operation: OPERATION,
            detail: "the pair's active attempt kept changing; try again".into(),
        })
    }

    fn set_job_id(&self, id: AttemptId, slurm_job_id: &str) -> Result<()> {
        write(&self.backend, "set a Slurm job id", |db| {
            // One job per attempt and one submission per job of a cluster: a job id Slurm hands
            // out twice (a controller whose state was reset) must not bind two submissions to one
            // job. The legs of one shared job carry one submission tag and share its id.
            self.backend.lock_attempts(db)?;
            let rows = db.query(
                "SELECT other.id, other.config, this.config FROM attempts other JOIN attempts this ON this.id = $1
                 WHERE other.cluster = this.cluster AND other.slurm_job_id = $2 AND other.id != $1
                 ORDER BY other.id",
                &[Arg::Int(id.0), Arg::Text(slurm_job_id)],
            )?;
            let tag = |config: Value| config.get(SUBMISSION_TAG_KEY).and_then(Value::as_str).map(str::to_string);
            for row in &rows {
                let (holder, other, this) =
                    (|| Ok::<_, String>((row.int(0)?, row.json(1)?, row.json(2)?)))().map_err(|e| self.corrupt(e))?;
                let this = tag(this);
                if this.is_none() || tag(other) != this {
                    return Err(LedgerError::JobIdTaken {
                        location: self.location_string(),
                        id,
                        job: slurm_job_id.to_string(),
                        holder: AttemptId(holder),
                    }
                    .into());
                }
            }
            let sql = "UPDATE attempts SET slurm_job_id = $2, updated_at = now()
                 WHERE id = $1 AND (slurm_job_id IS NULL OR slurm_job_id = $2)";
            self.update_attempt(db, id, sql, &[Arg::Int(id.0), Arg::Text(slurm_job_id)], "slurm_job_id", |row| {
                Ok(LedgerError::JobIdConflict {
                    location: self.location_string(),
                    id,
                    existing: row.opt_text(0)?.unwrap_or_default(),
                    requested: slurm_job_id.to_string(),
                })
            })
        })
    }

    fn transition(&self, id: AttemptId, to: AttemptStatus, reason: &str, metrics: Option<&Value>) -> Result<()> {
        let sql = format!(
            "UPDATE attempts SET
                 status = $2,
                 reason = $3,
                 metrics = CASE WHEN $4 THEN $5 ELSE metrics END,
                 started_at = CASE WHEN $2 = 'started' THEN COALESCE(started_at, now()) ELSE started_at END,
                 ended_at = CASE WHEN $2 IN ('finished', 'failed', 'cancelled') THEN COALESCE(ended_at, now())
                                 ELSE ended_at END,
                 updated_at = now()
             WHERE id = $1 AND status IN {}",
            sql_status_list(&AttemptStatus::sources_of(to))
        );
        write(&self.backend, "change an attempt's status", |db| {
            let args = [
                Arg::Int(id.0),
                Arg::Text(to.as_str()),
                Arg::Text(reason),
                Arg::Bool(metrics.is_some()),
                metrics_arg(metrics),
            ];
            self.update_attempt(db, id, &sql, &args, "status", |row| self.illegal_transition(id, row, to))
        })
    }

    fn mark_resumable(&self, id: AttemptId) -> Result<()> {
        write(&self.backend, "mark an attempt resumable", |db| {
            let sql = "UPDATE attempts SET resumable = 1, updated_at = now() WHERE id = $1 AND status = 'failed'";
            self.update_attempt(db, id, sql, &[Arg::Int(id.0)], "status", |row| {
                self.illegal_transition(id, row, AttemptStatus::Failed)
            })
        })
    }

    fn record_gpu_seconds(&self, id: AttemptId, record: &Value) -> Result<()> {
        write(&self.backend, "record an attempt's GPU-seconds", |db| {
            let sql = "UPDATE attempts SET gpu_seconds = $2, updated_at = now() WHERE id = $1";
            // An UPDATE by id changes its row whenever the row exists: only a missing one is refused.
            self.update_attempt(db, id, sql, &[Arg::Int(id.0), metrics_arg(Some(record))], "id", |_| {
                Err(format!("attempt {} exists but its GPU-seconds were not written", id.0))
            })
        })
    }

    fn gpu_seconds(&self) -> Result<Vec<GpuSecondsRow>> {
        read(&self.backend, "read GPU-seconds records", |db| {
            let sql = "SELECT id, model, benchmark, run_tag, status, gpu_seconds FROM attempts \
                       WHERE gpu_seconds IS NOT NULL ORDER BY id";
            db.query(sql, &[])?
                .iter()
                .map(|row| {
                    Ok(GpuSecondsRow {
                        id: AttemptId(row.int(0)?),
                        model: row.text(1)?,
                        benchmark: row.text(2)?,
                        run_tag: row.text(3)?,
                        status: row.text(4)?.parse()?,
                        record: row.json(5)?,
                    })
                })
                .collect::<std::result::Result<_, String>>()
                .map_err(|e| self.corrupt(e))
        })
    }

    fn record_trials(&self, id: AttemptId, set: &TrialSet) -> Result<()> {
        write(&self.backend, "record an attempt's trials", |db| {
            // Replaces an earlier record whole: a re-sync never leaves trials of two readings.
            db.execute("DELETE FROM trials WHERE attempt_id = $1", &[Arg::Int(id.0)])?;
            db.execute("DELETE FROM trial_sets WHERE attempt_id = $1", &[Arg::Int(id.0)])?;
            let written = db.execute(
                "INSERT INTO trial_sets (attempt_id, harbor_version, recorded_at)
                 SELECT id, $2, now() FROM attempts WHERE id = $1",
                &[Arg::Int(id.0), Arg::OptText(set.harbor_version.as_deref())],
            )?;
            if written == 0 {
                return Err(Failure::Ledger(LedgerError::NotFound { location: self.location_string(), id }));
            }
            for trial in &set.trials {
                db.execute(
                    "INSERT INTO trials (attempt_id, task, attempt, reward, valid) VALUES ($1, $2, $3, $4, $5)",
                    &[
                        Arg::Int(id.0),
                        Arg::Text(&trial.task),
                        Arg::Int(i64::from(trial.attempt)),
                        Arg::Float(trial.reward),
                        Arg::Bool(trial.valid),
                    ],
                )?;
            }
            Ok(())
        })
    }

    fn trials(&self, id: AttemptId) -> Result<Option<TrialSet>> {
        read(&self.backend, "read an attempt's trials", |db| {
            let sets = db.query("SELECT harbor_version FROM trial_sets WHERE attempt_id = $1", &[Arg::Int(id.0)])?;
            let Some(set) = sets.first() else { return Ok(None) };
            let harbor_version = set.opt_text(0).map_err(|e| self.corrupt(e))?;
            let order = B::BYTE_ORDER;
            let sql = format!(
                "SELECT task, attempt, reward, valid FROM trials WHERE attempt_id = $1 ORDER BY task{order}, attempt"
            );
            let trials = db
                .query(&sql, &[Arg::Int(id.0)])?
                .iter()
                .map(|row| {
                    Ok(Trial {
                        task: row.text(0)?,
                        attempt: u32::try_from(row.int(1)?).map_err(|e| e.to_string())?,
                        reward: row.float(2)?,
                        valid: row.boolean(3)?,
                    })
                })
                .collect::<std::result::Result<_, String>>()
                .map_err(|e| self.corrupt(e))?;
            Ok(Some(TrialSet { harbor_version, trials }))
        })
    }

    fn attempt(&self, id: AttemptId) -> Result<Option<Attempt>> {
        read(&self.backend, "read an attempt", |db| Ok(self.attempts_where(db, "id = $1", &[Arg::Int(id.0)])?.pop()))
    }

    fn attempts_for(&self, model: &str, family: &str) -> Result<Vec<Attempt>> {
        read(&self.backend, "read a pair's attempts", |db| {
            let condition = format!("model = $2 AND benchmark_family = {FAMILY_SQL}");
            self.attempts_where(db, &condition, &[Arg::Text(family), Arg::Text(model)])
        })
    }

    fn latest_per_pair(&self) -> Result<Vec<PairState>> {
        read(&self.backend, "read the latest attempt per pair", |db| {
            let order = B::BYTE_ORDER;
            let sql =
                format!("{LATEST_PER_PAIR_SQL} ORDER BY a.model{order}, a.benchmark_family{order}, a.agent{order}");
            db.query(&sql, &[])?
                .iter()
                .map(|row| {
                    let latest = row.attempt()?;
                    Ok(PairState {
                        model: latest.model.clone(),
                        family: latest.benchmark_family.clone(),
                        agent: latest.agent.clone(),
                        failed_attempts: count(row.int(19)?),
                        total_attempts: count(row.int(20)?),
                        latest_resumable: row.int(21)? == 1,
                        latest,
                    })
                })
                .collect::<std::result::Result<_, String>>()
                .map_err(|e| self.corrupt(e))
        })
    }

    fn active(&self) -> Result<Vec<Attempt>> {
        read(&self.backend, "read active attempts", |db| {
            self.attempts_where(db, "status IN ('pending', 'started')", &[])
        })
    }

    fn vanished(&self, cluster: &str, since: Timestamp) -> Result<Vec<Attempt>> {
        read(&self.backend, "read vanished attempts", |db| {
            self.attempts_where(
                db,
                &format!("cluster = $1 AND status = 'failed' AND reason LIKE '{VANISHED}%' AND ended_at >= $2"),
                &[Arg::Text(cluster), Arg::Ts(Some(since))],
            )
        })
    }

    fn finish_vanished(&self, id: AttemptId, reason: &str, metrics: Option<&Value>) -> Result<()> {
        let sql = format!(
            "UPDATE attempts SET status = 'finished', reason = $2, metrics = $3, updated_at = now()
             WHERE id = $1 AND status = 'failed' AND reason LIKE '{VANISHED}%'"
        );
        write(&self.backend, "fold in a vanished attempt's late final record", |db| {
            let args = [Arg::Int(id.0), Arg::Text(reason), metrics_arg(metrics)];
            self.update_attempt(db, id, &sql, &args, "status", |row| {
                self.illegal_transition(id, row, AttemptStatus::Finished)
            })
        })
    }

    fn find_by_run_tag(&self, run_tag: &str) -> Result<Vec<Attempt>> {
        read(&self.backend, "find attempts by run tag", |db| {
            self.attempts_where(db, "run_tag = $1", &[Arg::Text(run_tag)])
        })
    }

    fn import_attempts(&self, rows: &[ImportedAttempt]) -> Result<usize> {
        self.backend.import_attempts(rows)
    }

    fn add_model(&self, id: &str, base_model: Option<&str>) -> Result<bool> {
        write(&self.backend, "add a model", |db| add_model_in(db, id, base_model))
    }

    fn add_models(&self, models: &[(String, Option<String>)]) -> Result<usize> {
        self.backend.add_models(models)
    }

    fn list_models(&self) -> Result<Vec<Model>> {
        read(&self.backend, "list models", |db| {
            db.query("SELECT id, size_class, registered_at, base_model FROM models ORDER BY registered_at, id", &[])?
                .iter()
                .map(|row| {
                    Ok(Model {
                        id: row.text(0)?,
                        size_class: row.opt_text(1)?,
                        registered_at: row.ts(2)?,
                        base_model: row.opt_text(3)?,
                    })
                })
                .collect::<std::result::Result<_, String>>()
                .map_err(|e| self.corrupt(e))
        })
    }

    fn unevaluated(&self, family: &str, size_class: Option<&str>) -> Result<Vec<String>> {
        let rows = read(&self.backend, "list unevaluated models", |db| {
            let sql = format!(
                "SELECT m.id, m.base_model FROM models m
                 WHERE NOT EXISTS (SELECT 1 FROM attempts a
                                   WHERE a.model = m.id AND a.benchmark_family = {FAMILY_SQL}
                                     AND a.status = 'finished')
                 ORDER BY m.registered_at, m.id"
            );
            db.query(&sql, &[Arg::Text(family)])?
                .iter()
                .map(|row| Ok((row.text(0)?, row.opt_text(1)?)))
                .collect::<std::result::Result<Vec<_>, String>>()
                .map_err(|e| self.corrupt(e))
        })?;
        Ok(filter_by_size(rows, size_class))
    }

    fn record_heartbeat(&self, cluster: &str, submitter: &str, stale_after_s: u64) -> Result<()> {
        let bound = i64::try_from(stale_after_s).unwrap_or(i64::MAX);
        write(&self.backend, "record a heartbeat", |db| {
            db.execute(
                "INSERT INTO heartbeats (cluster, submitter, refreshed_at, stale_after_s) VALUES ($1, $2, now(), $3)
                 ON CONFLICT (cluster, submitter) DO UPDATE
                 SET refreshed_at = excluded.refreshed_at, stale_after_s = excluded.stale_after_s",
                &[Arg::Text(cluster), Arg::Text(submitter), Arg::Int(bound)],
            )?;
            Ok(())
        })
    }

    fn record_remediation(&self, new: &NewRemediation) -> Result<bool> {
        let adjustment = new.adjustment.as_ref().map(|a| serde_json::to_value(a).expect("an adjustment serialises"));
        write(&self.backend, "record a remediation", |db| {
            // The partial unique index on attempt_id: a second act on one attempt writes nothing.
            let written = db.execute(
                "INSERT INTO remediations (model, benchmark_family, agent, cluster, attempt_id, finding, action,
                     change, adjustment, reason, username, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, now())
                 ON CONFLICT DO NOTHING",
                &[
                    Arg::Text(&new.model),
                    Arg::Text(&new.family),
                    Arg::Text(&new.agent),
                    Arg::Text(&new.cluster),
                    Arg::OptInt(new.attempt.map(|a| a.0)),
                    Arg::Text(&new.finding),
                    Arg::Text(new.action.as_str()),
                    Arg::Text(&new.change),
                    Arg::Json(adjustment.as_ref()),
                    Arg::Text(&new.reason),
                    Arg::Text(&new.username),
                ],
            )?;
            Ok(written > 0)
        })
    }

    fn remediations(&self) -> Result<Vec<Remediation>> {
        read(&self.backend, "read remediations", |db| {
            db.query(
                "SELECT id, model, benchmark_family, agent, cluster, attempt_id, finding, action, change, adjustment,
                     reason, username, created_at
                 FROM remediations ORDER BY id",
                &[],
            )?
            .iter()
            .map(|row| {
                let adjustment = match row.opt_json(9)? {
                    Some(v) => Some(serde_json::from_value(v).map_err(|e| format!("remediation adjustment: {e}"))?),
                    None => None,
                };
                let attempt = if row.cell(5)? == &Cell::Null { None } else { Some(AttemptId(row.int(5)?)) };
                Ok(Remediation {
                    id: row.int(0)?,
                    model: row.text(1)?,
                    family: row.text(2)?,
                    agent: row.text(3)?,
                    cluster: row.text(4)?,
                    attempt,
                    finding: row.text(6)?,
                    action: row.text(7)?.parse()?,
                    change: row.text(8)?,
                    adjustment,
                    reason: row.text(10)?,
                    username: row.text(11)?,
                    created_at: row.ts(12)?,
                })
            })
            .collect::<std::result::Result<_, String>>()
            .map_err(|e| self.corrupt(e))
        })
    }

    fn heartbeats(&self) -> Result<Vec<Heartbeat>> {
        read(&self.backend, "read heartbeats", |db| {
            // Ages by the ledger's clock (the one that stamped them).
            db.query(
                "SELECT cluster, submitter, refreshed_at, stale_after_s, now() FROM heartbeats ORDER BY cluster, submitter",
                &[],
            )?
            .iter()
            .map(|row| {
                let refreshed_at = row.ts(2)?;
                Ok(Heartbeat {
                    cluster: row.text(0)?,
                    submitter: row.text(1)?,
                    refreshed_at,
                    stale_after_s: u64::try_from(row.int(3)?).unwrap_or(0),
                    age_s: u64::try_from((row.ts(4)? - refreshed_at).num_seconds()).unwrap_or(0),
                })
            })
            .collect::<std::result::Result<_, String>>()
            .map_err(|e| self.corrupt(e))
        })
    }

    fn imported(&self, source: &str) -> Result<Vec<ImportedState>> {
        let prefix = format!("{source}#");
        read(&self.backend, "read imported attempts", |db| {
            db.query(
                "SELECT id, source_id, status, metrics IS NOT NULL AND metrics != 'null', slurm_job_id
                 FROM attempts WHERE source_id IS NOT NULL AND substr(source_id, 1, length($1)) = $1",
                &[Arg::Text(&prefix)],
            )?
            .iter()
            .map(|row| {
                Ok(ImportedState {
                    id: AttemptId(row.int(0)?),
                    source_id: row.text(1)?,
                    status: row.text(2)?.parse()?,
                    has_metrics: row.boolean(3)?,
                    slurm_job_id: row.opt_text(4)?,
                })
            })
            .collect::<std::result::Result<_, String>>()
            .map_err(|e| self.corrupt(e))
        })
    }

    fn update_imported(&self, updates: &[(AttemptId, ImportedAttempt)]) -> Result<usize> {
        let mut clashed = None;
        let result = self.backend.write(|db| {
            let mut changed = 0;
            for (index, (id, row)) in updates.iter().enumerate() {
                clashed = Some(index);
                let result = db.execute(
                    "UPDATE attempts SET status = $2, reason = $3, metrics = $4, slurm_job_id = $5, submitted_at = $6,
                                         started_at = $7, ended_at = $8, config = $9, updated_at = now()
                     WHERE id = $1 AND source_id IS NOT NULL",
                    &[
                        Arg::Int(id.0),
                        Arg::Text(row.status.as_str()),
                        Arg::Text(&row.reason),
                        metrics_arg(row.metrics.as_ref()),
                        Arg::OptText(row.slurm_job_id.as_deref()),
                        Arg::Ts(Some(row.submitted_at)),
                        Arg::Ts(row.started_at),
                        Arg::Ts(row.ended_at),
                        Arg::Json(Some(&row.config)),
                    ],
                );
                changed += usize::try_from(result?).unwrap_or(0);
            }
            Ok(changed)
        });
        match result {
            Ok(changed) => Ok(changed),
            // The transaction rolled back; name the attempt that holds the pair.
            Err(Failure::Db(error)) if error.active_clash => {
                let row = &updates[clashed.unwrap_or_default()].1;
                Err(clash_error(&self.backend, &row.model, &row.benchmark))
            }
            Err(failure) => Err(fail(self.backend.location(), "update imported attempts", failure)),
        }
    }

    fn import_watermark(&self, source: &str) -> Result<Option<Timestamp>> {
        read(&self.backend, "read the import watermark", |db| {
            let rows = db.query("SELECT watermark FROM import_sources WHERE source = $1", &[Arg::Text(source)])?;
            rows.first().map(|row| row.opt_ts(0)).transpose().map(Option::flatten).map_err(|e| self.corrupt(e))
        })
    }

    fn set_import_watermark(&self, source: &str, watermark: Option<Timestamp>) -> Result<()> {
        write(&self.backend, "record the import watermark", |db| {
            db.execute(
                "INSERT INTO import_sources (source, watermark, imported_at) VALUES ($1, $2, now())
                 ON CONFLICT (source) DO UPDATE SET watermark = excluded.watermark, imported_at = excluded.imported_at",
                &[Arg::Text(source), Arg::Ts(watermark)],
            )?;
            Ok(())
        })
    }
}

/// `$N` placeholders as `?N` (SQLite numbers `$N` by first use, not by N). The statements here
/// hold no string literal with a `$`.
pub(crate) fn numbered_placeholders(sql: &str) -> String {
    let mut out = sql.as_bytes().to_vec();
    for i in 0..out.len().saturating_sub(1) {
        if out[i] == b'$' && out[i + 1].is_ascii_digit() {
            out[i] = b'?';
        }
    }
    // Only an ASCII `$` was replaced by an ASCII `?`: still UTF-8.
    String::from_utf8(out).unwrap_or_else(|_| sql.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_keep_their_numbers() {
        assert_eq!(numbered_placeholders("SELECT $2, $1 WHERE x = $10"), "SELECT ?2, ?1 WHERE x = ?10");
        assert_eq!(numbered_placeholders("no params $x"), "no params $x");
    }

    #[test]
    fn cells_read_both_representations() {
        let ts = chrono::DateTime::from_timestamp(1_700_000_000, 6000).unwrap();
        let row = Row(vec![
            Cell::Text("2023-11-14T22:13:20.000006Z".into()),
            Cell::Ts(ts),
            Cell::Text("{\"a\":1}".into()),
            Cell::Json(serde_json::json!({"a": 1})),
            Cell::Int(1),
            Cell::Null,
        ]);
        assert_eq!(row.ts(0).unwrap(), ts);
        assert_eq!(row.ts(1).unwrap(), ts);
        assert_eq!(row.json(2).unwrap(), row.json(3).unwrap());
        assert!(row.boolean(4).unwrap());
        assert_eq!(row.opt_text(5).unwrap(), None);
        assert!(row.text(5).is_err() && row.int(2).is_err());
    }
}
