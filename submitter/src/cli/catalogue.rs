//! `submitter models add|import|list` and `submitter unevaluated`: the ledger's model catalogue
//! and the query that builds a priority list of models not yet evaluated on a benchmark family.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::lists;
use crate::output::{self, FormatArgs};
use anyhow::{Context, Result};
use chrono::SecondsFormat;
use serde::Serialize;

use super::session::{LedgerArgs, Session};

#[derive(clap::Subcommand)]
pub(crate) enum ModelsCommand {
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
        /// `--format json`: a `models.list` document.
        #[command(flatten)]
        format: FormatArgs,
    },
}

#[derive(clap::Args)]
pub(crate) struct UnevaluatedArgs {
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
    /// `--format json`: an `unevaluated` document on stdout (with `-o`, the file stays a model list).
    #[command(flatten)]
    format: FormatArgs,
}

pub(crate) fn models(command: &ModelsCommand) -> Result<ExitCode> {
    match command {
        ModelsCommand::Add { ledger, base, models } => {
            // The ids every other command accepts, checked before the ledger is opened: no escape
            // sequence, newline or control character is ever stored (issue 21).
            let check = |id: &String| {
                crate::config::args::model(id).map_err(|problem| anyhow::anyhow!("models add: {problem}"))
            };
            let ids = models.iter().map(check).collect::<Result<Vec<_>>>()?;
            let base = base.as_ref().map(check).transpose()?;
            let session = Session::open(ledger)?;
            let mut added = 0;
            for model in &ids {
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
        ModelsCommand::List { ledger, format } => {
            let session = Session::open_read_only(ledger)?;
            let models = session.ledger.list_models()?;
            if format.is_json() {
                let models = models
                    .iter()
                    .map(|m| ModelOutput {
                        id: &m.id,
                        size_class: m.size_class.as_deref(),
                        registered_at: m.registered_at.to_rfc3339_opts(SecondsFormat::Micros, true),
                        base_model: m.base_model.as_deref(),
                    })
                    .collect();
                super::print(&output::document("models.list", &ModelsOutput { models }))?;
            } else {
                // Cells are escaped by the table: a ledger written by an older submitter (or by
                // hand) may hold control characters, which must not reach the terminal raw.
                let mut table = crate::term::Terminal::stdout().table(["model", "size", "registered", "base"]);
                for m in &models {
                    table.row([
                        m.id.as_str(),
                        m.size_class.as_deref().unwrap_or("-"),
                        &m.registered_at.format("%Y-%m-%d %H:%M").to_string(),
                        m.base_model.as_deref().unwrap_or("-"),
                    ]);
                }
                let mut out = table.right(1).keep(1).keep(2).render();
                out += &format!("{} model(s)\n", models.len());
                super::print(&out)?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn unevaluated(args: &UnevaluatedArgs) -> Result<ExitCode> {
    let session = Session::open_read_only(&args.ledger)?;
    let family = session.benchmark_family(&args.benchmark)?;
    let models = session.ledger.unevaluated(&family, args.size.as_deref())?;
    let mut text = format!("# {} model(s) with no finished attempt in benchmark family {family}\n", models.len());
    for model in &models {
        text += &crate::text::printable(model);
        text.push('\n');
    }
    if let Some(path) = &args.output {
        launch_spec::records::write_atomically(path, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let written = args.output.as_ref().map(|path| path.display().to_string());
    if args.format.is_json() {
        let doc = UnevaluatedOutput {
            family: &family,
            size: args.size.as_deref(),
            models: &models,
            written_to: written.as_deref(),
        };
        super::print(&output::document("unevaluated", &doc))?;
    } else if let Some(path) = &written {
        super::print(&format!("{} model(s) written to {path}\n", models.len()))?;
    } else {
        super::print(&text)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `models.list`: the catalogue in registration order.
#[derive(Serialize)]
struct ModelsOutput<'a> {
    models: Vec<ModelOutput<'a>>,
}

#[derive(Serialize)]
struct ModelOutput<'a> {
    id: &'a str,
    /// The id's total size token (`"8"`, `"1.5"`), null when it has none.
    size_class: Option<&'a str>,
    /// RFC 3339, UTC.
    registered_at: String,
    base_model: Option<&'a str>,
}

/// `unevaluated`: catalogue models with no finished attempt in `family`, in priority order.
#[derive(Serialize)]
struct UnevaluatedOutput<'a> {
    family: &'a str,
    /// The `--size` class asked for, null for all.
    size: Option<&'a str>,
    models: &'a [String],
    /// The `-o` file the list was also written to, null when none.
    written_to: Option<&'a str>,
}
