//! The on-disk world a spec points at: an environment prefix whose `bin/` links to the programs
//! under test, a dataset of Harbor task dirs, a 0600 secrets file.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// `<prefix>/bin/<name>` → `target` for each pair (e.g. `vllm` → the vLLM stand-in).
pub fn link_programs(prefix: &Path, programs: &[(&str, &Path)]) {
    let bin = prefix.join("bin");
    std::fs::create_dir_all(&bin).expect("create <prefix>/bin");
    for (name, target) in programs {
        std::os::unix::fs::symlink(target, bin.join(name)).expect("link a program into <prefix>/bin");
    }
}

/// A secrets file (`NAME=value` lines) with `mode` (payload refuses anything but 0600).
pub fn write_secrets(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).expect("write the secrets file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod the secrets file");
}

/// One Harbor task dir per name under `dataset`, with `instruction.md` and, when given, the
/// `reward` file the Harbor stand-in scores the trial with.
pub fn write_tasks<S: AsRef<str>>(
    dataset: &Path,
    names: impl IntoIterator<Item = S>,
    instruction: impl Fn(&str) -> String,
    reward: Option<&str>,
) {
    for name in names {
        let dir = dataset.join(name.as_ref());
        std::fs::create_dir_all(&dir).expect("create a task dir");
        std::fs::write(dir.join("instruction.md"), instruction(name.as_ref())).expect("write instruction.md");
        if let Some(reward) = reward {
            std::fs::write(dir.join("reward"), reward).expect("write reward");
        }
    }
}

/// The end-to-end tests' dataset: `task-0` … `task-<n-1>`, each "Solve task N." with reward 1.0.
pub fn standin_tasks(dataset: &Path, n: usize) {
    let solve = |task: &str| format!("Solve task {}.\n", task.trim_start_matches("task-"));
    write_tasks(dataset, (0..n).map(|t| format!("task-{t}")), solve, Some("1.0\n"));
}
