//! Shared fixtures for unit tests.

use std::collections::BTreeMap;

use launch_spec::LaunchSpec;
use launch_spec::spec::*;
use launch_spec::{GpuProfile, GpuProfiles};

pub fn spec() -> LaunchSpec {
    LaunchSpec {
        version: launch_spec::SPEC_VERSION,
        run_tag: "tb2_qwen3-8b".into(),
        run_dir: "/jobs/tb2_qwen3-8b".into(),
        jobs_dir: "/jobs".into(),
        cluster: "local".into(),
        benchmark: "terminal_bench_2".into(),
        ledger_job_id: None,
        model: ModelSpec { hf_id: "Qwen/Qwen3-8B".into(), served_name: "Qwen3-8B".into(), local_path: None },
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
            declared_gpus: None,
            allow_no_gpu: false,
            ready_needs_completion: false,
        },
        gpu_profiles: GpuProfiles {
            profiles: vec![GpuProfile {
                name: "default".into(),
                name_contains: String::new(),
                min_memory_gib: None,
                max_memory_gib: None,
                gpu_memory_utilization: 0.8,
                extra_vllm_args: vec![],
                note: None,
            }],
        },
        tunnel: TunnelSpec::None,
        harbor: HarborSpec {
            program: "harbor".into(),
            env_prefix: None,
            config: concat!(env!("CARGO_MANIFEST_DIR"), "/../presets/harbor/dcagent_eval_config_no_override.yaml")
                .into(),
            dataset: "/data/tb2".into(),
            agent: "terminus-2".into(),
            n_concurrent: 32,
            n_attempts: 3,
            timeout_multiplier: 2.0,
            agent_kwargs: vec![],
            agent_parser: None,
            agent_envs: vec![],
            max_output_tokens: None,
            resume_filter_error_types: INFRA_ERROR_TYPES.iter().map(|s| s.to_string()).collect(),
            extra_args: vec![],
            env: BTreeMap::new(),
            dialect: Default::default(),
        },
        secrets: SecretsSpec { file: None, daytona: true, pass_to_harbor: vec![] },
        limits: Limits::default(),
        post_run: None,
        scratch: None,
    }
}
