//! Helpers the end-to-end test files share.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// `target/<profile>/payload`, next to this test executable's parent dir; built once per test
/// process with `cargo build -p payload` (a no-op when it is fresh). `$E2E_PAYLOAD_BIN` names
/// another binary instead (e.g. an older build, to see a test fail before its fix).
pub fn payload_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os("E2E_PAYLOAD_BIN").filter(|b| !b.is_empty()) {
        Some(bin) => PathBuf::from(bin),
        None => workspace_bin("payload", "payload"),
    })
}

/// `target/<profile>/<bin>` of workspace package `package`, built with `cargo build -p` (a no-op
/// when it is fresh). Cargo builds only the binaries an integration test's own package declares.
pub fn workspace_bin(package: &str, bin: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf();
    let path = profile_dir.join(bin);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-q", "-p", package, "--bin", bin]);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().unwrap_or_else(|e| panic!("run cargo build -p {package}: {e}"));
    assert!(status.success() && path.is_file(), "cargo build -p {package} failed; {} missing", path.display());
    path
}

pub fn unique() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{}{:x}{}", std::process::id(), nanos, N.fetch_add(1, Ordering::SeqCst))
}

/// Every descendant of `root` (by `/proc/<pid>/stat` ppid).
pub fn descendants(root: i32) -> Vec<i32> {
    let mut table = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        let Some(close) = stat.rfind(')') else { continue };
        let ppid = stat[close + 1..].split_whitespace().nth(1).and_then(|p| p.parse::<i32>().ok()).unwrap_or(0);
        table.push((pid, ppid));
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for (pid, ppid) in &table {
            if *ppid == p && !out.contains(pid) {
                out.push(*pid);
                stack.push(*pid);
            }
        }
    }
    out
}

/// A port free on loopback right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
