//! Contract: where the vLLM stand-in (and submitter's preflight) find weights is where the real
//! huggingface_hub and vLLM find them (docs/site.md). The cache layout the tests write
//! (`models--org--name/refs/main` → `snapshots/<commit>`), `HF_HUB_CACHE` / `HF_HOME`, and
//! `HF_HUB_OFFLINE` are checked against the real huggingface_hub of the vLLM venv and the real
//! vLLM's config loader (`vllm.transformers_utils.config.get_config`), whose error for an
//! unresolvable model the stand-in prints. Skipped with a note without the venv (required in CI).

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::Command;

use e2e::standin::hub::{self, NotFound, Weights};
use serde_json::Value;

fn venv() -> Option<PathBuf> {
    match e2e::vllm_oracle::venv(launch_spec::versions::VERIFIED_VLLM.to_string().as_str(), true) {
        Ok(dir) => Some(dir),
        Err(why) => {
            assert!(std::env::var("CI").map_or(true, |v| v != "true"), "{why}");
            eprintln!("skipping: {why}");
            None
        }
    }
}

/// huggingface_hub's offline snapshot lookup for each (model, environment) case: one process,
/// the environment applied per case (its constants re-read).
const HUB_PROBE: &str = r#"
import importlib, json, os, sys
cases = json.loads(sys.argv[1])
import huggingface_hub.constants as constants
import huggingface_hub._snapshot_download as snap
answers = []
for case in cases:
    for k in ("HF_HUB_CACHE", "HF_HOME", "HF_HUB_OFFLINE"):
        os.environ.pop(k, None)
    os.environ.update(case["env"])
    importlib.reload(constants)
    try:
        answers.append({"hub": snap.snapshot_download(case["model"], local_files_only=True)})
    except Exception as e:
        answers.append({"hub_error": type(e).__name__})
print(json.dumps(answers))
"#;

/// vLLM's config loader for each model, under the process's environment (vLLM reads it once).
const VLLM_PROBE: &str = r#"
import json, sys
from vllm.transformers_utils.config import get_config
answers = []
for model in json.loads(sys.argv[1]):
    try:
        get_config(model, trust_remote_code=False)
        answers.append("ok")
    except Exception as e:
        answers.append(f"{type(e).__name__}: {e}")
print(json.dumps(answers))
"#;

fn python(venv: &Path, home: &Path, script: &str, arg: &Value, env: &[(&str, String)]) -> Value {
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.args(["-c", script])
        .arg(arg.to_string())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .env("VLLM_TARGET_DEVICE", "cpu")
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("DO_NOT_TRACK", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("probe: {e}\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn weights_resolve_where_huggingface_hub_and_vllm_resolve_them() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let home = dir.path().join("hf_home");
    let cached = hub::write_snapshot(&cache, "org/Cached-1B", hub::STANDIN_REVISION, hub::TINY_CONFIG).unwrap();
    let in_home =
        hub::write_snapshot(&home.join("hub"), "org/Home-1B", hub::STANDIN_REVISION, hub::TINY_CONFIG).unwrap();
    let cache_s = cache.display().to_string();
    let home_s = home.display().to_string();
    let offline = |pairs: &[(&str, &str)]| {
        let mut env: Vec<(String, String)> = vec![("HF_HUB_OFFLINE".into(), "1".into())];
        env.extend(pairs.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())));
        env
    };
    let cases: Vec<(&str, Vec<(String, String)>)> = vec![
        ("org/Cached-1B", offline(&[("HF_HUB_CACHE", &cache_s)])),
        ("org/Home-1B", offline(&[("HF_HOME", &home_s)])),
        ("org/Missing-1B", offline(&[("HF_HUB_CACHE", &cache_s)])),
        // The cache given but the model in another one: not found (no fallback to $HOME).
        ("org/Home-1B", offline(&[("HF_HUB_CACHE", &cache_s)])),
        (cached.to_str().unwrap(), offline(&[])),
    ];
    let request: Vec<Value> = cases
        .iter()
        .map(|(model, env)| serde_json::json!({"model": model, "env": env.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect::<serde_json::Map<_, _>>()}))
        .collect();
    let home_dir = dir.path().join("home");
    let hub_answers = python(&venv, &home_dir, HUB_PROBE, &Value::from(request), &[]);
    // vLLM under the job's environment of the first case (HF_HUB_CACHE, offline).
    let probed: Vec<usize> = (0..cases.len()).filter(|&i| cases[i].1 == cases[0].1 || cases[i].1.len() == 1).collect();
    let models: Vec<&str> = probed.iter().map(|&i| cases[i].0).collect();
    let vllm_answers = python(
        &venv,
        &home_dir,
        VLLM_PROBE,
        &serde_json::json!(models),
        &[("HF_HUB_CACHE", cache_s.clone()), ("HF_HUB_OFFLINE", "1".to_string())],
    );
    let answers: Vec<Value> = cases
        .iter()
        .zip(hub_answers.as_array().unwrap())
        .enumerate()
        .map(|(case, (_, hub))| {
            let mut answer = hub.clone();
            if let Some(i) = probed.iter().position(|&p| p == case) {
                let verdict = vllm_answers[i].as_str().unwrap_or_default();
                answer[if verdict == "ok" { "vllm" } else { "vllm_error" }] = Value::from(verdict);
            }
            answer
        })
        .collect();
    for ((model, env), real) in cases.iter().zip(&answers) {
        let lookup = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let ours = hub::resolve(model, &lookup);
        let path = |p: &Path| p.display().to_string();
        match &ours {
            Ok(Weights::Cached(at)) => {
                assert_eq!(real["hub"].as_str(), Some(path(at).as_str()), "{model} {env:?}: {real}");
                if !real["vllm_error"].is_null() {
                    panic!("vLLM cannot load {model} the stand-in finds: {real}");
                }
                // submitter's preflight reads the same layout.
                let cache = lookup("HF_HUB_CACHE").map(PathBuf::from).unwrap_or_else(|| home.join("hub"));
                assert_eq!(submitter::readiness::hf_snapshot(&cache, model).as_deref(), Some(at.as_path()));
            }
            Ok(Weights::Local(_)) => assert_eq!(real["vllm"], "ok", "{model}: {real}"),
            Err(NotFound { error, .. }) if real["vllm_error"].is_null() => {
                assert_eq!(real["hub_error"], "LocalEntryNotFoundError", "{model} {env:?}: {real}");
                let _ = error;
            }
            Err(NotFound { error, .. }) => {
                assert_eq!(real["hub_error"], "LocalEntryNotFoundError", "{model} {env:?}: {real}");
                assert_eq!(real["vllm_error"].as_str(), Some(error.as_str()), "vLLM's own message for {model}");
            }
            other => panic!("{model} {env:?}: stand-in {other:?}, real {real}"),
        }
    }
    assert_eq!(in_home.parent().unwrap().parent().unwrap(), home.join("hub").join(hub::repo_folder("org/Home-1B")));
}

/// The staging tool accepts the layout: the real `hf download`, offline, resolves a cached model
/// to its snapshot and fails with huggingface_hub's message for one that is not there.
#[test]
fn the_real_hf_cli_stages_from_the_cache_offline() {
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let snapshot = hub::write_snapshot(&cache, "org/Cached-1B", hub::STANDIN_REVISION, hub::TINY_CONFIG).unwrap();
    let hf = |model: &str| {
        Command::new(venv.join("bin/hf"))
            .args(["download", model, "--cache-dir"])
            .arg(&cache)
            .arg("--quiet")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", dir.path())
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap()
    };
    let out = hf("org/Cached-1B");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), snapshot.display().to_string());
    let out = hf("org/Missing-1B");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("offline mode is enabled"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
