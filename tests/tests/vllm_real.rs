//! The real vLLM (0.33.0, and every other release an environment declares or
//! `launch_spec::versions::VLLM_CHECKED_BESIDE` names: 0.16.0, 0.34.0) as the oracle
//! (docs/real-programs.md).
//!
//! - Conformance: every vLLM argv payload builds — every registry model (ours and the team's
//!   `../shared/fixtures/otagent/model_config`) on every shipped cluster profile, with that
//!   cluster's GPUs — is fed to vLLM's own `vllm serve` parser and pre-load checks, and the
//!   engine's environment to vLLM's own check of `VLLM_*` names.
//! - Stand-in contract: the vLLM stand-in's option table is the real parser's, and the stand-in
//!   accepts and rejects what vLLM does (sample argvs plus every conformance argv).
//!
//! The argv comes from the product's own code: `submitter spec` (the binary, so `${VAR}`s in a
//! cluster profile resolve from its environment as on a login node) and then payload's
//! `plan::build`, which is what `payload plan` and `payload run` use. Skipped with a note when
//! the vLLM venv is absent (`scripts/install-vllm.sh`; CI installs it).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use e2e::harness::{unique, workspace_bin};
use e2e::standin::argparse::option_strings;
use e2e::standin::vllm_flags::{CHOICES, Kind, LEGACY_FLAGS, REASONING_PARSERS, SERVE_FLAGS, TOOL_PARSERS};
use e2e::vllm_oracle::{self, Checker, Verdict};
use launch_spec::LaunchSpec;
use serde_json::Value;

/// Each shipped cluster's GPUs, as payload's GPU fixture facility takes them (the same pairs as
/// scripts/plan-examples). A cluster missing here fails the test: add its fixture.
const GPU_FIXTURES: &[(&str, &str)] = &[
    ("jupiter", "gpus-4x-gh200-96gb.json"),
    ("leonardo", "gpus-4x-a100-64gb.json"),
    ("local", "gpus-4x-a100-64gb.json"),
    ("vista", "gpus-1x-gh200-96gb.json"),
];
/// The vLLM argv depends on the preset only through `gpu_memory_util`: this preset, plus every
/// preset that sets it.
const BASE_PRESET: &str = "tb2";
/// Concurrent `submitter spec` processes while building the argvs.
const SPEC_WORKERS: usize = 3;

/// Writes straight to stderr: libtest captures `eprintln!` of passing tests, and the counts belong in
/// CI's log either way.
fn say(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{text}");
}

/// The vLLM version payload is verified against (`launch-spec/src/versions.rs`).
fn verified() -> String {
    launch_spec::versions::VERIFIED_VLLM.to_string()
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// One argv payload would exec, and where it came from.
#[derive(Debug, Clone)]
struct Case {
    label: String,
    /// The vLLM version the serve environment declares.
    vllm: String,
    /// Without the program: `serve <model> …`.
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    /// Placeholder files for paths in the job's environment the argv names (see build_case), and
    /// the directory to remove afterwards: they exist only while vLLM looks at the argv.
    site_files: Vec<PathBuf>,
    site_root: PathBuf,
}

impl Case {
    /// vLLM's verdict, with the placeholder site files present meanwhile.
    fn verdict(&self, checker: &mut Checker) -> Verdict {
        for file in &self.site_files {
            let _ = std::fs::create_dir_all(file.parent().unwrap_or(&self.site_root));
            let _ = std::fs::File::create(file);
        }
        let verdict = ask(checker, &self.argv, &self.env);
        if !self.site_files.is_empty() {
            let _ = std::fs::remove_dir_all(&self.site_root);
        }
        verdict
    }
}

#[derive(Debug, Default)]
struct Corpus {
    cases: Vec<Case>,
    /// (label, payload's error) where payload could not build an argv at all.
    unbuildable: Vec<(String, String)>,
    /// (label, submitter's error) for combinations `submitter` refuses to launch.
    refused: Vec<(String, String)>,
    models: usize,
    clusters: usize,
}

/// The vLLM checker, shared by the tests of this file (vLLM's import is slow); None when the venv
/// is absent.
fn checker() -> Option<MutexGuard<'static, Checker>> {
    static CHECKER: OnceLock<Option<Mutex<Checker>>> = OnceLock::new();
    let slot = CHECKER.get_or_init(|| {
        let venv = match vllm_oracle::venv(&verified(), true) {
            Ok(v) => v,
            Err(why) => {
                say(&format!("SKIP: the real vLLM is not installed: {why}"));
                return None;
            }
        };
        let started = std::time::Instant::now();
        let checker = start_checker(&venv, &verified());
        say(&format!("vLLM {} checker ready in {:.1}s", checker.version, started.elapsed().as_secs_f64()));
        Some(Mutex::new(checker))
    });
    slot.as_ref().map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
}

fn start_checker(venv: &Path, version: &str) -> Checker {
    let checker = Checker::start(venv).unwrap_or_else(|e| panic!("vLLM checker in {}: {e}", venv.display()));
    assert_eq!(checker.version, version, "the vLLM version in {}", venv.display());
    checker
}

fn ask(checker: &mut Checker, argv: &[String], env: &BTreeMap<String, String>) -> Verdict {
    checker.check(argv, env).unwrap_or_else(|e| panic!("vLLM checker on {argv:?}: {e}"))
}

/// `${NAME}`s a cluster profile uses, so `submitter spec` can be given placeholder values.
fn variables(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else { break };
        names.insert(after[..end].to_string());
        rest = &after[end + 1..];
    }
    names
}

/// Every (registry model × cluster × relevant preset) → the argv payload builds.
fn corpus() -> &'static Corpus {
    static CORPUS: OnceLock<Corpus> = OnceLock::new();
    CORPUS.get_or_init(build_corpus)
}

struct Job {
    label: String,
    vllm: String,
    registry: PathBuf,
    model: String,
    cluster: String,
    cluster_vars: BTreeSet<String>,
    preset: String,
    fixture: PathBuf,
}

fn build_corpus() -> Corpus {
    let root = root();
    let tmp = std::env::temp_dir().join(format!("vllm-conformance-{}", unique()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let mut registries = vec![("ours".to_string(), root.join("model_config"))];
    let shared = root.join("../shared/fixtures/otagent/model_config");
    if shared.is_dir() {
        registries.push(("otagent".to_string(), shared));
    } else {
        say(&format!("NOTE: {} is absent: only our own registry is checked", shared.display()));
    }
    let clusters = submitter::config::load_clusters(&root.join("clusters")).expect("clusters/*.yaml load");
    let presets = submitter::config::load_presets(&root.join("presets")).expect("presets/*.yaml load");
    let presets: Vec<String> = presets
        .iter()
        .filter(|(name, _, preset)| name == BASE_PRESET || preset.gpu_memory_util.is_some())
        .map(|(name, _, _)| name.clone())
        .collect();
    assert!(presets.iter().any(|p| p == BASE_PRESET), "presets/{BASE_PRESET}.yaml is gone: pick another base preset");

    let mut jobs = Vec::new();
    let mut models = 0;
    for (registry_name, registry_dir) in &registries {
        let registry = submitter::registry::Registry::load(registry_dir).expect("registry loads");
        let mut ids: Vec<&launch_spec::ModelId> = registry.models.keys().collect();
        ids.sort();
        models += ids.len();
        for (path, cluster) in &clusters {
            let fixture = GPU_FIXTURES
                .iter()
                .find(|(name, _)| *name == cluster.name)
                .map(|(_, file)| root.join("tests/fixtures").join(file))
                .unwrap_or_else(|| {
                    panic!("cluster {} has no GPU fixture in GPU_FIXTURES (tests/tests/vllm_real.rs)", cluster.name)
                });
            let gpus: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&fixture).expect("fixture"))
                .expect("fixture is a JSON array");
            assert_eq!(
                gpus.len() as u32,
                cluster.hardware.gpus_per_node,
                "{} does not match cluster {}'s gpus_per_node",
                fixture.display(),
                cluster.name
            );
            let cluster_vars = variables(&std::fs::read_to_string(path).expect("cluster file"));
            for id in &ids {
                // The serve environment's declared vLLM (undeclared: the verified one), as submitter
                // chooses the environment.
                let resolved = registry.resolve(
                    id,
                    &cluster.hardware.hardware_profile,
                    cluster.hardware.gpus_per_node,
                    &submitter::registry::Overrides::default(),
                );
                let env_name = resolved.conda_env.unwrap_or_else(|| cluster.engine.default_environment.clone());
                let vllm = cluster
                    .environments
                    .get(&env_name)
                    .and_then(|e| e.vllm)
                    .map(|v| v.to_string())
                    .unwrap_or_else(verified);
                for preset in &presets {
                    let preset_note = if preset == BASE_PRESET { String::new() } else { format!(" (preset {preset})") };
                    jobs.push(Job {
                        label: format!("{registry_name}:{id} on {}{preset_note}", cluster.name),
                        vllm: vllm.clone(),
                        registry: registry_dir.clone(),
                        model: id.to_string(),
                        cluster: cluster.name.clone(),
                        cluster_vars: cluster_vars.clone(),
                        preset: preset.clone(),
                        fixture: fixture.clone(),
                    });
                }
            }
        }
    }

    let submitter_bin = workspace_bin("submitter", "submitter");
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Built)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..SPEC_WORKERS {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::SeqCst);
                    let Some(job) = jobs.get(index) else { break };
                    let result = build_case(&submitter_bin, &root, &tmp, index, job);
                    results.lock().unwrap_or_else(|e| e.into_inner()).push((index, result));
                }
            });
        }
    });
    // The placeholder site (`job-env`, empty files the argv names, e.g. a --chat-template vLLM
    // checks for) must outlive the corpus: vLLM checks the argv later. Everything else goes now.
    for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
        if entry.file_name() != "job-env" {
            let path = entry.path();
            let _ = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        }
    }
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|(index, _)| *index);
    let mut corpus = Corpus { models, clusters: clusters.len(), ..Corpus::default() };
    for (index, result) in results {
        match result {
            Ok(case) => corpus.cases.push(case),
            Err((true, why)) => corpus.refused.push((jobs[index].label.clone(), why)),
            Err((false, why)) => corpus.unbuildable.push((jobs[index].label.clone(), why)),
        }
    }
    corpus
}

/// A case, or (refused by submitter?, why).
type Built = Result<Case, (bool, String)>;

/// `submitter spec`, then payload's plan: the argv. Err((true, why)) when submitter refuses the
/// combination, Err((false, why)) when payload cannot build an argv.
fn build_case(submitter: &Path, root: &Path, tmp: &Path, index: usize, job: &Job) -> Built {
    let home = tmp.join("home");
    let spec_path = tmp.join(format!("spec-{index}.json"));
    let mut cmd = Command::new(submitter);
    cmd.args(["spec", "--cluster", &job.cluster, "--preset", &job.preset, "--model", &job.model])
        .arg("--registry")
        .arg(&job.registry)
        .arg("--clusters")
        .arg(root.join("clusters"))
        .arg("--presets")
        .arg(root.join("presets"))
        .arg("--out")
        .arg(&spec_path)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &home)
        .current_dir(root)
        .stdin(Stdio::null());
    // Site paths only decide where programs and files live, never the vLLM flags.
    for var in &job.cluster_vars {
        cmd.env(var, tmp.join("site").join(var));
    }
    let out = cmd.output().map_err(|e| (false, format!("cannot run submitter: {e}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err((true, stderr.lines().last().unwrap_or("(no message)").trim().to_string()));
    }
    let spec = LaunchSpec::from_file(&spec_path).map_err(|e| (false, format!("spec written by submitter: {e}")))?;
    let mut parent: Vec<(String, String)> = [
        ("PATH", "/usr/bin:/bin".to_string()),
        ("HOME", home.display().to_string()),
        ("SLURM_JOB_ID", "4242".to_string()),
        ("PAYLOAD_GPU_FIXTURE", job.fixture.display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    // `${VAR}`s in extra_args come from the job's environment (a site checkout, e.g. ${DCFT}):
    // a placeholder directory here, with an empty file for every path the argv names in it.
    let site = tmp.join("job-env");
    let job_vars = variables(spec.serve.extra_args.as_deref().unwrap_or(""));
    parent.extend(job_vars.iter().map(|var| (var.clone(), site.join(var).display().to_string())));
    let plan = payload::plan::build(&spec_path, &spec, &parent);
    let _ = std::fs::remove_file(&spec_path);
    if plan.engine.argv.is_empty() {
        let argv_problems: Vec<String> =
            plan.problems.iter().filter(|p| p.message.contains("extra_args")).map(|p| p.message.clone()).collect();
        return Err((false, argv_problems.join("; ")));
    }
    let site_files = plan.engine.argv.iter().filter(|a| Path::new(a).starts_with(&site)).map(PathBuf::from).collect();
    let mut label = job.label.clone();
    if !job_vars.is_empty() {
        label.push_str(&format!(" (placeholder ${{{}}})", job_vars.iter().cloned().collect::<Vec<_>>().join("}, ${")));
    }
    Ok(Case {
        label,
        vllm: job.vllm.clone(),
        argv: plan.engine.argv[1..].to_vec(),
        env: plan.engine.env,
        site_files,
        site_root: site,
    })
}

/// A parser name that only a `--reasoning-parser-plugin`/`--tool-parser-plugin` from the site's
/// files registers: its placeholder here is empty, so vLLM's name check cannot be made.
fn needs_site_plugin(case: &Case, verdict: &Verdict) -> bool {
    let error = verdict.error.as_deref().unwrap_or("");
    verdict.stage.as_deref() == Some("api_server")
        && (error.contains("invalid reasoning parser") && case.argv.iter().any(|a| a == "--reasoning-parser-plugin")
            || error.contains("invalid tool call parser") && case.argv.iter().any(|a| a == "--tool-parser-plugin"))
}

/// "message (N): label, label, …" lines, one per distinct message.
fn grouped(failures: &[(String, String)]) -> String {
    let mut by_message: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (label, message) in failures {
        by_message.entry(message.as_str()).or_default().push(label.as_str());
    }
    let mut out = String::new();
    for (message, labels) in by_message {
        out.push_str(&format!("\n  {message}\n    ({} argv) {}", labels.len(), labels.join(", ")));
    }
    out
}

#[test]
fn every_registry_argv_is_accepted_by_real_vllm() {
    let verified = verified();
    let Some(mut shared) = checker() else { return };
    let corpus = corpus();
    if !corpus.refused.is_empty() {
        say(&format!(
            "NOTE: {} combinations are refused by submitter (never launched, so not checked):{}",
            corpus.refused.len(),
            grouped(&corpus.refused)
        ));
    }
    let mut versions: BTreeMap<&str, Vec<&Case>> = BTreeMap::new();
    for case in &corpus.cases {
        versions.entry(case.vllm.as_str()).or_default().push(case);
    }
    let declared: BTreeSet<String> = versions.keys().map(|v| v.to_string()).collect();
    let mut failed = Vec::new();
    for (version, cases) in versions {
        let mut own = None;
        let checker: &mut Checker = if version == verified {
            &mut shared
        } else {
            match vllm_oracle::venv(version, false) {
                Ok(venv) => own.insert(start_checker(&venv, version)),
                Err(why) => {
                    say(&format!(
                        "NOTE: {} argv for environments declaring vLLM {version} not checked: {why}",
                        cases.len()
                    ));
                    continue;
                }
            }
        };
        // payload's own refusals belong to the verified run (they do not depend on vLLM).
        let unbuildable: &[(String, String)] = if version == verified { &corpus.unbuildable } else { &[] };
        if let Err(failure) = conform(checker, version, version, &cases, unbuildable, corpus) {
            failed.push(failure);
        }
    }
    // A newer release beside them (issue 35): the verified release's argv, which is that release's
    // argv as long as the capabilities that shape the argv agree (versions::vllm_capabilities; they
    // differ in the retired environment variables only, which `registry check` reports).
    drop(shared);
    for beside in launch_spec::versions::VLLM_CHECKED_BESIDE {
        let version = beside.to_string();
        if declared.contains(&version) {
            continue;
        }
        let built_for = launch_spec::versions::VERIFIED_VLLM;
        assert_eq!(
            (
                launch_spec::versions::vllm_has_swap_space(*beside),
                launch_spec::versions::vllm_has_distributed_timeout(*beside)
            ),
            (
                launch_spec::versions::vllm_has_swap_space(built_for),
                launch_spec::versions::vllm_has_distributed_timeout(built_for)
            ),
            "vLLM {version} gets another argv than {built_for}: declare it in a profile instead"
        );
        let cases: Vec<&Case> = corpus.cases.iter().filter(|c| c.vllm == verified).collect();
        let venv = match vllm_oracle::venv(&version, false) {
            Ok(venv) => venv,
            Err(why) if std::env::var("CI").as_deref() == Ok("true") => panic!("CI=true but {why}"),
            Err(why) => {
                say(&format!("NOTE: vLLM {version} beside {verified} not checked: {why}"));
                continue;
            }
        };
        let started = std::time::Instant::now();
        let mut checker = start_checker(&venv, &version);
        say(&format!("vLLM {version} checker ready in {:.1}s", started.elapsed().as_secs_f64()));
        if let Err(failure) = conform(&mut checker, &verified, &version, &cases, &[], corpus) {
            failed.push(failure);
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Feeds `cases` to one vLLM version's checker; prints the counts; Err lists the rejections.
fn conform(
    checker: &mut Checker,
    declaring: &str,
    version: &str,
    cases: &[&Case],
    unbuildable: &[(String, String)],
    corpus: &Corpus,
) -> Result<(), String> {
    let total = cases.len() + unbuildable.len();
    let mut rejected: Vec<(String, String)> =
        unbuildable.iter().map(|(label, why)| (label.clone(), format!("payload: {why}"))).collect();
    let mut unknown_env = Vec::new();
    let mut unverifiable = Vec::new();
    let mut warnings: BTreeMap<String, usize> = BTreeMap::new();
    for case in cases {
        let verdict = case.verdict(checker);
        if needs_site_plugin(case, &verdict) {
            unverifiable.push((case.label.clone(), verdict.message()));
        } else if !verdict.ok {
            rejected.push((case.label.clone(), verdict.message()));
        }
        if let Some(env_error) = &verdict.env_error {
            unknown_env.push((case.label.clone(), env_error.clone()));
        }
        for warning in verdict.warnings {
            *warnings.entry(warning).or_default() += 1;
        }
    }
    for (warning, count) in &warnings {
        say(&format!("vLLM {version} warned ({count} argv): {warning}"));
    }
    if !unverifiable.is_empty() {
        say(&format!(
            "NOTE: {} argv pass every check but the name of a parser that a site plugin registers (counted as accepted):{}",
            unverifiable.len(),
            grouped(&unverifiable)
        ));
    }
    say(&format!(
        "vLLM conformance: {total} argv ({} registry models × {} cluster profiles, environments declaring vLLM {declaring}), checked by vLLM {version}",
        corpus.models, corpus.clusters
    ));
    say(&format!("vLLM conformance: {}/{total} argv accepted", total - rejected.len()));
    say(&format!("vLLM conformance: {}/{total} engine environments known to vLLM", total - unknown_env.len()));
    if total > 0 && rejected.is_empty() && unknown_env.is_empty() {
        return Ok(());
    }
    Err(format!(
        "vLLM {version} rejects {} of {total} argv and does not know {} engine environments' variables:{}{}",
        rejected.len(),
        unknown_env.len(),
        grouped(&rejected),
        grouped(&unknown_env)
    ))
}

/// The stand-in's kind for a real option (`kind`, `nargs` from argcheck.py).
fn real_kind(option: &Value) -> Result<Kind, String> {
    match (option["kind"].as_str(), &option["nargs"]) {
        (Some("flag"), _) => Ok(Kind::Flag),
        (Some("bool"), _) => Ok(Kind::BoolOpt),
        (Some("value"), Value::Null) => Ok(Kind::Value),
        (Some("value"), Value::String(n)) if n == "?" => Ok(Kind::OptValue),
        (Some("value"), Value::String(n)) if n == "+" => Ok(Kind::Multi),
        other => Err(format!("{other:?}")),
    }
}

fn strings(value: &Value) -> BTreeSet<String> {
    value.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_string)).collect()
}

#[test]
fn standin_option_table_is_real_vllms() {
    let verified = verified();
    let Some(mut checker) = checker() else { return };
    let real = checker.options().expect("options from the vLLM checker");
    let mut real_strings: BTreeMap<String, Kind> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut real_choices: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for option in real["options"].as_array().expect("options") {
        let names = strings(&option["strings"]);
        match real_kind(option) {
            Ok(kind) => names.iter().for_each(|n| {
                real_strings.insert(n.clone(), kind);
            }),
            Err(what) => problems.push(format!("{names:?}: the stand-in has no kind for {what}")),
        }
        if let Some(choices) = option["choices"].as_array() {
            let choices: Vec<String> = choices.iter().filter_map(|c| c.as_str().map(str::to_string)).collect();
            names.iter().for_each(|n| {
                real_choices.insert(n.clone(), choices.clone());
            });
        }
    }
    let standin = option_strings(SERVE_FLAGS);
    for (name, kind) in &real_strings {
        match standin.get(name) {
            None => problems.push(format!("{name}: vLLM accepts it ({kind:?}), the stand-in rejects it")),
            Some(o) if o.kind != *kind => {
                problems.push(format!("{name}: vLLM consumes it as {kind:?}, the stand-in as {:?}", o.kind))
            }
            Some(_) => {}
        }
    }
    for name in standin.keys().filter(|n| !real_strings.contains_key(*n)) {
        problems.push(format!("{name}: the stand-in accepts it, vLLM {verified} does not"));
    }
    for (names, _) in LEGACY_FLAGS {
        for name in names.iter().filter(|n| real_strings.contains_key(**n)) {
            problems.push(format!("{name}: listed as legacy (gone in {verified}) but vLLM has it"));
        }
    }
    for (name, choices) in CHOICES {
        match real_choices.get(*name) {
            Some(real) if real.iter().map(String::as_str).eq(choices.iter().copied()) => {}
            other => problems.push(format!("{name}: the stand-in's choices {choices:?}, vLLM's {other:?}")),
        }
    }
    let compare = |what: &str, ours: &[&str], theirs: &Value, problems: &mut Vec<String>| {
        let ours: BTreeSet<String> = ours.iter().map(|s| s.to_string()).collect();
        let theirs = strings(theirs);
        if ours != theirs {
            problems.push(format!(
                "{what}: only the stand-in has {:?}; only vLLM has {:?}",
                ours.difference(&theirs).collect::<Vec<_>>(),
                theirs.difference(&ours).collect::<Vec<_>>()
            ));
        }
    };
    compare("tool-call parsers", TOOL_PARSERS, &real["tool_parsers"], &mut problems);
    compare("reasoning parsers", REASONING_PARSERS, &real["reasoning_parsers"], &mut problems);
    say(&format!(
        "vLLM stand-in option table: {} option strings in vLLM {verified}'s serve parser, {} in the stand-in's",
        real_strings.len(),
        standin.len()
    ));
    assert!(
        problems.is_empty(),
        "the vLLM stand-in (tests/src/standin/vllm_flags.rs) drifted from vLLM {verified}:\n  {}",
        problems.join("\n  ")
    );
}

/// The `prog: error: …` line of argparse's output, with `<function f at 0x…>` addresses blanked.
fn error_line(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.contains(": error: "))?;
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find(" at 0x") {
        out.push_str(&rest[..at + 6]);
        rest = rest[at + 6..].trim_start_matches(|c: char| c.is_ascii_hexdigit());
    }
    out.push_str(rest);
    Some(out)
}

/// Argvs whose verdicts tests rely on: what payload builds and the stand-in's own checks.
fn sample_argvs() -> Vec<Vec<String>> {
    const M: &str = "Qwen/Qwen3-8B";
    let samples: &[&[&str]] = &[
        &["serve", M],
        &["serve", M, "--disable-prefix-caching", "--no-enable-prefix-caching", "--enable-sliding-window"],
        &["serve", M, "--disable-log-requests", "--enable-expert-parallel", "--disable-expert-parallel"],
        &["serve", M, "--enable-prefix-caching=1"],
        &["serve", M, "--swap-space", "32"],
        &["serve", M, "--foo"],
        &["serve", M, "extra-positional"],
        &["serve", M, "--port", "abc"],
        &["serve", M, "--port"],
        &["serve", M, "--gpu-memory-utilization", "high"],
        &["serve", M, "--max-model-len", "32k"],
        &["serve", M, "--max-model-len", "lots"],
        &["serve", M, "--uvicorn-log-level", "loud"],
        &["serve", M, "--uvicorn-log-level", "debug"],
        &["serve", M, "--dtype", "fp7"],
        &["serve", M, "--dtype", "bfloat16"],
        &["serve", M, "--enable-auto-tool-choice"],
        &["serve", M, "--enable-auto-tool-choice", "--tool-call-parser", "nosuch"],
        &["serve", M, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        &["serve", M, "--reasoning-parser", "nosuch"],
        &["serve", M, "--reasoning-parser", "qwen3"],
        &["serve", M, "--override-generation-config", "{temperature:0.7}"],
        &["serve", M, "--override-generation-config", r#"{"temperature":0.7,"top_p":0.8}"#],
        &["serve", M, "--override-generation-config", r#"'{"temperature":0.7}'"#],
        &["serve", M, "--hf-overrides", r#"{"rope_scaling":{"rope_type":"yarn","factor":4.0}}"#],
        &["serve", M, "--limit-mm-per-prompt", r#"{"image":0}"#],
        &["serve", M, "--max-num", "3"],
        &["serve", M, "--max-num-seqs", "3", "--trust_remote_code", "-tp", "2"],
        &["serve", M, "--served-model-name", "a", "b", "--data-parallel-size", "2"],
        &["serve", M, "--enable-log-outputs"],
        &["serve", M, "--enable-log-outputs", "--enable-log-requests"],
        &["serve", "--served-model-name", "a", "--port", "8000"],
        &["serve", "--model", M, "--port", "8000"],
        &["-m", "vllm.entrypoints.openai.api_server", "--model", M, "--port", "8000"],
    ];
    samples.iter().map(|s| s.iter().map(|a| a.to_string()).collect()).collect()
}

#[test]
fn standin_accepts_and_rejects_like_real_vllm() {
    let verified = verified();
    let Some(mut checker) = checker() else { return };
    let cases: Vec<&Case> = corpus().cases.iter().filter(|c| c.vllm == verified).collect();
    let samples = sample_argvs();
    let standin = env!("CARGO_BIN_EXE_vllm-standin");
    let mut differ = Vec::new();
    let mut compared = 0;
    let mut skipped = 0;
    let mut argvs: Vec<(Vec<String>, Option<&Case>)> = samples.iter().map(|argv| (argv.clone(), None)).collect();
    argvs.extend(cases.iter().map(|case| (case.argv.clone(), Some(*case))));
    for (argv, case) in &argvs {
        let verdict = match case {
            Some(case) => case.verdict(&mut checker),
            None => ask(&mut checker, argv, &BTreeMap::new()),
        };
        if case.is_some_and(|c| needs_site_plugin(c, &verdict)) {
            // vLLM rejects the name the empty placeholder plugin does not register; the stand-in
            // takes any name with a plugin. Neither is the real site's verdict.
            skipped += 1;
            continue;
        }
        compared += 1;
        let real_code = if verdict.ok { 0 } else { verdict.exit_code.unwrap_or(1) };
        let out = Command::new(standin)
            .args(argv)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("STANDIN_VLLM_ARGS_ONLY", "1")
            .stdin(Stdio::null())
            .output()
            .expect("run vllm-standin");
        let standin_code = out.status.code().unwrap_or(-1);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // argparse's own rejections: the stand-in must print vLLM's line (function addresses aside).
        let real_line = verdict.error.as_deref().and_then(error_line).filter(|_| real_code == 2);
        if let Some(real_line) = real_line
            && error_line(&stderr) != Some(real_line.clone())
        {
            differ.push(format!(
                "{argv:?}: vLLM prints `{real_line}`; the stand-in `{}`",
                error_line(&stderr).unwrap_or_default()
            ));
        } else if standin_code != real_code {
            differ.push(format!(
                "{argv:?}: vLLM exits {real_code} {}; the stand-in exits {standin_code}: {}",
                if verdict.ok { String::new() } else { verdict.message() },
                stderr.lines().last().unwrap_or("")
            ));
        }
    }
    say(&format!(
        "vLLM stand-in contract: {}/{compared} argv ({} samples + {} conformance argv, {skipped} with a site parser plugin left out) get vLLM {verified}'s verdict",
        compared - differ.len(),
        samples.len(),
        cases.len() - skipped,
    ));
    assert!(differ.is_empty(), "the vLLM stand-in and vLLM {verified} disagree:\n  {}", differ.join("\n  "));
}

/// The retired environment variables of `launch_spec::versions::RETIRED_VLLM_ENV` (issue 35: 0.34.0
/// drops `VLLM_USE_V2_MODEL_RUNNER` and `VLLM_MARLIN_INPUT_DTYPE`) against each installed vLLM's own
/// `vllm.envs`: unknown to every installed release from the one named on; the ones retired after
/// the verified release are known to it (so 0.34's line is drawn where 0.33 and 0.34 differ).
#[test]
fn retired_environment_variables_are_the_real_vllms() {
    let mut releases = vec![launch_spec::versions::VERIFIED_VLLM, launch_spec::versions::Version::new(0, 16, 0)];
    releases.extend(launch_spec::versions::VLLM_CHECKED_BESIDE);
    releases.sort();
    let mut known: BTreeMap<launch_spec::versions::Version, BTreeSet<String>> = BTreeMap::new();
    for release in releases {
        let verified = release == launch_spec::versions::VERIFIED_VLLM;
        let Ok(venv) = vllm_oracle::venv(&release.to_string(), verified) else {
            say(&format!("NOTE: vLLM {release} not installed: its environment variables not compared"));
            continue;
        };
        let out = Command::new(venv.join("bin/python"))
            .args(["-c", "import json, vllm.envs as e; print(json.dumps(sorted(e.environment_variables)))"])
            .env("VLLM_TARGET_DEVICE", "cpu")
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .expect("run the venv's python");
        assert!(out.status.success(), "vLLM {release}: {}", String::from_utf8_lossy(&out.stderr));
        let line = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_string();
        known.insert(release, serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}")));
    }
    for (name, since) in launch_spec::versions::retired_vllm_env() {
        for (release, names) in &known {
            if release >= since {
                assert!(!names.contains(*name), "vLLM {release} still knows {name} (retired from {since})");
            }
        }
        // Known to the newest installed release before: asserted for the entries retired after the
        // verified release (0.34's); an older entry that an older release already lacks is a note
        // (RETIRED_VLLM_ENV: "the real removal may be earlier").
        if let Some((release, names)) = known.range(..*since).next_back()
            && !names.contains(*name)
        {
            assert!(
                *since <= launch_spec::versions::VERIFIED_VLLM,
                "vLLM {release} does not know {name}: it is retired earlier than {since}"
            );
            say(&format!(
                "NOTE: vLLM {release} does not know {name} either (retired from {since} in RETIRED_VLLM_ENV)"
            ));
        }
    }
    say(&format!("retired vLLM variables checked against {} installed releases", known.len()));
}
