//! Notifications (docs/submitter.md "Notifications"): a real HTTP receiver on loopback (tiny_http
//! in a thread) gets the webhook posts; one that hangs or answers 500 costs the listener at most
//! the timeout; the URL (a secret) is in no argv, log or record.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use submitter::notify::{Event, Notifier, NotifySettings};

use crate::queueing::{TestCluster, text};
use crate::support::slurm_up;

/// How the receiver answers.
#[derive(Clone, Copy)]
pub(crate) enum Answer {
    Ok,
    Fail500,
    /// Reads the request, never answers (until the test ends).
    Hang,
}

pub(crate) struct Receiver {
    pub(crate) url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    /// A webhook receiver on 127.0.0.1; its URL has a secret-looking path, as Slack's do.
    pub(crate) fn start(answer: Answer) -> Receiver {
        let server = tiny_http::Server::http("127.0.0.1:0").unwrap();
        let port = server.server_addr().to_ip().unwrap().port();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let seen = bodies.clone();
        std::thread::spawn(move || {
            let mut parked = Vec::new();
            for mut request in server.incoming_requests() {
                let mut body = String::new();
                request.as_reader().read_to_string(&mut body).unwrap();
                let json: Value = serde_json::from_str(&body).unwrap_or(Value::String(body));
                seen.lock().unwrap().push(json);
                match answer {
                    Answer::Ok => request.respond(tiny_http::Response::from_string("ok")).unwrap(),
                    Answer::Fail500 => {
                        request.respond(tiny_http::Response::from_string("no").with_status_code(500)).unwrap()
                    }
                    Answer::Hang => parked.push(request),
                }
            }
        });
        let secret = format!("hooks/T{}/B0/s3cr3t{}", std::process::id(), port);
        Receiver { url: format!("http://127.0.0.1:{port}/{secret}"), bodies }
    }

    pub(crate) fn texts(&self) -> Vec<String> {
        self.bodies.lock().unwrap().iter().map(|b| b["text"].as_str().unwrap_or("").to_string()).collect()
    }
}

/// The section as a profile gives it (through the launch-spec YAML entry point).
fn settings(yaml: &str) -> NotifySettings {
    launch_spec::yaml::from_yaml_str(yaml, Path::new("notify")).unwrap()
}

fn secrets(dir: &Path, url: &str) -> std::path::PathBuf {
    let path = dir.join("secrets.env");
    std::fs::write(&path, format!("TEAM_WEBHOOK={url}\n")).unwrap();
    path
}

fn finished() -> Event {
    Event::Finished {
        attempt: 7,
        model: "test/Tiny-1B".into(),
        benchmark: "terminal_bench_2".into(),
        score: Some(0.75),
        gpu_hours: Some(1.5),
    }
}

#[test]
fn webhook_bodies_digest_and_a_command_sink() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(Answer::Ok);
    let out = dir.path().join("command-got.json");
    let yaml = format!(
        "webhook_secret: TEAM_WEBHOOK\ncommand: [\"/bin/sh\", \"-c\", \"cat > \\\"$0\\\"\", \"{}\"]\ndigest_after: 2\n",
        out.display()
    );
    let notifier = Notifier::new(&settings(&yaml), &secrets(dir.path(), &receiver.url)).unwrap();
    assert!(notifier.send("local", &[finished()]).is_empty());
    let many = vec![
        finished(),
        Event::Held { model: "m".into(), benchmark: "b".into(), why: "no serve settings".into() },
        Event::ListenerTrouble { message: "sync: squeue: timed out".into() },
    ];
    assert!(notifier.send("local", &many).is_empty());
    assert_eq!(
        receiver.texts(),
        [
            "[local] finished: test/Tiny-1B on terminal_bench_2 (attempt 7): score 0.750, 1.5 GPU-hours".to_string(),
            "[local] 3 events: 1 finished, 1 held, 1 listener\nfinished: test/Tiny-1B on terminal_bench_2 (attempt 7): \
             score 0.750, 1.5 GPU-hours\nheld: m on b: no serve settings\n… and 1 more (submitter status)"
                .to_string(),
        ]
    );
    // The command got the same JSON body on stdin (the last message).
    let got: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(got["text"].as_str().unwrap(), receiver.texts()[1]);
    assert!(!format!("{notifier:?}").contains("s3cr3t"));
}

#[test]
fn a_hanging_or_failing_receiver_or_command_costs_at_most_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    for answer in [Answer::Hang, Answer::Fail500] {
        let receiver = Receiver::start(answer);
        let notifier = Notifier::new(
            &settings("webhook_secret: TEAM_WEBHOOK\ncommand: [\"/bin/sleep\", \"30\"]\ntimeout_s: 2\n"),
            &secrets(dir.path(), &receiver.url),
        )
        .unwrap();
        let started = Instant::now();
        let problems = notifier.send("local", &[finished()]);
        let took = started.elapsed();
        // Both sinks run at once, each bounded by 2 s; slack for a loaded machine.
        assert!(took < Duration::from_secs(6), "took {took:?}");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("/bin/sleep still running after 2 s: killed"), "{problems:?}");
        assert!(problems.iter().all(|p| !p.contains("s3cr3t") && !p.contains(&receiver.url)), "{problems:?}");
        assert_eq!(receiver.bodies.lock().unwrap().len(), 1, "the receiver got the post");
    }
}

#[test]
fn an_unknown_secret_name_is_one_line_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let err = Notifier::new(&settings("webhook_secret: NO_SUCH_HOOK\n"), &secrets(dir.path(), "http://127.0.0.1:9/x"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no `NO_SUCH_HOOK` (notify.webhook_secret)") && !err.contains('\n'), "{err}");
    assert!(!err.contains("127.0.0.1"), "{err}");
}

/// The launch loop on the real local Slurm: a refused pair is told once (not on every
/// iteration, nor again after another selection's iterations), a finished result with its score; a receiver answering 500 is counted in
/// `notify.json` and logged, without the URL, and the iteration still succeeds.
#[test]
fn launch_tells_held_pairs_once_and_finished_results() {
    if !slurm_up() {
        return;
    }
    for answer in [Answer::Ok, Answer::Fail500] {
        let receiver = Receiver::start(answer);
        let cluster = TestCluster::new("notify", |p| {
            *p += "notify: {webhook_secret: TEAM_WEBHOOK, timeout_s: 3}\n";
        });
        let secrets = cluster.root().join("secrets.env");
        let mut keys = std::fs::read_to_string(&secrets).unwrap();
        keys += &format!("TEAM_WEBHOOK={}\n", receiver.url);
        launch_spec::testkit::world::write_secrets(&secrets, &keys, 0o600);
        let ledger = cluster.root().join("ledger.sqlite").display().to_string();
        // A Harbor config that does not exist refuses the pair (held); run before and after the
        // other selection, sharing the state dir.
        let missing = cluster.root().join("no-such-config.yaml").display().to_string();
        let held_args = ["--once", "--preset", "tb2", "--model", "test/Small-3B", "--harbor-config", &missing];
        let args = ["--once", "--preset", "tb2", "--model", "test/Tiny-1B"];
        let refused = cluster.run(&["launch"], &ledger, &held_args, &[]);
        assert!(text(&refused).contains("refused"), "{}", text(&refused));
        let first = cluster.run(&["launch"], &ledger, &args, &[]);
        assert!(text(&first).contains("1 submitted"), "{}", text(&first));
        let store = submitter::ledger::open_ledger(&ledger).unwrap();
        let mut runs = vec![refused, first];
        crate::queueing::wait_until("the job to finish and a launch to sync it", Duration::from_secs(120), || {
            runs.push(cluster.run(&["launch"], &ledger, &args, &[]));
            store.active().unwrap().is_empty()
        });
        runs.push(cluster.run(&["launch"], &ledger, &held_args, &[]));
        let texts = receiver.texts();
        let held: Vec<&String> =
            texts.iter().filter(|t| t.contains("held: test/Small-3B on terminal_bench_2")).collect();
        assert_eq!(held.len(), 1, "told once while it stays held: {texts:?}");
        let done = texts.iter().find(|t| t.contains("finished: test/Tiny-1B on terminal_bench_2")).expect("finished");
        assert!(done.contains("score "), "{done}");
        let state: Value = serde_json::from_str(
            &std::fs::read_to_string(cluster.root().join("state").join(submitter::notify::STATE_FILE)).unwrap(),
        )
        .unwrap();
        let logs: String = runs.iter().map(text).collect();
        match answer {
            Answer::Fail500 => {
                assert_eq!(state["failed"], 2, "{state}");
                assert!(logs.contains("notify: webhook:"), "{logs}");
            }
            _ => assert_eq!((state["sent"].as_u64(), state["failed"].as_u64()), (Some(2), Some(0)), "{state}"),
        }
        // The refused pair's runs exit 6 (a pair that could not be queued, docs/exit-codes.md);
        // every other run succeeds whatever the receiver answered.
        for run in &runs[1..runs.len() - 1] {
            assert!(run.status.success(), "a notification failure never fails the iteration: {}", text(run));
        }
        let records =
            std::fs::read_to_string(cluster.root().join("state").join(submitter::notify::STATE_FILE)).unwrap();
        assert!(!logs.contains("s3cr3t") && !records.contains("s3cr3t"), "{logs}\n{records}");
        crate::queueing::cancel_all(store.as_ref());
    }
}

/// An unknown secret name stops `launch` before anything is submitted, in one line.
#[test]
fn launch_refuses_an_unknown_webhook_secret_before_submitting() {
    let cluster = TestCluster::new("notify-bad", |p| *p += "notify: {webhook_secret: NOT_IN_FILE}\n");
    let ledger = cluster.root().join("ledger.sqlite").display().to_string();
    let out = cluster.run(&["launch"], &ledger, &["--once", "--preset", "tb2", "--model", "test/Tiny-1B"], &[]);
    assert!(!out.status.success());
    let err = text(&out);
    assert!(err.contains("no `NOT_IN_FILE` (notify.webhook_secret)"), "{err}");
    let store = submitter::ledger::open_ledger(&ledger).unwrap();
    assert!(store.attempts_for("test/Tiny-1B", "terminal_bench_2").unwrap().is_empty());
}

/// `registry check` finds the same unknown name in the profile's secrets file, one line.
#[test]
fn registry_check_names_an_unknown_webhook_secret() {
    let cluster = TestCluster::new("notify-lint", |p| *p += "notify: {webhook_secret: NOT_IN_FILE}\n");
    let clusters = cluster.root().join("clusters");
    let out = crate::support::submitter(&["registry", "check", "--clusters", clusters.to_str().unwrap()]);
    assert!(!out.status.success());
    let all = text(&out);
    let lines: Vec<&str> = all.lines().filter(|l| l.contains("NOT_IN_FILE")).collect();
    assert_eq!(lines.len(), 1, "{all}");
    assert!(lines[0].starts_with("error: ") && lines[0].contains("notify-lint.yaml"), "{all}");
}

/// Issue 32 item 5: a webhook behind a redirect (http → https moves answer 301/302) gets its
/// message: the POST is repeated with its body at the `Location`, never turned into a bodiless GET
/// that the receiver answers 200 while the message is lost. A redirect without a `Location` is a
/// problem, so `notify.json` counts it failed, not sent.
#[test]
fn a_redirected_webhook_gets_the_post_with_its_body() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(Answer::Ok);
    let target = receiver.url.clone();
    for (status, location) in
        [(301, Some(target.clone())), (302, Some(target.clone())), (308, Some(target)), (301, None)]
    {
        let front = tiny_http::Server::http("127.0.0.1:0").unwrap();
        let port = front.server_addr().to_ip().unwrap().port();
        let methods = Arc::new(Mutex::new(Vec::new()));
        let seen = methods.clone();
        let location_header = location.clone();
        std::thread::spawn(move || {
            for request in front.incoming_requests() {
                seen.lock().unwrap().push(request.method().to_string());
                let mut response = tiny_http::Response::from_string("moved").with_status_code(status);
                if let Some(location) = &location_header {
                    response.add_header(tiny_http::Header::from_bytes("Location", location.as_bytes()).unwrap());
                }
                request.respond(response).unwrap();
            }
        });
        let before = receiver.texts().len();
        let notifier = Notifier::new(
            &settings("webhook_secret: TEAM_WEBHOOK\ntimeout_s: 5\n"),
            &secrets(dir.path(), &format!("http://127.0.0.1:{port}/hooks/s3cr3t")),
        )
        .unwrap();
        let problems = notifier.send("local", &[finished()]);
        let mut state = submitter::notify::NotifyState::default();
        state.record(&problems);
        assert_eq!(methods.lock().unwrap().as_slice(), ["POST"], "{status}");
        match location {
            Some(_) => {
                assert!(problems.is_empty(), "{status}: {problems:?}");
                assert_eq!(receiver.texts().len(), before + 1, "{status}: the message reached the receiver");
                assert!(receiver.texts().last().unwrap().contains("finished: test/Tiny-1B"), "{status}");
                assert_eq!((state.sent, state.failed), (1, 0));
            }
            None => {
                assert_eq!(receiver.texts().len(), before, "{status}");
                assert!(problems.len() == 1 && problems[0].contains("without a Location"), "{problems:?}");
                assert!(!problems[0].contains("s3cr3t"), "{problems:?}");
                assert_eq!((state.sent, state.failed), (0, 1), "a lost message is not counted as sent");
            }
        }
    }
}
