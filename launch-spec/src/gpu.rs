//! GPU inventory and GPU profiles (admin-tuned, `clusters/gpus.yaml`), carried in the launch spec.

use serde::{Deserialize, Serialize};

/// One GPU as NVML (or a fixture) reports it. The fixture file format is a JSON array of these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_bytes: u64,
}

impl GpuInfo {
    pub fn memory_total_gib(&self) -> f64 {
        self.memory_total_bytes as f64 / (1u64 << 30) as f64
    }
}

/// `clusters/gpus.yaml`: an ordered list; the first matching profile wins; the last must match any GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuProfiles {
    pub profiles: Vec<GpuProfile>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuProfile {
    /// Profile name shown in plans and status (`a100-64gb`, `h200`, …).
    pub name: String,
    /// Case-insensitive substring of the NVML device name; empty matches every GPU (the catch-all).
    #[serde(default)]
    pub name_contains: String,
    /// Inclusive total-memory range in GiB, when the name alone is ambiguous (A100 40/64/80 GB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_memory_gib: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory_gib: Option<f64>,
    /// vLLM `--gpu-memory-utilization` for this chip.
    pub gpu_memory_utilization: f64,
    /// Extra vLLM flags for this chip, appended before the registry's extra args.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_vllm_args: Vec<String>,
    /// Free text for admins: why this value (e.g. "0.95 OOMs during CUDA-graph capture").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl GpuProfile {
    pub fn matches(&self, gpu: &GpuInfo) -> bool {
        let name_ok =
            self.name_contains.is_empty() || gpu.name.to_lowercase().contains(&self.name_contains.to_lowercase());
        let gib = gpu.memory_total_gib();
        let min_ok = self.min_memory_gib.is_none_or(|min| gib >= min);
        let max_ok = self.max_memory_gib.is_none_or(|max| gib <= max);
        name_ok && min_ok && max_ok
    }

    pub fn is_catch_all(&self) -> bool {
        self.name_contains.is_empty() && self.min_memory_gib.is_none() && self.max_memory_gib.is_none()
    }
}

#[cfg(any(test, feature = "testkit"))]
impl GpuProfile {
    /// A profile matching names containing `contains` within the `(min, max)` GiB range, for the
    /// tests of both programs (no extra vLLM arguments, no note).
    pub fn for_tests(name: &str, contains: &str, memory_gib: (Option<f64>, Option<f64>), util: f64) -> GpuProfile {
        GpuProfile {
            name: name.into(),
            name_contains: contains.into(),
            min_memory_gib: memory_gib.0,
            max_memory_gib: memory_gib.1,
            gpu_memory_utilization: util,
            extra_vllm_args: vec![],
            note: None,
        }
    }
}

impl GpuProfiles {
    /// First profile matching `gpu`, in file order.
    pub fn select(&self, gpu: &GpuInfo) -> Option<&GpuProfile> {
        self.profiles.iter().find(|profile| profile.matches(gpu))
    }

    /// Problems an admin must fix: no profiles, no final catch-all, utilisation outside (0, 1].
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        match self.profiles.last() {
            None => problems.push("no GPU profiles: add at least a final catch-all entry".to_string()),
            Some(last) if !last.is_catch_all() => problems.push(format!(
                "the last GPU profile `{}` is not a catch-all: end the list with an entry that has no name_contains and no memory range",
                last.name
            )),
            Some(_) => {}
        }
        for profile in &self.profiles {
            if let Err(problem) = crate::validate::fraction(profile.gpu_memory_utilization) {
                problems.push(format!("GPU profile `{}`: gpu_memory_utilization {problem}", profile.name));
            }
        }
        problems
    }
}

/// The ceiling a job runs with, by the one precedence ([`crate::settings::Layers`]): the spec's
/// override (the command line's or the preset's) > the cluster profile's > the GPU profile's.
/// The second value is the source as payload records it (`gpu.json`, `plan`).
pub fn effective_gpu_memory_utilization(
    spec_override: Option<f64>,
    cluster_override: Option<f64>,
    profile: Option<&GpuProfile>,
) -> Option<(f64, &'static str)> {
    use crate::settings::{Layers, Source, at};
    let chosen = Layers {
        cli: at(spec_override, Source::Spec),
        preset: None,
        profile: at(cluster_override, Source::Profile(String::new())),
        gpu_profile: at(profile.map(|p| p.gpu_memory_utilization), Source::GpuProfile(String::new())),
    }
    .resolve()?;
    let label = match chosen.source {
        Source::Spec => "launch spec override",
        Source::Profile(_) => "cluster override",
        _ => "GPU profile",
    };
    Some((chosen.value, label))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(name: &str, gib: u64) -> GpuInfo {
        GpuInfo { index: 0, uuid: "GPU-x".into(), name: name.into(), memory_total_bytes: gib << 30 }
    }

    fn profile(name: &str, contains: &str, min: Option<f64>, max: Option<f64>, util: f64) -> GpuProfile {
        GpuProfile::for_tests(name, contains, (min, max), util)
    }

    #[test]
    fn first_match_wins_with_memory_ranges() {
        let profiles = GpuProfiles {
            profiles: vec![
                profile("a100-40", "a100", None, Some(41.0), 0.9),
                profile("a100-64", "A100", Some(60.0), Some(66.0), 0.85),
                profile("default", "", None, None, 0.8),
            ],
        };
        assert_eq!(profiles.select(&gpu("NVIDIA A100-SXM-64GB", 64)).unwrap().name, "a100-64");
        assert_eq!(profiles.select(&gpu("NVIDIA A100-SXM4-40GB", 40)).unwrap().name, "a100-40");
        assert_eq!(profiles.select(&gpu("Tesla T4", 15)).unwrap().name, "default");
        assert!(profiles.problems().is_empty());
    }

    #[test]
    fn missing_catch_all_is_a_problem() {
        let profiles = GpuProfiles { profiles: vec![profile("h100", "H100", None, None, 0.9)] };
        assert_eq!(profiles.problems().len(), 1);
    }

    #[test]
    fn precedence_spec_then_cluster_then_profile() {
        let p = profile("d", "", None, None, 0.8);
        assert_eq!(effective_gpu_memory_utilization(Some(0.5), Some(0.7), Some(&p)).unwrap().0, 0.5);
        assert_eq!(effective_gpu_memory_utilization(None, Some(0.7), Some(&p)).unwrap().0, 0.7);
        assert_eq!(effective_gpu_memory_utilization(None, None, Some(&p)).unwrap().0, 0.8);
    }
}
