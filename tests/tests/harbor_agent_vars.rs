//! Contract test: every agent in `launch_spec::agents::MODEL_VARS` exists in the real Harbor 0.25
//! and reads the variables the table names — each base-URL name is one of the agent's
//! `base_url_candidate_names`, each key name one of its `api_key_candidate_names` (the names
//! Harbor resolves from its own environment, where payload sets them). Asked of Harbor itself:
//! its Python imports each agent class inside the installed root. Skipped with a note when the
//! real Harbor is not installed; under `CI=true` it fails instead.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use e2e::harness::harbor_python_json;
use launch_spec::agents::MODEL_VARS;
use std::collections::BTreeMap;

const DUMP: &str = r#"
import importlib, json
from harbor.agents.factory import AgentFactory
out = {}
for name, path in AgentFactory._AGENT_MAP.items():
    mod, _, cls = path.partition(":")
    try:
        c = getattr(importlib.import_module(mod), cls)
    except Exception as e:
        out[getattr(name, "value", str(name))] = {"error": str(e)}
        continue
    mc = getattr(c, "MODEL_CONNECTION", None)
    a = getattr(mc, "agent_provider_access", None)
    out[getattr(name, "value", str(name))] = {
        "base": list(getattr(a, "base_url_candidate_names", []) or []),
        "key": list(getattr(a, "api_key_candidate_names", []) or []),
    }
print(json.dumps(out))
"#;

#[test]
fn every_agent_in_the_table_reads_the_names_it_lists() {
    let Some(dump) = harbor_python_json(DUMP) else { return };
    let agents: BTreeMap<String, serde_json::Value> = serde_json::from_value(dump).unwrap();
    let names = |v: &serde_json::Value, k: &str| -> Vec<String> {
        v[k].as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_string)).collect()
    };
    for entry in MODEL_VARS {
        let Some(real) = agents.get(entry.agent) else {
            panic!("Harbor has no agent `{}` (it has {:?})", entry.agent, agents.keys().collect::<Vec<_>>())
        };
        let (base, key) = (names(real, "base"), names(real, "key"));
        for name in entry.base_url {
            assert!(
                base.iter().any(|b| b == name),
                "{}: {name} is not a base-URL name it reads ({base:?})",
                entry.agent
            );
        }
        for name in entry.api_key {
            assert!(key.iter().any(|k| k == name), "{}: {name} is not a key name it reads ({key:?})", entry.agent);
        }
    }
    // The issue's examples, spelled out.
    assert_eq!(names(&agents["openhands"], "key"), ["LLM_API_KEY"]);
    assert!(names(&agents["openhands"], "base").contains(&"LLM_BASE_URL".to_string()));
    assert_eq!(names(&agents["mini-swe-agent"], "key"), ["MSWEA_API_KEY"]);
}
