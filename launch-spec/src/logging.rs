//! The log filter both programs read, one rule (docs/submitter.md "Logging"): the program's own
//! variable (`SUBMITTER_LOG`, `PAYLOAD_LOG`) wins, else the ecosystem's `RUST_LOG`, else the
//! program's default. The own variable wins so that a `RUST_LOG` exported for some other tool in the
//! login shell (which a Slurm job inherits) cannot override a deliberate choice for this one.

/// The filter directives to use: `own`'s value, else `RUST_LOG`'s, else `default` (empty values
/// count as unset).
pub fn filter_directives(own: &str, default: &str) -> String {
    filter_from(own, default, |name| std::env::var(name).ok())
}

fn filter_from(own: &str, default: &str, var: impl Fn(&str) -> Option<String>) -> String {
    [own, "RUST_LOG"]
        .into_iter()
        .find_map(|name| var(name).filter(|value| !value.trim().is_empty()))
        .unwrap_or_else(|| default.to_string())
}

/// Whether the log on stderr may be coloured: only on a terminal, never into a file (a job's Slurm
/// output, a redirect), and never with `NO_COLOR` set (<https://no-color.org>; empty counts as
/// unset).
pub fn stderr_colour() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    #[test]
    fn own_variable_wins_then_rust_log_then_the_default() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        assert_eq!(super::filter_from("PAYLOAD_LOG", "info", env(&[])), "info");
        assert_eq!(super::filter_from("PAYLOAD_LOG", "info", env(&[("RUST_LOG", "debug")])), "debug");
        let both = env(&[("RUST_LOG", "debug"), ("PAYLOAD_LOG", "warn")]);
        assert_eq!(super::filter_from("PAYLOAD_LOG", "info", both), "warn");
        assert_eq!(
            super::filter_from("PAYLOAD_LOG", "info", env(&[("PAYLOAD_LOG", " "), ("RUST_LOG", "trace")])),
            "trace"
        );
    }
}
