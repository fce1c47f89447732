//! A loopback TCP proxy in front of the real PostgreSQL that a test controls: it relays bytes, and
//! at each connect and each query the client sends (protocol messages `Q` and `P`) asks the
//! test's policy whether to pass it, stall (hold it and every later byte, the connection left
//! open — a hung pooler, a half-open path), or drop the connection. Shared by `tests/it` and the
//! soak through `#[path]`. Clients must use `sslmode=disable` (the proxy reads the protocol).

#![allow(dead_code)] // not every crate that includes this file uses all of it

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the proxy asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Connect,
    Query,
}

/// What the proxy does there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    Pass,
    Stall,
    Drop,
}

type Policy = Box<dyn FnMut(Stage) -> Fault + Send>;

pub(crate) struct PgProxy {
    pub(crate) port: u16,
    policy: Arc<Mutex<Policy>>,
    stop: Arc<AtomicBool>,
    /// Faults applied so far: stalls, drops.
    pub(crate) stalls: Arc<AtomicUsize>,
    pub(crate) drops: Arc<AtomicUsize>,
}

impl PgProxy {
    /// A proxy to `upstream` (`host:port`) with `policy`.
    pub(crate) fn start(upstream: &str, policy: impl FnMut(Stage) -> Fault + Send + 'static) -> PgProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let policy: Arc<Mutex<Policy>> = Arc::new(Mutex::new(Box::new(policy)));
        let stop = Arc::new(AtomicBool::new(false));
        let (stalls, drops) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let upstream = upstream.to_string();
        {
            let (policy, stop, stalls, drops) = (policy.clone(), stop.clone(), stalls.clone(), drops.clone());
            std::thread::spawn(move || {
                for client in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let (policy, stalls, drops, upstream) =
                        (policy.clone(), stalls.clone(), drops.clone(), upstream.clone());
                    std::thread::spawn(move || relay(client, &upstream, &policy, &stalls, &drops));
                }
            });
        }
        PgProxy { port, policy, stop, stalls, drops }
    }

    /// Replaces the policy (for connections and queries from now on).
    pub(crate) fn set(&self, policy: impl FnMut(Stage) -> Fault + Send + 'static) {
        *self.policy.lock().unwrap() = Box::new(policy);
    }

    /// `url` (a `postgres://…@127.0.0.1:PORT/…` URL) pointed at the proxy, with `sslmode=disable`.
    pub(crate) fn url(&self, url: &str) -> String {
        let (head, rest) = url.split_once('@').expect("a URL with user@host");
        let (_, path) = rest.split_once('/').expect("a URL with a database");
        let path = path.replace("sslmode=prefer", "sslmode=disable").replace("sslmode=require", "sslmode=disable");
        let separator = if path.contains('?') { '&' } else { '?' };
        let tls = if path.contains("sslmode=") { String::new() } else { format!("{separator}sslmode=disable") };
        format!("{head}@127.0.0.1:{}/{path}{tls}", self.port)
    }
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// The upstream `host:port` of a `postgres://…@HOST:PORT/…` URL.
pub(crate) fn upstream_of(url: &str) -> String {
    let rest = url.split_once('@').expect("a URL with user@host").1;
    let authority = rest.split('/').next().unwrap();
    if authority.contains(':') { authority.to_string() } else { format!("{authority}:5432") }
}

fn decide(policy: &Mutex<Policy>, stage: Stage) -> Fault {
    (policy.lock().unwrap())(stage)
}

/// Holds a stalled connection: reads (and drops) what the client sends until it closes.
fn hold(mut client: TcpStream, upstream: TcpStream) {
    let mut sink = [0u8; 4096];
    while matches!(client.read(&mut sink), Ok(n) if n > 0) {}
    let _ = upstream.shutdown(Shutdown::Both);
}

/// Applies `fault` to the connection; false when it is no longer relayed (stalled: held until the
/// client gives up; dropped: both sides closed).
fn apply(fault: Fault, client: &TcpStream, server: &TcpStream, stalls: &AtomicUsize, drops: &AtomicUsize) -> bool {
    match fault {
        Fault::Pass => return true,
        Fault::Stall => {
            stalls.fetch_add(1, Ordering::SeqCst);
            hold(client.try_clone().unwrap(), server.try_clone().unwrap());
        }
        Fault::Drop => {
            drops.fetch_add(1, Ordering::SeqCst);
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
    }
    false
}

fn relay(client: TcpStream, upstream: &str, policy: &Mutex<Policy>, stalls: &AtomicUsize, drops: &AtomicUsize) {
    let Ok(server) = TcpStream::connect(upstream) else { return };
    if !apply(decide(policy, Stage::Connect), &client, &server, stalls, drops) {
        return;
    }
    // Server → client: plain bytes, until either side closes.
    let (mut from_server, mut to_client) = (server.try_clone().unwrap(), client.try_clone().unwrap());
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_server, &mut to_client);
        let _ = to_client.shutdown(Shutdown::Both);
    });
    // Client → server: message by message (the startup packet has no type byte).
    let (mut from_client, mut to_server) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let mut read_exact = |buf: &mut [u8]| from_client.read_exact(buf).is_ok();
    let mut length = [0u8; 4];
    if !read_exact(&mut length) {
        return;
    }
    let mut startup = vec![0u8; (u32::from_be_bytes(length) as usize).saturating_sub(4)];
    if !read_exact(&mut startup) || to_server.write_all(&[&length[..], &startup].concat()).is_err() {
        return;
    }
    loop {
        let mut kind = [0u8; 1];
        if !read_exact(&mut kind) || !read_exact(&mut length) {
            break;
        }
        let mut body = vec![0u8; (u32::from_be_bytes(length) as usize).saturating_sub(4)];
        if !read_exact(&mut body) {
            break;
        }
        if matches!(kind[0], b'Q' | b'P') && !apply(decide(policy, Stage::Query), &client, &server, stalls, drops) {
            return;
        }
        if to_server.write_all(&[&kind[..], &length[..], &body].concat()).is_err() {
            break;
        }
    }
    let _ = server.shutdown(Shutdown::Both);
}

/// How long a test waits for a child before calling it hung.
pub(crate) const HUNG_AFTER: Duration = Duration::from_secs(120);
