//! The engine log scanner: one pass over `vllm.log` at disk speed (large buffered reads, lines
//! split with `memchr`, no per-line allocation) counting uvicorn access lines for chat
//! completions by status class, with vLLM's own logger lines as time anchors. The one
//! access-line parser ([`completion_status`]) and the one [`Scanner`]: `check` runs it over a whole
//! file ([`scan_file`]), payload's heartbeat feeds it the lines appended since its last look.
//!
//! uvicorn access lines carry no timestamp
//! (`INFO:     127.0.0.1:54321 - "POST /v1/chat/completions HTTP/1.1" 200 OK`); vLLM's logger lines
//! do (`(APIServer pid=1) INFO 11-30 05:40:01 [loggers.py:123] Engine 000: Avg prompt throughput…`,
//! legacy `INFO 11-30 05:40:01 [api_server.py:1880] …`), and vLLM prints its throughput line every
//! 10 s while requests run. Each completion is counted in the minute of the last anchor before
//! it. Anchors have no year and no time zone: they give spans and per-minute rates, not instants.

use std::io::Read;
use std::path::Path;

use chrono::{DateTime, Datelike, Utc};
use memchr::memmem::Finder;
use serde::Serialize;

/// How many of the latest completions the "recent" shares are computed over.
pub const RECENT: usize = 200;

/// Buffer size of one read: small enough that what `read` just copied is still in the CPU's
/// cache when it is scanned (a 16 MiB buffer made the scan wait on memory).
const CHUNK: usize = 512 << 10;

/// What one pass over an engine log found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EngineLog {
    pub bytes: u64,
    pub lines: u64,
    /// Chat completions answered 2xx / 4xx / 5xx (others: 1xx, 3xx).
    pub ok: u64,
    pub c4xx: u64,
    pub c5xx: u64,
    pub c400: u64,
    pub other: u64,
    /// Anchor seconds (see the module docs) of the first and last vLLM logger line.
    pub first_anchor: Option<i64>,
    pub last_anchor: Option<i64>,
    /// Anchor of `Starting vLLM server on …` / `Starting vLLM API server … on …`.
    pub server_start: Option<i64>,
    /// Anchor in force at the first 200 and at the last completion.
    pub first_ok_anchor: Option<i64>,
    pub last_completion_anchor: Option<i64>,
    /// Completions per anchor minute: (minute, [2xx, 4xx, 5xx]), in log order.
    pub per_minute: Vec<(i64, [u64; 3])>,
    /// Status classes (2, 4, 5) of the last [`RECENT`] completions, oldest first.
    #[serde(skip)]
    pub recent: Vec<u8>,
    /// First examples, for evidence.
    pub example_400: Option<String>,
    pub example_5xx: Option<String>,
    /// First line naming a context-length overflow (`maximum context length`, `VLLMValidationError`).
    pub context_error: Option<String>,
    /// First line saying the engine died or failed to start.
    pub fatal: Option<String>,
    pub tracebacks: u64,
}

impl EngineLog {
    pub fn completions(&self) -> u64 {
        self.ok + self.c4xx + self.c5xx
    }

    /// (completions, 2xx, 4xx, 5xx) among the last [`RECENT`].
    pub fn recent_counts(&self) -> (u64, u64, u64, u64) {
        let mut c = [0u64; 6];
        for class in &self.recent {
            c[usize::from(*class).min(5)] += 1;
        }
        (self.recent.len() as u64, c[2], c[4], c[5])
    }

    /// Seconds between the server start (or first anchor) and the last anchor.
    pub fn anchored_span_s(&self) -> Option<i64> {
        Some(self.last_anchor? - self.server_start.or(self.first_anchor)?)
    }

    /// An anchor as an instant: anchors are the node's local time without a year, so the year is
    /// the one that puts the last anchor at or before `written` (the log's modification time, plus a
    /// day of slack for clock skew), and the local time zone is the checking machine's (keep login
    /// and compute nodes in one zone, as clusters do).
    pub fn anchor_instant(&self, anchor: i64, written: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let last = self.last_anchor?;
        let year_s = 365 * 86_400;
        let limit = written + chrono::Duration::days(1);
        let mut year = written.with_timezone(&chrono::Local).year();
        let mut last_at = local_instant(year, last.rem_euclid(year_s))?;
        if last_at > limit {
            year -= 1;
            last_at = local_instant(year, last.rem_euclid(year_s))?;
        }
        let wraps = last.div_euclid(year_s) - anchor.div_euclid(year_s);
        let at = local_instant(year - wraps as i32, anchor.rem_euclid(year_s))?;
        // Never after the last anchor's instant (a leap day folds onto 1 March).
        Some(at.min(last_at))
    }
}

/// Seconds since the start of a non-leap year (an anchor) → that local time in `year`.
fn local_instant(year: i32, of_year: i64) -> Option<DateTime<Utc>> {
    let day = of_year / 86_400;
    let month = MONTH_DAYS.iter().rposition(|start| *start <= day)?;
    let date = chrono::NaiveDate::from_ymd_opt(year, month as u32 + 1, (day - MONTH_DAYS[month] + 1) as u32)?;
    let secs = of_year % 86_400;
    let time = chrono::NaiveTime::from_num_seconds_from_midnight_opt(secs as u32, 0)?;
    let local = date.and_time(time).and_local_timezone(chrono::Local).earliest()?;
    Some(local.with_timezone(&Utc))
}

/// Scans `path`. `Ok(None)` when the file does not exist.
pub fn scan_file(path: &Path) -> std::io::Result<Option<EngineLog>> {
    // A regular file (never a FIFO or device, never through a symlink): `check` must not hang.
    let mut file = match crate::fsread::open_regular(path, crate::fsread::Links::Refuse) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut scanner = Scanner::new();
    let mut buf = vec![0u8; CHUNK];
    let mut filled = 0usize;
    // Inside a line longer than the buffer: it is skipped up to its newline (no access line is
    // that long), so memory stays one buffer whatever the file holds.
    let mut skipping = false;
    loop {
        let n = file.read(&mut buf[filled..])?;
        if n == 0 {
            if filled > 0 && !skipping {
                scanner.line(&buf[..filled]);
            }
            break;
        }
        scanner.add_bytes(n as u64);
        filled += n;
        let Some(last_nl) = memchr::memrchr(b'\n', &buf[..filled]) else {
            if filled == buf.len() {
                skipping = true;
                filled = 0;
            }
            continue;
        };
        let start = if skipping { memchr::memchr(b'\n', &buf[..filled]).map_or(0, |i| i + 1) } else { 0 };
        skipping = false;
        scanner.lines(&buf[start..last_nl + 1]);
        buf.copy_within(last_nl + 1..filled, 0);
        filled -= last_nl + 1;
    }
    Ok(Some(scanner.finish()))
}

/// Scans text already in memory (tests, small logs).
pub fn scan_bytes(data: &[u8]) -> EngineLog {
    let mut scanner = Scanner::new();
    scanner.add_bytes(data.len() as u64);
    let end = memchr::memrchr(b'\n', data).map_or(0, |i| i + 1);
    scanner.lines(&data[..end]);
    if end < data.len() {
        scanner.line(&data[end..]);
    }
    scanner.finish()
}

/// The scanner's state: feed it whole lines ([`Scanner::lines`], [`Scanner::line`]), read the
/// counts so far ([`Scanner::log`]), or take the result ([`Scanner::finish`]).
pub struct Scanner {
    log: EngineLog,
    anchor: Option<i64>,
    /// Year carry for anchors (they have no year): seconds added after a wrap past New Year.
    year_offset: i64,
    bucket: Option<(i64, [u64; 3])>,
    ring: [u8; RECENT],
    ring_len: usize,
    ring_head: usize,
    context: Finder<'static>,
    context2: Finder<'static>,
    dead: Finder<'static>,
    init_failed: Finder<'static>,
    oom: Finder<'static>,
    starting: Finder<'static>,
}

const LEVELS: [&[u8]; 5] = [b"INFO ", b"WARNING ", b"ERROR ", b"DEBUG ", b"CRITICAL "];
const COMPLETIONS: &[u8] = b"POST /v1/chat/completions ";
const ACCESS_PREFIX: &[u8] = b"INFO:     ";
const TRACEBACK: &[u8] = b"Traceback (most recent call last)";

/// The one access-line parser: the status code of a uvicorn access line for a chat completion,
/// `INFO:     127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 200 OK`, also behind vLLM's
/// `(APIServer pid=N) ` prefix. `None` for any other line (a `GET /health`, a logger line).
#[inline]
pub fn completion_status(line: &[u8]) -> Option<u16> {
    access_status(strip_process_prefix(line).strip_prefix(ACCESS_PREFIX)?)
}

/// The one access-line writer (what uvicorn prints, and what the vLLM stand-in prints):
/// `INFO:     127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 200 OK`.
pub fn access_line(peer: &str, method: &str, path: &str, http: (u8, u8), status: u16, reason: &str) -> String {
    format!("INFO:     {peer} - \"{method} {path} HTTP/{}.{}\" {status} {reason}", http.0, http.1)
}

/// `(APIServer pid=N) rest` → `rest` (vLLM ≥ 0.10 prefixes every line of its API process).
#[inline]
fn strip_process_prefix(line: &[u8]) -> &[u8] {
    if line.first() == Some(&b'(')
        && let Some(close) = memchr::memchr(b')', line)
    {
        let rest = &line[close + 1..];
        return rest.strip_prefix(b" ").unwrap_or(rest);
    }
    line
}

/// After `INFO:     `: `client - "POST /v1/chat/completions HTTP/1.1" 200 …`.
#[inline]
fn access_status(after_prefix: &[u8]) -> Option<u16> {
    access_status_end(after_prefix).map(|(code, _)| code)
}

/// [`access_status`] and the offset just after the status code. The request must not contain a
/// newline (the line ends before it otherwise).
#[inline]
fn access_status_end(after_prefix: &[u8]) -> Option<(u16, usize)> {
    // The spans searched here are a client address and `HTTP/1.1`, a few bytes each: a plain
    // loop beats setting up a vector search.
    let q = after_prefix.iter().position(|b| *b == b'"' || *b == b'\n')?;
    if after_prefix[q] != b'"' {
        return None;
    }
    let request = after_prefix[q + 1..].strip_prefix(COMPLETIONS)?;
    let q2 = request.iter().position(|b| *b == b'"' || *b == b'\n')?;
    if request[q2] != b'"' {
        return None;
    }
    let tail = &request[q2 + 1..];
    let digits = &tail[tail.iter().take_while(|b| **b == b' ' || **b == b'\t').count()..];
    if digits.len() < 3 || !digits[..3].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let end = q + 1 + COMPLETIONS.len() + q2 + 1 + (tail.len() - digits.len()) + 3;
    Some((u16::from(digits[0] - b'0') * 100 + u16::from(digits[1] - b'0') * 10 + u16::from(digits[2] - b'0'), end))
}

impl Default for Scanner {
    fn default() -> Self {
        Self::new()
    }
}

impl Scanner {
    pub fn new() -> Self {
        Scanner {
            log: EngineLog::default(),
            anchor: None,
            year_offset: 0,
            bucket: None,
            ring: [0; RECENT],
            ring_len: 0,
            ring_head: 0,
            context: Finder::new("maximum context length"),
            context2: Finder::new("VLLMValidationError"),
            dead: Finder::new("EngineDeadError"),
            init_failed: Finder::new("Engine core initialization failed"),
            oom: Finder::new("CUDA out of memory"),
            starting: Finder::new("Starting vLLM"),
        }
    }

    /// What was counted so far.
    pub fn log(&self) -> &EngineLog {
        &self.log
    }

    /// Counts `n` bytes as read (the caller feeds the lines).
    pub fn add_bytes(&mut self, n: u64) {
        self.log.bytes += n;
    }

    /// Feeds the whole lines of `data` (a partial line after its last newline is left alone).
    ///
    /// Access lines are most lines of a busy log, so a bare one (`INFO:     …`) is parsed where it
    /// starts and its end is looked for only after its status code; every other line is split
    /// with `memchr` and goes through [`Scanner::line`]. Same result as feeding each line.
    pub fn lines(&mut self, data: &[u8]) {
        let mut pos = 0;
        while pos < data.len() {
            let rest = &data[pos..];
            if let Some(after) = rest.strip_prefix(ACCESS_PREFIX)
                && let Some((code, status_end)) = access_status_end(after)
            {
                let from = ACCESS_PREFIX.len() + status_end;
                // The reason phrase: a few bytes.
                let Some(nl) = rest[from..].iter().position(|b| *b == b'\n') else { return };
                let line = &rest[..from + nl];
                self.log.lines += 1;
                self.completion(code, line.strip_suffix(b"\r").unwrap_or(line));
                pos += from + nl + 1;
                continue;
            }
            let Some(nl) = memchr::memchr(b'\n', rest) else { return };
            self.line(&rest[..nl]);
            pos += nl + 1;
        }
    }

    /// Feeds one line (without its newline).
    #[inline]
    pub fn line(&mut self, line: &[u8]) {
        self.log.lines += 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let rest = strip_process_prefix(line);
        match rest.first() {
            // A traceback's frames and code lines (indented) and blank lines carry nothing this
            // scanner looks for; tracebacks are most of the lines of a log with many 400s, so
            // they are passed over after one byte.
            None | Some(b' ') | Some(b'\t') => {}
            Some(b'I') if rest.starts_with(ACCESS_PREFIX) => {
                if let Some(code) = access_status(&rest[ACCESS_PREFIX.len()..]) {
                    self.completion(code, line);
                }
            }
            Some(b'T') if rest.starts_with(TRACEBACK) => self.log.tracebacks += 1,
            _ => self.logger(line, rest),
        }
    }

    #[inline]
    fn completion(&mut self, code: u16, line: &[u8]) {
        let class = (code / 100) as u8;
        match class {
            2 => {
                self.log.ok += 1;
                if self.log.first_ok_anchor.is_none() {
                    self.log.first_ok_anchor = self.anchor;
                }
            }
            4 => {
                self.log.c4xx += 1;
                if code == 400 {
                    self.log.c400 += 1;
                    if self.log.example_400.is_none() {
                        self.log.example_400 = Some(String::from_utf8_lossy(strip_process_prefix(line)).into_owned());
                    }
                }
            }
            5 => {
                self.log.c5xx += 1;
                if self.log.example_5xx.is_none() {
                    self.log.example_5xx = Some(String::from_utf8_lossy(strip_process_prefix(line)).into_owned());
                }
            }
            _ => {
                self.log.other += 1;
                return;
            }
        }
        self.log.last_completion_anchor = self.anchor;
        if let Some((_, counts)) = &mut self.bucket {
            counts[match class {
                2 => 0,
                4 => 1,
                _ => 2,
            }] += 1;
        }
        self.ring[self.ring_head] = class;
        self.ring_head = (self.ring_head + 1) % RECENT;
        self.ring_len = (self.ring_len + 1).min(RECENT);
    }

    /// A non-access, non-indented line: maybe a vLLM logger line (an anchor), maybe an error
    /// worth quoting (an `ERROR` line or a traceback's last line, `…Error: message`).
    fn logger(&mut self, line: &[u8], rest: &[u8]) {
        if let Some(level) = LEVELS.iter().find(|l| rest.starts_with(l))
            && let Some(at) = parse_anchor(&rest[level.len()..])
        {
            self.set_anchor(at);
            if self.log.server_start.is_none() && self.starting.find(rest).is_some() {
                self.log.server_start = self.anchor;
            }
            // vLLM's periodic INFO lines (throughput, every 10 s) never name an error.
            if level[0] == b'I' {
                return;
            }
        }
        if self.log.context_error.is_none() && (self.context.find(line).is_some() || self.context2.find(line).is_some())
        {
            self.log.context_error = Some(clip(line));
        }
        if self.log.fatal.is_none()
            && (self.dead.find(line).is_some()
                || self.init_failed.find(line).is_some()
                || self.oom.find(line).is_some())
        {
            self.log.fatal = Some(clip(line));
        }
    }

    fn set_anchor(&mut self, raw: i64) {
        let mut at = raw + self.year_offset;
        if let Some(prev) = self.anchor
            && at < prev - 180 * 86_400
        {
            self.year_offset += 365 * 86_400;
            at = raw + self.year_offset;
        }
        self.anchor = Some(at);
        self.log.first_anchor.get_or_insert(at);
        self.log.last_anchor = Some(at);
        let minute = at.div_euclid(60);
        match &self.bucket {
            Some((m, _)) if *m == minute => {}
            _ => {
                if let Some(done) = self.bucket.take()
                    && done.1 != [0; 3]
                {
                    self.log.per_minute.push(done);
                }
                self.bucket = Some((minute, [0; 3]));
            }
        }
    }

    pub fn finish(mut self) -> EngineLog {
        if let Some(done) = self.bucket.take()
            && done.1 != [0; 3]
        {
            self.log.per_minute.push(done);
        }
        let start = if self.ring_len < RECENT { 0 } else { self.ring_head };
        self.log.recent = (0..self.ring_len).map(|i| self.ring[(start + i) % RECENT]).collect();
        self.log
    }
}

fn clip(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    if text.chars().count() > 300 { text.chars().take(300).collect::<String>() + "…" } else { text.to_string() }
}

/// Cumulative days before each month (non-leap year).
const MONTH_DAYS: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];

/// `MM-DD HH:MM:SS` → seconds since the start of a (non-leap) year.
fn parse_anchor(text: &[u8]) -> Option<i64> {
    let t = text.get(..14)?;
    if t[2] != b'-' || t[5] != b' ' || t[8] != b':' || t[11] != b':' {
        return None;
    }
    let num = |a: usize| -> Option<i64> {
        let (x, y) = (t[a], t[a + 1]);
        (x.is_ascii_digit() && y.is_ascii_digit()).then(|| i64::from(x - b'0') * 10 + i64::from(y - b'0'))
    };
    let (month, day, h, m, s) = (num(0)?, num(3)?, num(6)?, num(9)?, num(12)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    Some((MONTH_DAYS[(month - 1) as usize] + day - 1) * 86_400 + h * 3600 + m * 60 + s)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
(APIServer pid=4242) INFO 11-30 05:40:01 [startup.py:33] vLLM server version 0.33.0, serving model Qwen/Qwen3-8B
(APIServer pid=4242) INFO 11-30 05:40:02 [entry.py:139] Starting vLLM server on http://127.0.0.1:8000
INFO:     Started server process [4242]
INFO:     127.0.0.1:54321 - \"GET /health HTTP/1.1\" 200 OK
INFO:     127.0.0.1:54321 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK
INFO:     127.0.0.1:54322 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK
(APIServer pid=4242) INFO 11-30 05:41:12 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s, Running: 2 reqs
INFO:     127.0.0.1:54323 - \"POST /v1/chat/completions HTTP/1.1\" 400 Bad Request
(APIServer pid=4242) ERROR 11-30 05:41:13 [serving.py:10] VLLMValidationError: This model's maximum context length is 32768 tokens
INFO:     127.0.0.1:54324 - \"POST /v1/chat/completions HTTP/1.1\" 500 Internal Server Error
INFO 11-30 05:43:02 [api_server.py:1880] legacy anchor
INFO:     127.0.0.1:54325 - \"POST /v1/chat/completions HTTP/1.1\" 200";

    #[test]
    fn counts_classes_anchors_and_examples() {
        let log = scan_bytes(LOG.as_bytes());
        assert_eq!((log.ok, log.c4xx, log.c5xx, log.c400), (3, 1, 1, 1));
        assert_eq!(log.lines, 12);
        assert_eq!(log.anchored_span_s(), Some(180));
        assert_eq!(log.server_start.unwrap() - log.first_anchor.unwrap(), 1);
        assert!(log.example_400.as_deref().unwrap().contains("400 Bad Request"));
        assert!(log.context_error.as_deref().unwrap().contains("maximum context length"));
        assert_eq!(log.per_minute.iter().map(|(_, c)| c.iter().sum::<u64>()).sum::<u64>(), 5);
        assert_eq!(log.recent, vec![2, 2, 4, 5, 2]);
        assert_eq!(log.recent_counts(), (5, 3, 1, 1));
    }

    #[test]
    fn file_scan_matches_in_memory_scan_across_chunk_edges() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vllm.log");
        let mut text = String::new();
        for i in 0..5000 {
            if i % 97 == 0 {
                text += &format!("(APIServer pid=1) INFO 12-31 23:{:02}:00 [x.py:1] tick\n", (i / 97) % 60);
            }
            text += &format!(
                "INFO:     127.0.0.1:{} - \"POST /v1/chat/completions HTTP/1.1\" {} OK\n",
                1000 + i,
                if i % 10 == 0 { 400 } else { 200 }
            );
        }
        std::fs::write(&path, &text).unwrap();
        let from_file = scan_file(&path).unwrap().unwrap();
        assert_eq!(from_file, scan_bytes(text.as_bytes()));
        assert_eq!((from_file.ok, from_file.c400), (4500, 500));
        assert!(scan_file(&dir.path().join("missing.log")).unwrap().is_none());
    }

    #[test]
    fn the_writer_and_the_parser_agree() {
        let line = access_line("127.0.0.1:5000", "POST", "/v1/chat/completions", (1, 1), 400, "Bad Request");
        assert_eq!(line, "INFO:     127.0.0.1:5000 - \"POST /v1/chat/completions HTTP/1.1\" 400 Bad Request");
        assert_eq!(completion_status(line.as_bytes()), Some(400));
        assert_eq!(completion_status(format!("(APIServer pid=7) {line}").as_bytes()), Some(400));
        let health = access_line("127.0.0.1:5000", "GET", "/health", (1, 1), 200, "OK");
        assert_eq!(completion_status(health.as_bytes()), None);
    }

    #[test]
    fn tracebacks_are_counted_and_their_frames_passed_over() {
        let text = "INFO:     1.2.3.4:5 - \"POST /v1/chat/completions HTTP/1.1\" 400 Bad Request\n\
                    (APIServer pid=1) ERROR 11-30 05:41:13 [serving_chat.py:212] Error in preprocessing prompt inputs\n\
                    (APIServer pid=1) Traceback (most recent call last):\n\
                    (APIServer pid=1)   File \"x.py\", line 1, in f EngineDeadError\n\
                    (APIServer pid=1)     raise VLLMValidationError(\n\
                    (APIServer pid=1) vllm.exceptions.VLLMValidationError: This model's maximum context length is 32768 tokens\n";
        let log = scan_bytes(text.as_bytes());
        assert_eq!((log.c400, log.tracebacks, log.lines), (1, 1, 6));
        assert!(log.context_error.as_deref().unwrap().contains("maximum context length"));
        assert_eq!(log.fatal, None, "a frame line naming an error is not the engine dying");
        assert_eq!(log.example_400.as_deref().map(|l| l.starts_with("INFO:     1.2.3.4:5")), Some(true));
    }

    #[test]
    fn the_fast_path_counts_as_feeding_each_line() {
        let mut text = String::from(LOG);
        text += "\nINFO:     1.2.3.4:5 - \"POST /v1/chat/completions HTTP/1.1\"\n200 OK\n";
        text += "INFO:     1.2.3.4:5 - \"POST /v1/chat/completions HTTP/1.1\"   201 Created\r\n";
        text += "INFO:     1.2.3.4:5 - \"GET /v1/models HTTP/1.1\" 200 OK\n(APIServer pid=1) INFO:     x - \"POST /v1/chat/completions HTTP/1.1\" 503\n";
        let whole = scan_bytes(text.as_bytes());
        let mut one = Scanner::new();
        one.add_bytes(text.len() as u64);
        for line in text.split_terminator('\n') {
            one.line(line.as_bytes());
        }
        assert_eq!(whole, one.finish());
        assert_eq!((whole.ok, whole.c5xx), (4, 2), "{whole:?}");
    }

    #[test]
    fn anchors_become_instants_in_the_year_the_log_was_written() {
        let log = scan_bytes(b"INFO 12-31 23:59:00 [a.py:1] x\nINFO 01-01 00:01:00 [a.py:1] y\n");
        let written = chrono::NaiveDate::from_ymd_opt(2027, 1, 1)
            .unwrap()
            .and_hms_opt(0, 5, 0)
            .unwrap()
            .and_local_timezone(chrono::Local)
            .unwrap()
            .with_timezone(&Utc);
        let last = log.anchor_instant(log.last_anchor.unwrap(), written).unwrap();
        let first = log.anchor_instant(log.first_anchor.unwrap(), written).unwrap();
        assert_eq!((written - last).num_seconds(), 240);
        assert_eq!((last - first).num_seconds(), 120, "across New Year");
    }

    #[test]
    fn anchors_wrap_past_new_year() {
        let text = "INFO 12-31 23:59:00 [a.py:1] x\nINFO 01-01 00:01:00 [a.py:1] y\n";
        assert_eq!(scan_bytes(text.as_bytes()).anchored_span_s(), Some(120));
        assert_eq!(parse_anchor(b"13-01 00:00:00"), None);
        assert_eq!(parse_anchor(b"01-01 00:00:07 ["), Some(7));
    }
}
