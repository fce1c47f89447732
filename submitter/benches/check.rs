//! `submitter check` at scale: a run dir with 10,000 trial directories and a 1 GB vLLM log whose
//! 400s carry multi-line tracebacks, as vLLM logs them (target: the whole check no slower than
//! `grep -c` over the same log). Data is generated in a temp dir; both medians and their ratio are
//! printed (docs/verification.md records them).
//!
//! `cargo bench -p submitter --bench check` (env `CHECK_BENCH_LOG_MB` / `CHECK_BENCH_TRIALS` to
//! resize). Timings are with the files in the page cache (they were just written).

#![allow(clippy::print_stdout)]

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use launch_spec::rundir::enginelog::access_line;
use submitter::verify::{VerifySettings, check, logscan};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// vLLM's log: a throughput line every 100 completions (one per second of log time), uvicorn
/// access lines in between: 95% 200, 4% 400, 1% 500; each 400 followed by vLLM's ERROR line and a
/// 12-line traceback (about 40% of the bytes are traceback lines).
fn write_log(path: &Path, target_bytes: u64) -> (u64, u64) {
    let file = std::fs::File::create(path).unwrap();
    let mut out = std::io::BufWriter::with_capacity(8 << 20, file);
    let mut written = 0u64;
    let mut lines = 0u64;
    let mut second = 0u64;
    let mut n = 0u64;
    let mut line = Vec::with_capacity(200);
    while written < target_bytes {
        let (h, m, s) = ((second / 3600) % 24, (second / 60) % 60, second % 60);
        let day = 1 + (second / 86_400) % 28;
        line.clear();
        writeln!(
            line,
            "(APIServer pid=4242) INFO 11-{day:02} {h:02}:{m:02}:{s:02} [loggers.py:248] Engine 000: Avg prompt throughput: 8123.4 tokens/s, Avg generation throughput: 912.0 tokens/s, Running: 32 reqs, Waiting: 0 reqs, GPU KV cache usage: 41.2%, Prefix cache hit rate: 67.0%"
        )
        .unwrap();
        for _ in 0..100 {
            n += 1;
            let (code, reason) = match n % 100 {
                0 => (500, "Internal Server Error"),
                1..=4 => (400, "Bad Request"),
                _ => (200, "OK"),
            };
            // The one access-line writer (what the vLLM stand-in and the test fixtures print).
            let access = access_line(
                &format!("127.0.0.1:{}", 30000 + n % 30000),
                "POST",
                "/v1/chat/completions",
                (1, 1),
                code,
                reason,
            );
            writeln!(line, "{access}").unwrap();
            lines += 1;
            if code == 400 {
                writeln!(line, "(APIServer pid=4242) ERROR 11-{day:02} {h:02}:{m:02}:{s:02} [serving_chat.py:212] Error in preprocessing prompt inputs").unwrap();
                line.extend_from_slice(b"(APIServer pid=4242) Traceback (most recent call last):\n");
                for (file, at, func) in [
                    ("serving_chat.py", 205, "create_chat_completion"),
                    ("serving_engine.py", 1080, "_preprocess_chat"),
                    ("serving_engine.py", 612, "_tokenize_prompt_input_async"),
                    ("serving_engine.py", 540, "_validate_input"),
                    ("serving_engine.py", 498, "_validate_input_length"),
                ] {
                    writeln!(line, "(APIServer pid=4242)   File \"/opt/venv/lib/python3.12/site-packages/vllm/entrypoints/openai/{file}\", line {at}, in {func}").unwrap();
                    line.extend_from_slice(b"(APIServer pid=4242)     raise VLLMValidationError(\n");
                }
                line.extend_from_slice(b"(APIServer pid=4242) vllm.exceptions.VLLMValidationError: This model's maximum context length is 32768 tokens. However, your request has 40123 input tokens. Please reduce the length of the input messages.\n");
                lines += 13;
            }
        }
        out.write_all(&line).unwrap();
        written += line.len() as u64;
        lines += 1;
        second += 1;
    }
    out.flush().unwrap();
    (written, lines)
}

fn write_trials(run: &Path, n: u64) {
    let config = |name: &str| {
        format!(
            "{{\n    \"task\": {{\"path\": \"/data/tb2/{name}\", \"source\": \"tb2\"}},\n    \"trial_name\": \"{name}\",\n    \"trials_dir\": \"{}\",\n    \"agent\": {{\n        \"name\": \"terminus-2\",\n        \"model_name\": \"hosted_vllm/Model-8B\",\n        \"kwargs\": {{\"api_base\": \"http://127.0.0.1:8000/v1\", \"model_info\": {{\"max_input_tokens\": 32768, \"max_output_tokens\": 16384, \"input_cost_per_token\": 0, \"output_cost_per_token\": 0}}}}\n    }},\n    \"environment\": {{\"type\": \"daytona\"}},\n    \"job_id\": \"b3c0\"\n}}\n",
            run.display()
        )
    };
    for i in 0..n {
        let name = format!("task-{i:05}__{:07x}", i * 7919);
        let dir = run.join(&name);
        std::fs::create_dir_all(dir.join("agent")).unwrap();
        std::fs::create_dir_all(dir.join("verifier")).unwrap();
        std::fs::write(dir.join("trial.log"), "Trial started\n").unwrap();
        let cfg = config(&name);
        std::fs::write(dir.join("config.json"), &cfg).unwrap();
        if i % 50 == 0 {
            continue; // active: agent/ and no result.json
        }
        let failed = i % 17 == 0;
        let result = format!(
            "{{\n    \"id\": \"{i}\",\n    \"task_name\": \"task-{i:05}\",\n    \"trial_name\": \"{name}\",\n    \"config\": {cfg},\n    \"agent_info\": {{\"name\": \"terminus-2\", \"version\": \"2.0.0\", \"model_info\": {{\"name\": \"Model-8B\", \"provider\": \"hosted_vllm\"}}}},\n    \"agent_result\": {{\"n_input_tokens\": 48211, \"n_cache_tokens\": 0, \"n_output_tokens\": {}, \"cost_usd\": 0.0}},\n    \"verifier_result\": {},\n    \"exception_info\": {},\n    \"started_at\": \"2026-11-30T05:{:02}:00.000000Z\",\n    \"finished_at\": \"2026-11-30T05:{:02}:{}.000000Z\",\n    \"agent_execution\": {{\"started_at\": \"2026-11-30T05:00:01.000000Z\", \"finished_at\": \"2026-11-30T05:00:50.000000Z\"}}\n}}\n",
            if failed { "null".to_string() } else { "1874".to_string() },
            if failed { "null".to_string() } else { format!("{{\"rewards\": {{\"reward\": {}.0}}}}", i % 2) },
            if failed {
                "{\"exception_type\": \"DaytonaError\", \"exception_message\": \"sandbox\", \"exception_traceback\": \"\", \"occurred_at\": \"2026-11-30T05:00:00Z\"}".to_string()
            } else {
                "null".to_string()
            },
            i % 50,
            i % 50,
            if failed { "00" } else { "45" }
        );
        std::fs::write(dir.join("result.json"), result).unwrap();
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..runs {
        let start = Instant::now();
        last = Some(f());
        times.push(start.elapsed());
    }
    (median(times), last.expect("at least one run"))
}

fn main() {
    let log_mb = env_u64("CHECK_BENCH_LOG_MB", 1024);
    let n_trials = env_u64("CHECK_BENCH_TRIALS", 10_000);
    let tmp = tempfile::tempdir_in(
        std::env::var_os("CHECK_BENCH_DIR").unwrap_or_else(|| std::env::temp_dir().into_os_string()),
    )
    .unwrap();
    let run = tmp.path().join("terminal_bench_2__org__Model-8B");
    std::fs::create_dir_all(&run).unwrap();
    let started = Instant::now();
    let log = run.join("vllm.log");
    let (bytes, lines) = write_log(&log, log_mb << 20);
    write_trials(&run, n_trials);
    std::fs::write(
        run.join("config.json"),
        "{\"job_name\": \"x\", \"agents\": [{\"name\": \"terminus-2\", \"model_name\": \"hosted_vllm/Model-8B\", \"kwargs\": {\"api_base\": \"http://127.0.0.1:8000/v1\", \"model_info\": {\"max_input_tokens\": 1}}}], \"datasets\": [{\"path\": \"/data/tb2\"}]}",
    )
    .unwrap();
    println!(
        "data: {:.2} GB vllm.log ({:.1} M lines), {n_trials} trial dirs, generated in {:.1} s (dir {})",
        bytes as f64 / 1e9,
        lines as f64 / 1e6,
        started.elapsed().as_secs_f64(),
        tmp.path().display()
    );
    let settings = VerifySettings::default();
    let runs = env_u64("CHECK_BENCH_RUNS", 7) as usize;
    // Warm the page cache once, as any second look at a run would find it.
    let _ = logscan::scan_file(&log).unwrap();

    let (scan_t, scanned) = time(runs, || logscan::scan_file(&log).unwrap().unwrap());
    println!(
        "log scan:        {:>7.3} s  ({:.2} GB/s; {} completions: {} × 2xx, {} × 4xx, {} × 5xx)",
        scan_t.as_secs_f64(),
        bytes as f64 / 1e9 / scan_t.as_secs_f64(),
        scanned.completions(),
        scanned.ok,
        scanned.c4xx,
        scanned.c5xx
    );
    let (trials_t, trials) = time(runs, || check::scan_trials(&run, settings.instant_fail_s).unwrap());
    println!(
        "trial scan:      {:>7.3} s  ({} dirs: {} done, {} active, {} errored)",
        trials_t.as_secs_f64(),
        trials.dirs,
        trials.done,
        trials.active,
        trials.errored
    );
    // `check` and `grep -c` alternate, round by round, so both see the same machine load (the
    // development machine is shared); each is the median of its rounds.
    let grep = || {
        Command::new("grep").args(["-c", "POST /v1/chat/completions"]).arg(&log).env("LC_ALL", "C").output().unwrap()
    };
    let (mut check_times, mut grep_times, mut scan_times) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..runs {
        let start = Instant::now();
        let _ = logscan::scan_file(&log).unwrap();
        scan_times.push(start.elapsed());
        let start = Instant::now();
        last = Some(check::check_run_dir(&run, &settings, chrono::Utc::now()).unwrap());
        check_times.push(start.elapsed());
        let start = Instant::now();
        let out = grep();
        grep_times.push(start.elapsed());
        assert!(out.status.success());
    }
    let (check_t, grep_t, scan_in_rounds) = (median(check_times), median(grep_times), median(scan_times));
    let report = last.expect("at least one round");
    println!(
        "check (library): {:>7.3} s  (verdict {}, {} findings; target ≤ 2 s)",
        check_t.as_secs_f64(),
        report.verdict,
        report.findings.len()
    );
    let levels: Vec<String> = report.findings.iter().map(|f| format!("{} {}", f.id, f.level)).collect();
    println!("                 findings: {}", levels.join(", "));
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(Path::parent).map(|d| d.join("submitter")).filter(|p| p.is_file());
    if let Some(bin) = bin {
        let (cli_t, status) =
            time(runs, || Command::new(&bin).arg("check").arg(&run).arg("--json").output().unwrap().status);
        println!("submitter check: {:>7.3} s  (release binary, exit {:?})", cli_t.as_secs_f64(), status.code());
    }
    let grep_out = grep();
    let grep_count: u64 = String::from_utf8_lossy(&grep_out.stdout).trim().parse().unwrap_or(0);
    println!(
        "grep -c:         {:>7.3} s  ({:.2} GB/s; {grep_count} lines) → log scan / grep = {:.2}× (same rounds: scan {:.3} s)",
        grep_t.as_secs_f64(),
        bytes as f64 / 1e9 / grep_t.as_secs_f64(),
        scan_in_rounds.as_secs_f64() / grep_t.as_secs_f64(),
        scan_in_rounds.as_secs_f64(),
    );
    println!(
        "medians: check {:.3} s, grep -c {:.3} s → check / grep = {:.2}× (target ≤ 1.00×; {} tracebacks in the log)",
        check_t.as_secs_f64(),
        grep_t.as_secs_f64(),
        check_t.as_secs_f64() / grep_t.as_secs_f64(),
        scanned.tracebacks
    );
    assert_eq!(grep_count, scanned.completions(), "the scanner and grep count the same lines");
}
