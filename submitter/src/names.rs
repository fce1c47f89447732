//! Benchmark names as operators type them: the ledger's benchmark and family names, a preset's name
//! (`tb2`, `v2`, `swebench` — its dataset), or the short label `status` and `results` print
//! (`tb2`, `swebench-100`, `dev_set_v2`). Every command that takes `--benchmark` resolves it here,
//! once, so an unknown name is an error naming the known ones, never an empty answer (issue 36).

use std::collections::BTreeSet;
use std::path::Path;

use crate::config::{self, Preset, did_you_mean};
use crate::ledger::{self, Ledger};
use crate::selection::dataset_alias;
use crate::verify::results::short_name;

/// The names a `--benchmark` may be: the ledger's, and what each preset runs.
#[derive(Debug, Clone, Default)]
pub(crate) struct KnownBenchmarks {
    /// Benchmark and family names the ledger holds, and the presets' benchmarks.
    names: BTreeSet<String>,
    /// Each preset's name and the benchmarks its datasets are (as the team's alias names them).
    presets: Vec<(String, Vec<String>)>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum NameError {
    #[error("unknown benchmark `{given}`{hint}: known benchmarks are {known}")]
    Unknown { given: String, hint: String, known: String },
    #[error("benchmark `{given}` is ambiguous: it names {candidates} — give one of them")]
    Ambiguous { given: String, candidates: String },
}

impl KnownBenchmarks {
    pub(crate) fn new(names: impl IntoIterator<Item = String>, presets: Vec<(String, Vec<String>)>) -> Self {
        let mut names: BTreeSet<String> = names.into_iter().collect();
        names.extend(presets.iter().flat_map(|(_, datasets)| datasets.iter().cloned()));
        KnownBenchmarks { names, presets }
    }

    /// The ledger's benchmarks and families, and the presets in `presets_dir` (a preset that does
    /// not load is left out: `registry check` reports it).
    pub(crate) fn load(ledger: &dyn Ledger, presets_dir: &Path) -> ledger::Result<Self> {
        let mut names = Vec::new();
        for (benchmark, family) in ledger.families()? {
            names.extend([benchmark, family]);
        }
        for pair in ledger.latest_per_pair()? {
            names.extend([pair.latest.benchmark, pair.family]);
        }
        let presets = config::load_presets(presets_dir)
            .map(|all| {
                all.into_iter()
                    .map(|(name, _, preset)| {
                        let benchmarks = preset.datasets.iter().map(|d| Preset::benchmark_of(dataset_alias(d)));
                        (name, benchmarks.collect())
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(KnownBenchmarks::new(names, presets))
    }

    /// The benchmark `given` names: itself when known, a preset's one dataset, the benchmark
    /// whose short label or last path part it is; else an error with the closest known name.
    pub(crate) fn resolve(&self, given: &str) -> Result<String, NameError> {
        if self.names.contains(given) {
            return Ok(given.to_string());
        }
        if let Some((_, datasets)) = self.presets.iter().find(|(name, _)| name == given) {
            return self.one(given, datasets.iter().cloned().collect());
        }
        let by_label: BTreeSet<String> = self
            .names
            .iter()
            .filter(|name| short_name(name) == given || name.rsplit('/').next() == Some(given))
            .cloned()
            .collect();
        if !by_label.is_empty() {
            return self.one(given, by_label);
        }
        Err(self.unknown(given))
    }

    fn one(&self, given: &str, candidates: BTreeSet<String>) -> Result<String, NameError> {
        // Several names with one short label are one benchmark when they are one family's
        // members; the caller maps any of them to the family, so the first does.
        let labels: BTreeSet<String> = candidates.iter().map(|c| short_name(c)).collect();
        match (candidates.first(), labels.len()) {
            (Some(first), 1) => Ok(first.clone()),
            (None, _) => Err(self.unknown(given)),
            _ => Err(NameError::Ambiguous {
                given: given.to_string(),
                candidates: candidates.into_iter().collect::<Vec<_>>().join(", "),
            }),
        }
    }

    fn unknown(&self, given: &str) -> NameError {
        let labels: BTreeSet<String> = self
            .presets
            .iter()
            .map(|(name, _)| name.clone())
            .chain(self.names.iter().map(|n| short_name(n)))
            .chain(self.names.iter().cloned())
            .collect();
        let hint = did_you_mean(given, &labels);
        let known =
            if labels.is_empty() { "none yet".to_string() } else { labels.into_iter().collect::<Vec<_>>().join(", ") };
        NameError::Unknown { given: given.to_string(), hint, known }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> KnownBenchmarks {
        KnownBenchmarks::new(
            ["DCAgent_dev_set_v2".to_string(), "dev_set_v2_2.0x".to_string()],
            vec![
                ("tb2".into(), vec!["terminal_bench_2".into()]),
                ("v2".into(), vec!["dev_set_v2".into()]),
                ("swebench".into(), vec!["swebench-verified-random-100-folders".into()]),
            ],
        )
    }

    #[test]
    fn short_names_and_presets_resolve() {
        let k = known();
        assert_eq!(k.resolve("tb2").unwrap(), "terminal_bench_2");
        assert_eq!(k.resolve("v2").unwrap(), "dev_set_v2");
        assert_eq!(k.resolve("dev_set_v2").unwrap(), "dev_set_v2");
        assert_eq!(k.resolve("DCAgent_dev_set_v2").unwrap(), "DCAgent_dev_set_v2");
        assert_eq!(k.resolve("swebench-100").unwrap(), "swebench-verified-random-100-folders");
        assert_eq!(k.resolve("terminal_bench_2").unwrap(), "terminal_bench_2");
    }

    #[test]
    fn a_typo_is_an_error_with_the_closest_name() {
        let err = known().resolve("dev_set_vv2").unwrap_err().to_string();
        assert!(err.contains("unknown benchmark `dev_set_vv2`") && err.contains("did you mean `dev_set_v2`"), "{err}");
        assert!(err.contains("tb2") && err.contains("swebench"), "names the known ones: {err}");
        let far = known().resolve("zzzzzzzzzzzz").unwrap_err().to_string();
        assert!(!far.contains("did you mean"), "{far}");
    }
}
