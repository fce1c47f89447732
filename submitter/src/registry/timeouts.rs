//! The timeout policy's size bands (docs/design.md §4.3), as data: `model_config/_timeouts.yaml`.
//!
//! The largest total size token of the id (`size::total_size`, so `…-30B-A3B` is 30B) picks the
//! first band holding it; a name in no band, or with no size token, gets `otherwise` and a note.
//! Each band names the canonical Harbor config the team selects for that size; the config's own
//! `timeout_multiplier` equals the band's (`registry check` and the conformance test hold them together).

use std::path::Path;

use launch_spec::yaml::{YamlError, from_yaml_file};
use serde::Deserialize;

pub(crate) const TIMEOUTS_FILE: &str = "_timeouts.yaml";

/// `model_config/_timeouts.yaml`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutPolicy {
    /// In order; the first band holding the size wins.
    pub bands: Vec<Band>,
    /// For names in no band and names with no size token.
    pub otherwise: Choice,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Band {
    /// Inclusive bounds in billions of parameters; an absent bound is open.
    #[serde(default)]
    pub(crate) min_b: Option<f64>,
    #[serde(default)]
    pub(crate) max_b: Option<f64>,
    pub timeout_multiplier: f64,
    /// The canonical Harbor config for this size, by file name in `presets/harbor/` (it runs when
    /// neither the command line nor the preset names one).
    pub harbor_config: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Choice {
    pub timeout_multiplier: f64,
    /// As [`Band::harbor_config`].
    pub harbor_config: String,
}

/// What the bands chose for one id, and whether it was the fallback.
#[derive(Debug, Clone, PartialEq)]
pub struct BandChoice {
    pub timeout_multiplier: f64,
    pub harbor_config: String,
    pub fallback: bool,
}

impl Default for TimeoutPolicy {
    /// The team's policy, for a registry without `_timeouts.yaml` (the shipped file says the same).
    fn default() -> Self {
        let band = |min_b, max_b, timeout_multiplier, file: &str| Band {
            min_b,
            max_b,
            timeout_multiplier,
            harbor_config: file.to_string(),
        };
        TimeoutPolicy {
            bands: vec![
                band(None, Some(14.0), 2.0, "dcagent_eval_defaults.yaml"),
                band(Some(28.0), Some(42.0), 16.0, "dcagent_eval_defaults_32b.yaml"),
            ],
            otherwise: Choice { timeout_multiplier: 2.0, harbor_config: "dcagent_eval_defaults.yaml".to_string() },
        }
    }
}

impl TimeoutPolicy {
    /// `<root>/_timeouts.yaml`, or the team's policy when the registry has none.
    pub fn load(root: &Path) -> Result<TimeoutPolicy, YamlError> {
        let path = root.join(TIMEOUTS_FILE);
        if !path.exists() {
            return Ok(TimeoutPolicy::default());
        }
        let policy: TimeoutPolicy = from_yaml_file(&path)?;
        if let Some(problem) = policy.problem() {
            return Err(YamlError { path, line: None, column: None, message: problem });
        }
        Ok(policy)
    }

    /// Every (multiplier, config) the policy can choose, with the place that says it.
    pub fn choices(&self) -> Vec<(String, f64, &str)> {
        let bands = self
            .bands
            .iter()
            .enumerate()
            .map(|(i, b)| (format!("bands[{i}]"), b.timeout_multiplier, b.harbor_config.as_str()));
        bands
            .chain(std::iter::once((
                "otherwise".to_string(),
                self.otherwise.timeout_multiplier,
                self.otherwise.harbor_config.as_str(),
            )))
            .collect()
    }

    /// The first value no command may use, naming the field and the fix.
    pub fn problem(&self) -> Option<String> {
        for (place, multiplier, config) in self.choices() {
            if let Err(problem) = launch_spec::validate::multiplier(multiplier) {
                return Some(format!("{place}.timeout_multiplier {problem}"));
            }
            if config.is_empty() || config.contains('/') {
                return Some(format!("{place}.harbor_config must name a file in presets/harbor/"));
            }
        }
        self.bands.iter().enumerate().find_map(|(i, b)| match (b.min_b, b.max_b) {
            (Some(lo), Some(hi)) if lo > hi => Some(format!("bands[{i}]: min_b {lo} is above max_b {hi}")),
            _ => None,
        })
    }

    /// The band for `id` by its largest size token.
    pub fn choose(&self, id: &str) -> BandChoice {
        let band = super::size::total_size(id).and_then(|size| {
            self.bands.iter().find(|b| b.min_b.is_none_or(|lo| size >= lo) && b.max_b.is_none_or(|hi| size <= hi))
        });
        match band {
            Some(band) => BandChoice {
                timeout_multiplier: band.timeout_multiplier,
                harbor_config: band.harbor_config.clone(),
                fallback: false,
            },
            None => BandChoice {
                timeout_multiplier: self.otherwise.timeout_multiplier,
                harbor_config: self.otherwise.harbor_config.clone(),
                fallback: true,
            },
        }
    }
}
