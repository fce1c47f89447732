//! Typed partial models of Harbor 0.25's job and trial files (docs/harbor-facts.md) and the one
//! trial classifier. Partial: only the fields verification reads; every other field is ignored, so
//! a newer Harbor that adds fields still reads. Version-aware: the job `lock.json` names the Harbor
//! that wrote the dir ([`JobLock::harbor_version`]).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::lenient;
use crate::fsread::{self, Links};

/// Harbor's per-job and per-trial file names (docs/harbor-facts.md: a job dir holds `config.json`,
/// `lock.json`, `result.json`, `job.log` and one dir per trial; a trial dir `config.json`,
/// `lock.json`, `result.json`, `trial.log`, [`TRIAL_SUBDIRS`], and `exception.txt` when it failed).
pub const CONFIG_FILE: &str = "config.json";
pub const RESULT_FILE: &str = "result.json";
pub const LOCK_FILE: &str = "lock.json";
pub const TRIAL_LOG: &str = "trial.log";
/// An installed harness's first command's dir in a trial (`agent/command-0/`, OpenHands): there
/// once the harness's setup in the sandbox is done and it runs its first command.
pub const AGENT_FIRST_COMMAND: &str = "agent/command-0";
pub const JOB_LOG: &str = "job.log";
/// A failed trial's Python traceback.
pub const EXCEPTION_FILE: &str = "exception.txt";
/// The subdirs Harbor makes in every trial dir when it constructs the trial.
pub(crate) const AGENT_DIR: &str = "agent";
pub(crate) const VERIFIER_DIR: &str = "verifier";
pub(crate) const ARTIFACTS_DIR: &str = "artifacts";
pub const TRIAL_SUBDIRS: [&str; 3] = [AGENT_DIR, VERIFIER_DIR, ARTIFACTS_DIR];
/// The verifier's test output: it appears when the verifier starts (the trial is verifying).
pub const VERIFIER_STDOUT: &str = "verifier/test-stdout.txt";
/// The reward the task's tests wrote.
pub const VERIFIER_REWARD: &str = "verifier/reward.txt";
/// The agent's ATIF trajectory.
pub const AGENT_TRAJECTORY: &str = "agent/trajectory.json";

/// The job `config.json` (what Harbor resolved from its flags and YAML layers).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct JobConfig {
    #[serde(default)]
    pub job_name: Option<String>,
    #[serde(default)]
    pub n_attempts: Option<u64>,
    /// Absent when 1.0 (Harbor writes only non-default fields).
    #[serde(default)]
    pub timeout_multiplier: Option<f64>,
    #[serde(default)]
    pub agents: Vec<AgentConfig>,
    #[serde(default)]
    pub datasets: Vec<DatasetConfig>,
    /// Absent when the job ran with its Harbor's retry defaults (0.25 writes only what was set;
    /// 0.26 writes its resolved `exclude_exceptions`).
    #[serde(default)]
    pub retry: Option<RetrySettings>,
}

/// The job config's `retry` block, as far as a resume across Harbor releases needs it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RetrySettings {
    #[serde(default)]
    pub exclude_exceptions: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct AgentConfig {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub model_name: Option<String>,
    #[serde(default)]
    pub kwargs: AgentKwargs,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct AgentKwargs {
    #[serde(default)]
    pub api_base: Option<String>,
    #[serde(default)]
    pub model_info: Option<Value>,
}

impl AgentKwargs {
    /// A non-empty `model_info` mapping (what hosted_vllm models need before their first request).
    pub fn has_model_info(&self) -> bool {
        self.model_info.as_ref().and_then(Value::as_object).is_some_and(|m| !m.is_empty())
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct DatasetConfig {
    #[serde(default)]
    pub path: Option<String>,
}

/// The job `result.json`. Harbor writes its job timestamps as naive local time. Read field by field
/// as `serde_json::Value`'s accessors read it (a field of the wrong type is absent), keeping only
/// what the submitter uses: the trial-id arrays of `stats` are counted, not kept, so a result.json
/// near its 16 MiB cap costs little more than its bytes ([`super::lenient`]).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct JobResult {
    #[serde(default, deserialize_with = "lenient::string_or_none")]
    pub started_at: Option<String>,
    #[serde(default, deserialize_with = "lenient::string_or_none")]
    pub updated_at: Option<String>,
    /// `null` until Harbor finished the job.
    #[serde(default, deserialize_with = "lenient::string_or_none")]
    pub finished_at: Option<String>,
    #[serde(default, deserialize_with = "lenient::u64_or_none")]
    pub n_total_trials: Option<u64>,
    #[serde(default, deserialize_with = "lenient::some_struct")]
    pub stats: Option<JobStats>,
}

/// The job's `stats`: counts per job and, per eval, its mean, counts, errors by type and rewards.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct JobStats {
    #[serde(default, deserialize_with = "lenient::u64_or_none")]
    pub n_completed_trials: Option<u64>,
    #[serde(default, deserialize_with = "lenient::u64_or_none")]
    pub n_trials: Option<u64>,
    #[serde(default, deserialize_with = "lenient::u64_or_none")]
    pub n_errors: Option<u64>,
    #[serde(default, deserialize_with = "lenient::map_or_empty")]
    pub evals: BTreeMap<String, lenient::Forgiving<EvalStats>>,
}

/// One eval of the job's `stats.evals`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct EvalStats {
    /// `metrics[0]`: Harbor's mean metric.
    #[serde(default, deserialize_with = "lenient::first_or_default")]
    pub metrics: Metric,
    #[serde(default, deserialize_with = "lenient::u64_or_none")]
    pub n_trials: Option<u64>,
    #[serde(default, deserialize_with = "lenient::u64_or_none")]
    pub n_errors: Option<u64>,
    /// Exception type → the number of trials it ended.
    #[serde(default, deserialize_with = "lenient::map_or_empty")]
    pub exception_stats: BTreeMap<String, lenient::Count>,
    #[serde(default, deserialize_with = "lenient::struct_or_default")]
    pub reward_stats: RewardStats,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Metric {
    #[serde(default, deserialize_with = "lenient::f64_or_none")]
    pub mean: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct RewardStats {
    /// Reward value → the number of trials that got it.
    #[serde(default, deserialize_with = "lenient::map_or_empty")]
    pub reward: BTreeMap<String, lenient::Count>,
}

/// The job `lock.json` (schema_version 3 in Harbor 0.25): which Harbor wrote the dir.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct JobLock {
    #[serde(default)]
    pub schema_version: Option<u64>,
    #[serde(default)]
    pub harbor: Option<HarborInfo>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct HarborInfo {
    #[serde(default)]
    pub version: Option<String>,
}

impl JobLock {
    pub fn harbor_version(&self) -> Option<&str> {
        self.harbor.as_ref()?.version.as_deref()
    }
}

/// One phase's timing in a trial `result.json` (`environment_setup`, `agent_setup`,
/// `agent_execution`, `verifier`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Timing {
    #[serde(default)]
    pub started_at: Option<String>,
    #[serde(default)]
    pub finished_at: Option<String>,
}

/// A trial `result.json`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TrialResult {
    /// The task this trial ran (Harbor ≥ 0.2x); older results name it only by the trial dir.
    #[serde(default)]
    pub task_name: Option<String>,
    #[serde(default)]
    pub exception_info: Option<ExceptionInfo>,
    #[serde(default)]
    pub verifier_result: Option<VerifierResult>,
    #[serde(default)]
    pub agent_result: Option<AgentResult>,
    #[serde(default)]
    pub started_at: Option<String>,
    #[serde(default)]
    pub finished_at: Option<String>,
    #[serde(default)]
    pub environment_setup: Option<Timing>,
    #[serde(default)]
    pub agent_execution: Option<Timing>,
    /// Harbor's own verdict on whether the reward counts (Harbor ≥ 0.26 writes it; 0.25 computed
    /// it without writing it).
    #[serde(default)]
    pub reward_valid: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ExceptionInfo {
    #[serde(default)]
    pub exception_type: Option<String>,
    /// `str(exception)` (Harbor 0.25's `ExceptionInfo.from_exception`): for a provider's error, the
    /// provider's own words (`Failed to create sandbox: Bearer token is invalid`).
    #[serde(default)]
    pub exception_message: Option<String>,
}

/// The exception classes Harbor 0.25 records when the sandbox provider, not the agent or the model,
/// failed a trial: the Daytona SDK's errors (`daytona.common.errors`, imported by Harbor's
/// `environments/daytona`; `DaytonaAuthorizationError` is recorded as `DaytonaForbiddenError`), a
/// sandbox that did not start in time (`trial/errors.py`) or failed to build (`environments/base.py`).
/// Every one is also an infra type Harbor reruns on resume (`launch_spec::spec::INFRA_ERROR_TYPES`).
pub const SANDBOX_PROVIDER_ERROR_TYPES: &[&str] = &[
    "DaytonaError",
    "DaytonaAuthenticationError",
    "DaytonaForbiddenError",
    "DaytonaNotFoundError",
    "DaytonaRateLimitError",
    "EnvironmentStartTimeoutError",
    "SandboxBuildFailedError",
];

/// Whether a trial's exception class is the sandbox provider's fault ([`SANDBOX_PROVIDER_ERROR_TYPES`],
/// or any other class of the Daytona SDK: they all start with `Daytona`).
pub fn is_sandbox_provider_error(exception_type: &str) -> bool {
    SANDBOX_PROVIDER_ERROR_TYPES.contains(&exception_type) || exception_type.starts_with("Daytona")
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct VerifierResult {
    #[serde(default)]
    pub rewards: Option<BTreeMap<String, Value>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct AgentResult {
    #[serde(default)]
    pub n_output_tokens: Option<f64>,
    /// Per model (Harbor 0.25): `{"<model>": {"n_output_tokens": …, …}}`.
    #[serde(default)]
    pub model_usage: Option<BTreeMap<String, ModelUsage>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ModelUsage {
    #[serde(default)]
    pub n_output_tokens: Option<f64>,
}

impl TrialResult {
    pub fn exception_type(&self) -> Option<&str> {
        self.exception_info.as_ref().map(|e| e.exception_type.as_deref().unwrap_or("Unknown"))
    }

    /// The exception's message, its first line only (the rest is the provider's detail or a
    /// traceback), at most 300 characters.
    pub fn exception_message(&self) -> Option<String> {
        let text = self.exception_info.as_ref()?.exception_message.as_deref()?;
        let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
        Some(line.chars().take(300).collect())
    }

    /// A numeric reward from the verifier.
    pub fn has_reward(&self) -> bool {
        self.verifier_result.as_ref().and_then(|v| v.rewards.as_ref()).is_some_and(|r| r.values().any(Value::is_number))
    }

    /// The verifier's reward: the `reward` entry when numeric, else the first numeric one.
    pub fn reward(&self) -> Option<f64> {
        let rewards = self.verifier_result.as_ref()?.rewards.as_ref()?;
        rewards.get("reward").and_then(Value::as_f64).or_else(|| rewards.values().find_map(Value::as_f64))
    }

    /// Output tokens the agent got: `n_output_tokens`, else the sum over `model_usage`.
    pub fn output_tokens(&self) -> Option<f64> {
        let agent = self.agent_result.as_ref()?;
        agent.n_output_tokens.or_else(|| {
            let usage = agent.model_usage.as_ref()?;
            let values: Vec<f64> = usage.values().filter_map(|u| u.n_output_tokens).collect();
            (!values.is_empty()).then(|| values.iter().sum())
        })
    }

    /// Seconds the agent ran (`agent_execution`), else — older Harbor without phase timings — the
    /// whole trial (`started_at` → `finished_at`), which includes the sandbox setup.
    pub fn agent_seconds(&self, parse: impl Fn(&str) -> Option<i64>) -> Option<(f64, bool)> {
        let span =
            |s: Option<&String>, f: Option<&String>| -> Option<f64> { Some((parse(f?)? - parse(s?)?) as f64 / 1000.0) };
        if let Some(t) = &self.agent_execution
            && let Some(s) = span(t.started_at.as_ref(), t.finished_at.as_ref())
        {
            return Some((s, true));
        }
        span(self.started_at.as_ref(), self.finished_at.as_ref()).map(|s| (s, false))
    }
}

/// Where a trial directory is in Harbor's life cycle, from which files it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrialStage {
    /// Not a trial directory (none of Harbor's trial files).
    NotATrial,
    /// Queued: Harbor made the dir (`lock.json`, an empty `trial.log`, empty `agent/`,
    /// `verifier/`, `artifacts/`) but its environment has not started; no `config.json` yet.
    /// Harbor 0.25 writes `lock.json` before it constructs the agent, so a trial whose agent
    /// rejected its configuration stays in this layout (docs/harbor-facts.md).
    Queued,
    /// `trial.log` but no `config.json`, `lock.json` or `result.json`: the trial was never
    /// constructed (an agent that rejected its configuration).
    Unconstructed,
    /// `config.json` and no `result.json`: the sandbox is set up or the agent runs.
    Running,
    /// `verifier/test-stdout.txt` and no `result.json`: the verifier runs.
    Verifying,
    /// `result.json`.
    Done,
}

impl TrialStage {
    /// Started and not done: counts as active.
    pub fn is_active(self) -> bool {
        matches!(self, TrialStage::Running | TrialStage::Verifying)
    }
}

/// Classifies one trial directory (one `stat` per file looked at; nothing is read).
pub fn classify_trial(trial: &Path) -> TrialStage {
    let is_file = |name: &str| std::fs::symlink_metadata(trial.join(name)).is_ok_and(|m| m.file_type().is_file());
    if is_file(RESULT_FILE) {
        return TrialStage::Done;
    }
    if is_file(CONFIG_FILE) {
        return if is_file(VERIFIER_STDOUT) { TrialStage::Verifying } else { TrialStage::Running };
    }
    if is_file(LOCK_FILE) {
        return TrialStage::Queued;
    }
    if is_file(TRIAL_LOG) { TrialStage::Unconstructed } else { TrialStage::NotATrial }
}

/// The one cap on a trial's `result.json`: a bigger one counts as done and is not read (so it is
/// neither errored nor rewarded), in payload's heartbeat and in `check` alike.
pub(crate) const TRIAL_RESULT_CAP: u64 = fsread::RECORD_CAP;

/// Whether a run-dir entry may be a trial: a directory by its listed type (`d_type`, no `stat`),
/// so a symlink to a directory never is; [`read_trial`] then classifies it.
pub fn is_trial_entry(entry: &std::fs::DirEntry) -> bool {
    entry.file_type().is_ok_and(|t| t.is_dir())
}

/// A trial directory as both programs see it: its stage and, once done, its `result.json`.
#[derive(Debug, Clone)]
pub struct TrialRead {
    pub stage: TrialStage,
    /// When `result.json` was last written (once it could be opened).
    pub result_modified: Option<std::time::SystemTime>,
    /// The parsed `result.json`: `None` while running, and when it is oversized, torn or not
    /// Harbor's shape (still done).
    pub result: Option<TrialResult>,
    /// A started trial's `config.json` time (its start); looked at only while it is active.
    pub config_modified: Option<std::time::SystemTime>,
    /// An active trial has [`AGENT_FIRST_COMMAND`]: an installed harness finished its setup.
    pub agent_started: bool,
}

impl TrialRead {
    /// A done trial whose `result.json` names an exception: the one "errored" rule.
    pub fn errored(&self) -> bool {
        self.result.as_ref().is_some_and(|r| r.exception_type().is_some())
    }
}

/// The one trial reader (payload's heartbeat counts, `check`'s scan). Most trials of a big run are
/// done, so `result.json` is opened first (one system call classifies and reads) and only the
/// others go through [`classify_trial`]. `result.json` is read as a regular file, never through a
/// symlink (a symlinked one is not a result: [`classify_trial`] does not see it as done), never a
/// FIFO or device, at most [`TRIAL_RESULT_CAP`]. `buf` is reused between calls.
pub fn read_trial(trial: &Path, buf: &mut Vec<u8>) -> TrialRead {
    let open = || fsread::open_regular_meta(&trial.join(RESULT_FILE), Links::Refuse).ok();
    let mut opened = open();
    let stage = if opened.is_some() { TrialStage::Done } else { classify_trial(trial) };
    if stage == TrialStage::Done && opened.is_none() {
        // Written between the open and the classification.
        opened = open();
    }
    let mut read =
        TrialRead { stage, result_modified: None, result: None, config_modified: None, agent_started: false };
    if stage.is_active() {
        let meta = |name: &str| std::fs::symlink_metadata(trial.join(name));
        read.config_modified = meta(CONFIG_FILE).and_then(|m| m.modified()).ok();
        read.agent_started = meta(AGENT_FIRST_COMMAND).is_ok_and(|m| m.is_dir());
    }
    let Some((file, meta)) = opened else { return read };
    read.result_modified = meta.modified().ok();
    // An oversized result is not read at all (fstat on the open file), and never past the cap.
    if meta.len() <= TRIAL_RESULT_CAP
        && fsread::read_open(&file, meta.len(), TRIAL_RESULT_CAP, buf).is_ok()
        && buf.len() as u64 <= TRIAL_RESULT_CAP
    {
        read.result = serde_json::from_slice(buf).ok();
    }
    read
}

/// One finished trial as statistics see it (submitter's `stats::Trial`, the ledger's `trials`).
#[derive(Debug, Clone, PartialEq)]
pub struct TrialFact {
    pub task: String,
    /// 1, 2, … within the task, by the trial's start time (then its directory name).
    pub attempt: u32,
    /// The verifier's reward; 0 when it gave none.
    pub reward: f64,
    /// The verifier gave a numeric reward — the trials Harbor's `reward_stats` counts (an error
    /// before the verifier leaves none) — and, where Harbor ≥ 0.26 wrote its verdict
    /// (`reward_valid`), Harbor says it counts (an `ApiError` after the verifier ran gives a reward
    /// that does not). Harbor 0.25's mean counts the others as 0, 0.26 drops them.
    pub valid: bool,
}

/// The finished trials of a Harbor job dir ([`read_trial`] for each, the reader `check` and
/// payload's heartbeat use), in task order then attempt. A trial whose `result.json` is torn or
/// oversized is left out: it has no facts to give. The task is `task_name`, else the trial
/// directory's name before Harbor's `__` suffix.
pub fn trial_facts(job_dir: &Path) -> std::io::Result<Vec<TrialFact>> {
    let mut buf = Vec::with_capacity(16 << 10);
    let mut found: BTreeMap<String, Vec<(Option<String>, String, TrialFact)>> = BTreeMap::new();
    for entry in std::fs::read_dir(job_dir)? {
        let Ok(entry) = entry else { continue };
        if !is_trial_entry(&entry) {
            continue;
        }
        let read = read_trial(&entry.path(), &mut buf);
        let Some(result) = read.result.filter(|_| read.stage == TrialStage::Done) else { continue };
        let dir_name = entry.file_name().to_string_lossy().into_owned();
        let task = result.task_name.clone().unwrap_or_else(|| match dir_name.rsplit_once("__") {
            Some((task, _)) => task.to_string(),
            None => dir_name.clone(),
        });
        let reward = result.reward();
        let valid = reward.is_some() && result.reward_valid != Some(false);
        let fact = TrialFact { task: task.clone(), attempt: 0, reward: reward.unwrap_or(0.0), valid };
        found.entry(task).or_default().push((result.started_at.clone(), dir_name, fact));
    }
    let mut facts = Vec::new();
    for (_, mut trials) in found {
        trials.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        for (number, (_, _, mut fact)) in (1u32..).zip(trials) {
            fact.attempt = number;
            facts.push(fact);
        }
    }
    Ok(facts)
}

/// The newest Harbor release known to have written into a job dir: the job `lock.json` names the
/// release that started the job (a resume keeps it), and a trial `result.json` holding
/// `reward_valid` was written by Harbor ≥ 0.26 (`crate::versions::HARBOR_026`), whichever is newer.
/// `None` when neither says.
pub fn newest_writer(job_dir: &Path) -> Option<crate::versions::Version> {
    let lock: Option<JobLock> = read(&job_dir.join(LOCK_FILE)).ok().flatten();
    let started: Option<crate::versions::Version> = lock.as_ref().and_then(|l| l.harbor_version()?.parse().ok());
    let mut buf = Vec::with_capacity(16 << 10);
    let touched_by_026 = std::fs::read_dir(job_dir).ok().is_some_and(|entries| {
        entries
            .flatten()
            .filter(is_trial_entry)
            .any(|e| read_trial(&e.path(), &mut buf).result.is_some_and(|r| r.reward_valid.is_some()))
    });
    let floor = touched_by_026.then_some(crate::versions::HARBOR_026);
    started.max(floor)
}

/// Reads a Harbor JSON file into its model: `Ok(None)` when absent, `Err` with serde's message when
/// it does not parse (or is not a regular file of at most [`fsread::RECORD_CAP`] bytes).
pub fn read<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, String> {
    match fsread::read_capped(path, fsread::RECORD_CAP, Links::Refuse) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| e.to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// Harbor rewrites the job's `result.json` in place (truncate, then write) while the job runs, so a
/// reader can catch it empty or half written. [`read`], tried again up to 3 times 20 ms apart while
/// the file is there but does not parse; a file still unreadable then is reported as such.
pub fn read_rewritten<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, String> {
    read_rewritten_with(path, 3, || std::thread::sleep(std::time::Duration::from_millis(20)))
}

fn read_rewritten_with<T: serde::de::DeserializeOwned>(
    path: &Path,
    retries: u32,
    mut pause: impl FnMut(),
) -> Result<Option<T>, String> {
    let mut result = read(path);
    for _ in 0..retries {
        if result.is_ok() {
            break;
        }
        pause();
        result = read(path);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every provider class is one Harbor reruns on resume; the agent's and the model's are not
    /// the provider's.
    #[test]
    fn sandbox_provider_errors_are_infra_types_and_only_the_providers() {
        for kind in SANDBOX_PROVIDER_ERROR_TYPES {
            assert!(crate::spec::INFRA_ERROR_TYPES.contains(kind), "{kind}");
            assert!(is_sandbox_provider_error(kind));
        }
        assert!(is_sandbox_provider_error("DaytonaTimeoutError"));
        for kind in ["AgentTimeoutError", "AgentSetupTimeoutError", "BadRequestError", "CancelledError"] {
            assert!(!is_sandbox_provider_error(kind), "{kind}");
        }
    }

    #[test]
    fn a_result_caught_mid_rewrite_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(RESULT_FILE);
        // Caught after the truncate: the pause is when Harbor's write lands.
        std::fs::write(&path, "").unwrap();
        let mut pauses = 0;
        let read: Option<JobResult> = read_rewritten_with(&path, 3, || {
            pauses += 1;
            std::fs::write(&path, r#"{"started_at": "2026-11-30T10:00:00", "finished_at": null}"#).unwrap();
        })
        .unwrap();
        assert_eq!((pauses, read.unwrap().started_at.as_deref()), (1, Some("2026-11-30T10:00:00")));
        // Still torn after every retry: an error, not "absent".
        std::fs::write(&path, "{\"started_at\": ").unwrap();
        let mut pauses = 0;
        assert!(read_rewritten_with::<JobResult>(&path, 3, || pauses += 1).is_err());
        assert_eq!(pauses, 3);
        // Absent or whole: no pause at all.
        assert!(
            read_rewritten_with::<JobResult>(&dir.path().join("none.json"), 3, || panic!("paused")).unwrap().is_none()
        );
    }

    #[test]
    fn trial_stages_follow_harbors_files() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        assert_eq!(classify_trial(t), TrialStage::NotATrial);
        // Harbor 0.25 before the environment starts: lock.json, empty trial.log, empty dirs.
        for sub in ["agent", "verifier", "artifacts"] {
            std::fs::create_dir_all(t.join(sub)).unwrap();
        }
        std::fs::write(t.join("trial.log"), "").unwrap();
        assert_eq!(classify_trial(t), TrialStage::Unconstructed);
        std::fs::write(t.join("lock.json"), "{}").unwrap();
        assert_eq!(classify_trial(t), TrialStage::Queued);
        std::fs::write(t.join("config.json"), "{}").unwrap();
        assert_eq!(classify_trial(t), TrialStage::Running);
        std::fs::write(t.join("verifier/test-stdout.txt"), "ok").unwrap();
        assert_eq!(classify_trial(t), TrialStage::Verifying);
        std::fs::write(t.join("result.json"), "{}").unwrap();
        assert_eq!(classify_trial(t), TrialStage::Done);
    }

    #[test]
    fn output_tokens_and_agent_time_from_harbor_025() {
        let r: TrialResult = serde_json::from_str(
            r#"{"agent_result": {"n_output_tokens": null, "model_usage": {"m": {"n_output_tokens": 0}}, "extra": 1},
                "started_at": "2026-12-01T16:30:00.000Z", "finished_at": "2026-12-01T16:32:00.300Z",
                "agent_execution": {"started_at": "2026-12-01T16:32:00.000Z", "finished_at": "2026-12-01T16:32:00.300Z"},
                "unknown_field": [1, 2]}"#,
        )
        .unwrap();
        assert_eq!(r.output_tokens(), Some(0.0));
        let ms = |s: &str| crate::rundir::parse_time_ms(s);
        assert_eq!(r.agent_seconds(ms), Some((0.3, true)));
        let whole: TrialResult =
            serde_json::from_str(r#"{"started_at": "2026-12-01T16:30:00Z", "finished_at": "2026-12-01T16:32:00Z"}"#)
                .unwrap();
        assert_eq!(whole.agent_seconds(ms), Some((120.0, false)));
    }
}
