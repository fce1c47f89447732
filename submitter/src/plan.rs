//! Planning and submitting (docs/design.md §7.3–7.4): for every (model, preset dataset) decide submit, skip
//! or resubmit against one ledger snapshot and one Slurm snapshot; then, for `launch`, carry the
//! decisions out — ledger row first, then `sbatch`, then the job id onto the row.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use crate::config::Preset;
use crate::decide::{self, Decision, Elsewhere, LatestAttempt, PairHistory, Policy, Prerequisite, SlurmView, Verdict};
use crate::launch::{LaunchContext, LaunchError, LaunchOverrides};
use crate::ledger::{Heartbeat, Ledger, LedgerError, NewAttempt, PairState, Status, now};
use crate::queue::{JobInputs, run_dir_free_for, sbatch_request, spec_path};
use crate::registry::names;
use crate::slurm::{JobId, Slurm};
use crate::sync::{belongs_to, read_status, run_dir_of};
use crate::team::mirror::Mirror;
use crate::team::publish;

/// One preset selected for this run, with its name (for job-name tags and the stored config).
pub struct SelectedPreset {
    pub name: String,
    pub preset: Preset,
}

/// One row of `submitter plan`.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedJob {
    pub model: String,
    pub preset: String,
    pub benchmark: String,
    pub family: String,
    pub decision: Verdict,
    pub reason: String,
    pub run_tag: String,
    pub resources: Resources,
    pub timeout_multiplier: f64,
    pub rule: String,
    pub serve: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prerequisite: Option<Prerequisite>,
    /// For the operator: an unattended attempt on another cluster (never acted on here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flag: Option<String>,
    /// The job's tunnel(s) and the agent's model variables (or why it cannot launch here).
    pub tunnel: String,
    #[serde(skip)]
    pub dataset: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Resources {
    pub gpus: u32,
    pub tensor_parallel_size: u32,
    pub data_parallel_size: u32,
    pub time: String,
}

/// The ledger's state as the planner needs it, read once.
pub struct LedgerView {
    pub families: HashMap<String, String>,
    pub pairs: HashMap<(String, String), PairState>,
    /// Per cluster, its freshest heartbeat.
    pub heartbeats: HashMap<String, Heartbeat>,
}

impl LedgerView {
    pub fn read(ledger: &dyn Ledger) -> Result<LedgerView, LedgerError> {
        let families = ledger.families()?.into_iter().collect();
        let pairs = ledger.latest_per_pair()?.into_iter().map(|p| ((p.model.clone(), p.family.clone()), p)).collect();
        let mut heartbeats: HashMap<String, Heartbeat> = HashMap::new();
        for beat in ledger.heartbeats()? {
            match heartbeats.get(&beat.cluster) {
                Some(known) if known.age_s <= beat.age_s => {}
                _ => {
                    heartbeats.insert(beat.cluster.clone(), beat);
                }
            }
        }
        Ok(LedgerView { families, pairs, heartbeats })
    }

    /// How `cluster` looks from `here`: None for our own cluster, else the other cluster with
    /// the freshest heartbeat of its submitters.
    pub fn elsewhere(&self, cluster: &str, here: &str) -> Option<Elsewhere> {
        (cluster != here).then(|| Elsewhere {
            cluster: cluster.to_string(),
            heartbeat: self.heartbeats.get(cluster).map(|h| (h.age_s, h.stale_after_s)),
        })
    }

    pub fn family_of(&self, benchmark: &str) -> String {
        self.families.get(benchmark).cloned().unwrap_or_else(|| benchmark.to_string())
    }
}

/// The config recorded with an attempt and compared for config-aware dedup.
pub fn attempt_config(
    spec: &launch_spec::LaunchSpec,
    preset: &str,
    job_name: &str,
    overrides: &LaunchOverrides,
) -> Value {
    json!({
        "run_dir": spec.run_dir,
        "spec": spec_path(spec),
        "job_name": job_name,
        "preset": preset,
        "agent": spec.harbor.agent,
        "harbor_config": spec.harbor.config,
        "timeout_multiplier": spec.harbor.timeout_multiplier,
        "overrides": overrides_json(overrides),
    })
}

fn overrides_json(overrides: &LaunchOverrides) -> Value {
    json!({
        "timeout_multiplier": overrides.timeout_multiplier,
        "agent_kwargs": overrides.agent_kwargs,
        "gpu_memory_utilization": overrides.gpu_memory_utilization,
        "n_concurrent": overrides.n_concurrent,
    })
}

/// Decides every (model, dataset) pair. `job_views` maps Slurm job ids of active attempts to
/// Slurm's view; `force` bypasses dedup (only ever for an explicit model list, checked by the CLI).
pub fn plan(
    context: &LaunchContext,
    presets: &[SelectedPreset],
    models: &[String],
    overrides: &LaunchOverrides,
    view: &LedgerView,
    job_views: &HashMap<String, SlurmView>,
    policy: &Policy,
) -> Result<Vec<PlannedJob>, LaunchError> {
    let mut planned = Vec::with_capacity(models.len() * presets.len());
    for model in models {
        for selected in presets {
            let agent = selected.preset.agent();
            let tunnel = crate::launch::describe_tunnel(context.cluster, agent, &|f, p| context.expand(f, p))
                .unwrap_or_else(|e| format!("refused: {e}"));
            for dataset in &selected.preset.datasets {
                let (resolved, _) = context.resolve(model, &selected.preset, overrides)?;
                let benchmark = Preset::benchmark_of(dataset);
                let family = view.family_of(&benchmark);
                let pair = view.pairs.get(&(model.clone(), family.clone()));
                let history = pair_history(pair, resolved.timeout_multiplier, overrides, |cluster| {
                    view.elsewhere(cluster, &context.cluster.name)
                });
                let slurm = pair.and_then(|p| p.latest.slurm_job_id.as_ref()).and_then(|id| job_views.get(id).copied());
                let slurm = match (pair, slurm) {
                    (Some(p), None) if p.latest.status.is_active() && p.latest.slurm_job_id.is_some() => {
                        Some(SlurmView::Gone)
                    }
                    (_, view) => view,
                };
                let Decision { decision, reason, prerequisite, flag } = decide::decide(&history, slurm, policy);
                planned.push(PlannedJob {
                    model: model.clone(),
                    preset: selected.name.clone(),
                    benchmark: benchmark.clone(),
                    family,
                    decision,
                    reason,
                    run_tag: names::run_tag(&benchmark, model),
                    resources: Resources {
                        gpus: resolved.gpus(),
                        tensor_parallel_size: resolved.tensor_parallel_size,
                        data_parallel_size: resolved.data_parallel_size,
                        time: selected.preset.slurm_time.clone().unwrap_or_else(|| context.cluster.slurm.time.clone()),
                    },
                    timeout_multiplier: resolved.timeout_multiplier,
                    rule: resolved.rule.clone(),
                    serve: serde_json::to_value(crate::output::ServeSettings::new(&resolved, None))
                        .unwrap_or(Value::Null),
                    prerequisite,
                    flag,
                    tunnel: tunnel.clone(),
                    dataset: dataset.clone(),
                });
            }
        }
    }
    Ok(planned)
}

fn pair_history(
    pair: Option<&PairState>,
    timeout_multiplier: f64,
    overrides: &LaunchOverrides,
    elsewhere: impl Fn(&str) -> Option<Elsewhere>,
) -> PairHistory {
    let Some(pair) = pair else { return PairHistory { latest: None, failed_attempts: 0 } };
    let latest = &pair.latest;
    let stored_timeout = latest.config.get("timeout_multiplier").and_then(Value::as_f64);
    let stored_overrides = latest.config.get("overrides").cloned().unwrap_or(Value::Null);
    let config_matches = stored_timeout == Some(timeout_multiplier) && stored_overrides == overrides_json(overrides);
    let has_recorded_outcome = latest.status.is_active()
        && run_dir_of(latest)
            .and_then(|dir| read_status(&dir))
            .is_some_and(|s| belongs_to(&s, latest) && s.outcome.is_some());
    PairHistory {
        latest: Some(LatestAttempt {
            id: latest.id.0,
            status: latest.status,
            slurm_job_id: latest.slurm_job_id.clone(),
            age_s: u64::try_from((now() - latest.submitted_at).num_seconds()).unwrap_or(0),
            has_metrics: latest.metrics.as_ref().is_some_and(|m| !m.is_null()),
            incomplete: latest
                .metrics
                .as_ref()
                .is_some_and(|m| m.pointer("/audit/status").and_then(Value::as_str) == Some("incomplete")),
            config_matches,
            has_recorded_outcome,
            elsewhere: elsewhere(&latest.cluster),
        }),
        failed_attempts: pair.failed_attempts,
    }
}

/// Where payload and the batch script live as the compute node sees them.
pub struct Executables {
    pub payload_bin: PathBuf,
    pub script: PathBuf,
    /// The profile's prelude, absolute (the job's cwd is not the configuration root).
    pub prelude: Option<PathBuf>,
}

/// Submission settings for one `launch` iteration.
pub struct SubmitSettings<'a> {
    pub max_in_flight: u32,
    pub delay: Duration,
    pub username: String,
    pub executables: &'a Executables,
    pub overrides: &'a LaunchOverrides,
    /// Chain submissions in batches with `--dependency=afterany:` (0 = off).
    pub chain_batch: usize,
    pub environment: &'a dyn Fn(&str) -> Option<String>,
    /// Staging and preflight for one job's spec (docs/site.md), before any ledger row: an error
    /// means "do not submit this pair now" and does not count as an attempt.
    pub prepare: &'a dyn Fn(&PlannedJob, &launch_spec::LaunchSpec) -> Result<(), NotSubmitted>,
    /// Publish each attempt to the team's database too (`--mirror`).
    pub mirror: Option<&'a Mirror>,
}

/// Why [`SubmitSettings::prepare`] held a job back.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NotSubmitted {
    #[error("not submitted: staging failed: {0}")]
    Staging(String),
    #[error("not submitted: preflight failed: {0}")]
    Preflight(String),
}

#[derive(Debug, Clone, Serialize)]
pub struct Submitted {
    pub model: String,
    pub benchmark: String,
    pub attempt: Option<i64>,
    pub job_id: Option<String>,
    pub outcome: String,
}

impl Submitted {
    /// A submission that was meant to happen and did not (sbatch refused it, the pre-download or
    /// the run dir stood in the way); throttled and already-active jobs are not failures.
    pub fn failed(&self) -> bool {
        self.outcome.starts_with("sbatch failed") || self.outcome.starts_with("not submitted")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Slurm(#[from] crate::slurm::SlurmError),
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Carries out the submit/resubmit decisions, in priority order, within the throttle.
/// A ledger or Slurm error stops the iteration (fail closed); an sbatch rejection of one job marks
/// that row failed (so it never blocks the pair) and goes on.
pub fn submit(
    context: &LaunchContext,
    presets: &[SelectedPreset],
    planned: &[PlannedJob],
    ledger: &dyn Ledger,
    slurm: &dyn Slurm,
    settings: &SubmitSettings,
) -> Result<Vec<Submitted>, SubmitError> {
    let mut in_flight = ledger.active()?.iter().filter(|a| a.cluster == context.cluster.name).count() as u32;
    let mut slots = settings.max_in_flight.saturating_sub(in_flight);
    let mut results = Vec::new();
    let mut chain: Vec<JobId> = Vec::new();
    for job in planned.iter().filter(|j| j.decision != Verdict::Skip) {
        let mut record = |outcome: String, attempt: Option<i64>, job_id: Option<String>| {
            results.push(Submitted {
                model: job.model.clone(),
                benchmark: job.benchmark.clone(),
                attempt,
                job_id,
                outcome,
            });
        };
        // A vanished attempt is failed whatever happens next; a stale one is cancelled only when
        // there is a slot to resubmit it into.
        if let Some(Prerequisite::MarkVanished { attempt_id }) = &job.prerequisite {
            ledger.transition(
                crate::ledger::AttemptId(*attempt_id),
                Status::Failed,
                "vanished (no Slurm job, no outcome)",
                None,
            )?;
            let id = crate::ledger::AttemptId(*attempt_id);
            publish(settings.mirror, &format!("attempt {id} (Failed)"), |m| m.transition(id, Status::Failed, None));
        }
        if slots == 0 {
            record(format!("throttled: {in_flight} attempts in flight (max {})", settings.max_in_flight), None, None);
            continue;
        }
        if let Some(Prerequisite::CancelStale { attempt_id, slurm_job_id }) = &job.prerequisite {
            if let Ok(id) = slurm_job_id.parse() {
                slurm.cancel(id, None, false)?;
            }
            ledger.transition(
                crate::ledger::AttemptId(*attempt_id),
                Status::Cancelled,
                "stale pending: cancelled for resubmission",
                None,
            )?;
            let id = crate::ledger::AttemptId(*attempt_id);
            publish(settings.mirror, &format!("attempt {id} (Failed)"), |m| m.transition(id, Status::Cancelled, None));
        }
        let Some(selected) = presets.iter().find(|p| p.name == job.preset) else { continue };
        let overrides = LaunchOverrides { dataset: Some(job.dataset.clone()), ..settings.overrides.clone() };
        let mut spec = context.build(&job.model, &selected.preset, &overrides)?;
        let short = selected.preset.log_suffix.clone().unwrap_or_else(|| selected.name.clone());
        let job_name = names::job_name(&short, &job.model);
        let spec_file = spec_path(&spec);
        if let Err(why) = run_dir_free_for(&spec) {
            record(format!("not submitted: {why}"), None, None);
            continue;
        }
        if let Err(refusal) = (settings.prepare)(job, &spec) {
            record(refusal.to_string(), None, None);
            continue;
        }
        // Ledger row first: it reserves the pair (the database refuses a second active attempt).
        let new = NewAttempt {
            model: job.model.clone(),
            benchmark: job.benchmark.clone(),
            cluster: context.cluster.name.clone(),
            username: settings.username.clone(),
            run_tag: spec.run_tag.clone(),
            reason: job.reason.clone(),
            config: attempt_config(&spec, &selected.name, &job_name, settings.overrides),
        };
        let attempt = match ledger.insert_pending(&new) {
            Ok(id) => id,
            Err(LedgerError::AlreadyActive { existing_id, .. }) => {
                record(format!("skipped: attempt {existing_id} is already active (another submitter)"), None, None);
                continue;
            }
            Err(err) => return Err(err.into()),
        };
        spec.ledger_job_id = Some(attempt.0.to_string());
        // The team's row, like the ledger's, exists before sbatch.
        publish(settings.mirror, &format!("attempt {attempt} (Pending)"), |m| {
            if !m.pending(attempt, &new)? {
                tracing::warn!(
                    "mirror: {} or {} is not in the team's models/benchmarks: not published",
                    new.model,
                    new.benchmark
                );
            }
            Ok(())
        });
        if let Err(err) = write_spec(&spec_file, &spec.to_json()) {
            ledger.transition(attempt, Status::Failed, &format!("not submitted: {err}"), None)?;
            return Err(err);
        }
        let dependency = (settings.chain_batch > 0 && chain.len() >= settings.chain_batch)
            .then(|| format!("afterany:{}", chain[chain.len() - settings.chain_batch]));
        let request = sbatch_request(&JobInputs {
            cluster: context.cluster,
            spec: &spec,
            spec_path: &spec_file,
            script: &settings.executables.script,
            payload_bin: &settings.executables.payload_bin,
            prelude: settings.executables.prelude.as_deref(),
            time: &job.resources.time,
            benchmark_short: &short,
            dependency,
            environment: settings.environment,
        });
        let submitted = request.and_then(|request| slurm.submit(&request).map_err(|e| e.to_string()));
        match submitted {
            Ok(job_id) => {
                ledger.set_job_id(attempt, &job_id.to_string())?;
                publish(settings.mirror, &format!("attempt {attempt} job id"), |m| {
                    m.submitted(attempt, &job_id.to_string())
                });
                chain.push(job_id);
                slots -= 1;
                in_flight += 1;
                record(format!("submitted ({})", job.reason), Some(attempt.0), Some(job_id.to_string()));
                std::thread::sleep(settings.delay);
            }
            Err(problem) => {
                // The row must not block the pair: it failed, with sbatch's reason.
                ledger.transition(attempt, Status::Failed, &format!("sbatch failed: {problem}"), None)?;
                publish(settings.mirror, &format!("attempt {attempt} (Failed)"), |m| {
                    m.transition(attempt, Status::Failed, None)
                });
                record(format!("sbatch failed: {problem}"), Some(attempt.0), None);
            }
        }
    }
    Ok(results)
}

fn write_spec(path: &Path, text: &str) -> Result<(), SubmitError> {
    launch_spec::records::write_atomically(path, text.as_bytes())
        .map_err(|source| SubmitError::Write { path: path.to_path_buf(), source })
}
