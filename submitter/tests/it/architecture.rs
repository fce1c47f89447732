//! The launch path's layering, checked over the source (issue 13): the command modules import
//! each other without a cycle, and the deciding code reads nothing itself — `decide` depends on the
//! domain types only, the planner on no ledger backend, run record, clock or file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn source(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

/// The command modules each `commands/<name>.rs` names through `super::<other>`.
fn command_graph() -> BTreeMap<String, BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/commands");
    let modules: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.path().file_stem()?.to_str().map(str::to_string))
        .filter(|m| m != "mod")
        .collect();
    let mut graph = BTreeMap::new();
    for module in &modules {
        let text = std::fs::read_to_string(dir.join(format!("{module}.rs"))).unwrap();
        let uses = modules
            .iter()
            .filter(|other| *other != module && text.contains(&format!("super::{other}::")))
            .cloned()
            .collect();
        graph.insert(module.clone(), uses);
    }
    graph
}

fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            return Some(path[at..].to_vec());
        }
        if !done.insert(node.to_string()) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn command_modules_import_each_other_without_a_cycle() {
    let graph = command_graph();
    assert!(graph["listener"].contains("queueing"), "the graph is read: {graph:?}");
    assert_eq!(find_cycle(&graph), None, "{graph:?}");
    let mut with_cycle = graph.clone();
    with_cycle.get_mut("queueing").unwrap().insert("listener".into());
    assert!(find_cycle(&with_cycle).is_some(), "the check can fail");
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
