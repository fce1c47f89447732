//! What an operator selects to evaluate: the legs (one preset each, or the `--datasets` leg) and
//! the operator's overrides, as library types. The command line only parses into these; the rules
//! (what `ID` means, what `--datasets` builds, which combinations are refused) live here, once, for
//! every command (`spec`, `plan`, `launch`, the listener).

use std::path::Path;

use crate::config::{self, ConfigError, Preset};

/// `--preset ID`: the team's standard evaluation, three legs.
pub(crate) const ID_PRESETS: [&str; 3] = ["swebench", "v2", "tb2"];

/// Dataset names the team's cluster scripts rewrite before running (their benchmark-name map): the
/// eval-set name is the random-100 folder set, so `--datasets` runs (and dedups) that one.
pub(crate) const DATASET_ALIASES: [(&str, &str); 1] =
    [("DCAgent/swebench_verified_eval_set", "DCAgent2/swebench-verified-random-100-folders")];

/// `dataset`, or what the team's alias names it.
pub(crate) fn dataset_alias(dataset: &str) -> &str {
    DATASET_ALIASES.iter().find(|(alias, _)| *alias == dataset).map_or(dataset, |(_, to)| to)
}

/// The leg name `--datasets D…` gets (job-name tag, the recorded `preset`).
pub(crate) const DATASETS_LEG: &str = config::preset::DATASETS_NAME;

/// One leg of a run: a preset (or the `--datasets` preset) under its name.
#[derive(Debug, Clone, PartialEq)]
pub struct Leg {
    pub name: String,
    pub preset: Preset,
}

impl Leg {
    /// The short tag in job names and logs: the preset's `log_suffix`, else its name.
    pub fn short(&self) -> &str {
        self.preset.log_suffix.as_deref().unwrap_or(&self.name)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SelectionError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("select benchmarks with --preset P (repeatable; `ID` is {}) or --datasets D…", ID_PRESETS.join(", "))]
    Nothing,
    #[error(
        "--preset and --datasets together: give one — a preset names its datasets (`--datasets` is a leg with default settings)"
    )]
    Both,
    #[error("--n-concurrent {given}: leg `{leg}` is not selected (selected: {selected})")]
    UnknownLeg { given: String, leg: String, selected: String },
}

/// The legs for `--preset P…` (with `ID` expanded) or `--datasets D…`, never both.
pub fn legs(presets_dir: &Path, presets: &[String], datasets: &[String]) -> Result<Vec<Leg>, SelectionError> {
    match (presets.is_empty(), datasets.is_empty()) {
        (false, false) => return Err(SelectionError::Both),
        (true, true) => return Err(SelectionError::Nothing),
        (true, false) => {
            let datasets = datasets.iter().map(|d| dataset_alias(d).to_string()).collect();
            return Ok(vec![Leg { name: DATASETS_LEG.to_string(), preset: Preset::for_datasets(datasets) }]);
        }
        (false, true) => {}
    }
    let mut legs = Vec::new();
    for name in presets {
        let names: Vec<&str> = if name == "ID" { ID_PRESETS.to_vec() } else { vec![name.as_str()] };
        for name in names {
            if legs.iter().any(|l: &Leg| l.name == name) {
                continue;
            }
            legs.push(Leg { name: name.to_string(), preset: config::load_preset(presets_dir, name)? });
        }
    }
    Ok(legs)
}

/// `--n-concurrent N` (every leg) and `--n-concurrent LEG=N` (one leg), as given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Concurrency {
    pub all: Option<u32>,
    pub per_leg: Vec<(String, u32)>,
}

impl Concurrency {
    /// Parses one `--n-concurrent` value: `N` or `LEG=N`, N ≥ 1.
    pub(crate) fn parse_item(text: &str) -> Result<(Option<String>, u32), String> {
        let (leg, count) = match text.split_once('=') {
            Some((leg, count)) => (Some(leg.trim().to_string()), count),
            None => (None, text),
        };
        if leg.as_deref().is_some_and(str::is_empty) {
            return Err(format!("`{text}` is not N or LEG=N"));
        }
        Ok((leg, config::args::count(count)?))
    }

    pub(crate) fn from_items(items: &[(Option<String>, u32)]) -> Concurrency {
        let mut out = Concurrency::default();
        for (leg, n) in items {
            match leg {
                None => out.all = Some(*n),
                Some(leg) => out.per_leg.push((leg.clone(), *n)),
            }
        }
        out
    }

    /// The override for `leg` (named by its preset name or its short tag): its own, else the one
    /// for every leg.
    pub(crate) fn for_leg(&self, leg: &Leg) -> Option<u32> {
        let own = |(l, _): &&(String, u32)| *l == leg.name || l == leg.short();
        self.per_leg.iter().rev().find(own).map(|(_, n)| *n).or(self.all)
    }

    /// Refuses a `LEG=N` naming a leg that is not selected (a typo would silently do nothing).
    pub fn check(&self, legs: &[Leg]) -> Result<(), SelectionError> {
        for (leg, n) in &self.per_leg {
            if !legs.iter().any(|l| &l.name == leg || l.short() == leg) {
                return Err(SelectionError::UnknownLeg {
                    given: format!("{leg}={n}"),
                    leg: leg.clone(),
                    selected: legs.iter().map(|l| l.name.as_str()).collect::<Vec<_>>().join(", "),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn presets_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../presets")
    }

    #[test]
    fn id_expands_to_three_legs_and_datasets_is_its_own_leg() {
        let legs = legs(&presets_dir(), &["ID".into(), "tb2".into()], &[]).unwrap();
        let names: Vec<&str> = legs.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["swebench", "v2", "tb2"], "ID expanded, tb2 not twice");
        let legs = legs_for_datasets();
        assert_eq!(legs[0].name, DATASETS_LEG);
        assert_eq!(legs[0].preset.datasets, ["org/a", "org/b"]);
        assert_eq!(legs[0].preset, Preset::for_datasets(vec!["org/a".into(), "org/b".into()]));
    }

    fn legs_for_datasets() -> Vec<Leg> {
        legs(&presets_dir(), &[], &["org/a".into(), "org/b".into()]).unwrap()
    }

    /// Issue 31: the seed's vocabulary — `--preset dev` (dev_set_71_tasks), and the eval-set name
    /// every cluster script maps to the random-100 folder set.
    #[test]
    fn the_teams_preset_and_dataset_names_are_known() {
        let dev = legs(&presets_dir(), &["dev".into()], &[]).unwrap();
        assert_eq!(
            (dev[0].preset.datasets.as_slice(), dev[0].short()),
            (&["DCAgent/dev_set_71_tasks".to_string()][..], "dev")
        );
        let aliased = legs(&presets_dir(), &[], &["DCAgent/swebench_verified_eval_set".into()]).unwrap();
        assert_eq!(aliased[0].preset.datasets, ["DCAgent2/swebench-verified-random-100-folders"]);
        assert_eq!(Preset::benchmark_of(&aliased[0].preset.datasets[0]), "swebench-verified-random-100-folders");
    }

    #[test]
    fn preset_with_datasets_and_neither_are_refused() {
        let both = legs(&presets_dir(), &["tb2".into()], &["org/a".into()]).unwrap_err().to_string();
        assert!(both.contains("--preset and --datasets together"), "{both}");
        assert!(matches!(legs(&presets_dir(), &[], &[]), Err(SelectionError::Nothing)));
    }

    #[test]
    fn concurrency_per_leg_wins_over_the_global_one() {
        let items: Vec<_> = ["48", "tb2=64", "v2=128"].iter().map(|t| Concurrency::parse_item(t).unwrap()).collect();
        let c = Concurrency::from_items(&items);
        let id = legs(&presets_dir(), &["ID".into()], &[]).unwrap();
        let got: Vec<_> = id.iter().map(|l| c.for_leg(l)).collect();
        assert_eq!(got, [Some(48), Some(128), Some(64)], "swebench, v2, tb2");
        assert!(Concurrency::parse_item("tb2=0").is_err() && Concurrency::parse_item("=3").is_err());
        let legs = legs(&presets_dir(), &["tb2".into()], &[]).unwrap();
        assert!(c.check(&legs).unwrap_err().to_string().contains("leg `v2` is not selected"));
    }
}
