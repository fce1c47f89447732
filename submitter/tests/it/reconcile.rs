//! Issue 34, the reconcile (docs/design.md §0): one launch iteration asks Slurm once and reads
//! each attempt's `status.json` once; every transition, from every command that can cause it,
//! reaches the ledger, the team mirror (the real PostgreSQL) and the notifier (a real webhook
//! receiver); `sync` then `launch` tells each result once; `status` changes nothing. All on the
//! real local Slurm; attempts are inserted through the library and their run dirs written with
//! the testkit, so no job has to run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use chrono::Utc;
use launch_spec::records::{Outcome, OutcomeClass, Phase, RunStatus};
use launch_spec::testkit::rundir::{Counters, running_status, write_json};
use serde_json::json;
use submitter::ledger::{AttemptId, AttemptStatus, Ledger, NewAttempt, NewRemediation, open_ledger};
use submitter::team::mirror::{Mirror, WriteBounds};

use crate::notify::{Answer, Receiver};
use crate::queueing::{TestCluster, scancel, text};
use crate::support::slurm_up;
use crate::team::{HISTORY, TeamDb};

/// A job Slurm holds (PENDING until released): an attempt's job that stays active without running.
fn held_job(name: &str) -> String {
    let out = Command::new("sbatch")
        .args(["--parsable", "--hold", "-J", name, "-o", "/dev/null", "--wrap", "sleep 1"])
        .output()
        .expect("sbatch (scripts/services.sh up)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().split(';').next().unwrap().to_string()
}

/// An attempt of `cluster` in `ledger` with its run dir under `root` (and, when given, its job id
/// and the `status.json` payload would have written).
struct Row<'a> {
    model: &'a str,
    benchmark: &'a str,
    job: Option<String>,
    status: Option<RunStatus>,
}

fn insert(ledger: &dyn Ledger, cluster: &str, root: &Path, row: &Row) -> (AttemptId, NewAttempt, PathBuf) {
    let run_tag = submitter::registry::names::run_tag(row.benchmark, row.model);
    let run_dir = root.join("jobs").join(format!("{run_tag}-{}", row.job.as_deref().unwrap_or("none")));
    std::fs::create_dir_all(&run_dir).unwrap();
    let new = NewAttempt {
        model: row.model.into(),
        benchmark: row.benchmark.into(),
        cluster: cluster.into(),
        username: "tester".into(),
        run_tag,
        agent: "terminus-2".into(),
        reason: "test".into(),
        config: json!({"run_dir": run_dir, "agent": "terminus-2"}),
    };
    let id = ledger.insert_pending(&new).unwrap();
    if let Some(job) = &row.job {
        ledger.set_job_id(id, job).unwrap();
    }
    if let Some(status) = &row.status {
        write_json(&run_dir.join("status.json"), &serde_json::to_value(status).unwrap(), None);
    }
    (id, new, run_dir)
}

/// payload's `status.json` for `job`: running with a fresh heartbeat, or ended with `outcome`.
fn status(run_tag: &str, job: &str, outcome: Option<(OutcomeClass, Option<&str>)>) -> RunStatus {
    let now = Utc::now();
    let mut status = running_status(run_tag, job, now, now, Counters::default(), now);
    if let Some((class, cause)) = outcome {
        status.phase = Phase::Done;
        let exit_code = if class == OutcomeClass::Finished { 0 } else { 1 };
        let outcome = json!({"class": class, "cause": cause, "exit_code": exit_code, "message": "test"});
        status.outcome = Some(serde_json::from_value::<Outcome>(outcome).unwrap());
    }
    status
}

/// Every file under `dir` with its bytes (what "the state dir is the same" compares).
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap_or_default());
            }
        }
    }
    out
}

fn squeue_states(jobs: &[String]) -> String {
    let out = Command::new("squeue").args(["-h", "--states=all", "-j", &jobs.join(","), "-o", "%i %T %r"]).output();
    String::from_utf8_lossy(&out.unwrap().stdout).into_owned()
}

/// Three active jobs: one `launch --once` asks Slurm once (`squeue`) and reads each attempt's
/// `status.json` once — counted in its debug log, where every Slurm command and every record read
/// is one line. Then `status` (text, `--json`, `--watch`) changes nothing: the ledger's rows,
/// Slurm's jobs and the state dir are the same after it.
#[test]
fn one_iteration_observes_once_and_status_changes_nothing() {
    if !slurm_up() {
        return;
    }
    let cluster = TestCluster::new("reconcile1", |p| p.push_str("remediation: {enabled: true}\n"));
    let ledger_spec = cluster.root().join("ledger.sqlite").display().to_string();
    let ledger = open_ledger(&ledger_spec).unwrap();
    let models = ["test/Tiny-1B", "test/Small-3B", "test/Mini-7B"];
    let mut jobs = Vec::new();
    let mut dirs = Vec::new();
    for model in models {
        let job = held_job("reconcile1");
        let run_tag = submitter::registry::names::run_tag("terminal_bench_2", model);
        let row = Row {
            model,
            benchmark: "terminal_bench_2",
            job: Some(job.clone()),
            status: Some(status(&run_tag, &job, None)),
        };
        dirs.push(insert(ledger.as_ref(), "reconcile1", cluster.root(), &row).2);
        jobs.push(job);
    }
    let models_file = cluster.models_file(&models);
    let args = ["--once", "--preset", "tb2", "--models-file", models_file.to_str().unwrap()];
    let log = [("SUBMITTER_LOG", "warn,submitter::slurm=debug,submitter::observe=debug")];
    let out = cluster.run(&["launch"], &ledger_spec, &args, &log);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("0 submitted"), "the three pairs are in progress: {said}");
    let squeues = said.lines().filter(|l| l.contains("running Slurm command") && l.contains("squeue")).count();
    assert_eq!(squeues, 1, "one squeue per iteration: {said}");
    for dir in &dirs {
        let reads =
            said.lines().filter(|l| l.contains("read status.json") && l.contains(&*dir.to_string_lossy())).count();
        assert_eq!(reads, 1, "{}: one read of its status.json per iteration: {said}", dir.display());
    }

    // `status` changes nothing.
    let rows = |ledger: &dyn Ledger| format!("{:?}", ledger.active().unwrap());
    let state_dir = cluster.root().join("state");
    let before = (rows(ledger.as_ref()), squeue_states(&jobs), tree(&state_dir), std::fs::read(&ledger_spec).unwrap());
    for extra in [&[][..], &["--json"][..]] {
        let out = cluster.run(&["status"], &ledger_spec, extra, &[]);
        assert!(out.status.code().is_some_and(|c| c <= 1), "{}", text(&out));
        assert!(text(&out).contains("test/Tiny-1B"), "status lists the jobs: {}", text(&out));
    }
    let mut watch = cluster
        .command(&["status"], &ledger_spec, &["--watch", "--interval", "1s"], &[])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let _ = watch.kill();
    let _ = watch.wait();
    let after = (rows(ledger.as_ref()), squeue_states(&jobs), tree(&state_dir), std::fs::read(&ledger_spec).unwrap());
    assert_eq!(before.0, after.0, "status changed the ledger's rows");
    assert_eq!(before.1, after.1, "status changed Slurm's jobs");
    assert_eq!(before.2.keys().collect::<Vec<_>>(), after.2.keys().collect::<Vec<_>>(), "status changed the state dir");
    assert!(before.2 == after.2, "status rewrote a file of the state dir");
    assert!(before.3 == after.3, "status changed the ledger file");
    for job in &jobs {
        scancel(job);
    }
}

/// Every transition kind × the command that causes it reaches the ledger, the team's database (the
/// mirror on the real PostgreSQL) and the notifier (a real webhook receiver): a result recorded by
/// `sync` and by `launch`, a vanished job failed by `sync`, a stale pending job cancelled by
/// `launch` for its resubmission, `submitter cancel` (of the job it queued), remediation's
/// cancel (an act recorded earlier, completed by `remediate`) and its retry of an ended attempt
/// (told; the ledger gets the act, the attempt had ended). `sync` then `launch` tells each result
/// exactly once.
#[test]
fn every_transition_reaches_the_ledger_the_mirror_and_the_notifier() {
    if !slurm_up() {
        return;
    }
    let Some(mut team) = TeamDb::new("transitions") else { return };
    team.exec(HISTORY);
    team.exec(
        "INSERT INTO models (id, name, created_by) VALUES
           ('00000000-0000-0000-0000-000000000021', 'test/Tiny-1B', 'carol'),
           ('00000000-0000-0000-0000-000000000022', 'test/Small-3B', 'carol'),
           ('00000000-0000-0000-0000-000000000023', 'test/Mini-7B', 'carol');",
    );
    let receiver = Receiver::start(Answer::Ok);
    let name = "transitions";
    let cluster = TestCluster::new(name, |p| {
        p.push_str("notify: {webhook_secret: TEAM_WEBHOOK, timeout_s: 5, digest_after: 20}\n");
        p.push_str("team: {database_secret: TEAM_DB_URL}\n");
        p.push_str("remediation: {enabled: true}\n");
        // A pending job is stale after about a second: the launch cancels it for its resubmission.
        *p = p.replace("limits:\n", "limits:\n  stale_pending_hours: 0.0003\n");
    });
    let secrets = cluster.root().join("secrets.env");
    let keys = std::fs::read_to_string(&secrets).unwrap()
        + &format!("TEAM_WEBHOOK={}\nTEAM_DB_URL={}\n", receiver.url, team.url);
    launch_spec::testkit::world::write_secrets(&secrets, &keys, 0o600);
    let ledger_spec = cluster.root().join("ledger.sqlite").display().to_string();
    let ledger = open_ledger(&ledger_spec).unwrap();
    let mirror = Mirror::connect(&team.url, "tester", ledger.location(), WriteBounds::default()).unwrap();
    let root = cluster.root();
    let add = |model: &str, benchmark: &str, job: Option<String>, outcome: Option<(OutcomeClass, Option<&str>)>| {
        let run_tag = submitter::registry::names::run_tag(benchmark, model);
        let st = match (&job, outcome) {
            (Some(j), Some(o)) => Some(status(&run_tag, j, Some(o))),
            _ => None,
        };
        let (id, new, _) = insert(ledger.as_ref(), name, root, &Row { model, benchmark, job: job.clone(), status: st });
        // The team's row exists from the start, as the executor publishes it before sbatch.
        assert!(mirror.pending(id, &new).unwrap(), "{model} {benchmark} published");
        if let Some(job) = &job {
            mirror.submitted(id, job).unwrap();
        }
        id
    };
    let team_status = |team: &mut TeamDb, id: AttemptId| -> String {
        let marker = json!({"submitter": {"attempt": id.0}});
        team.client
            .query_one("SELECT job_status FROM sandbox_jobs WHERE username = 'tester' AND config @> $1", &[&marker])
            .unwrap()
            .get(0)
    };
    // Job ids Slurm does not know (it forgot them, or they never ran here): the run dir decides.
    let gone = |n: u32| Some(format!("{}", 90_000_000 + n));
    let sync_result = add("test/Tiny-1B", "terminal_bench_2", gone(1), Some((OutcomeClass::Finished, None)));
    let vanished = add("test/Mini-7B", "terminal_bench_2", gone(3), None);
    let stale_job = held_job("transitions");
    let stale = add("test/Tiny-1B", "dev_set_v2", Some(stale_job.clone()), None);
    let out = cluster.run(&["sync"], &ledger_spec, &[], &[]);
    assert!(out.status.success(), "{}", text(&out));
    // `launch` folds a result of its own (its sync) and tells nothing `sync` told.
    let launch_result = add("test/Small-3B", "terminal_bench_2", gone(2), Some((OutcomeClass::Finished, None)));
    let out = cluster.run(&["launch"], &ledger_spec, &["--once", "--preset", "tb2", "--model", "test/Small-3B"], &[]);
    assert!(out.status.success(), "{}", text(&out));

    // The stale pending row: cancelled by the launch for its resubmission, which queues a real job;
    // the operator then cancels that one.
    let out = cluster.run(&["launch"], &ledger_spec, &["--once", "--preset", "v2", "--model", "test/Tiny-1B"], &[]);
    assert!(out.status.success() && text(&out).contains("1 submitted"), "{}", text(&out));
    let operator = ledger.active().unwrap().into_iter().find(|a| a.model == "test/Tiny-1B").expect("resubmitted").id;
    let out = cluster.run(&["cancel"], &ledger_spec, &["--model", "test/Tiny-1B", "--benchmark", "v2"], &[]);
    assert!(out.status.success(), "{}", text(&out));

    // Remediation: an act recorded by an earlier pass whose scancel did not happen (completed now),
    // and an OOM at engine start of an attempt that had ended (a retry with a lower ceiling).
    let remediated_job = held_job("transitions");
    let remediated = add("test/Small-3B", "dev_set_v2", Some(remediated_job.clone()), None);
    ledger
        .record_remediation(&NewRemediation {
            model: "test/Small-3B".into(),
            family: "dev_set_v2".into(),
            agent: "terminus-2".into(),
            cluster: name.into(),
            attempt: Some(remediated),
            finding: "engine.hung".into(),
            action: submitter::domain::RemediationAct::Cancel,
            change: String::new(),
            adjustment: None,
            reason: "engine.hung: no completion for 30m".into(),
            username: "tester".into(),
        })
        .unwrap();
    let retried = add("test/Mini-7B", "dev_set_v2", gone(4), Some((OutcomeClass::EngineStart, Some("oom"))));
    ledger.transition(retried, AttemptStatus::Failed, "engine_start/oom: out of memory", None).unwrap();
    let out = cluster.run(&["remediate"], &ledger_spec, &[], &[]);
    assert!(out.status.success(), "{}", text(&out));

    let told = receiver.texts().join("\n");
    let attempt = |id: AttemptId| ledger.attempt(id).unwrap().unwrap();
    // (attempt, ledger status, the team's job_status, what the webhook said)
    let table = [
        (
            sync_result,
            AttemptStatus::Finished,
            "Finished",
            format!("finished: test/Tiny-1B on terminal_bench_2 (attempt {})", sync_result),
        ),
        (
            launch_result,
            AttemptStatus::Finished,
            "Finished",
            format!("finished: test/Small-3B on terminal_bench_2 (attempt {})", launch_result),
        ),
        (
            vanished,
            AttemptStatus::Failed,
            "Failed",
            format!("failed: test/Mini-7B on terminal_bench_2 (attempt {vanished})"),
        ),
        (
            operator,
            AttemptStatus::Cancelled,
            "Failed",
            format!("cancelled: test/Tiny-1B on dev_set_v2 (attempt {operator}): cancelled by operator"),
        ),
        (
            stale,
            AttemptStatus::Cancelled,
            "Failed",
            format!("cancelled: test/Tiny-1B on dev_set_v2 (attempt {stale}): stale pending"),
        ),
        (
            remediated,
            AttemptStatus::Failed,
            "Failed",
            format!("remediation cancel: test/Small-3B on dev_set_v2 (attempt {remediated})"),
        ),
    ];
    for (id, ledger_status, team_job_status, line) in &table {
        let row = attempt(*id);
        assert_eq!(row.status, *ledger_status, "attempt {id}: {}", row.reason);
        assert_eq!(team_status(&mut team, *id), *team_job_status, "attempt {id} in the team's sandbox_jobs");
        assert_eq!(told.matches(line.as_str()).count(), 1, "told once: {line}\n{told}");
    }
    assert!(attempt(remediated).reason.starts_with("remediation cancel ("), "{}", attempt(remediated).reason);
    assert!(
        !squeue_states(std::slice::from_ref(&remediated_job)).contains("PENDING"),
        "the remediated job was cancelled"
    );
    // The retry moved no attempt (it had ended): the ledger has the act, the notifier the line.
    let acts = ledger.remediations().unwrap();
    assert!(
        acts.iter().any(|r| r.attempt == Some(retried) && r.action == submitter::domain::RemediationAct::Retry),
        "{acts:?}"
    );
    let retry_line = format!("remediation retry: test/Mini-7B on dev_set_v2 (attempt {retried})");
    assert_eq!(told.matches(retry_line.as_str()).count(), 1, "{told}");
    assert!(!squeue_states(std::slice::from_ref(&stale_job)).contains("PENDING"), "the stale job was cancelled");
    for job in [remediated_job, stale_job] {
        scancel(&job);
    }
}
