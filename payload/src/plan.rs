//! `payload plan --spec FILE [--json]`: everything `run` would do, without doing it — GPU inventory
//! and chosen profile (on a machine without NVML: "no NVML", planned for `serve.declared_gpus` or
//! TP×DP), the exact vLLM argv and environment (secret values redacted), Harbor's argv for a fresh
//! run or a resume (decided by whether `<run_dir>/config.json` exists), the tunnel plan, and every
//! problem `run` would stop on.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use launch_spec::{GpuInfo, LaunchSpec, OutcomeClass};
use serde::Serialize;

use crate::prepare::{self, Mode, Prepared};
use crate::secrets;
use crate::supervisor::ChildSpec;
use crate::{childenv, engine, harbor, tunnel};

use crate::secrets::REDACTED;

#[derive(Debug, Serialize)]
pub struct Plan {
    pub spec: PathBuf,
    pub run_tag: String,
    pub run_dir: PathBuf,
    pub gpu: GpuSection,
    pub port: PortSection,
    pub secrets: SecretsSection,
    pub tunnel: tunnel::TunnelPlan,
    pub engine: ProcessSection,
    /// How long `run` waits for readiness, and why (docs/payload.md "Readiness budget").
    pub readiness: ReadinessSection,
    /// A multi-node engine: every node's rank, argv and environment (docs/multinode.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layout: Option<crate::multinode::LayoutPlan>,
    pub harbor: HarborSection,
    /// The post-run step (after Harbor exits 0), when the spec has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub post_run: Option<PostRunSection>,
    /// What would stop `run`, with its outcome class.
    pub problems: Vec<Problem>,
}

#[derive(Debug, Serialize)]
pub struct ReadinessSection {
    /// `serve.ready_budget.seconds`, at most the cap.
    pub deadline_s: u64,
    /// `serve.health_timeout_s`.
    pub cap_s: u64,
    pub load_stall_after_s: u64,
    pub budget: Option<launch_spec::spec::ReadyBudget>,
    /// The one-line account (`ServeSpec::readiness_line`).
    pub how: String,
}

#[derive(Debug, Serialize)]
pub struct Problem {
    pub class: OutcomeClass,
    pub message: String,
}

#[derive(Debug, Serialize)]
pub struct GpuSection {
    pub probe: String,
    pub needed: u32,
    pub inventory: Vec<GpuInfo>,
    pub count: Option<u32>,
    pub profile: Option<String>,
    pub gpu_memory_utilization: Option<f64>,
    pub source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct PortSection {
    pub port: Option<u16>,
    pub how: String,
}

#[derive(Debug, Serialize)]
pub struct SecretsSection {
    pub file: Option<PathBuf>,
    pub status: String,
    pub names: Vec<String>,
    pub(crate) daytona_org: Option<secrets::DaytonaOrg>,
}

#[derive(Debug, Serialize)]
pub struct ProcessSection {
    pub program: String,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
pub struct PostRunSection {
    #[serde(flatten)]
    pub process: ProcessSection,
    pub timeout_s: u64,
    pub log: PathBuf,
    /// Why it could not start, or named secrets the file lacks: never a problem (the step never
    /// fails the run), shown so they are fixed before the run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct HarborSection {
    pub mode: &'static str,
    /// What the agent calls: vLLM on this node, or the tunnel's public URL for installed agents.
    pub api_base: String,
    #[serde(flatten)]
    pub process: ProcessSection,
    /// `--check-harbor`: what the installed Harbor's `--print-config` said about the argv.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_check: Option<String>,
    /// Fresh: the agent entries of the merged job config (`--config`), model included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agents: Option<serde_json::Value>,
    /// On resume: the `config.json` and `lock.json` files whose `api_base` would be rewritten.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rewrites: Vec<PathBuf>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Builds the plan: the one preparation `run` executes (crate::prepare), rendered with secret
/// values redacted. Reads files and probes GPUs and ports; changes nothing.
pub fn build(spec_path: &Path, spec: &LaunchSpec, parent: &[(String, String)]) -> Plan {
    let observed = prepare::observe(spec, parent, Mode::Plan);
    let prepared = prepare::prepare(spec_path, spec, parent, observed, Mode::Plan);
    render_prepared(spec_path, spec, parent, &prepared)
}

/// The plan's view of a preparation.
pub(crate) fn render_prepared(spec_path: &Path, spec: &LaunchSpec, parent: &[(String, String)], p: &Prepared) -> Plan {
    let t = &p.tunnel.plan;
    let api_base = p.api_base(t.public_url.as_deref());
    let prefix = (!t.harbor_prefix.is_empty()).then_some(t.harbor_prefix.as_slice());
    let mut harbor = p.harbor.child(spec, &api_base, &t.harbor_env, prefix).unwrap_or_else(|_| ChildSpec {
        program: p.harbor.program.clone(),
        argv: Vec::new(),
        env: p.harbor.env.clone(),
        log: p.harbor.log.clone(),
        cwd: None,
    });
    // Without a readable key (a problem says why) the plan still shows where it would go.
    if spec.secrets.daytona {
        harbor.env.entry(secrets::DAYTONA_ORG1.to_string()).or_insert_with(|| REDACTED.to_string());
    }
    let redact = Redact::of(p);
    let head = &p.head().child;
    let layout = layout_section(spec, p, &redact);
    let post_run = post_run_section(spec, parent, p, &redact);
    let gpu = match &p.gpu.decision {
        Some(d) => GpuSection {
            probe: d.probe.clone(),
            needed: p.gpu.needed,
            inventory: d.inventory.clone(),
            count: Some(d.count),
            profile: d.profile.as_ref().map(|p| p.name.clone()),
            gpu_memory_utilization: Some(d.gpu_memory_utilization),
            source: Some(d.source.clone()),
            note: d.note.clone(),
        },
        None => GpuSection {
            probe: p.gpu.probe.clone(),
            needed: p.gpu.needed,
            inventory: p.gpu.inventory.clone(),
            count: None,
            profile: None,
            gpu_memory_utilization: None,
            source: None,
            note: None,
        },
    };
    let how = match (p.port.port, spec.serve.port.fixed) {
        (Some(_), None) => format!("{}; re-checked at run time", p.port.how),
        _ => p.port.how.clone(),
    };
    Plan {
        spec: spec_path.to_path_buf(),
        run_tag: spec.run_tag.clone(),
        run_dir: spec.run_dir.clone(),
        gpu,
        port: PortSection { port: p.port.port, how },
        secrets: SecretsSection {
            file: p.secrets.file.clone(),
            status: p.secrets.status.clone(),
            names: p.secrets.names.clone(),
            daytona_org: p.harbor.daytona_org,
        },
        tunnel: p.tunnel.plan.clone(),
        engine: redact.process(head),
        readiness: ReadinessSection {
            deadline_s: spec.serve.ready_deadline_s(),
            cap_s: spec.serve.health_timeout_s,
            load_stall_after_s: spec.serve.load_stall_after_s,
            budget: spec.serve.ready_budget.clone(),
            how: spec.serve.readiness_line(),
        },
        layout,
        harbor: HarborSection {
            mode: p.harbor.mode.as_str(),
            api_base,
            process: redact.process(&harbor),
            agents: p.harbor.merged_config.as_ref().map(|c| c["agents"].clone()),
            config_check: None,
            rewrites: p.harbor.rewrites.clone(),
            warnings: p.harbor.warnings.clone(),
        },
        post_run,
        problems: p.problems.iter().map(|f| Problem { class: f.class, message: f.message.clone() }).collect(),
    }
}

/// What a plan hides: by name (the secrets handed to children) and by whole value (the secrets
/// file's values and the agent-env sources taken from the environment).
struct Redact<'a> {
    hidden: Vec<&'a str>,
    secret_names: &'a std::collections::BTreeSet<String>,
}

impl<'a> Redact<'a> {
    fn of(p: &'a Prepared) -> Self {
        Redact { hidden: p.hidden.iter().map(String::as_str).collect(), secret_names: &p.secret_names }
    }

    fn argv(&self, items: &[String]) -> Vec<String> {
        items.iter().map(|s| secrets::redact_whole(s, &self.hidden)).collect()
    }

    fn env(&self, env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        env.iter()
            .map(|(k, v)| {
                let v = if self.secret_names.contains(k) {
                    REDACTED.to_string()
                } else {
                    secrets::redact_whole(v, &self.hidden)
                };
                (k.clone(), v)
            })
            .collect()
    }

    fn process(&self, child: &ChildSpec) -> ProcessSection {
        ProcessSection {
            program: child.program.display().to_string(),
            argv: self.argv(&child.argv),
            env: self.env(&child.env),
        }
    }
}

/// A multi-node engine's layout: each node's rank, argv and environment, and the srun step.
fn layout_section(spec: &LaunchSpec, p: &Prepared, redact: &Redact<'_>) -> Option<crate::multinode::LayoutPlan> {
    let s = p.secondaries.as_ref()?;
    let l = spec.layout().ok()?;
    let per_node = p
        .engines
        .iter()
        .map(|e| {
            let rank = match e.role {
                crate::prepare::EngineRole::Head => 0,
                crate::prepare::EngineRole::Worker { rank } => rank,
            };
            crate::multinode::NodePlan {
                rank,
                node: s.nodes.get(rank as usize).map(|n| n.name.clone()).unwrap_or_default(),
                addr: s.nodes.get(rank as usize).map(|n| n.addr.clone()).unwrap_or_default(),
                started_by: if rank == 0 { "head" } else { "srun" },
                argv: redact.argv(&e.child.argv),
                env: redact.env(&e.child.env),
            }
        })
        .collect();
    Some(crate::multinode::LayoutPlan {
        nodes: l.nodes,
        gpus_per_node: l.gpus_per_node,
        crossing: l.crossing,
        rendezvous: s.file.rendezvous.clone(),
        source: s.source.clone(),
        per_node,
        srun: redact.argv(&s.srun.argv),
    })
}

/// The post-run step as prepared, or as the spec writes it with why it could not be prepared.
fn post_run_section(
    spec: &LaunchSpec,
    parent: &[(String, String)],
    p: &Prepared,
    redact: &Redact<'_>,
) -> Option<PostRunSection> {
    let (spec_step, step) = spec.post_run.as_ref().zip(p.post_run.as_ref())?;
    let (process, warnings) = match step {
        Ok(step) => (
            redact.process(&step.child),
            step.missing_secrets.iter().map(|n| format!("secret {n} is not in the secrets file")).collect(),
        ),
        Err(e) => {
            let argv = spec_step.resolved_argv(&spec.run_dir, &spec.run_tag);
            let env = childenv::build(parent, spec_step.env_prefix.as_deref(), &spec_step.env, &p.run_id);
            (
                ProcessSection {
                    program: argv.first().cloned().unwrap_or_default(),
                    argv: redact.argv(&argv),
                    env: redact.env(&env),
                },
                vec![e.clone()],
            )
        }
    };
    Some(PostRunSection {
        process,
        timeout_s: spec_step.timeout_s,
        log: spec.run_dir.join(launch_spec::records::POST_RUN_LOG),
        warnings,
    })
}

/// `payload plan --check-harbor` (on a login node, where the cluster's Harbor is installed): runs
/// that Harbor's `jobs start … --print-config` on the plan's fresh-run argv, with the merged job
/// config written to a private temporary file, and records the verdict; a refusal is a problem.
/// Skipped (with the reason) on a resume, or when Harbor cannot be run here.
pub async fn check_harbor(spec: &LaunchSpec, plan: &mut Plan) {
    let verdict = if plan.harbor.mode != "fresh" {
        harbor::ConfigCheck::Skipped("resume: Harbor re-reads the job's stored config".to_string())
    } else {
        match check_fresh_argv(spec, plan).await {
            Ok(v) => v,
            Err(e) => harbor::ConfigCheck::Skipped(e),
        }
    };
    if let harbor::ConfigCheck::Rejected(why) = &verdict {
        plan.problems.push(Problem { class: OutcomeClass::Harbor, message: why.clone() });
    }
    plan.harbor.config_check = Some(format!("{verdict:?}"));
}

async fn check_fresh_argv(spec: &LaunchSpec, plan: &Plan) -> Result<harbor::ConfigCheck, String> {
    let argv = &plan.harbor.process.argv;
    // Without a tunnel prefix (proxychains): Harbor's own argv starts one before `jobs`.
    let start = argv.iter().position(|a| a == "jobs").and_then(|i| i.checked_sub(1)).ok_or("no harbor argv")?;
    let mut argv = argv[start..].to_vec();
    let config = harbor::merged_job_config(spec).map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir().join(format!("payload-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let file = dir.join(harbor::MERGED_CONFIG_FILE);
    let written = serde_json::to_vec_pretty(&config)
        .map_err(|e| e.to_string())
        .and_then(|bytes| std::fs::write(&file, bytes).map_err(|e| format!("cannot write {}: {e}", file.display())));
    if let Some(i) = argv.iter().position(|a| a == "--config") {
        argv[i + 1] = file.display().to_string();
    }
    let verdict = match written {
        Ok(()) => Ok(harbor::check_with_print_config(spec, &argv, &plan.harbor.process.env).await),
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_dir_all(&dir);
    verdict
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// The human rendering.
pub fn render(plan: &Plan, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "payload plan for {} (spec {})", plan.run_tag, plan.spec.display())?;
    writeln!(out, "run dir: {}", plan.run_dir.display())?;
    writeln!(out)?;
    let g = &plan.gpu;
    writeln!(out, "GPUs ({}), engine needs {}:", g.probe, g.needed)?;
    for info in &g.inventory {
        writeln!(out, "  [{}] {} {} {:.1} GiB", info.index, info.uuid, info.name, gib(info.memory_total_bytes))?;
    }
    if let Some(note) = &g.note {
        writeln!(out, "  note: {note}")?;
    }
    match (&g.profile, g.gpu_memory_utilization, &g.source) {
        (profile, Some(util), Some(source)) => writeln!(
            out,
            "  profile: {} → gpu_memory_utilization {} ({source})",
            profile.as_deref().unwrap_or("none"),
            engine::format_utilization(util)
        )?,
        _ => writeln!(out, "  profile: none (see problems)")?,
    }
    writeln!(
        out,
        "port: {} — {}",
        plan.port.port.map(|p| p.to_string()).unwrap_or_else(|| "none".into()),
        plan.port.how
    )?;
    let s = &plan.secrets;
    write!(out, "secrets: {}", s.file.as_ref().map(|f| f.display().to_string()).unwrap_or_else(|| "(none)".into()))?;
    write!(out, " — {}", s.status)?;
    if let Some(org) = s.daytona_org {
        let n = if org == secrets::DaytonaOrg::Org1 { 1 } else { 2 };
        write!(out, "; Daytona org {n} ({}) handed to Harbor as DAYTONA_API_KEY", org.variable())?;
    }
    writeln!(out)?;
    tunnel::write_plan(out, &plan.tunnel)?;
    writeln!(out)?;
    writeln!(out, "vLLM:")?;
    writeln!(out, "  argv: {}", shell_words::join(&plan.engine.argv))?;
    writeln!(out, "  env (nothing else is inherited):")?;
    for (k, v) in &plan.engine.env {
        writeln!(out, "    {k}={v}")?;
    }
    writeln!(out, "  readiness: {}", plan.readiness.how)?;
    if let Some(l) = &plan.layout {
        writeln!(out)?;
        writeln!(
            out,
            "Layout: {} nodes × {} GPUs, {} parallelism crosses nodes; rendezvous {}:{} (nodes: {}):",
            l.nodes,
            l.gpus_per_node,
            l.crossing.as_str(),
            l.rendezvous.addr,
            l.rendezvous.port,
            l.source
        )?;
        for n in &l.per_node {
            let addr = if n.addr.is_empty() { String::new() } else { format!(" ({})", n.addr) };
            writeln!(out, "  rank {} on {}{addr}, started by {}:", n.rank, n.node, n.started_by)?;
            writeln!(out, "    argv: {}", shell_words::join(&n.argv))?;
            if n.rank == 0 {
                writeln!(out, "    env: as vLLM's above")?;
            } else {
                writeln!(out, "    env (srun --export=ALL of exactly this, plus Slurm's SLURM_* for the step):")?;
                for (k, v) in &n.env {
                    writeln!(out, "      {k}={v}")?;
                }
            }
        }
        writeln!(out, "  srun: {}", shell_words::join(&l.srun))?;
    }
    writeln!(out)?;
    writeln!(out, "Harbor ({}), api_base {}:", plan.harbor.mode, plan.harbor.api_base)?;
    if !plan.harbor.rewrites.is_empty() {
        writeln!(out, "  resume: api_base rewritten in {} config.json/lock.json file(s):", plan.harbor.rewrites.len())?;
        for f in &plan.harbor.rewrites {
            writeln!(out, "    {}", f.display())?;
        }
    }
    writeln!(out, "  argv: {}", shell_words::join(&plan.harbor.process.argv))?;
    if let Some(check) = &plan.harbor.config_check {
        writeln!(out, "  harbor --print-config: {check}")?;
    }
    if let Some(agents) = &plan.harbor.agents {
        writeln!(out, "  agents (merged job config {}): {agents}", harbor::MERGED_CONFIG_FILE)?;
    }
    writeln!(out, "  env (nothing else is inherited):")?;
    for (k, v) in &plan.harbor.process.env {
        writeln!(out, "    {k}={v}")?;
    }
    for w in &plan.harbor.warnings {
        writeln!(out, "  warning: {w}")?;
    }
    writeln!(out)?;
    if let Some(p) = &plan.post_run {
        writeln!(out, "post-run step (after Harbor exits 0; never changes the outcome), timeout {} s:", p.timeout_s)?;
        writeln!(out, "  argv: {}", shell_words::join(&p.process.argv))?;
        writeln!(out, "  cwd: {}; log: {}", plan.run_dir.display(), p.log.display())?;
        writeln!(out, "  env (nothing else is inherited):")?;
        for (k, v) in &p.process.env {
            writeln!(out, "    {k}={v}")?;
        }
        for w in &p.warnings {
            writeln!(out, "  warning: {w}")?;
        }
        writeln!(out)?;
    }
    if plan.problems.is_empty() {
        writeln!(out, "problems: none")?;
    } else {
        writeln!(out, "problems (run would stop):")?;
        for p in &plan.problems {
            writeln!(out, "  [{}] {}", p.class.as_str(), p.message)?;
        }
    }
    Ok(())
}

/// Exit code of `payload plan`: 0, or the class code of the first problem.
pub fn exit_code(plan: &Plan) -> i32 {
    plan.problems.first().map(|p| p.class.exit_code()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use launch_spec::testkit::unit_spec as spec;

    #[test]
    fn plan_without_nvml_uses_declared_gpus_and_redacts() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = spec();
        spec.jobs_dir = dir.path().to_path_buf();
        spec.run_dir = dir.path().join(&spec.run_tag);
        spec.serve.declared_gpus = Some(4);
        let secrets_file = dir.path().join("s.env");
        std::fs::write(
            &secrets_file,
            concat!("DAYTONA_API_KEY=plan-secret-1\n", "DAYTONA_DATA_API_KEY=plan-secret-2\n"),
        )
        .unwrap();
        std::fs::set_permissions(&secrets_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        spec.secrets.file = Some(secrets_file);
        let parent = vec![
            ("PATH".to_string(), "/usr/bin:/bin".to_string()),
            ("PAYLOAD_GPU_FIXTURE".to_string(), "/nonexistent-fixture.json".to_string()),
        ];
        let plan = build(Path::new("launch.json"), &spec, &parent);
        let json = serde_json::to_string(&plan).unwrap();
        assert!(!json.contains("plan-secret"), "{json}");
        assert_eq!(plan.harbor.process.env["DAYTONA_API_KEY"], REDACTED);
        assert_eq!(plan.harbor.mode, "fresh");
        let mut text = Vec::new();
        render(&plan, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(!text.contains("plan-secret"));
        assert!(text.contains("hosted_vllm/Qwen3-8B"), "{text}");
    }
}
