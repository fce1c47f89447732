//! Presets, `presets/<name>.yaml` (docs/design.md §3.4): one benchmark setup, same keys and meaning as the
//! replaced system's presets, so its files load unchanged.

use std::path::PathBuf;

use serde::Deserialize;

pub use crate::verify::scoring::{Scoring, ScoringKind};

/// The Harbor agent a preset without `agent_name` runs.
pub const DEFAULT_AGENT: &str = "terminus-2";

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    /// Its name (the file stem; [`DATASETS_NAME`] for `--datasets`), set where it is loaded: the
    /// source `plan` names for the values it sets (crate::settings).
    #[serde(skip)]
    pub name: String,
    /// Dataset repos (`org/name`) or absolute task directories.
    pub datasets: Vec<String>,
    /// Short tag used in job names and logs (`tb2`, `v2`, `swebench`, …).
    #[serde(default)]
    pub log_suffix: Option<String>,
    #[serde(default)]
    pub n_concurrent: Option<u32>,
    #[serde(default)]
    pub n_attempts: Option<u32>,
    /// Operator override of the GPU-profile ceiling (rarely right in a preset; kept for compatibility).
    #[serde(default)]
    pub gpu_memory_util: Option<f64>,
    /// Retired: refused with the replacement (see [`retired`]).
    #[serde(default, deserialize_with = "retired::error_threshold")]
    pub error_threshold: (),
    #[serde(default, deserialize_with = "retired::vllm_max_retries")]
    pub vllm_max_retries: (),
    #[serde(default)]
    pub agent_parser: Option<String>,
    /// `key=value` kwargs; never thinking (thinking is per model).
    #[serde(default)]
    pub agent_kwargs: Vec<String>,
    #[serde(default)]
    pub auto_snapshot: Option<bool>,
    /// Harbor job config YAML, by file name (looked up in `presets/harbor/`) or path.
    #[serde(default)]
    pub(crate) config_yaml: Option<String>,
    /// Slurm `--time` for this leg (wins over the profile's `slurm.time`; `--time` wins over it).
    #[serde(default)]
    pub(crate) slurm_time: Option<String>,
    /// Slurm partition for this leg (wins over the profile's; `--partition` wins over it).
    #[serde(default)]
    pub(crate) slurm_partition: Option<String>,
    /// Slurm account for this leg (wins over the profile's; `--account` wins over it).
    #[serde(default)]
    pub(crate) slurm_account: Option<String>,
    #[serde(default, deserialize_with = "retired::tp_size")]
    pub tp_size: (),
    #[serde(default)]
    pub agent_name: Option<String>,
    #[serde(default, deserialize_with = "retired::sbatch_script")]
    pub sbatch_script: (),
    #[serde(default, deserialize_with = "retired::check_hf_exists")]
    pub check_hf_exists: (),
    /// An explicit Harbor job config (as `--harbor-config`): it runs instead of `config_yaml`, and
    /// its own `timeout_multiplier` is used as-is for every model (docs/design.md §4.3).
    #[serde(default)]
    pub harbor_config: Option<String>,
    /// `NAME` (copy the variable) or `NAME=SOURCE` (SOURCE's value, else the literal), comma-separated.
    #[serde(default)]
    pub agent_envs: Option<String>,
    /// `shared`: this leg may share one Slurm job (one engine) with the model's other shared legs;
    /// `per-leg`: its own job. `--allocation` wins; without either, the profile's `allocation`.
    #[serde(default)]
    pub allocation: Option<super::Allocation>,
    /// How its benchmark is scored ([`Scoring`]); undeclared: [`Scoring::UNDECLARED`] ([`Preset::scoring`]).
    #[serde(default)]
    pub scoring: Option<Scoring>,
}

/// Keys the replaced system's presets had that nothing here would read. Each is refused when the
/// preset loads (every command, and `registry check`) with the key that does the job now, so no
/// file silently means less than it says.
mod retired {
    macro_rules! retired {
        ($($key:ident => $fix:literal,)*) => {$(
            pub(super) fn $key<'de, D: serde::Deserializer<'de>>(_: D) -> Result<(), D::Error> {
                Err(serde::de::Error::custom(concat!("preset key `", stringify!($key), "` is retired: ", $fix)))
            }
        )*};
    }
    retired! {
        error_threshold => "the completion audit's bound is the cluster profile's `verify.max_error_share` (a share of trials): remove the key",
        vllm_max_retries => "payload polls vLLM's health until the profile's `engine.health_timeout_s`: remove the key",
        tp_size => "tensor parallelism is per model: set `tensor_parallel_size` in the model registry (model_config/)",
        check_hf_exists => "a model that cannot be fetched is not submitted when the profile's staging (`pre_download`) is on: remove the key",
        sbatch_script => "the batch script is the cluster profile's `slurm.script` (site setup in `slurm.prelude`): remove the key",
    }
}

/// The name of the preset `--datasets D…` builds (its leg's name).
pub(crate) const DATASETS_NAME: &str = "datasets";

impl Preset {
    /// A preset with only `datasets` (what `--datasets D…` selects): every other setting default.
    pub(crate) fn for_datasets(datasets: Vec<String>) -> Preset {
        Preset {
            name: DATASETS_NAME.to_string(),
            datasets,
            log_suffix: None,
            n_concurrent: None,
            n_attempts: None,
            gpu_memory_util: None,
            error_threshold: (),
            vllm_max_retries: (),
            agent_parser: None,
            agent_kwargs: Vec::new(),
            auto_snapshot: None,
            config_yaml: None,
            slurm_time: None,
            slurm_partition: None,
            slurm_account: None,
            tp_size: (),
            agent_name: None,
            sbatch_script: (),
            check_hf_exists: (),
            harbor_config: None,
            agent_envs: None,
            allocation: None,
            scoring: None,
        }
    }

    /// How its benchmark is scored: the declared `scoring`, else [`Scoring::UNDECLARED`].
    pub fn scoring(&self) -> Scoring {
        self.scoring.unwrap_or(Scoring::UNDECLARED)
    }

    /// The Harbor agent its jobs run (`agent_name`, default terminus-2).
    pub fn agent(&self) -> &str {
        self.agent_name.as_deref().unwrap_or(DEFAULT_AGENT)
    }

    /// The benchmark name of a dataset: its repo basename (`DCAgent2/terminal_bench_2` → `terminal_bench_2`).
    pub(crate) fn benchmark_of(dataset: &str) -> String {
        dataset.trim_end_matches('/').rsplit('/').next().unwrap_or(dataset).to_string()
    }

    pub fn agent_envs(&self) -> Vec<launch_spec::spec::AgentEnv> {
        self.agent_envs
            .iter()
            .flat_map(|list| list.split(','))
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| match item.split_once('=') {
                Some((name, source)) => launch_spec::spec::AgentEnv {
                    name: name.to_string(),
                    from: Some(source.to_string()),
                    value: Some(source.to_string()),
                },
                None => {
                    launch_spec::spec::AgentEnv { name: item.to_string(), from: Some(item.to_string()), value: None }
                }
            })
            .collect()
    }

    /// Problems within the preset, and a Harbor job config it names missing from `harbor_dir`
    /// (without one, the size band's canonical config runs: `registry check` checks those).
    pub(crate) fn problems_with(&self, harbor_dir: &std::path::Path) -> Vec<String> {
        let mut problems = self.problems();
        for (key, name) in [("config_yaml", &self.config_yaml), ("harbor_config", &self.harbor_config)] {
            let Some(name) = name else { continue };
            let path = harbor_config_path(harbor_dir, name);
            if !path.is_file() {
                problems.push(format!("{key} `{name}` not found (looked for {})", path.display()));
            }
        }
        problems
    }

    pub fn problems(&self) -> Vec<String> {
        use launch_spec::validate as v;
        let mut problems = Vec::new();
        for (field, value) in [("n_concurrent", self.n_concurrent), ("n_attempts", self.n_attempts)] {
            if let Some(value) = value
                && let Err(problem) = v::count_up_to(value.into(), v::MAX_CONCURRENT)
            {
                problems.push(format!("{field} {problem}"));
            }
        }
        for env in self.agent_envs() {
            let valid = |name: &str| {
                !name.is_empty()
                    && !name.starts_with(|c: char| c.is_ascii_digit())
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            };
            if !valid(&env.name) || env.from.as_deref().is_some_and(|from| from.is_empty()) {
                problems.push(format!(
                    "agent_envs item `{}` is not NAME or NAME=SOURCE with NAME a variable name ([A-Za-z_][A-Za-z0-9_]*)",
                    env.name
                ));
            }
        }
        if self.datasets.is_empty() {
            problems.push("datasets is empty: name at least one dataset".to_string());
        }
        problems.extend(self.scoring.as_ref().and_then(Scoring::problem).map(str::to_string));
        for kwarg in &self.agent_kwargs {
            if !kwarg.contains('=') {
                problems.push(format!("agent_kwargs item `{kwarg}` is not key=value"));
            }
            if kwarg.contains("enable_thinking") {
                problems
                    .push(format!("agent_kwargs item `{kwarg}`: thinking is per model (registry), never in a preset"));
            }
        }
        if let Some(util) = self.gpu_memory_util
            && let Err(problem) = v::fraction(util)
        {
            problems.push(format!("gpu_memory_util {problem}"));
        }
        if let Some(time) = &self.slurm_time
            && super::parse_slurm_time(time).is_none()
        {
            problems.push(format!("slurm_time `{time}` is not a Slurm time"));
        }
        for (field, value) in [("slurm_partition", &self.slurm_partition), ("slurm_account", &self.slurm_account)] {
            if value.as_deref().is_some_and(|v| v.is_empty() || v.chars().any(|c| c.is_whitespace() || c.is_control()))
            {
                problems.push(format!("{field} must be a Slurm name (no spaces), or leave it out"));
            }
        }
        problems
    }
}

/// A Harbor job config named in a preset or on the command line: a path as given when absolute,
/// else a file in `presets/harbor/`.
pub(crate) fn harbor_config_path(harbor_dir: &std::path::Path, name: &str) -> PathBuf {
    if std::path::Path::new(name).is_absolute() { PathBuf::from(name) } else { harbor_dir.join(name) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preset(yaml: &str) -> Result<Preset, launch_spec::yaml::YamlError> {
        launch_spec::yaml::from_yaml_str::<Preset>(yaml, std::path::Path::new("presets/p.yaml"))
    }

    /// Issue 34: a preset declares its scoring; one that does not (the replaced system's presets)
    /// loads and is scored as [`Scoring::UNDECLARED`]; a ranked partial-credit one and an unknown key
    /// are refused with the fix.
    #[test]
    fn scoring_is_declared_by_the_preset_or_undeclared() {
        let declared = preset("datasets: [org/b]\nscoring:\n  kind: binary\n  ranked: true\n").unwrap();
        assert_eq!(declared.scoring(), Scoring { kind: ScoringKind::Binary, in_id_mean: false, ranked: true });
        assert!(declared.problems().is_empty(), "{:?}", declared.problems());
        let undeclared = preset("datasets: [org/b]\n").unwrap();
        assert_eq!((undeclared.scoring, undeclared.scoring()), (None, Scoring::UNDECLARED));
        let ranked_partial = preset("datasets: [org/b]\nscoring: {kind: partial_credit, ranked: true}\n").unwrap();
        assert!(
            ranked_partial.problems().iter().any(|p| p.contains("needs `kind: binary`")),
            "{:?}",
            ranked_partial.problems()
        );
        for bad in ["scoring: {kind: binary, rank: true}", "scoring: {in_id_mean: true}", "scoring: {kind: graded}"] {
            let err = preset(&format!("datasets: [org/b]\n{bad}\n")).unwrap_err().to_string();
            assert!(err.contains("p.yaml") && err.lines().count() == 1, "{bad}: {err}");
        }
    }

    /// Every shipped preset says how its benchmark is scored.
    #[test]
    fn every_shipped_preset_declares_its_scoring() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../presets");
        let presets = crate::config::load_presets(&dir).unwrap();
        assert!(presets.len() > 5);
        for (name, _, preset) in presets {
            assert!(preset.scoring.is_some(), "presets/{name}.yaml declares no `scoring:`");
        }
    }
}
