//! Typed configuration: the one place that reads cluster profiles, GPU profiles, presets and lists.
//! Every YAML file goes through `launch_spec::yaml` (strict: unknown keys and wrong types are
//! errors naming file, line and column).

pub mod args;
pub mod cluster;
pub mod lists;
pub mod preset;
pub(crate) mod remediation;

use std::path::{Path, PathBuf};

use launch_spec::GpuProfiles;
use launch_spec::yaml::{YamlError, from_yaml_file};

pub use cluster::{ClusterProfile, Environment};
pub use preset::Preset;

/// How a multi-leg launch puts one model's legs into Slurm jobs (issue 24; docs/submitter.md,
/// "Shared allocation"): one job per leg, one job per model whose one engine serves every leg, or
/// one job for several fine-tunes of one architecture whose engine swaps each model's weights in
/// (issue 37, docs/allocation.md "Pools"). Written `per-leg` / `shared` / `pool` in presets,
/// profiles and on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Allocation {
    #[default]
    PerLeg,
    Shared,
    Pool,
}

impl Allocation {
    pub fn as_str(self) -> &'static str {
        match self {
            Allocation::PerLeg => "per-leg",
            Allocation::Shared => "shared",
            Allocation::Pool => "pool",
        }
    }
}

pub(crate) const GPU_PROFILES_FILE: &str = "gpus.yaml";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Yaml(#[from] YamlError),
    #[error("unknown cluster `{name}`{hint}: valid clusters are {valid} (profiles live in {dir})")]
    UnknownCluster { name: String, hint: String, valid: String, dir: PathBuf },
    #[error("unknown preset `{name}`{hint}: valid presets are {valid} (presets live in {dir})")]
    UnknownPreset { name: String, hint: String, valid: String, dir: PathBuf },
    #[error("{path}: cannot read directory: {source}")]
    Dir { path: PathBuf, source: std::io::Error },
    #[error("{path}: {problem}")]
    Invalid { path: PathBuf, problem: String },
    #[error(
        "cannot find the configuration root (a directory with clusters/gpus.yaml): run from the repository, or set SUBMITTER_HOME"
    )]
    NoRoot,
}

/// Where configuration lives: `<root>/clusters`, `<root>/presets`, `<root>/model_config`.
#[derive(Debug, Clone)]
pub struct ConfigRoot {
    pub root: PathBuf,
}

impl ConfigRoot {
    /// `$SUBMITTER_HOME`, else the nearest ancestor of the working directory, else of the
    /// executable, that holds `clusters/gpus.yaml`.
    pub fn discover() -> Result<ConfigRoot, ConfigError> {
        if let Some(home) = std::env::var_os("SUBMITTER_HOME") {
            return Ok(ConfigRoot { root: PathBuf::from(home) });
        }
        let starts = [std::env::current_dir().ok(), std::env::current_exe().ok()];
        starts
            .into_iter()
            .flatten()
            .find_map(|start| {
                start
                    .ancestors()
                    .find(|dir| dir.join("clusters").join(GPU_PROFILES_FILE).is_file())
                    .map(Path::to_path_buf)
            })
            .map(|root| ConfigRoot { root })
            .ok_or(ConfigError::NoRoot)
    }

    pub fn clusters_dir(&self) -> PathBuf {
        self.root.join("clusters")
    }
    pub fn presets_dir(&self) -> PathBuf {
        self.root.join("presets")
    }
    pub fn registry_dir(&self) -> PathBuf {
        self.root.join("model_config")
    }
    pub fn harbor_configs_dir(&self) -> PathBuf {
        self.presets_dir().join("harbor")
    }
}

fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let read = std::fs::read_dir(dir).map_err(|source| ConfigError::Dir { path: dir.to_path_buf(), source })?;
    let mut files: Vec<PathBuf> = read
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

fn stem(path: &Path) -> String {
    path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string()
}

/// Every cluster profile in `dir` (all `*.yaml` but `gpus.yaml`), with its file.
pub fn load_clusters(dir: &Path) -> Result<Vec<(PathBuf, ClusterProfile)>, ConfigError> {
    yaml_files(dir)?
        .into_iter()
        .filter(|path| path.file_name().is_some_and(|n| n != GPU_PROFILES_FILE))
        .map(|path| {
            let profile: ClusterProfile = from_yaml_file(&path)?;
            if profile.name != stem(&path) {
                return Err(ConfigError::Invalid {
                    path: path.clone(),
                    problem: format!("name `{}` differs from the file name: rename one of them", profile.name),
                });
            }
            Ok((path, profile))
        })
        .collect()
}

/// ` (did you mean `NAME`?)` for the candidate closest to `given` when one is close enough, else
/// empty: shared by every "unknown name" error (benchmarks, presets, clusters).
pub fn did_you_mean<S: AsRef<str>>(given: &str, candidates: impl IntoIterator<Item = S>) -> String {
    let closest = candidates
        .into_iter()
        .map(|c| (strsim::normalized_damerau_levenshtein(given, c.as_ref()), c.as_ref().to_string()))
        .filter(|(score, _)| *score >= 0.6)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    closest.map(|(_, name)| format!(" (did you mean `{name}`?)")).unwrap_or_default()
}

/// The profile whose `hosts:` pattern matches `hostname` (its name and the pattern), `None` when
/// none does; two profiles matching is an error (which one is meant cannot be guessed).
pub(crate) fn cluster_for_host(dir: &Path, hostname: &str) -> Result<Option<(String, String)>, ConfigError> {
    let matching: Vec<(String, String)> = load_clusters(dir)?
        .into_iter()
        .filter_map(|(_, c)| c.hosts.iter().find(|p| host_matches(p, hostname)).map(|p| (c.name.clone(), p.clone())))
        .collect();
    match matching.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.clone())),
        several => Err(ConfigError::Invalid {
            path: dir.to_path_buf(),
            problem: format!(
                "host `{hostname}` matches the hosts: of several profiles ({}): give --cluster",
                several.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
            ),
        }),
    }
}

/// A `hosts:` pattern: `*` matches any run of characters, everything else itself (case-insensitive,
/// as hostnames are).
fn host_matches(pattern: &str, hostname: &str) -> bool {
    let body = pattern.split('*').map(regex::escape).collect::<Vec<_>>().join(".*");
    regex::RegexBuilder::new(&format!("^{body}$")).case_insensitive(true).build().is_ok_and(|re| re.is_match(hostname))
}

/// The cluster called `name` or aliased so (`tacc` → `vista`); a profile with any problem
/// `registry check` reports is refused here, so no command runs with it.
pub fn load_cluster(dir: &Path, name: &str) -> Result<ClusterProfile, ConfigError> {
    let clusters = load_clusters(dir)?;
    if let Some((path, found)) = clusters.iter().find(|(_, c)| c.name == name || c.aliases.iter().any(|a| a == name)) {
        return refuse_problems(path, found.problems()).map(|()| found.clone());
    }
    let valid =
        clusters
            .iter()
            .map(|(_, c)| {
                if c.aliases.is_empty() {
                    c.name.clone()
                } else {
                    format!("{} (alias {})", c.name, c.aliases.join(", "))
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
    let names = clusters.iter().flat_map(|(_, c)| std::iter::once(&c.name).chain(&c.aliases));
    let hint = did_you_mean(name, names);
    Err(ConfigError::UnknownCluster { name: name.to_string(), hint, valid, dir: dir.to_path_buf() })
}

pub fn load_gpu_profiles(clusters_dir: &Path) -> Result<GpuProfiles, ConfigError> {
    let path = clusters_dir.join(GPU_PROFILES_FILE);
    let profiles: GpuProfiles = from_yaml_file(&path)?;
    if let Some(problem) = profiles.problems().into_iter().next() {
        return Err(ConfigError::Invalid { path, problem });
    }
    Ok(profiles)
}

/// Every preset in `dir`, named by file stem.
pub fn load_presets(dir: &Path) -> Result<Vec<(String, PathBuf, Preset)>, ConfigError> {
    yaml_files(dir)?
        .into_iter()
        .map(|path| {
            let preset = Preset { name: stem(&path), ..from_yaml_file::<Preset>(&path)? };
            Ok((stem(&path), path.clone(), preset))
        })
        .collect()
}

/// The preset `presets/<name>.yaml`; one with any problem `registry check` reports is refused.
pub fn load_preset(dir: &Path, name: &str) -> Result<Preset, ConfigError> {
    let path = dir.join(format!("{name}.yaml"));
    let is_name = !name.is_empty() && !name.starts_with('.') && !name.contains('/');
    if is_name && path.exists() {
        let preset = Preset { name: name.to_string(), ..from_yaml_file::<Preset>(&path)? };
        let harbor_dir = dir.join("harbor");
        return refuse_problems(&path, preset.problems_with(&harbor_dir)).map(|()| preset);
    }
    let names: Vec<String> = yaml_files(dir)?.iter().map(|p| stem(p)).collect();
    let hint = did_you_mean(name, &names);
    Err(ConfigError::UnknownPreset { name: name.to_string(), hint, valid: names.join(", "), dir: dir.to_path_buf() })
}

/// The first problem as the error (with how many more), none → Ok.
fn refuse_problems(path: &Path, problems: Vec<String>) -> Result<(), ConfigError> {
    let Some(first) = problems.first() else { return Ok(()) };
    let more = match problems.len() {
        1 => String::new(),
        n => format!(" (and {} more: `submitter registry check` lists them)", n - 1),
    };
    Err(ConfigError::Invalid { path: path.to_path_buf(), problem: format!("{first}{more}") })
}

/// Parses Slurm's `--time` forms (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`) to seconds.
pub fn parse_slurm_time(text: &str) -> Option<u64> {
    let (days, rest) = match text.split_once('-') {
        Some((d, rest)) => (d.parse::<u64>().ok()?, rest),
        None => (0, text),
    };
    let parts: Vec<u64> = rest.split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let with_days = text.contains('-');
    // Below the leading field a clock's ranges hold (`99999:99:99` is no time), and hours below days.
    let below = |v: &u64, max: u64| (*v < max).then_some(*v);
    let seconds = match (with_days, parts.as_slice()) {
        (false, [m]) => m * 60,
        (false, [m, s]) => m * 60 + below(s, 60)?,
        (false, [h, m, s]) => h * 3600 + below(m, 60)? * 60 + below(s, 60)?,
        (true, [h, m, s]) => below(h, 24)? * 3600 + below(m, 60)? * 60 + below(s, 60)?,
        (true, [h]) => below(h, 24)? * 3600,
        (true, [h, m]) => below(h, 24)? * 3600 + below(m, 60)? * 60,
        _ => return None,
    };
    // Past Slurm's own bound on a job's time, and the 30 days every duration here is held to.
    let total = days.checked_mul(86400)?.checked_add(seconds)?;
    (total <= launch_spec::validate::MAX_SECONDS).then_some(total)
}

#[cfg(test)]
mod host_tests {
    #[test]
    fn host_patterns_match_whole_names_with_stars() {
        assert!(super::host_matches("login*.leonardo.cineca.it", "login05.leonardo.cineca.it"));
        assert!(super::host_matches("jrlogin*", "JRLOGIN03"));
        assert!(!super::host_matches("login*.leonardo.cineca.it", "login05.leonardo.cineca.it.evil"));
        assert!(!super::host_matches("vista", "vista2"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_times() {
        assert_eq!(parse_slurm_time("12:00:00"), Some(43200));
        assert_eq!(parse_slurm_time("23:59:00"), Some(86340));
        assert_eq!(parse_slurm_time("48:00:00"), Some(172800));
        assert_eq!(parse_slurm_time("1-00:00:00"), Some(86400));
        assert_eq!(parse_slurm_time("30"), Some(1800));
        assert_eq!(parse_slurm_time("2-12"), Some(216000));
        assert_eq!(parse_slurm_time("soon"), None);
        assert_eq!(parse_slurm_time("1:2:3:4"), None);
        assert_eq!(parse_slurm_time("99999:99:99"), None, "minutes and seconds below 60");
        assert_eq!(parse_slurm_time("1-24:00:00"), None, "hours below 24 with days");
        assert_eq!(parse_slurm_time("31-00:00:00"), None, "at most 30 days");
        assert_eq!(parse_slurm_time("720:00:00"), Some(30 * 86400));
    }
}
