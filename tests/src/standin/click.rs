//! A small emulation of click's option parser (as typer drives it) for the
//! Harbor stand-in: long options with `=value` or a separate value, short
//! options with attached values (`-n4`) and grouped flags (`-qy`), `--x/--no-x`
//! boolean pairs, repeatable options, and click's error texts rendered the way
//! typer's rich error panel prints them (exit status 2). Test support only.

use super::common::close_matches;
use std::collections::BTreeMap;

/// Value conversion, with click's error wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VType {
    Str,
    Int,
    Float,
}

/// How an option consumes argv.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OKind {
    /// `is_flag=True`.
    Flag,
    /// `--x/--no-x`: the primary names set true, the secondary ones false.
    Pair,
    /// One value; the last occurrence wins.
    Value(VType),
    /// One value per occurrence, collected (`list[...]` options).
    Multi(VType),
}

/// One option of a command.
#[derive(Debug, Clone, Copy)]
pub struct Opt {
    pub dest: &'static str,
    pub names: &'static [&'static str],
    /// For `Pair`: the `--no-x` names.
    pub secondary: &'static [&'static str],
    pub kind: OKind,
    pub required: bool,
}

/// A parsed value.
#[derive(Debug, Clone, PartialEq)]
pub enum CVal {
    Bool(bool),
    Str(String),
    List(Vec<String>),
}

/// Parsed options keyed by dest.
#[derive(Debug, Default, Clone)]
pub struct CParsed {
    pub values: BTreeMap<String, CVal>,
}

impl CParsed {
    pub fn str(&self, dest: &str) -> Option<String> {
        match self.values.get(dest) {
            Some(CVal::Str(s)) => Some(s.clone()),
            _ => None,
        }
    }
    pub fn list(&self, dest: &str) -> Option<Vec<String>> {
        match self.values.get(dest) {
            Some(CVal::List(v)) => Some(v.clone()),
            _ => None,
        }
    }
    pub fn flag(&self, dest: &str) -> Option<bool> {
        match self.values.get(dest) {
            Some(CVal::Bool(b)) => Some(*b),
            _ => None,
        }
    }
    pub fn int(&self, dest: &str) -> Option<i64> {
        self.str(dest).and_then(|s| s.trim().parse().ok())
    }
    pub fn float(&self, dest: &str) -> Option<f64> {
        self.str(dest).and_then(|s| s.trim().parse().ok())
    }
}

/// Outcome of a parse that did not produce options.
#[derive(Debug, Clone, PartialEq)]
pub enum ClickExit {
    /// A usage error: click's message (printed in typer's error panel, exit 2).
    Usage(String),
    /// `-h/--help` was given.
    Help,
}

fn opt_label(o: &Opt) -> String {
    o.names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(" / ")
}

fn convert(o: &Opt, t: VType, v: &str) -> Result<(), ClickExit> {
    let ok = match t {
        VType::Str => true,
        VType::Int => v.trim().parse::<i64>().is_ok(),
        VType::Float => v.trim().parse::<f64>().is_ok(),
    };
    if ok {
        return Ok(());
    }
    let what = if t == VType::Int { "integer" } else { "float" };
    Err(ClickExit::Usage(format!("Invalid value for {}: '{v}' is not a valid {what}.", opt_label(o))))
}

/// Parse `args` (after the command path) against `opts`.
pub fn parse(args: &[String], opts: &[Opt]) -> Result<CParsed, ClickExit> {
    let mut by_name: BTreeMap<&str, (usize, bool)> = BTreeMap::new();
    for (i, o) in opts.iter().enumerate() {
        for n in o.names {
            by_name.insert(n, (i, true));
        }
        for n in o.secondary {
            by_name.insert(n, (i, false));
        }
    }
    if args.iter().any(|a| a == "-h" || a == "--help") {
        return Err(ClickExit::Help);
    }
    // click offers close matches for long options only (`_match_long_opt`).
    let long_names: Vec<String> = by_name.keys().filter(|s| s.starts_with("--")).map(|s| s.to_string()).collect();
    let no_such = |name: &str| {
        let poss = if name.starts_with("--") { close_matches(name, &long_names) } else { Vec::new() };
        let msg = format!("No such option: {name}");
        match poss.len() {
            0 => ClickExit::Usage(msg),
            1 => ClickExit::Usage(format!("{msg} Did you mean {}?", poss[0])),
            _ => {
                let mut p = poss.clone();
                p.sort();
                ClickExit::Usage(format!("{msg} (Possible options: {})", p.join(", ")))
            }
        }
    };
    let mut out = CParsed::default();
    let mut extras: Vec<String> = Vec::new();
    let mut i = 0;
    let mut only_positional = false;
    // Apply one option occurrence; `value` is the attached value if any.
    let apply = |idx: usize,
                 primary: bool,
                 name: &str,
                 attached: Option<String>,
                 i: &mut usize,
                 out: &mut CParsed|
     -> Result<(), ClickExit> {
        let o = &opts[idx];
        match o.kind {
            OKind::Flag | OKind::Pair => {
                if attached.is_some() {
                    return Err(ClickExit::Usage(format!("Option '{name}' does not take a value.")));
                }
                out.values.insert(o.dest.to_string(), CVal::Bool(primary));
            }
            OKind::Value(t) | OKind::Multi(t) => {
                let v = match attached {
                    Some(v) => v,
                    None => {
                        if *i < args.len() {
                            *i += 1;
                            args[*i - 1].clone()
                        } else {
                            return Err(ClickExit::Usage(format!("Option '{name}' requires an argument.")));
                        }
                    }
                };
                convert(o, t, &v)?;
                if matches!(o.kind, OKind::Multi(_)) {
                    match out.values.entry(o.dest.to_string()).or_insert_with(|| CVal::List(Vec::new())) {
                        CVal::List(l) => l.push(v),
                        other => *other = CVal::List(vec![v]),
                    }
                } else {
                    out.values.insert(o.dest.to_string(), CVal::Str(v));
                }
            }
        }
        Ok(())
    };
    while i < args.len() {
        let tok = args[i].clone();
        i += 1;
        if only_positional {
            extras.push(tok);
            continue;
        }
        if tok == "--" {
            only_positional = true;
            continue;
        }
        if tok.starts_with("--") && tok.len() > 2 {
            let (name, attached) = match tok.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (tok.clone(), None),
            };
            let Some(&(idx, primary)) = by_name.get(name.as_str()) else {
                return Err(no_such(&name));
            };
            apply(idx, primary, &name, attached, &mut i, &mut out)?;
        } else if tok.starts_with('-') && tok.len() > 1 {
            // Short options: `-n4`, `-n 4`, grouped flags `-qy`.
            let chars: Vec<char> = tok[1..].chars().collect();
            let mut k = 0;
            while k < chars.len() {
                let name = format!("-{}", chars[k]);
                let Some(&(idx, primary)) = by_name.get(name.as_str()) else {
                    return Err(no_such(&name));
                };
                k += 1;
                if matches!(opts[idx].kind, OKind::Value(_) | OKind::Multi(_)) {
                    let rest: String = chars[k..].iter().collect();
                    let attached = if rest.is_empty() { None } else { Some(rest) };
                    apply(idx, primary, &name, attached, &mut i, &mut out)?;
                    break;
                }
                apply(idx, primary, &name, None, &mut i, &mut out)?;
            }
        } else {
            extras.push(tok);
        }
    }
    if !extras.is_empty() {
        let quoted: Vec<String> =
            extras.iter().map(|e| if e.contains(' ') { format!("'{e}'") } else { e.clone() }).collect();
        let word = if extras.len() == 1 { "argument" } else { "arguments" };
        return Err(ClickExit::Usage(format!("Got unexpected extra {word} ({})", quoted.join(" "))));
    }
    for o in opts {
        if o.required && !out.values.contains_key(o.dest) {
            return Err(ClickExit::Usage(format!("Missing option {}.", opt_label(o))));
        }
    }
    Ok(out)
}

#[cfg(test)] // used only by the tests
/// typer's rich rendering of a usage error (to stderr), 80 columns wide, for a
/// command (`Usage: <path> [OPTIONS]`).
pub(crate) fn render_usage_error(command_path: &str, message: &str) -> String {
    render_usage_error_with(&format!("{command_path} [OPTIONS]"), command_path, message)
}

/// The same for any usage line (`<path> [OPTIONS] COMMAND [ARGS]...` for groups).
pub fn render_usage_error_with(usage: &str, command_path: &str, message: &str) -> String {
    let width = 80usize;
    let inner = width - 4;
    let mut s = String::new();
    s.push_str(&format!("Usage: {usage}\n"));
    s.push_str(&format!("Try '{command_path} -h' for help.\n"));
    let title = " Error ";
    s.push_str(&format!("╭─{title}{}╮\n", "─".repeat(width - 3 - title.chars().count())));
    for para in message.split('\n') {
        let mut line = String::new();
        for word in para.split(' ') {
            if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > inner {
                s.push_str(&format!("│ {line:<inner$} │\n"));
                line.clear();
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        s.push_str(&format!("│ {line:<inner$} │\n"));
    }
    s.push_str(&format!("╰{}╯\n", "─".repeat(width - 2)));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPTS: &[Opt] = &[
        Opt {
            dest: "job_name",
            names: &["--job-name"],
            secondary: &[],
            kind: OKind::Value(VType::Str),
            required: false,
        },
        Opt {
            dest: "n",
            names: &["-n", "--n-concurrent"],
            secondary: &[],
            kind: OKind::Value(VType::Int),
            required: false,
        },
        Opt {
            dest: "ak",
            names: &["--ak", "--agent-kwarg"],
            secondary: &[],
            kind: OKind::Multi(VType::Str),
            required: false,
        },
        Opt {
            dest: "fb",
            names: &["--force-build"],
            secondary: &["--no-force-build"],
            kind: OKind::Pair,
            required: false,
        },
        Opt { dest: "q", names: &["-q", "--quiet"], secondary: &[], kind: OKind::Flag, required: false },
        Opt { dest: "y", names: &["-y", "--yes"], secondary: &[], kind: OKind::Flag, required: false },
    ];

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn parses_like_click() {
        let p =
            parse(&s(&["--job-name=x", "-n4", "--ak", "a=1", "--agent-kwarg", "b=2", "--no-force-build", "-qy"]), OPTS)
                .unwrap();
        assert_eq!(p.str("job_name").as_deref(), Some("x"));
        assert_eq!(p.int("n"), Some(4));
        assert_eq!(p.list("ak").unwrap(), vec!["a=1", "b=2"]);
        assert_eq!(p.flag("fb"), Some(false));
        assert_eq!(p.flag("q"), Some(true));
        assert_eq!(p.flag("y"), Some(true));
    }

    #[test]
    fn errors_like_click() {
        assert_eq!(parse(&s(&["--foo"]), OPTS).unwrap_err(), ClickExit::Usage("No such option: --foo".into()));
        assert_eq!(
            parse(&s(&["--job-nam", "x"]), OPTS).unwrap_err(),
            ClickExit::Usage("No such option: --job-nam Did you mean --job-name?".into())
        );
        assert_eq!(
            parse(&s(&["-n", "x"]), OPTS).unwrap_err(),
            ClickExit::Usage("Invalid value for '-n' / '--n-concurrent': 'x' is not a valid integer.".into())
        );
        assert_eq!(
            parse(&s(&["--job-name"]), OPTS).unwrap_err(),
            ClickExit::Usage("Option '--job-name' requires an argument.".into())
        );
        assert_eq!(
            parse(&s(&["extra"]), OPTS).unwrap_err(),
            ClickExit::Usage("Got unexpected extra argument (extra)".into())
        );
        assert!(render_usage_error("harbor jobs start", "No such option: --foo").contains("│ No such option: --foo"));
    }
}
