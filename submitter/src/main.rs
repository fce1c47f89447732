//! `submitter`: the login-node program. This file only parses arguments and wires commands; the
//! logic lives in the library (`submitter::…`) and in `commands/`.

mod commands;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit codes: 0 success, 1 a check found problems, 2 bad input or configuration.
pub const EXIT_PROBLEMS: u8 = 1;
pub const EXIT_BAD_INPUT: u8 = 2;

#[derive(Parser)]
#[command(name = "submitter", version, about = "Plan, submit and verify agentic LLM evaluations on Slurm")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Model registry: resolve serve settings, lint the configuration.
    #[command(subcommand)]
    Registry(RegistryCommand),
    /// Write the launch spec for one (model, benchmark) without submitting anything (for
    /// `payload run --spec` by hand inside `salloc`).
    Spec(commands::spec::SpecArgs),
}

#[derive(Subcommand)]
enum RegistryCommand {
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
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            commands::report_error(&err);
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

/// Shared `--registry/--clusters/--presets` location flags; default: the discovered config root.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ConfigDirs {
    /// Model registry directory (model_config/).
    #[arg(long, value_name = "DIR")]
    pub registry: Option<PathBuf>,
    /// Cluster profiles directory (clusters/).
    #[arg(long, value_name = "DIR")]
    pub clusters: Option<PathBuf>,
    /// Presets directory (presets/).
    #[arg(long, value_name = "DIR")]
    pub presets: Option<PathBuf>,
}
