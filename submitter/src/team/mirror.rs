//! `--mirror`: publish this submitter's attempts into the team's `sandbox_jobs`, where the team's
//! dashboards and scoring scripts read them — the replaced system's lifecycle: a `Pending` row
//! before `sbatch` (job id `"pending"`, then the real one), `Started` when the job runs,
//! `Finished` with metrics and the infra-error counts (or `Failed`).
//!
//! Own rows only: a row is created with this submitter's username and a marker
//! (`config.submitter = {ledger, attempt}`) naming the ledger attempt it mirrors, and every update
//! is `WHERE username = <ours> AND` that marker — another user's row, even for the same model and
//! benchmark, is never touched (the old system's cross-user rule). The ledger stays the authority:
//! a mirror failure is reported and never stops a submission or a sync. `import` skips the rows
//! this ledger published.

use std::sync::Mutex;

use std::time::Duration;

use serde_json::{Value, json};
use tokio_postgres::types::{ToSql, Type};

use super::{TeamError, source_error};
use crate::ledger::{AttemptId, AttemptStatus, NewAttempt, PgConnection, PgParam, PgStatements};

/// How long one mirror write may take: the whole write (client side, and `statement_timeout`), and
/// the wait for a lock on the team's table (`lock_timeout`). From `team.timeout_s` and
/// `team.lock_timeout_s` (docs/ledger.md "Bounds").
#[derive(Debug, Clone, Copy)]
pub struct WriteBounds {
    pub statement: Duration,
    pub lock: Duration,
}

impl Default for WriteBounds {
    /// `team:`'s defaults, for a `--mirror` URL given without a profile's `team:`.
    fn default() -> Self {
        use crate::config::cluster::{DEFAULT_TEAM_LOCK_TIMEOUT_S, DEFAULT_TEAM_TIMEOUT_S};
        WriteBounds {
            statement: Duration::from_secs(DEFAULT_TEAM_TIMEOUT_S),
            lock: Duration::from_secs(DEFAULT_TEAM_LOCK_TIMEOUT_S),
        }
    }
}

impl WriteBounds {
    /// The bounds `team:` sets (`lock_timeout_s` no longer than `timeout_s`).
    pub fn of(settings: &crate::config::cluster::TeamSettings) -> WriteBounds {
        WriteBounds {
            statement: Duration::from_secs(settings.timeout_s),
            lock: Duration::from_secs(settings.lock_timeout_s.min(settings.timeout_s)),
        }
    }
}

pub struct Mirror {
    connection: Mutex<PgConnection>,
    bounds: WriteBounds,
    username: String,
    /// This ledger's location: with the attempt id, the marker of our rows.
    ledger: String,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mirror({})", self.location())
    }
}

/// The infra-error breakdown and counts the team's `stats` carries, from the ledger's metrics.
pub(crate) fn team_stats(metrics: &Value) -> Value {
    json!({
        "n_trials": metrics.get("n_trials").cloned().unwrap_or(Value::Null),
        "n_errors": metrics.get("n_errors").cloned().unwrap_or(Value::Null),
        "n_infra_errors": metrics.get("n_infra_errors").cloned().unwrap_or(json!(0)),
        "infra_errors": metrics.get("infra_errors").cloned().unwrap_or(json!({})),
        "errors_by_type": metrics.get("errors_by_type").cloned().unwrap_or(json!({})),
    })
}

/// The team's `metrics` (Harbor's `metrics` list: `[{"mean": …}]`) from the ledger's.
pub(crate) fn team_metrics(metrics: &Value) -> Value {
    json!([{ "mean": metrics.get("mean_reward").cloned().unwrap_or(Value::Null) }])
}

impl Mirror {
    pub fn connect(url: &str, username: &str, ledger: &str, bounds: WriteBounds) -> Result<Mirror, TeamError> {
        let connection = super::connect(url, bounds.statement)?;
        Ok(Mirror {
            connection: Mutex::new(connection),
            bounds,
            username: username.to_string(),
            ledger: ledger.to_string(),
        })
    }

    /// One write (`sql` with `params`) in a transaction of its own whose `lock_timeout` and
    /// `statement_timeout` are the mirror's bounds (`SET LOCAL`: a transaction-mode pooler hands
    /// the server connection on afterwards), the whole of it within the client-side bound: a lock
    /// held on `sandbox_jobs` costs a launch `lock_timeout`, not the lock's duration (issue 32
    /// item 10). Returns the rows changed.
    fn write(&self, operation: &'static str, sql: &str, params: &[PgParam<'_>]) -> Result<u64, TeamError> {
        let mut connection = self.lock();
        let WriteBounds { statement, lock } = self.bounds;
        super::bounded(&mut connection, operation, |client, redactor| {
            let fail = source_error(redactor, operation);
            let mut tx = client.transaction().map_err(&fail)?;
            tx.batch_execute(&format!(
                "SET LOCAL lock_timeout = {}; SET LOCAL statement_timeout = {}",
                lock.as_millis().max(1),
                statement.as_millis().max(1)
            ))
            .map_err(&fail)?;
            let changed = tx.execute_typed(sql, params).map_err(&fail)?;
            tx.commit().map_err(&fail)?;
            Ok(changed)
        })
    }

    pub fn location(&self) -> String {
        self.lock().location.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PgConnection> {
        self.connection.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The `Pending` row, written before `sbatch`. `Ok(false)` when the team database does not
    /// know the model or the benchmark (the row would be attributed to nothing): nothing written.
    pub fn pending(&self, attempt: AttemptId, new: &NewAttempt) -> Result<bool, TeamError> {
        let config = json!({
            "agent": new.config.get("agent").cloned().unwrap_or(Value::Null),
            "env": "daytona",
            "timeout_multiplier": new.config.get("timeout_multiplier").cloned().unwrap_or(json!(1.0)),
            "run_tag": new.run_tag,
            "submitter": {"ledger": self.ledger, "attempt": attempt.0, "cluster": new.cluster},
        });
        let inserted = self.write(
            "publish a Pending row",
            "INSERT INTO sandbox_jobs (job_name, username, job_status, submitted_at, slurm_job_id, config,
                                           model_id, benchmark_id, n_trials, n_rep_eval, package_version)
                 SELECT $1, $2, 'Pending', now(), 'pending', $3, m.id, b.id, 0, 0, 'unknown'
                 FROM (SELECT id FROM models WHERE name = $4 ORDER BY duplicate_of NULLS FIRST LIMIT 1) m,
                      (SELECT id FROM benchmarks WHERE name = $5 ORDER BY duplicate_of NULLS FIRST LIMIT 1) b",
            &[
                (&new.run_tag, Type::TEXT),
                (&self.username, Type::TEXT),
                (&config, Type::JSONB),
                (&new.model, Type::TEXT),
                (&new.benchmark, Type::TEXT),
            ],
        )?;
        Ok(inserted == 1)
    }

    /// `sbatch` answered: the real job id replaces `"pending"`.
    pub fn submitted(&self, attempt: AttemptId, slurm_job_id: &str) -> Result<u64, TeamError> {
        self.update(attempt, "publish the Slurm job id", "slurm_job_id = $3", &[(&slurm_job_id, Type::TEXT)])
    }

    /// A lifecycle move of the mirrored attempt. `started` → `Started`; `finished` → `Finished`
    /// with metrics and stats; `failed`/`cancelled` → `Failed`. Returns the rows changed (0 when
    /// the attempt was never mirrored).
    pub fn transition(&self, attempt: AttemptId, to: AttemptStatus, metrics: Option<&Value>) -> Result<u64, TeamError> {
        match to {
            AttemptStatus::Pending => Ok(0),
            AttemptStatus::Started => self.update(
                attempt,
                "publish Started",
                "job_status = 'Started', started_at = COALESCE(started_at, now())",
                &[],
            ),
            AttemptStatus::Finished => {
                let metrics = metrics.cloned().unwrap_or(Value::Null);
                let team = team_metrics(&metrics);
                let stats = team_stats(&metrics);
                let n_trials = metrics.get("n_trials").and_then(Value::as_i64).and_then(|n| i32::try_from(n).ok());
                self.update(
                    attempt,
                    "publish Finished",
                    "job_status = 'Finished', ended_at = now(), metrics = $3, stats = $4, n_trials = COALESCE($5, n_trials)",
                    &[(&team, Type::JSONB), (&stats, Type::JSONB), (&n_trials, Type::INT4)],
                )
            }
            AttemptStatus::Failed | AttemptStatus::Cancelled => {
                self.update(attempt, "publish Failed", "job_status = 'Failed', ended_at = now()", &[])
            }
        }
    }

    /// `UPDATE sandbox_jobs SET <set> WHERE <our row for attempt>`; `$1`/`$2` are the marker,
    /// `extra` binds `$3…`.
    fn update(
        &self,
        attempt: AttemptId,
        operation: &'static str,
        set: &str,
        extra: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<u64, TeamError> {
        let marker = json!({"submitter": {"ledger": self.ledger, "attempt": attempt.0}});
        let username = self.username.as_str();
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![(&username, Type::TEXT), (&marker, Type::JSONB)];
        params.extend_from_slice(extra);
        let sql = format!("UPDATE sandbox_jobs SET {set} WHERE username = $1 AND config @> $2");
        self.write(operation, &sql, &params)
    }
}
