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
    pub cluster: String,
    /// Preset name (presets/<name>.yaml).
    #[arg(long)]
    pub preset: String,
    /// Hugging Face model id.
    #[arg(long)]
    pub model: String,
    /// One of the preset's datasets (default: its first).
    #[arg(long)]
    pub dataset: Option<String>,
    /// Write the spec here (atomically) instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
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

/// The configuration a spec is built from, loaded once.
pub struct Loaded {
    pub cluster: submitter::config::ClusterProfile,
    pub gpu_profiles: launch_spec::GpuProfiles,
    pub registry: Registry,
    pub harbor_configs: PathBuf,
    pub root: PathBuf,
    pub preset: submitter::config::Preset,
}

impl Loaded {
    pub fn context(&self) -> LaunchContext<'_> {
        LaunchContext {
            cluster: &self.cluster,
            gpu_profiles: &self.gpu_profiles,
            registry: &self.registry,
            harbor_configs_dir: &self.harbor_configs,
            root: &self.root,
        }
    }
}

/// Loads the configuration `args` names and builds the spec (nothing written).
pub fn build(args: &SpecArgs) -> Result<(launch_spec::LaunchSpec, Loaded)> {
    // Checked here rather than by clap, whose message would echo a newline in the id raw.
    config::args::model(&args.model).map_err(|e| anyhow::anyhow!("--model: {e}"))?;
    let dirs = args.dirs.resolve()?;
    let root = ConfigRoot::discover().map(|r| r.root).unwrap_or_else(|_| dirs.clusters.join(".."));
    let loaded = Loaded {
        cluster: config::load_cluster(&dirs.clusters, &args.cluster)?,
        gpu_profiles: config::load_gpu_profiles(&dirs.clusters)?,
        preset: config::load_preset(&dirs.presets, &args.preset)?,
        registry: Registry::load(&dirs.registry)
            .with_context(|| format!("loading registry {}", dirs.registry.display()))?,
        harbor_configs: dirs.presets.join("harbor"),
        root,
    };
    let overrides = LaunchOverrides {
        timeout_multiplier: args.timeout_multiplier,
        agent_kwargs: args.agent_kwargs.clone(),
        gpu_memory_utilization: args.gpu_memory_utilization,
        n_concurrent: args.n_concurrent,
        dataset: args.dataset.clone(),
    };
    let spec = loaded.context().build(&args.model, &loaded.preset, &overrides)?;
    Ok((spec, loaded))
}

/// Writes the spec to `--out` (atomically) or stdout.
pub fn write(args: &SpecArgs, spec: &launch_spec::LaunchSpec) -> Result<()> {
    let json = spec.to_json();
    match &args.out {
        None => super::print(&json),
        Some(path) => write_atomically(path, json.as_bytes()).with_context(|| format!("writing {}", path.display())),
    }
}

pub fn spec(args: &SpecArgs) -> Result<ExitCode> {
    let (spec, _) = build(args)?;
    write(args, &spec)?;
    Ok(ExitCode::SUCCESS)
}
