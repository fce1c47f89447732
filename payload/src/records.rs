//! Records in the run dir (docs/design.md §6.8): `status.json` replaced atomically (temp file + rename in the
//! run dir), `events.jsonl` append-only, and the heartbeat counters. Everything payload writes in
//! the run dir is a plain file — Harbor deletes subdirectories without `result.json` on resume.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use launch_spec::records::{
    EVENTS_FILE, EngineCounters, Heartbeat, Outcome, Phase, RESERVE_BYTES, RESERVE_FILE, RunStatus, STATUS_FILE,
};
use launch_spec::rundir::enginelog::Scanner;
use launch_spec::rundir::events::PhaseEntered;
use launch_spec::rundir::harbor::{TrialStage, is_trial_entry, read_trial};
use launch_spec::rundir::{Event, EventBody};

/// RFC 3339 UTC with milliseconds, e.g. `2026-07-17T10:00:00.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

pub fn now() -> String {
    rfc3339(SystemTime::now())
}

/// Writes `status.json` and `events.jsonl`. Write errors are counted and logged, never fatal: the
/// run goes on (a full disk must not stop the teardown).
pub(crate) struct Recorder {
    run_dir: PathBuf,
    pub status: RunStatus,
    /// Failed writes of `status.json` / `events.jsonl` so far.
    pub(crate) failed_status_writes: u64,
    pub(crate) failed_event_writes: std::cell::Cell<u64>,
    /// Every secret value payload knows (the secrets file's, the per-job API key), scrubbed from
    /// every string of every record before it is written ([`scrub`]).
    secrets: Vec<String>,
    /// The reserve file while it is held ([`Recorder::reserve_space`]).
    reserve: Option<PathBuf>,
    /// The job's GPU time (crate::gputime), snapshotted into every `status.json` written; none
    /// in a record that carries no `gpu_time` (a shared job's leg).
    pub(crate) gpu_clock: Option<crate::gputime::GpuClock>,
}

impl Recorder {
    pub(crate) fn new(run_dir: &Path, run_tag: &str) -> Self {
        let at = now();
        Self {
            run_dir: run_dir.to_path_buf(),
            status: RunStatus {
                version: launch_spec::SPEC_VERSION,
                run_tag: run_tag.to_string(),
                phase: Phase::Preparing,
                started_at: at.clone(),
                updated_at: at,
                slurm_job_id: None,
                node: None,
                gpu: None,
                port: None,
                pids: BTreeMap::new(),
                resume: None,
                heartbeat: None,
                outcome: None,
                post_run: None,
                provenance: None,
                gpu_time: None,
                readiness: None,
            },
            failed_status_writes: 0,
            failed_event_writes: std::cell::Cell::new(0),
            secrets: Vec::new(),
            reserve: None,
            gpu_clock: None,
        }
    }

    /// Holds [`RESERVE_BYTES`] in the run dir ([`RESERVE_FILE`]) until [`Recorder::release_reserve`].
    /// Best effort: a run dir already too full for it runs without.
    pub(crate) fn reserve_space(&mut self) {
        let path = self.run_dir.join(RESERVE_FILE);
        let _ = std::fs::remove_file(&path);
        let made = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .and_then(|mut f| f.write_all(&vec![0u8; RESERVE_BYTES]));
        match made {
            Ok(()) => self.reserve = Some(path),
            Err(err) => {
                tracing::debug!(error = %err, "no space reserved for the final records");
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    /// Frees the reserved space (before the final records; idempotent).
    pub(crate) fn release_reserve(&mut self) {
        if let Some(path) = self.reserve.take() {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Adds values no record may hold from now on (empty ones are ignored).
    pub(crate) fn redact<S: AsRef<str>>(&mut self, values: impl IntoIterator<Item = S>) {
        for v in values {
            let v = v.as_ref();
            if !v.is_empty() && !self.secrets.iter().any(|s| s == v) {
                self.secrets.push(v.to_string());
            }
        }
    }

    /// Replaces `status.json` atomically.
    pub(crate) fn write_status(&mut self) {
        self.status.updated_at = now();
        if let Some(clock) = &self.gpu_clock {
            self.status.gpu_time = Some(clock.snapshot(std::time::Instant::now()));
        }
        let mut value = serde_json::to_value(&self.status).expect("status serialises");
        scrub(&mut value, &self.secrets);
        let mut text = serde_json::to_string_pretty(&value).expect("status serialises");
        text.push('\n');
        if let Err(err) = launch_spec::records::write_atomically(&self.run_dir.join(STATUS_FILE), text.as_bytes()) {
            self.failed_status_writes += 1;
            tracing::warn!(error = %err, failures = self.failed_status_writes, "cannot write status.json");
        }
    }

    /// One transition of the GPU clock, at `Instant::now()` (nothing without a clock).
    pub(crate) fn gpu(&mut self, f: impl FnOnce(&mut crate::gputime::GpuClock, std::time::Instant)) {
        if let Some(clock) = self.gpu_clock.as_mut() {
            f(clock, std::time::Instant::now());
        }
    }

    pub(crate) fn set_phase(&mut self, phase: Phase) {
        self.status.phase = phase;
        self.write_status();
        self.event(PhaseEntered { phase });
    }

    pub(crate) fn set_outcome(&mut self, outcome: Outcome) {
        self.release_reserve();
        self.status.outcome = Some(outcome);
        self.status.phase = Phase::Done;
        self.write_status();
    }

    /// Appends one event line: a typed body of `launch_spec::rundir::events` (its kind and fields
    /// are the table's, so neither can be misspelt), every string scrubbed of secrets.
    pub(crate) fn event(&self, body: impl Into<EventBody>) {
        let body = body.into();
        let mut event = match Event::new(now(), &body) {
            Ok(event) => event,
            Err(err) => {
                // A body that cannot be JSON (a path that is not UTF-8): counted like a failed write.
                self.failed_event_writes.set(self.failed_event_writes.get() + 1);
                tracing::warn!(error = %err, event = body.kind().as_str(), "cannot record an event");
                return;
            }
        };
        event.fields.values_mut().for_each(|v| scrub(v, &self.secrets));
        let mut line = serde_json::to_string(&event).expect("event serialises");
        line.push('\n');
        // A symlink planted as events.jsonl is refused (its target never appended to), a FIFO
        // never blocks the run (launch_spec::fsread::open_append_regular).
        let result = launch_spec::fsread::open_append_regular(&self.run_dir.join(EVENTS_FILE))
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(err) = result {
            self.failed_event_writes.set(self.failed_event_writes.get() + 1);
            tracing::warn!(error = %err, failures = self.failed_event_writes.get(), "cannot append to events.jsonl");
        }
    }
}

/// Shortest secret scrubbed where it occurs inside a longer string (an engine log line printing
/// `VLLM_API_KEY=…`); a shorter one only as a whole string (crate::secrets::redact_whole's rule:
/// a 5-character secret `Qwen3` must not cut `Qwen/Qwen3-8B`).
pub(crate) const SCRUB_INSIDE_MIN: usize = 8;

/// Replaces every secret in every string of `value` (object keys are payload's own names and
/// stay) with `<redacted>`: a whole string always, an occurrence inside one when the secret is
/// at least [`SCRUB_INSIDE_MIN`] long.
pub fn scrub(value: &mut serde_json::Value, secrets: &[String]) {
    if secrets.is_empty() {
        return;
    }
    match value {
        serde_json::Value::String(s) => {
            for secret in secrets {
                if s == secret {
                    *s = crate::secrets::REDACTED.to_string();
                } else if secret.len() >= SCRUB_INSIDE_MIN && s.contains(secret.as_str()) {
                    *s = s.replace(secret.as_str(), crate::secrets::REDACTED);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|v| scrub(v, secrets)),
        serde_json::Value::Object(map) => map.values_mut().for_each(|v| scrub(v, secrets)),
        _ => {}
    }
}

/// The first record in `run_dir` payload could not write as a plain file (a FIFO, a device, a
/// socket or a directory planted as `events.jsonl` or `status.json`), as a one-line problem. A
/// symlink is not one: it is never written through (replaced, or the append refused and counted).
pub(crate) fn unwritable_record(run_dir: &Path) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    [EVENTS_FILE, STATUS_FILE].iter().find_map(|name| {
        let path = run_dir.join(name);
        let kind = std::fs::symlink_metadata(&path).ok()?.file_type();
        if kind.is_file() || kind.is_symlink() {
            return None;
        }
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_dir() {
            "a directory"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "a device or special file"
        };
        Some(format!("{} is {what}, not a regular file: remove it (payload writes it as a plain file)", path.display()))
    })
}

/// Completion counts by status class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Completions {
    pub ok: u64,
    pub c4xx: u64,
    pub c5xx: u64,
}

/// Sums vLLM's `http_requests_total{handler="/v1/chat/completions",status="2xx|4xx|5xx"}`.
/// `None` when the text has no such counter (older vLLM, or metrics disabled).
pub(crate) fn completions_from_metrics(text: &str) -> Option<Completions> {
    let mut out = Completions::default();
    let mut seen = false;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("http_requests_total{") else { continue };
        let Some((labels, value)) = rest.split_once('}') else { continue };
        if !labels.contains(r#"handler="/v1/chat/completions""#) {
            continue;
        }
        let value: f64 = value.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        let value = value.max(0.0) as u64;
        seen = true;
        if labels.contains(r#"status="2xx""#) {
            out.ok += value;
        } else if labels.contains(r#"status="4xx""#) {
            out.c4xx += value;
        } else if labels.contains(r#"status="5xx""#) {
            out.c5xx += value;
        }
    }
    seen.then_some(out)
}

/// Bytes of `vllm.log` one update reads at most; the rest is read by the next heartbeats (a 1 GB
/// burst is caught up over several beats instead of stalling supervision or filling memory).
pub(crate) const MAX_LOG_BYTES_PER_UPDATE: u64 = 16 << 20;
/// Longest line kept whole; a longer one (never an access line) is skipped to its end.
pub(crate) const MAX_LINE: usize = 64 * 1024;
const CHUNK: usize = 64 * 1024;
/// Wall-clock budget of one heartbeat's scans (log and trials each), so the main task — readiness,
/// signals, child exits — never waits long behind a heavy scan.
pub(crate) const SCAN_BUDGET: std::time::Duration = std::time::Duration::from_millis(25);

/// Counts uvicorn access lines `"POST /v1/chat/completions HTTP/1.1" 200` in `vllm.log`,
/// incrementally: it keeps the offset, streams new bytes through a fixed 64 KiB buffer (memory
/// does not grow with the log), reads at most [`MAX_LOG_BYTES_PER_UPDATE`] or [`SCAN_BUDGET`] per
/// update, and counts complete lines only.
#[derive(Default)]
pub(crate) struct AccessLogCounter {
    offset: u64,
    scanner: Scanner,
    /// Inside a line longer than [`MAX_LINE`]: skip to its newline.
    skipping: bool,
    pub counts: Completions,
}

impl AccessLogCounter {
    pub(crate) fn update(&mut self, path: &Path) -> Completions {
        let Ok(mut file) = launch_spec::records::open_regular(path) else { return self.counts };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.offset {
            self.offset = 0;
            self.skipping = false;
            self.scanner = Scanner::new();
            self.counts = Completions::default();
        }
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return self.counts;
        }
        let until = std::time::Instant::now() + SCAN_BUDGET;
        let mut buf = vec![0u8; CHUNK];
        // The partial line at the end of what was read (re-read next time unless too long).
        let mut line: Vec<u8> = Vec::new();
        // File position of buf[0].
        let mut pos = self.offset;
        let end = self.offset.saturating_add(MAX_LOG_BYTES_PER_UPDATE);
        while pos < end && std::time::Instant::now() < until {
            let want = CHUNK.min((end - pos) as usize);
            let n = match file.read(&mut buf[..want]) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut start = 0;
            for nl in memchr::memchr_iter(b'\n', &buf[..n]) {
                if self.skipping {
                    self.skipping = false;
                } else if line.is_empty() {
                    self.count_line(&buf[start..nl]);
                } else {
                    line.extend_from_slice(&buf[start..nl]);
                    self.count_line(&line);
                    line.clear();
                }
                start = nl + 1;
                self.offset = pos + start as u64;
            }
            if !self.skipping && line.len() + (n - start) > MAX_LINE {
                line.clear();
                self.skipping = true;
            }
            if self.skipping {
                // Nothing of an over-long line is kept: move past what was read.
                self.offset = pos + n as u64;
            } else {
                line.extend_from_slice(&buf[start..n]);
            }
            pos += n as u64;
        }
        self.counts
    }

    fn count_line(&mut self, line: &[u8]) {
        // The one engine-log scanner, shared with `submitter check`, fed incrementally.
        self.scanner.line(line);
        let log = self.scanner.log();
        self.counts = Completions { ok: log.ok, c4xx: log.c4xx, c5xx: log.c5xx };
    }
}

/// Trials in the run dir (`launch_spec::rundir::harbor::read_trial`, the reader `check` uses):
/// past Harbor's queue = started; with `result.json` = finished; a `result.json` that names an
/// exception = errored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trials {
    pub started: u64,
    pub finished: u64,
    pub errored: u64,
}

#[derive(Debug, Clone, Copy)]
struct TrialState {
    /// The trial dir's mtime (ns since the epoch; 0 = not looked at) when last looked at
    /// (`result.json` appearing changes it).
    mtime_ns: u64,
    /// `Some(errored)` once finished: final, never read again.
    result: Option<bool>,
    /// Past Harbor's queue: its environment started ([`TrialStage::is_active`]) or it is done.
    started: bool,
    /// The listing that last saw this trial (a trial missing from a complete listing is gone).
    listed: u32,
    /// The pass over unfinished trials that last looked at it.
    checked: u32,
}

/// The run dir is listed again at most this often when only its mtime moved (a file such as
/// `status.json` replaced) and not its count of subdirectories.
pub(crate) const RELIST_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Incremental trial counting for the heartbeat. The run dir is listed again when its count of
/// subdirectories (`st_nlink`) changes, or at most every [`RELIST_EVERY`] when only its mtime does;
/// a listing may span heartbeats (the `ReadDir` is kept). An unfinished trial is looked at again
/// only when its own mtime changes; a finished trial's `result.json` is read once, capped. Every step stops after [`SCAN_BUDGET`] and goes on at the next heartbeat, so 100k trial
/// dirs never stall supervision; memory is one small entry per trial.
#[derive(Debug, Default)]
pub struct TrialScan {
    /// (mtime, nlink) of the run dir when the last listing started.
    dir_stamp: Option<(SystemTime, u64)>,
    last_list: Option<std::time::Instant>,
    listing: Option<std::fs::ReadDir>,
    list_gen: u32,
    pass: u32,
    /// Whether the last call finished its listing and its pass (the counts are complete).
    complete: bool,
    trials: std::collections::HashMap<Box<std::ffi::OsStr>, TrialState>,
}

fn mtime_ns(meta: &std::fs::Metadata) -> u64 {
    meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_nanos() as u64).unwrap_or(1)
}

impl TrialScan {
    pub fn scan(&mut self, run_dir: &Path) -> Trials {
        use std::os::unix::fs::MetadataExt;
        let until = std::time::Instant::now() + SCAN_BUDGET;
        if self.listing.is_none() {
            let stamp = std::fs::metadata(run_dir).ok().and_then(|m| Some((m.modified().ok()?, m.nlink())));
            let due = match (stamp, self.dir_stamp) {
                (None, _) => true,
                (Some(now), Some(before)) if now == before => false,
                // Subdirectories counted by the filesystem (nlink > 1) and their count moved.
                (Some(now), Some(before)) if now.1 > 1 && now.1 != before.1 => true,
                (Some(_), Some(_)) => self.last_list.is_none_or(|t| t.elapsed() >= RELIST_EVERY),
                (Some(_), None) => true,
            };
            if due {
                self.dir_stamp = stamp;
                self.last_list = Some(std::time::Instant::now());
                self.list_gen = self.list_gen.wrapping_add(1);
                match std::fs::read_dir(run_dir) {
                    Ok(rd) => self.listing = Some(rd),
                    Err(_) => self.trials.clear(),
                }
            }
        }
        let mut listed_all = true;
        if let Some(rd) = self.listing.as_mut() {
            let generation = self.list_gen;
            // A new trial counts as not yet looked at in the current pass.
            let unchecked = self.pass.wrapping_sub(1);
            for (i, entry) in rd.by_ref().enumerate() {
                // d_type: no stat per entry; a symlink is not a trial.
                if let Ok(entry) = entry
                    && is_trial_entry(&entry)
                {
                    let name = entry.file_name();
                    match self.trials.get_mut(name.as_os_str()) {
                        Some(st) => st.listed = generation,
                        None => {
                            let st = TrialState {
                                mtime_ns: 0,
                                result: None,
                                started: false,
                                listed: generation,
                                checked: unchecked,
                            };
                            self.trials.insert(name.into_boxed_os_str(), st);
                        }
                    }
                }
                if i % 64 == 63 && std::time::Instant::now() >= until {
                    listed_all = false;
                    break;
                }
            }
            if listed_all {
                self.listing = None;
                self.trials.retain(|_, st| st.listed == generation);
            }
        }
        let pass = self.pass;
        let mut checked_all = true;
        let mut buf = Vec::new();
        let pending = self.trials.iter_mut().filter(|(_, st)| st.result.is_none() && st.checked != pass);
        for (i, (name, st)) in pending.enumerate() {
            if i % 16 == 15 && std::time::Instant::now() >= until {
                checked_all = false;
                break;
            }
            st.checked = pass;
            let dir = run_dir.join(&**name);
            let mtime = std::fs::symlink_metadata(&dir).map(|m| mtime_ns(&m)).unwrap_or(1);
            if st.mtime_ns == mtime {
                continue;
            }
            st.mtime_ns = mtime;
            // The one trial reader, shared with `check` (a queued dir or a stray subdirectory is
            // not a started trial; one symlink rule, one size cap).
            let read = read_trial(&dir, &mut buf);
            st.result = (read.stage == TrialStage::Done).then(|| read.errored());
            st.started = read.stage == TrialStage::Done || read.stage.is_active();
        }
        if checked_all {
            self.pass = self.pass.wrapping_add(1);
        }
        self.complete = listed_all && checked_all;
        self.totals()
    }

    fn totals(&self) -> Trials {
        let mut t = Trials::default();
        for st in self.trials.values() {
            t.started += u64::from(st.started || st.result.is_some());
            if let Some(errored) = st.result {
                t.finished += 1;
                t.errored += u64::from(errored);
            }
        }
        t
    }
}

/// All trials in one go (loops until a scan is complete).
pub fn count_trials(run_dir: &Path) -> Trials {
    let mut scan = TrialScan::default();
    loop {
        let t = scan.scan(run_dir);
        if scan.complete {
            return t;
        }
    }
}

impl std::fmt::Debug for AccessLogCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLogCounter").field("offset", &self.offset).field("counts", &self.counts).finish()
    }
}

/// The health probe's state as the heartbeat records it (`phases::Machine::probes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ProbeState {
    pub(crate) healthy: bool,
    /// Failed probes in a row.
    pub(crate) failed: u32,
    /// `limits.health_failures`.
    pub(crate) limit: u32,
}

/// Keeps the heartbeat and its `last_progress_at`.
#[derive(Debug, Default)]
pub(crate) struct HeartbeatState {
    pub access: AccessLogCounter,
    pub trials: TrialScan,
    /// vLLM's counters from the latest `/metrics` reading (crate::liveness), set by the run loop;
    /// a generated token is progress too.
    pub engine: Option<EngineCounters>,
    last: Option<(Completions, Trials, u64)>,
    last_progress_at: Option<String>,
    /// When the last `heartbeat` event was appended ([`HeartbeatState::event_due`]).
    last_event: Option<std::time::Instant>,
    /// The health probe's state in the last heartbeat (for the final one, written after the loop).
    probes: ProbeState,
}

impl HeartbeatState {
    /// Whether this heartbeat also goes into `events.jsonl` (the history the team view charts):
    /// the first, then at most every [`launch_spec::records::HEARTBEAT_EVENT_EVERY_S`].
    pub(crate) fn event_due(&mut self, now: std::time::Instant) -> bool {
        let every = std::time::Duration::from_secs(launch_spec::records::HEARTBEAT_EVENT_EVERY_S);
        let due = self.last_event.is_none_or(|last| now.saturating_duration_since(last) >= every);
        if due {
            self.last_event = Some(now);
        }
        due
    }

    /// The health probe's state the last heartbeat recorded.
    pub(crate) fn probes(&self) -> ProbeState {
        self.probes
    }

    pub(crate) fn next(
        &mut self,
        metrics: Option<Completions>,
        engine_log: &Path,
        run_dir: &Path,
        probes: ProbeState,
    ) -> Heartbeat {
        let from_log = self.access.update(engine_log);
        let completions = metrics.unwrap_or(from_log);
        let trials = self.trials.scan(run_dir);
        let tokens = self.engine.as_ref().map_or(0, |e| e.generation_tokens);
        let at = now();
        self.probes = probes;
        if self.last != Some((completions, trials, tokens)) {
            if self.last.is_some() || completions != Completions::default() || trials != Trials::default() || tokens > 0
            {
                self.last_progress_at = Some(at.clone());
            }
            self.last = Some((completions, trials, tokens));
        }
        Heartbeat {
            at,
            completions_ok: completions.ok,
            completions_4xx: completions.c4xx,
            completions_5xx: completions.c5xx,
            trials_started: trials.started,
            trials_finished: trials.finished,
            trials_errored: trials.errored,
            last_progress_at: self.last_progress_at.clone(),
            engine_healthy: probes.healthy,
            failed_probes: probes.failed,
            probe_limit: probes.limit,
            engine: self.engine.clone(),
        }
    }
}

/// Moves an existing log aside (`vllm.log` → `vllm.log.prev`, a plain file) so a resumed run's
/// counters and failure tail read only this run's lines.
pub(crate) fn rotate_log(path: &Path) {
    if path.exists() {
        let mut prev = path.as_os_str().to_owned();
        prev.push(".prev");
        let _ = std::fs::rename(path, PathBuf::from(prev));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_are_scrubbed_from_every_string_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut rec = super::Recorder::new(dir.path(), "t");
        let key = "sk-job-0123456789abcdef";
        rec.redact(["Qwen3", key, ""]);
        rec.status.node = Some(format!("VLLM_API_KEY={key}"));
        rec.write_status();
        rec.event(launch_spec::rundir::events::EngineSpawned {
            pid: 1,
            argv: vec![format!("env: VLLM_API_KEY={key} X=1"), "Qwen/Qwen3-8B".into(), "Qwen3".into()],
            port: 8000,
        });
        let status = std::fs::read_to_string(dir.path().join(super::STATUS_FILE)).unwrap();
        let events = std::fs::read_to_string(dir.path().join(super::EVENTS_FILE)).unwrap();
        for text in [&status, &events] {
            assert!(!text.contains(key), "{text}");
        }
        assert!(status.contains("VLLM_API_KEY=<redacted>"), "{status}");
        // A short secret only as a whole string: the model id keeps its name.
        assert!(events.contains(r#"["env: VLLM_API_KEY=<redacted> X=1","Qwen/Qwen3-8B","<redacted>"]"#), "{events}");
    }

    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_millis(951_782_400_123)), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_784_246_399)), "2026-07-16T23:59:59.000Z");
    }

    #[test]
    fn metrics_parsing() {
        let text = r#"# HELP http_requests_total Total number of requests by method, status and handler.
# TYPE http_requests_total counter
http_requests_total{handler="/v1/chat/completions",method="POST",status="2xx"} 41.0
http_requests_total{handler="/v1/chat/completions",method="POST",status="4xx"} 3.0
http_requests_total{handler="/v1/chat/completions",method="POST",status="5xx"} 1.0
http_requests_total{handler="/health",method="GET",status="2xx"} 900.0
"#;
        assert_eq!(completions_from_metrics(text), Some(Completions { ok: 41, c4xx: 3, c5xx: 1 }));
        assert_eq!(completions_from_metrics("vllm:num_requests_running 0\n"), None);
    }

    #[test]
    fn access_log_counting_is_incremental() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vllm.log");
        std::fs::write(
            &path,
            "INFO:     127.0.0.1:51234 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK\n\
             INFO:     127.0.0.1:51234 - \"GET /health HTTP/1.1\" 200 OK\n\
             INFO:     127.0.0.1:51235 - \"POST /v1/chat/completions HTTP/1.1\" 400 Bad Request\n\
             INFO:     127.0.0.1:51236 - \"POST /v1/chat/completions HTTP/1.1\" 200",
        )
        .unwrap();
        let mut c = AccessLogCounter::default();
        assert_eq!(c.update(&path), Completions { ok: 1, c4xx: 1, c5xx: 0 });
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b" OK\nINFO:     127.0.0.1:1 - \"POST /v1/chat/completions HTTP/1.1\" 500 Internal Server Error\n")
            .unwrap();
        assert_eq!(c.update(&path), Completions { ok: 2, c4xx: 1, c5xx: 1 });
    }

    #[test]
    fn access_log_skips_overlong_lines_and_bounds_each_update() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vllm.log");
        let ok = "INFO:     127.0.0.1:1 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK\n";
        let mut text = String::new();
        text.push_str(ok);
        text.push_str(&"y".repeat(MAX_LINE * 3));
        text.push_str(" \"POST /v1/chat/completions HTTP/1.1\" 500\n");
        text.push_str(ok);
        std::fs::write(&path, &text).unwrap();
        let mut c = AccessLogCounter::default();
        assert_eq!(c.update(&path), Completions { ok: 2, c4xx: 0, c5xx: 0 });
        // More than one update's worth: counted over several updates, never all at once.
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        let n = (MAX_LOG_BYTES_PER_UPDATE as usize / ok.len()) + 1000;
        f.write_all(ok.repeat(n).as_bytes()).unwrap();
        let first = c.update(&path).ok;
        assert!(first < 2 + n as u64, "one update read everything");
        let mut total = first;
        for _ in 0..100 {
            total = c.update(&path).ok;
        }
        assert_eq!(total, 2 + n as u64);
    }

    #[test]
    fn trial_scan_is_incremental_and_never_blocks_on_special_files() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        for t in ["t1", "t2"] {
            std::fs::create_dir(run.join(t)).unwrap();
            std::fs::write(run.join(t).join("config.json"), "{}").unwrap();
        }
        assert!(std::process::Command::new("mkfifo").arg(run.join("t2/result.json")).status().unwrap().success());
        let mut scan = TrialScan::default();
        let t0 = std::time::Instant::now();
        assert_eq!(scan.scan(run), Trials { started: 2, finished: 0, errored: 0 });
        assert!(t0.elapsed() < std::time::Duration::from_secs(2));
        std::fs::write(run.join("t1/result.json"), r#"{"exception_info": {"exception_type": "X"}}"#).unwrap();
        std::fs::create_dir(run.join("t3")).unwrap();
        std::fs::write(run.join("t3/config.json"), "{}").unwrap();
        assert_eq!(scan.scan(run), Trials { started: 3, finished: 1, errored: 1 });
        std::fs::remove_dir_all(run.join("t3")).unwrap();
        assert_eq!(scan.scan(run), Trials { started: 2, finished: 1, errored: 1 });
    }

    #[test]
    fn trial_counting() {
        use launch_spec::testkit::{Finished, HarborJob, RunDir, Stage, Trial};
        let now = chrono::Utc::now();
        let d = RunDir::temp("job");
        let run = d.path();
        d.job(&HarborJob::started("job", now, 4, None))
            .trial(&Trial::new("t1", Stage::Done(Finished::ok(now))))
            .trial(&Trial::new(
                "t2",
                Stage::Done(Finished { exception: Some("DaytonaError".into()), reward: None, ..Finished::ok(now) }),
            ))
            .trial(&Trial::new("t3", Stage::Running(now)));
        assert_eq!(count_trials(run), Trials { started: 3, finished: 2, errored: 1 });
        // Harbor 0.25's queued trial (lock.json, empty trial.log and subdirs) and a stray
        // subdirectory are not started trials.
        d.trial(&Trial::new("t4", Stage::Queued(now)));
        std::fs::create_dir(run.join("logs")).unwrap();
        assert_eq!(count_trials(run), Trials { started: 3, finished: 2, errored: 1 });
    }

    #[test]
    fn heartbeat_events_at_most_once_a_minute() {
        let mut hb = HeartbeatState::default();
        let t0 = std::time::Instant::now();
        let at = |s: u64| t0 + std::time::Duration::from_secs(s);
        let due: Vec<u64> =
            [0, 15, 30, 45, 60, 75, 119, 120, 200].into_iter().filter(|s| hb.event_due(at(*s))).collect();
        assert_eq!(due, [0, 60, 120, 200]);
    }

    #[test]
    fn status_is_replaced_atomically_and_events_append() {
        let dir = tempfile::tempdir().unwrap();
        let mut rec = Recorder::new(dir.path(), "tag");
        rec.set_phase(Phase::Serving);
        rec.event(launch_spec::rundir::events::PostRunSkipped { reason: "a test".into() });
        let status: RunStatus =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join(STATUS_FILE)).unwrap()).unwrap();
        assert_eq!(status.phase, Phase::Serving);
        let events = std::fs::read_to_string(dir.path().join(EVENTS_FILE)).unwrap();
        assert_eq!(events.lines().count(), 2);
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
        assert!(std::fs::read_dir(dir.path()).unwrap().all(|e| e.unwrap().file_type().unwrap().is_file()));
    }

    #[test]
    fn heartbeat_progress_time_moves_only_on_change() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("vllm.log");
        let mut hb = HeartbeatState::default();
        let first = hb.next(None, &log, dir.path(), super::ProbeState::default());
        assert!(first.last_progress_at.is_none());
        let second =
            hb.next(Some(Completions { ok: 1, c4xx: 0, c5xx: 0 }), &log, dir.path(), super::ProbeState::default());
        assert!(second.last_progress_at.is_some());
        assert_eq!(second.completions_ok, 1);
    }
}
