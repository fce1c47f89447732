//! Contract tests: every behaviour of the Harbor stand-in (`src/bin/harbor-standin.rs`) that other
//! tests rely on, checked against the real Harbor 0.25.0 in the same scenario — the same argv, the
//! same task dirs, the same vLLM stand-in. Skipped with a note when the real Harbor is not installed
//! (`scripts/install-harbor.sh`); under `CI=true` they fail instead. The facts are written down in
//! `docs/harbor-facts.md`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use e2e::harness::{free_port, marker_processes, real_harbor, send_signal, unique};

const VLLM: &str = env!("CARGO_BIN_EXE_vllm-standin");
const STANDIN: &str = env!("CARGO_BIN_EXE_harbor-standin");
const HOST_ENV_PY: &str = include_str!("../harbor_env/host_env.py");
const TIMEOUT: Duration = Duration::from_secs(180);
const MODEL_INFO: &str = r#"model_info={"max_input_tokens":32768,"max_output_tokens":16384,"input_cost_per_token":0,"output_cost_per_token":0}"#;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Which {
    Real,
    Standin,
}

const BOTH: [Which; 2] = [Which::Real, Which::Standin];

/// A scenario's world, shared by both Harbors: tasks, a YAML, a vLLM stand-in answering as
/// terminus-2, a jobs dir per Harbor.
struct World {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    harbor: PathBuf,
    engine: Child,
    port: u16,
    /// In every process started here, so that what the real Harbor leaves behind can be found.
    marker: String,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.engine.kill();
        let _ = self.engine.wait();
        // What a killed Harbor leaves (sandboxes of `jobs resume` after SIGTERM) is ours to end.
        for line in marker_processes(&self.marker) {
            if let Some(pid) = line.strip_prefix("pid ").and_then(|l| l.split(':').next()) {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
    }
}

impl World {
    /// `tasks`: (name, solvable). `response_seconds`: how long each completion takes.
    fn new(tasks: &[(&str, bool)], response_seconds: f64, extra_toml: &str) -> Option<Self> {
        Self::with_engine_env(tasks, response_seconds, extra_toml, &[])
    }

    /// [`World::new`] with more of the vLLM stand-in's knobs (`engine_env`).
    fn with_engine_env(
        tasks: &[(&str, bool)],
        response_seconds: f64,
        extra_toml: &str,
        engine_env: &[(&str, &str)],
    ) -> Option<Self> {
        let harbor = real_harbor()?;
        let tmp = tempfile::Builder::new().prefix("harbor-contract-").tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        std::fs::create_dir_all(root.join("py")).unwrap();
        std::fs::write(root.join("py/host_env.py"), HOST_ENV_PY).unwrap();
        for (name, solvable) in tasks {
            let dir = root.join("data").join(name);
            std::fs::create_dir_all(dir.join("tests")).unwrap();
            std::fs::create_dir_all(dir.join("environment")).unwrap();
            std::fs::write(
                dir.join("task.toml"),
                format!("schema_version = \"1.4\"\n[metadata]\n[agent]\ntimeout_sec = 300.0\n[verifier]\ntimeout_sec = 120.0\n{extra_toml}"),
            )
            .unwrap();
            let answer = if *solvable { *name } else { "wrong" };
            std::fs::write(
                dir.join("instruction.md"),
                format!("Write {name} to /app/answer.txt.\n\nSTANDIN-COMMAND: echo {answer} > /app/answer.txt\n"),
            )
            .unwrap();
            std::fs::write(
                dir.join("tests/test.sh"),
                format!("#!/bin/bash\n[ \"$(cat /app/answer.txt)\" = {name} ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"),
            )
            .unwrap();
            std::fs::write(dir.join("environment/Dockerfile"), "FROM debian:trixie-slim\n").unwrap();
            // The stand-in's reward: what the real verifier gives this task.
            std::fs::write(dir.join("reward"), if *solvable { "1.0\n" } else { "0.0\n" }).unwrap();
        }
        std::fs::write(root.join("harbor.yaml"), "orchestrator:\n  type: local\n  quiet: true\n").unwrap();
        let marker = format!("HARBOR_CONTRACT_RUN={}", unique());
        let port = free_port();
        let (key, value) = marker.split_once('=').unwrap();
        let engine = Command::new(VLLM)
            .args(["serve", "Qwen/Qwen3-8B", "--port", &port.to_string(), "--served-model-name", "Qwen3-8B"])
            .args(["--max-model-len", "32768"])
            .env("STANDIN_CHAT_AGENT", "terminus")
            .env("STANDIN_LOAD_SECONDS", "0")
            .env("STANDIN_RESPONSE_SECONDS", response_seconds.to_string())
            .env("STANDIN_REQUEST_LOG", root.join("requests.jsonl"))
            .envs(engine_env.iter().copied())
            .env(key, value)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        while ureq::get(&format!("http://127.0.0.1:{port}/health")).call().is_err() {
            assert!(Instant::now() < until, "vLLM stand-in did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Self { _tmp: tmp, root, harbor, engine, port, marker })
    }

    /// The bodies of the completion requests the engine received so far (both Harbors'), in order.
    fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(self.root.join("requests.jsonl"))
            .map_or_else(|_| Vec::new(), |t| t.lines().map(String::from).collect())
    }

    fn jobs(&self, which: Which) -> PathBuf {
        self.root.join(format!("jobs-{which:?}"))
    }

    fn job_dir(&self, which: Which, job: &str) -> PathBuf {
        self.jobs(which).join(job)
    }

    fn command(&self, which: Which, args: &[&str]) -> Command {
        let mut cmd = match which {
            Which::Real => Command::new(&self.harbor),
            Which::Standin => Command::new(STANDIN),
        };
        let (key, value) = self.marker.split_once('=').unwrap();
        cmd.args(args)
            .env("PYTHONPATH", self.root.join("py"))
            .env(key, value)
            .current_dir(&self.root)
            .stdin(Stdio::null());
        cmd
    }

    /// `jobs start` of the dataset with terminus-2 on the vLLM stand-in, plus `extra`.
    fn start_args(&self, which: Which, job: &str, extra: &[&str]) -> Vec<String> {
        let mut a: Vec<String> = ["jobs", "start", "-p"].iter().map(|s| s.to_string()).collect();
        a.push(self.root.join("data").display().to_string());
        for s in ["--job-name", job, "--jobs-dir"] {
            a.push(s.to_string());
        }
        a.push(self.jobs(which).display().to_string());
        a.push("--config".into());
        a.push(self.root.join("harbor.yaml").display().to_string());
        for s in ["--env", "host_env:HostEnvironment", "--agent", "terminus-2", "--model", "hosted_vllm/Qwen3-8B"] {
            a.push(s.to_string());
        }
        a.push("--agent-kwarg".into());
        a.push(format!("api_base=http://127.0.0.1:{}/v1", self.port));
        a.push("--agent-kwarg".into());
        a.push(MODEL_INFO.into());
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    /// Runs to the end: (exit code, stdout + stderr).
    fn run(&self, which: Which, args: &[String]) -> (i32, String) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.command(which, &args).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (code_of(out.status), text)
    }

    fn spawn(&self, which: Which, args: &[String]) -> Child {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.command(which, &args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
    }

    /// Waits until a trial of that job is in flight (a trial dir without result.json, agent started).
    fn wait_in_flight(&self, which: Which, job: &str, child: &mut Child) -> Vec<PathBuf> {
        let until = Instant::now() + TIMEOUT;
        loop {
            let running: Vec<PathBuf> = trial_dirs(&self.job_dir(which, job))
                .into_iter()
                .filter(|d| !d.join("result.json").exists() && d.join("agent").is_dir())
                .collect();
            if !running.is_empty() {
                // The agent's first request is on its way (each completion takes seconds).
                std::thread::sleep(Duration::from_millis(500));
                return running;
            }
            assert!(child.try_wait().unwrap().is_none(), "{which:?} Harbor exited before a trial was in flight");
            assert!(Instant::now() < until, "{which:?}: no trial in flight");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn code_of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn wait(child: &mut Child) -> std::process::ExitStatus {
    let until = Instant::now() + TIMEOUT;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("Harbor did not exit within {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn trial_dirs(job: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(job)
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.join("config.json").is_file()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn exception_type(trial: &Path) -> Option<String> {
    let path = trial.join("result.json");
    path.exists()
        .then(|| read_json(&path))
        .and_then(|r| r["exception_info"]["exception_type"].as_str().map(String::from))
}

/// How a trial ended: `None` without result.json, else its exception type or `finished`.
fn record(trial: &Path) -> Option<String> {
    trial.join("result.json").exists().then(|| exception_type(trial).unwrap_or_else(|| "finished".to_string()))
}

/// Key paths of a JSON document (objects to any depth; an array's first element stands for all).
/// A `null` field counts as absent: readers see no difference, and Harbor omits unset fields.
fn key_paths(value: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter().filter(|(_, v)| !v.is_null()) {
                let path = format!("{prefix}/{k}");
                out.insert(path.clone());
                key_paths(v, &path, out);
            }
        }
        Value::Array(items) => {
            if let Some(first) = items.first() {
                key_paths(first, &format!("{prefix}/0"), out);
            }
        }
        _ => {}
    }
}

/// Files of a dir, relative (dirs end in `/`), without descending into `skip` dirs.
fn listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            if e.path().is_dir() { format!("{name}/") } else { name }
        })
        .collect()
}

fn rewrite_port(files: &[PathBuf], from: u16, to: u16) {
    for f in files {
        let text = std::fs::read_to_string(f).unwrap();
        std::fs::write(f, text.replace(&format!(":{from}/v1"), &format!(":{to}/v1"))).unwrap();
    }
}

// ------------------------------------------------------------------------------------------ tests

#[test]
fn unknown_cli_options_are_refused_alike() {
    let Some(w) = World::new(&[("t", true)], 0.0, "") else { return };
    for args in [vec!["jobs", "start", "--foo"], vec!["jobs", "resume", "-p", "x", "--bar", "1"]] {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let (real_code, real) = w.run(Which::Real, &args);
        let (standin_code, standin) = w.run(Which::Standin, &args);
        assert_eq!(real_code, 2, "{real}");
        assert_eq!(standin_code, real_code, "{standin}");
        let option = args.iter().find(|a| a.starts_with("--")).unwrap();
        for text in [&real, &standin] {
            assert!(text.contains(&format!("No such option: {option}")), "{text}");
        }
    }
}

#[test]
fn terminus2_option_schema_refusal_is_the_same() {
    let Some(w) = World::new(&[("t", true)], 0.0, "") else { return };
    for (kwarg, key) in
        [(r#"extra_body={"chat_template_kwargs":{"enable_thinking":true}}"#, "extra_body"), ("parser=xml", "parser")]
    {
        let mut outs = Vec::new();
        for which in BOTH {
            let job = format!("schema-{key}");
            let (code, text) = w.run(which, &w.start_args(which, &job, &["--agent-kwarg", kwarg]));
            assert_eq!(code, 1, "{which:?}: {text}");
            for line in [
                "Invalid kwargs for agent 'terminus-2':".to_string(),
                format!("Unknown option '{key}'."),
                "See harbor agent schema terminus-2 for available options.".to_string(),
            ] {
                assert!(text.contains(&line), "{which:?} lacks {line:?}: {text}");
            }
            assert!(!w.job_dir(which, &job).join("config.json").exists(), "{which:?} wrote a job");
            outs.push(code);
        }
        assert_eq!(outs[0], outs[1]);
    }
}

#[test]
fn a_job_writes_the_same_files_and_fields() {
    let Some(w) = World::new(&[("good", true), ("bad", false)], 0.0, "") else { return };
    for which in BOTH {
        let (code, text) = w.run(which, &w.start_args(which, "layout", &[]));
        assert_eq!(code, 0, "{which:?}: {text}");
    }
    let real = w.job_dir(Which::Real, "layout");
    let standin = w.job_dir(Which::Standin, "layout");
    // The job dir: the stand-in writes what the real Harbor writes (trial dirs aside).
    let files = |d: &Path| listing(d).into_iter().filter(|n| !n.ends_with('/')).collect::<BTreeSet<_>>();
    assert_eq!(files(&standin), files(&real), "job dir files");
    // Trials: the same task names, the same rewards and exception types, the stand-in's files and
    // JSON fields a subset of the real ones.
    let summary = |d: &Path| {
        let mut s: Vec<(String, Value, Option<String>)> = trial_dirs(d)
            .iter()
            .map(|t| {
                let r = read_json(&t.join("result.json"));
                (
                    r["task_name"].as_str().unwrap_or("?").to_string(),
                    r["verifier_result"]["rewards"]["reward"].clone(),
                    exception_type(t),
                )
            })
            .collect();
        s.sort_by(|a, b| a.0.cmp(&b.0));
        s
    };
    assert_eq!(summary(&standin), summary(&real));
    let real_trial = &trial_dirs(&real)[0];
    for t in trial_dirs(&standin) {
        let missing: Vec<String> = listing(&t).difference(&listing(real_trial)).cloned().collect();
        assert!(missing.is_empty(), "stand-in trial files the real Harbor does not write: {missing:?}");
    }
    let mut checked = 0;
    for (name, real_doc, standin_doc) in [
        ("result.json", real.join("result.json"), standin.join("result.json")),
        ("config.json", real.join("config.json"), standin.join("config.json")),
        ("lock.json", real.join("lock.json"), standin.join("lock.json")),
        ("trial result.json", real_trial.join("result.json"), trial_dirs(&standin)[0].join("result.json")),
        ("trial config.json", real_trial.join("config.json"), trial_dirs(&standin)[0].join("config.json")),
    ] {
        let (mut r, mut s) = (BTreeSet::new(), BTreeSet::new());
        key_paths(&read_json(&real_doc), "", &mut r);
        key_paths(&read_json(&standin_doc), "", &mut s);
        let extra: Vec<&String> = s.difference(&r).collect();
        assert!(extra.is_empty(), "{name}: fields the stand-in writes and the real Harbor does not: {extra:?}");
        checked += 1;
    }
    assert_eq!(checked, 5);
}

#[test]
fn resume_compares_the_job_lock_alike() {
    let Some(w) = World::new(&[("t", true)], 0.0, "") else { return };
    let other = free_port();
    for which in BOTH {
        let (code, text) = w.run(which, &w.start_args(which, "lock", &[]));
        assert_eq!(code, 0, "{which:?}: {text}");
        let job = w.job_dir(which, "lock");
        let lock = read_json(&job.join("lock.json"));
        let base = format!("http://127.0.0.1:{}/v1", w.port);
        assert_eq!(lock["trials"][0]["agent"]["kwargs"]["api_base"], base.as_str(), "{which:?}: {lock:#}");
        let resume: Vec<String> =
            ["jobs", "resume", "-p", job.to_str().unwrap()].iter().map(|s| s.to_string()).collect();
        // Only the config.json files rewritten: the lock no longer matches.
        let mut configs = vec![job.join("config.json")];
        configs.extend(trial_dirs(&job).iter().map(|t| t.join("config.json")));
        rewrite_port(&configs, w.port, other);
        let (code, text) = w.run(which, &resume);
        assert_eq!(code, 1, "{which:?}: {text}");
        assert!(
            text.contains("already has a lock.json that does not match the resolved job lock"),
            "{which:?}: {text}"
        );
        // The job lock rewritten too: the resume goes through.
        rewrite_port(&[job.join("lock.json")], w.port, other);
        let (code, text) = w.run(which, &resume);
        assert_eq!(code, 0, "{which:?}: {text}");
    }
}

/// `signal` while trials are in flight; `resume`: in `jobs resume` of an interrupted job.
/// Returns, per Harbor, (exit code or 128+signal, how the trials that were in flight ended, distinct:
/// an exception type, `None` for no result.json). How many were in flight is timing, not contract.
fn signal_scenario(sig: &str, resume: bool) -> Option<Vec<(i32, BTreeSet<Option<String>>)>> {
    let w = World::new(&[("a", true), ("b", true)], 2.0, "")?;
    let mut out = Vec::new();
    for which in BOTH {
        let job = "sig";
        let start = w.start_args(which, job, &["--n-concurrent", "2"]);
        let mut child = w.spawn(which, &start);
        if resume {
            w.wait_in_flight(which, job, &mut child);
            send_signal(child.id() as i32, "INT");
            assert_eq!(code_of(wait(&mut child)), 130, "{which:?}: the first run's SIGINT");
            let path = w.job_dir(which, job).display().to_string();
            child = w.spawn(which, &["jobs".into(), "resume".into(), "-p".into(), path]);
        }
        let in_flight = w.wait_in_flight(which, job, &mut child);
        send_signal(child.id() as i32, sig);
        let code = code_of(wait(&mut child));
        // A trial seen in flight may still have finished before the signal landed: timing.
        out.push((code, in_flight.iter().map(|t| record(t)).filter(|r| r.as_deref() != Some("finished")).collect()));
        assert!(!in_flight.is_empty());
    }
    Some(out)
}

#[test]
fn sigterm_in_start_cancels_and_records_alike() {
    let Some(out) = signal_scenario("TERM", false) else { return };
    assert_eq!(out[0].0, 130, "real Harbor: {out:?}");
    assert!(out[0].1.iter().all(|t| t.as_deref() == Some("CancelledError")), "real Harbor: {out:?}");
    assert_eq!(out[1], out[0], "stand-in vs real");
}

#[test]
fn sigint_in_resume_cancels_and_records_alike() {
    let Some(out) = signal_scenario("INT", true) else { return };
    assert_eq!(out[0].0, 130, "real Harbor: {out:?}");
    assert!(out[0].1.iter().all(|t| t.as_deref() == Some("CancelledError")), "real Harbor: {out:?}");
    assert_eq!(out[1], out[0], "stand-in vs real");
}

#[test]
fn sigterm_in_resume_kills_without_records_alike() {
    let Some(out) = signal_scenario("TERM", true) else { return };
    assert_eq!(out[0].0, 128 + 15, "real Harbor dies of SIGTERM in resume: {out:?}");
    assert!(out[0].1.iter().all(Option::is_none), "real Harbor records nothing: {out:?}");
    assert_eq!(out[1], out[0], "stand-in vs real");
}

#[test]
fn host_variable_prompt_and_yes_alike() {
    let Some(w) = World::new(&[("t", true)], 0.0, "[verifier.env]\nCONTRACT_VAR = \"${CONTRACT_VAR}\"\n") else {
        return;
    };
    for which in BOTH {
        let mut cmd = w.command(which, &[]);
        let args = w.start_args(which, "prompt", &[]);
        let out = cmd.args(&args).env("CONTRACT_VAR", "set").output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(code_of(out.status), 1, "{which:?}: {text}");
        assert!(text.contains("Proceed? (Y/n)") && text.contains("Aborted."), "{which:?}: {text}");
        let job = w.job_dir(which, "prompt");
        assert_eq!(listing(&job), BTreeSet::from(["job.log".to_string()]), "{which:?}: only job.log is left");
        std::fs::remove_dir_all(&job).unwrap();
        let args = w.start_args(which, "prompt", &["--yes"]);
        let out = w.command(which, &[]).args(&args).env("CONTRACT_VAR", "set").output().unwrap();
        assert_eq!(code_of(out.status), 0, "{which:?} with --yes: {}", String::from_utf8_lossy(&out.stdout));
    }
}

// ------------------------------------------ the product reads both Harbors' run dirs alike

/// What the product reads of one trial dir, through `launch_spec::rundir::harbor` (the one trial
/// classifier and the typed trial result that payload's heartbeat and `check` use).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct TrialReading {
    stage: String,
    /// `result.json` read as [`hf::TrialResult`] (`None`: no result.json).
    result_reads: Option<bool>,
    exception_type: Option<String>,
    has_reward: bool,
    /// Whether the agent got output tokens (how many is the agent's turn count: not compared).
    output_tokens: Option<bool>,
    /// How the agent's time is taken: `agent_execution` (true) or the whole trial (false).
    agent_timed: Option<bool>,
    /// `check`'s instant-failure test: no output tokens and the agent ran at most 5 s.
    instant: bool,
}

use launch_spec::rundir::harbor as hf;

/// Every dir in a job dir (a dir that is no trial reads as `NotATrial`), as a multiset.
fn trial_readings(job: &Path) -> Vec<TrialReading> {
    let settings = submitter::verify::VerifySettings::default();
    let mut out: Vec<TrialReading> = std::fs::read_dir(job)
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect::<Vec<_>>())
        .unwrap_or_default()
        .iter()
        .map(|t| {
            let stage = format!("{:?}", hf::classify_trial(t));
            let result = hf::read::<hf::TrialResult>(&t.join(hf::RESULT_FILE));
            let parsed = result.as_ref().ok().and_then(Option::as_ref);
            let took = parsed.and_then(|r| r.agent_seconds(launch_spec::rundir::parse_time_ms));
            let tokens = parsed.and_then(hf::TrialResult::output_tokens);
            TrialReading {
                stage,
                result_reads: match &result {
                    Ok(None) => None,
                    Ok(Some(_)) => Some(true),
                    Err(_) => Some(false),
                },
                exception_type: parsed.and_then(|r| r.exception_type().map(String::from)),
                has_reward: parsed.is_some_and(hf::TrialResult::has_reward),
                output_tokens: tokens.map(|n| n > 0.0),
                agent_timed: took.map(|(_, agent)| agent),
                instant: parsed.is_some()
                    && tokens.is_none_or(|n| n <= 0.0)
                    && took.is_some_and(|(s, _)| s <= settings.instant_fail_s),
            }
        })
        .collect();
    out.sort();
    out
}

/// What the product reads of a job dir as a whole: the job files through their rundir models,
/// `check`'s trial scan ([`submitter::verify::check::scan_trials`]) less what is timing or a path
/// (when the newest result was written, example lines), and `check`'s state and verdict.
fn job_reading(job: &Path) -> Result<Value, String> {
    let settings = submitter::verify::VerifySettings::default();
    fn read<T: serde::de::DeserializeOwned>(job: &Path, name: &str) -> Result<Option<T>, String> {
        hf::read::<T>(&job.join(name)).map_err(|e| format!("job {name} does not read: {e}"))
    }
    let config: Option<hf::JobConfig> = read(job, hf::CONFIG_FILE)?;
    let result: Option<hf::JobResult> = read(job, hf::RESULT_FILE)?;
    let lock: Option<hf::JobLock> = read(job, hf::LOCK_FILE)?;
    let agent = config.as_ref().and_then(|c| c.agents.first());
    let scan = submitter::verify::check::scan_trials(job, settings.instant_fail_s).expect("trial scan");
    let check = submitter::verify::check::check_run_dir(job, &settings, chrono::Utc::now()).expect("check");
    let findings: BTreeSet<String> = check.findings.iter().map(|f| format!("{} {:?}", f.id, f.level)).collect();
    Ok(serde_json::json!({
        "config": config.as_ref().map(|c| serde_json::json!({
            "job_name": c.job_name,
            "n_attempts": c.n_attempts,
            "agent": agent.map(|a| (a.name.clone(), a.model_name.clone(), a.kwargs.api_base.clone(), a.kwargs.has_model_info())),
            "datasets": c.datasets.iter().map(|d| d.path.clone()).collect::<Vec<_>>(),
        })),
        "result": result.as_ref().map(|r| serde_json::json!({
            "started": r.started_at.as_deref().and_then(launch_spec::rundir::parse_time).is_some(),
            "updated": r.updated_at.as_deref().and_then(launch_spec::rundir::parse_time).is_some(),
            "finished": r.finished_at.as_deref().and_then(launch_spec::rundir::parse_time).is_some(),
            "n_total_trials": r.n_total_trials,
            "stats": r.stats.is_some(),
        })),
        "lock": lock.as_ref().map(|l| (l.schema_version, l.harbor_version().map(String::from))),
        "expected_trials": launch_spec::rundir::expected_trials_in(job),
        "scan": {
            "dirs": scan.dirs, "done": scan.done, "active": scan.active, "queued": scan.queued,
            "unconstructed": scan.unconstructed, "errored": scan.errored, "valid": scan.valid,
            "errors_by_type": scan.errors_by_type, "instant_failures": scan.instant_failures,
            "instant_types": scan.instant_types,
            "api_bases": scan.api_bases.iter().map(|(k, v)| (k.clone(), v.0)).collect::<BTreeMap<_, _>>(),
            "model_info_warnings": scan.model_info_warnings,
            "has_last_result": scan.last_result_at.is_some(),
        },
        // payload's heartbeat counts the same trials with the same reader (started = active + done).
        "payload_trials": payload_trials(job),
        "check_trials": check_trials(&scan),
        "check": {
            "state": format!("{:?}", check.state),
            "verdict": format!("{:?}", check.verdict),
            "status_verdict": format!("{:?}", check.status_verdict),
            "findings": findings,
        },
    }))
}

/// payload's heartbeat counts (started, finished, errored).
fn payload_trials(job: &Path) -> (u64, u64, u64) {
    let t = payload::records::count_trials(job);
    (t.started, t.finished, t.errored)
}

/// The same counts from `check`'s scan.
fn check_trials(scan: &submitter::verify::rules::TrialScan) -> (u64, u64, u64) {
    (scan.active + scan.done, scan.done, scan.errored)
}

/// payload's heartbeat and `check` read trial dirs with one reader (launch_spec::rundir::harbor::
/// read_trial): one symlink rule, one size cap, one "errored" rule. Before, payload streamed at
/// most 8 MiB of a `result.json` (a 10 MiB errored trial was not errored to it) and took any
/// non-null `exception_info` as an error; `check` read up to 16 MiB into Harbor's typed model.
#[test]
fn payload_and_check_count_the_same_trials() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let trial = |name: &str, files: &[(&str, &[u8])]| {
        let dir = run.join(name);
        for sub in launch_spec::rundir::harbor::TRIAL_SUBDIRS {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        for (file, body) in files {
            std::fs::write(dir.join(file), body).unwrap();
        }
        dir
    };
    let padded = |bytes: usize, exception: &str| {
        format!(r#"{{"exception_info": {exception}, "pad": "{}"}}"#, "x".repeat(bytes)).into_bytes()
    };
    let raised = r#"{"exception_type": "AgentTimeoutError"}"#;
    trial("queued", &[("lock.json", b"{}"), ("trial.log", b"")]);
    trial("running", &[("lock.json", b"{}"), ("config.json", b"{}")]);
    trial("ok", &[("config.json", b"{}"), ("result.json", br#"{"exception_info": null}"#)]);
    trial("errored", &[("config.json", b"{}"), ("result.json", &padded(10, raised))]);
    // Between the old 8 MiB stream and the 16 MiB cap: errored to both now.
    for name in ["big_errored", "big_errored_too"] {
        trial(name, &[("config.json", b"{}"), ("result.json", &padded(10 << 20, raised))]);
    }
    // Over the cap: done, not read (neither errored nor rewarded).
    trial("huge", &[("config.json", b"{}"), ("result.json", &padded(17 << 20, raised))]);
    // Not Harbor's shape (an exception that is no object): done, unread.
    trial("odd", &[("config.json", b"{}"), ("result.json", br#"{"exception_info": "boom"}"#)]);
    // A result.json that is a symlink is no result: still running to both.
    let elsewhere = tmp.path().join("elsewhere.json");
    std::fs::write(&elsewhere, padded(1, raised)).unwrap();
    let linked = trial("linked_result", &[("config.json", b"{}")]);
    std::os::unix::fs::symlink(&elsewhere, linked.join("result.json")).unwrap();
    // A symlinked trial dir is no trial.
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("config.json"), b"{}").unwrap();
    std::fs::write(outside.join("result.json"), padded(1, raised)).unwrap();
    std::os::unix::fs::symlink(&outside, run.join("linked_dir")).unwrap();

    let settings = submitter::verify::VerifySettings::default();
    let scan = submitter::verify::check::scan_trials(&run, settings.instant_fail_s).unwrap();
    // started: running, linked_result and the 6 done; errored: errored and the two big ones (before:
    // payload errored, odd; check errored and the two big ones).
    assert_eq!(payload_trials(&run), (8, 6, 3), "payload's heartbeat");
    assert_eq!(check_trials(&scan), (8, 6, 3), "check's scan");
    assert_eq!((scan.queued, scan.dirs), (1, 9));
}

/// Both readings of a job dir that Harbor is writing: taken until two in a row agree and every
/// file reads (Harbor rewrites the job `result.json` in place, so a read can catch it empty).
fn settled_reading(job: &Path) -> (Vec<TrialReading>, Value) {
    let until = Instant::now() + Duration::from_secs(30);
    let mut last: Option<(Vec<TrialReading>, Result<Value, String>)> = None;
    loop {
        let now = (trial_readings(job), job_reading(job));
        if let (Some((t, Ok(j))), (nt, Ok(nj))) = (&last, &now)
            && t == nt
            && j == nj
            && t.iter().all(|r| r.result_reads != Some(false))
        {
            return (nt.clone(), nj.clone());
        }
        assert!(Instant::now() < until, "{}: no settled reading: {now:?}", job.display());
        last = Some(now);
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Asserts both Harbors' job dirs read alike: the trial readings (a multiset) and the job reading.
/// Returns the real Harbor's trial readings.
fn assert_read_alike(w: &World, job: &str, when: &str) -> Vec<TrialReading> {
    let real = w.job_dir(Which::Real, job);
    let standin = w.job_dir(Which::Standin, job);
    let (r, s) = (trial_readings(&real), trial_readings(&standin));
    assert_eq!(s, r, "{when}: the stand-in's trial dirs (left) read unlike the real Harbor's (right)");
    let (rj, sj) = (job_reading(&real).unwrap(), job_reading(&standin).unwrap());
    assert_eq!(sj, rj, "{when}: the stand-in's job dir (left) reads unlike the real Harbor's (right)");
    r
}

use std::collections::BTreeMap;

#[test]
fn trial_dirs_read_alike_at_the_end_of_a_healthy_run() {
    let Some(w) = World::new(&[("good", true), ("bad", false)], 0.0, "") else { return };
    for which in BOTH {
        let (code, text) = w.run(which, &w.start_args(which, "healthy", &["--n-concurrent", "2"]));
        assert_eq!(code, 0, "{which:?}: {text}");
    }
    let real = assert_read_alike(&w, "healthy", "finished");
    let done = |r: &TrialReading| r.stage == "Done" && r.exception_type.is_none() && r.has_reward;
    assert!(real.len() == 2 && real.iter().all(done), "the real Harbor scored both: {real:#?}");
}

#[test]
fn trial_dirs_read_alike_when_the_agent_errors() {
    // Every completion is vLLM's 400 context-overflow error. terminus-2 summarises by default and
    // goes on until its timeout (a 300 s task timeout × 0.03); without summarising the overflow
    // ends the agent at once: an instant failure.
    let engine = [("STANDIN_BAD_REQUEST_AFTER", "0")];
    let Some(w) = World::with_engine_env(&[("a", false), ("b", false)], 0.0, "", &engine) else { return };
    for (job, extra, expect) in [
        ("summarising", ["--agent-timeout-multiplier", "0.03"], "AgentTimeoutError"),
        ("not-summarising", ["--agent-kwarg", "enable_summarize=false"], "ContextLengthExceededError"),
    ] {
        for which in BOTH {
            let (code, text) =
                w.run(which, &w.start_args(which, job, &[&["--n-concurrent", "2"], &extra[..]].concat()));
            assert_eq!(code, 0, "{which:?}: {text}");
        }
        let real = assert_read_alike(&w, job, job);
        assert!(real.iter().all(|r| r.exception_type.as_deref() == Some(expect)), "the real Harbor: {real:#?}");
    }
}

#[test]
fn trial_dirs_read_alike_mid_run_and_after_sigint() {
    // One trial at a time, each completion 2 s: a trial is in flight for seconds.
    let Some(w) = World::new(&[("a", true), ("b", true), ("c", true)], 2.0, "") else { return };
    let job = "midrun";
    let stages =
        |which: Which| -> Vec<String> { trial_readings(&w.job_dir(which, job)).into_iter().map(|r| r.stage).collect() };
    let mut mid = Vec::new();
    for which in BOTH {
        let before = w.requests().len();
        let mut child = w.spawn(which, &w.start_args(which, job, &["--n-concurrent", "1"]));
        // Mid-run: the first trial done, the second running, the third not begun.
        let until = Instant::now() + TIMEOUT;
        while stages(which) != ["Done", "Running"] {
            assert!(child.try_wait().unwrap().is_none(), "{which:?} exited before: {:?}", stages(which));
            assert!(Instant::now() < until, "{which:?}: never one done and one running: {:?}", stages(which));
            std::thread::sleep(Duration::from_millis(50));
        }
        let dir = w.job_dir(which, job);
        mid.push(settled_reading(&dir));
        // The second trial's agent is executing once its first request reached the engine (the
        // sandbox setup before it is seconds long for the real Harbor): SIGINT then, while that
        // completion (2 s) is on its way.
        let running = trial_dirs(&dir).into_iter().find(|t| !t.join(hf::RESULT_FILE).exists()).expect("running");
        let task = running.file_name().unwrap().to_string_lossy().split("__").next().unwrap().to_string();
        let asks = |r: &String| r.contains(&format!("Write {task} to"));
        while !w.requests()[before..].iter().any(asks) {
            assert!(child.try_wait().unwrap().is_none() && Instant::now() < until, "{which:?}: no request");
            std::thread::sleep(Duration::from_millis(50));
        }
        send_signal(child.id() as i32, "INT");
        assert_eq!(code_of(wait(&mut child)), 130, "{which:?}");
    }
    assert_eq!(mid[1].0, mid[0].0, "mid-run: the stand-in's trial dirs (left) read unlike the real Harbor's (right)");
    assert_eq!(mid[1].1, mid[0].1, "mid-run: the stand-in's job dir (left) reads unlike the real Harbor's (right)");
    let real = assert_read_alike(&w, job, "after SIGINT mid-run");
    let types: Vec<Option<&str>> = real.iter().map(|r| r.exception_type.as_deref()).collect();
    assert_eq!(types, [None, Some("CancelledError")], "the real Harbor: {real:#?}");
}

#[test]
fn trial_dirs_read_alike_when_the_agent_cannot_be_constructed() {
    // terminus-2 without `--model` raises in `Trial.__init__`: the trial dir keeps the layout of a
    // trial before its environment starts (`lock.json`, an empty `trial.log`, empty `agent/`,
    // `verifier/`, `artifacts/`, no `config.json`) and the job ends with exit 1.
    let Some(w) = World::new(&[("a", true)], 0.0, "") else { return };
    let job = "unconstructed";
    for which in BOTH {
        let mut args = w.start_args(which, job, &[]);
        let at = args.iter().position(|a| a == "--model").unwrap();
        args.drain(at..at + 2);
        let (code, text) = w.run(which, &args);
        assert_eq!(code, 1, "{which:?}: {text}");
        assert!(text.contains("model_name is required for Terminus 2"), "{which:?}: {text}");
    }
    let real = assert_read_alike(&w, job, "agent not constructed");
    assert_eq!(real.iter().map(|r| r.stage.as_str()).collect::<Vec<_>>(), ["Queued"], "the real Harbor: {real:#?}");
    let trial = std::fs::read_dir(w.job_dir(Which::Real, job)).unwrap().flatten().find(|e| e.path().is_dir()).unwrap();
    let expect: BTreeSet<String> =
        ["lock.json", "trial.log", "agent/", "verifier/", "artifacts/"].iter().map(|s| s.to_string()).collect();
    assert_eq!(listing(&trial.path()), expect, "the real Harbor's layout");
}

#[test]
fn trial_dirs_read_alike_when_the_engine_is_unreachable() {
    // `api_base` names a port nothing listens on (a tunnel that is down): litellm's retries, then
    // the agent fails; no verifier.
    let Some(w) = World::new(&[("a", true)], 0.0, "") else { return };
    let dead = format!("api_base=http://127.0.0.1:{}/v1", free_port());
    for which in BOTH {
        let args = w.start_args(which, "unreachable", &["--agent-kwarg", &dead]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // The stand-in waits litellm's real 4–15 s between attempts (it scales them down by
        // default): the agent runs seconds, no instant failure, as with the real Harbor.
        let out = w.command(which, &args).env("STANDIN_RETRY_SCALE", "1").output().unwrap();
        assert_eq!(code_of(out.status), 0, "{which:?}: {}", String::from_utf8_lossy(&out.stdout));
    }
    let real = assert_read_alike(&w, "unreachable", "engine unreachable");
    assert!(real.iter().all(|r| r.exception_type.as_deref() == Some("InternalServerError")), "{real:#?}");
}
