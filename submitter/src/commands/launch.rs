//! `submitter plan|launch|sync|status|cancel`: the queueing loop against one ledger and Slurm.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use submitter::decide::{Policy, SlurmView, Verdict};
use submitter::ledger::{AttemptId, Status};
use submitter::output::ExitStatus;
use submitter::plan::{self, Executables, LedgerView, PlannedJob, SubmitSettings};
use submitter::preflight;
use submitter::slurm::Slurm;
use submitter::sync::{self, SyncReport};
use submitter::team::mirror::Mirror;

use super::session::{LedgerArgs, Selection, Session};

#[derive(clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    #[command(flatten)]
    selection: Selection,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct LaunchArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    #[command(flatten)]
    selection: Selection,
    /// One iteration: sync, plan, submit.
    #[arg(long, conflicts_with = "watch")]
    once: bool,
    /// The long-running listener: iterate every --interval, re-reading the lists each time.
    #[arg(long, requires = "interval")]
    watch: bool,
    /// Time between iterations (`30s`, `10m`, `1h`).
    #[arg(long, value_parser = parse_duration)]
    interval: Option<Duration>,
    /// Chain submissions in batches of N with --dependency=afterany (0 = off).
    #[arg(long, default_value_t = 0)]
    chain_batch: usize,
    /// The staleness bound recorded with this submitter's heartbeat: other clusters flag this
    /// cluster's attempts when no sync refreshed them for longer (default 1h; with --watch at
    /// least 3 × --interval).
    #[arg(long, value_parser = parse_duration, value_name = "D")]
    stale_after: Option<Duration>,
    /// Publish this submitter's attempts to the team's database (OT-Agent `sandbox_jobs`): the
    /// URL, or alone to take it from $SUBMITTER_TEAM_DB (where a password must be).
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    mirror: Option<String>,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct SyncArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    /// The staleness bound recorded with this submitter's heartbeat (default 1h).
    #[arg(long, value_parser = parse_duration, value_name = "D")]
    stale_after: Option<Duration>,
    /// Publish Started/Finished to the team's database, as for `launch --mirror`.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    mirror: Option<String>,
    #[arg(long)]
    json: bool,
}

/// The `--mirror` connection, when asked for. Connecting is checked up front (a wrong URL is an
/// error before anything is submitted); later publishing failures only warn.
fn open_mirror(flag: Option<&str>, session: &Session) -> Result<Option<Mirror>> {
    let Some(flag) = flag else { return Ok(None) };
    let url = super::team::team_url(Some(flag).filter(|f| !f.is_empty()), "--mirror")?;
    let username = std::env::var("USER").unwrap_or_else(|_| "unknown".to_string());
    Ok(Some(Mirror::connect(&url, &username, session.ledger.location()).context("--mirror")?))
}

/// The staleness bound to record: the flag, else the default, never under 3 intervals of a watch.
fn stale_after_s(flag: Option<Duration>, interval: Option<Duration>) -> u64 {
    match flag {
        Some(bound) => bound.as_secs(),
        None => sync::DEFAULT_STALE_AFTER_S.max(interval.map_or(0, |i| 3 * i.as_secs())),
    }
}

/// `status` lives in `commands/verify.rs` (launch verification).
pub use super::verify::StatusArgs;

#[derive(clap::Args)]
pub struct CancelArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    /// Slurm job ids to cancel.
    #[arg(long = "job", value_name = "ID")]
    jobs: Vec<String>,
    /// Cancel the active attempts of these models (all benchmarks unless --benchmark).
    #[arg(long = "model", value_name = "M")]
    models: Vec<String>,
    #[arg(long = "benchmark", value_name = "B")]
    benchmarks: Vec<String>,
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    submitter::config::args::duration(text)
}

fn policy(session: &Session, selection: &Selection) -> Policy {
    Policy {
        max_failed_attempts: session.cluster.limits.max_attempts,
        stale_pending_s: (session.cluster.limits.stale_pending_hours * 3600.0) as u64,
        config_aware: selection.config_aware,
        force: selection.force,
    }
}

/// Slurm's view of the jobs of the active attempts in `view`, read in one `squeue` call (no
/// writes). Taken after the ledger snapshot, so every job id in it was submitted before Slurm is
/// asked: a job another submitter just queued is never mistaken for a vanished one.
fn job_views(session: &Session, view: &LedgerView) -> Result<HashMap<String, SlurmView>> {
    let ids: Vec<_> = view
        .pairs
        .values()
        .map(|pair| &pair.latest)
        .filter(|a| a.status.is_active() && a.cluster == session.cluster.name)
        .filter_map(|a| a.slurm_job_id.as_deref()?.parse().ok())
        .collect();
    let jobs = if ids.is_empty() { Vec::new() } else { session.slurm.jobs(&ids)? };
    Ok(jobs.iter().map(|j| (j.id.to_string(), sync::view_of(Some(j)))).collect())
}

fn plan_table(planned: &[PlannedJob]) -> String {
    let mut out = String::new();
    for job in planned {
        out += &format!(
            "{:<9} {:<48} {:<34} {}x{} {:>5.1}x  {}\n",
            format!("{:?}", job.decision).to_lowercase(),
            job.model,
            job.benchmark,
            job.resources.tensor_parallel_size,
            job.resources.data_parallel_size,
            job.timeout_multiplier,
            job.reason
        );
    }
    for job in planned {
        if let Some(flag) = &job.flag {
            out += &format!("flagged   {} {}: {flag}\n", job.model, job.benchmark);
        }
    }
    let tunnels: std::collections::BTreeSet<(&str, &str)> =
        planned.iter().map(|j| (j.preset.as_str(), j.tunnel.as_str())).collect();
    for (preset, tunnel) in tunnels {
        out += &format!("tunnel    {preset}: {tunnel}\n");
    }
    let count = |v: Verdict| planned.iter().filter(|j| j.decision == v).count();
    out += &format!(
        "{} submit, {} resubmit, {} skip\n",
        count(Verdict::Submit),
        count(Verdict::Resubmit),
        count(Verdict::Skip)
    );
    out
}

pub fn plan_command(args: &PlanArgs) -> Result<ExitCode> {
    args.selection.check()?;
    let session = Session::open(&args.ledger)?;
    let presets = args.selection.presets(&session.presets_dir)?;
    let models = args.selection.models(session.ledger.as_ref())?;
    let view = LedgerView::read(session.ledger.as_ref())?;
    let views = job_views(&session, &view)?;
    let planned = plan::plan(
        &session.context(),
        &presets,
        &models,
        &args.selection.overrides(),
        &view,
        &views,
        &policy(&session, &args.selection),
    )?;
    super::print(&if args.json { serde_json::to_string_pretty(&planned)? + "\n" } else { plan_table(&planned) })?;
    Ok(ExitCode::SUCCESS)
}

/// One iteration: sync, re-read lists, plan, submit. Any ledger/Slurm error ends it (fail closed).
/// Returns the text to print and how many submissions failed.
fn iterate(
    session: &Session,
    args: &LaunchArgs,
    executables: &Executables,
    mirror: Option<&Mirror>,
) -> Result<(String, usize)> {
    let stale_after = stale_after_s(args.stale_after, args.interval.filter(|_| args.watch));
    let report = sync::sync_and_heartbeat(
        session.ledger.as_ref(),
        &session.slurm,
        &session.cluster.name,
        stale_after,
        &session.cluster.verify,
        mirror,
    )
    .context("sync")?;
    let presets = args.selection.presets(&session.presets_dir)?;
    let models = args.selection.models(session.ledger.as_ref())?;
    let view = LedgerView::read(session.ledger.as_ref())?;
    let views = job_views(session, &view)?;
    let overrides = args.selection.overrides();
    let planned = plan::plan(
        &session.context(),
        &presets,
        &models,
        &overrides,
        &view,
        &views,
        &policy(session, &args.selection),
    )?;
    let environment = |name: &str| std::env::var(name).ok();
    // Staging and preflight (docs/site.md): each model once per iteration, before any ledger row.
    let context = session.context();
    let stager = submitter::stage::Stager::new(&context);
    let queries = preflight::SlurmQueries(&session.slurm);
    let site = preflight::Site::here(&session.root, &queries);
    let prepare = |job: &PlannedJob, spec: &launch_spec::LaunchSpec| {
        preflight::stage_and_check(&stager, &job.dataset, spec, &session.cluster, &site).map(drop)
    };
    let settings = SubmitSettings {
        max_in_flight: session.cluster.limits.max_jobs_in_flight,
        delay: Duration::from_secs_f64(session.cluster.limits.submission_delay_s.max(0.0)),
        username: std::env::var("USER").unwrap_or_else(|_| "unknown".to_string()),
        executables,
        overrides: &overrides,
        chain_batch: args.chain_batch,
        environment: &environment,
        prepare: &prepare,
        mirror,
    };
    let submitted =
        plan::submit(&session.context(), &presets, &planned, session.ledger.as_ref(), &session.slurm, &settings)?;
    let failed = submitted.iter().filter(|s| s.failed()).count();
    let elsewhere: Vec<&PlannedJob> = planned.iter().filter(|j| j.reason.starts_with("in progress on ")).collect();
    if args.json {
        let flagged: Vec<_> = planned.iter().filter(|j| j.flag.is_some()).collect();
        let json =
            serde_json::json!({"sync": report, "submitted": submitted, "elsewhere": elsewhere, "flagged": flagged});
        return Ok((serde_json::to_string(&json)? + "\n", failed));
    }
    let mut out = sync_text(&report);
    for s in &submitted {
        out += &format!(
            "{:<48} {:<34} {}{}\n",
            s.model,
            s.benchmark,
            s.outcome,
            s.job_id.as_ref().map(|j| format!(" job {j}")).unwrap_or_default()
        );
    }
    for job in &elsewhere {
        out += &format!("{:<48} {:<34} skipped: {}\n", job.model, job.benchmark, job.reason);
    }
    for job in &planned {
        if let Some(flag) = &job.flag {
            out += &format!("flagged   {} {}: {flag}\n", job.model, job.benchmark);
        }
    }
    let skipped = planned.iter().filter(|j| j.decision == Verdict::Skip).count();
    out += &format!(
        "{} submitted, {} skipped by dedup{}\n",
        submitted.iter().filter(|s| s.job_id.is_some()).count(),
        skipped,
        if failed > 0 { format!(", {failed} failed") } else { String::new() }
    );
    Ok((out, failed))
}

fn executables(session: &Session) -> Result<Executables> {
    let payload_bin = match std::env::var_os("PAYLOAD_BIN") {
        Some(bin) => bin.into(),
        None => std::env::current_exe()?.with_file_name("payload"),
    };
    if !payload_bin.is_file() {
        bail!("payload binary not found at {} (build it, or set PAYLOAD_BIN)", payload_bin.display());
    }
    let script = session.root.join(&session.cluster.slurm.script);
    if !script.is_file() {
        bail!("batch script {} not found (clusters/{}.yaml slurm.script)", script.display(), session.cluster.name);
    }
    let prelude = match &session.cluster.slurm.prelude {
        Some(prelude) => {
            let prelude = session.root.join(prelude);
            if !prelude.is_file() {
                bail!("prelude {} not found (clusters/{}.yaml slurm.prelude)", prelude.display(), session.cluster.name);
            }
            Some(prelude)
        }
        None => None,
    };
    Ok(Executables { payload_bin, script, prelude })
}

pub fn launch_command(args: &LaunchArgs) -> Result<ExitCode> {
    args.selection.check()?;
    if !args.once && !args.watch {
        bail!("say --once (one iteration) or --watch --interval D (the listener)");
    }
    let session = Session::open(&args.ledger)?;
    let _lock = session.lock()?;
    let executables = executables(&session)?;
    let mirror = open_mirror(args.mirror.as_deref(), &session)?;
    loop {
        let (text, failed) = iterate(&session, args, &executables, mirror.as_ref())?;
        super::print(&text)?;
        if args.once {
            // A submission that failed is an exit status, not only a line of text (docs/exit-codes.md).
            return Ok(if failed > 0 { ExitStatus::PartialFailure } else { ExitStatus::Success }.into());
        }
        std::thread::sleep(args.interval.unwrap_or(Duration::from_secs(600)));
    }
}

fn sync_text(report: &SyncReport) -> String {
    report
        .changes
        .iter()
        .map(|c| format!("sync: attempt {} {} {} → {} ({})\n", c.attempt, c.model, c.benchmark, c.to, c.reason))
        .collect()
}

pub fn sync_command(args: &SyncArgs) -> Result<ExitCode> {
    let session = Session::open(&args.ledger)?;
    let mirror = open_mirror(args.mirror.as_deref(), &session)?;
    let report = sync::sync_and_heartbeat(
        session.ledger.as_ref(),
        &session.slurm,
        &session.cluster.name,
        stale_after_s(args.stale_after, None),
        &session.cluster.verify,
        mirror.as_ref(),
    )?;
    super::print(&if args.json {
        serde_json::to_string_pretty(&report)? + "\n"
    } else {
        sync_text(&report) + &format!("{} change(s)\n", report.changes.len())
    })?;
    Ok(ExitCode::SUCCESS)
}

pub fn status_command(args: &StatusArgs) -> Result<ExitCode> {
    super::verify::status(args)
}

pub fn cancel_command(args: &CancelArgs) -> Result<ExitCode> {
    if args.jobs.is_empty() && args.models.is_empty() {
        bail!("say what to cancel: --job ID… or --model M… [--benchmark B…]");
    }
    let session = Session::open(&args.ledger)?;
    let mut cancelled = 0;
    for attempt in session.ledger.active()?.into_iter().filter(|a| a.cluster == session.cluster.name) {
        let by_job = attempt.slurm_job_id.as_ref().is_some_and(|j| args.jobs.contains(j));
        let by_model = args.models.contains(&attempt.model)
            && (args.benchmarks.is_empty() || args.benchmarks.contains(&attempt.benchmark));
        if !(by_job || by_model) {
            continue;
        }
        if let Some(id) = attempt.slurm_job_id.as_deref().and_then(|j| j.parse().ok()) {
            session.slurm.cancel(id, None, false)?;
        }
        session.ledger.transition(AttemptId(attempt.id.0), Status::Cancelled, "cancelled by operator", None)?;
        super::print(&format!(
            "cancelled attempt {} ({} on {}), job {}\n",
            attempt.id,
            attempt.model,
            attempt.benchmark,
            attempt.slurm_job_id.as_deref().unwrap_or("-")
        ))?;
        cancelled += 1;
    }
    super::print(&format!("{cancelled} attempt(s) cancelled\n"))?;
    Ok(ExitCode::SUCCESS)
}
