//! [`TestSpec`]: a valid [`LaunchSpec`] with test defaults, built from the typed spec so a field
//! rename breaks every test fixture at compile time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::gpu::{GpuProfile, GpuProfiles};
use crate::spec::{
    HarborSpec, INFRA_ERROR_TYPES, LaunchSpec, Limits, ModelSpec, PortPolicy, PostRunSpec, SecretsSpec,
    ServeInvocation, ServeSpec, TunnelSpec,
};

/// The shipped Harbor config the path-only unit spec names (a real file of the repository).
pub(crate) const SHIPPED_HARBOR_CONFIG: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../presets/harbor/dcagent_eval_config_no_override.yaml");

/// The catch-all GPU profile every fixture ends its list with.
pub fn default_profile(gpu_memory_utilization: f64) -> GpuProfile {
    GpuProfile {
        name: "default".into(),
        name_contains: String::new(),
        min_memory_gib: None,
        max_memory_gib: None,
        gpu_memory_utilization,
        extra_vllm_args: vec![],
        note: None,
    }
}

/// A profile for one chip by name and memory range (GiB).
pub fn chip_profile(name: &str, contains: &str, gib: (f64, f64), gpu_memory_utilization: f64) -> GpuProfile {
    GpuProfile {
        name: name.into(),
        name_contains: contains.into(),
        min_memory_gib: Some(gib.0),
        max_memory_gib: Some(gib.1),
        ..default_profile(gpu_memory_utilization)
    }
}

/// Limits scaled for the stand-ins: a run that ends in seconds, heartbeats and probes several
/// times a second.
pub(crate) fn fast_limits() -> Limits {
    Limits {
        teardown_grace_s: 1.5,
        walltime_lead_s: 4,
        heartbeat_interval_s: 0.3,
        health_probe_interval_s: 0.3,
        health_failures: 3,
    }
}

/// A launch spec under construction. [`TestSpec::new`] roots every path at one directory:
///
/// ```text
/// <root>/jobs/<run_tag>   run_dir        <root>/harbor.yaml   harbor.config
/// <root>/jobs             jobs_dir       <root>/data          harbor.dataset
/// ```
///
/// The defaults are a plain single-GPU terminus-2 run (TP 1, DP 1, one catch-all GPU profile at
/// 0.8, 32 concurrent trials × 3 attempts, no tunnel, Daytona keys required, default limits);
/// tests set what they vary with the chainable setters, or reach any field with [`Self::with`].
#[derive(Debug, Clone)]
pub struct TestSpec {
    spec: LaunchSpec,
}

impl TestSpec {
    pub fn new(root: impl AsRef<Path>, run_tag: &str) -> Self {
        let root = root.as_ref();
        let jobs_dir = root.join("jobs");
        Self {
            spec: LaunchSpec {
                version: crate::SPEC_VERSION,
                run_tag: run_tag.into(),
                run_dir: jobs_dir.join(run_tag),
                jobs_dir,
                cluster: "local".into(),
                benchmark: "terminal_bench_2".into(),
                ledger_job_id: None,
                model: ModelSpec {
                    hf_id: crate::ModelId::new("Qwen/Qwen3-8B").expect("an id"),
                    served_name: "Qwen3-8B".into(),
                    local_path: None,
                },
                serve: ServeSpec {
                    program: "vllm".into(),
                    env_prefix: None,
                    invocation: ServeInvocation::Serve,
                    host: "127.0.0.1".into(),
                    tensor_parallel_size: 1,
                    data_parallel_size: 1,
                    pipeline_parallel_size: 1,
                    nodes: 1,
                    distributed_timeout_s: None,
                    max_model_len: None,
                    max_num_seqs: None,
                    swap_space: None,
                    supports_swap_space: false,
                    trust_remote_code: false,
                    tool_call_parser: None,
                    reasoning_parser: None,
                    hf_overrides: None,
                    limit_mm_per_prompt: None,
                    extra_args: None,
                    env: BTreeMap::new(),
                    port: PortPolicy::default(),
                    gpu_memory_utilization: None,
                    cluster_gpu_memory_utilization: None,
                    health_timeout_s: 60,
                    hang_after_s: crate::spec::DEFAULT_HANG_AFTER_S,
                    load_stall_after_s: crate::spec::DEFAULT_LOAD_STALL_AFTER_S,
                    ready_budget: None,
                    declared_gpus: None,
                    allow_no_gpu: false,
                    ready_needs_completion: false,
                },
                gpu_profiles: GpuProfiles { profiles: vec![default_profile(0.8)] },
                tunnel: TunnelSpec::None,
                harbor: HarborSpec {
                    program: "harbor".into(),
                    env_prefix: None,
                    config: root.join("harbor.yaml"),
                    dataset: root.join("data"),
                    agent: "terminus-2".into(),
                    n_concurrent: 32,
                    n_attempts: 3,
                    timeout_multiplier: 2.0,
                    timeout_source: None,
                    agent_kwargs: vec![],
                    agent_parser: None,
                    agent_envs: vec![],
                    max_output_tokens: None,
                    resume_filter_error_types: INFRA_ERROR_TYPES.iter().map(|s| s.to_string()).collect(),
                    start: Default::default(),
                    extra_args: vec![],
                    env: BTreeMap::new(),
                    dialect: Default::default(),
                },
                secrets: SecretsSpec { file: None, daytona: true, pass_to_harbor: vec![], pass_to_engine: vec![] },
                limits: Limits::default(),
                post_run: None,
                scratch: None,
                declared: None,
            },
        }
    }

    /// The stand-in world the end-to-end tests build under `root`: `<root>/env` is the environment
    /// prefix of both programs (`bin/vllm`, `bin/harbor` → the stand-ins or the real Harbor),
    /// `<root>/secrets.env` the secrets file; benchmark `e2e`, 2 concurrent trials × 1 attempt,
    /// a 30 s readiness deadline and [`fast_limits`].
    pub fn standins(root: impl AsRef<Path>, run_tag: &str) -> Self {
        let root = root.as_ref();
        Self::new(root, run_tag)
            .benchmark("e2e")
            .env_prefix(root.join("env"))
            .secrets_file(root.join("secrets.env"))
            .health_timeout_s(30)
            .n_concurrent(2)
            .n_attempts(1)
            .timeout_multiplier(1.0)
            .limits(fast_limits())
    }

    /// Any other change, on the typed spec.
    pub fn with(mut self, edit: impl FnOnce(&mut LaunchSpec)) -> Self {
        edit(&mut self.spec);
        self
    }

    /// Renames the run; `run_dir` follows (`<jobs_dir>/<run_tag>`).
    pub fn run_tag(mut self, run_tag: &str) -> Self {
        self.spec.run_tag = run_tag.into();
        self.spec.run_dir = self.spec.jobs_dir.join(run_tag);
        self
    }

    pub fn benchmark(self, benchmark: &str) -> Self {
        self.with(|s| s.benchmark = benchmark.into())
    }

    pub fn cluster(self, cluster: &str) -> Self {
        self.with(|s| s.cluster = cluster.into())
    }

    pub fn model(self, hf_id: &str, served_name: &str) -> Self {
        self.with(|s| {
            s.model.hf_id = crate::ModelId::new(hf_id).expect("testkit: give a valid model id");
            s.model.served_name = served_name.into();
        })
    }

    /// Tensor and data parallel size.
    pub fn tp_dp(self, tp: u32, dp: u32) -> Self {
        self.with(|s| {
            s.serve.tensor_parallel_size = tp;
            s.serve.data_parallel_size = dp;
        })
    }

    pub fn nodes(self, nodes: u32) -> Self {
        self.with(|s| s.serve.nodes = nodes)
    }

    pub fn max_model_len(self, tokens: u64) -> Self {
        self.with(|s| s.serve.max_model_len = Some(tokens))
    }

    pub fn max_num_seqs(self, n: u32) -> Self {
        self.with(|s| s.serve.max_num_seqs = Some(n))
    }

    pub fn health_timeout_s(self, seconds: u64) -> Self {
        self.with(|s| s.serve.health_timeout_s = seconds)
    }

    pub fn hang_after_s(self, seconds: u64) -> Self {
        self.with(|s| s.serve.hang_after_s = seconds)
    }

    pub fn declared_gpus(self, n: u32) -> Self {
        self.with(|s| s.serve.declared_gpus = Some(n))
    }

    #[cfg(test)] // used only by the tests
    pub(crate) fn fixed_port(self, port: u16) -> Self {
        self.with(|s| s.serve.port.fixed = Some(port))
    }

    /// One variable of vLLM's environment.
    pub fn serve_env(self, name: &str, value: impl Into<String>) -> Self {
        self.with(|s| {
            s.serve.env.insert(name.into(), value.into());
        })
    }

    /// One variable of Harbor's environment.
    pub fn harbor_env(self, name: &str, value: impl Into<String>) -> Self {
        self.with(|s| {
            s.harbor.env.insert(name.into(), value.into());
        })
    }

    /// The programs' executables (`serve.program`, `harbor.program`).
    pub fn programs(self, serve: &str, harbor: &str) -> Self {
        self.with(|s| {
            s.serve.program = serve.into();
            s.harbor.program = harbor.into();
        })
    }

    /// The environment prefix of both vLLM and Harbor.
    pub fn env_prefix(self, prefix: impl Into<PathBuf>) -> Self {
        let prefix = prefix.into();
        self.with(|s| {
            s.serve.env_prefix = Some(prefix.clone());
            s.harbor.env_prefix = Some(prefix);
        })
    }

    pub fn gpu_profiles(self, profiles: Vec<GpuProfile>) -> Self {
        self.with(|s| s.gpu_profiles = GpuProfiles { profiles })
    }

    pub fn tunnel(self, tunnel: TunnelSpec) -> Self {
        self.with(|s| s.tunnel = tunnel)
    }

    pub fn harbor_config(self, path: impl Into<PathBuf>) -> Self {
        self.with(|s| s.harbor.config = path.into())
    }

    pub fn dataset(self, path: impl Into<PathBuf>) -> Self {
        self.with(|s| s.harbor.dataset = path.into())
    }

    pub fn agent(self, agent: &str) -> Self {
        self.with(|s| s.harbor.agent = agent.into())
    }

    pub fn n_concurrent(self, n: u32) -> Self {
        self.with(|s| s.harbor.n_concurrent = n)
    }

    pub fn n_attempts(self, n: u32) -> Self {
        self.with(|s| s.harbor.n_attempts = n)
    }

    pub fn timeout_multiplier(self, m: f64) -> Self {
        self.with(|s| s.harbor.timeout_multiplier = m)
    }

    pub fn harbor_extra_args(self, args: &[&str]) -> Self {
        self.with(|s| s.harbor.extra_args = args.iter().map(|a| a.to_string()).collect())
    }

    pub fn secrets_file(self, path: impl Into<PathBuf>) -> Self {
        self.with(|s| s.secrets.file = Some(path.into()))
    }

    /// Secret names handed to Harbor besides the Daytona keys.
    pub fn pass_to_harbor(self, names: &[&str]) -> Self {
        self.with(|s| s.secrets.pass_to_harbor = names.iter().map(|n| n.to_string()).collect())
    }

    /// Whether both Daytona keys are required.
    pub fn daytona(self, required: bool) -> Self {
        self.with(|s| s.secrets.daytona = required)
    }

    pub fn limits(self, limits: Limits) -> Self {
        self.with(|s| s.limits = limits)
    }

    pub fn post_run(self, step: PostRunSpec) -> Self {
        self.with(|s| s.post_run = Some(step))
    }

    pub fn build(self) -> LaunchSpec {
        self.spec
    }

    /// The spec as JSON, for tests that edit fields the way an operator edits a `launch.json`.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(&self.spec).expect("a launch spec serialises")
    }

    /// Writes the spec (pretty JSON, as submitter writes it) to `path`, creating its directory.
    pub fn write(&self, path: impl AsRef<Path>) -> std::io::Result<PathBuf> {
        write_spec(&self.spec, path.as_ref())
    }
}

/// Writes `spec` as pretty JSON to `path`, creating the parent directory.
pub fn write_spec(spec: &LaunchSpec, path: &Path) -> std::io::Result<PathBuf> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, spec.to_json())?;
    Ok(path.to_path_buf())
}

/// payload's unit tests' spec: paths only (nothing exists on disk but the shipped Harbor config),
/// run `tb2_qwen3-8b` in `/jobs`, dataset `/data/tb2`.
pub fn unit_spec() -> LaunchSpec {
    TestSpec::new("/", "tb2_qwen3-8b").dataset("/data/tb2").harbor_config(SHIPPED_HARBOR_CONFIG).build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_spec_is_valid_and_round_trips() {
        let root = Path::new("/tmp/kit");
        for spec in [
            unit_spec(),
            TestSpec::standins(root, "t").build(),
            TestSpec::standins(root, "t").tp_dp(2, 1).nodes(2).fixed_port(23000).build(),
        ] {
            assert_eq!(spec.problem(), Ok(()), "{spec:#?}");
            let back = LaunchSpec::from_json(&spec.to_json(), Path::new("x.json")).unwrap();
            assert_eq!(back, spec);
        }
        let s = TestSpec::standins(root, "a").run_tag("b").build();
        assert_eq!(s.run_dir, root.join("jobs/b"));
        assert_eq!(s.harbor.env_prefix.as_deref(), Some(root.join("env").as_path()));
    }
}
