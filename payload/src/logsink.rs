//! payload's log sink (stderr, i.e. the Slurm output file or a terminal). A write that fails —
//! EPIPE after the reader went away (an ssh drop during `salloc`, a closed pipe), EIO after a
//! pseudo-terminal hang-up, ENOSPC on a full filesystem — is counted and dropped, never fatal:
//! supervision must go on and still tear everything down. (tracing-subscriber's own error report
//! for a failing writer is an `eprintln!`, which panics on exactly these errors; this writer never
//! reports an error to it.) Rust ignores SIGPIPE in payload itself, so such a write returns EPIPE
//! instead of killing the process; children get the default disposition back from `std::process`.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

static FAILED_WRITES: AtomicU64 = AtomicU64::new(0);

/// How many log writes failed so far (reported in `events.jsonl` at the end, where that still works).
pub(crate) fn failed_writes() -> u64 {
    FAILED_WRITES.load(Ordering::Relaxed)
}

/// Writes to stderr; always reports success, counting the writes that failed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if std::io::stderr().lock().write_all(buf).is_err() {
            FAILED_WRITES.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// One line on stderr for the CLI layer (errors before logging matters); never fails, never panics.
pub fn line(text: &str) {
    let mut out = Stderr;
    let _ = out.write_all(format!("{text}\n").as_bytes());
}
