//! Helpers the end-to-end test files share.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// `target/<profile>/payload`, next to this test executable's parent dir; built once per test
/// process with `cargo build -p payload` (a no-op when it is fresh).
pub fn payload_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>").to_path_buf();
        let bin = profile_dir.join("payload");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-q", "-p", "payload", "--bin", "payload"]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build -p payload");
        assert!(status.success() && bin.is_file(), "cargo build -p payload failed; {} missing", bin.display());
        bin
    })
}

pub fn unique() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{}{:x}{}", std::process::id(), nanos, N.fetch_add(1, Ordering::SeqCst))
}
