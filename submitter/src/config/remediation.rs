//! `remediation:` — what the loop does about a diagnosis (docs/verification.md "Remediation"): the
//! policy table (diagnosis → default action) and the profile's settings over it. Data only; the
//! deciding code is `crate::remediate`.

use std::collections::BTreeMap;

use serde::Deserialize;

/// What to do about one diagnosis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Cancel the job (free the GPUs); the pair goes on through the normal dedup.
    Cancel,
    /// Cancel if still running, and resubmit with the change the diagnosis implies.
    Retry,
    /// Cancel if still running, and never resubmit the pair until `submitter release` clears it.
    Hold,
    /// Nothing.
    Off,
}

impl Policy {
    /// The act the ledger records for carrying this policy out (`off` is never carried out).
    pub fn act(self) -> Option<crate::domain::RemediationAct> {
        use crate::domain::RemediationAct;
        match self {
            Policy::Cancel => Some(RemediationAct::Cancel),
            Policy::Retry => Some(RemediationAct::Retry),
            Policy::Hold => Some(RemediationAct::Hold),
            Policy::Off => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Cancel => "cancel",
            Policy::Retry => "retry",
            Policy::Hold => "hold",
            Policy::Off => "off",
        }
    }
}

/// The change a retry makes to the pair's next launch spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// `serve.gpu_memory_utilization` lowered by `gpu_memory_step`, not below `gpu_memory_floor`.
    LowerGpuMemory,
    /// The Pinggy pair the job held (locked) is left out of the next spec's bank.
    NextPinggyPair,
    /// `serve.health_timeout_s` multiplied by `ready_budget_factor`.
    LongerReadiness,
    /// The node the job ran on added to `sbatch --exclude`.
    ExcludeNode,
    /// Nothing in the launch changes: the pair waits `provider_wait_s` (the sandbox provider failed:
    /// an outage or a key being fixed), then runs again.
    WaitForProvider,
}

/// One row of the policy table.
#[derive(Debug, Clone, Copy)]
pub struct Diagnosis {
    /// A `check`/`status` finding id, or `outcome.<class>[.<cause>]` for payload's recorded end.
    pub id: &'static str,
    pub default: Policy,
    /// The change of a retry; `None`: `retry` is not an option for it.
    pub change: Option<Change>,
    /// Whether the shipped real profiles act on it (cancel of dead jobs, hold of misconfigured pairs).
    pub safe: bool,
}

use crate::verify::findings as f;

const fn row(id: &'static str, default: Policy, change: Option<Change>, safe: bool) -> Diagnosis {
    Diagnosis { id, default, change, safe }
}

/// Every diagnosis the product acts on, in the order a job's diagnoses are considered (the first
/// with a policy other than `off` decides).
// Finding ids by their constant (the one table, verify::findings); `outcome.<class>[.<cause>]` rows
// are payload's recorded ends, which are no findings.
pub const TABLE: &[Diagnosis] = &[
    // The sandbox provider failed the trials, not the agent's setup: wait and run again (bounded by
    // `max_retries`), before a dead/stalled cancel or a hold that a zero-200 engine would also raise.
    // Safe: the retry changes nothing but the time.
    row(f::TRIALS_SANDBOX_PROVIDER.id, Policy::Retry, Some(Change::WaitForProvider), true),
    // Dead and stalled jobs hold GPUs for nothing.
    row(f::ENGINE_HUNG.id, Policy::Cancel, None, true),
    row(f::ENGINE_UNHEALTHY.id, Policy::Cancel, None, true),
    row(f::OUTCOME_SILENT.id, Policy::Cancel, None, true),
    row(f::JOB_NO_STATUS.id, Policy::Cancel, None, true),
    row(f::TRIALS_ZOMBIE.id, Policy::Cancel, None, true),
    row(f::TRIALS_STALLED.id, Policy::Cancel, None, true),
    // Misconfigured pairs: a resubmission would fail the same way.
    row(f::API_BASE_PRIVATE.id, Policy::Hold, None, true),
    row(f::API_BASE_MISSING.id, Policy::Hold, None, true),
    row(f::API_BASE_MODEL_INFO.id, Policy::Hold, None, true),
    row(f::API_BASE_NOT_TUNNEL.id, Policy::Hold, None, true),
    row(f::TRIALS_INSTANT_FAIL.id, Policy::Hold, None, true),
    row(f::TRIALS_NEVER_STARTED.id, Policy::Hold, None, true),
    row(f::ENGINE_ZERO_OK.id, Policy::Hold, None, true),
    row(f::ENGINE_BAD_REQUESTS.id, Policy::Hold, None, true),
    row("outcome.harbor", Policy::Hold, None, true),
    // Faults a changed launch fixes.
    row(f::TUNNEL_LOCKED.id, Policy::Retry, Some(Change::NextPinggyPair), false),
    row("outcome.tunnel.token_locked", Policy::Retry, Some(Change::NextPinggyPair), false),
    row("outcome.engine_start.oom", Policy::Retry, Some(Change::LowerGpuMemory), false),
    row("outcome.engine_timeout", Policy::Retry, Some(Change::LongerReadiness), false),
    row("outcome.gpu", Policy::Retry, Some(Change::ExcludeNode), false),
];

pub(crate) fn diagnosis(id: &str) -> Option<&'static Diagnosis> {
    TABLE.iter().find(|d| d.id == id)
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemediationSettings {
    /// Off unless the profile turns it on.
    #[serde(default)]
    pub enabled: bool,
    /// Retries per pair (since its last `release`); past it the retry becomes a hold.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    #[serde(default = "default_gpu_memory_step")]
    pub gpu_memory_step: f64,
    #[serde(default = "default_gpu_memory_floor")]
    pub(crate) gpu_memory_floor: f64,
    /// `serve.health_timeout_s` is multiplied by this for a load that was still progressing.
    #[serde(default = "default_ready_budget_factor")]
    pub(crate) ready_budget_factor: f64,
    /// A `dead` job is cancelled once the verdict has held this long.
    #[serde(default = "default_dead_after")]
    pub dead_after_s: u64,
    /// A `stalled` job is cancelled once the verdict has held this long.
    #[serde(default = "default_stalled_after")]
    pub(crate) stalled_after_s: u64,
    /// A pair whose trials the sandbox provider failed waits this long before it runs again.
    #[serde(default = "default_provider_wait")]
    pub(crate) provider_wait_s: u64,
    /// Per-diagnosis policy over the table's default.
    #[serde(default)]
    pub overrides: BTreeMap<String, Policy>,
}

fn default_max_retries() -> u32 {
    2
}
/// The smallest `gpu_memory_step`: the retry rounds the lowered utilization to hundredths.
pub(crate) const GPU_MEMORY_STEP_MIN: f64 = 0.01;

fn default_gpu_memory_step() -> f64 {
    0.05
}
fn default_gpu_memory_floor() -> f64 {
    0.6
}
fn default_ready_budget_factor() -> f64 {
    1.5
}
fn default_dead_after() -> u64 {
    600
}
fn default_stalled_after() -> u64 {
    3600
}
fn default_provider_wait() -> u64 {
    1800
}

impl Default for RemediationSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            max_retries: default_max_retries(),
            gpu_memory_step: default_gpu_memory_step(),
            gpu_memory_floor: default_gpu_memory_floor(),
            ready_budget_factor: default_ready_budget_factor(),
            dead_after_s: default_dead_after(),
            stalled_after_s: default_stalled_after(),
            provider_wait_s: default_provider_wait(),
            overrides: BTreeMap::new(),
        }
    }
}

impl RemediationSettings {
    /// The policy in force for a diagnosis: off when remediation is off or the id is not in the table.
    pub fn policy(&self, id: &str) -> Policy {
        match diagnosis(id) {
            Some(d) if self.enabled => self.overrides.get(id).copied().unwrap_or(d.default),
            _ => Policy::Off,
        }
    }

    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        // The lowered value is rounded to hundredths (`remediate`): a smaller step changes nothing,
        // and the retry would resubmit the identical job (issue 32 item 12).
        if !(GPU_MEMORY_STEP_MIN..=0.5).contains(&self.gpu_memory_step) {
            problems.push(format!(
                "remediation.gpu_memory_step {} must be in [{GPU_MEMORY_STEP_MIN}, 0.5] (the lowered value is rounded to \
                 hundredths, so a smaller step changes nothing), e.g. 0.05",
                self.gpu_memory_step
            ));
        }
        if !(self.gpu_memory_floor > 0.0 && self.gpu_memory_floor < 1.0) {
            problems
                .push(format!("remediation.gpu_memory_floor {} must be in (0, 1), e.g. 0.6", self.gpu_memory_floor));
        }
        if !(self.ready_budget_factor > 1.0 && self.ready_budget_factor <= 10.0) {
            problems.push(format!(
                "remediation.ready_budget_factor {} must be in (1, 10], e.g. 1.5",
                self.ready_budget_factor
            ));
        }
        if self.max_retries > 20 {
            problems.push(format!("remediation.max_retries {} must be at most 20", self.max_retries));
        }
        for (key, value) in [
            ("dead_after_s", self.dead_after_s),
            ("stalled_after_s", self.stalled_after_s),
            ("provider_wait_s", self.provider_wait_s),
        ] {
            if value > 30 * 86_400 {
                problems.push(format!("remediation.{key} {value} must be at most 30 days (2592000)"));
            }
        }
        for (id, policy) in &self.overrides {
            match diagnosis(id) {
                None => {
                    let known: Vec<&str> = TABLE.iter().map(|d| d.id).collect();
                    problems.push(format!(
                        "remediation.overrides: unknown diagnosis `{id}`: known ones are {}",
                        known.join(", ")
                    ));
                }
                Some(d) if *policy == Policy::Retry && d.change.is_none() => problems.push(format!(
                    "remediation.overrides.{id}: `retry` has no change for this diagnosis (a resubmission would fail the same way): say cancel, hold or off"
                )),
                Some(_) => {}
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_unless_enabled_and_overrides_win() {
        let mut s = RemediationSettings::default();
        assert_eq!(s.policy("outcome.engine_start.oom"), Policy::Off);
        s.enabled = true;
        assert_eq!(s.policy("outcome.engine_start.oom"), Policy::Retry);
        assert_eq!(s.policy("api_base.private"), Policy::Hold);
        assert_eq!(s.policy("engine.hung"), Policy::Cancel);
        assert_eq!(s.policy("no.such"), Policy::Off);
        s.overrides.insert("api_base.private".into(), Policy::Off);
        assert_eq!(s.policy("api_base.private"), Policy::Off);
    }

    #[test]
    fn problems_name_the_key_and_the_fix() {
        let mut s = RemediationSettings { gpu_memory_step: 0.0, gpu_memory_floor: 1.2, ..Default::default() };
        s.overrides.insert("api_base.privat".into(), Policy::Hold);
        s.overrides.insert("api_base.private".into(), Policy::Retry);
        let p = s.problems();
        assert_eq!(p.len(), 4, "{p:#?}");
        assert!(p[0].starts_with("remediation.gpu_memory_step 0"), "{p:#?}");
        assert!(p[1].starts_with("remediation.gpu_memory_floor 1.2"), "{p:#?}");
        assert!(p.iter().any(|l| l.contains("unknown diagnosis `api_base.privat`")), "{p:#?}");
        assert!(p.iter().any(|l| l.contains("overrides.api_base.private: `retry` has no change")), "{p:#?}");
        assert!(RemediationSettings::default().problems().is_empty());
        // Issue 32 item 12: a step that rounds to no change is refused at load.
        let tiny = RemediationSettings { gpu_memory_step: 0.001, ..Default::default() }.problems();
        assert!(tiny.len() == 1 && tiny[0].contains("gpu_memory_step 0.001 must be in [0.01, 0.5]"), "{tiny:#?}");
        assert!(RemediationSettings { gpu_memory_step: 0.01, ..Default::default() }.problems().is_empty());
    }

    /// The shipped real profiles turn on the safe ones only: every cancel and hold of the table, no retry.
    #[test]
    fn shipped_profiles_enable_the_safe_policies_only() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../clusters");
        for name in ["leonardo", "jupiter", "vista"] {
            let profile = crate::config::load_cluster(&dir, name).unwrap();
            let s = &profile.remediation;
            assert!(s.enabled, "{name}");
            for d in TABLE {
                let expected = if d.safe { d.default } else { Policy::Off };
                assert_eq!(s.policy(d.id), expected, "{name}: {}", d.id);
            }
        }
        let local = crate::config::load_cluster(&dir, "local").unwrap();
        assert!(!local.remediation.enabled, "local: remediation is the tests' to turn on");
    }

    /// Every row is a finding of the one table or one of payload's outcome classes, so a renamed
    /// finding cannot leave a policy behind.
    #[test]
    fn every_diagnosis_is_a_finding_or_an_outcome_class() {
        use launch_spec::OutcomeClass;
        for d in TABLE {
            let finding = crate::verify::findings::ALL.iter().any(|f| f.id == d.id);
            let class = d.id.strip_prefix("outcome.").map(|rest| rest.split('.').next().unwrap_or(rest));
            let outcome = class.is_some_and(|c| serde_json::from_value::<OutcomeClass>(c.into()).is_ok());
            assert!(finding || outcome, "{}: neither a finding id nor outcome.<class>", d.id);
        }
    }

    #[test]
    fn every_retry_default_has_a_change_and_ids_are_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for d in TABLE {
            assert!(seen.insert(d.id), "{} twice", d.id);
            assert_eq!(d.default == Policy::Retry, d.change.is_some(), "{}", d.id);
            // A retry that changes the launch is not among the safe ones; one that only waits is.
            let waits_only = d.change == Some(Change::WaitForProvider);
            assert!(!d.safe || d.default != Policy::Retry || waits_only, "{}: a retry is not safe", d.id);
        }
    }
}
