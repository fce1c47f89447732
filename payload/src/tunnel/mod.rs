//! Tunnels (docs/design.md §6.5, docs/tunnels.md): `none`; a **Pinggy** reverse tunnel for installed-harness
//! agents (the agent runs in the remote sandbox and calls the model back over a public URL); a
//! **SOCKS** egress proxy through a login node for compute nodes without internet; and both in one
//! job for installed-harness agents on such clusters (Pinggy's `egress`).
//!
//! Each tunnel is an `ssh` child in its own process group (role [`Role::Tunnel`]; the egress proxy
//! of a combined job [`Role::Egress`]), torn down last. What it does next is decided by a machine
//! without I/O ([`machine`]) with Pinggy and SOCKS as two strategies ([`strategy`]); [`Tunnel`] is
//! the thin driver ([`driver`]) that reads ssh's output, writes `tunnel.log`, spawns and signals ssh, runs the
//! checks ([`verify`]), holds the leases ([`lease`]) and records the events. `payload plan` steps
//! the same machines once and shows their first actions ([`plan`]).
//!
//! Secrets: the Pinggy token is the ssh `User` in a generated 0600 config in a run-private
//! directory outside the run dir (never in argv, logs, status or the spec); ssh's raw output goes
//! to that directory and is copied, redacted, into `tunnel.log`.

mod driver;
pub(crate) mod lease;
pub(crate) mod machine;
pub(crate) mod output;
mod plan;
pub(crate) mod socks;
pub(crate) mod sshconf;
pub(crate) mod strategy;
pub(crate) mod verify;

use std::collections::BTreeMap;
use std::path::PathBuf;

use launch_spec::OutcomeClass;
use launch_spec::spec::{PinggySpec, ProxyMode, SocksSpec, TunnelSpec};

use crate::failure::Failure;
use crate::secrets::Secrets;
use crate::supervisor::Role;
pub(crate) use driver::{Start, Tunnel, TunnelPoll};
pub(crate) use plan::{PlanInputs, TunnelPlan, plan, write_plan};
pub(crate) use strategy::{SOCKS_ALIAS, pair_order};
#[cfg(test)] // used only by the tests
use {
    driver::PrivateDir,
    machine::{MAX_BACKOFF, backoff},
    std::path::Path,
    strategy::{pinggy_argv, socks_argv},
};

/// vLLM reads its API key from this variable (never from argv).
pub(crate) const VLLM_KEY_VAR: &str = "VLLM_API_KEY";
/// Shown instead of the per-job key by `payload plan`.
pub(crate) const GENERATED: &str = "<generated per job>";

pub(crate) fn kind(spec: &TunnelSpec) -> &'static str {
    match spec {
        TunnelSpec::None => "none",
        TunnelSpec::Pinggy(p) if p.egress.is_some() => "pinggy+socks",
        TunnelSpec::Pinggy(_) => "pinggy",
        TunnelSpec::Socks(_) => "socks",
    }
}

/// Whether vLLM is reachable from outside (then it gets a per-job API key).
pub(crate) fn exposes_model(spec: &TunnelSpec) -> bool {
    matches!(spec, TunnelSpec::Pinggy(_))
}

/// Secret names the tunnel needs from the secrets file.
pub(crate) fn secret_names(spec: &TunnelSpec) -> Vec<String> {
    match spec {
        TunnelSpec::Pinggy(p) => p.pairs().into_iter().map(|pair| pair.token_secret).collect(),
        _ => Vec::new(),
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum TunnelError {
    #[error("the {kind} tunnel needs `{program}` ({why}), which is not on PATH")]
    MissingProgram { kind: &'static str, program: String, why: &'static str },
    #[error("none of the Pinggy token secrets ({names}) is set in the secrets file {file}")]
    NoToken { names: String, file: PathBuf },
    #[error("cannot prepare the tunnel's private directory under {dir}: {reason}")]
    PrivateDir { dir: PathBuf, reason: String },
    #[error("tunnel ssh config: {0}")]
    Config(#[from] sshconf::ConfigError),
    #[error("SOCKS port: {0}")]
    Port(crate::ports::PortError),
}

impl From<TunnelError> for Failure {
    fn from(err: TunnelError) -> Self {
        let (class, cause) = match &err {
            TunnelError::MissingProgram { .. } => (OutcomeClass::Tunnel, "missing_program"),
            TunnelError::NoToken { .. } => (OutcomeClass::Secrets, "missing_token"),
            TunnelError::PrivateDir { .. } => (OutcomeClass::Tunnel, "private_dir"),
            TunnelError::Config(_) => (OutcomeClass::Tunnel, "config"),
            TunnelError::Port(_) => (OutcomeClass::Tunnel, "port"),
        };
        Failure::new(class, err.to_string()).with_cause(cause)
    }
}

/// The programs a tunnel runs, resolved on the child PATH.
#[derive(Debug, Clone, Default)]
pub struct Programs {
    pub ssh: PathBuf,
    pub proxychains: Option<PathBuf>,
}

/// Resolves the tunnel's programs (`ssh`; the proxychains binary in that mode).
pub(crate) fn programs(spec: &TunnelSpec, child_path: &str) -> Result<Option<Programs>, TunnelError> {
    let kind = self::kind(spec);
    let resolve = |program: &str, why: &'static str| {
        crate::childenv::resolve_program(program, None, child_path).map_err(|_| TunnelError::MissingProgram {
            kind,
            program: program.to_string(),
            why,
        })
    };
    if matches!(spec, TunnelSpec::None) {
        return Ok(None);
    }
    Ok(Some(Programs {
        ssh: resolve("ssh", "OpenSSH client")?,
        proxychains: match socks_spec(spec) {
            Some(s) if s.mode == ProxyMode::Proxychains => {
                Some(resolve(s.proxychains_bin.as_deref().unwrap_or("proxychains4"), "tunnel.mode proxychains")?)
            }
            _ => None,
        },
    }))
}

/// The SOCKS settings of a spec: a `socks` tunnel, or a Pinggy tunnel's egress.
pub(crate) fn socks_spec(spec: &TunnelSpec) -> Option<&SocksSpec> {
    match spec {
        TunnelSpec::Socks(s) => Some(s),
        TunnelSpec::Pinggy(p) => p.egress.as_deref(),
        TunnelSpec::None => None,
    }
}

/// The SOCKS port: the spec's policy, never the engine's port.
pub(crate) fn socks_port(spec: &SocksSpec, job_id: &str, engine_port: u16) -> Result<u16, crate::ports::PortError> {
    crate::ports::choose_with(&spec.port, job_id, |p| p != engine_port && crate::ports::is_free(p, "127.0.0.1"))
}

// ------------------------------------------------------------------------------ the job's tunnels

/// One instance a spec runs: its role, strategy kind and settings.
enum Part<'a> {
    Pinggy(&'a PinggySpec),
    Socks(&'a SocksSpec),
}

/// The instances of a spec, the egress proxy first (Pinggy's check goes through it).
fn parts(spec: &TunnelSpec) -> Vec<(Role, Part<'_>)> {
    match spec {
        TunnelSpec::None => Vec::new(),
        TunnelSpec::Socks(s) => vec![(Role::Tunnel, Part::Socks(s))],
        TunnelSpec::Pinggy(p) => match &p.egress {
            Some(s) => vec![(Role::Egress, Part::Socks(s)), (Role::Tunnel, Part::Pinggy(p))],
            None => vec![(Role::Tunnel, Part::Pinggy(p))],
        },
    }
}

/// What every instance's strategy needs beside its spec (the same for `run` and `plan`).
struct Ctx<'a> {
    ssh: String,
    /// Secret name → token; `plan` passes placeholders naming the secret.
    tokens: BTreeMap<String, String>,
    job_id: &'a str,
    engine_host: &'a str,
    engine_port: u16,
    served_name: &'a str,
    /// The local SOCKS port, when the spec has a SOCKS part.
    socks_port: Option<u16>,
}

fn strategy_for(
    spec: &TunnelSpec,
    part: &Part<'_>,
    ctx: &Ctx<'_>,
    paths: strategy::Paths,
) -> Box<dyn machine::Strategy> {
    match part {
        Part::Socks(s) => Box::new(strategy::Socks {
            spec: (*s).clone(),
            port: ctx.socks_port.unwrap_or(s.port.base),
            ssh: ctx.ssh.clone(),
            paths,
        }),
        Part::Pinggy(p) => Box::new(strategy::Pinggy::new(
            p,
            strategy::PinggyTarget {
                ssh: ctx.ssh.clone(),
                paths,
                tokens: ctx.tokens.clone(),
                job_id: ctx.job_id.to_string(),
                engine_host: ctx.engine_host.to_string(),
                engine_port: ctx.engine_port,
                served_name: ctx.served_name.to_string(),
                egress: socks_spec(spec).cloned().zip(ctx.socks_port),
            },
        )),
    }
}

/// The Pinggy tokens present in the secrets file (`shown`: each as `<token from secret NAME>`).
fn tokens(spec: &TunnelSpec, secrets: &Secrets, shown: bool) -> Result<BTreeMap<String, String>, TunnelError> {
    let TunnelSpec::Pinggy(p) = spec else { return Ok(BTreeMap::new()) };
    let pairs = p.pairs();
    let mut tokens = BTreeMap::new();
    for pair in &pairs {
        if let Some(token) = secrets.get(&pair.token_secret) {
            sshconf::check_user(token, &pair.token_secret)?;
            let value = if shown { format!("<token from secret {}>", pair.token_secret) } else { token.to_string() };
            tokens.insert(pair.token_secret.clone(), value);
        }
    }
    if tokens.is_empty() {
        return Err(TunnelError::NoToken {
            names: pairs.iter().map(|p| p.token_secret.clone()).collect::<Vec<_>>().join(", "),
            file: secrets.path().to_path_buf(),
        });
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn pinggy() -> PinggySpec {
        serde_json::from_value(json!({
            "host": "pro.pinggy.io", "public_url": "https://a.a.pinggy.link", "token_secret": "PINGGY_TOKEN",
            "bank": [{"public_url": "https://b.a.pinggy.link", "token_secret": "PINGGY_TOKEN_2"}]
        }))
        .unwrap()
    }

    #[test]
    fn argv_never_carries_the_token() {
        let p = pinggy();
        let a = pinggy_argv("/usr/bin/ssh", "/tmp/x/ssh_config", &p, "127.0.0.1", 23456);
        assert_eq!(a, ["/usr/bin/ssh", "-F", "/tmp/x/ssh_config", "-T", "-R", "0:127.0.0.1:23456", "payload-pinggy"]);
        assert_eq!(pinggy_argv("ssh", "c", &p, "0.0.0.0", 1)[5], "0:127.0.0.1:1");
        assert_eq!(pinggy_argv("ssh", "c", &p, "::1", 1)[5], "0:[::1]:1");
        let s = socks_argv("ssh", "c", 40001);
        assert_eq!(s, ["ssh", "-F", "c", "-N", "-D", "127.0.0.1:40001", "payload-socks"]);
    }

    #[test]
    fn pair_rotation_and_backoff() {
        assert_eq!(pair_order(3, "4"), vec![1, 2, 0]);
        assert_eq!(pair_order(3, "3"), vec![0, 1, 2]);
        assert_eq!(pair_order(1, "x"), vec![0]);
        assert!(pair_order(0, "x").is_empty());
        assert_eq!(backoff(2.0, 1), Duration::from_secs(2));
        assert_eq!(backoff(2.0, 3), Duration::from_secs(8));
        assert_eq!(backoff(1e20, 3), MAX_BACKOFF);
        assert_eq!(backoff(f64::NAN, 1), Duration::ZERO);
        assert_eq!(backoff(2.0, 40), MAX_BACKOFF);
    }

    #[test]
    fn plan_shows_no_token() {
        let spec = TunnelSpec::Pinggy(pinggy());
        let secrets =
            Secrets::from_pairs(Path::new("/s.env"), [("PINGGY_TOKEN_2".to_string(), "tok-secret-2".to_string())]);
        let mut problems = Vec::new();
        let inp = PlanInputs {
            secrets: &secrets,
            job_id: "3",
            engine_host: "127.0.0.1",
            engine_port: 23456,
            served_name: "Qwen3-8B",
            node: "n".into(),
            child_path: "/usr/bin:/bin",
        };
        let plan = plan(&spec, &inp, &mut problems);
        let text = serde_json::to_string(&plan).unwrap();
        assert!(!text.contains("tok-secret"), "{text}");
        // Pair a's secret is missing: b is the one the job would use.
        assert_eq!(plan.public_url.as_deref(), Some("https://b.a.pinggy.link"));
        assert!(
            plan.pairs.iter().any(|p| p.starts_with("https://a.") && p.contains("not in the secrets file")),
            "{:?}",
            plan.pairs
        );
        assert!(plan.ssh_config.as_deref().unwrap().contains("User <token from secret PINGGY_TOKEN_2>"));
        assert!(plan.description.starts_with("pinggy: "), "{}", plan.description);
        // The machine's first actions: b (first in job 3's order) taken, then its spawn.
        assert!(plan.actions[0].starts_with("event tunnel_pair {\"public_url\":\"https://b."), "{:?}", plan.actions);
        assert!(
            plan.actions.last().unwrap().starts_with("write the ssh config (0600) and start "),
            "{:?}",
            plan.actions
        );
        assert!(problems.iter().all(|p| p.cause.as_deref() != Some("missing_token")));
    }

    #[test]
    fn private_dir_is_0700_and_files_0600() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let path;
        {
            let dir = PrivateDir::create(root.path(), "t").unwrap();
            path = dir.path.clone();
            assert_eq!(std::fs::metadata(&dir.path).unwrap().permissions().mode() & 0o777, 0o700);
            let f = dir.write("ssh_config", "x").unwrap();
            assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
            dir.write("ssh_config", "y").unwrap();
            assert_eq!(std::fs::read_to_string(&f).unwrap(), "y");
        }
        assert!(!path.exists());
    }
}
