//! The run-dir lock: `payload.lock` in the run dir, `flock`ed exclusively for the whole run, so a
//! second `payload run` on a live run dir stops before it touches anything of the first's (logs,
//! `status.json`, `launch.json`, children). The kernel drops the lock when payload exits however it
//! exits (even SIGKILL), so a stale lock file never blocks the next run. The descriptor is
//! close-on-exec: children never hold the lock.

use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use launch_spec::records::RUN_LOCK_FILE as LOCK_FILE;

/// payload's exit code when another payload holds the run dir (crate::exit).
pub(crate) use crate::exit::EXIT_RUN_DIR_BUSY;

#[derive(Debug, thiserror::Error)]
pub(crate) enum LockError {
    #[error(
        "run dir {dir} is in use by another payload ({holder}): wait for it to finish or cancel its job; this payload changed nothing"
    )]
    Busy { dir: PathBuf, holder: String },
    #[error("cannot lock run dir {dir} ({file}): {reason}")]
    Io { dir: PathBuf, file: PathBuf, reason: String },
}

/// Held for the whole run; dropping it unlocks.
#[derive(Debug)]
pub(crate) struct RunLock {
    _lock: Flock<std::fs::File>,
}

/// Takes the run-dir lock without waiting, and writes payload's pid into the file.
pub(crate) fn acquire(run_dir: &Path) -> Result<RunLock, LockError> {
    let path = run_dir.join(LOCK_FILE);
    let io = |reason: String| LockError::Io { dir: run_dir.to_path_buf(), file: path.clone(), reason };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| io(e.to_string()))?;
    if !file.metadata().map_err(|e| io(e.to_string()))?.file_type().is_file() {
        return Err(io("not a regular file".into()));
    }
    let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut text = String::new();
            let _ = (&mut file).take(64).read_to_string(&mut text);
            let holder = match text.trim().parse::<u32>() {
                Ok(pid) => format!("pid {pid}"),
                Err(_) => "pid unknown".to_string(),
            };
            return Err(LockError::Busy { dir: run_dir.to_path_buf(), holder });
        }
        Err((_, errno)) => return Err(io(errno.to_string())),
    };
    // Diagnostics only (who holds it); a failure here does not matter for the lock.
    let _ = lock.set_len(0);
    let _ = lock.rewind();
    let _ = writeln!(*lock, "{}", std::process::id());
    Ok(RunLock { _lock: lock })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_busy_and_names_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = acquire(dir.path()).unwrap();
        // flock locks belong to the open file description: a second open in this process conflicts
        // like a second payload would.
        let err = acquire(dir.path()).unwrap_err();
        assert!(matches!(err, LockError::Busy { .. }), "{err}");
        assert!(err.to_string().contains(&format!("pid {}", std::process::id())), "{err}");
        drop(first);
        acquire(dir.path()).unwrap();
    }

    #[test]
    fn a_symlinked_lock_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(LOCK_FILE)).unwrap();
        assert!(matches!(acquire(dir.path()), Err(LockError::Io { .. })));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }
}
