//! `submitter registry check`: lints registry, patterns, presets, GPU and cluster profiles together
//! and lists every problem (errors fail the check; warnings explain surprising but kept semantics).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use launch_spec::yaml::from_yaml_file;
use regex::Regex;

use crate::config::{self, ClusterProfile, Preset};
use crate::registry::files::{ModelFile, PatternsFile, ServeFields};
use crate::registry::{PATTERNS_FILE, Registry};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Severity {
    Warning,
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    pub(crate) severity: Severity,
    /// `file` or `file:line:col` or a logical place (`cluster leonardo`).
    pub place: String,
    pub message: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let level = match self.severity {
            Severity::Warning => "warning",
            Severity::Error => "error",
        };
        write!(f, "{level}: {}: {}", self.place, self.message)
    }
}

pub(crate) struct LintInputs<'a> {
    pub registry: &'a Path,
    pub clusters: &'a Path,
    pub presets: &'a Path,
}

#[derive(Default)]
struct Findings(Vec<Finding>);

impl Findings {
    fn error(&mut self, place: impl ToString, message: impl ToString) {
        self.0.push(Finding { severity: Severity::Error, place: place.to_string(), message: message.to_string() });
    }
    fn warn(&mut self, place: impl ToString, message: impl ToString) {
        self.0.push(Finding { severity: Severity::Warning, place: place.to_string(), message: message.to_string() });
    }
}

/// Runs every check; never stops at the first problem.
pub(crate) fn check(inputs: &LintInputs) -> Vec<Finding> {
    let mut findings = Findings::default();
    check_registry_files(inputs.registry, &mut findings);
    let clusters = check_clusters(inputs.clusters, &mut findings);
    let presets = check_presets(inputs.presets, &mut findings);
    check_scorings(&presets, &mut findings);
    check_tunnels(&presets, &clusters, &mut findings);
    // Cross-file checks need a registry that loads.
    match Registry::load(inputs.registry) {
        Ok(registry) => {
            let gpu_profiles = config::load_gpu_profiles(inputs.clusters).ok();
            check_against_clusters(&registry, &clusters, gpu_profiles.as_ref(), &mut findings);
            check_timeouts(&registry, &inputs.presets.join("harbor"), &mut findings);
        }
        Err(err) => {
            findings.error(inputs.registry.display(), format!("registry does not load, cross-checks skipped: {err}"))
        }
    }
    findings.0.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.place.cmp(&b.place)));
    findings.0
}

fn check_registry_files(root: &Path, findings: &mut Findings) {
    let Ok(orgs) = std::fs::read_dir(root) else {
        findings.error(root.display(), "cannot read the registry directory");
        return;
    };
    let mut files: Vec<PathBuf> = orgs
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir() && !p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(['_', '.'])))
        .flat_map(|org| std::fs::read_dir(org).into_iter().flatten().filter_map(|e| e.ok().map(|e| e.path())))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    let mut seen_ids: std::collections::HashMap<String, PathBuf> = std::collections::HashMap::new();
    for file in &files {
        if file.extension().is_some_and(|e| e == "yml") {
            findings.warn(file.display(), "`.yml` files are not read: rename to `.yaml`");
            continue;
        }
        match from_yaml_file::<ModelFile>(file) {
            Err(err) => findings.error(file.display(), err.message.clone() + &location_suffix(&err)),
            Ok(model) => {
                let Some(id) = model.model.clone() else {
                    findings.warn(file.display(), "no `model:` key: the file is skipped");
                    continue;
                };
                // `X@P` is a standalone for profile P (docs/design.md §4.1): X must be an id.
                let bare = crate::registry::split_standalone(&id).map_or(id.as_str(), |(bare, _)| bare);
                if let Err(problem) = launch_spec::ModelId::new(bare) {
                    findings.error(file.display(), format!("`model`: {problem}"));
                }
                if let Some(previous) = seen_ids.insert(id.clone(), file.clone()) {
                    findings.warn(
                        file.display(),
                        format!(
                            "model `{id}` is also declared in {}; this later file wins wholesale",
                            previous.display()
                        ),
                    );
                }
                let eval = model.subsystems.as_ref().and_then(|s| s.eval.clone()).unwrap_or_default();
                check_fields(&file.display().to_string(), &model.serve_fields(), findings);
                check_fields(&format!("{} (subsystems.eval)", file.display()), &eval.serve_fields(), findings);
                for (profile, variant) in eval.variants.iter().flatten() {
                    let place = format!("{} (variants.{profile})", file.display());
                    check_fields(&place, &variant.serve_fields(), findings);
                    let base = model.serve_fields().overlaid_with(&eval.serve_fields());
                    let dropped: Vec<&str> = [
                        ("tool_call_parser", base.tool_call_parser.is_some() && variant.tool_call_parser.is_none()),
                        ("reasoning_parser", base.reasoning_parser.is_some() && variant.reasoning_parser.is_none()),
                        ("agent_kwargs", base.agent_kwargs.is_some() && variant.agent_kwargs.is_none()),
                        ("conda_env", base.conda_env.is_some() && variant.conda_env.is_none()),
                    ]
                    .into_iter()
                    .filter_map(|(name, lost)| lost.then_some(name))
                    .collect();
                    if !dropped.is_empty() {
                        findings.warn(
                            place,
                            format!("the variant replaces the entry wholesale and drops {}", dropped.join(", ")),
                        );
                    }
                }
            }
        }
    }
    let patterns = root.join(PATTERNS_FILE);
    if !patterns.exists() {
        findings.warn(patterns.display(), "no patterns file: models without an exact entry get the size default");
        return;
    }
    match from_yaml_file::<PatternsFile>(&patterns) {
        Err(err) => findings.error(patterns.display(), err.message.clone() + &location_suffix(&err)),
        Ok(parsed) => {
            for (index, item) in parsed.patterns.iter().enumerate() {
                let place = format!("{} (pattern #{} `{}`)", patterns.display(), index + 1, item.match_);
                if item.match_.is_empty() {
                    findings.warn(&place, "empty `match` is skipped, not a match-all");
                } else if let Err(err) = Regex::new(&item.match_) {
                    findings.error(
                        &place,
                        format!(
                            "bad regular expression: {}",
                            err.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
                        ),
                    );
                }
                if item.profiles.as_ref().is_some_and(Vec::is_empty) {
                    findings.warn(&place, "`profiles: []` never applies");
                }
                check_fields(&place, &item.serve_fields(), findings);
            }
        }
    }
}

fn location_suffix(err: &launch_spec::yaml::YamlError) -> String {
    match (err.line, err.column) {
        (Some(line), Some(col)) => format!(" (line {line}, column {col})"),
        _ => String::new(),
    }
}

fn check_fields(place: &str, fields: &ServeFields, findings: &mut Findings) {
    for problem in fields.problems() {
        findings.error(place, problem);
    }
    if let Some(extra) = &fields.extra_args
        && extra.contains(['\'', '"'])
        && !extra.contains('{')
    {
        findings.warn(
            place,
            "extra_args has quotes: they reach vLLM as written (extra_args is split on whitespace only, like the old scripts' unquoted $EVAL_VLLM_EXTRA_ARGS)",
        );
    }
}

fn check_clusters(dir: &Path, findings: &mut Findings) -> Vec<ClusterProfile> {
    match config::load_gpu_profiles(dir) {
        Ok(_) => {}
        Err(err) => findings.error(dir.join(config::GPU_PROFILES_FILE).display(), err),
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        findings.error(dir.display(), "cannot read the clusters directory");
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml") && p.file_name().is_some_and(|n| n != config::GPU_PROFILES_FILE)
        })
        .collect();
    files.sort();
    let mut clusters = Vec::new();
    let mut names = std::collections::HashMap::new();
    for file in files {
        match from_yaml_file::<ClusterProfile>(&file) {
            Err(err) => findings.error(file.display(), err.message.clone() + &location_suffix(&err)),
            Ok(profile) => {
                for problem in profile.problems() {
                    findings.error(file.display(), problem);
                }
                check_notify_secret(&profile, &file, findings);
                for name in std::iter::once(&profile.name).chain(&profile.aliases) {
                    if let Some(other) = names.insert(name.clone(), file.clone()) {
                        findings.error(
                            file.display(),
                            format!("cluster name or alias `{name}` is also used by {}", other.display()),
                        );
                    }
                }
                clusters.push(profile);
            }
        }
    }
    clusters
}

/// `notify.webhook_secret` against the profile's secrets file, where that file is readable here
/// (else `launch` checks it at start, before submitting).
fn check_notify_secret(profile: &ClusterProfile, file: &Path, findings: &mut Findings) {
    let (Some(notify), Some(secrets)) = (&profile.notify, &profile.secrets.file) else { return };
    if notify.webhook_secret.is_none() {
        return;
    }
    let Ok(secrets) = launch_spec::expand::expand_path(&secrets.to_string_lossy(), &|v| std::env::var(v).ok()) else {
        return;
    };
    if Path::new(&secrets).is_file()
        && let Err(err) = crate::notify::Notifier::new(notify, Path::new(&secrets))
    {
        findings.error(file.display(), err);
    }
}

fn check_presets(dir: &Path, findings: &mut Findings) -> Vec<(PathBuf, Preset)> {
    let harbor_dir = dir.join("harbor");
    let Ok(entries) = std::fs::read_dir(dir) else {
        findings.error(dir.display(), "cannot read the presets directory");
        return Vec::new();
    };
    let mut presets = Vec::new();
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for file in files {
        match from_yaml_file::<Preset>(&file) {
            Err(err) => findings.error(file.display(), err.message.clone() + &location_suffix(&err)),
            Ok(preset) => {
                for problem in preset.problems_with(&harbor_dir) {
                    findings.error(file.display(), problem);
                }
                presets.push((file, preset));
            }
        }
    }
    presets
}

/// Presets running one benchmark declare one scoring for it: `results` takes the first declaration
/// (by file name), so a disagreeing one would be silently ignored.
fn check_scorings(presets: &[(PathBuf, Preset)], findings: &mut Findings) {
    let mut first: BTreeMap<String, (&Path, crate::config::preset::Scoring)> = BTreeMap::new();
    for (file, preset) in presets {
        let Some(scoring) = preset.scoring else { continue };
        for dataset in &preset.datasets {
            let benchmark = Preset::benchmark_of(dataset);
            match first.get(&benchmark) {
                Some((other, theirs)) if *theirs != scoring => findings.error(
                    file.display(),
                    format!(
                        "scoring ({scoring}) for {benchmark} differs from {}'s ({theirs}): declare one scoring in both",
                        other.display()
                    ),
                ),
                Some(_) => {}
                None => {
                    first.insert(benchmark, (file, scoring));
                }
            }
        }
    }
}

/// Each installed-harness preset on each cluster: the tunnels its jobs get there, or why `launch`
/// would refuse them (no Pinggy bank; no internet and no proxy) — a warning, since the preset may
/// be meant for another cluster.
fn check_tunnels(presets: &[(PathBuf, Preset)], clusters: &[ClusterProfile], findings: &mut Findings) {
    // Paths are not expanded here (lint runs without the profile's variables).
    let as_written = |_: &str, p: &Path| Ok(p.to_path_buf());
    for (file, preset) in presets {
        let agent = preset.agent();
        if !launch_spec::spec::is_installed_agent(agent) {
            continue;
        }
        for cluster in clusters {
            if let Err(e) = crate::spec_build::describe_tunnel(cluster, agent, &as_written, None) {
                findings.warn(file.display(), format!("on cluster {}: {e}", cluster.name));
            }
        }
    }
}

/// Environment names and parallelism as each cluster will see them.
fn check_against_clusters(
    registry: &Registry,
    clusters: &[ClusterProfile],
    gpu_profiles: Option<&launch_spec::GpuProfiles>,
    findings: &mut Findings,
) {
    for cluster in clusters {
        let profile = &cluster.hardware.hardware_profile;
        let mut ids: Vec<&launch_spec::ModelId> = registry.models.keys().collect();
        ids.sort();
        for id in ids {
            let entry = &registry.models[id];
            let Some(fields) = entry.on_profile(profile) else { continue };
            check_fields_on_cluster(&entry.file.display().to_string(), id, fields, cluster, gpu_profiles, findings);
        }
        for pattern in registry.patterns.iter().filter(|p| p.applies_to(profile)) {
            let place = format!("pattern #{} `{}`", pattern.index + 1, pattern.text);
            check_fields_on_cluster(&place, "", &pattern.fields_on(profile), cluster, gpu_profiles, findings);
        }
        if profile != crate::registry::DEFAULT_PROFILE {
            let falling: usize = registry
                .models
                .values()
                .filter(|entry| entry.on_profile(profile).is_none() && !entry.base.is_empty())
                .count();
            if falling > 0 {
                findings.warn(
                    format!("cluster {}", cluster.name),
                    format!("{falling} registry model(s) have no `{profile}` variant and fall through to the patterns on this cluster (their parsers, kwargs and conda env do not apply)"),
                );
            }
        }
    }
    for entry in registry.models.values() {
        if let Some(fields) = entry.on_profile(crate::registry::DEFAULT_PROFILE)
            && fields.max_model_len.is_none()
            && fields.extra_args.is_none()
            && registry.patterns.iter().any(|p| {
                p.applies_to(crate::registry::DEFAULT_PROFILE)
                    && p.regex.as_ref().is_some_and(|r| r.is_match(&entry.id))
            })
        {
            findings.warn(
                entry.file.display(),
                format!(
                    "thin exact entry for `{}` blocks every field of the pattern it would otherwise match",
                    entry.id
                ),
            );
        }
    }
    check_shadowing(registry, findings);
}

/// The timeout policy (docs/design.md §4.3): each band's canonical config exists beside the presets
/// with the band's own multiplier, and every registry model whose multiplier is the fallback is named.
fn check_timeouts(registry: &Registry, harbor_dir: &Path, findings: &mut Findings) {
    let policy_file = registry.root.join(crate::registry::timeouts::TIMEOUTS_FILE);
    for (place, multiplier, file) in registry.timeouts.choices() {
        let config = harbor_dir.join(file);
        match crate::spec_build::harbor_config_multiplier(&config) {
            Err(err) => findings.error(policy_file.display(), format!("{place}: {err}")),
            Ok(value) if value != multiplier => findings.warn(
                policy_file.display(),
                format!("{place}: {file} has timeout_multiplier {value}, the band {multiplier}: make them equal"),
            ),
            Ok(_) => {}
        }
    }
    let mut fallback: Vec<&str> = registry
        .models
        .values()
        .filter(|entry| {
            let (_, fields) = registry.lookup(&entry.id, crate::registry::DEFAULT_PROFILE);
            let source = registry.timeout_multiplier(&entry.id, &Default::default(), fields.timeout_multiplier).1;
            source == crate::registry::TimeoutSource::Fallback
        })
        .map(|entry| entry.id.as_str())
        .collect();
    fallback.sort_unstable();
    for id in fallback {
        findings.warn(
            registry.models[id].file.display(),
            format!(
                "timeout multiplier of `{id}` is the fallback {:.1}: its size is in no band of {} (set `timeout_multiplier` in its entry to choose one)",
                registry.timeouts.otherwise.timeout_multiplier,
                crate::registry::timeouts::TIMEOUTS_FILE
            ),
        );
    }
}

/// Ids that reveal pattern-order surprises: every registry id plus probes for the known cases
/// (`(?i)3[02][Bb]` also matches "130B" and every 30B/32B name before `131k|-lc$` is reached).
const SHADOW_PROBES: &[&str] =
    &["probe/Foo-30B-A3B-lc", "probe/Foo-130B-131k", "probe/foo-32b-131k", "probe/Foo-7B-lc", "probe/Foo-32B"];

fn check_shadowing(registry: &Registry, findings: &mut Findings) {
    let mut probes: Vec<&str> = registry.models.keys().map(launch_spec::ModelId::as_str).collect();
    probes.extend_from_slice(SHADOW_PROBES);
    probes.sort_unstable();
    for (later_index, later) in registry.patterns.iter().enumerate() {
        let Some(later_regex) = &later.regex else { continue };
        for earlier in &registry.patterns[..later_index] {
            let Some(earlier_regex) = &earlier.regex else { continue };
            let shares_profile = match (&earlier.profiles, &later.profiles) {
                (Some(a), Some(b)) => a.iter().any(|p| b.contains(p)),
                _ => true,
            };
            if !shares_profile {
                continue;
            }
            if let Some(probe) = probes.iter().find(|id| later_regex.is_match(id) && earlier_regex.is_match(id)) {
                findings.warn(
                    format!("pattern #{} `{}`", later.index + 1, later.text),
                    format!(
                        "shadowed by earlier pattern #{} `{}` for ids like `{probe}` (first match wins)",
                        earlier.index + 1,
                        earlier.text
                    ),
                );
            }
        }
    }
}

fn check_fields_on_cluster(
    place: &str,
    id: &str,
    fields: &ServeFields,
    cluster: &ClusterProfile,
    gpu_profiles: Option<&launch_spec::GpuProfiles>,
    findings: &mut Findings,
) {
    let gpus = cluster.hardware.gpus_per_node;
    if let Some(env) = &fields.conda_env
        && !cluster.environments.contains_key(env)
    {
        findings.error(
            place,
            format!(
                "environment `{env}` is not defined on cluster {} (add it under `environments:` in clusters/{}.yaml)",
                cluster.name, cluster.name
            ),
        );
    }
    // The kwargs as the cluster's Harbor will get them (translated at spec time), checked against
    // terminus-2's options where that Harbor's schema is known.
    if let Some(kwargs) = &fields.agent_kwargs
        && let Some(env) = cluster.environments.get(&cluster.harbor.environment)
    {
        let dialect = env.harbor_dialect();
        match launch_spec::versions::translate_agent_kwargs(kwargs, dialect) {
            Err(err) => findings.error(place, format!("on cluster {} ({}): {err}", cluster.name, dialect.as_str())),
            Ok(translated) => {
                for key in launch_spec::versions::unknown_terminus2_options(&translated, dialect) {
                    findings.error(
                        place,
                        format!(
                            "agent kwarg `{key}` is unknown to terminus-2 of {} on cluster {} (Harbor refuses it: \"Unknown option '{key}'\"); remove it or use one of its options (docs/real-programs.md)",
                            dialect.as_str(),
                            cluster.name
                        ),
                    );
                }
            }
        }
    }
    let parallel = crate::registry::parallelism(id, fields, gpus);
    match launch_spec::layout::plan(parallel, gpus, cluster.slurm.max_nodes, fields.nodes) {
        // A warning, not an error: a registry serves several clusters and a large model may fit
        // only some; `spec`/`launch` refuse it on this one with the same words.
        Err(err) => findings.warn(place, format!("cannot run on cluster {}: {err}", cluster.name)),
        Ok(layout) => {
            if layout.crossing == launch_spec::layout::Crossing::Tensor {
                findings.warn(
                    place,
                    format!(
                        "on cluster {}: tensor parallelism (TP {}) crosses {} nodes, which is slow over most interconnects; prefer pipeline_parallel_size across nodes (docs/multinode.md)",
                        cluster.name, parallel.tensor, layout.nodes
                    ),
                );
            }
            if let Some(problem) = weights_do_not_fit(id, parallel.total(), cluster, gpu_profiles, None) {
                findings.warn(place, format!("on cluster {}: {problem}", cluster.name));
            }
        }
    }
}

/// Share of the weights' size added for the KV cache, activations and CUDA graphs when judging fit.
pub(crate) const KV_MARGIN: f64 = 0.2;

/// Why the weights cannot fit `gpus` GPUs of `cluster`: parameters × bytes per parameter, plus
/// [`KV_MARGIN`], against the GPUs' memory × the gpu-memory ceiling the job will run with — by the
/// spec's one precedence (`launch_spec::gpu::effective_gpu_memory_utilization`: the spec's override,
/// e.g. a preset's, > the cluster's > the GPU profile's). `None` when they fit or when the size or
/// the GPUs' memory is unknown.
pub(crate) fn weights_do_not_fit(
    id: &str,
    gpus: u32,
    cluster: &ClusterProfile,
    gpu_profiles: Option<&launch_spec::GpuProfiles>,
    spec_override: Option<f64>,
) -> Option<String> {
    let params_b = crate::registry::size::total_size(id)?;
    let gib_per_gpu = cluster.hardware.gpu_memory_gib?;
    let bytes = crate::registry::size::bytes_per_parameter(id);
    let (ceiling, _) = launch_spec::gpu::effective_gpu_memory_utilization(
        spec_override,
        cluster.hardware.gpu_memory_utilization,
        gpu_profiles.and_then(|p| crate::settings::gpu_profile_for(cluster, p)),
    )?;
    let weights_gib = params_b * 1e9 * bytes / (1u64 << 30) as f64;
    let needed = weights_gib * (1.0 + KV_MARGIN);
    let available = f64::from(gpus) * gib_per_gpu * ceiling;
    (needed > available).then(|| {
        format!(
            "the weights may not fit: {params_b}B parameters × {bytes} bytes = {weights_gib:.0} GiB + {:.0}% KV margin = {needed:.0} GiB, but {gpus} GPU(s) × {gib_per_gpu} GiB × {ceiling} = {available:.0} GiB; raise tensor/pipeline/data parallel sizes or `nodes`",
            KV_MARGIN * 100.0
        )
    })
}

#[cfg(test)]
mod tunnel_tests {
    use super::*;

    fn cluster(name: &str) -> ClusterProfile {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clusters");
        config::load_cluster(&dir, name).unwrap()
    }

    #[test]
    fn an_installed_agent_preset_is_flagged_where_it_cannot_launch() {
        let yaml = "datasets: [DCAgent2/terminal_bench_2]\nagent_name: openhands\n";
        let preset: Preset = launch_spec::yaml::from_yaml_str(yaml, Path::new("oh.yaml")).unwrap();
        let presets = vec![(PathBuf::from("presets/oh.yaml"), preset)];
        // The shipped Leonardo has the team's bank (issue 31): both tunnels in one job, nothing to say.
        let shipped = cluster("leonardo");
        let mut findings = Findings::default();
        check_tunnels(&presets, std::slice::from_ref(&shipped), &mut findings);
        assert!(findings.0.is_empty(), "{:?}", findings.0);
        let mut leo = shipped.clone();
        leo.network.pinggy_bank = None;
        let mut findings = Findings::default();
        check_tunnels(&presets, std::slice::from_ref(&leo), &mut findings);
        assert_eq!(findings.0.len(), 1, "{:?}", findings.0);
        assert!(findings.0[0].message.contains("on cluster leonardo: agent `openhands`"), "{:?}", findings.0);
        // With a bank of its own, the same.
        let bank = "- {url: https://a.a.pinggy.link, token_secret: PINGGY_TOKEN_1}\n";
        leo.network.pinggy = launch_spec::yaml::from_yaml_str(bank, Path::new("bank.yaml")).unwrap();
        let mut findings = Findings::default();
        check_tunnels(&presets, &[leo], &mut findings);
        assert!(findings.0.is_empty(), "{:?}", findings.0);
    }
}

#[cfg(test)]
mod fit_tests {
    use super::*;

    /// Issue 22's drift: the fit check took the cluster's ceiling even where the spec (a preset's
    /// `gpu_memory_utilization`) sets a lower one the job will run with.
    #[test]
    fn the_fit_is_judged_at_the_ceiling_the_job_runs_with() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clusters");
        let leo = config::load_cluster(&dir, "leonardo").unwrap();
        // 32B × 2 bytes ≈ 60 GiB + 20 % = 72 GiB; 2 × 64 GiB × 0.9 fits, × 0.5 does not.
        assert_eq!(weights_do_not_fit("Qwen/Qwen3-32B", 2, &leo, None, None), None);
        let refused = weights_do_not_fit("Qwen/Qwen3-32B", 2, &leo, None, Some(0.5)).expect("does not fit at 0.5");
        assert!(refused.contains("× 0.5 ="), "{refused}");
    }
}
