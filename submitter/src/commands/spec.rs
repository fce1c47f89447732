//! `submitter spec`: the launch spec for one (model, benchmark), written without submitting. It
//! takes the same selection and spec options as `plan` and `launch` (one leg, one model).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use launch_spec::records::write_atomically;
use submitter::config::{self, ConfigRoot};
use submitter::launch::{LaunchContext, LaunchOverrides};
use submitter::registry::Registry;
use submitter::selection;

use super::session::SpecOptions;
use crate::ConfigDirs;

#[derive(clap::Args)]
pub struct SpecArgs {
    /// Cluster profile name or alias.
    #[arg(long)]
    cluster: String,
    /// Preset name (presets/<name>.yaml).
    #[arg(long)]
    preset: Option<String>,
    /// A dataset with default settings (instead of a preset).
    #[arg(long = "datasets", value_name = "D")]
    datasets: Option<String>,
    /// Hugging Face model id.
    #[arg(long)]
    model: String,
    /// One of the preset's datasets (default: its first).
    #[arg(long)]
    dataset: Option<String>,
    /// Write the spec here (atomically) instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    #[command(flatten)]
    options: SpecOptions,
    #[command(flatten)]
    dirs: ConfigDirs,
}

pub fn spec(args: &SpecArgs) -> Result<ExitCode> {
    // Checked here rather than by clap, whose message would echo a newline in the id raw.
    config::args::model(&args.model).map_err(|e| anyhow::anyhow!("--model: {e}"))?;
    let dirs = args.dirs.resolve()?;
    let root = ConfigRoot::discover().map(|r| r.root).unwrap_or_else(|_| dirs.clusters.join(".."));
    let cluster = config::load_cluster(&dirs.clusters, &args.cluster)?;
    let gpu_profiles = config::load_gpu_profiles(&dirs.clusters)?;
    let legs =
        selection::legs(&dirs.presets, &Vec::from_iter(args.preset.clone()), &Vec::from_iter(args.datasets.clone()))?;
    let [leg] = legs.as_slice() else {
        bail!("`spec` writes one spec: give one preset (not `ID`), or --datasets D");
    };
    let concurrency = args.options.concurrency();
    concurrency.check(&legs)?;
    let registry =
        Registry::load(&dirs.registry).with_context(|| format!("loading registry {}", dirs.registry.display()))?;
    let harbor_configs = dirs.presets.join("harbor");
    let context = LaunchContext {
        cluster: &cluster,
        gpu_profiles: &gpu_profiles,
        registry: &registry,
        harbor_configs_dir: &harbor_configs,
        root: &root,
    };
    let overrides = LaunchOverrides {
        n_concurrent: concurrency.for_leg(leg),
        dataset: args.dataset.clone(),
        ..args.options.overrides()?
    };
    let spec = context.build(&args.model, &leg.preset, &overrides)?;
    let json = spec.to_json();
    match &args.out {
        None => super::print(&json)?,
        Some(path) => write_atomically(path, json.as_bytes()).with_context(|| format!("writing {}", path.display()))?,
    }
    Ok(ExitCode::SUCCESS)
}
