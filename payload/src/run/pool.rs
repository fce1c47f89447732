//! A pool (issue 37; the files in launch_spec::pool, docs/pools.md): several fine-tunes of one
//! architecture evaluated on one engine start, their weights swapped in place.
//!
//! `payload run --pool <group_dir>/pool.json` is a shared job's engine host (crate::run::shared)
//! whose legs belong to members: it starts the engine once on a stable, node-local path (a symlink
//! to the first member's checkpoint, so vLLM's compile cache key, which holds the model path, is the
//! same for every cold start of the pool), runs the first member's legs, and when they have all
//! ended brings the next member in: compatibility from the checkpoints' files, `/pause` (clears the
//! prefix cache), the reload through payload's worker extension (`pool_ext.py`), its check of what
//! the engine computes with against the checkpoint, `/resume`, greedy canaries with and without a
//! fresh `cache_salt`; then `engine.json` is rewritten with the member's provenance and its legs
//! start. Each swap is a line of `swaps.jsonl`.
//!
//! A swap or proof that fails ends this engine start (a *segment*): [`run_pool`] starts the engine
//! again cold with that member, inside the same allocation. An engine lost under a member ends its
//! running legs (`engine_died`, as for a shared job) and the rest continue on a cold start. A signal
//! (walltime, scancel) ends the pool: the members not started keep no record, so the submitter
//! continues them in another pool.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use launch_spec::pool::{self as files, PoolJobSpec, SWAPS_FILE, SwapEvidence, SwapOutcome, SwapRecord, WeightsKind};
use launch_spec::records::{GpuTime, STATUS_FILE};
use launch_spec::spec::TunnelSpec;
use launch_spec::{LaunchSpec, OutcomeClass};
use serde_json::json;

use crate::prepare::{self, Prepared};
use crate::run::pool_host::{PoolHost, SegmentEnd};
use crate::run::shared::{Host, HostLeg, LegState};
use crate::run::{Run, Share};
use crate::supervisor::SignalSource;

/// The worker extension payload ships into the group dir (a Python module on the engine's PYTHONPATH).
const WORKER_EXTENSION: &str = include_str!("pool_ext.py");
const EXTENSION_MODULE: &str = "evalci_pool_ext";
const EXTENSION_CLASS: &str = "evalci_pool_ext.PoolWorkerExtension";
/// Set to `builtin` to swap with vLLM's own `reload_weights` (no re-packing of a tied output head):
/// the calibration run that shows whether a platform needs the extension's fix (docs/pools.md).
pub const RELOAD_VAR: &str = "PAYLOAD_POOL_RELOAD";
/// How long one dev-route call may take (a reload of a large checkpoint reads it from disk).
const SWAP_CALL_TIMEOUT: Duration = Duration::from_secs(1800);
/// Greedy tokens per canary.
const CANARY_TOKENS: u32 = 8;

/// `sha1:<hex>` over a checkpoint dir's regular files, recursively, in name order: each file's
/// relative path, size and content (docs/pools.md "Provenance"). Reading the files also warms the
/// page cache for the reload that follows.
pub fn weights_digest(dir: &Path) -> Result<String, String> {
    use sha1::{Digest, Sha1};
    use std::io::Read;
    let mut files = Vec::new();
    collect_files(dir, dir, &mut files).map_err(|e| format!("{}: {e}", dir.display()))?;
    files.sort();
    let mut hash = Sha1::new();
    let mut buf = vec![0u8; 1 << 20];
    for rel in files {
        let path = dir.join(&rel);
        let mut f = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let len = f.metadata().map_err(|e| format!("{}: {e}", path.display()))?.len();
        hash.update(rel.to_string_lossy().as_bytes());
        hash.update([0]);
        hash.update(len.to_le_bytes());
        loop {
            let n = f.read(&mut buf).map_err(|e| format!("{}: {e}", path.display()))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
        }
    }
    Ok(format!("sha1:{}", hex::encode(hash.finalize())))
}

fn collect_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            collect_files(root, &entry.path(), out)?;
        } else if kind.is_file() {
            out.push(entry.path().strip_prefix(root).map(Path::to_path_buf).unwrap_or_default());
        }
    }
    Ok(())
}

/// The files whose content a swap never changes in the engine (vLLM reloads weights only): they
/// must be byte for byte the engine's. `config.json` is compared field by field instead.
const FIXED_FILES: [&str; 8] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
];
/// Top-level JSON fields that do not describe the model, only who saved it and how it was loaded
/// (transformers adds `is_local` and `local_files_only` to a tokenizer it loaded from a directory).
const CONFIG_IGNORED: [&str; 6] =
    ["_name_or_path", "name_or_path", "transformers_version", "is_local", "local_files_only", "_commit_hash"];

/// Why the checkpoint in `candidate` cannot be swapped into an engine started with `engine` (the
/// first difference), from their files: `None` when they agree.
pub fn compatibility(engine: &Path, candidate: &Path) -> Option<String> {
    let read_config = |dir: &Path| -> Result<serde_json::Map<String, serde_json::Value>, String> {
        let path = dir.join("config.json");
        let text = launch_spec::records::read_regular(&path, launch_spec::records::MAX_INPUT_BYTES)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        match serde_json::from_str(&text) {
            Ok(serde_json::Value::Object(map)) => Ok(map),
            _ => Err(format!("{}: not a JSON object", path.display())),
        }
    };
    let (a, b) = match (read_config(engine), read_config(candidate)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return Some(e),
    };
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for key in keys.into_iter().filter(|k| !CONFIG_IGNORED.contains(&k.as_str())) {
        if a.get(key) != b.get(key) {
            let show = |v: Option<&serde_json::Value>| v.map_or("absent".to_string(), |v| v.to_string());
            return Some(format!(
                "config.json: field `{key}` is {} in the engine's model and {} in this one",
                show(a.get(key)),
                show(b.get(key))
            ));
        }
    }
    FIXED_FILES.iter().find_map(|name| {
        let read = |dir: &Path| std::fs::read(dir.join(name)).ok().map(|bytes| meaningful(name, bytes));
        (read(engine) != read(candidate))
            .then(|| format!("{name} differs from the engine's model's (a swap does not reload it)"))
    })
}

/// A fixed file's content as compared: a JSON object without [`CONFIG_IGNORED`], else the bytes.
fn meaningful(name: &str, bytes: Vec<u8>) -> Result<serde_json::Value, Vec<u8>> {
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(mut map)) if name.ends_with(".json") => {
            map.retain(|k, _| !CONFIG_IGNORED.contains(&k.as_str()));
            Ok(serde_json::Value::Object(map))
        }
        _ => Err(bytes),
    }
}

/// The greedy canaries: a short prompt and one longer than a KV block (vLLM's CPU block is 128
/// tokens, a GPU's 16), so a stale prefix cache would show.
fn canary_prompts() -> [String; 2] {
    let long = (0..48).map(|i| format!("def step_{i}(x):\n    return x * {i} + {}\n", i * 7)).collect::<String>();
    ["The quick brown fox".to_string(), long]
}

/// `payload run --pool FILE`: reads the pool and its legs, records refused legs, and runs one
/// engine start after another until every member has run or the pool cannot go on. Never panics;
/// a `pool.json` that cannot be read exits 2 writing nothing.
pub async fn run_pool(pool_path: &Path) -> i32 {
    let mut signals = match super::start_supervising() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let doc = match PoolJobSpec::from_file(pool_path) {
        Ok(doc) => doc,
        Err(err) => {
            tracing::error!(class = "spec", error = %err, "bad pool");
            return OutcomeClass::Spec.exit_code();
        }
    };
    let job_id = std::env::var("SLURM_JOB_ID").ok().filter(|j| !j.is_empty());
    let (legs, templates) = read_pool_legs(&doc, job_id.as_deref());
    let Some(first) = templates.iter().flatten().next().cloned() else {
        tracing::error!(class = "spec", "no leg of the pool has a readable spec: nothing to run");
        return OutcomeClass::Spec.exit_code();
    };
    // Security (docs/pools.md): the dev routes a swap needs answer without the API key, so the
    // engine binds loopback and nothing may expose it beyond the node.
    if let TunnelSpec::Pinggy(_) = first.tunnel {
        let why = "a pool's engine serves development routes (weight reload, pause) without the API key: it is \
                   never exposed through a public tunnel; evaluate installed-harness agents with `--allocation shared`";
        for leg in &legs {
            super::shared::record_leg(
                &leg.run_dir,
                &leg.run_tag,
                job_id.as_deref(),
                super::shared::refused(why.into()),
            );
        }
        tracing::error!(class = "spec", error = why, "pool refused");
        return OutcomeClass::Spec.exit_code();
    }
    let mut digests = Vec::new();
    for m in &doc.members {
        digests.push(weights_digest(&m.weights.path).unwrap_or_else(|e| format!("unreadable: {e}")));
    }
    let ext_dir = doc.group_dir.join("pool_ext");
    if let Err(e) = std::fs::create_dir_all(&ext_dir)
        .and_then(|()| std::fs::write(ext_dir.join(format!("{EXTENSION_MODULE}.py")), WORKER_EXTENSION))
    {
        tracing::error!(class = "spec", error = %e, "cannot write the pool's worker extension");
        return OutcomeClass::Spec.exit_code();
    }
    let link = stable_path(&first, &doc.group_tag);
    let builtin_reload = std::env::var(RELOAD_VAR).is_ok_and(|v| v == "builtin");
    let mut host = Host { legs, group_dir: doc.group_dir.clone(), pool: None };
    let mut merged: Option<GpuTime> = None;
    let pool_start = Instant::now();
    let mut engine_start = 0u32;
    let mut from = first_pending(&host, 0);
    let mut last_class: Option<OutcomeClass> = None;
    let mut port_retried = false;
    while let Some(start_member) = from {
        engine_start += 1;
        if engine_start as usize > doc.members.len() + 2 {
            tracing::error!("more cold starts than members: the pool stops; the members left are continued elsewhere");
            break;
        }
        // A LoRA member starts on the pool's base (members[0]) and loads its adapter first.
        let engine_member = if doc.members[start_member].weights.kind == WeightsKind::Lora { 0 } else { start_member };
        let engine_weights = doc.members[engine_member].weights.path.clone();
        if let Err(e) = point_link(&link, &engine_weights) {
            tracing::error!(class = "spec", error = %e, "cannot make the pool's stable model path");
            break;
        }
        let Some(template) = templates[start_member].clone().or_else(|| Some(first.clone())) else { break };
        let spec = host_spec(&doc, template, &link);
        let end = Arc::new(Mutex::new(SegmentEnd::default()));
        host.pool = Some(PoolHost {
            doc: doc.clone(),
            digests: digests.clone(),
            current: start_member,
            engine_weights,
            engine_start,
            link: link.clone(),
            ext_dir: ext_dir.clone(),
            builtin_reload,
            swap: None,
            verification: None,
            end: end.clone(),
        });
        let _ = std::fs::remove_file(doc.group_dir.join(launch_spec::shared::ENGINE_ENDED_FILE));
        let _ = std::fs::remove_file(doc.group_dir.join(launch_spec::shared::ENGINE_FILE));
        tracing::info!(engine_start, member = start_member, "pool: starting the engine");
        let segment_start = pool_start.elapsed().as_secs_f64();
        let (code, back) =
            crate::run::run_spec_host(pool_path, spec, &mut signals, prepare::parent_env(), host, Instant::now()).await;
        host = back;
        let status = read_group_status(&doc.group_dir);
        merge_gpu(&mut merged, status.as_ref().and_then(|s| s.gpu_time.clone()), segment_start);
        let class = status.as_ref().and_then(|s| s.outcome.as_ref()).map(|o| o.class);
        last_class = class;
        let seg = std::mem::take(&mut *end.lock().unwrap_or_else(|e| e.into_inner()));
        tracing::info!(engine_start, code, ?class, restart_from = ?seg.restart_from, "pool: engine start ended");
        let cause = status.as_ref().and_then(|s| s.outcome.as_ref()).and_then(|o| o.cause.clone());
        from = match (seg.restart_from, class) {
            (_, Some(OutcomeClass::Walltime | OutcomeClass::Interrupted)) => None,
            (Some(m), _) => Some(m),
            // The port was free when payload chose it and taken when vLLM bound it (another job's
            // engine on a shared node, or the last engine's socket not yet released): once more.
            (None, Some(OutcomeClass::EngineStart)) if cause.as_deref() == Some("port_in_use") && !port_retried => {
                port_retried = true;
                Some(start_member)
            }
            (None, Some(OutcomeClass::EngineDied | OutcomeClass::EngineHung)) if seg.started_any => {
                first_pending(&host, 0)
            }
            _ => None,
        };
    }
    if let Some(gpu) = merged {
        write_merged_gpu(&doc.group_dir, gpu);
    }
    let ends: Vec<(OutcomeClass, i32)> = host
        .legs
        .iter()
        .filter_map(|l| super::shared::read_status(&l.run_dir).and_then(|s| s.outcome).map(|o| (o.class, o.exit_code)))
        .collect();
    let unrun = host.legs.iter().filter(|l| l.state == LegState::Pending).count();
    if unrun > 0 {
        tracing::warn!(legs = unrun, "pool: legs left unstarted (no record): the submitter continues them");
        // Every leg that ran finished: the code says why the rest did not run (walltime, an
        // engine that would not start).
        if ends.iter().all(|(c, _)| *c == OutcomeClass::Finished) {
            return last_class.filter(|c| *c != OutcomeClass::Finished).unwrap_or(OutcomeClass::Spec).exit_code();
        }
    }
    super::shared::exit_code(&ends)
}

/// The first member from `from` on with a leg still to run.
fn first_pending(host: &Host, from: usize) -> Option<usize> {
    host.legs.iter().filter(|l| l.state == LegState::Pending && l.member >= from).map(|l| l.member).min()
}

/// Every member's legs: refused ones recorded, finished ones skipped; each member's first readable
/// spec (its engine template).
fn read_pool_legs(doc: &PoolJobSpec, job_id: Option<&str>) -> (Vec<HostLeg>, Vec<Option<LaunchSpec>>) {
    let mut legs = Vec::new();
    let mut templates: Vec<Option<LaunchSpec>> = vec![None; doc.members.len()];
    let mut first: Option<LaunchSpec> = None;
    for (m, member) in doc.members.iter().enumerate() {
        for (l, path) in member.legs.iter().enumerate() {
            let run_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            let dir_tag = run_dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            let spec =
                LaunchSpec::from_file(path).map_err(|e| (dir_tag.clone(), format!("members[{m}].legs[{l}]: {e}")));
            let spec = spec.and_then(|spec| {
                let why = if spec.model.hf_id.as_str() != member.model {
                    Some(format!(
                        "members[{m}].legs[{l}] ({}): model {} is not the member's {}; regenerate the pool",
                        spec.run_tag, spec.model.hf_id, member.model
                    ))
                } else {
                    first.as_ref().and_then(|f| {
                        files::pool_mismatch_field(f, &spec).map(|field| {
                            format!(
                                "members[{m}].legs[{l}] ({}): field `{field}` differs from the pool's first leg ({}); a pool's models must share one engine's settings",
                                spec.run_tag, f.run_tag
                            )
                        })
                    })
                };
                match why {
                    Some(why) => Err((spec.run_tag.clone(), why)),
                    None => Ok(spec),
                }
            });
            match spec {
                Ok(spec) => {
                    let finished = super::shared::harbor_job_finished(&spec.run_dir);
                    legs.push(HostLeg {
                        run_tag: spec.run_tag.clone(),
                        run_dir: spec.run_dir.clone(),
                        spec_path: path.clone(),
                        state: if finished { LegState::Skipped } else { LegState::Pending },
                        harbor_running: false,
                        member: m,
                    });
                    first.get_or_insert_with(|| spec.clone());
                    templates[m].get_or_insert(spec);
                }
                Err((run_tag, why)) => {
                    tracing::error!(run_tag = %run_tag, error = %why, "leg refused");
                    super::shared::record_leg(&run_dir, &run_tag, job_id, super::shared::refused(why));
                    legs.push(HostLeg {
                        run_tag,
                        run_dir,
                        spec_path: path.clone(),
                        state: LegState::Refused,
                        harbor_running: false,
                        member: m,
                    });
                }
            }
        }
    }
    (legs, templates)
}

/// The stable path every member is served through: node-local (the spec's scratch root, else
/// `TMPDIR`), the same for every engine start of this pool.
fn stable_path(spec: &LaunchSpec, group_tag: &str) -> PathBuf {
    let root = spec
        .scratch
        .as_ref()
        .map(|s| s.root.clone())
        .or_else(|| std::env::var_os("TMPDIR").filter(|t| !t.is_empty()).map(PathBuf::from))
        .unwrap_or_else(std::env::temp_dir);
    root.join(format!("evalci-pool-{group_tag}")).join("model")
}

/// Points the stable path at `target` (replaced atomically: a new link renamed over the old).
fn point_link(link: &Path, target: &Path) -> std::io::Result<()> {
    let dir = link.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(".model.new");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    std::fs::rename(&tmp, link)
}

/// The engine host's spec for one engine start: the member's first leg's, served from the stable
/// path on loopback, its records in the group dir.
fn host_spec(doc: &PoolJobSpec, template: LaunchSpec, link: &Path) -> LaunchSpec {
    let jobs_dir = doc.group_dir.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut spec = LaunchSpec {
        run_tag: doc.group_tag.clone(),
        run_dir: doc.group_dir.clone(),
        jobs_dir,
        ledger_job_id: None,
        post_run: None,
        ..template
    };
    spec.model.local_path = Some(link.to_path_buf());
    spec.serve.host = "127.0.0.1".into();
    spec
}

fn read_group_status(group_dir: &Path) -> Option<launch_spec::RunStatus> {
    super::shared::read_status(group_dir)
}

/// Adds one engine start's GPU time to the pool's (leg spans moved onto the pool's clock).
fn merge_gpu(merged: &mut Option<GpuTime>, segment: Option<GpuTime>, offset_s: f64) {
    let Some(seg) = segment else { return };
    let m = merged.get_or_insert_with(|| GpuTime { gpus: seg.gpus, ..GpuTime::default() });
    m.gpus = m.gpus.max(seg.gpus);
    m.prepare_s += seg.prepare_s;
    m.load_s += seg.load_s;
    m.serving_s += seg.serving_s;
    m.idle_s += seg.idle_s;
    m.teardown_s += seg.teardown_s;
    m.legs.extend(seg.legs.into_iter().map(|mut s| {
        s.start_s += offset_s;
        s.end_s += offset_s;
        s
    }));
}

/// The group's `status.json` with the GPU time of every engine start of the pool.
fn write_merged_gpu(group_dir: &Path, gpu: GpuTime) {
    let Some(mut status) = read_group_status(group_dir) else { return };
    status.gpu_time = Some(gpu);
    if let Ok(text) = serde_json::to_string_pretty(&status) {
        let _ = launch_spec::records::write_atomically(&group_dir.join(STATUS_FILE), text.as_bytes());
    }
}

/// One swap's measurements, filled as it goes.
struct SwapTimes {
    started_at: String,
    pause_ms: u64,
    reload_ms: u64,
    verify_ms: u64,
}

impl<S: SignalSource> Run<S> {
    fn pool(&self) -> Option<&PoolHost> {
        match &self.share {
            Share::Host(Host { pool: Some(p), .. }) => Some(p),
            _ => None,
        }
    }

    fn pool_mut(&mut self) -> Option<&mut PoolHost> {
        match &mut self.share {
            Share::Host(Host { pool: Some(p), .. }) => Some(p),
            _ => None,
        }
    }

    /// The engine of a pool: the worker extension on its PYTHONPATH, the dev routes on, every full
    /// member's served name as an alias (a swap does not change the served name), LoRA enabled
    /// when a member is an adapter.
    pub(crate) fn pool_amend_engine(&self, p: &mut Prepared) {
        let Some(pool) = self.pool() else { return };
        let Some(head) = p.engines.iter_mut().find(|e| e.role == prepare::EngineRole::Head) else { return };
        let child = &mut head.child;
        let path = match child.env.get("PYTHONPATH").filter(|v| !v.is_empty()) {
            Some(old) => format!("{}:{old}", pool.ext_dir.display()),
            None => pool.ext_dir.display().to_string(),
        };
        child.env.insert("PYTHONPATH".into(), path);
        child.env.insert("VLLM_SERVER_DEV_MODE".into(), "1".into());
        child.argv.extend(["--worker-extension-cls".to_string(), EXTENSION_CLASS.to_string()]);
        let served = &self.spec.model.served_name;
        let mut aliases: Vec<String> = Vec::new();
        let mut lora = false;
        for leg in self.host_legs() {
            let Some(name) = served_name_of(&leg.spec_path) else { continue };
            match pool.doc.members[leg.member].weights.kind {
                WeightsKind::Full if name != *served && !aliases.contains(&name) => aliases.push(name),
                WeightsKind::Lora => lora = true,
                WeightsKind::Full => {}
            }
        }
        if let Some(i) = child.argv.iter().position(|a| a == "--served-model-name") {
            let at = (i + 2).min(child.argv.len());
            child.argv.splice(at..at, aliases);
        }
        if lora {
            child.argv.push("--enable-lora".into());
            child.env.insert("VLLM_ALLOW_RUNTIME_LORA_UPDATING".into(), "1".into());
        }
    }

    fn host_legs(&self) -> &[HostLeg] {
        match &self.share {
            Share::Host(h) => &h.legs,
            _ => &[],
        }
    }

    /// The next member with a leg to run, once the current member's legs have all ended.
    pub(crate) fn pool_next(&self) -> Option<usize> {
        let pool = self.pool()?;
        self.host_legs()
            .iter()
            .filter(|l| l.state == LegState::Pending && l.member > pool.current)
            .map(|l| l.member)
            .min()
    }

    /// The engine is ready: the first member's canaries (the fresh start's reference) or, for a
    /// LoRA member, its adapter loaded; then its legs. Err when the adapter cannot be proven.
    pub(crate) async fn pool_begin(&mut self, p: &Prepared) -> Result<bool, crate::phases::End> {
        let Some(pool) = self.pool() else { return Ok(true) };
        let current = pool.current;
        if pool.doc.members[current].weights.kind == WeightsKind::Lora {
            return Ok(self.pool_swap(p, current).await);
        }
        let served =
            served_name_of_member(self.host_legs(), current).unwrap_or_else(|| self.spec.model.served_name.clone());
        let client = crate::engine::http_client_with_key(SWAP_CALL_TIMEOUT, p.api_key.as_deref());
        let canaries = run_canaries(&client, &p.base_url, &served).await;
        if let Some(pool) = self.pool_mut() {
            pool.verification = Some(match canaries {
                Ok((lines, _)) => format!("fresh start (the reference): {}", lines.join("; ")),
                Err(e) => format!("canaries failed on the fresh start: {e}"),
            });
        }
        Ok(true)
    }

    /// Brings member `next` in. true: its legs may start; false: this engine start ends and the
    /// member is started cold (recorded in `swaps.jsonl` and the segment's end).
    pub(crate) async fn pool_swap(&mut self, p: &Prepared, next: usize) -> bool {
        let Some(pool) = self.pool() else { return false };
        let member = pool.doc.members[next].clone();
        let engine_weights = pool.engine_weights.clone();
        let (link, builtin, engine_start, digest) =
            (pool.link.clone(), pool.builtin_reload, pool.engine_start, pool.digests[next].clone());
        let served = served_name_of_member(self.host_legs(), next).unwrap_or_else(|| member.model.clone());
        let mut times =
            SwapTimes { started_at: chrono::Utc::now().to_rfc3339(), pause_ms: 0, reload_ms: 0, verify_ms: 0 };
        let mut evidence = SwapEvidence::default();
        let result =
            self.pool_swap_steps(p, &member, &engine_weights, &link, builtin, &served, &mut times, &mut evidence).await;
        let outcome = match &result {
            Ok(()) => SwapOutcome::Ok,
            Err(SwapFailure::Incompatible(why)) => SwapOutcome::Incompatible(why.clone()),
            Err(SwapFailure::Failed(why)) => SwapOutcome::ColdRestart(why.clone()),
        };
        let record = SwapRecord {
            member: next,
            model: member.model.clone(),
            kind: member.weights.kind,
            weights_digest: digest,
            engine_start,
            started_at: times.started_at,
            ended_at: chrono::Utc::now().to_rfc3339(),
            pause_ms: times.pause_ms,
            reload_ms: times.reload_ms,
            verify_ms: times.verify_ms,
            evidence: evidence.clone(),
            outcome: outcome.clone(),
        };
        append_swap(&self.spec.run_dir.join(SWAPS_FILE), &record);
        tracing::info!(member = next, model = %member.model, outcome = ?outcome, pause_ms = record.pause_ms, reload_ms = record.reload_ms, verify_ms = record.verify_ms, "pool: swap");
        let Some(pool) = self.pool_mut() else { return false };
        match result {
            Ok(()) => {
                pool.current = next;
                pool.swap = Some(evidence);
                pool.verification = None;
                true
            }
            Err(_) => {
                let mut end = pool.end.lock().unwrap_or_else(|e| e.into_inner());
                end.restart_from = Some(next);
                false
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn pool_swap_steps(
        &mut self,
        p: &Prepared,
        member: &launch_spec::pool::PoolMember,
        engine_weights: &Path,
        link: &Path,
        builtin: bool,
        served: &str,
        times: &mut SwapTimes,
        evidence: &mut SwapEvidence,
    ) -> Result<(), SwapFailure> {
        let failed = |what: &str, e: String| SwapFailure::Failed(format!("{what}: {e}"));
        if member.weights.kind == WeightsKind::Full
            && let Some(why) = compatibility(engine_weights, &member.weights.path)
        {
            evidence.compatibility = Some(why.clone());
            return Err(SwapFailure::Incompatible(why));
        }
        let dev = crate::engine::http_client(SWAP_CALL_TIMEOUT);
        let api = crate::engine::http_client_with_key(SWAP_CALL_TIMEOUT, p.api_key.as_deref());
        let base = &p.base_url;
        let t = Instant::now();
        post(&dev, &format!("{base}/pause"), None).await.map_err(|e| failed("pause", e))?;
        times.pause_ms = t.elapsed().as_millis() as u64;
        let t = Instant::now();
        match member.weights.kind {
            WeightsKind::Full => {
                // The stable path follows the member, so a cold start after this one keeps the key.
                point_link(link, &member.weights.path).map_err(|e| failed("stable path", e.to_string()))?;
                let (method, kwargs) = if builtin {
                    ("reload_weights", json!({"weights_path": link.display().to_string()}))
                } else {
                    ("pool_reload", json!({"weights_path": link.display().to_string(), "repack_head": "1"}))
                };
                let body = json!({"method": method, "kwargs": kwargs});
                post(&dev, &format!("{base}/collective_rpc"), Some(&body)).await.map_err(|e| failed("reload", e))?;
            }
            WeightsKind::Lora => {
                let body = json!({"lora_name": served, "lora_path": member.weights.path.display().to_string(), "load_inplace": true});
                post(&api, &format!("{base}/v1/load_lora_adapter"), Some(&body))
                    .await
                    .map_err(|e| failed("load_lora_adapter", e))?;
            }
        }
        times.reload_ms = t.elapsed().as_millis() as u64;
        let t = Instant::now();
        if member.weights.kind == WeightsKind::Full {
            let body =
                json!({"method": "pool_check", "kwargs": {"weights_path": member.weights.path.display().to_string()}});
            let answer =
                post(&dev, &format!("{base}/collective_rpc"), Some(&body)).await.map_err(|e| failed("check", e))?;
            let check = summarize_check(&answer);
            evidence.parameter_check = Some(check.clone().unwrap_or_else(|e| e));
            if let Err(why) = check {
                times.verify_ms = t.elapsed().as_millis() as u64;
                return Err(SwapFailure::Failed(format!("parameter check: {why}")));
            }
        }
        post(&dev, &format!("{base}/resume"), None).await.map_err(|e| failed("resume", e))?;
        let canaries = run_canaries(&api, base, served).await;
        times.verify_ms = t.elapsed().as_millis() as u64;
        let (lines, same) = canaries.map_err(|e| failed("canary", e))?;
        evidence.canaries = lines;
        if !same {
            return Err(SwapFailure::Failed(
                "canary: the ids differ with a fresh cache_salt (stale prefix cache)".into(),
            ));
        }
        Ok(())
    }
}

enum SwapFailure {
    Incompatible(String),
    Failed(String),
}

/// The worker extension's answer (`{"results": ["<json>", …]}`, one per worker): `Ok(summary)`
/// when every worker found what the engine computes with equal to the checkpoint.
pub fn summarize_check(answer: &serde_json::Value) -> Result<String, String> {
    let results = answer.get("results").and_then(|r| r.as_array()).ok_or("no `results` in the answer")?;
    if results.is_empty() {
        return Err("no worker answered".into());
    }
    let mut summary = Vec::new();
    for (i, r) in results.iter().enumerate() {
        let parsed: serde_json::Value = match r {
            serde_json::Value::String(s) => serde_json::from_str(s).map_err(|e| format!("worker {i}: {e}"))?,
            other => other.clone(),
        };
        let mismatches: Vec<String> = parsed
            .get("mismatches")
            .and_then(|m| m.as_array())
            .map(|m| m.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        let layers = parsed.get("layers_by_function").and_then(|v| v.as_u64()).unwrap_or(0);
        let exact = parsed.get("parameters_exact").and_then(|v| v.as_u64()).unwrap_or(0);
        let worst = parsed.get("max_relative_difference").and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
        let sha = parsed.get("checkpoint_sha1").and_then(|v| v.as_str()).unwrap_or("?");
        if let Some(first) = mismatches.first() {
            return Err(format!(
                "worker {i}: {} of {layers} layers/parameters differ, first {first}",
                mismatches.len()
            ));
        }
        if layers == 0 {
            return Err(format!("worker {i}: no layer could be compared with the checkpoint"));
        }
        summary.push(format!(
            "worker {i}: ok, {layers} layers by function (max relative difference {worst:.3e}), {exact} parameters exact, checkpoint tensors sha1:{sha}"
        ));
    }
    Ok(summary.join("; "))
}

/// POSTs to a dev route or the API; the body as JSON (`null` for an empty answer). Err: why.
async fn post(
    client: &reqwest::Client,
    url: &str,
    body: Option<&serde_json::Value>,
) -> Result<serde_json::Value, String> {
    let req = client.post(url);
    let req = match body {
        Some(b) => req.json(b),
        None => req,
    };
    let resp = req.send().await.map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    if !status.is_success() {
        let short: String = text.chars().take(300).collect();
        return Err(format!("{url}: HTTP {status}: {short}"));
    }
    Ok(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
}

/// The greedy canaries: each prompt without and with a fresh `cache_salt`. Returns a line per
/// canary and whether every pair agreed.
async fn run_canaries(client: &reqwest::Client, base: &str, served: &str) -> Result<(Vec<String>, bool), String> {
    let mut lines = Vec::new();
    let mut same = true;
    let salt = format!("canary-{}-{}", std::process::id(), chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0));
    for (i, prompt) in canary_prompts().iter().enumerate() {
        let ask = |salt: Option<&str>| {
            let mut body = json!({
                "model": served, "prompt": prompt, "max_tokens": CANARY_TOKENS, "temperature": 0,
                "return_token_ids": true,
            });
            if let Some(s) = salt {
                body["cache_salt"] = json!(s);
            }
            body
        };
        let url = format!("{base}/v1/completions");
        let plain = post(client, &url, Some(&ask(None))).await?;
        let salted = post(client, &url, Some(&ask(Some(&salt)))).await?;
        let (ids, prompt_len) = completion_ids(&plain).ok_or("no token ids in the completion")?;
        let (salted_ids, _) = completion_ids(&salted).ok_or("no token ids in the completion")?;
        let agree = ids == salted_ids;
        same &= agree;
        lines.push(format!(
            "canary {i} ({prompt_len} prompt tokens): {ids:?} {} with a fresh cache_salt",
            if agree { "same" } else { "differs" }
        ));
    }
    Ok((lines, same))
}

/// A completion's generated token ids and its prompt's length (vLLM's `return_token_ids`).
pub fn completion_ids(body: &serde_json::Value) -> Option<(Vec<u64>, usize)> {
    let choice = body.get("choices")?.get(0)?;
    let ids = choice.get("token_ids")?.as_array()?.iter().filter_map(|v| v.as_u64()).collect();
    let prompt = choice
        .get("prompt_token_ids")
        .or_else(|| body.get("prompt_token_ids"))
        .and_then(|p| p.as_array())
        .map_or(0, Vec::len);
    Some((ids, prompt))
}

fn append_swap(path: &Path, record: &SwapRecord) {
    use std::io::Write;
    let Ok(line) = serde_json::to_string(record) else { return };
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        tracing::warn!(error = %e, path = %path.display(), "cannot append the swap record");
    }
}

fn served_name_of(spec_path: &Path) -> Option<String> {
    LaunchSpec::from_file(spec_path).ok().map(|s| s.model.served_name)
}

fn served_name_of_member(legs: &[HostLeg], member: usize) -> Option<String> {
    legs.iter()
        .filter(|l| l.member == member && l.state != LegState::Refused)
        .find_map(|l| served_name_of(&l.spec_path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_dir(dir: &Path, config: serde_json::Value, tokenizer: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        std::fs::write(dir.join("tokenizer.json"), tokenizer).unwrap();
        std::fs::write(dir.join("model.safetensors"), b"weights").unwrap();
    }

    #[test]
    fn only_checkpoints_that_differ_in_weights_alone_are_compatible() {
        let t = tempfile::tempdir().unwrap();
        let cfg = json!({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 128, "_name_or_path": "/a"});
        model_dir(&t.path().join("a"), cfg.clone(), "tok");
        let mut b = cfg.clone();
        b["_name_or_path"] = json!("/b");
        model_dir(&t.path().join("b"), b, "tok");
        std::fs::write(t.path().join("b/model.safetensors"), b"other weights").unwrap();
        assert_eq!(compatibility(&t.path().join("a"), &t.path().join("b")), None);
        let mut wide = cfg.clone();
        wide["hidden_size"] = json!(256);
        model_dir(&t.path().join("c"), wide, "tok");
        let why = compatibility(&t.path().join("a"), &t.path().join("c")).unwrap();
        assert!(why.contains("`hidden_size` is 128") && why.contains("256"), "{why}");
        std::fs::write(t.path().join("a/tokenizer_config.json"), r#"{"eos_token": "x"}"#).unwrap();
        std::fs::write(t.path().join("b/tokenizer_config.json"), r#"{"eos_token": "x", "is_local": true}"#).unwrap();
        assert_eq!(compatibility(&t.path().join("a"), &t.path().join("b")), None, "loader hints are not the model");
        std::fs::write(t.path().join("b/tokenizer_config.json"), r#"{"eos_token": "y"}"#).unwrap();
        assert!(compatibility(&t.path().join("a"), &t.path().join("b")).unwrap().starts_with("tokenizer_config.json"));
        model_dir(&t.path().join("d"), cfg.clone(), "other tokenizer");
        assert!(compatibility(&t.path().join("a"), &t.path().join("d")).unwrap().starts_with("tokenizer.json"));
        let missing = compatibility(&t.path().join("a"), &t.path().join("nope")).unwrap();
        assert!(missing.contains("config.json"), "{missing}");
    }

    #[test]
    fn the_weights_digest_follows_names_and_content() {
        let t = tempfile::tempdir().unwrap();
        model_dir(&t.path().join("a"), json!({}), "tok");
        let a = weights_digest(&t.path().join("a")).unwrap();
        assert!(a.starts_with("sha1:") && a.len() == 45, "{a}");
        assert_eq!(weights_digest(&t.path().join("a")).unwrap(), a);
        std::fs::write(t.path().join("a/model.safetensors"), b"weightz").unwrap();
        assert_ne!(weights_digest(&t.path().join("a")).unwrap(), a);
        assert!(weights_digest(&t.path().join("missing")).is_err());
    }

    #[test]
    fn the_check_passes_only_when_every_worker_matched() {
        let ok = json!({"results": [json!({"layers_by_function": 9, "parameters_exact": 5, "max_relative_difference": 0.004, "mismatches": [], "checkpoint_sha1": "ab"}).to_string()]});
        let s = summarize_check(&ok).unwrap();
        assert!(s.contains("9 layers by function") && s.contains("sha1:ab"), "{s}");
        let bad = json!({"results": [{"layers_by_function": 9, "mismatches": ["lm_head: relative difference 1.3"]}]});
        assert!(summarize_check(&bad).unwrap_err().contains("first lm_head"));
        assert!(summarize_check(&json!({"results": []})).is_err());
        assert!(summarize_check(&json!({"results": [{"layers_by_function": 0, "mismatches": []}]})).is_err());
        assert!(summarize_check(&json!(null)).is_err());
    }

    #[test]
    fn completion_ids_read_vllms_answer() {
        let body = json!({"choices": [{"token_ids": [5, 6], "prompt_token_ids": [1, 2, 3]}]});
        assert_eq!(completion_ids(&body), Some((vec![5, 6], 3)));
        assert_eq!(completion_ids(&json!({"choices": [{"text": "x"}]})), None);
    }

    #[test]
    fn gpu_time_of_engine_starts_adds_up_on_one_clock() {
        let mut merged = None;
        let span = |s: f64, e: f64| launch_spec::records::LegSpan { run_tag: "a".into(), start_s: s, end_s: e };
        merge_gpu(
            &mut merged,
            Some(GpuTime { gpus: 1, load_s: 20.0, serving_s: 5.0, legs: vec![span(21.0, 26.0)], ..GpuTime::default() }),
            0.0,
        );
        merge_gpu(
            &mut merged,
            Some(GpuTime { gpus: 1, load_s: 25.0, serving_s: 3.0, legs: vec![span(26.0, 29.0)], ..GpuTime::default() }),
            40.0,
        );
        let m = merged.unwrap();
        assert_eq!((m.load_s, m.serving_s), (45.0, 8.0));
        assert_eq!(m.legs[1].start_s, 66.0);
    }

    #[test]
    fn the_stable_path_is_the_same_for_every_engine_start() {
        let t = tempfile::tempdir().unwrap();
        let link = t.path().join("evalci-pool-g").join("model");
        point_link(&link, Path::new("/w/a")).unwrap();
        point_link(&link, Path::new("/w/b")).unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("/w/b"));
    }
}
