//! What a run ran (docs/payload.md, "Provenance"): the programs' versions as the job's own
//! environment reports them (its Python's package metadata before the engine starts, else
//! `<program> --version` while the engine loads; bounded), checked against the versions the spec
//! was built for (a disagreement ends the job as `spec` before Harbor runs), and the
//! model revision the engine resolved (the HF cache's `refs/main`, or the local path), recorded in
//! `status.json` and the `provenance` event; sync carries them into every result.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use launch_spec::LaunchSpec;
use launch_spec::records::RunProvenance;
use launch_spec::versions::{self, Program};

use crate::supervisor::ChildSpec;

/// One `--version` may take this long (a Python CLI importing its package on a loaded node).
pub(crate) const VERSION_TIMEOUT: Duration = Duration::from_secs(20);

/// At most this much of a version answer's stdout is kept (a real one is a line or two).
pub(crate) const VERSION_OUTPUT_CAP: u64 = 64 * 1024;

/// How long Harbor's start waits for answers still outstanding at readiness (they were asked when
/// the engine started, normally minutes earlier); what is missing then is recorded as such.
pub(crate) const RECORD_WAIT: Duration = Duration::from_secs(5);

/// At most this much of a dataset is hashed; a larger one is recorded as such.
pub(crate) const DATASET_DIGEST_MAX_BYTES: u64 = 1 << 30;

/// The answers, each a version (or digest) or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Versions {
    pub vllm: Result<String, String>,
    pub harbor: Result<String, String>,
    pub dataset: Result<String, String>,
}

/// What the fast queries answered before the engine was spawned ([`ask_fast`]); `None` where the
/// program has no Python beside it (then `--version` is asked with the rest).
#[derive(Debug, Clone, Default)]
pub(crate) struct Early {
    pub vllm: Option<Result<String, String>>,
    pub harbor: Option<Result<String, String>>,
}

/// The fast queries for both programs at once (package metadata, under a second each).
pub(crate) async fn ask_fast(engine: &ChildSpec, harbor: &ChildSpec) -> Early {
    let (vllm, harbor) = tokio::join!(
        fast_version(&engine.program, &engine.env, Program::Vllm),
        fast_version(&harbor.program, &harbor.env, Program::Harbor)
    );
    Early { vllm, harbor }
}

/// Asks what `early` did not answer (`--version`, with the environments the programs will run
/// with) and hashes the dataset.
pub(crate) async fn probe_versions(engine: &ChildSpec, harbor: &ChildSpec, dataset: PathBuf, early: Early) -> Versions {
    let digest = tokio::task::spawn_blocking(move || dataset_digest(&dataset));
    let ask = |known: Option<Result<String, String>>, child: &ChildSpec| {
        let (program, env) = (child.program.clone(), child.env.clone());
        async move {
            match known {
                Some(Ok(version)) => Ok(version),
                _ => version_of(&program, &env).await,
            }
        }
    };
    let (vllm, harbor) = tokio::join!(ask(early.vllm, engine), ask(early.harbor, harbor));
    let dataset = digest.await.unwrap_or_else(|e| Err(e.to_string()));
    Versions { vllm, harbor, dataset }
}

/// The first disagreement of the answers with what the spec was built for (`spec.declared`), as
/// the one-line message the job ends with (`launch_spec::versions::check_found`).
pub(crate) fn disagreement(spec: &LaunchSpec, vllm: Option<&str>, harbor: Option<&str>) -> Option<String> {
    let declared = spec.declared.as_ref()?;
    [(Program::Vllm, vllm), (Program::Harbor, harbor)]
        .into_iter()
        .filter_map(|(program, found)| found.map(|f| (program, f)))
        .find_map(|(program, found)| versions::check_found(declared, &spec.cluster, program, found).err())
        .map(|d| d.to_string())
}

/// A digest of the task dir's content (`sha1:<hex>`): every entry's relative path in path order,
/// with a regular file's size and bytes and a link's target — the same tasks give the same
/// digest, a changed task another. Bounded by [`DATASET_DIGEST_MAX_BYTES`].
pub(crate) fn dataset_digest(dir: &Path) -> Result<String, String> {
    use sha1::{Digest, Sha1};
    use std::io::Read;
    let mut hasher = Sha1::new();
    let mut budget = DATASET_DIGEST_MAX_BYTES;
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let path = dir.join(&relative);
        let mut entries: Vec<_> = std::fs::read_dir(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        entries.sort();
        // Depth first, in name order: subdirs pushed in reverse so the first pops first.
        let mut subdirs = Vec::new();
        for name in entries {
            let rel = relative.join(&name);
            let full = dir.join(&rel);
            let meta = std::fs::symlink_metadata(&full).map_err(|e| format!("{}: {e}", full.display()))?;
            hasher.update(rel.as_os_str().as_encoded_bytes());
            hasher.update([0]);
            if meta.is_dir() {
                hasher.update(b"dir\0");
                subdirs.push(rel);
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&full).map_err(|e| format!("{}: {e}", full.display()))?;
                hasher.update(b"link\0");
                hasher.update(target.as_os_str().as_encoded_bytes());
            } else if meta.is_file() {
                if meta.len() > budget {
                    return Err(format!(
                        "{} holds more than {DATASET_DIGEST_MAX_BYTES} bytes: not hashed",
                        dir.display()
                    ));
                }
                budget -= meta.len();
                hasher.update(meta.len().to_le_bytes());
                let mut file = std::fs::File::open(&full).map_err(|e| format!("{}: {e}", full.display()))?;
                let mut buf = [0u8; 64 * 1024];
                loop {
                    let n = file.read(&mut buf).map_err(|e| format!("{}: {e}", full.display()))?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buf[..n]);
                }
            }
            hasher.update([0]);
        }
        pending.extend(subdirs.into_iter().rev());
    }
    Ok(format!("sha1:{}", hex::encode(hasher.finalize())))
}

/// The package metadata through the Python beside `program`; `None` when there is none.
async fn fast_version(
    program: &Path,
    env: &BTreeMap<String, String>,
    which: Program,
) -> Option<Result<String, String>> {
    let (python, args) = versions::metadata_query(program, which);
    if !python.is_file() {
        return None;
    }
    Some(answer(&python, &args, env).await)
}

async fn version_of(program: &Path, env: &BTreeMap<String, String>) -> Result<String, String> {
    answer(program, &["--version".to_string()], env).await
}

/// One bounded question: `program args…` in `env` only, its last version line on stdout. Time and
/// output are both bounded (`crate::bounded`): a program that floods stdout is read up to
/// [`VERSION_OUTPUT_CAP`] and killed with its process group, never buffered whole.
async fn answer(program: &Path, args: &[String], env: &BTreeMap<String, String>) -> Result<String, String> {
    let shown = format!("{} {}", program.display(), args.first().map_or("", String::as_str));
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).env_clear().envs(env);
    let out = crate::bounded::run(cmd, VERSION_TIMEOUT, VERSION_OUTPUT_CAP)
        .await
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    let Some(status) = out.status else { return Err(format!("{shown} did not answer within {VERSION_TIMEOUT:?}")) };
    let stdout = String::from_utf8_lossy(&out.stdout);
    match versions::version_line(&stdout) {
        Some(version) if status.success() && !out.truncated => Ok(version),
        _ if out.truncated => {
            Err(format!("{shown}: printed more than {VERSION_OUTPUT_CAP} bytes; not a version answer"))
        }
        _ => Err(format!("{shown}: {status} without a version on stdout")),
    }
}

/// The Hugging Face hub cache the engine reads, from its environment as huggingface_hub resolves it.
pub(crate) fn hub_cache(env: &BTreeMap<String, String>) -> PathBuf {
    let set = |name: &str| env.get(name).filter(|v| !v.is_empty()).cloned();
    if let Some(dir) = set("HF_HUB_CACHE").or_else(|| set("HUGGINGFACE_HUB_CACHE")) {
        return PathBuf::from(dir);
    }
    if let Some(home) = set("HF_HOME") {
        return Path::new(&home).join("hub");
    }
    let cache = set("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(&set("HOME").unwrap_or_else(|| "/".into())).join(".cache"));
    cache.join("huggingface").join("hub")
}

/// The revision the engine serves: the local path, or the commit `refs/main` names in the cache.
pub(crate) fn model_revision(spec: &LaunchSpec, engine_env: &BTreeMap<String, String>) -> Result<String, String> {
    if let Some(path) = &spec.model.local_path {
        return Ok(path.display().to_string());
    }
    // A `ModelId` is never a path (local weights are `local_path`, above).
    let id = &spec.model.hf_id;
    let refs = hub_cache(engine_env).join(format!("models--{}", id.replace('/', "--"))).join("refs").join("main");
    let text = launch_spec::records::read_regular(&refs, 256)
        .map_err(|e| format!("{}: {e} (no cached revision of {id})", refs.display()))?;
    let commit = text.trim();
    if commit.is_empty() || !commit.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!("{}: not a commit id", refs.display()));
    }
    Ok(commit.to_string())
}

/// The record, and for the event the reasons of what is missing.
pub(crate) fn record(revision: Result<String, String>, versions: Versions) -> (RunProvenance, Vec<String>) {
    let mut missing = Vec::new();
    let mut keep = |r: Result<String, String>| r.map_err(|why| missing.push(why)).ok();
    let provenance = RunProvenance {
        model_revision: keep(revision),
        vllm_version: keep(versions.vllm),
        harbor_version: keep(versions.harbor),
        dataset_digest: keep(versions.dataset),
        pool: None,
    };
    (provenance, missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's peak resident memory (VmHWM), in bytes.
    fn peak_rss() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }

    #[tokio::test]
    async fn a_version_probe_that_floods_stdout_is_read_to_a_cap_and_refused() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("flood");
        // 600 MiB on stdout, then a version line: buffered whole, the probe would hold all of it.
        std::fs::write(&program, "#!/bin/sh\nhead -c 629145600 /dev/zero\necho 1.2.3\n").unwrap();
        std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let before = peak_rss();
        let env = BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
        let answer = version_of(&program, &env).await;
        let grown = peak_rss().saturating_sub(before);
        assert!(grown < 128 << 20, "the probe grew the process by {} MiB", grown >> 20);
        let error = answer.unwrap_err();
        assert!(error.contains("printed more than"), "{error}");
    }

    #[test]
    fn the_dataset_digest_follows_the_tasks_content() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("t1/tests")).unwrap();
        std::fs::write(dir.path().join("t1/instruction.md"), "do it").unwrap();
        std::fs::write(dir.path().join("t1/tests/test.sh"), "exit 0").unwrap();
        let first = dataset_digest(dir.path()).unwrap();
        assert!(first.starts_with("sha1:") && first.len() == 45, "{first}");
        assert_eq!(dataset_digest(dir.path()).unwrap(), first, "deterministic");
        std::fs::write(dir.path().join("t1/tests/test.sh"), "exit 1").unwrap();
        assert_ne!(dataset_digest(dir.path()).unwrap(), first, "a changed task");
        assert!(dataset_digest(&dir.path().join("absent")).is_err());
    }

    #[test]
    fn the_revision_is_refs_main_of_the_engines_cache_or_the_local_path() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = launch_spec::testkit::unit_spec();
        spec.model.hf_id = launch_spec::ModelId::new("org/M-8B").unwrap();
        let env: BTreeMap<String, String> = [("HF_HUB_CACHE".to_string(), dir.path().display().to_string())].into();
        assert!(model_revision(&spec, &env).unwrap_err().contains("no cached revision of org/M-8B"));
        let refs = dir.path().join("models--org--M-8B/refs");
        std::fs::create_dir_all(&refs).unwrap();
        std::fs::write(refs.join("main"), "0123abcd\n").unwrap();
        assert_eq!(model_revision(&spec, &env).unwrap(), "0123abcd");
        let home: BTreeMap<String, String> = [("HF_HOME".to_string(), "/h".to_string())].into();
        assert_eq!(hub_cache(&home), Path::new("/h/hub"));
        spec.model.local_path = Some("/weights/m".into());
        assert_eq!(model_revision(&spec, &env).unwrap(), "/weights/m");
    }
}
