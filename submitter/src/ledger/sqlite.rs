//! The embedded backend: one SQLite file in the cluster's state dir (bundled SQLite, so login
//! nodes need no system library and nothing runs in the background). The ledger's statements are
//! shared with PostgreSQL (`sql.rs`); this is the dialect: the connection, transactions, the clock
//! and SQLite's value types.
//!
//! Every write is a `BEGIN IMMEDIATE` transaction: the write lock is taken before anything is read,
//! so read-then-write sequences (the next attempt number, the migration check) cannot interleave
//! with another process, and a busy database waits ([`BUSY_TIMEOUT`]) instead of failing with
//! SQLite's unretryable "snapshot" error. The journal stays in SQLite's default rollback mode, not
//! WAL: state dirs often sit on NFS or GPFS shared by several login nodes, where WAL's shared-memory
//! index is unsafe.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::functions::FunctionFlags;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode, TransactionBehavior};

use super::migrations::Migration;
use super::sql::{self, Arg, Backend, Cell, DbError, Failure, Row, SqlLedger, Step};
use super::{LedgerError, Result, Timestamp};

/// How long a write waits for another process's transaction before giving up.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Timestamps as fixed-width RFC 3339 UTC with microseconds: text order is time order, which the
/// recency index and every `ORDER BY submitted_at` rely on.
const TIMESTAMP_FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.6fZ";

/// The SQLite ledger.
pub type SqliteLedger = SqlLedger<Sqlite>;

pub struct Sqlite {
    conn: Mutex<Connection>,
    location: String,
    /// What the statements' `now()` returns: set once per call, so that one call's stamps agree
    /// (PostgreSQL's `now()` is the transaction's time too).
    clock: Arc<Mutex<String>>,
}

impl SqlLedger<Sqlite> {
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
        let clock = Arc::new(Mutex::new(format_ts(super::now())));
        let reading = Arc::clone(&clock);
        conn.create_scalar_function("now", 0, FunctionFlags::SQLITE_UTF8, move |_| {
            Ok(reading.lock().unwrap_or_else(PoisonError::into_inner).clone())
        })
        .map_err(|e| unreachable(e.to_string()))?;
        let ledger = SqlLedger { backend: Sqlite { conn: Mutex::new(conn), location, clock } };
        sql::migrate(&ledger.backend)?;
        Ok(ledger)
    }
}

impl Sqlite {
    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic elsewhere cannot leave the connection mid-transaction (rusqlite rolls back on
        // drop), so a poisoned lock is still a usable connection.
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        *self.clock.lock().unwrap_or_else(PoisonError::into_inner) = format_ts(super::now());
        conn
    }
}

impl Backend for Sqlite {
    const BYTE_ORDER: &'static str = ""; // BINARY, the default collation, is byte order
    const MIGRATIONS_PREAMBLE: &'static str = "CREATE TABLE IF NOT EXISTS schema_migrations (
         version    INTEGER PRIMARY KEY,
         name       TEXT NOT NULL,
         applied_at TEXT NOT NULL)";

    fn location(&self) -> &str {
        &self.location
    }

    fn migration_sql(migration: &Migration) -> &'static str {
        migration.sqlite
    }

    fn read<T>(&self, body: impl FnOnce(&mut dyn sql::Db) -> Step<T>) -> Step<T> {
        let conn = self.lock();
        body(&mut SqliteDb(&conn))
    }

    fn write<T>(&self, body: impl FnOnce(&mut dyn sql::Db) -> Step<T>) -> Step<T> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_failure)?;
        let value = body(&mut SqliteDb(&tx))?;
        tx.commit().map_err(db_failure)?;
        Ok(value)
    }

    fn lock_attempts(&self, _db: &mut dyn sql::Db) -> Step<()> {
        Ok(()) // `BEGIN IMMEDIATE` already holds the file's write lock
    }
}

struct SqliteDb<'a>(&'a Connection);

impl SqliteDb<'_> {
    fn run<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        body: impl FnOnce(&mut rusqlite::CachedStatement<'_>, &[SqliteArg<'_>]) -> rusqlite::Result<T>,
    ) -> Step<T> {
        let args: Vec<SqliteArg<'_>> = args.iter().map(|&arg| SqliteArg(arg)).collect();
        let mut statement = self.0.prepare_cached(&sql::numbered_placeholders(sql)).map_err(db_failure)?;
        body(&mut statement, &args).map_err(db_failure)
    }
}

impl sql::Db for SqliteDb<'_> {
    fn query(&mut self, sql: &str, args: &[Arg<'_>]) -> Step<Vec<Row>> {
        self.run(sql, args, |statement, args| {
            let width = statement.column_count();
            let mut rows = statement.query(rusqlite::params_from_iter(args))?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                let cells = (0..width).map(|i| row.get_ref(i).map(cell)).collect::<rusqlite::Result<_>>()?;
                out.push(Row(cells));
            }
            Ok(out)
        })
    }

    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Step<u64> {
        self.run(sql, args, |statement, args| statement.execute(rusqlite::params_from_iter(args)))
            .map(|n| u64::try_from(n).unwrap_or(u64::MAX))
    }

    fn batch(&mut self, sql: &str) -> Step<()> {
        self.0.execute_batch(sql).map_err(db_failure)
    }
}

/// One parameter in SQLite's types: JSON and timestamps as text, booleans as integers.
struct SqliteArg<'a>(Arg<'a>);

impl rusqlite::ToSql for SqliteArg<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        use rusqlite::types::Value as V;
        Ok(match self.0 {
            Arg::Text(text) | Arg::OptText(Some(text)) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
            Arg::Int(n) | Arg::OptInt(Some(n)) => ToSqlOutput::Owned(V::Integer(n)),
            Arg::Float(x) => ToSqlOutput::Owned(V::Real(x)),
            Arg::Bool(b) => ToSqlOutput::Owned(V::Integer(i64::from(b))),
            Arg::Json(Some(value)) => ToSqlOutput::Owned(V::Text(value.to_string())),
            Arg::Ts(Some(ts)) => ToSqlOutput::Owned(V::Text(format_ts(ts))),
            Arg::OptText(None) | Arg::OptInt(None) | Arg::Json(None) | Arg::Ts(None) => ToSqlOutput::Owned(V::Null),
        })
    }
}

fn cell(value: ValueRef<'_>) -> Cell {
    match value {
        ValueRef::Null => Cell::Null,
        ValueRef::Integer(n) => Cell::Int(n),
        // `trials.reward` (migration 7).
        ValueRef::Real(x) => Cell::Float(x),
        ValueRef::Text(bytes) | ValueRef::Blob(bytes) => Cell::Text(String::from_utf8_lossy(bytes).into_owned()),
    }
}

fn db_failure(error: rusqlite::Error) -> Failure {
    let detail = match error.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            format!("{error} (waited {} s for another process — is another submitter writing?)", BUSY_TIMEOUT.as_secs())
        }
        _ => error.to_string(),
    };
    Failure::Db(DbError { active_clash: is_active_index_violation(&error), detail })
}

/// SQLite names a unique index's columns, not the index: these are `attempts_one_active`'s.
fn is_active_index_violation(error: &rusqlite::Error) -> bool {
    matches!(error, rusqlite::Error::SqliteFailure(e, Some(message))
        if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
            && message.contains("attempts.model, attempts.benchmark_family"))
}

fn format_ts(ts: Timestamp) -> String {
    ts.format(TIMESTAMP_FORMAT).to_string()
}
