//! Staging on the login node (docs/site.md): models into the profile's HF cache, datasets into
//! their dataset dir, before anything is submitted — compute nodes may have no internet, and a job
//! that finds no weights fails only after its queue wait.
//!
//! The download itself is the profile's command (default: huggingface_hub's `hf download`), an
//! argv with placeholders, so a site can swap it. Each model is staged once per iteration
//! whatever the number of preset legs; each dataset under an exclusive lock on `<dir>.lock`, into
//! `<dir>.partial` renamed into place, so two submitters never race and a half-written dataset
//! is never taken for a staged one.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use wait_timeout::ChildExt;

use launch_spec::placeholder as ph;

use crate::config::cluster::PreDownload;
use crate::spec_build::SpecBuilder;

/// Stages what one `launch` iteration needs; remembers each model's outcome for the iteration.
pub(crate) struct Stager<'a> {
    context: &'a SpecBuilder<'a>,
    settings: &'a PreDownload,
    models: RefCell<HashMap<String, Result<(), String>>>,
    /// `launch --dry-run`: download and write nothing; say what would be staged, and how big it
    /// is by the download command's own dry run (`hf download --dry-run` asks the Hub for sizes).
    dry_run: bool,
}

impl<'a> Stager<'a> {
    pub(crate) fn new(context: &'a SpecBuilder<'a>) -> Self {
        Stager {
            context,
            settings: &context.cluster().pre_download,
            models: RefCell::new(HashMap::new()),
            dry_run: false,
        }
    }

    /// A stager for `launch --dry-run` (see [`Stager::dry_run`]).
    pub(crate) fn dry(context: &'a SpecBuilder<'a>) -> Self {
        Stager { dry_run: true, ..Stager::new(context) }
    }

    pub(crate) fn is_dry(&self) -> bool {
        self.dry_run
    }

    /// Whether staging would fetch `model` (enabled and not yet in the cache).
    pub(crate) fn would_stage_model(&self, model: &str) -> bool {
        self.settings.enabled
            && self
                .context
                .hf_cache()
                .ok()
                .flatten()
                .is_none_or(|cache| crate::readiness::hf_snapshot(&cache, model).is_none())
    }

    /// Stages `model` into the profile's cache (once per iteration; later calls return the first
    /// outcome). Nothing to do when the profile does not stage models.
    pub(crate) fn model(&self, model: &str) -> Result<(), String> {
        if !self.settings.enabled {
            return Ok(());
        }
        if let Some(done) = self.models.borrow().get(model) {
            return done.clone();
        }
        let outcome = self.stage_model(model);
        self.models.borrow_mut().insert(model.to_string(), outcome.clone());
        outcome
    }

    fn stage_model(&self, model: &str) -> Result<(), String> {
        let cache = self
            .context
            .hf_cache()
            .map_err(|e| e.to_string())?
            .ok_or("pre_download.enabled but the profile has no paths.hf_cache")?;
        let cache_text = cache.display().to_string();
        let argv =
            self.argv("pre_download.command", &self.settings.command, &[(ph::MODEL, model), (ph::CACHE, &cache_text)])?;
        if self.dry_run {
            if let Some(snapshot) = crate::readiness::hf_snapshot(&cache, model) {
                progress(&format!(
                    "dry run: model {model} is already in {} ({})",
                    snapshot.display(),
                    tree_size(&snapshot)
                ));
            } else {
                let size = dry_size(&argv, &[("HF_HUB_CACHE", &cache_text)]);
                progress(&format!("dry run: would stage model {model} into {cache_text}: {size}"));
            }
            return Ok(());
        }
        std::fs::create_dir_all(&cache).map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
        run(
            &argv,
            Duration::from_secs(self.settings.timeout_s),
            &format!("model {model}"),
            &[("HF_HUB_CACHE", &cache_text)],
        )
        .map(drop)
    }

    /// Makes sure `dir` holds `dataset` (a repo id), staging it under the lock when it does not.
    /// An absolute `dataset` is a local directory: never staged (preflight checks it exists).
    pub(crate) fn dataset(&self, dataset: &str, dir: &Path) -> Result<(), String> {
        if Path::new(dataset).is_absolute() || dir.is_dir() {
            return Ok(());
        }
        if self.settings.dataset_command.first().is_none_or(String::is_empty) {
            return Err(format!(
                "{} does not exist and the profile has no pre_download.dataset_command to stage {dataset}",
                dir.display()
            ));
        }
        if self.dry_run {
            let dir_text = dir.display().to_string();
            let argv = self.argv(
                "pre_download.dataset_command",
                &self.settings.dataset_command,
                &[(ph::DATASET, dataset), (ph::DIR, &dir_text)],
            )?;
            progress(&format!("dry run: would stage dataset {dataset} into {dir_text}: {}", dry_size(&argv, &[])));
            return Ok(());
        }
        let parent = dir.parent().ok_or_else(|| format!("{} has no parent directory", dir.display()))?;
        std::fs::create_dir_all(parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        let lock_path = with_suffix(dir, ".lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?;
        progress(&format!("staging dataset {dataset}: waiting for {}", lock_path.display()));
        lock.lock().map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
        // Another submitter may have staged it while we waited.
        if dir.is_dir() {
            return Ok(());
        }
        let partial = with_suffix(dir, ".partial");
        if partial.exists() {
            std::fs::remove_dir_all(&partial)
                .map_err(|e| format!("cannot remove the leftover {}: {e}", partial.display()))?;
        }
        let partial_text = partial.display().to_string();
        let argv = self.argv(
            "pre_download.dataset_command",
            &self.settings.dataset_command,
            &[(ph::DATASET, dataset), (ph::DIR, &partial_text)],
        )?;
        let staged =
            run(&argv, Duration::from_secs(self.settings.dataset_timeout_s), &format!("dataset {dataset}"), &[])
                .and_then(|_| {
                    if partial.is_dir() {
                        std::fs::rename(&partial, dir)
                            .map_err(|e| format!("cannot move it into {}: {e}", dir.display()))
                    } else {
                        Err(format!("`{}` succeeded but wrote nothing to {}", argv[0], partial.display()))
                    }
                });
        if staged.is_err() {
            let _ = std::fs::remove_dir_all(&partial);
        }
        drop(lock);
        staged
    }

    /// The profile's command with `${VAR}` expanded, then the placeholders substituted (the profile
    /// refused any other at load: launch_spec::placeholder).
    fn argv(&self, field: &str, command: &[String], with: &[(&str, &str)]) -> Result<Vec<String>, String> {
        let argv = command
            .iter()
            .enumerate()
            .map(|(i, arg)| {
                let arg = self.context.expand_text(&format!("{field}[{i}]"), arg).map_err(|e| e.to_string())?;
                Ok(ph::substitute(&arg, with))
            })
            .collect::<Result<Vec<_>, String>>()?;
        if argv.first().is_none_or(String::is_empty) {
            return Err(format!("{field} is empty"));
        }
        Ok(argv)
    }
}

/// A progress line on stderr, beside the download tool's own progress (which goes there too):
/// staging runs at the operator's terminal or in the listener's log, and stdout is the command's
/// result (a table or a JSON document).
#[allow(clippy::print_stderr)]
fn progress(line: &str) {
    eprintln!("{line}");
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut text = path.as_os_str().to_owned();
    text.push(suffix);
    PathBuf::from(text)
}

/// How big a staging would be, by the command's own dry run: `hf download … --dry-run`
/// (huggingface_hub lists the files and sizes from the Hub and writes nothing). Another command
/// has no dry run we know of: it is not run.
fn dry_size(argv: &[String], env: &[(&str, &str)]) -> String {
    let program = Path::new(&argv[0]).file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if !(program == "hf" && argv.get(1).is_some_and(|a| a == "download")) {
        return format!("`{}` (size unknown: only `hf download` has a dry run)", shell_words::join(argv));
    }
    let mut dry = argv.to_vec();
    dry.push("--dry-run".to_string());
    match run(&dry, Duration::from_secs(120), "dry run", env) {
        Ok(summary) => format!("`{}` — {summary}", shell_words::join(argv)),
        Err(why) => format!("`{}` (size unknown: {why})", shell_words::join(argv)),
    }
}

/// Bytes under `dir`, following the cache's symlinks into its blobs, as `12.3 GB`.
fn tree_size(dir: &Path) -> String {
    fn bytes(path: &Path) -> u64 {
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => {
                std::fs::read_dir(path).into_iter().flatten().flatten().map(|e| bytes(&e.path())).sum()
            }
            Ok(meta) => meta.len(),
            Err(_) => 0,
        }
    }
    format!("{:.1} GB", bytes(dir) as f64 / 1e9)
}

/// Runs a staging command in its own process group, its output (progress) copied to our stderr,
/// ended (TERM, then KILL) at `timeout`. Returns the command's last line; the error says why in
/// one line: the command's last line.
fn run(argv: &[String], timeout: Duration, what: &str, env: &[(&str, &str)]) -> Result<String, String> {
    progress(&format!("staging {what}: {} (timeout {} s)", shell_words::join(argv), timeout.as_secs()));
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run `{}`: {e}", argv[0]))?;
    let copy = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut tail = Vec::new();
            let Some(mut pipe) = pipe else { return tail };
            let mut buf = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let _ = std::io::stderr().write_all(&buf[..n]);
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 16384 {
                    tail.drain(..tail.len() - 8192);
                }
            }
            tail
        })
    };
    let out = copy(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err = copy(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    let waiting = |e: std::io::Error| format!("waiting for `{}`: {e}", argv[0]);
    let mut timed_out = false;
    let status = match child.wait_timeout(timeout).map_err(waiting)? {
        Some(status) => status,
        None => {
            // TERM lets the download tool clean up its partial files; KILL after a short grace.
            timed_out = true;
            let _ = killpg(pgid, Signal::SIGTERM);
            match child.wait_timeout(Duration::from_secs(5)).map_err(waiting)? {
                Some(status) => status,
                None => {
                    let _ = killpg(pgid, Signal::SIGKILL);
                    child.wait().map_err(waiting)?
                }
            }
        }
    };
    // The leader is reaped; anything left of its group goes too (no orphan holds our pipes).
    let _ = killpg(pgid, Signal::SIGKILL);
    let mut tail = out.join().unwrap_or_default();
    tail.extend(err.join().unwrap_or_default());
    if timed_out {
        return Err(format!("`{}` did not finish within {} s (pre_download timeout)", argv[0], timeout.as_secs()));
    }
    if status.success() {
        return Ok(last_line(&tail));
    }
    Err(format!("`{}` failed ({status}): {}", argv[0], last_line(&tail)))
}

/// The last non-empty line of a program's output, without terminal colours.
fn last_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let ansi = regex::Regex::new("\x1b\\[[0-9;]*[A-Za-z]").expect("static regex");
    let text = ansi.replace_all(&text, "");
    let lines: Vec<&str> = text.split(['\n', '\r']).map(str::trim).filter(|l| !l.is_empty()).collect();
    // huggingface_hub's CLI ends a failure with a hint line; the error is the line before it.
    let line = match lines.as_slice() {
        [.., error, hint] if hint.starts_with("Hint:") => error,
        [.., last] => last,
        [] => "no output",
    };
    line.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn the_error_line_skips_hints_and_colours() {
        let out = b"\x1b[1m\x1b[31mError: Local entry not found.\x1b[0m\n\x1b[90mHint: set HF_DEBUG=1\x1b[0m\n";
        assert_eq!(last_line(out), "Error: Local entry not found.");
        assert_eq!(last_line(b"50%\r100%\r\n"), "100%");
        assert_eq!(last_line(b""), "no output");
    }

    #[test]
    fn a_command_past_its_timeout_is_ended_with_its_group() {
        let argv: Vec<String> = ["sh", "-c", "sleep 30 & sleep 30"].map(String::from).to_vec();
        let started = Instant::now();
        let err = run(&argv, Duration::from_millis(300), "test", &[]).unwrap_err();
        assert!(err.contains("did not finish within 0 s"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(20));
        let err = run(&["sh".into(), "-c".into(), "echo nope >&2; exit 3".into()], Duration::from_secs(30), "t", &[])
            .unwrap_err();
        assert!(err.contains("exit status: 3") && err.ends_with("nope"), "{err}");
    }
}
