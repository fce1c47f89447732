//! The report's score plots (docs/verification.md "The report"), inline SVG written by hand (a few
//! shapes each; no plotting crate writes static SVG without a font or script of its own):
//!
//! - [`intervals_svg`]: one ranked benchmark, each model's mean with its 95% interval, in ranking
//!   order, with its rank (`=` tied);
//! - [`scatter_svg`]: one benchmark against another, a point per model that has both (with its
//!   intervals as cross-hairs);
//! - [`heatmap_svg`]: a compared pair's per-task means, the tasks ordered by the difference.
//!
//! Every name (model, benchmark, task) is escaped: they come from the ledger and the team's database.

use std::fmt::Write as _;

use super::results::{BenchmarkRanking, Matrix, contender, short_name};
use crate::stats::{Contender, PairedComparison};

/// The report's escaping (`report::escape`), not imported from there: the report draws these plots
/// (as `charts` does, so the two modules do not import each other).
fn escape(text: &str) -> String {
    html_escape::encode_quoted_attribute(text).into_owned()
}

/// The longest model name drawn in full beside a plot; longer ones end in `…` (the full name is in
/// the element's tooltip).
const LABEL_CHARS: usize = 34;

fn label(name: &str) -> String {
    if name.chars().count() <= LABEL_CHARS {
        return name.to_string();
    }
    let kept: String = name.chars().take(LABEL_CHARS - 1).collect();
    format!("{kept}…")
}

/// Up to this many models, each point of a scatter is labelled with its model's name (after the
/// last `/`, at most [`SCATTER_LABEL_CHARS`] characters); more would overlap.
const MAX_SCATTER_LABELS: usize = 12;
const SCATTER_LABEL_CHARS: usize = 18;

/// Red (0) → amber → green (1), as the matrix's cells.
pub(crate) fn score_colour(score: f64) -> String {
    let hue = (score.clamp(0.0, 1.0) * 120.0).round();
    format!("hsl({hue}, 65%, 62%)")
}

/// Vertical grid lines and their labels at 0, 25, 50, 75, 100 points along `[x0, x0 + width]`.
fn x_axis(svg: &mut String, x0: f64, width: f64, top: f64, bottom: f64) {
    for tick in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let x = x0 + tick * width;
        let _ = write!(
            svg,
            "<line class=\"grid\" x1=\"{x:.1}\" y1=\"{top:.1}\" x2=\"{x:.1}\" y2=\"{bottom:.1}\"/><text class=\"tick\" x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            bottom + 14.0,
            (tick * 100.0).round()
        );
    }
}

/// One ranked benchmark's models, each a point at its mean on a line across its interval, with its
/// rank; in ranking order.
pub fn intervals_svg(ranking: &BenchmarkRanking) -> String {
    let (label_w, plot_w, rank_w, row, top) = (250.0, 420.0, 48.0, 20.0, 8.0);
    let width = label_w + plot_w + rank_w;
    let bottom = top + row * ranking.standings.len() as f64;
    let height = bottom + 22.0;
    let mut svg = format!(
        "<svg class=\"plot intervals\" data-benchmark=\"{}\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" role=\"img\"><title>{}: mean and 95% interval per model, in ranking order</title>",
        escape(&ranking.benchmark),
        escape(&ranking.benchmark)
    );
    x_axis(&mut svg, label_w, plot_w, top, bottom);
    for (i, s) in ranking.standings.iter().enumerate() {
        let y = top + row * (i as f64 + 0.5);
        let at = |v: f64| label_w + v.clamp(0.0, 1.0) * plot_w;
        let interval = s.interval.map_or(String::new(), |ci| {
            format!(
                "<line class=\"ci\" x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\"/>",
                at(ci.lower),
                at(ci.upper)
            )
        });
        let bounds =
            s.interval.map_or(String::new(), |ci| format!(" [{:.1}, {:.1}]", 100.0 * ci.lower, 100.0 * ci.upper));
        let tied = if s.tied() { format!("; tied with {}", s.tied_with.join(", ")) } else { String::new() };
        let _ = write!(
            svg,
            "<g class=\"standing\" data-model=\"{model}\" data-rank=\"{rank}\"><title>{model}: {mean:.1}{bounds} ({basis}), rank {rank}{tied}</title><text class=\"name\" x=\"{tx:.1}\" y=\"{ty:.1}\" text-anchor=\"end\">{name}</text>{interval}<circle class=\"mean\" cx=\"{cx:.1}\" cy=\"{y:.1}\" r=\"4\"/><text class=\"rank\" x=\"{rx:.1}\" y=\"{ty:.1}\">{rank}</text></g>",
            model = escape(&s.model),
            rank = escape(&s.rank_label()),
            mean = 100.0 * s.mean,
            basis = s.basis.describe(),
            tied = escape(&tied),
            tx = label_w - 8.0,
            ty = y + 4.0,
            name = escape(&label(&s.model)),
            cx = at(s.mean),
            rx = label_w + plot_w + 10.0,
        );
    }
    svg.push_str("</svg>");
    svg
}

/// `y` against `x` across the models that have a score on both: a point per model at its two means,
/// with each interval as a line through it (per-trial bootstrap where the result has facts, else
/// the normal one; none for a mean only). `None` when fewer than two models have both.
pub(crate) fn scatter_svg(m: &Matrix, x: &str, y: &str) -> Option<String> {
    let points: Vec<(Contender, Contender)> = m
        .models
        .iter()
        .filter_map(|model| Some((contender(m.cell(model, x)?)?, contender(m.cell(model, y)?)?)))
        .collect();
    if points.len() < 2 {
        return None;
    }
    let (left, size, top) = (56.0, 300.0, 10.0);
    let (width, height) = (left + size + 120.0, top + size + 44.0);
    let bottom = top + size;
    let mut svg = format!(
        "<svg class=\"plot scatter\" data-x=\"{}\" data-y=\"{}\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" role=\"img\"><title>{} against {} across models</title>",
        escape(x),
        escape(y),
        escape(y),
        escape(x)
    );
    x_axis(&mut svg, left, size, top, bottom);
    for tick in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let ty = bottom - tick * size;
        let _ = write!(
            svg,
            "<line class=\"grid\" x1=\"{left}\" y1=\"{ty:.1}\" x2=\"{:.1}\" y2=\"{ty:.1}\"/><text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            left + size,
            left - 6.0,
            ty + 4.0,
            (tick * 100.0).round()
        );
    }
    let _ = write!(
        svg,
        "<text class=\"axis\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text><text class=\"axis\" x=\"12\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 12 {:.1})\">{}</text>",
        left + size / 2.0,
        height - 4.0,
        escape(&short_name(x)),
        top + size / 2.0,
        top + size / 2.0,
        escape(&short_name(y))
    );
    let px = |v: f64| left + v.clamp(0.0, 1.0) * size;
    let py = |v: f64| bottom - v.clamp(0.0, 1.0) * size;
    for (cx, cy) in &points {
        let mut g = format!(
            "<g class=\"model\" data-model=\"{}\"><title>{}: {} {:.1}, {} {:.1}</title>",
            escape(&cx.model),
            escape(&cx.model),
            escape(&short_name(x)),
            100.0 * cx.mean,
            escape(&short_name(y)),
            100.0 * cy.mean
        );
        if let Some(ci) = cx.interval {
            let _ = write!(
                g,
                "<line class=\"ci\" x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\"/>",
                px(ci.lower),
                px(ci.upper),
                y = py(cy.mean)
            );
        }
        if let Some(ci) = cy.interval {
            let _ = write!(
                g,
                "<line class=\"ci\" x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\"/>",
                py(ci.lower),
                py(ci.upper),
                x = px(cx.mean)
            );
        }
        let _ = write!(g, "<circle class=\"mean\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\"/>", px(cx.mean), py(cy.mean));
        if points.len() <= MAX_SCATTER_LABELS {
            let name: String =
                cx.model.rsplit('/').next().unwrap_or(&cx.model).chars().take(SCATTER_LABEL_CHARS).collect();
            let _ = write!(
                g,
                "<text class=\"point\" x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                px(cx.mean) + 6.0,
                py(cy.mean) - 6.0,
                escape(&name)
            );
        }
        g.push_str("</g>");
        svg.push_str(&g);
    }
    svg.push_str("</svg>");
    Some(svg)
}

/// A compared pair's per-task means as two rows of coloured cells (red 0 → green 1), the tasks
/// ordered by the difference A − B (A better first), then by name.
pub fn heatmap_svg(comparison: &PairedComparison, a: &str, b: &str) -> String {
    let mut tasks: Vec<_> = comparison.tasks.iter().collect();
    tasks.sort_by(|p, q| q.difference.total_cmp(&p.difference).then(p.task.cmp(&q.task)));
    let (label_w, row, top) = (250.0, 22.0, 4.0);
    let cell = (760.0 / tasks.len().max(1) as f64).clamp(3.0, 18.0);
    let width = label_w + cell * tasks.len() as f64 + 8.0;
    let height = top + 2.0 * row + 18.0;
    let mut svg = format!(
        "<svg class=\"plot heatmap\" data-a=\"{}\" data-b=\"{}\" data-tasks=\"{}\" width=\"{width:.0}\" height=\"{height}\" viewBox=\"0 0 {width:.1} {height}\" role=\"img\"><title>per-task mean reward, {} and {}, tasks ordered by the difference</title>",
        escape(a),
        escape(b),
        tasks.len(),
        escape(a),
        escape(b)
    );
    for (r, (model, pick)) in [(a, true), (b, false)].into_iter().enumerate() {
        let y = top + r as f64 * row;
        let _ = write!(
            svg,
            "<text class=\"name\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\"><title>{}</title>{}</text>",
            label_w - 8.0,
            y + row / 2.0 + 4.0,
            escape(model),
            escape(&label(model))
        );
        for (i, t) in tasks.iter().enumerate() {
            let score = if pick { t.a } else { t.b };
            let _ = write!(
                svg,
                "<rect class=\"task\" data-task=\"{task}\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"{fill}\"><title>{task}: {model} {score:.2} ({a_score:.2} vs {b_score:.2})</title></rect>",
                task = escape(&t.task),
                x = label_w + i as f64 * cell,
                w = (cell - 0.5).max(1.0),
                h = row - 2.0,
                fill = score_colour(score),
                model = escape(model),
                a_score = t.a,
                b_score = t.b,
            );
        }
    }
    let better = |n: usize, who: &str| format!("{n} task(s) better under {who}");
    let _ = write!(
        svg,
        "<text class=\"tick\" x=\"{label_w}\" y=\"{:.1}\">{} · {} · {} the same</text></svg>",
        top + 2.0 * row + 14.0,
        escape(&better(comparison.a_better.len(), a)),
        escape(&better(comparison.b_better.len(), b)),
        tasks.len() - comparison.a_better.len() - comparison.b_better.len()
    );
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{Bootstrap, Interval, IntervalBasis, InvalidTrials, Trial, paired, rank};

    const HOSTILE: &str = "org/<script>alert(\"x\")</script>&'";

    fn contender(model: &str, mean: f64) -> Contender {
        Contender {
            model: model.into(),
            mean,
            interval: Some(Interval { lower: mean - 0.1, upper: mean + 0.1 }),
            basis: IntervalBasis::BootstrapOverTasks,
        }
    }

    #[test]
    fn intervals_draw_one_row_per_model_in_ranking_order_and_escape_names() {
        let ranking = BenchmarkRanking {
            benchmark: "terminal_bench_2".into(),
            standings: rank(&[contender("org/A", 0.3), contender(HOSTILE, 0.6), contender("org/C", 0.15)]),
        };
        let svg = intervals_svg(&ranking);
        assert_eq!(svg.matches("<g class=\"standing\"").count(), 3);
        assert_eq!(svg.matches("<line class=\"ci\"").count(), 3);
        assert_eq!(svg.matches("<circle class=\"mean\"").count(), 3);
        assert!(!svg.contains("<script>") && svg.contains("&lt;script&gt;"), "{svg}");
        // The hostile model ranks first (0.6, interval [0.5, 0.7] above A's [0.2, 0.4]); C ties A.
        assert!(svg.find("&lt;script&gt;").unwrap() < svg.find("org/A").unwrap());
        assert!(svg.contains("data-rank=\"2=\""), "{svg}");
        // The mean 0.6 is drawn at 60% of the plot's width: 250 + 0.6 × 420.
        assert!(svg.contains("cx=\"502.0\""), "{svg}");
    }

    #[test]
    fn heatmap_orders_tasks_by_difference_and_escapes_task_names() {
        let run = |rewards: &[(&str, f64)]| -> Vec<Trial> {
            rewards.iter().map(|(t, r)| Trial { task: t.to_string(), attempt: 1, reward: *r, valid: true }).collect()
        };
        let a = run(&[("t1", 1.0), ("t2", 0.0), ("<t3>", 1.0)]);
        let b = run(&[("t1", 1.0), ("t2", 1.0), ("<t3>", 0.0)]);
        let cmp = paired(&a, &b, InvalidTrials::CountedAsZero, Bootstrap::default()).unwrap();
        let svg = heatmap_svg(&cmp, HOSTILE, "org/B");
        assert_eq!(svg.matches("<rect class=\"task\"").count(), 6);
        assert!(!svg.contains("<script>") && !svg.contains("<t3>"), "{svg}");
        let order: Vec<&str> =
            svg.split("data-task=\"").skip(1).take(3).map(|s| s.split('"').next().unwrap()).collect();
        assert_eq!(order, ["&lt;t3&gt;", "t1", "t2"]);
        assert!(svg.contains("1 task(s) better under org/B · 1 the same"), "{svg}");
    }

    #[test]
    fn scatter_draws_the_models_with_both_benchmarks() {
        use crate::verify::VerifySettings;
        use crate::verify::results::build_matrix;
        let attempt = |id, model, family, mean| crate::verify::results::tests::attempt(id, model, family, mean, 100);
        let attempts = [
            attempt(1, HOSTILE, "terminal_bench_2", 0.5),
            attempt(2, HOSTILE, "dev_set_v2", 0.25),
            attempt(3, "org/B", "terminal_bench_2", 0.3),
            attempt(4, "org/B", "dev_set_v2", 0.75),
            attempt(5, "org/C", "terminal_bench_2", 0.1),
        ];
        let m = build_matrix(&attempts, None, &VerifySettings::default(), &crate::testkit::Shipped::load().scorings())
            .unwrap();
        let svg = scatter_svg(&m, "terminal_bench_2", "dev_set_v2").unwrap();
        assert_eq!(svg.matches("<g class=\"model\"").count(), 2, "org/C has no dev_set_v2: {svg}");
        assert!(!svg.contains("<script>"), "{svg}");
        // tb2 0.5 → x = 56 + 0.5 × 300; dev_set_v2 0.25 → y = 310 − 0.25 × 300.
        assert!(svg.contains("cx=\"206.0\" cy=\"235.0\""), "{svg}");
        // tb2 has an interval (binary: normal over trials), dev_set_v2 none (partial credit).
        assert_eq!(svg.matches("<line class=\"ci\"").count(), 2, "{svg}");
        assert!(scatter_svg(&m, "terminal_bench_2", "swebench").is_none());
    }

    #[test]
    fn labels_are_shortened_whole_characters() {
        let long = "é".repeat(50);
        assert_eq!(label(&long).chars().count(), LABEL_CHARS);
        assert!(label(&long).ends_with('…'));
        assert_eq!(label("org/A"), "org/A");
    }
}
