//! `submitter completions <shell>` and `payload completions <shell>` (clap_complete): generated for
//! bash, zsh and fish, naming the subcommands; the bash script passes `bash -n` (issue 36).

use std::process::Command;

use crate::support::SUBMITTER;

#[test]
fn completions_are_generated_for_bash_zsh_and_fish_and_bash_parses_them() {
    let payload = crate::fresh::bin("payload", "payload");
    let dir = tempfile::tempdir().unwrap();
    for (program, path, subcommand) in
        [("submitter", std::path::PathBuf::from(SUBMITTER), "unevaluated"), ("payload", payload, "gpus")]
    {
        for shell in ["bash", "zsh", "fish"] {
            let out = Command::new(&path).args(["completions", shell]).output().unwrap();
            assert!(out.status.success(), "{program} {shell}: {}", String::from_utf8_lossy(&out.stderr));
            let script = String::from_utf8(out.stdout).unwrap();
            assert!(script.contains(program) && script.contains(subcommand), "{program} {shell}: {script:.300}");
            if shell == "bash" {
                let file = dir.path().join(format!("{program}.bash"));
                std::fs::write(&file, &script).unwrap();
                let check = Command::new("bash").arg("-n").arg(&file).output().unwrap();
                assert!(check.status.success(), "bash -n {program}: {}", String::from_utf8_lossy(&check.stderr));
            }
        }
    }
    let bad = Command::new(SUBMITTER).args(["completions", "tcsh"]).output().unwrap();
    assert!(!bad.status.success(), "an unknown shell is refused");
}

/// `submitter man --out DIR` and `payload man --out DIR` (clap_mangen; scripts/release runs them):
/// one roff page per command and subcommand, each naming its flags; `man` reads them when present.
#[test]
fn man_pages_are_written_for_every_subcommand() {
    let payload = crate::fresh::bin("payload", "payload");
    let dir = tempfile::tempdir().unwrap();
    for (path, pages) in [
        (std::path::PathBuf::from(SUBMITTER), &["submitter.1", "submitter-plan.1", "submitter-hold.1"][..]),
        (payload, &["payload.1", "payload-run.1"][..]),
    ] {
        let out = Command::new(&path).args(["man", "--out"]).arg(dir.path()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for page in pages {
            let text = std::fs::read_to_string(dir.path().join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
            assert!(text.starts_with(".ie \\n(.g .ds Aq") || text.contains(".TH "), "{page} is roff: {text:.200}");
        }
    }
    let plan = std::fs::read_to_string(dir.path().join("submitter-plan.1")).unwrap();
    assert!(plan.contains("verbose") && plan.contains("offline"), "the page names plan's flags: {plan:.2000}");
    assert!(!dir.path().join("submitter-man.1").exists(), "the hidden generator has no page of its own");
    if Command::new("man").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let shown =
            Command::new("man").arg("-l").arg(dir.path().join("submitter.1")).env("MANPAGER", "cat").output().unwrap();
        assert!(
            String::from_utf8_lossy(&shown.stdout).contains("submitter"),
            "{}",
            String::from_utf8_lossy(&shown.stderr)
        );
    }
}

/// `RUST_LOG` is honoured as `SUBMITTER_LOG` is, and `SUBMITTER_LOG` wins when both are set.
#[test]
fn rust_log_is_honoured_and_the_programs_own_variable_wins() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let run = |vars: &[(&str, &str)]| {
        let mut command = Command::new(SUBMITTER);
        command.args(["results", "--cluster", "local", "--state-dir"]).arg(&state);
        command
            .env("SUBMITTER_HOME", crate::support::workspace_root())
            .env_remove("RUST_LOG")
            .env_remove("SUBMITTER_LOG");
        let out = command.envs(vars.iter().copied()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run(&[]).is_empty(), "quiet by default");
    let debug = run(&[("RUST_LOG", "debug")]);
    assert!(debug.contains("DEBUG"), "RUST_LOG=debug: {debug}");
    assert!(run(&[("RUST_LOG", "debug"), ("SUBMITTER_LOG", "error")]).is_empty(), "SUBMITTER_LOG wins");
}

/// Colour only on a terminal and never in files (issue 36): `submitter`'s warnings into a pipe carry
/// no escape codes (on main they did); `payload` logs JSON lines into a file (the job's Slurm
/// output) and human lines on a terminal (`script` gives it one), coloured unless `NO_COLOR`.
#[test]
fn logs_are_plain_in_files_and_human_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("spec.json");
    let out = Command::new(SUBMITTER)
        .args(["spec", "--cluster", "local", "--preset", "tb2", "--model", "test/Tiny-1B", "--out"])
        .arg(&spec)
        .env("SUBMITTER_HOME", crate::support::workspace_root())
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    let warned = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && warned.contains("WARN"), "{warned}");
    assert!(!warned.contains('\u{1b}'), "escape codes in a pipe: {warned:?}");
    // The run fails fast (its dataset is not staged) after its first log line; its run dir is ours.
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&spec).unwrap()).unwrap();
    json["run_dir"] = serde_json::json!(dir.path().join("run"));
    std::fs::write(&spec, json.to_string()).unwrap();
    let payload = crate::fresh::bin("payload", "payload");
    let piped = Command::new(&payload).args(["run", "--spec"]).arg(&spec).env_remove("NO_COLOR").output().unwrap();
    let logged = String::from_utf8_lossy(&piped.stderr);
    let first = logged.lines().find(|l| l.contains("payload run starting")).unwrap_or_else(|| panic!("{logged}"));
    assert!(serde_json::from_str::<serde_json::Value>(first).is_ok(), "JSON into a file: {first}");
    if Command::new("script").arg("--version").output().is_err() {
        return;
    }
    let argv = shell_words::join([payload.to_str().unwrap(), "run", "--spec", spec.to_str().unwrap()]);
    let on_terminal = |no_color: bool| {
        let mut command = Command::new("script");
        command.args(["-qec", &argv, "/dev/null"]).env_remove("NO_COLOR");
        if no_color {
            command.env("NO_COLOR", "1");
        }
        String::from_utf8_lossy(&command.output().unwrap().stdout).into_owned()
    };
    let shown = on_terminal(false);
    let line = shown.lines().find(|l| l.contains("payload run starting")).unwrap_or_else(|| panic!("{shown}"));
    assert!(!line.trim_start().starts_with('{') && line.contains("INFO"), "human on a terminal: {line}");
    assert!(line.contains('\u{1b}'), "coloured on a terminal: {line:?}");
    let plain = on_terminal(true);
    assert!(plain.contains("payload run starting") && !plain.contains('\u{1b}'), "NO_COLOR: {plain:?}");
}
