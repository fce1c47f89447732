//! `submitter check|status|results|report|logs`: launch verification (docs/design.md §8, docs/verification.md).

use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use crate::config::{self, Preset};
use crate::ledger::Ledger;
use crate::observe::{Observation, shared_group_dir};
use crate::slurm::{JobId, Slurm, SlurmCli};
use crate::stats::Bootstrap;
use crate::sync::run_dir_of;
use crate::verify::check::{self, RunCheck};
use crate::verify::compare;
use crate::verify::report::{self, ReportInput, RunEvidence};
use crate::verify::results::{self, Matrix};
use crate::verify::status::{self, Collect};
use crate::verify::team::{self, TeamView};
use crate::verify::verdict::StatusRow;
use crate::verify::{Level, VerifySettings};
use anyhow::{Context, Result, bail};
use chrono::Utc;

use super::session::{LedgerArgs, LedgerStore, Session};
use super::verify_output::{CheckOutput, RankingDocument, ResultsOutput, StatusOutput, TeamOutput};
use crate::output::{self, FormatArgs};

use super::{ConfigDirs, EXIT_PROBLEMS};

#[derive(clap::Args)]
pub(crate) struct CheckArgs {
    /// Run directories (Harbor job dirs; payload's or the old scripts').
    #[arg(value_name = "RUN_DIR", required = true)]
    pub run_dirs: Vec<PathBuf>,
    /// `--format json`: a versioned document (docs/design.md §11).
    #[command(flatten)]
    pub format: FormatArgs,
    /// Exit 1 on warnings too, not only on failures.
    #[arg(long)]
    pub strict: bool,
    /// Take the thresholds from this cluster profile's `verify:` section (default: built-in).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Judge the run dirs as of this instant (RFC 3339, e.g. `2026-11-30T06:40:00Z`; default: now),
    /// so a run dir from any date reads as it did then.
    #[arg(long, value_name = "RFC3339", value_parser = parse_instant)]
    pub now: Option<chrono::DateTime<Utc>>,
    #[command(flatten)]
    pub dirs: ConfigDirs,
}

/// `--now`: an RFC 3339 instant with its offset (`Z` or `+02:00`).
fn parse_instant(text: &str) -> Result<chrono::DateTime<Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{e}: expected an RFC 3339 instant such as 2026-11-30T06:40:00Z"))
}

#[derive(clap::Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub ledger: LedgerArgs,
    /// Also list attempts that ended within the last N hours (0: active only).
    #[arg(long, default_value_t = 24)]
    pub hours: u64,
    /// `--format json`: a versioned document (docs/design.md §11).
    #[command(flatten)]
    pub format: FormatArgs,
    /// Refresh in place every --interval (it reads only: cancelling is remediation's, in `launch`).
    #[arg(long)]
    pub watch: bool,
    /// Time between refreshes with --watch (`10s`, `1m`).
    #[arg(long, value_parser = crate::config::args::interval, default_value = "15s")]
    pub interval: Duration,
    /// Show every job's evidence, not only the unhealthy ones'.
    #[arg(long, short)]
    pub verbose: bool,
    /// The team view: every cluster's attempts on the shared ledger (others' with the ledger's last
    /// known state, marked remote), the last results and GPU-hours per cluster and benchmark.
    #[arg(long, conflicts_with = "watch")]
    pub all_clusters: bool,
}

#[derive(clap::Args)]
pub(crate) struct ResultsArgs {
    #[command(flatten)]
    pub ledger: LedgerArgs,
    /// `--format json`: a versioned `results` document (docs/design.md §11); not with `--csv`.
    #[command(flatten)]
    pub format: FormatArgs,
    #[arg(long, conflicts_with_all = ["json", "format"])]
    pub csv: bool,
    /// The binary benchmark models are ranked on (default terminal_bench_2, else swebench-100).
    #[arg(long, value_name = "BENCHMARK")]
    pub rank_by: Option<String>,
}

#[derive(clap::Args)]
pub(crate) struct CompareArgs {
    #[command(flatten)]
    pub ledger: LedgerArgs,
    #[command(flatten)]
    pub format: FormatArgs,
    /// CSV (docs/submitter.md "compare"): per common task for two models, per standing for more.
    #[arg(long, conflicts_with_all = ["json", "format"])]
    pub csv: bool,
    /// The models: two are paired task by task (differences are the first − the second); three or
    /// more are ranked on each ranked benchmark, ties where their intervals overlap.
    #[arg(value_name = "MODEL", num_args = 2.., required = true)]
    pub models: Vec<String>,
    /// Only this benchmark (a column such as `terminal_bench_2@openhands`, a family or a member).
    #[arg(long, value_name = "BENCHMARK")]
    pub benchmark: Option<String>,
    /// The bootstrap's seed (the same seed gives the same intervals).
    #[arg(long, default_value_t = Bootstrap::default().seed)]
    pub seed: u64,
}

#[derive(clap::Args)]
pub(crate) struct ReportArgs {
    #[command(flatten)]
    pub ledger: LedgerArgs,
    /// Where to write the page.
    #[arg(long, value_name = "FILE")]
    pub html: PathBuf,
    #[arg(long, default_value = "Evaluation report")]
    pub title: String,
    /// Also show attempts that ended within the last N hours among the jobs.
    #[arg(long, default_value_t = 0)]
    pub hours: u64,
    #[arg(long, value_name = "BENCHMARK")]
    pub rank_by: Option<String>,
    /// Skip `check` on each run dir (faster with hundreds of runs).
    #[arg(long)]
    pub(crate) no_check: bool,
    /// The two models whose per-task heat map the plots show (default: the first two of the
    /// ranking on the `--rank-by` benchmark).
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    pub(crate) pair: Option<Vec<String>>,
}

#[derive(clap::Args)]
pub(crate) struct LogsArgs {
    /// A run dir, a run tag, or a Slurm job id (looked up in the ledger, else in Slurm).
    #[arg(value_name = "RUN|JOB")]
    pub target: String,
    /// vLLM's log (`vllm.log`).
    #[arg(long, group = "which")]
    pub engine: bool,
    /// Harbor's log (`harbor.log`).
    #[arg(long, group = "which")]
    pub harbor: bool,
    /// The tunnel's log (`tunnel.log`, or the old scripts' `pinggy_*.log`).
    #[arg(long, group = "which")]
    pub tunnel: bool,
    /// Keep printing what is appended (like `tail -f`).
    #[arg(long, short)]
    pub follow: bool,
    /// Only the last N lines (with -f: default 20).
    #[arg(long, short = 'n', value_name = "N")]
    pub tail: Option<usize>,
    /// Cluster profile, for run tags and job ids (the ledger lookup).
    #[arg(long)]
    pub cluster: Option<String>,
    #[command(flatten)]
    pub store: LedgerStore,
    #[command(flatten)]
    pub dirs: ConfigDirs,
}

fn settings_for(cluster: Option<&str>, dirs: &ConfigDirs) -> Result<VerifySettings> {
    let Some(name) = cluster else { return Ok(VerifySettings::default()) };
    let dirs = dirs.resolve()?;
    Ok(config::load_cluster(&dirs.clusters, name)?.verify)
}

/// `submitter check RUN_DIR…`. Exit 0: no failure (warnings allowed); 1: a check failed (or,
/// with --strict, warned); 2: a path is not a run dir.
pub(crate) fn check(args: &CheckArgs) -> Result<ExitCode> {
    let settings = settings_for(args.cluster.as_deref(), &args.dirs)?;
    let now = args.now.unwrap_or_else(Utc::now);
    let mut checks = Vec::new();
    for dir in &args.run_dirs {
        checks.push(check::check_run_dir(dir, &settings, now)?);
    }
    if args.format.is_json() {
        super::print(&output::document("check", &CheckOutput::new(&checks)))?;
    } else {
        super::print(&check::render_text(&checks))?;
    }
    let worst = checks.iter().map(|c| c.verdict).max().unwrap_or(Level::Ok);
    let bad = worst == Level::Fail || (args.strict && worst == Level::Warn);
    Ok(if bad { ExitCode::from(EXIT_PROBLEMS) } else { ExitCode::SUCCESS })
}

/// What `status` reads: it observes and judges, and never writes (observations are the
/// reconcile's to keep; cancelling is remediation's).
fn collect_opts<'a>(session: &'a Session, hours: u64, world: &'a Observation) -> Collect<'a> {
    Collect {
        cluster: &session.cluster.name,
        state_dir: &session.state_dir,
        settings: &session.cluster.verify,
        ended_within_h: (hours > 0).then_some(hours),
        now: world.now,
        persist: false,
        world,
    }
}

fn collect(session: &Session, hours: u64) -> Result<Vec<StatusRow>> {
    let world = Observation::empty(Utc::now());
    Ok(status::collect(session.ledger.as_ref(), &session.slurm, &collect_opts(session, hours, &world))?)
}

fn collect_team(session: &Session, hours: u64) -> Result<TeamView> {
    let world = Observation::empty(Utc::now());
    Ok(team::collect(session.ledger.as_ref(), &session.slurm, &collect_opts(session, hours, &world))?)
}

/// `status --all-clusters`: the team view once. Exit as `status`: 1 when one of this cluster's
/// active jobs is dead, stalled or misconfigured (another cluster's are not judged here).
fn status_all_clusters(session: &Session, args: &StatusArgs) -> Result<ExitCode> {
    let view = collect_team(session, args.hours)?;
    let text = if args.format.is_json() {
        output::document("status.all_clusters", &TeamOutput::new(&view))
    } else {
        team::render_text(&view, Utc::now())
    };
    super::print(&text)?;
    let bad = view
        .jobs
        .iter()
        .filter_map(|j| j.local.as_ref())
        .any(|r| r.ledger_status.is_active() && r.verdict.verdict.is_bad());
    Ok(if bad { ExitCode::from(EXIT_PROBLEMS) } else { ExitCode::SUCCESS })
}

/// `submitter status [--json] [--watch]`. Exit 0; 1 when an active job is dead, stalled or
/// misconfigured (without --watch); 2 on ledger/Slurm errors.
pub(crate) fn status(args: &StatusArgs) -> Result<ExitCode> {
    let session = Session::open_read_only(&args.ledger)?;
    if args.all_clusters {
        return status_all_clusters(&session, args);
    }
    let tty = std::io::stdout().is_terminal();
    loop {
        let mut rows = collect(&session, args.hours)?;
        super::remediation::annotate(&session, &mut rows)?;
        let text = if args.format.is_json() {
            let doc = StatusOutput::new(&rows);
            if args.watch { output::document_line("status", &doc) } else { output::document("status", &doc) }
        } else {
            let mut t = String::new();
            if args.watch {
                if tty {
                    // The screen is cleared by this program's own sequence, never by text it prints.
                    super::print_control(CLEAR_SCREEN)?;
                }
                t += &format!(
                    "{}  every {}s, Ctrl-C to stop\n",
                    Utc::now().format("%Y-%m-%d %H:%M:%S UTC"),
                    args.interval.as_secs()
                );
            }
            t += &status::render_table(&rows, &session.cluster.name, Utc::now(), args.verbose);
            t
        };
        super::print(&text)?;
        if !args.watch {
            let bad = rows.iter().any(|r| r.ledger_status.is_active() && r.verdict.verdict.is_bad());
            return Ok(if bad { ExitCode::from(EXIT_PROBLEMS) } else { ExitCode::SUCCESS });
        }
        std::thread::sleep(args.interval);
    }
}

/// Home and clear, before each `status --watch` table on a terminal.
const CLEAR_SCREEN: &str = "\x1b[H\x1b[2J";

fn matrix(session: &Session, rank_by: Option<&str>) -> Result<Matrix> {
    let attempts = results::finished_attempts(session.ledger.as_ref())?;
    let scorings = scorings(session)?;
    let mut m = results::build_matrix(&attempts, rank_by, &session.cluster.verify, &scorings)?;
    results::attach_gpu(&mut m, &session.ledger.gpu_seconds()?);
    results::attach_trials(&mut m, session.ledger.as_ref(), Bootstrap::default())?;
    Ok(m)
}

/// The presets' scoring per benchmark family: each preset's datasets, named as the ledger's
/// families name them (`dev_set_v2_2.0x` counts as `dev_set_v2` where a family row says so).
fn scorings(session: &Session) -> Result<results::Scorings> {
    let mut declarations = Vec::new();
    for (_, _, preset) in config::load_presets(&session.presets_dir)? {
        for dataset in &preset.datasets {
            let family = session.ledger.family_of(&Preset::benchmark_of(dataset))?;
            declarations.push((family, preset.scoring));
        }
    }
    Ok(results::Scorings::from_declarations(declarations))
}

/// `submitter results [--json|--csv]`.
pub(crate) fn results(args: &ResultsArgs) -> Result<ExitCode> {
    let session = Session::open_read_only(&args.ledger)?;
    let m = matrix(&session, args.rank_by.as_deref())?;
    let text = if args.format.is_json() {
        output::document("results", &ResultsOutput::from(&m))
    } else if args.csv {
        results::render_csv(&m)
    } else {
        {
            let terminal = crate::term::Terminal::stdout();
            results::render_text(&m, &terminal)
                + &results::render_trials_text(&m)
                + &results::render_gpu_text(&m, &terminal)
        }
    };
    super::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// `submitter compare A B [C …]`.
pub(crate) fn compare(args: &CompareArgs) -> Result<ExitCode> {
    if let Some(twice) = args.models.iter().enumerate().find_map(|(i, m)| args.models[..i].contains(m).then_some(m)) {
        bail!("compare: {twice} is named twice: name each model once");
    }
    let session = Session::open(&args.ledger)?;
    let bootstrap = Bootstrap { seed: args.seed, ..Bootstrap::default() };
    if let [a, b] = args.models.as_slice() {
        return compare_two(args, &session, a, b, bootstrap);
    }
    let scorings = scorings(&session)?;
    if let Some(benchmark) = args.benchmark.as_deref().filter(|b| !scorings.ranked(b)) {
        bail!(
            "compare --benchmark {benchmark}: not a ranked benchmark, so {} models cannot be ranked on it — name a ranked one ({}) or two models to pair",
            args.models.len(),
            scorings.ranked_families()
        );
    }
    let ranking = compare::rank_models(
        &*session.ledger,
        &args.models,
        args.benchmark.as_deref(),
        &session.cluster.verify,
        &scorings,
        bootstrap,
    )?;
    if ranking.rankings.is_empty() {
        bail!(
            "compare: none of the {} models has a finished attempt on a ranked benchmark{}; `submitter results` lists what each has",
            args.models.len(),
            args.benchmark.as_deref().map(|b| format!(" matching `{b}`")).unwrap_or_default()
        );
    }
    let text = if args.format.is_json() {
        output::document("compare.ranking", &RankingDocument::from(&ranking))
    } else if args.csv {
        compare::render_ranking_csv(&ranking)
    } else {
        compare::render_ranking_text(&ranking)
    };
    super::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn compare_two(args: &CompareArgs, session: &Session, a: &str, b: &str, bootstrap: Bootstrap) -> Result<ExitCode> {
    let c = compare::compare(&*session.ledger, a, b, args.benchmark.as_deref(), bootstrap)?;
    if c.benchmarks.is_empty() && c.skipped.is_empty() {
        bail!(
            "compare {a} {b}: no benchmark{} where both have a finished attempt; `submitter results` lists what each has",
            args.benchmark.as_deref().map(|b| format!(" matching `{b}`")).unwrap_or_default()
        );
    }
    let text = if args.format.is_json() {
        output::document("compare", &c)
    } else if args.csv {
        compare::render_csv(&c)
    } else {
        compare::render_text(&c)
    };
    super::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn score_lines(metrics: Option<&serde_json::Value>, settings: &VerifySettings) -> Vec<String> {
    let Some(m) = metrics.filter(|m| !m.is_null()) else { return Vec::new() };
    let s = results::summary_from_metrics(m);
    let audit = results::audit_of(&s, settings);
    let mut lines = vec![format!(
        "mean reward {} over {} trials: {} valid, {} errored ({} infra{})",
        s.mean_reward.map_or("-".into(), |v| format!("{v:.3}")),
        s.n_trials,
        s.n_valid,
        s.n_errors,
        s.n_infra_errors,
        if s.infra_errors.is_empty() {
            String::new()
        } else {
            format!(": {}", s.infra_errors.iter().map(|(k, v)| format!("{k} × {v}")).collect::<Vec<_>>().join(", "))
        }
    )];
    lines.push(if audit.complete {
        format!(
            "audit: complete ({} valid of {} expected)",
            audit.valid,
            audit.expected.map_or("?".into(), |e| e.to_string())
        )
    } else {
        format!("audit: INCOMPLETE — {} — resume rather than accept", audit.reasons.join("; "))
    });
    lines
}

fn check_of(run_dir: Option<&str>, settings: &VerifySettings, skip: bool) -> Option<RunCheck> {
    if skip {
        return None;
    }
    let dir = Path::new(run_dir?);
    check::check_run_dir(dir, settings, Utc::now()).ok()
}

/// The pair the report's heat map compares: `--pair A B`, which must have a benchmark both ran with
/// per-trial facts, else the first two models of the ranking on `rank_by` (none when they cannot be
/// compared).
fn report_pair(session: &Session, m: &Matrix, named: Option<&[String]>) -> Result<Option<compare::Comparison>> {
    let (a, b) = match named {
        Some([a, b]) if a == b => bail!("report --pair {a} {a}: name two different models"),
        Some([a, b]) => (a.clone(), b.clone()),
        _ => {
            let order = m.models_by_rank();
            let ranked = m.rank_by.as_deref().and_then(|r| m.ranking(r)).map_or(0, |r| r.standings.len());
            match order.as_slice() {
                [a, b, ..] if ranked >= 2 => (a.to_string(), b.to_string()),
                _ => return Ok(None),
            }
        }
    };
    let c = compare::compare(&*session.ledger, &a, &b, None, Bootstrap::default())?;
    if c.benchmarks.is_empty() {
        if named.is_some() {
            bail!(
                "report --pair {a} {b}: no benchmark where both have a finished attempt with per-trial facts; `submitter compare {a} {b}` says why"
            );
        }
        return Ok(None);
    }
    Ok(Some(c))
}

/// `submitter report --html FILE`.
pub(crate) fn report(args: &ReportArgs) -> Result<ExitCode> {
    // Checked before any work: a mistyped directory is an error, never created (issue 21).
    if let Some(parent) = args.html.parent().filter(|p| !p.as_os_str().is_empty())
        && !parent.is_dir()
    {
        bail!(
            "--html {}: directory {} does not exist: create it first, or write the report elsewhere",
            args.html.display(),
            parent.display()
        );
    }
    let session = Session::open_read_only(&args.ledger)?;
    let settings = &session.cluster.verify;
    let m = matrix(&session, args.rank_by.as_deref())?;
    // One collection for both: this cluster's rows are the team view's local ones.
    let view = collect_team(&session, args.hours)?;
    let jobs: Vec<StatusRow> = view.jobs.iter().filter_map(|j| j.local.clone()).collect();
    let mut runs = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for job in &jobs {
        let attempt = session.ledger.attempt(crate::ledger::AttemptId(job.attempt))?;
        seen.insert(job.attempt);
        runs.push(RunEvidence {
            attempt: job.attempt,
            model: job.model.clone(),
            benchmark: job.benchmark.clone(),
            cluster: job.cluster.clone(),
            run_tag: job.run_tag.clone(),
            run_dir: job.run_dir.clone(),
            slurm_job_id: job.slurm_job_id.clone(),
            ledger_status: job.ledger_status.to_string(),
            reason: job.ledger_reason.clone(),
            verdict: Some(job.clone()),
            check: check_of(job.run_dir.as_deref(), settings, args.no_check),
            score: score_lines(attempt.as_ref().and_then(|a| a.metrics.as_ref()), settings),
        });
    }
    for cell in m.cells.iter().chain(&m.earlier) {
        if !seen.insert(cell.attempt_id.0) {
            continue;
        }
        let attempt = session.ledger.attempt(cell.attempt_id)?;
        runs.push(RunEvidence {
            attempt: cell.attempt_id.0,
            model: cell.model.clone(),
            benchmark: cell.benchmark.clone(),
            cluster: cell.cluster.clone(),
            run_tag: cell.run_tag.clone(),
            run_dir: cell.run_dir.clone(),
            slurm_job_id: attempt.as_ref().and_then(|a| a.slurm_job_id.clone()),
            ledger_status: attempt.as_ref().map_or("finished".into(), |a| a.status.to_string()),
            reason: attempt.as_ref().map_or(String::new(), |a| a.reason.clone()),
            verdict: None,
            check: check_of(cell.run_dir.as_deref(), settings, args.no_check),
            score: score_lines(attempt.as_ref().and_then(|a| a.metrics.as_ref()), settings)
                .into_iter()
                .chain(cell.trials.as_ref().map(|t| {
                    format!(
                        "from per-trial facts (mean ± task-clustered SE [95% bootstrap interval], points): {}",
                        results::trials_line(t)
                    )
                }))
                .chain([cell.provenance.describe()])
                .collect(),
        });
    }
    let pair = report_pair(&session, &m, args.pair.as_deref())?;
    let html = report::render_html(&ReportInput {
        title: &args.title,
        generated_at: Utc::now(),
        matrix: &m,
        jobs: &jobs,
        runs: &runs,
        team: Some(&view),
        pair: pair.as_ref(),
    });
    std::fs::write(&args.html, html).with_context(|| format!("writing {}", args.html.display()))?;
    super::print(&format!(
        "wrote {} ({} model(s) × {} benchmark(s), {} job(s))\n",
        args.html.display(),
        m.models.len(),
        m.benchmarks.len(),
        jobs.len()
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// Where `logs` looks: the run dir and, when known, the Slurm job id.
/// The run dir, the job, and for a leg of a shared job its group dir (where the engine's log and the
/// job's Slurm output are).
fn resolve_target(args: &LogsArgs) -> Result<(PathBuf, Option<String>, Option<PathBuf>)> {
    let path = Path::new(&args.target);
    if path.is_dir() {
        return Ok((path.to_path_buf(), None, None));
    }
    let session = match &args.cluster {
        Some(cluster) => Some(Session::open(&LedgerArgs {
            cluster: Some(cluster.clone()),
            store: args.store.clone(),
            dirs: args.dirs.clone(),
        })?),
        None => None,
    };
    let is_job = !args.target.is_empty() && args.target.chars().all(|c| c.is_ascii_digit());
    if is_job {
        if let Some(session) = &session {
            let ledger: &dyn Ledger = session.ledger.as_ref();
            let mut candidates = ledger.active()?;
            candidates.extend(ledger.latest_per_pair()?.into_iter().map(|p| p.latest));
            if let Some(attempt) = candidates.iter().find(|a| a.slurm_job_id.as_deref() == Some(&args.target))
                && let Some(dir) = run_dir_of(attempt)
            {
                // A shared job's own files are its group dir's.
                let dir = shared_group_dir(attempt).unwrap_or(dir);
                return Ok((dir, Some(args.target.clone()), None));
            }
        }
        let id: JobId = args.target.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
        if let Some(out) = SlurmCli::new().show(id)?.and_then(|info| info.std_out)
            && let Some(dir) = out.parent()
        {
            return Ok((dir.to_path_buf(), Some(args.target.clone()), None));
        }
        bail!(
            "job {} is neither in the ledger{} nor known to Slurm",
            args.target,
            if session.is_none() { " (give --cluster to search it)" } else { "" }
        );
    }
    let Some(session) = &session else {
        bail!("{}: not a directory; give --cluster C to look up the run tag in the ledger", args.target);
    };
    let attempts = session.ledger.find_by_run_tag(&args.target)?;
    if let Some(a) = attempts.last() {
        let dir = run_dir_of(a).with_context(|| format!("attempt {} records no run dir", a.id))?;
        return Ok((dir, a.slurm_job_id.clone(), shared_group_dir(a)));
    }
    let jobs_dir = session.context().expand("paths.jobs_dir", &session.cluster.paths.jobs_dir)?;
    let dir = jobs_dir.join(&args.target);
    if dir.is_dir() {
        return Ok((dir, None, None));
    }
    bail!("no run dir or ledger attempt for run tag {} (looked in {})", args.target, jobs_dir.display())
}

fn file_for(dir: &Path, group: Option<&Path>, job: Option<&str>, args: &LogsArgs) -> Result<PathBuf> {
    match (file_in(dir, job, args, group.is_some()), group) {
        (Ok(path), _) => Ok(path),
        // A leg of a shared job: the engine's log and the job's Slurm output are the group dir's.
        (Err(err), Some(group)) => file_in(group, job, args, false).map_err(|_| err),
        (Err(err), None) => Err(err),
    }
}

/// The file `args` asks for in `dir`; `leg`: `dir` is a shared job's leg, whose payload log is its own.
fn file_in(dir: &Path, job: Option<&str>, args: &LogsArgs, leg: bool) -> Result<PathBuf> {
    let newest = |prefix: &str, suffix: &str| -> Option<PathBuf> {
        std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with(prefix) && n.ends_with(suffix) && !n.ends_with(".prev")
            })
            .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
            .map(|e| e.path())
    };
    let (what, found) = if args.engine {
        (
            "engine log",
            Some(dir.join(launch_spec::records::ENGINE_LOG)).filter(|p| p.is_file()).or_else(|| newest("vllm", ".log")),
        )
    } else if args.harbor {
        ("Harbor log", Some(dir.join(launch_spec::records::HARBOR_LOG)).filter(|p| p.is_file()))
    } else if args.tunnel {
        ("tunnel log", check::find_tunnel_log(dir))
    } else {
        let by_job = job.map(|j| dir.join(format!("slurm-{j}.out"))).filter(|p| p.is_file());
        let leg_log = Some(dir.join(launch_spec::shared::LEG_LOG_FILE)).filter(|p| leg && p.is_file());
        ("Slurm output (payload's log)", by_job.or(leg_log).or_else(|| newest("slurm-", ".out")))
    };
    if let Some(path) = found {
        return Ok(path);
    }
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    bail!("no {what} in {} (files: {})", dir.display(), if files.is_empty() { "none".into() } else { files.join(", ") })
}

/// `submitter logs RUN|JOB [--engine|--harbor|--tunnel] [-f]`.
pub(crate) fn logs(args: &LogsArgs) -> Result<ExitCode> {
    let (dir, job, group) = resolve_target(args)?;
    let path = file_for(&dir, group.as_deref(), job.as_deref(), args)?;
    // A regular file (a FIFO in the run dir would hang `logs`), never through a symlink.
    let mut file = launch_spec::fsread::open_regular(&path, launch_spec::fsread::Links::Refuse)
        .with_context(|| format!("opening {}", path.display()))?;
    let tail = args.tail.or(if args.follow { Some(20) } else { None });
    let mut offset = match tail {
        Some(n) => start_of_last_lines(&mut file, n)?,
        None => 0,
    };
    let mut out = std::io::stdout().lock();
    offset += copy_from(&mut file, offset, &mut out)?;
    if !args.follow {
        return Ok(ExitCode::SUCCESS);
    }
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        if len < offset {
            // Truncated or replaced: start over.
            file = launch_spec::fsread::open_regular(&path, launch_spec::fsread::Links::Refuse)?;
            offset = 0;
        }
        offset += copy_from(&mut file, offset, &mut out)?;
    }
}

/// Copies from `offset` to the end; a closed pipe ends quietly.
fn copy_from(file: &mut std::fs::File, offset: u64, out: &mut impl Write) -> Result<u64> {
    file.seek(SeekFrom::Start(offset))?;
    let mut buf = vec![0u8; 1 << 16];
    let mut copied = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        match out.write_all(&buf[..n]) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
            other => other?,
        }
        copied += n as u64;
    }
    match out.flush() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        other => other?,
    }
    Ok(copied)
}

/// How far back from the end `logs -n` looks for line starts: a log without newlines (a 20 GB
/// sparse file is zeros) would otherwise be read whole, backwards.
const TAIL_SCAN_LIMIT: u64 = 16 << 20;

/// The offset where the last `n` lines start, looking back at most [`TAIL_SCAN_LIMIT`] bytes (past
/// that, the window's start: the end of an over-long line).
fn start_of_last_lines(file: &mut std::fs::File, n: usize) -> Result<u64> {
    let len = file.metadata()?.len();
    let floor = len.saturating_sub(TAIL_SCAN_LIMIT);
    let mut pos = len;
    let mut newlines = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    // A trailing newline ends the last line; it does not start a new one.
    let mut skip_last = true;
    while pos > floor {
        let step = (buf.len() as u64).min(pos - floor);
        pos -= step;
        file.seek(SeekFrom::Start(pos))?;
        file.read_exact(&mut buf[..step as usize])?;
        for i in (0..step as usize).rev() {
            if buf[i] == b'\n' {
                if skip_last && pos + i as u64 == len - 1 {
                    skip_last = false;
                    continue;
                }
                newlines += 1;
                if newlines == n {
                    return Ok(pos + i as u64 + 1);
                }
            }
        }
        skip_last = false;
    }
    Ok(floor)
}
