//! The model registry: loading `model_config/` and resolving serve settings (docs/design.md §3.3, §4).
//!
//! Serve settings keep the replaced system's semantics (docs/design.md §4): exact entry (variants
//! replace wholesale) else first matching pattern else size default; the matched config is used as
//! it is, never layered. The timeout multiplier follows the team's written policy (§4.3).

pub(crate) mod files;
pub mod names;
pub(crate) mod size;
pub(crate) mod timeouts;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use launch_spec::ModelId;
use launch_spec::layout::{Layout, LayoutError, Parallelism};
use launch_spec::yaml::{YamlError, from_yaml_file};
use regex::Regex;
use serde::Serialize;

use files::{ModelFile, PatternsFile, ServeFields};
use timeouts::TimeoutPolicy;

pub(crate) const DEFAULT_PROFILE: &str = "default";
pub(crate) const PATTERNS_FILE: &str = "_patterns.yaml";
/// `max_num_seqs` for the Qwen3.5/3.6 family when the entry sets none (docs/design.md §4.1 rule 5).
pub(crate) const QWEN35_MAX_NUM_SEQS: u32 = 256;
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 16384;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Yaml(#[from] YamlError),
    #[error("{path}: cannot read registry directory: {source} (pass --registry DIR pointing at a model_config/ tree)")]
    Dir { path: PathBuf, source: std::io::Error },
    #[error("{path}: {place}{problem} (`submitter registry check` lists every problem)")]
    Invalid { path: PathBuf, place: String, problem: String },
    #[error("{path}: pattern #{index} `{pattern}` is not a valid regular expression: {message}")]
    BadRegex { path: PathBuf, index: usize, pattern: String, message: String },
}

/// One model's registry file after loading.
#[derive(Debug, Clone)]
pub struct ModelEntry {
    pub id: ModelId,
    pub file: PathBuf,
    /// Base fields overlaid by `subsystems.eval` (eval wins), without variants.
    pub base: ServeFields,
    /// `subsystems.eval.variants`, each verbatim.
    pub variants: Vec<(String, ServeFields)>,
}

impl ModelEntry {
    /// The exact entry on `profile`, or `None` when the model has none there (docs/design.md §4.1 rule 2).
    pub(crate) fn on_profile(&self, profile: &str) -> Option<&ServeFields> {
        let variant = self.variants.iter().find(|(name, _)| name == profile).map(|(_, f)| f);
        let entry = match variant {
            // A variant replaces the entry wholesale; `variants.default` does so on `default` too.
            Some(fields) => fields,
            None if profile == DEFAULT_PROFILE => &self.base,
            None => return None,
        };
        (!entry.is_empty()).then_some(entry)
    }
}

#[derive(Debug, Clone)]
pub struct Pattern {
    pub index: usize,
    pub text: String,
    pub regex: Option<Regex>,
    pub profiles: Option<Vec<String>>,
    pub fields: ServeFields,
    pub variants: Vec<(String, ServeFields)>,
}

impl Pattern {
    pub(crate) fn applies_to(&self, profile: &str) -> bool {
        self.profiles.as_ref().is_none_or(|list| list.iter().any(|p| p == profile))
    }

    /// The pattern's fields on `profile`: its own `variants.<profile>` shallow-merged on top.
    pub(crate) fn fields_on(&self, profile: &str) -> ServeFields {
        match self.variants.iter().find(|(name, _)| name == profile) {
            Some((_, variant)) => self.fields.overlaid_with(variant),
            None => self.fields.clone(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Registry {
    pub root: PathBuf,
    pub models: HashMap<ModelId, ModelEntry>,
    /// Files in load order, for `registry check`.
    pub files: Vec<PathBuf>,
    pub patterns: Vec<Pattern>,
    pub(crate) patterns_file: Option<PathBuf>,
    /// The size bands of the timeout policy (`_timeouts.yaml`, else the team's).
    pub timeouts: TimeoutPolicy,
    /// `X@<profile>` standalones (docs/design.md §4.1 rule 2): by bare id, then profile, verbatim.
    pub standalones: HashMap<ModelId, HashMap<String, Standalone>>,
    /// Files that did not load: skipped, so the rest resolves; a model they name is refused.
    pub broken: Vec<BrokenFile>,
    /// `_patterns.yaml` did not load: a model without an exact entry cannot be resolved.
    pub(crate) patterns_broken: bool,
}

/// A model file `model: X@P`: replaces X wholesale on profile P, ignored elsewhere.
#[derive(Debug, Clone)]
pub struct Standalone {
    pub file: PathBuf,
    /// Base fields overlaid by `subsystems.eval`; its `variants` are ignored.
    pub fields: ServeFields,
}

/// A registry file that did not load, with the model id it names when that can be read.
#[derive(Debug, Clone)]
pub struct BrokenFile {
    pub path: PathBuf,
    pub id: Option<String>,
    pub error: String,
}

impl Registry {
    /// Loads `root` like the replaced generator: org dirs sorted (skipping `_`/`.` names), `*.yaml`
    /// sorted inside, no recursion, files without `model:` skipped, a later duplicate id wins.
    /// A file that does not load is kept in `broken` and skipped (so are bad patterns): only a
    /// model it names is refused ([`Registry::problem_for`]). An unreadable directory or a bad
    /// `_timeouts.yaml` (every resolution needs it) fails the load.
    pub fn load(root: &Path) -> Result<Registry, RegistryError> {
        let mut registry = Registry { root: root.to_path_buf(), ..Registry::default() };
        for org in sorted_entries(root)? {
            let name = file_name(&org);
            if name.starts_with('_') || name.starts_with('.') || !org.is_dir() {
                continue;
            }
            for file in sorted_entries(&org)? {
                // A `*.yaml` that is no regular file (a dangling symlink, a FIFO, `/dev/zero`) is an
                // error naming it, never skipped: skipping it silently changed the model's settings.
                if file.is_dir() || file.extension().is_none_or(|ext| ext != "yaml") {
                    continue;
                }
                match load_model_file(&file) {
                    Err(err) => registry.broken.push(BrokenFile {
                        id: id_in_text(&file),
                        path: file.clone(),
                        error: err.to_string(),
                    }),
                    Ok((parsed, id)) => {
                        registry.files.push(file.clone());
                        if let Some(id) = id {
                            registry.add(parsed, id, &file);
                        }
                    }
                }
            }
        }
        if let Err(err) = registry.load_patterns(root) {
            registry.broken.push(BrokenFile { path: root.join(PATTERNS_FILE), id: None, error: err.to_string() });
            registry.patterns.clear();
            registry.patterns_broken = true;
        }
        registry.timeouts = TimeoutPolicy::load(root)?;
        Ok(registry)
    }

    /// One loaded model file: a bare entry (a later duplicate wins wholesale) or a standalone.
    fn add(&mut self, parsed: ModelFile, id: FileId, file: &Path) {
        match id {
            FileId::Standalone(bare, profile) => {
                let eval = parsed.subsystems.as_ref().and_then(|s| s.eval.clone()).unwrap_or_default();
                let fields = parsed.serve_fields().overlaid_with(&eval.serve_fields());
                self.standalones
                    .entry(bare)
                    .or_default()
                    .insert(profile, Standalone { file: file.to_path_buf(), fields });
            }
            FileId::Bare(id) => {
                let entry = model_entry(parsed, id, file);
                self.models.insert(entry.id.clone(), entry);
            }
        }
    }

    /// One warning per file that did not load (the commands that load the registry say so; only the
    /// models those files name are refused).
    pub(crate) fn report_broken(&self) {
        for file in &self.broken {
            tracing::warn!("registry file skipped: {} (`submitter registry check` lists every problem)", file.error);
        }
    }

    /// Why `id` cannot be resolved on `profile` with this registry, if it cannot: a broken file
    /// names it, or it would fall to the patterns and `_patterns.yaml` is broken.
    pub(crate) fn problem_for(&self, id: &str, profile: &str) -> Option<String> {
        let named = |file: &&BrokenFile| {
            file.id.as_deref().is_some_and(|named| named == id || split_standalone(named).is_some_and(|(b, _)| b == id))
        };
        if let Some(file) = self.broken.iter().find(named) {
            return Some(format!("model `{id}`: its registry file does not load: {}", file.error));
        }
        if self.patterns_broken && !matches!(self.lookup(id, profile).0, Rule::Exact) {
            let error = self.broken.iter().find(|f| f.id.is_none() && f.path.ends_with(PATTERNS_FILE));
            return Some(format!(
                "model `{id}` has no exact registry entry and the patterns do not load: {}",
                error.map_or("", |f| f.error.as_str())
            ));
        }
        None
    }

    fn load_patterns(&mut self, root: &Path) -> Result<(), RegistryError> {
        let registry = self;
        let patterns_path = root.join(PATTERNS_FILE);
        if patterns_path.exists() {
            let parsed: PatternsFile = from_yaml_file(&patterns_path)?;
            for (index, item) in parsed.patterns.iter().enumerate() {
                let blocks = std::iter::once((String::new(), item.serve_fields())).chain(
                    item.variants.iter().flatten().map(|(name, v)| (format!("variants.{name}: "), v.serve_fields())),
                );
                for (place, fields) in blocks {
                    if let Some(problem) = fields.problems().into_iter().next() {
                        return Err(RegistryError::Invalid {
                            path: patterns_path,
                            place: format!("pattern #{} `{}`: {place}", index + 1, item.match_),
                            problem,
                        });
                    }
                }
            }
            registry.patterns = parsed
                .patterns
                .into_iter()
                .enumerate()
                .map(|(index, item)| Pattern {
                    index,
                    regex: if item.match_.is_empty() { None } else { Regex::new(&item.match_).ok() },
                    text: item.match_.clone(),
                    profiles: item.profiles.clone(),
                    fields: item.serve_fields(),
                    variants: item
                        .variants
                        .iter()
                        .flatten()
                        .map(|(name, v)| (name.clone(), v.serve_fields()))
                        .collect(),
                })
                .collect();
            if let Some(bad) = registry.patterns.iter().find(|p| p.regex.is_none() && !p.text.is_empty()) {
                return Err(RegistryError::BadRegex {
                    path: patterns_path,
                    index: bad.index + 1,
                    pattern: bad.text.clone(),
                    message: Regex::new(&bad.text).err().map(|e| one_line(&e.to_string())).unwrap_or_default(),
                });
            }
            registry.patterns_file = Some(patterns_path);
        }
        Ok(())
    }

    /// The matched config for `id` on `profile`: exact entry, else first applicable pattern.
    pub fn lookup(&self, id: &str, profile: &str) -> (Rule, ServeFields) {
        match self.standalones.get(id).and_then(|by_profile| by_profile.get(profile)) {
            // `X@P` replaces X wholesale on P; an empty one leaves no entry (the patterns decide).
            Some(standalone) if !standalone.fields.is_empty() => return (Rule::Exact, standalone.fields.clone()),
            Some(_) => {}
            None => {
                if let Some(fields) = self.models.get(id).and_then(|entry| entry.on_profile(profile)) {
                    return (Rule::Exact, fields.clone());
                }
            }
        }
        for pattern in &self.patterns {
            // An empty `match` is skipped, not a match-all (as in the replaced system).
            let Some(regex) = &pattern.regex else { continue };
            if pattern.applies_to(profile) && regex.is_match(id) {
                return (Rule::Pattern(pattern.text.clone()), pattern.fields_on(profile));
            }
        }
        (Rule::SizeDefault, ServeFields::default())
    }

    /// docs/design.md §4.3, first wins: `--timeout-multiplier`; the explicit Harbor config's own
    /// value as-is; the matched entry's or pattern's; the size band of the largest size token,
    /// else `otherwise` (the caller notes `Fallback`).
    pub fn timeout_multiplier(&self, id: &str, overrides: &Overrides, entry: Option<f64>) -> (f64, TimeoutSource) {
        if let Some(value) = overrides.timeout_multiplier {
            return (value, TimeoutSource::Cli);
        }
        if let Some(value) = overrides.harbor_config_multiplier {
            return (value, TimeoutSource::HarborConfig);
        }
        if let Some(value) = entry {
            return (value, TimeoutSource::Registry);
        }
        let band = self.timeouts.choose(id);
        let source = if band.fallback { TimeoutSource::Fallback } else { TimeoutSource::Size };
        (band.timeout_multiplier, source)
    }

    /// Resolves serve settings for one model (docs/design.md §4.1–4.4).
    pub fn resolve(&self, id: &ModelId, profile: &str, gpus_per_node: u32, overrides: &Overrides) -> Resolved {
        let (rule, fields) = self.lookup(id, profile);
        let parallel = parallelism(id, &fields, gpus_per_node);
        let max_num_seqs = fields.max_num_seqs.or_else(|| is_qwen35_family(id).then_some(QWEN35_MAX_NUM_SEQS));
        let (timeout_multiplier, timeout_source) = self.timeout_multiplier(id, overrides, fields.timeout_multiplier);
        let model_kwargs = fields.agent_kwargs.clone().unwrap_or_default();
        let agent_kwargs =
            merge_agent_kwargs(&[&overrides.cli_agent_kwargs, &model_kwargs, &overrides.preset_agent_kwargs]);
        Resolved {
            tensor_parallel_size: parallel.tensor,
            data_parallel_size: parallel.data,
            pipeline_parallel_size: parallel.pipeline,
            nodes: fields.nodes,
            max_model_len: fields.max_model_len,
            swap_space: fields.swap_space,
            trust_remote_code: fields.trust_remote_code,
            tool_call_parser: non_empty(fields.tool_call_parser),
            reasoning_parser: non_empty(fields.reasoning_parser),
            hf_overrides: non_empty(fields.hf_overrides),
            limit_mm_per_prompt: non_empty(fields.limit_mm_per_prompt),
            max_num_seqs,
            extra_args: non_empty(fields.extra_args),
            conda_env: non_empty(fields.conda_env),
            agent_kwargs,
            max_output_tokens: fields.max_output_tokens,
            timeout_multiplier,
            rule: rule.to_string(),
            timeout_source,
        }
    }
}

/// TP, PP and DP of a matched config, with the defaults of docs/design.md §4.1 rule 4: TP from the
/// entry, else total size > 14 → 2 else 1; PP from the entry, else 1; DP from the entry, else
/// max(1, GPUs per node ÷ (TP × PP)). The one place these defaults live (`registry check` uses it too).
pub fn parallelism(id: &str, fields: &ServeFields, gpus_per_node: u32) -> Parallelism {
    let tensor =
        fields.tensor_parallel_size.unwrap_or(if size::total_size(id).is_some_and(|s| s > 14.0) { 2 } else { 1 });
    let pipeline = fields.pipeline_parallel_size.unwrap_or(1);
    let data =
        fields.data_parallel_size.unwrap_or_else(|| (gpus_per_node / tensor.saturating_mul(pipeline).max(1)).max(1));
    Parallelism { tensor, pipeline, data }
}

/// What a model file's `model:` names: a model, or `X@P` (X's standalone for hardware profile P).
#[derive(Debug, Clone, PartialEq, Eq)]
enum FileId {
    Bare(ModelId),
    Standalone(ModelId, String),
}

/// The id a model file names, checked once as it is read (a [`ModelId`]; after `@`, a profile
/// name), and the first field no command may use (`ServeFields::problems`).
fn model_file_problem(parsed: &ModelFile, file: &Path) -> Result<Option<FileId>, RegistryError> {
    let invalid = |place: &str, problem: String| RegistryError::Invalid {
        path: file.to_path_buf(),
        place: place.to_string(),
        problem,
    };
    let model_id = |id: &str| ModelId::new(id).map_err(|problem| invalid("`model`: ", problem.to_string()));
    let id = match &parsed.model {
        None => None,
        Some(id) => match split_standalone(id) {
            Some((bare, profile)) => {
                let bare = model_id(bare)?;
                if profile.is_empty() || !profile.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
                    return Err(invalid(
                        "`model`: ",
                        format!("`{id}`: after `@` comes a hardware profile name (like gh200)"),
                    ));
                }
                Some(FileId::Standalone(bare, profile.to_string()))
            }
            None => Some(FileId::Bare(model_id(id)?)),
        },
    };
    let eval = parsed.subsystems.as_ref().and_then(|s| s.eval.clone()).unwrap_or_default();
    let blocks = [(String::new(), parsed.serve_fields()), ("subsystems.eval: ".to_string(), eval.serve_fields())]
        .into_iter()
        .chain(eval.variants.iter().flatten().map(|(name, v)| (format!("variants.{name}: "), v.serve_fields())));
    for (place, fields) in blocks {
        if let Some(problem) = fields.problems().into_iter().next() {
            return Err(invalid(&place, problem));
        }
    }
    Ok(id)
}

fn load_model_file(file: &Path) -> Result<(ModelFile, Option<FileId>), RegistryError> {
    let parsed: ModelFile = from_yaml_file(file)?;
    let id = model_file_problem(&parsed, file)?;
    Ok((parsed, id))
}

/// `X@P` → (`X`, `P`), split at the last `@` as the team's loader does; `None` for a bare id.
pub(crate) fn split_standalone(id: &str) -> Option<(&str, &str)> {
    id.rsplit_once('@')
}

/// The `model:` a file names, read from its text (for a file whose YAML does not load).
fn id_in_text(file: &Path) -> Option<String> {
    // A regular file only, capped: a FIFO or a link to /dev/zero never hangs or floods the loader.
    let text = launch_spec::fsread::read_text_capped(file, 1 << 20, launch_spec::fsread::Links::Follow).ok()?;
    let line = text.lines().find_map(|line| line.strip_prefix("model:"))?;
    let id = line.split('#').next()?.trim().trim_matches(['"', '\'']);
    (!id.is_empty()).then(|| id.to_string())
}

fn model_entry(parsed: ModelFile, id: ModelId, file: &Path) -> ModelEntry {
    let eval = parsed.subsystems.as_ref().and_then(|s| s.eval.clone()).unwrap_or_default();
    let base = parsed.serve_fields().overlaid_with(&eval.serve_fields());
    let variants = eval.variants.iter().flatten().map(|(name, block)| (name.clone(), block.serve_fields())).collect();
    ModelEntry { id, file: file.to_path_buf(), base, variants }
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, RegistryError> {
    let read = std::fs::read_dir(dir).map_err(|source| RegistryError::Dir { path: dir.to_path_buf(), source })?;
    let mut entries: Vec<PathBuf> = read.filter_map(|e| e.ok().map(|e| e.path())).collect();
    // Python's sorted() on names: code-point order, which byte order of UTF-8 preserves.
    entries.sort_by(|a, b| file_name(a).cmp(file_name(b)));
    Ok(entries)
}

fn file_name(path: &Path) -> &str {
    path.file_name().and_then(|n| n.to_str()).unwrap_or_default()
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

/// Which rule produced a resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    Exact,
    Pattern(String),
    SizeDefault,
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::Exact => write!(f, "exact"),
            Rule::Pattern(text) => write!(f, "pattern:{text}"),
            Rule::SizeDefault => write!(f, "size-default"),
        }
    }
}

/// Inputs from outside the registry that take part in resolution.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--timeout-multiplier`.
    pub timeout_multiplier: Option<f64>,
    /// The `timeout_multiplier` of an explicit Harbor config (`--harbor-config`, preset
    /// `harbor_config`), or Harbor's default 1.0 when that file sets none.
    pub(crate) harbor_config_multiplier: Option<f64>,
    pub(crate) cli_agent_kwargs: Vec<String>,
    pub(crate) preset_agent_kwargs: Vec<String>,
}

/// Resolved serve settings. Its serialisation is what `registry resolve --format json` and `plan`
/// print of them (`output::ServeSettings` adds the layout): field order is the interface.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Resolved {
    pub tensor_parallel_size: u32,
    pub data_parallel_size: u32,
    /// Left out of the JSON when 1 (as before multi-node), so single-node output is unchanged.
    #[serde(skip_serializing_if = "is_one")]
    pub pipeline_parallel_size: u32,
    /// The registry's explicit node count; left out when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    pub max_model_len: Option<u64>,
    pub swap_space: Option<u32>,
    pub trust_remote_code: Option<bool>,
    pub tool_call_parser: Option<String>,
    pub reasoning_parser: Option<String>,
    pub hf_overrides: Option<String>,
    pub limit_mm_per_prompt: Option<String>,
    pub max_num_seqs: Option<u32>,
    pub extra_args: Option<String>,
    pub conda_env: Option<String>,
    pub agent_kwargs: Vec<String>,
    pub max_output_tokens: Option<u64>,
    pub timeout_multiplier: f64,
    pub rule: String,
    /// Where the timeout came from; `unknown-size` earns a warning. Not part of the JSON.
    #[serde(skip)]
    pub timeout_source: TimeoutSource,
}

impl Resolved {
    pub fn parallelism(&self) -> Parallelism {
        Parallelism {
            tensor: self.tensor_parallel_size,
            pipeline: self.pipeline_parallel_size,
            data: self.data_parallel_size,
        }
    }

    /// Every GPU the engine uses, over all its nodes.
    pub fn gpus(&self) -> u32 {
        // The registry refuses sizes whose product overflows (ServeFields::problems); saturating
        // keeps a caller that skipped loading checks from panicking.
        self.parallelism().total()
    }

    /// The layout on nodes of `gpus_per_node` GPUs, at most `max_nodes` of them: the one fit check
    /// (`spec`/`launch`, `registry resolve` and `registry check` all ask it).
    pub fn layout(&self, gpus_per_node: u32, max_nodes: u32) -> Result<Layout, LayoutError> {
        launch_spec::layout::plan(self.parallelism(), gpus_per_node, max_nodes, self.nodes)
    }
}

fn is_one(value: &u32) -> bool {
    *value == 1
}

/// Where a timeout multiplier came from (docs/design.md §4.3); recorded in the launch spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeoutSource {
    /// `--timeout-multiplier`.
    Cli,
    /// The explicit Harbor config's own value.
    HarborConfig,
    /// The matched registry entry or pattern.
    Registry,
    /// A size band of `_timeouts.yaml`.
    Size,
    /// No band holds the name's size, or it has none: `otherwise`, with a note.
    #[default]
    Fallback,
}

impl TimeoutSource {
    pub fn as_str(self) -> &'static str {
        match self {
            TimeoutSource::Cli => "cli",
            TimeoutSource::HarborConfig => "harbor-config",
            TimeoutSource::Registry => "registry",
            TimeoutSource::Size => "size",
            TimeoutSource::Fallback => "fallback",
        }
    }
}

/// `(?i)qwen[\s\-_]?3[._][56]`, searched anywhere in the id; written by hand to keep it cheap.
pub(crate) fn is_qwen35_family(id: &str) -> bool {
    let lower: Vec<char> = id.to_lowercase().chars().collect();
    (0..lower.len()).any(|start| {
        let rest = &lower[start..];
        if rest.len() < 4 || rest[..4] != ['q', 'w', 'e', 'n'] {
            return false;
        }
        let mut i = 4;
        if i < rest.len() && (rest[i].is_whitespace() || rest[i] == '-' || rest[i] == '_') {
            i += 1;
        }
        rest.len() >= i + 3 && rest[i] == '3' && matches!(rest[i + 1], '.' | '_') && matches!(rest[i + 2], '5' | '6')
    })
}

/// Merges `key=value` lists in precedence order: the first occurrence of a key wins (docs/design.md §4.4).
pub(crate) fn merge_agent_kwargs(lists: &[&Vec<String>]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut merged = Vec::new();
    for item in lists.iter().flat_map(|list| list.iter()) {
        let key = item.split_once('=').map_or(item.as_str(), |(k, _)| k);
        if seen.insert(key.to_string()) {
            merged.push(item.clone());
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_table() {
        use TimeoutSource::{Fallback, Size};
        // The largest size token decides (issue 20's policy): a 30B-A3B is 30B.
        let cases = [
            ("x-0.5B", 2.0, Size),
            ("x-14B", 2.0, Size),
            ("x-14.5B", 2.0, Fallback),
            ("x-27B", 2.0, Fallback),
            ("x-28B", 16.0, Size),
            ("Qwen/Qwen3-30B-A3B", 16.0, Size),
            ("Qwen/Qwen3.5-35B-A3B", 16.0, Size),
            ("x-42B", 16.0, Size),
            ("x-43B", 2.0, Fallback),
            ("x-70B", 2.0, Fallback),
            ("x-80B-A3B", 2.0, Fallback),
            ("x-235B-A22B", 2.0, Fallback),
            ("Mixtral-8x7B", 2.0, Fallback),
            ("org/no-size-token", 2.0, Fallback),
        ];
        let registry = Registry::default();
        let none = Overrides::default();
        for (id, expected, source) in cases {
            assert_eq!(registry.timeout_multiplier(id, &none, None), (expected, source), "{id}");
        }
        let cli = Overrides { timeout_multiplier: Some(3.0), harbor_config_multiplier: Some(4.0), ..none.clone() };
        assert_eq!(registry.timeout_multiplier("x-32B", &cli, Some(5.0)), (3.0, TimeoutSource::Cli));
        let config = Overrides { harbor_config_multiplier: Some(4.0), ..none.clone() };
        assert_eq!(registry.timeout_multiplier("x-32B", &config, Some(5.0)), (4.0, TimeoutSource::HarborConfig));
        assert_eq!(registry.timeout_multiplier("x-32B", &none, Some(5.0)), (5.0, TimeoutSource::Registry));
    }

    #[test]
    fn qwen35_family() {
        for id in ["Qwen/Qwen3.5-9B", "probe/Qwen3.6-27B", "probe/qwen3_5-9b", "x/Qwen-3.5", "x/qwen 3.6"] {
            assert!(is_qwen35_family(id), "{id}");
        }
        for id in ["Qwen/Qwen3-8B", "allenai/tmax-9b", "Qwen3.4", "qwen35"] {
            assert!(!is_qwen35_family(id), "{id}");
        }
    }

    #[test]
    fn kwargs_first_key_wins() {
        let model = vec!["a=1".to_string(), "a=2".to_string(), "b=3".to_string()];
        assert_eq!(merge_agent_kwargs(&[&vec![], &model, &vec![]]), vec!["a=1", "b=3"]);
        let cli = vec!["b=9".to_string()];
        let preset = vec!["c=1".to_string(), "a=7".to_string()];
        assert_eq!(merge_agent_kwargs(&[&cli, &model, &preset]), vec!["b=9", "a=1", "c=1"]);
    }
}
