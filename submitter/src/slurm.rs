//! The only place that talks to Slurm.
//!
//! Everything goes through the [`Slurm`] trait so the rest of the submitter can be tested
//! against a fake; [`SlurmCli`] is the real implementation and runs `sbatch`, `squeue`,
//! `scontrol` and `scancel` with argument vectors (never a shell) and an explicit environment.
//!
//! Facts this module relies on, observed on Slurm 22.05 (docs/design.md §10):
//! - `sacct` needs slurmdbd, so job state comes from `squeue --states=all` and
//!   `scontrol -o show job`, which both forget a job `MinJobAge` (300 s) after it ends.
//! - `sbatch --export=NAME1,NAME2` propagates only those variables plus `SLURM_*`, but the job
//!   also gets the user's login environment (`HOME`, `PATH`, `USER`, ... as `su -` builds it).
//! - `scancel --signal=SIG` only reaches the batch script with `--batch`; `scancel` exits 0
//!   and prints nothing for unknown or finished jobs.
//! - A submission rejected for resources (`Requested node configuration is not available`)
//!   still leaves a FAILED job record (reason `BadConstraints`) with the requested name.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::thread;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wait_timeout::ChildExt;

/// A Slurm job id (the numeric id; job arrays are not used by the submitter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub u64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for JobId {
    type Err = ParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        trimmed.parse::<u64>().map(JobId).map_err(|_| ParseError(format!("not a job id: {trimmed:?}")))
    }
}

/// A job state as `squeue %T` and `scontrol JobState=` print it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobState {
    Pending,
    Configuring,
    Running,
    Suspended,
    Completing,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    NodeFail,
    Preempted,
    OutOfMemory,
    BootFail,
    Deadline,
    Requeued,
    RequeueHold,
    RequeueFed,
    Resizing,
    Revoked,
    Signaling,
    SpecialExit,
    StageOut,
    Stopped,
    ResvDelHold,
    /// A state this module does not know; neither active nor terminal.
    Other(String),
}

impl JobState {
    const NAMES: &[(&str, JobState)] = &[
        ("PENDING", JobState::Pending),
        ("CONFIGURING", JobState::Configuring),
        ("RUNNING", JobState::Running),
        ("SUSPENDED", JobState::Suspended),
        ("COMPLETING", JobState::Completing),
        ("COMPLETED", JobState::Completed),
        ("FAILED", JobState::Failed),
        ("CANCELLED", JobState::Cancelled),
        ("TIMEOUT", JobState::Timeout),
        ("NODE_FAIL", JobState::NodeFail),
        ("PREEMPTED", JobState::Preempted),
        ("OUT_OF_MEMORY", JobState::OutOfMemory),
        ("BOOT_FAIL", JobState::BootFail),
        ("DEADLINE", JobState::Deadline),
        ("REQUEUED", JobState::Requeued),
        ("REQUEUE_HOLD", JobState::RequeueHold),
        ("REQUEUE_FED", JobState::RequeueFed),
        ("RESIZING", JobState::Resizing),
        ("REVOKED", JobState::Revoked),
        ("SIGNALING", JobState::Signaling),
        ("SPECIAL_EXIT", JobState::SpecialExit),
        ("STAGE_OUT", JobState::StageOut),
        ("STOPPED", JobState::Stopped),
        ("RESV_DEL_HOLD", JobState::ResvDelHold),
    ];

    /// Parses a state name. Only the first word counts, because some Slurm versions print
    /// `CANCELLED by 0`; unknown names become [`JobState::Other`].
    pub fn parse(text: &str) -> JobState {
        let word = text.split_whitespace().next().unwrap_or("").to_ascii_uppercase();
        // squeue's short codes are not used here, but "CANCELLED+" appears in sacct output.
        let word = word.trim_end_matches('+');
        Self::NAMES
            .iter()
            .find(|(name, _)| *name == word)
            .map(|(_, state)| state.clone())
            .unwrap_or_else(|| JobState::Other(word.to_string()))
    }

    /// The name Slurm uses for this state.
    pub fn as_str(&self) -> &str {
        match self {
            JobState::Other(name) => name,
            known => Self::NAMES.iter().find(|(_, state)| state == known).map(|(name, _)| *name).unwrap_or("UNKNOWN"),
        }
    }

    /// The job is queued, running or on its way out and may still change state by itself
    /// (held and requeued jobs included: they can run again).
    pub fn is_active(&self) -> bool {
        matches!(
            self,
            JobState::Pending
                | JobState::Configuring
                | JobState::Running
                | JobState::Suspended
                | JobState::Completing
                | JobState::Requeued
                | JobState::RequeueHold
                | JobState::RequeueFed
                | JobState::Resizing
                | JobState::Signaling
                | JobState::SpecialExit
                | JobState::StageOut
                | JobState::Stopped
                | JobState::ResvDelHold
        )
    }

    /// The job has ended and its state will not change again.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            JobState::Completed
                | JobState::Failed
                | JobState::Cancelled
                | JobState::Timeout
                | JobState::NodeFail
                | JobState::Preempted
                | JobState::OutOfMemory
                | JobState::BootFail
                | JobState::Deadline
                | JobState::Revoked
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `ExitCode=<code>:<signal>` from `scontrol`: the batch script's exit code, or the signal
/// that ended it (`0:15` for a job cancelled or timed out by SIGTERM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobExit {
    pub code: i32,
    pub signal: i32,
}

impl FromStr for JobExit {
    type Err = ParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || ParseError(format!("not an exit code (want CODE:SIGNAL): {text:?}"));
        let (code, signal) = text.trim().split_once(':').ok_or_else(bad)?;
        Ok(JobExit { code: code.parse().map_err(|_| bad())?, signal: signal.parse().map_err(|_| bad())? })
    }
}

/// What Slurm says about one job. Times are Slurm's local-time text (`2026-11-30T05:44:41`,
/// forced by `SLURM_TIME_FORMAT=standard`); absent values (`N/A`, `Unknown`, ...) are `None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    pub id: JobId,
    pub name: String,
    pub state: JobState,
    /// Why the job waits or ended (`Priority`, `Resources`, `Dependency`, `TimeLimit`,
    /// `NonZeroExitCode`, ...); `None` when Slurm says `None`.
    pub reason: Option<String>,
    pub submit_time: Option<String>,
    /// Actual start, or the scheduler's expected start for a pending job.
    pub start_time: Option<String>,
    /// Actual end, or the expected end (start + time limit) for a running job.
    pub end_time: Option<String>,
    pub node_list: Option<String>,
    pub partition: Option<String>,
    /// Only `scontrol show job` reports it; `None` from `squeue`.
    pub exit: Option<JobExit>,
    /// Only from `scontrol show job`.
    pub std_out: Option<PathBuf>,
    /// Every `key=value` pair `scontrol show job` printed; empty for `squeue` results.
    pub details: BTreeMap<String, String>,
}

impl JobInfo {
    /// When the job held its allocation: `StartTime`, and `EndTime` once Slurm has ended it (for
    /// a job still running or completing, `EndTime` is only the expected end: `None`). Queue wait
    /// (`SubmitTime` → `StartTime`) is never in it.
    pub fn ran(&self) -> (Option<chrono::DateTime<chrono::Utc>>, Option<chrono::DateTime<chrono::Utc>>) {
        let start = self.start_time.as_deref().and_then(parse_time);
        let end = self.end_time.as_deref().filter(|_| self.state.is_terminal()).and_then(parse_time);
        (start.filter(|_| !matches!(self.state, JobState::Pending)), end)
    }
}

/// A Slurm timestamp (`2026-11-30T05:44:42`): the controller's local time, read in this machine's
/// time zone (the login node's; the same as the controller's on every cluster here).
pub fn parse_time(t: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    use chrono::TimeZone;
    let naive = chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S").ok()?;
    chrono::Local.from_local_datetime(&naive).earliest().map(|t| t.with_timezone(&chrono::Utc))
}

/// Ask Slurm to send `signal` this long before the time limit (`--signal=[B:]SIG@SECONDS`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalSpec {
    /// Name (`USR1`) or number, without the `SIG` prefix.
    pub signal: String,
    pub(crate) seconds_before_limit: u32,
    /// `B:` — signal only the batch shell. Needed when the batch script itself is the
    /// process that must see the signal (no srun steps).
    pub(crate) batch_only: bool,
}

impl fmt::Display for SignalSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = if self.batch_only { "B:" } else { "" };
        write!(f, "{prefix}{}@{}", self.signal, self.seconds_before_limit)
    }
}

impl FromStr for SignalSpec {
    type Err = ParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| ParseError(format!("bad signal spec {text:?}: {why}"));
        let (batch_only, rest) = match text.strip_prefix("B:") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (signal, seconds) = rest.split_once('@').ok_or_else(|| bad("want [B:]SIG@SECONDS"))?;
        if signal.is_empty() || !signal.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(bad("signal must be a name like USR1 or a number"));
        }
        let seconds_before_limit = seconds.parse().map_err(|_| bad("seconds must be a number"))?;
        Ok(SignalSpec { signal: signal.to_string(), seconds_before_limit, batch_only })
    }
}

/// Typed `sbatch` options. `None`/empty leaves Slurm's default (or the script's `#SBATCH`
/// line) in force.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SbatchOptions {
    pub job_name: Option<String>,
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    pub reservation: Option<String>,
    /// `--time`; Slurm rounds up to whole minutes.
    pub time_limit: Option<Duration>,
    pub nodes: Option<u32>,
    /// `--ntasks-per-node` (1 for a multi-node engine: payload starts one rank per node itself).
    #[serde(default)]
    pub ntasks_per_node: Option<u32>,
    /// `--gres=gpu[:TYPE]:N` (per node).
    pub gpus_per_node: Option<u32>,
    pub gpu_type: Option<String>,
    pub cpus_per_task: Option<u32>,
    /// `--mem` in MiB (per node).
    pub mem_mb: Option<u64>,
    pub signal: Option<SignalSpec>,
    /// `--output`; may use Slurm's `%j` patterns.
    pub output: Option<PathBuf>,
    pub error: Option<PathBuf>,
    pub chdir: Option<PathBuf>,
    /// `--dependency`, e.g. `afterok:123`.
    pub dependency: Option<String>,
    /// `--begin`, e.g. `now+60` or `2026-12-01T10:00:00`.
    pub begin: Option<String>,
    /// `--exclude`: nodes not to run on (remediation of a node-level fault).
    #[serde(default)]
    pub exclude: Option<String>,
    /// `--comment`: the attempt's submission tag, by which a job whose sbatch answer was lost is
    /// found again ([`Slurm::find_by_comment`]).
    #[serde(default)]
    pub comment: Option<String>,
    /// Passed verbatim before the script path (each element is one argv entry).
    pub extra_args: Vec<String>,
}

/// One `sbatch` submission.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitRequest {
    pub script: PathBuf,
    pub script_args: Vec<String>,
    pub options: SbatchOptions,
    /// The only variables the job gets from the submitter, as `--export=NAME1,NAME2`
    /// (plus Slurm's own `SLURM_*` and the user's login environment). Empty means
    /// `--export=NONE`. The values are put into sbatch's environment, which is otherwise
    /// cleared, so nothing else from the submitter's environment leaks into the job.
    pub export: Vec<(String, String)>,
}

/// A parser's complaint about Slurm output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

/// Everything that can go wrong talking to Slurm. Each message is one line naming the
/// command, so it can go straight into a log or a ledger.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("could not run `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed { command: String, status: String, stderr: String },
    #[error("`{command}` did not finish within {}s and was killed", timeout.as_secs())]
    TimedOut { command: String, timeout: Duration },
    #[error("`{command}` printed something unexpected: {problem}")]
    UnexpectedOutput {
        command: String,
        #[source]
        problem: ParseError,
    },
    #[error("invalid sbatch request: {0}")]
    InvalidRequest(String),
}

/// What slurmctld says when its answer to a request got lost on the way back (a busy controller):
/// the request may well have been carried out.
const LOST_ANSWER_MESSAGES: &[&str] = &["Socket timed out on send/recv operation", "Zero Bytes were transmitted"];

impl SlurmError {
    /// Whether a failed `sbatch` may nevertheless have queued the job: it was killed at the timeout,
    /// its answer did not parse, or it lost the controller's answer. A rejection the controller
    /// answered (bad partition, …) and a command that never ran queued nothing.
    pub(crate) fn submission_unknown(&self) -> bool {
        match self {
            SlurmError::TimedOut { .. } | SlurmError::UnexpectedOutput { .. } => true,
            SlurmError::Failed { stderr, .. } => LOST_ANSWER_MESSAGES.iter().any(|m| stderr.contains(m)),
            SlurmError::Spawn { .. } | SlurmError::InvalidRequest(_) => false,
        }
    }
}

/// The operations the submitter needs from Slurm.
pub trait Slurm {
    /// Submits a batch job and returns its id.
    fn submit(&self, request: &SubmitRequest) -> Result<JobId, SlurmError>;
    /// The jobs among `ids` that Slurm still remembers (finished jobs vanish after MinJobAge).
    fn jobs(&self, ids: &[JobId]) -> Result<Vec<JobInfo>, SlurmError>;
    /// One job with full detail (exit code, output path), or `None` if Slurm does not know it.
    fn show(&self, id: JobId) -> Result<Option<JobInfo>, SlurmError>;
    /// All remembered jobs (any user, any state) whose name is exactly `name`.
    fn find_by_name(&self, name: &str) -> Result<Vec<JobInfo>, SlurmError>;
    /// All remembered jobs (any user, any state) whose `--comment` is exactly `comment`.
    fn find_by_comment(&self, comment: &str) -> Result<Vec<JobInfo>, SlurmError>;
    /// `scancel`; with `signal`, sends that signal instead of ending the job, and
    /// `batch_only` is needed for the batch script itself to receive it.
    fn cancel(&self, id: JobId, signal: Option<&str>, batch_only: bool) -> Result<(), SlurmError>;
    /// `scontrol update jobid=J reservation=R`: puts a job onto reservation `R` (Slurm only does so
    /// while it is pending; the caller checks that first).
    fn move_to_reservation(&self, id: JobId, reservation: &str) -> Result<(), SlurmError>;
}

/// `squeue -o` fields, `|`-separated. The name goes last because it is the only field that
/// may itself contain `|`.
pub(crate) const SQUEUE_FORMAT: &str = "%A|%T|%r|%V|%S|%e|%N|%P|%j";
const SQUEUE_FIELD_COUNT: usize = 9;

/// `squeue -o` fields for [`Slurm::find_by_comment`]: id, then the comment (last: it may hold `|`).
const SQUEUE_COMMENT_FORMAT: &str = "%A|%k";

/// Variables passed from the submitter's environment to every Slurm command; everything
/// else is cleared so `SBATCH_*`/`SQUEUE_*`/`SLURM_*` settings cannot change what we asked for.
const INHERITED_VARIABLES: &[&str] = &["PATH", "HOME", "USER", "LOGNAME", "SLURM_CONF", "TZ"];

/// Runs the real Slurm commands.
#[derive(Debug, Clone)]
pub struct SlurmCli {
    bin_dir: Option<PathBuf>,
    command_timeout: Duration,
    base_env: Vec<(OsString, OsString)>,
}

impl Default for SlurmCli {
    fn default() -> Self {
        Self::new()
    }
}

impl SlurmCli {
    /// Finds the commands on `PATH`; each command may run for up to 60 s.
    pub fn new() -> Self {
        let mut base_env: Vec<(OsString, OsString)> = INHERITED_VARIABLES
            .iter()
            .filter_map(|name| std::env::var_os(name).map(|value| (OsString::from(name), value)))
            .collect();
        // Fixed, parseable timestamps whatever the site sets.
        base_env.push(("SLURM_TIME_FORMAT".into(), "standard".into()));
        SlurmCli { bin_dir: None, command_timeout: Duration::from_secs(60), base_env }
    }

    #[cfg(test)] // used only by the tests
    /// Runs `<dir>/sbatch` etc. instead of looking them up on `PATH` (tests use fake commands).
    pub(crate) fn with_bin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.bin_dir = Some(dir.into());
        self
    }

    /// Kills a Slurm command that runs longer than this (they retry for a long time when
    /// slurmctld is down).
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Whether `scontrol ping` says a controller is UP. `Ok(false)` when it answers otherwise
    /// or exits non-zero; `Err` only when `scontrol` cannot be run at all.
    pub fn ping(&self) -> Result<bool, SlurmError> {
        let output = self.run("scontrol", &["ping".into()], &[])?;
        Ok(output.status.success() && output.stdout.contains("is UP"))
    }

    /// Runs a read-only Slurm query (`sinfo`, `scontrol show …`, `sacctmgr show …`) for preflight:
    /// (exited 0, stdout, stderr).
    pub fn query(&self, name: &str, args: &[&str]) -> Result<(bool, String, String), SlurmError> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let output = self.run(name, &args, &[])?;
        Ok((output.status.success(), output.stdout, output.stderr))
    }

    /// The live reservations' names (`scontrol -o show reservation`); empty when there are none.
    pub fn reservations(&self) -> Result<Vec<String>, SlurmError> {
        let args: Vec<OsString> = ["-o", "show", "reservation"].iter().map(OsString::from).collect();
        let output = self.run("scontrol", &args, &[])?;
        if !output.status.success() && !output.stdout.contains("No reservations") {
            return Err(output.failure());
        }
        Ok(parse_reservation_names(&output.stdout))
    }

    /// The partition's walltime limit as Slurm writes it (`scontrol -o show partition P`'s
    /// `MaxTime`: `1-00:00:00`, or `UNLIMITED`, which `config::parse_slurm_time` reads as none).
    pub(crate) fn partition_max_time(&self, partition: &str) -> Result<Option<String>, SlurmError> {
        let args: Vec<OsString> = ["-o", "show", "partition", partition].iter().map(OsString::from).collect();
        let output = self.run("scontrol", &args, &[])?;
        if !output.status.success() {
            return Err(output.failure());
        }
        Ok(parse_partition_max_time(&output.stdout))
    }

    fn program(&self, name: &str) -> PathBuf {
        match &self.bin_dir {
            Some(dir) => dir.join(name),
            None => PathBuf::from(name),
        }
    }

    /// Runs `name args` with the base environment plus `extra_env`, capturing output.
    fn run(&self, name: &str, args: &[OsString], extra_env: &[(String, String)]) -> Result<CommandOutput, SlurmError> {
        let program = self.program(name);
        let command_line = render_command(program.as_os_str(), args);
        tracing::debug!(command = %command_line, "running Slurm command");
        let mut command = Command::new(&program);
        command
            .args(args)
            .env_clear()
            .envs(self.base_env.iter().map(|(k, v)| (k, v)))
            .envs(extra_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = spawn_retrying_busy(&mut command)
            .map_err(|source| SlurmError::Spawn { command: command_line.clone(), source })?;
        wait_with_timeout(child, self.command_timeout)
            .map_err(|failure| match failure {
                WaitFailure::TimedOut => {
                    SlurmError::TimedOut { command: command_line.clone(), timeout: self.command_timeout }
                }
                WaitFailure::Io(source) => SlurmError::Spawn { command: command_line.clone(), source },
            })
            .map(|(status, stdout, stderr)| CommandOutput { command_line, status, stdout, stderr })
    }

    fn squeue(&self, selection: &[OsString]) -> Result<Vec<JobInfo>, SlurmError> {
        let mut args: Vec<OsString> = vec!["-h".into(), "--states=all".into()];
        args.extend_from_slice(selection);
        args.push(format!("--format={SQUEUE_FORMAT}").into());
        let output = self.run("squeue", &args, &[])?;
        if !output.status.success() {
            // Asking only for ids Slurm has forgotten is an error to squeue; to us it is "none".
            if is_invalid_job_id(&output.stderr) {
                return Ok(Vec::new());
            }
            return Err(output.failure());
        }
        parse_squeue_output(&output.stdout).map_err(|problem| output.unexpected(problem))
    }
}

impl Slurm for SlurmCli {
    fn submit(&self, request: &SubmitRequest) -> Result<JobId, SlurmError> {
        let args = build_sbatch_args(request)?;
        let output = self.run("sbatch", &args, &request.export)?;
        if !output.status.success() {
            return Err(output.failure());
        }
        if !output.stderr.trim().is_empty() {
            // sbatch accepts some questionable requests with only a warning; keep it visible.
            tracing::warn!(command = %output.command_line, stderr = %one_line(&output.stderr), "sbatch warned");
        }
        parse_parsable_submit(&output.stdout).map_err(|problem| output.unexpected(problem))
    }

    fn jobs(&self, ids: &[JobId]) -> Result<Vec<JobInfo>, SlurmError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let id_list = ids.iter().map(JobId::to_string).collect::<Vec<_>>().join(",");
        let mut found = self.squeue(&[format!("--jobs={id_list}").into()])?;
        found.retain(|job| ids.contains(&job.id));
        Ok(found)
    }

    fn show(&self, id: JobId) -> Result<Option<JobInfo>, SlurmError> {
        let args: Vec<OsString> = vec!["-o".into(), "show".into(), "job".into(), id.to_string().into()];
        let output = self.run("scontrol", &args, &[])?;
        if !output.status.success() {
            if is_invalid_job_id(&output.stderr) {
                return Ok(None);
            }
            return Err(output.failure());
        }
        for line in output.stdout.lines().filter(|line| !line.trim().is_empty()) {
            let job = parse_scontrol_show_job(line).map_err(|problem| output.unexpected(problem))?;
            if job.id == id {
                return Ok(Some(job));
            }
        }
        Ok(None)
    }

    fn find_by_name(&self, name: &str) -> Result<Vec<JobInfo>, SlurmError> {
        // --name takes a comma-separated list, so a name with a comma cannot be asked for
        // directly; list everything and filter instead.
        let selection: Vec<OsString> =
            if name.contains(',') || name.is_empty() { Vec::new() } else { vec![format!("--name={name}").into()] };
        let mut found = self.squeue(&selection)?;
        found.retain(|job| job.name == name);
        Ok(found)
    }

    fn find_by_comment(&self, comment: &str) -> Result<Vec<JobInfo>, SlurmError> {
        let args: Vec<OsString> =
            vec!["-h".into(), "--states=all".into(), format!("--format={SQUEUE_COMMENT_FORMAT}").into()];
        let output = self.run("squeue", &args, &[])?;
        if !output.status.success() {
            return Err(output.failure());
        }
        let ids = parse_comment_lines(&output.stdout, comment).map_err(|problem| output.unexpected(problem))?;
        self.jobs(&ids)
    }

    fn cancel(&self, id: JobId, signal: Option<&str>, batch_only: bool) -> Result<(), SlurmError> {
        let mut args: Vec<OsString> = Vec::new();
        if let Some(signal) = signal {
            if signal.is_empty() || !signal.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Err(SlurmError::InvalidRequest(format!("bad signal name {signal:?}")));
            }
            args.push(format!("--signal={signal}").into());
        }
        if batch_only {
            args.push("--batch".into());
        }
        args.push(id.to_string().into());
        let output = self.run("scancel", &args, &[])?;
        if !output.status.success() {
            return Err(output.failure());
        }
        Ok(())
    }

    fn move_to_reservation(&self, id: JobId, reservation: &str) -> Result<(), SlurmError> {
        check_reservation_name(reservation)?;
        let args: Vec<OsString> =
            vec!["update".into(), format!("jobid={id}").into(), format!("reservation={reservation}").into()];
        let output = self.run("scontrol", &args, &[])?;
        if !output.status.success() {
            return Err(output.failure());
        }
        Ok(())
    }
}

/// The `ReservationName`s of `scontrol -o show reservation` (one reservation a line).
pub(crate) fn parse_reservation_names(stdout: &str) -> Vec<String> {
    stdout.lines().filter_map(|line| split_scontrol_fields(line).remove("ReservationName")).collect()
}

/// `MaxTime` of `scontrol -o show partition P`, as written; `None` when it says none.
pub(crate) fn parse_partition_max_time(stdout: &str) -> Option<String> {
    split_scontrol_fields(stdout.lines().next()?).remove("MaxTime")
}

/// A reservation name `scontrol update` can take as one `reservation=R` field: a name with a space
/// or `=` would smuggle a second field in.
pub(crate) fn check_reservation_name(name: &str) -> Result<(), SlurmError> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(SlurmError::InvalidRequest(format!(
            "bad reservation name {name:?}: use letters, digits, `-`, `_`, `.`"
        )));
    }
    Ok(())
}

/// Builds sbatch's argument vector (everything after `sbatch`) for `request`.
pub(crate) fn build_sbatch_args(request: &SubmitRequest) -> Result<Vec<OsString>, SlurmError> {
    let options = &request.options;
    let mut args: Vec<OsString> = vec!["--parsable".into()];
    let mut push = |flag: &str, value: &dyn AsRef<OsStr>| {
        let mut arg = OsString::from(format!("--{flag}="));
        arg.push(value.as_ref());
        args.push(arg);
    };
    let text_options = [
        ("job-name", &options.job_name),
        ("partition", &options.partition),
        ("account", &options.account),
        ("qos", &options.qos),
        ("reservation", &options.reservation),
        ("dependency", &options.dependency),
        ("begin", &options.begin),
        ("exclude", &options.exclude),
        ("comment", &options.comment),
    ];
    for (flag, value) in text_options {
        if let Some(value) = value {
            reject_unprintable(flag, value)?;
            push(flag, value);
        }
    }
    if let Some(limit) = options.time_limit {
        push("time", &format_time_limit(limit));
    }
    if let Some(nodes) = options.nodes {
        push("nodes", &nodes.to_string());
    }
    if let Some(tasks) = options.ntasks_per_node {
        push("ntasks-per-node", &tasks.to_string());
    }
    if let Some(gpus) = options.gpus_per_node {
        let gres = match &options.gpu_type {
            Some(gpu_type) => {
                reject_unprintable("gpu type", gpu_type)?;
                format!("gpu:{gpu_type}:{gpus}")
            }
            None => format!("gpu:{gpus}"),
        };
        push("gres", &gres);
    } else if options.gpu_type.is_some() {
        return Err(SlurmError::InvalidRequest("gpu_type given without gpus_per_node".into()));
    }
    if let Some(cpus) = options.cpus_per_task {
        push("cpus-per-task", &cpus.to_string());
    }
    if let Some(mem_mb) = options.mem_mb {
        push("mem", &format!("{mem_mb}M"));
    }
    if let Some(signal) = &options.signal {
        push("signal", &signal.to_string());
    }
    let path_options = [("output", &options.output), ("error", &options.error), ("chdir", &options.chdir)];
    for (flag, value) in path_options {
        if let Some(path) = value {
            push(flag, path);
        }
    }
    push("export", &export_list(&request.export)?);
    args.extend(options.extra_args.iter().map(OsString::from));
    if request.script.as_os_str().is_empty() {
        return Err(SlurmError::InvalidRequest("no script path".into()));
    }
    args.push(request.script.clone().into_os_string());
    args.extend(request.script_args.iter().map(OsString::from));
    Ok(args)
}

/// `--export` value: the variable names, comma-separated, or `NONE`.
fn export_list(export: &[(String, String)]) -> Result<String, SlurmError> {
    if export.is_empty() {
        return Ok("NONE".into());
    }
    let mut names: Vec<&str> = Vec::with_capacity(export.len());
    for (name, _) in export {
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(SlurmError::InvalidRequest(format!(
                "exported variable name {name:?} is not a shell identifier"
            )));
        }
        if names.contains(&name.as_str()) {
            return Err(SlurmError::InvalidRequest(format!("variable {name} exported twice")));
        }
        names.push(name);
    }
    Ok(names.join(","))
}

fn reject_unprintable(what: &str, value: &str) -> Result<(), SlurmError> {
    if value.is_empty() || value.chars().any(char::is_control) {
        return Err(SlurmError::InvalidRequest(format!("{what} {value:?} is empty or has control characters")));
    }
    Ok(())
}

/// Formats a time limit as Slurm's `D-HH:MM:SS`, rounding up to whole minutes because that
/// is what Slurm does anyway and the request should say what it gets.
pub(crate) fn format_time_limit(limit: Duration) -> String {
    let minutes = limit.as_secs().div_ceil(60).max(1);
    let (days, hours, minutes) = (minutes / 1440, (minutes / 60) % 24, minutes % 60);
    format!("{days}-{hours:02}:{minutes:02}:00")
}

/// Parses `sbatch --parsable` output: `123` or `123;cluster`.
pub(crate) fn parse_parsable_submit(stdout: &str) -> Result<JobId, ParseError> {
    let line = stdout
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .ok_or_else(|| ParseError("sbatch printed no job id".into()))?;
    let id = line.split_once(';').map_or(line, |(id, _cluster)| id);
    id.parse()
}

/// The job to adopt among those carrying an attempt's submission tag: an active one, else the newest.
pub(crate) fn best_match(jobs: &[JobInfo]) -> Option<JobId> {
    jobs.iter().find(|j| j.state.is_active()).or_else(|| jobs.iter().max_by_key(|j| j.id)).map(|j| j.id)
}

/// The ids in `squeue -h --format=`[`SQUEUE_COMMENT_FORMAT`] output whose comment is `comment`.
pub(crate) fn parse_comment_lines(stdout: &str, comment: &str) -> Result<Vec<JobId>, ParseError> {
    let mut ids = Vec::new();
    for line in stdout.lines().filter(|line| !line.trim().is_empty()) {
        let (id, text) =
            line.split_once('|').ok_or_else(|| ParseError(format!("squeue line without `|`: {line:?}")))?;
        if text == comment {
            ids.push(id.parse()?);
        }
    }
    Ok(ids)
}

/// Parses `squeue -h --format=`[`SQUEUE_FORMAT`] output, one job per line.
pub(crate) fn parse_squeue_output(stdout: &str) -> Result<Vec<JobInfo>, ParseError> {
    stdout.lines().filter(|line| !line.trim().is_empty()).map(parse_squeue_line).collect()
}

fn parse_squeue_line(line: &str) -> Result<JobInfo, ParseError> {
    let fields: Vec<&str> = line.splitn(SQUEUE_FIELD_COUNT, '|').collect();
    let [id, state, reason, submit, start, end, nodes, partition, name] = fields[..] else {
        return Err(ParseError(format!(
            "squeue line has {} fields, want {SQUEUE_FIELD_COUNT}: {line:?}",
            fields.len()
        )));
    };
    Ok(JobInfo {
        id: id.parse()?,
        name: name.to_string(),
        state: JobState::parse(state),
        reason: present(reason),
        submit_time: present(submit),
        start_time: present(start),
        end_time: present(end),
        node_list: present(nodes),
        partition: present(partition),
        exit: None,
        std_out: None,
        details: BTreeMap::new(),
    })
}

/// Parses one line of `scontrol -o show job`.
pub(crate) fn parse_scontrol_show_job(line: &str) -> Result<JobInfo, ParseError> {
    let details = split_scontrol_fields(line);
    let field = |key: &str| details.get(key).map(String::as_str);
    let id = field("JobId").ok_or_else(|| ParseError(format!("no JobId in scontrol output: {line:?}")))?;
    let state = field("JobState").ok_or_else(|| ParseError(format!("no JobState in scontrol output: {line:?}")))?;
    let exit = match field("ExitCode").and_then(present) {
        Some(text) => Some(text.parse()?),
        None => None,
    };
    Ok(JobInfo {
        id: id.parse()?,
        name: field("JobName").unwrap_or_default().to_string(),
        state: JobState::parse(state),
        reason: field("Reason").and_then(present),
        submit_time: field("SubmitTime").and_then(present),
        start_time: field("StartTime").and_then(present),
        end_time: field("EndTime").and_then(present),
        node_list: field("NodeList").and_then(present),
        partition: field("Partition").and_then(present),
        exit,
        std_out: field("StdOut").and_then(present).map(PathBuf::from),
        details: details.clone(),
    })
}

/// Splits `scontrol -o` output into key/value pairs. Values may contain spaces
/// (`JobName=my job`, `Command=/x.sh arg`), so a word only starts a new pair when it looks
/// like `Key=` with a capitalised key not seen before; other words continue the previous
/// value, so a script argument shaped like `JobState=X` stays part of `Command`.
pub(crate) fn split_scontrol_fields(line: &str) -> BTreeMap<String, String> {
    let mut fields: BTreeMap<String, String> = BTreeMap::new();
    let mut current_key: Option<String> = None;
    for word in line.split(' ').filter(|word| !word.is_empty()) {
        match word.split_once('=') {
            Some((key, value)) if looks_like_scontrol_key(key) && !fields.contains_key(key) => {
                fields.insert(key.to_string(), value.to_string());
                current_key = Some(key.to_string());
            }
            _ => {
                if let Some(value) = current_key.as_ref().and_then(|key| fields.get_mut(key)) {
                    value.push(' ');
                    value.push_str(word);
                }
            }
        }
    }
    fields
}

fn looks_like_scontrol_key(key: &str) -> bool {
    key.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '/'))
}

/// Slurm's spellings of "no value" become `None`.
fn present(value: &str) -> Option<String> {
    let value = value.trim();
    match value {
        "" | "N/A" | "n/a" | "NONE" | "None" | "(null)" | "Unknown" => None,
        _ => Some(value.to_string()),
    }
}

fn is_invalid_job_id(stderr: &str) -> bool {
    stderr.contains("Invalid job id specified")
}

/// A shell-like rendering of a command for messages only; it is never executed.
fn render_command(program: &OsStr, args: &[OsString]) -> String {
    std::iter::once(program)
        .chain(args.iter().map(OsString::as_os_str))
        .map(|word| {
            let word = word.to_string_lossy();
            let plain = !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric() || "-_=/.,:@%+".contains(c));
            if plain { word.into_owned() } else { format!("'{}'", word.replace('\'', r"'\''")) }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Collapses multi-line stderr into one line.
fn one_line(text: &str) -> String {
    let joined = text.lines().map(str::trim).filter(|line| !line.is_empty()).collect::<Vec<_>>().join("; ");
    if joined.is_empty() { "(no stderr)".to_string() } else { joined }
}

struct CommandOutput {
    command_line: String,
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl CommandOutput {
    fn failure(&self) -> SlurmError {
        SlurmError::Failed {
            command: self.command_line.clone(),
            status: self.status.to_string(),
            stderr: one_line(&self.stderr),
        }
    }

    fn unexpected(&self, problem: ParseError) -> SlurmError {
        SlurmError::UnexpectedOutput { command: self.command_line.clone(), problem }
    }
}

/// Spawns `command`, retrying briefly on ETXTBSY: a program written just before (a fake
/// command in tests, a freshly installed binary) can be busy while another thread forks.
fn spawn_retrying_busy(command: &mut Command) -> std::io::Result<Child> {
    const ETXTBSY: i32 = 26;
    let mut attempts_left = 10;
    loop {
        match command.spawn() {
            Err(error) if error.raw_os_error() == Some(ETXTBSY) && attempts_left > 0 => {
                attempts_left -= 1;
                thread::sleep(Duration::from_millis(20));
            }
            result => return result,
        }
    }
}

enum WaitFailure {
    TimedOut,
    Io(std::io::Error),
}

/// Waits for `child`, reading its output on helper threads so a full pipe cannot stall it,
/// and kills it after `timeout`.
fn wait_with_timeout(mut child: Child, timeout: Duration) -> Result<(ExitStatus, String, String), WaitFailure> {
    fn drain(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<Vec<u8>> {
        thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                // A read error just truncates what we report; the exit status still counts.
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let stdout_reader = drain(child.stdout.take());
    let stderr_reader = drain(child.stderr.take());
    let status = match child.wait_timeout(timeout) {
        Ok(Some(status)) => status,
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(WaitFailure::TimedOut);
        }
        Err(error) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(WaitFailure::Io(error));
        }
    };
    let text =
        |reader: thread::JoinHandle<Vec<u8>>| String::from_utf8_lossy(&reader.join().unwrap_or_default()).into_owned();
    Ok((status, text(stdout_reader), text(stderr_reader)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::time::Instant;

    fn read_lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
    }

    // ---- Outputs recorded from Slurm 22.05.8 (Debian 12) on the CI single-node cluster.

    const SQUEUE_RECORDED: &str = "\
8|CANCELLED|Priority|2026-11-30T05:44:41|2026-11-30T05:44:44|2026-11-30T05:44:44||debug|probe-cancel
1|COMPLETED|None|2026-11-30T05:44:07|2026-11-30T05:44:07|2026-11-30T05:44:09|vm|debug|wrap
5|PENDING|BeginTime|2026-11-30T05:44:41|2026-11-30T06:44:41|NONE||debug|probe-pending
6|PENDING|Dependency|2026-11-30T05:44:41|N/A|N/A||debug|probe-dep
7|PENDING|Resources|2026-11-30T05:44:41|2026-11-30T05:45:42|NONE||debug|probe-fail
3|RUNNING|None|2026-11-30T05:44:41|2026-11-30T05:44:42|2026-11-30T05:45:42|vm|debug|probe-timeout
4|RUNNING|None|2026-11-30T05:44:41|2026-11-30T05:44:42|2027-11-30T05:44:42|vm|debug|probe running
";

    const SQUEUE_RECORDED_LATER: &str = "\
3|TIMEOUT|TimeLimit|2026-11-30T05:44:41|2026-11-30T05:44:42|2026-11-30T05:45:50|vm|debug|probe-timeout
4|FAILED|JobLaunchFailure|2026-11-30T05:44:41|2026-11-30T05:44:42|2026-11-30T05:44:57|vm|debug|probe running
7|FAILED|NonZeroExitCode|2026-11-30T05:44:41|2026-11-30T05:44:58|2026-11-30T05:44:59|vm|debug|probe-fail
10|FAILED|BadConstraints|2026-11-30T05:44:57|2026-11-30T05:44:57|2026-11-30T05:44:57||debug|job.sh
6|PENDING|DependencyNeverSatisfied|2026-11-30T05:44:41|N/A|N/A||debug|probe-dep
20|CANCELLED|None|2026-11-30T05:46:43|2026-11-30T05:46:44|2026-11-30T05:46:46|vm|debug|probe-cancel-running
";

    const SCONTROL_PENDING: &str = "JobId=5 JobName=probe-pending UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901755 Nice=0 Account=(null) QOS=(null) JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-30T05:44:41 EligibleTime=2026-11-30T06:44:41 AccrueTime=2026-11-30T06:44:41 StartTime=2026-11-30T06:44:41 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-30T05:44:41 Scheduler=Main Partition=debug AllocNode:Sid=localhost:5606 ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=256M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryCPU=256M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/probe/job.sh 1 WorkDir=/tmp/probe StdErr=/tmp/probe/5.out StdIn=/dev/null StdOut=/tmp/probe/5.out Power= ";

    const SCONTROL_PENDING_DEPENDENCY: &str = "JobId=6 JobName=probe-dep UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901754 Nice=0 Account=(null) QOS=(null) JobState=PENDING Reason=Dependency Dependency=afterok:4(unfulfilled) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-30T05:44:41 EligibleTime=Unknown AccrueTime=Unknown StartTime=Unknown EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-30T05:44:41 Scheduler=Main Partition=debug AllocNode:Sid=localhost:5606 ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=256M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryCPU=256M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/probe/job.sh 1 WorkDir=/tmp/probe StdErr=/tmp/probe/6.out StdIn=/dev/null StdOut=/tmp/probe/6.out Power= ";

    const SCONTROL_RUNNING: &str = "JobId=4 JobName=probe running UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901756 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:05 TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-11-30T05:44:41 EligibleTime=2026-11-30T05:44:41 AccrueTime=2026-11-30T05:44:41 StartTime=2026-11-30T05:44:42 EndTime=2027-11-30T05:44:42 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-30T05:44:42 Scheduler=Backfill Partition=debug AllocNode:Sid=localhost:5606 ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=256M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryCPU=256M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/probe/job.sh 300 WorkDir=/tmp/probe StdErr=/tmp/probe/4.out StdIn=/dev/null StdOut=/tmp/probe/4.out Power= ";

    const SCONTROL_COMPLETED: &str = "JobId=9 JobName=probe-ok UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901751 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-11-30T05:44:41 EligibleTime=2026-11-30T05:44:41 AccrueTime=2026-11-30T05:44:41 StartTime=2026-11-30T05:45:00 EndTime=2026-11-30T05:45:01 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-30T05:45:00 Scheduler=Backfill Partition=debug AllocNode:Sid=localhost:5606 ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=256M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryCPU=256M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/probe/job.sh 1 0 WorkDir=/tmp/probe StdErr=/tmp/probe/9.out StdIn=/dev/null StdOut=/tmp/probe/9.out Power= ";

    const SCONTROL_FAILED: &str = "JobId=7 JobName=probe-fail UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901753 Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0 RunTime=00:00:01 TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-11-30T05:44:41 EligibleTime=2026-11-30T05:44:41 AccrueTime=2026-11-30T05:44:41 StartTime=2026-11-30T05:44:58 EndTime=2026-11-30T05:44:59 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-30T05:44:58 Scheduler=Backfill Partition=debug AllocNode:Sid=localhost:5606 ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=256M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryCPU=256M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/probe/job.sh 1 3 WorkDir=/tmp/probe StdErr=/tmp/probe/7.out StdIn=/dev/null StdOut=/tmp/probe/7.out Power= ";

    /// Cancelled while pending, with a GPU request (`TresPerNode=` after the empty `Power=`).
    const SCONTROL_CANCELLED_PENDING: &str = "JobId=8 JobName=probe-cancel UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901752 Nice=0 Account=(null) QOS=(null) JobState=CANCELLED Reason=Priority Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-30T05:44:41 EligibleTime=2026-11-30T05:44:41 AccrueTime=2026-11-30T05:44:41 StartTime=2026-11-30T05:44:44 EndTime=2026-11-30T05:44:44 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-30T05:44:44 Scheduler=Main Partition=debug AllocNode:Sid=localhost:5606 ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 NumCPUs=1 NumTasks=N/A CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=100M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=100M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/probe/job.sh 300 WorkDir=/tmp/probe StdErr=/tmp/probe/8.out StdIn=/dev/null StdOut=/tmp/probe/8.out Power= TresPerNode=gres:gpu:1 ";

    const SCONTROL_CANCELLED_RUNNING: &str = "JobId=20 JobName=probe-cancel-running UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901741 Nice=0 Account=(null) QOS=(null) JobState=CANCELLED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15 RunTime=00:00:02 TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-11-30T05:46:43 EligibleTime=2026-11-30T05:46:43 AccrueTime=2026-11-30T05:46:43 StartTime=2026-11-30T05:46:44 EndTime=2026-11-30T05:46:46 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-30T05:46:44 Scheduler=Backfill Partition=debug AllocNode:Sid=localhost:5606 ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=256M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryCPU=256M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/probe/job.sh 300 WorkDir=/tmp/probe StdErr=/tmp/probe/20.out StdIn=/dev/null StdOut=/tmp/probe/20.out Power= ";

    const SCONTROL_TIMEOUT: &str = "JobId=3 JobName=probe-timeout UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901757 Nice=0 Account=(null) QOS=(null) JobState=TIMEOUT Reason=TimeLimit Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:15 RunTime=00:01:08 TimeLimit=00:01:00 TimeMin=N/A SubmitTime=2026-11-30T05:44:41 EligibleTime=2026-11-30T05:44:41 AccrueTime=2026-11-30T05:44:41 StartTime=2026-11-30T05:44:42 EndTime=2026-11-30T05:45:50 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-30T05:44:42 Scheduler=Backfill Partition=debug AllocNode:Sid=localhost:5606 ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=256M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryCPU=256M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/probe/job.sh 200 WorkDir=/tmp/probe StdErr=/tmp/probe/3.out StdIn=/dev/null StdOut=/tmp/probe/3.out Power= ";

    /// `scancel --signal=USR1 --batch` on a script without a USR1 handler.
    const SCONTROL_KILLED_BY_SIGNAL: &str = "JobId=4 JobName=probe running UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901756 Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=JobLaunchFailure Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:10 RunTime=00:00:15 TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-11-30T05:44:41 EligibleTime=2026-11-30T05:44:41 AccrueTime=2026-11-30T05:44:41 StartTime=2026-11-30T05:44:42 EndTime=2026-11-30T05:44:57 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-30T05:44:42 Scheduler=Backfill Partition=debug AllocNode:Sid=localhost:5606 ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=256M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryCPU=256M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/tmp/probe/job.sh 300 WorkDir=/tmp/probe StdErr=/tmp/probe/4.out StdIn=/dev/null StdOut=/tmp/probe/4.out Power= ";

    const SBATCH_BAD_PARTITION: &str = "sbatch: error: invalid partition specified: nosuch\nsbatch: error: Batch job submission failed: Invalid partition name specified\n";
    const SBATCH_TOO_MANY_GPUS: &str =
        "sbatch: error: Batch job submission failed: Requested node configuration is not available\n";
    const SCONTROL_INVALID_ID: &str = "slurm_load_jobs error: Invalid job id specified\n";

    fn job_in(jobs: &[JobInfo], id: u64) -> &JobInfo {
        jobs.iter().find(|job| job.id == JobId(id)).expect("job listed")
    }

    #[test]
    fn parsable_submit_accepts_bare_id_and_cluster_suffix() {
        assert_eq!(parse_parsable_submit("123\n"), Ok(JobId(123)));
        assert_eq!(parse_parsable_submit("123;localci\n"), Ok(JobId(123)));
        assert_eq!(parse_parsable_submit("\n  42  \n"), Ok(JobId(42)));
    }

    #[test]
    fn parsable_submit_rejects_garbage() {
        assert!(parse_parsable_submit("").is_err());
        assert!(parse_parsable_submit("Submitted batch job 5\n").is_err());
        assert!(parse_parsable_submit(";cluster").is_err());
    }

    #[test]
    fn squeue_pending_running_and_cancelled() {
        let jobs = parse_squeue_output(SQUEUE_RECORDED).unwrap();
        assert_eq!(jobs.len(), 7);

        let begin = job_in(&jobs, 5);
        assert_eq!(begin.state, JobState::Pending);
        assert_eq!(begin.reason.as_deref(), Some("BeginTime"));
        assert_eq!(begin.start_time.as_deref(), Some("2026-11-30T06:44:41"));
        assert_eq!(begin.end_time, None);
        assert_eq!(begin.node_list, None);

        let dependent = job_in(&jobs, 6);
        assert_eq!(dependent.start_time, None);
        assert_eq!(dependent.reason.as_deref(), Some("Dependency"));

        let running = job_in(&jobs, 4);
        assert_eq!(running.name, "probe running");
        assert_eq!(running.state, JobState::Running);
        assert_eq!(running.reason, None);
        assert_eq!(running.node_list.as_deref(), Some("vm"));
        assert_eq!(running.partition.as_deref(), Some("debug"));
        assert_eq!(running.submit_time.as_deref(), Some("2026-11-30T05:44:41"));
        assert!(running.state.is_active());

        let cancelled = job_in(&jobs, 8);
        assert_eq!(cancelled.state, JobState::Cancelled);
        assert!(cancelled.state.is_terminal());
        assert_eq!(cancelled.exit, None);
    }

    #[test]
    fn squeue_terminal_states() {
        let jobs = parse_squeue_output(SQUEUE_RECORDED_LATER).unwrap();
        assert_eq!(job_in(&jobs, 3).state, JobState::Timeout);
        assert_eq!(job_in(&jobs, 3).reason.as_deref(), Some("TimeLimit"));
        assert_eq!(job_in(&jobs, 7).reason.as_deref(), Some("NonZeroExitCode"));
        // A submission rejected by sbatch still leaves a FAILED record behind.
        assert_eq!(job_in(&jobs, 10).state, JobState::Failed);
        assert_eq!(job_in(&jobs, 10).reason.as_deref(), Some("BadConstraints"));
        assert_eq!(job_in(&jobs, 6).reason.as_deref(), Some("DependencyNeverSatisfied"));
        assert!(jobs.iter().filter(|job| job.id != JobId(6)).all(|job| job.state.is_terminal()));
    }

    #[test]
    fn squeue_name_may_contain_the_delimiter() {
        let jobs = parse_squeue_output("12|RUNNING|None|a|b|c|vm|debug|eval|x|y\n").unwrap();
        assert_eq!(jobs[0].name, "eval|x|y");
    }

    #[test]
    fn squeue_bad_lines_are_errors() {
        assert!(parse_squeue_output("12|RUNNING|None\n").is_err());
        assert!(parse_squeue_output("12_[1-3]|PENDING|None|a|b|c||debug|arr\n").is_err());
        assert_eq!(parse_squeue_output("\n").unwrap(), Vec::new());
    }

    #[test]
    fn scontrol_pending_job() {
        let job = parse_scontrol_show_job(SCONTROL_PENDING).unwrap();
        assert_eq!(job.id, JobId(5));
        assert_eq!(job.name, "probe-pending");
        assert_eq!(job.state, JobState::Pending);
        assert_eq!(job.reason.as_deref(), Some("BeginTime"));
        assert_eq!(job.start_time.as_deref(), Some("2026-11-30T06:44:41"));
        assert_eq!(job.end_time, None);
        assert_eq!(job.node_list, None);
        assert_eq!(job.exit, Some(JobExit { code: 0, signal: 0 }));
        assert_eq!(job.std_out, Some(PathBuf::from("/tmp/probe/5.out")));
        assert_eq!(job.details.get("TimeLimit").map(String::as_str), Some("UNLIMITED"));

        let dependent = parse_scontrol_show_job(SCONTROL_PENDING_DEPENDENCY).unwrap();
        assert_eq!(dependent.start_time, None);
        assert_eq!(dependent.details.get("Dependency").map(String::as_str), Some("afterok:4(unfulfilled)"));
    }

    #[test]
    fn scontrol_running_job_keeps_spaces_in_values() {
        let job = parse_scontrol_show_job(SCONTROL_RUNNING).unwrap();
        assert_eq!(job.name, "probe running");
        assert_eq!(job.state, JobState::Running);
        assert_eq!(job.reason, None);
        assert_eq!(job.node_list.as_deref(), Some("vm"));
        assert_eq!(job.details.get("Command").map(String::as_str), Some("/tmp/probe/job.sh 300"));
        assert_eq!(job.details.get("AllocNode:Sid").map(String::as_str), Some("localhost:5606"));
        assert_eq!(job.details.get("TRES").map(String::as_str), Some("cpu=1,mem=256M,node=1,billing=1"));
        assert_eq!(job.details.get("Power").map(String::as_str), Some(""));
    }

    #[test]
    fn scontrol_finished_jobs() {
        let completed = parse_scontrol_show_job(SCONTROL_COMPLETED).unwrap();
        assert_eq!(completed.state, JobState::Completed);
        assert_eq!(completed.exit, Some(JobExit { code: 0, signal: 0 }));
        assert_eq!(completed.end_time.as_deref(), Some("2026-11-30T05:45:01"));

        let failed = parse_scontrol_show_job(SCONTROL_FAILED).unwrap();
        assert_eq!(failed.state, JobState::Failed);
        assert_eq!(failed.exit, Some(JobExit { code: 3, signal: 0 }));

        let timed_out = parse_scontrol_show_job(SCONTROL_TIMEOUT).unwrap();
        assert_eq!(timed_out.state, JobState::Timeout);
        assert_eq!(timed_out.reason.as_deref(), Some("TimeLimit"));
        assert_eq!(timed_out.exit, Some(JobExit { code: 0, signal: 15 }));

        let cancelled = parse_scontrol_show_job(SCONTROL_CANCELLED_RUNNING).unwrap();
        assert_eq!(cancelled.state, JobState::Cancelled);
        assert_eq!(cancelled.exit, Some(JobExit { code: 0, signal: 15 }));

        let cancelled_pending = parse_scontrol_show_job(SCONTROL_CANCELLED_PENDING).unwrap();
        assert_eq!(cancelled_pending.state, JobState::Cancelled);
        assert_eq!(cancelled_pending.node_list, None);
        assert_eq!(cancelled_pending.details.get("TresPerNode").map(String::as_str), Some("gres:gpu:1"));

        let signalled = parse_scontrol_show_job(SCONTROL_KILLED_BY_SIGNAL).unwrap();
        assert_eq!(signalled.state, JobState::Failed);
        assert_eq!(signalled.reason.as_deref(), Some("JobLaunchFailure"));
        assert_eq!(signalled.exit, Some(JobExit { code: 0, signal: 10 }));
    }

    #[test]
    fn scontrol_first_key_wins_over_lookalike_arguments() {
        let line = "JobId=7 JobName=x JobState=RUNNING Reason=None Command=/x.sh JobState=COMPLETED a=b";
        let job = parse_scontrol_show_job(line).unwrap();
        assert_eq!(job.state, JobState::Running);
        assert_eq!(job.details.get("Command").map(String::as_str), Some("/x.sh JobState=COMPLETED a=b"));
    }

    #[test]
    fn scontrol_garbage_is_an_error_not_a_panic() {
        assert!(parse_scontrol_show_job("").is_err());
        assert!(parse_scontrol_show_job(SCONTROL_INVALID_ID).is_err());
        assert!(parse_scontrol_show_job("JobId=abc JobState=RUNNING").is_err());
        assert!(parse_scontrol_show_job("JobId=1 JobState=RUNNING ExitCode=x").is_err());
    }

    #[test]
    fn job_states_round_trip_and_classify() {
        for (name, state) in JobState::NAMES {
            assert_eq!(&JobState::parse(name), state);
            assert_eq!(state.as_str(), *name);
            assert!(!(state.is_active() && state.is_terminal()), "{name} cannot be both active and terminal");
            assert!(state.is_active() || state.is_terminal(), "{name} must be classified");
        }
        assert_eq!(JobState::parse("CANCELLED by 0"), JobState::Cancelled);
        assert_eq!(JobState::parse("running"), JobState::Running);
        let odd = JobState::parse("LAUNCH_FAILED");
        assert_eq!(odd, JobState::Other("LAUNCH_FAILED".into()));
        assert!(!odd.is_active() && !odd.is_terminal());
        assert_eq!(odd.to_string(), "LAUNCH_FAILED");
    }

    #[test]
    fn signal_spec_round_trips() {
        let spec: SignalSpec = "B:USR1@600".parse().unwrap();
        assert_eq!(spec, SignalSpec { signal: "USR1".into(), seconds_before_limit: 600, batch_only: true });
        assert_eq!(spec.to_string(), "B:USR1@600");
        assert_eq!("10@30".parse::<SignalSpec>().unwrap().to_string(), "10@30");
        assert!("B:USR1".parse::<SignalSpec>().is_err());
        assert!("B:US R1@5".parse::<SignalSpec>().is_err());
        assert!("USR1@soon".parse::<SignalSpec>().is_err());
    }

    /// Slurm's start and end of a job it ended; a running job's `EndTime` (the expected end) and
    /// a pending job's `StartTime` (the expected start) are not when it ran.
    #[test]
    fn when_a_job_ran() {
        let completed = parse_scontrol_show_job(SCONTROL_COMPLETED).unwrap();
        let (start, end) = completed.ran();
        assert_eq!((end.unwrap() - start.unwrap()).num_seconds(), 1);
        let timeout = parse_scontrol_show_job(SCONTROL_TIMEOUT).unwrap();
        let (start, end) = timeout.ran();
        assert_eq!((end.unwrap() - start.unwrap()).num_seconds(), 68);
        let running = parse_scontrol_show_job(SCONTROL_RUNNING).unwrap();
        assert!(running.ran().0.is_some() && running.ran().1.is_none());
        let pending = parse_scontrol_show_job(SCONTROL_PENDING).unwrap();
        assert_eq!(pending.ran(), (None, None));
        assert_eq!(parse_time("Unknown"), None);
    }

    #[test]
    fn time_limits_round_up_to_minutes() {
        assert_eq!(format_time_limit(Duration::from_secs(1)), "0-00:01:00");
        assert_eq!(format_time_limit(Duration::from_secs(3600)), "0-01:00:00");
        assert_eq!(format_time_limit(Duration::from_secs(3601)), "0-01:01:00");
        assert_eq!(format_time_limit(Duration::from_secs(2 * 86400 + 5 * 3600)), "2-05:00:00");
    }

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter().map(|arg| arg.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn only_a_lost_answer_leaves_a_submission_unknown() {
        let failed =
            |stderr: &str| SlurmError::Failed { command: "sbatch".into(), status: "1".into(), stderr: stderr.into() };
        assert!(
            failed("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation")
                .submission_unknown()
        );
        assert!(
            SlurmError::TimedOut { command: "sbatch".into(), timeout: Duration::from_secs(60) }.submission_unknown()
        );
        assert!(
            SlurmError::UnexpectedOutput { command: "sbatch".into(), problem: ParseError("x".into()) }
                .submission_unknown()
        );
        assert!(!failed(SBATCH_BAD_PARTITION).submission_unknown(), "the controller answered: nothing queued");
        assert!(!SlurmError::InvalidRequest("x".into()).submission_unknown());
    }

    #[test]
    fn comment_lines_match_exactly_and_keep_bars_in_comments() {
        let out = "12|evalsub-a\n13|evalsub-ab\n14|x|evalsub-a\n15|evalsub-a\n16|\n";
        assert_eq!(parse_comment_lines(out, "evalsub-a").unwrap(), [JobId(12), JobId(15)]);
        assert!(parse_comment_lines("garbage\n", "evalsub-a").is_err());
    }

    #[test]
    fn sbatch_args_cover_every_option() {
        let request = SubmitRequest {
            script: "/runs/eval.sbatch".into(),
            script_args: vec!["--spec".into(), "/runs/spec one.yaml".into()],
            options: SbatchOptions {
                job_name: Some("eval:model a".into()),
                partition: Some("gpu".into()),
                account: Some("proj".into()),
                qos: Some("high".into()),
                reservation: Some("maint".into()),
                time_limit: Some(Duration::from_secs(4 * 3600)),
                nodes: Some(1),
                ntasks_per_node: Some(1),
                gpus_per_node: Some(8),
                gpu_type: Some("h100".into()),
                cpus_per_task: Some(32),
                mem_mb: Some(512_000),
                signal: Some("B:USR1@600".parse().unwrap()),
                output: Some("/runs/%j.out".into()),
                error: Some("/runs/%j.err".into()),
                chdir: Some("/runs".into()),
                dependency: Some("afterok:41".into()),
                begin: Some("now+60".into()),
                exclude: Some("lrdn0001,lrdn0002".into()),
                comment: Some("evalsub-0123".into()),
                extra_args: vec!["--exclusive".into()],
            },
            export: vec![("EVAL_RUN_ID".into(), "r1".into()), ("HF_HOME".into(), "/hf".into())],
        };
        assert_eq!(
            strings(&build_sbatch_args(&request).unwrap()),
            [
                "--parsable",
                "--job-name=eval:model a",
                "--partition=gpu",
                "--account=proj",
                "--qos=high",
                "--reservation=maint",
                "--dependency=afterok:41",
                "--begin=now+60",
                "--exclude=lrdn0001,lrdn0002",
                "--comment=evalsub-0123",
                "--time=0-04:00:00",
                "--nodes=1",
                "--ntasks-per-node=1",
                "--gres=gpu:h100:8",
                "--cpus-per-task=32",
                "--mem=512000M",
                "--signal=B:USR1@600",
                "--output=/runs/%j.out",
                "--error=/runs/%j.err",
                "--chdir=/runs",
                "--export=EVAL_RUN_ID,HF_HOME",
                "--exclusive",
                "/runs/eval.sbatch",
                "--spec",
                "/runs/spec one.yaml",
            ]
        );
    }

    #[test]
    fn sbatch_args_minimal_request_exports_nothing() {
        let request = SubmitRequest { script: "job.sh".into(), ..Default::default() };
        assert_eq!(strings(&build_sbatch_args(&request).unwrap()), ["--parsable", "--export=NONE", "job.sh"]);
    }

    #[test]
    fn sbatch_args_reject_bad_requests() {
        let with_export = |name: &str| SubmitRequest {
            script: "job.sh".into(),
            export: vec![(name.into(), "v".into())],
            ..Default::default()
        };
        for bad_name in ["", "1ABC", "A,B", "A=B", "A B"] {
            assert!(build_sbatch_args(&with_export(bad_name)).is_err(), "{bad_name:?} accepted");
        }
        let twice = SubmitRequest {
            script: "job.sh".into(),
            export: vec![("A".into(), "1".into()), ("A".into(), "2".into())],
            ..Default::default()
        };
        assert!(build_sbatch_args(&twice).is_err());
        assert!(build_sbatch_args(&SubmitRequest::default()).is_err());
        let newline_name = SubmitRequest {
            script: "job.sh".into(),
            options: SbatchOptions { job_name: Some("a\nb".into()), ..Default::default() },
            ..Default::default()
        };
        assert!(build_sbatch_args(&newline_name).is_err());
        let type_without_count = SubmitRequest {
            script: "job.sh".into(),
            options: SbatchOptions { gpu_type: Some("a100".into()), ..Default::default() },
            ..Default::default()
        };
        assert!(build_sbatch_args(&type_without_count).is_err());
    }

    #[test]
    fn failure_messages_are_one_line_with_command_and_status() {
        let error = SlurmError::Failed {
            command: render_command(OsStr::new("sbatch"), &["--partition=nosuch".into(), "my job.sh".into()]),
            status: "exit status: 1".into(),
            stderr: one_line(SBATCH_BAD_PARTITION),
        };
        let message = error.to_string();
        assert_eq!(
            message,
            "`sbatch --partition=nosuch 'my job.sh'` failed (exit status: 1): \
             sbatch: error: invalid partition specified: nosuch; \
             sbatch: error: Batch job submission failed: Invalid partition name specified"
        );
        assert!(!message.contains('\n'));
        assert_eq!(one_line(""), "(no stderr)");
        assert!(one_line(SBATCH_TOO_MANY_GPUS).contains("Requested node configuration is not available"));
        assert!(is_invalid_job_id(SCONTROL_INVALID_ID));
    }

    /// Writes an executable fake Slurm command into `dir`.
    fn fake_command(dir: &Path, name: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn cli_submit_passes_argv_and_only_named_variables() {
        let dir = tempfile::tempdir().unwrap();
        let argv_file = dir.path().join("argv");
        let env_file = dir.path().join("env");
        fake_command(
            dir.path(),
            "sbatch",
            &format!(
                "for a in \"$@\"; do echo \"$a\"; done > '{}'\nenv > '{}'\necho '77;localci'",
                argv_file.display(),
                env_file.display()
            ),
        );
        let cli = SlurmCli::new().with_bin_dir(dir.path());
        let request = SubmitRequest {
            script: "/x/job.sh".into(),
            script_args: vec!["a b".into(), "$HOME".into()],
            options: SbatchOptions { job_name: Some("n".into()), ..Default::default() },
            export: vec![("EVAL_TOKEN".into(), "s3cret value".into())],
        };
        assert_eq!(cli.submit(&request).unwrap(), JobId(77));
        assert_eq!(
            read_lines(&argv_file),
            ["--parsable", "--job-name=n", "--export=EVAL_TOKEN", "/x/job.sh", "a b", "$HOME"]
        );
        let env = read_lines(&env_file);
        assert!(env.contains(&"EVAL_TOKEN=s3cret value".to_string()));
        assert!(env.contains(&"SLURM_TIME_FORMAT=standard".to_string()));
        let allowed = ["EVAL_TOKEN", "SLURM_TIME_FORMAT", "PWD", "SHLVL", "_"];
        for line in env {
            let name = line.split('=').next().unwrap_or_default();
            assert!(
                allowed.contains(&name) || INHERITED_VARIABLES.contains(&name),
                "sbatch saw unexpected variable {name}"
            );
        }
    }

    #[test]
    fn cli_reports_sbatch_failure_in_one_line() {
        let dir = tempfile::tempdir().unwrap();
        fake_command(
            dir.path(),
            "sbatch",
            &format!("printf '{}' >&2\nexit 1", SBATCH_BAD_PARTITION.replace('\n', "\\n")),
        );
        let cli = SlurmCli::new().with_bin_dir(dir.path());
        let request = SubmitRequest { script: "job.sh".into(), ..Default::default() };
        let error = cli.submit(&request).unwrap_err();
        assert!(matches!(error, SlurmError::Failed { .. }), "{error:?}");
        let message = error.to_string();
        assert!(message.contains("sbatch --parsable --export=NONE job.sh"), "{message}");
        assert!(message.contains("exit status: 1"), "{message}");
        assert!(message.contains("Invalid partition name specified"), "{message}");
        assert!(!message.contains('\n'));
    }

    #[test]
    fn cli_show_unknown_job_is_none_and_jobs_of_forgotten_ids_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let script = "echo 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1";
        fake_command(dir.path(), "scontrol", script);
        fake_command(dir.path(), "squeue", script);
        let cli = SlurmCli::new().with_bin_dir(dir.path());
        assert_eq!(cli.show(JobId(99999)).unwrap(), None);
        assert_eq!(cli.jobs(&[JobId(99999)]).unwrap(), Vec::new());
        assert_eq!(cli.jobs(&[]).unwrap(), Vec::new());
    }

    #[test]
    fn cli_show_and_find_by_name_parse_recorded_output() {
        let dir = tempfile::tempdir().unwrap();
        let args_file = dir.path().join("args");
        fake_command(dir.path(), "scontrol", &format!("cat <<'EOF'\n{SCONTROL_FAILED}\nEOF"));
        fake_command(
            dir.path(),
            "squeue",
            &format!("echo \"$@\" > '{}'\ncat <<'EOF'\n{SQUEUE_RECORDED}EOF", args_file.display()),
        );
        let cli = SlurmCli::new().with_bin_dir(dir.path());
        let shown = cli.show(JobId(7)).unwrap().unwrap();
        assert_eq!(shown.exit, Some(JobExit { code: 3, signal: 0 }));
        assert_eq!(cli.show(JobId(8)).unwrap(), None, "a different job in the output is not ours");

        let found = cli.find_by_name("probe running").unwrap();
        assert_eq!(found.iter().map(|job| job.id).collect::<Vec<_>>(), [JobId(4)]);
        assert_eq!(
            std::fs::read_to_string(&args_file).unwrap().trim(),
            format!("-h --states=all --name=probe running --format={SQUEUE_FORMAT}")
        );
        let listed = cli.jobs(&[JobId(3), JobId(5), JobId(1000)]).unwrap();
        assert_eq!(listed.iter().map(|job| job.id).collect::<Vec<_>>(), [JobId(5), JobId(3)]);
    }

    #[test]
    fn cli_cancel_builds_signal_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let args_file = dir.path().join("args");
        fake_command(dir.path(), "scancel", &format!("echo \"$@\" >> '{}'", args_file.display()));
        let cli = SlurmCli::new().with_bin_dir(dir.path());
        cli.cancel(JobId(5), None, false).unwrap();
        cli.cancel(JobId(6), Some("USR1"), true).unwrap();
        assert!(cli.cancel(JobId(6), Some("USR1; rm"), true).is_err());
        assert_eq!(read_lines(&args_file), ["5", "--signal=USR1 --batch 6"]);
    }

    #[test]
    fn cli_missing_program_and_hung_program_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let cli = SlurmCli::new().with_bin_dir(dir.path());
        assert!(matches!(cli.show(JobId(1)), Err(SlurmError::Spawn { .. })));
        assert!(cli.ping().is_err());

        fake_command(dir.path(), "scontrol", "exec sleep 30");
        let impatient = cli.with_command_timeout(Duration::from_millis(200));
        let started = Instant::now();
        let error = impatient.show(JobId(1)).unwrap_err();
        assert!(matches!(error, SlurmError::TimedOut { .. }), "{error:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn cli_ping_reads_scontrol_answer() {
        let dir = tempfile::tempdir().unwrap();
        let cli = SlurmCli::new().with_bin_dir(dir.path());
        fake_command(dir.path(), "scontrol", "echo 'Slurmctld(primary) at vm is UP'");
        assert!(cli.ping().unwrap());
        fake_command(dir.path(), "scontrol", "echo 'Slurmctld(primary) at vm is DOWN'\nexit 1");
        assert!(!cli.ping().unwrap());
    }

    /// Issue 31: the live reservations and a partition's MaxTime, as `scontrol -o` prints them.
    #[test]
    fn reservations_and_partition_limits_parse() {
        let listed = "ReservationName=reformo StartTime=2026-12-07T00:00:00 EndTime=2027-12-07T00:00:00 Nodes=n1\nReservationName=other StartTime=x\n";
        assert_eq!(parse_reservation_names(listed), ["reformo", "other"]);
        assert!(parse_reservation_names("No reservations in the system\n").is_empty());
        let partition = "PartitionName=boost_usr_prod AllowGroups=ALL MaxNodes=UNLIMITED MaxTime=1-00:00:00 MinNodes=0";
        assert_eq!(parse_partition_max_time(partition).as_deref(), Some("1-00:00:00"));
        let unlimited = parse_partition_max_time("PartitionName=debug MaxTime=UNLIMITED State=UP");
        assert_eq!(unlimited.as_deref().and_then(crate::config::parse_slurm_time), None, "no limit");
        assert_eq!(parse_partition_max_time(""), None);
    }
}
