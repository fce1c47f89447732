//! A shared job (issue 24; the files in launch_spec::shared, docs/payload.md "Shared jobs"): one
//! engine serves several legs, each leg a Harbor job with its own run dir, records and outcome.
//!
//! `payload run --shared <group_dir>/shared.json` is the *engine host*: crate::run's run with a
//! spec made from the first readable leg's engine fields (run dir = the group dir), which starts
//! the engine as a per-leg job does and, once it is ready (and the tunnel is up), writes
//! `engine.json` and starts every leg as a child `payload run --spec <leg> --engine <engine.json>`
//! in its own process group, the engine's per-job key in its environment. A leg is crate::run's
//! run too, attached to the host's engine (crate::prepare::Attached): no GPU probe, no port, no
//! engine, no tunnel of its own; everything else (resume rules, the print-config check, Harbor,
//! heartbeats, provenance, post_run, its outcome) as a per-leg job.
//!
//! The host forwards USR1/TERM/INT/HUP to every running leg; when the engine is lost it writes
//! `engine_ended.json`, which each leg reads within [`SHARE_POLL`] and ends with that class; a leg
//! reads its own `cancel.request` the same way. The host ends when every leg has ended, then
//! tears the engine down; its exit code is [`exit_code`]'s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use launch_spec::records::{Outcome, Phase, RunStatus, STATUS_FILE};
use launch_spec::rundir::events as ev;
use launch_spec::shared::{
    self as files, CANCEL_REQUEST_FILE, ENGINE_ENDED_FILE, ENGINE_FILE, EngineEnded, EngineRecord, SharedJobSpec,
};
use launch_spec::{LaunchSpec, OutcomeClass};
use nix::sys::signal::Signal;

use crate::failure::Failure;
use crate::phases::{End, Input, RunPhase};
use crate::prepare::{self, Attached, HarborJob, Mode, Observed, Prepared};
use crate::records::Recorder;
use crate::run::{Run, Share};
use crate::supervisor::{self, ChildSpec, SignalEvent, SignalSource, TeardownGrace, status_code};

/// How often a leg looks for its cancel request and the host's word, and the host at its legs.
pub(crate) const SHARE_POLL: Duration = Duration::from_millis(250);

/// Most severe first: the host's exit code is the first of these any leg ended with.
pub(crate) const SEVERITY: [OutcomeClass; 11] = [
    OutcomeClass::EngineDied,
    OutcomeClass::EngineHung,
    OutcomeClass::EngineStart,
    OutcomeClass::EngineTimeout,
    OutcomeClass::Gpu,
    OutcomeClass::Secrets,
    OutcomeClass::Tunnel,
    OutcomeClass::Walltime,
    OutcomeClass::Interrupted,
    OutcomeClass::Harbor,
    OutcomeClass::Spec,
];

/// One leg as the host sees it.
#[derive(Debug)]
pub struct HostLeg {
    pub run_tag: String,
    pub run_dir: PathBuf,
    pub spec_path: PathBuf,
    pub state: LegState,
    /// Its Harbor is running (its `status.json` says `running`): serving, for the GPU clock.
    pub(crate) harbor_running: bool,
    /// In a pool (crate::run::pool): its member's index; 0 in a shared job.
    pub(crate) member: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum LegState {
    /// To be started once the engine is ready.
    Pending,
    /// Its Harbor job finished in an earlier run (check_resumable): never re-run, left untouched.
    Skipped,
    /// Refused before it could start (its spec unreadable, or another engine's): recorded.
    Refused,
    /// Its payload runs: `Supervisor::legs[index]`.
    Running { index: usize },
    /// Its payload ended with this outcome (its own, or the host's when it recorded none).
    Ended { class: OutcomeClass, exit_code: i32 },
}

/// The engine host's legs.
#[derive(Debug)]
pub struct Host {
    pub legs: Vec<HostLeg>,
    pub group_dir: PathBuf,
    /// A pool's members and swaps (crate::run::pool); `None` for a shared job.
    pub(crate) pool: Option<crate::run::pool_host::PoolHost>,
}

/// The host's exit code from its legs' ends: 0 when every leg finished (now or before), else
/// the code of the most severe class any leg ended with ([`SEVERITY`]).
pub fn exit_code(ends: &[(OutcomeClass, i32)]) -> i32 {
    SEVERITY.iter().find_map(|class| ends.iter().find(|(c, _)| c == class).map(|(_, code)| *code)).unwrap_or(0)
}

/// `payload run --shared FILE`: reads the shared job and its legs, records refused legs, and runs
/// the engine host. Never panics; a `shared.json` that cannot be read exits 2 writing nothing.
pub async fn run_shared(shared_path: &Path) -> i32 {
    let started = Instant::now();
    let signals = match super::start_supervising() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let doc = match SharedJobSpec::from_file(shared_path) {
        Ok(doc) => doc,
        Err(err) => {
            tracing::error!(class = "spec", error = %err, "bad shared job");
            return OutcomeClass::Spec.exit_code();
        }
    };
    // The shared job is every leg's job: a leg's record written by the host carries its id.
    let job_id = std::env::var("SLURM_JOB_ID").ok().filter(|j| !j.is_empty());
    let (host, template) = read_legs(&doc, job_id.as_deref());
    let Some(template) = template else {
        tracing::error!(class = "spec", "no leg of the shared job has a readable spec: nothing to run");
        return OutcomeClass::Spec.exit_code();
    };
    let ends = leg_ends(&host);
    if !host.legs.iter().any(|l| l.state == LegState::Pending) {
        tracing::info!("no leg left to run (each finished before or was refused): the engine is not started");
        return exit_code(&ends);
    }
    let spec = match host_spec(&doc, template) {
        Ok(spec) => spec,
        Err(err) => {
            tracing::error!(class = "spec", error = %err, "bad shared job");
            return OutcomeClass::Spec.exit_code();
        }
    };
    // A word of an earlier run must not end this run's legs.
    let _ = std::fs::remove_file(doc.group_dir.join(ENGINE_ENDED_FILE));
    let _ = std::fs::remove_file(doc.group_dir.join(ENGINE_FILE));
    crate::run::run_spec(shared_path, spec, signals, prepare::parent_env(), Share::Host(host), started).await
}

/// `payload run --spec LEG --engine ENGINE_JSON`: one leg, on the host's engine.
pub async fn run_leg(spec_path: &Path, engine_path: &Path) -> i32 {
    let started = Instant::now();
    let signals = match super::start_supervising() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mut parent = prepare::parent_env();
    let api_key = parent.iter().find(|(k, _)| k == files::ENGINE_KEY_VAR).map(|(_, v)| v.clone());
    parent.retain(|(k, _)| k != files::ENGINE_KEY_VAR);
    let spec = match LaunchSpec::from_file(spec_path) {
        Ok(spec) => spec,
        Err(err) => {
            tracing::error!(class = "spec", error = %err, "bad launch spec");
            return OutcomeClass::Spec.exit_code();
        }
    };
    let engine = match EngineRecord::from_file(engine_path) {
        Ok(engine) => engine,
        Err(err) => {
            tracing::error!(class = "spec", error = %err, "bad engine record");
            return OutcomeClass::Spec.exit_code();
        }
    };
    let group_dir = engine_path.parent().map(Path::to_path_buf).unwrap_or_default();
    let attached = Attached { engine, group_dir, api_key };
    crate::run::run_spec(spec_path, spec, signals, parent, Share::Leg(attached), started).await
}

/// Reads every leg's spec: refused legs are recorded in their run dirs, finished ones skipped.
/// Returns the host's legs and the first readable spec (the engine's template).
fn read_legs(doc: &SharedJobSpec, job_id: Option<&str>) -> (Host, Option<LaunchSpec>) {
    let mut legs = Vec::new();
    let mut template: Option<LaunchSpec> = None;
    for (i, path) in doc.legs.iter().enumerate() {
        let run_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let dir_tag = run_dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        let refuse = |legs: &mut Vec<HostLeg>, run_tag: String, message: String| {
            tracing::error!(leg = i, run_tag = %run_tag, error = %message, "leg refused");
            record_leg(&run_dir, &run_tag, job_id, refused(message));
            legs.push(HostLeg {
                run_tag,
                run_dir: run_dir.clone(),
                spec_path: path.clone(),
                state: LegState::Refused,
                harbor_running: false,
                member: 0,
            });
        };
        let spec = match LaunchSpec::from_file(path) {
            Ok(spec) => spec,
            Err(err) => {
                refuse(&mut legs, dir_tag, format!("legs[{i}]: {err}"));
                continue;
            }
        };
        if let Some(first) = &template
            && let Some(why) = files::engine_mismatch_at(first, i, &spec)
        {
            refuse(&mut legs, spec.run_tag.clone(), why);
            continue;
        }
        let finished = harbor_job_finished(&spec.run_dir);
        let state = if finished { LegState::Skipped } else { LegState::Pending };
        legs.push(HostLeg {
            run_tag: spec.run_tag.clone(),
            run_dir: spec.run_dir.clone(),
            spec_path: path.clone(),
            state,
            harbor_running: false,
            member: 0,
        });
        template.get_or_insert(spec);
    }
    (Host { legs, group_dir: doc.group_dir.clone(), pool: None }, template)
}

/// Whether the leg's Harbor job finished in an earlier run (its `result.json` has `finished_at`,
/// the rule `check_resumable` refuses a resume by), whatever the spec's `harbor.start`.
pub(crate) fn harbor_job_finished(run_dir: &Path) -> bool {
    use launch_spec::rundir::harbor::{JobResult, RESULT_FILE, read_rewritten};
    let result: Option<JobResult> = read_rewritten(&run_dir.join(RESULT_FILE)).ok().flatten();
    result.is_some_and(|r| r.finished_at.is_some())
}

/// The outcome of a leg whose payload exited without recording one while the host lives: a signal
/// (SIGKILL from the OOM killer or a person) is `interrupted` with `cause: leg_killed` and the
/// signal; any other exit is `spec`/`refused` (it could not run).
fn leg_died(status: std::process::ExitStatus, log: &Path) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    let how = supervisor::describe_status(status);
    match status.signal() {
        Some(signal) => Outcome {
            class: OutcomeClass::Interrupted,
            cause: Some("leg_killed".into()),
            exit_code: status_code(status),
            message: format!("the leg's payload was {how} before it recorded an outcome; see {}", log.display()),
            harbor_exit_code: None,
            signal: Some(Signal::try_from(signal).map_or_else(|_| signal.to_string(), |s| s.as_str().to_string())),
            engine_log_tail: Vec::new(),
        },
        None => {
            refused(format!("the leg's payload exited ({how}) without recording an outcome; see {}", log.display()))
        }
    }
}

pub(crate) fn refused(message: String) -> Outcome {
    Outcome {
        class: OutcomeClass::Spec,
        cause: Some("refused".into()),
        exit_code: OutcomeClass::Spec.exit_code(),
        message,
        harbor_exit_code: None,
        signal: None,
        engine_log_tail: Vec::new(),
    }
}

/// The engine host's spec: the template leg's, its records in the group dir, without a leg's own
/// ledger id or post-run step.
fn host_spec(doc: &SharedJobSpec, template: LaunchSpec) -> Result<LaunchSpec, String> {
    let jobs_dir = doc.group_dir.parent().map(Path::to_path_buf).unwrap_or_default();
    if doc.group_dir.file_name().map(|n| n.to_string_lossy().to_string()).as_deref() != Some(doc.group_tag.as_str()) {
        return Err(format!(
            "field `group_dir`: {} does not end in group_tag {}; regenerate it with `submitter launch`",
            doc.group_dir.display(),
            doc.group_tag
        ));
    }
    Ok(LaunchSpec {
        run_tag: doc.group_tag.clone(),
        run_dir: doc.group_dir.clone(),
        jobs_dir,
        ledger_job_id: None,
        post_run: None,
        ..template
    })
}

/// The host's observations: the engine's, with Harbor's inputs left to each leg.
pub(crate) fn observe_host(spec: &LaunchSpec, env: &[(String, String)]) -> Observed {
    let mut observed = prepare::observe(spec, env, Mode::Run);
    observed.paths = prepare::check_engine_paths(spec);
    observed.resume = false;
    observed.harbor_job = HarborJob::Fresh(Ok(serde_json::Value::Null));
    observed
}

/// Writes a leg's record (its outcome) when the leg's own payload did not: refused, never
/// started, or ended without one. Skipped when another payload holds the leg's run dir.
/// Writes a leg's outcome into its run dir, as the host: with the shared job's Slurm job id, which
/// is the leg's (the submitter folds in only a record that names the attempt's job).
pub(crate) fn record_leg(run_dir: &Path, run_tag: &str, job_id: Option<&str>, outcome: Outcome) {
    if std::fs::create_dir_all(run_dir).is_err() {
        return;
    }
    let Ok(_lock) = crate::runlock::acquire(run_dir) else { return };
    if crate::records::unwritable_record(run_dir).is_some() {
        return;
    }
    let mut rec = Recorder::new(run_dir, run_tag);
    rec.status.slurm_job_id = job_id.map(str::to_string);
    rec.event(outcome.clone());
    rec.set_outcome(outcome);
}

pub(crate) fn read_status(run_dir: &Path) -> Option<RunStatus> {
    let text =
        launch_spec::records::read_regular(&run_dir.join(STATUS_FILE), launch_spec::records::MAX_INPUT_BYTES).ok()?;
    serde_json::from_str(&text).ok()
}

fn leg_ends(host: &Host) -> Vec<(OutcomeClass, i32)> {
    host.legs
        .iter()
        .filter_map(|l| match &l.state {
            LegState::Ended { class, exit_code } => Some((*class, *exit_code)),
            LegState::Refused => Some((OutcomeClass::Spec, OutcomeClass::Spec.exit_code())),
            _ => None,
        })
        .collect()
}

impl<S: SignalSource> Run<S> {
    fn host(&mut self) -> Option<&mut Host> {
        match &mut self.share {
            Share::Host(h) => Some(h),
            _ => None,
        }
    }

    /// One look, every [`SHARE_POLL`]: a leg's cancel request or the host's word that the
    /// engine is gone; the host's legs that ended (and whether all have).
    pub(crate) fn share_input(&mut self, phase: RunPhase) -> Option<Input> {
        match &self.share {
            Share::Leg(a) => {
                if self.spec.run_dir.join(CANCEL_REQUEST_FILE).exists() {
                    return Some(Input::CancelRequested);
                }
                let text = launch_spec::records::read_regular(
                    &a.group_dir.join(ENGINE_ENDED_FILE),
                    launch_spec::records::MAX_INPUT_BYTES,
                )
                .ok()?;
                let ended: EngineEnded = serde_json::from_str(&text).ok()?;
                let f = Failure::new(ended.class, format!("the shared engine is gone: {}", ended.message))
                    .with_log_tail(ended.engine_log_tail);
                Some(Input::EngineLost(match ended.cause {
                    Some(c) => f.with_cause(c),
                    None => f,
                }))
            }
            Share::Host(_) if phase == RunPhase::Running => {
                self.watch_harbors();
                self.collect_legs(None);
                let host = self.host()?;
                let running = host.legs.iter().any(|l| matches!(l.state, LegState::Running { .. }));
                (!running).then_some(Input::LegsEnded)
            }
            _ => None,
        }
    }

    /// The GPU clock's serving time: a leg's Harbor runs from when its `status.json` first says
    /// `running` (read every [`SHARE_POLL`]) until its payload exits.
    fn watch_harbors(&mut self) {
        let Share::Host(host) = &mut self.share else { return };
        for leg in host.legs.iter_mut().filter(|l| matches!(l.state, LegState::Running { .. }) && !l.harbor_running) {
            if read_status(&leg.run_dir).is_some_and(|s| s.phase == Phase::Running) {
                leg.harbor_running = true;
                let tag = leg.run_tag.clone();
                self.rec.gpu(|c, now| c.leg_started(&tag, now));
            }
        }
    }

    /// Records every running leg whose payload has exited; `host_end` is the outcome to give one
    /// that recorded none (the host's, when it ended first).
    fn collect_legs(&mut self, host_end: Option<&Outcome>) {
        let job_id = self.rec.status.slurm_job_id.clone();
        let Share::Host(host) = &mut self.share else { return };
        for leg in &mut host.legs {
            let LegState::Running { index } = leg.state else { continue };
            let Some(status) = self.sup.legs.get_mut(index).and_then(|m| m.try_status()) else { continue };
            let code = status_code(status);
            let own = read_status(&leg.run_dir).and_then(|s| s.outcome);
            let outcome = match own {
                Some(o) => o,
                None => {
                    let o = match host_end {
                        Some(h) => Outcome { message: format!("the shared job's host: {}", h.message), ..h.clone() },
                        None => leg_died(status, &leg.run_dir.join(files::LEG_LOG_FILE)),
                    };
                    record_leg(&leg.run_dir, &leg.run_tag, job_id.as_deref(), o.clone());
                    o
                }
            };
            if std::mem::take(&mut leg.harbor_running) {
                let tag = leg.run_tag.clone();
                self.rec.gpu(|c, now| c.leg_ended(&tag, now));
            }
            self.rec.event(ev::LegEnded {
                run_tag: leg.run_tag.clone(),
                status: supervisor::describe_status(status),
                code,
                class: outcome.class.as_str().to_string(),
                cause: outcome.cause.clone(),
            });
            tracing::info!(run_tag = %leg.run_tag, class = outcome.class.as_str(), "leg ended");
            leg.state = LegState::Ended { class: outcome.class, exit_code: outcome.exit_code };
        }
    }

    /// The engine is ready (and the tunnel up): `engine.json`, then every pending leg.
    pub(crate) fn start_legs(&mut self, p: &Prepared) -> Result<(), End> {
        let engine_pid = self.rec.status.pids.get("engine").copied().unwrap_or_default();
        let record = EngineRecord {
            version: files::SHARED_SPEC_VERSION,
            group_tag: self.spec.run_tag.clone(),
            base_url: p.base_url.clone(),
            port: self.rec.status.port.unwrap_or_default(),
            engine_pid,
            public_url: self.tunnel.as_ref().and_then(crate::tunnel::Tunnel::public_url),
            harbor_env: self.tunnel.as_ref().map(|t| t.harbor_env()).unwrap_or_default(),
            harbor_prefix: self.tunnel.as_ref().and_then(|t| t.harbor_prefix()),
            pool: self.host().and_then(|h| h.pool.as_ref()).map(crate::run::pool_host::PoolHost::provenance),
        };
        let engine_file = self.spec.run_dir.join(ENGINE_FILE);
        let text = serde_json::to_string_pretty(&record).unwrap_or_default();
        launch_spec::records::write_atomically(&engine_file, text.as_bytes()).map_err(|e| {
            Failure::new(OutcomeClass::Spec, format!("cannot write {}: {e}", engine_file.display()))
                .with_cause("shared")
        })?;
        let exe = std::env::current_exe().map_err(|e| {
            Failure::new(OutcomeClass::Spec, format!("cannot find payload's own executable: {e}")).with_cause("shared")
        })?;
        let mut env: BTreeMap<String, String> = self.parent.iter().cloned().collect();
        env.insert(crate::childenv::RUN_ID_VAR.to_string(), format!("{}-{}", self.spec.run_tag, std::process::id()));
        if let Some(key) = &p.api_key {
            env.insert(files::ENGINE_KEY_VAR.to_string(), key.clone());
        }
        let job_id = self.rec.status.slurm_job_id.clone();
        let Share::Host(host) = &mut self.share else { return Ok(()) };
        // A pool starts its current member's legs only (the next ones after the swap).
        let member = host.pool.as_ref().map(|p| p.current);
        if let Some(pool) = &host.pool {
            pool.end.lock().unwrap_or_else(|e| e.into_inner()).started_any = true;
        }
        for leg in host.legs.iter_mut().filter(|l| l.state == LegState::Pending && member.is_none_or(|m| l.member == m))
        {
            let child = ChildSpec {
                program: exe.clone(),
                argv: vec![
                    "payload".into(),
                    "run".into(),
                    "--spec".into(),
                    leg.spec_path.display().to_string(),
                    "--engine".into(),
                    engine_file.display().to_string(),
                ],
                env: env.clone(),
                log: leg.run_dir.join(files::LEG_LOG_FILE),
                cwd: None,
            };
            let started = std::fs::create_dir_all(&leg.run_dir).and_then(|()| self.sup.spawn_leg(&child));
            match started {
                Ok(pid) => {
                    leg.state = LegState::Running { index: self.sup.legs.len() - 1 };
                    self.rec.event(ev::LegSpawned { run_tag: leg.run_tag.clone(), pid, argv: child.argv.clone() });
                    tracing::info!(run_tag = %leg.run_tag, pid, "leg started");
                }
                Err(e) => {
                    let message = format!("cannot start the leg's payload {}: {e}", exe.display());
                    self.rec.event(ev::LegRefused { run_tag: leg.run_tag.clone(), error: message.clone() });
                    record_leg(&leg.run_dir, &leg.run_tag, job_id.as_deref(), refused(message));
                    leg.state = LegState::Refused;
                }
            }
        }
        for leg in host.legs.iter().filter(|l| l.state == LegState::Skipped) {
            self.rec.event(ev::LegSkipped {
                run_tag: leg.run_tag.clone(),
                why: "its Harbor job finished before".to_string(),
            });
        }
        if let Some(t) = self.tunnel.as_mut() {
            t.commit();
        }
        self.rec.set_phase(Phase::Running);
        Ok(())
    }

    /// Before the engine's teardown: every running leg is told (a signal forwarded, or
    /// `engine_ended.json`) and given its own teardown's time; one still alive then is SIGKILLed.
    pub(crate) async fn wind_down_legs(&mut self, end: &End, plan: &TeardownGrace) {
        let running: Vec<usize> = match &self.share {
            Share::Host(h) => h
                .legs
                .iter()
                .filter_map(|l| if let LegState::Running { index } = l.state { Some(index) } else { None })
                .collect(),
            _ => return,
        };
        if running.is_empty() {
            return;
        }
        let margin = Duration::from_secs(2) + SHARE_POLL * 4;
        let budget = match end {
            End::Signal(SignalEvent::Walltime) => {
                self.forward_once(&running, Signal::SIGUSR1).await;
                plan.harbor_grace + plan.grace + margin
            }
            End::Signal(SignalEvent::Shutdown(sig)) => {
                self.forward_once(&running, *sig).await;
                plan.grace + margin
            }
            End::Failed(f) => {
                let ended = EngineEnded {
                    class: f.class,
                    cause: f.cause.clone(),
                    message: f.message.clone(),
                    engine_log_tail: f.engine_log_tail.clone(),
                };
                let path = self.spec.run_dir.join(ENGINE_ENDED_FILE);
                let text = serde_json::to_string_pretty(&ended).unwrap_or_default();
                if let Err(e) = launch_spec::records::write_atomically(&path, text.as_bytes()) {
                    tracing::warn!(error = %e, "cannot write engine_ended.json; the legs are stopped by TERM");
                    self.forward(&running, Signal::SIGTERM);
                }
                plan.grace + margin
            }
            _ => plan.grace + margin,
        };
        let deadline = crate::timings::deadline(Instant::now(), budget);
        loop {
            let alive: Vec<usize> = running
                .iter()
                .copied()
                .filter(|i| self.sup.legs.get_mut(*i).is_some_and(|m| m.try_status().is_none()))
                .collect();
            if alive.is_empty() || Instant::now() >= deadline {
                for i in &alive {
                    if let Some(m) = self.sup.legs.get(*i) {
                        tracing::warn!(pid = m.pid, "leg still running after its wind-down: SIGKILL");
                        m.signal_group(Signal::SIGKILL);
                    }
                }
                for i in &alive {
                    if let Some(m) = self.sup.legs.get_mut(*i) {
                        let _ = tokio::time::timeout(Duration::from_secs(2), m.wait()).await;
                    }
                }
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                ev = self.signals.recv() => {
                    // Another signal during the wind-down: the legs get it too (a second TERM
                    // makes each kill at once).
                    let sig = match ev { SignalEvent::Walltime => Signal::SIGUSR1, SignalEvent::Shutdown(s) => s };
                    self.forward(&alive, sig);
                }
            }
        }
    }

    /// The host's signal, to each leg that did not get it itself: Slurm signals every process of
    /// the job at once (scancel, the time limit's TERM), and a second TERM makes a leg kill its
    /// Harbor at once. A leg that has begun its teardown within [`crate::run::SIGNAL_WITH_EXIT`]
    /// (status `stopping` or `done`) had it already.
    async fn forward_once(&self, legs: &[usize], sig: Signal) {
        tokio::time::sleep(crate::run::SIGNAL_WITH_EXIT).await;
        let Share::Host(host) = &self.share else { return };
        let unsignalled: Vec<usize> = host
            .legs
            .iter()
            .filter_map(|l| match l.state {
                LegState::Running { index } if legs.contains(&index) => {
                    let phase = read_status(&l.run_dir).map(|s| s.phase);
                    (!matches!(phase, Some(Phase::Stopping | Phase::Done))).then_some(index)
                }
                _ => None,
            })
            .collect();
        self.forward(&unsignalled, sig);
    }

    fn forward(&self, legs: &[usize], sig: Signal) {
        for i in legs {
            if let Some(m) = self.sup.legs.get(*i) {
                tracing::info!(pid = m.pid, signal = %sig, "forwarding to leg");
                m.signal_group(sig);
            }
        }
    }

    /// The host's outcome: its own when the engine failed or a signal came (each leg records
    /// the same class), else the most severe of its legs' ([`exit_code`]); legs it never started
    /// get the host's outcome in their records.
    pub(crate) fn host_outcome(&mut self, own: Outcome) -> Outcome {
        self.collect_legs(Some(&own));
        let job_id = self.rec.status.slurm_job_id.clone();
        let Share::Host(host) = &mut self.share else { return own };
        // A pool's legs not started keep no record: the submitter continues them (launch_spec::pool).
        let pool = host.pool.is_some();
        for leg in host.legs.iter_mut().filter(|l| l.state == LegState::Pending && !pool) {
            let o = Outcome {
                message: format!("the shared job ended before this leg started: {}", own.message),
                ..own.clone()
            };
            record_leg(&leg.run_dir, &leg.run_tag, job_id.as_deref(), o);
            leg.state = LegState::Ended { class: own.class, exit_code: own.exit_code };
        }
        let summary: Vec<String> = host
            .legs
            .iter()
            .map(|l| {
                let what = match &l.state {
                    LegState::Ended { class, .. } => class.as_str(),
                    LegState::Skipped => "already finished",
                    LegState::Refused => "refused",
                    LegState::Pending | LegState::Running { .. } => "unknown",
                };
                format!("{} {what}", l.run_tag)
            })
            .collect();
        let ends = leg_ends(host);
        if own.class != OutcomeClass::Finished {
            return Outcome { message: format!("{}; legs: {}", own.message, summary.join(", ")), ..own };
        }
        let code = exit_code(&ends);
        let class =
            ends.iter().find(|(_, c)| *c == code && code != 0).map_or(OutcomeClass::Finished, |(class, _)| *class);
        Outcome {
            class,
            cause: (class != OutcomeClass::Finished).then(|| "legs".to_string()),
            exit_code: code,
            message: format!("{} legs: {}", host.legs.len(), summary.join(", ")),
            ..own
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_exits_with_its_most_severe_leg() {
        assert_eq!(exit_code(&[]), 0);
        assert_eq!(exit_code(&[(OutcomeClass::Finished, 0), (OutcomeClass::Finished, 0)]), 0);
        assert_eq!(exit_code(&[(OutcomeClass::Finished, 0), (OutcomeClass::Spec, 2), (OutcomeClass::Harbor, 14)]), 14);
        assert_eq!(exit_code(&[(OutcomeClass::Interrupted, 130), (OutcomeClass::Walltime, 15)]), 15);
        assert_eq!(exit_code(&[(OutcomeClass::Walltime, 15), (OutcomeClass::EngineDied, 12)]), 12);
    }
}
