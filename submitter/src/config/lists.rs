//! Priority lists and blacklists (SPEC §3.5): one model id per line, `#` comments and blank lines
//! ignored, duplicates dropped, order is priority.

use std::path::Path;

#[derive(Debug, thiserror::Error)]
#[error("{path}: cannot read model list: {source} (give a file with one model id per line)")]
pub struct ListError {
    pub path: std::path::PathBuf,
    pub source: std::io::Error,
}

pub fn parse_model_list(text: &str) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    text.lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter(|line| !line.is_empty())
        .filter(|line| seen.insert(line.to_string()))
        .map(str::to_string)
        .collect()
}

pub fn read_model_list(path: &Path) -> Result<Vec<String>, ListError> {
    std::fs::read_to_string(path)
        .map(|text| parse_model_list(&text))
        .map_err(|source| ListError { path: path.to_path_buf(), source })
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
