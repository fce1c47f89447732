//! A multi-node engine (docs/multinode.md): the head rank runs on the batch node as the engine
//! child; the other nodes' ranks run as one `srun` step, one task per node, each task being
//! `payload rank`, which looks up its own argv in the ranks file the head wrote and execs vLLM.
//!
//! Deciding is pure here: the node list and addresses (parsed from `scontrol`), the rendezvous
//! port, every rank's vLLM argv, the srun argv. The effects are a few `scontrol` calls
//! ([`discover`]), writing the ranks file, and `payload rank` ([`exec_rank`]).
//!
//! vLLM 0.33.0 across nodes without Ray:
//! - TP/PP crossing: `--distributed-executor-backend mp --nnodes N --node-rank R --master-addr A
//!   --master-port P` on every node, `--headless` on ranks > 0;
//! - DP crossing: `--data-parallel-size D --data-parallel-size-local L --data-parallel-address A
//!   --data-parallel-rpc-port P` on every node, `--headless --data-parallel-start-rank R×L` on the
//!   others;
//! - `--distributed-timeout-seconds T` everywhere when the spec sets it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use launch_spec::layout::{Crossing, Layout};
use launch_spec::spec::PortPolicy;
use launch_spec::{LaunchSpec, OutcomeClass};
use serde::{Deserialize, Serialize};

use crate::failure::Failure;

/// The ranks file in the run dir: written by the head before srun, read by every `payload rank`.
pub(crate) const RANKS_FILE: &str = "ranks.json";
/// Where each `payload rank` records itself (`rank-<R>.json`), on its own node.
pub(crate) const RANK_RECORDS_DIR: &str = "ranks";
/// The srun step's own output (srun's messages); each rank writes `vllm-<node>.log` itself.
pub(crate) const SRUN_LOG: &str = "srun-ranks.log";
/// The step name, so an operator sees it in `squeue -s`.
pub(crate) const STEP_NAME: &str = "vllm-ranks";
/// Placeholders `payload plan` shows where the job's node list is unknown (on a login node).
pub(crate) const PLAN_NODE: &str = "<node {}>";
pub const PLAN_ADDR: &str = "<address of node 0>";

/// One node of the job, as Slurm names and reaches it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    /// Slurm's `NodeAddr`: the address Slurm itself reaches the node at.
    pub addr: String,
}

/// Where the secondaries find the head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rendezvous {
    pub addr: String,
    pub port: u16,
}

/// One rank: its node and the full argv (program first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rank {
    pub rank: u32,
    pub node: String,
    pub argv: Vec<String>,
}

/// The ranks file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RanksFile {
    pub job_id: String,
    pub crossing: Crossing,
    pub rendezvous: Rendezvous,
    /// Every rank, the head (0) first.
    pub ranks: Vec<Rank>,
}

/// What one `payload rank` records about itself on its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RankRecord {
    pub rank: u32,
    /// `SLURMD_NODENAME`: the node it really runs on.
    pub node: String,
    pub pid: u32,
    /// `<job>.<step>`, for `scancel` of the step.
    pub step: String,
    pub argv: Vec<String>,
    pub started: String,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MultiNodeError {
    #[error(
        "serve.nodes is {want} but the job has {got} node(s) ({list}): submit with --nodes {want} --ntasks-per-node 1 (submitter does)"
    )]
    NodeCount { want: u32, got: usize, list: String },
    #[error("this node `{node}` is not in the job's node list ({list})")]
    NotInJob { node: String, list: String },
    #[error("cannot read the job's nodes: {0}")]
    Slurm(String),
    #[error("no free rendezvous port in [{base}, {end}) on this node (serve.port): widen the range")]
    NoPort { base: u16, end: u32 },
}

impl From<MultiNodeError> for Failure {
    fn from(err: MultiNodeError) -> Self {
        let class = match err {
            MultiNodeError::NodeCount { .. } => OutcomeClass::Spec,
            _ => OutcomeClass::EngineStart,
        };
        Failure::new(class, err.to_string()).with_cause("multinode")
    }
}

/// The flags one rank adds to the single-node argv.
pub(crate) fn rank_flags(spec: &LaunchSpec, layout: &Layout, rank: u32, rendezvous: &Rendezvous) -> Vec<String> {
    let mut flags: Vec<String> = Vec::new();
    let mut push = |items: &[&str]| flags.extend(items.iter().map(|s| (*s).to_string()));
    let port = rendezvous.port.to_string();
    match layout.crossing {
        Crossing::None => return Vec::new(),
        Crossing::Data => {
            let local = spec.serve.data_parallel_size / layout.nodes.max(1);
            push(&["--data-parallel-size-local", &local.to_string()]);
            push(&["--data-parallel-address", &rendezvous.addr, "--data-parallel-rpc-port", &port]);
            if rank > 0 {
                push(&["--headless", "--data-parallel-start-rank", &(rank * local).to_string()]);
            }
        }
        Crossing::Tensor | Crossing::Pipeline => {
            push(&["--distributed-executor-backend", "mp"]);
            push(&["--nnodes", &layout.nodes.to_string(), "--node-rank", &rank.to_string()]);
            push(&["--master-addr", &rendezvous.addr, "--master-port", &port]);
            if rank > 0 {
                push(&["--headless"]);
            }
        }
    }
    if let Some(timeout) = spec.serve.distributed_timeout_s {
        push(&["--distributed-timeout-seconds", &timeout.to_string()]);
    }
    flags
}

/// Every rank's argv: the single-node argv (`base`, program first) plus that rank's flags.
/// `nodes[0]` is the head (the batch node).
pub fn ranks(
    spec: &LaunchSpec,
    layout: &Layout,
    base: &[String],
    nodes: &[Node],
    rendezvous: &Rendezvous,
) -> Vec<Rank> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let rank = i as u32;
            let mut argv = base.to_vec();
            argv.extend(rank_flags(spec, layout, rank, rendezvous));
            Rank { rank, node: node.name.clone(), argv }
        })
        .collect()
}

/// The srun step for the secondaries (`ranks[1..]`): one task per node, on exactly those nodes,
/// the environment srun itself has (payload gives it the engine's), each task `payload rank`.
/// `--kill-on-bad-exit`: one rank failing ends the step, which the watchdog sees as the engine's death.
pub(crate) fn srun_argv(srun: &str, payload_bin: &Path, ranks_file: &Path, secondaries: &[Rank]) -> Vec<String> {
    let nodes: Vec<&str> = secondaries.iter().map(|r| r.node.as_str()).collect();
    let n = secondaries.len().to_string();
    vec![
        srun.to_string(),
        format!("--job-name={STEP_NAME}"),
        format!("--nodes={n}"),
        format!("--ntasks={n}"),
        "--ntasks-per-node=1".to_string(),
        format!("--nodelist={}", nodes.join(",")),
        "--kill-on-bad-exit=1".to_string(),
        "--export=ALL".to_string(),
        payload_bin.display().to_string(),
        "rank".to_string(),
        "--ranks".to_string(),
        ranks_file.display().to_string(),
    ]
}

/// Node names from `scontrol show hostnames`, in the job's order.
pub(crate) fn parse_hostnames(text: &str) -> Vec<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
}

/// `NodeAddr` from one `scontrol show node -o NAME` line.
pub(crate) fn parse_node_addr(text: &str) -> Option<String> {
    text.split_whitespace().find_map(|field| field.strip_prefix("NodeAddr=")).map(str::to_string)
}

/// The job's nodes with the batch node first (it runs the head), the others in Slurm's order.
pub(crate) fn order_nodes(names: Vec<String>, batch_node: &str, want: u32) -> Result<Vec<String>, MultiNodeError> {
    let list = names.join(",");
    if names.len() != want as usize {
        return Err(MultiNodeError::NodeCount { want, got: names.len(), list });
    }
    let Some(i) = names.iter().position(|n| n == batch_node) else {
        return Err(MultiNodeError::NotInJob { node: batch_node.to_string(), list });
    };
    let mut names = names;
    let head = names.remove(i);
    names.insert(0, head);
    Ok(names)
}

/// Rendezvous port candidates: the serve port policy's range, starting half a span away from the
/// serve port's start, so that co-located jobs (different job ids) start apart on both ports.
pub(crate) fn rendezvous_candidates(policy: &PortPolicy, job_id: &str, serve_port: u16) -> Vec<u16> {
    let moved = PortPolicy { fixed: None, ..policy.clone() };
    let mut list = crate::ports::candidates(&moved, job_id);
    let half = list.len() / 2;
    list.rotate_left(half);
    list.retain(|p| *p != serve_port && *p != 0);
    list
}

/// The rendezvous port: the first free candidate on this node (the head binds it).
pub(crate) fn choose_rendezvous_port(
    policy: &PortPolicy,
    job_id: &str,
    serve_port: u16,
    free: impl Fn(u16) -> bool,
) -> Result<u16, MultiNodeError> {
    rendezvous_candidates(policy, job_id, serve_port)
        .into_iter()
        .find(|p| free(*p))
        .ok_or(MultiNodeError::NoPort { base: policy.base, end: u32::from(policy.base) + u32::from(policy.span) })
}

/// The job's nodes, the batch node first, with their addresses: `scontrol show hostnames` on
/// `SLURM_JOB_NODELIST`, then `scontrol show node -o` per node.
pub fn discover(env: &dyn Fn(&str) -> Option<String>, want: u32) -> Result<Vec<Node>, MultiNodeError> {
    let list = env("SLURM_JOB_NODELIST")
        .or_else(|| env("SLURM_NODELIST"))
        .ok_or_else(|| MultiNodeError::Slurm("SLURM_JOB_NODELIST is not set: not inside a Slurm job".to_string()))?;
    let batch = env("SLURMD_NODENAME")
        .ok_or_else(|| MultiNodeError::Slurm("SLURMD_NODENAME is not set: not inside a Slurm job".to_string()))?;
    let names = parse_hostnames(&scontrol(&["show", "hostnames", &list])?);
    let names = order_nodes(names, &batch, want)?;
    names
        .into_iter()
        .map(|name| {
            let text = scontrol(&["show", "node", "-o", &name])?;
            let addr = parse_node_addr(&text)
                .ok_or_else(|| MultiNodeError::Slurm(format!("no NodeAddr for {name} in `scontrol show node`")))?;
            Ok(Node { name, addr })
        })
        .collect()
}

/// How long one `scontrol` call may take (a busy slurmctld answers in seconds; its own
/// MessageTimeout is 10 s by default), and how much of its output is kept.
const SCONTROL_LIMIT: Duration = Duration::from_secs(60);
const SCONTROL_OUTPUT_CAP: u64 = 1 << 20;

fn scontrol(args: &[&str]) -> Result<String, MultiNodeError> {
    scontrol_with(std::ffi::OsStr::new("scontrol"), args, SCONTROL_LIMIT)
}

/// Runs `program args` within `limit` (its process group killed there) and `SCONTROL_OUTPUT_CAP`.
fn scontrol_with(program: &std::ffi::OsStr, args: &[&str], limit: Duration) -> Result<String, MultiNodeError> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args);
    let out = crate::bounded::run_blocking(cmd, limit, SCONTROL_OUTPUT_CAP)
        .map_err(|e| MultiNodeError::Slurm(format!("cannot run scontrol: {e}")))?;
    let status = out.status.ok_or_else(|| {
        MultiNodeError::Slurm(format!("scontrol {} did not answer within {} s", args.join(" "), limit.as_secs()))
    })?;
    if !status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(MultiNodeError::Slurm(format!("scontrol {}: {}", args.join(" "), err.trim())));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Placeholder nodes for `payload plan` outside a job: names `<node i>`, the head's address unknown.
pub(crate) fn plan_nodes(n: u32) -> Vec<Node> {
    (0..n)
        .map(|i| Node {
            name: PLAN_NODE.replace("{}", &i.to_string()),
            addr: if i == 0 { PLAN_ADDR.to_string() } else { String::new() },
        })
        .collect()
}

/// The log of the rank on `node`: `vllm-<node>.log` in the run dir (the head's is `vllm.log`).
pub(crate) fn rank_log_path(run_dir: &Path, node: &str) -> PathBuf {
    run_dir.join(format!("vllm-{node}.log"))
}

/// The record file of `rank` in `run_dir`.
pub(crate) fn rank_record_path(run_dir: &Path, rank: u32) -> PathBuf {
    run_dir.join(RANK_RECORDS_DIR).join(format!("rank-{rank}.json"))
}

/// The secondaries' records that exist so far.
pub(crate) fn read_rank_records(run_dir: &Path, ranks: &[Rank]) -> Vec<RankRecord> {
    ranks
        .iter()
        .filter_map(|r| std::fs::read_to_string(rank_record_path(run_dir, r.rank)).ok())
        .filter_map(|text| serde_json::from_str(&text).ok())
        .collect()
}

/// Cancels the srun step of the secondaries (by the step id their records give), so nothing is
/// left on any node even when srun itself was SIGKILLed. Quiet when the step is already gone.
pub(crate) fn cancel_steps(records: &[RankRecord]) {
    let mut steps: Vec<&str> = records.iter().map(|r| r.step.as_str()).filter(|s| !s.is_empty()).collect();
    steps.sort_unstable();
    steps.dedup();
    for step in steps {
        let mut cmd = tokio::process::Command::new("scancel");
        cmd.args(["--quiet", "--signal=KILL", step]);
        let _ = crate::bounded::run_blocking(cmd, SCONTROL_LIMIT, SCONTROL_OUTPUT_CAP);
    }
}

/// The last lines of srun's log and of every secondary's `vllm-<node>.log`, each line prefixed
/// with where it comes from (at most `n` in all, the newest kept).
pub(crate) fn ranks_log_tail(run_dir: &Path, secondaries: Option<&Secondaries>, n: usize) -> Vec<String> {
    let Some(s) = secondaries else { return Vec::new() };
    let mut lines: Vec<String> =
        crate::engine::log_tail(&run_dir.join(SRUN_LOG), n).into_iter().map(|l| format!("[srun] {l}")).collect();
    for rank in &s.file.ranks[1..] {
        let log = rank_log_path(run_dir, &rank.node);
        lines.extend(crate::engine::log_tail(&log, n).into_iter().map(|l| format!("[{}] {l}", rank.node)));
    }
    let skip = lines.len().saturating_sub(n);
    lines.split_off(skip)
}

/// Writes the ranks file (atomically: a rank never reads half of it).
pub(crate) fn write_ranks_file(run_dir: &Path, file: &RanksFile) -> std::io::Result<PathBuf> {
    let path = run_dir.join(RANKS_FILE);
    let text = serde_json::to_string_pretty(file).map_err(std::io::Error::other)?;
    launch_spec::records::write_atomically(&path, text.as_bytes())?;
    Ok(path)
}

#[derive(Debug, thiserror::Error)]
pub enum RankError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("SLURM_PROCID is not set: `payload rank` runs only as a task of the ranks' srun step")]
    NoProcId,
    #[error("task {procid} has no rank in {path} (it lists {count} secondaries)")]
    NoRank { procid: u32, path: PathBuf, count: usize },
    #[error("cannot exec {program}: {source}")]
    Exec { program: String, source: std::io::Error },
}

/// Which rank the task `procid` of the srun step is: task i runs rank i + 1.
pub(crate) fn rank_for_task(file: &RanksFile, procid: u32) -> Option<&Rank> {
    let rank = procid.checked_add(1)?;
    file.ranks.iter().find(|r| r.rank == rank)
}

/// `payload rank --ranks FILE`: on a secondary node, records itself and execs its vLLM argv with
/// the environment srun gave it. Returns only on failure.
pub fn exec_rank(ranks_file: &Path, env: &dyn Fn(&str) -> Option<String>) -> RankError {
    use std::os::unix::process::CommandExt;
    let fail = |message: String| RankError::File { path: ranks_file.to_path_buf(), message };
    let text = match std::fs::read_to_string(ranks_file) {
        Ok(text) => text,
        Err(e) => return fail(e.to_string()),
    };
    let file: RanksFile = match serde_json::from_str(&text) {
        Ok(file) => file,
        Err(e) => return fail(format!("not a ranks file: {e}")),
    };
    let Some(procid) = env("SLURM_PROCID").and_then(|p| p.parse::<u32>().ok()) else { return RankError::NoProcId };
    let Some(rank) = rank_for_task(&file, procid) else {
        return RankError::NoRank { procid, path: ranks_file.to_path_buf(), count: file.ranks.len().saturating_sub(1) };
    };
    let run_dir = ranks_file.parent().unwrap_or(Path::new("."));
    let step = match (env("SLURM_JOB_ID"), env("SLURM_STEP_ID")) {
        (Some(job), Some(step)) => format!("{job}.{step}"),
        _ => String::new(),
    };
    let record = RankRecord {
        rank: rank.rank,
        node: env("SLURMD_NODENAME").unwrap_or_default(),
        pid: std::process::id(),
        step,
        argv: rank.argv.clone(),
        started: crate::records::now(),
    };
    let dir = run_dir.join(RANK_RECORDS_DIR);
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        let text = serde_json::to_string_pretty(&record).map_err(std::io::Error::other)?;
        launch_spec::records::write_atomically(&rank_record_path(run_dir, rank.rank), text.as_bytes())
    });
    if let Err(e) = written {
        return fail(format!("cannot write the rank record in {}: {e}", dir.display()));
    }
    // This rank's own log in the run dir, named by the node the head planned it on (srun's `%N`
    // would be the host name, which need not be Slurm's node name).
    let log = rank_log_path(run_dir, &rank.node);
    let opened = launch_spec::fsread::open_append_regular(&log).and_then(|file| {
        nix::unistd::dup2_stdout(&file).map_err(std::io::Error::from)?;
        nix::unistd::dup2_stderr(&file).map_err(std::io::Error::from)
    });
    if let Err(e) = opened {
        return fail(format!("cannot open the rank's log {}: {e}", log.display()));
    }
    let Some((program, args)) = rank.argv.split_first() else { return fail("empty argv".to_string()) };
    // exec, not spawn: the task *is* vLLM, so Slurm's step signals and kills reach it directly.
    let err = Command::new(program).args(args).exec();
    RankError::Exec { program: program.clone(), source: err }
}

/// The job's nodes as observed: from Slurm inside a job, placeholders for a plan outside one.
#[derive(Debug, Clone)]
pub struct Observed {
    pub nodes: Vec<Node>,
    pub(crate) rendezvous_port: u16,
    /// `slurm` or `placeholders (no SLURM_JOB_NODELIST)`.
    pub source: String,
}

/// Asks Slurm for the job's nodes and this node for a free rendezvous port; `None` for a
/// single-node spec. A plan outside a job gets placeholders instead of an error.
pub fn observe(
    spec: &LaunchSpec,
    env: &dyn Fn(&str) -> Option<String>,
    plan: bool,
    serve_port: Option<u16>,
) -> Option<Result<Observed, MultiNodeError>> {
    let layout = spec.layout().ok().filter(Layout::is_multi_node)?;
    let job_id = crate::ports::job_id(env);
    let serve_port = serve_port.unwrap_or(0);
    let in_job = env("SLURM_JOB_NODELIST").or_else(|| env("SLURM_NODELIST")).is_some();
    let observed = (|| {
        let (nodes, source) = if !in_job && plan {
            (plan_nodes(layout.nodes), "placeholders (no SLURM_JOB_NODELIST: not inside a job)".to_string())
        } else {
            (discover(env, layout.nodes)?, "slurm (SLURM_JOB_NODELIST, scontrol)".to_string())
        };
        let rendezvous_port =
            choose_rendezvous_port(&spec.serve.port, &job_id, serve_port, |p| crate::ports::is_free(p, "0.0.0.0"))?;
        Ok(Observed { nodes, rendezvous_port, source })
    })();
    Some(observed)
}

/// The secondaries' launch, prepared: the ranks file's content and the srun child.
#[derive(Debug, Clone)]
pub struct Secondaries {
    pub file: RanksFile,
    pub srun: crate::supervisor::ChildSpec,
    pub source: String,
    pub nodes: Vec<Node>,
}

/// Every rank from the head's single-node argv, and the srun child that starts the others with
/// the engine's environment. `head_argv` gets the head's flags.
pub fn prepare(
    spec: &LaunchSpec,
    head_argv: &mut Vec<String>,
    env: &BTreeMap<String, String>,
    observed: Observed,
    job_id: String,
) -> Result<(Vec<Rank>, Secondaries), Failure> {
    let layout = spec.layout().map_err(|e| Failure::new(OutcomeClass::Spec, format!("field `serve.nodes`: {e}")))?;
    let rendezvous = Rendezvous { addr: observed.nodes[0].addr.clone(), port: observed.rendezvous_port };
    let all = ranks(spec, &layout, head_argv, &observed.nodes, &rendezvous);
    *head_argv = all[0].argv.clone();
    let srun = crate::childenv::resolve_program("srun", None, &env["PATH"]).map_err(|e| {
        Failure::new(OutcomeClass::EngineStart, format!("a multi-node engine needs srun: {e}")).with_cause("multinode")
    })?;
    let payload_bin = std::env::current_exe().map_err(|e| {
        Failure::new(OutcomeClass::EngineStart, format!("cannot find payload's own binary for `payload rank`: {e}"))
            .with_cause("multinode")
    })?;
    let ranks_file = spec.run_dir.join(RANKS_FILE);
    let argv = srun_argv(&srun.display().to_string(), &payload_bin, &ranks_file, &all[1..]);
    let child = crate::supervisor::ChildSpec {
        program: srun,
        argv,
        env: env.clone(),
        log: spec.run_dir.join(SRUN_LOG),
        cwd: None,
    };
    let file = RanksFile { job_id, crossing: layout.crossing, rendezvous, ranks: all.clone() };
    Ok((all, Secondaries { file, srun: child, source: observed.source, nodes: observed.nodes }))
}

/// The per-node view `payload plan` shows: node, address, argv and environment of every rank.
#[derive(Debug, Clone, Serialize)]
pub struct NodePlan {
    pub rank: u32,
    pub node: String,
    pub addr: String,
    /// `head` (the engine child on the batch node) or `srun` (a task of the ranks' step).
    pub(crate) started_by: &'static str,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
}

/// The layout section of `payload plan`.
#[derive(Debug, Clone, Serialize)]
pub struct LayoutPlan {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub crossing: Crossing,
    pub rendezvous: Rendezvous,
    /// How the nodes were found: the job's node list, or placeholders outside a job.
    pub source: String,
    pub per_node: Vec<NodePlan>,
    /// The srun that starts the secondaries.
    pub srun: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use launch_spec::testkit::unit_spec as spec;

    fn nodes(n: usize) -> Vec<Node> {
        (0..n).map(|i| Node { name: format!("n{i}"), addr: format!("10.0.0.{i}") }).collect()
    }

    #[test]
    fn a_hung_scontrol_is_an_error_within_its_limit() {
        let started = std::time::Instant::now();
        let err = scontrol_with(std::ffi::OsStr::new("sleep"), &["60"], Duration::from_millis(300)).unwrap_err();
        assert!(err.to_string().contains("did not answer within"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
        let out = scontrol_with(std::ffi::OsStr::new("printf"), &["n1\nn2\n"], Duration::from_secs(30)).unwrap();
        assert_eq!(parse_hostnames(&out), ["n1", "n2"]);
    }

    fn rdv() -> Rendezvous {
        Rendezvous { addr: "10.0.0.0".into(), port: 29555 }
    }

    #[test]
    fn tensor_or_pipeline_across_nodes_uses_mp_with_node_ranks() {
        let mut s = spec();
        s.serve.tensor_parallel_size = 2;
        s.serve.pipeline_parallel_size = 2;
        s.serve.nodes = 2;
        s.serve.distributed_timeout_s = Some(1800);
        let layout = s.layout().unwrap();
        assert_eq!(layout.crossing, Crossing::Pipeline);
        let base = vec!["vllm".to_string(), "serve".to_string(), "m".to_string()];
        let ranks = ranks(&s, &layout, &base, &nodes(2), &rdv());
        let words = |r: &Rank| r.argv[3..].join(" ");
        assert_eq!(
            words(&ranks[0]),
            "--distributed-executor-backend mp --nnodes 2 --node-rank 0 --master-addr 10.0.0.0 --master-port 29555 --distributed-timeout-seconds 1800"
        );
        assert_eq!(
            words(&ranks[1]),
            "--distributed-executor-backend mp --nnodes 2 --node-rank 1 --master-addr 10.0.0.0 --master-port 29555 --headless --distributed-timeout-seconds 1800"
        );
        assert_eq!(ranks[1].node, "n1");
    }

    #[test]
    fn data_across_nodes_gives_start_ranks_by_node() {
        let mut s = spec();
        s.serve.tensor_parallel_size = 2;
        s.serve.data_parallel_size = 4;
        s.serve.nodes = 2;
        let layout = s.layout().unwrap();
        assert_eq!(layout.crossing, Crossing::Data);
        let ranks = ranks(&s, &layout, &["vllm".to_string()], &nodes(2), &rdv());
        assert_eq!(
            ranks[0].argv[1..].join(" "),
            "--data-parallel-size-local 2 --data-parallel-address 10.0.0.0 --data-parallel-rpc-port 29555"
        );
        assert!(ranks[1].argv.join(" ").ends_with("--headless --data-parallel-start-rank 2"), "{:?}", ranks[1]);
    }

    #[test]
    fn single_node_adds_nothing() {
        let s = spec();
        assert!(rank_flags(&s, &s.layout().unwrap(), 0, &rdv()).is_empty());
    }

    #[test]
    fn srun_starts_one_payload_rank_per_secondary_node() {
        let secondaries =
            vec![Rank { rank: 1, node: "n1".into(), argv: vec![] }, Rank { rank: 2, node: "n2".into(), argv: vec![] }];
        let argv = srun_argv("srun", Path::new("/bin/payload"), Path::new("/run/ranks.json"), &secondaries);
        assert!(argv.contains(&"--nodelist=n1,n2".to_string()) && argv.contains(&"--ntasks=2".to_string()), "{argv:?}");
        assert!(argv.contains(&"--kill-on-bad-exit=1".to_string()), "{argv:?}");
        assert_eq!(argv[argv.len() - 4..], ["/bin/payload", "rank", "--ranks", "/run/ranks.json"]);
    }

    #[test]
    fn nodes_from_scontrol_with_the_batch_node_first() {
        let names = parse_hostnames("evalmn1\nevalmn2\n\n");
        assert_eq!(names, ["evalmn1", "evalmn2"]);
        assert_eq!(order_nodes(names.clone(), "evalmn2", 2).unwrap(), ["evalmn2", "evalmn1"]);
        assert!(matches!(order_nodes(names.clone(), "evalmn2", 3), Err(MultiNodeError::NodeCount { .. })));
        assert!(matches!(order_nodes(names, "other", 2), Err(MultiNodeError::NotInJob { .. })));
        let line =
            "NodeName=evalmn1 Arch=x86_64 CoresPerSocket=2 NodeAddr=10.77.0.11 NodeHostName=evalmn1 Version=22.05.8";
        assert_eq!(parse_node_addr(line).as_deref(), Some("10.77.0.11"));
        assert_eq!(parse_node_addr("NodeName=x"), None);
    }

    #[test]
    fn rendezvous_port_starts_apart_from_the_serve_port_and_skips_it() {
        let policy = PortPolicy { fixed: None, base: 30000, span: 10 };
        let list = rendezvous_candidates(&policy, "3", 30003);
        assert_eq!(list[0], 30008, "half a span from the serve port's start");
        assert!(!list.contains(&30003));
        assert_eq!(choose_rendezvous_port(&policy, "3", 30003, |p| p != 30008).unwrap(), 30009);
        // Co-located jobs: different job ids, different rendezvous starts.
        assert_ne!(rendezvous_candidates(&policy, "4", 30004)[0], list[0]);
        // A fixed serve port does not fix the rendezvous port.
        let fixed = PortPolicy { fixed: Some(8000), base: 30000, span: 10 };
        assert_eq!(rendezvous_candidates(&fixed, "3", 8000)[0], 30008);
        assert!(choose_rendezvous_port(&policy, "3", 30003, |_| false).is_err());
    }

    #[test]
    fn task_i_runs_rank_i_plus_one() {
        let file = RanksFile {
            job_id: "7".into(),
            crossing: Crossing::Tensor,
            rendezvous: rdv(),
            ranks: (0..3).map(|r| Rank { rank: r, node: format!("n{r}"), argv: vec![] }).collect(),
        };
        assert_eq!(rank_for_task(&file, 0).unwrap().node, "n1");
        assert_eq!(rank_for_task(&file, 1).unwrap().node, "n2");
        assert!(rank_for_task(&file, 2).is_none());
    }
}
