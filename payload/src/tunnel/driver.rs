//! The runtime driver: spawns and signals each tunnel's ssh, reads its output into `tunnel.log`,
//! feeds the machine ([`super::machine`]) what happened and carries out the actions it decides.

use std::collections::{BTreeMap, VecDeque};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use launch_spec::records::TUNNEL_LOG;
use launch_spec::rundir::EventBody;
use launch_spec::rundir::events::{TunnelLeaseLost, TunnelLeaseReleased};
use launch_spec::spec::{ProxyMode, TunnelSpec};
use nix::sys::signal::Signal;
use tokio::task::JoinHandle;

use crate::failure::Failure;
use crate::records::Recorder;
use crate::secrets::Secrets;
use crate::supervisor::{ChildSpec, Role, Supervisor, describe_status};

use super::machine::{Action, Input, LeaseAnswer, Machine, Phase};
use super::{
    Ctx, Part, Programs, TunnelError, kind, lease, parts, socks, socks_port, socks_spec, strategy, strategy_for,
    tokens, verify,
};

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
