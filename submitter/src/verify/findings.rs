//! Every finding the rules can give, in one table: its id, its check, and the one line of
//! docs/verification.md that documents it (held to the doc both ways by the test below). A rule
//! in `rules.rs` (or a file check in `check.rs`) names its finding by one of these constants, so
//! an id nothing documents cannot be written. Adding a rule: one constant here (and in [`ALL`]),
//! the rule, its test, its doc row (docs/design.md, "Recipes").

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

#[cfg(test)]
mod tests {
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
