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
