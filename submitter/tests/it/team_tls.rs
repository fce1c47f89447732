//! Team history by default (issue 25), against a real PostgreSQL with TLS: a server of this test's
//! own, started from the installed binaries (`/usr/lib/postgresql/*/bin`) on a free port with a
//! self-signed certificate generated per run, `ssl = on`, and `pg_hba.conf` admitting TCP clients
//! only over TLS (`hostssl`). The team connects with Supabase's pooler URL form,
//! `postgresql://USER.PROJECT:PASSWORD@HOST:PORT/postgres?sslmode=require`, so the role is
//! `user.project`. A fresh user (empty SQLite ledger) whose profile names the team database gets
//! `skip` for every pair the team finished on the first `plan`, without `import`; with the server
//! stopped, `launch` submits nothing and says so. Without the binaries it prints `skipping: …`
//! (and fails in CI).

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use submitter::ledger::open_ledger;
use tempfile::TempDir;

use crate::ledger::Store;
use crate::queueing::{TestCluster, text};

/// The role Supabase's pooler URL form implies (`USER.PROJECT`).
const POOLER_ROLE: &str = "user.project";

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

fn skip(why: &str) -> Option<TlsPostgres> {
    assert!(!in_ci(), "CI must provide {why}");
    eprintln!("skipping: {why}");
    None
}

/// A PostgreSQL server of this test's own, with TLS; stopped and removed on drop.
struct TlsPostgres {
    dir: TempDir,
    bin: PathBuf,
    port: u16,
    password: String,
    /// As root, the server runs as `postgres` (it refuses to run as root).
    as_postgres: bool,
}

impl TlsPostgres {
    fn start() -> Option<TlsPostgres> {
        let Some(bin) = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|b| b.join("initdb").is_file())
            .max()
        else {
            return skip("PostgreSQL's binaries (/usr/lib/postgresql/*/bin/initdb)");
        };
        if Command::new("openssl").arg("version").output().is_err() {
            return skip("openssl (to make the test's self-signed certificate)");
        }
        let as_postgres = nix::unistd::geteuid().is_root();
        let owner = if as_postgres {
            match nix::unistd::User::from_name("postgres").ok().flatten() {
                Some(user) => Some(user),
                None => return skip("a `postgres` user to run the test's server as (it refuses root)"),
            }
        } else {
            None
        };
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (key, cert) = (root.join("server.key"), root.join("server.crt"));
        let made = self_signed(&key, &cert);
        assert!(made.status.success(), "openssl: {}", text(&made));
        let password = made_up_password();
        if let Some(user) = &owner {
            for path in [root.to_path_buf(), key.clone(), cert.clone()] {
                std::os::unix::fs::chown(&path, Some(user.uid.as_raw()), Some(user.gid.as_raw())).unwrap();
            }
        }
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let port = free_port();
        let server = TlsPostgres { dir, bin, port, password, as_postgres };
        let data = server.data();
        let init = server.pg(
            "initdb",
            &["-D", data.to_str().unwrap(), "-U", "postgres", "--auth-local=trust", "--auth-host=reject", "-E", "UTF8"],
        );
        assert!(init.status.success(), "initdb: {}", text(&init));
        // Unix socket: trust (the test's admin connection); TCP: TLS with a password, nothing else.
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\nhostnossl all all 0.0.0.0/0 reject\n",
        )
        .unwrap();
        let conf = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{sock}'\nssl = on\n\
             ssl_cert_file = '{cert}'\nssl_key_file = '{key}'\npassword_encryption = 'scram-sha-256'\n\
             max_connections = 20\nshared_buffers = 16MB\nfsync = off\n",
            sock = server.dir.path().display(),
            cert = cert.display(),
            key = key.display(),
        );
        let mut conf_file = std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf")).unwrap();
        std::io::Write::write_all(&mut conf_file, conf.as_bytes()).unwrap();
        server.start_server();
        // The pooler's role, with a dot in its name, owning the OT-Agent tables.
        let mut admin = server.admin();
        admin
            .batch_execute(&format!(
                "CREATE ROLE \"{POOLER_ROLE}\" LOGIN PASSWORD '{}';
                 GRANT USAGE, CREATE ON SCHEMA public TO \"{POOLER_ROLE}\";",
                server.password
            ))
            .unwrap();
        Some(server)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Runs one of the server's programs, as `postgres` when this test runs as root.
    fn pg(&self, program: &str, args: &[&str]) -> Output {
        let exe = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        command.args(args).output().unwrap()
    }

    fn start_server(&self) {
        let log = self.dir.path().join("server.log");
        let out = self.pg(
            "pg_ctl",
            &["-D", self.data().to_str().unwrap(), "-l", log.to_str().unwrap(), "-w", "-t", "120", "start"],
        );
        assert!(
            out.status.success(),
            "pg_ctl start: {}\n{}",
            text(&out),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    fn stop_server(&self) {
        let out = self.pg("pg_ctl", &["-D", self.data().to_str().unwrap(), "-m", "fast", "-w", "-t", "120", "stop"]);
        assert!(out.status.success(), "pg_ctl stop: {}", text(&out));
    }

    /// The superuser over the Unix socket (trusted there).
    fn admin(&self) -> postgres::Client {
        let mut config = postgres::Config::new();
        config.host_path(self.dir.path()).port(self.port).user("postgres").dbname("postgres");
        config.connect_timeout(Duration::from_secs(30));
        config.connect(postgres::NoTls).expect("admin connection over the socket")
    }

    /// Supabase's pooler URL form, aimed at this server.
    fn pooler_url(&self, sslmode: &str) -> String {
        format!("postgresql://{POOLER_ROLE}:{}@127.0.0.1:{}/postgres?sslmode={sslmode}", self.password, self.port)
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let _ = self.pg("pg_ctl", &["-D", self.data().to_str().unwrap(), "-m", "immediate", "stop"]);
    }
}

/// A self-signed certificate for `localhost` (no IP address in it) that is not a CA, so it can be
/// its own trust anchor for a chain check (webpki refuses a CA certificate as the server's).
fn self_signed(key: &Path, cert: &Path) -> Output {
    Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE", "-keyout"])
        .arg(key)
        .arg("-out")
        .arg(cert)
        .output()
        .unwrap()
}

/// A password made up for this run (never a literal in the source).
fn made_up_password() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    format!("tls{:016x}", hasher.finish())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn plan_line<'a>(plan: &'a str, model: &str, benchmark: &str) -> &'a str {
    plan.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(model) && l.split_whitespace().nth(2) == Some(benchmark))
        .unwrap_or_else(|| panic!("no plan line for {model} {benchmark}:\n{plan}"))
}

/// Lines of stderr that are errors (`error: …`), what the one-line rule counts.
fn error_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.starts_with("error:")).map(String::from).collect()
}

fn append_secret(root: &Path, line: &str) {
    let mut file = std::fs::OpenOptions::new().append(true).open(root.join("secrets.env")).unwrap();
    std::io::Write::write_all(&mut file, format!("{line}\n").as_bytes()).unwrap();
}

const ROW: &str = "20000000-0000-0000-0000-00000000000";

#[test]
fn fresh_user_skips_what_the_team_finished_over_tls_with_the_pooler_url() {
    let Some(server) = TlsPostgres::start() else { return };
    let mut admin = server.admin();
    let ddl = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sql/ot_agent_schema.sql")).unwrap();
    admin.batch_execute(&format!("SET ROLE \"{POOLER_ROLE}\"; {ddl} {}", crate::team::HISTORY)).unwrap();

    let cluster = TestCluster::new("teamtls", |profile| {
        crate::team::four_gpus(profile);
        profile.push_str("team: {database_secret: TEAM_DATABASE_URL, timeout_s: 20}\n");
    });
    append_secret(cluster.root(), &format!("TEAM_DATABASE_URL={}", server.pooler_url("require")));
    let store = Store::sqlite();
    let list = cluster.models_file(&["org/Alpha-8B", "org/sft-run-a", "Qwen/Qwen3-32B", "org/Mixer-30B-A3B"]);
    let selection = ["--preset", "tb2", "--preset", "v2", "--models-file", list.to_str().unwrap()];

    // The first plan of a fresh user, no `import` run: what the team finished is skipped, each
    // skip naming the team's row; the running job is the team's; cleared metrics and failures
    // are resubmitted.
    let out = cluster.run(&["plan"], &store.spec, &selection, &[]);
    let plan = text(&out);
    assert!(out.status.success(), "{plan}");
    let source = format!("postgresql://{POOLER_ROLE}@127.0.0.1:{}/postgres", server.port);
    assert!(plan.contains(&format!("team      {source}: 6 new, 0 updated, 6 job(s) read")), "{plan}");
    for (benchmark, row) in [("terminal_bench_2", "1"), ("dev_set_v2", "2")] {
        let line = plan_line(&plan, "org/Alpha-8B", benchmark);
        assert!(line.starts_with("skip") && line.contains("finished"), "{line}");
        assert!(line.contains(&format!("evidence: team row {ROW}{row} (ledger attempt")), "{line}");
    }
    let running = plan_line(&plan, "org/sft-run-a", "terminal_bench_2");
    assert!(running.contains("in progress on ot-agent, job 1007") && running.contains(&format!("{ROW}3")), "{running}");
    assert!(plan_line(&plan, "Qwen/Qwen3-32B", "terminal_bench_2").contains("metrics cleared"), "{plan}");
    assert!(plan_line(&plan, "org/Mixer-30B-A3B", "terminal_bench_2").starts_with("resubmit"), "{plan}");
    assert!(plan_line(&plan, "org/Mixer-30B-A3B", "dev_set_v2").starts_with("submit"), "{plan}");
    assert!(!plan.contains(&server.password), "password in the output: {plan}");

    // Incremental: the team finishes Mixer on dev_set_v2; the next plan reads only that row and
    // skips the pair on its evidence. The JSON says where each skip came from.
    admin
        .batch_execute(&format!(
            "SET ROLE \"{POOLER_ROLE}\";
             INSERT INTO sandbox_jobs (id, job_name, username, job_status, submitted_at, started_at, ended_at, created_at,
                                       slurm_job_id, config, metrics, stats, model_id, benchmark_id, n_trials)
             VALUES ('{ROW}9', 'dev_set_v2__org__Mixer-30B-A3B', 'carol', 'Finished', now(), now(), now(), now(), '990',
                     '{{\"agent\": \"terminus-2\", \"timeout_multiplier\": 1.0}}', '[{{\"mean\": 0.3}}]', '{{}}',
                     '00000000-0000-0000-0000-000000000006', '10000000-0000-0000-0000-000000000002', 100);"
        ))
        .unwrap();
    let out = cluster.run(&["plan"], &store.spec, &[&selection[..], &["--format", "json"]].concat(), &[]);
    assert!(out.status.success(), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (doc["team"]["attempts_new"].as_u64(), doc["team"]["offline"].as_bool()),
        (Some(1), Some(false)),
        "{}",
        doc["team"]
    );
    let job = |model: &str, benchmark: &str| -> Value {
        doc["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["model"] == model && j["benchmark"] == benchmark)
            .unwrap()
            .clone()
    };
    let mixer = job("org/Mixer-30B-A3B", "dev_set_v2");
    assert_eq!(
        (mixer["decision"].as_str(), mixer["evidence"]["source"].as_str()),
        (Some("skip"), Some("team")),
        "{mixer}"
    );
    assert_eq!(mixer["evidence"]["team_row"].as_str(), Some(format!("{ROW}9").as_str()), "{mixer}");
    assert!(job("Qwen/Qwen3-32B", "terminal_bench_2").get("evidence").is_none(), "a resubmit rests on no evidence row");

    // TLS is what carries it: the same URL without encryption is refused by the server (the
    // shell's $SUBMITTER_TEAM_DB wins over the secrets file), and the plan fails closed.
    let plain = server.pooler_url("disable");
    let out = cluster.run(&["plan"], &store.spec, &selection, &[("SUBMITTER_TEAM_DB", &plain)]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "one error line: {}", text(&out));
    assert!(errors[0].contains("nothing planned") && errors[0].contains("--offline-ledger"), "{}", errors[0]);
    assert!(errors[0].contains("no encryption") || errors[0].contains("pg_hba"), "{}", errors[0]);
    eprintln!("without TLS: {}", errors[0]);
    assert!(!text(&out).contains(&server.password), "password leaked: {}", text(&out));

    // Bounded: a team database that does not answer (its jobs table locked by another session)
    // fails the plan after `team.timeout_s`, not never.
    let profile = cluster.root().join("clusters/teamtls.yaml");
    let text_of = std::fs::read_to_string(&profile).unwrap();
    std::fs::write(&profile, text_of.replace("timeout_s: 20", "timeout_s: 2")).unwrap();
    let mut locker = admin.transaction().unwrap();
    locker.batch_execute("LOCK TABLE sandbox_jobs IN ACCESS EXCLUSIVE MODE").unwrap();
    let mut child = cluster
        .command(&["plan"], &store.spec, &selection, &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("plan still waiting on a locked team database after 120 s (team.timeout_s is 2)");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    eprintln!("plan against a locked team database ended in {:.2} s", started.elapsed().as_secs_f64());
    locker.rollback().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let errors = error_lines(&out);
    assert!(errors.len() == 1 && errors[0].contains("statement timeout"), "{}", text(&out));
    std::fs::write(&profile, text_of).unwrap();

    // The team database down: `launch` submits nothing, in one line, exit 3 (the ledger is
    // unavailable); the own ledger holds no attempt of this cluster.
    server.stop_server();
    crate::support::binaries();
    let started = Instant::now();
    let out = cluster.run(&["launch"], &store.spec, &[&["--once"][..], &selection].concat(), &[]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(3), "{said}");
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 1, "one error line: {said}");
    assert!(errors[0].contains("nothing submitted") && errors[0].contains("--offline-ledger"), "{}", errors[0]);
    assert!(errors[0].contains("team database") && errors[0].contains("unreachable"), "{}", errors[0]);
    eprintln!("team database down: {}", errors[0]);
    assert!(!said.contains(&server.password), "password leaked: {said}");
    assert!(!said.contains(" submitted,"), "{said}");
    eprintln!("launch with the team database down ended in {:.2} s", started.elapsed().as_secs_f64());
    let ledger = open_ledger(&store.spec).unwrap();
    let own: Vec<_> = ledger.latest_per_pair().unwrap().into_iter().filter(|p| p.latest.cluster == "teamtls").collect();
    assert!(own.is_empty(), "nothing of this cluster in the ledger: {own:?}");

    // The explicit escape: the own ledger only, and it says so; what was folded in earlier still
    // counts (its evidence is the team's row).
    let out = cluster.run(&["plan"], &store.spec, &[&selection[..], &["--offline-ledger"]].concat(), &[]);
    let offline = text(&out);
    assert!(out.status.success(), "{offline}");
    assert!(offline.contains("team      offline (--offline-ledger)"), "{offline}");
    assert!(plan_line(&offline, "org/Alpha-8B", "terminal_bench_2").contains(&format!("team row {ROW}1")), "{offline}");
}

/// libpq's `verify-ca` (ledger/postgres.rs `LibpqVerifier`): the server's chain must lead to
/// `sslrootcert`, its name is not checked; `verify-full` checks the name too (the certificate names
/// `localhost`, the URL `127.0.0.1`), and a chain to another root fails either way.
#[test]
fn verify_ca_checks_the_chain_and_not_the_name() {
    let Some(server) = TlsPostgres::start() else { return };
    let url = |mode: &str, root: &Path| format!("{}&sslrootcert={}", server.pooler_url(mode), root.display());
    let own = server.dir.path().join("server.crt");
    open_ledger(&url("verify-ca", &own)).expect("verify-ca: the chain verifies, the name is not asked");
    let refused = open_ledger(&url("verify-full", &own)).err().expect("verify-full checks the name");
    assert!(refused.to_string().contains("127.0.0.1"), "{refused}");
    let other = tempfile::tempdir().unwrap();
    let made = self_signed(&other.path().join("other.key"), &other.path().join("other.crt"));
    assert!(made.status.success(), "openssl: {}", text(&made));
    let refused = open_ledger(&url("verify-ca", &other.path().join("other.crt")))
        .err()
        .expect("verify-ca: a chain to another root is refused");
    assert!(!refused.to_string().contains(&server.password), "the password in an error: {refused}");
}
