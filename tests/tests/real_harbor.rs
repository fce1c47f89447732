//! End-to-end tests of `payload run` against the **real Harbor 0.25.0** (installed by
//! `scripts/install-harbor.sh`; these tests skip with a note when it is absent, and fail under
//! `CI=true`), every scenario also against **Harbor 0.26.0** in a root of its own (a twin named
//! `*_on_harbor_026`/`*_with_harbor_026`: the same scenario function, the release a parameter; issue
//! 35, docs/real-programs.md "Harbor 0.26.0 beside 0.25.0"); a resume across the two releases is held
//! to what the real Harbors do. The model server is the vLLM stand-in answering as a terminus-2 agent would
//! (`STANDIN_CHAT_AGENT=terminus`), the trials run on the host through
//! `tests/harbor_env/host_env.py` (`--env host_env:HostEnvironment`), and every task is a real
//! Harbor task dir written here: `task.toml`, `instruction.md`, `tests/test.sh`. A trial is scored
//! when Harbor's verifier ran `tests/test.sh` and wrote its reward.
//!
//! Every child payload starts carries `PAYLOAD_RUN_ID=<run_tag>-<payload pid>`, so do Harbor's
//! sandboxes (the namespace holders, the tmux servers): none may survive payload.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use e2e::harness::{marker_processes, payload_bin, real_harbor, real_harbor_release, send_signal, unique};
use launch_spec::spec::Limits;
use launch_spec::testkit::{TestSpec, world};
use launch_spec::versions::{HarborDialect, VERIFIED_HARBOR, VERIFIED_VLLM, Version};

const VLLM: &str = env!("CARGO_BIN_EXE_vllm-standin");
const HOST_ENV_PY: &str = include_str!("../harbor_env/host_env.py");
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

const GPU_FIXTURE: &str = r#"[
  {"index": 0, "uuid": "GPU-bbbb0000-0000-4000-8000-000000000000", "name": "NVIDIA A100-SXM-64GB", "memory_total_bytes": 68719476736},
  {"index": 1, "uuid": "GPU-bbbb0000-0000-4000-8000-000000000001", "name": "NVIDIA A100-SXM-64GB", "memory_total_bytes": 68719476736}
]"#;

const HARBOR_YAML: &str =
    "orchestrator:\n  type: local\n  quiet: true\nenvironment:\n  type: daytona\n  delete: true\n";

// Generous: the machine is loaded and a real Harbor starts in seconds, not milliseconds.
const RUN_TIMEOUT: Duration = Duration::from_secs(240);

/// One task: the agent is told to write `answer`; the verifier gives 1.0 when it equals `word`.
struct Task {
    name: String,
    word: String,
    answer: String,
}

impl Task {
    fn solvable(name: &str) -> Self {
        Task { name: name.to_string(), word: format!("word-{name}"), answer: format!("word-{name}") }
    }

    fn unsolvable(name: &str) -> Self {
        Task { name: name.to_string(), word: format!("word-{name}"), answer: "something-else".to_string() }
    }
}

/// Writes a Harbor 0.25 task dir (the format `harbor jobs start -p` reads).
fn write_task(dataset: &Path, task: &Task, extra_toml: &str) {
    world::harbor_task(dataset, &task.name, &task.word, &task.answer, extra_toml);
}

/// One test's world: env prefix (`bin/vllm` → stand-in, `bin/harbor` → the real Harbor), the host
/// environment module, a dataset, a Harbor YAML, secrets, a GPU fixture, a jobs dir.
struct Fx {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    tag: String,
    /// The Harbor release `bin/harbor` runs, declared in the spec as the profile would.
    release: Version,
}

/// Harbor 0.26.0, the second release the CI installs.
const HARBOR_026: Version = Version::new(0, 26, 0);

impl Fx {
    /// The world on the real Harbor `release`; `None` (after a note) when it is not installed.
    fn on(release: Version, name: &str, tasks: &[Task]) -> Option<Self> {
        let harbor = real_harbor_release(release)?;
        let tmp = tempfile::Builder::new().prefix("real-harbor-").tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let tag = format!("{name}-{}", unique());
        world::link_programs(&root.join("env"), &[("vllm", Path::new(VLLM)), ("harbor", &harbor)]);
        std::fs::create_dir_all(root.join("py")).unwrap();
        std::fs::write(root.join("py/host_env.py"), HOST_ENV_PY).unwrap();
        for task in tasks {
            write_task(&root.join("data"), task, "");
        }
        std::fs::create_dir_all(root.join("jobs")).unwrap();
        std::fs::write(root.join("harbor.yaml"), HARBOR_YAML).unwrap();
        std::fs::write(root.join("gpus.json"), GPU_FIXTURE).unwrap();
        let secrets = format!("DAYTONA_API_KEY=unused-{tag}\nDAYTONA_DATA_API_KEY=unused2-{tag}\n");
        world::write_secrets(&root.join("secrets.env"), &secrets, 0o600);
        Some(Self { _tmp: tmp, root, tag, release })
    }

    fn run_dir(&self) -> PathBuf {
        self.root.join("jobs").join(&self.tag)
    }

    /// The stand-in vLLM and the real Harbor (launch_spec::testkit); tests edit the JSON.
    fn spec(&self) -> Value {
        let mut spec = TestSpec::standins(&self.root, &self.tag)
            .benchmark("real-harbor")
            .tp_dp(1, 2)
            // Large enough that terminus-2's proactive summarization (8000 free tokens) stays off.
            .max_model_len(32768)
            .max_num_seqs(64)
            .health_timeout_s(60)
            .serve_env("STANDIN_LOAD_SECONDS", "0.2")
            .serve_env("STANDIN_GPUS", "2")
            .serve_env("STANDIN_CHAT_AGENT", "terminus")
            .serve_env("STANDIN_REQUEST_LOG", self.root.join("requests.jsonl").display().to_string())
            // Last --env wins in Harbor: the host environment instead of a cloud sandbox.
            .harbor_extra_args(&["--env", "host_env:HostEnvironment"])
            // The wrapper shows Harbor only /tmp and these: the repo holds the shipped YAMLs.
            .harbor_env("PYTHONPATH", self.root.join("py").display().to_string())
            .harbor_env("EVALCI_HARBOR_BINDS", repo().display().to_string())
            .limits(Limits {
                // Harbor winds itself down on SIGTERM; on a loaded machine with two real Harbors
                // doing so beside each other that took over 20 s, so the signal cases allow 60.
                teardown_grace_s: 60.0,
                walltime_lead_s: 30,
                heartbeat_interval_s: 0.5,
                // No test here kills the engine: a loaded CI machine (real Harbors starting in
                // parallel) must not read a slow /health answer as a dead engine (10 s of silence).
                health_probe_interval_s: 1.0,
                health_failures: 10,
            })
            .to_value();
        // What `submitter spec` writes for an environment that declares this Harbor: its dialect,
        // and the declaration payload checks the environment against (and a resume, issue 35).
        let (dialect, _) = HarborDialect::from_declared(&self.release.to_string()).unwrap();
        spec["harbor"]["dialect"] = json!(dialect);
        spec["declared"] = json!({"engine_environment": "env", "vllm": VERIFIED_VLLM,
                                  "harbor_environment": "env", "harbor": self.release.to_string()});
        spec
    }

    fn start(&self, spec: &Value, slurm_job_id: &str) -> Run {
        let path = self.root.join(format!("launch-{slurm_job_id}.json"));
        std::fs::write(&path, serde_json::to_string_pretty(spec).unwrap()).unwrap();
        let stderr = std::fs::File::create(self.root.join(format!("payload-{slurm_job_id}.stderr"))).unwrap();
        let child = Command::new(payload_bin())
            .args(["run", "--spec", path.to_str().unwrap()])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
            .env("HOME", &self.root)
            .env("PAYLOAD_GPU_FIXTURE", self.root.join("gpus.json"))
            .env("SLURM_JOB_ID", slurm_job_id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn payload");
        let pid = child.id() as i32;
        Run {
            child,
            pid,
            marker: format!("PAYLOAD_RUN_ID={}-{pid}", self.tag),
            stderr: self.root.join(format!("payload-{slurm_job_id}.stderr")),
        }
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

    fn last_event(&self, name: &str) -> Option<Value> {
        self.events().into_iter().rev().find(|e| e["event"] == name)
    }

    fn harbor_log(&self) -> String {
        let text = std::fs::read_to_string(self.run_dir().join("harbor.log")).unwrap_or_default();
        let mut start = text.len().saturating_sub(6000);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text[start..].to_string()
    }

    /// What a failed assertion should show: payload's stderr and the end of Harbor's log.
    fn context(&self, run: &Run) -> String {
        format!(
            "payload stderr:\n{}\nharbor.log (end):\n{}",
            std::fs::read_to_string(&run.stderr).unwrap_or_default(),
            self.harbor_log()
        )
    }

    /// Harbor's trial dirs in the run dir (those with a `config.json`).
    fn trials(&self) -> Vec<Trial> {
        let mut out: Vec<Trial> = std::fs::read_dir(self.run_dir())
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().join("config.json").is_file())
                    .map(|e| Trial { dir: e.path(), result: read_json(&e.path().join("result.json")) })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(|a, b| a.dir.cmp(&b.dir));
        out
    }

    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(self.root.join("requests.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits until trials are in flight: trial dirs without `result.json` whose agent has talked
    /// to the model since `requests_before`.
    fn wait_in_flight(&self, run: &mut Run, requests_before: usize) -> Vec<PathBuf> {
        let until = Instant::now() + RUN_TIMEOUT;
        loop {
            let running: Vec<PathBuf> =
                self.trials().into_iter().filter(|t| t.result.is_none()).map(|t| t.dir).collect();
            if !running.is_empty() && self.requests().len() > requests_before {
                return running;
            }
            if let Some(code) = run.exited() {
                panic!("payload exited ({code}) before any trial was in flight\n{}", self.context(run));
            }
            assert!(Instant::now() < until, "no trial in flight after {RUN_TIMEOUT:?}\n{}", self.context(run));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every task has a trial scored by Harbor's verifier: the rewards by task name.
    fn rewards(&self) -> Vec<(String, Option<f64>)> {
        self.trials()
            .iter()
            .map(|t| {
                let r = t.result.as_ref();
                (
                    r.and_then(|r| r["task_name"].as_str()).unwrap_or("?").to_string(),
                    r.and_then(|r| r.pointer("/verifier_result/rewards/reward")).and_then(Value::as_f64),
                )
            })
            .collect()
    }
}

struct Trial {
    dir: PathBuf,
    result: Option<Value>,
}

struct Run {
    child: Child,
    pid: i32,
    marker: String,
    stderr: PathBuf,
}

impl Run {
    fn exited(&mut self) -> Option<i32> {
        self.child.try_wait().unwrap().map(|s| {
            use std::os::unix::process::ExitStatusExt;
            s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
        })
    }

    fn wait(&mut self, fx: &Fx) -> i32 {
        let until = Instant::now() + RUN_TIMEOUT;
        loop {
            if let Some(code) = self.exited() {
                return code;
            }
            if Instant::now() >= until {
                let _ = self.child.kill();
                panic!("payload did not exit within {RUN_TIMEOUT:?}\n{}", fx.context(self));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Nothing of the run may be left: no child, no sandbox, no tmux server.
    fn assert_no_survivors(&self) {
        let left = marker_processes(&self.marker);
        assert!(left.is_empty(), "processes survived payload: {left:#?}");
    }
}

fn repo() -> PathBuf {
    Path::new(REPO).canonicalize().unwrap()
}

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn yaml_file(path: &str) -> Value {
    let text = std::fs::read_to_string(Path::new(REPO).join(path)).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn all_scored(fx: &Fx, want: &[(&str, f64)]) {
    let mut got = fx.rewards();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    let want: Vec<(String, Option<f64>)> = want.iter().map(|(n, r)| (n.to_string(), Some(*r))).collect();
    assert_eq!(got, want, "every task scored by Harbor's verifier");
}

/// A finished run, as `payload run` should leave it.
fn assert_finished(fx: &Fx, run: &mut Run) {
    let code = run.wait(fx);
    assert_eq!(code, 0, "{}", fx.context(run));
    run.assert_no_survivors();
    let st = fx.status();
    assert_eq!(st["outcome"]["class"], "finished", "{st:#}");
    assert_eq!(st["outcome"]["harbor_exit_code"], 0, "{st:#}");
}

// ------------------------------------------------------------------------------------------ tests

#[test]
fn fresh_run_scores_every_trial_with_the_real_harbor() {
    fresh_run(VERIFIED_HARBOR, "rh-fresh", "5101");
}

/// Harbor 0.26's happy path: the same scores; the run dir names the Harbor that produced them
/// (job lock, payload's provenance), and every trial carries 0.26's own validity verdict.
#[test]
fn fresh_run_scores_every_trial_with_harbor_026() {
    fresh_run(HARBOR_026, "rh26-fresh", "6101");
}

fn fresh_run(release: Version, name: &str, job_id: &str) {
    let Some(fx) = Fx::on(release, name, &[Task::solvable("alpha"), Task::unsolvable("beta")]) else { return };
    let t = Instant::now();
    let mut run = fx.start(&fx.spec(), job_id);
    assert_finished(&fx, &mut run);
    println!("real Harbor {release} fresh run: {:.1}s", t.elapsed().as_secs_f64());
    assert_eq!(fx.status()["provenance"]["harbor_version"], release.to_string(), "{:#}", fx.status());
    assert_eq!(
        launch_spec::rundir::harbor::newest_writer(&fx.run_dir()),
        Some(release),
        "the job lock names the Harbor that wrote the dir"
    );
    let verdicts: Vec<Option<bool>> =
        fx.trials().iter().map(|t| t.result.as_ref().and_then(|r| r["reward_valid"].as_bool())).collect();
    let written = if release >= HARBOR_026 { Some(true) } else { None };
    assert_eq!(verdicts, [written, written], "Harbor {release}'s reward_valid in each trial result.json");
    let facts = launch_spec::rundir::harbor::trial_facts(&fx.run_dir()).unwrap();
    assert!(facts.iter().all(|f| f.valid), "{facts:?}");
    // The verifier really checks: the agent wrote the wrong word for beta.
    all_scored(&fx, &[("alpha", 1.0), ("beta", 0.0)]);
    let job = read_json(&fx.run_dir().join("result.json")).expect("Harbor's job result.json");
    assert!(job["finished_at"].is_string(), "{job:#}");
    let port = fx.status()["port"].as_u64().unwrap();
    let lock = read_json(&fx.run_dir().join("lock.json")).expect("Harbor's job lock.json");
    for trial in lock["trials"].as_array().unwrap() {
        assert_eq!(
            trial.pointer("/agent/kwargs/api_base").and_then(Value::as_str),
            Some(&*format!("http://127.0.0.1:{port}/v1"))
        );
        assert!(trial.pointer("/agent/kwargs/model_info/max_input_tokens").is_some(), "{trial:#}");
    }
    // Three turns per trial (command, complete, confirm), all to the served model.
    let requests = fx.requests();
    assert!(requests.len() >= 6, "{} requests", requests.len());
    assert!(requests.iter().all(|r| r["model"] == "Qwen3-8B"));
}

/// A re-evaluation is a new run (issue 20), with the real Harbor: resuming the finished job is
/// refused before the engine loads (Harbor's resume would run no trial and rewrite the result), and
/// the re-evaluation as `submitter launch` writes it — a fresh spec in a run dir of its own — scores
/// every trial again, the first job's files untouched; both runs record the versions the
/// environment reported.
#[test]
fn a_re_evaluation_scores_every_trial_again_in_a_run_dir_of_its_own() {
    re_evaluation(VERIFIED_HARBOR, "rh-reeval", ["5901", "5902", "5903"]);
}

#[test]
fn a_re_evaluation_scores_every_trial_again_in_a_run_dir_of_its_own_on_harbor_026() {
    re_evaluation(HARBOR_026, "rh26-reeval", ["6901", "6902", "6903"]);
}

fn re_evaluation(release: Version, name: &str, job_ids: [&str; 3]) {
    let Some(fx) = Fx::on(release, name, &[Task::solvable("alpha"), Task::unsolvable("beta")]) else { return };
    let spec = fx.spec();
    let mut run = fx.start(&spec, job_ids[0]);
    assert_finished(&fx, &mut run);
    assert_eq!(fx.status()["provenance"]["harbor_version"], release.to_string(), "{:#}", fx.status());
    let first_result = std::fs::read(fx.run_dir().join("result.json")).unwrap();
    let trials = fx.trials().len();
    assert_eq!(trials, 2);

    let mut again = fx.start(&spec, job_ids[1]);
    assert_eq!(again.wait(&fx), 14, "{}", fx.context(&again));
    let message = fx.status()["outcome"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("finished") && message.contains("run no trial"), "{message}");
    assert_eq!(std::fs::read(fx.run_dir().join("result.json")).unwrap(), first_result);

    let tag = format!("{}-r2-0123abcd", fx.tag);
    let dir = fx.root.join("jobs").join(&tag);
    let mut fresh = spec.clone();
    fresh["run_tag"] = json!(tag);
    fresh["run_dir"] = json!(dir);
    fresh["harbor"]["start"] = json!("fresh");
    let mut run = fx.start(&fresh, job_ids[2]);
    assert_eq!(run.wait(&fx), 0, "{}", fx.context(&run));
    run.assert_no_survivors();
    let status = read_json(&dir.join("status.json")).unwrap();
    assert_eq!(status["outcome"]["class"], "finished", "{status:#}");
    assert_eq!(status["resume"], false, "{status:#}");
    assert_eq!(status["provenance"]["harbor_version"], release.to_string(), "{status:#}");
    let mut rewards: Vec<(String, Option<f64>)> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter_map(|e| read_json(&e.path().join("result.json")).filter(|r| r.get("task_name").is_some()))
        .map(|r| {
            let reward = r.pointer("/verifier_result/rewards/reward").and_then(Value::as_f64);
            (r["task_name"].as_str().unwrap_or("?").to_string(), reward)
        })
        .collect();
    rewards.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(rewards, [("alpha".to_string(), Some(1.0)), ("beta".to_string(), Some(0.0))], "every trial ran again");
    assert_eq!(std::fs::read(fx.run_dir().join("result.json")).unwrap(), first_result, "the first result is kept");
    all_scored(&fx, &[("alpha", 1.0), ("beta", 0.0)]);
}

#[test]
fn resume_after_the_port_changed_scores_every_trial() {
    resume_after_the_port_changed(VERIFIED_HARBOR, "rh-resume", ["5201", "5202"]);
}

/// Harbor 0.26 writes its resolved retry exclusions and the trials' error policy into the job's
/// files: its own resume of them, after payload's `api_base` rewrite, still matches its lock.
#[test]
fn resume_after_the_port_changed_scores_every_trial_on_harbor_026() {
    resume_after_the_port_changed(HARBOR_026, "rh26-resume", ["6201", "6202"]);
}

fn resume_after_the_port_changed(release: Version, name: &str, job_ids: [&str; 2]) {
    let tasks = [Task::solvable("one"), Task::solvable("two"), Task::solvable("three")];
    let Some(fx) = Fx::on(release, name, &tasks) else { return };
    let mut spec = fx.spec();
    spec["harbor"]["n_concurrent"] = json!(1);
    spec["serve"]["env"]["STANDIN_RESPONSE_SECONDS"] = json!("1");
    let mut run = fx.start(&spec, job_ids[0]);
    // Interrupted after one trial finished.
    let until = Instant::now() + RUN_TIMEOUT;
    while !fx.trials().iter().any(|t| t.result.is_some()) {
        assert!(run.exited().is_none() && Instant::now() < until, "no trial finished\n{}", fx.context(&run));
        std::thread::sleep(Duration::from_millis(100));
    }
    send_signal(run.pid, "TERM");
    assert_eq!(run.wait(&fx), 143, "{}", fx.context(&run));
    run.assert_no_survivors();
    let old_port = fx.status()["port"].as_u64().unwrap();

    // Another job, another port: payload must make Harbor's resume accept the new server.
    spec["serve"]["env"]["STANDIN_RESPONSE_SECONDS"] = json!("0");
    let mut run = fx.start(&spec, job_ids[1]);
    assert_finished(&fx, &mut run);
    let st = fx.status();
    assert_eq!(st["resume"], true);
    let new_port = st["port"].as_u64().unwrap();
    assert_ne!(new_port, old_port);
    all_scored(&fx, &[("one", 1.0), ("three", 1.0), ("two", 1.0)]);
    let base = format!("http://127.0.0.1:{new_port}/v1");
    let job = read_json(&fx.run_dir().join("config.json")).unwrap();
    assert_eq!(job.pointer("/agents/0/kwargs/api_base").and_then(Value::as_str), Some(base.as_str()));
    let lock = read_json(&fx.run_dir().join("lock.json")).unwrap();
    for trial in lock["trials"].as_array().unwrap() {
        assert_eq!(trial.pointer("/agent/kwargs/api_base").and_then(Value::as_str), Some(base.as_str()), "{trial:#}");
    }
}

/// `TERM` or `USR1` while trials are in flight, during `jobs start` (`resume: false`) or during
/// `jobs resume` (`resume: true`, after a first interrupted run on another port).
/// `job_id`: the Slurm job id of the (first) run, distinct per test and ten apart: the engine's port
/// derives from it, and tests run in parallel (two payloads on one port would answer each other's
/// readiness probes).
fn signal_case(name: &str, sig: &str, resume: bool, job_id: u32) {
    signal_case_on(VERIFIED_HARBOR, name, sig, resume, job_id);
}

fn signal_case_on(release: Version, name: &str, sig: &str, resume: bool, job_id: u32) {
    let tasks = [Task::solvable("p"), Task::solvable("q"), Task::solvable("r")];
    let Some(fx) = Fx::on(release, name, &tasks) else { return };
    let mut spec = fx.spec();
    // Each completion takes 2 s: a trial (three completions) is in flight for several seconds.
    spec["serve"]["env"]["STANDIN_RESPONSE_SECONDS"] = json!("2");
    let mut job_id = job_id;
    if resume {
        let mut first = fx.start(&spec, &job_id.to_string());
        fx.wait_in_flight(&mut first, 0);
        send_signal(first.pid, "TERM");
        assert_eq!(first.wait(&fx), 143, "{}", fx.context(&first));
        first.assert_no_survivors();
        job_id += 1;
    }
    let before = fx.requests().len();
    let mut run = fx.start(&spec, &job_id.to_string());
    let in_flight = fx.wait_in_flight(&mut run, before);
    let t = Instant::now();
    send_signal(run.pid, sig);
    let code = run.wait(&fx);
    println!("{name}: payload exited {code} {:.1}s after SIG{sig}", t.elapsed().as_secs_f64());
    let (want_code, want_class) = if sig == "USR1" { (15, "walltime") } else { (143, "interrupted") };
    assert_eq!(code, want_code, "{}", fx.context(&run));
    run.assert_no_survivors();
    let st = fx.status();
    assert_eq!(st["resume"], resume, "{st:#}");
    assert_eq!(st["outcome"]["class"], want_class, "{st:#}");
    // Harbor wound down by itself (it was not SIGKILLed) and recorded every trial it had started.
    let td = fx.last_event("teardown_done").expect("teardown_done event");
    let killed = td["fields"]["killed_groups"].as_array().cloned().unwrap_or_default();
    assert!(!killed.contains(&json!("harbor")), "Harbor had to be killed: {td}\n{}", fx.context(&run));
    for trial in fx.trials() {
        let result = trial.result.unwrap_or_else(|| {
            panic!("trial {} has no result.json after the wind-down\n{}", trial.dir.display(), fx.context(&run))
        });
        // In flight when the signal was sent: cancelled, or it finished (scored) just before.
        if in_flight.contains(&trial.dir) {
            let cancelled =
                result.pointer("/exception_info/exception_type").and_then(Value::as_str) == Some("CancelledError");
            let scored = result.pointer("/verifier_result/rewards/reward").is_some();
            assert!(cancelled || scored, "{}: {result:#}", trial.dir.display());
        }
    }
}

#[test]
fn sigterm_during_start_records_every_trial_in_flight() {
    signal_case("rh-term-start", "TERM", false, 5300);
}

#[test]
fn usr1_during_start_records_every_trial_in_flight() {
    signal_case("rh-usr1-start", "USR1", false, 5310);
}

#[test]
fn sigterm_during_resume_records_every_trial_in_flight() {
    signal_case("rh-term-resume", "TERM", true, 5320);
}

#[test]
fn usr1_during_resume_records_every_trial_in_flight() {
    signal_case("rh-usr1-resume", "USR1", true, 5330);
}

/// Harbor 0.26 records every exception of a trial and filters `CancelledError` trials on resume
/// as 0.25 does: the wind-down during its resume leaves every trial recorded.
#[test]
fn sigterm_during_resume_records_every_trial_in_flight_on_harbor_026() {
    signal_case_on(HARBOR_026, "rh26-term-resume", "TERM", true, 6320);
}

#[test]
fn sigterm_during_start_records_every_trial_in_flight_on_harbor_026() {
    signal_case_on(HARBOR_026, "rh26-term-start", "TERM", false, 6300);
}

#[test]
fn usr1_during_start_records_every_trial_in_flight_on_harbor_026() {
    signal_case_on(HARBOR_026, "rh26-usr1-start", "USR1", false, 6310);
}

#[test]
fn usr1_during_resume_records_every_trial_in_flight_on_harbor_026() {
    signal_case_on(HARBOR_026, "rh26-usr1-resume", "USR1", true, 6330);
}

#[test]
fn thinking_model_from_the_registry_reaches_the_model_server() {
    thinking_model(VERIFIED_HARBOR, "rh-think", "5401");
}

// Not 6401: the cross-release test's run uses it.
#[test]
fn thinking_model_from_the_registry_reaches_the_model_server_on_harbor_026() {
    thinking_model(HARBOR_026, "rh26-think", "6421");
}

fn thinking_model(release: Version, name: &str, job_id: &str) {
    let Some(fx) = Fx::on(release, name, &[Task::solvable("think")]) else { return };
    // The agent kwargs exactly as the registry writes them for a thinking model.
    let registry = yaml_file("model_config/Qwen/Qwen3-8B.yaml");
    let kwargs = registry.pointer("/subsystems/eval/agent_kwargs").cloned().expect("Qwen3-8B eval agent_kwargs");
    assert!(kwargs.to_string().contains("enable_thinking"), "{kwargs}");
    let mut spec = fx.spec();
    spec["harbor"]["agent_kwargs"] = kwargs;
    let mut run = fx.start(&spec, job_id);
    assert_finished(&fx, &mut run);
    all_scored(&fx, &[("think", 1.0)]);
    let requests = fx.requests();
    assert!(!requests.is_empty());
    for r in &requests {
        assert_eq!(
            r.pointer("/chat_template_kwargs/enable_thinking"),
            Some(&json!(true)),
            "request without thinking: {r}"
        );
    }
}

#[test]
fn swebench_parser_preset_drives_the_xml_parser() {
    swebench_parser_preset(VERIFIED_HARBOR, "rh-xml", "5501");
}

#[test]
fn swebench_parser_preset_drives_the_xml_parser_on_harbor_026() {
    swebench_parser_preset(HARBOR_026, "rh26-xml", "6501");
}

fn swebench_parser_preset(release: Version, name: &str, job_id: &str) {
    let Some(fx) = Fx::on(release, name, &[Task::solvable("xml")]) else { return };
    let preset = yaml_file("presets/swebench.yaml");
    let parser = preset["agent_parser"].as_str().expect("swebench agent_parser").to_string();
    let mut spec = fx.spec();
    spec["harbor"]["agent_parser"] = json!(parser);
    let mut run = fx.start(&spec, job_id);
    assert_finished(&fx, &mut run);
    all_scored(&fx, &[("xml", 1.0)]);
    let first = &fx.requests()[0];
    let prompt = first.pointer("/messages/0/content").map(Value::to_string).unwrap_or_default();
    assert!(
        prompt.contains("Format your response as XML"),
        "terminus-2 did not use the {parser} parser: {prompt:.300}"
    );
}

#[test]
fn shipped_yaml_agent_settings_reach_harbors_job_config() {
    shipped_yaml_reaches_harbor(VERIFIED_HARBOR, "rh-yaml", NO_OVERRIDE_YAML, "5601");
}

#[test]
fn shipped_yaml_agent_settings_reach_harbors_job_config_on_harbor_026() {
    shipped_yaml_reaches_harbor(HARBOR_026, "rh26-yaml", NO_OVERRIDE_YAML, "6601");
}

const NO_OVERRIDE_YAML: &str = "presets/harbor/dcagent_eval_config_no_override.yaml";
const DEFAULTS_YAML: &str = "presets/harbor/dcagent_eval_defaults.yaml";
const DEFAULTS_32B_YAML: &str = "presets/harbor/dcagent_eval_defaults_32b.yaml";

/// The two canonical configs the size bands choose (model_config/_timeouts.yaml).
#[test]
fn canonical_configs_reach_harbors_job_config() {
    shipped_yaml_reaches_harbor(VERIFIED_HARBOR, "rh-yaml2", DEFAULTS_YAML, "5611");
    shipped_yaml_reaches_harbor(VERIFIED_HARBOR, "rh-yaml16", DEFAULTS_32B_YAML, "5621");
}

#[test]
fn canonical_configs_reach_harbors_job_config_on_harbor_026() {
    shipped_yaml_reaches_harbor(HARBOR_026, "rh26-yaml2", DEFAULTS_YAML, "6611");
    shipped_yaml_reaches_harbor(HARBOR_026, "rh26-yaml16", DEFAULTS_32B_YAML, "6621");
}

fn shipped_yaml_reaches_harbor(release: Version, name: &str, shipped: &str, job_id: &str) {
    let Some(fx) = Fx::on(release, name, &[Task::solvable("yaml")]) else { return };
    let yaml = yaml_file(shipped);
    let mut spec = fx.spec();
    spec["harbor"]["config"] = json!(repo().join(shipped));
    let mut run = fx.start(&spec, job_id);
    assert_finished(&fx, &mut run);
    all_scored(&fx, &[("yaml", 1.0)]);
    let job = read_json(&fx.run_dir().join("config.json")).expect("Harbor's job config.json");
    let stored = &job["agents"][0];
    let want = &yaml["agents"][0];
    assert_eq!(stored["name"], want["name"], "{stored:#}");
    assert_eq!(stored["model_name"], "hosted_vllm/Qwen3-8B", "{stored:#}");
    assert!(stored.pointer("/kwargs/api_base").is_some() && stored.pointer("/kwargs/model_info").is_some());
    assert_eq!(
        stored["max_timeout_sec"].as_f64(),
        want["max_timeout_sec"].as_f64(),
        "{shipped}: max_timeout_sec lost: {stored:#}"
    );
    for (key, value) in want["kwargs"].as_object().expect("kwargs in the shipped YAML") {
        assert_eq!(&stored["kwargs"][key], value, "{shipped}: agent kwarg {key} lost: {stored:#}");
    }
    // terminus-2 takes trajectory_config as a kwarg, wherever the YAML puts it.
    let trajectory = want.get("trajectory_config").or_else(|| want["kwargs"].get("trajectory_config"));
    if let Some(trajectory) = trajectory {
        assert_eq!(&stored["kwargs"]["trajectory_config"], trajectory, "{shipped}: trajectory_config lost: {stored:#}");
    }
}

#[test]
fn missing_model_info_is_refused_before_the_engine_loads() {
    missing_model_info(VERIFIED_HARBOR, "rh-nomodelinfo", "5701");
}

#[test]
fn missing_model_info_is_refused_before_the_engine_loads_on_harbor_026() {
    missing_model_info(HARBOR_026, "rh26-nomodelinfo", "6701");
}

fn missing_model_info(release: Version, name: &str, job_id: &str) {
    let Some(fx) = Fx::on(release, name, &[Task::solvable("mi")]) else { return };
    let harbor = real_harbor_release(release).unwrap();
    // A job dir the real Harbor wrote without model_info (as the old scripts did): a resume of it
    // would lose every trial before its first request.
    let mut harbor_run = Command::new(&harbor)
        .args(["jobs", "start", "-p"])
        .arg(fx.root.join("data"))
        .args(["--job-name", &fx.tag, "--jobs-dir"])
        .arg(fx.root.join("jobs"))
        .arg("--config")
        .arg(fx.root.join("harbor.yaml"))
        .args(["--env", "host_env:HostEnvironment", "--agent", "terminus-2", "--model", "hosted_vllm/Qwen3-8B"])
        .args(["--agent-kwarg", "api_base=http://127.0.0.1:9/v1"])
        .env("PYTHONPATH", fx.root.join("py"))
        .current_dir(&fx.root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Its trials cannot reach a model; once the job config is written, Harbor is stopped (SIGINT
    // winds it down).
    let job_config = fx.run_dir().join("config.json");
    let until = Instant::now() + RUN_TIMEOUT;
    while !job_config.is_file() {
        assert!(harbor_run.try_wait().unwrap().is_none() && Instant::now() < until, "Harbor wrote no job config");
        std::thread::sleep(Duration::from_millis(100));
    }
    send_signal(harbor_run.id() as i32, "INT");
    harbor_run.wait().unwrap();
    assert!(read_json(&job_config).unwrap().pointer("/agents/0/kwargs/model_info").is_none());
    let before = std::fs::read(&job_config).unwrap();

    let mut run = fx.start(&fx.spec(), job_id);
    let code = run.wait(&fx);
    assert_ne!(code, 0, "{}", fx.context(&run));
    run.assert_no_survivors();
    assert!(fx.last_event("engine_spawned").is_none(), "the engine was started: {}", fx.context(&run));
    let said = format!("{}{}", std::fs::read_to_string(&run.stderr).unwrap_or_default(), fx.status()["outcome"]);
    assert!(said.contains("model_info"), "the refusal names model_info: {said}");
    assert_eq!(std::fs::read(&job_config).unwrap(), before, "Harbor's job config was changed");
}

// ------------------------------------------------------ check and status on the real Harbor's dirs

/// `submitter check`'s report and `submitter status`'s verdict (what each runs per run dir:
/// `verify::check::check_run_dir`, `verify::status::judge_job` for a RUNNING job) on a run dir the
/// real Harbor is writing, and on the same dir after payload was stopped by a signal: one rule
/// engine, the same verdict. The real dir has Harbor 0.25's layouts (and 0.26's, which adds
/// `reward_valid`, in the twin): queued trials holding only
/// `lock.json`, `trial.log` and empty subdirs, `agent/*.pane`, `verifier/test-stdout.txt`,
/// `artifacts/manifest.json`, `agent_result.model_usage`.
fn judge(dir: &Path, job: &str) -> (submitter::verify::check::RunCheck, submitter::verify::verdict::JobVerdict) {
    use submitter::verify::status::{JobSide, judge_job};
    let settings = submitter::verify::VerifySettings::default();
    let now = chrono::Utc::now();
    let check = submitter::verify::check::check_run_dir(dir, &settings, now).expect("check");
    let side = JobSide {
        status: submitter::ledger::AttemptStatus::Started,
        reason: "running",
        job_id: Some(job),
        slurm: Some(submitter::domain::SlurmView::Running),
        slurm_state: Some("RUNNING".into()),
        started_at: Some(now - chrono::Duration::seconds(30)),
        metrics: None,
    };
    let (verdict, _, _) = judge_job(Some(dir), &side, None, &settings, now);
    (check, verdict)
}

#[test]
fn check_and_status_agree_on_real_harbor_run_dirs() {
    check_and_status_agree(VERIFIED_HARBOR, "rh-check", ["5801", "5802"]);
}

#[test]
fn check_and_status_agree_on_real_harbor_run_dirs_on_harbor_026() {
    check_and_status_agree(HARBOR_026, "rh26-check", ["6801", "6802"]);
}

fn check_and_status_agree(release: Version, name: &str, job_ids: [&str; 2]) {
    let tasks = [Task::solvable("m"), Task::solvable("n"), Task::unsolvable("o"), Task::solvable("p")];
    let Some(fx) = Fx::on(release, name, &tasks) else { return };
    let mut spec = fx.spec();
    spec["harbor"]["n_concurrent"] = json!(1);
    spec["serve"]["env"]["STANDIN_RESPONSE_SECONDS"] = json!("1");
    let mut run = fx.start(&spec, job_ids[0]);
    // Healthy: one trial scored, the next in flight, the rest queued by Harbor.
    let until = Instant::now() + RUN_TIMEOUT;
    while !fx.trials().iter().any(|t| t.result.is_some()) {
        assert!(run.exited().is_none() && Instant::now() < until, "no trial finished\n{}", fx.context(&run));
        std::thread::sleep(Duration::from_millis(100));
    }
    fx.wait_in_flight(&mut run, fx.requests().len());
    let (check, verdict) = judge(&fx.run_dir(), job_ids[0]);
    let findings = format!("{:#?}", check.findings);
    assert_eq!(check.status_verdict, verdict.verdict, "check vs status\n{findings}\n{verdict:#?}");
    assert_eq!(verdict.verdict.as_str(), "healthy", "{findings}\n{verdict:#?}");
    assert_ne!(check.verdict, submitter::verify::Level::Fail, "{findings}");
    let t = &check.facts.trials;
    assert_eq!(t.unconstructed, 0, "queued trials are not 'never constructed': {findings}");
    assert!(t.done >= 1 && t.done + t.active + t.queued <= 4, "{findings}");
    assert_eq!(t.instant_failures, 0, "{findings}");
    // Crashed: payload stopped by SIGTERM mid-run records `interrupted`; both say failed.
    send_signal(run.pid, "TERM");
    assert_eq!(run.wait(&fx), 143, "{}", fx.context(&run));
    run.assert_no_survivors();
    let (check, verdict) = judge(&fx.run_dir(), job_ids[0]);
    let findings = format!("{:#?}", check.findings);
    assert_eq!(check.status_verdict, verdict.verdict, "check vs status\n{findings}\n{verdict:#?}");
    assert_eq!(verdict.verdict.as_str(), "failed", "{findings}\n{verdict:#?}");
    assert!(verdict.summary.starts_with("interrupted"), "{verdict:#?}");
    assert!(check.findings.iter().any(|f| f.id == "outcome.failed"), "{findings}");
    assert_eq!(check.state, submitter::verify::check::RunState::Ended);
    // Resumed to the end: finished for both, and the completion audit holds.
    let mut run = fx.start(&spec, job_ids[1]);
    assert_finished(&fx, &mut run);
    let (check, verdict) = judge(&fx.run_dir(), job_ids[1]);
    let findings = format!("{:#?}", check.findings);
    assert_eq!(check.status_verdict, verdict.verdict, "check vs status\n{findings}\n{verdict:#?}");
    assert_eq!(verdict.verdict.as_str(), "finished", "{findings}\n{verdict:#?}");
    assert_eq!(check.facts.trials.done, 4, "{findings}");
    assert_eq!(check.facts.trials.valid, 4, "{findings}");
    assert!(
        check.findings.iter().any(|f| f.id == "audit.completion" && f.level == submitter::verify::Level::Ok),
        "{findings}"
    );
}

/// A shared job (issue 24) with the real Harbor: two legs, each its own Harbor job in its own run
/// dir, against one stand-in engine started once by `payload run --shared`; every trial of both
/// legs is scored by Harbor's verifier and reached the host's engine.
#[test]
fn two_legs_of_a_shared_job_run_the_real_harbor_against_one_engine() {
    two_legs_of_a_shared_job(VERIFIED_HARBOR, "rh-shared", "5301");
}

#[test]
fn two_legs_of_a_shared_job_run_the_real_harbor_against_one_engine_on_harbor_026() {
    two_legs_of_a_shared_job(HARBOR_026, "rh26-shared", "6341");
}

fn two_legs_of_a_shared_job(release: Version, name: &str, job_id: &str) {
    let Some(fx) = Fx::on(release, name, &[Task::solvable("alpha"), Task::unsolvable("beta")]) else { return };
    let id = unique();
    let group_tag = format!("{name}-group-{id}");
    let group_dir = fx.root.join("jobs").join(&group_tag);
    let mut legs = Vec::new();
    for i in 0..2 {
        let tag = format!("{name}-leg{i}-{id}");
        let dir = fx.root.join("jobs").join(&tag);
        let mut spec = fx.spec();
        spec["run_tag"] = json!(tag);
        spec["run_dir"] = json!(dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("launch.json"), serde_json::to_string_pretty(&spec).unwrap()).unwrap();
        legs.push(dir);
    }
    std::fs::create_dir_all(&group_dir).unwrap();
    let shared = group_dir.join("shared.json");
    let doc = json!({ "version": 1, "group_tag": group_tag, "group_dir": group_dir,
                      "legs": legs.iter().map(|d| d.join("launch.json")).collect::<Vec<_>>() });
    std::fs::write(&shared, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    let stderr_path = fx.root.join("shared.stderr");
    let mut child = Command::new(payload_bin())
        .args(["run", "--shared", shared.to_str().unwrap()])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
        .env("HOME", &fx.root)
        .env("PAYLOAD_GPU_FIXTURE", fx.root.join("gpus.json"))
        .env("SLURM_JOB_ID", job_id)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .expect("spawn payload");
    let pid = child.id();
    let until = Instant::now() + RUN_TIMEOUT * 2;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code().unwrap_or(-1);
        }
        if Instant::now() >= until {
            let _ = child.kill();
            panic!("the shared job did not end\n{}", std::fs::read_to_string(&stderr_path).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let context = || {
        let logs: Vec<String> =
            legs.iter().map(|d| std::fs::read_to_string(d.join("payload.log")).unwrap_or_default()).collect();
        format!(
            "host stderr:\n{}\nlegs' payload.log:\n{}",
            std::fs::read_to_string(&stderr_path).unwrap_or_default(),
            logs.join("\n---\n")
        )
    };
    assert_eq!(code, 0, "{}", context());
    let host = read_json(&group_dir.join("status.json")).unwrap_or(Value::Null);
    let port = host["port"].as_u64().expect("the host's engine port");
    let engine_log = std::fs::read_to_string(group_dir.join("vllm.log")).unwrap_or_default();
    assert_eq!(engine_log.matches("Started server process").count(), 1, "the engine started once");
    for dir in &legs {
        let st = read_json(&dir.join("status.json")).unwrap_or(Value::Null);
        assert_eq!(
            (&st["outcome"]["class"], &st["outcome"]["harbor_exit_code"]),
            (&json!("finished"), &json!(0)),
            "{st:#}\n{}",
            context()
        );
        let mut rewards: Vec<(String, Option<f64>)> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter_map(|e| {
                read_json(&e.path().join("result.json"))
                    .filter(|_| e.path().join("config.json").is_file() && e.path().is_dir())
            })
            .map(|r| {
                (
                    r["task_name"].as_str().unwrap_or("?").to_string(),
                    r.pointer("/verifier_result/rewards/reward").and_then(Value::as_f64),
                )
            })
            .collect();
        rewards.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            rewards,
            vec![("alpha".to_string(), Some(1.0)), ("beta".to_string(), Some(0.0))],
            "{}",
            dir.display()
        );
        let lock = read_json(&dir.join("lock.json")).expect("Harbor's job lock.json");
        for trial in lock["trials"].as_array().unwrap() {
            assert_eq!(
                trial.pointer("/agent/kwargs/api_base").and_then(Value::as_str),
                Some(&*format!("http://127.0.0.1:{port}/v1")),
                "the leg's agent called the host's engine"
            );
        }
    }
    // Both legs' agents talked to the one engine (three turns per trial, two trials per leg).
    assert!(fx.requests().len() >= 12, "{} requests", fx.requests().len());
    assert!(marker_processes(&format!("PAYLOAD_RUN_ID={group_tag}-{pid}")).is_empty(), "nothing outlives the host");
}

// ------------------------------------------------------------ a resume across Harbor releases

/// Starts a Harbor job in `fx`'s jobs dir with `harbor` itself (the `nop` agent: no model), then
/// makes it look interrupted as Harbor leaves a job it was stopped in: one trial gone, the job's
/// `finished_at` null. Returns the job dir.
fn harbor_job_interrupted(fx: &Fx, harbor: &Path, job: &str, config: &Path) -> PathBuf {
    let out = harbor_cmd(fx, harbor, &["jobs", "start", "-p"])
        .arg(fx.root.join("data"))
        .args(["--job-name", job, "--jobs-dir"])
        .arg(fx.root.join("jobs"))
        .arg("--config")
        .arg(config)
        .args(["--env", "host_env:HostEnvironment", "--agent", "nop", "--yes"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{harbor:?} jobs start: {}", String::from_utf8_lossy(&out.stderr));
    let dir = fx.root.join("jobs").join(job);
    let trial = fx.trials_of(&dir).into_iter().next().expect("a trial dir");
    std::fs::remove_dir_all(trial).unwrap();
    let mut result = read_json(&dir.join("result.json")).expect("the job's result.json");
    result["finished_at"] = Value::Null;
    std::fs::write(dir.join("result.json"), result.to_string()).unwrap();
    dir
}

fn harbor_cmd(fx: &Fx, harbor: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(harbor);
    cmd.args(args).env("PYTHONPATH", fx.root.join("py")).current_dir(&fx.root).stdin(Stdio::null());
    cmd
}

fn harbor_resume(fx: &Fx, harbor: &Path, dir: &Path) -> std::process::Output {
    harbor_cmd(fx, harbor, &["jobs", "resume", "-p"]).arg(dir).output().unwrap()
}

impl Fx {
    fn trials_of(&self, dir: &Path) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("config.json").is_file())
            .collect();
        out.sort();
        out
    }
}

/// Issue 35, measured with the real 0.25.0 and 0.26.0 (the issue had it the other way round):
/// Harbor 0.26 refuses to resume a job 0.25 ran under its retry defaults (their lock's
/// `retry.exclude_exceptions` differ) and resumes one whose config pinned them; Harbor 0.25 resumes a
/// job 0.26 started, under its own scoring, while the job lock still names 0.26.0. payload refuses
/// both cases before the engine loads, in one line with the fix.
#[test]
fn a_resume_across_harbor_releases_is_refused_before_the_engine_where_the_real_harbors_differ() {
    let tasks = [Task::solvable("a"), Task::solvable("b")];
    let Some(fx25) = Fx::on(VERIFIED_HARBOR, "rh-cross25", &tasks) else { return };
    let Some(fx26) = Fx::on(HARBOR_026, "rh-cross26", &tasks) else { return };
    let (h25, h26) = (real_harbor().unwrap(), real_harbor_release(HARBOR_026).unwrap());
    let unpinned = fx25.root.join("harbor.yaml");
    let pinned = fx25.root.join("pinned.yaml");
    std::fs::write(
        &pinned,
        format!("{HARBOR_YAML}retry:\n  max_retries: 2\n  exclude_exceptions: [AgentTimeoutError]\n"),
    )
    .unwrap();

    // The real Harbors.
    let dir = harbor_job_interrupted(&fx25, &h25, "by25-unpinned", &unpinned);
    let out = harbor_resume(&fx25, &h26, &dir);
    let said = String::from_utf8_lossy(&out.stderr).replace('\n', " ") + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && said.contains("does not match the resolved job lock"), "0.26 resumed: {said}");
    let dir = harbor_job_interrupted(&fx25, &h25, "by25-pinned", &pinned);
    let out = harbor_resume(&fx25, &h26, &dir);
    assert!(out.status.success(), "0.26 refused a pinned 0.25 job: {}", String::from_utf8_lossy(&out.stderr));
    let dir = harbor_job_interrupted(&fx25, &h26, "by26", &unpinned);
    let out = harbor_resume(&fx25, &h25, &dir);
    assert!(out.status.success(), "0.25 refused a 0.26 job: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(fx25.trials_of(&dir).len(), 2, "0.25 ran the missing trial");
    let lock = read_json(&dir.join("lock.json")).unwrap();
    assert_eq!(lock["harbor"]["version"], "0.26.0", "0.25's resume keeps the lock's Harbor: {lock:#}");

    // payload, declared 0.25.0, on a dir 0.26 started.
    harbor_job_interrupted(&fx25, &h26, &fx25.tag, &unpinned);
    let mut run = fx25.start(&fx25.spec(), "6401");
    assert_ne!(run.wait(&fx25), 0, "{}", fx25.context(&run));
    run.assert_no_survivors();
    assert!(fx25.last_event("engine_spawned").is_none(), "the engine was started: {}", fx25.context(&run));
    let message = fx25.status()["outcome"]["message"].as_str().unwrap_or_default().to_string();
    assert!(
        message.contains("written by Harbor 0.26.0, newer than the Harbor 0.25.0 this job runs")
            && message.contains("submitter launch --force"),
        "{message}"
    );
    // payload, declared 0.26.0, on a dir 0.25 started under its retry defaults.
    harbor_job_interrupted(&fx26, &h25, &fx26.tag, &fx26.root.join("harbor.yaml"));
    let mut run = fx26.start(&fx26.spec(), "6411");
    assert_ne!(run.wait(&fx26), 0, "{}", fx26.context(&run));
    run.assert_no_survivors();
    assert!(fx26.last_event("engine_spawned").is_none(), "the engine was started: {}", fx26.context(&run));
    let message = fx26.status()["outcome"]["message"].as_str().unwrap_or_default().to_string();
    assert!(
        message.contains("written by Harbor 0.25.0 with its retry defaults, which Harbor 0.26.0 changed"),
        "{message}"
    );
}
