//! Issue 31, the login-node half: the operator's first hour with the shipped profiles — the Slurm
//! settings preflight judges are what sbatch gets, a walltime within the partition's limit, the
//! seed's vocabulary and rules.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::{SUBMITTER, stderr, stdout, workspace_root};

/// `submitter ARGS` with the shipped profiles, `${WORK}`/`${SCRATCH}`/`${PROJECT}` under `site`.
fn shipped(site: &Path, args: &[&str]) -> Output {
    Command::new(SUBMITTER)
        .args(args)
        .env("SUBMITTER_HOME", workspace_root())
        .env("WORK", site)
        .env("SCRATCH", site)
        .env("PROJECT", site)
        .output()
        .unwrap()
}

/// Leonardo's shared ID plan asked `--time=1-00:07:00` (the longest leg plus the load allowance),
/// past boost_usr_prod's 24 h, and sbatch refused it: now capped at the partition's limit, and the
/// plan says that what does not finish is continued.
#[test]
fn leonardos_shared_id_plan_stays_within_its_partitions_24_hours() {
    let site = tempfile::tempdir().unwrap();
    let state = site.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let out = shipped(
        site.path(),
        &[
            "plan",
            "--cluster",
            "leonardo",
            "--preset",
            "ID",
            "--model",
            "Qwen/Qwen3-8B",
            "--allocation",
            "shared",
            "--offline-ledger",
            "--json",
            "--state-dir",
            state.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let shared = &plan["shared"][0];
    assert_eq!(shared["legs"].as_array().map(Vec::len), Some(3), "{plan}");
    let time = shared["time"].as_str().unwrap();
    let seconds = submitter::config::parse_slurm_time(time).unwrap();
    assert!(seconds <= 24 * 3600, "{time}: {}", shared["time_basis"]);
    let argv: Vec<&str> = shared["sbatch"].as_array().unwrap().iter().filter_map(|a| a.as_str()).collect();
    assert!(argv.contains(&"--time=1-00:00:00"), "{argv:?}");
    let basis = shared["time_basis"].as_str().unwrap();
    assert!(basis.contains("capped") && basis.contains("continued"), "{basis}");
    for job in plan["jobs"].as_array().unwrap() {
        let leg = submitter::config::parse_slurm_time(job["resources"]["time"].as_str().unwrap_or("99-00:00:00"));
        assert!(leg.is_some_and(|s| s <= 24 * 3600), "{job}");
    }
}

/// A reservation on the local Slurm that starts a year from now: `scontrol show reservation` lists
/// it and sbatch takes `--reservation` for it, but it holds no node today (the suite shares the
/// node). Deleted at the end when this test created it.
struct FutureReservation {
    name: &'static str,
    created: bool,
}

impl FutureReservation {
    fn ensure(name: &'static str) -> FutureReservation {
        let shown = Command::new("scontrol").args(["show", "reservation", name]).output().unwrap();
        if String::from_utf8_lossy(&shown.stdout).contains(&format!("ReservationName={name} ")) {
            return FutureReservation { name, created: false };
        }
        let user = String::from_utf8_lossy(&Command::new("id").arg("-un").output().unwrap().stdout).trim().to_string();
        let out = Command::new("scontrol")
            .args(["create", "reservation", &format!("reservationname={name}"), "starttime=now+365days"])
            .args(["duration=60", "nodecnt=1", &format!("users={user}")])
            .output()
            .unwrap();
        assert!(out.status.success(), "scontrol create reservation: {}", stderr(&out));
        FutureReservation { name, created: true }
    }
}

impl Drop for FutureReservation {
    fn drop(&mut self) {
        if self.created {
            let _ = Command::new("scontrol").args(["delete", &format!("reservationname={}", self.name)]).output();
        }
    }
}

/// Jupiter launched nothing: every pair `preflight failed: slurm: reservation eval is unknown to
/// Slurm`, with `--reservation reformo` and with `--no-reservation` alike, because preflight judged
/// the profile's settings, not what sbatch would get. The shipped profile, on the local Slurm: only
/// what this machine cannot be is mapped (the node's size and CPU architecture, and the payload binary: see `without_payload_bin`); the partition comes
/// from the command line, which is what preflight now judges.
#[test]
fn jupiter_launches_with_the_teams_reservation_and_without_one() {
    use submitter::ledger::open_ledger;
    let Some(site) = crate::site::ShippedSite::new() else { return };
    let _reformo = FutureReservation::ensure("reformo");
    let clusters = site.path().join("clusters");
    std::fs::create_dir_all(&clusters).unwrap();
    std::fs::copy(workspace_root().join("clusters/gpus.yaml"), clusters.join("gpus.yaml")).unwrap();
    let shipped = std::fs::read_to_string(workspace_root().join("clusters/jupiter.yaml")).unwrap();
    assert!(!shipped.lines().any(|l| l.trim_start().starts_with("reservation:")), "the shipped profile names none");
    let mut mapped = crate::site::without_payload_bin(&shipped);
    for (from, to) in [
        ("  cpus_per_node: 72", "  cpus_per_node: 2"),
        ("  mem_per_node_mb: 480000", "  mem_per_node_mb: 4000"),
        ("  arch: aarch64", "  arch: x86_64"),
    ] {
        assert!(mapped.contains(from), "{from}");
        mapped = mapped.replacen(from, to, 1);
    }
    std::fs::write(clusters.join("jupiter.yaml"), mapped).unwrap();
    let models = site.path().join("models.txt");
    std::fs::write(&models, format!("{}\n", crate::site::ShippedSite::MODEL)).unwrap();
    let models = models.to_str().unwrap();
    for (case, flags, reservation) in [
        ("--reservation reformo", &["--reservation", "reformo"][..], Some("reformo")),
        ("--no-reservation", &["--no-reservation"][..], None),
    ] {
        let store = crate::ledger::Store::sqlite();
        let launch = ["launch", "--cluster", "jupiter", "--preset", "ID", "--models-file", models, "--once"];
        let rest = ["--partition", "debug", "--offline-ledger", "--ledger", &store.spec];
        let out = site.submitter(&clusters, &[&launch[..], &rest, flags].concat()).output().unwrap();
        let printed = crate::queueing::text(&out);
        let ledger = open_ledger(&store.spec).unwrap();
        let active = ledger.active().unwrap();
        let ids: Vec<String> = active.iter().filter_map(|a| a.slurm_job_id.clone()).collect();
        // Nothing of this test is left on the shared cluster.
        let _ = Command::new("scancel").args(&ids).output();
        assert!(out.status.success() && !printed.contains("not submitted"), "{case}: {printed}");
        assert_eq!(ids.len(), 3, "{case}: the three ID legs are queued: {printed}");
        for id in &ids {
            let shown = Command::new("scontrol").args(["-o", "show", "job", id]).output().unwrap();
            let shown = String::from_utf8_lossy(&shown.stdout).to_string();
            assert!(shown.contains("Account=reformo"), "{case}: {shown}");
            match reservation {
                Some(r) => assert!(shown.contains(&format!("Reservation={r}")), "{case}: {shown}"),
                None => assert!(!shown.contains("Reservation=reformo"), "{case}: {shown}"),
            }
        }
    }
    // A reservation Slurm does not know: refused with the live ones and the flag to use, by
    // `submitter preflight`, which takes launch's Slurm flags.
    let preflight =
        ["preflight", "--cluster", "jupiter", "--preset", "tb2", "--model", crate::site::ShippedSite::MODEL];
    let out = site
        .submitter(&clusters, &[&preflight[..], &["--partition", "debug", "--reservation", "eval"]].concat())
        .output()
        .unwrap();
    let printed = crate::queueing::text(&out);
    assert_eq!(out.status.code(), Some(1), "{printed}");
    assert!(
        printed.contains("reservation `eval` is unknown")
            && printed.contains("reformo")
            && printed.contains("--no-reservation"),
        "{printed}"
    );
    let out = site
        .submitter(&clusters, &[&preflight[..], &["--partition", "debug", "--reservation", "reformo"]].concat())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", crate::queueing::text(&out));
    assert!(stdout(&out).contains("reservation reformo"), "{}", stdout(&out));
}

/// A credential-shaped literal in a profile's `env` passed `registry check` and was written into
/// the world-readable launch.json: now `registry check` names it (never its value) and `spec`
/// refuses the profile, writing nothing.
#[test]
fn a_credential_in_a_profile_is_refused_by_lint_and_never_written_into_a_spec() {
    let dir = tempfile::tempdir().unwrap();
    let clusters = dir.path().join("clusters");
    std::fs::create_dir_all(&clusters).unwrap();
    std::fs::copy(workspace_root().join("clusters/gpus.yaml"), clusters.join("gpus.yaml")).unwrap();
    let token = "hf_QwErTyUiOpAsDfGhJkLzXc";
    let local = std::fs::read_to_string(workspace_root().join("clusters/local.yaml")).unwrap();
    assert!(local.contains("\nengine:\n") && !local.contains("HF_TOKEN:"));
    let leaked = local.replacen("\nengine:\n", &format!("\nengine:\n  env:\n    HF_TOKEN: \"{token}\"\n"), 1);
    std::fs::write(clusters.join("local.yaml"), leaked).unwrap();
    let clusters_arg = clusters.to_str().unwrap();
    let out = crate::support::submitter(&["registry", "check", "--clusters", clusters_arg]);
    let printed = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "{printed}");
    assert!(printed.contains("engine.env.HF_TOKEN") && printed.contains("looks like a credential"), "{printed}");
    assert!(!printed.contains(token), "the value was printed: {printed}");
    let spec = dir.path().join("launch.json");
    let out = crate::support::submitter(&[
        "spec",
        "--cluster",
        "local",
        "--clusters",
        clusters_arg,
        "--preset",
        "tb2",
        "--model",
        "Qwen/Qwen3-8B",
        "--out",
        spec.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(!spec.exists(), "a spec was written");
    assert!(!stderr(&out).contains(token) && !stdout(&out).contains(token), "{}", stderr(&out));
}

/// `--force` on a pair whose job is queued: `plan` said submit, `launch` said "another submitter"
/// (it was this one) and left a run dir behind. Both now refuse it the same way, and nothing is
/// made on disk.
#[test]
fn force_on_a_running_pair_is_refused_alike_by_plan_and_launch() {
    use submitter::ledger::open_ledger;
    if !crate::support::slurm_up() {
        return;
    }
    // Held jobs stay queued: the pair is active for as long as the test needs.
    let cluster = crate::queueing::TestCluster::new("force31", |p| {
        *p = p.replace("  time: \"00:10:00\"\n", "  time: \"00:10:00\"\n  extra_args: [\"--hold\"]\n");
    });
    let store = crate::ledger::Store::sqlite();
    let ledger = open_ledger(&store.spec).unwrap();
    let pair = ["--preset", "tb2", "--model", "test/Tiny-1B"];
    let out = cluster.run(&["launch"], &store.spec, &[&["--once"][..], &pair].concat(), &[]);
    let first = crate::queueing::text(&out);
    let active = ledger.active().unwrap();
    crate::queueing::cancel_all_on_drop(&*ledger, || {
        assert!(out.status.success() && active.len() == 1, "{first}");
        let jobs = cluster.root().join("jobs");
        let entries = || std::fs::read_dir(&jobs).unwrap().filter_map(Result::ok).count();
        let before = entries();
        let plan = cluster.run(&["plan"], &store.spec, &[&pair[..], &["--force"]].concat(), &[]);
        let launch =
            cluster.run(&["launch"], &store.spec, &[&["--once", "--force", "--json"][..], &pair].concat(), &[]);
        for (command, out) in [("plan", &plan), ("launch", &launch)] {
            let printed = crate::queueing::text(out);
            assert!(out.status.success(), "{command}: {printed}");
            let refused = format!("--force refused: attempt {} is still", active[0].id.0);
            assert!(printed.contains(&refused) && printed.contains("cancel it first"), "{command}: {printed}");
            assert!(!printed.contains("another submitter"), "{command}: {printed}");
        }
        assert_eq!(entries(), before, "no run dir was made for the refused --force");
        assert_eq!(ledger.active().unwrap().len(), 1);
    });
}

/// Installed-harness evals (openhands) were refused on every cluster: no profile could hold the
/// team's Pinggy bank. The shipped Leonardo profile names the defaults (8, 9, 10) and the
/// borrow-only pairs (1–7); the pairs themselves are in the secrets file. `plan` names the pairs a
/// job gets, and the launch submits (on the local Slurm: only the node's size and the payload binary are mapped, the
/// partition comes from the command line).
#[test]
fn an_openhands_launch_on_leonardo_plans_and_submits_with_the_teams_bank() {
    use submitter::ledger::open_ledger;
    let Some(site) = crate::site::ShippedSite::new() else { return };
    let clusters = site.path().join("clusters");
    std::fs::create_dir_all(&clusters).unwrap();
    std::fs::copy(workspace_root().join("clusters/gpus.yaml"), clusters.join("gpus.yaml")).unwrap();
    let shipped = std::fs::read_to_string(workspace_root().join("clusters/leonardo.yaml")).unwrap();
    assert!(!shipped.contains("pinggy.link"), "the profile holds no pair");
    let mut mapped = crate::site::without_payload_bin(&shipped);
    for (from, to) in
        [("  cpus_per_node: 32", "  cpus_per_node: 2"), ("  mem_per_node_mb: 490000", "  mem_per_node_mb: 4000")]
    {
        assert!(mapped.contains(from), "{from}");
        mapped = mapped.replacen(from, to, 1);
    }
    std::fs::write(clusters.join("leonardo.yaml"), mapped).unwrap();
    let openhands = site.path().join("openhands_eval.yaml");
    std::fs::write(
        &openhands,
        "orchestrator:\n  type: local\n  quiet: true\nenvironment:\n  type: daytona\n  delete: true\nagents:\n  - name: openhands\n",
    )
    .unwrap();
    let model = crate::site::ShippedSite::MODEL;
    let pair =
        ["--cluster", "leonardo", "--preset", "tb2", "--model", model, "--harbor-config", openhands.to_str().unwrap()];
    let store = crate::ledger::Store::sqlite();
    let common = ["--partition", "debug", "--offline-ledger", "--ledger", &store.spec];
    let plan = site.submitter(&clusters, &[&["plan"][..], &pair, &common].concat()).output().unwrap();
    let printed = crate::queueing::text(&plan);
    assert!(plan.status.success() && printed.contains("submit "), "{printed}");
    assert!(printed.contains("Pinggy (pairs 8, 9, 10 of the team's bank"), "{printed}");
    let mut borrowed = site.submitter(&clusters, &[&["plan"][..], &pair, &common, &["--pinggy-pair", "3"]].concat());
    let borrowed = crate::queueing::text(&borrowed.output().unwrap());
    assert!(borrowed.contains("pair 3 of the team's bank"), "{borrowed}");
    let launch = site.submitter(&clusters, &[&["launch", "--once"][..], &pair, &common].concat()).output().unwrap();
    let printed = crate::queueing::text(&launch);
    let ledger = open_ledger(&store.spec).unwrap();
    let active = ledger.active().unwrap();
    let ids: Vec<String> = active.iter().filter_map(|a| a.slurm_job_id.clone()).collect();
    let _ = Command::new("scancel").args(&ids).output();
    assert!(launch.status.success() && ids.len() == 1, "{printed}");
    let spec_path = std::path::PathBuf::from(active[0].config["spec"].as_str().unwrap());
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    let tunnel = spec["tunnel"].to_string();
    assert!(tunnel.contains("https://team-8.a.pinggy.link") && tunnel.contains("PINGGY_TOKEN_10"), "{tunnel}");
    assert!(!tunnel.contains("team-3.") && !tunnel.contains("tok8"), "no borrowed pair, no token: {tunnel}");
}
