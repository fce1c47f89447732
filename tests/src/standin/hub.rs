//! Where the vLLM stand-in finds a model's weights — the way vLLM 0.33 and huggingface_hub 2.x
//! resolve `vllm serve <model>` (checked against the real ones by `tests/tests/hub_contract.rs`):
//!
//! 1. `<model>` is an existing directory → served from there;
//! 2. else it is a repo id looked up in the HF cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//!    `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`; the entry is
//!    `models--<org>--<name>/refs/main` (a commit hash) → `snapshots/<hash>/config.json`;
//! 3. not cached and `HF_HUB_OFFLINE` set → vLLM's real "Invalid repository ID or local
//!    directory" error;
//! 4. not cached, online: the node's network decides (`STANDIN_HUB`): `unreachable` → the same
//!    error after huggingface_hub's connection warning (a compute node without internet);
//!    `reachable` → "downloaded" into the cache (a minimal snapshot), which is where a cluster with
//!    internet puts weights; unset → accepted without touching any cache (tests that are not about
//!    weights).

use std::path::{Path, PathBuf};

/// The commit a "download" records (any 40-hex value; real ones come from the Hub).
pub const STANDIN_REVISION: &str = "5a0c3f3b1d6e4b8a9c2d7e1f0a3b5c7d9e1f2a4b";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Weights {
    /// A local directory given as the model.
    Local(PathBuf),
    /// A snapshot directory in the cache.
    Cached(PathBuf),
    /// Fetched into the cache now (`STANDIN_HUB=reachable`).
    Downloaded(PathBuf),
    /// Not resolved, not needed (`STANDIN_HUB` unset).
    Unchecked,
}

/// The lines vLLM prints when it cannot resolve the model (the last one is the exception).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotFound {
    pub warnings: Vec<String>,
    pub error: String,
}

/// vLLM 0.33's message for a model that is neither a directory nor resolvable on the Hub.
pub(crate) fn invalid_model_message(model: &str) -> String {
    format!(
        "ValueError: Invalid repository ID or local directory specified: '{model}'.\nPlease verify the following requirements:\n1. Provide a valid Hugging Face repository ID.\n2. Specify a local directory that contains a recognized configuration file.\n   - For Hugging Face models: ensure the presence of a 'config.json'.\n   - For Mistral models: ensure the presence of a 'params.json'.\n"
    )
}

/// huggingface_hub's truthy values for `HF_HUB_OFFLINE`.
pub(crate) fn is_true(value: Option<&str>) -> bool {
    value.is_some_and(|v| ["1", "ON", "YES", "TRUE"].contains(&v.trim().to_ascii_uppercase().as_str()))
}

/// The hub cache directory huggingface_hub uses under `env`.
pub(crate) fn cache_dir(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    let set = |name: &str| env(name).filter(|v| !v.is_empty());
    if let Some(dir) = set("HF_HUB_CACHE").or_else(|| set("HUGGINGFACE_HUB_CACHE")) {
        return PathBuf::from(dir);
    }
    if let Some(home) = set("HF_HOME") {
        return Path::new(&home).join("hub");
    }
    let xdg = set("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(&set("HOME").unwrap_or_else(|| "/".into())).join(".cache"));
    xdg.join("huggingface").join("hub")
}

/// `models--org--name` for `org/name`.
pub fn repo_folder(model: &str) -> String {
    format!("models--{}", model.replace('/', "--"))
}

/// The snapshot `refs/main` points at, when it holds a `config.json`.
pub(crate) fn cached_snapshot(cache: &Path, model: &str) -> Option<PathBuf> {
    let repo = cache.join(repo_folder(model));
    let revision = std::fs::read_to_string(repo.join("refs").join("main")).ok()?;
    let snapshot = repo.join("snapshots").join(revision.trim());
    snapshot.join("config.json").is_file().then_some(snapshot)
}

/// Writes a cache entry as a download does: blob, snapshot link, `refs/main`.
pub fn write_snapshot(cache: &Path, model: &str, revision: &str, config: &str) -> std::io::Result<PathBuf> {
    let repo = cache.join(repo_folder(model));
    let snapshot = repo.join("snapshots").join(revision);
    std::fs::create_dir_all(&snapshot)?;
    std::fs::create_dir_all(repo.join("refs"))?;
    std::fs::create_dir_all(repo.join("blobs"))?;
    let blob = repo.join("blobs").join(format!("{:x}", config.len() * 7919 + 17));
    std::fs::write(&blob, config)?;
    let link = snapshot.join("config.json");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(Path::new("../../blobs").join(blob.file_name().unwrap_or_default()), &link)?;
    std::fs::write(repo.join("refs").join("main"), revision)?;
    Ok(snapshot)
}

/// A small config.json (a real architecture, so the real vLLM's config loader accepts it).
pub const TINY_CONFIG: &str = r#"{"model_type":"qwen2","architectures":["Qwen2ForCausalLM"],"hidden_size":64,"num_attention_heads":4,"num_hidden_layers":1,"num_key_value_heads":4,"intermediate_size":64,"vocab_size":128}"#;

/// Resolves `model` under `env` (see the module docs).
pub fn resolve(model: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Weights, NotFound> {
    if Path::new(model).is_dir() {
        return Ok(Weights::Local(PathBuf::from(model)));
    }
    let cache = cache_dir(env);
    if let Some(snapshot) = cached_snapshot(&cache, model) {
        return Ok(Weights::Cached(snapshot));
    }
    let not_found = |warnings: Vec<String>| NotFound { warnings, error: invalid_model_message(model) };
    if is_true(env("HF_HUB_OFFLINE").as_deref()) {
        return Err(not_found(Vec::new()));
    }
    match env("STANDIN_HUB").as_deref() {
        Some("unreachable") => Err(not_found(vec![format!(
            "Error retrieving file list: (MaxRetryError(\"HTTPSConnectionPool(host='huggingface.co', port=443): Max retries exceeded with url: /api/models/{model}/revision/main (Caused by NewConnectionError(\"HTTPSConnection(host='huggingface.co', port=443): Failed to establish a new connection: [Errno 101] Network is unreachable\"))\"), '(Request ID: standin)'), retrying 1 of 2"
        )])),
        Some("reachable") => match write_snapshot(&cache, model, STANDIN_REVISION, TINY_CONFIG) {
            Ok(snapshot) => Ok(Weights::Downloaded(snapshot)),
            Err(err) => Err(NotFound {
                warnings: Vec::new(),
                error: format!("OSError: [Errno 13] {err}: '{}'", cache.display()),
            }),
        },
        _ => Ok(Weights::Unchecked),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_location_follows_huggingface_hub() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_string())
        };
        assert_eq!(cache_dir(&env(&[("HF_HUB_CACHE", "/c"), ("HF_HOME", "/h")])), Path::new("/c"));
        assert_eq!(cache_dir(&env(&[("HF_HOME", "/h"), ("HOME", "/u")])), Path::new("/h/hub"));
        assert_eq!(cache_dir(&env(&[("HOME", "/u")])), Path::new("/u/.cache/huggingface/hub"));
        assert!(is_true(Some("1")) && is_true(Some("yes")) && !is_true(Some("0")) && !is_true(None));
    }

    #[test]
    fn offline_without_the_weights_fails_and_with_them_resolves() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().display().to_string();
        let env = |offline: bool| {
            let cache = cache.clone();
            move |name: &str| match name {
                "HF_HUB_CACHE" => Some(cache.clone()),
                "HF_HUB_OFFLINE" if offline => Some("1".into()),
                _ => None,
            }
        };
        let err = resolve("org/Model-1B", &env(true)).unwrap_err();
        assert!(
            err.error.starts_with("ValueError: Invalid repository ID or local directory specified: 'org/Model-1B'.")
        );
        assert_eq!(resolve("org/Model-1B", &env(false)).unwrap(), Weights::Unchecked);
        let snapshot = write_snapshot(dir.path(), "org/Model-1B", STANDIN_REVISION, TINY_CONFIG).unwrap();
        assert_eq!(resolve("org/Model-1B", &env(true)).unwrap(), Weights::Cached(snapshot.clone()));
        assert_eq!(resolve(snapshot.to_str().unwrap(), &env(true)).unwrap(), Weights::Local(snapshot));
    }
}
