//! What every ledger-touching command resolves once from its arguments: configuration, cluster,
//! registry, ledger, Slurm client, the state dir and its lock.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{self, ClusterProfile, ConfigRoot, lists};
use crate::ledger::{self, Ledger};
use crate::queue::SlurmOverrides;
use crate::registry::Registry;
use crate::selection::{self, Concurrency, Leg};
use crate::slurm::SlurmCli;
use crate::spec_build::{SpecBuilder, SpecOverrides};
use anyhow::{Context, Result, bail};
use launch_spec::{GpuProfiles, ModelId};

use super::ConfigDirs;

/// `--cluster`, `--ledger`, `--state-dir` and the config directories.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct LedgerArgs {
    /// Cluster profile name or alias (default: $SUBMITTER_CLUSTER, else the profile whose `hosts:`
    /// matches this host).
    #[arg(long, env = "SUBMITTER_CLUSTER")]
    pub cluster: Option<String>,
    #[command(flatten)]
    pub store: LedgerStore,
    #[command(flatten)]
    pub dirs: ConfigDirs,
}

/// `--cluster` (or `$SUBMITTER_CLUSTER`, which clap folds into it), else the profile whose `hosts:`
/// matches this machine's hostname, said in one line on stderr.
pub(crate) fn cluster_name(given: Option<&str>, clusters_dir: &Path) -> Result<String> {
    if let Some(name) = given {
        return Ok(name.to_string());
    }
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    match config::cluster_for_host(clusters_dir, &hostname)? {
        Some((name, pattern)) => {
            let said = format!("cluster: {name} (host {hostname} matches its hosts: `{pattern}`)");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{said}\n").as_bytes());
            Ok(name)
        }
        None => bail!(
            "no cluster: give --cluster C or set $SUBMITTER_CLUSTER (no profile's hosts: matches this host `{hostname}`)"
        ),
    }
}

/// The variable `--ledger` is also read from: a URL with a password belongs there, never in argv.
pub(crate) const LEDGER_ENV: &str = "SUBMITTER_LEDGER";

/// `--ledger` and `--state-dir`: where the ledger and the lock are, for every command that opens one.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct LedgerStore {
    /// Ledger: `postgres://…` URL or SQLite path (default: the profile's, else <state dir>/ledger.sqlite).
    #[arg(long, env = LEDGER_ENV, hide_env_values = true)]
    pub ledger: Option<String>,
    /// State dir (ledger, lock) instead of the profile's `paths.state_dir`.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// What changes the launch spec: shared by `spec`, `plan` and `launch` (and what the listener
/// passes to `launch`).
#[derive(clap::Args, Clone, Debug, Default)]
pub(crate) struct SpecOptions {
    /// Operator override of the timeout multiplier.
    #[arg(long, value_name = "X", value_parser = crate::config::args::multiplier)]
    pub timeout_multiplier: Option<f64>,
    /// Agent kwarg `key=value` (repeatable); wins over registry and preset.
    #[arg(long = "agent-kwarg", value_name = "K=V")]
    pub agent_kwargs: Vec<String>,
    /// Operator override of the GPU-memory ceiling (wins over cluster and GPU profile).
    #[arg(long, value_name = "F", value_parser = crate::config::args::fraction)]
    pub gpu_memory_utilization: Option<f64>,
    /// Harbor concurrency: `N` for every leg, `LEG=N` for one (repeatable; clamped to the
    /// profile's `limits.n_concurrent_ceiling`). Default: the preset's, else the profile's.
    #[arg(long = "n-concurrent", value_name = "N|LEG=N", value_parser = Concurrency::parse_item)]
    pub n_concurrent: Vec<(Option<String>, u32)>,
    /// Explicit Harbor job config for every leg: a file in presets/harbor/ or a path. It runs
    /// instead of the preset's, and its own `timeout_multiplier` is used (docs/design.md §4.3).
    #[arg(long = "harbor-config", value_name = "FILE")]
    pub harbor_config: Option<String>,
    /// Base Harbor job config (as a preset's `config_yaml`, which it replaces): the timeout
    /// multiplier still comes from the registry and the size bands.
    #[arg(long = "config-yaml", value_name = "FILE")]
    pub(crate) config_yaml: Option<String>,
    /// An installed-harness job's Pinggy pair: pair N of the team's bank alone (a borrow-only pair
    /// is used only so; without it, the profile's default pairs).
    #[arg(long, value_name = "N")]
    pub(crate) pinggy_pair: Option<u32>,
    /// Harbor's agent parser (wins over the preset's `agent_parser`).
    #[arg(long, value_name = "P")]
    pub agent_parser: Option<String>,
    /// Output-token budget (wins over the registry's `max_output_tokens`).
    #[arg(long, value_name = "N", value_parser = crate::config::args::count_u64)]
    pub max_output_tokens: Option<u64>,
}

impl SpecOptions {
    /// The library's overrides (per-leg concurrency is [`SpecOptions::concurrency`]).
    pub(crate) fn overrides(&self) -> Result<SpecOverrides> {
        // A relative path the operator typed means "from here" (a bare name: presets/harbor/).
        let from_here = |name: &Option<String>| -> Result<Option<String>> {
            Ok(match name {
                Some(file) if file.contains('/') => Some(std::path::absolute(file)?.display().to_string()),
                other => other.clone(),
            })
        };
        let harbor_config = from_here(&self.harbor_config)?;
        let config_yaml = from_here(&self.config_yaml)?;
        Ok(SpecOverrides {
            timeout_multiplier: self.timeout_multiplier,
            agent_kwargs: self.agent_kwargs.clone(),
            gpu_memory_utilization: self.gpu_memory_utilization,
            n_concurrent: None,
            harbor_config,
            config_yaml,
            agent_parser: self.agent_parser.clone(),
            max_output_tokens: self.max_output_tokens,
            dataset: None,
            pinggy_pair: self.pinggy_pair,
        })
    }

    pub(crate) fn concurrency(&self) -> Concurrency {
        Concurrency::from_items(&self.n_concurrent)
    }
}

/// Where and for how long the jobs run: shared by `plan` and `launch` (what queues jobs).
#[derive(clap::Args, Clone, Debug, Default)]
pub(crate) struct SlurmOptions {
    /// Slurm partition for every job (wins over the preset's `slurm_partition` and the profile's).
    #[arg(long, value_name = "P", value_parser = crate::config::args::slurm_name)]
    pub partition: Option<String>,
    /// Slurm account for every job (wins over the preset's `slurm_account` and the profile's).
    #[arg(long, value_name = "A", value_parser = crate::config::args::slurm_name)]
    pub account: Option<String>,
    /// Slurm reservation for every job (wins over the profile's `slurm.reservation`); `''` submits
    /// without one (as `--no-reservation`: for a reservation that has ended).
    #[arg(long, value_name = "R", value_parser = crate::config::args::reservation)]
    pub reservation: Option<String>,
    /// Submit without the profile's `slurm.reservation`.
    #[arg(long, conflicts_with = "reservation")]
    pub(crate) no_reservation: bool,
    /// Walltime for every job (wins over the preset's `slurm_time` and the profile's `slurm.time`;
    /// capped at the partition's MaxTime).
    #[arg(long, value_name = "T", value_parser = crate::config::args::slurm_time)]
    pub time: Option<String>,
    /// Slurm QoS for every job (wins over the profile's `slurm.qos`); `''` submits without one.
    #[arg(long, value_name = "Q", value_parser = crate::config::args::reservation)]
    pub qos: Option<String>,
    /// Nodes no job may run on (sbatch `--exclude`, wins over the profile's `slurm.exclude`); `''`
    /// clears the profile's.
    #[arg(long, value_name = "NODES", value_parser = crate::config::args::reservation)]
    pub exclude: Option<String>,
}

impl SlurmOptions {
    pub(crate) fn overrides(&self) -> SlurmOverrides {
        SlurmOverrides {
            partition: self.partition.clone(),
            account: self.account.clone(),
            // An empty name clears the profile's reservation (SlurmChoice::for_leg).
            reservation: if self.no_reservation { Some(String::new()) } else { self.reservation.clone() },
            time: self.time.clone(),
            qos: self.qos.clone(),
            exclude: self.exclude.clone(),
        }
    }
}

/// The model and benchmark selection shared by `plan` and `launch`.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct Selection {
    /// Presets (repeatable); `ID` means swebench, v2 and tb2 together.
    #[arg(long = "preset", value_name = "P")]
    pub presets: Vec<String>,
    /// Datasets (instead of presets), with default settings.
    #[arg(long = "datasets", value_name = "D", num_args = 1..)]
    pub datasets: Vec<String>,
    /// The priority list: models to consider, in priority order. Re-read on every iteration.
    #[arg(long, value_name = "FILE")]
    pub models_file: Option<PathBuf>,
    /// Explicit model ids (also a priority list).
    #[arg(long = "model", value_name = "M")]
    pub models: Vec<String>,
    /// Instead of a list: every model in the ledger's catalogue.
    #[arg(long, conflicts_with_all = ["models_file", "models"])]
    pub(crate) all_models: bool,
    /// Models never to submit (beats the list). Re-read on every iteration.
    #[arg(long, value_name = "FILE")]
    pub blacklist: Option<PathBuf>,
    /// Bypass dedup for the selected pairs (needs an explicit model list: --model or --models-file).
    #[arg(long)]
    pub force: bool,
    /// Resubmit finished pairs whose config (timeout multiplier, overrides) differs from now.
    #[arg(long)]
    pub config_aware: bool,
    /// `shared`: each model's legs in one Slurm job, one engine serving them all; `pool`: fine-tunes
    /// of one architecture in one job, the engine swapping each model's weights in (issue 37);
    /// `per-leg`: a job per leg. Wins over the presets' and the profile's `allocation` (default per-leg).
    #[arg(long, value_enum, value_name = "MODE")]
    pub allocation: Option<crate::config::Allocation>,
    #[command(flatten)]
    pub spec: SpecOptions,
    #[command(flatten)]
    pub slurm: SlurmOptions,
}

/// How [`Session::open_with`] treats a state dir and ledger that do not exist yet.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Opening {
    /// Create them (commands that write).
    Create,
    /// `--dry-run`: the state dir only when the default ledger goes into it.
    Dry,
    /// Never create anything.
    ReadOnly,
}

pub(crate) struct Session {
    pub root: PathBuf,
    pub cluster: ClusterProfile,
    pub gpu_profiles: GpuProfiles,
    pub registry: Registry,
    pub presets_dir: PathBuf,
    pub(crate) harbor_dir: PathBuf,
    pub state_dir: PathBuf,
    pub ledger: Box<dyn Ledger>,
    pub slurm: SlurmCli,
}

/// `--ledger` with a password, given on the command line rather than through `$SUBMITTER_LEDGER`,
/// is refused as `import --from` refuses it: argv is visible to every user of the machine.
fn refuse_password_on_argv(ledger: Option<&str>) -> Result<()> {
    let Some(spec) = ledger else { return Ok(()) };
    let from_env = std::env::var(LEDGER_ENV).is_ok_and(|env| env == spec);
    let redacted = ledger::redact_url(spec);
    if !from_env && redacted != spec {
        bail!(
            "--ledger {redacted}: a password on the command line is visible to every user of this machine — \
             put the URL in $SUBMITTER_LEDGER (e.g. from your 0600 secrets file) or in ~/.pgpass, and drop it from the flag"
        );
    }
    Ok(())
}

impl Session {
    pub(crate) fn open(args: &LedgerArgs) -> Result<Session> {
        Session::open_with(args, Opening::Create)
    }

    /// [`Session::open`] for `launch --dry-run`: the state dir is created only when the default
    /// ledger goes into it (a ledger named elsewhere leaves the file tree untouched).
    pub(crate) fn open_dry(args: &LedgerArgs) -> Result<Session> {
        Session::open_with(args, Opening::Dry)
    }

    /// [`Session::open`] for the commands that only read (`status`, `results`, `report`, `plan`,
    /// `unevaluated`, `models list`): they never create state. A `--state-dir` (or the directory
    /// of a `--ledger` file) that does not exist is an error (a typo must not read as an empty
    /// ledger); an existing directory with no ledger in it yet reads as an empty one, in memory.
    pub(crate) fn open_read_only(args: &LedgerArgs) -> Result<Session> {
        Session::refuse_missing_state_dir(args)?;
        Session::open_with(args, Opening::ReadOnly)
    }

    /// For `plan`: a missing `--state-dir` is a typo as for the read-only commands, but the ledger
    /// is opened for real, so the team's history it folds in is kept (incremental next time).
    pub(crate) fn open_existing(args: &LedgerArgs) -> Result<Session> {
        Session::refuse_missing_state_dir(args)?;
        Session::open_with(args, Opening::Create)
    }

    fn refuse_missing_state_dir(args: &LedgerArgs) -> Result<()> {
        if let Some(dir) = &args.store.state_dir
            && !dir.is_dir()
        {
            bail!(
                "--state-dir {}: no such directory — read-only commands create nothing; check the path, or leave \
                 the flag out for the profile's paths.state_dir",
                dir.display()
            );
        }
        Ok(())
    }

    fn open_with(args: &LedgerArgs, opening: Opening) -> Result<Session> {
        refuse_password_on_argv(args.store.ledger.as_deref())?;
        let dirs = args.dirs.resolve()?;
        let root = ConfigRoot::discover().map(|r| r.root).unwrap_or_else(|_| dirs.clusters.join(".."));
        let cluster = config::load_cluster(&dirs.clusters, &cluster_name(args.cluster.as_deref(), &dirs.clusters)?)?;
        let gpu_profiles = config::load_gpu_profiles(&dirs.clusters)?;
        let registry =
            Registry::load(&dirs.registry).with_context(|| format!("loading registry {}", dirs.registry.display()))?;
        registry.report_broken();
        let harbor_dir = dirs.presets.join("harbor");
        let context = SpecBuilder::new(&cluster, &gpu_profiles, &registry, &harbor_dir, &root);
        let state_dir = match &args.store.state_dir {
            Some(dir) => dir.clone(),
            None => context.expand("paths.state_dir", &cluster.paths.state_dir)?,
        };
        let named = args.store.ledger.clone().or_else(|| cluster.ledger.clone());
        if opening == Opening::Create || (opening == Opening::Dry && named.is_none()) {
            std::fs::create_dir_all(&state_dir)
                .with_context(|| format!("creating state dir {}", state_dir.display()))?;
        }
        // A directory that exists but holds no ledger yet reads as empty (a first `plan`); one that
        // does not exist is a typo.
        let explicit = args.store.ledger.is_some();
        let mut ledger_spec = named.unwrap_or_else(|| ledger::default_path(&state_dir).display().to_string());
        if opening == Opening::ReadOnly
            && let Some(file) = ledger::sqlite_file(&ledger_spec).filter(|file| !file.exists())
        {
            let parent = file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            if explicit && !parent.is_dir() {
                bail!(
                    "--ledger {}: no such directory — read-only commands create nothing; check the path",
                    file.display()
                );
            }
            // Nothing launched from this profile yet: an empty ledger, and no file left behind.
            tracing::debug!("no ledger at {} yet: reading an empty one", file.display());
            ledger_spec = ":memory:".to_string();
        }
        let ledger = ledger::open_ledger(&ledger_spec)?;
        tracing::debug!("ledger {}", ledger.location());
        let slurm = SlurmCli::new().with_command_timeout(Duration::from_secs(cluster.slurm.command_timeout_s));
        Ok(Session {
            root,
            cluster,
            gpu_profiles,
            registry,
            harbor_dir,
            presets_dir: dirs.presets,
            state_dir,
            ledger,
            slurm,
        })
    }

    /// The benchmark family `--benchmark NAME` names: NAME as the ledger, a preset or `status`
    /// names it (`tb2`, `v2`, `swebench`); an unknown name is an error naming the known ones.
    pub(crate) fn benchmark_family(&self, given: &str) -> Result<String> {
        let known = crate::names::KnownBenchmarks::load(self.ledger.as_ref(), &self.presets_dir)?;
        let benchmark = known.resolve(given).context("--benchmark")?;
        Ok(self.ledger.family_of(&benchmark)?)
    }

    pub(crate) fn context(&self) -> SpecBuilder<'_> {
        SpecBuilder::new(&self.cluster, &self.gpu_profiles, &self.registry, &self.harbor_dir, &self.root)
    }

    /// One submitter per state dir at a time (advisory lock), besides the ledger's guarantee.
    pub(crate) fn lock(&self) -> Result<File> {
        std::fs::create_dir_all(&self.state_dir)
            .with_context(|| format!("creating state dir {}", self.state_dir.display()))?;
        let path = self.state_dir.join("submitter.lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => {
                Err(crate::output::LockHeld { path: path.display().to_string() }.into())
            }
            Err(std::fs::TryLockError::Error(err)) => Err(err).with_context(|| format!("locking {}", path.display())),
        }
    }
}

impl Selection {
    /// The legs (presets with `ID` expanded, or the `--datasets` leg), re-read from disk.
    pub(crate) fn legs(&self, presets_dir: &Path) -> Result<Vec<Leg>> {
        let legs = selection::legs(presets_dir, &self.presets, &self.datasets)?;
        self.spec.concurrency().check(&legs)?;
        Ok(legs)
    }

    /// The models to consider, in priority order. No list means no submissions, unless
    /// `--all-models` explicitly selects the ledger's catalogue.
    pub(crate) fn models(&self, ledger: &dyn Ledger) -> Result<Vec<ModelId>> {
        let mut models: Vec<ModelId> = self
            .models
            .iter()
            .map(|m| crate::config::args::model(m).map_err(|e| anyhow::anyhow!("--model: {e}")))
            .collect::<Result<_>>()?;
        if let Some(file) = &self.models_file {
            models.extend(lists::read_model_list(file)?);
        }
        if self.all_models {
            let (ids, refused) = lists::catalogue_ids(ledger.list_models()?.into_iter().map(|m| m.id));
            for (row, problem) in refused {
                // An older submitter or the team database stored it unchecked: never a job, and the
                // rest of the catalogue still runs (there is no command to remove a row).
                tracing::warn!("--all-models: skipped the ledger's catalogue model {row} of `models list`: {problem}");
            }
            models = ids;
        }
        let blacklist = match &self.blacklist {
            Some(file) => lists::read_model_list(file)?,
            None => Vec::new(),
        };
        let mut seen = std::collections::HashSet::new();
        models.retain(|m| seen.insert(m.clone()));
        Ok(lists::filter_models(&models, &blacklist))
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.force && self.models.is_empty() && self.models_file.is_none() {
            bail!(
                "--force needs an explicit model list (--model or --models-file): it bypasses dedup for those pairs only"
            );
        }
        if self.models.is_empty() && self.models_file.is_none() && !self.all_models {
            bail!(
                "no priority list: give --models-file FILE or --model M (a model not on the list is never submitted), or --all-models for the ledger's catalogue"
            );
        }
        Ok(())
    }
}
