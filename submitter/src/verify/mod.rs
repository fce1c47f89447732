//! Launch verification (docs/design.md §8): "no job may look RUNNING while it is dead".
//!
//! - [`check`]: the four checks (tunnel, `api_base`, engine completions, trials) plus payload's
//!   outcome and the completion audit, from the files of any run directory — payload's, or one the
//!   old scripts left (Harbor's layout, a `vllm.log` with uvicorn access lines, `pinggy_*.log`).
//! - [`logscan`]: the engine log scanner behind the completions check (memchr line scanning).
//! - [`verdict`]: one verdict per job from payload's heartbeat, Slurm's state and the previous
//!   observation — a pure function — and the per-attempt observation files.
//! - [`results`]: the score summary folded into the ledger, the completion audit, and the
//!   models × benchmarks matrix.
//! - [`status`]: the ledger joined with Slurm and payload's records, one verdict per job.
//! - [`report`]: the self-contained HTML report.
//!
//! Thresholds live in the cluster profile's `verify:` section
//! ([`findings::VerifySettings`]); docs/verification.md lists them.

pub mod charts;
pub mod check;
pub mod compare;
pub(crate) mod findings;
pub mod plots;
pub mod report;
pub mod results;
pub mod rules;
pub mod scoring;
pub mod status;
pub mod team;
pub mod verdict;

use std::path::Path;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use findings::VerifySettings;
/// The engine log scanner lives with the rest of the run-dir format.
pub use launch_spec::rundir::enginelog as logscan;
pub use launch_spec::rundir::parse_time;

use launch_spec::fsread::{self, Links};

/// A run-dir JSON record (`status.json`, `launch.json`, `config.json`, `result.json`): a regular
/// file — never through a symlink, never a FIFO or device, so nothing here can hang or stream
/// `/dev/zero` — of at most [`fsread::RECORD_CAP`] bytes. `None` when absent or unusable.
pub(crate) fn read_record<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let bytes = fsread::read_capped(path, fsread::RECORD_CAP, Links::Refuse).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Text from a run dir as it may be printed on a terminal: control characters (ANSI escapes,
/// carriage returns, newlines inside a value) are shown escaped, never interpreted.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect(),
    )
}

/// A job's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// Queued, or payload is preparing / loading the engine.
    Starting,
    /// Completions arriving, trials progressing.
    Healthy,
    /// No completions and no trial progress for `stall_after_s`, or all trials done while the job runs.
    Stalled,
    /// The engine fails its health probe, payload stopped writing, or Slurm lost the job.
    Dead,
    /// A 400 storm, zero 200s after `zero_ok_after_s`, or a wrong `api_base` / locked tunnel.
    Misconfigured,
    Finished,
    Failed,
}

impl VerdictKind {
    pub fn as_str(self) -> &'static str {
        match self {
            VerdictKind::Starting => "starting",
            VerdictKind::Healthy => "healthy",
            VerdictKind::Stalled => "stalled",
            VerdictKind::Dead => "dead",
            VerdictKind::Misconfigured => "misconfigured",
            VerdictKind::Finished => "finished",
            VerdictKind::Failed => "failed",
        }
    }

    /// The verdicts an operator must act on.
    pub(crate) fn is_bad(self) -> bool {
        matches!(self, VerdictKind::Stalled | VerdictKind::Dead | VerdictKind::Misconfigured)
    }
}

impl std::fmt::Display for VerdictKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How bad one finding is. Ordered: `Ok < Warn < Fail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "fail",
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One result of one check: a verdict, the numbers and lines that back it, and what to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// The check it belongs to: `tunnel`, `api_base`, `engine`, `trials`, `outcome`, `audit`.
    pub check: &'static str,
    /// A stable id within the check, e.g. `engine.bad_requests`, `trials.zombie`.
    pub id: &'static str,
    pub level: Level,
    /// One line for humans.
    pub summary: String,
    /// Numbers, files and log lines behind the verdict.
    pub evidence: Vec<String>,
    /// What to do about it (absent when nothing is to be done).
    pub action: Option<String>,
    /// The `status` verdict this finding stands for when it is the most severe
    /// ([`rules::Assessment::verdict`]); absent for findings that only inform.
    pub status: Option<VerdictKind>,
}

impl Finding {
    pub fn new(which: findings::FindingId, level: Level, summary: impl Into<String>) -> Self {
        Finding {
            check: which.check,
            id: which.id,
            level,
            summary: summary.into(),
            evidence: Vec::new(),
            action: None,
            status: None,
        }
    }

    pub fn evidence(mut self, line: impl Into<String>) -> Self {
        self.evidence.push(line.into());
        self
    }

    pub fn action(mut self, action: impl Into<String>) -> Self {
        self.action = Some(action.into());
        self
    }

    pub(crate) fn stands_for(mut self, verdict: VerdictKind) -> Self {
        self.status = Some(verdict);
        self
    }
}

/// `42s`, `12m`, `3.5h`.
pub(crate) fn human_duration(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{:.1}h", s as f64 / 3600.0),
    }
}

/// `12.5%`.
pub fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// A file's modification time.
pub fn mtime(path: &Path) -> Option<DateTime<Utc>> {
    std::fs::metadata(path).ok()?.modified().ok().map(DateTime::<Utc>::from)
}

/// The agents that run inside the remote sandbox (installed harnesses) and so call the model back
/// over a public URL; terminus-2 and the other local agents run on the node
/// ([`launch_spec::spec::LOCAL_AGENTS`]). An unknown (empty) agent counts as local.
pub fn is_installed_agent(agent: &str) -> bool {
    !agent.is_empty() && launch_spec::spec::is_installed_agent(agent)
}

/// Whether a URL's host is private: loopback, RFC 1918, link-local, CGNAT, `localhost`, or a bare
/// host name without a dot (cluster-internal). An installed agent cannot reach such an address.
pub(crate) fn is_private_url(url: &str) -> bool {
    // A base URL without a scheme (`host:8000/v1`, which would parse as scheme `host`) is read as http.
    let host = [url.to_string(), format!("http://{url}")]
        .iter()
        .find_map(|candidate| url::Url::parse(candidate).ok()?.host().map(|host| host.to_owned()));
    let host = match host {
        Some(url::Host::Ipv4(v4)) => v4.to_string(),
        Some(url::Host::Ipv6(v6)) => v6.to_string(),
        Some(url::Host::Domain(name)) => name.to_string(),
        // Not a URL with a host at all: nothing an agent could reach either.
        None => return true,
    };
    let host = host.to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") || host.ends_with(".local") || host.ends_with(".internal") {
        return true;
    }
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return match ip {
            std::net::IpAddr::V4(v4) => {
                let o = v4.octets();
                v4.is_private()
                    || v4.is_loopback()
                    || v4.is_link_local()
                    || v4.is_unspecified()
                    || (o[0] == 100 && (64..128).contains(&o[1]))
            }
            std::net::IpAddr::V6(v6) => {
                v6.is_loopback() || v6.is_unspecified() || (v6.segments()[0] & 0xfe00) == 0xfc00
            }
        };
    }
    !host.contains('.')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The module graph of verification and sync has no cycle (each module's non-test code, by
    /// the modules it names): a newcomer reads them bottom-up.
    #[test]
    fn verify_and_sync_import_no_cycle() {
        let sources: [(&str, &str); 9] = [
            ("verify", include_str!("mod.rs")),
            ("check", include_str!("check.rs")),
            ("results", include_str!("results.rs")),
            ("rules", include_str!("rules.rs")),
            ("verdict", include_str!("verdict.rs")),
            ("status", include_str!("status.rs")),
            ("report", include_str!("report.rs")),
            ("sync", include_str!("../sync.rs")),
            ("observe", include_str!("../observe.rs")),
        ];
        let names: Vec<&str> = sources.iter().map(|(n, _)| *n).collect();
        let deps = |name: &str, text: &str| -> Vec<String> {
            let code = text.split("#[cfg(test)]").next().unwrap_or(text);
            // Doc comments and `pub mod` declarations are not uses.
            let code: String = code
                .lines()
                .filter(|l| !l.trim_start().starts_with("//") && !l.trim_start().starts_with("pub mod "))
                .collect::<Vec<_>>()
                .join("\n");
            let mut out = Vec::new();
            for other in &names {
                if *other == name {
                    continue;
                }
                let child = *other != "verify" && *other != "sync" && *other != "observe";
                let named = if *other == "verify" {
                    name != "sync" && name != "observe" && code.contains("super::") && !code.contains("super::super")
                        || code.contains("crate::verify::{")
                        || code.contains("crate::verify::VerifySettings")
                } else if child {
                    (name != "sync"
                        && name != "observe"
                        && name != "verify"
                        && (code.contains(&format!("super::{other}")) || code.contains(&format!(" {other}::"))))
                        || code.contains(&format!("crate::verify::{other}"))
                        || (name == "sync" && code.contains(&format!(", {other}}}")))
                        || (name == "verify" && code.contains(&format!("{other}::")))
                } else {
                    code.contains(&format!("crate::{other}"))
                };
                if named {
                    out.push(other.to_string());
                }
            }
            out
        };
        let graph: Vec<(String, Vec<String>)> = sources.iter().map(|(n, t)| (n.to_string(), deps(n, t))).collect();
        // Depth-first search for a back edge.
        fn visit(n: &str, g: &[(String, Vec<String>)], path: &mut Vec<String>, done: &mut Vec<String>) {
            if done.iter().any(|d| d == n) {
                return;
            }
            assert!(!path.iter().any(|p| p == n), "import cycle: {} → {n}\n{g:#?}", path.join(" → "));
            path.push(n.to_string());
            for d in &g.iter().find(|(k, _)| k == n).expect("known module").1 {
                visit(d, g, path, done);
            }
            path.pop();
            done.push(n.to_string());
        }
        let mut done = Vec::new();
        for (n, _) in &graph {
            visit(n, &graph, &mut Vec::new(), &mut done);
        }
        // The graph was read at all: check uses rules, sync uses results, status uses observe.
        let has = |a: &str, b: &str| graph.iter().any(|(k, v)| k == a && v.iter().any(|x| x == b));
        assert!(has("check", "rules") && has("sync", "results") && has("status", "observe"), "{graph:#?}");
    }

    #[test]
    fn private_urls() {
        for url in [
            "http://10.1.2.3:8000/v1",
            "http://127.0.0.1:8000/v1",
            "http://192.168.0.5/v1",
            "http://172.20.0.1:80/v1",
            "http://100.64.1.1/v1",
            "http://localhost:8000/v1",
            "http://lrdn0123:8000/v1",
            "http://[::1]:8000/v1",
            "lrdn0123:8000/v1",
            "http://u:p@10.0.0.1:8000/v1",
        ] {
            assert!(is_private_url(url), "{url}");
        }
        for url in [
            "https://abc123.a.pinggy.link/v1",
            "https://8.8.8.8/v1",
            "https://user@x.example.org:443/v1",
            "abc123.a.pinggy.link:443/v1",
        ] {
            assert!(!is_private_url(url), "{url}");
        }
    }

    #[test]
    fn installed_agents() {
        assert!(!is_installed_agent("terminus-2"));
        assert!(!is_installed_agent("oracle"));
        assert!(is_installed_agent("openhands"));
        assert!(is_installed_agent("claude-code"));
    }

    #[test]
    fn times() {
        assert!(parse_time("2026-11-30T06:14:33.058135Z").is_some());
        assert!(parse_time("2026-11-30T06:14:33.058135").is_some());
        assert!(parse_time("2026-11-30T06:14:33+02:00").is_some());
        assert!(parse_time("yesterday").is_none());
        assert_eq!(human_duration(90), "90s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(5400), "90m");
        assert_eq!(human_duration(9000), "2.5h");
    }
}
