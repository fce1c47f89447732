//! A client-side time bound on every PostgreSQL call (issue 32 item 9; docs/ledger.md "Bounds").
//!
//! The sync `postgres` client has no read timeout: `connect_timeout` covers the TCP connect only,
//! and `statement_timeout` is the server's — a connection that stalls after connecting (a hung
//! pooler, a half-open path, a proxy that stops forwarding) leaves the caller blocked in its
//! runtime's `epoll_wait` for ever. The driver keeps its socket private, so the socket is found
//! here: the process's socket descriptors are listed before and after the connect (under one
//! lock, so two connects never mix), and the new one whose peer is the server's port is the
//! connection's. A watchdog thread waits for the call to end; at the bound it shuts the socket
//! down, the driver's pending read ends with "connection closed", the call returns that error and
//! the next call reconnects. During the connect itself (startup and authentication, which
//! `connect_timeout` does not cover either) the same watchdog shuts down whatever new socket to
//! the server's port exists by then.

use std::collections::BTreeSet;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use nix::sys::socket::{AddressFamily, Shutdown, SockaddrLike, SockaddrStorage, getpeername, shutdown};

/// One connect at a time in this process: the socket a connect created is the one new socket.
static CONNECTING: Mutex<()> = Mutex::new(());

/// `(descriptor, socket inode)` of every socket this process has open.
fn sockets() -> BTreeSet<(RawFd, String)> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else { return BTreeSet::new() };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let fd: RawFd = entry.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(entry.path()).ok()?.to_string_lossy().into_owned();
            target.starts_with("socket:").then_some((fd, target))
        })
        .collect()
}

/// Whether `fd` is a connected stream whose peer is TCP port `port` (or a Unix socket, for a
/// server reached by its socket directory).
fn is_server_socket(fd: RawFd, port: u16) -> bool {
    let Ok(peer) = getpeername::<SockaddrStorage>(fd) else { return false };
    match peer.family() {
        Some(AddressFamily::Inet) => peer.as_sockaddr_in().is_some_and(|a| a.port() == port),
        Some(AddressFamily::Inet6) => peer.as_sockaddr_in6().is_some_and(|a| a.port() == port),
        Some(AddressFamily::Unix) => true,
        _ => false,
    }
}

/// The sockets to `port` that are not in `before`.
fn new_server_sockets(before: &BTreeSet<(RawFd, String)>, port: u16) -> Vec<RawFd> {
    sockets().difference(before).map(|(fd, _)| *fd).filter(|fd| is_server_socket(*fd, port)).collect()
}

/// Runs `body` on this thread; if it has not returned within `bound`, `on_timeout` runs (on the
/// watchdog's thread) to unblock it. Returns what `body` returned and whether the bound fired.
fn watched<T>(bound: Duration, on_timeout: impl FnOnce() + Send, body: impl FnOnce() -> T) -> (T, bool) {
    let fired = AtomicBool::new(false);
    let (done, wait) = mpsc::channel::<()>();
    let flag = &fired;
    let value = std::thread::scope(|scope| {
        scope.spawn(move || {
            if let Err(RecvTimeoutError::Timeout) = wait.recv_timeout(bound) {
                flag.store(true, Ordering::SeqCst);
                on_timeout();
            }
        });
        let value = body();
        drop(done);
        value
    });
    (value, fired.load(Ordering::SeqCst))
}

/// Connects through `connect` within `bound`, and finds the new connection's socket (None when it
/// cannot be told apart: then later calls are bounded by the server's timeouts only).
pub(super) fn connect<T>(port: u16, bound: Duration, connect: impl FnOnce() -> T) -> (T, Option<RawFd>, bool) {
    let _one_at_a_time = CONNECTING.lock().unwrap_or_else(PoisonError::into_inner);
    let before = sockets();
    let (value, fired) = watched(
        bound,
        || {
            for fd in new_server_sockets(&before, port) {
                let _ = shutdown(fd, Shutdown::Both);
            }
        },
        connect,
    );
    let found = new_server_sockets(&before, port);
    let socket = match found.as_slice() {
        [fd] => Some(*fd),
        _ => {
            tracing::debug!(
                "PostgreSQL connection: {} new socket(s) to port {port}; calls bounded by the server only",
                found.len()
            );
            None
        }
    };
    (value, socket, fired)
}

/// Runs `body` (calls on the connection whose socket is `socket`) within `bound`: at the bound the
/// socket is shut down, which ends the driver's wait with an error. Returns whether it fired.
pub(super) fn within<T>(socket: Option<RawFd>, bound: Duration, body: impl FnOnce() -> T) -> (T, bool) {
    let Some(fd) = socket else { return (body(), false) };
    watched(
        bound,
        move || {
            let _ = shutdown(fd, Shutdown::Both);
        },
        body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::time::Instant;

    #[test]
    fn a_read_that_never_gets_an_answer_ends_at_the_bound() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stream, socket, fired) = connect(port, Duration::from_secs(5), || TcpStream::connect(("127.0.0.1", port)));
        let mut stream = stream.unwrap();
        assert!(!fired);
        assert_eq!(socket, Some(stream.as_raw_fd()), "the new socket to the port is found");
        let _server_side = listener.accept().unwrap();
        let started = Instant::now();
        let (read, fired) = within(socket, Duration::from_millis(300), || stream.read(&mut [0u8; 16]));
        assert!(fired && started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert_eq!(read.unwrap(), 0, "the shut-down socket reads end-of-file");
        // A call that answers in time is left alone.
        let (value, fired) = within(socket, Duration::from_secs(5), || 7);
        assert_eq!((value, fired), (7, false));
    }
}
