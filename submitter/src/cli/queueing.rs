//! `submitter plan|launch|sync|cancel`: the queueing loop against one ledger and Slurm. Each
//! iteration is: sync (act), snapshot (read once), plan (pure), execute (act); `plan` is the same
//! code without the acts.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::cancel::Stop;
use crate::config::args::duration;
use crate::decide::{Action, Policy, Prerequisite};
use crate::domain::Continuation;
use crate::executor::{Executor, Submitted};
use crate::ledger::{AttemptStatus, now};
use crate::notify::{self, Event, Tidings};
use crate::observe::Observation;
use crate::output::{self, ExitStatus, FormatArgs};
use crate::plan_text;
use crate::planner::{self, Executables, Plan, PlanInputs, PlannedJob, SharedJob};
use crate::preflight;
use crate::settings::{ResolvedSettings, Source};
use crate::slurm::Slurm;
use crate::snapshot::Snapshot;
use crate::sync::{self, Change, SyncReport};
use crate::team::mirror::Mirror;
use crate::term::{Style, Terminal, group_problems, problem_lines};
use crate::transition::{Origin, Recorder};
use anyhow::{Context, Result, bail};
use serde::Serialize;

use super::consumers::{Told, connect_mirror, default_mirror, open_notifier, team_link, tell};
use super::session::{LedgerArgs, Selection, Session};
use super::team::{TeamLink, TeamView, TeamViewOutput};

#[derive(clap::Args)]
pub(crate) struct PlanArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    #[command(flatten)]
    selection: Selection,
    /// Plan against this ledger only, without the team database the profile names (`team:`):
    /// for when it is down and you accept duplicates of what the team ran meanwhile.
    #[arg(long)]
    offline_ledger: bool,
    /// Each pair's settings (with where each came from) and readiness budget, under the table.
    #[arg(short, long)]
    verbose: bool,
    /// `--format json`: a versioned document (docs/design.md §11).
    #[command(flatten)]
    format: FormatArgs,
}

#[derive(clap::Args)]
pub(crate) struct LaunchArgs {
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
    /// Time between iterations (`30s`, `10m`, `1h`; at least 1s).
    #[arg(long, value_parser = crate::config::args::interval)]
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
    /// URL, or alone to take it from $SUBMITTER_TEAM_DB (where a password must be), else from the
    /// profile's `team:` (its secrets-file key). On by default when the profile names one.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    mirror: Option<String>,
    /// Dedup against this ledger only, without the team database the profile names (`team:`), and
    /// publish nothing there: for when it is down and you accept duplicates of what the team ran.
    #[arg(long, conflicts_with = "mirror")]
    offline_ledger: bool,
    /// `--format json`: a versioned document (docs/design.md §11).
    #[command(flatten)]
    format: FormatArgs,
}

impl LaunchArgs {
    pub(crate) fn ledger(&self) -> &LedgerArgs {
        &self.ledger
    }

    /// Whether the iterations need the profile's team database URL: its history is folded in
    /// unless `--offline-ledger`, and a bare `--mirror` takes the URL from there.
    pub(crate) fn uses_team_database(&self, session: &Session) -> bool {
        !self.offline_ledger && (session.cluster.team.is_some() || self.mirror.as_deref() == Some(""))
    }
}

#[derive(clap::Args)]
pub(crate) struct SyncArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    /// The staleness bound recorded with this submitter's heartbeat (default 1h).
    #[arg(long, value_parser = duration, value_name = "D")]
    stale_after: Option<Duration>,
    /// Publish Started/Finished to the team's database, as for `launch --mirror`.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    mirror: Option<String>,
    /// Publish nothing to the team database the profile names (`team:`).
    #[arg(long, conflicts_with = "mirror")]
    offline_ledger: bool,
    /// `--format json`: a versioned document (docs/design.md §11).
    #[command(flatten)]
    format: FormatArgs,
}

/// The `--mirror` connection, when asked for. Connecting is checked up front (a wrong URL is an
/// error before anything is submitted); later publishing failures only warn. A bare `--mirror`
/// takes the profile's team database when `$SUBMITTER_TEAM_DB` is not set (a listener job never
/// has it).
fn open_mirror(flag: Option<&str>, session: &Session, team: Option<&TeamLink>) -> Result<Option<Mirror>> {
    let Some(flag) = flag else { return Ok(None) };
    let url = match team {
        Some(team) if flag.is_empty() => team.url.clone(),
        _ => super::team::team_url(Some(flag).filter(|f| !f.is_empty()), "--mirror")?,
    };
    Ok(Some(connect_mirror(&url, session).context("--mirror")?))
}

/// Folds the team's new rows in before anything is decided; `offline` says it was not consulted.
/// Failing is the caller's failure (fail closed): dedup without the team's history could
/// duplicate what the team ran.
fn consult_team(session: &Session, team: Option<&TeamLink>, offline: bool, failed: &str) -> Result<Option<TeamView>> {
    match team {
        Some(team) => {
            let report = team.fold_in(session).with_context(|| {
                format!(
                    "{failed}: the team's history (clusters/{}.yaml team:) could not be read — retry when it answers, or \
                     run with --offline-ledger to dedup against your own ledger only",
                    session.cluster.name
                )
            })?;
            Ok(Some(TeamView::Folded(report)))
        }
        None if offline && session.cluster.team.is_some() => {
            // A first plan offline on a team profile would plan everything the team ran: say so.
            let pairs = session.ledger.latest_per_pair().context("reading the ledger")?;
            let never_imported = !pairs.iter().any(|p| p.latest.source_id.is_some());
            Ok(Some(TeamView::Offline { never_imported }))
        }
        None => Ok(None),
    }
}

/// The staleness bound to record: the flag, else the default, never under 3 intervals of a watch.
fn stale_after_s(flag: Option<Duration>, interval: Option<Duration>) -> u64 {
    match flag {
        Some(bound) => bound.as_secs(),
        None => sync::DEFAULT_STALE_AFTER_S.max(interval.map_or(0, |i| 3 * i.as_secs())),
    }
}

/// Which active attempts a command acts on: `cancel` and `move` select alike.
#[derive(clap::Args)]
pub(crate) struct AttemptSelection {
    /// The attempts of these Slurm job ids (a job id is a positive number).
    #[arg(long = "job", value_name = "ID", value_parser = job_id)]
    jobs: Vec<String>,
    /// The active attempts of these models (all benchmarks unless --benchmark).
    #[arg(long = "model", value_name = "M")]
    models: Vec<String>,
    /// Narrows to these benchmarks (as `status` names them: `tb2`, `v2`, `swebench`, or the
    /// ledger's name; a family member selects the family).
    #[arg(long = "benchmark", value_name = "B")]
    benchmarks: Vec<String>,
    /// Say what would be done and change nothing (neither Slurm nor the ledger).
    #[arg(long)]
    dry_run: bool,
}

impl AttemptSelection {
    /// Whether a job or a model is named (`cancel` wants one; `move` without one takes all).
    fn names_jobs_or_models(&self) -> bool {
        !self.jobs.is_empty() || !self.models.is_empty()
    }

    /// The families `--benchmark` names, each resolved once (an unknown name is an error).
    fn families(&self, session: &Session) -> Result<Vec<String>> {
        self.benchmarks.iter().map(|b| session.benchmark_family(b)).collect()
    }

    /// Selected: by its job id, or by its model — every model when neither jobs nor models are
    /// named — narrowed by `--benchmark` (`families`, from [`AttemptSelection::families`]).
    fn selects(&self, families: &[String], attempt: &crate::ledger::Attempt) -> bool {
        let by_job = attempt.slurm_job_id.as_ref().is_some_and(|j| self.jobs.contains(j));
        let model = if self.models.is_empty() { self.jobs.is_empty() } else { self.models.contains(&attempt.model) };
        let benchmark = families.is_empty() || families.contains(&attempt.benchmark_family);
        by_job || (model && benchmark)
    }
}

#[derive(clap::Args)]
pub(crate) struct CancelArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    #[command(flatten)]
    selection: AttemptSelection,
    /// `--format json`: a `cancel` document (docs/design.md §11).
    #[command(flatten)]
    format: FormatArgs,
}

#[derive(clap::Args)]
pub(crate) struct MoveArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    /// The reservation to put the pending jobs on.
    #[arg(long, value_name = "R")]
    reservation: String,
    /// Without --job or --model: every active attempt of this cluster.
    #[command(flatten)]
    selection: AttemptSelection,
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

/// Where payload and the batch script are; `launch` insists they fit the nodes (`plan` shows the
/// paths).
fn executables(session: &Session, must_exist: bool) -> Result<Executables> {
    let binary = super::payload_binary(&session.context(), &session.cluster, &session.root)?;
    let payload_bin = binary.path.clone();
    let script = session.root.join(&session.cluster.slurm.script);
    let prelude = session.cluster.slurm.prelude.as_ref().map(|p| session.root.join(p));
    if must_exist {
        crate::node_binary::check_file(&binary, &session.cluster).map_err(anyhow::Error::msg)?;
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
/// re-read here, every iteration. `world`: the iteration's observation (a launch's); `plan` takes
/// its own.
fn snapshot_and_plan(
    session: &Session,
    selection: &Selection,
    executables: &Executables,
    world: &Observation,
) -> Result<Plan> {
    let legs = selection.legs(&session.presets_dir)?;
    let models = selection.models(session.ledger.as_ref())?;
    let snapshot = Snapshot::observed(session.ledger.as_ref(), &session.slurm, &session.cluster.name, world)?;
    let overrides = selection.spec.overrides()?;
    let environment = |name: &str| std::env::var(name).ok();
    // Slurm's MaxTime, asked once per partition and iteration; a partition Slurm cannot say
    // (or no Slurm here) falls back to the profile's slurm.max_time.
    let asked: std::cell::RefCell<Vec<(String, Option<String>)>> = std::cell::RefCell::default();
    let max_time = |partition: &str| {
        let known = asked.borrow().iter().find(|(p, _)| p == partition).map(|(_, limit)| limit.clone());
        let limit = known.unwrap_or_else(|| {
            let limit = session.slurm.partition_max_time(partition).unwrap_or_else(|err| {
                tracing::warn!("cannot read partition {partition}'s MaxTime: {err}");
                None
            });
            asked.borrow_mut().push((partition.to_string(), limit.clone()));
            limit
        });
        crate::settings::partition_limit(&session.cluster, partition, limit.as_deref())
    };
    // Read only for `allocation: pool` legs (issue 37): the checkpoints' files decide the pools.
    let hf_cache = session.context().hf_cache().ok().flatten();
    let checkpoints = |spec: &launch_spec::LaunchSpec| crate::pool::checkpoint_of(spec, hf_cache.as_deref());
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
        allocation: selection.allocation,
        max_time: &max_time,
        checkpoints: &checkpoints,
    };
    Ok(planner::plan(&inputs, &snapshot))
}

pub(crate) fn plan_command(args: &PlanArgs) -> Result<ExitCode> {
    args.selection.check()?;
    let session = Session::open_existing(&args.ledger)?;
    let team = team_link(&session, args.offline_ledger)?;
    let team = consult_team(&session, team.as_ref(), args.offline_ledger, "nothing planned")?;
    let plan =
        snapshot_and_plan(&session, &args.selection, &executables(&session, false)?, &Observation::empty(now()))?;
    super::print(&if args.format.is_json() {
        output::document(
            "plan",
            &PlanOutput {
                team: team.as_ref().map(TeamView::output),
                jobs: plan.jobs.iter().map(PlannedJobOutput::from).collect(),
                shared: plan.shared.iter().map(|g| SharedJobOutput::new(g, &plan)).collect(),
            },
        )
    } else {
        let team = team.as_ref().map(TeamView::line).unwrap_or_default();
        plan_text::plan_text(&plan, &Terminal::stdout(), args.verbose, &team)
    })?;
    Ok(ExitCode::SUCCESS)
}

/// One iteration, the reconcile (docs/design.md §0): observe once (one `squeue`, each run dir's
/// `status.json` once), then sync, verdicts and remediation, the plan, the executor — every state
/// change through one recorder, whose events the output and the notifier consume. Any
/// ledger/Slurm error ends it (fail closed). Returns the text to print, how many submissions
/// failed and what to tell people.
fn iterate(
    session: &Session,
    args: &LaunchArgs,
    executables: &Executables,
    team: Option<&TeamLink>,
    mirror: Option<&Mirror>,
) -> Result<(String, usize, Tidings)> {
    // First, before Slurm or the ledger are touched: the team's history (fail closed).
    let team = consult_team(session, team, args.offline_ledger, "nothing submitted")?;
    let world = Observation::take(session.ledger.as_ref(), &session.slurm, &session.cluster.name, now())
        .context("observing Slurm")?;
    let recorder = Recorder::new(session.ledger.as_ref(), mirror);
    let report = if args.dry_run {
        SyncReport::default()
    } else {
        let stale_after = stale_after_s(args.stale_after, args.interval.filter(|_| args.watch));
        let cluster = &session.cluster;
        sync::sync_and_heartbeat(&recorder, &world, &session.slurm, &cluster.name, stale_after, &cluster.verify)
            .context("sync")?
    };
    // Verdicts and remediation between sync and plan: what it cancels, retries or holds is what
    // this plan sees (a dry run decides and prints, and changes nothing).
    let remedies = super::remediation::pass(session, &recorder, &world, args.dry_run, false)?;
    let plan = snapshot_and_plan(session, &args.selection, executables, &world)?;
    let planned = &plan.jobs;
    // Staging and preflight (docs/site.md): each model once per iteration, before any ledger row.
    let context = session.context();
    let stager = if args.dry_run { crate::stage::Stager::dry(&context) } else { crate::stage::Stager::new(&context) };
    let queries = preflight::SlurmQueries(&session.slurm);
    let payload = super::payload_binary(&context, &session.cluster, &session.root)?;
    let site = preflight::Site::here(&session.root, &queries).with_payload(payload);
    let prepare = |job: &PlannedJob, spec: &launch_spec::LaunchSpec| {
        let choice = job.settings.slurm_choice();
        let prepared = preflight::stage_and_check(&stager, &job.dataset, spec, &choice, &session.cluster, &site);
        if let (Err(refused), false) = (&prepared, args.dry_run) {
            super::remediation::hold_a_refused_retry(session, job, refused);
        }
        prepared.map(drop)
    };
    let executor = Executor {
        recorder: &recorder,
        slurm: &session.slurm,
        cluster: &session.cluster.name,
        username: std::env::var("USER").unwrap_or_else(|_| "unknown".to_string()),
        delay: Duration::from_secs_f64(session.cluster.limits.submission_delay_s.max(0.0)),
        chain_batch: args.chain_batch,
        prepare: &prepare,
        dry_run: args.dry_run,
    };
    let submitted = executor.execute(&plan)?;
    let failed = submitted.iter().filter(|s| s.failed()).count();
    let format = match (args.format.is_json(), args.watch) {
        (false, _) => IterationFormat::Human,
        (true, false) => IterationFormat::Document,
        (true, true) => IterationFormat::Line,
    };
    let tidings = notify::iteration_events(&recorder.take(), &remedies, planned);
    let mut text = render_iteration(&report, planned, &submitted, failed, &remedies, format, team.as_ref());
    if matches!(format, IterationFormat::Human) {
        text = super::remediation::lines(&remedies, args.dry_run) + &text;
    }
    Ok((text, failed, tidings))
}

/// How `launch` prints an iteration: text, a pretty document (`--once`), or one compact document
/// per line (`--watch`, a stream).
#[derive(Clone, Copy)]
enum IterationFormat {
    Human,
    Document,
    Line,
}

fn render_iteration(
    report: &SyncReport,
    planned: &[PlannedJob],
    submitted: &[Submitted],
    failed: usize,
    remediation: &[crate::remediate::Decision],
    format: IterationFormat,
    team: Option<&TeamView>,
) -> String {
    let elsewhere: Vec<&PlannedJob> = planned.iter().filter(|j| j.reason.starts_with("in progress on ")).collect();
    let skipped = planned.iter().filter(|j| j.action == Action::Skip && j.blocked.is_none()).count();
    if !matches!(format, IterationFormat::Human) {
        let doc = LaunchOutput {
            team: team.map(TeamView::output),
            sync: SyncOutput::from(report),
            submitted: submitted.iter().map(SubmittedOutput::from).collect(),
            skipped,
            failed,
            elsewhere: elsewhere.into_iter().map(PlannedJobOutput::from).collect(),
            flagged: planned.iter().filter(|j| j.flag.is_some()).map(PlannedJobOutput::from).collect(),
            remediation,
        };
        return match format {
            IterationFormat::Line => output::document_line("launch", &doc),
            _ => output::document("launch", &doc),
        };
    }
    let terminal = Terminal::stdout();
    let mut out = team.map(TeamView::line).unwrap_or_default();
    out += &sync_text(report);
    let (failures, done): (Vec<&Submitted>, Vec<&Submitted>) = submitted.iter().partition(|s| s.failed());
    if !done.is_empty() || !elsewhere.is_empty() {
        let mut table = terminal.table(["model", "benchmark", "outcome"]);
        for s in &done {
            let job = s.job_id.as_ref().map(|j| format!(" job {j}")).unwrap_or_default();
            table.row([s.model.clone(), s.benchmark.clone(), format!("{}{job}", s.outcome)]);
        }
        for job in &elsewhere {
            table.row([job.model.to_string(), job.benchmark.clone(), format!("skipped: {}", job.reason)]);
        }
        out += &table.render();
    }
    for s in &done {
        if let Some(argv) = &s.sbatch {
            out += &format!("sbatch    {} {}: {}\n", s.model, s.benchmark, shell_words::join(argv));
        }
    }
    let failures = group_problems(failures.iter().map(|s| (format!("{} {}", s.model, s.benchmark), s.outcome.clone())));
    out += &problem_lines(&terminal, "failed", &failures, Style::Problem);
    out += &plan_text::flag_lines(&terminal, planned);
    out += &format!(
        "{} submitted, {} skipped by dedup{}\n",
        submitted.iter().filter(|s| s.job_id.is_some()).count(),
        skipped,
        if failed > 0 { format!(", {failed} failed") } else { String::new() }
    );
    out
}

/// The wait before retrying a failed `--watch` iteration: 5 s, doubling per consecutive failure,
/// never longer than the interval (a listener that retries slower than it polls would fall behind).
pub(crate) fn backoff(interval: Duration, consecutive_failures: u32) -> Duration {
    let first = Duration::from_secs(5);
    first.saturating_mul(1u32 << consecutive_failures.saturating_sub(1).min(16)).min(interval)
}

pub(crate) fn launch_command(args: &LaunchArgs) -> Result<ExitCode> {
    args.selection.check()?;
    if !args.once && !args.watch {
        bail!("say --once (one iteration) or --watch --interval D (the listener)");
    }
    let session = if args.dry_run { Session::open_dry(&args.ledger)? } else { Session::open(&args.ledger)? };
    // A dry run changes nothing, so it needs no exclusion (and writes no lock file).
    let _lock = if args.dry_run { None } else { Some(session.lock()?) };
    let executables = executables(&session, true)?;
    let team = team_link(&session, args.offline_ledger)?;
    let explicit_mirror = open_mirror(args.mirror.as_deref(), &session, team.as_ref())?;
    let mut mirror = None;
    let notifier = open_notifier(&session, args.dry_run)?;
    let interval = args.interval.unwrap_or(Duration::from_secs(600));
    let mut failures = 0u32;
    loop {
        // The profile's default mirror (a dry run publishes nothing), reconnected while it is down.
        if explicit_mirror.is_none() && mirror.is_none() && !args.dry_run {
            mirror = default_mirror(&session, team.as_ref());
        }
        match iterate(&session, args, &executables, team.as_ref(), explicit_mirror.as_ref().or(mirror.as_ref())) {
            Ok((text, failed, tidings)) => {
                failures = 0;
                tell(&session, notifier.as_ref(), Told::Iteration(tidings));
                super::print(&text)?;
                if args.once {
                    // A submission that failed is an exit status, not only a line (docs/exit-codes.md).
                    return Ok(if failed > 0 { ExitStatus::PartialFailure } else { ExitStatus::Success }.into());
                }
                std::thread::sleep(interval);
            }
            Err(err) if args.once => {
                tell(&session, notifier.as_ref(), Told::Failure(trouble(&err)));
                return Err(err);
            }
            // The listener lasts: a Slurm timeout, a ledger restart or a list mid-edit ends this
            // iteration (nothing was submitted on doubt), never the listener.
            Err(err) => {
                tell(&session, notifier.as_ref(), Told::Failure(trouble(&err)));
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

fn trouble(err: &anyhow::Error) -> Event {
    Event::ListenerTrouble { message: format!("iteration failed: {err:#}") }
}

fn sync_text(report: &SyncReport) -> String {
    report
        .changes
        .iter()
        .map(|c| format!("sync: attempt {} {} {} → {} ({})\n", c.attempt, c.model, c.benchmark, c.to, c.reason))
        .collect()
}

pub(crate) fn sync_command(args: &SyncArgs) -> Result<ExitCode> {
    let session = Session::open(&args.ledger)?;
    let team = team_link(&session, args.offline_ledger)?;
    let mirror = match open_mirror(args.mirror.as_deref(), &session, team.as_ref())? {
        Some(mirror) => Some(mirror),
        None if args.mirror.is_none() => default_mirror(&session, team.as_ref()),
        None => None,
    };
    let notifier = open_notifier(&session, false)?;
    let world = Observation::take(session.ledger.as_ref(), &session.slurm, &session.cluster.name, now())?;
    let recorder = Recorder::new(session.ledger.as_ref(), mirror.as_ref());
    let stale_after = stale_after_s(args.stale_after, None);
    let cluster = &session.cluster;
    let report =
        sync::sync_and_heartbeat(&recorder, &world, &session.slurm, &cluster.name, stale_after, &cluster.verify)?;
    // Told here, once: a later launch does not see these changes again.
    tell(&session, notifier.as_ref(), Told::Events(notify::transition_events(&recorder.take())));
    super::print(&if args.format.is_json() {
        output::document("sync", &SyncOutput::from(&report))
    } else {
        sync_text(&report) + &format!("{} change(s)\n", report.changes.len())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `--job`: a Slurm job id, kept as the text the ledger stores (`-1`, `0`, `12a` are refused).
fn job_id(text: &str) -> std::result::Result<String, String> {
    match text.trim().parse::<crate::slurm::JobId>() {
        Ok(id) if id.0 > 0 => Ok(id.to_string()),
        _ => Err(format!("`{text}` is not a Slurm job id (a positive number)")),
    }
}

pub(crate) fn cancel_command(args: &CancelArgs) -> Result<ExitCode> {
    if !args.selection.names_jobs_or_models() {
        bail!("say what to cancel: --job ID… or --model M… [--benchmark B…]");
    }
    let session = Session::open(&args.ledger)?;
    let families = args.selection.families(&session)?;
    let dry_run = args.selection.dry_run;
    let active: Vec<_> = session.ledger.active()?.into_iter().filter(|a| a.cluster == session.cluster.name).collect();
    let selected: Vec<_> = active.iter().filter(|a| args.selection.selects(&families, a)).cloned().collect();
    // A leg whose run dir holds its outcome has ended: it no longer keeps a shared job running.
    let world = Observation::empty(now());
    let running = |a: &crate::ledger::Attempt| world.status_of(a).is_none_or(|s| s.outcome.is_none());
    let team = if dry_run { None } else { team_link(&session, false)? };
    let mirror = team.as_ref().and_then(|_| default_mirror(&session, team.as_ref()));
    let recorder = Recorder::new(session.ledger.as_ref(), mirror.as_ref());
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".to_string());
    let mut scancelled: Vec<String> = Vec::new();
    let mut cancelled = Vec::new();
    for (id, stop) in crate::cancel::decide(&selected, &active, &running) {
        let Some(attempt) = selected.iter().find(|a| a.id == id) else { continue };
        let (reason, leg_only) = match &stop {
            Stop::Job(job) => {
                if !dry_run && !scancelled.contains(job) {
                    session.slurm.cancel(job.parse().context("job id")?, None, false)?;
                    scancelled.push(job.clone());
                }
                ("cancelled by operator".to_string(), false)
            }
            Stop::Leg { job, others, .. } if dry_run => {
                (format!("this leg only (shared job {job} goes on with {others} other leg(s))"), true)
            }
            Stop::Leg { job, run_dir, others } => {
                let path = crate::cancel::request_leg_stop(run_dir, id, &user)
                    .with_context(|| format!("writing the cancel request into {}", run_dir.display()))?;
                let reason = format!(
                    "cancelled by operator: this leg only ({} written; shared job {job} goes on with {others} other leg(s))",
                    path.display()
                );
                (reason, true)
            }
            Stop::NoJob => ("cancelled by operator".to_string(), false),
        };
        if !dry_run {
            recorder.apply_to(id, AttemptStatus::Cancelled, &reason, Origin::Operator)?;
        }
        let done = CancelledOutput {
            attempt: id.0,
            model: attempt.model.clone(),
            benchmark: attempt.benchmark.clone(),
            job_id: attempt.slurm_job_id.clone(),
            leg_only,
        };
        if !args.format.is_json() {
            // Each line as it happens: a Slurm error later leaves these on the screen.
            super::print(&format!(
                "{} attempt {} ({} on {}), job {}{}\n",
                if dry_run { "would cancel" } else { "cancelled" },
                done.attempt,
                done.model,
                done.benchmark,
                done.job_id.as_deref().unwrap_or("-"),
                if leg_only { " (this leg only: the shared job's other legs go on)" } else { "" }
            ))?;
        }
        cancelled.push(done);
    }
    let notifier = open_notifier(&session, dry_run)?;
    tell(&session, notifier.as_ref(), Told::Events(notify::transition_events(&recorder.take())));
    super::print(&if args.format.is_json() {
        output::document("cancel", &CancelOutput { cancelled })
    } else {
        match dry_run {
            true => format!("{} attempt(s) would be cancelled, nothing changed (dry run)\n", cancelled.len()),
            false => format!("{} attempt(s) cancelled\n", cancelled.len()),
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `move`: each selected attempt's job that Slurm still has PENDING goes onto `--reservation`; the
/// others are named and left alone (a running job cannot change reservation). Exit 1 when Slurm
/// refused one (an unknown reservation, a user it does not admit).
pub(crate) fn move_command(args: &MoveArgs) -> Result<ExitCode> {
    crate::slurm::check_reservation_name(&args.reservation).context("--reservation")?;
    let session = Session::open(&args.ledger)?;
    let families = args.selection.families(&session)?;
    let dry_run = args.selection.dry_run;
    let selected: Vec<_> = session
        .ledger
        .active()?
        .into_iter()
        .filter(|a| a.cluster == session.cluster.name)
        .filter(|a| args.selection.selects(&families, a))
        .filter_map(|a| {
            let id: crate::slurm::JobId = a.slurm_job_id.as_deref()?.parse().ok()?;
            Some((a, id))
        })
        .collect();
    let ids: Vec<_> = selected.iter().map(|(_, id)| *id).collect();
    let states = session.slurm.jobs(&ids).context("asking Slurm for the jobs' states")?;
    let (mut moved, mut refused) = (0usize, 0usize);
    for (attempt, id) in &selected {
        let what = format!("job {id} (attempt {}, {} on {})", attempt.id.0, attempt.model, attempt.benchmark);
        let line = match states.iter().find(|job| job.id == *id).map(|job| &job.state) {
            Some(crate::slurm::JobState::Pending) if dry_run => {
                moved += 1;
                format!("would move {what} onto reservation {}\n", args.reservation)
            }
            Some(crate::slurm::JobState::Pending) => match session.slurm.move_to_reservation(*id, &args.reservation) {
                Ok(()) => {
                    moved += 1;
                    format!("moved {what} onto reservation {}\n", args.reservation)
                }
                Err(err) => {
                    refused += 1;
                    format!("not moved: {what}: {err}\n")
                }
            },
            Some(state) => format!("left alone: {what} is {state}, not pending\n"),
            None => format!("left alone: {what} is no longer known to Slurm\n"),
        };
        // Each line as it happens, as `cancel` does.
        super::print(&line)?;
    }
    super::print(&match dry_run {
        true => {
            format!("{moved} job(s) would be moved onto reservation {}, nothing changed (dry run)\n", args.reservation)
        }
        false => format!("{moved} job(s) moved onto reservation {}\n", args.reservation),
    })?;
    Ok(if refused > 0 { ExitStatus::Problems.into() } else { ExitCode::SUCCESS })
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
    /// Present (true) when only this leg of a shared job was stopped (its `cancel.request`) and
    /// the job goes on serving the other legs.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    leg_only: bool,
}

// The JSON documents of `plan`, `launch`, `sync` and `cancel` (docs/design.md §11): built from
// the planner's, executor's and sync's structs here, so a change to those is a compile error
// here rather than a silent change of the contract.

/// `plan`: every (model, leg dataset) pair of the selection, in priority order.
#[derive(Serialize)]
struct PlanOutput<'a> {
    /// The team's history folded in before planning; absent when the profile names no team database.
    #[serde(skip_serializing_if = "Option::is_none")]
    team: Option<TeamViewOutput<'a>>,
    jobs: Vec<PlannedJobOutput<'a>>,
    /// The shared jobs (one engine serving several legs of one model); left out when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    shared: Vec<SharedJobOutput<'a>>,
}

/// One shared job of a plan (docs/submitter.md, "Shared allocation").
#[derive(Serialize)]
struct SharedJobOutput<'a> {
    group_tag: &'a str,
    model: &'a str,
    /// `<group dir>/shared.json`.
    shared_spec: std::path::PathBuf,
    /// Its legs' run tags, in launch order.
    legs: Vec<&'a str>,
    /// The `--time` it asks for, and how it was worked out.
    time: &'a str,
    time_basis: &'a str,
    /// How the engine's `max_num_seqs` and the legs' `n_concurrent` were reconciled.
    capacity: &'a str,
    /// The exact `sbatch` argv (program first), once for the job.
    sbatch: &'a [String],
    /// For a pool (issue 37): its models in run order and its place among its engine's pools.
    #[serde(skip_serializing_if = "Option::is_none")]
    pool: Option<PoolOutput<'a>>,
}

/// What a pool adds to a shared job in `plan --json`.
#[derive(Serialize)]
struct PoolOutput<'a> {
    /// `<group dir>/pool.json`.
    pool_spec: std::path::PathBuf,
    /// 1-based place among the pools of one engine configuration, and their number.
    order: usize,
    of: usize,
    /// In run order: each model, its checkpoint dir and its legs' run tags.
    members: Vec<PoolMemberOutput<'a>>,
}

#[derive(Serialize)]
struct PoolMemberOutput<'a> {
    model: &'a str,
    weights: &'a std::path::Path,
    legs: Vec<&'a str>,
}

impl<'a> SharedJobOutput<'a> {
    fn new(group: &'a SharedJob, plan: &'a Plan) -> Self {
        SharedJobOutput {
            group_tag: &group.group_tag,
            model: &group.model,
            shared_spec: group.group_dir.join(launch_spec::shared::SHARED_SPEC_FILE),
            legs: group.legs.iter().map(|&i| plan.jobs[i].run_tag.as_str()).collect(),
            time: &group.time,
            time_basis: &group.time_basis,
            capacity: &group.capacity,
            sbatch: &group.sbatch,
            pool: group.pool.as_ref().map(|pool| PoolOutput {
                pool_spec: group.group_dir.join(launch_spec::pool::POOL_SPEC_FILE),
                order: pool.order.0,
                of: pool.order.1,
                members: pool
                    .members
                    .iter()
                    .zip(&pool.doc.members)
                    .map(|((model, legs), doc)| PoolMemberOutput {
                        model,
                        weights: &doc.weights.path,
                        legs: legs.iter().map(|&i| plan.jobs[i].run_tag.as_str()).collect(),
                    })
                    .collect(),
            }),
        }
    }
}

/// A pair's allocation, when it is not the default per-leg.
#[derive(Serialize)]
struct AllocationOutput<'a> {
    /// `shared`, `pool` or `per-leg`.
    mode: &'static str,
    /// What chose it: `--allocation`, `preset`, `profile`.
    source: &'static str,
    /// The group tag of the shared job or pool it is a leg of.
    #[serde(skip_serializing_if = "Option::is_none")]
    shared_job: Option<&'a str>,
    /// Why a `shared` leg still has a job of its own, or a `pool` leg is planned apart.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<&'a str>,
}

/// One planned pair (`plan`'s `jobs`, `launch`'s `elsewhere` and `flagged`).
#[derive(Serialize)]
struct PlannedJobOutput<'a> {
    model: &'a str,
    /// The leg: a preset name, or `datasets`.
    preset: &'a str,
    benchmark: &'a str,
    /// The benchmark family dedup counts in.
    family: &'a str,
    /// `submit`, `skip`, `resubmit` or `continue`.
    decision: &'static str,
    reason: &'a str,
    /// Why a pair the decision would queue is not queued; left out when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    blocked: Option<BlockedOutput<'a>>,
    run_tag: &'a str,
    resources: ResourcesOutput<'a>,
    timeout_multiplier: f64,
    /// Which registry rule matched (empty when the serve settings did not resolve).
    rule: &'a str,
    /// The resolved serve settings, null when they did not resolve.
    serve: Option<output::ServeSettings<'a>>,
    /// What is done to the pair's previous attempt before submitting.
    #[serde(skip_serializing_if = "Option::is_none")]
    prerequisite: Option<PrerequisiteOutput<'a>>,
    /// For the operator: an unattended attempt on another cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    flag: Option<&'a str>,
    /// For a walltime continuation: the attempt it continues and its place in the chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    continues: Option<ContinuationOutput>,
    /// For a skip: the attempt it rests on, this ledger's own or a row of the team's history.
    #[serde(skip_serializing_if = "Option::is_none")]
    evidence: Option<EvidenceOutput<'a>>,
    /// The job's tunnel(s) and the agent's model variables (or why it cannot launch here).
    tunnel: &'a str,
    /// What remediation changes in the pair's launch (docs/verification.md "Remediation").
    #[serde(skip_serializing_if = "Option::is_none")]
    remedy: Option<&'a str>,
    /// `<run dir>/launch.json`, for queued pairs.
    #[serde(skip_serializing_if = "Option::is_none")]
    spec_path: Option<&'a Path>,
    /// The readiness deadline and how it was computed (`ServeSpec::readiness_line`), for queued
    /// pairs.
    #[serde(skip_serializing_if = "Option::is_none")]
    readiness: Option<String>,
    /// The spec's `serve.ready_budget`, for queued pairs that have one.
    #[serde(skip_serializing_if = "Option::is_none")]
    ready_budget: Option<&'a launch_spec::spec::ReadyBudget>,
    /// The exact `sbatch` argv (program first), for queued pairs with a job of their own (a shared
    /// job's is in `shared`).
    #[serde(skip_serializing_if = "Option::is_none")]
    sbatch: Option<&'a [String]>,
    /// Every setting of the job with where it came from (`value`, `source`, a `note`).
    settings: &'a ResolvedSettings,
    /// Left out for the default (per-leg, nothing set).
    #[serde(skip_serializing_if = "Option::is_none")]
    allocation: Option<AllocationOutput<'a>>,
}

impl<'a> From<&'a PlannedJob> for PlannedJobOutput<'a> {
    fn from(job: &'a PlannedJob) -> Self {
        PlannedJobOutput {
            model: &job.model,
            preset: &job.preset,
            benchmark: &job.benchmark,
            family: &job.family,
            decision: job.action.as_str(),
            reason: &job.reason,
            blocked: job.blocked.as_ref().map(|blocked| match blocked {
                planner::Blocked::Refused(why) => BlockedOutput { kind: "refused", why },
                planner::Blocked::Throttled(why) => BlockedOutput { kind: "throttled", why },
                planner::Blocked::Held(why) => BlockedOutput { kind: "held", why },
            }),
            run_tag: &job.run_tag,
            resources: ResourcesOutput {
                gpus: job.resources.gpus,
                tensor_parallel_size: job.resources.tensor_parallel_size,
                data_parallel_size: job.resources.data_parallel_size,
                time: &job.resources.time,
                partition: &job.resources.partition,
                account: job.resources.account.as_deref(),
                reservation: job.resources.reservation.as_deref(),
            },
            timeout_multiplier: job.timeout_multiplier,
            rule: &job.rule,
            serve: job.resolved.as_ref().map(|resolved| output::ServeSettings::new(resolved, None)),
            prerequisite: job.prerequisite.as_ref().map(|p| match p {
                Prerequisite::MarkVanished { attempt_id } => {
                    PrerequisiteOutput { action: "mark_vanished", attempt_id: *attempt_id, slurm_job_id: None }
                }
                Prerequisite::CancelStale { attempt_id, slurm_job_id } => PrerequisiteOutput {
                    action: "cancel_stale",
                    attempt_id: *attempt_id,
                    slurm_job_id: Some(slurm_job_id),
                },
            }),
            flag: job.flag.as_deref(),
            continues: job.continues.map(|c| ContinuationOutput {
                attempt: c.attempt,
                number: c.number,
                first: c.first,
            }),
            evidence: job.evidence.as_ref().map(|e| match e {
                planner::Evidence::Own { attempt } => {
                    EvidenceOutput { source: "own_ledger", attempt: *attempt, team_row: None }
                }
                planner::Evidence::Team { row, attempt } => {
                    EvidenceOutput { source: "team", attempt: *attempt, team_row: Some(row) }
                }
            }),
            tunnel: &job.tunnel,
            remedy: job.remedy.as_deref(),
            spec_path: job.spec_path.as_deref(),
            readiness: job.spec.as_ref().map(|s| s.serve.readiness_line()),
            ready_budget: job.spec.as_ref().and_then(|s| s.serve.ready_budget.as_ref()),
            sbatch: job.sbatch.as_deref(),
            settings: &job.settings,
            allocation: (job.settings.allocation.source != Source::Default).then(|| AllocationOutput {
                mode: job.settings.allocation.value.as_str(),
                source: plan_text::allocation_source(&job.settings.allocation.source),
                shared_job: job.shared_job.as_deref(),
                note: job.allocation_note.as_deref(),
            }),
        }
    }
}

#[derive(Serialize)]
struct EvidenceOutput<'a> {
    /// `own_ledger` (an attempt a submitter of this ledger recorded) or `team` (a row of the
    /// team's `sandbox_jobs`, folded in).
    source: &'static str,
    /// The ledger attempt.
    attempt: i64,
    /// The team's `sandbox_jobs.id`, for `team`.
    #[serde(skip_serializing_if = "Option::is_none")]
    team_row: Option<&'a str>,
}

#[derive(Serialize)]
struct BlockedOutput<'a> {
    /// `refused` (its configuration is broken) or `throttled` (no slot this iteration).
    kind: &'static str,
    why: &'a str,
}

/// What the job asks Slurm for.
#[derive(Serialize)]
struct ResourcesOutput<'a> {
    gpus: u32,
    tensor_parallel_size: u32,
    data_parallel_size: u32,
    /// `--time`, as the profile or preset gives it.
    time: &'a str,
    partition: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    account: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reservation: Option<&'a str>,
}

#[derive(Serialize)]
struct PrerequisiteOutput<'a> {
    /// `mark_vanished` (the latest attempt left Slurm without an outcome) or `cancel_stale` (it
    /// has been pending too long: its job is cancelled).
    action: &'static str,
    attempt_id: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    slurm_job_id: Option<&'a str>,
}

/// An attempt's place in a walltime chain (`plan`'s and `status`'s `continues`).
#[derive(Serialize)]
pub(crate) struct ContinuationOutput {
    /// The attempt this one continues.
    attempt: i64,
    /// 1 for the first continuation, …
    number: u32,
    /// The chain's first attempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    first: Option<i64>,
}

impl From<Continuation> for ContinuationOutput {
    fn from(c: Continuation) -> Self {
        ContinuationOutput { attempt: c.attempt, number: c.number, first: c.first }
    }
}

/// `launch`: one iteration — what sync changed, what was submitted, what was left alone.
#[derive(Serialize)]
struct LaunchOutput<'a> {
    /// The team's history folded in first; absent when the profile names no team database.
    #[serde(skip_serializing_if = "Option::is_none")]
    team: Option<TeamViewOutput<'a>>,
    sync: SyncOutput<'a>,
    /// Every pair the iteration meant to queue, with what happened to it.
    submitted: Vec<SubmittedOutput<'a>>,
    /// Pairs dedup skipped (finished, in progress, given up on).
    skipped: usize,
    /// Submissions that failed (the exit status is then 6, docs/exit-codes.md).
    failed: usize,
    /// Pairs in progress on another cluster.
    elsewhere: Vec<PlannedJobOutput<'a>>,
    /// Pairs with a flag for the operator.
    flagged: Vec<PlannedJobOutput<'a>>,
    /// What the remediation pass decided before the plan (docs/verification.md "Remediation").
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    remediation: &'a [crate::remediate::Decision],
}

#[derive(Serialize)]
struct SubmittedOutput<'a> {
    model: &'a str,
    benchmark: &'a str,
    /// The ledger attempt, null when none was recorded (held back before the insert).
    attempt: Option<i64>,
    /// The Slurm job, null when none was submitted.
    job_id: Option<&'a str>,
    /// `submitted (…)`, `sbatch failed: …`, `not submitted: …`, `refused: …`, `dry run`, ….
    outcome: &'a str,
    /// For a dry run: the sbatch argv that would have run.
    #[serde(skip_serializing_if = "Option::is_none")]
    sbatch: Option<&'a [String]>,
}

impl<'a> From<&'a Submitted> for SubmittedOutput<'a> {
    fn from(s: &'a Submitted) -> Self {
        SubmittedOutput {
            model: &s.model,
            benchmark: &s.benchmark,
            attempt: s.attempt,
            job_id: s.job_id.as_deref(),
            outcome: &s.outcome,
            sbatch: s.sbatch.as_deref(),
        }
    }
}

/// `sync` (and `launch`'s `sync`): the ledger changes reconciling with Slurm and the run dirs made.
#[derive(Serialize)]
struct SyncOutput<'a> {
    changes: Vec<ChangeOutput<'a>>,
}

#[derive(Serialize)]
struct ChangeOutput<'a> {
    attempt: i64,
    model: &'a str,
    benchmark: &'a str,
    /// The attempt's new ledger status (`started`, `finished`, `failed`, …).
    to: &'static str,
    reason: &'a str,
    /// Present (true) when it ended by the walltime: the next plan continues it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    resumable: bool,
}

impl<'a> From<&'a SyncReport> for SyncOutput<'a> {
    fn from(report: &'a SyncReport) -> Self {
        SyncOutput { changes: report.changes.iter().map(ChangeOutput::from).collect() }
    }
}

impl<'a> From<&'a Change> for ChangeOutput<'a> {
    fn from(c: &'a Change) -> Self {
        ChangeOutput {
            attempt: c.attempt,
            model: &c.model,
            benchmark: &c.benchmark,
            to: c.to.as_str(),
            reason: &c.reason,
            resumable: c.resumable,
        }
    }
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
