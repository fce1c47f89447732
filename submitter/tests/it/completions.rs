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
