//! The team's database: the replaced system's PostgreSQL (Supabase) schema — `models`,
//! `benchmarks`, `sandbox_jobs` — that the team's dashboards and scoring scripts read
//! (`docs/ledger.md`, "The team's database"). [`import`] folds its history into the ledger
//! (read-only on the source); [`mirror`] publishes this submitter's own attempts into it.

pub mod import;
pub mod mirror;

use crate::ledger::LedgerError;

/// The cluster name imported attempts carry: the team's history does not say where a job ran.
pub use crate::domain::TEAM_CLUSTER;

/// Where the team database URL is read from when no flag gives it (it holds a password, and argv
/// is visible to every user of a login node).
pub const TEAM_DB_ENV: &str = "SUBMITTER_TEAM_DB";

#[derive(Debug, thiserror::Error)]
pub enum TeamError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// Opening the team database failed (the connection error, worded for it).
    #[error("{0}")]
    Connect(String),
    #[error("team database {location}: {operation} failed: {detail}")]
    Source { location: String, operation: &'static str, detail: String },
}

/// Opens the team database with the ledger's URL, TLS and password handling; its errors name the
/// team database rather than a ledger.
pub(crate) fn connect(url: &str) -> Result<crate::ledger::PgConnection, TeamError> {
    crate::ledger::PgConnection::open(url)
        .map_err(|error| TeamError::Connect(error.to_string().replacen("ledger ", "team database ", 1)))
}

/// Runs a mirror step and reports its failure as a warning: publishing never stops the ledger's
/// own work.
pub fn publish<T>(
    mirror: Option<&mirror::Mirror>,
    what: &str,
    step: impl FnOnce(&mirror::Mirror) -> Result<T, TeamError>,
) {
    if let Some(mirror) = mirror
        && let Err(error) = step(mirror)
    {
        tracing::warn!("mirror: {what} not published: {error}");
    }
}

/// Maps a driver error of the team database to [`TeamError::Source`], without the password.
pub(crate) fn source_error<'a>(
    redactor: &'a crate::ledger::Redactor,
    operation: &'static str,
) -> impl Fn(::postgres::Error) -> TeamError + 'a {
    move |error| TeamError::Source { location: redactor.location.clone(), operation, detail: redactor.describe(&error) }
}
