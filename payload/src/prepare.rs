//! One preparation for `payload plan` and `payload run` (docs/payload.md, "Prepare, then execute").
//!
//! [`observe`] asks the host what only the host knows — the secrets file, the GPU inventory, a free
//! port, whether the run dir holds a job to resume, whether the spec's paths exist — and
//! [`prepare`] turns the spec, payload's environment and those observations into a [`Prepared`]:
//! every child's program, argv and environment, the GPU decision, the port, the per-job API key,
//! and the problems `run` would stop on, in the order it meets them. `plan` renders a `Prepared`
//! (secrets redacted, crate::plan); `run` executes one (crate::run). Neither derives a step of
//! its own, so what the plan shows is what the run spawns.
//!
//! `prepare` changes nothing and reads no file except where programs are (the PATH lookups of
//! crate::childenv::resolve_program, the tunnel's and the post-run step's programs) and the
//! tunnel bank's lease files the tunnel plan describes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use launch_spec::{GpuInfo, LaunchSpec, OutcomeClass};

use crate::failure::Failure;
use crate::gpu::{self, GpuError, GpuSelection};
use crate::harbor::{self, HarborError};
use crate::ports::PortError;
use crate::secrets::{self, DaytonaOrg, Secrets, SecretsError};
use crate::supervisor::ChildSpec;
use crate::timings::{self, Timings};
use crate::{childenv, engine, postrun, tunnel};

/// What the preparation is for: a plan is lenient where only the job's node can tell (no NVML on a
/// login node) and shows placeholders for what exists only in a run (payload's pid, the API key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Plan,
    Run,
}

/// Payload's own environment, read once.
pub fn parent_env() -> Vec<(String, String)> {
    std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect()
}

pub fn lookup(env: &[(String, String)]) -> impl Fn(&str) -> Option<String> + '_ {
    move |name| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

/// The node name: `SLURMD_NODENAME`, else the kernel's hostname.
pub(crate) fn node_name(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    env("SLURMD_NODENAME")
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|s| s.trim().to_string()))
}

/// The id that drives the Daytona org choice: the Slurm job id, else the ledger id, else the run tag.
pub(crate) fn org_job_id(spec: &LaunchSpec, env: &dyn Fn(&str) -> Option<String>) -> String {
    env("SLURM_JOB_ID").or_else(|| spec.ledger_job_id.clone()).unwrap_or_else(|| spec.run_tag.clone())
}

/// Whether the spec needs anything from the secrets file.
pub(crate) fn needs_secrets(spec: &LaunchSpec) -> bool {
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
pub(crate) fn check_paths(spec: &LaunchSpec) -> Result<(), Failure> {
    check_run_dir(spec)?;
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
    check_prefix("serve.env_prefix", spec.serve.env_prefix.as_deref())?;
    check_prefix("harbor.env_prefix", spec.harbor.env_prefix.as_deref())
}

/// The paths a shared job's engine host needs (crate::run::shared): its run dir and the engine's
/// prefix. Harbor's inputs are each leg's, checked by the leg (a missing dataset refuses that
/// leg only).
pub(crate) fn check_engine_paths(spec: &LaunchSpec) -> Result<(), Failure> {
    check_run_dir(spec)?;
    check_prefix("serve.env_prefix", spec.serve.env_prefix.as_deref())
}

fn check_run_dir(spec: &LaunchSpec) -> Result<(), Failure> {
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
    Ok(())
}

fn check_prefix(field: &str, prefix: Option<&Path>) -> Result<(), Failure> {
    match prefix {
        Some(prefix) if !prefix.join("bin").is_dir() => Err(Failure::new(
            OutcomeClass::Spec,
            format!("field `{field}`: {}/bin does not exist (name an existing environment prefix)", prefix.display()),
        )),
        _ => Ok(()),
    }
}

/// A per-job random API key (32 bytes from the kernel's CSPRNG, hex).
pub(crate) fn random_key() -> Result<String, getrandom::Error> {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf)?;
    Ok(format!("sk-{}", hex::encode(buf)))
}

/// What only the host can tell, asked once.
#[derive(Debug)]
pub struct Observed {
    /// The secrets file, when the spec needs one.
    pub secrets_file: Option<PathBuf>,
    /// What was read from it (nothing when not needed).
    pub secrets: Result<Secrets, SecretsError>,
    /// `nvml` or `fixture:<path>`.
    pub(crate) gpu_probe: String,
    pub gpus: Result<Vec<GpuInfo>, GpuError>,
    pub port: Result<u16, PortError>,
    /// `<run_dir>/config.json` exists: Harbor resumes the job.
    pub resume: bool,
    /// What Harbor's inputs in files say: for a fresh run the merged job config (the shipped YAML
    /// with the model put in), for a resume the job's config files checked readable.
    pub harbor_job: HarborJob,
    pub paths: Result<(), Failure>,
    /// A fresh per-job key (a run), or a placeholder (a plan); used only when the model is exposed.
    pub(crate) new_api_key: Result<String, String>,
    /// `<run_tag>-<payload pid>` (a plan shows `<pid>`).
    pub(crate) run_id: String,
    /// A multi-node engine's nodes and rendezvous port (crate::multinode); `None` on one node.
    pub multinode: Option<Result<crate::multinode::Observed, crate::multinode::MultiNodeError>>,
    /// A leg of a shared job: the engine host's engine it uses instead of starting one.
    pub attached: Option<Attached>,
}

/// A leg of a shared job (crate::run::shared): the engine host's engine, and the per-job key the host
/// passed in the environment ([`launch_spec::shared::ENGINE_KEY_VAR`]). Such a leg probes no GPU,
/// picks no port and starts no engine, tunnel or multi-node step.
#[derive(Debug, Clone)]
pub struct Attached {
    pub engine: launch_spec::shared::EngineRecord,
    pub group_dir: PathBuf,
    pub api_key: Option<String>,
}

/// Harbor's inputs as read from files.
#[derive(Debug)]
pub enum HarborJob {
    /// The merged job config payload hands a fresh Harbor (`--config`).
    Fresh(Result<serde_json::Value, HarborError>),
    /// The `config.json`/`lock.json` files a resume rewrites, and whether they are readable JSON.
    Resume { files: Vec<PathBuf>, check: Result<usize, HarborError> },
}

/// Asks the host (reads the secrets file and Harbor's job files, probes GPUs and ports, looks at
/// the run dir).
pub fn observe(spec: &LaunchSpec, env: &[(String, String)], mode: Mode) -> Observed {
    observe_with(spec, env, mode, None)
}

/// [`observe`] for a leg of a shared job: the engine's port and no GPU probe (the host did both).
pub(crate) fn observe_attached(spec: &LaunchSpec, env: &[(String, String)], attached: Attached) -> Observed {
    observe_with(spec, env, Mode::Run, Some(attached))
}

fn observe_with(spec: &LaunchSpec, env: &[(String, String)], mode: Mode, attached: Option<Attached>) -> Observed {
    let env_fn = lookup(env);
    let resume = harbor::is_resume(&spec.run_dir);
    let harbor_job = if resume {
        HarborJob::Resume {
            files: harbor::config_files(&spec.run_dir),
            check: harbor::check_resumable(spec).and_then(|()| harbor::check_resume_configs(&spec.run_dir)),
        }
    } else {
        HarborJob::Fresh(harbor::merged_job_config(spec))
    };
    let (secrets_file, secrets) = if needs_secrets(spec) {
        let path = secrets::secrets_path(&spec.secrets, &env_fn);
        let loaded = secrets::load(&path);
        (Some(path), loaded)
    } else {
        (None, Ok(Secrets::none()))
    };
    let (gpu_probe, gpus, port, multinode) = match &attached {
        Some(a) => ("the shared engine's (engine host)".to_string(), Ok(Vec::new()), Ok(a.engine.port), None),
        None => {
            let probe = gpu::probe_from_env(&env_fn);
            let port = crate::ports::choose(&spec.serve.port, &crate::ports::job_id(&env_fn), &spec.serve.host);
            let multinode = crate::multinode::observe(spec, &env_fn, mode == Mode::Plan, port.as_ref().ok().copied());
            (probe.describe(), probe.probe(), port, multinode)
        }
    };
    let (new_api_key, run_id) = match mode {
        Mode::Run => (
            random_key().map_err(|e| format!("cannot get random bytes for the API key: {e}")),
            format!("{}-{}", spec.run_tag, std::process::id()),
        ),
        Mode::Plan => (Ok(tunnel::GENERATED.to_string()), format!("{}-<pid>", spec.run_tag)),
    };
    Observed {
        secrets_file,
        secrets,
        gpu_probe,
        gpus,
        port,
        resume,
        harbor_job,
        paths: check_paths(spec),
        new_api_key,
        run_id,
        multinode,
        attached,
    }
}

/// Which engine process: the head serves the API on this node; a multi-node engine adds workers on
/// the job's other nodes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineRole {
    Head,
    Worker { rank: u32 },
}

/// One engine process to start.
#[derive(Debug, Clone)]
pub struct EngineProcess {
    pub role: EngineRole,
    /// Where it runs; `None` is payload's node.
    pub node: Option<String>,
    pub child: ChildSpec,
}

/// How Harbor starts: a fresh job or a resume of the one in the run dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HarborMode {
    Fresh,
    Resume,
}

impl HarborMode {
    pub fn as_str(self) -> &'static str {
        match self {
            HarborMode::Fresh => "fresh",
            HarborMode::Resume => "resume",
        }
    }
}

/// Harbor, ready to start once `api_base` is known (the tunnel's public URL comes only when the
/// tunnel is up).
#[derive(Debug, Clone)]
pub struct HarborLaunch {
    pub mode: HarborMode,
    pub program: PathBuf,
    pub env: BTreeMap<String, String>,
    /// `--ae` items (`NAME=${SOURCE}` or literals).
    pub(crate) agent_env_args: Vec<String>,
    /// Fresh: the merged job config payload writes to `config_path` before Harbor starts.
    pub(crate) merged_config: Option<serde_json::Value>,
    pub config_path: PathBuf,
    /// Resume: the `config.json`/`lock.json` files whose `api_base` is rewritten.
    pub rewrites: Vec<PathBuf>,
    pub(crate) daytona_org: Option<DaytonaOrg>,
    pub log: PathBuf,
    pub warnings: Vec<String>,
    /// The per-job key of an exposed model, for the agent's key variables (launch_spec::agents).
    pub(crate) model_key: Option<String>,
}

impl HarborLaunch {
    /// Harbor's child for `api_base`, with what the tunnel adds: environment (proxy variables) and
    /// an argv prefix (proxychains), and the agent's own base-URL and key variables for `api_base`
    /// (launch_spec::agents, environment only). The one place Harbor's argv and environment are put
    /// together.
    pub fn child(
        &self,
        spec: &LaunchSpec,
        api_base: &str,
        tunnel_env: &BTreeMap<String, String>,
        prefix: Option<&[String]>,
    ) -> Result<ChildSpec, HarborError> {
        let program = self.program.display().to_string();
        let mut argv = match self.mode {
            HarborMode::Resume => harbor::resume_argv(spec, &program),
            HarborMode::Fresh => harbor::fresh_argv(spec, &program, api_base, &self.agent_env_args, &self.config_path)?,
        };
        let mut env = self.env.clone();
        env.extend(tunnel_env.iter().map(|(k, v)| (k.clone(), v.clone())));
        env.extend(launch_spec::agents::model_env(&spec.harbor.agent, api_base, self.model_key.as_deref()));
        let mut program = self.program.clone();
        if let Some(prefix) = prefix.filter(|p| !p.is_empty()) {
            program = PathBuf::from(&prefix[0]);
            argv.splice(0..0, prefix.iter().cloned());
        }
        Ok(ChildSpec { program, argv, env, log: self.log.clone(), cwd: None })
    }
}

/// The tunnel step as prepared: its programs and environment for `run`, its plan for `plan`.
#[derive(Debug, Clone)]
pub struct TunnelLaunch {
    /// `None` without a tunnel (or when its programs are missing: then a problem says so).
    pub programs: Option<tunnel::Programs>,
    pub env: BTreeMap<String, String>,
    pub plan: tunnel::TunnelPlan,
}

/// The GPU step's result, with what was seen when it failed.
#[derive(Debug, Clone)]
pub struct GpuPrep {
    pub probe: String,
    pub needed: u32,
    /// The GPUs seen (visible through `CUDA_VISIBLE_DEVICES`).
    pub inventory: Vec<GpuInfo>,
    pub decision: Option<GpuSelection>,
}

/// The port and how it was chosen.
#[derive(Debug, Clone)]
pub struct PortPrep {
    /// `None` when none is free (a problem says why).
    pub port: Option<u16>,
    pub how: String,
}

/// The secrets step, by name only.
#[derive(Debug, Clone)]
pub struct SecretsPrep {
    pub file: Option<PathBuf>,
    pub status: String,
    pub names: Vec<String>,
}

/// Everything the run does, decided; `problems` non-empty means `run` stops at the first.
#[derive(Debug)]
pub struct Prepared {
    pub mode: Mode,
    pub(crate) run_id: String,
    pub timings: Option<Timings>,
    pub secrets: SecretsPrep,
    /// The loaded secrets (the tunnel's tokens come from here).
    pub loaded: Secrets,
    pub gpu: GpuPrep,
    pub port: PortPrep,
    /// vLLM's loopback URL (with the port, or the policy's first port when none is free).
    pub base_url: String,
    /// The per-job key of an exposed model: in vLLM's and Harbor's environments (never argv).
    pub api_key: Option<String>,
    /// The engine's processes, head first.
    pub engines: Vec<EngineProcess>,
    /// A multi-node engine's other nodes: the ranks file and the srun that starts them.
    pub secondaries: Option<crate::multinode::Secondaries>,
    pub tunnel: TunnelLaunch,
    pub harbor: HarborLaunch,
    /// The post-run step (crate::postrun); an `Err` is recorded when the step would run.
    pub post_run: Option<Result<postrun::Step, String>>,
    /// The job's scratch dir on node-local disk and the dirs the env maps name in it (crate::scratch).
    pub scratch: Option<(PathBuf, Vec<PathBuf>)>,
    /// Environment names whose values are secrets (redacted by name in renderings).
    pub secret_names: BTreeSet<String>,
    /// Values redacted wherever they appear whole (the secrets file's, agent-env sources).
    pub hidden: Vec<String>,
    pub warnings: Vec<String>,
    pub problems: Vec<Failure>,
}

impl Prepared {
    /// The engine process that serves the API on this node.
    pub fn head(&self) -> &EngineProcess {
        self.engines.iter().find(|e| e.role == EngineRole::Head).unwrap_or(&self.engines[0])
    }

    /// What the agent calls when there is no public URL: vLLM on this node.
    pub(crate) fn local_api_base(&self) -> String {
        format!("{}/v1", self.base_url)
    }

    /// `api_base` for a tunnel's public URL (Pinggy), else vLLM on this node.
    pub fn api_base(&self, public_url: Option<&str>) -> String {
        match public_url {
            Some(url) => format!("{url}/v1"),
            None => self.local_api_base(),
        }
    }
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
) -> Result<(BTreeMap<String, String>, Option<DaytonaOrg>), SecretsError> {
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
        if launch_spec::spec::is_installed_agent(&spec.harbor.agent)
            && chosen == DaytonaOrg::Org1
            && let Some(org2) = secrets.get(secrets::DAYTONA_ORG2)
        {
            chosen = DaytonaOrg::Org2;
            key = org2;
        }
        env.insert(secrets::DAYTONA_ORG1.to_string(), key.to_string());
        env.remove(secrets::DAYTONA_ORG2);
        org = Some(chosen);
    }
    Ok((env, org))
}

/// Resolves a child's program; a missing one is a `spec` problem naming the field.
fn program(
    field: &str,
    program: &str,
    prefix: Option<&Path>,
    env: &BTreeMap<String, String>,
) -> Result<PathBuf, Failure> {
    childenv::resolve_program(program, prefix, &env["PATH"])
        .map_err(|e| Failure::new(OutcomeClass::Spec, format!("field `{field}`: {e}")))
}

/// Builds the preparation (see the module doc). `spec_path` names the file in duration problems.
pub fn prepare(spec_path: &Path, spec: &LaunchSpec, env: &[(String, String)], obs: Observed, mode: Mode) -> Prepared {
    let env_fn = lookup(env);
    let mut problems: Vec<Failure> = Vec::new();
    let mut warnings: Vec<String> = Vec::new();
    let run_id = obs.run_id.clone();

    // 1. Durations and paths.
    let timings = timings::check(spec_path, spec).map_err(|f| problems.push(f)).ok();
    if let Err(f) = obs.paths {
        problems.push(f);
    }

    // 2. Secrets (Harbor's Daytona key, pass-through names, agent-env sources).
    let (loaded, secrets) = prepare_secrets(obs.secrets, obs.secrets_file, &mut problems);
    let agent_envs = harbor::agent_envs(&spec.harbor.agent_envs, &loaded, &env_fn);
    let org_id = org_job_id(spec, &env_fn);
    let (mut harbor_env, daytona_org) = match harbor_env(spec, env, &run_id, &loaded, &org_id, &agent_envs.harbor_env) {
        Ok(pair) => pair,
        Err(e) => {
            // A secrets file that could not be read is already the problem.
            if secrets.status == "ok" {
                problems.push(e.into());
            }
            (childenv::build(env, spec.harbor.env_prefix.as_deref(), &spec.harbor.env, &run_id), None)
        }
    };
    let mut engine_env = childenv::build(env, spec.serve.env_prefix.as_deref(), &spec.serve.env, &run_id);
    for name in &spec.secrets.pass_to_engine {
        if let Some(value) = loaded.get(name) {
            engine_env.insert(name.clone(), value.to_string());
        }
    }
    let tunnel_env = childenv::build(env, None, &BTreeMap::new(), &run_id);
    // `{job_scratch}` in the env maps: the job's directory on node-local disk (crate::scratch),
    // created by `run` before the first child.
    let scratch = crate::scratch::dir(spec, &crate::ports::job_id(&env_fn)).map(|dir| {
        let mut inside = crate::scratch::substitute(&dir, &mut engine_env);
        inside.extend(crate::scratch::substitute(&dir, &mut harbor_env));
        (dir, inside)
    });
    let api_key = job_api_key(spec, obs.attached.as_ref(), &obs.new_api_key, &mut engine_env, &mut problems);
    for name in childenv::dropped_names(&spec.serve.env).into_iter().chain(childenv::dropped_names(&spec.harbor.env)) {
        warnings.push(format!("{name} dropped from the child environment (never exported by payload)"));
    }
    let mut program_or_named = |field: &str, name: &str, prefix: Option<&Path>, env: &BTreeMap<String, String>| {
        program(field, name, prefix, env).unwrap_or_else(|f| {
            problems.push(f);
            PathBuf::from(name)
        })
    };
    let engine_program =
        program_or_named("serve.program", &spec.serve.program, spec.serve.env_prefix.as_deref(), &engine_env);
    let harbor_program =
        program_or_named("harbor.program", &spec.harbor.program, spec.harbor.env_prefix.as_deref(), &harbor_env);

    // 3. GPUs → profile → gpu-memory ceiling.
    let gpu = prepare_gpu(spec, &env_fn, &obs.gpu_probe, obs.gpus, obs.attached.is_some(), mode, &mut problems);

    // 4. Port.
    let job_id = crate::ports::job_id(&env_fn);
    let port = prepare_port(spec, obs.port, obs.attached.is_some(), &env_fn, &job_id, &mut problems);
    let port_or_first = port.port.unwrap_or(spec.serve.port.fixed.unwrap_or(spec.serve.port.base));
    let base_url = match &obs.attached {
        Some(a) => a.engine.base_url.clone(),
        None => base_url(&spec.serve.host, port_or_first),
    };

    // The tunnel (its problems: programs, tokens, SOCKS port).
    let tunnel = prepare_tunnel(spec, &loaded, &job_id, port_or_first, &env_fn, tunnel_env, &mut problems);

    // 5. vLLM: the head process on this node, and a multi-node engine's workers.
    let head = EngineInputs { program: engine_program, env: engine_env, port: port_or_first, job_id: &job_id };
    let (engines, secondaries) = prepare_engines(spec, head, &gpu, obs.multinode, &env_fn, &mut problems);

    // 8. Harbor (its inputs checked now, not after the engine has loaded).
    let (merged_config, rewrites) = harbor_inputs(obs.harbor_job, &mut problems);
    let harbor = HarborLaunch {
        mode: if obs.resume { HarborMode::Resume } else { HarborMode::Fresh },
        program: harbor_program,
        env: harbor_env,
        agent_env_args: agent_envs.args.clone(),
        merged_config,
        config_path: spec.run_dir.join(harbor::MERGED_CONFIG_FILE),
        rewrites,
        daytona_org,
        log: spec.run_dir.join(launch_spec::records::HARBOR_LOG),
        warnings: agent_envs.warnings.clone(),
        model_key: api_key.clone(),
    };
    if let Err(e) = harbor.child(spec, &format!("{base_url}/v1"), &BTreeMap::new(), None) {
        problems.push(e.into());
    }

    // The post-run step, prepared with the other children's environments.
    let post_run = postrun::prepare(spec, env, &run_id, &loaded);

    let secret_names: BTreeSet<String> = std::iter::once(secrets::DAYTONA_ORG1.to_string())
        .chain(spec.secrets.pass_to_harbor.iter().cloned())
        .chain(spec.secrets.pass_to_engine.iter().cloned())
        .chain(agent_envs.harbor_env.keys().cloned())
        .chain(spec.post_run.iter().flat_map(|p| p.secrets.iter().cloned()))
        .collect();
    let hidden: Vec<String> =
        loaded.values().map(str::to_string).chain(agent_envs.harbor_env.values().cloned()).collect();
    Prepared {
        mode,
        run_id,
        timings,
        secrets,
        loaded,
        gpu,
        port,
        base_url,
        api_key,
        engines,
        secondaries,
        tunnel,
        harbor,
        post_run,
        scratch,
        secret_names,
        hidden,
        warnings,
        problems,
    }
}

/// Step 2: the secrets read (or why not), by name.
fn prepare_secrets(
    read: Result<Secrets, SecretsError>,
    file: Option<PathBuf>,
    problems: &mut Vec<Failure>,
) -> (Secrets, SecretsPrep) {
    match read {
        Ok(s) => {
            let names = s.names().map(str::to_string).collect();
            let status = if file.is_some() { "ok" } else { "not needed" };
            (s, SecretsPrep { file, status: status.into(), names })
        }
        Err(e) => {
            let status = e.to_string();
            problems.push(e.into());
            (Secrets::none(), SecretsPrep { file, status, names: vec![] })
        }
    }
}

/// The one place for the rule: a model reachable from outside gets a per-job key. vLLM reads it
/// from its environment (put into `engine_env` here), the agent from Harbor's (never argv, never a
/// file): the agent's key variables are added with its base-URL variables by `HarborLaunch::child`.
/// A leg of a shared job uses the host's key: the host's engine checks it.
fn job_api_key(
    spec: &LaunchSpec,
    attached: Option<&Attached>,
    new_key: &Result<String, String>,
    engine_env: &mut BTreeMap<String, String>,
    problems: &mut Vec<Failure>,
) -> Option<String> {
    if !tunnel::exposes_model(&spec.tunnel) {
        return None;
    }
    if let Some(a) = attached {
        if a.api_key.is_none() {
            problems.push(
                Failure::new(
                    OutcomeClass::Tunnel,
                    format!(
                        "the shared engine needs its per-job key and ${} is not set (start legs only through `payload run --shared`)",
                        launch_spec::shared::ENGINE_KEY_VAR
                    ),
                )
                .with_cause("api_key"),
            );
        }
        return a.api_key.clone();
    }
    match new_key {
        Ok(key) => {
            engine_env.insert(tunnel::VLLM_KEY_VAR.to_string(), key.clone());
            Some(key.clone())
        }
        Err(e) => {
            problems.push(Failure::new(OutcomeClass::Tunnel, e.clone()).with_cause("api_key"));
            None
        }
    }
}

/// Step 3: the GPUs seen → the profile → the gpu-memory ceiling (a leg of a shared job: the host
/// chose them for the engine).
fn prepare_gpu(
    spec: &LaunchSpec,
    env_fn: &dyn Fn(&str) -> Option<String>,
    probe: &str,
    gpus: Result<Vec<GpuInfo>, GpuError>,
    attached: bool,
    mode: Mode,
    problems: &mut Vec<Failure>,
) -> GpuPrep {
    let cuda_visible = env_fn("CUDA_VISIBLE_DEVICES");
    let inventory = gpus.as_ref().ok().and_then(|v| gpu::visible(v, cuda_visible.as_deref()).ok());
    let probe_text = match &gpus {
        Err(e) => e.to_string(),
        Ok(_) => probe.to_string(),
    };
    let pick = match attached {
        true => Ok(None),
        false => gpu::select(spec, probe, gpus, cuda_visible.as_deref(), mode == Mode::Plan).map(Some),
    };
    let needed = spec.gpus_needed();
    match pick {
        Ok(None) => GpuPrep { probe: probe_text, needed, inventory: Vec::new(), decision: None },
        Ok(Some(d)) => GpuPrep { probe: d.probe.clone(), needed, inventory: d.inventory.clone(), decision: Some(d) },
        Err(e) => {
            problems.push(e.into());
            GpuPrep { probe: probe_text, needed, inventory: inventory.unwrap_or_default(), decision: None }
        }
    }
}

/// Step 4: the port, and how it was chosen (the `port` event's `how`).
fn prepare_port(
    spec: &LaunchSpec,
    observed: Result<u16, PortError>,
    attached: bool,
    env_fn: &dyn Fn(&str) -> Option<String>,
    job_id: &str,
    problems: &mut Vec<Failure>,
) -> PortPrep {
    let port = match observed {
        Ok(port) => port,
        Err(e) => {
            let how = e.to_string();
            problems.push(e.into());
            return PortPrep { port: None, how };
        }
    };
    let how = match spec.serve.port.fixed {
        _ if attached => format!("the shared engine's ({})", launch_spec::shared::ENGINE_FILE),
        Some(_) => "fixed (serve.port.fixed), free now".to_string(),
        None => {
            // A port already taken on this node (another job's engine, any server) is stepped
            // over before the engine starts, and said so.
            let derived = crate::ports::derived_start(&spec.serve.port, job_id);
            format!(
                "derived from {} in [{}, {}){}, free now",
                if env_fn("SLURM_JOB_ID").is_some() {
                    format!("job id {job_id}")
                } else {
                    format!("pid {job_id} (no SLURM_JOB_ID)")
                },
                spec.serve.port.base,
                u32::from(spec.serve.port.base) + u32::from(spec.serve.port.span),
                if derived == port { String::new() } else { format!(": {derived} was taken, the next free one") }
            )
        }
    };
    PortPrep { port: Some(port), how }
}

/// The tunnel step: its programs and plan (its problems: programs, tokens, SOCKS port).
fn prepare_tunnel(
    spec: &LaunchSpec,
    loaded: &Secrets,
    job_id: &str,
    engine_port: u16,
    env_fn: &dyn Fn(&str) -> Option<String>,
    env: BTreeMap<String, String>,
    problems: &mut Vec<Failure>,
) -> TunnelLaunch {
    let plan = tunnel::plan(
        &spec.tunnel,
        &tunnel::PlanInputs {
            secrets: loaded,
            job_id,
            engine_host: &spec.serve.host,
            engine_port,
            served_name: &spec.model.served_name,
            node: node_name(env_fn).unwrap_or_default(),
            child_path: &env["PATH"],
        },
        problems,
    );
    TunnelLaunch { programs: tunnel::programs(&spec.tunnel, &env["PATH"]).ok().flatten(), env, plan }
}

/// What the engine's processes are built from.
struct EngineInputs<'a> {
    program: PathBuf,
    env: BTreeMap<String, String>,
    port: u16,
    job_id: &'a str,
}

/// Step 5: vLLM's head process on this node and, for a multi-node engine, the head's flags and one
/// worker per other node with their srun step (crate::multinode); head first.
fn prepare_engines(
    spec: &LaunchSpec,
    head: EngineInputs<'_>,
    gpu: &GpuPrep,
    multinode: Option<Result<crate::multinode::Observed, crate::multinode::MultiNodeError>>,
    env_fn: &dyn Fn(&str) -> Option<String>,
    problems: &mut Vec<Failure>,
) -> (Vec<EngineProcess>, Option<crate::multinode::Secondaries>) {
    let EngineInputs { program, env, port, job_id } = head;
    let (util, extra) = match &gpu.decision {
        Some(d) => (d.gpu_memory_utilization, d.extra_vllm_args().to_vec()),
        None => (spec.serve.gpu_memory_utilization.unwrap_or(0.0), Vec::new()),
    };
    let mut argv = engine::argv(spec, &program.display().to_string(), port, util, &extra, env_fn).unwrap_or_else(|e| {
        problems.push(e.into());
        Vec::new()
    });
    let mut workers = Vec::new();
    let mut secondaries = None;
    match multinode {
        Some(Ok(observed)) if !argv.is_empty() => {
            match crate::multinode::prepare(spec, &mut argv, &env, observed, job_id.to_string()) {
                Ok((ranks, launch)) => {
                    for rank in ranks.into_iter().skip(1) {
                        workers.push(EngineProcess {
                            role: EngineRole::Worker { rank: rank.rank },
                            child: ChildSpec {
                                program: program.clone(),
                                argv: rank.argv,
                                env: env.clone(),
                                log: crate::multinode::rank_log_path(&spec.run_dir, &rank.node),
                                cwd: None,
                            },
                            node: Some(rank.node),
                        });
                    }
                    secondaries = Some(launch);
                }
                Err(f) => problems.push(f),
            }
        }
        Some(Ok(_)) | None => {}
        Some(Err(e)) => problems.push(e.into()),
    }
    let mut engines = vec![EngineProcess {
        role: EngineRole::Head,
        node: None,
        child: ChildSpec { program, argv, env, log: spec.run_dir.join(launch_spec::records::ENGINE_LOG), cwd: None },
    }];
    engines.extend(workers);
    (engines, secondaries)
}

/// Harbor's inputs from files: a fresh run's merged job config, a resume's files to rewrite.
fn harbor_inputs(job: HarborJob, problems: &mut Vec<Failure>) -> (Option<serde_json::Value>, Vec<PathBuf>) {
    match job {
        HarborJob::Resume { files, check } => {
            if let Err(e) = check {
                problems.push(e.into());
            }
            (None, files)
        }
        HarborJob::Fresh(Ok(config)) => (Some(config), Vec::new()),
        HarborJob::Fresh(Err(e)) => {
            problems.push(e.into());
            (None, Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use launch_spec::testkit::unit_spec as spec;

    fn observed(spec: &LaunchSpec, secrets: Secrets) -> Observed {
        Observed {
            secrets_file: Some(PathBuf::from("/s.env")),
            secrets: Ok(secrets),
            gpu_probe: "fixture:test".into(),
            gpus: Ok(vec![GpuInfo {
                index: 0,
                uuid: "GPU-0".into(),
                name: "NVIDIA H100".into(),
                memory_total_bytes: 80 << 30,
            }]),
            port: Ok(23456),
            resume: false,
            harbor_job: HarborJob::Fresh(harbor::merged_job_config(spec)),
            paths: Ok(()),
            new_api_key: Ok("sk-test-key".into()),
            run_id: format!("{}-7", spec.run_tag),
            multinode: None,
            attached: None,
        }
    }

    fn secrets() -> Secrets {
        Secrets::from_pairs(
            Path::new("/s.env"),
            [
                ("DAYTONA_API_KEY".to_string(), "key-one".to_string()),
                ("DAYTONA_DATA_API_KEY".to_string(), "key-two".to_string()),
            ],
        )
    }

    fn env() -> Vec<(String, String)> {
        vec![("PATH".to_string(), "/usr/bin:/bin".to_string()), ("SLURM_JOB_ID".into(), "7".into())]
    }

    #[test]
    fn harbor_env_carries_chosen_key_only() {
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
        let mut spec2 = spec();
        spec2.secrets.pass_to_harbor = vec!["HF_TOKEN".into(), "ABSENT".into()];
        let (env, org) = harbor_env(&spec2, &parent, "rid", &secrets, "7", &BTreeMap::new()).unwrap();
        let org = org.unwrap();
        let want = if org == DaytonaOrg::Org1 { "key-one" } else { "key-two" };
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
        s.harbor.agent_envs.push(launch_spec::spec::AgentEnv { name: "X".into(), from: None, value: Some("1".into()) });
        assert!(!needs_secrets(&s));
        s.harbor.agent_envs.push(launch_spec::spec::AgentEnv { name: "Y".into(), from: None, value: None });
        assert!(needs_secrets(&s));
    }

    #[test]
    fn base_url_uses_loopback_for_wildcards() {
        assert_eq!(base_url("0.0.0.0", 8000), "http://127.0.0.1:8000");
        assert_eq!(base_url("127.0.0.1", 9), "http://127.0.0.1:9");
        assert_eq!(base_url("::1", 9), "http://[::1]:9");
    }

    #[test]
    fn random_keys_differ_and_are_hex() {
        let (a, b) = (random_key().unwrap(), random_key().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 3 + 64);
        assert!(a[3..].chars().all(|c| c.is_ascii_hexdigit()), "{a}");
    }

    #[test]
    fn problems_come_in_the_order_run_meets_them() {
        let mut s = spec();
        s.serve.program = "no-such-vllm-xyz".into();
        let mut obs = observed(&s, secrets());
        obs.port = Err(PortError::FixedTaken { port: 9 });
        obs.paths = Err(Failure::new(OutcomeClass::Spec, "paths"));
        let p = prepare(Path::new("launch.json"), &s, &env(), obs, Mode::Run);
        let messages: Vec<&str> = p.problems.iter().map(|f| f.message.as_str()).collect();
        assert_eq!(messages[0], "paths", "{messages:?}");
        assert!(messages[1].starts_with("field `serve.program`"), "{messages:?}");
        assert!(p.problems.iter().any(|f| f.cause.as_deref() == Some("port")), "{messages:?}");
        // Still a complete preparation, so the plan can show it.
        assert_eq!(p.head().child.argv[1], "serve");
    }

    #[test]
    fn only_an_exposed_model_gets_the_key_in_both_environments() {
        let s = spec();
        let p = prepare(Path::new("l.json"), &s, &env(), observed(&s, secrets()), Mode::Run);
        assert!(p.api_key.is_none());
        assert!(!p.head().child.env.contains_key(tunnel::VLLM_KEY_VAR));
        let child = p.harbor.child(&s, &p.api_base(None), &BTreeMap::new(), None).unwrap();
        assert!(!child.env.contains_key(launch_spec::agents::HOSTED_VLLM_KEY));

        let mut s = spec();
        s.tunnel = serde_json::from_value(serde_json::json!({
            "kind": "pinggy", "host": "pro.pinggy.io", "public_url": "https://x.a.pinggy.link", "token_secret": "PINGGY_TOKEN"
        }))
        .unwrap();
        let p = prepare(Path::new("l.json"), &s, &env(), observed(&s, secrets()), Mode::Run);
        assert_eq!(p.api_key.as_deref(), Some("sk-test-key"));
        assert_eq!(p.head().child.env[tunnel::VLLM_KEY_VAR], "sk-test-key");
        let child = p.harbor.child(&s, &p.api_base(Some("https://x.a.pinggy.link")), &BTreeMap::new(), None).unwrap();
        assert_eq!(child.env[launch_spec::agents::HOSTED_VLLM_KEY], "sk-test-key");
        // The agent's own variables (launch_spec::agents), when it is one the table knows.
        s.harbor.agent = "openhands".into();
        let oh = p.harbor.child(&s, "https://x.a.pinggy.link/v1", &BTreeMap::new(), None).unwrap();
        assert_eq!(oh.env["LLM_API_KEY"], "sk-test-key");
        assert_eq!(oh.env["LLM_BASE_URL"], "https://x.a.pinggy.link/v1");
        assert!(child.argv.iter().all(|a| !a.contains("sk-test-key")), "never in argv");
        assert!(child.argv.contains(&"api_base=https://x.a.pinggy.link/v1".to_string()));
    }

    #[test]
    fn the_tunnel_prefix_and_environment_go_onto_harbor() {
        let s = spec();
        let p = prepare(Path::new("l.json"), &s, &env(), observed(&s, secrets()), Mode::Run);
        let prefix = vec!["/bin/proxychains4".to_string(), "-q".into(), "-f".into(), "/tmp/p.conf".into()];
        let proxy: BTreeMap<String, String> = [("ALL_PROXY".to_string(), "socks5h://127.0.0.1:1".to_string())].into();
        let child = p.harbor.child(&s, &p.local_api_base(), &proxy, Some(&prefix)).unwrap();
        assert_eq!(child.program, Path::new("/bin/proxychains4"));
        assert_eq!(&child.argv[..4], &prefix[..]);
        assert_eq!(&child.argv[5..7], ["jobs", "start"]);
        assert_eq!(child.env["ALL_PROXY"], "socks5h://127.0.0.1:1");
        assert!(child.argv.contains(&"api_base=http://127.0.0.1:23456/v1".to_string()));
    }
}
