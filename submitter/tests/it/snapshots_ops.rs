//! Snapshots (`insta`) of the human and JSON outputs of the commands that act on Slurm and the
//! ledger — `launch --once`, `status`, `sync`, `cancel`, `import`, `results`, `listener status` — through the real
//! binary against the real local Slurm and PostgreSQL, and one line of each `--watch` stream
//! (`status --watch`, `launch --watch`) parsed as a compact versioned document. The jobs are
//! submitted held (`slurm.extra_args: [--hold]`), so they stay `PENDING` whatever the machine's
//! load and every output is the same each run; each carries this process's id in its model name
//! and is cancelled at the end. Volatile parts (temp paths, the cluster name, job ids, times,
//! durations) are replaced by placeholders before the comparison, as in `snapshots.rs`.

#![allow(clippy::print_stderr)]

use std::io::{BufRead, BufReader};
use std::process::{Output, Stdio};

use serde_json::Value;
use submitter::ledger::{Ledger, open_ledger};

use crate::ledger::Store;
use crate::queueing::{TestCluster, cancel_all, text};
use crate::snapshots::stable;
use crate::support::{slurm_up, workspace_root};
use crate::team::{HISTORY, TeamDb};

/// What varies between runs, and the placeholder each becomes.
struct Scrub {
    pairs: Vec<(String, String)>,
}

impl Scrub {
    /// The test cluster's root and name, the checkout (the batch script's dir); `names`: (a name carrying this process's id, its stable form).
    fn new(cluster: &TestCluster, name: &str, names: &[(String, String)]) -> Scrub {
        let mut pairs = vec![
            (cluster.root().display().to_string(), "<root>".into()),
            (workspace_root().display().to_string(), "<repo>".into()),
            (name.to_string(), "<cluster>".into()),
        ];
        pairs.extend(names.iter().cloned());
        Scrub { pairs }
    }

    /// Every Slurm job id the ledger holds becomes `<job N>`, N in attempt order.
    fn jobs(&mut self, ledger: &dyn Ledger) {
        let mut attempts = ledger.active().unwrap();
        attempts.extend(ledger.latest_per_pair().unwrap().into_iter().map(|p| p.latest));
        attempts.sort_by_key(|a| a.id.0);
        attempts.dedup_by_key(|a| a.id.0);
        self.pairs.retain(|(_, to)| !to.starts_with("<job "));
        for (n, job) in attempts.iter().filter_map(|a| a.slurm_job_id.clone()).enumerate() {
            self.pairs.push((job, format!("<job {}>", n + 1)));
        }
    }

    fn apply(&self, text: &str) -> String {
        let mut text = stable(text);
        let mut pairs: Vec<&(String, String)> = self.pairs.iter().collect();
        // Longest first, so a name inside another is never half replaced.
        pairs.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
        for (from, to) in pairs {
            // Whole words only (a job id must not match inside a longer number), and a column stays
            // as wide as it was: the spaces after a replaced word make up for the change in length.
            let word =
                regex::Regex::new(&format!(r"(^|[^0-9A-Za-z]){}( *)([^0-9A-Za-z]|$)", regex::escape(from))).unwrap();
            while word.is_match(&text) {
                text = word
                    .replace_all(&text, |caps: &regex::Captures| {
                        let spaces = caps[2].len();
                        let width = if spaces == 0 {
                            0
                        } else {
                            (from.chars().count() + spaces).saturating_sub(to.chars().count()).max(1)
                        };
                        format!("{}{to}{}{}", &caps[1], " ".repeat(width), &caps[3])
                    })
                    .into_owned();
            }
        }
        // Durations measured by the command (`— 0.04 s`, `"seconds": 0.04`).
        let seconds = regex::Regex::new(r#"("seconds": )[0-9.e-]+|[0-9]+\.[0-9]+ s\b"#).unwrap();
        seconds.replace_all(&text, "${1}<s>").into_owned()
    }
}

fn ok(out: &Output) -> &Output {
    assert!(out.status.success(), "{}", text(out));
    out
}

/// What a command that succeeded printed; in `json` format it must be a versioned `kind` document.
fn printed(out: &Output, format: &str, kind: &str) -> String {
    let text = String::from_utf8_lossy(&ok(out).stdout).into_owned();
    if format == "json" { versioned_document(&text, kind) } else { text }
}

/// A compact document: one line, an object leading with `format_version` and `kind`.
fn assert_versioned_line(line: &str, kind: &str) {
    assert!(line.ends_with('\n') && line.trim_end().lines().count() == 1, "one line per document: {line:?}");
    let doc: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(doc["format_version"], submitter::output::FORMAT_VERSION, "{line}");
    assert_eq!(doc["kind"], kind, "{line}");
    assert!(line.starts_with(&format!("{{\"format_version\":{},\"kind\":", submitter::output::FORMAT_VERSION)));
}

/// A pretty document of `kind` leading with `format_version` and `kind`; returns it unchanged.
fn versioned_document(text: &str, kind: &str) -> String {
    let doc: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(doc["kind"], kind, "{text}");
    let head = format!("{{\n  \"format_version\": {},\n  \"kind\": ", submitter::output::FORMAT_VERSION);
    assert!(text.starts_with(&head) && text.ends_with("}\n"), "{text}");
    text.to_string()
}

/// Cancels every job the ledger still holds when dropped, so a failing test leaves no held job
/// behind on the shared Slurm.
struct CancelOnDrop<'a>(&'a str);

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if let Ok(ledger) = open_ledger(self.0) {
            cancel_all(&*ledger);
        }
    }
}

/// The first line `command` prints (it repeats until killed), then the process is killed.
fn first_line(cluster: &TestCluster, ledger: &str, command: &[&str], args: &[&str]) -> String {
    let mut child =
        cluster.command(command, ledger, args, &[]).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
    let mut line = String::new();
    let read = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    let _ = child.kill();
    let _ = child.wait();
    read.unwrap();
    line
}

/// `launch --once`, `status`, `sync`, `cancel` and `launch --dry-run` in both formats on held jobs;
/// one line of `status --watch --json` and of `launch --watch --dry-run --json`.
#[test]
fn launch_status_sync_cancel_on_held_jobs() {
    if !slurm_up() {
        return;
    }
    let name = format!("snapops-{:07}", std::process::id());
    let cluster = TestCluster::new(&name, |p| {
        *p = p.replace("  time: \"00:10:00\"\n", "  time: \"00:10:00\"\n  extra_args: [\"--hold\"]\n")
    });
    let store = Store::sqlite();
    let _cancel = CancelOnDrop(&store.spec);
    let ledger = open_ledger(&store.spec).unwrap();
    let stable_names: Vec<String> = ["A", "B", "C", "D"].iter().map(|m| format!("snapops/Held{m}-1B")).collect();
    let models: Vec<String> =
        stable_names.iter().map(|m| m.replace("-1B", &format!("{:07}-1B", std::process::id()))).collect();
    // A model's short name is in its job name (`tb2_HeldA<pid>-1B`).
    let short = |m: &String| m.trim_start_matches("snapops/").to_string();
    let renames: Vec<(String, String)> =
        models.iter().zip(&stable_names).flat_map(|(m, s)| [(m.clone(), s.clone()), (short(m), short(s))]).collect();
    let mut scrub = Scrub::new(&cluster, &name, &renames);
    let run = |command: &str, args: &[&str]| cluster.run(&[command], &store.spec, args, &[]);
    let launch = |models: &[String], format: &str| {
        let list = cluster.models_file(&models.iter().map(String::as_str).collect::<Vec<_>>());
        run("launch", &["--once", "--preset", "tb2", "--models-file", list.to_str().unwrap(), "--format", format])
    };

    let human = launch(&models[..2], "human");
    scrub.jobs(&*ledger);
    let json = launch(&models, "json");
    scrub.jobs(&*ledger);
    assert_eq!(ledger.active().unwrap().len(), 4, "{}", text(&json));
    insta::assert_snapshot!("launch_human", scrub.apply(&String::from_utf8_lossy(&ok(&human).stdout)));
    let json = versioned_document(&String::from_utf8_lossy(&ok(&json).stdout), "launch");
    insta::assert_snapshot!("launch_json", scrub.apply(&json));

    for format in ["human", "json"] {
        let out = run("status", &["--format", format]);
        insta::assert_snapshot!(format!("status_{format}"), scrub.apply(&printed(&out, format, "status")));
    }
    let line = first_line(&cluster, &store.spec, &["status"], &["--watch", "--json", "--interval", "1h"]);
    assert_versioned_line(&line, "status");
    assert_eq!(serde_json::from_str::<Value>(&line).unwrap()["jobs"].as_array().map(Vec::len), Some(4), "{line}");

    // A job cancelled behind the submitter's back is what `sync` reports (one per format).
    let job_of =
        |model: &str| ledger.active().unwrap().into_iter().find(|a| a.model == model).unwrap().slurm_job_id.unwrap();
    for (model, format) in [(&models[1], "human"), (&models[2], "json")] {
        crate::queueing::scancel(&job_of(model));
        let out = run("sync", &["--format", format]);
        insta::assert_snapshot!(format!("sync_{format}"), scrub.apply(&printed(&out, format, "sync")));
    }
    for (model, format) in [(&models[0], "human"), (&models[3], "json")] {
        let out = run("cancel", &["--model", model, "--format", format]);
        insta::assert_snapshot!(format!("cancel_{format}"), scrub.apply(&printed(&out, format, "cancel")));
    }
    assert!(ledger.active().unwrap().is_empty(), "every attempt ended");

    // A dry run shows each pair's sbatch argv and writes nothing.
    let list = cluster.models_file(&[&models[0]]);
    for format in ["human", "json"] {
        let dry =
            ["--once", "--dry-run", "--preset", "tb2", "--models-file", list.to_str().unwrap(), "--format", format];
        let out = run("launch", &dry);
        insta::assert_snapshot!(format!("launch_dry_run_{format}"), scrub.apply(&printed(&out, format, "launch")));
    }
    assert!(ledger.active().unwrap().is_empty(), "a dry run writes nothing");
    let watch = ["--watch", "--interval", "1h", "--dry-run", "--json", "--preset", "tb2", "--models-file"];
    let line = first_line(&cluster, &store.spec, &["launch"], &[&watch[..], &[list.to_str().unwrap()]].concat());
    assert_versioned_line(&line, "launch");
    assert!(ledger.active().unwrap().is_empty(), "a dry run writes nothing: {line}");
}

/// `import` of the team's history (`team.rs`'s rows) in both formats, then `results` on it.
#[test]
fn import_and_results() {
    let Some(mut team) = TeamDb::new("snapops") else { return };
    team.exec(HISTORY);
    let name = format!("snapimp-{:07}", std::process::id());
    let cluster = TestCluster::new(&name, |_| {});
    let scrub = Scrub::new(&cluster, &name, &[]);
    // The source as `import` names it: the test server's URL without password or parameters.
    let source = regex::Regex::new(r#"postgres(ql)?://[^\s"?/]+/[A-Za-z0-9_]+"#).unwrap();
    let store = Store::sqlite();
    for (format, again) in [("human", false), ("json", true)] {
        let out = cluster.run(&["import"], &store.spec, &["--format", format], &[("SUBMITTER_TEAM_DB", &team.url)]);
        let shown = printed(&out, format, "import");
        // The second import finds nothing new: both documents are pinned, each as it reads.
        assert_eq!(shown.contains("\"attempts_new\": 0"), again, "{shown}");
        insta::assert_snapshot!(format!("import_{format}"), scrub.apply(&source.replace_all(&shown, "<team-db>")));
    }
    // The imported job ids are the history's own (fixed), not scrubbed.
    for format in ["human", "json"] {
        let out = cluster.run(&["results"], &store.spec, &["--format", format], &[]);
        insta::assert_snapshot!(format!("results_{format}"), scrub.apply(&printed(&out, format, "results")));
    }
}

/// `listener status` in both formats on a state dir where no listener was started (no job of
/// its name in Slurm: the cluster name is this test's own).
#[test]
fn listener_status_never_started() {
    if !slurm_up() {
        return;
    }
    let name = format!("snaplsn-{:07}", std::process::id());
    let cluster = TestCluster::new(&name, |_| {});
    let scrub = Scrub::new(&cluster, &name, &[]);
    let store = Store::sqlite();
    for format in ["human", "json"] {
        let out = cluster.run(&["listener", "status"], &store.spec, &["--format", format], &[]);
        insta::assert_snapshot!(
            format!("listener_status_{format}"),
            scrub.apply(&printed(&out, format, "listener.status"))
        );
    }
}
