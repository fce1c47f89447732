//! Issue 24, item 5: one model × ID (three legs) with real payload processes and the stand-ins,
//! a cold start reproduced by the vLLM stand-in's load time (`STANDIN_LOAD_SECONDS`). Prints, per
//! mode, sbatch jobs, cold loads, GPU-seconds (payload's `gpu_time` × GPUs) and wall time, as
//! medians over the repetitions. Figures, not a timed test (docs/allocation.md has the table).
//!
//! per-leg is measured: three payload runs, one per leg, as the three per-leg jobs run them.
//! shared is modelled from those same measured phases (one prepare, one load, the legs' Harbor
//! runs side by side, one teardown; sharing the engine assumed not to slow a leg), and measured
//! too when `ALLOC_SHARED_PAYLOAD` names a payload that has the shared job (`run --shared`, the
//! host's `gpu_time` in the group dir).
//!
//! `cargo bench -p e2e --bench allocation_standins` (env: `ALLOC_LOAD_S`, default 3; `ALLOC_REPS`,
//! default 3; `ALLOC_SHARED_PAYLOAD`).

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use e2e::harness::payload_bin;
use launch_spec::shared::GpuTime;
use launch_spec::testkit::spec::{chip_profile, default_profile};
use launch_spec::testkit::{TestSpec, world};
use serde_json::Value;

const VLLM: &str = env!("CARGO_BIN_EXE_vllm-standin");
const HARBOR: &str = env!("CARGO_BIN_EXE_harbor-standin");

const GPU_FIXTURE: &str = r#"[
  {"index": 0, "uuid": "GPU-bbbb0000-0000-4000-8000-000000000000", "name": "NVIDIA A100-SXM-64GB", "memory_total_bytes": 68719476736},
  {"index": 1, "uuid": "GPU-bbbb0000-0000-4000-8000-000000000001", "name": "NVIDIA A100-SXM-64GB", "memory_total_bytes": 68719476736}
]"#;

const HARBOR_YAML: &str = "orchestrator:\n  type: local\n  n_concurrent_trials: 2\n  quiet: true\nenvironment:\n  type: daytona\n  delete: true\nverifier:\n  max_timeout_sec: 600\n";

/// The ID legs, scaled down: (name, tasks, seconds per trial), so the legs differ in length as
/// swebench-100, dev_set_v2 and tb2 do.
const LEGS: [(&str, usize, &str); 3] = [("swebench", 6, "1.0"), ("dev_set_v2", 8, "0.5"), ("tb2", 4, "0.8")];

struct Leg {
    wall_s: f64,
    gpu: GpuTime,
    cold_loads: usize,
}

fn leg_spec(root: &Path, tag: &str, tasks: usize, trial_s: &str, load_s: &str) -> Value {
    let data = root.join(format!("data-{tag}"));
    world::standin_tasks(&data, tasks);
    TestSpec::standins(root, tag)
        .tp_dp(1, 2)
        .max_model_len(8192)
        .max_num_seqs(64)
        .dataset(&data)
        .serve_env("STANDIN_LOAD_SECONDS", load_s)
        .serve_env("STANDIN_GPUS", "2")
        .gpu_profiles(vec![chip_profile("a100-64gb", "A100", (60.0, 66.0), 0.85), default_profile(0.8)])
        .harbor_env("STANDIN_TRIAL_SECONDS", trial_s)
        .harbor_env("STANDIN_EXTRAS", "daytona")
        .to_value()
}

fn payload(bin: &Path, root: &Path, args: &[&str]) -> (bool, f64) {
    let t0 = Instant::now();
    let status = Command::new(bin)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
        .env("HOME", root)
        .env("PAYLOAD_GPU_FIXTURE", root.join("gpus.json"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn payload");
    (status.success(), t0.elapsed().as_secs_f64())
}

/// The run's `gpu_time` and its cold loads (`engine_ready` events), from its records.
fn records(dir: &Path, ok: bool) -> (GpuTime, usize) {
    let st: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("status.json")).unwrap()).unwrap();
    assert!(ok, "payload failed in {}: {}", dir.display(), st["outcome"]);
    let gpu: GpuTime = serde_json::from_value(st["gpu_time"].clone()).expect("status.json carries gpu_time");
    let events = std::fs::read_to_string(dir.join("events.jsonl")).unwrap();
    (gpu, events.lines().filter(|l| l.contains("\"engine_ready\"")).count())
}

fn run_leg(root: &Path, name: &str, tasks: usize, trial_s: &str, load_s: &str) -> Leg {
    let tag = format!("{name}-{}", e2e::harness::unique());
    let path = root.join(format!("{tag}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&leg_spec(root, &tag, tasks, trial_s, load_s)).unwrap())
        .unwrap();
    let (ok, wall_s) = payload(payload_bin(), root, &["run", "--spec", path.to_str().unwrap()]);
    let (gpu, cold_loads) = records(&root.join("jobs").join(&tag), ok);
    Leg { wall_s, gpu, cold_loads }
}

/// The three legs as one shared job (`run --shared`, docs/payload.md): the host's record.
fn run_shared(bin: &Path, root: &Path, load_s: &str) -> Leg {
    let id = e2e::harness::unique();
    let group_tag = format!("id-shared-{id}");
    let group_dir = root.join("jobs").join(&group_tag);
    let mut legs = Vec::new();
    for (name, tasks, trial_s) in LEGS {
        let tag = format!("{name}-s{id}");
        let dir = root.join("jobs").join(&tag);
        std::fs::create_dir_all(&dir).unwrap();
        let spec = leg_spec(root, &tag, tasks, trial_s, load_s);
        std::fs::write(dir.join("launch.json"), serde_json::to_string_pretty(&spec).unwrap()).unwrap();
        legs.push(dir.join("launch.json"));
    }
    std::fs::create_dir_all(&group_dir).unwrap();
    let doc = serde_json::json!({ "version": 1, "group_tag": group_tag, "group_dir": group_dir, "legs": legs });
    let file = group_dir.join("shared.json");
    std::fs::write(&file, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    let (ok, wall_s) = payload(bin, root, &["run", "--shared", file.to_str().unwrap()]);
    let (gpu, cold_loads) = records(&group_dir, ok);
    Leg { wall_s, gpu, cold_loads }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn phases(g: &GpuTime) -> f64 {
    g.prepare_s + g.load_s + g.serving_s + g.idle_s + g.teardown_s
}

fn main() {
    let load_s = std::env::var("ALLOC_LOAD_S").unwrap_or_else(|_| "3".into());
    let reps: usize = std::env::var("ALLOC_REPS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    let tmp = tempfile::Builder::new().prefix("alloc-bench-").tempdir().unwrap();
    let root: PathBuf = tmp.path().to_path_buf();
    world::link_programs(&root.join("env"), &[("vllm", Path::new(VLLM)), ("harbor", Path::new(HARBOR))]);
    std::fs::create_dir_all(root.join("jobs")).unwrap();
    std::fs::write(root.join("harbor.yaml"), HARBOR_YAML).unwrap();
    std::fs::write(root.join("gpus.json"), GPU_FIXTURE).unwrap();
    let id = e2e::harness::unique();
    let secrets = format!("DAYTONA_API_KEY=bench-org1-{id}\nDAYTONA_DATA_API_KEY=bench-org2-{id}\n");
    world::write_secrets(&root.join("secrets.env"), &secrets, 0o600);

    let mut per_leg = (Vec::new(), Vec::new(), Vec::new(), Vec::new()); // GPU-s, wall serial, wall parallel, loads
    let mut shared = (Vec::new(), Vec::new());
    let mut measured_load = Vec::new();
    let shared_bin = std::env::var_os("ALLOC_SHARED_PAYLOAD").map(PathBuf::from);
    let mut shared_measured = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..reps {
        let legs: Vec<Leg> = LEGS.iter().map(|(n, t, s)| run_leg(&root, n, *t, s, &load_s)).collect();
        let gpus = f64::from(legs[0].gpu.gpus);
        let gpu_s: f64 = legs.iter().map(|l| phases(&l.gpu) * f64::from(l.gpu.gpus)).sum();
        let serial: f64 = legs.iter().map(|l| l.wall_s).sum();
        let parallel = legs.iter().map(|l| l.wall_s).fold(0.0, f64::max);
        per_leg.0.push(gpu_s);
        per_leg.1.push(serial);
        per_leg.2.push(parallel);
        per_leg.3.push(legs.iter().map(|l| l.cold_loads).sum::<usize>() as f64);
        // The shared job from the same phases: the median leg's prepare, load and teardown once;
        // the legs' Harbor runs side by side (the longest serving); payload's own start-up and exit
        // (wall − phases) once.
        let pick = |f: fn(&GpuTime) -> f64| median(legs.iter().map(|l| f(&l.gpu)).collect());
        let fixed = pick(|g| g.prepare_s) + pick(|g| g.load_s) + pick(|g| g.idle_s) + pick(|g| g.teardown_s);
        let serving = legs.iter().map(|l| l.gpu.serving_s).fold(0.0, f64::max);
        let outside = median(legs.iter().map(|l| (l.wall_s - phases(&l.gpu)).max(0.0)).collect());
        shared.0.push((fixed + serving) * gpus);
        shared.1.push(fixed + serving + outside);
        measured_load.push(pick(|g| g.load_s));
        if let Some(bin) = &shared_bin {
            let s = run_shared(bin, &root, &load_s);
            shared_measured.0.push(phases(&s.gpu) * f64::from(s.gpu.gpus));
            shared_measured.1.push(s.wall_s);
            shared_measured.2.push(s.cold_loads as f64);
        }
        eprintln!("rep {}: per-leg {gpu_s:.1} GPU-s, shared (model) {:.1} GPU-s", rep + 1, (fixed + serving) * gpus);
    }
    let (pl_gpu, pl_serial, pl_par, pl_loads) =
        (median(per_leg.0), median(per_leg.1), median(per_leg.2), median(per_leg.3));
    let (sh_gpu, sh_wall) = (median(shared.0), median(shared.1));
    println!(
        "one model × ID (3 legs), stand-in load {load_s} s (measured load phase median {:.2} s), 2 GPUs, medians of {reps}",
        median(measured_load)
    );
    println!("| mode | sbatch jobs | cold loads | GPU-seconds | wall time (s) |");
    println!("|---|---|---|---|---|");
    println!(
        "| per-leg, measured | 3 | {pl_loads:.0} | {pl_gpu:.1} | {pl_serial:.1} one after another; {pl_par:.1} on 3 nodes at once |"
    );
    println!("| shared, modelled from the same phases | 1 | 1 | {sh_gpu:.1} | {sh_wall:.1} |");
    if shared_bin.is_some() {
        let (g, w, l) = (median(shared_measured.0), median(shared_measured.1), median(shared_measured.2));
        println!("| shared, measured (`payload run --shared`) | 1 | {l:.0} | {g:.1} | {w:.1} |");
        println!(
            "GPU-seconds shared (measured) / per-leg: {:.2} ({:.0} % fewer)",
            g / pl_gpu,
            100.0 * (1.0 - g / pl_gpu)
        );
    }
    println!("GPU-seconds shared / per-leg: {:.2} ({:.0} % fewer)", sh_gpu / pl_gpu, 100.0 * (1.0 - sh_gpu / pl_gpu));
}
