//! `submitter preflight`: what `launch` checks on the login node before `sbatch`, for one
//! (model, benchmark), without the ledger — the way to try a new cluster profile (docs/site.md).

use std::process::ExitCode;

use crate::output::{self, ExitStatus, FormatArgs};
use crate::preflight::{self, Site, SlurmQueries};
use crate::slurm::SlurmCli;
use crate::stage::Stager;
use anyhow::Result;

use super::spec::SpecArgs;

#[derive(clap::Args)]
pub(crate) struct PreflightArgs {
    #[command(flatten)]
    spec: SpecArgs,
    /// Also stage what the job needs (the model into the profile's cache, the dataset into its
    /// dir), as `launch` does; without it a missing dataset is a failure.
    #[arg(long)]
    stage: bool,
    /// The Slurm settings `launch` takes (`--partition`, `--reservation`, `--no-reservation`, …):
    /// preflight judges what sbatch would get.
    #[command(flatten)]
    slurm: super::session::SlurmOptions,
    #[command(flatten)]
    format: FormatArgs,
}

/// The `preflight` JSON document's body.
#[derive(serde::Serialize)]
struct PreflightOutput<'a> {
    cluster: &'a str,
    run_tag: &'a str,
    passed: bool,
    checks: Vec<PreflightCheckOutput<'a>>,
}

/// One login-node check (docs/site.md lists them).
#[derive(serde::Serialize)]
struct PreflightCheckOutput<'a> {
    name: &'static str,
    /// `ok`, `skipped` (could not be checked from here; never blocks) or `fail`.
    level: &'static str,
    detail: &'a str,
}

/// Exit 0 when every check passed (the spec is then written as `submitter spec` would), else 1
/// (`ExitStatus::Problems`).
pub(crate) fn preflight(args: &PreflightArgs) -> Result<ExitCode> {
    let (spec, loaded) = super::spec::build(&args.spec)?;
    let context = loaded.context();
    let slurm = SlurmCli::new();
    let queries = SlurmQueries(&slurm);
    let payload = super::payload_binary(&context, &loaded.cluster, &loaded.root)?;
    let site = Site::here(&loaded.root, &queries).with_payload(payload);
    // The spec was built: the dataset is the preset's.
    let dataset = crate::settings::dataset(args.spec.dataset.as_deref(), &loaded.preset)
        .map_or_else(|(asked, _)| asked, |d| d.value);
    if args.stage {
        let stager = Stager::new(&context);
        stager.model(&spec.model.hf_id).map_err(|why| anyhow::anyhow!("staging failed: {why}"))?;
        stager.dataset(&dataset, &spec.harbor.dataset).map_err(|why| anyhow::anyhow!("staging failed: {why}"))?;
    }
    // The Slurm settings as `launch` resolves them for this leg (command line > preset > profile),
    // capped at the partition's walltime limit.
    let none = crate::spec_build::SpecOverrides::default();
    let choices = crate::settings::Choices { spec: &none, slurm: &args.slurm.overrides(), allocation: None };
    let mut settings = context.settings(&spec.model.hf_id, &loaded.preset, choices, None);
    let max_time = slurm.partition_max_time(&settings.partition.value).unwrap_or(None);
    if let Some((max_s, source)) =
        crate::settings::partition_limit(&loaded.cluster, &settings.partition.value, max_time.as_deref())
    {
        settings.cap_time(max_s, &source);
    }
    let report = preflight::preflight(&spec, &settings.slurm_choice(), &loaded.cluster, &site);
    let passed = report.passed();
    if passed && args.spec.out.is_some() {
        super::spec::write(&args.spec, &spec)?;
    }
    if args.format.is_json() {
        let checks = report
            .checks
            .iter()
            .map(|c| PreflightCheckOutput { name: c.name, level: level(c.level), detail: &c.detail })
            .collect();
        let body = PreflightOutput { cluster: &loaded.cluster.name, run_tag: &spec.run_tag, passed, checks };
        super::print(&output::document("preflight", &body))?;
    } else {
        let verdict = if passed { "passed" } else { "FAILED" };
        let text = format!("preflight {} on {}: {verdict}\n{}", spec.run_tag, loaded.cluster.name, report.table());
        super::print(&text)?;
    }
    Ok(if passed { ExitStatus::Success } else { ExitStatus::Problems }.into())
}

fn level(level: preflight::Level) -> &'static str {
    match level {
        preflight::Level::Ok => "ok",
        preflight::Level::Skipped => "skipped",
        preflight::Level::Fail => "fail",
    }
}
