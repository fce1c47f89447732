//! Tunnels (docs/design.md §6.5, docs/tunnels.md): `none`; a **Pinggy** reverse tunnel for installed-harness
//! agents (the agent runs in the remote sandbox and calls the model back over a public URL); a
//! **SOCKS** egress proxy through a login node for compute nodes without internet.
//!
//! Both are one `ssh` child (role [`Role::Tunnel`], its own process group, torn down last) driven by
//! a small state machine that [`Tunnel::poll`] advances from the run's `select!` loops:
//!
//! ```text
//!  Backoff ──due──▶ Starting ──banner / settled──▶ VerifyWait ──▶ Verifying ──ok──▶ Up
//!     ▲                │  (timeout: TERM)              ▲   (retry)   │ attempts spent: Failed(verify_failed)
//!     └── ssh exited: restart with backoff, bounded ───┴─────────────┴──────── (also from Up)
//! ```
//!
//! Pinggy specifics: the token is the ssh `User` in a generated 0600 config in a run-private
//! directory outside the run dir (never in argv, logs, status or the spec); ssh's raw output goes to
//! that directory and is copied, redacted, into `tunnel.log`; the lock message or "not
//! authenticated" before Harbor starts moves the job to the next free pair of the bank (leases:
//! [`lease`]); after Harbor has the URL the pair is fixed, and a restart adds Pinggy's `force`
//! keyword to evict our own stale session. The end-to-end check fetches `<public url>/v1/models`
//! with the per-job API key once vLLM is ready.

pub mod lease;
pub mod output;
pub mod socks5;
pub mod sshconf;
pub mod verify;

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use launch_spec::OutcomeClass;
use launch_spec::launch::{PinggyPair, PinggySpec, ProxyMode, SocksSpec, TunnelSpec};
use launch_spec::records::TUNNEL_LOG;
use nix::sys::signal::Signal;
use serde_json::json;
use tokio::task::JoinHandle;

use crate::failure::Failure;
use crate::records::Recorder;
use crate::secrets::Secrets;
use crate::supervisor::{ChildSpec, Role, Supervisor, describe_status};

/// Host aliases in the generated ssh config.
pub const PINGGY_ALIAS: &str = "payload-pinggy";
pub const SOCKS_ALIAS: &str = "payload-socks";
/// Harbor environment variables that carry the per-job vLLM API key to the agent: litellm's
/// `hosted_vllm` provider reads `HOSTED_VLLM_API_KEY`; Harbor's installed agents take `LLM_API_KEY`
/// (OpenHands) or `OPENAI_API_KEY` (OpenAI-compatible clients) from Harbor's environment.
pub const AGENT_KEY_VARS: &[&str] = &["HOSTED_VLLM_API_KEY", "LLM_API_KEY", "OPENAI_API_KEY"];
/// vLLM reads its API key from this variable (never from argv).
pub const VLLM_KEY_VAR: &str = "VLLM_API_KEY";
/// A tunnel up for this long has its consecutive-restart count reset.
pub const STABLE_AFTER: Duration = Duration::from_secs(120);
/// Longest pause between restarts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A reverse tunnel without a banner counts as connected once ssh has lived this long.
pub const SETTLE: Duration = Duration::from_secs(2);
/// Lease refresh period (well inside any sensible `lease_ttl_s`).
pub const LEASE_REFRESH: Duration = Duration::from_secs(30);
/// One verification request's timeout.
pub const VERIFY_TIMEOUT: Duration = Duration::from_secs(10);

pub fn kind(spec: &TunnelSpec) -> &'static str {
    match spec {
        TunnelSpec::None => "none",
        TunnelSpec::Pinggy(_) => "pinggy",
        TunnelSpec::Socks(_) => "socks",
    }
}

/// Whether vLLM is reachable from outside (then it gets a per-job API key).
pub fn exposes_model(spec: &TunnelSpec) -> bool {
    matches!(spec, TunnelSpec::Pinggy(_))
}

/// Secret names the tunnel needs from the secrets file.
pub fn secret_names(spec: &TunnelSpec) -> Vec<String> {
    match spec {
        TunnelSpec::Pinggy(p) => p.pairs().into_iter().map(|pair| pair.token_secret).collect(),
        _ => Vec::new(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error("the {kind} tunnel needs `{program}` ({why}), which is not on PATH")]
    MissingProgram { kind: &'static str, program: String, why: &'static str },
    #[error("none of the Pinggy token secrets ({names}) is set in the secrets file {file}")]
    NoToken { names: String, file: PathBuf },
    #[error("cannot prepare the tunnel's private directory under {dir}: {reason}")]
    PrivateDir { dir: PathBuf, reason: String },
    #[error("tunnel ssh config: {0}")]
    Config(#[from] sshconf::ConfigError),
    #[error("SOCKS port: {0}")]
    Port(crate::ports::PortError),
}

impl From<TunnelError> for Failure {
    fn from(err: TunnelError) -> Self {
        let (class, cause) = match &err {
            TunnelError::MissingProgram { .. } => (OutcomeClass::Tunnel, "missing_program"),
            TunnelError::NoToken { .. } => (OutcomeClass::Secrets, "missing_token"),
            TunnelError::PrivateDir { .. } => (OutcomeClass::Tunnel, "private_dir"),
            TunnelError::Config(_) => (OutcomeClass::Tunnel, "config"),
            TunnelError::Port(_) => (OutcomeClass::Tunnel, "port"),
        };
        Failure::new(class, err.to_string()).with_cause(cause)
    }
}

/// The programs a tunnel runs, resolved on the child PATH.
#[derive(Debug, Clone, Default)]
pub struct Programs {
    pub ssh: PathBuf,
    pub verify: Option<PathBuf>,
    pub proxychains: Option<PathBuf>,
}

/// Resolves the tunnel's programs (`ssh`; `curl` for Pinggy; the proxychains binary in that mode).
pub fn programs(spec: &TunnelSpec, child_path: &str) -> Result<Option<Programs>, TunnelError> {
    let resolve = |kind: &'static str, program: &str, why: &'static str| {
        crate::childenv::resolve_program(program, None, child_path).map_err(|_| TunnelError::MissingProgram {
            kind,
            program: program.to_string(),
            why,
        })
    };
    match spec {
        TunnelSpec::None => Ok(None),
        TunnelSpec::Pinggy(p) => Ok(Some(Programs {
            ssh: resolve("pinggy", "ssh", "OpenSSH client")?,
            verify: Some(resolve("pinggy", &p.verify_program, "the end-to-end check of the public URL")?),
            proxychains: None,
        })),
        TunnelSpec::Socks(s) => Ok(Some(Programs {
            ssh: resolve("socks", "ssh", "OpenSSH client")?,
            verify: None,
            proxychains: match s.mode {
                ProxyMode::Env => None,
                ProxyMode::Proxychains => Some(resolve(
                    "socks",
                    s.proxychains_bin.as_deref().unwrap_or("proxychains4"),
                    "tunnel.mode proxychains",
                )?),
            },
        })),
    }
}

/// The pair order for a job: a rotation of the bank starting at a place derived from the job id,
/// so jobs submitted together start on different pairs.
pub fn pair_order(n: usize, job_id: &str) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let h = job_id.parse::<u64>().unwrap_or_else(|_| {
        job_id.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3))
    });
    let start = (h % n as u64) as usize;
    (0..n).map(|i| (start + i) % n).collect()
}

/// Restart delay: `base · 2^(n-1)`, capped at [`MAX_BACKOFF`].
pub fn backoff(base_s: f64, restart: u32) -> Duration {
    let secs = base_s.max(0.0) * 2f64.powi(restart.saturating_sub(1).min(16) as i32);
    // `try_from`: NaN or a huge base is the cap, never a panic (payload::timings refuses them first).
    Duration::try_from_secs_f64(secs).unwrap_or(MAX_BACKOFF).min(MAX_BACKOFF)
}

/// The SOCKS port: the spec's policy, never the engine's port.
pub fn socks_port(spec: &SocksSpec, job_id: &str, engine_port: u16) -> Result<u16, crate::ports::PortError> {
    crate::ports::choose_with(&spec.port, job_id, |p| p != engine_port && crate::ports::is_free(p, "127.0.0.1"))
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
pub fn pinggy_argv(ssh: &str, config: &str, p: &PinggySpec, engine_host: &str, engine_port: u16) -> Vec<String> {
    let r = reverse_arg(p.remote_port, engine_host, engine_port);
    [ssh, "-F", config, "-T", "-R", &r, PINGGY_ALIAS].iter().map(|s| s.to_string()).collect()
}

/// ssh's argv (program first) for the SOCKS proxy; it binds loopback only (never `-g`).
pub fn socks_argv(ssh: &str, config: &str, port: u16) -> Vec<String> {
    [ssh, "-F", config, "-N", "-D", &format!("127.0.0.1:{port}"), SOCKS_ALIAS].iter().map(|s| s.to_string()).collect()
}

fn pinggy_block<'a>(p: &'a PinggySpec, pair: &'a PinggyPair, user: &'a str, known: &'a Path) -> sshconf::HostBlock<'a> {
    sshconf::HostBlock {
        alias: PINGGY_ALIAS,
        host_name: pair.host.as_deref().unwrap_or(&p.host),
        port: Some(p.port),
        user: Some(user),
        identity_file: p.identity_file.as_deref(),
        known_hosts: match &p.known_hosts {
            Some(file) => sshconf::KnownHosts::Pinned(file),
            None => sshconf::KnownHosts::AcceptNew(known),
        },
        batch_mode: false,
        server_alive_interval_s: p.server_alive_interval_s,
        server_alive_count_max: p.server_alive_count_max,
        connect_timeout_s: p.connect_timeout_s.ceil() as u32,
    }
}

fn socks_block<'a>(s: &'a SocksSpec, known: &'a Path) -> sshconf::HostBlock<'a> {
    sshconf::HostBlock {
        alias: SOCKS_ALIAS,
        host_name: &s.login_node,
        port: s.ssh_port,
        user: s.user.as_deref(),
        identity_file: s.identity_file.as_deref(),
        known_hosts: match &s.known_hosts {
            Some(file) => sshconf::KnownHosts::Pinned(file),
            None => sshconf::KnownHosts::AcceptNew(known),
        },
        batch_mode: true,
        server_alive_interval_s: s.server_alive_interval_s,
        server_alive_count_max: s.server_alive_count_max,
        connect_timeout_s: s.connect_timeout_s.ceil() as u32,
    }
}

// ------------------------------------------------------------------------------------------- plan

/// What the tunnel step will do, for `payload plan` and events. Never holds a token.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TunnelPlan {
    pub kind: &'static str,
    pub description: String,
    /// ssh's argv (the config file shown as `<generated config>`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
    /// The generated ssh config with the user (token) replaced by its secret's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssh_config: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<String>,
    /// The bank in the order this job would try it, with what is known now (lease held, secret missing).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<String>,
    /// What Harbor gets from the tunnel (SOCKS `env` mode: the proxy variables).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub harbor_env: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub harbor_prefix: Vec<String>,
}

/// Inputs of the plan that `run` would know.
pub struct PlanInputs<'a> {
    pub secrets: &'a Secrets,
    pub job_id: &'a str,
    pub engine_host: &'a str,
    pub engine_port: u16,
    pub served_name: &'a str,
    pub node: String,
    pub child_path: &'a str,
}

pub const GENERATED: &str = "<generated per job>";

/// Describes the tunnel step without doing it; problems it would stop on go to `problems`.
pub fn plan(spec: &TunnelSpec, inp: &PlanInputs<'_>, problems: &mut Vec<Failure>) -> TunnelPlan {
    let mut plan = TunnelPlan {
        kind: kind(spec),
        description: String::new(),
        argv: Vec::new(),
        ssh_config: None,
        public_url: None,
        verify: None,
        pairs: Vec::new(),
        harbor_env: BTreeMap::new(),
        harbor_prefix: Vec::new(),
    };
    let progs = match programs(spec, inp.child_path) {
        Ok(p) => p,
        Err(e) => {
            problems.push(e.into());
            None
        }
    };
    let ssh = progs.as_ref().map(|p| p.ssh.display().to_string()).unwrap_or_else(|| "ssh".into());
    let cfg = "<generated config>";
    match spec {
        TunnelSpec::None => plan.description = "no tunnel: the agent calls vLLM on this node".into(),
        TunnelSpec::Pinggy(p) => {
            let pairs = p.pairs();
            let order = pair_order(pairs.len(), inp.job_id);
            let mut first: Option<&PinggyPair> = None;
            for i in &order {
                let pair = &pairs[*i];
                let mut note = String::new();
                if !inp.secrets.contains(&pair.token_secret) {
                    note = format!(" — secret {} not in the secrets file: skipped", pair.token_secret);
                } else if let Some(dir) = &p.lock_dir {
                    let path = lease::lease_path(dir, &pair.public_url);
                    if let Ok(text) = std::fs::read_to_string(&path) {
                        let holder = serde_json::from_str::<lease::Owner>(&text)
                            .map(|o| o.describe())
                            .unwrap_or_else(|_| "?".into());
                        note = format!(" — leased now by {holder} ({})", path.display());
                    }
                }
                if note.is_empty() && first.is_none() {
                    first = Some(pair);
                }
                plan.pairs.push(format!("{} (token from secret {}){note}", pair.public_url, pair.token_secret));
            }
            if !pairs.iter().any(|pair| inp.secrets.contains(&pair.token_secret)) {
                problems.push(
                    TunnelError::NoToken {
                        names: pairs.iter().map(|p| p.token_secret.clone()).collect::<Vec<_>>().join(", "),
                        file: inp.secrets.path().to_path_buf(),
                    }
                    .into(),
                );
            }
            let pair = first.unwrap_or(&pairs[order.first().copied().unwrap_or(0)]);
            plan.argv = pinggy_argv(&ssh, cfg, p, inp.engine_host, inp.engine_port);
            let user = format!("<token from secret {}>", pair.token_secret);
            let known = PathBuf::from("<private dir>/known_hosts");
            plan.ssh_config = sshconf::render(&pinggy_block(p, pair, &user, &known)).ok();
            let url = pair.public_url.trim_end_matches('/').to_string();
            plan.public_url = Some(url.clone());
            plan.verify = Some(format!(
                "GET {url}/v1/models with the per-job API key must list {} (up to {} tries, {} s apart) before Harbor starts",
                inp.served_name, p.verify_attempts, p.verify_interval_s
            ));
            // The per-job key reaches Harbor and vLLM through crate::prepare (the one place for that rule).
            plan.description = format!(
                "pinggy: {} (host {}:{}, user = token from secret {}), public URL {url} as Harbor's api_base {url}/v1; \
                 vLLM gets a per-job {VLLM_KEY_VAR}; {} pair(s) in the bank{}; restarts ≤ {} with backoff from {} s",
                shell_words::join(&plan.argv),
                pair.host.as_deref().unwrap_or(&p.host),
                p.port,
                pair.token_secret,
                pairs.len(),
                p.lock_dir.as_ref().map(|d| format!(", leases in {}", d.display())).unwrap_or_default(),
                p.max_restarts,
                p.restart_backoff_s,
            );
        }
        TunnelSpec::Socks(s) => {
            let port = match socks_port(s, inp.job_id, inp.engine_port) {
                Ok(port) => port,
                Err(e) => {
                    problems.push(TunnelError::Port(e).into());
                    s.port.fixed.unwrap_or(s.port.base)
                }
            };
            plan.argv = socks_argv(&ssh, cfg, port);
            let known = PathBuf::from("<private dir>/known_hosts");
            plan.ssh_config = sshconf::render(&socks_block(s, &known)).ok();
            plan.verify = Some(format!(
                "one request to {} through socks5h://127.0.0.1:{port} before Harbor starts",
                s.verify_url
            ));
            let how = match s.mode {
                ProxyMode::Env => {
                    plan.harbor_env = socks5::proxy_env(port, &s.no_proxy);
                    "Harbor gets ALL_PROXY/HTTPS_PROXY/HTTP_PROXY (and lower case) and NO_PROXY".to_string()
                }
                ProxyMode::Proxychains => {
                    let bin = progs
                        .as_ref()
                        .and_then(|p| p.proxychains.as_ref())
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| s.proxychains_bin.clone().unwrap_or_else(|| "proxychains4".into()));
                    plan.harbor_prefix = vec![bin, "-q".into(), "-f".into(), "<generated proxychains.conf>".into()];
                    format!(
                        "Harbor runs under {} with a generated config (strict_chain, local networks excluded)",
                        shell_words::join(&plan.harbor_prefix)
                    )
                }
            };
            plan.description = format!(
                "socks: {} (login node {}{}), port {port}; {how}; restarts ≤ {} with backoff from {} s",
                shell_words::join(&plan.argv),
                s.login_node,
                s.identity_file.as_ref().map(|k| format!(", key {}", k.display())).unwrap_or_default(),
                s.max_restarts,
                s.restart_backoff_s,
            );
        }
    }
    let _ = &inp.node;
    plan
}

// ---------------------------------------------------------------------------------------- runtime

/// A 0700 directory outside the run dir for the ssh config (holds the token), known hosts, ssh's
/// raw output and the proxychains config. Removed at teardown (and on drop).
#[derive(Debug)]
pub struct PrivateDir {
    pub path: PathBuf,
}

impl PrivateDir {
    pub fn create(root: &Path, tag: &str) -> std::io::Result<Self> {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
        let path = root.join(format!("payload-tunnel-{}-{}-{nanos:x}", tag, std::process::id()));
        std::fs::DirBuilder::new().recursive(false).mode(0o700).create(&path)?;
        Ok(Self { path })
    }

    /// Writes `name` with mode 0600 (temp file + rename, so a reader never sees half a file).
    pub fn write(&self, name: &str, text: &str) -> std::io::Result<PathBuf> {
        let path = self.path.join(name);
        let tmp = self.path.join(format!(".{name}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(text.as_bytes())?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        self.remove();
    }
}

/// What [`Tunnel::poll`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum TunnelPoll {
    Pending,
    Up,
    Failed(Failure),
}

enum State {
    Backoff { until: Instant },
    Starting { since: Instant, connected: bool },
    VerifyWait { until: Instant, attempt: u32 },
    Verifying { task: JoinHandle<Result<String, String>>, attempt: u32 },
    Up,
    Failed(Failure),
}

struct Held {
    pair: PinggyPair,
    token: String,
    lease: Option<lease::Lease>,
    /// The server authenticated this pair for us at least once (a restart may then `force`).
    had_session: bool,
}

struct PinggyRt {
    spec: PinggySpec,
    pairs: Vec<PinggyPair>,
    order: Vec<usize>,
    cursor: usize,
    tokens: BTreeMap<String, String>,
    held: Option<Held>,
    skipped: Vec<(String, String)>,
    owner: lease::Owner,
    verify: PathBuf,
    api_key: Option<String>,
    engine_host: String,
    engine_port: u16,
    served_name: String,
    force_next: bool,
    lease_lost: bool,
}

struct SocksRt {
    spec: SocksSpec,
    port: u16,
    prefix: Option<Vec<String>>,
}

enum Rt {
    Pinggy(Box<PinggyRt>),
    Socks(Box<SocksRt>),
}

/// Inputs to start a tunnel.
pub struct Start<'a> {
    pub spec: &'a TunnelSpec,
    pub programs: Programs,
    pub secrets: &'a Secrets,
    pub run_dir: &'a Path,
    pub run_tag: &'a str,
    pub job_id: &'a str,
    pub slurm_job_id: Option<String>,
    pub node: String,
    pub engine_host: &'a str,
    pub engine_port: u16,
    pub served_name: &'a str,
    pub api_key: Option<String>,
    /// Environment for ssh and curl (the explicit child environment).
    pub child_env: BTreeMap<String, String>,
    /// Where the private directory goes ($TMPDIR, else /tmp).
    pub tmp_root: PathBuf,
}

/// The running tunnel.
pub struct Tunnel {
    rt: Rt,
    ssh: PathBuf,
    dir: PrivateDir,
    config: PathBuf,
    known_hosts: PathBuf,
    raw_log: PathBuf,
    log: PathBuf,
    raw_offset: u64,
    partial: String,
    redact: Vec<String>,
    env: BTreeMap<String, String>,
    state: State,
    seen: output::Seen,
    restarts: u32,
    max_restarts: u32,
    backoff_s: f64,
    connect_timeout: Duration,
    verify_attempts: u32,
    verify_interval: Duration,
    attempts: u32,
    up_since: Option<Instant>,
    ever_up: bool,
    started: Instant,
    committed: bool,
    last_refresh: Instant,
    pub pid: Option<u32>,
}

impl Tunnel {
    /// Prepares the tunnel (private dir, configs, port or pair order); the first [`poll`](Self::poll)
    /// spawns ssh. `Ok(None)` for `none`.
    pub fn new(s: Start<'_>) -> Result<Option<Self>, Failure> {
        let dir = PrivateDir::create(&s.tmp_root, s.run_tag)
            .map_err(|e| TunnelError::PrivateDir { dir: s.tmp_root.clone(), reason: e.to_string() })?;
        let known_hosts = dir.path.join("known_hosts");
        let config = dir.path.join("ssh_config");
        let raw_log = dir.path.join("ssh.out");
        let log = s.run_dir.join(TUNNEL_LOG);
        let mut redact = Vec::new();
        let (rt, max_restarts, backoff_s, connect_timeout, verify_attempts, verify_interval) = match s.spec {
            TunnelSpec::None => return Ok(None),
            TunnelSpec::Pinggy(p) => {
                let pairs = p.pairs();
                let mut tokens = BTreeMap::new();
                for pair in &pairs {
                    if let Some(token) = s.secrets.get(&pair.token_secret) {
                        sshconf::check_user(token, &pair.token_secret).map_err(TunnelError::Config)?;
                        tokens.insert(pair.token_secret.clone(), token.to_string());
                        redact.push(token.to_string());
                    }
                }
                if tokens.is_empty() {
                    return Err(TunnelError::NoToken {
                        names: pairs.iter().map(|p| p.token_secret.clone()).collect::<Vec<_>>().join(", "),
                        file: s.secrets.path().to_path_buf(),
                    }
                    .into());
                }
                if let Some(key) = &s.api_key {
                    redact.push(key.clone());
                }
                let rt = PinggyRt {
                    order: pair_order(pairs.len(), s.job_id),
                    pairs,
                    cursor: 0,
                    tokens,
                    held: None,
                    skipped: Vec::new(),
                    owner: lease::Owner {
                        run_tag: s.run_tag.to_string(),
                        slurm_job_id: s.slurm_job_id.clone(),
                        node: s.node.clone(),
                        pid: std::process::id(),
                        public_url: String::new(),
                        acquired_at: String::new(),
                    },
                    verify: s.programs.verify.clone().unwrap_or_else(|| PathBuf::from("curl")),
                    api_key: s.api_key.clone(),
                    engine_host: s.engine_host.to_string(),
                    engine_port: s.engine_port,
                    served_name: s.served_name.to_string(),
                    force_next: false,
                    lease_lost: false,
                    spec: p.clone(),
                };
                (
                    Rt::Pinggy(Box::new(rt)),
                    p.max_restarts,
                    p.restart_backoff_s,
                    p.connect_timeout_s,
                    p.verify_attempts,
                    p.verify_interval_s,
                )
            }
            TunnelSpec::Socks(sp) => {
                let port = socks_port(sp, s.job_id, s.engine_port).map_err(TunnelError::Port)?;
                let text = sshconf::render(&socks_block(sp, &known_hosts)).map_err(TunnelError::Config)?;
                dir.write("ssh_config", &text)
                    .map_err(|e| TunnelError::PrivateDir { dir: dir.path.clone(), reason: e.to_string() })?;
                let prefix = match (&sp.mode, &s.programs.proxychains) {
                    (ProxyMode::Proxychains, Some(bin)) => {
                        let conf = dir
                            .write("proxychains.conf", &socks5::proxychains_conf(port))
                            .map_err(|e| TunnelError::PrivateDir { dir: dir.path.clone(), reason: e.to_string() })?;
                        Some(vec![bin.display().to_string(), "-q".into(), "-f".into(), conf.display().to_string()])
                    }
                    _ => None,
                };
                (
                    Rt::Socks(Box::new(SocksRt { spec: sp.clone(), port, prefix })),
                    sp.max_restarts,
                    sp.restart_backoff_s,
                    sp.connect_timeout_s,
                    sp.verify_attempts,
                    sp.verify_interval_s,
                )
            }
        };
        let now = Instant::now();
        Ok(Some(Self {
            rt,
            ssh: s.programs.ssh.clone(),
            dir,
            config,
            known_hosts,
            raw_log,
            log,
            raw_offset: 0,
            partial: String::new(),
            redact,
            env: s.child_env,
            state: State::Backoff { until: now },
            seen: output::Seen::default(),
            restarts: 0,
            max_restarts,
            backoff_s,
            connect_timeout: Duration::try_from_secs_f64(connect_timeout.max(1.0)).unwrap_or(Duration::from_secs(60)),
            verify_attempts: verify_attempts.max(1),
            verify_interval: Duration::try_from_secs_f64(verify_interval.max(0.05)).unwrap_or(Duration::from_secs(1)),
            attempts: 0,
            up_since: None,
            ever_up: false,
            started: now,
            committed: false,
            last_refresh: now,
            pid: None,
        }))
    }

    pub fn kind(&self) -> &'static str {
        match self.rt {
            Rt::Pinggy(_) => "pinggy",
            Rt::Socks(_) => "socks",
        }
    }

    pub fn is_up(&self) -> bool {
        matches!(self.state, State::Up)
    }

    /// The public URL of the pair in use (Pinggy), without a trailing slash.
    pub fn public_url(&self) -> Option<String> {
        match &self.rt {
            Rt::Pinggy(p) => p.held.as_ref().map(|h| h.pair.public_url.trim_end_matches('/').to_string()),
            Rt::Socks(_) => None,
        }
    }

    /// The local SOCKS port (SOCKS).
    pub fn socks_port(&self) -> Option<u16> {
        match &self.rt {
            Rt::Socks(s) => Some(s.port),
            Rt::Pinggy(_) => None,
        }
    }

    /// What Harbor's environment gets from the tunnel (SOCKS `env` mode: the proxy variables).
    pub fn harbor_env(&self) -> BTreeMap<String, String> {
        match &self.rt {
            Rt::Socks(s) if s.spec.mode == ProxyMode::Env => socks5::proxy_env(s.port, &s.spec.no_proxy),
            _ => BTreeMap::new(),
        }
    }

    /// The argv prefix Harbor runs under (SOCKS `proxychains` mode).
    pub fn harbor_prefix(&self) -> Option<Vec<String>> {
        match &self.rt {
            Rt::Socks(s) => s.prefix.clone(),
            Rt::Pinggy(_) => None,
        }
    }

    /// Harbor has the public URL now: the pair is fixed for the rest of the run.
    pub fn commit(&mut self) {
        self.committed = true;
    }

    fn redacted(&self, line: &str) -> String {
        let mut out = line.to_string();
        for v in &self.redact {
            if !v.is_empty() && out.contains(v.as_str()) {
                out = out.replace(v.as_str(), "<redacted>");
            }
        }
        out
    }

    fn append_log(&self, text: &str) {
        let result = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .and_then(|mut f| f.write_all(text.as_bytes()));
        if let Err(err) = result {
            tracing::warn!(error = %err, "cannot append to tunnel.log");
        }
    }

    /// One line of payload's own in `tunnel.log`.
    fn note(&self, text: &str) {
        let line = format!("[{}] payload: {}\n", crate::records::now(), self.redacted(text));
        self.append_log(&line);
    }

    /// Copies ssh's new output, redacted, into `tunnel.log` and classifies it.
    fn drain(&mut self) {
        let Ok(mut f) = std::fs::File::open(&self.raw_log) else { return };
        if f.seek(SeekFrom::Start(self.raw_offset)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        if f.read_to_end(&mut buf).is_err() || buf.is_empty() {
            return;
        }
        self.raw_offset += buf.len() as u64;
        self.partial.push_str(&String::from_utf8_lossy(&buf));
        let mut out = String::new();
        while let Some(i) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=i).collect();
            let line = self.redacted(line.trim_end_matches(['\n', '\r']));
            // Pinggy's TUI may draw with escape sequences; keep the text.
            let clean: String = line.chars().filter(|c| !c.is_control() || *c == '\t').collect();
            if clean.trim().is_empty() {
                continue;
            }
            self.seen.note(&clean);
            out.push_str(&clean);
            out.push('\n');
        }
        if !out.is_empty() {
            self.append_log(&out);
        }
    }

    fn fail(&mut self, rec: &Recorder, cause: &str, message: String) -> TunnelPoll {
        let message = self.redacted(&message);
        let f = Failure::new(OutcomeClass::Tunnel, message.clone()).with_cause(cause.to_string());
        rec.event("tunnel_failed", json!({ "kind": self.kind(), "cause": cause, "message": message }));
        self.note(&format!("giving up: {message} (cause {cause})"));
        tracing::error!(kind = self.kind(), cause, error = %message, "tunnel failed");
        if let State::Verifying { task, .. } = &self.state {
            task.abort();
        }
        self.state = State::Failed(f.clone());
        TunnelPoll::Failed(f)
    }

    /// Takes the next free pair of the bank (Pinggy); `None` when every pair was skipped.
    fn next_pair(&mut self, rec: &Recorder) -> Option<Held> {
        let Rt::Pinggy(p) = &mut self.rt else { return None };
        while p.cursor < p.order.len() {
            let pair = p.pairs[p.order[p.cursor]].clone();
            p.cursor += 1;
            let Some(token) = p.tokens.get(&pair.token_secret).cloned() else {
                p.skipped
                    .push((pair.public_url.clone(), format!("secret {} not in the secrets file", pair.token_secret)));
                rec.event(
                    "tunnel_pair_skipped",
                    json!({ "public_url": pair.public_url, "reason": "missing_secret", "secret": pair.token_secret }),
                );
                continue;
            };
            let mut lease = None;
            if let Some(dir) = &p.spec.lock_dir {
                let mut owner = p.owner.clone();
                owner.public_url = pair.public_url.clone();
                match lease::try_acquire(dir, &pair.public_url, &owner, Duration::from_secs(p.spec.lease_ttl_s)) {
                    Ok(lease::Acquire::Acquired(l)) => lease = Some(l),
                    Ok(lease::Acquire::Held(holder)) => {
                        p.skipped.push((pair.public_url.clone(), format!("leased by {}", holder.describe())));
                        rec.event(
                            "tunnel_pair_skipped",
                            json!({ "public_url": pair.public_url, "reason": "leased", "holder": holder }),
                        );
                        continue;
                    }
                    Err(e) => {
                        // A lock dir we cannot use must not stop the job: Pinggy's lock message still guards.
                        tracing::warn!(dir = %dir.display(), error = %e, "cannot use the Pinggy lease dir; going on without a lease");
                        rec.event("tunnel_lease_unavailable", json!({ "dir": dir, "error": e.to_string() }));
                    }
                }
            }
            rec.event("tunnel_pair", json!({ "public_url": pair.public_url, "secret": pair.token_secret, "lease": lease.as_ref().map(|l| &l.path) }));
            return Some(Held { pair, token, lease, had_session: false });
        }
        None
    }

    fn spawn(&mut self, sup: &mut Supervisor, rec: &mut Recorder) -> TunnelPoll {
        self.seen = output::Seen::default();
        let ssh = self.ssh.display().to_string();
        let config = self.config.display().to_string();
        let argv = match &self.rt {
            Rt::Socks(s) => socks_argv(&ssh, &config, s.port),
            Rt::Pinggy(_) => {
                let needs_pair = matches!(&self.rt, Rt::Pinggy(p) if p.held.is_none());
                if needs_pair {
                    let held = self.next_pair(rec);
                    let Rt::Pinggy(p) = &mut self.rt else { unreachable!() };
                    match held {
                        Some(h) => p.held = Some(h),
                        None => {
                            let tried =
                                p.skipped.iter().map(|(u, why)| format!("{u}: {why}")).collect::<Vec<_>>().join("; ");
                            let cause = if p.skipped.iter().any(|(_, w)| w == "token_locked") {
                                "token_locked"
                            } else if p.skipped.iter().any(|(_, w)| w == "not_authenticated") {
                                "not_authenticated"
                            } else {
                                "bank_exhausted"
                            };
                            return self.fail(rec, cause, format!("no usable Pinggy pair in the bank ({tried})"));
                        }
                    }
                }
                let Rt::Pinggy(p) = &mut self.rt else { unreachable!() };
                let held = p.held.as_ref().expect("pair chosen");
                let user = if p.force_next { format!("{}+force", held.token) } else { held.token.clone() };
                let text = match sshconf::render(&pinggy_block(&p.spec, &held.pair, &user, &self.known_hosts)) {
                    Ok(t) => t,
                    Err(e) => return self.fail(rec, "config", e.to_string()),
                };
                if let Err(e) = self.dir.write("ssh_config", &text) {
                    return self.fail(
                        rec,
                        "private_dir",
                        format!("cannot write the ssh config in {}: {e}", self.dir.path.display()),
                    );
                }
                pinggy_argv(&ssh, &config, &p.spec, &p.engine_host, p.engine_port)
            }
        };
        let child = ChildSpec {
            program: self.ssh.clone(),
            argv: argv.clone(),
            env: self.env.clone(),
            log: self.raw_log.clone(),
            cwd: None,
        };
        match sup.spawn(Role::Tunnel, &child) {
            Ok(pid) => {
                self.attempts += 1;
                self.pid = Some(pid);
                rec.status.pids.insert("tunnel".into(), pid);
                rec.write_status();
                let url = self.public_url();
                let force = matches!(&self.rt, Rt::Pinggy(p) if p.force_next);
                rec.event("tunnel_spawned", json!({ "kind": self.kind(), "pid": pid, "argv": argv, "attempt": self.attempts, "public_url": url, "force": force }));
                self.note(&format!(
                    "attempt {}: {}{}{}",
                    self.attempts,
                    shell_words::join(&argv),
                    url.map(|u| format!(" (public URL {u})")).unwrap_or_default(),
                    if force { " (with Pinggy's force keyword: replaces our own stale session)" } else { "" }
                ));
                self.state = State::Starting { since: Instant::now(), connected: false };
                TunnelPoll::Pending
            }
            Err(e) => self.fail(rec, "spawn", format!("cannot start {}: {e}", self.ssh.display())),
        }
    }

    fn term(&self, sup: &mut Supervisor) {
        if let Some(m) = sup.get_mut(Role::Tunnel) {
            m.signal_group(Signal::SIGTERM);
        }
    }

    fn verify_task(&self) -> JoinHandle<Result<String, String>> {
        match &self.rt {
            Rt::Socks(s) => {
                let port = s.port;
                let url = s.spec.verify_url.clone();
                tokio::spawn(async move { socks5::check(port, &url, VERIFY_TIMEOUT).await })
            }
            Rt::Pinggy(p) => {
                let program = p.verify.clone();
                let env = self.env.clone();
                let url = self.public_url().unwrap_or_default();
                let key = p.api_key.clone();
                let served = p.served_name.clone();
                tokio::spawn(async move {
                    verify::models(&program, &env, &url, key.as_deref(), &served, VERIFY_TIMEOUT).await
                })
            }
        }
    }

    /// ssh exited: fail over to the next pair, restart with backoff, or give up.
    fn on_exit(&mut self, status: std::process::ExitStatus, rec: &mut Recorder) -> TunnelPoll {
        let cause = output::cause(&self.seen);
        let detail = self.seen.last_problem.clone();
        if let State::Verifying { task, .. } = &self.state {
            task.abort();
        }
        self.pid = None;
        rec.status.pids.remove("tunnel");
        rec.event(
            "tunnel_exited",
            json!({ "kind": self.kind(), "status": describe_status(status), "cause": cause, "attempt": self.attempts, "detail": detail }),
        );
        self.note(&format!(
            "ssh exited ({}), cause {cause}{}",
            describe_status(status),
            detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default()
        ));
        let committed = self.committed;
        if let Rt::Pinggy(p) = &mut self.rt
            && !committed
            && (cause == "token_locked" || cause == "not_authenticated")
            && let Some(held) = p.held.take()
        {
            if let Some(l) = held.lease {
                l.release();
            }
            p.skipped.push((held.pair.public_url.clone(), cause.to_string()));
            rec.event("tunnel_pair_skipped", json!({ "public_url": held.pair.public_url, "reason": cause }));
            let url = held.pair.public_url.clone();
            self.note(&format!("pair {url} is unusable ({cause}); moving to the next free pair"));
            tracing::warn!(public_url = %url, cause, "Pinggy pair unusable; trying the next pair");
            self.state = State::Backoff { until: Instant::now() };
            return TunnelPoll::Pending;
        }
        if self.up_since.is_some_and(|t| t.elapsed() >= STABLE_AFTER) {
            self.restarts = 0;
        }
        self.up_since = None;
        self.restarts += 1;
        if self.restarts > self.max_restarts {
            let what = if self.ever_up { "dropped and could not be restored" } else { "could not be established" };
            return self.fail(
                rec,
                cause,
                format!(
                    "{} tunnel {what} after {} restart(s): {cause}{}",
                    self.kind(),
                    self.max_restarts,
                    detail.map(|d| format!(" ({d})")).unwrap_or_default()
                ),
            );
        }
        if let Rt::Pinggy(p) = &mut self.rt
            && p.spec.force_on_restart
            && p.held.as_ref().is_some_and(|h| h.had_session)
        {
            p.force_next = true;
        }
        let wait = backoff(self.backoff_s, self.restarts);
        rec.event("tunnel_restart", json!({ "kind": self.kind(), "restart": self.restarts, "max_restarts": self.max_restarts, "in_s": wait.as_secs_f64(), "cause": cause }));
        self.note(&format!("restart {}/{} in {:.1} s", self.restarts, self.max_restarts, wait.as_secs_f64()));
        tracing::warn!(
            kind = self.kind(),
            restart = self.restarts,
            max = self.max_restarts,
            cause,
            "tunnel down; restarting"
        );
        self.state = State::Backoff { until: Instant::now() + wait };
        TunnelPoll::Pending
    }

    /// Advances the state machine; call every few hundred milliseconds. `engine_ready` gates the
    /// Pinggy check (it fetches vLLM's `/v1/models` through the tunnel).
    pub async fn poll(&mut self, sup: &mut Supervisor, rec: &mut Recorder, engine_ready: bool) -> TunnelPoll {
        if let State::Failed(f) = &self.state {
            return TunnelPoll::Failed(f.clone());
        }
        self.drain();
        let pinggy = matches!(self.rt, Rt::Pinggy(_));
        let alive_state = !matches!(self.state, State::Backoff { .. });
        if alive_state && let Some(status) = sup.get_mut(Role::Tunnel).and_then(|m| m.try_status()) {
            self.drain();
            return self.on_exit(status, rec);
        }
        if pinggy && alive_state && (self.seen.locked || self.seen.not_authenticated) {
            // Pinggy may keep the session open after the message: end it; the exit is handled next.
            self.term(sup);
            return TunnelPoll::Pending;
        }
        if self.seen.authenticated
            && let Rt::Pinggy(p) = &mut self.rt
            && let Some(h) = p.held.as_mut()
        {
            h.had_session = true;
        }
        let now = Instant::now();
        let state = std::mem::replace(&mut self.state, State::Backoff { until: now });
        self.state = match state {
            State::Backoff { until } if now >= until => return self.spawn(sup, rec),
            State::Starting { since, connected } => {
                let elapsed = since.elapsed();
                let connected = connected
                    || match &self.rt {
                        Rt::Pinggy(_) => self.seen.established() || elapsed >= SETTLE,
                        Rt::Socks(_) => elapsed >= Duration::from_millis(200),
                    };
                if connected {
                    let urls = self.seen.urls.clone();
                    rec.event(
                        "tunnel_connected",
                        json!({ "kind": self.kind(), "authenticated": self.seen.authenticated, "urls": urls, "elapsed_ms": elapsed.as_millis() as u64 }),
                    );
                    if let Some(url) = self.public_url() {
                        let host = url.split("://").nth(1).unwrap_or(&url).to_string();
                        if !urls.is_empty() && !urls.iter().any(|u| u.contains(&host)) {
                            self.note(&format!(
                                "warning: the server announced {} but this pair's public URL is {url}",
                                urls.join(", ")
                            ));
                            rec.event("tunnel_url_mismatch", json!({ "announced": urls, "public_url": url }));
                        }
                    }
                    State::VerifyWait { until: now, attempt: 0 }
                } else if elapsed > self.connect_timeout {
                    self.seen.imposed = Some("connect_timeout");
                    self.note(&format!(
                        "no connection within {:.0} s; stopping this attempt",
                        self.connect_timeout.as_secs_f64()
                    ));
                    self.term(sup);
                    State::Starting { since, connected: false }
                } else {
                    State::Starting { since, connected: false }
                }
            }
            State::VerifyWait { until, attempt } if now >= until && (!pinggy || engine_ready) => {
                State::Verifying { task: self.verify_task(), attempt }
            }
            State::Verifying { task, attempt } if task.is_finished() => {
                let result = task.await.unwrap_or_else(|e| Err(format!("check task failed: {e}")));
                match result {
                    Ok(summary) => {
                        let elapsed = self.started.elapsed();
                        self.up_since = Some(Instant::now());
                        self.ever_up = true;
                        rec.event(
                            "tunnel_up",
                            json!({ "kind": self.kind(), "public_url": self.public_url(), "socks_port": self.socks_port(),
                                    "check": summary, "attempt": self.attempts, "elapsed_ms": elapsed.as_millis() as u64 }),
                        );
                        self.note(&format!("verified: {summary}"));
                        tracing::info!(kind = self.kind(), check = %summary, "tunnel up");
                        State::Up
                    }
                    Err(e) => {
                        let attempt = attempt + 1;
                        self.note(&format!("check {attempt}/{} failed: {e}", self.verify_attempts));
                        if attempt >= self.verify_attempts {
                            return self.fail(
                                rec,
                                "verify_failed",
                                format!("{} tunnel check failed {attempt} time(s); last: {e}", self.kind()),
                            );
                        }
                        State::VerifyWait { until: now + self.verify_interval, attempt }
                    }
                }
            }
            other => other,
        };
        if self.last_refresh.elapsed() >= LEASE_REFRESH {
            self.last_refresh = Instant::now();
            if let Rt::Pinggy(p) = &mut self.rt
                && let Some(l) = p.held.as_ref().and_then(|h| h.lease.as_ref())
                && !l.refresh()
                && !p.lease_lost
            {
                p.lease_lost = true;
                tracing::warn!(lease = %l.path.display(), "Pinggy lease is no longer ours (judged stale by another job?)");
                rec.event("tunnel_lease_lost", json!({ "lease": l.path }));
            }
        }
        if matches!(self.state, State::Up) { TunnelPoll::Up } else { TunnelPoll::Pending }
    }

    /// After teardown: last output, the lease released, the private directory removed.
    pub fn cleanup(&mut self, rec: &Recorder) {
        self.drain();
        if let Rt::Pinggy(p) = &mut self.rt
            && let Some(l) = p.held.as_mut().and_then(|h| h.lease.take())
        {
            let path = l.path.clone();
            l.release();
            rec.event("tunnel_lease_released", json!({ "lease": path }));
        }
        self.note("stopped; private directory removed");
        self.dir.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pinggy() -> PinggySpec {
        serde_json::from_value(json!({
            "host": "pro.pinggy.io", "public_url": "https://a.a.pinggy.link", "token_secret": "PINGGY_TOKEN",
            "bank": [{"public_url": "https://b.a.pinggy.link", "token_secret": "PINGGY_TOKEN_2"}]
        }))
        .unwrap()
    }

    #[test]
    fn argv_never_carries_the_token() {
        let p = pinggy();
        let a = pinggy_argv("/usr/bin/ssh", "/tmp/x/ssh_config", &p, "127.0.0.1", 23456);
        assert_eq!(a, ["/usr/bin/ssh", "-F", "/tmp/x/ssh_config", "-T", "-R", "0:127.0.0.1:23456", "payload-pinggy"]);
        assert_eq!(pinggy_argv("ssh", "c", &p, "0.0.0.0", 1)[5], "0:127.0.0.1:1");
        assert_eq!(pinggy_argv("ssh", "c", &p, "::1", 1)[5], "0:[::1]:1");
        let s = socks_argv("ssh", "c", 40001);
        assert_eq!(s, ["ssh", "-F", "c", "-N", "-D", "127.0.0.1:40001", "payload-socks"]);
    }

    #[test]
    fn pair_rotation_and_backoff() {
        assert_eq!(pair_order(3, "4"), vec![1, 2, 0]);
        assert_eq!(pair_order(3, "3"), vec![0, 1, 2]);
        assert_eq!(pair_order(1, "x"), vec![0]);
        assert!(pair_order(0, "x").is_empty());
        assert_eq!(backoff(2.0, 1), Duration::from_secs(2));
        assert_eq!(backoff(2.0, 3), Duration::from_secs(8));
        assert_eq!(backoff(1e20, 3), MAX_BACKOFF);
        assert_eq!(backoff(f64::NAN, 1), Duration::ZERO);
        assert_eq!(backoff(2.0, 40), MAX_BACKOFF);
    }

    #[test]
    fn plan_shows_no_token() {
        let spec = TunnelSpec::Pinggy(pinggy());
        let secrets =
            Secrets::from_pairs(Path::new("/s.env"), [("PINGGY_TOKEN_2".to_string(), "tok-secret-2".to_string())]);
        let mut problems = Vec::new();
        let inp = PlanInputs {
            secrets: &secrets,
            job_id: "3",
            engine_host: "127.0.0.1",
            engine_port: 23456,
            served_name: "Qwen3-8B",
            node: "n".into(),
            child_path: "/usr/bin:/bin",
        };
        let plan = plan(&spec, &inp, &mut problems);
        let text = serde_json::to_string(&plan).unwrap();
        assert!(!text.contains("tok-secret"), "{text}");
        // Pair a's secret is missing: b is the one the job would use.
        assert_eq!(plan.public_url.as_deref(), Some("https://b.a.pinggy.link"));
        assert!(
            plan.pairs.iter().any(|p| p.starts_with("https://a.") && p.contains("not in the secrets file")),
            "{:?}",
            plan.pairs
        );
        assert!(plan.ssh_config.as_deref().unwrap().contains("User <token from secret PINGGY_TOKEN_2>"));
        assert!(plan.description.starts_with("pinggy: "), "{}", plan.description);
        assert!(plan.harbor_env.is_empty(), "the per-job key is crate::prepare's: {:?}", plan.harbor_env);
        assert!(problems.iter().all(|p| p.cause.as_deref() != Some("missing_token")));
    }

    #[test]
    fn private_dir_is_0700_and_files_0600() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let path;
        {
            let dir = PrivateDir::create(root.path(), "t").unwrap();
            path = dir.path.clone();
            assert_eq!(std::fs::metadata(&dir.path).unwrap().permissions().mode() & 0o777, 0o700);
            let f = dir.write("ssh_config", "x").unwrap();
            assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
            dir.write("ssh_config", "y").unwrap();
            assert_eq!(std::fs::read_to_string(&f).unwrap(), "y");
        }
        assert!(!path.exists());
    }
}
