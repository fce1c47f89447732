//! Issue 22: a model id is a `launch_spec::ModelId`, parsed once where it enters. A bad id fails
//! the same way at every edge — the command line, a priority list, a blacklist, the ledger's
//! catalogue, a launch spec — in one line that says where it came from, with exit 2 (bad input),
//! and nothing is written.

use std::path::Path;
use std::process::Command;

use crate::broken::fails_with;
use crate::support::{binaries, stderr, stdout, submitter};

/// Ids the rule refuses, with the words of the problem each error must name.
const BAD: [(&str, &str); 4] = [
    ("org/--help", "segment starting with `-`"),
    ("../../etc/passwd", "`.` or `..` path segment"),
    ("org/a$(id)", "characters outside"),
    ("org/Qwen3 8B", "whitespace"),
];

fn plan_args<'a>(state: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["plan", "--cluster", "local", "--preset", "tb2", "--state-dir", state.to_str().unwrap()];
    args.extend_from_slice(extra);
    args
}

#[test]
fn a_bad_model_id_on_the_command_line_or_in_a_list_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("list.txt");
    for (id, why) in BAD {
        // The planning path (`plan`, `launch`, the listener) and `spec`: `--model`.
        fails_with(&plan_args(dir.path(), &["--model", id]), &["--model: model id", why]);
        fails_with(
            &["spec", "--cluster", "local", "--preset", "tb2", "--model", id],
            &["--model: model id", why, "give a Hugging Face id like Qwen/Qwen3-8B"],
        );
        // A priority list and a blacklist: the file and line.
        std::fs::write(&list, format!("# models\nQwen/Qwen3-8B\n{id}  # the bad one\n")).unwrap();
        let file = list.to_str().unwrap();
        fails_with(&plan_args(dir.path(), &["--models-file", file]), &["list.txt:3: model id", why]);
        fails_with(&plan_args(dir.path(), &["--model", "Qwen/Qwen3-8B", "--blacklist", file]), &["list.txt:3:", why]);
    }
}

/// A catalogue row an older submitter (or the team database) stored unchecked is named in a
/// warning and left out by `--all-models` (never a job, never a panic), while the rest of the
/// catalogue plans; `models list` still shows it, escaped.
#[test]
fn a_bad_id_in_the_ledgers_catalogue_is_named_and_never_planned() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = format!("sqlite:{}", dir.path().join("ledger.sqlite").display());
    let stored = submitter::ledger::open_ledger(&ledger).unwrap();
    assert!(stored.add_model("Qwen/Qwen3-8B", None).unwrap());
    assert!(stored.add_model("org/\u{1b}[2Jwipe", None).unwrap());
    assert!(stored.add_model("org/Other-8B", None).unwrap());
    let state = dir.path().to_str().unwrap();
    let plan = [
        "plan",
        "--cluster",
        "local",
        "--preset",
        "tb2",
        "--all-models",
        "--json",
        "--ledger",
        &ledger,
        "--state-dir",
        state,
    ];
    let out = submitter(&plan);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("skipped the ledger's catalogue model 2 of `models list`"), "{err}");
    // The log's own colours are escapes too: the id's must not reach the terminal raw.
    assert!(err.contains("control character") && !err.contains("\u{1b}[2J"), "named, escaped: {err}");
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let models: Vec<&str> = doc["jobs"].as_array().unwrap().iter().filter_map(|j| j["model"].as_str()).collect();
    assert_eq!(models, ["Qwen/Qwen3-8B", "org/Other-8B"], "{doc}");
    let list = submitter(&["models", "list", "--cluster", "local", "--ledger", &ledger, "--state-dir", state]);
    assert!(list.status.success() && stdout(&list).contains("org/\\u{1b}[2Jwipe"), "{}", stderr(&list));
}

/// A launch spec `submitter spec` wrote, with its model id edited to a bad one, is refused by
/// `payload plan` as it is read: exit 2, one line naming the file, the line and the field.
#[test]
fn a_bad_model_id_in_a_launch_spec_is_refused_by_payload_as_it_is_parsed() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("launch.json");
    let args = ["spec", "--cluster", "local", "--preset", "tb2", "--model", "Qwen/Qwen3-8B", "--out"];
    let out = submitter(&[&args[..], &[good.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&good).unwrap();
    let line = 1 + text.lines().position(|l| l.contains("\"hf_id\": \"Qwen/Qwen3-8B\"")).expect("hf_id in the spec");
    let payload = binaries().join("payload");
    for (id, why) in BAD {
        let spec = dir.path().join("bad.json");
        std::fs::write(
            &spec,
            text.replace("\"hf_id\": \"Qwen/Qwen3-8B\"", &format!("\"hf_id\": {}", serde_json::json!(id))),
        )
        .unwrap();
        let out = Command::new(&payload).args(["plan", "--spec", spec.to_str().unwrap()]).output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{id}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        for needle in [&format!("bad.json:{line}:"), "field `model.hf_id` model id", why] {
            assert!(err.contains(needle), "{id}: `{needle}` missing from {err}");
        }
        assert!(stdout(&out).is_empty(), "nothing planned: {}", stdout(&out));
    }
}
