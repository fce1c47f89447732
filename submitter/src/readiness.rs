//! The readiness budget a spec carries (issue 23; docs/payload.md "Readiness budget"): how long
//! the job's vLLM should take to become ready, from what it loads — the checkpoint's size over
//! the cluster's file-system bandwidth, plus compile and CUDA-graph allowances — capped by the
//! profile's `engine.health_timeout_s`. The rules are pure; the one effect is the bounded walk
//! that sums the weights on disk ([`size_on_disk`]).

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use launch_spec::spec::{ReadyBudget, ServeSpec};
use regex::Regex;

use crate::config::cluster::EngineSettings;

/// Where the checkpoint's size came from.
#[derive(Debug, Clone, PartialEq)]
pub enum Weights {
    /// Summed on disk (an HF cache snapshot or a local path).
    OnDisk { bytes: u64, path: PathBuf },
    /// From the parameter count in the model id (the weights are not there yet: they will be
    /// downloaded, or this is a dry run).
    Estimated { bytes: u64, params: String, dtype_bytes: f64, dtype: &'static str },
}

impl Weights {
    pub fn bytes(&self) -> u64 {
        match self {
            Weights::OnDisk { bytes, .. } | Weights::Estimated { bytes, .. } => *bytes,
        }
    }

    fn basis(&self) -> String {
        match self {
            Weights::OnDisk { path, .. } => format!("size on disk of {}", path.display()),
            Weights::Estimated { params, dtype_bytes, dtype, .. } => {
                format!("estimated from {params} × {dtype_bytes} bytes ({dtype}): weights not on disk yet")
            }
        }
    }
}

/// The walk stops (no size) past this many entries or this depth: a snapshot is a few dozen
/// files one or two levels deep, and a path given by mistake (a whole file system) must not
/// hold up `plan`.
pub(crate) const MAX_ENTRIES: usize = 20_000;
pub(crate) const MAX_DEPTH: usize = 6;

/// Bytes of the regular files under `dir`, following symlinks (an HF snapshot's files link into
/// its `blobs/`); `None` when `dir` is not a directory or the walk passes [`MAX_ENTRIES`] or
/// [`MAX_DEPTH`].
/// The snapshot dir huggingface_hub resolves `model` to in `cache` without the network.
pub fn hf_snapshot(cache: &Path, model: &str) -> Option<PathBuf> {
    let repo = cache.join(format!("models--{}", model.replace('/', "--")));
    let revision = std::fs::read_to_string(repo.join("refs").join("main")).ok()?;
    let snapshot = repo.join("snapshots").join(revision.trim());
    snapshot.join("config.json").is_file().then_some(snapshot)
}

pub(crate) fn size_on_disk(dir: &Path) -> Option<u64> {
    fn walk(dir: &Path, depth: usize, entries: &mut usize) -> Option<u64> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut total = 0u64;
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            *entries += 1;
            if *entries > MAX_ENTRIES {
                return None;
            }
            // `metadata` follows the link to the blob; a dangling link counts nothing.
            let Ok(meta) = std::fs::metadata(entry.path()) else { continue };
            if meta.is_dir() {
                total = total.saturating_add(walk(&entry.path(), depth + 1, entries)?);
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
            }
        }
        Some(total)
    }
    std::fs::metadata(dir).ok().filter(|m| m.is_dir())?;
    walk(dir, 0, &mut 0)
}

/// A size as a word of the id: `8B`, `235B`, `0.6B`, `135M`, between separators (so the `A22B`
/// of `Qwen3-235B-A22B`, the active-parameter count, is not it).
static PARAMS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)(?:^|[-_./])(\d+(?:\.\d+)?)([bm])(?:$|[-_.])").expect("valid regex"));

/// Mixture-of-experts ids: an active-parameter word (`-A22B`, `-A3B`), or a known MoE family.
static MOE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)(?:^|[-_./])a\d+(?:\.\d+)?b(?:$|[-_.])|mixtral|moe|deepseek-(?:v[23]|r1)|gpt-oss")
        .expect("valid regex")
});

/// The parameter count named in a model id, as written (`235B`) and as a number.
pub(crate) fn parameters_in_name(model: &str) -> Option<(String, f64)> {
    let name = model.rsplit('/').next().unwrap_or(model);
    let caps = PARAMS.captures(name)?;
    let number: f64 = caps[1].parse().ok()?;
    let unit = if caps[2].eq_ignore_ascii_case("b") { 1e9 } else { 1e6 };
    Some((format!("{}{}", &caps[1], caps[2].to_ascii_uppercase()), number * unit))
}

/// Bytes per parameter the id implies: FP8 1, 4-bit quantizations ½, else bf16's 2.
pub(crate) fn dtype_of(model: &str) -> (f64, &'static str) {
    let id = model.to_ascii_lowercase();
    if id.contains("fp8") {
        (1.0, "fp8")
    } else if ["awq", "gptq", "int4", "w4a16", "4bit", "nvfp4", "mxfp4"].iter().any(|q| id.contains(q)) {
        (0.5, "4-bit")
    } else {
        (2.0, "bf16")
    }
}

pub(crate) fn is_moe(model: &str) -> bool {
    MOE.is_match(model.rsplit('/').next().unwrap_or(model))
}

/// `--enforce-eager` among the engine's extra args: vLLM captures no CUDA graphs.
pub fn enforce_eager(serve: &ServeSpec) -> bool {
    serve
        .extra_args
        .as_deref()
        .is_some_and(|a| launch_spec::spec::split_extra_args(a).iter().any(|w| w == "--enforce-eager"))
}

/// The checkpoint's size: on disk at `local_path` or the HF cache's snapshot of `model`, else
/// estimated from the id; `None` when neither is possible (the cap alone applies).
pub fn weights(model: &str, local_path: Option<&Path>, hf_cache: Option<&Path>) -> Option<Weights> {
    let on_disk = local_path.map(Path::to_path_buf).or_else(|| hf_cache.and_then(|cache| hf_snapshot(cache, model)));
    if let Some(path) = on_disk
        && let Some(bytes) = size_on_disk(&path)
    {
        return Some(Weights::OnDisk { bytes, path });
    }
    let (params, count) = parameters_in_name(model)?;
    let (dtype_bytes, dtype) = dtype_of(model);
    Some(Weights::Estimated { bytes: (count * dtype_bytes) as u64, params, dtype_bytes, dtype })
}

/// The budget for `model` served as `serve` on a cluster with `engine`'s settings (pure).
pub fn budget(engine: &EngineSettings, model: &str, serve: &ServeSpec, weights: &Weights) -> ReadyBudget {
    let moe = is_moe(model);
    let eager = enforce_eager(serve);
    let compile_s = if moe { engine.moe_compile_allowance_s } else { engine.compile_allowance_s };
    let graph_capture_s = if eager { 0 } else { engine.graph_capture_allowance_s };
    let mut basis = weights.basis();
    if moe {
        basis += "; MoE: engine.moe_compile_allowance_s";
    }
    if eager {
        basis += "; --enforce-eager: no graph capture";
    }
    ReadyBudget::compute(
        weights.bytes(),
        engine.load_bandwidth_mib_s,
        compile_s,
        graph_capture_s,
        serve.health_timeout_s,
        basis,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parameter_count_is_the_size_word_not_the_active_count() {
        let p = |m| parameters_in_name(m).map(|(w, n)| (w, n as u64));
        assert_eq!(p("Qwen/Qwen3-8B"), Some(("8B".into(), 8_000_000_000)));
        assert_eq!(p("Qwen/Qwen3-235B-A22B-Instruct-2507"), Some(("235B".into(), 235_000_000_000)));
        assert_eq!(p("Qwen/Qwen3.5-35B-A3B"), Some(("35B".into(), 35_000_000_000)));
        assert_eq!(p("meta-llama/Llama-3.1-8B-Instruct"), Some(("8B".into(), 8_000_000_000)));
        assert_eq!(p("Qwen/Qwen3-0.6B"), Some(("0.6B".into(), 600_000_000)));
        assert_eq!(p("HuggingFaceTB/SmolLM2-135M"), Some(("135M".into(), 135_000_000)));
        assert_eq!(p("org/my-sft"), None);
        assert_eq!(p("org/Bert-base"), None, "no size word");
        assert!(is_moe("Qwen/Qwen3-235B-A22B-Instruct-2507") && is_moe("Qwen/Qwen3.5-35B-A3B"));
        assert!(!is_moe("Qwen/Qwen3-8B") && !is_moe("Qwen/Qwen3-32B"));
        assert_eq!(dtype_of("Qwen/Qwen3-8B-FP8"), (1.0, "fp8"));
        assert_eq!(dtype_of("Qwen/Qwen3-32B-AWQ"), (0.5, "4-bit"));
    }

    /// MoE takes its own compile allowance; `--enforce-eager` captures no graphs; the cap holds.
    #[test]
    fn the_allowances_follow_the_model_and_its_serve_settings() {
        let engine: EngineSettings = serde_json::from_value(serde_json::json!({
            "default_environment": "e", "load_bandwidth_mib_s": 1024.0, "compile_allowance_s": 100,
            "moe_compile_allowance_s": 500, "graph_capture_allowance_s": 50,
        }))
        .unwrap();
        let mut serve: ServeSpec = serde_json::from_value(serde_json::json!({
            "program": "vllm", "tensor_parallel_size": 1, "data_parallel_size": 1, "health_timeout_s": 3000,
        }))
        .unwrap();
        let gib = |n: u64| Weights::Estimated { bytes: n << 30, params: "x".into(), dtype_bytes: 2.0, dtype: "bf16" };
        let dense = budget(&engine, "Qwen/Qwen3-8B", &serve, &gib(16));
        assert_eq!((dense.load_s, dense.compile_s, dense.graph_capture_s, dense.seconds), (16, 100, 50, 166));
        let moe = budget(&engine, "Qwen/Qwen3-235B-A22B", &serve, &gib(438));
        assert_eq!((moe.load_s, moe.compile_s, moe.seconds), (438, 500, 988));
        assert!(moe.basis.contains("MoE"), "{}", moe.basis);
        serve.extra_args = Some("--enable-prefix-caching --enforce-eager".into());
        let eager = budget(&engine, "Qwen/Qwen3-8B", &serve, &gib(16));
        assert_eq!(eager.graph_capture_s, 0);
        assert!(eager.basis.contains("--enforce-eager"), "{}", eager.basis);
        serve.health_timeout_s = 120;
        assert_eq!(budget(&engine, "Qwen/Qwen3-8B", &serve, &gib(438)).seconds, 120, "capped");
    }

    #[test]
    fn a_snapshot_is_summed_through_its_links_and_the_walk_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = dir.path().join("blobs");
        let snapshot = dir.path().join("snapshots/abc");
        std::fs::create_dir_all(&blobs).unwrap();
        std::fs::create_dir_all(snapshot.join("sub")).unwrap();
        for (name, len) in [("b1", 1000u64), ("b2", 24)] {
            std::fs::File::create(blobs.join(name)).unwrap().set_len(len).unwrap();
        }
        std::os::unix::fs::symlink(blobs.join("b1"), snapshot.join("model.safetensors")).unwrap();
        std::os::unix::fs::symlink(blobs.join("b2"), snapshot.join("sub/config.json")).unwrap();
        std::os::unix::fs::symlink(blobs.join("gone"), snapshot.join("dangling")).unwrap();
        assert_eq!(size_on_disk(&snapshot), Some(1024));
        assert_eq!(size_on_disk(&snapshot.join("model.safetensors")), None, "a file is not a checkpoint dir");
        let mut deep = dir.path().join("deep");
        for _ in 0..=MAX_DEPTH + 1 {
            deep = deep.join("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        assert_eq!(size_on_disk(&dir.path().join("deep")), None, "past the depth bound: no size");
    }
}
