//! The team view (issue 25 item 4): `status --all-clusters` (text and JSON snapshots) and the
//! report's team section rendered in headless chromium, on one SQLite ledger that three clusters
//! share: this one (`rep`), `vista` (another cluster whose run dir happens to be readable here,
//! with payload's heartbeat history) and `jupiter` (whose run dir is on its own file system). No
//! Slurm is asked: this cluster's only active attempt has no job id yet.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use chrono::{DateTime, Duration, Utc};
use launch_spec::records::GpuChoice;
use launch_spec::shared::GpuTime;
use launch_spec::testkit::rundir::{Counters, HarborJob, RunDir, heartbeat_event, phase_event, running_status};
use serde_json::{Value, json};
use submitter::ledger::{AttemptStatus, ImportedAttempt, NewAttempt, open_ledger};

use crate::snapshots::stable;
use crate::support::{SUBMITTER, workspace_root};
use crate::verify::{chromium, profile_dir, rendered_dom, screenshot_sized};

/// A fixed instant the run dirs' records are written for (the charts' data is then the same each
/// run); the ledger's own clock stamps `updated_at` and the submitter heartbeats.
fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-30T10:00:00Z").unwrap().with_timezone(&Utc)
}

struct Team {
    tmp: tempfile::TempDir,
    spec: String,
    clusters: PathBuf,
}

#[allow(clippy::too_many_arguments)]
fn attempt(
    model: &str,
    benchmark: &str,
    cluster: &str,
    job: &str,
    status: AttemptStatus,
    run_dir: &Path,
    started: DateTime<Utc>,
    ended: Option<DateTime<Utc>>,
    metrics: Option<Value>,
) -> ImportedAttempt {
    ImportedAttempt {
        model: model.into(),
        benchmark: benchmark.into(),
        cluster: cluster.into(),
        username: "tester".into(),
        run_tag: format!("{benchmark}__{}", model.replace('/', "__")),
        slurm_job_id: Some(job.into()),
        status,
        reason: if status == AttemptStatus::Finished { "finished".into() } else { format!("running on {cluster}") },
        config: json!({"run_dir": run_dir}),
        metrics,
        submitted_at: started,
        started_at: Some(started),
        ended_at: ended,
        source_id: None,
    }
}

fn metrics(mean: f64, n: u64, errors: u64) -> Value {
    json!({"mean_reward": mean, "n_trials": n, "n_errors": errors, "n_valid": n - errors, "n_expected": n,
           "errors_by_type": {}, "infra_errors": {}})
}

fn team() -> Team {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let clusters = profile_dir(root, "rep", "");
    let spec = format!("sqlite:{}", root.join("ledger.sqlite").display());
    let ledger = open_ledger(&spec).unwrap();

    // vista's running job: 10 heartbeats a minute apart (25–50 completions and 2 trials a minute,
    // then nothing for the last 3), 40 trials expected, 4 GPUs recorded for 11 minutes.
    let vista = RunDir::at(root.join("vista-jobs/tb2__org__Delta-32B"));
    std::fs::create_dir_all(vista.path()).unwrap();
    let done = [0, 30, 72, 97, 135, 185, 218, 263];
    let counters = |m: u64| {
        let m = m.min(7);
        Counters { completions: (done[m as usize], 0, 0), trials: (2 * m + 2, 2 * m, 0) }
    };
    let mut events = vec![phase_event(t0(), launch_spec::records::Phase::Running)];
    events.extend((0..10).map(|m| heartbeat_event(t0() + Duration::minutes(m as i64), counters(m))));
    let last = t0() + Duration::minutes(10);
    let mut status = running_status("tb2__org__Delta-32B", "1007", t0(), last, counters(10), last);
    status.gpu_time = Some(GpuTime {
        gpus: 4,
        prepare_s: 60.0,
        load_s: 120.0,
        serving_s: 480.0,
        idle_s: 0.0,
        teardown_s: 0.0,
        legs: vec![],
    });
    vista.events(&events, None).status(&status, None).job(&HarborJob::started("tb2__org__Delta-32B", t0(), 40, None));

    // This cluster's finished result, its run dir here: 2 GPUs × 40 minutes, estimated.
    let own_done = RunDir::at(root.join("jobs/tb2__org__Alpha-8B"));
    std::fs::create_dir_all(own_done.path()).unwrap();
    let mut done_status = running_status("tb2__org__Alpha-8B", "100", t0(), t0(), Counters::default(), t0());
    done_status.gpu = Some(GpuChoice {
        profile: "a100-64g".into(),
        gpu_name: None,
        gpu_count: 2,
        gpu_memory_utilization: 0.9,
        source: "nvml".into(),
    });
    own_done.status(&done_status, None);

    let far = Path::new("/nonexistent/jupiter/jobs/swebench__org__Eps-7B");
    ledger
        .import_attempts(&[
            attempt(
                "org/Alpha-8B",
                "terminal_bench_2",
                "rep",
                "100",
                AttemptStatus::Finished,
                own_done.path(),
                t0(),
                Some(t0() + Duration::minutes(40)),
                Some(metrics(0.42, 89, 3)),
            ),
            attempt(
                "org/Beta-32B",
                "terminal_bench_2",
                "vista",
                "900",
                AttemptStatus::Finished,
                Path::new("/nonexistent/vista/jobs/old"),
                t0() - Duration::hours(5),
                Some(t0() - Duration::hours(3)),
                Some(metrics(0.61, 89, 2)),
            ),
            attempt(
                "org/Delta-32B",
                "terminal_bench_2",
                "vista",
                "1007",
                AttemptStatus::Started,
                vista.path(),
                t0(),
                None,
                None,
            ),
            attempt(
                "org/Eps-7B",
                "swebench-verified-random-100-folders",
                "jupiter",
                "2001",
                AttemptStatus::Started,
                far,
                t0(),
                None,
                None,
            ),
        ])
        .unwrap();
    ledger
        .insert_pending(&NewAttempt {
            model: "org/Gamma-7B".into(),
            benchmark: "swebench-verified-random-100-folders".into(),
            cluster: "rep".into(),
            username: "tester".into(),
            run_tag: "swebench__org__Gamma-7B".into(),
            agent: "terminus-2".into(),
            reason: "no previous attempt".into(),
            config: json!({"run_dir": root.join("jobs/swebench__org__Gamma-7B")}),
        })
        .unwrap();
    // vista's sync recorded its older result's GPU-seconds in the ledger (8 GPUs × 2 h): known
    // here although its run dir is not.
    let beta = ledger.latest_per_pair().unwrap().into_iter().find(|p| p.model == "org/Beta-32B").unwrap().latest;
    let record = json!({"gpus": 8, "complete": true, "slurm_elapsed_s": 7200.0,
                        "by_phase": {"prepare": 480.0, "load": 2400.0, "serving": 54720.0}});
    ledger.record_gpu_seconds(beta.id, &record).unwrap();
    // vista's submitter reconciles it; jupiter's recorded no heartbeat.
    ledger.record_heartbeat("vista", "tester@vista-login", 600).unwrap();
    Team { tmp, spec, clusters }
}

fn run(team: &Team, command: &str, args: &[&str]) -> Output {
    Command::new(SUBMITTER)
        .arg(command)
        .args(["--cluster", "rep", "--clusters"])
        .arg(&team.clusters)
        .env("SUBMITTER_LEDGER", &team.spec)
        .args(args)
        .env("SUBMITTER_HOME", workspace_root())
        .current_dir(team.tmp.path())
        .output()
        .unwrap()
}

/// Ages measured against the clock (`3.2h ago`, `"submitter_age_s": 1`) as placeholders.
fn ageless(text: &str) -> String {
    let ago = regex::Regex::new(r"\b\d+(\.\d+)?[smh] ago").unwrap();
    let age = regex::Regex::new(r#""submitter_age_s": \d+"#).unwrap();
    let text = ago.replace_all(text, "<age> ago");
    age.replace_all(&text, r#""submitter_age_s": <s>"#).into_owned()
}

#[test]
fn status_all_clusters_shows_every_cluster_with_remote_marked() {
    let team = team();
    let human = run(&team, "status", &["--all-clusters", "--hours", "0"]);
    let text = String::from_utf8_lossy(&human.stdout).into_owned();
    assert!(human.status.success(), "{text}{}", String::from_utf8_lossy(&human.stderr));
    insta::assert_snapshot!("status_all_clusters_human", ageless(&stable(&text)));

    let out = run(&team, "status", &["--all-clusters", "--hours", "0", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["kind"], "status.all_clusters");
    let jobs = doc["jobs"].as_array().unwrap();
    let job = |model: &str| jobs.iter().find(|j| j["model"] == model).unwrap_or_else(|| panic!("{model}: {doc:#}"));
    // This cluster's attempt is judged; the others' are remote, with the ledger's state.
    assert_eq!(job("org/Gamma-7B")["verdict"]["verdict"], "starting");
    assert_eq!(job("org/Gamma-7B")["remote"], false);
    let delta = job("org/Delta-32B");
    assert_eq!((delta["remote"].clone(), delta["run_dir_readable"].clone()), (json!(true), json!(true)));
    assert!(delta.get("verdict").is_none(), "another cluster's job is not judged here: {delta:#}");
    assert!(delta["last_known"].as_str().unwrap().starts_with("started "), "{delta:#}");
    assert_eq!(job("org/Eps-7B")["run_dir_readable"], false);
    // Delta's heartbeats: the completions of each minute for 7 minutes, then none; 14 of 40 trials.
    let rates: Vec<f64> = delta["completion_rate"].as_array().unwrap().iter().map(|p| p[1].as_f64().unwrap()).collect();
    assert_eq!(rates, [30.0, 42.0, 25.0, 38.0, 50.0, 33.0, 45.0, 0.0, 0.0, 0.0]);
    let progress = delta["trial_progress"].as_array().unwrap();
    assert_eq!(progress.len(), 11, "10 heartbeat events and status.json's latest");
    assert_eq!(progress.last().unwrap()[1], json!(14.0 / 40.0));
    assert_eq!(delta["trials_expected"], 40);
    // GPU-hours: vista's running job from its run dir (4 GPUs × 660 s) and its older result from
    // the ledger (16 h), rep's result estimated (2 × 40 min), jupiter's unknown.
    let by_cluster = &doc["gpu_hours"]["by_cluster"];
    let bar = |label: &str| by_cluster.as_array().unwrap().iter().find(|b| b["label"] == label).cloned().unwrap();
    assert!(
        (bar("vista")["gpu_hours"].as_f64().unwrap() - (16.0 + 4.0 * 660.0 / 3600.0)).abs() < 1e-9,
        "{by_cluster:#}"
    );
    assert_eq!((bar("vista")["unknown"].clone(), bar("jupiter")["unknown"].clone()), (json!(0), json!(1)));
    let beta = doc["results"].as_array().unwrap().iter().find(|r| r["model"] == "org/Beta-32B").unwrap();
    assert_eq!((beta["gpu_hours"].as_f64(), beta["gpu_hours_basis"].as_str()), (Some(16.0), Some("ledger")));
    assert!((bar("rep")["gpu_hours"].as_f64().unwrap() - 2.0 * 40.0 / 60.0).abs() < 1e-9, "{by_cluster:#}");
    assert_eq!(bar("rep")["estimated"], 1);
    let clusters: Vec<&str> = doc["clusters"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(clusters, ["rep", "jupiter", "vista"], "this cluster first");
    assert_eq!(doc["clusters"][1]["unattended"], true, "jupiter recorded no submitter heartbeat");
    assert_eq!(doc["clusters"][2]["unattended"], false);
    let results: Vec<&str> = doc["results"].as_array().unwrap().iter().map(|r| r["model"].as_str().unwrap()).collect();
    assert_eq!(results, ["org/Alpha-8B", "org/Beta-32B"], "latest first");
    insta::assert_snapshot!("status_all_clusters_json", ageless(&stable(&String::from_utf8_lossy(&out.stdout))));

    let watch = run(&team, "status", &["--all-clusters", "--watch"]);
    assert_eq!(watch.status.code(), Some(2), "the team view is shown once");
}

#[test]
fn team_report_is_one_static_file_and_renders_in_a_real_browser() {
    let team = team();
    let page = team.tmp.path().join("out/team.html");
    std::fs::create_dir_all(page.parent().unwrap()).unwrap();
    let out = run(&team, "report", &["--html", page.to_str().unwrap(), "--title", "Team evals", "--no-check"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    // One static file: nothing fetched, no external script.
    let external = regex::Regex::new(r#"(?i)\b(src|href)\s*=\s*["']?\s*(https?:)?//"#).unwrap();
    assert!(!external.is_match(&html), "external resource: {:?}", external.find(&html));
    assert!(!html.to_lowercase().contains("<script src"), "an external script");
    for asset in ["<link ", "@import", "url(", "fetch(", "XMLHttpRequest"] {
        assert!(!html.contains(asset), "`{asset}` in the report");
    }
    // Delta's sparkline has a point per step: 10 completion-rate steps, 11 progress readings.
    let row = html.split("data-attempt=").find(|r| r.contains("org/Delta-32B")).expect("Delta's row");
    let points = |class: &str| {
        let svg = row.split(&format!("class=\"spark {class}\"")).nth(1).unwrap();
        svg.split("points=\"").nth(1).unwrap().split('"').next().unwrap().split(' ').count()
    };
    assert_eq!((points("rate"), points("progress")), (10, 11), "{row}");
    assert!(html.contains("data-label=\"vista\" data-gpu-hours=\"16.73\""), "vista's bar: 16 h + 4 GPUs × 660 s");
    assert!(html.contains("data-label=\"rep\" data-gpu-hours=\"1.33\""), "rep's bar: 2 GPUs × 40 min");

    let Some(browser) = chromium() else { return };
    let profile = tempfile::tempdir().unwrap();
    let dump = rendered_dom(&browser, profile.path(), &page);
    for expected in ["Team view: every cluster", "jupiter", "run dir not readable here", "unattended", "Last results"] {
        assert!(dump.contains(expected), "`{expected}` missing from the rendered page");
    }
    assert_eq!(dump.matches("<svg class=\"spark").count(), 2 * 3, "two sparklines per attempt");

    // The team view follows the ranking, the matrix and the plots: a window tall enough to show it.
    let png = team.tmp.path().join("report-team.png");
    screenshot_sized(&browser, profile.path(), &page, &png, "report-team.png", (1280, 1700));
}
