//! `submitter models add|import|list` and `submitter unevaluated` through the real binary on a
//! SQLite ledger: the catalogue and the priority list of models not yet evaluated on a family.

use serde_json::{Value, json};
use submitter::ledger::{AttemptStatus, NewAttempt, open_ledger};

use crate::support::{on_local as run, stderr, stdout};

#[test]
fn catalogue_and_unevaluated_list() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let list = dir.path().join("list.txt");
    std::fs::write(&list, "# ours\norg/Alpha-8B\norg/Beta-32B\norg/Gamma-8B\n").unwrap();
    let out = run(&state, &["models", "import", list.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("3 model(s) added"), "{}", stdout(&out));
    let out = run(&state, &["models", "add", "--base", "Qwen/Qwen3-8B", "org/Alpha-8B", "org/Delta-8B"]);
    assert!(stdout(&out).contains("1 model(s) added, 1 already known"), "{}", stdout(&out));
    let out = run(&state, &["models", "list", "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((doc["format_version"].as_u64(), doc["kind"].as_str()), (Some(1), Some("models.list")), "{doc}");
    let models = &doc["models"];
    assert_eq!(models.as_array().unwrap().len(), 4);
    let delta = models.as_array().unwrap().iter().find(|m| m["id"] == "org/Delta-8B").unwrap();
    assert_eq!(delta["size_class"], "8");
    assert_eq!(delta["base_model"], "Qwen/Qwen3-8B");

    // Alpha finished on a member of the dev_set_v2 family; Gamma only failed there.
    let ledger = open_ledger(&format!("sqlite:{}", state.join("ledger.sqlite").display())).unwrap();
    for (model, benchmark, to) in [
        ("org/Alpha-8B", "dev_set_v2_2.0x", AttemptStatus::Finished),
        ("org/Gamma-8B", "dev_set_v2", AttemptStatus::Failed),
    ] {
        let id = ledger
            .insert_pending(&NewAttempt {
                model: model.into(),
                benchmark: benchmark.into(),
                cluster: "local".into(),
                username: "t".into(),
                run_tag: format!("{benchmark}__{model}"),
                agent: "terminus-2".into(),
                reason: "test".into(),
                config: json!({}),
            })
            .unwrap();
        ledger.transition(id, to, "test", Some(&json!({"mean_reward": 0.5}))).unwrap();
    }
    let out_file = dir.path().join("todo.txt");
    let out = run(
        &state,
        &["unevaluated", "--benchmark", "DCAgent_dev_set_v2", "--size", "8", "-o", out_file.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let todo = submitter::config::lists::read_model_list(&out_file).unwrap();
    assert_eq!(
        todo,
        vec!["org/Gamma-8B", "org/Delta-8B"],
        "8B models without a finished dev_set_v2-family attempt, in registration order"
    );
}
