//! Planning (docs/design.md §7.3–7.4): for every (model, leg dataset) decide submit, skip, resubmit
//! or continue over one [`Snapshot`], and for each pair that would be queued build its launch spec
//! and its exact `sbatch` request. Pure: no ledger, no Slurm, no clock, no run records (all of
//! that is in the snapshot); `plan` prints this and `launch` carries out this very list
//! ([`crate::executor`]), so the two cannot disagree.
//!
//! A pair whose configuration is broken (an unknown environment, too many GPUs, a spec payload
//! would refuse) is **refused**, with the reason, and the other pairs go on.

use std::path::PathBuf;

use launch_spec::LaunchSpec;
use launch_spec::spec::HarborStart;
use serde_json::{Value, json};

use crate::config::Preset;
use crate::decide::{self, Action, Decision, LatestAttempt, PairHistory, Policy, Prerequisite};
use crate::domain::{Continuation, SlurmView};
use crate::ledger::PairState;
use crate::queue::{JobInputs, SlurmChoice, SlurmOverrides, sbatch_request, spec_path};
use crate::registry::{Resolved, names};
use crate::selection::{Concurrency, Leg};
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
    pub models: &'a [String],
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
    pub prerequisite: Option<Prerequisite>,
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

/// The overrides recorded with an attempt and compared for config-aware dedup.
pub fn overrides_json(overrides: &SpecOverrides) -> Value {
    json!({
        "timeout_multiplier": overrides.timeout_multiplier,
        "agent_kwargs": overrides.agent_kwargs,
        "gpu_memory_utilization": overrides.gpu_memory_utilization,
        "n_concurrent": overrides.n_concurrent,
        "harbor_config": overrides.harbor_config,
        "agent_parser": overrides.agent_parser,
        "max_output_tokens": overrides.max_output_tokens,
    })
}

/// The config recorded with an attempt (`ledger.config`): what ran, and for a continuation the
/// chain it belongs to.
pub fn attempt_config(job: &PlannedJob, spec: &LaunchSpec) -> Value {
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

/// Plans every (model, leg dataset) pair, in priority order (models outer).
pub fn plan(inputs: &PlanInputs, snapshot: &Snapshot) -> Vec<PlannedJob> {
    let mut queued = 0u32;
    let mut planned = Vec::with_capacity(inputs.models.len() * inputs.legs.len());
    for model in inputs.models {
        for leg in inputs.legs {
            let choice = SlurmChoice::for_leg(inputs.context.cluster, &leg.preset, inputs.slurm);
            let context = inputs.context;
            let tunnel = context
                .agent(model, &leg.preset, inputs.overrides)
                .and_then(|agent| {
                    crate::spec_build::describe_tunnel(context.cluster, &agent, &|f, p| context.expand(f, p))
                })
                .unwrap_or_else(|e| format!("refused: {e}"));
            for dataset in &leg.preset.datasets {
                let overrides = SpecOverrides {
                    n_concurrent: inputs.concurrency.for_leg(leg),
                    dataset: Some(dataset.clone()),
                    ..inputs.overrides.clone()
                };
                let mut job = plan_pair(inputs, snapshot, model, leg, &choice, overrides);
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
    model: &str,
    leg: &Leg,
    choice: &SlurmChoice,
    overrides: SpecOverrides,
) -> PlannedJob {
    let context = inputs.context;
    let dataset = overrides.dataset.clone().unwrap_or_default();
    let benchmark = Preset::benchmark_of(&dataset);
    let family = snapshot.family_of(&benchmark);
    // An agent that does not resolve is refused when the spec is built; until then the preset's.
    let agent = context.agent(model, &leg.preset, &overrides).unwrap_or_else(|_| leg.preset.agent().to_string());
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
    };
    // A pair whose serve settings do not resolve is still decided (a finished pair stays a skip,
    // not a failure on every launch); only if it would be queued is it refused.
    let resolved = context.resolve(model, &leg.preset, &job.overrides).map(|(resolved, _layout)| resolved);
    if let Ok(resolved) = &resolved {
        job.resources.gpus = resolved.gpus();
        job.resources.tensor_parallel_size = resolved.tensor_parallel_size;
        job.resources.data_parallel_size = resolved.data_parallel_size;
        job.timeout_multiplier = resolved.timeout_multiplier;
        job.rule = resolved.rule.clone();
        job.resolved = Some(resolved.clone());
    }
    let pair = snapshot.pairs.get(&(model.to_string(), family, agent));
    let timeout_multiplier = resolved.as_ref().map_or(f64::NAN, |r| r.timeout_multiplier);
    let history = pair_history(pair, timeout_multiplier, &job, &leg.preset, snapshot);
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
        cluster: context.cluster,
        spec: &spec,
        spec_path: &path,
        script: &inputs.executables.script,
        payload_bin: &inputs.executables.payload_bin,
        prelude: inputs.executables.prelude.as_deref(),
        choice,
        benchmark_short: leg.short(),
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
    preset: &Preset,
    snapshot: &Snapshot,
) -> PairHistory {
    let overrides = &job.overrides;
    let Some(pair) = pair else { return PairHistory { latest: None, failed_attempts: 0 } };
    let latest = &pair.latest;
    let stored_timeout = latest.config.get("timeout_multiplier").and_then(Value::as_f64);
    let stored_overrides = latest.config.get("overrides").cloned().unwrap_or(Value::Null);
    // The per-pair dataset is not part of the recorded overrides.
    let comparable = SpecOverrides { dataset: None, ..overrides.clone() };
    // Older rows lack `n_attempts` (and imported ones the agent): compared only where recorded.
    let recorded_as = |key: &str, now: Value| latest.config.get(key).is_none_or(|stored| *stored == now);
    let config_matches = stored_timeout == Some(timeout_multiplier)
        && stored_overrides == overrides_json(&comparable)
        && recorded_as("agent", json!(job.agent))
        && recorded_as("n_attempts", json!(crate::spec_build::preset_n_attempts(preset)));
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
            elsewhere: snapshot.elsewhere(&latest.cluster),
            resumable: pair.latest_resumable,
            continuation: Continuation::of_config(&latest.config).map_or(0, |c| c.number),
        }),
        failed_attempts: pair.failed_attempts,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{self, ConfigRoot};
    use crate::ledger::{Attempt, AttemptId, AttemptStatus};
    use crate::registry::Registry;

    fn attempt(id: i64, model: &str, status: AttemptStatus, config: Value) -> Attempt {
        let at = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        Attempt {
            id: AttemptId(id),
            model: model.into(),
            benchmark: "terminal_bench_2".into(),
            benchmark_family: "terminal_bench_2".into(),
            cluster: "local".into(),
            username: "u".into(),
            run_tag: names::run_tag("terminal_bench_2", model),
            slurm_job_id: Some("1".into()),
            status,
            reason: String::new(),
            config,
            metrics: (status == AttemptStatus::Finished).then(|| json!({"mean_reward": 0.5})),
            attempt: 1,
            submitted_at: at,
            started_at: None,
            ended_at: None,
            updated_at: at,
            agent: "terminus-2".into(),
            source_id: None,
        }
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

    /// The planner over a hand-made snapshot: no ledger, no Slurm, no files but the configuration.
    #[test]
    fn plans_skip_continue_refuse_and_throttle_from_the_snapshot_alone() {
        let root = ConfigRoot { root: Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf() };
        let mut cluster = config::load_cluster(&root.clusters_dir(), "local").unwrap();
        cluster.paths.jobs_dir = "/jobs".into();
        let gpus = config::load_gpu_profiles(&root.clusters_dir()).unwrap();
        let mut registry = Registry::load(&root.registry_dir()).unwrap();
        let mut broken = registry.models["Qwen/Qwen3-8B"].clone();
        broken.id = "test/Broken-1B".into();
        broken.base.conda_env = Some("no-such-env".into());
        broken.variants.clear();
        registry.models.insert("test/Broken-1B".into(), broken);
        let harbor = root.harbor_configs_dir();
        let context = SpecBuilder {
            cluster: &cluster,
            gpu_profiles: &gpus,
            registry: &registry,
            harbor_configs_dir: &harbor,
            root: &root.root,
        };
        let legs = [Leg { name: "tb2".into(), preset: config::load_preset(&root.presets_dir(), "tb2").unwrap() }];
        let models: Vec<String> =
            ["org/Done-1B", "org/Wall-1B", "test/Broken-1B", "org/New-1B", "org/Late-1B"].map(String::from).to_vec();
        // Recorded under the config that would be used now: a continuation, not a fresh run.
        let multiplier =
            context.resolve("org/Wall-1B", &legs[0].preset, &SpecOverrides::default()).unwrap().0.timeout_multiplier;
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
        let executables = Executables {
            payload_bin: "/bin/payload".into(),
            script: "/repo/sbatch/payload.sbatch".into(),
            prelude: None,
        };
        let environment = |_: &str| None;
        let policy = Policy {
            max_failed_attempts: 2,
            stale_pending_s: 3600,
            config_aware: false,
            force: false,
            max_continuations: 5,
        };
        let inputs = PlanInputs {
            context: &context,
            legs: &legs,
            models: &models,
            overrides: &SpecOverrides::default(),
            concurrency: &Concurrency::default(),
            slurm: &SlurmOverrides::default(),
            executables: &executables,
            environment: &environment,
            policy: &policy,
            max_in_flight: 2,
        };
        let planned = plan(&inputs, &snapshot);
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
        assert_eq!(plan(&inputs, &snapshot), planned);
    }
}
