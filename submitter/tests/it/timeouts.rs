//! The timeout policy of issue 20 (docs/design.md §4.3), through the real binary: the multiplier
//! of every registry model follows the rule by name, and `spec` records the value that runs.

use std::path::Path;

use serde_json::Value;

use crate::support::{fixtures, resolved_models, spec_on_local, stderr, stdout, submitter, workspace_root};

/// The largest `\d+(\.\d+)?\s*[bB]` token not preceded by a letter, digit or dot and not followed
/// by a letter or digit: written here again, apart from the product's scanner, so the test checks
/// the rule, not the code.
fn largest_size(id: &str) -> Option<f64> {
    let token = regex::Regex::new(r"^(\d+(?:\.\d+)?)\s*[bB]").unwrap();
    let bytes = id.as_bytes();
    (0..id.len())
        .filter(|&i| i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'.'))
        .filter_map(|i| {
            let m = token.captures(id.get(i..)?)?;
            let end = i + m.get(0)?.end();
            (end == id.len() || !bytes[end].is_ascii_alphanumeric()).then(|| m[1].parse::<f64>().ok())?
        })
        .reduce(f64::max)
}

/// Issue 20's rule for a name with no registry value: the largest size in 28–42B → 16.0, else 2.0.
fn by_rule(id: &str) -> f64 {
    match largest_size(id) {
        Some(size) if (28.0..=42.0).contains(&size) => 16.0,
        _ => 2.0,
    }
}

/// Model ids declared in a registry tree (`model:` of each `<org>/*.yaml`), and whether any file
/// or pattern sets its own `timeout_multiplier`.
fn registry_ids(root: &Path) -> (Vec<String>, bool) {
    let mut ids = Vec::new();
    let mut sets_timeout =
        std::fs::read_to_string(root.join("_patterns.yaml")).is_ok_and(|text| text.contains("timeout_multiplier"));
    for org in std::fs::read_dir(root).unwrap().flatten().filter(|e| e.path().is_dir()) {
        for file in std::fs::read_dir(org.path()).unwrap().flatten() {
            let text = std::fs::read_to_string(file.path()).unwrap_or_default();
            sets_timeout |= text.contains("timeout_multiplier");
            if let Some(id) = text.lines().find_map(|l| l.strip_prefix("model:")) {
                ids.push(id.trim().trim_matches(['"', '\'']).to_string());
            }
        }
    }
    ids.sort();
    (ids, sets_timeout)
}

fn resolve_all(registry: &Path, profile: &str, ids: &[String]) -> Value {
    let list = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(list.path(), ids.join("\n") + "\n").unwrap();
    // Enough GPUs for every layout: only the multiplier is checked here.
    resolved_models(registry, profile, "16", &["--models-file", list.path().to_str().unwrap()])
}

fn assert_policy(registry: &Path, ids: &[String]) -> usize {
    let mut checked = 0;
    for profile in ["default", "gh200"] {
        let got = resolve_all(registry, profile, ids);
        for id in ids {
            let multiplier = got[id]["timeout_multiplier"].as_f64().unwrap_or_else(|| panic!("{id}: {got:#}"));
            assert_eq!(multiplier, by_rule(id), "{id} on {profile}: largest size {:?}", largest_size(id));
            checked += 1;
        }
    }
    checked
}

#[test]
fn the_rules_own_size_reading() {
    assert_eq!(largest_size("Qwen/Qwen3-30B-A3B"), Some(30.0));
    assert_eq!(largest_size("org/Foo-8B-32B-merge"), Some(32.0));
    assert_eq!(largest_size("Mixtral-8x7B"), None);
    assert_eq!(largest_size("Qwen2.5-1.5B-Instruct"), Some(1.5));
    assert_eq!(by_rule("Qwen/Qwen3.5-35B-A3B"), 16.0);
    assert_eq!(by_rule("meta-llama/Llama-3.3-70B-Instruct"), 2.0);
    assert_eq!(by_rule("org/no-size"), 2.0);
}

/// Every model of the shipped registry, by name; and, when the fixtures are here, every model of
/// the team's registry and every id of its database (~1,000).
#[test]
fn registry_conformance_the_multiplier_of_every_model_follows_the_rule() {
    let shipped = workspace_root().join("model_config");
    let (ids, sets_timeout) = registry_ids(&shipped);
    assert!(!sets_timeout, "a shipped entry sets its own timeout_multiplier: the rule would not apply to it");
    assert!(ids.len() >= 5, "{ids:?}");
    assert_policy(&shipped, &ids);
    let Some(fixtures) = fixtures() else { return };
    let team = fixtures.join("model_config");
    let (mut ids, sets_timeout) = registry_ids(&team);
    assert!(!sets_timeout);
    let names = std::fs::read_to_string(fixtures.join("model-names.txt")).unwrap();
    ids.extend(names.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from));
    ids.sort();
    ids.dedup();
    // The team's registry has no _timeouts.yaml: the built-in policy applies; then the shipped bands.
    let checked = assert_policy(&team, &ids);
    assert!(checked >= 1900, "expected ~1,000 ids on two profiles, checked {checked}");
    let with_bands = tempfile::tempdir().unwrap();
    let copy = with_bands.path().join("model_config");
    copy_tree(&team, &copy);
    std::fs::copy(shipped.join("_timeouts.yaml"), copy.join("_timeouts.yaml")).unwrap();
    assert_policy(&copy, &ids);
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn spec(args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("launch.json");
    let mut all = vec!["spec", "--cluster", "local", "--out", file.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = submitter(&all);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap()
}

fn harbor(spec: &Value) -> (f64, &str, &str) {
    let config = spec["harbor"]["config"].as_str().unwrap();
    let name = Path::new(config).file_name().unwrap().to_str().unwrap();
    (spec["harbor"]["timeout_multiplier"].as_f64().unwrap(), spec["harbor"]["timeout_source"].as_str().unwrap(), name)
}

/// The multiplier that runs is in the spec with its rule; the canonical config follows the size
/// when the preset names none; an explicit config's own value is used as-is.
#[test]
fn spec_records_the_multiplier_the_policy_chose() {
    let moe = spec(&["--preset", "tb2", "--model", "Qwen/Qwen3-30B-A3B"]);
    assert_eq!(harbor(&moe), (16.0, "size", "dcagent_eval_config_no_override.yaml"));
    let small = spec(&["--preset", "tb2", "--model", "Qwen/Qwen3-8B"]);
    assert_eq!(harbor(&small).0, 2.0);
    let nameless = spec(&["--preset", "tb2", "--model", "org/model-without-size"]);
    assert_eq!(harbor(&nameless), (2.0, "fallback", "dcagent_eval_config_no_override.yaml"));
    let big = spec(&["--preset", "tb2", "--model", "meta-llama/Llama-3.3-70B-Instruct"]);
    assert_eq!(harbor(&big).0, 2.0);
    // v1 names no config: the band's canonical one runs.
    assert_eq!(harbor(&spec(&["--preset", "v1", "--model", "Qwen/Qwen3-32B"])).2, "dcagent_eval_defaults_32b.yaml");
    assert_eq!(harbor(&spec(&["--preset", "v1", "--model", "Qwen/Qwen3-8B"])).2, "dcagent_eval_defaults.yaml");

    let dir = tempfile::tempdir().unwrap();
    let explicit = dir.path().join("mine.yaml");
    std::fs::write(&explicit, "timeout_multiplier: 4.0\nagents:\n  - name: terminus-2\n").unwrap();
    let path = explicit.to_str().unwrap();
    for model in ["Qwen/Qwen3-32B", "Qwen/Qwen3-8B"] {
        let got = spec(&["--preset", "tb2", "--model", model, "--harbor-config", path]);
        assert_eq!(harbor(&got), (4.0, "harbor-config", "mine.yaml"), "{model}");
    }
    let cli =
        spec(&["--preset", "tb2", "--model", "Qwen/Qwen3-32B", "--harbor-config", path, "--timeout-multiplier", "3"]);
    assert_eq!(harbor(&cli).0, 3.0);
    // A missing explicit config is refused on the login node, in one line naming it.
    let out = spec_on_local("tb2", "Qwen/Qwen3-8B", &["--harbor-config", "/nonexistent/x.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/nonexistent/x.yaml") && stderr(&out).trim().lines().count() == 1,
        "{}",
        stderr(&out)
    );
}

/// `registry check` names the models whose multiplier is the fallback.
#[test]
fn registry_check_reports_fallback_multipliers() {
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("model_config");
    copy_tree(&workspace_root().join("model_config"), &registry);
    std::fs::create_dir_all(registry.join("probe")).unwrap();
    std::fs::write(registry.join("probe/nosize.yaml"), "model: probe/no-size-token\nmax_model_len: 8192\n").unwrap();
    let out = submitter(&["registry", "check", "--registry", registry.to_str().unwrap()]);
    let text = stdout(&out);
    assert!(text.contains("timeout multiplier of `probe/no-size-token` is the fallback 2.0"), "{text}");
    assert!(text.contains("timeout multiplier of `meta-llama/Llama-3.3-70B-Instruct` is the fallback"), "{text}");
    assert!(!text.contains("`Qwen/Qwen3-32B` is the fallback"), "{text}");
}

// ---- issue 20 Build 5: `X@<profile>` standalones, one bad file, provider prefixes ----

/// A copy of the shipped registry in `root` with `files` (relative path, text) added.
fn registry_with(root: &Path, files: &[(&str, &str)]) -> std::path::PathBuf {
    let dir = root.join("model_config");
    copy_tree(&workspace_root().join("model_config"), &dir);
    for (path, text) in files {
        std::fs::create_dir_all(dir.join(path).parent().unwrap()).unwrap();
        std::fs::write(dir.join(path), text).unwrap();
    }
    dir
}

fn resolve_one(registry: &Path, profile: &str, model: &str) -> Value {
    resolved_models(registry, profile, "4", &[model])[model].clone()
}

/// The team's semantics (its loader, docs/design.md §4.1): `X@P` replaces X wholesale on P — not
/// merged with X's base, eval or `variants.P` — creates X there if X has no file, is ignored on
/// other profiles, and an empty one leaves X to the patterns on P.
#[test]
fn standalone_replaces_the_model_wholesale_on_its_profile_only() {
    let dir = tempfile::tempdir().unwrap();
    let registry = registry_with(
        dir.path(),
        &[
            (
                "Qwen/Qwen3-32B@gh200.yaml",
                "model: Qwen/Qwen3-32B@gh200\nmax_model_len: 65536\nsubsystems:\n  eval:\n    tensor_parallel_size: 1\n    variants:\n      gh200:\n        max_model_len: 1\n",
            ),
            ("probe/Only-7B@gh200.yaml", "model: probe/Only-7B@gh200\nswap_space: 7\n"),
            ("probe/Empty-7B.yaml", "model: probe/Empty-7B\nswap_space: 3\n"),
            ("probe/Empty-7B@gh200.yaml", "model: probe/Empty-7B@gh200\n"),
        ],
    );
    let gh200 = resolve_one(&registry, "gh200", "Qwen/Qwen3-32B");
    assert_eq!((gh200["max_model_len"].as_u64(), gh200["tensor_parallel_size"].as_u64()), (Some(65536), Some(1)));
    assert!(gh200["tool_call_parser"].is_null() && gh200["swap_space"].is_null(), "wholesale: {gh200:#}");
    assert_eq!(gh200["rule"], "exact");
    let default = resolve_one(&registry, "default", "Qwen/Qwen3-32B");
    assert_eq!(default["tool_call_parser"], "hermes", "ignored on other profiles: {default:#}");
    assert_eq!(default["max_model_len"], 32768);
    assert_eq!(resolve_one(&registry, "gh200", "probe/Only-7B")["swap_space"], 7);
    assert_eq!(resolve_one(&registry, "default", "probe/Only-7B")["rule"], "size-default");
    assert_eq!(resolve_one(&registry, "default", "probe/Empty-7B")["swap_space"], 3);
    assert_eq!(resolve_one(&registry, "gh200", "probe/Empty-7B")["rule"], "pattern:.*");
    // registry check accepts standalones (and still fails on a bad one).
    let check = submitter(&["registry", "check", "--registry", registry.to_str().unwrap()]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
}

/// One file that does not load is reported; models it does not name still resolve and `spec`
/// still writes their specs; the model it names is refused with the file; `registry check` fails.
#[test]
fn one_bad_registry_file_refuses_only_its_model() {
    let dir = tempfile::tempdir().unwrap();
    let registry =
        registry_with(dir.path(), &[("probe/Broken-7B.yaml", "model: probe/Broken-7B\nmax_model_len: [oops\n")]);
    let reg = registry.to_str().unwrap();
    let good =
        submitter(&["spec", "--cluster", "local", "--preset", "tb2", "--model", "Qwen/Qwen3-8B", "--registry", reg]);
    assert!(good.status.success(), "{}", stderr(&good));
    assert!(stderr(&good).contains("Broken-7B.yaml"), "the bad file is reported: {}", stderr(&good));
    let resolved = submitter(&["registry", "resolve", "--registry", reg, "--gpus-per-node", "4", "Qwen/Qwen3-32B"]);
    assert!(resolved.status.success(), "{}", stderr(&resolved));
    let bad =
        submitter(&["spec", "--cluster", "local", "--preset", "tb2", "--model", "probe/Broken-7B", "--registry", reg]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    let err = stderr(&bad);
    assert!(err.contains("probe/Broken-7B") && err.contains("Broken-7B.yaml") && !err.contains("panicked"), "{err}");
    let check = submitter(&["registry", "check", "--registry", reg]);
    assert_eq!(check.status.code(), Some(1), "{}", stdout(&check));
    assert!(stdout(&check).contains("Broken-7B.yaml"), "{}", stdout(&check));
}

/// `hosted_vllm/Qwen/Qwen3-8B` (as the team's database names some models) is never served as a
/// Hugging Face repo: `spec` refuses it with the id it names.
#[test]
fn provider_prefixed_ids_are_refused_with_the_repo_id() {
    let out = submitter(&["spec", "--cluster", "local", "--preset", "tb2", "--model", "hosted_vllm/Qwen/Qwen3-8B"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("give `Qwen/Qwen3-8B`") && err.trim().lines().count() == 1, "{err}");
}
