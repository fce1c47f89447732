//! Tunnels (docs/design.md §6.5, docs/tunnels.md): `none`; a **Pinggy** reverse tunnel for installed-harness
//! agents (the agent runs in the remote sandbox and calls the model back over a public URL); a
//! **SOCKS** egress proxy through a login node for compute nodes without internet; and both in one
//! job for installed-harness agents on such clusters (Pinggy's `egress`).
//!
//! Each tunnel is an `ssh` child in its own process group (role [`Role::Tunnel`]; the egress proxy
//! of a combined job [`Role::Egress`]), torn down last. What it does next is decided by a machine
//! without I/O ([`machine`]) with Pinggy and SOCKS as two strategies ([`strategy`]); [`Tunnel`] is
//! the thin driver that reads ssh's output, writes `tunnel.log`, spawns and signals ssh, runs the
//! checks ([`verify`]), holds the leases ([`lease`]) and records the events. `payload plan` steps
//! the same machines once and shows their first actions ([`plan`]).
//!
//! Secrets: the Pinggy token is the ssh `User` in a generated 0600 config in a run-private
//! directory outside the run dir (never in argv, logs, status or the spec); ssh's raw output goes
//! to that directory and is copied, redacted, into `tunnel.log`.

pub(crate) mod lease;
pub(crate) mod machine;
pub(crate) mod output;
pub(crate) mod socks;
pub(crate) mod sshconf;
pub(crate) mod strategy;
pub(crate) mod verify;

use std::collections::{BTreeMap, VecDeque};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use launch_spec::OutcomeClass;
use launch_spec::records::TUNNEL_LOG;
use launch_spec::rundir::EventBody;
use launch_spec::rundir::events::{TunnelLeaseLost, TunnelLeaseReleased};
use launch_spec::spec::{PinggySpec, ProxyMode, SocksSpec, TunnelSpec};
use nix::sys::signal::Signal;
use tokio::task::JoinHandle;

use crate::failure::Failure;
use crate::records::Recorder;
use crate::secrets::Secrets;
use crate::supervisor::{ChildSpec, Role, Supervisor, describe_status};
use machine::{Action, Input, LeaseAnswer, Machine, Phase};
pub(crate) use strategy::{SOCKS_ALIAS, pair_order};
#[cfg(test)] // used only by the tests
use {
    machine::{MAX_BACKOFF, backoff},
    strategy::{pinggy_argv, socks_argv},
};

/// vLLM reads its API key from this variable (never from argv).
pub(crate) const VLLM_KEY_VAR: &str = "VLLM_API_KEY";
/// Shown instead of the per-job key by `payload plan`.
pub(crate) const GENERATED: &str = "<generated per job>";

pub(crate) fn kind(spec: &TunnelSpec) -> &'static str {
    match spec {
        TunnelSpec::None => "none",
        TunnelSpec::Pinggy(p) if p.egress.is_some() => "pinggy+socks",
        TunnelSpec::Pinggy(_) => "pinggy",
        TunnelSpec::Socks(_) => "socks",
    }
}

/// Whether vLLM is reachable from outside (then it gets a per-job API key).
pub(crate) fn exposes_model(spec: &TunnelSpec) -> bool {
    matches!(spec, TunnelSpec::Pinggy(_))
}

/// Secret names the tunnel needs from the secrets file.
pub(crate) fn secret_names(spec: &TunnelSpec) -> Vec<String> {
    match spec {
        TunnelSpec::Pinggy(p) => p.pairs().into_iter().map(|pair| pair.token_secret).collect(),
        _ => Vec::new(),
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum TunnelError {
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
    pub proxychains: Option<PathBuf>,
}

/// Resolves the tunnel's programs (`ssh`; the proxychains binary in that mode).
pub(crate) fn programs(spec: &TunnelSpec, child_path: &str) -> Result<Option<Programs>, TunnelError> {
    let kind = self::kind(spec);
    let resolve = |program: &str, why: &'static str| {
        crate::childenv::resolve_program(program, None, child_path).map_err(|_| TunnelError::MissingProgram {
            kind,
            program: program.to_string(),
            why,
        })
    };
    if matches!(spec, TunnelSpec::None) {
        return Ok(None);
    }
    Ok(Some(Programs {
        ssh: resolve("ssh", "OpenSSH client")?,
        proxychains: match socks_spec(spec) {
            Some(s) if s.mode == ProxyMode::Proxychains => {
                Some(resolve(s.proxychains_bin.as_deref().unwrap_or("proxychains4"), "tunnel.mode proxychains")?)
            }
            _ => None,
        },
    }))
}

/// The SOCKS settings of a spec: a `socks` tunnel, or a Pinggy tunnel's egress.
pub(crate) fn socks_spec(spec: &TunnelSpec) -> Option<&SocksSpec> {
    match spec {
        TunnelSpec::Socks(s) => Some(s),
        TunnelSpec::Pinggy(p) => p.egress.as_deref(),
        TunnelSpec::None => None,
    }
}

/// The SOCKS port: the spec's policy, never the engine's port.
pub(crate) fn socks_port(spec: &SocksSpec, job_id: &str, engine_port: u16) -> Result<u16, crate::ports::PortError> {
    crate::ports::choose_with(&spec.port, job_id, |p| p != engine_port && crate::ports::is_free(p, "127.0.0.1"))
}

// ------------------------------------------------------------------------------ the job's tunnels

/// One instance a spec runs: its role, strategy kind and settings.
enum Part<'a> {
    Pinggy(&'a PinggySpec),
    Socks(&'a SocksSpec),
}

/// The instances of a spec, the egress proxy first (Pinggy's check goes through it).
fn parts(spec: &TunnelSpec) -> Vec<(Role, Part<'_>)> {
    match spec {
        TunnelSpec::None => Vec::new(),
        TunnelSpec::Socks(s) => vec![(Role::Tunnel, Part::Socks(s))],
        TunnelSpec::Pinggy(p) => match &p.egress {
            Some(s) => vec![(Role::Egress, Part::Socks(s)), (Role::Tunnel, Part::Pinggy(p))],
            None => vec![(Role::Tunnel, Part::Pinggy(p))],
        },
    }
}

/// What every instance's strategy needs beside its spec (the same for `run` and `plan`).
struct Ctx<'a> {
    ssh: String,
    /// Secret name → token; `plan` passes placeholders naming the secret.
    tokens: BTreeMap<String, String>,
    job_id: &'a str,
    engine_host: &'a str,
    engine_port: u16,
    served_name: &'a str,
    /// The local SOCKS port, when the spec has a SOCKS part.
    socks_port: Option<u16>,
}

fn strategy_for(
    spec: &TunnelSpec,
    part: &Part<'_>,
    ctx: &Ctx<'_>,
    paths: strategy::Paths,
) -> Box<dyn machine::Strategy> {
    match part {
        Part::Socks(s) => Box::new(strategy::Socks {
            spec: (*s).clone(),
            port: ctx.socks_port.unwrap_or(s.port.base),
            ssh: ctx.ssh.clone(),
            paths,
        }),
        Part::Pinggy(p) => Box::new(strategy::Pinggy::new(
            p,
            strategy::PinggyTarget {
                ssh: ctx.ssh.clone(),
                paths,
                tokens: ctx.tokens.clone(),
                job_id: ctx.job_id.to_string(),
                engine_host: ctx.engine_host.to_string(),
                engine_port: ctx.engine_port,
                served_name: ctx.served_name.to_string(),
                egress: socks_spec(spec).cloned().zip(ctx.socks_port),
            },
        )),
    }
}

/// The Pinggy tokens present in the secrets file (`shown`: each as `<token from secret NAME>`).
fn tokens(spec: &TunnelSpec, secrets: &Secrets, shown: bool) -> Result<BTreeMap<String, String>, TunnelError> {
    let TunnelSpec::Pinggy(p) = spec else { return Ok(BTreeMap::new()) };
    let pairs = p.pairs();
    let mut tokens = BTreeMap::new();
    for pair in &pairs {
        if let Some(token) = secrets.get(&pair.token_secret) {
            sshconf::check_user(token, &pair.token_secret)?;
            let value = if shown { format!("<token from secret {}>", pair.token_secret) } else { token.to_string() };
            tokens.insert(pair.token_secret.clone(), value);
        }
    }
    if tokens.is_empty() {
        return Err(TunnelError::NoToken {
            names: pairs.iter().map(|p| p.token_secret.clone()).collect::<Vec<_>>().join(", "),
            file: secrets.path().to_path_buf(),
        });
    }
    Ok(tokens)
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
    /// The machine's first actions, as `run` would do them now (leases looked at, not taken).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<String>,
    /// What Harbor gets from the tunnel (SOCKS `env` mode: the proxy variables; the per-job key and
    /// the agent's variables are crate::prepare's).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub harbor_env: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub harbor_prefix: Vec<String>,
    /// The egress proxy a Pinggy tunnel runs beside it on a cluster without internet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<Box<TunnelPlan>>,
}

impl TunnelPlan {
    fn empty(kind: &'static str) -> Self {
        Self {
            kind,
            description: String::new(),
            argv: Vec::new(),
            ssh_config: None,
            public_url: None,
            verify: None,
            pairs: Vec::new(),
            actions: Vec::new(),
            harbor_env: BTreeMap::new(),
            harbor_prefix: Vec::new(),
            egress: None,
        }
    }
}

/// Inputs of the plan that `run` would know.
pub(crate) struct PlanInputs<'a> {
    pub secrets: &'a Secrets,
    pub job_id: &'a str,
    pub(crate) engine_host: &'a str,
    pub(crate) engine_port: u16,
    pub served_name: &'a str,
    pub node: String,
    pub(crate) child_path: &'a str,
}

/// Steps a fresh machine until its first spawn, answering lease requests by looking at the lease
/// files (never taking one): the actions `run` would take first, rendered.
fn first_actions(m: &mut Machine, plan: &mut TunnelPlan) {
    let now = Instant::now();
    let mut queue: VecDeque<Action> = m.step(now, Input::Tick { ready: true }).into();
    while let Some(action) = queue.pop_front() {
        let answer = match action {
            Action::Spawn { config, argv } => {
                plan.actions.push(format!("write the ssh config (0600) and start {}", shell_words::join(&argv)));
                plan.ssh_config = Some(config);
                plan.argv = argv;
                break;
            }
            Action::AcquireLease { dir, public_url, .. } => {
                let path = lease::lease_path(&dir, &public_url);
                let answer = match std::fs::read_to_string(&path) {
                    Ok(text) => {
                        let owner: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                        let holder = serde_json::from_value::<lease::Owner>(owner.clone())
                            .map(|o| o.describe())
                            .unwrap_or_else(|_| "?".into());
                        LeaseAnswer::Held { holder, owner }
                    }
                    Err(_) => LeaseAnswer::Acquired(path.clone()),
                };
                plan.actions.push(format!("lease {public_url} ({}): {answer:?}", path.display()));
                Some(Input::Lease(answer))
            }
            Action::Event(body) => {
                let fields = body.to_fields().map(serde_json::Value::Object).unwrap_or_default();
                plan.actions.push(format!("event {} {fields}", body.kind().as_str()));
                None
            }
            Action::Note(text) => {
                plan.actions.push(format!("note: {text}"));
                None
            }
            other => {
                plan.actions.push(format!("{other:?}"));
                None
            }
        };
        if let Some(input) = answer {
            for a in m.step(now, input).into_iter().rev() {
                queue.push_front(a);
            }
        }
    }
}

/// Describes the tunnel step without doing it; problems it would stop on go to `problems`.
pub(crate) fn plan(spec: &TunnelSpec, inp: &PlanInputs<'_>, problems: &mut Vec<Failure>) -> TunnelPlan {
    let progs = match programs(spec, inp.child_path) {
        Ok(p) => p,
        Err(e) => {
            problems.push(e.into());
            None
        }
    };
    let tokens = tokens(spec, inp.secrets, true).unwrap_or_else(|e| {
        problems.push(e.into());
        BTreeMap::new()
    });
    let socks_port = socks_spec(spec).map(|s| {
        socks_port(s, inp.job_id, inp.engine_port).unwrap_or_else(|e| {
            problems.push(TunnelError::Port(e).into());
            s.port.fixed.unwrap_or(s.port.base)
        })
    });
    let ctx = Ctx {
        ssh: progs.as_ref().map(|p| p.ssh.display().to_string()).unwrap_or_else(|| "ssh".into()),
        tokens,
        job_id: inp.job_id,
        engine_host: inp.engine_host,
        engine_port: inp.engine_port,
        served_name: inp.served_name,
        socks_port,
    };
    let mut plans = Vec::new();
    for (_, part) in parts(spec) {
        let paths = strategy::Paths {
            config: "<generated config>".into(),
            known_hosts: PathBuf::from("<private dir>/known_hosts"),
        };
        let mut m = Machine::new(strategy_for(spec, &part, &ctx, paths), Instant::now());
        let mut plan = TunnelPlan::empty(m.kind());
        first_actions(&mut m, &mut plan);
        if let Phase::Failed(f) = m.phase() {
            plan.actions.push(format!("would stop now: {}", f.message));
        }
        match part {
            Part::Pinggy(p) => describe_pinggy(p, &m, inp, &mut plan),
            Part::Socks(s) => describe_socks(s, ctx.socks_port.unwrap_or(s.port.base), progs.as_ref(), &mut plan),
        }
        plans.push(plan);
    }
    let Some(mut main) = plans.pop() else {
        let mut none = TunnelPlan::empty("none");
        none.description = "no tunnel: the agent calls vLLM on this node".into();
        return none;
    };
    if let Some(egress) = plans.pop() {
        main.kind = kind(spec);
        main.harbor_env.extend(egress.harbor_env.clone());
        main.harbor_prefix = egress.harbor_prefix.clone();
        main.description = format!("{}; through the egress proxy below", main.description);
        main.egress = Some(Box::new(egress));
    }
    let _ = &inp.node;
    main
}

fn describe_pinggy(p: &PinggySpec, m: &Machine, inp: &PlanInputs<'_>, plan: &mut TunnelPlan) {
    let pairs = p.pairs();
    let order = pair_order(pairs.len(), inp.job_id);
    for i in &order {
        let pair = &pairs[*i];
        let mut note = String::new();
        if !inp.secrets.contains(&pair.token_secret) {
            note = format!(" — secret {} not in the secrets file: skipped", pair.token_secret);
        } else if let Some(dir) = &p.lock_dir {
            let path = lease::lease_path(dir, &pair.public_url);
            if let Ok(text) = std::fs::read_to_string(&path) {
                let holder =
                    serde_json::from_str::<lease::Owner>(&text).map(|o| o.describe()).unwrap_or_else(|_| "?".into());
                note = format!(" — leased now by {holder} ({})", path.display());
            }
        }
        plan.pairs.push(format!("{} (token from secret {}){note}", pair.public_url, pair.token_secret));
    }
    // The pair the machine chose; when none is usable now, the first in this job's order.
    let pair = m
        .public_url()
        .and_then(|url| pairs.iter().find(|p| p.public_url.trim_end_matches('/') == url))
        .unwrap_or(&pairs[order.first().copied().unwrap_or(0)]);
    let url = pair.public_url.trim_end_matches('/').to_string();
    plan.public_url = Some(url.clone());
    plan.verify = Some(format!(
        "GET {url}/v1/models with the per-job API key must list {} (up to {} tries, {} s apart){} before Harbor starts",
        inp.served_name,
        p.verify_attempts,
        p.verify_interval_s,
        if p.egress.is_some() { ", through the egress proxy" } else { "" }
    ));
    plan.description = format!(
        "pinggy: {} (host {}:{}, user = token from secret {}{}), public URL {url} as Harbor's api_base {url}/v1; \
         vLLM gets a per-job {VLLM_KEY_VAR}; {} pair(s) in the bank{}; restarts ≤ {} with backoff from {} s",
        shell_words::join(&plan.argv),
        pair.host.as_deref().unwrap_or(&p.host),
        p.port,
        pair.token_secret,
        if p.egress.is_some() { format!(", ProxyJump {SOCKS_ALIAS}") } else { String::new() },
        pairs.len(),
        p.lock_dir.as_ref().map(|d| format!(", leases in {}", d.display())).unwrap_or_default(),
        p.max_restarts,
        p.restart_backoff_s,
    );
}

fn describe_socks(s: &SocksSpec, port: u16, progs: Option<&Programs>, plan: &mut TunnelPlan) {
    plan.verify =
        Some(format!("one request to {} through socks5h://127.0.0.1:{port} before Harbor starts", s.verify_url));
    let how = match s.mode {
        ProxyMode::Env => {
            plan.harbor_env = socks::proxy_env(port, &s.no_proxy);
            "Harbor gets ALL_PROXY/HTTPS_PROXY/HTTP_PROXY (and lower case) and NO_PROXY".to_string()
        }
        ProxyMode::Proxychains => {
            let bin = progs
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

/// `payload plan`'s text for the tunnel (and its egress proxy).
pub(crate) fn write_plan(out: &mut dyn std::io::Write, t: &TunnelPlan) -> std::io::Result<()> {
    writeln!(out, "tunnel: {} — {}", t.kind, t.description)?;
    write_plan_body(out, t, "  ")?;
    if let Some(e) = &t.egress {
        writeln!(out, "  egress: {} — {}", e.kind, e.description)?;
        write_plan_body(out, e, "    ")?;
    }
    Ok(())
}

fn write_plan_body(out: &mut dyn std::io::Write, t: &TunnelPlan, indent: &str) -> std::io::Result<()> {
    if !t.argv.is_empty() {
        writeln!(out, "{indent}argv: {}", shell_words::join(&t.argv))?;
    }
    if let Some(config) = &t.ssh_config {
        writeln!(out, "{indent}ssh config (0600, in a private directory outside the run dir):")?;
        for line in config.lines().filter(|l| !l.starts_with('#')) {
            writeln!(out, "{indent}  {line}")?;
        }
    }
    if !t.pairs.is_empty() {
        writeln!(out, "{indent}bank, in this job's order:")?;
        for p in &t.pairs {
            writeln!(out, "{indent}  {p}")?;
        }
    }
    if let Some(v) = &t.verify {
        writeln!(out, "{indent}verify: {v}")?;
    }
    if !t.actions.is_empty() {
        writeln!(out, "{indent}first actions:")?;
        for a in &t.actions {
            writeln!(out, "{indent}  {a}")?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------- runtime

/// The ssh config's name in the private directory.
const SSH_CONFIG: &str = "ssh_config";
/// Most bytes of ssh's output read in one poll.
const RAW_READ_CAP: u64 = 1 << 20;

/// A 0700 directory outside the run dir for the ssh config (holds the token), known hosts, ssh's
/// raw output and the proxychains config. Removed at teardown (and on drop).
#[derive(Debug)]
pub(crate) struct PrivateDir {
    pub path: PathBuf,
}

impl PrivateDir {
    pub(crate) fn create(root: &Path, tag: &str) -> std::io::Result<Self> {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
        let path = root.join(format!("payload-tunnel-{}-{}-{nanos:x}", tag, std::process::id()));
        std::fs::DirBuilder::new().recursive(false).mode(0o700).create(&path)?;
        Ok(Self { path })
    }

    /// Writes `name` with mode 0600 (temp file + rename, so a reader never sees half a file).
    pub(crate) fn write(&self, name: &str, text: &str) -> std::io::Result<PathBuf> {
        let path = self.path.join(name);
        let tmp = self.path.join(format!(".{name}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(text.as_bytes())?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    pub(crate) fn remove(&self) {
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
pub(crate) enum TunnelPoll {
    Pending,
    Up,
    Failed(Failure),
}

/// Inputs to start a tunnel.
pub(crate) struct Start<'a> {
    pub spec: &'a TunnelSpec,
    pub programs: Programs,
    pub secrets: &'a Secrets,
    pub run_dir: &'a Path,
    pub run_tag: &'a str,
    pub job_id: &'a str,
    pub slurm_job_id: Option<String>,
    pub node: String,
    pub(crate) engine_host: &'a str,
    pub(crate) engine_port: u16,
    pub served_name: &'a str,
    pub api_key: Option<String>,
    /// Environment for ssh (the explicit child environment).
    pub(crate) child_env: BTreeMap<String, String>,
    /// Where the private directory goes ($TMPDIR, else /tmp).
    pub(crate) tmp_root: PathBuf,
}

/// One running instance: its machine and its I/O state.
struct Instance {
    role: Role,
    /// The egress proxy of a job with both: its lines in `tunnel.log` start `[egress] `, its notes
    /// `payload: egress: ` (the Pinggy side's read as with a single tunnel, which `submitter check`
    /// parses).
    label: Option<&'static str>,
    machine: Machine,
    dir: PrivateDir,
    raw_log: PathBuf,
    /// ssh's output, read through this handle: its name is removed once ssh runs, so a payload
    /// killed by SIGKILL leaves no file with what Pinggy prints (the token) under $TMPDIR.
    raw: Option<std::fs::File>,
    raw_offset: u64,
    partial: String,
    check: Option<JoinHandle<Result<String, String>>>,
    lease: Option<lease::Lease>,
    lease_lost: bool,
    pid: Option<u32>,
    harbor_env: BTreeMap<String, String>,
    harbor_prefix: Option<Vec<String>>,
}

/// What the driver's I/O shares across instances.
struct Io {
    ssh: PathBuf,
    log: PathBuf,
    redact: Vec<String>,
    env: BTreeMap<String, String>,
    api_key: Option<String>,
    owner: lease::Owner,
}

/// The job's tunnels: one instance, or the egress proxy and Pinggy.
pub(crate) struct Tunnel {
    kind: &'static str,
    instances: Vec<Instance>,
    io: Io,
}

impl Tunnel {
    /// Prepares the tunnel (private directories, proxychains config, port, pair order); the first
    /// [`poll`](Self::poll) starts ssh. `Ok(None)` for `none`.
    pub(crate) fn new(s: Start<'_>) -> Result<Option<Self>, Failure> {
        let parts = parts(s.spec);
        if parts.is_empty() {
            return Ok(None);
        }
        let tokens = tokens(s.spec, s.secrets, false)?;
        let mut redact: Vec<String> = tokens.values().cloned().collect();
        redact.extend(s.api_key.clone());
        let socks_port = match socks_spec(s.spec) {
            Some(sp) => Some(socks_port(sp, s.job_id, s.engine_port).map_err(TunnelError::Port)?),
            None => None,
        };
        let ctx = Ctx {
            ssh: s.programs.ssh.display().to_string(),
            tokens,
            job_id: s.job_id,
            engine_host: s.engine_host,
            engine_port: s.engine_port,
            served_name: s.served_name,
            socks_port,
        };
        let now = Instant::now();
        let mut instances = Vec::new();
        for (role, part) in parts {
            let private =
                |e: std::io::Error| TunnelError::PrivateDir { dir: s.tmp_root.clone(), reason: e.to_string() };
            let dir = PrivateDir::create(&s.tmp_root, &format!("{}-{}", s.run_tag, role.as_str())).map_err(private)?;
            let config = dir.path.join(SSH_CONFIG);
            let paths =
                strategy::Paths { config: config.display().to_string(), known_hosts: dir.path.join("known_hosts") };
            let machine = Machine::new(strategy_for(s.spec, &part, &ctx, paths), now);
            let (mut harbor_env, mut harbor_prefix) = (BTreeMap::new(), None);
            if let (Part::Socks(sp), Some(port)) = (&part, socks_port) {
                match sp.mode {
                    ProxyMode::Env => harbor_env = socks::proxy_env(port, &sp.no_proxy),
                    ProxyMode::Proxychains => {
                        if let Some(bin) = &s.programs.proxychains {
                            let conf =
                                dir.write("proxychains.conf", &socks::proxychains_conf(port)).map_err(private)?;
                            harbor_prefix = Some(vec![
                                bin.display().to_string(),
                                "-q".into(),
                                "-f".into(),
                                conf.display().to_string(),
                            ]);
                        }
                    }
                }
            }
            instances.push(Instance {
                role,
                label: (role == Role::Egress).then_some("egress"),
                raw_log: dir.path.join("ssh.out"),
                machine,
                dir,
                raw: None,
                raw_offset: 0,
                partial: String::new(),
                check: None,
                lease: None,
                lease_lost: false,
                pid: None,
                harbor_env,
                harbor_prefix,
            });
        }
        Ok(Some(Self {
            kind: kind(s.spec),
            instances,
            io: Io {
                ssh: s.programs.ssh.clone(),
                log: s.run_dir.join(TUNNEL_LOG),
                redact,
                env: s.child_env,
                api_key: s.api_key,
                owner: lease::Owner {
                    run_tag: s.run_tag.to_string(),
                    slurm_job_id: s.slurm_job_id,
                    node: s.node,
                    pid: std::process::id(),
                    public_url: String::new(),
                    acquired_at: String::new(),
                },
            },
        }))
    }

    pub(crate) fn kind(&self) -> &'static str {
        self.kind
    }

    /// The public URL of the pair in use (Pinggy), without a trailing slash.
    pub(crate) fn public_url(&self) -> Option<String> {
        self.instances.iter().find_map(|i| i.machine.public_url())
    }

    /// The local SOCKS port (SOCKS, or the egress proxy).
    pub(crate) fn socks_port(&self) -> Option<u16> {
        self.instances.iter().find_map(|i| i.machine.socks_port())
    }

    /// What Harbor's environment gets from the tunnel (SOCKS `env` mode: the proxy variables).
    pub(crate) fn harbor_env(&self) -> BTreeMap<String, String> {
        self.instances.iter().flat_map(|i| i.harbor_env.clone()).collect()
    }

    /// The argv prefix Harbor runs under (SOCKS `proxychains` mode).
    pub(crate) fn harbor_prefix(&self) -> Option<Vec<String>> {
        self.instances.iter().find_map(|i| i.harbor_prefix.clone())
    }

    /// Harbor has the public URL now: the pair is fixed for the rest of the run.
    pub(crate) fn commit(&mut self) {
        let now = Instant::now();
        for i in &mut self.instances {
            i.machine.step(now, Input::Commit);
        }
    }

    /// Advances every instance: call every few hundred milliseconds. `engine_ready` gates the
    /// Pinggy check (it fetches vLLM's `/v1/models` through the tunnel), as does the egress proxy
    /// being up when the check goes through it.
    pub(crate) async fn poll(&mut self, sup: &mut Supervisor, rec: &mut Recorder, engine_ready: bool) -> TunnelPoll {
        let egress_up =
            self.instances.iter().filter(|i| i.role == Role::Egress).all(|i| i.machine.phase() == Phase::Up);
        for inst in &mut self.instances {
            let ready = inst.machine.socks_port().is_some() || (engine_ready && egress_up);
            self.io.advance(inst, sup, rec, ready).await;
        }
        let mut up = true;
        for inst in &self.instances {
            match inst.machine.phase() {
                Phase::Failed(f) => return TunnelPoll::Failed(f),
                Phase::Pending => up = false,
                Phase::Up => {}
            }
        }
        if up { TunnelPoll::Up } else { TunnelPoll::Pending }
    }

    /// After teardown: last output, the leases released, the private directories removed.
    pub(crate) fn cleanup(&mut self, rec: &Recorder) {
        for inst in &mut self.instances {
            for line in self.io.drain(inst) {
                inst.machine.step(Instant::now(), Input::Line(line));
            }
            if let Some(task) = inst.check.take() {
                task.abort();
            }
            if let Some(l) = inst.lease.take() {
                let path = l.path.clone();
                l.release();
                rec.event(TunnelLeaseReleased { lease: path });
            }
            self.io.note(inst, "stopped; private directory removed");
            inst.dir.remove();
        }
    }
}

impl Io {
    /// Feeds one instance what happened since the last poll, then a tick.
    async fn advance(&self, inst: &mut Instance, sup: &mut Supervisor, rec: &mut Recorder, ready: bool) {
        let now = Instant::now();
        for line in self.drain(inst) {
            self.feed(inst, sup, rec, now, Input::Line(line));
        }
        if inst.pid.is_some()
            && let Some(status) = sup.get_mut(inst.role).and_then(|m| m.try_status())
        {
            for line in self.drain(inst) {
                self.feed(inst, sup, rec, now, Input::Line(line));
            }
            inst.pid = None;
            rec.status.pids.remove(inst.role.as_str());
            self.feed(inst, sup, rec, now, Input::Exited(describe_status(status)));
        }
        if inst.check.as_ref().is_some_and(|t| t.is_finished())
            && let Some(task) = inst.check.take()
        {
            let result = task.await.unwrap_or_else(|e| Err(format!("check task failed: {e}")));
            self.feed(inst, sup, rec, now, Input::VerifyDone(result));
        }
        self.feed(inst, sup, rec, now, Input::Tick { ready });
    }

    /// Steps the machine with `input` and does its actions; answers are fed back at once.
    fn feed(&self, inst: &mut Instance, sup: &mut Supervisor, rec: &mut Recorder, now: Instant, input: Input) {
        let mut queue: VecDeque<Action> = inst.machine.step(now, input).into();
        while let Some(action) = queue.pop_front() {
            if let Some(answer) = self.act(inst, sup, rec, action) {
                for a in inst.machine.step(now, answer).into_iter().rev() {
                    queue.push_front(a);
                }
            }
        }
    }

    /// Does one action; some have an answer for the machine.
    fn act(&self, inst: &mut Instance, sup: &mut Supervisor, rec: &mut Recorder, action: Action) -> Option<Input> {
        match action {
            Action::Spawn { config, argv } => Some(Input::Spawned(self.spawn(inst, sup, rec, &config, argv))),
            Action::Term => {
                if let Some(m) = sup.get_mut(inst.role) {
                    m.signal_group(Signal::SIGTERM);
                }
                None
            }
            Action::Verify(check) => {
                // ssh is connected, so it has read its config: the token leaves the disk.
                let _ = std::fs::remove_file(inst.dir.path.join(SSH_CONFIG));
                let key = self.api_key.clone();
                inst.check =
                    Some(tokio::spawn(
                        async move { verify::run(&check, key.as_deref(), verify::VERIFY_TIMEOUT).await },
                    ));
                None
            }
            Action::CancelVerify => {
                if let Some(task) = inst.check.take() {
                    task.abort();
                }
                None
            }
            Action::AcquireLease { dir, public_url, ttl } => {
                let mut owner = self.owner.clone();
                owner.public_url = public_url.clone();
                let answer = match lease::try_acquire(&dir, &public_url, &owner, ttl) {
                    Ok(lease::Acquire::Acquired(l)) => {
                        let path = l.path.clone();
                        inst.lease = Some(l);
                        LeaseAnswer::Acquired(path)
                    }
                    Ok(lease::Acquire::Held(holder)) => LeaseAnswer::Held {
                        holder: holder.describe(),
                        owner: serde_json::to_value(&holder).unwrap_or_default(),
                    },
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), error = %e, "cannot use the Pinggy lease dir; going on without a lease");
                        LeaseAnswer::Unavailable(e.to_string())
                    }
                };
                Some(Input::Lease(answer))
            }
            Action::RefreshLease => {
                if let Some(l) = &inst.lease
                    && !l.refresh()
                    && !inst.lease_lost
                {
                    inst.lease_lost = true;
                    tracing::warn!(lease = %l.path.display(), "Pinggy lease is no longer ours (judged stale by another job?)");
                    rec.event(TunnelLeaseLost { lease: l.path.clone() });
                }
                None
            }
            Action::ReleaseLease => {
                if let Some(l) = inst.lease.take() {
                    l.release();
                }
                None
            }
            Action::Event(body) => {
                let data = body.to_fields().map(serde_json::Value::Object).unwrap_or_default();
                let (kind, name) = (inst.machine.kind(), body.kind());
                match &body {
                    EventBody::TunnelFailed(_) => tracing::error!(kind, %data, "tunnel failed"),
                    EventBody::TunnelUp(_) => tracing::info!(kind, %data, "tunnel up"),
                    EventBody::TunnelRestart(_) | EventBody::TunnelPairSkipped(_) => {
                        tracing::warn!(kind, event = name.as_str(), %data, "tunnel")
                    }
                    _ => tracing::debug!(kind, event = name.as_str(), %data, "tunnel"),
                }
                rec.event(body);
                None
            }
            Action::Note(text) => {
                self.note(inst, &text);
                None
            }
        }
    }

    fn spawn(
        &self,
        inst: &mut Instance,
        sup: &mut Supervisor,
        rec: &mut Recorder,
        config: &str,
        argv: Vec<String>,
    ) -> Result<u32, (&'static str, String)> {
        inst.dir
            .write(SSH_CONFIG, config)
            .map_err(|e| ("private_dir", format!("cannot write the ssh config in {}: {e}", inst.dir.path.display())))?;
        let child =
            ChildSpec { program: self.ssh.clone(), argv, env: self.env.clone(), log: inst.raw_log.clone(), cwd: None };
        let pid =
            sup.spawn(inst.role, &child).map_err(|e| ("spawn", format!("cannot start {}: {e}", self.ssh.display())))?;
        // A fresh output file per ssh: read through a handle, its name gone from the disk at once.
        inst.raw = launch_spec::fsread::open_regular(&inst.raw_log, launch_spec::fsread::Links::Refuse).ok();
        inst.raw_offset = 0;
        inst.partial.clear();
        let _ = std::fs::remove_file(&inst.raw_log);
        inst.pid = Some(pid);
        rec.status.pids.insert(inst.role.as_str().into(), pid);
        rec.write_status();
        Ok(pid)
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
        let result = launch_spec::fsread::open_append_regular(&self.log).and_then(|mut f| f.write_all(text.as_bytes()));
        if let Err(err) = result {
            tracing::warn!(error = %err, "cannot append to tunnel.log");
        }
    }

    /// One line of payload's own in `tunnel.log`.
    fn note(&self, inst: &Instance, text: &str) {
        let who = inst.label.map(|l| format!("{l}: ")).unwrap_or_default();
        let line = format!("[{}] payload: {who}{}\n", crate::records::now(), self.redacted(text));
        self.append_log(&line);
    }

    /// ssh's new output, redacted, copied into `tunnel.log`; returns the lines.
    fn drain(&self, inst: &mut Instance) -> Vec<String> {
        let Some(mut f) = inst.raw.as_ref() else { return Vec::new() };
        if f.seek(SeekFrom::Start(inst.raw_offset)).is_err() {
            return Vec::new();
        }
        // At most RAW_READ_CAP per poll: ssh's output is short; a flood is read on over the polls.
        let mut buf = Vec::new();
        if f.take(RAW_READ_CAP).read_to_end(&mut buf).is_err() || buf.is_empty() {
            return Vec::new();
        }
        inst.raw_offset += buf.len() as u64;
        inst.partial.push_str(&String::from_utf8_lossy(&buf));
        let mut lines = Vec::new();
        let mut out = String::new();
        while let Some(i) = inst.partial.find('\n') {
            let line: String = inst.partial.drain(..=i).collect();
            let line = self.redacted(line.trim_end_matches(['\n', '\r']));
            // Pinggy's TUI may draw with escape sequences; keep the text.
            let clean: String = line.chars().filter(|c| !c.is_control() || *c == '\t').collect();
            if clean.trim().is_empty() {
                continue;
            }
            if let Some(label) = inst.label {
                out.push_str(&format!("[{label}] "));
            }
            out.push_str(&clean);
            out.push('\n');
            lines.push(clean);
        }
        if !out.is_empty() {
            self.append_log(&out);
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

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
        // The machine's first actions: b (first in job 3's order) taken, then its spawn.
        assert!(plan.actions[0].starts_with("event tunnel_pair {\"public_url\":\"https://b."), "{:?}", plan.actions);
        assert!(
            plan.actions.last().unwrap().starts_with("write the ssh config (0600) and start "),
            "{:?}",
            plan.actions
        );
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
