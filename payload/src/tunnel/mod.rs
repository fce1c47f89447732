//! Tunnels (SPEC §6.5). This build implements `none` (terminus-2 and other local agents call vLLM on
//! the node). Pinggy and SOCKS come in a later issue: they are refused here with a clear `tunnel`
//! error before anything is started. The supervisor already tears a tunnel down last
//! (Harbor → vLLM → tunnel), so a tunnel child slots in as `Role::Tunnel`.

use launch_spec::OutcomeClass;
use launch_spec::launch::TunnelSpec;

use crate::failure::Failure;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TunnelError {
    #[error("tunnel kind `{0}` is not implemented in this build: use `tunnel: {{kind: none}}` (terminus-2 needs no tunnel)")]
    NotImplemented(&'static str),
}

impl From<TunnelError> for Failure {
    fn from(err: TunnelError) -> Self {
        Failure::new(OutcomeClass::Tunnel, err.to_string()).with_cause("not_implemented")
    }
}

pub fn kind(spec: &TunnelSpec) -> &'static str {
    match spec {
        TunnelSpec::None => "none",
        TunnelSpec::Pinggy { .. } => "pinggy",
        TunnelSpec::Socks { .. } => "socks",
    }
}

/// What the tunnel step will do, for plans and events.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TunnelPlan {
    pub kind: &'static str,
    pub description: String,
    /// Whether this build can do it.
    pub supported: bool,
}

pub fn plan(spec: &TunnelSpec) -> TunnelPlan {
    match spec {
        TunnelSpec::None => TunnelPlan {
            kind: "none",
            description: "no tunnel: the agent calls vLLM on this node".to_string(),
            supported: true,
        },
        TunnelSpec::Pinggy { host, port, public_url, .. } => TunnelPlan {
            kind: "pinggy",
            description: format!("reverse tunnel ssh -p {port} -R0:localhost:<port> <token>@{host} → {public_url} (not implemented in this build)"),
            supported: false,
        },
        TunnelSpec::Socks { login_node, .. } => TunnelPlan {
            kind: "socks",
            description: format!("SOCKS egress ssh -N -D <port> {login_node} (not implemented in this build)"),
            supported: false,
        },
    }
}

/// Checks the tunnel can be provided. `Ok(())` for `none` (nothing to start).
pub fn check(spec: &TunnelSpec) -> Result<(), TunnelError> {
    match spec {
        TunnelSpec::None => Ok(()),
        other => Err(TunnelError::NotImplemented(kind(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_works_others_are_refused_clearly() {
        assert!(check(&TunnelSpec::None).is_ok());
        let pinggy = TunnelSpec::Pinggy {
            host: "pro.pinggy.io".into(),
            port: 443,
            public_url: "https://x.a.pinggy.link".into(),
            token_secret: "PINGGY_TOKEN".into(),
            max_restarts: 3,
        };
        let err = check(&pinggy).unwrap_err();
        assert!(err.to_string().contains("not implemented in this build"));
        assert_eq!(Failure::from(err).class, OutcomeClass::Tunnel);
        assert!(!plan(&pinggy).supported);
    }
}
