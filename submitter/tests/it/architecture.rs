//! The launch path's layering, checked over the source (issue 13; import cycles are
//! `module_graph.rs`'s): the deciding code reads nothing itself — `decide` depends on the domain
//! types only, the planner on no ledger backend, run record, clock or file.

use std::path::Path;

fn source(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

#[test]
fn deciding_code_reads_nothing_itself() {
    let decide = source("src/decide.rs");
    for forbidden in ["crate::ledger", "crate::slurm", "crate::sync", "rusqlite", "postgres", "std::fs", "now()"] {
        assert!(!decide.contains(forbidden), "decide.rs uses {forbidden}");
    }
    let planner = source("src/planner.rs");
    for forbidden in
        ["read_status", "Utc::now", "ledger::now", "std::fs", "rusqlite", "postgres", "dyn Ledger", "dyn Slurm"]
    {
        assert!(!planner.contains(forbidden), "planner.rs uses {forbidden}");
    }
}

/// Issue 34: one path of a state change. Outside the ledger itself, only `transition.rs` writes an
/// attempt's status (`.transition(` on a ledger, `finish_vanished`), so every change reaches the
/// team mirror and the notifier; test modules (after `#[cfg(test)]`) may set up rows directly.
#[test]
fn only_the_recorder_writes_an_attempts_status() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut todo = vec![root.clone()];
    let mut writers = Vec::new();
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
                continue;
            }
            let rel = path.strip_prefix(&root).unwrap().display().to_string();
            if rel.starts_with("ledger/") || rel == "transition.rs" || path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let production = text.split("#[cfg(test)]").next().unwrap_or_default();
            for (n, line) in production.lines().enumerate() {
                let calls_ledger = (line.contains(".transition(") && !line.contains("m.transition("))
                    || line.contains(".finish_vanished(");
                if calls_ledger && !line.trim_start().starts_with("//") {
                    writers.push(format!("src/{rel}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(writers.is_empty(), "state changes outside transition::Recorder: {writers:#?}");
}
