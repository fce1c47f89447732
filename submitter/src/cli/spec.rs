//! `submitter spec`: the launch spec for one (model, benchmark), written without submitting. It
//! takes the same selection and spec options as `plan` and `launch` (one leg, one model).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{self, ConfigRoot};
use crate::registry::Registry;
use crate::selection;
use crate::spec_build::{SpecBuilder, SpecOverrides};
use anyhow::{Context, Result, bail};
use launch_spec::records::write_atomically;

use super::ConfigDirs;
use super::session::SpecOptions;

#[derive(clap::Args)]
pub(crate) struct SpecArgs {
    /// Cluster profile name or alias (default: $SUBMITTER_CLUSTER, else the profile whose `hosts:`
    /// matches this host).
    #[arg(long, env = "SUBMITTER_CLUSTER")]
    pub cluster: Option<String>,
    /// Preset name (presets/<name>.yaml).
    #[arg(long)]
    pub preset: Option<String>,
    /// A dataset with default settings (instead of a preset).
    #[arg(long = "datasets", value_name = "D")]
    pub datasets: Option<String>,
    /// Hugging Face model id.
    #[arg(long)]
    pub model: String,
    /// One of the preset's datasets (default: its first).
    #[arg(long)]
    pub dataset: Option<String>,
    /// Write the spec here (atomically) instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    options: SpecOptions,
    #[command(flatten)]
    dirs: ConfigDirs,
}

/// The configuration a spec is built from, loaded once.
pub(crate) struct Loaded {
    pub cluster: crate::config::ClusterProfile,
    pub gpu_profiles: launch_spec::GpuProfiles,
    pub registry: Registry,
    pub(crate) harbor_configs: PathBuf,
    pub root: PathBuf,
    /// The one leg's preset (a preset, or the `--datasets` one).
    pub preset: crate::config::Preset,
}

impl Loaded {
    pub(crate) fn context(&self) -> SpecBuilder<'_> {
        SpecBuilder::new(&self.cluster, &self.gpu_profiles, &self.registry, &self.harbor_configs, &self.root)
    }
}

/// Loads the configuration `args` names and builds the spec (nothing written).
pub(crate) fn build(args: &SpecArgs) -> Result<(launch_spec::LaunchSpec, Loaded)> {
    // Checked here rather than by clap, whose message would echo a newline in the id raw.
    let model = config::args::model(&args.model).map_err(|e| anyhow::anyhow!("--model: {e}"))?;
    let dirs = args.dirs.resolve()?;
    let root = ConfigRoot::discover().map(|r| r.root).unwrap_or_else(|_| dirs.clusters.join(".."));
    let presets = Vec::from_iter(args.preset.clone());
    let mut legs = selection::legs(&dirs.presets, &presets, &Vec::from_iter(args.datasets.clone()))?;
    if legs.len() != 1 {
        bail!("`spec` writes one spec: give one preset (not `ID`), or --datasets D");
    }
    let concurrency = args.options.concurrency();
    concurrency.check(&legs)?;
    let n_concurrent = concurrency.for_leg(&legs[0]);
    let loaded = Loaded {
        cluster: config::load_cluster(
            &dirs.clusters,
            &super::session::cluster_name(args.cluster.as_deref(), &dirs.clusters)?,
        )?,
        gpu_profiles: config::load_gpu_profiles(&dirs.clusters)?,
        preset: legs.remove(0).preset,
        registry: Registry::load(&dirs.registry)
            .with_context(|| format!("loading registry {}", dirs.registry.display()))?,
        harbor_configs: dirs.presets.join("harbor"),
        root,
    };
    loaded.registry.report_broken();
    let overrides = SpecOverrides { n_concurrent, dataset: args.dataset.clone(), ..args.options.overrides()? };
    let spec = loaded.context().build(&model, &loaded.preset, &overrides)?;
    Ok((spec, loaded))
}

/// Writes the spec to `--out` (atomically) or stdout.
pub(crate) fn write(args: &SpecArgs, spec: &launch_spec::LaunchSpec) -> Result<()> {
    let json = spec.to_json();
    match &args.out {
        None => super::print(&json),
        Some(path) => write_atomically(path, json.as_bytes()).with_context(|| format!("writing {}", path.display())),
    }
}

pub(crate) fn spec(args: &SpecArgs) -> Result<ExitCode> {
    let (spec, _) = build(args)?;
    write(args, &spec)?;
    // On stderr: stdout may be the spec itself.
    let _ = writeln!(std::io::stderr(), "ready     {}: {}", spec.model.hf_id, spec.serve.readiness_line());
    Ok(ExitCode::SUCCESS)
}
