//! The engine (vLLM): argv (docs/design.md §6.3), readiness (§6.2 step 6), start-failure
//! classification, and its watchdog (readiness, `/health` and `/metrics` probes).
//!
//! argv is a vector, never a shell string: JSON flags are one element each, the registry's extra
//! args are `${VAR}`-expanded from payload's environment and then split on whitespace with no quote
//! processing (`launch_spec::spec::split_extra_args`, the old scripts' unquoted word-splitting).

use std::path::Path;
use std::time::Duration;

use launch_spec::LaunchSpec;
use launch_spec::OutcomeClass;
use launch_spec::spec::ServeInvocation;

use crate::failure::Failure;
use crate::liveness::EngineSample;
use crate::records::Completions;

#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum ArgvError {
    #[error(
        "serve.extra_args references ${{{0}}}, which is not set in payload's environment: export it in the job or remove it"
    )]
    UnsetVariable(String),
    #[error("serve.extra_args has an unterminated `${{`: write ${{NAME}}")]
    Unterminated,
    #[error("serve.extra_args has `${{{0}}}`, which is not a variable name: write ${{NAME}}")]
    BadName(String),
}

impl From<ArgvError> for Failure {
    fn from(err: ArgvError) -> Self {
        Failure::new(OutcomeClass::Spec, err.to_string())
    }
}

/// Expands `${NAME}` in the registry's extra args from payload's environment (the one rule,
/// `launch_spec::expand`; other `$` stay as written).
pub(crate) fn expand_vars(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, ArgvError> {
    use launch_spec::expand::ExpandError;
    launch_spec::expand::expand_vars(text, env).map_err(|err| match err {
        ExpandError::Unset(name) => ArgvError::UnsetVariable(name),
        ExpandError::Unterminated => ArgvError::Unterminated,
        ExpandError::BadName(name) => ArgvError::BadName(name),
    })
}

/// Formats the ceiling as vLLM expects it (`0.85`, not `0.8500000001`).
pub(crate) fn format_utilization(value: f64) -> String {
    let text = format!("{value:.4}");
    let text = text.trim_end_matches('0');
    text.strip_suffix('.').map(|t| format!("{t}.0")).unwrap_or_else(|| text.to_string())
}

/// The model argument: the pre-downloaded path when set, else the HF id.
pub(crate) fn model_arg(spec: &LaunchSpec) -> String {
    match &spec.model.local_path {
        Some(path) => path.display().to_string(),
        None => spec.model.hf_id.to_string(),
    }
}

/// vLLM's argv, program first (docs/design.md §6.3).
pub(crate) fn argv(
    spec: &LaunchSpec,
    program: &str,
    port: u16,
    gpu_memory_utilization: f64,
    profile_extra_args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, ArgvError> {
    let serve = &spec.serve;
    let mut a: Vec<String> = vec![program.to_string()];
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| (*s).to_string()));
    match serve.invocation {
        ServeInvocation::Serve => push(&["serve", &model_arg(spec)]),
        ServeInvocation::ApiServerModule => {
            push(&["-m", "vllm.entrypoints.openai.api_server", "--model", &model_arg(spec)])
        }
    }
    push(&["--host", &serve.host]);
    push(&["--port", &port.to_string()]);
    push(&["--served-model-name", &spec.model.served_name]);
    push(&["--tensor-parallel-size", &serve.tensor_parallel_size.to_string()]);
    if serve.pipeline_parallel_size > 1 {
        push(&["--pipeline-parallel-size", &serve.pipeline_parallel_size.to_string()]);
    }
    if serve.data_parallel_size > 1 {
        push(&["--data-parallel-size", &serve.data_parallel_size.to_string()]);
    }
    push(&["--gpu-memory-utilization", &format_utilization(gpu_memory_utilization)]);
    if let Some(len) = serve.max_model_len {
        push(&["--max-model-len", &len.to_string()]);
    }
    if let Some(seqs) = serve.max_num_seqs {
        push(&["--max-num-seqs", &seqs.to_string()]);
    }
    if let Some(swap) = serve.swap_space
        && serve.supports_swap_space
    {
        push(&["--swap-space", &swap.to_string()]);
    }
    if serve.trust_remote_code {
        push(&["--trust-remote-code"]);
    }
    if let Some(parser) = &serve.tool_call_parser {
        push(&["--enable-auto-tool-choice", "--tool-call-parser", parser]);
    }
    if let Some(parser) = &serve.reasoning_parser {
        push(&["--reasoning-parser", parser]);
    }
    if let Some(json) = &serve.hf_overrides {
        push(&["--hf-overrides", json]);
    }
    if let Some(json) = &serve.limit_mm_per_prompt {
        push(&["--limit-mm-per-prompt", json]);
    }
    a.extend(profile_extra_args.iter().cloned());
    if let Some(extra) = serve.extra_args.as_deref().filter(|s| !s.trim().is_empty()) {
        let expanded = expand_vars(extra, env)?;
        a.extend(launch_spec::spec::split_extra_args(&expanded));
    }
    Ok(a)
}

/// Why vLLM exited during start-up, from its log (docs/design.md §6.2 step 6): the one table both
/// programs read (`launch_spec::rundir::vocab`).
pub(crate) use launch_spec::rundir::vocab::classify_start_failure;

/// The last `n` lines of a log file (reads at most the last 64 KiB).
pub(crate) fn log_tail(path: &Path, n: usize) -> Vec<String> {
    // Bounded even while the engine keeps writing (a flood), regular files only.
    const WINDOW: u64 = 64 * 1024;
    let Ok((buf, len)) = launch_spec::fsread::read_tail(path, WINDOW, launch_spec::fsread::Links::Refuse) else {
        return Vec::new();
    };
    let start = len.saturating_sub(WINDOW);
    let text = String::from_utf8_lossy(&buf);
    let mut lines: Vec<String> = text.lines().map(|l| l.to_string()).collect();
    if start > 0 && !lines.is_empty() {
        lines.remove(0);
    }
    let skip = lines.len().saturating_sub(n);
    lines.split_off(skip)
}

/// Readiness as observed by one probe round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// Nothing answers, or `/health` is not 200.
    Down,
    /// `/health` is 200 but `/v1/models` does not list the served name yet.
    HealthOnly,
    Ready,
    /// A server answered like a ready vLLM, but the socket listening on the port is not the
    /// engine's process tree's (crate::ports::listener_of): never taken for the engine.
    Foreign,
}

/// HTTP client for loopback probes: short timeouts, no proxy (a node's `http_proxy` must not
/// capture 127.0.0.1).
pub(crate) fn http_client(timeout: Duration) -> reqwest::Client {
    loopback_client(timeout).build().expect("HTTP client builds")
}

/// The loopback probes' client settings, shared by both clients.
fn loopback_client(timeout: Duration) -> reqwest::ClientBuilder {
    crate::tls::init();
    reqwest::Client::builder().no_proxy().timeout(timeout).connect_timeout(timeout).pool_max_idle_per_host(2)
}

/// The loopback client with `Authorization: Bearer <key>` on every request, for a vLLM started
/// with `VLLM_API_KEY` (its `/v1` routes then need the key; `/health` and `/metrics` stay open).
pub(crate) fn http_client_with_key(timeout: Duration, api_key: Option<&str>) -> reqwest::Client {
    let Some(key) = api_key else { return http_client(timeout) };
    let mut headers = reqwest::header::HeaderMap::new();
    if let Ok(mut value) = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}")) {
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    loopback_client(timeout).default_headers(headers).build().expect("HTTP client builds")
}

/// `GET /health` → 200?
pub(crate) async fn health_ok(client: &reqwest::Client, base_url: &str) -> bool {
    matches!(client.get(format!("{base_url}/health")).send().await, Ok(resp) if resp.status().as_u16() == 200)
}

/// `/health` 200 AND `/v1/models` lists `served_name`.
pub(crate) async fn probe_ready(client: &reqwest::Client, base_url: &str, served_name: &str) -> Readiness {
    if !health_ok(client, base_url).await {
        return Readiness::Down;
    }
    let Ok(resp) = client.get(format!("{base_url}/v1/models")).send().await else { return Readiness::HealthOnly };
    if !resp.status().is_success() {
        return Readiness::HealthOnly;
    }
    match resp.json::<serde_json::Value>().await {
        Ok(body) if models_list(&body, served_name) => Readiness::Ready,
        _ => Readiness::HealthOnly,
    }
}

/// Whether an OpenAI `/v1/models` body lists `served_name`.
pub(crate) fn models_list(body: &serde_json::Value, served_name: &str) -> bool {
    body.get("data")
        .and_then(|d| d.as_array())
        .is_some_and(|items| items.iter().any(|m| m.get("id").and_then(|i| i.as_str()) == Some(served_name)))
}

/// One real chat completion (`serve.ready_needs_completion`, vec-inf #142).
pub(crate) async fn completion_ok(client: &reqwest::Client, base_url: &str, served_name: &str) -> bool {
    let body = serde_json::json!({
        "model": served_name,
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 1,
    });
    matches!(
        client.post(format!("{base_url}/v1/chat/completions")).json(&body).send().await,
        Ok(resp) if resp.status().is_success()
    )
}

/// What one `/metrics` fetch found: the completion counters and the engine's scheduler and token
/// counters (crate::liveness), each `None` when absent.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct MetricsReading {
    pub completions: Option<Completions>,
    pub engine: Option<EngineSample>,
}

/// Largest `/metrics` body read (vLLM's is a few hundred KiB with many engines and histograms).
pub(crate) const MAX_METRICS_BYTES: usize = 8 << 20;

/// One `/metrics` fetch, parsed (`None` when it does not answer 200).
pub(crate) async fn fetch_metrics(client: &reqwest::Client, base_url: &str) -> Option<MetricsReading> {
    let resp = client.get(format!("{base_url}/metrics")).send().await.ok()?;
    if !resp.status().is_success() || resp.content_length().is_some_and(|n| n > MAX_METRICS_BYTES as u64) {
        return None;
    }
    let body = resp.bytes().await.ok()?;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX_METRICS_BYTES)]);
    Some(MetricsReading {
        completions: crate::records::completions_from_metrics(&text),
        engine: crate::liveness::engine_sample(&text),
    })
}

/// vLLM's completion counters from `/metrics` (`None` when it does not answer).
pub(crate) async fn fetch_completions(client: &reqwest::Client, base_url: &str) -> Option<Completions> {
    fetch_metrics(client, base_url).await?.completions
}

/// Readiness poll period: a loopback probe costs well under a millisecond (a refused connect while
/// vLLM loads even less), so polling often keeps "ready → Harbor spawned" short.
pub(crate) const READY_POLL: Duration = Duration::from_millis(25);

/// What one of the watchdog's probes found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ProbeEvent {
    /// While loading: one readiness round.
    Readiness(Readiness),
    /// Once Harbor runs: one `/health` probe.
    Health(bool),
    /// A heartbeat's `/metrics` fetch (asked for by [`Watchdog::fetch_metrics`]); empty when it
    /// did not answer.
    Metrics(MetricsReading),
}

enum Probing {
    Readiness { client: reqwest::Client, served: String, needs_completion: bool },
    Health { client: reqwest::Client },
}

/// The engine's probes: readiness every [`READY_POLL`] while vLLM loads (`/health` 200 and the
/// served name in `/v1/models`, optionally one completion), then `/health` every
/// `limits.health_probe_interval_s`, and `/metrics` for heartbeats. Probes run as tasks, so a slow
/// one never delays the run loop noticing an exit or a signal; [`next`](Self::next) is
/// cancel-safe (the tasks are kept across calls).
pub(crate) struct Watchdog {
    base_url: String,
    probing: Probing,
    tick: tokio::time::Interval,
    metrics_client: reqwest::Client,
    probe: Option<tokio::task::JoinHandle<ProbeEvent>>,
    metrics: Option<tokio::task::JoinHandle<Option<MetricsReading>>>,
}

fn ticker(period: Duration) -> tokio::time::Interval {
    let mut t = tokio::time::interval(period);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}

impl Watchdog {
    /// Starts in readiness mode; `api_key` is sent on every request (vLLM's `/v1` routes need it).
    pub(crate) fn readiness(base_url: &str, served: &str, needs_completion: bool, api_key: Option<&str>) -> Self {
        Self {
            base_url: base_url.to_string(),
            probing: Probing::Readiness {
                client: http_client_with_key(Duration::from_secs(1), api_key),
                served: served.to_string(),
                needs_completion,
            },
            tick: ticker(READY_POLL),
            metrics_client: http_client(Duration::from_millis(500)),
            probe: None,
            metrics: None,
        }
    }

    /// Switches to `/health` probes every `interval` (each bounded by the interval, 0.2–5 s).
    pub(crate) fn watch_health(&mut self, interval: Duration) {
        if let Some(h) = self.probe.take() {
            h.abort();
        }
        let timeout = interval.clamp(Duration::from_millis(200), Duration::from_secs(5));
        self.probing = Probing::Health { client: http_client(timeout) };
        self.metrics_client = http_client(timeout);
        self.tick = ticker(interval);
    }

    /// Starts a `/metrics` fetch unless one is in flight; [`next`](Self::next) reports it.
    pub(crate) fn fetch_metrics(&mut self) {
        if self.metrics.is_none() {
            let (client, base) = (self.metrics_client.clone(), self.base_url.clone());
            self.metrics = Some(tokio::spawn(async move { fetch_metrics(&client, &base).await }));
        }
    }

    fn spawn_probe(&mut self) {
        let base = self.base_url.clone();
        self.probe = Some(match &self.probing {
            Probing::Readiness { client, served, needs_completion } => {
                let (client, served, needs_completion) = (client.clone(), served.clone(), *needs_completion);
                tokio::spawn(async move {
                    let r = probe_ready(&client, &base, &served).await;
                    if r == Readiness::Ready && needs_completion && !completion_ok(&client, &base, &served).await {
                        return ProbeEvent::Readiness(Readiness::HealthOnly);
                    }
                    ProbeEvent::Readiness(r)
                })
            }
            Probing::Health { client } => {
                let client = client.clone();
                tokio::spawn(async move { ProbeEvent::Health(health_ok(&client, &base).await) })
            }
        });
    }

    /// The next probe answer. Cancel-safe.
    pub(crate) async fn next(&mut self) -> ProbeEvent {
        loop {
            tokio::select! {
                _ = self.tick.tick(), if self.probe.is_none() => self.spawn_probe(),
                r = async { self.probe.as_mut().expect("guarded").await }, if self.probe.is_some() => {
                    self.probe = None;
                    return r.unwrap_or(match self.probing {
                        Probing::Readiness { .. } => ProbeEvent::Readiness(Readiness::Down),
                        Probing::Health { .. } => ProbeEvent::Health(false),
                    });
                }
                c = async { self.metrics.as_mut().expect("guarded").await }, if self.metrics.is_some() => {
                    self.metrics = None;
                    return ProbeEvent::Metrics(c.ok().flatten().unwrap_or_default());
                }
            }
        }
    }

    /// Stops outstanding probe tasks.
    pub(crate) fn stop(&mut self) {
        if let Some(h) = self.probe.take() {
            h.abort();
        }
        if let Some(h) = self.metrics.take() {
            h.abort();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use launch_spec::testkit::unit_spec as spec;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn minimal_argv_exact() {
        let a = argv(&spec(), "/env/bin/vllm", 23456, 0.85, &[], &no_env).unwrap();
        assert_eq!(
            a,
            s(&[
                "/env/bin/vllm",
                "serve",
                "Qwen/Qwen3-8B",
                "--host",
                "127.0.0.1",
                "--port",
                "23456",
                "--served-model-name",
                "Qwen3-8B",
                "--tensor-parallel-size",
                "1",
                "--gpu-memory-utilization",
                "0.85",
            ])
        );
    }

    #[test]
    fn full_argv_exact_with_json_as_one_element_and_extra_split() {
        let mut spec = spec();
        spec.model.local_path = Some("/models/qwen".into());
        let serve = &mut spec.serve;
        serve.tensor_parallel_size = 2;
        serve.data_parallel_size = 2;
        serve.max_model_len = Some(32768);
        serve.max_num_seqs = Some(256);
        serve.swap_space = Some(32);
        serve.supports_swap_space = true;
        serve.trust_remote_code = true;
        serve.tool_call_parser = Some("hermes".into());
        serve.reasoning_parser = Some("qwen3".into());
        serve.hf_overrides = Some(r#"{"rope_scaling": {"type": "yarn", "factor": 4.0}}"#.into());
        serve.limit_mm_per_prompt = Some(r#"{"image": 0}"#.into());
        serve.extra_args = Some(
            r#"--enforce-eager --chat-template ${TPL_DIR}/tpl.jinja --override-generation-config {"temperature":0.7,"top_p":0.8}"#
                .into(),
        );
        let env = |k: &str| (k == "TPL_DIR").then(|| "/tpl".to_string());
        let a = argv(&spec, "vllm", 20001, 0.9, &s(&["--disable-custom-all-reduce"]), &env).unwrap();
        assert_eq!(
            a,
            s(&[
                "vllm",
                "serve",
                "/models/qwen",
                "--host",
                "127.0.0.1",
                "--port",
                "20001",
                "--served-model-name",
                "Qwen3-8B",
                "--tensor-parallel-size",
                "2",
                "--data-parallel-size",
                "2",
                "--gpu-memory-utilization",
                "0.9",
                "--max-model-len",
                "32768",
                "--max-num-seqs",
                "256",
                "--swap-space",
                "32",
                "--trust-remote-code",
                "--enable-auto-tool-choice",
                "--tool-call-parser",
                "hermes",
                "--reasoning-parser",
                "qwen3",
                "--hf-overrides",
                r#"{"rope_scaling": {"type": "yarn", "factor": 4.0}}"#,
                "--limit-mm-per-prompt",
                r#"{"image": 0}"#,
                "--disable-custom-all-reduce",
                "--enforce-eager",
                "--chat-template",
                "/tpl/tpl.jinja",
                "--override-generation-config",
                r#"{"temperature":0.7,"top_p":0.8}"#,
            ])
        );
    }

    #[test]
    fn swap_space_only_with_capability() {
        let mut spec = spec();
        spec.serve.swap_space = Some(16);
        let a = argv(&spec, "vllm", 1, 0.8, &[], &no_env).unwrap();
        assert!(!a.contains(&"--swap-space".to_string()));
        spec.serve.supports_swap_space = true;
        let a = argv(&spec, "vllm", 1, 0.8, &[], &no_env).unwrap();
        assert!(a.windows(2).any(|w| w == ["--swap-space", "16"]));
    }

    #[test]
    fn api_server_module_form() {
        let mut spec = spec();
        spec.serve.invocation = ServeInvocation::ApiServerModule;
        let a = argv(&spec, "/env/bin/python", 9, 0.8, &[], &no_env).unwrap();
        assert_eq!(
            &a[..5],
            &s(&["/env/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "Qwen/Qwen3-8B"])[..]
        );
    }

    #[test]
    fn extra_args_errors_name_the_problem() {
        let mut spec = spec();
        spec.serve.extra_args = Some("--x ${NOPE}".into());
        assert_eq!(argv(&spec, "v", 1, 0.8, &[], &no_env), Err(ArgvError::UnsetVariable("NOPE".into())));
        // No quote processing: quotes reach vLLM as written, as with the old scripts' word-splitting.
        spec.serve.extra_args = Some("--x 'unclosed  \t--y\n\"q\"".into());
        let a = argv(&spec, "v", 1, 0.8, &[], &no_env).unwrap();
        assert_eq!(&a[a.len() - 4..], &s(&["--x", "'unclosed", "--y", "\"q\""])[..]);
        assert_eq!(expand_vars("a $HOME ${X}b", &|_| Some("1".into())).unwrap(), "a $HOME 1b");
    }

    #[test]
    fn utilization_formatting() {
        assert_eq!(format_utilization(0.85), "0.85");
        assert_eq!(format_utilization(0.9), "0.9");
        assert_eq!(format_utilization(1.0), "1.0");
        assert_eq!(format_utilization(0.92500001), "0.925");
    }

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(|l| l.to_string()).collect()
    }

    #[test]
    fn classifies_real_vllm_errors() {
        let cases = [
            (
                "oom",
                "INFO 07-17 10:00:01 [gpu_model_runner.py:1234] Starting to load model\n\
                ERROR 07-17 10:00:09 [core.py:586] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB. GPU 0 has a total capacity of 63.43 GiB of which 512.00 MiB is free.",
            ),
            ("oom", "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
            (
                "kv_cache",
                "ERROR 07-17 [core.py:586] ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be stored in KV cache (48864). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
            ),
            (
                "kv_cache",
                "ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (9.50 GiB). Based on the available memory, the estimated maximum model length is 77664.",
            ),
            (
                "world_size",
                "ValueError: World size (4) is larger than the number of available GPUs (1) in this node. If this is intentional, please use Ray.",
            ),
            (
                "model_type",
                "ValueError: The checkpoint you are trying to load has model type `qwen3_5` but Transformers does not recognize this architecture. This could be because of an issue with the checkpoint, or because your version of Transformers is out of date.",
            ),
            ("model_type", "ValueError: Model architectures ['FooForCausalLM'] are not supported for now."),
            (
                "port_in_use",
                "OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 23456): address already in use",
            ),
            ("other", "Traceback\nKeyError: 'x'"),
        ];
        for (want, text) in cases {
            assert_eq!(classify_start_failure(&lines(text)), want, "{text}");
        }
        assert_eq!(classify_start_failure(&[]), "other");
    }

    #[test]
    fn last_matching_line_wins() {
        let text = "torch.OutOfMemoryError: CUDA out of memory (retrying with smaller batch)\n\
            ValueError: World size (8) is larger than the number of available GPUs (4)";
        assert_eq!(classify_start_failure(&lines(text)), "world_size");
    }

    #[test]
    fn tail_reads_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vllm.log");
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let tail = log_tail(&path, 30);
        assert_eq!(tail.len(), 30);
        assert_eq!(tail[0], "line 70");
        assert_eq!(tail[29], "line 99");
        assert!(log_tail(&dir.path().join("none"), 5).is_empty());
    }

    #[test]
    fn models_body() {
        let body = serde_json::json!({"object":"list","data":[{"id":"Qwen3-8B","object":"model"}]});
        assert!(models_list(&body, "Qwen3-8B"));
        assert!(!models_list(&body, "other"));
        assert!(!models_list(&serde_json::json!({}), "Qwen3-8B"));
    }
}
