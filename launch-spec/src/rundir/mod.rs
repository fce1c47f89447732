//! The run directory's format, owned in one place: what payload writes (`launch.json`,
//! `status.json`, `events.jsonl`), what Harbor writes ([`harbor`]: the job and trial files, one
//! trial classifier) and vLLM's log ([`enginelog`]: one access-line parser, one scanner that runs
//! over a whole file or incrementally). payload's heartbeat, submitter's `check`, `status`, `sync`
//! and `results`, and the test stand-ins read and write through these types.

pub mod enginelog;
pub mod events;
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
pub use events::{EventBody, EventFields, EventKind};

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

    /// The record when it is the given Slurm job's ([`is_attempts_status`]).
    pub fn of_job(self, slurm_job_id: Option<&str>) -> Option<RunStatus> {
        self.into_status().filter(|s| is_attempts_status(s, slurm_job_id))
    }
}

/// Whether a `status.json` is the attempt's that ran as `slurm_job_id`: a resubmission reuses the
/// run dir (Harbor resumes there), so a record is an attempt's only when it names the attempt's
/// Slurm job; an attempt without a job id (not submitted yet) owns none. The one rule for
/// `sync`, `status`, `check`'s remediation and the team view.
pub fn is_attempts_status(status: &RunStatus, slurm_job_id: Option<&str>) -> bool {
    slurm_job_id.is_some() && status.slurm_job_id.as_deref() == slurm_job_id
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
        let outcome: crate::records::Outcome = e.decode()?;
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
    pub benchmark: Option<String>,
    #[serde(default)]
    pub model: LaunchModel,
    #[serde(default)]
    pub tunnel: LaunchTunnel,
    #[serde(default)]
    pub harbor: LaunchHarbor,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct LaunchModel {
    #[serde(default)]
    pub hf_id: Option<String>,
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

/// One line of `events.jsonl`: the raw `fields` of any kind (a newer payload's too); a known
/// kind's typed body through [`Event::decode`] / [`Event::body`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub at: String,
    pub event: EventKind,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub fields: serde_json::Map<String, Value>,
}

impl Event {
    /// The line payload writes for `body` at `at`.
    pub fn new(at: String, body: &EventBody) -> Result<Self, serde_json::Error> {
        Ok(Event { at, event: body.kind(), fields: body.to_fields()? })
    }

    /// The typed body when this line is of `T`'s kind and its fields decode as one.
    pub fn decode<T: EventFields>(&self) -> Option<T> {
        (self.event == T::KIND).then(|| T::deserialize(&self.fields).ok())?
    }

    /// The typed body of a known kind; `None` for another version's kind or fields that do not decode.
    pub fn body(&self) -> Option<EventBody> {
        EventBody::from_fields(&self.event, &self.fields)?.ok()
    }

    /// The phase a `phase` event entered.
    pub fn phase(&self) -> Option<Phase> {
        self.decode::<events::PhaseEntered>().map(|p| p.phase)
    }

    /// The public URL of the pair a `tunnel_pair` event took.
    pub fn pair_url(&self) -> Option<String> {
        self.decode::<events::TunnelPair>().map(|p| p.public_url)
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

/// The heartbeat history of a run dir: its `heartbeat` events (the latest
/// [`MAX_EVENTS_KEPT`] of the tail [`read_events_where`] reads), then `status.json`'s current
/// heartbeat when it is newer, oldest first. Events that do not parse as a heartbeat are skipped.
/// With a `status.json`, only the heartbeats since its `started_at` count (a resubmission appends
/// to the same `events.jsonl`); without one, all.
pub fn heartbeat_history(dir: &Path, status: Option<&RunStatus>) -> Vec<crate::records::Heartbeat> {
    let since = status.and_then(|s| parse_time(&s.started_at));
    let mut beats: Vec<crate::records::Heartbeat> = read_events_where(dir, |k| *k == EventKind::Heartbeat)
        .into_iter()
        .filter_map(|e| e.decode())
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
            failed_probes: 0,
            probe_limit: 3,
            engine: None,
        };
        let line = |hb: &Heartbeat| {
            let e = Event::new(hb.at.clone(), &events::heartbeat(hb).into()).unwrap();
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
