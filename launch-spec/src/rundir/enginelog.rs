//! The engine log scanner: one pass over `vllm.log` at disk speed (large buffered reads, lines
//! split with `memchr`, no per-line allocation; a big log in parts on several threads, joined
//! into the single pass's result) counting uvicorn access lines for chat
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

use std::os::unix::fs::FileExt;
use std::path::Path;

use chrono::{DateTime, Datelike, Utc};
use memchr::memmem::Finder;

use super::vocab;
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

/// Logs at least twice this size are scanned in parts, one thread each: on a busy node the
/// engine log is the biggest file `check` reads, and its lines are independent but for the
/// anchor in force, which the join supplies ([`Scanner::absorb`]).
const MIN_PART: u64 = 64 << 20;
/// At most this many parts (threads) for one log.
const MAX_PARTS: usize = 4;

/// Scans `path`. `Ok(None)` when the file does not exist.
///
/// A big log is cut at line starts into up to [`MAX_PARTS`] parts (no more than the machine's
/// cores) scanned side by side; the result is the one a single pass gives (tested).
pub fn scan_file(path: &Path) -> std::io::Result<Option<EngineLog>> {
    let parts = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_PARTS);
    scan_file_in_parts(path, parts, MIN_PART)
}

/// [`scan_file`] in at most `parts` parts of at least `min_part` bytes.
fn scan_file_in_parts(path: &Path, parts: usize, min_part: u64) -> std::io::Result<Option<EngineLog>> {
    // A regular file (never a FIFO or device, never through a symlink): `check` must not hang.
    let file = match crate::fsread::open_regular(path, crate::fsread::Links::Refuse) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let (first, rest) =
        plan_parts(&file, len, parts.min(usize::try_from(len / min_part.max(1)).unwrap_or(usize::MAX)))?;
    let scan = |part: &Part, mut scanner: Scanner| scan_part(&file, part, &mut scanner).map(|()| scanner);
    let scanner = std::thread::scope(|scope| -> std::io::Result<Scanner> {
        // A part whose thread cannot be started is scanned here, after the first.
        let later: Vec<_> = rest
            .iter()
            .map(|part| {
                let thread = std::thread::Builder::new().spawn_scoped(scope, move || scan(part, Scanner::continuing()));
                (part, thread.ok())
            })
            .collect();
        let mut scanner = scan(&first, Scanner::new())?;
        for (part, thread) in later {
            let next = match thread {
                Some(handle) => handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?,
                None => scan(part, Scanner::continuing())?,
            };
            scanner.absorb(next);
        }
        Ok(scanner)
    })?;
    Ok(Some(scanner.finish()))
}

/// A byte range of the log scanned by one thread.
#[derive(Debug, Clone, PartialEq)]
struct Part {
    start: u64,
    /// `None`: to the end of the file, however long it has grown meanwhile.
    end: Option<u64>,
    /// The range starts (or ends) inside a line of at least [`CHUNK`] bytes: one the single
    /// pass skips too (see [`scan_part`]), so the part drops its piece of it.
    starts_mid_line: bool,
    ends_mid_line: bool,
}

/// Cuts `[0, len)` into up to `parts` ranges (the first, then the others), each cut at the first
/// line start at or after an even split; where no newline follows within [`CHUNK`] bytes the cut
/// falls inside that (too long, skipped) line.
fn plan_parts(file: &std::fs::File, len: u64, parts: usize) -> std::io::Result<(Part, Vec<Part>)> {
    let mut cuts: Vec<(u64, bool)> = Vec::new();
    let mut window = vec![0u8; CHUNK];
    for i in 1..parts.max(1) as u64 {
        let nominal = len / parts as u64 * i;
        let from = nominal.saturating_sub(1);
        let got = read_full_at(file, &mut window, from)?;
        let cut = match memchr::memchr(b'\n', &window[..got]) {
            Some(nl) => (from + nl as u64 + 1, false),
            // The line runs on past the window: at least CHUNK bytes, so it is skipped.
            None if got == window.len() => (nominal, true),
            // The file ends (it shrank) within the window: no cut here.
            None => continue,
        };
        if cut.0 > 0 && cut.0 < len && cuts.last().is_none_or(|last| cut.0 > last.0) {
            cuts.push(cut);
        }
    }
    let starts = std::iter::once((0, false)).chain(cuts.iter().copied());
    let ends = cuts.iter().map(|&(at, mid)| (Some(at), mid)).chain(std::iter::once((None, false)));
    let mut all = starts.zip(ends).map(|((start, starts_mid_line), (end, ends_mid_line))| Part {
        start,
        end,
        starts_mid_line,
        ends_mid_line,
    });
    let first = all.next().unwrap_or(Part { start: 0, end: None, starts_mid_line: false, ends_mid_line: false });
    Ok((first, all.collect()))
}

/// Reads up to `buf.len()` bytes at `at` (fewer only at the end of the file).
fn read_full_at(file: &std::fs::File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Feeds the lines of one part to `scanner`, one buffer of [`CHUNK`] bytes at a time.
fn scan_part(file: &std::fs::File, part: &Part, scanner: &mut Scanner) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut pos = part.start;
    let mut filled = 0usize;
    // Inside a line longer than the buffer: it is skipped up to its newline (no access line is
    // that long), so memory stays one buffer whatever the file holds.
    let mut skipping = part.starts_mid_line;
    loop {
        // Inside a skipped line, a hole of a sparse file (all NUL bytes, no newline) is jumped
        // over, not read: a 20 GB sparse log is otherwise 20 GB of zeros copied (issue 21).
        if skipping {
            let next = next_data(file, pos, part.end);
            scanner.add_bytes(next - pos);
            pos = next;
        }
        // (The buffer always has room here: a full one without a newline was emptied below.)
        let room = buf.len() - filled;
        let want = part.end.map_or(room, |end| room.min(usize::try_from(end - pos).unwrap_or(usize::MAX)));
        let n = if want == 0 {
            0
        } else {
            match file.read_at(&mut buf[filled..filled + want], pos) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            if filled > 0 && !skipping && !part.ends_mid_line {
                scanner.line(&buf[..filled]);
            }
            return Ok(());
        }
        pos += n as u64;
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
}

/// The first offset at or after `pos` (and before `end`) that holds data: `pos` itself unless it is
/// in a hole of a sparse file. A filesystem without `SEEK_DATA` reads as all data.
fn next_data(file: &std::fs::File, pos: u64, end: Option<u64>) -> u64 {
    use nix::unistd::{Whence, lseek};
    let Ok(at) = i64::try_from(pos) else { return pos };
    let next = match lseek(file, at, Whence::SeekData) {
        Ok(data) => u64::try_from(data).unwrap_or(pos),
        // ENXIO: no data from `pos` on (a hole up to the end of the file).
        Err(nix::errno::Errno::ENXIO) => file.metadata().map_or(pos, |m| m.len()),
        Err(_) => pos,
    };
    end.map_or(next, |end| next.min(end)).max(pos)
}

#[cfg(test)] // used only by the tests
/// Scans text already in memory (tests, small logs).
pub(crate) fn scan_bytes(data: &[u8]) -> EngineLog {
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
    /// A scanner of a later part of a file ([`Scanner::continuing`]) that has not met an anchor
    /// yet: the anchor in force is the previous part's, known only when the parts are joined.
    inherited: bool,
    seam: Seam,
    context: Finder<'static>,
    context2: Finder<'static>,
    /// Prefilters for [`vocab::is_engine_fatal`]: every fatal phrase, in any case vLLM and torch
    /// print it, holds one of these (`EngineDeadError`, `… initialization failed`, `…Memory…`).
    fatal_hints: [Finder<'static>; 3],
    starting: Finder<'static>,
}

/// What joining a later part to the scan before it ([`Scanner::absorb`]) needs to know about the
/// part's start, where the anchor in force was not yet known.
#[derive(Debug, Clone, Default)]
struct Seam {
    /// Started by [`Scanner::continuing`].
    continuing: bool,
    /// Completions (2xx, 4xx, 5xx) before the part's first anchor: they count in the previous
    /// part's open minute.
    lead: [u64; 3],
    /// A 2xx before the first anchor (the first 200's anchor may be the previous part's).
    lead_ok: bool,
    /// The last completion so far came before the part's first anchor.
    last_in_lead: bool,
    /// The part's first minute bucket was closed: it is `per_minute[0]`, kept even when empty,
    /// because the previous part's open minute may be the same one.
    first_closed: bool,
}

/// How pydantic indents the message of a validation error (vLLM's config checks raise them).
const PYDANTIC_VALUE_ERROR: &[u8] = b"  Value error, ";

const LEVELS: [&[u8]; 5] = [b"INFO ", b"WARNING ", b"ERROR ", b"DEBUG ", b"CRITICAL "];
const COMPLETIONS: &[u8] = b"POST /v1/chat/completions ";
const ACCESS_PREFIX: &[u8] = b"INFO:     ";
const TRACEBACK: &[u8] = b"Traceback (most recent call last)";

#[cfg(test)] // used only by the tests
/// The one access-line parser: the status code of a uvicorn access line for a chat completion,
/// `INFO:     127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 200 OK`, also behind vLLM's
/// `(APIServer pid=N) ` prefix. `None` for any other line (a `GET /health`, a logger line).
#[inline]
pub(crate) fn completion_status(line: &[u8]) -> Option<u16> {
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
        && let Some(close) = find2(line, b')', b')')
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
    let q = find2(after_prefix, b'"', b'\n')?;
    if after_prefix[q] != b'"' {
        return None;
    }
    let request = after_prefix[q + 1..].strip_prefix(COMPLETIONS)?;
    let q2 = find2(request, b'"', b'\n')?;
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

/// The first `a` or `b` in `s`, eight bytes per step in a plain `u64` (the "has a zero byte"
/// trick). Hand-written because the spans searched — a client address, `HTTP/1.1`, a reason
/// phrase, the `(APIServer pid=N)` prefix — are a few bytes in every line of the log: too short
/// for a vector search (`memchr2`) to pay for its setup, and a byte loop was a third of the scan.
#[inline(always)]
fn find2(s: &[u8], a: u8, b: u8) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let (qa, qb) = (LO * u64::from(a), LO * u64::from(b));
    let mut at = 0;
    while let Some(word) = s[at..].first_chunk::<8>() {
        let (xa, xb) = (u64::from_le_bytes(*word) ^ qa, u64::from_le_bytes(*word) ^ qb);
        // A set high bit marks a zero byte of `xa` or `xb` (a match); the lowest one is exact
        // (borrows only mark bytes above a true match).
        let hits = (xa.wrapping_sub(LO) & !xa | xb.wrapping_sub(LO) & !xb) & HI;
        if hits != 0 {
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    s[at..].iter().position(|c| *c == a || *c == b).map(|p| at + p)
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
            inherited: false,
            seam: Seam::default(),
            context: Finder::new("maximum context length"),
            context2: Finder::new("VLLMValidationError"),
            fatal_hints: [Finder::new("rror"), Finder::new("ailed"), Finder::new("emory")],
            starting: Finder::new("Starting vLLM"),
        }
    }

    /// A scanner for a later part of a file, to be joined to the scan of what precedes it with
    /// [`Scanner::absorb`].
    pub fn continuing() -> Self {
        Scanner { inherited: true, seam: Seam { continuing: true, ..Seam::default() }, ..Scanner::new() }
    }

    /// Joins the scan of the part that follows (started with [`Scanner::continuing`] and fed the
    /// lines right after this scanner's): the state is then the one feeding those lines here
    /// would have left — same counts, anchors (year carry included), minute buckets, latest
    /// completions and first examples.
    pub(crate) fn absorb(&mut self, next: Scanner) {
        debug_assert!(next.seam.continuing, "absorb takes a Scanner::continuing()");
        let Scanner { log: n, seam, bucket: next_bucket, .. } = &next;
        let log = &mut self.log;
        log.bytes += n.bytes;
        log.lines += n.lines;
        log.ok += n.ok;
        log.c4xx += n.c4xx;
        log.c5xx += n.c5xx;
        log.c400 += n.c400;
        log.other += n.other;
        log.tracebacks += n.tracebacks;
        for (mine, theirs) in [
            (&mut log.example_400, &n.example_400),
            (&mut log.example_5xx, &n.example_5xx),
            (&mut log.context_error, &n.context_error),
            (&mut log.fatal, &n.fatal),
        ] {
            if mine.is_none() {
                mine.clone_from(theirs);
            }
        }
        let start = if next.ring_len < RECENT { 0 } else { next.ring_head };
        for i in 0..next.ring_len {
            self.push_recent(next.ring[(start + i) % RECENT]);
        }
        // The part's lead ran under this scanner's last anchor (and minute bucket).
        if let Some((_, counts)) = &mut self.bucket {
            for (c, l) in counts.iter_mut().zip(seam.lead) {
                *c += l;
            }
        }
        let log = &mut self.log;
        if log.first_ok_anchor.is_none() && seam.lead_ok {
            log.first_ok_anchor = self.anchor;
        }
        let had_completion = n.ok + n.c4xx + n.c5xx > 0;
        if had_completion && seam.last_in_lead {
            log.last_completion_anchor = self.anchor;
        }
        let Some(first) = n.first_anchor else { return };
        // The part's anchors carry years from its own start: add this scanner's carry, and a
        // year more where its first anchor wraps past New Year from this scanner's last.
        let mut shift = self.year_offset;
        if let Some(prev) = self.anchor
            && first + shift < prev - 180 * 86_400
        {
            shift += 365 * 86_400;
        }
        let at = |a: Option<i64>| a.map(|a| a + shift);
        let minute = |(m, c): (i64, [u64; 3])| (m + shift / 60, c);
        if log.first_ok_anchor.is_none() {
            log.first_ok_anchor = at(n.first_ok_anchor);
        }
        if had_completion && !seam.last_in_lead {
            log.last_completion_anchor = at(n.last_completion_anchor);
        }
        log.first_anchor.get_or_insert(first + shift);
        log.last_anchor = at(n.last_anchor);
        if log.server_start.is_none() {
            log.server_start = at(n.server_start);
        }
        self.anchor = at(next.anchor);
        self.year_offset = shift + next.year_offset;
        // Minute buckets: this scanner's open one continues into the part's first when both are
        // the same minute (as `set_anchor` would have kept it open), else it is closed.
        let mut closed: Vec<(i64, [u64; 3])> = n.per_minute.iter().copied().map(minute).collect();
        let mut open = next_bucket.map(minute);
        if let Some((m, counts)) = self.bucket.take() {
            let first_bucket = if seam.first_closed { closed.first_mut() } else { open.as_mut() };
            match first_bucket {
                Some((fm, fc)) if *fm == m => {
                    for (f, c) in fc.iter_mut().zip(counts) {
                        *f += c;
                    }
                }
                _ if counts != [0; 3] => log.per_minute.push((m, counts)),
                _ => {}
            }
        }
        if seam.first_closed && closed.first().is_some_and(|(_, c)| *c == [0; 3]) {
            closed.remove(0);
        }
        log.per_minute.extend(closed);
        self.bucket = open;
    }

    /// What was counted so far.
    pub fn log(&self) -> &EngineLog {
        &self.log
    }

    /// Counts `n` bytes as read (the caller feeds the lines).
    pub(crate) fn add_bytes(&mut self, n: u64) {
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
                let Some(nl) = find2(&rest[from..], b'\n', b'\n') else { return };
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
            // pydantic's message line of a config ValidationError is indented
            // (`  Value error, User-specified max_model_len …`): the one indented line that names
            // why vLLM did not start.
            Some(b' ') if rest.starts_with(PYDANTIC_VALUE_ERROR) => self.logger(line, rest),
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
        let slot = match class {
            2 => 0,
            4 => 1,
            _ => 2,
        };
        if let Some((_, counts)) = &mut self.bucket {
            counts[slot] += 1;
        } else if self.inherited {
            self.seam.lead[slot] += 1;
            self.seam.lead_ok |= class == 2;
        }
        self.seam.last_in_lead = self.inherited;
        self.push_recent(class);
    }

    #[inline]
    fn push_recent(&mut self, class: u8) {
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
            && self.fatal_hints.iter().any(|f| f.find(line).is_some())
            && vocab::is_engine_fatal(&String::from_utf8_lossy(line))
        {
            self.log.fatal = Some(clip(line));
        }
    }

    fn set_anchor(&mut self, raw: i64) {
        self.inherited = false;
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
                // A continuing part keeps its first bucket even when empty (see `Seam`).
                let keep = self.seam.continuing && !self.seam.first_closed;
                if let Some(done) = self.bucket.take()
                    && (done.1 != [0; 3] || keep)
                {
                    self.log.per_minute.push(done);
                    self.seam.first_closed = true;
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

    /// Issue 22's drift: `check` matched only `CUDA out of memory`, payload any case of either
    /// wording; both read `vocab` now.
    #[test]
    fn the_older_cuda_out_of_memory_wording_is_fatal() {
        let log = scan_bytes(
            b"(EngineCore pid=1) INFO 11-30 05:40:01 [core.py:1] loading\nRuntimeError: CUDA error: out of memory\n",
        );
        assert_eq!(log.fatal.as_deref(), Some("RuntimeError: CUDA error: out of memory"));
        let log = scan_bytes(b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n");
        assert!(log.fatal.is_some());
        assert_eq!(scan_bytes(b"INFO 11-30 05:40:01 [worker.py:1] Memory profiling takes 1.2 s\n").fatal, None);
    }

    /// Issue 33: the real vLLM's refusal of `--max-model-len` past the model's is pydantic's
    /// indented `Value error, …` line; `check` quotes it as payload classifies it.
    #[test]
    fn the_real_engines_max_model_len_refusal_is_fatal() {
        let text = "(APIServer pid=13165) INFO 12-07 04:52:03 [model.py:733] Resolved architecture: Qwen3ForCausalLM\n\
                    Traceback (most recent call last):\n\
                    \x20 File \"/venv/lib/python3.11/site-packages/vllm/config/model.py\", line 9, in f\n\
                    pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n\
                    \x20 Value error, User-specified max_model_len (8192) is greater than the derived max_model_len (max_position_embeddings=4096.0 or model_max_length=None in model's config.json).\n";
        let log = scan_bytes(text.as_bytes());
        let fatal = log.fatal.expect("the refusal is fatal");
        assert!(fatal.starts_with("Value error, User-specified max_model_len (8192)"), "{fatal}");
        assert_eq!(vocab::fatal_cause(&fatal), Some("max_model_len"));
    }

    #[test]
    fn file_scan_matches_in_memory_scan_across_chunk_edges() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vllm.log");
        let mut text = String::new();
        // More than three reads' worth, so lines straddle the read boundaries.
        for i in 0..40_000 {
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
        assert!(text.len() > 3 * CHUNK);
        assert_eq!((from_file.ok, from_file.c400), (36_000, 4_000));
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

    /// A deterministic generator (xorshift64*): the logs below are random, the same every run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }

    /// `MM-DD HH:MM:SS` of a second of a (non-leap) year.
    fn stamp(t: i64) -> String {
        let day = t / 86_400;
        let month = MONTH_DAYS.iter().rposition(|start| *start <= day).unwrap();
        let s = t % 86_400;
        format!("{:02}-{:02} {:02}:{:02}:{:02}", month + 1, day - MONTH_DAYS[month] + 1, s / 3600, s / 60 % 60, s % 60)
    }

    /// A vLLM log of `n` lines mixing everything the scanner tells apart: lines before the first
    /// anchor, anchors in the same minute, back by a minute and across New Year, access lines of every class (some
    /// behind the process prefix, some with `\r\n`), health checks, 400s followed by ERROR lines
    /// and multi-line tracebacks, engine deaths, blank and other lines.
    fn generated_log(seed: u64, n: usize) -> String {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        const YEAR: i64 = 365 * 86_400;
        // Some logs start in the last hour of the year, so they wrap.
        let mut t =
            if seed.is_multiple_of(2) { YEAR - 1 - rng.below(600) as i64 } else { rng.below(YEAR as u64) as i64 };
        let mut out = String::new();
        let mut lines = 0;
        while lines < n {
            let pre = if rng.below(2) == 0 { "(APIServer pid=7) " } else { "" };
            let block = match rng.below(20) {
                0..=2 => {
                    // Mostly forward; sometimes back a little (stamps of two processes interleave).
                    let back = if rng.below(6) == 0 { rng.below(90) as i64 } else { 0 };
                    t = (t + YEAR - back + rng.below(50) as i64) % YEAR;
                    let level = ["INFO", "WARNING", "ERROR", "DEBUG"][rng.below(4) as usize];
                    let what =
                        ["Engine 000: Avg prompt throughput: 1.0 tokens/s", "Starting vLLM server on :8000", "x"]
                            [rng.below(3) as usize];
                    format!("{pre}{level} {} [x.py:1] {what}\n", stamp(t))
                }
                3..=11 => {
                    let code = [200, 200, 200, 201, 400, 404, 500, 503, 302][rng.below(9) as usize];
                    let end = if rng.below(10) == 0 { "\r\n" } else { "\n" };
                    format!(
                        "{pre}{}{end}",
                        access_line("127.0.0.1:5", "POST", "/v1/chat/completions", (1, 1), code, "R")
                    )
                }
                12 => format!("{}\n", access_line("127.0.0.1:5", "GET", "/health", (1, 1), 200, "OK")),
                13..=15 => format!(
                    "{}\n{pre}ERROR {} [serving_chat.py:212] Error in preprocessing prompt inputs\n\
                     {pre}Traceback (most recent call last):\n{pre}  File \"a.py\", line 1, in f\n\
                     {pre}    raise VLLMValidationError(\n{pre}vllm.exceptions.VLLMValidationError: This model's \
                     maximum context length is 32768 tokens (seed {seed})\n",
                    access_line("127.0.0.1:5", "POST", "/v1/chat/completions", (1, 1), 400, "Bad Request"),
                    stamp(t)
                ),
                16 => format!("{pre}vllm.v1.engine.exceptions.EngineDeadError: died at line {lines}\n"),
                17 => "\n".to_string(),
                _ => format!("{pre}something else {}\n", rng.below(1000)),
            };
            lines += block.matches('\n').count();
            out += &block;
        }
        out
    }

    /// Scans `text` cut at `cuts` (line starts, increasing): a scanner per part, joined in order.
    fn scan_in_parts(text: &[u8], cuts: &[usize]) -> EngineLog {
        let bounds: Vec<usize> = std::iter::once(0).chain(cuts.iter().copied()).chain([text.len()]).collect();
        let mut joined: Option<Scanner> = None;
        for w in bounds.windows(2) {
            let part = &text[w[0]..w[1]];
            let mut scanner = if joined.is_none() { Scanner::new() } else { Scanner::continuing() };
            scanner.add_bytes(part.len() as u64);
            let end = memchr::memrchr(b'\n', part).map_or(0, |i| i + 1);
            scanner.lines(&part[..end]);
            if end < part.len() {
                scanner.line(&part[end..]);
            }
            match &mut joined {
                None => joined = Some(scanner),
                Some(j) => j.absorb(scanner),
            }
        }
        joined.unwrap().finish()
    }

    #[test]
    fn find2_finds_what_a_byte_loop_finds() {
        let mut rng = Rng(7);
        for len in 0..40 {
            for _ in 0..200 {
                // Bytes from a small alphabet (so matches are frequent), high bytes included.
                let s: Vec<u8> =
                    (0..len).map(|_| [b'"', b'\n', b'a', 0x80, 0xff, 0, b'!', b'#'][rng.below(8) as usize]).collect();
                for (a, b) in [(b'"', b'\n'), (b'\n', b'\n'), (0, 0xff), (b'!', b'#')] {
                    assert_eq!(find2(&s, a, b), s.iter().position(|c| *c == a || *c == b), "{s:?} {a} {b}");
                }
            }
        }
    }

    #[test]
    fn joined_parts_equal_one_pass_wherever_the_log_is_cut() {
        let (mut wraps, mut cuts_in_tracebacks) = (0, 0);
        for seed in 0..40 {
            let text = generated_log(seed, 240);
            let whole = scan_bytes(text.as_bytes());
            assert!(whole.tracebacks > 0 && whole.completions() > 0 && whole.per_minute.len() > 1, "{whole:?}");
            wraps += usize::from(whole.last_anchor.unwrap() >= 365 * 86_400);
            let starts: Vec<usize> = std::iter::once(0)
                .chain(text.match_indices('\n').map(|(i, _)| i + 1))
                .filter(|i| *i < text.len())
                .collect();
            // One cut at every line start (inside tracebacks, before and after anchors), …
            for &cut in &starts {
                let line = strip_process_prefix(&text.as_bytes()[cut..]);
                cuts_in_tracebacks += usize::from(line.starts_with(b"  ") || line.starts_with(b"vllm.exceptions"));
                assert_eq!(scan_in_parts(text.as_bytes(), &[cut]), whole, "seed {seed}, cut at byte {cut}");
            }
            // … and several cuts at once, empty parts included.
            let mut rng = Rng(seed + 1);
            for _ in 0..60 {
                let mut cuts: Vec<usize> =
                    (0..1 + rng.below(5)).map(|_| starts[rng.below(starts.len() as u64) as usize]).collect();
                cuts.sort_unstable();
                assert_eq!(scan_in_parts(text.as_bytes(), &cuts), whole, "seed {seed}, cuts {cuts:?}");
            }
        }
        assert!(wraps >= 10, "the generated logs cross New Year ({wraps})");
        assert!(cuts_in_tracebacks > 100);
    }

    /// Bytes this process has read so far (`rchar` of /proc/self/io).
    fn bytes_read_by_this_process() -> u64 {
        let io = std::fs::read_to_string("/proc/self/io").unwrap();
        io.lines().find_map(|l| l.strip_prefix("rchar: ")).unwrap().trim().parse().unwrap()
    }

    #[test]
    fn a_sparse_log_is_scanned_without_reading_its_holes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vllm.log");
        let ok = |n: u32| {
            (0..n)
                .map(|i| format!("INFO:     1.2.3.4:{i} - \"POST /v1/chat/completions HTTP/1.1\" 200 OK\n"))
                .collect::<String>()
        };
        let (head, tail) = (ok(3), ok(5));
        // 16 GiB of hole between two runs of lines (`truncate -s` on a log, or a file system
        // that preallocates): no disk used, but 16 GiB of zeros to a reader that reads it all.
        let hole: u64 = 16 << 30;
        let file = std::fs::File::create(&path).unwrap();
        file.write_all_at(head.as_bytes(), 0).unwrap();
        file.write_all_at(format!("\n{tail}").as_bytes(), head.len() as u64 + hole).unwrap();
        drop(file);
        let before = bytes_read_by_this_process();
        let log = scan_file(&path).unwrap().unwrap();
        let read = bytes_read_by_this_process() - before;
        // The head and the tail, and the line of zeros between them skipped as over-long.
        assert_eq!(log.ok, 8, "{log:?}");
        assert!(read < 1 << 30, "read {read} bytes of a log holding {} bytes of data", head.len() + tail.len());
    }

    #[test]
    fn a_file_scanned_in_parts_equals_one_pass() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vllm.log");
        // Generated lines, with lines of at least a buffer (skipped by the scan) around where the
        // parts are cut, so some cuts fall inside one; and the file ends without a newline.
        let long = |n: usize| "y".repeat(n) + "\n";
        let (mut text, mut skipped) = (String::new(), 0);
        for seed in 100..112 {
            text += &generated_log(seed, 3_000);
            let n = [CHUNK - 1, CHUNK, 3 * CHUNK][seed as usize % 3];
            text += &long(n);
            skipped += u64::from(n >= CHUNK);
        }
        text += "INFO:     1.2.3.4:5 - \"POST /v1/chat/completions HTTP/1.1\" 200";
        std::fs::write(&path, &text).unwrap();
        let one = scan_file_in_parts(&path, 1, 1).unwrap().unwrap();
        // One part is the plain pass, which skips the lines of a buffer or more.
        let mut expected = scan_bytes(text.as_bytes());
        expected.lines -= skipped;
        assert!(one == expected, "one part: {one:?}");
        let file = std::fs::File::open(&path).unwrap();
        let mut mid_line = 0;
        for parts in 2..=12 {
            let (first, rest) = plan_parts(&file, text.len() as u64, parts).unwrap();
            assert_eq!(rest.len(), parts - 1, "{parts} parts");
            mid_line += rest.iter().filter(|p| p.starts_mid_line).count();
            assert_eq!(first.start, 0);
            assert!(scan_file_in_parts(&path, parts, 1).unwrap().unwrap() == one, "{parts} parts");
        }
        assert!(mid_line > 0, "some cut fell inside a long line");
        // Below the part size a log is one part.
        let (_, rest) = plan_parts(&file, text.len() as u64, 1).unwrap();
        assert!(rest.is_empty());
    }
}
