//! `submitter plan|launch|sync|cancel`: the queueing loop against one ledger and Slurm. Each
//! iteration is: sync (act), snapshot (read once), plan (pure), execute (act); `plan` is the same
//! code without the acts.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use submitter::config::args::duration;
use submitter::decide::{Action, Policy};
use submitter::executor::{Executor, Submitted};
use submitter::ledger::{AttemptId, AttemptStatus, now};
use submitter::output::{self, ExitStatus, FormatArgs};
use submitter::planner::{self, Executables, PlanInputs, PlannedJob};
use submitter::preflight;
use submitter::slurm::Slurm;
use submitter::snapshot::Snapshot;
use submitter::sync::{self, SyncReport};
use submitter::team::mirror::Mirror;

use super::session::{LedgerArgs, Selection, Session};

#[derive(clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    #[command(flatten)]
    selection: Selection,
    /// `--format json`: a versioned document (docs/design.md §11).
    #[command(flatten)]
    format: FormatArgs,
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
    /// The long-running listener: iterate every --interval, re-reading the lists each time. An
    /// iteration that fails (Slurm or ledger unreachable, a file mid-edit) is reported and retried
    /// with back-off; the listener never exits on its own.
    #[arg(long, requires = "interval")]
    watch: bool,
    /// Time between iterations (`30s`, `10m`, `1h`).
    #[arg(long, value_parser = duration)]
    interval: Option<Duration>,
    /// Everything but the writes: sync is not run, no ledger row, no spec file, no sbatch; the
    /// plan, the specs, the sbatch argv and the preparation (staging, preflight) are all done.
    #[arg(long)]
    dry_run: bool,
    /// Chain submissions in batches of N with --dependency=afterany (0 = off).
    #[arg(long, default_value_t = 0)]
    chain_batch: usize,
    /// The staleness bound recorded with this submitter's heartbeat: other clusters flag this
    /// cluster's attempts when no sync refreshed them for longer (default 1h; with --watch at
    /// least 3 × --interval).
    #[arg(long, value_parser = duration, value_name = "D")]
    stale_after: Option<Duration>,
    /// Publish this submitter's attempts to the team's database (OT-Agent `sandbox_jobs`): the
    /// URL, or alone to take it from $SUBMITTER_TEAM_DB (where a password must be).
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    mirror: Option<String>,
    /// `--format json`: a versioned document (docs/design.md §11).
    #[command(flatten)]
    format: FormatArgs,
}

impl LaunchArgs {
    pub fn ledger(&self) -> &LedgerArgs {
        &self.ledger
    }
}

#[derive(clap::Args)]
pub struct SyncArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    /// The staleness bound recorded with this submitter's heartbeat (default 1h).
    #[arg(long, value_parser = duration, value_name = "D")]
    stale_after: Option<Duration>,
    /// Publish Started/Finished to the team's database, as for `launch --mirror`.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    mirror: Option<String>,
    /// `--format json`: a versioned document (docs/design.md §11).
    #[command(flatten)]
    format: FormatArgs,
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
    /// `--format json`: a `cancel` document (docs/design.md §11).
    #[command(flatten)]
    format: FormatArgs,
}

fn policy(session: &Session, selection: &Selection) -> Policy {
    let limits = &session.cluster.limits;
    Policy {
        max_failed_attempts: limits.max_attempts,
        stale_pending_s: (limits.stale_pending_hours * 3600.0) as u64,
        config_aware: selection.config_aware,
        force: selection.force,
        max_continuations: limits.max_continuations,
    }
}

/// Where payload and the batch script are; `launch` insists they exist (`plan` shows the paths).
fn executables(session: &Session, must_exist: bool) -> Result<Executables> {
    let payload_bin = match std::env::var_os("PAYLOAD_BIN") {
        Some(bin) => bin.into(),
        None => std::env::current_exe()?.with_file_name("payload"),
    };
    let script = session.root.join(&session.cluster.slurm.script);
    let prelude = session.cluster.slurm.prelude.as_ref().map(|p| session.root.join(p));
    if must_exist {
        if !payload_bin.is_file() {
            bail!("payload binary not found at {} (build it, or set PAYLOAD_BIN)", payload_bin.display());
        }
        if !script.is_file() {
            bail!("batch script {} not found (clusters/{}.yaml slurm.script)", script.display(), session.cluster.name);
        }
        if let Some(prelude) = prelude.as_ref().filter(|p| !p.is_file()) {
            bail!("prelude {} not found (clusters/{}.yaml slurm.prelude)", prelude.display(), session.cluster.name);
        }
    }
    Ok(Executables { payload_bin, script, prelude })
}

/// Snapshot, then plan: what `plan` prints and what `launch` executes. Lists and presets are
/// re-read here, every iteration.
fn snapshot_and_plan(session: &Session, selection: &Selection, executables: &Executables) -> Result<Vec<PlannedJob>> {
    let legs = selection.legs(&session.presets_dir)?;
    let models = selection.models(session.ledger.as_ref())?;
    let snapshot = Snapshot::read(session.ledger.as_ref(), &session.slurm, &session.cluster.name, now())?;
    let overrides = selection.spec.overrides()?;
    let environment = |name: &str| std::env::var(name).ok();
    let inputs = PlanInputs {
        context: &session.context(),
        legs: &legs,
        models: &models,
        overrides: &overrides,
        concurrency: &selection.spec.concurrency(),
        slurm: &selection.slurm.overrides(),
        executables,
        environment: &environment,
        policy: &policy(session, selection),
        max_in_flight: session.cluster.limits.max_jobs_in_flight,
    };
    Ok(planner::plan(&inputs, &snapshot))
}

fn flag_lines(planned: &[PlannedJob]) -> String {
    planned
        .iter()
        .filter_map(|job| job.flag.as_ref().map(|flag| format!("flagged   {} {}: {flag}\n", job.model, job.benchmark)))
        .collect()
}

fn plan_table(planned: &[PlannedJob]) -> String {
    let mut out = String::new();
    for job in planned {
        let why = match &job.blocked {
            Some(planner::Blocked::Refused(why) | planner::Blocked::Throttled(why)) => why.as_str(),
            None => job.reason.as_str(),
        };
        out += &format!(
            "{:<9} {:<48} {:<34} {}x{} {:>5.1}x  {}\n",
            job.label(),
            job.model,
            job.benchmark,
            job.resources.tensor_parallel_size,
            job.resources.data_parallel_size,
            job.timeout_multiplier,
            why
        );
    }
    out += &flag_lines(planned);
    let tunnels: std::collections::BTreeSet<(&str, &str)> =
        planned.iter().map(|j| (j.preset.as_str(), j.tunnel.as_str())).collect();
    for (preset, tunnel) in tunnels {
        out += &format!("tunnel    {preset}: {tunnel}\n");
    }
    let count = |label: &str| planned.iter().filter(|j| j.label() == label).count();
    out += &format!("{} submit, {} resubmit, {} skip", count("submit"), count("resubmit"), count("skip"));
    for label in ["continue", "refused", "throttled"] {
        if count(label) > 0 {
            out += &format!(", {} {label}", count(label));
        }
    }
    out + "\n"
}

pub fn plan_command(args: &PlanArgs) -> Result<ExitCode> {
    args.selection.check()?;
    let session = Session::open(&args.ledger)?;
    let planned = snapshot_and_plan(&session, &args.selection, &executables(&session, false)?)?;
    super::print(&if args.format.is_json() {
        output::document("plan", &serde_json::json!({ "jobs": planned }))
    } else {
        plan_table(&planned)
    })?;
    Ok(ExitCode::SUCCESS)
}

/// One iteration: sync, snapshot, plan, execute. Any ledger/Slurm error ends it (fail closed).
/// Returns the text to print and how many submissions failed.
fn iterate(
    session: &Session,
    args: &LaunchArgs,
    executables: &Executables,
    mirror: Option<&Mirror>,
) -> Result<(String, usize)> {
    let report = if args.dry_run {
        SyncReport::default()
    } else {
        let stale_after = stale_after_s(args.stale_after, args.interval.filter(|_| args.watch));
        let cluster = &session.cluster;
        sync::sync_and_heartbeat(
            session.ledger.as_ref(),
            &session.slurm,
            &cluster.name,
            stale_after,
            &cluster.verify,
            mirror,
        )
        .context("sync")?
    };
    let planned = snapshot_and_plan(session, &args.selection, executables)?;
    // Staging and preflight (docs/site.md): each model once per iteration, before any ledger row.
    let context = session.context();
    let stager = submitter::stage::Stager::new(&context);
    let queries = preflight::SlurmQueries(&session.slurm);
    let site = preflight::Site::here(&session.root, &queries);
    let prepare = |job: &PlannedJob, spec: &launch_spec::LaunchSpec| {
        preflight::stage_and_check(&stager, &job.dataset, spec, &session.cluster, &site).map(drop)
    };
    let executor = Executor {
        ledger: session.ledger.as_ref(),
        slurm: &session.slurm,
        cluster: &session.cluster.name,
        username: std::env::var("USER").unwrap_or_else(|_| "unknown".to_string()),
        delay: Duration::from_secs_f64(session.cluster.limits.submission_delay_s.max(0.0)),
        chain_batch: args.chain_batch,
        mirror,
        prepare: &prepare,
        dry_run: args.dry_run,
    };
    let submitted = executor.execute(&planned)?;
    let failed = submitted.iter().filter(|s| s.failed()).count();
    Ok((render_iteration(&report, &planned, &submitted, failed, args.format.is_json())?, failed))
}

fn render_iteration(
    report: &SyncReport,
    planned: &[PlannedJob],
    submitted: &[Submitted],
    failed: usize,
    json: bool,
) -> Result<String, serde_json::Error> {
    let elsewhere: Vec<&PlannedJob> = planned.iter().filter(|j| j.reason.starts_with("in progress on ")).collect();
    if json {
        let flagged: Vec<_> = planned.iter().filter(|j| j.flag.is_some()).collect();
        let json =
            serde_json::json!({"sync": report, "submitted": submitted, "elsewhere": elsewhere, "flagged": flagged});
        // One compact document per iteration: `--watch` streams them, one per line.
        return Ok(output::document_line("launch", &json));
    }
    let mut out = sync_text(report);
    for s in submitted {
        out += &format!(
            "{:<48} {:<34} {}{}\n",
            s.model,
            s.benchmark,
            s.outcome,
            s.job_id.as_ref().map(|j| format!(" job {j}")).unwrap_or_default()
        );
        if let Some(argv) = &s.sbatch {
            out += &format!("    {}\n", shell_words::join(argv));
        }
    }
    for job in &elsewhere {
        out += &format!("{:<48} {:<34} skipped: {}\n", job.model, job.benchmark, job.reason);
    }
    out += &flag_lines(planned);
    let skipped = planned.iter().filter(|j| j.action == Action::Skip && j.blocked.is_none()).count();
    out += &format!(
        "{} submitted, {} skipped by dedup{}\n",
        submitted.iter().filter(|s| s.job_id.is_some()).count(),
        skipped,
        if failed > 0 { format!(", {failed} failed") } else { String::new() }
    );
    Ok(out)
}

/// The wait before retrying a failed `--watch` iteration: 5 s, doubling per consecutive failure,
/// never longer than the interval (a listener that retries slower than it polls would fall behind).
pub fn backoff(interval: Duration, consecutive_failures: u32) -> Duration {
    let first = Duration::from_secs(5);
    first.saturating_mul(1u32 << consecutive_failures.saturating_sub(1).min(16)).min(interval)
}

pub fn launch_command(args: &LaunchArgs) -> Result<ExitCode> {
    args.selection.check()?;
    if !args.once && !args.watch {
        bail!("say --once (one iteration) or --watch --interval D (the listener)");
    }
    let session = Session::open(&args.ledger)?;
    let _lock = session.lock()?;
    let executables = executables(&session, true)?;
    let mirror = open_mirror(args.mirror.as_deref(), &session)?;
    let interval = args.interval.unwrap_or(Duration::from_secs(600));
    let mut failures = 0u32;
    loop {
        match iterate(&session, args, &executables, mirror.as_ref()) {
            Ok((text, failed)) => {
                failures = 0;
                super::print(&text)?;
                if args.once {
                    // A submission that failed is an exit status, not only a line (docs/exit-codes.md).
                    return Ok(if failed > 0 { ExitStatus::PartialFailure } else { ExitStatus::Success }.into());
                }
                std::thread::sleep(interval);
            }
            Err(err) if args.once => return Err(err),
            // The listener lasts: a Slurm timeout, a ledger restart or a list mid-edit ends this
            // iteration (nothing was submitted on doubt), never the listener.
            Err(err) => {
                failures += 1;
                let wait = backoff(interval, failures);
                super::report_error(
                    &err.context(format!("iteration failed ({failures} in a row); retrying in {} s", wait.as_secs())),
                );
                std::thread::sleep(wait);
            }
        }
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
    super::print(&if args.format.is_json() {
        output::document("sync", &report)
    } else {
        sync_text(&report) + &format!("{} change(s)\n", report.changes.len())
    })?;
    Ok(ExitCode::SUCCESS)
}

pub fn cancel_command(args: &CancelArgs) -> Result<ExitCode> {
    if args.jobs.is_empty() && args.models.is_empty() {
        bail!("say what to cancel: --job ID… or --model M… [--benchmark B…]");
    }
    let session = Session::open(&args.ledger)?;
    let mut cancelled = Vec::new();
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
        session.ledger.transition(AttemptId(attempt.id.0), AttemptStatus::Cancelled, "cancelled by operator", None)?;
        let done = CancelledOutput {
            attempt: attempt.id.0,
            model: attempt.model,
            benchmark: attempt.benchmark,
            job_id: attempt.slurm_job_id,
        };
        if !args.format.is_json() {
            // Each line as it happens: a Slurm error later leaves these on the screen.
            super::print(&format!(
                "cancelled attempt {} ({} on {}), job {}\n",
                done.attempt,
                done.model,
                done.benchmark,
                done.job_id.as_deref().unwrap_or("-")
            ))?;
        }
        cancelled.push(done);
    }
    super::print(&if args.format.is_json() {
        output::document("cancel", &CancelOutput { cancelled })
    } else {
        format!("{} attempt(s) cancelled\n", cancelled.len())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `cancel`: the attempts this call cancelled (in Slurm and in the ledger), in ledger order.
#[derive(Serialize)]
struct CancelOutput {
    cancelled: Vec<CancelledOutput>,
}

#[derive(Serialize)]
struct CancelledOutput {
    attempt: i64,
    model: String,
    benchmark: String,
    /// The Slurm job cancelled, null when the attempt had none yet.
    job_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_five_seconds_and_never_exceeds_the_interval() {
        let ten_min = Duration::from_secs(600);
        let waits: Vec<u64> = (1..=9).map(|n| backoff(ten_min, n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 320, 600, 600]);
        assert_eq!(backoff(Duration::from_secs(1), 1), Duration::from_secs(1));
        assert_eq!(backoff(ten_min, u32::MAX), ten_min);
    }
}
