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
//! <jobs_dir>/<group_tag>/engine.json      where the engine serves, for the legs (EngineRecord)
//! <jobs_dir>/<group_tag>/engine_ended.json the engine is gone: legs end with its class (EngineEnded)
//! <jobs_dir>/<leg run_tag>/launch.json    each leg's launch spec, exactly as for a per-leg job
//! <jobs_dir>/<leg run_tag>/status.json    each leg's own record and outcome
//! <jobs_dir>/<leg run_tag>/cancel.request asks payload to stop this leg only (written by `submitter cancel`)
//! <jobs_dir>/<leg run_tag>/payload.log    the leg payload's own stderr
//! ```
//!
//! The batch script is started as `payload.sbatch --shared <group_dir>/shared.json`, which runs
//! `payload run --shared <file>`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::records::{GpuTime, LegSpan};
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
pub(crate) const ENGINE_FIELDS: [&str; 8] =
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
        let doc: SharedJobSpec =
            read_versioned(path, "regenerate it with `submitter launch`", |d: &SharedJobSpec| d.version)?;
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
    /// In a pool (crate::pool): the weights the engine serves now, for the legs' provenance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<crate::records::PoolProvenance>,
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
        read_versioned(path, "written by the shared job's engine host", |r: &EngineRecord| r.version)
    }
}

/// Reads one of the shared job's versioned documents: a regular file of bounded size, JSON (a
/// parse error names its line and column, then `origin`: who writes the file or how to redo it),
/// at [`SHARED_SPEC_VERSION`].
fn read_versioned<T: serde::de::DeserializeOwned>(
    path: &Path,
    origin: &str,
    version: impl Fn(&T) -> u32,
) -> Result<T, String> {
    read_versioned_doc(path, origin, SHARED_SPEC_VERSION, version)
}

/// [`read_versioned`] at another document's version (crate::pool).
pub(crate) fn read_versioned_doc<T: serde::de::DeserializeOwned>(
    path: &Path,
    origin: &str,
    expected: u32,
    version: impl Fn(&T) -> u32,
) -> Result<T, String> {
    let text = crate::records::read_regular(path, crate::records::MAX_INPUT_BYTES)
        .map_err(|e| format!("{}: cannot be read: {e}", path.display()))?;
    let doc: T = serde_json::from_str(&text)
        .map_err(|e| format!("{}: line {}, column {}: {e}; {origin}", path.display(), e.line(), e.column()))?;
    let found = version(&doc);
    if found != expected {
        return Err(format!(
            "{}: field `version`: {found} is not {expected}, the version this payload reads; use the matching payload",
            path.display()
        ));
    }
    Ok(doc)
}

#[cfg(test)]
mod engine_record_tests {
    use super::*;

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
            pool: None,
        };
        std::fs::write(&path, serde_json::to_string(&rec).unwrap()).unwrap();
        assert_eq!(EngineRecord::from_file(&path).unwrap(), rec);
        std::fs::write(&path, serde_json::to_string(&EngineRecord { version: 9, ..rec }).unwrap()).unwrap();
        let err = EngineRecord::from_file(&path).unwrap_err();
        assert!(err.contains("field `version`"), "{err}");
    }
}

/// One leg's share of a job's GPU time, in GPU-seconds (seconds × the job's GPUs), by phase.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LegGpuSeconds {
    pub run_tag: String,
    pub prepare: f64,
    pub load: f64,
    pub serving: f64,
    pub idle: f64,
    pub teardown: f64,
    /// Slurm's elapsed time that payload's phases do not cover (the batch script's prelude,
    /// staging, payload's own start and exit).
    pub slurm_other: f64,
}

impl LegGpuSeconds {
    pub fn total(&self) -> f64 {
        self.prepare + self.load + self.serving + self.idle + self.teardown + self.slurm_other
    }

    /// `(phase name, GPU-seconds)` in the order of the record, as `results --json` names them.
    pub fn by_phase(&self) -> [(&'static str, f64); 6] {
        [
            ("prepare", self.prepare),
            ("load", self.load),
            ("serving", self.serving),
            ("idle", self.idle),
            ("teardown", self.teardown),
            ("slurm_other", self.slurm_other),
        ]
    }
}

/// Divides one job's GPU time among its legs (docs/submitter.md "GPU-hours"):
///
/// - serving is divided at each instant equally among the legs whose Harbor runs then (the
///   overlap of their [`LegSpan`]s), scaled so the shares add up to `serving_s` exactly;
/// - prepare, load, idle, teardown and the Slurm remainder (`slurm_elapsed_s` minus payload's
///   phases, never negative; none when Slurm's times are unknown) equally among all legs.
///
/// `legs` is every leg of the job in order (a per-leg job: its one run tag); a span of a leg not
/// listed is added at the end. With no legs at all the result is empty. Serving time with no span
/// to place it (a record cut short) is divided equally too.
pub fn divide(gpu: &GpuTime, legs: &[String], slurm_elapsed_s: Option<f64>) -> Vec<LegGpuSeconds> {
    let mut tags: Vec<String> = legs.to_vec();
    for span in &gpu.legs {
        if !tags.contains(&span.run_tag) {
            tags.push(span.run_tag.clone());
        }
    }
    if tags.is_empty() {
        return Vec::new();
    }
    let g = f64::from(gpu.gpus);
    let n = tags.len() as f64;
    let phases = gpu.prepare_s + gpu.load_s + gpu.serving_s + gpu.idle_s + gpu.teardown_s;
    let other = slurm_elapsed_s.map_or(0.0, |e| (e - phases).max(0.0));
    let overlap = serving_overlap(&gpu.legs, &tags);
    let placed: f64 = overlap.iter().sum();
    tags.iter()
        .enumerate()
        .map(|(i, tag)| {
            let serving_share = if placed > 0.0 { overlap[i] / placed } else { 1.0 / n };
            LegGpuSeconds {
                run_tag: tag.clone(),
                prepare: g * gpu.prepare_s / n,
                load: g * gpu.load_s / n,
                serving: g * gpu.serving_s * serving_share,
                idle: g * gpu.idle_s / n,
                teardown: g * gpu.teardown_s / n,
                slurm_other: g * other / n,
            }
        })
        .collect()
}

/// Each tag's seconds of the spans' union, every elementary interval split equally among the
/// legs running in it.
fn serving_overlap(spans: &[LegSpan], tags: &[String]) -> Vec<f64> {
    let mut cuts: Vec<f64> = spans.iter().flat_map(|s| [s.start_s, s.end_s]).filter(|v| v.is_finite()).collect();
    cuts.sort_by(f64::total_cmp);
    cuts.dedup();
    let mut share = vec![0.0; tags.len()];
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let running: Vec<usize> = spans
            .iter()
            .filter(|s| s.start_s <= a && s.end_s >= b)
            .filter_map(|s| tags.iter().position(|t| *t == s.run_tag))
            .collect();
        // A leg with two spans over one interval counts once.
        let mut running = running;
        running.sort_unstable();
        running.dedup();
        for &i in &running {
            share[i] += (b - a) / running.len() as f64;
        }
    }
    share
}

#[cfg(test)]
mod gpu_tests {
    use super::*;

    fn span(tag: &str, a: f64, b: f64) -> LegSpan {
        LegSpan { run_tag: tag.into(), start_s: a, end_s: b }
    }

    fn tags(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| s.to_string()).collect()
    }

    /// A per-leg job is the one-leg case: everything, times its GPUs, plus Slurm's remainder.
    #[test]
    fn one_leg_gets_everything() {
        let gpu = GpuTime {
            gpus: 4,
            prepare_s: 5.0,
            load_s: 60.0,
            serving_s: 100.0,
            idle_s: 2.0,
            teardown_s: 3.0,
            legs: vec![span("a", 65.0, 165.0)],
        };
        let d = divide(&gpu, &tags(&["a"]), Some(180.0));
        assert_eq!(d.len(), 1);
        let a = &d[0];
        assert_eq!(
            (a.prepare, a.load, a.serving, a.idle, a.teardown, a.slurm_other),
            (20.0, 240.0, 400.0, 8.0, 12.0, 40.0)
        );
        assert_eq!(a.total(), 720.0);
        // Slurm's elapsed shorter than payload's phases (clock skew, rounding): no negative remainder.
        assert_eq!(divide(&gpu, &tags(&["a"]), Some(100.0))[0].slurm_other, 0.0);
        assert_eq!(divide(&gpu, &tags(&["a"]), None)[0].slurm_other, 0.0);
    }

    /// Three legs, 1 GPU: a runs 0–30, b 10–30, c 20–40 (serving 40 s). Shares of serving:
    /// 0–10 a alone (10); 10–20 a,b (5 each); 20–30 a,b,c (3⅓ each); 30–40 c alone (10).
    #[test]
    fn serving_is_divided_by_overlap_and_the_rest_equally() {
        let gpu = GpuTime {
            gpus: 1,
            prepare_s: 3.0,
            load_s: 30.0,
            serving_s: 40.0,
            idle_s: 6.0,
            teardown_s: 9.0,
            legs: vec![span("a", 0.0, 30.0), span("b", 10.0, 30.0), span("c", 20.0, 40.0)],
        };
        let d = divide(&gpu, &tags(&["a", "b", "c"]), Some(100.0));
        let serving: Vec<f64> = d.iter().map(|l| (l.serving * 1000.0).round() / 1000.0).collect();
        assert_eq!(serving, [18.333, 8.333, 13.333]);
        for l in &d {
            assert_eq!((l.prepare, l.load, l.idle, l.teardown, l.slurm_other), (1.0, 10.0, 2.0, 3.0, 4.0));
        }
        let total: f64 = d.iter().map(LegGpuSeconds::total).sum();
        assert!((total - 100.0).abs() < 1e-9, "the shares add up to Slurm's elapsed × GPUs: {total}");
    }

    /// A refused leg (no span) still pays its share of the engine's load, not of serving; a span
    /// of a leg not listed is added.
    #[test]
    fn a_leg_without_a_span_shares_the_fixed_costs_only() {
        let gpu = GpuTime {
            gpus: 2,
            load_s: 90.0,
            serving_s: 50.0,
            legs: vec![span("a", 90.0, 140.0), span("x", 100.0, 100.0)],
            ..GpuTime::default()
        };
        let d = divide(&gpu, &tags(&["a", "refused"]), None);
        assert_eq!(d.iter().map(|l| l.run_tag.as_str()).collect::<Vec<_>>(), ["a", "refused", "x"]);
        assert_eq!(d[0].serving, 100.0);
        assert_eq!((d[1].serving, d[1].load), (0.0, 60.0));
        assert_eq!(d[2].load, 60.0);
        assert!(divide(&GpuTime::default(), &[], Some(10.0)).is_empty());
    }

    /// Serving recorded but no span to place it (a heartbeat cut short): divided equally.
    #[test]
    fn serving_without_spans_is_divided_equally() {
        let gpu = GpuTime { gpus: 1, serving_s: 10.0, ..GpuTime::default() };
        let d = divide(&gpu, &tags(&["a", "b"]), None);
        assert_eq!((d[0].serving, d[1].serving), (5.0, 5.0));
    }
}
