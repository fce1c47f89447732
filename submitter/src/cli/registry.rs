//! `submitter registry resolve|check`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{self, lists};
use crate::lint::{self, Severity};
use crate::output::{self, FormatArgs};
use crate::registry::{Overrides, Registry, Resolved, TimeoutSource};
use anyhow::{Context, Result, bail};
use launch_spec::ModelId;
use launch_spec::layout::Layout;
use serde::Serialize;

use super::{ConfigDirs, EXIT_PROBLEMS};

#[derive(clap::Args)]
pub(crate) struct ResolveArgs {
    /// Model registry directory (default: model_config/ of the configuration root).
    #[arg(long, value_name = "DIR")]
    registry: Option<PathBuf>,
    /// Hardware profile (registry variant name). Default: the cluster's, else `default`.
    #[arg(long)]
    profile: Option<String>,
    /// GPUs per node, for the data-parallel default. Default: the cluster's.
    #[arg(long, value_name = "N")]
    gpus_per_node: Option<u32>,
    /// Take the profile and GPUs per node from this cluster profile.
    #[arg(long)]
    cluster: Option<String>,
    /// Cluster profiles directory (default: clusters/ of the configuration root).
    #[arg(long, value_name = "DIR")]
    clusters: Option<PathBuf>,
    /// Override the timeout multiplier for every model.
    #[arg(long, value_name = "X", value_parser = config::args::multiplier)]
    timeout_multiplier: Option<f64>,
    /// `--format json`: a `registry.resolve` document, the settings keyed by model id.
    #[command(flatten)]
    format: FormatArgs,
    /// A file of model ids, one per line (`#` comments allowed).
    #[arg(long, value_name = "FILE", conflicts_with = "models")]
    models_file: Option<PathBuf>,
    /// Model ids.
    #[arg(value_name = "MODEL", required_unless_present = "models_file")]
    models: Vec<String>,
}

#[derive(clap::Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    dirs: ConfigDirs,
    /// Also print warnings' count only (errors are always listed).
    #[arg(long)]
    quiet: bool,
    /// `--format json`: a `registry.check` document with every finding.
    #[command(flatten)]
    format: FormatArgs,
}

pub(crate) fn resolve(args: &ResolveArgs) -> Result<ExitCode> {
    let dirs = ConfigDirs {
        registry_dir: args.registry.clone(),
        clusters_dir: args.clusters.clone(),
        ..ConfigDirs::default()
    };
    let (profile, gpus_per_node, max_nodes) = match &args.cluster {
        Some(name) => {
            let clusters = match &args.clusters {
                Some(dir) => dir.clone(),
                None => dirs.resolve()?.clusters,
            };
            let cluster = config::load_cluster(&clusters, name)?;
            (
                args.profile.clone().unwrap_or(cluster.hardware.hardware_profile),
                args.gpus_per_node.unwrap_or(cluster.hardware.gpus_per_node),
                cluster.slurm.max_nodes,
            )
        }
        None => {
            let Some(gpus) = args.gpus_per_node else {
                bail!("give --gpus-per-node N (GPUs on one node, for the data-parallel default) or --cluster NAME");
            };
            (args.profile.clone().unwrap_or_else(|| crate::registry::DEFAULT_PROFILE.to_string()), gpus, 1)
        }
    };
    if gpus_per_node == 0 {
        bail!("--gpus-per-node must be at least 1");
    }
    let registry_dir = match &args.registry {
        Some(dir) => dir.clone(),
        None => dirs.resolve()?.registry,
    };
    let registry =
        Registry::load(&registry_dir).with_context(|| format!("loading registry {}", registry_dir.display()))?;
    let models = match &args.models_file {
        Some(file) => lists::read_model_list(file)?,
        None => args
            .models
            .iter()
            .map(|m| config::args::model(m).map_err(|e| anyhow::anyhow!("MODEL: {e}")))
            .collect::<Result<_>>()?,
    };
    let overrides = Overrides { timeout_multiplier: args.timeout_multiplier, ..Overrides::default() };
    let mut resolved: Vec<(ModelId, Resolved, Layout)> = Vec::with_capacity(models.len());
    let mut fallback = Vec::new();
    registry.report_broken();
    for model in models {
        if let Some(problem) = registry.problem_for(&model, &profile) {
            bail!("{problem}");
        }
        let settings = registry.resolve(&model, &profile, gpus_per_node, &overrides);
        let layout = settings
            .layout(gpus_per_node, max_nodes)
            .map_err(|e| anyhow::anyhow!("model `{model}` on profile `{profile}` (rule {}): {e}", settings.rule))?;
        if settings.timeout_source == TimeoutSource::Fallback {
            fallback.push(model.clone());
        }
        resolved.push((model, settings, layout));
    }
    warn_timeout_fallback(&fallback, &registry);
    let text = if args.format.is_json() {
        to_json(&resolved, &profile, gpus_per_node)
    } else {
        to_table(&resolved, &profile, gpus_per_node)
    };
    super::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// One note for all models whose timeout multiplier is the policy's fallback (docs/design.md §4.3).
fn warn_timeout_fallback(models: &[ModelId], registry: &Registry) {
    let value = registry.timeouts.otherwise.timeout_multiplier;
    match models {
        [] => {}
        [one] => tracing::warn!(
            "timeout multiplier of {one}: its size is in no band of _timeouts.yaml (or it has no size token); using the fallback {value:.1}"
        ),
        many => tracing::warn!(
            "timeout multiplier of {} models: their size is in no band of _timeouts.yaml (or they have no size token), e.g. {}; using the fallback {value:.1}",
            many.len(),
            many.iter().take(3).map(ModelId::as_str).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// `registry.resolve`: the profile and GPU count resolved against, and each model's settings.
#[derive(Serialize)]
struct ResolveOutput<'a> {
    profile: &'a str,
    gpus_per_node: u32,
    /// By model id, in the order given.
    models: serde_json::Map<String, serde_json::Value>,
}

fn to_json(resolved: &[(ModelId, Resolved, Layout)], profile: &str, gpus_per_node: u32) -> String {
    let models = resolved
        .iter()
        .map(|(model, settings, layout)| {
            let value = serde_json::to_value(output::ServeSettings::new(settings, Some(layout))).unwrap_or_default();
            (model.to_string(), value)
        })
        .collect();
    output::document("registry.resolve", &ResolveOutput { profile, gpus_per_node, models })
}

fn to_table(resolved: &[(ModelId, Resolved, Layout)], profile: &str, gpus: u32) -> String {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".to_string());
    let rows: Vec<[String; 9]> = resolved
        .iter()
        .map(|(model, r, layout)| {
            [
                model.to_string(),
                parallel_cell(r, layout),
                opt(r.max_model_len.map(|v| v.to_string())),
                opt(r.swap_space.map(|v| v.to_string())),
                opt(match (&r.tool_call_parser, &r.reasoning_parser) {
                    (None, None) => None,
                    (t, re) => Some(format!("{}/{}", t.as_deref().unwrap_or("-"), re.as_deref().unwrap_or("-"))),
                }),
                opt(r.conda_env.clone()),
                format!("{:.1}", r.timeout_multiplier),
                opt(r.max_num_seqs.map(|v| v.to_string())),
                r.rule.clone(),
            ]
        })
        .collect();
    let header = ["MODEL", "TPxDP", "MAX_LEN", "SWAP", "PARSERS", "ENV", "TIMEOUT", "SEQS", "RULE"];
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ").trim_end().to_string()
            + "\n"
    };
    let mut out = format!("# profile {profile}, {gpus} GPUs per node\n");
    out += &line(header.to_vec());
    for row in &rows {
        out += &line(row.iter().map(String::as_str).collect());
    }
    out
}

/// `TPxDP`, with `/ppN` when pipelined and `@N nodes (X crosses)` when multi-node.
fn parallel_cell(r: &Resolved, layout: &Layout) -> String {
    let mut cell = format!("{}x{}", r.tensor_parallel_size, r.data_parallel_size);
    if r.pipeline_parallel_size > 1 {
        cell += &format!("/pp{}", r.pipeline_parallel_size);
    }
    if layout.is_multi_node() {
        cell += &format!("@{}nodes({})", layout.nodes, layout.crossing.as_str());
    }
    cell
}

pub(crate) fn check(args: &CheckArgs) -> Result<ExitCode> {
    let dirs = args.dirs.resolve()?;
    let findings =
        lint::check(&lint::LintInputs { registry: &dirs.registry, clusters: &dirs.clusters, presets: &dirs.presets });
    let errors = findings.iter().filter(|f| f.severity == Severity::Error).count();
    let warnings = findings.len() - errors;
    if args.format.is_json() {
        let findings = findings
            .iter()
            .map(|f| FindingOutput {
                severity: match f.severity {
                    Severity::Error => "error",
                    Severity::Warning => "warning",
                },
                place: &f.place,
                message: &f.message,
            })
            .collect();
        super::print(&output::document("registry.check", &CheckOutput { errors, warnings, findings }))?;
        return Ok(if errors > 0 { ExitCode::from(EXIT_PROBLEMS) } else { ExitCode::SUCCESS });
    }
    let mut out = String::new();
    for finding in &findings {
        if finding.severity == Severity::Error || !args.quiet {
            out += &format!("{finding}\n");
        }
    }
    out += &format!("{errors} error(s), {warnings} warning(s)\n");
    super::print(&out)?;
    Ok(if errors > 0 { ExitCode::from(EXIT_PROBLEMS) } else { ExitCode::SUCCESS })
}

/// `registry.check`: the counts and every finding, errors and warnings, in lint order.
#[derive(Serialize)]
struct CheckOutput<'a> {
    errors: usize,
    warnings: usize,
    findings: Vec<FindingOutput<'a>>,
}

#[derive(Serialize)]
struct FindingOutput<'a> {
    /// `error` or `warning`.
    severity: &'static str,
    /// `file`, `file:line:col` or a logical place (`cluster leonardo`).
    place: &'a str,
    message: &'a str,
}
