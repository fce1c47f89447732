//! `registry resolve` on the real registry from the replaced system: the worked examples of
//! the replaced system's registry semantics (docs/design.md §4, asserted field by field below) and every real model id.

use serde_json::{Value, json};

use crate::support::{fixtures, resolved_models, spec_on_local, stderr, stdout, submitter};

const THINK: &str = r#"extra_body={"chat_template_kwargs":{"enable_thinking":true}}"#;
const YARN: &str = r#"{"rope_scaling":{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32768}}"#;
const KEYS: [&str; 16] = [
    "tensor_parallel_size",
    "data_parallel_size",
    "max_model_len",
    "swap_space",
    "trust_remote_code",
    "tool_call_parser",
    "reasoning_parser",
    "hf_overrides",
    "limit_mm_per_prompt",
    "max_num_seqs",
    "extra_args",
    "conda_env",
    "agent_kwargs",
    "max_output_tokens",
    "timeout_multiplier",
    "rule",
];

fn resolve(registry: &str, profile: &str, gpus: &str, models: &[&str]) -> Value {
    let mut args =
        vec!["registry", "resolve", "--registry", registry, "--profile", profile, "--gpus-per-node", gpus, "--json"];
    args.extend_from_slice(models);
    let out = submitter(&args);
    assert!(out.status.success(), "resolve failed: {}", stderr(&out));
    let doc: Value = serde_json::from_str(&stdout(&out)).expect("resolve --json prints JSON");
    assert_eq!((doc["format_version"].as_u64(), doc["kind"].as_str()), (Some(1), Some("registry.resolve")), "{doc}");
    doc["models"].clone()
}

/// Builds the expected object: every key null/empty unless given.
fn expect(fields: Value) -> Value {
    let mut full = serde_json::Map::new();
    for key in KEYS {
        full.insert(key.to_string(), if key == "agent_kwargs" { json!([]) } else { Value::Null });
    }
    for (key, value) in fields.as_object().unwrap() {
        assert!(full.contains_key(key), "unknown key {key} in expectation");
        full.insert(key.clone(), value.clone());
    }
    Value::Object(full)
}

#[test]
fn worked_examples_default_profile() {
    let Some(fixtures) = fixtures() else { return };
    let registry = fixtures.join("model_config");
    let got = resolve(
        registry.to_str().unwrap(),
        "default",
        "4",
        &[
            "Qwen/Qwen3-32B",
            "Qwen/Qwen3-8B",
            "Qwen/Qwen3-30B-A3B-Thinking-2507",
            "probe/Foo-30B-A3B-lc",
            "probe/foo-32b-131k",
            "allenai/tmax-9b",
            "probe/Qwen3-Coder-480B-A35B-Instruct",
            "probe/Qwen3-235B-A22B",
            "probe/Mixtral-8x7B",
            "laion/Qwen3-32B-OpenThoughts-Agent-SFT-10K-axolotl-step250",
            "hosted_vllm/Qwen/Qwen3-8B",
            "probe/Qwen3.6-27B",
            "probe/Qwen3.5-9B-finetune",
        ],
    );
    let cases = [
        (
            "Qwen/Qwen3-32B",
            json!({"tensor_parallel_size": 2, "data_parallel_size": 2, "max_model_len": 32768, "swap_space": 32,
            "trust_remote_code": true, "tool_call_parser": "hermes", "reasoning_parser": "qwen3", "extra_args": "--enable-prefix-caching",
            "agent_kwargs": [THINK], "timeout_multiplier": 16.0, "rule": "exact"}),
        ),
        (
            "Qwen/Qwen3-8B",
            json!({"tensor_parallel_size": 1, "data_parallel_size": 4, "trust_remote_code": true,
            "tool_call_parser": "hermes", "reasoning_parser": "qwen3", "agent_kwargs": [THINK], "timeout_multiplier": 2.0, "rule": "exact"}),
        ),
        // Read directly from model_config/ (like the regenerated mono-file): exact with only hermes.
        (
            "Qwen/Qwen3-30B-A3B-Thinking-2507",
            json!({"tensor_parallel_size": 2, "data_parallel_size": 2, "tool_call_parser": "hermes",
            "timeout_multiplier": 16.0, "rule": "exact"}),
        ),
        (
            "probe/Foo-30B-A3B-lc",
            json!({"tensor_parallel_size": 4, "data_parallel_size": 1, "max_model_len": 32768, "swap_space": 32,
            "trust_remote_code": true, "extra_args": "--enable-prefix-caching --enforce-eager", "timeout_multiplier": 16.0,
            "rule": "pattern:(?i)3[02][Bb]"}),
        ),
        (
            "probe/foo-32b-131k",
            json!({"tensor_parallel_size": 2, "data_parallel_size": 2, "max_model_len": 131072, "swap_space": 32,
            "trust_remote_code": true, "hf_overrides": YARN, "extra_args": "--enable-prefix-caching", "timeout_multiplier": 16.0,
            "rule": "pattern:(?i)(?:32b.*(131k|-lc)|(131k|-lc).*32b)"}),
        ),
        (
            "allenai/tmax-9b",
            json!({"tensor_parallel_size": 4, "data_parallel_size": 1, "max_model_len": 32768, "swap_space": 32,
            "limit_mm_per_prompt": "{\"image\":0,\"video\":0}", "conda_env": "eval-qwen35", "agent_kwargs": [THINK],
            "timeout_multiplier": 2.0, "rule": "exact"}),
        ),
        (
            "probe/Qwen3-Coder-480B-A35B-Instruct",
            json!({"tensor_parallel_size": 2, "data_parallel_size": 2, "timeout_multiplier": 2.0, "rule": "size-default"}),
        ),
        (
            "probe/Qwen3-235B-A22B",
            json!({"tensor_parallel_size": 2, "data_parallel_size": 2, "timeout_multiplier": 2.0, "rule": "size-default"}),
        ),
        (
            "probe/Mixtral-8x7B",
            json!({"tensor_parallel_size": 1, "data_parallel_size": 4, "timeout_multiplier": 2.0, "rule": "size-default"}),
        ),
        // Only a gh200 variant: no entry on default, so the 3[02]B pattern applies.
        (
            "laion/Qwen3-32B-OpenThoughts-Agent-SFT-10K-axolotl-step250",
            json!({"tensor_parallel_size": 4, "data_parallel_size": 1,
            "max_model_len": 32768, "swap_space": 32, "trust_remote_code": true, "extra_args": "--enable-prefix-caching --enforce-eager",
            "timeout_multiplier": 16.0, "rule": "pattern:(?i)3[02][Bb]"}),
        ),
        // No normalisation: the hosted_vllm/ prefix misses the exact entry.
        (
            "hosted_vllm/Qwen/Qwen3-8B",
            json!({"tensor_parallel_size": 1, "data_parallel_size": 4, "timeout_multiplier": 2.0, "rule": "size-default"}),
        ),
        // Family default 256 without the qwen3.5 pattern's conda env (3.6 has no literal "3.5").
        (
            "probe/Qwen3.6-27B",
            json!({"tensor_parallel_size": 2, "data_parallel_size": 2, "max_num_seqs": 256, "timeout_multiplier": 2.0, "rule": "size-default"}),
        ),
        (
            "probe/Qwen3.5-9B-finetune",
            json!({"tensor_parallel_size": 1, "data_parallel_size": 4, "max_model_len": 32768, "trust_remote_code": true,
            "conda_env": "otagent2-fix", "extra_args": "--enable-prefix-caching", "max_num_seqs": 256, "timeout_multiplier": 2.0,
            "rule": "pattern:(?i)qwen3\\.5"}),
        ),
    ];
    for (model, fields) in cases {
        assert_eq!(got[model], expect(fields), "{model}");
    }
}

#[test]
fn worked_examples_gh200_profile() {
    let Some(fixtures) = fixtures() else { return };
    let registry = fixtures.join("model_config");
    let got = resolve(
        registry.to_str().unwrap(),
        "gh200",
        "1",
        &["Qwen/Qwen3-32B", "GAIR/OpenSWE-32B", "Qwen/Qwen3.5-35B-A3B", "probe/Mixtral-8x7B", "QuantTrio/GLM-4.7-AWQ"],
    );
    let cases = [
        (
            "Qwen/Qwen3-32B",
            json!({"tensor_parallel_size": 1, "data_parallel_size": 1, "max_model_len": 32768, "swap_space": 32,
            "trust_remote_code": true, "extra_args": "--enable-prefix-caching", "timeout_multiplier": 16.0, "rule": "exact"}),
        ),
        (
            "GAIR/OpenSWE-32B",
            json!({"tensor_parallel_size": 1, "data_parallel_size": 1, "max_model_len": 32768, "swap_space": 32,
            "trust_remote_code": true, "extra_args": "--enable-prefix-caching", "timeout_multiplier": 16.0, "rule": "pattern:(?i)32[Bb]"}),
        ),
        (
            "Qwen/Qwen3.5-35B-A3B",
            json!({"tensor_parallel_size": 1, "data_parallel_size": 1, "max_model_len": 32768, "swap_space": 32,
            "trust_remote_code": true, "limit_mm_per_prompt": "{\"image\":0,\"video\":0}", "max_num_seqs": 256,
            "extra_args": "--enable-prefix-caching --max-num-seqs 512", "agent_kwargs": [THINK], "timeout_multiplier": 16.0, "rule": "exact"}),
        ),
        (
            "probe/Mixtral-8x7B",
            json!({"tensor_parallel_size": 1, "data_parallel_size": 1, "max_model_len": 32768, "trust_remote_code": true,
            "extra_args": "--enable-prefix-caching", "timeout_multiplier": 2.0, "rule": "pattern:.*"}),
        ),
        (
            "QuantTrio/GLM-4.7-AWQ",
            json!({"tensor_parallel_size": 1, "data_parallel_size": 1, "max_model_len": 32768, "trust_remote_code": true,
            "extra_args": "--enable-prefix-caching", "timeout_multiplier": 2.0, "rule": "pattern:.*"}),
        ),
    ];
    for (model, fields) in cases {
        assert_eq!(got[model], expect(fields), "{model}");
    }
}

/// Every real model id resolves on both profiles; the distributions match the replaced system's
/// facts that hold for any id set (gh200: TP1 everywhere, never a parser or an environment).
#[test]
fn every_real_model_id_resolves() {
    let Some(fixtures) = fixtures() else { return };
    let registry = fixtures.join("model_config");
    let names = fixtures.join("model-names.txt");
    for (profile, gpus) in [("default", "4"), ("gh200", "1")] {
        let got = resolved_models(&registry, profile, gpus, &["--models-file", names.to_str().unwrap()]);
        let map = got.as_object().unwrap();
        assert!(map.len() >= 970, "expected ~976 ids, got {}", map.len());
        for (model, settings) in map {
            let keys: Vec<&str> = settings.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(keys, KEYS, "{model}: keys and order");
            let tp = settings["tensor_parallel_size"].as_u64().unwrap();
            let dp = settings["data_parallel_size"].as_u64().unwrap();
            assert!(tp * dp <= gpus.parse().unwrap(), "{model}: {tp}x{dp}");
            let timeout = settings["timeout_multiplier"].as_f64().unwrap();
            assert!([2.0, 16.0].contains(&timeout), "{model}: timeout {timeout}");
            if profile == "gh200" {
                assert_eq!(tp, 1, "{model}");
                assert!(settings["tool_call_parser"].is_null() && settings["reasoning_parser"].is_null(), "{model}");
                assert!(settings["conda_env"].is_null(), "{model}");
            }
        }
        if profile == "default" {
            let tp4 = map.values().filter(|s| s["tensor_parallel_size"] == 4).count();
            let by_rule = |rule: &str| map.values().filter(|s| s["rule"] == rule).count();
            assert!(tp4 > 200, "the 3[02]B pattern gives TP4 to hundreds of real ids, got {tp4}");
            assert!(by_rule("exact") > 20 && by_rule("size-default") > 500, "rule distribution");
        }
    }
}

#[test]
fn readable_table_without_json() {
    let out = submitter(&["registry", "resolve", "--gpus-per-node", "4", "Qwen/Qwen3-32B", "probe/Foo-7B"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.lines().nth(1).unwrap().starts_with("MODEL"), "{text}");
    assert!(text.contains("Qwen/Qwen3-32B") && text.contains("2x2") && text.contains("exact"), "{text}");
    assert!(text.contains("probe/Foo-7B") && text.contains("size-default"), "{text}");
}

#[test]
fn cluster_supplies_profile_and_gpus() {
    // Vista is gh200 with one GPU per node: the shipped gh200 variant gives TP1 without parsers.
    let out = submitter(&["registry", "resolve", "--cluster", "tacc", "--json", "Qwen/Qwen3-32B"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let got: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!((got["profile"].as_str(), got["gpus_per_node"].as_u64()), (Some("gh200"), Some(1)), "{got}");
    assert_eq!(got["models"]["Qwen/Qwen3-32B"]["tensor_parallel_size"], 1);
    assert_eq!(got["models"]["Qwen/Qwen3-32B"]["tool_call_parser"], Value::Null);
}

#[test]
fn registry_check_passes_on_shipped_and_fixture_configuration() {
    let out = submitter(&["registry", "check"]);
    assert!(out.status.success(), "shipped configuration must lint clean: {}", stdout(&out));
    let Some(fixtures) = fixtures() else { return };
    let registry = fixtures.join("model_config");
    let presets = fixtures.join("eval/presets");
    let out = submitter(&["registry", "check", "--registry", registry.to_str().unwrap()]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    // The consequences worth a warning, observed on the real registry.
    assert!(text.contains("drops tool_call_parser"), "{text}");
    assert!(text.contains("fall through to the patterns"), "{text}");
    assert!(text.contains("shadowed by earlier pattern #3 `(?i)3[02][Bb]`"), "{text}");
    assert!(text.contains("thin exact entry"), "{text}");
    // The replaced system's presets load with our preset type, except for the keys nothing here
    // would read: those are refused at their line with the key that replaces them.
    for entry in std::fs::read_dir(&presets).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let retired = ["error_threshold", "vllm_max_retries", "tp_size", "check_hf_exists", "sbatch_script"];
        let cleaned: String = text
            .lines()
            .filter(|line| !retired.iter().any(|key| line.starts_with(&format!("{key}:"))))
            .map(|line| format!("{line}\n"))
            .collect();
        let parsed = launch_spec::yaml::from_yaml_str::<submitter::config::Preset>(&cleaned, &path);
        assert!(parsed.is_ok(), "{} without the retired keys: {:?}", path.display(), parsed.err());
        // They declare no scoring: scored as undeclared (mean only, outside the ID mean, not ranked).
        assert_eq!(parsed.unwrap().scoring(), submitter::config::preset::Scoring::UNDECLARED, "{}", path.display());
        if cleaned != text {
            let err = launch_spec::yaml::from_yaml_file::<submitter::config::Preset>(&path).unwrap_err().to_string();
            assert!(err.contains("is retired: ") && err.lines().count() == 1 && err.contains(".yaml:"), "{err}");
        }
    }
}

/// `submitter spec` writes the launch spec with the field names operators and tests rely on.
#[test]
fn spec_command_writes_the_stable_fields() {
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("launch.json");
    let out = spec_on_local("tb2", "Qwen/Qwen3-32B", &["--out", out_file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap();
    for pointer in
        ["/run_dir", "/jobs_dir", "/run_tag", "/serve/program", "/harbor/program", "/harbor/dataset", "/secrets/file"]
    {
        assert!(spec.pointer(pointer).is_some_and(|v| !v.is_null()), "{pointer} missing: {spec:#}");
    }
    assert_eq!(spec["run_tag"], "terminal_bench_2__Qwen__Qwen3-32B");
    assert_eq!(spec["model"]["served_name"], "Qwen3-32B");
    assert_eq!(spec["serve"]["tensor_parallel_size"], 2);
    assert_eq!(spec["harbor"]["timeout_multiplier"], 16.0);
    let text = std::fs::read_to_string(&out_file).unwrap();
    assert!(!text.contains("DAYTONA_API_KEY="), "no secret values in a spec");
    // The spec round-trips through payload's reader.
    launch_spec::LaunchSpec::from_file(&out_file).expect("payload can read it");
}

#[test]
fn spec_command_rejects_an_unknown_preset_listing_valid_ones() {
    let out = submitter(&["spec", "--cluster", "local", "--preset", "tb3", "--model", "Qwen/Qwen3-8B"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("unknown preset `tb3`") && err.contains("tb2") && err.contains("swebench_full"), "{err}");
    assert!(stdout(&out).is_empty());
}

/// `registry check` reads each kwarg as the cluster's declared Harbor will get it.
#[test]
fn registry_check_judges_kwargs_for_the_declared_harbor() {
    let dir = tempfile::tempdir().unwrap();
    let root = crate::support::workspace_root();
    let clusters = dir.path().join("clusters");
    std::fs::create_dir(&clusters).unwrap();
    for name in ["gpus.yaml", "local.yaml"] {
        std::fs::copy(root.join("clusters").join(name), clusters.join(name)).unwrap();
    }
    let registry = dir.path().join("model_config");
    std::fs::create_dir_all(registry.join("Org")).unwrap();
    std::fs::copy(root.join("model_config/_patterns.yaml"), registry.join("_patterns.yaml")).unwrap();
    let model = |kwargs: &str| {
        std::fs::write(
            registry.join("Org/Think-8B.yaml"),
            format!("model: Org/Think-8B\nsubsystems:\n  eval:\n    agent_kwargs:\n      - {kwargs}\n"),
        )
        .unwrap()
    };
    let check = || {
        submitter(&[
            "registry",
            "check",
            "--quiet",
            "--registry",
            registry.to_str().unwrap(),
            "--clusters",
            clusters.to_str().unwrap(),
        ])
    };
    // Either form of the thinking kwarg is fine for Harbor 0.25 (translated at spec time) …
    model(THINK);
    assert!(check().status.success(), "{}", stdout(&check()));
    // … an option terminus-2 0.25 does not have is an error naming it and the fix.
    model("enable_episode_logging=false");
    let out = check();
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains("Org/Think-8B.yaml")
            && text.contains("`enable_episode_logging` is unknown to terminus-2 of harbor-0.25"),
        "{text}"
    );
    // The fork takes only extra_body: other llm_call_kwargs cannot be translated for it.
    let local = std::fs::read_to_string(clusters.join("local.yaml")).unwrap();
    std::fs::write(clusters.join("local.yaml"), local.replace("harbor: \"0.25.0\"", "harbor: extra-body-fork"))
        .unwrap();
    model(r#"llm_call_kwargs={"top_k":20}"#);
    let text = stdout(&check());
    assert!(text.contains("extra-body-fork") && text.contains("`top_k`"), "{text}");
}

/// The spec carries the kwargs in the declared Harbor's form and the capabilities of the declared vLLM.
#[test]
fn spec_translates_the_thinking_kwarg_for_harbor_025() {
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("launch.json");
    let out = spec_on_local("swebench", "Qwen/Qwen3-8B", &["--out", out_file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap();
    assert_eq!(spec["harbor"]["dialect"], "harbor-0.25");
    assert_eq!(
        spec["harbor"]["agent_kwargs"],
        json!([r#"llm_call_kwargs={"extra_body":{"chat_template_kwargs":{"enable_thinking":true}}}"#])
    );
    assert_eq!(spec["harbor"]["agent_parser"], "xml");
    assert_eq!(spec["serve"]["supports_swap_space"], false, "vLLM 0.33.0 has no --swap-space");
}

/// Issue 21 item 10: a model file that is a dangling symlink, a FIFO or a link to `/dev/zero` is
/// reported by name from every command that loads the registry (`resolve`, `spec`), never a file
/// silently skipped; `registry check` fails on it; a FIFO never hangs any of them. (Issue 20: one bad
/// registry file does not take down the commands that do not need it, so `resolve` and `spec` go on.)
#[test]
fn a_model_file_that_is_no_regular_file_is_reported_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = tmp.path().join("model_config");
    let copy = std::process::Command::new("cp")
        .arg("-r")
        .arg(crate::support::workspace_root().join("model_config"))
        .arg(&registry)
        .status()
        .unwrap();
    assert!(copy.success());
    let target = registry.join("Qwen/zz-broken.yaml");
    let makers: [(&str, &dyn Fn()); 3] = [
        ("dangling symlink", &|| std::os::unix::fs::symlink(tmp.path().join("gone.yaml"), &target).unwrap()),
        ("FIFO", &|| assert!(std::process::Command::new("mkfifo").arg(&target).status().unwrap().success())),
        ("/dev/zero", &|| std::os::unix::fs::symlink("/dev/zero", &target).unwrap()),
    ];
    for (what, make) in makers {
        let _ = std::fs::remove_file(&target);
        make();
        let started = std::time::Instant::now();
        let dir = registry.to_str().unwrap();
        for args in [
            &["registry", "resolve", "--registry", dir, "--gpus-per-node", "4", "--json", "Qwen/Qwen3-32B"][..],
            &["spec", "--registry", dir, "--cluster", "local", "--preset", "tb2", "--model", "Qwen/Qwen3-32B"][..],
        ] {
            let out = submitter(args);
            assert!(out.status.success(), "{what}: {}: {}", args[0], stderr(&out));
            assert!(stderr(&out).contains("zz-broken.yaml"), "{what}: {} did not say so: {}", args[0], stderr(&out));
        }
        let check = submitter(&["registry", "check", "--registry", dir]);
        assert!(!check.status.success(), "{what}: registry check passed: {}", stdout(&check));
        assert!(format!("{}{}", stdout(&check), stderr(&check)).contains("zz-broken.yaml"), "{what}");
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "{what}: it hung");
    }
}
