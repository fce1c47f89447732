//! The per-job scratch directory on node-local disk (docs/site.md): caches that must not land in
//! `$HOME` or on a shared file system (TMPDIR, Triton, Inductor, vLLM's torch.compile cache) point
//! into it through `{job_scratch}` in the spec's `serve.env` / `harbor.env` values. payload
//! creates it (mode 0700) before the first child, and removes it after the last one is gone.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use launch_spec::LaunchSpec;
use launch_spec::launch::JOB_SCRATCH_PLACEHOLDER;

/// The scratch directory of one job; removed on drop.
#[derive(Debug)]
pub struct JobScratch {
    dir: PathBuf,
}

/// Whether any env value of the spec names the scratch directory.
pub fn wanted(spec: &LaunchSpec) -> bool {
    spec.serve.env.values().chain(spec.harbor.env.values()).any(|v| v.contains(JOB_SCRATCH_PLACEHOLDER))
}

impl JobScratch {
    /// `<root>/eval_<job>`: root from the spec (default `/tmp`), job = the Slurm job id (else the
    /// run id). A leftover from an earlier attempt with the same id is emptied first.
    pub fn create(spec: &LaunchSpec, job: &str) -> Result<JobScratch, String> {
        let root = spec.scratch.as_ref().map_or_else(|| PathBuf::from("/tmp"), |s| s.root.clone());
        let safe: String = job.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        let dir = root.join(format!("eval_{safe}"));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| format!("cannot clear {}: {e}", dir.display()))?;
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot create the job's scratch dir {}: {e} (paths.node_scratch)", dir.display()))?;
        Ok(JobScratch { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Replaces `{job_scratch}` in `env`'s values and creates each directory a value names under it.
    pub fn apply(&self, env: &mut BTreeMap<String, String>) -> Result<(), String> {
        let dir = self.dir.display().to_string();
        for value in env.values_mut().filter(|v| v.contains(JOB_SCRATCH_PLACEHOLDER)) {
            *value = value.replace(JOB_SCRATCH_PLACEHOLDER, &dir);
            let path = Path::new(value.as_str());
            if path.starts_with(&self.dir) && path != self.dir {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(path)
                    .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
            }
        }
        Ok(())
    }

    /// Removes the directory now (also done on drop).
    pub fn remove(self) {}
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
        let mut spec = crate::testutil::spec();
        spec.scratch = Some(launch_spec::launch::ScratchSpec { root: root.path().to_path_buf() });
        spec.serve.env.insert("TRITON_CACHE_DIR".into(), "{job_scratch}/triton".into());
        assert!(wanted(&spec));
        let scratch = JobScratch::create(&spec, "4242").unwrap();
        let dir = scratch.dir().to_path_buf();
        assert_eq!(dir, root.path().join("eval_4242"));
        let mut env = spec.serve.env.clone();
        env.insert("PLAIN".into(), "x".into());
        scratch.apply(&mut env).unwrap();
        assert_eq!(env["TRITON_CACHE_DIR"], format!("{}/triton", dir.display()));
        assert_eq!(env["PLAIN"], "x");
        assert!(dir.join("triton").is_dir());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::write(dir.join("triton/kernel.bin"), b"x").unwrap();
        scratch.remove();
        assert!(!dir.exists(), "removed with its contents");
    }
}
