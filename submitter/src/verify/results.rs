//! Scores: the summary of Harbor's `result.json` that sync folds into the ledger, the completion
//! audit, and the models × benchmarks matrix of `submitter results` and the report.
//!
//! Scoring rules (docs/results.md): each preset declares its benchmark's scoring
//! (`verify::scoring::Scoring`), gathered per benchmark family in [`Scorings`]. A binary
//! benchmark (reward 0 or 1 per trial) shows its mean with the standard error √(p(1−p)/n); a
//! partial-credit one, or one no preset declares, its mean only. The "ID mean" is over the
//! benchmarks declared `in_id_mean`; models are ranked on a benchmark declared `ranked`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;
use serde_json::{Value, json};

use launch_spec::rundir::harbor::{self, JobResult, JobStats};
use launch_spec::rundir::lenient::{Count, Forgiving};

use super::VerifySettings;
use super::scoring::{Scoring, ScoringKind};
use crate::ledger::{Attempt, AttemptId, AttemptStatus, Timestamp};
use crate::stats::{Contender, IntervalBasis, Standing};

/// Harbor's result.json, summarised.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ScoreSummary {
    /// Harbor's mean metric (errored trials count as 0), averaged over evals.
    pub mean_reward: Option<f64>,
    /// Finished trials (Harbor's `stats.n_completed_trials`): the mean's denominator.
    pub n_trials: u64,
    /// Trials the verifier ran on (Harbor's per-eval `n_trials`).
    pub(crate) n_verified: u64,
    /// Trials with an exception (Harbor's per-eval `n_errors`).
    pub n_errors: u64,
    /// Trials with a numeric reward.
    pub n_valid: u64,
    /// Harbor's `n_total_trials` (what it planned).
    pub n_total_trials: Option<u64>,
    /// n_tasks × n_attempts, the audit's denominator.
    pub n_expected: Option<u64>,
    pub errors_by_type: BTreeMap<String, u64>,
    /// The errors whose type is an infrastructure error (`INFRA_ERROR_TYPES`), by type.
    pub infra_errors: BTreeMap<String, u64>,
    pub n_infra_errors: u64,
    /// Reward value → number of trials.
    pub rewards: BTreeMap<String, u64>,
    /// Harbor wrote `finished_at`.
    pub(crate) harbor_finished: bool,
    /// Why the mean was refused ([`checked_score`]): it is then `None`, in no mean or ranking.
    pub invalid_score: Option<String>,
}

/// The range every benchmark's score lies in: Harbor's rewards, the mean of the trials' rewards,
/// and the team's recorded means are shares of tasks solved.
pub(crate) const SCORE_RANGE: std::ops::RangeInclusive<f64> = 0.0..=1.0;

/// A score as it may be recorded, or why not: outside [`SCORE_RANGE`] (a Harbor mean of 7.5, a team
/// row's 1e308 or −7) or not a number is refused. Every door a score comes in by (Harbor's
/// `result.json`, the team's `metrics`, the ledger's stored metrics) goes through this one check.
pub(crate) fn checked_score(mean: f64) -> Result<f64, String> {
    if SCORE_RANGE.contains(&mean) {
        Ok(mean)
    } else {
        Err(format!(
            "score {mean} is outside the benchmark's range [{}, {}]: recorded as invalid, in no mean or ranking",
            SCORE_RANGE.start(),
            SCORE_RANGE.end()
        ))
    }
}

/// [`checked_score`] for an optional mean: (the mean kept, why it was refused).
pub(crate) fn split_score(mean: Option<f64>) -> (Option<f64>, Option<String>) {
    match mean.map(checked_score) {
        None => (None, None),
        Some(Ok(mean)) => (Some(mean), None),
        Some(Err(why)) => (None, Some(why)),
    }
}

/// The completion audit: enough valid trials, not too many errors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Audit {
    pub complete: bool,
    /// `complete` or `incomplete`.
    pub status: &'static str,
    pub valid: u64,
    pub expected: Option<u64>,
    /// Valid trials needed (⌈min_valid_share × expected⌉).
    pub needed: Option<u64>,
    pub errored: u64,
    pub(crate) error_share: f64,
    pub reasons: Vec<String>,
}

/// Summarises a Harbor job `result.json`. `expected` = n_tasks × n_attempts when known.
pub(crate) fn summary_from_result(result: &JobResult, expected: Option<u64>) -> ScoreSummary {
    let mut s = ScoreSummary {
        n_total_trials: result.n_total_trials,
        harbor_finished: result.finished_at.is_some(),
        ..ScoreSummary::default()
    };
    let mut means = Vec::new();
    let stats = result.stats.as_ref();
    for Forgiving(eval) in stats.into_iter().flat_map(|s| s.evals.values()) {
        if let Some(mean) = eval.metrics.mean {
            means.push(mean);
        }
        s.n_verified += eval.n_trials.unwrap_or(0);
        s.n_errors += eval.n_errors.unwrap_or(0);
        for (kind, Count(n)) in &eval.exception_stats {
            *s.errors_by_type.entry(kind.clone()).or_default() += n;
        }
        for (value, Count(n)) in &eval.reward_stats.reward {
            *s.rewards.entry(value.clone()).or_default() += n;
            s.n_valid += n;
        }
    }
    let stat = |key: fn(&JobStats) -> Option<u64>| stats.and_then(key);
    // Pre-0.2x Harbor: top-level stats.n_trials / n_errors only.
    if s.n_verified == 0 && s.n_errors == 0 {
        s.n_verified = stat(|st| st.n_trials).unwrap_or(0);
        s.n_errors = stat(|st| st.n_errors).unwrap_or(0);
    }
    // Finished trials: Harbor's count, else at least the verified and the valid+errored ones.
    s.n_trials = stat(|st| st.n_completed_trials).unwrap_or_else(|| {
        stat(|st| st.n_trials).unwrap_or(s.n_verified).max(s.n_valid + s.n_errors).max(s.n_verified)
    });
    (s.mean_reward, s.invalid_score) =
        split_score((!means.is_empty()).then(|| means.iter().sum::<f64>() / means.len() as f64));
    for (kind, n) in &s.errors_by_type {
        if launch_spec::spec::INFRA_ERROR_TYPES.contains(&kind.as_str()) {
            s.infra_errors.insert(kind.clone(), *n);
            s.n_infra_errors += n;
        }
    }
    s.n_expected = expected.or(s.n_total_trials);
    s
}

/// The summary of a run dir's `result.json`; `None` without one holding `stats`. Read once, into the
/// typed partial model (nothing but counts kept), and that one read also gives `n_total_trials`.
pub fn score_summary(run_dir: &Path) -> Option<ScoreSummary> {
    let result: JobResult = super::read_record(&run_dir.join(harbor::RESULT_FILE))?;
    result.stats.as_ref()?;
    let expected = launch_spec::rundir::expected_trials_with(Some(&result), run_dir);
    Some(summary_from_result(&result, expected))
}

/// Valid trials ≥ `min_valid_share` × expected and errors ≤ `max_error_share` of the trials.
pub(crate) fn audit_of(summary: &ScoreSummary, settings: &VerifySettings) -> Audit {
    let expected = summary.n_expected;
    let needed = expected.map(|e| (e as f64 * settings.min_valid_share - 1e-9).ceil().max(0.0) as u64);
    let denominator = summary.n_trials.max(expected.unwrap_or(0)).max(1);
    let error_share = summary.n_errors as f64 / denominator as f64;
    let mut reasons = Vec::new();
    if let (Some(needed), Some(expected)) = (needed, expected)
        && summary.n_valid < needed
    {
        reasons.push(format!(
            "{} valid trials of {expected} expected, fewer than {}",
            summary.n_valid,
            super::percent(settings.min_valid_share)
        ));
    }
    if expected.is_none() && summary.n_trials == 0 {
        reasons.push("no trials".to_string());
    }
    if error_share > settings.max_error_share {
        reasons.push(format!(
            "{} errored trials ({}, more than {})",
            summary.n_errors,
            super::percent(error_share),
            super::percent(settings.max_error_share)
        ));
    }
    let complete = reasons.is_empty();
    Audit {
        complete,
        status: if complete { "complete" } else { "incomplete" },
        valid: summary.n_valid,
        expected,
        needed,
        errored: summary.n_errors,
        error_share,
        reasons,
    }
}

/// The ledger's `metrics` for a finished run: the summary plus its audit. Keeps the original keys
/// (`mean_reward`, `n_trials`, `n_errors`, `n_total_trials`, `errors_by_type`).
pub(crate) fn metrics_json(summary: &ScoreSummary, audit: &Audit) -> Value {
    json!({
        "mean_reward": summary.mean_reward,
        "n_trials": summary.n_trials,
        "n_verified": summary.n_verified,
        "n_errors": summary.n_errors,
        "n_valid": summary.n_valid,
        "n_total_trials": summary.n_total_trials,
        "n_expected": summary.n_expected,
        "errors_by_type": summary.errors_by_type,
        "infra_errors": summary.infra_errors,
        "n_infra_errors": summary.n_infra_errors,
        "rewards": summary.rewards,
        "harbor_finished": summary.harbor_finished,
        "audit": audit,
        "invalid_score": summary.invalid_score,
    })
}

// ---------------------------------------------------------------------------------------------
// The matrix

/// How a benchmark is scored, as the matrix shows it (in column order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BenchKind {
    /// Reward 0/1 per trial: mean ± standard error.
    Binary,
    /// Partial credit: mean only.
    PartialCredit,
    /// No preset declares its scoring: mean only.
    Other,
}

/// Each benchmark family's scoring, as the presets running it declare it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scorings {
    declared: BTreeMap<String, Scoring>,
}

impl Scorings {
    /// From (benchmark family, the scoring its preset declares, if any) pairs, in preset order: the
    /// first declaration of a family wins (`registry check` reports presets that disagree).
    pub(crate) fn from_declarations(declarations: impl IntoIterator<Item = (String, Option<Scoring>)>) -> Scorings {
        let mut declared = BTreeMap::new();
        for (family, scoring) in declarations {
            if let Some(scoring) = scoring {
                declared.entry(family).or_insert(scoring);
            }
        }
        Scorings { declared }
    }

    /// A column's declared scoring (`terminal_bench_2@openhands` is scored as `terminal_bench_2`).
    pub fn declared(&self, column: &str) -> Option<Scoring> {
        let family = column.split_once('@').map_or(column, |(family, _agent)| family);
        self.declared.get(family).copied()
    }

    /// A column's scoring: declared, else [`Scoring::UNDECLARED`].
    pub fn of(&self, column: &str) -> Scoring {
        self.declared(column).unwrap_or(Scoring::UNDECLARED)
    }

    pub(crate) fn kind(&self, column: &str) -> BenchKind {
        match self.declared(column).map(|s| s.kind) {
            Some(ScoringKind::Binary) => BenchKind::Binary,
            Some(ScoringKind::PartialCredit) => BenchKind::PartialCredit,
            None => BenchKind::Other,
        }
    }

    /// The families the ID mean is over.
    fn id_mean_families(&self) -> impl Iterator<Item = &String> {
        self.declared.iter().filter(|(_, s)| s.in_id_mean).map(|(family, _)| family)
    }

    /// The binary families, for the message refusing another ranking.
    fn binary_families(&self) -> String {
        let binary: Vec<&str> = self
            .declared
            .iter()
            .filter(|(_, s)| s.kind == ScoringKind::Binary)
            .map(|(family, _)| family.as_str())
            .collect();
        if binary.is_empty() { "none is declared `kind: binary`".to_string() } else { binary.join(", ") }
    }

    /// Whether models are ranked on this column: its scoring is declared `ranked`.
    pub fn ranked(&self, column: &str) -> bool {
        self.of(column).ranked
    }

    /// The ranked families, for the messages refusing a benchmark that is not.
    pub(crate) fn ranked_families(&self) -> String {
        let ranked: Vec<&str> =
            self.declared.iter().filter(|(_, s)| s.ranked).map(|(family, _)| family.as_str()).collect();
        if ranked.is_empty() { "none is declared `ranked: true`".to_string() } else { ranked.join(", ") }
    }

    /// The matrix's column order: the ID mean's first, then binary, partial-credit, undeclared.
    fn column_order(&self, column: &str) -> (bool, BenchKind) {
        (!self.of(column).in_id_mean, self.kind(column))
    }
}

/// A short column label (the team's names for its usual benchmarks; any other stays as it is).
pub(crate) fn short_name(family: &str) -> String {
    let f = family.to_ascii_lowercase();
    if f.contains("swebench-verified-random-100") {
        "swebench-100".into()
    } else if f.contains("terminal_bench_2") || f.contains("terminal-bench-2") {
        "tb2".into()
    } else if f.contains("dev_set_v2") {
        "dev_set_v2".into()
    } else {
        family.to_string()
    }
}

/// One (model, benchmark) result.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub model: String,
    pub benchmark: String,
    pub attempt_id: AttemptId,
    pub run_tag: String,
    pub run_dir: Option<String>,
    pub cluster: String,
    pub mean: Option<f64>,
    /// √(p(1−p)/n) over the trials; binary benchmarks only.
    pub stderr: Option<f64>,
    pub n_trials: u64,
    pub n_valid: u64,
    pub n_expected: Option<u64>,
    pub n_errors: u64,
    pub infra_errors: BTreeMap<String, u64>,
    pub incomplete: bool,
    pub(crate) audit_reasons: Vec<String>,
    pub ended_at: Option<Timestamp>,
    pub provenance: Provenance,
    /// The pair's earlier results (in [`Matrix::earlier`]) that ran under other settings
    /// ([`Provenance::same_settings`]): the cell shows only its own attempt and says so.
    pub other_settings: Vec<AttemptId>,
    /// What the result cost on GPUs ([`attach_gpu`]); `None` where no attempt of it has a record.
    pub gpu: Option<crate::gpuhours::ResultGpu>,
    /// Statistics from its per-trial facts ([`attach_trials`]); `None` without them.
    pub trials: Option<TrialStatistics>,
}

/// A result's statistics from its trials (docs/results.md): both means, labelled, each with its
/// task-clustered SE and bootstrap interval; pass@k where every task has k > 1 attempts.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TrialStatistics {
    pub harbor_version: Option<String>,
    pub estimates: Vec<crate::stats::Estimate>,
    pub(crate) attempts_per_task: Option<usize>,
    /// `(k, pass@k)`.
    pub pass_at_k: Option<(usize, f64)>,
}

impl TrialStatistics {
    pub fn of(set: &crate::ledger::TrialSet, bootstrap: crate::stats::Bootstrap) -> Self {
        use crate::stats;
        let attempts_per_task = stats::attempts_per_task(&set.trials);
        Self {
            harbor_version: set.harbor_version.clone(),
            estimates: stats::InvalidTrials::BOTH
                .iter()
                .filter_map(|policy| stats::estimate(&set.trials, *policy, bootstrap))
                .collect(),
            attempts_per_task,
            pass_at_k: attempts_per_task
                .filter(|k| *k > 1)
                .and_then(|k| stats::pass_at_k(&set.trials, k).ok().map(|p| (k, p))),
        }
    }
}

/// Each result's [`TrialStatistics`], from the ledger's per-trial facts.
/// The rankings are recomputed from them (a result with facts ranks on its bootstrap interval).
pub(crate) fn attach_trials(
    m: &mut Matrix,
    ledger: &dyn crate::ledger::Ledger,
    bootstrap: crate::stats::Bootstrap,
) -> Result<(), crate::ledger::LedgerError> {
    for cell in m.cells.iter_mut().chain(m.earlier.iter_mut()) {
        cell.trials = ledger.trials(cell.attempt_id)?.map(|set| TrialStatistics::of(&set, bootstrap));
    }
    m.refresh_rankings();
    Ok(())
}

/// A result's per-trial statistics in one line: both means, labelled, each with the task-clustered
/// SE and the bootstrap interval (in points), pass@k and the Harbor that produced it.
pub(crate) fn trials_line(t: &TrialStatistics) -> String {
    let means: Vec<String> = t
        .estimates
        .iter()
        .map(|e| {
            let se = e.clustered_se.map_or(String::new(), |se| format!(" ± {:.1}", 100.0 * se));
            let ci = e.interval.map_or(String::new(), |i| format!(" [{:.1}, {:.1}]", 100.0 * i.lower, 100.0 * i.upper));
            format!("{} {:.1}{se}{ci} ({} tasks, {} trials)", e.label, 100.0 * e.mean, e.tasks, e.trials)
        })
        .collect();
    let pass = t.pass_at_k.map_or(String::new(), |(k, p)| format!("; pass@{k} {:.1}", 100.0 * p));
    format!("{}{pass}; Harbor {}", means.join("; "), t.harbor_version.as_deref().unwrap_or("?"))
}

/// One line per result with per-trial facts ([`trials_line`]); empty when none has them.
pub(crate) fn render_trials_text(m: &Matrix) -> String {
    let mut out = String::new();
    for cell in &m.cells {
        let Some(t) = &cell.trials else { continue };
        out += &format!("{} {}: {}\n", cell.model, short_name(&cell.benchmark), trials_line(t));
    }
    if out.is_empty() {
        return out;
    }
    format!("\nFrom per-trial facts (mean ± task-clustered SE [95% bootstrap interval over tasks], in points)\n{out}")
}

/// What a result ran under (docs/verification.md, "Provenance"): the settings recorded with the
/// attempt when it was submitted, and what payload found on the node (folded into the metrics by
/// sync). `None` where the row does not say (older rows, imported history).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Provenance {
    pub agent: Option<String>,
    /// `key=value`, as handed to Harbor (the spec holds no secret values).
    pub agent_kwargs: Vec<String>,
    pub timeout_multiplier: Option<f64>,
    pub n_attempts: Option<u64>,
    pub harbor_config: Option<String>,
    pub dataset: Option<String>,
    pub cluster: String,
    /// The GPU profile payload matched, and the device name.
    pub gpu: Option<String>,
    /// The commit the HF cache resolved, or the local path.
    pub model_revision: Option<String>,
    pub vllm_version: Option<String>,
    pub harbor_version: Option<String>,
    /// `sha1:<hex>` of the task dir's content as the job read it.
    pub dataset_digest: Option<String>,
}

impl Provenance {
    pub fn of(a: &Attempt) -> Provenance {
        let config = |key: &str| a.config.get(key);
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        let node = |key: &str| text(a.metrics.as_ref().and_then(|m| m.pointer(&format!("/provenance/{key}"))));
        Provenance {
            agent: text(config("agent")),
            agent_kwargs: config("agent_kwargs")
                .and_then(Value::as_array)
                .map(|list| list.iter().filter_map(Value::as_str).map(str::to_string).collect())
                .unwrap_or_default(),
            timeout_multiplier: config("timeout_multiplier").and_then(Value::as_f64),
            n_attempts: config("n_attempts").and_then(Value::as_u64),
            harbor_config: text(config("harbor_config")),
            dataset: text(config("dataset")),
            cluster: a.cluster.clone(),
            gpu: node("gpu"),
            model_revision: node("model_revision"),
            vllm_version: node("vllm_version"),
            harbor_version: node("harbor_version"),
            dataset_digest: node("dataset_digest"),
        }
    }

    /// One line for people: `ran under agent terminus-2, timeout ×4.0, …` (what is known).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        let mut add = |label: &str, value: Option<String>| {
            if let Some(v) = value {
                parts.push(format!("{label} {v}"));
            }
        };
        add("agent", self.agent.clone());
        add("kwargs", (!self.agent_kwargs.is_empty()).then(|| self.agent_kwargs.join(" ")));
        add("timeout multiplier", self.timeout_multiplier.map(|m| m.to_string()));
        add("n_attempts", self.n_attempts.map(|n| n.to_string()));
        add("Harbor config", self.harbor_config.clone());
        add("dataset", self.dataset.clone());
        add("dataset digest", self.dataset_digest.clone());
        add("model revision", self.model_revision.clone());
        add("vLLM", self.vllm_version.clone());
        add("Harbor", self.harbor_version.clone());
        add("GPU", self.gpu.clone());
        add("cluster", Some(self.cluster.clone()));
        format!("ran under {}", parts.join(", "))
    }

    /// Whether two results ran under the same settings: everything but where they ran (cluster,
    /// GPU). A setting one of them does not record is not told apart.
    pub(crate) fn same_settings(&self, other: &Provenance) -> bool {
        fn same<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
            a.is_none() || b.is_none() || a == b
        }
        // Destructured whole: a new field is either compared here or named as where it ran.
        let Provenance {
            agent,
            agent_kwargs,
            timeout_multiplier,
            n_attempts,
            harbor_config,
            dataset,
            cluster: _,
            gpu: _,
            model_revision,
            vllm_version,
            harbor_version,
            dataset_digest,
        } = self;
        same(agent, &other.agent)
            && *agent_kwargs == other.agent_kwargs
            && same(timeout_multiplier, &other.timeout_multiplier)
            && same(n_attempts, &other.n_attempts)
            && same(harbor_config, &other.harbor_config)
            && same(dataset, &other.dataset)
            && same(model_revision, &other.model_revision)
            && same(vllm_version, &other.vllm_version)
            && same(harbor_version, &other.harbor_version)
            && same(dataset_digest, &other.dataset_digest)
    }
}

/// Models × benchmarks.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Matrix {
    pub models: Vec<String>,
    pub benchmarks: Vec<String>,
    pub kinds: BTreeMap<String, BenchKind>,
    pub cells: Vec<Cell>,
    /// Every earlier finished result of a pair shown in `cells` (a re-evaluation keeps the one
    /// before it), oldest first: never pooled into the cell.
    pub earlier: Vec<Cell>,
    /// Mean over the benchmarks declared `in_id_mean`, when the model has them all.
    pub id_mean: BTreeMap<String, f64>,
    /// The ranked benchmark the matrix's `rank` column shows, and each ranked model's rank on it
    /// (its [`Standing::rank`]: models whose intervals overlap share one).
    pub rank_by: Option<String>,
    pub ranks: BTreeMap<String, usize>,
    /// Every ranked benchmark's ranking ([`Scorings::ranked`]), in column order ([`rankings`]).
    pub rankings: Vec<BenchmarkRanking>,
    /// The presets' scoring the matrix was built with.
    pub(crate) scorings: Scorings,
    /// What every recorded attempt spent on GPUs ([`attach_gpu`]).
    pub(crate) gpu_totals: crate::gpuhours::GpuTotals,
}

impl Matrix {
    pub(crate) fn cell(&self, model: &str, benchmark: &str) -> Option<&Cell> {
        self.cells.iter().find(|c| c.model == model && c.benchmark == benchmark)
    }

    /// The model's rank on `rank_by` as printed: `2`, or `2=` when tied with another model.
    pub(crate) fn rank_label(&self, model: &str) -> Option<String> {
        let ranking = self.ranking(self.rank_by.as_deref()?)?;
        ranking.standings.iter().find(|s| s.model == model).map(Standing::rank_label)
    }

    pub(crate) fn ranking(&self, benchmark: &str) -> Option<&BenchmarkRanking> {
        self.rankings.iter().find(|r| r.benchmark == benchmark)
    }

    /// The models in ranking order on `rank_by` (rank, then mean, then name), then the models it
    /// does not rank, by name: the order a ranked table lists them in.
    pub(crate) fn models_by_rank(&self) -> Vec<&str> {
        let ranked: Vec<&str> = self
            .rank_by
            .as_deref()
            .and_then(|b| self.ranking(b))
            .map(|r| r.standings.iter().map(|s| s.model.as_str()).collect())
            .unwrap_or_default();
        let rest = self.models.iter().map(String::as_str).filter(|m| !ranked.contains(m));
        ranked.iter().copied().chain(rest).collect()
    }

    /// Recomputes the rankings and the `rank` column from the cells (after their per-trial
    /// statistics changed).
    fn refresh_rankings(&mut self) {
        self.rankings = rankings(&self.cells, &self.benchmarks, &self.scorings);
        self.ranks = self
            .rank_by
            .as_deref()
            .and_then(|b| self.ranking(b))
            .map(|r| r.standings.iter().map(|s| (s.model.clone(), s.rank)).collect())
            .unwrap_or_default();
    }
}

/// One ranked benchmark's ranking (docs/results.md "Ranking several models").
#[derive(Debug, Clone, PartialEq)]
pub struct BenchmarkRanking {
    pub benchmark: String,
    pub standings: Vec<Standing>,
}

/// A result as a contender in its benchmark's ranking: with per-trial facts, the "invalid as 0"
/// mean and its bootstrap interval over tasks; else the recorded mean with the normal interval of
/// its trial-level standard error (or none). A refused score is no contender.
pub fn contender(cell: &Cell) -> Option<Contender> {
    let mean = cell.mean?;
    let from_trials = cell
        .trials
        .as_ref()
        .and_then(|t| t.estimates.iter().find(|e| e.invalid_trials == crate::stats::InvalidTrials::CountedAsZero))
        .and_then(|e| e.interval.map(|interval| (e.mean, interval)));
    Some(match from_trials {
        Some((mean, interval)) => Contender {
            model: cell.model.clone(),
            mean,
            interval: Some(interval),
            basis: IntervalBasis::BootstrapOverTasks,
        },
        None => Contender::from_standard_error(&cell.model, mean, cell.stderr),
    })
}

/// The ranking of every ranked benchmark among `benchmarks` over the models that have a score on it.
pub fn rankings(cells: &[Cell], benchmarks: &[String], scorings: &Scorings) -> Vec<BenchmarkRanking> {
    benchmarks
        .iter()
        .filter(|b| scorings.ranked(b))
        .map(|b| {
            let contenders: Vec<Contender> = cells.iter().filter(|c| &c.benchmark == b).filter_map(contender).collect();
            BenchmarkRanking { benchmark: b.clone(), standings: crate::stats::rank(&contenders) }
        })
        .filter(|r| !r.standings.is_empty())
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum MatrixError {
    #[error(
        "cannot rank on {0}: its preset declares it partial-credit, which ranks nobody — rank on a binary benchmark ({1})"
    )]
    PartialCreditRank(String, String),
    #[error(
        "cannot rank on {0}: no preset declares its scoring (`scoring: {{kind: binary}}` in presets/) — rank on a binary benchmark ({1})"
    )]
    NotBinary(String, String),
}

/// Builds the matrix from attempts: per (model, benchmark family), the latest finished attempt
/// with metrics, scored as `scorings` says. `rank_by`: a binary benchmark family (default: the
/// `ranked` one the most models have a score on, the first in column order on a tie). Audits are
/// recomputed with `settings`.
pub(crate) fn build_matrix(
    attempts: &[Attempt],
    rank_by: Option<&str>,
    settings: &VerifySettings,
    scorings: &Scorings,
) -> Result<Matrix, MatrixError> {
    if let Some(r) = rank_by {
        match scorings.kind(r) {
            BenchKind::Binary => {}
            BenchKind::PartialCredit => {
                return Err(MatrixError::PartialCreditRank(r.to_string(), scorings.binary_families()));
            }
            BenchKind::Other => return Err(MatrixError::NotBinary(r.to_string(), scorings.binary_families())),
        }
    }
    let mut by_pair: BTreeMap<(String, String), Vec<&Attempt>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for a in attempts.iter().filter(|a| {
        a.status == AttemptStatus::Finished && a.metrics.as_ref().is_some_and(|m| !m.is_null()) && seen.insert(a.id)
    }) {
        by_pair.entry((a.model.clone(), column_of(a))).or_default().push(a);
    }
    let mut cells = Vec::new();
    let mut earlier = Vec::new();
    let mut models = BTreeSet::new();
    let mut benches = BTreeSet::new();
    for ((model, bench), mut results) in by_pair {
        // The latest is the cell; the ones before stay beside it, oldest first.
        results.sort_by_key(|a| (a.ended_at, a.submitted_at, a.id));
        let latest = results.pop().expect("non-empty");
        let binary = scorings.kind(&bench) == BenchKind::Binary;
        let before: Vec<Cell> = results.iter().map(|a| cell_of(a, settings, binary)).collect();
        let mut cell = cell_of(latest, settings, binary);
        cell.other_settings =
            before.iter().filter(|b| !b.provenance.same_settings(&cell.provenance)).map(|b| b.attempt_id).collect();
        models.insert(model);
        benches.insert(bench);
        cells.push(cell);
        earlier.extend(before);
    }
    let mut benchmarks: Vec<String> = benches.into_iter().collect();
    benchmarks.sort_by_key(|b| (scorings.column_order(b), b.clone()));
    let models: Vec<String> = models.into_iter().collect();
    let kinds = benchmarks.iter().map(|b| (b.clone(), scorings.kind(b))).collect();
    let mean_of =
        |model: &str, bench: &str| cells.iter().find(|c| c.model == model && c.benchmark == bench).and_then(|c| c.mean);
    let mut id_mean = BTreeMap::new();
    let id_families: Vec<&String> = scorings.id_mean_families().collect();
    for model in &models {
        // The ID mean is the default harness's (another agent's column is an eval of its own).
        let means: Option<Vec<f64>> = id_families.iter().map(|family| mean_of(model, family)).collect();
        if let Some(means) = means.filter(|m| !m.is_empty()) {
            id_mean.insert(model.clone(), means.iter().sum::<f64>() / means.len() as f64);
        }
    }
    let rank_by = rank_by.map(str::to_string).or_else(|| {
        let scored = |bench: &str| models.iter().filter(|model| mean_of(model, bench).is_some()).count();
        let ranked = benchmarks.iter().filter(|b| scorings.of(b).ranked);
        // The widest ranking; `max_by_key` keeps the last of equals, so walk the columns backwards.
        ranked.rev().max_by_key(|b| scored(b)).cloned()
    });
    let mut m = Matrix {
        models,
        benchmarks,
        kinds,
        cells,
        earlier,
        id_mean,
        rank_by,
        ranks: BTreeMap::new(),
        rankings: Vec::new(),
        scorings: scorings.clone(),
        gpu_totals: Default::default(),
    };
    m.refresh_rankings();
    Ok(m)
}

/// A result's column: its benchmark family, with the agent when it is not the default one
/// (`terminal_bench_2@openhands`): another harness is another eval, never one cell.
pub(crate) fn column_of(a: &Attempt) -> String {
    if a.agent == launch_spec::spec::DEFAULT_AGENT {
        a.benchmark_family.clone()
    } else {
        format!("{}@{}", a.benchmark_family, a.agent)
    }
}

/// One finished attempt's result; `binary`: its rewards are 0 or 1, so its mean has a standard error.
fn cell_of(a: &Attempt, settings: &VerifySettings, binary: bool) -> Cell {
    let m = a.metrics.as_ref().expect("a finished attempt with metrics");
    let summary = summary_from_metrics(m);
    let audit = audit_of(&summary, settings);
    let stderr = match summary.mean_reward {
        Some(p) if binary && summary.n_trials > 0 => Some((p * (1.0 - p) / summary.n_trials as f64).max(0.0).sqrt()),
        _ => None,
    };
    Cell {
        model: a.model.clone(),
        benchmark: column_of(a),
        attempt_id: a.id,
        run_tag: a.run_tag.clone(),
        run_dir: a.config.get("run_dir").and_then(Value::as_str).map(str::to_string),
        cluster: a.cluster.clone(),
        mean: summary.mean_reward,
        stderr,
        n_trials: summary.n_trials,
        n_valid: summary.n_valid,
        n_expected: summary.n_expected,
        n_errors: summary.n_errors,
        infra_errors: summary.infra_errors.clone(),
        incomplete: !audit.complete,
        audit_reasons: audit.reasons,
        ended_at: a.ended_at,
        provenance: Provenance::of(a),
        other_settings: Vec::new(),
        gpu: None,
        trials: None,
    }
}

/// Each result's GPU use and the totals, from the ledger's GPU-seconds records
/// (`Ledger::gpu_seconds`; crate::gpuhours sums them).
pub(crate) fn attach_gpu(m: &mut Matrix, rows: &[crate::ledger::GpuSecondsRow]) {
    for cell in m.cells.iter_mut().chain(m.earlier.iter_mut()) {
        cell.gpu = crate::gpuhours::result_gpu(rows, cell.attempt_id, &cell.run_tag);
    }
    m.gpu_totals = crate::gpuhours::totals(rows);
}

/// GPU-hours per result (models × benchmarks), per benchmark and in total, when any attempt has
/// a record; empty otherwise.
pub(crate) fn render_gpu_text(m: &Matrix, terminal: &crate::term::Terminal) -> String {
    let t = &m.gpu_totals;
    if t.attempts == 0 {
        return String::new();
    }
    let mut out = "\nGPU-hours per result (its attempts, walltime continuations included)\n".to_string();
    let mut header = vec!["model".to_string()];
    header.extend(m.benchmarks.iter().map(|b| short_name(b)));
    let mut table = terminal.table(header);
    for model in m.models_by_rank() {
        let mut row = vec![model.to_string()];
        for b in &m.benchmarks {
            row.push(
                m.cell(model, b).and_then(|c| c.gpu.as_ref()).map_or("-".into(), |g| format!("{:.2}", g.gpu_hours)),
            );
        }
        table.row(row);
    }
    for column in 1..=m.benchmarks.len() {
        table.right(column).keep(column);
    }
    out += &table.render();
    let by_bench: Vec<String> = t.by_benchmark.iter().map(|(b, h)| format!("{} {h:.2}", short_name(b))).collect();
    out += &format!("by benchmark (every recorded attempt): {}\n", by_bench.join(", "));
    let phases: Vec<String> = crate::gpuhours::PHASES
        .iter()
        .filter_map(|p| t.gpu_seconds_by_phase.0.get(*p).map(|s| format!("{p} {:.2}", s / 3600.0)))
        .collect();
    out += &format!("total: {:.2} GPU-hours over {} attempt(s) ({})\n", t.gpu_hours, t.attempts, phases.join(", "));
    out
}

/// The attempts the matrix is built from: per (model, family), every finished attempt (the latest
/// is the cell, the ones before it its earlier results; a resubmission may be running on top).
pub fn finished_attempts(ledger: &dyn crate::ledger::Ledger) -> Result<Vec<Attempt>, crate::ledger::LedgerError> {
    let mut out = Vec::new();
    for pair in ledger.latest_per_pair()? {
        if pair.total_attempts <= 1 {
            out.extend(Some(pair.latest).filter(|a| a.status == AttemptStatus::Finished));
        } else {
            out.extend(
                ledger
                    .attempts_for(&pair.model, &pair.family)?
                    .into_iter()
                    .filter(|a| a.status == AttemptStatus::Finished),
            );
        }
    }
    Ok(out)
}

/// A [`ScoreSummary`] back from ledger metrics (older rows lack the newer keys).
pub(crate) fn summary_from_metrics(m: &Value) -> ScoreSummary {
    let map = |key: &str| -> BTreeMap<String, u64> {
        m.get(key)
            .and_then(Value::as_object)
            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0))).collect())
            .unwrap_or_default()
    };
    let n_trials = m.get("n_trials").and_then(Value::as_u64).unwrap_or(0);
    let n_errors = m.get("n_errors").and_then(Value::as_u64).unwrap_or(0);
    let errors_by_type = map("errors_by_type");
    let infra_errors: BTreeMap<String, u64> = if m.get("infra_errors").is_some() {
        map("infra_errors")
    } else {
        errors_by_type
            .iter()
            .filter(|(k, _)| launch_spec::spec::INFRA_ERROR_TYPES.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    };
    let (mean_reward, refused) = split_score(m.get("mean_reward").and_then(Value::as_f64));
    ScoreSummary {
        mean_reward,
        invalid_score: refused.or_else(|| m.get("invalid_score").and_then(Value::as_str).map(str::to_string)),
        n_trials,
        n_verified: m.get("n_verified").and_then(Value::as_u64).unwrap_or(n_trials),
        n_errors,
        n_valid: m.get("n_valid").and_then(Value::as_u64).unwrap_or(n_trials.saturating_sub(n_errors)),
        n_total_trials: m.get("n_total_trials").and_then(Value::as_u64),
        n_expected: m
            .get("n_expected")
            .and_then(Value::as_u64)
            .or_else(|| m.get("n_total_trials").and_then(Value::as_u64)),
        n_infra_errors: infra_errors.values().sum(),
        infra_errors,
        errors_by_type,
        rewards: map("rewards"),
        harbor_finished: m.get("harbor_finished").and_then(Value::as_bool).unwrap_or(true),
    }
}

fn fmt_mean(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.3}"))
}

/// The matrix as a text table (fitted to `terminal`), in ranking order
/// ([`Matrix::models_by_rank`]).
pub(crate) fn render_text(m: &Matrix, terminal: &crate::term::Terminal) -> String {
    let mut header = vec!["model".to_string()];
    header.extend(m.benchmarks.iter().map(|b| short_name(b)));
    header.extend(["ID mean".to_string(), "rank".to_string()]);
    let mut table = terminal.table(header);
    for model in m.models_by_rank() {
        let mut row = vec![model.to_string()];
        for b in &m.benchmarks {
            row.push(match m.cell(model, b) {
                None => "-".to_string(),
                Some(c) => {
                    let mut t = match c.stderr {
                        Some(se) => format!("{} ±{:.3}", fmt_mean(c.mean), se),
                        None => fmt_mean(c.mean),
                    };
                    if c.incomplete {
                        t.push('!');
                    }
                    if !c.other_settings.is_empty() {
                        t.push('~');
                    }
                    t
                }
            });
        }
        row.push(fmt_mean(m.id_mean.get(model).copied()));
        row.push(m.rank_label(model).unwrap_or_else(|| "-".into()));
        table.row(row);
    }
    for column in 1..m.benchmarks.len() + 3 {
        table.right(column).keep(column);
    }
    let out = table.render();
    let mut notes = format!(
        "± standard error (binary benchmarks only); dev_set_v2 is partial-credit: mean only, never ranked; ! = incomplete (resume, don't accept){}\n",
        m.rank_by
            .as_ref()
            .map(|r| format!(
                "; ranked on {}: rank = 1 + models whose 95% interval lies wholly above, = tied (intervals overlap)",
                short_name(r)
            ))
            .unwrap_or_default()
    );
    if !m.earlier.is_empty() {
        let other = m.cells.iter().filter(|c| !c.other_settings.is_empty()).count();
        notes += &format!(
            "{} earlier result(s) kept beside the cells (--json: `earlier`), never pooled; ~ = {other} cell(s) with earlier results under other settings\n",
            m.earlier.len()
        );
    }
    out + &terminal.fit(&notes)
}

/// A text a spreadsheet would read as a formula (`=`, `+`, `-`, `@`, a tab or CR first: OWASP's
/// CSV-injection rule) gets a leading `'`, so it reads as text; quoting is the CSV writer's.
pub(crate) fn csv_text(text: &str) -> String {
    if text.starts_with(['=', '+', '-', '@', '\t', '\r']) { format!("'{text}") } else { text.to_string() }
}

/// A number for a CSV field: six decimals, empty when there is none.
pub(crate) fn csv_number(v: Option<f64>) -> String {
    v.map_or(String::new(), |v| format!("{v:.6}"))
}

/// Rows written by the `csv` crate into a string (every field already text).
pub(crate) fn csv_document(rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut writer = csv::Writer::from_writer(Vec::new());
    for row in rows {
        // Writing into a Vec cannot fail; a record of another length is the caller's bug.
        writer.write_record(&row).expect("a CSV record into memory");
    }
    String::from_utf8(writer.into_inner().expect("flushing into memory")).expect("CSV of UTF-8 fields")
}

/// The matrix as CSV (docs/verification.md "Results"): one row per model, in name order. Per
/// benchmark its mean, `_stderr` (binary only) and `_incomplete`, then `id_mean` and `rank`; then per
/// benchmark the per-trial statistics (`_invalid_as_0`, `_invalid_dropped`, `_clustered_se`,
/// `_ci_lower`, `_ci_upper` of "invalid as 0", `_pass_at_k` with its `_k`, `_harbor_version`) and,
/// for a ranked benchmark, `_rank` and `_tied_with` (names joined by `; `).
pub(crate) fn render_csv(m: &Matrix) -> String {
    let mut header = vec!["model".to_string()];
    for b in &m.benchmarks {
        header.push(csv_text(b));
        if m.kinds.get(b) == Some(&BenchKind::Binary) {
            header.push(csv_text(&format!("{b}_stderr")));
        }
        header.push(csv_text(&format!("{b}_incomplete")));
    }
    header.extend(["id_mean".to_string(), "rank".to_string()]);
    for b in &m.benchmarks {
        for suffix in TRIAL_COLUMNS {
            header.push(csv_text(&format!("{b}_{suffix}")));
        }
        if m.ranking(b).is_some() {
            header.push(csv_text(&format!("{b}_rank")));
            header.push(csv_text(&format!("{b}_tied_with")));
        }
    }
    let mut rows = vec![header];
    for model in &m.models {
        let mut row = vec![csv_text(model)];
        for b in &m.benchmarks {
            let cell = m.cell(model, b);
            row.push(csv_number(cell.and_then(|c| c.mean)));
            if m.kinds.get(b) == Some(&BenchKind::Binary) {
                row.push(csv_number(cell.and_then(|c| c.stderr)));
            }
            row.push(cell.map_or(String::new(), |c| c.incomplete.to_string()));
        }
        row.push(csv_number(m.id_mean.get(model).copied()));
        row.push(m.ranks.get(model).map_or(String::new(), |r| r.to_string()));
        for b in &m.benchmarks {
            row.extend(trial_fields(m.cell(model, b).and_then(|c| c.trials.as_ref())));
            if let Some(ranking) = m.ranking(b) {
                let standing = ranking.standings.iter().find(|s| &s.model == model);
                row.push(standing.map_or(String::new(), |s| s.rank.to_string()));
                row.push(standing.map_or(String::new(), |s| csv_text(&s.tied_with.join("; "))));
            }
        }
        rows.push(row);
    }
    csv_document(rows)
}

/// The per-trial columns of a benchmark in `results --csv`, after its name and `_`.
const TRIAL_COLUMNS: [&str; 8] =
    ["invalid_as_0", "invalid_dropped", "clustered_se", "ci_lower", "ci_upper", "pass_at_k", "k", "harbor_version"];

fn trial_fields(trials: Option<&TrialStatistics>) -> Vec<String> {
    let Some(t) = trials else { return vec![String::new(); TRIAL_COLUMNS.len()] };
    let estimate = |policy| t.estimates.iter().find(|e| e.invalid_trials == policy);
    let zero = estimate(crate::stats::InvalidTrials::CountedAsZero);
    vec![
        csv_number(zero.map(|e| e.mean)),
        csv_number(estimate(crate::stats::InvalidTrials::Dropped).map(|e| e.mean)),
        csv_number(zero.and_then(|e| e.clustered_se)),
        csv_number(zero.and_then(|e| e.interval).map(|i| i.lower)),
        csv_number(zero.and_then(|e| e.interval).map(|i| i.upper)),
        csv_number(t.pass_at_k.map(|(_, p)| p)),
        t.pass_at_k.map_or(String::new(), |(k, _)| k.to_string()),
        t.harbor_version.as_deref().map_or(String::new(), csv_text),
    ]
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chrono::DateTime;

    fn typed(value: Value) -> JobResult {
        serde_json::from_value(value).unwrap()
    }

    fn result(mean: f64, rewards: &[(&str, usize)], errors: &[(&str, usize)], total: u64) -> JobResult {
        let reward_stats: serde_json::Map<String, Value> = rewards
            .iter()
            .map(|(k, n)| (k.to_string(), json!((0..*n).map(|i| format!("t{i}")).collect::<Vec<_>>())))
            .collect();
        let exception_stats: serde_json::Map<String, Value> = errors
            .iter()
            .map(|(k, n)| (k.to_string(), json!((0..*n).map(|i| format!("e{i}")).collect::<Vec<_>>())))
            .collect();
        let n_errors: usize = errors.iter().map(|e| e.1).sum();
        let n_trials: usize = rewards.iter().map(|r| r.1).sum::<usize>() + n_errors;
        typed(json!({"n_total_trials": total, "finished_at": "2026-01-01T00:00:00", "stats": {"evals": {"a__m__d": {
            "n_trials": n_trials, "n_errors": n_errors, "metrics": [{"mean": mean}],
            "reward_stats": {"reward": reward_stats}, "exception_stats": exception_stats}}}}))
    }

    #[test]
    fn summary_and_audit() {
        let r = result(0.5, &[("1.0", 140), ("0.0", 130)], &[("DaytonaError", 20), ("AgentTimeoutError", 10)], 300);
        let s = summary_from_result(&r, None);
        assert_eq!((s.n_trials, s.n_errors, s.n_valid, s.n_expected), (300, 30, 270, Some(300)));
        assert_eq!(s.infra_errors, BTreeMap::from([("DaytonaError".to_string(), 20)]));
        let audit = audit_of(&s, &VerifySettings::default());
        assert!(audit.complete, "{audit:?}");
        assert_eq!(audit.needed, Some(270));
        let r = result(0.5, &[("1.0", 140), ("0.0", 120)], &[("DaytonaError", 40)], 300);
        let audit = audit_of(&summary_from_result(&r, None), &VerifySettings::default());
        assert!(!audit.complete);
        assert_eq!(audit.reasons.len(), 2, "{:?}", audit.reasons);
        let m = metrics_json(&summary_from_result(&r, None), &audit);
        assert_eq!(m["audit"]["status"], "incomplete");
        assert_eq!(summary_from_metrics(&m), summary_from_result(&r, None));
    }

    #[test]
    fn harbor_counts_verified_trials_per_eval_and_finished_ones_per_job() {
        // harbor 0.25: an eval's n_trials counts the trials the verifier ran on; errored trials
        // that never reached it are only in n_errors, and the mean is over all finished trials.
        let names = |p: &str, n: usize| (0..n).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
        let r = typed(
            json!({"n_total_trials": 60, "stats": {"n_completed_trials": 60, "n_errored_trials": 46, "evals": {"e": {
            "n_trials": 14, "n_errors": 46, "metrics": [{"mean": 8.0 / 60.0}],
            "reward_stats": {"reward": {"1.0": names("a", 8), "0.0": names("b", 6)}}, "exception_stats": {"ContextLengthExceededError": names("c", 46)}}}}}),
        );
        let s = summary_from_result(&r, None);
        assert_eq!((s.n_trials, s.n_verified, s.n_valid, s.n_errors), (60, 14, 14, 46));
        let audit = audit_of(&s, &VerifySettings::default());
        assert!(!audit.complete);
        assert!((audit.error_share - 46.0 / 60.0).abs() < 1e-12);
    }

    fn shipped() -> Scorings {
        crate::testkit::Shipped::load().scorings()
    }

    /// A finished attempt of `model` on `family` with `mean` over `n` trials (the matrix's tests and
    /// the plots').
    pub(crate) fn attempt(id: i64, model: &str, family: &str, mean: f64, n: u64) -> Attempt {
        let t = DateTime::from_timestamp(1_700_000_000 + id, 0).unwrap();
        Attempt {
            id: AttemptId(id),
            model: model.into(),
            benchmark: family.into(),
            benchmark_family: family.into(),
            cluster: "c".into(),
            username: "u".into(),
            run_tag: format!("{family}__{model}"),
            slurm_job_id: Some(id.to_string()),
            status: AttemptStatus::Finished,
            reason: "finished".into(),
            config: json!({"run_dir": "/r"}),
            metrics: Some(json!({"mean_reward": mean, "n_trials": n, "n_errors": 0, "n_valid": n, "n_expected": n})),
            attempt: 1,
            submitted_at: t,
            started_at: Some(t),
            ended_at: Some(t),
            updated_at: t,
            agent: "terminus-2".into(),
            source_id: None,
        }
    }

    /// Issue 32 item 14: a team model named with a newline or terminal escapes prints as one inert
    /// field: no forged line, no escape sequence reaches the terminal.
    #[test]
    fn hostile_names_cannot_forge_lines_or_drive_the_terminal() {
        let forged = "org/evil\nQwen/Forged-8B                0.990   1";
        let attempts = vec![
            attempt(1, forged, "terminal_bench_2", 0.5, 100),
            attempt(2, "org/\u{1b}[2J\u{1b}[31mred\u{202e}", "terminal_bench_2", 0.4, 100),
            attempt(3, "org/plain", "bench\r\u{7}", 0.4, 100),
        ];
        let text = render_text(
            &build_matrix(&attempts, None, &VerifySettings::default(), &shipped()).unwrap(),
            &crate::term::Terminal::pipe(),
        );
        assert!(!text.contains('\u{1b}') && !text.contains('\r') && !text.contains('\u{7}'), "{text:?}");
        assert!(!text.contains('\u{202e}'), "{text:?}");
        assert!(!text.lines().any(|l| l.starts_with("Qwen/Forged-8B")), "a forged line: {text}");
        assert!(text.contains("org/evil\\nQwen/Forged-8B"), "the name is shown, escaped: {text}");
        assert_eq!(crate::text::printable_lines("a\u{1b}[31m\tb\nc"), "a\\u{1b}[31m\tb\nc");
    }

    #[test]
    fn matrix_stderr_id_mean_and_rank() {
        let attempts = vec![
            attempt(1, "a", "terminal_bench_2", 0.5, 100),
            attempt(2, "a", "swebench-verified-random-100-folders", 0.2, 300),
            attempt(3, "a", "dev_set_v2", 0.8, 300),
            attempt(4, "b", "terminal_bench_2", 0.7, 100),
            attempt(5, "b", "dev_set_v2", 0.9, 300),
            attempt(6, "a", "terminal_bench_2", 0.6, 100), // newer attempt wins
        ];
        let m = build_matrix(&attempts, None, &VerifySettings::default(), &shipped()).unwrap();
        assert_eq!(m.benchmarks, vec!["swebench-verified-random-100-folders", "terminal_bench_2", "dev_set_v2"]);
        let tb2 = m.cell("a", "terminal_bench_2").unwrap();
        assert_eq!(tb2.mean, Some(0.6));
        assert!((tb2.stderr.unwrap() - (0.6f64 * 0.4 / 100.0).sqrt()).abs() < 1e-12);
        assert_eq!(m.cell("a", "dev_set_v2").unwrap().stderr, None, "partial credit: no standard error");
        assert!((m.id_mean["a"] - (0.2 + 0.6 + 0.8) / 3.0).abs() < 1e-12);
        assert!(!m.id_mean.contains_key("b"), "b lacks swebench");
        assert_eq!(m.rank_by.as_deref(), Some("terminal_bench_2"));
        // 0.7 and 0.6 over 100 trials: the normal intervals overlap, a statistical tie.
        assert_eq!((m.ranks["b"], m.ranks["a"]), (1, 1));
        assert_eq!(m.rank_label("a").as_deref(), Some("1="));
        assert_eq!(m.models_by_rank(), ["b", "a"]);
        let tb2 = &m.ranking("terminal_bench_2").unwrap().standings;
        assert_eq!(tb2[0].basis, crate::stats::IntervalBasis::NormalOverTrials);
        assert_eq!(tb2[0].tied_with, ["a"]);
        // Over 2,000 trials each the intervals separate: distinct ranks.
        let many = vec![attempt(1, "a", "terminal_bench_2", 0.6, 2000), attempt(2, "b", "terminal_bench_2", 0.7, 2000)];
        let m2 = build_matrix(&many, None, &VerifySettings::default(), &shipped()).unwrap();
        assert_eq!((m2.ranks["b"], m2.ranks["a"]), (1, 2));
        assert_eq!(m2.rank_label("b").as_deref(), Some("1"));
        assert!(matches!(
            build_matrix(&attempts, Some("dev_set_v2"), &VerifySettings::default(), &shipped()),
            Err(MatrixError::PartialCreditRank(..))
        ));
        let csv = render_csv(&m);
        assert!(
            csv.starts_with("model,swebench-verified-random-100-folders,swebench-verified-random-100-folders_stderr,"),
            "{csv}"
        );
        assert!(!csv.contains("dev_set_v2_stderr"));
        assert!(render_text(&m, &crate::term::Terminal::pipe()).contains("±"));
    }

    /// Issue 32 item 7: a Harbor mean of 7.5 (or −7, or NaN from a broken verifier) is no score —
    /// recorded as invalid with the reason, in no ID mean and no ranking, however good it looks;
    /// a stored out-of-range mean read back from the ledger is refused the same way.
    #[test]
    fn scores_outside_the_benchmarks_range_are_refused_at_every_door() {
        for bad in [7.5, -7.0, 1e308] {
            let s = summary_from_result(&result(bad, &[("1.0", 10)], &[], 10), None);
            assert_eq!(s.mean_reward, None, "{bad}");
            let why = s.invalid_score.as_deref().unwrap();
            assert!(why.contains(&format!("score {bad} is outside the benchmark's range [0, 1]")), "{why}");
            let metrics = metrics_json(&s, &audit_of(&s, &VerifySettings::default()));
            assert!(metrics["mean_reward"].is_null() && metrics["invalid_score"].is_string(), "{metrics}");
        }
        assert_eq!(summary_from_result(&result(1.0, &[("1.0", 10)], &[], 10), None).mean_reward, Some(1.0));
        // Stored before the check (or by an older submitter): the ledger door refuses it too.
        let attempts = vec![
            attempt(1, "inflated", "terminal_bench_2", 7.5, 100),
            attempt(2, "honest", "terminal_bench_2", 0.4, 100),
        ];
        let m = build_matrix(&attempts, None, &VerifySettings::default(), &shipped()).unwrap();
        assert_eq!(m.cell("inflated", "terminal_bench_2").unwrap().mean, None);
        assert!(!m.id_mean.contains_key("inflated"), "{:?}", m.id_mean);
        assert!(!m.ranks.contains_key("inflated"), "ranked: {:?}", m.ranks);
        assert_eq!(m.ranks["honest"], 1);
    }

    /// Issue 34: the matrix scores a benchmark as its preset declares, whatever it is named — the
    /// standard error, the ID mean, the default ranking and `--rank-by` each follow the declaration.
    #[test]
    fn the_matrix_scores_as_the_preset_declares() {
        use ScoringKind::{Binary, PartialCredit};
        let declared = |kind, in_id_mean, ranked| Some(Scoring { kind, in_id_mean, ranked });
        // (declaration, kind shown, standard error, in the ID mean, ranked by default, `--rank-by` taken)
        let table = [
            (declared(Binary, true, true), BenchKind::Binary, true, true, true, true),
            (declared(Binary, false, false), BenchKind::Binary, true, false, false, true),
            (declared(PartialCredit, true, false), BenchKind::PartialCredit, false, true, false, false),
            (declared(PartialCredit, false, false), BenchKind::PartialCredit, false, false, false, false),
            (None, BenchKind::Other, false, false, false, false),
        ];
        let attempts = vec![attempt(1, "a", "my_bench", 0.5, 100), attempt(2, "b", "my_bench", 0.7, 100)];
        let settings = VerifySettings::default();
        for (scoring, kind, stderr, in_id_mean, ranked, rank_by_taken) in table {
            let scorings = Scorings::from_declarations([("my_bench".to_string(), scoring)]);
            let m = build_matrix(&attempts, None, &settings, &scorings).unwrap();
            let case = format!("{scoring:?}");
            assert_eq!(m.kinds["my_bench"], kind, "{case}");
            assert_eq!(m.cell("a", "my_bench").unwrap().stderr.is_some(), stderr, "{case}");
            assert_eq!(m.id_mean.get("a"), in_id_mean.then_some(&0.5), "{case}");
            assert_eq!(m.rank_by.as_deref(), ranked.then_some("my_bench"), "{case}");
            assert_eq!((m.ranks.get("b"), m.ranks.get("a")), (ranked.then_some(&1), ranked.then_some(&2)), "{case}");
            let by_hand = build_matrix(&attempts, Some("my_bench"), &settings, &scorings);
            assert_eq!(by_hand.is_ok(), rank_by_taken, "{case}: {by_hand:?}");
        }
        assert_eq!(Scorings::default().of("anything"), Scoring::UNDECLARED);
    }

    /// A column under another agent is scored as its family; the first declaration of a family
    /// wins; the default ranking is the ranked benchmark the most models have, the first column on
    /// a tie.
    #[test]
    fn the_default_ranking_is_the_widest_ranked_benchmark() {
        let ranked = Scoring { kind: ScoringKind::Binary, in_id_mean: false, ranked: true };
        let scorings = Scorings::from_declarations([
            ("x".to_string(), Some(ranked)),
            ("y".to_string(), None),
            ("y".to_string(), Some(ranked)),
            ("x".to_string(), Some(Scoring::UNDECLARED)),
        ]);
        assert_eq!((scorings.of("x"), scorings.of("x@openhands"), scorings.of("y")), (ranked, ranked, ranked));
        let settings = VerifySettings::default();
        let tie = [attempt(1, "a", "x", 0.5, 10), attempt(2, "a", "y", 0.5, 10)];
        assert_eq!(build_matrix(&tie, None, &settings, &scorings).unwrap().rank_by.as_deref(), Some("x"));
        let wider = [tie[0].clone(), tie[1].clone(), attempt(3, "b", "y", 0.2, 10)];
        assert_eq!(build_matrix(&wider, None, &settings, &scorings).unwrap().rank_by.as_deref(), Some("y"));
    }

    /// A family named like a formula reaches a spreadsheet as text (issue 21).
    #[test]
    fn csv_fields_never_read_as_formulas() {
        assert_eq!(csv_text("=HYPERLINK(\"x\")"), "'=HYPERLINK(\"x\")");
        for formula in ["+1", "-1", "@SUM(A1)", "\tx"] {
            assert!(csv_text(formula).starts_with('\''), "{formula}");
        }
        assert_eq!(csv_text("dev_set_v2"), "dev_set_v2");
        let text = csv_document([vec![csv_text("=HYPERLINK(\"x\")"), "a,b".into(), "line\nbreak".into()]]);
        assert_eq!(text, "\"'=HYPERLINK(\"\"x\"\")\",\"a,b\",\"line\nbreak\"\n");
        let row = csv::Reader::from_reader(format!("h1,h2,h3\n{text}").as_bytes()).records().next().unwrap().unwrap();
        assert_eq!(row.iter().collect::<Vec<_>>(), ["'=HYPERLINK(\"x\")", "a,b", "line\nbreak"]);
    }
}
