//! Where an engine's GPUs are: how many nodes, how many GPUs on each, and which parallelism crosses
//! the node boundary (docs/multinode.md). The one place that decides whether TP × PP × DP fits a
//! cluster: `submitter spec`/`launch`, `registry resolve` and `registry check` all call [`plan`],
//! and payload derives the same layout from the spec with [`of`].
//!
//! Pure: numbers in, a layout or a reason out.

use serde::{Deserialize, Serialize};

/// The engine's parallel sizes (each ≥ 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Parallelism {
    pub tensor: u32,
    pub pipeline: u32,
    pub data: u32,
}

impl Parallelism {
    /// TP × PP: the GPUs of one replica.
    pub fn replica(&self) -> u32 {
        self.tensor.saturating_mul(self.pipeline)
    }

    /// TP × PP × DP: every GPU the engine uses.
    pub fn total(&self) -> u32 {
        self.replica().saturating_mul(self.data)
    }
}

/// Which parallelism spans nodes; vLLM is started differently for each (docs/multinode.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Crossing {
    /// One node: nothing crosses.
    None,
    /// Each node holds whole replicas; vLLM's data-parallel ranks span nodes.
    Data,
    /// One replica whose pipeline stages are split across nodes (TP stays inside a node).
    Pipeline,
    /// One replica whose tensor-parallel group spans nodes (slow on most interconnects).
    Tensor,
}

impl Crossing {
    pub fn as_str(&self) -> &'static str {
        match self {
            Crossing::None => "none",
            Crossing::Data => "data",
            Crossing::Pipeline => "pipeline",
            Crossing::Tensor => "tensor",
        }
    }
}

/// The planned layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Layout {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub crossing: Crossing,
}

impl Layout {
    pub fn is_multi_node(&self) -> bool {
        self.nodes > 1
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "TP {tp} × PP {pp} × DP {dp} = {gpus} GPUs does not fit: a node has {per_node} and at most {max_nodes} node(s) may be used ({fix})"
    )]
    TooManyGpus { tp: u32, pp: u32, dp: u32, gpus: u32, per_node: u32, max_nodes: u32, fix: &'static str },
    #[error("{gpus} GPUs cannot be split evenly over {nodes} nodes: make TP × PP × DP a multiple of `nodes`")]
    Uneven { gpus: u32, nodes: u32 },
    #[error(
        "DP {dp} over {nodes} nodes: each node must hold whole replicas (TP {tp} × PP {pp}), so data_parallel_size must be a multiple of `nodes`, or set data_parallel_size 1 to split one replica"
    )]
    SplitReplicas { tp: u32, pp: u32, dp: u32, nodes: u32 },
    #[error("nodes must be ≥ 1")]
    ZeroNodes,
}

const FIX_SINGLE: &str = "set tensor_parallel_size/data_parallel_size for it in the registry, or allow more nodes with `slurm.max_nodes` in the cluster profile";
const FIX_MULTI: &str =
    "set tensor_parallel_size/pipeline_parallel_size/data_parallel_size or `nodes` for it in the registry";

/// Plans the layout on nodes of `gpus_per_node` GPUs, at most `max_nodes` of them. `nodes` is the
/// registry's explicit node count, else the fewest nodes that hold every GPU.
pub fn plan(
    parallelism: Parallelism,
    gpus_per_node: u32,
    max_nodes: u32,
    nodes: Option<u32>,
) -> Result<Layout, LayoutError> {
    let per_node = gpus_per_node.max(1);
    let max_nodes = max_nodes.max(1);
    let total = parallelism.total();
    let nodes = nodes.unwrap_or_else(|| total.div_ceil(per_node).max(1));
    let too_many = || LayoutError::TooManyGpus {
        tp: parallelism.tensor,
        pp: parallelism.pipeline,
        dp: parallelism.data,
        gpus: total,
        per_node,
        max_nodes,
        fix: if max_nodes == 1 { FIX_SINGLE } else { FIX_MULTI },
    };
    if nodes > max_nodes {
        return Err(too_many());
    }
    let layout = of(parallelism, nodes)?;
    if layout.gpus_per_node > per_node {
        return Err(too_many());
    }
    Ok(layout)
}

/// The layout of `parallelism` on exactly `nodes` nodes (what payload derives from a spec).
pub fn of(parallelism: Parallelism, nodes: u32) -> Result<Layout, LayoutError> {
    let total = parallelism.total();
    if nodes == 0 {
        return Err(LayoutError::ZeroNodes);
    }
    if nodes == 1 {
        return Ok(Layout { nodes, gpus_per_node: total, crossing: Crossing::None });
    }
    if !total.is_multiple_of(nodes) {
        return Err(LayoutError::Uneven { gpus: total, nodes });
    }
    let gpus_per_node = total / nodes;
    let Parallelism { tensor: tp, pipeline: pp, data: dp } = parallelism;
    let crossing = if dp > 1 {
        // vLLM's multi-node DP puts whole replicas on each node (`--data-parallel-size-local`).
        if dp % nodes != 0 {
            return Err(LayoutError::SplitReplicas { tp, pp, dp, nodes });
        }
        Crossing::Data
    } else if pp > 1 && pp % nodes == 0 {
        // Stages split by node keep TP's all-reduces on the node's own links.
        Crossing::Pipeline
    } else {
        Crossing::Tensor
    };
    Ok(Layout { nodes, gpus_per_node, crossing })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn par(tensor: u32, pipeline: u32, data: u32) -> Parallelism {
        Parallelism { tensor, pipeline, data }
    }

    #[test]
    fn one_node_when_it_fits() {
        let layout = plan(par(2, 1, 2), 4, 4, None).unwrap();
        assert_eq!(layout, Layout { nodes: 1, gpus_per_node: 4, crossing: Crossing::None });
        // A smaller engine asks only for what it uses.
        assert_eq!(plan(par(1, 1, 1), 4, 1, None).unwrap().gpus_per_node, 1);
    }

    #[test]
    fn refused_without_max_nodes() {
        let err = plan(par(4, 1, 2), 4, 1, None).unwrap_err();
        assert!(matches!(err, LayoutError::TooManyGpus { gpus: 8, per_node: 4, max_nodes: 1, .. }), "{err}");
        assert!(err.to_string().contains("slurm.max_nodes"), "{err}");
    }

    #[test]
    fn data_crosses_when_replicas_fit_a_node() {
        let layout = plan(par(4, 1, 2), 4, 4, None).unwrap();
        assert_eq!(layout, Layout { nodes: 2, gpus_per_node: 4, crossing: Crossing::Data });
        // DP 3 over 2 nodes would split a replica: refused with the fix.
        let err = plan(par(2, 1, 3), 4, 4, Some(2)).unwrap_err();
        assert!(matches!(err, LayoutError::Uneven { .. } | LayoutError::SplitReplicas { .. }), "{err}");
        let err = of(par(1, 1, 2), 4).unwrap_err();
        assert!(matches!(err, LayoutError::Uneven { .. }), "{err}");
        let err = of(par(2, 1, 2), 4).unwrap_err();
        assert!(matches!(err, LayoutError::SplitReplicas { .. }), "{err}");
    }

    #[test]
    fn pipeline_crosses_when_stages_split_by_node() {
        // 235B-A22B on Leonardo: TP 4 inside each 4-GPU node, 4 stages over 4 nodes.
        let layout = plan(par(4, 4, 1), 4, 4, None).unwrap();
        assert_eq!(layout, Layout { nodes: 4, gpus_per_node: 4, crossing: Crossing::Pipeline });
        // 70B on Vista (1 GPU per node): PP 2.
        assert_eq!(plan(par(1, 2, 1), 1, 4, None).unwrap().crossing, Crossing::Pipeline);
    }

    #[test]
    fn tensor_crosses_otherwise() {
        assert_eq!(
            plan(par(2, 1, 1), 1, 2, None).unwrap(),
            Layout { nodes: 2, gpus_per_node: 1, crossing: Crossing::Tensor }
        );
        // Explicit nodes spread a replica that would fit one node.
        assert_eq!(
            plan(par(4, 1, 1), 4, 2, Some(2)).unwrap(),
            Layout { nodes: 2, gpus_per_node: 2, crossing: Crossing::Tensor }
        );
    }

    #[test]
    fn explicit_nodes_beyond_the_cluster_or_node_are_refused() {
        assert!(matches!(plan(par(4, 1, 1), 4, 2, Some(3)).unwrap_err(), LayoutError::TooManyGpus { .. }));
        assert!(matches!(plan(par(4, 4, 1), 4, 8, Some(2)).unwrap_err(), LayoutError::TooManyGpus { .. }));
        assert_eq!(of(par(1, 1, 1), 0).unwrap_err(), LayoutError::ZeroNodes);
    }
}
