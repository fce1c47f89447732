//! The results ledger (docs/design.md §7.2): one row per submission attempt, the model catalogue and the
//! benchmark families, behind one [`Ledger`] trait with two backends and one schema — an embedded
//! SQLite file (the default, nothing to run) and PostgreSQL by URL (shared by submitters on several
//! clusters; Supabase's TLS connection strings work).
//!
//! The guarantee dedup rests on lives in the schema, not in this code: a unique partial index
//! allows at most one active (pending or started) attempt per (model, benchmark family), so of two
//! submitters racing on one pair exactly one inserts and the other gets
//! [`LedgerError::AlreadyActive`]. Every error fails closed: nothing here turns a database problem
//! into "no previous attempt" (the replaced system's fail-open bug, ot-agent §2.4).
//!
//! Open a ledger with [`open_ledger`]: `sqlite:PATH`, a plain `PATH`, or a `postgres://` /
//! `postgresql://` URL. Migrations run on open. Messages and `Debug` output never contain the
//! password of a URL ([`redact_url`]).

mod bounded;
mod migrations;
mod postgres;
mod sql;
mod sqlite;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use self::bounded::{Client as PgClient, Param as PgParam, Statements as PgStatements};
pub use self::migrations::latest_version as latest_schema_version;
pub use self::postgres::{Connection as PgConnection, LEDGER_CALL_BOUND, PgLedger, Redactor};
pub use self::sqlite::SqliteLedger;
/// The attempt lifecycle is a domain type (`crate::domain`); the ledger stores it.
pub use crate::domain::{AttemptStatus, RemediationAct};

/// Every timestamp in the ledger: a UTC instant with microsecond resolution (PostgreSQL's), stored
/// as `timestamptz` there and as fixed-width RFC 3339 text (`2026-01-02T03:04:05.000006Z`) in SQLite.
pub(crate) type Timestamp = DateTime<Utc>;

/// The file name of the default ledger inside a cluster's state dir.
pub(crate) const DEFAULT_FILE_NAME: &str = "ledger.sqlite";

/// Benchmarks that count as one benchmark for dedup, seeded by the first migration (the old
/// `duplicate_of`, docs/design.md §7.2). A benchmark not listed is its own family.
pub const DEFAULT_FAMILIES: &[(&str, &str)] = &[
    ("dev_set_v2", "dev_set_v2"),
    ("DCAgent_dev_set_v2", "dev_set_v2"),
    ("dev_set_v2_2.0x", "dev_set_v2"),
    ("openthoughts-tblite", "dev_set_v2"),
];

pub type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// The ledger API both backends implement. Sync on purpose: the submitter is a sync program.
/// Every method is one short transaction; the backends serialise calls on their one connection.
pub trait Ledger: Send + Sync {
    /// Where this ledger lives, safe to print (no password).
    fn location(&self) -> &str;

    /// A round trip to the database.
    fn ping(&self) -> Result<()>;

    /// The schema version applied (after open, always [`latest_schema_version`]).
    fn schema_version(&self) -> Result<i64>;

    /// The family `benchmark` counts toward: its `benchmark_families` row, else itself.
    fn family_of(&self, benchmark: &str) -> Result<String>;

    /// Maps `benchmark` to `family` and moves its existing attempts along, so dedup sees them
    /// under the new family. Refused with [`LedgerError::AlreadyActive`] when that would leave two
    /// active attempts on one pair.
    fn set_family(&self, benchmark: &str, family: &str) -> Result<()>;

    /// All `(benchmark, family)` rows, by benchmark.
    fn families(&self) -> Result<Vec<(String, String)>>;

    /// Records a new `pending` attempt — before `sbatch`, so a crash leaves a row to repair rather
    /// than a job nobody knows about. Its family and attempt number are resolved here, in the same
    /// transaction. Fails with [`LedgerError::AlreadyActive`] when the pair has an active attempt.
    fn insert_pending(&self, new: &NewAttempt) -> Result<AttemptId>;

    /// Sets the Slurm job id once `sbatch` answered. Setting the same id again is a no-op; a
    /// different one is [`LedgerError::JobIdConflict`]; an id another attempt of the same cluster
    /// already holds is [`LedgerError::JobIdTaken`] (job ids are unique per cluster).
    fn set_job_id(&self, id: AttemptId, slurm_job_id: &str) -> Result<()>;

    /// Moves an attempt to `to` with `reason`. `started` stamps `started_at`, a terminal status
    /// stamps `ended_at` (each only once). `metrics: None` leaves them unchanged;
    /// `Some(&Value::Null)` clears them. Re-entering the current status updates reason and metrics;
    /// anything [`AttemptStatus::can_become`] forbids is [`LedgerError::IllegalTransition`].
    fn transition(&self, id: AttemptId, to: AttemptStatus, reason: &str, metrics: Option<&Value>) -> Result<()>;

    /// Marks a failed attempt as resumable (it ended by the walltime): the planner continues it and
    /// it no longer counts toward the pair's failures. Anything but a failed attempt is
    /// [`LedgerError::IllegalTransition`] (or [`LedgerError::NotFound`]).
    fn mark_resumable(&self, id: AttemptId) -> Result<()>;

    /// Records what the attempt's job spent on its GPUs (the `gpu_seconds` document of
    /// migration 5, built by `crate::gpuhours`); replaces an earlier record. Unknown id:
    /// [`LedgerError::NotFound`].
    fn record_gpu_seconds(&self, id: AttemptId, record: &Value) -> Result<()>;

    /// Every attempt with a GPU-seconds record, by id.
    fn gpu_seconds(&self) -> Result<Vec<GpuSecondsRow>>;

    /// Records an attempt's per-trial facts and the Harbor that produced them (migration 7),
    /// replacing an earlier record whole. Unknown id: [`LedgerError::NotFound`].
    fn record_trials(&self, id: AttemptId, set: &TrialSet) -> Result<()>;

    /// An attempt's per-trial facts, tasks in byte order then attempt; `None` when none recorded.
    fn trials(&self, id: AttemptId) -> Result<Option<TrialSet>>;

    /// One attempt by id.
    fn attempt(&self, id: AttemptId) -> Result<Option<Attempt>>;

    /// Every attempt of (model, family), every agent's, oldest first. `family` may also be a member
    /// benchmark's name.
    fn attempts_for(&self, model: &str, family: &str) -> Result<Vec<Attempt>>;

    /// For every (model, family, agent) with attempts — a pair, per agent — the latest (by
    /// `submitted_at`, then id) with the pair's failed (since its last release) and total counts, ordered by model, family,
    /// agent (byte order). One query, the planner's input.
    fn latest_per_pair(&self) -> Result<Vec<PairState>>;

    /// The pending and started attempts (what sync reconciles with Slurm), oldest first.
    fn active(&self) -> Result<Vec<Attempt>>;

    /// `cluster`'s attempts failed as vanished (reason starting [`crate::domain::VANISHED`]) that
    /// ended at or after `since`, oldest first: sync looks for their late final records.
    fn vanished(&self, cluster: &str, since: Timestamp) -> Result<Vec<Attempt>>;

    /// The one way out of a terminal status: a vanished attempt whose final record came late and
    /// says it finished becomes `finished` with `reason` and `metrics`. Anything but a vanished
    /// attempt is [`LedgerError::IllegalTransition`].
    fn finish_vanished(&self, id: AttemptId, reason: &str, metrics: Option<&Value>) -> Result<()>;

    /// Attempts with this run tag, oldest first (crash repair: the row exists, the job id not).
    fn find_by_run_tag(&self, run_tag: &str) -> Result<Vec<Attempt>>;

    /// Bulk-inserts historical attempts in one transaction (migrating an old ledger; benchmarks).
    /// Families and attempt numbers are assigned as for [`Ledger::insert_pending`], in
    /// `submitted_at` order; the one-active-per-pair rule holds. Returns the rows inserted.
    fn import_attempts(&self, rows: &[ImportedAttempt]) -> Result<usize>;

    /// Adds a model to the catalogue (size class from its id's size token). Idempotent: `Ok(false)`
    /// when it was already there; a given `base_model` then fills in or replaces the known one.
    fn add_model(&self, id: &str, base_model: Option<&str>) -> Result<bool>;

    /// [`Ledger::add_model`] for many models in one transaction (an import). Returns how many were new.
    fn add_models(&self, models: &[(String, Option<String>)]) -> Result<usize>;

    /// The catalogue in registration order.
    fn list_models(&self) -> Result<Vec<Model>>;

    /// Catalogue models with no `finished` attempt in `family` (a member benchmark's name resolves
    /// to its family), optionally of one size class (`"8"`, `"32"`: bands, see [`size_matches`]),
    /// in registration order.
    fn unevaluated(&self, family: &str, size_class: Option<&str>) -> Result<Vec<String>>;

    /// Records that `submitter` has just reconciled `cluster`'s attempts with that cluster's Slurm,
    /// and the bound (seconds) after which submitters elsewhere flag them as unattended.
    fn record_heartbeat(&self, cluster: &str, submitter: &str, stale_after_s: u64) -> Result<()>;

    /// Every heartbeat, with its age by the ledger's clock.
    fn heartbeats(&self) -> Result<Vec<Heartbeat>>;

    /// The imported attempts of `source` (their `source_id` starts with `<source>#`).
    fn imported(&self, source: &str) -> Result<Vec<ImportedState>>;

    /// Rewrites imported attempts in place from their source (status, reason, metrics, times, job
    /// id): the source is the truth for them, so the lifecycle rules of [`Ledger::transition`] do
    /// not apply. An update that would give a pair a second active attempt is refused.
    fn update_imported(&self, updates: &[(AttemptId, ImportedAttempt)]) -> Result<usize>;

    /// Where the last import of `source` stopped (None: never imported).
    fn import_watermark(&self, source: &str) -> Result<Option<Timestamp>>;

    /// Records an import of `source` up to `watermark`.
    fn set_import_watermark(&self, source: &str, watermark: Option<Timestamp>) -> Result<()>;

    /// Records one act of the remediation loop (stamped by the ledger's clock). `Ok(false)` when
    /// the attempt already has one (another loop judged the same job first): nothing is written.
    fn record_remediation(&self, new: &NewRemediation) -> Result<bool>;

    /// Every remediation record, oldest first (what plan, status and the loop fold per pair).
    fn remediations(&self) -> Result<Vec<Remediation>>;
}

/// What the remediation loop did, or a person's release (`attempt: None`, action `release`).
#[derive(Debug, Clone, PartialEq)]
pub struct NewRemediation {
    pub model: String,
    pub family: String,
    pub agent: String,
    pub cluster: String,
    pub attempt: Option<AttemptId>,
    /// The diagnosis that caused it (`release` for a release).
    pub finding: String,
    /// `cancel`, `retry`, `hold` or `release`.
    pub action: crate::domain::RemediationAct,
    /// The change in words (`serve.gpu_memory_utilization 0.90 → 0.85`), empty for none.
    pub change: String,
    /// For a retry: the pair's whole adjustment after it.
    pub adjustment: Option<crate::domain::PairAdjustment>,
    pub reason: String,
    pub username: String,
}

/// One row of `remediations`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Remediation {
    pub id: i64,
    pub model: String,
    pub family: String,
    pub agent: String,
    pub cluster: String,
    pub attempt: Option<AttemptId>,
    pub finding: String,
    pub action: crate::domain::RemediationAct,
    pub change: String,
    pub adjustment: Option<crate::domain::PairAdjustment>,
    pub reason: String,
    pub username: String,
    pub created_at: Timestamp,
}

/// A pair's remediation state, folded from its records (pure): held or not, the adjustment its
/// next launch gets, how many retries since the last release.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PairRemedy {
    /// The hold in force (its record), if any.
    pub held: Option<Remediation>,
    pub adjustment: crate::domain::PairAdjustment,
    pub retries: u32,
    /// The attempts already acted on.
    pub(crate) acted_on: std::collections::BTreeSet<i64>,
}

/// Folds remediation records (oldest first) into each pair's state, keyed by (model, family, agent).
/// A release starts the pair afresh: no hold, no adjustment, no retry counted.
pub fn fold_remediations(records: &[Remediation]) -> HashMap<(String, String, String), PairRemedy> {
    let mut pairs: HashMap<(String, String, String), PairRemedy> = HashMap::new();
    for r in records {
        let state = pairs.entry((r.model.clone(), r.family.clone(), r.agent.clone())).or_default();
        if let Some(a) = r.attempt {
            state.acted_on.insert(a.0);
        }
        match r.action {
            RemediationAct::Release => {
                let acted_on = std::mem::take(&mut state.acted_on);
                *state = PairRemedy { acted_on, ..PairRemedy::default() };
            }
            RemediationAct::Hold => state.held = Some(r.clone()),
            RemediationAct::Retry => {
                state.retries += 1;
                if let Some(adjustment) = &r.adjustment {
                    state.adjustment = adjustment.clone();
                }
            }
            RemediationAct::Cancel => {}
        }
    }
    pairs
}

/// One attempt's GPU-seconds record with what identifies it (`results`' totals count every
/// attempt, finished or not).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSecondsRow {
    pub id: AttemptId,
    pub model: String,
    pub benchmark: String,
    pub run_tag: String,
    pub status: AttemptStatus,
    pub record: Value,
}

/// An attempt's trials as sync read them from its run dir (`crate::stats` computes from these).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct TrialSet {
    /// From Harbor's job lock; `None` when the run dir did not say.
    pub harbor_version: Option<String>,
    pub trials: Vec<crate::stats::Trial>,
}

/// One submitter's heartbeat on one cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Heartbeat {
    pub cluster: String,
    pub submitter: String,
    pub(crate) refreshed_at: Timestamp,
    pub stale_after_s: u64,
    /// Seconds since `refreshed_at`, by the ledger's clock.
    pub age_s: u64,
}

impl Heartbeat {
    pub fn is_stale(&self) -> bool {
        self.age_s > self.stale_after_s
    }
}

/// An imported attempt as the ledger holds it (what an incremental import compares against).
#[derive(Debug, Clone, PartialEq)]
pub struct ImportedState {
    pub id: AttemptId,
    pub source_id: String,
    pub status: AttemptStatus,
    pub has_metrics: bool,
    pub slurm_job_id: Option<String>,
}

/// Opens (creating and migrating as needed) the ledger that `spec` names:
/// `sqlite:PATH`, a plain `PATH`, or a `postgres://…` / `postgresql://…` URL.
pub fn open_ledger(spec: &str) -> Result<Box<dyn Ledger>> {
    Ok(match LedgerSpec::parse(spec)? {
        LedgerSpec::Sqlite(path) => Box::new(SqliteLedger::open(&path)?),
        LedgerSpec::Postgres(url) => Box::new(PgLedger::connect(&url)?),
    })
}

/// The file a SQLite ledger spec names (`None` for PostgreSQL or an unparsable spec), so a
/// read-only command can see that it does not exist before opening would create it.
pub(crate) fn sqlite_file(spec: &str) -> Option<PathBuf> {
    match LedgerSpec::parse(spec) {
        Ok(LedgerSpec::Sqlite(path)) if path.as_os_str() != ":memory:" => Some(path),
        _ => None,
    }
}

/// The default ledger of a cluster: [`DEFAULT_FILE_NAME`] in its state dir.
pub fn default_path(state_dir: &Path) -> PathBuf {
    state_dir.join(DEFAULT_FILE_NAME)
}

/// A parsed ledger spec. `Debug` and `Display` show the redacted location only.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum LedgerSpec {
    Sqlite(PathBuf),
    /// The full URL as given; it may hold a password, so it is never printed.
    Postgres(String),
}

impl LedgerSpec {
    pub(crate) fn parse(spec: &str) -> Result<Self> {
        let spec = spec.trim();
        let bad = |detail: &str| LedgerError::BadSpec { spec: redact_url(spec), detail: detail.to_string() };
        if spec.is_empty() {
            return Err(bad("empty"));
        }
        if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
            return Ok(LedgerSpec::Postgres(spec.to_string()));
        }
        if let Some(rest) = spec.strip_prefix("sqlite:") {
            // `sqlite:///abs/path` and `sqlite://rel` are accepted as well as `sqlite:PATH`.
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(bad("no path after sqlite:"));
            }
            return Ok(LedgerSpec::Sqlite(PathBuf::from(path)));
        }
        if let Some((scheme, _)) = spec.split_once("://") {
            return Err(bad(&format!("unknown scheme {scheme:?}")));
        }
        // A libpq keyword string (`host=db dbname=ledger user=me`) is PostgreSQL, never a file name.
        if starts_with_keyword(spec) {
            return keyword_string_url(spec).map(LedgerSpec::Postgres).map_err(|detail| LedgerError::BadSpec {
                spec: "a libpq keyword connection string".to_string(),
                detail,
            });
        }
        if spec.starts_with("postgres:") || spec.starts_with("postgresql:") {
            return Err(bad("a PostgreSQL URL starts with postgres:// (two slashes)"));
        }
        Ok(LedgerSpec::Sqlite(PathBuf::from(spec)))
    }

    /// Where the ledger is, safe to print: `sqlite:PATH` or `postgres://user@host:port/db`.
    pub(crate) fn location(&self) -> String {
        match self {
            LedgerSpec::Sqlite(path) => format!("sqlite:{}", path.display()),
            LedgerSpec::Postgres(url) => postgres_location(url),
        }
    }
}

impl fmt::Debug for LedgerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LedgerSpec({})", self.location())
    }
}

impl fmt::Display for LedgerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.location())
    }
}

/// The keywords libpq's connection strings know and the driver (`postgres::Config`) reads.
const LIBPQ_KEYWORDS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "options",
    "application_name",
    "sslmode",
    "sslrootcert",
    "connect_timeout",
    "keepalives",
    "keepalives_idle",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// Whether `spec` opens like `key=value` (`key` letters and `_`, spaces allowed around `=`): how a
/// libpq keyword string starts and a path never plainly does.
fn starts_with_keyword(spec: &str) -> bool {
    let key_end = spec.find(|c: char| !(c.is_ascii_alphabetic() || c == '_')).unwrap_or(spec.len());
    key_end > 0 && spec[key_end..].trim_start().starts_with('=')
}

/// The `key=value` pairs of a libpq keyword string: values bare (backslash escapes) or in single
/// quotes (`\'` and `\\` escaped), pairs separated by whitespace. Errors never quote a value.
fn keyword_pairs(spec: &str) -> std::result::Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut chars = spec.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| c.is_ascii_alphanumeric() || *c == '_') {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if key.is_empty() || chars.next() != Some('=') {
            return Err(format!("expected `keyword=value` after {} pair(s)", pairs.len()));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => return Err(format!("unterminated quote in the value of `{key}`")),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        if !LIBPQ_KEYWORDS.contains(&key.as_str()) {
            return Err(format!("unknown keyword `{key}` (known: {})", LIBPQ_KEYWORDS.join(", ")));
        }
        pairs.push((key, value));
    }
}

/// A libpq keyword string as the equivalent `postgres://` URL, so it goes the one way every ledger
/// URL goes (TLS settings, redaction, the printed location). User, a plain host, port and database
/// form the URL's body; the password and everything else become query parameters, which the driver
/// reads as the same keywords.
fn keyword_string_url(spec: &str) -> std::result::Result<String, String> {
    use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
    let encode = |text: &str| utf8_percent_encode(text, NON_ALPHANUMERIC).to_string();
    let pairs = keyword_pairs(spec)?;
    let get = |key: &str| pairs.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let plain_host =
        get("host").filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || ".-".contains(c)));
    let plain_port = get("port").filter(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
    let mut url = String::from("postgres://");
    if let Some(user) = get("user") {
        url += &format!("{}@", encode(user));
    }
    if let Some(host) = plain_host {
        url += host;
        if let Some(port) = plain_port {
            url += &format!(":{port}");
        }
    }
    url.push('/');
    if let Some(db) = get("dbname") {
        url += &encode(db);
    }
    let in_body = |key: &str| {
        key == "user"
            || key == "dbname"
            || (key == "host" && plain_host.is_some())
            || (key == "port" && plain_host.is_some() && plain_port.is_some())
    };
    let query: Vec<String> =
        pairs.iter().filter(|(k, _)| !in_body(k)).map(|(k, v)| format!("{k}={}", encode(v))).collect();
    if !query.is_empty() {
        url += &format!("?{}", query.join("&"));
    }
    Ok(url)
}

/// `url` with its password replaced by `***`, in the user-info part and in any `password=`
/// query parameter. User info runs to the last `@` before the query (or, when a pasted password
/// holds a raw `?`, the last `@` at all), so unencoded `@`, `/` or `?` in a password stay hidden.
///
/// Hand-written on purpose: a URL parser (`url`) splits such a pasted, not-quite-valid URL at the
/// first `/` or `@` and would print the rest of the password as host or path; redaction must hide
/// the password of exactly the URLs that are not valid.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return redact_password_params(url);
    };
    let (userinfo, after) = split_userinfo(rest);
    let userinfo = match userinfo.map(|info| info.split_once(':')) {
        Some(Some((user, _password))) => format!("{user}:***"),
        Some(None) => userinfo.unwrap_or_default().to_string(),
        None => String::new(),
    };
    let (host, query) = after.split_at(after.find('?').unwrap_or(after.len()));
    format!("{scheme}://{userinfo}{host}{}", redact_password_params(query))
}

/// Splits what follows `scheme://` into user info (without the `@`) and the rest (from the `@`).
fn split_userinfo(rest: &str) -> (Option<&str>, &str) {
    let head_end = rest.find('?').unwrap_or(rest.len());
    match rest[..head_end].rfind('@').or_else(|| rest.rfind('@')) {
        Some(at) => (Some(&rest[..at]), &rest[at..]),
        None => (None, rest),
    }
}

/// The password in a URL's user info, as written.
pub(crate) fn url_password(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    split_userinfo(rest).0?.split_once(':').map(|(_, password)| password)
}

fn redact_password_params(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("password=") {
        let at_param_start = pos == 0 || matches!(rest.as_bytes()[pos - 1], b'?' | b'&' | b' ');
        out.push_str(&rest[..pos + "password=".len()]);
        rest = &rest[pos + "password=".len()..];
        if at_param_start {
            out.push_str("***");
            rest = &rest[rest.find(['&', ' ']).unwrap_or(rest.len())..];
        }
    }
    out.push_str(rest);
    out
}

/// `postgres://user@host:port/db`: the redacted URL without password and query string.
fn postgres_location(url: &str) -> String {
    let redacted = redact_url(url);
    let without_query = redacted.split('?').next().unwrap_or(&redacted);
    without_query.replacen(":***@", "@", 1)
}

/// Scrubs every given secret (raw and percent-decoded password forms) out of a driver message.
pub(crate) fn scrub(message: impl fmt::Display, secrets: &[String]) -> String {
    let mut text = message.to_string();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        text = text.replace(secret.as_str(), "***");
    }
    // Driver messages can run over several lines (DETAIL/HINT); errors here are one line.
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An attempt's id (the `attempts.id` primary key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AttemptId(pub i64);

impl fmt::Display for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What the submitter knows when it is about to submit one (model, benchmark).
#[derive(Debug, Clone, PartialEq)]
pub struct NewAttempt {
    pub model: String,
    pub benchmark: String,
    pub cluster: String,
    pub username: String,
    pub run_tag: String,
    /// The Harbor agent it runs: with model and family, the eval's identity.
    pub agent: String,
    /// Why it is submitted (the dedup decision's reason).
    pub reason: String,
    /// The config actually used: timeout multiplier, harbor config, agent, overrides. Opaque here.
    pub config: Value,
}

/// One row of `attempts`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt {
    pub id: AttemptId,
    pub model: String,
    pub benchmark: String,
    pub benchmark_family: String,
    pub cluster: String,
    pub username: String,
    pub run_tag: String,
    pub slurm_job_id: Option<String>,
    pub status: AttemptStatus,
    pub reason: String,
    pub config: Value,
    /// Harbor's result summary, once finished (None when never set or cleared).
    pub metrics: Option<Value>,
    /// 1 for the pair's first attempt, 2 for the next, …
    pub attempt: u32,
    pub submitted_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    pub updated_at: Timestamp,
    /// The Harbor agent it ran ([`DEFAULT_AGENT`] for imported history).
    pub agent: String,
    /// `<source>#<row id>` for an attempt imported from the team's history (`plan` names the row
    /// as a skip's evidence), else None. Not in the JSON outputs.
    #[serde(skip)]
    pub source_id: Option<String>,
}

/// The agent of rows that name none: imported history, and every row before migration 4.
pub use launch_spec::spec::DEFAULT_AGENT;

/// A historical attempt for [`Ledger::import_attempts`].
#[derive(Debug, Clone, PartialEq)]
pub struct ImportedAttempt {
    pub model: String,
    pub benchmark: String,
    pub cluster: String,
    pub username: String,
    pub run_tag: String,
    pub slurm_job_id: Option<String>,
    pub status: AttemptStatus,
    pub reason: String,
    pub config: Value,
    pub metrics: Option<Value>,
    pub submitted_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    /// `<source>#<row id>` for an attempt imported from the team's history, else None.
    pub source_id: Option<String>,
}

/// The planner's view of one (model, family, agent).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairState {
    pub model: String,
    pub family: String,
    /// The Harbor agent: the same model and family under another agent is another pair.
    pub agent: String,
    pub latest: Attempt,
    /// Failed attempts, not counting those that ended by the walltime (resumable).
    pub failed_attempts: u32,
    pub total_attempts: u32,
    /// The latest attempt ended by the walltime (or was otherwise resumable): continue it.
    pub latest_resumable: bool,
}

/// One catalogue entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Model {
    pub id: String,
    /// The total size token (`"8"`, `"32"`, `"1.5"`), None when the id has none.
    pub size_class: Option<String>,
    pub registered_at: Timestamp,
    pub base_model: Option<String>,
}

/// The size class of a model id: its total size token as written without a trailing `.0`.
pub fn size_class(model: &str) -> Option<String> {
    crate::registry::size::total_size(model).map(|size| format!("{size}"))
}

/// Whether a model falls in size class `class`. `"8"` is the 8B class (total ≤ 14.5B), `"32"` the
/// 32B class (28–42B); MoE models count by their total size (`Qwen3-30B-A3B` → 32B class). Any other
/// number matches that exact total size. The size is the id's total size token, else the base
/// model's.
pub(crate) fn size_matches(class: &str, model: &str, base_model: Option<&str>) -> bool {
    use crate::registry::size::total_size;
    let Some(size) = total_size(model).or_else(|| base_model.and_then(total_size)) else { return false };
    match class.trim().trim_end_matches(['b', 'B']) {
        "8" => size <= 14.5,
        "32" => (28.0..=42.0).contains(&size),
        other => other.parse::<f64>().is_ok_and(|wanted| (wanted - size).abs() < 1e-9),
    }
}

/// Keeps the `(id, base_model)` rows of `class` (all when None), returning their ids in order.
pub(crate) fn filter_by_size(rows: Vec<(String, Option<String>)>, class: Option<&str>) -> Vec<String> {
    rows.into_iter()
        .filter(|(id, base)| class.is_none_or(|c| size_matches(c, id, base.as_deref())))
        .map(|(id, _)| id)
        .collect()
}

/// The current time at the ledger's resolution.
pub fn now() -> Timestamp {
    Utc::now().trunc_subsecs(6)
}

/// Ledger errors: one line each, naming the ledger (never with a password) and what to do.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error(
        "ledger spec {spec:?} not understood: {detail} — use sqlite:PATH, a file path, or postgres://user@host:port/db"
    )]
    BadSpec { spec: String, detail: String },

    #[error("ledger {location} unreachable: {detail} — {hint}")]
    Unreachable { location: String, detail: String, hint: &'static str },

    #[error("ledger {location} refused the connection: {detail} — {hint}")]
    Rejected { location: String, detail: String, hint: &'static str },

    #[error(
        "{model} already has an active attempt {existing_id} on benchmark family {family} — \
         let it finish, or cancel it first"
    )]
    AlreadyActive { model: String, family: String, existing_id: AttemptId },

    #[error("ledger {location}: no attempt {id}")]
    NotFound { location: String, id: AttemptId },

    #[error(
        "ledger {location}: attempt {id} cannot go from {from} to {to} — terminal statuses are final; submit a new attempt"
    )]
    IllegalTransition { location: String, id: AttemptId, from: AttemptStatus, to: AttemptStatus },

    #[error(
        "ledger {location}: attempt {id} already has Slurm job {existing}, not {requested} — one job per attempt row"
    )]
    JobIdConflict { location: String, id: AttemptId, existing: String, requested: String },

    #[error(
        "ledger {location}: Slurm job {job} is already attempt {holder}'s on this cluster, not attempt {id}'s — Slurm handed out a job id twice; attempt {id} is not bound to it"
    )]
    JobIdTaken { location: String, id: AttemptId, job: String, holder: AttemptId },

    #[error(
        "ledger {location} has schema version {found}, newer than this submitter's {supported} — upgrade submitter"
    )]
    SchemaTooNew { location: String, found: i64, supported: i64 },

    #[error("ledger {location}: migration {version} failed: {detail}")]
    Migration { location: String, version: i64, detail: String },

    #[error("ledger {location}: {operation} failed: {detail}")]
    Backend { location: String, operation: &'static str, detail: String },

    #[error("ledger {location}: import refused: {detail}")]
    InvalidImport { location: String, detail: String },

    #[error("ledger {location}: unreadable row: {detail} — was it written by another tool?")]
    Corrupt { location: String, detail: String },
}

/// `status IN (…)` for a fixed set of statuses (static names, no user input).
pub(crate) fn sql_status_list(statuses: &[AttemptStatus]) -> String {
    let quoted: Vec<String> = statuses.iter().map(|s| format!("'{}'", s.as_str())).collect();
    format!("({})", quoted.join(", "))
}

/// The attempt columns every attempt query selects, in the order the backends read them.
pub(crate) const ATTEMPT_COLUMNS: &str = "id, model, benchmark, benchmark_family, cluster, username, run_tag, \
     slurm_job_id, status, reason, config, metrics, attempt, submitted_at, started_at, ended_at, updated_at, agent, \
     source_id";

/// The planner's query, the same on both backends: per-pair counts from one covering scan of
/// `attempts_pair_status` (a failure counts only when no `submitter release` of its pair came after
/// its submission: a release starts the pair's failure bound afresh), then each pair's newest row by one probe of `attempts_pair_recency`.
/// (A window over all rows was 10–20× slower on SQLite: it drags every full row through the
/// window.) Each backend appends its ORDER BY, byte order on both.
pub(crate) const LATEST_PER_PAIR_SQL: &str = "\
    SELECT a.id, a.model, a.benchmark, a.benchmark_family, a.cluster, a.username, a.run_tag, a.slurm_job_id, \
           a.status, a.reason, a.config, a.metrics, a.attempt, a.submitted_at, a.started_at, a.ended_at, \
           a.updated_at, a.agent, a.source_id, pair.failed_attempts, pair.total_attempts, a.resumable \
    FROM (SELECT model, benchmark_family, agent, COUNT(*) AS total_attempts, \
                 SUM(CASE WHEN status = 'failed' AND resumable = 0 \
                               AND NOT EXISTS (SELECT 1 FROM remediations released \
                                               WHERE released.action = 'release' \
                                                     AND released.model = attempts.model \
                                                     AND released.benchmark_family = attempts.benchmark_family \
                                                     AND released.agent = attempts.agent \
                                                     AND released.created_at >= attempts.submitted_at) \
                          THEN 1 ELSE 0 END) AS failed_attempts \
          FROM attempts GROUP BY model, benchmark_family, agent) pair \
    JOIN attempts a ON a.id = (SELECT latest.id FROM attempts latest \
                               WHERE latest.model = pair.model AND latest.benchmark_family = pair.benchmark_family \
                                     AND latest.agent = pair.agent \
                               ORDER BY latest.submitted_at DESC, latest.id DESC LIMIT 1)";

/// Assigns families and attempt numbers for an import: per pair, continuing from what the ledger
/// already has, in `submitted_at` order. Returns, per input row, (family, attempt number). Refuses
/// a batch that itself holds two active attempts for one pair.
pub(crate) fn number_imports(
    location: &str,
    rows: &[ImportedAttempt],
    family_of: impl Fn(&str) -> String,
    mut existing_max: impl FnMut(&str, &str) -> Result<u32>,
) -> Result<Vec<(String, u32)>> {
    use std::collections::{HashMap, HashSet};
    let families: Vec<String> = rows.iter().map(|r| family_of(&r.benchmark)).collect();
    let mut active = HashSet::new();
    for (row, family) in rows.iter().zip(&families).filter(|(row, _)| row.status.is_active()) {
        if !active.insert((row.model.as_str(), family.as_str())) {
            return Err(LedgerError::InvalidImport {
                location: location.to_string(),
                detail: format!("two active attempts for {} on benchmark family {family}", row.model),
            });
        }
    }
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| rows[i].submitted_at); // stable: equal times keep input order
    let mut next: HashMap<(&str, &str), u32> = HashMap::new();
    let mut numbers = vec![0u32; rows.len()];
    for i in order {
        let key = (rows[i].model.as_str(), families[i].as_str());
        let counter = match next.get_mut(&key) {
            Some(counter) => counter,
            None => next.entry(key).or_insert(existing_max(key.0, key.1)?),
        };
        *counter += 1;
        numbers[i] = *counter;
    }
    Ok(families.into_iter().zip(numbers).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        assert_eq!(LedgerSpec::parse("sqlite:/x/l.sqlite").unwrap(), LedgerSpec::Sqlite("/x/l.sqlite".into()));
        assert_eq!(LedgerSpec::parse("sqlite:///x/l.sqlite").unwrap(), LedgerSpec::Sqlite("/x/l.sqlite".into()));
        assert_eq!(LedgerSpec::parse("state/ledger.sqlite").unwrap(), LedgerSpec::Sqlite("state/ledger.sqlite".into()));
        assert!(matches!(LedgerSpec::parse("postgresql://u@h/db").unwrap(), LedgerSpec::Postgres(_)));
        assert!(matches!(LedgerSpec::parse("mysql://u:pw@h/db"), Err(LedgerError::BadSpec { .. })));
        assert!(matches!(LedgerSpec::parse(" "), Err(LedgerError::BadSpec { .. })));
        let err = LedgerSpec::parse("mysql://u:placeholder-pw@h/db").unwrap_err().to_string();
        assert!(!err.contains("placeholder-pw"), "{err}");
        assert!(matches!(LedgerSpec::parse("postgres:/h/db"), Err(LedgerError::BadSpec { .. })));
        assert_eq!(LedgerSpec::parse("/d/a=b.sqlite").unwrap(), LedgerSpec::Sqlite("/d/a=b.sqlite".into()));
    }

    /// A libpq keyword string is PostgreSQL (never a new SQLite file): the same URL, quoting and
    /// unix-socket hosts included; an unknown keyword or an open quote is refused without its value.
    #[test]
    fn keyword_strings_are_postgres_urls() {
        let url = |spec: &str| match LedgerSpec::parse(spec) {
            Ok(LedgerSpec::Postgres(url)) => url,
            other => panic!("{spec}: {other:?}"),
        };
        assert_eq!(url("host=db.local port=5433 dbname=ledger user=me"), "postgres://me@db.local:5433/ledger");
        assert_eq!(url("dbname = ledger  host=h sslmode=require"), "postgres://h/ledger?sslmode=require");
        assert_eq!(
            url("host=/var/run/postgresql user=me password='p w\\'x' dbname=l"),
            "postgres://me@/l?host=%2Fvar%2Frun%2Fpostgresql&password=p%20w%27x"
        );
        assert_eq!(LedgerSpec::parse("host=h password=s3cret dbname=l").unwrap().location(), "postgres://h/l");
        for bad in ["host=h nosuch=s3cret", "host=h password='s3cret", "host=h s3cret"] {
            let err = LedgerSpec::parse(bad).unwrap_err().to_string();
            assert!(err.contains("keyword connection string") && !err.contains("s3cret"), "{bad}: {err}");
        }
    }

    /// A password for the redaction test, never a literal in the source: the test role's password
    /// from the services' secrets file (`EVAL_TEST_PG_SECRETS_FILE`, default
    /// `/etc/evalci/secrets.env`) where it exists, else one made up for this run. `@` and `/` are
    /// spliced in: the characters a pasted password carries that URL splitting gets wrong.
    fn awkward_password() -> String {
        let file = std::env::var("EVAL_TEST_PG_SECRETS_FILE").unwrap_or_else(|_| "/etc/evalci/secrets.env".into());
        let from_file = std::fs::read_to_string(file).ok().and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("EVAL_TEST_PG_PASSWORD="))
                .map(|v| v.trim().trim_matches('"').to_string())
                .filter(|v| !v.is_empty() && !v.contains(['\n', '*']))
        });
        let base = from_file.unwrap_or_else(|| format!("run{}", std::process::id()));
        format!("{base}@{base}/x")
    }

    #[test]
    fn redaction() {
        let pw = awkward_password();
        let url = format!("postgres://team.abc:{pw}@db.example.internal:5432/postgres?sslmode=require");
        let redacted = redact_url(&url);
        assert_eq!(redacted, "postgres://team.abc:***@db.example.internal:5432/postgres?sslmode=require");
        assert!(!redacted.contains(&pw));
        assert_eq!(postgres_location(&url), "postgres://team.abc@db.example.internal:5432/postgres");
        assert_eq!(
            redact_url("postgres://u@h/db?password=x1&sslmode=require"),
            "postgres://u@h/db?password=***&sslmode=require"
        );
        assert_eq!(redact_url("postgres://h/db?user=u&password=x1"), "postgres://h/db?user=u&password=***");
        assert_eq!(redact_url("postgres://u:pa?ss@h/db?sslmode=require"), "postgres://u:***@h/db?sslmode=require");
        assert_eq!(url_password("postgres://u:pa?ss@h/db?sslmode=require"), Some("pa?ss"));
        assert_eq!(url_password("postgres://u@h/db"), None);
        assert_eq!(
            redact_url("postgres://h/db?application_name=nopassword=1"),
            "postgres://h/db?application_name=nopassword=1"
        );
        assert_eq!(
            format!("{:?}", LedgerSpec::parse(&url).unwrap()),
            "LedgerSpec(postgres://team.abc@db.example.internal:5432/postgres)"
        );
        assert_eq!(
            scrub(format!("auth failed for pw {pw}\n  DETAIL: x"), std::slice::from_ref(&pw)),
            "auth failed for pw *** DETAIL: x"
        );
    }

    #[test]
    fn transitions() {
        use AttemptStatus::*;
        assert!(Pending.can_become(Started) && Pending.can_become(Failed) && Started.can_become(Finished));
        assert!(Started.can_become(Started) && Finished.can_become(Finished));
        assert!(!Finished.can_become(Started) && !Failed.can_become(Pending) && !Started.can_become(Pending));
        assert!(!Cancelled.can_become(Finished) && !Failed.can_become(Finished));
        assert_eq!(AttemptStatus::sources_of(Started), vec![Pending, Started]);
        for status in AttemptStatus::ALL {
            assert_eq!(status.as_str().parse::<AttemptStatus>().unwrap(), status);
            assert_eq!(serde_json::to_value(status).unwrap(), Value::from(status.as_str()));
        }
    }

    #[test]
    fn size_classes() {
        assert_eq!(size_class("org/Qwen3-8B-sft").as_deref(), Some("8"));
        assert_eq!(size_class("Qwen3-30B-A3B").as_deref(), Some("30"));
        assert_eq!(size_class("x/Qwen2.5-1.5B").as_deref(), Some("1.5"));
        assert_eq!(size_class("Mixtral-8x7B"), None);
    }

    #[test]
    fn size_bands_and_base_fallback() {
        assert!(size_matches("8", "org/Qwen3-8B-sft", None));
        assert!(size_matches("8", "org/phi-14B", None));
        assert!(!size_matches("8", "org/Qwen3-32B", None));
        for id in ["Qwen/Qwen3-32B", "Qwen/Qwen3-30B-A3B", "x/QwQ-32B-Preview", "x/Model-40B"] {
            assert!(size_matches("32", id, None), "{id}");
        }
        assert!(!size_matches("32", "x/Model-27B", None) && !size_matches("32", "x/Model-70B", None));
        assert!(size_matches("32", "org/my-sft-run", Some("Qwen/Qwen3-32B")));
        assert!(!size_matches("32", "org/my-sft-run", None));
        assert!(size_matches("8", "org/Qwen3-8B-sft", Some("Qwen/Qwen3-32B")), "the id's own token wins");
        assert!(size_matches("1.5", "x/Qwen2.5-1.5B", None) && !size_matches("7", "x/Qwen2.5-1.5B", None));
    }

    #[test]
    fn import_numbering_follows_submission_time_per_pair() {
        let at = |s: i64| DateTime::from_timestamp(1_700_000_000 + s, 0).unwrap();
        let row = |model: &str, benchmark: &str, t: i64| ImportedAttempt {
            model: model.into(),
            benchmark: benchmark.into(),
            cluster: "c".into(),
            username: "u".into(),
            run_tag: "t".into(),
            slurm_job_id: None,
            status: AttemptStatus::Failed,
            reason: String::new(),
            config: Value::Null,
            metrics: None,
            submitted_at: at(t),
            started_at: None,
            ended_at: None,
            source_id: None,
        };
        let rows = [row("m", "b", 30), row("m", "b2", 10), row("m", "b", 20), row("n", "b", 5)];
        let family = |b: &str| if b == "b2" { "b".to_string() } else { b.to_string() };
        let numbered = number_imports("x", &rows, family, |model, _| Ok(if model == "m" { 4 } else { 0 })).unwrap();
        let numbers: Vec<u32> = numbered.iter().map(|(_, n)| *n).collect();
        assert_eq!(numbers, vec![7, 5, 6, 1]);
    }
}
