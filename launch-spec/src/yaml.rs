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
/// The file must be a regular file (a FIFO is refused instead of blocking) of at most
/// [`crate::fsread::CONFIG_CAP`] bytes.
pub fn from_yaml_file<T: DeserializeOwned>(path: &Path) -> Result<T, YamlError> {
    let text = crate::fsread::read_text_capped(path, crate::fsread::CONFIG_CAP, crate::fsread::Links::Follow).map_err(
        |err| YamlError {
            path: path.to_path_buf(),
            line: None,
            column: None,
            message: format!("cannot read file: {err}"),
        },
    )?;
    from_yaml_str(&text, path)
}

/// The library's options for every config file: only `true`/`false` are booleans (`yes`, `on`
/// are errors, not YAML 1.1 booleans), and a string field must quote text that reads as a number
/// or boolean (`tool_call_parser: 123` is an error, not "123").
fn options() -> serde_saphyr::Options {
    serde_saphyr::options! { strict_booleans: true, no_schema: true }
}

/// Parses YAML text into `T`; `path` is only used to name the file in errors.
///
/// Strict beyond the types: a quoted scalar never fills a number or boolean (`"false"`, `"2"`:
/// see `strict_de`), numbers are written in decimal (`0x10`, `0o17`, `1_000` are errors), and
/// `.nan`/`.inf` are refused by the library's inference.
pub fn from_yaml_str<T: DeserializeOwned>(text: &str, path: &Path) -> Result<T, YamlError> {
    non_decimal_number(text, path)?;
    serde_saphyr::with_deserializer_from_str_with_options(text, options(), |de| {
        T::deserialize(crate::strict_de::Strict(de))
    })
    .map_err(|err| {
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

/// The first plain scalar spelled as a non-decimal or digit-grouped number. The library reads
/// `0x10` as 16 wherever a number is expected; nobody writes a GPU count or a port that way, so it
/// is taken as a mistake (a string that looks like one must be quoted anyway).
fn non_decimal_number(text: &str, path: &Path) -> Result<(), YamlError> {
    use serde_saphyr::granit_parser::{Event, Parser, ScalarStyle};
    for event in Parser::new_from_str(text) {
        // Syntax errors are reported by the real parse, with its own message.
        let (event, span) = match event {
            Ok(pair) => pair,
            Err(_) => break,
        };
        let Event::Scalar(value, ScalarStyle::Plain, _, None) = event else { continue };
        let body = value.trim_start_matches(['+', '-']);
        let radix =
            [("0x", 16), ("0X", 16), ("0o", 8), ("0O", 8), ("0b", 2), ("0B", 2)].iter().any(|(prefix, base)| {
                body.strip_prefix(prefix).is_some_and(|digits| {
                    digits.chars().any(|c| c.is_digit(*base)) && digits.chars().all(|c| c.is_digit(*base) || c == '_')
                })
            });
        let grouped = body.contains('_')
            && body.starts_with(|c: char| c.is_ascii_digit())
            && body.chars().all(|c| c.is_ascii_digit() || c == '_' || c == '.');
        if radix || grouped {
            let line = span.start.line() as u64;
            return Err(YamlError {
                path: path.to_path_buf(),
                line: Some(line),
                column: Some(span.start.col() as u64 + 1),
                message: format!(
                    "{}{value} is not a decimal number: write numbers in decimal without `_` (quote it if it is text)",
                    key_on_line(text, Some(line)).map(|key| format!("`{key}`: ")).unwrap_or_default()
                ),
            });
        }
    }
    Ok(())
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
    let message = plain_words(&message).unwrap_or(message);
    if message.contains("field `") || message.contains("variant `") {
        return message;
    }
    match key_on_line(text, line) {
        Some(key) => format!("`{key}`: {message}"),
        None => message,
    }
}

/// What a scalar target expects, in words, for the library's and serde's type messages.
fn plain_words(message: &str) -> Option<String> {
    let expects = |ty: &str| match ty {
        "u8" | "u16" | "u32" | "u64" | "usize" => Some("expected a whole number ≥ 0"),
        "i8" | "i16" | "i32" | "i64" | "isize" => Some("expected a whole number"),
        "f32" | "f64" => Some("expected a number"),
        "bool" | "boolean" | "a boolean" => Some("expected true or false"),
        _ => None,
    };
    if let Some(ty) = message.strip_prefix("invalid ")
        && let Some(words) = expects(ty)
    {
        return Some(words.to_string());
    }
    // "invalid type: string \"2\", expected u32" (a quoted value where a number or boolean goes).
    let rest = message.strip_prefix("invalid type: string ")?;
    let (value, expected) = rest.rsplit_once(", expected ")?;
    let words = expects(expected)?;
    Some(format!("{words}, not the string {value} (write numbers and true/false without quotes)"))
}

/// The mapping key written on `line`, if that line has one.
fn key_on_line(text: &str, line: Option<u64>) -> Option<String> {
    line.and_then(|l| text.lines().nth(usize::try_from(l).ok()?.checked_sub(1)?))
        .and_then(|source| source.trim_start().trim_start_matches("- ").split_once(':'))
        .map(|(key, _)| key.trim().to_string())
        .filter(|key| !key.is_empty() && !key.contains(' '))
}

/// The closest candidate to `input`, if it is close enough to be a plausible typo.
pub(crate) fn did_you_mean<'a>(input: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
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

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Typed {
        #[serde(default)]
        flag: Option<bool>,
        #[serde(default)]
        count: Option<u32>,
        #[serde(default)]
        share: Option<f64>,
        #[serde(default)]
        text: Option<String>,
        #[serde(default)]
        list: Vec<u32>,
    }

    fn typed(text: &str) -> Result<Typed, YamlError> {
        from_yaml_str::<Typed>(text, Path::new("t.yaml"))
    }

    #[test]
    fn quoted_or_loose_scalars_never_fill_numbers_or_booleans() {
        for (input, key) in [
            ("flag: \"false\"\n", "flag"),
            ("flag: 'true'\n", "flag"),
            ("flag: yes\n", "flag"),
            ("flag: on\n", "flag"),
            ("count: \"2\"\n", "count"),
            ("count: 0x10\n", "count"),
            ("count: 0o17\n", "count"),
            ("count: 1_000\n", "count"),
            ("list: [1, \"2\"]\n", "list"),
            ("share: .nan\n", "share"),
            ("share: .inf\n", "share"),
            ("share: \"0.5\"\n", "share"),
            ("text: 123\n", "text"),
            ("text: true\n", "text"),
        ] {
            let err = typed(input).expect_err(input).to_string();
            assert!(err.starts_with("t.yaml:1:"), "{input}: {err}");
            assert!(err.contains(key), "{input}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        let ok = typed("flag: false\ncount: 16\nshare: 0.5\ntext: \"123\"\nlist: [1, 2]\n").unwrap();
        assert_eq!((ok.flag, ok.count, ok.share, ok.text.as_deref()), (Some(false), Some(16), Some(0.5), Some("123")));
        assert_eq!(typed("share: 1\n").unwrap().share, Some(1.0));
        assert_eq!(typed("list: [1, 2]\n").unwrap().list, vec![1, 2]);
        assert_eq!(typed("text: Qwen/Qwen3-8B\n").unwrap().text.as_deref(), Some("Qwen/Qwen3-8B"));
        // Text that merely starts like a radix prefix is text.
        assert_eq!(typed("text: 0xdeadbeef-model\n").unwrap().text.as_deref(), Some("0xdeadbeef-model"));
        assert!(typed("text: [unclosed\n").is_err(), "a syntax error ends the pre-pass");
    }

    #[test]
    fn a_quoted_number_says_what_to_write() {
        let err = typed("count: \"2\"\n").unwrap_err().to_string();
        assert!(err.contains("`count`: expected a whole number ≥ 0, not the string \"2\""), "{err}");
        let err = typed("flag: \"false\"\n").unwrap_err().to_string();
        assert!(err.contains("`flag`: expected true or false"), "{err}");
    }

    #[test]
    fn duplicate_keys_are_rejected() {
        assert!(from_yaml_str::<Sample>("name: a\nname: b\n", Path::new("d.yaml")).is_err());
    }
}
