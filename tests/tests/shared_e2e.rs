//! Shared jobs (issue 24) end to end: the real `payload run --shared` with the vLLM and Harbor
//! stand-ins, real processes and real signals. One engine serves every leg; each leg has its own
//! run dir and outcome; a leg's cancel request, the engine's death and walltime are handled per
//! leg; nothing outlives the host (`/proc` scanned for every payload's run id).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use e2e::harness::{marker_processes, payload_bin, send_signal, unique};
use launch_spec::testkit::spec::{chip_profile, default_profile};
use launch_spec::testkit::{TestSpec, world};

const VLLM: &str = env!("CARGO_BIN_EXE_vllm-standin");
const HARBOR: &str = env!("CARGO_BIN_EXE_harbor-standin");
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../sbatch/payload.sbatch");

const GPU_FIXTURE: &str = r#"[
  {"index": 0, "uuid": "GPU-bbbb0000-0000-4000-8000-000000000000", "name": "NVIDIA A100-SXM-64GB", "memory_total_bytes": 68719476736},
  {"index": 1, "uuid": "GPU-bbbb0000-0000-4000-8000-000000000001", "name": "NVIDIA A100-SXM-64GB", "memory_total_bytes": 68719476736}
]"#;

const HARBOR_YAML: &str = "orchestrator:\n  type: local\n  n_concurrent_trials: 2\n  quiet: true\nenvironment:\n  type: daytona\n  delete: true\nverifier:\n  max_timeout_sec: 600\n";

/// Generous: the machine is shared by many builds.
const LONG: Duration = Duration::from_secs(180);

/// A shared job's world: stand-ins on a prefix, a dataset, secrets made up per run, a jobs dir,
/// a group dir and one launch spec per leg.
struct Shared {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    group_tag: String,
    legs: Vec<String>,
    /// The made-up secret values: none may appear in any record or log.
    secrets: [String; 2],
}

struct Host {
    child: Child,
    pid: i32,
}

impl Shared {
    /// `trial_seconds[i]`: how long each of leg i's trials takes (several tasks per leg).
    fn new(name: &str, trial_seconds: &[&str]) -> Self {
        let tmp = tempfile::Builder::new().prefix("shared-e2e-").tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let id = unique();
        world::link_programs(&root.join("env"), &[("vllm", Path::new(VLLM)), ("harbor", Path::new(HARBOR))]);
        world::standin_tasks(&root.join("data"), 4);
        std::fs::create_dir_all(root.join("jobs")).unwrap();
        std::fs::write(root.join("harbor.yaml"), HARBOR_YAML).unwrap();
        std::fs::write(root.join("gpus.json"), GPU_FIXTURE).unwrap();
        let secrets = [format!("made-up-org1-{id}"), format!("made-up-org2-{id}")];
        world::write_secrets(
            &root.join("secrets.env"),
            &format!("DAYTONA_API_KEY={}\nDAYTONA_DATA_API_KEY={}\n", secrets[0], secrets[1]),
            0o600,
        );
        let group_tag = format!("{name}-shared-{id}");
        let legs: Vec<String> = (0..trial_seconds.len()).map(|i| format!("{name}-leg{i}-{id}")).collect();
        let fx = Self { _tmp: tmp, root, group_tag, legs, secrets };
        for (tag, secs) in fx.legs.iter().zip(trial_seconds) {
            fx.write_leg(tag, &fx.leg_spec(tag, secs));
        }
        fx.write_shared();
        fx
    }

    fn leg_spec(&self, tag: &str, trial_seconds: &str) -> Value {
        TestSpec::standins(&self.root, tag)
            .tp_dp(1, 2)
            .max_model_len(8192)
            .max_num_seqs(64)
            .serve_env("STANDIN_LOAD_SECONDS", "0.5")
            .serve_env("STANDIN_GPUS", "2")
            .gpu_profiles(vec![chip_profile("a100-64gb", "A100", (60.0, 66.0), 0.85), default_profile(0.8)])
            .harbor_env("STANDIN_TRIAL_SECONDS", trial_seconds)
            .harbor_env("STANDIN_EXTRAS", "daytona")
            .to_value()
    }

    fn write_leg(&self, tag: &str, spec: &Value) {
        let dir = self.run_dir(tag);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("launch.json"), serde_json::to_string_pretty(spec).unwrap()).unwrap();
    }

    fn write_shared(&self) {
        let doc = json!({
            "version": 1,
            "group_tag": self.group_tag,
            "group_dir": self.group_dir(),
            "legs": self.legs.iter().map(|t| self.run_dir(t).join("launch.json")).collect::<Vec<_>>(),
        });
        std::fs::create_dir_all(self.group_dir()).unwrap();
        std::fs::write(self.shared_file(), serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    }

    fn group_dir(&self) -> PathBuf {
        self.root.join("jobs").join(&self.group_tag)
    }

    fn shared_file(&self) -> PathBuf {
        self.group_dir().join("shared.json")
    }

    fn run_dir(&self, tag: &str) -> PathBuf {
        self.root.join("jobs").join(tag)
    }

    fn start(&self) -> Host {
        let mut cmd = Command::new(payload_bin());
        cmd.args(["run", "--shared", self.shared_file().to_str().unwrap()]);
        self.spawn(cmd)
    }

    /// As Slurm starts it: `sbatch/payload.sbatch --shared FILE` (which execs payload).
    fn start_by_script(&self) -> Host {
        let mut cmd = Command::new("bash");
        cmd.args([SCRIPT, "--shared", self.shared_file().to_str().unwrap()]).env("PAYLOAD_BIN", payload_bin());
        self.spawn(cmd)
    }

    /// As Slurm's job `job` would run it (`SLURM_JOB_ID` set).
    fn start_as_job(&self, job: &str) -> Host {
        let mut cmd = Command::new(payload_bin());
        cmd.args(["run", "--shared", self.shared_file().to_str().unwrap()]);
        self.spawn_with(cmd, &[("SLURM_JOB_ID", job)])
    }

    fn spawn(&self, cmd: Command) -> Host {
        self.spawn_with(cmd, &[])
    }

    fn spawn_with(&self, mut cmd: Command, extra: &[(&str, &str)]) -> Host {
        let stderr = std::fs::File::create(self.root.join("host.stderr")).unwrap();
        cmd.env_clear();
        for (name, value) in extra {
            cmd.env(name, value);
        }
        let child = cmd
            .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
            .env("HOME", &self.root)
            .env("PAYLOAD_GPU_FIXTURE", self.root.join("gpus.json"))
            .env("PAYLOAD_BIN", payload_bin())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn payload");
        Host { pid: child.id() as i32, child }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.root.join("host.stderr")).unwrap_or_default()
    }

    fn status(&self, dir: &Path) -> Value {
        std::fs::read_to_string(dir.join("status.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null)
    }

    fn leg(&self, i: usize) -> Value {
        self.status(&self.run_dir(&self.legs[i]))
    }

    fn host_status(&self) -> Value {
        self.status(&self.group_dir())
    }

    /// Every line is also held to the typed bodies (launch_spec::testkit::assert_typed_event_line).
    fn events(&self, dir: &Path) -> Vec<Value> {
        std::fs::read_to_string(dir.join("events.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                launch_spec::testkit::assert_typed_event_line(l);
                serde_json::from_str(l).expect("events.jsonl line is JSON")
            })
            .collect()
    }

    fn wait_for(&self, what: &str, pred: impl Fn() -> bool) {
        let until = Instant::now() + LONG;
        while !pred() {
            assert!(Instant::now() < until, "timed out waiting for {what}\nhost stderr:\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every payload of the job (host and legs) by its run id: none may have a process left.
    fn markers(&self, host: &Host) -> Vec<String> {
        let mut markers = vec![format!("PAYLOAD_RUN_ID={}-{}", self.group_tag, host.pid)];
        for (i, tag) in self.legs.iter().enumerate() {
            if let Some(pid) = self.leg(i)["pids"]["payload"].as_u64() {
                markers.push(format!("PAYLOAD_RUN_ID={tag}-{pid}"));
            }
        }
        markers
    }

    fn assert_no_orphans(&self, host: &Host) {
        for marker in self.markers(host) {
            let until = Instant::now() + Duration::from_secs(10);
            loop {
                let left = marker_processes(&marker);
                if left.is_empty() {
                    break;
                }
                assert!(Instant::now() < until, "processes outlived the shared job ({marker}):\n{}", left.join("\n"));
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Files under the jobs dir (every record and log) and the host's stderr holding a secret.
    fn secret_hits(&self) -> Vec<String> {
        let mut hits = Vec::new();
        let mut stack = vec![self.root.join("jobs"), self.root.join("host.stderr")];
        while let Some(p) = stack.pop() {
            if p.is_dir() {
                stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
            } else if let Ok(bytes) = std::fs::read(&p) {
                let text = String::from_utf8_lossy(&bytes);
                hits.extend(self.secrets.iter().filter(|s| text.contains(s.as_str())).map(|_| p.display().to_string()));
            }
        }
        hits
    }

    fn engine_starts(&self) -> usize {
        let log = std::fs::read_to_string(self.group_dir().join("vllm.log")).unwrap_or_default();
        log.matches("Started server process").count()
    }
}

impl Host {
    fn wait(&mut self, fx: &Shared) -> i32 {
        let until = Instant::now() + LONG;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                panic!("the shared job did not end\nhost stderr:\n{}", fx.stderr());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn class(status: &Value) -> &str {
    status["outcome"]["class"].as_str().unwrap_or("none")
}

#[test]
fn three_legs_share_one_engine_started_once() {
    // Trials long enough that each leg's Harbor is `running` for several of the host's looks
    // (SHARE_POLL, 250 ms): a leg's serving span starts when the host sees it running, and a Harbor
    // that finished between two looks on a loaded machine would leave its leg without a span.
    let fx = Shared::new("three", &["1", "1", "1"]);
    let mut host = fx.start_by_script();
    let code = host.wait(&fx);
    assert_eq!(code, 0, "host exit\n{}", fx.stderr());
    for i in 0..3 {
        let s = fx.leg(i);
        assert_eq!(class(&s), "finished", "leg {i}: {s:#}\n{}", fx.stderr());
        assert!(s["gpu_time"].is_null(), "a leg carries no GPU time of its own");
        assert!(!fx.run_dir(&fx.legs[i]).join("vllm.log").exists(), "leg {i} started no engine");
        assert!(fx.run_dir(&fx.legs[i]).join("result.json").is_file(), "leg {i}: its Harbor job is in its run dir");
        let shared = fx.events(&fx.run_dir(&fx.legs[i])).into_iter().find(|e| e["event"] == "shared_engine");
        assert!(
            shared.is_some_and(|e| e["fields"]["group_tag"] == fx.group_tag.as_str()),
            "leg {i} used the host's engine"
        );
    }
    let spawned = fx.events(&fx.group_dir()).iter().filter(|e| e["event"] == "engine_spawned").count();
    assert_eq!((spawned, fx.engine_starts()), (1, 1), "one engine, started once");
    let hs = fx.host_status();
    assert_eq!(hs["run_tag"], fx.group_tag.as_str());
    assert_eq!(class(&hs), "finished", "{hs:#}");
    let gpu = &hs["gpu_time"];
    assert_eq!(gpu["gpus"], 2);
    assert_eq!(gpu["legs"].as_array().map(Vec::len), Some(3), "{gpu:#}");
    assert!(gpu["load_s"].as_f64().unwrap() > 0.3 && gpu["serving_s"].as_f64().unwrap() > 0.0, "{gpu:#}");
    assert_eq!(fx.secret_hits(), Vec::<String>::new(), "secrets in records or logs");
    fx.assert_no_orphans(&host);
}

#[test]
fn a_leg_without_its_dataset_or_with_an_unreadable_spec_is_refused_and_the_others_finish() {
    let mut fx = Shared::new("refuse", &["0.05", "0.05", "0.05"]);
    let mut missing = fx.leg_spec(&fx.legs[2], "0.05");
    missing["harbor"]["dataset"] = json!(fx.root.join("no-such-dataset"));
    fx.write_leg(&fx.legs[2].clone(), &missing);
    let broken = format!("refuse-broken-{}", unique());
    std::fs::create_dir_all(fx.run_dir(&broken)).unwrap();
    std::fs::write(fx.run_dir(&broken).join("launch.json"), "{ not json").unwrap();
    fx.legs.push(broken);
    fx.write_shared();
    let mut host = fx.start();
    let code = host.wait(&fx);
    assert_eq!(code, 2, "the most severe leg's code (spec)\n{}", fx.stderr());
    assert_eq!((class(&fx.leg(0)), class(&fx.leg(1))), ("finished", "finished"));
    let refused = fx.leg(2);
    assert_eq!(class(&refused), "spec", "{refused:#}");
    assert!(refused["outcome"]["message"].as_str().unwrap().contains("harbor.dataset"), "{refused:#}");
    let unreadable = fx.leg(3);
    assert_eq!((class(&unreadable), unreadable["outcome"]["cause"].as_str()), ("spec", Some("refused")));
    assert!(unreadable["outcome"]["message"].as_str().unwrap().contains("legs[3]"), "{unreadable:#}");
    assert_eq!(fx.engine_starts(), 1);
    fx.assert_no_orphans(&host);
}

#[test]
fn a_cancel_request_stops_that_leg_only() {
    let fx = Shared::new("cancel", &["0.3", "3", "0.3"]);
    let mut host = fx.start();
    fx.wait_for("leg 1 running", || fx.leg(1)["phase"] == "running");
    std::fs::write(fx.run_dir(&fx.legs[1]).join("cancel.request"), "submitter cancel (test)\n").unwrap();
    let code = host.wait(&fx);
    let cancelled = fx.leg(1);
    assert_eq!(
        (class(&cancelled), cancelled["outcome"]["cause"].as_str()),
        ("interrupted", Some("cancel_requested")),
        "{cancelled:#}"
    );
    assert_eq!((class(&fx.leg(0)), class(&fx.leg(2))), ("finished", "finished"));
    assert_eq!(code, 130, "the host exits with the cancelled leg's code\n{}", fx.stderr());
    fx.assert_no_orphans(&host);
}

/// Issue 32 item 8: a leg's payload killed with SIGKILL (the OOM killer) is recorded by the host
/// as `interrupted` (`cause: leg_killed`, the signal) with the shared job's Slurm job id — the
/// submitter folds in only a record naming the attempt's job — not as `spec`/`refused` without one.
#[test]
fn a_leg_killed_with_sigkill_is_recorded_with_its_job_id() {
    let fx = Shared::new("sigkill", &["0.3", "3", "0.3"]);
    let mut host = fx.start_as_job("4242");
    fx.wait_for("leg 1 running", || fx.leg(1)["phase"] == "running");
    let spawned = fx.events(&fx.group_dir());
    let pid = spawned
        .iter()
        .find(|e| e["event"] == "leg_spawned" && e["fields"]["run_tag"] == fx.legs[1].as_str())
        .and_then(|e| e["fields"]["pid"].as_i64())
        .expect("leg 1's pid") as i32;
    send_signal(pid, "KILL");
    let code = host.wait(&fx);
    let killed = fx.leg(1);
    assert_eq!(
        (class(&killed), killed["outcome"]["cause"].as_str(), killed["outcome"]["signal"].as_str()),
        ("interrupted", Some("leg_killed"), Some("SIGKILL")),
        "{killed:#}\n{}",
        fx.stderr()
    );
    assert_eq!(killed["slurm_job_id"], "4242", "{killed:#}");
    assert_eq!((class(&fx.leg(0)), class(&fx.leg(2))), ("finished", "finished"));
    assert_eq!(fx.leg(0)["slurm_job_id"], "4242");
    assert_ne!(code, 0, "{}", fx.stderr());
    fx.assert_no_orphans(&host);
}

#[test]
fn the_engine_killed_ends_every_leg_as_engine_died() {
    let fx = Shared::new("killed", &["3", "3", "3"]);
    let mut host = fx.start();
    fx.wait_for("every leg running", || (0..3).all(|i| fx.leg(i)["phase"] == "running"));
    let engine = fx.host_status()["pids"]["engine"].as_i64().expect("engine pid") as i32;
    send_signal(engine, "KILL");
    let code = host.wait(&fx);
    assert_eq!(code, 12, "engine_died\n{}", fx.stderr());
    for i in 0..3 {
        assert_eq!(class(&fx.leg(i)), "engine_died", "leg {i}: {:#}", fx.leg(i));
    }
    assert_eq!(class(&fx.host_status()), "engine_died");
    fx.assert_no_orphans(&host);
}

#[test]
fn walltime_winds_every_leg_down_and_a_rerun_resumes_only_the_unfinished() {
    let fx = Shared::new("walltime", &["0.05", "4", "4"]);
    // A leg that may only start fresh: finished, it is still left alone (never refused and rewritten).
    let mut fresh_only = fx.leg_spec(&fx.legs[0], "0.05");
    fresh_only["harbor"]["start"] = json!("fresh");
    fx.write_leg(&fx.legs[0], &fresh_only);
    let mut host = fx.start();
    fx.wait_for("leg 0 finished and legs 1, 2 running", || {
        class(&fx.leg(0)) == "finished" && fx.leg(1)["phase"] == "running" && fx.leg(2)["phase"] == "running"
    });
    send_signal(host.pid, "USR1");
    let code = host.wait(&fx);
    assert_eq!(code, 15, "walltime\n{}", fx.stderr());
    assert_eq!((class(&fx.leg(1)), class(&fx.leg(2))), ("walltime", "walltime"));
    fx.assert_no_orphans(&host);
    let finished_before = std::fs::read(fx.run_dir(&fx.legs[0]).join("status.json")).unwrap();

    let mut again = fx.start();
    let code = again.wait(&fx);
    assert_eq!(code, 0, "the rerun finishes what was left\n{}", fx.stderr());
    for i in 1..3 {
        let s = fx.leg(i);
        assert_eq!((class(&s), s["resume"].as_bool()), ("finished", Some(true)), "leg {i} resumed: {s:#}");
    }
    assert_eq!(
        std::fs::read(fx.run_dir(&fx.legs[0]).join("status.json")).unwrap(),
        finished_before,
        "a finished leg is never re-run"
    );
    let skipped = fx.events(&fx.group_dir()).into_iter().filter(|e| e["event"] == "leg_skipped").count();
    assert_eq!(skipped, 1);
    fx.assert_no_orphans(&again);
}

/// scancel: Slurm sends TERM to every process of the job, the host and each leg's payload, not
/// necessarily at the same instant. A leg that already began its teardown is not signalled again by
/// the host (a second TERM would mean "kill Harbor at once"): here each leg gets TERM first, its
/// Harbor ignores SIGINT (so the leg stays `stopping` for its Harbor grace), then the host gets
/// its TERM; no leg may end "killed at once".
#[test]
fn term_to_every_process_of_the_job_stops_each_leg_gracefully_once() {
    let fx = Shared::new("scancel", &["3", "3"]);
    for tag in &fx.legs {
        let mut spec = fx.leg_spec(tag, "3");
        spec["harbor"]["env"]["STANDIN_IGNORE_SIGINT"] = json!("1");
        fx.write_leg(tag, &spec);
    }
    let mut host = fx.start();
    fx.wait_for("both legs running", || (0..2).all(|i| fx.leg(i)["phase"] == "running"));
    let legs: Vec<i32> = (0..2).map(|i| fx.leg(i)["pids"]["payload"].as_i64().unwrap() as i32).collect();
    for pid in &legs {
        send_signal(*pid, "TERM");
    }
    fx.wait_for("both legs stopping", || (0..2).all(|i| fx.leg(i)["phase"] != "running"));
    send_signal(host.pid, "TERM");
    let code = host.wait(&fx);
    assert_eq!(code, 143, "{}", fx.stderr());
    for i in 0..2 {
        let s = fx.leg(i);
        assert_eq!((class(&s), s["outcome"]["signal"].as_str()), ("interrupted", Some("SIGTERM")), "leg {i}: {s:#}");
        let msg = s["outcome"]["message"].as_str().unwrap();
        assert!(!msg.contains("second signal"), "leg {i} was signalled twice: {msg}");
    }
    fx.assert_no_orphans(&host);
}

/// TERM to the host alone (a user's `kill`): forwarded to every leg, each ends `interrupted`.
#[test]
fn term_to_the_host_is_forwarded_to_every_leg() {
    let fx = Shared::new("hostterm", &["3", "3"]);
    let mut host = fx.start();
    fx.wait_for("both legs running", || (0..2).all(|i| fx.leg(i)["phase"] == "running"));
    send_signal(host.pid, "TERM");
    let code = host.wait(&fx);
    assert_eq!(code, 143, "{}", fx.stderr());
    for i in 0..2 {
        let s = fx.leg(i);
        assert_eq!((class(&s), s["outcome"]["signal"].as_str()), ("interrupted", Some("SIGTERM")), "leg {i}: {s:#}");
    }
    fx.assert_no_orphans(&host);
}

/// A pool (issue 37, docs/pools.md) at walltime: the member running winds down `walltime`, the
/// members not started keep no `status.json` (the submitter's sync continues them in another
/// pool), payload exits 15 and nothing is left. Also by the batch script's `--pool`. The stand-in
/// engine has no dev routes: the walltime comes before any swap.
#[test]
fn a_pool_at_walltime_leaves_the_members_not_started_without_a_record() {
    let fx = Shared::new("poolwt", &["30", "0.05", "0.05"]);
    let members: Vec<Value> = fx
        .legs
        .iter()
        .enumerate()
        .map(|(i, tag)| {
            let weights = fx.root.join("weights").join(format!("m{i}"));
            std::fs::create_dir_all(&weights).unwrap();
            std::fs::write(weights.join("config.json"), "{}").unwrap();
            let launch = fx.run_dir(tag).join("launch.json");
            let spec: Value = serde_json::from_str(&std::fs::read_to_string(&launch).unwrap()).unwrap();
            json!({"model": spec["model"]["hf_id"], "weights": {"path": weights, "kind": "full"}, "legs": [launch]})
        })
        .collect();
    let pool = fx.group_dir().join("pool.json");
    let doc = json!({"version": 1, "group_tag": fx.group_tag, "group_dir": fx.group_dir(), "members": members});
    std::fs::write(&pool, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    let mut cmd = Command::new("bash");
    cmd.args([SCRIPT, "--pool", pool.to_str().unwrap()]);
    let mut host = fx.spawn(cmd);
    fx.wait_for("member 0's leg running", || fx.leg(0)["phase"] == "running");
    let engine = fx.host_status()["pids"]["engine"].as_u64().unwrap_or(0);
    let argv = std::fs::read(format!("/proc/{engine}/cmdline")).unwrap_or_default();
    let argv = String::from_utf8_lossy(&argv).replace('\0', " ");
    assert!(argv.contains("--worker-extension-cls evalci_pool_ext.PoolWorkerExtension"), "{argv}");
    assert!(argv.contains("--host 127.0.0.1"), "a pool's engine binds loopback: {argv}");
    send_signal(host.pid, "USR1");
    let code = host.wait(&fx);
    assert_eq!(code, 15, "walltime\n{}", fx.stderr());
    assert_eq!(class(&fx.leg(0)), "walltime", "{:#}", fx.leg(0));
    for i in 1..3 {
        let status = fx.run_dir(&fx.legs[i]).join("status.json");
        assert!(!status.exists(), "member {i} was never started: no record, so it is continued elsewhere");
    }
    assert_eq!(fx.engine_starts(), 1);
    fx.assert_no_orphans(&host);
}
