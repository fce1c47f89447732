//! `submitter models add|import|list` and `submitter unevaluated`: the ledger's model catalogue
//! and the query that builds a priority list of models not yet evaluated on a benchmark family.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use submitter::config::lists;

use super::session::{LedgerArgs, Session};

#[derive(clap::Subcommand)]
pub enum ModelsCommand {
    /// Register model ids in the catalogue (idempotent).
    Add {
        #[command(flatten)]
        ledger: LedgerArgs,
        /// The base model these were trained from, where known.
        #[arg(long)]
        base: Option<String>,
        #[arg(required = true)]
        models: Vec<String>,
    },
    /// Register every id of a list file (one per line, `#` comments).
    Import {
        #[command(flatten)]
        ledger: LedgerArgs,
        file: PathBuf,
    },
    /// The catalogue: id, size class, registration time, base model.
    List {
        #[command(flatten)]
        ledger: LedgerArgs,
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
pub struct UnevaluatedArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    /// Benchmark (or family name): its whole family counts, as in dedup.
    #[arg(long)]
    benchmark: String,
    /// Only this size class: 8 (total ≤ 14.5B) or 32 (28–42B; MoE by total size), any other number
    /// an exact total size. The id's size token, else its base model's.
    #[arg(long)]
    size: Option<String>,
    /// Write the list here instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
}

pub fn models(command: &ModelsCommand) -> Result<ExitCode> {
    match command {
        ModelsCommand::Add { ledger, base, models } => {
            let session = Session::open(ledger)?;
            let mut added = 0;
            for model in models {
                added += usize::from(session.ledger.add_model(model, base.as_deref())?);
            }
            super::print(&format!("{added} model(s) added, {} already known\n", models.len() - added))?;
        }
        ModelsCommand::Import { ledger, file } => {
            let session = Session::open(ledger)?;
            let models = lists::read_model_list(file)?;
            let mut added = 0;
            for model in &models {
                added += usize::from(session.ledger.add_model(model, None)?);
            }
            super::print(&format!(
                "{added} model(s) added from {}, {} already known\n",
                file.display(),
                models.len() - added
            ))?;
        }
        ModelsCommand::List { ledger, json } => {
            let session = Session::open(ledger)?;
            let models = session.ledger.list_models()?;
            if *json {
                super::print(&(serde_json::to_string_pretty(&models)? + "\n"))?;
            } else {
                let mut out = String::new();
                for m in &models {
                    out += &format!(
                        "{:<60} {:>6}  {}  {}\n",
                        m.id,
                        m.size_class.as_deref().unwrap_or("-"),
                        m.registered_at.format("%Y-%m-%d %H:%M"),
                        m.base_model.as_deref().unwrap_or("-")
                    );
                }
                out += &format!("{} model(s)\n", models.len());
                super::print(&out)?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn unevaluated(args: &UnevaluatedArgs) -> Result<ExitCode> {
    let session = Session::open(&args.ledger)?;
    let family = session.ledger.family_of(&args.benchmark)?;
    let models = session.ledger.unevaluated(&family, args.size.as_deref())?;
    let mut text = format!("# {} model(s) with no finished attempt in benchmark family {family}\n", models.len());
    for model in &models {
        text += model;
        text.push('\n');
    }
    match &args.output {
        Some(path) => {
            launch_spec::records::write_atomically(path, text.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
            super::print(&format!("{} model(s) written to {}\n", models.len(), path.display()))?;
        }
        None => super::print(&text)?,
    }
    Ok(ExitCode::SUCCESS)
}
