//! Issue 24, item 5: a simulated day of the team's work, per-leg vs shared allocation. A pure
//! model (no Slurm): 200 models × ID (swebench-100, dev_set_v2, tb2) on Leonardo's share of
//! nodes, FIFO over the nodes; prints total GPU-hours (every job's elapsed × the 4 GPUs it holds:
//! Leonardo charges reserved resources), cold loads, sbatch jobs and the time to the last result.
//! Every input and where it comes from is in docs/allocation.md; the figures printed there are
//! this program's output.
//!
//! Issue 37, item 6(b): the same day for 200 fine-tunes of one size, per-model shared jobs vs
//! pools (one engine start, each model's weights swapped in): sbatch jobs, cold starts,
//! GPU-hours and the time to the last result, queue waits included ([`pools`]).
//!
//! `cargo bench -p submitter --bench allocation_day`

#![allow(clippy::print_stdout)]

/// Leonardo (clusters/leonardo.yaml): 4 × A100-64GB per node; the team runs at most
/// `limits.max_jobs_in_flight: 20` jobs at once, one node each for models up to 70B.
const NODES: usize = 20;
const GPUS_PER_NODE: f64 = 4.0;

/// The day's models by size (billions of parameters) and count: an assumption (the team's
/// catalogue is mostly 7–8B and 32B fine-tunes).
const MIX: [(f64, usize); 4] = [(8.0, 80), (14.0, 40), (32.0, 60), (70.0, 20)];

/// Cold start: BF16 weights (2 GB per billion parameters) at plain safetensors' ≈ 1.1 GB/s
/// (Qwen3-30B-A3B: 57.4 s on 1×H200), plus ≈ 200 s of compile, CUDA graphs and KV profiling
/// (Llama-70B TP8: 60 + 15 + 70 + 60 s besides weights). Published figures, docs/allocation.md.
const WEIGHTS_GB_PER_S: f64 = 1.1;
const ENGINE_INIT_S: f64 = 200.0;
/// Batch-script prelude and payload's preparation; teardown. Assumptions (payload measures both).
const PREPARE_S: f64 = 30.0;
const TEARDOWN_S: f64 = 15.0;
/// A Terminus-2 trial: accepted TB entries average 548–1,043 s; 800 s assumed for every benchmark.
const TRIAL_S: f64 = 800.0;

/// The ID legs: (name, tasks, n_concurrent from presets/*.yaml). dev_set_v2's 300 tasks: assumed.
const LEGS: [(&str, f64, f64); 3] = [("swebench-100", 100.0, 32.0), ("dev_set_v2", 300.0, 128.0), ("tb2", 89.0, 64.0)];

fn load_s(size_b: f64) -> f64 {
    2.0 * size_b / WEIGHTS_GB_PER_S + ENGINE_INIT_S
}

/// A leg's Harbor run: waves of `n_concurrent` trials.
fn leg_s(tasks: f64, n_concurrent: f64) -> f64 {
    (tasks / n_concurrent).ceil() * TRIAL_S
}

#[derive(Clone, Copy)]
enum Mode {
    PerLeg,
    /// One job, legs one after another (NeMo Evaluator's way).
    SharedSequential,
    /// One job, legs side by side on one engine; `slowdown` stretches every leg (a busier engine).
    Shared {
        slowdown: f64,
    },
}

/// Each job's duration, in submission order (model by model).
fn jobs(mode: Mode, sizes: &[f64]) -> Vec<f64> {
    let legs: Vec<f64> = LEGS.iter().map(|(_, t, c)| leg_s(*t, *c)).collect();
    let mut out = Vec::new();
    for &size in sizes {
        let fixed = PREPARE_S + load_s(size) + TEARDOWN_S;
        match mode {
            Mode::PerLeg => out.extend(legs.iter().map(|l| fixed + l)),
            Mode::SharedSequential => out.push(fixed + legs.iter().sum::<f64>()),
            Mode::Shared { slowdown } => out.push(fixed + slowdown * legs.iter().cloned().fold(0.0, f64::max)),
        }
    }
    out
}

/// FIFO over `nodes`: each job starts on the node free first; returns the last end.
fn makespan(jobs: &[f64], nodes: usize) -> f64 {
    let mut free = vec![0.0f64; nodes];
    let mut last: f64 = 0.0;
    for &d in jobs {
        let (i, start) = free.iter().copied().enumerate().min_by(|a, b| a.1.total_cmp(&b.1)).expect("nodes");
        free[i] = start + d;
        last = last.max(free[i]);
    }
    last
}

struct Row {
    label: String,
    jobs: usize,
    loads: usize,
    gpu_h: f64,
    last_h: f64,
}

fn run(label: &str, mode: Mode, sizes: &[f64]) -> Row {
    let j = jobs(mode, sizes);
    Row {
        label: label.into(),
        jobs: j.len(),
        loads: j.len(),
        gpu_h: j.iter().sum::<f64>() * GPUS_PER_NODE / 3600.0,
        last_h: makespan(&j, NODES) / 3600.0,
    }
}

fn table(title: &str, sizes: &[f64]) -> Vec<Row> {
    let rows = vec![
        run("per-leg (today)", Mode::PerLeg, sizes),
        run("shared, legs one after another", Mode::SharedSequential, sizes),
        run("shared, legs side by side", Mode::Shared { slowdown: 1.0 }, sizes),
        run("shared, side by side, legs 25 % slower", Mode::Shared { slowdown: 1.25 }, sizes),
        run("shared, side by side, legs 50 % slower", Mode::Shared { slowdown: 1.5 }, sizes),
    ];
    let base = rows[0].gpu_h;
    println!("\n{title}: {} models × ID on {NODES} nodes\n", sizes.len());
    println!("| mode | sbatch jobs | cold loads | GPU-hours | vs per-leg | time to last result (h) |");
    println!("|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.0} | {:+.1} % | {:.1} |",
            r.label,
            r.jobs,
            r.loads,
            r.gpu_h,
            100.0 * (r.gpu_h / base - 1.0),
            r.last_h
        );
    }
    rows
}

/// A queue wait before each job starts (not charged: no node is held). An assumption, not a
/// published figure: the team's Leonardo jobs wait from minutes to hours; 30 min is used and the
/// saving on the last result scales with it (one wait per wave of jobs).
const QUEUE_WAIT_S: f64 = 1800.0;
/// The team's anchor for a cold 32B on its clusters (issue 37: 33–50 min, the replaced system's
/// figure), its lower end: the slow-storage case beside the published fast-storage formula.
const TEAM_COLD_32B_S: f64 = 33.0 * 60.0;
/// Swap: weight bytes ÷ host-to-GPU bandwidth (issue 37: an 8B in 1–3 s, so ≈ 8 GB/s), plus the
/// canaries that prove it (a few greedy completions; assumed 30 s).
const SWAP_GB_PER_S: f64 = 8.0;
const SWAP_VERIFY_S: f64 = 30.0;
/// Leonardo's booster partition MaxTime, the walltime a pool is packed to by the planner.
const PARTITION_MAX_S: f64 = 24.0 * 3600.0;

fn swap_s(size_b: f64) -> f64 {
    2.0 * size_b / SWAP_GB_PER_S + SWAP_VERIFY_S
}

/// FIFO over `nodes` where each job first waits `queue_s` in the queue (its slot held, no node
/// charged): returns the last end.
fn makespan_queued(jobs: &[f64], nodes: usize, queue_s: f64) -> f64 {
    let with_wait: Vec<f64> = jobs.iter().map(|d| d + queue_s).collect();
    makespan(&with_wait, nodes)
}

/// Pools of `per_pool` models of `size_b` (the last one smaller): each one start, then per model
/// its legs side by side and one swap before every model but the first; `cold_fraction` of the
/// swaps fail their proof and restart the engine cold instead (load instead of swap).
fn pool_jobs(models: usize, per_pool: usize, size_b: f64, load: f64, cold_fraction: f64) -> Vec<f64> {
    let longest = LEGS.iter().map(|(_, t, c)| leg_s(*t, *c)).fold(0.0, f64::max);
    let swap = (1.0 - cold_fraction) * swap_s(size_b) + cold_fraction * load;
    let mut out = Vec::new();
    let mut left = models;
    while left > 0 {
        let n = left.min(per_pool);
        out.push(PREPARE_S + load + n as f64 * longest + (n - 1) as f64 * swap + TEARDOWN_S);
        left -= n;
    }
    out
}

/// Models per pool that fit the partition's limit (the planner's rule: packed to the walltime).
fn packed_per_pool(size_b: f64, load: f64) -> usize {
    let longest = LEGS.iter().map(|(_, t, c)| leg_s(*t, *c)).fold(0.0, f64::max);
    ((PARTITION_MAX_S - PREPARE_S - load - TEARDOWN_S + swap_s(size_b)) / (longest + swap_s(size_b))).floor() as usize
}

/// 200 fine-tunes of `size_b` × ID with cold load `load`: per-model shared jobs (side by side)
/// vs pools packed to the walltime vs pools spread over the nodes. Returns (GPU-hours saved by
/// the spread pools, hours sooner, the queue waits saved on the last result, in hours).
fn pools(size_b: f64, load: f64, load_basis: &str) -> (f64, f64, f64) {
    const MODELS: usize = 200;
    let longest = LEGS.iter().map(|(_, t, c)| leg_s(*t, *c)).fold(0.0, f64::max);
    let shared: Vec<f64> = vec![PREPARE_S + load + longest + TEARDOWN_S; MODELS];
    let packed = packed_per_pool(size_b, load);
    let spread = MODELS.div_ceil(NODES);
    let rows: Vec<(String, Vec<f64>, usize)> = vec![
        ("per-model shared jobs (legs side by side)".into(), shared, MODELS),
        (
            format!("pools packed to 24 h ({packed} models each; the planner's rule)"),
            pool_jobs(MODELS, packed, size_b, load, 0.0),
            0,
        ),
        (
            format!("pools spread over the {NODES} nodes ({spread} models each)"),
            pool_jobs(MODELS, spread, size_b, load, 0.0),
            0,
        ),
        (
            "pools spread, 10 % of swaps fail and restart cold".to_string(),
            pool_jobs(MODELS, spread, size_b, load, 0.1),
            (MODELS - NODES) / 10,
        ),
    ];
    println!(
        "\n{MODELS} fine-tunes of {size_b}B × ID on {NODES} nodes: cold load {load:.0} s ({load_basis}), swap {:.0} s, queue wait {QUEUE_WAIT_S:.0} s per job\n",
        swap_s(size_b)
    );
    println!("| mode | sbatch jobs | cold starts | GPU-hours | vs shared | time to last result (h) |");
    println!("|---|---|---|---|---|---|");
    let mut figures = Vec::new();
    for (label, jobs, extra_cold) in &rows {
        let gpu_h = jobs.iter().sum::<f64>() * GPUS_PER_NODE / 3600.0;
        let last_h = makespan_queued(jobs, NODES, QUEUE_WAIT_S) / 3600.0;
        let cold = if *extra_cold == MODELS { MODELS } else { jobs.len() + extra_cold };
        figures.push((gpu_h, last_h, jobs.len()));
        let base = figures[0].0;
        println!(
            "| {label} | {} | {cold} | {gpu_h:.0} | {:+.1} % | {last_h:.1} |",
            jobs.len(),
            100.0 * (gpu_h / base - 1.0)
        );
    }
    let (shared, spread) = (figures[0], figures[2]);
    let waves = |jobs: usize| jobs.div_ceil(NODES) as f64;
    let waits_saved_h = (waves(shared.2) - waves(spread.2)) * QUEUE_WAIT_S / 3600.0;
    (100.0 * (1.0 - spread.0 / shared.0), shared.1 - spread.1, waits_saved_h)
}

fn main() {
    println!(
        "inputs: cold load = 2 GB/B ÷ {WEIGHTS_GB_PER_S} GB/s + {ENGINE_INIT_S} s; prepare {PREPARE_S} s, teardown {TEARDOWN_S} s; trial {TRIAL_S} s"
    );
    for (size, _) in MIX {
        println!("  {size:>4}B: cold load {:.0} s", load_s(size));
    }
    for (name, tasks, c) in LEGS {
        println!("  {name}: {tasks} tasks at n_concurrent {c}: {:.0} s", leg_s(tasks, c));
    }
    let day: Vec<f64> = MIX.iter().flat_map(|(s, n)| std::iter::repeat_n(*s, *n)).collect();
    table("the day (mixed sizes)", &day);
    let only_32b = vec![32.0; 200];
    let rows = table("32B models only (the target)", &only_32b);
    let saving = 1.0 - rows[2].gpu_h / rows[0].gpu_h;
    let seq_saving = 1.0 - rows[1].gpu_h / rows[0].gpu_h;
    // Break-even slowdown for 40 %: fixed + s × longest ≤ 0.6 × per-leg.
    let legs: Vec<f64> = LEGS.iter().map(|(_, t, c)| leg_s(*t, *c)).collect();
    let fixed = PREPARE_S + load_s(32.0) + TEARDOWN_S;
    let per_leg = 3.0 * fixed + legs.iter().sum::<f64>();
    let longest = legs.iter().cloned().fold(0.0, f64::max);
    let break_even = (0.6 * per_leg - fixed) / longest;
    println!(
        "\n32B target (≥ 40 % fewer GPU-hours, one cold load per model): side by side {:.1} % fewer; one after another {:.1} % fewer; \
         40 % holds while sharing slows legs by at most {:.2}×",
        100.0 * saving,
        100.0 * seq_saving,
        break_even
    );
    println!(
        "\nIssue 37 (b): pools vs per-model shared jobs, swap = 2 GB/B ÷ {SWAP_GB_PER_S} GB/s + {SWAP_VERIFY_S} s of canaries"
    );
    let mut fast = (0.0, 0.0, 0.0);
    for (size, _) in MIX {
        let figures = pools(size, load_s(size), "published: the formula above");
        if size == 8.0 {
            fast = figures;
        }
    }
    let (fast_saving, fast_sooner, fast_waits) = fast;
    let (saving, sooner, waits) = pools(8.0, TEAM_COLD_32B_S, "the team's 32B anchor, as a slow-storage bound");
    // What 60 % needs: per model, pools spend a leg and a swap; shared jobs a leg and the fixed
    // cost. 1 − (leg + swap) ÷ (leg + fixed) ≥ 0.6 ⇔ fixed ≥ 1.5 × leg + 2.5 × swap.
    let longest = LEGS.iter().map(|(_, t, c)| leg_s(*t, *c)).fold(0.0, f64::max);
    let needed = 1.5 * longest + 2.5 * swap_s(8.0);
    println!(
        "\n8B target (≥ 60 % fewer GPU-hours than per-model shared jobs; last result sooner by at least the queue waits saved):\n  \
         published load: {fast_saving:.1} % fewer, {fast_sooner:.1} h sooner (queue waits saved {fast_waits:.1} h)\n  \
         team's slow load: {saving:.1} % fewer, {sooner:.1} h sooner (queue waits saved {waits:.1} h)\n  \
         60 % needs a per-model fixed cost (prepare + load + teardown) ≥ 1.5 × the longest leg + 2.5 × swap = {needed:.0} s with ID's {longest:.0} s leg"
    );
}
