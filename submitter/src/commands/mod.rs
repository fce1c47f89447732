//! Command implementations: turn parsed arguments into a resolved configuration once, call the
//! library, print. Errors carry context (`anyhow`) and become one line on stderr.

pub(crate) mod catalogue;
pub(crate) mod listener;
pub(crate) mod preflight;
pub(crate) mod queueing;
pub(crate) mod registry;
pub(crate) mod remediation;
pub(crate) mod session;
pub(crate) mod spec;
pub(crate) mod team;
pub(crate) mod verify;
pub(crate) mod verify_output;

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use submitter::config::ConfigRoot;

use crate::ConfigDirs;

pub(crate) fn init_logging() {
    let directives = launch_spec::logging::filter_directives("SUBMITTER_LOG", "warn");
    let filter = tracing_subscriber::EnvFilter::try_new(directives)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"))
        // The HTTP client's debug lines name the webhook URL, a secret (docs/submitter.md).
        .add_directive("ureq=off".parse().expect("a valid directive"))
        .add_directive("ureq_proto=off".parse().expect("a valid directive"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(launch_spec::logging::stderr_colour())
        .with_target(false)
        .without_time()
        .init();
}

/// One line: `error: <outermost context>: <cause>: …`.
pub(crate) fn report_error(err: &anyhow::Error) {
    let chain: Vec<String> = err.chain().map(|c| c.to_string()).collect();
    let _ = writeln!(std::io::stderr(), "error: {}", chain.join(": "));
}

/// The exit status of the library's wrapper errors, whose `#[error(transparent)]` variants keep
/// the wrapped ledger or Slurm error out of the cause chain (`submitter::output::ExitStatus`).
pub(crate) fn wrapped_status(error: &(dyn std::error::Error + 'static)) -> Option<submitter::output::ExitStatus> {
    use submitter::executor::SubmitError;
    use submitter::output::ExitStatus;
    use submitter::remediate::RemediateError;
    use submitter::snapshot::SnapshotError;
    use submitter::sync::SyncError;
    match error.downcast_ref::<RemediateError>() {
        Some(RemediateError::Ledger(e)) => return Some(ExitStatus::of_ledger(e)),
        Some(RemediateError::Slurm(e)) => return Some(ExitStatus::of_slurm(e)),
        None => {}
    }
    let (submit, sync, snapshot) =
        (error.downcast_ref::<SubmitError>(), error.downcast_ref::<SyncError>(), error.downcast_ref::<SnapshotError>());
    match (submit, sync, snapshot) {
        (Some(SubmitError::Ledger(e)), _, _)
        | (_, Some(SyncError::Ledger(e)), _)
        | (_, _, Some(SnapshotError::Ledger(e))) => Some(ExitStatus::of_ledger(e)),
        (Some(SubmitError::Slurm(e)), _, _)
        | (_, Some(SyncError::Slurm(e)), _)
        | (_, _, Some(SnapshotError::Slurm(e))) => Some(ExitStatus::of_slurm(e)),
        _ => None,
    }
}

pub struct Dirs {
    pub registry: PathBuf,
    pub clusters: PathBuf,
    pub presets: PathBuf,
}

impl ConfigDirs {
    /// Explicit flags win; otherwise the discovered configuration root's directories.
    pub fn resolve(&self) -> Result<Dirs> {
        let root = if self.registry_dir.is_some() && self.clusters_dir.is_some() && self.presets_dir.is_some() {
            None
        } else {
            Some(ConfigRoot::discover()?)
        };
        let pick = |flag: &Option<PathBuf>, default: fn(&ConfigRoot) -> PathBuf| {
            flag.clone().unwrap_or_else(|| default(root.as_ref().expect("root discovered when a flag is missing")))
        };
        Ok(Dirs {
            registry: pick(&self.registry_dir, ConfigRoot::registry_dir),
            clusters: pick(&self.clusters_dir, ConfigRoot::clusters_dir),
            presets: pick(&self.presets_dir, ConfigRoot::presets_dir),
        })
    }
}

/// Writes to stdout, treating a closed pipe (`| head`) as success.
pub(crate) fn print(text: &str) -> Result<()> {
    // No output carries a terminal escape or a stray control character, whatever a name held.
    print_control(&submitter::text::printable_lines(text))
}

/// Writes `text` as it is: [`print`] after its escaping, or a control sequence of this program's
/// own (`status --watch` clearing the screen).
pub(crate) fn print_control(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// The payload binary this cluster's jobs exec (`submitter::node_binary::PayloadBinary::locate`):
/// `$PAYLOAD_BIN`, else the profile's `slurm.payload_bin` (expanded; relative to the configuration
/// root), else beside this submitter. Its real path: a `current` link is resolved now, so an update
/// that moves the link never changes what a queued job execs (docs/install.md).
pub(crate) fn payload_binary(
    context: &submitter::spec_build::SpecBuilder,
    cluster: &submitter::config::ClusterProfile,
    root: &std::path::Path,
) -> Result<submitter::node_binary::PayloadBinary> {
    let from_profile = match &cluster.slurm.payload_bin {
        Some(path) => Some(root.join(context.expand(submitter::node_binary::FIELD, path)?)),
        None => None,
    };
    let from_environment = std::env::var_os("PAYLOAD_BIN").map(PathBuf::from);
    let mut binary =
        submitter::node_binary::PayloadBinary::locate(from_environment, from_profile, &std::env::current_exe()?);
    if let Ok(real) = std::fs::canonicalize(&binary.path) {
        binary.path = real;
    }
    Ok(binary)
}
