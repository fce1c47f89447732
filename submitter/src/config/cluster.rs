//! Cluster profiles, `clusters/<name>.yaml` (docs/design.md §3.1): everything that differs per cluster.

use std::collections::BTreeMap;
use std::path::PathBuf;

use launch_spec::versions::{HarborDialect, Version};
use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterProfile {
    pub name: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Login-node hostname patterns (`*` any run of characters, e.g. `login*.leonardo.cineca.it`):
    /// a command without `--cluster` or `$SUBMITTER_CLUSTER` on a matching host uses this profile.
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub description: Option<String>,
    pub slurm: SlurmSettings,
    pub hardware: Hardware,
    /// Named Python environments (the old `conda_envs`): payload runs `<prefix>/bin/…` with
    /// PATH/LD_LIBRARY_PATH set, never `conda activate`. Each declares the vLLM and Harbor it has.
    #[serde(default)]
    pub environments: BTreeMap<String, Environment>,
    pub engine: EngineSettings,
    pub harbor: HarborSettings,
    pub paths: Paths,
    #[serde(default)]
    pub network: Network,
    #[serde(default)]
    pub secrets: Secrets,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub pre_download: PreDownload,
    /// The ledger: a PostgreSQL URL shared by several clusters, or a SQLite path; default
    /// `<paths.state_dir>/ledger.sqlite`. Never put a password here: use `--ledger` or
    /// `$SUBMITTER_LEDGER` (or a `.pgpass`).
    #[serde(default)]
    pub ledger: Option<String>,
    /// Launch verification: thresholds of `check`/`status` and the watch loop's cancel policy
    /// (docs/verification.md). Every key is optional.
    #[serde(default)]
    pub verify: VerifySettings,
    /// An optional step payload runs after Harbor finished (e.g. a trace upload); docs/payload.md.
    #[serde(default)]
    pub post_run: Option<PostRun>,
    /// The Slurm-native listener job (`submitter listener start`): where its 1-CPU tick runs.
    /// Absent: `listener start` refuses and says what to add.
    #[serde(default)]
    pub listener: Option<ListenerSettings>,
    /// Notifications from the launch loop (webhook and/or command); docs/submitter.md.
    #[serde(default)]
    pub notify: Option<NotifySettings>,
    /// The team's database (OT-Agent schema): named here, every `plan`/`launch` iteration folds
    /// its new rows into the ledger before deciding, and `launch`/`sync` mirror into it
    /// (docs/ledger.md, "Team history by default").
    #[serde(default)]
    pub team: Option<TeamSettings>,
    /// What the loop does about a diagnosis (docs/verification.md "Remediation"); off by default.
    #[serde(default)]
    pub remediation: super::remediation::RemediationSettings,
    /// The default for multi-leg launches when neither `--allocation` nor the leg's preset says
    /// (`per-leg` when absent); docs/submitter.md, "Shared allocation".
    #[serde(default)]
    pub allocation: Option<super::Allocation>,
}

/// `listener:` — the listener job's own placement: a small CPU partition (never the GPU one), with
/// internet when the cluster stages weights from the login side (`pre_download`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSettings {
    pub partition: String,
    #[serde(default)]
    pub account: Option<String>,
    #[serde(default)]
    pub qos: Option<String>,
    #[serde(default)]
    pub reservation: Option<String>,
    /// Each tick's time limit (`HH:MM:SS`); one iteration, staging included, must fit.
    #[serde(default = "default_listener_time")]
    pub time: String,
    #[serde(default = "default_listener_mem")]
    pub mem_mb: u64,
    /// Whether the listener's nodes reach the internet (default: `network.internet`). Each tick
    /// stages there (models with `pre_download.enabled`, missing datasets always), so
    /// `listener start` and every tick refuse a listener without it.
    #[serde(default)]
    pub internet: Option<bool>,
    /// Further variables the tick needs from the starting shell (besides those the profile's
    /// `${VAR}` references name, which are always passed). Never secrets.
    #[serde(default)]
    pub export_env: Vec<String>,
}

fn default_listener_time() -> String {
    "00:30:00".to_string()
}

fn default_listener_mem() -> u64 {
    1000
}

/// `post_run:` — one program and its arguments (never a shell string). `${VAR}` in any element is
/// expanded when the spec is built, like profile paths; `{run_dir}` and `{run_tag}` are replaced by
/// payload on the node.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostRun {
    pub argv: Vec<String>,
    #[serde(default = "default_post_run_timeout")]
    pub timeout_s: u64,
    /// Key of `environments` whose prefix goes on the step's PATH (default: none).
    #[serde(default)]
    pub environment: Option<String>,
    /// Extra non-secret environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of secrets from the secrets file handed to the step (e.g. `HF_TOKEN`).
    #[serde(default)]
    pub secrets: Vec<String>,
}

fn default_post_run_timeout() -> u64 {
    600
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmSettings {
    pub partition: String,
    #[serde(default)]
    pub account: Option<String>,
    #[serde(default)]
    pub qos: Option<String>,
    #[serde(default)]
    pub reservation: Option<String>,
    /// Default `--time` (`HH:MM:SS` or `D-HH:MM:SS`); a preset's `slurm_time` wins.
    pub time: String,
    /// `false` where GPUs are not gres-tracked (Vista): request `--nodes` instead of `--gres`.
    #[serde(default = "yes")]
    pub(crate) gpu_gres: bool,
    /// Further sbatch arguments, one argv element each.
    #[serde(default)]
    pub extra_args: Vec<String>,
    /// Slurm's KillWait on this cluster (seconds between TERM and KILL); payload's grace fits inside.
    #[serde(default = "default_kill_wait")]
    pub kill_wait_s: u64,
    /// How long one Slurm command (`sbatch`, `squeue`, …) may run before it is killed: they retry
    /// for minutes against a busy or absent slurmctld.
    #[serde(default = "default_command_timeout")]
    pub command_timeout_s: u64,
    /// The batch script (relative paths are from the repository root).
    #[serde(default = "default_script")]
    pub script: PathBuf,
    /// Optional prelude sourced by the script, for `module load` lines only.
    #[serde(default)]
    pub prelude: Option<PathBuf>,
    /// The payload binary the job execs, built for `hardware.arch` (docs/install.md); `~` and
    /// `${VAR}` expanded. Absent: `payload` beside the submitter. `$PAYLOAD_BIN` overrides it.
    #[serde(default)]
    pub payload_bin: Option<PathBuf>,
    /// Names of the submitter's environment variables passed to the job (`sbatch --export`), besides
    /// payload's own. Never secrets: payload reads those from the secrets file on the node.
    #[serde(default)]
    pub export_env: Vec<String>,
    /// Most nodes one job may span (docs/multinode.md); 1 = single-node only. An engine larger than
    /// a node is planned over up to this many nodes instead of refused.
    #[serde(default = "one_node")]
    pub max_nodes: u32,
    /// Nodes the jobs must not run on (`--exclude`); `--exclude ''` on the command line clears it.
    #[serde(default)]
    pub exclude: Option<String>,
    /// The partition's walltime limit as the site publishes it (`HH:MM:SS` or `D-HH:MM:SS`), for
    /// when Slurm does not say (`scontrol show partition` answers `MaxTime=UNLIMITED`, or `plan`
    /// runs away from the site): every `--time` is capped at the smaller of the two (issue 31).
    #[serde(default)]
    pub max_time: Option<String>,
}

/// Whether `name` may be in `export_env`: a shell identifier (what `sbatch --export` takes) that is
/// not shaped like a secret — the job gets its secrets from the secrets file on the node, and an
/// exported value lands in Slurm's job record, readable with `scontrol show job`.
fn exportable(name: &str) -> Result<(), String> {
    if !launch_spec::expand::is_var_name(name) {
        return Err(format!("`{name}` is not an environment variable name"));
    }
    if secret_shaped_name(name) {
        return Err(format!(
            "`{name}` looks like a secret: it would be visible in Slurm's job record; put it in the secrets file \
             (secrets.file) instead, which payload reads on the node"
        ));
    }
    Ok(())
}

/// Whether a variable's name says it holds a secret (`HF_TOKEN`, `DAYTONA_API_KEY`, `DB_PASSWORD`…):
/// by its `_`-separated words, so `TOKENIZERS_PARALLELISM` is not one.
fn secret_shaped_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    let words: Vec<&str> = upper.split('_').collect();
    words
        .iter()
        .any(|w| ["TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY", "PAT"].contains(w))
        || words.last() == Some(&"KEY")
}

/// Prefixes of the credentials the team's tools issue (Hugging Face, OpenAI/Anthropic, GitHub,
/// Slack, AWS, Daytona, Pinggy): a value starting with one, then 16 or more token characters, is a
/// credential whatever its variable is called.
const CREDENTIAL_PREFIXES: [&str; 9] = ["hf_", "sk-", "ghp_", "github_pat_", "xoxb-", "xoxp-", "AKIA", "dtn_", "pk_"];

/// Why `NAME: value` in a profile's `env` is a credential the profile must not hold, if it is one:
/// a secret-shaped name with any value (even a `${VAR}`, expanded into the world-readable
/// launch.json), or a value shaped like an issued token (issue 31).
fn credential_in_env(name: &str, value: &str) -> Option<String> {
    let token_chars =
        |rest: &str| rest.len() >= 16 && rest.chars().all(|c| c.is_ascii_alphanumeric() || "-_".contains(c));
    let issued = CREDENTIAL_PREFIXES.iter().any(|p| value.strip_prefix(p).is_some_and(token_chars));
    (!value.is_empty() && (secret_shaped_name(name) || issued)).then(|| {
        "looks like a credential: it would be written into the world-readable launch.json; put `NAME=value` in the \
         secrets file (secrets.file) and list NAME in secrets.pass_to_harbor"
            .to_string()
    })
}

fn default_command_timeout() -> u64 {
    60
}

fn one_node() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// One environment: its prefix and the program versions installed there (docs/real-programs.md,
/// "Declared versions"). YAML: `name: PREFIX` (versions undeclared: the verified ones are assumed)
/// or `name: {path: PREFIX, vllm: "0.33.0", harbor: "0.25.0"}`; `harbor` may name a flavour
/// (`extra-body-fork`) instead of a release.
#[derive(Debug, Clone, PartialEq)]
pub struct Environment {
    pub path: PathBuf,
    pub vllm: Option<Version>,
    pub harbor: Option<String>,
    /// Non-secret variables for whatever runs from this environment (vLLM when it serves, Harbor
    /// when it is `harbor.environment`), `${VAR}`-expanded at submit time; the cluster's
    /// `engine.env`/`harbor.env` are below them.
    pub env: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeclaredEnvironment {
    path: PathBuf,
    #[serde(default)]
    vllm: Option<Version>,
    #[serde(default)]
    harbor: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
}

impl<'de> Deserialize<'de> for Environment {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Environment;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a prefix path or {path: PREFIX, vllm: \"X.Y.Z\", harbor: \"X.Y.Z\" or a flavour, env: {NAME: VALUE}}")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Environment, E> {
                Ok(Environment { path: PathBuf::from(v), vllm: None, harbor: None, env: BTreeMap::new() })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Environment, A::Error> {
                let e = DeclaredEnvironment::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                if let Some(harbor) = &e.harbor {
                    HarborDialect::from_declared(harbor).map_err(serde::de::Error::custom)?;
                }
                Ok(Environment { path: e.path, vllm: e.vllm, harbor: e.harbor, env: e.env })
            }
        }
        d.deserialize_any(Visit)
    }
}

impl Environment {
    /// The declared vLLM, else the verified one.
    pub fn vllm(&self) -> Version {
        self.vllm.unwrap_or(launch_spec::versions::VERIFIED_VLLM)
    }

    /// The declared Harbor (a release or a flavour), else the verified release.
    pub(crate) fn harbor_declared(&self) -> String {
        self.harbor.clone().unwrap_or_else(|| launch_spec::versions::VERIFIED_HARBOR.to_string())
    }

    /// What the declared Harbor speaks (the verified release when undeclared).
    pub(crate) fn harbor_dialect(&self) -> HarborDialect {
        self.harbor.as_deref().and_then(|h| HarborDialect::from_declared(h).ok()).map(|(d, _)| d).unwrap_or_default()
    }
}

/// `engine.supports_swap_space` was a guess per cluster; the capability now follows from each
/// environment's declared vLLM. Refused with the replacement, so no command reads it differently.
fn retired_supports_swap_space<'de, D: serde::Deserializer<'de>>(_: D) -> Result<(), D::Error> {
    Err(serde::de::Error::custom(format!(
        "engine.supports_swap_space is replaced by each environment's declared vLLM version: remove it and write `environments: {{NAME: {{path: PREFIX, vllm: \"X.Y.Z\"}}}}` (vLLM before {} has --swap-space)",
        launch_spec::versions::VLLM_SWAP_SPACE_REMOVED
    )))
}

fn default_kill_wait() -> u64 {
    30
}

fn default_script() -> PathBuf {
    PathBuf::from("sbatch/payload.sbatch")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    X86_64,
    Aarch64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hardware {
    pub gpus_per_node: u32,
    pub cpus_per_node: u32,
    pub mem_per_node_mb: u64,
    pub arch: Arch,
    /// Registry variant name used on this cluster: `default`, `gh200`, `gh200-65k`, ….
    #[serde(default = "default_profile")]
    pub hardware_profile: String,
    /// Cluster override of the GPU profile's gpu-memory ceiling (below an operator override).
    #[serde(default)]
    pub gpu_memory_utilization: Option<f64>,
    #[serde(default)]
    pub(crate) cuda_home: Option<PathBuf>,
    /// The nodes' GPU as NVML names it (`NVIDIA A100-SXM-64GB`) and its memory in GiB: what
    /// `registry check` matches the GPU profiles with and weighs a model's weights against.
    #[serde(default)]
    pub gpu_name: Option<String>,
    #[serde(default)]
    pub gpu_memory_gib: Option<f64>,
}

fn default_profile() -> String {
    crate::registry::DEFAULT_PROFILE.to_string()
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSettings {
    /// vLLM executable name or path, resolved in the environment's `bin/` then PATH.
    #[serde(default = "default_vllm")]
    pub program: String,
    /// Environment (key of `environments`) used when the registry names none.
    pub default_environment: String,
    /// Retired: refused with the replacement (`retired_supports_swap_space`).
    #[serde(default, deserialize_with = "retired_supports_swap_space")]
    pub supports_swap_space: (),
    #[serde(default = "default_health_timeout")]
    pub health_timeout_s: u64,
    /// While Harbor runs: requests in flight and no token for this long ends the run as
    /// `engine_hung` (the spec's `serve.hang_after_s`; docs/payload.md "Liveness").
    #[serde(default = "default_hang_after")]
    pub hang_after_s: u64,
    /// While loading: no new `vllm.log` bytes for this long is `engine_start/stalled` (the spec's
    /// `serve.load_stall_after_s`; docs/payload.md "Readiness budget").
    #[serde(default = "default_load_stall_after")]
    pub load_stall_after_s: u64,
    /// The readiness budget (the spec's `serve.ready_budget`; docs/site.md "Readiness budget"):
    /// the rate vLLM reads a checkpoint from the file system the weights live on, MiB/s.
    #[serde(default = "default_load_bandwidth")]
    pub load_bandwidth_mib_s: f64,
    /// torch.compile, memory profiling and warm-up of a dense model (per-job compile caches start
    /// cold).
    #[serde(default = "default_compile_allowance")]
    pub compile_allowance_s: u64,
    /// The same for a mixture-of-experts model (`…-A22B`, Mixtral, …): its expert kernels are
    /// tuned and built on top.
    #[serde(default = "default_moe_compile_allowance")]
    pub(crate) moe_compile_allowance_s: u64,
    /// CUDA-graph capture; none with `--enforce-eager`.
    #[serde(default = "default_graph_capture_allowance")]
    pub(crate) graph_capture_allowance_s: u64,
    /// vLLM's `--distributed-timeout-seconds` for a multi-node engine; default `health_timeout_s`
    /// (weights may load slowly on some nodes, docs/multinode.md).
    #[serde(default)]
    pub distributed_timeout_s: Option<u64>,
    /// Extra non-secret environment for vLLM on this cluster, `${VAR}`-expanded at submit time;
    /// `{job_scratch}` in a value is payload's per-job directory on node-local disk.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `TORCHDYNAMO_DISABLE=1` for single-DP engines and `0` with DP > 1 (the old scripts' rule).
    #[serde(default)]
    pub torchdynamo_disable_by_dp: bool,
}

fn default_hang_after() -> u64 {
    launch_spec::spec::DEFAULT_HANG_AFTER_S
}

fn default_load_stall_after() -> u64 {
    launch_spec::spec::DEFAULT_LOAD_STALL_AFTER_S
}

/// 1000 MiB/s: plain safetensors loading off a shared file system reads 1–4 GB/s in published
/// figures (Qwen3-30B-A3B at ≈ 1.1 GB/s on one H200, vLLM's InstantTensor page); the low end.
fn default_load_bandwidth() -> f64 {
    1000.0
}

/// Cold torch.compile + profiling + warm-up: ≈ 15 s dynamo + 70 s compile + KV profiling for a
/// 70B (vLLM issue 19824), up to 210 s of profiling and warm-up for a 35B MoE (issue 44881).
fn default_compile_allowance() -> u64 {
    300
}

fn default_moe_compile_allowance() -> u64 {
    600
}

/// ≈ 60 s of CUDA-graph capture for a 70B at TP 8 (vLLM issue 19824), doubled.
fn default_graph_capture_allowance() -> u64 {
    120
}

fn default_vllm() -> String {
    "vllm".to_string()
}

fn default_health_timeout() -> u64 {
    launch_spec::spec::DEFAULT_HEALTH_TIMEOUT_S
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HarborSettings {
    #[serde(default = "default_harbor")]
    pub program: String,
    /// Environment (key of `environments`) Harbor runs from.
    pub environment: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

fn default_harbor() -> String {
    "harbor".to_string()
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Paths {
    pub jobs_dir: PathBuf,
    pub logs_dir: PathBuf,
    #[serde(default)]
    pub hf_cache: Option<PathBuf>,
    /// Where datasets (task dirs) live: `<dir>/<org>_<name>` or `<dir>/<name>`.
    #[serde(default)]
    pub datasets_dirs: Vec<PathBuf>,
    /// Ledger, locks and listener state.
    pub state_dir: PathBuf,
    /// Node-local disk for the per-job scratch directory (`{job_scratch}` in env values): payload
    /// creates `<node_scratch>/eval_<job id>` and removes it at the end. Default `/tmp`.
    #[serde(default)]
    pub node_scratch: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    #[serde(default)]
    pub internet: bool,
    /// SOCKS egress through a login node, for nodes without internet.
    #[serde(default)]
    pub proxy: Option<Proxy>,
    /// Pinggy pairs for installed-harness agents, URLs written here (a bank of the operator's own).
    #[serde(default)]
    pub pinggy: Vec<PinggyPair>,
    /// The team's Pinggy bank by pair number: the pairs themselves are in the secrets file, never
    /// here (issue 31, docs/tunnels.md "The team's bank").
    #[serde(default)]
    pub(crate) pinggy_bank: Option<PinggyBank>,
}

/// Which of the team's numbered Pinggy pairs this cluster's jobs use. Pair `N` is the secrets
/// file's `PINGGY_URL_<N>` (its persistent public URL) and `PINGGY_TOKEN_<N>` (its token).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PinggyBank {
    /// The pairs a job takes (the first free, by lease; failover moves only among these).
    pub defaults: Vec<u32>,
    /// Pairs that belong to sibling experiments: used only when asked (`--pinggy-pair N`).
    #[serde(default)]
    pub(crate) borrow_only: Vec<u32>,
    #[serde(default = "default_pinggy_host")]
    pub host: String,
}

impl PinggyBank {
    /// The secrets-file names of pair `n`: its public URL and its token.
    pub(crate) fn secret_names(n: u32) -> (String, String) {
        (format!("PINGGY_URL_{n}"), format!("PINGGY_TOKEN_{n}"))
    }

    /// The pairs a job gets: `asked` alone (a default or a borrow-only pair), else the defaults.
    pub(crate) fn pairs_for(&self, asked: Option<u32>) -> Result<Vec<u32>, String> {
        match asked {
            Some(n) if self.defaults.contains(&n) || self.borrow_only.contains(&n) => Ok(vec![n]),
            Some(n) => Err(format!(
                "--pinggy-pair {n} is not in this cluster's bank (network.pinggy_bank: defaults {}; borrow-only {})",
                numbers(&self.defaults),
                numbers(&self.borrow_only)
            )),
            None => Ok(self.defaults.clone()),
        }
    }

    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.defaults.is_empty() {
            problems.push("defaults is empty: name the pairs jobs take (e.g. [8, 9, 10])".into());
        }
        if let Some(n) = self.defaults.iter().find(|n| self.borrow_only.contains(n)) {
            problems.push(format!("pair {n} is both a default and borrow-only"));
        }
        problems
    }
}

/// `8, 9, 10` (or `none`).
pub(crate) fn numbers(pairs: &[u32]) -> String {
    if pairs.is_empty() { "none".into() } else { pairs.iter().map(u32::to_string).collect::<Vec<_>>().join(", ") }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Proxy {
    pub login_node: String,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub identity_file: Option<PathBuf>,
    #[serde(default)]
    pub ssh_port: Option<u16>,
    /// `env` (proxy variables) or `proxychains` (generated config).
    #[serde(default = "default_proxy_mode")]
    pub mode: String,
    #[serde(default)]
    pub proxychains_bin: Option<String>,
    /// A known_hosts file pinning the login node's host key (default: accept-new in a per-job file).
    #[serde(default)]
    pub known_hosts: Option<PathBuf>,
    /// The login node takes `identity_file` only with its OpenSSH certificate
    /// (`<identity_file>-cert.pub`, step-ca on Leonardo): preflight checks it is there and valid.
    #[serde(default)]
    pub certificate: bool,
}

fn default_proxy_mode() -> String {
    "env".to_string()
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinggyPair {
    pub url: String,
    /// Name of the secret holding the token; never the token itself.
    pub token_secret: String,
    #[serde(default = "default_pinggy_host")]
    pub host: String,
    /// A known_hosts file pinning Pinggy's host key (applies to the whole bank; first pair's wins).
    #[serde(default)]
    pub known_hosts: Option<PathBuf>,
}

fn default_pinggy_host() -> String {
    "pro.pinggy.io".to_string()
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Secrets {
    /// The secrets env file; default `$DC_AGENT_SECRET_ENV`, else `~/secrets.env` (resolved on the node).
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// Secret names handed to Harbor besides the Daytona key (e.g. `HF_TOKEN`).
    #[serde(default)]
    pub pass_to_harbor: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default = "default_max_in_flight")]
    pub max_jobs_in_flight: u32,
    #[serde(default = "default_delay")]
    pub submission_delay_s: f64,
    #[serde(default = "default_n_concurrent")]
    pub n_concurrent: u32,
    /// Upper bound on Harbor's concurrency on this cluster (Vista: 8).
    #[serde(default)]
    pub n_concurrent_ceiling: Option<u32>,
    /// Lead of the walltime warning signal (`--signal=B:USR1@<lead>`).
    #[serde(default = "default_walltime_lead")]
    pub walltime_lead_s: u64,
    /// Attempts per (model, benchmark family) before `too many failures`.
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Pending longer than this with the job still queued → cancel and resubmit.
    #[serde(default = "default_stale_pending_h")]
    pub stale_pending_hours: f64,
    /// How many times an attempt that ended by the walltime is continued (resubmitted with the same
    /// run dir, so Harbor resumes) before the pair is left for the operator. Continuations do not
    /// count toward `max_attempts`.
    #[serde(default = "default_max_continuations")]
    pub max_continuations: u32,
}

fn default_max_in_flight() -> u32 {
    20
}
fn default_delay() -> f64 {
    1.0
}
fn default_n_concurrent() -> u32 {
    32
}
fn default_walltime_lead() -> u64 {
    launch_spec::spec::DEFAULT_WALLTIME_LEAD_S
}
fn default_max_attempts() -> u32 {
    3
}
fn default_stale_pending_h() -> f64 {
    // The team's value (issue 20): a job still PENDING after 6 h is cancelled and resubmitted.
    6.0
}
fn default_max_continuations() -> u32 {
    5
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_jobs_in_flight: default_max_in_flight(),
            submission_delay_s: default_delay(),
            n_concurrent: default_n_concurrent(),
            n_concurrent_ceiling: None,
            walltime_lead_s: default_walltime_lead(),
            max_attempts: default_max_attempts(),
            stale_pending_hours: default_stale_pending_h(),
            max_continuations: default_max_continuations(),
        }
    }
}

// The rules' thresholds live beside the findings they judge (docs/design.md §8.3).
pub use crate::verify::findings::VerifySettings;

/// Staging on the login node (docs/site.md): models into `paths.hf_cache`, datasets into their
/// dataset dir. Every command is an argv (never a shell string), `${VAR}`-expanded, run with a
/// timeout and its progress on the submitter's stderr.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreDownload {
    /// Stage models before submitting (clusters whose compute nodes have no internet).
    #[serde(default)]
    pub enabled: bool,
    /// Model command; `{model}` and `{cache}` are substituted per element.
    #[serde(default = "default_model_command")]
    pub command: Vec<String>,
    #[serde(default = "default_pre_download_timeout")]
    pub timeout_s: u64,
    /// Dataset command, run (under a lock) when a preset's dataset dir does not exist yet;
    /// `{dataset}` (the repo id) and `{dir}` (a scratch dir renamed into place on success).
    #[serde(default = "default_dataset_command")]
    pub dataset_command: Vec<String>,
    #[serde(default = "default_dataset_timeout")]
    pub(crate) dataset_timeout_s: u64,
}

impl Default for PreDownload {
    fn default() -> Self {
        Self {
            enabled: false,
            command: default_model_command(),
            timeout_s: default_pre_download_timeout(),
            dataset_command: default_dataset_command(),
            dataset_timeout_s: default_dataset_timeout(),
        }
    }
}

fn default_model_command() -> Vec<String> {
    ["hf", "download", "{model}", "--cache-dir", "{cache}"].map(String::from).to_vec()
}

fn default_dataset_command() -> Vec<String> {
    ["hf", "download", "{dataset}", "--repo-type", "dataset", "--local-dir", "{dir}"].map(String::from).to_vec()
}

fn default_pre_download_timeout() -> u64 {
    600
}

fn default_dataset_timeout() -> u64 {
    1800
}

impl ClusterProfile {
    /// Problems within the profile itself (cross-file checks live in `registry check`). Loading a
    /// cluster for `spec`, `plan` or `launch` refuses a profile with any (config::load_cluster).
    pub fn problems(&self) -> Vec<String> {
        use launch_spec::validate as v;
        let mut problems = Vec::new();
        if self.hardware.gpus_per_node == 0 {
            problems.push("hardware.gpus_per_node must be ≥ 1".to_string());
        }
        if let Err(problem) = v::nodes(self.slurm.max_nodes) {
            problems.push(format!("slurm.max_nodes {problem}"));
        }
        if let Some(gib) = self.hardware.gpu_memory_gib
            && !(gib.is_finite() && gib > 0.0 && gib <= 4096.0)
        {
            problems.push(format!("hardware.gpu_memory_gib {gib} must be a GiB figure > 0, e.g. 64"));
        }
        for (field, env) in [
            ("engine.default_environment", &self.engine.default_environment),
            ("harbor.environment", &self.harbor.environment),
        ] {
            if !self.environments.contains_key(env) {
                problems.push(format!(
                    "{field} `{env}` is not in `environments` (known: {})",
                    self.environments.keys().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        if let Some(util) = self.hardware.gpu_memory_utilization
            && let Err(problem) = v::fraction(util)
        {
            problems.push(format!("hardware.gpu_memory_utilization {problem}"));
        }
        if self.limits.walltime_lead_s < 60 {
            problems
                .push("limits.walltime_lead_s should be ≥ 60: Slurm may deliver the signal up to 60 s early".into());
        }
        let limits = &self.limits;
        let mut staging = Vec::new();
        let mut check = |field: &str, result: Result<(), String>| {
            if let Err(problem) = result {
                problems.push(format!("{field} {problem}"));
            }
        };
        check("engine.health_timeout_s", v::whole_seconds(self.engine.health_timeout_s, true).map(drop));
        check("engine.load_stall_after_s", v::whole_seconds(self.engine.load_stall_after_s, true).map(drop));
        check("engine.hang_after_s", v::whole_seconds(self.engine.hang_after_s, true).map(drop));
        let bandwidth = self.engine.load_bandwidth_mib_s;
        if !(bandwidth.is_finite() && bandwidth > 0.0 && bandwidth <= 10_000_000.0) {
            check(
                "engine.load_bandwidth_mib_s",
                Err(format!("{bandwidth} must be a read rate in MiB/s > 0, e.g. 1000 (≈ 1 GB/s)")),
            );
        }
        for (field, value) in [
            ("engine.compile_allowance_s", self.engine.compile_allowance_s),
            ("engine.moe_compile_allowance_s", self.engine.moe_compile_allowance_s),
            ("engine.graph_capture_allowance_s", self.engine.graph_capture_allowance_s),
        ] {
            check(field, v::whole_seconds(value, false).map(drop));
        }
        if let Some(timeout) = self.engine.distributed_timeout_s {
            check("engine.distributed_timeout_s", v::whole_seconds(timeout, true).map(drop));
        }
        check("slurm.kill_wait_s", v::whole_seconds(self.slurm.kill_wait_s, false).map(drop));
        check("slurm.command_timeout_s", v::at_least_one(self.slurm.command_timeout_s).map(drop));
        let listener_export = self.listener.iter().flat_map(|l| l.export_env.iter());
        for (field, name) in self
            .slurm
            .export_env
            .iter()
            .map(|n| ("slurm.export_env", n))
            .chain(listener_export.map(|n| ("listener.export_env", n)))
        {
            check(field, exportable(name));
        }
        check("limits.walltime_lead_s", v::whole_seconds(limits.walltime_lead_s, false).map(drop));
        check("limits.submission_delay_s", v::seconds(limits.submission_delay_s, false).map(drop));
        check("limits.stale_pending_hours", v::seconds(limits.stale_pending_hours * 3600.0, true).map(drop));
        check("limits.n_concurrent", v::count_up_to(limits.n_concurrent.into(), v::MAX_CONCURRENT).map(drop));
        check("limits.max_jobs_in_flight", v::at_least_one(limits.max_jobs_in_flight.into()).map(drop));
        check("limits.max_attempts", v::at_least_one(limits.max_attempts.into()).map(drop));
        if let Some(listener) = &self.listener {
            check("listener.mem_mb", v::at_least_one(listener.mem_mb).map(drop));
            if super::parse_slurm_time(&listener.time).is_none() {
                check("listener.time", Err(format!("`{}` is not a Slurm time (HH:MM:SS)", listener.time)));
            }
        }
        if let Some(ceiling) = limits.n_concurrent_ceiling {
            check("limits.n_concurrent_ceiling", v::count_up_to(ceiling.into(), v::MAX_CONCURRENT).map(drop));
        }
        if self.pre_download.enabled {
            check("pre_download.timeout_s", v::whole_seconds(self.pre_download.timeout_s, true).map(drop));
            if self.pre_download.command.first().is_none_or(String::is_empty) {
                staging.push("pre_download.command is empty: name the download program (e.g. [hf, download, \"{model}\", --cache-dir, \"{cache}\"])".into());
            }
            if self.paths.hf_cache.is_none() {
                staging.push(
                    "pre_download.enabled needs paths.hf_cache (where the weights go and the job finds them)".into(),
                );
            }
        }
        check("pre_download.dataset_timeout_s", v::whole_seconds(self.pre_download.dataset_timeout_s, true).map(drop));
        // The placeholder rule (launch_spec::placeholder), here so the profile is refused at load
        // rather than the spec (or the node) later; an environment's env joins the engine's or Harbor's,
        // which take the same placeholders.
        {
            use launch_spec::placeholder::{self as ph, Field};
            let envs = self.environments.iter().map(|(name, e)| (format!("environments.{name}.env"), &e.env));
            for (field, env) in
                [("engine.env".to_string(), &self.engine.env), ("harbor.env".to_string(), &self.harbor.env)]
                    .into_iter()
                    .chain(envs)
            {
                for (var, value) in env {
                    if let Err(problem) = ph::check(Field::ServeEnv, value) {
                        check(&format!("{field}.{var}"), Err(problem.to_string()));
                    }
                    if let Some(problem) = credential_in_env(var, value) {
                        check(&format!("{field}.{var}"), Err(problem));
                    }
                }
            }
            for (field, kind, argv) in [
                ("pre_download.command", Field::ModelDownload, &self.pre_download.command),
                ("pre_download.dataset_command", Field::DatasetDownload, &self.pre_download.dataset_command),
            ] {
                if let Err((i, problem)) = ph::check_all(kind, argv) {
                    check(&format!("{field}[{i}]"), Err(problem.to_string()));
                }
            }
        }

        if let Some(bank) = &self.network.pinggy_bank {
            for problem in bank.problems() {
                check("network.pinggy_bank", Err(problem));
            }
            if !self.network.pinggy.is_empty() {
                check("network.pinggy_bank", Err("and network.pinggy together: keep one bank".into()));
            }
        }
        if let Some(port) = self.network.proxy.as_ref().and_then(|p| p.ssh_port) {
            check("network.proxy.ssh_port", v::port(port).map(drop));
        }
        if super::parse_slurm_time(&self.slurm.time).is_none() {
            problems.push(format!("slurm.time `{}` is not a Slurm time (HH:MM:SS or D-HH:MM:SS)", self.slurm.time));
        }
        if let Some(max) = self.slurm.max_time.as_deref().filter(|t| super::parse_slurm_time(t).is_none()) {
            problems.push(format!("slurm.max_time `{max}` is not a Slurm time (HH:MM:SS or D-HH:MM:SS)"));
        }
        problems.extend(staging);
        problems.extend(self.verify.problems());
        for (name, env) in &self.environments {
            for var in
                self.engine.env.keys().filter(|v| launch_spec::versions::vllm_retired_env(env.vllm()).any(|r| r == *v))
            {
                problems.push(format!(
                    "engine.env {var} is unknown to vLLM {} (environment `{name}`): remove it",
                    env.vllm()
                ));
            }
        }
        problems.extend(self.remediation.problems());
        if let Some(notify) = &self.notify {
            problems.extend(notify.problems());
        }
        if let Some(team) = &self.team {
            problems.extend(team.problems());
        }
        if let Some(post_run) = &self.post_run {
            problems.extend(self.post_run_problems(post_run));
        }
        if let Some(proxy) = &self.network.proxy
            && !["env", "proxychains"].contains(&proxy.mode.as_str())
        {
            problems.push(format!("network.proxy.mode `{}` must be `env` or `proxychains`", proxy.mode));
        }
        problems
    }
}

/// The names of the `${NAME}` references in `text` (a leading `~/` needs `HOME`), by the rules of
/// `launch_spec::expand` (as far as the text expands).
fn variables_in(text: &str) -> Vec<String> {
    let names = std::cell::RefCell::new(Vec::new());
    let _ = launch_spec::expand::expand_path(text, &|name| {
        names.borrow_mut().push(name.to_string());
        Some(String::new())
    });
    names.into_inner()
}

impl ClusterProfile {
    /// The environment variables the profile's `${VAR}` references name (paths, environments, the
    /// secrets file, the post-run step, the proxy's files), sorted: what any process that expands
    /// this profile — the listener job included — needs set. `SUBMITTER_HOME` is left out (it
    /// defaults to the configuration root).
    pub(crate) fn referenced_variables(&self) -> Vec<String> {
        let mut texts: Vec<String> = Vec::new();
        let mut path = |p: &std::path::Path| texts.push(p.to_string_lossy().into_owned());
        let paths = &self.paths;
        for p in [&paths.jobs_dir, &paths.logs_dir, &paths.state_dir].into_iter().chain(&paths.datasets_dirs) {
            path(p);
        }
        let binaries = self.slurm.payload_bin.iter();
        for p in paths.hf_cache.iter().chain(&self.secrets.file).chain(&self.hardware.cuda_home).chain(binaries) {
            path(p);
        }
        for env in self.environments.values() {
            path(&env.path);
        }
        if let Some(proxy) = &self.network.proxy {
            for p in proxy.identity_file.iter().chain(&proxy.known_hosts) {
                path(p);
            }
        }
        for pair in &self.network.pinggy {
            if let Some(p) = &pair.known_hosts {
                path(p);
            }
        }
        if let Some(step) = &self.post_run {
            texts.extend(step.argv.iter().cloned());
        }
        let mut names: Vec<String> =
            texts.iter().flat_map(|t| variables_in(t)).filter(|name| name != "SUBMITTER_HOME").collect();
        names.sort();
        names.dedup();
        names
    }

    /// The post-run step's problems: the launch spec's own checks (so what the profile accepts the
    /// spec reader accepts) plus the environment name.
    fn post_run_problems(&self, post_run: &PostRun) -> Vec<String> {
        let mut problems = Vec::new();
        let as_spec = launch_spec::spec::PostRunSpec {
            argv: post_run.argv.clone(),
            timeout_s: post_run.timeout_s,
            env_prefix: None,
            env: post_run.env.clone(),
            secrets: post_run.secrets.clone(),
        };
        if let Err((field, problem)) = as_spec.problem() {
            problems.push(format!("{field} {problem}"));
        }
        if let Some(env) = &post_run.environment
            && !self.environments.contains_key(env)
        {
            problems.push(format!(
                "post_run.environment `{env}` is not in `environments` (known: {})",
                self.environments.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        problems
    }
}

/// `notify:` — notifications from the launch loop (`crate::notify`, docs/submitter.md).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifySettings {
    /// The name of the secrets-file key holding the incoming-webhook URL (Slack/Mattermost
    /// `{"text": …}`); never the URL itself.
    #[serde(default)]
    pub webhook_secret: Option<String>,
    /// A program run per message, as an argv (never a shell string); the JSON body on its stdin.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Each delivery's bound (webhook and command alike).
    #[serde(default = "default_timeout_s")]
    pub timeout_s: u64,
    /// More events than this in one iteration are sent as one digest (counts and the first lines).
    #[serde(default = "default_digest_after")]
    pub digest_after: usize,
}

fn default_timeout_s() -> u64 {
    5
}
fn default_digest_after() -> usize {
    5
}

impl NotifySettings {
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.webhook_secret.is_none() && self.command.is_none() {
            problems.push("notify: say webhook_secret: NAME (a key of the secrets file) and/or command: [argv]".into());
        }
        if let Some(name) = self.webhook_secret.as_ref().filter(|n| !launch_spec::expand::is_var_name(n)) {
            problems.push(format!(
                "notify.webhook_secret `{name}` is not a variable name ([A-Za-z_][A-Za-z0-9_]*): name the secrets-file key, never the URL"
            ));
        }
        if self.command.as_ref().is_some_and(|argv| argv.first().is_none_or(|p| p.is_empty())) {
            problems
                .push("notify.command must name a program first, e.g. [\"/usr/bin/logger\", \"-t\", \"eval\"]".into());
        }
        if !(1..=120).contains(&self.timeout_s) {
            problems.push(format!("notify.timeout_s {} must be 1..=120 seconds", self.timeout_s));
        }
        if self.digest_after == 0 {
            problems.push("notify.digest_after must be ≥ 1".into());
        }
        problems
    }
}

/// `team:` — the team's database, consulted by every `plan`/`launch` iteration (module `team`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamSettings {
    /// The name of the secrets-file key holding the team database URL (with its password);
    /// never the URL itself. `$SUBMITTER_TEAM_DB` of the shell wins over it.
    pub database_secret: String,
    /// Publish this submitter's attempts into the team's `sandbox_jobs` (`--mirror`) by default.
    #[serde(default = "yes")]
    pub mirror: bool,
    /// The bound of each statement on the team database (the connect timeout is the URL's
    /// `connect_timeout`, else 10 s).
    #[serde(default = "default_team_timeout_s")]
    pub timeout_s: u64,
    /// A team row still Pending this long after submission is dead (default 6 h; issue 31).
    #[serde(default = "default_team_stale_pending_hours")]
    pub stale_pending_hours: f64,
    /// A team row still Started this long after its start is dead (default 24 h).
    #[serde(default = "default_team_stale_started_hours")]
    pub(crate) stale_started_hours: f64,
    /// How long one mirror write waits for a lock on the team's `sandbox_jobs` (`lock_timeout`);
    /// `timeout_s` when that is shorter.
    #[serde(default = "default_team_lock_timeout_s")]
    pub lock_timeout_s: u64,
}

/// `team.lock_timeout_s` by default: how long a mirror write waits for a lock on `sandbox_jobs`.
pub(crate) const DEFAULT_TEAM_LOCK_TIMEOUT_S: u64 = 5;

fn default_team_lock_timeout_s() -> u64 {
    DEFAULT_TEAM_LOCK_TIMEOUT_S
}

/// `team.timeout_s` by default: the bound of each call on the team database (docs/ledger.md
/// "Bounds").
pub(crate) const DEFAULT_TEAM_TIMEOUT_S: u64 = 30;

fn default_team_timeout_s() -> u64 {
    DEFAULT_TEAM_TIMEOUT_S
}
fn default_team_stale_pending_hours() -> f64 {
    crate::domain::Staleness::DEFAULT_PENDING_HOURS
}
fn default_team_stale_started_hours() -> f64 {
    crate::domain::Staleness::DEFAULT_STARTED_HOURS
}

impl TeamSettings {
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !launch_spec::expand::is_var_name(&self.database_secret) {
            problems.push(format!(
                "team.database_secret `{}` is not a variable name ([A-Za-z_][A-Za-z0-9_]*): name the secrets-file key, never the URL",
                crate::ledger::redact_url(&self.database_secret)
            ));
        }
        if !(1..=600).contains(&self.timeout_s) {
            problems.push(format!("team.timeout_s {} must be 1..=600 seconds", self.timeout_s));
        }
        for (field, hours) in [
            ("team.stale_pending_hours", self.stale_pending_hours),
            ("team.stale_started_hours", self.stale_started_hours),
        ] {
            if !(hours.is_finite() && hours > 0.0) {
                problems.push(format!("{field} {hours} must be a positive number of hours"));
            }
        }
        if !(1..=600).contains(&self.lock_timeout_s) {
            problems.push(format!("team.lock_timeout_s {} must be 1..=600 seconds", self.lock_timeout_s));
        }
        problems
    }

    /// When the team's Pending and Started rows count as dead (`team::import::Staleness`).
    pub(crate) fn staleness(&self) -> crate::domain::Staleness {
        crate::domain::Staleness::from_hours(self.stale_pending_hours, self.stale_started_hours)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use launch_spec::versions::{HarborDialect, VERIFIED_VLLM};
    use std::path::Path;

    const LOCAL: &str = include_str!("../../../clusters/local.yaml");

    fn parse(text: &str) -> Result<ClusterProfile, launch_spec::yaml::YamlError> {
        launch_spec::yaml::from_yaml_str(text, std::path::Path::new("clusters/x.yaml"))
    }

    #[test]
    fn team_names_a_secrets_key_never_a_url_and_the_real_profiles_name_one() {
        let team = parse(&format!("{LOCAL}team: {{database_secret: TEAM_DB}}\n")).unwrap().team.unwrap();
        assert_eq!((team.database_secret.as_str(), team.mirror, team.timeout_s), ("TEAM_DB", true, 30));
        assert!(team.problems().is_empty());
        // A URL pasted where the secrets file's key belongs: refused, and never echoed. The password
        // is made up per run (no credential-shaped literal in the tree).
        let password = format!("p{}", std::process::id());
        let url = format!(
            "{LOCAL}team: {{database_secret: \"postgresql://u.p:{password}@h:6543/postgres\", timeout_s: 0}}\n"
        );
        let problems = parse(&url).unwrap().team.unwrap().problems();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("not a variable name") && !problems[0].contains(&password), "{problems:?}");
        assert!(problems[1].contains("team.timeout_s 0"), "{problems:?}");
        for real in [include_str!("../../../clusters/leonardo.yaml"), include_str!("../../../clusters/vista.yaml")] {
            assert_eq!(parse(real).unwrap().team.map(|t| t.database_secret), Some("SUBMITTER_TEAM_DB".to_string()));
        }
    }

    #[test]
    fn stale_pending_is_six_hours_unless_the_profile_says_otherwise() {
        assert!(!LOCAL.contains("stale_pending_hours"));
        assert_eq!(parse(LOCAL).unwrap().limits.stale_pending_hours, 6.0, "the team's bound (issue 20)");
    }

    #[test]
    fn environments_declare_versions_or_take_the_verified_ones() {
        let profile = parse(LOCAL).unwrap();
        let env = &profile.environments["otagent"];
        assert_eq!(env.vllm, Some(VERIFIED_VLLM));
        assert_eq!(env.harbor_dialect(), HarborDialect::Harbor025);
        let old_form = LOCAL.replace(
            "  otagent:\n    path: ${SUBMITTER_HOME}/.local-env\n    vllm: \"0.33.0\"\n    harbor: \"0.25.0\"\n",
            "  otagent: /envs/otagent\n",
        );
        let profile = parse(&old_form).unwrap();
        let env = &profile.environments["otagent"];
        assert_eq!((env.path.as_path(), env.vllm, env.vllm()), (Path::new("/envs/otagent"), None, VERIFIED_VLLM));
        let fork = LOCAL.replacen("harbor: \"0.25.0\"", "harbor: extra-body-fork", 1).replacen(
            "vllm: \"0.33.0\"",
            "vllm: \"0.10.1.post1\"",
            1,
        );
        let profile = parse(&fork).unwrap();
        let env = &profile.environments["otagent"];
        assert_eq!(env.harbor_dialect(), HarborDialect::ExtraBodyFork);
        assert!(launch_spec::versions::vllm_has_swap_space(env.vllm()));
    }

    #[test]
    fn bad_declarations_and_the_retired_key_are_refused_with_the_fix() {
        let err = parse(&LOCAL.replacen("harbor: \"0.25.0\"", "harbor: \"0.9.0\"", 1)).unwrap_err().to_string();
        assert!(err.contains("clusters/x.yaml:") && err.contains("older than 0.25.0"), "{err}");
        let err = parse(&LOCAL.replacen("vllm: \"0.33.0\"", "vllm: latest", 1)).unwrap_err().to_string();
        assert!(err.contains("`latest` is not a version"), "{err}");
        let err = parse(&LOCAL.replace("engine:\n", "engine:\n  supports_swap_space: true\n")).unwrap_err().to_string();
        assert!(err.contains("engine.supports_swap_space is replaced") && err.contains("vllm:"), "{err}");
    }

    #[test]
    fn post_run_is_validated_at_load() {
        let with = |block: &str| format!("{LOCAL}post_run:\n{block}");
        let ok = parse(&with("  argv: [\"${SUBMITTER_HOME}/bin/upload\", \"{run_dir}\"]\n  environment: otagent\n  secrets: [HF_TOKEN]\n")).unwrap();
        assert!(ok.problems().is_empty(), "{:?}", ok.problems());
        let step = ok.post_run.unwrap();
        assert_eq!((step.timeout_s, step.environment.as_deref()), (600, Some("otagent")));
        for (block, want) in [
            ("  argv: []\n", "post_run.argv is empty"),
            ("  argv: [\"\"]\n", "post_run.argv has an empty program"),
            ("  argv: [up]\n  timeout_s: 0\n", "post_run.timeout_s 0 must be between 1"),
            ("  argv: [up]\n  timeout_s: 99999999999\n", "post_run.timeout_s"),
            ("  argv: [up]\n  environment: nope\n", "post_run.environment `nope` is not in `environments`"),
            ("  argv: [up]\n  secrets: [\"hf_x y\"]\n", "post_run.secrets"),
            // Accepted and handed to the program as written before the placeholder rule.
            ("  argv: [up, \"--dir={run_dri}\"]\n", "post_run.argv element 1: `{run_dri}` is not a placeholder"),
        ] {
            let problems = parse(&with(block)).unwrap().problems();
            assert!(problems.iter().any(|p| p.starts_with(want) && p.lines().count() == 1), "{block}: {problems:?}");
        }
        let err = parse(&with("  argv: up && rm -rf /\n")).unwrap_err().to_string();
        assert!(err.contains("clusters/x.yaml:") && err.contains("`argv`"), "{err}");
        let err = parse(&with("  command: up\n")).unwrap_err().to_string();
        assert!(err.contains("unknown field `command`"), "{err}");
    }

    /// The placeholder rule (launch_spec::placeholder) at profile load, in every field that takes
    /// placeholders; the shipped profiles use theirs where they belong.
    #[test]
    fn placeholders_outside_their_fields_are_refused_at_load() {
        for (from, to, want) in [
            ("engine:\n", "engine:\n  env:\n    TMPDIR: \"{job_scrach}/tmp\"\n", "engine.env.TMPDIR `{job_scrach}`"),
            (
                "  env:\n    STANDIN_EXTRAS",
                "  env:\n    TMPDIR: \"{run_dir}\"\n    STANDIN_EXTRAS",
                "harbor.env.TMPDIR `{run_dir}` is not replaced",
            ),
            ("", "pre_download:\n  command: [hf, download, \"{modle}\"]\n", "pre_download.command[2] `{modle}`"),
            ("", "pre_download:\n  dataset_command: [hf, \"{model}\"]\n", "pre_download.dataset_command[1] `{model}`"),
        ] {
            let text = if from.is_empty() { format!("{LOCAL}{to}") } else { LOCAL.replacen(from, to, 1) };
            let problems = parse(&text).unwrap().problems();
            assert!(problems.iter().any(|p| p.starts_with(want) && p.lines().count() == 1), "{want}: {problems:?}");
        }
        let literal = LOCAL.replacen("engine:\n", "engine:\n  env:\n    J: \"{{ jinja }} { x } ${HOME}\"\n", 1);
        assert!(parse(&literal).unwrap().problems().is_empty());
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clusters");
        for name in ["jupiter", "leonardo", "vista", "local"] {
            crate::config::load_cluster(&dir, name).unwrap();
        }
    }

    /// Issue 31: a credential in a profile's `env` is refused at load (so `registry check` reports
    /// it and no spec holds it), by its name or by its value's shape; the message never echoes it.
    #[test]
    fn a_credential_in_a_profiles_env_is_refused() {
        let token = "hf_AbCdEfGhIjKlMnOpQrStUv";
        for (var, value) in [("HF_TOKEN", token), ("HARMLESS_NAME", token), ("DAYTONA_API_KEY", "${DAYTONA_API_KEY}")] {
            let text = LOCAL.replacen("engine:\n", &format!("engine:\n  env:\n    {var}: \"{value}\"\n"), 1);
            let problems = parse(&text).unwrap().problems();
            let found = problems.iter().find(|p| p.starts_with(&format!("engine.env.{var}"))).cloned();
            let found = found.unwrap_or_else(|| panic!("{var}: {problems:?}"));
            assert!(found.contains("looks like a credential") && found.contains("secrets file"), "{found}");
            assert!(!found.contains(token), "{found}");
        }
        for (var, value) in [("TOKENIZERS_PARALLELISM", "false"), ("HF_HUB_OFFLINE", "1"), ("NETRC", "/dev/null")] {
            let text = LOCAL.replacen("engine:\n", &format!("engine:\n  env:\n    {var}: \"{value}\"\n"), 1);
            assert!(parse(&text).unwrap().problems().is_empty(), "{var}");
        }
    }

    #[test]
    fn referenced_variables_are_what_the_paths_use() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clusters");
        let jupiter = crate::config::load_cluster(&dir, "jupiter").unwrap();
        assert_eq!(jupiter.referenced_variables(), ["PROJECT", "SCRATCH"]);
        let leonardo = crate::config::load_cluster(&dir, "leonardo").unwrap();
        assert_eq!(leonardo.referenced_variables(), ["HOME", "WORK"], "~/.ssh/step_ca_key needs HOME");
        assert!(crate::config::load_cluster(&dir, "local").unwrap().referenced_variables().is_empty());
    }

    #[test]
    fn retired_vllm_env_is_a_problem_where_the_declared_vllm_no_longer_knows_it() {
        let with_env = LOCAL.replace("engine:\n", "engine:\n  env:\n    VLLM_USE_V1: \"1\"\n");
        let problems = parse(&with_env).unwrap().problems();
        assert!(problems.iter().any(|p| p.contains("VLLM_USE_V1 is unknown to vLLM 0.33.0")), "{problems:?}");
        let older = with_env.replace("vllm: \"0.33.0\"", "vllm: \"0.10.1\"");
        assert!(parse(&older).unwrap().problems().is_empty());
    }
}
