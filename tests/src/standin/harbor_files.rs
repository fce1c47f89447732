//! How the Harbor stand-in writes Harbor's job and trial JSON files: with the names of
//! `launch_spec::rundir::harbor` (the product's one owner of the run-dir format), and every file it
//! writes read back through the product's typed model of that file. The stand-in keeps Harbor's
//! full JSON (the rundir models are partial: they hold only what verification reads, so they cannot
//! write what Harbor writes; the full shape is checked against the real Harbor by
//! `tests/harbor_contract.rs`); the read-back makes sure the product reads every stand-in file as
//! it reads the real Harbor's. A file that does not read stops the stand-in with exit 70 and the
//! parser's message, so a test never passes on a file the product would have dropped.

use std::path::Path;

use launch_spec::rundir::harbor::{self, JobConfig, JobLock, JobResult, TrialResult};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::common as c;

/// Which of Harbor's files a document is, and so which model it must read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doc {
    JobConfig,
    JobResult,
    JobLock,
    /// A trial's `config.json` and `lock.json`: verification reads neither's fields (it looks only
    /// for `api_base` in the config), so they only have to be JSON objects.
    TrialConfig,
    TrialLock,
    TrialResult,
}

impl Doc {
    pub fn file_name(self) -> &'static str {
        match self {
            Doc::JobConfig | Doc::TrialConfig => harbor::CONFIG_FILE,
            Doc::JobResult | Doc::TrialResult => harbor::RESULT_FILE,
            Doc::JobLock | Doc::TrialLock => harbor::LOCK_FILE,
        }
    }

    /// Reads the written file back as the product does ([`harbor::read`]).
    fn read_back(self, path: &Path) -> Result<(), String> {
        fn as_model<T: DeserializeOwned>(path: &Path) -> Result<(), String> {
            match harbor::read::<T>(path)? {
                Some(_) => Ok(()),
                None => Err("the file is not there".into()),
            }
        }
        match self {
            Doc::JobConfig => as_model::<JobConfig>(path),
            Doc::JobResult => as_model::<JobResult>(path),
            Doc::JobLock => as_model::<JobLock>(path),
            Doc::TrialResult => as_model::<TrialResult>(path),
            Doc::TrialConfig | Doc::TrialLock => as_model::<serde_json::Map<String, Value>>(path),
        }
    }
}

/// Writes `doc` into `dir` under its Harbor name, 4-space indented as Harbor's pydantic dump
/// (`atomic`: through a temporary file and a rename, as Harbor writes the job `result.json`), then
/// reads it back through its model. An I/O error is ignored, as before (a full disk shows in the
/// test that caused it); a file the product's model does not read ends the stand-in.
pub fn write(dir: &Path, which: Doc, doc: &Value, atomic: bool) {
    let path = dir.join(which.file_name());
    let text = c::json_pretty4(doc);
    let written = if atomic { c::write_atomic(&path, &text) } else { std::fs::write(&path, &text) };
    if written.is_err() {
        return;
    }
    if let Err(e) = which.read_back(&path) {
        eprintln!(
            "harbor-standin: {} does not read as the product's model of Harbor's {which:?}: {e} \
             (the stand-in drifted from launch_spec::rundir::harbor)",
            path.display()
        );
        std::process::exit(70);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_back_refuses_what_the_model_cannot_read() {
        let dir = tempfile::tempdir().unwrap();
        let ok = serde_json::json!({"exception_info": {"exception_type": "CancelledError"}, "extra": [1]});
        std::fs::write(dir.path().join("result.json"), c::json_pretty4(&ok)).unwrap();
        assert_eq!(Doc::TrialResult.read_back(&dir.path().join("result.json")), Ok(()));
        // A type the product's model does not read: the exception type as a number.
        let bad = serde_json::json!({"exception_info": {"exception_type": 7}});
        std::fs::write(dir.path().join("result.json"), c::json_pretty4(&bad)).unwrap();
        assert!(Doc::TrialResult.read_back(&dir.path().join("result.json")).is_err());
        assert!(Doc::TrialLock.read_back(&dir.path().join("lock.json")).is_err(), "absent");
    }
}
