//! Pools (issue 37), the submitter's side, on the real local Slurm: `--allocation pool` puts
//! fine-tunes whose checkpoints agree into one held job (one sbatch, `pool.json` naming each
//! model's checkpoint and legs, one job id on every leg's attempt), a model of another
//! architecture is planned apart with the reason; `cancel` of one model writes `cancel.request` for
//! its legs only and leaves the pool queued; a pool that ends before some models' turn (their legs
//! have no record) has those legs continued, in a new pool, by the next launch. Each leg's outcome
//! is written by hand, as payload writes it; payload's side of the pool is tested in payload's crate.

#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use launch_spec::pool::PoolJobSpec;
use launch_spec::records::OutcomeClass;
use launch_spec::shared::CANCEL_REQUEST_FILE;
use serde_json::{Value, json};
use submitter::ledger::{Attempt, AttemptStatus, Ledger, open_ledger};

use crate::ledger::Store;
use crate::queueing::{TestCluster, scancel, wait_until};
use crate::shared_alloc::{Cleanup, held_cluster, in_squeue, run_dir, run_ok, write_outcome};
use crate::support::slurm_up;

const POOLED: [&str; 4] = ["test/FtA-1B", "test/FtB-1B", "test/FtC-1B", "test/FtD-1B"];
const OTHER: &str = "test/Other-1B";

/// A checkpoint in the profile's HF cache, as staging leaves it: Qwen3-like files, `hidden_size` as given.
fn stage_checkpoint(cache: &Path, model: &str, hidden_size: u64) -> PathBuf {
    let revision = "0123456789abcdef0123456789abcdef01234567";
    let repo = cache.join(format!("models--{}", model.replace('/', "--")));
    let snapshot = repo.join("snapshots").join(revision);
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::write(repo.join("refs/main"), revision).unwrap();
    let config = json!({"architectures": ["Qwen3ForCausalLM"], "hidden_size": hidden_size, "num_hidden_layers": 2,
                        "_name_or_path": model, "tie_word_embeddings": true});
    std::fs::write(snapshot.join("config.json"), config.to_string()).unwrap();
    std::fs::write(snapshot.join("tokenizer.json"), r#"{"model":{"type":"BPE"}}"#).unwrap();
    std::fs::write(snapshot.join("tokenizer_config.json"), r#"{"chat_template":"{{ messages }}"}"#).unwrap();
    std::fs::write(snapshot.join("generation_config.json"), r#"{"temperature":0.6}"#).unwrap();
    snapshot
}

fn pool_cluster(name: &str) -> TestCluster {
    let cluster = held_cluster(name);
    let cache = cluster.root().join("hf");
    for model in POOLED {
        stage_checkpoint(&cache, model, 64);
    }
    stage_checkpoint(&cache, OTHER, 128);
    let profile = cluster.root().join("clusters").join(format!("{name}.yaml"));
    let hf = format!("paths:\n  hf_cache: {}\n", cache.display());
    std::fs::write(&profile, std::fs::read_to_string(&profile).unwrap().replace("paths:\n", &hf)).unwrap();
    cluster
}

fn pool_args(list: &str) -> Vec<&str> {
    vec!["--preset", "ID", "--allocation", "pool", "--models-file", list]
}

/// The active attempts of `model`.
fn legs_of(ledger: &dyn Ledger, model: &str) -> Vec<Attempt> {
    ledger.active().unwrap().into_iter().filter(|a| a.model == model).collect()
}

/// `plan` shows one pool of the four fine-tunes, in order, and the model of another width apart;
/// `launch` submits the pool as one held job with `pool.json`; cancel of one model stops its legs
/// only; after the job ends with one model finished, the two models whose turn never came are
/// continued together in a new pool.
#[test]
fn fine_tunes_share_one_pool_cancel_per_model_and_the_rest_continued_in_another() {
    if !slurm_up() {
        eprintln!("skipping: no local Slurm");
        return;
    }
    let store = Store::sqlite();
    let ledger_spec = &store.spec;
    let cluster = pool_cluster("pool-launch");
    let models = cluster.models_file(&[POOLED[0], OTHER, POOLED[1], POOLED[2], POOLED[3]]);
    let list = models.to_str().unwrap();
    let plan = run_ok(&cluster, ledger_spec, &["plan"], &pool_args(list));
    let pool_lines: Vec<&str> = plan.lines().filter(|l| l.starts_with("pool ")).collect();
    assert_eq!(pool_lines.len(), 1, "{plan}");
    assert!(
        pool_lines[0].contains("4 models, 12 legs")
            && pool_lines[0].contains("test/FtA-1B (3) → test/FtB-1B (3) → test/FtC-1B (3) → test/FtD-1B (3)"),
        "{plan}"
    );
    assert!(plan.contains("3 swap(s)"), "the time budget: {plan}");
    assert!(
        plan.contains("test/Other-1B: allocation pool, but pool: not pooled with test/FtA-1B: config.json `hidden_size` differs (64 vs 128); planned apart"),
        "{plan}"
    );
    let json: Value =
        serde_json::from_str(&run_ok(&cluster, ledger_spec, &["plan"], &[&pool_args(list)[..], &["--json"]].concat()))
            .unwrap();
    let pool = json["shared"].as_array().unwrap().iter().find(|g| g.get("pool").is_some()).unwrap();
    let members: Vec<&str> =
        pool["pool"]["members"].as_array().unwrap().iter().filter_map(|m| m["model"].as_str()).collect();
    assert_eq!(members, POOLED, "{pool:#}");
    let argv: Vec<&str> = pool["sbatch"].as_array().unwrap().iter().filter_map(|a| a.as_str()).collect();
    assert_eq!(argv[argv.len() - 2], "--pool", "{argv:?}");
    let out = run_ok(&cluster, ledger_spec, &["launch"], &[&["--once"][..], &pool_args(list)].concat());
    let ledger = open_ledger(ledger_spec).unwrap();
    let _cleanup = Cleanup(ledger_spec.clone());
    assert_eq!(ledger.active().unwrap().len(), 15, "5 models × 3 legs: {out}");
    let pooled: Vec<Attempt> = POOLED.iter().flat_map(|m| legs_of(&*ledger, m)).collect();
    let job = pooled[0].slurm_job_id.clone().unwrap();
    assert!(pooled.iter().all(|a| a.slurm_job_id.as_deref() == Some(job.as_str())), "one job: {out}");
    let other = legs_of(&*ledger, OTHER);
    assert!(other.iter().all(|a| a.slurm_job_id.is_some() && a.slurm_job_id != Some(job.clone())), "apart: {out}");
    let group_dir = PathBuf::from(pooled[0].config["shared"]["group_dir"].as_str().unwrap());
    let doc = PoolJobSpec::from_file(&group_dir.join("pool.json")).unwrap();
    let order: Vec<&str> = doc.members.iter().map(|m| m.model.as_str()).collect();
    assert_eq!(order, POOLED);
    for (m, member) in doc.members.iter().enumerate() {
        assert!(member.weights.path.ends_with(format!("snapshots/{}", "0123456789abcdef0123456789abcdef01234567")));
        assert_eq!(member.weights.revision.as_deref(), Some("0123456789abcdef0123456789abcdef01234567"));
        for leg in legs_of(&*ledger, &member.model) {
            assert!(member.legs.contains(&run_dir(&leg).join("launch.json")), "{}", leg.run_tag);
            assert_eq!(leg.config["pool"]["member"], m, "{}", leg.config);
        }
    }
    // Cancel one model of the pool: its three legs only, by file; the pool stays queued.
    let out = run_ok(&cluster, ledger_spec, &["cancel"], &["--model", POOLED[1]]);
    assert_eq!(out.matches("this leg only").count(), 3, "{out}");
    for leg in &pooled {
        let requested = run_dir(leg).join(CANCEL_REQUEST_FILE).exists();
        assert_eq!(requested, leg.model == POOLED[1], "{}", leg.run_tag);
        let status = ledger.attempt(leg.id).unwrap().unwrap().status;
        let want = if leg.model == POOLED[1] { AttemptStatus::Cancelled } else { AttemptStatus::Pending };
        assert_eq!(status, want, "{}", leg.run_tag);
    }
    assert!(in_squeue(&job), "the pool is never scancelled for one model");
    // The job ends after the first model: its legs finished, the others' have no record.
    for leg in legs_of(&*ledger, POOLED[0]) {
        write_outcome(&leg, OutcomeClass::Finished, "harbor finished");
        std::fs::write(
            run_dir(&leg).join("result.json"),
            r#"{"n_total_trials": 2, "finished_at": "2026-12-01T11:00:00", "stats": {"n_completed_trials": 2, "n_errored_trials": 0,
                "evals": {"e": {"n_trials": 2, "n_errors": 0, "metrics": [{"mean": 0.5}], "reward_stats": {"reward": {"1.0": ["a__x"], "0.0": ["b__y"]}}}}}}"#,
        )
        .unwrap();
    }
    scancel(&job);
    wait_until("the pool to leave the queue", Duration::from_secs(60), || !in_squeue(&job));
    run_ok(&cluster, ledger_spec, &["sync"], &[]);
    let not_started: Vec<Attempt> =
        pooled.iter().filter(|a| [POOLED[2], POOLED[3]].contains(&a.model.as_str())).cloned().collect();
    for leg in &not_started {
        let after = ledger.attempt(leg.id).unwrap().unwrap();
        assert_eq!(after.status, AttemptStatus::Failed, "{}", leg.run_tag);
        assert!(
            after.reason.starts_with("not started: pool job") && after.reason.contains("continued in another pool"),
            "{}",
            after.reason
        );
    }
    for leg in pooled.iter().filter(|a| a.model == POOLED[0]) {
        assert_eq!(ledger.attempt(leg.id).unwrap().unwrap().status, AttemptStatus::Finished);
    }
    // The next launch: the two models whose turn never came continued, the cancelled one
    // resubmitted (a cancel ends an attempt, not the pair), together in a new pool; the finished
    // model is not run again.
    let out = run_ok(&cluster, ledger_spec, &["launch"], &[&["--once"][..], &pool_args(list)].concat());
    assert!(legs_of(&*ledger, POOLED[0]).is_empty(), "{out}");
    assert_eq!(legs_of(&*ledger, POOLED[1]).len(), 3, "{out}");
    let again: Vec<Attempt> = [POOLED[2], POOLED[3]].iter().flat_map(|m| legs_of(&*ledger, m)).collect();
    assert_eq!(again.len(), 6, "{out}");
    let second = again[0].slurm_job_id.clone().unwrap();
    assert_ne!(second, job);
    assert!(again.iter().all(|a| a.slurm_job_id.as_deref() == Some(second.as_str())), "one new pool: {out}");
    for leg in &again {
        let before = not_started.iter().find(|a| a.model == leg.model && a.benchmark == leg.benchmark).unwrap();
        assert_eq!(
            (leg.run_tag.as_str(), leg.config["continues"].as_i64()),
            (before.run_tag.as_str(), Some(before.id.0))
        );
    }
    let new_dir = PathBuf::from(again[0].config["shared"]["group_dir"].as_str().unwrap());
    assert_ne!(new_dir, group_dir);
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(new_dir.join("pool.json")).unwrap()).unwrap();
    let order: Vec<&str> = doc["members"].as_array().unwrap().iter().filter_map(|m| m["model"].as_str()).collect();
    assert_eq!(order, POOLED[1..], "{doc:#}");
}
