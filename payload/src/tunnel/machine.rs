//! One tunnel as a machine without I/O: [`Machine::step`] takes an [`Input`] (a tick, a line ssh
//! printed, ssh's exit, the check's result, the answer to an action) at a time the caller gives and
//! returns the [`Action`]s to do (spawn ssh, signal it, run the check, take or release a lease,
//! record an event, write a note). The driver (`super::Tunnel`) does the I/O and feeds the answers
//! back; `payload plan` steps the same machine once and shows its first actions.
//!
//! ```text
//!  Backoff ──due──▶ [Leasing] ──▶ Spawning ──▶ Starting ──banner / settled──▶ VerifyWait ──▶ Verifying ──ok──▶ Up
//!     ▲                                           │ (timeout: TERM)              ▲  (retry)     │ attempts spent: Failed
//!     └──────── ssh exited: fail over (Pinggy, before Harbor) or restart with backoff, bounded ─┴───────── (also from Up)
//! ```
//!
//! What differs between Pinggy and SOCKS is a [`Strategy`] (`super::strategy`): which target and
//! config the next attempt uses, when an attempt counts as connected, what the check is, and
//! Pinggy's pair failover.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use launch_spec::OutcomeClass;
use launch_spec::rundir::EventBody;
use launch_spec::rundir::events::{
    TunnelConnected, TunnelExited, TunnelFailed, TunnelRestart, TunnelSpawned, TunnelUp, TunnelUrlMismatch,
};
use serde_json::Value;

use super::output::Seen;
use crate::failure::Failure;

/// A tunnel up for this long has its consecutive-restart count reset.
pub(crate) const STABLE_AFTER: Duration = Duration::from_secs(120);
/// Longest pause between restarts.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Lease refresh period (well inside any sensible `lease_ttl_s`).
pub(crate) const LEASE_REFRESH: Duration = Duration::from_secs(30);

/// Restart delay: `base · 2^(n-1)`, capped at [`MAX_BACKOFF`].
pub(crate) fn backoff(base_s: f64, restart: u32) -> Duration {
    let secs = base_s.max(0.0) * 2f64.powi(restart.saturating_sub(1).min(16) as i32);
    // `try_from`: NaN or a huge base is the cap, never a panic (payload::timings refuses them first).
    Duration::try_from_secs_f64(secs).unwrap_or(MAX_BACKOFF).min(MAX_BACKOFF)
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Input {
    /// Time passed. `ready`: what the check needs is there (for Pinggy: vLLM ready, and the egress
    /// proxy up when the check goes through it).
    Tick { ready: bool },
    /// One line ssh printed (redacted by the driver).
    Line(String),
    /// ssh exited (its status, described).
    Exited(String),
    /// The check finished: a one-line summary, or why it failed.
    VerifyDone(Result<String, String>),
    /// The answer to [`Action::Spawn`]: ssh's pid, or (cause, message).
    Spawned(Result<u32, (&'static str, String)>),
    /// The answer to [`Action::AcquireLease`].
    Lease(LeaseAnswer),
    /// Harbor has the tunnel's URL: from now on the pair is fixed.
    Commit,
}

/// The answer to a lease request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LeaseAnswer {
    Acquired(PathBuf),
    /// A live job holds it: its description and the lease file's content.
    Held {
        holder: String,
        owner: Value,
    },
    /// The lease directory cannot be used (the job goes on without a lease).
    Unavailable(String),
}

/// The check to run once connected.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Check {
    /// One request to `url` through the SOCKS proxy on `127.0.0.1:port`.
    Socks { port: u16, url: String },
    /// `GET <public_url>/v1/models` with the per-job key must list `served_name`; through the
    /// SOCKS proxy on `via_socks` when the node has no direct egress.
    Models { public_url: String, served_name: String, via_socks: Option<u16> },
}

/// What to do.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Write `config` (the ssh config, 0600 in the private directory), then start ssh with `argv`.
    /// Answer with [`Input::Spawned`].
    Spawn { config: String, argv: Vec<String> },
    /// SIGTERM to ssh's process group (its exit arrives as [`Input::Exited`]).
    Term,
    /// Start the check; answer with [`Input::VerifyDone`].
    Verify(Check),
    /// Abandon a check in flight.
    CancelVerify,
    /// Try to lease `public_url` in `dir`; answer with [`Input::Lease`].
    AcquireLease { dir: PathBuf, public_url: String, ttl: Duration },
    /// Refresh the held lease's mtime.
    RefreshLease,
    /// Release the held lease.
    ReleaseLease,
    /// A record in `events.jsonl`.
    Event(EventBody),
    /// One line of payload's own in `tunnel.log`.
    Note(String),
}

/// What the next attempt is, as a strategy decides it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Next {
    /// Start ssh with this config and argv.
    Attempt { config: String, argv: Vec<String> },
    /// A lease must be tried first.
    Lease { dir: PathBuf, public_url: String, ttl: Duration },
    /// Nothing left to try (Pinggy: every pair skipped), or the config cannot be written.
    Stop { cause: &'static str, message: String },
}

/// The numbers a tunnel runs by (from its spec).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Limits {
    pub max_restarts: u32,
    pub(crate) backoff_s: f64,
    pub connect_timeout: Duration,
    pub verify_attempts: u32,
    pub(crate) verify_interval: Duration,
}

impl Limits {
    pub(crate) fn new(
        max_restarts: u32,
        backoff_s: f64,
        connect_s: f64,
        verify_attempts: u32,
        verify_interval_s: f64,
    ) -> Self {
        Self {
            max_restarts,
            backoff_s,
            connect_timeout: Duration::try_from_secs_f64(connect_s.max(1.0)).unwrap_or(Duration::from_secs(60)),
            verify_attempts: verify_attempts.max(1),
            verify_interval: Duration::try_from_secs_f64(verify_interval_s.max(0.05)).unwrap_or(Duration::from_secs(1)),
        }
    }
}

/// What differs between the kinds of tunnel.
pub(crate) trait Strategy: Send {
    fn kind(&self) -> &'static str;
    fn limits(&self) -> Limits;
    /// The next attempt (`out` takes the events of choices made on the way).
    fn next_attempt(&mut self, out: &mut Vec<Action>) -> Next;
    /// The answer to a lease this strategy asked for.
    fn on_lease(&mut self, _answer: LeaseAnswer, _out: &mut Vec<Action>) {}
    /// What the current attempt printed so far (after each line).
    fn on_output(&mut self, _seen: &Seen) {}
    /// Whether the session must be ended now (Pinggy: the lock message, "not authenticated").
    fn end_session(&self, _seen: &Seen) -> bool {
        false
    }
    /// Whether the attempt counts as connected.
    fn connected(&self, seen: &Seen, elapsed: Duration) -> bool;
    fn check(&self) -> Check;
    /// ssh exited with `cause` before Harbor had the URL: `true` when the strategy moves to another
    /// target instead of counting a restart (Pinggy's pair failover).
    fn fail_over(&mut self, _cause: &'static str, _out: &mut Vec<Action>) -> bool {
        false
    }
    /// A restart of the same target follows.
    fn before_restart(&mut self) {}
    /// Whether the next attempt uses Pinggy's `force` keyword.
    fn forcing(&self) -> bool {
        false
    }
    fn holds_lease(&self) -> bool {
        false
    }
    /// The public URL in use (Pinggy), without a trailing slash.
    fn public_url(&self) -> Option<String> {
        None
    }
    /// The local SOCKS port (SOCKS).
    fn socks_port(&self) -> Option<u16> {
        None
    }
}

/// Where the machine is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum State {
    Backoff { until: Instant },
    Leasing,
    Spawning,
    Starting { since: Instant },
    VerifyWait { until: Instant, attempt: u32 },
    Verifying { attempt: u32 },
    Up,
    Failed(Failure),
}

/// The machine's answer to "how is it going".
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Phase {
    Pending,
    Up,
    Failed(Failure),
}

pub(crate) struct Machine {
    strategy: Box<dyn Strategy>,
    limits: Limits,
    state: State,
    seen: Seen,
    restarts: u32,
    attempts: u32,
    argv: Vec<String>,
    up_since: Option<Instant>,
    ever_up: bool,
    started: Instant,
    committed: bool,
    last_refresh: Instant,
    term_sent: bool,
}

impl Machine {
    /// A machine whose first tick starts the first attempt.
    pub(crate) fn new(strategy: Box<dyn Strategy>, now: Instant) -> Self {
        Self {
            limits: strategy.limits(),
            strategy,
            state: State::Backoff { until: now },
            seen: Seen::default(),
            restarts: 0,
            attempts: 0,
            argv: Vec::new(),
            up_since: None,
            ever_up: false,
            started: now,
            committed: false,
            last_refresh: now,
            term_sent: false,
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        self.strategy.kind()
    }

    #[cfg(test)] // used only by the tests
    pub(crate) fn state(&self) -> &State {
        &self.state
    }

    pub(crate) fn phase(&self) -> Phase {
        match &self.state {
            State::Up => Phase::Up,
            State::Failed(f) => Phase::Failed(f.clone()),
            _ => Phase::Pending,
        }
    }

    pub(crate) fn public_url(&self) -> Option<String> {
        self.strategy.public_url()
    }

    pub(crate) fn socks_port(&self) -> Option<u16> {
        self.strategy.socks_port()
    }

    #[cfg(test)] // used only by the tests
    pub(crate) fn holds_lease(&self) -> bool {
        self.strategy.holds_lease()
    }

    /// Whether an ssh of this machine may be running (its exit then matters).
    fn ssh_alive(&self) -> bool {
        matches!(self.state, State::Starting { .. } | State::VerifyWait { .. } | State::Verifying { .. } | State::Up)
    }

    /// Advances the machine by one input at `now`.
    pub(crate) fn step(&mut self, now: Instant, input: Input) -> Vec<Action> {
        let mut out = Vec::new();
        if matches!(self.state, State::Failed(_)) {
            return out;
        }
        match input {
            Input::Line(line) => {
                self.seen.note(&line);
                self.strategy.on_output(&self.seen);
                if self.ssh_alive() && !self.term_sent && self.strategy.end_session(&self.seen) {
                    // Pinggy may keep the session open after the message: end it; the exit decides.
                    self.term_sent = true;
                    out.push(Action::Term);
                }
            }
            Input::Exited(status) if self.ssh_alive() => self.on_exit(now, &status, &mut out),
            Input::Exited(_) => {}
            Input::Tick { ready } => self.on_tick(now, ready, &mut out),
            Input::VerifyDone(result) => {
                if let State::Verifying { attempt } = self.state {
                    self.on_verified(now, attempt, result, &mut out);
                }
            }
            Input::Spawned(result) => {
                if self.state == State::Spawning {
                    self.on_spawned(now, result, &mut out);
                }
            }
            Input::Lease(answer) => {
                if self.state == State::Leasing {
                    self.strategy.on_lease(answer, &mut out);
                    self.attempt(&mut out);
                }
            }
            Input::Commit => self.committed = true,
        }
        out
    }

    fn on_tick(&mut self, now: Instant, ready: bool, out: &mut Vec<Action>) {
        match self.state.clone() {
            State::Backoff { until } if now >= until => self.attempt(out),
            State::Starting { since } => {
                let elapsed = now.saturating_duration_since(since);
                if self.strategy.connected(&self.seen, elapsed) {
                    let urls = self.seen.urls.clone();
                    out.push(Action::Event(
                        TunnelConnected {
                            kind: self.kind().to_string(),
                            authenticated: self.seen.authenticated,
                            urls: urls.clone(),
                            elapsed_ms: elapsed.as_millis() as u64,
                        }
                        .into(),
                    ));
                    if let Some(url) = self.public_url()
                        && !urls.is_empty()
                        && !urls.iter().any(|u| same_host(u, &url))
                    {
                        out.push(Action::Note(format!(
                            "warning: the server announced {} but this pair's public URL is {url}",
                            urls.join(", ")
                        )));
                        out.push(Action::Event(TunnelUrlMismatch { announced: urls, public_url: url }.into()));
                    }
                    self.state = State::VerifyWait { until: now, attempt: 0 };
                } else if elapsed > self.limits.connect_timeout && !self.term_sent {
                    self.seen.imposed = Some("connect_timeout");
                    self.term_sent = true;
                    out.push(Action::Note(format!(
                        "no connection within {:.0} s; stopping this attempt",
                        self.limits.connect_timeout.as_secs_f64()
                    )));
                    out.push(Action::Term);
                }
            }
            State::VerifyWait { until, attempt } if now >= until && ready => {
                out.push(Action::Verify(self.strategy.check()));
                self.state = State::Verifying { attempt };
            }
            _ => {}
        }
        if now.saturating_duration_since(self.last_refresh) >= LEASE_REFRESH {
            self.last_refresh = now;
            if self.strategy.holds_lease() {
                out.push(Action::RefreshLease);
            }
        }
    }

    /// The next attempt: a lease first, a spawn, or the end.
    fn attempt(&mut self, out: &mut Vec<Action>) {
        match self.strategy.next_attempt(out) {
            Next::Lease { dir, public_url, ttl } => {
                out.push(Action::AcquireLease { dir, public_url, ttl });
                self.state = State::Leasing;
            }
            Next::Attempt { config, argv } => {
                self.seen = Seen::default();
                self.term_sent = false;
                self.argv = argv.clone();
                out.push(Action::Spawn { config, argv });
                self.state = State::Spawning;
            }
            Next::Stop { cause, message } => self.fail(cause, message, out),
        }
    }

    fn on_spawned(&mut self, now: Instant, result: Result<u32, (&'static str, String)>, out: &mut Vec<Action>) {
        match result {
            Ok(pid) => {
                self.attempts += 1;
                let url = self.public_url();
                let force = self.strategy.forcing();
                out.push(Action::Event(
                    TunnelSpawned {
                        kind: self.kind().to_string(),
                        pid,
                        argv: self.argv.clone(),
                        attempt: self.attempts,
                        public_url: url.clone(),
                        force,
                    }
                    .into(),
                ));
                out.push(Action::Note(format!(
                    "attempt {}: {}{}{}",
                    self.attempts,
                    shell_words::join(&self.argv),
                    url.map(|u| format!(" (public URL {u})")).unwrap_or_default(),
                    if force { " (with Pinggy's force keyword: replaces our own stale session)" } else { "" }
                )));
                self.state = State::Starting { since: now };
            }
            Err((cause, message)) => self.fail(cause, message, out),
        }
    }

    fn on_verified(&mut self, now: Instant, attempt: u32, result: Result<String, String>, out: &mut Vec<Action>) {
        match result {
            Ok(summary) => {
                self.up_since = Some(now);
                self.ever_up = true;
                out.push(Action::Event(
                    TunnelUp {
                        kind: self.kind().to_string(),
                        public_url: self.public_url(),
                        socks_port: self.socks_port(),
                        check: summary.clone(),
                        attempt: self.attempts,
                        elapsed_ms: now.saturating_duration_since(self.started).as_millis() as u64,
                    }
                    .into(),
                ));
                out.push(Action::Note(format!("verified: {summary}")));
                self.state = State::Up;
            }
            Err(e) => {
                let attempt = attempt + 1;
                out.push(Action::Note(format!("check {attempt}/{} failed: {e}", self.limits.verify_attempts)));
                if attempt >= self.limits.verify_attempts {
                    let message = format!("{} tunnel check failed {attempt} time(s); last: {e}", self.kind());
                    self.fail("verify_failed", message, out);
                } else {
                    self.state = State::VerifyWait { until: now + self.limits.verify_interval, attempt };
                }
            }
        }
    }

    /// ssh exited: fail over to another target, restart with backoff, or give up.
    fn on_exit(&mut self, now: Instant, status: &str, out: &mut Vec<Action>) {
        let cause = super::output::cause(&self.seen);
        let detail = self.seen.last_problem.clone();
        if matches!(self.state, State::Verifying { .. }) {
            out.push(Action::CancelVerify);
        }
        out.push(Action::Event(
            TunnelExited {
                kind: self.kind().to_string(),
                status: status.to_string(),
                cause: cause.to_string(),
                attempt: self.attempts,
                detail: detail.clone(),
            }
            .into(),
        ));
        out.push(Action::Note(format!(
            "ssh exited ({status}), cause {cause}{}",
            detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default()
        )));
        if !self.committed && self.strategy.fail_over(cause, out) {
            self.state = State::Backoff { until: now };
            return;
        }
        if self.up_since.is_some_and(|t| now.saturating_duration_since(t) >= STABLE_AFTER) {
            self.restarts = 0;
        }
        self.up_since = None;
        self.restarts += 1;
        if self.restarts > self.limits.max_restarts {
            let what = if self.ever_up { "dropped and could not be restored" } else { "could not be established" };
            let message = format!(
                "{} tunnel {what} after {} restart(s): {cause}{}",
                self.kind(),
                self.limits.max_restarts,
                detail.map(|d| format!(" ({d})")).unwrap_or_default()
            );
            self.fail(cause, message, out);
            return;
        }
        self.strategy.before_restart();
        let wait = backoff(self.limits.backoff_s, self.restarts);
        out.push(Action::Event(
            TunnelRestart {
                kind: self.kind().to_string(),
                restart: self.restarts,
                max_restarts: self.limits.max_restarts,
                in_s: wait.as_secs_f64(),
                cause: cause.to_string(),
            }
            .into(),
        ));
        out.push(Action::Note(format!(
            "restart {}/{} in {:.1} s",
            self.restarts,
            self.limits.max_restarts,
            wait.as_secs_f64()
        )));
        self.state = State::Backoff { until: now + wait };
    }

    fn fail(&mut self, cause: &str, message: String, out: &mut Vec<Action>) {
        if matches!(self.state, State::Verifying { .. }) {
            out.push(Action::CancelVerify);
        }
        out.push(Action::Event(
            TunnelFailed { kind: self.kind().to_string(), cause: cause.to_string(), message: message.clone() }.into(),
        ));
        out.push(Action::Note(format!("giving up: {message} (cause {cause})")));
        self.state = State::Failed(Failure::new(OutcomeClass::Tunnel, message).with_cause(cause.to_string()));
    }
}

/// Whether two URLs name the same host (an unparsable one is compared as text).
fn same_host(a: &str, b: &str) -> bool {
    match (url::Url::parse(a), url::Url::parse(b)) {
        (Ok(a), Ok(b)) => a.host_str().is_some() && a.host_str() == b.host_str(),
        _ => a.contains(b),
    }
}

#[cfg(test)]
mod tests {
    //! Every state's transitions, driven with the real strategies and a synthetic clock.
    use super::*;
    use crate::tunnel::strategy::{Paths, Pinggy, PinggyTarget, Socks};
    use launch_spec::spec::{PinggySpec, SocksSpec};
    use serde_json::json;
    use std::collections::BTreeMap;

    fn paths() -> Paths {
        Paths { config: "/p/ssh_config".into(), known_hosts: PathBuf::from("/p/known_hosts") }
    }

    fn socks_spec() -> SocksSpec {
        serde_json::from_value(json!({ "login_node": "login05", "verify_url": "http://127.0.0.1:9/x",
            "max_restarts": 2, "restart_backoff_s": 1.0, "verify_attempts": 2, "verify_interval_s": 3.0 }))
        .unwrap()
    }

    fn socks() -> Machine {
        let s = Socks { spec: socks_spec(), port: 40001, ssh: "/usr/bin/ssh".into(), paths: paths() };
        Machine::new(Box::new(s), t0())
    }

    fn pinggy_spec(lock_dir: bool) -> PinggySpec {
        let mut v = json!({ "host": "pro.pinggy.io", "public_url": "https://a.a.pinggy.link", "token_secret": "TA",
            "bank": [{"public_url": "https://b.a.pinggy.link", "token_secret": "TB"}],
            "max_restarts": 1, "restart_backoff_s": 2.0, "connect_timeout_s": 1.0, "verify_attempts": 1 });
        if lock_dir {
            v["lock_dir"] = json!("/state/pinggy");
        }
        serde_json::from_value(v).unwrap()
    }

    fn pinggy_with(spec: PinggySpec, tokens: &[(&str, &str)], egress: Option<(SocksSpec, u16)>) -> Machine {
        let p = Pinggy::new(
            &spec,
            PinggyTarget {
                ssh: "ssh".into(),
                paths: paths(),
                tokens: tokens.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
                // job id 2 over 2 pairs: a first, then b.
                job_id: "2".into(),
                engine_host: "127.0.0.1".into(),
                engine_port: 23456,
                served_name: "Qwen3-8B".into(),
                egress,
            },
        );
        Machine::new(Box::new(p), t0())
    }

    fn pinggy() -> Machine {
        pinggy_with(pinggy_spec(false), &[("TA", "tokA"), ("TB", "tokB")], None)
    }

    fn t0() -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now)
    }

    fn at(ms: u64) -> Instant {
        t0() + Duration::from_millis(ms)
    }

    fn events(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| if let Action::Event(e) = a { Some(e.kind().as_str().to_string()) } else { None })
            .collect()
    }

    fn spawn_of(actions: &[Action]) -> (&str, &[String]) {
        actions
            .iter()
            .find_map(|a| {
                if let Action::Spawn { config, argv } = a { Some((config.as_str(), argv.as_slice())) } else { None }
            })
            .unwrap_or_else(|| panic!("no spawn in {actions:?}"))
    }

    /// Ticks the machine from Backoff to Starting (spawned as pid 100).
    fn start(m: &mut Machine, ms: u64) -> Vec<Action> {
        let mut a = m.step(at(ms), Input::Tick { ready: false });
        a.extend(m.step(at(ms), Input::Spawned(Ok(100))));
        assert!(matches!(m.state(), State::Starting { .. }), "{:?}", m.state());
        a
    }

    /// From Starting to Up (SOCKS settles after 200 ms; `ready` for Pinggy).
    fn up(m: &mut Machine, ms: u64) {
        m.step(at(ms + 2500), Input::Tick { ready: true });
        let a = m.step(at(ms + 2600), Input::Tick { ready: true });
        assert!(a.iter().any(|x| matches!(x, Action::Verify(_))), "{a:?}");
        m.step(at(ms + 2700), Input::VerifyDone(Ok("ok".into())));
        assert_eq!(m.phase(), Phase::Up);
    }

    #[test]
    fn backoff_starts_an_attempt_when_due_and_waits_before() {
        let mut m = socks();
        assert!(matches!(m.state(), State::Backoff { .. }));
        let a = m.step(at(0), Input::Tick { ready: false });
        let (config, argv) = spawn_of(&a);
        assert_eq!(argv, ["/usr/bin/ssh", "-F", "/p/ssh_config", "-N", "-D", "127.0.0.1:40001", "payload-socks"]);
        assert!(config.contains("  HostName login05\n") && config.contains("  BatchMode yes\n"), "{config}");
        assert_eq!(m.state(), &State::Spawning);
        // After an exit: backoff 1 s; a tick before that does nothing.
        m.step(at(0), Input::Spawned(Ok(7)));
        m.step(at(10), Input::Exited("exit status 255".into()));
        assert_eq!(m.state(), &State::Backoff { until: at(1010) });
        assert!(m.step(at(500), Input::Tick { ready: true }).is_empty());
        assert!(matches!(spawn_of(&m.step(at(1010), Input::Tick { ready: true })).1[0].as_str(), "/usr/bin/ssh"));
    }

    #[test]
    fn spawning_records_the_attempt_or_fails_as_spawn() {
        let mut m = socks();
        m.step(at(0), Input::Tick { ready: false });
        let a = m.step(at(0), Input::Spawned(Ok(4242)));
        assert_eq!(events(&a), ["tunnel_spawned"]);
        assert!(a.iter().any(|x| matches!(x, Action::Note(n) if n.starts_with("attempt 1: /usr/bin/ssh -F"))), "{a:?}");
        assert_eq!(m.state(), &State::Starting { since: at(0) });
        let mut m = socks();
        m.step(at(0), Input::Tick { ready: false });
        let a = m.step(at(0), Input::Spawned(Err(("spawn", "cannot start ssh: ENOENT".into()))));
        assert_eq!(events(&a), ["tunnel_failed"]);
        let Phase::Failed(f) = m.phase() else { panic!() };
        assert_eq!((f.class, f.cause.as_deref()), (OutcomeClass::Tunnel, Some("spawn")));
    }

    #[test]
    fn starting_connects_on_settle_or_banner_and_stops_on_timeout() {
        // SOCKS: connected once ssh lived 200 ms.
        let mut m = socks();
        start(&mut m, 0);
        assert!(m.step(at(100), Input::Tick { ready: true }).is_empty());
        assert_eq!(events(&m.step(at(250), Input::Tick { ready: true })), ["tunnel_connected"]);
        assert_eq!(m.state(), &State::VerifyWait { until: at(250), attempt: 0 });
        // Pinggy: the banner connects at once; an announced URL of another host is noted.
        let mut m = pinggy();
        start(&mut m, 0);
        m.step(at(10), Input::Line("You are authenticated as x@example.com".into()));
        m.step(at(10), Input::Line("https://other.a.pinggy.link".into()));
        let a = m.step(at(20), Input::Tick { ready: false });
        assert_eq!(events(&a), ["tunnel_connected", "tunnel_url_mismatch"]);
        // Pinggy without a banner: 1 s connect timeout < 2 s settle → TERM once, cause connect_timeout.
        let mut m = pinggy();
        start(&mut m, 0);
        assert!(m.step(at(900), Input::Tick { ready: false }).is_empty());
        let a = m.step(at(1100), Input::Tick { ready: false });
        assert!(a.contains(&Action::Term), "{a:?}");
        assert!(!m.step(at(1200), Input::Tick { ready: false }).contains(&Action::Term));
        let a = m.step(at(1300), Input::Exited("signal 15".into()));
        let exited =
            a.iter().find_map(|x| if let Action::Event(EventBody::TunnelExited(e)) = x { Some(e) } else { None });
        assert_eq!(exited.unwrap().cause, "connect_timeout");
        assert_eq!(events(&a), ["tunnel_exited", "tunnel_restart"]);
    }

    #[test]
    fn verify_wait_runs_the_check_when_ready_and_due() {
        let mut m = pinggy_with(pinggy_spec(false), &[("TA", "tokA")], Some((socks_spec(), 40007)));
        start(&mut m, 0);
        m.step(at(2100), Input::Tick { ready: false });
        assert!(matches!(m.state(), State::VerifyWait { .. }));
        // vLLM not ready (or the egress proxy not up): no check yet.
        assert!(m.step(at(2200), Input::Tick { ready: false }).is_empty());
        let a = m.step(at(2300), Input::Tick { ready: true });
        assert_eq!(
            a,
            [Action::Verify(Check::Models {
                public_url: "https://a.a.pinggy.link".into(),
                served_name: "Qwen3-8B".into(),
                via_socks: Some(40007)
            })]
        );
        assert_eq!(m.state(), &State::Verifying { attempt: 0 });
    }

    #[test]
    fn verifying_goes_up_retries_after_the_interval_and_fails_when_spent() {
        let mut m = socks();
        start(&mut m, 0);
        m.step(at(300), Input::Tick { ready: true });
        m.step(at(400), Input::Tick { ready: true });
        let a = m.step(at(500), Input::VerifyDone(Err("refused".into())));
        assert!(a.iter().any(|x| matches!(x, Action::Note(n) if n == "check 1/2 failed: refused")), "{a:?}");
        assert_eq!(m.state(), &State::VerifyWait { until: at(3500), attempt: 1 });
        assert!(m.step(at(3000), Input::Tick { ready: true }).is_empty());
        assert!(matches!(
            m.step(at(3500), Input::Tick { ready: true })[..],
            [Action::Verify(Check::Socks { port: 40001, .. })]
        ));
        let a = m.step(at(3600), Input::VerifyDone(Err("refused".into())));
        assert_eq!(events(&a), ["tunnel_failed"]);
        let Phase::Failed(f) = m.phase() else { panic!() };
        assert_eq!(f.cause.as_deref(), Some("verify_failed"));
        assert!(f.message.contains("socks tunnel check failed 2 time(s); last: refused"), "{}", f.message);
        // Up on success, with the summary in the note; an exit while checking cancels the check.
        let mut m = socks();
        start(&mut m, 0);
        up(&mut m, 0);
        let mut m = socks();
        start(&mut m, 0);
        m.step(at(300), Input::Tick { ready: true });
        m.step(at(400), Input::Tick { ready: true });
        let a = m.step(at(450), Input::Exited("exit status 255".into()));
        assert_eq!(a[0], Action::CancelVerify);
    }

    #[test]
    fn up_restarts_with_backoff_resets_when_stable_and_gives_up() {
        let mut m = socks();
        start(&mut m, 0);
        up(&mut m, 0);
        // Dropped: restart 1 in 1 s, 2 in 2 s, then (max 2) failed.
        let a = m.step(at(3000), Input::Exited("exit status 255".into()));
        assert_eq!(events(&a), ["tunnel_exited", "tunnel_restart"]);
        assert_eq!(m.state(), &State::Backoff { until: at(4000) });
        start(&mut m, 4000);
        up(&mut m, 4000);
        // Up for longer than STABLE_AFTER: the count starts again (restart 1, 1 s).
        let later = 4000 + 2700 + STABLE_AFTER.as_millis() as u64;
        m.step(at(later), Input::Exited("exit status 255".into()));
        assert_eq!(m.state(), &State::Backoff { until: at(later + 1000) });
        start(&mut m, later + 1000);
        m.step(at(later + 1100), Input::Exited("exit status 255".into()));
        assert_eq!(m.state(), &State::Backoff { until: at(later + 3100) });
        start(&mut m, later + 3100);
        m.step(at(later + 3150), Input::Line("ssh: connect to host login05 port 22: Connection refused".into()));
        let a = m.step(at(later + 3200), Input::Exited("exit status 255".into()));
        assert_eq!(events(&a), ["tunnel_exited", "tunnel_failed"]);
        let Phase::Failed(f) = m.phase() else { panic!() };
        assert_eq!(f.cause.as_deref(), Some("connect_failed"));
        assert!(f.message.contains("dropped and could not be restored after 2 restart(s)"), "{}", f.message);
    }

    #[test]
    fn leasing_skips_held_pairs_and_goes_on_without_a_usable_lease_dir() {
        let mut m = pinggy_with(pinggy_spec(true), &[("TA", "tokA"), ("TB", "tokB")], None);
        let a = m.step(at(0), Input::Tick { ready: false });
        assert!(
            matches!(&a[..], [Action::AcquireLease { public_url, .. }] if public_url == "https://a.a.pinggy.link"),
            "{a:?}"
        );
        assert_eq!(m.state(), &State::Leasing);
        let a = m.step(at(0), Input::Lease(LeaseAnswer::Held { holder: "job 9".into(), owner: json!({}) }));
        assert_eq!(events(&a), ["tunnel_pair_skipped"]);
        assert!(matches!(&a[1], Action::AcquireLease { public_url, .. } if public_url == "https://b.a.pinggy.link"));
        let a = m.step(at(0), Input::Lease(LeaseAnswer::Acquired("/state/pinggy/b.lease".into())));
        assert_eq!(events(&a), ["tunnel_pair"]);
        assert!(spawn_of(&a).0.contains("  User tokB\n"));
        assert!(m.holds_lease());
        assert_eq!(m.public_url().as_deref(), Some("https://b.a.pinggy.link"));
        // The held lease is refreshed every 30 s.
        m.step(at(0), Input::Spawned(Ok(1)));
        assert!(m.step(at(31_000), Input::Tick { ready: false }).contains(&Action::RefreshLease));
        // A lease dir that cannot be used: the pair is taken without a lease.
        let mut m = pinggy_with(pinggy_spec(true), &[("TA", "tokA")], None);
        m.step(at(0), Input::Tick { ready: false });
        let a = m.step(at(0), Input::Lease(LeaseAnswer::Unavailable("read-only".into())));
        assert_eq!(events(&a), ["tunnel_lease_unavailable", "tunnel_pair"]);
        assert!(!m.holds_lease());
        assert_eq!(m.state(), &State::Spawning);
    }

    #[test]
    fn lock_message_before_harbor_fails_over_and_after_commit_restarts_with_force() {
        let mut m = pinggy_with(pinggy_spec(true), &[("TA", "tokA"), ("TB", "tokB")], None);
        m.step(at(0), Input::Tick { ready: false });
        m.step(at(0), Input::Lease(LeaseAnswer::Acquired("/l/a".into())));
        m.step(at(0), Input::Spawned(Ok(1)));
        let a = m.step(at(50), Input::Line("A tunnel with the same token is already active.".into()));
        assert_eq!(a, [Action::Term]);
        let a = m.step(at(60), Input::Exited("signal 15".into()));
        assert!(a.contains(&Action::ReleaseLease), "{a:?}");
        assert_eq!(events(&a), ["tunnel_exited", "tunnel_pair_skipped"]);
        assert_eq!(m.state(), &State::Backoff { until: at(60) });
        let a = m.step(at(60), Input::Tick { ready: false });
        assert!(matches!(&a[..], [Action::AcquireLease { public_url, .. }] if public_url == "https://b.a.pinggy.link"));
        m.step(at(60), Input::Lease(LeaseAnswer::Acquired("/l/b".into())));
        m.step(at(60), Input::Spawned(Ok(2)));
        m.step(at(70), Input::Line("You are authenticated as x".into()));
        up(&mut m, 70);
        m.step(at(3000), Input::Commit);
        // After Harbor has the URL the pair is fixed: a drop restarts it, with `force`.
        let a = m.step(at(4000), Input::Exited("exit status 255".into()));
        assert_eq!(events(&a), ["tunnel_exited", "tunnel_restart"]);
        let a = m.step(at(6000), Input::Tick { ready: false });
        assert!(spawn_of(&a).0.contains("  User tokB+force\n"), "{a:?}");
        let a = m.step(at(6000), Input::Spawned(Ok(3)));
        assert!(a.iter().any(|x| matches!(x, Action::Note(n) if n.contains("force keyword"))), "{a:?}");
    }

    #[test]
    fn an_exhausted_bank_fails_with_the_reason() {
        // No token for either pair: bank_exhausted, each pair skipped.
        let mut m = pinggy_with(pinggy_spec(false), &[], None);
        let a = m.step(at(0), Input::Tick { ready: false });
        assert_eq!(events(&a), ["tunnel_pair_skipped", "tunnel_pair_skipped", "tunnel_failed"]);
        let Phase::Failed(f) = m.phase() else { panic!() };
        assert_eq!(f.cause.as_deref(), Some("bank_exhausted"));
        assert!(f.message.contains("https://a.a.pinggy.link: secret TA not in the secrets file"), "{}", f.message);
        // The only pair locked: token_locked.
        let mut m = pinggy_with(pinggy_spec(false), &[("TA", "tokA")], None);
        start(&mut m, 0);
        m.step(at(10), Input::Line("You are not authenticated.".into()));
        m.step(at(20), Input::Exited("exit status 1".into()));
        m.step(at(20), Input::Tick { ready: false });
        let Phase::Failed(f) = m.phase() else { panic!() };
        assert_eq!(f.cause.as_deref(), Some("not_authenticated"));
    }

    #[test]
    fn failed_takes_no_more_input() {
        let mut m = pinggy_with(pinggy_spec(false), &[], None);
        m.step(at(0), Input::Tick { ready: false });
        assert!(matches!(m.state(), State::Failed(_)));
        for input in [
            Input::Tick { ready: true },
            Input::Line("You are authenticated as x".into()),
            Input::Exited("exit status 0".into()),
            Input::VerifyDone(Ok("x".into())),
            Input::Spawned(Ok(1)),
        ] {
            assert!(m.step(at(100), input).is_empty());
        }
    }

    #[test]
    fn pinggy_through_the_login_node_jumps_and_checks_via_the_proxy() {
        let mut m = pinggy_with(pinggy_spec(false), &[("TA", "tokA")], Some((socks_spec(), 40007)));
        let a = m.step(at(0), Input::Tick { ready: false });
        let (config, argv) = spawn_of(&a);
        assert_eq!(argv[argv.len() - 1], "payload-pinggy");
        assert!(config.contains("Host payload-pinggy\n"), "{config}");
        assert!(config.contains("  ProxyJump payload-socks\n"), "{config}");
        assert!(config.contains("Host payload-socks\n  HostName login05\n"), "{config}");
        assert_eq!(config.matches("# Generated").count(), 1, "{config}");
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(2.0, 1), Duration::from_secs(2));
        assert_eq!(backoff(2.0, 3), Duration::from_secs(8));
        assert_eq!(backoff(1e20, 3), MAX_BACKOFF);
        assert_eq!(backoff(f64::NAN, 1), Duration::ZERO);
        assert_eq!(backoff(2.0, 40), MAX_BACKOFF);
        assert!(same_host("https://a.a.pinggy.link/", "https://a.a.pinggy.link"));
        assert!(!same_host("http://b.a.pinggy.link", "https://a.a.pinggy.link"));
    }
}
