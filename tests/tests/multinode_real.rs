//! Multi-node argvs against the real vLLM (0.33.0) parser, and the plan's layout
//! (docs/multinode.md).
//!
//! Every rank's argv that `payload plan` shows for a multi-node engine — the 235B-A22B MoE on
//! Leonardo (TP 4 × PP 4 over 4 nodes), the 70B on Vista (PP 2 over 2 one-GPU nodes), and a TP and
//! a DP engine split over two nodes as the multi-node e2e tests run them — is fed to vLLM's own
//! `vllm serve` parser and pre-load checks, and to the vLLM stand-in's (which must agree). The
//! argv comes from the product: `submitter spec`, then `payload::plan::build`. Outside a job the
//! head's address is a placeholder; it is replaced by an IPv4 address, nothing else is changed.
//! Skipped with a note when the vLLM venv is absent (`scripts/install-vllm.sh`; CI installs it).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use e2e::harness::{unique, workspace_bin};
use e2e::vllm_oracle::{self, Checker};
use launch_spec::LaunchSpec;

fn say(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// `submitter spec` for (cluster, model) with placeholder site paths, optionally edited.
fn spec_for(tmp: &Path, cluster: &str, model: &str, edit: impl Fn(&mut serde_json::Value)) -> (PathBuf, LaunchSpec) {
    let out_path = tmp.join(format!("{cluster}-{}.json", model.replace('/', "_")));
    let out = Command::new(workspace_bin("submitter", "submitter"))
        .args(["spec", "--cluster", cluster, "--preset", "tb2", "--model", model, "--out"])
        .arg(&out_path)
        .env("SUBMITTER_HOME", root())
        .env("WORK", tmp.join("work"))
        .env("SCRATCH", tmp.join("scratch"))
        .env("PROJECT", tmp.join("project"))
        .current_dir(root())
        .stdin(Stdio::null())
        .output()
        .expect("run submitter spec");
    assert!(out.status.success(), "submitter spec {cluster} {model}: {}", String::from_utf8_lossy(&out.stderr));
    let mut value: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(&out_path, value.to_string()).unwrap();
    let spec = LaunchSpec::from_file(&out_path).expect("edited spec reads");
    (out_path, spec)
}

fn plan_of(spec_path: &Path, spec: &LaunchSpec, fixture: &str) -> payload::plan::Plan {
    let parent: Vec<(String, String)> = [
        ("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into())),
        ("SLURM_JOB_ID", "4242".to_string()),
        ("PAYLOAD_GPU_FIXTURE", root().join("tests/fixtures").join(fixture).display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    payload::plan::build(spec_path, spec, &parent)
}

/// The plan's per-node argvs (program dropped), the head's placeholder address made an address.
fn node_argvs(plan: &payload::plan::Plan) -> Vec<(String, Vec<String>)> {
    let layout = plan.layout.as_ref().expect("a multi-node plan has a layout");
    layout
        .per_node
        .iter()
        .map(|n| {
            let argv = n.argv[1..]
                .iter()
                .map(|a| if a == payload::multinode::PLAN_ADDR { "10.0.0.1".to_string() } else { a.clone() })
                .collect();
            (format!("rank {} on {}", n.rank, n.node), argv)
        })
        .collect()
}

struct Case {
    label: &'static str,
    cluster: &'static str,
    model: &'static str,
    fixture: &'static str,
    nodes: u32,
    crossing: &'static str,
    edit: fn(&mut serde_json::Value),
}

fn no_edit(_: &mut serde_json::Value) {}

fn cases() -> Vec<Case> {
    vec![
        Case {
            label: "235B-A22B on Leonardo",
            cluster: "leonardo",
            model: "Qwen/Qwen3-235B-A22B-Instruct-2507",
            fixture: "gpus-4x-a100-64gb.json",
            nodes: 4,
            crossing: "pipeline",
            edit: no_edit,
        },
        Case {
            label: "70B on Vista",
            cluster: "vista",
            model: "meta-llama/Llama-3.3-70B-Instruct",
            fixture: "gpus-1x-gh200-96gb.json",
            nodes: 2,
            crossing: "pipeline",
            edit: no_edit,
        },
        Case {
            label: "TP 2 over 2 nodes",
            cluster: "leonardo",
            model: "Qwen/Qwen3-8B",
            fixture: "gpus-4x-a100-64gb.json",
            nodes: 2,
            crossing: "tensor",
            edit: |v| {
                v["serve"]["tensor_parallel_size"] = 2.into();
                v["serve"]["data_parallel_size"] = 1.into();
                v["serve"]["nodes"] = 2.into();
                v["serve"]["distributed_timeout_s"] = 600.into();
            },
        },
        Case {
            label: "DP 4 over 2 nodes",
            cluster: "leonardo",
            model: "Qwen/Qwen3-8B",
            fixture: "gpus-4x-a100-64gb.json",
            nodes: 2,
            crossing: "data",
            edit: |v| {
                v["serve"]["tensor_parallel_size"] = 1.into();
                v["serve"]["data_parallel_size"] = 4.into();
                v["serve"]["nodes"] = 2.into();
            },
        },
    ]
}

#[test]
fn the_plan_shows_a_layout_that_fits_and_every_rank_argv_is_accepted_by_real_vllm() {
    let tmp = std::env::temp_dir().join(format!("multinode-real-{}", unique()));
    std::fs::create_dir_all(&tmp).unwrap();
    let standin = workspace_bin("e2e", "vllm-standin");
    let mut all: Vec<(String, Vec<String>)> = Vec::new();
    for case in cases() {
        let (path, spec) = spec_for(&tmp, case.cluster, case.model, case.edit);
        let plan = plan_of(&path, &spec, case.fixture);
        let layout = plan.layout.as_ref().unwrap_or_else(|| panic!("{}: no layout in the plan", case.label));
        assert_eq!(layout.nodes, case.nodes, "{}", case.label);
        assert_eq!(layout.crossing.as_str(), case.crossing, "{}", case.label);
        assert_eq!(layout.per_node.len() as u32, case.nodes, "{}: one rank per node", case.label);
        // The head's argv in the layout is the engine argv the run spawns.
        assert_eq!(layout.per_node[0].argv, plan.engine.argv, "{}", case.label);
        // The GPUs each node holds fit the node (the plan's own GPU check found no problem).
        assert!(
            !plan.problems.iter().any(|p| p.message.contains("GPU")),
            "{}: {:?}",
            case.label,
            plan.problems.iter().map(|p| &p.message).collect::<Vec<_>>()
        );
        for (who, argv) in node_argvs(&plan) {
            // The stand-in accepts what it is given, as vLLM must (checked below).
            let status = Command::new(&standin)
                .args(&argv)
                .env("STANDIN_VLLM_ARGS_ONLY", "1")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "the stand-in refuses {} {who}: {argv:?}", case.label);
            all.push((format!("{} {who}", case.label), argv));
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let venv = match vllm_oracle::venv(&launch_spec::versions::VERIFIED_VLLM.to_string(), true) {
        Ok(v) => v,
        Err(why) => {
            say(&format!("SKIP (real vLLM half): {why}"));
            return;
        }
    };
    let mut checker = Checker::start(&venv).expect("vLLM checker");
    let mut failures = Vec::new();
    for (label, argv) in &all {
        let verdict = checker.check(argv, &BTreeMap::new()).expect("checker answers");
        if !verdict.ok {
            failures.push(format!("{label}: {} — {argv:?}", verdict.message()));
        }
    }
    say(&format!("real vLLM {} checked {} multi-node argvs", checker.version, all.len()));
    assert!(failures.is_empty(), "real vLLM refuses:\n{}", failures.join("\n"));
}
