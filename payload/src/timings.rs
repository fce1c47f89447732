//! Every duration payload takes from the spec, converted once before anything is spawned, so an
//! out-of-range number (`1e20`, `NaN`, `u64::MAX`) is a one-line `spec` error up front instead of a
//! panic with children running.
//!
//! The rule is the spec crate's (`launch_spec::validate`), the one every config loader applies;
//! payload applies it again to each field it uses, because it must be safe with any spec it is
//! handed, whoever wrote it.

use std::path::Path;
use std::time::{Duration, Instant};

use launch_spec::spec::TunnelSpec;
use launch_spec::{LaunchSpec, OutcomeClass};

use crate::failure::Failure;

/// The largest duration any field may hold: 30 days, longer than any Slurm time limit (the
/// bound the spec reader and every config loader apply, `launch_spec::validate`).
pub(crate) const MAX_SECONDS: u64 = launch_spec::validate::MAX_SECONDS;

/// The heartbeat period is clamped into this range (a spec value outside it is not an error).
pub(crate) const HEARTBEAT_MIN: Duration = Duration::from_millis(50);
pub(crate) const HEARTBEAT_MAX: Duration = Duration::from_secs(30);
/// The in-run health probe never runs more often than this.
pub(crate) const PROBE_MIN: Duration = Duration::from_millis(50);

/// The spec's durations, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timings {
    pub(crate) health_timeout: Duration,
    /// `serve.ready_budget.seconds`, when the spec has a budget (the cap still applies: crate::phases).
    pub ready_budget: Option<Duration>,
    /// `serve.hang_after_s`: the liveness window (crate::liveness).
    pub(crate) hang_after: Duration,
    /// `serve.load_stall_after_s`: loading with no new `vllm.log` bytes this long is stalled.
    pub(crate) load_stall_after: Duration,
    pub(crate) teardown_grace: Duration,
    pub heartbeat: Duration,
    pub(crate) probe_interval: Duration,
    pub(crate) walltime_lead: Duration,
}

/// Why a number is refused, as a one-line message naming the file and the field.
fn refuse(spec_path: &Path, field: &str, problem: &str) -> Failure {
    Failure::new(
        OutcomeClass::Spec,
        format!("{}: field `{field}`: {problem}; fix the spec or the profile it came from", spec_path.display()),
    )
}

/// Seconds as f64 → Duration by the spec crate's rule (finite, ≥ 0 or > 0, ≤ [`MAX_SECONDS`]),
/// which keeps every value representable as an `Instant` offset from now.
pub(crate) fn seconds_f64(spec_path: &Path, field: &str, value: f64, positive: bool) -> Result<Duration, Failure> {
    launch_spec::validate::seconds(value, positive).map_err(|problem| refuse(spec_path, field, &problem))
}

/// Whole seconds → Duration by the spec crate's rule (≤ [`MAX_SECONDS`], > 0 when `positive`).
pub(crate) fn seconds_u64(spec_path: &Path, field: &str, value: u64, positive: bool) -> Result<Duration, Failure> {
    launch_spec::validate::whole_seconds(value, positive).map_err(|problem| refuse(spec_path, field, &problem))
}

/// `start + d`, saturating far in the future instead of panicking on overflow.
pub(crate) fn deadline(start: Instant, d: Duration) -> Instant {
    start.checked_add(d).unwrap_or_else(|| start + Duration::from_secs(MAX_SECONDS))
}

/// Checks every duration of the spec (the tunnel's too) and returns the run's.
pub(crate) fn check(spec_path: &Path, spec: &LaunchSpec) -> Result<Timings, Failure> {
    let l = &spec.limits;
    let timings = Timings {
        health_timeout: seconds_u64(spec_path, "serve.health_timeout_s", spec.serve.health_timeout_s, true)?,
        ready_budget: match &spec.serve.ready_budget {
            Some(b) => Some(seconds_u64(spec_path, "serve.ready_budget.seconds", b.seconds, false)?),
            None => None,
        },
        hang_after: seconds_u64(spec_path, "serve.hang_after_s", spec.serve.hang_after_s, true)?,
        load_stall_after: seconds_u64(spec_path, "serve.load_stall_after_s", spec.serve.load_stall_after_s, true)?,
        teardown_grace: seconds_f64(spec_path, "limits.teardown_grace_s", l.teardown_grace_s, false)?,
        heartbeat: seconds_f64(spec_path, "limits.heartbeat_interval_s", l.heartbeat_interval_s, true)?
            .clamp(HEARTBEAT_MIN, HEARTBEAT_MAX),
        probe_interval: seconds_f64(spec_path, "limits.health_probe_interval_s", l.health_probe_interval_s, true)?
            .max(PROBE_MIN),
        walltime_lead: seconds_u64(spec_path, "limits.walltime_lead_s", l.walltime_lead_s, false)?,
    };
    match &spec.tunnel {
        TunnelSpec::None => {}
        TunnelSpec::Pinggy(p) => {
            seconds_f64(spec_path, "tunnel.restart_backoff_s", p.restart_backoff_s, false)?;
            seconds_f64(spec_path, "tunnel.connect_timeout_s", p.connect_timeout_s, false)?;
            seconds_f64(spec_path, "tunnel.verify_interval_s", p.verify_interval_s, false)?;
            seconds_u64(spec_path, "tunnel.lease_ttl_s", p.lease_ttl_s, false)?;
        }
        TunnelSpec::Socks(s) => {
            seconds_f64(spec_path, "tunnel.restart_backoff_s", s.restart_backoff_s, false)?;
            seconds_f64(spec_path, "tunnel.connect_timeout_s", s.connect_timeout_s, false)?;
            seconds_f64(spec_path, "tunnel.verify_interval_s", s.verify_interval_s, false)?;
        }
    }
    Ok(timings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use launch_spec::testkit::unit_spec as spec;

    #[test]
    fn defaults_pass() {
        let t = check(Path::new("s.json"), &spec()).unwrap();
        assert_eq!(t.health_timeout, Duration::from_secs(60));
    }

    #[test]
    fn out_of_range_numbers_are_one_line_spec_errors() {
        let p = Path::new("/runs/launch.json");
        type Edit = Box<dyn Fn(&mut LaunchSpec)>;
        let cases: Vec<(&str, Edit)> = vec![
            ("limits.health_probe_interval_s", Box::new(|s| s.limits.health_probe_interval_s = 1e20)),
            ("limits.teardown_grace_s", Box::new(|s| s.limits.teardown_grace_s = 1e20)),
            ("limits.teardown_grace_s", Box::new(|s| s.limits.teardown_grace_s = f64::NAN)),
            ("limits.teardown_grace_s", Box::new(|s| s.limits.teardown_grace_s = -1.0)),
            ("limits.heartbeat_interval_s", Box::new(|s| s.limits.heartbeat_interval_s = f64::INFINITY)),
            ("limits.health_probe_interval_s", Box::new(|s| s.limits.health_probe_interval_s = 0.0)),
            ("serve.health_timeout_s", Box::new(|s| s.serve.health_timeout_s = u64::MAX)),
            ("serve.health_timeout_s", Box::new(|s| s.serve.health_timeout_s = 0)),
            ("serve.hang_after_s", Box::new(|s| s.serve.hang_after_s = 0)),
            ("serve.hang_after_s", Box::new(|s| s.serve.hang_after_s = u64::MAX)),
            ("limits.walltime_lead_s", Box::new(|s| s.limits.walltime_lead_s = u64::MAX)),
        ];
        for (field, edit) in cases {
            let mut s = spec();
            edit(&mut s);
            let err = check(p, &s).unwrap_err();
            assert_eq!(err.class, OutcomeClass::Spec);
            assert!(err.message.contains(field), "{field}: {}", err.message);
            assert!(err.message.contains("/runs/launch.json"), "{}", err.message);
            assert!(!err.message.contains('\n'));
        }
    }

    #[test]
    fn tunnel_backoff_is_checked() {
        let mut s = spec();
        s.tunnel = serde_json::from_value(serde_json::json!({
            "kind": "socks", "login_node": "login1", "restart_backoff_s": 1e20
        }))
        .unwrap();
        let err = check(Path::new("s.json"), &s).unwrap_err();
        assert!(err.message.contains("tunnel.restart_backoff_s"), "{}", err.message);
    }
}
