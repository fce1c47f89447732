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

use crate::failure::Failure;
use crate::run::{self, lookup};
use crate::secrets::{self, Secrets};
use crate::{childenv, engine, gpu, harbor, ports, tunnel};

pub const REDACTED: &str = "<redacted>";

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
    pub harbor: HarborSection,
    /// The post-run step (after Harbor exits 0), when the spec has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub post_run: Option<PostRunSection>,
    /// What would stop `run`, with its outcome class.
    pub problems: Vec<Problem>,
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
    pub daytona_org: Option<secrets::DaytonaOrg>,
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

/// Builds the plan. Reads files and probes GPUs and ports; changes nothing.
pub fn build(spec_path: &Path, spec: &LaunchSpec, parent: &[(String, String)]) -> Plan {
    let env_fn = lookup(parent);
    let mut problems: Vec<Problem> = Vec::new();
    let mut problem = |f: Failure| problems.push(Problem { class: f.class, message: f.message });
    let run_id = format!("{}-<pid>", spec.run_tag);

    if let Err(f) = run::check_paths(spec) {
        problem(f);
    }
    if let Err(f) = crate::timings::check(spec_path, spec) {
        problem(f);
    }

    // Secrets (names only).
    let org_id = run::org_job_id(spec, &env_fn);
    let (loaded, secrets_section) = if run::needs_secrets(spec) {
        let path = secrets::secrets_path(&spec.secrets, &env_fn);
        match secrets::load(&path) {
            Ok(s) => {
                let names = s.names().map(str::to_string).collect();
                (s, SecretsSection { file: Some(path), status: "ok".into(), names, daytona_org: None })
            }
            Err(e) => {
                let status = e.to_string();
                problem(e.into());
                (Secrets::none(), SecretsSection { file: Some(path), status, names: vec![], daytona_org: None })
            }
        }
    } else {
        (Secrets::none(), SecretsSection { file: None, status: "not needed".into(), names: vec![], daytona_org: None })
    };
    let mut secrets_section = secrets_section;
    let agent_envs = harbor::agent_envs(&spec.harbor.agent_envs, &loaded, &env_fn);
    let mut harbor_env = match run::harbor_env(spec, parent, &run_id, &loaded, &org_id, &agent_envs.harbor_env) {
        Ok((env, org)) => {
            secrets_section.daytona_org = org;
            env
        }
        Err(e) => {
            if secrets_section.status == "ok" {
                problem(e.into());
            }
            childenv::build(parent, spec.harbor.env_prefix.as_deref(), &spec.harbor.env, &run_id)
        }
    };
    if spec.secrets.daytona && !harbor_env.contains_key(secrets::DAYTONA_ORG1) {
        harbor_env.insert(secrets::DAYTONA_ORG1.into(), REDACTED.into());
    }
    let secret_names: Vec<String> = std::iter::once(secrets::DAYTONA_ORG1.to_string())
        .chain(spec.secrets.pass_to_harbor.iter().cloned())
        .chain(agent_envs.harbor_env.keys().cloned())
        .collect();
    for name in &secret_names {
        if let Some(v) = harbor_env.get_mut(name) {
            *v = REDACTED.into();
        }
    }

    // GPUs.
    let probe = gpu::probe_from_env(&env_fn);
    let cuda_visible = env_fn("CUDA_VISIBLE_DEVICES");
    let probed = probe.probe();
    let inventory =
        probed.as_ref().ok().and_then(|v| gpu::visible(v, cuda_visible.as_deref()).ok()).unwrap_or_default();
    let decision = gpu::decide(spec, &probe.describe(), probed.clone(), cuda_visible.as_deref(), true);
    let gpu_section = match &decision {
        Ok(d) => GpuSection {
            probe: d.probe.clone(),
            needed: spec.gpus_needed(),
            inventory: d.inventory.clone(),
            count: Some(d.count),
            profile: d.profile.as_ref().map(|p| p.name.clone()),
            gpu_memory_utilization: Some(d.gpu_memory_utilization),
            source: Some(d.source.clone()),
            note: d.note.clone(),
        },
        Err(e) => {
            problem(e.clone().into());
            GpuSection {
                probe: match &probed {
                    Err(e) => e.to_string(),
                    Ok(_) => probe.describe(),
                },
                needed: spec.gpus_needed(),
                inventory,
                count: None,
                profile: None,
                gpu_memory_utilization: None,
                source: None,
                note: None,
            }
        }
    };

    // Port.
    let job_id = run::port_job_id(&env_fn);
    let port_section = match ports::choose(&spec.serve.port, &job_id, &spec.serve.host) {
        Ok(port) => PortSection {
            port: Some(port),
            how: match spec.serve.port.fixed {
                Some(_) => "fixed (serve.port.fixed), free now".to_string(),
                None => format!(
                    "derived from {} in [{}, {}), free now; re-checked at run time",
                    if env_fn("SLURM_JOB_ID").is_some() {
                        format!("job id {job_id}")
                    } else {
                        format!("pid {job_id} (no SLURM_JOB_ID)")
                    },
                    spec.serve.port.base,
                    u32::from(spec.serve.port.base) + u32::from(spec.serve.port.span)
                ),
            },
        },
        Err(e) => {
            let how = e.to_string();
            problem(e.into());
            PortSection { port: None, how }
        }
    };
    let port = port_section.port.unwrap_or(spec.serve.port.fixed.unwrap_or(spec.serve.port.base));
    let base = run::base_url(&spec.serve.host, port);

    // Tunnel.
    let tunnel_env = childenv::build(parent, None, &BTreeMap::new(), &run_id);
    let mut tunnel_problems = Vec::new();
    let tunnel_plan = tunnel::plan(
        &spec.tunnel,
        &tunnel::PlanInputs {
            secrets: &loaded,
            job_id: &job_id,
            engine_host: &spec.serve.host,
            engine_port: port,
            served_name: &spec.model.served_name,
            node: run::node_name(&env_fn).unwrap_or_default(),
            child_path: &tunnel_env["PATH"],
        },
        &mut tunnel_problems,
    );
    for f in tunnel_problems {
        problem(f);
    }

    // Engine.
    let mut engine_env = childenv::build(parent, spec.serve.env_prefix.as_deref(), &spec.serve.env, &run_id);
    if tunnel::exposes_model(&spec.tunnel) {
        engine_env.insert(tunnel::VLLM_KEY_VAR.to_string(), tunnel::GENERATED.to_string());
    }
    let engine_program =
        match childenv::resolve_program(&spec.serve.program, spec.serve.env_prefix.as_deref(), &engine_env["PATH"]) {
            Ok(p) => p.display().to_string(),
            Err(e) => {
                problem(Failure::new(OutcomeClass::Spec, format!("field `serve.program`: {e}")));
                spec.serve.program.clone()
            }
        };
    let (util, extra) = match &decision {
        Ok(d) => (d.gpu_memory_utilization, d.extra_vllm_args().to_vec()),
        Err(_) => (spec.serve.gpu_memory_utilization.unwrap_or(0.0), Vec::new()),
    };
    let engine_argv = match engine::argv(spec, &engine_program, port, util, &extra, &env_fn) {
        Ok(a) => a,
        Err(e) => {
            problem(e.into());
            Vec::new()
        }
    };

    // Harbor.
    let harbor_program =
        match childenv::resolve_program(&spec.harbor.program, spec.harbor.env_prefix.as_deref(), &harbor_env["PATH"]) {
            Ok(p) => p.display().to_string(),
            Err(e) => {
                problem(Failure::new(OutcomeClass::Spec, format!("field `harbor.program`: {e}")));
                spec.harbor.program.clone()
            }
        };
    let resume = harbor::is_resume(&spec.run_dir);
    if resume && let Err(e) = harbor::check_resume_configs(&spec.run_dir) {
        problem(e.into());
    }
    let api_base = match &tunnel_plan.public_url {
        Some(url) => format!("{url}/v1"),
        None => format!("{base}/v1"),
    };
    let mut merged_agents = None;
    let (mode, mut harbor_argv, rewrites) = if resume {
        ("resume", harbor::resume_argv(spec, &harbor_program), harbor::config_files(&spec.run_dir))
    } else {
        match harbor::merged_job_config(spec) {
            Ok(config) => merged_agents = Some(config["agents"].clone()),
            Err(e) => problem(e.into()),
        }
        let merged = spec.run_dir.join(harbor::MERGED_CONFIG_FILE);
        let argv =
            harbor::fresh_argv(spec, &harbor_program, &api_base, &agent_envs.args, &merged).unwrap_or_else(|e| {
                problem(e.into());
                Vec::new()
            });
        ("fresh", argv, Vec::new())
    };
    harbor_env.extend(tunnel_plan.harbor_env.clone());
    let key = tunnel::exposes_model(&spec.tunnel).then_some(tunnel::GENERATED);
    harbor_env.extend(launch_spec::agents::model_env(&spec.harbor.agent, &api_base, key));
    let mut harbor_program = harbor_program;
    if !tunnel_plan.harbor_prefix.is_empty() {
        harbor_program = tunnel_plan.harbor_prefix[0].clone();
        harbor_argv.splice(0..0, tunnel_plan.harbor_prefix.clone());
    }

    // Post-run step: the secrets it is handed are redacted by name as well as by value.
    let post_run =
        spec.post_run.as_ref().zip(crate::postrun::prepare(spec, parent, &run_id, &loaded)).map(|(p, step)| {
            let argv = p.resolved_argv(&spec.run_dir, &spec.run_tag);
            let (program, mut env, warnings) = match step {
                Ok(step) => {
                    let warnings =
                        step.missing_secrets.iter().map(|n| format!("secret {n} is not in the secrets file")).collect();
                    (step.child.program.display().to_string(), step.child.env, warnings)
                }
                Err(e) => (
                    argv.first().cloned().unwrap_or_default(),
                    childenv::build(parent, p.env_prefix.as_deref(), &p.env, &run_id),
                    vec![e],
                ),
            };
            for name in &p.secrets {
                if let Some(v) = env.get_mut(name) {
                    *v = REDACTED.into();
                }
            }
            PostRunSection {
                process: ProcessSection { program, argv, env },
                timeout_s: p.timeout_s,
                log: spec.run_dir.join(launch_spec::records::POST_RUN_LOG),
                warnings,
            }
        });

    // By whole value: the secrets file's values and the agent-env sources taken from the environment.
    let hidden: Vec<&str> = loaded.values().chain(agent_envs.harbor_env.values().map(String::as_str)).collect();
    let redact = |items: Vec<String>| items.into_iter().map(|s| secrets::redact_whole(&s, &hidden)).collect::<Vec<_>>();
    let redact_env =
        |env: BTreeMap<String, String>| env.into_iter().map(|(k, v)| (k, secrets::redact_whole(&v, &hidden))).collect();
    Plan {
        spec: spec_path.to_path_buf(),
        run_tag: spec.run_tag.clone(),
        run_dir: spec.run_dir.clone(),
        gpu: gpu_section,
        port: port_section,
        secrets: secrets_section,
        tunnel: tunnel_plan,
        engine: ProcessSection { program: engine_program, argv: redact(engine_argv), env: redact_env(engine_env) },
        harbor: HarborSection {
            mode,
            api_base,
            process: ProcessSection { program: harbor_program, argv: redact(harbor_argv), env: redact_env(harbor_env) },
            agents: merged_agents,
            config_check: None,
            rewrites,
            warnings: agent_envs.warnings,
        },
        post_run: post_run.map(|mut p| {
            p.process.argv = redact(p.process.argv);
            p.process.env = redact_env(p.process.env);
            p
        }),
        problems,
    }
}

/// `payload plan --check-harbor` (on a login node, where the cluster's Harbor is installed): runs
/// that Harbor's `jobs start … --print-config` on the plan's fresh-run argv, with the merged job
/// config written to a private temporary file, and records the verdict; a refusal is a problem.
/// Skipped (with the reason) on a resume, or when Harbor cannot be run here.
pub fn check_harbor(spec: &LaunchSpec, plan: &mut Plan) {
    let verdict = if plan.harbor.mode != "fresh" {
        harbor::ConfigCheck::Skipped("resume: Harbor re-reads the job's stored config".to_string())
    } else {
        match check_fresh_argv(spec, plan) {
            Ok(v) => v,
            Err(e) => harbor::ConfigCheck::Skipped(e),
        }
    };
    if let harbor::ConfigCheck::Rejected(why) = &verdict {
        plan.problems.push(Problem { class: OutcomeClass::Harbor, message: why.clone() });
    }
    plan.harbor.config_check = Some(format!("{verdict:?}"));
}

fn check_fresh_argv(spec: &LaunchSpec, plan: &Plan) -> Result<harbor::ConfigCheck, String> {
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
    let verdict = written.map(|()| harbor::check_with_print_config(spec, &argv, &plan.harbor.process.env));
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
    use crate::testutil::spec;

    #[test]
    fn plan_without_nvml_uses_declared_gpus_and_redacts() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = spec();
        spec.jobs_dir = dir.path().to_path_buf();
        spec.run_dir = dir.path().join(&spec.run_tag);
        spec.serve.declared_gpus = Some(4);
        let secrets_file = dir.path().join("s.env");
        std::fs::write(&secrets_file, "DAYTONA_API_KEY=plan-secret-1\nDAYTONA_DATA_API_KEY=plan-secret-2\n").unwrap();
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
