//! `submitter spec`: the launch spec for one (model, benchmark), written without submitting.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use launch_spec::records::write_atomically;
use submitter::config::{self, ConfigRoot};
use submitter::launch::{LaunchContext, LaunchOverrides};
use submitter::registry::Registry;

use crate::ConfigDirs;

#[derive(clap::Args)]
pub struct SpecArgs {
    /// Cluster profile name or alias.
    #[arg(long)]
    cluster: String,
    /// Preset name (presets/<name>.yaml).
    #[arg(long)]
    preset: String,
    /// Hugging Face model id.
    #[arg(long)]
    model: String,
    /// One of the preset's datasets (default: its first).
    #[arg(long)]
    dataset: Option<String>,
    /// Write the spec here (atomically) instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Operator override of the timeout multiplier.
    #[arg(long, value_name = "X", value_parser = config::args::multiplier)]
    timeout_multiplier: Option<f64>,
    /// Agent kwarg `key=value` (repeatable); wins over registry and preset.
    #[arg(long = "agent-kwarg", value_name = "K=V")]
    agent_kwargs: Vec<String>,
    /// Operator override of the GPU-memory ceiling (wins over cluster and GPU profile).
    #[arg(long, value_name = "F", value_parser = config::args::fraction)]
    gpu_memory_utilization: Option<f64>,
    /// Harbor concurrency (clamped to the cluster's ceiling).
    #[arg(long, value_name = "N", value_parser = config::args::count)]
    n_concurrent: Option<u32>,
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
    let preset = config::load_preset(&dirs.presets, &args.preset)?;
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
        timeout_multiplier: args.timeout_multiplier,
        agent_kwargs: args.agent_kwargs.clone(),
        gpu_memory_utilization: args.gpu_memory_utilization,
        n_concurrent: args.n_concurrent,
        dataset: args.dataset.clone(),
    };
    let spec = context.build(&args.model, &preset, &overrides)?;
    let json = spec.to_json();
    match &args.out {
        None => super::print(&json)?,
        Some(path) => write_atomically(path, json.as_bytes()).with_context(|| format!("writing {}", path.display()))?,
    }
    Ok(ExitCode::SUCCESS)
}
