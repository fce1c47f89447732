//! The team's database (OT-Agent schema) on the real local PostgreSQL: `submitter import` into a
//! SQLite and a PostgreSQL ledger, then `plan`, `unevaluated`, `results` and `families` on what it
//! imported. Each test creates the schema in a schema of its own (`team_<test>_<pid>_<n>`) from
//! `tests/sql/ot_agent_schema.sql` and writes realistic rows itself — including other users' rows.
//! Without a reachable PostgreSQL these print `skipping: no PostgreSQL` (and fail in CI).

#![allow(clippy::print_stderr)]

use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use postgres::Client;
use serde_json::Value;
use submitter::ledger::{AttemptStatus, open_ledger};

use crate::ledger::{Store, pg_admin, pg_url, with_param};
use crate::queueing::{TestCluster, text};

/// One OT-Agent schema in a schema of its own, dropped at the end.
pub(crate) struct TeamDb {
    pub(crate) url: String,
    pub(crate) client: Client,
    name: String,
}

impl TeamDb {
    pub(crate) fn new(test: &str) -> Option<TeamDb> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let mut client = pg_admin()?;
        let name = format!("team_{test}_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let ddl = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sql/ot_agent_schema.sql"))
            .expect("schema file");
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}; SET search_path = {name}"
            ))
            .expect("create schema");
        client.batch_execute(&ddl).expect("apply the OT-Agent schema");
        let url = with_param(&pg_url(), &format!("options=-c%20search_path%3D{name}"));
        Some(TeamDb { url, client, name })
    }

    pub(crate) fn exec(&mut self, sql: &str) {
        self.client.batch_execute(sql).unwrap_or_else(|e| panic!("{e}: {sql}"));
    }

    /// A checksum of every row of the three tables (read-only checks).
    pub(crate) fn checksum(&mut self) -> String {
        let row = self
            .client
            .query_one(
                "SELECT md5(concat((SELECT string_agg(t::text, '|' ORDER BY id) FROM models t),
                                   (SELECT string_agg(t::text, '|' ORDER BY id) FROM benchmarks t),
                                   (SELECT string_agg(t::text, '|' ORDER BY id) FROM sandbox_jobs t)))",
                &[],
            )
            .unwrap();
        row.get(0)
    }
}

impl Drop for TeamDb {
    fn drop(&mut self) {
        let _ = self.client.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
    }
}

/// The team's history in miniature: base models, a duplicate model, a model without a size token
/// (its base has one), an MoE, a precomputed row; a benchmark family via `duplicate_of`; jobs in
/// every status, by three users.
pub(crate) const HISTORY: &str = "
INSERT INTO models (id, name, base_model_id, created_by, duplicate_of) VALUES
  ('00000000-0000-0000-0000-000000000001', 'Qwen/Qwen3-8B', NULL, 'hf', NULL),
  ('00000000-0000-0000-0000-000000000002', 'Qwen/Qwen3-32B', NULL, 'hf', NULL),
  ('00000000-0000-0000-0000-000000000003', 'org/Alpha-8B', '00000000-0000-0000-0000-000000000001', 'alice', NULL),
  ('00000000-0000-0000-0000-000000000004', 'org/Alpha-8B-copy', NULL, 'alice', '00000000-0000-0000-0000-000000000003'),
  ('00000000-0000-0000-0000-000000000005', 'org/sft-run-a', '00000000-0000-0000-0000-000000000002', 'bob', NULL),
  ('00000000-0000-0000-0000-000000000006', 'org/Mixer-30B-A3B', NULL, 'carol', NULL),
  ('00000000-0000-0000-0000-000000000007', 'hf/precomputed-7B', NULL, 'precomputed_hf', NULL);
INSERT INTO benchmarks (id, name, duplicate_of) VALUES
  ('10000000-0000-0000-0000-000000000001', 'terminal_bench_2', NULL),
  ('10000000-0000-0000-0000-000000000002', 'dev_set_v2', NULL),
  ('10000000-0000-0000-0000-000000000003', 'dev_set_v2_3.0x', '10000000-0000-0000-0000-000000000002');
INSERT INTO sandbox_jobs (id, job_name, username, job_status, submitted_at, started_at, ended_at, slurm_job_id,
                          config, metrics, stats, model_id, benchmark_id, n_trials, n_rep_eval, package_version) VALUES
  ('20000000-0000-0000-0000-000000000001', 'terminal_bench_2__org__Alpha-8B', 'alice', 'Finished',
   now() - interval '3 days', now() - interval '3 days', now() - interval '2 days', '881',
   '{\"agent\": \"terminus-2\", \"env\": \"daytona\", \"timeout_multiplier\": 1.0}',
   '[{\"mean\": 0.41}]', '{\"n_trials\": 89, \"n_errors\": 4, \"n_infra_errors\": 2}',
   '00000000-0000-0000-0000-000000000003', '10000000-0000-0000-0000-000000000001', 89, 3, '0.3.1'),
  ('20000000-0000-0000-0000-000000000002', 'dev_set_v2_3.0x__org__Alpha-8B-copy', 'alice', 'Finished',
   now() - interval '5 days', now() - interval '5 days', now() - interval '4 days', '702',
   '{\"agent\": \"terminus-2\", \"timeout_multiplier\": 3.0}', '[{\"mean\": 0.2}]', '{\"n_trials\": 100}',
   '00000000-0000-0000-0000-000000000004', '10000000-0000-0000-0000-000000000003', 100, 3, '0.3.1'),
  ('20000000-0000-0000-0000-000000000003', 'terminal_bench_2__org__sft-run-a', 'bob', 'Started',
   now() - interval '2 hours', now() - interval '1 hour', NULL, '1007',
   '{\"agent\": \"terminus-2\", \"timeout_multiplier\": 1.0}', NULL, NULL,
   '00000000-0000-0000-0000-000000000005', '10000000-0000-0000-0000-000000000001', 0, 0, '0.3.1'),
  ('20000000-0000-0000-0000-000000000004', 'dev_set_v2__org__sft-run-a', 'bob', 'Pending',
   now() - interval '5 days', NULL, NULL, 'pending',
   '{\"agent\": \"terminus-2\", \"timeout_multiplier\": 1.0}', NULL, NULL,
   '00000000-0000-0000-0000-000000000005', '10000000-0000-0000-0000-000000000002', 0, 0, 'unknown'),
  ('20000000-0000-0000-0000-000000000005', 'terminal_bench_2__Qwen__Qwen3-32B', 'alice', 'Finished',
   now() - interval '9 days', now() - interval '9 days', now() - interval '8 days', '640',
   '{\"agent\": \"terminus-2\", \"timeout_multiplier\": 1.0}', '{}', '{}',
   '00000000-0000-0000-0000-000000000002', '10000000-0000-0000-0000-000000000001', 89, 3, '0.3.1'),
  ('20000000-0000-0000-0000-000000000006', 'terminal_bench_2__org__Mixer-30B-A3B', 'carol', 'Failed',
   now() - interval '6 days', now() - interval '6 days', now() - interval '6 days', '655',
   '{\"agent\": \"terminus-2\"}', NULL, NULL,
   '00000000-0000-0000-0000-000000000006', '10000000-0000-0000-0000-000000000001', 0, 0, '0.3.1');
-- A row is created when it is first submitted.
UPDATE sandbox_jobs SET created_at = submitted_at;
";

/// Plans for 32B models need more than the queueing tests' one GPU per node.
pub(crate) fn four_gpus(profile: &mut String) {
    *profile = profile.replace("gpus_per_node: 1", "gpus_per_node: 4");
}

fn run(cluster: &TestCluster, ledger: &str, command: &[&str], args: &[&str], team_url: &str) -> Output {
    cluster.run(command, ledger, args, &[("SUBMITTER_TEAM_DB", team_url), ("SUBMITTER_LOG", "info")])
}

/// The line of `plan` output for `model` on `benchmark`.
fn plan_line<'a>(plan: &'a str, model: &str, benchmark: &str) -> &'a str {
    plan.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(model) && l.split_whitespace().nth(2) == Some(benchmark))
        .unwrap_or_else(|| panic!("no plan line for {model} {benchmark}:\n{plan}"))
}

fn import_history(ledger_spec: &str, tag: &str) {
    let Some(mut team) = TeamDb::new(&format!("hist{tag}")) else { return };
    team.exec(HISTORY);
    let before = team.checksum();
    let cluster = TestCluster::new(&format!("import-{tag}"), four_gpus);

    // A password on the command line is refused, without echoing it.
    if let Some(password) = submitter_password(&team.url) {
        let out = cluster.run(&["import"], ledger_spec, &["--from", &team.url], &[]);
        let message = text(&out);
        assert_eq!(out.status.code(), Some(2), "{message}");
        assert!(message.contains("SUBMITTER_TEAM_DB") && message.contains("password"), "{message}");
        assert!(!message.contains(&password), "password leaked: {message}");
    }

    let out = run(&cluster, ledger_spec, &["import"], &[], &team.url);
    let first = text(&out);
    assert!(out.status.success(), "{first}");
    assert!(first.contains("6 job(s) read, 6 new, 0 updated"), "{first}");
    assert!(first.contains("5 model(s) added, 1 family mapping(s) set"), "{first}");
    assert_eq!(team.checksum(), before, "the source is read, never written");

    let ledger = open_ledger(ledger_spec).unwrap();
    assert_eq!(ledger.family_of("dev_set_v2_3.0x").unwrap(), "dev_set_v2");
    let mut catalogue: Vec<String> = ledger.list_models().unwrap().into_iter().map(|m| m.id).collect();
    catalogue.sort();
    assert_eq!(catalogue, ["Qwen/Qwen3-32B", "Qwen/Qwen3-8B", "org/Alpha-8B", "org/Mixer-30B-A3B", "org/sft-run-a"]);
    let alpha = ledger.attempts_for("org/Alpha-8B", "dev_set_v2").unwrap();
    assert_eq!(alpha.len(), 1, "the duplicate model's job counts for its canonical model");
    assert_eq!((alpha[0].status, alpha[0].benchmark.as_str()), (AttemptStatus::Finished, "dev_set_v2_3.0x"));
    let tb2 = &ledger.attempts_for("org/Alpha-8B", "terminal_bench_2").unwrap()[0];
    let metrics = tb2.metrics.as_ref().unwrap();
    assert_eq!(metrics["mean_reward"].as_f64(), Some(0.41));
    assert_eq!((metrics["n_trials"].as_i64(), metrics["n_infra_errors"].as_i64()), (Some(89), Some(2)));
    assert_eq!((tb2.username.as_str(), tb2.slurm_job_id.as_deref()), ("alice", Some("881")));
    assert_eq!(tb2.config["timeout_multiplier"].as_f64(), Some(1.0));
    let pending = &ledger.attempts_for("org/sft-run-a", "dev_set_v2").unwrap()[0];
    assert_eq!(pending.status, AttemptStatus::Cancelled, "5-day-old Pending is stale: {}", pending.reason);
    assert_eq!(pending.slurm_job_id, None, "the \"pending\" placeholder is no job id");

    // Dedup uses it: finished pairs are skipped, the running one is another cluster's, cleared
    // metrics and failures are resubmitted, the rest submitted.
    let list = cluster.models_file(&["org/Alpha-8B", "org/sft-run-a", "Qwen/Qwen3-32B", "org/Mixer-30B-A3B"]);
    let out = cluster.run(
        &["plan"],
        ledger_spec,
        &["--preset", "tb2", "--preset", "v2", "--models-file", list.to_str().unwrap()],
        &[],
    );
    let plan = text(&out);
    assert!(out.status.success(), "{plan}");
    assert!(plan_line(&plan, "org/Alpha-8B", "terminal_bench_2").starts_with("skip"), "{plan}");
    assert!(plan_line(&plan, "org/Alpha-8B", "dev_set_v2").contains("finished"), "{plan}");
    assert!(plan_line(&plan, "org/Alpha-8B", "dev_set_v2").starts_with("skip"), "{plan}");
    assert!(
        plan_line(&plan, "org/sft-run-a", "terminal_bench_2").contains("in progress on ot-agent, job 1007"),
        "{plan}"
    );
    assert!(plan_line(&plan, "org/sft-run-a", "dev_set_v2").starts_with("resubmit"), "{plan}");
    assert!(plan_line(&plan, "Qwen/Qwen3-32B", "terminal_bench_2").contains("metrics cleared"), "{plan}");
    assert!(plan_line(&plan, "org/Mixer-30B-A3B", "terminal_bench_2").contains("previous attempt failed"), "{plan}");
    assert!(plan_line(&plan, "org/Mixer-30B-A3B", "dev_set_v2").starts_with("submit"), "{plan}");

    // unevaluated: the 32B class is a band (MoE by total size), the base model fills in a size.
    let out = cluster.run(&["unevaluated"], ledger_spec, &["--benchmark", "dev_set_v2_3.0x", "--size", "32"], &[]);
    let mut listed: Vec<String> = text(&out).lines().filter(|l| !l.starts_with('#')).map(String::from).collect();
    listed.sort();
    assert_eq!(listed, ["Qwen/Qwen3-32B", "org/Mixer-30B-A3B", "org/sft-run-a"], "{}", text(&out));
    let out = cluster.run(&["unevaluated"], ledger_spec, &["--benchmark", "dev_set_v2", "--size", "8"], &[]);
    let listed: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(listed, ["Qwen/Qwen3-8B"], "Alpha is scored through its duplicate");

    // results shows the imported score.
    let out = cluster.run(&["results"], ledger_spec, &["--json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let results = String::from_utf8_lossy(&out.stdout);
    assert!(results.contains("org/Alpha-8B") && results.contains("0.41"), "{results}");

    // families list shows the imported family.
    let out = cluster.run(&["families", "list"], ledger_spec, &[], &[]);
    assert!(text(&out).lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["dev_set_v2_3.0x", "dev_set_v2"]));

    // Idempotent: a re-run writes nothing.
    let out = run(&cluster, ledger_spec, &["import"], &[], &team.url);
    let again = text(&out);
    assert!(out.status.success() && again.contains("0 new, 0 updated"), "{again}");
    assert!(again.contains("0 model(s) added, 0 family mapping(s) set"), "{again}");

    // Incremental: bob's running job finishes, a new one is queued — only those two are written.
    team.exec(
        "UPDATE sandbox_jobs SET job_status = 'Finished', ended_at = now(), metrics = '[{\"mean\": 0.37}]',
                                 stats = '{\"n_infra_errors\": 1}', n_trials = 89
         WHERE id = '20000000-0000-0000-0000-000000000003';
         INSERT INTO sandbox_jobs (job_name, username, job_status, submitted_at, slurm_job_id, config, model_id, benchmark_id)
         VALUES ('terminal_bench_2__Qwen__Qwen3-8B', 'dave', 'Pending', now(), '1010', '{\"timeout_multiplier\": 1.0}',
                 '00000000-0000-0000-0000-000000000001', '10000000-0000-0000-0000-000000000001');",
    );
    let out = run(&cluster, ledger_spec, &["import"], &[], &team.url);
    let third = text(&out);
    assert!(out.status.success(), "{third}");
    assert!(third.contains("2 job(s) read, 1 new, 1 updated"), "only rows past the watermark: {third}");
    let sft = &ledger.attempts_for("org/sft-run-a", "terminal_bench_2").unwrap()[0];
    assert_eq!(sft.status, AttemptStatus::Finished);
    assert_eq!(sft.metrics.as_ref().unwrap()["mean_reward"].as_f64(), Some(0.37));
    let queued = &ledger.attempts_for("Qwen/Qwen3-8B", "terminal_bench_2").unwrap()[0];
    assert_eq!(
        (queued.status, queued.cluster.as_str(), queued.username.as_str()),
        (AttemptStatus::Pending, "ot-agent", "dave")
    );
    // A row active here is re-read even when no time of it moved (a script failed it in place).
    team.exec("UPDATE sandbox_jobs SET job_status = 'Failed' WHERE username = 'dave'");
    let out = run(&cluster, ledger_spec, &["import"], &[], &team.url);
    assert!(text(&out).contains("1 updated"), "{}", text(&out));
    assert_eq!(ledger.attempt(queued.id).unwrap().unwrap().status, AttemptStatus::Failed);
    // --full re-reads everything and still writes nothing new.
    let out = run(&cluster, ledger_spec, &["import"], &["--full"], &team.url);
    assert!(text(&out).contains("7 job(s) read, 0 new, 0 updated, 7 unchanged"), "{}", text(&out));
    assert_eq!(ledger.latest_per_pair().unwrap().iter().map(|p| p.total_attempts).sum::<u32>(), 7);
}

fn submitter_password(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let userinfo = rest.rsplit_once('@')?.0;
    userinfo.split_once(':').map(|(_, p)| p.to_string()).filter(|p| p.len() >= 4)
}

#[test]
fn import_team_history_sqlite() {
    import_history(&Store::sqlite().spec, "sq");
}

#[test]
fn import_team_history_postgres() {
    if let Some(store) = Store::postgres("teamhist") {
        import_history(&store.spec, "pg");
    }
}

/// 100,000 attempts over 1,000 models × 3 benchmarks (33–34 per pair, the latest finished with
/// metrics): the import's wall time is printed (the ≤ 10 s target is for the optimised build), and
/// `plan` over those models and the ID presets skips every pair.
fn import_100k(ledger_spec: &str, tag: &str) {
    let Some(mut team) = TeamDb::new(&format!("big{tag}")) else { return };
    team.exec(
        "INSERT INTO models (id, name, created_by)
           SELECT ('00000000-0000-0000-0000-' || lpad(i::text, 12, '0'))::uuid, 'bench/Model' || i || '-8B', 'alice'
           FROM generate_series(0, 999) i;
         INSERT INTO benchmarks (id, name) VALUES
           ('10000000-0000-0000-0000-000000000000', 'terminal_bench_2'),
           ('10000000-0000-0000-0000-000000000001', 'dev_set_v2'),
           ('10000000-0000-0000-0000-000000000002', 'swebench-verified-random-100-folders');
         INSERT INTO sandbox_jobs (job_name, username, job_status, submitted_at, started_at, ended_at, slurm_job_id,
                                   config, metrics, stats, model_id, benchmark_id, n_trials, created_at)
           SELECT 'run-' || g, CASE WHEN g % 7 = 0 THEN 'bob' ELSE 'alice' END,
                  CASE WHEN g >= 97000 THEN 'Finished' ELSE 'Failed' END,
                  t, t, t + interval '1 hour', (100000 + g)::text,
                  '{\"agent\": \"terminus-2\", \"env\": \"daytona\", \"timeout_multiplier\": 1.0}'::jsonb,
                  CASE WHEN g >= 97000 THEN jsonb_build_array(jsonb_build_object('mean', (g % 100) / 100.0)) END,
                  '{\"n_infra_errors\": 0}'::jsonb,
                  ('00000000-0000-0000-0000-' || lpad(((g % 3000) % 1000)::text, 12, '0'))::uuid,
                  ('10000000-0000-0000-0000-' || lpad(((g % 3000) / 1000)::text, 12, '0'))::uuid,
                  89, t
           FROM (SELECT g, now() - interval '100 days' + g * interval '1 minute' AS t
                 FROM generate_series(0, 99999) g) s;",
    );
    let cluster = TestCluster::new(&format!("big-{tag}"), four_gpus);
    let started = Instant::now();
    let out = run(&cluster, ledger_spec, &["import"], &["--json"], &team.url);
    let wall = started.elapsed().as_secs_f64();
    assert!(out.status.success(), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("import of 100k attempts into {tag}: {wall:.2} s wall ({:.2} s inside import)", report["seconds"]);
    assert_eq!(report["attempts_new"], 100_000, "{report}");
    // Speed is a figure, not an assertion (a loaded CI machine must not fail it): the line above
    // prints it; the ≤ 10 s target is for the optimised build, `cargo test --release -p submitter
    // --test it import_of_100k`.
    let models: Vec<String> = (0..1000).map(|i| format!("bench/Model{i}-8B")).collect();
    let refs: Vec<&str> = models.iter().map(String::as_str).collect();
    let list = cluster.models_file(&refs);
    let out = cluster.run(&["plan"], ledger_spec, &["--preset", "ID", "--models-file", list.to_str().unwrap()], &[]);
    let plan = text(&out);
    assert!(out.status.success(), "{}", &plan[plan.len().saturating_sub(2000)..]);
    assert!(plan.contains("0 submit, 0 resubmit, 3000 skip"), "{}", &plan[plan.len().saturating_sub(2000)..]);
    let ledger = open_ledger(ledger_spec).unwrap();
    assert_eq!(ledger.latest_per_pair().unwrap().len(), 3000);
    // A re-run reads nothing new (the overlap re-reads the last minutes, which are unchanged).
    let out = run(&cluster, ledger_spec, &["import"], &["--json"], &team.url);
    let again: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((again["attempts_new"].as_u64(), again["attempts_updated"].as_u64()), (Some(0), Some(0)), "{again}");
}

#[test]
fn import_of_100k_attempts_is_fast_sqlite() {
    import_100k(&Store::sqlite().spec, "sq");
}

#[test]
fn import_of_100k_attempts_is_fast_postgres() {
    if let Some(store) = Store::postgres("teambig") {
        import_100k(&store.spec, "pg");
    }
}

/// `launch --mirror` / `sync --mirror` on the real local Slurm: the attempt appears in the team's
/// `sandbox_jobs` as Pending (before sbatch, then with its job id) and ends Finished with its
/// metrics and infra-error counts; another user's row for the same model, benchmark and run tag
/// is never touched; a later import knows the row is this ledger's own.
fn mirrored_run(ledger_spec: &str, tag: &str) {
    let Some(mut team) = TeamDb::new(&format!("mirror{tag}")) else { return };
    team.exec(HISTORY);
    let run_tag = submitter::registry::names::run_tag("terminal_bench_2", "test/Tiny-1B");
    team.exec(&format!(
        "INSERT INTO models (id, name, created_by) VALUES ('00000000-0000-0000-0000-000000000009', 'test/Tiny-1B', 'carol');
         INSERT INTO sandbox_jobs (id, job_name, username, job_status, submitted_at, started_at, slurm_job_id, config,
                                   model_id, benchmark_id)
         VALUES ('20000000-0000-0000-0000-000000000009', '{run_tag}', 'carol', 'Started', now() - interval '1 day',
                 now() - interval '1 day', '5150', '{{\"agent\": \"terminus-2\"}}',
                 '00000000-0000-0000-0000-000000000009', '10000000-0000-0000-0000-000000000001');"
    ));
    let carol = |team: &mut TeamDb| -> String {
        let sql = "SELECT string_agg(t::text, '|' ORDER BY id) FROM sandbox_jobs t WHERE username <> 'tester'";
        team.client.query_one(sql, &[]).unwrap().get(0)
    };
    let carol_before = carol(&mut team);
    let ours = |team: &mut TeamDb| {
        team.client
            .query(
                "SELECT job_status, slurm_job_id, metrics, stats, ended_at IS NOT NULL, job_name, config
                 FROM sandbox_jobs WHERE username = 'tester'",
                &[],
            )
            .unwrap()
    };
    let cluster = TestCluster::new(&format!("mirror-{tag}"), |_| {});
    let url = team.url.clone();
    let env = [("SUBMITTER_TEAM_DB", url.as_str())];
    let model = ["--model", "test/Tiny-1B"];
    let out =
        cluster.run(&["launch"], ledger_spec, &[&["--once", "--preset", "tb2", "--mirror"][..], &model].concat(), &env);
    assert!(text(&out).contains("1 submitted"), "{}", text(&out));
    let ledger = open_ledger(ledger_spec).unwrap();
    let attempt = ledger.active().unwrap().remove(0);
    let rows = ours(&mut team);
    assert_eq!(rows.len(), 1, "one row of ours");
    let status: String = rows[0].get(0);
    let job: String = rows[0].get(1);
    let config: Value = rows[0].get(6);
    assert!(status == "Pending", "{status}");
    assert_eq!(Some(job.as_str()), attempt.slurm_job_id.as_deref(), "the real job id replaced \"pending\"");
    assert_eq!(rows[0].get::<_, String>(5), run_tag);
    assert_eq!(config["submitter"]["attempt"], attempt.id.0);

    crate::queueing::wait_until("the job to finish and sync", std::time::Duration::from_secs(120), || {
        cluster.run(&["sync"], ledger_spec, &["--mirror"], &env);
        ledger.active().unwrap().is_empty()
    });
    let finished = ledger.attempt(attempt.id).unwrap().unwrap();
    assert_eq!(finished.status, AttemptStatus::Finished, "{}", finished.reason);
    let rows = ours(&mut team);
    let status: String = rows[0].get(0);
    let metrics: Value = rows[0].get(2);
    let stats: Value = rows[0].get(3);
    assert_eq!(status, "Finished");
    assert!(rows[0].get::<_, bool>(4), "ended_at set");
    let mean = finished.metrics.as_ref().unwrap()["mean_reward"].as_f64();
    assert!(mean.is_some());
    assert_eq!(metrics[0]["mean"].as_f64(), mean, "{metrics}");
    assert!(stats["n_infra_errors"].is_number() && stats["infra_errors"].is_object(), "{stats}");
    assert_eq!(stats["n_trials"], finished.metrics.as_ref().unwrap()["n_trials"]);
    assert_eq!(carol(&mut team), carol_before, "another user's row is never touched");

    // Importing the team's history now: the mirrored row is already this ledger's.
    let out = run(&cluster, ledger_spec, &["import"], &["--json"], &team.url);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    assert_eq!(report["skipped_own"], 1, "{report}");
    assert_eq!(ledger.attempts_for("test/Tiny-1B", "terminal_bench_2").unwrap().len(), 2, "ours + carol's");
}

#[test]
fn mirrored_run_appears_in_the_team_schema() {
    if !crate::support::slurm_up() {
        return;
    }
    mirrored_run(&Store::sqlite().spec, "sq");
    if let Some(store) = Store::postgres("teammirror") {
        mirrored_run(&store.spec, "pg");
    }
}

/// The Slurm-native listener with the team database named by the profile: the job gets no
/// `$SUBMITTER_TEAM_DB` (never exported), reads the URL from the secrets file on its node, folds
/// the team's history in and publishes its own attempt with a bare `--mirror` — the tick that used
/// to fail with "no team database". Neither the state file nor the job's output holds the
/// password. A listener whose profile names no team database refuses a bare `--mirror` up front.
#[test]
fn listener_tick_folds_in_and_mirrors_with_the_url_from_the_secrets_file() {
    if !crate::support::slurm_up() {
        return;
    }
    let Some(mut team) = TeamDb::new("listener") else { return };
    team.exec(HISTORY);
    team.exec(
        "INSERT INTO models (id, name, created_by) VALUES ('00000000-0000-0000-0000-000000000009', 'test/Tiny-1B', 'carol');",
    );
    let store = Store::sqlite();
    let selection = ["--interval", "3s", "--", "--preset", "tb2", "--model", "test/Tiny-1B", "--mirror"];

    // Without `team:` in the profile, the job could never see the URL: refused now.
    let bare = TestCluster::new("lsnbare", |_| {});
    let out = bare.run(&["listener", "start"], &store.spec, &selection, &[("SUBMITTER_TEAM_DB", &team.url)]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("never gets $SUBMITTER_TEAM_DB"), "{}", text(&out));

    let cluster = TestCluster::new("lsnteam", |p| p.push_str("team: {database_secret: TEAM_DB_URL}\n"));
    let mut secrets = std::fs::OpenOptions::new().append(true).open(cluster.root().join("secrets.env")).unwrap();
    std::io::Write::write_all(&mut secrets, format!("TEAM_DB_URL={}\n", team.url).as_bytes()).unwrap();
    let out = cluster.run(&["listener", "start"], &store.spec, &selection, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let ledger = open_ledger(&store.spec).unwrap();
    let name = "eval-listener-lsnteam";
    let state_dir = cluster.root().join("state");
    let outputs = || -> String {
        std::fs::read_dir(&state_dir)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("listener-")))
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect()
    };
    let published = |team: &mut TeamDb| -> Option<String> {
        // The job's user is Slurm's (`$USER` in the job), so the row is found by the mirror's marker.
        let sql = "SELECT slurm_job_id FROM sandbox_jobs WHERE config ? 'submitter' AND slurm_job_id <> 'pending'";
        team.client.query(sql, &[]).unwrap().first().map(|row| row.get(0))
    };
    let started = std::time::Instant::now();
    while published(&mut team).is_none() {
        assert!(started.elapsed().as_secs() < 180, "no attempt published by a listener tick in 180 s:\n{}", outputs());
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let job = published(&mut team).unwrap();
    let attempt = ledger.attempts_for("test/Tiny-1B", "terminal_bench_2").unwrap();
    assert!(attempt.iter().any(|a| a.slurm_job_id.as_deref() == Some(job.as_str())), "the row mirrors the attempt");
    // The tick folded the team's history in (no `import` was run).
    assert_eq!(ledger.attempts_for("org/Alpha-8B", "terminal_bench_2").unwrap().len(), 1, "{}", outputs());
    let out = cluster.run(&["listener", "stop"], &store.spec, &[], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let said = outputs();
    assert!(!said.contains("no team database"), "{said}");
    if let Some(password) = submitter_password(&team.url) {
        let state = std::fs::read_to_string(state_dir.join("listener.json")).unwrap();
        assert!(!state.contains(&password), "the state file holds the password: {state}");
        assert!(!said.contains(&password), "the job's output holds the password: {said}");
    }
    let left = std::process::Command::new("squeue").args(["-h", "-n", name, "-o", "%i"]).output().unwrap();
    for id in String::from_utf8_lossy(&left.stdout).split_whitespace() {
        let _ = std::process::Command::new("scancel").arg(id).status();
    }
    crate::queueing::cancel_all(&*ledger);
}
