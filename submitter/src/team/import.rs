//! `submitter import --from postgres://…`: the team's history (the OT-Agent schema) into the
//! ledger, so that dedup, `results` and `unevaluated` see what the team already ran.
//!
//! Read-only on the source: everything is read in one `READ ONLY` transaction. Idempotent and
//! incremental: each imported attempt carries `<source>#<sandbox_jobs.id>`, and the ledger keeps
//! a watermark per source (the newest lifecycle time seen, capped at the source's clock at the read:
//! a future-dated row cannot hide the rows added after it); a re-run reads only rows whose
//! created/submitted/started/ended time moved past it (minus an overlap for late commits) and
//! writes only rows that are new or whose status, metrics or job id changed. `--full` re-reads all.
//!
//! The mapping (`docs/ledger.md`, "Import"): a job's model is its model's canonical row (the
//! `duplicate_of` target, else itself) by name; its benchmark is the benchmark's name, whose
//! family comes from `benchmarks.duplicate_of`. Finished → finished (metrics kept, empty metrics =
//! none, so the pair is resubmitted as "metrics cleared"); Failed → failed; Pending/Started stay
//! active on cluster `ot-agent` unless stale by the team's bounds ([`Staleness`]: Pending 6 h since
//! submission, Started 24 h since start, the profile's `team:` may change them), superseded by a newer active row of the pair, or the
//! pair is already active here — those become `cancelled` (which never counts as a failure).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use chrono::Duration;
use serde::Serialize;
use serde_json::{Value, json};
use tokio_postgres::types::Type;

use super::{TEAM_CLUSTER, TeamError, source_error};
use crate::ledger::{
    AttemptId, AttemptStatus, ImportedAttempt, ImportedState, Ledger, PgConnection, PgStatements, Timestamp, now,
};

/// Rows committed late with an older timestamp are caught by re-reading this far behind the mark.
const WATERMARK_OVERLAP_S: i64 = 600;
pub use crate::domain::Staleness;

/// The bound the import records for cluster `ot-agent`: its active attempts are flagged when the
/// history has not been re-imported for a day.
pub(crate) const IMPORT_STALE_AFTER_S: u64 = 24 * 3600;

/// A `models` row.
#[derive(Debug, Clone, PartialEq)]
pub struct TeamModel {
    pub id: String,
    pub name: String,
    pub base_model_id: Option<String>,
    pub duplicate_of: Option<String>,
    pub created_by: Option<String>,
}

/// A `benchmarks` row.
#[derive(Debug, Clone, PartialEq)]
pub struct TeamBenchmark {
    pub id: String,
    pub name: String,
    pub duplicate_of: Option<String>,
}

/// A `sandbox_jobs` row (the fields the import uses).
#[derive(Debug, Clone, PartialEq)]
pub struct TeamJob {
    pub id: String,
    pub job_name: Option<String>,
    pub username: Option<String>,
    pub job_status: Option<String>,
    pub submitted_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    pub created_at: Option<Timestamp>,
    pub slurm_job_id: Option<String>,
    pub config: Option<Value>,
    pub metrics: Option<Value>,
    pub stats: Option<Value>,
    pub model_id: Option<String>,
    pub benchmark_id: Option<String>,
    pub n_trials: Option<i64>,
}

/// What the source holds (the jobs: those past the watermark).
#[derive(Debug, Default)]
pub struct TeamHistory {
    pub models: Vec<TeamModel>,
    pub benchmarks: Vec<TeamBenchmark>,
    pub jobs: Vec<TeamJob>,
    /// The newest lifecycle time among `jobs`, never later than the source's clock at the read.
    pub watermark: Option<Timestamp>,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct ImportReport {
    pub source: String,
    pub(crate) models_added: usize,
    pub(crate) families_set: usize,
    pub(crate) jobs_read: usize,
    pub attempts_new: usize,
    pub attempts_updated: usize,
    pub unchanged: usize,
    /// Jobs whose model or benchmark the source does not know or has no name for (nothing to
    /// attribute them to).
    pub skipped_unknown: usize,
    /// Rows this ledger itself published there (`--mirror`): already here.
    pub skipped_own: usize,
    pub seconds: f64,
}

/// Reads the source (one read-only transaction) and folds it into `ledger`. `statement_timeout`
/// bounds each statement on the source (the server cancels one that runs longer), so a
/// `plan`/`launch` iteration that folds the team's rows in cannot hang on it.
pub fn import(
    ledger: &dyn Ledger,
    url: &str,
    full: bool,
    statement_timeout: Option<std::time::Duration>,
    stale: Staleness,
) -> Result<ImportReport, TeamError> {
    let started = Instant::now();
    let mut connection = super::connect(url, statement_timeout.unwrap_or(crate::ledger::LEDGER_CALL_BOUND))?;
    let source = connection.location.clone();
    let since = if full {
        None
    } else {
        ledger.import_watermark(&source)?.map(|mark| mark - Duration::seconds(WATERMARK_OVERLAP_S))
    };
    // Rows still active here are re-read whatever their times: one that went stale in the source
    // (no time moves) must still be settled.
    let prefix = format!("{source}#");
    let active: Vec<String> = ledger
        .imported(&source)?
        .into_iter()
        .filter(|s| s.status.is_active())
        .filter_map(|s| s.source_id.strip_prefix(&prefix).map(str::to_string))
        .collect();
    let history = read_history(&mut connection, since, &active, statement_timeout)?;
    tracing::info!("read {} job(s) from {source} in {:.2} s", history.jobs.len(), started.elapsed().as_secs_f64(),);
    let mut report = apply(ledger, &source, &history, stale)?;
    tracing::info!("written by {:.2} s", started.elapsed().as_secs_f64());
    // Only a completed import moves the mark (and keeps the old one when nothing was read).
    ledger.set_import_watermark(&source, history.watermark.or(ledger.import_watermark(&source)?))?;
    ledger.record_heartbeat(TEAM_CLUSTER, &format!("import from {source}"), IMPORT_STALE_AFTER_S)?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Everything in one `READ ONLY` transaction: a consistent snapshot, and the server itself
/// refuses any write.
pub(crate) fn read_history(
    connection: &mut PgConnection,
    since: Option<Timestamp>,
    also: &[String],
    statement_timeout: Option<std::time::Duration>,
) -> Result<TeamHistory, TeamError> {
    super::bounded(connection, "read the team's history", |client, redactor| {
        read_history_on(client, redactor, since, also, statement_timeout)
    })
}

fn read_history_on(
    client: &mut crate::ledger::PgClient,
    redactor: &crate::ledger::Redactor,
    since: Option<Timestamp>,
    also: &[String],
    statement_timeout: Option<std::time::Duration>,
) -> Result<TeamHistory, TeamError> {
    let redactor = redactor.clone();
    let mut tx = client.read_only_transaction().map_err(source_error(&redactor, "open a read-only transaction"))?;
    if let Some(bound) = statement_timeout {
        // `SET LOCAL`, inside the transaction: a transaction-mode pooler (Supabase's 6543) hands
        // the server connection on afterwards, and a startup `options=-c …` is refused there.
        tx.batch_execute(&format!("SET LOCAL statement_timeout = {}", bound.as_millis().max(1)))
            .map_err(source_error(&redactor, "set the statement timeout"))?;
    }
    let text = |row: &tokio_postgres::Row, i: usize| row.try_get::<_, Option<String>>(i);
    let models = tx
        .query_typed(
            "SELECT id::text, name, base_model_id::text, duplicate_of::text, created_by::text FROM models",
            &[],
        )
        .map_err(source_error(&redactor, "read models"))?
        .iter()
        .map(|row| {
            Ok(TeamModel {
                id: row.try_get(0)?,
                name: text(row, 1)?.unwrap_or_default(),
                base_model_id: text(row, 2)?,
                duplicate_of: text(row, 3)?,
                created_by: text(row, 4)?,
            })
        })
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()
        .map_err(source_error(&redactor, "read models"))?;
    let benchmarks = tx
        .query_typed("SELECT id::text, name, duplicate_of::text FROM benchmarks", &[])
        .map_err(source_error(&redactor, "read benchmarks"))?
        .iter()
        .map(|row| {
            Ok(TeamBenchmark {
                id: row.try_get(0)?,
                name: text(row, 1)?.unwrap_or_default(),
                duplicate_of: text(row, 2)?,
            })
        })
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()
        .map_err(source_error(&redactor, "read benchmarks"))?;
    let rows = tx
        .query_typed(
            "SELECT id::text, job_name, username, job_status::text,
                    submitted_at::timestamptz, started_at::timestamptz, ended_at::timestamptz,
                    created_at::timestamptz, slurm_job_id::text, config::jsonb, metrics::jsonb, stats::jsonb,
                    model_id::text, benchmark_id::text, n_trials::int8,
                    GREATEST(created_at::timestamptz, submitted_at::timestamptz, started_at::timestamptz,
                             ended_at::timestamptz)
             FROM sandbox_jobs
             WHERE $1::timestamptz IS NULL
                OR GREATEST(created_at::timestamptz, submitted_at::timestamptz, started_at::timestamptz,
                            ended_at::timestamptz) > $1
                OR id::text = ANY($2)",
            &[(&since, Type::TIMESTAMPTZ), (&also, Type::TEXT_ARRAY)],
        )
        .map_err(source_error(&redactor, "read sandbox_jobs"))?;
    // The source's own clock when this snapshot was taken: the mark never moves past it, whatever a
    // row claims (a row dated 2099, or stamped by a cluster whose clock runs an hour fast, would
    // otherwise hide every row the team adds later behind the mark).
    let source_now: Timestamp = tx
        .query_typed_one("SELECT transaction_timestamp()", &[])
        .and_then(|row| row.try_get(0))
        .map_err(source_error(&redactor, "read the source's clock"))?;
    let mut watermark: Option<Timestamp> = None;
    let mut jobs = Vec::with_capacity(rows.len());
    let mut seen: HashSet<String> = HashSet::new();
    for row in &rows {
        let parse = || -> Result<TeamJob, tokio_postgres::Error> {
            Ok(TeamJob {
                id: row.try_get(0)?,
                job_name: row.try_get(1)?,
                username: row.try_get(2)?,
                job_status: row.try_get(3)?,
                submitted_at: row.try_get(4)?,
                started_at: row.try_get(5)?,
                ended_at: row.try_get(6)?,
                created_at: row.try_get(7)?,
                slurm_job_id: row.try_get(8)?,
                config: row.try_get(9)?,
                metrics: row.try_get(10)?,
                stats: row.try_get(11)?,
                model_id: row.try_get(12)?,
                benchmark_id: row.try_get(13)?,
                n_trials: row.try_get(14)?,
            })
        };
        // One row the import cannot take (a value past the JSON reader's nesting limit, an id seen
        // twice) is skipped, named, and never blocks the rest (issue 32 item 13).
        let id = row.try_get::<_, Option<String>>(0).ok().flatten().unwrap_or_else(|| "(no id)".to_string());
        let job = match parse() {
            Ok(job) if seen.insert(job.id.clone()) => job,
            Ok(_) => {
                tracing::warn!(
                    "team database {}: sandbox_jobs row {id} appears twice; the first read is kept, the copy \
                     skipped (give each row its own id)",
                    redactor.location
                );
                continue;
            }
            Err(error) => {
                tracing::warn!(
                    "team database {}: sandbox_jobs row {id} skipped, it cannot be read: {} (fix or delete the row)",
                    redactor.location,
                    redactor.describe(&error)
                );
                continue;
            }
        };
        jobs.push(job);
        let newest: Option<Timestamp> = row.try_get(15).map_err(source_error(&redactor, "read sandbox_jobs"))?;
        watermark = watermark.max(newest.map(|t| t.min(source_now)));
    }
    tx.rollback().map_err(source_error(&redactor, "close the read-only transaction"))?;
    Ok(TeamHistory { models, benchmarks, jobs, watermark })
}

/// The catalogue the history implies: `(name, base model's name)` of every model that is not a
/// duplicate and not `precomputed_hf` (the rows the old listener never evaluated).
pub(crate) fn catalogue_of(history: &TeamHistory) -> Vec<(String, Option<String>)> {
    let names: HashMap<&str, &str> = history.models.iter().map(|m| (m.id.as_str(), m.name.as_str())).collect();
    history
        .models
        .iter()
        .filter(|m| m.duplicate_of.is_none() && m.created_by.as_deref() != Some("precomputed_hf") && !m.name.is_empty())
        .map(|m| (m.name.clone(), m.base_model_id.as_deref().and_then(|b| names.get(b)).map(|b| b.to_string())))
        .collect()
}

/// `(benchmark, family)` for every benchmark whose `duplicate_of` names another.
pub(crate) fn families_of(history: &TeamHistory) -> Vec<(String, String)> {
    let names: HashMap<&str, &str> = history.benchmarks.iter().map(|b| (b.id.as_str(), b.name.as_str())).collect();
    history
        .benchmarks
        .iter()
        .filter_map(|b| {
            let target = names.get(b.duplicate_of.as_deref()?)?;
            (*target != b.name).then(|| (b.name.clone(), target.to_string()))
        })
        .collect()
}

/// What the history's jobs mean for the ledger, decided without touching it.
#[derive(Debug, Default)]
pub(crate) struct ImportPlan {
    pub new: Vec<ImportedAttempt>,
    pub updates: Vec<(AttemptId, ImportedAttempt)>,
    pub unchanged: usize,
    pub skipped_unknown: usize,
    pub skipped_own: usize,
}

/// The pure part of an import. `imported`: this source's rows already in the ledger; `active`:
/// the ledger's active pairs `(model, family)` → the `source_id` holding them (None = the ledger's
/// own attempt); `family_of`: the ledger's families after `plan.families` are applied; `own`:
/// this ledger's location (rows it mirrored into the source carry it and are skipped).
// The history, what the ledger holds of it, and the bounds it is judged by: each a separate input of
// this pure step, kept apart so its tests give each alone.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_import(
    history: &TeamHistory,
    source: &str,
    imported: &[ImportedState],
    active: &HashMap<(String, String), Option<String>>,
    family_of: &dyn Fn(&str) -> String,
    own: &str,
    at: Timestamp,
    stale: Staleness,
) -> ImportPlan {
    let models: HashMap<&str, &TeamModel> = history.models.iter().map(|m| (m.id.as_str(), m)).collect();
    let canonical = |id: &str| -> Option<&TeamModel> {
        let model = *models.get(id)?;
        Some(model.duplicate_of.as_deref().and_then(|d| models.get(d).copied()).unwrap_or(model))
    };
    let benchmarks: HashMap<&str, &TeamBenchmark> = history.benchmarks.iter().map(|b| (b.id.as_str(), b)).collect();
    let mut plan = ImportPlan::default();
    let known: HashMap<&str, &ImportedState> = imported.iter().map(|s| (s.source_id.as_str(), s)).collect();

    // Map every job; then settle which active rows stay active, newest first per pair.
    let mut mapped: Vec<(ImportedAttempt, Option<&ImportedState>)> = Vec::new();
    for job in &history.jobs {
        if job.config.as_ref().and_then(|c| c.pointer("/submitter/ledger")).and_then(Value::as_str) == Some(own) {
            plan.skipped_own += 1;
            continue;
        }
        let model = job.model_id.as_deref().and_then(canonical);
        let benchmark = job.benchmark_id.as_deref().and_then(|b| benchmarks.get(b));
        // A model or benchmark with no name is nothing to attribute the job to (an attempt for
        // model "" would be planned, resubmitted and ranked as a model of its own).
        let (Some(model), Some(benchmark)) =
            (model.filter(|m| !m.name.trim().is_empty()), benchmark.filter(|b| !b.name.trim().is_empty()))
        else {
            plan.skipped_unknown += 1;
            continue;
        };
        let source_id = format!("{source}#{}", job.id);
        let row = map_job(job, &model.name, &benchmark.name, source_id, at, stale);
        let state = known.get(row.source_id.as_deref().unwrap_or_default()).copied();
        mapped.push((row, state));
    }
    let mut order: Vec<usize> = (0..mapped.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(mapped[i].0.submitted_at));
    let mut holder: HashMap<(String, String), Option<String>> = active.clone();
    // Rows of this batch that are active now give their pair back first (they are re-decided).
    let batch_ids: HashSet<&str> = mapped.iter().filter_map(|(r, _)| r.source_id.as_deref()).collect();
    holder.retain(|_, source_id| source_id.as_deref().is_none_or(|s| !batch_ids.contains(s)));
    for i in order {
        let row = &mut mapped[i].0;
        if !row.status.is_active() {
            continue;
        }
        let key = (row.model.clone(), family_of(&row.benchmark));
        match holder.get(&key) {
            Some(None) => {
                row.status = AttemptStatus::Cancelled;
                row.reason = format!("{} — the pair is already active in this ledger", row.reason);
            }
            Some(Some(_)) => {
                row.status = AttemptStatus::Cancelled;
                row.reason = format!("{} — superseded by a newer active row of the pair", row.reason);
            }
            None => {
                holder.insert(key, row.source_id.clone());
            }
        }
    }
    for (row, state) in mapped {
        match state {
            None => plan.new.push(row),
            Some(state) => {
                let has_metrics = row.metrics.as_ref().is_some_and(|m| !m.is_null());
                if state.status == row.status
                    && state.has_metrics == has_metrics
                    && state.slurm_job_id == row.slurm_job_id
                {
                    plan.unchanged += 1;
                } else {
                    plan.updates.push((state.id, row));
                }
            }
        }
    }
    plan
}

/// One `sandbox_jobs` row as a ledger attempt (before the active rows are settled).
fn map_job(
    job: &TeamJob,
    model: &str,
    benchmark: &str,
    source_id: String,
    at: Timestamp,
    stale: Staleness,
) -> ImportedAttempt {
    let submitted_at = job.submitted_at.or(job.created_at).or(job.started_at).unwrap_or(at);
    let raw_status = job.job_status.clone().unwrap_or_default();
    let (status, reason) = match raw_status.as_str() {
        "Finished" => (AttemptStatus::Finished, "imported: Finished in the team history".to_string()),
        "Failed" => (AttemptStatus::Failed, "imported: Failed in the team history".to_string()),
        "Pending" if (at - submitted_at).num_seconds() > stale.pending_s => (
            AttemptStatus::Cancelled,
            format!("imported: stale Pending in the team history (submitted {submitted_at})"),
        ),
        "Started" if job.started_at.is_none_or(|s| (at - s).num_seconds() > stale.started_s) => {
            (AttemptStatus::Cancelled, "imported: stale Started in the team history".to_string())
        }
        "Pending" => (AttemptStatus::Pending, "imported: Pending in the team history".to_string()),
        "Started" => (AttemptStatus::Started, "imported: Started in the team history".to_string()),
        other => (AttemptStatus::Failed, format!("imported: unknown job status {other:?} in the team history")),
    };
    let source_config = job.config.clone().unwrap_or(Value::Null);
    let timeout_multiplier = source_config.get("timeout_multiplier").and_then(Value::as_f64).unwrap_or(1.0);
    let config = json!({
        "source": "ot-agent",
        "agent": source_config.get("agent").cloned().unwrap_or(Value::Null),
        "timeout_multiplier": timeout_multiplier,
        "team_config": source_config,
    });
    let metrics = (status == AttemptStatus::Finished).then(|| team_metrics(job)).flatten();
    ImportedAttempt {
        model: model.to_string(),
        benchmark: benchmark.to_string(),
        cluster: TEAM_CLUSTER.to_string(),
        username: job.username.clone().unwrap_or_else(|| "unknown".to_string()),
        run_tag: job.job_name.clone().unwrap_or_default(),
        slurm_job_id: job.slurm_job_id.clone().filter(|j| !j.is_empty() && j != "pending"),
        status,
        reason,
        config,
        metrics,
        submitted_at,
        started_at: job.started_at,
        ended_at: if status.is_terminal() { job.ended_at } else { None },
        source_id: Some(source_id),
    }
}

/// The team's `metrics`/`stats` in the ledger's shape (`mean_reward`, trial and infra-error
/// counts), keeping the originals. Empty or absent metrics are none: the old system's "metrics
/// cleared", which makes dedup resubmit the pair.
pub(crate) fn team_metrics(job: &TeamJob) -> Option<Value> {
    let metrics = job.metrics.as_ref().filter(|m| match m {
        Value::Null => false,
        Value::Object(map) => !map.is_empty(),
        Value::Array(items) => !items.is_empty(),
        _ => true,
    })?;
    let mean = metrics
        .pointer("/0/mean")
        .or_else(|| metrics.get("mean"))
        .or_else(|| metrics.get("mean_reward"))
        .or_else(|| metrics.get("accuracy"))
        .and_then(Value::as_f64);
    // The team's score through the same range check as Harbor's: 1e308 or −7 is no score.
    let (mean, invalid_score) = crate::verify::results::split_score(mean);
    let stats = job.stats.clone().unwrap_or(Value::Null);
    let n_trials = job.n_trials.or_else(|| stats.get("n_trials").and_then(Value::as_i64)).unwrap_or(0);
    let mut out = json!({
        "mean_reward": mean,
        "n_trials": n_trials,
        "n_errors": stats.get("n_errors").and_then(Value::as_i64).unwrap_or(0),
        "n_infra_errors": stats.get("n_infra_errors").and_then(Value::as_i64).unwrap_or(0),
        "team_metrics": metrics,
    });
    if let Some(why) = invalid_score {
        out["invalid_score"] = why.into();
    }
    if let Some(breakdown) = stats.get("infra_errors").or_else(|| stats.get("infra_error_breakdown")) {
        out["infra_errors"] = breakdown.clone();
    }
    Some(out)
}

/// Applies the plan: families first (an attempt's family is resolved at insert), then the
/// catalogue, then the attempts.
pub fn apply(
    ledger: &dyn Ledger,
    source: &str,
    history: &TeamHistory,
    stale: Staleness,
) -> Result<ImportReport, TeamError> {
    let families: HashMap<String, String> = ledger.families()?.into_iter().collect();
    let mut report = ImportReport { source: source.to_string(), jobs_read: history.jobs.len(), ..Default::default() };
    // Families first, so the active-pair check below sees the final families.
    for (benchmark, family) in families_of(history) {
        if families.get(&benchmark) != Some(&family) {
            ledger.set_family(&benchmark, &family)?;
            report.families_set += 1;
        }
    }
    report.models_added = ledger.add_models(&catalogue_of(history))?;
    let families: HashMap<String, String> = ledger.families()?.into_iter().collect();
    let family_of = |b: &str| families.get(b).cloned().unwrap_or_else(|| b.to_string());
    let imported = ledger.imported(source)?;
    let by_id: HashMap<AttemptId, &str> = imported.iter().map(|s| (s.id, s.source_id.as_str())).collect();
    let active: HashMap<(String, String), Option<String>> = ledger
        .active()?
        .into_iter()
        .map(|a| ((a.model, a.benchmark_family), by_id.get(&a.id).map(|s| s.to_string())))
        .collect();
    let plan = plan_import(history, source, &imported, &active, &family_of, ledger.location(), now(), stale);
    tracing::info!("planned: {} new, {} updated, {} unchanged", plan.new.len(), plan.updates.len(), plan.unchanged);
    // Updates first: a row leaving the active state frees its pair for a new one.
    let (leaving, entering): (Vec<_>, Vec<_>) = plan.updates.into_iter().partition(|(_, row)| !row.status.is_active());
    report.attempts_updated += ledger.update_imported(&leaving)?;
    report.attempts_new = ledger.import_attempts(&plan.new)?;
    report.attempts_updated += ledger.update_imported(&entering)?;
    report.unchanged = plan.unchanged;
    report.skipped_unknown = plan.skipped_unknown;
    report.skipped_own = plan.skipped_own;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(hours_ago: i64) -> Timestamp {
        now() - Duration::hours(hours_ago)
    }

    fn model(id: &str, name: &str, base: Option<&str>, dup: Option<&str>) -> TeamModel {
        TeamModel {
            id: id.into(),
            name: name.into(),
            base_model_id: base.map(Into::into),
            duplicate_of: dup.map(Into::into),
            created_by: None,
        }
    }

    fn job(id: &str, model: &str, bench: &str, status: &str, hours_ago: i64) -> TeamJob {
        TeamJob {
            id: id.into(),
            job_name: Some(format!("run-{id}")),
            username: Some("alice".into()),
            job_status: Some(status.into()),
            submitted_at: Some(at(hours_ago)),
            started_at: (status != "Pending").then(|| at(hours_ago)),
            ended_at: None,
            created_at: Some(at(hours_ago)),
            slurm_job_id: Some("1007".into()),
            config: Some(json!({"agent": "terminus-2", "timeout_multiplier": 2.0})),
            metrics: (status == "Finished").then(|| json!([{"mean": 0.5}])),
            stats: Some(json!({"n_infra_errors": 3})),
            model_id: Some(model.into()),
            benchmark_id: Some(bench.into()),
            n_trials: Some(89),
        }
    }

    fn history(jobs: Vec<TeamJob>) -> TeamHistory {
        TeamHistory {
            models: vec![
                model("m1", "Qwen/Qwen3-32B", None, None),
                model("m2", "org/sft-run", Some("m1"), None),
                model("m3", "org/sft-run-copy", None, Some("m2")),
            ],
            benchmarks: vec![
                TeamBenchmark { id: "b1".into(), name: "dev_set_v2".into(), duplicate_of: None },
                TeamBenchmark { id: "b2".into(), name: "dev_set_v2_2.0x".into(), duplicate_of: Some("b1".into()) },
            ],
            jobs,
            watermark: None,
        }
    }

    fn family(b: &str) -> String {
        if b == "dev_set_v2_2.0x" { "dev_set_v2".into() } else { b.into() }
    }

    #[test]
    fn catalogue_families_and_canonical_models() {
        let h = history(vec![job("j1", "m3", "b2", "Finished", 5)]);
        let plan = plan_import(&h, "src", &[], &HashMap::new(), &family, "own", now(), Staleness::default());
        assert_eq!(
            catalogue_of(&h),
            [("Qwen/Qwen3-32B".to_string(), None), ("org/sft-run".to_string(), Some("Qwen/Qwen3-32B".to_string()))]
        );
        assert_eq!(families_of(&h), [("dev_set_v2_2.0x".to_string(), "dev_set_v2".to_string())]);
        let row = &plan.new[0];
        assert_eq!(
            (row.model.as_str(), row.benchmark.as_str(), row.status),
            ("org/sft-run", "dev_set_v2_2.0x", AttemptStatus::Finished)
        );
        let metrics = row.metrics.as_ref().unwrap();
        assert_eq!((metrics["mean_reward"].as_f64(), metrics["n_infra_errors"].as_i64()), (Some(0.5), Some(3)));
        assert_eq!(row.config["timeout_multiplier"], json!(2.0));
        assert_eq!(row.source_id.as_deref(), Some("src#j1"));
    }

    #[test]
    fn active_rows_stay_active_only_when_fresh_newest_and_free() {
        let h = history(vec![
            job("old", "m1", "b1", "Started", 30),   // stale by the old system's 24 h
            job("new", "m1", "b1", "Pending", 1),    // the pair's newest: stays active
            job("older", "m1", "b1", "Pending", 2),  // superseded
            job("mine", "m2", "b1", "Started", 1),   // the pair is active in the ledger already
            job("empty", "m2", "b2", "Finished", 1), // metrics cleared → no metrics
        ]);
        let mut h = h;
        h.jobs[4].metrics = Some(json!({}));
        let active = HashMap::from([(("org/sft-run".to_string(), "dev_set_v2".to_string()), None)]);
        let plan = plan_import(&h, "src", &[], &active, &family, "own", now(), Staleness::default());
        let status: HashMap<&str, AttemptStatus> =
            plan.new.iter().map(|r| (r.run_tag.trim_start_matches("run-"), r.status)).collect();
        assert_eq!(status["old"], AttemptStatus::Cancelled);
        assert_eq!(status["new"], AttemptStatus::Pending);
        assert_eq!(status["older"], AttemptStatus::Cancelled);
        assert_eq!(status["mine"], AttemptStatus::Cancelled);
        assert_eq!(status["empty"], AttemptStatus::Finished);
        assert!(plan.new.iter().find(|r| r.run_tag == "run-empty").unwrap().metrics.is_none());
    }

    #[test]
    fn reimport_writes_only_changes_and_skips_own_mirrored_rows() {
        let mut h = history(vec![job("j1", "m1", "b1", "Finished", 5), job("j2", "m1", "b2", "Failed", 4)]);
        let mut mirrored = job("j3", "m1", "b1", "Finished", 3);
        mirrored.config = Some(json!({"submitter": {"ledger": "own", "attempt": 4}}));
        h.jobs.push(mirrored);
        let imported = vec![
            ImportedState {
                id: AttemptId(1),
                source_id: "src#j1".into(),
                status: AttemptStatus::Finished,
                has_metrics: true,
                slurm_job_id: Some("1007".into()),
            },
            ImportedState {
                id: AttemptId(2),
                source_id: "src#j2".into(),
                status: AttemptStatus::Started,
                has_metrics: false,
                slurm_job_id: Some("1007".into()),
            },
        ];
        let plan = plan_import(&h, "src", &imported, &HashMap::new(), &family, "own", now(), Staleness::default());
        assert_eq!((plan.new.len(), plan.unchanged, plan.skipped_own), (0, 1, 1));
        assert_eq!(plan.updates.len(), 1);
        assert_eq!((plan.updates[0].0, plan.updates[0].1.status), (AttemptId(2), AttemptStatus::Failed));
    }

    /// Issue 31: the team's rule — a Pending row is dead after 6 h (it blocked the pair 48 h), a
    /// Started one after 24 h — and a profile may change both.
    #[test]
    fn team_pending_rows_go_stale_after_6_hours_and_started_after_24() {
        // One row per pair (a newer active row of the pair would supersede the other).
        let pending =
            history(vec![job("queued7h", "m1", "b1", "Pending", 7), job("queued5h", "m2", "b1", "Pending", 5)]);
        let started = history(vec![job("ran23h", "m1", "b1", "Started", 23), job("ran25h", "m2", "b1", "Started", 25)]);
        let status = |stale: Staleness| -> HashMap<String, AttemptStatus> {
            [&pending, &started]
                .into_iter()
                .flat_map(|h| plan_import(h, "src", &[], &HashMap::new(), &family, "own", now(), stale).new)
                .map(|r| (r.run_tag.trim_start_matches("run-").to_string(), r.status))
                .collect()
        };
        let got = status(Staleness::default());
        assert_eq!(got["queued7h"], AttemptStatus::Cancelled);
        assert_eq!(got["queued5h"], AttemptStatus::Pending);
        assert_eq!(got["ran23h"], AttemptStatus::Started);
        assert_eq!(got["ran25h"], AttemptStatus::Cancelled);
        let got = status(Staleness::from_hours(8.0, 26.0));
        assert_eq!((got["queued7h"], got["ran25h"]), (AttemptStatus::Pending, AttemptStatus::Started));
    }
}
