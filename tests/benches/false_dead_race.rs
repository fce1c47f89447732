//! Issue 31, item 2: the false-dead race, driven 20 times. Each repetition runs the real `payload`
//! with the stand-ins and payload's default heartbeat (15 s, longer than the whole Harbor run, so
//! a loading-time beat would sit beside `phase: running` for all of it), and polls its run dir
//! every 20 ms with `status`'s own per-job judgement (`verify::status::judge_job`, as Slurm RUNNING).
//! Prints the readings taken while Harbor ran, how many were judged `dead` (every one is false: the
//! engine is healthy), and how many showed Harbor running beside a beat with `engine_healthy: false`.
//! Figures, not a timed test.
//!
//! `cargo bench -p e2e --bench false_dead_race` (env: `RACE_REPS`, default 20; `RACE_PAYLOAD`: another
//! payload binary, e.g. an older build, to count its stale beats).

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chrono::Utc;
use e2e::harness::payload_bin;
use launch_spec::records::{Phase, RunStatus};
use launch_spec::testkit::spec::{chip_profile, default_profile};
use launch_spec::testkit::{TestSpec, world};
use submitter::domain::SlurmView;
use submitter::ledger::AttemptStatus;
use submitter::verify::status::{JobSide, judge_job};
use submitter::verify::{VerdictKind, VerifySettings};

const VLLM: &str = env!("CARGO_BIN_EXE_vllm-standin");
const HARBOR: &str = env!("CARGO_BIN_EXE_harbor-standin");
const JOB_ID: &str = "4242";

const GPU_FIXTURE: &str = r#"[
  {"index": 0, "uuid": "GPU-cccc0000-0000-4000-8000-000000000000", "name": "NVIDIA A100-SXM-64GB", "memory_total_bytes": 68719476736}
]"#;

#[derive(Default)]
struct Tally {
    readings: u64,
    dead: u64,
    stale_beats: u64,
    failed_runs: u64,
}

fn one_run(payload: &Path, rep: usize, tally: &mut Tally) {
    let tmp = tempfile::Builder::new().prefix("false-dead-race-").tempdir().unwrap();
    let root = tmp.path();
    let tag = format!("race-{rep}-{}", std::process::id());
    world::link_programs(&root.join("env"), &[("vllm", Path::new(VLLM)), ("harbor", Path::new(HARBOR))]);
    world::standin_tasks(&root.join("data"), 2);
    std::fs::create_dir_all(root.join("jobs")).unwrap();
    std::fs::write(root.join("harbor.yaml"), "orchestrator:\n  type: local\n  n_concurrent_trials: 2\n").unwrap();
    std::fs::write(root.join("gpus.json"), GPU_FIXTURE).unwrap();
    world::write_secrets(
        &root.join("secrets.env"),
        concat!("DAYTONA_API_KEY=race-org1\n", "DAYTONA_DATA_API_KEY=race-org2\n"),
        0o600,
    );
    let mut spec = TestSpec::standins(root, &tag)
        .tp_dp(1, 1)
        .serve_env("STANDIN_LOAD_SECONDS", "0.3")
        .serve_env("STANDIN_GPUS", "1")
        .gpu_profiles(vec![chip_profile("a100-64gb", "A100", (60.0, 66.0), 0.85), default_profile(0.8)])
        .harbor_env("STANDIN_TRIAL_SECONDS", "1.5")
        .harbor_env("STANDIN_EXTRAS", "daytona")
        .to_value();
    // payload's default heartbeat and probe period (launch_spec::spec::Limits).
    spec["limits"]["heartbeat_interval_s"] = 15.0.into();
    spec["limits"]["health_probe_interval_s"] = 10.0.into();
    let spec_path = root.join("launch-in.json");
    std::fs::write(&spec_path, serde_json::to_string_pretty(&spec).unwrap()).unwrap();
    let run_dir: PathBuf = root.join("jobs").join(&tag);
    let mut child = Command::new(payload)
        .args(["run", "--spec", spec_path.to_str().unwrap()])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
        .env("HOME", root)
        .env("PAYLOAD_GPU_FIXTURE", root.join("gpus.json"))
        .env("SLURM_JOB_ID", JOB_ID)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn payload");
    let started_at = Utc::now();
    let until = Instant::now() + Duration::from_secs(120);
    let settings = VerifySettings::default();
    while child.try_wait().unwrap().is_none() && Instant::now() < until {
        let status: Option<RunStatus> =
            std::fs::read_to_string(run_dir.join("status.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
        if let Some(st) = status.filter(|s| s.phase == Phase::Running) {
            let side = JobSide {
                status: AttemptStatus::Started,
                reason: "running",
                job_id: Some(JOB_ID),
                slurm: Some(SlurmView::Running),
                slurm_state: Some("RUNNING".into()),
                started_at: Some(started_at),
                metrics: None,
            };
            let (verdict, _, _) = judge_job(Some(&run_dir), &side, None, &settings, Utc::now());
            tally.readings += 1;
            tally.dead += u64::from(verdict.verdict == VerdictKind::Dead);
            tally.stale_beats += u64::from(st.heartbeat.as_ref().is_some_and(|b| !b.engine_healthy));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let code = child.wait().unwrap();
    if !code.success() {
        tally.failed_runs += 1;
        let outcome = std::fs::read_to_string(run_dir.join("status.json")).unwrap_or_default();
        let outcome: serde_json::Value = serde_json::from_str(&outcome).unwrap_or_default();
        let harbor_log = std::fs::read_to_string(run_dir.join("harbor.log")).unwrap_or_default();
        eprintln!("run {rep}: payload exited {code}: {}\n{harbor_log}", outcome["outcome"]);
    }
}

fn main() {
    let reps: usize = std::env::var("RACE_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let payload = std::env::var_os("RACE_PAYLOAD").map(PathBuf::from).unwrap_or_else(|| payload_bin().to_path_buf());
    let mut tally = Tally::default();
    let began = Instant::now();
    for rep in 0..reps {
        one_run(&payload, rep, &mut tally);
    }
    println!("false-dead race: {reps} payload runs ({}), {:.0} s", payload.display(), began.elapsed().as_secs_f64());
    println!("  readings of status.json with Harbor running, judged as `status` does: {}", tally.readings);
    println!("  judged dead (false verdicts): {}", tally.dead);
    println!("  Harbor running beside a beat with engine_healthy false: {}", tally.stale_beats);
    println!("  runs that did not exit 0: {}", tally.failed_runs);
}
