//! One resolver per setting (docs/design.md, "Settings: one resolver"): every setting of one job —
//! (cluster, preset, the operator's command line, model) — is settled here once, by the one
//! precedence of [`launch_spec::settings::Layers`] (command line > preset > profile > GPU profile >
//! default), and kept with its [`Source`] so `plan` can say where each value came from. `spec_build`,
//! `queue` and the planner read [`ResolvedSettings`]; none of them re-decides. Pure: the caller
//! loads the files.

use std::path::{Path, PathBuf};

pub(crate) use launch_spec::settings::{Layers, Source, Sourced, at, first_set};

use crate::config::preset::harbor_config_path;
use crate::config::{Allocation, ClusterProfile, Preset};
use crate::queue::{SlurmChoice, SlurmOverrides};
use crate::registry::{Resolved, TimeoutSource};

/// Operator choices on the command line; they win over registry, preset and cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecOverrides {
    pub timeout_multiplier: Option<f64>,
    pub agent_kwargs: Vec<String>,
    pub gpu_memory_utilization: Option<f64>,
    /// Harbor's concurrency for this leg (still clamped to the profile's ceiling).
    pub n_concurrent: Option<u32>,
    /// The Harbor job config (`--harbor-config`): a file in `presets/harbor/` or a path; explicit,
    /// so it wins over the preset's and its own `timeout_multiplier` is used (docs/design.md §4.3).
    pub harbor_config: Option<String>,
    /// The base Harbor job config (`--config-yaml`), replacing the preset's `config_yaml`: not a
    /// timeout source.
    pub(crate) config_yaml: Option<String>,
    /// Harbor's agent parser (`--agent-parser`); wins over the preset's `agent_parser`.
    pub agent_parser: Option<String>,
    /// The output-token budget (`--max-output-tokens`); wins over the registry's.
    pub max_output_tokens: Option<u64>,
    /// One of the preset's datasets; default the first.
    pub dataset: Option<String>,
    /// `--pinggy-pair N`: this pair of the team's bank alone (a borrow-only pair too).
    pub(crate) pinggy_pair: Option<u32>,
}

/// Harbor's attempts per task when the preset sets none.
pub(crate) const DEFAULT_N_ATTEMPTS: u32 = 3;

/// The operator's command line for one leg.
#[derive(Debug, Clone, Copy)]
pub struct Choices<'a> {
    /// The spec options (`--n-concurrent` already narrowed to the leg, `--gpu-memory-utilization`, …).
    pub spec: &'a SpecOverrides,
    pub slurm: &'a SlurmOverrides,
    /// `--allocation`.
    pub allocation: Option<Allocation>,
}

/// No Slurm options, no `--allocation`: what `submitter spec` resolves with.
static NO_SLURM: SlurmOverrides =
    SlurmOverrides { partition: None, account: None, qos: None, reservation: None, time: None, exclude: None };

impl<'a> Choices<'a> {
    /// Only the spec options (`submitter spec`, which submits nothing).
    pub(crate) fn spec_only(spec: &'a SpecOverrides) -> Choices<'a> {
        Choices { spec, slurm: &NO_SLURM, allocation: None }
    }
}

/// Everything the resolver reads for one job; loaded by the caller (`SpecBuilder::settings`).
pub struct Levels<'a> {
    pub cluster: &'a ClusterProfile,
    /// The preset's name (its file stem, or `datasets`), for the source.
    pub(crate) preset_name: &'a str,
    pub preset: &'a Preset,
    pub choices: Choices<'a>,
    /// The GPU profile the profile's `hardware.gpu_name`/`gpu_memory_gib` match, when it names them
    /// ([`gpu_profile_for`]); payload matches the GPUs it finds on the node.
    pub gpu_profile: Option<&'a launch_spec::GpuProfile>,
    /// `presets/harbor`.
    pub harbor_configs_dir: &'a Path,
    /// The model's size band's canonical Harbor config (`_timeouts.yaml`), the last resort.
    pub(crate) size_band_config: String,
    /// The model's registry resolution, when it resolves (the timeout, the output-token budget).
    pub registry: Option<&'a Resolved>,
    pub model: &'a str,
}

/// One job's settings, each with where it came from.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ResolvedSettings {
    /// Harbor's concurrency, after `limits.n_concurrent_ceiling`.
    pub n_concurrent: Sourced<u32>,
    /// What the ceiling capped it from, when it did.
    #[serde(skip)]
    pub(crate) n_concurrent_capped_from: Option<u32>,
    pub n_attempts: Sourced<u32>,
    /// vLLM's GPU-memory ceiling; `None` when nothing below payload sets it (payload's GPU profile).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_memory_utilization: Option<Sourced<f64>>,
    /// The Harbor job config as its level names it (a file in `presets/harbor/`, or a path).
    #[serde(rename = "harbor_config")]
    pub(crate) harbor_config_name: Sourced<String>,
    /// The same, as a path.
    #[serde(skip)]
    pub harbor_config: Sourced<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_multiplier: Option<Sourced<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_parser: Option<Sourced<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<Sourced<u64>>,
    pub partition: Sourced<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<Sourced<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<Sourced<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation: Option<Sourced<String>>,
    /// `--time`, no longer than the partition's limit ([`ResolvedSettings::cap_time`]).
    pub time: Sourced<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exclude: Option<Sourced<String>>,
    /// The serving environment: the model's registry `conda_env`, else the profile's
    /// `engine.default_environment`.
    pub engine_environment: Sourced<String>,
    #[serde(serialize_with = "allocation_text")]
    pub allocation: Sourced<Allocation>,
}

fn allocation_text<S: serde::Serializer>(a: &Sourced<Allocation>, serializer: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&a.clone().map(Allocation::as_str), serializer)
}

impl ResolvedSettings {
    pub fn resolve(levels: &Levels) -> ResolvedSettings {
        let Levels { cluster, preset, choices, .. } = levels;
        let preset_src = || Source::Preset(levels.preset_name.to_string());
        let profile = || Source::Profile(cluster.name.clone());
        let slurm = &cluster.slurm;
        let cli = choices.spec;
        let n_concurrent = Layers {
            cli: at(cli.n_concurrent, Source::Cli),
            preset: at(preset.n_concurrent, preset_src()),
            profile: at(Some(cluster.limits.n_concurrent), profile()),
            gpu_profile: None,
        }
        .or_default(cluster.limits.n_concurrent);
        let asked = n_concurrent.value;
        let n_concurrent = cap(n_concurrent, cluster.limits.n_concurrent_ceiling, profile());
        let n_concurrent_capped_from = (n_concurrent.value != asked).then_some(asked);
        let gpu_memory_utilization = Layers {
            cli: at(cli.gpu_memory_utilization, Source::Cli),
            preset: at(preset.gpu_memory_util, preset_src()),
            profile: at(cluster.hardware.gpu_memory_utilization, profile()),
            gpu_profile: levels.gpu_profile.map(|p| (p.gpu_memory_utilization, Source::GpuProfile(p.name.clone()))),
        }
        .resolve()
        .map(|mut g| {
            if matches!(g.source, Source::GpuProfile(_)) {
                // Matched from the profile's hardware; payload matches the GPUs on the node.
                g.note = Some("payload matches the node's GPUs".into());
            }
            g
        });
        // The explicit configs (whose own timeout_multiplier is used) before the base ones.
        let harbor_config_name = explicit_harbor_config(cli, preset)
            .or_else(|| {
                Layers {
                    cli: at(cli.config_yaml.clone(), Source::Cli),
                    preset: at(preset.config_yaml.clone(), preset_src()),
                    ..Layers::default()
                }
                .resolve()
            })
            .unwrap_or_else(|| {
                Sourced::new(levels.size_band_config.clone(), Source::Registry("_timeouts.yaml size band".into()))
            });
        let harbor_config = harbor_config_name.clone().map(|name| harbor_config_path(levels.harbor_configs_dir, &name));
        let timeout_multiplier = levels.registry.map(|resolved| {
            let source = match resolved.timeout_source {
                TimeoutSource::Cli => Source::Cli,
                TimeoutSource::HarborConfig => Source::HarborConfig(harbor_config_name.value.clone()),
                TimeoutSource::Registry => Source::Registry(levels.model.to_string()),
                TimeoutSource::Size => Source::Registry("_timeouts.yaml size band".into()),
                TimeoutSource::Fallback => Source::Registry("_timeouts.yaml fallback".into()),
            };
            Sourced::new(resolved.timeout_multiplier, source)
        });
        let agent_parser = Layers {
            cli: at(cli.agent_parser.clone(), Source::Cli),
            preset: at(preset.agent_parser.clone(), preset_src()),
            ..Layers::default()
        }
        .resolve()
        // An empty parser is none (Harbor's own default).
        .filter(|p| !p.value.is_empty());
        let max_output_tokens = first_set([
            (cli.max_output_tokens, Source::Cli),
            (levels.registry.and_then(|r| r.max_output_tokens), Source::Registry(levels.model.to_string())),
        ]);
        let choice = choices.slurm;
        let partition = Layers {
            cli: at(choice.partition.clone(), Source::Cli),
            preset: at(preset.slurm_partition.clone(), preset_src()),
            profile: at(Some(slurm.partition.clone()), profile()),
            gpu_profile: None,
        }
        .or_default(slurm.partition.clone());
        let account = Layers {
            cli: at(choice.account.clone(), Source::Cli),
            preset: at(preset.slurm_account.clone(), preset_src()),
            profile: at(slurm.account.clone(), profile()),
            gpu_profile: None,
        }
        .resolve();
        // `--reservation ''` / `--no-reservation` (an empty name) clears the profile's; the same
        // for `--qos ''` and `--exclude ''`.
        let cli_or_profile = |cli: &Option<String>, profile_value: &Option<String>| {
            Layers {
                cli: at(cli.clone(), Source::Cli),
                profile: at(profile_value.clone(), profile()),
                ..Layers::default()
            }
            .resolve()
            .filter(|r| !r.value.is_empty())
        };
        let reservation = cli_or_profile(&choice.reservation, &slurm.reservation);
        let qos = cli_or_profile(&choice.qos, &slurm.qos);
        let exclude = cli_or_profile(&choice.exclude, &slurm.exclude);
        let time = Layers {
            cli: at(choice.time.clone(), Source::Cli),
            preset: at(preset.slurm_time.clone(), preset_src()),
            profile: at(Some(slurm.time.clone()), profile()),
            gpu_profile: None,
        }
        .or_default(slurm.time.clone());
        let allocation = Layers {
            cli: at(choices.allocation, Source::Cli),
            preset: at(preset.allocation, preset_src()),
            profile: at(cluster.allocation, profile()),
            gpu_profile: None,
        }
        .or_default(Allocation::PerLeg);
        let engine_environment = first_set([
            (levels.registry.and_then(|r| r.conda_env.clone()), Source::Registry(levels.model.to_string())),
            (Some(cluster.engine.default_environment.clone()), profile()),
        ])
        .unwrap_or_else(|| Sourced::new(cluster.engine.default_environment.clone(), profile()));
        ResolvedSettings {
            engine_environment,
            n_concurrent,
            n_concurrent_capped_from,
            n_attempts: Layers { preset: at(preset.n_attempts, preset_src()), ..Layers::default() }
                .or_default(DEFAULT_N_ATTEMPTS),
            gpu_memory_utilization,
            harbor_config_name,
            harbor_config,
            timeout_multiplier,
            agent_parser,
            max_output_tokens,
            partition,
            account,
            qos,
            reservation,
            time,
            exclude,
            allocation,
        }
    }

    /// `--time` no longer than `max_s`, the partition's limit (`MaxTime`, from `source`): a capped
    /// value says what it was capped from (never a silent cap), and Slurm would refuse it uncapped.
    pub(crate) fn cap_time(&mut self, max_s: u64, source: &str) {
        let asked = crate::config::parse_slurm_time(&self.time.value);
        if asked.is_some_and(|asked| asked > max_s) {
            let capped = crate::queue::format_slurm_time(max_s);
            self.time.note = Some(format!("{source}; capped from {}", self.time.value));
            self.time.value = capped;
        }
    }

    /// The spec's own `serve.gpu_memory_utilization`: the operator's (command line or preset)
    /// only; the profile's goes into `cluster_gpu_memory_utilization` and the GPU profile's is
    /// payload's to match, so payload's rule (`launch_spec::gpu`) ends where this one does.
    pub(crate) fn spec_gpu_memory_utilization(&self) -> Option<f64> {
        self.gpu_memory_utilization
            .as_ref()
            .filter(|g| matches!(g.source, Source::Cli | Source::Preset(_)))
            .map(|g| g.value)
    }

    /// Slurm's `--partition`, `--account`, `--qos`, `--reservation`, `--time` and `--exclude` for
    /// the job: what preflight checks, `plan` prints and sbatch gets.
    pub(crate) fn slurm_choice(&self) -> SlurmChoice {
        let value = |s: &Option<Sourced<String>>| s.as_ref().map(|s| s.value.clone());
        SlurmChoice {
            partition: self.partition.value.clone(),
            account: value(&self.account),
            qos: value(&self.qos),
            reservation: value(&self.reservation),
            time: self.time.value.clone(),
            exclude: value(&self.exclude),
        }
    }

    /// `name value (source)` for each setting, in a fixed order (`plan`'s `settings` line).
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![
            format!("n_concurrent {}", self.n_concurrent.describe()),
            format!("n_attempts {}", self.n_attempts.describe()),
        ];
        if let Some(g) = &self.gpu_memory_utilization {
            out.push(format!("gpu_memory_utilization {}", g.describe()));
        }
        out.push(format!("harbor_config {}", self.harbor_config_name.describe()));
        if let Some(t) = &self.timeout_multiplier {
            out.push(format!("timeout_multiplier {}", t.describe_with(|v| format!("{v:.1}"))));
        }
        if let Some(p) = &self.agent_parser {
            out.push(format!("agent_parser {}", p.describe()));
        }
        if let Some(m) = &self.max_output_tokens {
            out.push(format!("max_output_tokens {}", m.describe()));
        }
        out.push(format!("partition {}", self.partition.describe()));
        if let Some(a) = &self.account {
            out.push(format!("account {}", a.describe()));
        }
        if let Some(q) = &self.qos {
            out.push(format!("qos {}", q.describe()));
        }
        if let Some(r) = &self.reservation {
            out.push(format!("reservation {}", r.describe()));
        }
        out.push(format!("time {}", self.time.describe()));
        if let Some(x) = &self.exclude {
            out.push(format!("exclude {}", x.describe()));
        }
        out.push(format!("engine_environment {}", self.engine_environment.describe()));
        out.push(format!("allocation {}", self.allocation.describe_with(|a| a.as_str().to_string())));
        out
    }
}

/// A partition's walltime limit: the smaller of Slurm's `MaxTime` (`slurm`, as `scontrol` writes
/// it; asked once per iteration by the caller) and the profile's `slurm.max_time` (the site's published limit, for when
/// Slurm does not say), with where it came from.
pub(crate) fn partition_limit(cluster: &ClusterProfile, partition: &str, slurm: Option<&str>) -> Option<(u64, String)> {
    let slurm = slurm.and_then(crate::config::parse_slurm_time);
    let profile = cluster.slurm.max_time.as_deref().and_then(crate::config::parse_slurm_time);
    let from_slurm = slurm.map(|s| (s, format!("partition {partition}'s MaxTime (Slurm)")));
    let from_profile = profile.map(|s| (s, format!("slurm.max_time (profile {})", cluster.name)));
    [from_slurm, from_profile].into_iter().flatten().min_by_key(|(s, _)| *s)
}

/// The leg dataset: `--dataset` (one of the preset's datasets), else the preset's first. The error
/// is the dataset asked for, and the preset's list.
pub(crate) fn dataset(cli: Option<&str>, preset: &Preset) -> Result<Sourced<String>, (String, String)> {
    match cli {
        Some(d) if preset.datasets.iter().any(|known| known == d) => Ok(Sourced::new(d.to_string(), Source::Cli)),
        Some(d) => Err((d.to_string(), preset.datasets.join(", "))),
        None => {
            Ok(Sourced::new(preset.datasets.first().cloned().unwrap_or_default(), Source::Preset(preset.name.clone())))
        }
    }
}

/// The explicit Harbor job config (`--harbor-config`, else the preset's `harbor_config`), whose own
/// `timeout_multiplier` is used (docs/design.md §4.3); the first levels of `harbor_config`.
pub(crate) fn explicit_harbor_config(cli: &SpecOverrides, preset: &Preset) -> Option<Sourced<String>> {
    Layers {
        cli: at(cli.harbor_config.clone(), Source::Cli),
        preset: at(preset.harbor_config.clone(), Source::Preset(preset.name.clone())),
        ..Layers::default()
    }
    .resolve()
}

/// `value` no higher than `ceiling` (the profile's): a capped value's source is the ceiling's,
/// with what it was capped from in the note (never a silent cap, issue 20).
fn cap(value: Sourced<u32>, ceiling: Option<u32>, ceiling_source: Source) -> Sourced<u32> {
    match ceiling {
        Some(ceiling) if value.value > ceiling => Sourced {
            value: ceiling,
            note: Some(format!("limits.n_concurrent_ceiling; capped from {} ({})", value.value, value.source)),
            source: ceiling_source,
        },
        _ => value,
    }
}

/// The GPU profile the cluster's GPUs match, from the profile's `hardware.gpu_name` and
/// `gpu_memory_gib` (both optional: payload matches the GPUs it finds on the node).
pub(crate) fn gpu_profile_for<'a>(
    cluster: &ClusterProfile,
    profiles: &'a launch_spec::GpuProfiles,
) -> Option<&'a launch_spec::GpuProfile> {
    profiles.select(&predicted_gpu(cluster)?)
}

/// The GPU the profile describes (`hardware.gpu_name`, `gpu_memory_gib`), as payload would probe it.
pub(crate) fn predicted_gpu(cluster: &ClusterProfile) -> Option<launch_spec::GpuInfo> {
    let hardware = &cluster.hardware;
    let gib = hardware.gpu_memory_gib?;
    Some(launch_spec::GpuInfo {
        index: 0,
        uuid: String::new(),
        name: hardware.gpu_name.clone().unwrap_or_default(),
        memory_total_bytes: (gib * (1u64 << 30) as f64) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn levels<'a>(cluster: &'a ClusterProfile, preset: &'a Preset, choices: Choices<'a>) -> Levels<'a> {
        Levels {
            cluster,
            preset_name: "tb2",
            preset,
            choices,
            gpu_profile: None,
            harbor_configs_dir: Path::new("/h"),
            size_band_config: "band.yaml".into(),
            registry: None,
            model: "org/M-8B",
        }
    }

    fn cluster() -> ClusterProfile {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clusters");
        let mut cluster = crate::config::load_cluster(&dir, "local").unwrap();
        cluster.limits.n_concurrent_ceiling = None;
        cluster
    }

    /// Each setting with a command-line, a preset and a profile level shows each source in turn,
    /// and the order between them is the one precedence.
    #[test]
    fn each_level_wins_over_the_ones_after_it_and_says_so() {
        let mut cluster = cluster();
        cluster.hardware.gpu_memory_utilization = Some(0.8);
        cluster.slurm.account = Some("acct-profile".into());
        cluster.allocation = Some(Allocation::Shared);
        let mut preset = Preset::for_datasets(vec!["org/d".into()]);
        let none = SpecOverrides::default();
        let no_slurm = SlurmOverrides::default();
        let got = ResolvedSettings::resolve(&levels(&cluster, &preset, Choices::spec_only(&none)));
        assert_eq!(got.n_concurrent.describe(), format!("{} (profile local)", cluster.limits.n_concurrent));
        assert_eq!(got.gpu_memory_utilization.as_ref().unwrap().describe(), "0.8 (profile local)");
        assert_eq!(got.spec_gpu_memory_utilization(), None, "the profile's goes to the spec's cluster field");
        assert_eq!(got.account.unwrap().describe(), "acct-profile (profile local)");
        assert_eq!(got.allocation.source, Source::Profile("local".into()));
        assert_eq!(got.n_attempts.describe(), "3 (default)");
        assert_eq!(got.harbor_config.source, Source::Registry("_timeouts.yaml size band".into()));
        preset.n_concurrent = Some(8);
        preset.gpu_memory_util = Some(0.7);
        preset.slurm_account = Some("acct-preset".into());
        preset.allocation = Some(Allocation::PerLeg);
        preset.config_yaml = Some("base.yaml".into());
        let got = ResolvedSettings::resolve(&levels(&cluster, &preset, Choices::spec_only(&none)));
        assert_eq!(got.n_concurrent.describe(), "8 (preset tb2)");
        assert_eq!(got.gpu_memory_utilization.as_ref().unwrap().describe(), "0.7 (preset tb2)");
        assert_eq!(got.spec_gpu_memory_utilization(), Some(0.7));
        assert_eq!(got.account.unwrap().describe(), "acct-preset (preset tb2)");
        assert_eq!(got.allocation.describe_with(|a| a.as_str().to_string()), "per-leg (preset tb2)");
        assert_eq!(got.harbor_config.value, PathBuf::from("/h/base.yaml"));
        let cli = SpecOverrides {
            n_concurrent: Some(2),
            gpu_memory_utilization: Some(0.6),
            harbor_config: Some("explicit.yaml".into()),
            ..SpecOverrides::default()
        };
        let slurm = SlurmOverrides { account: Some("acct-cli".into()), ..no_slurm };
        let choices = Choices { spec: &cli, slurm: &slurm, allocation: Some(Allocation::Shared) };
        let got = ResolvedSettings::resolve(&levels(&cluster, &preset, choices));
        assert_eq!(got.n_concurrent.describe(), "2 (command line)");
        assert_eq!(got.gpu_memory_utilization.unwrap().describe(), "0.6 (command line)");
        assert_eq!(got.account.unwrap().describe(), "acct-cli (command line)");
        assert_eq!(got.allocation.describe_with(|a| a.as_str().to_string()), "shared (command line)");
        assert_eq!(got.harbor_config.describe_with(|p| p.display().to_string()), "/h/explicit.yaml (command line)");
    }

    /// The ceiling caps whatever level set the value, and says what it capped; an empty
    /// `--reservation` clears the profile's.
    #[test]
    fn the_profile_ceiling_caps_and_an_empty_reservation_clears() {
        let mut cluster = cluster();
        cluster.limits.n_concurrent_ceiling = Some(4);
        cluster.slurm.reservation = Some("eval".into());
        let mut preset = Preset::for_datasets(vec!["org/d".into()]);
        preset.n_concurrent = Some(64);
        let none = SpecOverrides::default();
        let got = ResolvedSettings::resolve(&levels(&cluster, &preset, Choices::spec_only(&none)));
        assert_eq!(
            got.n_concurrent.describe(),
            "4 (profile local; limits.n_concurrent_ceiling; capped from 64 (preset tb2))"
        );
        assert_eq!(got.reservation.unwrap().describe(), "eval (profile local)");
        let clear = SlurmOverrides { reservation: Some(String::new()), ..SlurmOverrides::default() };
        let got = ResolvedSettings::resolve(&levels(
            &cluster,
            &preset,
            Choices { spec: &none, slurm: &clear, allocation: None },
        ));
        assert_eq!(got.reservation, None);
        assert_eq!(got.slurm_choice().reservation, None);
    }

    /// `--dataset` picks one of the preset's datasets and nothing else; without it, the first.
    #[test]
    fn the_dataset_is_the_command_lines_if_the_preset_has_it_else_the_first() {
        let preset = Preset::for_datasets(vec!["org/a".into(), "org/b".into()]);
        assert_eq!(dataset(None, &preset).unwrap().describe(), "org/a (preset datasets)");
        assert_eq!(dataset(Some("org/b"), &preset).unwrap().describe(), "org/b (command line)");
        assert_eq!(dataset(Some("org/c"), &preset).unwrap_err(), ("org/c".into(), "org/a, org/b".into()));
    }

    /// The GPU profile the profile's hardware matches is the last level before payload's own.
    #[test]
    fn the_gpu_profile_is_the_last_level() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clusters");
        let leonardo = crate::config::load_cluster(&dir, "leonardo").unwrap();
        let profiles = crate::config::load_gpu_profiles(&dir).unwrap();
        let Some(gpu) = gpu_profile_for(&leonardo, &profiles) else {
            panic!("leonardo's profile names its GPUs (hardware.gpu_name, gpu_memory_gib)")
        };
        let mut cluster = leonardo.clone();
        cluster.hardware.gpu_memory_utilization = None;
        let preset = Preset::for_datasets(vec!["org/d".into()]);
        let none = SpecOverrides::default();
        let mut l = levels(&cluster, &preset, Choices::spec_only(&none));
        l.gpu_profile = Some(gpu);
        let got = ResolvedSettings::resolve(&l).gpu_memory_utilization.unwrap();
        assert_eq!(got.source, Source::GpuProfile(gpu.name.clone()));
        // The same value payload's rule picks for that GPU with no override.
        let payload = launch_spec::gpu::effective_gpu_memory_utilization(None, None, Some(gpu)).unwrap();
        assert_eq!(got.value, payload.0);
    }
}
