//! GPU-hours per attempt and per result (issue 24; docs/submitter.md "GPU-hours"): pure code.
//! sync builds one [`AttemptGpu`] per ending attempt from payload's `gpu_time` (the run dir's
//! `status.json` for a per-leg job, the group dir's for a shared one), divided among the job's
//! legs by `launch_spec::shared::divide`, and Slurm's start and end; the ledger stores it as JSON
//! (migration 5); `results` and the report sum the records per score, benchmark and in total.
//! Queue wait is never GPU time: Slurm's start, not its submit time, begins the job's elapsed.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use launch_spec::shared::{GpuTime, LegGpuSeconds, divide};
use serde::Serialize;
use serde_json::{Value, json};

use crate::ledger::{AttemptId, GpuSecondsRow};

/// The phases of a record, in order (`results --json`'s `gpu_seconds_by_phase` keys).
pub(crate) const PHASES: [&str; 6] = ["prepare", "load", "serving", "idle", "teardown", "slurm_other"];

/// GPU-seconds by phase (keys of [`PHASES`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PhaseSeconds(pub BTreeMap<String, f64>);

impl PhaseSeconds {
    pub fn total(&self) -> f64 {
        self.0.values().sum()
    }

    pub fn hours(&self) -> f64 {
        self.total() / 3600.0
    }

    pub fn add(&mut self, other: &PhaseSeconds) {
        for (k, v) in &other.0 {
            *self.0.entry(k.clone()).or_default() += v;
        }
    }

    fn of_leg(leg: &LegGpuSeconds) -> Self {
        PhaseSeconds(leg.by_phase().iter().map(|(k, v)| (k.to_string(), round3(*v))).collect())
    }

    fn from_json(v: &Value) -> Option<Self> {
        let map = v.as_object()?;
        Some(PhaseSeconds(map.iter().filter_map(|(k, v)| Some((k.clone(), v.as_f64()?))).collect()))
    }
}

/// One attempt's GPU use, as the ledger stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptGpu {
    /// GPUs the job held.
    pub gpus: u32,
    /// The shared job when the job served several legs.
    pub shared: Option<SharedRef>,
    /// Whether the job's record was final (its outcome written). A leg of a shared job may end
    /// before the engine host does: its share is recorded from the host's heartbeat and
    /// recomputed by a later sync once the host's record is final.
    pub complete: bool,
    /// Slurm's start → end (or payload's last record while Slurm still ends the job).
    pub slurm_elapsed_s: Option<f64>,
    /// This attempt's share, in GPU-seconds.
    pub by_phase: PhaseSeconds,
}

impl AttemptGpu {
    pub fn to_json(&self) -> Value {
        json!({
            "gpus": self.gpus,
            "shared": self.shared.as_ref().map(|s| json!({ "group_tag": s.group_tag, "group_dir": s.group_dir, "legs": s.legs })),
            "complete": self.complete,
            "slurm_elapsed_s": self.slurm_elapsed_s.map(round3),
            "by_phase": self.by_phase.0,
        })
    }

    pub fn from_json(v: &Value) -> Option<Self> {
        Some(AttemptGpu {
            gpus: v.get("gpus")?.as_u64().and_then(|g| u32::try_from(g).ok())?,
            shared: v.get("shared").and_then(SharedRef::from_json),
            complete: v.get("complete").and_then(Value::as_bool).unwrap_or(true),
            slurm_elapsed_s: v.get("slurm_elapsed_s").and_then(Value::as_f64),
            by_phase: PhaseSeconds::from_json(v.get("by_phase")?)?,
        })
    }

    pub fn hours(&self) -> f64 {
        self.by_phase.hours()
    }
}

/// Which shared job an attempt's leg ran in (its config's `shared` object, written at launch).
#[derive(Debug, Clone, PartialEq)]
pub struct SharedRef {
    pub group_tag: String,
    pub group_dir: std::path::PathBuf,
    /// Every leg's run tag, in launch order.
    pub legs: Vec<String>,
}

impl SharedRef {
    pub fn from_json(v: &Value) -> Option<Self> {
        Some(SharedRef {
            group_tag: v.get("group_tag")?.as_str()?.to_string(),
            group_dir: v.get("group_dir")?.as_str()?.into(),
            legs: v.get("legs")?.as_array()?.iter().filter_map(|l| Some(l.as_str()?.to_string())).collect(),
        })
    }
}

/// The share of leg `own` of a job whose payload recorded `gpu` and whose legs are `legs` (a
/// per-leg job: `[own]`). `None` when `own` is not among the legs.
pub(crate) fn attempt_gpu(
    gpu: &GpuTime,
    own: &str,
    slurm_elapsed_s: Option<f64>,
    shared: Option<&SharedRef>,
    complete: bool,
) -> Option<AttemptGpu> {
    let legs = shared.map_or_else(|| vec![own.to_string()], |s| s.legs.clone());
    let share = divide(gpu, &legs, slurm_elapsed_s).into_iter().find(|l| l.run_tag == own)?;
    Some(AttemptGpu {
        gpus: gpu.gpus,
        shared: shared.cloned(),
        complete,
        slurm_elapsed_s,
        by_phase: PhaseSeconds::of_leg(&share),
    })
}

/// A job's elapsed time from its start to its end (`None` without a start, or when the end
/// would precede it). The caller takes both from Slurm (`slurm::JobInfo::ran`), the end from
/// payload's last record while Slurm still ends the job.
pub fn elapsed_s(start: Option<DateTime<Utc>>, end: Option<DateTime<Utc>>) -> Option<f64> {
    let s = (end? - start?).num_milliseconds() as f64 / 1000.0;
    (s >= 0.0).then_some(s)
}

/// A result's GPU use: its own attempt and the earlier attempts of its walltime chain (the same
/// run tag: a continuation resumes the run dir), summed.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ResultGpu {
    pub gpu_hours: f64,
    pub gpu_seconds_by_phase: PhaseSeconds,
    /// The attempts counted.
    pub attempts: Vec<i64>,
}

/// What every recorded attempt spent (finished, failed, cancelled: GPU time spent either way).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GpuTotals {
    pub gpu_hours: f64,
    pub by_benchmark: BTreeMap<String, f64>,
    pub by_model: BTreeMap<String, f64>,
    pub gpu_seconds_by_phase: PhaseSeconds,
    /// Attempts with a record.
    pub attempts: usize,
}

/// The GPU use of the result of attempt `id` (run tag `run_tag`): the records of that tag with
/// an id up to `id`; `None` when none of them has a record.
pub(crate) fn result_gpu(rows: &[GpuSecondsRow], id: AttemptId, run_tag: &str) -> Option<ResultGpu> {
    let mut out = ResultGpu::default();
    for row in rows.iter().filter(|r| r.run_tag == run_tag && r.id.0 <= id.0) {
        let Some(rec) = AttemptGpu::from_json(&row.record) else { continue };
        out.gpu_seconds_by_phase.add(&rec.by_phase);
        out.attempts.push(row.id.0);
    }
    if out.attempts.is_empty() {
        return None;
    }
    out.gpu_hours = round6(out.gpu_seconds_by_phase.hours());
    round_phases(&mut out.gpu_seconds_by_phase);
    Some(out)
}

/// Totals over every record.
pub fn totals(rows: &[GpuSecondsRow]) -> GpuTotals {
    let mut t = GpuTotals::default();
    for row in rows {
        let Some(rec) = AttemptGpu::from_json(&row.record) else { continue };
        let h = rec.hours();
        t.gpu_hours += h;
        *t.by_benchmark.entry(row.benchmark.clone()).or_default() += h;
        *t.by_model.entry(row.model.clone()).or_default() += h;
        t.gpu_seconds_by_phase.add(&rec.by_phase);
        t.attempts += 1;
    }
    t.gpu_hours = round6(t.gpu_hours);
    t.by_benchmark.values_mut().chain(t.by_model.values_mut()).for_each(|v| *v = round6(*v));
    round_phases(&mut t.gpu_seconds_by_phase);
    t
}

fn round_phases(p: &mut PhaseSeconds) {
    p.0.values_mut().for_each(|v| *v = round3(*v));
}

/// Hours to 6 decimals (3.6 ms): a short test job's hours are not rounded away.
fn round6(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::AttemptStatus;
    use launch_spec::shared::LegSpan;

    fn row(id: i64, bench: &str, tag: &str, rec: &AttemptGpu) -> GpuSecondsRow {
        GpuSecondsRow {
            id: AttemptId(id),
            model: "org/M-32B".into(),
            benchmark: bench.into(),
            run_tag: tag.into(),
            status: AttemptStatus::Finished,
            record: rec.to_json(),
        }
    }

    /// A per-leg job of 2 GPUs: 10 s prepare, 300 s load, 3600 s serving, 5 s teardown; Slurm ran
    /// it 3930 s (15 s of prelude): 2 × 3930 GPU-seconds, all of them the leg's.
    #[test]
    fn a_per_leg_attempt_gets_its_job_and_slurms_remainder() {
        let gpu = GpuTime {
            gpus: 2,
            prepare_s: 10.0,
            load_s: 300.0,
            serving_s: 3600.0,
            teardown_s: 5.0,
            legs: vec![LegSpan { run_tag: "a".into(), start_s: 310.0, end_s: 3910.0 }],
            ..GpuTime::default()
        };
        let rec = attempt_gpu(&gpu, "a", Some(3930.0), None, true).unwrap();
        assert_eq!(rec.by_phase.total(), 7860.0);
        assert_eq!(rec.by_phase.0["load"], 600.0);
        assert_eq!(rec.by_phase.0["slurm_other"], 30.0);
        assert_eq!(AttemptGpu::from_json(&rec.to_json()), Some(rec.clone()));
        // A shared job's leg gets its share; a tag that is no leg gets none.
        let shared = SharedRef { group_tag: "g".into(), group_dir: "/j/g".into(), legs: vec!["a".into(), "b".into()] };
        let b = attempt_gpu(&gpu, "b", Some(3930.0), Some(&shared), false).unwrap();
        assert_eq!((b.by_phase.0["load"], b.by_phase.0["serving"], b.by_phase.total()), (300.0, 0.0, 330.0));
        assert_eq!(AttemptGpu::from_json(&b.to_json()), Some(b.clone()));
        assert!(attempt_gpu(&gpu, "c", None, Some(&shared), true).is_none());
    }

    /// No start or an end before the start: unknown.
    #[test]
    fn elapsed_needs_both_ends_in_order() {
        let t = DateTime::from_timestamp(1_800_000_000, 0);
        let later = t.map(|t| t + chrono::Duration::milliseconds(68_500));
        assert_eq!(elapsed_s(t, later), Some(68.5));
        assert_eq!(elapsed_s(later, t), None);
        assert_eq!(elapsed_s(None, later), None);
    }

    /// A result counts its walltime chain (same run tag, up to its id); totals count every record.
    #[test]
    fn results_sum_the_chain_and_totals_everything() {
        let rec = |s: f64| AttemptGpu {
            gpus: 1,
            shared: None,
            complete: true,
            slurm_elapsed_s: None,
            by_phase: PhaseSeconds([("serving".to_string(), s), ("load".to_string(), 360.0)].into()),
        };
        let rows = [
            row(1, "tb2", "tb2__m", &rec(3600.0)), // walltime, continued by 3
            row(2, "swebench", "swe__m", &rec(7200.0)),
            row(3, "tb2", "tb2__m", &rec(1800.0)),   // finished
            row(4, "tb2", "tb2__m-a2", &rec(720.0)), // a re-evaluation (new tag)
        ];
        let r = result_gpu(&rows, AttemptId(3), "tb2__m").unwrap();
        assert_eq!(r.attempts, [1, 3]);
        assert_eq!(r.gpu_hours, 1.7);
        assert_eq!(r.gpu_seconds_by_phase.0["load"], 720.0);
        assert!(result_gpu(&rows, AttemptId(9), "none").is_none());
        let t = totals(&rows);
        assert_eq!((t.attempts, t.gpu_hours), (4, 4.1));
        assert_eq!(t.by_benchmark["tb2"], 2.0);
        assert_eq!(t.by_benchmark["swebench"], 2.1);
        assert_eq!(t.by_model["org/M-32B"], 4.1);
    }
}
