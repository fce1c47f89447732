//! Contract test: the job-config schema kept in the repo (`launch_spec::versions::job_config_problems`,
//! what preflight and payload check the fork's job config by, since the fork has no
//! `--print-config`) holds against the real Harbor 0.25: its metric types are Harbor's own
//! `MetricType`, and a config the schema refuses (a stale `*-drop-ei` metric) Harbor's `JobConfig`
//! refuses too, while one it accepts Harbor accepts. Skipped with a note when the real Harbor is not
//! installed; under `CI=true` it fails instead.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use e2e::harness::harbor_python_json;
use launch_spec::versions::{HarborDialect, METRIC_TYPES_025, job_config_problems};
use serde_json::{Value, json};

const DUMP: &str = r#"
import json, sys
from harbor.models.metric.type import MetricType
from harbor.models.job.config import JobConfig
out = {"types": [m.value for m in MetricType], "verdicts": []}
for config in json.loads(sys.argv[1]):
    try:
        JobConfig.model_validate(config)
        out["verdicts"].append(None)
    except Exception as e:
        out["verdicts"].append(type(e).__name__ + ": " + str(e).splitlines()[0])
print(json.dumps(out))
"#;

#[test]
fn the_repos_job_config_schema_refuses_what_harbor_refuses() {
    let configs = json!([
        {"metrics": [{"type": "mean-drop-ei"}]},
        {"metrics": [{"type": "mean"}, {"type": "uv-script", "kwargs": {"script": "s.py"}}]},
        {"metrics": [{"kwargs": {}}]},
        {"metrics": "mean"},
    ]);
    let script = DUMP.replace("json.loads(sys.argv[1])", &format!("json.loads({:?})", configs.to_string()));
    let Some(dump) = harbor_python_json(&script) else { return };
    let mut real: Vec<String> =
        dump["types"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
    let mut ours: Vec<String> = METRIC_TYPES_025.iter().map(|t| t.to_string()).collect();
    real.sort();
    ours.sort();
    assert_eq!(ours, real, "Harbor 0.25's MetricType");
    for (config, verdict) in configs.as_array().unwrap().iter().zip(dump["verdicts"].as_array().unwrap()) {
        for dialect in [HarborDialect::Harbor025, HarborDialect::ExtraBodyFork] {
            let problems = job_config_problems(dialect, config);
            assert_eq!(problems.is_empty(), *verdict == Value::Null, "{config}: ours {problems:?}, Harbor's {verdict}");
        }
    }
}
