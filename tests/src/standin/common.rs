//! Helpers shared by the vLLM and Harbor stand-ins: clocks in the formats the
//! real programs print, randomness (uuid4, shortuuid), signal flags, JSON in
//! pydantic's layout, environment knobs, and difflib-style close matches (click's
//! "Did you mean" suggestions). Test support only.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Broken-down local time (libc `localtime_r`), with microseconds.
#[derive(Debug, Clone, Copy)]
pub struct LocalTime {
    pub year: i32,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub(crate) micros: u32,
}

fn broken_down(t: SystemTime, utc: bool) -> LocalTime {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as libc::time_t;
    // SAFETY: `tm` is a plain C struct that localtime_r/gmtime_r fill in; both
    // pointers are valid for the duration of the call.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if utc {
            libc::gmtime_r(&secs, &mut tm);
        } else {
            libc::localtime_r(&secs, &mut tm);
        }
        tm
    };
    LocalTime {
        year: tm.tm_year + 1900,
        month: (tm.tm_mon + 1) as u32,
        day: tm.tm_mday as u32,
        hour: tm.tm_hour as u32,
        minute: tm.tm_min as u32,
        second: tm.tm_sec as u32,
        micros: d.subsec_micros(),
    }
}

/// Local time now.
pub fn local_now() -> LocalTime {
    broken_down(SystemTime::now(), false)
}

/// vLLM's log timestamp: `%m-%d %H:%M:%S` in local time.
pub fn vllm_timestamp() -> String {
    let t = local_now();
    format!("{:02}-{:02} {:02}:{:02}:{:02}", t.month, t.day, t.hour, t.minute, t.second)
}

/// pydantic's serialisation of an aware UTC datetime: `2026-11-30T05:40:01.123456Z`.
pub fn iso_utc(t: SystemTime) -> String {
    let b = broken_down(t, true);
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z", b.year, b.month, b.day, b.hour, b.minute, b.second, b.micros)
}

/// pydantic's serialisation of a naive local datetime (`datetime.now()`):
/// `2026-11-30T05:40:01.123456`.
pub fn iso_local(t: SystemTime) -> String {
    let b = broken_down(t, false);
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}", b.year, b.month, b.day, b.hour, b.minute, b.second, b.micros)
}

/// Seconds since the epoch, as an integer (OpenAI `created`).
pub fn unix_seconds() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

// ---------------------------------------------------------------- randomness

static RNG: Mutex<u64> = Mutex::new(0);

fn seed() -> u64 {
    let mut buf = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut buf);
    }
    let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
    u64::from_le_bytes(buf) ^ t ^ (u64::from(std::process::id()) << 32) | 1
}

/// A 64-bit pseudo-random number (xorshift64*, seeded from /dev/urandom).
pub(crate) fn rand_u64() -> u64 {
    let mut s = RNG.lock().unwrap_or_else(|e| e.into_inner());
    if *s == 0 {
        *s = seed();
    }
    let mut x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// `n` lowercase hex digits.
pub fn rand_hex(n: usize) -> String {
    let mut out = String::with_capacity(n);
    while out.len() < n {
        out.push_str(&format!("{:016x}", rand_u64()));
    }
    out.truncate(n);
    out
}

/// A random RFC 4122 version-4 UUID in canonical form.
pub fn uuid4() -> String {
    let h = rand_hex(32);
    let variant = ["8", "9", "a", "b"][(rand_u64() % 4) as usize];
    format!("{}-{}-4{}-{}{}-{}", &h[0..8], &h[8..12], &h[13..16], variant, &h[17..20], &h[20..32])
}

/// shortuuid's default alphabet (no 0, 1, I, O, l).
pub(crate) const SHORTUUID_ALPHABET: &str = "23456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";

/// `ShortUUID().random(length=n)`.
pub fn shortuuid(n: usize) -> String {
    let a: Vec<char> = SHORTUUID_ALPHABET.chars().collect();
    (0..n).map(|_| a[(rand_u64() % a.len() as u64) as usize]).collect()
}

// ------------------------------------------------------------------- signals

static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);
static SIGNAL_COUNT: AtomicI32 = AtomicI32::new(0);

extern "C" fn record_signal(sig: libc::c_int) {
    PENDING_SIGNAL.store(sig, Ordering::SeqCst);
    SIGNAL_COUNT.fetch_add(1, Ordering::SeqCst);
}

/// Route `sig` to a flag that [`pending_signal`] reads (async-signal-safe handler).
pub fn catch_signal(sig: libc::c_int) {
    // SAFETY: installs a handler that only stores to atomics.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = record_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
}

/// Whether `sig` was ignored (SIG_IGN) when this process started, e.g. inherited through exec.
pub fn signal_ignored(sig: libc::c_int) -> bool {
    // SAFETY: querying a disposition (null new action) changes nothing.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Ignore `sig` (SIG_IGN); survives exec and fork like the real thing.
pub fn ignore_signal(sig: libc::c_int) {
    // SAFETY: setting a disposition to SIG_IGN is always sound.
    unsafe {
        libc::signal(sig, libc::SIG_IGN);
    }
}

/// Restore the default disposition of `sig`.
pub(crate) fn default_signal(sig: libc::c_int) {
    // SAFETY: setting a disposition to SIG_DFL is always sound.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
    }
}

/// The last caught signal, if any (not cleared).
pub fn pending_signal() -> Option<i32> {
    match PENDING_SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Send `sig` to this very process (used to die "by signal" like Python's
/// uncaught KeyboardInterrupt, or like the OOM killer with SIGKILL).
pub fn raise_signal(sig: libc::c_int) -> ! {
    default_signal(sig);
    // SAFETY: raise() on our own pid.
    unsafe {
        libc::raise(sig);
    }
    std::thread::sleep(Duration::from_millis(200));
    std::process::exit(128 + sig);
}

/// This process's pid.
pub fn pid() -> u32 {
    std::process::id()
}

/// Double-fork a daemon grandchild: the grandchild calls setsid(), ignores SIGTERM and
/// sleeps forever; its pid is written to `pidfile` when given. Returns the
/// grandchild's pid in the caller. Call this only while the process has a
/// single thread.
pub fn double_fork_sleeper(pidfile: Option<&str>) -> Option<i32> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe/fork/setsid/_exit are used the classic way; the process is
    // single-threaded when this runs, so the children may call anything.
    unsafe {
        if libc::pipe(fds.as_mut_ptr()) != 0 {
            return None;
        }
        let child = libc::fork();
        if child < 0 {
            return None;
        }
        if child == 0 {
            libc::close(fds[0]);
            let grandchild = libc::fork();
            if grandchild != 0 {
                libc::_exit(0);
            }
            libc::setsid();
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            let me = libc::getpid();
            if let Some(p) = pidfile {
                let _ = std::fs::write(p, format!("{me}\n"));
            }
            let bytes = me.to_le_bytes();
            libc::write(fds[1], bytes.as_ptr().cast(), 4);
            libc::close(fds[1]);
            loop {
                libc::pause();
            }
        }
        libc::close(fds[1]);
        let mut buf = [0u8; 4];
        let n = libc::read(fds[0], buf.as_mut_ptr().cast(), 4);
        libc::close(fds[0]);
        let mut status = 0;
        libc::waitpid(child, &mut status, 0);
        if n == 4 { Some(i32::from_le_bytes(buf)) } else { None }
    }
}

// ---------------------------------------------------------------------- JSON

/// JSON with 4-space indentation, as pydantic's `model_dump_json(indent=4)`.
pub fn json_pretty4(v: &serde_json::Value) -> String {
    use serde::Serialize;
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    if v.serialize(&mut ser).is_err() {
        return v.to_string();
    }
    String::from_utf8(out).unwrap_or_default()
}

/// Write `content` to `path` through a temporary file and a rename.
pub(crate) fn write_atomic(path: &std::path::Path, content: &str) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", rand_hex(6)));
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, path)
}

// ---------------------------------------------------------------------- env

/// A float knob from the environment.
pub fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// An optional unsigned knob from the environment.
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// A boolean knob: `1`, `true`, `yes`, `on` (any case) are true.
pub fn env_flag(name: &str) -> bool {
    matches!(std::env::var(name).unwrap_or_default().trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
}

/// A non-empty string knob.
pub fn env_str(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Sleep for a fractional number of seconds (negative → none).
pub fn sleep_secs(s: f64) {
    if s > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(s));
    }
}

// ------------------------------------------------------------------ difflib

fn longest_match(a: &[char], b: &[char], alo: usize, ahi: usize, blo: usize, bhi: usize) -> (usize, usize, usize) {
    let (mut besti, mut bestj, mut bestk) = (alo, blo, 0);
    for i in alo..ahi {
        for j in blo..bhi {
            let mut k = 0;
            while i + k < ahi && j + k < bhi && a[i + k] == b[j + k] {
                k += 1;
            }
            if k > bestk {
                besti = i;
                bestj = j;
                bestk = k;
            }
        }
    }
    (besti, bestj, bestk)
}

fn matching_chars(a: &[char], b: &[char], alo: usize, ahi: usize, blo: usize, bhi: usize) -> usize {
    let (i, j, k) = longest_match(a, b, alo, ahi, blo, bhi);
    if k == 0 {
        return 0;
    }
    k + matching_chars(a, b, alo, i, blo, j) + matching_chars(a, b, i + k, ahi, j + k, bhi)
}

/// difflib's `SequenceMatcher(None, a, b).ratio()` (without the junk heuristic,
/// which only starts at 200 characters).
pub(crate) fn similarity(a: &str, b: &str) -> f64 {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let total = a.len() + b.len();
    if total == 0 {
        return 1.0;
    }
    2.0 * matching_chars(&a, &b, 0, a.len(), 0, b.len()) as f64 / total as f64
}

/// difflib's `get_close_matches(word, possibilities, n=3, cutoff=0.6)`.
pub(crate) fn close_matches(word: &str, possibilities: &[String]) -> Vec<String> {
    let mut scored: Vec<(f64, &String)> =
        possibilities.iter().map(|p| (similarity(p, word), p)).filter(|(s, _)| *s >= 0.6).collect();
    scored.sort_by(|x, y| y.0.partial_cmp(&x.0).unwrap_or(std::cmp::Ordering::Equal).then(y.1.cmp(x.1)));
    scored.into_iter().take(3).map(|(_, p)| p.clone()).collect()
}

/// Approximate token count of a text: one token per four characters, rounded up.
pub fn approx_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_shape() {
        let u = uuid4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert_eq!(shortuuid(7).len(), 7);
    }

    #[test]
    fn difflib_ratio() {
        assert!((similarity("abcd", "bcde") - 0.75).abs() < 1e-9);
        assert_eq!(
            close_matches("--jobsdir", &["--jobs-dir".into(), "--debug".into()]),
            vec!["--jobs-dir".to_string()]
        );
    }
}
