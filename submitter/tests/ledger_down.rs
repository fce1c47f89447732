//! PostgreSQL really stopped while a submitter runs: nothing is submitted, one clear error, exit 2.
//!
//! A test binary of its own (not a module of `tests/it`) because it stops the shared PostgreSQL
//! server: cargo runs test binaries one after another, so no other test sees the outage. It starts
//! the server again whatever happens (a drop guard).

#![allow(clippy::print_stderr)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const SUBMITTER: &str = env!("CARGO_BIN_EXE_submitter");
#[path = "common/pg.rs"]
mod pg;

fn pg_ready() -> bool {
    Command::new("pg_isready").args(["-h", "127.0.0.1", "-p", "5432"]).output().is_ok_and(|o| o.status.success())
}

fn pg_ctl(action: &str) -> bool {
    Command::new("pg_ctlcluster").args(["15", "main", action]).status().is_ok_and(|s| s.success())
}

/// Starts PostgreSQL again when the test ends, passing or not.
struct RestartOnDrop;

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        if !pg_ready() {
            pg_ctl("start");
        }
        let start = Instant::now();
        while !pg_ready() && start.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[test]
fn postgres_stopped_means_nothing_submitted() {
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let slurm =
        Command::new("scontrol").arg("ping").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("UP"));
    let controllable = Command::new("pg_ctlcluster").arg("--help").output().is_ok();
    if !(pg_ready() && slurm && controllable) {
        assert!(!in_ci, "CI must provide PostgreSQL (pg_ctlcluster) and Slurm");
        eprintln!("skipping: no local PostgreSQL cluster 15/main or no Slurm");
        return;
    }
    let Some(url) = pg::test_pg_url() else {
        assert!(!in_ci, "CI must provide the test PostgreSQL URL (scripts/services.sh up writes it)");
        eprintln!("skipping: no test PostgreSQL URL");
        return;
    };
    let password = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(info, _)| info.split_once(':'))
        .map(|(_, p)| p.to_string());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let state = tempfile::tempdir().unwrap();
    let model = format!("down/Probe-{}-1B", std::process::id());
    let launch = || {
        Command::new(SUBMITTER)
            .args(["launch", "--once", "--cluster", "local", "--preset", "tb2", "--model", &model, "--state-dir"])
            .arg(state.path())
            // The URL holds the test role's password: never on argv (the submitter refuses it there).
            .env("SUBMITTER_LEDGER", &url)
            .env("SUBMITTER_HOME", root)
            .output()
            .unwrap()
    };
    let job_name = format!("tb2_Probe-{}-1B", std::process::id());
    let queued = || {
        let out = Command::new("squeue").args(["-h", "--states=all", "-n", &job_name, "-o", "%i"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };

    let _guard = RestartOnDrop;
    assert!(pg_ctl("stop"), "pg_ctlcluster 15 main stop");
    let out = launch();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // 3: the ledger is unavailable (docs/exit-codes.md).
    assert_eq!(out.status.code(), Some(3), "stdout: {}\nstderr: {stderr}", String::from_utf8_lossy(&out.stdout));
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one error line: {stderr}");
    assert!(errors[0].contains("unreachable") && errors[0].contains("127.0.0.1"), "{stderr}");
    if let Some(password) = password {
        assert!(!stderr.contains(&password), "password in the message: {stderr}");
    }
    assert!(queued().is_empty(), "a job was submitted while the ledger was down: {}", queued());
}
