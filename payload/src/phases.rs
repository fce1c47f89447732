//! The run's phases as a machine without I/O (docs/payload.md, "The run loop").
//!
//! crate::run's one event loop turns what happens — a child exits, a signal arrives, a readiness or
//! health probe answers, Harbor's `--print-config` verdict comes back, the tunnel's state machine
//! reports, the start-up deadline passes — into an [`Input`], and [`Machine::on`] decides what it
//! means in the current [`RunPhase`]: an event to record, vLLM ready, start Harbor, or the run's
//! [`End`]. The outcome is derived from the end by the pure [`outcome`], and the teardown's shape
//! by [`shutdown_plan`]. Everything here is unit-tested with made-up inputs, no processes.
//!
//! ```text
//!  Loading ──ready (+ config check passed)──▶ TunnelCheck ──tunnel up──▶ (start Harbor) ──▶ Running
//!     │        └── no tunnel ─────────────────────────────────────────────▶ (start Harbor) ──▶ Running
//!     └ engine exited (engine_start) · deadline (engine_timeout) · config rejected (harbor)
//!  TunnelCheck: engine exited (engine_died) ·  Running: Harbor exited · engine exited/unhealthy (engine_died)
//!           · requests in flight and no token for serve.hang_after_s (engine_hung, crate::liveness)
//!  any phase: a signal · the tunnel failed
//! ```

use launch_spec::OutcomeClass;
use launch_spec::records::Outcome;
use launch_spec::rundir::EventBody;
use launch_spec::rundir::events::{
    CancelRequested, EngineExited, EngineLost, EngineStalled, EngineUnhealthy, HarborExited, RanksExited,
    ReadyBudgetExceeded,
};
use serde_json::json;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use crate::engine::{self, Readiness};
use crate::failure::Failure;
use crate::harbor::ConfigCheck;
use crate::liveness::{EngineSample, Liveness};
use crate::supervisor::{SignalEvent, TeardownGrace, describe_status, status_code};
use crate::timings::Timings;
use crate::tunnel::TunnelPoll;

/// Where the run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunPhase {
    /// vLLM is loading; readiness is polled (the tunnel starts meanwhile).
    Loading,
    /// vLLM is ready; the tunnel must come up and pass its end-to-end check.
    TunnelCheck,
    /// Harbor runs; the watchdog probes vLLM's health.
    Running,
    /// The run has ended; inputs change nothing.
    Ended,
}

/// How the run ended, before teardown.
#[derive(Debug)]
pub(crate) enum End {
    HarborExited(ExitStatus),
    Failed(Failure),
    Signal(SignalEvent),
    /// A leg of a shared job: `cancel.request` appeared in its run dir (launch_spec::shared).
    Cancelled,
    /// A shared job's engine host: every leg it started has ended (crate::run::shared).
    LegsEnded,
}

impl From<Failure> for End {
    fn from(f: Failure) -> Self {
        End::Failed(f)
    }
}

/// What happened.
#[derive(Debug)]
pub(crate) enum Input {
    EngineExited(ExitStatus),
    /// A multi-node engine's srun step of the other nodes' ranks ended (one rank failed, or all).
    RanksExited(ExitStatus),
    HarborExited(ExitStatus),
    Signal(SignalEvent),
    /// `serve.health_timeout_s` since vLLM started.
    ReadyDeadline,
    /// `serve.ready_budget` since vLLM started (only when it is below the cap), with the size of
    /// `vllm.log` at that instant.
    BudgetPassed(Instant, u64),
    Readiness(Readiness),
    ConfigChecked(ConfigCheck),
    /// While loading: the size of `vllm.log` at that instant (its growth is the load's progress).
    LoadProgress(Instant, u64),
    /// One `/health` probe's answer.
    Health(bool),
    /// A heartbeat's reading of vLLM's counters (`/metrics`), taken at that instant.
    Metrics(Instant, EngineSample),
    Tunnel(TunnelPoll),
    /// A leg of a shared job: `cancel.request` is in its run dir.
    CancelRequested,
    /// A leg of a shared job: the engine host reports the engine gone (its class and why).
    EngineLost(Failure),
    /// A shared job's engine host: the last leg ended.
    LegsEnded,
}

/// What the loop must do.
#[derive(Debug)]
pub(crate) enum Action {
    /// Record an event.
    Event(EventBody),
    /// vLLM is ready (record it, phase `ready`).
    Ready,
    /// Start Harbor now; report back with [`Machine::harbor_started`] (or end the run).
    StartHarbor,
    /// The ready budget passed with the load progressing: wait on to the cap.
    BudgetExceeded,
    End(End),
}

use crate::records::ProbeState;

/// The run's decisions, phase by phase.
#[derive(Debug)]
pub(crate) struct Machine {
    phase: RunPhase,
    has_tunnel: bool,
    /// Harbor's `--print-config` check is still running.
    config_pending: bool,
    ready: bool,
    saw_health: bool,
    /// A server not of the engine's tree answered readiness (crate::ports::Listener::Foreign).
    saw_foreign: bool,
    failures: u32,
    health_failures: u32,
    health_timeout_s: u64,
    last_healthy: bool,
    liveness: Liveness,
    /// `serve.load_stall_after_s`, and the last `vllm.log` size with when it was first seen.
    load_stall_after: Duration,
    load_seen: Option<(Instant, u64)>,
    /// `serve.ready_budget` when below the cap, and whether it has passed.
    budget: Option<Duration>,
    budget_passed: bool,
}

impl Machine {
    pub(crate) fn new(has_tunnel: bool, config_pending: bool, health_failures: u32, health_timeout_s: u64) -> Self {
        Self {
            phase: RunPhase::Loading,
            has_tunnel,
            config_pending,
            ready: false,
            saw_health: false,
            saw_foreign: false,
            failures: 0,
            health_failures: health_failures.max(1),
            health_timeout_s,
            last_healthy: true,
            liveness: Liveness::new(Duration::from_secs(launch_spec::spec::DEFAULT_HANG_AFTER_S)),
            load_stall_after: Duration::from_secs(launch_spec::spec::DEFAULT_LOAD_STALL_AFTER_S),
            load_seen: None,
            budget: None,
            budget_passed: false,
        }
    }

    /// The ready budget (`serve.ready_budget`, taken only when below the cap
    /// `serve.health_timeout_s`: at or above it, the cap is the deadline).
    pub(crate) fn with_ready_budget(mut self, budget: Option<Duration>) -> Self {
        self.budget = budget.filter(|b| *b < Duration::from_secs(self.health_timeout_s));
        self
    }

    /// The budget to wait for, while it has not passed and the engine is not ready.
    pub(crate) fn budget_pending(&self) -> Option<Duration> {
        self.budget.filter(|_| !self.budget_passed && self.awaiting_readiness())
    }

    /// The stall window while loading (`serve.load_stall_after_s`); the default is the spec's.
    pub(crate) fn with_load_stall_after(mut self, window: Duration) -> Self {
        self.load_stall_after = window;
        self
    }

    /// The liveness window (`serve.hang_after_s`); the default is the spec's.
    pub(crate) fn with_hang_after(mut self, hang_after: Duration) -> Self {
        self.liveness = Liveness::new(hang_after);
        self
    }

    /// vLLM's counters from the latest reading, for the heartbeat.
    pub(crate) fn engine_counters(&self) -> Option<&launch_spec::records::EngineCounters> {
        self.liveness.counters()
    }

    pub(crate) fn phase(&self) -> RunPhase {
        self.phase
    }

    /// Whether the readiness deadline still matters: loading and not ready yet. Once ready (the
    /// config check may still run) the deadline is spent; a loop that kept selecting on a passed
    /// deadline would wake at once, every time, and starve the check behind it.
    pub(crate) fn awaiting_readiness(&self) -> bool {
        self.phase == RunPhase::Loading && !self.ready
    }

    /// Whether the engine is probed: for readiness until it is ready, for health once Harbor runs.
    /// In between (the config check, the tunnel's check) an answer changes nothing, and each costs
    /// a request and a server-identity check.
    pub(crate) fn probing(&self) -> bool {
        self.awaiting_readiness() || self.phase == RunPhase::Running
    }

    /// For the heartbeat: not yet while loading; the last probe's answer once Harbor runs.
    fn engine_healthy(&self) -> bool {
        match self.phase {
            RunPhase::Loading => false,
            RunPhase::TunnelCheck => true,
            RunPhase::Running | RunPhase::Ended => self.last_healthy,
        }
    }

    /// The probe's state for the heartbeat: the last answer, the failures in a row and the limit, so
    /// the login node judges death by this machine's rule (`launch_spec::records::probes_say_dead`).
    pub(crate) fn probes(&self) -> ProbeState {
        ProbeState { healthy: self.engine_healthy(), failed: self.failures, limit: self.health_failures }
    }

    /// Harbor was started: the watchdog takes over.
    pub(crate) fn harbor_started(&mut self) {
        if self.phase != RunPhase::Ended {
            self.phase = RunPhase::Running;
        }
    }

    fn end(&mut self, end: End) -> Action {
        self.phase = RunPhase::Ended;
        Action::End(end)
    }

    /// One reading of the load's progress (`vllm.log`'s size): ends the run as stalled when it
    /// has not changed for the window, else returns how long it has been unchanged.
    fn load_progress(
        &mut self,
        at: Instant,
        bytes: u64,
        tail: &dyn Fn() -> Vec<String>,
        out: &mut Vec<Action>,
    ) -> Option<Duration> {
        match self.load_seen {
            Some((_, seen)) if seen == bytes => {}
            _ => self.load_seen = Some((at, bytes)),
        }
        let since = self.load_seen.map_or(Duration::ZERO, |(t, _)| at.saturating_duration_since(t));
        if since < self.load_stall_after {
            return Some(since);
        }
        out.push(Action::Event(
            EngineStalled {
                vllm_log_bytes: bytes,
                silent_for_s: since.as_secs(),
                load_stall_after_s: self.load_stall_after.as_secs(),
            }
            .into(),
        ));
        let f = Failure::new(
            OutcomeClass::EngineStart,
            format!(
                "vLLM made no loading progress: vllm.log stayed at {bytes} bytes for {} s (serve.load_stall_after_s = {} s) and /health never became ready; the engine was stopped early, before serve.health_timeout_s = {} s",
                since.as_secs(),
                self.load_stall_after.as_secs(),
                self.health_timeout_s
            ),
        )
        .with_cause("stalled")
        .with_log_tail(tail());
        out.push(self.end(End::Failed(f)));
        None
    }

    /// After readiness and a passed config check: the tunnel, or Harbor.
    fn advance(&mut self, out: &mut Vec<Action>) {
        if self.ready && !self.config_pending {
            if self.has_tunnel {
                self.phase = RunPhase::TunnelCheck;
            } else {
                out.push(Action::StartHarbor);
            }
        }
    }

    /// The engine exited: its start-up failure classified from the log's tail, by phase.
    fn on_engine_exited(&mut self, status: ExitStatus, tail: &dyn Fn() -> Vec<String>, out: &mut Vec<Action>) {
        let lines = tail();
        let cause = engine::classify_start_failure(&lines);
        let described = describe_status(status);
        let (class, message, during) = match self.phase {
            RunPhase::Loading => (
                OutcomeClass::EngineStart,
                format!("vLLM exited during start-up ({described}), cause: {cause}"),
                Some("start"),
            ),
            RunPhase::TunnelCheck => (
                OutcomeClass::EngineDied,
                format!("vLLM exited while the tunnel was being checked ({described})"),
                Some("tunnel"),
            ),
            _ => (OutcomeClass::EngineDied, format!("vLLM exited during the run ({described}); Harbor stopped"), None),
        };
        let during = during.map(str::to_string);
        out.push(Action::Event(EngineExited { status: described, cause: cause.to_string(), during }.into()));
        out.push(self.end(End::Failed(Failure::new(class, message).with_cause(cause).with_log_tail(lines))));
    }

    /// The other nodes' srun step ended: the engine's death, whenever it happens.
    fn on_ranks_exited(&mut self, status: ExitStatus, tail: &dyn Fn() -> Vec<String>, out: &mut Vec<Action>) {
        // Any rank's death is the engine's: during start-up it never became ready.
        let described = describe_status(status);
        let (class, during) = match self.phase {
            RunPhase::Loading => (OutcomeClass::EngineStart, "start"),
            RunPhase::TunnelCheck => (OutcomeClass::EngineDied, "tunnel"),
            _ => (OutcomeClass::EngineDied, "run"),
        };
        let message = format!(
            "a rank on another node ended ({described}: srun's step of the other nodes' ranks is over) during {during}; the engine cannot serve without it"
        );
        out.push(Action::Event(RanksExited { status: described, during: during.to_string() }.into()));
        out.push(self.end(End::Failed(Failure::new(class, message).with_cause("rank_exited").with_log_tail(tail()))));
    }

    /// The readiness deadline passed: what the engine did and did not answer, and the budget's part.
    fn never_ready(&self, tail: &dyn Fn() -> Vec<String>) -> Failure {
        let what = if self.saw_foreign {
            "never answered: the server answering on its port is another process's (event foreign_server), never taken for the engine"
        } else if self.saw_health {
            "answered /health but never listed the served name"
        } else {
            "never answered /health with 200"
        };
        let budget = match (self.budget, self.budget_passed) {
            (Some(b), true) => format!(
                " (its ready budget of {} s passed with the load still progressing, so it ran on to the cap)",
                b.as_secs()
            ),
            _ => String::new(),
        };
        Failure::new(
            OutcomeClass::EngineTimeout,
            format!("vLLM {what} within serve.health_timeout_s = {} s{budget}", self.health_timeout_s),
        )
        .with_log_tail(tail())
    }

    /// A health probe's answer while Harbor runs: `health_failures` in a row end the run.
    fn on_health(&mut self, ok: bool, tail: &dyn Fn() -> Vec<String>, out: &mut Vec<Action>) {
        self.last_healthy = ok;
        if ok {
            self.failures = 0;
        } else {
            self.failures += 1;
            tracing::warn!(failures = self.failures, "engine health probe failed");
            if launch_spec::records::probes_say_dead(self.failures, self.health_failures) {
                out.push(Action::Event(EngineUnhealthy { consecutive_failures: self.failures }.into()));
                let f = Failure::new(
                    OutcomeClass::EngineDied,
                    format!("vLLM failed {} consecutive /health probes; Harbor stopped", self.failures),
                )
                .with_cause("unhealthy")
                .with_log_tail(tail());
                out.push(self.end(End::Failed(f)));
            }
        }
    }

    /// vLLM's counters while Harbor runs: the liveness rule's evidence ends a hung engine.
    fn on_metrics(&mut self, at: Instant, sample: EngineSample, tail: &dyn Fn() -> Vec<String>, out: &mut Vec<Action>) {
        if let Some(evidence) = self.liveness.observe(at, sample) {
            let message = format!(
                "vLLM answers /health but did no work: {} request(s) running and {} waiting, and no token generated or prompt token processed for {} s (serve.hang_after_s = {} s; vllm:generation_tokens_total stayed at {}); Harbor stopped",
                sample.running,
                sample.waiting,
                json!(evidence.no_tokens_for_s),
                evidence.hang_after_s,
                sample.generation_tokens
            );
            out.push(Action::Event(evidence.into()));
            let f = Failure::new(OutcomeClass::EngineHung, message).with_cause("no_tokens").with_log_tail(tail());
            out.push(self.end(End::Failed(f)));
        }
    }

    /// Decides what `input` means now; `tail` gives the last lines of `vllm.log` (read only when
    /// an engine failure needs them).
    pub(crate) fn on(&mut self, input: Input, tail: &dyn Fn() -> Vec<String>) -> Vec<Action> {
        let mut out = Vec::new();
        if self.phase == RunPhase::Ended {
            return out;
        }
        match input {
            Input::Signal(ev) => out.push(self.end(End::Signal(ev))),
            Input::Tunnel(TunnelPoll::Failed(f)) => out.push(self.end(End::Failed(f))),
            Input::EngineExited(status) => self.on_engine_exited(status, tail, &mut out),
            Input::RanksExited(status) => self.on_ranks_exited(status, tail, &mut out),
            Input::HarborExited(status) => {
                out.push(Action::Event(
                    HarborExited { status: describe_status(status), code: status_code(status) }.into(),
                ));
                out.push(self.end(End::HarborExited(status)));
            }
            Input::ReadyDeadline if self.phase == RunPhase::Loading && !self.ready => {
                let f = self.never_ready(tail);
                out.push(self.end(End::Failed(f)));
            }
            Input::Readiness(r) if self.phase == RunPhase::Loading && !self.ready => match r {
                Readiness::Ready => {
                    self.ready = true;
                    out.push(Action::Ready);
                    self.advance(&mut out);
                }
                Readiness::HealthOnly => self.saw_health = true,
                Readiness::Foreign => self.saw_foreign = true,
                Readiness::Down => {}
            },
            Input::LoadProgress(at, bytes) if self.phase == RunPhase::Loading && !self.ready => {
                self.load_progress(at, bytes, tail, &mut out);
            }
            Input::BudgetPassed(at, bytes) if self.budget_pending().is_some() => {
                self.budget_passed = true;
                if let Some(silent) = self.load_progress(at, bytes, tail, &mut out) {
                    // Progress within the stall window: never cut short (issue 23); the cap
                    // and the stall rule govern from here.
                    out.push(Action::Event(
                        ReadyBudgetExceeded {
                            ready_budget_s: self.budget.map_or(0, |b| b.as_secs()),
                            cap_s: self.health_timeout_s,
                            vllm_log_bytes: bytes,
                            silent_for_s: silent.as_secs(),
                            load_stall_after_s: self.load_stall_after.as_secs(),
                        }
                        .into(),
                    ));
                    out.push(Action::BudgetExceeded);
                }
            }
            Input::ConfigChecked(v) if self.config_pending => {
                self.config_pending = false;
                out.push(Action::Event(v.event_fields().into()));
                if let ConfigCheck::Rejected(why) = v {
                    let f = Failure::new(OutcomeClass::Harbor, why).with_cause("config_rejected");
                    out.push(self.end(End::Failed(f)));
                } else {
                    self.advance(&mut out);
                }
            }
            Input::Tunnel(TunnelPoll::Up) if self.phase == RunPhase::TunnelCheck => out.push(Action::StartHarbor),
            Input::Health(ok) if self.phase == RunPhase::Running => self.on_health(ok, tail, &mut out),
            Input::Metrics(at, sample) if self.phase == RunPhase::Running => {
                self.on_metrics(at, sample, tail, &mut out)
            }
            Input::CancelRequested => {
                out.push(Action::Event(
                    CancelRequested { file: launch_spec::shared::CANCEL_REQUEST_FILE.to_string() }.into(),
                ));
                out.push(self.end(End::Cancelled));
            }
            Input::EngineLost(f) => {
                out.push(Action::Event(
                    EngineLost {
                        class: f.class.as_str().to_string(),
                        cause: f.cause.clone(),
                        message: f.message.clone(),
                    }
                    .into(),
                ));
                out.push(self.end(End::Failed(f)));
            }
            Input::LegsEnded if self.phase == RunPhase::Running => out.push(self.end(End::LegsEnded)),
            // Anything else is stale for this phase (a readiness answer after ready, a health
            // answer before Harbor, a tunnel still pending).
            _ => {}
        }
        out
    }
}

/// How teardown goes for this end: a TERM/INT/HUP makes the next one mean "kill now"; USR1 gives
/// Harbor until the walltime is close.
pub(crate) fn shutdown_plan(end: &End, timings: &Timings) -> TeardownGrace {
    let grace = timings.teardown_grace;
    match end {
        End::Signal(SignalEvent::Shutdown(_)) => TeardownGrace::normal(grace, true),
        End::Signal(SignalEvent::Walltime) => TeardownGrace::walltime(grace, timings.walltime_lead),
        _ => TeardownGrace::normal(grace, false),
    }
}

/// The run's outcome (and so payload's exit code, docs/exit-codes.md) from how it ended, Harbor's
/// exit code if it exited, and whether a second signal cut the teardown short.
pub(crate) fn outcome(end: End, harbor_code: Option<i32>, forced: bool) -> Outcome {
    let base = |class: OutcomeClass, message: String| Outcome {
        class,
        cause: None,
        exit_code: class.exit_code(),
        message,
        harbor_exit_code: harbor_code,
        signal: None,
        engine_log_tail: Vec::new(),
    };
    match end {
        End::HarborExited(status) if status_code(status) == 0 => {
            Outcome { harbor_exit_code: Some(0), ..base(OutcomeClass::Finished, "Harbor finished".to_string()) }
        }
        End::HarborExited(status) => Outcome {
            harbor_exit_code: Some(status_code(status)),
            ..base(OutcomeClass::Harbor, format!("Harbor failed ({})", describe_status(status)))
        },
        End::Failed(f) => Outcome { cause: f.cause, engine_log_tail: f.engine_log_tail, ..base(f.class, f.message) },
        End::Cancelled => Outcome {
            cause: Some(launch_spec::shared::CANCEL_REQUESTED_CAUSE.to_string()),
            ..base(
                OutcomeClass::Interrupted,
                format!(
                    "cancelled: {} in the run dir asked to stop this leg of the shared job (the other legs go on)",
                    launch_spec::shared::CANCEL_REQUEST_FILE
                ),
            )
        },
        End::LegsEnded => base(OutcomeClass::Finished, "every leg of the shared job ended".to_string()),
        End::Signal(SignalEvent::Walltime) => Outcome {
            signal: Some("SIGUSR1".to_string()),
            ..base(
                OutcomeClass::Walltime,
                "walltime near (SIGUSR1): Harbor stopped gracefully, everything torn down".to_string(),
            )
        },
        End::Signal(SignalEvent::Shutdown(sig)) => Outcome {
            exit_code: 128 + sig as i32,
            signal: Some(sig.as_str().to_string()),
            ..base(
                OutcomeClass::Interrupted,
                format!(
                    "interrupted by {}{}",
                    sig.as_str(),
                    if forced { " (second signal: killed at once)" } else { "" }
                ),
            )
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;
    use std::os::unix::process::ExitStatusExt;
    use std::time::Duration;

    fn exit(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    fn tail() -> Vec<String> {
        vec!["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB".to_string()]
    }

    fn ends(actions: &[Action]) -> Option<&End> {
        actions.iter().find_map(|a| if let Action::End(e) = a { Some(e) } else { None })
    }

    fn failed(actions: &[Action]) -> &Failure {
        match ends(actions) {
            Some(End::Failed(f)) => f,
            other => panic!("expected a failure, got {other:?} from {actions:?}"),
        }
    }

    fn starts_harbor(actions: &[Action]) -> bool {
        actions.iter().any(|a| matches!(a, Action::StartHarbor))
    }

    #[test]
    fn loading_engine_exit_is_engine_start_with_the_classified_tail() {
        let mut m = Machine::new(false, false, 3, 60);
        let a = m.on(Input::EngineExited(exit(1)), &tail);
        let f = failed(&a);
        assert_eq!((f.class, f.cause.as_deref()), (OutcomeClass::EngineStart, Some("oom")));
        assert_eq!(f.engine_log_tail, tail());
        assert!(
            matches!(&a[0], Action::Event(EventBody::EngineExited(e)) if e.during.as_deref() == Some("start")),
            "{a:?}"
        );
        assert_eq!(m.phase(), RunPhase::Ended);
        assert!(m.on(Input::Readiness(Readiness::Ready), &tail).is_empty(), "nothing after the end");
    }

    #[test]
    fn the_deadline_says_whether_health_was_ever_seen() {
        let mut m = Machine::new(false, false, 3, 60);
        let f = failed(&m.on(Input::ReadyDeadline, &Vec::new)).clone();
        assert_eq!(f.class, OutcomeClass::EngineTimeout);
        assert!(f.message.contains("never answered /health with 200"), "{}", f.message);
        let mut m = Machine::new(false, false, 3, 60);
        assert!(m.on(Input::Readiness(Readiness::HealthOnly), &tail).is_empty());
        let f = failed(&m.on(Input::ReadyDeadline, &Vec::new)).clone();
        assert!(
            f.message.contains("never listed the served name within serve.health_timeout_s = 60 s"),
            "{}",
            f.message
        );
    }

    #[test]
    fn a_foreign_server_is_never_ready() {
        let mut m = Machine::new(false, false, 3, 60);
        for _ in 0..5 {
            assert!(m.on(Input::Readiness(Readiness::Foreign), &tail).is_empty(), "never Ready, never Harbor");
        }
        assert_eq!(m.phase(), RunPhase::Loading);
        let f = failed(&m.on(Input::ReadyDeadline, &Vec::new)).clone();
        assert_eq!(f.class, OutcomeClass::EngineTimeout);
        assert!(f.message.contains("another process's"), "{}", f.message);
    }

    #[test]
    fn ready_without_tunnel_starts_harbor_then_harbor_exit_ends() {
        let mut m = Machine::new(false, false, 3, 60);
        assert!(m.on(Input::Readiness(Readiness::Down), &tail).is_empty());
        let a = m.on(Input::Readiness(Readiness::Ready), &tail);
        assert!(matches!(a[0], Action::Ready) && starts_harbor(&a), "{a:?}");
        assert_eq!(m.phase(), RunPhase::Loading, "until Harbor is started");
        m.harbor_started();
        assert_eq!(m.phase(), RunPhase::Running);
        let a = m.on(Input::HarborExited(exit(0)), &tail);
        assert!(matches!(&a[0], Action::Event(EventBody::HarborExited(e)) if e.code == 0));
        assert!(matches!(ends(&a), Some(End::HarborExited(s)) if s.success()));
    }

    #[test]
    fn ready_waits_for_the_config_check_and_a_rejection_ends_the_run() {
        let mut m = Machine::new(false, true, 3, 60);
        assert!(m.awaiting_readiness());
        let a = m.on(Input::Readiness(Readiness::Ready), &tail);
        assert!(!starts_harbor(&a), "config check still running: {a:?}");
        assert!(!m.awaiting_readiness(), "ready: the readiness deadline no longer wakes the loop");
        assert!(!m.probing(), "ready, the config check running: nothing to probe");
        let a = m.on(Input::ConfigChecked(ConfigCheck::Passed { agents: 1 }), &tail);
        assert!(starts_harbor(&a), "{a:?}");

        let mut m = Machine::new(false, true, 3, 60);
        let a = m.on(Input::ConfigChecked(ConfigCheck::Rejected("Unknown option 'x'".into())), &tail);
        let f = failed(&a);
        assert_eq!((f.class, f.cause.as_deref()), (OutcomeClass::Harbor, Some("config_rejected")));
        assert!(matches!(&a[0], Action::Event(EventBody::HarborConfigCheck(_))));
    }

    #[test]
    fn a_tunnel_is_checked_after_readiness_before_harbor() {
        let mut m = Machine::new(true, false, 3, 60);
        assert!(m.on(Input::Tunnel(TunnelPoll::Up), &tail).is_empty(), "not before vLLM is ready");
        let a = m.on(Input::Readiness(Readiness::Ready), &tail);
        assert!(!starts_harbor(&a));
        assert_eq!(m.phase(), RunPhase::TunnelCheck);
        assert!(m.engine_healthy());
        assert!(m.on(Input::Tunnel(TunnelPoll::Pending), &tail).is_empty());
        assert!(starts_harbor(&m.on(Input::Tunnel(TunnelPoll::Up), &tail)));
    }

    #[test]
    fn engine_exit_while_checking_the_tunnel_is_engine_died() {
        let mut m = Machine::new(true, false, 3, 60);
        m.on(Input::Readiness(Readiness::Ready), &tail);
        let a = m.on(Input::EngineExited(ExitStatus::from_raw(9)), &Vec::new);
        let f = failed(&a);
        assert_eq!(f.class, OutcomeClass::EngineDied);
        assert!(f.message.contains("tunnel") && f.message.contains("SIGKILL"), "{}", f.message);
        assert!(matches!(&a[0], Action::Event(EventBody::EngineExited(e)) if e.during.as_deref() == Some("tunnel")));
    }

    #[test]
    fn the_tunnel_failing_ends_any_phase() {
        for phase_inputs in [vec![], vec![Input::Readiness(Readiness::Ready)]] {
            let mut m = Machine::new(true, false, 3, 60);
            for i in phase_inputs {
                m.on(i, &tail);
            }
            let f = Failure::new(OutcomeClass::Tunnel, "verify failed").with_cause("verify_failed");
            let a = m.on(Input::Tunnel(TunnelPoll::Failed(f.clone())), &tail);
            assert_eq!(failed(&a), &f);
        }
    }

    #[test]
    fn consecutive_failed_probes_end_the_run_and_a_good_one_resets() {
        let mut m = Machine::new(false, false, 3, 60);
        for _ in 0..3 {
            assert!(m.on(Input::Health(false), &tail).is_empty(), "no health watch before Harbor runs");
        }
        assert_eq!(m.probes(), ProbeState { healthy: false, failed: 0, limit: 3 }, "loading: not probed for health");
        m.on(Input::Readiness(Readiness::Ready), &tail);
        m.harbor_started();
        // The heartbeat written as Harbor starts: healthy (it just answered readiness), no failure.
        assert_eq!(m.probes(), ProbeState { healthy: true, failed: 0, limit: 3 });
        assert!(m.on(Input::Health(false), &tail).is_empty());
        assert!(!m.engine_healthy());
        assert!(m.on(Input::Health(false), &tail).is_empty());
        assert_eq!(m.probes(), ProbeState { healthy: false, failed: 2, limit: 3 }, "two of three: alive");
        assert!(m.on(Input::Health(true), &tail).is_empty(), "reset");
        assert!(m.engine_healthy());
        m.on(Input::Health(false), &tail);
        m.on(Input::Health(false), &tail);
        let a = m.on(Input::Health(false), &tail);
        let f = failed(&a);
        assert_eq!((f.class, f.cause.as_deref()), (OutcomeClass::EngineDied, Some("unhealthy")));
        assert!(matches!(&a[0], Action::Event(EventBody::EngineUnhealthy(e)) if e.consecutive_failures == 3));
    }

    #[test]
    fn a_stall_with_requests_in_flight_ends_as_engine_hung_and_idle_never_does() {
        let t0 = Instant::now();
        let busy = EngineSample { running: 2, generation_tokens: 64, ..EngineSample::default() };
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut m = Machine::new(false, false, 3, 60).with_hang_after(Duration::from_secs(5));
        assert!(m.on(Input::Metrics(at(0), busy), &tail).is_empty(), "not watched before Harbor runs");
        m.on(Input::Readiness(Readiness::Ready), &tail);
        m.harbor_started();
        for s in 1..6 {
            assert!(m.on(Input::Metrics(at(s), busy), &tail).is_empty(), "{s}");
        }
        assert_eq!(m.engine_counters().unwrap().no_tokens_for_s, Some(4.0));
        let a = m.on(Input::Metrics(at(6), busy), &tail);
        let f = failed(&a);
        assert_eq!((f.class, f.cause.as_deref()), (OutcomeClass::EngineHung, Some("no_tokens")));
        assert!(
            f.message.contains("2 request(s) running") && f.message.contains("serve.hang_after_s = 5 s"),
            "{}",
            f.message
        );
        assert!(matches!(&a[0], Action::Event(EventBody::EngineHung(e)) if e.no_tokens_for_s == 5.0), "{a:?}");
        assert_eq!(outcome(End::Failed(f.clone()), None, false).exit_code, 16);

        let idle = EngineSample { generation_tokens: 64, ..EngineSample::default() };
        let mut m = Machine::new(false, false, 3, 60).with_hang_after(Duration::from_secs(1));
        m.on(Input::Readiness(Readiness::Ready), &tail);
        m.harbor_started();
        for s in 0..100 {
            assert!(m.on(Input::Metrics(at(s), idle), &tail).is_empty(), "idle is not hung");
        }
    }

    #[test]
    fn signals_end_every_phase() {
        for (inputs, started) in [(vec![], false), (vec![Input::Readiness(Readiness::Ready)], true)] {
            let mut m = Machine::new(false, false, 3, 60);
            for i in inputs {
                m.on(i, &tail);
            }
            if started {
                m.harbor_started();
            }
            let a = m.on(Input::Signal(SignalEvent::Walltime), &tail);
            assert!(matches!(ends(&a), Some(End::Signal(SignalEvent::Walltime))), "{a:?}");
        }
    }

    #[test]
    fn outcomes_and_exit_codes() {
        let o = outcome(End::HarborExited(exit(0)), Some(0), false);
        assert_eq!((o.class, o.exit_code, o.harbor_exit_code), (OutcomeClass::Finished, 0, Some(0)));
        let o = outcome(End::HarborExited(exit(3)), Some(3), false);
        assert_eq!((o.class, o.harbor_exit_code), (OutcomeClass::Harbor, Some(3)));
        assert_eq!(o.exit_code, OutcomeClass::Harbor.exit_code());
        assert_eq!(o.message, "Harbor failed (exit code 3)");
        let f = Failure::new(OutcomeClass::EngineDied, "gone").with_cause("unhealthy").with_log_tail(tail());
        let o = outcome(End::Failed(f), Some(130), false);
        assert_eq!(
            (o.class, o.cause.as_deref(), o.harbor_exit_code),
            (OutcomeClass::EngineDied, Some("unhealthy"), Some(130))
        );
        assert_eq!(o.engine_log_tail, tail());
        let o = outcome(End::Signal(SignalEvent::Walltime), None, false);
        assert_eq!((o.class, o.signal.as_deref()), (OutcomeClass::Walltime, Some("SIGUSR1")));
        let o = outcome(End::Signal(SignalEvent::Shutdown(Signal::SIGTERM)), None, true);
        assert_eq!((o.class, o.exit_code), (OutcomeClass::Interrupted, 143));
        assert!(o.message.ends_with("(second signal: killed at once)"), "{}", o.message);
    }

    #[test]
    fn a_cancel_request_and_a_lost_engine_end_a_leg_with_their_own_class() {
        let mut m = Machine::new(false, false, 3, 60);
        m.on(Input::Readiness(Readiness::Ready), &tail);
        m.harbor_started();
        let a = m.on(Input::CancelRequested, &tail);
        assert!(matches!(&a[0], Action::Event(EventBody::CancelRequested(_))), "{a:?}");
        assert!(matches!(ends(&a), Some(End::Cancelled)));
        let o = outcome(End::Cancelled, Some(130), false);
        assert_eq!((o.class, o.cause.as_deref()), (OutcomeClass::Interrupted, Some("cancel_requested")));
        assert_eq!((o.exit_code, o.harbor_exit_code), (OutcomeClass::Interrupted.exit_code(), Some(130)));

        let mut m = Machine::new(false, false, 3, 60);
        m.on(Input::Readiness(Readiness::Ready), &tail);
        m.harbor_started();
        let lost = Failure::new(OutcomeClass::EngineDied, "the shared engine exited").with_cause("oom");
        let a = m.on(Input::EngineLost(lost.clone()), &tail);
        assert!(matches!(&a[0], Action::Event(EventBody::EngineLost(e)) if e.class == "engine_died"), "{a:?}");
        assert_eq!(failed(&a), &lost);
    }

    #[test]
    fn the_host_ends_when_its_legs_have_ended_once_they_run() {
        let mut m = Machine::new(false, false, 3, 60);
        assert!(m.on(Input::LegsEnded, &tail).is_empty(), "not before the legs started");
        m.on(Input::Readiness(Readiness::Ready), &tail);
        m.harbor_started();
        assert!(matches!(ends(&m.on(Input::LegsEnded, &tail)), Some(End::LegsEnded)));
        assert_eq!(outcome(End::LegsEnded, None, false).class, OutcomeClass::Finished);
    }

    /// Growth of vllm.log resets the stall window; only an unchanged size for the window ends the load.
    #[test]
    fn silent_load_is_stalled_growing_load_is_not() {
        let mut m = Machine::new(false, false, 3, 3000).with_load_stall_after(Duration::from_secs(10));
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let none = || Vec::new();
        for (s, bytes) in [(0, 100), (9, 100), (15, 200), (24, 300)] {
            assert!(m.on(Input::LoadProgress(at(s), bytes), &none).is_empty(), "at {s} s");
        }
        assert!(m.on(Input::LoadProgress(at(33), 300), &none).is_empty());
        let out = m.on(Input::LoadProgress(at(34), 300), &none);
        assert!(matches!(out.first(), Some(Action::Event(EventBody::EngineStalled(_)))), "{out:?}");
        match out.last() {
            Some(Action::End(End::Failed(f))) => {
                assert_eq!((f.class, f.cause.as_deref()), (OutcomeClass::EngineStart, Some("stalled")));
                assert!(f.message.contains("for 10 s"), "{}", f.message);
            }
            other => panic!("{other:?}"),
        }
    }

    /// The budget passing while the load progresses is an event, never an end: the run waits on
    /// to the cap, which then says so; a load silent for the window at the budget is stalled.
    #[test]
    fn a_budget_passed_with_progress_runs_on_to_the_cap() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let none = || Vec::new();
        let budgeted = || {
            Machine::new(false, false, 3, 3000)
                .with_load_stall_after(Duration::from_secs(10))
                .with_ready_budget(Some(Duration::from_secs(20)))
        };
        let mut m = budgeted();
        assert_eq!(m.budget_pending(), Some(Duration::from_secs(20)));
        assert!(m.on(Input::LoadProgress(at(15), 100), &none).is_empty());
        let out = m.on(Input::BudgetPassed(at(20), 200), &none);
        assert!(
            matches!(&out[..], [Action::Event(EventBody::ReadyBudgetExceeded(e)), Action::BudgetExceeded]
                if e.ready_budget_s == 20 && e.cap_s == 3000 && e.silent_for_s == 0),
            "{out:?}"
        );
        assert_eq!((m.budget_pending(), m.phase()), (None, RunPhase::Loading), "once, and still loading");
        let f = failed(&m.on(Input::ReadyDeadline, &none)).clone();
        assert_eq!(f.class, OutcomeClass::EngineTimeout);
        assert!(f.message.contains("ready budget of 20 s passed with the load still progressing"), "{}", f.message);

        let mut m = budgeted();
        m.on(Input::LoadProgress(at(5), 100), &none);
        let out = m.on(Input::BudgetPassed(at(20), 100), &none);
        assert!(matches!(out.first(), Some(Action::Event(EventBody::EngineStalled(_)))), "{out:?}");
        assert_eq!(failed(&out).cause.as_deref(), Some("stalled"));

        let m = Machine::new(false, false, 3, 60).with_ready_budget(Some(Duration::from_secs(60)));
        assert_eq!(m.budget_pending(), None, "a budget at the cap is the cap");
    }

    #[test]
    fn teardown_shape_follows_the_end() {
        let t = Timings {
            health_timeout: Duration::from_secs(60),
            ready_budget: None,
            hang_after: Duration::from_secs(600),
            load_stall_after: Duration::from_secs(300),
            teardown_grace: Duration::from_secs(20),
            heartbeat: Duration::from_secs(1),
            probe_interval: Duration::from_secs(1),
            walltime_lead: Duration::from_secs(900),
        };
        assert!(shutdown_plan(&End::Signal(SignalEvent::Shutdown(Signal::SIGINT)), &t).signalled);
        assert_eq!(shutdown_plan(&End::Signal(SignalEvent::Walltime), &t).harbor_grace, Duration::from_secs(450));
        let p = shutdown_plan(&End::HarborExited(exit(0)), &t);
        assert!(!p.signalled && p.harbor_grace == Duration::from_secs(15));
    }
}
