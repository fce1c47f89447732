//! No import cycle between modules, in every crate (submitter's library with its command line `cli`, payload,
//! launch_spec and the e2e test support): read from the
//! sources, every `use` and every `crate::`/`super::`/`self::` path gives an edge from the file's
//! module to the module it names. An edge between a module and its own ancestor or descendant is the
//! tree itself (a parent re-exporting its child, a child using its parent's types) and is not an
//! edge here; every other edge is lifted to the two siblings under the modules' lowest common
//! ancestor, and at every level of the tree the siblings must form an acyclic graph — so
//! `verify::check → verify::results → verify::check` is a cycle, and so is `sync → verify::status`
//! with `verify::check → sync` (siblings `sync` and `verify`). Test modules (`#[cfg(test)] mod …` at
//! the end of a file) are left out: what tests import is not the design's layering.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use regex::Regex;

use crate::support::workspace_root;

/// One crate's modules: `a::b` → the file's text (without its trailing test module).
struct Crate {
    name: &'static str,
    modules: BTreeMap<String, String>,
}

fn module_path(src: &Path, file: &Path, root_file: &str) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop()?;
    if last == root_file && parts.is_empty() {
        return Some(String::new());
    }
    if last == "lib.rs" || last == "main.rs" {
        return None; // the other crate's root
    }
    let stem = last.strip_suffix(".rs")?;
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    Some(parts.join("::"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without comments and without a trailing `#[cfg(test)]` module.
fn code(text: &str) -> String {
    static TEST_MODULE: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"#\[cfg\(test\)\]\n(?:pub(?:\([a-z]+\))? )?mod ").unwrap());
    let text = match TEST_MODULE.find(text) {
        Some(at) => &text[..at.start()],
        None => text,
    };
    // String and char literals first (a `"//"` or a `use …;` in a message is not code), then comments.
    let mut text = text.replace("'\"'", "' '").replace("'\\\"'", "' '");
    static LITERALS: LazyLock<[Regex; 3]> = LazyLock::new(|| {
        [r##"(?s)\br#".*?"#"##, r#"(?s)\br"[^"]*""#, r#"(?s)"(?:[^"\\]|\\.)*""#].map(|re| Regex::new(re).unwrap())
    });
    for literal in LITERALS.iter() {
        text = literal.replace_all(&text, "\"\"").into_owned();
    }
    text.lines().map(|line| line.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

fn load(name: &'static str, src: &Path, root_file: &str, only: impl Fn(&str) -> bool) -> Crate {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut modules = BTreeMap::new();
    for file in files {
        let Some(path) = module_path(src, &file, root_file) else { continue };
        if !only(&path) {
            continue;
        }
        modules.insert(path, code(&std::fs::read_to_string(&file).unwrap()));
    }
    Crate { name, modules }
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into full paths.
fn expand(tree: &str) -> Vec<String> {
    static RENAMED: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\s+as\s+[A-Za-z_][A-Za-z0-9_]*").unwrap());
    let tree: String = RENAMED.replace_all(tree, "").chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else { return vec![tree] };
    let prefix = &tree[..open];
    let close = tree.rfind('}').filter(|&close| close > open).unwrap_or(tree.len());
    let inner = &tree[open + 1..close];
    let (mut depth, mut start, mut items) = (0, 0, Vec::new());
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items.into_iter().filter(|i| !i.is_empty()).flat_map(expand).map(|p| format!("{prefix}{p}")).collect()
}

/// Every path the module names: `use` trees and qualified paths in code.
fn paths(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    static USES: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"(?m)^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);").unwrap());
    static QUALIFIED: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\b(?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+").unwrap());
    for capture in USES.captures_iter(text) {
        found.extend(expand(&capture[1]));
    }
    found.extend(QUALIFIED.find_iter(text).map(|m| m.as_str().to_string()));
    found
}

fn parent(module: &str) -> String {
    module.rsplit_once("::").map(|(p, _)| p.to_string()).unwrap_or_default()
}

fn join(base: &str, name: &str) -> String {
    if base.is_empty() { name.to_string() } else { format!("{base}::{name}") }
}

/// The module a path lands in (its longest prefix that is a module of the crate), if any.
fn resolve(krate: &Crate, from: &str, path: &str) -> Option<String> {
    let path = path.trim_end_matches("::*");
    let mut segments = path.split("::").peekable();
    let mut base = match segments.peek().copied()? {
        "crate" => {
            segments.next();
            String::new()
        }
        "self" | "super" => {
            let mut base = from.to_string();
            while let Some(&segment) = segments.peek() {
                match segment {
                    "self" => {}
                    "super" => base = parent(&base),
                    _ => break,
                }
                segments.next();
            }
            base
        }
        // A child module of the current one named directly (uniform paths), else another crate.
        first if krate.modules.contains_key(&join(from, first)) => from.to_string(),
        _ => return None,
    };
    let mut landed = None;
    if krate.modules.contains_key(&base) {
        landed = Some(base.clone());
    }
    for segment in segments {
        base = join(&base, segment);
        if krate.modules.contains_key(&base) {
            landed = Some(base.clone());
        } else {
            break;
        }
    }
    landed
}

fn is_ancestor(a: &str, b: &str) -> bool {
    a.is_empty() || b.starts_with(&format!("{a}::")) || a == b
}

/// The sibling edges of the tree, per parent: parent → (child → children it depends on).
fn sibling_graph(krate: &Crate) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, text) in &krate.modules {
        for path in paths(text) {
            let Some(to) = resolve(krate, from, &path) else { continue };
            if is_ancestor(&to, from) || is_ancestor(from, &to) {
                continue;
            }
            let (a, b): (Vec<&str>, Vec<&str>) = (from.split("::").collect(), to.split("::").collect());
            let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            let parent = a[..common].join("::");
            let (child_a, child_b) = (join(&parent, a[common]), join(&parent, b[common]));
            graph.entry(parent).or_default().entry(child_a).or_default().insert(child_b);
        }
    }
    graph
}

/// The strongly connected components with more than one member (each one or more cycles), each
/// as its sorted members.
fn tangles(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<BTreeSet<String>> {
    let reach = |from: &String| {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![from.clone()]);
        while let Some(node) = todo.pop() {
            for next in edges.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&String, BTreeSet<String>> = edges.keys().map(|node| (node, reach(node))).collect();
    let mut found = BTreeSet::new();
    for (node, from_node) in &reachable {
        let component: BTreeSet<String> = from_node
            .iter()
            .filter(|other| reachable.get(other).is_some_and(|back| back.contains(*node)))
            .cloned()
            .collect();
        if component.len() > 1 {
            found.insert(component);
        }
    }
    found
}

/// Every tangle, as `(crate, members)`.
fn all_tangles() -> BTreeSet<(String, BTreeSet<String>)> {
    let root = workspace_root();
    let crates = [
        // `testkit` is test support (`#[cfg(test)] mod testkit`), like the files' own test modules.
        load("submitter", &root.join("submitter/src"), "lib.rs", |m| m != "testkit"),
        load("payload", &root.join("payload/src"), "lib.rs", |_| true),
        load("launch_spec", &root.join("launch-spec/src"), "lib.rs", |_| true),
        load("e2e (test support)", &root.join("tests/src"), "lib.rs", |m| !m.starts_with("bin")),
    ];
    let mut found = BTreeSet::new();
    for krate in &crates {
        assert!(krate.modules.len() > 3, "{}: modules not found", krate.name);
        for edges in sibling_graph(krate).values() {
            found.extend(tangles(edges).into_iter().map(|members| (krate.name.to_string(), members)));
        }
    }
    found
}

#[test]
fn no_import_cycles() {
    let found: Vec<String> = all_tangles().iter().map(|(krate, members)| format!("{krate}: {members:?}")).collect();
    assert!(found.is_empty(), "import cycles among these sibling modules (break them, docs/design.md §0): {found:#?}");
}

#[test]
fn the_graph_reader_finds_a_planted_cycle() {
    let modules = [
        ("", "mod a; mod b;"),
        ("a", "use crate::b::thing;\npub fn f() {}"),
        ("b", "pub fn thing() { super::a::f() }"),
        ("b::inner", "use super::super::a;\n#[cfg(test)]\nmod tests { use crate::b; }"),
    ];
    let krate = Crate { name: "planted", modules: modules.iter().map(|(m, t)| (m.to_string(), code(t))).collect() };
    let graph = sibling_graph(&krate);
    let tangle = BTreeSet::from(["a".to_string(), "b".to_string()]);
    assert_eq!(tangles(&graph[""]), BTreeSet::from([tangle]));
    assert_eq!(expand("x::{y, z::{p, q as r}}"), vec!["x::y", "x::z::p", "x::z::q"]);
}
