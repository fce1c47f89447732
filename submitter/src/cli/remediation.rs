//! `submitter remediate [--dry-run]` and `submitter release`, and the one remediation pass that
//! `launch` runs each iteration (so the listener too)
//! (docs/verification.md "Remediation"; the deciding code is `crate::remediate`).

use std::process::ExitCode;

use crate::executor::NotSubmitted;
use crate::notify;
use crate::observe::Observation;
use crate::output::{self, FormatArgs};
use crate::planner::PlannedJob;
use crate::remediate::{self, Decision};
use crate::transition::Recorder;
use crate::verify::status::{self as vstatus, Collect};
use crate::verify::verdict::StatusRow;
use anyhow::{Context, Result, bail};
use chrono::Utc;
use serde::Serialize;

use super::session::{LedgerArgs, Session};

/// How far back ended attempts are judged (an engine that failed at start ended by itself).
const ENDED_WITHIN_H: u64 = 24;

#[derive(clap::Args)]
pub(crate) struct RemediateArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    /// Print the decisions and change nothing: no scancel, no ledger write.
    #[arg(long)]
    dry_run: bool,
    /// `--format json`: a `remediate` document.
    #[command(flatten)]
    format: FormatArgs,
}

#[derive(clap::Args)]
pub(crate) struct ReleaseArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    #[arg(long, value_name = "M")]
    model: String,
    /// The benchmark (or its family) as `plan` shows it.
    #[arg(long, value_name = "B")]
    benchmark: String,
    /// The Harbor agent of the pair, when the model and benchmark are held under several.
    #[arg(long, value_name = "A")]
    agent: Option<String>,
}

#[derive(clap::Args)]
pub(crate) struct HoldArgs {
    #[command(flatten)]
    ledger: LedgerArgs,
    #[arg(long, value_name = "M")]
    model: String,
    /// The benchmark (or its family) as `plan` and `status` show it (`tb2`, `v2`, `swebench`…).
    #[arg(long, value_name = "B")]
    benchmark: String,
    /// The Harbor agent of the pair (default: the one its attempts ran, else terminus-2).
    #[arg(long, value_name = "A")]
    agent: Option<String>,
    /// Why, in words: shown by `plan` and `status` until `release`.
    #[arg(long, value_name = "TEXT", default_value = "")]
    reason: String,
}

/// The verdicts of the cluster's jobs as `world` observed them (kept in the state dir unless
/// `dry_run`: the reconcile is what writes observations, `status` only reads them), then the
/// remediation decisions for them, carried out through `recorder` unless `dry_run`. Returns the
/// decisions made (for a dry run: the ones that would be).
/// A `scancel` that fails is warned about and tried again after a back-off; with
/// `fail_on_scancel` (the `remediate` command) the pass then ends with that Slurm error (exit 4).
pub(crate) fn pass(
    session: &Session,
    recorder: &Recorder,
    world: &Observation,
    dry_run: bool,
    fail_on_scancel: bool,
) -> Result<Vec<Decision>> {
    let opts = Collect {
        cluster: &session.cluster.name,
        state_dir: &session.state_dir,
        settings: &session.cluster.verify,
        ended_within_h: Some(ENDED_WITHIN_H),
        now: world.now,
        persist: !dry_run,
        world,
    };
    let rows = vstatus::collect(session.ledger.as_ref(), &session.slurm, &opts).context("verdicts")?;
    let settings = &session.cluster.remediation;
    if !settings.enabled {
        return Ok(Vec::new());
    }
    let now = world.now;
    let mut backoff = SCANCEL_BACKOFF.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cancel_failed = None;
    if !dry_run {
        // An act an earlier pass recorded but could not finish (its scancel or the ledger failed).
        let reconciled = remediate::reconcile(recorder, &session.slurm, &session.cluster.name, &mut backoff, now)
            .context("remediation")?;
        for attempt in reconciled.completed {
            tracing::info!("remediation: completed the recorded act on attempt {attempt}");
        }
        for (attempt, error, next) in reconciled.cancel_failed {
            cancel_failed = Some(cancel_refused(attempt.0, error, next));
        }
    }
    let states = remediate::pair_states(session.ledger.as_ref()).context("remediation")?;
    let decisions = remediate::plan(&rows, world, &states, settings, &session.cluster.verify);
    if dry_run {
        return Ok(decisions);
    }
    let username = std::env::var("USER").unwrap_or_else(|_| "unknown".to_string());
    let mut done = Vec::with_capacity(decisions.len());
    for decision in decisions {
        if !backoff.due(decision.attempt, now) {
            continue;
        }
        match remediate::carry_out(&decision, recorder, &session.slurm, &username) {
            Ok(recorded) => {
                backoff.succeeded(decision.attempt);
                if recorded {
                    done.push(decision);
                }
            }
            // One job Slurm will not cancel blocks no other decision and no submission (issue 32
            // item 11): warned, asked again after a back-off, the command's status says so.
            Err(remediate::RemediateError::Slurm(error)) => {
                let next = backoff.failed(decision.attempt, now);
                cancel_failed = Some(cancel_refused(decision.attempt, error, next));
            }
            Err(error) => return Err(error).with_context(|| format!("remediation of attempt {}", decision.attempt)),
        }
    }
    drop(backoff);
    if let (Some(error), true) = (cancel_failed, fail_on_scancel) {
        return Err(error).context("remediation: a job could not be cancelled");
    }
    Ok(done)
}

/// Holds `job`'s pair when preflight refused the launch of a pair remediation adjusted (its retry's
/// new spec, issue 32 item 12): the next iteration sees a hold with the reason instead of running
/// preflight into the same refusal. Any preflight refusal of an adjusted pair holds it (the
/// adjustment stays with the pair's later launches); a person releases it once it is fixed.
pub(crate) fn hold_a_refused_retry(session: &Session, job: &PlannedJob, refused: &NotSubmitted) {
    let NotSubmitted::Preflight(why) = refused else { return };
    if job.remedy.is_none() {
        return;
    }
    let key = (job.model.clone(), job.family.clone(), job.agent.clone());
    let username = std::env::var("USER").unwrap_or_else(|_| "unknown".to_string());
    match remediate::hold_refused_retry(session.ledger.as_ref(), &key, &session.cluster.name, &username, why) {
        Ok(()) => tracing::warn!(
            "remediation: {} on {} held: its retried launch fails preflight (`submitter release` once fixed)",
            job.model,
            job.benchmark
        ),
        Err(error) => tracing::warn!("remediation: {} on {} not held: {error}", job.model, job.benchmark),
    }
}

/// A job Slurm would not cancel: warned about, asked again at `next`; the error the pass may end with.
fn cancel_refused(
    attempt: i64,
    error: crate::slurm::SlurmError,
    next: chrono::DateTime<Utc>,
) -> remediate::RemediateError {
    tracing::warn!(
        "remediation of attempt {attempt}: {error}; the other decisions go on, this one is tried again after {}",
        next.format("%H:%M:%S UTC")
    );
    remediate::RemediateError::Slurm(error)
}

/// Failed `scancel`s of this process (a `--watch` loop runs many passes), by attempt.
static SCANCEL_BACKOFF: std::sync::Mutex<remediate::ScancelBackoff> =
    std::sync::Mutex::new(remediate::ScancelBackoff::new());

/// Lines for people, one per decision (`would` for a dry run).
pub(crate) fn lines(decisions: &[Decision], dry_run: bool) -> String {
    decisions
        .iter()
        .map(|d| if dry_run { format!("(dry run) {}\n", d.line()) } else { format!("{}\n", d.line()) })
        .collect()
}

/// Fills each row's `remedy` from the ledger: what remediation did about the attempt, and a held pair.
pub(crate) fn annotate(session: &Session, rows: &mut [StatusRow]) -> Result<()> {
    let records = session.ledger.remediations().context("reading remediation records")?;
    if records.is_empty() {
        return Ok(());
    }
    let states = crate::ledger::fold_remediations(&records);
    let now = Utc::now();
    for row in rows.iter_mut() {
        let mut parts: Vec<String> = records
            .iter()
            .filter(|r| r.attempt.is_some_and(|a| a.0 == row.attempt))
            .map(|r| remediate::record_text(r, now))
            .collect();
        let key = (row.model.clone(), row.family.clone(), row.agent.clone());
        let state = states.get(&key);
        // An active attempt of a pair remediation adjusted runs with the change: say which.
        if row.ledger_status.is_active()
            && let Some(retry) = state.filter(|s| !s.adjustment.is_empty()).and_then(|_| {
                records.iter().rev().find(|r| {
                    r.action == crate::domain::RemediationAct::Retry
                        && (&r.model, &r.family, &r.agent) == (&key.0, &key.1, &key.2)
                        && r.attempt.is_some_and(|a| a.0 != row.attempt)
                })
            })
        {
            parts.push(format!(
                "launched after the retry of attempt {} ({}): {}",
                retry.attempt.map_or(0, |a| a.0),
                retry.finding,
                crate::spec_build::describe_adjustment(&state.expect("checked").adjustment)
            ));
        }
        if let Some(hold) = state.and_then(|s| s.held.as_ref()).filter(|h| h.attempt.map(|a| a.0) != Some(row.attempt))
        {
            parts.push(remediate::held_text(hold, &row.benchmark));
        }
        if !parts.is_empty() {
            row.remedy = Some(parts.join("; "));
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct RemediateOutput<'a> {
    dry_run: bool,
    decisions: &'a [Decision],
}

pub(crate) fn remediate_command(args: &RemediateArgs) -> Result<ExitCode> {
    let session = if args.dry_run { Session::open_dry(&args.ledger)? } else { Session::open(&args.ledger)? };
    if !session.cluster.remediation.enabled {
        bail!(
            "remediation is off for cluster {0}: turn it on in clusters/{0}.yaml (`remediation: {{enabled: true}}`, docs/verification.md)",
            session.cluster.name
        );
    }
    // The same exclusion as `launch`: a pass acts on the jobs a listener also acts on.
    let _lock = if args.dry_run { None } else { Some(session.lock()?) };
    let world = Observation::take(session.ledger.as_ref(), &session.slurm, &session.cluster.name, Utc::now())?;
    let team = super::consumers::team_link(&session, false)?;
    let mirror = if args.dry_run { None } else { super::consumers::default_mirror(&session, team.as_ref()) };
    let recorder = Recorder::new(session.ledger.as_ref(), mirror.as_ref());
    let decisions = pass(&session, &recorder, &world, args.dry_run, true)?;
    let notifier = super::consumers::open_notifier(&session, args.dry_run)?;
    let mut events = notify::transition_events(&recorder.take());
    events.extend(notify::remediation_events(&decisions));
    super::consumers::tell(&session, notifier.as_ref(), super::consumers::Told::Events(events));
    super::print(&if args.format.is_json() {
        output::document("remediate", &RemediateOutput { dry_run: args.dry_run, decisions: &decisions })
    } else {
        lines(&decisions, args.dry_run)
            + &format!(
                "{} decision(s){}\n",
                decisions.len(),
                if args.dry_run { ", nothing changed (dry run)" } else { "" }
            )
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `submitter hold`: the counterpart of `release` — the pair is not submitted again until released.
pub(crate) fn hold_command(args: &HoldArgs) -> Result<ExitCode> {
    let model = crate::config::args::model(&args.model).map_err(|e| anyhow::anyhow!("--model: {e}"))?;
    let session = Session::open(&args.ledger)?;
    let family = session.benchmark_family(&args.benchmark)?;
    let agent = match &args.agent {
        Some(agent) => agent.clone(),
        None => {
            let pairs = session.ledger.latest_per_pair()?;
            let mut agents: Vec<String> =
                pairs.into_iter().filter(|p| p.model == *model && p.family == family).map(|p| p.agent).collect();
            agents.dedup();
            match agents.len() {
                0 => crate::config::preset::DEFAULT_AGENT.to_string(),
                1 => agents.remove(0),
                _ => bail!(
                    "{model} on {} ran under several agents ({}): say --agent A",
                    args.benchmark,
                    agents.join(", ")
                ),
            }
        }
    };
    let key = (model.to_string(), family, agent);
    if remediate::pair_states(session.ledger.as_ref())?.get(&key).is_some_and(|s| s.held.is_some()) {
        bail!("{model} on {} ({}) is already held (`submitter release` clears it)", args.benchmark, key.2);
    }
    let username = std::env::var("USER").unwrap_or_else(|_| "unknown".to_string());
    remediate::hold(session.ledger.as_ref(), &key, &session.cluster.name, &username, &args.reason)?;
    super::print(&format!(
        "held {model} on {} ({}): no launch submits it until `submitter release --model {model} --benchmark {}`\n",
        args.benchmark, key.2, args.benchmark
    ))?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn release_command(args: &ReleaseArgs) -> Result<ExitCode> {
    let session = Session::open(&args.ledger)?;
    let family = session.benchmark_family(&args.benchmark)?;
    let states = remediate::pair_states(session.ledger.as_ref())?;
    let held: Vec<_> = states
        .iter()
        .filter(|((m, f, a), s)| {
            *m == args.model && *f == family && args.agent.as_ref().is_none_or(|x| x == a) && s.held.is_some()
        })
        .map(|(key, _)| key.clone())
        .collect();
    if held.is_empty() {
        bail!("{} on {} is not held (nothing to release)", args.model, args.benchmark);
    }
    if held.len() > 1 {
        let agents: Vec<&str> = held.iter().map(|k| k.2.as_str()).collect();
        bail!(
            "{} on {} is held under several agents ({}): say --agent A",
            args.model,
            args.benchmark,
            agents.join(", ")
        );
    }
    let username = std::env::var("USER").unwrap_or_else(|_| "unknown".to_string());
    remediate::release(session.ledger.as_ref(), &held[0], &session.cluster.name, &username)?;
    super::print(&format!(
        "released {} on {} ({}): the next launch submits it again, without remediation's adjustments\n",
        args.model, args.benchmark, held[0].2
    ))?;
    Ok(ExitCode::SUCCESS)
}
