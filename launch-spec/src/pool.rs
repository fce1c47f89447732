//! One Slurm job, several models on one engine (issue 37): the contract between the submitter's
//! planner (which groups fine-tunes into a pool and writes `pool.json`) and payload (which starts
//! one engine and swaps each member's weights in, docs/pools.md). A pool extends the shared job of
//! issue 24 ([`crate::shared`]: one engine, several legs) to several models: each *member* is one
//! model with its own legs, run one member after another on the same engine.
//!
//! Layout (all on the shared file system, beside the shared job's files, which keep their meaning):
//!
//! ```text
//! <jobs_dir>/<group_tag>/pool.json      the pool's document (PoolJobSpec)
//! <jobs_dir>/<group_tag>/swaps.jsonl    one SwapRecord per JSON line, appended per member
//! <jobs_dir>/<group_tag>/status.json    the engine host's own record (as for a shared job)
//! <jobs_dir>/<group_tag>/engine.json    the engine, rewritten per member with its PoolProvenance
//! <jobs_dir>/<leg run_tag>/…            each leg's launch.json, status.json, cancel.request
//! ```
//!
//! The batch script is started as `payload.sbatch --pool <group_dir>/pool.json`, which runs
//! `payload run --pool <file>`.
//!
//! Rules both halves rely on:
//! - `members[0]` is the model the engine starts with; every leg of every member agrees on the
//!   engine fields of [`crate::shared`] except `model` ([`pool_mismatch`] says which differs).
//! - A member whose legs cannot start (walltime near, an earlier fatal failure) leaves its legs'
//!   `status.json` absent: the submitter's sync sees them as not run and continues them in another
//!   pool. A member whose legs started has a record in each leg (its own outcome, or `engine_died`
//!   when the engine was lost under it).
//! - Each leg's `status.json` `provenance.pool` ([`PoolProvenance`]) names the weights it was served
//!   (model, revision, digest of the checkpoint's files), the engine start it ran on, and the
//!   swap's evidence (`None` for the engine's first model, served by a fresh start).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use crate::records::{PoolProvenance, SwapEvidence};
use crate::spec::LaunchSpec;

/// The pool's document, in its group dir.
pub const POOL_SPEC_FILE: &str = "pool.json";
/// In the group dir: one [`SwapRecord`] per line, appended as each member is brought up.
pub const SWAPS_FILE: &str = "swaps.jsonl";
/// The newest pool document version this build reads and writes.
pub const POOL_SPEC_VERSION: u32 = 1;

/// `pool.json`: which models one engine serves, in order, and each model's legs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolJobSpec {
    pub version: u32,
    /// Names the group dir and the engine host's records (`<model run-tag stem>-pool-<8hex>`).
    pub group_tag: String,
    /// `<jobs_dir>/<group_tag>`: the engine host's records.
    pub group_dir: PathBuf,
    /// In order; `members[0]` is the model the engine starts with. At least one.
    pub members: Vec<PoolMember>,
}

/// One model of a pool and its legs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolMember {
    /// The model id as in its legs' specs (`model.hf_id`).
    pub model: String,
    pub weights: PoolWeights,
    /// Each leg's `launch.json`, as for a shared job. At least one.
    pub legs: Vec<PathBuf>,
}

/// Where a member's weights are, as the node sees them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolWeights {
    /// Absolute dir of the checkpoint on the shared file system (a full checkpoint: config.json,
    /// tokenizer, safetensors), or of the LoRA adapter (`adapter_config.json`, adapter weights).
    pub path: PathBuf,
    /// The revision the planner resolved (an HF commit), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    pub kind: WeightsKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightsKind {
    /// A full checkpoint, swapped in with a weight reload.
    Full,
    /// A LoRA adapter on `members[0]`'s base, loaded at run time under the member's served name.
    /// `members[0]` itself must be `full`.
    Lora,
}

impl PoolJobSpec {
    /// Reads `pool.json` (regular file, bounded, versioned), refusing no members, a member with
    /// no legs, a path that is not absolute, a LoRA first member, or a group dir that does not end
    /// in the group tag. The legs' own specs are read by the caller.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let doc: PoolJobSpec = crate::shared::read_versioned_doc(
            path,
            "regenerate it with `submitter launch --allocation pool`",
            POOL_SPEC_VERSION,
            |d: &PoolJobSpec| d.version,
        )?;
        let at = |field: String, why: &str| {
            format!(
                "{}: field `{field}`: {why}; regenerate it with `submitter launch --allocation pool`",
                path.display()
            )
        };
        if doc.members.is_empty() {
            return Err(at("members".into(), "empty; a pool needs at least one member"));
        }
        if doc.members[0].weights.kind == WeightsKind::Lora {
            return Err(at("members[0].weights.kind".into(), "lora; the engine starts with a full checkpoint"));
        }
        if doc.group_dir.file_name().and_then(|n| n.to_str()) != Some(doc.group_tag.as_str()) {
            return Err(at("group_dir".into(), &format!("does not end in group_tag {}", doc.group_tag)));
        }
        if !doc.group_dir.is_absolute() {
            return Err(at("group_dir".into(), "not absolute"));
        }
        for (m, member) in doc.members.iter().enumerate() {
            if member.legs.is_empty() {
                return Err(at(format!("members[{m}].legs"), "empty; a member needs at least one leg"));
            }
            if !member.weights.path.is_absolute() {
                return Err(at(format!("members[{m}].weights.path"), "not absolute"));
            }
            if let Some(l) = member.legs.iter().position(|p| !p.is_absolute()) {
                return Err(at(format!("members[{m}].legs[{l}]"), "not absolute"));
            }
        }
        Ok(doc)
    }

    /// Every leg's `launch.json` with its member's index, in run order.
    pub fn legs(&self) -> impl Iterator<Item = (usize, &PathBuf)> {
        self.members.iter().enumerate().flat_map(|(m, member)| member.legs.iter().map(move |l| (m, l)))
    }
}

/// Why these legs (each with its member's index) cannot share one engine: the first engine field
/// other than `model` on which a leg differs from the first leg, named
/// (`members[1].legs[0] (<run_tag>): field \`serve\` differs from members[0].legs[0] (<run_tag>)`).
pub fn pool_mismatch(legs: &[(usize, usize, LaunchSpec)]) -> Option<String> {
    let (m0, l0, first) = legs.first()?;
    legs.iter().skip(1).find_map(|(m, l, leg)| {
        pool_mismatch_field(first, leg).map(|field| {
            format!(
                "members[{m}].legs[{l}] ({}): field `{field}` differs from members[{m0}].legs[{l0}] ({}); a pool's models must share one engine's settings",
                leg.run_tag, first.run_tag
            )
        })
    })
}

/// The first engine field other than `model` on which `leg` differs from `first`.
pub fn pool_mismatch_field(first: &LaunchSpec, leg: &LaunchSpec) -> Option<&'static str> {
    let reference = crate::shared::engine_part(first);
    let part = crate::shared::engine_part(leg);
    crate::shared::ENGINE_FIELDS
        .iter()
        .copied()
        .filter(|f| *f != "model")
        .find(|field| reference.get(*field) != part.get(*field))
}

/// One line of `swaps.jsonl`: one member brought into the running engine (or not).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwapRecord {
    pub member: usize,
    pub model: String,
    pub kind: WeightsKind,
    pub weights_digest: String,
    /// The engine start the swap was made on.
    pub engine_start: u32,
    /// RFC 3339.
    pub started_at: String,
    pub ended_at: String,
    /// Waiting for the predecessor's legs to end and `/pause` (ms).
    pub pause_ms: u64,
    /// `reload_weights` or `/v1/load_lora_adapter` (ms).
    pub reload_ms: u64,
    /// The canaries and the parameter digest (ms).
    pub verify_ms: u64,
    pub evidence: SwapEvidence,
    pub outcome: SwapOutcome,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result", content = "reason")]
pub enum SwapOutcome {
    /// The swap is proven: the member's legs run on this engine.
    Ok,
    /// The swap or its proof failed (the reason): the engine is restarted cold with the member.
    ColdRestart(String),
    /// Not attempted: the member differs from the engine's model where a swap cannot follow
    /// (the reason); the engine is restarted cold with the member.
    Incompatible(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(path: &str, kind: WeightsKind, legs: &[&str]) -> PoolMember {
        PoolMember {
            model: "org/m".into(),
            weights: PoolWeights { path: path.into(), revision: None, kind },
            legs: legs.iter().map(PathBuf::from).collect(),
        }
    }

    fn write(dir: &Path, doc: &PoolJobSpec) -> PathBuf {
        let path = dir.join(POOL_SPEC_FILE);
        std::fs::write(&path, serde_json::to_string(doc).unwrap()).unwrap();
        path
    }

    #[test]
    fn a_pool_document_round_trips_and_bad_ones_name_their_field() {
        let dir = tempfile::tempdir().unwrap();
        let good = PoolJobSpec {
            version: POOL_SPEC_VERSION,
            group_tag: "m-pool-1".into(),
            group_dir: "/jobs/m-pool-1".into(),
            members: vec![
                member("/w/a", WeightsKind::Full, &["/jobs/a/launch.json"]),
                member("/w/b", WeightsKind::Lora, &["/jobs/b/launch.json", "/jobs/c/launch.json"]),
            ],
        };
        assert_eq!(PoolJobSpec::from_file(&write(dir.path(), &good)).unwrap(), good);
        assert_eq!(good.legs().map(|(m, _)| m).collect::<Vec<_>>(), [0, 1, 1]);
        let cases: Vec<(PoolJobSpec, &str)> = vec![
            (PoolJobSpec { members: vec![], ..good.clone() }, "`members`"),
            (PoolJobSpec { version: 2, ..good.clone() }, "`version`"),
            (PoolJobSpec { group_dir: "/jobs/other".into(), ..good.clone() }, "`group_dir`"),
            (
                PoolJobSpec { members: vec![member("/w/a", WeightsKind::Lora, &["/j/a"])], ..good.clone() },
                "`members[0].weights.kind`",
            ),
            (
                PoolJobSpec { members: vec![member("/w/a", WeightsKind::Full, &[])], ..good.clone() },
                "`members[0].legs`",
            ),
            (
                PoolJobSpec {
                    members: vec![
                        member("/w/a", WeightsKind::Full, &["/j/a"]),
                        member("/w/b", WeightsKind::Full, &["rel/launch.json"]),
                    ],
                    ..good.clone()
                },
                "`members[1].legs[0]`",
            ),
            (
                PoolJobSpec { members: vec![member("w/a", WeightsKind::Full, &["/j/a"])], ..good.clone() },
                "`members[0].weights.path`",
            ),
        ];
        for (doc, field) in cases {
            let err = PoolJobSpec::from_file(&write(dir.path(), &doc)).unwrap_err();
            assert!(err.contains(field), "{field}: {err}");
        }
        std::fs::write(dir.path().join(POOL_SPEC_FILE), "{\"version\": 1, \"extra\": 0}").unwrap();
        let err = PoolJobSpec::from_file(&dir.path().join(POOL_SPEC_FILE)).unwrap_err();
        assert!(err.contains("line 1"), "{err}");
    }

    #[test]
    fn a_swap_record_names_its_outcome() {
        let rec = SwapRecord {
            member: 1,
            model: "org/b".into(),
            kind: WeightsKind::Full,
            weights_digest: "sha1:00".into(),
            engine_start: 1,
            started_at: "t0".into(),
            ended_at: "t1".into(),
            pause_ms: 1,
            reload_ms: 2,
            verify_ms: 3,
            evidence: SwapEvidence::default(),
            outcome: SwapOutcome::ColdRestart("canary 0: differs at token 3".into()),
        };
        let line = serde_json::to_string(&rec).unwrap();
        assert!(
            line.contains(r#""outcome":{"result":"cold_restart","reason":"canary 0: differs at token 3"}"#),
            "{line}"
        );
        assert_eq!(serde_json::from_str::<SwapRecord>(&line).unwrap(), rec);
        let ok = serde_json::to_string(&SwapOutcome::Ok).unwrap();
        assert_eq!(ok, r#"{"result":"ok"}"#);
    }
}
