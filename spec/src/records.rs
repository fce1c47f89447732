//! What payload leaves in the run dir (`status.json`, `events.jsonl`) and submitter reads back.
//! All plain files: Harbor deletes run-dir subdirectories without a `result.json` on resume.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub const STATUS_FILE: &str = "status.json";
pub const EVENTS_FILE: &str = "events.jsonl";
pub const SPEC_FILE: &str = "launch.json";
pub const ENGINE_LOG: &str = "vllm.log";
pub const HARBOR_LOG: &str = "harbor.log";
pub const TUNNEL_LOG: &str = "tunnel.log";

/// Replaces `path` with `contents` atomically: a temp file in the same directory (so the rename
/// stays on one filesystem), then a rename, so a reader — submitter reading payload's records, payload
/// reading a spec — never sees half a file. Creates the parent directory when missing.
pub fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
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
    Tunnel,
    Harbor,
    Walltime,
    Interrupted,
}

impl OutcomeClass {
    pub const ALL: [OutcomeClass; 11] = [
        Self::Finished,
        Self::Spec,
        Self::Secrets,
        Self::Gpu,
        Self::EngineStart,
        Self::EngineTimeout,
        Self::EngineDied,
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
    /// Whether the last health probe succeeded.
    #[serde(default)]
    pub engine_healthy: bool,
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
}

/// One line of `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub at: String,
    pub event: String,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

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
