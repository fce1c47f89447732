//! A real OpenSSH server on a loopback port for the tunnel tests (docs/design.md §10): `/usr/sbin/sshd -f
//! <own config> -D -e` with a generated host key, a generated client key in an `AuthorizedKeysFile`
//! of its own, `StrictModes no`, `UsePAM no`, its own `PidFile`, public-key authentication only.
//!
//! [`Sshd::pinggy`] adds a Pinggy stand-in: a `ForceCommand` that prints Pinggy's banner for the
//! session (`You are authenticated as …`, the http/https URLs) — or, when a marker file names the
//! user, Pinggy's lock message and exit — and then stays up while the client's `-R` forward carries
//! traffic. Pinggy's token is the ssh user name, so each test token is a real (temporary) local
//! account created with `useradd` and removed on drop.

use crate::harness::{descendants, free_port};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub(crate) const SSHD: &str = "/usr/sbin/sshd";

/// Whether the machine can run these tests; in CI (`CI=true`) a missing sshd is a failure.
pub fn available_or_skip() -> bool {
    let ok = Path::new(SSHD).is_file() && which("ssh").is_some() && which("ssh-keygen").is_some();
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "sshd/ssh/ssh-keygen missing in CI: run scripts/services.sh install"
        );
        #[allow(clippy::print_stderr)]
        {
            eprintln!("skipping: no sshd");
        }
    }
    ok
}

pub fn which(program: &str) -> Option<PathBuf> {
    std::env::var("PATH").ok()?.split(':').map(|d| Path::new(d).join(program)).find(|p| p.is_file())
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Generates an ed25519 key pair at `path` (+ `.pub`).
pub(crate) fn keygen(path: &Path) -> String {
    run(Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-C", "e2e", "-f"]).arg(path));
    std::fs::read_to_string(path.with_extension("pub")).unwrap().trim().to_string()
}

static USERS: Mutex<()> = Mutex::new(());

/// A temporary local account named after a test token (sshd needs the user to exist).
pub struct TokenUser {
    pub name: String,
}

impl TokenUser {
    /// `pgy` + 13 hex characters: a valid user name, and unique.
    pub fn create() -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let name = format!("pgy{:013x}", (nanos ^ (u128::from(std::process::id()) << 40)) & 0xf_ffff_ffff_ffff);
        let _guard = USERS.lock().unwrap_or_else(|e| e.into_inner());
        // `-p '*'`: no password but not a locked account (sshd without PAM refuses locked ones).
        run(Command::new("useradd").args(["-M", "-N", "-d", "/nonexistent", "-s", "/bin/sh", "-p", "*", &name]));
        std::thread::sleep(Duration::from_millis(2));
        Self { name }
    }
}

impl Drop for TokenUser {
    fn drop(&mut self) {
        let _guard = USERS.lock().unwrap_or_else(|e| e.into_inner());
        // `-f`: also while a session of the stand-in still runs as this user.
        let _ = Command::new("userdel").args(["-f", &self.name]).output();
    }
}

/// A running sshd.
pub struct Sshd {
    pub port: u16,
    pub dir: PathBuf,
    /// The client key sshd accepts, and one it does not.
    pub client_key: PathBuf,
    pub wrong_key: PathBuf,
    /// `[127.0.0.1]:port <host key>` — for `StrictHostKeyChecking yes`.
    pub known_hosts: PathBuf,
    child: Option<Child>,
}

const STANDIN: &str = r#"#!/bin/sh
# Pinggy stand-in (ForceCommand): Pinggy's session banner, then stay up while the -R forward works.
dir="$(dirname "$0")"
if [ -e "$dir/locked-$USER" ]; then
  echo "A tunnel with the same token is already active."
  exit 1
fi
echo "You are authenticated as $USER"
echo "http://e2e-$USER.a.pinggy.link"
echo "https://e2e-$USER.a.pinggy.link"
# Exits (SIGPIPE) soon after the client is gone.
while :; do sleep 1; echo "" || exit 0; done
"#;

impl Sshd {
    /// Plain sshd (SOCKS tests).
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// sshd with the Pinggy stand-in as `ForceCommand`.
    pub fn pinggy() -> Self {
        Self::start_with(true)
    }

    fn start_with(pinggy: bool) -> Self {
        std::fs::create_dir_all("/run/sshd").unwrap();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir().join(format!("e2e-sshd-{}-{nanos:x}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Token users must read the stand-in script and the markers.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let host_pub = keygen(&dir.join("host_ed25519"));
        let client_pub = keygen(&dir.join("client_ed25519"));
        keygen(&dir.join("wrong_ed25519"));
        std::fs::write(dir.join("authorized_keys"), format!("{client_pub}\n")).unwrap();
        std::fs::set_permissions(dir.join("authorized_keys"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let port = free_port();
        std::fs::write(dir.join("known_hosts"), format!("[127.0.0.1]:{port} {host_pub}\n")).unwrap();
        let mut config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_ed25519\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nUsePAM no\nPermitRootLogin yes\n\
             PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             AllowTcpForwarding yes\nGatewayPorts no\nX11Forwarding no\nPrintMotd no\nMaxStartups 64\n\
             LogLevel VERBOSE\n",
            d = dir.display()
        );
        if pinggy {
            let script = dir.join("pinggy-standin.sh");
            std::fs::write(&script, STANDIN).unwrap();
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
            config.push_str(&format!("ForceCommand {}\n", script.display()));
        }
        std::fs::write(dir.join("sshd_config"), config).unwrap();
        let mut sshd = Self {
            port,
            client_key: dir.join("client_ed25519"),
            wrong_key: dir.join("wrong_ed25519"),
            known_hosts: dir.join("known_hosts"),
            dir,
            child: None,
        };
        sshd.spawn();
        sshd
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("sshd.log")).unwrap();
        let child = Command::new(SSHD)
            .arg("-f")
            .arg(self.dir.join("sshd_config"))
            .args(["-D", "-e"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start sshd");
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < until, "sshd did not listen on {}; log:\n{}", self.port, self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
    }

    /// The sshd process and its session processes (they carry the user name in their titles).
    pub fn pids(&self) -> Vec<i32> {
        let Some(child) = &self.child else { return Vec::new() };
        let root = child.id() as i32;
        let mut out = vec![root];
        out.extend(descendants(root));
        out
    }

    /// Makes the Pinggy stand-in answer `user` with the lock message.
    pub fn lock(&self, user: &str) {
        std::fs::write(self.dir.join(format!("locked-{user}")), "").unwrap();
    }

    /// Stops sshd and every session it serves (the tunnel drops, reconnects are refused).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let root = child.id() as i32;
            for pid in descendants(root) {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
            let _ = child.kill();
            let _ = child.wait();
            for pid in descendants(root) {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Processes (other than `exclude`) whose command line contains `needle`: `pid: cmdline`.
pub fn cmdlines_containing(needle: &str, exclude: &[i32]) -> Vec<String> {
    let mut hits = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        if exclude.contains(&pid) {
            continue;
        }
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else { continue };
        let text = String::from_utf8_lossy(&raw).replace('\0', " ");
        if text.contains(needle) {
            hits.push(format!("{pid}: {text}"));
        }
    }
    hits
}
