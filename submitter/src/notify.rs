//! Notifications (the cluster profile's `notify:` section, docs/submitter.md "Notifications"):
//! what the launch loop tells people — an attempt that failed, a pair held (refused), a result
//! finished, a listener iteration that could not reach Slurm or the ledger. One message per
//! iteration, a digest when many events happen at once. Delivery is bounded in time and never
//! fails the caller: errors are returned as text (scrubbed of the webhook URL, which is a secret)
//! and counted by the caller.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use wait_timeout::ChildExt;

pub use crate::config::cluster::NotifySettings;

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("{file}: {problem}: fix the secrets file or notify.webhook_secret in the cluster profile")]
    Secrets { file: String, problem: String },
}

/// Something people are told about.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Failed {
        attempt: i64,
        model: String,
        benchmark: String,
        reason: String,
    },
    Held {
        model: String,
        benchmark: String,
        why: String,
    },
    Finished {
        attempt: i64,
        model: String,
        benchmark: String,
        score: Option<f64>,
        gpu_hours: Option<f64>,
    },
    /// An attempt cancelled: by `submitter cancel`, for its resubmission (stale pending), or
    /// withdrawn by sync (never queued).
    Cancelled {
        attempt: i64,
        model: String,
        benchmark: String,
        reason: String,
    },
    /// Remediation acted on an attempt (`cancel`, `retry`, `hold`).
    Remediated {
        attempt: i64,
        model: String,
        benchmark: String,
        action: String,
        reason: String,
    },
    ListenerTrouble {
        message: String,
    },
}

impl Event {
    fn kind(&self) -> &'static str {
        match self {
            Event::Failed { .. } => "failed",
            Event::Held { .. } => "held",
            Event::Finished { .. } => "finished",
            Event::Cancelled { .. } => "cancelled",
            Event::Remediated { .. } => "remediation",
            Event::ListenerTrouble { .. } => "listener",
        }
    }

    pub fn line(&self) -> String {
        match self {
            Event::Failed { attempt, model, benchmark, reason } => {
                format!("failed: {model} on {benchmark} (attempt {attempt}): {reason}")
            }
            Event::Held { model, benchmark, why } => format!("held: {model} on {benchmark}: {why}"),
            Event::Finished { attempt, model, benchmark, score, gpu_hours } => {
                let score = score.map_or("score unknown".to_string(), |s| format!("score {s:.3}"));
                let hours = gpu_hours.map(|h| format!(", {h:.1} GPU-hours")).unwrap_or_default();
                format!("finished: {model} on {benchmark} (attempt {attempt}): {score}{hours}")
            }
            Event::Cancelled { attempt, model, benchmark, reason } => {
                format!("cancelled: {model} on {benchmark} (attempt {attempt}): {reason}")
            }
            Event::Remediated { attempt, model, benchmark, action, reason } => {
                format!("remediation {action}: {model} on {benchmark} (attempt {attempt}): {reason}")
            }
            Event::ListenerTrouble { message } => format!("listener: {message}"),
        }
    }
}

/// What one launch iteration tells: its events, and the pairs it planned without refusing (a held
/// pair among them is no longer held, and is told again if it is refused later).
#[derive(Debug, Default)]
pub(crate) struct Tidings {
    pub events: Vec<Event>,
    pub(crate) unheld: BTreeSet<String>,
}

fn pair_key(model: &str, benchmark: &str) -> String {
    format!("{model} {benchmark}")
}

/// What people are told of transitions (pure; the consumer of the reconcile's events): a result
/// finished with its score, an attempt failed for good (a walltime end that is continued is not a
/// failure), cancelled, or ended by remediation. A start, a repair or a pending row is not told.
pub(crate) fn transition_events(changes: &[crate::transition::Transition]) -> Vec<Event> {
    use crate::ledger::AttemptStatus;
    use crate::transition::Origin;
    changes
        .iter()
        .filter(|c| c.changes_status())
        .filter_map(|c| {
            let (attempt, model, benchmark, reason) =
                (c.attempt, c.model.clone(), c.benchmark.clone(), c.reason.clone());
            match (c.to, c.origin) {
                (AttemptStatus::Finished, _) => Some(Event::Finished {
                    attempt,
                    model,
                    benchmark,
                    score: c.metrics.as_ref().and_then(|m| m.get("mean_reward")?.as_f64()),
                    gpu_hours: c.gpu_hours,
                }),
                (_, Origin::Remediation(action)) => {
                    Some(Event::Remediated { attempt, model, benchmark, action: action.as_str().to_string(), reason })
                }
                (AttemptStatus::Failed, _) if !c.resumable => Some(Event::Failed { attempt, model, benchmark, reason }),
                (AttemptStatus::Cancelled, _) => Some(Event::Cancelled { attempt, model, benchmark, reason }),
                _ => None,
            }
        })
        .collect()
}

/// Remediation's acts that moved no attempt (a retry or hold of an attempt that had ended): told
/// as such. An act that ended an attempt is told by its transition ([`transition_events`]).
pub(crate) fn remediation_events(decisions: &[crate::remediate::Decision]) -> Vec<Event> {
    decisions
        .iter()
        .filter(|d| !d.ended_an_attempt())
        .map(|d| Event::Remediated {
            attempt: d.attempt,
            model: d.model.clone(),
            benchmark: d.benchmark.clone(),
            action: d.action.as_str().to_string(),
            reason: d.reason.clone(),
        })
        .collect()
}

/// The events of one launch iteration (pure): its transitions, remediation's acts, and the pairs
/// held (refused).
pub(crate) fn iteration_events(
    changes: &[crate::transition::Transition],
    decisions: &[crate::remediate::Decision],
    planned: &[crate::planner::PlannedJob],
) -> Tidings {
    let mut events = transition_events(changes);
    events.extend(remediation_events(decisions));
    let mut unheld = BTreeSet::new();
    for job in planned {
        match &job.blocked {
            Some(crate::planner::Blocked::Refused(why) | crate::planner::Blocked::Held(why)) => events
                .push(Event::Held { model: job.model.clone(), benchmark: job.benchmark.clone(), why: why.clone() }),
            _ => {
                unheld.insert(pair_key(&job.model, &job.benchmark));
            }
        }
    }
    Tidings { events, unheld }
}

/// The one message for an iteration's events (pure): their lines, or past `digest_after` a
/// digest — counts per kind, the first `digest_after` lines and how many more.
pub fn compose(cluster: &str, events: &[Event], digest_after: usize) -> Option<String> {
    if events.is_empty() {
        return None;
    }
    let lines = events.iter().map(Event::line);
    if events.len() <= digest_after {
        return Some(lines.map(|l| format!("[{cluster}] {l}")).collect::<Vec<_>>().join("\n"));
    }
    let kinds: BTreeSet<&str> = events.iter().map(Event::kind).collect();
    let counts: Vec<String> =
        kinds.iter().map(|k| format!("{} {k}", events.iter().filter(|e| e.kind() == *k).count())).collect();
    let mut text = format!("[{cluster}] {} events: {}", events.len(), counts.join(", "));
    for line in lines.take(digest_after) {
        text += &format!("\n{line}");
    }
    text += &format!("\n… and {} more (submitter status)", events.len() - digest_after);
    Some(text)
}

/// The body both sinks get: Slack/Mattermost incoming-webhook JSON.
pub fn body(text: &str) -> String {
    serde_json::json!({ "text": text }).to_string()
}

/// Where messages go, resolved (the webhook URL read from the secrets file).
pub struct Notifier {
    webhook: Option<String>,
    command: Option<Vec<String>>,
    timeout: Duration,
    digest_after: usize,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL.
        f.debug_struct("Notifier").field("webhook", &self.webhook.is_some()).field("command", &self.command).finish()
    }
}

impl Notifier {
    /// The profile's notifier; its webhook URL from `secrets_file` (read now, so an unknown
    /// name is an error before anything is submitted).
    pub fn new(settings: &NotifySettings, secrets_file: &Path) -> Result<Notifier, NotifyError> {
        let webhook = match &settings.webhook_secret {
            None => None,
            Some(name) => {
                let secrets =
                    |problem: String| NotifyError::Secrets { file: secrets_file.display().to_string(), problem };
                let pairs = launch_spec::envfile::read_pairs(secrets_file).map_err(|e| secrets(e.to_string()))?;
                let url = pairs.into_iter().rev().find(|(k, _)| k == name).map(|(_, v)| v);
                let url = url.ok_or_else(|| secrets(format!("no `{name}` (notify.webhook_secret)")))?;
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    return Err(secrets(format!("`{name}` is not an http(s) URL (notify.webhook_secret)")));
                }
                Some(url)
            }
        };
        Ok(Notifier {
            webhook,
            command: settings.command.clone(),
            timeout: Duration::from_secs(settings.timeout_s),
            digest_after: settings.digest_after,
        })
    }

    /// Sends the iteration's events as one message to every sink, concurrently, each bounded by
    /// the timeout. Returns the problems (never containing the URL); nothing is raised.
    pub fn send(&self, cluster: &str, events: &[Event]) -> Vec<String> {
        let Some(text) = compose(cluster, events, self.digest_after) else { return Vec::new() };
        let body = body(&text);
        let deadline = Instant::now() + self.timeout;
        let webhook = self.webhook.clone().map(|url| {
            let (tx, rx) = mpsc::channel();
            let (body, timeout) = (body.clone(), self.timeout);
            // A hung receiver leaves this thread behind, bounded by ureq's own timeout; the
            // caller waits no longer than the deadline.
            std::thread::spawn(move || {
                let _ = tx.send(post(&url, &body, timeout).map_err(|e| scrub(&e, &url)));
            });
            rx
        });
        let mut problems = Vec::new();
        if let Some(argv) = &self.command
            && let Err(problem) = run_command(argv, &body, self.timeout)
        {
            problems.push(format!("notify.command: {problem}"));
        }
        if let Some(rx) = webhook {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Ok(())) => {}
                Ok(Err(problem)) => problems.push(format!("webhook: {problem}")),
                Err(_) => problems.push(format!("webhook: no answer within {} s", self.timeout.as_secs())),
            }
        }
        problems
    }
}

/// How many redirects a webhook POST follows.
const WEBHOOK_MAX_REDIRECTS: usize = 5;

/// POSTs `body` to `url`; only a 2xx answer is a message sent. A redirect (301/302/303/307/308:
/// an http → https move is the usual one) is followed by POSTing the same body to its `Location`,
/// as 307/308 require — an HTTP client's default turns 301/302 into a GET without the body, which
/// loses the message while the receiver answers 200.
fn post(url: &str, body: &str, timeout: Duration) -> Result<(), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .max_redirects(0)
        .http_status_as_error(false)
        .build()
        .into();
    let mut target = url::Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
    for _ in 0..=WEBHOOK_MAX_REDIRECTS {
        let response = agent
            .post(target.as_str())
            .header("Content-Type", "application/json")
            .send(body)
            .map_err(|e| e.to_string())?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        if !status.is_redirection() {
            return Err(format!("answered {status}: the message was not taken"));
        }
        let location = response
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .ok_or_else(|| format!("answered {status} without a Location: the message was not taken"))?;
        target = target.join(location).map_err(|e| format!("answered {status} with a bad Location: {e}"))?;
    }
    Err(format!("more than {WEBHOOK_MAX_REDIRECTS} redirects: the message was not taken"))
}

/// The URL (and its path, where a Slack webhook keeps its key) removed from a message.
fn scrub(message: &str, url: &str) -> String {
    let mut out = message.replace(url, "<webhook>");
    if let Ok(parsed) = url::Url::parse(url)
        && parsed.path().len() > 1
    {
        out = out.replace(parsed.path(), "/<secret>");
    }
    out
}

fn run_command(argv: &[String], body: &str, timeout: Duration) -> Result<(), String> {
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", argv[0]))?;
    if let Some(mut stdin) = child.stdin.take() {
        // The body is bounded by the digest, well under a pipe buffer: this write does not block.
        let _ = stdin.write_all(body.as_bytes());
    }
    match child.wait_timeout(timeout).map_err(|e| e.to_string())? {
        Some(status) if status.success() => Ok(()),
        Some(status) => Err(format!("{} exited with {status}", argv[0])),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!("{} still running after {} s: killed", argv[0], timeout.as_secs()))
        }
    }
}

/// `<state_dir>/notify.json`: what was sent and what failed (counted, never the URL), and the
/// held pairs already told about, so each listener tick does not repeat them.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct NotifyState {
    pub sent: u64,
    pub failed: u64,
    #[serde(default)]
    pub(crate) last_error: Option<String>,
    #[serde(default)]
    pub held: BTreeSet<String>,
    /// The last iteration failed: trouble was told, and is not told again until one succeeds.
    #[serde(default)]
    pub failing: bool,
}

pub const STATE_FILE: &str = "notify.json";

impl NotifyState {
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(STATE_FILE)
    }

    /// A missing or unreadable file is a fresh state (at worst a held pair is told again).
    pub fn load(state_dir: &Path) -> NotifyState {
        launch_spec::fsread::read_text_capped(
            &Self::path(state_dir),
            launch_spec::fsread::RECORD_CAP,
            launch_spec::fsread::Links::Refuse,
        )
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default()
    }

    pub fn save(&self, state_dir: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)? + "\n";
        launch_spec::records::write_atomically(&Self::path(state_dir), text.as_bytes())
    }

    /// Drops the held events told before, and forgets the pairs no longer held (so one held
    /// again later is told again). Pairs another selection plans are left as they are: several
    /// `launch` commands may share the state dir.
    pub(crate) fn new_events(&mut self, tidings: Tidings) -> Vec<Event> {
        self.held.retain(|k| !tidings.unheld.contains(k));
        let mut fresh = Vec::new();
        for event in tidings.events {
            match &event {
                Event::Held { model, benchmark, .. } if !self.held.insert(pair_key(model, benchmark)) => {}
                _ => fresh.push(event),
            }
        }
        fresh
    }

    pub fn record(&mut self, problems: &[String]) {
        if problems.is_empty() {
            self.sent += 1;
        } else {
            self.failed += 1;
            self.last_error = Some(problems.join("; "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(n: i64) -> Event {
        Event::Finished {
            attempt: n,
            model: "org/m".into(),
            benchmark: "b".into(),
            score: Some(0.5),
            gpu_hours: Some(2.0),
        }
    }

    #[test]
    fn a_few_events_are_lines_and_many_a_digest() {
        let text = compose("local", &[finished(1)], 3).unwrap();
        assert_eq!(text, "[local] finished: org/m on b (attempt 1): score 0.500, 2.0 GPU-hours");
        let mut events: Vec<Event> = (1..=5).map(finished).collect();
        events.push(Event::ListenerTrouble { message: "sync: squeue timed out".into() });
        let digest = compose("local", &events, 3).unwrap();
        assert!(digest.starts_with("[local] 6 events: 5 finished, 1 listener\n"), "{digest}");
        assert!(digest.ends_with("… and 3 more (submitter status)"), "{digest}");
        assert_eq!(digest.lines().count(), 5);
        assert_eq!(compose("local", &[], 3), None);
    }

    #[test]
    fn held_pairs_are_told_once_while_they_stay_held() {
        let held = Event::Held { model: "m".into(), benchmark: "b".into(), why: "no config".into() };
        let tidings = |events: Vec<Event>, unheld: &[&str]| Tidings {
            events,
            unheld: unheld.iter().map(|p| p.to_string()).collect(),
        };
        let mut state = NotifyState::default();
        assert_eq!(state.new_events(tidings(vec![held.clone()], &[])).len(), 1);
        assert_eq!(state.new_events(tidings(vec![held.clone(), finished(1)], &[])), vec![finished(1)]);
        // Another selection, not planning the pair, does not clear it.
        assert!(state.new_events(tidings(vec![], &["x b"])).is_empty());
        assert!(state.new_events(tidings(vec![held.clone()], &[])).is_empty());
        // Planned and not refused: no longer held; refused again later, told again.
        assert!(state.new_events(tidings(vec![], &["m b"])).is_empty());
        assert_eq!(state.new_events(tidings(vec![held.clone()], &[])), vec![held]);
    }

    #[test]
    fn the_section_is_checked_one_line_per_problem() {
        let parse = |yaml: &str| -> NotifySettings { launch_spec::yaml::from_yaml_str(yaml, Path::new("n")).unwrap() };
        assert!(parse("webhook_secret: TEAM_HOOK\n").problems().is_empty());
        let problems = |yaml: &str| parse(yaml).problems().join("\n");
        assert!(problems("timeout_s: 5\n").contains("say webhook_secret"));
        assert!(problems("webhook_secret: \"https://hooks.slack.com/x\"\n").contains("never the URL"));
        assert!(problems("command: []\n").contains("notify.command must name a program"));
        assert!(problems("command: [x]\ntimeout_s: 0\n").contains("notify.timeout_s 0"));
    }

    #[test]
    fn the_url_and_its_path_are_scrubbed() {
        let url = "http://127.0.0.1:9/hooks/T0/B0/XYZ";
        assert_eq!(scrub(&format!("{url}: refused; POST /hooks/T0/B0/XYZ"), url), "<webhook>: refused; POST /<secret>");
    }
}
