//! Supervision (docs/design.md §6.7), all in this one module:
//!
//! - payload is a **child subreaper** (`prctl`), so double-forked grandchildren re-parent to it;
//! - every child (vLLM, Harbor, tunnel) runs in **its own process group** (`process_group(0)`),
//!   and all signalling goes to the group (`killpg`);
//! - the runtime is tokio's **current-thread** flavour (see `main.rs`), so every fork comes from
//!   the main thread;
//! - **signal handlers** (TERM, INT, HUP, USR1, CONT) are registered before anything is spawned;
//! - signals reach the run through a [`SignalSource`]: the real [`Signals`], or in tests one that
//!   never fires ([`NoSignals`], like nextest's no-op handler) or fires on demand;
//! - **teardown**: TERM to Harbor first (it cancels trials and cleans its sandboxes), then vLLM, then
//!   the tunnel, inside `limits.teardown_grace_s` (which must fit inside Slurm's KillWait); then
//!   SIGKILL to every group and a **sweep** of every remaining descendant (walk `/proc`, kill, reap
//!   our direct children by pid — never a blanket `waitpid(-1)` beside tokio's reaper). A second
//!   TERM/INT during teardown means kill now. SIGCONT (sent by Slurm with every signal) is ignored.
//! - the **post-run step** (crate::postrun) starts only after that teardown, as the one child left;
//!   the same teardown (stage 2) stops it at its timeout or a signal.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{sleep, sleep_until};

/// Process groups of the children spawned so far, for [`emergency_teardown`] (a panic hook cannot
/// reach the [`Supervisor`]).
static GROUPS: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// Last resort when payload panics: SIGKILL every child group and every remaining descendant, at
/// once and synchronously (the panic hook calls it; the orderly teardown cannot run any more).
/// Never blocks on the registry lock (a panic while it is held skips the groups; the sweep of
/// descendants still runs).
pub fn emergency_teardown() {
    let groups = GROUPS.try_lock().map(|g| g.clone()).unwrap_or_default();
    kill_now(&groups, std::process::id() as i32);
}

/// SIGKILL to each group in `groups` that still has a member among `root`'s descendants (a gone
/// group's id may belong to someone else by now), and to every descendant of `root` (listed first,
/// so a child whose parent dies meanwhile is not lost to re-parenting).
pub(crate) fn kill_now(groups: &[i32], root: i32) {
    let before = descendants(&proc_table(), root);
    let live: HashSet<i32> = before.iter().map(|p| p.pgrp).collect();
    for pgid in groups.iter().filter(|g| live.contains(g)) {
        let _ = killpg(Pid::from_raw(*pgid), Signal::SIGKILL);
    }
    for p in before.iter().chain(descendants(&proc_table(), root).iter()) {
        let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
    }
}

/// Makes payload the reaper of orphaned descendants (`PR_SET_CHILD_SUBREAPER`).
pub(crate) fn become_subreaper() -> Result<(), nix::Error> {
    nix::sys::prctl::set_child_subreaper(true)
}

/// What a received signal means for the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalEvent {
    /// TERM, INT, HUP: tear down and exit 128+n.
    Shutdown(Signal),
    /// USR1 (`--signal=B:USR1@<lead>`): the walltime is near — wind down gracefully.
    Walltime,
}

/// Where the run's signals come from (real ones, or a test's).
pub trait SignalSource {
    /// The next meaningful signal. Cancel-safe.
    fn recv(&mut self) -> impl std::future::Future<Output = SignalEvent>;
}

impl SignalSource for Signals {
    async fn recv(&mut self) -> SignalEvent {
        Signals::recv(self).await
    }
}

/// A source borrowed: a pool's engine starts, one after another, read the one set of handlers.
impl<S: SignalSource> SignalSource for &mut S {
    async fn recv(&mut self) -> SignalEvent {
        (**self).recv().await
    }
}

/// A source that never fires (tests that do not exercise signals).
#[derive(Debug, Default)]
pub struct NoSignals;

impl SignalSource for NoSignals {
    async fn recv(&mut self) -> SignalEvent {
        std::future::pending().await
    }
}

/// Signals sent by the test through a channel.
#[derive(Debug)]
pub struct ChannelSignals(pub tokio::sync::mpsc::UnboundedReceiver<SignalEvent>);

impl SignalSource for ChannelSignals {
    async fn recv(&mut self) -> SignalEvent {
        match self.0.recv().await {
            Some(ev) => ev,
            None => std::future::pending().await,
        }
    }
}

/// The signal streams, registered once at start-up (before any child exists). Once registered,
/// tokio never restores the default disposition, so payload always exits by itself.
pub(crate) struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    cont: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn register() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
            usr1: signal(SignalKind::user_defined1())?,
            cont: signal(SignalKind::from_raw(libc::SIGCONT))?,
        })
    }

    /// The next meaningful signal (SIGCONT is swallowed). Cancel-safe.
    pub(crate) async fn recv(&mut self) -> SignalEvent {
        loop {
            tokio::select! {
                _ = self.term.recv() => return SignalEvent::Shutdown(Signal::SIGTERM),
                _ = self.int.recv() => return SignalEvent::Shutdown(Signal::SIGINT),
                _ = self.hup.recv() => return SignalEvent::Shutdown(Signal::SIGHUP),
                _ = self.usr1.recv() => return SignalEvent::Walltime,
                _ = self.cont.recv() => tracing::debug!("SIGCONT ignored"),
            }
        }
    }
}

/// The supervised children, in teardown order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Role {
    Harbor,
    Engine,
    /// A multi-node engine's other nodes: the one `srun` step of their ranks (crate::multinode).
    /// SIGTERM to srun is forwarded to every task; stopped with the head.
    Ranks,
    Tunnel,
    /// The egress proxy of a job that also runs a Pinggy tunnel (crate::tunnel), torn down after it.
    Egress,
    /// The post-run step (crate::postrun): started only after the others are torn down, so a
    /// teardown that meets it alive has only it to stop (stage 2).
    PostRun,
    /// A leg of a shared job: a `payload run --spec … --engine …` child of the engine host
    /// (crate::run::shared). Legs live in [`Supervisor::legs`], not in a slot, and are wound down by
    /// the host before the teardown of the engine.
    Leg,
}

impl Role {
    pub(crate) const TEARDOWN_ORDER: [Role; 6] =
        [Role::Harbor, Role::Engine, Role::Ranks, Role::Tunnel, Role::Egress, Role::PostRun];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Harbor => "harbor",
            Role::Engine => "engine",
            Role::Ranks => "ranks",
            Role::Tunnel => "tunnel",
            Role::Egress => "egress",
            Role::PostRun => "post_run",
            Role::Leg => "leg",
        }
    }

    /// The signal that asks the role to stop. Harbor: SIGINT, the one signal both `jobs start`
    /// and `jobs resume` turn into KeyboardInterrupt (cancel the trials, record them, exit);
    /// Harbor 0.25's `resume` has no SIGTERM handler, so SIGTERM kills it with trials unrecorded.
    pub(crate) fn stop_signal(self) -> Signal {
        match self {
            Role::Harbor => Signal::SIGINT,
            Role::Engine | Role::Ranks | Role::Tunnel | Role::Egress | Role::PostRun | Role::Leg => Signal::SIGTERM,
        }
    }
}

/// What to start: the resolved program, its argv (argv[0] shown in records), an explicit
/// environment (the child gets nothing else), and the log file (stdout and stderr, appended).
#[derive(Debug, Clone)]
pub struct ChildSpec {
    pub program: PathBuf,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub log: PathBuf,
    pub cwd: Option<PathBuf>,
}

/// One supervised child: the leader of its own process group (pgid = pid).
pub(crate) struct Managed {
    pub role: Role,
    pub pid: u32,
    child: Child,
    status: Option<ExitStatus>,
}

impl Managed {
    /// Waits for the group leader; cancel-safe, and returns the cached status once known.
    pub(crate) async fn wait(&mut self) -> ExitStatus {
        if let Some(status) = self.status {
            return status;
        }
        let status = match self.child.wait().await {
            Ok(status) => status,
            Err(err) => {
                tracing::warn!(role = self.role.as_str(), error = %err, "wait failed");
                std::os::unix::process::ExitStatusExt::from_raw(255 << 8)
            }
        };
        self.status = Some(status);
        status
    }

    pub(crate) fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.status = Some(status);
        }
        self.status
    }

    pub(crate) fn pgid(&self) -> Pid {
        Pid::from_raw(self.pid as i32)
    }

    pub(crate) fn signal_group(&self, sig: Signal) {
        match killpg(self.pgid(), sig) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(err) => tracing::warn!(role = self.role.as_str(), signal = %sig, error = %err, "killpg failed"),
        }
    }

    /// Gone = leader reaped and no live process left in its group.
    pub(crate) fn gone(&mut self, table: &[ProcInfo]) -> bool {
        self.try_status().is_some() && !group_alive(table, self.pid as i32)
    }
}

/// Waits on an optional child; pends forever when there is none (for `select!`).
pub(crate) async fn wait_opt(managed: Option<&mut Managed>) -> ExitStatus {
    match managed {
        Some(m) => m.wait().await,
        None => std::future::pending().await,
    }
}

/// Exit code for a status: the code, or 128+n for a signal.
pub(crate) fn status_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

pub(crate) fn describe_status(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => {
            let name = Signal::try_from(sig).map(|s| s.as_str().to_string()).unwrap_or_else(|_| sig.to_string());
            format!("killed by {name}")
        }
        _ => "unknown status".to_string(),
    }
}

/// One line of `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    pub(crate) pgrp: i32,
    pub state: char,
}

/// Parses `/proc/<pid>/stat` text (the command may contain spaces and parentheses).
pub(crate) fn parse_stat(text: &str) -> Option<ProcInfo> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let mut rest = text[close + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgrp = rest.next()?.parse().ok()?;
    Some(ProcInfo { pid, ppid, pgrp, state })
}

/// Every process visible in `/proc`.
pub(crate) fn proc_table() -> Vec<ProcInfo> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|text| parse_stat(&text))
        .collect()
}

/// Whether any live (non-zombie) process is in group `pgid`.
pub(crate) fn group_alive(table: &[ProcInfo], pgid: i32) -> bool {
    table.iter().any(|p| p.pgrp == pgid && p.state != 'Z' && p.state != 'X')
}

/// Every descendant of `root` (children, grandchildren, …), zombies included.
pub fn descendants(table: &[ProcInfo], root: i32) -> Vec<ProcInfo> {
    let mut by_parent: HashMap<i32, Vec<ProcInfo>> = HashMap::new();
    for p in table {
        by_parent.entry(p.ppid).or_default().push(*p);
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    let mut seen = HashSet::new();
    while let Some(pid) = stack.pop() {
        for child in by_parent.get(&pid).map(Vec::as_slice).unwrap_or(&[]) {
            if seen.insert(child.pid) {
                out.push(*child);
                stack.push(child.pid);
            }
        }
    }
    out
}

/// How teardown should go.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TeardownGrace {
    /// Total grace between the first TERM and SIGKILL (`limits.teardown_grace_s`).
    pub grace: Duration,
    /// Harbor's share. Normally `grace` minus a reserve for vLLM; longer for a walltime wind-down.
    pub(crate) harbor_grace: Duration,
    /// A TERM/INT/HUP started this teardown, so the next one means kill now.
    pub signalled: bool,
}

impl TeardownGrace {
    /// The reserve kept for vLLM and the tunnel after Harbor: a quarter of the grace, at most 5 s.
    pub(crate) fn reserve(grace: Duration) -> Duration {
        (grace / 4).min(Duration::from_secs(5))
    }

    pub(crate) fn normal(grace: Duration, signalled: bool) -> Self {
        Self { grace, harbor_grace: grace - Self::reserve(grace), signalled }
    }

    /// USR1: Harbor gets until the walltime is close (half the lead, at least the normal share).
    pub(crate) fn walltime(grace: Duration, walltime_lead: Duration) -> Self {
        let normal = grace - Self::reserve(grace);
        Self { grace, harbor_grace: normal.max(walltime_lead / 2), signalled: false }
    }
}

/// What teardown did.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShutdownReport {
    /// A second TERM/INT cut the grace short.
    pub forced: bool,
    /// Signals received during teardown (besides the one that started it).
    pub signals: Vec<Signal>,
    /// Groups that needed SIGKILL.
    pub killed_groups: Vec<Role>,
    /// Descendants killed by the sweep (pids).
    pub swept: Vec<i32>,
    pub elapsed: Duration,
    /// Whether every descendant is gone.
    pub clean: bool,
    /// What happened when, in order (ms since teardown began).
    pub steps: Vec<TeardownStep>,
}

/// One teardown step: `term` (the role's stop signal sent to the group: SIGINT for Harbor, SIGTERM
/// otherwise), `gone` (group empty), `kill` (SIGKILL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TeardownStep {
    pub ms: u64,
    pub action: &'static str,
    pub role: Role,
}

impl ShutdownReport {
    fn step(&mut self, start: Instant, action: &'static str, role: Role) {
        self.steps.push(TeardownStep { ms: start.elapsed().as_millis() as u64, action, role });
    }
}

/// Owns the children.
pub(crate) struct Supervisor {
    pub harbor: Option<Managed>,
    pub engine: Option<Managed>,
    pub ranks: Option<Managed>,
    pub tunnel: Option<Managed>,
    pub egress: Option<Managed>,
    pub post_run: Option<Managed>,
    /// A shared job's legs (crate::run::shared), in launch order.
    pub legs: Vec<Managed>,
    /// Always `None`: the slot of [`Role::Leg`], whose children are in `legs`.
    no_slot: Option<Managed>,
    my_pid: i32,
}

impl Default for Supervisor {
    fn default() -> Self {
        Self::new()
    }
}

impl Supervisor {
    pub(crate) fn new() -> Self {
        Self {
            harbor: None,
            engine: None,
            ranks: None,
            tunnel: None,
            egress: None,
            post_run: None,
            legs: Vec::new(),
            no_slot: None,
            my_pid: std::process::id() as i32,
        }
    }

    fn slot(&mut self, role: Role) -> &mut Option<Managed> {
        match role {
            Role::Harbor => &mut self.harbor,
            Role::Engine => &mut self.engine,
            Role::Ranks => &mut self.ranks,
            Role::Tunnel => &mut self.tunnel,
            Role::Egress => &mut self.egress,
            Role::PostRun => &mut self.post_run,
            Role::Leg => {
                self.no_slot = None;
                &mut self.no_slot
            }
        }
    }

    pub(crate) fn get_mut(&mut self, role: Role) -> Option<&mut Managed> {
        self.slot(role).as_mut()
    }

    fn managed_pids(&self) -> Vec<i32> {
        [&self.harbor, &self.engine, &self.ranks, &self.tunnel, &self.egress, &self.post_run]
            .iter()
            .filter_map(|m| m.as_ref().map(|m| m.pid as i32))
            .chain(self.legs.iter().map(|m| m.pid as i32))
            .collect()
    }

    /// Starts `spec` as `role` in a new process group with exactly `spec.env`.
    pub(crate) fn spawn(&mut self, role: Role, spec: &ChildSpec) -> std::io::Result<u32> {
        let managed = Self::start(role, spec)?;
        let pid = managed.pid;
        *self.slot(role) = Some(managed);
        Ok(pid)
    }

    /// Starts a shared job's leg (its own group, like every child) into [`Supervisor::legs`].
    pub(crate) fn spawn_leg(&mut self, spec: &ChildSpec) -> std::io::Result<u32> {
        let managed = Self::start(Role::Leg, spec)?;
        let pid = managed.pid;
        self.legs.push(managed);
        Ok(pid)
    }

    fn start(role: Role, spec: &ChildSpec) -> std::io::Result<Managed> {
        // Never through a symlink planted in the run dir, never blocked by a FIFO there.
        let log = launch_spec::fsread::open_append_regular(&spec.log)?;
        let mut cmd = Command::new(&spec.program);
        cmd.args(spec.argv.iter().skip(1))
            .env_clear()
            .envs(&spec.env)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .process_group(0)
            .kill_on_drop(false);
        if let Some(cwd) = &spec.cwd {
            cmd.current_dir(cwd);
        }
        let parent = nix::unistd::getpid();
        // The one `unsafe` in payload: a `pre_exec` hook, run in the forked child before exec. It
        // sets the parent-death signal so the child is SIGKILLed when payload dies, even by a
        // SIGKILL that leaves no chance to tear down; then it checks the parent is still payload
        // (had payload died between fork and prctl, the signal would never come). Sound because the
        // closure only makes two async-signal-safe syscalls (prctl, getppid) and builds its error
        // from an errno without allocating. The death signal fires when the *thread* that forked
        // exits: payload forks only from the main thread (tokio's current-thread runtime in
        // main.rs runs every task there), which lives as long as the process.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
                if nix::unistd::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        let pid = child.id().unwrap_or(0);
        if let Ok(mut groups) = GROUPS.lock() {
            groups.push(pid as i32);
        }
        Ok(Managed { role, pid, child, status: None })
    }

    /// Reaps zombies that re-parented to payload (never a managed child, never `waitpid(-1)`).
    pub(crate) fn reap_orphans(&self) -> usize {
        let managed = self.managed_pids();
        let mut n = 0;
        for p in proc_table() {
            if p.ppid == self.my_pid && p.state == 'Z' && !managed.contains(&p.pid) {
                if let Ok(status) = waitpid(Pid::from_raw(p.pid), Some(WaitPidFlag::WNOHANG)) {
                    tracing::debug!(pid = p.pid, ?status, "reaped orphan");
                }
                n += 1;
            }
        }
        n
    }

    fn all_gone(&mut self, roles: &[Role]) -> bool {
        let table = proc_table();
        roles.iter().all(|r| self.slot(*r).as_mut().is_none_or(|m| m.gone(&table)))
    }

    fn term(&mut self, roles: &[Role], report: &mut ShutdownReport, start: Instant) {
        let table = proc_table();
        for role in roles {
            if let Some(m) = self.slot(*role).as_mut()
                && !m.gone(&table)
            {
                let sig = role.stop_signal();
                tracing::info!(role = role.as_str(), pgid = m.pid, signal = %sig, "sending stop signal to group");
                m.signal_group(sig);
                report.step(start, "term", *role);
            }
        }
    }

    fn note_gone(&mut self, roles: &[Role], report: &mut ShutdownReport, start: Instant) {
        for role in roles {
            let termed = report.steps.iter().any(|s| s.role == *role && s.action == "term");
            if termed && self.all_gone(&[*role]) {
                report.step(start, "gone", *role);
            }
        }
    }

    /// Waits until `roles` are gone or `deadline` passes (returns `true`), or a second shutdown
    /// signal forces (returns `false`). A first TERM/INT/HUP during a teardown that no signal
    /// started (a fault, or a walltime wind-down) pulls `deadline` in to the normal grace.
    async fn wait_gone(
        &mut self,
        roles: &[Role],
        deadline: &mut Instant,
        signals: &mut impl SignalSource,
        state: &mut TeardownState,
    ) -> bool {
        loop {
            if self.all_gone(roles) {
                return true;
            }
            if Instant::now() >= *deadline {
                return true;
            }
            tokio::select! {
                _ = sleep(Duration::from_millis(20)) => {}
                _ = sleep_until((*deadline).into()) => {}
                ev = signals.recv() => {
                    if let SignalEvent::Shutdown(sig) = ev {
                        state.report.signals.push(sig);
                        if state.signalled {
                            tracing::warn!(signal = %sig, "second signal during teardown: killing now");
                            state.report.forced = true;
                            return false;
                        }
                        state.signalled = true;
                        state.t0 = Instant::now();
                        let cut = crate::timings::deadline(state.t0, state.plan.grace - TeardownGrace::reserve(state.plan.grace));
                        if cut < *deadline {
                            *deadline = cut;
                        }
                        tracing::info!(signal = %sig, "signal during wind-down: grace shortened");
                    }
                }
            }
        }
    }

    /// Tears everything down: Harbor → vLLM → tunnel, grace, SIGKILL, sweep.
    pub(crate) async fn shutdown(&mut self, signals: &mut impl SignalSource, plan: TeardownGrace) -> ShutdownReport {
        let start = Instant::now();
        let mut state = TeardownState { plan, signalled: plan.signalled, t0: start, report: ShutdownReport::default() };
        let mut go_on = true;

        // Stage 1: Harbor alone, so it cancels its trials while the model still answers.
        if self.harbor.is_some() {
            self.term(&[Role::Harbor], &mut state.report, start);
            let mut deadline = crate::timings::deadline(start, plan.harbor_grace);
            go_on = self.wait_gone(&[Role::Harbor], &mut deadline, signals, &mut state).await;
            self.note_gone(&[Role::Harbor], &mut state.report, start);
            if go_on && !self.all_gone(&[Role::Harbor]) {
                self.kill_groups(&[Role::Harbor], &mut state.report, start);
            }
        }
        // Stage 2: vLLM, then the tunnel (and the post-run step, alone when it runs).
        const STAGE_2: [Role; 5] = [Role::Engine, Role::Ranks, Role::Tunnel, Role::Egress, Role::PostRun];
        if go_on {
            self.term(&STAGE_2, &mut state.report, start);
            let reserve = TeardownGrace::reserve(plan.grace);
            let mut deadline =
                crate::timings::deadline(state.t0, plan.grace).max(crate::timings::deadline(Instant::now(), reserve));
            go_on = self.wait_gone(&STAGE_2, &mut deadline, signals, &mut state).await;
            self.note_gone(&STAGE_2, &mut state.report, start);
        }
        let _ = go_on;
        // Stage 3: SIGKILL whatever is left of every group, then sweep descendants.
        let left: Vec<Role> = Role::TEARDOWN_ORDER.into_iter().filter(|r| !self.all_gone(&[*r])).collect();
        self.kill_groups(&left, &mut state.report, start);
        self.sweep(&mut state.report).await;
        state.report.elapsed = start.elapsed();
        state.report
    }

    fn kill_groups(&mut self, roles: &[Role], report: &mut ShutdownReport, start: Instant) {
        for role in roles {
            if let Some(m) = self.slot(*role).as_mut() {
                tracing::warn!(role = role.as_str(), pgid = m.pid, "grace over: SIGKILL to group");
                m.signal_group(Signal::SIGKILL);
                report.step(start, "kill", *role);
                if !report.killed_groups.contains(role) {
                    report.killed_groups.push(*role);
                }
            }
        }
    }

    /// Kills every remaining descendant of payload (whatever its group or session) and reaps our
    /// direct children: managed ones through tokio, re-parented orphans by pid.
    async fn sweep(&mut self, report: &mut ShutdownReport) {
        let until = Instant::now() + Duration::from_secs(5);
        let managed = self.managed_pids();
        loop {
            let table = proc_table();
            let desc = descendants(&table, self.my_pid);
            for p in desc.iter().filter(|p| p.state != 'Z' && p.state != 'X') {
                if kill(Pid::from_raw(p.pid), Signal::SIGKILL).is_ok()
                    && !report.swept.contains(&p.pid)
                    && !managed.contains(&p.pid)
                {
                    report.swept.push(p.pid);
                }
            }
            for role in Role::TEARDOWN_ORDER {
                if let Some(m) = self.slot(role).as_mut() {
                    m.try_status();
                }
            }
            for m in &mut self.legs {
                m.try_status();
            }
            for p in desc.iter().filter(|p| p.ppid == self.my_pid && !managed.contains(&p.pid)) {
                let _ = waitpid(Pid::from_raw(p.pid), Some(WaitPidFlag::WNOHANG));
            }
            if desc.is_empty() {
                report.clean = true;
                break;
            }
            if Instant::now() >= until {
                tracing::error!(left = desc.len(), "descendants still present after the sweep");
                break;
            }
            sleep(Duration::from_millis(10)).await;
        }
        // Reap the managed leaders (already SIGKILLed if they were alive).
        for role in Role::TEARDOWN_ORDER {
            if let Some(m) = self.slot(role).as_mut()
                && m.try_status().is_none()
            {
                let _ = tokio::time::timeout(Duration::from_secs(2), m.wait()).await;
            }
        }
    }
}

struct TeardownState {
    plan: TeardownGrace,
    signalled: bool,
    t0: Instant,
    report: ShutdownReport,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_now_takes_a_group_and_its_detached_descendants_down() {
        use std::os::unix::process::CommandExt;
        // A group leader with a child in its group and a grandchild in a group of its own.
        let mut leader = std::process::Command::new("sh")
            .args(["-c", "sleep 60 & setsid sleep 60 & wait"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = leader.id() as i32;
        let until = Instant::now() + Duration::from_secs(5);
        while descendants(&proc_table(), pid).len() < 2 {
            assert!(Instant::now() < until, "children never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        let kids: Vec<i32> = descendants(&proc_table(), pid).iter().map(|p| p.pid).collect();
        kill_now(&[pid], pid);
        let _ = leader.wait();
        let until = Instant::now() + Duration::from_secs(5);
        while kids.iter().any(|k| proc_table().iter().any(|p| p.pid == *k && p.state != 'Z')) {
            assert!(Instant::now() < until, "a descendant survived: {kids:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn parses_stat_with_odd_command_names() {
        let p = parse_stat("1234 (vllm (worker) 1) S 1000 1234 1234 0 -1 4194560 ...").unwrap();
        assert_eq!(p, ProcInfo { pid: 1234, ppid: 1000, pgrp: 1234, state: 'S' });
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn descendants_walk_the_tree() {
        let t = |pid, ppid, pgrp, state| ProcInfo { pid, ppid, pgrp, state };
        let table =
            vec![t(10, 1, 10, 'S'), t(11, 10, 11, 'S'), t(12, 11, 11, 'S'), t(13, 12, 99, 'Z'), t(20, 1, 20, 'S')];
        let mut d: Vec<i32> = descendants(&table, 10).iter().map(|p| p.pid).collect();
        d.sort();
        assert_eq!(d, vec![11, 12, 13]);
        assert!(group_alive(&table, 11));
        assert!(!group_alive(&table, 99));
    }

    #[test]
    fn harbor_is_stopped_with_sigint() {
        assert_eq!(Role::Harbor.stop_signal(), Signal::SIGINT);
        assert_eq!(Role::Engine.stop_signal(), Signal::SIGTERM);
        assert_eq!(Role::Tunnel.stop_signal(), Signal::SIGTERM);
        assert_eq!(Role::PostRun.stop_signal(), Signal::SIGTERM);
    }

    #[test]
    fn plans_fit_the_grace() {
        let p = TeardownGrace::normal(Duration::from_secs(20), true);
        assert_eq!(p.harbor_grace, Duration::from_secs(15));
        let p = TeardownGrace::normal(Duration::from_secs(2), false);
        assert_eq!(p.harbor_grace, Duration::from_millis(1500));
        let w = TeardownGrace::walltime(Duration::from_secs(20), Duration::from_secs(900));
        assert_eq!(w.harbor_grace, Duration::from_secs(450));
        let w = TeardownGrace::walltime(Duration::from_secs(20), Duration::from_secs(2));
        assert_eq!(w.harbor_grace, Duration::from_secs(15));
    }

    #[test]
    fn status_codes() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(status_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(describe_status(ExitStatus::from_raw(9)), "killed by SIGKILL");
    }
}
