//! One external command run to an answer within bounds: time, output, and its process group.
//!
//! `wait_with_output` waits for end-of-file on the pipes as well as for the exit, so a command
//! whose descendant keeps stdout open (a daemonised helper) hangs it, and it buffers whatever the
//! command prints. Here the command runs in its own process group; each stream is read up to a
//! cap; after the command exits its pipes get a short drain; at the limit (or once drained) the
//! whole group gets SIGKILL and the command is reaped. What was read is the answer.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio::time::{Instant, sleep_until};

/// How long the pipes may stay open after the command exited (a descendant still holding them).
pub(crate) const DRAIN: Duration = Duration::from_secs(1);

/// What a bounded command did.
#[derive(Debug)]
pub(crate) struct Answer {
    /// Its exit status; `None` when it was still running at the limit (then killed).
    pub status: Option<ExitStatus>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// A stream printed more than the cap (the rest was discarded).
    pub truncated: bool,
}

/// Runs `cmd` (stdin null, stdout/stderr piped, its own process group) for at most `limit`,
/// keeping at most `cap` bytes of each stream. Spawn errors are returned as they are.
pub(crate) async fn run(mut cmd: Command, limit: Duration, cap: u64) -> std::io::Result<Answer> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).kill_on_drop(true);
    let mut child = cmd.spawn()?;
    // Dropped on every way out, a cancelled check included: the group never outlives the call.
    let _group = KillGroupOnDrop(child.id().map(|id| Pid::from_raw(id as i32)));
    let deadline = Instant::now() + limit;
    let (mut so, mut se) = (child.stdout.take(), child.stderr.take());
    let mut answer = Answer { status: None, stdout: Vec::new(), stderr: Vec::new(), truncated: false };
    let mut truncated = [false; 2];
    {
        let [t_out, t_err] = &mut truncated;
        let reading = async {
            tokio::join!(
                read_capped(so.as_mut(), cap, &mut answer.stdout, t_out),
                read_capped(se.as_mut(), cap, &mut answer.stderr, t_err)
            )
        };
        tokio::pin!(reading);
        let mut read_all = false;
        let waited = tokio::select! {
            status = child.wait() => Some(status),
            _ = &mut reading => { read_all = true; tokio::time::timeout_at(deadline, child.wait()).await.ok() }
            _ = sleep_until(deadline) => None,
        };
        answer.status = match waited {
            Some(Ok(status)) => Some(status),
            Some(Err(e)) => return Err(e),
            None => None,
        };
        // Exited: its output normally ends with it; a descendant holding a pipe gets DRAIN.
        if answer.status.is_some() && !read_all {
            let _ = tokio::time::timeout_at(deadline.min(Instant::now() + DRAIN), &mut reading).await;
        }
    }
    answer.truncated = truncated.iter().any(|t| *t);
    // Whatever is left in the group (the command at the limit, or a descendant) goes now.
    drop(_group);
    let _ = child.wait().await;
    Ok(answer)
}

/// [`run`] for synchronous callers (the preparation's `scontrol` calls), on a runtime of its own
/// in a thread of its own: the caller may itself be inside payload's runtime, which cannot be
/// blocked on from within.
pub(crate) fn run_blocking(cmd: Command, limit: Duration, cap: u64) -> std::io::Result<Answer> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(run(cmd, limit, cap))
    })
    .join()
    .unwrap_or_else(|_| Err(std::io::Error::other("the bounded command's thread panicked")))
}

/// SIGKILL to a process group when dropped.
struct KillGroupOnDrop(Option<Pid>);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

/// Reads a stream to its end into `kept`, at most `cap` bytes of it (reading on past the cap, so
/// the writer never blocks on a full pipe); `over` says more came.
async fn read_capped(stream: Option<&mut (impl AsyncRead + Unpin)>, cap: u64, kept: &mut Vec<u8>, over: &mut bool) {
    let Some(stream) = stream else { return };
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let room = usize::try_from(cap).unwrap_or(usize::MAX).saturating_sub(kept.len());
                if n > room {
                    *over = true;
                }
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script);
        cmd
    }

    /// Whether `pid` is gone (or a zombie) within a few seconds: SIGKILL takes effect when the
    /// process is next scheduled, not at the `kill` call.
    fn gone(pid: i32) -> bool {
        let until = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.rfind(')').is_none_or(|i| stat[i + 2..].starts_with('Z')) {
                return true;
            }
            if std::time::Instant::now() > until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[tokio::test]
    async fn blocking_callers_inside_a_runtime_get_the_same_bounds() {
        let started = std::time::Instant::now();
        let a = run_blocking(sh("echo hung; sleep 60"), Duration::from_millis(300), 1024).unwrap();
        assert!(a.status.is_none(), "still running at the limit: {a:?}");
        assert_eq!(String::from_utf8_lossy(&a.stdout), "hung\n");
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn a_descendant_holding_the_output_gets_a_short_drain_then_its_group_is_killed() {
        let started = std::time::Instant::now();
        let a = run(sh("sleep 60 & echo $!"), Duration::from_secs(30), 1024).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(10), "waited for the holder: {:?}", started.elapsed());
        assert!(a.status.is_some_and(|s| s.success()), "{a:?}");
        let holder: i32 = String::from_utf8_lossy(&a.stdout).trim().parse().unwrap();
        assert!(gone(holder), "the holder {holder} survived its group's kill");
    }

    #[tokio::test]
    async fn a_command_past_its_limit_is_killed_with_its_group() {
        let started = std::time::Instant::now();
        let a = run(sh("sleep 60 & echo $!; sleep 60"), Duration::from_secs(1), 1024).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
        assert!(a.status.is_none(), "{a:?}");
        let holder: i32 = String::from_utf8_lossy(&a.stdout).trim().parse().unwrap();
        assert!(gone(holder));
    }

    #[tokio::test]
    async fn output_past_the_cap_is_cut_and_said() {
        let a = run(sh("head -c 100000 /dev/zero; echo err >&2"), Duration::from_secs(30), 1000).await.unwrap();
        assert!(a.status.is_some_and(|s| s.success()), "{a:?}");
        assert_eq!((a.stdout.len(), a.truncated), (1000, true));
        assert_eq!(a.stderr, b"err\n");
    }
}
