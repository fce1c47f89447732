//! Turning a launch spec into an `sbatch` request (docs/design.md §7.4): resources from TP×DP and the cluster
//! profile, an explicit `--export` list, output in the run dir. Pure: no process is started here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use launch_spec::LaunchSpec;

use crate::config::{ClusterProfile, parse_slurm_time};
use crate::slurm::{SbatchOptions, SignalSpec, SubmitRequest};

/// The batch job's own output file, a plain file in the run dir (Harbor deletes subdirectories).
pub(crate) const SLURM_OUTPUT: &str = "slurm-%j.out";

#[derive(Clone)]
pub(crate) struct JobInputs<'a> {
    pub cluster: &'a ClusterProfile,
    pub spec: &'a LaunchSpec,
    /// Where the spec was written (`<run_dir>/launch.json`).
    pub spec_path: &'a Path,
    /// The batch script and the payload binary as seen from the compute node.
    pub script: &'a Path,
    pub payload_bin: &'a Path,
    /// The prelude the script sources (absolute), when the profile has one.
    pub prelude: Option<&'a Path>,
    /// Slurm `--time`, partition, account and reservation for this leg (`ResolvedSettings::slurm_choice`).
    pub choice: &'a SlurmChoice,
    /// The job's name (`names::job_name`, settled by the planner).
    pub job_name: &'a str,
    pub dependency: Option<String>,
    /// The submitter's environment, for the cluster's `export_env` names.
    pub environment: &'a dyn Fn(&str) -> Option<String>,
}

/// The operator's Slurm overrides (`--partition`, `--account`, `--qos`, `--reservation`, `--time`,
/// `--exclude`). An empty `reservation`, `qos` or `exclude` clears the profile's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlurmOverrides {
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    pub reservation: Option<String>,
    pub time: Option<String>,
    pub exclude: Option<String>,
}

/// Where and for how long one leg's jobs run (`ResolvedSettings::slurm_choice`: the command line,
/// else the preset, else the profile).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct SlurmChoice {
    pub partition: String,
    pub account: Option<String>,
    pub qos: Option<String>,
    pub reservation: Option<String>,
    pub time: String,
    /// Nodes the job must not run on (`--exclude`).
    pub exclude: Option<String>,
}

/// Builds the request. Errors name the field to fix.
pub(crate) fn sbatch_request(inputs: &JobInputs) -> Result<SubmitRequest, String> {
    let cluster = inputs.cluster;
    let hardware = &cluster.hardware;
    // Per node: a multi-node engine asks for the same GPUs on each of its nodes.
    let gpus = inputs.spec.gpus_needed();
    let nodes = inputs.spec.serve.nodes.max(1);
    let per_node = hardware.gpus_per_node.max(1);
    let choice = inputs.choice;
    let time = parse_slurm_time(&choice.time)
        .ok_or_else(|| format!("slurm time `{}` is not a Slurm time (HH:MM:SS or D-HH:MM:SS)", choice.time))?;
    let mut options = SbatchOptions {
        job_name: Some(inputs.job_name.to_string()),
        partition: Some(choice.partition.clone()),
        account: choice.account.clone(),
        qos: choice.qos.clone(),
        reservation: choice.reservation.clone(),
        exclude: choice.exclude.clone(),
        time_limit: Some(Duration::from_secs(time)),
        signal: Some(SignalSpec {
            signal: "USR1".to_string(),
            seconds_before_limit: u32::try_from(inputs.spec.limits.walltime_lead_s).unwrap_or(u32::MAX),
            batch_only: true,
        }),
        output: Some(inputs.spec.run_dir.join(SLURM_OUTPUT)),
        dependency: inputs.dependency.clone(),
        extra_args: cluster.slurm.extra_args.clone(),
        ..SbatchOptions::default()
    };
    if cluster.slurm.gpu_gres {
        // CPUs and memory in proportion to the share of the node's GPUs.
        options.gpus_per_node = Some(gpus);
        options.cpus_per_task =
            Some((u64::from(hardware.cpus_per_node) * u64::from(gpus) / u64::from(per_node)).max(1) as u32);
        options.mem_mb = Some((hardware.mem_per_node_mb * u64::from(gpus) / u64::from(per_node)).max(1));
        if nodes > 1 {
            options.nodes = Some(nodes);
        }
    } else {
        // GPUs not gres-tracked (Vista): whole nodes.
        options.nodes = Some(nodes.max(gpus.div_ceil(per_node)));
    }
    if nodes > 1 {
        // One task per node: the batch step is the head, payload starts the others with srun.
        options.ntasks_per_node = Some(1);
    }
    let mut export = vec![("PAYLOAD_BIN".to_string(), inputs.payload_bin.display().to_string())];
    if let Some(prelude) = inputs.prelude {
        export.push(("PAYLOAD_PRELUDE".to_string(), prelude.display().to_string()));
    }
    for name in &cluster.slurm.export_env {
        if let Some(value) = (inputs.environment)(name) {
            export.push((name.clone(), value));
        }
    }
    Ok(SubmitRequest {
        script: inputs.script.to_path_buf(),
        script_args: vec![inputs.spec_path.display().to_string()],
        options,
        export,
    })
}

/// A shared job's request (issue 24) from its first leg's per-leg request: the batch script gets
/// `<flag> <group dir>/<doc>` (`--shared …/shared.json`, or `--pool …/pool.json` for a pool, issue
/// 37), the output goes to the group dir, and the job asks for
/// `time_s` under `job_name`. Everything else (GPUs, placement, signal, `--export`) is the legs'
/// own: they agree on the engine and the placement, or they are not grouped.
pub(crate) fn shared_request(
    leg: &SubmitRequest,
    flag: &str,
    shared_spec: &Path,
    group_dir: &Path,
    time_s: u64,
    job_name: String,
) -> SubmitRequest {
    let mut request = leg.clone();
    request.script_args = vec![flag.to_string(), shared_spec.display().to_string()];
    request.options.output = Some(group_dir.join(SLURM_OUTPUT));
    request.options.time_limit = Some(Duration::from_secs(time_s));
    request.options.job_name = Some(job_name);
    request
}

/// Seconds as a Slurm `--time` (`HH:MM:SS`, or `D-HH:MM:SS` from a day on), rounded up to a minute.
pub(crate) fn format_slurm_time(seconds: u64) -> String {
    let minutes = seconds.div_ceil(60);
    let (days, hours, minutes) = (minutes / 1440, minutes / 60 % 24, minutes % 60);
    if days > 0 { format!("{days}-{hours:02}:{minutes:02}:00") } else { format!("{hours:02}:{minutes:02}:00") }
}

/// The run dir's spec path.
pub fn spec_path(spec: &LaunchSpec) -> PathBuf {
    spec.run_dir.join(launch_spec::records::SPEC_FILE)
}

/// Whether `spec` may be written into its run dir: a run dir holding another (model, benchmark)'s
/// spec is never reused (a resubmission of the same pair resumes it). Errors say whose it is.
pub(crate) fn run_dir_free_for(spec: &LaunchSpec) -> Result<(), String> {
    // A fresh run never lands on a Harbor job: its run dir and result stay as they are.
    let harbor_job = spec.run_dir.join(launch_spec::rundir::harbor::CONFIG_FILE);
    if spec.harbor.start == launch_spec::spec::HarborStart::Fresh && std::fs::symlink_metadata(&harbor_job).is_ok() {
        return Err(format!(
            "run dir {} already holds a Harbor job and this attempt is a fresh run: never overwritten (move it aside)",
            spec.run_dir.display()
        ));
    }
    let path = spec_path(spec);
    let existing: launch_spec::rundir::LaunchView = match launch_spec::rundir::harbor::read(&path) {
        Ok(Some(view)) => view,
        Ok(None) => return Ok(()),
        Err(err) => return Err(format!("{}: not a launch spec ({err}): move the run dir aside", path.display())),
    };
    let model = existing.model.hf_id.as_deref();
    let benchmark = existing.benchmark.as_deref();
    if model == Some(spec.model.hf_id.as_str()) && benchmark == Some(spec.benchmark.as_str()) {
        return Ok(());
    }
    Err(format!(
        "run dir {} holds the spec of model {} on {}, not {} on {}: never overwritten (move it aside)",
        spec.run_dir.display(),
        model.unwrap_or("?"),
        benchmark.unwrap_or("?"),
        spec.model.hf_id,
        spec.benchmark
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use crate::slurm::build_sbatch_args;
    use crate::spec_build::{SpecBuilder, SpecOverrides};
    use crate::testkit::Shipped;

    fn args_for(cluster_name: &str, model: &str) -> Vec<String> {
        let shipped = Shipped::load();
        let mut cluster = shipped.cluster(cluster_name);
        // Site paths use ${WORK}/${SCRATCH}/${PROJECT}; pin them so the test needs no environment.
        for env in cluster.environments.values_mut() {
            env.path = PathBuf::from("/site/env");
        }
        cluster.paths.jobs_dir = PathBuf::from("/site/jobs");
        cluster.paths.datasets_dirs = vec![PathBuf::from("/site/datasets")];
        cluster.paths.hf_cache = Some(PathBuf::from("/site/hf_cache"));
        for value in cluster.engine.env.values_mut() {
            *value = value.replace("${SCRATCH}", "/site");
        }
        cluster.secrets.file = None;
        let preset = shipped.preset("tb2");
        let context = shipped.builder(&cluster);
        let spec = context.build(&model.parse().unwrap(), &preset, &SpecOverrides::default()).unwrap();
        let env = |name: &str| (name == "PAYLOAD_GPU_FIXTURE").then(|| "/tmp/gpus.json".to_string());
        let choice = slurm_choice(&context, &preset, &SlurmOverrides::default());
        let request = sbatch_request(&JobInputs {
            cluster: &cluster,
            spec: &spec,
            spec_path: &spec_path(&spec),
            script: Path::new("/repo/sbatch/payload.sbatch"),
            payload_bin: Path::new("/repo/bin/payload"),
            prelude: cluster.slurm.prelude.as_ref().map(|p| shipped.root.root.join(p)).as_deref(),
            choice: &choice,
            job_name: &crate::registry::names::job_name("tb2", model),
            dependency: None,
            environment: &env,
        })
        .unwrap();
        build_sbatch_args(&request).unwrap().into_iter().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    /// A leg's Slurm choice, as the planner resolves it.
    fn slurm_choice(context: &SpecBuilder, preset: &config::Preset, cli: &SlurmOverrides) -> SlurmChoice {
        let none = SpecOverrides::default();
        let choices = crate::settings::Choices { spec: &none, slurm: cli, allocation: None };
        context.settings("org/M-8B", preset, choices, None).slurm_choice()
    }

    #[test]
    fn local_cluster_requests_gres_and_exports_named_variables_only() {
        let args = args_for("local", "Qwen/Qwen3-32B").join(" ");
        assert!(args.contains("--gres=gpu:4") || args.contains("--gres gpu:4"), "{args}");
        assert!(args.contains("--partition=debug") || args.contains("--partition debug"), "{args}");
        assert!(args.contains("B:USR1@60"), "{args}");
        assert!(args.contains("PAYLOAD_BIN") && args.contains("PAYLOAD_GPU_FIXTURE"), "{args}");
        assert!(args.contains("slurm-%j.out"), "{args}");
        assert!(args.ends_with("launch.json"), "{args}");
        assert!(!args.contains("DAYTONA"), "{args}");
    }

    #[test]
    fn leonardo_scales_cpus_and_memory_with_gpus() {
        // Qwen3-8B: TP1 × DP4 on 4 GPUs → the whole node; a TP2 × DP2 32B also.
        let args = args_for("leonardo", "Qwen/Qwen3-8B").join(" ");
        assert!(args.contains("gpu:4") && args.contains("32") && args.contains("490000"), "{args}");
        assert!(args.contains("AIFAC_L01_028") && args.contains("B:USR1@900"), "{args}");
    }

    #[test]
    fn multi_node_engines_ask_for_nodes_and_one_task_per_node() {
        // 235B-A22B on Leonardo: TP 4 × PP 4 over 4 gres-tracked nodes, each with all 4 GPUs,
        // CPUs and memory.
        let args = args_for("leonardo", "Qwen/Qwen3-235B-A22B-Instruct-2507");
        for want in ["--nodes=4", "--ntasks-per-node=1", "--gres=gpu:4", "--cpus-per-task=32", "--mem=490000M"] {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
        // 70B on Vista: GPUs not gres-tracked, so whole nodes only.
        let args = args_for("vista", "meta-llama/Llama-3.3-70B-Instruct");
        assert!(args.iter().any(|a| a == "--nodes=2") && args.iter().any(|a| a == "--ntasks-per-node=1"), "{args:?}");
        assert!(!args.iter().any(|a| a.starts_with("--gres")), "{args:?}");
        // A single-node engine keeps its old request (no --nodes, no --ntasks-per-node where gres-tracked).
        let args = args_for("leonardo", "Qwen/Qwen3-8B");
        assert!(!args.iter().any(|a| a.starts_with("--nodes") || a.starts_with("--ntasks")), "{args:?}");
    }

    #[test]
    fn a_run_dir_holding_another_pairs_spec_is_never_reused() {
        let tmp = tempfile::tempdir().unwrap();
        let spec_for = |model: &str| {
            launch_spec::testkit::TestSpec::new("/", "t")
                .model(model, "m")
                .with(|s| s.run_dir = tmp.path().to_path_buf())
                .build()
        };
        let first = spec_for("a/b__c-8B");
        assert!(run_dir_free_for(&first).is_ok(), "empty run dir");
        std::fs::write(spec_path(&first), first.to_json()).unwrap();
        assert!(run_dir_free_for(&first).is_ok(), "the same pair resumes");
        std::fs::write(tmp.path().join("config.json"), "{}").unwrap();
        assert!(run_dir_free_for(&first).is_ok(), "an unfinished Harbor job resumes");
        let mut fresh = first.clone();
        fresh.harbor.start = launch_spec::spec::HarborStart::Fresh;
        assert!(run_dir_free_for(&fresh).unwrap_err().contains("already holds a Harbor job"));
        std::fs::remove_file(tmp.path().join("config.json")).unwrap();
        let err = run_dir_free_for(&spec_for("a__b/c-8B")).unwrap_err();
        assert!(err.contains("a/b__c-8B") && err.contains("never overwritten"), "{err}");
        std::fs::remove_file(spec_path(&first)).unwrap();
        std::os::unix::fs::symlink("/dev/zero", spec_path(&first)).unwrap();
        assert!(run_dir_free_for(&first).unwrap_err().contains("symlink"));
    }

    #[test]
    fn the_command_line_beats_the_preset_beats_the_profile() {
        let shipped = Shipped::load();
        let cluster = shipped.cluster("jupiter");
        let context = shipped.builder(&cluster);
        let mut preset = shipped.preset("swebench_full");
        let none = SlurmOverrides::default();
        let choice = slurm_choice(&context, &preset, &none);
        assert_eq!(
            (choice.partition.as_str(), choice.account.as_deref(), choice.reservation.as_deref(), choice.time.as_str()),
            ("booster", Some("reformo"), None, "48:00:00"),
            "profile (no reservation: the team names the live one per launch), with the preset's slurm_time"
        );
        preset.slurm_partition = Some("develbooster".into());
        preset.slurm_account = Some("other".into());
        let choice = slurm_choice(&context, &preset, &none);
        assert_eq!((choice.partition.as_str(), choice.account.as_deref()), ("develbooster", Some("other")));
        let cli = SlurmOverrides {
            partition: Some("p".into()),
            account: Some("a".into()),
            reservation: Some("r".into()),
            time: Some("01:00:00".into()),
            ..SlurmOverrides::default()
        };
        let choice = slurm_choice(&context, &preset, &cli);
        assert_eq!(
            (choice.partition.as_str(), choice.account.as_deref(), choice.reservation.as_deref(), choice.time.as_str()),
            ("p", Some("a"), Some("r"), "01:00:00")
        );
    }

    #[test]
    fn slurm_times_format_back_to_what_they_parse_from() {
        for (seconds, text) in [(1920, "00:32:00"), (61, "00:02:00"), (86_400 + 3_600, "1-01:00:00"), (0, "00:00:00")] {
            assert_eq!(format_slurm_time(seconds), text);
        }
        assert_eq!(config::parse_slurm_time(&format_slurm_time(172_800)), Some(172_800));
    }

    #[test]
    fn vista_requests_whole_nodes_not_gres() {
        let args = args_for("vista", "Qwen/Qwen3-32B").join(" ");
        assert!(!args.contains("--gres"), "{args}");
        assert!(args.contains("--nodes=1") || args.contains("--nodes 1"), "{args}");
    }
}
