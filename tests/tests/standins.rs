//! Tests of the vLLM and Harbor stand-ins themselves (test support programs).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use e2e::harness::free_port;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const VLLM: &str = env!("CARGO_BIN_EXE_vllm-standin");
const HARBOR: &str = env!("CARGO_BIN_EXE_harbor-standin");
const MODEL_INFO: &str = r#"model_info={"max_input_tokens":4096,"max_output_tokens":1024,"input_cost_per_token":0,"output_cost_per_token":0}"#;

struct Vllm {
    child: Child,
    port: u16,
    out: PathBuf,
    err: PathBuf,
}

impl Vllm {
    fn start(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Vllm {
        let port = free_port();
        let out = dir.join(format!("vllm-{port}.out"));
        let err = dir.join(format!("vllm-{port}.err"));
        let mut cmd = Command::new(VLLM);
        cmd.args([
            "serve",
            "Qwen/Qwen3-8B",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--served-model-name",
            "q8",
        ])
        .args(extra)
        .env_remove("VLLM_API_KEY")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env("STANDIN_LOAD_SECONDS", "0.05")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().unwrap();
        Vllm { child, port, out, err }
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("vllm-standin exited early: {st}\n{}", self.stderr());
            }
            if get(&format!("{}/health", self.base()), None).map(|(s, _)| s) == Some(200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("vllm-standin not ready");
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    fn signal(&self, sig: &str) {
        Command::new("kill").args([&format!("-{sig}"), &self.child.id().to_string()]).status().unwrap();
    }

    fn wait_exit(&mut self, secs: u64) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Vllm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent(timeout: f64) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs_f64(timeout)))
        .http_status_as_error(false)
        .build()
        .into()
}

fn get(url: &str, key: Option<&str>) -> Option<(u16, String)> {
    let mut req = agent(2.0).get(url);
    if let Some(k) = key {
        req = req.header("Authorization", &format!("Bearer {k}"));
    }
    let mut r = req.call().ok()?;
    Some((r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default()))
}

fn post(url: &str, key: Option<&str>, body: &Value, timeout: f64) -> Option<(u16, Value)> {
    let mut req = agent(timeout).post(url);
    if let Some(k) = key {
        req = req.header("Authorization", &format!("Bearer {k}"));
    }
    let mut r = req.send_json(body).ok()?;
    let text = r.body_mut().read_to_string().unwrap_or_default();
    Some((r.status().as_u16(), serde_json::from_str(&text).unwrap_or(Value::String(text))))
}

fn chat(v: &Vllm, key: Option<&str>) -> Option<(u16, Value)> {
    post(
        &format!("{}/v1/chat/completions", v.base()),
        key,
        &json!({"model": "q8", "messages": [{"role": "user", "content": "hi"}]}),
        3.0,
    )
}

fn run(bin: &str, args: &[&str], env: &[(&str, &str)], cwd: &Path) -> (i32, String, String) {
    let mut cmd = Command::new(bin);
    cmd.args(args).current_dir(cwd).stdin(Stdio::null());
    if bin == HARBOR {
        // The install these tests model has the daytona extra, like the clusters' (a test may unset it).
        cmd.env("STANDIN_EXTRAS", "daytona");
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

fn dataset(dir: &Path, tasks: &[&str]) -> PathBuf {
    let ds = dir.join("ds");
    for t in tasks {
        std::fs::create_dir_all(ds.join(t)).unwrap();
        std::fs::write(ds.join(t).join("instruction.md"), format!("Solve {t}\n")).unwrap();
    }
    ds
}

fn trial_dirs(job: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(job).unwrap().filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_dir()).collect();
    v.sort();
    v
}

// ------------------------------------------------------------------- vLLM

#[test]
fn vllm_serves_vllm_shapes_and_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let mut v = Vllm::start(
        tmp.path(),
        &["--max-model-len", "4096", "--hf-overrides", r#"{"rope_scaling":null}"#, "-tp", "2"],
        &[("VLLM_API_KEY", "sek")],
    );
    v.wait_ready();
    let (s, body) = get(&format!("{}/health", v.base()), None).unwrap();
    assert_eq!((s, body.as_str()), (200, ""));
    // /v1 needs the key.
    let (s, body) = get(&format!("{}/v1/models", v.base()), None).unwrap();
    assert_eq!(s, 401);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), json!({"error": "Unauthorized"}));
    let (s, body) = get(&format!("{}/v1/models", v.base()), Some("sek")).unwrap();
    assert_eq!(s, 200);
    let models: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "q8");
    assert_eq!(models["data"][0]["owned_by"], "vllm");
    assert_eq!(models["data"][0]["max_model_len"], 4096);
    assert_eq!(models["data"][0]["root"], "Qwen/Qwen3-8B");
    let (s, r) = chat(&v, Some("sek")).unwrap();
    assert_eq!(s, 200);
    assert_eq!(r["object"], "chat.completion");
    assert!(r["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let u = &r["usage"];
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );
    let (s, r) = post(
        &format!("{}/v1/completions", v.base()),
        Some("sek"),
        &json!({"model": "q8", "prompt": "hello", "max_tokens": 4}),
        3.0,
    )
    .unwrap();
    assert_eq!(s, 200);
    assert_eq!(r["object"], "text_completion");
    assert_eq!(r["usage"]["completion_tokens"], 4);
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    // Context overflow: vLLM's 400.
    let body = json!({"model": "q8", "max_tokens": 5000, "messages": [{"role": "user", "content": "hi"}]});
    let (s, r) = post(&format!("{}/v1/chat/completions", v.base()), Some("sek"), &body, 3.0).unwrap();
    assert_eq!(s, 400);
    assert_eq!(r["error"]["type"], "BadRequestError");
    assert_eq!(r["error"]["code"], 400);
    assert_eq!(r["error"]["param"], "max_tokens");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.starts_with("'max_tokens' or 'max_completion_tokens' is too large: 5000. This model's maximum context length is 4096 tokens"), "{msg}");
    let long = "x".repeat(20000);
    let body = json!({"model": "q8", "messages": [{"role": "user", "content": long}]});
    let (s, r) = post(&format!("{}/v1/chat/completions", v.base()), Some("sek"), &body, 3.0).unwrap();
    assert_eq!(s, 400);
    assert!(r["error"]["message"].as_str().unwrap().contains("However, your prompt contains"));
    // Unknown model: 404 NotFoundError.
    let (s, r) =
        post(&format!("{}/v1/chat/completions", v.base()), Some("sek"), &json!({"model": "nope", "messages": []}), 3.0)
            .unwrap();
    assert_eq!(s, 404);
    assert_eq!(r["error"]["type"], "NotFoundError");
    // Prometheus metrics with vLLM's names.
    let (s, m) = get(&format!("{}/metrics", v.base()), None).unwrap();
    assert_eq!(s, 200);
    for needle in [
        "# TYPE vllm:num_requests_running gauge",
        "vllm:num_requests_running{model_name=\"q8\",engine=\"0\"} 0.0",
        "vllm:num_requests_waiting{model_name=\"q8\",engine=\"0\"} 0.0",
        "# TYPE vllm:prompt_tokens_total counter",
        "# TYPE vllm:generation_tokens_total counter",
        "vllm:request_success_total{model_name=\"q8\",engine=\"0\",finished_reason=\"stop\"} 1.0",
        "vllm:request_success_total{model_name=\"q8\",engine=\"0\",finished_reason=\"length\"} 1.0",
        "http_requests_total{handler=\"/v1/chat/completions\",method=\"POST\",status=\"2xx\"} 1.0",
        "http_requests_total{handler=\"/v1/chat/completions\",method=\"POST\",status=\"4xx\"} 3.0",
        "http_requests_total{handler=\"/v1/models\",method=\"GET\",status=\"4xx\"} 1.0",
    ] {
        assert!(m.contains(needle), "missing {needle} in\n{m}");
    }
    assert!(!m.contains("handler=\"/health\""));
    // Logs: vLLM's format on stdout, uvicorn on stderr, access lines on stdout.
    let out = v.stdout();
    let err = v.stderr();
    let re_prefix = format!("(APIServer pid={}) INFO ", v.child.id());
    assert!(
        out.lines().any(|l| l.starts_with(&re_prefix)
            && l.contains("[startup.py:33] vLLM server version 0.33.0, serving model Qwen/Qwen3-8B")),
        "{out}"
    );
    assert!(out.contains(&format!("Starting vLLM server on http://127.0.0.1:{}", v.port)));
    assert!(out.contains("'hf_overrides': {\"rope_scaling\":null}"));
    assert!(err.contains("INFO:     Application startup complete."));
    assert!(
        out.lines()
            .any(|l| l.starts_with("INFO:     127.0.0.1:")
                && l.ends_with("- \"POST /v1/chat/completions HTTP/1.1\" 200 OK")),
        "{out}"
    );
    assert!(out.lines().any(|l| l.ends_with("\"POST /v1/chat/completions HTTP/1.1\" 400 Bad Request")));
    assert!(out.lines().any(|l| l.ends_with("\"GET /v1/models HTTP/1.1\" 401 Unauthorized")));
    // SIGTERM: shutdown lines, exit 0.
    v.signal("TERM");
    let st = v.wait_exit(5).expect("exits on SIGTERM");
    assert_eq!(st.code(), Some(0));
    assert!(v.stdout().contains("[shutdown] API server: shutdown triggered"));
    assert!(v.stderr().contains("INFO:     Finished server process"));
}

#[test]
fn vllm_argparse_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, _, err) = run(VLLM, &["serve", "m", "--foo", "1"], &[], tmp.path());
    assert_eq!(code, 2);
    assert!(err.ends_with("\nvllm: error: unrecognized arguments: --foo 1\n"), "{err}");
    assert!(err.starts_with("usage: vllm [-h] [-v]\n"), "{err}");
    // vLLM 0.33 has no --swap-space; the legacy style accepts it.
    let (code, _, err) = run(VLLM, &["serve", "m", "--swap-space", "16"], &[], tmp.path());
    assert_eq!(code, 2);
    assert!(err.contains("unrecognized arguments: --swap-space 16"));
    let (code, _, err) = run(VLLM, &["serve", "m", "--port", "x"], &[], tmp.path());
    assert_eq!(code, 2);
    assert!(err.contains("vllm serve: error: argument --port: invalid int value: 'x'"));
    let (code, _, err) = run(VLLM, &["serve", "m", "--limit-mm-per-prompt", "image=1"], &[], tmp.path());
    assert_eq!(code, 2);
    assert!(err.contains("argument --limit-mm-per-prompt: Value image=1 cannot be converted"));
    // A JSON value split over two argv elements leaves an unrecognized piece.
    let (code, _, err) = run(VLLM, &["serve", "m", "--hf-overrides", "{\"a\":", "1}"], &[], tmp.path());
    assert_eq!(code, 2);
    assert!(err.contains("unrecognized arguments: 1}"), "{err}");
    // --enable-auto-tool-choice needs --tool-call-parser (not the other way round).
    let (code, _, err) = run(VLLM, &["serve", "m", "--enable-auto-tool-choice"], &[], tmp.path());
    assert_eq!(code, 1);
    assert!(err.ends_with("TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser\n"));
    let (code, _, err) =
        run(VLLM, &["serve", "m", "--enable-auto-tool-choice", "--tool-call-parser", "nonsense"], &[], tmp.path());
    assert_eq!(code, 1);
    assert!(err.contains("KeyError: 'invalid tool call parser: nonsense (chose from {"));
}

#[test]
fn vllm_start_failures_print_real_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        ("oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB."),
        ("kv_cache", "KV cache is needed, which is larger than the available KV cache memory"),
        ("world_size", "World size (1) is larger than the number of available GPUs"),
        (
            "model_type",
            "The checkpoint you are trying to load has model type `qwen3_5` but Transformers does not recognize this architecture.",
        ),
        ("other", "RuntimeError: Engine core initialization failed. See root cause above."),
    ];
    for (mode, needle) in cases {
        let port = free_port().to_string();
        let env = [("STANDIN_FAIL_AT_START", mode), ("STANDIN_FAIL_DELAY", "0"), ("STANDIN_LOAD_SECONDS", "0")];
        let (code, out, err) = run(VLLM, &["serve", "m", "--port", &port], &env, tmp.path());
        assert_eq!(code, 1, "{mode}");
        assert!(out.contains(needle) || err.contains(needle), "{mode}: {out}\n{err}");
    }
    let (code, _, err) = run(
        VLLM,
        &["serve", "m", "--port", &free_port().to_string()],
        &[("STANDIN_FAIL_AT_START", "kv_cache"), ("STANDIN_VLLM_STYLE", "legacy"), ("STANDIN_LOAD_SECONDS", "0")],
        tmp.path(),
    );
    assert_eq!(code, 1);
    assert!(err.contains("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored in KV cache (16384). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."));
    // TP against CUDA_VISIBLE_DEVICES, DP shards against the visible devices.
    let (code, _, err) = run(
        VLLM,
        &["serve", "m", "-tp", "4", "--port", &free_port().to_string()],
        &[("CUDA_VISIBLE_DEVICES", "0")],
        tmp.path(),
    );
    assert_eq!(code, 1);
    assert!(err.contains("World size (4) is larger than the number of available GPUs (1) in this node."));
    let (code, _, err) = run(
        VLLM,
        &["serve", "m", "-tp", "2", "-dp", "2", "--port", &free_port().to_string()],
        &[("CUDA_VISIBLE_DEVICES", "0,1")],
        tmp.path(),
    );
    assert_eq!(code, 1);
    assert!(err.contains("Error computing device indices for CUDA_VISIBLE_DEVICES: local range: [2, 4)"));
    let (code, _, _) = run(
        VLLM,
        &["serve", "m", "-tp", "8", "--port", &free_port().to_string()],
        &[("STANDIN_GPUS", "8"), ("STANDIN_LOAD_SECONDS", "0"), ("STANDIN_FAIL_AT_START", "oom")],
        tmp.path(),
    );
    assert_eq!(code, 1);
    // Port already taken.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let (code, _, err) = run(VLLM, &["serve", "m", "--host", "127.0.0.1", "--port", &port], &[], tmp.path());
    assert_eq!(code, 1);
    assert!(err.ends_with("OSError: [Errno 98] Address already in use\n"), "{err}");
}

#[test]
fn vllm_refuses_connections_while_loading() {
    let tmp = tempfile::tempdir().unwrap();
    let mut v = Vllm::start(tmp.path(), &[], &[("STANDIN_LOAD_SECONDS", "1.5")]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(get(&format!("{}/health", v.base()), None).is_none(), "health must not be served while loading");
    v.wait_ready();
}

#[test]
fn vllm_bad_request_after_and_die_after() {
    let tmp = tempfile::tempdir().unwrap();
    let mut v =
        Vllm::start(tmp.path(), &[], &[("STANDIN_BAD_REQUEST_AFTER", "1"), ("STANDIN_DIE_AFTER_REQUESTS", "3")]);
    v.wait_ready();
    assert_eq!(chat(&v, None).unwrap().0, 200);
    let (s, r) = chat(&v, None).unwrap();
    assert_eq!(s, 400);
    assert!(r["error"]["message"].as_str().unwrap().contains("maximum context length"));
    let _ = chat(&v, None);
    let st = v.wait_exit(5).expect("dies after 3 completion requests");
    assert_eq!(st.code(), Some(1));
    assert!(v.stdout().contains("EngineCore encountered a fatal error."));
}

#[test]
fn vllm_control_file_and_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let control = tmp.path().join("control");
    std::fs::write(&control, "normal\n").unwrap();
    let mut v = Vllm::start(tmp.path(), &[], &[("STANDIN_CONTROL_FILE", control.to_str().unwrap())]);
    v.wait_ready();
    assert_eq!(chat(&v, None).unwrap().0, 200);
    std::fs::write(&control, "bad_request").unwrap();
    assert_eq!(chat(&v, None).unwrap().0, 400);
    std::fs::write(&control, "hang").unwrap();
    assert!(chat(&v, None).is_none(), "hung server answers nothing");
    assert!(get(&format!("{}/health", v.base()), None).is_none());
    assert!(v.child.try_wait().unwrap().is_none(), "still alive while hung");
    v.signal("TERM");
    assert_eq!(v.wait_exit(5).and_then(|s| s.code()), Some(0));

    let mut v = Vllm::start(tmp.path(), &[], &[("STANDIN_HANG_AFTER_REQUESTS", "1")]);
    v.wait_ready();
    assert_eq!(chat(&v, None).unwrap().0, 200);
    assert!(chat(&v, None).is_none());
    assert!(v.child.try_wait().unwrap().is_none());

    std::fs::write(&control, "die").unwrap();
    let mut v = Vllm::start(tmp.path(), &[], &[("STANDIN_CONTROL_FILE", control.to_str().unwrap())]);
    std::thread::sleep(Duration::from_millis(400));
    let _ = get(&format!("{}/health", v.base()), None);
    assert_eq!(v.wait_exit(5).and_then(|s| s.code()), Some(1));
}

/// A stalled engine core: completions are scheduled and never answered, no token moves, while
/// `/health`, `/v1/models` and `/metrics` go on answering (what payload's liveness rule must catch).
#[test]
fn vllm_stall_keeps_answering_health_and_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let mut v = Vllm::start(tmp.path(), &[], &[("STANDIN_STALL_AFTER_REQUESTS", "1")]);
    v.wait_ready();
    assert_eq!(chat(&v, None).unwrap().0, 200);
    let metric = |name: &str| -> f64 {
        let (_, text) = get(&format!("{}/metrics", v.base()), None).unwrap();
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let tokens = metric("vllm:generation_tokens_total");
    assert!(tokens > 0.0);
    let base = v.base();
    let stuck = std::thread::spawn(move || {
        post(
            &format!("{base}/v1/chat/completions"),
            None,
            &json!({"model": "q8", "messages": [{"role": "user", "content": "hi"}]}),
            1.5,
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(metric("vllm:num_requests_running"), 1.0, "the stalled request is in the running batch");
    assert_eq!(metric("vllm:generation_tokens_total"), tokens, "no token after the stall");
    assert_eq!(get(&format!("{}/health", v.base()), None).map(|r| r.0), Some(200));
    assert_eq!(get(&format!("{}/v1/models", v.base()), None).map(|r| r.0), Some(200));
    assert!(stuck.join().unwrap().is_none(), "the stalled completion is never answered");
    v.signal("TERM");
    assert_eq!(v.wait_exit(5).and_then(|s| s.code()), Some(0));
}

/// The contract behind payload's liveness rule: the metric names it reads (`payload::liveness`) are
/// the ones the installed real vLLM defines (`vllm/v1/metrics/loggers.py`: a Prometheus counter is
/// exported with `_total`), with the same type, and the stand-in exports exactly those families.
/// Skipped with a note when the vLLM venv is absent (`scripts/install-vllm.sh`; CI installs it).
#[test]
fn standin_metric_names_are_real_vllms() {
    use payload::liveness::{GENERATION_TOKENS, KV_CACHE_USAGE, PROMPT_TOKENS, RUNNING, WAITING};
    let venv = match e2e::vllm_oracle::venv(&launch_spec::versions::VERIFIED_VLLM.to_string(), true) {
        Ok(v) => v,
        Err(why) => {
            eprintln!("SKIP: the real vLLM is not installed: {why}");
            return;
        }
    };
    let lib = std::fs::read_dir(venv.join("lib"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("site-packages/vllm/v1/metrics/loggers.py"))
        .find(|p| p.is_file())
        .expect("vllm/v1/metrics/loggers.py in the venv");
    let source = std::fs::read_to_string(&lib).unwrap();
    // `self._gauge_cls(\n name="vllm:…"` → (exported name, type).
    let defined = regex::Regex::new(r#"self\._(gauge|counter)_cls\(\s*name="(vllm:[a-z_]+)""#).unwrap();
    let real: BTreeMap<String, &str> = defined
        .captures_iter(&source)
        .map(|c| {
            let (kind, name) = (c.get(1).unwrap().as_str(), c.get(2).unwrap().as_str());
            match kind {
                "counter" => (format!("{name}_total"), "counter"),
                _ => (name.to_string(), "gauge"),
            }
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let mut v = Vllm::start(tmp.path(), &[], &[]);
    v.wait_ready();
    let (_, text) = get(&format!("{}/metrics", v.base()), None).unwrap();
    for (name, kind) in [
        (RUNNING, "gauge"),
        (WAITING, "gauge"),
        (GENERATION_TOKENS, "counter"),
        (PROMPT_TOKENS, "counter"),
        (KV_CACHE_USAGE, "gauge"),
    ] {
        assert_eq!(real.get(name).copied(), Some(kind), "{name} in {} ({} names found)", lib.display(), real.len());
        // The stand-in declares the family by its base name (prometheus_client's `# TYPE` line).
        let base = name.strip_suffix("_total").unwrap_or(name);
        let declared =
            text.contains(&format!("# TYPE {name} {kind}")) || text.contains(&format!("# TYPE {base} {kind}"));
        assert!(
            declared && text.contains(&format!("\n{name}{{")),
            "the stand-in's /metrics lacks {name} ({kind}):\n{text}"
        );
    }
    v.signal("TERM");
    let _ = v.wait_exit(5);
}

#[test]
fn vllm_double_fork_and_ignored_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("grandchild.pid");
    let mut v = Vllm::start(
        tmp.path(),
        &[],
        &[
            ("STANDIN_DOUBLE_FORK", "1"),
            ("STANDIN_DOUBLE_FORK_PIDFILE", pidfile.to_str().unwrap()),
            ("STANDIN_IGNORE_SIGTERM", "1"),
        ],
    );
    v.wait_ready();
    let gpid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    let alive = |pid: i32| {
        Path::new(&format!("/proc/{pid}")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
    };
    assert!(alive(gpid));
    let stat = std::fs::read_to_string(format!("/proc/{gpid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    assert_eq!(fields[3], gpid.to_string(), "grandchild leads its own session (setsid)");
    Command::new("kill").args(["-TERM", &gpid.to_string()]).status().unwrap();
    v.signal("TERM");
    std::thread::sleep(Duration::from_millis(300));
    assert!(alive(gpid), "grandchild ignores SIGTERM");
    assert!(v.child.try_wait().unwrap().is_none(), "server ignores SIGTERM");
    Command::new("kill").args(["-KILL", &gpid.to_string()]).status().unwrap();
}

// ----------------------------------------------------------------- Harbor

#[test]
fn harbor_rejects_unknown_options_like_click() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, _, err) = run(HARBOR, &["jobs", "start", "--foo"], &[], tmp.path());
    assert_eq!(code, 2);
    assert!(err.contains("Usage: harbor-standin jobs start [OPTIONS]"), "{err}");
    assert!(err.contains("│ No such option: --foo"));
    let (code, _, err) = run(HARBOR, &["jobs", "start", "--job-nam", "x"], &[], tmp.path());
    assert_eq!(code, 2);
    assert!(err.contains("No such option: --job-nam (Possible options: --job-name, --jobs-dir)"), "{err}");
    let (code, _, err) = run(HARBOR, &["jobs", "start", "--jobs-dirr", "2"], &[], tmp.path());
    assert_eq!(code, 2);
    assert!(err.contains("No such option: --jobs-dirr Did you mean --jobs-dir?"), "{err}");
    let (code, _, err) = run(HARBOR, &["jobs", "start", "-n", "many"], &[], tmp.path());
    assert_eq!(code, 2);
    assert!(err.contains("Invalid value for '-n' / '--n-concurrent': 'many' is not a valid integer."));
    let (code, _, err) = run(HARBOR, &["jobs", "resume"], &[], tmp.path());
    assert_eq!(code, 2);
    assert!(err.contains("Missing option '-p' / '--job-path'."));
    let (code, _, err) = run(HARBOR, &["jobs", "resume", "-p", "x", "--n-concurrent", "3"], &[], tmp.path());
    assert_eq!(code, 2);
    assert!(err.contains("No such option: --n-concurrent"));
    let (code, _, err) = run(HARBOR, &["jobs", "frobnicate"], &[], tmp.path());
    assert_eq!(code, 2);
    assert!(err.contains("No such command 'frobnicate'."));
    let (code, out, _) = run(HARBOR, &["jobs", "start", "-h"], &[], tmp.path());
    assert_eq!(code, 0);
    assert!(out.contains("--force-build / --no-force-build") && out.contains("--ak, --agent-kwarg"));
}

fn start_args<'a>(ds: &'a str, base: &'a str, job: &'a str) -> Vec<&'a str> {
    vec![
        "jobs",
        "start",
        "-p",
        ds,
        "--n-concurrent",
        "2",
        "--env",
        "daytona",
        "--agent",
        "terminus-2",
        "--model",
        "hosted_vllm/q8",
        "--agent-kwarg",
        base,
        "--agent-kwarg",
        "temperature=0.7",
        "--agent-kwarg",
        MODEL_INFO,
        "--n-attempts",
        "2",
        "--job-name",
        job,
        "--jobs-dir",
        "jobs",
        "--timeout-multiplier",
        "2.0",
        "--override-memory-mb",
        "2048",
        "--export-traces",
        "--debug",
        "--no-force-build",
        "--ek",
        "auto_snapshot=true",
    ]
}

#[test]
fn harbor_runs_a_job_against_vllm_and_writes_harbors_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), &["task-a", "task-b", "task_c"]);
    std::fs::write(ds.join("task-b").join("reward"), "1\n").unwrap();
    let mut v = Vllm::start(tmp.path(), &["--max-model-len", "8192"], &[("VLLM_API_KEY", "k1")]);
    v.wait_ready();
    let base = format!("api_base={}/v1", v.base());
    let args = start_args("ds", &base, "J1");
    let env = [("HOSTED_VLLM_API_KEY", "k1"), ("STANDIN_TRIAL_SECONDS", "0.01")];
    let (code, out, err) = run(HARBOR, &args, &env, tmp.path());
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("Results written to jobs/J1/result.json"));
    assert!(out.contains("[traces] Exported 6 rows from jobs/J1"));
    let job = tmp.path().join("jobs/J1");
    let cfg = read_json(&job.join("config.json"));
    assert_eq!(cfg["job_name"], "J1");
    assert_eq!(cfg["n_attempts"], 2);
    assert_eq!(cfg["timeout_multiplier"], 2.0);
    assert_eq!(cfg["n_concurrent_trials"], 2);
    assert_eq!(
        cfg["environment"],
        json!({"type": "daytona", "override_memory_mb": 2048, "kwargs": {"auto_snapshot": true}})
    );
    assert_eq!(cfg["agents"][0]["name"], "terminus-2");
    assert_eq!(cfg["agents"][0]["model_name"], "hosted_vllm/q8");
    assert_eq!(cfg["agents"][0]["kwargs"]["api_base"], format!("{}/v1", v.base()));
    assert_eq!(cfg["agents"][0]["kwargs"]["model_info"]["max_input_tokens"], 4096);
    assert_eq!(cfg["datasets"], json!([{"path": "ds"}]));
    assert!(cfg.get("jobs_dir").is_none(), "default values are excluded (exclude_defaults=True)");
    let res = read_json(&job.join("result.json"));
    assert_eq!(res["n_total_trials"], 6);
    assert!(res["finished_at"].is_string());
    assert_eq!(res["stats"]["n_completed_trials"], 6);
    assert_eq!(res["stats"]["n_errored_trials"], 0);
    let ev = &res["stats"]["evals"]["terminus-2__q8__ds"];
    assert_eq!(ev["n_trials"], 6);
    assert_eq!(ev["n_errors"], 0);
    assert!(ev["metrics"][0]["mean"].as_f64().is_some());
    assert!(ev["pass_at_k"]["2"].as_f64().is_some());
    let trials = trial_dirs(&job);
    assert_eq!(trials.len(), 6);
    for t in &trials {
        let name = t.file_name().unwrap().to_string_lossy().to_string();
        let (task, id) = name.split_once("__").unwrap();
        assert!(["task-a", "task-b", "task_c"].contains(&task));
        assert_eq!(id.len(), 7);
        for f in ["config.json", "result.json", "trial.log", "lock.json", "agent", "verifier/reward.txt"] {
            assert!(t.join(f).exists(), "{} lacks {f}", t.display());
        }
        let tc = read_json(&t.join("config.json"));
        assert_eq!(tc["agent"]["kwargs"]["api_base"], format!("{}/v1", v.base()));
        assert_eq!(tc["trial_name"], name.as_str());
        let r = read_json(&t.join("result.json"));
        assert_eq!(r["task_name"], task);
        assert_eq!(r["trial_name"], name.as_str());
        assert!(r["exception_info"].is_null());
        assert!(r["agent_result"]["n_output_tokens"].as_u64().unwrap() > 0);
        assert!(r["agent_result"]["n_input_tokens"].as_u64().unwrap() > 0);
        assert!(r["agent_execution"]["started_at"].as_str().unwrap().ends_with('Z'));
        assert!(r["agent_execution"]["finished_at"].is_string());
        assert!(r["started_at"].is_string() && r["finished_at"].is_string());
        let reward = r["verifier_result"]["rewards"]["reward"].as_f64().unwrap();
        assert!(reward == 0.0 || reward == 1.0);
        if task == "task-b" {
            assert_eq!(reward, 1.0);
        }
        assert_eq!(r["agent_info"]["model_info"], json!({"name": "q8", "provider": "hosted_vllm"}));
    }
    // 2 turns per trial reached vLLM with the key.
    let (_, m) = get(&format!("{}/metrics", v.base()), None).unwrap();
    assert!(
        m.contains("http_requests_total{handler=\"/v1/chat/completions\",method=\"POST\",status=\"2xx\"} 12.0"),
        "{m}"
    );
}

#[test]
fn harbor_hosted_vllm_rules() {
    let tmp = tempfile::tempdir().unwrap();
    dataset(tmp.path(), &["t1", "t2"]);
    // No model_info: the trial dies at agent construction, before any request.
    let (code, _, err) = run(
        HARBOR,
        &terminus_job("hosted_vllm/q8", "nomi", &["--ak", "api_base=http://127.0.0.1:9/v1"]),
        &[],
        tmp.path(),
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("ValueError: hosted_vllm models require `model_info` specifying token limits and costs."),
        "{err}"
    );
    let job = tmp.path().join("jobs/nomi");
    assert!(job.join("config.json").exists());
    let res = read_json(&job.join("result.json"));
    assert!(res["finished_at"].is_null());
    for t in trial_dirs(&job) {
        assert!(!t.join("result.json").exists());
        assert!(
            std::fs::read_to_string(t.join("trial.log"))
                .unwrap()
                .contains("Model info is required when using hosted_vllm models.")
        );
    }
    // Names: one '/', [A-Za-z0-9._-]{1,64}.
    for (i, (model, needle)) in [
        ("hosted_vllm/org/q8", "hosted_vllm model names must contain exactly one '/'. Got 'hosted_vllm/org/q8'."),
        ("hosted_vllm/bad name", "hosted_vllm canonical model names may only contain letters, numbers, '.', '-', '_' and must be fewer than 64 characters with no spaces. Got 'bad name'."),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("bad{i}");
        let (code, _, err) = run(
            HARBOR,
            &terminus_job(model, &name, &["--ak", MODEL_INFO, "--ak", "api_base=http://127.0.0.1:9/v1"]),
            &[],
            tmp.path(),
        );
        assert_eq!(code, 1);
        assert!(err.contains(needle), "{err}");
    }
    let long = format!("hosted_vllm/{}", "a".repeat(65));
    let (code, _, _) = run(HARBOR, &terminus_job(&long, "long", &["--ak", MODEL_INFO]), &[], tmp.path());
    assert_eq!(code, 1);
    // Unknown agent names are refused up front.
    let (code, out, _) = run(HARBOR, &["jobs", "start", "-p", "ds", "-a", "terminus-9", "-o", "jobs"], &[], tmp.path());
    assert_eq!(code, 1);
    assert!(out.contains("Agent name terminus-9 is not valid."));
}

#[test]
fn harbor_yaml_config_is_merged_like_harbor() {
    let tmp = tempfile::tempdir().unwrap();
    dataset(tmp.path(), &["t1"]);
    let mut v = Vllm::start(tmp.path(), &[], &[]);
    v.wait_ready();
    let yaml = r#"
n_attempts: 1
timeout_multiplier: 1.0
orchestrator:
  type: local
  n_concurrent_trials: 3
  quiet: false
  retry:
    max_retries: 2
    exclude_exceptions: [AgentTimeoutError, ContextLengthExceededError]
environment:
  type: daytona
  force_build: true
  delete: true
agents:
  - name: terminus-2
    model_name: hosted_vllm/q8
    max_timeout_sec: 7200
    trajectory_config:
      raw_content: true
    kwargs:
      record_terminal_session: false
      model_info:
        max_input_tokens: 32768
        max_output_tokens: 16384
        input_cost_per_token: 0
        output_cost_per_token: 0
datasets:
  - path: ds
"#;
    std::fs::write(tmp.path().join("cfg.yaml"), yaml).unwrap();
    let base = format!("api_base={}/v1", v.base());
    let (code, out, err) = run(
        HARBOR,
        &["jobs", "start", "-c", "cfg.yaml", "--ak", &base, "--job-name", "Y", "-o", "jobs", "-q"],
        &[("STANDIN_TRIAL_SECONDS", "0")],
        tmp.path(),
    );
    assert_eq!(code, 0, "{out}{err}");
    let cfg = read_json(&tmp.path().join("jobs/Y/config.json"));
    assert_eq!(cfg["n_concurrent_trials"], 3, "orchestrator migrated to the top level");
    assert!(cfg.get("orchestrator").is_none());
    assert_eq!(cfg["retry"]["max_retries"], 2);
    assert_eq!(cfg["agents"][0]["kwargs"]["api_base"], format!("{}/v1", v.base()), "--ak merges into the YAML agent");
    assert_eq!(cfg["agents"][0]["kwargs"]["record_terminal_session"], false);
    assert_eq!(cfg["agents"][0]["max_timeout_sec"], 7200.0);
    assert!(cfg["agents"][0].get("trajectory_config").is_none(), "unknown AgentConfig keys are dropped");
    assert_eq!(cfg["environment"], json!({"type": "daytona", "force_build": true}));
}

#[test]
fn harbor_resume_uses_stored_api_base_and_filters_errors() {
    let tmp = tempfile::tempdir().unwrap();
    dataset(tmp.path(), &["t1", "t2"]);
    let dead = format!("api_base=http://127.0.0.1:{}/v1", free_port());
    let env = [("STANDIN_TRIAL_SECONDS", "0"), ("STANDIN_RETRY_SCALE", "0")];
    let mut args = start_args("ds", &dead, "R");
    args.truncate(22);
    let (code, out, err) = run(HARBOR, &args, &env, tmp.path());
    assert_eq!(code, 0, "{out}{err}");
    let job = tmp.path().join("jobs/R");
    let res = read_json(&job.join("result.json"));
    let ex = &res["stats"]["evals"]["terminus-2__q8__ds"]["exception_stats"]["InternalServerError"];
    assert_eq!(ex.as_array().unwrap().len(), 4);
    let first = trial_dirs(&job)[0].clone();
    let r = read_json(&first.join("result.json"));
    assert_eq!(r["exception_info"]["exception_type"], "InternalServerError");
    assert!(
        r["exception_info"]["exception_message"].as_str().unwrap().contains("Cannot connect to host 127.0.0.1:"),
        "{r:#}"
    );
    assert!(r["verifier_result"].is_null());
    // terminus-2 stores its totals however it ends: 0, not null.
    assert_eq!(r["agent_result"]["n_output_tokens"], 0);

    // Resuming with the stale address stored everywhere fails the same way.
    let (code, _, _) = run(HARBOR, &["jobs", "resume", "-p", "jobs/R", "-f", "InternalServerError"], &env, tmp.path());
    assert_eq!(code, 0);
    let res = read_json(&job.join("result.json"));
    assert_eq!(res["stats"]["n_errored_trials"], 4);

    // Rewriting only the job config makes harbor refuse the resume.
    let mut v = Vllm::start(tmp.path(), &[], &[]);
    v.wait_ready();
    let live = format!("{}/v1", v.base());
    let mut cfg = read_json(&job.join("config.json"));
    cfg["agents"][0]["kwargs"]["api_base"] = json!(live);
    std::fs::write(job.join("config.json"), serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    let (code, _, err) = run(HARBOR, &["jobs", "resume", "-p", "jobs/R"], &env, tmp.path());
    assert_eq!(code, 1);
    assert!(err.contains("ValueError: Existing trial config does not match planned job config."), "{err}");

    // Rewriting every trial config too: the filtered trials re-run against the live server.
    for t in trial_dirs(&job) {
        let p = t.join("config.json");
        if p.exists() {
            let mut tc = read_json(&p);
            tc["agent"]["kwargs"]["api_base"] = json!(live);
            std::fs::write(&p, serde_json::to_string_pretty(&tc).unwrap()).unwrap();
        }
    }
    // Still refused: Harbor 0.25's job lock records every trial's agent config, api_base included.
    let (code, _, err) = run(HARBOR, &["jobs", "resume", "-p", "jobs/R"], &env, tmp.path());
    assert_eq!(code, 1);
    assert!(err.contains("already has a lock.json that does not match the resolved job lock."), "{err}");
    let mut lock = read_json(&job.join("lock.json"));
    for t in lock["trials"].as_array_mut().unwrap() {
        t["agent"]["kwargs"]["api_base"] = json!(live);
    }
    std::fs::write(job.join("lock.json"), serde_json::to_string_pretty(&lock).unwrap()).unwrap();
    // A trial directory without result.json is deleted by harbor on resume.
    std::fs::create_dir_all(job.join("stray/agent")).unwrap();
    let (code, out, err) =
        run(HARBOR, &["jobs", "resume", "-p", "jobs/R", "-f", "InternalServerError"], &env, tmp.path());
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Removing trial directory with InternalServerError"));
    assert!(!job.join("stray").exists());
    let res = read_json(&job.join("result.json"));
    assert_eq!(res["stats"]["n_completed_trials"], 4);
    assert_eq!(res["stats"]["n_errored_trials"], 0);
    assert_eq!(res["n_total_trials"], 4);
}

/// terminus-2 summarises on a context overflow by default and goes on until its timeout
/// (`AgentTimeoutError`, then the verifier runs); with `enable_summarize=false` the overflow ends
/// the agent (`ContextLengthExceededError`, no verifier). Both checked against the real Harbor by
/// `tests/harbor_contract.rs` (`trial_dirs_read_alike_when_the_agent_errors`).
#[test]
fn harbor_context_overflow_becomes_trial_exception() {
    let tmp = tempfile::tempdir().unwrap();
    dataset(tmp.path(), &["t1"]);
    let mut v = Vllm::start(tmp.path(), &["--max-model-len", "2048"], &[("STANDIN_BAD_REQUEST_AFTER", "0")]);
    v.wait_ready();
    let base = format!("api_base={}/v1", v.base());
    for (job, extra, expect, verified) in [
        ("C", "enable_summarize=false", "ContextLengthExceededError", false),
        ("S", "enable_summarize=true", "AgentTimeoutError", true),
    ] {
        let args = terminus_job("hosted_vllm/q8", job, &["--ak", &base, "--ak", MODEL_INFO, "--ak", extra]);
        let (code, _, _) =
            run(HARBOR, &args, &[("STANDIN_TRIAL_SECONDS", "0"), ("STANDIN_AGENT_TIMEOUT", "1")], tmp.path());
        assert_eq!(code, 0);
        let t = trial_dirs(&tmp.path().join("jobs").join(job))[0].clone();
        let r = read_json(&t.join("result.json"));
        assert_eq!(r["exception_info"]["exception_type"], expect, "{r:#}");
        assert_eq!(r["verifier_result"].is_object(), verified, "{r:#}");
        assert_eq!(r["agent_result"]["n_output_tokens"], 0, "{r:#}");
    }
    assert!(v.stdout().contains("\"POST /v1/chat/completions HTTP/1.1\" 400 Bad Request"));
}

#[test]
fn harbor_sigterm_cancels_running_trials() {
    let tmp = tempfile::tempdir().unwrap();
    dataset(tmp.path(), &["t1", "t2", "t3"]);
    let mut v = Vllm::start(tmp.path(), &[], &[]);
    v.wait_ready();
    let base = format!("api_base={}/v1", v.base());
    let child = Command::new(HARBOR)
        .args(terminus_job("hosted_vllm/q8", "S", &["-n", "2", "--ak", &base, "--ak", MODEL_INFO]))
        .env("STANDIN_TRIAL_SECONDS", "5")
        .current_dir(tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let job = tmp.path().join("jobs/S");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && trial_dirs_with_config(&job) < 2 {
        std::thread::sleep(Duration::from_millis(20));
    }
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "KeyboardInterrupt: exit 130");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("Aborted."));
    let trials = trial_dirs(&job);
    assert_eq!(trials.len(), 2, "the third trial never started");
    for t in trials {
        let r = read_json(&t.join("result.json"));
        assert_eq!(r["exception_info"]["exception_type"], "CancelledError");
    }
    let res = read_json(&job.join("result.json"));
    assert!(res["finished_at"].is_null());
    assert_eq!(res["stats"]["n_cancelled_trials"], 2);
    assert_eq!(res["stats"]["n_pending_trials"], 1);
}

fn trial_dirs_with_config(job: &Path) -> usize {
    if !job.exists() {
        return 0;
    }
    trial_dirs(job).iter().filter(|t| t.join("config.json").exists()).count()
}

#[test]
fn harbor_crash_knob_exits_after_config() {
    let tmp = tempfile::tempdir().unwrap();
    dataset(tmp.path(), &["t1"]);
    let (code, _, err) = run(
        HARBOR,
        &["jobs", "start", "-p", "ds", "-a", "oracle", "--job-name", "K", "-o", "jobs"],
        &[("STANDIN_CRASH", "3")],
        tmp.path(),
    );
    assert_eq!(code, 3);
    assert!(err.starts_with("Traceback (most recent call last):"));
    let job = tmp.path().join("jobs/K");
    assert!(job.join("config.json").exists());
    assert!(trial_dirs(&job).is_empty());
    // The oracle agent needs no model and scores 1.
    let (code, out, err) = run(
        HARBOR,
        &["run", "-p", "ds", "-a", "oracle", "--job-name", "O", "-o", "jobs"],
        &[("STANDIN_TRIAL_SECONDS", "0")],
        tmp.path(),
    );
    assert_eq!(code, 0, "{out}{err}");
    let res = read_json(&tmp.path().join("jobs/O/result.json"));
    assert_eq!(res["stats"]["evals"]["oracle__ds"]["metrics"][0]["mean"], 1.0);
}

/// `jobs start -p ds -a terminus-2 -m MODEL --job-name JOB -o jobs [rest…]`.
fn terminus_job<'a>(model: &'a str, job: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let head = ["jobs", "start", "-p", "ds", "-a", "terminus-2", "-m", model, "--job-name", job, "-o", "jobs"];
    [&head[..], rest].concat()
}

/// [`terminus_job`] for `hosted_vllm/q8` with `--env daytona --ak <base> --ak MODEL_INFO -q [extra…]`.
fn small_job<'a>(base: &'a str, job: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    terminus_job(
        "hosted_vllm/q8",
        job,
        &[&["--env", "daytona", "--ak", base, "--ak", MODEL_INFO, "-q"][..], extra].concat(),
    )
}

#[test]
fn harbor_terminus2_refuses_unknown_options_after_print_config() {
    let tmp = tempfile::tempdir().unwrap();
    dataset(tmp.path(), &["t1"]);
    let base = "api_base=http://127.0.0.1:9/v1";
    let think = r#"extra_body={"chat_template_kwargs":{"enable_thinking":true}}"#;
    let (code, out, err) = run(HARBOR, &small_job(base, "U", &["--ak", think, "--ak", "parser=xml"]), &[], tmp.path());
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains(
            "Invalid kwargs for agent 'terminus-2':\n  Unknown option 'extra_body'.\n  Unknown option 'parser'.\nSee harbor agent schema terminus-2 for available options."
        ),
        "{out}"
    );
    assert!(!tmp.path().join("jobs/U").exists(), "nothing written");
    // --print-config resolves the config before the agent preflight: it prints and exits 0.
    let (code, out, err) = run(HARBOR, &small_job(base, "U", &["--ak", think, "--print-config"]), &[], tmp.path());
    assert_eq!(code, 0, "{out}{err}");
    let printed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(printed["agents"][0]["kwargs"]["extra_body"]["chat_template_kwargs"]["enable_thinking"], true);
    // Harbor 0.25's forms are accepted.
    let call = r#"llm_call_kwargs={"extra_body":{"chat_template_kwargs":{"enable_thinking":true}}}"#;
    let (code, out, _) = run(
        HARBOR,
        &small_job(base, "U", &["--ak", call, "--ak", "parser_name=xml", "--print-config"]),
        &[],
        tmp.path(),
    );
    assert_eq!(code, 0, "{out}");
}

#[test]
fn harbor_resume_compares_the_job_lock() {
    let tmp = tempfile::tempdir().unwrap();
    dataset(tmp.path(), &["t1", "t2"]);
    let mut v = Vllm::start(tmp.path(), &[], &[]);
    v.wait_ready();
    let base = format!("api_base={}/v1", v.base());
    let (code, out, err) = run(HARBOR, &small_job(&base, "L", &[]), &[("STANDIN_TRIAL_SECONDS", "0")], tmp.path());
    assert_eq!(code, 0, "{out}{err}");
    let job = tmp.path().join("jobs/L");
    let lock = read_json(&job.join("lock.json"));
    assert_eq!(lock["schema_version"], 3);
    let trials = lock["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 2);
    assert_eq!(trials[0]["agent"]["kwargs"]["api_base"], format!("{}/v1", v.base()));
    for t in trial_dirs(&job) {
        let own = read_json(&t.join("lock.json"));
        assert!(trials.contains(&own), "a trial lock equals its job-lock entry: {own}");
    }
    // The server moved and only the config.json files were rewritten: Harbor refuses the resume.
    let moved = "http://127.0.0.1:1/v1";
    let rewrite = |path: &Path, pointer: &str| {
        let mut value = read_json(path);
        if let Some(slot) = value.pointer_mut(pointer) {
            *slot = json!(moved);
        }
        std::fs::write(path, serde_json::to_string_pretty(&value).unwrap()).unwrap();
    };
    rewrite(&job.join("config.json"), "/agents/0/kwargs/api_base");
    for t in trial_dirs(&job) {
        rewrite(&t.join("config.json"), "/agent/kwargs/api_base");
    }
    let resume = ["jobs", "resume", "-p", "jobs/L"];
    let (code, out, err) = run(HARBOR, &resume, &[], tmp.path());
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("already has a lock.json that does not match the resolved job lock."), "{err}");
    // Rewriting the lock's agents too (what payload does) makes the resume pass.
    for i in 0..2 {
        rewrite(&job.join("lock.json"), &format!("/trials/{i}/agent/kwargs/api_base"));
    }
    let (code, out, err) = run(HARBOR, &resume, &[], tmp.path());
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn harbor_asks_before_tasks_read_host_variables() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path(), &["t1"]);
    std::fs::write(ds.join("t1/task.toml"), "[environment.env]\nTOKEN = \"${STANDIN_TEST_TOKEN}\"\nPLAIN = \"x\"\n")
        .unwrap();
    let mut v = Vllm::start(tmp.path(), &[], &[]);
    v.wait_ready();
    let base = format!("api_base={}/v1", v.base());
    let env = [("STANDIN_TRIAL_SECONDS", "0"), ("STANDIN_TEST_TOKEN", "t")];
    // stdin is /dev/null: the prompt reads end of input and typer aborts.
    let (code, out, err) = run(HARBOR, &small_job(&base, "P", &[]), &env, tmp.path());
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("Proceed? (Y/n):") && out.contains("STANDIN_TEST_TOKEN"), "{out}");
    assert!(err.contains("Aborted."), "{err}");
    let left: Vec<String> = std::fs::read_dir(tmp.path().join("jobs/P"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(left, ["job.log"], "the job dir holds only job.log");
    let (code, out, err) = run(HARBOR, &small_job(&base, "P", &["--yes"]), &env, tmp.path());
    assert_eq!(code, 0, "{out}{err}");
    // An unset host variable without a default fails whatever --yes says.
    let (code, out, _) = run(HARBOR, &small_job(&base, "Q", &["--yes"]), &[("STANDIN_TRIAL_SECONDS", "0")], tmp.path());
    assert_eq!(code, 1);
    assert!(out.contains("Missing Environment Variables") && out.contains("STANDIN_TEST_TOKEN"), "{out}");
}

#[test]
fn harbor_daytona_environment_needs_its_extra() {
    let tmp = tempfile::tempdir().unwrap();
    dataset(tmp.path(), &["t1"]);
    let mut v = Vllm::start(tmp.path(), &[], &[]);
    v.wait_ready();
    let base = format!("api_base={}/v1", v.base());
    let (code, out, err) =
        run(HARBOR, &small_job(&base, "D", &[]), &[("STANDIN_EXTRAS", ""), ("STANDIN_TRIAL_SECONDS", "0")], tmp.path());
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("MissingExtraError: The 'daytona' package is required but not installed."), "{err}");
    assert!(err.contains("pip install 'harbor[daytona]'"), "{err}");
}
