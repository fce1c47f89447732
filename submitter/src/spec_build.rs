//! Building the launch spec for one (model, benchmark): registry + preset + cluster profile +
//! operator overrides → `LaunchSpec` (docs/design.md §5). Pure apart from reading the environment for
//! `${VAR}` expansion and probing dataset directories.

use std::path::{Path, PathBuf};

use launch_spec::layout::Layout;
use launch_spec::spec::{
    HarborSpec, Limits, ModelSpec, PinggyPair, PinggySpec, PortPolicy, PostRunSpec, ProxyMode, SecretsSpec,
    ServeInvocation, ServeSpec, SocksSpec, TunnelSpec,
};
use launch_spec::{GpuProfiles, LaunchSpec, SPEC_VERSION};

use crate::config::preset::harbor_config_path;
use crate::config::{ClusterProfile, Environment, Preset};
use crate::registry::{Overrides, Registry, Resolved, names};
use crate::settings::{Choices, Levels, ResolvedSettings};

#[derive(Debug, thiserror::Error)]
pub enum SpecBuildError {
    #[error(
        "cluster {cluster}: {field} uses ${{{var}}}, which is not set in the environment (export it, or edit clusters/{cluster}.yaml)"
    )]
    UnsetVariable { cluster: String, field: String, var: String },
    #[error("cluster {cluster}: {field}: {problem} (edit clusters/{cluster}.yaml)")]
    BadExpansion { cluster: String, field: String, problem: String },
    #[error(
        "cluster {cluster}: environment `{env}` (wanted by {wanted_by}) is not defined; known: {known} (add it under `environments:` in clusters/{cluster}.yaml)"
    )]
    UnknownEnvironment { cluster: String, env: String, wanted_by: String, known: String },
    #[error("model `{model}` on cluster {cluster}: {source}")]
    Layout { model: String, cluster: String, source: launch_spec::layout::LayoutError },
    #[error("{0}")]
    BadModel(String),
    #[error(
        "model `{model}`: the launch spec would have field `{field}` {problem} (fix the value in the cluster profile, preset, registry or command line that sets it)"
    )]
    InvalidSpec { model: String, field: &'static str, problem: String },
    #[error("preset dataset `{dataset}` is not one of the preset's datasets ({known})")]
    UnknownDataset { dataset: String, known: String },
    #[error(
        "agent `{agent}` runs inside the remote sandbox and needs a Pinggy tunnel, but cluster {cluster} has no `network.pinggy` pairs (add them to clusters/{cluster}.yaml, see docs/tunnels.md)"
    )]
    NoPinggyBank { agent: String, cluster: String },
    /// The team's bank (`network.pinggy_bank`) cannot give the pairs asked for: the reason names the
    /// pair, the secrets file and the fix.
    #[error("Pinggy bank of cluster {cluster}: {reason}")]
    PinggyBank { cluster: String, reason: String },
    #[error(
        "agent `{agent}` needs a Pinggy tunnel, but cluster {cluster} has no internet on compute nodes and no `network.proxy` to reach Pinggy through (add the login node under network.proxy in clusters/{cluster}.yaml, see docs/tunnels.md)"
    )]
    TunnelNeedsEgress { agent: String, cluster: String },
    #[error("model `{model}`: {reason} (fix its agent_kwargs in the registry, or --agent-kwarg)")]
    AgentKwarg { model: String, reason: String },
    #[error("Harbor config {}: {message}", path.display())]
    HarborConfig { path: PathBuf, message: String },
    #[error("Harbor config {error} {CONFIG_FIX}")]
    HarborConfigUnreadable { error: launch_spec::yaml::YamlError },
}

/// The one key of a Harbor job config the timeout policy reads; the rest is Harbor's.
#[derive(serde::Deserialize)]
struct ConfigTimeout {
    timeout_multiplier: Option<f64>,
}

pub use crate::settings::SpecOverrides;

/// Everything needed to build specs, resolved once ([`SpecBuilder::new`]).
#[derive(Clone, Copy)]
pub struct SpecBuilder<'a> {
    cluster: &'a ClusterProfile,
    gpu_profiles: &'a GpuProfiles,
    registry: &'a Registry,
    /// Directory holding Harbor job configs named by presets (`presets/harbor`).
    harbor_configs_dir: &'a Path,
    /// The configuration root (repository), for relative paths and `${SUBMITTER_HOME}`.
    root: &'a Path,
}

impl<'a> SpecBuilder<'a> {
    pub fn new(
        cluster: &'a ClusterProfile,
        gpu_profiles: &'a GpuProfiles,
        registry: &'a Registry,
        harbor_configs_dir: &'a Path,
        root: &'a Path,
    ) -> SpecBuilder<'a> {
        SpecBuilder { cluster, gpu_profiles, registry, harbor_configs_dir, root }
    }

    /// The same, for another cluster profile (a test's edited copy).
    pub fn with_cluster(self, cluster: &'a ClusterProfile) -> SpecBuilder<'a> {
        SpecBuilder { cluster, ..self }
    }

    pub fn cluster(&self) -> &'a ClusterProfile {
        self.cluster
    }

    pub fn registry(&self) -> &'a Registry {
        self.registry
    }

    pub fn gpu_profiles(&self) -> &'a GpuProfiles {
        self.gpu_profiles
    }

    pub fn root(&self) -> &'a Path {
        self.root
    }

    /// Every setting of `model`'s job under `preset` and the operator's `choices`, each with its
    /// source (crate::settings); `registry` is the model's registry resolution when it resolves.
    pub fn settings(
        &self,
        model: &str,
        preset: &Preset,
        choices: Choices<'_>,
        registry: Option<&Resolved>,
    ) -> ResolvedSettings {
        ResolvedSettings::resolve(&Levels {
            cluster: self.cluster,
            preset_name: &preset.name,
            preset,
            choices,
            gpu_profile: crate::settings::gpu_profile_for(self.cluster, self.gpu_profiles),
            harbor_configs_dir: self.harbor_configs_dir,
            size_band_config: self.registry.timeouts.choose(model).harbor_config,
            registry,
            model,
        })
    }
}

impl SpecBuilder<'_> {
    /// Expands `~` and `${VAR}` in a cluster path; `${SUBMITTER_HOME}` defaults to the config root.
    pub fn expand(&self, field: &str, text: &Path) -> Result<PathBuf, SpecBuildError> {
        self.expand_text(field, &text.to_string_lossy()).map(PathBuf::from)
    }

    /// [`Self::expand`] for any profile text (a leading `~/`, `${VAR}`), by the one rule
    /// (`launch_spec::expand`): an unset variable or an unterminated `${` is an error.
    pub(crate) fn expand_text(&self, field: &str, text: &str) -> Result<String, SpecBuildError> {
        use launch_spec::expand::ExpandError;
        launch_spec::expand::expand_path(text, &|var| self.variable(var)).map_err(|err| match err {
            ExpandError::Unset(var) => {
                SpecBuildError::UnsetVariable { cluster: self.cluster.name.clone(), field: field.to_string(), var }
            }
            other => SpecBuildError::BadExpansion {
                cluster: self.cluster.name.clone(),
                field: field.to_string(),
                problem: other.to_string(),
            },
        })
    }

    /// The submitter's environment as profiles see it: `${SUBMITTER_HOME}` defaults to the config root.
    pub fn variable(&self, var: &str) -> Option<String> {
        match std::env::var(var) {
            Ok(value) => Some(value),
            Err(_) if var == "SUBMITTER_HOME" => Some(self.root.display().to_string()),
            Err(_) => None,
        }
    }

    /// An env map with every value `${VAR}`-expanded (`field` names the map in errors).
    fn expand_env(
        &self,
        field: &str,
        env: &std::collections::BTreeMap<String, String>,
    ) -> Result<std::collections::BTreeMap<String, String>, SpecBuildError> {
        env.iter().map(|(k, v)| Ok((k.clone(), self.expand_text(&format!("{field}.{k}"), v)?))).collect()
    }

    /// The profile's HF cache, expanded (None when the profile has none).
    pub fn hf_cache(&self) -> Result<Option<PathBuf>, SpecBuildError> {
        match &self.cluster.paths.hf_cache {
            Some(cache) => Ok(Some(self.expand("paths.hf_cache", cache)?)),
            None => Ok(None),
        }
    }

    /// The secrets file as the job must read it, resolved now (the job does not see the
    /// submitting shell): `$DC_AGENT_SECRET_ENV` of the submitter's shell (the team's order: the
    /// variable first, issue 20), else `secrets.file`, else `~/secrets.env`; made absolute against
    /// the current directory.
    pub fn secrets_file(&self) -> Result<PathBuf, SpecBuildError> {
        let file = match (self.variable("DC_AGENT_SECRET_ENV").filter(|v| !v.is_empty()), &self.cluster.secrets.file) {
            (Some(from_shell), _) => self.expand("$DC_AGENT_SECRET_ENV", Path::new(&from_shell))?,
            (None, Some(file)) => self.expand("secrets.file", file)?,
            (None, None) => self.expand("secrets.file (default ~/secrets.env)", Path::new("~/secrets.env"))?,
        };
        Ok(std::path::absolute(&file).unwrap_or(file))
    }

    /// A Pinggy pair's public URL from the secrets file (`PINGGY_URL_<N>`; the team's bank lives
    /// there, never in the profile). Only the URL is kept; the token is payload's to read.
    fn pinggy_url(&self, name: &str) -> Result<String, SpecBuildError> {
        let file = self.secrets_file()?;
        let refuse = |reason: String| SpecBuildError::PinggyBank { cluster: self.cluster.name.clone(), reason };
        let pairs = launch_spec::envfile::read_pairs(&file).map_err(|e| refuse(format!("{}: {e}", file.display())))?;
        let url = pairs.into_iter().find(|(n, _)| n == name).map(|(_, value)| value);
        url.filter(|u| u.starts_with("https://")).ok_or_else(|| {
            refuse(format!(
                "{} has no `{name}=https://….a.pinggy.link` line: add the pair's public URL",
                file.display()
            ))
        })
    }

    /// vLLM's environment: the cluster's `engine.env`, then the serving environment's `env`, then
    /// where the weights are (docs/site.md): the profile's cache as `HF_HUB_CACHE` (never `$HOME`),
    /// and with it `HF_HUB_OFFLINE=1` where compute nodes have no internet (the weights are staged there).
    fn engine_env(
        &self,
        serve_env_name: &str,
        serve_env: &Environment,
        data_parallel_size: u32,
    ) -> Result<std::collections::BTreeMap<String, String>, SpecBuildError> {
        let cluster = self.cluster;
        let mut env = self.expand_env("engine.env", &cluster.engine.env)?;
        env.extend(self.expand_env(&format!("environments.{serve_env_name}.env"), &serve_env.env)?);
        if cluster.engine.torchdynamo_disable_by_dp {
            env.insert("TORCHDYNAMO_DISABLE".into(), if data_parallel_size > 1 { "0" } else { "1" }.into());
        }
        // Offline only with a cache to read: without `paths.hf_cache` the job keeps its user's
        // default cache and online lookups (preflight says so).
        if let Some(cache) = self.hf_cache()? {
            env.insert("HF_HUB_CACHE".into(), cache.display().to_string());
            if !cluster.network.internet {
                env.insert("HF_HUB_OFFLINE".into(), "1".into());
            }
        }
        Ok(env)
    }

    /// The Harbor job config a job runs with: `--harbor-config`, else the preset's, else the default.
    /// The Harbor agent a job runs — with model and benchmark family, its identity (docs/decisions.md,
    /// "An eval's identity includes its harness"). The preset's `agent_name` when it names one; else
    /// the one agent the Harbor config's `agents` lists, as Harbor itself would run it (a
    /// `--harbor-config openhands_*.yaml` selects openhands); else terminus-2. Refused: a config
    /// listing several agents without `agent_name`, and a `--harbor-config` whose agents do not
    /// include the preset's `agent_name` (one of the two would be silently ignored).
    pub fn agent(&self, model: &str, preset: &Preset, overrides: &SpecOverrides) -> Result<String, SpecBuildError> {
        let path = self.harbor_config(model, preset, overrides);
        let problem = |message: String| SpecBuildError::HarborConfig { path: path.clone(), message };
        // An unreadable config is reported where it is read (preflight, payload); here it names no agent.
        let config: serde_json::Value = launch_spec::yaml::from_yaml_file(&path).unwrap_or_default();
        let mut listed: Vec<String> = Vec::new();
        for name in config.get("agents").and_then(|a| a.as_array()).into_iter().flatten() {
            if let Some(name) = name.get("name").and_then(|n| n.as_str()).filter(|n| !listed.iter().any(|l| l == n)) {
                listed.push(name.to_string());
            }
        }
        match (&preset.agent_name, listed.as_slice()) {
            (Some(named), listed)
                if overrides.harbor_config.is_some() && !listed.is_empty() && !listed.contains(named) =>
            {
                Err(problem(format!(
                    "lists agent(s) {} but the preset's agent_name is {named}: use a preset without agent_name, or a config for {named}",
                    listed.join(", ")
                )))
            }
            (Some(named), _) => Ok(named.clone()),
            (None, []) => Ok(preset.agent().to_string()),
            (None, [one]) => Ok(one.clone()),
            (None, several) => Err(problem(format!(
                "lists several agents ({}): name the one to run with the preset's agent_name",
                several.join(", ")
            ))),
        }
    }

    fn environment(&self, name: &str, wanted_by: &str) -> Result<(PathBuf, &Environment), SpecBuildError> {
        let env = self.cluster.environments.get(name).ok_or_else(|| SpecBuildError::UnknownEnvironment {
            cluster: self.cluster.name.clone(),
            env: name.to_string(),
            wanted_by: wanted_by.to_string(),
            known: self.cluster.environments.keys().cloned().collect::<Vec<_>>().join(", "),
        })?;
        Ok((self.expand(&format!("environments.{name}"), &env.path)?, env))
    }

    /// Resolves serve settings on this cluster's hardware profile, with their layout on its nodes.
    pub fn resolve(
        &self,
        model: &launch_spec::ModelId,
        preset: &Preset,
        overrides: &SpecOverrides,
    ) -> Result<(Resolved, Layout), SpecBuildError> {
        model.hf_repo().map_err(|e| SpecBuildError::BadModel(e.to_string()))?;
        if let Some(problem) = self.registry.problem_for(model, &self.cluster.hardware.hardware_profile) {
            return Err(SpecBuildError::BadModel(format!(
                "{problem} (fix the file; `submitter registry check` lists every problem)"
            )));
        }
        let harbor_config_multiplier = match self.explicit_harbor_config(preset, overrides) {
            Some(path) => Some(harbor_config_multiplier(&path)?),
            None => None,
        };
        let registry_overrides = Overrides {
            timeout_multiplier: overrides.timeout_multiplier,
            harbor_config_multiplier,
            cli_agent_kwargs: overrides.agent_kwargs.clone(),
            preset_agent_kwargs: preset.agent_kwargs.clone(),
        };
        let hardware = &self.cluster.hardware;
        let resolved =
            self.registry.resolve(model, &hardware.hardware_profile, hardware.gpus_per_node, &registry_overrides);
        if resolved.timeout_source == crate::registry::TimeoutSource::Fallback {
            tracing::info!(
                "{model}: timeout multiplier {:.1} is the policy's fallback (its size is in no band of _timeouts.yaml, or it has no size token)",
                resolved.timeout_multiplier
            );
        }
        let layout = resolved.layout(hardware.gpus_per_node, self.cluster.slurm.max_nodes).map_err(|source| {
            SpecBuildError::Layout { model: model.to_string(), cluster: self.cluster.name.clone(), source }
        })?;
        Ok((resolved, layout))
    }

    /// The explicit Harbor config (`--harbor-config`, else the preset's `harbor_config`), if any:
    /// the resolved config when an explicit level set it.
    pub(crate) fn explicit_harbor_config(&self, preset: &Preset, overrides: &SpecOverrides) -> Option<PathBuf> {
        let name = crate::settings::explicit_harbor_config(overrides, preset)?;
        Some(harbor_config_path(self.harbor_configs_dir, &name.value))
    }

    /// The Harbor config a job of `model` runs ([`ResolvedSettings::harbor_config`]): the explicit
    /// one, else `--config-yaml`, else the preset's `config_yaml`, else the canonical config of the
    /// model's size band (as the team's listener selects it).
    pub fn harbor_config(&self, model: &str, preset: &Preset, overrides: &SpecOverrides) -> PathBuf {
        self.settings(model, preset, Choices::spec_only(overrides), None).harbor_config.value
    }

    /// The dataset's task directory: an absolute path as given, else the first existing
    /// `<datasets_dir>/<org>_<name>` or `<datasets_dir>/<name>`, else the first candidate.
    pub fn dataset_dir(&self, dataset: &str) -> Result<PathBuf, SpecBuildError> {
        if Path::new(dataset).is_absolute() {
            return Ok(PathBuf::from(dataset));
        }
        let safe = dataset.replace(['/', ':'], "_");
        let name = Preset::benchmark_of(dataset);
        let mut candidates = Vec::new();
        for (i, dir) in self.cluster.paths.datasets_dirs.iter().enumerate() {
            let dir = self.expand(&format!("paths.datasets_dirs[{i}]"), dir)?;
            candidates.push(dir.join(&safe));
            candidates.push(dir.join(&name));
        }
        Ok(candidates
            .iter()
            .find(|c| c.is_dir())
            .or(candidates.first())
            .cloned()
            .unwrap_or_else(|| PathBuf::from(dataset)))
    }

    /// Builds the launch spec for one (model, preset dataset).
    /// The spec passes the same validation payload's reader applies (`LaunchSpec::problem`), so
    /// nothing is written or submitted that payload would refuse.
    pub fn build(
        &self,
        model: &launch_spec::ModelId,
        preset: &Preset,
        overrides: &SpecOverrides,
    ) -> Result<LaunchSpec, SpecBuildError> {
        let spec = self.build_unchecked(model, preset, overrides)?;
        spec.problem().map_err(|(field, problem)| SpecBuildError::InvalidSpec {
            model: model.to_string(),
            field,
            problem,
        })?;
        Ok(spec)
    }

    fn build_unchecked(
        &self,
        model: &launch_spec::ModelId,
        preset: &Preset,
        overrides: &SpecOverrides,
    ) -> Result<LaunchSpec, SpecBuildError> {
        let dataset = crate::settings::dataset(overrides.dataset.as_deref(), preset)
            .map_err(|(dataset, known)| SpecBuildError::UnknownDataset { dataset, known })?
            .value;
        let (resolved, layout) = self.resolve(model, preset, overrides)?;
        let cluster = self.cluster;
        let benchmark = Preset::benchmark_of(&dataset);
        let agent = self.agent(model, preset, overrides)?;
        let run_tag = names::eval_run_tag(&benchmark, model, &agent);
        let jobs_dir = self.expand("paths.jobs_dir", &cluster.paths.jobs_dir)?;
        let settings = self.settings(model, preset, Choices::spec_only(overrides), Some(&resolved));
        let serve_env_name = settings.engine_environment.value.clone();
        let wanted_by = match &settings.engine_environment.source {
            crate::settings::Source::Registry(_) => format!("model {model}"),
            _ => "engine.default_environment".to_string(),
        };
        let (serve_prefix, serve_env) = self.environment(&serve_env_name, &wanted_by)?;
        let (harbor_prefix, harbor_env) = self.environment(&cluster.harbor.environment, "harbor.environment")?;
        let dialect = harbor_env.harbor_dialect();
        let agent_kwargs = launch_spec::versions::translate_agent_kwargs(&resolved.agent_kwargs, dialect)
            .map_err(|e| SpecBuildError::AgentKwarg { model: model.to_string(), reason: e.to_string() })?;
        if let Some(asked) = settings.n_concurrent_capped_from {
            // Never a silent cap (issue 20): `plan`, `launch` and `spec` say so.
            tracing::warn!(
                "{model}: Harbor concurrency {asked} capped to {} trials by limits.n_concurrent_ceiling of cluster {}",
                settings.n_concurrent.value,
                cluster.name
            );
        }
        let mut harbor_extra = Vec::new();
        if let Some(auto_snapshot) = preset.auto_snapshot {
            harbor_extra.extend(["--environment-kwarg".to_string(), format!("auto_snapshot={auto_snapshot}")]);
        }
        let pairs = || pinggy_pairs(cluster, overrides.pinggy_pair, &|name| self.pinggy_url(name));
        let tunnel = tunnel_spec(cluster, &agent, &|field, path| self.expand(field, path), &pairs)?;
        let secrets_file = Some(self.secrets_file()?);
        let engine_env = self.engine_env(&serve_env_name, serve_env, resolved.data_parallel_size)?;
        let mut harbor_env_vars = self.expand_env("harbor.env", &cluster.harbor.env)?;
        harbor_env_vars
            .extend(self.expand_env(&format!("environments.{}.env", cluster.harbor.environment), &harbor_env.env)?);
        let scratch = match &cluster.paths.node_scratch {
            Some(root) => Some(launch_spec::spec::ScratchSpec { root: self.expand("paths.node_scratch", root)? }),
            None => None,
        };
        let post_run = self.post_run_spec()?;
        let mut spec = LaunchSpec {
            version: SPEC_VERSION,
            run_dir: jobs_dir.join(&run_tag),
            run_tag,
            jobs_dir,
            cluster: cluster.name.clone(),
            benchmark,
            ledger_job_id: None,
            model: ModelSpec { hf_id: model.clone(), served_name: names::served_name(model), local_path: None },
            serve: ServeSpec {
                program: cluster.engine.program.clone(),
                env_prefix: Some(serve_prefix),
                invocation: ServeInvocation::Serve,
                host: "127.0.0.1".to_string(),
                tensor_parallel_size: resolved.tensor_parallel_size,
                data_parallel_size: resolved.data_parallel_size,
                pipeline_parallel_size: resolved.pipeline_parallel_size,
                nodes: layout.nodes,
                // Ranks on other nodes may load weights far slower than the head: vLLM's
                // collective timeout gets the whole readiness budget.
                // Only for a vLLM that has the flag (0.16.0 refuses it: found by its own parser).
                distributed_timeout_s: (layout.is_multi_node()
                    && launch_spec::versions::vllm_has_distributed_timeout(serve_env.vllm()))
                .then(|| cluster.engine.distributed_timeout_s.unwrap_or(cluster.engine.health_timeout_s)),
                max_model_len: resolved.max_model_len,
                max_num_seqs: resolved.max_num_seqs,
                swap_space: resolved.swap_space,
                supports_swap_space: launch_spec::versions::vllm_has_swap_space(serve_env.vllm()),
                trust_remote_code: resolved.trust_remote_code.unwrap_or(false),
                tool_call_parser: resolved.tool_call_parser.clone(),
                reasoning_parser: resolved.reasoning_parser.clone(),
                hf_overrides: resolved.hf_overrides.clone(),
                limit_mm_per_prompt: resolved.limit_mm_per_prompt.clone(),
                extra_args: resolved.extra_args.clone(),
                env: engine_env,
                port: PortPolicy::default(),
                gpu_memory_utilization: settings.spec_gpu_memory_utilization(),
                cluster_gpu_memory_utilization: cluster.hardware.gpu_memory_utilization,
                health_timeout_s: cluster.engine.health_timeout_s,
                hang_after_s: cluster.engine.hang_after_s,
                load_stall_after_s: cluster.engine.load_stall_after_s,
                ready_budget: None,
                declared_gpus: Some(layout.gpus_per_node),
                allow_no_gpu: false,
                ready_needs_completion: false,
            },
            gpu_profiles: self.gpu_profiles.clone(),
            tunnel,
            harbor: HarborSpec {
                program: cluster.harbor.program.clone(),
                env_prefix: Some(harbor_prefix),
                config: settings.harbor_config.value.clone(),
                dataset: self.dataset_dir(&dataset)?,
                agent,
                n_concurrent: settings.n_concurrent.value,
                n_attempts: settings.n_attempts.value,
                timeout_multiplier: resolved.timeout_multiplier,
                timeout_source: Some(resolved.timeout_source.as_str().to_string()),
                agent_kwargs,
                agent_parser: settings.agent_parser.map(|p| p.value),
                agent_envs: preset.agent_envs(),
                max_output_tokens: settings.max_output_tokens.map(|m| m.value),
                resume_filter_error_types: launch_spec::spec::INFRA_ERROR_TYPES
                    .iter()
                    .map(|s| (*s).to_string())
                    .collect(),
                // `submitter spec` and the first attempt of a pair; the planner makes a
                // re-evaluation fresh in a run dir of its own.
                start: Default::default(),
                extra_args: harbor_extra,
                env: harbor_env_vars,
                dialect,
            },
            secrets: SecretsSpec {
                file: secrets_file,
                daytona: true,
                pass_to_harbor: cluster.secrets.pass_to_harbor.clone(),
                // The job downloads the weights itself (internet, nothing staged from the login
                // side): a gated model needs the token there, as the team's scripts give it.
                pass_to_engine: if cluster.network.internet && !cluster.pre_download.enabled {
                    vec![launch_spec::spec::HF_TOKEN.to_string()]
                } else {
                    Vec::new()
                },
            },
            limits: Limits {
                // The grace plus the final sweep must fit inside Slurm's KillWait.
                teardown_grace_s: (cluster.slurm.kill_wait_s.saturating_sub(10)).clamp(1, 20) as f64,
                walltime_lead_s: cluster.limits.walltime_lead_s,
                ..Limits::default()
            },
            post_run,
            scratch,
            declared: Some(launch_spec::versions::Declared {
                engine_environment: serve_env_name,
                vllm: serve_env.vllm(),
                harbor_environment: cluster.harbor.environment.clone(),
                harbor: harbor_env.harbor_declared(),
            }),
        };
        spec.serve.ready_budget = self.ready_budget(&spec);
        Ok(spec)
    }

    /// `serve.ready_budget` (crate::readiness): the weights on disk (`model.local_path`, else the
    /// profile's HF cache), else an estimate from the id; `None` (the cap alone) without either.
    pub fn ready_budget(&self, spec: &LaunchSpec) -> Option<launch_spec::spec::ReadyBudget> {
        // An unexpandable cache path fails the spec elsewhere (the engine's environment).
        let cache = self.hf_cache().ok().flatten();
        let weights = crate::readiness::weights(&spec.model.hf_id, spec.model.local_path.as_deref(), cache.as_deref())?;
        Some(crate::readiness::budget(&self.cluster.engine, &spec.model.hf_id, &spec.serve, &weights))
    }

    /// The profile's post-run step: `${VAR}` expanded in every argv element (as in profile paths;
    /// payload's `{run_dir}`/`{run_tag}` have no `$` and pass through) and the environment's prefix.
    fn post_run_spec(&self) -> Result<Option<PostRunSpec>, SpecBuildError> {
        let Some(step) = &self.cluster.post_run else { return Ok(None) };
        let argv = step
            .argv
            .iter()
            .enumerate()
            .map(|(i, arg)| self.expand_text(&format!("post_run.argv[{i}]"), arg))
            .collect::<Result<Vec<_>, _>>()?;
        let env_prefix = match &step.environment {
            Some(name) => Some(self.environment(name, "post_run.environment")?.0),
            None => None,
        };
        Ok(Some(PostRunSpec {
            argv,
            timeout_s: step.timeout_s,
            env_prefix,
            env: step.env.clone(),
            secrets: step.secrets.clone(),
        }))
    }
}

/// A Harbor config's own `timeout_multiplier` (an explicit config's is used as-is); Harbor's default
/// 1.0 when the file sets none. A file that cannot be read is refused here, on the login node.
const CONFIG_FIX: &str = "(name an existing Harbor job config with --harbor-config or the preset's harbor_config)";

pub(crate) fn harbor_config_multiplier(path: &Path) -> Result<f64, SpecBuildError> {
    let config: ConfigTimeout =
        launch_spec::yaml::from_yaml_file(path).map_err(|error| SpecBuildError::HarborConfigUnreadable { error })?;
    let value = config.timeout_multiplier.unwrap_or(1.0);
    launch_spec::validate::multiplier(value).map_err(|problem| SpecBuildError::HarborConfig {
        path: path.to_path_buf(),
        message: format!("timeout_multiplier {problem} {CONFIG_FIX}"),
    })
}

/// The tunnel for `agent` on `cluster` (docs/tunnels.md): Pinggy for installed-harness agents (the
/// whole bank goes into the spec with `<state_dir>/pinggy` as the lease directory — payload picks
/// a free pair on the node), with the SOCKS egress proxy beside it when compute nodes have no
/// internet; SOCKS egress alone for local agents there; otherwise none.
pub(crate) fn tunnel_spec(
    cluster: &ClusterProfile,
    agent: &str,
    expand: &dyn Fn(&str, &Path) -> Result<PathBuf, SpecBuildError>,
    pairs: &dyn Fn() -> Result<Vec<crate::config::cluster::PinggyPair>, SpecBuildError>,
) -> Result<TunnelSpec, SpecBuildError> {
    let network = &cluster.network;
    let egress = match (&network.proxy, network.internet) {
        (Some(proxy), false) => Some(socks_spec(proxy, expand)?),
        _ => None,
    };
    if launch_spec::spec::is_installed_agent(agent) {
        if !network.internet && egress.is_none() {
            return Err(SpecBuildError::TunnelNeedsEgress { agent: agent.to_string(), cluster: cluster.name.clone() });
        }
        let pairs = pairs()?;
        let Some((first, rest)) = pairs.split_first() else {
            return Err(SpecBuildError::NoPinggyBank { agent: agent.to_string(), cluster: cluster.name.clone() });
        };
        let mut spec: PinggySpec = serde_json::from_value(serde_json::json!({
            "host": first.host, "public_url": first.url, "token_secret": first.token_secret,
        }))
        .expect("minimal Pinggy spec");
        spec.bank = rest
            .iter()
            .map(|p| PinggyPair {
                public_url: p.url.clone(),
                token_secret: p.token_secret.clone(),
                host: (p.host != first.host).then(|| p.host.clone()),
            })
            .collect();
        spec.lock_dir = Some(expand("paths.state_dir", &cluster.paths.state_dir)?.join("pinggy"));
        spec.known_hosts = match &first.known_hosts {
            Some(file) => Some(expand("network.pinggy[0].known_hosts", file)?),
            None => None,
        };
        spec.egress = egress.map(Box::new);
        return Ok(TunnelSpec::Pinggy(spec));
    }
    Ok(egress.map(TunnelSpec::Socks).unwrap_or(TunnelSpec::None))
}

/// Applies remediation's adjustment of a pair (docs/verification.md "Remediation") to its next
/// launch spec, so the change is explicit there: `serve.gpu_memory_utilization` (over every other
/// source: it was lowered from the value the failed job used), a longer `serve.health_timeout_s`,
/// and the locked Pinggy pairs left out of the bank (the next pair becomes the first). A bank
/// every pair of which is left out stays as it is (remediation holds such a pair instead). The
/// `--exclude` nodes go into the sbatch request (planner).
pub(crate) fn apply_adjustment(spec: &mut LaunchSpec, adjustment: &crate::domain::PairAdjustment) {
    if let Some(util) = adjustment.gpu_memory_utilization {
        spec.serve.gpu_memory_utilization = Some(util);
    }
    if let Some(timeout) = adjustment.health_timeout_s {
        spec.serve.health_timeout_s = spec.serve.health_timeout_s.max(timeout);
    }
    if let launch_spec::spec::TunnelSpec::Pinggy(p) = &mut spec.tunnel
        && !adjustment.skip_pinggy.is_empty()
    {
        let skipped = |url: &str| adjustment.skip_pinggy.iter().any(|s| s == url.trim_end_matches('/'));
        let old_host = p.host.clone();
        // Each pair's own server, so moving a pair to the front keeps every pair on its server.
        let kept: Vec<_> = p
            .pairs()
            .into_iter()
            .filter(|pair| !skipped(&pair.public_url))
            .map(|mut pair| {
                pair.host.get_or_insert_with(|| old_host.clone());
                pair
            })
            .collect();
        if let Some((first, rest)) = kept.split_first() {
            p.public_url = first.public_url.clone();
            p.token_secret = first.token_secret.clone();
            p.host = first.host.clone().unwrap_or(old_host);
            p.bank = rest.to_vec();
        }
    }
}

/// The adjustment in words, for `plan` and `status`.
pub(crate) fn describe_adjustment(adjustment: &crate::domain::PairAdjustment) -> String {
    let mut parts = Vec::new();
    if let Some(util) = adjustment.gpu_memory_utilization {
        parts.push(format!("serve.gpu_memory_utilization {util:.2}"));
    }
    if let Some(timeout) = adjustment.health_timeout_s {
        parts.push(format!("serve.health_timeout_s ≥ {timeout}"));
    }
    if !adjustment.skip_pinggy.is_empty() {
        parts.push(format!("Pinggy pairs left out: {}", adjustment.skip_pinggy.join(", ")));
    }
    if !adjustment.exclude_nodes.is_empty() {
        parts.push(format!("sbatch --exclude={}", adjustment.exclude_nodes.join(",")));
    }
    if let Some(at) = adjustment.not_before {
        parts.push(format!("not before {} (the sandbox provider failed)", at.to_rfc3339()));
    }
    parts.join("; ")
}

/// The Pinggy pairs a job on `cluster` gets (docs/tunnels.md): the profile's `network.pinggy` as
/// written, or from the team's bank (`network.pinggy_bank`) the pair `--pinggy-pair` names, else
/// the defaults — each pair `N` being the secrets file's `PINGGY_URL_<N>` (read by `url_of`) and
/// `PINGGY_TOKEN_<N>` (read by payload on the node, never here).
pub(crate) fn pinggy_pairs(
    cluster: &ClusterProfile,
    asked: Option<u32>,
    url_of: &dyn Fn(&str) -> Result<String, SpecBuildError>,
) -> Result<Vec<crate::config::cluster::PinggyPair>, SpecBuildError> {
    let refuse = |reason: String| SpecBuildError::PinggyBank { cluster: cluster.name.clone(), reason };
    let Some(bank) = &cluster.network.pinggy_bank else {
        if let Some(n) = asked {
            return Err(refuse(format!("--pinggy-pair {n}, but the profile has no network.pinggy_bank")));
        }
        return Ok(cluster.network.pinggy.clone());
    };
    let numbers = bank.pairs_for(asked).map_err(refuse)?;
    numbers
        .into_iter()
        .map(|n| {
            let (url_name, token_secret) = crate::config::cluster::PinggyBank::secret_names(n);
            Ok(crate::config::cluster::PinggyPair {
                url: url_of(&url_name)?,
                token_secret,
                host: bank.host.clone(),
                known_hosts: None,
            })
        })
        .collect()
}

/// One line for `plan` and `lint`: what `agent`'s jobs on `cluster` tunnel, and the variables the
/// agent gets (launch_spec::agents); the refusal's reason when they cannot launch there.
pub(crate) fn describe_tunnel(
    cluster: &ClusterProfile,
    agent: &str,
    expand: &dyn Fn(&str, &Path) -> Result<PathBuf, SpecBuildError>,
    asked_pair: Option<u32>,
) -> Result<String, SpecBuildError> {
    let socks = |s: &SocksSpec| {
        let mode =
            if s.mode == ProxyMode::Proxychains { "Harbor under proxychains" } else { "proxy variables for Harbor" };
        format!("SOCKS egress via {} ({mode})", s.login_node)
    };
    // The URLs are the secrets file's: not read to describe the bank.
    let url_of = |name: &str| Ok(format!("${name}"));
    let pairs = || pinggy_pairs(cluster, asked_pair, &url_of);
    let bank = |count: usize| match &cluster.network.pinggy_bank {
        Some(bank) => match asked_pair {
            Some(n) => format!("pair {n} of the team's bank (--pinggy-pair)"),
            None => format!(
                "pairs {} of the team's bank, the first free one (failover among them; borrow-only {} only with --pinggy-pair N)",
                crate::config::cluster::numbers(&bank.defaults),
                crate::config::cluster::numbers(&bank.borrow_only)
            ),
        },
        None => format!("{count} pair(s)"),
    };
    Ok(match tunnel_spec(cluster, agent, expand, &pairs)? {
        TunnelSpec::None => format!("none ({agent} calls vLLM on the node)"),
        TunnelSpec::Socks(s) => socks(&s),
        TunnelSpec::Pinggy(p) => format!(
            "Pinggy ({}, public URL as api_base{}){}; {}",
            bank(p.pairs().len()),
            if p.egress.is_some() { ", reached through the login node" } else { "" },
            p.egress.as_ref().map(|s| format!(" + {}", socks(s))).unwrap_or_default(),
            launch_spec::agents::describe(agent, true)
        ),
    })
}

/// The SOCKS egress proxy through the profile's login node.
fn socks_spec(
    proxy: &crate::config::cluster::Proxy,
    expand: &dyn Fn(&str, &Path) -> Result<PathBuf, SpecBuildError>,
) -> Result<SocksSpec, SpecBuildError> {
    let mut spec: SocksSpec =
        serde_json::from_value(serde_json::json!({ "login_node": proxy.login_node })).expect("minimal SOCKS spec");
    spec.user = proxy.user.clone();
    spec.identity_file = match &proxy.identity_file {
        Some(key) => Some(expand("network.proxy.identity_file", key)?),
        None => None,
    };
    spec.ssh_port = proxy.ssh_port;
    spec.mode = if proxy.mode == "proxychains" { ProxyMode::Proxychains } else { ProxyMode::Env };
    spec.proxychains_bin = proxy.proxychains_bin.clone();
    spec.known_hosts = match &proxy.known_hosts {
        Some(file) => Some(expand("network.proxy.known_hosts", file)?),
        None => None,
    };
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str) -> ClusterProfile {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clusters");
        crate::config::load_cluster(&dir, name).unwrap()
    }

    fn expand(_: &str, p: &Path) -> Result<PathBuf, SpecBuildError> {
        Ok(PathBuf::from(
            p.to_string_lossy().replace("${WORK}", "/w").replace("${SCRATCH}", "/s").replace('~', "/home/u"),
        ))
    }

    /// Remediation's adjustment is explicit in the spec: the lowered ceiling, the longer readiness
    /// deadline, the locked pair out of the bank (each remaining pair on its own server).
    #[test]
    fn an_adjustment_is_applied_to_the_spec() {
        let mut vista = cluster("vista");
        let bank = "- {url: https://a.a.pinggy.link, token_secret: PINGGY_TOKEN_1}\n- {url: https://b.a.pinggy.link, token_secret: PINGGY_TOKEN_2, host: ap.pro.pinggy.io}\n- {url: https://c.a.pinggy.link, token_secret: PINGGY_TOKEN_3}\n";
        vista.network.pinggy = launch_spec::yaml::from_yaml_str(bank, Path::new("bank.yaml")).unwrap();
        let mut spec = launch_spec::testkit::unit_spec();
        spec.tunnel = tunnel_spec(&vista, "openhands", &expand, &|| Ok(vista.network.pinggy.clone())).unwrap();
        let TunnelSpec::Pinggy(before) = spec.tunnel.clone() else { panic!() };
        let adjustment = crate::domain::PairAdjustment {
            gpu_memory_utilization: Some(0.85),
            health_timeout_s: Some(spec.serve.health_timeout_s + 600),
            skip_pinggy: vec!["https://a.a.pinggy.link".into()],
            exclude_nodes: vec!["n1".into()],
            not_before: None,
        };
        let timeout = spec.serve.health_timeout_s + 600;
        apply_adjustment(&mut spec, &adjustment);
        assert_eq!(spec.serve.gpu_memory_utilization, Some(0.85));
        assert_eq!(spec.serve.health_timeout_s, timeout);
        let TunnelSpec::Pinggy(p) = &spec.tunnel else { panic!() };
        assert_eq!((p.public_url.as_str(), p.token_secret.as_str()), ("https://b.a.pinggy.link", "PINGGY_TOKEN_2"));
        assert_eq!(p.host, "ap.pro.pinggy.io");
        assert_eq!(p.bank.len(), 1);
        assert_eq!(p.bank[0].public_url, "https://c.a.pinggy.link");
        assert_eq!(p.bank[0].host.as_deref(), Some(before.host.as_str()), "c stays on the first pair's server");
        assert!(spec.problem().is_ok(), "{:?}", spec.problem());
        // Every pair left out: the bank stays (remediation holds such a pair instead).
        let all = crate::domain::PairAdjustment {
            skip_pinggy: before.pairs().into_iter().map(|p| p.public_url).collect(),
            ..Default::default()
        };
        let mut again = launch_spec::testkit::unit_spec();
        again.tunnel = TunnelSpec::Pinggy(before.clone());
        apply_adjustment(&mut again, &all);
        assert_eq!(again.tunnel, TunnelSpec::Pinggy(before));
        assert_eq!(
            describe_adjustment(&adjustment),
            format!(
                "serve.gpu_memory_utilization 0.85; serve.health_timeout_s ≥ {timeout}; Pinggy pairs left out: https://a.a.pinggy.link; sbatch --exclude=n1"
            )
        );
    }

    #[test]
    fn tunnels_follow_the_profile_and_the_agent() {
        let leo = cluster("leonardo");
        let TunnelSpec::Socks(socks) =
            tunnel_spec(&leo, "terminus-2", &expand, &|| Ok(leo.network.pinggy.clone())).unwrap()
        else {
            panic!("leonardo needs SOCKS")
        };
        assert_eq!(socks.login_node, leo.network.proxy.as_ref().unwrap().login_node);
        assert!(socks.identity_file.is_some_and(|k| !k.to_string_lossy().contains('~')));
        // An installed harness without internet: Pinggy with the SOCKS egress beside it, once the
        // profile has a bank; without a proxy it is refused.
        let mut leo = leo;
        assert!(matches!(
            tunnel_spec(&leo, "openhands", &expand, &|| Ok(leo.network.pinggy.clone())),
            Err(SpecBuildError::NoPinggyBank { .. })
        ));
        let one = "- {url: https://a.a.pinggy.link, token_secret: PINGGY_TOKEN_1}\n";
        leo.network.pinggy = launch_spec::yaml::from_yaml_str(one, Path::new("bank.yaml")).unwrap();
        let TunnelSpec::Pinggy(p) =
            tunnel_spec(&leo, "openhands", &expand, &|| Ok(leo.network.pinggy.clone())).unwrap()
        else {
            panic!()
        };
        assert_eq!(p.egress.as_ref().map(|e| e.login_node.as_str()), Some(socks.login_node.as_str()));
        assert_eq!(p.egress.unwrap().mode, ProxyMode::Proxychains);
        // What `plan` prints for it: both tunnels and openhands' variables.
        let text = describe_tunnel(&leo, "openhands", &expand, None).unwrap();
        assert!(text.contains("reached through the login node) + SOCKS egress via login05"), "{text}");
        assert!(text.ends_with("agent openhands reads LLM_BASE_URL, HOSTED_VLLM_API_KEY, LLM_API_KEY"), "{text}");
        leo.network.proxy = None;
        assert!(matches!(
            tunnel_spec(&leo, "openhands", &expand, &|| Ok(leo.network.pinggy.clone())),
            Err(SpecBuildError::TunnelNeedsEgress { .. })
        ));
        let mut vista = cluster("vista");
        assert_eq!(
            tunnel_spec(&vista, "terminus-2", &expand, &|| Ok(vista.network.pinggy.clone())).unwrap(),
            TunnelSpec::None
        );
        assert!(matches!(
            tunnel_spec(&vista, "openhands", &expand, &|| Ok(vista.network.pinggy.clone())),
            Err(SpecBuildError::NoPinggyBank { .. })
        ));
        let bank = "- {url: https://a.a.pinggy.link, token_secret: PINGGY_TOKEN_1}\n- {url: https://b.a.pinggy.link, token_secret: PINGGY_TOKEN_2, host: ap.pro.pinggy.io}\n";
        vista.network.pinggy = launch_spec::yaml::from_yaml_str(bank, Path::new("bank.yaml")).unwrap();
        let TunnelSpec::Pinggy(p) =
            tunnel_spec(&vista, "openhands", &expand, &|| Ok(vista.network.pinggy.clone())).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            (p.host.as_str(), p.public_url.as_str(), p.token_secret.as_str()),
            ("pro.pinggy.io", "https://a.a.pinggy.link", "PINGGY_TOKEN_1")
        );
        assert_eq!(p.bank.len(), 1);
        assert_eq!(p.bank[0].host.as_deref(), Some("ap.pro.pinggy.io"));
        assert_eq!(p.lock_dir.unwrap(), PathBuf::from("/s/eval_state/pinggy"));
        assert!(p.egress.is_none(), "vista has direct egress");
        // terminus-2 never tunnels, whatever the bank.
        assert_eq!(
            tunnel_spec(&vista, "terminus-2", &expand, &|| Ok(vista.network.pinggy.clone())).unwrap(),
            TunnelSpec::None
        );
    }

    #[test]
    fn post_run_reaches_the_spec_expanded_with_payloads_placeholders_kept() {
        let shipped = crate::testkit::Shipped::load();
        let root = &shipped.root;
        let mut local = cluster("local");
        let yaml = "argv: [\"${SUBMITTER_HOME}/bin/upload\", \"--dir={run_dir}\", \"DCAgent3/{run_tag}\"]\ntimeout_s: 120\nenvironment: otagent\nsecrets: [HF_TOKEN]\n";
        local.post_run = Some(launch_spec::yaml::from_yaml_str(yaml, Path::new("post_run.yaml")).unwrap());
        let preset = &shipped.preset("tb2");
        let context = shipped.builder(&local);
        let home = std::env::var("SUBMITTER_HOME").unwrap_or_else(|_| root.root.display().to_string());
        let spec = context.build(&"Qwen/Qwen3-8B".parse().unwrap(), preset, &SpecOverrides::default()).unwrap();
        let step = spec.post_run.as_ref().unwrap();
        assert_eq!(step.argv, [format!("{home}/bin/upload"), "--dir={run_dir}".into(), "DCAgent3/{run_tag}".into()]);
        assert_eq!((step.timeout_s, step.secrets.as_slice()), (120, ["HF_TOKEN".to_string()].as_slice()));
        assert_eq!(step.env_prefix, spec.harbor.env_prefix, "the otagent environment's prefix");
        let json = spec.to_json();
        assert_eq!(LaunchSpec::from_json(&json, Path::new("launch.json")).unwrap(), spec, "payload reads it back");
        let mut unset = local.clone();
        unset.post_run.as_mut().unwrap().argv.push("${NO_SUCH_VAR_FOR_POST_RUN}".into());
        let context = context.with_cluster(&unset);
        let err = context
            .build(&"Qwen/Qwen3-8B".parse().unwrap(), preset, &SpecOverrides::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("post_run.argv[3] uses ${NO_SUCH_VAR_FOR_POST_RUN}"), "{err}");
    }

    #[test]
    fn the_job_environment_is_resolved_at_submit_time() {
        let shipped = crate::testkit::Shipped::load();
        let mut local = cluster("local");
        local.engine.env.insert("SITE_CACHE".into(), "${SUBMITTER_HOME}/cache".into());
        local.engine.env.insert("TMPDIR".into(), "{job_scratch}/tmp".into());
        local.environments.get_mut("otagent").unwrap().env.insert("VLLM_USE_FLASHINFER_SAMPLER".into(), "0".into());
        local.engine.torchdynamo_disable_by_dp = true;
        local.paths.hf_cache = Some(PathBuf::from("${SUBMITTER_HOME}/hf"));
        local.network.internet = false;
        let preset = &shipped.preset("tb2");
        let context = shipped.builder(&local);
        let home = context.variable("SUBMITTER_HOME").unwrap();
        let spec = context.build(&"Qwen/Qwen3-8B".parse().unwrap(), preset, &SpecOverrides::default()).unwrap();
        let env = &spec.serve.env;
        assert_eq!(env["SITE_CACHE"], format!("{home}/cache"));
        assert_eq!(env["TMPDIR"], "{job_scratch}/tmp", "payload's placeholder is kept");
        assert_eq!(env["VLLM_USE_FLASHINFER_SAMPLER"], "0", "the environment's own variables");
        assert_eq!(env["HF_HUB_CACHE"], format!("{home}/hf"));
        assert_eq!(env["HF_HUB_OFFLINE"], "1");
        let dp = spec.serve.data_parallel_size;
        assert_eq!(env["TORCHDYNAMO_DISABLE"], if dp > 1 { "0" } else { "1" });
        assert!(spec.secrets.file.as_ref().is_some_and(|f| f.is_absolute()));
        for (value, want) in [
            ("${NO_SUCH_VAR_FOR_ENGINE_ENV}", "engine.env.BROKEN uses ${NO_SUCH_VAR_FOR_ENGINE_ENV}"),
            ("${SUBMITTER_HOME", "engine.env.BROKEN: unterminated `${`"),
        ] {
            let mut broken = local.clone();
            broken.engine.env.insert("BROKEN".into(), value.into());
            let context = context.with_cluster(&broken);
            let err = context
                .build(&"Qwen/Qwen3-8B".parse().unwrap(), preset, &SpecOverrides::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    /// Issue 31: the team's bank — pairs by number, their URLs from the secrets file (never the
    /// profile); the defaults unless `--pinggy-pair N` names one (a borrow-only pair only so).
    #[test]
    fn the_teams_pinggy_bank_gives_the_defaults_or_the_pair_asked_for() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clusters");
        let leo = crate::config::load_cluster(&dir, "leonardo").unwrap();
        let url_of = |name: &str| Ok(format!("https://{}.a.pinggy.link", name.to_lowercase()));
        let pairs = pinggy_pairs(&leo, None, &url_of).unwrap();
        let names: Vec<&str> = pairs.iter().map(|p| p.token_secret.as_str()).collect();
        assert_eq!(names, ["PINGGY_TOKEN_8", "PINGGY_TOKEN_9", "PINGGY_TOKEN_10"], "the defaults, nothing borrowed");
        assert_eq!(pairs[0].url, "https://pinggy_url_8.a.pinggy.link");
        let borrowed = pinggy_pairs(&leo, Some(3), &url_of).unwrap();
        assert_eq!((borrowed.len(), borrowed[0].token_secret.as_str()), (1, "PINGGY_TOKEN_3"));
        let err = pinggy_pairs(&leo, Some(11), &url_of).unwrap_err().to_string();
        assert!(err.contains("--pinggy-pair 11") && err.contains("defaults 8, 9, 10"), "{err}");
        let missing =
            |name: &str| Err(SpecBuildError::PinggyBank { cluster: "leonardo".into(), reason: format!("no {name}") });
        assert!(pinggy_pairs(&leo, None, &missing).unwrap_err().to_string().contains("PINGGY_URL_8"));
        let expand = |_: &str, p: &Path| Ok(p.to_path_buf());
        let text = describe_tunnel(&leo, "openhands", &expand, None).unwrap();
        assert!(text.contains("pairs 8, 9, 10") && text.contains("borrow-only 1, 2, 3, 4, 5, 6, 7"), "{text}");
        assert!(describe_tunnel(&leo, "openhands", &expand, Some(2)).unwrap().contains("pair 2 of the team's bank"));
    }
}
