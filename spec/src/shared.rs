//! One Slurm job, several legs (issue 24): the contract between submitter, payload and the
//! records that both read. A *shared job* serves one model with one engine and runs several
//! Harbor jobs ("legs") against it, each leg with its own launch spec, run dir, ledger attempt and
//! outcome. This module owns the file names, the shared job's document, the rule for which leg
//! specs may share an engine, and the GPU-time record and the rule that divides it among legs.
//!
//! Layout (all on the shared file system, like every run dir):
//!
//! ```text
//! <jobs_dir>/<group_tag>/shared.json      the shared job's document (SharedJobSpec)
//! <jobs_dir>/<group_tag>/status.json      the engine host's own record (RunStatus, run_tag = group_tag)
//! <jobs_dir>/<group_tag>/vllm.log …       the engine's log, the host's events, slurm-%j.out
//! <jobs_dir>/<leg run_tag>/launch.json    each leg's launch spec, exactly as for a per-leg job
//! <jobs_dir>/<leg run_tag>/status.json    each leg's own record and outcome
//! <jobs_dir>/<leg run_tag>/cancel.request asks payload to stop this leg only (written by `submitter cancel`)
//! ```
//!
//! The batch script is started as `payload.sbatch --shared <group_dir>/shared.json`, which runs
//! `payload run --shared <file>`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::LaunchSpec;

/// The shared job's document, in its group dir.
pub const SHARED_SPEC_FILE: &str = "shared.json";
/// In a leg's run dir: stop this leg (and only it). Its content is informational.
pub const CANCEL_REQUEST_FILE: &str = "cancel.request";
/// The `Outcome::cause` of a leg stopped by [`CANCEL_REQUEST_FILE`] (class `interrupted`).
pub const CANCEL_REQUESTED_CAUSE: &str = "cancel_requested";

/// The newest shared-job document version this build reads and writes.
pub const SHARED_SPEC_VERSION: u32 = 1;

/// `shared.json`: which legs one engine serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedJobSpec {
    pub version: u32,
    /// Names the group dir and the engine host's records (`<model run-tag stem>-shared-<8hex>`).
    pub group_tag: String,
    /// `<jobs_dir>/<group_tag>`: the engine host's records.
    pub group_dir: PathBuf,
    /// Each leg's `launch.json`, in launch order. At least one.
    pub legs: Vec<PathBuf>,
}

/// The top-level launch-spec fields that define the engine (and its tunnel and secrets): every leg
/// of a shared job must agree on all of them. The others (`run_tag`, `run_dir`, `benchmark`,
/// `ledger_job_id`, `harbor`, `post_run`, `jobs_dir`) are the leg's own.
pub const ENGINE_FIELDS: [&str; 8] =
    ["cluster", "model", "serve", "gpu_profiles", "tunnel", "secrets", "limits", "scratch"];

/// Why these leg specs cannot share one engine: the first engine field on which a leg differs
/// from the first leg, named (`legs[2] (<run_tag>): field \`serve\` differs from legs[0]`).
pub fn engine_mismatch(legs: &[LaunchSpec]) -> Option<String> {
    let first = legs.first()?;
    legs.iter().enumerate().skip(1).find_map(|(i, leg)| engine_mismatch_at(first, i, leg))
}

/// Why `legs[i]` cannot share `first`'s engine (the first engine field on which they differ).
pub fn engine_mismatch_at(first: &LaunchSpec, i: usize, leg: &LaunchSpec) -> Option<String> {
    let reference = engine_part(first);
    let part = engine_part(leg);
    ENGINE_FIELDS.iter().find(|field| reference.get(**field) != part.get(**field)).map(|field| {
        format!(
            "legs[{i}] ({}): field `{field}` differs from legs[0] ({}); legs of one shared job must serve one engine",
            leg.run_tag, first.run_tag
        )
    })
}

/// The engine-defining part of a spec, as JSON (for comparison and for a group key).
pub fn engine_part(spec: &LaunchSpec) -> Value {
    let full = serde_json::to_value(spec).unwrap_or(Value::Null);
    let mut part = serde_json::Map::new();
    for field in ENGINE_FIELDS {
        part.insert(field.to_string(), full.get(field).cloned().unwrap_or(Value::Null));
    }
    Value::Object(part)
}

impl SharedJobSpec {
    /// Reads `shared.json` (regular file, bounded), refusing an unknown version, no legs, or a
    /// leg path that is not absolute. The legs' own specs are read by the caller.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text = crate::records::read_regular(path, crate::records::MAX_INPUT_BYTES)
            .map_err(|e| format!("{}: cannot be read: {e}", path.display()))?;
        let doc: SharedJobSpec = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{}: line {}, column {}: {e}; regenerate it with `submitter launch`",
                path.display(),
                e.line(),
                e.column()
            )
        })?;
        if doc.version != SHARED_SPEC_VERSION {
            return Err(format!(
                "{}: field `version`: {} is not {SHARED_SPEC_VERSION}, the version this payload reads; use the matching payload",
                path.display(),
                doc.version
            ));
        }
        if doc.legs.is_empty() {
            return Err(format!("{}: field `legs`: empty; a shared job needs at least one leg", path.display()));
        }
        if let Some(bad) = doc.legs.iter().chain(std::iter::once(&doc.group_dir)).find(|p| !p.is_absolute()) {
            return Err(format!(
                "{}: path {} is not absolute; regenerate it with `submitter launch`",
                path.display(),
                bad.display()
            ));
        }
        Ok(doc)
    }
}

/// One job's time on its GPUs by phase, in wall-clock seconds (GPU-seconds = seconds × `gpus`).
/// payload writes it in `status.json` (`gpu_time`): a per-leg job in its run dir, a shared job in
/// its group dir (the legs' own records carry none). Queue wait is not in it: the job held no GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuTime {
    /// GPUs the job holds (every node's).
    pub gpus: u32,
    /// payload start → engine spawned (GPU detection, secrets, ports, staging).
    pub prepare_s: f64,
    /// Engine spawned → ready.
    pub load_s: f64,
    /// Engine up and at least one leg's Harbor running.
    pub serving_s: f64,
    /// Engine up and no leg's Harbor running (print-config checks, a post-run step, waiting).
    pub idle_s: f64,
    /// Teardown began → every child gone.
    pub teardown_s: f64,
    /// When each leg's Harbor ran, in seconds since payload started (one span per leg for a
    /// per-leg job; spans may overlap in a shared job).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub legs: Vec<LegSpan>,
}

/// When one leg's Harbor ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegSpan {
    pub run_tag: String,
    pub start_s: f64,
    pub end_s: f64,
}

/// In the group dir: what a leg's payload needs to use the host's engine (written by the engine
/// host once the engine is ready, before any leg starts; [`EngineRecord`]).
pub const ENGINE_FILE: &str = "engine.json";
/// In the group dir: written by the engine host when the engine is lost (died, hung, unhealthy)
/// while legs run; every leg still running ends with its class (an [`EngineEnded`]).
pub const ENGINE_ENDED_FILE: &str = "engine_ended.json";
/// In a leg's run dir: the leg payload's own log (its stderr), since the Slurm output is the host's.
pub const LEG_LOG_FILE: &str = "payload.log";
/// The environment variable that carries the engine's per-job API key from the host to a leg's
/// payload (never argv, never a file); the leg removes it from its own environment at once.
pub const ENGINE_KEY_VAR: &str = "PAYLOAD_SHARED_ENGINE_KEY";

/// `engine.json`: where the host's engine serves, for the legs (no secret in it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineRecord {
    pub version: u32,
    pub group_tag: String,
    /// The engine's loopback URL (`http://127.0.0.1:<port>`, no `/v1`).
    pub base_url: String,
    pub port: u16,
    /// The engine head's pid: a leg checks the socket answering on `port` is its tree's.
    pub engine_pid: u32,
    /// The tunnel's public URL (no `/v1`) when the legs' installed agents reach the engine over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_url: Option<String>,
    /// What the host's tunnel adds to Harbor's environment (proxy variables) and argv (a prefix).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub harbor_env: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harbor_prefix: Option<Vec<String>>,
}

/// `engine_ended.json`: why the shared engine is gone (the host's failure, as a leg records it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineEnded {
    pub class: crate::records::OutcomeClass,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engine_log_tail: Vec<String>,
}

impl EngineRecord {
    /// Reads `engine.json` (regular, bounded).
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text = crate::records::read_regular(path, crate::records::MAX_INPUT_BYTES)
            .map_err(|e| format!("{}: cannot be read: {e}", path.display()))?;
        let rec: EngineRecord = serde_json::from_str(&text).map_err(|e| {
            format!("{}: line {}, column {}: {e}; written by the shared job's engine host", path.display(), e.line(), e.column())
        })?;
        if rec.version != SHARED_SPEC_VERSION {
            return Err(format!(
                "{}: field `version`: {} is not {SHARED_SPEC_VERSION}; use the matching payload",
                path.display(),
                rec.version
            ));
        }
        Ok(rec)
    }
}

/// The GPU-time rule for a shared job (docs/payload.md "Shared jobs"): each leg is charged its own
/// share of the serving time — every instant at least one leg's Harbor runs is split equally
/// among the legs running then — plus an equal share (1/legs) of everything else the job held
/// the GPUs for (prepare, load, idle, teardown). Returns GPU-seconds per leg, in `legs` order;
/// the shares add up to the job's total GPU-seconds.
pub fn leg_gpu_seconds(t: &GpuTime) -> Vec<(String, f64)> {
    let n = t.legs.len();
    if n == 0 {
        return Vec::new();
    }
    let gpus = f64::from(t.gpus);
    let shared = (t.prepare_s + t.load_s + t.idle_s + t.teardown_s) / n as f64;
    let mut edges: Vec<f64> = t.legs.iter().flat_map(|l| [l.start_s, l.end_s.max(l.start_s)]).collect();
    edges.sort_by(f64::total_cmp);
    edges.dedup();
    let mut serving = vec![0.0; n];
    for w in edges.windows(2) {
        let (a, b) = (w[0], w[1]);
        let on: Vec<usize> = (0..n).filter(|&i| t.legs[i].start_s <= a && t.legs[i].end_s >= b).collect();
        for &i in &on {
            serving[i] += (b - a) / on.len() as f64;
        }
    }
    // Serving time as measured (`serving_s`) is what is divided; the spans only weigh it.
    let span_total: f64 = serving.iter().sum();
    let scale = if span_total > 0.0 { t.serving_s / span_total } else { 0.0 };
    t.legs.iter().zip(serving).map(|(l, s)| (l.run_tag.clone(), (shared + s * scale) * gpus)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(tag: &str, start_s: f64, end_s: f64) -> LegSpan {
        LegSpan { run_tag: tag.into(), start_s, end_s }
    }

    #[test]
    fn overlapping_legs_split_serving_and_share_the_rest_equally() {
        let t = GpuTime {
            gpus: 2,
            prepare_s: 1.0,
            load_s: 10.0,
            serving_s: 30.0,
            idle_s: 2.0,
            teardown_s: 1.0,
            legs: vec![span("a", 11.0, 41.0), span("b", 11.0, 21.0)],
        };
        let shares = leg_gpu_seconds(&t);
        // 10 s both (5 each), 20 s a alone; the other 14 s split in two.
        assert_eq!(shares, vec![("a".to_string(), (7.0 + 25.0) * 2.0), ("b".to_string(), (7.0 + 5.0) * 2.0)]);
        let total: f64 = shares.iter().map(|s| s.1).sum();
        assert_eq!(total, (1.0 + 10.0 + 30.0 + 2.0 + 1.0) * 2.0);
        assert!(leg_gpu_seconds(&GpuTime::default()).is_empty());
    }

    #[test]
    fn engine_record_round_trips_and_refuses_another_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(ENGINE_FILE);
        let rec = EngineRecord {
            version: SHARED_SPEC_VERSION,
            group_tag: "m-shared-1".into(),
            base_url: "http://127.0.0.1:8000".into(),
            port: 8000,
            engine_pid: 42,
            public_url: None,
            harbor_env: Default::default(),
            harbor_prefix: None,
        };
        std::fs::write(&path, serde_json::to_string(&rec).unwrap()).unwrap();
        assert_eq!(EngineRecord::from_file(&path).unwrap(), rec);
        std::fs::write(&path, serde_json::to_string(&EngineRecord { version: 9, ..rec }).unwrap()).unwrap();
        let err = EngineRecord::from_file(&path).unwrap_err();
        assert!(err.contains("field `version`"), "{err}");
    }
}
