//! `payload run --spec FILE`: the sequence of docs/design.md §6.2, composing the other modules.
//!
//! 1. signals + subreaper, read and validate the spec, status `preparing`;
//! 2. tunnel kind, secrets, programs and paths;
//! 3. GPUs → profile → gpu-memory ceiling;
//! 4. port;
//! 5. vLLM in its own group (`serving`), logging to `vllm.log`;
//! 6. readiness (`/health` 200 and the served name in `/v1/models`), polled every 25 ms while
//!    watching the process; meanwhile (7) the tunnel, if any, is started and checked (Pinggy's
//!    end-to-end check needs vLLM, so it completes after readiness);
//! 8. Harbor in its own group (`running`), logging to `harbor.log` (resume rewrites first; `api_base`
//!    is the tunnel's public URL for installed agents; proxy variables or a proxychains prefix for
//!    SOCKS egress);
//! 9. watchdog + heartbeat until Harbor exits, a fault or a signal; teardown (`stopping`);
//!    after Harbor exited 0, the optional post-run step (crate::postrun), which never changes the
//!    outcome; outcome (`done`); exit with the documented code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use launch_spec::records::{ENGINE_LOG, HARBOR_LOG, Outcome, Phase, SPEC_FILE, TUNNEL_LOG};
use launch_spec::{LaunchSpec, OutcomeClass};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::{MissedTickBehavior, interval, sleep_until};

use crate::engine::{self, Readiness};
use crate::failure::Failure;
use crate::harbor;
use crate::records::{HeartbeatState, Recorder, rotate_log};
use crate::secrets::{self, Secrets};
use crate::supervisor::{
    self, ChildSpec, Role, ShutdownPlan, SignalEvent, Signals, Supervisor, Watch, WatchConfig, WatchEvent,
    describe_status, status_code, wait_opt,
};
use crate::timings::{self, Timings};
use crate::tunnel::{self, Tunnel, TunnelPoll};
use crate::{childenv, gpu, ports, postrun, runlock};

/// Readiness poll period: a loopback probe costs well under a millisecond (a refused connect while
/// vLLM loads even less), so polling often keeps "ready → Harbor spawned" short.
pub const READY_POLL: Duration = Duration::from_millis(25);
/// Lines of `vllm.log` kept in an engine failure's outcome.
pub const LOG_TAIL_LINES: usize = 30;
/// How often the tunnel's state machine is advanced.
pub const TUNNEL_POLL: Duration = Duration::from_millis(200);

/// How the run ended, before teardown.
#[derive(Debug)]
enum End {
    HarborExited(ExitStatus),
    Failed(Failure),
    Signal(SignalEvent),
}

impl From<Failure> for End {
    fn from(f: Failure) -> Self {
        End::Failed(f)
    }
}

/// Payload's own environment, read once.
pub fn parent_env() -> Vec<(String, String)> {
    std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect()
}

pub fn lookup(env: &[(String, String)]) -> impl Fn(&str) -> Option<String> + '_ {
    move |name| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

/// The node name: `SLURMD_NODENAME`, else the kernel's hostname.
pub fn node_name(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    env("SLURMD_NODENAME")
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|s| s.trim().to_string()))
}

/// The id that drives the Daytona org choice: the Slurm job id, else the ledger id, else the run tag.
pub fn org_job_id(spec: &LaunchSpec, env: &dyn Fn(&str) -> Option<String>) -> String {
    env("SLURM_JOB_ID").or_else(|| spec.ledger_job_id.clone()).unwrap_or_else(|| spec.run_tag.clone())
}

/// The id that derives the port: the Slurm job id, else payload's pid (two local runs differ).
pub fn port_job_id(env: &dyn Fn(&str) -> Option<String>) -> String {
    env("SLURM_JOB_ID").unwrap_or_else(|| std::process::id().to_string())
}

/// Whether the spec needs anything from the secrets file.
pub fn needs_secrets(spec: &LaunchSpec) -> bool {
    spec.secrets.daytona
        || !spec.secrets.pass_to_harbor.is_empty()
        || spec.harbor.agent_envs.iter().any(|e| e.value.is_none())
        || !tunnel::secret_names(&spec.tunnel).is_empty()
        || spec.post_run.as_ref().is_some_and(|p| !p.secrets.is_empty())
}

/// `http://127.0.0.1:<port>`: the agent runs on this node, so a wildcard listen address is reached
/// over loopback.
pub fn base_url(host: &str, port: u16) -> String {
    let host = match host {
        "0.0.0.0" | "::" | "" => "127.0.0.1",
        other => other,
    };
    if host.contains(':') { format!("http://[{host}]:{port}") } else { format!("http://{host}:{port}") }
}

/// Checks paths the run needs before anything starts.
pub fn check_paths(spec: &LaunchSpec) -> Result<(), Failure> {
    let expected = spec.jobs_dir.join(&spec.run_tag);
    if spec.run_dir != expected {
        return Err(Failure::new(
            OutcomeClass::Spec,
            format!(
                "field `run_dir` is {} but Harbor writes the job to jobs_dir/run_tag = {}: make them agree",
                spec.run_dir.display(),
                expected.display()
            ),
        ));
    }
    if !spec.harbor.config.is_file() {
        return Err(Failure::new(
            OutcomeClass::Spec,
            format!("field `harbor.config`: {} does not exist", spec.harbor.config.display()),
        ));
    }
    if !spec.harbor.dataset.exists() {
        return Err(Failure::new(
            OutcomeClass::Spec,
            format!(
                "field `harbor.dataset`: {} does not exist (pre-download the dataset)",
                spec.harbor.dataset.display()
            ),
        ));
    }
    for (field, prefix) in
        [("serve.env_prefix", &spec.serve.env_prefix), ("harbor.env_prefix", &spec.harbor.env_prefix)]
    {
        if let Some(prefix) = prefix
            && !prefix.join("bin").is_dir()
        {
            return Err(Failure::new(
                OutcomeClass::Spec,
                format!(
                    "field `{field}`: {}/bin does not exist (name an existing environment prefix)",
                    prefix.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Loads the secrets the spec needs (nothing when it needs none).
pub fn load_secrets(spec: &LaunchSpec, env: &dyn Fn(&str) -> Option<String>) -> Result<Secrets, secrets::SecretsError> {
    if !needs_secrets(spec) {
        return Ok(Secrets::none());
    }
    secrets::load(&secrets::secrets_path(&spec.secrets, env))
}

/// Harbor's environment: the explicit base, plus the chosen Daytona key as `DAYTONA_API_KEY`, the
/// `secrets.pass_to_harbor` names present in the file, and secret sources of agent envs.
pub fn harbor_env(
    spec: &LaunchSpec,
    parent: &[(String, String)],
    run_id: &str,
    secrets: &Secrets,
    org_job_id: &str,
    agent_env_secrets: &BTreeMap<String, String>,
) -> Result<(BTreeMap<String, String>, Option<secrets::DaytonaOrg>), secrets::SecretsError> {
    let mut env = childenv::build(parent, spec.harbor.env_prefix.as_deref(), &spec.harbor.env, run_id);
    let mut org = None;
    for name in &spec.secrets.pass_to_harbor {
        if let Some(value) = secrets.get(name) {
            env.insert(name.clone(), value.to_string());
        }
    }
    for (k, v) in agent_env_secrets {
        env.insert(k.clone(), v.clone());
    }
    if spec.secrets.daytona {
        let (mut chosen, mut key) = secrets::daytona_key(secrets, org_job_id)?;
        // Installed-harness agents always use org 2 (docs/design.md §6.6).
        if launch_spec::launch::is_installed_agent(&spec.harbor.agent)
            && chosen == secrets::DaytonaOrg::Org1
            && let Some(org2) = secrets.get(secrets::DAYTONA_ORG2)
        {
            chosen = secrets::DaytonaOrg::Org2;
            key = org2;
        }
        env.insert(secrets::DAYTONA_ORG1.to_string(), key.to_string());
        env.remove(secrets::DAYTONA_ORG2);
        org = Some(chosen);
    }
    Ok((env, org))
}

struct Run {
    spec: LaunchSpec,
    spec_path: PathBuf,
    rec: Recorder,
    signals: Signals,
    sup: Supervisor,
    parent: Vec<(String, String)>,
    run_id: String,
    heartbeat: HeartbeatState,
    tunnel: Option<Tunnel>,
    timings: Timings,
    /// The post-run step, prepared with the other children's environments (crate::postrun).
    post_run: Option<Result<postrun::Step, String>>,
}

/// Runs the job; returns payload's exit code.
pub async fn run(spec_path: &Path) -> i32 {
    // Signal handlers first, before anything can be spawned.
    let signals = match Signals::register() {
        Ok(s) => s,
        Err(err) => {
            tracing::error!(error = %err, "cannot register signal handlers");
            return OutcomeClass::Spec.exit_code();
        }
    };
    if let Err(err) = supervisor::become_subreaper() {
        tracing::warn!(error = %err, "cannot become child subreaper; double-forked orphans may escape");
    }
    let spec = match LaunchSpec::from_file(spec_path) {
        Ok(spec) => spec,
        Err(err) => {
            tracing::error!(class = "spec", error = %err, "bad launch spec");
            return OutcomeClass::Spec.exit_code();
        }
    };
    // Every duration checked before anything is spawned (or written).
    let timings = match timings::check(spec_path, &spec) {
        Ok(t) => t,
        Err(f) => {
            tracing::error!(class = "spec", error = %f.message, "bad launch spec");
            return OutcomeClass::Spec.exit_code();
        }
    };
    if let Err(err) = std::fs::create_dir_all(&spec.run_dir) {
        tracing::error!(class = "spec", run_dir = %spec.run_dir.display(), error = %err, "cannot create run dir");
        return OutcomeClass::Spec.exit_code();
    }
    // Held until payload exits: a second payload on this run dir stops here, changing nothing.
    let _lock = match runlock::acquire(&spec.run_dir) {
        Ok(lock) => lock,
        Err(err @ runlock::LockError::Busy { .. }) => {
            tracing::error!(class = "run_dir_busy", error = %err, "run dir in use");
            return runlock::EXIT_RUN_DIR_BUSY;
        }
        Err(err) => {
            tracing::error!(class = "spec", error = %err, "cannot lock the run dir");
            return OutcomeClass::Spec.exit_code();
        }
    };
    let run_id = format!("{}-{}", spec.run_tag, std::process::id());
    let rec = Recorder::new(&spec.run_dir, &spec.run_tag);
    let mut run = Run {
        spec,
        spec_path: spec_path.to_path_buf(),
        rec,
        signals,
        sup: Supervisor::new(),
        parent: parent_env(),
        run_id,
        heartbeat: HeartbeatState::default(),
        tunnel: None,
        timings,
        post_run: None,
    };
    let end = match run.sequence().await {
        Ok(status) => End::HarborExited(status),
        Err(end) => end,
    };
    run.finish(end).await
}

impl Run {
    fn log_path(&self, name: &str) -> PathBuf {
        self.spec.run_dir.join(name)
    }

    /// A signal already delivered (checked before each spawn).
    async fn pending_signal(&mut self) -> Option<SignalEvent> {
        tokio::select! {
            biased;
            ev = self.signals.recv() => Some(ev),
            _ = std::future::ready(()) => None,
        }
    }

    async fn sequence(&mut self) -> Result<ExitStatus, End> {
        let parent = self.parent.clone();
        let env_fn = lookup(&parent);
        // 1. Records.
        // The copy is replaced atomically (never written through a symlink planted as launch.json).
        let spec_copy = self.spec.run_dir.join(SPEC_FILE);
        let same = std::fs::canonicalize(&self.spec_path).ok() == std::fs::canonicalize(&spec_copy).ok();
        if !same
            && let Err(err) = launch_spec::records::read_regular(&self.spec_path, launch_spec::records::MAX_INPUT_BYTES)
                .and_then(|text| launch_spec::records::write_atomically(&spec_copy, text.as_bytes()))
        {
            tracing::warn!(error = %err, "cannot copy the spec to launch.json");
        }
        self.rec.status.slurm_job_id = env_fn("SLURM_JOB_ID");
        self.rec.status.node = node_name(&env_fn);
        self.rec.status.pids.insert("payload".into(), std::process::id());
        self.rec.write_status();
        self.rec.event(
            "started",
            json!({ "spec": self.spec_path, "pid": std::process::id(), "payload_version": env!("CARGO_PKG_VERSION"),
                    "slurm_job_id": self.rec.status.slurm_job_id, "node": self.rec.status.node }),
        );
        tracing::info!(run_tag = %self.spec.run_tag, run_dir = %self.spec.run_dir.display(), "payload run starting");
        if self.spec.limits.teardown_grace_s >= 30.0 {
            tracing::warn!(
                teardown_grace_s = self.spec.limits.teardown_grace_s,
                "limits.teardown_grace_s does not fit inside Slurm's default KillWait (30 s): SIGKILL may hit payload before its sweep"
            );
        }

        // 2. Paths, secrets, programs (the tunnel's too).
        check_paths(&self.spec)?;
        let secrets = load_secrets(&self.spec, &env_fn).map_err(Failure::from)?;
        let org_id = org_job_id(&self.spec, &env_fn);
        let agent_envs = harbor::agent_envs(&self.spec.harbor.agent_envs, &secrets, &env_fn);
        for w in &agent_envs.warnings {
            tracing::warn!(warning = %w, "agent env");
        }
        let (mut harbor_env, org) =
            harbor_env(&self.spec, &self.parent, &self.run_id, &secrets, &org_id, &agent_envs.harbor_env)
                .map_err(Failure::from)?;
        self.post_run = postrun::prepare(&self.spec, &self.parent, &self.run_id, &secrets);
        self.rec.event(
            "secrets_loaded",
            json!({ "file": secrets.path(), "names": secrets.names().collect::<Vec<_>>(), "daytona_org": org }),
        );
        let mut engine_env =
            childenv::build(&self.parent, self.spec.serve.env_prefix.as_deref(), &self.spec.serve.env, &self.run_id);
        let tunnel_env = childenv::build(&self.parent, None, &BTreeMap::new(), &self.run_id);
        let tunnel_programs = tunnel::programs(&self.spec.tunnel, &tunnel_env["PATH"]).map_err(Failure::from)?;
        // A model reachable from outside gets a per-job key: vLLM reads it from its environment, the
        // agent from Harbor's (never argv, never a file).
        let api_key = if tunnel::exposes_model(&self.spec.tunnel) {
            let key = tunnel::random_key().map_err(|e| {
                Failure::new(OutcomeClass::Tunnel, format!("cannot read /dev/urandom for the API key: {e}"))
                    .with_cause("api_key")
            })?;
            engine_env.insert(tunnel::VLLM_KEY_VAR.to_string(), key.clone());
            Some(key)
        } else {
            None
        };
        for name in childenv::dropped_names(&self.spec.serve.env)
            .into_iter()
            .chain(childenv::dropped_names(&self.spec.harbor.env))
        {
            tracing::warn!(variable = name, "dropped from the child environment (never exported by payload)");
        }
        let engine_program = childenv::resolve_program(
            &self.spec.serve.program,
            self.spec.serve.env_prefix.as_deref(),
            &engine_env["PATH"],
        )
        .map_err(|e| Failure::new(OutcomeClass::Spec, format!("field `serve.program`: {e}")))?;
        let harbor_program = childenv::resolve_program(
            &self.spec.harbor.program,
            self.spec.harbor.env_prefix.as_deref(),
            &harbor_env["PATH"],
        )
        .map_err(|e| Failure::new(OutcomeClass::Spec, format!("field `harbor.program`: {e}")))?;

        // 3. GPUs.
        let probe = gpu::probe_from_env(&env_fn);
        let cuda_visible = env_fn("CUDA_VISIBLE_DEVICES");
        let decision = gpu::decide(&self.spec, &probe.describe(), probe.probe(), cuda_visible.as_deref(), false)
            .map_err(Failure::from)?;
        self.rec.status.gpu = Some(decision.choice());
        self.rec.event("gpus", serde_json::to_value(&decision).unwrap_or_default());
        tracing::info!(profile = %decision.choice().profile, count = decision.count, util = decision.gpu_memory_utilization, source = %decision.source, "GPU profile chosen");

        // 4. Port.
        let port = ports::choose(&self.spec.serve.port, &port_job_id(&env_fn), &self.spec.serve.host)
            .map_err(Failure::from)?;
        self.rec.status.port = Some(port);
        self.rec.event("port", json!({ "port": port }));
        let base = base_url(&self.spec.serve.host, port);

        // The tunnel (started by the first poll, while vLLM loads).
        if let Some(programs) = tunnel_programs {
            self.tunnel = Tunnel::new(tunnel::Start {
                spec: &self.spec.tunnel,
                programs,
                secrets: &secrets,
                run_dir: &self.spec.run_dir,
                run_tag: &self.spec.run_tag,
                job_id: &port_job_id(&env_fn),
                slurm_job_id: env_fn("SLURM_JOB_ID"),
                node: node_name(&env_fn).unwrap_or_else(|| "unknown".into()),
                engine_host: &self.spec.serve.host,
                engine_port: port,
                served_name: &self.spec.model.served_name,
                api_key: api_key.clone(),
                child_env: tunnel_env.clone(),
                tmp_root: env_fn("TMPDIR")
                    .filter(|t| !t.is_empty())
                    .map(PathBuf::from)
                    .unwrap_or_else(std::env::temp_dir),
            })?;
            if let Some(t) = &self.tunnel {
                self.rec.event("tunnel_prepared", json!({ "kind": t.kind(), "socks_port": t.socks_port() }));
            }
        }

        // 5. vLLM.
        let argv = engine::argv(
            &self.spec,
            &engine_program.display().to_string(),
            port,
            decision.gpu_memory_utilization,
            decision.extra_vllm_args(),
            &env_fn,
        )
        .map_err(Failure::from)?;
        // A resume's inputs are checked now, not after the engine has loaded.
        let resume = harbor::is_resume(&self.spec.run_dir);
        if resume {
            harbor::check_resume_configs(&self.spec.run_dir).map_err(Failure::from)?;
        }
        if let Some(ev) = self.pending_signal().await {
            return Err(End::Signal(ev));
        }
        let engine_log = self.log_path(ENGINE_LOG);
        rotate_log(&engine_log);
        rotate_log(&self.log_path(HARBOR_LOG));
        rotate_log(&self.log_path(TUNNEL_LOG));
        let child = ChildSpec {
            program: engine_program,
            argv: argv.clone(),
            env: engine_env,
            log: engine_log.clone(),
            cwd: None,
        };
        let started = Instant::now();
        let pid = self.sup.spawn(Role::Engine, &child).map_err(|e| {
            Failure::new(OutcomeClass::EngineStart, format!("cannot start {}: {e}", child.program.display()))
                .with_cause("spawn")
        })?;
        self.rec.status.pids.insert("engine".into(), pid);
        self.rec.event("engine_spawned", json!({ "pid": pid, "argv": argv, "port": port }));
        self.rec.set_phase(Phase::Serving);
        tracing::info!(pid, port, "vLLM started; waiting for readiness");

        self.rec.status.resume = Some(resume);

        // Harbor's own `--print-config` on the fresh-run argv, while vLLM loads (it costs nothing
        // then): a refusal ends the run before Harbor would start and fail.
        let mut config_check = (!resume).then(|| {
            let (spec, env) = (self.spec.clone(), harbor_env.clone());
            let argv = harbor::prepare_fresh(
                &spec,
                &harbor_program.display().to_string(),
                &format!("{base}/v1"),
                &agent_envs.args,
            );
            tokio::task::spawn_blocking(move || match argv {
                Ok(argv) => harbor::check_with_print_config(&spec, &argv, &env),
                Err(e) => harbor::ConfigCheck::Rejected(e.to_string()),
            })
        });

        // 6. Readiness (7. the tunnel advances meanwhile), then the tunnel's end-to-end check.
        let mut verdict = None;
        {
            let ready = self.wait_ready(&base, started, api_key.as_deref());
            tokio::pin!(ready);
            loop {
                tokio::select! {
                    r = &mut ready => { r?; break; }
                    v = async { config_check.as_mut().expect("guarded").await }, if config_check.is_some() && verdict.is_none() => {
                        let v = v.unwrap_or_else(|e| harbor::ConfigCheck::Skipped(format!("check task failed: {e}")));
                        let rejected = matches!(v, harbor::ConfigCheck::Rejected(_));
                        verdict = Some(v);
                        if rejected { break; }
                    }
                }
            }
        }
        if let Some(check) = config_check.take()
            && verdict.is_none()
        {
            verdict =
                Some(check.await.unwrap_or_else(|e| harbor::ConfigCheck::Skipped(format!("check task failed: {e}"))));
        }
        if let Some(v) = verdict {
            self.rec.event("harbor_config_check", json!({ "result": format!("{v:?}") }));
            if let harbor::ConfigCheck::Rejected(why) = v {
                return Err(Failure::new(OutcomeClass::Harbor, why).with_cause("config_rejected").into());
            }
        }
        self.wait_tunnel().await?;

        // 8. Harbor: api_base (the public URL for installed agents), resume rewrites, argv.
        let api_base = match self.tunnel.as_ref().and_then(Tunnel::public_url) {
            Some(url) => format!("{url}/v1"),
            None => format!("{base}/v1"),
        };
        // The agent's own base-URL and key variables (launch_spec::agents), environment only.
        harbor_env.extend(launch_spec::agents::model_env(&self.spec.harbor.agent, &api_base, api_key.as_deref()));
        let mut harbor_argv = if resume {
            let rewritten = harbor::rewrite_api_base(&self.spec.run_dir, &api_base).map_err(Failure::from)?;
            let files: Vec<_> = rewritten.iter().map(|(p, n)| json!({ "file": p, "changed": n })).collect();
            self.rec.event("resume_configs_rewritten", json!({ "api_base": api_base, "files": files }));
            harbor::resume_argv(&self.spec, &harbor_program.display().to_string())
        } else {
            harbor::prepare_fresh(&self.spec, &harbor_program.display().to_string(), &api_base, &agent_envs.args)
                .map_err(Failure::from)?
        };
        let mut harbor_program = harbor_program;
        if let Some(t) = &self.tunnel {
            harbor_env.extend(t.harbor_env());
            if let Some(prefix) = t.harbor_prefix() {
                harbor_program = PathBuf::from(&prefix[0]);
                harbor_argv.splice(0..0, prefix);
            }
        }
        if let Some(ev) = self.pending_signal().await {
            return Err(End::Signal(ev));
        }
        let child = ChildSpec {
            program: harbor_program,
            argv: harbor_argv.clone(),
            env: harbor_env,
            log: self.log_path(HARBOR_LOG),
            cwd: None,
        };
        let pid = self.sup.spawn(Role::Harbor, &child).map_err(|e| {
            Failure::new(OutcomeClass::Harbor, format!("cannot start {}: {e}", child.program.display()))
                .with_cause("spawn")
        })?;
        self.rec.status.pids.insert("harbor".into(), pid);
        self.rec.event(
            "harbor_spawned",
            json!({ "pid": pid, "argv": harbor_argv, "mode": if resume { "resume" } else { "fresh" }, "api_base": api_base }),
        );
        if let Some(t) = self.tunnel.as_mut() {
            t.commit();
        }
        self.rec.set_phase(Phase::Running);
        tracing::info!(pid, resume, "Harbor started");

        // 9. Watch.
        let limits = &self.spec.limits;
        let mut watch = Watch::new(WatchConfig {
            base_url: base.clone(),
            probe_interval: self.timings.probe_interval,
            health_failures: limits.health_failures,
            heartbeat_interval: self.timings.heartbeat,
            tunnel_poll: self.tunnel.is_some().then_some(TUNNEL_POLL),
        });
        let result = loop {
            match watch.next(&mut self.sup, &mut self.signals).await {
                WatchEvent::Heartbeat(metrics) => {
                    let hb = self.heartbeat.next(metrics, &engine_log, &self.spec.run_dir, watch.last_healthy);
                    self.rec.status.heartbeat = Some(hb);
                    self.rec.write_status();
                }
                WatchEvent::HarborExited(status) => {
                    self.rec.event(
                        "harbor_exited",
                        json!({ "status": describe_status(status), "code": status_code(status) }),
                    );
                    tracing::info!(status = %describe_status(status), "Harbor exited");
                    break Ok(status);
                }
                WatchEvent::EngineExited(status) => {
                    let tail = engine::log_tail(&engine_log, LOG_TAIL_LINES);
                    let cause = engine::classify_start_failure(&tail);
                    self.rec.event("engine_exited", json!({ "status": describe_status(status), "cause": cause }));
                    break Err(End::Failed(
                        Failure::new(
                            OutcomeClass::EngineDied,
                            format!("vLLM exited during the run ({}); Harbor stopped", describe_status(status)),
                        )
                        .with_cause(cause)
                        .with_log_tail(tail),
                    ));
                }
                WatchEvent::EngineUnhealthy { failures } => {
                    let tail = engine::log_tail(&engine_log, LOG_TAIL_LINES);
                    self.rec.event("engine_unhealthy", json!({ "consecutive_failures": failures }));
                    break Err(End::Failed(
                        Failure::new(
                            OutcomeClass::EngineDied,
                            format!("vLLM failed {failures} consecutive /health probes; Harbor stopped"),
                        )
                        .with_cause("unhealthy")
                        .with_log_tail(tail),
                    ));
                }
                WatchEvent::Signal(ev) => break Err(End::Signal(ev)),
                WatchEvent::TunnelTick => {
                    if let Some(t) = self.tunnel.as_mut()
                        && let TunnelPoll::Failed(f) = t.poll(&mut self.sup, &mut self.rec, true).await
                    {
                        break Err(End::Failed(f));
                    }
                }
            }
        };
        watch.stop();
        result
    }

    /// Polls readiness every [`READY_POLL`] while watching the engine, signals and the deadline.
    async fn wait_ready(&mut self, base: &str, started: Instant, api_key: Option<&str>) -> Result<(), End> {
        let deadline = timings::deadline(started, self.timings.health_timeout);
        let client = engine::http_client_with_key(Duration::from_secs(1), api_key);
        let mut tunnel_tick = interval(TUNNEL_POLL);
        tunnel_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let has_tunnel = self.tunnel.is_some();
        let mut tick = interval(READY_POLL);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut heartbeat = interval(self.timings.heartbeat);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut probe: Option<JoinHandle<Readiness>> = None;
        let served = self.spec.model.served_name.clone();
        let needs_completion = self.spec.serve.ready_needs_completion;
        let engine_log = self.log_path(ENGINE_LOG);
        let mut saw_health = false;
        loop {
            tokio::select! {
                biased;
                status = wait_opt(self.sup.engine.as_mut()) => {
                    if let Some(h) = probe.take() { h.abort(); }
                    let tail = engine::log_tail(&engine_log, LOG_TAIL_LINES);
                    let cause = engine::classify_start_failure(&tail);
                    self.rec.event("engine_exited", json!({ "status": describe_status(status), "cause": cause, "during": "start" }));
                    tracing::error!(status = %describe_status(status), cause, "vLLM exited during start-up");
                    return Err(End::Failed(
                        Failure::new(OutcomeClass::EngineStart, format!("vLLM exited during start-up ({}), cause: {cause}", describe_status(status)))
                            .with_cause(cause)
                            .with_log_tail(tail),
                    ));
                }
                ev = self.signals.recv() => {
                    if let Some(h) = probe.take() { h.abort(); }
                    return Err(End::Signal(ev));
                }
                _ = sleep_until(deadline.into()) => {
                    if let Some(h) = probe.take() { h.abort(); }
                    let tail = engine::log_tail(&engine_log, LOG_TAIL_LINES);
                    let what = if saw_health { "answered /health but never listed the served name" } else { "never answered /health with 200" };
                    return Err(End::Failed(
                        Failure::new(OutcomeClass::EngineTimeout, format!("vLLM {what} within serve.health_timeout_s = {} s", self.spec.serve.health_timeout_s))
                            .with_log_tail(tail),
                    ));
                }
                readiness = async { probe.as_mut().expect("guarded").await.unwrap_or(Readiness::Down) }, if probe.is_some() => {
                    probe = None;
                    match readiness {
                        Readiness::Ready => {
                            let ms = started.elapsed().as_millis() as u64;
                            self.rec.event("engine_ready", json!({ "elapsed_ms": ms }));
                            self.rec.set_phase(Phase::Ready);
                            tracing::info!(elapsed_ms = ms, "vLLM ready");
                            return Ok(());
                        }
                        Readiness::HealthOnly => saw_health = true,
                        Readiness::Down => {}
                    }
                }
                _ = tick.tick(), if probe.is_none() => {
                    let client = client.clone();
                    let base = base.to_string();
                    let served = served.clone();
                    probe = Some(tokio::spawn(async move {
                        let r = engine::probe_ready(&client, &base, &served).await;
                        if r == Readiness::Ready && needs_completion && !engine::completion_ok(&client, &base, &served).await {
                            return Readiness::HealthOnly;
                        }
                        r
                    }));
                }
                _ = heartbeat.tick() => {
                    let hb = self.heartbeat.next(None, &engine_log, &self.spec.run_dir, false);
                    self.rec.status.heartbeat = Some(hb);
                    self.rec.write_status();
                }
                _ = tunnel_tick.tick(), if has_tunnel => {
                    if let Some(t) = self.tunnel.as_mut()
                        && let TunnelPoll::Failed(f) = t.poll(&mut self.sup, &mut self.rec, false).await
                    {
                        if let Some(h) = probe.take() { h.abort(); }
                        return Err(End::Failed(f));
                    }
                }
            }
        }
    }

    /// After readiness: the tunnel must be up and checked end to end before Harbor starts.
    async fn wait_tunnel(&mut self) -> Result<(), End> {
        if self.tunnel.is_none() {
            return Ok(());
        }
        let mut tick = interval(TUNNEL_POLL);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut heartbeat = interval(self.timings.heartbeat);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let engine_log = self.log_path(ENGINE_LOG);
        loop {
            tokio::select! {
                biased;
                status = wait_opt(self.sup.engine.as_mut()) => {
                    let tail = engine::log_tail(&engine_log, LOG_TAIL_LINES);
                    let cause = engine::classify_start_failure(&tail);
                    self.rec.event("engine_exited", json!({ "status": describe_status(status), "cause": cause, "during": "tunnel" }));
                    return Err(End::Failed(
                        Failure::new(OutcomeClass::EngineDied, format!("vLLM exited while the tunnel was being checked ({})", describe_status(status)))
                            .with_cause(cause)
                            .with_log_tail(tail),
                    ));
                }
                ev = self.signals.recv() => return Err(End::Signal(ev)),
                _ = tick.tick() => {
                    if let Some(t) = self.tunnel.as_mut() {
                        match t.poll(&mut self.sup, &mut self.rec, true).await {
                            TunnelPoll::Up => return Ok(()),
                            TunnelPoll::Failed(f) => return Err(End::Failed(f)),
                            TunnelPoll::Pending => {}
                        }
                    }
                }
                _ = heartbeat.tick() => {
                    let hb = self.heartbeat.next(None, &engine_log, &self.spec.run_dir, true);
                    self.rec.status.heartbeat = Some(hb);
                    self.rec.write_status();
                }
            }
        }
    }

    /// Teardown, final heartbeat, outcome, exit code.
    async fn finish(&mut self, end: End) -> i32 {
        let engine_log = self.log_path(ENGINE_LOG);
        // Final counters while vLLM may still answer.
        if self.sup.engine.as_mut().is_some_and(|m| m.try_status().is_none())
            && let Some(port) = self.rec.status.port
        {
            let client = engine::http_client(Duration::from_millis(500));
            let url = format!("{}/metrics", base_url(&self.spec.serve.host, port));
            let metrics = match client.get(url).send().await {
                Ok(resp) => resp.text().await.ok().and_then(|t| crate::records::completions_from_metrics(&t)),
                Err(_) => None,
            };
            let healthy = !matches!(end, End::Failed(ref f) if f.class == OutcomeClass::EngineDied);
            self.rec.status.heartbeat = Some(self.heartbeat.next(metrics, &engine_log, &self.spec.run_dir, healthy));
        }
        let grace = self.timings.teardown_grace;
        let plan = match end {
            End::Signal(SignalEvent::Shutdown(_)) => ShutdownPlan::normal(grace, true),
            End::Signal(SignalEvent::Walltime) => ShutdownPlan::walltime(grace, self.timings.walltime_lead),
            _ => ShutdownPlan::normal(grace, false),
        };
        match &end {
            End::Signal(ev) => {
                let name = match ev {
                    SignalEvent::Shutdown(sig) => sig.as_str(),
                    SignalEvent::Walltime => "SIGUSR1",
                };
                self.rec.event("signal", json!({ "signal": name }));
                tracing::warn!(signal = name, "signal received: tearing down");
            }
            End::Failed(f) => {
                tracing::error!(class = f.class.as_str(), cause = f.cause.as_deref().unwrap_or("-"), error = %f.message, "run failed")
            }
            End::HarborExited(_) => {}
        }
        self.rec.set_phase(Phase::Stopping);
        self.rec.event(
            "teardown_started",
            json!({ "grace_s": grace.as_secs_f64(), "harbor_grace_s": plan.harbor_grace.as_secs_f64() }),
        );
        let report = self.sup.shutdown(&mut self.signals, plan).await;
        self.rec.event(
            "teardown_done",
            json!({
                "elapsed_ms": report.elapsed.as_millis() as u64,
                "forced": report.forced,
                "killed_groups": report.killed_groups.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
                "swept": report.swept,
                "clean": report.clean,
                "signals": report.signals.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
                "steps": report.steps.iter().map(|s| json!({ "ms": s.ms, "action": s.action, "role": s.role.as_str() })).collect::<Vec<_>>(),
            }),
        );
        if let Some(t) = self.tunnel.as_mut() {
            t.cleanup(&self.rec);
        }
        // The post-run step, only for a finished eval (the replaced job uploaded only after Harbor
        // exited 0; a walltime wind-down resumes later and runs it then). Its result is recorded
        // beside the outcome and never changes it.
        if let Some(step) = self.post_run.take() {
            if matches!(end, End::HarborExited(status) if status.success()) {
                let record = postrun::run(step, &mut self.sup, &mut self.signals, &mut self.rec, &self.timings).await;
                self.rec.status.post_run = Some(record);
            } else {
                self.rec.event(
                    "post_run_skipped",
                    json!({ "reason": "the run did not finish (the step runs after Harbor exits 0)" }),
                );
            }
        }
        let harbor_code = self.sup.harbor.as_mut().and_then(|m| m.try_status()).map(status_code);
        let outcome = match end {
            End::HarborExited(status) => {
                let code = status_code(status);
                if code == 0 {
                    Outcome {
                        class: OutcomeClass::Finished,
                        cause: None,
                        exit_code: 0,
                        message: "Harbor finished".to_string(),
                        harbor_exit_code: Some(0),
                        signal: None,
                        engine_log_tail: Vec::new(),
                    }
                } else {
                    Outcome {
                        class: OutcomeClass::Harbor,
                        cause: None,
                        exit_code: OutcomeClass::Harbor.exit_code(),
                        message: format!("Harbor failed ({})", describe_status(status)),
                        harbor_exit_code: Some(code),
                        signal: None,
                        engine_log_tail: Vec::new(),
                    }
                }
            }
            End::Failed(f) => Outcome {
                class: f.class,
                cause: f.cause,
                exit_code: f.class.exit_code(),
                message: f.message,
                harbor_exit_code: harbor_code,
                signal: None,
                engine_log_tail: f.engine_log_tail,
            },
            End::Signal(SignalEvent::Walltime) => Outcome {
                class: OutcomeClass::Walltime,
                cause: None,
                exit_code: OutcomeClass::Walltime.exit_code(),
                message: "walltime near (SIGUSR1): Harbor stopped gracefully, everything torn down".to_string(),
                harbor_exit_code: harbor_code,
                signal: Some("SIGUSR1".to_string()),
                engine_log_tail: Vec::new(),
            },
            End::Signal(SignalEvent::Shutdown(sig)) => Outcome {
                class: OutcomeClass::Interrupted,
                cause: None,
                exit_code: 128 + sig as i32,
                message: format!(
                    "interrupted by {}{}",
                    sig.as_str(),
                    if report.forced { " (second signal: killed at once)" } else { "" }
                ),
                harbor_exit_code: harbor_code,
                signal: Some(sig.as_str().to_string()),
                engine_log_tail: Vec::new(),
            },
        };
        let code = outcome.exit_code;
        // Writes that failed during the run (closed stderr, full disk): reported where it still works.
        let failed =
            (crate::logsink::failed_writes(), self.rec.failed_status_writes, self.rec.failed_event_writes.get());
        if failed != (0, 0, 0) {
            self.rec.event("write_failures", json!({ "log": failed.0, "status": failed.1, "events": failed.2 }));
            tracing::warn!(log = failed.0, status = failed.1, events = failed.2, "some log or record writes failed");
        }
        self.rec.event("outcome", serde_json::to_value(&outcome).unwrap_or_default());
        tracing::info!(class = outcome.class.as_str(), exit_code = code, cause = outcome.cause.as_deref().unwrap_or("-"), message = %outcome.message, "payload done");
        self.rec.set_outcome(outcome);
        code
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::spec;

    #[test]
    fn base_url_uses_loopback_for_wildcards() {
        assert_eq!(base_url("0.0.0.0", 8000), "http://127.0.0.1:8000");
        assert_eq!(base_url("127.0.0.1", 9), "http://127.0.0.1:9");
        assert_eq!(base_url("::1", 9), "http://[::1]:9");
    }

    #[test]
    fn harbor_env_carries_chosen_key_only() {
        let spec = spec();
        let parent = vec![
            ("PATH".to_string(), "/bin".to_string()),
            ("DAYTONA_DATA_API_KEY".to_string(), "from-parent".to_string()),
        ];
        let secrets = Secrets::from_pairs(
            Path::new("/s.env"),
            [
                ("DAYTONA_API_KEY".to_string(), "key-one".to_string()),
                ("DAYTONA_DATA_API_KEY".to_string(), "key-two".to_string()),
                ("HF_TOKEN".to_string(), "hf".to_string()),
            ],
        );
        let mut spec2 = spec.clone();
        spec2.secrets.pass_to_harbor = vec!["HF_TOKEN".into(), "ABSENT".into()];
        let (env, org) = harbor_env(&spec2, &parent, "rid", &secrets, "7", &BTreeMap::new()).unwrap();
        let org = org.unwrap();
        let want = if org == secrets::DaytonaOrg::Org1 { "key-one" } else { "key-two" };
        assert_eq!(env["DAYTONA_API_KEY"], want);
        assert!(!env.contains_key("DAYTONA_DATA_API_KEY"));
        assert_eq!(env["HF_TOKEN"], "hf");
        assert!(!env.contains_key("ABSENT"));
        assert_eq!(env[childenv::RUN_ID_VAR], "rid");
    }

    #[test]
    fn secrets_needed_only_when_used() {
        let mut s = spec();
        assert!(needs_secrets(&s));
        s.secrets.daytona = false;
        assert!(!needs_secrets(&s));
        s.harbor.agent_envs.push(launch_spec::launch::AgentEnv {
            name: "X".into(),
            from: None,
            value: Some("1".into()),
        });
        assert!(!needs_secrets(&s));
        s.harbor.agent_envs.push(launch_spec::launch::AgentEnv { name: "Y".into(), from: None, value: None });
        assert!(needs_secrets(&s));
    }
}
