//! The two kinds of tunnel as [`Strategy`]s of the machine (`super::machine`): **Pinggy** (a
//! reverse tunnel, a bank of (public URL, token) pairs with leases and failover, the `force`
//! keyword on restarts; optionally through the login node) and **SOCKS** (egress through a login
//! node). Neither does I/O: they render the ssh config and argv and decide.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use launch_spec::rundir::events::{TunnelLeaseUnavailable, TunnelPair, TunnelPairSkipped};
use launch_spec::spec::{PinggyPair, PinggySpec, SocksSpec};

use super::machine::{Action, Check, LeaseAnswer, Limits, Next, Strategy};
use super::output::Seen;
use super::sshconf;

/// Host aliases in the generated ssh config.
pub(crate) const PINGGY_ALIAS: &str = "payload-pinggy";
pub(crate) const SOCKS_ALIAS: &str = "payload-socks";
/// A reverse tunnel without a banner counts as connected once ssh has lived this long.
pub(crate) const SETTLE: Duration = Duration::from_secs(2);
/// A SOCKS proxy counts as connected once ssh has lived this long (the check decides).
pub(crate) const SOCKS_SETTLE: Duration = Duration::from_millis(200);

/// Where an instance's files are (the real private directory, or placeholders for the plan).
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    /// The ssh config as argv names it.
    pub config: String,
    pub known_hosts: PathBuf,
}

fn reverse_arg(remote_port: u16, engine_host: &str, engine_port: u16) -> String {
    let host = match engine_host {
        "0.0.0.0" | "::" | "" => "127.0.0.1",
        h => h,
    };
    if host.contains(':') {
        format!("{remote_port}:[{host}]:{engine_port}")
    } else {
        format!("{remote_port}:{host}:{engine_port}")
    }
}

/// ssh's argv (program first) for a Pinggy attempt.
pub(crate) fn pinggy_argv(ssh: &str, config: &str, p: &PinggySpec, engine_host: &str, engine_port: u16) -> Vec<String> {
    let r = reverse_arg(p.remote_port, engine_host, engine_port);
    [ssh, "-F", config, "-T", "-R", &r, PINGGY_ALIAS].iter().map(|s| s.to_string()).collect()
}

/// ssh's argv (program first) for the SOCKS proxy; it binds loopback only (never `-g`).
pub(crate) fn socks_argv(ssh: &str, config: &str, port: u16) -> Vec<String> {
    [ssh, "-F", config, "-N", "-D", &format!("127.0.0.1:{port}"), SOCKS_ALIAS].iter().map(|s| s.to_string()).collect()
}

fn known<'a>(pinned: &'a Option<PathBuf>, accept_new: &'a Path) -> sshconf::KnownHosts<'a> {
    match pinned {
        Some(file) => sshconf::KnownHosts::Pinned(file),
        None => sshconf::KnownHosts::AcceptNew(accept_new),
    }
}

pub(crate) fn pinggy_block<'a>(
    p: &'a PinggySpec,
    pair: &'a PinggyPair,
    user: &'a str,
    known_hosts: &'a Path,
    jump: bool,
) -> sshconf::HostBlock<'a> {
    sshconf::HostBlock {
        alias: PINGGY_ALIAS,
        host_name: pair.host.as_deref().unwrap_or(&p.host),
        port: Some(p.port),
        user: Some(user),
        identity_file: p.identity_file.as_deref(),
        known_hosts: known(&p.known_hosts, known_hosts),
        batch_mode: false,
        server_alive_interval_s: p.server_alive_interval_s,
        server_alive_count_max: p.server_alive_count_max,
        connect_timeout_s: p.connect_timeout_s.ceil() as u32,
        proxy_jump: jump.then_some(SOCKS_ALIAS),
    }
}

pub(crate) fn socks_block<'a>(s: &'a SocksSpec, known_hosts: &'a Path) -> sshconf::HostBlock<'a> {
    sshconf::HostBlock {
        alias: SOCKS_ALIAS,
        host_name: &s.login_node,
        port: s.ssh_port,
        user: s.user.as_deref(),
        identity_file: s.identity_file.as_deref(),
        known_hosts: known(&s.known_hosts, known_hosts),
        batch_mode: true,
        server_alive_interval_s: s.server_alive_interval_s,
        server_alive_count_max: s.server_alive_count_max,
        connect_timeout_s: s.connect_timeout_s.ceil() as u32,
        proxy_jump: None,
    }
}

// ------------------------------------------------------------------------------------------ SOCKS

/// SOCKS egress: `ssh -N -D 127.0.0.1:<port>` to the login node.
pub(crate) struct Socks {
    pub spec: SocksSpec,
    pub port: u16,
    pub ssh: String,
    pub paths: Paths,
}

impl Strategy for Socks {
    fn kind(&self) -> &'static str {
        "socks"
    }

    fn limits(&self) -> Limits {
        let s = &self.spec;
        Limits::new(s.max_restarts, s.restart_backoff_s, s.connect_timeout_s, s.verify_attempts, s.verify_interval_s)
    }

    fn next_attempt(&mut self, _out: &mut Vec<Action>) -> Next {
        match sshconf::render(&socks_block(&self.spec, &self.paths.known_hosts)) {
            Ok(config) => Next::Attempt { config, argv: socks_argv(&self.ssh, &self.paths.config, self.port) },
            Err(e) => Next::Stop { cause: "config", message: e.to_string() },
        }
    }

    fn connected(&self, _seen: &Seen, elapsed: Duration) -> bool {
        elapsed >= SOCKS_SETTLE
    }

    fn check(&self) -> Check {
        Check::Socks { port: self.port, url: self.spec.verify_url.clone() }
    }

    fn socks_port(&self) -> Option<u16> {
        Some(self.port)
    }
}

// ----------------------------------------------------------------------------------------- Pinggy

struct Held {
    pair: PinggyPair,
    token: String,
    leased: bool,
    /// The server authenticated this pair for us at least once (a restart may then `force`).
    had_session: bool,
}

/// Pinggy: `ssh -T -R 0:127.0.0.1:<vllm port>` with the token as the user, over a bank of pairs.
pub(crate) struct Pinggy {
    pub spec: PinggySpec,
    pub ssh: String,
    pub paths: Paths,
    /// Secret name → token (in `payload plan`: a placeholder naming the secret).
    pub tokens: BTreeMap<String, String>,
    pub order: Vec<usize>,
    pub(crate) engine_host: String,
    pub(crate) engine_port: u16,
    pub served_name: String,
    /// The login node's block and the local SOCKS port, when compute nodes have no internet: ssh
    /// reaches Pinggy with `ProxyJump` through the login node; the check goes through the proxy.
    pub egress: Option<(SocksSpec, u16)>,
    pairs: Vec<PinggyPair>,
    cursor: usize,
    pending: Option<(PinggyPair, String)>,
    held: Option<Held>,
    skipped: Vec<(String, String)>,
    force_next: bool,
}

/// Inputs of [`Pinggy::new`] beside the spec.
pub(crate) struct PinggyTarget {
    pub ssh: String,
    pub paths: Paths,
    pub tokens: BTreeMap<String, String>,
    pub job_id: String,
    pub(crate) engine_host: String,
    pub(crate) engine_port: u16,
    pub served_name: String,
    pub egress: Option<(SocksSpec, u16)>,
}

impl Pinggy {
    pub(crate) fn new(spec: &PinggySpec, t: PinggyTarget) -> Self {
        let pairs = spec.pairs();
        Self {
            order: pair_order(pairs.len(), &t.job_id),
            pairs,
            spec: spec.clone(),
            ssh: t.ssh,
            paths: t.paths,
            tokens: t.tokens,
            engine_host: t.engine_host,
            engine_port: t.engine_port,
            served_name: t.served_name,
            egress: t.egress,
            cursor: 0,
            pending: None,
            held: None,
            skipped: Vec::new(),
            force_next: false,
        }
    }

    fn hold(&mut self, pair: PinggyPair, token: String, lease: Option<&Path>, out: &mut Vec<Action>) {
        out.push(Action::Event(
            TunnelPair {
                public_url: pair.public_url.clone(),
                secret: pair.token_secret.clone(),
                lease: lease.map(Path::to_path_buf),
            }
            .into(),
        ));
        self.held = Some(Held { pair, token, leased: lease.is_some(), had_session: false });
    }

    fn skip(&mut self, why: String, event: TunnelPairSkipped, out: &mut Vec<Action>) {
        self.skipped.push((event.public_url.clone(), why));
        out.push(Action::Event(event.into()));
    }

    fn config(&self, held: &Held) -> Result<String, sshconf::ConfigError> {
        let user = if self.force_next { format!("{}+force", held.token) } else { held.token.clone() };
        let mut text = sshconf::render(&pinggy_block(
            &self.spec,
            &held.pair,
            &user,
            &self.paths.known_hosts,
            self.egress.is_some(),
        ))?;
        if let Some((socks, _)) = &self.egress {
            let jump = sshconf::render(&socks_block(socks, &self.paths.known_hosts))?;
            text.push_str(
                jump.lines().filter(|l| !l.starts_with('#')).map(|l| format!("{l}\n")).collect::<String>().as_str(),
            );
        }
        Ok(text)
    }
}

impl Strategy for Pinggy {
    fn kind(&self) -> &'static str {
        "pinggy"
    }

    fn limits(&self) -> Limits {
        let p = &self.spec;
        Limits::new(p.max_restarts, p.restart_backoff_s, p.connect_timeout_s, p.verify_attempts, p.verify_interval_s)
    }

    fn next_attempt(&mut self, out: &mut Vec<Action>) -> Next {
        while self.held.is_none() {
            let Some(i) = self.order.get(self.cursor).copied() else {
                let tried = self.skipped.iter().map(|(u, why)| format!("{u}: {why}")).collect::<Vec<_>>().join("; ");
                let cause = if self.skipped.iter().any(|(_, w)| w == "token_locked") {
                    "token_locked"
                } else if self.skipped.iter().any(|(_, w)| w == "not_authenticated") {
                    "not_authenticated"
                } else {
                    "bank_exhausted"
                };
                return Next::Stop { cause, message: format!("no usable Pinggy pair in the bank ({tried})") };
            };
            self.cursor += 1;
            let pair = self.pairs[i].clone();
            let Some(token) = self.tokens.get(&pair.token_secret).cloned() else {
                let why = format!("secret {} not in the secrets file", pair.token_secret);
                let event = TunnelPairSkipped {
                    secret: Some(pair.token_secret.clone()),
                    ..skipped(&pair.public_url, "missing_secret")
                };
                self.skip(why, event, out);
                continue;
            };
            if let Some(dir) = &self.spec.lock_dir {
                let (dir, public_url) = (dir.clone(), pair.public_url.clone());
                self.pending = Some((pair, token));
                return Next::Lease { dir, public_url, ttl: Duration::from_secs(self.spec.lease_ttl_s) };
            }
            self.hold(pair, token, None, out);
        }
        let held = self.held.as_ref().expect("held above");
        match self.config(held) {
            Ok(config) => Next::Attempt {
                config,
                argv: pinggy_argv(&self.ssh, &self.paths.config, &self.spec, &self.engine_host, self.engine_port),
            },
            Err(e) => Next::Stop { cause: "config", message: e.to_string() },
        }
    }

    fn on_lease(&mut self, answer: LeaseAnswer, out: &mut Vec<Action>) {
        let Some((pair, token)) = self.pending.take() else { return };
        match answer {
            LeaseAnswer::Acquired(path) => self.hold(pair, token, Some(&path), out),
            LeaseAnswer::Held { holder, owner } => {
                let event = TunnelPairSkipped { holder: Some(owner), ..skipped(&pair.public_url, "leased") };
                self.skip(format!("leased by {holder}"), event, out);
            }
            LeaseAnswer::Unavailable(error) => {
                // A lock dir we cannot use must not stop the job: Pinggy's lock message still guards.
                out.push(Action::Event(TunnelLeaseUnavailable { dir: self.spec.lock_dir.clone(), error }.into()));
                self.hold(pair, token, None, out);
            }
        }
    }

    fn on_output(&mut self, seen: &Seen) {
        if seen.authenticated
            && let Some(h) = self.held.as_mut()
        {
            h.had_session = true;
        }
    }

    fn end_session(&self, seen: &Seen) -> bool {
        seen.locked || seen.not_authenticated
    }

    fn connected(&self, seen: &Seen, elapsed: Duration) -> bool {
        seen.established() || elapsed >= SETTLE
    }

    fn check(&self) -> Check {
        Check::Models {
            public_url: self.public_url().unwrap_or_default(),
            served_name: self.served_name.clone(),
            via_socks: self.egress.as_ref().map(|(_, port)| *port),
        }
    }

    fn fail_over(&mut self, cause: &'static str, out: &mut Vec<Action>) -> bool {
        if !matches!(cause, "token_locked" | "not_authenticated") {
            return false;
        }
        let Some(held) = self.held.take() else { return false };
        if held.leased {
            out.push(Action::ReleaseLease);
        }
        let url = held.pair.public_url;
        out.push(Action::Note(format!("pair {url} is unusable ({cause}); moving to the next free pair")));
        self.skip(cause.to_string(), skipped(&url, cause), out);
        true
    }

    fn before_restart(&mut self) {
        if self.spec.force_on_restart && self.held.as_ref().is_some_and(|h| h.had_session) {
            self.force_next = true;
        }
    }

    fn forcing(&self) -> bool {
        self.force_next
    }

    fn holds_lease(&self) -> bool {
        self.held.as_ref().is_some_and(|h| h.leased)
    }

    fn public_url(&self) -> Option<String> {
        self.held.as_ref().map(|h| h.pair.public_url.trim_end_matches('/').to_string())
    }
}

/// A `tunnel_pair_skipped` body with neither a secret nor a holder.
fn skipped(public_url: &str, reason: &str) -> TunnelPairSkipped {
    TunnelPairSkipped { public_url: public_url.to_string(), reason: reason.to_string(), secret: None, holder: None }
}

/// The pair order for a job: a rotation of the bank starting at a place derived from the job id,
/// so jobs submitted together start on different pairs.
pub(crate) fn pair_order(n: usize, job_id: &str) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let h = job_id.parse::<u64>().unwrap_or_else(|_| {
        job_id.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3))
    });
    let start = (h % n as u64) as usize;
    (0..n).map(|i| (start + i) % n).collect()
}
