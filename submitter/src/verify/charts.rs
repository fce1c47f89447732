//! The team view's small charts: the data functions (pure, unit-tested with known inputs) and their
//! inline SVG (no script, no external resource: the report stays one static file).
//!
//! - a sparkline per job of its completion rate and its trial progress over time, from payload's
//!   heartbeat history (`launch_spec::rundir::heartbeat_history`: the `heartbeat` events of
//!   `events.jsonl` and `status.json`'s latest);
//! - bars of GPU-hours per cluster and per benchmark ([`gpu_hours_by`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use launch_spec::records::Heartbeat;

/// The report's escaping (`report::escape`), not imported from there: the report draws these charts.
fn escape(text: &str) -> String {
    html_escape::encode_quoted_attribute(text).into_owned()
}

/// One heartbeat reading: cumulative completions (every status class) and finished trials.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub at: DateTime<Utc>,
    pub completions: u64,
    pub trials_finished: u64,
}

/// A chart's points: time and value.
pub(crate) type Series = Vec<(DateTime<Utc>, f64)>;

/// The readings of a heartbeat history, oldest first; a heartbeat whose time does not parse, or is
/// not later than the previous one, is left out.
pub fn readings(beats: &[Heartbeat]) -> Vec<Reading> {
    let mut out: Vec<Reading> = Vec::with_capacity(beats.len());
    for hb in beats {
        let Some(at) = launch_spec::rundir::parse_time(&hb.at) else { continue };
        if out.last().is_some_and(|last| at <= last.at) {
            continue;
        }
        out.push(Reading {
            at,
            completions: hb.completions_ok + hb.completions_4xx + hb.completions_5xx,
            trials_finished: hb.trials_finished,
        });
    }
    out
}

/// Completions per minute between consecutive readings, at the later one. A counter that went
/// down (an engine whose `/metrics` restarted from zero) gives no point for that step.
pub fn completion_rate(readings: &[Reading]) -> Series {
    readings
        .windows(2)
        .filter_map(|w| {
            let seconds = (w[1].at - w[0].at).num_milliseconds() as f64 / 1000.0;
            let done = w[1].completions.checked_sub(w[0].completions)?;
            (seconds > 0.0).then(|| (w[1].at, done as f64 * 60.0 / seconds))
        })
        .collect()
}

/// Trial progress at each reading: the share of `expected` trials finished (0–1, capped at 1), or
/// the count of finished trials when the expected number is unknown.
pub fn trial_progress(readings: &[Reading], expected: Option<u64>) -> Series {
    readings
        .iter()
        .map(|r| {
            let value = match expected.filter(|e| *e > 0) {
                Some(e) => (r.trials_finished as f64 / e as f64).min(1.0),
                None => r.trials_finished as f64,
            };
            (r.at, value)
        })
        .collect()
}

/// At most `max` points: consecutive points are grouped into `max` runs of (nearly) equal length,
/// each drawn as the mean of its values at its last point's time. Fewer points are kept as they are.
pub(crate) fn downsample(series: &[(DateTime<Utc>, f64)], max: usize) -> Series {
    if series.len() <= max || max == 0 {
        return series.to_vec();
    }
    let n = series.len();
    (0..max)
        .map(|k| {
            // n > max: every group holds at least one point.
            let group = &series[k * n / max..(k + 1) * n / max];
            (group[group.len() - 1].0, group.iter().map(|p| p.1).sum::<f64>() / group.len() as f64)
        })
        .collect()
}

/// How an attempt's GPU time is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuBasis {
    /// The ledger's GPU-seconds record of the attempt (`sync` stores it from payload's `gpu_time`
    /// and Slurm's start and end: `crate::gpuhours`), whichever cluster ran it.
    Ledger,
    /// payload's `gpu_time` record (`status.json`): phases × the GPUs the job held.
    Recorded,
    /// The GPUs payload detected × the time the ledger says the job ran (started → ended, or now).
    Estimated,
}

impl GpuBasis {
    pub fn as_str(self) -> &'static str {
        match self {
            GpuBasis::Ledger => "ledger",
            GpuBasis::Recorded => "recorded",
            GpuBasis::Estimated => "estimated",
        }
    }
}

/// One attempt's GPU time, for the bars.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuUse {
    pub cluster: String,
    pub benchmark: String,
    /// `None`: not known from here (another cluster's run dir, no GPU record).
    pub gpu_seconds: Option<(f64, GpuBasis)>,
}

/// One bar: a label, GPU-hours summed over the attempts known, and how many attempts had none.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bar {
    pub label: String,
    pub value: f64,
    /// Attempts counted whose GPU time is estimated rather than recorded.
    pub estimated: usize,
    /// Attempts whose GPU time is unknown (not in the sum).
    pub unknown: usize,
}

/// GPU-hours summed per key (cluster or benchmark), largest first (ties by label).
pub(crate) fn gpu_hours_by(uses: &[GpuUse], key: impl Fn(&GpuUse) -> &str) -> Vec<Bar> {
    let mut sums: BTreeMap<String, Bar> = BTreeMap::new();
    for u in uses {
        let label = key(u);
        let bar = sums.entry(label.to_string()).or_insert_with(|| Bar {
            label: label.to_string(),
            value: 0.0,
            estimated: 0,
            unknown: 0,
        });
        match u.gpu_seconds {
            Some((seconds, basis)) => {
                bar.value += seconds / 3600.0;
                bar.estimated += usize::from(basis == GpuBasis::Estimated);
            }
            None => bar.unknown += 1,
        }
    }
    let mut bars: Vec<Bar> = sums.into_values().collect();
    bars.sort_by(|a, b| b.value.total_cmp(&a.value).then_with(|| a.label.cmp(&b.label)));
    bars
}

/// Sparkline size (CSS pixels).
pub(crate) const SPARK_W: f64 = 140.0;
pub(crate) const SPARK_H: f64 = 28.0;

/// A polyline through `series` in a `SPARK_W` × `SPARK_H` box: time on x (first to last point),
/// value on y from 0 to `y_max` (default: the largest value). `title` is the tooltip. An empty
/// series draws a dashed baseline ("no heartbeat yet").
pub(crate) fn sparkline_svg(series: &[(DateTime<Utc>, f64)], y_max: Option<f64>, class: &str, title: &str) -> String {
    let mut svg = format!(
        "<svg class=\"spark {class}\" width=\"{SPARK_W}\" height=\"{SPARK_H}\" viewBox=\"0 0 {SPARK_W} {SPARK_H}\" role=\"img\"><title>{}</title>",
        escape(title)
    );
    let pad = 2.0;
    if series.is_empty() {
        let _ = write!(
            svg,
            "<line x1=\"0\" y1=\"{y}\" x2=\"{SPARK_W}\" y2=\"{y}\" stroke-dasharray=\"3 3\"/></svg>",
            y = SPARK_H - pad
        );
        return svg;
    }
    let top = y_max.unwrap_or_else(|| series.iter().map(|p| p.1).fold(0.0, f64::max)).max(f64::EPSILON);
    let (t0, t1) = (series[0].0, series[series.len() - 1].0);
    let span = (t1 - t0).num_milliseconds().max(1) as f64;
    let points: Vec<String> = series
        .iter()
        .map(|(t, v)| {
            let x =
                if series.len() == 1 { SPARK_W - pad } else { (*t - t0).num_milliseconds() as f64 / span * SPARK_W };
            let y = SPARK_H - pad - (v / top).clamp(0.0, 1.0) * (SPARK_H - 2.0 * pad);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    let last = points.last().cloned().unwrap_or_default();
    let (lx, ly) = last.split_once(',').unwrap_or(("0", "0"));
    let _ = write!(svg, "<polyline points=\"{}\"/><circle cx=\"{lx}\" cy=\"{ly}\" r=\"2\"/></svg>", points.join(" "));
    svg
}

/// Horizontal bars of GPU-hours, one per [`Bar`], scaled to the largest; each row says its value
/// and, when some attempts were estimated or unknown, how many.
pub(crate) fn bars_svg(bars: &[Bar], id: &str) -> String {
    let (row, label_w, bar_w, value_w) = (22.0, 150.0, 260.0, 260.0);
    let width = label_w + bar_w + value_w;
    let height = row * bars.len().max(1) as f64 + 4.0;
    let mut svg = format!(
        "<svg class=\"bars\" id=\"{}\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" role=\"img\">",
        escape(id)
    );
    if bars.is_empty() {
        let _ = write!(svg, "<text x=\"0\" y=\"15\">no attempts</text></svg>");
        return svg;
    }
    let top = bars.iter().map(|b| b.value).fold(0.0, f64::max).max(f64::EPSILON);
    for (i, b) in bars.iter().enumerate() {
        let y = i as f64 * row + 2.0;
        let w = (b.value / top * bar_w).max(if b.value > 0.0 { 1.0 } else { 0.0 });
        let mut note = Vec::new();
        if b.estimated > 0 {
            note.push(format!("{} estimated", b.estimated));
        }
        if b.unknown > 0 {
            note.push(format!("{} unknown", b.unknown));
        }
        let note = if note.is_empty() { String::new() } else { format!(" ({})", note.join(", ")) };
        let _ = write!(
            svg,
            "<g data-label=\"{label}\" data-gpu-hours=\"{value:.2}\"><title>{label}: {value:.1} GPU-hours{note}</title><text x=\"{tx}\" y=\"{ty:.1}\" text-anchor=\"end\">{label}</text><rect x=\"{label_w}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" rx=\"2\"/><text x=\"{vx:.1}\" y=\"{ty:.1}\">{value:.1} GPU-h{note}</text></g>",
            label = escape(&b.label),
            value = b.value,
            tx = label_w - 6.0,
            ty = y + 14.0,
            h = row - 6.0,
            vx = label_w + w + 6.0,
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_764_000_000 + s, 0).unwrap()
    }

    fn hb(at: DateTime<Utc>, ok: u64, bad: u64, done: u64) -> Heartbeat {
        Heartbeat {
            at: at.to_rfc3339(),
            completions_ok: ok,
            completions_4xx: bad,
            completions_5xx: 0,
            trials_started: done,
            trials_finished: done,
            trials_errored: 0,
            last_progress_at: None,
            engine_healthy: true,
            failed_probes: 0,
            probe_limit: 3,
            engine: None,
        }
    }

    #[test]
    fn readings_drop_unparsable_and_out_of_order_beats() {
        let mut beats = vec![hb(t(0), 0, 0, 0), hb(t(60), 10, 2, 1), hb(t(30), 99, 0, 0), hb(t(120), 40, 2, 3)];
        beats.insert(1, Heartbeat { at: "not a time".into(), ..hb(t(10), 5, 0, 0) });
        let r = readings(&beats);
        assert_eq!(
            r.iter().map(|r| (r.at, r.completions, r.trials_finished)).collect::<Vec<_>>(),
            [(t(0), 0, 0), (t(60), 12, 1), (t(120), 42, 3)]
        );
    }

    #[test]
    fn completion_rate_is_per_minute_between_readings_and_skips_a_counter_reset() {
        let r = readings(&[
            hb(t(0), 0, 0, 0),
            hb(t(60), 30, 0, 0),
            hb(t(90), 45, 0, 0),
            hb(t(150), 5, 0, 0),
            hb(t(210), 65, 0, 0),
        ]);
        assert_eq!(completion_rate(&r), [(t(60), 30.0), (t(90), 30.0), (t(210), 60.0)]);
        assert!(completion_rate(&r[..1]).is_empty(), "one reading has no rate");
    }

    #[test]
    fn trial_progress_as_a_share_of_expected_or_a_count() {
        let r = readings(&[hb(t(0), 0, 0, 0), hb(t(60), 0, 0, 5), hb(t(120), 0, 0, 12)]);
        assert_eq!(trial_progress(&r, Some(10)), [(t(0), 0.0), (t(60), 0.5), (t(120), 1.0)], "capped at 1");
        assert_eq!(trial_progress(&r, None), [(t(0), 0.0), (t(60), 5.0), (t(120), 12.0)]);
        assert_eq!(trial_progress(&r, Some(0)), trial_progress(&r, None), "0 expected is unknown");
    }

    #[test]
    fn downsample_keeps_short_series_and_averages_groups() {
        let s: Series = (0..10).map(|i| (t(i * 60), i as f64)).collect();
        assert_eq!(downsample(&s, 20), s);
        let d = downsample(&s, 5);
        assert_eq!(d, [(t(60), 0.5), (t(180), 2.5), (t(300), 4.5), (t(420), 6.5), (t(540), 8.5)]);
        let d = downsample(&s, 3);
        assert_eq!(d.len(), 3);
        assert_eq!(d.last().unwrap().0, t(540), "the last group ends at the last point");
    }

    #[test]
    fn gpu_hours_sum_per_key_largest_first() {
        let u = |cluster: &str, benchmark: &str, s: Option<(f64, GpuBasis)>| GpuUse {
            cluster: cluster.into(),
            benchmark: benchmark.into(),
            gpu_seconds: s,
        };
        let uses = [
            u("leonardo", "tb2", Some((4.0 * 3600.0, GpuBasis::Recorded))),
            u("leonardo", "swebench", Some((2.0 * 3600.0, GpuBasis::Estimated))),
            u("vista", "tb2", Some((9.0 * 3600.0, GpuBasis::Recorded))),
            u("vista", "tb2", None),
            u("jupiter", "aider", None),
        ];
        let by_cluster = gpu_hours_by(&uses, |u| &u.cluster);
        assert_eq!(
            by_cluster.iter().map(|b| (b.label.as_str(), b.value, b.estimated, b.unknown)).collect::<Vec<_>>(),
            [("vista", 9.0, 0, 1), ("leonardo", 6.0, 1, 0), ("jupiter", 0.0, 0, 1)]
        );
        let by_bench = gpu_hours_by(&uses, |u| &u.benchmark);
        assert_eq!(
            by_bench.iter().map(|b| (b.label.as_str(), b.value)).collect::<Vec<_>>(),
            [("tb2", 13.0), ("swebench", 2.0), ("aider", 0.0)]
        );
    }

    #[test]
    fn sparkline_scales_time_and_value_into_its_box() {
        let svg = sparkline_svg(&[(t(0), 0.0), (t(50), 5.0), (t(100), 10.0)], None, "rate", "a <b>");
        assert!(svg.contains("points=\"0.0,26.0 70.0,14.0 140.0,2.0\""), "{svg}");
        assert!(svg.contains("<title>a &lt;b&gt;</title>"), "{svg}");
        let half = sparkline_svg(&[(t(0), 0.0), (t(100), 0.5)], Some(1.0), "progress", "");
        assert!(half.contains("points=\"0.0,26.0 140.0,14.0\""), "{half}");
        assert!(sparkline_svg(&[], None, "rate", "").contains("stroke-dasharray"), "empty: a dashed baseline");
    }

    #[test]
    fn bars_scale_to_the_largest_and_say_what_is_estimated() {
        let bars = [
            Bar { label: "vista".into(), value: 10.0, estimated: 0, unknown: 0 },
            Bar { label: "leo<nardo>".into(), value: 5.0, estimated: 2, unknown: 1 },
        ];
        let svg = bars_svg(&bars, "gpu-by-cluster");
        assert!(svg.contains("width=\"260.0\""), "the largest fills the bar width: {svg}");
        assert!(svg.contains("width=\"130.0\""), "half of it: {svg}");
        assert!(svg.contains("data-label=\"leo&lt;nardo&gt;\" data-gpu-hours=\"5.00\""), "{svg}");
        assert!(svg.contains("5.0 GPU-h (2 estimated, 1 unknown)"), "{svg}");
    }
}
