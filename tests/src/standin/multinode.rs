//! The vLLM stand-in's multi-node protocol (test support; docs/multinode.md). What payload can
//! observe of a multi-node vLLM, reproduced over one TCP connection per secondary:
//!
//! - the head (node rank 0, or the data-parallel rank that is not `--headless`) listens on the
//!   rendezvous address and port (`--master-port`, or `--data-parallel-rpc-port`) and becomes
//!   ready (goes on to load and serve HTTP) only when every other node has joined; it gives up
//!   after `--distributed-timeout-seconds` (default 600) as torch's store does;
//! - a secondary connects to `--master-addr`/`--data-parallel-address` (retrying while refused,
//!   as torch's store client does, until the same timeout), then holds the connection;
//! - a connection that breaks kills the other side: the head exits 1 with an engine-death error
//!   when a secondary goes away, a secondary exits 1 when the head does.
//!
//! Faults, for the tests: `STANDIN_RANK_FAIL=<rank>:start` (that rank exits 1 before joining, as
//! a CUDA init failure does) or `STANDIN_RANK_FAIL=<rank>:after=<seconds>` (that rank exits 1 that
//! long after joining).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Default collective timeout when `--distributed-timeout-seconds` is absent.
pub(crate) const DEFAULT_TIMEOUT_S: f64 = 600.0;

/// This process's place in a multi-node engine.
#[derive(Debug, Clone, PartialEq)]
pub struct Place {
    /// Nodes in the engine.
    pub nodes: u64,
    /// This node's index (0 = head).
    pub index: u64,
    pub addr: String,
    pub port: u16,
    pub timeout: Duration,
    /// `mp` (TP/PP across nodes) or `dp`.
    pub kind: &'static str,
}

/// Where this process sits, from the parsed flags; `None` for a single-node engine.
#[allow(clippy::too_many_arguments)]
pub fn place(
    nnodes: u64,
    node_rank: u64,
    master_addr: Option<String>,
    master_port: u64,
    dp: u64,
    dp_local: Option<u64>,
    dp_start_rank: u64,
    dp_addr: Option<String>,
    dp_port: u64,
    timeout_s: Option<f64>,
) -> Option<Place> {
    let timeout = Duration::from_secs_f64(timeout_s.unwrap_or(DEFAULT_TIMEOUT_S).max(0.1));
    if nnodes > 1 {
        return Some(Place {
            nodes: nnodes,
            index: node_rank,
            addr: master_addr.unwrap_or_else(|| "127.0.0.1".into()),
            port: master_port as u16,
            timeout,
            kind: "mp",
        });
    }
    let local = dp_local.filter(|l| *l > 0 && *l < dp)?;
    Some(Place {
        nodes: dp.div_ceil(local),
        index: dp_start_rank / local,
        addr: dp_addr.unwrap_or_else(|| "127.0.0.1".into()),
        port: dp_port as u16,
        timeout,
        kind: "dp",
    })
}

/// The fault `STANDIN_RANK_FAIL` sets for node `index`: `Some(None)` = fail at start,
/// `Some(Some(d))` = die `d` after joining.
pub fn fault_for(spec: Option<&str>, index: u64) -> Option<Option<Duration>> {
    let (rank, what) = spec?.split_once(':')?;
    if rank.trim().parse::<u64>().ok()? != index {
        return None;
    }
    match what.trim() {
        "start" => Some(None),
        other => {
            let secs: f64 = other.strip_prefix("after=")?.parse().ok()?;
            Some(Some(Duration::from_secs_f64(secs)))
        }
    }
}

/// Head: accepts `nodes - 1` secondaries within the timeout. `interrupted` is polled (signals).
pub fn head_wait(
    place: &Place,
    log: &dyn Fn(&str),
    interrupted: &dyn Fn() -> bool,
) -> Result<Vec<(u64, TcpStream)>, String> {
    let listener = TcpListener::bind(("0.0.0.0", place.port))
        .map_err(|e| format!("torch.distributed.DistNetworkError: failed to bind 0.0.0.0:{} ({e})", place.port))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let want = place.nodes - 1;
    log(&format!("Waiting for {want} other node(s) to join at {}:{} ({})", place.addr, place.port, place.kind));
    let deadline = Instant::now() + place.timeout;
    let mut peers = Vec::new();
    while (peers.len() as u64) < want {
        if interrupted() {
            return Err("interrupted".into());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "torch.distributed.DistStoreError: Timed out after {} seconds waiting for clients. {}/{} clients joined.",
                place.timeout.as_secs(),
                peers.len() + 1,
                place.nodes
            ));
        }
        match listener.accept() {
            Ok((stream, from)) => {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut line = String::new();
                let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
                if reader.read_line(&mut line).is_ok()
                    && let Some(rank) = line.trim().strip_prefix("join ").and_then(|r| r.parse::<u64>().ok())
                {
                    log(&format!("node {rank} joined from {from}"));
                    peers.push((rank, stream));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(e.to_string()),
        }
    }
    log(&format!("All {} nodes joined", place.nodes));
    Ok(peers)
}

/// Head: returns (rank) when one secondary's connection breaks. Blocks; run it in a thread.
pub fn first_lost(peers: Vec<(u64, TcpStream)>) -> u64 {
    let (tx, rx) = std::sync::mpsc::channel();
    for (rank, mut stream) in peers {
        let tx = tx.clone();
        let _ = stream.set_read_timeout(None);
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            loop {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(rank);
                        return;
                    }
                    Ok(_) => {}
                }
            }
        });
    }
    rx.recv().unwrap_or(0)
}

/// Secondary: connects to the head, retrying while refused, until the timeout. The first failed
/// attempt is reported on stderr as torch's store client warns.
pub fn join(place: &Place, interrupted: &dyn Fn() -> bool) -> Result<TcpStream, String> {
    let deadline = Instant::now() + place.timeout;
    let target = format!("{}:{}", place.addr, place.port);
    let mut last = String::new();
    let mut warned = false;
    loop {
        if interrupted() {
            return Err("interrupted".into());
        }
        let addrs: Vec<_> = target.to_socket_addrs().map_err(|e| e.to_string())?.collect();
        for addr in &addrs {
            match TcpStream::connect_timeout(addr, Duration::from_secs(2)) {
                Ok(mut stream) => {
                    writeln!(stream, "join {}", place.index).map_err(|e| e.to_string())?;
                    return Ok(stream);
                }
                Err(e) => {
                    if !warned {
                        warned = true;
                        eprintln!(
                            "[W socket.cpp:752] [c10d] The client socket cannot be initialized to connect to [{}]:{} (errno: {} - {e}).",
                            place.addr,
                            place.port,
                            e.raw_os_error().unwrap_or(0)
                        );
                    }
                    last = e.to_string();
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "torch.distributed.DistNetworkError: The client socket has timed out after {}s while trying to connect to ({}, {}): {last}",
                place.timeout.as_secs(),
                place.addr,
                place.port
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What ended a secondary's hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Held {
    HeadGone,
    Interrupted,
    Fault,
}

/// Secondary: holds the connection until the head closes it, a signal, or the `die_after` fault.
pub fn hold(mut stream: TcpStream, interrupted: &dyn Fn() -> bool, die_after: Option<Duration>) -> Held {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let start = Instant::now();
    let mut buf = [0u8; 64];
    loop {
        if interrupted() {
            return Held::Interrupted;
        }
        if die_after.is_some_and(|d| start.elapsed() >= d) {
            return Held::Fault;
        }
        match stream.read(&mut buf) {
            Ok(0) => return Held::HeadGone,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return Held::HeadGone,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn place_from_flags() {
        let mp = place(2, 1, Some("10.0.0.1".into()), 29500, 1, None, 0, None, 29550, Some(30.0)).unwrap();
        assert_eq!((mp.nodes, mp.index, mp.port, mp.kind), (2, 1, 29500, "mp"));
        let dp = place(1, 0, None, 29501, 4, Some(2), 2, Some("10.0.0.1".into()), 29550, None).unwrap();
        assert_eq!((dp.nodes, dp.index, dp.port, dp.kind), (2, 1, 29550, "dp"));
        assert!(place(1, 0, None, 29501, 4, None, 0, None, 29550, None).is_none(), "single-node DP");
    }

    #[test]
    fn faults_target_one_rank() {
        assert_eq!(fault_for(Some("1:start"), 1), Some(None));
        assert_eq!(fault_for(Some("1:start"), 0), None);
        assert_eq!(fault_for(Some("2:after=1.5"), 2), Some(Some(Duration::from_millis(1500))));
        assert_eq!(fault_for(None, 1), None);
    }

    #[test]
    fn head_is_ready_only_when_all_joined_and_notices_a_loss() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let p = move |index| Place {
            nodes: 2,
            index,
            addr: "127.0.0.1".into(),
            port,
            timeout: Duration::from_secs(10),
            kind: "mp",
        };
        let head = std::thread::spawn(move || head_wait(&p(0), &|_| {}, &|| false));
        let stream = join(&p(1), &|| false).unwrap();
        let peers = head.join().unwrap().unwrap();
        assert_eq!(peers.len(), 1);
        drop(stream);
        assert_eq!(first_lost(peers), 1);
        // Nobody joins: the head times out with torch's words.
        let lonely = Place { timeout: Duration::from_millis(300), ..p(0) };
        let err = head_wait(&lonely, &|_| {}, &|| false).unwrap_err();
        assert!(err.contains("1/2 clients joined"), "{err}");
    }
}
