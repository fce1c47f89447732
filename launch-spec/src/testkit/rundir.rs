//! [`RunDir`]: run directories as payload, Harbor 0.25 and vLLM leave them, written for a chosen
//! instant with every file's mtime set explicitly, so `check --now T` judges them the same on any
//! machine at any time. payload's records go through the typed [`RunStatus`] and [`Event`]; Harbor's
//! files (which this repository only reads, through partial models) are written as Harbor 0.25
//! writes them; vLLM's access lines come from [`access_line`], the writer the stand-in uses.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};

use crate::records::{Heartbeat, Phase, RunStatus};
use crate::rundir::enginelog::access_line;
use crate::rundir::{ENGINE_LOG, EVENTS_FILE, Event, SPEC_FILE, STATUS_FILE};
use crate::spec::LaunchSpec;

/// payload's record stamps (RFC 3339 UTC, microseconds).
pub fn iso(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// Harbor's naive job timestamps (node-local time: the test machine's zone).
pub fn naive(t: DateTime<Utc>) -> String {
    t.with_timezone(&chrono::Local).format("%Y-%m-%dT%H:%M:%S%.6f").to_string()
}

/// vLLM's logger stamp (`MM-DD HH:MM:SS`, node-local time).
pub fn stamp(t: DateTime<Utc>) -> String {
    t.with_timezone(&chrono::Local).format("%m-%d %H:%M:%S").to_string()
}

/// A fractional number of seconds as a duration (millisecond resolution).
pub fn secs(seconds: f64) -> Duration {
    Duration::milliseconds((seconds * 1000.0) as i64)
}

/// Writes `text` to `path` (creating its directory); with `modified`, sets the file's mtime.
pub fn write_file(path: &Path, text: &str, modified: Option<DateTime<Utc>>) {
    std::fs::create_dir_all(path.parent().expect("a file path")).expect("create the fixture dir");
    std::fs::write(path, text).expect("write a fixture file");
    if let Some(t) = modified {
        let f = std::fs::File::options().write(true).open(path).expect("reopen a fixture file");
        f.set_modified(SystemTime::from(t)).expect("set a fixture mtime");
    }
}

/// [`write_file`] of pretty JSON, as Harbor and payload write their files.
pub fn write_json(path: &Path, value: &Value, modified: Option<DateTime<Utc>>) {
    write_file(path, &serde_json::to_string_pretty(value).expect("JSON serialises"), modified);
}

/// One run directory: `<temp>/jobs/<job name>` owned by the value, or any directory.
pub struct RunDir {
    _tmp: Option<tempfile::TempDir>,
    pub path: PathBuf,
}

impl RunDir {
    /// A fresh temp dir holding an empty `jobs/<job_name>` (removed when dropped).
    pub fn temp(job_name: &str) -> Self {
        let tmp = tempfile::tempdir().expect("a temp dir");
        let path = tmp.path().join("jobs").join(job_name);
        std::fs::create_dir_all(&path).expect("create the run dir");
        Self { _tmp: Some(tmp), path }
    }

    /// An existing directory (kept when dropped).
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self { _tmp: None, path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Any file of the run dir, at `modified`.
    pub fn file(&self, rel: &str, text: &str, modified: Option<DateTime<Utc>>) -> &Self {
        write_file(&self.path.join(rel), text, modified);
        self
    }

    /// `launch.json`, as submitter writes it.
    pub fn launch(&self, spec: &LaunchSpec) -> &Self {
        write_file(&self.path.join(SPEC_FILE), &spec.to_json(), None);
        self
    }

    /// payload's `status.json`, written at `modified`.
    pub fn status(&self, status: &RunStatus, modified: Option<DateTime<Utc>>) -> &Self {
        let value = serde_json::to_value(status).expect("status serialises");
        write_json(&self.path.join(STATUS_FILE), &value, modified);
        self
    }

    /// payload's `events.jsonl` (replaced), written at `modified`.
    pub fn events(&self, events: &[Event], modified: Option<DateTime<Utc>>) -> &Self {
        let text: String = events.iter().map(|e| serde_json::to_string(e).expect("event serialises") + "\n").collect();
        write_file(&self.path.join(EVENTS_FILE), &text, modified);
        self
    }

    /// vLLM's log (replaced), written at `modified`.
    pub fn engine_log(&self, log: &VllmLog, modified: Option<DateTime<Utc>>) -> &Self {
        write_file(&self.path.join(ENGINE_LOG), &log.text, modified);
        self
    }

    /// Harbor's job files ([`HarborJob::write`]).
    pub fn job(&self, job: &HarborJob) -> &Self {
        job.write(&self.path);
        self
    }

    /// One trial dir ([`Trial::write`]).
    pub fn trial(&self, trial: &Trial) -> &Self {
        trial.write(&self.path);
        self
    }
}

/// Holds one `events.jsonl` line a real payload wrote to the typed bodies (crate::rundir::events):
/// it decodes to its kind's body, which writes the line back byte for byte. Panics otherwise.
pub fn assert_typed_event_line(line: &str) {
    let event: Event = serde_json::from_str(line).unwrap_or_else(|e| panic!("not an event line ({e}): {line}"));
    let body = event.body().unwrap_or_else(|| panic!("no typed body for {line}"));
    let again = serde_json::to_string(&Event::new(event.at.clone(), &body).expect("a body serialises"))
        .expect("an event serialises");
    assert_eq!(again, line, "the typed body does not write the line back");
}

/// A `phase` event.
pub fn phase_event(at: DateTime<Utc>, phase: Phase) -> Event {
    Event::new(iso(at), &crate::rundir::events::PhaseEntered { phase }.into()).expect("phase serialises")
}

/// A `heartbeat` event as payload appends it: the counters of `running_status`'s heartbeat at `at`.
pub fn heartbeat_event(at: DateTime<Utc>, counters: Counters) -> Event {
    let status = running_status("-", "0", at, at, counters, at);
    let hb = status.heartbeat.expect("running_status has a heartbeat");
    Event::new(iso(at), &crate::rundir::events::heartbeat(&hb).into()).expect("heartbeat serialises")
}

/// payload's heartbeat counters: completions (ok, 4xx, 5xx), trials (started, finished, errored).
#[derive(Debug, Clone, Copy, Default)]
pub struct Counters {
    pub completions: (u64, u64, u64),
    pub trials: (u64, u64, u64),
}

/// The `status.json` of a run in phase `running`: started at `started`, last written (and its
/// heartbeat taken) at `beat`, counters last moved at `progress`, engine healthy.
pub fn running_status(
    run_tag: &str,
    slurm_job_id: &str,
    started: DateTime<Utc>,
    beat: DateTime<Utc>,
    counters: Counters,
    progress: DateTime<Utc>,
) -> RunStatus {
    RunStatus {
        version: crate::rundir::STATUS_VERSION,
        run_tag: run_tag.into(),
        phase: Phase::Running,
        started_at: iso(started),
        updated_at: iso(beat),
        slurm_job_id: Some(slurm_job_id.into()),
        node: None,
        gpu: None,
        port: None,
        pids: Default::default(),
        resume: None,
        heartbeat: Some(Heartbeat {
            at: iso(beat),
            completions_ok: counters.completions.0,
            completions_4xx: counters.completions.1,
            completions_5xx: counters.completions.2,
            trials_started: counters.trials.0,
            trials_finished: counters.trials.1,
            trials_errored: counters.trials.2,
            last_progress_at: Some(iso(progress)),
            engine_healthy: true,
            failed_probes: 0,
            probe_limit: 3,
            engine: None,
        }),
        outcome: None,
        post_run: None,
        provenance: None,
        gpu_time: None,
        readiness: None,
    }
}

/// The `model_info` terminus-2 needs for a hosted_vllm model.
pub fn model_info(max_input_tokens: u64, max_output_tokens: u64) -> Value {
    json!({"max_input_tokens": max_input_tokens, "max_output_tokens": max_output_tokens})
}

/// Harbor 0.25's job files: `config.json` (its resolved flags), `lock.json` (which Harbor wrote the
/// dir; `None` = an older Harbor that wrote none) and `result.json` (`finished_at` null until
/// Harbor finished the job).
#[derive(Debug, Clone)]
pub struct HarborJob {
    pub job_name: String,
    pub n_attempts: u64,
    pub n_concurrent: u64,
    pub agent: String,
    pub model_name: String,
    pub api_base: String,
    /// The agent's `kwargs.model_info`; `None` leaves it out.
    pub model_info: Option<Value>,
    pub dataset: String,
    /// `lock.json`'s Harbor version; `None` writes no `lock.json`.
    pub harbor_version: Option<String>,
    pub result: Option<JobResult>,
    /// mtime of `config.json` and `lock.json` (when Harbor started the job).
    pub written: Option<DateTime<Utc>>,
}

/// The job `result.json`.
#[derive(Debug, Clone)]
pub struct JobResult {
    pub id: String,
    pub started_at: String,
    /// `None` leaves the key out.
    pub updated_at: Option<String>,
    pub finished_at: Option<String>,
    pub n_total_trials: u64,
    pub stats: Value,
    pub written: Option<DateTime<Utc>>,
}

impl JobResult {
    /// Harbor's stats of a job that has recorded no trial yet.
    pub(crate) fn empty_stats() -> Value {
        json!({"n_completed_trials": 0, "n_errored_trials": 0, "evals": {}})
    }

    /// Writes `result.json` into the job dir `dir`.
    pub fn write(&self, dir: &Path) {
        write_json(&dir.join(crate::rundir::harbor::RESULT_FILE), &self.to_value(), self.written);
    }

    pub fn to_value(&self) -> Value {
        let mut v = json!({"id": self.id, "started_at": self.started_at});
        if let Some(u) = &self.updated_at {
            v["updated_at"] = json!(u);
        }
        v["finished_at"] = json!(self.finished_at);
        v["n_total_trials"] = json!(self.n_total_trials);
        v["stats"] = self.stats.clone();
        v
    }
}

impl HarborJob {
    /// A terminus-2 job on Daytona, one attempt, the model at `hosted_vllm/Model-8B` on the node's
    /// port 8000, `model_info` set, dataset `/data/tb2`, written by Harbor 0.25.0 at `started`
    /// with `n_total` trials, finished at `finished` (or still running).
    pub fn started(job_name: &str, started: DateTime<Utc>, n_total: u64, finished: Option<DateTime<Utc>>) -> Self {
        Self {
            job_name: job_name.into(),
            n_attempts: 1,
            n_concurrent: 12,
            agent: "terminus-2".into(),
            model_name: "hosted_vllm/Model-8B".into(),
            api_base: "http://127.0.0.1:8000/v1".into(),
            model_info: Some(model_info(32768, 16384)),
            dataset: "/data/tb2".into(),
            harbor_version: Some("0.25.0".into()),
            result: Some(JobResult {
                id: "e113".into(),
                started_at: naive(started),
                updated_at: Some(naive(finished.unwrap_or(started))),
                finished_at: finished.map(naive),
                n_total_trials: n_total,
                stats: JobResult::empty_stats(),
                written: Some(finished.unwrap_or(started)),
            }),
            written: Some(started),
        }
    }

    pub(crate) fn config_value(&self) -> Value {
        let mut kwargs = json!({"api_base": self.api_base});
        if let Some(mi) = &self.model_info {
            kwargs["model_info"] = mi.clone();
        }
        json!({"job_name": self.job_name, "n_attempts": self.n_attempts, "n_concurrent_trials": self.n_concurrent,
               "environment": {"type": "daytona"},
               "agents": [{"name": self.agent, "model_name": self.model_name, "kwargs": kwargs}],
               "datasets": [{"path": self.dataset}]})
    }

    /// Writes the job files into `dir`.
    pub fn write(&self, dir: &Path) {
        write_json(&dir.join(crate::rundir::harbor::CONFIG_FILE), &self.config_value(), self.written);
        if let Some(version) = &self.harbor_version {
            write_json(
                &dir.join(crate::rundir::harbor::LOCK_FILE),
                &json!({"schema_version": 3, "harbor": {"version": version, "is_editable": false}, "trials": []}),
                self.written,
            );
        }
        if let Some(result) = &self.result {
            result.write(dir);
        }
    }
}

/// How far a trial got.
#[derive(Debug, Clone)]
pub enum Stage {
    /// What `Trial.__init__` leaves before the environment starts: `lock.json`, an empty
    /// `trial.log`, empty `agent/`, `verifier/`, `artifacts/`; made at that instant.
    Queued(DateTime<Utc>),
    /// The sandbox is up and the agent runs since then (`config.json`, a tmux pane log).
    Running(DateTime<Utc>),
    /// Finished with a `result.json`.
    Done(Finished),
}

/// A finished trial's `result.json`.
#[derive(Debug, Clone)]
pub struct Finished {
    /// When `result.json` was written.
    pub at: DateTime<Utc>,
    /// Sandbox setup (Daytona: minutes). `None`: a Harbor that records only the trial's
    /// `started_at`/`finished_at`, `agent_s` apart, and no verifier files.
    pub setup_s: Option<f64>,
    pub agent_s: f64,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// Harbor 0.25 keeps the per-model counts in `model_usage` too; `true` writes them only there.
    pub usage_only: bool,
    pub exception: Option<String>,
    /// The exception's `str()`, Harbor's `exception_message` (empty when `None`).
    pub exception_message: Option<String>,
    /// `false`: the sandbox never came up (a provider error at its creation), so Harbor 0.25 records
    /// `environment_setup` only — no `agent_execution`, `agent_result` or verifier — and the
    /// traceback in `exception.txt`.
    pub agent_ran: bool,
    pub reward: Option<f64>,
}

impl Finished {
    /// A trial that scored 1.0 after a 95 s sandbox setup and 4 minutes of agent work.
    pub fn ok(at: DateTime<Utc>) -> Self {
        Self {
            at,
            setup_s: Some(95.0),
            agent_s: 240.0,
            input_tokens: Some(2596),
            output_tokens: Some(1874),
            usage_only: false,
            exception: None,
            exception_message: None,
            agent_ran: true,
            reward: Some(1.0),
        }
    }

    /// A trial the sandbox provider failed: `kind` (`DaytonaError`) with `message` raised while its
    /// sandbox was created, `setup_s` after the trial's start; the agent never ran.
    pub fn sandbox_failed(at: DateTime<Utc>, setup_s: f64, kind: &str, message: &str) -> Self {
        Self {
            setup_s: Some(setup_s),
            agent_s: 0.0,
            input_tokens: None,
            output_tokens: None,
            exception: Some(kind.into()),
            exception_message: Some(message.into()),
            agent_ran: false,
            reward: None,
            ..Self::ok(at)
        }
    }
}

/// One trial dir `<job>/<name>` (`<task>__<suffix>`), its agent talking to `api_base`.
#[derive(Debug, Clone)]
pub struct Trial {
    pub name: String,
    pub api_base: String,
    pub stage: Stage,
}

impl Trial {
    pub fn new(name: &str, stage: Stage) -> Self {
        Self { name: name.into(), api_base: "http://127.0.0.1:8000/v1".into(), stage }
    }

    pub fn api_base(mut self, api_base: &str) -> Self {
        self.api_base = api_base.into();
        self
    }

    fn task(&self) -> &str {
        self.name.split("__").next().unwrap_or(&self.name)
    }

    pub fn write(&self, job: &Path) {
        let t = job.join(&self.name);
        match &self.stage {
            Stage::Queued(made) => self.queued(&t, *made),
            Stage::Running(since) => self.running(&t, *since),
            Stage::Done(d) => self.done(&t, d),
        }
    }

    fn queued(&self, t: &Path, made: DateTime<Utc>) {
        for sub in ["agent", "verifier", "artifacts"] {
            std::fs::create_dir_all(t.join(sub)).expect("create a trial dir");
        }
        write_json(&t.join("lock.json"), &json!({"schema_version": 2, "task": {"name": self.name}}), Some(made));
        write_file(&t.join(crate::rundir::harbor::TRIAL_LOG), "", Some(made));
    }

    fn running(&self, t: &Path, since: DateTime<Utc>) {
        self.queued(t, since);
        write_json(
            &t.join("config.json"),
            &json!({"trial_name": self.name, "agent": {"name": "terminus-2", "kwargs": {"api_base": self.api_base}}}),
            Some(since),
        );
        // The pane log moves while the agent works.
        write_file(&t.join("agent/terminus_2.pane"), "root@sandbox:/app# ", Some(since + Duration::minutes(1)));
    }

    fn done(&self, t: &Path, d: &Finished) {
        if !d.agent_ran {
            return self.sandbox_never_up(t, d);
        }
        let agent_end = if d.setup_s.is_some() { d.at - Duration::seconds(2) } else { d.at };
        let agent_start = agent_end - secs(d.agent_s);
        let setup_start = agent_start - secs(d.setup_s.unwrap_or(0.0));
        self.running(t, d.at - secs(d.setup_s.unwrap_or(0.0) + d.agent_s) - Duration::minutes(1));
        let usage = json!({"Model-8B": {"n_input_tokens": d.input_tokens, "n_output_tokens": d.output_tokens, "cost_usd": null}});
        let agent_result = if d.usage_only {
            json!({"n_input_tokens": d.input_tokens, "model_usage": usage})
        } else {
            json!({"n_input_tokens": d.input_tokens, "n_output_tokens": d.output_tokens, "model_usage": usage})
        };
        let mut result = json!({"trial_name": self.name, "task_name": self.task(),
                "config": {"agent": {"kwargs": {"api_base": self.api_base}}},
                "agent_info": {"name": "terminus-2", "version": "2.0.0"},
                "agent_result": agent_result,
                "verifier_result": d.reward.map(|r| json!({"rewards": {"reward": r}})),
                "exception_info": d.exception.as_ref().map(|e| exception_info(e, d, agent_end))});
        if d.setup_s.is_some() {
            write_file(&t.join("verifier/test-stdout.txt"), "ok\n", Some(agent_end));
            write_json(
                &t.join("artifacts/manifest.json"),
                &json!([{"source": "/logs/artifacts", "status": "ok"}]),
                Some(agent_end),
            );
            result["started_at"] = json!(iso(setup_start - Duration::milliseconds(60)));
            result["finished_at"] = json!(iso(d.at));
            result["environment_setup"] =
                json!({"started_at": iso(setup_start), "finished_at": iso(agent_start - Duration::seconds(1))});
            result["agent_execution"] = json!({"started_at": iso(agent_start), "finished_at": iso(agent_end)});
            result["verifier"] = json!({"started_at": iso(agent_end), "finished_at": iso(d.at)});
        } else {
            result["started_at"] = json!(iso(agent_start));
            result["finished_at"] = json!(iso(d.at));
        }
        write_json(&t.join(crate::rundir::harbor::RESULT_FILE), &result, Some(d.at));
    }

    /// The sandbox's creation raised (Harbor 0.25 `Trial.run`: `_record_exception`, then `_finalize`):
    /// `config.json`, a `result.json` with `environment_setup` and `exception_info` only, `exception.txt`.
    fn sandbox_never_up(&self, t: &Path, d: &Finished) {
        let start = d.at - secs(d.setup_s.unwrap_or(0.0)) - Duration::milliseconds(60);
        self.running(t, start);
        let _ = std::fs::remove_file(t.join("agent/terminus_2.pane"));
        let kind = d.exception.as_deref().unwrap_or("DaytonaError");
        let traceback = format!(
            "Traceback (most recent call last):\n  File \"harbor/trial/trial.py\", line 1847, in _setup_agent_environment\n{kind}: {}\n",
            d.exception_message.as_deref().unwrap_or("")
        );
        write_file(&t.join(crate::rundir::harbor::EXCEPTION_FILE), &traceback, Some(d.at));
        let result = json!({"trial_name": self.name, "task_name": self.task(),
            "config": {"agent": {"kwargs": {"api_base": self.api_base}}},
            "agent_info": {"name": "terminus-2", "version": "2.0.0"},
            "agent_result": null, "verifier_result": null,
            "exception_info": exception_info(kind, d, d.at),
            "started_at": iso(start), "finished_at": iso(d.at),
            "environment_setup": {"started_at": iso(start + Duration::milliseconds(60)), "finished_at": iso(d.at)},
            "agent_setup": null, "agent_execution": null, "verifier": null});
        write_json(&t.join(crate::rundir::harbor::RESULT_FILE), &result, Some(d.at));
    }
}

/// Harbor 0.25's `ExceptionInfo.from_exception`: the class name, `str(e)`, the traceback, when.
fn exception_info(kind: &str, d: &Finished, at: DateTime<Utc>) -> Value {
    let message = d.exception_message.as_deref().unwrap_or("");
    json!({"exception_type": kind, "exception_message": message,
           "exception_traceback": format!("Traceback (most recent call last):\n{kind}: {message}\n"), "occurred_at": iso(at)})
}

/// vLLM's log text, line by line, in the formats vLLM 0.33 writes (its API process prefixes its
/// logger lines with `(APIServer pid=N)`; uvicorn's access lines have no stamp).
#[derive(Debug, Clone, Default)]
pub struct VllmLog {
    pub text: String,
    pid: u32,
}

impl VllmLog {
    pub fn new(pid: u32) -> Self {
        Self { text: String::new(), pid }
    }

    /// A logger line: `(APIServer pid=N) LEVEL MM-DD HH:MM:SS [where] message`.
    pub fn logger(&mut self, level: &str, t: DateTime<Utc>, place: &str, message: &str) -> &mut Self {
        let pid = self.pid;
        self.raw(&format!("(APIServer pid={pid}) {level} {} [{place}] {message}", stamp(t)))
    }

    /// The API server's start lines (version, listen address) and uvicorn's startup.
    pub fn startup(&mut self, t: DateTime<Utc>, lines: [(&str, &str); 2]) -> &mut Self {
        for (place, message) in lines {
            self.logger("INFO", t, place, message);
        }
        let pid = self.pid;
        self.raw(&format!("INFO:     Started server process [{pid}]")).raw("INFO:     Application startup complete.")
    }

    /// An engine throughput line.
    pub fn throughput(&mut self, t: DateTime<Utc>, tokens_per_s: &str, tail: &str) -> &mut Self {
        self.logger(
            "INFO",
            t,
            "loggers.py:248",
            &format!("Engine 000: Avg prompt throughput: {tokens_per_s} tokens/s, {tail}"),
        )
    }

    /// A chat-completion access line from `127.0.0.1:<port>`.
    pub fn completion(&mut self, port: u32, code: u16, reason: &str) -> &mut Self {
        self.raw(&access_line(&format!("127.0.0.1:{port}"), "POST", "/v1/chat/completions", (1, 1), code, reason))
    }

    /// payload's health probe as uvicorn logs it (no stamp).
    pub fn health(&mut self) -> &mut Self {
        self.raw(&access_line("127.0.0.1:39999", "GET", "/health", (1, 1), 200, "OK"))
    }

    /// A 400 as vLLM logs it: the access line, an ERROR line and a multi-line traceback ending
    /// in the context-length error.
    pub fn traceback_400(&mut self, t: DateTime<Utc>, port: u32) -> &mut Self {
        self.completion(port, 400, "Bad Request");
        self.logger("ERROR", t, "serving_chat.py:212", "Error in preprocessing prompt inputs");
        let pid = self.pid;
        self.raw(&format!("(APIServer pid={pid}) Traceback (most recent call last):"));
        for (file, line, func) in [
            ("vllm/entrypoints/openai/serving_chat.py", 205, "create_chat_completion"),
            ("vllm/entrypoints/openai/serving_engine.py", 1080, "_preprocess_chat"),
            ("vllm/entrypoints/openai/serving_engine.py", 612, "_tokenize_prompt_input_async"),
            ("vllm/entrypoints/openai/serving_engine.py", 540, "_validate_input"),
        ] {
            self.raw(&format!(
                "(APIServer pid={pid})   File \"/opt/venv/lib/python3.12/site-packages/{file}\", line {line}, in {func}"
            ));
            self.raw(&format!("(APIServer pid={pid})     raise VLLMValidationError("));
        }
        self.raw(&format!("(APIServer pid={pid}) vllm.exceptions.VLLMValidationError: This model's maximum context length is 32768 tokens. However, your request has 40123 input tokens."))
    }

    /// Any line as written.
    pub fn raw(&mut self, line: &str) -> &mut Self {
        self.text.push_str(line);
        self.text.push('\n');
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rundir::harbor::{self, JobConfig, JobLock, TrialStage, classify_trial};

    fn mtime(path: &Path) -> DateTime<Utc> {
        std::fs::metadata(path).unwrap().modified().unwrap().into()
    }

    /// `trial_facts`: finished trials only, numbered per task by start time, the task from
    /// `task_name`; a trial without a verifier reward is invalid with reward 0.
    #[test]
    fn trial_facts_number_attempts_per_task_and_mark_rewardless_trials_invalid() {
        let t0 = DateTime::parse_from_rfc3339("2026-11-30T06:00:00Z").unwrap().with_timezone(&Utc);
        let before = |minutes: i64| t0 - Duration::minutes(minutes);
        let d = RunDir::temp("job");
        d.job(&HarborJob::started("job", before(60), 5, None));
        let done = |reward: Option<f64>, minutes: i64| {
            Stage::Done(Finished {
                reward,
                exception: reward.is_none().then(|| "DaytonaError".into()),
                ..Finished::ok(before(minutes))
            })
        };
        d.trial(&Trial::new("t1__late", done(Some(0.0), 5)))
            .trial(&Trial::new("t1__early", done(Some(1.0), 20)))
            .trial(&Trial::new("t2__x", done(None, 8)))
            .trial(&Trial::new("t3__r", Stage::Running(before(3))));
        let facts = harbor::trial_facts(d.path()).unwrap();
        let got: Vec<(&str, u32, f64, bool)> =
            facts.iter().map(|f| (f.task.as_str(), f.attempt, f.reward, f.valid)).collect();
        assert_eq!(got, [("t1", 1, 1.0, true), ("t1", 2, 0.0, true), ("t2", 1, 0.0, false)]);
        assert_eq!(harbor::newest_writer(d.path()), Some(crate::versions::VERIFIED_HARBOR), "the job lock's 0.25.0");

        // Issue 35: Harbor 0.26 writes its verdict; a reward it says does not count (an ApiError
        // after the verifier ran) is invalid, and the dir was touched by 0.26 whatever the lock says.
        let path = d.path().join("t1__late").join(harbor::RESULT_FILE);
        let mut result: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        result["schema_version"] = serde_json::json!(1);
        result["reward_valid"] = serde_json::json!(false);
        std::fs::write(&path, result.to_string()).unwrap();
        let valid: Vec<bool> = harbor::trial_facts(d.path()).unwrap().iter().map(|f| f.valid).collect();
        assert_eq!(valid, [true, false, false]);
        assert_eq!(harbor::newest_writer(d.path()), Some(crate::versions::HARBOR_026));
    }

    /// What the builder writes reads back through the product's own readers as meant.
    #[test]
    fn written_run_dirs_read_back_through_the_run_dir_readers() {
        let t0 = DateTime::parse_from_rfc3339("2026-11-30T06:00:00Z").unwrap().with_timezone(&Utc);
        let before = |minutes: i64| t0 - Duration::minutes(minutes);
        let d = RunDir::temp("job");
        let spec = crate::testkit::TestSpec::new(d.path(), "job").build();
        d.launch(&spec).job(&HarborJob::started("job", before(60), 4, None));
        d.trial(&Trial::new("a__q", Stage::Queued(before(50))))
            .trial(&Trial::new("b__r", Stage::Running(before(40))))
            .trial(&Trial::new("c__d", Stage::Done(Finished::ok(before(10)))))
            .trial(&Trial::new(
                "d__x",
                Stage::Done(Finished {
                    setup_s: None,
                    agent_s: 0.4,
                    output_tokens: None,
                    exception: Some("DaytonaError".into()),
                    reward: None,
                    ..Finished::ok(before(5))
                }),
            ))
            .trial(&Trial::new(
                "e__u",
                Stage::Done(Finished { usage_only: true, output_tokens: Some(96), ..Finished::ok(before(4)) }),
            ));
        let counters = Counters { completions: (7, 1, 0), trials: (4, 3, 1) };
        d.status(&running_status("job", "42", before(55), before(1), counters, before(4)), Some(before(1)))
            .events(&[phase_event(before(58), Phase::Serving), phase_event(before(55), Phase::Running)], None);
        let mut log = VllmLog::new(7);
        log.startup(before(58), [("a.py:1", "vLLM API server version 0.33.0"), ("a.py:2", "Starting")]);
        log.throughput(before(30), "1.0", "Running: 1 reqs").completion(40001, 200, "OK").health();
        log.traceback_400(before(29), 40002);
        d.engine_log(&log, Some(t0));

        let p = d.path();
        assert_eq!(LaunchSpec::from_file(&p.join(SPEC_FILE)).unwrap(), spec);
        assert_eq!(crate::rundir::read_launch(p).unwrap().run_tag.as_deref(), Some("job"));
        let config: JobConfig = harbor::read(&p.join(harbor::CONFIG_FILE)).unwrap().unwrap();
        assert!(config.agents[0].kwargs.has_model_info());
        let lock: JobLock = harbor::read(&p.join(harbor::LOCK_FILE)).unwrap().unwrap();
        assert_eq!(lock.harbor_version(), Some("0.25.0"));
        let result: harbor::JobResult = harbor::read(&p.join(harbor::RESULT_FILE)).unwrap().unwrap();
        assert_eq!((result.n_total_trials, result.finished_at), (Some(4), None));

        let stages: Vec<TrialStage> = ["a__q", "b__r", "c__d"].iter().map(|n| classify_trial(&p.join(n))).collect();
        assert_eq!(stages, [TrialStage::Queued, TrialStage::Running, TrialStage::Done]);
        let trial = |n: &str| -> harbor::TrialResult { harbor::read(&p.join(n).join("result.json")).unwrap().unwrap() };
        let ms = crate::rundir::parse_time_ms;
        let ok = trial("c__d");
        assert_eq!(ok.agent_seconds(ms), Some((240.0, true)), "timed on agent_execution");
        assert!(ok.has_reward() && ok.exception_type().is_none());
        assert_eq!(ok.output_tokens(), Some(1874.0));
        let failed = trial("d__x");
        assert_eq!(failed.agent_seconds(ms), Some((0.4, false)), "no phase timings: the whole trial");
        assert_eq!(
            (failed.exception_type(), failed.has_reward(), failed.output_tokens()),
            (Some("DaytonaError"), false, None)
        );
        assert_eq!(trial("e__u").output_tokens(), Some(96.0), "counted from model_usage");
        assert_eq!(mtime(&p.join("c__d/result.json")), before(10));
        assert_eq!(mtime(&p.join("a__q/trial.log")), before(50));

        let status = crate::rundir::read_status(p).into_status().expect("status.json reads");
        assert_eq!((status.phase, status.slurm_job_id.as_deref()), (Phase::Running, Some("42")));
        assert_eq!(status.heartbeat.as_ref().map(|h| (h.completions_ok, h.trials_errored)), Some((7, 1)));
        assert_eq!(mtime(&p.join(STATUS_FILE)), before(1));
        let events = crate::rundir::read_events(p);
        assert_eq!(events.iter().filter_map(Event::phase).collect::<Vec<_>>(), [Phase::Serving, Phase::Running]);
        assert_eq!(crate::rundir::running_since(&events, Some(&status)), Some(before(55)));

        let scanned = crate::rundir::enginelog::scan_file(&p.join(ENGINE_LOG)).unwrap().unwrap();
        assert_eq!((scanned.ok, scanned.c400), (1, 1), "the health probe is no completion");
        assert_eq!(mtime(&p.join(ENGINE_LOG)), t0);
    }
}
