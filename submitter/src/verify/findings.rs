//! Every finding the rules can give, in one table: its id, its check, and the one line of
//! docs/verification.md that documents it (held to the doc both ways by the test below), and the
//! thresholds the rules judge with ([`VerifySettings`]). A rule in `rules.rs` names its finding by
//! one of these constants, so an id nothing documents cannot be written; the remediation policies
//! (`config::remediation`) name them the same way. Adding a rule: one constant here (and a
//! threshold field when it has one), the rule in `rules.rs`, a per-trial fact (if new) in
//! `launch_spec::rundir::harbor::TrialRead`, its test, its doc row (docs/design.md §8.3).

/// A finding's identity: the check it belongs to and its stable id (`check.name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FindingId {
    pub check: &'static str,
    pub id: &'static str,
}

macro_rules! findings {
    ($($name:ident = $check:literal . $rest:literal;)*) => {
        $(pub(crate) const $name: FindingId = FindingId { check: $check, id: concat!($check, ".", $rest) };)*
        /// Every finding, in the doc's order.
        #[cfg(test)] // used only by the tests
        pub(crate) const ALL: &[FindingId] = &[$($name),*];
    };
}

findings! {
    JOB_FINISHED = "job"."finished";
    JOB_FAILED = "job"."failed";
    JOB_NO_JOB_ID = "job"."no_job_id";
    JOB_QUEUED = "job"."queued";
    JOB_GONE = "job"."gone";
    JOB_NO_STATUS = "job"."no_status";
    JOB_WAITING = "job"."waiting";
    TUNNEL_NOT_NEEDED = "tunnel"."not_needed";
    TUNNEL_MISSING = "tunnel"."missing";
    TUNNEL_LOCKED = "tunnel"."locked";
    TUNNEL_NOT_ESTABLISHED = "tunnel"."not_established";
    TUNNEL_AUTHENTICATED = "tunnel"."authenticated";
    TUNNEL_TRAFFIC = "tunnel"."traffic";
    API_BASE_UNKNOWN = "api_base"."unknown";
    API_BASE_MODEL_INFO = "api_base"."model_info";
    API_BASE_MISSING = "api_base"."missing";
    API_BASE_PRIVATE = "api_base"."private";
    API_BASE_NOT_TUNNEL = "api_base"."not_tunnel";
    API_BASE_STALE = "api_base"."stale";
    API_BASE_OK = "api_base"."ok";
    ENGINE_NO_LOG = "engine"."no_log";
    ENGINE_COMPLETIONS = "engine"."completions";
    ENGINE_BAD_REQUESTS = "engine"."bad_requests";
    ENGINE_ZERO_OK = "engine"."zero_ok";
    ENGINE_SERVER_ERRORS = "engine"."server_errors";
    ENGINE_DIED = "engine"."died";
    ENGINE_UNHEALTHY = "engine"."unhealthy";
    ENGINE_HUNG = "engine"."hung";
    ENGINE_LOG_UNREADABLE = "engine"."log_unreadable";
    TRIALS_PROGRESS = "trials"."progress";
    TRIALS_SANDBOX_PROVIDER = "trials"."sandbox_provider";
    TRIALS_INSTANT_FAIL = "trials"."instant_fail";
    TRIALS_NEVER_STARTED = "trials"."never_started";
    TRIALS_SETUP_STALLED = "trials"."setup_stalled";
    TRIALS_STALLED = "trials"."stalled";
    TRIALS_ZOMBIE = "trials"."zombie";
    TRIALS_DONE_UNRECORDED = "trials"."done_unrecorded";
    OUTCOME_FINISHED = "outcome"."finished";
    OUTCOME_FAILED = "outcome"."failed";
    OUTCOME_HARBOR_FINISHED = "outcome"."harbor_finished";
    OUTCOME_RUNNING = "outcome"."running";
    OUTCOME_SILENT = "outcome"."silent";
    OUTCOME_UNREADABLE = "outcome"."unreadable";
    AUDIT_COMPLETION = "audit"."completion";
}

// ---------------------------------------------------------------------------------------------
// The thresholds the rules judge with: the profile's `verify:` section (a new rule's threshold is a
// field here, with its default and range check).

/// Thresholds of the launch checks and verdicts (docs/design.md §8). Defaults follow the replaced system's 15-minute infra check.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerifySettings {
    /// No status.json update for this long while Slurm says RUNNING → `dead` (payload writes
    /// one every 15 s).
    pub(crate) heartbeat_timeout_s: u64,
    /// Slurm RUNNING this long without any status.json → `dead` (the batch script never reached payload).
    pub no_status_after_s: u64,
    /// No completion and no trial progress for this long → `stalled`.
    pub(crate) stall_after_s: u64,
    /// Harbor running this long with zero 200 completions → `misconfigured` (broken agent setup,
    /// e.g. missing `model_info`).
    pub(crate) zero_ok_after_s: u64,
    /// Share of 400 answers above which the run is `misconfigured` (context overflow).
    pub(crate) bad_request_share: f64,
    /// Share of 5xx answers above which `check` warns.
    pub(crate) server_error_share: f64,
    /// Fewest completions a share is computed from.
    pub(crate) min_requests: u64,
    /// All trials done but the job still running for this long → `stalled` (zombie).
    pub(crate) zombie_after_s: u64,
    /// Trials active but no new `result.json` for this long → `check` fails (stalled).
    pub(crate) no_result_after_s: u64,
    /// An installed agent's running trial with no `agent/command-0/` this long after its
    /// `config.json` → `check` fails (setup stalled).
    pub(crate) setup_stalled_after_s: u64,
    /// A trial that finished within this many seconds of its start with no output tokens is an
    /// instant failure.
    pub instant_fail_s: f64,
    /// Share of finished trials that may be instant failures before `check` fails.
    pub(crate) instant_fail_share: f64,
    /// Completion audit: valid trials needed, as a share of n_tasks × n_attempts.
    pub min_valid_share: f64,
    /// Completion audit: largest acceptable share of errored trials.
    pub max_error_share: f64,
    /// Moved to remediation (issue 34): accepted only to say where (`problems`), never acted on.
    pub(crate) auto_cancel: Option<serde_json::Value>,
}

impl Default for VerifySettings {
    fn default() -> Self {
        Self {
            heartbeat_timeout_s: 120,
            no_status_after_s: 600,
            stall_after_s: 1800,
            zero_ok_after_s: 540,
            bad_request_share: 0.15,
            server_error_share: 0.15,
            min_requests: 20,
            zombie_after_s: 600,
            no_result_after_s: 3600,
            setup_stalled_after_s: 1800,
            instant_fail_s: 5.0,
            instant_fail_share: 0.25,
            min_valid_share: 0.9,
            max_error_share: 0.1,
            auto_cancel: None,
        }
    }
}

impl VerifySettings {
    pub fn problems(&self) -> Vec<String> {
        use launch_spec::validate as v;
        let mut problems = Vec::new();
        for (key, value) in [
            ("bad_request_share", self.bad_request_share),
            ("server_error_share", self.server_error_share),
            ("instant_fail_share", self.instant_fail_share),
            ("min_valid_share", self.min_valid_share),
            ("max_error_share", self.max_error_share),
        ] {
            if let Err(problem) = v::share(value) {
                problems.push(format!("verify.{key} {problem}"));
            }
        }
        if let Err(problem) = v::seconds(self.instant_fail_s, false) {
            problems.push(format!("verify.instant_fail_s {problem}"));
        }
        if self.auto_cancel.is_some() {
            problems.push(
                "verify.auto_cancel is gone: cancelling is remediation's (one table, one bound per verdict) — write \
                 `remediation: {enabled: true, dead_after_s: N, stalled_after_s: M}` instead (docs/verification.md \
                 \"Remediation\")"
                    .to_string(),
            );
        }
        for (key, value, positive) in [
            ("heartbeat_timeout_s", Some(self.heartbeat_timeout_s), true),
            ("no_status_after_s", Some(self.no_status_after_s), false),
            ("stall_after_s", Some(self.stall_after_s), false),
            ("zero_ok_after_s", Some(self.zero_ok_after_s), false),
            ("zombie_after_s", Some(self.zombie_after_s), false),
            ("no_result_after_s", Some(self.no_result_after_s), false),
            ("setup_stalled_after_s", Some(self.setup_stalled_after_s), false),
        ] {
            if let Some(value) = value
                && let Err(problem) = v::whole_seconds(value, positive)
            {
                problems.push(format!("verify.{key} {problem}"));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    /// One cancel rule (issue 34): the former `verify.auto_cancel` is refused with remediation's fix.
    #[test]
    fn auto_cancel_is_refused_naming_remediation() {
        let settings: VerifySettings =
            launch_spec::yaml::from_yaml_str("auto_cancel: {dead_after_s: 600}\n", std::path::Path::new("verify"))
                .unwrap();
        let problems = settings.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("remediation: {enabled: true, dead_after_s: N"), "{problems:?}");
        assert!(VerifySettings::default().problems().is_empty());
    }

    use std::collections::BTreeSet;

    use super::*;

    /// The ids in the first column of the doc's finding tables (`| check | \`id\` |` rows and
    /// `| | \`id\` / \`id\` |` continuation rows).
    fn documented() -> BTreeSet<String> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/verification.md");
        let doc = std::fs::read_to_string(path).expect("docs/verification.md");
        let mut ids = BTreeSet::new();
        for line in doc.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            if cells.len() < 4 || !cells[2].starts_with('`') {
                continue;
            }
            for id in cells[2].split('/').map(|c| c.trim().trim_matches('`')) {
                if id.contains('.') && id.chars().all(|c| c.is_ascii_lowercase() || c == '_' || c == '.') {
                    ids.insert(id.to_string());
                }
            }
        }
        ids
    }

    #[test]
    fn the_table_is_the_doc_both_ways() {
        let code: BTreeSet<String> = ALL.iter().map(|f| f.id.to_string()).collect();
        let doc = documented();
        let undocumented: Vec<_> = code.difference(&doc).collect();
        let unknown: Vec<_> = doc.difference(&code).collect();
        assert!(undocumented.is_empty(), "findings without a row in docs/verification.md: {undocumented:?}");
        assert!(unknown.is_empty(), "docs/verification.md documents findings the code never gives: {unknown:?}");
        assert_eq!(code.len(), ALL.len(), "an id listed twice");
        for f in ALL {
            assert!(f.id.starts_with(&format!("{}.", f.check)), "{f:?}");
        }
    }
}
