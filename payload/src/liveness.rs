//! Liveness by progress (docs/payload.md, "Liveness"): vLLM answers `/health` and `/v1/models`
//! while its engine core is hung or dead, so while Harbor runs payload reads vLLM's own Prometheus
//! counters every heartbeat and calls the engine hung when requests are in flight and no token
//! moves for `serve.hang_after_s`. Pure: readings come in with their instant, the verdict and the
//! heartbeat's counters go out; crate::phases acts on it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use launch_spec::records::EngineCounters;
use launch_spec::rundir::events::{EngineHung, HungSample};

/// One `/metrics` reading of vLLM's scheduler and token counters, summed over its engines (a
/// data-parallel vLLM labels each engine).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineSample {
    pub running: u64,
    pub waiting: u64,
    pub generation_tokens: u64,
    pub prompt_tokens: u64,
    /// The fullest engine's KV cache (0–1).
    pub kv_cache_usage: Option<f64>,
}

impl EngineSample {
    fn in_flight(&self) -> bool {
        self.running + self.waiting > 0
    }
}

/// The metric names as vLLM 0.33.0 exports them (`vllm/v1/metrics/loggers.py`; a counter gets
/// `_total`); `vllm:gpu_cache_usage_perc` is the KV gauge's name before vLLM 0.11. The contract
/// test `tests/tests/standins.rs::standin_metric_names_are_real_vllms` checks them against the
/// installed vLLM's source.
pub const RUNNING: &str = "vllm:num_requests_running";
pub const WAITING: &str = "vllm:num_requests_waiting";
pub const GENERATION_TOKENS: &str = "vllm:generation_tokens_total";
pub const PROMPT_TOKENS: &str = "vllm:prompt_tokens_total";
pub const KV_CACHE_USAGE: &str = "vllm:kv_cache_usage_perc";
pub(crate) const KV_CACHE_USAGE_LEGACY: &str = "vllm:gpu_cache_usage_perc";
const WANTED: [&str; 6] = [RUNNING, WAITING, GENERATION_TOKENS, PROMPT_TOKENS, KV_CACHE_USAGE, KV_CACHE_USAGE_LEGACY];

/// vLLM's counters from a `/metrics` body; `None` when it has neither the running gauge nor the
/// generation counter (metrics disabled, or not vLLM).
pub fn engine_sample(text: &str) -> Option<EngineSample> {
    let mut s = EngineSample::default();
    let (mut has_running, mut has_tokens) = (false, false);
    for line in text.lines() {
        // Most of the text is other families (latency histograms): one prefix test skips them.
        if !WANTED.iter().any(|w| line.starts_with(w)) {
            continue;
        }
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => continue,
        };
        // The value follows the labels (label values cannot hold `}` in vLLM's metrics).
        let value = rest.rsplit_once('}').map_or(rest, |(_, v)| v);
        let Some(value) = value.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        if !value.is_finite() || value < 0.0 {
            continue;
        }
        let whole = value as u64;
        match name {
            RUNNING => (s.running, has_running) = (s.running + whole, true),
            WAITING => s.waiting += whole,
            GENERATION_TOKENS => (s.generation_tokens, has_tokens) = (s.generation_tokens + whole, true),
            PROMPT_TOKENS => s.prompt_tokens += whole,
            KV_CACHE_USAGE | KV_CACHE_USAGE_LEGACY => {
                s.kv_cache_usage = Some(s.kv_cache_usage.map_or(value, |k: f64| k.max(value)))
            }
            _ => {}
        }
    }
    (has_running || has_tokens).then_some(s)
}

/// Readings kept as evidence of a stall (the first and the latest ones).
pub(crate) const EVIDENCE_SAMPLES: usize = 16;

/// The hang rule over successive readings.
#[derive(Debug)]
pub struct Liveness {
    hang_after: Duration,
    last: Option<(Instant, EngineSample)>,
    /// Since when requests have been in flight with no token moving.
    stalled_since: Option<Instant>,
    /// The readings since the stall began (bounded: the first, then the latest).
    window: VecDeque<(Instant, EngineSample)>,
    counters: Option<EngineCounters>,
}

impl Liveness {
    pub fn new(hang_after: Duration) -> Self {
        Self { hang_after, last: None, stalled_since: None, window: VecDeque::new(), counters: None }
    }

    /// The heartbeat's counters from the latest reading.
    pub fn counters(&self) -> Option<&EngineCounters> {
        self.counters.as_ref()
    }

    /// One reading at `at`: `Some(evidence)` when the engine is hung — requests in flight (running
    /// or waiting) and neither a generated nor a prompt token for `hang_after`. An engine with
    /// nothing in flight is idle, never hung; a counter that went back (a restarted engine) counts
    /// as movement.
    pub fn observe(&mut self, at: Instant, s: EngineSample) -> Option<EngineHung> {
        let prev = self.last.replace((at, s));
        let moved =
            prev.is_none_or(|(_, p)| s.generation_tokens != p.generation_tokens || s.prompt_tokens != p.prompt_tokens);
        let tokens_per_s = prev.and_then(|(t, p)| {
            let dt = at.checked_duration_since(t)?.as_secs_f64();
            (dt > 0.0 && s.generation_tokens >= p.generation_tokens)
                .then(|| (s.generation_tokens - p.generation_tokens) as f64 / dt)
        });
        if moved || !s.in_flight() {
            self.stalled_since = None;
            self.window.clear();
        } else if self.stalled_since.is_none() {
            // Tokens have not moved since the previous reading; if requests were in flight then
            // too, the stall began there.
            let since = match prev {
                Some((t, p)) if p.in_flight() => t,
                _ => at,
            };
            self.stalled_since = Some(since);
            if let Some(p) = prev.filter(|(_, p)| p.in_flight()) {
                self.window.push_back(p);
            }
        }
        if self.stalled_since.is_some() {
            if self.window.len() >= EVIDENCE_SAMPLES {
                self.window.remove(1);
            }
            self.window.push_back((at, s));
        }
        let stalled_for = self.stalled_since.map(|t| at.saturating_duration_since(t));
        self.counters = Some(EngineCounters {
            requests_running: s.running,
            requests_waiting: s.waiting,
            generation_tokens: s.generation_tokens,
            prompt_tokens: s.prompt_tokens,
            tokens_per_s: tokens_per_s.map(round3),
            kv_cache_usage: s.kv_cache_usage.map(round3),
            no_tokens_for_s: stalled_for.map(|d| round3(d.as_secs_f64())),
            hang_after_s: self.hang_after.as_secs(),
        });
        let stalled_for = stalled_for.filter(|d| *d >= self.hang_after)?;
        let since = self.stalled_since.unwrap_or(at);
        let samples = self
            .window
            .iter()
            .map(|(t, r)| HungSample {
                at_s: round3(t.saturating_duration_since(since).as_secs_f64()),
                requests_running: r.running,
                requests_waiting: r.waiting,
                generation_tokens: r.generation_tokens,
                prompt_tokens: r.prompt_tokens,
                kv_cache_usage: r.kv_cache_usage,
            })
            .collect();
        Some(EngineHung {
            hang_after_s: self.hang_after.as_secs(),
            no_tokens_for_s: round3(stalled_for.as_secs_f64()),
            requests_running: s.running,
            requests_waiting: s.waiting,
            generation_tokens: s.generation_tokens,
            prompt_tokens: s.prompt_tokens,
            kv_cache_usage: s.kv_cache_usage,
            samples,
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(running: u64, generation_tokens: u64) -> EngineSample {
        EngineSample { running, generation_tokens, ..EngineSample::default() }
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn parses_vllm_033_metrics_summed_over_engines() {
        let text = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen3-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen3-8B"} 2.0
vllm:num_requests_waiting{engine="0",model_name="Qwen3-8B"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen3-8B"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen3-8B"} 0.5
vllm:prompt_tokens_total{engine="0",model_name="Qwen3-8B"} 1200.0
vllm:generation_tokens_total{engine="0",model_name="Qwen3-8B"} 640.0
vllm:generation_tokens_total{engine="1",model_name="Qwen3-8B"} 1.0e+02
vllm:generation_tokens_created{engine="0",model_name="Qwen3-8B"} 1.76e+09
vllm:request_success_total{engine="0",finished_reason="stop",model_name="Qwen3-8B"} 9.0
"#;
        let s = engine_sample(text).unwrap();
        assert_eq!(
            s,
            EngineSample {
                running: 5,
                waiting: 1,
                generation_tokens: 740,
                prompt_tokens: 1200,
                kv_cache_usage: Some(0.5)
            }
        );
        assert_eq!(
            engine_sample("vllm:gpu_cache_usage_perc 0.1\nvllm:num_requests_running 0\n").unwrap().kv_cache_usage,
            Some(0.1)
        );
        assert_eq!(engine_sample("http_requests_total{handler=\"/v1/models\"} 3\n"), None);
        assert_eq!(engine_sample(""), None);
    }

    #[test]
    fn requests_in_flight_with_no_token_for_the_window_is_hung() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_secs(10));
        assert!(l.observe(t0, sample(2, 100)).is_none());
        assert!(l.observe(t0 + 2 * S, sample(2, 150)).is_none(), "tokens moved");
        assert_eq!(l.counters().unwrap().tokens_per_s, Some(25.0));
        for i in 3..12 {
            assert!(l.observe(t0 + i * S, sample(2, 150)).is_none(), "{i}s: stalled 2–{i} s, under 10 s");
        }
        assert_eq!(l.counters().unwrap().no_tokens_for_s, Some(9.0));
        let ev = l.observe(t0 + 12 * S, sample(2, 150)).expect("stalled from 2 s to 12 s");
        assert_eq!(ev.no_tokens_for_s, 10.0);
        assert_eq!(ev.requests_running, 2);
        assert_eq!(ev.generation_tokens, 150);
        let samples = &ev.samples;
        assert_eq!(samples[0].at_s, 0.0);
        assert!(samples.len() <= EVIDENCE_SAMPLES && samples.last().unwrap().at_s == 10.0, "{samples:?}");
        assert!(l.counters().unwrap().hung());
    }

    #[test]
    fn an_idle_engine_is_never_hung() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_secs(5));
        for i in 0..100 {
            assert!(l.observe(t0 + i * S, sample(0, 42)).is_none());
        }
        let c = l.counters().unwrap();
        assert_eq!((c.no_tokens_for_s, c.requests_running, c.tokens_per_s), (None, 0, Some(0.0)));
        assert!(!c.hung());
    }

    #[test]
    fn prompt_tokens_are_progress_and_a_new_request_starts_the_clock_anew() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_secs(5));
        l.observe(t0, sample(0, 10));
        // A long prefill: no generated token, but prompt tokens move.
        for i in 1..20u64 {
            let s = EngineSample { running: 1, generation_tokens: 10, prompt_tokens: i * 1000, ..Default::default() };
            assert!(l.observe(t0 + Duration::from_secs(i), s).is_none(), "{i}");
        }
        // Idle, then a request arrives and stalls: the window starts when it was first seen.
        let t1 = t0 + Duration::from_secs(100);
        let base = EngineSample { generation_tokens: 10, prompt_tokens: 19000, ..Default::default() };
        l.observe(t1, base);
        let busy = EngineSample { running: 1, ..base };
        for i in 1..=5 {
            assert!(l.observe(t1 + i * S, busy).is_none(), "stalled since {} s only", i - 1);
        }
        assert!(l.observe(t1 + 6 * S, busy).is_some());
    }

    #[test]
    fn counters_going_back_count_as_movement() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_secs(2));
        l.observe(t0, sample(1, 500));
        l.observe(t0 + S, sample(1, 500));
        assert!(l.observe(t0 + 2 * S, sample(1, 3)).is_none(), "a restarted engine's counters");
        assert_eq!(l.counters().unwrap().tokens_per_s, None);
        assert!(l.observe(t0 + 3 * S, sample(1, 3)).is_none());
        assert!(l.observe(t0 + 4 * S, sample(1, 3)).is_some());
    }
}
