//! Priority lists and blacklists (docs/design.md §3.5): one model id per line, `#` comments and blank lines
//! ignored, duplicates dropped, order is priority.

use std::path::Path;

use launch_spec::{ModelId, ModelIdError};

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

/// Reads a list (a regular file, at most 16 MiB): every id is a `ModelId`, or the error names the
/// file and line.
pub fn read_model_list(path: &Path) -> Result<Vec<ModelId>, ListError> {
    use launch_spec::fsread;
    let text = fsread::read_text_capped(path, fsread::RECORD_CAP, fsread::Links::Follow)
        .map_err(|source| ListError::Read { path: path.to_path_buf(), source })?;
    parse_model_list_lines(&text)
        .into_iter()
        .map(|(line, id)| {
            ModelId::new(id).map_err(|problem| ListError::BadId {
                path: path.to_path_buf(),
                line,
                problem: problem.to_string(),
            })
        })
        .collect()
}

/// The ledger's catalogue as model ids, in its order, and the rows that are none (1-based, as
/// `models list` shows them, with the problem): the catalogue keeps what an older submitter or the
/// team database stored unchecked.
pub(crate) fn catalogue_ids(ids: impl IntoIterator<Item = String>) -> (Vec<ModelId>, Vec<(usize, ModelIdError)>) {
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    for (index, id) in ids.into_iter().enumerate() {
        match ModelId::new(id) {
            Ok(id) => good.push(id),
            Err(problem) => bad.push((index + 1, problem)),
        }
    }
    (good, bad)
}

/// The models to consider, in priority order: the list minus the blacklist (the blacklist wins).
pub(crate) fn filter_models(priority: &[ModelId], blacklist: &[ModelId]) -> Vec<ModelId> {
    let blocked: std::collections::HashSet<&ModelId> = blacklist.iter().collect();
    priority.iter().filter(|id| !blocked.contains(id)).cloned().collect()
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
    fn a_catalogue_row_that_is_no_id_is_named_and_left_out() {
        let rows = ["org/A-8B", "org/\u{1b}[2Jwipe", "org/B-8B", "../x"].map(String::from);
        let (ids, refused) = catalogue_ids(rows);
        assert_eq!(ids, [ModelId::new("org/A-8B").unwrap(), ModelId::new("org/B-8B").unwrap()]);
        let rows: Vec<usize> = refused.iter().map(|(row, _)| *row).collect();
        assert_eq!(rows, [2, 4]);
        assert!(refused[0].1.to_string().contains("control character"), "{}", refused[0].1);
    }

    #[test]
    fn blacklist_beats_list() {
        let id = |text: &str| ModelId::new(text).unwrap();
        assert_eq!(filter_models(&[id("a"), id("b")], &[id("a")]), vec![id("b")]);
    }
}
