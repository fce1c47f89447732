//! Value parsers for command-line options, so a bad value stops at argument parsing with the same
//! rule the configuration files and the launch spec use (`launch_spec::validate`).

use launch_spec::validate as v;

/// `--model`: a model id (`validate::model_id`). Called by the commands after parsing (not as a
/// clap value parser: clap would echo a control character in the id raw).
pub fn model(text: &str) -> Result<String, String> {
    v::model_id(text).map(str::to_string)
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
    }
}
