//! Planner speed (issue 5): `plan` for ~1,000 real model ids × 3 presets (swebench, v2, tb2) against
//! a ledger holding 10k / 100k / 1M attempt rows (target ≤ 1 s at 100k), on SQLite and PostgreSQL;
//! and the submission loop's own overhead per job (ledger row, spec file, job id; Slurm faked so
//! sbatch's time is excluded; target ≤ 10 ms). Prints figures.
//!
//! Run: `cargo bench -p submitter --bench plan`; `PLAN_BENCH_SIZES=10000,100000` to shorten.

#![allow(clippy::print_stdout)]

#[path = "../tests/common/pg.rs"]
mod pg;

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::json;
use submitter::config::{self, ConfigRoot, lists};
use submitter::decide::Policy;
use submitter::executor::Executor;
use submitter::ledger::{AttemptStatus, ImportedAttempt, Ledger, now, open_ledger};
use submitter::planner::{self, Executables, PlanInputs};
use submitter::queue::SlurmOverrides;
use submitter::registry::Registry;
use submitter::selection::{Concurrency, Leg};
use submitter::slurm::{JobId, JobInfo, Slurm, SlurmError, SubmitRequest};
use submitter::snapshot::Snapshot;
use submitter::spec_build::{SpecBuilder, SpecOverrides};

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// Slurm that accepts every submission at once: the loop's overhead without sbatch's time.
struct InstantSlurm(Cell<u64>);

// The trait requires nothing thread-related; the bench is single-threaded.
impl Slurm for InstantSlurm {
    fn submit(&self, _request: &SubmitRequest) -> Result<JobId, SlurmError> {
        self.0.set(self.0.get() + 1);
        Ok(JobId(self.0.get()))
    }
    fn jobs(&self, _ids: &[JobId]) -> Result<Vec<JobInfo>, SlurmError> {
        Ok(Vec::new())
    }
    fn show(&self, _id: JobId) -> Result<Option<JobInfo>, SlurmError> {
        Ok(None)
    }
    fn find_by_name(&self, _name: &str) -> Result<Vec<JobInfo>, SlurmError> {
        Ok(Vec::new())
    }
    fn find_by_comment(&self, _comment: &str) -> Result<Vec<JobInfo>, SlurmError> {
        Ok(Vec::new())
    }
    fn cancel(&self, _id: JobId, _signal: Option<&str>, _batch_only: bool) -> Result<(), SlurmError> {
        Ok(())
    }
    fn move_to_reservation(&self, _id: JobId, _reservation: &str) -> Result<(), SlurmError> {
        Ok(())
    }
}

fn fill(ledger: &dyn Ledger, models: &[launch_spec::ModelId], rows: usize) {
    const BENCHMARKS: [&str; 3] = ["swebench-verified-random-100-folders", "dev_set_v2", "terminal_bench_2"];
    let base = Utc::now() - chrono::Duration::days(30);
    let mut batch = Vec::with_capacity(50_000);
    for i in 0..rows {
        let pair = i % (models.len() * 3);
        let status = if i % 3 == 0 { AttemptStatus::Failed } else { AttemptStatus::Finished };
        batch.push(ImportedAttempt {
            model: models[pair % models.len()].to_string(),
            benchmark: BENCHMARKS[pair / models.len()].to_string(),
            cluster: "local".into(),
            username: "bench".into(),
            run_tag: format!("bench-{i}"),
            slurm_job_id: Some(i.to_string()),
            status,
            reason: "bench".into(),
            config: json!({"timeout_multiplier": 2.0}),
            metrics: (status == AttemptStatus::Finished).then(|| json!({"mean_reward": 0.5})),
            submitted_at: base + chrono::Duration::milliseconds(i as i64),
            started_at: None,
            ended_at: None,
            source_id: None,
        });
        if batch.len() == 50_000 {
            ledger.import_attempts(&batch).expect("import");
            batch.clear();
        }
    }
    if !batch.is_empty() {
        ledger.import_attempts(&batch).expect("import");
    }
}

fn main() {
    let root = ConfigRoot { root: Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf() };
    let fixtures = root.root.join("../shared/fixtures/otagent");
    let (registry_dir, models) = if fixtures.join("model_config").is_dir() {
        (fixtures.join("model_config"), lists::read_model_list(&fixtures.join("model-names.txt")).unwrap())
    } else {
        println!("note: fixtures absent; shipped registry with synthetic ids");
        (
            root.registry_dir(),
            (0..1000).map(|i| launch_spec::ModelId::new(format!("org/Model-{}B-v{i}", 1 + i % 14)).unwrap()).collect(),
        )
    };
    let cluster = config::load_cluster(&root.clusters_dir(), "local").unwrap();
    let gpus = config::load_gpu_profiles(&root.clusters_dir()).unwrap();
    let registry = Registry::load(&registry_dir).unwrap();
    let harbor = root.harbor_configs_dir();
    let context = SpecBuilder::new(&cluster, &gpus, &registry, &harbor, &root.root);
    let presets: Vec<Leg> = ["swebench", "v2", "tb2"]
        .iter()
        .map(|name| Leg { name: name.to_string(), preset: config::load_preset(&root.presets_dir(), name).unwrap() })
        .collect();
    let policy = Policy {
        max_failed_attempts: 3,
        stale_pending_s: 172_800,
        config_aware: false,
        force: false,
        max_continuations: 5,
    };
    let overrides = SpecOverrides::default();
    let executables = Executables {
        payload_bin: PathBuf::from("/bin/true"),
        script: root.root.join("sbatch/payload.sbatch"),
        prelude: None,
    };
    let environment = |_: &str| None;
    let no_limit = |_: &str| None;
    // Pools are not planned here (allocation: None), so no checkpoint is ever read.
    let no_checkpoint = |spec: &launch_spec::spec::LaunchSpec| Err(format!("{} not read (bench)", spec.model.hf_id));
    let (concurrency, slurm_overrides) = (Concurrency::default(), SlurmOverrides::default());
    let inputs = |context, legs, models| PlanInputs {
        context,
        legs,
        models,
        overrides: &overrides,
        concurrency: &concurrency,
        slurm: &slurm_overrides,
        executables: &executables,
        environment: &environment,
        policy: &policy,
        max_in_flight: 10_000,
        allocation: None,
        max_time: &no_limit,
        checkpoints: &no_checkpoint,
    };
    let no_slurm = InstantSlurm(Cell::new(0));
    let sizes: Vec<usize> = std::env::var("PLAN_BENCH_SIZES")
        .unwrap_or_else(|_| "10000,100000,1000000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let pg_url = pg::test_pg_url().unwrap_or_default();
    println!("plan: {} model ids × 3 presets = {} pairs", models.len(), models.len() * 3);
    for &rows in &sizes {
        let dir = tempfile::tempdir().unwrap();
        let mut backends: Vec<(String, Box<dyn Ledger>)> =
            vec![("sqlite".into(), open_ledger(&format!("sqlite:{}", dir.path().join("l.sqlite").display())).unwrap())];
        let schema = format!("planbench_{}_{rows}", std::process::id());
        if let Ok(mut admin) = ::postgres::Client::connect(&pg_url, ::postgres::NoTls) {
            admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")).unwrap();
            let sep = if pg_url.contains('?') { '&' } else { '?' };
            backends.push((
                "postgres".into(),
                open_ledger(&format!("{pg_url}{sep}options=-c%20search_path%3D{schema}")).unwrap(),
            ));
        } else {
            println!("note: PostgreSQL unreachable at {}; SQLite only", submitter::ledger::redact_url(&pg_url));
        }
        for (name, ledger) in &backends {
            let start = Instant::now();
            fill(ledger.as_ref(), &models, rows);
            let filled = start.elapsed();
            let samples: Vec<Duration> = (0..5)
                .map(|_| {
                    let start = Instant::now();
                    let snapshot = Snapshot::read(ledger.as_ref(), &no_slurm, "local", now()).unwrap();
                    let planned = planner::plan(&inputs(&context, &presets, &models), &snapshot);
                    std::hint::black_box(planned.jobs.len());
                    start.elapsed()
                })
                .collect();
            println!(
                "{name:<8} {rows:>8} rows: fill {:>9}, plan median {:>9} (5 runs; target ≤ 1 s at 100k)",
                ms(filled),
                ms(median(samples))
            );
        }
        if let Ok(mut admin) = ::postgres::Client::connect(&pg_url, ::postgres::NoTls) {
            let _ = admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
        }
    }

    // Submission loop overhead: 200 jobs, no delay, instant Slurm.
    let dir = tempfile::tempdir().unwrap();
    let ledger = open_ledger(&format!("sqlite:{}", dir.path().join("s.sqlite").display())).unwrap();
    let mut local = cluster.clone();
    local.paths.jobs_dir = dir.path().join("jobs");
    local.limits.max_jobs_in_flight = 10_000;
    let context = context.with_cluster(&local);
    let snapshot = Snapshot::read(ledger.as_ref(), &no_slurm, &local.name, now()).unwrap();
    let few: Vec<launch_spec::ModelId> = models.iter().take(200).cloned().collect();
    let tb2 = &presets[2..];
    let planned = planner::plan(&inputs(&context, tb2, &few), &snapshot);
    let slurm = InstantSlurm(Cell::new(0));
    let prepare = |_: &planner::PlannedJob, _: &launch_spec::LaunchSpec| Ok(());
    let recorder = submitter::transition::Recorder::new(ledger.as_ref(), None);
    let executor = Executor {
        recorder: &recorder,
        slurm: &slurm,
        cluster: &local.name,
        username: "bench".into(),
        delay: Duration::ZERO,
        chain_batch: 0,
        prepare: &prepare,
        dry_run: false,
    };
    let start = Instant::now();
    let submitted = executor.execute(&planned).unwrap();
    let per_job = start.elapsed() / submitted.len().max(1) as u32;
    println!(
        "submission loop: {} jobs, {} per job beyond delay and sbatch (target ≤ 10 ms)",
        submitted.len(),
        ms(per_job)
    );
}
