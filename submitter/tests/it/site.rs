//! The simulated site (docs/site.md): a first launch on a cluster shaped like Leonardo — paths under
//! `${WORK}`, no internet on compute nodes, weights only in the login node's HF cache, a dataset not
//! staged yet, the secrets path set only in the submitter's shell, a prelude that loads a module
//! (Lmod, from Debian) in the job's own shell — through `submitter launch` on the real local Slurm,
//! whose `--export=NAME,…` gives the job the user's login environment, not the submitting shell's.
//! And each first-contact failure, caught on the login node before anything is queued.
//!
//! Needs the local Slurm (skipped with a note elsewhere, required in CI), Lmod
//! (`scripts/services.sh install`) and the real huggingface_hub CLI from the vLLM venv
//! (`scripts/install-vllm.sh`): the staging tool users have.

#![allow(clippy::print_stderr)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use submitter::ledger::open_ledger;
use tempfile::TempDir;

use crate::ledger::Store;
use crate::queueing::{text, wait_until};
use crate::support::{SUBMITTER, binaries, slurm_up, workspace_root, write_tasks};

pub(crate) const MODEL: &str = "test/Tiny-1B";
const DATASET: &str = "DCAgent2/terminal_bench_2";
/// The datasets of the `ID` preset group (three legs).
const ID_DATASETS: [&str; 3] = [DATASET, "DCAgent/dev_set_v2", "DCAgent2/swebench-verified-random-100-folders"];
const REVISION: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c";
const CONFIG: &str = r#"{"model_type":"qwen2","architectures":["Qwen2ForCausalLM"]}"#;

/// The real `hf` (huggingface_hub's CLI) of the vLLM venv, or None (skip; CI has it).
fn real_hf() -> Option<PathBuf> {
    let venv = std::env::var_os("EVALCI_VLLM_VENV")
        .map_or_else(|| PathBuf::from("/var/cache/evalci/vllm-venv"), PathBuf::from);
    let hf = venv.join("bin/hf");
    if hf.is_file() {
        return Some(hf);
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{} missing in CI (scripts/install-vllm.sh)",
        hf.display()
    );
    eprintln!("skipping: no huggingface_hub CLI at {}", hf.display());
    None
}

/// The real vLLM `version`'s venv (`scripts/install-vllm.sh`), or None after a note (CI has them).
fn vllm_venv(version: &str) -> Option<PathBuf> {
    let dir = if version == launch_spec::versions::VERIFIED_VLLM.to_string() {
        std::env::var_os("EVALCI_VLLM_VENV").map_or_else(|| PathBuf::from("/var/cache/evalci/vllm-venv"), PathBuf::from)
    } else {
        PathBuf::from(format!("/var/cache/evalci/vllm-{version}-venv"))
    };
    if dir.join(".evalci-stamp").is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{} missing in CI (scripts/install-vllm.sh)",
        dir.display()
    );
    eprintln!("skipping: no vLLM {version} venv at {}", dir.display());
    None
}

fn lmod_installed() -> bool {
    let ok = Path::new("/usr/share/lmod/lmod/init/bash").is_file();
    if !ok {
        assert!(std::env::var("CI").map_or(true, |v| v != "true"), "Lmod missing in CI (scripts/services.sh install)");
        eprintln!("skipping: no Lmod (scripts/services.sh install)");
    }
    ok
}

/// A model in an HF cache, laid out as huggingface_hub does (tests/tests/hub_contract.rs checks it).
fn cache_model(cache: &Path, model: &str) {
    let repo = cache.join(format!("models--{}", model.replace('/', "--")));
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("snapshots").join(REVISION)).unwrap();
    std::fs::write(repo.join("snapshots").join(REVISION).join("config.json"), CONFIG).unwrap();
    std::fs::write(repo.join("refs/main"), REVISION).unwrap();
}

/// One simulated site: `${WORK}` and `${SCRATCH}` exist only in the submitter's shell.
pub(crate) struct Site {
    dir: TempDir,
    hf: PathBuf,
}

impl Site {
    pub(crate) fn new(tweak: impl Fn(&mut String)) -> Option<Site> {
        if !slurm_up() || !lmod_installed() {
            return None;
        }
        let hf = real_hf()?;
        let dir = tempfile::tempdir().unwrap();
        let site = Site { dir, hf };
        let (work, root) = (site.work(), site.root().to_path_buf());
        let env = work.join("envs/otagent/bin");
        std::fs::create_dir_all(&env).unwrap();
        let bins = binaries();
        std::os::unix::fs::symlink(bins.join("vllm-standin"), env.join("vllm")).unwrap();
        std::os::unix::fs::symlink(bins.join("harbor-standin"), env.join("harbor")).unwrap();
        std::os::unix::fs::symlink(&site.hf, env.join("hf")).unwrap();
        // Weights only in the login node's cache; the dataset only on the "hub" mirror.
        cache_model(&work.join("hf_cache"), MODEL);
        for dataset in ID_DATASETS {
            write_tasks(&root.join("mirror").join(dataset), ["t1", "t2"]);
        }
        // The secrets file, named only by $DC_AGENT_SECRET_ENV in the submitter's shell.
        std::fs::create_dir_all(root.join("keys")).unwrap();
        let secrets = root.join("keys/secrets.env");
        std::fs::write(&secrets, concat!("DAYTONA_API_KEY=site-org1-aaa\n", "DAYTONA_DATA_API_KEY=site-org2-bbb\n"))
            .unwrap();
        std::fs::set_permissions(&secrets, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        // The prelude loads a module in the job's shell (Lmod; the module path is the site's).
        let modules = workspace_root().join("tests/site/modulefiles");
        std::fs::write(
            root.join("site.prelude.sh"),
            format!("module use {}\nmodule load cuda/12.8\n", modules.display()),
        )
        .unwrap();
        std::fs::create_dir_all(root.join("clusters")).unwrap();
        std::fs::copy(workspace_root().join("clusters/gpus.yaml"), root.join("clusters/gpus.yaml")).unwrap();
        let mut profile = format!(
            "# Shaped like clusters/leonardo.yaml, on the local Slurm.
name: simsite
slurm:
  partition: debug
  time: \"00:10:00\"
  prelude: {root}/site.prelude.sh
  export_env: [PAYLOAD_GPU_FIXTURE]
hardware:
  gpus_per_node: 1
  cpus_per_node: 1
  mem_per_node_mb: 400
  gpu_memory_gib: 64
  arch: x86_64
environments:
  otagent:
    path: ${{WORK}}/envs/otagent
engine:
  default_environment: otagent
  health_timeout_s: 60
  torchdynamo_disable_by_dp: true
  env:
    STANDIN_LOAD_SECONDS: \"0.3\"
    STANDIN_HUB: unreachable
    TMPDIR: \"{{job_scratch}}/tmp\"
    TRITON_CACHE_DIR: \"{{job_scratch}}/triton\"
harbor:
  environment: otagent
  env:
    STANDIN_TRIAL_SECONDS: \"0.05\"
    STANDIN_EXTRAS: daytona
    NETRC: /dev/null
paths:
  jobs_dir: ${{WORK}}/eval_jobs
  logs_dir: ${{WORK}}/eval_logs
  hf_cache: ${{WORK}}/hf_cache
  datasets_dirs:
    - ${{WORK}}/data/datasets
  node_scratch: ${{SCRATCH}}/node-local
  state_dir: ${{WORK}}/eval_state
network:
  internet: false
limits:
  max_jobs_in_flight: 4
  submission_delay_s: 0
  n_concurrent: 2
  walltime_lead_s: 60
pre_download:
  enabled: true
  command: [\"${{WORK}}/envs/otagent/bin/hf\", download, \"{{model}}\", --cache-dir, \"{{cache}}\"]
  timeout_s: 120
  # The site's swap: datasets come from a local mirror (no huggingface.co from here).
  dataset_command: [cp, -r, \"${{SITE_MIRROR}}/{{dataset}}\", \"{{dir}}\"]
",
            root = root.display()
        );
        tweak(&mut profile);
        std::fs::write(root.join("clusters/simsite.yaml"), profile).unwrap();
        std::fs::create_dir_all(root.join("scratch/node-local")).unwrap();
        Some(site)
    }

    pub(crate) fn root(&self) -> &Path {
        self.dir.path()
    }

    fn work(&self) -> PathBuf {
        self.root().join("work")
    }

    fn dataset_dir(&self) -> PathBuf {
        self.work().join("data/datasets/DCAgent2_terminal_bench_2")
    }

    pub(crate) fn run_dir(&self) -> PathBuf {
        self.work().join("eval_jobs/terminal_bench_2__test__Tiny-1B")
    }

    /// `submitter <command> --cluster simsite …` from a shell that holds the site's variables —
    /// which the job never sees.
    pub(crate) fn submitter(&self, command: &str, args: &[&str], ledger: Option<&str>) -> Output {
        let root = self.root();
        let mut cmd = Command::new(SUBMITTER);
        cmd.arg(command).args(["--cluster", "simsite", "--clusters"]).arg(root.join("clusters"));
        if let Some(ledger) = ledger {
            cmd.args(["--ledger", ledger]);
        }
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .env("HOME", std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
            .env("USER", std::env::var("USER").unwrap_or_else(|_| "root".into()))
            .env("SUBMITTER_HOME", workspace_root())
            .env("WORK", self.work())
            .env("SCRATCH", root.join("scratch"))
            .env("SITE_MIRROR", root.join("mirror"))
            .env("DC_AGENT_SECRET_ENV", root.join("keys/secrets.env"))
            // No route to huggingface.co here: the real CLI resolves from the login node's cache.
            .env("HF_HUB_OFFLINE", "1")
            .env("PAYLOAD_GPU_FIXTURE", workspace_root().join("tests/fixtures/gpus-4x-a100-64gb.json"))
            .current_dir(workspace_root());
        cmd.output().unwrap()
    }

    pub(crate) fn launch(&self, ledger: &str) -> Output {
        self.submitter("launch", &["--once", "--preset", "tb2", "--model", MODEL], Some(ledger))
    }
}

fn status(run_dir: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(run_dir.join("status.json")).ok()?).ok()
}

/// Done when: the first launch on a Leonardo-shaped site stages the model (from the login node's
/// cache, once) and the dataset, resolves the job's environment at submit time, and the job —
/// which sees none of the submitting shell — finishes.
#[test]
fn first_launch_on_a_new_cluster_stages_and_the_job_finishes() {
    let Some(site) = Site::new(|_| {}) else { return };
    assert!(!site.dataset_dir().exists(), "the dataset is not staged yet");
    let store = Store::sqlite();
    // Three preset legs, one model: staged once.
    let out = site.submitter("launch", &["--once", "--preset", "ID", "--model", MODEL], Some(&store.spec));
    let printed = text(&out);
    assert!(out.status.success() && printed.contains("3 submitted"), "{printed}");
    assert_eq!(printed.matches("staging model test/Tiny-1B").count(), 1, "{printed}");
    for dataset in ID_DATASETS {
        assert!(printed.contains(&format!("staging dataset {dataset}")), "{printed}");
    }
    assert!(site.dataset_dir().join("t1/instruction.md").is_file(), "dataset staged into its dir");
    assert!(!site.dataset_dir().with_extension("partial").exists());

    // What the job needs is in the spec, resolved now.
    let spec = launch_spec::LaunchSpec::from_file(&site.run_dir().join("launch.json")).unwrap();
    let cache = site.work().join("hf_cache").display().to_string();
    assert_eq!(spec.serve.env.get("HF_HUB_CACHE"), Some(&cache));
    assert_eq!(spec.serve.env.get("HF_HUB_OFFLINE").map(String::as_str), Some("1"));
    assert_eq!(spec.serve.env.get("TORCHDYNAMO_DISABLE").map(String::as_str), Some("1"));
    assert_eq!(spec.secrets.file, Some(site.root().join("keys/secrets.env")), "absolute, from the submitter's shell");
    assert!(spec.serve.env_prefix.as_ref().is_some_and(|p| p.starts_with(site.work())), "${{WORK}} expanded");
    let preflight: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(site.run_dir().join("preflight.json")).unwrap()).unwrap();
    assert_eq!(preflight["passed"], true, "{preflight}");

    let run_dirs: Vec<PathBuf> = std::fs::read_dir(site.work().join("eval_jobs"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join("launch.json").is_file())
        .collect();
    assert_eq!(run_dirs.len(), 3, "{run_dirs:?}");
    wait_until("the jobs to finish", Duration::from_secs(300), || {
        run_dirs.iter().all(|dir| status(dir).is_some_and(|s| !s["outcome"].is_null()))
    });
    for run_dir in &run_dirs {
        let status = status(run_dir).unwrap();
        let vllm_log = std::fs::read_to_string(run_dir.join("vllm.log")).unwrap_or_default();
        let slurm_out: String = std::fs::read_dir(run_dir)
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("slurm-"))
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect();
        assert_eq!(
            status.pointer("/outcome/class").and_then(|c| c.as_str()),
            Some("finished"),
            "{status}\n--- vllm.log\n{vllm_log}\n--- slurm\n{slurm_out}"
        );
        assert!(!vllm_log.contains("Invalid repository ID"), "{vllm_log}");
    }
    // The scratch dir on node-local disk is gone with the job.
    let leftovers: Vec<_> = std::fs::read_dir(site.root().join("scratch/node-local")).unwrap().collect();
    assert!(leftovers.is_empty(), "scratch left behind: {leftovers:?}");
    let ledger = open_ledger(&store.spec).unwrap();
    for attempt in ledger.active().unwrap() {
        if let Some(job) = attempt.slurm_job_id {
            let _ = Command::new("scancel").arg(job).status();
        }
    }
}

/// Without staging — what the job did before: a model not in the cache it reads, offline,
/// fails on the node with vLLM's real message. Now the login node catches it: staging fails with
/// huggingface_hub's own error, nothing is queued, no attempt is counted.
#[test]
fn a_model_missing_from_the_login_nodes_cache_is_never_queued() {
    let Some(site) = Site::new(|_| {}) else { return };
    std::fs::remove_dir_all(site.work().join("hf_cache")).unwrap();
    let store = Store::sqlite();
    let out = site.launch(&store.spec);
    let printed = text(&out);
    assert!(printed.contains("not submitted: staging failed"), "{printed}");
    assert!(printed.contains("offline mode is enabled") || printed.contains("Local entry not found"), "{printed}");
    assert!(printed.contains("0 submitted"), "{printed}");
    let ledger = open_ledger(&store.spec).unwrap();
    assert!(ledger.attempts_for(MODEL, "terminal_bench_2").unwrap().is_empty(), "no attempt burned");
}

/// Two submitters staging the same dataset at once: one copies, the other waits on the lock and
/// finds it staged; the dataset dir is whole either way.
#[test]
fn two_submitters_stage_a_dataset_once() {
    // The copy is slow enough that the second submitter must wait for the first.
    let Some(site) = Site::new(|p| {
        *p = p.replace(
            "dataset_command: [cp, -r, \"${SITE_MIRROR}/{dataset}\", \"{dir}\"]",
            "dataset_command: [sh, -c, 'echo copy >> \"$0.count\"; sleep 2; cp -r \"$1\" \"$0\"', \"{dir}\", \"${SITE_MIRROR}/{dataset}\"]",
        );
    }) else {
        return;
    };
    let preflight = |site: &Site| site.submitter("preflight", &["--preset", "tb2", "--model", MODEL, "--stage"], None);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| preflight(&site));
        let b = s.spawn(|| preflight(&site));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(a.status.success() && b.status.success(), "{}\n{}", text(&a), text(&b));
    let count = std::fs::read_to_string(site.dataset_dir().with_extension("partial.count")).unwrap_or_default();
    assert_eq!(count.lines().count(), 1, "staged once: {count}");
    assert!(site.dataset_dir().join("t2/instruction.md").is_file());
}

/// Preflight refusals: nothing queued, no attempt counted, the why recorded in the run dir.
#[test]
fn preflight_refusals_queue_nothing_and_burn_no_attempt() {
    type Case = (&'static str, fn(&Site), &'static str);
    let cases: [Case; 4] = [
        (
            "reservation",
            |site| {
                edit_profile(site, "  time: \"00:10:00\"\n", "  time: \"00:10:00\"\n  reservation: ended-reservation\n")
            },
            "reservation `ended-reservation` is unknown to Slurm",
        ),
        (
            "partition",
            |site| edit_profile(site, "partition: debug", "partition: boost_usr_prod"),
            "partition `boost_usr_prod`",
        ),
        (
            "secrets mode",
            |site| {
                let file = site.root().join("keys/secrets.env");
                std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
            },
            "has mode 0644",
        ),
        (
            "secrets names",
            |site| std::fs::write(site.root().join("keys/secrets.env"), "DAYTONA_API_KEY=only-one\n").unwrap(),
            "lacks DAYTONA_DATA_API_KEY",
        ),
    ];
    for (what, break_it, why) in cases {
        let Some(site) = Site::new(|_| {}) else { return };
        break_it(&site);
        let store = Store::sqlite();
        let out = site.launch(&store.spec);
        let printed = text(&out);
        assert!(printed.contains("not submitted: preflight failed") && printed.contains(why), "{what}: {printed}");
        assert!(!printed.contains("site-org1-aaa"), "{what}: a secret value was printed");
        let ledger = open_ledger(&store.spec).unwrap();
        assert!(ledger.attempts_for(MODEL, "terminal_bench_2").unwrap().is_empty(), "{what}: no attempt");
        let record = std::fs::read_to_string(site.run_dir().join("preflight.json")).unwrap();
        assert!(record.contains("\"passed\":false") && record.contains(why), "{what}: {record}");
    }
}

pub(crate) fn edit_profile(site: &Site, from: &str, to: &str) {
    let path = site.root().join("clusters/simsite.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{from} not in the profile");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
}

/// The prelude in the job's own shell under Slurm's export rules: a module loads (its variable
/// is there), and an unknown module stops the job with one line before payload starts — and
/// preflight catches the same prelude on the login node.
#[test]
fn the_prelude_loads_modules_in_the_jobs_shell_and_a_failed_load_stops_the_job() {
    let Some(site) = Site::new(|_| {}) else { return };
    let modules = workspace_root().join("tests/site/modulefiles");
    let good = site.root().join("good.prelude.sh");
    std::fs::write(
        &good,
        format!("module use {}\nmodule load cuda/12.8\necho \"SITE_CUDA=$SIMULATED_SITE_CUDA\"\n", modules.display()),
    )
    .unwrap();
    let bad = site.root().join("bad.prelude.sh");
    std::fs::write(
        &bad,
        format!("module use {}\nmodule load cuda/99.9\necho AFTER-THE-FAILED-LOAD\n", modules.display()),
    )
    .unwrap();
    let script = workspace_root().join("sbatch/payload.sbatch");
    let job = |prelude: &Path, tag: &str| -> (String, String) {
        let out_file = site.root().join(format!("{tag}-%j.out"));
        let submitted = Command::new("sbatch")
            .args(["--parsable", "--partition=debug", "--time=1", "--job-name"])
            .arg(format!("site-prelude-{tag}-{}", std::process::id()))
            .arg(format!("--output={}", out_file.display()))
            .arg(format!("--export=PAYLOAD_PRELUDE={}", prelude.display()))
            .arg(&script)
            .arg("--check-prelude")
            .env_remove("PAYLOAD_PRELUDE")
            .output()
            .unwrap();
        assert!(submitted.status.success(), "{}", text(&submitted));
        let id = String::from_utf8_lossy(&submitted.stdout).trim().to_string();
        let out_path = PathBuf::from(out_file.display().to_string().replace("%j", &id));
        let mut exit = String::new();
        wait_until("the prelude job to end", Duration::from_secs(120), || {
            let show = Command::new("scontrol").args(["-o", "show", "job", &id]).output().unwrap();
            let line = String::from_utf8_lossy(&show.stdout).to_string();
            let fields: BTreeMap<&str, &str> = line.split_whitespace().filter_map(|f| f.split_once('=')).collect();
            exit = fields.get("ExitCode").unwrap_or(&"").to_string();
            matches!(fields.get("JobState"), Some(&"COMPLETED") | Some(&"FAILED"))
        });
        (std::fs::read_to_string(out_path).unwrap_or_default(), exit)
    };
    let (output, exit) = job(&good, "good");
    assert!(output.contains("SITE_CUDA=12.8") && exit == "0:0", "{exit}: {output}");
    let (output, exit) = job(&bad, "bad");
    assert_eq!(exit, "78:0", "{output}");
    assert!(output.contains("payload.sbatch: ERROR: prelude") && output.contains("line 2 failed"), "{output}");
    assert!(!output.contains("AFTER-THE-FAILED-LOAD"), "{output}");

    // The same prelude, checked on the login node by preflight.
    edit_profile(
        &site,
        &format!("prelude: {}/site.prelude.sh", site.root().display()),
        &format!("prelude: {}", bad.display()),
    );
    let out = site.submitter("preflight", &["--preset", "tb2", "--model", MODEL, "--stage"], None);
    let printed = text(&out);
    assert_eq!(out.status.code(), Some(1), "{printed}");
    assert!(printed.contains("FAIL  prelude") && printed.contains("line 2 failed"), "{printed}");
}

/// A batch shell with no module system from its login profile (`env -i`, no BASH_ENV, no exported
/// `module`): payload.sbatch initialises Lmod itself, and without any module system a `module`
/// line stops the job naming the fix.
#[test]
fn the_batch_script_initialises_the_module_system_itself() {
    if !lmod_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let modules = workspace_root().join("tests/site/modulefiles");
    let prelude = dir.path().join("p.sh");
    std::fs::write(
        &prelude,
        format!(
            "module use {}\nmodule load gcc/13.2.0 cuda/12.8\necho \"GCC=$SIMULATED_SITE_GCC\"\n",
            modules.display()
        ),
    )
    .unwrap();
    let run = |extra: &[(&str, &str)]| {
        let mut cmd = Command::new("/bin/bash");
        cmd.args(["--noprofile", "--norc"])
            .arg(workspace_root().join("sbatch/payload.sbatch"))
            .arg("--check-prelude")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", dir.path())
            .env("PAYLOAD_PRELUDE", &prelude);
        for (k, v) in extra {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let out = run(&[]);
    assert!(out.status.success() && text(&out).contains("GCC=13.2.0"), "{}", text(&out));
    // No module system at all (an init path that is not there, and none of the usual ones used).
    let script = std::fs::read_to_string(workspace_root().join("sbatch/payload.sbatch")).unwrap();
    let without = dir.path().join("no-modules.sbatch");
    std::fs::write(&without, script.replace("/usr/share/lmod/lmod/init/bash", "/nonexistent/lmod/init/bash")).unwrap();
    let out = Command::new("/bin/bash")
        .args(["--noprofile", "--norc"])
        .arg(&without)
        .arg("--check-prelude")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("PAYLOAD_PRELUDE", &prelude)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    assert!(text(&out).contains("no module system in the job's shell"), "{}", text(&out));
}

/// Done when: every shipped profile, with its site settings (environments, caches, node-local
/// scratch, prelude, secrets location, staging commands), passes preflight on the simulated site.
/// Only the Slurm names are mapped onto the local Slurm (partition `debug`; it has no accounting
/// database and none of the sites' reservations): those checks are exercised above.
#[test]
fn every_shipped_profile_passes_preflight_on_the_simulated_site() {
    let Some(site) = ShippedSite::new() else { return };
    let clusters = site.config_root().join("clusters");
    std::fs::create_dir_all(&clusters).unwrap();
    let shipped = workspace_root().join("clusters");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&shipped).unwrap().filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().to_string();
        let text = std::fs::read_to_string(entry.path()).unwrap();
        let mapped = if name == "gpus.yaml" {
            text
        } else {
            names.push(name.trim_end_matches(".yaml").to_string());
            // The simulated site's nodes are this machine: its partition and architecture, and the
            // payload beside the submitter (no release installed under the site's paths).
            let arch = if cfg!(target_arch = "aarch64") { "  arch: aarch64" } else { "  arch: x86_64" };
            text.lines()
                .filter(|l| !["  account:", "  reservation:", "  payload_bin:"].iter().any(|k| l.starts_with(k)))
                .map(|l| match l {
                    _ if l.starts_with("  partition:") => "  partition: debug",
                    _ if l.starts_with("  arch:") => arch,
                    _ => l,
                })
                .collect::<Vec<_>>()
                .join("\n")
                + "\n"
        };
        std::fs::write(clusters.join(&name), mapped).unwrap();
    }
    names.sort();
    assert!(names.len() >= 4, "{names:?}");
    for name in &names {
        let out = site
            .submitter(&clusters, &["preflight", "--cluster", name, "--preset", "tb2", "--model", ShippedSite::MODEL])
            .output()
            .unwrap();
        assert!(out.status.success(), "clusters/{name}.yaml on the simulated site:\n{}", text(&out));
        let printed = text(&out);
        assert!(!printed.contains("FAIL"), "{printed}");
        eprintln!("{printed}");
    }
}

/// A shipped profile's lines without its `slurm.payload_bin`: the simulated site installs no release
/// under the site's paths, so its jobs run the payload beside the submitter.
pub(crate) fn without_payload_bin(profile: &str) -> String {
    profile.lines().filter(|l| !l.starts_with("  payload_bin:")).map(|l| format!("{l}\n")).collect()
}

/// A site where every shipped profile's paths exist (`${WORK}`, `${SCRATCH}`, `${PROJECT}`,
/// `${SUBMITTER_HOME}`): its environments (stand-ins, and a Python holding the vLLM each declares),
/// a model in each HF cache, tb2 and the ID datasets in each dataset dir, a 0600 secrets file.
pub(crate) struct ShippedSite {
    dir: TempDir,
}

impl ShippedSite {
    pub(crate) const MODEL: &str = "Qwen/Qwen3-8B";
    const VARS: [&str; 4] = ["WORK", "SCRATCH", "PROJECT", "SUBMITTER_HOME"];

    pub(crate) fn new() -> Option<ShippedSite> {
        if !slurm_up() || !lmod_installed() {
            return None;
        }
        let hf = real_hf()?;
        // Each environment's Python holds the vLLM its profile declares (the real venvs' packages):
        // preflight asks it (issue 20); the stand-ins serve.
        let (Some(vllm_016), Some(vllm_033)) = (vllm_venv("0.16.0"), vllm_venv("0.33.0")) else { return None };
        let site = ShippedSite { dir: tempfile::tempdir().unwrap() };
        let bins = binaries();
        let mut prefixes: Vec<PathBuf> = ["WORK", "SCRATCH", "PROJECT"]
            .iter()
            .flat_map(|var| {
                ["otagent", "eval-qwen35", "otagent2-fix"].map(|env| site.var_dir(var).join("envs").join(env))
            })
            .collect();
        prefixes.push(site.var_dir("SUBMITTER_HOME").join(".local-env"));
        for prefix in &prefixes {
            let bin = prefix.join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            std::os::unix::fs::symlink(bins.join("vllm-standin"), bin.join("vllm")).unwrap();
            std::os::unix::fs::symlink(bins.join("harbor-standin"), bin.join("harbor")).unwrap();
            std::os::unix::fs::symlink(&hf, bin.join("hf")).unwrap();
            let venv = if prefix.ends_with("envs/otagent") { &vllm_016 } else { &vllm_033 };
            launch_spec::testkit::world::python_of(prefix, venv);
        }
        for cache in [site.var_dir("WORK").join("hf_cache"), site.var_dir("SCRATCH").join("hf_cache")] {
            cache_model(&cache, Self::MODEL);
        }
        for datasets in [
            site.var_dir("WORK").join("data/datasets"),
            site.var_dir("SCRATCH").join("datasets"),
            site.var_dir("SUBMITTER_HOME").join(".local-run/datasets"),
        ] {
            for dataset in ID_DATASETS {
                write_tasks(&datasets.join(dataset.replace('/', "_")), ["t1"]);
            }
        }
        for file in site.secrets() {
            // The team's Pinggy bank lives here, never in a profile: pair N's URL and token.
            let bank: String = (1..=10)
                .map(|n| format!("PINGGY_URL_{n}=https://team-{n}.a.pinggy.link\nPINGGY_TOKEN_{n}=tok{n}\n"))
                .collect();
            std::fs::write(
                &file,
                format!(concat!("DAYTONA_API_KEY=k1\n", "DAYTONA_DATA_API_KEY=k2\n", "HF_TOKEN=t\n", "{}"), bank),
            )
            .unwrap();
            std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        }
        // `${SUBMITTER_HOME}` (the local profile's paths) is a configuration root of its own, as a
        // user's checkout is: the repository's registry, presets and batch scripts.
        for dir in ["model_config", "presets", "sbatch"] {
            std::os::unix::fs::symlink(workspace_root().join(dir), site.config_root().join(dir)).unwrap();
        }
        // Leonardo's tunnel key with its step-ca certificate (preflight checks it is valid): a CA of
        // this site signs it for the next 12 hours.
        let ssh = site.dir.path().join("home/.ssh");
        std::fs::create_dir_all(&ssh).unwrap();
        let keygen =
            |args: &[&str]| assert!(Command::new("ssh-keygen").args(args).status().unwrap().success(), "{args:?}");
        let (ca, key) = (ssh.join("site_ca"), ssh.join("step_ca_key"));
        keygen(&["-q", "-t", "ed25519", "-N", "", "-f", ca.to_str().unwrap()]);
        keygen(&["-q", "-t", "ed25519", "-N", "", "-f", key.to_str().unwrap()]);
        let public = format!("{}.pub", key.display());
        keygen(&["-q", "-s", ca.to_str().unwrap(), "-I", "tester", "-n", "tester", "-V", "-1h:+12h", &public]);
        Some(site)
    }

    fn var_dir(&self, var: &str) -> PathBuf {
        self.dir.path().join(var.to_lowercase())
    }

    pub(crate) fn config_root(&self) -> PathBuf {
        self.var_dir("SUBMITTER_HOME")
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    fn secrets(&self) -> [PathBuf; 3] {
        [
            self.dir.path().join("login-shell-secrets.env"),
            self.var_dir("SCRATCH").join("keys.env"),
            self.var_dir("SUBMITTER_HOME").join(".local-run/secrets.env"),
        ]
    }

    /// `submitter ARGS --clusters CLUSTERS` from a login shell of this site.
    pub(crate) fn submitter(&self, clusters: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(SUBMITTER);
        cmd.args(args)
            .arg("--clusters")
            .arg(clusters)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .env("HOME", self.dir.path().join("home"))
            .env("USER", "tester")
            .env("DC_AGENT_SECRET_ENV", &self.secrets()[0])
            .env("MODULEPATH", workspace_root().join("tests/site/modulefiles"))
            .env("PAYLOAD_GPU_FIXTURE", workspace_root().join("tests/fixtures/gpus-4x-a100-64gb.json"))
            .current_dir(workspace_root());
        for var in Self::VARS {
            cmd.env(var, self.var_dir(var));
        }
        cmd
    }
}

/// `submitter preflight`'s human and JSON outputs (versioned document), as snapshots: the site's
/// temp dir and the repository are placeholders.
#[test]
fn preflight_outputs() {
    let Some(site) = Site::new(|_| {}) else { return };
    let root = site.root().display().to_string();
    let repo = workspace_root().display().to_string();
    // This machine's architecture and glibc versions are placeholders too.
    let machine = regex::Regex::new(r"is (x86_64|aarch64), needs glibc [0-9.]+, the nodes have [0-9.]+").unwrap();
    for format in ["human", "json"] {
        let out =
            site.submitter("preflight", &["--preset", "tb2", "--model", MODEL, "--stage", "--format", format], None);
        assert!(out.status.success(), "{}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout).replace(&root, "<site>").replace(&repo, "<repo>");
        let stdout = machine.replace_all(&stdout, "is <arch>, needs glibc <built>, the nodes have <node>").to_string();
        insta::assert_snapshot!(format!("preflight_{format}"), stdout);
    }
    // A failed check: exit 1 (the command ran and found a problem), the same document.
    std::fs::set_permissions(site.root().join("keys/secrets.env"), std::os::unix::fs::PermissionsExt::from_mode(0o640))
        .unwrap();
    let out = site.submitter("preflight", &["--preset", "tb2", "--model", MODEL, "--json"], None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (doc["format_version"].as_u64(), doc["kind"].as_str(), doc["passed"].as_bool()),
        (Some(1), Some("preflight"), Some(false))
    );
}

/// A cluster whose compute nodes have internet (Vista's shape): nothing is staged for the model,
/// and what the job downloads lands in the profile's cache, never under the job's `$HOME`.
#[test]
fn with_internet_the_job_downloads_into_the_profiles_cache_not_home() {
    let Some(site) = Site::new(|p| {
        *p = p
            .replace("  internet: false", "  internet: true")
            .replace("    STANDIN_HUB: unreachable", "    STANDIN_HUB: reachable")
            .replace("  enabled: true\n", "  enabled: false\n");
    }) else {
        return;
    };
    std::fs::remove_dir_all(site.work().join("hf_cache")).unwrap();
    std::fs::create_dir_all(site.work().join("hf_cache")).unwrap();
    // The job's HOME is the user's login HOME on the node (Slurm's export rules): root's here.
    let home_cache = PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
        .join(".cache/huggingface/hub/models--test--Tiny-1B");
    let home_before = home_cache.exists();
    let store = Store::sqlite();
    let out = site.launch(&store.spec);
    let printed = text(&out);
    assert!(out.status.success() && printed.contains("1 submitted"), "{printed}");
    assert!(!printed.contains("staging model"), "{printed}");
    wait_until("the job to finish", Duration::from_secs(240), || {
        status(&site.run_dir()).is_some_and(|s| !s["outcome"].is_null())
    });
    let status = status(&site.run_dir()).unwrap();
    assert_eq!(status.pointer("/outcome/class").and_then(|c| c.as_str()), Some("finished"), "{status}");
    let downloaded = site.work().join("hf_cache/models--test--Tiny-1B/refs/main");
    assert!(downloaded.is_file(), "the download went to the profile's cache");
    assert_eq!(home_cache.exists(), home_before, "nothing downloaded under $HOME");
    let spec = launch_spec::LaunchSpec::from_file(&site.run_dir().join("launch.json")).unwrap();
    assert!(!spec.serve.env.contains_key("HF_HUB_OFFLINE"), "online where the nodes have internet");
}

/// Issue 21 item 6: preflight reads the secrets file and the Harbor job config with payload's own
/// readers, so what the job would refuse on the node (exit 3 or 14 after its wait in the queue) fails
/// here: a malformed line, an unterminated quote, a NUL byte, more than 1 MiB; a YAML tab error,
/// more than 4 MiB. Each failure names the file and the line, never a secret's value.
#[test]
fn preflight_refuses_what_payload_refuses() {
    if !slurm_up() {
        return;
    }
    let cluster = crate::queueing::TestCluster::new("refuses", |_| {});
    let secrets = cluster.root().join("secrets.env");
    let good = std::fs::read_to_string(&secrets).unwrap();
    let preflight = |extra: &[&str]| {
        let args = [&["--preset", "tb2", "--model", "test/Tiny-1B", "--json"][..], extra].concat();
        let out = cluster.command_without_ledger(&["preflight"], &args, &[]).output().unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        (out.status.code(), doc, text(&out))
    };
    let failed = |doc: &serde_json::Value, check: &str| {
        doc["checks"].as_array().into_iter().flatten().find(|c| c["name"] == check && c["level"] == "fail").cloned()
    };
    let (code, _, printed) = preflight(&[]);
    assert_eq!(code, Some(0), "the test cluster passes: {printed}");
    let secret_cases: [(&str, Vec<u8>, &str); 4] = [
        ("malformed line", format!("{good}this is sekrit\n").into_bytes(), "line 3: expected KEY=VALUE"),
        ("unterminated quote", format!("{good}HF_TOKEN='sekrit\n").into_bytes(), "line 3: unterminated quote"),
        ("NUL byte", format!("{good}HF_TOKEN=sek\0rit\n").into_bytes(), "line 3: contains a NUL byte"),
        ("over 1 MiB", format!("{good}#{}\n", "x".repeat(1 << 20)).into_bytes(), "byte limit"),
    ];
    for (what, bytes, why) in secret_cases {
        std::fs::write(&secrets, bytes).unwrap();
        let (code, doc, printed) = preflight(&[]);
        assert_eq!(code, Some(1), "{what}: {printed}");
        let check = failed(&doc, "secrets").unwrap_or_else(|| panic!("{what}: secrets passed: {printed}"));
        let detail = check["detail"].as_str().unwrap();
        assert!(detail.contains("secrets.env") && detail.contains(why), "{what}: {detail}");
        assert!(!printed.contains("sekrit"), "{what}: a value was printed: {printed}");
    }
    std::fs::write(&secrets, &good).unwrap();
    let config = cluster.root().join("job.yaml");
    let config_cases: [(&str, String, &str); 2] = [
        ("a tab", "n_attempts: 1\norchestrator:\n\ttype: local\n".to_string(), "job.yaml:3"),
        ("over 4 MiB", format!("n_attempts: 1\n#{}\n", "x".repeat(4 << 20)), "byte limit"),
    ];
    for (what, text, why) in config_cases {
        std::fs::write(&config, text).unwrap();
        let (code, doc, printed) = preflight(&["--harbor-config", config.to_str().unwrap()]);
        // An explicit config is read when the spec is built (its timeout_multiplier is the
        // policy's first source), so it is refused there as bad input (2), naming the file; else
        // preflight's harbor_config check fails it (1). Either way nothing is queued.
        match code {
            Some(2) => assert!(printed.contains("job.yaml") && printed.contains(why), "{what}: {printed}"),
            _ => {
                assert_eq!(code, Some(1), "{what}: {printed}");
                let check =
                    failed(&doc, "harbor_config").unwrap_or_else(|| panic!("{what}: the config passed: {printed}"));
                assert!(check["detail"].as_str().unwrap().contains(why), "{what}: {check}");
            }
        }
    }
}

/// Versions asked, not trusted (issue 20): preflight asks the environment's own Python, through the
/// site's prelude, which vLLM it holds (the real vLLM 0.16.0's package metadata here). Declared
/// 0.33.0: refused in one line naming the environment, both versions and the fix, and `launch`
/// queues nothing and counts no attempt; declared 0.17.1 (0.16's capability class): it passes and
/// says what it found.
#[test]
fn preflight_refuses_a_vllm_declaration_the_environment_contradicts() {
    let Some(venv) = vllm_venv("0.16.0") else { return };
    let declare = |vllm: &'static str| {
        move |profile: &mut String| {
            *profile = profile.replace(
                "    path: ${WORK}/envs/otagent\n",
                &format!("    path: ${{WORK}}/envs/otagent\n    vllm: \"{vllm}\"\n"),
            )
        }
    };
    let Some(site) = Site::new(declare("0.33.0")) else { return };
    launch_spec::testkit::world::python_of(&site.work().join("envs/otagent"), &venv);
    let out = site.submitter("preflight", &["--preset", "tb2", "--model", MODEL, "--stage", "--json"], None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let check = doc["checks"].as_array().unwrap().iter().find(|c| c["name"] == "versions").cloned().unwrap();
    assert_eq!(check["level"], "fail", "{check}");
    assert_eq!(
        check["detail"],
        "environment `otagent` declares vLLM 0.33.0 but holds vLLM 0.16.0 (they differ in --swap-space (0.33.0 lacks, 0.16.0 has it), --distributed-timeout-seconds (0.33.0 has, 0.16.0 lacks it), the environment variables it knows (VLLM_USE_V1, VLLM_ALL2ALL_BACKEND)): edit `environments.otagent.vllm` in cluster profile `simsite` (to \"0.16.0\", or install vLLM 0.33.0 there)"
    );
    let store = Store::sqlite();
    let launched = site.launch(&store.spec);
    assert!(
        text(&launched).contains("not submitted: preflight") && text(&launched).contains("declares vLLM 0.33.0"),
        "{}",
        text(&launched)
    );
    let ledger = open_ledger(&store.spec).unwrap();
    assert!(ledger.attempts_for(MODEL, "terminal_bench_2").unwrap().is_empty(), "preflight burnt an attempt");

    let Some(site) = Site::new(declare("0.17.1")) else { return };
    launch_spec::testkit::world::python_of(&site.work().join("envs/otagent"), &venv);
    let out = site.submitter("preflight", &["--preset", "tb2", "--model", MODEL, "--stage"], None);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("vLLM 0.16.0 in otagent (declared 0.17.1), Harbor 0.25.0 in otagent (declared 0.25.0)"),
        "{}",
        text(&out)
    );
}
