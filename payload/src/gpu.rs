//! GPU inventory behind [`GpuProbe`] (NVML on real nodes, a JSON fixture in tests and demos) and
//! the choice of GPU profile and gpu-memory ceiling (docs/design.md §3.2, §6.2 step 3).
//!
//! `PAYLOAD_GPU_FIXTURE=<file>` selects [`FixtureProbe`]: a JSON array of
//! `{"index","uuid","name","memory_total_bytes"}` objects. It is a test/demo facility: the real
//! path is NVML, loaded at run time (`libnvidia-ml.so.1`), so a node without a driver gets a clear
//! `gpu`-class error instead of a link failure.

use std::path::{Path, PathBuf};

use launch_spec::gpu::effective_gpu_memory_utilization;
use launch_spec::{GpuInfo, GpuProfile, GpuProfiles, LaunchSpec, OutcomeClass};

use crate::failure::Failure;

/// Environment variable naming a GPU fixture file (tests and demos only).
pub(crate) const FIXTURE_VAR: &str = "PAYLOAD_GPU_FIXTURE";

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum GpuError {
    #[error("no NVML: {0}")]
    NoNvml(String),
    #[error("NVML error: {0}")]
    Nvml(String),
    #[error("GPU fixture {path}: {message}")]
    Fixture { path: PathBuf, message: String },
    #[error(
        "{have} GPU(s) visible but the engine needs {need} (tensor_parallel_size × data_parallel_size): request {need} GPUs or lower TP/DP"
    )]
    TooFew { have: u32, need: u32 },
    #[error(
        "no GPU profile matches `{gpu}` and the spec sets no gpu_memory_utilization: add a final catch-all profile to clusters/gpus.yaml"
    )]
    NoProfile { gpu: String },
    #[error(
        "CUDA_VISIBLE_DEVICES={value:?} names GPU {entry} more than once: list each GPU once (Slurm sets it from the job's gres)"
    )]
    DuplicateVisible { value: String, entry: String },
}

impl From<GpuError> for Failure {
    fn from(err: GpuError) -> Self {
        let failure = Failure::new(OutcomeClass::Gpu, err.to_string());
        match err {
            GpuError::NoNvml(_) => failure.with_cause("no_nvml"),
            GpuError::TooFew { .. } => failure.with_cause("too_few_gpus"),
            GpuError::DuplicateVisible { .. } => failure.with_cause("cuda_visible_devices"),
            _ => failure,
        }
    }
}

pub trait GpuProbe {
    /// Every GPU the probe sees, in index order.
    fn probe(&self) -> Result<Vec<GpuInfo>, GpuError>;
    /// `nvml` or `fixture:<path>`, for plans and events.
    fn describe(&self) -> String;
}

/// NVML through `nvml-wrapper` (dlopen at run time).
pub(crate) struct NvmlProbe;

impl GpuProbe for NvmlProbe {
    fn probe(&self) -> Result<Vec<GpuInfo>, GpuError> {
        use nvml_wrapper::error::NvmlError;
        let nvml = nvml_wrapper::Nvml::init().map_err(|err| match err {
            NvmlError::LibloadingError(e) => GpuError::NoNvml(format!(
                "cannot load libnvidia-ml.so.1 ({e}); is the NVIDIA driver installed on this node?"
            )),
            NvmlError::DriverNotLoaded => GpuError::NoNvml("the NVIDIA driver is not loaded".to_string()),
            NvmlError::LibraryNotFound => GpuError::NoNvml("libnvidia-ml not found".to_string()),
            other => GpuError::Nvml(other.to_string()),
        })?;
        let count = nvml.device_count().map_err(|e| GpuError::Nvml(format!("device count: {e}")))?;
        let mut out = Vec::with_capacity(count as usize);
        for index in 0..count {
            let device = nvml.device_by_index(index).map_err(|e| GpuError::Nvml(format!("device {index}: {e}")))?;
            let name = device.name().map_err(|e| GpuError::Nvml(format!("device {index} name: {e}")))?;
            let uuid = device.uuid().map_err(|e| GpuError::Nvml(format!("device {index} uuid: {e}")))?;
            let memory = device.memory_info().map_err(|e| GpuError::Nvml(format!("device {index} memory: {e}")))?;
            out.push(GpuInfo { index, uuid, name, memory_total_bytes: memory.total });
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        "nvml".to_string()
    }
}

/// A JSON fixture standing in for NVML (tests, demos).
pub(crate) struct FixtureProbe {
    pub path: PathBuf,
}

impl GpuProbe for FixtureProbe {
    fn probe(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let fixture_err = |message: String| GpuError::Fixture { path: self.path.clone(), message };
        // Bounded and type-checked: a FIFO or /dev/zero named here must not hang or grow payload.
        let text = launch_spec::fsread::read_text_capped(
            &self.path,
            launch_spec::fsread::CONFIG_CAP,
            launch_spec::fsread::Links::Follow,
        )
        .map_err(|e| fixture_err(format!("cannot read: {e}")))?;
        serde_json::from_str::<Vec<GpuInfo>>(&text).map_err(|e| {
            fixture_err(format!(
                "line {}: {} (expected a JSON array of {{\"index\",\"uuid\",\"name\",\"memory_total_bytes\"}})",
                e.line(),
                e
            ))
        })
    }

    fn describe(&self) -> String {
        format!("fixture:{}", self.path.display())
    }
}

/// The fixture probe when `PAYLOAD_GPU_FIXTURE` is set, NVML otherwise.
pub fn probe_from_env(env: &dyn Fn(&str) -> Option<String>) -> Box<dyn GpuProbe> {
    match env(FIXTURE_VAR).filter(|v| !v.is_empty()) {
        Some(path) => Box::new(FixtureProbe { path: PathBuf::from(path) }),
        None => Box::new(NvmlProbe),
    }
}

/// The GPUs this job may use. NVML ignores `CUDA_VISIBLE_DEVICES`; Slurm sets it to indices (or
/// `NoDevFiles` for gres without device files). Unset (or `NoDevFiles`): every GPU. Set but empty:
/// **no** GPU (CUDA's meaning). UUIDs are matched by UUID; indices by NVML index unless the list
/// already has exactly that many GPUs (cgroup-constrained nodes renumber from 0). An entry listed
/// twice (`0,0,0,0`) is an error rather than a guess: CUDA would see fewer devices than the list
/// suggests, so the count would be wrong either way.
pub fn visible(all: &[GpuInfo], cuda_visible_devices: Option<&str>) -> Result<Vec<GpuInfo>, GpuError> {
    let Some(spec) = cuda_visible_devices.map(str::trim).filter(|s| *s != "NoDevFiles") else {
        return Ok(all.to_vec());
    };
    let entries: Vec<&str> = spec.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    for (i, e) in entries.iter().enumerate() {
        if entries[..i].contains(e) {
            return Err(GpuError::DuplicateVisible { value: spec.to_string(), entry: e.to_string() });
        }
    }
    if entries.is_empty() {
        return Ok(Vec::new());
    }
    if entries.iter().all(|e| e.starts_with("GPU-") || e.starts_with("MIG-")) {
        return Ok(all.iter().filter(|g| entries.iter().any(|e| g.uuid.starts_with(e))).cloned().collect());
    }
    if entries.len() == all.len() {
        return Ok(all.to_vec());
    }
    let indices: Vec<u32> = entries.iter().filter_map(|e| e.parse().ok()).collect();
    Ok(all.iter().filter(|g| indices.contains(&g.index)).cloned().collect())
}

/// What payload decided about GPUs: the `gpus` event's body, one type (launch_spec::rundir::events).
pub use launch_spec::rundir::events::Gpus as GpuSelection;

/// The profile for the GPUs used: among the first `need` visible GPUs, the matched profile with
/// the lowest ceiling (mixed nodes are rare; the safe value wins).
pub(crate) fn select_profile<'a>(
    profiles: &'a GpuProfiles,
    gpus: &[GpuInfo],
    need: usize,
) -> Result<&'a GpuProfile, GpuError> {
    let mut best: Option<&GpuProfile> = None;
    for gpu in gpus.iter().take(need.max(1)) {
        let profile = profiles.select(gpu).ok_or_else(|| GpuError::NoProfile { gpu: gpu.name.clone() })?;
        if best.is_none_or(|b| profile.gpu_memory_utilization < b.gpu_memory_utilization) {
            best = Some(profile);
        }
    }
    best.ok_or_else(|| GpuError::NoProfile { gpu: "(no GPU)".to_string() })
}

/// Decides GPU count, profile and ceiling from a probe result.
///
/// Without NVML the run fails (`gpu`) unless `serve.allow_no_gpu` is set or this is a plan
/// (`planning`): then it plans for `serve.declared_gpus` (or TP×DP) with the catch-all profile.
pub fn select(
    spec: &LaunchSpec,
    probe_name: &str,
    probed: Result<Vec<GpuInfo>, GpuError>,
    cuda_visible_devices: Option<&str>,
    planning: bool,
) -> Result<GpuSelection, GpuError> {
    let need = spec.gpus_needed();
    let serve = &spec.serve;
    match probed {
        Ok(all) => {
            let used = visible(&all, cuda_visible_devices)?;
            let have = used.len() as u32;
            if have < need {
                return Err(GpuError::TooFew { have, need });
            }
            let profile = select_profile(&spec.gpu_profiles, &used, need as usize);
            let profile = match (profile, serve.gpu_memory_utilization.or(serve.cluster_gpu_memory_utilization)) {
                (Ok(p), _) => Some(p.clone()),
                (Err(_), Some(_)) => None,
                (Err(e), None) => return Err(e),
            };
            let (util, source) = effective_gpu_memory_utilization(
                serve.gpu_memory_utilization,
                serve.cluster_gpu_memory_utilization,
                profile.as_ref(),
            )
            .expect("a profile or an override is present");
            let note = (used.len() != all.len())
                .then(|| format!("{} of {} GPUs visible through CUDA_VISIBLE_DEVICES", used.len(), all.len()));
            Ok(GpuSelection {
                probe: probe_name.to_string(),
                inventory: used,
                count: have,
                profile,
                gpu_memory_utilization: util,
                source: source.to_string(),
                note,
            })
        }
        Err(GpuError::NoNvml(why)) if planning || serve.allow_no_gpu => {
            let count = serve.declared_gpus.unwrap_or(need);
            let profile = spec.gpu_profiles.profiles.last().filter(|p| p.is_catch_all()).cloned();
            let (util, source) = effective_gpu_memory_utilization(
                serve.gpu_memory_utilization,
                serve.cluster_gpu_memory_utilization,
                profile.as_ref(),
            )
            .ok_or_else(|| GpuError::NoProfile { gpu: "(no NVML)".to_string() })?;
            let why_mode = if planning && !serve.allow_no_gpu { "planning" } else { "serve.allow_no_gpu" };
            Ok(GpuSelection {
                probe: format!("no NVML: {why}"),
                inventory: Vec::new(),
                count,
                profile,
                gpu_memory_utilization: util,
                source: source.to_string(),
                note: Some(format!(
                    "{why_mode}: assuming {count} GPU(s) (serve.declared_gpus or TP×DP) and the catch-all profile"
                )),
            })
        }
        Err(err) => Err(err),
    }
}

/// Reads a profiles file for `payload gpus --profiles`.
pub fn load_profiles(path: &Path) -> Result<GpuProfiles, launch_spec::yaml::YamlError> {
    launch_spec::yaml::from_yaml_file::<GpuProfiles>(path)
}

#[cfg(test)]
#[allow(clippy::print_stderr)]
mod tests {
    use super::*;

    fn gpu(index: u32, name: &str, gib: u64) -> GpuInfo {
        GpuInfo { index, uuid: format!("GPU-{index:04}"), name: name.into(), memory_total_bytes: gib << 30 }
    }

    fn profiles() -> GpuProfiles {
        let p = |name: &str, contains: &str, min: Option<f64>, max: Option<f64>, util: f64| {
            GpuProfile::for_tests(name, contains, (min, max), util)
        };
        GpuProfiles {
            profiles: vec![
                p("a100-64gb", "A100", Some(60.0), Some(66.0), 0.85),
                p("h200", "H200", None, None, 0.92),
                p("default", "", None, None, 0.8),
            ],
        }
    }

    #[test]
    fn visibility_filters() {
        let all = vec![gpu(0, "A", 80), gpu(1, "A", 80), gpu(2, "A", 80), gpu(3, "A", 80)];
        let n = |v: Option<&str>| visible(&all, v).unwrap().len();
        assert_eq!(n(None), 4);
        assert_eq!(n(Some("NoDevFiles")), 4);
        assert_eq!(visible(&all, Some("2,3")).unwrap().iter().map(|g| g.index).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(n(Some("GPU-0001")), 1);
        assert_eq!(visible(&all[..2], Some("0,1")).unwrap().len(), 2);
        // CUDA semantics: set but empty means no GPU.
        assert_eq!(n(Some("")), 0);
        assert_eq!(n(Some(" ")), 0);
        let err = visible(&all, Some("0,0,0,0")).unwrap_err();
        assert!(matches!(err, GpuError::DuplicateVisible { .. }), "{err}");
        assert!(err.to_string().contains("more than once"));
    }

    #[test]
    fn lowest_ceiling_among_used_gpus() {
        let gpus = vec![gpu(0, "NVIDIA H200", 141), gpu(1, "NVIDIA A100-SXM-64GB", 64)];
        assert_eq!(select_profile(&profiles(), &gpus, 2).unwrap().name, "a100-64gb");
        assert_eq!(select_profile(&profiles(), &gpus, 1).unwrap().name, "h200");
    }

    #[test]
    fn select_counts_precedence_and_no_nvml() {
        let mut spec = launch_spec::testkit::unit_spec();
        spec.gpu_profiles = profiles();
        spec.serve.tensor_parallel_size = 2;
        let two = vec![gpu(0, "NVIDIA A100-SXM-64GB", 64), gpu(1, "NVIDIA A100-SXM-64GB", 64)];
        let d = select(&spec, "fixture", Ok(two.clone()), None, false).unwrap();
        assert_eq!((d.count, d.gpu_memory_utilization, d.source.as_str()), (2, 0.85, "GPU profile"));
        spec.serve.cluster_gpu_memory_utilization = Some(0.8);
        assert_eq!(select(&spec, "f", Ok(two.clone()), None, false).unwrap().source, "cluster override");
        spec.serve.gpu_memory_utilization = Some(0.7);
        let d = select(&spec, "f", Ok(two.clone()), None, false).unwrap();
        assert_eq!((d.gpu_memory_utilization, d.source.as_str()), (0.7, "launch spec override"));
        assert_eq!(select(&spec, "f", Ok(two.clone()), Some("1"), false), Err(GpuError::TooFew { have: 1, need: 2 }));
        spec.serve.data_parallel_size = 2;
        assert_eq!(select(&spec, "f", Ok(two), None, false), Err(GpuError::TooFew { have: 2, need: 4 }));
        let none = || Err(GpuError::NoNvml("no driver".into()));
        assert!(matches!(select(&spec, "nvml", none(), None, false), Err(GpuError::NoNvml(_))));
        spec.serve.declared_gpus = Some(8);
        let d = select(&spec, "nvml", none(), None, true).unwrap();
        assert_eq!(d.count, 8);
        assert!(d.probe.starts_with("no NVML"));
        spec.serve.allow_no_gpu = true;
        assert!(select(&spec, "nvml", none(), None, false).is_ok());
    }

    /// On a machine without the NVIDIA driver, NVML is a clean `gpu`-class "no NVML" error.
    #[test]
    fn nvml_without_driver_is_a_clean_error() {
        match NvmlProbe.probe() {
            Err(err @ GpuError::NoNvml(_)) => {
                let failure = Failure::from(err);
                assert_eq!(failure.class, OutcomeClass::Gpu);
                assert_eq!(failure.cause.as_deref(), Some("no_nvml"));
                assert!(failure.message.starts_with("no NVML"), "{}", failure.message);
            }
            Err(other) => panic!("unexpected NVML error without a driver: {other}"),
            Ok(gpus) => eprintln!("NVML present ({} GPUs): no-driver path not checked here", gpus.len()),
        }
    }

    /// The real NVML path, opt-in on a GPU machine: `cargo test -p payload -- --ignored nvml_real`.
    #[test]
    #[ignore = "needs an NVIDIA GPU and driver"]
    fn nvml_real_inventory() {
        let gpus = NvmlProbe.probe().expect("NVML inventory");
        assert!(!gpus.is_empty());
        for g in &gpus {
            assert!(g.uuid.starts_with("GPU-") || g.uuid.starts_with("MIG-"), "{g:?}");
            assert!(g.memory_total_bytes > 1 << 30, "{g:?}");
            eprintln!("[{}] {} {} {:.1} GiB", g.index, g.uuid, g.name, g.memory_total_gib());
        }
    }

    #[test]
    fn fixture_probe_reads_json_and_reports_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus.json");
        std::fs::write(&path, r#"[{"index":0,"uuid":"GPU-a","name":"NVIDIA H200","memory_total_bytes":151397597184}]"#)
            .unwrap();
        let probe = FixtureProbe { path: path.clone() };
        assert_eq!(probe.probe().unwrap()[0].name, "NVIDIA H200");
        std::fs::write(&path, r#"[{"index":0}]"#).unwrap();
        let err = probe.probe().unwrap_err().to_string();
        assert!(err.contains("gpus.json"), "{err}");
    }
}
