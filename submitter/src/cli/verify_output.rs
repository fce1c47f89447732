//! The JSON documents of `check`, `status` and `results` (docs/design.md §11): output types built
//! from the verification library's structs, so that a change to those is a compile error here
//! rather than a silent change of the contract. Field order is the documents' order.

use std::collections::BTreeMap;
use std::path::Path;

use crate::stats::{Bootstrap, IntervalBasis, Standing};
use crate::verify::charts;
use crate::verify::check::{Facts, RunCheck, TrialScan};
use crate::verify::compare;
use crate::verify::results::{Audit, BenchKind, BenchmarkRanking, Cell, Matrix, Provenance};
use crate::verify::rules::RunState;
use crate::verify::team::{self, ClusterSummary, RecentResult, TeamJob, TeamView};
use crate::verify::verdict::{JobVerdict, Rate, StatusRow};
use crate::verify::{Finding, Level};
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::queueing::ContinuationOutput;

/// `check`: the worst verdict over the run dirs, and each run dir's checks.
#[derive(Serialize)]
pub(crate) struct CheckOutput<'a> {
    /// `ok`, `warn` or `fail`: the worst of the runs' verdicts.
    verdict: &'static str,
    runs: Vec<RunCheckOutput<'a>>,
}

impl<'a> CheckOutput<'a> {
    pub(crate) fn new(checks: &'a [RunCheck]) -> Self {
        let worst = checks.iter().map(|c| c.verdict).max().unwrap_or(Level::Ok);
        CheckOutput { verdict: worst.as_str(), runs: checks.iter().map(RunCheckOutput::from).collect() }
    }
}

#[derive(Serialize)]
struct RunCheckOutput<'a> {
    run_dir: &'a Path,
    run_tag: Option<&'a str>,
    /// The worst finding's level: `ok`, `warn` or `fail`.
    verdict: &'static str,
    /// What `status` calls the same evidence (`starting`, `healthy`, `stalled`, …).
    status_verdict: &'static str,
    /// `running`, `ended` or `unknown`: whether the job writing the run dir still runs.
    state: &'static str,
    findings: Vec<FindingOutput<'a>>,
    facts: FactsOutput<'a>,
}

impl<'a> From<&'a RunCheck> for RunCheckOutput<'a> {
    fn from(c: &'a RunCheck) -> Self {
        RunCheckOutput {
            run_dir: &c.run_dir,
            run_tag: c.run_tag.as_deref(),
            verdict: c.verdict.as_str(),
            status_verdict: c.status_verdict.as_str(),
            state: run_state(c.state),
            findings: c.findings.iter().map(FindingOutput::from).collect(),
            facts: FactsOutput::from(&c.facts),
        }
    }
}

fn run_state(state: RunState) -> &'static str {
    match state {
        RunState::Running => "running",
        RunState::Ended => "ended",
        RunState::Unknown => "unknown",
    }
}

/// One result of one check (docs/verification.md lists the ids).
#[derive(Serialize)]
struct FindingOutput<'a> {
    /// `tunnel`, `api_base`, `engine`, `trials`, `outcome`, `audit`.
    check: &'static str,
    /// Stable within the check, e.g. `engine.bad_requests`.
    id: &'static str,
    level: &'static str,
    summary: &'a str,
    /// The numbers, files and log lines behind it; left out when none.
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    evidence: &'a [String],
    /// What to do about it; left out when nothing is to be done.
    #[serde(skip_serializing_if = "Option::is_none")]
    action: Option<&'a str>,
    /// The `status` verdict it stands for when it is the most severe; left out when it only informs.
    #[serde(skip_serializing_if = "Option::is_none")]
    status_verdict: Option<&'static str>,
}

impl<'a> From<&'a Finding> for FindingOutput<'a> {
    fn from(f: &'a Finding) -> Self {
        FindingOutput {
            check: f.check,
            id: f.id,
            level: f.level.as_str(),
            summary: &f.summary,
            evidence: &f.evidence,
            action: f.action.as_deref(),
            status_verdict: f.status.map(|v| v.as_str()),
        }
    }
}

/// The numbers behind the findings.
#[derive(Serialize)]
struct FactsOutput<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    engine_log: Option<EngineLogOutput<'a>>,
    completions_per_min: Option<f64>,
    trials: TrialsOutput<'a>,
    expected_trials: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    audit: Option<AuditOutput<'a>>,
}

impl<'a> From<&'a Facts> for FactsOutput<'a> {
    fn from(f: &'a Facts) -> Self {
        FactsOutput {
            engine_log: f.engine_log.as_ref().map(|log| EngineLogOutput {
                bytes: log.bytes,
                lines: log.lines,
                ok: log.ok,
                c4xx: log.c4xx,
                c5xx: log.c5xx,
                c400: log.c400,
                other: log.other,
                first_anchor: log.first_anchor,
                last_anchor: log.last_anchor,
                server_start: log.server_start,
                first_ok_anchor: log.first_ok_anchor,
                last_completion_anchor: log.last_completion_anchor,
                per_minute: &log.per_minute,
                example_400: log.example_400.as_deref(),
                example_5xx: log.example_5xx.as_deref(),
                context_error: log.context_error.as_deref(),
                fatal: log.fatal.as_deref(),
                tracebacks: log.tracebacks,
            }),
            completions_per_min: f.completions_per_min,
            trials: TrialsOutput::from(&f.trials),
            expected_trials: f.expected_trials,
            audit: f.audit.as_ref().map(AuditOutput::from),
        }
    }
}

/// One pass over the engine log (`vllm.log`). Anchors are seconds on the log's own clock
/// (docs/verification.md).
#[derive(Serialize)]
struct EngineLogOutput<'a> {
    bytes: u64,
    lines: u64,
    /// Chat completions answered 2xx, 4xx (400 among them), 5xx, and other classes.
    ok: u64,
    c4xx: u64,
    c5xx: u64,
    c400: u64,
    other: u64,
    first_anchor: Option<i64>,
    last_anchor: Option<i64>,
    server_start: Option<i64>,
    first_ok_anchor: Option<i64>,
    last_completion_anchor: Option<i64>,
    /// Completions per anchor minute: `[minute, [2xx, 4xx, 5xx]]`, in log order.
    per_minute: &'a [(i64, [u64; 3])],
    example_400: Option<&'a str>,
    example_5xx: Option<&'a str>,
    context_error: Option<&'a str>,
    fatal: Option<&'a str>,
    tracebacks: u64,
}

/// What the trial directories hold.
#[derive(Serialize)]
struct TrialsOutput<'a> {
    dirs: u64,
    done: u64,
    active: u64,
    queued: u64,
    unconstructed: u64,
    errored: u64,
    valid: u64,
    errors_by_type: &'a BTreeMap<String, u64>,
    instant_failures: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    instant_example: Option<&'a str>,
    instant_types: &'a BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_result_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_result_trial: Option<&'a str>,
    /// `api_base` of the trial configs: value → `[count, example trial]`.
    api_bases: &'a BTreeMap<String, (u64, String)>,
    model_info_warnings: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    model_info_example: Option<&'a str>,
}

impl<'a> From<&'a TrialScan> for TrialsOutput<'a> {
    fn from(t: &'a TrialScan) -> Self {
        TrialsOutput {
            dirs: t.dirs,
            done: t.done,
            active: t.active,
            queued: t.queued,
            unconstructed: t.unconstructed,
            errored: t.errored,
            valid: t.valid,
            errors_by_type: &t.errors_by_type,
            instant_failures: t.instant_failures,
            instant_example: t.instant_example.as_deref(),
            instant_types: &t.instant_types,
            last_result_at: t.last_result_at,
            last_result_trial: t.last_result_trial.as_deref(),
            api_bases: &t.api_bases,
            model_info_warnings: t.model_info_warnings,
            model_info_example: t.model_info_example.as_deref(),
        }
    }
}

/// The completion audit: enough valid trials, not too many errors.
#[derive(Serialize)]
struct AuditOutput<'a> {
    complete: bool,
    /// `complete` or `incomplete`.
    status: &'static str,
    valid: u64,
    expected: Option<u64>,
    /// Valid trials needed (⌈min_valid_share × expected⌉).
    needed: Option<u64>,
    errored: u64,
    error_share: f64,
    reasons: &'a [String],
}

impl<'a> From<&'a Audit> for AuditOutput<'a> {
    fn from(a: &'a Audit) -> Self {
        AuditOutput {
            complete: a.complete,
            status: a.status,
            valid: a.valid,
            expected: a.expected,
            needed: a.needed,
            errored: a.errored,
            error_share: a.error_share,
            reasons: &a.reasons,
        }
    }
}

/// `status --all-clusters`: every cluster on the shared ledger — its summary, its attempts (this
/// cluster's with `status`'s verdict, the others' with the ledger's last known state), the last
/// results and the GPU-hours per cluster and benchmark.
#[derive(Serialize)]
pub(crate) struct TeamOutput<'a> {
    /// The cluster this submitter runs on.
    own_cluster: &'a str,
    clusters: Vec<ClusterOutput<'a>>,
    jobs: Vec<TeamJobOutput<'a>>,
    results: Vec<RecentResultOutput<'a>>,
    gpu_hours: GpuHoursOutput,
}

impl<'a> TeamOutput<'a> {
    pub(crate) fn new(view: &'a TeamView) -> Self {
        let bars = |bars: Vec<charts::Bar>| bars.into_iter().map(BarOutput::from).collect();
        TeamOutput {
            own_cluster: &view.own_cluster,
            clusters: view.clusters.iter().map(ClusterOutput::from).collect(),
            jobs: view.jobs.iter().map(TeamJobOutput::from).collect(),
            results: view.results.iter().map(RecentResultOutput::from).collect(),
            gpu_hours: GpuHoursOutput {
                by_cluster: bars(charts::gpu_hours_by(&view.gpu, |u| &u.cluster)),
                by_benchmark: bars(charts::gpu_hours_by(&view.gpu, |u| &u.benchmark)),
            },
        }
    }
}

#[derive(Serialize)]
struct ClusterOutput<'a> {
    name: &'a str,
    /// This submitter's cluster: its verdicts are judged here.
    own: bool,
    /// Active attempts (pending or started).
    active: usize,
    /// This cluster's active attempts by verdict (own cluster only).
    verdicts: BTreeMap<&'static str, usize>,
    /// Seconds since the freshest submitter heartbeat of the cluster; absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    submitter_age_s: Option<u64>,
    /// The heartbeat is older than its bound: nobody reconciles that cluster's attempts.
    unattended: bool,
}

impl<'a> From<&'a ClusterSummary> for ClusterOutput<'a> {
    fn from(c: &'a ClusterSummary) -> Self {
        ClusterOutput {
            name: &c.name,
            own: c.own,
            active: c.active,
            verdicts: c.verdicts.iter().map(|(k, n)| (k.as_str(), *n)).collect(),
            submitter_age_s: c.submitter.as_ref().map(|b| b.age_s),
            unattended: c.submitter.as_ref().is_none_or(|b| b.is_stale()),
        }
    }
}

#[derive(Serialize)]
struct TeamJobOutput<'a> {
    cluster: &'a str,
    attempt: i64,
    model: &'a str,
    benchmark: &'a str,
    run_tag: &'a str,
    slurm_job_id: Option<&'a str>,
    /// The ledger's status: `pending`, `started`, `finished`, `failed`, `cancelled`.
    ledger_status: &'static str,
    ledger_reason: &'a str,
    /// When the ledger row last changed.
    ledger_updated_at: DateTime<Utc>,
    /// Another cluster's attempt: no verdict here (its Slurm answers only there).
    remote: bool,
    /// For a remote attempt: whether its run dir could be read from here.
    #[serde(skip_serializing_if = "Option::is_none")]
    run_dir_readable: Option<bool>,
    /// For a remote attempt: the ledger's last known state in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    last_known: Option<&'a str>,
    /// payload's phase, `-` without a readable status.json of this attempt.
    phase: &'a str,
    /// `status`'s verdict (this cluster's attempts only).
    #[serde(skip_serializing_if = "Option::is_none")]
    verdict: Option<JobVerdictOutput<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trials_finished: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trials_expected: Option<u64>,
    /// The charts' data from payload's heartbeats (at most 60 points each): completions per
    /// minute, and trials finished (a share of expected when known, else a count).
    completion_rate: Vec<(DateTime<Utc>, f64)>,
    trial_progress: Vec<(DateTime<Utc>, f64)>,
}

impl<'a> From<&'a TeamJob> for TeamJobOutput<'a> {
    fn from(j: &'a TeamJob) -> Self {
        TeamJobOutput {
            cluster: &j.cluster,
            attempt: j.attempt,
            model: &j.model,
            benchmark: &j.benchmark,
            run_tag: &j.run_tag,
            slurm_job_id: j.slurm_job_id.as_deref(),
            ledger_status: j.ledger_status.as_str(),
            ledger_reason: &j.ledger_reason,
            ledger_updated_at: j.updated_at,
            remote: j.remote.is_some(),
            run_dir_readable: j.remote.as_ref().map(|r| r.run_dir_readable),
            last_known: j.remote.as_ref().map(|r| r.last_known.as_str()),
            phase: &j.phase,
            verdict: j.local.as_ref().map(|r| JobVerdictOutput::from(&r.verdict)),
            trials_finished: j.trials_finished,
            trials_expected: j.trials_expected,
            completion_rate: charts::downsample(&charts::completion_rate(&j.history), team::CHART_POINTS),
            trial_progress: charts::downsample(
                &charts::trial_progress(&j.history, j.trials_expected),
                team::CHART_POINTS,
            ),
        }
    }
}

#[derive(Serialize)]
struct RecentResultOutput<'a> {
    cluster: &'a str,
    attempt: i64,
    model: &'a str,
    benchmark: &'a str,
    mean: Option<f64>,
    n_valid: u64,
    n_expected: Option<u64>,
    /// The completion audit passed.
    complete: bool,
    ended_at: Option<DateTime<Utc>>,
    /// Absent when not known from here.
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_hours: Option<f64>,
    /// `recorded` (payload's gpu_time) or `estimated` (GPUs × the ledger's run time).
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu_hours_basis: Option<&'static str>,
}

impl<'a> From<&'a RecentResult> for RecentResultOutput<'a> {
    fn from(r: &'a RecentResult) -> Self {
        RecentResultOutput {
            cluster: &r.cluster,
            attempt: r.attempt,
            model: &r.model,
            benchmark: &r.benchmark,
            mean: r.mean,
            n_valid: r.n_valid,
            n_expected: r.n_expected,
            complete: r.complete,
            ended_at: r.ended_at,
            gpu_hours: r.gpu_seconds.map(|(s, _)| s / 3600.0),
            gpu_hours_basis: r.gpu_seconds.map(|(_, b)| b.as_str()),
        }
    }
}

#[derive(Serialize)]
struct GpuHoursOutput {
    by_cluster: Vec<BarOutput>,
    by_benchmark: Vec<BarOutput>,
}

#[derive(Serialize)]
struct BarOutput {
    label: String,
    gpu_hours: f64,
    /// Attempts in the sum whose GPU time is estimated.
    estimated: usize,
    /// Attempts whose GPU time is unknown (not in the sum).
    unknown: usize,
}

impl From<charts::Bar> for BarOutput {
    fn from(b: charts::Bar) -> Self {
        BarOutput { label: b.label, gpu_hours: b.value, estimated: b.estimated, unknown: b.unknown }
    }
}

/// `status`: this cluster's active attempts (and those ended within `--hours`), each with its
/// verdict.
#[derive(Serialize)]
pub(crate) struct StatusOutput<'a> {
    jobs: Vec<StatusRowOutput<'a>>,
}

impl<'a> StatusOutput<'a> {
    pub(crate) fn new(rows: &'a [StatusRow]) -> Self {
        StatusOutput { jobs: rows.iter().map(StatusRowOutput::from).collect() }
    }
}

#[derive(Serialize)]
struct StatusRowOutput<'a> {
    attempt: i64,
    model: &'a str,
    benchmark: &'a str,
    cluster: &'a str,
    run_tag: &'a str,
    run_dir: Option<&'a str>,
    /// The ledger's status: `pending`, `started`, `finished`, `failed`, `cancelled`.
    ledger_status: &'static str,
    ledger_reason: &'a str,
    slurm_job_id: Option<&'a str>,
    /// Slurm's state (`PENDING`, `RUNNING`, …), `gone` when Slurm no longer lists the job, `-`
    /// without a job id.
    slurm: &'a str,
    /// payload's phase from `status.json`, `-` without one.
    phase: &'a str,
    verdict: JobVerdictOutput<'a>,
    /// What remediation did about the attempt (ledger records), and a hold on its pair.
    #[serde(skip_serializing_if = "Option::is_none")]
    remedy: Option<&'a str>,
    /// For a walltime continuation: the attempt it continues and its place in the chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    continues: Option<ContinuationOutput>,
}

impl<'a> From<&'a StatusRow> for StatusRowOutput<'a> {
    fn from(r: &'a StatusRow) -> Self {
        StatusRowOutput {
            attempt: r.attempt,
            model: &r.model,
            benchmark: &r.benchmark,
            cluster: &r.cluster,
            run_tag: &r.run_tag,
            run_dir: r.run_dir.as_deref(),
            ledger_status: r.ledger_status.as_str(),
            ledger_reason: &r.ledger_reason,
            slurm_job_id: r.slurm_job_id.as_deref(),
            slurm: &r.slurm,
            phase: &r.phase,
            verdict: JobVerdictOutput::from(&r.verdict),
            remedy: r.remedy.as_deref(),
            continues: r.continues.map(ContinuationOutput::from),
        }
    }
}

/// A job's verdict with the evidence.
#[derive(Serialize)]
struct JobVerdictOutput<'a> {
    /// `starting`, `healthy`, `stalled`, `dead`, `misconfigured`, `finished`, `failed`.
    verdict: &'static str,
    summary: &'a str,
    evidence: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    action: Option<&'a str>,
    /// Since when this verdict has held (as observed).
    since: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate: Option<RateOutput>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trials_finished: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trials_expected: Option<u64>,
}

impl<'a> From<&'a JobVerdict> for JobVerdictOutput<'a> {
    fn from(v: &'a JobVerdict) -> Self {
        JobVerdictOutput {
            verdict: v.verdict.as_str(),
            summary: &v.summary,
            evidence: &v.evidence,
            action: v.action.as_deref(),
            since: v.since,
            rate: v.rate.as_ref().map(RateOutput::from),
            trials_finished: v.trials_finished,
            trials_expected: v.trials_expected,
        }
    }
}

/// The completion rate over a window.
#[derive(Serialize)]
struct RateOutput {
    window_s: i64,
    completions: u64,
    ok: u64,
    c4xx: u64,
    c5xx: u64,
    per_min: f64,
    trials_finished: u64,
    /// Whether the window starts at an earlier heartbeat (else: cumulative since Harbor started).
    from_previous: bool,
}

impl From<&Rate> for RateOutput {
    fn from(r: &Rate) -> Self {
        RateOutput {
            window_s: r.window_s,
            completions: r.completions,
            ok: r.ok,
            c4xx: r.c4xx,
            c5xx: r.c5xx,
            per_min: r.per_min,
            trials_finished: r.trials_finished,
            from_previous: r.from_previous,
        }
    }
}

/// `results`: models × benchmarks, each cell the latest finished attempt's score.
#[derive(Serialize)]
pub(crate) struct ResultsOutput<'a> {
    /// In ranking order.
    models: &'a [String],
    benchmarks: &'a [String],
    /// By benchmark: `binary`, `partial_credit` or `other`.
    kinds: BTreeMap<&'a str, &'static str>,
    cells: Vec<CellOutput<'a>>,
    /// The earlier finished results of the pairs in `cells` (a re-evaluation keeps the one before
    /// it), oldest first, each with its provenance; never pooled into a cell.
    earlier: Vec<CellOutput<'a>>,
    /// Mean over swebench-100, tb2 and dev_set_v2, for models that have all three.
    id_mean: &'a BTreeMap<String, f64>,
    /// The ranked benchmark of the `rank` column, and each ranked model's rank on it (its
    /// standing's `rank` in `rankings`: models whose intervals overlap share one).
    rank_by: Option<&'a str>,
    ranks: &'a BTreeMap<String, usize>,
    /// Every ranked benchmark's ranking (docs/results.md "Ranking several models").
    rankings: Vec<RankingOutput<'a>>,
    /// What every attempt with a GPU-seconds record spent (finished or not): total, per
    /// benchmark, per model, by phase (docs/submitter.md "GPU-hours").
    gpu_hours: &'a crate::gpuhours::GpuTotals,
}

impl<'a> From<&'a Matrix> for ResultsOutput<'a> {
    fn from(m: &'a Matrix) -> Self {
        ResultsOutput {
            models: &m.models,
            benchmarks: &m.benchmarks,
            kinds: m.kinds.iter().map(|(benchmark, kind)| (benchmark.as_str(), bench_kind(*kind))).collect(),
            cells: m.cells.iter().map(CellOutput::from).collect(),
            earlier: m.earlier.iter().map(CellOutput::from).collect(),
            id_mean: &m.id_mean,
            rank_by: m.rank_by.as_deref(),
            ranks: &m.ranks,
            rankings: m.rankings.iter().map(RankingOutput::from).collect(),
            gpu_hours: &m.gpu_totals,
        }
    }
}

/// `compare` with three or more models (`kind: "compare.ranking"`): each ranked benchmark's ranking
/// over them.
#[derive(Serialize)]
pub(crate) struct RankingDocument<'a> {
    /// The models as named, in that order.
    models: &'a [String],
    /// `{seed, resamples}` of the bootstrap intervals.
    bootstrap: Bootstrap,
    confidence: f64,
    rankings: Vec<RankingOutput<'a>>,
    /// Per ranking, the named models with no score on its benchmark.
    unranked: Vec<UnrankedOutput<'a>>,
}

#[derive(Serialize)]
struct UnrankedOutput<'a> {
    benchmark: &'a str,
    models: &'a [String],
}

impl<'a> From<&'a compare::Ranking> for RankingDocument<'a> {
    fn from(r: &'a compare::Ranking) -> Self {
        RankingDocument {
            models: &r.models,
            bootstrap: r.bootstrap,
            confidence: crate::stats::CONFIDENCE,
            rankings: r.rankings.iter().map(RankingOutput::from).collect(),
            unranked: r.unranked.iter().map(|(benchmark, models)| UnrankedOutput { benchmark, models }).collect(),
        }
    }
}

/// One ranked benchmark's ranking: `standings` in ranking order.
#[derive(Serialize)]
pub(crate) struct RankingOutput<'a> {
    benchmark: &'a str,
    standings: Vec<StandingOutput<'a>>,
}

impl<'a> From<&'a BenchmarkRanking> for RankingOutput<'a> {
    fn from(r: &'a BenchmarkRanking) -> Self {
        RankingOutput { benchmark: &r.benchmark, standings: r.standings.iter().map(StandingOutput::from).collect() }
    }
}

/// A model's place in a ranking.
#[derive(Serialize)]
struct StandingOutput<'a> {
    model: &'a str,
    /// The "invalid as 0" mean of its per-trial facts, else the recorded mean.
    mean: f64,
    /// The 95% interval `{lower, upper}` it was ranked on; `null` for a mean only.
    interval: Option<IntervalOutput>,
    /// `bootstrap_over_tasks`, `normal_over_trials` or `mean_only`.
    interval_basis: &'static str,
    /// 1 + the number of models whose interval lies wholly above this one's.
    rank: usize,
    /// `rank`, with `=` appended when tied.
    rank_label: String,
    /// 1, 2, … in the ranking's order.
    position: usize,
    /// The models whose interval overlaps this one's.
    tied_with: &'a [String],
}

#[derive(Serialize)]
struct IntervalOutput {
    lower: f64,
    upper: f64,
}

impl<'a> From<&'a Standing> for StandingOutput<'a> {
    fn from(s: &'a Standing) -> Self {
        StandingOutput {
            model: &s.model,
            mean: s.mean,
            interval: s.interval.map(|i| IntervalOutput { lower: i.lower, upper: i.upper }),
            interval_basis: match s.basis {
                IntervalBasis::BootstrapOverTasks => "bootstrap_over_tasks",
                IntervalBasis::NormalOverTrials => "normal_over_trials",
                IntervalBasis::MeanOnly => "mean_only",
            },
            rank: s.rank,
            rank_label: s.rank_label(),
            position: s.position,
            tied_with: &s.tied_with,
        }
    }
}

fn bench_kind(kind: BenchKind) -> &'static str {
    match kind {
        BenchKind::Binary => "binary",
        BenchKind::PartialCredit => "partial_credit",
        BenchKind::Other => "other",
    }
}

/// One (model, benchmark) result.
#[derive(Serialize)]
struct CellOutput<'a> {
    model: &'a str,
    benchmark: &'a str,
    attempt_id: i64,
    run_tag: &'a str,
    run_dir: Option<&'a str>,
    cluster: &'a str,
    mean: Option<f64>,
    /// √(p(1−p)/n) over the trials; binary benchmarks only.
    stderr: Option<f64>,
    n_trials: u64,
    n_valid: u64,
    n_expected: Option<u64>,
    n_errors: u64,
    infra_errors: &'a BTreeMap<String, u64>,
    /// The completion audit failed: resume rather than accept.
    incomplete: bool,
    audit_reasons: &'a [String],
    ended_at: Option<DateTime<Utc>>,
    /// What it ran under.
    provenance: ProvenanceOutput<'a>,
    /// The pair's earlier results (`earlier`) that ran under other settings.
    other_settings: Vec<i64>,
    /// GPU-hours of this result: its attempt and the walltime continuations before it (`null`
    /// when none recorded GPU time), by phase in GPU-seconds, and the attempts counted.
    gpu_hours: Option<f64>,
    gpu_seconds_by_phase: Option<&'a crate::gpuhours::PhaseSeconds>,
    gpu_attempts: Option<&'a [i64]>,
    /// From the result's per-trial facts (docs/results.md): `harbor_version`, `estimates` (both
    /// means, labelled, with `clustered_se` and `interval`), `attempts_per_task`, `pass_at_k`;
    /// `null` without them.
    trials: Option<&'a crate::verify::results::TrialStatistics>,
}

/// What a result ran under; `null` where the attempt does not record it (older rows, imports).
#[derive(Serialize)]
struct ProvenanceOutput<'a> {
    agent: Option<&'a str>,
    /// `key=value`, as handed to Harbor.
    agent_kwargs: &'a [String],
    timeout_multiplier: Option<f64>,
    n_attempts: Option<u64>,
    harbor_config: Option<&'a str>,
    /// The task directory.
    dataset: Option<&'a str>,
    cluster: &'a str,
    /// The GPU profile payload matched (and the device name).
    gpu: Option<&'a str>,
    /// The commit the HF cache resolved, or the local path.
    model_revision: Option<&'a str>,
    /// As the job's own environment reported them at start.
    vllm_version: Option<&'a str>,
    harbor_version: Option<&'a str>,
    /// `sha1:<hex>` of the task dir's content as the job read it.
    dataset_digest: Option<&'a str>,
}

impl<'a> From<&'a Provenance> for ProvenanceOutput<'a> {
    fn from(p: &'a Provenance) -> Self {
        ProvenanceOutput {
            agent: p.agent.as_deref(),
            agent_kwargs: &p.agent_kwargs,
            timeout_multiplier: p.timeout_multiplier,
            n_attempts: p.n_attempts,
            harbor_config: p.harbor_config.as_deref(),
            dataset: p.dataset.as_deref(),
            cluster: &p.cluster,
            gpu: p.gpu.as_deref(),
            model_revision: p.model_revision.as_deref(),
            vllm_version: p.vllm_version.as_deref(),
            harbor_version: p.harbor_version.as_deref(),
            dataset_digest: p.dataset_digest.as_deref(),
        }
    }
}

impl<'a> From<&'a Cell> for CellOutput<'a> {
    fn from(c: &'a Cell) -> Self {
        CellOutput {
            model: &c.model,
            benchmark: &c.benchmark,
            attempt_id: c.attempt_id.0,
            run_tag: &c.run_tag,
            run_dir: c.run_dir.as_deref(),
            cluster: &c.cluster,
            mean: c.mean,
            stderr: c.stderr,
            n_trials: c.n_trials,
            n_valid: c.n_valid,
            n_expected: c.n_expected,
            n_errors: c.n_errors,
            infra_errors: &c.infra_errors,
            incomplete: c.incomplete,
            audit_reasons: &c.audit_reasons,
            ended_at: c.ended_at,
            provenance: ProvenanceOutput::from(&c.provenance),
            other_settings: c.other_settings.iter().map(|id| id.0).collect(),
            gpu_hours: c.gpu.as_ref().map(|g| g.gpu_hours),
            gpu_seconds_by_phase: c.gpu.as_ref().map(|g| &g.gpu_seconds_by_phase),
            gpu_attempts: c.gpu.as_ref().map(|g| g.attempts.as_slice()),
            trials: c.trials.as_ref(),
        }
    }
}
