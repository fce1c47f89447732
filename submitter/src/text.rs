//! Text from outside (the team's database, run dirs) made inert for a text output (issue 32 item
//! 14). A leaf module: every layer that prints may use it.

use std::borrow::Cow;

/// Whether `c` would act on a terminal or on the lines of the output rather than print: a control
/// character (C0, DEL, C1: escape sequences, newlines, carriage returns) or a bidirectional
/// override that reorders what follows.
fn is_unprintable(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// `text` (a name from outside: the team's database, a run dir) as one inert field of a text
/// output: every control character and bidirectional override escaped (`\n`, `\u{1b}`), so a
/// name can neither forge an output line nor drive the terminal (issue 32 item 14).
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unprintable) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_unprintable(c) { out.extend(c.escape_debug()) } else { out.push(c) }
    }
    Cow::Owned(out)
}

/// A whole text output as printed: lines stay lines, and every other control character or
/// bidirectional override in it is escaped — the net under [`printable`] for every text output.
pub(crate) fn printable_lines(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| is_unprintable(c) && c != '\n' && c != '\t') {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.split('\n')
            .map(|line| line.split('\t').map(printable).collect::<Vec<_>>().join("\t"))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}
