//! What the tunnel's ssh (and the server behind it) prints, classified line by line.
//!
//! Pinggy's lines (docs/tunnels.md): `You are authenticated as …`
//! with a persistent token, `You are not authenticated.` without (or with a rejected) one, then the
//! `http://` and `https://` URLs; a second session with the same token gets a message that a tunnel
//! with the same token is already active. The lock wording was never captured verbatim, so the
//! match is deliberately loose: "already active", or "same token" with "already"/"active". OpenSSH's
//! own client lines (`Allocated port N for remote forward to …`, `Permission denied (publickey)`,
//! `Connection refused`, `remote port forwarding failed`, `Host key verification failed`) classify
//! the failures of any SSH server.

/// One line's meaning, by the one tunnel-log vocabulary both programs read.
pub(crate) use launch_spec::rundir::vocab::{TunnelLine as Line, classify_tunnel_line as classify};

/// The `cause` recorded for a failed attempt, from what it printed (most specific first).
pub(crate) fn cause(seen: &Seen) -> &'static str {
    if seen.locked {
        "token_locked"
    } else if seen.not_authenticated {
        "not_authenticated"
    } else if seen.auth_failed {
        "auth_failed"
    } else if seen.host_key {
        "host_key"
    } else if seen.forward_failed {
        "forward_failed"
    } else if seen.connect_failed {
        "connect_failed"
    } else if let Some(c) = seen.imposed {
        c
    } else {
        "exited"
    }
}

/// What one ssh attempt has printed so far.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen {
    pub authenticated: bool,
    pub not_authenticated: bool,
    pub locked: bool,
    pub auth_failed: bool,
    pub connect_failed: bool,
    pub(crate) forward_failed: bool,
    pub(crate) host_key: bool,
    pub(crate) urls: Vec<String>,
    pub(crate) allocated_port: Option<u16>,
    /// A cause payload imposed (it killed the attempt), e.g. `connect_timeout`.
    pub(crate) imposed: Option<&'static str>,
    /// The last line that explains a failure (redacted), for the outcome message.
    pub(crate) last_problem: Option<String>,
}

impl Seen {
    pub(crate) fn note(&mut self, line: &str) {
        let kind = classify(line);
        let problem = !matches!(kind, Line::Authenticated | Line::Url(_) | Line::AllocatedPort(_) | Line::Other);
        match kind {
            Line::Authenticated => self.authenticated = true,
            Line::NotAuthenticated => self.not_authenticated = true,
            Line::Locked => self.locked = true,
            Line::Url(u) => self.urls.push(u),
            Line::AllocatedPort(p) => self.allocated_port = Some(p),
            Line::AuthFailed => self.auth_failed = true,
            Line::ConnectFailed => self.connect_failed = true,
            Line::ForwardFailed => self.forward_failed = true,
            Line::HostKey => self.host_key = true,
            Line::Other => {}
        }
        if problem {
            self.last_problem = Some(line.trim().to_string());
        }
    }

    /// The server answered in a way that shows the session is open.
    pub(crate) fn established(&self) -> bool {
        self.authenticated || !self.urls.is_empty() || self.allocated_port.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinggy_lines() {
        assert_eq!(classify("You are authenticated as someone@example.com"), Line::Authenticated);
        assert_eq!(classify("You are not authenticated."), Line::NotAuthenticated);
        assert_eq!(classify("Your tunnel will expire in 60 minutes."), Line::Other);
        assert_eq!(classify("   https://abc.a.pinggy.link"), Line::Url("https://abc.a.pinggy.link".into()));
        assert_eq!(classify("http://abc.a.pinggy.link"), Line::Url("http://abc.a.pinggy.link".into()));
        assert_eq!(classify("A tunnel with the same token is already active."), Line::Locked);
        assert_eq!(classify("Error: tunnel already active for this token"), Line::Locked);
        assert_eq!(classify("Another session with the same token is active"), Line::Locked);
    }

    #[test]
    fn openssh_lines() {
        assert_eq!(classify("Allocated port 41234 for remote forward to 127.0.0.1:23456"), Line::AllocatedPort(41234));
        assert_eq!(classify("root@127.0.0.1: Permission denied (publickey)."), Line::AuthFailed);
        assert_eq!(classify("ssh: connect to host 127.0.0.1 port 2222: Connection refused"), Line::ConnectFailed);
        assert_eq!(classify("Error: remote port forwarding failed for listen port 443"), Line::ForwardFailed);
        assert_eq!(classify("bind [127.0.0.1]:40000: Address already in use"), Line::ForwardFailed);
        assert_eq!(classify("Host key verification failed."), Line::HostKey);
        assert_eq!(
            classify("Warning: Permanently added '[127.0.0.1]:2222' (ED25519) to the list of known hosts."),
            Line::Other
        );
    }

    #[test]
    fn causes_most_specific_first() {
        let mut seen = Seen::default();
        assert_eq!(cause(&seen), "exited");
        seen.imposed = Some("connect_timeout");
        assert_eq!(cause(&seen), "connect_timeout");
        seen.note("ssh: connect to host x port 22: Connection refused");
        assert_eq!(cause(&seen), "connect_failed");
        seen.note("A tunnel with the same token is already active");
        assert_eq!(cause(&seen), "token_locked");
        assert!(!seen.established());
        seen.note("You are authenticated as u");
        assert!(seen.established());
        assert_eq!(seen.last_problem.as_deref(), Some("A tunnel with the same token is already active"));
    }
}
