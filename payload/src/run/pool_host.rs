//! The pool's part of a shared job's engine host (issue 37; docs/pools.md): what the host carries
//! between members. Apart from `run::pool`, which drives the swaps, because `run::shared`'s host
//! holds it and `run::pool` drives that host: one direction each.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use launch_spec::pool::{PoolJobSpec, PoolProvenance, SwapEvidence};

/// What one engine start of the pool left for `run::pool::run_pool` to decide on.
#[derive(Debug, Default)]
pub(crate) struct SegmentEnd {
    /// A swap or its proof failed for this member: start the engine cold with it.
    pub restart_from: Option<usize>,
    /// Some leg of this segment was started (a segment that started none makes no progress).
    pub started_any: bool,
}

/// The pool's part of the engine host.
#[derive(Debug)]
pub(crate) struct PoolHost {
    pub(crate) doc: PoolJobSpec,
    pub(crate) digests: Vec<String>,
    /// The member whose weights (or adapter) the engine serves now.
    pub(crate) current: usize,
    /// The full checkpoint the engine was started with (its tokenizer, template and config are the
    /// ones served, whatever is reloaded).
    pub(crate) engine_weights: PathBuf,
    pub(crate) engine_start: u32,
    /// The stable path the engine serves (a symlink in node-local scratch).
    pub(crate) link: PathBuf,
    pub(crate) ext_dir: PathBuf,
    pub(crate) builtin_reload: bool,
    pub(crate) swap: Option<SwapEvidence>,
    pub(crate) verification: Option<String>,
    pub(crate) end: Arc<Mutex<SegmentEnd>>,
}

impl PoolHost {
    /// The member's provenance for `engine.json` and so for each of its legs' `status.json`.
    pub(crate) fn provenance(&self) -> PoolProvenance {
        let m = &self.doc.members[self.current];
        PoolProvenance {
            group_tag: self.doc.group_tag.clone(),
            member: self.current,
            model: m.model.clone(),
            revision: m.weights.revision.clone(),
            weights_path: m.weights.path.clone(),
            weights_digest: self.digests[self.current].clone(),
            engine_start: self.engine_start,
            swap: self.swap.clone(),
            verification: self.verification.clone(),
        }
    }
}
