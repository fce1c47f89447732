//! Priority lists and blacklists (docs/design.md §3.5): one model id per line, `#` comments and blank lines
//! ignored, duplicates dropped, order is priority.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("{path}: cannot read model list: {source} (give a file with one model id per line)")]
    Read { path: std::path::PathBuf, source: std::io::Error },
    #[error("{path}:{line}: {problem}")]
    BadId { path: std::path::PathBuf, line: usize, problem: String },
}

/// The ids of a list, each with its 1-based line number.
pub(crate) fn parse_model_list_lines(text: &str) -> Vec<(usize, String)> {
    let mut seen = std::collections::HashSet::new();
    text.lines()
        .enumerate()
        .map(|(index, line)| (index + 1, line.split('#').next().unwrap_or_default().trim()))
        .filter(|(_, line)| !line.is_empty())
        .filter(|(_, line)| seen.insert(line.to_string()))
        .map(|(number, line)| (number, line.to_string()))
        .collect()
}

#[cfg(test)] // used only by the tests
pub(crate) fn parse_model_list(text: &str) -> Vec<String> {
    parse_model_list_lines(text).into_iter().map(|(_, id)| id).collect()
}

/// Reads a list (a regular file, at most 16 MiB); every id must pass `validate::model_id`.
pub fn read_model_list(path: &Path) -> Result<Vec<String>, ListError> {
    use launch_spec::fsread;
    let text = fsread::read_text_capped(path, fsread::RECORD_CAP, fsread::Links::Follow)
        .map_err(|source| ListError::Read { path: path.to_path_buf(), source })?;
    parse_model_list_lines(&text)
        .into_iter()
        .map(|(line, id)| {
            launch_spec::validate::model_id(&id).map_err(|problem| ListError::BadId {
                path: path.to_path_buf(),
                line,
                problem,
            })?;
            Ok(id)
        })
        .collect()
}

/// The models to consider, in priority order: the list minus the blacklist (the blacklist wins).
pub fn filter_models(priority: &[String], blacklist: &[String]) -> Vec<String> {
    let blocked: std::collections::HashSet<&str> = blacklist.iter().map(String::as_str).collect();
    priority.iter().filter(|id| !blocked.contains(id.as_str())).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_blanks_duplicates_and_order() {
        let list = parse_model_list("# header\nb/two\n\na/one  # inline\nb/two\n   \nc/three\n");
        assert_eq!(list, vec!["b/two", "a/one", "c/three"]);
    }

    #[test]
    fn blacklist_beats_list() {
        let list = vec!["a".to_string(), "b".to_string()];
        assert_eq!(filter_models(&list, &["a".to_string()]), vec!["b"]);
    }
}
