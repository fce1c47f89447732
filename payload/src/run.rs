//! `payload run --spec FILE`: executes the one preparation (crate::prepare) that `payload plan`
//! renders, in the sequence of docs/design.md §6.2:
//!
//! 1. signals + subreaper, read and validate the spec, lock the run dir, status `preparing`;
//! 2. observe (secrets file, GPUs, port, the run dir) and prepare: every child's program, argv
//!    and environment; the first problem ends the run before anything is spawned;
//! 3. the tunnel, if any, is prepared (its first poll spawns ssh);
//! 4. vLLM's head process in its own group (`serving`), logging to `vllm.log`;
//! 5. the run loop (crate::phases decides, this module does): readiness probes, Harbor's
//!    `--print-config` check, the tunnel's state machine, then Harbor in its own group
//!    (`running`, the tunnel's public URL as `api_base` for installed agents, resume rewrites
//!    first), the health watchdog and heartbeats, until Harbor exits, a fault or a signal;
//! 6. teardown (`stopping`); after Harbor exited 0, the optional post-run step (crate::postrun),
//!    which never changes the outcome; the outcome (`done`, crate::phases::outcome); exit code.

pub mod pool;
pub(crate) mod pool_host;
pub mod shared;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use launch_spec::records::{ENGINE_LOG, HARBOR_LOG, Phase, SPEC_FILE, TUNNEL_LOG};
use launch_spec::rundir::events as ev;
use launch_spec::{LaunchSpec, OutcomeClass};
use tokio::task::JoinHandle;
use tokio::time::{MissedTickBehavior, interval, sleep_until};

use crate::engine::{self, ProbeEvent, Watchdog};
use crate::failure::Failure;
use crate::harbor::{self, ConfigCheck};
use crate::phases::{self, Action, End, Input, Machine, RunPhase};
use crate::prepare::{self, HarborMode, Mode, Prepared};
use crate::provenance;
use crate::records::{HeartbeatState, Recorder, rotate_log};
use crate::runlock;
use crate::supervisor::{self, Role, SignalEvent, SignalSource, Signals, Supervisor, status_code, wait_opt};
use crate::timings::{self, Timings};
use crate::tunnel::{self, Tunnel};

/// Lines of `vllm.log` kept in an engine failure's outcome.
pub(crate) const LOG_TAIL_LINES: usize = 30;
/// How long a child's exit that a signal may explain waits for payload's own signal (scancel
/// signals every process of the job at once; a secondary's death reaches the head before it).
pub(crate) const SIGNAL_WITH_EXIT: Duration = Duration::from_millis(500);
/// How often the tunnel's state machine is advanced.
pub(crate) const TUNNEL_POLL: Duration = Duration::from_millis(200);

/// A task aborted when its handle is dropped: the loop ends at several points, and Harbor's
/// `--print-config` child must not outlive it (the task owns it with `kill_on_drop`).
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What this payload is in a shared job (crate::run::shared): a per-leg job's `payload run --spec`,
/// a shared job's engine host, or one of its legs using the host's engine.
pub(crate) enum Share {
    Single,
    Host(crate::run::shared::Host),
    Leg(prepare::Attached),
}

pub(crate) struct Run<S> {
    pub(crate) spec: LaunchSpec,
    spec_path: PathBuf,
    pub(crate) rec: Recorder,
    pub(crate) signals: S,
    pub(crate) sup: Supervisor,
    pub(crate) parent: Vec<(String, String)>,
    heartbeat: HeartbeatState,
    pub(crate) tunnel: Option<Tunnel>,
    pub(crate) timings: Timings,
    /// The post-run step, prepared with the other children (crate::postrun).
    post_run: Option<Result<crate::postrun::Step, String>>,
    /// The job's scratch dir on node-local disk (crate::scratch), removed after teardown.
    scratch: Option<crate::scratch::JobScratch>,
    /// The programs' `--version` and the dataset's digest, asked while the engine loads (crate::provenance).
    versions: Option<AbortOnDrop<provenance::Versions>>,
    /// Their answers, once in (checked by [`Run::accept_versions`]), for the provenance record.
    answered: Option<provenance::Versions>,
    /// How long the last server-identity check took (`engine_ready`'s `identity_check_ms`).
    identity_ms: f64,
    pub(crate) share: Share,
}

/// What every `payload run` does first, before anything can be spawned: the signal handlers, and
/// the child-subreaper bit so double-forked descendants stay ours. Err: the exit code.
pub(crate) fn start_supervising() -> Result<Signals, i32> {
    let signals = Signals::register().map_err(|err| {
        tracing::error!(error = %err, "cannot register signal handlers");
        OutcomeClass::Spec.exit_code()
    })?;
    if let Err(err) = supervisor::become_subreaper() {
        tracing::warn!(error = %err, "cannot become child subreaper; double-forked orphans may escape");
    }
    Ok(signals)
}

/// Runs the job; returns payload's exit code.
pub async fn run(spec_path: &Path) -> i32 {
    let signals = match start_supervising() {
        Ok(s) => s,
        Err(code) => return code,
    };
    run_with(spec_path, signals, prepare::parent_env()).await
}

/// The run with its signal source and payload's environment handed in: `run` passes the real
/// signal streams and its own environment; tests pass signals they send themselves
/// ([`supervisor::ChannelSignals`]) or none ([`supervisor::NoSignals`]).
pub async fn run_with<S: SignalSource>(spec_path: &Path, signals: S, parent: Vec<(String, String)>) -> i32 {
    let payload_start = Instant::now();
    let spec = match LaunchSpec::from_file(spec_path) {
        Ok(spec) => spec,
        Err(err) => {
            tracing::error!(class = "spec", error = %err, "bad launch spec");
            return OutcomeClass::Spec.exit_code();
        }
    };
    run_spec(spec_path, spec, signals, parent, Share::Single, payload_start).await
}

/// The run of a read spec: a per-leg job, a shared job's engine host (its spec made from the
/// legs', crate::run::shared) or one of its legs.
pub(crate) async fn run_spec<S: SignalSource>(
    spec_path: &Path,
    spec: LaunchSpec,
    signals: S,
    parent: Vec<(String, String)>,
    share: Share,
    payload_start: Instant,
) -> i32 {
    run_spec_share(spec_path, spec, signals, parent, share, payload_start).await.0
}

/// One engine start of a pool (crate::run::pool): the host's run, its legs' states handed back.
pub(crate) async fn run_spec_host<S: SignalSource>(
    spec_path: &Path,
    spec: LaunchSpec,
    signals: S,
    parent: Vec<(String, String)>,
    host: crate::run::shared::Host,
    payload_start: Instant,
) -> (i32, crate::run::shared::Host) {
    let group_dir = host.group_dir.clone();
    match run_spec_share(spec_path, spec, signals, parent, Share::Host(host), payload_start).await {
        (code, Some(Share::Host(host))) => (code, host),
        // Not reached: the share given is the share handed back.
        (code, _) => (code, crate::run::shared::Host { legs: Vec::new(), group_dir, pool: None }),
    }
}

/// [`run_spec`], its share handed back (`None` when the run ended before it was made).
async fn run_spec_share<S: SignalSource>(
    spec_path: &Path,
    spec: LaunchSpec,
    signals: S,
    parent: Vec<(String, String)>,
    share: Share,
    payload_start: Instant,
) -> (i32, Option<Share>) {
    // Every duration checked before anything is spawned (or written).
    let timings = match timings::check(spec_path, &spec) {
        Ok(t) => t,
        Err(f) => {
            tracing::error!(class = "spec", error = %f.message, "bad launch spec");
            return (OutcomeClass::Spec.exit_code(), Some(share));
        }
    };
    if let Err(err) = std::fs::create_dir_all(&spec.run_dir) {
        tracing::error!(class = "spec", run_dir = %spec.run_dir.display(), error = %err, "cannot create run dir");
        return (OutcomeClass::Spec.exit_code(), Some(share));
    }
    // Held until payload exits: a second payload on this run dir stops here, changing nothing.
    let _lock = match runlock::acquire(&spec.run_dir) {
        Ok(lock) => lock,
        Err(err @ runlock::LockError::Busy { .. }) => {
            tracing::error!(class = "run_dir_busy", error = %err, "run dir in use");
            return (runlock::EXIT_RUN_DIR_BUSY, Some(share));
        }
        Err(err) => {
            tracing::error!(class = "spec", error = %err, "cannot lock the run dir");
            return (OutcomeClass::Spec.exit_code(), Some(share));
        }
    };
    // Before the first record: appending to a FIFO planted as events.jsonl would block.
    if let Some(problem) = crate::records::unwritable_record(&spec.run_dir) {
        tracing::error!(class = "spec", error = %problem, "unusable run dir");
        return (OutcomeClass::Spec.exit_code(), Some(share));
    }
    let mut rec = Recorder::new(&spec.run_dir, &spec.run_tag);
    rec.reserve_space();
    // A leg of a shared job carries no GPU time: its host's record has it (launch_spec::shared).
    if !matches!(share, Share::Leg(_)) {
        rec.gpu_clock = Some(crate::gputime::GpuClock::new(payload_start));
    }
    let mut run = Run {
        spec,
        spec_path: spec_path.to_path_buf(),
        rec,
        signals,
        sup: Supervisor::new(),
        parent,
        heartbeat: HeartbeatState::default(),
        tunnel: None,
        timings,
        post_run: None,
        scratch: None,
        versions: None,
        answered: None,
        identity_ms: 0.0,
        share,
    };
    let end = run.sequence().await;
    let code = run.finish(end).await;
    (code, Some(run.share))
}

impl<S: SignalSource> Run<S> {
    fn log_path(&self, name: &str) -> PathBuf {
        self.spec.run_dir.join(name)
    }

    /// `vllm.log`: in the run dir, or for a leg of a shared job in the engine host's group dir.
    fn engine_log(&self) -> PathBuf {
        match &self.share {
            Share::Leg(a) => a.group_dir.join(ENGINE_LOG),
            _ => self.log_path(ENGINE_LOG),
        }
    }

    fn is_host(&self) -> bool {
        matches!(self.share, Share::Host(_))
    }

    fn is_leg(&self) -> bool {
        matches!(self.share, Share::Leg(_))
    }

    /// A signal already delivered (checked before each spawn).
    async fn pending_signal(&mut self) -> Option<SignalEvent> {
        tokio::select! {
            biased;
            ev = self.signals.recv() => Some(ev),
            _ = std::future::ready(()) => None,
        }
    }

    /// The records every run starts with.
    fn record_start(&mut self) {
        let env_fn = prepare::lookup(&self.parent);
        // The copy is replaced atomically (never written through a symlink planted as launch.json).
        let spec_copy = self.spec.run_dir.join(SPEC_FILE);
        // A shared job's host has no launch spec of its own (its `shared.json` names the legs').
        let same =
            self.is_host() || std::fs::canonicalize(&self.spec_path).ok() == std::fs::canonicalize(&spec_copy).ok();
        if !same
            && let Err(err) = launch_spec::records::read_regular(&self.spec_path, launch_spec::records::MAX_INPUT_BYTES)
                .and_then(|text| launch_spec::records::write_atomically(&spec_copy, text.as_bytes()))
        {
            tracing::warn!(error = %err, "cannot copy the spec to launch.json");
        }
        self.rec.status.slurm_job_id = env_fn("SLURM_JOB_ID");
        self.rec.status.node = prepare::node_name(&env_fn);
        self.rec.status.pids.insert("payload".into(), std::process::id());
        self.rec.write_status();
        self.rec.event(ev::Started {
            spec: self.spec_path.clone(),
            pid: std::process::id(),
            payload_version: env!("CARGO_PKG_VERSION").to_string(),
            slurm_job_id: self.rec.status.slurm_job_id.clone(),
            node: self.rec.status.node.clone(),
        });
        tracing::info!(run_tag = %self.spec.run_tag, run_dir = %self.spec.run_dir.display(), "payload run starting");
        if self.spec.limits.teardown_grace_s >= 30.0 {
            tracing::warn!(
                teardown_grace_s = self.spec.limits.teardown_grace_s,
                "limits.teardown_grace_s does not fit inside Slurm's default KillWait (30 s): SIGKILL may hit payload before its sweep"
            );
        }
    }

    /// What the preparation decided, recorded; its first problem ends the run.
    fn record_prepared(&mut self, p: &Prepared) -> Result<(), End> {
        for w in p.harbor.warnings.iter().chain(&p.warnings) {
            tracing::warn!(warning = %w, "preparation");
        }
        if p.secrets.status == "ok" || p.secrets.status == "not needed" {
            self.rec.event(ev::SecretsLoaded {
                file: p.loaded.path().to_path_buf(),
                names: p.secrets.names.clone(),
                daytona_org: p.harbor.daytona_org.map(|o| o.as_str().to_string()),
            });
        }
        if let Some(d) = &p.gpu.decision {
            self.rec.status.gpu = Some(d.choice());
            let gpus = d.count * self.spec.serve.nodes.max(1);
            self.rec.gpu(|c, _| c.set_gpus(gpus));
            self.rec.event(d.clone());
            tracing::info!(profile = %d.choice().profile, count = d.count, util = d.gpu_memory_utilization, source = %d.source, "GPU profile chosen");
        }
        if let Some(port) = p.port.port {
            self.rec.status.port = Some(port);
            self.rec.event(ev::Port { port, how: p.port.how.clone() });
        }
        match p.problems.first() {
            Some(f) => Err(End::Failed(f.clone())),
            None => Ok(()),
        }
    }

    async fn sequence(&mut self) -> End {
        self.record_start();
        let observed = match &self.share {
            Share::Leg(a) => prepare::observe_attached(&self.spec, &self.parent, a.clone()),
            Share::Host(_) => crate::run::shared::observe_host(&self.spec, &self.parent),
            Share::Single => prepare::observe(&self.spec, &self.parent, Mode::Run),
        };
        let prepared = prepare::prepare(&self.spec_path, &self.spec, &self.parent, observed, Mode::Run);
        match self.execute(prepared).await {
            Ok(end) | Err(end) => end,
        }
    }

    async fn execute(&mut self, mut p: Prepared) -> Result<End, End> {
        // From here on no record holds a secret, whatever a child prints into a log tail.
        self.rec.redact(p.loaded.values().chain(p.api_key.as_deref()));
        self.record_prepared(&p)?;
        self.post_run = p.post_run.take();
        self.make_scratch(&p)?;
        let Some(port) = p.port.port else {
            return Err(Failure::new(OutcomeClass::EngineStart, p.port.how.clone()).with_cause("port").into());
        };
        self.set_up_tunnel(&p, port)?;
        self.pool_amend_engine(&mut p);
        let started = self.start_engine(&p, port).await?;
        let resume = p.harbor.mode == HarborMode::Resume;
        self.rec.status.resume = Some(resume);
        let config_check = self.start_config_check(&p)?;
        self.run_loop(&p, started, config_check).await
    }

    /// The job's scratch dir on node-local disk: the host (or a single run) creates it and owns its
    /// removal; a leg only makes its own dirs inside it.
    fn make_scratch(&mut self, p: &Prepared) -> Result<(), End> {
        if let (Some((_, inside)), true) = (&p.scratch, self.is_leg()) {
            for dir in inside {
                std::fs::create_dir_all(dir)
                    .map_err(|e| Failure::new(OutcomeClass::Spec, format!("cannot create {}: {e}", dir.display())))?;
            }
        } else if let Some((dir, inside)) = &p.scratch {
            let scratch = crate::scratch::JobScratch::create(dir, inside)
                .map_err(|e| Failure::new(OutcomeClass::Spec, e).with_cause("scratch"))?;
            self.rec.event(ev::Scratch { dir: scratch.dir().to_path_buf() });
            self.scratch = Some(scratch);
        }
        Ok(())
    }

    /// The tunnel, set up (started by the first poll, while vLLM loads); a leg uses the host's.
    fn set_up_tunnel(&mut self, p: &Prepared, port: u16) -> Result<(), End> {
        let parent = self.parent.clone();
        let env_fn = prepare::lookup(&parent);
        if let Some(programs) = p.tunnel.programs.clone().filter(|_| !self.is_leg()) {
            let job_id = crate::ports::job_id(&env_fn);
            self.tunnel = Tunnel::new(tunnel::Start {
                spec: &self.spec.tunnel,
                programs,
                secrets: &p.loaded,
                run_dir: &self.spec.run_dir,
                run_tag: &self.spec.run_tag,
                job_id: &job_id,
                slurm_job_id: env_fn("SLURM_JOB_ID"),
                node: prepare::node_name(&env_fn).unwrap_or_else(|| "unknown".into()),
                engine_host: &self.spec.serve.host,
                engine_port: port,
                served_name: &self.spec.model.served_name,
                api_key: p.api_key.clone(),
                child_env: p.tunnel.env.clone(),
                tmp_root: env_fn("TMPDIR")
                    .filter(|t| !t.is_empty())
                    .map(PathBuf::from)
                    .unwrap_or_else(std::env::temp_dir),
            })?;
            if let Some(t) = &self.tunnel {
                self.rec.event(ev::TunnelPrepared { kind: t.kind().to_string(), socks_port: t.socks_port() });
            }
        }
        Ok(())
    }

    /// vLLM started (or a leg's shared engine taken), with its ranks on other nodes, after the
    /// versions the environments answer at once agree with the spec; phase `serving`. Returns when
    /// it started (the readiness deadline counts from there).
    async fn start_engine(&mut self, p: &Prepared, port: u16) -> Result<Instant, End> {
        if let Some(ev) = self.pending_signal().await {
            return Err(End::Signal(ev));
        }
        if !self.is_leg() {
            rotate_log(&self.log_path(ENGINE_LOG));
            rotate_log(&self.log_path(TUNNEL_LOG));
        }
        rotate_log(&self.log_path(HARBOR_LOG));
        // The head serves the API here; a multi-node engine's workers (`Prepared.engines` after the
        // head) start on their nodes through one srun step (crate::multinode).
        let head = p.head().child.clone();
        // The versions the environments hold, where their package metadata answers at once: a
        // disagreement with what the spec was built for ends the run before the engine loads with
        // an argv built for another vLLM (docs/real-programs.md, "Asked, not trusted").
        let harbor_child = p.harbor.child(&self.spec, &p.local_api_base(), &BTreeMap::new(), None).ok();
        let early = match &harbor_child {
            Some(harbor) => provenance::ask_fast(&head, harbor).await,
            None => provenance::Early::default(),
        };
        let answered = |r: &Option<Result<String, String>>| r.clone().and_then(Result::ok);
        self.refuse_disagreement(answered(&early.vllm).as_deref(), answered(&early.harbor).as_deref())?;
        let started = Instant::now();
        if let Share::Leg(a) = &self.share {
            self.rec.event(ev::SharedEngine {
                group_tag: a.engine.group_tag.clone(),
                base_url: a.engine.base_url.clone(),
                engine_pid: a.engine.engine_pid,
                public_url: a.engine.public_url.clone(),
            });
        } else {
            let pid = self.sup.spawn(Role::Engine, &head).map_err(|e| {
                Failure::new(OutcomeClass::EngineStart, format!("cannot start {}: {e}", head.program.display()))
                    .with_cause("spawn")
            })?;
            self.rec.gpu(|c, _| c.engine_spawned(started));
            self.rec.status.pids.insert("engine".into(), pid);
            self.rec.event(ev::EngineSpawned { pid, argv: head.argv.clone(), port });
        }
        if let Some(secondaries) = &p.secondaries {
            self.start_ranks(secondaries)?;
        }
        // The rest of the versions, while the engine loads (it costs nothing then): checked as
        // soon as they answer, and before Harbor starts at the latest — by each leg of a shared
        // job, not by its host.
        if let Some(harbor) = harbor_child
            && !self.is_host()
        {
            let engine = head.clone();
            let dataset = self.spec.harbor.dataset.clone();
            self.versions = Some(AbortOnDrop(tokio::spawn(async move {
                provenance::probe_versions(&engine, &harbor, dataset, early).await
            })));
        }
        self.rec.set_phase(Phase::Serving);
        tracing::info!(
            port,
            shared_engine = self.is_leg(),
            "vLLM started (or the shared engine used); waiting for readiness"
        );
        Ok(started)
    }

    /// Harbor's own `--print-config` on the fresh-run argv, while vLLM loads (it costs nothing
    /// then): a refusal ends the run before Harbor would start and fail.
    fn start_config_check(&self, p: &Prepared) -> Result<Option<AbortOnDrop<ConfigCheck>>, End> {
        let Some(config) = p.harbor.merged_config.as_ref().filter(|_| !self.is_host()) else { return Ok(None) };
        harbor::write_job_config(&p.harbor.config_path, config).map_err(Failure::from)?;
        let child = p.harbor.child(&self.spec, &p.local_api_base(), &BTreeMap::new(), None).map_err(Failure::from)?;
        let spec = self.spec.clone();
        Ok(Some(AbortOnDrop(tokio::spawn(async move {
            harbor::check_with_print_config(&spec, &child.argv, &child.env).await
        }))))
    }

    /// The one event loop: inputs from children, signals, probes, the tunnel and the clock, decided
    /// by [`Machine`], until the run ends.
    async fn run_loop(
        &mut self,
        p: &Prepared,
        started: Instant,
        mut config_check: Option<AbortOnDrop<ConfigCheck>>,
    ) -> Result<End, End> {
        let engine_log = self.engine_log();
        let tail = || engine::log_tail(&engine_log, LOG_TAIL_LINES);
        let mut machine = self.machine(config_check.is_some());
        let mut watchdog = Watchdog::readiness(
            &p.base_url,
            &self.spec.model.served_name,
            self.spec.serve.ready_needs_completion,
            p.api_key.as_deref(),
        );
        let deadline = timings::deadline(started, self.timings.health_timeout);
        // The budget below the cap (crate::phases decides what its passing means).
        let budget_at = machine.budget_pending().map_or(deadline, |b| timings::deadline(started, b));
        self.record_readiness_rule();
        let log_bytes = || std::fs::metadata(&engine_log).map_or(0, |m| m.len());
        let mut heartbeat = interval(self.timings.heartbeat);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut tunnel_tick = interval(TUNNEL_POLL);
        tunnel_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let has_tunnel = self.tunnel.is_some();
        let port = self.rec.status.port.unwrap_or_default();
        let mut foreign_seen = false;
        let mut versions = self.versions.take();
        // A shared job: the host watches its legs, a leg its cancel request and the host's word.
        let mut share_tick = interval(crate::run::shared::SHARE_POLL);
        share_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let shared = !matches!(self.share, Share::Single);
        loop {
            let loading = machine.phase() == RunPhase::Loading;
            // A `/metrics` reading's completions, for the heartbeat written once the machine has
            // judged the reading's engine counters.
            let mut beat: Option<Option<crate::records::Completions>> = None;
            let input = tokio::select! {
                biased;
                status = wait_opt(self.sup.engine.as_mut()) => Input::EngineExited(status),
                status = wait_opt(self.sup.ranks.as_mut()) => Input::RanksExited(status),
                status = wait_opt(self.sup.harbor.as_mut()) => Input::HarborExited(status),
                ev = self.signals.recv() => Input::Signal(ev),
                _ = sleep_until(deadline.into()), if machine.awaiting_readiness() => Input::ReadyDeadline,
                v = async { (&mut versions.as_mut().expect("guarded").0).await }, if versions.is_some() => {
                    versions = None;
                    self.accept_versions(v.map_err(|e| e.to_string()))?;
                    continue;
                }
                _ = sleep_until(budget_at.into()), if machine.budget_pending().is_some() => {
                    Input::BudgetPassed(Instant::now(), log_bytes())
                }
                v = async { (&mut config_check.as_mut().expect("guarded").0).await }, if config_check.is_some() => {
                    config_check = None;
                    Input::ConfigChecked(v.unwrap_or_else(|e| ConfigCheck::Skipped(format!("check task failed: {e}"))))
                }
                ev = watchdog.next(), if machine.probing() => match ev {
                    ProbeEvent::Readiness(r) => Input::Readiness(self.identify(r, port, &mut foreign_seen)),
                    ProbeEvent::Health(ok) => Input::Health(ok),
                    ProbeEvent::Metrics(reading) => {
                        self.sup.reap_orphans();
                        beat = Some(reading.completions);
                        match reading.engine {
                            Some(sample) => Input::Metrics(Instant::now(), sample),
                            None => {
                                self.heartbeat.engine = None;
                                self.write_heartbeat(reading.completions, machine.probes());
                                continue;
                            }
                        }
                    }
                },
                _ = heartbeat.tick() => {
                    if machine.phase() == RunPhase::Running {
                        watchdog.fetch_metrics();
                    } else {
                        self.write_heartbeat(None, machine.probes());
                    }
                    if !machine.awaiting_readiness() {
                        continue;
                    }
                    // Loading's progress is vllm.log growing (weights shards, compile, graph capture all log).
                    Input::LoadProgress(Instant::now(), log_bytes())
                }
                _ = share_tick.tick(), if shared => match self.share_input(machine.phase()) {
                    // A pool: the member's legs have all ended; the next one is swapped in.
                    Some(Input::LegsEnded) if let Some(next) = self.pool_next() => {
                        if self.pool_swap(p, next).await {
                            self.start_legs(p)?;
                            continue;
                        }
                        Input::LegsEnded
                    }
                    Some(input) => input,
                    None => continue,
                },
                _ = tunnel_tick.tick(), if has_tunnel => {
                    let Some(t) = self.tunnel.as_mut() else { continue };
                    Input::Tunnel(t.poll(&mut self.sup, &mut self.rec, !loading).await)
                }
            };
            let input = self.with_explaining_signal(input, p.secondaries.is_some()).await;
            // A multi-node engine: the other nodes' logs (and srun's) after the head's, since
            // either side may be where it broke.
            let all_tail = || {
                let mut lines = tail();
                lines.extend(crate::multinode::ranks_log_tail(
                    &self.spec.run_dir,
                    p.secondaries.as_ref(),
                    LOG_TAIL_LINES,
                ));
                lines
            };
            let tail_of: &dyn Fn() -> Vec<String> = if p.secondaries.is_some() { &all_tail } else { &tail };
            let before = machine.phase();
            let actions = machine.on(input, tail_of);
            if let Some(completions) = beat {
                self.heartbeat.engine = machine.engine_counters().cloned();
                self.write_heartbeat(completions, machine.probes());
            }
            for action in actions {
                if let Some(end) = self.act(action, p, started, &mut machine, &mut watchdog, &mut versions).await? {
                    return Ok(end);
                }
            }
            // The tunnel's end-to-end check starts at once, not at the next tick.
            if before == RunPhase::Loading && machine.phase() == RunPhase::TunnelCheck {
                tunnel_tick.reset_immediately();
            }
        }
    }

    /// The run's decisions for this spec: tunnel, config check, health and liveness rules.
    fn machine(&self, config_pending: bool) -> Machine {
        Machine::new(
            self.tunnel.is_some(),
            config_pending,
            self.spec.limits.health_failures,
            self.spec.serve.health_timeout_s,
        )
        .with_hang_after(self.timings.hang_after)
        .with_load_stall_after(self.timings.load_stall_after)
        .with_ready_budget(self.timings.ready_budget)
    }

    /// The readiness rule the run waits under, into `status.json` (`readiness`).
    fn record_readiness_rule(&mut self) {
        let serve = &self.spec.serve;
        self.rec.status.readiness = Some(launch_spec::records::ReadinessRecord {
            deadline_s: serve.ready_deadline_s(),
            cap_s: serve.health_timeout_s,
            load_stall_after_s: serve.load_stall_after_s,
            budget: serve.ready_budget.clone(),
            budget_exceeded: false,
        });
        self.rec.write_status();
    }

    /// Slurm signals every process of the job at once (scancel): a child that stopped as a
    /// signalled child does, or any rank of a multi-node engine, may exit just before payload's own
    /// signal is read. A signal arriving with such an exit is the cause.
    async fn with_explaining_signal(&mut self, input: Input, multinode: bool) -> Input {
        let signal_may_explain = match &input {
            Input::EngineExited(st) | Input::RanksExited(st) => multinode || st.success() || stopped_by_a_signal(st),
            Input::HarborExited(st) => stopped_by_a_signal(st),
            _ => false,
        };
        match signal_may_explain {
            true => match tokio::time::timeout(SIGNAL_WITH_EXIT, self.signals.recv()).await {
                Ok(ev) => Input::Signal(ev),
                Err(_) => input,
            },
            false => input,
        }
    }

    /// One of the machine's actions, done; `Some` when the run ends with it.
    async fn act(
        &mut self,
        action: Action,
        p: &Prepared,
        started: Instant,
        machine: &mut Machine,
        watchdog: &mut Watchdog,
        versions: &mut Option<AbortOnDrop<provenance::Versions>>,
    ) -> Result<Option<End>, End> {
        match action {
            Action::Event(body) => self.rec.event(body),
            Action::Ready => self.record_ready(p, started),
            Action::BudgetExceeded => {
                if let Some(r) = self.rec.status.readiness.as_mut() {
                    r.budget_exceeded = true;
                }
                self.rec.write_status();
                tracing::warn!("ready budget passed with the load progressing; waiting on to the cap");
            }
            Action::StartHarbor if self.is_host() => {
                if !self.pool_begin(p).await? {
                    return Ok(Some(End::LegsEnded));
                }
                self.start_legs(p)?;
                machine.harbor_started();
                self.write_heartbeat(None, machine.probes());
                watchdog.watch_health(self.timings.probe_interval);
            }
            Action::StartHarbor => {
                // Asked since the engine started, so normally done; never holds Harbor long.
                if let Some(mut task) = versions.take() {
                    let answer = match tokio::time::timeout(provenance::RECORD_WAIT, &mut task.0).await {
                        Ok(answer) => answer.map_err(|e| e.to_string()),
                        Err(_) => Err(format!("not answered within {:?} of readiness", provenance::RECORD_WAIT)),
                    };
                    self.accept_versions(answer)?;
                }
                self.start_harbor(p).await?;
                machine.harbor_started();
                // Phase and heartbeat in one write: status.json never shows Harbor running beside
                // the loading-time heartbeat (not yet probed for health).
                self.rec.status.heartbeat =
                    Some(self.heartbeat.next(None, &self.engine_log(), &self.spec.run_dir, machine.probes()));
                self.rec.set_phase(Phase::Running);
                tracing::info!(
                    pid = self.rec.status.pids.get("harbor").copied().unwrap_or_default(),
                    resume = p.harbor.mode == HarborMode::Resume,
                    "Harbor started"
                );
                watchdog.watch_health(self.timings.probe_interval);
            }
            Action::End(end) => {
                // Harbor's end is a phase change too: its heartbeat carries the probe's last state.
                if machine.phase() != RunPhase::Loading {
                    self.write_heartbeat(None, machine.probes());
                }
                if let End::HarborExited(status) = &end {
                    let tag = self.spec.run_tag.clone();
                    self.rec.gpu(|c, now| c.leg_ended(&tag, now));
                    tracing::info!(status = %supervisor::describe_status(*status), "Harbor exited");
                }
                return Ok(Some(end));
            }
        }
        Ok(None)
    }

    /// vLLM ready: the ranks that joined, `engine_ready` (with the ready budget kept or not), phase `ready`.
    fn record_ready(&mut self, p: &Prepared, started: Instant) {
        if let Some(s) = &p.secondaries {
            self.record_ranks_joined(s);
        }
        let ms = started.elapsed().as_millis() as u64;
        let identity_ms = (self.identity_ms * 100.0).round() / 100.0;
        self.rec.gpu(|c, now| c.engine_ready(now));
        let budget_ms = self.spec.serve.ready_budget.as_ref().map(|b| b.seconds.saturating_mul(1000));
        self.rec.event(ev::EngineReady {
            elapsed_ms: ms,
            identity_check_ms: identity_ms,
            ready_budget_s: self.spec.serve.ready_budget.as_ref().map(|b| b.seconds),
            within_budget: budget_ms.map(|b| ms <= b),
        });
        self.rec.set_phase(Phase::Ready);
        tracing::info!(elapsed_ms = ms, "vLLM ready");
    }

    /// A ready answer counts only when the socket listening on the port is the engine's process
    /// tree's (crate::ports::listener_of; docs/payload.md "Server identity"): another process's
    /// server is recorded once (`foreign_server`) and never taken for the engine. A table that
    /// shows no listener (a restricted /proc) leaves the answer as it is.
    fn identify(&mut self, r: engine::Readiness, port: u16, foreign_seen: &mut bool) -> engine::Readiness {
        let engine_pid = match &self.share {
            Share::Leg(a) => Some(a.engine.engine_pid),
            _ => self.rec.status.pids.get("engine").copied(),
        };
        let Some(pid) = engine_pid.filter(|_| r == engine::Readiness::Ready) else {
            return r;
        };
        let t0 = Instant::now();
        let listener = crate::ports::listener_of(port, pid);
        self.identity_ms = t0.elapsed().as_secs_f64() * 1000.0;
        match listener {
            crate::ports::Listener::Foreign { pids } => {
                if !std::mem::replace(foreign_seen, true) {
                    self.rec.event(ev::ForeignServer { port, pids: pids.clone(), engine_pid: pid });
                    tracing::warn!(
                        port,
                        ?pids,
                        "a server that is not the engine answers on its port; not taken for it"
                    );
                }
                engine::Readiness::Foreign
            }
            crate::ports::Listener::Engine | crate::ports::Listener::None => r,
        }
    }

    /// One heartbeat into `status.json`.
    fn write_heartbeat(
        &mut self,
        completions: Option<crate::records::Completions>,
        probes: crate::records::ProbeState,
    ) {
        let hb = self.heartbeat.next(completions, &self.engine_log(), &self.spec.run_dir, probes);
        if self.heartbeat.event_due(std::time::Instant::now()) {
            self.rec.event(ev::heartbeat(&hb));
        }
        self.rec.status.heartbeat = Some(hb);
        self.rec.write_status();
    }

    /// Which node each rank runs on, from the records every `payload rank` wrote on its node.
    fn record_ranks_joined(&mut self, s: &crate::multinode::Secondaries) {
        let records = crate::multinode::read_rank_records(&self.spec.run_dir, &s.file.ranks[1..]);
        let head = ev::JoinedRank {
            rank: 0,
            node: s.nodes[0].name.clone(),
            pid: self.rec.status.pids.get("engine").copied(),
            step: None,
        };
        let mut ranks = vec![head];
        ranks.extend(records.iter().map(|r| ev::JoinedRank {
            rank: r.rank,
            node: r.node.clone(),
            pid: Some(r.pid),
            step: Some(r.step.clone()),
        }));
        let missing: Vec<u32> =
            s.file.ranks[1..].iter().map(|r| r.rank).filter(|k| !records.iter().any(|r| r.rank == *k)).collect();
        self.rec.event(ev::RanksJoined { ranks, missing });
    }

    /// A multi-node engine's other nodes: the ranks file, then their one srun step in its own group.
    fn start_ranks(&mut self, s: &crate::multinode::Secondaries) -> Result<(), End> {
        let spawn_failed = |e: String| Failure::new(OutcomeClass::EngineStart, e).with_cause("multinode");
        // Records of an earlier attempt in this run dir must not count as joined ranks.
        let _ = std::fs::remove_dir_all(self.spec.run_dir.join(crate::multinode::RANK_RECORDS_DIR));
        crate::multinode::write_ranks_file(&self.spec.run_dir, &s.file)
            .map_err(|e| spawn_failed(format!("cannot write {}: {e}", crate::multinode::RANKS_FILE)))?;
        let pid = self
            .sup
            .spawn(Role::Ranks, &s.srun)
            .map_err(|e| spawn_failed(format!("cannot start {}: {e}", s.srun.program.display())))?;
        self.rec.status.pids.insert("ranks".into(), pid);
        let ranks = s.file.ranks.iter().map(|r| ev::RankNode { rank: r.rank, node: r.node.clone() }).collect();
        self.rec.event(ev::RanksSpawned {
            pid,
            argv: s.srun.argv.clone(),
            crossing: serde_json::to_value(s.file.crossing).unwrap_or_default(),
            rendezvous: serde_json::to_value(&s.file.rendezvous).unwrap_or_default(),
            ranks,
        });
        tracing::info!(pid, nodes = s.nodes.len(), "srun started the other nodes' ranks");
        Ok(())
    }

    /// Harbor: `api_base` (the tunnel's public URL for installed agents), resume rewrites, spawn.
    async fn start_harbor(&mut self, p: &Prepared) -> Result<(), End> {
        self.record_provenance(p).await;
        let public_url = match &self.share {
            Share::Leg(a) => a.engine.public_url.clone(),
            _ => self.tunnel.as_ref().and_then(Tunnel::public_url),
        };
        let api_base = p.api_base(public_url.as_deref());
        if p.harbor.mode == HarborMode::Resume {
            let rewritten = harbor::rewrite_api_base(&self.spec.run_dir, &api_base).map_err(Failure::from)?;
            let files = rewritten.into_iter().map(|(file, n)| ev::RewrittenFile { file, changed: n as u64 }).collect();
            self.rec.event(ev::ResumeConfigsRewritten { api_base: api_base.clone(), files });
        }
        let (tunnel_env, prefix) = match (&self.tunnel, &self.share) {
            (Some(t), _) => (t.harbor_env(), t.harbor_prefix()),
            (None, Share::Leg(a)) => (a.engine.harbor_env.clone(), a.engine.harbor_prefix.clone()),
            (None, _) => (BTreeMap::new(), None),
        };
        let child = p.harbor.child(&self.spec, &api_base, &tunnel_env, prefix.as_deref()).map_err(Failure::from)?;
        if let Some(ev) = self.pending_signal().await {
            return Err(End::Signal(ev));
        }
        let pid = self.sup.spawn(Role::Harbor, &child).map_err(|e| {
            Failure::new(OutcomeClass::Harbor, format!("cannot start {}: {e}", child.program.display()))
                .with_cause("spawn")
        })?;
        self.rec.status.pids.insert("harbor".into(), pid);
        let tag = self.spec.run_tag.clone();
        self.rec.gpu(|c, now| c.leg_started(&tag, now));
        self.rec.event(ev::HarborSpawned {
            pid,
            argv: child.argv.clone(),
            mode: p.harbor.mode.as_str().to_string(),
            api_base: api_base.clone(),
        });
        if let Some(t) = self.tunnel.as_mut() {
            t.commit();
        }
        Ok(())
    }

    /// Ends the run (`spec`, cause `versions`) when an environment holds another vLLM or Harbor
    /// than the spec was built for.
    fn refuse_disagreement(&mut self, vllm: Option<&str>, harbor: Option<&str>) -> Result<(), End> {
        match provenance::disagreement(&self.spec, vllm, harbor) {
            Some(message) => Err(Failure::new(OutcomeClass::Spec, message).with_cause("versions").into()),
            None => Ok(()),
        }
    }

    /// The programs' versions (or why there are none), kept for the provenance record and checked.
    fn accept_versions(&mut self, answer: Result<provenance::Versions, String>) -> Result<(), End> {
        let versions = answer.unwrap_or_else(|why| provenance::Versions {
            vllm: Err(why.clone()),
            harbor: Err(why.clone()),
            dataset: Err(why),
        });
        let (vllm, harbor) = (versions.vllm.clone().ok(), versions.harbor.clone().ok());
        self.answered = Some(versions);
        self.refuse_disagreement(vllm.as_deref(), harbor.as_deref())
    }

    /// The model revision (the engine has resolved its weights by now) and the programs' versions
    /// (asked while it loaded, [`Self::accept_versions`]), into `status.json` and the `provenance` event.
    async fn record_provenance(&mut self, p: &Prepared) {
        let versions = self.answered.take().unwrap_or_else(|| provenance::Versions {
            vllm: Err("not asked".into()),
            harbor: Err("not asked".into()),
            dataset: Err("not asked".into()),
        });
        let revision = provenance::model_revision(&self.spec, &p.head().child.env);
        let (mut record, missing) = provenance::record(revision, versions);
        // A leg of a pool: the weights the host's engine serves it, and how they got there.
        if let Share::Leg(a) = &self.share {
            record.pool = a.engine.pool.clone().map(Box::new);
        }
        self.rec.event(ev::Provenance { record: record.clone(), missing });
        self.rec.status.provenance = Some(record);
    }

    /// After teardown: the ranks' srun step is cancelled by its id (from the rank records), so
    /// nothing is left on another node even if srun itself had to be SIGKILLed.
    fn cancel_rank_steps(&mut self) {
        let ranks_file = self.spec.run_dir.join(crate::multinode::RANKS_FILE);
        if self.sup.ranks.is_none() || !ranks_file.exists() {
            return;
        }
        let Ok(file) = std::fs::read_to_string(&ranks_file)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<crate::multinode::RanksFile>(&t).map_err(|e| e.to_string()))
        else {
            return;
        };
        let records = crate::multinode::read_rank_records(&self.spec.run_dir, &file.ranks[1..]);
        crate::multinode::cancel_steps(&records);
        let steps = records.iter().map(|r| r.step.clone()).collect();
        self.rec.event(ev::RanksCancelled { steps });
    }

    /// Teardown, final heartbeat, outcome, exit code.
    async fn finish(&mut self, end: End) -> i32 {
        let engine_log = self.engine_log();
        // Final counters while vLLM may still answer.
        if self.sup.engine.as_mut().is_some_and(|m| m.try_status().is_none())
            && let Some(port) = self.rec.status.port
        {
            let client = engine::http_client(Duration::from_millis(500));
            let metrics = engine::fetch_completions(&client, &prepare::base_url(&self.spec.serve.host, port)).await;
            let healthy = !matches!(end, End::Failed(ref f) if f.class == OutcomeClass::EngineDied);
            let probes = crate::records::ProbeState { healthy, ..self.heartbeat.probes() };
            self.rec.status.heartbeat = Some(self.heartbeat.next(metrics, &engine_log, &self.spec.run_dir, probes));
        }
        let plan = phases::shutdown_plan(&end, &self.timings);
        match &end {
            End::Signal(ev) => {
                let name = match ev {
                    SignalEvent::Shutdown(sig) => sig.as_str(),
                    SignalEvent::Walltime => "SIGUSR1",
                };
                self.rec.event(ev::Signal { signal: name.to_string(), during: None });
                tracing::warn!(signal = name, "signal received: tearing down");
            }
            End::Failed(f) => {
                tracing::error!(class = f.class.as_str(), cause = f.cause.as_deref().unwrap_or("-"), error = %f.message, "run failed")
            }
            End::Cancelled => tracing::warn!("cancel requested: stopping this leg"),
            End::HarborExited(_) | End::LegsEnded => {}
        }
        self.rec.gpu(|c, now| c.teardown_started(now));
        self.rec.set_phase(Phase::Stopping);
        // A shared job's host winds its legs down first (each records its own end), then the engine.
        if self.is_host() {
            self.wind_down_legs(&end, &plan).await;
        }
        self.rec.event(ev::TeardownStarted {
            grace_s: plan.grace.as_secs_f64(),
            harbor_grace_s: plan.harbor_grace.as_secs_f64(),
        });
        let report = self.sup.shutdown(&mut self.signals, plan).await;
        self.rec.gpu(|c, now| c.teardown_done(now));
        // Every child is gone: nothing writes into the scratch dir any more.
        if let Some(scratch) = self.scratch.take() {
            scratch.remove();
        }
        self.cancel_rank_steps();
        self.rec.event(ev::TeardownDone {
            elapsed_ms: report.elapsed.as_millis() as u64,
            forced: report.forced,
            killed_groups: report.killed_groups.iter().map(|r| r.as_str().to_string()).collect(),
            swept: report.swept.clone(),
            clean: report.clean,
            signals: report.signals.iter().map(|s| s.as_str().to_string()).collect(),
            steps: report
                .steps
                .iter()
                .map(|s| ev::TeardownStep { ms: s.ms, action: s.action.to_string(), role: s.role.as_str().to_string() })
                .collect(),
        });
        if let Some(t) = self.tunnel.as_mut() {
            t.cleanup(&self.rec);
        }
        // The post-run step, only for a finished eval (the replaced job uploaded only after Harbor
        // exited 0; a walltime wind-down resumes later and runs it then). Its result is recorded
        // beside the outcome and never changes it.
        if let Some(step) = self.post_run.take() {
            if matches!(end, End::HarborExited(status) if status.success()) {
                let record =
                    crate::postrun::run(step, &mut self.sup, &mut self.signals, &mut self.rec, &self.timings).await;
                self.rec.status.post_run = Some(record);
            } else {
                self.rec.event(ev::PostRunSkipped {
                    reason: "the run did not finish (the step runs after Harbor exits 0)".to_string(),
                });
            }
        }
        let harbor_code = self.sup.harbor.as_mut().and_then(|m| m.try_status()).map(status_code);
        let mut outcome = phases::outcome(end, harbor_code, report.forced);
        if self.is_host() {
            outcome = self.host_outcome(outcome);
        }
        let code = outcome.exit_code;
        // The final records get the space held since the start (a disk that filled meanwhile).
        self.rec.release_reserve();
        // Writes that failed during the run (closed stderr, full disk): reported where it still works.
        let failed =
            (crate::logsink::failed_writes(), self.rec.failed_status_writes, self.rec.failed_event_writes.get());
        if failed != (0, 0, 0) {
            self.rec.event(ev::WriteFailures { log: failed.0, status: failed.1, events: failed.2 });
            tracing::warn!(log = failed.0, status = failed.1, events = failed.2, "some log or record writes failed");
        }
        self.rec.event(outcome.clone());
        tracing::info!(class = outcome.class.as_str(), exit_code = code, cause = outcome.cause.as_deref().unwrap_or("-"), message = %outcome.message, "payload done");
        self.rec.set_outcome(outcome);
        code
    }
}

/// An exit a stop signal to the child itself explains: death by TERM/INT/HUP, or the 128+signal
/// codes programs exit with after handling one (Harbor's KeyboardInterrupt: 130). vLLM also exits 0
/// on SIGTERM, which the caller adds for the engine. A crash (exit 1) or SIGKILL (the OOM killer)
/// is not, and is handled at once.
fn stopped_by_a_signal(status: &std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    const STOP_SIGNALS: [i32; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];
    status.signal().is_some_and(|s| STOP_SIGNALS.contains(&s))
        || status.code().is_some_and(|c| STOP_SIGNALS.iter().any(|s| c == 128 + s))
}
