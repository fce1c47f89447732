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

/// Makes `<prefix>` an environment whose Python holds `venv`'s packages (its `pyvenv.cfg`, its
/// `lib`, and `bin/python` as the venv's interpreter), beside whatever [`link_programs`] put in
/// `bin/`: the package metadata then says what the venv holds (e.g. the real vLLM 0.16.0's), as a
/// site's conda env does, while `bin/vllm` is the stand-in.
pub fn python_of(prefix: &Path, venv: &Path) {
    let bin = prefix.join("bin");
    std::fs::create_dir_all(&bin).expect("create <prefix>/bin");
    std::fs::copy(venv.join("pyvenv.cfg"), prefix.join("pyvenv.cfg")).expect("copy the venv's pyvenv.cfg");
    std::os::unix::fs::symlink(venv.join("lib"), prefix.join("lib")).expect("link the venv's lib");
    let python = std::fs::canonicalize(venv.join("bin/python")).expect("the venv's python");
    std::os::unix::fs::symlink(python, bin.join("python")).expect("link the venv's python");
}

/// A Harbor 0.25 task dir `<dataset>/<name>` (what `harbor jobs start -p` reads): the agent is told
/// to write `answer` to `/app/answer.txt` (the vLLM stand-in's `STANDIN_CHAT_AGENT=terminus` runs the
/// `STANDIN-COMMAND:` line); the verifier (`tests/test.sh`) gives 1 when the file holds `word`, else 0.
/// `extra_toml` is appended to `task.toml`.
pub fn harbor_task(dataset: &Path, name: &str, word: &str, answer: &str, extra_toml: &str) {
    let dir = dataset.join(name);
    std::fs::create_dir_all(dir.join("tests")).expect("create the task's tests/");
    std::fs::create_dir_all(dir.join("environment")).expect("create the task's environment/");
    let toml = format!(
        "schema_version = \"1.4\"\n[metadata]\n[agent]\ntimeout_sec = 300.0\n[verifier]\ntimeout_sec = 120.0\n[environment]\nbuild_timeout_sec = 60.0\n{extra_toml}"
    );
    std::fs::write(dir.join("task.toml"), toml).expect("write task.toml");
    let instruction =
        format!("Write the word {word} to /app/answer.txt.\n\nSTANDIN-COMMAND: echo {answer} > /app/answer.txt\n");
    std::fs::write(dir.join("instruction.md"), instruction).expect("write instruction.md");
    let test = format!(
        "#!/bin/bash\nif [ \"$(cat /app/answer.txt 2>/dev/null)\" = \"{word}\" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
    );
    std::fs::write(dir.join("tests/test.sh"), test).expect("write tests/test.sh");
    // Never built: the host environment runs the trial where Harbor runs.
    std::fs::write(dir.join("environment/Dockerfile"), "FROM debian:trixie-slim\n").expect("write the Dockerfile");
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
