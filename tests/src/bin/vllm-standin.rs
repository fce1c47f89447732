//! # vllm-standin — a test stand-in for `vllm serve` (test support, never shipped)
//!
//! Invoked exactly like vLLM: `vllm-standin serve <model> [flags…]` (also
//! `vllm-standin -m vllm.entrypoints.openai.api_server --model <model> …`).
//! It accepts the real option table of `vllm serve` (vLLM 0.33.0, see
//! `e2e::standin::vllm_flags`), rejects anything else with argparse's real
//! error (`vllm: error: unrecognized arguments: --foo`, exit 2), logs in
//! vLLM's formats, serves vLLM's HTTP API shapes and needs no GPU.
//!
//! Behaviour knobs (environment variables):
//!
//! | variable | meaning |
//! |---|---|
//! | `STANDIN_VLLM_STYLE` | `current` (default: vLLM 0.33 log prefix `(APIServer pid=N) INFO …`, 0.33 error texts, no `--swap-space`) or `legacy` (≤ 0.10: `INFO 11-30 05:40:01 [api_server.py:1880] …`, `Starting vLLM API server 0 on …`, V0 KV-cache text, accepts `--swap-space`) |
//! | `STANDIN_LOAD_SECONDS` | time spent "loading" between binding the port and serving (default 0.2); the port is bound but not listening meanwhile, so connections are refused, like vLLM |
//! | `STANDIN_LOAD_LOG_EVERY` | seconds between loading-progress lines (`Loading safetensors checkpoint shards: k/n`) during `STANDIN_LOAD_SECONDS` (default 0: none) |
//! | `STANDIN_LOAD_STALL=1` | after `Starting to load model …` the load hangs silently: no more output, never serves (SIGTERM still stops it) |
//! | `STANDIN_FAIL_AT_START` | `oom`, `kv_cache`, `world_size`, `model_type`, `other`: print vLLM's real error output for that failure and exit 1 |
//! | `STANDIN_OOM_ABOVE` | a `--gpu-memory-utilization` above this fails as `oom` does (vLLM's CUDA out-of-memory while loading), one at or below it loads: the ceiling a node's memory allows |
//! | `STANDIN_PRINT_ENV` | `1`: a start failure ends by printing every environment variable (`NAME=value`) on stdout, as a launcher's `trap env EXIT` does; the lines are the last of `vllm.log` |
//! | `STANDIN_FAIL_DELAY` | seconds before a start failure is printed (default 0.1) |
//! | `STANDIN_MODEL_TYPE` | the `model_type` named by the `model_type` failure (default `qwen3_5`) |
//! | `STANDIN_GPUS` | GPUs in the "node" when `CUDA_VISIBLE_DEVICES` is unset (default 8); TP×PP and TP×PP×DP are checked against it as vLLM does |
//! | `STANDIN_MODEL_MAX_LEN` | the model's own context length, used when `--max-model-len` is absent (default 32768) |
//! | `STANDIN_COMPLETION_TOKENS` | tokens generated per completion (default 16), capped by `max_tokens` and the context |
//! | `STANDIN_RESPONSE_SECONDS` | extra time each completion takes (default 0) |
//! | `STANDIN_DIE_AFTER_REQUESTS=N` | after the N-th completion request is answered, the engine "dies": the process exits 1 after vLLM's engine-death output |
//! | `STANDIN_DIE_MODE` | `exit` (default, as above) or `kill` (the process SIGKILLs itself silently, like the OOM killer) |
//! | `STANDIN_HANG_AFTER_REQUESTS=N` | after N completion requests, nothing is answered any more (health included); the process stays alive |
//! | `STANDIN_STALL_AFTER_REQUESTS=N` | after N completion requests, the engine core "hangs" (vLLM issues 39863, 36960): each further completion request is scheduled (`vllm:num_requests_running` counts it) and never answered, no token is generated, while `/health`, `/v1/models` and `/metrics` keep answering |
//! | `STANDIN_BAD_REQUEST_AFTER=N` | after N successful completions every completion gets vLLM's 400 context-overflow error (N=0: all) |
//! | `STANDIN_DOUBLE_FORK=1` | at start, double-fork a grandchild that calls setsid(), ignores SIGTERM/SIGINT/SIGHUP and sleeps forever |
//! | `STANDIN_DOUBLE_FORK_PIDFILE` | where the grandchild writes its pid |
//! | `STANDIN_IGNORE_SIGTERM=1` | the server ignores SIGTERM (SIGINT still stops it) |
//! | `STANDIN_CHAT_AGENT=terminus` | chat completions answer as a terminus-2 agent would (below) instead of `tok0 tok1 …` |
//! | `STANDIN_REQUEST_LOG` | a file each completion request body is appended to, one JSON line per request |
//! | `STANDIN_CONTROL_FILE` | a file re-read on every request: `normal`, `bad_request`, `hang`, `stall` (as `STANDIN_STALL_AFTER_REQUESTS`, from now on) or `die` switch behaviour at run time |
//! | `STANDIN_HUB` | the node's view of huggingface.co for a model not in the HF cache (`e2e::standin::hub`): `unreachable` (no internet: vLLM's real "Invalid repository ID or local directory" error), `reachable` (downloads a minimal snapshot into `$HF_HUB_CACHE`/`$HF_HOME/hub`/`~/.cache/huggingface/hub`), unset (not checked). A local dir or a cached snapshot always resolves; `HF_HUB_OFFLINE=1` without one always fails |
//! | `STANDIN_RANK_FAIL` | multi-node faults: `<rank>:start` (that node's rank exits 1 before joining) or `<rank>:after=<seconds>` (it exits 1 that long after joining) |
//! | `STANDIN_NO_METRICS=1` | `/metrics` answers 404 (a server without vLLM's counters): the supervision bench's baseline for the liveness rule's cost, nothing a test relies on |
//! | `STANDIN_VLLM_ARGS_ONLY=1` | stop after the argument checks vLLM does before binding the port: exit 0 when they pass (the stand-in contract test compares this with the real parser) |
//!
//! **Multi-node** (`--nnodes N --node-rank R --master-addr A --master-port P`, or
//! `--data-parallel-size-local L --data-parallel-address A --data-parallel-rpc-port P`, with
//! `--headless` on the secondaries): the head serves only once every node has joined over TCP, and
//! dies with an engine-death error when one leaves; a secondary connects (retrying while refused,
//! until `--distributed-timeout-seconds`) and exits 1 when the head goes (`e2e::standin::multinode`).
//!
//! **terminus-2 replies.** With `STANDIN_CHAT_AGENT=terminus` a chat reply follows terminus-2's
//! response format — JSON (`analysis`/`plan`/`commands`/`task_complete`) or, when the system prompt
//! asks for XML (`parser_name=xml`), `<response>…</response>`. The turn is the number of assistant
//! messages already in the conversation: turn 0 runs the command the task names on a line
//! `STANDIN-COMMAND: <command>` in its instruction (none: task_complete at once); later turns
//! mark the task complete (terminus-2 asks to confirm once). A request carrying
//! `chat_template_kwargs.enable_thinking: true` gets a `reasoning_content` too, like a thinking model.
//!
//! API key: `--api-key K…` or `VLLM_API_KEY`; then every path under `/v1`
//! needs `Authorization: Bearer <key>` (401 `{"error":"Unauthorized"}` otherwise).
//! SIGTERM/SIGINT while serving: vLLM's shutdown lines, exit 0. SIGTERM while
//! loading: `KeyboardInterrupt: terminated`, death by SIGINT (Python's way).
#![allow(unsafe_code)]
#![allow(clippy::print_stdout, clippy::print_stderr)]

use e2e::standin::argparse::{self, Parsed};
use e2e::standin::common as c;
use e2e::standin::multinode as mn;
use e2e::standin::vllm_flags::{CHOICES, Kind, LEGACY_FLAGS, REASONING_PARSERS, SERVE_FLAGS, TOOL_PARSERS};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const VERSION_CURRENT: &str = "0.33.0";
const VERSION_LEGACY: &str = "0.10.0";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Style {
    Current,
    Legacy,
}

/// vLLM's log output: one logger line per message line (NewLineFormatter).
#[derive(Clone)]
struct Log {
    style: Style,
    pid: u32,
}

impl Log {
    fn line(&self, proc_name: &str, pid: u32, level: &str, file: &str, line: u32, msg: &str) {
        let ts = c::vllm_timestamp();
        let head = match self.style {
            Style::Current => format!("({proc_name} pid={pid}) {level} {ts} [{file}:{line}] "),
            Style::Legacy => format!("{level} {ts} [{file}:{line}] "),
        };
        let mut out = String::new();
        for l in msg.split('\n') {
            out.push_str(&head);
            out.push_str(l);
            out.push('\n');
        }
        print!("{out}");
    }
    fn api(&self, level: &str, file: &str, line: u32, msg: &str) {
        self.line("APIServer", self.pid, level, file, line, msg);
    }
    fn engine(&self, dp: u64, rank: u64, level: &str, file: &str, line: u32, msg: &str) {
        let name = if dp > 1 { format!("EngineCore_DP{rank}") } else { "EngineCore".to_string() };
        self.line(&name, self.pid + 1 + rank as u32, level, file, line, msg);
    }
    /// uvicorn's default handler (stderr): `INFO:     message`.
    fn uvicorn(&self, msg: &str) {
        eprintln!("INFO:     {msg}");
    }
}

/// Resolved settings of one `serve` invocation.
#[derive(Clone, Debug)]
struct Cfg {
    style: Style,
    model: String,
    served: Vec<String>,
    host: Option<String>,
    port: u16,
    tp: u64,
    pp: u64,
    dp: u64,
    api_server_count: u64,
    max_model_len: u64,
    max_num_seqs: u64,
    gpu_mem_util: f64,
    api_keys: Vec<String>,
    uvicorn_level: String,
    access_log: bool,
    non_default: Vec<(String, String)>,
    /// Multi-node: this process's place (e2e::standin::multinode), `None` on one node.
    place: Option<mn::Place>,
    headless: bool,
}

fn usage(prog: &str) -> String {
    if prog == "vllm serve" {
        "usage: vllm serve [model_tag] [options]".to_string()
    } else {
        format!("usage: {prog} [-h] [options]")
    }
}

fn arg_error(prog: &str, msg: &str) -> ! {
    // Arguments the serve subparser leaves over are reported by the top-level `vllm` parser.
    if prog == "vllm serve" && msg.starts_with("unrecognized arguments: ") {
        eprintln!("{VLLM_USAGE}");
        eprintln!("vllm: error: {msg}");
    } else {
        eprintln!("{}", usage(prog));
        eprintln!("{prog}: error: {msg}");
    }
    std::process::exit(2);
}

/// `vllm`'s own usage (vLLM 0.33.0's subcommands), as argparse wraps it.
const VLLM_USAGE: &str = "usage: vllm [-h] [-v]\n            {chat,complete,serve,launch,bench,collect-env,download-kernels,preload,run-batch,snapshot}\n            ...";

/// Print a Python traceback ending in `last` (which may span lines) to stderr.
fn traceback(frames: &[(&str, u32, &str, &str)], last: &str) {
    let mut s = String::from("Traceback (most recent call last):\n");
    for (file, line, func, code) in frames {
        s.push_str(&format!("  File \"{file}\", line {line}, in {func}\n    {code}\n"));
    }
    s.push_str(last);
    s.push('\n');
    eprint!("{s}");
}

const SITE: &str = "/opt/venv/lib/python3.12/site-packages";

/// vLLM's `validate_parsed_serve_args` refusing the arguments (`raise TypeError("Error: …")` at
/// `line` of cli_args.py): its traceback, exit 1.
fn serve_args_refused(line: u32, problem: &str) -> ! {
    let raise = format!("raise TypeError(\"Error: {problem}\")");
    let mut frames: Vec<(&str, u32, &str, &str)> = main_frames();
    frames.truncate(2);
    frames[1] =
        ("/opt/venv/lib/python3.12/site-packages/vllm/entrypoints/cli/main.py", 118, "main", "cmd.validate(args)");
    frames.push((
        "/opt/venv/lib/python3.12/site-packages/vllm/entrypoints/common/cli_args.py",
        line,
        "validate_parsed_serve_args",
        &raise,
    ));
    traceback(&frames, &format!("TypeError: Error: {problem}"));
    std::process::exit(1);
}

fn main_frames() -> Vec<(&'static str, u32, &'static str, &'static str)> {
    vec![
        ("/opt/venv/bin/vllm", 10, "<module>", "sys.exit(main())"),
        (
            "/opt/venv/lib/python3.12/site-packages/vllm/entrypoints/cli/main.py",
            122,
            "main",
            "args.dispatch_function(args)",
        ),
        (
            "/opt/venv/lib/python3.12/site-packages/vllm/entrypoints/cli/serve.py",
            263,
            "cmd",
            "uvloop.run(run_server(args))",
        ),
    ]
}

fn python_repr(v: &str) -> String {
    if v.parse::<i64>().is_ok()
        || v.parse::<f64>().is_ok()
        || v.starts_with('{')
        || v.starts_with('[')
        || v == "True"
        || v == "False"
    {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\'', "\\'"))
    }
}

/// `human_readable_int_or_auto`: `32768`, `32k`, `1M`, `auto`, `-1`.
fn parse_len(v: &str) -> Option<Option<u64>> {
    let t = v.trim();
    if t.eq_ignore_ascii_case("auto") || t == "-1" {
        return Some(None);
    }
    if let Ok(n) = t.parse::<u64>() {
        return Some(Some(n));
    }
    let (num, mult) = match t.chars().last()? {
        'k' => (&t[..t.len() - 1], 1000.0),
        'K' => (&t[..t.len() - 1], 1024.0),
        'm' => (&t[..t.len() - 1], 1_000_000.0),
        'M' => (&t[..t.len() - 1], 1_048_576.0),
        'g' => (&t[..t.len() - 1], 1e9),
        'G' => (&t[..t.len() - 1], 1_073_741_824.0),
        _ => return None,
    };
    num.parse::<f64>().ok().map(|f| Some((f * mult) as u64))
}

fn parse_cli(argv: &[String], style: Style) -> Cfg {
    // Forms: `serve <model> …` or `-m vllm.entrypoints.openai.api_server --model <model> …`.
    let (prog, rest): (String, Vec<String>) = if argv.first().map(String::as_str) == Some("serve") {
        ("vllm serve".into(), argv[1..].to_vec())
    } else if argv.first().map(String::as_str) == Some("-m") && argv.get(1).is_some_and(|m| m.ends_with("api_server")) {
        ("api_server.py".into(), argv[2..].to_vec())
    } else if argv.first().is_some_and(|a| a == "--version" || a == "-v") {
        println!("{}", if style == Style::Legacy { VERSION_LEGACY } else { VERSION_CURRENT });
        std::process::exit(0);
    } else {
        eprintln!("usage: vllm [-h] [-v] {{chat,complete,serve,bench,collect-env,run-batch}} ...");
        match argv.first() {
            Some(cmd) => eprintln!(
                "vllm: error: argument subparser: invalid choice: '{cmd}' (choose from chat, complete, serve, bench, collect-env, run-batch)"
            ),
            None => eprintln!("vllm: error: a subcommand is required"),
        }
        std::process::exit(2);
    };
    if rest.iter().any(|a| a == "-h" || a == "--help" || a.starts_with("--help=")) {
        println!("{}", usage(&prog));
        println!("\nLaunch a local OpenAI-compatible API server to serve LLM completions via HTTP. (vllm-standin)");
        std::process::exit(0);
    }
    let mut table: Vec<(&[&str], Kind)> = SERVE_FLAGS.to_vec();
    if style == Style::Legacy {
        table.extend_from_slice(LEGACY_FLAGS);
    }
    if prog == "api_server.py" {
        table.push((&["--model"], Kind::Value));
    }
    // `vllm serve --model X …`: FlexibleArgumentParser moves X to the front with a warning.
    let mut rest = rest;
    if prog == "vllm serve" {
        if let Some(idx) = rest.iter().position(|a| a == "--model" || a.starts_with("--model=")) {
            eprintln!(
                "WARNING {} [argparse_utils.py:337] With `vllm serve`, you should provide the model as a positional argument or in a config file instead of via the `--model` option. The `--model` option will be removed in a future version.",
                c::vllm_timestamp()
            );
            let (tag, end) = if rest[idx] == "--model" {
                (rest.get(idx + 1).cloned().unwrap_or_default(), idx + 2)
            } else {
                (rest[idx]["--model=".len()..].to_string(), idx + 1)
            };
            let mut moved = vec![tag];
            moved.extend_from_slice(&rest[..idx]);
            moved.extend_from_slice(&rest[end.min(rest.len())..]);
            rest = moved;
        } else if rest.first().is_some_and(|a| a.starts_with('-'))
            && rest.iter().any(|a| a.starts_with("--served-model-name") || a.starts_with("--served_model_name"))
            && !rest.iter().any(|a| a == "--config" || a.starts_with("--config="))
        {
            traceback(
                &[("/opt/venv/bin/vllm", 10, "<module>", "sys.exit(main())")],
                "ValueError: `model` should be provided as the first positional argument when using `vllm serve`. i.e. `vllm serve <model> --<arg> <value>`.",
            );
            std::process::exit(1);
        }
    }
    let p: Parsed = match argparse::parse(&rest, &table) {
        Ok(p) => p,
        Err(e) => arg_error(&prog, &e.0),
    };
    let model = p.one("model").or_else(|| p.model_tag.clone()).unwrap_or_else(|| "Qwen/Qwen3-0.6B".to_string());
    if prog == "api_server.py" && p.model_tag.is_some() {
        arg_error(&prog, &format!("unrecognized arguments: {}", p.model_tag.clone().unwrap_or_default()));
    }
    let int_arg = |dest: &str, default: u64| -> u64 {
        match p.one(dest) {
            None => default,
            Some(v) => v.trim().parse::<u64>().unwrap_or_else(|_| {
                arg_error(
                    &prog,
                    &format!("argument {}: invalid int value: '{v}'", argparse::display_names(&table, dest)),
                )
            }),
        }
    };
    let port = int_arg("port", 8000);
    if port > 65535 {
        traceback(&main_frames(), "OverflowError: bind(): port must be 0-65535.");
        std::process::exit(1);
    }
    let tp = int_arg("tensor_parallel_size", 1);
    let pp = int_arg("pipeline_parallel_size", 1);
    let dp = int_arg("data_parallel_size", 1);
    let max_num_seqs = int_arg("max_num_seqs", 256);
    int_arg("seed", 0);
    let api_server_count = p.one("api_server_count").and_then(|v| v.parse().ok()).unwrap_or(dp);
    let timeout_s = p.one("distributed_timeout_seconds").map(|v| {
        v.trim().parse::<f64>().unwrap_or_else(|_| {
            arg_error(&prog, &format!("argument --distributed-timeout-seconds: invalid int value: '{v}'"))
        })
    });
    let place = mn::place(
        int_arg("nnodes", 1),
        int_arg("node_rank", 0),
        p.one("master_addr"),
        int_arg("master_port", 29501),
        dp,
        p.one("data_parallel_size_local").map(|_| int_arg("data_parallel_size_local", dp)),
        int_arg("data_parallel_start_rank", 0),
        p.one("data_parallel_address"),
        int_arg("data_parallel_rpc_port", 29550),
        timeout_s,
    );
    let headless = p.flag("headless") == Some(true);
    let gpu_mem_util = match p.one("gpu_memory_utilization") {
        None => 0.9,
        Some(v) => v.trim().parse::<f64>().unwrap_or_else(|_| {
            arg_error(
                &prog,
                &format!("argument --gpu-memory-utilization/--device-memory-utilization: invalid float value: '{v}'"),
            )
        }),
    };
    if let Some(v) = p.one("swap_space")
        && v.trim().parse::<f64>().is_err()
    {
        arg_error(&prog, &format!("argument --swap-space: invalid float value: '{v}'"));
    }
    let model_len = c::env_u64("STANDIN_MODEL_MAX_LEN").unwrap_or(32768);
    let max_model_len = match p.one("max_model_len") {
        None => model_len,
        Some(v) => match parse_len(&v) {
            Some(Some(n)) => n,
            Some(None) => model_len,
            None => {
                arg_error(&prog, &format!("argument --max-model-len: invalid human_readable_int_or_auto value: '{v}'"))
            }
        },
    };
    // JSON-valued options (argparse type json.loads / union_dict_and_str).
    for (dest, strict) in [
        ("hf_overrides", false),
        ("limit_mm_per_prompt", true),
        ("override_generation_config", true),
        ("model_loader_extra_config", true),
        ("default_chat_template_kwargs", true),
    ] {
        if let Some(v) = p.one(dest) {
            let looks = v.trim_start().starts_with('{') && v.trim_end().ends_with('}');
            if (strict || looks) && serde_json::from_str::<Value>(&v).is_err() {
                arg_error(
                    &prog,
                    &format!(
                        "argument {}: Value {v} cannot be converted to <function loads at 0x7f2c4d6b1d00>.",
                        argparse::display_names(&table, dest)
                    ),
                );
            }
        }
    }
    for (option, choices) in CHOICES {
        let dest = option.trim_start_matches('-').replace('-', "_");
        if let Some(v) = p.one(&dest)
            && !choices.contains(&v.as_str())
        {
            arg_error(
                &prog,
                &format!(
                    "argument {}: invalid choice: '{v}' (choose from {})",
                    argparse::display_names(&table, &dest),
                    choices.iter().map(|c| format!("'{c}'")).collect::<Vec<_>>().join(", ")
                ),
            );
        }
    }
    let uvicorn_level = p.one("uvicorn_log_level").unwrap_or_else(|| "info".into());
    // validate_parsed_serve_args (before logging is decorated).
    if p.flag("enable_auto_tool_choice") == Some(true) && p.one("tool_call_parser").is_none() {
        serve_args_refused(554, "--enable-auto-tool-choice requires --tool-call-parser");
    }
    if p.flag("enable_log_outputs") == Some(true) && p.flag("enable_log_requests") != Some(true) {
        serve_args_refused(557, "--enable-log-outputs requires --enable-log-requests");
    }
    let mut api_keys: Vec<String> =
        p.many("api_key").unwrap_or_default().into_iter().filter(|k| !k.is_empty()).collect();
    if api_keys.is_empty()
        && let Some(k) = c::env_str("VLLM_API_KEY")
    {
        api_keys.push(k);
    }
    let served = p.many("served_model_name").unwrap_or_else(|| vec![model.clone()]);
    // "non-default args" as vLLM logs them (api_key redacted in the current style).
    let mut non_default = Vec::new();
    if let Some(t) = &p.model_tag {
        non_default.push(("model_tag".to_string(), python_repr(t)));
    }
    for (names, _) in &table {
        let dest =
            names.iter().find(|n| n.starts_with("--")).unwrap_or(&names[0]).trim_start_matches('-').replace('-', "_");
        let Some(v) = p.values.get(&dest) else { continue };
        let shown = match v {
            argparse::Val::Bool(b) => {
                if *b {
                    "True".into()
                } else {
                    "False".into()
                }
            }
            argparse::Val::One(Some(s)) => python_repr(s),
            argparse::Val::One(None) => "True".into(),
            argparse::Val::Many(v) => format!("[{}]", v.iter().map(|s| python_repr(s)).collect::<Vec<_>>().join(", ")),
        };
        let shown = if style == Style::Current && ["api_key", "hf_token"].contains(&dest.as_str()) {
            "'***'".to_string()
        } else {
            shown
        };
        non_default.push((dest, shown));
    }
    if p.model_tag.is_some() || p.one("model").is_some() {
        non_default.push(("model".to_string(), python_repr(&model)));
    }
    // Parser names are checked when the server is set up (validate_api_server_args).
    let tool_plugin = p.one("tool_parser_plugin").is_some();
    if p.flag("enable_auto_tool_choice") == Some(true) && !tool_plugin {
        let parser = p.one("tool_call_parser").unwrap_or_default();
        if !TOOL_PARSERS.contains(&parser.as_str()) {
            INVALID_PARSER.lock().unwrap_or_else(|e| e.into_inner()).replace(format!(
                "KeyError: 'invalid tool call parser: {parser} (chose from {{ {} }})'",
                TOOL_PARSERS.join(",")
            ));
        }
    }
    if let Some(r) = p.one("reasoning_parser")
        && !r.is_empty()
        && !r.eq_ignore_ascii_case("none")
        && p.one("reasoning_parser_plugin").is_none()
        && !REASONING_PARSERS.contains(&r.as_str())
    {
        INVALID_PARSER.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(format!(
            "KeyError: 'invalid reasoning parser: {r} (chose from {{ {} }})'",
            REASONING_PARSERS.join(",")
        ));
    }
    Cfg {
        style,
        model,
        served,
        host: p.one("host"),
        port: port as u16,
        tp,
        pp,
        dp,
        api_server_count,
        max_model_len,
        max_num_seqs,
        gpu_mem_util,
        api_keys,
        access_log: p.flag("disable_uvicorn_access_log") != Some(true),
        uvicorn_level,
        non_default,
        place,
        headless,
    }
}

static DYING: AtomicBool = AtomicBool::new(false);
static INVALID_PARSER: Mutex<Option<String>> = Mutex::new(None);

// ------------------------------------------------------------------ startup

/// Wait `secs`, returning early (and dying like vLLM) on SIGTERM/SIGINT.
fn interruptible_sleep(log: &Log, secs: f64) {
    let deadline = Instant::now() + Duration::from_secs_f64(secs.max(0.0));
    loop {
        if let Some(sig) = c::pending_signal()
            && !(sig == libc::SIGTERM && c::env_flag("STANDIN_IGNORE_SIGTERM"))
        {
            let _ = log;
            let mut frames = main_frames();
            frames.push((
                "/opt/venv/lib/python3.12/site-packages/vllm/entrypoints/launchers/api_server/entry.py",
                186,
                "_interrupt_init",
                "raise KeyboardInterrupt(\"terminated\")",
            ));
            let msg = if sig == libc::SIGTERM { "KeyboardInterrupt: terminated" } else { "KeyboardInterrupt" };
            traceback(&frames, msg);
            c::raise_signal(libc::SIGINT);
        }
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(20)));
    }
}

fn gpu_count() -> (u64, Option<String>) {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) => {
            let n = v.split(',').filter(|s| !s.trim().is_empty()).count() as u64;
            (n, Some(v))
        }
        Err(_) => (c::env_u64("STANDIN_GPUS").unwrap_or(8), None),
    }
}

fn validation_error(class: &str, msg: &str) -> String {
    format!(
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for {class}\n  Value error, {msg} [type=value_error, input_value=ArgsKwargs((), {{}}), input_type=ArgsKwargs]\n    For further information visit https://errors.pydantic.dev/2.12/v/value_error"
    )
}

fn config_frames() -> Vec<(&'static str, u32, &'static str, &'static str)> {
    let mut f = main_frames();
    f.extend([
        (
            "/opt/venv/lib/python3.12/site-packages/vllm/entrypoints/launchers/api_server/entry.py",
            198,
            "run_server_worker",
            "async with build_async_engine_client(",
        ),
        (
            "/opt/venv/lib/python3.12/site-packages/vllm/entrypoints/launchers/api_server/entry.py",
            82,
            "build_async_engine_client_from_engine_args",
            "vllm_config = engine_args.create_engine_config(usage_context=usage_context)",
        ),
        (
            "/opt/venv/lib/python3.12/site-packages/vllm/engine/arg_utils.py",
            2141,
            "create_engine_config",
            "parallel_config = ParallelConfig(",
        ),
    ]);
    f
}

/// Failures raised while the engine config is created (API server process).
fn fail_config(cfg: &Cfg, log: &Log, kind: &str) -> ! {
    c::sleep_secs(c::env_f64("STANDIN_FAIL_DELAY", 0.1));
    let (gpus, cvd) = gpu_count();
    let world = cfg.tp * cfg.pp;
    let last = match kind {
        "world_size" => {
            let msg = format!(
                "World size ({world}) is larger than the number of available GPUs ({gpus}) in this node. If this is intentional and you are using:\n- ray, set '--distributed-executor-backend ray'.\n- multiprocessing, set '--nnodes' appropriately."
            );
            match cfg.style {
                Style::Current => validation_error("ParallelConfig", &msg),
                Style::Legacy => format!("ValueError: {msg}"),
            }
        }
        "dp_devices" => {
            let start = world;
            let end = 2 * world;
            format!(
                "Exception: Error computing device indices for CUDA_VISIBLE_DEVICES: local range: [{start}, {end}) base value: \"{}\"",
                cvd.unwrap_or_default()
            )
        }
        _ => {
            let mt = c::env_str("STANDIN_MODEL_TYPE").unwrap_or_else(|| "qwen3_5".into());
            let msg = format!(
                "The checkpoint you are trying to load has model type `{mt}` but Transformers does not recognize this architecture. This could be because of an issue with the checkpoint, or because your version of Transformers is out of date.\n\nYou can update Transformers with the command `pip install --upgrade transformers`. If this does not work, and the checkpoint is very new, then there may not be a release version that supports this model yet. In this case, you can get the most up-to-date code by installing Transformers from source with the command `pip install git+https://github.com/huggingface/transformers.git`"
            );
            match cfg.style {
                Style::Current => validation_error("ModelConfig", &msg),
                Style::Legacy => format!("ValueError: {msg}"),
            }
        }
    };
    let _ = log;
    traceback(&config_frames(), &last);
    std::process::exit(1);
}

fn engine_config_line(cfg: &Cfg) -> String {
    format!(
        "Initializing a V1 LLM engine (v{}) with config: model='{m}', speculative_config=None, tokenizer='{m}', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len={}, download_dir=None, load_format=auto, tensor_parallel_size={}, pipeline_parallel_size={}, data_parallel_size={}, disable_custom_all_reduce=False, quantization=None, enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, seed=0, served_model_name={}, enable_prefix_caching=True, enable_chunked_prefill=True, max_num_seqs={}",
        version(cfg.style),
        cfg.max_model_len,
        cfg.tp,
        cfg.pp,
        cfg.dp,
        cfg.served.first().cloned().unwrap_or_default(),
        cfg.max_num_seqs,
        m = cfg.model
    )
}

fn version(style: Style) -> &'static str {
    if style == Style::Legacy { VERSION_LEGACY } else { VERSION_CURRENT }
}

/// Failures inside the engine core process (OOM, KV cache, other).
fn fail_engine(cfg: &Cfg, log: &Log, kind: &str) -> ! {
    c::sleep_secs(c::env_f64("STANDIN_FAIL_DELAY", 0.1));
    let total = 79.19;
    let exc = match kind {
        "oom" => format!(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of {total:.2} GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the allocated memory 76.55 GiB is allocated by PyTorch, and 512.40 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        ),
        "kv_cache" => {
            let len = cfg.max_model_len;
            let est = (len / 2).max(1);
            match cfg.style {
                Style::Current => format!(
                    "ValueError: To serve at least one request with the model's max seq len ({len}), ({:.2} GiB KV cache is needed, which is larger than the available KV cache memory ({:.2} GiB). Based on the available memory, the estimated maximum model length is {est}. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
                    len as f64 * 0.000_183_1,
                    len as f64 * 0.000_091_5
                ),
                Style::Legacy => format!(
                    "ValueError: The model's max seq len ({len}) is larger than the maximum number of tokens that can be stored in KV cache ({est}). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
                ),
            }
        }
        _ => "RuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.".to_string(),
    };
    let frames: Vec<(&str, u32, &str, &str)> = vec![
        (
            "/opt/venv/lib/python3.12/site-packages/vllm/v1/engine/core.py",
            1540,
            "run_engine_core",
            "engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
        ),
        (
            "/opt/venv/lib/python3.12/site-packages/vllm/v1/engine/core.py",
            131,
            "__init__",
            "num_gpu_blocks, num_cpu_blocks, kv_cache_config = self._initialize_kv_caches(",
        ),
        (
            "/opt/venv/lib/python3.12/site-packages/vllm/v1/worker/gpu_worker.py",
            402,
            "determine_available_memory",
            "self.model_runner.profile_run()",
        ),
    ];
    match cfg.style {
        Style::Current => {
            let mut tb = String::from("EngineCore failed to start.\nTraceback (most recent call last):\n");
            for (f, l, func, code) in &frames {
                tb.push_str(&format!("  File \"{f}\", line {l}, in {func}\n    {code}\n"));
            }
            tb.push_str(&exc);
            log.engine(cfg.dp, 0, "ERROR", "core.py", 1584, &tb);
            let name = if cfg.dp > 1 { "EngineCore_DP0" } else { "EngineCore" };
            eprintln!("Process {name}:");
            let mut mp = vec![
                ("/usr/lib/python3.12/multiprocessing/process.py", 314, "_bootstrap", "self.run()"),
                (
                    "/usr/lib/python3.12/multiprocessing/process.py",
                    108,
                    "run",
                    "self._target(*self._args, **self._kwargs)",
                ),
            ];
            mp.extend(frames.iter().copied());
            traceback(&mp, &exc);
            let mut api = config_frames();
            api.truncate(5);
            api.push((
                "/opt/venv/lib/python3.12/site-packages/vllm/v1/engine/utils.py",
                1474,
                "wait_for_engine_startup",
                "raise RuntimeError(",
            ));
            traceback(
                &api,
                &format!(
                    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{'{name}': 1}}"
                ),
            );
        }
        Style::Legacy => {
            let mut f = main_frames();
            f.extend(frames.iter().copied());
            traceback(&f, &exc);
        }
    }
    // A launcher that dumps its environment on failure: payload's records must not carry what it
    // prints (issue 21, item 5).
    if c::env_flag("STANDIN_PRINT_ENV") {
        let mut vars: Vec<(String, String)> = std::env::vars().collect();
        vars.sort();
        println!("{}", vars.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("\n"));
    }
    std::process::exit(1);
}

/// Bind the server socket without listening (vLLM binds before loading the
/// engine, so the port is taken but connections are refused until it serves).
/// The multi-node rendezvous (e2e::standin::multinode): the head returns once every node has
/// joined (and dies later if one leaves); a secondary never returns.
fn rendezvous(cfg: &Cfg, log: &Log, place: &mn::Place) {
    let interrupted = || c::pending_signal().is_some();
    let say = |msg: &str| log.engine(cfg.dp, 0, "INFO", "parallel_state.py", 1213, msg);
    let fault = mn::fault_for(c::env_str("STANDIN_RANK_FAIL").as_deref(), place.index);
    if place.index == 0 {
        match mn::head_wait(place, &say, &interrupted) {
            Ok(peers) => {
                let (dp, style) = (cfg.dp, cfg.style);
                let pid = log.pid;
                std::thread::spawn(move || {
                    let lost = mn::first_lost(peers);
                    let log = Log { style, pid };
                    log.engine(
                        dp,
                        0,
                        "ERROR",
                        "core.py",
                        1584,
                        &format!("EngineCore encountered a fatal error: connection to node {lost} lost"),
                    );
                    traceback(
                        &main_frames(),
                        &format!(
                            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue (node {lost} left the distributed group). See stack trace (above) for the root cause."
                        ),
                    );
                    std::process::exit(1);
                });
            }
            Err(e) if e == "interrupted" => c::raise_signal(libc::SIGINT),
            Err(e) => {
                traceback(&main_frames(), &e);
                std::process::exit(1);
            }
        }
        return;
    }
    log.api("INFO", "serve.py", 214, &format!("Running in headless mode (node {} of {})", place.index, place.nodes));
    if fault == Some(None) {
        traceback(&main_frames(), "RuntimeError: CUDA error: no CUDA-capable device is detected");
        std::process::exit(1);
    }
    let stream = match mn::join(place, &interrupted) {
        Ok(stream) => stream,
        Err(e) if e == "interrupted" => std::process::exit(0),
        Err(e) => {
            traceback(&main_frames(), &e);
            std::process::exit(1);
        }
    };
    say(&format!("joined the head at {}:{} as node {}", place.addr, place.port, place.index));
    match mn::hold(stream, &interrupted, fault.flatten()) {
        mn::Held::Interrupted => {
            log.api("INFO", "serve.py", 240, "Shutting down headless engine");
            std::process::exit(0);
        }
        mn::Held::HeadGone => {
            traceback(
                &main_frames(),
                "RuntimeError: connection to the head node closed (the distributed group is gone)",
            );
            std::process::exit(1);
        }
        mn::Held::Fault => {
            traceback(&main_frames(), "RuntimeError: CUDA error: an illegal memory access was encountered");
            std::process::exit(1);
        }
    }
}

fn bind_socket(host: &str, port: u16) -> std::io::Result<i32> {
    use std::net::ToSocketAddrs;
    let addr = (if host.is_empty() { "0.0.0.0" } else { host }, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("no address"))?;
    // SAFETY: plain BSD socket calls on a fresh descriptor; the sockaddr
    // structures live on the stack for the duration of the calls.
    unsafe {
        let one: libc::c_int = 1;
        match addr {
            std::net::SocketAddr::V4(a) => {
                let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, (&one as *const libc::c_int).cast(), 4);
                let mut sa: libc::sockaddr_in = std::mem::zeroed();
                sa.sin_family = libc::AF_INET as libc::sa_family_t;
                sa.sin_port = a.port().to_be();
                sa.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) };
                if libc::bind(
                    fd,
                    (&sa as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as u32,
                ) != 0
                {
                    let e = std::io::Error::last_os_error();
                    libc::close(fd);
                    return Err(e);
                }
                Ok(fd)
            }
            std::net::SocketAddr::V6(a) => {
                let fd = libc::socket(libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, (&one as *const libc::c_int).cast(), 4);
                let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
                sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sa.sin6_port = a.port().to_be();
                sa.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
                if libc::bind(
                    fd,
                    (&sa as *const libc::sockaddr_in6).cast(),
                    std::mem::size_of::<libc::sockaddr_in6>() as u32,
                ) != 0
                {
                    let e = std::io::Error::last_os_error();
                    libc::close(fd);
                    return Err(e);
                }
                Ok(fd)
            }
        }
    }
}

fn listen_on(fd: i32) -> std::net::TcpListener {
    use std::os::fd::FromRawFd;
    // SAFETY: `fd` is a bound TCP socket this process owns; ownership moves to
    // the TcpListener.
    unsafe {
        libc::listen(fd, 2048);
        std::net::TcpListener::from_raw_fd(fd)
    }
}

// ------------------------------------------------------------------- state

#[derive(Default)]
struct Metrics {
    running: i64,
    prompt_tokens: u64,
    generation_tokens: u64,
    success: BTreeMap<&'static str, u64>,
    http: BTreeMap<(String, String, String), u64>,
    e2e: Vec<f64>,
}

struct State {
    cfg: Cfg,
    log: Log,
    start: f64,
    completions: AtomicU64,
    successes: AtomicU64,
    hung: AtomicBool,
    metrics: Mutex<Metrics>,
}

const FINISH_REASONS: [&str; 5] = ["stop", "length", "abort", "error", "repetition"];
const E2E_BUCKETS: [f64; 12] = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0];

fn status_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        422 => "Unprocessable Entity",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

fn control_mode() -> String {
    c::env_str("STANDIN_CONTROL_FILE")
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_ascii_lowercase())
        .unwrap_or_else(|| "normal".into())
}

fn hang_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The engine dies (knob or control file): vLLM's engine-death output, exit 1,
/// or a silent SIGKILL with `STANDIN_DIE_MODE=kill`.
fn die(st: &State) -> ! {
    if DYING.swap(true, Ordering::SeqCst) {
        hang_forever();
    }
    if c::env_str("STANDIN_DIE_MODE").as_deref() == Some("kill") {
        c::raise_signal(libc::SIGKILL);
    }
    let cfg = &st.cfg;
    let log = &st.log;
    match cfg.style {
        Style::Current => {
            log.engine(cfg.dp, 0, "ERROR", "core.py", 1590, "EngineCore encountered a fatal error.\nTraceback (most recent call last):\n  File \"/opt/venv/lib/python3.12/site-packages/vllm/v1/engine/core.py\", line 1561, in run_engine_core\n    engine_core.run_busy_loop()\n  File \"/opt/venv/lib/python3.12/site-packages/vllm/v1/executor/multiproc_executor.py\", line 288, in get_response\n    raise RuntimeError(\nRuntimeError: Worker failed with error 'CUDA error: an illegal memory access was encountered', please check the stack trace above for the root cause");
            log.api("ERROR", "async_llm.py", 540, "AsyncLLM output_handler failed.\nvllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.");
            log.api("INFO", "launcher.py", 256, "[shutdown] API server: shutdown triggered");
        }
        Style::Legacy => {
            log.api("ERROR", "async_llm.py", 420, "AsyncLLM output_handler failed.\nvllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.");
        }
    }
    shutdown_uvicorn(st);
    std::process::exit(1);
}

fn shutdown_uvicorn(st: &State) {
    if uvicorn_info(&st.cfg) {
        st.log.uvicorn("Shutting down");
        st.log.uvicorn("Waiting for application shutdown.");
        st.log.uvicorn("Application shutdown complete.");
        st.log.uvicorn(&format!("Finished server process [{}]", st.log.pid));
    }
}

fn uvicorn_info(cfg: &Cfg) -> bool {
    matches!(cfg.uvicorn_level.as_str(), "info" | "debug" | "trace")
}

fn error_json(style: Style, message: &str, typ: &str, param: Option<&str>, code: u16) -> Value {
    match style {
        Style::Current => json!({"error": {"message": message, "type": typ, "param": param, "code": code}}),
        Style::Legacy => json!({"object": "error", "message": message, "type": typ, "param": param, "code": code}),
    }
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("")
        }
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn prompt_tokens(body: &Value, chat: bool) -> u64 {
    if chat {
        let msgs = body.get("messages").and_then(Value::as_array).cloned().unwrap_or_default();
        let mut n = 3;
        for m in &msgs {
            n += 4 + c::approx_tokens(&text_of(m.get("content").unwrap_or(&Value::Null)));
        }
        if let Some(t) = body.get("tools") {
            n += c::approx_tokens(&t.to_string());
        }
        n
    } else {
        match body.get("prompt") {
            Some(Value::String(s)) => c::approx_tokens(s),
            Some(Value::Array(a)) => a.iter().map(|p| p.as_str().map(c::approx_tokens).unwrap_or(1)).sum(),
            _ => 0,
        }
    }
}

struct Reply {
    status: u16,
    body: String,
    content_type: &'static str,
}

impl Reply {
    fn json(status: u16, v: Value) -> Reply {
        Reply { status, body: v.to_string(), content_type: "application/json" }
    }
}

fn overflow_message(max_len: u64, prompt: u64, max_tokens: Option<u64>) -> (String, &'static str) {
    match max_tokens {
        Some(mt) if prompt <= max_len => (
            format!(
                "'max_tokens' or 'max_completion_tokens' is too large: {mt}. This model's maximum context length is {max_len} tokens and your request has {prompt} input tokens ({mt} > {max_len} - {prompt}). (parameter=max_tokens, value={mt})"
            ),
            "max_tokens",
        ),
        _ => {
            let p = prompt.max(max_len + 1);
            (
                format!(
                    "This model's maximum context length is {max_len} tokens. However, your prompt contains {p} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value={p})"
                ),
                "input_tokens",
            )
        }
    }
}

/// What a terminus-2 agent answers in this conversation (see the module doc): the reply text and,
/// for a request that enables thinking, the reasoning.
fn terminus_reply(body: &Value) -> (String, Option<String>) {
    let msgs = body.get("messages").and_then(Value::as_array).cloned().unwrap_or_default();
    let turn = msgs.iter().filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant")).count();
    let texts: Vec<String> = msgs.iter().map(|m| text_of(m.get("content").unwrap_or(&Value::Null))).collect();
    let xml = texts.first().is_some_and(|t| t.contains("Format your response as XML"));
    let command = texts
        .iter()
        .flat_map(|t| t.lines())
        .find_map(|l| l.trim().strip_prefix("STANDIN-COMMAND:"))
        .map(|c| c.trim().to_string())
        .filter(|_| turn == 0);
    let complete = command.is_none();
    let analysis = if complete { "The task is done." } else { "The task names the command to run." };
    let text = if xml {
        let keys = command.map(|c| format!("<keystrokes duration=\"0.5\">{c}\n</keystrokes>\n")).unwrap_or_default();
        format!(
            "<response>\n<analysis>{analysis}</analysis>\n<plan>Run it, then confirm.</plan>\n<commands>\n{keys}</commands>\n<task_complete>{complete}</task_complete>\n</response>"
        )
    } else {
        let commands: Vec<Value> =
            command.map(|c| json!({"keystrokes": format!("{c}\n"), "duration": 0.5})).into_iter().collect();
        json!({"analysis": analysis, "plan": "Run it, then confirm.", "commands": commands, "task_complete": complete})
            .to_string()
    };
    let thinking = body.pointer("/chat_template_kwargs/enable_thinking").and_then(Value::as_bool) == Some(true);
    (text, thinking.then(|| format!("Turn {turn}: read the task, then act.")))
}

/// Appends the request body to `STANDIN_REQUEST_LOG` (tests read what the agent really sent).
fn log_request(body: &Value) {
    static LOCK: Mutex<()> = Mutex::new(());
    if let Some(path) = c::env_str("STANDIN_REQUEST_LOG") {
        let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{body}");
        }
    }
}

fn completion(st: &State, body: &Value, chat: bool, mode: &str) -> Reply {
    let cfg = &st.cfg;
    log_request(body);
    let n = st.completions.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(h) = c::env_u64("STANDIN_HANG_AFTER_REQUESTS")
        && n > h
    {
        st.hung.store(true, Ordering::SeqCst);
        hang_forever();
    }
    if mode == "stall" || c::env_u64("STANDIN_STALL_AFTER_REQUESTS").is_some_and(|k| n > k) {
        // A hung engine core: the request is in the running batch and never produces a token.
        st.metrics.lock().unwrap_or_else(|e| e.into_inner()).running += 1;
        hang_forever();
    }
    let model = body.get("model").and_then(Value::as_str);
    if let Some(m) = model
        && !cfg.served.iter().any(|s| s == m)
    {
        let msg = format!("The model `{m}` does not exist. Valid aliases: {}.", cfg.served.join(", "));
        return Reply::json(404, error_json(cfg.style, &msg, "NotFoundError", Some("model"), 404));
    }
    if chat && body.get("messages").and_then(Value::as_array).is_none() {
        return Reply::json(
            400,
            error_json(
                cfg.style,
                "[{'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required', 'input': {}}]",
                "BadRequestError",
                None,
                400,
            ),
        );
    }
    let prompt = prompt_tokens(body, chat);
    let max_tokens = body
        .get("max_completion_tokens")
        .or_else(|| body.get("max_tokens"))
        .and_then(Value::as_u64)
        .or(if chat { None } else { Some(16) });
    let forced = mode == "bad_request"
        || c::env_u64("STANDIN_BAD_REQUEST_AFTER").is_some_and(|k| st.successes.load(Ordering::SeqCst) >= k);
    let overflow = prompt > cfg.max_model_len || max_tokens.is_some_and(|mt| prompt + mt > cfg.max_model_len);
    if forced || overflow {
        let (msg, param) = overflow_message(
            cfg.max_model_len,
            prompt,
            if forced && !overflow { Some(max_tokens.unwrap_or(cfg.max_model_len)) } else { max_tokens },
        );
        if cfg.style == Style::Legacy {
            st.log.api("ERROR", "serving_chat.py", 222, &format!("Error in preprocessing prompt inputs\nTraceback (most recent call last):\n  File \"{SITE}/vllm/entrypoints/openai/serving_chat.py\", line 205, in create_chat_completion\n    ) = await self._preprocess_chat(\nValueError: {msg}"));
        }
        return Reply::json(400, error_json(cfg.style, &msg, "BadRequestError", Some(param), 400));
    }
    let started = Instant::now();
    {
        let mut m = st.metrics.lock().unwrap_or_else(|e| e.into_inner());
        m.running += 1;
    }
    c::sleep_secs(c::env_f64("STANDIN_RESPONSE_SECONDS", 0.0));
    let room = cfg.max_model_len.saturating_sub(prompt);
    let want = c::env_u64("STANDIN_COMPLETION_TOKENS").unwrap_or(16);
    let mut ntok = want.min(room);
    let mut reason = "stop";
    if let Some(mt) = max_tokens
        && mt < ntok
    {
        ntok = mt;
        reason = "length";
    }
    if ntok < want && reason == "stop" {
        reason = "length";
    }
    let agent_reply =
        (chat && c::env_str("STANDIN_CHAT_AGENT").as_deref() == Some("terminus")).then(|| terminus_reply(body));
    let (text, reasoning) = match agent_reply {
        Some(r) => {
            ntok = c::approx_tokens(&r.0);
            reason = "stop";
            r
        }
        None => ((0..ntok).map(|i| format!("tok{i}")).collect::<Vec<_>>().join(" "), None),
    };
    let created = c::unix_seconds();
    let served = model.map(str::to_string).unwrap_or_else(|| cfg.served[0].clone());
    let usage = json!({"prompt_tokens": prompt, "total_tokens": prompt + ntok, "completion_tokens": ntok, "prompt_tokens_details": null});
    let reply = if chat {
        json!({
            "id": format!("chatcmpl-{}", c::rand_hex(32)),
            "object": "chat.completion",
            "created": created,
            "model": served,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": null, "annotations": null, "audio": null, "function_call": null, "tool_calls": [], "reasoning_content": reasoning},
                "logprobs": null,
                "finish_reason": reason,
                "stop_reason": null
            }],
            "service_tier": null,
            "system_fingerprint": null,
            "usage": usage,
            "prompt_logprobs": null,
            "kv_transfer_params": null
        })
    } else {
        json!({
            "id": format!("cmpl-{}", c::rand_hex(32)),
            "object": "text_completion",
            "created": created,
            "model": served,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": reason, "stop_reason": null, "prompt_logprobs": null}],
            "service_tier": null,
            "system_fingerprint": null,
            "usage": usage,
            "kv_transfer_params": null
        })
    };
    {
        let mut m = st.metrics.lock().unwrap_or_else(|e| e.into_inner());
        m.running -= 1;
        m.prompt_tokens += prompt;
        m.generation_tokens += ntok;
        *m.success.entry(if reason == "stop" { "stop" } else { "length" }).or_insert(0) += 1;
        m.e2e.push(started.elapsed().as_secs_f64());
    }
    st.successes.fetch_add(1, Ordering::SeqCst);
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        let id = reply["id"].clone();
        let obj = if chat { "chat.completion.chunk" } else { "text_completion" };
        let mut sse = String::new();
        let delta = if chat {
            json!({"index": 0, "delta": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": null})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": null})
        };
        sse.push_str(&format!(
            "data: {}\n\n",
            json!({"id": id, "object": obj, "created": created, "model": reply["model"], "choices": [delta]})
        ));
        let fin = if chat {
            json!({"index": 0, "delta": {"content": ""}, "logprobs": null, "finish_reason": reason, "stop_reason": null})
        } else {
            json!({"index": 0, "text": "", "logprobs": null, "finish_reason": reason, "stop_reason": null})
        };
        sse.push_str(&format!(
            "data: {}\n\n",
            json!({"id": id, "object": obj, "created": created, "model": reply["model"], "choices": [fin]})
        ));
        if body.pointer("/stream_options/include_usage").and_then(Value::as_bool) == Some(true) {
            sse.push_str(&format!("data: {}\n\n", json!({"id": id, "object": obj, "created": created, "model": reply["model"], "choices": [], "usage": usage})));
        }
        sse.push_str("data: [DONE]\n\n");
        return Reply { status: 200, body: sse, content_type: "text/event-stream; charset=utf-8" };
    }
    Reply::json(200, reply)
}

fn fmt_f(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 { format!("{v:.1}") } else { format!("{v}") }
}

fn metrics_text(st: &State) -> String {
    let cfg = &st.cfg;
    let m = st.metrics.lock().unwrap_or_else(|e| e.into_inner());
    let multiproc = cfg.api_server_count > 1;
    let model = cfg.served.first().cloned().unwrap_or_default();
    let engines: Vec<u64> = (0..cfg.dp.max(1)).collect();
    let lbl = |engine: u64, extra: &[(&str, String)]| -> String {
        let mut pairs: Vec<(String, String)> =
            vec![("model_name".into(), model.clone()), ("engine".into(), engine.to_string())];
        pairs.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        if multiproc {
            pairs.sort();
        }
        format!("{{{}}}", pairs.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect::<Vec<_>>().join(","))
    };
    let help = |real: &str| if multiproc { "Multiprocess metric".to_string() } else { real.to_string() };
    let mut s = String::new();
    let mut family = |name: &str, typ: &str, doc: &str, samples: Vec<(String, f64)>| {
        s.push_str(&format!("# HELP {name} {}\n# TYPE {name} {typ}\n", help(doc)));
        for (labels, v) in samples {
            let base = if typ == "histogram" { String::new() } else { name.to_string() };
            s.push_str(&format!("{base}{labels} {}\n", fmt_f(v)));
        }
    };
    let per_engine = |v0: f64| -> Vec<(String, f64)> {
        engines.iter().map(|e| (lbl(*e, &[]), if *e == 0 { v0 } else { 0.0 })).collect()
    };
    family(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        per_engine(m.running.max(0) as f64),
    );
    family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", per_engine(0.0));
    let kv_name = if cfg.style == Style::Legacy { "vllm:gpu_cache_usage_perc" } else { "vllm:kv_cache_usage_perc" };
    family(
        kv_name,
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        per_engine(if m.running > 0 { 0.01 } else { 0.0 }),
    );
    family(
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemption from the engine.",
        per_engine(0.0),
    );
    family(
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        per_engine(m.prompt_tokens as f64),
    );
    family(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        per_engine(m.generation_tokens as f64),
    );
    let mut succ = Vec::new();
    for e in &engines {
        for r in FINISH_REASONS {
            let v = if *e == 0 { *m.success.get(r).unwrap_or(&0) as f64 } else { 0.0 };
            succ.push((lbl(*e, &[("finished_reason", r.to_string())]), v));
        }
    }
    family("vllm:request_success_total", "counter", "Count of successfully processed requests.", succ);
    // e2e latency histogram (engine 0 carries the observations).
    let mut hist = Vec::new();
    for e in &engines {
        let obs: &[f64] = if *e == 0 { &m.e2e } else { &[] };
        for b in E2E_BUCKETS {
            let cnt = obs.iter().filter(|x| **x <= b).count() as f64;
            hist.push((format!("vllm:e2e_request_latency_seconds_bucket{}", lbl(*e, &[("le", fmt_f(b))])), cnt));
        }
        hist.push((
            format!("vllm:e2e_request_latency_seconds_bucket{}", lbl(*e, &[("le", "+Inf".into())])),
            obs.len() as f64,
        ));
        hist.push((format!("vllm:e2e_request_latency_seconds_count{}", lbl(*e, &[])), obs.len() as f64));
        hist.push((format!("vllm:e2e_request_latency_seconds_sum{}", lbl(*e, &[])), obs.iter().sum()));
    }
    family("vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.", hist);
    let mut http = Vec::new();
    for ((handler, method, status), v) in &m.http {
        http.push((format!("{{handler=\"{handler}\",method=\"{method}\",status=\"{status}\"}}"), *v as f64));
    }
    family("http_requests_total", "counter", "Total number of requests by method, status and handler.", http.clone());
    if !multiproc {
        let created: Vec<(String, f64)> = http.iter().map(|(l, _)| (l.clone(), st.start)).collect();
        family("http_requests_created", "gauge", "Total number of requests by method, status and handler.", created);
    }
    s
}

fn authorized(cfg: &Cfg, req: &tiny_http::Request) -> bool {
    if cfg.api_keys.is_empty() {
        return true;
    }
    let Some(h) = req.headers().iter().find(|h| h.field.equiv("Authorization")) else { return false };
    let v = h.value.as_str();
    let (scheme, token) = v.split_once(' ').unwrap_or((v, ""));
    scheme.eq_ignore_ascii_case("bearer") && cfg.api_keys.iter().any(|k| k == token)
}

fn handle(st: Arc<State>, mut req: tiny_http::Request) {
    let mode = control_mode();
    if mode == "hang" || st.hung.load(Ordering::SeqCst) {
        st.hung.store(true, Ordering::SeqCst);
        hang_forever();
    }
    if mode == "die" {
        die(&st);
    }
    let method = req.method().as_str().to_string();
    let url = req.url().to_string();
    let path = url.split('?').next().unwrap_or("").to_string();
    let mut body = String::new();
    let _ = req.as_reader().read_to_string(&mut body);
    let cfg = st.cfg.clone();
    let is_completion = method == "POST" && (path == "/v1/chat/completions" || path == "/v1/completions");
    let reply = if (path == "/v1" || path.starts_with("/v1/")) && !authorized(&cfg, &req) {
        Reply::json(401, json!({"error": "Unauthorized"}))
    } else {
        match (method.as_str(), path.as_str()) {
            ("GET", "/health") => Reply { status: 200, body: String::new(), content_type: "application/json" },
            ("GET", "/ping") | ("POST", "/ping") => {
                Reply { status: 200, body: String::new(), content_type: "application/json" }
            }
            ("GET", "/version") => Reply::json(200, json!({"version": version(cfg.style)})),
            ("GET", "/metrics") if std::env::var_os("STANDIN_NO_METRICS").is_some_and(|v| v == "1") => {
                Reply::json(404, json!({"detail": "Not Found"}))
            }
            ("GET", "/metrics") => {
                Reply { status: 200, body: metrics_text(&st), content_type: "text/plain; version=0.0.4; charset=utf-8" }
            }
            ("GET", "/v1/models") => {
                let created = c::unix_seconds();
                let data: Vec<Value> = cfg
                    .served
                    .iter()
                    .map(|name| {
                        json!({
                            "id": name, "object": "model", "created": created, "owned_by": "vllm", "root": cfg.model, "parent": null,
                            "max_model_len": cfg.max_model_len,
                            "permission": [{"id": format!("modelperm-{}", c::rand_hex(32)), "object": "model_permission", "created": created,
                                "allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true, "allow_search_indices": false,
                                "allow_view": true, "allow_fine_tuning": false, "organization": "*", "group": null, "is_blocking": false}]
                        })
                    })
                    .collect();
                Reply::json(200, json!({"object": "list", "data": data}))
            }
            ("POST", "/v1/chat/completions") | ("POST", "/v1/completions") => {
                match serde_json::from_str::<Value>(&body) {
                    Ok(v) if v.is_object() => completion(&st, &v, path.ends_with("chat/completions"), &mode),
                    _ => Reply::json(400, error_json(cfg.style, "JSON decode error", "BadRequestError", None, 400)),
                }
            }
            (_, "/health" | "/metrics" | "/v1/models" | "/v1/chat/completions" | "/v1/completions" | "/version") => {
                Reply::json(405, json!({"detail": "Method Not Allowed"}))
            }
            _ => Reply::json(404, json!({"detail": "Not Found"})),
        }
    };
    // prometheus-fastapi-instrumentator: excluded handlers are not counted.
    if !["/metrics", "/health", "/load", "/ping", "/version", "/server_info"].contains(&path.as_str()) {
        let known = ["/v1/models", "/v1/chat/completions", "/v1/completions"];
        let handler = if known.contains(&path.as_str()) { path.clone() } else { "none".to_string() };
        let mut m = st.metrics.lock().unwrap_or_else(|e| e.into_inner());
        *m.http.entry((handler, method.clone(), format!("{}xx", reply.status / 100))).or_insert(0) += 1;
    }
    let peer = req.remote_addr().map(|a| a.to_string()).unwrap_or_else(|| "127.0.0.1:0".into());
    let version = req.http_version().clone();
    let status = reply.status;
    let mut resp = tiny_http::Response::from_string(reply.body).with_status_code(status);
    if let Ok(h) = tiny_http::Header::from_bytes(&b"content-type"[..], reply.content_type.as_bytes()) {
        resp = resp.with_header(h);
    }
    if let Ok(h) = tiny_http::Header::from_bytes(&b"server"[..], &b"uvicorn"[..]) {
        resp = resp.with_header(h);
    }
    let _ = req.respond(resp);
    if cfg.access_log && uvicorn_info(&cfg) {
        // The product's one access-line format (`launch_spec::rundir::enginelog`).
        println!(
            "{}",
            launch_spec::rundir::enginelog::access_line(
                &peer,
                &method,
                &url,
                (version.0, version.1),
                status,
                status_phrase(status)
            )
        );
    }
    if is_completion
        && let Some(n) = c::env_u64("STANDIN_DIE_AFTER_REQUESTS")
        && st.completions.load(Ordering::SeqCst) >= n
    {
        die(&st);
    }
}

fn shutdown(st: &State) -> ! {
    if DYING.swap(true, Ordering::SeqCst) {
        hang_forever();
    }
    match st.cfg.style {
        Style::Current => {
            st.log.api("INFO", "launcher.py", 256, "[shutdown] API server: shutdown triggered");
            st.log.api(
                "INFO",
                "launcher.py",
                268,
                "[shutdown] API server: stopping engine client mode=abort timeout=0s",
            );
            st.log.api("INFO", "launcher.py", 276, "[shutdown] API server: engine client stopped");
            st.log.api("INFO", "launcher.py", 279, "[shutdown] API server: signalling HTTP server shutdown");
        }
        Style::Legacy => st.log.api("INFO", "launcher.py", 80, "Shutting down FastAPI HTTP server."),
    }
    shutdown_uvicorn(st);
    std::process::exit(0);
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let style = match c::env_str("STANDIN_VLLM_STYLE").as_deref() {
        Some("legacy") => Style::Legacy,
        _ => Style::Current,
    };
    let cfg = parse_cli(&argv, style);
    let log = Log { style, pid: c::pid() };
    if c::env_flag("STANDIN_DOUBLE_FORK") {
        let pidfile = c::env_str("STANDIN_DOUBLE_FORK_PIDFILE");
        c::double_fork_sleeper(pidfile.as_deref());
    }
    if c::env_flag("STANDIN_IGNORE_SIGTERM") {
        c::ignore_signal(libc::SIGTERM);
    } else {
        c::catch_signal(libc::SIGTERM);
    }
    c::catch_signal(libc::SIGINT);

    // setup_server: version, non-default args, parser validation, socket.
    match style {
        Style::Current => log.api(
            "INFO",
            "startup.py",
            33,
            &format!("vLLM server version {VERSION_CURRENT}, serving model {}", cfg.model),
        ),
        Style::Legacy => log.api("INFO", "api_server.py", 1805, &format!("vLLM API server version {VERSION_LEGACY}")),
    }
    let nd = cfg.non_default.iter().map(|(k, v)| format!("'{k}': {v}")).collect::<Vec<_>>().join(", ");
    let (file, line) = if style == Style::Current { ("startup.py", 96) } else { ("utils.py", 326) };
    log.api("INFO", file, line, &format!("non-default args: {{{nd}}}"));
    if let Some(e) = INVALID_PARSER.lock().unwrap_or_else(|e| e.into_inner()).clone() {
        let mut f = main_frames();
        f.push((
            "/opt/venv/lib/python3.12/site-packages/vllm/entrypoints/launchers/launcher.py",
            370,
            "setup_server",
            "validate_api_server_args(args)",
        ));
        traceback(&f, &e);
        std::process::exit(1);
    }
    if c::env_flag("STANDIN_VLLM_ARGS_ONLY") {
        // Everything vLLM checks before it binds the port and loads the model has passed.
        std::process::exit(0);
    }
    let host = cfg.host.clone().unwrap_or_default();
    // A headless rank serves no HTTP (vLLM's `--headless`): nothing is bound.
    let fd = if cfg.headless { -1 } else { bind_or_exit(&host, cfg.port) };
    let mut fail = c::env_str("STANDIN_FAIL_AT_START").unwrap_or_default();
    if c::env_str("STANDIN_OOM_ABOVE").and_then(|v| v.trim().parse::<f64>().ok()).is_some_and(|u| cfg.gpu_mem_util > u)
    {
        fail = "oom".to_string();
    }
    main_after_bind(cfg, log, style, host, fd, fail);
}

fn bind_or_exit(host: &str, port: u16) -> i32 {
    match bind_socket(host, port) {
        Ok(fd) => fd,
        Err(e) => {
            let mut f = main_frames();
            f.push((
                "/opt/venv/lib/python3.12/site-packages/vllm/entrypoints/launchers/launcher.py",
                353,
                "create_server_socket",
                "sock.bind(addr)",
            ));
            let errno = e.raw_os_error().unwrap_or(0);
            let text = if errno == libc::EADDRINUSE { "Address already in use".to_string() } else { e.to_string() };
            traceback(&f, &format!("OSError: [Errno {errno}] {text}"));
            std::process::exit(1);
        }
    }
}

/// The rest of start-up once the HTTP socket is bound (`fd` is -1 for a headless rank).
fn main_after_bind(cfg: Cfg, log: Log, style: Style, host: String, fd: i32, fail: String) {
    // create_engine_config: parallelism and model config checks.
    let (gpus, cvd) = gpu_count();
    if gpus == 0 {
        traceback(
            &config_frames(),
            "RuntimeError: Failed to infer device type, please set the environment variable `VLLM_LOGGING_LEVEL=DEBUG` to turn on verbose logging to help debug the issue.",
        );
        std::process::exit(1);
    }
    // ModelConfig: the weights, found the way vLLM and huggingface_hub find them (standin::hub).
    match e2e::standin::hub::resolve(&cfg.model, &|name| std::env::var(name).ok()) {
        Ok(weights) => {
            if let e2e::standin::hub::Weights::Downloaded(at) = &weights {
                log.api("INFO", "weight_utils.py", 421, &format!("Downloaded {} to {}", cfg.model, at.display()));
            }
        }
        Err(not_found) => {
            for warning in &not_found.warnings {
                log.api("WARNING", "repo_utils.py", 84, warning);
            }
            traceback(&config_frames(), &not_found.error);
            std::process::exit(1);
        }
    }
    // Across nodes, each node holds its share: (TP × PP) / nodes with mp, TP × PP × DP-local with DP.
    let nodes = cfg.place.as_ref().map_or(1, |p| p.nodes);
    let mp_nodes = cfg.place.as_ref().filter(|p| p.kind == "mp").map_or(1, |p| p.nodes);
    let local_dp = if cfg.place.as_ref().is_some_and(|p| p.kind == "dp") { cfg.dp / nodes.max(1) } else { cfg.dp };
    if fail == "world_size" || cfg.tp * cfg.pp / mp_nodes > gpus {
        fail_config(&cfg, &log, "world_size");
    }
    if fail == "model_type" {
        fail_config(&cfg, &log, "model_type");
    }
    log.api("INFO", "model.py", 744, "Resolved architecture: Qwen3ForCausalLM");
    log.api("INFO", "model.py", 1912, &format!("Using max model len {}", cfg.max_model_len));
    if cfg.tp * cfg.pp / mp_nodes * local_dp > gpus {
        if cvd.is_some() {
            fail_config(&cfg, &log, "dp_devices");
        }
        fail_engine(&cfg, &log, "other");
    }

    // Engine core(s): load, profile, KV cache.
    for rank in 0..cfg.dp {
        log.engine(cfg.dp, rank, "INFO", "core.py", 140, &engine_config_line(&cfg));
    }
    if let Some(place) = cfg.place.clone() {
        rendezvous(&cfg, &log, &place);
    }
    log.engine(cfg.dp, 0, "INFO", "gpu_model_runner.py", 4979, &format!("Starting to load model {}...", cfg.model));
    if fail == "oom" || fail == "other" {
        interruptible_sleep(&log, c::env_f64("STANDIN_LOAD_SECONDS", 0.2) / 2.0);
        fail_engine(&cfg, &log, &fail);
    }
    if c::env_flag("STANDIN_LOAD_STALL") {
        // A load that hangs silently (a stuck file system, a deadlocked collective): no more output.
        interruptible_sleep(&log, f64::from(u32::MAX));
    }
    let load_s = c::env_f64("STANDIN_LOAD_SECONDS", 0.2);
    let every = c::env_f64("STANDIN_LOAD_LOG_EVERY", 0.0);
    if every > 0.0 {
        // vLLM's shard progress bar, one line per step, so the load visibly makes progress.
        let steps = (load_s / every).ceil().max(1.0) as u32;
        for step in 1..=steps {
            interruptible_sleep(&log, load_s / f64::from(steps));
            log.engine(
                cfg.dp,
                0,
                "INFO",
                "default_loader.py",
                291,
                &format!("Loading safetensors checkpoint shards: {step}/{steps}"),
            );
        }
    } else {
        interruptible_sleep(&log, load_s);
    }
    let weights_gib = 15.27;
    log.engine(
        cfg.dp,
        0,
        "INFO",
        "gpu_model_runner.py",
        5089,
        &format!("Model loading took {weights_gib} GiB memory and 12.345678 seconds"),
    );
    if fail == "kv_cache" {
        fail_engine(&cfg, &log, "kv_cache");
    }
    let kv_tokens = (cfg.gpu_mem_util * 500_000.0) as u64;
    let commas = |n: u64| {
        let d = n.to_string();
        let mut out = String::new();
        for (i, ch) in d.chars().enumerate() {
            if i > 0 && (d.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(ch);
        }
        out
    };
    let concurrency = kv_tokens as f64 / cfg.max_model_len.max(1) as f64;
    match style {
        Style::Current => log.engine(
            cfg.dp,
            0,
            "INFO",
            "kv_cache_utils.py",
            1147,
            &format!(
                "GPU KV cache size: {} tokens, Maximum concurrency for {} tokens per request: {concurrency:.2}x",
                commas(kv_tokens),
                commas(cfg.max_model_len)
            ),
        ),
        Style::Legacy => {
            log.engine(
                cfg.dp,
                0,
                "INFO",
                "kv_cache_utils.py",
                716,
                &format!("GPU KV cache size: {} tokens", commas(kv_tokens)),
            );
            log.engine(
                cfg.dp,
                0,
                "INFO",
                "kv_cache_utils.py",
                720,
                &format!("Maximum concurrency for {} tokens per request: {concurrency:.2}x", commas(cfg.max_model_len)),
            );
        }
    }
    log.engine(cfg.dp, 0, "INFO", "core.py", 413, "init engine (profile, create kv cache, warmup model) took 21.43 s");

    // build_and_serve.
    let shown_host = if host.is_empty() {
        "0.0.0.0".to_string()
    } else if host.contains(':') {
        format!("[{host}]")
    } else {
        host.clone()
    };
    let address = format!("http://{shown_host}:{}", cfg.port);
    match style {
        Style::Current => {
            log.api("INFO", "entry.py", 136, "Supported tasks: ['generate']");
            log.api("INFO", "entry.py", 139, &format!("Starting vLLM server on {address}"));
        }
        Style::Legacy => {
            log.api("INFO", "api_server.py", 1880, &format!("Starting vLLM API server 0 on {address}"));
        }
    }
    log.api("INFO", "launcher.py", 188, "Available routes are:");
    for (route, methods) in [
        ("/openapi.json", "GET, HEAD"),
        ("/docs", "GET, HEAD"),
        ("/health", "GET"),
        ("/ping", "POST"),
        ("/ping", "GET"),
        ("/version", "GET"),
        ("/v1/models", "GET"),
        ("/v1/chat/completions", "POST"),
        ("/v1/completions", "POST"),
        ("/metrics", "GET"),
    ] {
        log.api("INFO", "launcher.py", 197, &format!("Route: {route}, Methods: {methods}"));
    }
    let listener = listen_on(fd);
    let server = match tiny_http::Server::from_listener(listener, None) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("vllm-standin: cannot serve: {e}");
            std::process::exit(1);
        }
    };
    if uvicorn_info(&cfg) {
        log.uvicorn(&format!("Started server process [{}]", log.pid));
        log.uvicorn("Waiting for application startup.");
        log.uvicorn("Application startup complete.");
    }
    let start =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let st = Arc::new(State {
        cfg,
        log,
        start,
        completions: AtomicU64::new(0),
        successes: AtomicU64::new(0),
        hung: AtomicBool::new(false),
        metrics: Mutex::new(Metrics::default()),
    });
    // Signal watcher: graceful shutdown on SIGTERM/SIGINT.
    {
        let st = st.clone();
        std::thread::spawn(move || {
            loop {
                if let Some(sig) = c::pending_signal()
                    && (sig == libc::SIGINT || sig == libc::SIGTERM)
                {
                    shutdown(&st);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
    }
    loop {
        match server.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(req)) => {
                let st = st.clone();
                std::thread::spawn(move || handle(st, req));
            }
            Ok(None) => {}
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}
