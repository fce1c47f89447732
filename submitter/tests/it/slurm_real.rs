//! `SlurmCli` against a real Slurm (the single-node cluster `scripts/services.sh up` starts).
//! Required in CI (`CI=true`); skipped with a note where no controller answers.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use submitter::slurm::{JobExit, JobId, JobInfo, JobState, SbatchOptions, Slurm, SlurmCli, SubmitRequest};

/// Jobs queue behind whatever else the suite runs on 2 cores, so waits are generous.
const WAIT_FOR_END: Duration = Duration::from_secs(240);
const WAIT_FOR_START: Duration = Duration::from_secs(60);
const POLL_EVERY: Duration = Duration::from_millis(300);

/// Set by `cargo test` in this process; the job must not inherit it.
const UNRELATED_VARIABLE: &str = "CARGO_MANIFEST_DIR";
const EXPORTED_VARIABLE: &str = "EVAL_SLURM_IT_TOKEN";

#[allow(clippy::print_stderr)]
fn reachable_slurm() -> Option<SlurmCli> {
    let cli = SlurmCli::new().with_command_timeout(Duration::from_secs(30));
    let answer = cli.ping();
    if matches!(answer, Ok(true)) {
        return Some(cli);
    }
    if std::env::var("CI").is_ok_and(|value| value == "true") {
        panic!("Slurm is required in CI but `scontrol ping` says: {answer:?}");
    }
    eprintln!("note: skipping: no local Slurm ({answer:?})");
    None
}

fn unique_name(purpose: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_nanos());
    format!("evalci-it-{purpose}-{}-{nanos}", std::process::id())
}

fn write_script(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/bash\n{body}\n")).expect("write batch script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod script");
    path
}

fn base_options(job_name: &str, output: &Path) -> SbatchOptions {
    SbatchOptions {
        job_name: Some(job_name.to_string()),
        partition: std::env::var("EVAL_TEST_SLURM_PARTITION").ok().filter(|p| !p.is_empty()),
        time_limit: Some(Duration::from_secs(300)),
        cpus_per_task: Some(1),
        mem_mb: Some(64),
        output: Some(output.to_path_buf()),
        ..Default::default()
    }
}

/// Polls `jobs` until `done` accepts the job's state, then returns `show`'s fuller view.
fn wait_for(cli: &SlurmCli, id: JobId, limit: Duration, done: impl Fn(&JobState) -> bool) -> JobInfo {
    let deadline = Instant::now() + limit;
    let mut last_seen = None;
    loop {
        let listed = cli.jobs(&[id]).expect("squeue");
        if let Some(job) = listed.into_iter().find(|job| job.id == id) {
            if done(&job.state) {
                return cli.show(id).expect("scontrol show job").expect("job still known");
            }
            last_seen = Some(job);
        }
        assert!(Instant::now() < deadline, "job {id} did not get there within {limit:?}; last seen {last_seen:?}");
        std::thread::sleep(POLL_EVERY);
    }
}

/// Cancels the job if the test ends early, so no sleeper is left on the cluster.
struct CancelOnDrop<'a>(&'a SlurmCli, JobId);

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.cancel(self.1, None, false);
    }
}

#[test]
fn real_job_sees_only_the_exported_variable_and_completes() {
    let Some(cli) = reachable_slurm() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let script = write_script(dir.path(), "env.sh", "echo \"args=$*\"\nenv | sort");
    let output = dir.path().join("env.out");
    let name = unique_name("env");
    let token = "value with spaces; and $dollars";
    let request = SubmitRequest {
        script,
        script_args: vec!["first arg".into(), "second".into()],
        options: base_options(&name, &output),
        export: vec![(EXPORTED_VARIABLE.into(), token.into())],
    };

    let id = cli.submit(&request).expect("sbatch");
    let _guard = CancelOnDrop(&cli, id);
    let finished = wait_for(&cli, id, WAIT_FOR_END, JobState::is_terminal);
    assert_eq!(finished.state, JobState::Completed, "{finished:?}");
    assert_eq!(finished.exit, Some(JobExit { code: 0, signal: 0 }));
    assert_eq!(finished.name, name);
    assert_eq!(finished.std_out.as_deref(), Some(output.as_path()));

    let seen = std::fs::read_to_string(&output).expect("job output");
    assert!(seen.contains("args=first arg second"), "{seen}");
    assert!(seen.lines().any(|line| line == format!("{EXPORTED_VARIABLE}={token}")), "{seen}");
    assert!(
        std::env::var_os(UNRELATED_VARIABLE).is_some(),
        "cargo test should set {UNRELATED_VARIABLE} in this process"
    );
    assert!(!seen.contains(&format!("{UNRELATED_VARIABLE}=")), "leaked into the job: {seen}");
    assert!(!seen.contains("CARGO_"), "cargo's environment leaked into the job: {seen}");

    let by_name = cli.find_by_name(&name).expect("squeue --name");
    assert_eq!(by_name.iter().map(|job| job.id).collect::<Vec<_>>(), [id]);
}

#[test]
fn real_job_is_cancelled() {
    let Some(cli) = reachable_slurm() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let script = write_script(dir.path(), "sleep.sh", "echo started\nexec sleep 600");
    let output = dir.path().join("sleep.out");
    let name = unique_name("cancel");
    let request = SubmitRequest { script, options: base_options(&name, &output), ..Default::default() };

    let id = cli.submit(&request).expect("sbatch");
    let _guard = CancelOnDrop(&cli, id);
    // Cancel a running job where the cluster allows; a job still queued after the wait
    // is cancelled all the same.
    let deadline = Instant::now() + WAIT_FOR_START;
    while Instant::now() < deadline {
        let state = cli.show(id).expect("scontrol show job").map(|job| job.state);
        if state != Some(JobState::Pending) {
            break;
        }
        std::thread::sleep(POLL_EVERY);
    }
    let before = cli.show(id).expect("scontrol show job").expect("job known");
    assert!(before.state.is_active(), "{before:?}");

    cli.cancel(id, None, false).expect("scancel");
    let cancelled = wait_for(&cli, id, WAIT_FOR_END, JobState::is_terminal);
    assert_eq!(cancelled.state, JobState::Cancelled, "{cancelled:?}");
    assert!(cancelled.state.is_terminal() && !cancelled.state.is_active());
    // Cancelling again is harmless: scancel is silent for finished jobs.
    cli.cancel(id, None, false).expect("second scancel");
}

#[test]
fn real_sbatch_rejection_is_a_one_line_error() {
    let Some(cli) = reachable_slurm() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let script = write_script(dir.path(), "never.sh", "exit 0");
    let mut options = base_options(&unique_name("reject"), &dir.path().join("never.out"));
    options.partition = Some("no-such-partition-evalci".into());
    let request = SubmitRequest { script, options, ..Default::default() };
    let error = cli.submit(&request).expect_err("bad partition must be refused");
    let message = error.to_string();
    assert!(message.contains("--partition=no-such-partition-evalci"), "{message}");
    assert!(message.contains("Invalid partition name specified"), "{message}");
    assert!(!message.contains('\n'), "{message}");
    assert_eq!(cli.show(JobId(u64::from(u32::MAX) - 1)).expect("scontrol"), None);
}
