//! The command line: clap's argument tree, and per command group the code that turns parsed
//! arguments into a resolved configuration once, calls the library and prints. Errors carry context
//! (`anyhow`) and become one line on stderr. The binary (`main.rs`) only calls [`main`].

mod catalogue;
mod consumers;
mod listener;
mod preflight;
mod queueing;
mod registry;
mod remediation;
mod session;
mod spec;
mod team;
mod verify;
mod verify_output;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::config::ConfigRoot;
use crate::output::ExitStatus;

/// Exit codes: the table is `crate::output::ExitStatus` (docs/exit-codes.md).
pub(crate) const EXIT_PROBLEMS: u8 = ExitStatus::Problems.code();

#[derive(Parser)]
#[command(name = "submitter", version, about = "Plan, submit and verify agentic LLM evaluations on Slurm")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Model registry: resolve serve settings, lint the configuration.
    #[command(subcommand)]
    Registry(RegistryCommand),
    /// Write the launch spec for one (model, benchmark) without submitting anything (for
    /// `payload run --spec` by hand inside `salloc`).
    Spec(spec::SpecArgs),
    /// What `launch` checks on the login node before sbatch, for one (model, benchmark): spec,
    /// dataset, environments, programs, secrets file, partition/reservation/account, memory,
    /// prelude. Exit 1 when a check failed. `--stage` stages the model and dataset first.
    Preflight(preflight::PreflightArgs),
    /// The decisions per (model, benchmark): submit, skip or resubmit, with the reason. Changes nothing.
    Plan(queueing::PlanArgs),
    /// Sync, plan and submit: once, or as a listener (--watch --interval D).
    Launch(queueing::LaunchArgs),
    /// Fold payload records and Slurm state into the ledger.
    Sync(queueing::SyncArgs),
    /// Active attempts joined with Slurm state and payload heartbeats: one verdict per job
    /// (starting, healthy, stalled, dead, misconfigured, finished, failed) with the evidence.
    Status(verify::StatusArgs),
    /// The launch checks (tunnel, api_base, completions, trials) from a run dir's files alone.
    /// Exit 0: no failure; 1: a check failed (--strict: or warned); 2: not a run dir.
    Check(verify::CheckArgs),
    /// The models × benchmarks score matrix from the ledger.
    Results(verify::ResultsArgs),
    /// Two models paired on the tasks both ran, per benchmark: per-task differences, the mean
    /// difference with its paired-bootstrap interval, the flipped tasks, exact McNemar where it
    /// applies, and a one-line verdict (docs/results.md).
    Compare(verify::CompareArgs),
    /// A self-contained HTML report: score matrix, in-flight jobs and their evidence.
    Report(verify::ReportArgs),
    /// Show a job's log: the Slurm output (default), --engine, --harbor or --tunnel.
    Logs(verify::LogsArgs),
    /// One remediation pass (the profile's `remediation:` policies): cancel, retry with a change, or
    /// hold, for each diagnosed job. `--dry-run` prints the decisions and changes nothing.
    Remediate(remediation::RemediateArgs),
    /// Clear the hold remediation put on a pair, so the next launch submits it again.
    Release(remediation::ReleaseArgs),
    /// Hold a pair by hand (the counterpart of `release`): no launch submits it until released.
    Hold(remediation::HoldArgs),
    /// Cancel by job id or model/benchmark, updating the ledger.
    Cancel(queueing::CancelArgs),
    /// Move the ledger's pending attempts onto a Slurm reservation (`scontrol update
    /// jobid=J reservation=R`); jobs no longer pending are left as they are. One line per job.
    Move(queueing::MoveArgs),
    /// The ledger's model catalogue.
    #[command(subcommand)]
    Models(catalogue::ModelsCommand),
    /// A priority list of catalogue models not yet evaluated on a benchmark family.
    Unevaluated(catalogue::UnevaluatedArgs),
    /// Import the team's history (OT-Agent schema: models, benchmarks, sandbox_jobs) into the
    /// ledger; read-only on the source, incremental on re-runs.
    Import(team::ImportArgs),
    /// Benchmark families: benchmarks that count as one for dedup.
    #[command(subcommand)]
    Families(team::FamiliesCommand),
    /// The Slurm-native listener: a small CPU job that runs one `launch --once` iteration and
    /// re-queues itself (survives login nodes that kill long-running processes).
    #[command(subcommand)]
    Listener(listener::ListenerCommand),
    /// Print a shell completion script (bash, zsh, fish, …) on stdout, e.g.
    /// `submitter completions bash > ~/.local/share/bash-completion/completions/submitter`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (`submitter.1`, `submitter-plan.1`, …) into DIR (scripts/release).
    #[command(hide = true)]
    Man {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
pub(crate) enum RegistryCommand {
    /// Resolved serve settings per model, and which rule matched.
    Resolve(registry::ResolveArgs),
    /// Lint registry, patterns, presets, GPU and cluster profiles together; exit 1 on any error.
    Check(registry::CheckArgs),
}

/// The program: parse the command line, run the command, map its error to the exit code.
pub fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Registry(RegistryCommand::Resolve(args)) => registry::resolve(&args),
        Command::Registry(RegistryCommand::Check(args)) => registry::check(&args),
        Command::Spec(args) => spec::spec(&args),
        Command::Preflight(args) => preflight::preflight(&args),
        Command::Plan(args) => queueing::plan_command(&args),
        Command::Launch(args) => queueing::launch_command(&args),
        Command::Sync(args) => queueing::sync_command(&args),
        Command::Status(args) => verify::status(&args),
        Command::Cancel(args) => queueing::cancel_command(&args),
        Command::Remediate(args) => remediation::remediate_command(&args),
        Command::Release(args) => remediation::release_command(&args),
        Command::Hold(args) => remediation::hold_command(&args),
        Command::Move(args) => queueing::move_command(&args),
        Command::Check(args) => verify::check(&args),
        Command::Results(args) => verify::results(&args),
        Command::Compare(args) => verify::compare(&args),
        Command::Report(args) => verify::report(&args),
        Command::Logs(args) => verify::logs(&args),
        Command::Models(command) => catalogue::models(&command),
        Command::Unevaluated(args) => catalogue::unevaluated(&args),
        Command::Import(args) => team::import_command(&args),
        Command::Families(command) => team::families(&command),
        Command::Listener(command) => listener::listener(command),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "submitter", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man { out } => {
            use anyhow::Context;
            use clap::CommandFactory;
            clap_mangen::generate_to(Cli::command(), &out)
                .with_context(|| format!("writing the man pages into {}", out.display()))
                .map(|()| ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            report_error(&err);
            ExitStatus::of_error(err.chain(), wrapped_status).into()
        }
    }
}

/// Shared `--registry/--clusters/--presets` location flags; default: the discovered config root.
#[derive(clap::Args, Clone, Debug, Default)]
pub(crate) struct ConfigDirs {
    /// Model registry directory (model_config/).
    #[arg(long = "registry", value_name = "DIR")]
    pub registry_dir: Option<PathBuf>,
    /// Cluster profiles directory (clusters/).
    #[arg(long = "clusters", value_name = "DIR")]
    pub clusters_dir: Option<PathBuf>,
    /// Presets directory (presets/).
    #[arg(long = "presets", value_name = "DIR")]
    pub presets_dir: Option<PathBuf>,
}

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
/// the wrapped ledger or Slurm error out of the cause chain (`crate::output::ExitStatus`).
pub(crate) fn wrapped_status(error: &(dyn std::error::Error + 'static)) -> Option<crate::output::ExitStatus> {
    use crate::executor::SubmitError;
    use crate::output::ExitStatus;
    use crate::remediate::RemediateError;
    use crate::snapshot::SnapshotError;
    use crate::sync::SyncError;
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

pub(crate) struct Dirs {
    pub registry: PathBuf,
    pub clusters: PathBuf,
    pub presets: PathBuf,
}

impl ConfigDirs {
    /// Explicit flags win; otherwise the discovered configuration root's directories.
    pub(crate) fn resolve(&self) -> Result<Dirs> {
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
    print_control(&crate::text::printable_lines(text))
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

/// The payload binary this cluster's jobs exec (`crate::node_binary::PayloadBinary::locate`):
/// `$PAYLOAD_BIN`, else the profile's `slurm.payload_bin` (expanded; relative to the configuration
/// root), else beside this submitter. Its real path: a `current` link is resolved now, so an update
/// that moves the link never changes what a queued job execs (docs/install.md).
pub(crate) fn payload_binary(
    context: &crate::spec_build::SpecBuilder,
    cluster: &crate::config::ClusterProfile,
    root: &std::path::Path,
) -> Result<crate::node_binary::PayloadBinary> {
    let from_profile = match &cluster.slurm.payload_bin {
        Some(path) => Some(root.join(context.expand(crate::node_binary::FIELD, path)?)),
        None => None,
    };
    let from_environment = std::env::var_os("PAYLOAD_BIN").map(PathBuf::from);
    let mut binary =
        crate::node_binary::PayloadBinary::locate(from_environment, from_profile, &std::env::current_exe()?);
    if let Ok(real) = std::fs::canonicalize(&binary.path) {
        binary.path = real;
    }
    Ok(binary)
}
