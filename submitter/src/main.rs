//! `submitter`: the login-node program. This file only parses arguments and wires commands; the
//! logic lives in the library (`submitter::…`) and in `commands/`.

mod commands;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use submitter::output::ExitStatus;

/// Exit codes: the table is `submitter::output::ExitStatus` (docs/exit-codes.md).
pub const EXIT_PROBLEMS: u8 = ExitStatus::Problems.code();

#[derive(Parser)]
#[command(name = "submitter", version, about = "Plan, submit and verify agentic LLM evaluations on Slurm")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Model registry: resolve serve settings, lint the configuration.
    #[command(subcommand)]
    Registry(RegistryCommand),
    /// Write the launch spec for one (model, benchmark) without submitting anything (for
    /// `payload run --spec` by hand inside `salloc`).
    Spec(commands::spec::SpecArgs),
    /// What `launch` checks on the login node before sbatch, for one (model, benchmark): spec,
    /// dataset, environments, programs, secrets file, partition/reservation/account, memory,
    /// prelude. Exit 1 when a check failed. `--stage` stages the model and dataset first.
    Preflight(commands::preflight::PreflightArgs),
    /// The decisions per (model, benchmark): submit, skip or resubmit, with the reason. Changes nothing.
    Plan(commands::queueing::PlanArgs),
    /// Sync, plan and submit: once, or as a listener (--watch --interval D).
    Launch(commands::queueing::LaunchArgs),
    /// Fold payload records and Slurm state into the ledger.
    Sync(commands::queueing::SyncArgs),
    /// Active attempts joined with Slurm state and payload heartbeats: one verdict per job
    /// (starting, healthy, stalled, dead, misconfigured, finished, failed) with the evidence.
    Status(commands::verify::StatusArgs),
    /// The launch checks (tunnel, api_base, completions, trials) from a run dir's files alone.
    /// Exit 0: no failure; 1: a check failed (--strict: or warned); 2: not a run dir.
    Check(commands::verify::CheckArgs),
    /// The models × benchmarks score matrix from the ledger.
    Results(commands::verify::ResultsArgs),
    /// Two models paired on the tasks both ran, per benchmark: per-task differences, the mean
    /// difference with its paired-bootstrap interval, the flipped tasks, exact McNemar where it
    /// applies, and a one-line verdict (docs/results.md).
    Compare(commands::verify::CompareArgs),
    /// A self-contained HTML report: score matrix, in-flight jobs and their evidence.
    Report(commands::verify::ReportArgs),
    /// Show a job's log: the Slurm output (default), --engine, --harbor or --tunnel.
    Logs(commands::verify::LogsArgs),
    /// One remediation pass (the profile's `remediation:` policies): cancel, retry with a change, or
    /// hold, for each diagnosed job. `--dry-run` prints the decisions and changes nothing.
    Remediate(commands::remediation::RemediateArgs),
    /// Clear the hold remediation put on a pair, so the next launch submits it again.
    Release(commands::remediation::ReleaseArgs),
    /// Hold a pair by hand (the counterpart of `release`): no launch submits it until released.
    Hold(commands::remediation::HoldArgs),
    /// Cancel by job id or model/benchmark, updating the ledger.
    Cancel(commands::queueing::CancelArgs),
    /// Move the ledger's pending attempts onto a Slurm reservation (`scontrol update
    /// jobid=J reservation=R`); jobs no longer pending are left as they are. One line per job.
    Move(commands::queueing::MoveArgs),
    /// The ledger's model catalogue.
    #[command(subcommand)]
    Models(commands::catalogue::ModelsCommand),
    /// A priority list of catalogue models not yet evaluated on a benchmark family.
    Unevaluated(commands::catalogue::UnevaluatedArgs),
    /// Import the team's history (OT-Agent schema: models, benchmarks, sandbox_jobs) into the
    /// ledger; read-only on the source, incremental on re-runs.
    Import(commands::team::ImportArgs),
    /// Benchmark families: benchmarks that count as one for dedup.
    #[command(subcommand)]
    Families(commands::team::FamiliesCommand),
    /// The Slurm-native listener: a small CPU job that runs one `launch --once` iteration and
    /// re-queues itself (survives login nodes that kill long-running processes).
    #[command(subcommand)]
    Listener(commands::listener::ListenerCommand),
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
pub enum RegistryCommand {
    /// Resolved serve settings per model, and which rule matched.
    Resolve(commands::registry::ResolveArgs),
    /// Lint registry, patterns, presets, GPU and cluster profiles together; exit 1 on any error.
    Check(commands::registry::CheckArgs),
}

fn main() -> ExitCode {
    commands::init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Registry(RegistryCommand::Resolve(args)) => commands::registry::resolve(&args),
        Command::Registry(RegistryCommand::Check(args)) => commands::registry::check(&args),
        Command::Spec(args) => commands::spec::spec(&args),
        Command::Preflight(args) => commands::preflight::preflight(&args),
        Command::Plan(args) => commands::queueing::plan_command(&args),
        Command::Launch(args) => commands::queueing::launch_command(&args),
        Command::Sync(args) => commands::queueing::sync_command(&args),
        Command::Status(args) => commands::verify::status(&args),
        Command::Cancel(args) => commands::queueing::cancel_command(&args),
        Command::Remediate(args) => commands::remediation::remediate_command(&args),
        Command::Release(args) => commands::remediation::release_command(&args),
        Command::Hold(args) => commands::remediation::hold_command(&args),
        Command::Move(args) => commands::queueing::move_command(&args),
        Command::Check(args) => commands::verify::check(&args),
        Command::Results(args) => commands::verify::results(&args),
        Command::Compare(args) => commands::verify::compare(&args),
        Command::Report(args) => commands::verify::report(&args),
        Command::Logs(args) => commands::verify::logs(&args),
        Command::Models(command) => commands::catalogue::models(&command),
        Command::Unevaluated(args) => commands::catalogue::unevaluated(&args),
        Command::Import(args) => commands::team::import_command(&args),
        Command::Families(command) => commands::team::families(&command),
        Command::Listener(command) => commands::listener::listener(command),
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
            commands::report_error(&err);
            ExitStatus::of_error(err.chain(), commands::wrapped_status).into()
        }
    }
}

/// Shared `--registry/--clusters/--presets` location flags; default: the discovered config root.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ConfigDirs {
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
