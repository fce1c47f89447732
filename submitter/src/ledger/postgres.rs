//! The shared backend: PostgreSQL by URL, for submitters on several clusters (Supabase included).
//!
//! Built on the sync `postgres` client (it drives its own small runtime; nothing async leaks out).
//! Every statement goes through `query_typed` — the unnamed-statement protocol, one round trip and
//! no server-side prepared statements — so transaction-mode poolers (Supabase's port 6543,
//! PgBouncer) work as well as direct connections. Timestamps come from the server's clock, one
//! clock for every cluster sharing the ledger.
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

use ::postgres::error::SqlState;
use ::postgres::types::{ToSql, Type};
use ::postgres::{Client, Config, Row, Transaction};
use chrono::{DateTime, Utc};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use serde_json::Value;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::migrations::{self, Migration};
use super::{
    ATTEMPT_COLUMNS, Attempt, AttemptId, Heartbeat, ImportedAttempt, ImportedState, LATEST_PER_PAIR_SQL, Ledger,
    LedgerError, Model, NewAttempt, PairState, Result, Status, Timestamp, filter_by_size, number_imports,
    postgres_location, scrub, size_class, sql_status_list, url_password,
};

/// Used when the URL sets no `connect_timeout`: an unroutable host fails in seconds, not minutes.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// From this many imported rows on, the import ends with `VACUUM (ANALYZE)`.
const VACUUM_AFTER_ROWS: usize = 10_000;

const UNREACHABLE_HINT: &str = "is PostgreSQL running, and are the host and port in the URL right?";

/// One statement parameter with its PostgreSQL type (what `query_typed` needs).
type Param<'a> = (&'a (dyn ToSql + Sync), Type);

pub struct PgLedger {
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
    pub client: Client,
    config: Config,
    tls: MakeRustlsConnect,
    /// `postgres://user@host:port/db`, safe to print.
    pub location: String,
    secrets: Vec<String>,
}

impl Connection {
    pub fn open(url: &str) -> Result<Self> {
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
        let client = open_client(&config, &tls, &location, &secrets)?;
        Ok(Connection { client, config, tls, location, secrets })
    }

    /// What turns this connection's driver errors into one line without the password, held apart
    /// from the client so it can be used while a query borrows the client.
    pub fn redactor(&self) -> Redactor {
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
    pub fn describe(&self, error: &::postgres::Error) -> String {
        scrub(db_message(error), &self.secrets)
    }
}

impl std::fmt::Debug for PgLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgLedger({})", self.location)
    }
}

enum Failure {
    Db(::postgres::Error),
    Ledger(LedgerError),
}

impl From<::postgres::Error> for Failure {
    fn from(error: ::postgres::Error) -> Self {
        Failure::Db(error)
    }
}

impl From<LedgerError> for Failure {
    fn from(error: LedgerError) -> Self {
        Failure::Ledger(error)
    }
}

type Step<T> = std::result::Result<T, Failure>;

impl PgLedger {
    /// Connects (TLS per `sslmode`) and applies pending migrations.
    pub fn connect(url: &str) -> Result<Self> {
        let Connection { client, config, tls, location, secrets } = Connection::open(url)?;
        let ledger = PgLedger { client: Mutex::new(client), config, tls, location, secrets };
        ledger.migrate()?;
        Ok(ledger)
    }

    fn migrate(&self) -> Result<()> {
        let location = self.location.clone();
        self.in_transaction("apply migrations", |tx| {
            // Serialise concurrent openers of this schema: the second waits, then finds nothing to do.
            tx.batch_execute(
                "SELECT pg_advisory_xact_lock(hashtext('submitter-ledger:' || COALESCE(current_schema(), '')));
                 CREATE TABLE IF NOT EXISTS schema_migrations (
                     version    INTEGER PRIMARY KEY,
                     name       TEXT NOT NULL,
                     applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            )?;
            let applied: Vec<(i64, String)> = tx
                .query_typed("SELECT version::int8, name FROM schema_migrations ORDER BY version", &[])?
                .iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                .collect::<Step<_>>()?;
            for migration in migrations::pending(&location, &applied)? {
                apply(tx, migration).map_err(|e| LedgerError::Migration {
                    location: location.clone(),
                    version: migration.version,
                    detail: scrub(db_message(&e), &self.secrets),
                })?;
            }
            Ok(())
        })
    }

    fn lock(&self) -> MutexGuard<'_, Client> {
        self.client.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `body` on the connection, reconnecting first when the server closed it (an idle
    /// timeout, a restart): a long-running listener recovers on its next call.
    fn with_client<T>(&self, operation: &'static str, body: impl FnOnce(&mut Client) -> Step<T>) -> Result<T> {
        let mut client = self.lock();
        if client.is_closed() {
            *client = open_client(&self.config, &self.tls, &self.location, &self.secrets)?;
        }
        body(&mut client).map_err(|failure| self.fail(operation, failure))
    }

    fn in_transaction<T>(
        &self,
        operation: &'static str,
        body: impl FnOnce(&mut Transaction<'_>) -> Step<T>,
    ) -> Result<T> {
        self.with_client(operation, |client| {
            let mut tx = client.transaction()?;
            let value = body(&mut tx)?;
            tx.commit()?;
            Ok(value)
        })
    }

    fn fail(&self, operation: &'static str, failure: Failure) -> LedgerError {
        match failure {
            Failure::Ledger(error) => error,
            Failure::Db(error) => {
                let mut detail = scrub(db_message(&error), &self.secrets);
                if error.is_closed() {
                    detail.push_str(" (connection lost; the next call reconnects)");
                }
                LedgerError::Backend { location: self.location.clone(), operation, detail }
            }
        }
    }

    fn corrupt(&self, detail: impl std::fmt::Display) -> Failure {
        Failure::Ledger(LedgerError::Corrupt { location: self.location.clone(), detail: detail.to_string() })
    }

    fn parse_attempt(&self, row: &Row) -> Step<Attempt> {
        let status: String = row.try_get(8)?;
        let attempt: i32 = row.try_get(12)?;
        Ok(Attempt {
            id: AttemptId(row.try_get(0)?),
            model: row.try_get(1)?,
            benchmark: row.try_get(2)?,
            benchmark_family: row.try_get(3)?,
            cluster: row.try_get(4)?,
            username: row.try_get(5)?,
            run_tag: row.try_get(6)?,
            slurm_job_id: row.try_get(7)?,
            status: status.parse().map_err(|e| self.corrupt(e))?,
            reason: row.try_get(9)?,
            config: row.try_get(10)?,
            metrics: row.try_get(11)?,
            attempt: u32::try_from(attempt).map_err(|_| self.corrupt(format!("attempt number {attempt}")))?,
            submitted_at: row.try_get(13)?,
            started_at: row.try_get(14)?,
            ended_at: row.try_get(15)?,
            updated_at: row.try_get(16)?,
        })
    }

    fn attempts_where(&self, client: &mut Client, condition: &str, params: &[Param<'_>]) -> Step<Vec<Attempt>> {
        let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE {condition} ORDER BY submitted_at, id");
        client.query_typed(&sql, params)?.iter().map(|row| self.parse_attempt(row)).collect()
    }

    fn already_active(&self, client: &mut Client, model: &str, family: &str) -> Step<Option<LedgerError>> {
        let row = client.query_typed(
            "SELECT id FROM attempts WHERE model = $1 AND benchmark_family = $2 AND status IN ('pending', 'started')",
            &[(&model, Type::TEXT), (&family, Type::TEXT)],
        )?;
        Ok(row.first().map(|row| row.try_get(0)).transpose()?.map(|id| LedgerError::AlreadyActive {
            model: model.to_string(),
            family: family.to_string(),
            existing_id: AttemptId(id),
        }))
    }
}

fn apply(tx: &mut Transaction<'_>, migration: &Migration) -> std::result::Result<(), ::postgres::Error> {
    tx.batch_execute(migration.postgres)?;
    let version = i32::try_from(migration.version).expect("migration versions are small");
    tx.execute_typed(
        "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
        &[(&version, Type::INT4), (&migration.name, Type::TEXT)],
    )?;
    Ok(())
}

fn open_client(config: &Config, tls: &MakeRustlsConnect, location: &str, secrets: &[String]) -> Result<Client> {
    config.connect(tls.clone()).map_err(|error| {
        let detail = scrub(db_message(&error), secrets);
        let location = location.to_string();
        match error.code() {
            Some(code)
                if *code == SqlState::INVALID_PASSWORD || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
            {
                LedgerError::Rejected { location, detail, hint: "check the user and password in the URL" }
            }
            Some(code) if *code == SqlState::INVALID_CATALOG_NAME => {
                LedgerError::Rejected { location, detail, hint: "create the database, or fix its name in the URL" }
            }
            Some(code) if *code == SqlState::TOO_MANY_CONNECTIONS => LedgerError::Rejected {
                location,
                detail,
                hint: "the server is at its connection limit; try again later",
            },
            Some(_) => LedgerError::Rejected { location, detail, hint: "check the URL and the server's pg_hba.conf" },
            None if is_tls_failure(&detail) => {
                LedgerError::Unreachable { location, detail, hint: "check sslmode and sslrootcert in the URL" }
            }
            None => LedgerError::Unreachable { location, detail, hint: UNREACHABLE_HINT },
        }
    })
}

/// The driver's message with its cause chain (tokio-postgres keeps the I/O or TLS reason in the
/// source), and the server's detail for database errors.
fn db_message(error: &::postgres::Error) -> String {
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

fn is_active_index_violation(error: &::postgres::Error) -> bool {
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
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(byte) = text.get(i + 1..i + 3).and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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
        if self.verification == Verification::EncryptOnly {
            let verifier = EncryptOnly(provider.signature_verification_algorithms);
            return Ok(builder.dangerous().with_custom_certificate_verifier(Arc::new(verifier)).with_no_client_auth());
        }
        let roots = Arc::new(self.roots()?);
        if self.verification == Verification::Full {
            return Ok(builder.with_root_certificates(roots).with_no_client_auth());
        }
        let inner = WebPkiServerVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|e| format!("TLS setup: {e}"))?;
        Ok(builder.dangerous().with_custom_certificate_verifier(Arc::new(ChainOnly(inner))).with_no_client_auth())
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

/// libpq's `require`: the session is encrypted, the certificate is not checked (signatures in the
/// handshake still are).
#[derive(Debug)]
struct EncryptOnly(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// libpq's `verify-ca`: the chain must verify; a name mismatch is accepted.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
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
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

const FAMILY_SQL: &str = "COALESCE((SELECT family FROM benchmark_families WHERE benchmark = $1), $1)";

fn family_of(client: &mut impl Queries, benchmark: &str) -> Step<String> {
    let rows = client.typed(&format!("SELECT {FAMILY_SQL}"), &[(&benchmark, Type::TEXT)])?;
    Ok(rows[0].try_get(0)?)
}

/// `query_typed` on a client or a transaction alike.
trait Queries {
    fn typed(&mut self, sql: &str, params: &[Param<'_>]) -> std::result::Result<Vec<Row>, ::postgres::Error>;
}

impl Queries for Client {
    fn typed(&mut self, sql: &str, params: &[Param<'_>]) -> std::result::Result<Vec<Row>, ::postgres::Error> {
        self.query_typed(sql, params)
    }
}

impl Queries for Transaction<'_> {
    fn typed(&mut self, sql: &str, params: &[Param<'_>]) -> std::result::Result<Vec<Row>, ::postgres::Error> {
        self.query_typed(sql, params)
    }
}

/// SQL NULL for an absent or JSON-null value: "no metrics" is one state, not two.
fn json_param(value: Option<&Value>) -> Option<&Value> {
    value.filter(|v| !v.is_null())
}

impl Ledger for PgLedger {
    fn location(&self) -> &str {
        &self.location
    }

    fn ping(&self) -> Result<()> {
        self.with_client("ping", |client| Ok(client.batch_execute("SELECT 1")?))
    }

    fn schema_version(&self) -> Result<i64> {
        self.with_client("read the schema version", |client| {
            let rows = client.query_typed("SELECT COALESCE(MAX(version), 0)::int8 FROM schema_migrations", &[])?;
            Ok(rows[0].try_get(0)?)
        })
    }

    fn family_of(&self, benchmark: &str) -> Result<String> {
        self.with_client("look up a benchmark family", |client| family_of(client, benchmark))
    }

    fn set_family(&self, benchmark: &str, family: &str) -> Result<()> {
        self.in_transaction("set a benchmark family", |tx| {
            // A rare admin change: block concurrent inserts so the clash check below stays true
            // until commit.
            tx.batch_execute("LOCK TABLE attempts IN SHARE ROW EXCLUSIVE MODE")?;
            let args: [Param<'_>; 2] = [(&benchmark, Type::TEXT), (&family, Type::TEXT)];
            let clash = tx.query_typed(
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
                    model: row.try_get(0)?,
                    family: family.to_string(),
                    existing_id: AttemptId(row.try_get(1)?),
                }
                .into());
            }
            tx.execute_typed(
                "INSERT INTO benchmark_families (benchmark, family) VALUES ($1, $2)
                 ON CONFLICT (benchmark) DO UPDATE SET family = excluded.family",
                &args,
            )?;
            tx.execute_typed(
                "UPDATE attempts SET benchmark_family = $2, updated_at = now()
                 WHERE benchmark = $1 AND benchmark_family <> $2",
                &args,
            )?;
            Ok(())
        })
    }

    fn families(&self) -> Result<Vec<(String, String)>> {
        self.with_client("list benchmark families", |client| {
            client
                .query_typed("SELECT benchmark, family FROM benchmark_families ORDER BY benchmark", &[])?
                .iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                .collect()
        })
    }

    fn insert_pending(&self, new: &NewAttempt) -> Result<AttemptId> {
        let sql = format!(
            "INSERT INTO attempts (model, benchmark, benchmark_family, cluster, username, run_tag, status, reason,
                                   config, attempt, submitted_at, updated_at)
             SELECT $2, $1, f.family, $3, $4, $5, 'pending', $6, $7,
                    (SELECT COALESCE(MAX(attempt), 0) + 1 FROM attempts WHERE model = $2 AND benchmark_family = f.family),
                    now(), now()
             FROM (SELECT {FAMILY_SQL} AS family) f
             RETURNING id, benchmark_family"
        );
        self.with_client("insert a pending attempt", |client| {
            // A violation whose active row is gone by the time we look (it just ended) is retried.
            for _ in 0..3 {
                let inserted = client.query_typed(
                    &sql,
                    &[
                        (&new.benchmark, Type::TEXT),
                        (&new.model, Type::TEXT),
                        (&new.cluster, Type::TEXT),
                        (&new.username, Type::TEXT),
                        (&new.run_tag, Type::TEXT),
                        (&new.reason, Type::TEXT),
                        (&new.config, Type::JSONB),
                    ],
                );
                match inserted {
                    Ok(rows) => return Ok(AttemptId(rows[0].try_get(0)?)),
                    Err(e) if is_active_index_violation(&e) => {
                        let family = family_of(client, &new.benchmark)?;
                        if let Some(error) = self.already_active(client, &new.model, &family)? {
                            return Err(error.into());
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Err(LedgerError::Backend {
                location: self.location.clone(),
                operation: "insert a pending attempt",
                detail: "the pair's active attempt kept changing; try again".into(),
            }
            .into())
        })
    }

    fn set_job_id(&self, id: AttemptId, slurm_job_id: &str) -> Result<()> {
        self.with_client("set a Slurm job id", |client| {
            let updated = client.execute_typed(
                "UPDATE attempts SET slurm_job_id = $2, updated_at = now()
                 WHERE id = $1 AND (slurm_job_id IS NULL OR slurm_job_id = $2)",
                &[(&id.0, Type::INT8), (&slurm_job_id, Type::TEXT)],
            )?;
            if updated == 1 {
                return Ok(());
            }
            let rows = client.query_typed("SELECT slurm_job_id FROM attempts WHERE id = $1", &[(&id.0, Type::INT8)])?;
            Err(match rows.first() {
                None => LedgerError::NotFound { location: self.location.clone(), id },
                Some(row) => LedgerError::JobIdConflict {
                    location: self.location.clone(),
                    id,
                    existing: row.try_get::<_, Option<String>>(0)?.unwrap_or_default(),
                    requested: slurm_job_id.to_string(),
                },
            }
            .into())
        })
    }

    fn transition(&self, id: AttemptId, to: Status, reason: &str, metrics: Option<&Value>) -> Result<()> {
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
            sql_status_list(&Status::sources_of(to))
        );
        let status = to.as_str();
        let update_metrics = metrics.is_some();
        let metrics = json_param(metrics);
        self.with_client("change an attempt's status", |client| {
            let updated = client.execute_typed(
                &sql,
                &[
                    (&id.0, Type::INT8),
                    (&status, Type::TEXT),
                    (&reason, Type::TEXT),
                    (&update_metrics, Type::BOOL),
                    (&metrics, Type::JSONB),
                ],
            )?;
            if updated == 1 {
                return Ok(());
            }
            let rows = client.query_typed("SELECT status FROM attempts WHERE id = $1", &[(&id.0, Type::INT8)])?;
            Err(match rows.first() {
                None => LedgerError::NotFound { location: self.location.clone(), id },
                Some(row) => LedgerError::IllegalTransition {
                    location: self.location.clone(),
                    id,
                    from: row.try_get::<_, String>(0)?.parse().map_err(|e| self.corrupt(e))?,
                    to,
                },
            }
            .into())
        })
    }

    fn mark_resumable(&self, id: AttemptId) -> Result<()> {
        self.with_client("mark an attempt resumable", |client| {
            let updated = client.execute_typed(
                "UPDATE attempts SET resumable = 1, updated_at = now() WHERE id = $1 AND status = 'failed'",
                &[(&id.0, Type::INT8)],
            )?;
            if updated == 1 {
                return Ok(());
            }
            let rows = client.query_typed("SELECT status FROM attempts WHERE id = $1", &[(&id.0, Type::INT8)])?;
            Err(match rows.first() {
                None => LedgerError::NotFound { location: self.location.clone(), id },
                Some(row) => LedgerError::IllegalTransition {
                    location: self.location.clone(),
                    id,
                    from: row.try_get::<_, String>(0)?.parse().map_err(|e| self.corrupt(e))?,
                    to: Status::Failed,
                },
            }
            .into())
        })
    }

    fn attempt(&self, id: AttemptId) -> Result<Option<Attempt>> {
        self.with_client("read an attempt", |client| {
            Ok(self.attempts_where(client, "id = $1", &[(&id.0, Type::INT8)])?.pop())
        })
    }

    fn attempts_for(&self, model: &str, family: &str) -> Result<Vec<Attempt>> {
        self.with_client("read a pair's attempts", |client| {
            let condition = format!("model = $2 AND benchmark_family = {FAMILY_SQL}");
            self.attempts_where(client, &condition, &[(&family, Type::TEXT), (&model, Type::TEXT)])
        })
    }

    fn latest_per_pair(&self) -> Result<Vec<PairState>> {
        self.with_client("read the latest attempt per pair", |client| {
            let sql = format!(r#"{LATEST_PER_PAIR_SQL} ORDER BY a.model COLLATE "C", a.benchmark_family COLLATE "C""#);
            client
                .query_typed(&sql, &[])?
                .iter()
                .map(|row| {
                    let latest = self.parse_attempt(row)?;
                    let failed: i64 = row.try_get(17)?;
                    let total: i64 = row.try_get(18)?;
                    let resumable: i32 = row.try_get(19)?;
                    Ok(PairState {
                        model: latest.model.clone(),
                        family: latest.benchmark_family.clone(),
                        latest,
                        failed_attempts: u32::try_from(failed).unwrap_or(u32::MAX),
                        total_attempts: u32::try_from(total).unwrap_or(u32::MAX),
                        latest_resumable: resumable == 1,
                    })
                })
                .collect()
        })
    }

    fn active(&self) -> Result<Vec<Attempt>> {
        self.with_client("read active attempts", |client| {
            self.attempts_where(client, "status IN ('pending', 'started')", &[])
        })
    }

    fn find_by_run_tag(&self, run_tag: &str) -> Result<Vec<Attempt>> {
        self.with_client("find attempts by run tag", |client| {
            self.attempts_where(client, "run_tag = $1", &[(&run_tag, Type::TEXT)])
        })
    }

    fn import_attempts(&self, rows: &[ImportedAttempt]) -> Result<usize> {
        let started = std::time::Instant::now();
        let imported = self.in_transaction("import attempts", |tx| {
            // A bulk admin operation: hold off concurrent inserts so the active-pair check holds.
            tx.batch_execute("LOCK TABLE attempts IN SHARE ROW EXCLUSIVE MODE")?;
            let families: HashMap<String, String> = tx
                .query_typed("SELECT benchmark, family FROM benchmark_families", &[])?
                .iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                .collect::<Step<_>>()?;
            let family_of = |benchmark: &str| families.get(benchmark).cloned().unwrap_or_else(|| benchmark.to_string());

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
        })?;
        tracing::debug!("import: committed at {:.2} s", started.elapsed().as_secs_f64());
        // After a bulk load, statistics and the visibility map lag until autovacuum comes by; until
        // then the planner's index-only scans visit the heap (≈4× slower at 100k rows). Do it now.
        // The rows are committed either way, so a failure here (not the table's owner) only warns.
        if imported >= VACUUM_AFTER_ROWS
            && let Err(error) =
                self.with_client("vacuum after import", |client| Ok(client.batch_execute("VACUUM (ANALYZE) attempts")?))
        {
            tracing::warn!("{error}");
        }
        Ok(imported)
    }

    fn add_model(&self, id: &str, base_model: Option<&str>) -> Result<bool> {
        let size = size_class(id);
        self.with_client("add a model", |client| {
            let added = client.execute_typed(
                "INSERT INTO models (id, size_class, registered_at, base_model) VALUES ($1, $2, now(), $3)
                 ON CONFLICT (id) DO NOTHING",
                &[(&id, Type::TEXT), (&size, Type::TEXT), (&base_model, Type::TEXT)],
            )? == 1;
            if !added && base_model.is_some() {
                client.execute_typed(
                    "UPDATE models SET base_model = $2 WHERE id = $1",
                    &[(&id, Type::TEXT), (&base_model, Type::TEXT)],
                )?;
            }
            Ok(added)
        })
    }

    fn add_models(&self, models: &[(String, Option<String>)]) -> Result<usize> {
        let ids: Vec<&str> = models.iter().map(|(id, _)| id.as_str()).collect();
        let sizes: Vec<Option<String>> = models.iter().map(|(id, _)| size_class(id)).collect();
        let bases: Vec<Option<&str>> = models.iter().map(|(_, base)| base.as_deref()).collect();
        self.in_transaction("add models", |tx| {
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
    }

    fn list_models(&self) -> Result<Vec<Model>> {
        self.with_client("list models", |client| {
            client
                .query_typed(
                    "SELECT id, size_class, registered_at, base_model FROM models ORDER BY registered_at, id",
                    &[],
                )?
                .iter()
                .map(|row| {
                    Ok(Model {
                        id: row.try_get(0)?,
                        size_class: row.try_get(1)?,
                        registered_at: row.try_get(2)?,
                        base_model: row.try_get(3)?,
                    })
                })
                .collect()
        })
    }

    fn unevaluated(&self, family: &str, size_class: Option<&str>) -> Result<Vec<String>> {
        let rows = self.with_client("list unevaluated models", |client| {
            let sql = format!(
                "SELECT m.id, m.base_model FROM models m
                 WHERE NOT EXISTS (SELECT 1 FROM attempts a
                                   WHERE a.model = m.id AND a.benchmark_family = {FAMILY_SQL}
                                     AND a.status = 'finished')
                 ORDER BY m.registered_at, m.id"
            );
            client
                .query_typed(&sql, &[(&family, Type::TEXT)])?
                .iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                .collect::<Step<Vec<(String, Option<String>)>>>()
        })?;
        Ok(filter_by_size(rows, size_class))
    }

    fn record_heartbeat(&self, cluster: &str, submitter: &str, stale_after_s: u64) -> Result<()> {
        let bound = i64::try_from(stale_after_s).unwrap_or(i64::MAX);
        self.with_client("record a heartbeat", |client| {
            client.execute_typed(
                "INSERT INTO heartbeats (cluster, submitter, refreshed_at, stale_after_s) VALUES ($1, $2, now(), $3)
                 ON CONFLICT (cluster, submitter) DO UPDATE
                 SET refreshed_at = excluded.refreshed_at, stale_after_s = excluded.stale_after_s",
                &[(&cluster, Type::TEXT), (&submitter, Type::TEXT), (&bound, Type::INT8)],
            )?;
            Ok(())
        })
    }

    fn heartbeats(&self) -> Result<Vec<Heartbeat>> {
        self.with_client("read heartbeats", |client| {
            client
                .query_typed(
                    "SELECT cluster, submitter, refreshed_at, stale_after_s,
                            GREATEST(0, EXTRACT(EPOCH FROM now() - refreshed_at))::int8
                     FROM heartbeats ORDER BY cluster, submitter",
                    &[],
                )?
                .iter()
                .map(|row| {
                    Ok(Heartbeat {
                        cluster: row.try_get(0)?,
                        submitter: row.try_get(1)?,
                        refreshed_at: row.try_get(2)?,
                        stale_after_s: u64::try_from(row.try_get::<_, i64>(3)?).unwrap_or(0),
                        age_s: u64::try_from(row.try_get::<_, i64>(4)?).unwrap_or(0),
                    })
                })
                .collect()
        })
    }

    fn imported(&self, source: &str) -> Result<Vec<ImportedState>> {
        let prefix = format!("{source}#");
        self.with_client("read imported attempts", |client| {
            client
                .query_typed(
                    "SELECT id, source_id, status, metrics IS NOT NULL AND metrics != 'null'::jsonb, slurm_job_id
                     FROM attempts WHERE source_id IS NOT NULL AND left(source_id, length($1)) = $1",
                    &[(&prefix, Type::TEXT)],
                )?
                .iter()
                .map(|row| {
                    let status: String = row.try_get(2)?;
                    Ok(ImportedState {
                        id: AttemptId(row.try_get(0)?),
                        source_id: row.try_get(1)?,
                        status: status.parse().map_err(|e| self.corrupt(e))?,
                        has_metrics: row.try_get(3)?,
                        slurm_job_id: row.try_get(4)?,
                    })
                })
                .collect()
        })
    }

    fn update_imported(&self, updates: &[(AttemptId, ImportedAttempt)]) -> Result<usize> {
        self.in_transaction("update imported attempts", |tx| {
            let mut changed = 0;
            for (id, row) in updates {
                let result = tx.execute_typed(
                    "UPDATE attempts SET status = $2, reason = $3, metrics = $4, slurm_job_id = $5, submitted_at = $6,
                                         started_at = $7, ended_at = $8, config = $9, updated_at = now()
                     WHERE id = $1 AND source_id IS NOT NULL",
                    &[
                        (&id.0, Type::INT8),
                        (&row.status.as_str(), Type::TEXT),
                        (&row.reason, Type::TEXT),
                        (&json_param(row.metrics.as_ref()), Type::JSONB),
                        (&row.slurm_job_id, Type::TEXT),
                        (&row.submitted_at, Type::TIMESTAMPTZ),
                        (&row.started_at, Type::TIMESTAMPTZ),
                        (&row.ended_at, Type::TIMESTAMPTZ),
                        (&row.config, Type::JSONB),
                    ],
                );
                match result {
                    Ok(n) => changed += usize::try_from(n).unwrap_or(0),
                    // The transaction is aborted now, so the holder cannot be looked up.
                    Err(error) if is_active_index_violation(&error) => {
                        return Err(LedgerError::InvalidImport {
                            location: self.location.clone(),
                            detail: format!("{} on {} would have two active attempts", row.model, row.benchmark),
                        }
                        .into());
                    }
                    Err(error) => return Err(error.into()),
                }
            }
            Ok(changed)
        })
    }

    fn import_watermark(&self, source: &str) -> Result<Option<Timestamp>> {
        self.with_client("read the import watermark", |client| {
            let rows = client
                .query_typed("SELECT watermark FROM import_sources WHERE source = $1", &[(&source, Type::TEXT)])?;
            Ok(rows.first().map(|row| row.try_get::<_, Option<Timestamp>>(0)).transpose()?.flatten())
        })
    }

    fn set_import_watermark(&self, source: &str, watermark: Option<Timestamp>) -> Result<()> {
        self.with_client("record the import watermark", |client| {
            client.execute_typed(
                "INSERT INTO import_sources (source, watermark, imported_at) VALUES ($1, $2, now())
                 ON CONFLICT (source) DO UPDATE SET watermark = excluded.watermark, imported_at = excluded.imported_at",
                &[(&source, Type::TEXT), (&watermark, Type::TIMESTAMPTZ)],
            )?;
            Ok(())
        })
    }
}

/// Every row in one binary `COPY … FROM STDIN`: no statement per row or chunk, no arrays to unpack
/// on the server (an `INSERT … SELECT FROM unnest(…)` per 10k rows took twice as long at 100k rows).
/// `updated_at` is the transaction's `now()`, the server's clock as for every other write.
fn insert_rows(tx: &mut Transaction<'_>, rows: &[ImportedAttempt], numbers: &[(String, u32)]) -> Step<()> {
    let now: DateTime<Utc> = tx.query_typed("SELECT now()", &[])?[0].try_get(0)?;
    let writer = tx.copy_in(
        "COPY attempts (model, benchmark, benchmark_family, cluster, username, run_tag, slurm_job_id, status,
                        reason, config, metrics, attempt, submitted_at, started_at, ended_at, updated_at, source_id)
         FROM STDIN (FORMAT binary)",
    )?;
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
    let mut writer = ::postgres::binary_copy::BinaryCopyInWriter::new(writer, &types);
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
