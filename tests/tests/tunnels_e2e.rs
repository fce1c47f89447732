//! End-to-end tests of payload's tunnels (docs/design.md §6.5) with a real OpenSSH server on loopback
//! (`e2e::sshd`), the vLLM and Harbor stand-ins and the real `payload` binary:
//!
//! - Pinggy: the reverse tunnel really carries Harbor's model calls from the public URL (the
//!   forwarded remote port on loopback) to vLLM; the token is in no process's argv and no file the
//!   run leaves; the lock message moves the job to the next free pair of the bank; a killed tunnel
//!   is restarted and, with the server gone, given up (class `tunnel`); a public URL that never
//!   answers fails the check; resume rewrites the public URL into every config.json.
//! - SOCKS: `ssh -N -D` really carries a request to a local HTTP server; Harbor gets the proxy
//!   variables, or runs under proxychains; a wrong key and a server that is not listening fail as
//!   `tunnel` with their causes.
//!
//! Without sshd these tests print `skipping: no sshd` (they fail in CI, which installs it).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use e2e::sshd::{self, Sshd, TokenUser};
use serde_json::{Value, json};

use e2e::harness::{assert_plan_is_what_ran, files_containing, free_port, payload_bin, unique};
use launch_spec::testkit::{TestSpec, world};

const VLLM: &str = env!("CARGO_BIN_EXE_vllm-standin");
const HARBOR: &str = env!("CARGO_BIN_EXE_harbor-standin");

const GPU_FIXTURE: &str = r#"[{"index": 0, "uuid": "GPU-aaaa0000-0000-4000-8000-000000000000", "name": "NVIDIA A100-SXM-64GB", "memory_total_bytes": 68719476736}]"#;
const HARBOR_YAML: &str =
    "orchestrator:\n  type: local\n  n_concurrent_trials: 2\n  quiet: true\nenvironment:\n  type: daytona\n";

/// One test's world (like payload_e2e's): env prefix with the stand-ins, dataset, Harbor config,
/// 0600 secrets (Daytona keys + the test tokens), GPU fixture, jobs dir, a TMPDIR of its own.
struct Fx {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    tag: String,
    /// Secret values that must never leak (tokens, Daytona keys).
    secrets: Vec<String>,
}

impl Fx {
    fn new(name: &str, tokens: &[(&str, &str)]) -> Self {
        let tmp = tempfile::Builder::new().prefix("tunnels-e2e-").tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let id = unique();
        world::link_programs(&root.join("env"), &[("vllm", Path::new(VLLM)), ("harbor", Path::new(HARBOR))]);
        world::standin_tasks(&root.join("data"), 3);
        for d in ["jobs", "tmp", "state"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("harbor.yaml"), HARBOR_YAML).unwrap();
        std::fs::write(root.join("gpus.json"), GPU_FIXTURE).unwrap();
        let org1 = format!("sekrit-org1-{id}");
        let org2 = format!("sekrit-org2-{id}");
        let mut text = format!("DAYTONA_API_KEY={org1}\nDAYTONA_DATA_API_KEY={org2}\n");
        let mut secrets = vec![org1, org2];
        for (name, value) in tokens {
            text.push_str(&format!("{name}={value}\n"));
            secrets.push(value.to_string());
        }
        world::write_secrets(&root.join("secrets.env"), &text, 0o600);
        Self { _tmp: tmp, tag: format!("{name}-{id}"), root, secrets }
    }

    fn run_dir(&self) -> PathBuf {
        self.root.join("jobs").join(&self.tag)
    }

    /// The stand-ins' spec (launch_spec::testkit) with this agent and tunnel; the tunnel tables
    /// are JSON the tests build ([`pinggy_tunnel`], [`socks_tunnel`]).
    fn spec(&self, agent: &str, tunnel: Value) -> Value {
        let mut spec = TestSpec::standins(&self.root, &self.tag)
            .max_model_len(8192)
            .serve_env("STANDIN_LOAD_SECONDS", "0.3")
            .serve_env("STANDIN_GPUS", "1")
            .agent(agent)
            .harbor_env("STANDIN_TRIAL_SECONDS", "0.05")
            .harbor_env("STANDIN_EXTRAS", "daytona")
            .to_value();
        spec["tunnel"] = tunnel;
        spec
    }

    fn start(&self, spec: &Value, job_id: &str) -> Run {
        let path = self.root.join("launch-in.json");
        std::fs::write(&path, serde_json::to_string_pretty(spec).unwrap()).unwrap();
        let stderr = std::fs::File::create(self.root.join("payload.stderr")).unwrap();
        let child = Command::new(payload_bin())
            .args(["run", "--spec", path.to_str().unwrap()])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
            .env("HOME", &self.root)
            .env("TMPDIR", self.root.join("tmp"))
            .env("SLURM_JOB_ID", job_id)
            .env("PAYLOAD_GPU_FIXTURE", self.root.join("gpus.json"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn payload");
        let marker = format!("PAYLOAD_RUN_ID={}-{}\0", self.tag, child.id());
        Run { child, marker }
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
            .map(|l| {
                launch_spec::testkit::assert_typed_event_line(l);
                // `{"at", "event", "fields": {…}}` → one flat object.
                let mut e: Value = serde_json::from_str(l).expect("events.jsonl line is JSON");
                if let Some(Value::Object(fields)) = e.as_object_mut().and_then(|o| o.remove("fields")) {
                    e.as_object_mut().unwrap().extend(fields);
                }
                e
            })
            .collect()
    }

    fn events_named(&self, name: &str) -> Vec<Value> {
        self.events().into_iter().filter(|e| e["event"] == name).collect()
    }

    fn outcome(&self) -> Value {
        self.status()["outcome"].clone()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.root.join("payload.stderr")).unwrap_or_default()
    }

    fn tunnel_log(&self) -> String {
        std::fs::read_to_string(self.run_dir().join("tunnel.log")).unwrap_or_default()
    }

    fn diag(&self) -> String {
        format!(
            "status: {:#}\ntunnel.log:\n{}\nstderr (tail):\n{}",
            self.status(),
            self.tunnel_log(),
            tail(&self.stderr(), 15)
        )
    }

    fn wait(&self, what: &str, timeout: Duration, pred: impl Fn(&Fx) -> bool) {
        let until = Instant::now() + timeout;
        while !pred(self) {
            assert!(Instant::now() < until, "timed out waiting for {what}\n{}", self.diag());
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Files under the fixture (run dir, trials, logs, TMPDIR, state) containing any of `needles`.
    fn files_containing(&self, needles: &[String]) -> Vec<String> {
        let roots = ["jobs", "tmp", "state", "payload.stderr"].map(|p| self.root.join(p));
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        files_containing(&roots, &needles)
            .into_iter()
            .map(|(file, _)| format!("{} contains a secret", file.display()))
            .collect()
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

struct Run {
    child: Child,
    marker: String,
}

impl Run {
    fn wait(&mut self, fx: &Fx, timeout: Duration) -> i32 {
        let until = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // No child of the run (vLLM, Harbor, ssh, curl) survives payload.
                let survivors: Vec<String> = std::fs::read_dir("/proc")
                    .unwrap()
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
                    .filter(|e| {
                        std::fs::read(e.path().join("environ"))
                            .is_ok_and(|env| String::from_utf8_lossy(&env).contains(&self.marker))
                    })
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .collect();
                assert!(survivors.is_empty(), "processes survived payload: {survivors:?}\n{}", fx.diag());
                return status.code().unwrap_or(-1);
            }
            if Instant::now() >= until {
                let _ = self.child.kill();
                panic!("payload did not exit within {timeout:?}\n{}", fx.diag());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn environ_of(pid: u64) -> Vec<(String, String)> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    String::from_utf8_lossy(&raw)
        .split('\0')
        .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

fn env_var(pid: u64, name: &str) -> Option<String> {
    environ_of(pid).into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

fn pid_of(fx: &Fx, role: &str) -> u64 {
    fx.status()["pids"][role].as_u64().unwrap_or_else(|| panic!("no {role} pid\n{}", fx.diag()))
}

fn curl(args: &[&str]) -> (String, String) {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5"])
        .args(args)
        .output()
        .expect("curl");
    (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string())
}

/// Pinggy settings pointing at the stand-in: the "public URL" is the forwarded remote port on
/// loopback (tests cannot resolve `*.a.pinggy.link`).
fn pinggy_tunnel(sshd: &Sshd, pairs: &[(u16, &str)], lock_dir: Option<&Path>) -> Value {
    let (first_port, first_secret) = pairs[0];
    let bank: Vec<Value> = pairs[1..]
        .iter()
        .map(|(port, secret)| json!({"public_url": format!("http://127.0.0.1:{port}"), "token_secret": secret}))
        .collect();
    let mut t = json!({
        "kind": "pinggy", "host": "127.0.0.1", "port": sshd.port,
        "public_url": format!("http://127.0.0.1:{first_port}"), "token_secret": first_secret,
        "bank": bank, "remote_port": first_port,
        "identity_file": sshd.client_key, "known_hosts": sshd.known_hosts,
        "max_restarts": 2, "restart_backoff_s": 0.2, "force_on_restart": false,
        "connect_timeout_s": 5, "verify_attempts": 25, "verify_interval_s": 0.2,
        "server_alive_interval_s": 2, "server_alive_count_max": 2
    });
    if let Some(dir) = lock_dir {
        t["lock_dir"] = json!(dir);
    }
    t
}

// ------------------------------------------------------------------------------------- Pinggy

#[test]
fn pinggy_tunnel_carries_the_run_hides_the_token_and_resume_rewrites_the_url() {
    if !sshd::available_or_skip() {
        return;
    }
    let user = TokenUser::create();
    let sshd = Sshd::pinggy();
    let fx = Fx::new("pinggy", &[("PINGGY_TOKEN", &user.name)]);
    let rport = free_port();
    let lock_dir = fx.root.join("state/pinggy");
    let mut spec = fx.spec("openhands", pinggy_tunnel(&sshd, &[(rport, "PINGGY_TOKEN")], Some(&lock_dir)));
    spec["harbor"]["env"]["STANDIN_TRIAL_SECONDS"] = json!("1.2");
    let public = format!("http://127.0.0.1:{rport}");
    let mut run = fx.start(&spec, "4242");

    fx.wait("phase running", Duration::from_secs(30), |fx| fx.status()["phase"] == "running");
    // While the tunnel runs: no process's argv holds the token.
    let hits = sshd::cmdlines_containing(&user.name, &sshd.pids());
    assert!(hits.is_empty(), "token in argv: {hits:?}");
    // vLLM has a per-job key (env only); Harbor hands the same key to the agent.
    let key = env_var(pid_of(&fx, "engine"), "VLLM_API_KEY").expect("vLLM got VLLM_API_KEY");
    let harbor = pid_of(&fx, "harbor");
    // openhands' own variables (launch_spec::agents): the key and the base URL, environment only.
    for name in ["HOSTED_VLLM_API_KEY", "LLM_API_KEY"] {
        assert_eq!(env_var(harbor, name).as_deref(), Some(key.as_str()), "{name}");
    }
    assert_eq!(env_var(harbor, "LLM_BASE_URL"), Some(format!("{public}/v1")));
    assert_eq!(env_var(harbor, "OPENAI_API_KEY"), None, "openhands reads LLM_API_KEY only");
    assert!(sshd::cmdlines_containing(&key, &[]).is_empty(), "API key in argv");
    // The public URL really reaches vLLM, and only with the key.
    assert_eq!(curl(&[&format!("{public}/v1/models")]).0, "401");
    assert_eq!(curl(&["-H", &format!("Authorization: Bearer {key}"), &format!("{public}/v1/models")]).0, "200");
    // The token's lease is held; the private dir outside the run dir is 0700, and once ssh runs
    // no file on disk holds the token (its config and raw output are gone by name: issue 21).
    assert_eq!(std::fs::read_dir(&lock_dir).unwrap().count(), 1);
    let private: Vec<_> = std::fs::read_dir(fx.root.join("tmp")).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(private.len(), 1, "{private:?}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&private[0]).unwrap().permissions().mode() & 0o777, 0o700);
    assert!(!private[0].join("ssh_config").exists(), "the ssh config outlived ssh's start");
    let on_disk = fx.files_containing(std::slice::from_ref(&user.name));
    assert!(on_disk.is_empty(), "{on_disk:?}");

    let code = run.wait(&fx, Duration::from_secs(40));
    assert_eq!(code, 0, "{}", fx.diag());
    // Harbor's agent called the model through the public URL: completions arrived at vLLM.
    let up = &fx.events_named("tunnel_up")[0];
    assert_eq!(up["public_url"], public);
    assert_eq!(fx.events_named("harbor_spawned")[0]["api_base"], format!("{public}/v1"));
    let vllm_log = std::fs::read_to_string(fx.run_dir().join("vllm.log")).unwrap();
    assert!(vllm_log.contains("\"POST /v1/chat/completions HTTP/1.1\" 200 OK"), "no completions reached vLLM");
    let result: Value =
        serde_json::from_str(&std::fs::read_to_string(fx.run_dir().join("result.json")).unwrap()).unwrap();
    assert_eq!(result["stats"]["n_errored_trials"], 0, "{result:#}");
    // tunnel.log: Pinggy's lines, the token redacted.
    let log = fx.tunnel_log();
    assert!(log.contains("You are authenticated as <redacted>"), "{log}");
    assert!(log.contains("payload: verified: GET"), "{log}");
    // Nothing the run left holds the token or the key; the private dir and the lease are gone.
    let mut needles = fx.secrets.clone();
    needles.push(key.clone());
    let leaks = fx.files_containing(&needles);
    assert!(leaks.is_empty(), "{leaks:?}");
    assert_eq!(std::fs::read_dir(fx.root.join("tmp")).unwrap().count(), 0, "private dir left behind");
    assert_eq!(std::fs::read_dir(&lock_dir).unwrap().count(), 0, "lease not released");
    let spec_text = std::fs::read_to_string(fx.run_dir().join("launch.json")).unwrap();
    assert!(!spec_text.contains(&user.name));

    // Resume with another public URL: the job's and every trial's config.json get it. Only a job
    // that did not finish is resumed (a finished one is re-evaluated fresh): make this one read as
    // interrupted before Harbor wrote its end.
    let mut unfinished = result.clone();
    unfinished["finished_at"] = Value::Null;
    std::fs::write(fx.run_dir().join("result.json"), serde_json::to_vec(&unfinished).unwrap()).unwrap();
    let rport2 = free_port();
    let public2 = format!("http://127.0.0.1:{rport2}");
    let mut spec2 = fx.spec("openhands", pinggy_tunnel(&sshd, &[(rport2, "PINGGY_TOKEN")], Some(&lock_dir)));
    spec2["harbor"]["env"]["STANDIN_TRIAL_SECONDS"] = json!("0.05");
    let mut run2 = fx.start(&spec2, "4243");
    let code = run2.wait(&fx, Duration::from_secs(40));
    assert_eq!(code, 0, "{}", fx.diag());
    assert_eq!(fx.events_named("harbor_spawned").last().unwrap()["mode"], "resume");
    let mut configs = vec![fx.run_dir().join("config.json")];
    for e in std::fs::read_dir(fx.run_dir()).unwrap().flatten() {
        if e.path().join("config.json").is_file() {
            configs.push(e.path().join("config.json"));
        }
    }
    assert!(configs.len() >= 4, "{configs:?}");
    for c in &configs {
        let text = std::fs::read_to_string(c).unwrap();
        assert!(text.contains(&format!("\"{public2}/v1\"")), "{} lacks the new public URL:\n{text}", c.display());
        assert!(!text.contains(&format!("\"{public}/v1\"")), "{} keeps the old URL", c.display());
    }
}

#[test]
fn pinggy_bank_skips_a_leased_pair_and_a_locked_token() {
    if !sshd::available_or_skip() {
        return;
    }
    let (u1, u2, u3) = (TokenUser::create(), TokenUser::create(), TokenUser::create());
    let sshd = Sshd::pinggy();
    let fx = Fx::new("bank", &[("TOK_A", &u1.name), ("TOK_B", &u2.name), ("TOK_C", &u3.name)]);
    let ports = [free_port(), free_port(), free_port()];
    let lock_dir = fx.root.join("state/pinggy");
    // Pair A is leased by a live job on this node (this test process); B's token is locked at Pinggy.
    std::fs::create_dir_all(&lock_dir).unwrap();
    let node = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    let a_url = format!("http://127.0.0.1:{}", ports[0]);
    let lease = lock_dir.join(lease_name(&a_url));
    std::fs::write(&lease, json!({"run_tag": "other-job", "slurm_job_id": "77", "node": node, "pid": std::process::id(), "public_url": a_url}).to_string()).unwrap();
    sshd.lock(&u2.name);
    let tunnel =
        pinggy_tunnel(&sshd, &[(ports[0], "TOK_A"), (ports[1], "TOK_B"), (ports[2], "TOK_C")], Some(&lock_dir));
    let mut spec = fx.spec("openhands", tunnel);
    // Pinggy ignores the requested remote port; the stand-in (OpenSSH) honours one per session, so each
    // pair's URL only works when that pair's port is asked for: use C's port for the session.
    spec["tunnel"]["remote_port"] = json!(ports[2]);
    // Job id 3 with 3 pairs starts the rotation at A.
    let mut run = fx.start(&spec, "3");
    let code = run.wait(&fx, Duration::from_secs(40));
    assert_eq!(code, 0, "{}", fx.diag());
    let skipped = fx.events_named("tunnel_pair_skipped");
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert_eq!(skipped[0]["reason"], "leased");
    assert_eq!(skipped[0]["holder"]["run_tag"], "other-job");
    assert_eq!(skipped[1]["reason"], "token_locked");
    assert_eq!(skipped[1]["public_url"], format!("http://127.0.0.1:{}", ports[1]));
    let c_url = format!("http://127.0.0.1:{}", ports[2]);
    assert_eq!(fx.events_named("tunnel_up")[0]["public_url"], c_url);
    assert_eq!(fx.events_named("harbor_spawned")[0]["api_base"], format!("{c_url}/v1"));
    assert!(fx.tunnel_log().contains("already active"), "{}", fx.tunnel_log());
    // The other job's lease is untouched; ours is released.
    assert!(lease.is_file());
    assert_eq!(std::fs::read_dir(&lock_dir).unwrap().count(), 1);
    assert!(fx.files_containing(&fx.secrets).is_empty());
}

/// `pinggy-<first 16 hex of sha1(url)>.lease` (payload's naming), computed with sha1sum(1).
fn lease_name(url: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("sha1sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(url.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    format!("pinggy-{}.lease", &String::from_utf8_lossy(&out.stdout)[..16])
}

#[test]
fn pinggy_single_locked_pair_fails_as_token_locked() {
    if !sshd::available_or_skip() {
        return;
    }
    let user = TokenUser::create();
    let sshd = Sshd::pinggy();
    sshd.lock(&user.name);
    let fx = Fx::new("locked", &[("PINGGY_TOKEN", &user.name)]);
    let spec = fx.spec("openhands", pinggy_tunnel(&sshd, &[(free_port(), "PINGGY_TOKEN")], None));
    let mut run = fx.start(&spec, "11");
    let code = run.wait(&fx, Duration::from_secs(30));
    assert_eq!(code, 13, "{}", fx.diag());
    let out = fx.outcome();
    assert_eq!(out["class"], "tunnel");
    assert_eq!(out["cause"], "token_locked");
    assert!(fx.events_named("harbor_spawned").is_empty());
    assert!(fx.files_containing(&fx.secrets).is_empty());
}

#[test]
fn pinggy_killed_tunnel_is_restarted_then_given_up_when_the_server_is_gone() {
    if !sshd::available_or_skip() {
        return;
    }
    let user = TokenUser::create();
    let mut sshd = Sshd::pinggy();
    let fx = Fx::new("drop", &[("PINGGY_TOKEN", &user.name)]);
    let rport = free_port();
    let mut spec = fx.spec("openhands", pinggy_tunnel(&sshd, &[(rport, "PINGGY_TOKEN")], None));
    spec["harbor"]["env"]["STANDIN_TRIAL_SECONDS"] = json!("60");
    // Room for one extra failed reconnect while sshd still holds the dead session's forward.
    spec["tunnel"]["max_restarts"] = json!(3);
    let mut run = fx.start(&spec, "12");
    fx.wait("phase running", Duration::from_secs(30), |fx| fx.status()["phase"] == "running");
    let first = pid_of(&fx, "tunnel");
    assert!(Command::new("kill").args(["-9", &first.to_string()]).status().unwrap().success());
    fx.wait("the tunnel back up", Duration::from_secs(20), |fx| fx.events_named("tunnel_up").len() >= 2);
    assert_ne!(pid_of(&fx, "tunnel"), first);
    assert!(!fx.events_named("tunnel_restart").is_empty());
    assert_eq!(fx.status()["phase"], "running", "a restored tunnel keeps the run going");
    // Now the server goes away: reconnects are refused, the bound is reached, the run stops.
    sshd.stop();
    let code = run.wait(&fx, Duration::from_secs(30));
    assert_eq!(code, 13, "{}", fx.diag());
    let out = fx.outcome();
    assert_eq!(out["class"], "tunnel");
    assert_eq!(out["cause"], "connect_failed", "{out:#}");
    assert!(out["message"].as_str().unwrap().contains("dropped and could not be restored"), "{out:#}");
    // Harbor was stopped by the teardown (Harbor → vLLM → tunnel).
    let steps = &fx.events_named("teardown_done")[0]["steps"];
    assert_eq!(steps[0]["role"], "harbor", "{steps:#}");
}

#[test]
fn pinggy_public_url_that_never_answers_fails_the_check() {
    if !sshd::available_or_skip() {
        return;
    }
    let user = TokenUser::create();
    let sshd = Sshd::pinggy();
    let fx = Fx::new("verify", &[("PINGGY_TOKEN", &user.name)]);
    let mut tunnel = pinggy_tunnel(&sshd, &[(free_port(), "PINGGY_TOKEN")], None);
    // The session forwards one port; the "public URL" names another where nothing listens.
    tunnel["public_url"] = json!(format!("http://127.0.0.1:{}", free_port()));
    tunnel["verify_attempts"] = json!(3);
    let spec = fx.spec("openhands", tunnel);
    let mut run = fx.start(&spec, "13");
    let code = run.wait(&fx, Duration::from_secs(30));
    assert_eq!(code, 13, "{}", fx.diag());
    let out = fx.outcome();
    assert_eq!(out["cause"], "verify_failed", "{out:#}");
    assert!(out["message"].as_str().unwrap().contains("/v1/models"), "{out:#}");
    assert!(fx.events_named("harbor_spawned").is_empty());
    assert_eq!(fx.tunnel_log().matches("payload: check ").count(), 3, "{}", fx.tunnel_log());
}

/// `payload plan --spec` of `spec` in the fixture's world; its text.
fn payload_plan(fx: &Fx, spec: &Value) -> String {
    let path = fx.root.join("launch-in.json");
    std::fs::write(&path, serde_json::to_string_pretty(spec).unwrap()).unwrap();
    let out = Command::new(payload_bin())
        .args(["plan", "--spec", path.to_str().unwrap()])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &fx.root)
        .env("PAYLOAD_GPU_FIXTURE", fx.root.join("gpus.json"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn plan_shows_the_tunnel_without_the_token() {
    let fx = Fx::new("plan", &[("PINGGY_TOKEN", "pgyplan0123456789")]);
    let tunnel = json!({"kind": "pinggy", "host": "pro.pinggy.io", "public_url": "https://abc.a.pinggy.link", "token_secret": "PINGGY_TOKEN"});
    let spec = fx.spec("openhands", tunnel);
    let text = payload_plan(&fx, &spec);
    assert!(!text.contains("pgyplan0123456789"), "{text}");
    assert!(text.contains("tunnel: pinggy — pinggy: "), "{text}");
    assert!(text.contains("-T -R 0:127.0.0.1:"), "{text}");
    assert!(text.contains("User <token from secret PINGGY_TOKEN>"), "{text}");
    assert!(text.contains("verify: GET https://abc.a.pinggy.link/v1/models"), "{text}");
    assert!(text.contains("api_base https://abc.a.pinggy.link/v1"), "{text}");
    assert!(text.contains("VLLM_API_KEY=<generated per job>"), "{text}");
    assert!(text.contains("HOSTED_VLLM_API_KEY=<generated per job>"), "{text}");
}

// -------------------------------------------------------------------------------------- SOCKS

/// A local HTTP server counting requests (the "internet" the SOCKS proxy must reach).
fn http_server() -> (u16, Arc<AtomicU64>) {
    let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
    let port = server.server_addr().to_ip().unwrap().port();
    let hits = Arc::new(AtomicU64::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for req in server.incoming_requests() {
            h.fetch_add(1, Ordering::SeqCst);
            let _ = req.respond(tiny_http::Response::from_string("egress ok"));
        }
    });
    (port, hits)
}

fn socks_tunnel(sshd: &Sshd, key: &Path, verify_port: u16, mode: &str) -> Value {
    json!({
        "kind": "socks", "login_node": "127.0.0.1", "user": "root", "ssh_port": sshd.port,
        "identity_file": key, "known_hosts": sshd.known_hosts, "mode": mode,
        "port": {"base": 47000, "span": 2000},
        "verify_url": format!("http://127.0.0.1:{verify_port}/probe"), "verify_attempts": 10, "verify_interval_s": 0.2,
        "max_restarts": 2, "restart_backoff_s": 0.2, "connect_timeout_s": 5,
        "server_alive_interval_s": 2, "server_alive_count_max": 2
    })
}

#[test]
fn socks_env_mode_carries_a_request_and_hands_harbor_the_proxy() {
    if !sshd::available_or_skip() {
        return;
    }
    let sshd = Sshd::start();
    let (port, hits) = http_server();
    let fx = Fx::new("socks", &[]);
    let mut spec = fx.spec("terminus-2", socks_tunnel(&sshd, &sshd.client_key, port, "env"));
    spec["harbor"]["env"]["STANDIN_TRIAL_SECONDS"] = json!("1.0");
    let mut run = fx.start(&spec, "21");
    fx.wait("phase running", Duration::from_secs(30), |fx| fx.status()["phase"] == "running");
    assert!(hits.load(Ordering::SeqCst) >= 1, "the check's request never reached the server");
    let socks_port = fx.events_named("tunnel_up")[0]["socks_port"].as_u64().unwrap();
    let proxy = format!("socks5h://127.0.0.1:{socks_port}");
    let harbor = pid_of(&fx, "harbor");
    for name in ["ALL_PROXY", "HTTPS_PROXY", "https_proxy", "all_proxy"] {
        assert_eq!(env_var(harbor, name).as_deref(), Some(proxy.as_str()), "{name}");
    }
    assert!(env_var(harbor, "NO_PROXY").unwrap().contains("127.0.0.1"));
    // The proxy carries other traffic too (what Harbor's Daytona calls would do).
    let before = hits.load(Ordering::SeqCst);
    let (code, err) = curl(&["--proxy", &proxy, &format!("http://127.0.0.1:{port}/through")]);
    assert_eq!(code, "200", "{err}");
    assert_eq!(hits.load(Ordering::SeqCst), before + 1);
    // terminus-2 still calls vLLM on loopback, without a key.
    assert!(env_var(pid_of(&fx, "engine"), "VLLM_API_KEY").is_none());
    let code = run.wait(&fx, Duration::from_secs(40));
    assert_eq!(code, 0, "{}", fx.diag());
    assert!(fx.events_named("harbor_spawned")[0]["api_base"].as_str().unwrap().starts_with("http://127.0.0.1:"));
    assert!(fx.tunnel_log().contains("payload: verified: GET http://127.0.0.1:"), "{}", fx.tunnel_log());
    assert_eq!(std::fs::read_dir(fx.root.join("tmp")).unwrap().count(), 0);
}

#[test]
fn socks_proxychains_mode_runs_harbor_under_the_generated_config() {
    if !sshd::available_or_skip() {
        return;
    }
    let sshd = Sshd::start();
    let (port, _hits) = http_server();
    let fx = Fx::new("pchains", &[]);
    // The real proxychains4 when installed; else a recorder with its command line that checks the
    // config and execs the rest (the argv and config contract is what payload owns).
    // (`E2E_FAKE_PROXYCHAINS=1` forces the recorder, to check that path where proxychains4 is installed.)
    let real = if std::env::var_os("E2E_FAKE_PROXYCHAINS").is_some() { None } else { sshd::which("proxychains4") };
    let bin = match real {
        Some(real) => real,
        None => {
            let fake = fx.root.join("fake-proxychains4");
            std::fs::write(
                &fake,
                "#!/bin/sh\n[ \"$1\" = -q ] && [ \"$2\" = -f ] || exit 90\ngrep -q '^strict_chain$' \"$3\" || exit 91\n\
                 grep -q '^socks5 127.0.0.1 ' \"$3\" || exit 92\nshift 3\nexec \"$@\"\n",
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
            fake
        }
    };
    let mut tunnel = socks_tunnel(&sshd, &sshd.client_key, port, "proxychains");
    tunnel["proxychains_bin"] = json!(bin);
    let spec = fx.spec("terminus-2", tunnel);
    let mut run = fx.start(&spec, "22");
    let code = run.wait(&fx, Duration::from_secs(40));
    assert_eq!(code, 0, "{}", fx.diag());
    let argv = fx.events_named("harbor_spawned")[0]["argv"].clone();
    assert_eq!(argv[0], bin.display().to_string(), "{argv:#}");
    assert_eq!(argv[1], "-q");
    assert_eq!(argv[2], "-f");
    assert!(argv[3].as_str().unwrap().ends_with("/proxychains.conf"));
    assert!(argv[4].as_str().unwrap().ends_with("/harbor"), "{argv:#}");
    let result: Value =
        serde_json::from_str(&std::fs::read_to_string(fx.run_dir().join("result.json")).unwrap()).unwrap();
    assert_eq!(
        result["stats"]["n_errored_trials"], 0,
        "loopback api_base must stay local under proxychains: {result:#}"
    );
}

#[test]
fn socks_wrong_key_fails_as_auth_failed_after_the_restarts() {
    if !sshd::available_or_skip() {
        return;
    }
    let sshd = Sshd::start();
    let fx = Fx::new("wrongkey", &[]);
    let spec = fx.spec("terminus-2", socks_tunnel(&sshd, &sshd.wrong_key, 9, "env"));
    let mut run = fx.start(&spec, "23");
    let code = run.wait(&fx, Duration::from_secs(30));
    assert_eq!(code, 13, "{}", fx.diag());
    let out = fx.outcome();
    assert_eq!(out["class"], "tunnel");
    assert_eq!(out["cause"], "auth_failed", "{out:#}");
    assert_eq!(fx.events_named("tunnel_spawned").len(), 3, "first try + 2 restarts");
    assert!(fx.events_named("harbor_spawned").is_empty());
    assert!(fx.tunnel_log().contains("Permission denied"), "{}", fx.tunnel_log());
}

#[test]
fn socks_server_not_listening_fails_as_connect_failed() {
    if !sshd::available_or_skip() {
        return;
    }
    let mut sshd = Sshd::start();
    sshd.stop();
    let fx = Fx::new("nolisten", &[]);
    let spec = fx.spec("terminus-2", socks_tunnel(&sshd, &sshd.client_key, 9, "env"));
    let mut run = fx.start(&spec, "24");
    let code = run.wait(&fx, Duration::from_secs(30));
    assert_eq!(code, 13, "{}", fx.diag());
    let out = fx.outcome();
    assert_eq!(out["cause"], "connect_failed", "{out:#}");
    assert!(out["message"].as_str().unwrap().contains("could not be established"), "{out:#}");
    assert!(fx.events_named("harbor_spawned").is_empty());
}

/// With a SOCKS tunnel in `env` mode, Harbor's environment carries the proxy: what `payload plan`
/// shows for vLLM and Harbor (the tunnel's variables included) is what `payload run` spawned.
#[test]
fn plan_shows_the_socks_proxy_environment_run_hands_harbor() {
    if !sshd::available_or_skip() {
        return;
    }
    let sshd = Sshd::start();
    let (port, _hits) = http_server();
    let fx = Fx::new("socksplan", &[]);
    let mut spec = fx.spec("terminus-2", socks_tunnel(&sshd, &sshd.client_key, port, "env"));
    spec["harbor"]["env"]["STANDIN_TRIAL_SECONDS"] = json!("1.0");
    spec["serve"]["port"] = json!({ "fixed": free_port() });
    let path = fx.root.join("launch-plan.json");
    std::fs::write(&path, serde_json::to_string_pretty(&spec).unwrap()).unwrap();
    // The same environment `Fx::start` gives payload (the SOCKS port derives from the job id).
    let out = Command::new(payload_bin())
        .args(["plan", "--spec", path.to_str().unwrap(), "--json"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
        .env("HOME", &fx.root)
        .env("TMPDIR", fx.root.join("tmp"))
        .env("SLURM_JOB_ID", "23")
        .env("PAYLOAD_GPU_FIXTURE", fx.root.join("gpus.json"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(plan["harbor"]["env"]["ALL_PROXY"].as_str().is_some_and(|p| p.starts_with("socks5h://")), "{plan:#}");

    let mut run = fx.start(&spec, "23");
    fx.wait("phase running", Duration::from_secs(30), |fx| fx.status()["phase"] == "running");
    let pid = run.child.id() as i32;
    let engine_argv = fx.events_named("engine_spawned")[0]["argv"].clone();
    let harbor_argv = fx.events_named("harbor_spawned")[0]["argv"].clone();
    assert_plan_is_what_ran("vLLM", &plan["engine"], &engine_argv, pid_of(&fx, "engine") as u32, pid);
    assert_plan_is_what_ran("Harbor", &plan["harbor"], &harbor_argv, pid_of(&fx, "harbor") as u32, pid);
    assert_eq!(run.wait(&fx, Duration::from_secs(40)), 0, "{}", fx.diag());
}

// ------------------------------------------------------------ both: Pinggy through SOCKS egress

/// An installed-harness agent on a cluster without internet: one job runs the SOCKS egress proxy
/// to the login node and a Pinggy tunnel whose ssh reaches the (stand-in) Pinggy server through
/// the login node; the public-URL check goes through the proxy; Harbor gets the proxy variables
/// and openhands' own model variables.
#[test]
fn pinggy_and_socks_egress_run_in_one_job_for_an_installed_agent_without_internet() {
    if !sshd::available_or_skip() {
        return;
    }
    let user = TokenUser::create();
    let pinggy = Sshd::pinggy();
    let login = Sshd::start();
    let (egress_port, hits) = http_server();
    let fx = Fx::new("both", &[("PINGGY_TOKEN", &user.name)]);
    let rport = free_port();
    let public = format!("http://127.0.0.1:{rport}");
    let mut tunnel = pinggy_tunnel(&pinggy, &[(rport, "PINGGY_TOKEN")], Some(&fx.root.join("state/pinggy")));
    let mut egress = socks_tunnel(&login, &login.client_key, egress_port, "env");
    egress.as_object_mut().unwrap().remove("kind");
    tunnel["egress"] = egress;
    let mut spec = fx.spec("openhands", tunnel);
    spec["harbor"]["env"]["STANDIN_TRIAL_SECONDS"] = json!("1.2");
    let mut run = fx.start(&spec, "4343");
    fx.wait("phase running", Duration::from_secs(40), |fx| fx.status()["phase"] == "running");

    // Two ssh children: the egress proxy and Pinggy, each in status.json.
    let egress_pid = pid_of(&fx, "egress");
    let tunnel_pid = pid_of(&fx, "tunnel");
    let cmdline = |pid: u64| std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap().replace('\0', " ");
    assert!(cmdline(egress_pid).contains(" -N -D 127.0.0.1:"), "{}", cmdline(egress_pid));
    assert!(cmdline(tunnel_pid).contains(" -T -R "), "{}", cmdline(tunnel_pid));
    // Pinggy's ssh goes through the login node: its ProxyJump child (`ssh … -W … payload-socks`).
    let jumps = sshd::cmdlines_containing("payload-socks", &[]);
    assert!(jumps.iter().any(|c| c.contains(" -W ")), "no ProxyJump through the login node: {jumps:?}");
    assert!(login.log().matches("Accepted publickey for root").count() >= 2, "{}", login.log());
    // The egress check reached the "internet"; Harbor gets the proxy and openhands' variables.
    assert!(hits.load(Ordering::SeqCst) >= 1, "the egress check never reached the server");
    let harbor = pid_of(&fx, "harbor");
    let socks_port = fx.events_named("tunnel_up").iter().find_map(|e| e["socks_port"].as_u64()).unwrap();
    assert_eq!(env_var(harbor, "ALL_PROXY"), Some(format!("socks5h://127.0.0.1:{socks_port}")));
    let key = env_var(pid_of(&fx, "engine"), "VLLM_API_KEY").expect("vLLM got VLLM_API_KEY");
    assert_eq!(env_var(harbor, "LLM_API_KEY").as_deref(), Some(key.as_str()));
    assert_eq!(env_var(harbor, "LLM_BASE_URL"), Some(format!("{public}/v1")));
    assert!(sshd::cmdlines_containing(&user.name, &pinggy.pids()).is_empty(), "token in argv");
    assert!(sshd::cmdlines_containing(&key, &[]).is_empty(), "API key in argv");

    let code = run.wait(&fx, Duration::from_secs(40));
    assert_eq!(code, 0, "{}", fx.diag());
    // The egress proxy came up first; Pinggy's check (through it) after; Harbor used the public URL.
    let ups: Vec<Value> = fx.events_named("tunnel_up");
    let kinds: Vec<&str> = ups.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["socks", "pinggy"], "{ups:?}");
    assert_eq!(ups[1]["public_url"], public);
    assert_eq!(fx.events_named("harbor_spawned")[0]["api_base"], format!("{public}/v1"));
    let log = fx.tunnel_log();
    // The Pinggy side reads as with a single tunnel (what `submitter check` parses); the egress
    // proxy's notes and lines are marked.
    assert!(log.contains("payload: egress: verified: GET http://127.0.0.1:"), "{log}");
    assert!(log.contains("payload: verified: GET"), "{log}");
    assert!(log.contains("\nYou are authenticated as <redacted>"), "{log}");
    assert!(log.contains("payload: egress: attempt 1: "), "{log}");
    let mut needles = fx.secrets.clone();
    needles.push(key);
    let leaks = fx.files_containing(&needles);
    assert!(leaks.is_empty(), "{leaks:?}");
    assert_eq!(std::fs::read_dir(fx.root.join("tmp")).unwrap().count(), 0, "private dirs left behind");
}

#[test]
fn plan_shows_both_tunnels_of_an_installed_agent_without_internet() {
    let fx = Fx::new("plan-both", &[("PINGGY_TOKEN", "pgyplan0123456789")]);
    let mut tunnel = json!({"kind": "pinggy", "host": "pro.pinggy.io", "public_url": "https://abc.a.pinggy.link", "token_secret": "PINGGY_TOKEN"});
    tunnel["egress"] = json!({"login_node": "login05", "mode": "env"});
    let spec = fx.spec("openhands", tunnel);
    let text = payload_plan(&fx, &spec);
    assert!(!text.contains("pgyplan0123456789"), "{text}");
    assert!(text.contains("tunnel: pinggy+socks — pinggy: "), "{text}");
    assert!(text.contains("  egress: socks — socks: "), "{text}");
    assert!(text.contains("ProxyJump payload-socks"), "{text}");
    assert!(text.contains("through the egress proxy"), "{text}");
    assert!(text.contains("LLM_BASE_URL=https://abc.a.pinggy.link/v1"), "{text}");
    assert!(text.contains("LLM_API_KEY=<generated per job>"), "{text}");
    assert!(text.contains("ALL_PROXY=socks5h://127.0.0.1:"), "{text}");
    assert!(text.contains("first actions:"), "{text}");
}

/// Issue 21, item 5: an engine that prints its environment (the per-job `VLLM_API_KEY` among it)
/// before failing; the outcome's log tail carries those lines into `status.json` and
/// `events.jsonl`, which must hold the key redacted, like every other file the run writes.
#[test]
fn per_job_api_key_printed_by_the_engine_reaches_no_record() {
    if !sshd::available_or_skip() {
        return;
    }
    let user = TokenUser::create();
    let sshd = Sshd::pinggy();
    let fx = Fx::new("keyleak", &[("PINGGY_TOKEN", &user.name)]);
    let mut spec = fx.spec("openhands", pinggy_tunnel(&sshd, &[(free_port(), "PINGGY_TOKEN")], None));
    spec["serve"]["env"]["STANDIN_FAIL_AT_START"] = json!("other");
    spec["serve"]["env"]["STANDIN_PRINT_ENV"] = json!("1");
    let mut run = fx.start(&spec, "4260");
    let code = run.wait(&fx, Duration::from_secs(40));
    assert_eq!(code, 10, "{}", fx.diag());
    // The engine's own output holds the key (what the records must not copy).
    let vllm_log = std::fs::read_to_string(fx.run_dir().join("vllm.log")).unwrap();
    let key = vllm_log
        .lines()
        .find_map(|l| l.strip_prefix("VLLM_API_KEY="))
        .expect("the engine printed its VLLM_API_KEY")
        .to_string();
    assert!(key.len() >= 16, "{key}");
    let tail = fx.outcome()["engine_log_tail"].to_string();
    assert!(tail.contains("VLLM_API_KEY=<redacted>"), "the tail carries the line, redacted: {tail}");
    let mut needles = fx.secrets.clone();
    needles.push(key.clone());
    let engine_log = fx.run_dir().join("vllm.log").display().to_string();
    let leaks: Vec<String> =
        fx.files_containing(&needles).into_iter().filter(|h| !h.starts_with(&engine_log)).collect();
    assert!(leaks.is_empty(), "{leaks:?}");
    for record in ["status.json", "events.jsonl"] {
        let text = std::fs::read_to_string(fx.run_dir().join(record)).unwrap();
        assert!(!text.contains(&key), "{record} holds the key");
    }
    assert!(sshd::cmdlines_containing(&key, &[]).is_empty(), "API key in a process's argv");
}

/// Issue 21, item 12: a payload SIGKILLed while the tunnel is being checked leaves no file under
/// $TMPDIR holding the Pinggy token (neither the ssh config nor ssh's raw output).
#[test]
fn sigkill_during_the_tunnel_check_leaves_no_token_on_disk() {
    if !sshd::available_or_skip() {
        return;
    }
    let user = TokenUser::create();
    let sshd = Sshd::pinggy();
    let fx = Fx::new("kill9check", &[("PINGGY_TOKEN", &user.name)]);
    let mut tunnel = pinggy_tunnel(&sshd, &[(free_port(), "PINGGY_TOKEN")], None);
    // Nothing answers the public URL: the check keeps trying while the test kills payload.
    tunnel["public_url"] = json!(format!("http://127.0.0.1:{}", free_port()));
    tunnel["verify_attempts"] = json!(200);
    let mut run = fx.start(&fx.spec("openhands", tunnel), "14");
    fx.wait("the tunnel check", Duration::from_secs(30), |fx| fx.tunnel_log().contains("payload: check "));
    run.child.kill().unwrap(); // SIGKILL: no teardown, no cleanup
    let _ = run.child.wait();
    let until = Instant::now() + Duration::from_secs(10);
    while marker_alive(&run.marker) {
        assert!(Instant::now() < until, "the run's children outlived payload's SIGKILL");
        std::thread::sleep(Duration::from_millis(50));
    }
    let leaks = fx.files_containing(std::slice::from_ref(&user.name));
    assert!(leaks.is_empty(), "{leaks:?}");
}

/// Whether a process carrying `marker` (`PAYLOAD_RUN_ID=…\0`) still runs.
fn marker_alive(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        e.file_name().to_string_lossy().parse::<u32>().is_ok()
            && std::fs::read(e.path().join("environ")).is_ok_and(|env| String::from_utf8_lossy(&env).contains(marker))
    })
}

/// Issue 20, item 6: where the job downloads the weights, `secrets.pass_to_engine` hands the
/// secrets file's `HF_TOKEN` to vLLM's environment (an engine that prints its environment shows
/// it); no record the run writes holds its value.
#[test]
fn hf_token_reaches_the_engine_and_no_record() {
    // Made up per run, and kept only in the run's 0600 secrets file (no token-shaped literal).
    let token = format!("test-hf-{}", unique());
    let fx = Fx::new("hftoken", &[("HF_TOKEN", token.as_str())]);
    let tunnel = TestSpec::standins(&fx.root, &fx.tag).to_value()["tunnel"].clone();
    let mut spec = fx.spec("terminus-2", tunnel);
    spec["secrets"]["pass_to_engine"] = json!(["HF_TOKEN"]);
    spec["serve"]["env"]["STANDIN_FAIL_AT_START"] = json!("other");
    spec["serve"]["env"]["STANDIN_PRINT_ENV"] = json!("1");
    let mut run = fx.start(&spec, "4261");
    let code = run.wait(&fx, Duration::from_secs(40));
    assert_eq!(code, 10, "{}", fx.diag());
    let vllm_log = std::fs::read_to_string(fx.run_dir().join("vllm.log")).unwrap();
    assert!(vllm_log.lines().any(|l| l == format!("HF_TOKEN={token}")), "{vllm_log}");
    let engine_log = fx.run_dir().join("vllm.log").display().to_string();
    let leaks: Vec<String> =
        fx.files_containing(&fx.secrets).into_iter().filter(|h| !h.starts_with(&engine_log)).collect();
    assert!(leaks.is_empty(), "{leaks:?}");
}
