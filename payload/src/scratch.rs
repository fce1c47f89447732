//! The per-job scratch directory on node-local disk (docs/site.md): caches that must not land in
//! `$HOME` or on a shared file system (TMPDIR, Triton, Inductor, vLLM's torch.compile cache) point
//! into it through `{job_scratch}` in the spec's `serve.env` / `harbor.env` values. payload
//! creates it (mode 0700) before the first child, and removes it after the last one is gone.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use launch_spec::LaunchSpec;
use launch_spec::placeholder::{self as ph, JOB_SCRATCH};

/// The scratch directory of one job; removed on drop.
#[derive(Debug)]
pub(crate) struct JobScratch {
    dir: PathBuf,
}

/// Whether any env value of the spec names the scratch directory.
pub(crate) fn wanted(spec: &LaunchSpec) -> bool {
    spec.serve.env.values().chain(spec.harbor.env.values()).any(|v| ph::mentions(v, JOB_SCRATCH))
}

/// The job's scratch directory, when the spec wants one: `<root>/eval_<job>`, root from the spec
/// (default `/tmp`), job = the Slurm job id (else payload's pid). Pure: nothing is created.
pub(crate) fn dir(spec: &LaunchSpec, job: &str) -> Option<PathBuf> {
    if !wanted(spec) {
        return None;
    }
    let root = spec.scratch.as_ref().map_or_else(|| PathBuf::from("/tmp"), |s| s.root.clone());
    let safe: String = job.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    Some(root.join(format!("eval_{safe}")))
}

/// Replaces `{job_scratch}` in `env`'s values with `dir`; returns the directories those values
/// name inside it (created by [`JobScratch::create`]). Pure.
pub(crate) fn substitute(dir: &Path, env: &mut BTreeMap<String, String>) -> Vec<PathBuf> {
    let text = dir.display().to_string();
    let mut inside = Vec::new();
    for value in env.values_mut().filter(|v| ph::mentions(v, JOB_SCRATCH)) {
        *value = ph::substitute(value, &[(JOB_SCRATCH, &text)]);
        let path = PathBuf::from(value.as_str());
        if path.starts_with(dir) && path != dir && !inside.contains(&path) {
            inside.push(path);
        }
    }
    inside
}

impl JobScratch {
    /// Creates `dir` (mode 0700; a leftover of an earlier attempt with the same id is emptied
    /// first) and the directories inside it.
    pub(crate) fn create(dir: &Path, inside: &[PathBuf]) -> Result<JobScratch, String> {
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| format!("cannot clear {}: {e}", dir.display()))?;
        }
        let mkdir = |path: &Path| {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path).map_err(|e| {
                format!("cannot create the job's scratch dir {}: {e} (paths.node_scratch)", path.display())
            })
        };
        mkdir(dir)?;
        let scratch = JobScratch { dir: dir.to_path_buf() };
        for path in inside {
            mkdir(path)?;
        }
        Ok(scratch)
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Removes the directory now (also done on drop).
    pub(crate) fn remove(self) {}
}

impl Drop for JobScratch {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_dir_all(&self.dir)
            && err.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), error = %err, "cannot remove the job's scratch dir");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_private_dirs_removed_at_the_end() {
        let root = tempfile::tempdir().unwrap();
        let mut spec = launch_spec::testkit::unit_spec();
        assert_eq!(dir(&spec, "4242"), None, "no placeholder, no scratch dir");
        spec.scratch = Some(launch_spec::spec::ScratchSpec { root: root.path().to_path_buf() });
        spec.serve.env.insert("TRITON_CACHE_DIR".into(), "{job_scratch}/triton".into());
        let at = dir(&spec, "4242").unwrap();
        assert_eq!(at, root.path().join("eval_4242"));
        let mut env = spec.serve.env.clone();
        env.insert("PLAIN".into(), "x".into());
        let inside = substitute(&at, &mut env);
        assert_eq!(env["TRITON_CACHE_DIR"], format!("{}/triton", at.display()));
        assert_eq!(env["PLAIN"], "x");
        assert!(!at.exists(), "substitute creates nothing");
        let scratch = JobScratch::create(&at, &inside).unwrap();
        assert!(at.join("triton").is_dir());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&at).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::write(at.join("triton/kernel.bin"), b"x").unwrap();
        assert_eq!(scratch.dir(), at);
        scratch.remove();
        assert!(!at.exists(), "removed with its contents");
    }
}
