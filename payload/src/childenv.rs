//! Explicit child environments (docs/design.md §6.6): every child starts from an empty environment
//! (`env_clear()`), gets a small allow-list from payload's own environment, the environment
//! prefix on PATH / LD_LIBRARY_PATH (never `conda activate`), the spec's env map, and the run marker.
//!
//! Never passed: `VLLM_PORT` (vLLM's DP workers would all bind it), anything not on the list
//! (secrets exported into the job, test knobs such as `STANDIN_*`).

use std::collections::BTreeMap;
use std::path::Path;

/// Variables copied from payload's environment when set.
pub(crate) const ALLOWED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TERM",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_HOME",
    "NVIDIA_VISIBLE_DEVICES",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_CACHE",
    "TRANSFORMERS_CACHE",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
];

/// Prefixes copied from payload's environment (Slurm's job description).
pub(crate) const ALLOWED_PREFIXES: &[&str] = &["SLURM_"];

/// Never handed to a child, whatever the spec says.
pub(crate) const FORBIDDEN: &[&str] = &["VLLM_PORT"];

/// Marker on every child so tests can find leaked processes in `/proc/*/environ`.
pub(crate) const RUN_ID_VAR: &str = "PAYLOAD_RUN_ID";

fn allowed(name: &str) -> bool {
    ALLOWED.contains(&name) || ALLOWED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Builds a child's environment.
///
/// `parent` is payload's environment; `prefix` the spec's environment prefix; `extra` the spec's
/// env map (overrides the allow-list); `run_id` the marker value.
pub(crate) fn build(
    parent: &[(String, String)],
    prefix: Option<&Path>,
    extra: &BTreeMap<String, String>,
    run_id: &str,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> =
        parent.iter().filter(|(k, _)| allowed(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    if let Some(prefix) = prefix {
        let bin = prefix.join("bin").display().to_string();
        let lib = prefix.join("lib").display().to_string();
        prepend(&mut env, "PATH", &bin);
        prepend(&mut env, "LD_LIBRARY_PATH", &lib);
    }
    if !env.contains_key("PATH") {
        env.insert("PATH".to_string(), "/usr/local/bin:/usr/bin:/bin".to_string());
    }
    for (k, v) in extra {
        env.insert(k.clone(), v.clone());
    }
    for name in FORBIDDEN {
        env.remove(*name);
    }
    env.insert(RUN_ID_VAR.to_string(), run_id.to_string());
    env
}

fn prepend(env: &mut BTreeMap<String, String>, key: &str, dir: &str) {
    let value = match env.get(key) {
        Some(old) if !old.is_empty() => format!("{dir}:{old}"),
        _ => dir.to_string(),
    };
    env.insert(key.to_string(), value);
}

/// Names in the spec's env maps that payload drops (for a warning).
pub(crate) fn dropped_names(extra: &BTreeMap<String, String>) -> Vec<&str> {
    FORBIDDEN.iter().copied().filter(|n| extra.contains_key(*n)).collect()
}

/// Resolves `program` against `<prefix>/bin` first, then the child's PATH (the `which` crate).
/// Absolute or relative paths with a `/` are taken as they are (they must exist).
pub(crate) fn resolve_program(
    program: &str,
    prefix: Option<&Path>,
    child_path: &str,
) -> Result<std::path::PathBuf, String> {
    if program.contains('/') {
        let path = Path::new(program);
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(format!("{program} does not exist or is not a file"))
        };
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
    if let Some(prefix) = prefix {
        let bin = prefix.join("bin");
        if let Ok(found) = which::which_in(program, Some(&bin), &cwd) {
            return Ok(found);
        }
    }
    which::which_in(program, Some(child_path), &cwd).map_err(|_| match prefix {
        Some(prefix) => format!("`{program}` is neither in {}/bin nor on PATH", prefix.display()),
        None => format!("`{program}` is not on PATH"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent() -> Vec<(String, String)> {
        [
            ("PATH", "/usr/bin:/bin"),
            ("HOME", "/home/u"),
            ("SLURM_JOB_ID", "77"),
            ("DAYTONA_API_KEY", "leak-me-not"),
            ("STANDIN_FAIL_AT_START", "oom"),
            ("VLLM_PORT", "8000"),
            ("LD_LIBRARY_PATH", "/opt/cuda/lib64"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    #[test]
    fn allow_list_prefix_and_marker() {
        let mut extra = BTreeMap::new();
        extra.insert("VLLM_USE_V1".to_string(), "1".to_string());
        extra.insert("VLLM_PORT".to_string(), "9".to_string());
        let env = build(&parent(), Some(Path::new("/envs/otagent")), &extra, "tag-1");
        assert_eq!(env["PATH"], "/envs/otagent/bin:/usr/bin:/bin");
        assert_eq!(env["LD_LIBRARY_PATH"], "/envs/otagent/lib:/opt/cuda/lib64");
        assert_eq!(env["SLURM_JOB_ID"], "77");
        assert_eq!(env["VLLM_USE_V1"], "1");
        assert_eq!(env[RUN_ID_VAR], "tag-1");
        assert!(!env.contains_key("DAYTONA_API_KEY"));
        assert!(!env.contains_key("STANDIN_FAIL_AT_START"));
        assert!(!env.contains_key("VLLM_PORT"));
        assert_eq!(dropped_names(&extra), vec!["VLLM_PORT"]);
    }

    #[test]
    fn no_prefix_keeps_path() {
        let env = build(&parent(), None, &BTreeMap::new(), "x");
        assert_eq!(env["PATH"], "/usr/bin:/bin");
        assert_eq!(env["LD_LIBRARY_PATH"], "/opt/cuda/lib64");
    }

    #[test]
    fn resolves_prefix_bin_before_path() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("env");
        let other = dir.path().join("other");
        for d in [prefix.join("bin"), other.clone()] {
            std::fs::create_dir_all(&d).unwrap();
            let exe = d.join("vllm");
            std::fs::write(&exe, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let path = other.display().to_string();
        assert_eq!(resolve_program("vllm", Some(&prefix), &path).unwrap(), prefix.join("bin/vllm"));
        assert_eq!(resolve_program("vllm", None, &path).unwrap(), other.join("vllm"));
        let err = resolve_program("harbor", Some(&prefix), &path).unwrap_err();
        assert!(err.contains("neither in"), "{err}");
        assert!(resolve_program("/no/such/prog", None, &path).is_err());
    }
}
