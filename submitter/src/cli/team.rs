//! `submitter import` (the team's history into the ledger) and `submitter families add|list`.

use std::process::ExitCode;

use crate::config::cluster::TeamSettings;
use crate::ledger::redact_url;
use crate::output::{self, FormatArgs};
use crate::team::import::ImportReport;
use crate::team::{TEAM_DB_ENV, import};
use anyhow::{Context, Result, bail};
use serde::Serialize;

use super::session::{LedgerArgs, Session};

/// The profile's team database with its URL resolved (`team:`, docs/ledger.md "Team history by
/// default").
pub(crate) struct TeamLink {
    pub url: String,
    pub settings: TeamSettings,
}

impl TeamLink {
    /// The profile's team database, None when the profile names none. The URL: `$SUBMITTER_TEAM_DB`
    /// of this shell when set (a per-user override), else the `team.database_secret` key of the
    /// 0600 secrets file (what a listener job on a node reads: it never gets the variable).
    pub(crate) fn of(session: &Session) -> Result<Option<TeamLink>> {
        let Some(settings) = session.cluster.team.clone() else { return Ok(None) };
        let from_env = std::env::var(TEAM_DB_ENV).ok().filter(|u| !u.trim().is_empty());
        let url = match from_env {
            Some(url) => url,
            None => TeamLink::from_secrets_file(session, &settings)?,
        };
        Ok(Some(TeamLink { url, settings }))
    }

    /// The URL as the secrets file alone gives it (the listener job's view).
    pub(crate) fn from_secrets_file(session: &Session, settings: &TeamSettings) -> Result<String> {
        let file = session.context().secrets_file()?;
        crate::team::url_from_secrets(&file, &settings.database_secret)
            .with_context(|| format!("clusters/{}.yaml team", session.cluster.name))
    }

    /// Folds the team's rows that are new since the last fold-in into the ledger (`team::import`,
    /// incremental by its watermark), each statement bounded by `team.timeout_s`.
    pub(crate) fn fold_in(&self, session: &Session) -> Result<ImportReport, crate::team::TeamError> {
        let bound = std::time::Duration::from_secs(self.settings.timeout_s);
        import::import(session.ledger.as_ref(), &self.url, false, Some(bound), self.settings.staleness())
    }
}

/// What a `plan`/`launch` iteration says about the team's history: folded in, or not consulted.
pub(crate) enum TeamView {
    Folded(ImportReport),
    /// `--offline-ledger` on a profile that names a team database; `never_imported`: this ledger
    /// holds no row of the team's history, so every pair the team already ran plans as `submit`.
    Offline {
        never_imported: bool,
    },
}

impl TeamView {
    /// One line for the human outputs.
    pub(crate) fn line(&self) -> String {
        match self {
            TeamView::Folded(r) => format!(
                "team      {}: {} new, {} updated, {} job(s) read ({:.2} s)\n",
                r.source, r.attempts_new, r.attempts_updated, r.jobs_read, r.seconds
            ),
            TeamView::Offline { never_imported: false } => {
                "team      offline (--offline-ledger): the team's history was not consulted; dedup sees this ledger only\n"
                    .to_string()
            }
            TeamView::Offline { never_imported: true } => "warning   offline (--offline-ledger) and this ledger never imported \
                the team's history: every pair the team already ran plans as submit; run `submitter import` (or plan \
                without --offline-ledger) first\n"
                .to_string(),
        }
    }

    pub(crate) fn output(&self) -> TeamViewOutput<'_> {
        match self {
            TeamView::Folded(r) => TeamViewOutput {
                offline: false,
                never_imported: false,
                source: Some(&r.source),
                attempts_new: r.attempts_new,
                attempts_updated: r.attempts_updated,
                jobs_read: r.jobs_read,
                seconds: r.seconds,
            },
            TeamView::Offline { never_imported } => TeamViewOutput {
                offline: true,
                never_imported: *never_imported,
                source: None,
                attempts_new: 0,
                attempts_updated: 0,
                jobs_read: 0,
                seconds: 0.0,
            },
        }
    }
}

/// `plan`'s and `launch`'s `team`: the team's history this iteration folded in (absent when the
/// profile names no team database).
#[derive(Serialize)]
pub(crate) struct TeamViewOutput<'a> {
    /// True with `--offline-ledger`: the team database was not consulted.
    offline: bool,
    /// Offline, and this ledger holds no row of the team's history (issue 36).
    never_imported: bool,
    /// `postgres://user@host:port/db`, never a password; null when offline.
    source: Option<&'a str>,
    attempts_new: usize,
    attempts_updated: usize,
    jobs_read: usize,
    seconds: f64,
}

#[derive(clap::Args)]
pub(crate) struct ImportArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    /// The team's PostgreSQL (OT-Agent schema), `postgres://user@host:port/db?sslmode=require`.
    /// A URL with a password is taken only from $SUBMITTER_TEAM_DB (argv is visible to every user
    /// of a login node); this flag may carry the URL without it when that variable holds it.
    #[arg(long, value_name = "URL")]
    from: Option<String>,
    /// Re-read every row instead of only those past the last import's watermark.
    #[arg(long)]
    full: bool,
    /// `--format json`: an `import` document with the counts.
    #[command(flatten)]
    format: FormatArgs,
}

#[derive(clap::Subcommand)]
pub(crate) enum FamiliesCommand {
    /// Count BENCHMARK toward FAMILY for dedup (its existing attempts move along).
    Add {
        #[command(flatten)]
        ledger: LedgerArgs,
        benchmark: String,
        family: String,
    },
    /// Every benchmark → family mapping (a benchmark not listed is its own family).
    List {
        #[command(flatten)]
        ledger: LedgerArgs,
        /// `--format json`: a `families.list` document.
        #[command(flatten)]
        format: FormatArgs,
    },
}

/// The team database URL: `flag`, else `$SUBMITTER_TEAM_DB`. A password is accepted only through
/// the variable; a flag naming the same server without it picks the variable's URL.
pub(crate) fn team_url(flag: Option<&str>, what: &str) -> Result<String> {
    let from_env = std::env::var(TEAM_DB_ENV).ok().filter(|u| !u.trim().is_empty());
    match (flag, from_env) {
        (Some(url), _) if redact_url(url) != url => bail!(
            "{what} {}: a password on the command line is visible to every user of this machine — \
             put the URL in ${TEAM_DB_ENV} (e.g. from your 0600 secrets file) and drop it from the flag",
            redact_url(url)
        ),
        (Some(url), Some(env)) if same_server(url, &env) => Ok(env),
        (Some(url), _) => Ok(url.to_string()),
        (None, Some(env)) => Ok(env),
        (None, None) => {
            bail!("{what}: no team database — give {what} postgres://user@host:port/db or set ${TEAM_DB_ENV}")
        }
    }
}

/// Whether two URLs name the same server and database once passwords and parameters are dropped.
fn same_server(a: &str, b: &str) -> bool {
    let bare = |url: &str| redact_url(url).split('?').next().unwrap_or_default().replacen(":***@", "@", 1);
    bare(a) == bare(b)
}

pub(crate) fn import_command(args: &ImportArgs) -> Result<ExitCode> {
    let session = Session::open(&args.ledger)?;
    // The source as `plan` and `launch` find it (issue 32 item 15): `--from`, else the profile's
    // `team:` (`$SUBMITTER_TEAM_DB`, else its `database_secret` in the secrets file), else the variable.
    let link = match args.from {
        Some(_) => None,
        None => TeamLink::of(&session)?,
    };
    let url = match &link {
        Some(link) => link.url.clone(),
        None => team_url(args.from.as_deref(), "--from")?,
    };
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        bail!("--from {}: the team database is PostgreSQL — give a postgres:// URL", redact_url(&url));
    }
    // The profile's staleness where `--cluster` named one, the team's rule (6 h / 24 h) otherwise.
    let stale = link.as_ref().map_or_else(crate::team::import::Staleness::default, |link| link.settings.staleness());
    let report = import::import(session.ledger.as_ref(), &url, args.full, None, stale).context("import")?;
    super::print(&if args.format.is_json() {
        output::document("import", &ImportOutput::from(&report))
    } else {
        format!(
            "imported from {}: {} job(s) read, {} new, {} updated, {} unchanged; {} model(s) added, {} family \
             mapping(s) set; skipped {} with an unknown model or benchmark, {} published by this ledger — {:.2} s\n",
            report.source,
            report.jobs_read,
            report.attempts_new,
            report.attempts_updated,
            report.unchanged,
            report.models_added,
            report.families_set,
            report.skipped_unknown,
            report.skipped_own,
            report.seconds
        )
    })?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn families(command: &FamiliesCommand) -> Result<ExitCode> {
    match command {
        FamiliesCommand::Add { ledger, benchmark, family } => {
            if benchmark.trim().is_empty() || family.trim().is_empty() {
                bail!(
                    "families add: give a benchmark and a family name, e.g. `families add dev_set_v2_3.0x dev_set_v2`"
                );
            }
            let session = Session::open(ledger)?;
            session.ledger.set_family(benchmark, family)?;
            super::print(&format!("{benchmark} → {family}\n"))?;
        }
        FamiliesCommand::List { ledger, format } => {
            let session = Session::open(ledger)?;
            let rows = session.ledger.families()?;
            if format.is_json() {
                let families = rows.iter().map(|(benchmark, family)| FamilyOutput { benchmark, family }).collect();
                super::print(&output::document("families.list", &FamiliesOutput { families }))?;
            } else {
                let mut out: String = rows.iter().map(|(b, f)| format!("{b:<48} {f}\n")).collect();
                out += &format!("{} mapping(s)\n", rows.len());
                super::print(&out)?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `import`: what one import of the team's history did.
#[derive(Serialize)]
struct ImportOutput<'a> {
    /// The source, `postgres://user@host:port/db` (never a password).
    source: &'a str,
    jobs_read: usize,
    attempts_new: usize,
    attempts_updated: usize,
    unchanged: usize,
    models_added: usize,
    families_set: usize,
    /// Jobs whose model or benchmark the source does not know.
    skipped_unknown: usize,
    /// Rows this ledger published there itself (`--mirror`).
    skipped_own: usize,
    seconds: f64,
}

impl<'a> From<&'a ImportReport> for ImportOutput<'a> {
    fn from(r: &'a ImportReport) -> Self {
        ImportOutput {
            source: &r.source,
            jobs_read: r.jobs_read,
            attempts_new: r.attempts_new,
            attempts_updated: r.attempts_updated,
            unchanged: r.unchanged,
            models_added: r.models_added,
            families_set: r.families_set,
            skipped_unknown: r.skipped_unknown,
            skipped_own: r.skipped_own,
            seconds: r.seconds,
        }
    }
}

/// `families.list`: every benchmark → family mapping, by benchmark.
#[derive(Serialize)]
struct FamiliesOutput<'a> {
    families: Vec<FamilyOutput<'a>>,
}

#[derive(Serialize)]
struct FamilyOutput<'a> {
    benchmark: &'a str,
    family: &'a str,
}
