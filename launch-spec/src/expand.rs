//! `${NAME}` expansion, the one rule both programs apply: the submitter to profile paths, commands
//! and environment values at submit time, payload to the registry's `extra_args` on the node.
//!
//! Only the braced form is expanded; a bare `$NAME` (or any other `$`) stays as written, so text
//! meant for a later shell or program passes through. An unset variable or an unterminated `${`
//! is an error naming it, never an empty string or literal text.

/// Why a text could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpandError {
    #[error("${{{0}}} is not set")]
    Unset(String),
    #[error("unterminated `${{` (write ${{NAME}})")]
    Unterminated,
    #[error("`${{{0}}}` is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")]
    BadName(String),
}

/// Expands every `${NAME}` in `text` from `lookup`.
pub fn expand_vars(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, ExpandError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("${") {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 2..];
        let end = after.find('}').ok_or(ExpandError::Unterminated)?;
        let name = &after[..end];
        if !is_var_name(name) {
            return Err(ExpandError::BadName(name.to_string()));
        }
        out.push_str(&lookup(name).ok_or_else(|| ExpandError::Unset(name.to_string()))?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// [`expand_vars`] for a path: also a leading `~` or `~/` becomes `${HOME}`.
pub fn expand_path(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, ExpandError> {
    let home = || lookup("HOME").ok_or_else(|| ExpandError::Unset("HOME".to_string()));
    match text.strip_prefix('~') {
        Some("") => home(),
        Some(rest) if rest.starts_with('/') => Ok(home()? + &expand_vars(rest, lookup)?),
        _ => expand_vars(text, lookup),
    }
}

/// A shell variable name.
pub fn is_var_name(name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOME" => Some("/home/u".into()),
            "WORK" => Some("/work/p".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn braced_names_expand_and_other_dollars_stay() {
        assert_eq!(expand_vars("${WORK}/jobs/${WORK}", &env).unwrap(), "/work/p/jobs//work/p");
        assert_eq!(expand_vars("a $HOME $ ${EMPTY}b", &env).unwrap(), "a $HOME $ b");
        assert_eq!(expand_vars("/plain", &env).unwrap(), "/plain");
    }

    #[test]
    fn unset_unterminated_and_bad_names_are_errors() {
        assert_eq!(expand_vars("${NOPE}/x", &env), Err(ExpandError::Unset("NOPE".into())));
        assert_eq!(expand_vars("${WORK", &env), Err(ExpandError::Unterminated));
        assert_eq!(expand_vars("x ${WORK}/${", &env), Err(ExpandError::Unterminated));
        assert_eq!(expand_vars("${A B}", &env), Err(ExpandError::BadName("A B".into())));
        assert_eq!(expand_vars("${}", &env), Err(ExpandError::BadName(String::new())));
    }

    #[test]
    fn paths_expand_a_leading_tilde() {
        assert_eq!(expand_path("~/secrets.env", &env).unwrap(), "/home/u/secrets.env");
        assert_eq!(expand_path("~", &env).unwrap(), "/home/u");
        assert_eq!(expand_path("~other/x", &env).unwrap(), "~other/x");
        assert_eq!(expand_path("/a/~/b", &env).unwrap(), "/a/~/b");
        assert_eq!(expand_path("~/${NOPE}", &env), Err(ExpandError::Unset("NOPE".into())));
    }
}
