//! `payload` CLI: parses arguments and wires commands; everything else lives in the library.
//! Exit codes: docs/exit-codes.md (one per outcome class, 128+n for signals).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use launch_spec::{LaunchSpec, OutcomeClass};

#[derive(Parser)]
#[command(name = "payload", version, about = "Runs one evaluation inside a Slurm job: vLLM + Harbor, supervised")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a shell completion script (bash, zsh, fish, …) on stdout.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (`payload.1`, `payload-run.1`, …) into DIR (scripts/release).
    #[command(hide = true)]
    Man {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Run the job described by a launch spec, or a shared job's legs against one engine (the
    /// sbatch script execs this).
    Run {
        /// The launch spec (launch.json).
        #[arg(long, required_unless_present_any = ["shared", "pool"], conflicts_with_all = ["shared", "pool"])]
        spec: Option<PathBuf>,
        /// A shared job (`<group_dir>/shared.json`): one engine, every leg against it
        /// (docs/payload.md "Shared jobs").
        #[arg(long, conflicts_with = "pool")]
        shared: Option<PathBuf>,
        /// A pool (`<group_dir>/pool.json`): several fine-tunes on one engine start, their weights
        /// swapped in place (docs/pools.md).
        #[arg(long)]
        pool: Option<PathBuf>,
        /// A leg of a shared job: the engine host's `engine.json` (started by `--shared` only).
        #[arg(long, hide = true, requires = "spec")]
        engine: Option<PathBuf>,
    },
    /// Show everything `run` would do, without doing it.
    Plan {
        #[arg(long)]
        spec: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Also run the installed Harbor's `--print-config` on the Harbor argv (fails, exit 14,
        /// where Harbor would refuse it); skipped when Harbor cannot be run here.
        #[arg(long)]
        check_harbor: bool,
    },
    /// One secondary rank of a multi-node engine: a task of the srun step `payload run` starts on
    /// the other nodes (docs/multinode.md). Records itself and execs its vLLM argv.
    #[command(hide = true)]
    Rank {
        /// The ranks file the head wrote (`<run_dir>/ranks.json`).
        #[arg(long)]
        ranks: PathBuf,
    },
    /// The GPU inventory (NVML, or $PAYLOAD_GPU_FIXTURE) and the matched GPU profile.
    Gpus {
        #[arg(long)]
        json: bool,
        /// GPU profiles file (clusters/gpus.yaml); default $PAYLOAD_GPU_PROFILES, else inventory only.
        #[arg(long, env = "PAYLOAD_GPU_PROFILES")]
        profiles: Option<PathBuf>,
    },
}

/// The log on stderr: JSON lines where it goes to a file (the job's Slurm output, which tools read),
/// human-readable lines on a terminal (`payload plan`, `payload run` inside `salloc`), coloured
/// unless `NO_COLOR` is set (issue 36).
fn init_logging() {
    use std::io::IsTerminal;
    let directives = launch_spec::logging::filter_directives("PAYLOAD_LOG", "info");
    let filter = tracing_subscriber::EnvFilter::try_new(directives)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| payload::logsink::Stderr)
        .log_internal_errors(false);
    if std::io::stderr().is_terminal() {
        builder.with_ansi(launch_spec::logging::stderr_colour()).with_target(false).init();
    } else {
        builder.json().with_current_span(false).with_span_list(false).init();
    }
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(code.clamp(0, 255) as u8)
}

async fn plan(spec_path: &std::path::Path, json: bool, check_harbor: bool) -> anyhow::Result<i32> {
    let spec = match LaunchSpec::from_file(spec_path) {
        Ok(spec) => spec,
        Err(err) => {
            payload::logsink::line(&format!("error: {err}"));
            return Ok(OutcomeClass::Spec.exit_code());
        }
    };
    let mut plan = payload::plan::build(spec_path, &spec, &payload::prepare::parent_env());
    if check_harbor {
        payload::plan::check_harbor(&spec, &mut plan).await;
    }
    let mut out = std::io::stdout().lock();
    if json {
        out.write_all(launch_spec::document::document("payload.plan", &plan).as_bytes()).context("writing the plan")?;
    } else {
        payload::plan::render(&plan, &mut out).context("writing the plan")?;
    }
    Ok(payload::plan::exit_code(&plan))
}

/// `payload gpus --json` (a `payload.gpus` document): what was probed and each GPU with the
/// profile it matches.
#[derive(serde::Serialize)]
struct GpusOutput<'a> {
    /// The probe used: NVML, or the fixture file named by `$PAYLOAD_GPU_FIXTURE`.
    probe: String,
    gpus: Vec<GpuRow<'a>>,
}

#[derive(serde::Serialize)]
struct GpuRow<'a> {
    index: u32,
    uuid: &'a str,
    name: &'a str,
    memory_total_bytes: u64,
    /// The matched GPU profile (null without `--profiles` or without a match).
    profile: Option<&'a str>,
    gpu_memory_utilization: Option<f64>,
}

fn gpus(json: bool, profiles: Option<PathBuf>) -> anyhow::Result<i32> {
    let parent = payload::prepare::parent_env();
    let env_fn = payload::prepare::lookup(&parent);
    let profiles = match profiles {
        Some(path) => match payload::gpu::load_profiles(&path) {
            Ok(p) => Some(p),
            Err(err) => {
                payload::logsink::line(&format!("error: {err}"));
                return Ok(OutcomeClass::Spec.exit_code());
            }
        },
        None => None,
    };
    let probe = payload::gpu::probe_from_env(&env_fn);
    let inventory = match probe.probe() {
        Ok(list) => list,
        Err(err) => {
            payload::logsink::line(&format!("error: {err}"));
            return Ok(OutcomeClass::Gpu.exit_code());
        }
    };
    let rows: Vec<GpuRow> = inventory
        .iter()
        .map(|g| {
            let profile = profiles.as_ref().and_then(|p| p.select(g));
            GpuRow {
                index: g.index,
                uuid: &g.uuid,
                name: &g.name,
                memory_total_bytes: g.memory_total_bytes,
                profile: profile.map(|p| p.name.as_str()),
                gpu_memory_utilization: profile.map(|p| p.gpu_memory_utilization),
            }
        })
        .collect();
    let mut out = std::io::stdout().lock();
    if json {
        let doc = GpusOutput { probe: probe.describe(), gpus: rows };
        out.write_all(launch_spec::document::document("payload.gpus", &doc).as_bytes())?;
    } else {
        writeln!(out, "probe: {}", probe.describe())?;
        writeln!(out, "{:<5} {:<42} {:<28} {:>10}  profile", "index", "uuid", "name", "memory")?;
        for (g, row) in inventory.iter().zip(&rows) {
            let profile = match (row.profile, row.gpu_memory_utilization) {
                (Some(name), Some(util)) => format!("{name} (gpu_memory_utilization {util})"),
                _ if profiles.is_some() => "no match".to_string(),
                _ => "-".to_string(),
            };
            writeln!(out, "{:<5} {:<42} {:<28} {:>6.1} GiB  {profile}", g.index, g.uuid, g.name, g.memory_total_gib())?;
        }
    }
    Ok(0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    // A panic (a bug) still takes every child group down with it; the default report follows.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        payload::supervisor::emergency_teardown();
        report(info);
    }));
    let result = match cli.command {
        Command::Run { pool: Some(pool), .. } => Ok(payload::run::pool::run_pool(&pool).await),
        Command::Run { shared: Some(shared), .. } => Ok(payload::run::shared::run_shared(&shared).await),
        Command::Run { spec: Some(spec), engine: Some(engine), .. } => {
            Ok(payload::run::shared::run_leg(&spec, &engine).await)
        }
        Command::Run { spec: Some(spec), .. } => Ok(payload::run::run(&spec).await),
        Command::Run { spec: None, shared: None, .. } => {
            Err(anyhow::anyhow!("payload run needs --spec, --shared or --pool"))
        }
        Command::Plan { spec, json, check_harbor } => plan(&spec, json, check_harbor).await,
        Command::Gpus { json, profiles } => gpus(json, profiles),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "payload", &mut std::io::stdout());
            Ok(0)
        }
        Command::Man { out } => {
            use clap::CommandFactory;
            clap_mangen::generate_to(Cli::command(), &out)
                .with_context(|| format!("writing the man pages into {}", out.display()))
                .map(|()| 0)
        }
        Command::Rank { ranks } => {
            let parent = payload::prepare::parent_env();
            let err = payload::multinode::exec_rank(&ranks, &payload::prepare::lookup(&parent));
            // Only a failure returns; the srun step (--kill-on-bad-exit) then ends every rank.
            Err(anyhow::Error::new(err).context("payload rank"))
        }
    };
    match result {
        Ok(code) => exit(code),
        Err(err) => {
            payload::logsink::line(&format!("error: {err:#}"));
            exit(payload::exit::EXIT_COMMAND_FAILED)
        }
    }
}
