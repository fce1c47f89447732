//! Multi-node resolution (docs/multinode.md): layouts for engines larger than a node, the one fit
//! check, and the weights-fit lint.

use std::path::Path;

use serde_json::Value;

use crate::support::{spec_on_local, stderr, stdout, submitter, workspace_root};

fn resolve_json(cluster: &str, model: &str) -> Value {
    let out = submitter(&["registry", "resolve", "--cluster", cluster, "--json", model]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str::<Value>(&stdout(&out)).unwrap()["models"][model].clone()
}

#[test]
fn large_models_get_a_layout_that_fits() {
    // 235B-A22B MoE on Leonardo (4 × A100-64GB per node): TP 4 inside a node, 4 stages over 4 nodes.
    let got = resolve_json("leonardo", "Qwen/Qwen3-235B-A22B-Instruct-2507");
    assert_eq!(got["layout"], serde_json::json!({"nodes": 4, "gpus_per_node": 4, "crossing": "pipeline"}), "{got}");
    // 70B on Vista (one GH200 per node): two pipeline stages on two nodes.
    let got = resolve_json("vista", "meta-llama/Llama-3.3-70B-Instruct");
    assert_eq!(got["layout"], serde_json::json!({"nodes": 2, "gpus_per_node": 1, "crossing": "pipeline"}), "{got}");
    assert_eq!(got["pipeline_parallel_size"], 2);
    // A single-node model keeps its old JSON shape.
    let got = resolve_json("leonardo", "Qwen/Qwen3-8B");
    assert!(got.get("layout").is_none() && got.get("pipeline_parallel_size").is_none(), "{got}");
}

#[test]
fn too_large_for_a_single_node_cluster_is_refused_with_the_fix() {
    // The local cluster has no max_nodes: the same check refuses in resolve and spec.
    let out = submitter(&["registry", "resolve", "--cluster", "local", "Qwen/Qwen3-235B-A22B-Instruct-2507"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("16 GPUs does not fit") && err.contains("slurm.max_nodes"), "{err}");
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("launch.json");
    let out = spec_on_local("tb2", "Qwen/Qwen3-235B-A22B-Instruct-2507", &["--out", spec.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(stderr(&out).contains("16 GPUs does not fit"), "{}", stderr(&out));
    assert!(!spec.exists(), "nothing half-written");
}

/// A registry holding one model file, in a temp dir.
fn registry_with(dir: &Path, org: &str, file: &str, text: &str) {
    std::fs::create_dir_all(dir.join(org)).unwrap();
    std::fs::write(dir.join(org).join(file), text).unwrap();
}

#[test]
fn lint_warns_when_weights_cannot_fit_and_when_tp_crosses_nodes() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = tmp.path().join("model_config");
    // 405B bf16 ≈ 754 GiB + margin on 8 × 64 GiB × 0.85 = 435 GiB on Leonardo: does not fit.
    registry_with(
        &registry,
        "meta-llama",
        "Llama-3.1-405B-Instruct.yaml",
        "model: meta-llama/Llama-3.1-405B-Instruct\nsubsystems:\n  eval:\n    tensor_parallel_size: 4\n    pipeline_parallel_size: 2\n    timeout_multiplier: 1.0\n",
    );
    // TP 8 over two 4-GPU nodes: tensor parallelism crosses the node boundary.
    registry_with(
        &registry,
        "org",
        "Wide-70B.yaml",
        "model: org/Wide-70B\nsubsystems:\n  eval:\n    tensor_parallel_size: 8\n    timeout_multiplier: 1.0\n",
    );
    std::fs::copy(workspace_root().join("model_config/_patterns.yaml"), registry.join("_patterns.yaml")).unwrap();
    let out = submitter(&["registry", "check", "--registry", registry.to_str().unwrap()]);
    let text = stdout(&out);
    assert!(out.status.success(), "warnings only: {text}");
    let fit = text
        .lines()
        .find(|l| l.contains("405B") && l.contains("on cluster leonardo") && l.contains("may not fit"))
        .unwrap_or_else(|| panic!("no fit warning for 405B on leonardo: {text}"));
    assert!(fit.starts_with("warning:") && fit.contains("8 GPU(s) × 64 GiB × 0.85"), "{fit}");
    assert!(
        text.lines()
            .any(|l| l.contains("Wide-70B") && l.contains("on cluster leonardo") && l.contains("crosses 2 nodes")),
        "{text}"
    );
    // The 70B fits its 8 GPUs: no fit warning for it.
    assert!(
        !text.lines().any(|l| l.contains("Wide-70B") && l.contains("may not fit") && l.contains("leonardo")),
        "{text}"
    );
}
