//! The log vocabularies both programs read, each one table: what vLLM prints when it fails to
//! start or dies, and what the tunnel's ssh (and the server behind it) prints. payload classifies
//! with them while the job runs; submitter's `check` reads the same files with the same tables, so
//! the two can never disagree on a line (issue 22: they had drifted — `check` missed
//! `CUDA error: out of memory` and knew "broken pipe" only on its side).
//!
//! Every pattern is ASCII lower case and matched against the ASCII-lowercased line.

/// vLLM start-up failure causes (`Outcome::cause` of `engine_start`), most specific first: each
/// cause with the phrases that name it. A phrase list whose entry is a pair matches when the line
/// holds both parts.
pub(crate) const ENGINE_START_CAUSES: &[(&str, &[Phrase])] = &[
    (
        "kv_cache",
        &[
            Phrase::One("larger than the maximum number of tokens that can be stored in kv cache"),
            Phrase::One("kv cache is needed, which is larger than the available kv cache memory"),
            Phrase::One("no available memory for the cache blocks"),
        ],
    ),
    ("oom", OOM_PHRASES),
    (
        "world_size",
        &[
            Phrase::Both("world size", "larger than"),
            Phrase::Both("world size", "greater than"),
            Phrase::Both("world size", " > "),
            Phrase::One("exceeds the total number of available gpus"),
        ],
    ),
    // Another process took the port between payload's bind check and vLLM's bind.
    ("port_in_use", &[Phrase::One("address already in use")]),
    // `--max-model-len` past the model's own (pydantic's `Value error, User-specified max_model_len
    // (8192) is greater than the derived max_model_len (max_position_embeddings=4096.0 …)`).
    ("max_model_len", &[Phrase::One("is greater than the derived max_model_len")]),
    // The memory the node has free is less than the utilization asks: another process on the GPU
    // (`Free memory on device … is less than desired GPU memory utilization`), or on a CPU node
    // (`Available memory on node 0 … is less than desired CPU memory utilization`).
    (
        "memory_utilization",
        &[
            Phrase::One("less than desired gpu memory utilization"),
            Phrase::One("less than desired cpu memory utilization"),
        ],
    ),
    // The model is neither a local directory nor a valid Hub id (offline: nothing to resolve).
    (
        "model_path",
        &[Phrase::One("invalid repository id or local directory"), Phrase::One("repo id must be in the form")],
    ),
    (
        "model_type",
        &[
            Phrase::One("does not recognize this architecture"),
            Phrase::One("unrecognized model"),
            Phrase::Both("model architectures", "are not supported"),
            Phrase::One("should have a `model_type` key"),
        ],
    ),
];

/// The engine core died under a running API server (killed, or crashed without a line naming why):
/// vLLM's own account of it. Named only when no line of [`ENGINE_START_CAUSES`] names a cause, which
/// says why it died (`torch.OutOfMemoryError` before `EngineDeadError`).
pub(crate) const ENGINE_CORE_DIED: (&str, &[Phrase]) =
    ("engine_core_died", &[Phrase::One("engine core exited unexpectedly"), Phrase::One("enginedeaderror")]);

/// CUDA's and torch's out-of-memory wordings (`torch.OutOfMemoryError: CUDA out of memory.`, the
/// older `RuntimeError: CUDA error: out of memory`).
pub(crate) const OOM_PHRASES: &[Phrase] =
    &[Phrase::One("outofmemoryerror"), Phrase::One("cuda out of memory"), Phrase::One("cuda error: out of memory")];

/// Lines that say the engine is dead or could not come up (besides an out-of-memory line).
pub(crate) const ENGINE_FATAL_PHRASES: &[Phrase] =
    &[Phrase::One("enginedeaderror"), Phrase::One("engine core initialization failed")];

/// One phrase of a vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phrase {
    One(&'static str),
    /// Both parts, anywhere in the line.
    Both(&'static str, &'static str),
}

impl Phrase {
    /// Whether the already-lowercased line holds this phrase.
    pub(crate) fn in_lower(self, lower: &str) -> bool {
        match self {
            Phrase::One(p) => lower.contains(p),
            Phrase::Both(a, b) => lower.contains(a) && lower.contains(b),
        }
    }
}

fn any_in(phrases: &[Phrase], lower: &str) -> bool {
    phrases.iter().any(|p| p.in_lower(lower))
}

/// The cause of one vLLM log line, if it names a start-up failure.
pub(crate) fn engine_start_cause(line: &str) -> Option<&'static str> {
    let lower = line.to_ascii_lowercase();
    ENGINE_START_CAUSES.iter().find(|(_, phrases)| any_in(phrases, &lower)).map(|(cause, _)| *cause)
}

/// Why vLLM exited, from the end of its log: the cause named by the last line that names one,
/// else `engine_core_died` when vLLM says its engine core died, else `other`.
pub fn classify_start_failure(lines: &[String]) -> &'static str {
    let lower = || lines.iter().map(|l| l.to_ascii_lowercase());
    lines
        .iter()
        .rev()
        .find_map(|l| engine_start_cause(l))
        .or_else(|| lower().any(|l| any_in(ENGINE_CORE_DIED.1, &l)).then_some(ENGINE_CORE_DIED.0))
        .unwrap_or("other")
}

/// Whether a line says the engine died or failed to come up: a fatal phrase, or a line naming a
/// start-up failure's cause (out of memory, `max_model_len`, the port taken, …).
pub(crate) fn is_engine_fatal(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    any_in(ENGINE_FATAL_PHRASES, &lower) || ENGINE_START_CAUSES.iter().any(|(_, phrases)| any_in(phrases, &lower))
}

/// The cause a fatal line names (`oom`, `max_model_len`, …, `engine_core_died`), if any: what
/// `check` says the engine died of, in payload's words.
pub fn fatal_cause(line: &str) -> Option<&'static str> {
    engine_start_cause(line).or_else(|| {
        let lower = line.to_ascii_lowercase();
        any_in(ENGINE_CORE_DIED.1, &lower).then_some(ENGINE_CORE_DIED.0)
    })
}

/// One line of the tunnel's ssh output, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelLine {
    Authenticated,
    NotAuthenticated,
    /// Another session holds this token (Pinggy's lock message).
    Locked,
    /// A URL the server announced (Pinggy prints the http:// and https:// forms).
    Url(String),
    /// `Allocated port N for remote forward to …` (OpenSSH, for `-R0:…`).
    AllocatedPort(u16),
    AuthFailed,
    ConnectFailed,
    ForwardFailed,
    HostKey,
    Other,
}

impl TunnelLine {
    /// A line that explains why a tunnel failed (what `check` quotes as the tunnel's errors).
    pub fn is_error(&self) -> bool {
        matches!(self, Self::AuthFailed | Self::ConnectFailed | Self::ForwardFailed | Self::HostKey)
    }
}

/// Pinggy's lines (docs/tunnels.md): `You are authenticated as …` with a persistent token,
/// `You are not authenticated.` without (or with a rejected) one, then the URLs; a second session
/// with the same token is told a tunnel with that token is already active. The lock wording was
/// never captured verbatim, so its match is deliberately loose.
const TUNNEL_NOT_AUTHENTICATED: &[Phrase] = &[Phrase::One("not authenticated")];
const TUNNEL_AUTHENTICATED: &[Phrase] = &[Phrase::One("you are authenticated"), Phrase::One("authenticated as")];
const TUNNEL_LOCKED: &[Phrase] =
    &[Phrase::One("already active"), Phrase::Both("same token", "already"), Phrase::Both("same token", "active")];
/// OpenSSH's own client lines: the failures of any SSH server.
const TUNNEL_AUTH_FAILED: &[Phrase] =
    &[Phrase::One("permission denied"), Phrase::One("too many authentication failures")];
const TUNNEL_HOST_KEY: &[Phrase] =
    &[Phrase::One("host key verification failed"), Phrase::One("remote host identification has changed")];
const TUNNEL_FORWARD_FAILED: &[Phrase] =
    &[Phrase::One("forwarding failed"), Phrase::Both("bind", "address already in use")];
const TUNNEL_CONNECT_FAILED: &[Phrase] = &[
    Phrase::One("connection refused"),
    Phrase::One("could not resolve hostname"),
    Phrase::One("connection timed out"),
    Phrase::One("operation timed out"),
    Phrase::One("no route to host"),
    Phrase::One("network is unreachable"),
    Phrase::One("kex_exchange_identification"),
    Phrase::One("connection closed by"),
    Phrase::One("connection reset"),
    // `client_loop: send disconnect: Broken pipe`: the session was lost.
    Phrase::One("broken pipe"),
];

/// Classifies one line of the tunnel's output.
pub fn classify_tunnel_line(line: &str) -> TunnelLine {
    let lower = line.to_ascii_lowercase();
    let has = |phrases: &[Phrase]| any_in(phrases, &lower);
    if has(TUNNEL_NOT_AUTHENTICATED) {
        return TunnelLine::NotAuthenticated;
    }
    if has(TUNNEL_AUTHENTICATED) {
        return TunnelLine::Authenticated;
    }
    if has(TUNNEL_LOCKED) {
        return TunnelLine::Locked;
    }
    if let Some(rest) = lower.split("allocated port ").nth(1)
        && let Some(port) = rest.split_whitespace().next().and_then(|p| p.parse().ok())
    {
        return TunnelLine::AllocatedPort(port);
    }
    if has(TUNNEL_AUTH_FAILED) {
        return TunnelLine::AuthFailed;
    }
    if has(TUNNEL_HOST_KEY) {
        return TunnelLine::HostKey;
    }
    if has(TUNNEL_FORWARD_FAILED) {
        return TunnelLine::ForwardFailed;
    }
    if has(TUNNEL_CONNECT_FAILED) {
        return TunnelLine::ConnectFailed;
    }
    if let Some(url) = line.split_whitespace().find(|w| w.starts_with("http://") || w.starts_with("https://")) {
        return TunnelLine::Url(url.trim_end_matches(['.', ',', ')']).to_string());
    }
    TunnelLine::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pattern_is_lower_case() {
        let all = ENGINE_START_CAUSES
            .iter()
            .flat_map(|(_, p)| p.iter())
            .chain(ENGINE_FATAL_PHRASES)
            .chain(ENGINE_CORE_DIED.1)
            .chain(TUNNEL_CONNECT_FAILED)
            .chain(TUNNEL_LOCKED)
            .chain(TUNNEL_HOST_KEY);
        for p in all {
            let parts = match *p {
                Phrase::One(a) => vec![a],
                Phrase::Both(a, b) => vec![a, b],
            };
            for part in parts {
                assert_eq!(part, part.to_ascii_lowercase(), "pattern {part:?} must be lower case");
            }
        }
    }

    #[test]
    fn both_oom_wordings_are_fatal_and_oom() {
        for line in [
            "ERROR 07-17 10:00:09 [core.py:586] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB.",
            "RuntimeError: CUDA error: out of memory",
        ] {
            assert!(is_engine_fatal(line), "{line}");
            assert_eq!(engine_start_cause(line), Some("oom"), "{line}");
        }
        assert!(!is_engine_fatal("INFO 07-17 10:00:01 memory profiling takes 3.2 seconds"));
    }

    /// The real vLLM's lines (the CPU build 0.32.0, tests/tests/engine_real.rs), each naming its
    /// cause; before issue 33 every one of them was `other`.
    #[test]
    fn the_real_engines_start_failures_and_death_name_their_cause() {
        let cases: &[(&[&str], &str)] = &[
            (
                &[
                    "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
                    "  Value error, User-specified max_model_len (8192) is greater than the derived max_model_len (max_position_embeddings=4096.0 or model_max_length=None in model's config.json). To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.",
                ],
                "max_model_len",
            ),
            (
                &[
                    "(APIServer pid=7) ERROR 12-07 04:53:10 [api_server.py:99] OSError: [Errno 98] Address already in use",
                ],
                "port_in_use",
            ),
            (
                &[
                    "ValueError: Free memory on device cuda:0 (3.1/79.1 GiB) on startup is less than desired GPU memory utilization (0.9, 71.2 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
                ],
                "memory_utilization",
            ),
            (
                &[
                    "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/no/such/dir'.",
                ],
                "model_path",
            ),
            (
                &[
                    "(APIServer pid=1231) WARNING 12-07 04:50:30 [core_client.py:817] [shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
                    "(APIServer pid=1231) ERROR 12-07 04:50:30 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
                    "INFO:     Finished server process [1231]",
                ],
                "engine_core_died",
            ),
            // What killed the core wins over vLLM's account of its death.
            (
                &[
                    "RuntimeError: CUDA error: out of memory",
                    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
                ],
                "oom",
            ),
        ];
        for (lines, cause) in cases {
            let lines: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
            assert_eq!(classify_start_failure(&lines), *cause, "{lines:?}");
            let fatal = lines.iter().find(|l| is_engine_fatal(l)).expect("a fatal line");
            assert_eq!(fatal_cause(fatal), Some(*cause), "{fatal}");
        }
        // vLLM's start-up warning about the file limit names an OSError but no failure.
        let ulimit = "(APIServer pid=1) WARNING 12-07 04:47:26 [system_utils.py:255] Found ulimit of 20000 and failed to automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n";
        assert_eq!(classify_start_failure(&[ulimit.to_string()]), "other");
    }

    #[test]
    fn tunnel_errors_include_what_either_side_knew() {
        for line in [
            "Host key verification failed.",
            "ssh: connect to host a.pinggy.io port 443: Connection timed out",
            "ssh: connect to host a.pinggy.io port 443: No route to host",
            "client_loop: send disconnect: Broken pipe",
            "root@127.0.0.1: Permission denied (publickey).",
        ] {
            assert!(classify_tunnel_line(line).is_error(), "{line}");
        }
        assert_eq!(
            classify_tunnel_line("Allocated port 40123 for remote forward to localhost:8000"),
            TunnelLine::AllocatedPort(40123)
        );
    }
}
