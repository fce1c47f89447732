//! `{name}` placeholders: every one the product replaces, the fields that may hold it, who replaces
//! it and when — one table, one scanner, one substitution, and one rule for a placeholder that is
//! unknown or in a field that does not take it (docs/design.md §8.4). `${VAR}` is a different
//! mechanism (`crate::expand`, the environment) and never a placeholder.
//!
//! The rule: a `{name}` whose name is identifier-shaped (`[A-Za-z_][A-Za-z0-9_]*`) in a field of
//! [`Field`] must be one of that field's placeholders, else the text is refused where it enters —
//! the cluster profile at load, the launch spec at load (so `submitter spec` refuses what payload
//! would) — naming the field and the names it takes. Anything else in braces passes as written:
//! `${VAR}`, doubled `{{name}}` (Jinja), `{ name }` with spaces, `{a,b}`, `{}` and JSON text.

use std::fmt;

/// A field whose text may hold placeholders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// Values of the engine's environment (spec `serve.env`, profile `engine.env`).
    ServeEnv,
    /// Values of Harbor's environment (spec and profile `harbor.env`).
    HarborEnv,
    /// Elements of the post-run step's argv (spec and profile `post_run.argv`).
    PostRunArgv,
    /// Elements of the profile's `pre_download.command` (staging a model on the login node).
    ModelDownload,
    /// Elements of the profile's `pre_download.dataset_command` (staging a dataset).
    DatasetDownload,
}

/// Who replaces a placeholder, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplacedBy {
    /// payload, on the node, before it starts the child the field belongs to.
    PayloadOnNode,
    /// submitter, on the login node, when it runs the staging command.
    SubmitterAtStaging,
}

/// One placeholder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placeholder {
    /// Written `{name}`.
    pub name: &'static str,
    /// The fields that take it.
    pub fields: &'static [Field],
    pub(crate) replaced_by: ReplacedBy,
    /// What it becomes.
    pub means: &'static str,
}

pub const JOB_SCRATCH: &str = "job_scratch";
pub const RUN_DIR: &str = "run_dir";
pub(crate) const RUN_TAG: &str = "run_tag";
pub const MODEL: &str = "model";
pub const CACHE: &str = "cache";
pub const DATASET: &str = "dataset";
pub const DIR: &str = "dir";

/// Every placeholder (docs/site.md names them where each field is described).
pub(crate) const PLACEHOLDERS: &[Placeholder] = &[
    Placeholder {
        name: JOB_SCRATCH,
        fields: &[Field::ServeEnv, Field::HarborEnv],
        replaced_by: ReplacedBy::PayloadOnNode,
        means: "the job's scratch directory on node-local disk (crate::spec::ScratchSpec)",
    },
    Placeholder {
        name: RUN_DIR,
        fields: &[Field::PostRunArgv],
        replaced_by: ReplacedBy::PayloadOnNode,
        means: "the run directory",
    },
    Placeholder {
        name: RUN_TAG,
        fields: &[Field::PostRunArgv],
        replaced_by: ReplacedBy::PayloadOnNode,
        means: "the run tag",
    },
    Placeholder {
        name: MODEL,
        fields: &[Field::ModelDownload],
        replaced_by: ReplacedBy::SubmitterAtStaging,
        means: "the model's Hugging Face id",
    },
    Placeholder {
        name: CACHE,
        fields: &[Field::ModelDownload],
        replaced_by: ReplacedBy::SubmitterAtStaging,
        means: "the profile's paths.hf_cache",
    },
    Placeholder {
        name: DATASET,
        fields: &[Field::DatasetDownload],
        replaced_by: ReplacedBy::SubmitterAtStaging,
        means: "the dataset's repo id",
    },
    Placeholder {
        name: DIR,
        fields: &[Field::DatasetDownload],
        replaced_by: ReplacedBy::SubmitterAtStaging,
        means: "a scratch dir renamed into the dataset dir on success",
    },
];

impl Field {
    /// The placeholders this field takes.
    pub fn takes(self) -> impl Iterator<Item = &'static Placeholder> {
        PLACEHOLDERS.iter().filter(move |p| p.fields.contains(&self))
    }

    fn known(self) -> String {
        let names: Vec<String> = self.takes().map(|p| format!("{{{}}}", p.name)).collect();
        if names.is_empty() { "none".to_string() } else { names.join(", ") }
    }
}

impl fmt::Display for ReplacedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReplacedBy::PayloadOnNode => "payload replaces it on the node",
            ReplacedBy::SubmitterAtStaging => "submitter replaces it when staging",
        })
    }
}

/// Why a field's text was refused. The caller prefixes the field's name (which differs between
/// the profile and the spec: `engine.env` is `serve.env`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceholderError {
    #[error(
        "`{{{name}}}` is not a placeholder (this field takes {known}; for literal braces write `{{ {name} }}` with spaces)"
    )]
    Unknown { name: String, known: String },
    #[error("`{{{name}}}` is not replaced in this field ({by} only in {elsewhere}; this field takes {known})")]
    Misplaced { name: String, by: ReplacedBy, elsewhere: &'static str, known: String },
}

/// The placeholder-shaped `{name}`s in `text`, as (byte offset of `{`, name), by the rule above.
pub fn scan(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let bytes = text.as_bytes();
    text.match_indices('{').filter_map(move |(at, _)| {
        if at > 0 && matches!(bytes[at - 1], b'$' | b'{') {
            return None;
        }
        let rest = &text[at + 1..];
        let name = &rest[..rest.find('}')?];
        let identifier = crate::expand::is_var_name(name);
        let doubled = bytes.get(at + 1 + name.len() + 1) == Some(&b'}');
        (identifier && !doubled).then_some((at, name))
    })
}

/// Whether `text` holds the placeholder `name`.
pub fn mentions(text: &str, name: &str) -> bool {
    scan(text).any(|(_, found)| found == name)
}

/// The rule: every placeholder in `text` is one `field` takes.
pub fn check(field: Field, text: &str) -> Result<(), PlaceholderError> {
    for (_, name) in scan(text) {
        if field.takes().any(|p| p.name == name) {
            continue;
        }
        return Err(match PLACEHOLDERS.iter().find(|p| p.name == name) {
            Some(p) => PlaceholderError::Misplaced {
                name: name.to_string(),
                by: p.replaced_by,
                elsewhere: elsewhere(p),
                known: field.known(),
            },
            None => PlaceholderError::Unknown { name: name.to_string(), known: field.known() },
        });
    }
    Ok(())
}

/// [`check`] over several texts; the error names the first offending one's index.
pub fn check_all<'a>(
    field: Field,
    texts: impl IntoIterator<Item = &'a String>,
) -> Result<(), (usize, PlaceholderError)> {
    texts.into_iter().enumerate().try_for_each(|(i, text)| check(field, text).map_err(|e| (i, e)))
}

fn elsewhere(p: &Placeholder) -> &'static str {
    match p.fields {
        [Field::ServeEnv, Field::HarborEnv] => "serve.env/engine.env and harbor.env values",
        [Field::PostRunArgv] => "post_run.argv",
        [Field::ModelDownload] => "pre_download.command",
        [Field::DatasetDownload] => "pre_download.dataset_command",
        _ => "other fields",
    }
}

/// `text` with each placeholder that `values` names replaced by its value, in one pass (a value
/// is never scanned again). Run on text [`check`] accepted where it entered; a placeholder
/// without a value stays as written.
pub fn substitute(text: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (at, name) in scan(text) {
        if let Some((_, value)) = values.iter().find(|(n, _)| *n == name) {
            out.push_str(&text[copied..at]);
            out.push_str(value);
            copied = at + name.len() + 2;
        }
    }
    out.push_str(&text[copied..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scanner_finds_identifier_shaped_names_only() {
        fn found(text: &str) -> Vec<&str> {
            scan(text).map(|(_, n)| n).collect()
        }
        assert_eq!(found("--dir={run_dir}/x/{run_tag}"), ["run_dir", "run_tag"]);
        assert_eq!(found("{job_scratch}"), ["job_scratch"]);
        for literal in
            ["${WORK}/x", "{{ var }}", "{{var}}", "{ print }", "{a,b}", "{}", r#"{"k": 1}"#, "{1x}", "{unclosed"]
        {
            assert_eq!(found(literal), Vec::<&str>::new(), "{literal}");
        }
        assert_eq!(found("${A}{b}"), ["b"], "a placeholder right after a variable");
    }

    #[test]
    fn every_placeholder_is_in_one_field_group_and_has_a_known_list() {
        for p in PLACEHOLDERS {
            assert!(!p.fields.is_empty() && elsewhere(p) != "other fields", "{}", p.name);
            assert!(crate::expand::is_var_name(p.name), "{}", p.name);
            assert_eq!(PLACEHOLDERS.iter().filter(|q| q.name == p.name).count(), 1, "{}", p.name);
        }
    }

    #[test]
    fn unknown_and_misplaced_placeholders_are_refused_naming_the_known_ones() {
        check(Field::PostRunArgv, "--dir={run_dir}").unwrap();
        check(Field::PostRunArgv, "sh -c 'echo ${HOME} { x }'").unwrap();
        let typo = check(Field::PostRunArgv, "--dir={run_dri}").unwrap_err().to_string();
        assert!(typo.contains("`{run_dri}` is not a placeholder") && typo.contains("{run_dir}, {run_tag}"), "{typo}");
        let misplaced = check(Field::PostRunArgv, "{job_scratch}/x").unwrap_err().to_string();
        assert!(misplaced.contains("payload replaces it on the node only in serve.env"), "{misplaced}");
        assert!(check(Field::ServeEnv, "{model}").unwrap_err().to_string().contains("pre_download.command"));
        check(Field::HarborEnv, "{job_scratch}/tmp").unwrap();
        check(Field::DatasetDownload, "{dataset}:{dir}").unwrap();
        assert!(check(Field::DatasetDownload, "{cache}").is_err());
        let err = check_all(Field::ModelDownload, &["hf".to_string(), "{modle}".to_string()]).unwrap_err();
        assert_eq!(err.0, 1);
    }

    #[test]
    fn substitution_replaces_named_placeholders_once_and_leaves_literals() {
        let values = [(RUN_DIR, "/j/{run_tag}"), (RUN_TAG, "t")];
        assert_eq!(
            substitute("--dir={run_dir} {run_tag} {{run_tag}} ${run_tag}", &values),
            "--dir=/j/{run_tag} t {{run_tag}} ${run_tag}"
        );
        assert_eq!(substitute("{job_scratch}/x", &values), "{job_scratch}/x");
        assert_eq!(substitute("plain", &values), "plain");
    }
}
