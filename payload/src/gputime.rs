//! The job's time on its GPUs by phase (issue 24; `launch_spec::shared::GpuTime`): a pure
//! accumulator fed the run's transitions with their `Instant`s. payload's run loop (crate::run)
//! calls it at each transition; [`crate::records::Recorder`] snapshots it into every
//! `status.json` it writes, so a heartbeat carries the time so far and the final record all of it.
//!
//! Phases, in order: prepare (payload start → engine spawned), load (→ ready), up (serving while
//! at least one leg's Harbor runs, idle otherwise), teardown (→ every child gone). After teardown
//! the job still holds its GPUs (the post-run step runs then): that time counts as idle, as
//! `GpuTime::idle_s` documents. A transition out of order (ready before spawn, a second spawn) is
//! ignored; a run that never spawned the engine goes from prepare straight to teardown.

use std::time::Instant;

use launch_spec::shared::{GpuTime, LegSpan};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Prepare,
    Load,
    Up,
    Teardown,
    After,
}

/// Accumulates [`GpuTime`] from transitions; never reads the clock itself.
#[derive(Debug, Clone)]
pub(crate) struct GpuClock {
    start: Instant,
    gpus: u32,
    stage: Stage,
    /// Start of the interval not yet added to `acc`.
    since: Instant,
    acc: GpuTime,
    /// Legs whose Harbor runs now, with their start.
    open: Vec<(String, Instant)>,
}

impl GpuClock {
    /// The clock of a job whose payload started at `start`.
    pub(crate) fn new(start: Instant) -> Self {
        Self { start, gpus: 0, stage: Stage::Prepare, since: start, acc: GpuTime::default(), open: Vec::new() }
    }

    /// GPUs the job holds (every node's), once payload knows them.
    pub(crate) fn set_gpus(&mut self, gpus: u32) {
        self.gpus = gpus;
    }

    pub(crate) fn engine_spawned(&mut self, at: Instant) {
        self.advance(Stage::Prepare, Stage::Load, at);
    }

    pub(crate) fn engine_ready(&mut self, at: Instant) {
        self.advance(Stage::Load, Stage::Up, at);
    }

    /// A leg's Harbor started (serving from now while the engine is up).
    pub(crate) fn leg_started(&mut self, run_tag: &str, at: Instant) {
        self.flush(at);
        self.open.push((run_tag.to_string(), at));
    }

    /// A leg's Harbor exited (a leg not running is ignored).
    pub(crate) fn leg_ended(&mut self, run_tag: &str, at: Instant) {
        if let Some(i) = self.open.iter().position(|(t, _)| t == run_tag) {
            self.flush(at);
            let (tag, start) = self.open.remove(i);
            self.close(tag, start, at);
        }
    }

    /// Teardown began: every leg still running ends here (the engine is going away).
    pub(crate) fn teardown_started(&mut self, at: Instant) {
        if matches!(self.stage, Stage::Prepare | Stage::Load | Stage::Up) {
            self.flush(at);
            for (tag, start) in std::mem::take(&mut self.open) {
                self.close(tag, start, at);
            }
            self.stage = Stage::Teardown;
        }
    }

    /// Every child is gone.
    pub(crate) fn teardown_done(&mut self, at: Instant) {
        self.advance(Stage::Teardown, Stage::After, at);
    }

    /// The time so far, with the current phase counted up to `at` and running legs ending at `at`.
    pub(crate) fn snapshot(&self, at: Instant) -> GpuTime {
        let mut t = self.acc.clone();
        t.gpus = self.gpus;
        *self.bucket(&mut t) += secs(self.since, at);
        for (tag, start) in &self.open {
            t.legs.push(LegSpan {
                run_tag: tag.clone(),
                start_s: secs(self.start, *start),
                end_s: secs(self.start, at),
            });
        }
        for v in [&mut t.prepare_s, &mut t.load_s, &mut t.serving_s, &mut t.idle_s, &mut t.teardown_s] {
            *v = round_ms(*v);
        }
        for leg in &mut t.legs {
            leg.start_s = round_ms(leg.start_s);
            leg.end_s = round_ms(leg.end_s);
        }
        t
    }

    fn advance(&mut self, from: Stage, to: Stage, at: Instant) {
        if self.stage == from {
            self.flush(at);
            self.stage = to;
        }
    }

    /// Adds `since → at` to the current phase.
    fn flush(&mut self, at: Instant) {
        let d = secs(self.since, at);
        let mut acc = std::mem::take(&mut self.acc);
        *self.bucket(&mut acc) += d;
        self.acc = acc;
        self.since = self.since.max(at);
    }

    fn close(&mut self, run_tag: String, start: Instant, end: Instant) {
        self.acc.legs.push(LegSpan { run_tag, start_s: secs(self.start, start), end_s: secs(self.start, end) });
    }

    fn bucket<'a>(&self, t: &'a mut GpuTime) -> &'a mut f64 {
        match self.stage {
            Stage::Prepare => &mut t.prepare_s,
            Stage::Load => &mut t.load_s,
            Stage::Up if !self.open.is_empty() => &mut t.serving_s,
            Stage::Up | Stage::After => &mut t.idle_s,
            Stage::Teardown => &mut t.teardown_s,
        }
    }
}

/// Seconds from `a` to `b`, never negative.
fn secs(a: Instant, b: Instant) -> f64 {
    b.saturating_duration_since(a).as_secs_f64()
}

fn round_ms(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    /// A per-leg job: 5 s prepare, 60 s load, 2 s idle (config check), 100 s serving, 3 s
    /// idle after Harbor exited, 4 s teardown, 6 s post-run.
    #[test]
    fn per_leg_phases_add_up() {
        let t0 = Instant::now();
        let mut c = GpuClock::new(t0);
        c.set_gpus(4);
        c.engine_spawned(at(t0, 5));
        c.engine_ready(at(t0, 65));
        c.leg_started("leg", at(t0, 67));
        c.leg_ended("leg", at(t0, 167));
        c.teardown_started(at(t0, 170));
        c.teardown_done(at(t0, 174));
        let t = c.snapshot(at(t0, 180));
        assert_eq!(t.gpus, 4);
        assert_eq!((t.prepare_s, t.load_s, t.serving_s, t.idle_s, t.teardown_s), (5.0, 60.0, 100.0, 11.0, 4.0));
        assert_eq!(t.legs, vec![LegSpan { run_tag: "leg".into(), start_s: 67.0, end_s: 167.0 }]);
    }

    /// A heartbeat mid-run counts the open phase and the running leg up to its instant.
    #[test]
    fn snapshot_mid_run_counts_the_open_phase() {
        let t0 = Instant::now();
        let mut c = GpuClock::new(t0);
        assert_eq!(c.snapshot(at(t0, 3)).prepare_s, 3.0);
        c.engine_spawned(at(t0, 5));
        assert_eq!(c.snapshot(at(t0, 30)).load_s, 25.0);
        c.engine_ready(at(t0, 65));
        c.leg_started("a", at(t0, 70));
        let t = c.snapshot(at(t0, 100));
        assert_eq!((t.idle_s, t.serving_s), (5.0, 30.0));
        assert_eq!(t.legs, vec![LegSpan { run_tag: "a".into(), start_s: 70.0, end_s: 100.0 }]);
        // The snapshot changed nothing.
        assert_eq!(c.snapshot(at(t0, 100)), t);
    }

    /// Overlapping legs: serving is the union of their spans; teardown closes the one still running.
    #[test]
    fn overlapping_legs_serve_once_and_teardown_closes_them() {
        let t0 = Instant::now();
        let mut c = GpuClock::new(t0);
        c.engine_spawned(at(t0, 0));
        c.engine_ready(at(t0, 10));
        c.leg_started("a", at(t0, 10));
        c.leg_started("b", at(t0, 20));
        c.leg_ended("a", at(t0, 50));
        c.leg_ended("nope", at(t0, 55));
        c.teardown_started(at(t0, 80));
        c.teardown_done(at(t0, 82));
        let t = c.snapshot(at(t0, 82));
        assert_eq!((t.serving_s, t.idle_s, t.teardown_s), (70.0, 0.0, 2.0));
        assert_eq!(
            t.legs,
            vec![
                LegSpan { run_tag: "a".into(), start_s: 10.0, end_s: 50.0 },
                LegSpan { run_tag: "b".into(), start_s: 20.0, end_s: 80.0 },
            ]
        );
    }

    /// The engine died loading: load ends at teardown; a ready out of order is ignored.
    #[test]
    fn failure_while_loading_and_out_of_order_transitions() {
        let t0 = Instant::now();
        let mut c = GpuClock::new(t0);
        c.engine_ready(at(t0, 1)); // before spawn: ignored
        c.engine_spawned(at(t0, 2));
        c.engine_spawned(at(t0, 9)); // second spawn: ignored
        c.teardown_started(at(t0, 12));
        c.engine_ready(at(t0, 13)); // after teardown began: ignored
        c.teardown_done(at(t0, 15));
        let t = c.snapshot(at(t0, 15));
        assert_eq!((t.prepare_s, t.load_s, t.serving_s, t.idle_s, t.teardown_s), (2.0, 10.0, 0.0, 0.0, 3.0));
        assert!(t.legs.is_empty());
        // An instant before the last transition adds nothing (never negative).
        assert_eq!(c.snapshot(at(t0, 14)), t);
    }

    /// A spec failure before the engine: prepare then teardown.
    #[test]
    fn no_engine_is_prepare_then_teardown() {
        let t0 = Instant::now();
        let mut c = GpuClock::new(t0);
        c.teardown_started(at(t0, 4));
        c.teardown_done(at(t0, 5));
        let t = c.snapshot(at(t0, 5));
        assert_eq!((t.prepare_s, t.load_s, t.teardown_s), (4.0, 0.0, 1.0));
    }
}
