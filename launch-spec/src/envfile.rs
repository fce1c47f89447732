//! The secrets env file's format (docs/design.md §6.6), read the same way by payload (which loads it)
//! and by the submitter's preflight (which checks it before anything is queued): one parser, one
//! size cap. Errors give a line number and the problem, never the content.

use std::path::Path;

use crate::fsread::{self, Links};

/// The largest secrets file read.
pub const MAX_SECRETS_BYTES: u64 = 1 << 20;

/// Why an env file cannot be used; never holds a value.
#[derive(Debug, thiserror::Error)]
pub enum EnvFileError {
    #[error("{0}")]
    Read(std::io::Error),
    #[error("line {line}: {problem}")]
    Syntax { line: usize, problem: &'static str },
}

/// The `(name, value)` pairs of the env file at `path`: a regular file (a FIFO or device is refused at
/// once) of at most [`MAX_SECRETS_BYTES`], UTF-8, parsed by [`parse`].
pub fn read_pairs(path: &Path) -> Result<Vec<(String, String)>, EnvFileError> {
    let text = fsread::read_text_capped(path, MAX_SECRETS_BYTES, Links::Follow).map_err(EnvFileError::Read)?;
    parse(&text).map_err(|(line, problem)| EnvFileError::Syntax { line, problem })
}

/// Whether a secret's value counts as given. A required secret with an empty value (`KEY=`, `KEY=""`)
/// is missing to payload (exit 3 on the node), so the submitter's preflight asks the same question.
pub fn is_given(value: &str) -> bool {
    !value.is_empty()
}

/// The names of `pairs` whose value counts as given ([`is_given`]; a later line of a name wins).
pub fn given_names(pairs: Vec<(String, String)>) -> Vec<String> {
    let mut last: Vec<(String, String)> = Vec::new();
    for (name, value) in pairs {
        last.retain(|(n, _)| *n != name);
        last.push((name, value));
    }
    last.into_iter().filter(|(_, value)| is_given(value)).map(|(name, _)| name).collect()
}

pub const EXPECTED_KV: &str = "expected KEY=VALUE (optionally `export KEY=VALUE`)";

/// Parses `KEY=VALUE` lines the way the old scripts' `source secrets.env` (bash) read them: blank
/// lines and `#` comments skipped, `export ` tolerated, one level of single or double quotes
/// removed, and a ` # comment` after the value (a `#` after whitespace, outside quotes) dropped —
/// `KEY=v # c` is `v`, while `KEY=a#b` and `KEY='v # c'` keep their `#`. Later lines win. Errors
/// give the 1-based line and the problem, never the content; a NUL byte is one (no environment
/// can carry it).
pub fn parse(text: &str) -> Result<Vec<(String, String)>, (usize, &'static str)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (idx, raw) in text.lines().enumerate() {
        let line_no = idx + 1;
        if raw.contains('\0') {
            return Err((line_no, "contains a NUL byte, which no environment variable can hold"));
        }
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").map(str::trim_start).unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else { return Err((line_no, EXPECTED_KV)) };
        let key = key.trim();
        let key_ok = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !key_ok {
            return Err((line_no, EXPECTED_KV));
        }
        let value = value_of(value.trim())
            .ok_or((line_no, "unterminated quote, or text after the closing quote (only a `# comment` may follow)"))?;
        out.retain(|(k, _)| k != key);
        out.push((key.to_string(), value));
    }
    Ok(out)
}

/// The value part of one line (already trimmed): quoted, or bare up to a ` #` comment.
fn value_of(value: &str) -> Option<String> {
    let rest_ok = |rest: &str| {
        let rest = rest.trim_start();
        rest.is_empty() || rest.starts_with('#')
    };
    if let Some(inner) = value.strip_prefix('\'') {
        let close = inner.find('\'')?;
        return rest_ok(&inner[close + 1..]).then(|| inner[..close].to_string());
    }
    if let Some(inner) = value.strip_prefix('"') {
        let mut out = String::with_capacity(inner.len());
        let mut chars = inner.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, next @ ('"' | '\\' | '$' | '`'))) => out.push(next),
                    Some((_, next)) => {
                        out.push('\\');
                        out.push(next);
                    }
                    None => out.push('\\'),
                },
                '"' => return rest_ok(&inner[i + 1..]).then_some(out),
                c => out.push(c),
            }
        }
        return None;
    }
    // Bare: a `#` starts a comment only after whitespace (bash's rule for a new word).
    let bytes = value.as_bytes();
    let cut = (1..bytes.len()).find(|&i| bytes[i] == b'#' && bytes[i - 1].is_ascii_whitespace());
    Some(match cut {
        Some(i) => value[..i].trim_end().to_string(),
        None => value.to_string(),
    })
}
