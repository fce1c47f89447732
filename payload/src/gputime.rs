//! GPU time by phase (`launch_spec::shared::GpuTime`, issue 24): the instants a job passes —
//! payload started, engine spawned, engine ready, teardown began, every child gone — and when
//! each leg's Harbor ran, turned into seconds per phase by the pure [`split`]. Serving is the
//! union of the legs' spans inside [ready, teardown): overlapping legs count once, so the phases
//! add up to the job's wall time.

use launch_spec::shared::{GpuTime, LegSpan};

/// The job's instants, in seconds since payload started (`None`: not reached).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Instants {
    pub engine_spawned: Option<f64>,
    pub engine_ready: Option<f64>,
    pub teardown: Option<f64>,
    pub end: f64,
}

/// Seconds per phase for `gpus` GPUs, from the instants and the legs' Harbor spans.
pub fn split(gpus: u32, at: &Instants, legs: Vec<LegSpan>) -> GpuTime {
    let end = at.end.max(0.0);
    let teardown = at.teardown.unwrap_or(end).clamp(0.0, end);
    let spawned = at.engine_spawned.unwrap_or(teardown).clamp(0.0, teardown);
    let ready = at.engine_ready.unwrap_or(teardown).clamp(spawned, teardown);
    let serving = union_within(&legs, ready, teardown);
    GpuTime {
        gpus,
        prepare_s: spawned,
        load_s: ready - spawned,
        serving_s: serving,
        idle_s: (teardown - ready - serving).max(0.0),
        teardown_s: end - teardown,
        legs,
    }
}

/// The length of the union of the spans, clipped to [from, to).
fn union_within(spans: &[LegSpan], from: f64, to: f64) -> f64 {
    let mut parts: Vec<(f64, f64)> = spans
        .iter()
        .map(|s| (s.start_s.max(from), s.end_s.min(to)))
        .filter(|(a, b)| b > a)
        .collect();
    parts.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut total = 0.0;
    let mut current: Option<(f64, f64)> = None;
    for (a, b) in parts {
        current = match current {
            Some((ca, cb)) if a <= cb => Some((ca, cb.max(b))),
            Some((ca, cb)) => {
                total += cb - ca;
                Some((a, b))
            }
            None => Some((a, b)),
        };
    }
    if let Some((ca, cb)) = current {
        total += cb - ca;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(tag: &str, start_s: f64, end_s: f64) -> LegSpan {
        LegSpan { run_tag: tag.into(), start_s, end_s }
    }

    #[test]
    fn phases_add_up_and_overlapping_legs_count_once() {
        let at = Instants { engine_spawned: Some(2.0), engine_ready: Some(12.0), teardown: Some(50.0), end: 53.0 };
        let t = split(4, &at, vec![span("a", 13.0, 30.0), span("b", 20.0, 40.0), span("c", 45.0, 60.0)]);
        assert_eq!((t.prepare_s, t.load_s, t.teardown_s), (2.0, 10.0, 3.0));
        // a ∪ b = 13..40 (27 s), c clipped to 45..50 (5 s).
        assert_eq!(t.serving_s, 32.0);
        assert_eq!(t.idle_s, 38.0 - 32.0);
        assert_eq!(t.prepare_s + t.load_s + t.serving_s + t.idle_s + t.teardown_s, 53.0);
        assert_eq!((t.gpus, t.legs.len()), (4, 3));
    }

    #[test]
    fn an_engine_that_never_became_ready_is_all_load() {
        let at = Instants { engine_spawned: Some(1.0), engine_ready: None, teardown: Some(9.0), end: 10.0 };
        let t = split(1, &at, Vec::new());
        assert_eq!((t.prepare_s, t.load_s, t.serving_s, t.idle_s, t.teardown_s), (1.0, 8.0, 0.0, 0.0, 1.0));
        let never = split(1, &Instants { end: 3.0, ..Instants::default() }, Vec::new());
        assert_eq!((never.prepare_s, never.load_s), (3.0, 0.0));
    }
}
