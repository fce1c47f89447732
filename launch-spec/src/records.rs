//! What payload leaves in the run dir (`status.json`, `events.jsonl`) and submitter reads back.
//! All plain files: Harbor deletes run-dir subdirectories without a `result.json` on resume.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub const STATUS_FILE: &str = "status.json";
pub const EVENTS_FILE: &str = "events.jsonl";
/// payload appends its heartbeat to `events.jsonl` as a `heartbeat` event at most this often
/// (status.json holds only the latest): a 48-hour job adds 2,880 lines of about 250 bytes.
pub const HEARTBEAT_EVENT_EVERY_S: u64 = 60;
pub const SPEC_FILE: &str = "launch.json";
/// The merged job config payload hands Harbor (`--config`), beside payload's records.
pub const MERGED_HARBOR_CONFIG_FILE: &str = "harbor-job-config.json";
/// The lock one `payload run` holds on its run dir (a second run of the same dir is refused).
pub const RUN_LOCK_FILE: &str = "payload.lock";
pub const ENGINE_LOG: &str = "vllm.log";
pub const HARBOR_LOG: &str = "harbor.log";
pub const TUNNEL_LOG: &str = "tunnel.log";
/// The post-run step's stdout and stderr.
pub const POST_RUN_LOG: &str = "post_run.log";
/// Space payload holds in the run dir while it runs and frees just before its final records, so
/// the outcome still reaches `status.json` on a filesystem that filled up meanwhile. Removed
/// before payload exits; one left by a SIGKILLed payload is replaced by the next run's.
pub const RESERVE_FILE: &str = ".payload-reserve";
/// Bytes of [`RESERVE_FILE`]: a final `status.json` with its 30-line log tail, the outcome event.
pub const RESERVE_BYTES: usize = 256 << 10;

/// Replaces `path` with `contents` atomically: a temp file in the same directory (so the rename
/// stays on one filesystem), then a rename, so a reader — submitter reading payload's records, payload
/// reading a spec — never sees half a file. Creates the parent directory when missing.
///
/// The temp file has an unpredictable name and is created exclusively (`O_EXCL`, the `tempfile`
/// crate), so a name planted in the directory (a symlink, a FIFO) is never written through. An
/// existing `path` that is a symlink is replaced (the link, never its target); one that is a device,
/// FIFO, socket or directory is refused (`InvalidInput`), so `--out /dev/full` cannot replace a node.
pub fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_file() && !meta.file_type().is_symlink() => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} exists and is not a regular file; refusing to replace it", path.display()),
            ));
        }
        _ => {}
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    // 0666 before the umask, like `std::fs::write` (the records stay readable as before).
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(dir)?;
    tmp.write_all(contents)?;
    tmp.persist(path).map(|_| ()).map_err(|e| e.error)
}

/// Largest input file [`read_regular`] callers usually allow (specs, secrets, configs).
pub const MAX_INPUT_BYTES: u64 = crate::fsread::RECORD_CAP;

/// Opens `path` for reading only if it is a regular file: opened non-blocking (a FIFO cannot hang
/// the open) and type-checked with `fstat` on the open descriptor (no race with a swap). Symlinks
/// are followed (a spec may be linked); the file they name must be regular. See [`crate::fsread`].
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    crate::fsread::open_regular(path, crate::fsread::Links::Follow)
}

/// Reads a regular file ([`open_regular`]) of at most `max` bytes as UTF-8.
pub fn read_regular(path: &Path, max: u64) -> std::io::Result<String> {
    crate::fsread::read_text_capped(path, max, crate::fsread::Links::Follow)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Preparing,
    Serving,
    Ready,
    Running,
    Stopping,
    Done,
}

impl Phase {
    /// The name `status.json` and the `phase` event carry (serde's), for text that shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Preparing => "preparing",
            Self::Serving => "serving",
            Self::Ready => "ready",
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Done => "done",
        }
    }
}

/// How a run ended. Each class has one exit code (see [`OutcomeClass::exit_code`] and docs/exit-codes.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeClass {
    Finished,
    Spec,
    Secrets,
    Gpu,
    EngineStart,
    EngineTimeout,
    EngineDied,
    /// Requests running and no token generated for `serve.hang_after_s` (the engine answers
    /// `/health` but does no work).
    EngineHung,
    Tunnel,
    Harbor,
    Walltime,
    Interrupted,
}

impl OutcomeClass {
    pub const ALL: [OutcomeClass; 12] = [
        Self::Finished,
        Self::Spec,
        Self::Secrets,
        Self::Gpu,
        Self::EngineStart,
        Self::EngineTimeout,
        Self::EngineDied,
        Self::EngineHung,
        Self::Tunnel,
        Self::Harbor,
        Self::Walltime,
        Self::Interrupted,
    ];

    /// payload's exit code for this class. `Interrupted` is 128 + the signal number instead.
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Finished => 0,
            Self::Spec => 2,
            Self::Secrets => 3,
            Self::Gpu => 4,
            Self::EngineStart => 10,
            Self::EngineTimeout => 11,
            Self::EngineDied => 12,
            Self::Tunnel => 13,
            Self::Harbor => 14,
            Self::Walltime => 15,
            Self::EngineHung => 16,
            Self::Interrupted => 130,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Finished => "finished",
            Self::Spec => "spec",
            Self::Secrets => "secrets",
            Self::Gpu => "gpu",
            Self::EngineStart => "engine_start",
            Self::EngineTimeout => "engine_timeout",
            Self::EngineDied => "engine_died",
            Self::EngineHung => "engine_hung",
            Self::Tunnel => "tunnel",
            Self::Harbor => "harbor",
            Self::Walltime => "walltime",
            Self::Interrupted => "interrupted",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub class: OutcomeClass,
    /// For `engine_start`: `oom`, `kv_cache`, `world_size`, `model_type`, `other`;
    /// for `tunnel`: e.g. `token_locked`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    pub exit_code: i32,
    pub message: String,
    /// Harbor's own exit code, when Harbor ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harbor_exit_code: Option<i32>,
    /// Signal that ended the run, for `interrupted`/`walltime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// Last lines of `vllm.log`, for engine failures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engine_log_tail: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// RFC 3339 UTC.
    pub at: String,
    pub completions_ok: u64,
    pub completions_4xx: u64,
    pub completions_5xx: u64,
    pub trials_started: u64,
    pub trials_finished: u64,
    pub trials_errored: u64,
    /// Last time a counter above moved (RFC 3339 UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_progress_at: Option<String>,
    /// Whether the last health probe succeeded (false while loading: not probed for health yet).
    /// Not a death verdict on its own: [`Heartbeat::engine_dead`] is.
    #[serde(default)]
    pub engine_healthy: bool,
    /// Consecutive failed `/health` probes while Harbor runs (0 before, and after a good one).
    #[serde(default)]
    pub failed_probes: u32,
    /// How many in a row end the run (`limits.health_failures`); 0 in an older payload's records.
    #[serde(default)]
    pub probe_limit: u32,
    /// vLLM's own counters from `/metrics` (absent until Harbor runs, or when `/metrics` does not
    /// answer with them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineCounters>,
}

/// vLLM's scheduler and token counters at one heartbeat (summed over its engines), and how long
/// requests have been running with no token (the liveness rule, docs/payload.md "Liveness").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineCounters {
    /// `vllm:num_requests_running`.
    pub requests_running: u64,
    /// `vllm:num_requests_waiting`.
    pub requests_waiting: u64,
    /// `vllm:generation_tokens_total`.
    pub generation_tokens: u64,
    /// `vllm:prompt_tokens_total`.
    pub prompt_tokens: u64,
    /// Generated tokens per second since the previous reading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_s: Option<f64>,
    /// `vllm:kv_cache_usage_perc` (0–1; the highest of its engines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_usage: Option<f64>,
    /// Seconds requests have been in flight with no token generated or prompt token processed;
    /// absent while tokens move or nothing is in flight (an idle engine is not hung).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_tokens_for_s: Option<f64>,
    /// The window after which that is `engine_hung` (`serve.hang_after_s`).
    pub hang_after_s: u64,
}

/// payload's death rule for the engine's `/health` probe, the one place both programs take it from:
/// `limit` (`limits.health_failures`, at least 1) failed probes in a row while Harbor runs. payload
/// ends the run by it on the node; `status` and `check` call a job dead by it on the login node, from
/// the heartbeat's counts (docs/payload.md "Health"), never from one unhealthy reading.
pub fn probes_say_dead(consecutive_failures: u32, limit: u32) -> bool {
    consecutive_failures > 0 && consecutive_failures >= limit.max(1)
}

impl Heartbeat {
    /// The engine is dead by payload's probe rule ([`probes_say_dead`]). A heartbeat of a payload
    /// that recorded no limit (older records) never says so: its outcome or the engine's exit does.
    pub fn engine_dead(&self) -> bool {
        self.probe_limit > 0 && probes_say_dead(self.failed_probes, self.probe_limit)
    }
}

impl EngineCounters {
    /// Requests are in flight and no token has moved for the whole window.
    pub fn hung(&self) -> bool {
        self.no_tokens_for_s.is_some_and(|s| s >= self.hang_after_s as f64)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuChoice {
    pub profile: String,
    pub gpu_name: Option<String>,
    pub gpu_count: u32,
    pub gpu_memory_utilization: f64,
    pub source: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStatus {
    pub version: u32,
    pub run_tag: String,
    pub phase: Phase,
    pub started_at: String,
    pub updated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pids: BTreeMap<String, u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<Heartbeat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// What the post-run step did (absent when the spec has none or it did not run). Never
    /// changes `outcome`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_run: Option<PostRunRecord>,
    /// What the job ran, as its own environment reported it at start (docs/payload.md,
    /// "Provenance"). Absent in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<RunProvenance>,
    /// The job's time on its GPUs by phase (`launch_spec::shared::GpuTime`): in a per-leg job's
    /// run dir and a shared job's group dir; absent in a leg of a shared job and in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_time: Option<GpuTime>,
    /// The readiness deadline and how it was set (docs/payload.md "Readiness budget"); absent in
    /// older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<ReadinessRecord>,
}

/// How long payload waits for readiness, and why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReadinessRecord {
    /// The deadline it started with: `serve.ready_budget.seconds`, at most `cap_s`.
    pub deadline_s: u64,
    /// `serve.health_timeout_s`.
    pub cap_s: u64,
    /// `serve.load_stall_after_s`: no load progress this long is `engine_start/stalled`.
    pub load_stall_after_s: u64,
    /// `serve.ready_budget` (absent: the spec has none, the cap is the deadline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<ReadyBudget>,
    /// The budget passed while loading still progressed: the deadline became the cap.
    #[serde(default)]
    pub budget_exceeded: bool,
}

/// The readiness budget: the checkpoint's size over the file system's bandwidth, plus compile and
/// graph-capture allowances, capped by `serve.health_timeout_s`. Written by submitter (it sees the
/// weights); payload records it and reports overruns, and the stall rule ends loading that makes
/// no progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadyBudget {
    /// `min(cap_s, load_s + compile_s + graph_capture_s)`.
    pub seconds: u64,
    /// The checkpoint's size on disk (HF cache snapshot or local path).
    pub weights_bytes: u64,
    pub load_bandwidth_mib_s: f64,
    /// `ceil(weights_bytes / MiB / load_bandwidth_mib_s)`.
    pub load_s: u64,
    pub compile_s: u64,
    pub graph_capture_s: u64,
    /// `serve.health_timeout_s` when it was computed.
    pub cap_s: u64,
    /// Where the size came from (a path), or why it is a guess.
    pub basis: String,
}

impl ReadyBudget {
    /// The budget from its inputs (pure; submitter supplies the size).
    pub fn compute(
        weights_bytes: u64,
        load_bandwidth_mib_s: f64,
        compile_s: u64,
        graph_capture_s: u64,
        cap_s: u64,
        basis: String,
    ) -> Self {
        let mib = weights_bytes as f64 / (1024.0 * 1024.0);
        let load_s = if load_bandwidth_mib_s > 0.0 { (mib / load_bandwidth_mib_s).ceil() as u64 } else { cap_s };
        let seconds = load_s.saturating_add(compile_s).saturating_add(graph_capture_s).min(cap_s);
        Self { seconds, weights_bytes, load_bandwidth_mib_s, load_s, compile_s, graph_capture_s, cap_s, basis }
    }

    /// One line: the figure and how it was computed.
    pub fn describe(&self) -> String {
        let gib = self.weights_bytes as f64 / (1024.0 * 1024.0 * 1024.0);
        let capped = if self.seconds == self.cap_s { " (capped)" } else { "" };
        format!(
            "{} s{capped} = {gib:.1} GiB / {} MiB/s = {} s load + {} s compile + {} s graph capture, cap {} s ({})",
            self.seconds,
            self.load_bandwidth_mib_s,
            self.load_s,
            self.compile_s,
            self.graph_capture_s,
            self.cap_s,
            self.basis
        )
    }
}

/// The model revision and program versions of one run; `None` where payload could not tell (the
/// reason is in the `provenance` event).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunProvenance {
    /// The commit the HF cache resolved for the model (`refs/main`), or the local path served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_revision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vllm_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harbor_version: Option<String>,
    /// `sha1:<hex>` of the task dir's content (payload's `provenance::dataset_digest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset_digest: Option<String>,
    /// In a pool (issue 37): the weights that served this leg and how they got into the engine
    /// (boxed: the event that carries this record stays small).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<Box<PoolProvenance>>,
}

/// One job's time on its GPUs by phase, in wall-clock seconds (GPU-seconds = seconds × `gpus`).
/// payload writes it in `status.json` (`gpu_time`; the shared-job layout is in `crate::shared`): a per-leg job in its run dir, a shared job in
/// its group dir (the legs' own records carry none). Queue wait is not in it: the job held no GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuTime {
    /// GPUs the job holds (every node's).
    pub gpus: u32,
    /// payload start → engine spawned (GPU detection, secrets, ports, staging).
    pub prepare_s: f64,
    /// Engine spawned → ready.
    pub load_s: f64,
    /// Engine up and at least one leg's Harbor running.
    pub serving_s: f64,
    /// Engine up and no leg's Harbor running (print-config checks, a post-run step, waiting).
    pub idle_s: f64,
    /// Teardown began → every child gone.
    pub teardown_s: f64,
    /// When each leg's Harbor ran, in seconds since payload started (one span per leg for a
    /// per-leg job; spans may overlap in a shared job).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub legs: Vec<LegSpan>,
}

/// When one leg's Harbor ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LegSpan {
    pub run_tag: String,
    pub start_s: f64,
    pub end_s: f64,
}

/// The post-run step's result, in `status.json` and the `post_run_finished` event.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PostRunRecord {
    /// Exited by itself with code 0.
    pub ok: bool,
    /// Its exit code (128+n when a signal ended it); absent when it never started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// `exit code N`, `killed by SIGKILL`, or why it could not start.
    pub status: String,
    pub duration_ms: u64,
    /// Stopped at `post_run.timeout_s`.
    pub timed_out: bool,
    /// A signal to payload that stopped it (`SIGTERM`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
    /// Its group needed SIGKILL after the grace.
    #[serde(default)]
    pub killed: bool,
}

/// In a leg's `status.json` (`provenance.pool`) and in the pool's `engine.json`: which weights
/// served the leg and how they got into the engine. Here, not in `pool`, because run records are
/// a leaf every other module reads (`pool` re-exports it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolProvenance {
    /// The pool's group tag.
    pub group_tag: String,
    /// The member's index in `pool.json`.
    pub member: usize,
    /// The model id (`model.hf_id`).
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The checkpoint's dir as listed in `pool.json`.
    pub weights_path: std::path::PathBuf,
    /// `sha1:<hex>` over the checkpoint dir's files (relative name, size, content; docs/pools.md).
    pub weights_digest: String,
    /// Which engine start served it, counting from 1 within this job (a cold restart adds one).
    pub engine_start: u32,
    /// The swap that brought the weights in, `None` when the engine started with them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap: Option<SwapEvidence>,
    /// The canaries' check on a fresh start (the reference itself, no comparison), when run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<String>,
}

/// What the swap was checked with (docs/pools.md "Proof per swap").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SwapEvidence {
    /// The checkpoints' files compared before the swap (architecture, shapes, tokenizer, chat
    /// template, generation defaults): `None` when they agree, else the first difference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compatibility: Option<String>,
    /// The worker extension's check of what the engine computes with against the checkpoint's
    /// files (every linear layer and the output head by function on seeded probes, every
    /// parameter that holds its tensor exactly): a summary, `ok: …` or the first mismatch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameter_check: Option<String>,
    /// Each greedy canary (one prompt longer than a KV block): its token ids, and whether a request
    /// with a fresh `cache_salt` (no prefix cache) gave the same ids (`canary <i> (<n> prompt
    /// tokens): [ids] same with a fresh cache_salt` or `… differs …`). The ids are the reference a
    /// calibration compares with a fresh start of the same model (docs/pools.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub canaries: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phases_name_is_its_serialized_name() {
        for phase in [Phase::Preparing, Phase::Serving, Phase::Ready, Phase::Running, Phase::Stopping, Phase::Done] {
            assert_eq!(serde_json::to_value(phase).unwrap(), phase.as_str());
        }
    }
    use std::os::unix::fs::FileTypeExt;

    #[test]
    fn atomic_write_replaces_whole_files_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/status.json");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path().join("sub")).unwrap().count(), 1, "no temp file left");
    }

    #[test]
    fn atomic_write_never_writes_through_links_or_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = dir.path().join("status.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        // The old temp name, planted as a link: an exclusive, unpredictable temp never uses it.
        let planted = dir.path().join(format!(".status.json.tmp-{}", std::process::id()));
        std::os::unix::fs::symlink(&target, &planted).unwrap();
        write_atomically(&link, b"new").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_file());
        assert_eq!(std::fs::read(&link).unwrap(), b"new");
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let err = write_atomically(&fifo, b"x").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    }

    #[test]
    fn regular_reads_refuse_fifos_at_once_and_cap_size() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("spec.json");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let t0 = std::time::Instant::now();
        let err = read_regular(&fifo, 100).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(t0.elapsed() < std::time::Duration::from_secs(2));
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'a'; 101]).unwrap();
        assert_eq!(read_regular(&big, 100).unwrap_err().kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(read_regular(&big, 101).unwrap().len(), 101);
    }

    #[test]
    fn exit_codes_are_distinct_per_class() {
        let mut codes: Vec<i32> = OutcomeClass::ALL.iter().map(|c| c.exit_code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), OutcomeClass::ALL.len());
    }

    #[test]
    fn class_serialises_as_documented_name() {
        for class in OutcomeClass::ALL {
            let json = serde_json::to_string(&class).unwrap();
            assert_eq!(json, format!("\"{}\"", class.as_str()));
        }
    }
}
