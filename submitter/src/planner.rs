//! Planning (docs/design.md §7.3–7.4): for every (model, leg dataset) decide submit, skip, resubmit
//! or continue over one [`Snapshot`], and for each pair that would be queued build its launch spec
//! and its exact `sbatch` request. Pure: no ledger, no Slurm, no clock, no run records (all of
//! that is in the snapshot); `plan` prints this and `launch` carries out this very list
//! ([`crate::executor`]), so the two cannot disagree.
//!
//! A pair whose configuration is broken (an unknown environment, too many GPUs, a spec payload
//! would refuse) is **refused**, with the reason, and the other pairs go on.

use std::path::{Path, PathBuf};

use launch_spec::LaunchSpec;
use launch_spec::pool::{POOL_SPEC_FILE, POOL_SPEC_VERSION, PoolJobSpec, PoolMember, PoolWeights, WeightsKind};
use launch_spec::shared::{SHARED_SPEC_FILE, SHARED_SPEC_VERSION, SharedJobSpec};
use launch_spec::spec::HarborStart;
use serde_json::{Value, json};

use crate::config::{Allocation, Preset};
use crate::decide::{self, Action, Decision, LatestAttempt, PairHistory, Policy, Prerequisite};
use crate::domain::{Continuation, SlurmView};
use crate::ledger::PairState;
use crate::queue::{JobInputs, SlurmOverrides, sbatch_request, spec_path};
use crate::registry::{Resolved, names};
use crate::selection::{Concurrency, Leg};
use crate::settings::{Choices, ResolvedSettings};
use crate::slurm::{SubmitRequest, build_sbatch_args};
use crate::snapshot::Snapshot;
use crate::spec_build::{SpecBuilder, SpecOverrides};

/// Where payload and the batch script live as the compute node sees them.
#[derive(Debug, Clone)]
pub struct Executables {
    pub payload_bin: PathBuf,
    pub script: PathBuf,
    /// The profile's prelude, absolute (the job's cwd is not the configuration root).
    pub prelude: Option<PathBuf>,
}

/// Everything the planner reads besides the snapshot.
pub struct PlanInputs<'a> {
    pub context: &'a SpecBuilder<'a>,
    pub legs: &'a [Leg],
    /// The priority list, in order.
    pub models: &'a [launch_spec::ModelId],
    /// The operator's spec overrides (`n_concurrent` and `dataset` are set per leg from `concurrency`).
    pub overrides: &'a SpecOverrides,
    pub concurrency: &'a Concurrency,
    pub slurm: &'a SlurmOverrides,
    pub executables: &'a Executables,
    /// The submitter's environment, for the profile's `slurm.export_env` names.
    pub environment: &'a dyn Fn(&str) -> Option<String>,
    pub policy: &'a Policy,
    /// `limits.max_jobs_in_flight`.
    pub max_in_flight: u32,
    /// `--allocation`, when given (docs/submitter.md, "Shared allocation").
    pub allocation: Option<Allocation>,
    /// The walltime limit of a partition, in seconds, and where it was read ([`crate::settings::partition_limit`]):
    /// every `--time` is capped at it.
    pub max_time: &'a dyn Fn(&str) -> Option<(u64, String)>,
    /// A queued leg's checkpoint, read for pooling (`allocation: pool`; [`crate::pool`]): its dir
    /// and the files that decide whether another model's weights fit its engine.
    pub checkpoints: &'a dyn Fn(&LaunchSpec) -> Result<crate::pool::Checkpoint, String>,
}

/// Why a pair the decision would queue is not queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// Its configuration is broken: fix it and the next iteration submits it.
    Refused(String),
    /// No slot under `limits.max_jobs_in_flight` this iteration.
    Throttled(String),
    /// Remediation held the pair (misconfigured): never resubmitted until `submitter release`.
    Held(String),
}

/// One row of `submitter plan`, and one item of `launch`'s work (their documents are output
/// types in the command layer, built from this).
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedJob {
    pub model: String,
    /// The leg (preset name, or `datasets`).
    pub preset: String,
    pub benchmark: String,
    pub family: String,
    /// The dedup decision (`decision` in `plan --json`).
    pub action: Action,
    pub reason: String,
    /// Set when the action would queue a job but it is not queued (refused, throttled).
    pub blocked: Option<Blocked>,
    pub run_tag: String,
    /// The Harbor agent: with model and family, the eval's identity (`SpecBuilder::agent`).
    pub agent: String,
    pub resources: Resources,
    pub timeout_multiplier: f64,
    pub rule: String,
    /// The resolved serve settings (`plan`'s `serve`), when they resolve.
    pub resolved: Option<Resolved>,
    pub(crate) prerequisite: Option<Prerequisite>,
    /// For the operator: an unattended attempt on another cluster (never acted on here).
    pub flag: Option<String>,
    /// For a walltime continuation: the attempt it continues and its place in the chain.
    pub continues: Option<Continuation>,
    /// For a skip: the attempt the decision rests on, and whether it is this ledger's own or a
    /// row of the team's history.
    pub evidence: Option<Evidence>,
    /// The job's tunnel(s) and the agent's model variables (or why it cannot launch here).
    pub tunnel: String,
    /// Where the spec goes (`<run dir>/launch.json`), for queued pairs.
    pub spec_path: Option<PathBuf>,
    /// The exact `sbatch` argv (program first) for queued pairs; `--chain-batch` adds
    /// `--dependency=afterany:<job>` when submitting, the job id not being known before.
    pub sbatch: Option<Vec<String>>,
    pub spec: Option<LaunchSpec>,
    pub request: Option<SubmitRequest>,
    pub job_name: String,
    /// The leg dataset as the preset names it (staging fetches it by this name).
    pub dataset: String,
    pub overrides: SpecOverrides,
    /// What remediation changes in this pair's launch (its ledger adjustment), in words.
    pub remedy: Option<String>,
    /// Every setting of the pair's job with where it came from (`plan` prints them); one job per
    /// leg or one shared job per model is its `allocation`.
    pub settings: ResolvedSettings,
    /// The shared job it is a leg of (its group tag; [`Plan::shared`]). Its own `sbatch` and
    /// `request` are then `None`: the job's are the group's.
    pub(crate) shared_job: Option<String>,
    /// Why a leg whose allocation is `shared` still gets a job of its own.
    pub(crate) allocation_note: Option<String>,
    /// The pair's latest attempt in the snapshot (names a shared job's group apart from earlier ones).
    pub(crate) latest_attempt: Option<i64>,
}

/// Where a decision's evidence came from (`plan` shows it for every skip).
#[derive(Debug, Clone, PartialEq)]
pub enum Evidence {
    /// An attempt recorded by a submitter of this ledger (on any cluster sharing it).
    Own { attempt: i64 },
    /// A row of the team's `sandbox_jobs` (its id), folded into the ledger as `attempt`.
    Team { row: String, attempt: i64 },
}

impl Evidence {
    pub fn of(attempt: &crate::ledger::Attempt) -> Evidence {
        // `<source>#<sandbox_jobs.id>` (team::import).
        match attempt.source_id.as_deref().and_then(|s| s.rsplit_once('#')) {
            Some((_, row)) => Evidence::Team { row: row.to_string(), attempt: attempt.id.0 },
            None => Evidence::Own { attempt: attempt.id.0 },
        }
    }

    /// `own ledger attempt 12`, `team row 2000… (ledger attempt 13)`.
    pub fn describe(&self) -> String {
        match self {
            Evidence::Own { attempt } => format!("own ledger attempt {attempt}"),
            Evidence::Team { row, attempt } => format!("team row {row} (ledger attempt {attempt})"),
        }
    }
}

impl PlannedJob {
    /// Whether `launch` queues a job for it.
    pub fn queues(&self) -> bool {
        self.action.submits() && self.blocked.is_none()
    }

    /// The word `plan` shows for it.
    pub fn label(&self) -> &'static str {
        match &self.blocked {
            Some(Blocked::Refused(_)) => "refused",
            Some(Blocked::Throttled(_)) => "throttled",
            Some(Blocked::Held(_)) => "held",
            None => self.action.as_str(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Resources {
    pub gpus: u32,
    pub tensor_parallel_size: u32,
    pub data_parallel_size: u32,
    pub time: String,
    pub partition: String,
    pub account: Option<String>,
    pub reservation: Option<String>,
}

/// The overrides recorded with an attempt and compared for config-aware dedup. Destructured whole,
/// so a new operator choice is either recorded here or named as not changing what runs.
pub(crate) fn overrides_json(overrides: &SpecOverrides) -> Value {
    let SpecOverrides {
        timeout_multiplier,
        agent_kwargs,
        gpu_memory_utilization,
        n_concurrent,
        harbor_config,
        config_yaml,
        agent_parser,
        max_output_tokens,
        // The leg's dataset is the pair's benchmark, already its identity.
        dataset: _,
        // Which tunnel pair carries the traffic changes no result.
        pinggy_pair: _,
    } = overrides;
    let mut recorded = json!({
        "timeout_multiplier": timeout_multiplier,
        "agent_kwargs": agent_kwargs,
        "gpu_memory_utilization": gpu_memory_utilization,
        "n_concurrent": n_concurrent,
        "harbor_config": harbor_config,
        "agent_parser": agent_parser,
        "max_output_tokens": max_output_tokens,
    });
    // Recorded only when set: rows written before it was recorded (no key) then still match a
    // launch without `--config-yaml`.
    if let Some(config_yaml) = config_yaml {
        recorded["config_yaml"] = json!(config_yaml);
    }
    recorded
}

/// The config recorded with an attempt (`ledger.config`): what ran, and for a continuation the
/// chain it belongs to.
pub(crate) fn attempt_config(job: &PlannedJob, spec: &LaunchSpec) -> Value {
    let mut config = json!({
        "run_dir": spec.run_dir,
        "spec": spec_path(spec),
        "job_name": job.job_name,
        "preset": job.preset,
        "agent": spec.harbor.agent,
        "harbor_config": spec.harbor.config,
        "timeout_multiplier": spec.harbor.timeout_multiplier,
        "n_attempts": spec.harbor.n_attempts,
        "agent_kwargs": spec.harbor.agent_kwargs,
        "dataset": spec.harbor.dataset,
        "overrides": overrides_json(&job.overrides),
    });
    if let Some(c) = &job.continues {
        c.record(&mut config);
    }
    config
}

/// A plan: every pair, and the shared jobs some of the queued pairs are legs of.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    pub jobs: Vec<PlannedJob>,
    pub shared: Vec<SharedJob>,
}

/// One Slurm job serving several legs of one model with one engine (issue 24; `launch_spec::shared`).
#[derive(Debug, Clone, PartialEq)]
pub struct SharedJob {
    pub model: String,
    pub group_tag: String,
    pub group_dir: PathBuf,
    /// Its legs, as indexes into [`Plan::jobs`], in launch order.
    pub legs: Vec<usize>,
    /// The `--time` it asks for, and how that was worked out.
    pub time: String,
    pub time_basis: String,
    /// How the engine's `max_num_seqs` and the legs' `n_concurrent` were reconciled.
    pub capacity: String,
    /// `<group dir>/shared.json`, as planned (the executor writes it with the legs that got a row).
    pub doc: SharedJobSpec,
    pub request: SubmitRequest,
    /// The exact `sbatch` argv, program first (`--chain-batch` adds a dependency when submitting).
    pub sbatch: Vec<String>,
    /// Set when the job is a pool (issue 37): several models on its one engine, one after another.
    /// `doc` then lists every leg of every member in run order (the GPU time is divided among them).
    pub pool: Option<Pool>,
}

/// What a pool adds to a shared job: its members in run order and its place among the pools of
/// one engine configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    /// `(model, its legs as indexes into [`Plan::jobs`])`, in run order; the first starts the engine.
    pub members: Vec<(String, Vec<usize>)>,
    /// `<group dir>/pool.json` as planned (the executor writes it with the legs that got a row).
    pub doc: PoolJobSpec,
    /// 1-based place among the pools planned for one engine configuration, and their number.
    pub order: (usize, usize),
}

/// `max_num_seqs` vLLM uses when the spec sets none. vLLM 0.33.0 picks 256, or 1024 on GPUs with
/// 70 GiB or more; the smaller is assumed, so the reconciliation never counts on memory it lacks.
pub(crate) const VLLM_DEFAULT_MAX_NUM_SEQS: u32 = 256;

impl Plan {
    /// The shared job `job` is a leg of.
    pub(crate) fn shared_of(&self, job: &PlannedJob) -> Option<&SharedJob> {
        let tag = job.shared_job.as_deref()?;
        self.shared.iter().find(|g| g.group_tag == tag)
    }
}

/// Plans every (model, leg dataset) pair, in priority order (models outer), then puts the
/// queued legs of one model whose allocation is `shared` into shared jobs.
pub fn plan(inputs: &PlanInputs, snapshot: &Snapshot) -> Plan {
    let mut jobs = plan_pairs(inputs, snapshot);
    let mut shared = group_pools(inputs, &mut jobs);
    shared.extend(group_shared(inputs, &mut jobs));
    Plan { jobs, shared }
}

fn plan_pairs(inputs: &PlanInputs, snapshot: &Snapshot) -> Vec<PlannedJob> {
    let mut queued = 0u32;
    let mut planned = Vec::with_capacity(inputs.models.len() * inputs.legs.len());
    for model in inputs.models {
        for leg in inputs.legs {
            let context = inputs.context;
            let tunnel = context
                .agent(model, &leg.preset, inputs.overrides)
                .and_then(|agent| {
                    let expand = |f: &str, p: &Path| context.expand(f, p);
                    crate::spec_build::describe_tunnel(context.cluster(), &agent, &expand, inputs.overrides.pinggy_pair)
                })
                .unwrap_or_else(|e| format!("refused: {e}"));
            for dataset in &leg.preset.datasets {
                let overrides = SpecOverrides {
                    n_concurrent: inputs.concurrency.for_leg(leg),
                    dataset: Some(dataset.clone()),
                    ..inputs.overrides.clone()
                };
                let mut job = plan_pair(inputs, snapshot, model, leg, overrides);
                job.tunnel = tunnel.clone();
                if job.queues() {
                    let in_flight = snapshot.in_flight + queued;
                    if in_flight >= inputs.max_in_flight {
                        job.blocked = Some(Blocked::Throttled(format!(
                            "{in_flight} attempts in flight (max {})",
                            inputs.max_in_flight
                        )));
                    } else {
                        queued += 1;
                    }
                }
                planned.push(job);
            }
        }
    }
    planned
}

fn plan_pair(
    inputs: &PlanInputs,
    snapshot: &Snapshot,
    model: &launch_spec::ModelId,
    leg: &Leg,
    overrides: SpecOverrides,
) -> PlannedJob {
    let context = inputs.context;
    let dataset = overrides.dataset.clone().unwrap_or_default();
    let benchmark = Preset::benchmark_of(&dataset);
    let family = snapshot.family_of(&benchmark);
    // An agent that does not resolve is refused when the spec is built; until then the preset's.
    let agent = context.agent(model, &leg.preset, &overrides).unwrap_or_else(|_| leg.preset.agent().to_string());
    // A pair whose serve settings do not resolve is still decided (a finished pair stays a skip,
    // not a failure on every launch); only if it would be queued is it refused.
    let resolved = context.resolve(model, &leg.preset, &overrides).map(|(resolved, _layout)| resolved);
    let choices = Choices { spec: &overrides, slurm: inputs.slurm, allocation: inputs.allocation };
    let mut settings = context.settings(model, &leg.preset, choices, resolved.as_ref().ok());
    if let Some((max_s, source)) = (inputs.max_time)(&settings.partition.value) {
        settings.cap_time(max_s, &source);
    }
    let choice = settings.slurm_choice();
    let mut job = PlannedJob {
        model: model.to_string(),
        preset: leg.name.clone(),
        benchmark: benchmark.clone(),
        family: family.clone(),
        action: Action::Skip,
        reason: String::new(),
        blocked: None,
        run_tag: names::eval_run_tag(&benchmark, model, &agent),
        agent: agent.clone(),
        resources: Resources {
            gpus: 0,
            tensor_parallel_size: 0,
            data_parallel_size: 0,
            time: choice.time.clone(),
            partition: choice.partition.clone(),
            account: choice.account.clone(),
            reservation: choice.reservation.clone(),
        },
        timeout_multiplier: 0.0,
        rule: String::new(),
        resolved: None,
        prerequisite: None,
        flag: None,
        continues: None,
        evidence: None,
        tunnel: String::new(),
        spec_path: None,
        sbatch: None,
        spec: None,
        request: None,
        job_name: names::job_name(leg.short(), model),
        dataset,
        overrides,
        remedy: None,
        settings,
        shared_job: None,
        allocation_note: None,
        latest_attempt: None,
    };
    if let Ok(resolved) = &resolved {
        job.resources.gpus = resolved.gpus();
        job.resources.tensor_parallel_size = resolved.tensor_parallel_size;
        job.resources.data_parallel_size = resolved.data_parallel_size;
        job.timeout_multiplier = resolved.timeout_multiplier;
        job.rule = resolved.rule.clone();
        job.resolved = Some(resolved.clone());
    }
    let pair = snapshot.pairs.get(&(model.to_string(), family, agent));
    job.latest_attempt = pair.map(|p| p.latest.id.0);
    let timeout_multiplier = resolved.as_ref().map_or(f64::NAN, |r| r.timeout_multiplier);
    let history = pair_history(pair, timeout_multiplier, &job, snapshot);
    let slurm = match pair.map(|p| &p.latest) {
        Some(latest) if latest.status.is_active() && latest.cluster == snapshot.cluster => {
            latest.slurm_job_id.as_ref().map(|id| snapshot.jobs.get(id).copied().unwrap_or(SlurmView::Gone))
        }
        _ => None,
    };
    let Decision { action, reason, prerequisite, flag } = decide::decide(&history, slurm, inputs.policy);
    job.action = action;
    job.reason = reason;
    job.prerequisite = prerequisite;
    job.flag = flag;
    if action == Action::Skip {
        job.evidence = pair.map(|p| Evidence::of(&p.latest));
    }
    if action == Action::Continue
        && let Some(latest) = pair.map(|p| &p.latest)
    {
        let before = Continuation::of_config(&latest.config);
        job.continues = Some(Continuation {
            attempt: latest.id.0,
            number: before.map_or(0, |c| c.number) + 1,
            first: Some(before.and_then(|c| c.first).unwrap_or(latest.id.0)),
        });
    }
    let remedy = pair.and_then(|p| snapshot.remedies.get(&(p.model.clone(), p.family.clone(), p.agent.clone())));
    if let Some(adjustment) = remedy.map(|r| &r.adjustment).filter(|a| !a.is_empty()) {
        job.remedy = Some(crate::spec_build::describe_adjustment(adjustment));
    }
    if !action.submits() {
        return job;
    }
    if let Some(hold) = remedy.and_then(|r| r.held.as_ref()) {
        job.blocked = Some(Blocked::Held(crate::remediate::held_text(hold, &job.benchmark)));
        return job;
    }
    if let Some(at) = remedy.and_then(|r| r.adjustment.not_before).filter(|at| *at > snapshot.now) {
        job.blocked = Some(Blocked::Throttled(format!(
            "waiting for the sandbox provider until {} (remediation.provider_wait_s after its failure)",
            at.to_rfc3339()
        )));
        return job;
    }
    if let Err(err) = resolved {
        job.blocked = Some(Blocked::Refused(err.to_string()));
        return job;
    }
    // The spec and the sbatch request, exactly as `launch` will use them.
    let mut spec = match context.build(model, &leg.preset, &job.overrides) {
        Ok(spec) => spec,
        Err(err) => {
            job.blocked = Some(Blocked::Refused(err.to_string()));
            return job;
        }
    };
    place_run(&mut spec, pair, decide::continues_latest(&history, action, inputs.policy));
    let adjustment = remedy.map(|r| r.adjustment.clone()).unwrap_or_default();
    crate::spec_build::apply_adjustment(&mut spec, &adjustment);
    job.run_tag = spec.run_tag.clone();
    let path = spec_path(&spec);
    let request = sbatch_request(&JobInputs {
        cluster: context.cluster(),
        spec: &spec,
        spec_path: &path,
        script: &inputs.executables.script,
        payload_bin: &inputs.executables.payload_bin,
        prelude: inputs.executables.prelude.as_deref(),
        choice: &choice,
        job_name: &job.job_name,
        dependency: None,
        environment: inputs.environment,
    })
    .map(|mut request| {
        if !adjustment.exclude_nodes.is_empty() {
            request.options.exclude = Some(adjustment.exclude_nodes.join(","));
        }
        request
    })
    .and_then(|request| build_sbatch_args(&request).map(|argv| (request, argv)).map_err(|e| e.to_string()));
    match request {
        Ok((request, argv)) => {
            let mut sbatch = vec!["sbatch".to_string()];
            sbatch.extend(argv.iter().map(|a| a.to_string_lossy().into_owned()));
            job.sbatch = Some(sbatch);
            job.request = Some(request);
        }
        Err(problem) => {
            job.blocked = Some(Blocked::Refused(format!("sbatch request: {problem}")));
        }
    }
    job.spec_path = Some(path);
    job.spec = Some(spec);
    job
}

/// Puts the queued `shared` legs of each model into shared jobs: legs whose engine part
/// (`launch_spec::shared::engine_part`), Slurm placement and jobs dir agree form one job; a leg
/// with no partner keeps a job of its own (a shared job of one leg would only add its files).
fn group_shared(inputs: &PlanInputs, jobs: &mut [PlannedJob]) -> Vec<SharedJob> {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        // A `pool` leg no pool took (planned apart, with its note) shares its model's engine.
        let shares = match job.settings.allocation.value {
            Allocation::Shared => true,
            Allocation::Pool => job.shared_job.is_none(),
            Allocation::PerLeg => false,
        };
        let Some(spec) = job.spec.as_ref().filter(|_| job.queues() && shares) else {
            continue;
        };
        let r = &job.resources;
        let key = serde_json::to_string(&json!([
            job.model,
            launch_spec::shared::engine_part(spec),
            r.partition,
            r.account,
            r.reservation,
            spec.jobs_dir,
        ]))
        .unwrap_or_default();
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, legs)) => legs.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    let mut shared = Vec::new();
    for (_, legs) in groups {
        if legs.len() < 2 {
            let own = "no other queued leg of this model with the same engine and Slurm placement: a job of its own";
            let note = &mut jobs[legs[0]].allocation_note;
            *note = Some(note.take().map_or(own.to_string(), |pool| format!("{pool}; {own}")));
            continue;
        }
        match shared_job(inputs, jobs, &legs) {
            Ok(group) => {
                join_group(jobs, &legs, &group.group_tag, &group.time);
                shared.push(group);
            }
            Err(problem) => {
                for &i in &legs {
                    jobs[i].blocked = Some(Blocked::Refused(format!("shared job: {problem}")));
                }
            }
        }
    }
    shared
}

/// `legs` (indexes into `jobs`) run in the one job `group_tag` (a shared job or a pool): none is
/// submitted on its own, and each takes the group's walltime.
fn join_group(jobs: &mut [PlannedJob], legs: &[usize], group_tag: &str, time: &str) {
    for &i in legs {
        let job = &mut jobs[i];
        job.shared_job = Some(group_tag.to_string());
        job.sbatch = None;
        job.request = None;
        job.resources.time = time.to_string();
    }
}

/// The shared job of `legs` (indexes into `jobs`, each with a spec and a request): the capacity
/// reconciliation written into every leg's spec, the walltime, the group dir and the request.
fn shared_job(inputs: &PlanInputs, jobs: &mut [PlannedJob], legs: &[usize]) -> Result<SharedJob, String> {
    // vLLM's batch is shared: every leg's trials at once must fit in max_num_seqs. Raised (on every
    // leg alike, so they still agree on the engine) rather than the legs scaled down: each leg keeps
    // the n_concurrent it is recorded and deduplicated under (docs/decisions.md, issue 24).
    let (total, terms) = concurrency_sum(jobs, legs);
    let first = jobs[legs[0]].spec.clone().ok_or("a leg without a spec")?;
    let capacity = reconcile_capacity(jobs, legs, first.serve.max_num_seqs, total, &terms);
    // The walltime: the longest leg's own `--time` (which, for a job of its own, covered one load
    // and its run) plus one load allowance, the slack for legs whose runs overlap and share the
    // engine's throughput; what does not finish is continued (docs/submitter.md, "Shared allocation").
    let mut longest = (0u64, String::new());
    for &i in legs {
        let time = &jobs[i].resources.time;
        let seconds = crate::config::parse_slurm_time(time)
            .ok_or_else(|| format!("slurm time `{time}` is not a Slurm time (HH:MM:SS or D-HH:MM:SS)"))?;
        if seconds > longest.0 {
            longest = (seconds, format!("{} {time}", jobs[i].preset));
        }
    }
    let (load_s, load_basis) = match &first.serve.ready_budget {
        Some(budget) => (budget.seconds, "the readiness budget"),
        None => (first.serve.health_timeout_s, "engine.health_timeout_s, the longest load payload waits for"),
    };
    let mut time_s = longest.0 + load_s;
    let mut time_basis = format!("longest leg ({}) + load allowance {load_s} s ({load_basis})", longest.1);
    let partition = &jobs[legs[0]].resources.partition;
    if let Some((max_s, source)) = (inputs.max_time)(partition).filter(|(max_s, _)| time_s > *max_s) {
        // The legs share one engine: splitting them would load it twice. Each leg that does not
        // finish in the partition's limit is continued by its own walltime continuation.
        time_basis = format!(
            "capped at {} = {source} (asked {} = {time_basis}); a leg unfinished at the limit is continued (walltime continuation), not split",
            crate::queue::format_slurm_time(max_s),
            crate::queue::format_slurm_time(time_s)
        );
        time_s = max_s;
    }
    let time = crate::queue::format_slurm_time(time_s);
    let key: Vec<String> = legs
        .iter()
        .map(|&i| format!("{}:{}", jobs[i].run_tag, jobs[i].latest_attempt.map_or("new".into(), |a| a.to_string())))
        .collect();
    let model = jobs[legs[0]].model.clone();
    let group_tag = names::shared_group_tag(&model, &key.join(","));
    let group_dir = first.jobs_dir.join(&group_tag);
    let doc = SharedJobSpec {
        version: SHARED_SPEC_VERSION,
        group_tag: group_tag.clone(),
        group_dir: group_dir.clone(),
        legs: legs.iter().filter_map(|&i| jobs[i].spec.as_ref().map(spec_path)).collect(),
    };
    let mut shorts: Vec<&str> = Vec::new();
    for &i in legs {
        let short = inputs.legs.iter().find(|l| l.name == jobs[i].preset).map_or(jobs[i].preset.as_str(), Leg::short);
        if !shorts.contains(&short) {
            shorts.push(short);
        }
    }
    let leg_request = jobs[legs[0]].request.as_ref().ok_or("a leg without an sbatch request")?;
    let request = crate::queue::shared_request(
        leg_request,
        "--shared",
        &group_dir.join(SHARED_SPEC_FILE),
        &group_dir,
        time_s,
        names::job_name(&shorts.join("+"), &model),
    );
    let argv = build_sbatch_args(&request).map_err(|e| format!("sbatch request: {e}"))?;
    let mut sbatch = vec!["sbatch".to_string()];
    sbatch.extend(argv.iter().map(|a| a.to_string_lossy().into_owned()));
    Ok(SharedJob {
        model,
        group_tag,
        group_dir,
        legs: legs.to_vec(),
        time,
        time_basis,
        capacity,
        doc,
        request,
        sbatch,
        pool: None,
    })
}

/// Σ n_concurrent of `legs` and the sum written out (`swebench 32 + tb2 64`).
fn concurrency_sum(jobs: &[PlannedJob], legs: &[usize]) -> (u32, String) {
    let counts: Vec<(String, u32)> = legs
        .iter()
        .map(|&i| (jobs[i].preset.clone(), jobs[i].spec.as_ref().map_or(0, |s| s.harbor.n_concurrent)))
        .collect();
    let total: u32 = counts.iter().map(|(_, n)| n).sum();
    (total, counts.iter().map(|(leg, n)| format!("{leg} {n}")).collect::<Vec<_>>().join(" + "))
}

/// Raises `max_num_seqs` on every leg of `legs` alike to `total` when `set` (the legs' value)
/// does not cover it; says what it did.
fn reconcile_capacity(jobs: &mut [PlannedJob], legs: &[usize], set: Option<u32>, total: u32, terms: &str) -> String {
    match set {
        Some(set) if set >= total => format!("max_num_seqs {set} ≥ Σ n_concurrent {total} ({terms}): unchanged"),
        None if VLLM_DEFAULT_MAX_NUM_SEQS >= total => format!(
            "max_num_seqs unset (vLLM's default, at least {VLLM_DEFAULT_MAX_NUM_SEQS}) ≥ Σ n_concurrent {total} ({terms}): unchanged"
        ),
        before => {
            for &i in legs {
                if let Some(spec) = jobs[i].spec.as_mut() {
                    spec.serve.max_num_seqs = Some(total);
                }
            }
            let was = before.map_or(format!("unset ({VLLM_DEFAULT_MAX_NUM_SEQS})"), |n| n.to_string());
            format!("max_num_seqs raised {was} → {total} = Σ n_concurrent ({terms}); the legs keep their n_concurrent")
        }
    }
}

/// Seconds a pool's walltime allows per swap (pause, reload, canaries, resume). An 8B reloads in
/// 1–3 s on a GPU and a swap measured 40 ms on the CPU build (issue 37); the canaries are a few
/// greedy completions. Errs long: what does not finish is continued in another pool.
pub const POOL_SWAP_ALLOWANCE_S: u64 = 300;
/// A pool's walltime limit when neither Slurm nor the profile names the partition's (24 h, the
/// common MaxTime of the team's clusters).
pub const POOL_DEFAULT_MAX_S: u64 = 24 * 3600;

/// One model's queued `pool` legs and its checkpoint, on their way into a pool.
struct Candidate {
    model: String,
    legs: Vec<usize>,
    checkpoint: crate::pool::Checkpoint,
}

/// Models whose legs share one engine configuration and whose checkpoints agree.
struct Class {
    key: Value,
    members: Vec<Candidate>,
    /// Why the first member was not pooled with an earlier class, if one was tried.
    apart: Option<String>,
}

/// The engine part that must agree among a pool's models, with the Slurm placement and jobs dir:
/// everything but the model, its readiness budget and `max_num_seqs` (both reconciled per pool).
fn pool_key(job: &PlannedJob, spec: &LaunchSpec) -> Value {
    let mut part = launch_spec::shared::engine_part(spec);
    if let Some(map) = part.as_object_mut() {
        map.remove("model");
        if let Some(serve) = map.get_mut("serve").and_then(Value::as_object_mut) {
            serve.remove("ready_budget");
            serve.remove("max_num_seqs");
        }
    }
    let r = &job.resources;
    json!({"engine": part, "placement": [r.partition, r.account, r.reservation], "jobs_dir": spec.jobs_dir})
}

/// The first place two pool keys differ, in words (`serve.max_model_len`, `Slurm placement`).
fn key_difference(a: &Value, b: &Value) -> String {
    let differs = |x: &Value, y: &Value| -> Option<String> {
        let (Some(x), Some(y)) = (x.as_object(), y.as_object()) else { return None };
        x.keys().chain(y.keys()).find(|k| x.get(*k) != y.get(*k)).cloned()
    };
    match differs(&a["engine"], &b["engine"]) {
        Some(field) => match differs(&a["engine"][&field], &b["engine"][&field]) {
            Some(sub) => format!("`{field}.{sub}` differs"),
            None => format!("`{field}` differs"),
        },
        None if a["placement"] != b["placement"] => "Slurm placement (partition, account, reservation) differs".into(),
        None => "jobs dir differs".into(),
    }
}

/// Puts the queued `pool` legs into pools (issue 37; docs/allocation.md "Pools"): models whose
/// legs agree on the engine (all but the model) and placement, and whose checkpoints agree
/// ([`crate::pool::incompatibility`]), in priority order, packed into jobs under the partition's
/// walltime. A model that fits no pool gets the reason in its legs' `allocation_note` and is left
/// to [`group_shared`] (its own legs share one engine).
fn group_pools(inputs: &PlanInputs, jobs: &mut [PlannedJob]) -> Vec<SharedJob> {
    let mut models: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        if !(job.queues() && job.spec.is_some() && job.settings.allocation.value == Allocation::Pool) {
            continue;
        }
        match models.iter_mut().find(|(m, _)| *m == job.model) {
            Some((_, legs)) => legs.push(i),
            None => models.push((job.model.clone(), vec![i])),
        }
    }
    let note = |jobs: &mut [PlannedJob], legs: &[usize], why: &str| {
        for &i in legs {
            jobs[i].allocation_note = Some(format!("pool: {why}; planned apart"));
        }
    };
    let mut classes: Vec<Class> = Vec::new();
    for (model, legs) in models {
        let key_of = |i: usize| jobs[i].spec.as_ref().map(|s| pool_key(&jobs[i], s)).unwrap_or(Value::Null);
        let key = key_of(legs[0]);
        if let Some(&odd) = legs.iter().find(|&&i| key_of(i) != key) {
            let why = format!(
                "its legs {} and {} differ: {}",
                jobs[legs[0]].benchmark,
                jobs[odd].benchmark,
                key_difference(&key, &key_of(odd))
            );
            note(jobs, &legs, &why);
            continue;
        }
        let checkpoint = match jobs[legs[0]].spec.as_ref().map(|s| (inputs.checkpoints)(s)) {
            Some(Ok(checkpoint)) => checkpoint,
            Some(Err(why)) => {
                note(jobs, &legs, &format!("its checkpoint cannot be compared ({why})"));
                continue;
            }
            None => continue,
        };
        let mut apart = None;
        let candidate = Candidate { model, legs, checkpoint };
        let home = classes.iter().position(|class| {
            let first = &class.members[0];
            let why = if class.key != key {
                Some(key_difference(&class.key, &key))
            } else {
                crate::pool::incompatibility(&first.checkpoint, &candidate.checkpoint)
            };
            if let Some(why) = &why {
                apart.get_or_insert_with(|| format!("not pooled with {}: {why}", first.model));
            }
            why.is_none()
        });
        match home {
            Some(c) => classes[c].members.push(candidate),
            None => classes.push(Class { key, members: vec![candidate], apart }),
        }
    }
    let mut pools = Vec::new();
    for class in classes {
        if class.members.len() < 2 {
            let why = class.apart.unwrap_or_else(|| "no other queued model shares its engine and checkpoint".into());
            note(jobs, &class.members[0].legs, &why);
            continue;
        }
        let packs = match pack_pool(inputs, jobs, &class.members) {
            Ok(packs) => packs,
            Err(problem) => {
                for member in &class.members {
                    for &i in &member.legs {
                        jobs[i].blocked = Some(Blocked::Refused(format!("pool: {problem}")));
                    }
                }
                continue;
            }
        };
        let count = packs.len();
        for (n, (range, time_s, basis)) in packs.into_iter().enumerate() {
            let members = &class.members[range];
            match pool_job(jobs, members, (n + 1, count), time_s, basis) {
                Ok(group) => {
                    join_group(jobs, &group.legs, &group.group_tag, &group.time);
                    pools.push(group);
                }
                Err(problem) => {
                    for &i in members.iter().flat_map(|m| &m.legs) {
                        jobs[i].blocked = Some(Blocked::Refused(format!("pool: {problem}")));
                    }
                }
            }
        }
    }
    pools
}

/// Splits a class's members (in priority order) into pools that fit the partition's walltime:
/// one load + each member's longest leg + one swap allowance per member after the first. A member
/// that alone exceeds the limit gets a pool capped at it (its legs continued by the walltime
/// continuation). Each pool: its members' range, its `--time` in seconds, how that was worked out.
fn pack_pool(
    inputs: &PlanInputs,
    jobs: &[PlannedJob],
    members: &[Candidate],
) -> Result<Vec<(std::ops::Range<usize>, u64, String)>, String> {
    let leg_s = |i: usize| {
        let time = &jobs[i].resources.time;
        crate::config::parse_slurm_time(time)
            .ok_or_else(|| format!("slurm time `{time}` is not a Slurm time (HH:MM:SS or D-HH:MM:SS)"))
    };
    let mut member_s = Vec::with_capacity(members.len());
    for member in members {
        let mut longest = 0;
        for &i in &member.legs {
            longest = longest.max(leg_s(i)?);
        }
        member_s.push(longest);
    }
    let (load_s, load_basis) = pool_load_allowance(jobs, members);
    let partition = &jobs[members[0].legs[0]].resources.partition;
    let (cap_s, cap_basis) = (inputs.max_time)(partition)
        .unwrap_or((POOL_DEFAULT_MAX_S, "no partition limit known: the 24 h default".to_string()));
    let mut packs = Vec::new();
    let mut start = 0;
    while start < members.len() {
        let mut end = start + 1;
        let mut used = load_s + member_s[start];
        while end < members.len() && used + POOL_SWAP_ALLOWANCE_S + member_s[end] <= cap_s {
            used += POOL_SWAP_ALLOWANCE_S + member_s[end];
            end += 1;
        }
        let swaps = end - start - 1;
        let legs_s: u64 = member_s[start..end].iter().sum();
        let mut basis = format!(
            "load {load_s} s ({load_basis}) + {} model(s)' longest legs {legs_s} s + {swaps} swap(s) × {POOL_SWAP_ALLOWANCE_S} s",
            end - start
        );
        let time_s = if used > cap_s {
            basis = format!(
                "capped at {} = {cap_basis} (asked {}); its legs unfinished at the limit are continued",
                crate::queue::format_slurm_time(cap_s),
                crate::queue::format_slurm_time(used)
            );
            cap_s
        } else {
            if end < members.len() {
                basis += &format!(
                    "; the next model would pass {} = {cap_basis}: the rest in the next pool",
                    crate::queue::format_slurm_time(cap_s)
                );
            }
            used
        };
        packs.push((start..end, time_s, basis));
        start = end;
    }
    Ok(packs)
}

/// One load allowance for a pool: the largest readiness budget among its legs (a cold restart of
/// any member must fit too), else the engine's `health_timeout_s`.
fn pool_load_allowance(jobs: &[PlannedJob], members: &[Candidate]) -> (u64, &'static str) {
    let specs = members.iter().flat_map(|m| &m.legs).filter_map(|&i| jobs[i].spec.as_ref());
    match specs.clone().filter_map(|s| s.serve.ready_budget.as_ref()).map(|b| b.seconds).max() {
        Some(budget) => (budget, "the largest readiness budget"),
        None => (specs.map(|s| s.serve.health_timeout_s).max().unwrap_or(0), "engine.health_timeout_s"),
    }
}

/// One pool of `members` (in run order): capacity and readiness reconciled on every leg alike (the
/// engine must agree for all: `launch_spec::pool::pool_mismatch`), `pool.json`, and the request.
fn pool_job(
    jobs: &mut [PlannedJob],
    members: &[Candidate],
    order: (usize, usize),
    time_s: u64,
    time_basis: String,
) -> Result<SharedJob, String> {
    let legs: Vec<usize> = members.iter().flat_map(|m| m.legs.iter().copied()).collect();
    // One member's legs run side by side, one member at a time: the batch must hold the largest
    // member's Σ n_concurrent.
    let (total, terms) = members
        .iter()
        .map(|m| concurrency_sum(jobs, &m.legs))
        .max_by_key(|(total, _)| *total)
        .ok_or("a pool without members")?;
    // Set alike on every leg (the engine must agree for all): the largest `max_num_seqs` a leg
    // has, and since the engine starts with members[0] but may restart cold with any member, the
    // largest readiness budget.
    let set = legs.iter().filter_map(|&i| jobs[i].spec.as_ref()?.serve.max_num_seqs).max();
    let budget =
        legs.iter().filter_map(|&i| jobs[i].spec.as_ref()?.serve.ready_budget.clone()).max_by_key(|b| b.seconds);
    for &i in &legs {
        if let Some(spec) = jobs[i].spec.as_mut() {
            spec.serve.ready_budget = budget.clone();
            spec.serve.max_num_seqs = set;
        }
    }
    let capacity = reconcile_capacity(jobs, &legs, set, total, &terms);
    let mut specs = Vec::new();
    for (m, member) in members.iter().enumerate() {
        for (l, &i) in member.legs.iter().enumerate() {
            specs.push((m, l, jobs[i].spec.clone().ok_or("a leg without a spec")?));
        }
    }
    if let Some(mismatch) = launch_spec::pool::pool_mismatch(&specs) {
        return Err(mismatch);
    }
    let key: Vec<String> = legs
        .iter()
        .map(|&i| format!("{}:{}", jobs[i].run_tag, jobs[i].latest_attempt.map_or("new".into(), |a| a.to_string())))
        .collect();
    let model = members[0].model.clone();
    let group_tag = names::pool_group_tag(&model, &key.join(","));
    let first = &specs[0].2;
    let group_dir = first.jobs_dir.join(&group_tag);
    let doc = PoolJobSpec {
        version: POOL_SPEC_VERSION,
        group_tag: group_tag.clone(),
        group_dir: group_dir.clone(),
        members: members
            .iter()
            .map(|m| PoolMember {
                model: m.model.clone(),
                weights: PoolWeights {
                    path: m.checkpoint.path.clone(),
                    revision: m.checkpoint.revision.clone(),
                    kind: WeightsKind::Full,
                },
                legs: m.legs.iter().filter_map(|&i| jobs[i].spec.as_ref().map(spec_path)).collect(),
            })
            .collect(),
    };
    let shared_doc = SharedJobSpec {
        version: SHARED_SPEC_VERSION,
        group_tag: group_tag.clone(),
        group_dir: group_dir.clone(),
        legs: doc.legs().map(|(_, l)| l.clone()).collect(),
    };
    let leg_request = jobs[legs[0]].request.as_ref().ok_or("a leg without an sbatch request")?;
    let request = crate::queue::shared_request(
        leg_request,
        "--pool",
        &group_dir.join(POOL_SPEC_FILE),
        &group_dir,
        time_s,
        names::job_name(&format!("pool{}", members.len()), &model),
    );
    let argv = build_sbatch_args(&request).map_err(|e| format!("sbatch request: {e}"))?;
    let mut sbatch = vec!["sbatch".to_string()];
    sbatch.extend(argv.iter().map(|a| a.to_string_lossy().into_owned()));
    Ok(SharedJob {
        model,
        group_tag,
        group_dir,
        legs,
        time: crate::queue::format_slurm_time(time_s),
        time_basis,
        capacity,
        doc: shared_doc,
        request,
        sbatch,
        pool: Some(Pool { members: members.iter().map(|m| (m.model.clone(), m.legs.clone())).collect(), doc, order }),
    })
}

/// Where the attempt runs (docs/decisions.md, "A re-evaluation is a new run"): in the latest
/// attempt's run dir when it continues that unfinished Harbor job; else fresh — in the pair's own
/// run dir for its first attempt, in a run dir of its own for a re-evaluation, so the earlier run
/// dir and its result stay as they were.
fn place_run(spec: &mut LaunchSpec, pair: Option<&PairState>, continues: bool) {
    let tag = match pair {
        Some(pair) if continues => pair.latest.run_tag.clone(),
        Some(pair) => names::attempt_run_tag(&spec.run_tag, pair.total_attempts.max(pair.latest.attempt) + 1),
        None => spec.run_tag.clone(),
    };
    spec.harbor.start = if continues { HarborStart::ResumeUnfinished } else { HarborStart::Fresh };
    spec.run_dir = spec.jobs_dir.join(&tag);
    spec.run_tag = tag;
}

/// What the snapshot knows about one pair, in the decision's terms.
fn pair_history(
    pair: Option<&PairState>,
    timeout_multiplier: f64,
    job: &PlannedJob,
    snapshot: &Snapshot,
) -> PairHistory {
    let overrides = &job.overrides;
    let Some(pair) = pair else { return PairHistory { latest: None, failed_attempts: 0 } };
    let latest = &pair.latest;
    let stored_timeout = latest.config.get("timeout_multiplier").and_then(Value::as_f64);
    let stored_overrides = latest.config.get("overrides").cloned().unwrap_or(Value::Null);
    // Older rows lack `n_attempts` (and imported ones the agent): compared only where recorded.
    let recorded_as = |key: &str, now: Value| latest.config.get(key).is_none_or(|stored| *stored == now);
    let config_matches = stored_timeout == Some(timeout_multiplier)
        && stored_overrides == overrides_json(overrides)
        && recorded_as("agent", json!(job.agent))
        && recorded_as("n_attempts", json!(job.settings.n_attempts.value));
    PairHistory {
        latest: Some(LatestAttempt {
            id: latest.id.0,
            status: latest.status,
            slurm_job_id: latest.slurm_job_id.clone(),
            age_s: u64::try_from((snapshot.now - latest.submitted_at).num_seconds()).unwrap_or(0),
            has_metrics: latest.metrics.as_ref().is_some_and(|m| !m.is_null()),
            incomplete: latest
                .metrics
                .as_ref()
                .is_some_and(|m| m.pointer("/audit/status").and_then(Value::as_str) == Some("incomplete")),
            config_matches,
            has_recorded_outcome: snapshot.recorded_outcome.contains(&latest.id),
            records_fresh: snapshot.records_fresh.contains(&latest.id),
            elsewhere: snapshot.elsewhere(&latest.cluster),
            resumable: pair.latest_resumable,
            continuation: Continuation::of_config(&latest.config).map_or(0, |c| c.number),
        }),
        failed_attempts: pair.failed_attempts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Attempt, AttemptStatus};
    use crate::settings::{Source, Sourced};
    use crate::testkit::Shipped;

    fn attempt(id: i64, model: &str, status: AttemptStatus, config: Value) -> Attempt {
        let mut a = crate::testkit::attempt(id, model, "terminal_bench_2", status);
        a.slurm_job_id = Some("1".into());
        a.config = config;
        a.metrics = (status == AttemptStatus::Finished).then(|| json!({"mean_reward": 0.5}));
        a
    }

    fn pair(latest: Attempt, failed: u32, resumable: bool) -> (crate::snapshot::PairKey, PairState) {
        let key = (latest.model.clone(), latest.benchmark_family.clone(), latest.agent.clone());
        let state = PairState {
            model: latest.model.clone(),
            family: latest.benchmark_family.clone(),
            agent: latest.agent.clone(),
            latest,
            failed_attempts: failed,
            total_attempts: failed + 1,
            latest_resumable: resumable,
        };
        (key, state)
    }

    /// The planner's inputs besides the configuration, the legs and the models: no overrides, no
    /// environment, the test's attempt limit and concurrency.
    struct Fixed {
        executables: Executables,
        policy: Policy,
        overrides: SpecOverrides,
        concurrency: Concurrency,
        slurm: SlurmOverrides,
    }

    fn no_environment(_: &str) -> Option<String> {
        None
    }

    fn no_limit(_: &str) -> Option<(u64, String)> {
        None
    }

    fn no_checkpoint(spec: &LaunchSpec) -> Result<crate::pool::Checkpoint, String> {
        Err(format!("{} not on disk (test)", spec.model.hf_id))
    }

    impl Fixed {
        fn new(max_failed_attempts: u32, concurrency: Concurrency) -> Fixed {
            Fixed {
                executables: Executables {
                    payload_bin: "/bin/payload".into(),
                    script: "/repo/sbatch/payload.sbatch".into(),
                    prelude: None,
                },
                policy: Policy {
                    max_failed_attempts,
                    stale_pending_s: 3600,
                    config_aware: false,
                    force: false,
                    max_continuations: 5,
                },
                overrides: SpecOverrides::default(),
                concurrency,
                slurm: SlurmOverrides::default(),
            }
        }

        fn inputs<'a>(
            &'a self,
            context: &'a SpecBuilder<'a>,
            legs: &'a [Leg],
            models: &'a [launch_spec::ModelId],
            max_in_flight: u32,
            allocation: Option<Allocation>,
        ) -> PlanInputs<'a> {
            PlanInputs {
                context,
                legs,
                models,
                overrides: &self.overrides,
                concurrency: &self.concurrency,
                slurm: &self.slurm,
                executables: &self.executables,
                environment: &no_environment,
                policy: &self.policy,
                max_in_flight,
                allocation,
                max_time: &no_limit,
                checkpoints: &no_checkpoint,
            }
        }
    }

    /// The planner over a hand-made snapshot: no ledger, no Slurm, no files but the configuration.
    #[test]
    fn plans_skip_continue_refuse_and_throttle_from_the_snapshot_alone() {
        let mut shipped = Shipped::load();
        let mut cluster = shipped.cluster("local");
        cluster.paths.jobs_dir = "/jobs".into();
        let registry = &mut shipped.registry;
        let mut broken = registry.models["Qwen/Qwen3-8B"].clone();
        broken.id = "test/Broken-1B".parse().unwrap();
        broken.base.conda_env = Some("no-such-env".into());
        broken.variants.clear();
        registry.models.insert("test/Broken-1B".parse().unwrap(), broken);
        let context = shipped.builder(&cluster);
        let legs = [Leg { name: "tb2".into(), preset: shipped.preset("tb2") }];
        let models: Vec<launch_spec::ModelId> =
            ["org/Done-1B", "org/Wall-1B", "test/Broken-1B", "org/New-1B", "org/Late-1B"]
                .map(|m| m.parse().unwrap())
                .to_vec();
        // Recorded under the config that would be used now: a continuation, not a fresh run.
        let multiplier = context
            .resolve(&"org/Wall-1B".parse().unwrap(), &legs[0].preset, &SpecOverrides::default())
            .unwrap()
            .0
            .timeout_multiplier;
        let chained = json!({"continues": 3, "continuation": 1, "chain_from": 2, "timeout_multiplier": multiplier,
                             "overrides": overrides_json(&SpecOverrides::default())});
        let snapshot = Snapshot {
            cluster: "local".into(),
            now: chrono::DateTime::from_timestamp(1_700_000_600, 0).unwrap(),
            pairs: [
                pair(attempt(1, "org/Done-1B", AttemptStatus::Finished, json!({})), 0, false),
                pair(attempt(4, "org/Wall-1B", AttemptStatus::Failed, chained), 2, true),
            ]
            .into_iter()
            .collect(),
            in_flight: 0,
            ..Snapshot::default()
        };
        let fixed = Fixed::new(2, Concurrency::default());
        let inputs = fixed.inputs(&context, &legs, &models, 2, None);
        let planned = plan(&inputs, &snapshot).jobs;
        let labels: Vec<&str> = planned.iter().map(PlannedJob::label).collect();
        assert_eq!(labels, ["skip", "continue", "refused", "submit", "throttled"]);
        let wall = &planned[1];
        assert_eq!(wall.continues, Some(Continuation { attempt: 4, number: 2, first: Some(2) }));
        assert_eq!(wall.spec.as_ref().unwrap().run_tag, names::run_tag("terminal_bench_2", "org/Wall-1B"));
        assert_eq!(wall.spec.as_ref().unwrap().harbor.start, HarborStart::ResumeUnfinished);
        let new = planned[3].spec.as_ref().unwrap();
        assert_eq!(
            (new.run_tag.as_str(), new.harbor.start),
            (names::run_tag("terminal_bench_2", "org/New-1B").as_str(), HarborStart::Fresh)
        );
        assert!(matches!(&planned[2].blocked, Some(Blocked::Refused(why)) if why.contains("no-such-env")));
        let argv = planned[3].sbatch.as_ref().unwrap();
        assert_eq!(argv[0], "sbatch");
        assert!(argv.iter().any(|a| a == "--partition=debug") && argv.last().unwrap().ends_with("launch.json"));
        assert!(matches!(&planned[4].blocked, Some(Blocked::Throttled(why)) if why.contains("max 2")));
        // The same snapshot plans the same way: nothing else is read.
        assert_eq!(plan(&inputs, &snapshot).jobs, planned);
    }

    /// Issue 34: `--config-aware` sees every recorded operator choice — a changed `--config-yaml`
    /// (not a timeout source, so the multiplier stays) resubmits a finished pair; the same choices
    /// as recorded, or a row recorded before `config_yaml` was, skip it.
    #[test]
    fn config_aware_resubmits_a_finished_pair_whose_config_yaml_changed() {
        let shipped = Shipped::load();
        let mut cluster = shipped.cluster("local");
        cluster.paths.jobs_dir = "/jobs".into();
        let context = shipped.builder(&cluster);
        let legs = [Leg { name: "tb2".into(), preset: shipped.preset("tb2") }];
        let models: Vec<launch_spec::ModelId> = vec!["org/Done-1B".parse().unwrap()];
        let decide = |recorded: &SpecOverrides, now: SpecOverrides| {
            let multiplier = context.resolve(&models[0], &legs[0].preset, &now).unwrap().0.timeout_multiplier;
            let config = json!({"timeout_multiplier": multiplier, "overrides": overrides_json(recorded)});
            let snapshot = Snapshot {
                cluster: "local".into(),
                now: chrono::DateTime::from_timestamp(1_700_000_600, 0).unwrap(),
                pairs: [pair(attempt(1, "org/Done-1B", AttemptStatus::Finished, config), 0, false)]
                    .into_iter()
                    .collect(),
                ..Snapshot::default()
            };
            let mut fixed = Fixed::new(2, Concurrency::default());
            fixed.policy.config_aware = true;
            fixed.overrides = now;
            plan(&fixed.inputs(&context, &legs, &models, 2, None), &snapshot).jobs[0].label()
        };
        let other_base = SpecOverrides { config_yaml: Some("dcagent_eval_defaults.yaml".into()), ..Default::default() };
        assert_eq!(decide(&SpecOverrides::default(), other_base.clone()), "resubmit");
        assert_eq!(decide(&other_base, SpecOverrides::default()), "resubmit");
        assert_eq!(decide(&other_base, other_base.clone()), "skip");
        assert_eq!(decide(&SpecOverrides::default(), SpecOverrides::default()), "skip");
        // A dataset or a tunnel pair chosen is no other config.
        let elsewhere = SpecOverrides {
            pinggy_pair: Some(2),
            dataset: Some("DCAgent2/terminal_bench_2".into()),
            ..Default::default()
        };
        assert_eq!(decide(&SpecOverrides::default(), elsewhere), "skip");
    }

    /// Issue 31: a pair whose trials the sandbox provider failed is resubmitted only after the
    /// wait remediation recorded (`PairAdjustment::not_before`), and `plan` says until when.
    #[test]
    fn a_pair_waiting_for_the_sandbox_provider_is_not_queued_before_its_time() {
        let shipped = Shipped::load();
        let mut cluster = shipped.cluster("local");
        cluster.paths.jobs_dir = "/jobs".into();
        let context = shipped.builder(&cluster);
        let legs = [Leg { name: "tb2".into(), preset: shipped.preset("tb2") }];
        let models: Vec<launch_spec::ModelId> = vec!["org/Dayt-1B".parse().unwrap()];
        let (key, state) = pair(attempt(5, "org/Dayt-1B", AttemptStatus::Failed, json!({})), 1, false);
        let now = chrono::DateTime::from_timestamp(1_700_000_600, 0).unwrap();
        let waiting = |not_before| crate::ledger::PairRemedy {
            adjustment: crate::domain::PairAdjustment { not_before: Some(not_before), ..Default::default() },
            retries: 1,
            ..Default::default()
        };
        let fixed = Fixed::new(3, Concurrency::default());
        let inputs = fixed.inputs(&context, &legs, &models, 4, None);
        let snapshot = |remedy| Snapshot {
            cluster: "local".into(),
            now,
            pairs: [(key.clone(), state.clone())].into_iter().collect(),
            remedies: [(key.clone(), remedy)].into_iter().collect(),
            ..Snapshot::default()
        };
        let planned = plan(&inputs, &snapshot(waiting(now + chrono::Duration::seconds(900)))).jobs;
        assert!(
            matches!(&planned[0].blocked, Some(Blocked::Throttled(why)) if why.contains("waiting for the sandbox provider until 2023-11-14T22:38:20")),
            "{:?}",
            planned[0].blocked
        );
        let planned = plan(&inputs, &snapshot(waiting(now - chrono::Duration::seconds(1)))).jobs;
        assert!(planned[0].queues(), "the wait is over: {:?}", planned[0].blocked);
    }

    /// `--allocation shared` over ID: a model with three queued legs gets one job of three legs, one
    /// whose tb2 finished one of two, one with a single leg left a job of its own; the engine's
    /// max_num_seqs is raised to the legs' Σ n_concurrent on every leg alike.
    #[test]
    fn shared_legs_of_one_model_are_one_job_with_capacity_and_walltime_reconciled() {
        let shipped = Shipped::load();
        let mut cluster = shipped.cluster("local");
        cluster.paths.jobs_dir = "/jobs".into();
        cluster.limits.n_concurrent_ceiling = None;
        let context = shipped.builder(&cluster);
        let legs = crate::selection::legs(&shipped.root.presets_dir(), &["ID".into()], &[]).unwrap();
        let models: Vec<launch_spec::ModelId> =
            ["org/All-1B", "org/Two-1B", "org/One-1B"].map(|m| m.parse().unwrap()).to_vec();
        let done = |model: &str, benchmark: &str| {
            let mut a = attempt(1, model, AttemptStatus::Finished, json!({}));
            a.benchmark = benchmark.into();
            a.benchmark_family = benchmark.into();
            pair(a, 0, false)
        };
        let swebench = Preset::benchmark_of(&legs[0].preset.datasets[0]);
        let v2 = Preset::benchmark_of(&legs[1].preset.datasets[0]);
        let snapshot = Snapshot {
            cluster: "local".into(),
            now: chrono::DateTime::from_timestamp(1_700_000_600, 0).unwrap(),
            pairs: [
                done("org/Two-1B", "terminal_bench_2"),
                done("org/One-1B", "terminal_bench_2"),
                done("org/One-1B", &v2),
            ]
            .into_iter()
            .collect(),
            ..Snapshot::default()
        };
        let items: Vec<_> =
            ["swebench=200", "v2=100", "tb2=50"].iter().map(|t| Concurrency::parse_item(t).unwrap()).collect();
        let fixed = Fixed::new(3, Concurrency::from_items(&items));
        let inputs = fixed.inputs(&context, &legs, &models, 20, Some(Allocation::Shared));
        let planned = plan(&inputs, &snapshot);
        assert_eq!(planned.shared.len(), 2, "{:#?}", planned.shared);
        let all = &planned.shared[0];
        let benchmarks: Vec<&str> = all.legs.iter().map(|&i| planned.jobs[i].benchmark.as_str()).collect();
        assert_eq!((all.model.as_str(), benchmarks.len()), ("org/All-1B", 3));
        assert_eq!(benchmarks[0], swebench);
        let specs: Vec<LaunchSpec> = all.legs.iter().map(|&i| planned.jobs[i].spec.clone().unwrap()).collect();
        assert_eq!(launch_spec::shared::engine_mismatch(&specs), None, "the legs still agree on the engine");
        assert!(specs.iter().all(|s| s.serve.max_num_seqs == Some(350)), "raised to 200 + 100 + 50");
        assert_eq!(specs.iter().map(|s| s.harbor.n_concurrent).collect::<Vec<_>>(), [200, 100, 50], "legs keep theirs");
        assert!(all.capacity.contains("raised") && all.capacity.contains("350"), "{}", all.capacity);
        // The profile's 00:30:00 plus its 120 s readiness deadline.
        assert_eq!(all.time, "00:32:00", "{}", all.time_basis);
        assert!(all.sbatch.iter().any(|a| a == "--time=0-00:32:00"), "{:?}", all.sbatch);
        let shared_spec = all.group_dir.join("shared.json").display().to_string();
        assert_eq!(all.sbatch[all.sbatch.len() - 2..], ["--shared".to_string(), shared_spec]);
        assert!(all.group_dir.starts_with("/jobs") && all.group_tag.starts_with("org__All-1B-shared-"));
        assert!(all.sbatch.iter().any(|a| *a == format!("--output={}/slurm-%j.out", all.group_dir.display())));
        assert_eq!(all.doc.legs, specs.iter().map(spec_path).collect::<Vec<_>>());
        for &i in &all.legs {
            let job = &planned.jobs[i];
            assert_eq!(job.shared_job.as_deref(), Some(all.group_tag.as_str()));
            assert!(job.sbatch.is_none() && job.request.is_none(), "the job's argv is the group's, once");
            assert_eq!(job.settings.allocation, Sourced::new(Allocation::Shared, Source::Cli));
        }
        assert_eq!(planned.shared[1].legs.len(), 2, "org/Two-1B: swebench and v2 left");
        let one: Vec<&PlannedJob> = planned.jobs.iter().filter(|j| j.model == "org/One-1B" && j.queues()).collect();
        assert_eq!(one.len(), 1);
        // The partition's limit (issue 31) caps every leg's `--time` and the shared job's; the plan
        // says that what does not finish is continued.
        let limit = |_: &str| Some((1500, "partition debug's MaxTime (Slurm)".to_string()));
        let inputs = fixed.inputs(&context, &legs, &models, 20, Some(Allocation::Shared));
        let capped = plan(&PlanInputs { max_time: &limit, ..inputs }, &snapshot);
        let all = &capped.shared[0];
        assert_eq!(all.time, "00:25:00", "{}", all.time_basis);
        assert!(all.sbatch.iter().any(|a| a == "--time=0-00:25:00"), "{:?}", all.sbatch);
        assert!(all.time_basis.contains("continued") && all.time_basis.contains("MaxTime"), "{}", all.time_basis);
        let leg = &capped.jobs[all.legs[0]];
        assert!(leg.settings.time.describe().contains("capped from 00:30:00"), "{}", leg.settings.time.describe());
        assert!(one[0].shared_job.is_none() && one[0].sbatch.is_some(), "alone: a job of its own");
        assert!(one[0].allocation_note.as_deref().is_some_and(|n| n.contains("a job of its own")));
        // Per-leg (the default): no shared job at all, and the same snapshot plans the same way.
        let per_leg = PlanInputs { allocation: None, ..inputs };
        assert!(plan(&per_leg, &snapshot).shared.is_empty());
        assert_eq!(plan(&PlanInputs { allocation: Some(Allocation::Shared), ..per_leg }, &snapshot), planned);
    }

    /// A checkpoint of the test's: its dir under /ckpt and a config of this width.
    fn checkpoint(model: &str, hidden_size: u64) -> crate::pool::Checkpoint {
        crate::pool::Checkpoint {
            path: PathBuf::from("/ckpt").join(model),
            revision: Some("rev1".into()),
            config: [("hidden_size".to_string(), json!(hidden_size))].into_iter().collect(),
            tokenizer: "sha1:tok".into(),
            chat_template: Some("sha1:tmpl".into()),
            generation: None,
        }
    }

    /// The test's checkpoints by model: `Other` is another width, `NoDisk` is not on disk.
    fn test_checkpoints(spec: &LaunchSpec) -> Result<crate::pool::Checkpoint, String> {
        match spec.model.hf_id.as_str() {
            "org/NoDisk-1B" => Err("org/NoDisk-1B's weights are not on disk".into()),
            "org/Other-1B" => Ok(checkpoint("org/Other-1B", 128)),
            model => Ok(checkpoint(model, 64)),
        }
    }

    /// `--allocation pool` over ID: three fine-tunes of one architecture are one pool (their legs
    /// in priority order, one engine setting, `--pool`); a model of another width and one whose
    /// weights cannot be read are planned apart with the reason, each a shared job of its legs;
    /// a partition limit splits the pool, the rest in the next one.
    #[test]
    fn fine_tunes_of_one_architecture_are_pooled_and_the_others_planned_apart() {
        let shipped = Shipped::load();
        let mut cluster = shipped.cluster("local");
        cluster.paths.jobs_dir = "/jobs".into();
        let context = shipped.builder(&cluster);
        let legs = crate::selection::legs(&shipped.root.presets_dir(), &["ID".into()], &[]).unwrap();
        let models: Vec<launch_spec::ModelId> =
            ["org/FtA-1B", "org/Other-1B", "org/FtB-1B", "org/NoDisk-1B", "org/FtC-1B"]
                .map(|m| m.parse().unwrap())
                .to_vec();
        let snapshot = Snapshot {
            cluster: "local".into(),
            now: chrono::DateTime::from_timestamp(1_700_000_600, 0).unwrap(),
            ..Snapshot::default()
        };
        let fixed = Fixed::new(3, Concurrency::default());
        let inputs = PlanInputs {
            checkpoints: &test_checkpoints,
            ..fixed.inputs(&context, &legs, &models, 100, Some(Allocation::Pool))
        };
        let planned = plan(&inputs, &snapshot);
        let pools: Vec<&SharedJob> = planned.shared.iter().filter(|g| g.pool.is_some()).collect();
        assert_eq!(pools.len(), 1, "{:#?}", planned.shared);
        let pool = pools[0];
        let members: Vec<&str> = pool.pool.as_ref().unwrap().members.iter().map(|(m, _)| m.as_str()).collect();
        assert_eq!(members, ["org/FtA-1B", "org/FtB-1B", "org/FtC-1B"], "priority order");
        assert_eq!(pool.legs.len(), 9);
        assert!(pool.group_tag.starts_with("org__FtA-1B-pool-"), "{}", pool.group_tag);
        let doc_path = pool.group_dir.join("pool.json").display().to_string();
        assert_eq!(pool.sbatch[pool.sbatch.len() - 2..], ["--pool".to_string(), doc_path]);
        let doc = &pool.pool.as_ref().unwrap().doc;
        assert_eq!(doc.members[1].weights.path, PathBuf::from("/ckpt/org/FtB-1B"));
        assert_eq!(doc.members[1].weights.revision.as_deref(), Some("rev1"));
        assert_eq!(doc.members[2].legs.len(), 3);
        // Every leg agrees on the engine but the model, as payload checks it.
        let specs: Vec<(usize, usize, LaunchSpec)> = pool
            .pool
            .as_ref()
            .unwrap()
            .members
            .iter()
            .enumerate()
            .flat_map(|(m, (_, legs))| legs.iter().enumerate().map(move |(l, &i)| (m, l, i)))
            .map(|(m, l, i)| (m, l, planned.jobs[i].spec.clone().unwrap()))
            .collect();
        assert_eq!(launch_spec::pool::pool_mismatch(&specs), None);
        // The walltime: one load + three models' longest legs + two swaps.
        let leg_s = 30 * 60; // the profile's slurm.time for each leg
        let load_s = specs[0].2.serve.ready_budget.as_ref().map_or(specs[0].2.serve.health_timeout_s, |b| b.seconds);
        let want = load_s + 3 * leg_s + 2 * POOL_SWAP_ALLOWANCE_S;
        assert_eq!(pool.time, crate::queue::format_slurm_time(want), "{}", pool.time_basis);
        assert!(pool.time_basis.contains("3 model(s)") && pool.time_basis.contains("2 swap(s)"), "{}", pool.time_basis);
        // Planned apart, with the reason, each a shared job of its own legs.
        let note_of = |model: &str| {
            planned.jobs.iter().find(|j| j.model == model).and_then(|j| j.allocation_note.clone()).unwrap_or_default()
        };
        assert!(
            note_of("org/Other-1B")
                .contains("not pooled with org/FtA-1B: config.json `hidden_size` differs (64 vs 128)"),
            "{}",
            note_of("org/Other-1B")
        );
        assert!(note_of("org/NoDisk-1B").contains("cannot be compared"), "{}", note_of("org/NoDisk-1B"));
        let shared_models: Vec<&str> =
            planned.shared.iter().filter(|g| g.pool.is_none()).map(|g| g.model.as_str()).collect();
        assert_eq!(shared_models, ["org/Other-1B", "org/NoDisk-1B"]);
        // A partition limit that holds two models: the third in a pool of its own, after it.
        let two = load_s + 2 * leg_s + POOL_SWAP_ALLOWANCE_S;
        let limit = move |_: &str| Some((two + 10, "partition debug's MaxTime (Slurm)".to_string()));
        let split = plan(&PlanInputs { max_time: &limit, ..inputs }, &snapshot);
        let pools: Vec<&Pool> = split.shared.iter().filter_map(|g| g.pool.as_ref()).collect();
        assert_eq!(pools.iter().map(|p| (p.members.len(), p.order)).collect::<Vec<_>>(), [(2, (1, 2)), (1, (2, 2))]);
        let first = split.shared.iter().find(|g| g.pool.as_ref().is_some_and(|p| p.order.0 == 1)).unwrap();
        assert_eq!(first.time, crate::queue::format_slurm_time(two), "{}", first.time_basis);
        assert!(first.time_basis.contains("the rest in the next pool"), "{}", first.time_basis);
        // A limit below one model's legs: a pool per model, capped at it (continued by the walltime).
        let short = |_: &str| Some((1200, "slurm.max_time (profile local)".to_string()));
        let capped = plan(&PlanInputs { max_time: &short, ..inputs }, &snapshot);
        let pools: Vec<&SharedJob> = capped.shared.iter().filter(|g| g.pool.is_some()).collect();
        assert_eq!(pools.len(), 3, "{:#?}", capped.shared);
        for pool in pools {
            assert_eq!(pool.time, "00:20:00", "{}", pool.time_basis);
            assert!(pool.time_basis.starts_with("capped at 00:20:00 = slurm.max_time"), "{}", pool.time_basis);
        }
        // The same inputs plan the same way.
        assert_eq!(plan(&inputs, &snapshot), planned);
    }
}
