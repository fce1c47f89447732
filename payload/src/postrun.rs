//! The optional post-run step (`post_run` in the spec; e.g. a trace upload), docs/payload.md.
//!
//! Runs once, after Harbor exited 0 and everything else is torn down: one program with its argv
//! (`{run_dir}`/`{run_tag}` replaced, never a shell string), in the run dir, in its own process
//! group with an explicit environment (crate::childenv, plus only the secrets the spec names),
//! stdout and stderr to `post_run.log`. At `timeout_s` — or at a shutdown signal — its group is
//! stopped like any child (SIGTERM, the teardown grace, SIGKILL, the sweep of descendants:
//! `Supervisor::shutdown`). Its result goes to `post_run_started`/`post_run_finished` events and
//! `status.json`'s `post_run`; it never changes the run's outcome or exit code.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use launch_spec::LaunchSpec;
use launch_spec::records::{POST_RUN_LOG, PostRunRecord};
use launch_spec::rundir::events as ev;
use nix::sys::signal::Signal;
use tokio::time::{MissedTickBehavior, interval, sleep_until};

use crate::childenv;
use crate::records::{Recorder, rotate_log};
use crate::secrets::Secrets;
use crate::supervisor::{
    ChildSpec, Role, SignalEvent, SignalSource, Supervisor, TeardownGrace, describe_status, status_code, wait_opt,
};
use crate::timings::{self, Timings};

/// The step, ready to spawn.
#[derive(Debug, Clone)]
pub struct Step {
    pub child: ChildSpec,
    pub timeout: Duration,
    /// Secret names the spec hands to the step that the secrets file lacks (a warning, not an error).
    pub(crate) missing_secrets: Vec<String>,
}

/// The spec's step with its environment and resolved program; `None` when the spec has none. An
/// `Err` (a program that cannot be found) is recorded when the step would run, never fatal.
pub(crate) fn prepare(
    spec: &LaunchSpec,
    parent: &[(String, String)],
    run_id: &str,
    secrets: &Secrets,
) -> Option<Result<Step, String>> {
    let step = spec.post_run.as_ref()?;
    let mut env = childenv::build(parent, step.env_prefix.as_deref(), &step.env, run_id);
    let mut missing_secrets = Vec::new();
    for name in &step.secrets {
        match secrets.get(name) {
            Some(value) => {
                env.insert(name.clone(), value.to_string());
            }
            None => missing_secrets.push(name.clone()),
        }
    }
    let argv = step.resolved_argv(&spec.run_dir, &spec.run_tag);
    let Some(first) = argv.first() else { return Some(Err("field `post_run.argv` is empty".to_string())) };
    let program = match childenv::resolve_program(first, step.env_prefix.as_deref(), &env["PATH"]) {
        // Absolute: the step runs in the run dir, where a relative path would name another file.
        Ok(program) => std::path::absolute(&program).unwrap_or(program),
        Err(e) => return Some(Err(format!("field `post_run.argv[0]`: {e}"))),
    };
    let timeout = Duration::from_secs(step.timeout_s.min(timings::MAX_SECONDS));
    let child = ChildSpec { program, argv, env, log: spec.run_dir.join(POST_RUN_LOG), cwd: Some(spec.run_dir.clone()) };
    Some(Ok(Step { child, timeout, missing_secrets }))
}

/// What ended the wait for the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It exited by itself.
    Exited,
    /// Its deadline passed: `post_run.timeout_s`, or the earlier one a walltime warning set.
    TimedOut { walltime: bool },
    /// A TERM/INT/HUP to payload stopped it.
    Signal(Signal),
}

/// The record for how the step ended (pure: what `run` decided, its exit status, the time taken,
/// whether its group needed SIGKILL).
pub(crate) fn record(ended: Ended, status: Option<ExitStatus>, elapsed: Duration, killed: bool) -> PostRunRecord {
    let described = status.map(describe_status).unwrap_or_else(|| "unknown status".to_string());
    let (timed_out, stopped_by, status_text) = match ended {
        Ended::Exited => (false, None, described),
        Ended::TimedOut { walltime: false } => (true, None, format!("timed out; {described}")),
        Ended::TimedOut { walltime: true } => {
            (true, Some("SIGUSR1".to_string()), format!("stopped before the walltime; {described}"))
        }
        Ended::Signal(sig) => {
            (false, Some(sig.as_str().to_string()), format!("stopped by {}; {described}", sig.as_str()))
        }
    };
    PostRunRecord {
        ok: ended == Ended::Exited && status.is_some_and(|s| s.success()),
        exit_code: status.map(status_code),
        status: status_text,
        duration_ms: elapsed.as_millis() as u64,
        timed_out,
        stopped_by,
        killed,
    }
}

/// Runs the step to its end (or its deadline, or a signal) and records it; the run's outcome is
/// the caller's and stays as it was.
pub(crate) async fn run(
    step: Result<Step, String>,
    sup: &mut Supervisor,
    signals: &mut impl SignalSource,
    rec: &mut Recorder,
    timings: &Timings,
) -> PostRunRecord {
    let started = Instant::now();
    let step = match step {
        Ok(step) => step,
        Err(why) => return not_started(rec, why, started),
    };
    for name in &step.missing_secrets {
        tracing::warn!(secret = %name, "post_run.secrets names a secret the secrets file lacks; the step runs without it");
    }
    rotate_log(&step.child.log);
    let pid = match sup.spawn(Role::PostRun, &step.child) {
        Ok(pid) => pid,
        Err(e) => return not_started(rec, format!("cannot start {}: {e}", step.child.program.display()), started),
    };
    rec.status.pids.insert(Role::PostRun.as_str().into(), pid);
    rec.write_status();
    rec.event(ev::PostRunStarted {
        pid,
        argv: step.child.argv.clone(),
        timeout_s: step.timeout.as_secs(),
        log: step.child.log.clone(),
        missing_secrets: step.missing_secrets.clone(),
    });
    tracing::info!(pid, timeout_s = step.timeout.as_secs(), "post-run step started");
    let mut deadline = timings::deadline(started, step.timeout);
    let mut walltime = false;
    let mut heartbeat = interval(timings.heartbeat);
    heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let ended = loop {
        tokio::select! {
            biased;
            _ = wait_opt(sup.post_run.as_mut()) => break Ended::Exited,
            ev = signals.recv() => match ev {
                SignalEvent::Shutdown(sig) => break Ended::Signal(sig),
                // The job ends soon: the step gets half the lead, as Harbor does (never more than its timeout).
                SignalEvent::Walltime => {
                    let cut = timings::deadline(Instant::now(), timings.walltime_lead / 2);
                    if cut < deadline {
                        deadline = cut;
                        walltime = true;
                    }
                    rec.event(during_post_run("SIGUSR1"));
                }
            },
            _ = sleep_until(deadline.into()) => break Ended::TimedOut { walltime },
            // status.json stays fresh, so `status`/`check` do not call a long upload dead.
            _ = heartbeat.tick() => rec.write_status(),
        }
    };
    if let Ended::Signal(sig) = ended {
        rec.event(during_post_run(sig.as_str()));
    }
    // Always, even after a clean exit: whatever the step left in its group or detached below
    // payload is stopped and reaped (a second signal during the grace kills at once).
    let plan = TeardownGrace::normal(timings.teardown_grace, matches!(ended, Ended::Signal(_)));
    let report = sup.shutdown(signals, plan).await;
    let status = sup.post_run.as_mut().and_then(|m| m.try_status());
    let record = record(ended, status, started.elapsed(), report.killed_groups.contains(&Role::PostRun));
    rec.event(ev::PostRunFinished { record: record.clone(), swept: Some(report.swept), clean: Some(report.clean) });
    if record.ok {
        tracing::info!(duration_ms = record.duration_ms, "post-run step finished");
    } else {
        tracing::warn!(status = %record.status, "post-run step failed; the run's outcome is unchanged");
    }
    record
}

fn not_started(rec: &mut Recorder, why: String, started: Instant) -> PostRunRecord {
    tracing::warn!(error = %why, "post-run step not started; the run's outcome is unchanged");
    let record =
        PostRunRecord { status: why, duration_ms: started.elapsed().as_millis() as u64, ..PostRunRecord::default() };
    rec.event(ev::PostRunFinished { record: record.clone(), swept: None, clean: None });
    record
}

fn during_post_run(signal: &str) -> ev::Signal {
    ev::Signal { signal: signal.to_string(), during: Some("post_run".to_string()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::path::Path;

    #[test]
    fn records_say_how_the_step_ended() {
        let ok = record(Ended::Exited, Some(ExitStatus::from_raw(0)), Duration::from_millis(1500), false);
        assert!(ok.ok && !ok.timed_out && ok.exit_code == Some(0) && ok.duration_ms == 1500, "{ok:?}");
        let failed = record(Ended::Exited, Some(ExitStatus::from_raw(3 << 8)), Duration::ZERO, false);
        assert_eq!((failed.ok, failed.exit_code, failed.status.as_str()), (false, Some(3), "exit code 3"));
        let hung = record(Ended::TimedOut { walltime: false }, Some(ExitStatus::from_raw(9)), Duration::ZERO, true);
        assert!(!hung.ok && hung.timed_out && hung.killed && hung.exit_code == Some(137), "{hung:?}");
        assert_eq!(hung.stopped_by, None);
        let wall = record(Ended::TimedOut { walltime: true }, Some(ExitStatus::from_raw(15)), Duration::ZERO, false);
        assert_eq!(wall.stopped_by.as_deref(), Some("SIGUSR1"));
        let term = record(Ended::Signal(Signal::SIGTERM), Some(ExitStatus::from_raw(15)), Duration::ZERO, false);
        assert!(!term.ok && !term.timed_out, "{term:?}");
        assert_eq!((term.stopped_by.as_deref(), term.exit_code), (Some("SIGTERM"), Some(143)));
        // Exit 0 after a stop is still not ok: the step did not finish its work by itself.
        assert!(!record(Ended::Signal(Signal::SIGINT), Some(ExitStatus::from_raw(0)), Duration::ZERO, false).ok);
    }

    #[test]
    fn prepare_substitutes_placeholders_and_hands_only_named_secrets() {
        let mut spec = launch_spec::testkit::unit_spec();
        spec.post_run = Some(launch_spec::spec::PostRunSpec {
            argv: vec!["sh".into(), "-c".into(), "echo {run_dir}".into(), "{run_tag}".into()],
            timeout_s: 30,
            env_prefix: None,
            env: [("UPLOAD_ORG".to_string(), "DCAgent3".to_string())].into(),
            secrets: vec!["HF_TOKEN".into(), "ABSENT".into()],
        });
        let secrets = Secrets::from_pairs(
            Path::new("/s.env"),
            [("HF_TOKEN".to_string(), "hf-secret".to_string()), ("DAYTONA_API_KEY".to_string(), "d".to_string())],
        );
        let parent = vec![("PATH".to_string(), "/usr/bin:/bin".to_string()), ("DAYTONA_API_KEY".into(), "p".into())];
        let step = prepare(&spec, &parent, "rid", &secrets).unwrap().unwrap();
        assert_eq!(step.child.argv, ["sh", "-c", "echo /jobs/tb2_qwen3-8b", "tb2_qwen3-8b"]);
        assert_eq!(step.child.cwd.as_deref(), Some(Path::new("/jobs/tb2_qwen3-8b")));
        assert_eq!(step.child.log, Path::new("/jobs/tb2_qwen3-8b/post_run.log"));
        let env = &step.child.env;
        assert_eq!((env["HF_TOKEN"].as_str(), env["UPLOAD_ORG"].as_str()), ("hf-secret", "DCAgent3"));
        assert!(!env.contains_key("DAYTONA_API_KEY"), "only named secrets: {env:?}");
        assert_eq!(step.missing_secrets, ["ABSENT"]);
        assert_eq!(step.timeout, Duration::from_secs(30));
        spec.post_run.as_mut().unwrap().argv[0] = "no-such-uploader-xyz".into();
        let err = prepare(&spec, &parent, "rid", &secrets).unwrap().unwrap_err();
        assert!(err.starts_with("field `post_run.argv[0]`"), "{err}");
        spec.post_run = None;
        assert!(prepare(&spec, &parent, "rid", &secrets).is_none());
    }
}
