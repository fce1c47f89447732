//! The engine's port (docs/design.md §6.2 step 4): the spec's fixed port, or one derived from the Slurm job
//! id inside the spec's `[base, base+span)`, checked free by binding, stepping to the next free one.
//! Co-located jobs get different starting points; the bind check catches the rest. The port is
//! passed to vLLM as `--port` only: payload never exports `VLLM_PORT`.
//!
//! Server identity (docs/payload.md, "Server identity"): readiness counts only when the socket
//! listening on the port belongs to the engine's process tree ([`listener_of`], from
//! `/proc/net/tcp{,6}` and `/proc/<pid>/fd`), so a foreign server answering `/health` and
//! `/v1/models` there is never taken for the engine.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

use launch_spec::OutcomeClass;
use launch_spec::spec::PortPolicy;

use crate::failure::Failure;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PortError {
    #[error("fixed port {port} (serve.port.fixed) is already in use on this node: free it or drop serve.port.fixed")]
    FixedTaken { port: u16 },
    #[error("no free port in [{base}, {end}) (serve.port.base/span): widen the range")]
    Exhausted { base: u16, end: u32 },
}

impl From<PortError> for Failure {
    fn from(err: PortError) -> Self {
        Failure::new(OutcomeClass::EngineStart, err.to_string()).with_cause("port")
    }
}

/// The first port tried: `base + (job id mod span)`. Non-numeric ids are hashed.
pub(crate) fn derived_start(policy: &PortPolicy, job_id: &str) -> u16 {
    let span = u64::from(policy.span.max(1));
    let n: u64 = job_id.parse().unwrap_or_else(|_| {
        job_id.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3))
    });
    let max_span = u64::from(u16::MAX) - u64::from(policy.base) + 1;
    let span = span.min(max_span);
    (u64::from(policy.base) + n % span) as u16
}

/// Candidates in order: the derived start, then upwards, wrapping to `base`.
pub(crate) fn candidates(policy: &PortPolicy, job_id: &str) -> Vec<u16> {
    if let Some(port) = policy.fixed {
        return vec![port];
    }
    let base = u32::from(policy.base);
    let end = (base + u32::from(policy.span.max(1))).min(u32::from(u16::MAX) + 1);
    let start = u32::from(derived_start(policy, job_id));
    (start..end).chain(base..start).map(|p| p as u16).collect()
}

/// Free = bindable both on the wildcard address and on `host` (a listener on either conflicts).
pub(crate) fn is_free(port: u16, host: &str) -> bool {
    let wildcard = SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
    if TcpListener::bind(wildcard).is_err() {
        return false;
    }
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) if !ip.is_unspecified() => TcpListener::bind(SocketAddr::new(ip, port)).is_ok(),
        _ => true,
    }
}

/// Chooses the port; `free` is the check (injectable for tests).
pub(crate) fn choose_with(policy: &PortPolicy, job_id: &str, free: impl Fn(u16) -> bool) -> Result<u16, PortError> {
    let list = candidates(policy, job_id);
    if let Some(port) = policy.fixed {
        return if free(port) { Ok(port) } else { Err(PortError::FixedTaken { port }) };
    }
    list.into_iter()
        .find(|p| *p != 0 && free(*p))
        .ok_or(PortError::Exhausted { base: policy.base, end: u32::from(policy.base) + u32::from(policy.span) })
}

pub(crate) fn choose(policy: &PortPolicy, job_id: &str, host: &str) -> Result<u16, PortError> {
    choose_with(policy, job_id, |p| is_free(p, host))
}

/// Who holds the socket listening on the engine's port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Listener {
    /// A process of the engine's tree (the head or one of its descendants).
    Engine,
    /// Someone else: the pids found holding it (empty when they are not ours to look at).
    Foreign { pids: Vec<i32> },
    /// Nothing listens on the port in this network namespace's tables (or /proc is unreadable).
    None,
}

/// Inodes of the sockets in state LISTEN (`0A`) on local `port`, from the text of
/// `/proc/net/tcp` or `/proc/net/tcp6` (`sl local_address rem_address st … uid timeout inode`).
pub(crate) fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f.get(1)?.rsplit_once(':')?.1;
            (u16::from_str_radix(local_port, 16).ok()? == port && *f.get(3)? == "0A").then_some(())?;
            f.get(9)?.parse().ok()
        })
        .collect()
}

/// Whether one of `pid`'s descriptors is a socket with one of these inodes.
fn holds_socket(pid: i32, inodes: &[u64]) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).ok().and_then(|target| {
            let t = target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse::<u64>().ok()?;
            Some(inodes.contains(&t))
        }) == Some(true)
    })
}

/// Who listens on `port`: the engine's tree rooted at `engine_pid` (its own descriptors are
/// looked at first: vLLM's API server is the head process), or someone else.
pub(crate) fn listener_of(port: u16, engine_pid: u32) -> Listener {
    // Reading a table costs the kernel a walk of its socket hash (~10 ms on a busy node), so the
    // IPv4 one is asked first: an engine listener found there cannot share the port with a foreign
    // one in the other (the bind would conflict), so the IPv6 table is read only when needed.
    let table = |path: &str| std::fs::read_to_string(path).map(|t| listening_inodes(&t, port)).unwrap_or_default();
    let v4 = table("/proc/net/tcp");
    if !v4.is_empty() && owned_by_tree(engine_pid as i32, &v4) {
        return Listener::Engine;
    }
    let mut inodes = v4;
    inodes.extend(table("/proc/net/tcp6"));
    if inodes.is_empty() {
        return Listener::None;
    }
    if owned_by_tree(engine_pid as i32, &inodes) {
        return Listener::Engine;
    }
    let holders =
        crate::supervisor::proc_table().iter().map(|p| p.pid).filter(|pid| holds_socket(*pid, &inodes)).collect();
    Listener::Foreign { pids: holders }
}

/// Whether the engine's head or one of its descendants holds one of these sockets.
fn owned_by_tree(root: i32, inodes: &[u64]) -> bool {
    if holds_socket(root, inodes) {
        return true;
    }
    // The engine's tree from the kernel's children lists (only its own processes are read; a scan
    // of every /proc entry costs tens of milliseconds on a busy node), else from the whole table.
    let tree = children_tree(root).unwrap_or_else(|| {
        crate::supervisor::descendants(&crate::supervisor::proc_table(), root).iter().map(|p| p.pid).collect()
    });
    tree.iter().any(|pid| holds_socket(*pid, inodes))
}

/// `root`'s descendants from `/proc/<pid>/task/<tid>/children`; `None` when the kernel does not
/// provide those lists.
fn children_tree(root: i32) -> Option<Vec<i32>> {
    let read_children = |pid: i32| -> Option<Vec<i32>> {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
        let mut out = Vec::new();
        for task in tasks.flatten() {
            let text = std::fs::read_to_string(task.path().join("children")).ok()?;
            out.extend(text.split_whitespace().filter_map(|c| c.parse::<i32>().ok()));
        }
        Some(out)
    };
    let mut tree = Vec::new();
    let mut stack = read_children(root)?;
    let mut seen = std::collections::HashSet::new();
    while let Some(pid) = stack.pop() {
        if seen.insert(pid) {
            tree.push(pid);
            stack.extend(read_children(pid).unwrap_or_default());
        }
    }
    Some(tree)
}

/// The id that derives the port: the Slurm job id, else payload's pid (two local runs differ).
pub(crate) fn job_id(env: &dyn Fn(&str) -> Option<String>) -> String {
    env("SLURM_JOB_ID").unwrap_or_else(|| std::process::id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(base: u16, span: u16) -> PortPolicy {
        PortPolicy { fixed: None, base, span }
    }

    #[test]
    fn derived_from_job_id_within_range() {
        let p = policy(20000, 20000);
        assert_eq!(derived_start(&p, "12345"), 32345);
        assert_eq!(derived_start(&p, "40001"), 20001);
        let hashed = derived_start(&p, "not-a-number");
        assert!((20000..40000).contains(&hashed));
        let high = policy(65000, 20000);
        assert!(derived_start(&high, "999") >= 65000);
    }

    #[test]
    fn co_located_jobs_start_apart() {
        let p = policy(20000, 20000);
        assert_ne!(derived_start(&p, "1001"), derived_start(&p, "1002"));
    }

    #[test]
    fn skips_a_taken_port_and_wraps() {
        let p = policy(30000, 4);
        assert_eq!(candidates(&p, "3"), vec![30003, 30000, 30001, 30002]);
        assert_eq!(choose_with(&p, "3", |port| port != 30003).unwrap(), 30000);
        assert_eq!(choose_with(&p, "1", |port| port != 30001).unwrap(), 30002);
        assert!(matches!(choose_with(&p, "1", |_| false), Err(PortError::Exhausted { .. })));
    }

    #[test]
    fn fixed_port_is_used_or_refused() {
        let p = PortPolicy { fixed: Some(8000), base: 20000, span: 10 };
        assert_eq!(choose_with(&p, "5", |_| true).unwrap(), 8000);
        assert_eq!(choose_with(&p, "5", |_| false), Err(PortError::FixedTaken { port: 8000 }));
    }

    #[test]
    fn listening_sockets_from_proc_net_tcp() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:5208 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 123456 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:5208 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000  1000        0 777 1 0000000000000000 20 4 30 10 -1\n\
   2: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 999 1 0000000000000000 100 0 0 10 0\n";
        assert_eq!(listening_inodes(table, 0x5208), vec![123456], "the LISTEN row only, not a connection");
        assert_eq!(listening_inodes(table, 8080), vec![999]);
        assert!(listening_inodes(table, 1).is_empty());
    }

    /// A listener held by a process below the engine's head (a wrapper script's vLLM) is the
    /// engine's: found through the kernel's children lists.
    #[test]
    fn a_listener_below_the_engine_head_is_the_engines() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let listen = format!(
            "import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', {port}))\ns.listen()\ntime.sleep(30)\n"
        );
        // `; exit` keeps the shell as the head, with the listener its child.
        let mut head =
            std::process::Command::new("sh").args(["-c", "python3 -c \"$0\"; exit", &listen]).spawn().unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < until, "the child never listened");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let tree = children_tree(head.id() as i32).unwrap();
        assert!(!tree.is_empty());
        assert_eq!(listener_of(port, head.id()), Listener::Engine);
        for pid in tree {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = head.kill();
        let _ = head.wait();
    }

    /// Real sockets and processes: this test process's listener is the engine's when the engine
    /// is this process; with the engine being a child (`sleep`) it is a foreign listener, and
    /// this process is named as its holder.
    #[test]
    fn listener_owner_is_found_by_socket_inode() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(listener_of(port, std::process::id()), Listener::Engine);
        let mut other = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let me = std::process::id() as i32;
        match listener_of(port, other.id()) {
            Listener::Foreign { pids } => assert!(pids.contains(&me), "{pids:?}"),
            l => panic!("expected a foreign listener, got {l:?}"),
        }
        let _ = other.kill();
        let _ = other.wait();
        drop(listener);
        assert_eq!(listener_of(port, std::process::id()), Listener::None);
    }

    #[test]
    fn real_bind_check_sees_a_listener() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(!is_free(port, "127.0.0.1"));
        let p = PortPolicy { fixed: None, base: port, span: 2 };
        let chosen = choose(&p, "0", "127.0.0.1").unwrap();
        assert_ne!(chosen, port);
    }
}
