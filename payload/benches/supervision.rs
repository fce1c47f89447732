//! Supervision figures for `payload` (printed, not asserted): `cargo bench -p payload`.
//!
//! Each figure is the median over several runs of the real binary with the e2e stand-ins
//! (`target/debug/{vllm,harbor}-standin`, built on demand with `cargo build -p e2e --bins`):
//!
//! - readiness detection: stand-in `/health` first answers 200 (polled every 2 ms by this bench)
//!   → `harbor_spawned` in `events.jsonl`;
//! - crash detection: the engine process exits (a wrapper stamps the instant) → payload has exited
//!   with class `engine_start`;
//! - teardown: SIGTERM → payload exited with every group and a double-forked, TERM-ignoring
//!   grandchild gone (cooperative vLLM; and vLLM ignoring TERM, which is bound by the grace);
//! - payload's peak RSS (VmHWM) while supervising, and its CPU use while idle-supervising;
//! - under load: a 1 GB access-log burst written into `vllm.log` while the engine loads and 100k
//!   finished trial dirs in the run dir — peak RSS (target ≤ 32 MB), readiness → Harbor spawned
//!   (within one readiness poll, 25 ms, of the unloaded figure), SIGTERM → all gone (≤ grace + 1 s).
//!
//! `cargo bench -p payload` builds payload in release; `cargo test -p payload --bench supervision`
//! runs the same figures on the debug build (slower, but no release build of the workspace).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

const PAYLOAD_BUILT: &str = env!("CARGO_BIN_EXE_payload");

/// The payload binary measured: this build, or `$BENCH_PAYLOAD_BIN` (an older build, for A/B figures
/// on the same loaded machine).
fn payload() -> String {
    std::env::var("BENCH_PAYLOAD_BIN").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| PAYLOAD_BUILT.to_string())
}
const RUNS: usize = 10;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The stand-ins, built (debug) if needed.
fn standins() -> (PathBuf, PathBuf) {
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "-q", "-p", "e2e", "--bin", "vllm-standin", "--bin", "harbor-standin"])
        .current_dir(workspace_root())
        .status()
        .expect("cargo build -p e2e");
    assert!(status.success());
    let target =
        std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| workspace_root().join("target"));
    (target.join("debug/vllm-standin"), target.join("debug/harbor-standin"))
}

fn now_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64() * 1000.0
}

/// RFC 3339 "…T05:54:29.997Z" → ms since the epoch (UTC, this day arithmetic is enough here).
fn event_ms(at: &str) -> f64 {
    let (date, time) = at.split_once('T').unwrap();
    let d: Vec<i64> = date.split('-').map(|x| x.parse().unwrap()).collect();
    let (y, m, day) = (d[0], d[1], d[2]);
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let t = time.trim_end_matches('Z');
    let h: f64 = t[0..2].parse().unwrap();
    let mi: f64 = t[3..5].parse().unwrap();
    let s: f64 = t[6..].parse().unwrap();
    (days as f64 * 86_400.0 + h * 3600.0 + mi * 60.0 + s) * 1000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

struct Fx {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    tag: String,
}

impl Fx {
    fn new(vllm: &Path, harbor: &Path, i: usize) -> Self {
        Self::new_in(vllm, harbor, i, &std::env::temp_dir())
    }

    fn new_in(vllm: &Path, harbor: &Path, i: usize, parent: &Path) -> Self {
        let tmp = tempfile::Builder::new().prefix("payload-bench-").tempdir_in(parent).unwrap();
        let root = tmp.path().to_path_buf();
        std::fs::create_dir_all(root.join("env/bin")).unwrap();
        std::os::unix::fs::symlink(vllm, root.join("env/bin/vllm-real")).unwrap();
        std::os::unix::fs::symlink(harbor, root.join("env/bin/harbor")).unwrap();
        // A wrapper that stamps the instant the engine process ends (crash detection).
        let wrapper = root.join("env/bin/vllm");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\n{}/env/bin/vllm-real \"$@\"\nrc=$?\ndate +%s.%N > {}/engine-exit\nexit $rc\n",
                root.display(),
                root.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        for t in 0..2 {
            let dir = root.join(format!("data/task-{t}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("instruction.md"), "Solve it.\n").unwrap();
        }
        std::fs::create_dir_all(root.join("jobs")).unwrap();
        std::fs::write(
            root.join("harbor.yaml"),
            "orchestrator:\n  type: local\n  n_concurrent_trials: 2\n  quiet: true\n",
        )
        .unwrap();
        std::fs::write(
            root.join("gpus.json"),
            r#"[{"index":0,"uuid":"GPU-b","name":"NVIDIA H200","memory_total_bytes":151397597184}]"#,
        )
        .unwrap();
        std::fs::write(root.join("secrets.env"), concat!("DAYTONA_API_KEY=a1\n", "DAYTONA_DATA_API_KEY=a2\n")).unwrap();
        std::fs::set_permissions(root.join("secrets.env"), std::fs::Permissions::from_mode(0o600)).unwrap();
        Self { _tmp: tmp, tag: format!("bench-{}-{i}", std::process::id()), root }
    }

    fn run_dir(&self) -> PathBuf {
        self.root.join("jobs").join(&self.tag)
    }

    fn spec(&self, serve_env: Value, mut harbor_env: Value, limits: Value) -> PathBuf {
        // The Harbor stand-in models an install with the daytona extra, which `--env daytona` needs.
        harbor_env["STANDIN_EXTRAS"] = json!("daytona");
        let spec = json!({
            "version": 1, "run_tag": self.tag, "run_dir": self.run_dir(), "jobs_dir": self.root.join("jobs"),
            "cluster": "local", "benchmark": "bench",
            "model": {"hf_id": "Qwen/Qwen3-8B", "served_name": "Qwen3-8B"},
            "serve": {"program": "vllm", "env_prefix": self.root.join("env"), "tensor_parallel_size": 1,
                      "data_parallel_size": 1, "health_timeout_s": 60, "env": serve_env},
            "gpu_profiles": {"profiles": [{"name": "default", "gpu_memory_utilization": 0.9}]},
            "harbor": {"program": "harbor", "env_prefix": self.root.join("env"), "config": self.root.join("harbor.yaml"),
                       "dataset": self.root.join("data"), "n_concurrent": 2, "n_attempts": 1, "timeout_multiplier": 1.0,
                       "env": harbor_env},
            "secrets": {"file": self.root.join("secrets.env")},
            "limits": limits,
        });
        let path = self.root.join("spec.json");
        std::fs::write(&path, spec.to_string()).unwrap();
        path
    }

    fn start(&self, spec: &Path) -> Child {
        Command::new(payload())
            .args(["run", "--spec", spec.to_str().unwrap()])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &self.root)
            .env("PAYLOAD_GPU_FIXTURE", self.root.join("gpus.json"))
            .env("PAYLOAD_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    fn status(&self) -> Value {
        std::fs::read_to_string(self.run_dir().join("status.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null)
    }

    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.run_dir().join("events.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn wait_phase(&self, phase: &str) {
        let until = Instant::now() + Duration::from_secs(30);
        while self.status()["phase"] != phase {
            assert!(Instant::now() < until, "no phase {phase}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

fn health_200(port: u64) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port as u16)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 32];
    matches!(s.read(&mut buf), Ok(n) if n >= 12 && &buf[9..12] == b"200")
}

fn limits(heartbeat: f64, probe: f64, grace: f64) -> Value {
    json!({"teardown_grace_s": grace, "heartbeat_interval_s": heartbeat, "health_probe_interval_s": probe, "health_failures": 3})
}

fn marker_left(marker: &str) -> usize {
    let needle = format!("{marker}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read(e.path().join("environ")).is_ok_and(|b| String::from_utf8_lossy(&b).contains(&needle))
        })
        .count()
}

fn wait_exit(child: &mut Child) -> (i32, f64) {
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return (st.code().unwrap_or(-1), now_ms());
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

fn readiness(vllm: &Path, harbor: &Path) -> Vec<f64> {
    (0..RUNS)
        .map(|i| {
            let fx = Fx::new(vllm, harbor, i);
            let spec = fx.spec(
                json!({"STANDIN_LOAD_SECONDS": "1.0"}),
                json!({"STANDIN_TRIAL_SECONDS": "0.05"}),
                limits(15.0, 10.0, 5.0),
            );
            let mut child = fx.start(&spec);
            let until = Instant::now() + Duration::from_secs(20);
            let port = loop {
                if let Some(p) = fx.status()["port"].as_u64() {
                    break p;
                }
                assert!(Instant::now() < until);
                std::thread::sleep(Duration::from_millis(2));
            };
            let healthy_at = loop {
                if health_200(port) {
                    break now_ms();
                }
                assert!(Instant::now() < until, "stand-in never healthy");
                std::thread::sleep(Duration::from_millis(2));
            };
            let (code, _) = wait_exit(&mut child);
            assert_eq!(code, 0);
            let ev = fx.events().into_iter().find(|e| e["event"] == "harbor_spawned").unwrap();
            event_ms(ev["at"].as_str().unwrap()) - healthy_at
        })
        .collect()
}

fn crash(vllm: &Path, harbor: &Path) -> Vec<f64> {
    (0..RUNS)
        .map(|i| {
            let fx = Fx::new(vllm, harbor, i);
            let spec = fx.spec(json!({"STANDIN_FAIL_AT_START": "oom"}), json!({}), limits(15.0, 10.0, 5.0));
            let mut child = fx.start(&spec);
            let (code, exited_at) = wait_exit(&mut child);
            assert_eq!(code, 10);
            assert_eq!(fx.status()["outcome"]["class"], "engine_start");
            let stamp: f64 = std::fs::read_to_string(fx.root.join("engine-exit")).unwrap().trim().parse().unwrap();
            exited_at - stamp * 1000.0
        })
        .collect()
}

/// (TERM → exit ms, VmHWM kB) per run.
fn teardown(vllm: &Path, harbor: &Path, ignore_term: bool) -> Vec<(f64, f64)> {
    (0..RUNS)
        .map(|i| {
            let fx = Fx::new(vllm, harbor, i);
            let mut serve_env = json!({"STANDIN_LOAD_SECONDS": "0.1", "STANDIN_DOUBLE_FORK": "1"});
            if ignore_term {
                serve_env["STANDIN_IGNORE_SIGTERM"] = json!("1");
            }
            let spec = fx.spec(serve_env, json!({"STANDIN_TRIAL_SECONDS": "60"}), limits(0.3, 0.3, 1.0));
            let mut child = fx.start(&spec);
            fx.wait_phase("running");
            std::thread::sleep(Duration::from_millis(1000));
            let pid = child.id();
            let hwm = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .unwrap()
                .lines()
                .find_map(|l| {
                    l.strip_prefix("VmHWM:").map(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().unwrap())
                })
                .unwrap();
            let t = now_ms();
            Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
            let (code, exited_at) = wait_exit(&mut child);
            assert_eq!(code, 143);
            let left = marker_left(&format!("PAYLOAD_RUN_ID={}-{pid}", fx.tag));
            assert_eq!(left, 0, "processes survived");
            (exited_at - t, hwm)
        })
        .collect()
}

/// CPU % of one core over a window of idle supervision (Harbor busy in long trials).
fn idle_cpu(vllm: &Path, harbor: &Path, heartbeat: f64, probe: f64, window: Duration, runs: usize) -> Vec<f64> {
    idle_cpu_with(vllm, harbor, heartbeat, probe, window, runs, json!({"STANDIN_LOAD_SECONDS": "0.1"}))
}

/// [`idle_cpu`] with the engine's environment given (`STANDIN_NO_METRICS=1`: `/metrics` answers
/// 404, so no counters are parsed or judged).
fn idle_cpu_with(
    vllm: &Path,
    harbor: &Path,
    heartbeat: f64,
    probe: f64,
    window: Duration,
    runs: usize,
    serve_env: Value,
) -> Vec<f64> {
    let tck: f64 = String::from_utf8(Command::new("getconf").arg("CLK_TCK").output().unwrap().stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap_or(100.0);
    (0..runs)
        .map(|i| {
            let fx = Fx::new(vllm, harbor, i);
            let spec =
                fx.spec(serve_env.clone(), json!({"STANDIN_TRIAL_SECONDS": "120"}), limits(heartbeat, probe, 1.0));
            let mut child = fx.start(&spec);
            fx.wait_phase("running");
            std::thread::sleep(Duration::from_millis(500));
            let pid = child.id();
            let ticks = || -> f64 {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
                let rest = &stat[stat.rfind(')').unwrap() + 2..];
                let f: Vec<&str> = rest.split_whitespace().collect();
                f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()
            };
            let (t0, c0) = (Instant::now(), ticks());
            std::thread::sleep(window);
            let (dt, dc) = (t0.elapsed().as_secs_f64(), ticks() - c0);
            Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
            let _ = wait_exit(&mut child);
            100.0 * dc / tck / dt
        })
        .collect()
}

/// The liveness rule's own cost per heartbeat (payload::liveness: the counters parsed from the
/// `/metrics` text, then judged), on a text shaped like vLLM 0.33's with 8 data-parallel engines and
/// its latency histograms: (median µs per beat, KiB of text).
fn liveness_cost() -> (f64, usize) {
    use payload::liveness::{EngineSample, Liveness, engine_sample};
    let mut text = String::new();
    for family in 0..40 {
        text.push_str(&format!(
            "# HELP vllm:histogram_{family}_seconds Histogram.\n# TYPE vllm:histogram_{family}_seconds histogram\n"
        ));
        for engine in 0..8 {
            for le in ["0.01", "0.1", "0.5", "1.0", "5.0", "+Inf"] {
                text.push_str(&format!(
                    "vllm:histogram_{family}_seconds_bucket{{engine=\"{engine}\",le=\"{le}\",model_name=\"Qwen3-235B-A22B\"}} 12.0\n"
                ));
            }
        }
    }
    for engine in 0..8 {
        for (name, v) in [
            ("vllm:num_requests_running", 3.0),
            ("vllm:num_requests_waiting", 1.0),
            ("vllm:kv_cache_usage_perc", 0.4),
            ("vllm:prompt_tokens_total", 123456.0),
            ("vllm:generation_tokens_total", 65432.0),
        ] {
            text.push_str(&format!("{name}{{engine=\"{engine}\",model_name=\"Qwen3-235B-A22B\"}} {v}\n"));
        }
    }
    let mut liveness = Liveness::new(Duration::from_secs(600));
    let t0 = Instant::now();
    let per_round = 200;
    let rounds: Vec<f64> = (0..10)
        .map(|_| {
            let start = Instant::now();
            for i in 0..per_round {
                let s: EngineSample = engine_sample(std::hint::black_box(&text)).unwrap();
                std::hint::black_box(liveness.observe(t0 + Duration::from_secs(i), s));
            }
            start.elapsed().as_secs_f64() * 1e6 / per_round as f64
        })
        .collect();
    (median(rounds), text.len() / 1024)
}

fn vm_hwm_kb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:").map(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().unwrap()))
        .unwrap()
}

/// (VmHWM kB, /health 200 → Harbor spawned ms, SIGTERM → all gone ms) under a 1 GB `vllm.log`
/// burst and `trials` finished trial dirs.
fn under_load(vllm: &Path, harbor: &Path, trials: usize, burst_bytes: usize, grace: f64) -> (f64, f64, f64) {
    // On a RAM-backed filesystem when there is one (node-local scratch; 100k dirs on a shared disk
    // take minutes to create).
    let shm = Path::new("/dev/shm");
    let fx = Fx::new_in(vllm, harbor, 0, if shm.is_dir() { shm } else { Path::new("/tmp") });
    let run = fx.run_dir();
    for i in 0..trials {
        let dir = run.join(format!("task-{i}__bench"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("result.json"), r#"{"trial_name": "t", "exception_info": null}"#).unwrap();
    }
    let spec = fx.spec(
        json!({"STANDIN_LOAD_SECONDS": "4.0"}),
        json!({"STANDIN_TRIAL_SECONDS": "120"}),
        limits(0.3, 0.3, grace),
    );
    let mut child = fx.start(&spec);
    let until = Instant::now() + Duration::from_secs(60);
    let port = loop {
        if let Some(p) = fx.status()["port"].as_u64()
            && run.join("vllm.log").exists()
        {
            break p;
        }
        assert!(Instant::now() < until, "payload never spawned the engine");
        std::thread::sleep(Duration::from_millis(2));
    };
    // The burst: access lines appended to the engine's log as fast as the disk takes them.
    let log = run.join("vllm.log");
    let writer = std::thread::spawn(move || {
        let line = "INFO:     127.0.0.1:51234 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK\n";
        let chunk = line.repeat((1 << 20) / line.len());
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        let mut written = 0;
        while written < burst_bytes {
            f.write_all(chunk.as_bytes()).unwrap();
            written += chunk.len();
        }
    });
    let healthy_at = loop {
        if health_200(port) {
            break now_ms();
        }
        assert!(Instant::now() < until, "stand-in never healthy");
        std::thread::sleep(Duration::from_millis(2));
    };
    fx.wait_phase("running");
    let ev = fx.events().into_iter().find(|e| e["event"] == "harbor_spawned").unwrap();
    let ready_ms = event_ms(ev["at"].as_str().unwrap()) - healthy_at;
    writer.join().unwrap();
    std::thread::sleep(Duration::from_secs(2)); // heartbeats go on scanning the log and the trials
    let pid = child.id();
    let hwm = vm_hwm_kb(pid);
    let t = now_ms();
    Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
    let (code, exited_at) = wait_exit(&mut child);
    assert_eq!(code, 143);
    let left = marker_left(&format!("PAYLOAD_RUN_ID={}-{pid}", fx.tag));
    assert_eq!(left, 0, "processes survived");
    (hwm, ready_ms, exited_at - t)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` / `--list` probing: nothing to list.
    }
    let (vllm, harbor) = standins();
    // `BENCH_ONLY=load`: just the figures under load (the slow part to set up).
    if std::env::var("BENCH_ONLY").as_deref() == Ok("load") {
        let trials = std::env::var("BENCH_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
        let burst = std::env::var("BENCH_BURST_MB").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(1024) << 20;
        let (hwm, ready, term) = under_load(&vllm, &harbor, trials, burst, 1.0);
        println!(
            "under load           1 GB vllm.log burst + {trials} trial dirs: peak RSS {hwm:>7.0} kB, /health 200 → Harbor spawned {ready:>6.1} ms, SIGTERM → all gone {term:>6.1} ms (grace 1.0 s)"
        );
        return;
    }
    // `BENCH_ONLY=cpu`: just payload's CPU while supervising a running Harbor (heartbeat and probe
    // 0.5 s: every beat fetches `/metrics` and runs the liveness rule), for A/B with `BENCH_PAYLOAD_BIN`.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("cpu") {
        let (us, kib) = liveness_cost();
        println!(
            "liveness rule        parse + judge one {kib} KiB /metrics text (8 engines, histograms): {us:>6.1} µs per beat = {:.4} % of one core at a 15 s beat, {:.3} % at 0.5 s",
            us / 15e6 * 100.0,
            us / 0.5e6 * 100.0
        );
        let cpu = idle_cpu(&vllm, &harbor, 0.5, 0.5, Duration::from_secs(3), 5);
        println!(
            "supervising CPU      heartbeat 0.5 s, health probe 0.5 s (median of 5 × 3 s; payload = {}): {:>6.2} % of one core (runs {cpu:.2?})",
            payload(),
            median(cpu.clone())
        );
        return;
    }
    // `BENCH_ONLY=liveness`: payload's steady-state CPU with the liveness rule (vLLM's counters in
    // `/metrics`, parsed and judged every beat) and without it (`/metrics` 404), alternating rounds
    // on the same machine; heartbeat and probe 0.5 s, 30× the profiles' 15 s beat, so the
    // difference is above the tick resolution.
    if std::env::var("BENCH_ONLY").as_deref() == Ok("liveness") {
        let (mut with, mut without) = (Vec::new(), Vec::new());
        let window = Duration::from_secs(8);
        for _ in 0..3 {
            let env = json!({"STANDIN_LOAD_SECONDS": "0.1"});
            with.extend(idle_cpu_with(&vllm, &harbor, 0.5, 0.5, window, 3, env));
            let env = json!({"STANDIN_LOAD_SECONDS": "0.1", "STANDIN_NO_METRICS": "1"});
            without.extend(idle_cpu_with(&vllm, &harbor, 0.5, 0.5, window, 3, env));
        }
        let (w, wo) = (median(with.clone()), median(without.clone()));
        println!(
            "liveness CPU         heartbeat 0.5 s (median of 9 × 8 s, 3 alternating rounds): with /metrics counters {w:.2} % of one core, without {wo:.2} %: +{:.2} points, ratio {:.2} (runs with {with:.2?}, without {without:.2?})",
            w - wo,
            if wo > 0.0 { w / wo } else { f64::NAN }
        );
        return;
    }
    println!("payload supervision figures (median of {RUNS} runs unless noted; payload = {})", payload());
    // `BENCH_ONLY=latency`: just readiness → Harbor spawned and engine exit → payload exited.
    let only_latency = std::env::var("BENCH_ONLY").as_deref() == Ok("latency");
    let r = readiness(&vllm, &harbor);
    println!(
        "readiness detection  stand-in /health 200 → Harbor spawned: {:>7.1} ms  (min {:.1}, max {:.1})",
        median(r.clone()),
        r.iter().cloned().fold(f64::MAX, f64::min),
        r.iter().cloned().fold(0.0, f64::max)
    );
    let c = crash(&vllm, &harbor);
    println!(
        "crash detection      engine exit → payload exited (engine_start): {:>7.1} ms  (min {:.1}, max {:.1})",
        median(c.clone()),
        c.iter().cloned().fold(f64::MAX, f64::min),
        c.iter().cloned().fold(0.0, f64::max)
    );
    if only_latency {
        return;
    }
    let t = teardown(&vllm, &harbor, false);
    let hwm: Vec<f64> = t.iter().map(|x| x.1).collect();
    println!(
        "teardown             SIGTERM → all gone (cooperative vLLM, TERM-ignoring double-forked grandchild): {:>7.1} ms",
        median(t.iter().map(|x| x.0).collect())
    );
    let t2 = teardown(&vllm, &harbor, true);
    println!(
        "teardown             SIGTERM → all gone (vLLM ignores TERM; grace 1.0 s): {:>7.1} ms",
        median(t2.iter().map(|x| x.0).collect())
    );
    println!("peak RSS             payload VmHWM while supervising: {:>7.0} kB", median(hwm));
    let (hwm, ready, term) = under_load(&vllm, &harbor, 100_000, 1 << 30, 1.0);
    println!(
        "under load           1 GB vllm.log burst + 100k trial dirs (1 run): peak RSS {:>7.0} kB (target ≤ 32768), /health 200 → Harbor spawned {:>6.1} ms, SIGTERM → all gone {:>6.1} ms (grace 1.0 s; target ≤ 2000)",
        hwm, ready, term
    );
    let cpu_fast = idle_cpu(&vllm, &harbor, 0.5, 0.5, Duration::from_secs(3), 5);
    println!(
        "idle CPU             heartbeat 0.5 s, health probe 0.5 s (median of 5 × 3 s): {:>6.2} % of one core",
        median(cpu_fast)
    );
    let cpu_default = idle_cpu(&vllm, &harbor, 15.0, 10.0, Duration::from_secs(10), 3);
    println!(
        "idle CPU             defaults: heartbeat 15 s, probe 10 s (median of 3 × 10 s): {:>6.2} % of one core",
        median(cpu_default)
    );
}
