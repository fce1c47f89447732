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

/// The infra error types Harbor re-runs on resume (`--filter-error-type`), SPEC §6.4.
pub const INFRA_ERROR_TYPES: &[&str] = &[
    "DaytonaError",
    "DaytonaAuthenticationError",
    "DaytonaAuthorizationError",
    "DaytonaNotFoundError",
    "DaytonaRateLimitError",
    "EnvironmentStartTimeoutError",
    "CancelledError",
    "SandboxBuildFailedError",
    "AgentEnvironmentTimeoutError",
    "VerificationNotCompletedError",
    "TrialNotScoredError",
    "AddTestsDirError",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSpec {
    pub version: u32,
    /// Deterministic from (benchmark, model): resubmitting a pair resumes the same Harbor job dir.
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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Hugging Face id, e.g. `Qwen/Qwen3-8B`.
    pub hf_id: String,
    /// Name vLLM serves under and Harbor calls (`hosted_vllm/<served_name>`), ≤ 64 chars.
    pub served_name: String,
    /// Pre-downloaded weights; served instead of the HF id when set.
    #[serde(default)]
    pub local_path: Option<PathBuf>,
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
    #[serde(default)]
    pub max_model_len: Option<u64>,
    #[serde(default)]
    pub max_num_seqs: Option<u32>,
    #[serde(default)]
    pub swap_space: Option<u32>,
    /// Whether the installed vLLM still has `--swap-space` (a profile capability, not a `--help` probe).
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
    /// shell-style (never run through a shell).
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

fn default_host() -> String {
    "127.0.0.1".to_string()
}

fn default_health_timeout() -> u64 {
    3600
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

/// How Harbor's agent reaches the model and how the node reaches the internet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum TunnelSpec {
    /// terminus-2 and other local agents call vLLM on the node.
    #[default]
    None,
    /// Reverse tunnel for installed-harness agents that run inside the remote sandbox.
    Pinggy {
        host: String,
        #[serde(default = "default_pinggy_port")]
        port: u16,
        /// The persistent public URL, e.g. `https://abc.a.pinggy.link`.
        public_url: String,
        /// Name of the secret (in the secrets file) holding the token; never the token.
        token_secret: String,
        #[serde(default = "default_restarts")]
        max_restarts: u32,
    },
    /// SOCKS egress proxy for compute nodes without internet.
    Socks {
        login_node: String,
        #[serde(default)]
        user: Option<String>,
        #[serde(default)]
        identity_file: Option<PathBuf>,
        #[serde(default)]
        ssh_port: Option<u16>,
        /// How Harbor uses it: proxy environment variables or a proxychains config.
        #[serde(default)]
        mode: ProxyMode,
        #[serde(default)]
        proxychains_bin: Option<String>,
        #[serde(default = "default_restarts")]
        max_restarts: u32,
    },
}

fn default_pinggy_port() -> u16 {
    443
}

fn default_restarts() -> u32 {
    3
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
    pub timeout_multiplier: f64,
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
    /// Further harbor arguments, one argv element each.
    #[serde(default)]
    pub extra_args: Vec<String>,
    /// Extra non-secret environment for Harbor.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

fn default_agent() -> String {
    "terminus-2".to_string()
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

fn default_walltime_lead() -> u64 {
    900
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
    #[error("{path}: launch spec version {found} is not supported (this payload reads version {SPEC_VERSION}); regenerate it with `submitter spec`")]
    Version { path: PathBuf, found: u32 },
    #[error("{path}: field `{field}` {problem}")]
    Field { path: PathBuf, field: &'static str, problem: String },
}

impl LaunchSpec {
    pub fn from_file(path: &Path) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path)
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
        let field = |field: &'static str, problem: &str| SpecError::Field {
            path: path.to_path_buf(),
            field,
            problem: problem.to_string(),
        };
        if self.version != SPEC_VERSION {
            return Err(SpecError::Version { path: path.to_path_buf(), found: self.version });
        }
        if self.run_tag.is_empty()
            || !self.run_tag.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(field("run_tag", "must be non-empty and use only [A-Za-z0-9._-]"));
        }
        if self.serve.program.is_empty() {
            return Err(field("serve.program", "is empty: name the vLLM executable"));
        }
        if self.harbor.program.is_empty() {
            return Err(field("harbor.program", "is empty: name the harbor executable"));
        }
        if self.serve.tensor_parallel_size == 0 || self.serve.data_parallel_size == 0 {
            return Err(field("serve.tensor_parallel_size", "and data_parallel_size must be ≥ 1"));
        }
        if self.harbor.n_concurrent == 0 || self.harbor.n_attempts == 0 {
            return Err(field("harbor.n_concurrent", "and n_attempts must be ≥ 1"));
        }
        let name_ok = !self.model.served_name.is_empty()
            && self.model.served_name.len() <= 64
            && self.model.served_name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if !name_ok {
            return Err(field("model.served_name", "must match ^[A-Za-z0-9._-]{1,64}$ (Harbor's hosted_vllm rule)"));
        }
        if let Some(util) = self.serve.gpu_memory_utilization
            && !(util > 0.0 && util <= 1.0)
        {
            return Err(field("serve.gpu_memory_utilization", "must be in (0, 1]"));
        }
        if self.gpu_profiles.profiles.is_empty() {
            return Err(field("gpu_profiles", "is empty: the spec must carry the GPU profiles"));
        }
        if self.limits.teardown_grace_s < 0.0 || self.limits.heartbeat_interval_s <= 0.0 {
            return Err(field("limits", "teardown_grace_s must be ≥ 0 and heartbeat_interval_s > 0"));
        }
        Ok(())
    }

    /// GPUs the engine needs on this node.
    pub fn gpus_needed(&self) -> u32 {
        self.serve.tensor_parallel_size * self.serve.data_parallel_size
    }
}
