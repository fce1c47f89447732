//! The tunnel step's plan: the machines stepped once without I/O, their first actions described
//! for `payload plan` and the events (never a token).

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::Instant;

use launch_spec::spec::{PinggySpec, ProxyMode, SocksSpec, TunnelSpec};

use crate::failure::Failure;
use crate::secrets::Secrets;

use super::machine::{Action, Input, LeaseAnswer, Machine, Phase};
use super::{
    Ctx, Part, Programs, SOCKS_ALIAS, TunnelError, VLLM_KEY_VAR, kind, lease, pair_order, parts, programs, socks,
    socks_port, socks_spec, strategy, strategy_for, tokens,
};

/// What the tunnel step will do, for `payload plan` and events. Never holds a token.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TunnelPlan {
    pub kind: &'static str,
    pub description: String,
    /// ssh's argv (the config file shown as `<generated config>`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
    /// The generated ssh config with the user (token) replaced by its secret's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssh_config: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<String>,
    /// The bank in the order this job would try it, with what is known now (lease held, secret missing).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<String>,
    /// The machine's first actions, as `run` would do them now (leases looked at, not taken).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<String>,
    /// What Harbor gets from the tunnel (SOCKS `env` mode: the proxy variables; the per-job key and
    /// the agent's variables are crate::prepare's).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub harbor_env: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub harbor_prefix: Vec<String>,
    /// The egress proxy a Pinggy tunnel runs beside it on a cluster without internet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<Box<TunnelPlan>>,
}

impl TunnelPlan {
    fn empty(kind: &'static str) -> Self {
        Self {
            kind,
            description: String::new(),
            argv: Vec::new(),
            ssh_config: None,
            public_url: None,
            verify: None,
            pairs: Vec::new(),
            actions: Vec::new(),
            harbor_env: BTreeMap::new(),
            harbor_prefix: Vec::new(),
            egress: None,
        }
    }
}

/// Inputs of the plan that `run` would know.
pub(crate) struct PlanInputs<'a> {
    pub secrets: &'a Secrets,
    pub job_id: &'a str,
    pub(crate) engine_host: &'a str,
    pub(crate) engine_port: u16,
    pub served_name: &'a str,
    pub node: String,
    pub(crate) child_path: &'a str,
}

/// Steps a fresh machine until its first spawn, answering lease requests by looking at the lease
/// files (never taking one): the actions `run` would take first, rendered.
fn first_actions(m: &mut Machine, plan: &mut TunnelPlan) {
    let now = Instant::now();
    let mut queue: VecDeque<Action> = m.step(now, Input::Tick { ready: true }).into();
    while let Some(action) = queue.pop_front() {
        let answer = match action {
            Action::Spawn { config, argv } => {
                plan.actions.push(format!("write the ssh config (0600) and start {}", shell_words::join(&argv)));
                plan.ssh_config = Some(config);
                plan.argv = argv;
                break;
            }
            Action::AcquireLease { dir, public_url, .. } => {
                let path = lease::lease_path(&dir, &public_url);
                let answer = match std::fs::read_to_string(&path) {
                    Ok(text) => {
                        let owner: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                        let holder = serde_json::from_value::<lease::Owner>(owner.clone())
                            .map(|o| o.describe())
                            .unwrap_or_else(|_| "?".into());
                        LeaseAnswer::Held { holder, owner }
                    }
                    Err(_) => LeaseAnswer::Acquired(path.clone()),
                };
                plan.actions.push(format!("lease {public_url} ({}): {answer:?}", path.display()));
                Some(Input::Lease(answer))
            }
            Action::Event(body) => {
                let fields = body.to_fields().map(serde_json::Value::Object).unwrap_or_default();
                plan.actions.push(format!("event {} {fields}", body.kind().as_str()));
                None
            }
            Action::Note(text) => {
                plan.actions.push(format!("note: {text}"));
                None
            }
            other => {
                plan.actions.push(format!("{other:?}"));
                None
            }
        };
        if let Some(input) = answer {
            for a in m.step(now, input).into_iter().rev() {
                queue.push_front(a);
            }
        }
    }
}

/// Describes the tunnel step without doing it; problems it would stop on go to `problems`.
pub(crate) fn plan(spec: &TunnelSpec, inp: &PlanInputs<'_>, problems: &mut Vec<Failure>) -> TunnelPlan {
    let progs = match programs(spec, inp.child_path) {
        Ok(p) => p,
        Err(e) => {
            problems.push(e.into());
            None
        }
    };
    let tokens = tokens(spec, inp.secrets, true).unwrap_or_else(|e| {
        problems.push(e.into());
        BTreeMap::new()
    });
    let socks_port = socks_spec(spec).map(|s| {
        socks_port(s, inp.job_id, inp.engine_port).unwrap_or_else(|e| {
            problems.push(TunnelError::Port(e).into());
            s.port.fixed.unwrap_or(s.port.base)
        })
    });
    let ctx = Ctx {
        ssh: progs.as_ref().map(|p| p.ssh.display().to_string()).unwrap_or_else(|| "ssh".into()),
        tokens,
        job_id: inp.job_id,
        engine_host: inp.engine_host,
        engine_port: inp.engine_port,
        served_name: inp.served_name,
        socks_port,
    };
    let mut plans = Vec::new();
    for (_, part) in parts(spec) {
        let paths = strategy::Paths {
            config: "<generated config>".into(),
            known_hosts: PathBuf::from("<private dir>/known_hosts"),
        };
        let mut m = Machine::new(strategy_for(spec, &part, &ctx, paths), Instant::now());
        let mut plan = TunnelPlan::empty(m.kind());
        first_actions(&mut m, &mut plan);
        if let Phase::Failed(f) = m.phase() {
            plan.actions.push(format!("would stop now: {}", f.message));
        }
        match part {
            Part::Pinggy(p) => describe_pinggy(p, &m, inp, &mut plan),
            Part::Socks(s) => describe_socks(s, ctx.socks_port.unwrap_or(s.port.base), progs.as_ref(), &mut plan),
        }
        plans.push(plan);
    }
    let Some(mut main) = plans.pop() else {
        let mut none = TunnelPlan::empty("none");
        none.description = "no tunnel: the agent calls vLLM on this node".into();
        return none;
    };
    if let Some(egress) = plans.pop() {
        main.kind = kind(spec);
        main.harbor_env.extend(egress.harbor_env.clone());
        main.harbor_prefix = egress.harbor_prefix.clone();
        main.description = format!("{}; through the egress proxy below", main.description);
        main.egress = Some(Box::new(egress));
    }
    let _ = &inp.node;
    main
}

fn describe_pinggy(p: &PinggySpec, m: &Machine, inp: &PlanInputs<'_>, plan: &mut TunnelPlan) {
    let pairs = p.pairs();
    let order = pair_order(pairs.len(), inp.job_id);
    for i in &order {
        let pair = &pairs[*i];
        let mut note = String::new();
        if !inp.secrets.contains(&pair.token_secret) {
            note = format!(" — secret {} not in the secrets file: skipped", pair.token_secret);
        } else if let Some(dir) = &p.lock_dir {
            let path = lease::lease_path(dir, &pair.public_url);
            if let Ok(text) = std::fs::read_to_string(&path) {
                let holder =
                    serde_json::from_str::<lease::Owner>(&text).map(|o| o.describe()).unwrap_or_else(|_| "?".into());
                note = format!(" — leased now by {holder} ({})", path.display());
            }
        }
        plan.pairs.push(format!("{} (token from secret {}){note}", pair.public_url, pair.token_secret));
    }
    // The pair the machine chose; when none is usable now, the first in this job's order.
    let pair = m
        .public_url()
        .and_then(|url| pairs.iter().find(|p| p.public_url.trim_end_matches('/') == url))
        .unwrap_or(&pairs[order.first().copied().unwrap_or(0)]);
    let url = pair.public_url.trim_end_matches('/').to_string();
    plan.public_url = Some(url.clone());
    plan.verify = Some(format!(
        "GET {url}/v1/models with the per-job API key must list {} (up to {} tries, {} s apart){} before Harbor starts",
        inp.served_name,
        p.verify_attempts,
        p.verify_interval_s,
        if p.egress.is_some() { ", through the egress proxy" } else { "" }
    ));
    plan.description = format!(
        "pinggy: {} (host {}:{}, user = token from secret {}{}), public URL {url} as Harbor's api_base {url}/v1; \
         vLLM gets a per-job {VLLM_KEY_VAR}; {} pair(s) in the bank{}; restarts ≤ {} with backoff from {} s",
        shell_words::join(&plan.argv),
        pair.host.as_deref().unwrap_or(&p.host),
        p.port,
        pair.token_secret,
        if p.egress.is_some() { format!(", ProxyJump {SOCKS_ALIAS}") } else { String::new() },
        pairs.len(),
        p.lock_dir.as_ref().map(|d| format!(", leases in {}", d.display())).unwrap_or_default(),
        p.max_restarts,
        p.restart_backoff_s,
    );
}

fn describe_socks(s: &SocksSpec, port: u16, progs: Option<&Programs>, plan: &mut TunnelPlan) {
    plan.verify =
        Some(format!("one request to {} through socks5h://127.0.0.1:{port} before Harbor starts", s.verify_url));
    let how = match s.mode {
        ProxyMode::Env => {
            plan.harbor_env = socks::proxy_env(port, &s.no_proxy);
            "Harbor gets ALL_PROXY/HTTPS_PROXY/HTTP_PROXY (and lower case) and NO_PROXY".to_string()
        }
        ProxyMode::Proxychains => {
            let bin = progs
                .and_then(|p| p.proxychains.as_ref())
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| s.proxychains_bin.clone().unwrap_or_else(|| "proxychains4".into()));
            plan.harbor_prefix = vec![bin, "-q".into(), "-f".into(), "<generated proxychains.conf>".into()];
            format!(
                "Harbor runs under {} with a generated config (strict_chain, local networks excluded)",
                shell_words::join(&plan.harbor_prefix)
            )
        }
    };
    plan.description = format!(
        "socks: {} (login node {}{}), port {port}; {how}; restarts ≤ {} with backoff from {} s",
        shell_words::join(&plan.argv),
        s.login_node,
        s.identity_file.as_ref().map(|k| format!(", key {}", k.display())).unwrap_or_default(),
        s.max_restarts,
        s.restart_backoff_s,
    );
}

/// `payload plan`'s text for the tunnel (and its egress proxy).
pub(crate) fn write_plan(out: &mut dyn std::io::Write, t: &TunnelPlan) -> std::io::Result<()> {
    writeln!(out, "tunnel: {} — {}", t.kind, t.description)?;
    write_plan_body(out, t, "  ")?;
    if let Some(e) = &t.egress {
        writeln!(out, "  egress: {} — {}", e.kind, e.description)?;
        write_plan_body(out, e, "    ")?;
    }
    Ok(())
}

fn write_plan_body(out: &mut dyn std::io::Write, t: &TunnelPlan, indent: &str) -> std::io::Result<()> {
    if !t.argv.is_empty() {
        writeln!(out, "{indent}argv: {}", shell_words::join(&t.argv))?;
    }
    if let Some(config) = &t.ssh_config {
        writeln!(out, "{indent}ssh config (0600, in a private directory outside the run dir):")?;
        for line in config.lines().filter(|l| !l.starts_with('#')) {
            writeln!(out, "{indent}  {line}")?;
        }
    }
    if !t.pairs.is_empty() {
        writeln!(out, "{indent}bank, in this job's order:")?;
        for p in &t.pairs {
            writeln!(out, "{indent}  {p}")?;
        }
    }
    if let Some(v) = &t.verify {
        writeln!(out, "{indent}verify: {v}")?;
    }
    if !t.actions.is_empty() {
        writeln!(out, "{indent}first actions:")?;
        for a in &t.actions {
            writeln!(out, "{indent}  {a}")?;
        }
    }
    Ok(())
}
