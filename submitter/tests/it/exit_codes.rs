//! `submitter`'s exit-code table (docs/exit-codes.md, `submitter::output::ExitStatus`), one case per
//! row, each through the real binary. 6 (a submission failed) needs the local Slurm and is covered by
//! `queueing::sbatch_failure_does_not_block_the_pair` and `queueing::pre_download_gate_…`; 5 (lock
//! held) also by `queueing::pre_download_gate_chaining_and_state_dir_lock`.

use std::path::Path;

use submitter::ledger::{NewAttempt, open_ledger};
use submitter::output::ExitStatus;

use crate::ledger::Store;
use crate::queueing::{TestCluster, text};
use crate::support::{stderr, submitter};

fn code_of(status: ExitStatus) -> Option<i32> {
    Some(i32::from(status.code()))
}

#[test]
fn bad_input_is_2() {
    // A usage error (clap) and a semantic one (no GPU count) alike.
    let out = submitter(&["registry", "resolve", "--no-such-flag"]);
    assert_eq!(out.status.code(), code_of(ExitStatus::BadInput), "{}", stderr(&out));
    let out = submitter(&["registry", "resolve", "Qwen/Qwen3-32B"]);
    assert_eq!(out.status.code(), code_of(ExitStatus::BadInput), "{}", stderr(&out));
    assert!(stderr(&out).contains("--gpus-per-node"), "{}", stderr(&out));
    // A ledger spec that is not one is bad input, not an unavailable ledger.
    let cluster = TestCluster::new("exit-badspec", |_| {});
    let out = cluster.run(&["models", "list"], "mysql://u@h/db", &[], &[]);
    assert_eq!(out.status.code(), code_of(ExitStatus::BadInput), "{}", text(&out));
}

#[test]
fn ledger_unavailable_is_3() {
    let cluster = TestCluster::new("exit-ledger", |_| {});
    let out = cluster.run(&["models", "list"], "postgres://nobody@127.0.0.1:1/nothing?connect_timeout=5", &[], &[]);
    assert_eq!(out.status.code(), code_of(ExitStatus::LedgerUnavailable), "{}", text(&out));
    assert!(text(&out).contains("unreachable"), "{}", text(&out));
}

#[test]
fn slurm_unavailable_is_4() {
    // An active attempt for sync to reconcile, and no Slurm commands on PATH to ask about it.
    let cluster = TestCluster::new("exit-slurm", |_| {});
    let store = Store::sqlite();
    let ledger = open_ledger(&store.spec).unwrap();
    let id = ledger
        .insert_pending(&NewAttempt {
            model: "test/Tiny-1B".into(),
            benchmark: "terminal_bench_2".into(),
            cluster: "exit-slurm".into(),
            username: "tester".into(),
            run_tag: "exit-slurm-tag".into(),
            agent: "terminus-2".into(),
            reason: "test".into(),
            config: serde_json::json!({}),
        })
        .unwrap();
    ledger.set_job_id(id, "999999999").unwrap();
    let empty = tempfile::tempdir().unwrap();
    let path = empty.path().display().to_string();
    let out = cluster.run(&["sync"], &store.spec, &[], &[("PATH", &path)]);
    assert_eq!(out.status.code(), code_of(ExitStatus::SlurmUnavailable), "{}", text(&out));
}

#[test]
fn lock_held_is_5() {
    let cluster = TestCluster::new("exit-lock", |_| {});
    let store = Store::sqlite();
    let state = cluster.root().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let lock = hold(&state.join("submitter.lock"));
    let out = cluster.run(&["launch"], &store.spec, &["--once", "--preset", "tb2", "--model", "test/Tiny-1B"], &[]);
    assert_eq!(out.status.code(), code_of(ExitStatus::LockHeld), "{}", text(&out));
    assert!(text(&out).contains("another submitter holds"), "{}", text(&out));
    drop(lock);
}

fn hold(path: &Path) -> std::fs::File {
    let file = std::fs::File::options().create(true).truncate(false).write(true).open(path).unwrap();
    file.lock().unwrap();
    file
}

#[test]
fn the_documented_table_is_the_code() {
    let doc = std::fs::read_to_string(crate::support::workspace_root().join("docs/exit-codes.md")).unwrap();
    for status in ExitStatus::ALL {
        let row = format!("| {} | `{status:?}` |", status.code());
        assert!(doc.contains(&row), "docs/exit-codes.md lacks the row starting {row}");
    }
}
