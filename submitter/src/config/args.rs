//! Value parsers for command-line options, so a bad value stops at argument parsing with the same
//! rule the configuration files and the launch spec use (`launch_spec::validate`).

use launch_spec::validate as v;
use launch_spec::{ModelId, ModelIdError};

/// `--model`: a [`ModelId`], the one rule. Called by the commands right after parsing, not as a
/// clap value parser: clap's error would echo a control character in the id raw and add usage
/// lines, where this is the one-line error every other input gives.
pub fn model(text: &str) -> Result<ModelId, ModelIdError> {
    ModelId::new(text)
}

/// `--gpu-memory-utilization`: a fraction in (0, 1].
pub fn fraction(text: &str) -> Result<f64, String> {
    v::fraction(number(text)?)
}

/// `--timeout-multiplier`: finite, > 0.
pub fn multiplier(text: &str) -> Result<f64, String> {
    v::multiplier(number(text)?)
}

/// `--n-concurrent` and other counts: a whole number ≥ 1.
pub fn count(text: &str) -> Result<u32, String> {
    let value: u32 = text.trim().parse().map_err(|_| format!("`{text}` is not a whole number ≥ 1"))?;
    v::at_least_one(value.into()).map(|_| value)
}

/// `--max-output-tokens` and other large counts: a whole number ≥ 1.
pub(crate) fn count_u64(text: &str) -> Result<u64, String> {
    let value: u64 = text.trim().parse().map_err(|_| format!("`{text}` is not a whole number ≥ 1"))?;
    v::at_least_one(value).map(|_| value)
}

/// `--time`: a Slurm time (`HH:MM:SS`, `D-HH:MM:SS`, …), checked as the profile's `slurm.time` is.
pub(crate) fn slurm_time(text: &str) -> Result<String, String> {
    super::parse_slurm_time(text)
        .map(|_| text.to_string())
        .ok_or_else(|| format!("`{text}` is not a Slurm time (HH:MM:SS or D-HH:MM:SS)"))
}

/// `--partition`, `--account`, `--reservation`: a Slurm name (no spaces or control characters).
pub(crate) fn slurm_name(text: &str) -> Result<String, String> {
    if text.is_empty() || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("a Slurm name has no spaces or control characters".to_string());
    }
    Ok(text.to_string())
}

/// `--reservation`, `--qos`, `--exclude`: a Slurm name (a node list for `--exclude`), or empty for
/// none (the profile's is then not used).
pub fn reservation(text: &str) -> Result<String, String> {
    if text.is_empty() { Ok(String::new()) } else { slurm_name(text) }
}

/// `--interval`, `--stale-after` and other durations: `30s`, `10m`, `1h30m` (humantime's syntax), or a
/// bare number of seconds; at most 30 days, as in the launch spec.
pub fn duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let parsed = match text.parse::<u64>() {
        Ok(seconds) => std::time::Duration::from_secs(seconds),
        Err(_) => humantime::parse_duration(text)
            .map_err(|e| format!("`{text}` is not a duration like 30s, 10m, 1h30m ({e})"))?,
    };
    v::seconds(parsed.as_secs_f64(), false).map(|_| parsed).map_err(|e| format!("`{text}`: {e}"))
}

/// `--interval` (between iterations or refreshes): a [`duration`] of at least 1 s. `0` would poll
/// Slurm in a busy loop (1,480 `squeue` calls in 10 s, issue 21).
pub fn interval(text: &str) -> Result<std::time::Duration, String> {
    let parsed = duration(text)?;
    if parsed < std::time::Duration::from_secs(1) {
        return Err(format!("`{}`: an interval is at least 1s", text.trim()));
    }
    Ok(parsed)
}

fn number(text: &str) -> Result<f64, String> {
    text.trim().parse::<f64>().map_err(|_| format!("`{text}` is not a number"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn parsers_refuse_what_the_spec_refuses() {
        assert!(super::fraction("5").is_err() && super::fraction("nan").is_err() && super::fraction("0.9").is_ok());
        assert!(super::multiplier("-1").is_err() && super::multiplier("inf").is_err());
        assert!(super::count("0").is_err() && super::count("2").is_ok());
        assert!(super::model("--chat-template=/etc/passwd").is_err());
        assert!(super::slurm_time("48:00:00").is_ok() && super::slurm_time("soon").is_err());
        assert!(super::slurm_name("lrd_all_serial").is_ok() && super::slurm_name("a b").is_err());
        let secs = |s: u64| Ok(std::time::Duration::from_secs(s));
        assert_eq!(super::duration("30s"), secs(30));
        assert_eq!(super::duration("10m"), secs(600));
        assert_eq!(super::duration("1h30m"), secs(5400));
        assert_eq!(super::duration("45"), secs(45));
        assert!(super::duration("10x").is_err() && super::duration("").is_err() && super::duration("-1s").is_err());
        assert!(super::duration("31days").is_err(), "over the 30-day bound");
        assert!(super::interval("0").is_err() && super::interval("500ms").is_err() && super::interval("1s").is_ok());
    }
}
