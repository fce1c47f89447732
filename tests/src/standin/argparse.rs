//! A small emulation of Python's argparse as vLLM's `FlexibleArgumentParser`
//! uses it for `vllm serve`: long options with `=value` or a separate value,
//! underscores accepted for dashes, unique-prefix abbreviations, `--no-x` for
//! BooleanOptionalAction, one optional positional (`model_tag`), and argparse's
//! error messages (`usage: …` then `<prog>: error: …`, exit status 2).
//! Test support only.

use super::vllm_flags::Kind;
use std::collections::BTreeMap;

/// One parsed option occurrence.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    /// A flag: true, or false for `--no-x`.
    Bool(bool),
    /// One value (or none for a bare `nargs="?"` option).
    One(Option<String>),
    /// `nargs="+"` values.
    Many(Vec<String>),
}

/// The result of parsing: option dest (`max_model_len`) → last occurrence,
/// the positional model tag, and the option strings in the order seen.
#[derive(Debug, Default)]
pub struct Parsed {
    pub values: BTreeMap<String, Val>,
    pub model_tag: Option<String>,
    pub seen: Vec<String>,
}

impl Parsed {
    /// A single-valued option's value.
    pub fn one(&self, dest: &str) -> Option<String> {
        match self.values.get(dest) {
            Some(Val::One(v)) => v.clone(),
            Some(Val::Many(v)) => v.last().cloned(),
            _ => None,
        }
    }

    /// A boolean option's value.
    pub fn flag(&self, dest: &str) -> Option<bool> {
        match self.values.get(dest) {
            Some(Val::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    /// A `nargs="+"` option's values.
    pub fn many(&self, dest: &str) -> Option<Vec<String>> {
        match self.values.get(dest) {
            Some(Val::Many(v)) => Some(v.clone()),
            Some(Val::One(Some(v))) => Some(vec![v.clone()]),
            _ => None,
        }
    }
}

/// An argparse failure: the message after `error: `.
#[derive(Debug, Clone, PartialEq)]
pub struct ArgError(pub String);

fn dest_of(names: &[&str]) -> String {
    let long = names.iter().find(|n| n.starts_with("--")).unwrap_or(&names[0]);
    long.trim_start_matches('-').replace('-', "_")
}

fn looks_negative_number(s: &str) -> bool {
    s.starts_with('-') && s[1..].parse::<f64>().is_ok()
}

fn is_option_like(s: &str) -> bool {
    s.starts_with('-') && s.len() > 1 && !looks_negative_number(s)
}

/// Rewrite underscores to dashes in the option name part (before `=` and
/// before the first `.`), as FlexibleArgumentParser does.
fn normalise(arg: &str) -> String {
    if !arg.starts_with("--") {
        return arg.to_string();
    }
    let (key, value) = match arg.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (arg, None),
    };
    let body = &key[2..];
    let (name, rest) = match body.split_once('.') {
        Some((n, r)) => (n.replace('_', "-"), format!(".{r}")),
        None => (body.replace('_', "-"), String::new()),
    };
    match value {
        Some(v) => format!("--{name}{rest}={v}"),
        None => format!("--{name}{rest}"),
    }
}

/// What one accepted option string does: the dest it sets, how it consumes argv, and whether it
/// sets a boolean to false.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionString {
    pub dest: String,
    pub kind: Kind,
    pub(crate) negated: bool,
}

/// Every option string `table` accepts, as vLLM registers them: each name as written, and for a
/// `BoolOpt` long name `--x` also `--no-x` (argparse's BooleanOptionalAction) and, for
/// `--enable-x`/`--disable-x`, the counterpart `--disable-x`/`--enable-x` (vLLM's
/// EnableDisableAction in `vllm/utils/argparse_utils.py`).
pub fn option_strings(table: &[(&[&str], Kind)]) -> BTreeMap<String, OptionString> {
    registered(table).into_iter().collect()
}

/// [`option_strings`] in argparse's registration order (the order it lists ambiguous matches in):
/// per entry, each name followed by its `--no-` form, then the counterparts.
fn registered(table: &[(&[&str], Kind)]) -> Vec<(String, OptionString)> {
    let mut out = Vec::new();
    for (names, kind) in table {
        let dest = dest_of(names);
        let entry = |name: String, negated: bool| (name, OptionString { dest: dest.clone(), kind: *kind, negated });
        let mut counterparts = Vec::new();
        for n in names.iter() {
            out.push(entry((*n).to_string(), false));
            let Some(long) = n.strip_prefix("--").filter(|_| *kind == Kind::BoolOpt) else { continue };
            out.push(entry(format!("--no-{long}"), true));
            if let Some(rest) = long.strip_prefix("enable-") {
                counterparts.push(entry(format!("--disable-{rest}"), true));
            } else if let Some(rest) = long.strip_prefix("disable-") {
                counterparts.push(entry(format!("--enable-{rest}"), true));
            }
        }
        out.extend(counterparts);
    }
    out
}

/// Parse `args` (everything after the subcommand) against `table`.
pub fn parse(args: &[String], table: &[(&[&str], Kind)]) -> Result<Parsed, ArgError> {
    let order: Vec<String> = registered(table).into_iter().map(|(name, _)| name).collect();
    let lookup: BTreeMap<String, (String, Kind, bool)> =
        option_strings(table).into_iter().map(|(name, o)| (name, (o.dest, o.kind, o.negated))).collect();
    let mut out = Parsed::default();
    let mut extras: Vec<String> = Vec::new();
    let args: Vec<String> = args.iter().map(|a| normalise(a)).collect();
    let mut i = 0;
    let mut only_positional = false;
    while i < args.len() {
        let tok = &args[i];
        if !only_positional && tok == "--" {
            only_positional = true;
            i += 1;
            continue;
        }
        if only_positional || !is_option_like(tok) {
            if out.model_tag.is_none() {
                out.model_tag = Some(tok.clone());
            } else {
                extras.push(tok.clone());
            }
            i += 1;
            continue;
        }
        let (name, attached) = match tok.split_once('=') {
            Some((n, v)) if tok.starts_with("--") || lookup.contains_key(n) => (n.to_string(), Some(v.to_string())),
            _ => (tok.clone(), None),
        };
        let entry = match lookup.get(&name) {
            Some(e) => Some((name.clone(), e.clone())),
            None if name.starts_with("--") => {
                let cands: Vec<&String> =
                    order.iter().filter(|k| k.starts_with("--") && k.starts_with(name.as_str())).collect();
                match cands.len() {
                    0 => None,
                    1 => Some((cands[0].clone(), lookup[cands[0]].clone())),
                    _ => {
                        let list: Vec<&str> = cands.iter().map(|s| s.as_str()).collect();
                        return Err(ArgError(format!("ambiguous option: {name} could match {}", list.join(", "))));
                    }
                }
            }
            None => None,
        };
        let Some((opt, (dest, kind, negated))) = entry else {
            extras.push(tok.clone());
            i += 1;
            continue;
        };
        out.seen.push(opt.clone());
        i += 1;
        match kind {
            Kind::Flag | Kind::BoolOpt => {
                if attached.is_some() {
                    return Err(ArgError(format!(
                        "argument {}: ignored explicit argument '{}'",
                        display_names(table, &dest),
                        attached.unwrap_or_default()
                    )));
                }
                out.values.insert(dest, Val::Bool(!negated));
            }
            Kind::Value => {
                let v = match attached {
                    Some(v) => v,
                    None => {
                        if i < args.len() && !is_option_like(&args[i]) {
                            i += 1;
                            args[i - 1].clone()
                        } else {
                            return Err(ArgError(format!(
                                "argument {}: expected one argument",
                                display_names(table, &dest)
                            )));
                        }
                    }
                };
                out.values.insert(dest, Val::One(Some(v)));
            }
            Kind::OptValue => {
                let v = match attached {
                    Some(v) => Some(v),
                    None if i < args.len() && !is_option_like(&args[i]) => {
                        i += 1;
                        Some(args[i - 1].clone())
                    }
                    None => None,
                };
                out.values.insert(dest, Val::One(v));
            }
            Kind::Multi => {
                let mut vals = Vec::new();
                if let Some(v) = attached {
                    vals.push(v);
                } else {
                    while i < args.len() && !is_option_like(&args[i]) {
                        vals.push(args[i].clone());
                        i += 1;
                    }
                }
                if vals.is_empty() {
                    return Err(ArgError(format!(
                        "argument {}: expected at least one argument",
                        display_names(table, &dest)
                    )));
                }
                out.values.insert(dest, Val::Many(vals));
            }
        }
    }
    if !extras.is_empty() {
        return Err(ArgError(format!("unrecognized arguments: {}", extras.join(" "))));
    }
    Ok(out)
}

/// argparse's rendering of an option in messages: `--port`, `--tensor-parallel-size/-tp`, a boolean
/// as its visible strings (`--trust-remote-code/--no-trust-remote-code`,
/// `--enable-prefix-caching/--disable-prefix-caching`: vLLM hides `--no-enable-x`).
pub fn display_names(table: &[(&[&str], Kind)], dest: &str) -> String {
    for (names, kind) in table {
        if dest_of(names) != dest {
            continue;
        }
        if *kind != Kind::BoolOpt {
            return names.join("/");
        }
        let strings: Vec<String> = registered(&[(*names, *kind)]).into_iter().map(|(name, _)| name).collect();
        let counterparts = names.iter().any(|n| n.starts_with("--enable-") || n.starts_with("--disable-"));
        let visible: Vec<&String> = strings
            .iter()
            .filter(|s| {
                !counterparts || !names.iter().any(|n| n.strip_prefix("--").is_some_and(|l| **s == format!("--no-{l}")))
            })
            .collect();
        return visible.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("/");
    }
    format!("--{}", dest.replace('_', "-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &[(&[&str], Kind)] = &[
        (&["--port"], Kind::Value),
        (&["--served-model-name"], Kind::Multi),
        (&["--trust-remote-code"], Kind::BoolOpt),
        (&["--max-num-seqs"], Kind::Value),
        (&["--max-num-batched-tokens"], Kind::Value),
        (&["--tensor-parallel-size", "-tp"], Kind::Value),
    ];

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn parses_like_argparse() {
        let p =
            parse(&s(&["m", "--port=8001", "--served_model_name", "a", "b", "-tp", "2", "--no-trust-remote-code"]), T)
                .unwrap();
        assert_eq!(p.model_tag.as_deref(), Some("m"));
        assert_eq!(p.one("port").as_deref(), Some("8001"));
        assert_eq!(p.many("served_model_name").unwrap(), vec!["a", "b"]);
        assert_eq!(p.one("tensor_parallel_size").as_deref(), Some("2"));
        assert_eq!(p.flag("trust_remote_code"), Some(false));
    }

    #[test]
    fn enable_and_disable_are_counterparts() {
        const B: &[(&[&str], Kind)] = &[
            (&["--enable-prefix-caching"], Kind::BoolOpt),
            (&["--disable-sliding-window"], Kind::BoolOpt),
            (&["--enable-expert-parallel", "-ep"], Kind::BoolOpt),
        ];
        let p = parse(&s(&["m", "--disable-prefix-caching", "--enable-sliding-window", "-ep"]), B).unwrap();
        assert_eq!(p.flag("enable_prefix_caching"), Some(false));
        assert_eq!(p.flag("disable_sliding_window"), Some(false));
        assert_eq!(p.flag("enable_expert_parallel"), Some(true));
        let p = parse(&s(&["m", "--no-enable-prefix-caching", "--no-disable-sliding-window"]), B).unwrap();
        assert_eq!(p.flag("enable_prefix_caching"), Some(false));
        assert_eq!(p.flag("disable_sliding_window"), Some(false));
        assert!(parse(&s(&["m", "--no-disable-prefix-caching"]), B).is_err());
        assert!(!option_strings(B).contains_key("--no-ep"));
    }

    #[test]
    fn errors_like_argparse() {
        assert_eq!(parse(&s(&["m", "--foo", "1"]), T).unwrap_err().0, "unrecognized arguments: --foo 1");
        assert!(
            parse(&s(&["m", "--max-num", "3"]), T)
                .unwrap_err()
                .0
                .starts_with("ambiguous option: --max-num could match")
        );
        assert_eq!(parse(&s(&["m", "--port"]), T).unwrap_err().0, "argument --port: expected one argument");
        assert_eq!(parse(&s(&["m", "--max-num-s", "3"]), T).unwrap().one("max_num_seqs").as_deref(), Some("3"));
    }
}
