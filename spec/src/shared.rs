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
pub const ENGINE_FIELDS: [&str; 8] =
    ["cluster", "model", "serve", "gpu_profiles", "tunnel", "secrets", "limits", "scratch"];

/// Why these leg specs cannot share one engine: the first engine field on which a leg differs
/// from the first leg, named (`legs[2] (<run_tag>): field \`serve\` differs from legs[0]`).
pub fn engine_mismatch(legs: &[LaunchSpec]) -> Option<String> {
    let first = legs.first()?;
    let reference = engine_part(first);
    for (i, leg) in legs.iter().enumerate().skip(1) {
        let part = engine_part(leg);
        for field in ENGINE_FIELDS {
            if reference.get(field) != part.get(field) {
                return Some(format!(
                    "legs[{i}] ({}): field `{field}` differs from legs[0] ({}); legs of one shared job must serve one engine",
                    leg.run_tag, first.run_tag
                ));
            }
        }
    }
    None
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
