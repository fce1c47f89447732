//! The model id: the one rule for what may name a model, checked once where an id enters (the
//! command line, a priority list, the registry's `model:`, the ledger's catalogue, the launch spec)
//! and carried inward as a [`ModelId`], so nothing further in has to check it again.
//!
//! The rule is the Hugging Face shape `org/name`, plus the bare names and `provider/org/name`
//! forms that occur in real priority lists: segments of `[A-Za-z0-9._-]` joined by `/`, none
//! empty, `.` or `..`, none starting with `-` (it would read as an option in vLLM's argv, as the
//! id and as the served name), at most [`MODEL_ID_MAX`] characters. Local weights are never an
//! id: they go in the spec's `model.local_path`. What a *served* id must be in addition (one `/`)
//! is [`ModelId::hf_repo`].

use std::borrow::Borrow;
use std::fmt;

/// Longest model id: Hugging Face allows 96 characters for a name and for an org.
pub(crate) const MODEL_ID_MAX: usize = 200;

/// Provider prefixes the team's database puts before some ids (`hosted_vllm/Qwen/Qwen3-8B`).
const PROVIDER_PREFIXES: [&str; 4] = ["hosted_vllm", "openai", "vllm", "huggingface"];

/// A model id that passed the rule. Its only constructors validate ([`ModelId::new`], `FromStr`,
/// `TryFrom`, `Deserialize`); it serialises as the plain string, so no file format changes.
///
/// `Deref<Target = str>`: every helper that reads an id as text (size tokens, served name, run
/// tag, staging paths) takes `&str` and gets `&ModelId` by deref coercion, so the type reaches
/// inward without rewriting those helpers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct ModelId(String);

/// Why a text is not a model id: one line naming the id (escaped, cut at 60 characters), the
/// problem and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("model id \"{shown}\" {problem}: {fix}")]
pub struct ModelIdError {
    shown: String,
    problem: String,
    fix: String,
}

impl ModelIdError {
    fn new(id: &str, problem: impl Into<String>) -> Self {
        ModelIdError {
            shown: shown(id),
            problem: problem.into(),
            fix: "give a Hugging Face id like Qwen/Qwen3-8B".to_string(),
        }
    }

    /// The problem alone (without the id and the fix), e.g. `contains whitespace`.
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

fn shown(id: &str) -> String {
    id.chars().take(60).flat_map(char::escape_debug).collect()
}

/// The first problem of `id` under the rule, if any.
fn problem(id: &str) -> Option<&'static str> {
    if id.trim().is_empty() {
        Some("is empty")
    } else if id.len() > MODEL_ID_MAX {
        Some("is too long (more than 200 characters)")
    } else if id.chars().any(char::is_control) {
        Some("contains a control character or newline")
    } else if id.chars().any(char::is_whitespace) {
        Some("contains whitespace")
    } else if id.starts_with('/') {
        Some("is an absolute path (local weights go in the spec's model.local_path)")
    } else if id.starts_with('-') {
        Some("starts with `-` (it would read as an option)")
    } else if id.split('/').any(|s| s.starts_with('-')) {
        Some("has a segment starting with `-` (it would read as an option, as the served name)")
    } else if id.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        Some("has an empty, `.` or `..` path segment")
    } else if !id.chars().all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c)) {
        Some("has characters outside [A-Za-z0-9._-/]")
    } else {
        None
    }
}

impl ModelId {
    /// The id, if it passes the rule.
    pub fn new(id: impl Into<String>) -> Result<Self, ModelIdError> {
        let id = id.into();
        match problem(&id) {
            None => Ok(ModelId(id)),
            Some(why) => Err(ModelIdError::new(&id, why)),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    /// What `spec`/`plan`/`launch` serve must also be a Hugging Face repo id: one `/` at most
    /// (`hosted_vllm/Qwen/Qwen3-8B` never is). A known provider prefix gets the id it names as
    /// the fix. `registry resolve` does not ask this: it shows how the team's loader would resolve
    /// any listed name.
    pub fn hf_repo(&self) -> Result<(), ModelIdError> {
        let id = self.as_str();
        if id.matches('/').count() <= 1 {
            return Ok(());
        }
        let (first, rest) = id.split_once('/').unwrap_or((id, ""));
        let mut error = ModelIdError::new(id, "is not a Hugging Face repo id (`org/name`, one `/`)");
        if PROVIDER_PREFIXES.contains(&first) {
            error.problem =
                format!("starts with the provider prefix `{first}/`, which is not part of a Hugging Face repo id");
            error.fix = format!("give `{rest}`");
        } else {
            error.fix = "give the repo id it names".to_string();
        }
        Err(error)
    }
}

impl std::str::FromStr for ModelId {
    type Err = ModelIdError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ModelId::new(text)
    }
}

impl TryFrom<String> for ModelId {
    type Error = ModelIdError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        ModelId::new(text)
    }
}

impl TryFrom<&str> for ModelId {
    type Error = ModelIdError;

    fn try_from(text: &str) -> Result<Self, Self::Error> {
        ModelId::new(text)
    }
}

impl<'de> serde::Deserialize<'de> for ModelId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        ModelId::new(text).map_err(serde::de::Error::custom)
    }
}

impl From<ModelId> for String {
    fn from(id: ModelId) -> String {
        id.0
    }
}

impl fmt::Display for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::ops::Deref for ModelId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for ModelId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for ModelId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for ModelId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for ModelId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for ModelId {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl PartialEq<ModelId> for str {
    fn eq(&self, other: &ModelId) -> bool {
        self == other.0
    }
}

impl PartialEq<ModelId> for &str {
    fn eq(&self, other: &ModelId) -> bool {
        *self == other.0
    }
}

impl PartialEq<ModelId> for String {
    fn eq(&self, other: &ModelId) -> bool {
        *self == other.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    #[test]
    fn good_ids_pass_and_keep_their_text() {
        for good in [
            "Qwen/Qwen3-8B",
            "DCAgent/Qwen3-8B-tb2-sft",
            "r2egym-nl2bash-stack-bugsseq",
            "hosted_vllm/Qwen/Qwen3-8B",
            "a/b__c-8B",
            "org/model.v1.5",
            "1772975489854999",
        ] {
            let id = ModelId::new(good).unwrap_or_else(|e| panic!("{good}: {e}"));
            assert_eq!((id.as_str(), id.to_string().as_str()), (good, good));
        }
        let longest = format!("{}/{}", "o".repeat(99), "n".repeat(MODEL_ID_MAX - 100));
        assert!(ModelId::new(longest.as_str()).is_ok(), "exactly {MODEL_ID_MAX} characters is an id");
    }

    #[test]
    fn bad_ids_are_refused_in_one_line_naming_the_problem_and_the_fix() {
        let long = "x".repeat(10_000);
        let just_over = format!("{}/{}", "o".repeat(100), "n".repeat(MODEL_ID_MAX - 100));
        let cases: &[(&str, &str)] = &[
            ("", "is empty"),
            (" ", "is empty"),
            ("../../etc/passwd", "`..` path segment"),
            ("/abs/path", "absolute path"),
            ("a/../b", "`..` path segment"),
            ("a/./b", "`..` path segment"),
            ("Qwen/Qwen3 8B", "whitespace"),
            ("Qwen/Qwen3\t8B", "control character"),
            ("a/b\nc", "control character"),
            ("a/b\u{1b}[31m", "control character"),
            ("--chat-template=/etc/passwd", "starts with `-`"),
            ("-x/y", "starts with `-`"),
            ("org/--help", "segment starting with `-`"),
            ("a//b", "empty"),
            ("a/", "empty"),
            (".", "`..` path segment"),
            ("..", "`..` path segment"),
            ("a/b;rm -rf", "whitespace"),
            ("a/b;rm", "characters outside"),
            ("a/$(id)", "characters outside"),
            ("a/`id`", "characters outside"),
            ("a/b|c", "characters outside"),
            ("a/b&c", "characters outside"),
            ("a/b>c", "characters outside"),
            ("a/b'c", "characters outside"),
            ("a/b\"c", "characters outside"),
            ("a/b*", "characters outside"),
            ("a/b@gh200", "characters outside"),
            ("a/b:latest", "characters outside"),
            ("a\\b", "characters outside"),
            ("Qwen/Qwén3", "characters outside"),
            (long.as_str(), "too long"),
            (just_over.as_str(), "too long"),
        ];
        for (bad, why) in cases {
            let err = ModelId::new(*bad).expect_err(bad).to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.ends_with("give a Hugging Face id like Qwen/Qwen3-8B"), "{err}");
            assert!(err.chars().count() < 200, "the id is cut in the message: {err}");
        }
    }

    #[test]
    fn deserialize_validates_and_serialize_is_the_plain_string() {
        let id: ModelId = serde_json::from_str(r#""Qwen/Qwen3-8B""#).unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), r#""Qwen/Qwen3-8B""#);
        let err = serde_json::from_str::<ModelId>(r#""org/--help""#).unwrap_err().to_string();
        assert!(err.starts_with("model id \"org/--help\" has a segment starting with `-`"), "{err}");
        assert!(serde_json::from_str::<ModelId>("7").is_err(), "a number is not an id");
        let map: std::collections::HashMap<ModelId, u8> = [(id.clone(), 1)].into();
        assert_eq!(map.get("Qwen/Qwen3-8B"), Some(&1), "Borrow<str>: looked up by text");
    }

    #[test]
    fn a_served_id_has_one_slash_and_a_provider_prefix_names_the_fix() {
        for ok in ["Qwen/Qwen3-8B", "bare-name"] {
            assert_eq!(ModelId::new(ok).unwrap().hf_repo(), Ok(()));
        }
        let prefixed = ModelId::new("hosted_vllm/Qwen/Qwen3-8B").unwrap().hf_repo().unwrap_err().to_string();
        assert!(prefixed.contains("provider prefix") && prefixed.ends_with("give `Qwen/Qwen3-8B`"), "{prefixed}");
        let nested = ModelId::new("a/b/c").unwrap().hf_repo().unwrap_err().to_string();
        assert!(nested.contains("one `/`") && nested.ends_with("give the repo id it names"), "{nested}");
    }

    /// The ~1,000 real ids of the team's priority list and every `model:` of its registry pass
    /// (`/work/shared/fixtures/otagent`, or `$EVAL_FIXTURES`; skipped with a note when absent).
    #[test]
    #[allow(clippy::print_stderr)]
    fn the_real_ids_of_the_team_pass() {
        let dir = std::env::var_os("EVAL_FIXTURES")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/otagent"));
        let Ok(names) = std::fs::read_to_string(dir.join("model-names.txt")) else {
            eprintln!("note: skipping, fixtures not found at {}", dir.display());
            return;
        };
        let mut ids: Vec<String> =
            names.lines().map(|l| l.split('#').next().unwrap_or_default().trim().to_string()).collect();
        for org in std::fs::read_dir(dir.join("model_config")).into_iter().flatten().flatten() {
            for file in std::fs::read_dir(org.path()).into_iter().flatten().flatten() {
                let text = std::fs::read_to_string(file.path()).unwrap_or_default();
                let id =
                    text.lines().find_map(|l| l.strip_prefix("model:")).map(|l| l.trim().trim_matches(['"', '\'']));
                // `X@P` names a standalone for profile P: X is the id.
                ids.extend(id.map(|id| id.rsplit_once('@').map_or(id, |(bare, _)| bare).to_string()));
            }
        }
        ids.retain(|id| !id.is_empty());
        assert!(ids.len() > 900, "{} ids in {}", ids.len(), dir.display());
        for id in &ids {
            ModelId::new(id.as_str()).unwrap_or_else(|e| panic!("a real id is refused: {e}"));
        }
    }
}
