//! `plan`'s and `launch`'s human text (issue 36 item 2): one line per pair in a table that fits the
//! terminal, problems shared by many pairs printed once with a count ([`crate::term`]), the
//! per-pair details (settings and their sources, readiness budgets) only with `-v` — `--json` has
//! them all. Rendering only: what the plan decided is [`crate::planner`]'s.

use crate::planner::{Blocked, Plan, PlannedJob};
use crate::settings::Source;
use crate::term::{Problem, Style, Terminal, group_problems, problem_lines};

/// `allocation.source` as the contract has it since issue 24 (`--allocation`, `preset`,
/// `profile`); `settings.allocation` names the preset or profile too.
pub fn allocation_source(source: &Source) -> &'static str {
    match source {
        Source::Cli => "--allocation",
        Source::Preset(_) => "preset",
        Source::Profile(_) => "profile",
        _ => "default",
    }
}

fn pair(job: &PlannedJob) -> String {
    format!("{} {}", job.model, job.benchmark)
}

/// Problems of `jobs` chosen by `problem`, grouped by their text.
fn grouped<'a>(
    jobs: impl IntoIterator<Item = &'a PlannedJob>,
    problem: impl Fn(&PlannedJob) -> Option<String>,
) -> Vec<Problem> {
    group_problems(jobs.into_iter().filter_map(|job| problem(job).map(|text| (pair(job), text))))
}

/// The pairs flagged for a person (already running elsewhere, a result to look at), grouped.
pub fn flag_lines(terminal: &Terminal, planned: &[PlannedJob]) -> String {
    problem_lines(terminal, "flagged", &grouped(planned, |job| job.flag.clone()), Style::Warning)
}

/// The changes remediation makes to pairs' launches (their ledger adjustments), grouped.
fn remedy_lines(terminal: &Terminal, planned: &[PlannedJob]) -> String {
    problem_lines(terminal, "remedied", &grouped(planned, |job| job.remedy.clone()), Style::Warning)
}

/// Why a blocked pair is not submitted (refused, throttled, held).
fn blocked_why(job: &PlannedJob) -> Option<&str> {
    match &job.blocked {
        Some(Blocked::Refused(why) | Blocked::Throttled(why) | Blocked::Held(why)) => Some(why),
        None => None,
    }
}

/// The shared jobs and pools of a plan (which pairs share a job, its time, its capacity, its argv
/// once) and the `shared`/`pool` legs that are planned otherwise, and why (once per model).
fn shared_lines(plan: &Plan) -> String {
    let mut out = String::new();
    for group in &plan.shared {
        let legs: Vec<&PlannedJob> = group.legs.iter().map(|&i| &plan.jobs[i]).collect();
        let source = legs.first().map_or("default", |j| allocation_source(&j.settings.allocation.source));
        match &group.pool {
            Some(pool) => {
                let members: Vec<String> =
                    pool.members.iter().map(|(model, legs)| format!("{model} ({})", legs.len())).collect();
                out += &format!(
                    "pool      {} (pool {} of {}, allocation pool, from {source}): {} models, {} legs, one engine, in order: {}\n",
                    group.group_tag,
                    pool.order.0,
                    pool.order.1,
                    pool.members.len(),
                    legs.len(),
                    members.join(" → ")
                );
            }
            None => {
                let names: Vec<&str> = legs.iter().map(|j| j.benchmark.as_str()).collect();
                out += &format!(
                    "shared    {} {}: {} legs in one job, one engine (allocation shared, from {source}): {}\n",
                    group.group_tag,
                    group.model,
                    legs.len(),
                    names.join(", ")
                );
            }
        }
        out += &format!("          time {} = {}\n", group.time, group.time_basis);
        out += &format!("          capacity: {}\n", group.capacity);
        out += &format!("          {}\n", shell_words::join(&group.sbatch));
    }
    let mut told: Vec<(&str, &str)> = Vec::new();
    for job in &plan.jobs {
        let Some(note) = &job.allocation_note else { continue };
        let (label, mode) = match (job.shared_job.is_some(), job.settings.allocation.value) {
            (true, mode) => ("apart    ", mode.as_str()),
            (false, mode) => ("own job  ", mode.as_str()),
        };
        // A pool's reason is the model's: said once.
        if mode == "pool" && job.shared_job.is_some() {
            if told.contains(&(job.model.as_str(), note.as_str())) {
                continue;
            }
            told.push((&job.model, note));
            out += &format!("{label} {}: allocation {mode}, but {note}\n", job.model);
            continue;
        }
        out += &format!("{label} {} {}: allocation {mode}, but {note}\n", job.model, job.benchmark);
    }
    out
}

/// `submitter plan`'s text: the table (one line per pair), the grouped problems, the shared jobs,
/// with `verbose` each pair's settings and readiness budget, the tunnels, `team` (the team
/// history's line) and the counts.
pub fn plan_text(plan: &Plan, terminal: &Terminal, verbose: bool, team: &str) -> String {
    let planned = &plan.jobs;
    let blocked = grouped(planned, |job| blocked_why(job).map(|why| format!("{}: {why}", job.label())));
    let shared_by = |job: &PlannedJob| {
        let why = format!("{}: {}", job.label(), blocked_why(job)?);
        blocked.iter().find(|p| p.text == why).map(|p| p.pairs.len()).filter(|n| *n > 1)
    };
    let mut table = terminal.table(["action", "model", "benchmark", "tp×dp", "timeout", "why"]);
    for job in planned {
        let why = match (blocked_why(job), &job.evidence, shared_by(job)) {
            (Some(_), _, Some(n)) => format!("shared by {n} pairs: see below"),
            (Some(why), _, None) => why.to_string(),
            (None, Some(evidence), _) => format!("{}; evidence: {}", job.reason, evidence.describe()),
            (None, None, _) => job.reason.clone(),
        };
        table.row([
            job.label().to_string(),
            job.model.to_string(),
            job.benchmark.clone(),
            format!("{}x{}", job.resources.tensor_parallel_size, job.resources.data_parallel_size),
            format!("{:.1}x", job.timeout_multiplier),
            why,
        ]);
    }
    let out = table.keep(0).keep(3).keep(4).right(4).render();
    let mut notes = String::new();
    let many: Vec<Problem> = blocked.into_iter().filter(|p| p.pairs.len() > 1).collect();
    notes += &problem_lines(terminal, "blocked", &many, Style::Problem);
    notes += &flag_lines(terminal, planned);
    notes += &remedy_lines(terminal, planned);
    notes += &shared_lines(plan);
    if verbose {
        for job in planned {
            notes += &format!("settings  {} {}: {}\n", job.model, job.benchmark, job.settings.lines().join("; "));
        }
        for job in planned {
            if let Some(spec) = &job.spec {
                notes += &format!("ready     {} {}: {}\n", job.model, job.benchmark, spec.serve.readiness_line());
            }
        }
    }
    let tunnels: std::collections::BTreeSet<(&str, &str)> =
        planned.iter().map(|j| (j.preset.as_str(), j.tunnel.as_str())).collect();
    for (preset, tunnel) in tunnels {
        notes += &format!("tunnel    {preset}: {tunnel}\n");
    }
    notes += team;
    if !verbose && !planned.is_empty() {
        notes += "each pair's settings and readiness budget: -v (or --json)\n";
    }
    let count = |label: &str| planned.iter().filter(|j| j.label() == label).count();
    notes += &format!("{} submit, {} resubmit, {} skip", count("submit"), count("resubmit"), count("skip"));
    for label in ["continue", "refused", "throttled", "held"] {
        if count(label) > 0 {
            notes += &format!(", {} {}", count(label), terminal.paint(label, Style::Problem));
        }
    }
    notes.push('\n');
    out + &terminal.fit(&notes)
}
