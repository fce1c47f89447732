//! The run loop with injected signals (`payload::run::run_with`): real children (shell scripts
//! standing in for vLLM and Harbor), signals sent through a channel instead of to the process, so
//! the test process itself is never signalled. One test: payload's teardown sweeps every descendant
//! of its process, so two runs in one test binary must not overlap.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use payload::supervisor::{ChannelSignals, NoSignals, SignalEvent};
use serde_json::{Value, json};

struct World {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    tag: String,
}

impl World {
    /// An environment prefix whose `vllm` runs `engine` (a shell body) and whose `harbor` exits 0.
    fn new(tag: &str, engine: &str) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        std::fs::create_dir_all(root.join("env/bin")).unwrap();
        std::fs::create_dir_all(root.join("data/task")).unwrap();
        std::fs::create_dir_all(root.join("jobs")).unwrap();
        for (name, body) in [("vllm", engine), ("harbor", "exit 0")] {
            let path = root.join("env/bin").join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        }
        std::fs::write(root.join("harbor.yaml"), "orchestrator:\n  type: local\n").unwrap();
        std::fs::write(
            root.join("gpus.json"),
            r#"[{"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100", "memory_total_bytes": 85899345920}]"#,
        )
        .unwrap();
        let tag = format!("{tag}-{}", std::process::id());
        Self { _tmp: tmp, root, tag }
    }

    fn run_dir(&self) -> PathBuf {
        self.root.join("jobs").join(&self.tag)
    }

    fn spec(&self) -> PathBuf {
        let spec = json!({
            "version": 1, "run_tag": self.tag, "run_dir": self.run_dir(), "jobs_dir": self.root.join("jobs"),
            "cluster": "local", "benchmark": "loop",
            "model": {"hf_id": "M/M", "served_name": "M"},
            "serve": {"program": "vllm", "env_prefix": self.root.join("env"), "health_timeout_s": 600,
                      "tensor_parallel_size": 1, "data_parallel_size": 1},
            "gpu_profiles": {"profiles": [{"name": "default", "gpu_memory_utilization": 0.8}]},
            "harbor": {"program": "harbor", "env_prefix": self.root.join("env"), "config": self.root.join("harbor.yaml"),
                       "dataset": self.root.join("data"), "dialect": "extra-body-fork",
                       "n_concurrent": 1, "n_attempts": 1, "timeout_multiplier": 1.0},
            "secrets": {"daytona": false},
            "limits": {"teardown_grace_s": 2.0, "heartbeat_interval_s": 0.2}
        });
        let path = self.root.join("launch-in.json");
        std::fs::write(&path, spec.to_string()).unwrap();
        path
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("PAYLOAD_GPU_FIXTURE".into(), self.root.join("gpus.json").display().to_string()),
        ]
    }

    fn status(&self) -> Value {
        std::fs::read_to_string(self.run_dir().join("status.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null)
    }

    /// Waits (without blocking the runtime) until vLLM is spawned.
    async fn serving(&self) {
        let until = Instant::now() + Duration::from_secs(60);
        while self.status()["phase"] != "serving" {
            assert!(Instant::now() < until, "vLLM never spawned: {}", self.status());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// No process carries this run's marker any more.
    fn assert_nothing_left(&self) {
        let marker = format!("PAYLOAD_RUN_ID={}-{}", self.tag, std::process::id());
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            if e.file_name().to_string_lossy().parse::<u32>().is_err() {
                continue;
            }
            let environ = std::fs::read(e.path().join("environ")).unwrap_or_default();
            let alive = std::fs::read_to_string(e.path().join("stat")).is_ok_and(|s| !s.contains(") Z "));
            assert!(
                !(alive && environ.split(|b| *b == 0).any(|kv| kv == marker.as_bytes())),
                "pid {} survived the run",
                e.file_name().to_string_lossy()
            );
        }
    }
}

async fn signal_while_loading(name: &str, ev: SignalEvent) -> (i32, Value) {
    let w = World::new(name, "exec sleep 600");
    let spec = w.spec();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let run = payload::run::run_with(&spec, ChannelSignals(rx), w.env());
    tokio::pin!(run);
    tokio::select! {
        code = &mut run => panic!("the run ended ({code}) before vLLM was spawned: {}", w.status()),
        () = w.serving() => {}
    }
    tx.send(ev).unwrap();
    let code = tokio::time::timeout(Duration::from_secs(60), run).await.expect("the injected signal ended the run");
    w.assert_nothing_left();
    (code, w.status()["outcome"].clone())
}

#[tokio::test(flavor = "current_thread")]
async fn injected_signals_end_the_loading_phase_and_tear_down() {
    let (code, o) = signal_while_loading("term", SignalEvent::Shutdown(Signal::SIGTERM)).await;
    assert_eq!((code, o["class"].as_str(), o["signal"].as_str()), (143, Some("interrupted"), Some("SIGTERM")), "{o}");

    let (code, o) = signal_while_loading("usr1", SignalEvent::Walltime).await;
    assert_eq!((code, o["class"].as_str()), (15, Some("walltime")), "{o}");

    // No signal source at all (nextest's no-op handler): the engine's own exit ends the run.
    let w = World::new("exit", "echo 'torch.OutOfMemoryError: CUDA out of memory' >&2; exit 1");
    let code = payload::run::run_with(&w.spec(), NoSignals, w.env()).await;
    let o = w.status()["outcome"].clone();
    assert_eq!((o["class"].as_str(), o["cause"].as_str()), (Some("engine_start"), Some("oom")), "{o}");
    assert_eq!(code, o["exit_code"].as_i64().unwrap() as i32);
    w.assert_nothing_left();
}
