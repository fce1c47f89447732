//! The one YAML entry point of the workspace.
//!
//! Every YAML file (cluster profiles, GPU profiles, presets, the model registry) is parsed through
//! [`from_yaml_str`] / [`from_yaml_file`], so the YAML library can be swapped in this one place.
//! We use `serde-saphyr`: pure Rust, maintained, rejects duplicate keys, and reports line/column.
//! `serde_yaml` is archived and flagged unmaintained (RUSTSEC-2024-0320); see docs/decisions.md.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

/// A YAML file that could not be read or did not match its schema.
///
/// Displays as one line: `path:line:column: message`, with a "did you mean" for near-miss keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    pub path: PathBuf,
    pub line: Option<u64>,
    pub column: Option<u64>,
    pub message: String,
}

impl fmt::Display for YamlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for YamlError {}

/// Reads and parses a YAML file into `T`, strictly (the types decide: `deny_unknown_fields`).
pub fn from_yaml_file<T: DeserializeOwned>(path: &Path) -> Result<T, YamlError> {
    let text = std::fs::read_to_string(path).map_err(|err| YamlError {
        path: path.to_path_buf(),
        line: None,
        column: None,
        message: format!("cannot read file: {err}"),
    })?;
    from_yaml_str(&text, path)
}

/// Parses YAML text into `T`; `path` is only used to name the file in errors.
pub fn from_yaml_str<T: DeserializeOwned>(text: &str, path: &Path) -> Result<T, YamlError> {
    serde_saphyr::from_str::<T>(text).map_err(|err| {
        let location = err.location();
        let (line, column) = match location {
            Some(loc) if loc.line() > 0 => (Some(loc.line()), Some(loc.column())),
            _ => (None, None),
        };
        YamlError {
            path: path.to_path_buf(),
            line,
            column,
            message: with_key(explain(&bare_message(&err)), text, line),
        }
    })
}

/// The library's message without its own location prefix/suffix or source snippet, on one line.
fn bare_message(err: &serde_saphyr::Error) -> String {
    let full = err.to_string();
    let mut first = full.lines().next().unwrap_or_default().trim();
    // serde-saphyr prints "error: line L column C: message"; we print the location ourselves.
    first = first.strip_prefix("error: ").unwrap_or(first);
    if first.starts_with("line ")
        && let Some(idx) = first.find(": ")
    {
        first = &first[idx + 2..];
    }
    match first.rfind(" at line ") {
        Some(idx) => first[..idx].to_string(),
        None => first.to_string(),
    }
}

/// Adds a "did you mean" to serde's unknown-field/variant messages when a valid name is close.
fn explain(message: &str) -> String {
    for kind in ["unknown field `", "unknown variant `"] {
        let Some(start) = message.find(kind) else { continue };
        let rest = &message[start + kind.len()..];
        let Some(end) = rest.find('`') else { continue };
        let unknown = &rest[..end];
        let expected = rest[end + 1..]
            .split_once("expected ")
            .map(|(_, list)| list.trim_start_matches("one of "))
            .unwrap_or_default();
        let candidates = expected.split(", ").map(|c| c.trim_matches('`'));
        if let Some(best) = did_you_mean(unknown, candidates) {
            return format!("{message} (did you mean `{best}`?)");
        }
    }
    message.to_string()
}

/// Names the key on the error's line and says in words what a scalar type expects.
fn with_key(message: String, text: &str, line: Option<u64>) -> String {
    let plain = match message.as_str() {
        "invalid u8" | "invalid u16" | "invalid u32" | "invalid u64" | "invalid usize" => "expected a whole number ≥ 0",
        "invalid i32" | "invalid i64" => "expected a whole number",
        "invalid f32" | "invalid f64" => "expected a number",
        "invalid bool" | "invalid boolean" => "expected true or false",
        _ => "",
    };
    let message = if plain.is_empty() { message } else { plain.to_string() };
    if message.contains('`') {
        return message;
    }
    let key = line
        .and_then(|l| text.lines().nth(usize::try_from(l).ok()?.checked_sub(1)?))
        .and_then(|source| source.trim_start().trim_start_matches("- ").split_once(':'))
        .map(|(key, _)| key.trim().to_string())
        .filter(|key| !key.is_empty() && !key.contains(' '));
    match key {
        Some(key) => format!("`{key}`: {message}"),
        None => message,
    }
}

/// The closest candidate to `input`, if it is close enough to be a plausible typo.
pub fn did_you_mean<'a>(input: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|candidate| (strsim::jaro_winkler(input, candidate), candidate))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Sample {
        #[allow(dead_code)]
        tensor_parallel_size: Option<u32>,
        #[allow(dead_code)]
        name: Option<String>,
    }

    #[test]
    fn unknown_key_names_file_line_column_and_suggestion() {
        let err = from_yaml_str::<Sample>("name: x\ntensor_paralel_size: 2\n", Path::new("m.yaml")).unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("m.yaml:2:"), "{text}");
        assert!(text.contains("did you mean `tensor_parallel_size`"), "{text}");
        assert_eq!(text.lines().count(), 1);
    }

    #[test]
    fn wrong_type_is_an_error_with_location() {
        let err = from_yaml_str::<Sample>("tensor_parallel_size: two\n", Path::new("m.yaml")).unwrap_err();
        assert_eq!(err.line, Some(1));
        assert!(err.to_string().starts_with("m.yaml:1:"), "{err}");
    }

    #[test]
    fn duplicate_keys_are_rejected() {
        assert!(from_yaml_str::<Sample>("name: a\nname: b\n", Path::new("d.yaml")).is_err());
    }
}
