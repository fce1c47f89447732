//! The one validation of numbers and ids that enter from outside: cluster profiles, presets, the
//! registry, the command line and the launch spec all call these functions, so what one command
//! accepts every command accepts (and payload never meets a value that panics after spawning).
//!
//! Each function returns the problem in words (without the field name, which the caller knows).

use std::time::Duration;

/// Longest duration any setting may have: 30 days. Far above every real walltime, and small
/// enough that `Instant::now() + d` and `Duration::from_secs_f64` can never overflow.
pub const MAX_SECONDS: u64 = 30 * 24 * 3600;
/// Largest timeout multiplier (the shipped values are 1, 2 and 16).
pub(crate) const MAX_MULTIPLIER: f64 = 1000.0;
/// Most GPUs one engine may ask for (TP × PP × DP, over all its nodes).
pub(crate) const MAX_GPUS: u32 = 1024;
/// Most nodes one engine may span (a registry's `nodes`, a cluster's `slurm.max_nodes`).
pub(crate) const MAX_NODES: u32 = 256;

/// A duration in (fractional) seconds: finite, ≥ 0 (or > 0 when `positive`), at most 30 days.
pub fn seconds(value: f64, positive: bool) -> Result<Duration, String> {
    let low_ok = if positive { value > 0.0 } else { value >= 0.0 };
    if !value.is_finite() || !low_ok || value > MAX_SECONDS as f64 {
        let low = if positive { "> 0" } else { "≥ 0" };
        return Err(format!("{value} must be a number of seconds {low} and ≤ {MAX_SECONDS} (30 days)"));
    }
    Ok(Duration::from_secs_f64(value))
}

/// Shortest interval of a periodic action (heartbeat, health probe): 50 ms. A smaller value is a
/// unit mistake (`1e-12`), and payload could only clamp it.
pub(crate) const MIN_INTERVAL: f64 = 0.05;

/// The period of a repeated action: [`seconds`] and at least [`MIN_INTERVAL`].
pub fn interval(value: f64) -> Result<Duration, String> {
    let d = seconds(value, true)?;
    if value < MIN_INTERVAL {
        return Err(format!("{value} is shorter than the shortest interval, {MIN_INTERVAL} s: give seconds (e.g. 30)"));
    }
    Ok(d)
}

/// A duration in whole seconds, at most 30 days (and ≥ 1 when `positive`).
pub fn whole_seconds(value: u64, positive: bool) -> Result<Duration, String> {
    if value > MAX_SECONDS || (positive && value == 0) {
        let low = if positive { 1 } else { 0 };
        return Err(format!("{value} must be between {low} and {MAX_SECONDS} seconds (30 days)"));
    }
    Ok(Duration::from_secs(value))
}

/// A share of GPU memory (or any fraction that must leave something): in (0, 1].
pub fn fraction(value: f64) -> Result<f64, String> {
    if value.is_finite() && value > 0.0 && value <= 1.0 {
        Ok(value)
    } else {
        Err(format!("{value} must be a fraction in (0, 1], e.g. 0.9"))
    }
}

/// A share in [0, 1] (a threshold, where 0 is meaningful).
pub fn share(value: f64) -> Result<f64, String> {
    if value.is_finite() && (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{value} must be a share in [0, 1]"))
    }
}

/// A timeout multiplier: finite, > 0, at most 1000.
pub fn multiplier(value: f64) -> Result<f64, String> {
    if value.is_finite() && value > 0.0 && value <= MAX_MULTIPLIER {
        Ok(value)
    } else {
        Err(format!("{value} must be a number > 0 and ≤ {MAX_MULTIPLIER} (e.g. 1.0, 2.0, 16.0)"))
    }
}

/// Most trials Harbor may run at once (`n_concurrent`) and most attempts per task: far above any
/// sandbox quota, small enough that Harbor never tries to start a billion sandboxes.
pub const MAX_CONCURRENT: u64 = 10_000;
/// Longest context (`max_model_len`) or output (`max_output_tokens`) a spec may ask for, in tokens:
/// several times the longest context any served model has (10M), far below what overflows.
pub const MAX_TOKENS: u64 = 1 << 26;
/// Most sequences the engine may batch (`max_num_seqs`).
pub const MAX_SEQS: u64 = 1 << 20;

/// A count within `1..=max` (concurrency, attempts, tokens, sequences).
pub fn count_up_to(value: u64, max: u64) -> Result<u64, String> {
    if (1..=max).contains(&value) { Ok(value) } else { Err(format!("{value} must be between 1 and {max}")) }
}

/// A string that becomes one argv word of a child (`agent_kwargs`, `agent`, …): the kernel's argv
/// strings end at NUL, so one with a NUL cannot be passed (a spawn failure on the node otherwise).
pub fn argument(value: &str) -> Result<&str, String> {
    if value.contains('\0') {
        let shown: String = value.chars().take(60).flat_map(char::escape_debug).collect();
        return Err(format!("\"{shown}\" contains a NUL byte, which no program argument can carry"));
    }
    Ok(value)
}

/// A count that must be at least one (concurrency, attempts, parallel sizes).
pub fn at_least_one(value: u64) -> Result<u64, String> {
    if value >= 1 { Ok(value) } else { Err(format!("{value} must be ≥ 1")) }
}

/// GPUs one engine needs: TP × PP × DP without overflow, each ≥ 1, at most [`MAX_GPUS`].
pub fn gpus(tensor_parallel: u32, pipeline_parallel: u32, data_parallel: u32) -> Result<u32, String> {
    let sizes = format!(
        "tensor_parallel_size {tensor_parallel} × pipeline_parallel_size {pipeline_parallel} × data_parallel_size {data_parallel}"
    );
    if tensor_parallel == 0 || pipeline_parallel == 0 || data_parallel == 0 {
        return Err(format!("{sizes}: each must be ≥ 1"));
    }
    match tensor_parallel.checked_mul(pipeline_parallel).and_then(|n| n.checked_mul(data_parallel)) {
        Some(n) if n <= MAX_GPUS => Ok(n),
        _ => Err(format!("{sizes} is more than {MAX_GPUS} GPUs")),
    }
}

/// Nodes one engine spans: 1 ..= [`MAX_NODES`].
pub fn nodes(value: u32) -> Result<u32, String> {
    if (1..=MAX_NODES).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{value} must be between 1 and {MAX_NODES} nodes"))
    }
}

/// A TCP port someone listens on: 1..=65535.
pub fn port(value: u16) -> Result<u16, String> {
    if value == 0 { Err("0 is not a port: give 1..=65535 (or leave it unset)".to_string()) } else { Ok(value) }
}

/// A port range `[base, base + span)` that stays inside 1..=65535.
pub(crate) fn port_range(base: u16, span: u16) -> Result<(), String> {
    if base == 0 || span == 0 || u32::from(base) + u32::from(span) - 1 > 65535 {
        return Err(format!("base {base} + span {span} must describe ports within 1..=65535 (base ≥ 1, span ≥ 1)"));
    }
    Ok(())
}

// A model id is a type of its own with its one rule: `crate::model_id::ModelId`.

/// A listen address for vLLM's `--host`: a name or an IPv4/IPv6 address, never an option.
pub(crate) fn listen_host(host: &str) -> Result<&str, String> {
    let shown: String = host.chars().take(60).flat_map(char::escape_debug).collect();
    if host.is_empty() || host.len() > 253 {
        return Err("must be a host name or address (1–253 characters), e.g. 127.0.0.1".to_string());
    }
    if host.starts_with('-') {
        return Err(format!("\"{shown}\" starts with `-` (it would read as an option): give a host name or address"));
    }
    if !host.chars().all(|c| c.is_ascii_alphanumeric() || ".-:[]_".contains(c)) {
        return Err(format!("\"{shown}\" has characters outside [A-Za-z0-9.-:[]_]: give a host name or address"));
    }
    Ok(host)
}

/// An environment a child gets: names non-empty without `=` or NUL (the kernel's `NAME=value`
/// strings cannot carry them), values without NUL. Checked before anything is spawned, so a bad
/// entry is a spec error (exit 2) rather than a spawn failure on the node.
pub fn environment<'a>(env: impl IntoIterator<Item = (&'a String, &'a String)>) -> Result<(), String> {
    for (name, value) in env {
        let shown: String = name.chars().take(60).flat_map(char::escape_debug).collect();
        if name.is_empty() {
            return Err("has an empty variable name: remove the entry or name the variable".to_string());
        }
        if name.contains('=') || name.contains('\0') {
            return Err(format!("variable name \"{shown}\" contains `=` or a NUL byte: give the name alone"));
        }
        if value.contains('\0') {
            return Err(format!("the value of {shown} contains a NUL byte, which no program can receive"));
        }
    }
    Ok(())
}

/// The argv of a configured command (the post-run step): at least the program, no empty program,
/// no NUL byte (exec cannot pass one). Never a shell string: each element reaches the program as
/// written (newlines included, e.g. a `python -c` body).
pub(crate) fn post_run_argv(argv: &[String]) -> Result<(), String> {
    match argv.first() {
        None => return Err("is empty: give [program, args…] (one element per argument, no shell)".to_string()),
        Some(program) if program.trim().is_empty() => {
            return Err("has an empty program (argv[0]): name the executable".to_string());
        }
        Some(_) => {}
    }
    if let Some((i, _)) = argv.iter().enumerate().find(|(_, a)| a.contains('\0')) {
        return Err(format!("element {i} contains a NUL byte, which no program can receive"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_bounded_and_convert() {
        assert_eq!(seconds(2.5, true).unwrap(), Duration::from_millis(2500));
        for bad in [1e20, f64::NAN, f64::INFINITY, -1.0, 0.0] {
            assert!(seconds(bad, true).is_err(), "{bad}");
        }
        assert!(seconds(0.0, false).is_ok());
        assert!(whole_seconds(u64::MAX, false).is_err());
        assert!(whole_seconds(0, true).is_err());
        let far = std::time::Instant::now() + whole_seconds(MAX_SECONDS, false).unwrap();
        assert!(far > std::time::Instant::now());
    }

    #[test]
    fn fractions_multipliers_counts_gpus_ports() {
        for bad in [0.0, 5.0, 7.5, -1.0, f64::NAN, f64::INFINITY] {
            assert!(fraction(bad).is_err(), "{bad}");
        }
        assert!(fraction(1.0).is_ok() && fraction(0.9).is_ok());
        for bad in [0.0, -2.0, f64::NAN, f64::INFINITY, 1e6] {
            assert!(multiplier(bad).is_err(), "{bad}");
        }
        assert!(at_least_one(0).is_err());
        assert_eq!(gpus(2, 1, 2), Ok(4));
        assert_eq!(gpus(4, 4, 1), Ok(16));
        assert!(gpus(65536, 1, 65536).is_err(), "u32 overflow to 0");
        assert!(gpus(2, 65536, 32768).is_err(), "overflow in the second product");
        assert!(gpus(0, 1, 4).is_err() && gpus(1, 0, 1).is_err());
        assert!(nodes(0).is_err() && nodes(2).is_ok() && nodes(MAX_NODES + 1).is_err());
        assert!(port(0).is_err() && port(8000).is_ok());
        assert!(port_range(60000, 20000).is_err() && port_range(20000, 20000).is_ok());
    }
}
