//! The run directory's format, owned in one place: what payload writes (`launch.json`,
//! `status.json`, `events.jsonl`), what Harbor writes ([`harbor`]: the job and trial files, one
//! trial classifier) and vLLM's log ([`enginelog`]: one access-line parser, one scanner that runs
//! over a whole file or incrementally). payload's heartbeat, submitter's `check`, `status`, `sync`
//! and `results`, and the test stand-ins read and write through these types.

pub mod enginelog;
pub mod harbor;
pub mod lenient;
pub mod vocab;

use std::path::Path;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::fsread::{self, Links};
pub use crate::records::{ENGINE_LOG, EVENTS_FILE, HARBOR_LOG, SPEC_FILE, STATUS_FILE, TUNNEL_LOG};
use crate::records::{Phase, RunStatus};

/// The newest `status.json` version this build reads (payload writes [`crate::SPEC_VERSION`]).
pub(crate) const STATUS_VERSION: u32 = crate::SPEC_VERSION;

/// Parses an RFC 3339 instant (`…Z` or with an offset); a naive `YYYY-MM-DDTHH:MM:SS[.f]` is read
/// as UTC (Harbor writes job timestamps in naive local time: use those for differences only).
pub fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Some(t.with_timezone(&Utc));
    }
    chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f").ok().map(|n| n.and_utc())
}

/// [`parse_time`] as milliseconds since the epoch.
pub fn parse_time_ms(text: &str) -> Option<i64> {
    parse_time(text).map(|t| t.timestamp_millis())
}

/// Why a record in the run dir could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecordError {
    #[error("{file} does not parse: {detail}")]
    Unparseable { file: &'static str, detail: String },
    #[error("{file} has version {found}, newer than this build reads ({supported}): upgrade submitter")]
    Newer { file: &'static str, found: u32, supported: u32 },
    #[error("{file} cannot be read: {detail}")]
    Unreadable { file: &'static str, detail: String },
}

/// payload's `status.json` as found: absent, usable, or there but unusable (truncated, another
/// version, a foreign writer) — the last is evidence in itself, never "no payload outcome".
// One value per run dir read, never collected in bulk: boxing the record would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Default, PartialEq)]
pub enum StatusRecord {
    #[default]
    Absent,
    Present(RunStatus),
    Unusable(RecordError),
}

impl StatusRecord {
    pub fn status(&self) -> Option<&RunStatus> {
        match self {
            StatusRecord::Present(s) => Some(s),
            _ => None,
        }
    }

    pub fn into_status(self) -> Option<RunStatus> {
        match self {
            StatusRecord::Present(s) => Some(s),
            _ => None,
        }
    }
}

/// Reads `status.json` (a regular file, never through a symlink, capped). A record without an
/// outcome is completed from `events.jsonl` when that holds this run's `outcome` event
/// ([`with_final_outcome`]): payload appends the event before it rewrites `status.json`, so on a
/// full disk the event is the one that made it.
pub fn read_status(dir: &Path) -> StatusRecord {
    let path = dir.join(STATUS_FILE);
    let bytes = match fsread::read_capped(&path, fsread::RECORD_CAP, Links::Refuse) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return StatusRecord::Absent,
        Err(e) => return StatusRecord::Unusable(RecordError::Unreadable { file: STATUS_FILE, detail: e.to_string() }),
    };
    match parse_status(&bytes) {
        StatusRecord::Present(status) if status.outcome.is_none() => {
            let outcomes = read_events_where(dir, |kind| *kind == EventKind::Outcome);
            StatusRecord::Present(with_final_outcome(status, &outcomes))
        }
        other => other,
    }
}

/// `status` with the latest `outcome` event of `events` that is this run's (recorded at or after
/// its `started_at`: a resumed run dir keeps the earlier runs' events), as payload would have
/// written it: phase `done`, the outcome, `updated_at` the event's time. Unchanged without one, or
/// when the record has its outcome already.
pub(crate) fn with_final_outcome(mut status: RunStatus, events: &[Event]) -> RunStatus {
    if status.outcome.is_some() {
        return status;
    }
    let Some(started) = parse_time(&status.started_at) else { return status };
    let latest = events.iter().rev().filter(|e| e.event == EventKind::Outcome).find_map(|e| {
        parse_time(&e.at).filter(|at| *at >= started)?;
        let outcome: crate::records::Outcome = serde_json::from_value(Value::Object(e.fields.clone())).ok()?;
        Some((e.at.clone(), outcome))
    });
    if let Some((at, outcome)) = latest {
        status.phase = Phase::Done;
        status.updated_at = at;
        status.outcome = Some(outcome);
    }
    status
}

/// Parses `status.json` bytes: a newer version is refused by name, anything else that does not
/// deserialise gives serde's message (line and column).
pub(crate) fn parse_status(bytes: &[u8]) -> StatusRecord {
    #[derive(Deserialize)]
    struct Head {
        version: u32,
    }
    if let Ok(head) = serde_json::from_slice::<Head>(bytes)
        && head.version > STATUS_VERSION
    {
        return StatusRecord::Unusable(RecordError::Newer {
            file: STATUS_FILE,
            found: head.version,
            supported: STATUS_VERSION,
        });
    }
    match serde_json::from_slice::<RunStatus>(bytes) {
        Ok(s) => StatusRecord::Present(s),
        Err(e) => StatusRecord::Unusable(RecordError::Unparseable { file: STATUS_FILE, detail: e.to_string() }),
    }
}

/// What verification reads of `launch.json`: a tolerant partial view (specs from older and newer
/// payloads read the same; payload itself reads the strict [`crate::LaunchSpec`]).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct LaunchView {
    #[serde(default)]
    pub version: Option<u32>,
    #[serde(default)]
    pub run_tag: Option<String>,
    #[serde(default)]
    pub tunnel: LaunchTunnel,
    #[serde(default)]
    pub harbor: LaunchHarbor,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct LaunchTunnel {
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub public_url: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct LaunchHarbor {
    #[serde(default)]
    pub dataset: Option<std::path::PathBuf>,
    #[serde(default)]
    pub n_attempts: Option<u64>,
    #[serde(default)]
    pub agent: Option<String>,
}

/// Reads `launch.json`'s view; `None` when absent or not JSON.
pub fn read_launch(dir: &Path) -> Option<LaunchView> {
    harbor::read(&dir.join(SPEC_FILE)).ok().flatten()
}

/// n_tasks × n_attempts: Harbor's `n_total_trials`, else the dataset's task dirs (from
/// `launch.json`, else the job `config.json`) × n_attempts.
pub fn expected_trials(
    result: Option<&harbor::JobResult>,
    launch: Option<&LaunchView>,
    config: Option<&harbor::JobConfig>,
) -> Option<u64> {
    if let Some(n) = result.and_then(|r| r.n_total_trials).filter(|n| *n > 0) {
        return Some(n);
    }
    let dataset = launch.and_then(|l| l.harbor.dataset.clone()).or_else(|| {
        config.and_then(|c| c.datasets.first()).and_then(|d| d.path.clone()).map(std::path::PathBuf::from)
    })?;
    let attempts = launch.and_then(|l| l.harbor.n_attempts).or_else(|| config.and_then(|c| c.n_attempts)).unwrap_or(1);
    Some(count_tasks(&dataset)? * attempts)
}

/// [`expected_trials`] of a run dir, reading its files.
pub fn expected_trials_in(dir: &Path) -> Option<u64> {
    let result: Option<harbor::JobResult> = harbor::read_rewritten(&dir.join(harbor::RESULT_FILE)).ok().flatten();
    expected_trials_with(result.as_ref(), dir)
}

/// [`expected_trials`] of a run dir whose job `result.json` the caller has read already.
pub fn expected_trials_with(result: Option<&harbor::JobResult>, dir: &Path) -> Option<u64> {
    let config: Option<harbor::JobConfig> = harbor::read(&dir.join(harbor::CONFIG_FILE)).ok().flatten();
    expected_trials(result, read_launch(dir).as_ref(), config.as_ref())
}

/// Task directories of a dataset: subdirectories holding `instruction.md` (or `task.toml`).
pub(crate) fn count_tasks(dataset: &Path) -> Option<u64> {
    let entries = std::fs::read_dir(dataset).ok()?;
    let n = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| e.path().join("instruction.md").is_file() || e.path().join("task.toml").is_file())
        .count() as u64;
    (n > 0).then_some(n)
}

/// What an `events.jsonl` line records. Names are the wire format (snake_case); a name this build
/// does not know reads as [`EventKind::Other`] (a newer payload), never as an error.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EventKind {
    Started,
    SecretsLoaded,
    Gpus,
    Port,
    /// The job's scratch dir on node-local disk was created (`dir`).
    Scratch,
    Phase,
    EngineSpawned,
    EngineReady,
    EngineExited,
    EngineUnhealthy,
    /// Requests in flight and no token for `serve.hang_after_s` (payload's liveness rule).
    EngineHung,
    /// While loading, no new `vllm.log` bytes for `serve.load_stall_after_s` (engine_start/stalled).
    EngineStalled,
    /// While loading, `serve.ready_budget` passed with the load still making progress: the
    /// deadline became the cap `serve.health_timeout_s` (progress is never cut short).
    ReadyBudgetExceeded,
    /// A server not of the engine's process tree answered readiness on its port (never taken
    /// for the engine).
    ForeignServer,
    /// A multi-node engine (docs/multinode.md): the other nodes' srun step started, every rank
    /// joined (with the node each runs on), the step ended, the step cancelled at teardown.
    RanksSpawned,
    RanksJoined,
    RanksExited,
    RanksCancelled,
    HarborConfigCheck,
    HarborSpawned,
    HarborExited,
    ResumeConfigsRewritten,
    /// The model revision, program versions and dataset digest payload recorded before Harbor
    /// started (`record`), and why any is missing (`missing`).
    Provenance,
    TunnelPrepared,
    TunnelPair,
    TunnelPairSkipped,
    TunnelSpawned,
    TunnelRestart,
    TunnelFailed,
    TunnelUrlMismatch,
    TunnelLeaseUnavailable,
    TunnelLeaseLost,
    TunnelLeaseReleased,
    TunnelExited,
    TunnelConnected,
    TunnelUp,
    Signal,
    TeardownStarted,
    TeardownDone,
    PostRunSkipped,
    PostRunStarted,
    PostRunFinished,
    WriteFailures,
    Outcome,
    /// payload's heartbeat counters, at most every [`crate::records::HEARTBEAT_EVENT_EVERY_S`]
    /// (`fields`: a [`crate::records::Heartbeat`] without the engine's counters): the history the
    /// team view's charts draw, since `status.json` holds only the latest heartbeat.
    Heartbeat,
    /// A leg of a shared job (launch_spec::shared): `cancel.request` seen; the engine host said
    /// the engine is gone; the leg uses the host's engine (`engine.json`).
    CancelRequested,
    EngineLost,
    SharedEngine,
    /// The engine host of a shared job: a leg's payload started, ended, was left alone (already
    /// finished) or refused before it could start (its spec unreadable or another engine's).
    LegSpawned,
    LegEnded,
    LegSkipped,
    LegRefused,
    Other(String),
}

const EVENT_NAMES: &[(&str, EventKind)] = &[
    ("started", EventKind::Started),
    ("secrets_loaded", EventKind::SecretsLoaded),
    ("gpus", EventKind::Gpus),
    ("port", EventKind::Port),
    ("scratch", EventKind::Scratch),
    ("phase", EventKind::Phase),
    ("engine_spawned", EventKind::EngineSpawned),
    ("engine_ready", EventKind::EngineReady),
    ("engine_exited", EventKind::EngineExited),
    ("engine_unhealthy", EventKind::EngineUnhealthy),
    ("engine_hung", EventKind::EngineHung),
    ("engine_stalled", EventKind::EngineStalled),
    ("ready_budget_exceeded", EventKind::ReadyBudgetExceeded),
    ("foreign_server", EventKind::ForeignServer),
    ("ranks_spawned", EventKind::RanksSpawned),
    ("ranks_joined", EventKind::RanksJoined),
    ("ranks_exited", EventKind::RanksExited),
    ("ranks_cancelled", EventKind::RanksCancelled),
    ("harbor_config_check", EventKind::HarborConfigCheck),
    ("harbor_spawned", EventKind::HarborSpawned),
    ("harbor_exited", EventKind::HarborExited),
    ("resume_configs_rewritten", EventKind::ResumeConfigsRewritten),
    ("provenance", EventKind::Provenance),
    ("tunnel_prepared", EventKind::TunnelPrepared),
    ("tunnel_pair", EventKind::TunnelPair),
    ("tunnel_pair_skipped", EventKind::TunnelPairSkipped),
    ("tunnel_spawned", EventKind::TunnelSpawned),
    ("tunnel_restart", EventKind::TunnelRestart),
    ("tunnel_failed", EventKind::TunnelFailed),
    ("tunnel_url_mismatch", EventKind::TunnelUrlMismatch),
    ("tunnel_lease_unavailable", EventKind::TunnelLeaseUnavailable),
    ("tunnel_lease_lost", EventKind::TunnelLeaseLost),
    ("tunnel_lease_released", EventKind::TunnelLeaseReleased),
    ("tunnel_exited", EventKind::TunnelExited),
    ("tunnel_connected", EventKind::TunnelConnected),
    ("tunnel_up", EventKind::TunnelUp),
    ("signal", EventKind::Signal),
    ("teardown_started", EventKind::TeardownStarted),
    ("teardown_done", EventKind::TeardownDone),
    ("post_run_skipped", EventKind::PostRunSkipped),
    ("post_run_started", EventKind::PostRunStarted),
    ("post_run_finished", EventKind::PostRunFinished),
    ("write_failures", EventKind::WriteFailures),
    ("outcome", EventKind::Outcome),
    ("heartbeat", EventKind::Heartbeat),
    ("cancel_requested", EventKind::CancelRequested),
    ("engine_lost", EventKind::EngineLost),
    ("shared_engine", EventKind::SharedEngine),
    ("leg_spawned", EventKind::LegSpawned),
    ("leg_ended", EventKind::LegEnded),
    ("leg_skipped", EventKind::LegSkipped),
    ("leg_refused", EventKind::LegRefused),
];

impl EventKind {
    pub fn as_str(&self) -> &str {
        match self {
            EventKind::Other(name) => name,
            known => EVENT_NAMES.iter().find(|(_, k)| k == known).map_or("other", |(n, _)| n),
        }
    }
}

impl From<&str> for EventKind {
    fn from(name: &str) -> Self {
        EVENT_NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map_or_else(|| EventKind::Other(name.to_string()), |(_, k)| k.clone())
    }
}

impl Serialize for EventKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EventKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<str>::deserialize(d)?;
        Ok(EventKind::from(name.as_ref()))
    }
}

/// One line of `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub at: String,
    pub event: EventKind,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub fields: serde_json::Map<String, Value>,
}

impl Event {
    /// The phase a `phase` event entered.
    pub fn phase(&self) -> Option<Phase> {
        (self.event == EventKind::Phase).then(|| serde_json::from_value(self.fields.get("phase")?.clone()).ok())?
    }

    /// The public URL of the pair a `tunnel_pair` event took.
    pub fn pair_url(&self) -> Option<&str> {
        (self.event == EventKind::TunnelPair).then(|| self.fields.get("public_url")?.as_str())?
    }
}

/// How much of `events.jsonl`'s end is read: the events verification needs are recent.
pub(crate) const EVENTS_TAIL: u64 = 8 << 20;

/// The longest `events.jsonl` line read: payload's events are a few hundred bytes; a longer line
/// is not one of them and is skipped unparsed.
pub(crate) const MAX_EVENT_LINE: usize = 64 << 10;

/// The most events kept from one read, the latest: a run records a few dozen.
pub(crate) const MAX_EVENTS_KEPT: usize = 4096;

/// The events among the last [`EVENTS_TAIL`] bytes of `events.jsonl` (a line cut by the window,
/// longer than [`MAX_EVENT_LINE`] or not parsing is skipped), oldest first, at most the latest
/// [`MAX_EVENTS_KEPT`].
#[cfg(test)] // used only by the tests
pub(crate) fn read_events(dir: &Path) -> Vec<Event> {
    read_events_where(dir, |_| true)
}

/// [`read_events`], keeping only the events whose kind `keep` wants: each line's kind is read first
/// (its fields skipped unparsed), so a long file of other events costs its tail's bytes, not a
/// `Value` per event.
pub fn read_events_where(dir: &Path, keep: impl Fn(&EventKind) -> bool) -> Vec<Event> {
    #[derive(Deserialize)]
    struct Head {
        event: EventKind,
    }
    let Ok((bytes, len)) = fsread::read_tail(&dir.join(EVENTS_FILE), EVENTS_TAIL, Links::Refuse) else {
        return Vec::new();
    };
    let start = if len > bytes.len() as u64 { memchr::memchr(b'\n', &bytes).map_or(bytes.len(), |i| i + 1) } else { 0 };
    let mut kept = std::collections::VecDeque::new();
    for line in bytes[start..].split(|b| *b == b'\n').filter(|l| !l.is_empty() && l.len() <= MAX_EVENT_LINE) {
        if !serde_json::from_slice::<Head>(line).is_ok_and(|head| keep(&head.event)) {
            continue;
        }
        if let Ok(event) = serde_json::from_slice::<Event>(line) {
            if kept.len() == MAX_EVENTS_KEPT {
                kept.pop_front();
            }
            kept.push_back(event);
        }
    }
    kept.into()
}

/// The fields of a `heartbeat` event: the heartbeat without the engine's counters (they stay in
/// `status.json`; the history needs the cumulative counts only).
pub fn heartbeat_event_fields(hb: &crate::records::Heartbeat) -> Value {
    serde_json::to_value(crate::records::Heartbeat { engine: None, ..hb.clone() }).unwrap_or(Value::Null)
}

/// The heartbeat history of a run dir: its `heartbeat` events (the latest
/// [`MAX_EVENTS_KEPT`] of the tail [`read_events_where`] reads), then `status.json`'s current
/// heartbeat when it is newer, oldest first. Events that do not parse as a heartbeat are skipped.
/// With a `status.json`, only the heartbeats since its `started_at` count (a resubmission appends
/// to the same `events.jsonl`); without one, all.
pub fn heartbeat_history(dir: &Path, status: Option<&RunStatus>) -> Vec<crate::records::Heartbeat> {
    let since = status.and_then(|s| parse_time(&s.started_at));
    let mut beats: Vec<crate::records::Heartbeat> = read_events_where(dir, |k| *k == EventKind::Heartbeat)
        .into_iter()
        .filter_map(|e| serde_json::from_value(Value::Object(e.fields)).ok())
        .filter(|h: &crate::records::Heartbeat| since.is_none_or(|t| parse_time(&h.at).is_some_and(|at| at >= t)))
        .collect();
    if let Some(current) = status.and_then(|s| s.heartbeat.as_ref()) {
        let newer = match (beats.last().and_then(|b| parse_time(&b.at)), parse_time(&current.at)) {
            (Some(last), Some(now)) => now > last,
            (None, Some(_)) => true,
            _ => false,
        };
        if newer {
            beats.push(crate::records::Heartbeat { engine: None, ..current.clone() });
        }
    }
    beats
}

/// When Harbor started: the last `phase: running` event, else `status.json`'s `started_at` while
/// its phase is running.
pub fn running_since(events: &[Event], status: Option<&RunStatus>) -> Option<DateTime<Utc>> {
    events
        .iter()
        .rev()
        .find(|e| e.phase() == Some(Phase::Running))
        .and_then(|e| parse_time(&e.at))
        .or_else(|| status.filter(|s| s.phase == Phase::Running).and_then(|s| parse_time(&s.started_at)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_and_unknown_names_survive() {
        let line = r#"{"at":"2026-12-01T16:33:01.469Z","event":"phase","fields":{"phase":"running"}}"#;
        let e: Event = serde_json::from_str(line).unwrap();
        assert_eq!(e.event, EventKind::Phase);
        assert_eq!(e.phase(), Some(Phase::Running));
        assert_eq!(serde_json::to_string(&e).unwrap(), line);
        let other: Event = serde_json::from_str(r#"{"at":"x","event":"from_the_future"}"#).unwrap();
        assert_eq!(other.event, EventKind::Other("from_the_future".into()));
        assert_eq!(other.event.as_str(), "from_the_future");
        for (name, kind) in EVENT_NAMES {
            assert_eq!(EventKind::from(*name), *kind);
            assert_eq!(kind.as_str(), *name);
        }
    }

    #[test]
    fn heartbeat_history_reads_events_then_the_current_heartbeat() {
        use crate::records::Heartbeat;
        let dir = tempfile::tempdir().unwrap();
        let beat = |at: &str, ok: u64, done: u64| Heartbeat {
            at: at.into(),
            completions_ok: ok,
            completions_4xx: 0,
            completions_5xx: 0,
            trials_started: done + 1,
            trials_finished: done,
            trials_errored: 0,
            last_progress_at: None,
            engine_healthy: true,
            engine: None,
        };
        let line = |hb: &Heartbeat| {
            let e = Event {
                at: hb.at.clone(),
                event: EventKind::Heartbeat,
                fields: heartbeat_event_fields(hb).as_object().unwrap().clone(),
            };
            serde_json::to_string(&e).unwrap() + "\n"
        };
        // An earlier job's beat (before this status.json's start), two of this job's, a broken one.
        let text = line(&beat("2026-12-01T09:00:00Z", 99, 9))
            + &line(&beat("2026-12-01T10:01:00Z", 10, 1))
            + r#"{"at":"2026-12-01T10:01:30Z","event":"heartbeat","fields":{"at":"x"}}"#
            + "\n"
            + &line(&beat("2026-12-01T10:02:00Z", 30, 2));
        std::fs::write(dir.path().join(crate::records::EVENTS_FILE), text).unwrap();
        assert_eq!(heartbeat_history(dir.path(), None).len(), 3, "without status.json every parsed beat");
        let mut status: RunStatus = serde_json::from_value(serde_json::json!({
            "version": 1, "run_tag": "t", "phase": "running", "started_at": "2026-12-01T10:00:00Z",
            "updated_at": "2026-12-01T10:02:30Z"
        }))
        .unwrap();
        status.heartbeat = Some(beat("2026-12-01T10:02:30Z", 45, 3));
        let h = heartbeat_history(dir.path(), Some(&status));
        let seen: Vec<(&str, u64)> = h.iter().map(|b| (b.at.as_str(), b.completions_ok)).collect();
        assert_eq!(seen, [("2026-12-01T10:01:00Z", 10), ("2026-12-01T10:02:00Z", 30), ("2026-12-01T10:02:30Z", 45)]);
        // The current heartbeat equal to the last event is not doubled.
        status.heartbeat = Some(beat("2026-12-01T10:02:00Z", 30, 2));
        assert_eq!(heartbeat_history(dir.path(), Some(&status)).len(), 2);
    }

    #[test]
    fn status_records_say_why_they_are_unusable() {
        assert!(matches!(
            parse_status(b"{\"version\": 1, \"run_tag\": \"x\", \"pha"),
            StatusRecord::Unusable(RecordError::Unparseable { .. })
        ));
        assert!(matches!(
            parse_status(b"{\"version\": 99, \"whatever\": true}"),
            StatusRecord::Unusable(RecordError::Newer { found: 99, .. })
        ));
        let ok = br#"{"version":1,"run_tag":"t","phase":"running","started_at":"a","updated_at":"b"}"#;
        assert!(matches!(parse_status(ok), StatusRecord::Present(_)));
    }
}
