//! `submitter listener start|status|stop|tick`: the self-re-queuing listener job.
//!
//! `start` records the launch arguments in `<state_dir>/listener.json` and submits the first job;
//! each job (`tick`) first queues its successor (`--begin=now+interval`, `--dependency=singleton`,
//! same name) unless one is already pending, then runs one `launch --once` iteration (also when the
//! successor could not be queued: the tick then exits with Slurm's status). `stop` marks
//! the state stopped and cancels every job of that name.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use crate::config::ClusterProfile;
use crate::config::cluster::ListenerSettings;
use crate::slurm::{JobState, SbatchOptions, Slurm, SlurmCli, SubmitRequest};
use anyhow::{Context, Result, bail};
use clap::Parser;
use serde::{Deserialize, Serialize};

use super::session::{LedgerArgs, Session};
use crate::output::{self, FormatArgs};

pub(crate) const STATE_FILE: &str = "listener.json";

#[derive(clap::Subcommand)]
pub(crate) enum ListenerCommand {
    /// Submit the listener job: every --interval it runs `launch --once` with the given arguments.
    Start {
        #[command(flatten)]
        ledger: LedgerArgs,
        #[arg(long, value_parser = crate::config::args::interval)]
        interval: Duration,
        /// Time limit of each listener job (default: the profile's `listener.time`).
        #[arg(long, value_parser = crate::config::args::slurm_time)]
        time: Option<String>,
        /// `launch` selection arguments after `--`, e.g. `-- --preset tb2 --models-file list.txt`.
        #[arg(last = true, required = true)]
        launch_args: Vec<String>,
    },
    /// The listener's state and its queued/running jobs.
    Status {
        #[command(flatten)]
        ledger: LedgerArgs,
        /// `--format json`: a `listener.status` document (docs/design.md §11).
        #[command(flatten)]
        format: FormatArgs,
    },
    /// Stop the listener: no more iterations, its jobs cancelled.
    Stop {
        #[command(flatten)]
        ledger: LedgerArgs,
    },
    /// One iteration (what the listener job runs).
    #[command(hide = true)]
    Tick {
        #[arg(long)]
        state_file: PathBuf,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ListenerState {
    cluster: String,
    job_name: String,
    interval_s: u64,
    time: String,
    partition: String,
    account: Option<String>,
    qos: Option<String>,
    #[serde(default)]
    reservation: Option<String>,
    #[serde(default = "default_mem_mb")]
    mem_mb: u64,
    output: PathBuf,
    script: PathBuf,
    /// Full `launch` arguments (cluster, state dir, selection), without `--once`.
    launch_args: Vec<String>,
    /// Variables the listener job gets (`--export`): binaries and config root, never secrets.
    export: Vec<(String, String)>,
    stopped: bool,
    iterations: u64,
}

fn default_mem_mb() -> u64 {
    1000
}

fn job_name(cluster: &str) -> String {
    format!("eval-listener-{cluster}")
}

fn read_state(path: &Path) -> Result<ListenerState> {
    let text = launch_spec::fsread::read_text_capped(
        path,
        launch_spec::fsread::RECORD_CAP,
        launch_spec::fsread::Links::Refuse,
    )
    .with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a listener state file", path.display()))
}

fn write_state(path: &Path, state: &ListenerState) -> Result<()> {
    launch_spec::records::write_atomically(path, (serde_json::to_string_pretty(state)? + "\n").as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

fn submit(slurm: &dyn Slurm, state: &ListenerState, state_file: &Path, begin: Option<String>) -> Result<String> {
    let request = SubmitRequest {
        script: state.script.clone(),
        script_args: vec![state_file.display().to_string()],
        options: SbatchOptions {
            job_name: Some(state.job_name.clone()),
            partition: Some(state.partition.clone()),
            account: state.account.clone(),
            qos: state.qos.clone(),
            reservation: state.reservation.clone(),
            time_limit: crate::config::parse_slurm_time(&state.time).map(Duration::from_secs),
            cpus_per_task: Some(1),
            mem_mb: Some(state.mem_mb),
            output: Some(state.output.clone()),
            dependency: Some("singleton".to_string()),
            begin,
            ..SbatchOptions::default()
        },
        export: state.export.clone(),
    };
    Ok(slurm.submit(&request)?.to_string())
}

/// Jobs of the listener's name that are queued or running, except `except`.
fn live_jobs(slurm: &dyn Slurm, name: &str, except: Option<&str>) -> Result<Vec<(String, JobState)>> {
    Ok(slurm
        .find_by_name(name)?
        .into_iter()
        .filter(|j| j.state.is_active() && Some(j.id.to_string().as_str()) != except)
        .map(|j| (j.id.to_string(), j.state))
        .collect())
}

pub(crate) fn listener(command: ListenerCommand) -> Result<ExitCode> {
    match command {
        ListenerCommand::Start { ledger, interval, time, launch_args } => {
            start(&ledger, interval, time.as_deref(), launch_args)
        }
        ListenerCommand::Status { ledger, format } => status(&ledger, format),
        ListenerCommand::Stop { ledger } => stop(&ledger),
        ListenerCommand::Tick { state_file } => tick(&state_file),
    }
}

/// Why the listener job cannot be placed as the profile stands, if it cannot: no `listener:`
/// section (it would inherit the GPU partition), or staging on nodes without internet.
fn listener_settings(cluster: &ClusterProfile) -> Result<&ListenerSettings> {
    let Some(listener) = &cluster.listener else {
        bail!(
            "clusters/{0}.yaml has no `listener:` section: the listener job would take a GPU node for a 1-CPU tick — add `listener: {{partition: <a CPU/serial partition>, time: \"00:30:00\"}}` (docs/submitter.md, \"The listener\")",
            cluster.name
        );
    };
    let internet = listener.internet.unwrap_or(cluster.network.internet);
    // Each tick stages on its own node: models when `pre_download.enabled`, a dataset whenever its
    // dir is missing (docs/site.md). Without internet there, staging cannot work.
    if !internet {
        let models = if cluster.pre_download.enabled { "models (pre_download.enabled) and " } else { "" };
        bail!(
            "clusters/{0}.yaml: the listener's partition {1} has no internet (listener.internet: false), but each tick stages {models}missing datasets there: put the listener on a partition with internet (e.g. a serial/login partition, `listener.internet: true`), or run `submitter launch --watch` on a login node",
            cluster.name,
            listener.partition
        );
    }
    Ok(listener)
}

/// Variables an operator sets interactively that the tick's iteration reads when set: where the
/// secrets file is (a path, not a secret) and the Hugging Face cache staging fills.
const OPERATOR_PATHS: [&str; 3] = ["DC_AGENT_SECRET_ENV", "HF_HOME", "HF_HUB_CACHE"];

/// The variables the tick needs from this shell: those the profile's `${VAR}` references name
/// (Jupiter's `PROJECT`/`SCRATCH`, Leonardo's `WORK`), the operator's paths ([`OPERATOR_PATHS`]),
/// the profile's `slurm.export_env` and `listener.export_env`. An unset referenced variable is
/// refused now, not found in every tick.
fn listener_environment(cluster: &ClusterProfile, listener: &ListenerSettings) -> Result<Vec<(String, String)>> {
    let mut export = Vec::new();
    for name in cluster.referenced_variables() {
        match std::env::var(&name) {
            Ok(value) => export.push((name, value)),
            Err(_) => bail!(
                "clusters/{}.yaml uses ${{{name}}}, which is not set here: the listener job expands the profile on its node and needs it — export it (e.g. `jutil env activate` on Jupiter) and start again",
                cluster.name
            ),
        }
    }
    let operator = OPERATOR_PATHS.iter().map(|n| n.to_string());
    for name in operator.chain(cluster.slurm.export_env.iter().cloned()).chain(listener.export_env.iter().cloned()) {
        if !export.iter().any(|(n, _)| *n == name)
            && let Ok(value) = std::env::var(&name)
        {
            export.push((name, value));
        }
    }
    Ok(export)
}

fn start(ledger: &LedgerArgs, interval: Duration, time: Option<&str>, launch_args: Vec<String>) -> Result<ExitCode> {
    if ledger.store.ledger.as_deref().is_some_and(|l| crate::ledger::redact_url(l) != l) {
        bail!("the listener job cannot carry a ledger password: put it in ~/.pgpass and pass the URL without it");
    }
    let session = Session::open(ledger)?;
    if launch_args.iter().any(|a| a == "--once" || a == "--watch") {
        bail!("give only the selection after `--`; the listener adds --once itself");
    }
    let settings = listener_settings(&session.cluster)?;
    let name = job_name(&session.cluster.name);
    let mut args = vec![
        "--cluster".to_string(),
        session.cluster.name.clone(),
        "--state-dir".to_string(),
        session.state_dir.display().to_string(),
    ];
    if let Some(l) = &ledger.store.ledger {
        args.extend(["--ledger".to_string(), l.clone()]);
    }
    // The job runs elsewhere: carry explicit configuration directories as absolute paths.
    for (flag, dir) in [
        ("--registry", &ledger.dirs.registry_dir),
        ("--clusters", &ledger.dirs.clusters_dir),
        ("--presets", &ledger.dirs.presets_dir),
    ] {
        if let Some(dir) = dir {
            args.extend([flag.to_string(), std::path::absolute(dir)?.display().to_string()]);
        }
    }
    args.extend(launch_args);
    // Refused now rather than in every tick: what the ticks will run must parse as a launch.
    let launch = parse_launch(&args)?;
    if launch.uses_team_database(&session) {
        team_database_reaches_the_job(&session)?;
    }
    let mut export = listener_environment(&session.cluster, settings)?;
    let live = live_jobs(&session.slurm, &name, None)?;
    if !live.is_empty() {
        bail!(
            "a listener for {} is already queued or running (job {}): `submitter listener stop --cluster {}` first",
            session.cluster.name,
            live[0].0,
            session.cluster.name
        );
    }
    let exe = std::env::current_exe()?;
    export.extend([
        ("SUBMITTER_BIN".to_string(), exe.display().to_string()),
        ("SUBMITTER_HOME".to_string(), session.root.display().to_string()),
    ]);
    // The ticks find the payload binary as this command does (the profile's `slurm.payload_bin`, else
    // beside SUBMITTER_BIN); an override in this shell goes with them.
    if let Some(bin) = std::env::var_os("PAYLOAD_BIN").filter(|b| !b.is_empty()) {
        export.push(("PAYLOAD_BIN".to_string(), bin.to_string_lossy().into_owned()));
    }
    let state = ListenerState {
        cluster: session.cluster.name.clone(),
        job_name: name.clone(),
        interval_s: interval.as_secs(),
        time: time.unwrap_or(&settings.time).to_string(),
        partition: settings.partition.clone(),
        account: settings.account.clone(),
        qos: settings.qos.clone(),
        reservation: settings.reservation.clone(),
        mem_mb: settings.mem_mb,
        output: session.state_dir.join("listener-%j.out"),
        script: session.root.join("sbatch/listener.sbatch"),
        launch_args: args,
        export,
        stopped: false,
        iterations: 0,
    };
    let state_file = session.state_dir.join(STATE_FILE);
    write_state(&state_file, &state)?;
    let job = submit(&session.slurm, &state, &state_file, None)?;
    super::print(&format!(
        "listener {name} started as job {job} on partition {}; every {} s; state {}\n",
        state.partition,
        state.interval_s,
        state_file.display()
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// The listener job gets no `$SUBMITTER_TEAM_DB` (a secret is never exported: Slurm's job record
/// shows the environment it was given); it reads the team database URL from the secrets file on
/// its node, as payload reads its keys. Refused now when that file cannot give it.
fn team_database_reaches_the_job(session: &Session) -> Result<()> {
    let Some(settings) = &session.cluster.team else {
        bail!(
            "--mirror in a listener: the job never gets ${} — name the team database in clusters/{}.yaml \
             (`team: {{database_secret: NAME}}`) and put `NAME=postgresql://…` in your 0600 secrets file",
            crate::team::TEAM_DB_ENV,
            session.cluster.name
        );
    };
    super::team::TeamLink::from_secrets_file(session, settings).context(format!(
        "the listener job reads the team database URL from the secrets file (never ${}), or run it with \
         `-- … --offline-ledger`",
        crate::team::TEAM_DB_ENV
    ))?;
    Ok(())
}

fn parse_launch(args: &[String]) -> Result<super::queueing::LaunchArgs> {
    let mut argv = vec!["submitter".to_string(), "launch".to_string()];
    argv.extend(args.iter().cloned());
    argv.push("--once".to_string());
    let cli = super::Cli::try_parse_from(&argv).map_err(|e| {
        anyhow::anyhow!("the launch arguments do not parse: {}", e.to_string().lines().next().unwrap_or_default())
    })?;
    match cli.command {
        super::Command::Launch(args) => Ok(args),
        _ => bail!("stored arguments are not a launch"),
    }
}

fn status(ledger: &LedgerArgs, format: FormatArgs) -> Result<ExitCode> {
    let session = Session::open(ledger)?;
    let state_file = session.state_dir.join(STATE_FILE);
    let name = job_name(&session.cluster.name);
    let live = live_jobs(&session.slurm, &name, None)?;
    let state = read_state(&state_file).ok();
    let word = match &state {
        Some(state) if state.stopped => "stopped",
        Some(_) => "active",
        None => "never_started",
    };
    if format.is_json() {
        let doc = ListenerStatusOutput {
            job_name: &name,
            state: word,
            iterations: state.as_ref().map(|s| s.iterations),
            interval_s: state.as_ref().map(|s| s.interval_s),
            jobs: live.iter().map(|(id, state)| ListenerJobOutput { job_id: id, state: state.to_string() }).collect(),
        };
        super::print(&output::document("listener.status", &doc))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = match &state {
        Some(state) => {
            format!("listener {name}: {word}, {} iteration(s), every {} s\n", state.iterations, state.interval_s)
        }
        None => format!("listener {name}: never started on this state dir\n"),
    };
    for (id, state) in &live {
        out += &format!("  job {id} {state}\n");
    }
    super::print(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// `listener status`: the listener's recorded state and its queued or running jobs.
#[derive(Serialize)]
struct ListenerStatusOutput<'a> {
    /// The Slurm job name every listener job of this cluster carries.
    job_name: &'a str,
    /// `active`, `stopped` or `never_started` (no state file in this state dir).
    state: &'static str,
    /// Ticks run so far; null when never started.
    iterations: Option<u64>,
    interval_s: Option<u64>,
    jobs: Vec<ListenerJobOutput<'a>>,
}

#[derive(Serialize)]
struct ListenerJobOutput<'a> {
    job_id: &'a str,
    /// Slurm's state: `PENDING`, `RUNNING`, ….
    state: String,
}

fn stop(ledger: &LedgerArgs) -> Result<ExitCode> {
    let session = Session::open(ledger)?;
    let state_file = session.state_dir.join(STATE_FILE);
    if let Ok(mut state) = read_state(&state_file) {
        state.stopped = true;
        write_state(&state_file, &state)?;
    }
    let name = job_name(&session.cluster.name);
    let live = live_jobs(&session.slurm, &name, None)?;
    for (id, _) in &live {
        session.slurm.cancel(id.parse()?, None, false)?;
    }
    super::print(&format!("listener {name} stopped; {} job(s) cancelled\n", live.len()))?;
    // Stopping is done; a notifier that cannot be opened only warns.
    match super::consumers::open_notifier(&session, false) {
        Ok(notifier) => {
            let user = std::env::var("USER").unwrap_or_else(|_| "unknown".to_string());
            let event = crate::notify::Event::ListenerTrouble { message: format!("{name} stopped by {user}") };
            super::consumers::tell(&session, notifier.as_ref(), super::consumers::Told::Once(event));
        }
        Err(err) => tracing::warn!("notify: {err:#}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Tries a Slurm call up to three times, 2 s then 4 s apart: one `squeue` timeout must not end
/// the chain of listener jobs.
fn retrying<T>(what: &str, mut call: impl FnMut() -> Result<T>) -> Result<T> {
    let mut wait = Duration::from_secs(2);
    for _ in 0..2 {
        match call() {
            Ok(value) => return Ok(value),
            Err(err) => {
                super::report_error(&err.context(format!("{what}; retrying in {} s", wait.as_secs())));
                std::thread::sleep(wait);
                wait *= 2;
            }
        }
    }
    call()
}

fn tick(state_file: &Path) -> Result<ExitCode> {
    let mut state = read_state(state_file)?;
    if state.stopped {
        super::print("listener stopped; not re-queuing\n")?;
        return Ok(ExitCode::SUCCESS);
    }
    let slurm = SlurmCli::new();
    let me = std::env::var("SLURM_JOB_ID").ok();
    // Queue the successor first, so a failing iteration does not end the chain; never a second
    // queued copy. When Slurm cannot say whether one is queued, queue anyway: `singleton` keeps
    // copies from running together, and a copy that finds another pending does not re-queue.
    let pending = match retrying("listing the listener's jobs", || live_jobs(&slurm, &state.job_name, me.as_deref())) {
        Ok(pending) => pending,
        Err(err) => {
            super::report_error(&err.context("queuing the next iteration anyway"));
            Vec::new()
        }
    };
    // A successor that cannot be queued does not cost this iteration its launch (issue 32 item
    // 12): the error is reported now, the launch runs, and the tick's status says Slurm failed.
    let mut not_queued = None;
    if pending.is_empty() {
        match queue_successor(&slurm, &state, state_file, me.as_deref()) {
            Ok(Queued::Submitted(next)) => super::print(&format!("next listener iteration queued as job {next}\n"))?,
            Ok(Queued::Found(next)) => super::print(&format!(
                "next listener iteration queued as job {next} (sbatch's answer was lost, job found by its name)\n"
            ))?,
            Err(err) => {
                let err = err.context("the next listener iteration is not queued (this one runs)");
                super::report_error(&err);
                not_queued = Some(err);
            }
        }
    }
    state.iterations += 1;
    write_state(state_file, &state)?;
    let args = parse_launch(&state.launch_args).context("the stored launch arguments no longer parse")?;
    // The profile is re-read every tick: one edited since `start` to stage without internet here is
    // refused with the reason rather than staging on a node that cannot.
    let dirs = args.ledger().dirs.resolve()?;
    listener_settings(&crate::config::load_cluster(
        &dirs.clusters,
        &super::session::cluster_name(args.ledger().cluster.as_deref(), &dirs.clusters)?,
    )?)?;
    let launched = super::queueing::launch_command(&args)?;
    match not_queued {
        Some(err) if launched == ExitCode::SUCCESS => {
            Ok(crate::output::ExitStatus::of_error(err.chain(), super::wrapped_status).into())
        }
        _ => Ok(launched),
    }
}

/// How the next iteration got queued.
enum Queued {
    Submitted(String),
    /// `sbatch` failed or its answer was lost, and a job of the listener's name was found queued.
    Found(String),
}

/// Queues the next iteration, retried as [`retrying`] does; before each retry the listener's jobs
/// are listed again, since an `sbatch` whose answer was lost (a socket timeout, a killed client)
/// may have queued it: retrying blindly queued a copy per try (issue 32 item 12).
fn queue_successor(slurm: &dyn Slurm, state: &ListenerState, state_file: &Path, me: Option<&str>) -> Result<Queued> {
    let begin = format!("now+{}", state.interval_s.max(1));
    let mut first_try = true;
    retrying("queuing the next listener iteration", || {
        if !std::mem::take(&mut first_try)
            && let Some((found, _)) = live_jobs(slurm, &state.job_name, me)?.into_iter().next()
        {
            return Ok(Queued::Found(found));
        }
        submit(slurm, state, state_file, Some(begin.clone())).map(Queued::Submitted)
    })
}
