//! The shared backend: PostgreSQL by URL, for submitters on several clusters (Supabase included).
//!
//! Built on `tokio-postgres` through `bounded` (a runtime of the client's own, every call within a
//! client-side bound; nothing async leaks out).
//! Every statement goes through `query_typed` — the unnamed-statement protocol, one round trip and
//! no server-side prepared statements — so transaction-mode poolers (Supabase's port 6543,
//! PgBouncer) work as well as direct connections. Timestamps come from the server's clock, one
//! clock for every cluster sharing the ledger. The ledger's statements are shared with SQLite
//! (`sql.rs`); this is the dialect: connection and reconnection, TLS, typed parameters, and the two
//! bulk operations PostgreSQL does in one round trip.
//!
//! TLS follows libpq's `sslmode` (rustls on `ring`): `disable`; `prefer` (the default) and
//! `require` encrypt without verifying the certificate, as libpq does, which is what Supabase's
//! `?sslmode=require` strings expect; `verify-ca` checks the chain; `verify-full` also checks the
//! host name. Roots: `sslrootcert=PATH`, else `~/.postgresql/root.crt` when present (libpq's
//! default, which also upgrades `require` to `verify-ca`), else Mozilla's roots built in.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use serde_json::Value;
use tokio_postgres::Config;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::bounded::{self, Client, Param, Statements, Transaction};
use super::migrations::Migration;
use super::sql::{self, Arg, Backend, Cell, DbError, Failure, Row, SqlLedger, Step};
use super::{
    AttemptId, ImportedAttempt, LedgerError, Result, number_imports, postgres_location, scrub, size_class, url_password,
};

/// Used when the URL sets no `connect_timeout`: an unroutable host fails in seconds, not minutes.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The client-side bound of one call on the ledger's PostgreSQL (a statement, or a transaction's
/// statements together, the bulk import's `COPY` included) and of its connect's startup
/// (`bounded`): generous, since the ledger's bulk import runs under it; what it bounds is a
/// connection that stopped answering. The team database's calls have `team.timeout_s`.
pub const LEDGER_CALL_BOUND: Duration = Duration::from_secs(300);

/// From this many imported rows on, the import ends with `VACUUM (ANALYZE)`.
const VACUUM_AFTER_ROWS: usize = 10_000;

const UNREACHABLE_HINT: &str = "is PostgreSQL running, and are the host and port in the URL right?";

/// The PostgreSQL ledger.
pub type PgLedger = SqlLedger<Postgres>;

pub struct Postgres {
    /// Replaced on a reconnect.
    client: Mutex<Client>,
    config: Config,
    tls: MakeRustlsConnect,
    location: String,
    /// The password in the forms a driver message could echo, scrubbed from every message.
    secrets: Vec<String>,
}

/// A plain connection with the ledger's URL, TLS and password handling: the ledger's own, and the
/// team's OT-Agent database (import, mirror).
pub struct Connection {
    client: Client,
    /// The client-side bound of each [`Connection::within`] call.
    bound: Duration,
    config: Config,
    tls: MakeRustlsConnect,
    /// `postgres://user@host:port/db`, safe to print.
    pub location: String,
    secrets: Vec<String>,
}

impl Connection {
    /// Opens a connection whose startup and whose every [`Connection::within`] call are bounded by
    /// `bound` on the client's side (`bounded`).
    pub fn open(url: &str, bound: Duration) -> Result<Self> {
        let location = postgres_location(url);
        let tls_settings = TlsSettings::from_url(url);
        let secrets = password_forms(url);
        let bad = |detail: String| LedgerError::BadSpec { spec: location.clone(), detail };
        let mut config: Config = tls_settings.driver_url.parse().map_err(|e| bad(scrub(db_message(&e), &secrets)))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("submitter");
        }
        let tls = MakeRustlsConnect::new(tls_settings.client_config().map_err(bad)?);
        let client = open_client(&config, &tls, &location, &secrets, bound)?;
        Ok(Connection { client, bound, config, tls, location, secrets })
    }

    /// Runs `body` on the client within the connection's bound: at the bound the connection is
    /// dropped, the pending call ends with an error, and the second value says the bound fired.
    /// A connection the server (or a fired bound) closed is opened again first.
    pub fn within<T>(&mut self, body: impl FnOnce(&mut Client) -> T) -> std::result::Result<(T, bool), LedgerError> {
        if self.client.is_closed() {
            self.client = open_client(&self.config, &self.tls, &self.location, &self.secrets, self.bound)?;
        }
        Ok(self.client.within(self.bound, body))
    }

    /// The client-side bound of each call.
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// What turns this connection's driver errors into one line without the password, held apart
    /// from the client so it can be used while a query borrows the client.
    pub(crate) fn redactor(&self) -> Redactor {
        Redactor { location: self.location.clone(), secrets: self.secrets.clone() }
    }
}

#[derive(Clone)]
pub struct Redactor {
    pub location: String,
    secrets: Vec<String>,
}

impl Redactor {
    /// A driver error as one line, without the password.
    pub fn describe(&self, error: &tokio_postgres::Error) -> String {
        scrub(db_message(error), &self.secrets)
    }
}

impl From<tokio_postgres::Error> for Failure {
    /// Unscrubbed here; [`Postgres::scrubbed`] removes the password at the call's boundary.
    fn from(error: tokio_postgres::Error) -> Self {
        let mut detail = db_message(&error);
        if error.is_closed() {
            detail.push_str(" (connection lost; the next call reconnects)");
        }
        Failure::Db(DbError { active_clash: is_active_index_violation(&error), detail })
    }
}

impl SqlLedger<Postgres> {
    /// Connects (TLS per `sslmode`) and applies pending migrations.
    pub fn connect(url: &str) -> Result<Self> {
        let Connection { client, config, tls, location, secrets, .. } = Connection::open(url, LEDGER_CALL_BOUND)?;
        let ledger = SqlLedger { backend: Postgres { client: Mutex::new(client), config, tls, location, secrets } };
        sql::migrate(&ledger.backend)?;
        Ok(ledger)
    }
}

impl Postgres {
    fn lock(&self) -> MutexGuard<'_, Client> {
        self.client.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `body` on the connection, reconnecting first when the server closed it (an idle
    /// timeout, a restart): a long-running listener recovers on its next call.
    /// Each call is bounded by [`LEDGER_CALL_BOUND`] on the client's side (`bounded`).
    fn with_client<T>(&self, body: impl FnOnce(&mut Client) -> Step<T>) -> Step<T> {
        let mut client = self.lock();
        if client.is_closed() {
            *client = open_client(&self.config, &self.tls, &self.location, &self.secrets, LEDGER_CALL_BOUND)?;
        }
        let (result, fired) = client.within(LEDGER_CALL_BOUND, body);
        result.map_err(|failure| match failure {
            Failure::Db(DbError { detail, active_clash }) if fired => Failure::Db(DbError {
                detail: format!(
                    "no answer within {} s (the client's bound; connection dropped, the next call reconnects): {}",
                    LEDGER_CALL_BOUND.as_secs(),
                    scrub(detail, &self.secrets)
                ),
                active_clash,
            }),
            failure => self.scrubbed(failure),
        })
    }

    fn in_transaction<T>(&self, body: impl FnOnce(&mut Transaction<'_>) -> Step<T>) -> Step<T> {
        self.with_client(|client| {
            let mut tx = client.transaction()?;
            let value = body(&mut tx)?;
            tx.commit()?;
            Ok(value)
        })
    }

    fn scrubbed(&self, failure: Failure) -> Failure {
        match failure {
            Failure::Db(DbError { detail, active_clash }) => {
                Failure::Db(DbError { detail: scrub(detail, &self.secrets), active_clash })
            }
            other => other,
        }
    }

    fn fail(&self, operation: &'static str, failure: Failure) -> LedgerError {
        sql::fail(&self.location, operation, failure)
    }
}

impl Backend for Postgres {
    const BYTE_ORDER: &'static str = r#" COLLATE "C""#;
    // Serialise concurrent openers of this schema: the second waits, then finds nothing to do.
    const MIGRATIONS_PREAMBLE: &'static str =
        "SELECT pg_advisory_xact_lock(hashtext('submitter-ledger:' || COALESCE(current_schema(), '')));
         CREATE TABLE IF NOT EXISTS schema_migrations (
             version    INTEGER PRIMARY KEY,
             name       TEXT NOT NULL,
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now())";

    fn location(&self) -> &str {
        &self.location
    }

    fn migration_sql(migration: &Migration) -> &'static str {
        migration.postgres
    }

    fn read<T>(&self, body: impl FnOnce(&mut dyn sql::Db) -> Step<T>) -> Step<T> {
        self.with_client(|client| body(&mut PgDb(client)))
    }

    fn write<T>(&self, body: impl FnOnce(&mut dyn sql::Db) -> Step<T>) -> Step<T> {
        self.in_transaction(|tx| body(&mut PgDb(tx)))
    }

    fn lock_attempts(&self, db: &mut dyn sql::Db) -> Step<()> {
        db.batch("LOCK TABLE attempts IN SHARE ROW EXCLUSIVE MODE")
    }

    /// PostgreSQL's own: the pairs' attempt numbers and active attempts in one query, the rows in one
    /// binary `COPY` (a statement per row is a round trip per row: minutes for a team history over a
    /// remote pooler), and `VACUUM (ANALYZE)` after a big load.
    fn import_attempts(&self, rows: &[ImportedAttempt]) -> Result<usize> {
        let started = std::time::Instant::now();
        let imported = self
            .in_transaction(|tx| {
                // A bulk admin operation: hold off concurrent inserts so the active-pair check holds.
                tx.batch_execute("LOCK TABLE attempts IN SHARE ROW EXCLUSIVE MODE")?;
                let families: HashMap<String, String> = tx
                    .query_typed("SELECT benchmark, family FROM benchmark_families", &[])?
                    .iter()
                    .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                    .collect::<Step<_>>()?;
                let family_of =
                    |benchmark: &str| families.get(benchmark).cloned().unwrap_or_else(|| benchmark.to_string());

                // Existing attempt numbers and active attempts of the pairs involved, in one round trip.
                let pairs: HashSet<(String, String)> =
                    rows.iter().map(|row| (row.model.clone(), family_of(&row.benchmark))).collect();
                let (models, pair_families): (Vec<&str>, Vec<&str>) =
                    pairs.iter().map(|(m, f)| (m.as_str(), f.as_str())).unzip();
                let mut max_attempt: HashMap<(String, String), u32> = HashMap::new();
                let mut active_ids: HashMap<(String, String), i64> = HashMap::new();
                for row in tx.query_typed(
                    "SELECT p.model, p.family,
                        (SELECT COALESCE(MAX(attempt), 0)::int8 FROM attempts a
                         WHERE a.model = p.model AND a.benchmark_family = p.family),
                        (SELECT id FROM attempts a
                         WHERE a.model = p.model AND a.benchmark_family = p.family
                           AND a.status IN ('pending', 'started'))
                 FROM unnest($1::text[], $2::text[]) AS p(model, family)",
                    &[(&models, Type::TEXT_ARRAY), (&pair_families, Type::TEXT_ARRAY)],
                )? {
                    let key: (String, String) = (row.try_get(0)?, row.try_get(1)?);
                    let max: i64 = row.try_get(2)?;
                    if let Some(id) = row.try_get::<_, Option<i64>>(3)? {
                        active_ids.insert(key.clone(), id);
                    }
                    max_attempt.insert(key, u32::try_from(max).unwrap_or(u32::MAX));
                }
                let numbered = number_imports(&self.location, rows, family_of, |model, family| {
                    Ok(max_attempt.get(&(model.to_string(), family.to_string())).copied().unwrap_or(0))
                })?;

                // The unique index would stop a second active attempt anyway; checking first names it.
                for (row, (family, _)) in rows.iter().zip(&numbered).filter(|(row, _)| row.status.is_active()) {
                    if let Some(&existing) = active_ids.get(&(row.model.clone(), family.clone())) {
                        return Err(LedgerError::AlreadyActive {
                            model: row.model.clone(),
                            family: family.clone(),
                            existing_id: AttemptId(existing),
                        }
                        .into());
                    }
                }

                tracing::debug!("import: numbered {} rows at {:.2} s", rows.len(), started.elapsed().as_secs_f64());
                insert_rows(tx, rows, &numbered)?;
                tracing::debug!("import: inserted at {:.2} s", started.elapsed().as_secs_f64());
                Ok(rows.len())
            })
            .map_err(|failure| self.fail("import attempts", failure))?;
        tracing::debug!("import: committed at {:.2} s", started.elapsed().as_secs_f64());
        // After a bulk load, statistics and the visibility map lag until autovacuum comes by; until
        // then the planner's index-only scans visit the heap (≈4× slower at 100k rows). Do it now.
        // The rows are committed either way, so a failure here (not the table's owner) only warns.
        if imported >= VACUUM_AFTER_ROWS
            && let Err(failure) = self.with_client(|client| Ok(client.batch_execute("VACUUM (ANALYZE) attempts")?))
        {
            let error = self.fail("vacuum after import", failure);
            tracing::warn!("{error}");
        }
        Ok(imported)
    }

    /// PostgreSQL's own: one `INSERT … SELECT FROM unnest(…)` for the batch, not a round trip per model.
    fn add_models(&self, models: &[(String, Option<String>)]) -> Result<usize> {
        let ids: Vec<&str> = models.iter().map(|(id, _)| id.as_str()).collect();
        let sizes: Vec<Option<String>> = models.iter().map(|(id, _)| size_class(id)).collect();
        let bases: Vec<Option<&str>> = models.iter().map(|(_, base)| base.as_deref()).collect();
        self.in_transaction(|tx| {
            // One registration time for the batch (the catalogue's order breaks ties by id).
            let added = tx.execute_typed(
                "INSERT INTO models (id, size_class, registered_at, base_model)
                 SELECT id, size, now(), base FROM unnest($1::text[], $2::text[], $3::text[]) AS m(id, size, base)
                 ON CONFLICT (id) DO NOTHING",
                &[(&ids, Type::TEXT_ARRAY), (&sizes, Type::TEXT_ARRAY), (&bases, Type::TEXT_ARRAY)],
            )?;
            tx.execute_typed(
                "UPDATE models SET base_model = m.base
                 FROM unnest($1::text[], $2::text[]) AS m(id, base)
                 WHERE models.id = m.id AND m.base IS NOT NULL AND models.base_model IS DISTINCT FROM m.base",
                &[(&ids, Type::TEXT_ARRAY), (&bases, Type::TEXT_ARRAY)],
            )?;
            Ok(usize::try_from(added).unwrap_or(0))
        })
        .map_err(|failure| self.fail("add models", failure))
    }
}

/// A client or a transaction, as the shared statements see it: typed parameters, rows as cells.
struct PgDb<'a, C: Statements>(&'a mut C);

impl<C: Statements> sql::Db for PgDb<'_, C> {
    fn query(&mut self, sql: &str, args: &[Arg<'_>]) -> Step<Vec<Row>> {
        let params: Vec<Param<'_>> = args.iter().map(param).collect();
        self.0.query_typed(sql, &params)?.iter().map(row).collect()
    }

    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Step<u64> {
        let params: Vec<Param<'_>> = args.iter().map(param).collect();
        Ok(self.0.execute_typed(sql, &params)?)
    }

    fn batch(&mut self, sql: &str) -> Step<()> {
        Ok(self.0.batch_execute(sql)?)
    }
}

fn param<'a>(arg: &'a Arg<'_>) -> Param<'a> {
    match arg {
        Arg::Text(text) => (text, Type::TEXT),
        Arg::OptText(text) => (text, Type::TEXT),
        Arg::Int(n) => (n, Type::INT8),
        Arg::OptInt(n) => (n, Type::INT8),
        Arg::Float(x) => (x, Type::FLOAT8),
        Arg::Bool(b) => (b, Type::BOOL),
        Arg::Json(value) => (value, Type::JSONB),
        Arg::Ts(ts) => (ts, Type::TIMESTAMPTZ),
    }
}

fn row(row: &tokio_postgres::Row) -> Step<Row> {
    let mut cells = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        let ty = column.type_();
        let cell = if *ty == Type::INT8 {
            row.try_get::<_, Option<i64>>(i)?.map(Cell::Int)
        } else if *ty == Type::INT4 {
            row.try_get::<_, Option<i32>>(i)?.map(|n| Cell::Int(n.into()))
        } else if *ty == Type::INT2 {
            row.try_get::<_, Option<i16>>(i)?.map(|n| Cell::Int(n.into()))
        } else if *ty == Type::FLOAT8 {
            row.try_get::<_, Option<f64>>(i)?.map(Cell::Float)
        } else if *ty == Type::BOOL {
            row.try_get::<_, Option<bool>>(i)?.map(Cell::Bool)
        } else if *ty == Type::JSONB || *ty == Type::JSON {
            row.try_get::<_, Option<Value>>(i)?.map(Cell::Json)
        } else if *ty == Type::TIMESTAMPTZ {
            row.try_get::<_, Option<DateTime<Utc>>>(i)?.map(Cell::Ts)
        } else {
            // TEXT, VARCHAR, NAME; anything else fails here with the driver's type error.
            row.try_get::<_, Option<String>>(i)?.map(Cell::Text)
        };
        cells.push(cell.unwrap_or(Cell::Null));
    }
    Ok(Row(cells))
}

/// SQL NULL for an absent or JSON-null value: "no metrics" is one state, not two.
fn json_param(value: Option<&Value>) -> Option<&Value> {
    value.filter(|v| !v.is_null())
}

/// Connects, the startup and authentication bounded by `bound` (`bounded`; the driver's
/// `connect_timeout` covers the TCP connect only).
fn open_client(
    config: &Config,
    tls: &MakeRustlsConnect,
    location: &str,
    secrets: &[String],
    bound: Duration,
) -> Result<Client> {
    let location = location.to_string();
    let error = match Client::connect(config, tls.clone(), bound) {
        Ok(client) => return Ok(client),
        Err(bounded::ConnectError::Driver(error)) => error,
        Err(bounded::ConnectError::NoAnswer) => {
            let detail = format!("no answer within {} s while connecting (the client's bound)", bound.as_secs());
            return Err(LedgerError::Unreachable { location, detail, hint: UNREACHABLE_HINT });
        }
        Err(bounded::ConnectError::Runtime(error)) => {
            let detail = format!("cannot start the client's runtime: {error}");
            return Err(LedgerError::Unreachable { location, detail, hint: "free file descriptors or memory" });
        }
    };
    let detail = scrub(db_message(&error), secrets);
    Err(match error.code() {
        Some(code) if *code == SqlState::INVALID_PASSWORD || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION => {
            LedgerError::Rejected { location, detail, hint: "check the user and password in the URL" }
        }
        Some(code) if *code == SqlState::INVALID_CATALOG_NAME => {
            LedgerError::Rejected { location, detail, hint: "create the database, or fix its name in the URL" }
        }
        Some(code) if *code == SqlState::TOO_MANY_CONNECTIONS => {
            LedgerError::Rejected { location, detail, hint: "the server is at its connection limit; try again later" }
        }
        Some(_) => LedgerError::Rejected { location, detail, hint: "check the URL and the server's pg_hba.conf" },
        None if is_tls_failure(&detail) => {
            LedgerError::Unreachable { location, detail, hint: "check sslmode and sslrootcert in the URL" }
        }
        None => LedgerError::Unreachable { location, detail, hint: UNREACHABLE_HINT },
    })
}

/// The driver's message with its cause chain (tokio-postgres keeps the I/O or TLS reason in the
/// source), and the server's detail for database errors.
fn db_message(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        return match db.detail() {
            Some(detail) => format!("{}: {} ({detail})", db.severity(), db.message()),
            None => format!("{}: {}", db.severity(), db.message()),
        };
    }
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message = format!("{message}: {text}");
        }
        source = cause.source();
    }
    message
}

fn is_tls_failure(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    ["tls", "certificate", "handshake"].iter().any(|word| message.contains(word))
}

fn is_active_index_violation(error: &tokio_postgres::Error) -> bool {
    error
        .as_db_error()
        .is_some_and(|db| *db.code() == SqlState::UNIQUE_VIOLATION && db.constraint() == Some("attempts_one_active"))
}

/// The URL's password as written and percent-decoded (drivers may echo either).
fn password_forms(url: &str) -> Vec<String> {
    let mut forms: Vec<String> = url_password(url).into_iter().map(str::to_string).collect();
    if let Some((_, query)) = url.split_once('?') {
        for pair in query.split('&') {
            if let Some(password) = pair.strip_prefix("password=") {
                forms.push(password.to_string());
            }
        }
    }
    let decoded: Vec<String> = forms.iter().map(|f| percent_decode(f)).collect();
    forms.extend(decoded);
    forms.retain(|f| !f.is_empty());
    forms.sort();
    forms.dedup();
    forms
}

fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text).decode_utf8_lossy().into_owned()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verification {
    /// Encrypt only (libpq `prefer`/`require` without a root certificate).
    EncryptOnly,
    /// The chain must lead to a trusted root; the host name is not checked (`verify-ca`).
    Chain,
    /// Chain and host name (`verify-full`).
    Full,
}

/// The libpq TLS parameters the driver does not know, taken out of the URL.
#[derive(Debug)]
struct TlsSettings {
    /// The URL for the driver: `sslrootcert` removed, `sslmode` mapped to disable/prefer/require.
    driver_url: String,
    verification: Verification,
    /// None: Mozilla's roots (also what `sslrootcert=system` asks for).
    root_cert: Option<PathBuf>,
}

impl TlsSettings {
    fn from_url(url: &str) -> Self {
        // The query is split by hand, not with `url`'s form decoder: every parameter but the two
        // taken out must reach the driver exactly as written (a decode and re-encode would turn
        // `options=-c%20search_path%3Dx` into `+`-spaces the driver does not read back).
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        let mut mode = "prefer".to_string();
        let mut root_cert = None;
        let mut system_roots = false;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("sslmode", value)) => mode = value.to_string(),
                Some(("sslrootcert", "system")) => system_roots = true,
                Some(("sslrootcert", path)) => root_cert = Some(PathBuf::from(percent_decode(path))),
                _ => kept.push(pair.to_string()),
            }
        }
        let default_root = std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".postgresql/root.crt"))
            .filter(|path| path.is_file());
        if root_cert.is_none() && !system_roots {
            root_cert = default_root;
        }
        let (driver_mode, verification) = match mode.as_str() {
            "verify-full" => ("require", Verification::Full),
            "verify-ca" => ("require", Verification::Chain),
            // libpq: with a root certificate, `require` verifies the chain.
            "require" if root_cert.is_some() => ("require", Verification::Chain),
            "allow" => ("prefer", Verification::EncryptOnly),
            other => (other, Verification::EncryptOnly),
        };
        kept.push(format!("sslmode={driver_mode}"));
        TlsSettings { driver_url: format!("{base}?{}", kept.join("&")), verification, root_cert }
    }

    fn client_config(&self) -> std::result::Result<ClientConfig, String> {
        // An explicit provider: the process-wide default is ambiguous when another crate in the
        // build enables rustls's aws-lc-rs too.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?;
        let chain = match self.verification {
            Verification::EncryptOnly => None,
            Verification::Full => return Ok(builder.with_root_certificates(self.roots()?).with_no_client_auth()),
            Verification::Chain => Some(
                WebPkiServerVerifier::builder_with_provider(Arc::new(self.roots()?), provider.clone())
                    .build()
                    .map_err(|e| format!("TLS setup: {e}"))?,
            ),
        };
        let verifier = LibpqVerifier { algorithms: provider.signature_verification_algorithms, chain };
        Ok(builder.dangerous().with_custom_certificate_verifier(Arc::new(verifier)).with_no_client_auth())
    }

    fn roots(&self) -> std::result::Result<RootCertStore, String> {
        let mut roots = RootCertStore::empty();
        match &self.root_cert {
            Some(path) => {
                let certs = CertificateDer::pem_file_iter(path)
                    .map_err(|e| format!("sslrootcert {}: {e}", path.display()))?
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
                let (added, _) = roots.add_parsable_certificates(certs);
                if added == 0 {
                    return Err(format!("sslrootcert {}: no usable certificate", path.display()));
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        Ok(roots)
    }
}

/// libpq's `require` and `verify-ca`, which rustls has no verifier for: the session is encrypted
/// and the handshake's signatures are checked by the provider's algorithms; the certificate is not
/// checked (`chain: None`, `require`), or its chain must verify while a name mismatch is accepted
/// (`verify-ca`).
#[derive(Debug)]
struct LibpqVerifier {
    algorithms: WebPkiSupportedAlgorithms,
    chain: Option<Arc<WebPkiServerVerifier>>,
}

impl ServerCertVerifier for LibpqVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Every row in one binary `COPY … FROM STDIN`: no statement per row or chunk, no arrays to unpack
/// on the server (an `INSERT … SELECT FROM unnest(…)` per 10k rows took twice as long at 100k rows).
/// `updated_at` is the transaction's `now()`, the server's clock as for every other write.
fn insert_rows(tx: &mut Transaction<'_>, rows: &[ImportedAttempt], numbers: &[(String, u32)]) -> Step<()> {
    let now: DateTime<Utc> = tx.query_typed("SELECT now()", &[])?[0].try_get(0)?;
    let sql = "COPY attempts (model, benchmark, benchmark_family, cluster, username, run_tag, slurm_job_id, status,
                        reason, config, metrics, attempt, submitted_at, started_at, ended_at, updated_at, source_id)
         FROM STDIN (FORMAT binary)";
    let types = [
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::JSONB,
        Type::JSONB,
        Type::INT4,
        Type::TIMESTAMPTZ,
        Type::TIMESTAMPTZ,
        Type::TIMESTAMPTZ,
        Type::TIMESTAMPTZ,
        Type::TEXT,
    ];
    let mut writer = tx.copy_in_binary(sql, &types)?;
    for (row, (family, attempt)) in rows.iter().zip(numbers) {
        let attempt = i32::try_from(*attempt).unwrap_or(i32::MAX);
        let metrics = json_param(row.metrics.as_ref());
        writer.write(&[
            &row.model,
            &row.benchmark,
            family,
            &row.cluster,
            &row.username,
            &row.run_tag,
            &row.slurm_job_id,
            &row.status.as_str(),
            &row.reason,
            &row.config,
            &metrics,
            &attempt,
            &row.submitted_at,
            &row.started_at,
            &row.ended_at,
            &now,
            &row.source_id,
        ])?;
    }
    writer.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_tls_parameters_are_mapped_for_the_driver() {
        let s = TlsSettings::from_url("postgres://u:p@h:6543/postgres?sslmode=require");
        assert_eq!(s.driver_url, "postgres://u:p@h:6543/postgres?sslmode=require");
        let s = TlsSettings::from_url(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.crt&application_name=x",
        );
        assert_eq!(s.driver_url, "postgres://u@h/db?application_name=x&sslmode=require");
        assert_eq!(s.verification, Verification::Full);
        assert_eq!(s.root_cert, Some(PathBuf::from("/tmp/ca.crt")));
        let s = TlsSettings::from_url("postgres://u@h/db?sslmode=verify-ca&sslrootcert=system");
        assert_eq!((s.verification, s.root_cert), (Verification::Chain, None));
        let s = TlsSettings::from_url("postgres://u@h/db");
        assert_eq!(s.driver_url, "postgres://u@h/db?sslmode=prefer");
    }

    /// Supabase's pooler connection string (docs/submitter.md): a user with a dot (`USER.PROJECT`),
    /// port 6543, `postgresql://`, `sslmode=require`; the driver must take it as written.
    #[test]
    fn the_supabase_pooler_url_form_is_accepted() {
        // The password is made up per run (no credential-shaped literal in the source); its `$`
        // is sent percent-encoded, as Supabase's dashboard gives it.
        let password = format!("test-{}$", std::process::id());
        let encoded = password.replace('$', "%24");
        let host = "aws-0-eu-central-1.pooler.supabase.com";
        let url = format!("postgresql://postgres.testproject:{encoded}@{host}:6543/postgres?sslmode=require");
        let s = TlsSettings::from_url(&url);
        assert_eq!(s.driver_url, url);
        let config: Config = s.driver_url.parse().unwrap();
        assert_eq!(config.get_user(), Some("postgres.testproject"));
        assert_eq!(config.get_password(), Some(password.as_bytes()));
        assert_eq!(config.get_ports(), [6543]);
        assert_eq!(config.get_dbname(), Some("postgres"));
        assert_eq!(config.get_ssl_mode(), tokio_postgres::config::SslMode::Require);
        assert_eq!(postgres_location(&url), format!("postgresql://postgres.testproject@{host}:6543/postgres"));
        assert!(password_forms(&url).contains(&password));
        s.client_config().unwrap();
    }

    #[test]
    fn every_tls_mode_builds_a_client_config() {
        for mode in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
            let settings = TlsSettings::from_url(&format!("postgres://u@h/db?sslmode={mode}&sslrootcert=system"));
            settings.client_config().unwrap_or_else(|e| panic!("{mode}: {e}"));
        }
    }

    #[test]
    fn password_forms_cover_encoded_and_query_passwords() {
        let forms = password_forms("postgres://u:p%40ss@h/db?password=other");
        assert!(forms.contains(&"p%40ss".to_string()) && forms.contains(&"p@ss".to_string()), "{forms:?}");
        assert!(forms.contains(&"other".to_string()), "{forms:?}");
        assert!(password_forms("postgres://u@h/db").is_empty());
    }
}
