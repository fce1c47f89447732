//! `submitter report --html FILE`: one self-contained page (inline CSS and a few lines of inline
//! script, no external asset): the models × benchmarks score matrix as a colour-scaled table whose
//! cells link to their run's evidence further down the page, and the in-flight jobs with their
//! verdicts. The inline script only checks the page: it marks `<body data-anchors-ok="1">` when
//! every in-page link has its target (the browser test reads it).

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use super::Level;
use super::charts::{self, GpuBasis};
use super::check::RunCheck;
use super::compare::Comparison;
use super::plots;
use super::results::{BenchKind, Matrix, short_name};
use super::team::{self, TeamView};
use super::verdict::{StatusRow, VerdictKind};

/// The evidence section of one run (a matrix cell or an in-flight job).
#[derive(Debug, Clone)]
pub(crate) struct RunEvidence {
    pub attempt: i64,
    pub model: String,
    pub benchmark: String,
    pub cluster: String,
    pub run_tag: String,
    pub run_dir: Option<String>,
    pub slurm_job_id: Option<String>,
    pub(crate) ledger_status: String,
    pub reason: String,
    /// `status`'s verdict, for in-flight jobs.
    pub verdict: Option<StatusRow>,
    /// `check`'s findings on the run dir, when it is readable from here.
    pub check: Option<RunCheck>,
    /// Score lines (mean, trials, errors, audit).
    pub score: Vec<String>,
}

pub(crate) struct ReportInput<'a> {
    pub title: &'a str,
    pub(crate) generated_at: DateTime<Utc>,
    pub(crate) matrix: &'a Matrix,
    pub jobs: &'a [StatusRow],
    pub runs: &'a [RunEvidence],
    /// Every cluster on the shared ledger ([`team_section`]); `None` leaves the section out.
    pub team: Option<&'a TeamView>,
    /// The compared pair whose per-task heat map the plots show (`report --pair`, else the first
    /// two of the ranking); `None` leaves it out.
    pub pair: Option<&'a Comparison>,
}

pub fn anchor(attempt: i64) -> String {
    format!("run-{attempt}")
}

/// `lines` as the report's evidence list (nothing when there are none).
fn evidence_list(h: &mut String, lines: &[String]) {
    if lines.is_empty() {
        return;
    }
    h.push_str("<ul class=\"evidence\">");
    for line in lines {
        let _ = write!(h, "<li>{}</li>", escape(line));
    }
    h.push_str("</ul>\n");
}

/// Text for HTML content and quoted attribute values (`&`, `<`, `>`, `"`, `'` escaped).
pub fn escape(text: &str) -> String {
    html_escape::encode_quoted_attribute(text).into_owned()
}

/// Red (0) → amber → green (1).
fn colour(score: f64) -> String {
    let hue = (score.clamp(0.0, 1.0) * 120.0).round();
    format!("hsl({hue}, 65%, 78%)")
}

fn verdict_class(v: VerdictKind) -> &'static str {
    match v {
        VerdictKind::Healthy | VerdictKind::Finished => "good",
        VerdictKind::Starting => "neutral",
        VerdictKind::Stalled => "warn",
        VerdictKind::Dead | VerdictKind::Misconfigured | VerdictKind::Failed => "bad",
    }
}

fn level_class(l: Level) -> &'static str {
    match l {
        Level::Ok => "good",
        Level::Warn => "warn",
        Level::Fail => "bad",
    }
}

const STYLE: &str = r#"
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px 32px; color: #1b1f24; background: #fafbfc; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.meta { color: #57606a; margin-bottom: 16px; }
table { border-collapse: collapse; background: #fff; }
th, td { border: 1px solid #d0d7de; padding: 5px 9px; text-align: left; vertical-align: top; }
th { background: #f0f3f6; font-weight: 600; }
td.score { text-align: center; min-width: 110px; font-variant-numeric: tabular-nums; }
td.score a { color: #1b1f24; text-decoration: none; display: block; }
td.score a:hover { text-decoration: underline; }
td.score .gpu { display: block; font-size: 0.75em; color: #57606a; }
td.empty { color: #8c959f; text-align: center; }
td.incomplete { outline: 2px dashed #9a6700; outline-offset: -4px; }
.se { color: #424a53; font-size: 12px; }
.kind { display: block; font-weight: 400; font-size: 11px; color: #57606a; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; }
.good { background: #dafbe1; color: #116329; } .warn { background: #fff8c5; color: #7d4e00; }
.bad { background: #ffebe9; color: #a40e26; } .neutral { background: #ddf4ff; color: #0a3069; }
section.run { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; padding: 10px 16px; margin: 12px 0; }
section.run:target { border-color: #0969da; box-shadow: 0 0 0 3px rgba(9,105,218,.25); }
ul.evidence { margin: 4px 0 8px 0; padding-left: 22px; color: #424a53; }
.action { color: #0a3069; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; background: #f0f3f6; padding: 1px 4px; border-radius: 4px; word-break: break-all; }
.legend span { display: inline-block; width: 18px; height: 12px; vertical-align: middle; margin: 0 1px; }
svg.spark { vertical-align: middle; margin-right: 6px; } svg.spark polyline { fill: none; stroke-width: 1.5; }
svg.spark.rate polyline, svg.spark.rate circle { stroke: #0969da; fill: none; } svg.spark.rate circle { fill: #0969da; }
svg.spark.progress polyline { stroke: #1a7f37; } svg.spark.progress circle { fill: #1a7f37; }
svg.spark line { stroke: #8c959f; }
.charts { display: flex; flex-wrap: wrap; gap: 12px 40px; } .charts figure { margin: 0; }
.charts figcaption { font-weight: 600; margin-bottom: 4px; }
svg.bars text { font: 12px system-ui, sans-serif; fill: #1b1f24; } svg.bars rect { fill: #8250df; }
td.spark { white-space: nowrap; font-size: 12px; color: #57606a; }
tr.remote td { color: #57606a; }
.plots { display: flex; flex-wrap: wrap; gap: 16px 40px; align-items: flex-start; } .plots figure { margin: 0 0 8px; }
.plots figcaption { font-weight: 600; margin-bottom: 4px; }
svg.plot { background: #fff; border: 1px solid #d0d7de; border-radius: 4px; }
svg.plot text { font: 12px system-ui, sans-serif; fill: #1b1f24; } svg.plot text.tick { fill: #57606a; font-size: 11px; }
svg.plot line.grid { stroke: #eaeef2; } svg.plot line.ci { stroke: #0969da; stroke-width: 2; }
svg.plot circle.mean { fill: #0969da; } svg.plot text.rank { font-weight: 600; }
svg.plot rect.task { stroke: none; }
"#;

/// GPU-hours per benchmark and in total (every recorded attempt; docs/submitter.md "GPU-hours").
fn gpu_section(h: &mut String, m: &Matrix) {
    let t = &m.gpu_totals;
    h.push_str("<h2 id=\"gpu-hours\">GPU-hours</h2>\n");
    if t.attempts == 0 {
        h.push_str("<p>No attempt recorded GPU time yet.</p>\n");
        return;
    }
    h.push_str("<table id=\"gpu\">\n<thead><tr><th>benchmark</th><th>GPU-hours</th></tr></thead>\n<tbody>\n");
    for (b, hours) in &t.by_benchmark {
        let _ = writeln!(h, "<tr><th title=\"{}\">{}</th><td>{hours:.2}</td></tr>", escape(b), escape(&short_name(b)));
    }
    let phases: Vec<String> = crate::gpuhours::PHASES
        .iter()
        .filter_map(|p| t.gpu_seconds_by_phase.0.get(*p).map(|s| format!("{p} {:.2}", s / 3600.0)))
        .collect();
    let _ = writeln!(
        h,
        "<tr><th>total</th><td data-total=\"{:.3}\">{:.2}</td></tr>\n</tbody>\n</table>\n<p class=\"legend\">{} attempt(s), finished or not; by phase: {} · queue wait is never GPU time · a shared job's time is divided among its legs</p>",
        t.gpu_hours,
        t.gpu_hours,
        t.attempts,
        escape(&phases.join(", "))
    );
}

/// The ranking of every ranked benchmark, as a plot of each model's mean and 95% interval in
/// ranking order (docs/results.md "Ranking several models").
fn ranking_section(h: &mut String, m: &Matrix) {
    h.push_str("<h2 id=\"ranking\">Ranking</h2>\n");
    if m.rankings.is_empty() {
        h.push_str("<p>No ranked benchmark has a result yet.</p>\n");
        return;
    }
    h.push_str("<div class=\"plots\">\n");
    for ranking in &m.rankings {
        let _ = writeln!(
            h,
            "<figure><figcaption>{} · {} model(s)</figcaption>{}</figure>",
            escape(&short_name(&ranking.benchmark)),
            ranking.standings.len(),
            plots::intervals_svg(ranking)
        );
    }
    h.push_str("</div>\n<p class=\"legend\">mean (points) and its 95% interval: a bootstrap over tasks where the result has per-trial facts, else mean ± 1.96 · √(p(1−p)/n) · rank = 1 + the models whose interval lies wholly above · = tied: intervals overlap</p>\n");
}

/// One benchmark against another across models, and the compared pair's per-task heat map.
fn plots_section(h: &mut String, m: &Matrix, pair: Option<&Comparison>) {
    h.push_str("<h2 id=\"plots\">Plots</h2>\n<div class=\"plots\">\n");
    let mut drawn = 0;
    if let Some(x) = m.rank_by.as_deref() {
        for y in m.benchmarks.iter().filter(|b| b.as_str() != x).take(MAX_SCATTERS) {
            if let Some(svg) = plots::scatter_svg(m, x, y) {
                drawn += 1;
                let _ = writeln!(
                    h,
                    "<figure><figcaption>{} against {}</figcaption>{svg}</figure>",
                    escape(&short_name(y)),
                    escape(&short_name(x))
                );
            }
        }
    }
    for bench in pair.into_iter().flat_map(|c| c.benchmarks.iter().map(move |b| (c, b))) {
        let (c, b) = bench;
        drawn += 1;
        let _ = writeln!(
            h,
            "<figure><figcaption>{}: {} vs {}, per task</figcaption>{}<div class=\"legend\">{}</div></figure>",
            escape(&short_name(&b.benchmark)),
            escape(&c.a),
            escape(&c.b),
            plots::heatmap_svg(&b.comparisons[0], &c.a, &c.b),
            escape(&b.verdict)
        );
    }
    h.push_str("</div>\n");
    if drawn == 0 {
        h.push_str("<p>Nothing to plot yet: a scatter needs two models with results on two benchmarks, a heat map two models with per-trial facts on one.</p>\n");
    }
}

/// Scatter plots drawn: the ranked benchmark against this many others.
const MAX_SCATTERS: usize = 3;

/// The page. Deterministic for a given input.
pub(crate) fn render_html(input: &ReportInput) -> String {
    let m = input.matrix;
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        escape(input.title)
    );
    let _ = write!(
        h,
        "<h1>{}</h1>\n<div class=\"meta\">Generated {} · {} model(s) × {} benchmark(s) · {} in-flight job(s)</div>\n",
        escape(input.title),
        input.generated_at.format("%Y-%m-%d %H:%M:%S UTC"),
        m.models.len(),
        m.benchmarks.len(),
        input.jobs.len()
    );

    ranking_section(&mut h, m);

    // The matrix.
    h.push_str("<h2 id=\"scores\">Scores</h2>\n");
    if m.models.is_empty() {
        h.push_str("<p>No finished evaluations yet.</p>\n");
    } else {
        h.push_str("<table id=\"matrix\">\n<thead><tr><th>model</th>");
        for b in &m.benchmarks {
            let kind = match m.kinds.get(b) {
                Some(BenchKind::Binary) => "binary · mean ± s.e.",
                Some(BenchKind::PartialCredit) => "partial credit · mean",
                _ => "mean",
            };
            let _ = write!(
                h,
                "<th title=\"{}\">{}<span class=\"kind\">{kind}</span></th>",
                escape(b),
                escape(&short_name(b))
            );
        }
        let _ = write!(
            h,
            "<th>ID mean<span class=\"kind\">swebench-100, tb2, dev_set_v2</span></th><th>rank<span class=\"kind\">{}</span></th></tr></thead>\n<tbody>\n",
            m.rank_by
                .as_deref()
                .map(|r| format!("on {}", escape(&short_name(r))))
                .unwrap_or_else(|| "no binary benchmark".into())
        );
        for model in m.models_by_rank() {
            let _ = write!(h, "<tr><th>{}</th>", escape(model));
            for b in &m.benchmarks {
                match m.cell(model, b) {
                    None => h.push_str("<td class=\"empty\">–</td>"),
                    Some(c) => {
                        let style = c.mean.map(|v| format!(" style=\"background:{}\"", colour(v))).unwrap_or_default();
                        let class = if c.incomplete { "score incomplete" } else { "score" };
                        let title = format!(
                            "{} on {}: {} valid of {} expected, {} errored{}",
                            c.model,
                            c.benchmark,
                            c.n_valid,
                            c.n_expected.map_or("?".into(), |e| e.to_string()),
                            c.n_errors,
                            if c.incomplete {
                                format!(" — incomplete: {}", c.audit_reasons.join("; "))
                            } else {
                                String::new()
                            }
                        );
                        let mean = c.mean.map_or("–".into(), |v| format!("{v:.3}"));
                        let se = c.stderr.map(|s| format!(" <span class=\"se\">±{s:.3}</span>")).unwrap_or_default();
                        let mark = if c.incomplete { " ⚠" } else { "" };
                        let gpu = c
                            .gpu
                            .as_ref()
                            .map(|g| format!("<span class=\"gpu\">{:.2} GPU-h</span>", g.gpu_hours))
                            .unwrap_or_default();
                        let _ = write!(
                            h,
                            "<td class=\"{class}\"{style} data-model=\"{}\" data-benchmark=\"{}\"><a href=\"#{}\" title=\"{}\">{mean}{se}{mark}{gpu}</a></td>",
                            escape(model),
                            escape(b),
                            anchor(c.attempt_id.0),
                            escape(&title)
                        );
                    }
                }
            }
            let id = m
                .id_mean
                .get(model)
                .map(|v| format!("<td class=\"score\" style=\"background:{}\">{v:.3}</td>", colour(*v)));
            h.push_str(&id.unwrap_or_else(|| "<td class=\"empty\">–</td>".into()));
            let _ = writeln!(h, "<td class=\"rank\">{}</td></tr>", m.rank_label(model).unwrap_or_else(|| "–".into()));
        }
        h.push_str("</tbody>\n</table>\n");
        h.push_str(
            "<p class=\"legend\">0 <span style=\"background:hsl(0,65%,78%)\"></span><span style=\"background:hsl(30,65%,78%)\"></span><span style=\"background:hsl(60,65%,78%)\"></span><span style=\"background:hsl(90,65%,78%)\"></span><span style=\"background:hsl(120,65%,78%)\"></span> 1 \
             · ± standard error √(p(1−p)/n), binary benchmarks only · dev_set_v2 is partial-credit: mean only, counts toward the ID mean, never ranks · ⚠ incomplete: resume rather than accept · rank: 1 + models whose 95% interval lies wholly above, = tied</p>\n",
        );
    }

    plots_section(&mut h, m, input.pair);

    if let Some(view) = input.team {
        h.push_str(&team_section(view, input.generated_at));
    }

    gpu_section(&mut h, m);

    // In-flight jobs.
    h.push_str("<h2 id=\"jobs\">In-flight jobs</h2>\n");
    if input.jobs.is_empty() {
        h.push_str("<p>None.</p>\n");
    } else {
        h.push_str("<table id=\"inflight\">\n<thead><tr><th>job</th><th>model</th><th>benchmark</th><th>Slurm</th><th>phase</th><th>trials</th><th>rate</th><th>verdict</th><th>why</th></tr></thead>\n<tbody>\n");
        for j in input.jobs {
            let v = &j.verdict;
            let trials = match (v.trials_finished, v.trials_expected) {
                (Some(f), Some(e)) => format!("{f}/{e}"),
                (Some(f), None) => f.to_string(),
                _ => "–".into(),
            };
            let rate = v.rate.as_ref().map_or("–".into(), |r| format!("{:.1}/min", r.per_min));
            let _ = writeln!(
                h,
                "<tr data-verdict=\"{}\"><td><a href=\"#{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{trials}</td><td>{rate}</td><td><span class=\"badge {}\">{}</span></td><td>{}</td></tr>",
                v.verdict,
                anchor(j.attempt),
                escape(j.slurm_job_id.as_deref().unwrap_or("–")),
                escape(&j.model),
                escape(&short_name(&j.benchmark)),
                escape(&j.slurm),
                escape(&j.phase),
                verdict_class(v.verdict),
                v.verdict,
                escape(&v.summary)
            );
        }
        h.push_str("</tbody>\n</table>\n");
    }

    // Evidence per run.
    h.push_str("<h2 id=\"runs\">Runs: status and evidence</h2>\n");
    for r in input.runs {
        let _ = write!(
            h,
            "<section class=\"run\" id=\"{}\">\n<h3>{} · {}</h3>\n<div>attempt {} · {} · job {} · ledger <b>{}</b>{} · run tag <code>{}</code>{}</div>\n",
            anchor(r.attempt),
            escape(&r.model),
            escape(&r.benchmark),
            r.attempt,
            escape(&r.cluster),
            escape(r.slurm_job_id.as_deref().unwrap_or("–")),
            escape(&r.ledger_status),
            if r.reason.is_empty() { String::new() } else { format!(" ({})", escape(&r.reason)) },
            escape(&r.run_tag),
            r.run_dir.as_ref().map(|d| format!(" · run dir <code>{}</code>", escape(d))).unwrap_or_default()
        );
        evidence_list(&mut h, &r.score);
        if let Some(row) = &r.verdict {
            let v = &row.verdict;
            let _ = writeln!(
                h,
                "<p>Verdict <span class=\"badge {}\">{}</span> {}</p>",
                verdict_class(v.verdict),
                v.verdict,
                escape(&v.summary)
            );
            evidence_list(&mut h, &v.evidence);
            if let Some(a) = &v.action {
                let _ = writeln!(h, "<p class=\"action\">→ {}</p>", escape(a));
            }
        }
        if let Some(c) = &r.check {
            let _ = write!(
                h,
                "<p>Checks: <span class=\"badge {}\">{}</span></p>\n<table class=\"findings\"><tbody>\n",
                level_class(c.verdict),
                c.verdict
            );
            for f in &c.findings {
                let mut detail = String::new();
                for e in &f.evidence {
                    let _ = write!(detail, "<br><code>{}</code>", escape(e));
                }
                if let Some(a) = &f.action {
                    let _ = write!(detail, "<br><span class=\"action\">→ {}</span>", escape(a));
                }
                let _ = writeln!(
                    h,
                    "<tr><td><span class=\"badge {}\">{}</span></td><td>{}</td><td>{}{detail}</td></tr>",
                    level_class(f.level),
                    f.level,
                    f.check,
                    escape(&f.summary)
                );
            }
            h.push_str("</tbody></table>\n");
        }
        h.push_str("</section>\n");
    }
    h.push_str(
        "<script>\n(function () {\n  var links = document.querySelectorAll('a[href^=\"#\"]');\n  var missing = 0;\n  for (var i = 0; i < links.length; i++) {\n    if (!document.getElementById(links[i].getAttribute('href').slice(1))) { missing++; }\n  }\n  document.body.setAttribute('data-links', String(links.length));\n  document.body.setAttribute('data-anchors-ok', missing === 0 ? '1' : '0');\n})();\n</script>\n</body>\n</html>\n",
    );
    h
}

/// GPU-hours in words: `12.5 GPU-h`, `~` when estimated.
fn gpu_words(gpu: Option<(f64, GpuBasis)>) -> String {
    gpu.map_or("–".into(), |(s, b)| {
        format!("{}{:.1} GPU-h", if b == GpuBasis::Estimated { "~" } else { "" }, s / 3600.0)
    })
}

/// The team view: every cluster's summary and attempts (this cluster's with their verdicts, the
/// others' with the ledger's last known state), each job's sparklines of completion rate and trial
/// progress over time, GPU-hours per cluster and per benchmark, the last results. Inline SVG only.
pub(crate) fn team_section(view: &TeamView, now: DateTime<Utc>) -> String {
    let mut h = String::from("<h2 id=\"team\">Team view: every cluster</h2>\n");
    h.push_str("<table id=\"clusters\">\n<thead><tr><th>cluster</th><th>active</th><th>verdicts</th><th>submitter</th></tr></thead>\n<tbody>\n");
    for c in &view.clusters {
        let verdicts = if c.own {
            c.verdicts
                .iter()
                .map(|(k, n)| format!("<span class=\"badge {}\">{n} {k}</span>", verdict_class(*k)))
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            "<span class=\"badge neutral\">remote</span> the ledger's state".into()
        };
        let beat = team::submitter_words(c.submitter.as_ref());
        let stale = c.submitter.as_ref().is_none_or(|b| b.is_stale());
        let _ = writeln!(
            h,
            "<tr data-cluster=\"{}\"><th>{}{}</th><td>{}</td><td>{verdicts}</td><td>{}</td></tr>",
            escape(&c.name),
            escape(&c.name),
            if c.own { " <span class=\"kind\">this cluster</span>" } else { "" },
            c.active,
            if stale { format!("<span class=\"badge warn\">{}</span>", escape(&beat)) } else { escape(&beat) }
        );
    }
    h.push_str("</tbody>\n</table>\n");

    h.push_str("<h3>Attempts</h3>\n");
    if view.jobs.is_empty() {
        h.push_str("<p>None.</p>\n");
    } else {
        h.push_str("<table id=\"team-jobs\">\n<thead><tr><th>cluster</th><th>job</th><th>model</th><th>benchmark</th><th>verdict</th><th>completions/min</th><th>trials</th><th>why</th></tr></thead>\n<tbody>\n");
        for j in &view.jobs {
            let rate = charts::downsample(&charts::completion_rate(&j.history), team::CHART_POINTS);
            let progress =
                charts::downsample(&charts::trial_progress(&j.history, j.trials_expected), team::CHART_POINTS);
            let now_rate = j
                .local
                .as_ref()
                .and_then(|r| r.verdict.rate.as_ref().map(|r| r.per_min))
                .or_else(|| rate.last().map(|p| p.1));
            let peak = rate.iter().map(|p| p.1).fold(0.0, f64::max);
            let rate_title = if rate.is_empty() {
                "no heartbeat history".to_string()
            } else {
                format!("completions per minute over {} heartbeats; peak {peak:.1}/min", j.history.len())
            };
            let trials = match (j.trials_finished, j.trials_expected) {
                (Some(f), Some(e)) => format!("{f}/{e}"),
                (Some(f), None) => f.to_string(),
                _ => "–".into(),
            };
            let (badge, why) = match (&j.local, &j.remote) {
                (Some(r), _) => (
                    format!(
                        "<a href=\"#{}\"><span class=\"badge {}\">{}</span></a>",
                        anchor(r.attempt),
                        verdict_class(r.verdict.verdict),
                        r.verdict.verdict
                    ),
                    r.verdict.summary.clone(),
                ),
                (None, Some(remote)) => (
                    "<span class=\"badge neutral\">remote</span>".to_string(),
                    format!(
                        "{}{}",
                        remote.last_known,
                        if remote.run_dir_readable { "" } else { " · run dir not readable here" }
                    ),
                ),
                (None, None) => (String::new(), String::new()),
            };
            let _ = writeln!(
                h,
                "<tr class=\"{}\" data-attempt=\"{}\" data-verdict=\"{}\" data-points=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{badge}</td><td class=\"spark\">{}{}</td><td class=\"spark\">{}{trials}</td><td>{}</td></tr>",
                if j.remote.is_some() { "remote" } else { "local" },
                j.attempt,
                team::verdict_word(j),
                j.history.len(),
                escape(&j.cluster),
                escape(j.slurm_job_id.as_deref().unwrap_or("–")),
                escape(&j.model),
                escape(&short_name(&j.benchmark)),
                charts::sparkline_svg(&rate, None, "rate", &rate_title),
                now_rate.map_or("–".into(), |r| format!("{r:.1}")),
                charts::sparkline_svg(
                    &progress,
                    j.trials_expected.filter(|e| *e > 0).map(|_| 1.0),
                    "progress",
                    &format!("trials finished over time: {trials}")
                ),
                escape(&why)
            );
        }
        h.push_str("</tbody>\n</table>\n");
    }

    h.push_str("<h3>GPU-hours</h3>\n<div class=\"charts\">\n");
    for (id, caption, bars) in [
        ("gpu-by-cluster", "per cluster", charts::gpu_hours_by(&view.gpu, |u| &u.cluster)),
        ("gpu-by-benchmark", "per benchmark", charts::gpu_hours_by(&view.gpu, |u| &u.benchmark)),
    ] {
        let _ = writeln!(h, "<figure><figcaption>{caption}</figcaption>{}</figure>", charts::bars_svg(&bars, id));
    }
    h.push_str("</div>\n<p class=\"legend\">from the ledger's GPU-seconds record of each attempt (any cluster's, once its sync recorded it), else this run dir's <code>gpu_time</code> (phases × GPUs held); estimated: the GPUs payload detected × the ledger's run time; unknown: no record yet and the run dir not readable here</p>\n");

    h.push_str("<h3>Last results</h3>\n");
    if view.results.is_empty() {
        h.push_str("<p>None yet.</p>\n");
    } else {
        h.push_str("<table id=\"recent\">\n<thead><tr><th>ended</th><th>cluster</th><th>model</th><th>benchmark</th><th>mean</th><th>valid / expected</th><th>GPU-hours</th></tr></thead>\n<tbody>\n");
        for r in &view.results {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"score\"{}>{}{}</td><td>{} / {}</td><td>{}</td></tr>",
                r.ended_at.map_or("–".into(), |t| format!("{} ago", super::human_duration((now - t).num_seconds()))),
                escape(&r.cluster),
                escape(&r.model),
                escape(&short_name(&r.benchmark)),
                r.mean.map(|m| format!(" style=\"background:{}\"", colour(m))).unwrap_or_default(),
                r.mean.map_or("–".into(), |m| format!("{m:.3}")),
                if r.complete { "" } else { " ⚠" },
                r.n_valid,
                r.n_expected.map_or("?".into(), |e| e.to_string()),
                gpu_words(r.gpu_seconds)
            );
        }
        h.push_str("</tbody>\n</table>\n");
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_and_colours() {
        assert_eq!(escape("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#x27;");
        assert_eq!(colour(0.0), "hsl(0, 65%, 78%)");
        assert_eq!(colour(1.0), "hsl(120, 65%, 78%)");
        assert_eq!(colour(7.0), "hsl(120, 65%, 78%)");
    }
}
