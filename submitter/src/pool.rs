//! Which checkpoints may share one engine in a pool (issue 37; docs/allocation.md "Pools"): the
//! login node compares the checkpoints' own files before it submits, so a fine-tune of another
//! architecture, tokenizer, chat template or generation defaults is planned apart rather than
//! swapped into an engine that would serve it wrongly (vLLM's weight reload reads none of these
//! files: docs/decisions.md, issue 37). Reading is [`read_checkpoint`]; comparing is pure
//! ([`incompatibility`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha1::{Digest, Sha1};

/// `config.json` keys that differ between fine-tunes of one architecture without changing what
/// the engine builds: bookkeeping of whoever saved the checkpoint. Everything else (layer counts,
/// widths, vocabulary, tied embeddings, dtype, rope, quantization) must be equal.
pub const CONFIG_KEYS_IGNORED: [&str; 5] =
    ["_name_or_path", "transformers_version", "_commit_hash", "use_cache", "_attn_implementation_autoset"];

/// The tokenizer's files, compared by content where present (a missing file on both sides is equal).
pub const TOKENIZER_FILES: [&str; 7] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
];

/// Larger tokenizer or config files are refused (a Qwen3 `tokenizer.json` is 11 MB).
const MAX_FILE_BYTES: u64 = 64 << 20;

/// `tokenizer_config.json` keys left out of the tokenizer's digest: the chat template is compared
/// on its own, the name is bookkeeping.
const TOKENIZER_CONFIG_KEYS_IGNORED: [&str; 2] = ["chat_template", "name_or_path"];

/// What of a checkpoint decides whether another checkpoint's weights can be served by an engine
/// started with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The checkpoint's dir as the node sees it (the shared file system).
    pub path: PathBuf,
    /// The HF snapshot's commit, when the dir is one.
    pub revision: Option<String>,
    /// `config.json` without [`CONFIG_KEYS_IGNORED`].
    pub config: BTreeMap<String, Value>,
    /// `sha1:<hex>` over [`TOKENIZER_FILES`] (name and content; `tokenizer_config.json` canonical,
    /// without the chat template).
    pub tokenizer: String,
    /// `sha1:<hex>` of the chat template (`chat_template.jinja`, else `tokenizer_config.json`'s
    /// `chat_template`), `None` when there is none.
    pub chat_template: Option<String>,
    /// `generation_config.json` without `transformers_version`, `None` when absent.
    pub generation: Option<Value>,
}

/// The checkpoint dir of a spec's model: `model.local_path`, else the HF cache's snapshot.
pub fn checkpoint_dir(spec: &launch_spec::LaunchSpec, hf_cache: Option<&Path>) -> Option<(PathBuf, Option<String>)> {
    if let Some(path) = &spec.model.local_path {
        return Some((path.clone(), None));
    }
    let snapshot = crate::readiness::hf_snapshot(hf_cache?, &spec.model.hf_id)?;
    let revision = snapshot.file_name().and_then(|n| n.to_str()).map(str::to_string);
    Some((snapshot, revision))
}

/// The checkpoint a spec's engine would load, read ([`checkpoint_dir`], [`read_checkpoint`]); the
/// error says why it cannot be compared (not on disk yet, a broken file).
pub fn checkpoint_of(spec: &launch_spec::LaunchSpec, hf_cache: Option<&Path>) -> Result<Checkpoint, String> {
    let (dir, revision) = checkpoint_dir(spec, hf_cache).ok_or_else(|| {
        format!(
            "{}'s weights are not on disk (no model.local_path, no snapshot in paths.hf_cache): stage them first",
            spec.model.hf_id
        )
    })?;
    read_checkpoint(&dir, revision)
}

/// Reads the files of the checkpoint at `dir` that [`incompatibility`] compares. The error names
/// the file and what is wrong with it.
pub fn read_checkpoint(dir: &Path, revision: Option<String>) -> Result<Checkpoint, String> {
    let read_bytes = |name: &str| -> Result<Option<Vec<u8>>, String> {
        let path = dir.join(name);
        // Followed (an HF snapshot's files link into its blobs); only a regular file is read, so a
        // FIFO cannot hang `plan`.
        let Ok(meta) = std::fs::metadata(&path) else { return Ok(None) };
        if !meta.is_file() || meta.len() > MAX_FILE_BYTES {
            return Err(format!("{}: not a regular file of at most {MAX_FILE_BYTES} bytes", path.display()));
        }
        std::fs::read(&path).map(Some).map_err(|e| format!("{}: cannot be read: {e}", path.display()))
    };
    let read = |name: &str| -> Result<Option<String>, String> {
        read_bytes(name)?
            .map(|bytes| String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8 text", dir.join(name).display())))
            .transpose()
    };
    let json = |name: &str, text: &str| -> Result<Value, String> {
        serde_json::from_str(text)
            .map_err(|e| format!("{}: line {}, column {}: {e}", dir.join(name).display(), e.line(), e.column()))
    };
    let config_text = read("config.json")?.ok_or_else(|| {
        format!("{}: no config.json: not a checkpoint dir (download the model first: `submitter stage`)", dir.display())
    })?;
    let Value::Object(config) = json("config.json", &config_text)? else {
        return Err(format!("{}: not a JSON object", dir.join("config.json").display()));
    };
    let config = config.into_iter().filter(|(k, _)| !CONFIG_KEYS_IGNORED.contains(&k.as_str())).collect();
    let mut tokenizer = Sha1::new();
    let mut template_in_config = None;
    for name in TOKENIZER_FILES {
        let content = if name == "tokenizer_config.json" {
            let Some(text) = read(name)? else { continue };
            let Value::Object(mut map) = json(name, &text)? else {
                return Err(format!("{}: not a JSON object", dir.join(name).display()));
            };
            template_in_config = map.get("chat_template").cloned();
            map.retain(|k, _| !TOKENIZER_CONFIG_KEYS_IGNORED.contains(&k.as_str()));
            canonical(&Value::Object(map)).into_bytes()
        } else {
            // `tokenizer.model` is a binary protobuf: compared as bytes.
            let Some(bytes) = read_bytes(name)? else { continue };
            bytes
        };
        tokenizer.update(format!("{name}\n{}\n", content.len()));
        tokenizer.update(&content);
    }
    let chat_template = match read("chat_template.jinja")? {
        Some(text) => Some(text),
        None => template_in_config.map(|t| canonical(&t)),
    }
    .map(|t| digest(t.as_bytes()));
    let generation =
        read("generation_config.json")?.map(|text| json("generation_config.json", &text)).transpose()?.map(|mut g| {
            if let Some(map) = g.as_object_mut() {
                map.remove("transformers_version");
            }
            g
        });
    Ok(Checkpoint {
        path: dir.to_path_buf(),
        revision,
        config,
        tokenizer: format!("sha1:{}", hex::encode(tokenizer.finalize())),
        chat_template,
        generation,
    })
}

/// Why `other`'s weights cannot be served by an engine started with `first` (the first difference,
/// in words), `None` when they can.
pub fn incompatibility(first: &Checkpoint, other: &Checkpoint) -> Option<String> {
    let keys = first.config.keys().chain(other.config.keys().filter(|k| !first.config.contains_key(*k)));
    let shown = |v: Option<&Value>| v.map_or("absent".to_string(), |v| short(&canonical(v)));
    for key in keys {
        let (a, b) = (first.config.get(key), other.config.get(key));
        if a != b {
            return Some(format!("config.json `{key}` differs ({} vs {})", shown(a), shown(b)));
        }
    }
    if first.tokenizer != other.tokenizer {
        return Some(format!("tokenizer files differ ({} vs {})", short(&first.tokenizer), short(&other.tokenizer)));
    }
    if first.chat_template != other.chat_template {
        let t = |d: &Option<String>| d.as_deref().map_or("none".to_string(), short);
        return Some(format!("chat template differs ({} vs {})", t(&first.chat_template), t(&other.chat_template)));
    }
    if first.generation != other.generation {
        return Some(format!(
            "generation_config.json differs ({} vs {})",
            shown(first.generation.as_ref()),
            shown(other.generation.as_ref())
        ));
    }
    None
}

/// JSON with object keys sorted (serde_json keeps insertion order here): equal content, equal text.
fn canonical(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let ordered: BTreeMap<&String, Value> = map.iter().map(|(k, v)| (k, sorted(v))).collect();
                Value::Object(ordered.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

fn digest(bytes: &[u8]) -> String {
    format!("sha1:{}", hex::encode(Sha1::digest(bytes)))
}

/// At most 40 characters of a value for a one-line reason.
fn short(text: &str) -> String {
    if text.chars().count() <= 40 { text.to_string() } else { text.chars().take(37).collect::<String>() + "…" }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny Qwen3-like checkpoint: config, tokenizer, template, generation defaults.
    fn write_checkpoint(dir: &Path, config: Value, template: &str, generation: Value) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        std::fs::write(dir.join("tokenizer.json"), r#"{"model":{"type":"BPE"}}"#).unwrap();
        let tok =
            serde_json::json!({"tokenizer_class": "Qwen2Tokenizer", "chat_template": template, "name_or_path": dir});
        std::fs::write(dir.join("tokenizer_config.json"), tok.to_string()).unwrap();
        std::fs::write(dir.join("generation_config.json"), generation.to_string()).unwrap();
    }

    fn base_config(name: &str) -> Value {
        serde_json::json!({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
                           "tie_word_embeddings": true, "vocab_size": 151936, "_name_or_path": name,
                           "transformers_version": "4.51.0", "torch_dtype": "bfloat16"})
    }

    /// Table: what two fine-tunes may differ in, and the first difference named when they may not.
    #[test]
    fn fine_tunes_of_one_architecture_agree_and_each_difference_is_named() {
        let root = tempfile::tempdir().unwrap();
        let generation = serde_json::json!({"temperature": 0.6, "top_p": 0.95, "transformers_version": "4.51.0"});
        let base = root.path().join("base");
        write_checkpoint(&base, base_config("org/base"), "{{ messages }}", generation.clone());
        let first = read_checkpoint(&base, None).unwrap();
        let mut wider = base_config("org/wide");
        wider["hidden_size"] = 128.into();
        let mut deeper = base_config("org/deep");
        deeper["num_hidden_layers"] = 3.into();
        let mut other_gen = generation.clone();
        other_gen["temperature"] = 1.0.into();
        let cases: Vec<(&str, Value, &str, Value, Option<&str>)> = vec![
            // Another name, another transformers version: the same engine.
            ("tune", base_config("org/tune"), "{{ messages }}", generation.clone(), None),
            (
                "wide",
                wider,
                "{{ messages }}",
                generation.clone(),
                Some("config.json `hidden_size` differs (64 vs 128)"),
            ),
            ("deep", deeper, "{{ messages }}", generation.clone(), Some("`num_hidden_layers` differs (2 vs 3)")),
            ("tmpl", base_config("org/t"), "{{ other }}", generation.clone(), Some("chat template differs")),
            ("gen", base_config("org/g"), "{{ messages }}", other_gen, Some("generation_config.json differs")),
        ];
        for (name, config, template, generation, want) in cases {
            let dir = root.path().join(name);
            write_checkpoint(&dir, config, template, generation);
            let other = read_checkpoint(&dir, Some("abc".into())).unwrap();
            let got = incompatibility(&first, &other);
            match want {
                None => assert_eq!(got, None, "{name}"),
                Some(want) => assert!(got.as_deref().is_some_and(|g| g.contains(want)), "{name}: {got:?}"),
            }
        }
        // Another tokenizer's vocabulary.
        let tok = root.path().join("tok");
        write_checkpoint(&tok, base_config("org/tok"), "{{ messages }}", generation);
        std::fs::write(tok.join("tokenizer.json"), r#"{"model":{"type":"Unigram"}}"#).unwrap();
        let got = incompatibility(&first, &read_checkpoint(&tok, None).unwrap());
        assert!(got.as_deref().is_some_and(|g| g.starts_with("tokenizer files differ")), "{got:?}");
    }

    #[test]
    fn a_dir_without_config_or_with_broken_json_is_refused_by_name() {
        let root = tempfile::tempdir().unwrap();
        let err = read_checkpoint(root.path(), None).unwrap_err();
        assert!(err.contains("no config.json"), "{err}");
        std::fs::write(root.path().join("config.json"), "{\"hidden_size\": 64,\n oops}").unwrap();
        let err = read_checkpoint(root.path(), None).unwrap_err();
        assert!(err.contains("config.json: line 2"), "{err}");
    }
}
