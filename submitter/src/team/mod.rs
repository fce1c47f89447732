//! The team's database: the replaced system's PostgreSQL (Supabase) schema — `models`,
//! `benchmarks`, `sandbox_jobs` — that the team's dashboards and scoring scripts read
//! (`docs/ledger.md`, "The team's database"). [`import`] folds its history into the ledger
//! (read-only on the source); [`mirror`] publishes this submitter's own attempts into it.

pub mod import;
pub mod mirror;

use std::path::Path;
use std::time::Duration;

use crate::ledger::LedgerError;

/// The cluster name imported attempts carry: the team's history does not say where a job ran.
pub use crate::domain::TEAM_CLUSTER;

/// Where the team database URL is read from when no flag gives it (it holds a password, and argv
/// is visible to every user of a login node).
pub(crate) const TEAM_DB_ENV: &str = "SUBMITTER_TEAM_DB";

/// The client-side bound of a call on the team database is its server-side bound
/// (`team.timeout_s`, `statement_timeout`) and this much more: where the server answers, its own
/// clearer error ("statement timeout", "lock timeout") comes first; the client's bound catches a
/// connection that stopped answering.
pub(crate) const CLIENT_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum TeamError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// Opening the team database failed (the connection error, worded for it).
    #[error("{0}")]
    Connect(String),
    #[error("team database {location}: {operation} failed: {detail}")]
    Source { location: String, operation: &'static str, detail: String },
    /// The secrets file cannot give the team database URL (never holds a value).
    #[error("{file}: {problem} (or run with --offline-ledger to use your own ledger only)")]
    Secrets { file: String, problem: String },
}

impl TeamError {
    /// Whether the team database itself could not be used (unreachable, refused, a statement that
    /// failed or ran past its bound), as opposed to a configuration mistake.
    pub(crate) fn is_unavailable(&self) -> bool {
        matches!(self, TeamError::Connect(_) | TeamError::Source { .. })
    }
}

/// The team database URL from the 0600 secrets file `file`, under the key `name`
/// (`team.database_secret`): the file must be a regular file that only its owner can read, as
/// payload requires of it (docs/site.md).
pub(crate) fn url_from_secrets(file: &Path, name: &str) -> Result<String, TeamError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let problem = |problem: String| TeamError::Secrets { file: file.display().to_string(), problem };
    let meta = std::fs::metadata(file).map_err(|e| {
        problem(format!(
            "{e}: create it (mode 0600) with `{name}=postgresql://…` (team.database_secret), or set ${TEAM_DB_ENV}"
        ))
    })?;
    if !meta.is_file() {
        return Err(problem("not a regular file".into()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(problem(format!(
            "has mode {mode:04o} and holds the team database password: run `chmod 600 {}`",
            file.display()
        )));
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(problem(format!("is owned by uid {}, not by you", meta.uid())));
    }
    let pairs = launch_spec::envfile::read_pairs(file).map_err(|e| problem(e.to_string()))?;
    let url = pairs.into_iter().rev().find(|(k, _)| k == name).map(|(_, v)| v).filter(|v| !v.trim().is_empty());
    let url = url.ok_or_else(|| {
        problem(format!(
            "no `{name}` (team.database_secret): add `{name}=postgresql://USER:PASSWORD@HOST:PORT/DB?sslmode=require`"
        ))
    })?;
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(problem(format!("`{name}` is not a postgres:// URL (team.database_secret)")));
    }
    Ok(url)
}

/// Opens the team database with the ledger's URL, TLS and password handling; its errors name the
/// team database rather than a ledger. `bound` and [`CLIENT_GRACE`] limit the connect's startup
/// and every [`bounded`] call on the client's side (docs/ledger.md "Bounds").
pub(crate) fn connect(url: &str, bound: Duration) -> Result<crate::ledger::PgConnection, TeamError> {
    crate::ledger::PgConnection::open(url, bound + CLIENT_GRACE).map_err(connect_error)
}

/// A connect's failure, naming the team database rather than a ledger.
fn connect_error(error: crate::ledger::LedgerError) -> TeamError {
    TeamError::Connect(error.to_string().replacen("ledger ", "team database ", 1))
}

/// Runs `body` on the team database's client within the connection's bound: a connection that
/// stops answering is dropped at the bound and the error says so (issue 32 item 9).
pub(crate) fn bounded<T>(
    connection: &mut crate::ledger::PgConnection,
    operation: &'static str,
    body: impl FnOnce(&mut crate::ledger::PgClient, &crate::ledger::Redactor) -> Result<T, TeamError>,
) -> Result<T, TeamError> {
    let redactor = connection.redactor();
    let bound = connection.bound();
    let (result, fired) = connection.within(|client| body(client, &redactor)).map_err(connect_error)?;
    result.map_err(|error| match error {
        TeamError::Source { location, .. } if fired => TeamError::Source {
            location,
            operation,
            detail: format!(
                "no answer within {} s (team.timeout_s and {} s of grace, the client's bound): the connection was dropped",
                bound.as_secs(),
                CLIENT_GRACE.as_secs()
            ),
        },
        error => error,
    })
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
) -> impl Fn(tokio_postgres::Error) -> TeamError + 'a {
    move |error| TeamError::Source { location: redactor.location.clone(), operation, detail: redactor.describe(&error) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_url_comes_only_from_a_private_secrets_file_and_errors_never_show_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secrets.env");
        let secret = format!("made-up-{}", std::process::id());
        let url = format!("postgresql://user.project:{secret}@127.0.0.1:6543/postgres?sslmode=require");
        std::fs::write(&file, format!("OTHER=1\nTEAM_DB_URL={url}\n")).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let open = url_from_secrets(&file, "TEAM_DB_URL").unwrap_err().to_string();
        assert!(open.contains("mode 0644") && open.contains("chmod 600") && !open.contains(&secret), "{open}");
        assert!(open.contains("--offline-ledger"), "every team-database error names the escape: {open}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(url_from_secrets(&file, "TEAM_DB_URL").unwrap(), url);
        let missing = url_from_secrets(&file, "NOPE").unwrap_err().to_string();
        assert!(missing.contains("no `NOPE`") && missing.contains("--offline-ledger"), "{missing}");
        std::fs::write(&file, "TEAM_DB_URL=https://example.invalid/x\n").unwrap();
        assert!(url_from_secrets(&file, "TEAM_DB_URL").unwrap_err().to_string().contains("not a postgres:// URL"));
        let absent = url_from_secrets(&dir.path().join("none.env"), "TEAM_DB_URL").unwrap_err().to_string();
        assert!(
            absent.contains("mode 0600") && absent.contains(TEAM_DB_ENV) && absent.contains("--offline-ledger"),
            "{absent}"
        );
    }
}
