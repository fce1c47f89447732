//! The real vLLM's `vllm serve` argument checks as a test oracle (docs/real-programs.md).
//!
//! `scripts/install-vllm.sh` installs the pinned vLLM into a venv outside the clone; this module
//! finds it and drives `tests/vllm_argcheck/argcheck.py` in it: one long-lived Python process
//! (vLLM's import takes tens of seconds here), one JSON request and answer per line.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde::Deserialize;
use serde_json::{Value, json};

/// Where `scripts/install-vllm.sh` puts the verified version's venv unless `EVALCI_VLLM_VENV` says
/// otherwise.
pub(crate) const DEFAULT_VENV: &str = "/var/cache/evalci/vllm-venv";

/// The venv for `version`: the verified version's at `EVALCI_VLLM_VENV` (default [`DEFAULT_VENV`]),
/// any other declared version's at `/var/cache/evalci/vllm-<version>-venv`.
pub(crate) fn venv_dir(version: &str, verified: bool) -> PathBuf {
    match std::env::var_os("EVALCI_VLLM_VENV").filter(|_| verified) {
        Some(dir) => PathBuf::from(dir),
        None if verified => PathBuf::from(DEFAULT_VENV),
        None => PathBuf::from(format!("/var/cache/evalci/vllm-{version}-venv")),
    }
}

/// The venv, when a complete install of `version` is there (its stamp file is written last).
pub fn venv(version: &str, verified: bool) -> Result<PathBuf, String> {
    let dir = venv_dir(version, verified);
    let install = format!("EVALCI_VLLM_VERSION={version} EVALCI_VLLM_VENV={} scripts/install-vllm.sh", dir.display());
    let stamp = dir.join(".evalci-stamp");
    let text = std::fs::read_to_string(&stamp)
        .map_err(|e| format!("no vLLM {version} venv ({}: {e}); run {install}", stamp.display()))?;
    if !text.starts_with(&format!("vllm=={version} ")) {
        return Err(format!("{} holds `{}`, not vLLM {version}; run {install}", dir.display(), text.trim()));
    }
    Ok(dir)
}

/// One answer of the checker.
#[derive(Debug, Clone, Deserialize)]
pub struct Verdict {
    /// The argv's verdict.
    pub ok: bool,
    /// Where the argv failed: `parse`, `validate`, `engine_args`, `api_server` or `checker`.
    #[serde(default)]
    pub stage: Option<String>,
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// What vLLM prints (argparse's usage + error, or the exception line).
    #[serde(default)]
    pub error: Option<String>,
    /// The environment's verdict: vLLM's "Unknown vLLM environment variable detected: …" lines.
    #[serde(default)]
    pub env_error: Option<String>,
    #[serde(default)]
    pub warnings: Vec<String>,
}

impl Verdict {
    /// The error on one line, for a test's failure list.
    pub fn message(&self) -> String {
        let error = self.error.as_deref().unwrap_or("");
        let lines: Vec<&str> = error.lines().filter(|l| !l.starts_with("usage: ")).collect();
        format!("[{}] {}", self.stage.as_deref().unwrap_or("?"), lines.join(" "))
    }
}

/// The running checker process.
pub struct Checker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub version: String,
}

impl Checker {
    /// Starts the checker in `venv` and waits for vLLM to be imported.
    pub fn start(venv: &Path) -> Result<Checker, String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("vllm_argcheck/argcheck.py");
        let mut child = Command::new(venv.join("bin/python"))
            .arg(&script)
            .env("VLLM_TARGET_DEVICE", "cpu")
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("DO_NOT_TRACK", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", script.display()))?;
        let stdin = child.stdin.take().ok_or("checker stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("checker stdout")?);
        let mut checker = Checker { child, stdin, stdout, version: String::new() };
        let ready = checker.read()?;
        checker.version = ready["version"].as_str().unwrap_or_default().to_string();
        Ok(checker)
    }

    fn read(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line).map_err(|e| format!("reading the checker: {e}"))?;
        if line.is_empty() {
            return Err("the vLLM checker exited (run it by hand to see why: tests/vllm_argcheck/argcheck.py)".into());
        }
        serde_json::from_str(&line).map_err(|e| format!("checker answered `{}`: {e}", line.trim()))
    }

    fn ask(&mut self, request: &Value) -> Result<Value, String> {
        writeln!(self.stdin, "{request}").and_then(|_| self.stdin.flush()).map_err(|e| format!("writing: {e}"))?;
        self.read()
    }

    /// vLLM's verdict on `argv` (without the program: `serve <model> …`) and the engine's `env`.
    pub fn check(&mut self, argv: &[String], env: &BTreeMap<String, String>) -> Result<Verdict, String> {
        let answer = self.ask(&json!({"argv": argv, "env": env}))?;
        serde_json::from_value(answer).map_err(|e| format!("checker verdict: {e}"))
    }

    /// The serve parser's options, tool and reasoning parsers (see argcheck.py).
    pub fn options(&mut self) -> Result<Value, String> {
        self.ask(&json!({"options": true}))
    }
}

impl Drop for Checker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
