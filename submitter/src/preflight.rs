//! Preflight (docs/site.md): everything about one launch spec that the login node can check before
//! `sbatch`, so a job never waits in the queue only to fail on the node. A failed preflight submits
//! nothing for that pair and does not count as an attempt.
//!
//! Deciding is apart from looking: [`preflight`] takes what it needs from Slurm through
//! [`SiteQueries`] and reads only the files the spec names. The secrets file is scanned for its
//! variable *names*; each value is dropped with its line.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use launch_spec::LaunchSpec;
use launch_spec::spec::TunnelSpec;
use serde::Serialize;

use crate::config::ClusterProfile;
use crate::queue::SlurmChoice;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Level {
    Ok,
    /// Could not be checked from here (said why); never blocks a submission.
    Skipped,
    Fail,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Check {
    pub name: &'static str,
    pub level: Level,
    pub detail: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    pub(crate) fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.level != Level::Fail)
    }

    /// The failures, one line (for the launch output and the ledger's reason).
    pub(crate) fn failures(&self) -> String {
        self.checks
            .iter()
            .filter(|c| c.level == Level::Fail)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn push(&mut self, name: &'static str, result: Result<String, Outcome>) {
        self.checks.push(check(name, result));
    }

    /// One line per check, for `submitter preflight`.
    pub(crate) fn table(&self) -> String {
        self.checks
            .iter()
            .map(|c| {
                let level = match c.level {
                    Level::Ok => "ok",
                    Level::Skipped => "skip",
                    Level::Fail => "FAIL",
                };
                format!("  {level:<5} {:<13} {}\n", c.name, c.detail)
            })
            .collect()
    }
}

#[derive(Debug)]
enum Outcome {
    Skipped(String),
    Fail(String),
}

fn check(name: &'static str, result: Result<String, Outcome>) -> Check {
    let (level, detail) = match result {
        Ok(detail) => (Level::Ok, detail),
        Err(Outcome::Skipped(why)) => (Level::Skipped, why),
        Err(Outcome::Fail(why)) => (Level::Fail, why),
    };
    Check { name, level, detail }
}

fn fail<T>(why: impl Into<String>) -> Result<T, Outcome> {
    Err(Outcome::Fail(why.into()))
}

/// What preflight asks Slurm; the real implementation runs `sinfo`, `scontrol` and `sacctmgr`.
pub(crate) trait SiteQueries {
    /// Partition names (`sinfo -h -o %R`).
    fn partitions(&self) -> Result<Vec<String>, String>;
    /// The live reservations' names (`scontrol show reservation`).
    fn reservations(&self) -> Result<Vec<String>, String>;
    /// The accounts `user` may charge, or None when the cluster keeps no accounting database.
    fn accounts(&self, user: &str) -> Result<Option<Vec<String>>, String>;
    /// The partition's node features (`sinfo -h -p P -o %f`, comma-separated per node group);
    /// empty when Slurm gives none.
    fn node_features(&self, _partition: &str) -> Result<Vec<String>, String> {
        Ok(Vec::new())
    }
}

/// The login node as preflight sees it.
pub(crate) struct Site<'a> {
    /// The configuration root (for the prelude and the batch script's site helper).
    pub root: &'a Path,
    pub slurm: &'a dyn SiteQueries,
    /// The submitter's user (for the accounting check).
    pub user: String,
    /// The login node's PATH, for programs named without a `/`.
    pub path: String,
    /// Variables the prelude check hands to bash (the module system's, see [`module_env`]).
    pub(crate) module_env: Vec<(String, String)>,
    /// The checks that depend on the cluster alone (Slurm names, the prelude), per cluster: asked
    /// once per `launch` iteration, not once per pair.
    per_cluster: std::cell::RefCell<Vec<(String, Check)>>,
    /// The payload binary the jobs will exec (the `payload` check; docs/install.md).
    payload: Option<crate::node_binary::PayloadBinary>,
}

impl Site<'_> {
    /// `run`'s check for `cluster`, from the first call of this iteration.
    fn once(&self, cluster: &str, name: &'static str, run: impl FnOnce() -> Result<String, Outcome>) -> Check {
        self.once_keyed(format!("{cluster}/{name}"), name, run)
    }

    /// `run`'s check for `key`, from the first call of this iteration.
    fn once_keyed(&self, key: String, name: &'static str, run: impl FnOnce() -> Result<String, Outcome>) -> Check {
        if let Some((_, done)) = self.per_cluster.borrow().iter().find(|(k, _)| *k == key) {
            return done.clone();
        }
        let done = check(name, run());
        self.per_cluster.borrow_mut().push((key, done.clone()));
        done
    }
}

impl<'a> Site<'a> {
    /// This login node: the submitter's own user, PATH and module variables.
    pub(crate) fn here(root: &'a Path, slurm: &'a dyn SiteQueries) -> Self {
        let lookup = |name: &str| std::env::var(name).ok();
        Site {
            root,
            slurm,
            user: lookup("USER").unwrap_or_else(|| "unknown".into()),
            path: lookup("PATH").unwrap_or_default(),
            module_env: module_env(&lookup),
            per_cluster: std::cell::RefCell::new(Vec::new()),
            payload: None,
        }
    }

    /// Also checks that `binary` fits the nodes.
    pub(crate) fn with_payload(self, binary: crate::node_binary::PayloadBinary) -> Self {
        Site { payload: Some(binary), ..self }
    }
}

struct Inputs<'a> {
    cluster: &'a ClusterProfile,
    root: &'a Path,
    slurm: &'a dyn SiteQueries,
    user: &'a str,
    path: &'a str,
    module_env: &'a [(String, String)],
}

/// The file in the run dir recording the last preflight of that pair (the why of a refusal).
pub(crate) const RECORD_FILE: &str = "preflight.json";

/// Stages what the job needs (model, dataset), then runs preflight and records it in the run dir.
/// `dataset` is the preset's dataset (repo id or absolute dir) the spec's `harbor.dataset` holds.
pub(crate) fn stage_and_check(
    stager: &crate::stage::Stager,
    dataset: &str,
    spec: &LaunchSpec,
    choice: &SlurmChoice,
    cluster: &ClusterProfile,
    site: &Site,
) -> Result<Report, crate::executor::NotSubmitted> {
    use crate::executor::NotSubmitted;
    let model_staged = stager.would_stage_model(&spec.model.hf_id);
    let dataset_staged = !Path::new(dataset).is_absolute() && !spec.harbor.dataset.is_dir();
    stager.model(&spec.model.hf_id).map_err(NotSubmitted::Staging)?;
    stager.dataset(dataset, &spec.harbor.dataset).map_err(NotSubmitted::Staging)?;
    let mut report = preflight(spec, choice, cluster, site);
    if stager.is_dry() {
        // Nothing was staged: what staging would bring is not a failure of the dry run, and the
        // run dir is not created for the record.
        for check in &mut report.checks {
            let staged = (check.name == "weights" && model_staged) || (check.name == "dataset" && dataset_staged);
            if staged && check.level == Level::Fail {
                check.level = Level::Skipped;
                check.detail = format!("would be staged first (dry run): {}", check.detail);
            }
        }
    } else {
        record(&spec.run_dir, &report);
    }
    if report.passed() { Ok(report) } else { Err(NotSubmitted::Preflight(report.failures())) }
}

/// Writes `<run_dir>/preflight.json`; a failure to write only warns (the refusal is also printed).
fn record(run_dir: &Path, report: &Report) {
    let json = serde_json::json!({
        "format_version": launch_spec::document::FORMAT_VERSION,
        "at": chrono::Utc::now().to_rfc3339(),
        "passed": report.passed(),
        "checks": report.checks,
    });
    let written = std::fs::create_dir_all(run_dir).and_then(|()| {
        launch_spec::records::write_atomically(&run_dir.join(RECORD_FILE), (json.to_string() + "\n").as_bytes())
    });
    if let Err(err) = written {
        tracing::warn!("cannot record preflight in {}: {err}", run_dir.display());
    }
}

/// payload's own check of every value (`LaunchSpec::problem`), run here first so a spec payload
/// would refuse on the node never reaches `sbatch`.
fn spec_values(spec: &LaunchSpec) -> Result<String, Outcome> {
    spec.problem()
        .map(|()| "valid (payload's reader accepts it)".to_string())
        .or_else(|(field, problem)| fail(format!("field `{field}` {problem}")))
}

/// Every check, in order; see [`Report::passed`].
pub(crate) fn preflight(spec: &LaunchSpec, choice: &SlurmChoice, cluster: &ClusterProfile, site: &Site) -> Report {
    let inputs = Inputs {
        cluster,
        root: site.root,
        slurm: site.slurm,
        user: &site.user,
        path: &site.path,
        module_env: &site.module_env,
    };
    let inputs = &inputs;
    let mut report = Report::default();
    report.push("spec", spec_values(spec));
    report.push("weights", weights(spec));
    report.push("serve files", serve_files(spec));
    report.push("dataset", dataset(&spec.harbor.dataset));
    report.push("environment", prefixes(spec));
    report.push("programs", programs(spec, inputs.path));
    report.push("secrets", secrets(spec));
    report.push("harbor_config", harbor_config(spec));
    if cluster.network.proxy.as_ref().is_some_and(|p| p.certificate) {
        report.push("ssh certificate", ssh_certificate(spec, chrono::Local::now().naive_local()));
    }
    // Once per iteration for each distinct choice (legs of one launch may differ by preset).
    let key = format!("{}/slurm/{choice:?}", cluster.name);
    report.checks.push(site.once_keyed(key, "slurm", || slurm(inputs, choice)));
    report.push("memory", memory(spec, inputs.cluster));
    report.checks.push(site.once(&cluster.name, "prelude", || prelude(inputs)));
    if let Some(binary) = &site.payload {
        // Keyed by the resolved partition: its nodes' features are what the binary must fit.
        let key = format!("{}/payload/{}", cluster.name, choice.partition);
        report.checks.push(site.once_keyed(key, "payload", || payload_binary(binary, &choice.partition, inputs)));
    }
    // The environments' answers, once per (cluster, environments, programs) and iteration.
    let key = format!(
        "{}/versions/{:?}/{}/{}/{}/{}",
        cluster.name,
        spec.declared,
        spec.serve.program,
        spec.serve.env_prefix.as_deref().unwrap_or(Path::new("")).display(),
        spec.harbor.program,
        spec.harbor.env_prefix.as_deref().unwrap_or(Path::new("")).display()
    );
    report.checks.push(site.once_keyed(key, "versions", || versions(spec, inputs)));
    report
}

/// Where the job will find the weights. Offline (`HF_HUB_OFFLINE` in the engine's env), they must
/// be in the HF cache the job reads, as huggingface_hub lays it out:
/// `<cache>/models--<org>--<name>/refs/main` naming a `snapshots/<commit>` dir with a
/// `config.json` (checked against the real huggingface_hub by tests/tests/hub_contract.rs).
fn weights(spec: &LaunchSpec) -> Result<String, Outcome> {
    if let Some(path) = &spec.model.local_path {
        return if path.join("config.json").is_file() {
            Ok(format!("{} (local)", path.display()))
        } else {
            fail(format!("model.local_path {} has no config.json", path.display()))
        };
    }
    let env = &spec.serve.env;
    let offline = env
        .get("HF_HUB_OFFLINE")
        .is_some_and(|v| ["1", "ON", "YES", "TRUE"].contains(&v.to_ascii_uppercase().as_str()));
    let cache =
        env.get("HF_HUB_CACHE").map(PathBuf::from).or_else(|| env.get("HF_HOME").map(|h| Path::new(h).join("hub")));
    let Some(cache) = cache else {
        return if offline {
            fail("HF_HUB_OFFLINE without HF_HUB_CACHE/HF_HOME: set paths.hf_cache in the profile")
        } else {
            Err(Outcome::Skipped(
                "no paths.hf_cache: the job uses its user's default cache (and the network, if it has one)".into(),
            ))
        };
    };
    match crate::readiness::hf_snapshot(&cache, &spec.model.hf_id) {
        Some(snapshot) => Ok(format!("{} (cached)", snapshot.display())),
        None if offline => fail(format!(
            "{} is not in {} and compute nodes have no internet: stage it (pre_download.enabled) or download it there",
            spec.model.hf_id,
            cache.display()
        )),
        None => Ok(format!("the job downloads {} into {}", spec.model.hf_id, cache.display())),
    }
}

/// vLLM options whose value is a file the engine reads at start (a chat template, a parser
/// plugin): a missing one fails the job only after its queue wait.
const SERVE_FILE_OPTIONS: [&str; 3] = ["--chat-template", "--tool-parser-plugin", "--reasoning-parser-plugin"];

/// The files `serve.extra_args` names exist (the login node sees the compute nodes' file system).
/// `${VAR}` is expanded from the engine's env, then ours; a value that still names an unset
/// variable (set only in the job, like `${DCFT}`) cannot be checked here and is skipped, as is an
/// inline template (no `/`).
fn serve_files(spec: &LaunchSpec) -> Result<String, Outcome> {
    let Some(extra) = &spec.serve.extra_args else { return Err(Outcome::Skipped("no extra_args".into())) };
    // payload splits extra_args on whitespace (docs/design.md §4.1 rule 6).
    let words: Vec<&str> = extra.split_whitespace().collect();
    let mut named = Vec::new();
    for (i, word) in words.iter().enumerate() {
        for option in SERVE_FILE_OPTIONS {
            let value = match word.strip_prefix(option) {
                Some("") => words.get(i + 1).copied(),
                Some(rest) => rest.strip_prefix('='),
                None => None,
            };
            if let Some(value) = value {
                named.push((option, value));
            }
        }
    }
    if named.is_empty() {
        return Err(Outcome::Skipped("extra_args names no file".into()));
    }
    let lookup = |var: &str| spec.serve.env.get(var).cloned().or_else(|| std::env::var(var).ok());
    let mut checked = Vec::new();
    for (option, value) in named {
        let Ok(path) = launch_spec::expand::expand_path(value, &lookup) else {
            checked.push(format!("{option} {value} (set in the job only: not checked)"));
            continue;
        };
        if !path.contains('/') {
            continue;
        }
        if !Path::new(&path).is_file() {
            return fail(format!(
                "{option} {path} (from the registry's extra_args) is not a file here: install it, or fix extra_args in model_config/"
            ));
        }
        checked.push(format!("{option} {path}"));
    }
    Ok(checked.join(", "))
}

fn dataset(dir: &Path) -> Result<String, Outcome> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) => {
            return fail(format!(
                "{} is not readable ({err}): stage it (pre_download.dataset_command) or fix paths.datasets_dirs",
                dir.display()
            ));
        }
    };
    let tasks = entries.filter_map(Result::ok).filter(|e| e.path().is_dir()).count();
    if tasks == 0 {
        return fail(format!("{} holds no task directories: re-stage it (move it aside first)", dir.display()));
    }
    Ok(format!("{} ({tasks} task dirs)", dir.display()))
}

fn prefixes(spec: &LaunchSpec) -> Result<String, Outcome> {
    let mut seen = Vec::new();
    let named = [
        ("serve.env_prefix", spec.serve.env_prefix.as_ref()),
        ("harbor.env_prefix", spec.harbor.env_prefix.as_ref()),
        ("post_run.env_prefix", spec.post_run.as_ref().and_then(|p| p.env_prefix.as_ref())),
    ];
    for (field, prefix) in named {
        let Some(prefix) = prefix else { continue };
        if !prefix.join("bin").is_dir() {
            return fail(format!(
                "{field} {}: {}/bin does not exist (create the environment or fix `environments:` in the profile)",
                prefix.display(),
                prefix.display()
            ));
        }
        if !seen.contains(&prefix) {
            seen.push(prefix);
        }
    }
    Ok(seen.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))
}

/// `program` as payload resolves it on the node: a path as given, else `<prefix>/bin`, then PATH.
fn find_program(program: &str, prefix: Option<&Path>, path: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Path::new(program).is_file().then(|| PathBuf::from(program));
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
    prefix
        .and_then(|p| which::which_in(program, Some(p.join("bin")), &cwd).ok())
        .or_else(|| which::which_in(program, Some(path), &cwd).ok())
}

fn programs(spec: &LaunchSpec, path: &str) -> Result<String, Outcome> {
    let mut wanted: Vec<(&str, String, Option<&Path>)> = vec![
        ("serve.program", spec.serve.program.clone(), spec.serve.env_prefix.as_deref()),
        ("harbor.program", spec.harbor.program.clone(), spec.harbor.env_prefix.as_deref()),
    ];
    match &spec.tunnel {
        TunnelSpec::None => {}
        TunnelSpec::Pinggy(_) => wanted.push(("tunnel (ssh)", "ssh".into(), None)),
        TunnelSpec::Socks(socks) => {
            wanted.push(("tunnel (ssh)", "ssh".into(), None));
            if socks.mode == launch_spec::spec::ProxyMode::Proxychains {
                let bin = socks.proxychains_bin.clone().unwrap_or_else(|| "proxychains4".into());
                wanted.push(("tunnel.proxychains_bin", bin, None));
            }
        }
    }
    if let Some(step) = &spec.post_run
        && let Some(program) = step.argv.first()
    {
        wanted.push(("post_run.argv[0]", program.clone(), step.env_prefix.as_deref()));
    }
    let mut found = Vec::new();
    for (field, program, prefix) in wanted {
        match find_program(&program, prefix, path) {
            Some(at) => found.push(at.display().to_string()),
            None => {
                let place = prefix.map_or("PATH".to_string(), |p| format!("{}/bin or PATH", p.display()));
                return fail(format!("{field} `{program}` is not in {place}: install it or fix the profile"));
            }
        }
    }
    Ok(found.join(", "))
}

/// The names the job will require from the secrets file.
fn required_secrets(spec: &LaunchSpec) -> Vec<String> {
    let mut names = Vec::new();
    if spec.secrets.daytona {
        names.extend(["DAYTONA_API_KEY".to_string(), "DAYTONA_DATA_API_KEY".to_string()]);
    }
    match &spec.tunnel {
        TunnelSpec::Pinggy(p) => names.extend(p.pairs().into_iter().map(|pair| pair.token_secret)),
        TunnelSpec::None | TunnelSpec::Socks(_) => {}
    }
    names
}

fn secrets(spec: &LaunchSpec) -> Result<String, Outcome> {
    let required = required_secrets(spec);
    let Some(path) = &spec.secrets.file else {
        return if required.is_empty() {
            Ok("none needed".into())
        } else {
            fail("the spec names no secrets file (the submitter resolves one at submit time)")
        };
    };
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(err) if required.is_empty() && err.kind() == std::io::ErrorKind::NotFound => {
            return Ok(format!("{} absent, none needed", path.display()));
        }
        Err(err) => {
            return fail(format!(
                "{}: {err}: create it (mode 0600) or point secrets.file / $DC_AGENT_SECRET_ENV at it",
                path.display()
            ));
        }
    };
    if !meta.is_file() {
        return fail(format!("{} is not a regular file", path.display()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return fail(format!("{} has mode {mode:04o}: run `chmod 600 {}`", path.display(), path.display()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return fail(format!("{} is owned by uid {}, not by you (uid {me})", path.display(), meta.uid()));
    }
    let names = secret_names(path)
        .map_err(|err| Outcome::Fail(format!("{}: {err}: fix it (payload refuses this file)", path.display())))?;
    let missing: Vec<&String> = required.iter().filter(|n| !names.contains(n)).collect();
    if !missing.is_empty() {
        let missing = missing.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ");
        return fail(format!(
            "{} lacks {missing} (absent or empty): give each a value (`NAME=value`; payload refuses an empty one)",
            path.display()
        ));
    }
    Ok(format!(
        "{} (0600, has {})",
        path.display(),
        if required.is_empty() { "no required names".into() } else { required.join(", ") }
    ))
}

/// The variable names of the secrets file that have a value, read by payload's own reader
/// (`launch_spec::envfile`): what payload refuses (a malformed line, an unterminated quote, a NUL
/// byte, more than 1 MiB) fails here, and a name with an empty value counts as missing, as payload
/// counts it (`envfile::is_given`). Each value is dropped as soon as it is read.
pub(crate) fn secret_names(path: &Path) -> Result<Vec<String>, launch_spec::envfile::EnvFileError> {
    Ok(launch_spec::envfile::given_names(launch_spec::envfile::read_pairs(path)?))
}

/// The Harbor job config, read by payload's own reader (`launch_spec::yaml`, 4 MiB cap): what payload
/// refuses (a YAML error such as a tab, a file too large, not a mapping) fails here.
fn harbor_config(spec: &LaunchSpec) -> Result<String, Outcome> {
    let path = &spec.harbor.config;
    match launch_spec::yaml::from_yaml_file::<serde_json::Value>(path) {
        // The declared Harbor's schema (the fork has no `--print-config` to ask): what it would refuse
        // after the model load is refused here.
        Ok(config @ serde_json::Value::Object(_)) => {
            let problems = launch_spec::versions::job_config_problems(spec.harbor.dialect, &config);
            if let Some(problem) = problems.first() {
                return fail(format!("{}: {problem}", path.display()));
            }
            // The file name only: the path is the checkout's, already in the spec.
            Ok(format!(
                "{} parses and fits the {} Harbor's job config",
                path.file_name().map_or(path.as_os_str(), |n| n).to_string_lossy(),
                spec.harbor.dialect.as_str()
            ))
        }
        Ok(_) => fail(format!("{}: must contain a mapping (Harbor's job config)", path.display())),
        Err(err) => fail(format!("{err}: fix the Harbor job config (payload refuses it)")),
    }
}

/// The OpenSSH certificate beside the tunnel's key (`<identity_file>-cert.pub`; step-ca on Leonardo)
/// exists and is valid now (`ssh-keygen -L`'s `Valid:` line, in local time): an expired one would
/// fail the job's tunnel after its queue wait and engine load.
fn ssh_certificate(spec: &LaunchSpec, now: chrono::NaiveDateTime) -> Result<String, Outcome> {
    let TunnelSpec::Socks(socks) = &spec.tunnel else {
        return Err(Outcome::Skipped("no SSH tunnel in this job".into()));
    };
    let Some(identity) = &socks.identity_file else {
        return fail("network.proxy.certificate needs network.proxy.identity_file (the key the certificate signs)");
    };
    let mut cert = identity.clone().into_os_string();
    cert.push("-cert.pub");
    let cert = PathBuf::from(cert);
    if !cert.is_file() {
        return fail(format!("{} is missing: get one (`step ssh login`) before launching", cert.display()));
    }
    let out = std::process::Command::new("ssh-keygen")
        .arg("-L")
        .arg("-f")
        .arg(&cert)
        .output()
        .map_err(|e| Outcome::Skipped(format!("ssh-keygen: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(valid) = text.lines().find_map(|l| l.trim().strip_prefix("Valid:")).map(str::trim) else {
        return fail(format!("{}: not an OpenSSH certificate (`ssh-keygen -L` shows no validity)", cert.display()));
    };
    let parse = |t: &str| chrono::NaiveDateTime::parse_from_str(t.trim(), "%Y-%m-%dT%H:%M:%S").ok();
    let (from, to) = match valid {
        "forever" => (None, None),
        v if v.starts_with("from ") => {
            let (from, to) = v["from ".len()..].split_once(" to ").unwrap_or((v, ""));
            (parse(from), parse(to))
        }
        v if v.starts_with("after ") => (parse(&v["after ".len()..]), None),
        v if v.starts_with("before ") => (None, parse(&v["before ".len()..])),
        _ => (None, None),
    };
    if let Some(to) = to.filter(|to| *to <= now) {
        return fail(format!("{} expired at {to}: renew it (`step ssh login`), then launch", cert.display()));
    }
    if let Some(from) = from.filter(|from| *from > now) {
        return fail(format!("{} is not valid before {from}", cert.display()));
    }
    Ok(format!("{} valid {valid}", cert.display()))
}

/// The Slurm settings sbatch will get (the resolved [`SlurmChoice`]: command line, preset,
/// profile), against what Slurm knows: the partition, the reservation (a dead one is refused with
/// the live ones and the flags to use), the account.
fn slurm(inputs: &Inputs, choice: &SlurmChoice) -> Result<String, Outcome> {
    let queries = inputs.slurm;
    let partitions = queries.partitions().map_err(|e| Outcome::Fail(format!("sinfo: {e}")))?;
    if !partitions.iter().any(|p| p == &choice.partition) {
        return fail(format!(
            "partition `{}` is not one Slurm knows ({}): pass `--partition P` or fix slurm.partition",
            choice.partition,
            partitions.join(", ")
        ));
    }
    let mut said = vec![format!("partition {}", choice.partition)];
    if let Some(reservation) = &choice.reservation {
        let live = queries.reservations().map_err(|e| Outcome::Fail(format!("scontrol show reservation: {e}")))?;
        if !live.contains(reservation) {
            return fail(dead_reservation(reservation, &live));
        }
        said.push(format!("reservation {reservation}"));
    }
    if let Some(account) = &choice.account {
        match queries.accounts(inputs.user) {
            Ok(Some(accounts)) if accounts.iter().any(|a| a.eq_ignore_ascii_case(account)) => {
                said.push(format!("account {account}"))
            }
            Ok(Some(accounts)) => {
                return fail(format!(
                    "account `{account}` is not one {} may charge ({}): pass `--account A` or fix slurm.account",
                    inputs.user,
                    accounts.join(", ")
                ));
            }
            Ok(None) => said.push(format!("account {account} not checked (no accounting database)")),
            Err(e) => return fail(format!("sacctmgr: {e}")),
        }
    }
    if let Some(qos) = &choice.qos {
        said.push(format!("qos {qos}"));
    }
    if let Some(exclude) = &choice.exclude {
        said.push(format!("exclude {exclude}"));
    }
    said.push(format!("time {}", choice.time));
    Ok(said.join(", "))
}

/// The refusal of a reservation Slurm does not know: the live ones, and the flag to use.
fn dead_reservation(reservation: &str, live: &[String]) -> String {
    let live_text = if live.is_empty() { "none is live".to_string() } else { format!("live: {}", live.join(", ")) };
    let switch = live.first().map_or(String::new(), |r| format!("`--reservation {r}` to use a live one, or "));
    format!(
        "reservation `{reservation}` is unknown to Slurm ({live_text}; `scontrol show reservation`): it may have ended; pass {switch}`--no-reservation` to submit without one, and fix slurm.reservation in the profile"
    )
}

/// The weights against what one replica's GPUs (TP × PP) give vLLM — the rule `registry check`
/// warns with (`lint::weights_do_not_fit`: bytes per parameter from the id, a KV margin, the memory
/// ceiling). Here it refuses: the job could not load.
fn memory(spec: &LaunchSpec, cluster: &ClusterProfile) -> Result<String, Outcome> {
    let Some(per_gpu) = cluster.hardware.gpu_memory_gib else {
        return Err(Outcome::Skipped("hardware.gpu_memory_gib not set in the profile".into()));
    };
    let Some(billions) = crate::registry::size::total_size(&spec.model.hf_id) else {
        return Err(Outcome::Skipped(format!("no parameter count in `{}`", spec.model.hf_id)));
    };
    let gpus = spec.parallelism().replica();
    match crate::lint::weights_do_not_fit(
        &spec.model.hf_id,
        gpus,
        cluster,
        Some(&spec.gpu_profiles),
        spec.serve.gpu_memory_utilization,
    ) {
        Some(problem) => fail(format!(
            "{problem} (TP {} × PP {})",
            spec.serve.tensor_parallel_size, spec.serve.pipeline_parallel_size
        )),
        None => Ok(format!("{billions}B parameters fit {gpus} GPU(s) × {per_gpu} GiB")),
    }
}

/// Runs the profile's prelude the way the job will — `payload.sbatch --check-prelude`: the module
/// system initialised by the script, then the prelude, any failing line fatal — in a clean bash on
/// the login node (no login profile; only the module system's variables passed on).
fn prelude(inputs: &Inputs) -> Result<String, Outcome> {
    let Some(prelude) = &inputs.cluster.slurm.prelude else {
        return Ok("none".into());
    };
    let prelude = inputs.root.join(prelude);
    let script = inputs.root.join(&inputs.cluster.slurm.script);
    let output = std::process::Command::new("bash")
        .args(["--noprofile", "--norc"])
        .arg(&script)
        .arg("--check-prelude")
        .env_clear()
        .env("PATH", inputs.path)
        .envs(inputs.module_env.iter().map(|(k, v)| (k, v)))
        .env("PAYLOAD_PRELUDE", &prelude)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| Outcome::Fail(format!("cannot run bash: {e}")))?;
    if output.status.success() {
        return Ok(format!("{} loads here", prelude.display()));
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output").trim().to_string();
    fail(format!("fails on the login node ({}): {line}", output.status))
}

/// The payload binary against the nodes (`crate::node_binary`): the file, Slurm's node features of
/// the partition sbatch will get, and the glibc of the job's shell — `getconf GNU_LIBC_VERSION` through the prelude,
/// as the versions are asked. What Slurm or getconf cannot answer is left out, not failed.
fn payload_binary(
    binary: &crate::node_binary::PayloadBinary,
    partition: &str,
    inputs: &Inputs,
) -> Result<String, Outcome> {
    use crate::node_binary::{Glibc, NodeFacts, check_file, judge};
    let facts = check_file(binary, inputs.cluster).map_err(Outcome::Fail)?;
    let features = inputs.slurm.node_features(partition).unwrap_or_default();
    let getconf = bounded_output(Path::new("getconf"), &["GNU_LIBC_VERSION".to_string()], None, inputs);
    let glibc = getconf.ok().filter(|(status, _)| status.success()).and_then(|(_, out)| Glibc::from_getconf(&out));
    judge(binary, &facts, &NodeFacts { features, glibc }, inputs.cluster).map_err(Outcome::Fail)
}

/// One version question may take this long (a Python CLI importing its package on a loaded login node).
pub(crate) const VERSION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Asks each environment which vLLM and Harbor it holds — its Python's package metadata
/// (`launch_spec::versions::metadata_query`), else `<program> --version` — through the profile's
/// prelude when it has one (the job's shell), bounded, argv only; refuses a found release whose class
/// disagrees with the declaration (`launch_spec::versions::check_found`). What cannot be asked here is
/// skipped: payload asks again on the node.
fn versions(spec: &LaunchSpec, inputs: &Inputs) -> Result<String, Outcome> {
    use launch_spec::versions::Program;
    let Some(declared) = &spec.declared else { return Err(Outcome::Skipped("the spec declares no versions".into())) };
    let mut said = Vec::new();
    let mut unanswered = Vec::new();
    for (program, name, prefix, environment, wanted) in [
        (
            Program::Vllm,
            &spec.serve.program,
            spec.serve.env_prefix.as_deref(),
            &declared.engine_environment,
            declared.vllm.to_string(),
        ),
        (
            Program::Harbor,
            &spec.harbor.program,
            spec.harbor.env_prefix.as_deref(),
            &declared.harbor_environment,
            declared.harbor.clone(),
        ),
    ] {
        let Some(path) = find_program(name, prefix, inputs.path) else {
            unanswered.push(format!("{}: `{name}` not found (see `programs`)", program.label()));
            continue;
        };
        match ask_version(&path, prefix, program, inputs) {
            Ok(found) => {
                launch_spec::versions::check_found(declared, &spec.cluster, program, &found)
                    .map_err(|d| Outcome::Fail(d.to_string()))?;
                said.push(format!("{} {found} in {environment} (declared {wanted})", program.label()));
            }
            Err(why) => unanswered.push(format!("{}: {why}", program.label())),
        }
    }
    match (said.is_empty(), unanswered.is_empty()) {
        (true, _) => Err(Outcome::Skipped(format!("{} (payload asks on the node)", unanswered.join("; ")))),
        (false, true) => Ok(said.join(", ")),
        (false, false) => Ok(format!("{}; not answered: {}", said.join(", "), unanswered.join("; "))),
    }
}

/// The metadata query when the program has a Python beside it, else `--version`; the version line.
fn ask_version(
    program: &Path,
    prefix: Option<&Path>,
    which: launch_spec::versions::Program,
    inputs: &Inputs,
) -> Result<String, String> {
    let (python, args) = launch_spec::versions::metadata_query(program, which);
    let mut answers = Vec::new();
    let queries =
        [(python.is_file()).then_some((python, args)), Some((program.to_path_buf(), vec!["--version".to_string()]))];
    for (argv0, args) in queries.into_iter().flatten() {
        match bounded_answer(&argv0, &args, prefix, inputs) {
            Ok(version) => return Ok(version),
            Err(why) => answers.push(why),
        }
    }
    Err(answers.join("; "))
}

/// Runs `argv0 args…` as the job's shell would (the prelude first, through the batch script's
/// `--check-prelude PROGRAM ARG…`), in a clean environment: the login PATH behind the prefix's
/// `bin`, the module system's variables. Killed (its whole group) after [`VERSION_TIMEOUT`].
fn bounded_answer(argv0: &Path, args: &[String], prefix: Option<&Path>, inputs: &Inputs) -> Result<String, String> {
    let shown = format!("{} {}", argv0.display(), args.first().map_or("", String::as_str));
    let (status, stdout) = bounded_output(argv0, args, prefix, inputs)?;
    match launch_spec::versions::version_line(&stdout) {
        Some(version) if status.success() => Ok(version),
        _ => Err(format!("{shown}: {status} without a version on stdout")),
    }
}

/// [`bounded_answer`]'s run: the exit status and stdout (64 KiB at most).
fn bounded_output(
    argv0: &Path,
    args: &[String],
    prefix: Option<&Path>,
    inputs: &Inputs,
) -> Result<(std::process::ExitStatus, String), String> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use wait_timeout::ChildExt;
    let shown = format!("{} {}", argv0.display(), args.first().map_or("", String::as_str));
    let path = match prefix {
        Some(prefix) => format!("{}:{}", prefix.join("bin").display(), inputs.path),
        None => inputs.path.to_string(),
    };
    let mut command = match &inputs.cluster.slurm.prelude {
        Some(prelude) => {
            let mut c = std::process::Command::new("bash");
            // env_clear first: it also drops what was set before it (PAYLOAD_PRELUDE was, once).
            c.env_clear()
                .args(["--noprofile", "--norc"])
                .arg(inputs.root.join(&inputs.cluster.slurm.script))
                .arg("--check-prelude")
                .arg(argv0)
                .env("PAYLOAD_PRELUDE", inputs.root.join(prelude));
            c
        }
        None => {
            let mut c = std::process::Command::new(argv0);
            c.env_clear();
            c
        }
    };
    command
        .args(args)
        .env("PATH", &path)
        .envs(inputs.module_env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0);
    let mut child = command.spawn().map_err(|e| format!("cannot run {shown}: {e}"))?;
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(pipe) = stdout.as_mut() {
            let _ = pipe.take(64 * 1024).read_to_string(&mut text);
        }
        text
    });
    let group = nix::unistd::Pid::from_raw(child.id() as i32);
    let status = match child.wait_timeout(VERSION_TIMEOUT) {
        Ok(Some(status)) => status,
        Ok(None) | Err(_) => {
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            return Err(format!("{shown} did not answer within {} s", VERSION_TIMEOUT.as_secs()));
        }
    };
    // Anything the program left in its group would hold the pipe open.
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    Ok((status, reader.join().unwrap_or_default()))
}

/// Variables of the module system that the prelude check passes on from the submitter's shell
/// (the login node's module path and Lmod's location).
pub(crate) fn module_env(lookup: &dyn Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    ["HOME", "USER", "MODULEPATH", "LMOD_PKG", "LMOD_CMD", "LMOD_DIR", "MODULESHOME", "PAYLOAD_MODULE_INIT"]
        .iter()
        .filter_map(|name| lookup(name).map(|v| ((*name).to_string(), v)))
        .collect()
}

/// [`SiteQueries`] by the real Slurm commands.
pub(crate) struct SlurmQueries<'a>(pub &'a crate::slurm::SlurmCli);

impl SiteQueries for SlurmQueries<'_> {
    fn partitions(&self) -> Result<Vec<String>, String> {
        let out = self.0.query("sinfo", &["-h", "-o", "%R"]).map_err(|e| e.to_string())?;
        if !out.0 {
            return Err(out.2.trim().to_string());
        }
        let mut names: Vec<String> = out.1.lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect();
        names.dedup();
        Ok(names)
    }

    fn reservations(&self) -> Result<Vec<String>, String> {
        self.0.reservations().map_err(|e| e.to_string())
    }

    fn node_features(&self, partition: &str) -> Result<Vec<String>, String> {
        let out = self.0.query("sinfo", &["-h", "-p", partition, "-o", "%f"]).map_err(|e| e.to_string())?;
        if !out.0 {
            return Err(out.2.trim().to_string());
        }
        Ok(crate::node_binary::features(&out.1))
    }

    fn accounts(&self, user: &str) -> Result<Option<Vec<String>>, String> {
        let user = format!("user={user}");
        match self.0.query("sacctmgr", &["-nP", "show", "assoc", "where", &user, "format=account"]) {
            // No sacctmgr, or no slurmdbd behind it: nothing to check against.
            Err(_) => Ok(None),
            Ok((false, _, _)) => Ok(None),
            Ok((true, stdout, _)) => {
                let accounts: Vec<String> =
                    stdout.lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect();
                Ok((!accounts.is_empty()).then_some(accounts))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_70b_at_tp2_does_not_fit_on_64_gib_gpus() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
        let mut cluster = crate::config::load_cluster(&root.join("clusters"), "local").unwrap();
        cluster.hardware.gpu_memory_gib = Some(64.0);
        cluster.hardware.gpu_memory_utilization = Some(0.85);
        let mut spec = launch_spec::testkit::TestSpec::new("/", "t")
            .model("meta-llama/Llama-3.3-70B-Instruct", "m")
            .tp_dp(2, 1)
            .gpu_profiles(vec![])
            .with(|s| s.serve.cluster_gpu_memory_utilization = Some(0.85))
            .build();
        let Err(Outcome::Fail(why)) = memory(&spec, &cluster) else { panic!("a 70B at TP2 fits?") };
        assert!(why.contains("the weights may not fit") && why.contains("2 GPU(s) × 64 GiB"), "{why}");
        spec.serve.tensor_parallel_size = 4;
        assert!(memory(&spec, &cluster).is_ok());
        cluster.hardware.gpu_memory_gib = None;
        assert!(matches!(memory(&spec, &cluster), Err(Outcome::Skipped(_))));
    }

    /// Issue 32 item 16: what payload refuses before the engine loads, preflight refuses first.
    #[test]
    fn absurd_spec_values_fail_preflight_by_field() {
        let base = || launch_spec::testkit::TestSpec::new("/", "t").model("Qwen/Qwen3-8B", "m");
        assert!(spec_values(&base().build()).is_ok());
        type Change = fn(&mut LaunchSpec);
        let cases: [(&str, Change); 3] = [
            ("serve.max_model_len", |s| s.serve.max_model_len = Some(1_000_000_000_000)),
            ("harbor.n_concurrent", |s| s.harbor.n_concurrent = 1_000_000_000),
            ("harbor.agent_kwargs", |s| s.harbor.agent_kwargs = vec!["a=b\0c".into()]),
        ];
        for (field, change) in cases {
            let Err(Outcome::Fail(why)) = spec_values(&base().with(change).build()) else { panic!("{field} passed") };
            assert!(why.starts_with(&format!("field `{field}`")), "{why}");
        }
    }

    /// Issue 31: a job config with a metric the declared Harbor does not know (the old `*-drop-ei`
    /// kind) is refused at submit for the fork too, which has no `--print-config`, with the fix.
    #[test]
    fn a_stale_metric_in_the_job_config_is_refused_for_the_fork_before_submit() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
        let shipped =
            std::fs::read_to_string(root.join("presets/harbor/dcagent_eval_config_no_override.yaml")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join("dcagent_eval_config_drop-ei.yaml");
        std::fs::write(&stale, format!("{shipped}metrics:\n  - type: mean-drop-ei\n")).unwrap();
        let fork = launch_spec::versions::HarborDialect::ExtraBodyFork;
        let spec = |config: &Path| {
            launch_spec::testkit::TestSpec::new("/", "t")
                .with(|s| (s.harbor.config, s.harbor.dialect) = (config.to_path_buf(), fork))
                .build()
        };
        let Err(Outcome::Fail(why)) = harbor_config(&spec(&stale)) else { panic!("a stale metric passes") };
        assert!(
            why.contains(
                "drop-ei.yaml: metrics[0].type `mean-drop-ei` is not a metric the extra-body-fork Harbor knows"
            ),
            "{why}"
        );
        assert!(why.contains("remove the entry"), "{why}");
        let Ok(fine) = harbor_config(&spec(&root.join("presets/harbor/dcagent_eval_config_no_override.yaml"))) else {
            panic!("the shipped job config is refused")
        };
        assert!(fine.contains("fits the extra-body-fork Harbor's job config"), "{fine}");
    }

    #[test]
    fn secret_names_never_keep_values() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s.env");
        std::fs::write(&file, "# c\nexport DAYTONA_API_KEY=abc\nHF_TOKEN = x=y\n").unwrap();
        assert_eq!(secret_names(&file).unwrap(), ["DAYTONA_API_KEY", "HF_TOKEN"]);
        // Issue 32 item 8: an empty value is missing, as payload counts it (a later line wins).
        std::fs::write(
            &file,
            concat!(
                "DAYTONA_API_KEY=\n",
                "DAYTONA_DATA_API_KEY=\"\"\n",
                "HF_TOKEN=x\n",
                "HF_TOKEN=\n",
                "B=\n",
                "B=y\n"
            ),
        )
        .unwrap();
        assert_eq!(secret_names(&file).unwrap(), ["B"]);
        // What payload refuses is refused, by line, without the content.
        std::fs::write(&file, "A=1\n  sekrit line\n").unwrap();
        let err = secret_names(&file).unwrap_err().to_string();
        assert!(err.starts_with("line 2: ") && !err.contains("sekrit"), "{err}");
    }

    /// A site whose Slurm knows `debug`, the reservation `reformo` and no accounting database.
    struct FakeSite;

    impl SiteQueries for FakeSite {
        fn partitions(&self) -> Result<Vec<String>, String> {
            Ok(vec!["debug".into()])
        }
        fn reservations(&self) -> Result<Vec<String>, String> {
            Ok(vec!["reformo".into()])
        }
        fn accounts(&self, _user: &str) -> Result<Option<Vec<String>>, String> {
            Ok(None)
        }
    }

    /// Issue 31: the Slurm check judges the resolved choice (what sbatch gets), not the profile's
    /// settings; a dead reservation is refused with the live ones and the flags to use.
    #[test]
    fn the_slurm_check_judges_what_sbatch_gets() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
        let mut cluster = crate::config::load_cluster(&root.join("clusters"), "jupiter").unwrap();
        // A profile naming what this site lacks: the choice, not the profile, is what counts.
        cluster.slurm.reservation = Some("eval".into());
        let inputs = Inputs { cluster: &cluster, root: &root, slurm: &FakeSite, user: "u", path: "", module_env: &[] };
        let choice = |reservation: Option<&str>| SlurmChoice {
            partition: "debug".into(),
            account: Some("reformo".into()),
            qos: None,
            reservation: reservation.map(String::from),
            time: "12:00:00".into(),
            exclude: Some("n[01-02]".into()),
        };
        let ok = slurm(&inputs, &choice(Some("reformo"))).unwrap();
        assert!(ok.contains("reservation reformo") && ok.contains("exclude n[01-02]"), "{ok}");
        assert!(slurm(&inputs, &choice(None)).is_ok(), "--no-reservation");
        let Err(Outcome::Fail(why)) = slurm(&inputs, &choice(Some("eval"))) else {
            panic!("a dead reservation passed")
        };
        assert!(
            why.contains("`eval` is unknown")
                && why.contains("live: reformo")
                && why.contains("--reservation reformo")
                && why.contains("--no-reservation"),
            "{why}"
        );
        let mut elsewhere = choice(None);
        elsewhere.partition = "booster".into();
        let Err(Outcome::Fail(why)) = slurm(&inputs, &elsewhere) else { panic!("an unknown partition passed") };
        assert!(why.contains("`booster`") && why.contains("--partition"), "{why}");
    }

    /// Issue 31: the step-ca certificate the Leonardo tunnel needs, checked by ssh-keygen's answer.
    #[test]
    fn the_tunnels_ssh_certificate_must_be_valid_now() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("step_ca_key");
        let keygen = |args: &[&str]| {
            let ok = std::process::Command::new("ssh-keygen").args(args).output().is_ok_and(|o| o.status.success());
            assert!(ok, "ssh-keygen {args:?}");
        };
        let (ca, key_text) = (dir.path().join("ca"), key.to_str().unwrap().to_string());
        keygen(&["-q", "-t", "ed25519", "-N", "", "-f", ca.to_str().unwrap()]);
        keygen(&["-q", "-t", "ed25519", "-N", "", "-f", &key_text]);
        let spec = launch_spec::testkit::TestSpec::new("/", "t")
            .with(|s| {
                s.tunnel = TunnelSpec::Socks(
                    serde_json::from_value(serde_json::json!({"login_node": "login05", "identity_file": key_text}))
                        .unwrap(),
                )
            })
            .build();
        let now = chrono::Local::now().naive_local();
        let Err(Outcome::Fail(why)) = ssh_certificate(&spec, now) else { panic!("no certificate passed") };
        assert!(why.contains("step_ca_key-cert.pub is missing"), "{why}");
        let sign = |validity: &str| {
            keygen(&[
                "-q",
                "-s",
                ca.to_str().unwrap(),
                "-I",
                "t",
                "-n",
                "u",
                "-V",
                validity,
                &format!("{key_text}.pub"),
            ])
        };
        sign("-2h:-1h");
        let Err(Outcome::Fail(why)) = ssh_certificate(&spec, now) else { panic!("an expired certificate passed") };
        assert!(why.contains("expired at") && why.contains("step ssh login"), "{why}");
        sign("-1h:+8h");
        assert!(ssh_certificate(&spec, now).is_ok());
    }
}
