//! The checkout's configuration for unit tests that build specs and plans as `submitter` would:
//! the shipped GPU profiles, registry, presets and Harbor configs, and a [`SpecBuilder`] over them.

use std::path::Path;

use crate::config::{self, ClusterProfile, ConfigRoot, Preset};
use crate::registry::Registry;
use crate::spec_build::SpecBuilder;

pub(crate) struct Shipped {
    pub(crate) root: ConfigRoot,
    pub(crate) gpus: launch_spec::GpuProfiles,
    /// Mutable before [`Shipped::builder`] (a test adds a broken model).
    pub(crate) registry: Registry,
    pub(crate) harbor: std::path::PathBuf,
}

impl Shipped {
    pub(crate) fn load() -> Shipped {
        let root = ConfigRoot { root: Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf() };
        Shipped {
            gpus: config::load_gpu_profiles(&root.clusters_dir()).unwrap(),
            registry: Registry::load(&root.registry_dir()).unwrap(),
            harbor: root.harbor_configs_dir(),
            root,
        }
    }

    pub(crate) fn cluster(&self, name: &str) -> ClusterProfile {
        config::load_cluster(&self.root.clusters_dir(), name).unwrap()
    }

    pub(crate) fn preset(&self, name: &str) -> Preset {
        config::load_preset(&self.root.presets_dir(), name).unwrap()
    }

    /// The shipped presets' scoring, each dataset's benchmark its own family.
    pub(crate) fn scorings(&self) -> crate::verify::results::Scorings {
        let presets = config::load_presets(&self.root.presets_dir()).unwrap();
        crate::verify::results::Scorings::from_declarations(presets.into_iter().flat_map(|(_, _, preset)| {
            let scoring = preset.scoring;
            preset.datasets.into_iter().map(move |dataset| (Preset::benchmark_of(&dataset), scoring))
        }))
    }

    pub(crate) fn builder<'a>(&'a self, cluster: &'a ClusterProfile) -> SpecBuilder<'a> {
        SpecBuilder::new(cluster, &self.gpus, &self.registry, &self.harbor, &self.root.root)
    }
}

/// A ledger attempt of `model` on `benchmark` (its own family) on cluster `local`, status
/// `status`, submitted at a fixed time; tests set the fields they are about.
pub(crate) fn attempt(
    id: i64,
    model: &str,
    benchmark: &str,
    status: crate::ledger::AttemptStatus,
) -> crate::ledger::Attempt {
    let at = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
    crate::ledger::Attempt {
        id: crate::ledger::AttemptId(id),
        model: model.into(),
        benchmark: benchmark.into(),
        benchmark_family: benchmark.into(),
        cluster: "local".into(),
        username: "u".into(),
        run_tag: crate::registry::names::run_tag(benchmark, model),
        slurm_job_id: None,
        status,
        reason: String::new(),
        config: serde_json::Value::Null,
        metrics: None,
        attempt: 1,
        submitted_at: at,
        started_at: None,
        ended_at: None,
        updated_at: at,
        agent: crate::ledger::DEFAULT_AGENT.into(),
        source_id: None,
    }
}
