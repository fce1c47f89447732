//! `submitter`'s output contract, in one place (docs/design.md, "Output contract"; the exit codes
//! in docs/exit-codes.md):
//!
//! - **`--format human|json`** on every command that prints a result (`--json` is the same as
//!   `--format json`). Human text is for people and may change; JSON is the contract.
//! - **A JSON result is one document**: an object whose first keys are `format_version` (this
//!   build's [`FORMAT_VERSION`]) and `kind` (which document, e.g. `"registry.resolve"`), built from
//!   the output types of the command — never from an internal struct — and printed pretty with a
//!   trailing newline. A command that repeats (`--watch`) prints one compact document per line.
//!   `format_version` goes up when a field is removed, renamed or changes meaning; adding a field
//!   does not change it.
//! - **Exit statuses** ([`ExitStatus`]): one code per kind of failure, so a script can tell "the
//!   ledger is down" from "a typo in a config file".

use std::error::Error;
use std::process::ExitCode;

use launch_spec::layout::Layout;
use serde::Serialize;

use crate::ledger::LedgerError;
use crate::registry::Resolved;
use crate::slurm::SlurmError;

/// The document convention and its version are shared with payload (`launch_spec::document`).
pub use launch_spec::document::{FORMAT_VERSION, document, document_line};

/// How a command prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Text for people (tables, one line per item); not a contract.
    #[default]
    Human,
    /// One versioned JSON document (see the module docs).
    Json,
}

/// The `--format` / `--json` flags, for commands to flatten.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub(crate) struct FormatArgs {
    /// Output format: `human` (default) or `json`, a document with `format_version` and `kind`.
    #[arg(long, value_enum, default_value_t, value_name = "FORMAT")]
    pub format: Format,
    /// Same as `--format json`.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
}

impl FormatArgs {
    pub(crate) fn get(&self) -> Format {
        if self.json { Format::Json } else { self.format }
    }

    pub(crate) fn is_json(&self) -> bool {
        self.get() == Format::Json
    }
}

/// `submitter`'s exit statuses (modelled on uv's `ExitStatus`): 0 and 1 are outcomes of a command
/// that ran, 2 and up say why it could not do its work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// Done; nothing to report.
    Success,
    /// The command ran and found problems: lint errors, a failed launch check, an unhealthy job.
    Problems,
    /// Bad input or configuration: a flag, a file, a field (clap's usage errors are 2 as well).
    BadInput,
    /// The ledger could not be opened or used: unreachable, login refused, schema too new, a
    /// database error.
    LedgerUnavailable,
    /// Slurm could not be asked: `sbatch`/`squeue`/`sacct`/`scancel` missing, failing, timing out or
    /// printing something unexpected.
    SlurmUnavailable,
    /// Another submitter holds this state dir's lock.
    LockHeld,
    /// Some of the work failed and the rest was done: `launch` with a refused or failed submission.
    PartialFailure,
}

impl ExitStatus {
    pub const ALL: [ExitStatus; 7] = [
        ExitStatus::Success,
        ExitStatus::Problems,
        ExitStatus::BadInput,
        ExitStatus::LedgerUnavailable,
        ExitStatus::SlurmUnavailable,
        ExitStatus::LockHeld,
        ExitStatus::PartialFailure,
    ];

    pub const fn code(self) -> u8 {
        match self {
            ExitStatus::Success => 0,
            ExitStatus::Problems => 1,
            ExitStatus::BadInput => 2,
            ExitStatus::LedgerUnavailable => 3,
            ExitStatus::SlurmUnavailable => 4,
            ExitStatus::LockHeld => 5,
            ExitStatus::PartialFailure => 6,
        }
    }

    /// The status for an error that ended a command, from the first cause in its chain that says
    /// what kind of failure it is ([`ExitStatus::of_cause`], else `wrapped`: the command layer's
    /// view into wrapper errors whose `#[error(transparent)]` variants hide their cause from the
    /// chain); anything else is bad input.
    pub(crate) fn of_error<'a>(
        chain: impl IntoIterator<Item = &'a (dyn Error + 'static)>,
        wrapped: impl Fn(&(dyn Error + 'static)) -> Option<ExitStatus>,
    ) -> ExitStatus {
        chain.into_iter().find_map(|cause| classify(cause).or_else(|| wrapped(cause))).unwrap_or(ExitStatus::BadInput)
    }

    /// The status a ledger error calls for.
    pub(crate) fn of_ledger(error: &LedgerError) -> ExitStatus {
        ledger_status(error)
    }

    /// The status a Slurm error calls for.
    pub(crate) fn of_slurm(error: &SlurmError) -> ExitStatus {
        slurm_status(error)
    }
}

impl From<ExitStatus> for ExitCode {
    fn from(status: ExitStatus) -> Self {
        ExitCode::from(status.code())
    }
}

fn classify(error: &(dyn Error + 'static)) -> Option<ExitStatus> {
    if let Some(error) = error.downcast_ref::<LedgerError>() {
        return Some(ledger_status(error));
    }
    if let Some(error) = error.downcast_ref::<SlurmError>() {
        return Some(slurm_status(error));
    }
    if error.downcast_ref::<LockHeld>().is_some() {
        return Some(ExitStatus::LockHeld);
    }
    // The team database is a ledger too (its history decides dedup): down means 3.
    match error.downcast_ref::<crate::team::TeamError>() {
        Some(crate::team::TeamError::Ledger(error)) => Some(ledger_status(error)),
        Some(error) if error.is_unavailable() => Some(ExitStatus::LedgerUnavailable),
        _ => None,
    }
}

fn ledger_status(error: &LedgerError) -> ExitStatus {
    match error {
        LedgerError::BadSpec { .. } => ExitStatus::BadInput,
        LedgerError::Unreachable { .. }
        | LedgerError::Rejected { .. }
        | LedgerError::SchemaTooNew { .. }
        | LedgerError::Migration { .. }
        | LedgerError::Backend { .. }
        | LedgerError::Corrupt { .. } => ExitStatus::LedgerUnavailable,
        // The ledger answered; the request was wrong for the state it holds.
        LedgerError::AlreadyActive { .. }
        | LedgerError::NotFound { .. }
        | LedgerError::IllegalTransition { .. }
        | LedgerError::JobIdConflict { .. }
        | LedgerError::JobIdTaken { .. }
        | LedgerError::InvalidImport { .. } => ExitStatus::BadInput,
    }
}

fn slurm_status(error: &SlurmError) -> ExitStatus {
    match error {
        SlurmError::InvalidRequest(_) => ExitStatus::BadInput,
        SlurmError::Spawn { .. }
        | SlurmError::Failed { .. }
        | SlurmError::TimedOut { .. }
        | SlurmError::UnexpectedOutput { .. } => ExitStatus::SlurmUnavailable,
    }
}

/// Another submitter holds the state dir's lock file.
#[derive(Debug, thiserror::Error)]
#[error("another submitter holds {path} — one submitter per state dir; wait for it or stop it")]
pub struct LockHeld {
    pub path: String,
}

/// One model's serve settings as the JSON documents show them (`registry resolve`, `plan`'s `serve`):
/// [`Resolved`]'s own fields (its serialisation, field order included, is the interface), then the
/// layout.
#[derive(Serialize)]
pub(crate) struct ServeSettings<'a> {
    #[serde(flatten)]
    pub resolved: &'a Resolved,
    /// Where the engine's GPUs are (docs/multinode.md); shown only for a multi-node layout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layout: Option<LayoutOutput>,
}

/// A multi-node engine's layout (docs/multinode.md).
#[derive(Serialize)]
pub(crate) struct LayoutOutput {
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// Which parallelism spans the nodes: `data`, `pipeline` or `tensor` (`none` on one node).
    pub crossing: &'static str,
}

impl From<&Layout> for LayoutOutput {
    fn from(layout: &Layout) -> Self {
        LayoutOutput { nodes: layout.nodes, gpus_per_node: layout.gpus_per_node, crossing: layout.crossing.as_str() }
    }
}

impl<'a> ServeSettings<'a> {
    /// `layout`: where the engine's GPUs are, when the caller resolved it (shown when multi-node).
    pub(crate) fn new(r: &'a Resolved, layout: Option<&Layout>) -> Self {
        ServeSettings { resolved: r, layout: layout.filter(|layout| layout.is_multi_node()).map(LayoutOutput::from) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_stable() {
        let codes: Vec<u8> = ExitStatus::ALL.iter().map(|s| s.code()).collect();
        assert_eq!(codes, vec![0, 1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn errors_map_to_their_status() {
        let ledger_down: Box<dyn Error> = Box::new(LedgerError::Unreachable {
            location: "postgres://u@h/db".into(),
            detail: "refused".into(),
            hint: "",
        });
        let none = |_: &(dyn Error + 'static)| None;
        assert_eq!(ExitStatus::of_error([&*ledger_down], none), ExitStatus::LedgerUnavailable);
        let slurm_down = SlurmError::TimedOut { command: "squeue".into(), timeout: std::time::Duration::from_secs(1) };
        assert_eq!(ExitStatus::of_error([&slurm_down as &dyn Error], none), ExitStatus::SlurmUnavailable);
        // Issue 32 item 11: remediation's scancel failing exits 4, as `cancel` does.
        let remediation = crate::remediate::RemediateError::Slurm(SlurmError::Failed {
            command: "scancel 42".into(),
            status: "exit status: 1".into(),
            stderr: "Access/permission denied".into(),
        });
        let cause = remediation.source().expect("the Slurm error stays in the chain");
        let chain: [&(dyn Error + 'static); 2] = [&remediation, cause];
        assert_eq!(ExitStatus::of_error(chain, none), ExitStatus::SlurmUnavailable);
        let lock = LockHeld { path: "/state/submitter.lock".into() };
        assert_eq!(ExitStatus::of_error([&lock as &dyn Error], none), ExitStatus::LockHeld);
        let other = std::io::Error::other("a typo");
        assert_eq!(ExitStatus::of_error([&other as &dyn Error], none), ExitStatus::BadInput);
        let wrapped = |_: &(dyn Error + 'static)| Some(ExitStatus::SlurmUnavailable);
        assert_eq!(ExitStatus::of_error([&other as &dyn Error], wrapped), ExitStatus::SlurmUnavailable);
    }
}
