//! The launch spec: the one contract between `submitter` (writes it) and `payload` (runs it).
//!
//! Versioned JSON. Everything payload needs is resolved in it; it holds no secret values, only the
//! path of the secrets file and the *names* of variables to take from it. The field names
//! `run_dir`, `jobs_dir`, `run_tag`, `serve.program`, `harbor.program`, `harbor.dataset` and
//! `secrets.file` are a stable interface: editing them by hand re-points a run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::gpu::GpuProfiles;

/// Bumped on any incompatible change; payload refuses specs with another major version.
pub const SPEC_VERSION: u32 = 1;

/// The infra error types Harbor re-runs on resume (`--filter-error-type`): the exception class
/// names Harbor 0.25.0 records in a trial's `exception_info.exception_type` for faults of the
/// sandbox or the harness rather than the model. The Daytona ones are the `daytona` SDK's classes
/// (`DaytonaAuthorizationError` is an alias there, recorded as `DaytonaForbiddenError`).
pub const INFRA_ERROR_TYPES: &[&str] = &[
    "DaytonaError",
    "DaytonaAuthenticationError",
    "DaytonaForbiddenError",
    "DaytonaNotFoundError",
    "DaytonaRateLimitError",
    "EnvironmentStartTimeoutError",
    "CancelledError",
    "SandboxBuildFailedError",
    "AddTestsDirError",
    "AgentSetupTimeoutError",
    "SandboxLikelyOutOfMemoryError",
    "HealthcheckError",
    "NetworkConnectionError",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSpec {
    pub version: u32,
    /// Deterministic from (benchmark, model, agent) for an eval's first attempt; a continuation of
    /// an unfinished job keeps it, a re-evaluation gets one of its own (docs/submitter.md).
    pub run_tag: String,
    /// Where payload writes its records; equals `<jobs_dir>/<run_tag>` (Harbor's job dir).
    pub run_dir: PathBuf,
    /// Harbor's `--jobs-dir`.
    pub jobs_dir: PathBuf,
    pub cluster: String,
    pub benchmark: String,
    /// The ledger's attempt id, when submitted through the ledger.
    #[serde(default)]
    pub ledger_job_id: Option<String>,
    pub model: ModelSpec,
    pub serve: ServeSpec,
    pub gpu_profiles: GpuProfiles,
    #[serde(default)]
    pub tunnel: TunnelSpec,
    pub harbor: HarborSpec,
    pub secrets: SecretsSpec,
    #[serde(default)]
    pub limits: Limits,
    /// An optional step payload runs after Harbor finished (e.g. a trace upload), docs/payload.md.
    /// Absent from older specs (read as none) and left out when none, so a spec without it reads
    /// the same in an older payload; an older payload refuses a spec that has one (unknown field)
    /// rather than silently skipping it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_run: Option<PostRunSpec>,
    /// Per-job scratch on node-local disk for the caches `{job_scratch}` names in `serve.env` /
    /// `harbor.env` values (docs/site.md). Absent: `/tmp`. Left out when absent, like `post_run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch: Option<ScratchSpec>,
    /// The programs the spec was built for (the profile's declared vLLM and Harbor of the
    /// environments it runs): payload asks the environments at start and ends the job as `spec`
    /// on a disagreement (docs/real-programs.md). Absent (hand-written, older specs): not compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<crate::versions::Declared>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScratchSpec {
    /// Node-local directory under which payload creates `eval_<job id>` (mode 0700).
    pub root: PathBuf,
}

/// The post-run step: one program with its argv (never a shell string), run in the run dir after
/// Harbor exited 0, its time bounded, its outcome recorded but never the run's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostRunSpec {
    /// `argv[0]` is the program: a path, or a name resolved in `<env_prefix>/bin`, then PATH. In
    /// every element `{run_dir}` and `{run_tag}` are replaced by the run's values.
    pub argv: Vec<String>,
    /// Wall-clock bound: at this point its process group gets SIGTERM, then SIGKILL after
    /// `limits.teardown_grace_s`.
    pub timeout_s: u64,
    /// Python environment prefix put on PATH/LD_LIBRARY_PATH (never activated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_prefix: Option<PathBuf>,
    /// Extra non-secret environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Names of secrets (from the secrets file) handed to the step, e.g. `HF_TOKEN`; no other secret is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

impl PostRunSpec {
    /// `argv` with the placeholders replaced (crate::placeholder; [`Self::problem`] refused any other).
    pub fn resolved_argv(&self, run_dir: &Path, run_tag: &str) -> Vec<String> {
        use crate::placeholder as ph;
        let run_dir = run_dir.display().to_string();
        let values = [(ph::RUN_DIR, run_dir.as_str()), (ph::RUN_TAG, run_tag)];
        self.argv.iter().map(|a| ph::substitute(a, &values)).collect()
    }

    /// The first problem, as (field, problem).
    pub fn problem(&self) -> Result<(), (&'static str, String)> {
        crate::validate::post_run_argv(&self.argv).map_err(|p| ("post_run.argv", p))?;
        crate::placeholder::check_all(crate::placeholder::Field::PostRunArgv, &self.argv)
            .map_err(|(i, e)| ("post_run.argv", format!("element {i}: {e}")))?;
        crate::validate::whole_seconds(self.timeout_s, true).map_err(|p| ("post_run.timeout_s", p))?;
        if let Some(name) = self.secrets.iter().chain(self.env.keys()).find(|n| !is_var_name(n)) {
            return Err((
                "post_run.secrets",
                format!("`{name}` is not a variable name ([A-Za-z_][A-Za-z0-9_]*): name the secret, never its value"),
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Hugging Face id, e.g. `Qwen/Qwen3-8B`: checked as it is read (`ModelId`), the error naming
    /// this field.
    #[serde(deserialize_with = "hf_id_field")]
    pub hf_id: crate::ModelId,
    /// Name vLLM serves under and Harbor calls (`hosted_vllm/<served_name>`), ≤ 64 chars.
    pub served_name: String,
    /// Pre-downloaded weights; served instead of the HF id when set.
    #[serde(default)]
    pub local_path: Option<PathBuf>,
}

/// `model.hf_id`: a [`crate::ModelId`], refused as it is read with the field named (a parse error
/// carries the line and column, not the field's path).
fn hf_id_field<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<crate::ModelId, D::Error> {
    let text = String::deserialize(deserializer)?;
    crate::ModelId::new(text).map_err(|e| serde::de::Error::custom(format!("field `model.hf_id` {e}")))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ServeInvocation {
    /// `<program> serve <model> …`
    #[default]
    Serve,
    /// `<program> -m vllm.entrypoints.openai.api_server --model <model> …` (program is a python).
    ApiServerModule,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeSpec {
    /// Executable: an absolute path, or a name resolved in `<env_prefix>/bin`, then PATH.
    pub program: String,
    /// Python environment prefix (old `conda_envs` value); never activated, only put on PATH.
    #[serde(default)]
    pub env_prefix: Option<PathBuf>,
    #[serde(default)]
    pub invocation: ServeInvocation,
    /// Listen address; 127.0.0.1 unless a tunnel or multi-node needs more.
    #[serde(default = "default_host")]
    pub host: String,
    pub tensor_parallel_size: u32,
    pub data_parallel_size: u32,
    /// 1 = no pipeline parallelism. Left out of the JSON when 1, so a single-node spec reads the
    /// same in an older payload.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub pipeline_parallel_size: u32,
    /// Nodes the engine spans (docs/multinode.md): payload starts one rank per node. Left out when 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub nodes: u32,
    /// vLLM's `--distributed-timeout-seconds` for a multi-node engine (weights load slowly on some nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distributed_timeout_s: Option<u64>,
    #[serde(default)]
    pub max_model_len: Option<u64>,
    #[serde(default)]
    pub max_num_seqs: Option<u32>,
    #[serde(default)]
    pub swap_space: Option<u32>,
    /// Whether the installed vLLM still has `--swap-space`: follows from the environment's declared
    /// vLLM version (crate::versions), never a `--help` probe.
    #[serde(default)]
    pub supports_swap_space: bool,
    #[serde(default)]
    pub trust_remote_code: bool,
    #[serde(default)]
    pub tool_call_parser: Option<String>,
    #[serde(default)]
    pub reasoning_parser: Option<String>,
    /// JSON text, passed as one argv element.
    #[serde(default)]
    pub hf_overrides: Option<String>,
    /// JSON text, passed as one argv element.
    #[serde(default)]
    pub limit_mm_per_prompt: Option<String>,
    /// Registry extra args as written; `${VAR}` expanded by payload from its environment, then split
    /// on whitespace with no quote processing ([`split_extra_args`]; never run through a shell).
    #[serde(default)]
    pub extra_args: Option<String>,
    /// Extra environment for vLLM (non-secret).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub port: PortPolicy,
    /// Operator override of the GPU profile's value (highest precedence).
    #[serde(default)]
    pub gpu_memory_utilization: Option<f64>,
    /// The cluster profile's override (below the operator's, above the GPU profile).
    #[serde(default)]
    pub cluster_gpu_memory_utilization: Option<f64>,
    /// Overall readiness deadline. Cold 32B loads take 20–30 minutes.
    #[serde(default = "default_health_timeout")]
    pub health_timeout_s: u64,
    /// While Harbor runs: requests in flight and no token for this long is `engine_hung` (the
    /// profile's `engine.hang_after_s`). The default outlasts a slow 235B's prefill of a long
    /// context.
    #[serde(default = "default_hang_after")]
    pub hang_after_s: u64,
    /// While loading: no new bytes in `vllm.log` for this long ends the run as `engine_start`
    /// with cause `stalled`, before `health_timeout_s` (the profile's `engine.load_stall_after_s`;
    /// docs/payload.md "Readiness budget").
    #[serde(default = "default_load_stall_after")]
    pub load_stall_after_s: u64,
    /// How long loading is expected to take, and how submitter worked it out (`None`: only the cap
    /// `health_timeout_s` applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_budget: Option<ReadyBudget>,
    /// GPUs the plan assumes when NVML is absent (`payload plan` on a login node).
    #[serde(default)]
    pub declared_gpus: Option<u32>,
    /// Allow running without NVML (CPU stand-in engines in tests and demos only).
    #[serde(default)]
    pub allow_no_gpu: bool,
    /// Also require one real chat completion before declaring the engine ready (vec-inf #142).
    #[serde(default)]
    pub ready_needs_completion: bool,
}

/// The registry's `extra_args` as argv words: split on whitespace, quotes kept as written. The old
/// scripts expanded `$EVAL_VLLM_EXTRA_ARGS` unquoted, so bash word-split it without quote removal;
/// registry entries rely on that (`--override-generation-config {"temperature":0.7,…}` stays one
/// word with its quotes, which a shell-style split would strip).
pub fn split_extra_args(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

fn default_host() -> String {
    "127.0.0.1".to_string()
}

/// The default `serve.health_timeout_s` (and the profile's `engine.health_timeout_s`): the cap on
/// readiness.
pub const DEFAULT_HEALTH_TIMEOUT_S: u64 = 3600;

fn default_health_timeout() -> u64 {
    DEFAULT_HEALTH_TIMEOUT_S
}

/// The default `serve.hang_after_s` (and the profile's `engine.hang_after_s`).
pub const DEFAULT_HANG_AFTER_S: u64 = 600;

fn default_hang_after() -> u64 {
    DEFAULT_HANG_AFTER_S
}

/// `serve.load_stall_after_s` when absent: longer than any silent stretch of a healthy vLLM load
/// (compile and CUDA-graph capture log every few tens of seconds).
pub const DEFAULT_LOAD_STALL_AFTER_S: u64 = 300;

fn default_load_stall_after() -> u64 {
    DEFAULT_LOAD_STALL_AFTER_S
}

/// The readiness budget (it lives with the records that carry it).
pub use crate::records::ReadyBudget;

impl ServeSpec {
    /// The readiness deadline payload starts with: the budget, never past the cap
    /// `health_timeout_s` (docs/payload.md "Readiness budget").
    pub fn ready_deadline_s(&self) -> u64 {
        self.ready_budget.as_ref().map_or(self.health_timeout_s, |b| b.seconds.min(self.health_timeout_s))
    }

    /// One line for `plan` (submitter's and payload's): the deadline, how it was computed, and
    /// the rules that govern loading past it.
    pub fn readiness_line(&self) -> String {
        let stall = format!("{} s without vllm.log progress is engine_start/stalled", self.load_stall_after_s);
        match &self.ready_budget {
            Some(budget) if budget.seconds <= self.health_timeout_s => {
                format!(
                    "deadline {}; past it a load still making progress runs on to the cap; {stall}",
                    budget.describe()
                )
            }
            Some(budget) => format!(
                "deadline {} s, the cap serve.health_timeout_s (budget {}); {stall}",
                self.health_timeout_s,
                budget.describe()
            ),
            None => format!("deadline {} s, serve.health_timeout_s: {NO_BUDGET}; {stall}", self.health_timeout_s),
        }
    }
}

/// Why a spec has no `serve.ready_budget`: what `plan` says.
pub(crate) const NO_BUDGET: &str =
    "no budget (checkpoint size unknown: no weights found and no parameter count in the model id)";

fn one() -> u32 {
    1
}

fn is_one(value: &u32) -> bool {
    *value == 1
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortPolicy {
    /// A fixed port; otherwise one derived from the Slurm job id within [base, base+span).
    #[serde(default)]
    pub fixed: Option<u16>,
    #[serde(default = "default_port_base")]
    pub base: u16,
    #[serde(default = "default_port_span")]
    pub span: u16,
}

fn default_port_base() -> u16 {
    20000
}

fn default_port_span() -> u16 {
    20000
}

impl Default for PortPolicy {
    fn default() -> Self {
        Self { fixed: None, base: default_port_base(), span: default_port_span() }
    }
}

/// How Harbor's agent reaches the model and how the node reaches the internet (docs/design.md §6.5,
/// docs/tunnels.md). JSON: `{"kind": "none"}`, `{"kind": "pinggy", …}`, `{"kind": "socks", …}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TunnelSpec {
    /// terminus-2 and other local agents call vLLM on the node.
    #[default]
    None,
    /// Reverse tunnel for installed-harness agents that run inside the remote sandbox.
    Pinggy(PinggySpec),
    /// SOCKS egress proxy for compute nodes without internet.
    Socks(SocksSpec),
}

/// Agents that run on the compute node and call vLLM over loopback; every other Harbor agent is an
/// installed harness that runs inside the remote sandbox and needs the model on a public URL.
/// (The replaced system's list: terminus*, oracle, nop, mini-swe-agent, swe-agent.)
pub const LOCAL_AGENTS: &[&str] =
    &["terminus", "terminus-1", "terminus-2", "terminus-kira", "oracle", "nop", "mini-swe-agent", "swe-agent"];

/// Whether `agent` runs inside the remote sandbox (and so needs a Pinggy tunnel).
pub fn is_installed_agent(agent: &str) -> bool {
    !(LOCAL_AGENTS.contains(&agent) || agent.starts_with("terminus"))
}

/// One (public URL, token secret) pair of the operator's Pinggy bank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinggyPair {
    /// The persistent public URL the token owns, e.g. `https://abc.a.pinggy.link`.
    pub public_url: String,
    /// Name of the secret (in the secrets file) holding the token; never the token.
    pub token_secret: String,
    /// Server host for this pair; default the spec's `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinggySpec {
    /// `pro.pinggy.io` for persistent tokens.
    pub host: String,
    #[serde(default = "default_pinggy_port")]
    pub port: u16,
    /// The persistent public URL of the first pair, e.g. `https://abc.a.pinggy.link`.
    pub public_url: String,
    /// Name of the secret (in the secrets file) holding the first pair's token; never the token.
    pub token_secret: String,
    /// Further pairs, tried (in a rotation derived from the job id) when a pair is leased by another
    /// job or Pinggy reports its token already active.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bank: Vec<PinggyPair>,
    /// Shared directory (the cluster's `<state_dir>/pinggy`) with one lease file per pair, so two
    /// live jobs never hold the same pair. Without it, only Pinggy's lock message steers the choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_dir: Option<PathBuf>,
    /// A lease not refreshed for this long belongs to a dead job and may be taken over.
    #[serde(default = "default_lease_ttl")]
    pub lease_ttl_s: u64,
    /// Remote port asked for (`-R<remote_port>:…`); Pinggy ignores it and assigns the public URL.
    /// Generic SSH reverse-tunnel servers (and the tests' sshd) honour it.
    #[serde(default)]
    pub remote_port: u16,
    /// Client key; Pinggy needs none (the token is the user name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_file: Option<PathBuf>,
    /// Pinned host keys (`StrictHostKeyChecking yes`); default: accept-new into a run-private file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_hosts: Option<PathBuf>,
    /// Restarts of a dropped tunnel (consecutive; the count resets after a stable period).
    #[serde(default = "default_restarts")]
    pub max_restarts: u32,
    /// First restart delay; doubled per consecutive restart, capped at 30 s.
    #[serde(default = "default_backoff")]
    pub restart_backoff_s: f64,
    /// On a restart of a pair this job already held, add Pinggy's `force` keyword so a stale
    /// session of our own (still active on Pinggy's side) is disconnected instead of locking us out.
    #[serde(default = "yes")]
    pub force_on_restart: bool,
    /// How long to wait for the server's banner (or a live connection) before retrying.
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_s: f64,
    /// End-to-end check: `GET <public_url>/v1/models` must list the served name.
    #[serde(default = "default_verify_attempts")]
    pub verify_attempts: u32,
    #[serde(default = "default_verify_interval")]
    pub verify_interval_s: f64,
    #[serde(default = "default_alive_interval")]
    pub server_alive_interval_s: u32,
    #[serde(default = "default_alive_count")]
    pub server_alive_count_max: u32,
    /// Compute nodes without internet: the job also runs this SOCKS egress proxy to the login
    /// node (for Harbor, as in a `socks` tunnel), Pinggy's ssh reaches Pinggy through the login
    /// node (`ProxyJump`), and the public-URL check goes through the proxy (docs/tunnels.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Box<SocksSpec>>,
}

impl PinggySpec {
    /// Every pair, the first one (`public_url`/`token_secret`) first.
    pub fn pairs(&self) -> Vec<PinggyPair> {
        let mut pairs = vec![PinggyPair {
            public_url: self.public_url.clone(),
            token_secret: self.token_secret.clone(),
            host: None,
        }];
        pairs.extend(self.bank.iter().cloned());
        pairs
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SocksSpec {
    pub login_node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Key for the login node; an OpenSSH certificate `<identity_file>-cert.pub` beside it (step-ca
    /// on Leonardo) is used automatically by ssh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_port: Option<u16>,
    /// Pinned host keys (`StrictHostKeyChecking yes`); default: accept-new into a run-private file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_hosts: Option<PathBuf>,
    /// How Harbor uses it: proxy environment variables or a proxychains config.
    #[serde(default)]
    pub mode: ProxyMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxychains_bin: Option<String>,
    /// The local SOCKS port: fixed, or derived from the job id in [base, base+span) and checked free.
    #[serde(default = "default_socks_ports")]
    pub port: PortPolicy,
    /// One request through the proxy before Harbor starts: a SOCKS5 CONNECT to this URL's host and
    /// port (for `http://` also a GET that must answer with an HTTP status line).
    #[serde(default = "default_socks_verify")]
    pub verify_url: String,
    #[serde(default = "default_verify_attempts")]
    pub verify_attempts: u32,
    #[serde(default = "default_socks_verify_interval")]
    pub verify_interval_s: f64,
    /// Extra `NO_PROXY` entries (loopback and private ranges are always excluded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_proxy: Vec<String>,
    #[serde(default = "default_restarts")]
    pub max_restarts: u32,
    #[serde(default = "default_backoff")]
    pub restart_backoff_s: f64,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_s: f64,
    #[serde(default = "default_alive_interval")]
    pub server_alive_interval_s: u32,
    #[serde(default = "default_alive_count")]
    pub server_alive_count_max: u32,
}

/// An absolute http(s) URL with a host, written without whitespace (it goes into configs as is).
fn is_http_url(text: &str) -> bool {
    !text.contains(char::is_whitespace)
        && url::Url::parse(text)
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty()))
}

fn is_var_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// A host name or address for a generated ssh config line (no spaces, quotes or `%` tokens).
fn is_config_word(word: &str) -> bool {
    !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "._-:@[]".contains(c))
}

impl TunnelSpec {
    /// The first problem with the tunnel settings, as (field, problem).
    pub fn problem(&self) -> Result<(), (&'static str, String)> {
        use crate::validate as v;
        match self {
            TunnelSpec::None => Ok(()),
            TunnelSpec::Pinggy(p) => {
                if !is_config_word(&p.host) {
                    return Err(("tunnel.host", format!("`{}` is not a host name", p.host)));
                }
                let mut seen = std::collections::BTreeSet::new();
                for pair in p.pairs() {
                    if !is_http_url(&pair.public_url) {
                        return Err((
                            "tunnel.public_url",
                            format!("`{}` must be an http:// or https:// URL", pair.public_url),
                        ));
                    }
                    if !is_var_name(&pair.token_secret) {
                        return Err((
                            "tunnel.token_secret",
                            format!(
                                "`{}` must be the name of a secret ([A-Za-z_][A-Za-z0-9_]*), never the token",
                                pair.token_secret
                            ),
                        ));
                    }
                    if let Some(host) = &pair.host
                        && !is_config_word(host)
                    {
                        return Err(("tunnel.bank", format!("host `{host}` is not a host name")));
                    }
                    if !seen.insert(pair.public_url.trim_end_matches('/').to_string()) {
                        return Err(("tunnel.bank", format!("public URL {} is listed twice", pair.public_url)));
                    }
                }
                if p.verify_attempts == 0 {
                    return Err(("tunnel.verify_attempts", "must be ≥ 1".to_string()));
                }
                tunnel_timing(
                    p.restart_backoff_s,
                    p.connect_timeout_s,
                    p.verify_interval_s,
                    p.server_alive_interval_s,
                )?;
                v::whole_seconds(p.lease_ttl_s, true).map_err(|e| ("tunnel.lease_ttl_s", e))?;
                match &p.egress {
                    Some(egress) => socks_problem(egress).map_err(|(field, e)| {
                        ("tunnel.egress", format!("{}: {e}", field.trim_start_matches("tunnel.")))
                    }),
                    None => Ok(()),
                }
            }
            TunnelSpec::Socks(s) => socks_problem(s),
        }
    }
}

/// The first problem with SOCKS settings (a `socks` tunnel, or a Pinggy tunnel's `egress`).
fn socks_problem(s: &SocksSpec) -> Result<(), (&'static str, String)> {
    use crate::validate as v;
    if !is_config_word(&s.login_node) {
        return Err(("tunnel.login_node", format!("`{}` is not a host name", s.login_node)));
    }
    if let Some(user) = &s.user
        && !is_config_word(user)
    {
        return Err(("tunnel.user", format!("`{user}` is not a user name")));
    }
    if !is_http_url(&s.verify_url) {
        return Err(("tunnel.verify_url", format!("`{}` must be an http:// or https:// URL", s.verify_url)));
    }
    if s.verify_attempts == 0 {
        return Err(("tunnel.verify_attempts", "must be ≥ 1".to_string()));
    }
    if let Some(fixed) = s.port.fixed {
        v::port(fixed).map_err(|e| ("tunnel.port.fixed", e))?;
    }
    v::port_range(s.port.base, s.port.span).map_err(|e| ("tunnel.port", e))?;
    tunnel_timing(s.restart_backoff_s, s.connect_timeout_s, s.verify_interval_s, s.server_alive_interval_s)
}

/// The tunnel's durations, as payload turns them into `Duration`s and deadlines.
fn tunnel_timing(backoff: f64, connect: f64, verify: f64, alive: u32) -> Result<(), (&'static str, String)> {
    use crate::validate as v;
    v::seconds(backoff, false).map_err(|e| ("tunnel.restart_backoff_s", e))?;
    v::seconds(connect, true).map_err(|e| ("tunnel.connect_timeout_s", e))?;
    v::seconds(verify, false).map_err(|e| ("tunnel.verify_interval_s", e))?;
    v::whole_seconds(alive.into(), true).map_err(|e| ("tunnel.server_alive_interval_s", e))?;
    Ok(())
}

fn default_pinggy_port() -> u16 {
    443
}

fn default_restarts() -> u32 {
    3
}

fn default_backoff() -> f64 {
    2.0
}

fn default_lease_ttl() -> u64 {
    600
}

fn default_connect_timeout() -> f64 {
    30.0
}

fn default_verify_attempts() -> u32 {
    12
}

fn default_verify_interval() -> f64 {
    5.0
}

fn default_socks_verify_interval() -> f64 {
    2.0
}

fn default_alive_interval() -> u32 {
    30
}

fn default_alive_count() -> u32 {
    3
}

fn default_socks_ports() -> PortPolicy {
    PortPolicy { fixed: None, base: 40000, span: 10000 }
}

fn default_socks_verify() -> String {
    "https://huggingface.co/".to_string()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ProxyMode {
    #[default]
    Env,
    Proxychains,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HarborSpec {
    /// Executable: an absolute path, or a name resolved in `<env_prefix>/bin`, then PATH.
    pub program: String,
    #[serde(default)]
    pub env_prefix: Option<PathBuf>,
    /// Harbor job config YAML (`--config`).
    pub config: PathBuf,
    /// Task directory (`-p`).
    pub dataset: PathBuf,
    #[serde(default = "default_agent")]
    pub agent: String,
    pub n_concurrent: u32,
    pub n_attempts: u32,
    /// The multiplier Harbor runs under (`--timeout-multiplier`): what provenance records.
    pub timeout_multiplier: f64,
    /// Which rule of the timeout policy chose it (docs/design.md §4.3): `cli`, `harbor-config`,
    /// `registry`, `size` or `fallback`; absent in specs written before the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_source: Option<String>,
    /// Merged `key=value` agent kwargs (CLI > registry > preset), without api_base/model_info.
    #[serde(default)]
    pub agent_kwargs: Vec<String>,
    #[serde(default)]
    pub agent_parser: Option<String>,
    /// `--ae` agent environment variables; values are resolved on the node.
    #[serde(default)]
    pub agent_envs: Vec<AgentEnv>,
    /// For `model_info`; default 16384, clamped to max_model_len/2 when ≥ max_model_len.
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    #[serde(default = "default_filter_types")]
    pub resume_filter_error_types: Vec<String>,
    /// What payload does with a Harbor job it finds in the run dir (docs/decisions.md, "A
    /// re-evaluation is a new run"). Absent (older specs, hand-written ones): `resume_unfinished`.
    #[serde(default)]
    pub start: HarborStart,
    /// Further harbor arguments, one argv element each.
    #[serde(default)]
    pub extra_args: Vec<String>,
    /// Extra non-secret environment for Harbor.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// What the installed Harbor speaks (from the environment's declared Harbor version or
    /// flavour): the terminus-2 kwarg form, `--yes`, `--print-config`.
    #[serde(default)]
    pub dialect: crate::versions::HarborDialect,
}

/// Whether a run continues the Harbor job in its run dir or starts a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum HarborStart {
    /// Resume the job in the run dir when it is unfinished and ran under the same settings
    /// (timeout multiplier, attempts, agent); start fresh when the run dir holds none. A finished
    /// job or one under other settings is refused, never resumed: resuming would run nothing, or
    /// not what the spec says.
    #[default]
    ResumeUnfinished,
    /// A new Harbor job: the run dir must hold none (a re-evaluation gets a run dir of its own).
    Fresh,
}

impl HarborStart {
    pub fn as_str(self) -> &'static str {
        match self {
            HarborStart::ResumeUnfinished => "resume_unfinished",
            HarborStart::Fresh => "fresh",
        }
    }
}

/// The agent of a spec (and a ledger row) that names none.
pub const DEFAULT_AGENT: &str = "terminus-2";

fn default_agent() -> String {
    DEFAULT_AGENT.to_string()
}

fn default_filter_types() -> Vec<String> {
    INFRA_ERROR_TYPES.iter().map(|t| (*t).to_string()).collect()
}

/// One `--ae NAME=VALUE`: the value is a literal, or taken (on the node) from the secrets file or
/// payload's environment under the name `from`. Presets' `NAME` means `from: NAME`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentEnv {
    pub name: String,
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default)]
    pub value: Option<String>,
}

/// The Hugging Face token's name in the secrets file (and the variable vLLM and `hf` read).
pub const HF_TOKEN: &str = "HF_TOKEN";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretsSpec {
    /// The env file; when absent, `$DC_AGENT_SECRET_ENV`, else `~/secrets.env`.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// Require both Daytona keys and choose org 2 for 3 of 4 jobs.
    #[serde(default = "yes")]
    pub daytona: bool,
    /// Further secret names handed to Harbor's environment when present (e.g. `HF_TOKEN`).
    #[serde(default)]
    pub pass_to_harbor: Vec<String>,
    /// Secret names handed to vLLM's environment when present: `HF_TOKEN` where the job itself
    /// downloads the weights (gated models). Never argv.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pass_to_engine: Vec<String>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Grace between TERM and KILL at teardown; must fit inside Slurm's KillWait (30 s default).
    #[serde(default = "default_grace")]
    pub teardown_grace_s: f64,
    /// Lead of the `--signal=B:USR1@<lead>` walltime warning.
    #[serde(default = "default_walltime_lead")]
    pub walltime_lead_s: u64,
    #[serde(default = "default_heartbeat")]
    pub heartbeat_interval_s: f64,
    /// Health probe period during the run; `health_failures` consecutive failures = engine dead.
    #[serde(default = "default_probe_interval")]
    pub health_probe_interval_s: f64,
    #[serde(default = "default_health_failures")]
    pub health_failures: u32,
}

fn default_grace() -> f64 {
    20.0
}

/// The default `limits.walltime_lead_s` (and the profile's `limits.walltime_lead_s`).
pub const DEFAULT_WALLTIME_LEAD_S: u64 = 900;

fn default_walltime_lead() -> u64 {
    DEFAULT_WALLTIME_LEAD_S
}

fn default_heartbeat() -> f64 {
    15.0
}

fn default_probe_interval() -> f64 {
    10.0
}

fn default_health_failures() -> u32 {
    3
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            teardown_grace_s: default_grace(),
            walltime_lead_s: default_walltime_lead(),
            heartbeat_interval_s: default_heartbeat(),
            health_probe_interval_s: default_probe_interval(),
            health_failures: default_health_failures(),
        }
    }
}

/// Why a spec cannot be used, as one line naming the field and the fix.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{path}: cannot read launch spec: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}:{column}: invalid launch spec: {message}")]
    Parse { path: PathBuf, line: usize, column: usize, message: String },
    #[error(
        "{path}: launch spec version {found} is not supported (this payload reads version {SPEC_VERSION}); regenerate it with `submitter spec`"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("{path}: field `{field}` {problem}")]
    Field { path: PathBuf, field: &'static str, problem: String },
}

impl LaunchSpec {
    pub fn from_file(path: &Path) -> Result<Self, SpecError> {
        // A regular file of bounded size: a FIFO fails at once instead of hanging the reader.
        let text = crate::records::read_regular(path, crate::records::MAX_INPUT_BYTES)
            .map_err(|source| SpecError::Read { path: path.to_path_buf(), source })?;
        Self::from_json(&text, path)
    }

    pub fn from_json(text: &str, path: &Path) -> Result<Self, SpecError> {
        let spec: LaunchSpec = serde_json::from_str(text).map_err(|err| SpecError::Parse {
            path: path.to_path_buf(),
            line: err.line(),
            column: err.column(),
            message: err.to_string().split(" at line ").next().unwrap_or_default().to_string(),
        })?;
        spec.validate(path)?;
        Ok(spec)
    }

    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("launch spec serialises");
        text.push('\n');
        text
    }

    fn validate(&self, path: &Path) -> Result<(), SpecError> {
        if self.version != SPEC_VERSION {
            return Err(SpecError::Version { path: path.to_path_buf(), found: self.version });
        }
        self.problem().map_err(|(field, problem)| SpecError::Field { path: path.to_path_buf(), field, problem })
    }

    /// The first value payload could not run with, as (field, problem). `submitter spec` calls it
    /// on every spec it builds, so it never writes one payload refuses (crate::validate).
    pub fn problem(&self) -> Result<(), (&'static str, String)> {
        use crate::validate as v;
        let fail = |field: &'static str| move |problem: String| (field, problem);
        let run_tag_ok = !self.run_tag.is_empty()
            && self.run_tag != "."
            && self.run_tag != ".."
            && !self.run_tag.starts_with('-')
            && self.run_tag.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if !run_tag_ok {
            return Err(("run_tag", "must use only [A-Za-z0-9._-], not be `.`/`..` nor start with `-`".to_string()));
        }
        if self.serve.program.is_empty() {
            return Err(("serve.program", "is empty: name the vLLM executable".to_string()));
        }
        if self.harbor.program.is_empty() {
            return Err(("harbor.program", "is empty: name the harbor executable".to_string()));
        }
        v::gpus(self.serve.tensor_parallel_size, self.serve.pipeline_parallel_size, self.serve.data_parallel_size)
            .map_err(fail("serve.tensor_parallel_size"))?;
        v::nodes(self.serve.nodes).map_err(fail("serve.nodes"))?;
        self.layout().map_err(|e| ("serve.nodes", e.to_string()))?;
        if let Some(timeout) = self.serve.distributed_timeout_s {
            v::whole_seconds(timeout, true).map_err(fail("serve.distributed_timeout_s"))?;
        }
        v::count_up_to(self.harbor.n_concurrent.into(), v::MAX_CONCURRENT).map_err(fail("harbor.n_concurrent"))?;
        v::count_up_to(self.harbor.n_attempts.into(), v::MAX_CONCURRENT).map_err(fail("harbor.n_attempts"))?;
        v::argument(&self.harbor.agent).map_err(fail("harbor.agent"))?;
        for kwarg in &self.harbor.agent_kwargs {
            v::argument(kwarg).map_err(fail("harbor.agent_kwargs"))?;
        }
        if let Some(parser) = &self.harbor.agent_parser {
            v::argument(parser).map_err(fail("harbor.agent_parser"))?;
        }
        for env in &self.harbor.agent_envs {
            for text in [Some(&env.name), env.from.as_ref(), env.value.as_ref()].into_iter().flatten() {
                v::argument(text).map_err(fail("harbor.agent_envs"))?;
            }
        }
        v::multiplier(self.harbor.timeout_multiplier).map_err(fail("harbor.timeout_multiplier"))?;
        let name_ok = !self.model.served_name.is_empty()
            && !self.model.served_name.starts_with('-')
            && self.model.served_name.len() <= 64
            && self.model.served_name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if !name_ok {
            return Err((
                "model.served_name",
                "must match ^[A-Za-z0-9._-]{1,64}$ (Harbor's hosted_vllm rule) and not start with `-` (it would read as an option)".to_string(),
            ));
        }
        if let Some(util) = self.serve.gpu_memory_utilization {
            v::fraction(util).map_err(fail("serve.gpu_memory_utilization"))?;
        }
        if let Some(util) = self.serve.cluster_gpu_memory_utilization {
            v::fraction(util).map_err(fail("serve.cluster_gpu_memory_utilization"))?;
        }
        v::whole_seconds(self.serve.health_timeout_s, true).map_err(fail("serve.health_timeout_s"))?;
        v::listen_host(&self.serve.host).map_err(fail("serve.host"))?;
        v::environment(&self.serve.env).map_err(fail("serve.env"))?;
        v::environment(&self.harbor.env).map_err(fail("harbor.env"))?;
        for (field, kind, env) in [
            ("serve.env", crate::placeholder::Field::ServeEnv, &self.serve.env),
            ("harbor.env", crate::placeholder::Field::HarborEnv, &self.harbor.env),
        ] {
            for (name, value) in env {
                crate::placeholder::check(kind, value).map_err(|e| (field, format!("{name}: {e}")))?;
            }
        }
        v::whole_seconds(self.serve.hang_after_s, true).map_err(fail("serve.hang_after_s"))?;
        v::whole_seconds(self.serve.load_stall_after_s, true).map_err(fail("serve.load_stall_after_s"))?;
        if let Some(budget) = &self.serve.ready_budget {
            v::whole_seconds(budget.seconds, false).map_err(fail("serve.ready_budget.seconds"))?;
        }
        if let Some(fixed) = self.serve.port.fixed {
            v::port(fixed).map_err(fail("serve.port.fixed"))?;
        }
        v::port_range(self.serve.port.base, self.serve.port.span).map_err(fail("serve.port"))?;
        for (field, value) in [
            ("serve.max_model_len", self.serve.max_model_len),
            ("harbor.max_output_tokens", self.harbor.max_output_tokens),
        ] {
            if let Some(value) = value {
                v::count_up_to(value, v::MAX_TOKENS).map_err(fail(field))?;
            }
        }
        if let Some(seqs) = self.serve.max_num_seqs {
            v::count_up_to(seqs.into(), v::MAX_SEQS).map_err(fail("serve.max_num_seqs"))?;
        }
        if self.gpu_profiles.profiles.is_empty() {
            return Err(("gpu_profiles", "is empty: the spec must carry the GPU profiles".to_string()));
        }
        let limits = &self.limits;
        v::seconds(limits.teardown_grace_s, false).map_err(fail("limits.teardown_grace_s"))?;
        v::interval(limits.heartbeat_interval_s).map_err(fail("limits.heartbeat_interval_s"))?;
        v::interval(limits.health_probe_interval_s).map_err(fail("limits.health_probe_interval_s"))?;
        v::whole_seconds(limits.walltime_lead_s, false).map_err(fail("limits.walltime_lead_s"))?;
        v::at_least_one(limits.health_failures.into()).map_err(fail("limits.health_failures"))?;
        if let Some(post_run) = &self.post_run {
            post_run.problem()?;
        }
        self.tunnel.problem()
    }

    /// GPUs the engine needs on this node (on each of its nodes, for a multi-node engine).
    pub fn gpus_needed(&self) -> u32 {
        match self.layout() {
            Ok(layout) => layout.gpus_per_node,
            // Validated when read; an unvalidated spec that does not split asks for every GPU.
            Err(_) => self.parallelism().total(),
        }
    }

    /// TP, PP and DP as the spec sets them.
    pub fn parallelism(&self) -> crate::layout::Parallelism {
        crate::layout::Parallelism {
            tensor: self.serve.tensor_parallel_size,
            pipeline: self.serve.pipeline_parallel_size,
            data: self.serve.data_parallel_size,
        }
    }

    /// The engine's layout over `serve.nodes` nodes (docs/multinode.md).
    pub fn layout(&self) -> Result<crate::layout::Layout, crate::layout::LayoutError> {
        crate::layout::of(self.parallelism(), self.serve.nodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures follow from the sizes: an 8B (16 GiB of bf16 weights) and a 235B MoE (438 GiB)
    /// at 1000 MiB/s with 120 s compile and 60 s graph capture, under a 3000 s cap.
    #[test]
    fn ready_budget_follows_checkpoint_size_and_is_capped() {
        const GIB: u64 = 1 << 30;
        let small = ReadyBudget::compute(16 * GIB, 1000.0, 120, 60, 3000, "snapshot".into());
        assert_eq!((small.load_s, small.seconds), (17, 197));
        let big = ReadyBudget::compute(438 * GIB, 1000.0, 120, 60, 3000, "snapshot".into());
        assert_eq!((big.load_s, big.seconds), (449, 629));
        let capped = ReadyBudget::compute(438 * GIB, 100.0, 120, 60, 3000, "snapshot".into());
        assert_eq!((capped.load_s, capped.seconds), (4486, 3000));
        assert!(capped.describe().starts_with("3000 s (capped) = 438.0 GiB / 100 MiB/s"), "{}", capped.describe());
    }

    /// The deadline is the budget, never past the cap; without a budget the cap, saying why.
    #[test]
    fn the_readiness_line_names_the_deadline_and_its_basis() {
        const GIB: u64 = 1 << 30;
        let mut serve: ServeSpec =
            serde_json::from_str(r#"{"program": "vllm", "tensor_parallel_size": 1, "data_parallel_size": 1}"#).unwrap();
        serve.health_timeout_s = 3000;
        assert_eq!(serve.ready_deadline_s(), 3000);
        assert!(serve.readiness_line().starts_with("deadline 3000 s, serve.health_timeout_s: no budget"));
        serve.ready_budget = Some(ReadyBudget::compute(16 * GIB, 1000.0, 120, 60, 3000, "snapshot".into()));
        assert_eq!(serve.ready_deadline_s(), 197);
        let line = serve.readiness_line();
        assert!(line.starts_with("deadline 197 s = 16.0 GiB / 1000 MiB/s"), "{line}");
        assert!(line.ends_with("300 s without vllm.log progress is engine_start/stalled"), "{line}");
        serve.health_timeout_s = 100;
        assert_eq!(serve.ready_deadline_s(), 100, "an edited cap below the budget wins");
        assert!(serve.readiness_line().starts_with("deadline 100 s, the cap"), "{}", serve.readiness_line());
    }

    #[test]
    fn tunnel_json_is_tagged_and_strict() {
        let none: TunnelSpec = serde_json::from_str(r#"{"kind": "none"}"#).unwrap();
        assert_eq!(none, TunnelSpec::None);
        let p: TunnelSpec = serde_json::from_str(
            r#"{"kind": "pinggy", "host": "pro.pinggy.io", "public_url": "https://a.a.pinggy.link", "token_secret": "PINGGY_TOKEN",
                "bank": [{"public_url": "https://b.a.pinggy.link", "token_secret": "PINGGY_TOKEN_2"}]}"#,
        )
        .unwrap();
        let TunnelSpec::Pinggy(ref spec) = p else { panic!("{p:?}") };
        assert_eq!(spec.port, 443);
        assert_eq!(spec.max_restarts, 3);
        assert_eq!(spec.pairs().len(), 2);
        assert!(p.problem().is_ok());
        let text = serde_json::to_string(&p).unwrap();
        assert!(text.starts_with(r#"{"kind":"pinggy""#), "{text}");
        assert_eq!(serde_json::from_str::<TunnelSpec>(&text).unwrap(), p);
        let unknown = serde_json::from_str::<TunnelSpec>(
            r#"{"kind": "pinggy", "host": "h", "public_url": "https://a", "token_secret": "T", "token": "oops"}"#,
        );
        assert!(unknown.unwrap_err().to_string().contains("unknown field `token`"));
        let s: TunnelSpec =
            serde_json::from_str(r#"{"kind": "socks", "login_node": "login05", "mode": "proxychains"}"#).unwrap();
        let TunnelSpec::Socks(ref socks) = s else { panic!() };
        assert_eq!(socks.mode, ProxyMode::Proxychains);
        assert_eq!(socks.port.base, 40000);
        assert!(s.problem().is_ok());
    }

    #[test]
    fn tunnel_problems_name_the_field() {
        let mut p: PinggySpec =
            serde_json::from_str(r#"{"host": "pro.pinggy.io", "public_url": "https://a", "token_secret": "T"}"#)
                .unwrap();
        p.token_secret = "tok en".into();
        assert_eq!(TunnelSpec::Pinggy(p.clone()).problem().unwrap_err().0, "tunnel.token_secret");
        p.token_secret = "T".into();
        p.bank.push(PinggyPair { public_url: "https://a/".into(), token_secret: "U".into(), host: None });
        assert_eq!(TunnelSpec::Pinggy(p.clone()).problem().unwrap_err().0, "tunnel.bank");
        p.bank.clear();
        let s: SocksSpec = serde_json::from_str(r#"{"login_node": "login 05"}"#).unwrap();
        // The egress proxy beside a Pinggy tunnel is checked like a SOCKS tunnel, named as its part.
        p.egress = Some(Box::new(s.clone()));
        let (field, problem) = TunnelSpec::Pinggy(p.clone()).problem().unwrap_err();
        assert_eq!((field, problem.starts_with("login_node: ")), ("tunnel.egress", true), "{problem}");
        p.egress = None;
        for bad in ["ftp://x", "https://", "https://a b", "not a url"] {
            p.public_url = bad.into();
            assert_eq!(TunnelSpec::Pinggy(p.clone()).problem().unwrap_err().0, "tunnel.public_url", "{bad}");
        }
        assert_eq!(TunnelSpec::Socks(s).problem().unwrap_err().0, "tunnel.login_node");
    }

    fn minimal() -> serde_json::Value {
        serde_json::json!({
            "version": SPEC_VERSION, "run_tag": "tb2__Qwen__Qwen3-8B", "run_dir": "/j/tb2__Qwen__Qwen3-8B",
            "jobs_dir": "/j", "cluster": "local", "benchmark": "tb2",
            "model": {"hf_id": "Qwen/Qwen3-8B", "served_name": "Qwen3-8B"},
            "serve": {"program": "vllm", "tensor_parallel_size": 1, "data_parallel_size": 1},
            "gpu_profiles": {"profiles": [{"name": "any", "gpu_memory_utilization": 0.9}]},
            "harbor": {"program": "harbor", "config": "/c.yaml", "dataset": "/d", "n_concurrent": 1,
                       "n_attempts": 1, "timeout_multiplier": 1.0},
            "secrets": {}, "limits": {}
        })
    }

    /// Every value that would panic or misbehave in payload after spawning is refused when the spec
    /// is read, naming the field (the values of issue 11's reproductions).
    #[test]
    fn out_of_range_values_are_refused_by_field() {
        let read = |spec: &serde_json::Value| LaunchSpec::from_json(&spec.to_string(), Path::new("launch.json"));
        assert!(read(&minimal()).is_ok(), "{:?}", read(&minimal()).err());
        let cases: &[(&str, serde_json::Value, &str)] = &[
            ("/limits/health_probe_interval_s", 1e20.into(), "limits.health_probe_interval_s"),
            ("/limits/teardown_grace_s", 1e20.into(), "limits.teardown_grace_s"),
            ("/limits/heartbeat_interval_s", 1e-12.into(), "limits.heartbeat_interval_s"),
            ("/limits/walltime_lead_s", u64::MAX.into(), "limits.walltime_lead_s"),
            ("/serve/health_timeout_s", u64::MAX.into(), "serve.health_timeout_s"),
            ("/serve/hang_after_s", u64::MAX.into(), "serve.hang_after_s"),
            ("/serve/hang_after_s", 0.into(), "serve.hang_after_s"),
            ("/serve/gpu_memory_utilization", 5.0.into(), "serve.gpu_memory_utilization"),
            ("/serve/cluster_gpu_memory_utilization", (-1.0).into(), "serve.cluster_gpu_memory_utilization"),
            ("/serve/tensor_parallel_size", 65536.into(), "serve.tensor_parallel_size"),
            ("/harbor/n_concurrent", 0.into(), "harbor.n_concurrent"),
            ("/harbor/n_attempts", 0.into(), "harbor.n_attempts"),
            ("/harbor/timeout_multiplier", (-1.0).into(), "harbor.timeout_multiplier"),
            ("/serve/port", serde_json::json!({"fixed": 0}), "serve.port.fixed"),
            ("/serve/port", serde_json::json!({"base": 60000, "span": 20000}), "serve.port"),
            ("/run_tag", "..".into(), "run_tag"),
            // Issue 21 item 9: nothing that reads as an option, no environment exec cannot pass.
            ("/model/served_name", "--help".into(), "model.served_name"),
            ("/serve/host", "-h".into(), "serve.host"),
            ("/serve/host", "".into(), "serve.host"),
            ("/serve/env", serde_json::json!({"A": "x\u{0}y"}), "serve.env"),
            ("/serve/env", serde_json::json!({"": "x"}), "serve.env"),
            ("/serve/env", serde_json::json!({"A=B": "x"}), "serve.env"),
            ("/harbor/env", serde_json::json!({"A=B": "x"}), "harbor.env"),
            // Issue 21 item 12: an interval no periodic action can keep.
            ("/limits/heartbeat_interval_s", 1e-12.into(), "limits.heartbeat_interval_s"),
            ("/limits/health_probe_interval_s", 0.001.into(), "limits.health_probe_interval_s"),
            // Issue 32 item 16: absurd sizes and an argument no exec can pass.
            ("/serve/max_model_len", 1_000_000_000_000u64.into(), "serve.max_model_len"),
            ("/harbor/max_output_tokens", 1_000_000_000_000u64.into(), "harbor.max_output_tokens"),
            ("/serve/max_num_seqs", 1_000_000_000u64.into(), "serve.max_num_seqs"),
            ("/harbor/n_concurrent", 1_000_000_000u64.into(), "harbor.n_concurrent"),
            ("/harbor/n_attempts", 1_000_000_000u64.into(), "harbor.n_attempts"),
            ("/harbor/agent_kwargs", serde_json::json!(["temperature=0", "x=a\u{0}b"]), "harbor.agent_kwargs"),
            ("/harbor/agent_parser", "a\u{0}b".into(), "harbor.agent_parser"),
        ];
        for (pointer, value, field) in cases {
            let mut spec = minimal();
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            let target = if parent.is_empty() { &mut spec } else { spec.pointer_mut(parent).unwrap() };
            target[key] = value.clone();
            if *pointer == "/serve/tensor_parallel_size" {
                spec["serve"]["data_parallel_size"] = 65536.into();
            }
            let err = read(&spec).expect_err(pointer).to_string();
            assert!(err.starts_with(&format!("launch.json: field `{field}`")), "{pointer}: {err}");
        }
        // A bad model id is refused as the spec is parsed (it is a `ModelId`): the one line names
        // the field, and the line and column too.
        for bad in ["--chat-template=/etc/passwd", "../../etc/passwd", "org/--help", ""] {
            let mut spec = minimal();
            spec["model"]["hf_id"] = bad.into();
            let err = read(&spec).expect_err(bad).to_string();
            assert!(
                err.starts_with("launch.json:1:") && err.contains(": field `model.hf_id` model id"),
                "{bad}: {err}"
            );
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        let mut tunnel = minimal();
        tunnel["tunnel"] = serde_json::json!({"kind": "socks", "login_node": "l", "restart_backoff_s": 1e20});
        assert!(read(&tunnel).unwrap_err().to_string().contains("tunnel.restart_backoff_s"));
    }

    #[test]
    fn post_run_is_optional_validated_and_its_placeholders_resolve() {
        let read = |spec: &serde_json::Value| LaunchSpec::from_json(&spec.to_string(), Path::new("launch.json"));
        let old = read(&minimal()).unwrap();
        assert_eq!(old.post_run, None);
        assert!(!old.to_json().contains("post_run"), "none is left out, so older payloads still read it");
        let mut spec = minimal();
        spec["post_run"] = serde_json::json!({"argv": ["upload", "--dir={run_dir}", "{run_tag}", "{ other }", "{{run_tag}}"],
                                              "timeout_s": 60, "secrets": ["HF_TOKEN"]});
        let step = read(&spec).unwrap().post_run.unwrap();
        assert_eq!(
            step.resolved_argv(Path::new("/j/x"), "x"),
            ["upload", "--dir=/j/x", "x", "{ other }", "{{run_tag}}"].map(String::from).to_vec(),
            "literal braces (spaced, doubled) pass as written"
        );
        let cases: &[(serde_json::Value, &str)] = &[
            (serde_json::json!({"argv": [], "timeout_s": 60}), "post_run.argv"),
            (serde_json::json!({"argv": [""], "timeout_s": 60}), "post_run.argv"),
            (serde_json::json!({"argv": ["up", "a\u{0}b"], "timeout_s": 60}), "post_run.argv"),
            (serde_json::json!({"argv": ["up"], "timeout_s": 0}), "post_run.timeout_s"),
            (serde_json::json!({"argv": ["up"], "timeout_s": u64::MAX}), "post_run.timeout_s"),
            (serde_json::json!({"argv": ["up"], "timeout_s": 5, "secrets": ["hf_abc123 token"]}), "post_run.secrets"),
            // Accepted (and passed to the program unreplaced) before the placeholder rule.
            (serde_json::json!({"argv": ["up", "--dir={run_dri}"], "timeout_s": 5}), "post_run.argv"),
            (serde_json::json!({"argv": ["up", "{job_scratch}"], "timeout_s": 5}), "post_run.argv"),
        ];
        for (value, field) in cases {
            let mut spec = minimal();
            spec["post_run"] = value.clone();
            let err = read(&spec).expect_err(field).to_string();
            assert!(err.starts_with(&format!("launch.json: field `{field}`")) && err.lines().count() == 1, "{err}");
        }
        let mut unknown = minimal();
        unknown["post_run"] = serde_json::json!({"argv": ["up"], "timeout_s": 5, "shell": "up && rm"});
        assert!(read(&unknown).unwrap_err().to_string().contains("unknown field `shell`"));
    }

    #[test]
    fn env_values_take_only_the_scratch_placeholder() {
        let read = |spec: &serde_json::Value| LaunchSpec::from_json(&spec.to_string(), Path::new("launch.json"));
        let mut spec = minimal();
        spec["serve"]["env"] = serde_json::json!({"TMPDIR": "{job_scratch}/tmp", "J": "{\"a\": 1}"});
        spec["harbor"]["env"] = serde_json::json!({"TMPDIR": "{job_scratch}/h"});
        read(&spec).unwrap();
        for (section, value) in [("serve", "{job_scrach}/tmp"), ("harbor", "{run_dir}")] {
            let mut bad = spec.clone();
            bad[section]["env"]["TMPDIR"] = value.into();
            let err = read(&bad).unwrap_err().to_string();
            assert!(err.starts_with(&format!("launch.json: field `{section}.env`")) && err.contains("TMPDIR"), "{err}");
            assert!(err.contains("{job_scratch}") && err.lines().count() == 1, "{err}");
        }
    }

    #[test]
    fn installed_agents() {
        for local in ["terminus-2", "terminus", "terminus-kira", "oracle", "nop", "mini-swe-agent", "swe-agent"] {
            assert!(!is_installed_agent(local), "{local}");
        }
        for installed in ["openhands", "opencode", "claude-code", "codex"] {
            assert!(is_installed_agent(installed), "{installed}");
        }
    }
}
