//! Contract test: the job-config schema kept in the repo (`launch_spec::versions::job_config_problems`,
//! what preflight checks every job config by, and payload the fork's, since the fork has no
//! `--print-config`) holds against every real Harbor release the CI installs (0.25.0 and 0.26.0,
//! `launch_spec::versions::VERIFIED_HARBORS`): its metric types are Harbor's own `MetricType`; a
//! config the schema refuses Harbor's `JobConfig` refuses too, or accepts while dropping the key the
//! schema named (0.25 ignores 0.26's `schema_version` and `override_error_policy`); one it accepts
//! Harbor accepts and keeps. The retry defaults docs/real-programs.md states for each release are the
//! release's own. Skipped with a note when a real Harbor is not installed; under `CI=true` it fails.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use e2e::harness::harbor_release_python_json;
use launch_spec::versions::{
    ERROR_POLICY_FIELDS_026, HarborDialect, JOB_CONFIG_KEYS_026, METRIC_TYPES_025, VERIFIED_HARBORS,
    job_config_problems,
};
use serde_json::{Value, json};

const DUMP: &str = r#"
import json, sys
from harbor.models.metric.type import MetricType
from harbor.models.job.config import JobConfig, RetryConfig
out = {"types": [m.value for m in MetricType], "verdicts": [], "kept": [],
       "retry_excluded": sorted(RetryConfig().exclude_exceptions or [])}
try:
    from harbor.models.trial.error_policy import ErrorPolicyOverride
    out["error_policy_fields"] = sorted(ErrorPolicyOverride.model_fields)
except ImportError:
    out["error_policy_fields"] = None
for config in json.loads(sys.argv[1]):
    try:
        dumped = JobConfig.model_validate(config).model_dump(mode="json")
        out["verdicts"].append(None)
        out["kept"].append(sorted(k for k in config if k in dumped))
    except Exception as e:
        out["verdicts"].append(type(e).__name__ + ": " + str(e).splitlines()[0])
        out["kept"].append([])
print(json.dumps(out))
"#;

#[test]
fn the_repos_job_config_schema_refuses_what_each_harbor_refuses_or_ignores() {
    let configs = json!([
        {"metrics": [{"type": "mean-drop-ei"}]},
        {"metrics": [{"type": "mean"}, {"type": "uv-script", "kwargs": {"script": "s.py"}}]},
        {"metrics": [{"kwargs": {}}]},
        {"metrics": "mean"},
        {"schema_version": 1, "override_error_policy": {"BadRequestError": {"should_retry": true}}},
        {"schema_version": 2},
        {"override_error_policy": {"BadRequestError": {"retry": true}}},
        {"override_error_policy": {"ApiError": {"has_valid_reward": "maybe"}}},
        {"override_error_policy": {"ApiError": {"has_valid_reward": "yes", "should_grade": 0}}},
        {"override_error_policy": ["BadRequestError"]},
    ]);
    let script = DUMP.replace("json.loads(sys.argv[1])", &format!("json.loads({:?})", configs.to_string()));
    let mut ran = 0;
    for release in VERIFIED_HARBORS {
        let Some(dump) = harbor_release_python_json(*release, &script) else { continue };
        ran += 1;
        let (dialect, _) = HarborDialect::from_declared(&release.to_string()).unwrap();
        let mut real: Vec<String> =
            dump["types"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
        let mut ours: Vec<String> = METRIC_TYPES_025.iter().map(|t| t.to_string()).collect();
        real.sort();
        ours.sort();
        assert_eq!(ours, real, "Harbor {release}'s MetricType");
        let mut known = ERROR_POLICY_FIELDS_026.to_vec();
        known.sort();
        let fields = dialect.has_error_policy().then(|| json!(known));
        assert_eq!(
            dump["error_policy_fields"],
            fields.unwrap_or(Value::Null),
            "Harbor {release}'s ErrorPolicyOverride"
        );
        let verdicts = dump["verdicts"].as_array().unwrap().iter().zip(dump["kept"].as_array().unwrap());
        for (config, (verdict, kept)) in configs.as_array().unwrap().iter().zip(verdicts) {
            let problems = job_config_problems(dialect, config);
            let new_keys: Vec<&str> =
                JOB_CONFIG_KEYS_026.iter().copied().filter(|k| config.get(*k).is_some()).collect();
            let dropped = new_keys.iter().any(|k| !kept.as_array().unwrap().contains(&json!(k)));
            let harbor = if verdict.is_null() { format!("accepted, kept {kept}") } else { verdict.to_string() };
            if problems.is_empty() {
                assert!(verdict.is_null() && !dropped, "Harbor {release}, {config}: ours accepts, Harbor {harbor}");
            } else {
                assert!(
                    !verdict.is_null() || dropped,
                    "Harbor {release}, {config}: ours refuses ({problems:?}), Harbor {harbor}"
                );
            }
        }
        // The retry defaults (issue 35): 0.26 no longer retries these three, and now retries ApiUsageLimitError.
        let excluded: Vec<&str> = dump["retry_excluded"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        for kind in ["BadRequestError", "ContextLengthExceededError", "NonZeroAgentExitCodeError"] {
            assert_eq!(
                excluded.contains(&kind),
                dialect.has_error_policy(),
                "Harbor {release} retries {kind}: {excluded:?}"
            );
        }
        assert_eq!(
            excluded.contains(&"ApiUsageLimitError"),
            !dialect.has_error_policy(),
            "Harbor {release}: {excluded:?}"
        );
        println!(
            "Harbor {release}: {} configs judged as the repo's schema judges them",
            configs.as_array().unwrap().len()
        );
    }
    println!("job config schema contract: {ran} of {} Harbor releases installed", VERIFIED_HARBORS.len());
}
