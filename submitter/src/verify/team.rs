//! The team view (`submitter status --all-clusters` and the report's team section): every
//! cluster's attempts on the shared ledger in one place, with the verdicts this submitter can give,
//! the last results and the charts' data (docs/verification.md, "The team view").
//!
//! This cluster's attempts get `status`'s verdict ([`super::status::collect`]: ledger × Slurm ×
//! heartbeat). Another cluster's cannot — its Slurm answers only there — so they show the ledger's
//! last known state, marked remote; when their run dir happens to be readable from here (a shared
//! file system), payload's phase, trial count and heartbeat history are shown too.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use chrono::{DateTime, Utc};
use launch_spec::records::RunStatus;

use super::charts::{self, GpuBasis, GpuUse, Reading};
use super::human_duration;
use super::results::{self, short_name};
use super::status::{self, Collect};
use super::verdict::{StatusRow, VerdictKind};
use crate::gpuhours::AttemptGpu;
use crate::ledger::{Attempt, AttemptStatus, Heartbeat, Ledger, LedgerError};
use crate::observe::{SyncError, belongs_to, run_dir_of};
use crate::slurm::Slurm;

/// How many finished results the view lists.
pub(crate) const RECENT_RESULTS: usize = 10;

/// The most points a chart draws (and `--json` carries) per series.
pub(crate) const CHART_POINTS: usize = 60;

/// One attempt of any cluster.
#[derive(Debug, Clone)]
pub struct TeamJob {
    pub cluster: String,
    pub attempt: i64,
    pub model: String,
    pub benchmark: String,
    pub run_tag: String,
    pub slurm_job_id: Option<String>,
    pub(crate) ledger_status: AttemptStatus,
    pub(crate) ledger_reason: String,
    pub updated_at: DateTime<Utc>,
    /// This cluster's job: `status`'s row with its verdict.
    pub local: Option<StatusRow>,
    /// Another cluster's job: what the ledger says of it.
    pub remote: Option<Remote>,
    /// payload's phase, `-` without a readable status.json of this attempt.
    pub phase: String,
    pub trials_finished: Option<u64>,
    pub trials_expected: Option<u64>,
    /// payload's heartbeats of this attempt, oldest first (empty when its run dir is not readable).
    pub history: Vec<Reading>,
}

/// Another cluster's attempt, as this submitter knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Remote {
    /// Its run dir could be read from here (a shared file system).
    pub run_dir_readable: bool,
    /// The ledger's last known state in words: `started 12m ago (ledger): …`.
    pub last_known: String,
}

/// One cluster's line of the view.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSummary {
    pub name: String,
    /// The cluster this submitter runs on (its verdicts are judged here).
    pub own: bool,
    /// Active attempts (pending or started).
    pub active: usize,
    /// This cluster's active attempts by verdict (own cluster only), in [`VERDICT_ORDER`].
    pub verdicts: Vec<(VerdictKind, usize)>,
    /// The freshest submitter heartbeat recorded for the cluster.
    pub submitter: Option<Heartbeat>,
}

/// One finished result.
#[derive(Debug, Clone, PartialEq)]
pub struct RecentResult {
    pub cluster: String,
    pub attempt: i64,
    pub model: String,
    pub benchmark: String,
    pub mean: Option<f64>,
    pub n_valid: u64,
    pub n_expected: Option<u64>,
    /// The completion audit passed.
    pub complete: bool,
    pub ended_at: Option<DateTime<Utc>>,
    pub gpu_seconds: Option<(f64, GpuBasis)>,
}

/// Everything the view shows.
#[derive(Debug, Clone)]
pub struct TeamView {
    pub(crate) own_cluster: String,
    pub clusters: Vec<ClusterSummary>,
    pub jobs: Vec<TeamJob>,
    pub results: Vec<RecentResult>,
    /// Every attempt's GPU time, for the bars per cluster and per benchmark.
    pub gpu: Vec<GpuUse>,
}

/// The order verdict counts are listed in.
pub(crate) const VERDICT_ORDER: [VerdictKind; 7] = [
    VerdictKind::Healthy,
    VerdictKind::Starting,
    VerdictKind::Stalled,
    VerdictKind::Dead,
    VerdictKind::Misconfigured,
    VerdictKind::Finished,
    VerdictKind::Failed,
];

/// An attempt's GPU time — the one place the team view's GPU-hours come from: the ledger's
/// GPU-seconds record of the attempt (`ledger`: what `sync` stored, for any cluster's attempt),
/// else payload's `gpu_time` record in `status.json` (its phases × the GPUs held), else the GPUs
/// payload detected × the time the ledger says the job ran (started → ended, or `now` while it
/// runs). `status` must be this attempt's record ([`status_of`]). `None` when none is known
/// (another cluster's run dir before its sync recorded it, a job that never started).
pub(crate) fn gpu_seconds_of(
    attempt: &Attempt,
    ledger: Option<&AttemptGpu>,
    status: Option<&RunStatus>,
    now: DateTime<Utc>,
) -> Option<(f64, GpuBasis)> {
    if let Some(record) = ledger {
        return Some((record.by_phase.total(), GpuBasis::Ledger));
    }
    if let Some(t) = status.and_then(|s| s.gpu_time.as_ref()).filter(|t| t.gpus > 0) {
        let seconds = t.prepare_s + t.load_s + t.serving_s + t.idle_s + t.teardown_s;
        return Some((seconds * f64::from(t.gpus), GpuBasis::Recorded));
    }
    let gpus = status.and_then(|s| s.gpu.as_ref()).map(|g| g.gpu_count).filter(|n| *n > 0)?;
    let started = attempt.started_at?;
    let ended = attempt.ended_at.unwrap_or(now);
    let seconds = (ended - started).num_milliseconds().max(0) as f64 / 1000.0;
    Some((seconds * f64::from(gpus), GpuBasis::Estimated))
}

/// This attempt's `status.json`, when its run dir is readable here and the record names its job
/// (a resubmission reuses the run dir).
pub(crate) fn status_of(attempt: &Attempt) -> Option<RunStatus> {
    let dir = run_dir_of(attempt)?;
    launch_spec::rundir::read_status(&dir).into_status().filter(|s| belongs_to(s, attempt))
}

/// Every attempt in the ledger: the latest of each pair and, for pairs with more, all of them.
pub(crate) fn all_attempts(ledger: &dyn Ledger) -> Result<Vec<Attempt>, LedgerError> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for pair in ledger.latest_per_pair()? {
        let attempts = if pair.total_attempts <= 1 {
            vec![pair.latest]
        } else {
            ledger.attempts_for(&pair.model, &pair.family)?
        };
        out.extend(attempts.into_iter().filter(|a| seen.insert(a.id)));
    }
    for a in ledger.active()? {
        if seen.insert(a.id) {
            out.push(a);
        }
    }
    Ok(out)
}

/// The view: this cluster's attempts through `status` (`opts` as for [`status::collect`]), every
/// other cluster's active attempts (and those that ended within `opts.ended_within_h`) from the
/// ledger, the latest [`RECENT_RESULTS`] finished results and every attempt's GPU time.
pub fn collect(ledger: &dyn Ledger, slurm: &dyn Slurm, opts: &Collect) -> Result<TeamView, SyncError> {
    let own = status::collect(ledger, slurm, opts)?;
    let all = all_attempts(ledger)?;
    let by_id: BTreeMap<i64, &Attempt> = all.iter().map(|a| (a.id.0, a)).collect();
    let mut jobs: Vec<TeamJob> = own.into_iter().map(|row| local_job(row, &by_id, opts.now)).collect();
    let cutoff = opts.ended_within_h.map(|h| opts.now - chrono::Duration::hours(h as i64));
    let latest: HashSet<i64> = ledger.latest_per_pair()?.into_iter().map(|p| p.latest.id.0).collect();
    for a in all.iter().filter(|a| a.cluster != opts.cluster) {
        let recent_end = a.status.is_terminal()
            && latest.contains(&a.id.0)
            && cutoff.is_some_and(|c| a.ended_at.is_some_and(|t| t >= c));
        if a.status.is_active() || recent_end {
            jobs.push(remote_job(a, opts.now));
        }
    }
    jobs.sort_by(|a, b| {
        (a.cluster != opts.cluster, &a.cluster, !a.ledger_status.is_active(), a.attempt).cmp(&(
            b.cluster != opts.cluster,
            &b.cluster,
            !b.ledger_status.is_active(),
            b.attempt,
        ))
    });

    let recorded: BTreeMap<i64, AttemptGpu> = ledger
        .gpu_seconds()?
        .into_iter()
        .filter_map(|row| Some((row.id.0, AttemptGpu::from_json(&row.record)?)))
        .collect();
    // The run dir is read only for attempts the ledger has no record of.
    let statuses: BTreeMap<i64, RunStatus> =
        all.iter().filter(|a| !recorded.contains_key(&a.id.0)).filter_map(|a| Some((a.id.0, status_of(a)?))).collect();
    let gpu_of = |a: &Attempt| gpu_seconds_of(a, recorded.get(&a.id.0), statuses.get(&a.id.0), opts.now);
    let gpu: Vec<GpuUse> = all
        .iter()
        .filter(|a| a.started_at.is_some())
        .map(|a| GpuUse { cluster: a.cluster.clone(), benchmark: short_name(&a.benchmark), gpu_seconds: gpu_of(a) })
        .collect();

    let mut finished: Vec<&Attempt> = all.iter().filter(|a| a.status == AttemptStatus::Finished).collect();
    finished.sort_by(|a, b| b.ended_at.cmp(&a.ended_at).then(b.id.0.cmp(&a.id.0)));
    let results = finished
        .into_iter()
        .take(RECENT_RESULTS)
        .map(|a| {
            let summary = a.metrics.as_ref().filter(|m| !m.is_null()).map(results::summary_from_metrics);
            let audit = summary.as_ref().map(|s| results::audit_of(s, opts.settings));
            RecentResult {
                cluster: a.cluster.clone(),
                attempt: a.id.0,
                model: a.model.clone(),
                benchmark: a.benchmark.clone(),
                mean: summary.as_ref().and_then(|s| s.mean_reward),
                n_valid: summary.as_ref().map_or(0, |s| s.n_valid),
                n_expected: audit.as_ref().and_then(|a| a.expected),
                complete: audit.as_ref().is_some_and(|a| a.complete),
                ended_at: a.ended_at,
                gpu_seconds: gpu_of(a),
            }
        })
        .collect::<Vec<_>>();

    let clusters = summarise(opts.cluster, &jobs, &results, &ledger.heartbeats()?);
    Ok(TeamView { own_cluster: opts.cluster.to_string(), clusters, jobs, results, gpu })
}

fn local_job(row: StatusRow, by_id: &BTreeMap<i64, &Attempt>, now: DateTime<Utc>) -> TeamJob {
    let attempt = by_id.get(&row.attempt).copied();
    let status = attempt.and_then(status_of);
    let history = match (&row.run_dir, &status) {
        (Some(dir), Some(s)) => charts::readings(&launch_spec::rundir::heartbeat_history(Path::new(dir), Some(s))),
        _ => Vec::new(),
    };
    TeamJob {
        cluster: row.cluster.clone(),
        attempt: row.attempt,
        model: row.model.clone(),
        benchmark: row.benchmark.clone(),
        run_tag: row.run_tag.clone(),
        slurm_job_id: row.slurm_job_id.clone(),
        ledger_status: row.ledger_status,
        ledger_reason: row.ledger_reason.clone(),
        updated_at: attempt.map_or(now, |a| a.updated_at),
        remote: None,
        phase: row.phase.clone(),
        trials_finished: row.verdict.trials_finished,
        trials_expected: row.verdict.trials_expected,
        history,
        local: Some(row),
    }
}

fn remote_job(a: &Attempt, now: DateTime<Utc>) -> TeamJob {
    let dir = run_dir_of(a).filter(|d| d.is_dir());
    let status = dir.as_ref().and_then(|_| status_of(a));
    let history = match (&dir, &status) {
        (Some(d), Some(s)) => charts::readings(&launch_spec::rundir::heartbeat_history(d, Some(s))),
        _ => Vec::new(),
    };
    let age = human_duration((now - a.updated_at).num_seconds().max(0));
    let reason = if a.reason.is_empty() { String::new() } else { format!(": {}", a.reason) };
    TeamJob {
        cluster: a.cluster.clone(),
        attempt: a.id.0,
        model: a.model.clone(),
        benchmark: a.benchmark.clone(),
        run_tag: a.run_tag.clone(),
        slurm_job_id: a.slurm_job_id.clone(),
        ledger_status: a.status,
        ledger_reason: a.reason.clone(),
        updated_at: a.updated_at,
        local: None,
        remote: Some(Remote {
            run_dir_readable: dir.is_some(),
            last_known: format!("{} {age} ago (ledger){reason}", a.status),
        }),
        phase: status.as_ref().map_or("-".into(), |s| format!("{:?}", s.phase).to_lowercase()),
        trials_finished: status.as_ref().and_then(|s| s.heartbeat.as_ref()).map(|h| h.trials_finished),
        trials_expected: dir.as_deref().and_then(launch_spec::rundir::expected_trials_in),
        history,
    }
}

/// One line per cluster: this one first, then the others by name; a cluster appears when it has
/// an attempt in the view, a recent result or a submitter heartbeat.
pub(crate) fn summarise(
    own: &str,
    jobs: &[TeamJob],
    results: &[RecentResult],
    beats: &[Heartbeat],
) -> Vec<ClusterSummary> {
    let mut names: Vec<String> = std::iter::once(own.to_string())
        .chain(jobs.iter().map(|j| j.cluster.clone()))
        .chain(results.iter().map(|r| r.cluster.clone()))
        .chain(beats.iter().map(|b| b.cluster.clone()))
        .collect();
    names.sort_by(|a, b| (a != own, a).cmp(&(b != own, b)));
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let mine: Vec<&TeamJob> =
                jobs.iter().filter(|j| j.cluster == name && j.ledger_status.is_active()).collect();
            let verdicts = VERDICT_ORDER
                .iter()
                .map(|k| {
                    (*k, mine.iter().filter(|j| j.local.as_ref().is_some_and(|r| r.verdict.verdict == *k)).count())
                })
                .filter(|(_, n)| *n > 0)
                .collect();
            let submitter = beats.iter().filter(|b| b.cluster == name).min_by_key(|b| b.age_s).cloned();
            ClusterSummary { own: name == own, active: mine.len(), verdicts, submitter, name }
        })
        .collect()
}

/// The verdict in words: `status`'s for this cluster's jobs, `remote` for another's.
pub(crate) fn verdict_word(job: &TeamJob) -> &'static str {
    job.local.as_ref().map_or("remote", |r| r.verdict.verdict.as_str())
}

/// Completions per minute over the history's last step, when there is one.
pub(crate) fn latest_rate(job: &TeamJob) -> Option<f64> {
    charts::completion_rate(&job.history).last().map(|p| p.1)
}

/// A submitter heartbeat in words: `submitter seen 40s ago` or `unattended: …`.
pub(crate) fn submitter_words(beat: Option<&Heartbeat>) -> String {
    match beat {
        None => "unattended: no submitter heartbeat recorded".into(),
        Some(b) if b.is_stale() => format!(
            "unattended: its submitter was last seen {} ago (bound {})",
            human_duration(b.age_s as i64),
            human_duration(b.stale_after_s as i64)
        ),
        Some(b) => format!("submitter seen {} ago", human_duration(b.age_s as i64)),
    }
}

fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        text.chars().take(width.saturating_sub(1)).collect::<String>() + "…"
    }
}

/// `status --all-clusters`: the clusters, every job, the last results.
pub(crate) fn render_text(view: &TeamView, now: DateTime<Utc>) -> String {
    let mut out = String::from("clusters\n");
    for c in &view.clusters {
        let verdicts = if c.own {
            let v: Vec<String> = c.verdicts.iter().map(|(k, n)| format!("{n} {k}")).collect();
            if v.is_empty() { String::new() } else { format!(" ({})", v.join(", ")) }
        } else {
            " (remote: the ledger's state)".into()
        };
        out += &format!(
            "  {:<12} {} active{verdicts}; {}{}\n",
            c.name,
            c.active,
            submitter_words(c.submitter.as_ref()),
            if c.own { " [this cluster]" } else { "" }
        );
    }
    out += &format!(
        "\n{:<10} {:<8} {:<30} {:<20} {:<9} {:<9} {:>9} {:>8}  {:<13} {}\n",
        "cluster", "job", "model", "benchmark", "slurm", "phase", "trials", "rate", "verdict", "why"
    );
    for j in &view.jobs {
        let trials = match (j.trials_finished, j.trials_expected) {
            (Some(f), Some(e)) => format!("{f}/{e}"),
            (Some(f), None) => f.to_string(),
            _ => "-".into(),
        };
        let rate = j
            .local
            .as_ref()
            .and_then(|r| r.verdict.rate.as_ref().map(|r| r.per_min))
            .or_else(|| latest_rate(j))
            .map_or("-".into(), |r| format!("{r:.1}/m"));
        let (slurm, why) = match (&j.local, &j.remote) {
            (Some(r), _) => (r.slurm.clone(), super::printable(&r.verdict.summary).into_owned()),
            (None, Some(remote)) => (
                "-".to_string(),
                format!(
                    "{}{}",
                    remote.last_known,
                    if remote.run_dir_readable { "" } else { "; run dir not readable here" }
                ),
            ),
            (None, None) => ("-".into(), String::new()),
        };
        out += &format!(
            "{:<10} {:<8} {:<30} {:<20} {:<9} {:<9} {:>9} {:>8}  {:<13} {}\n",
            truncate(&j.cluster, 10),
            j.slurm_job_id.as_deref().unwrap_or("-"),
            truncate(&j.model, 30),
            truncate(&short_name(&j.benchmark), 20),
            truncate(&slurm, 9),
            j.phase,
            trials,
            rate,
            verdict_word(j),
            super::printable(&why)
        );
    }
    out += &format!("{} attempt(s) on {} cluster(s)\n", view.jobs.len(), view.clusters.len());
    out += "\nlast results\n";
    if view.results.is_empty() {
        out += "  none yet\n";
    }
    for r in &view.results {
        out += &format!(
            "  {:<10} {:<30} {:<20} {:>6} {:>9}  {:<10} {:>12}  {}\n",
            truncate(&r.cluster, 10),
            truncate(&r.model, 30),
            truncate(&short_name(&r.benchmark), 20),
            r.mean.map_or("-".into(), |m| format!("{m:.3}")),
            format!("{}/{}", r.n_valid, r.n_expected.map_or("?".into(), |e| e.to_string())),
            if r.complete { "complete" } else { "incomplete" },
            r.gpu_seconds.map_or("- GPU-h".into(), |(s, b)| format!(
                "{:.1} GPU-h{}",
                s / 3600.0,
                if b == GpuBasis::Estimated { "~" } else { "" }
            )),
            r.ended_at.map_or("-".into(), |t| format!("{} ago", human_duration((now - t).num_seconds().max(0))))
        );
    }
    if view.results.iter().any(|r| r.gpu_seconds.is_some_and(|(_, b)| b == GpuBasis::Estimated)) {
        out += "  ~ estimated: the GPUs payload detected × the ledger's run time (no GPU-seconds record)\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::AttemptId;
    use launch_spec::records::GpuChoice;
    use launch_spec::shared::GpuTime;

    fn at(minutes: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_764_000_000 + minutes * 60, 0).unwrap()
    }

    fn attempt(cluster: &str, started: Option<i64>, ended: Option<i64>) -> Attempt {
        Attempt {
            id: AttemptId(1),
            model: "org/M-8B".into(),
            benchmark: "terminal_bench_2".into(),
            benchmark_family: "terminal_bench_2".into(),
            cluster: cluster.into(),
            username: "u".into(),
            run_tag: "t".into(),
            slurm_job_id: Some("7".into()),
            status: if ended.is_some() { AttemptStatus::Finished } else { AttemptStatus::Started },
            reason: String::new(),
            config: serde_json::json!({}),
            metrics: None,
            attempt: 1,
            submitted_at: at(0),
            started_at: started.map(at),
            ended_at: ended.map(at),
            updated_at: at(0),
            agent: "terminus-2".into(),
            source_id: None,
        }
    }

    fn status(gpus: Option<u32>, gpu_time: Option<GpuTime>) -> RunStatus {
        let mut s = launch_spec::testkit::rundir::running_status("t", "7", at(0), at(0), Default::default(), at(0));
        s.gpu = gpus.map(|n| GpuChoice {
            profile: "p".into(),
            gpu_name: None,
            gpu_count: n,
            gpu_memory_utilization: 0.9,
            source: "nvml".into(),
        });
        s.gpu_time = gpu_time;
        s
    }

    #[test]
    fn gpu_seconds_recorded_then_estimated_then_unknown() {
        let recorded = GpuTime {
            gpus: 4,
            prepare_s: 10.0,
            load_s: 50.0,
            serving_s: 3000.0,
            idle_s: 30.0,
            teardown_s: 10.0,
            legs: vec![],
        };
        let done = attempt("a", Some(0), Some(60));
        let ledger = AttemptGpu::from_json(&serde_json::json!({
            "gpus": 4, "complete": true, "by_phase": {"load": 400.0, "serving": 12000.0, "slurm_other": 100.0}
        }))
        .unwrap();
        assert_eq!(
            gpu_seconds_of(&done, Some(&ledger), Some(&status(Some(2), Some(recorded.clone()))), at(999)),
            Some((12500.0, GpuBasis::Ledger)),
            "the ledger's record (sync's, with Slurm's remainder) wins"
        );
        assert_eq!(
            gpu_seconds_of(&done, None, Some(&status(Some(2), Some(recorded))), at(999)),
            Some((4.0 * 3100.0, GpuBasis::Recorded)),
            "payload's record wins over the estimate"
        );
        assert_eq!(
            gpu_seconds_of(&done, None, Some(&status(Some(2), None)), at(999)),
            Some((2.0 * 3600.0, GpuBasis::Estimated))
        );
        let running = attempt("a", Some(0), None);
        assert_eq!(
            gpu_seconds_of(&running, None, Some(&status(Some(8), None)), at(30)),
            Some((8.0 * 1800.0, GpuBasis::Estimated)),
            "a running job counts to now"
        );
        assert_eq!(gpu_seconds_of(&done, None, None, at(999)), None, "no record: unknown");
        assert_eq!(
            gpu_seconds_of(&attempt("a", None, None), None, Some(&status(Some(2), None)), at(9)),
            None,
            "never started"
        );
    }

    #[test]
    fn clusters_summarised_own_first_with_verdicts_and_heartbeats() {
        let job = |cluster: &str, status: AttemptStatus| TeamJob {
            cluster: cluster.into(),
            attempt: 1,
            model: "m".into(),
            benchmark: "b".into(),
            run_tag: "t".into(),
            slurm_job_id: None,
            ledger_status: status,
            ledger_reason: String::new(),
            updated_at: at(0),
            local: None,
            remote: None,
            phase: "-".into(),
            trials_finished: None,
            trials_expected: None,
            history: Vec::new(),
        };
        let beat = |cluster: &str, age_s: u64| Heartbeat {
            cluster: cluster.into(),
            submitter: "s".into(),
            refreshed_at: at(0),
            stale_after_s: 600,
            age_s,
        };
        let jobs = [
            job("vista", AttemptStatus::Started),
            job("vista", AttemptStatus::Pending),
            job("vista", AttemptStatus::Finished),
            job("leonardo", AttemptStatus::Started),
        ];
        let beats = [beat("vista", 900), beat("vista", 30), beat("jupiter", 5)];
        let s = summarise("leonardo", &jobs, &[], &beats);
        let names: Vec<(&str, bool, usize)> = s.iter().map(|c| (c.name.as_str(), c.own, c.active)).collect();
        assert_eq!(names, [("leonardo", true, 1), ("jupiter", false, 0), ("vista", false, 2)]);
        assert_eq!(s[2].submitter.as_ref().map(|b| b.age_s), Some(30), "the freshest heartbeat");
        assert!(s[0].submitter.is_none());
        assert!(submitter_words(s[0].submitter.as_ref()).starts_with("unattended"));
        assert_eq!(
            submitter_words(Some(&beat("x", 900))),
            "unattended: its submitter was last seen 15m ago (bound 10m)"
        );
    }
}
