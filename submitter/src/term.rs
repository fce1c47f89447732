//! Human output that scales (issue 36): tables that fit the terminal and degrade to plain columns in
//! a pipe, colour only on a terminal (never in files, `NO_COLOR` honoured), and problems shared by
//! many pairs printed once with a count and the pairs they hit. A leaf module: rendering only; what
//! a table says is decided by its caller.
//!
//! Where the output goes is detected once ([`Terminal::stdout`]) and handed to the renderers, so a
//! test renders the terminal layout at a chosen width without a terminal
//! (`SUBMITTER_WIDTH=120`, or [`Terminal::fixed`]).

use comfy_table::{ColumnConstraint, ContentArrangement, Table, Width};

use crate::text::printable;

/// The environment variable that forces the terminal layout at a width (tests, scripts that want
/// a fitted table in a file); colour stays off.
pub const WIDTH_VARIABLE: &str = "SUBMITTER_WIDTH";

/// Where human output goes: a terminal of some width (tables fitted to it, colour when wanted) or
/// a pipe/file (plain columns, as wide as their content, no colour).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terminal {
    width: Option<u16>,
    color: bool,
}

impl Terminal {
    /// A pipe or a file: plain columns, no colour.
    pub const fn pipe() -> Self {
        Terminal { width: None, color: false }
    }

    /// A terminal `width` columns wide, without colour (tests, `SUBMITTER_WIDTH`).
    pub const fn fixed(width: u16) -> Self {
        Terminal { width: Some(width), color: false }
    }

    /// Where stdout goes: `SUBMITTER_WIDTH` if set; else a terminal (its width from `COLUMNS`, else
    /// the terminal's own, colour unless `NO_COLOR` or `CLICOLOR=0`); else a pipe.
    pub fn stdout() -> Self {
        let wanted = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<u16>().ok());
        if let Some(width) = wanted(WIDTH_VARIABLE) {
            return Terminal::fixed(width.max(20));
        }
        let term = console::Term::stdout();
        if !term.is_term() {
            return Terminal::pipe();
        }
        let width = wanted("COLUMNS").or_else(|| term.size_checked().map(|(_, w)| w)).unwrap_or(100);
        Terminal { width: Some(width.max(20)), color: console::colors_enabled() }
    }

    pub fn is_terminal(&self) -> bool {
        self.width.is_some()
    }

    pub fn width(&self) -> Option<u16> {
        self.width
    }

    /// A table with `header`: on a terminal fitted to its width (long cells wrap, the header
    /// underlined); in a pipe plain columns two spaces apart, never wrapped.
    pub fn table<I: IntoIterator<Item = S>, S: Into<String>>(&self, header: I) -> Rows {
        let mut table = Table::new();
        table.load_preset(comfy_table::presets::NOTHING);
        // Headers are made inert like cells: a column may be named after an outside benchmark name.
        table.set_header(header.into_iter().map(|h| printable(&h.into()).into_owned()).collect::<Vec<String>>());
        match self.width {
            Some(width) => {
                table.set_style(comfy_table::TableComponent::HeaderLines, '─');
                table.set_content_arrangement(ContentArrangement::DynamicFullWidth);
                table.set_width(width);
            }
            None => {
                table.set_content_arrangement(ContentArrangement::Disabled);
            }
        }
        Rows { table, right: Vec::new(), fitted: self.width.is_some() }
    }

    /// `text` (lines outside a table: notes, problems) fitted to a terminal's width: a longer line
    /// is broken at spaces, its continuations indented; in a pipe it is left as it is. Written here
    /// rather than with a wrapping crate: greedy breaking at spaces is all these lines need.
    pub fn fit(&self, text: &str) -> String {
        let Some(width) = self.width.map(usize::from) else { return text.to_string() };
        const INDENT: &str = "          ";
        let mut out = String::with_capacity(text.len());
        for line in text.split_inclusive('\n') {
            let (body, end) = line.strip_suffix('\n').map_or((line, ""), |b| (b, "\n"));
            let mut used = 0;
            for (index, word) in body.split(' ').enumerate() {
                let length = word.chars().count();
                if index > 0 && used + 1 + length > width && used > INDENT.len() {
                    out.push('\n');
                    out.push_str(INDENT);
                    used = INDENT.len();
                } else if index > 0 {
                    out.push(' ');
                    used += 1;
                }
                out.push_str(word);
                used += length;
            }
            out.push_str(end);
        }
        out
    }

    /// `text` in `style` on a colour terminal, else as it is.
    pub fn paint(&self, text: &str, style: Style) -> String {
        if !self.color {
            return text.to_string();
        }
        let styled = console::style(text).force_styling(true);
        match style {
            Style::Problem => styled.red().bold().to_string(),
            Style::Warning => styled.yellow().to_string(),
            Style::Good => styled.green().to_string(),
            Style::Dim => styled.dim().to_string(),
        }
    }
}

/// What a painted word means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Problem,
    Warning,
    Good,
    Dim,
}

/// A table being filled ([`Terminal::table`]).
pub struct Rows {
    table: Table,
    right: Vec<usize>,
    fitted: bool,
}

impl Rows {
    /// One row; every cell made inert ([`printable`]): names come from outside.
    pub fn row<I: IntoIterator<Item = S>, S: AsRef<str>>(&mut self, cells: I) -> &mut Self {
        self.table.add_row(cells.into_iter().map(|c| printable(c.as_ref()).into_owned()).collect::<Vec<String>>());
        self
    }

    /// Right-aligns column `index` (numbers).
    pub fn right(&mut self, index: usize) -> &mut Self {
        self.right.push(index);
        self
    }

    /// Keeps column `index` whole on a terminal (short labels, numbers): the wrapping goes to the
    /// long text columns.
    pub fn keep(&mut self, index: usize) -> &mut Self {
        if self.fitted
            && let Some(column) = self.table.column_mut(index)
        {
            column.set_constraint(ColumnConstraint::ContentWidth);
        }
        self
    }

    /// Caps column `index` at `width` characters on a terminal (it wraps past it).
    pub fn cap(&mut self, index: usize, width: u16) -> &mut Self {
        if self.fitted
            && let Some(column) = self.table.column_mut(index)
        {
            column.set_constraint(ColumnConstraint::UpperBoundary(Width::Fixed(width)));
        }
        self
    }

    /// The table's lines, each ending in a newline, trailing spaces trimmed.
    pub fn render(&mut self) -> String {
        let columns = self.table.column_count();
        for index in 0..columns {
            if let Some(column) = self.table.column_mut(index) {
                // Two spaces between columns and none before the first: the plain layout scripts
                // split on whitespace.
                column.set_padding((0, if index + 1 == columns { 0 } else { 2 }));
                if self.right.contains(&index) {
                    column.set_cell_alignment(comfy_table::CellAlignment::Right);
                }
            }
        }
        let mut out = self.table.trim_fmt();
        out.push('\n');
        out
    }
}

/// One problem and the pairs it hit, in the order first seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub text: String,
    pub pairs: Vec<String>,
}

/// Problems grouped by their text: a preflight failure shared by 200 pairs is one [`Problem`]
/// with 200 pairs, not 200 lines. Order: first seen.
pub fn group_problems<I: IntoIterator<Item = (String, String)>>(items: I) -> Vec<Problem> {
    let mut groups: Vec<Problem> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for (pair, text) in items {
        match index.get(&text) {
            Some(&at) => {
                let group: &mut Problem = &mut groups[at];
                group.pairs.push(pair);
            }
            None => {
                index.insert(text.clone(), groups.len());
                groups.push(Problem { text, pairs: vec![pair] });
            }
        }
    }
    groups
}

/// How many pairs a grouped problem names before "and N more".
pub const PAIRS_SHOWN: usize = 5;

/// The grouped problems as text, under `label` (`refused`, `flagged`…): one line per problem, and
/// when several pairs share it, the count and the first [`PAIRS_SHOWN`] pairs on the next line
/// (`--json` lists them all).
pub fn problem_lines(terminal: &Terminal, label: &str, problems: &[Problem], style: Style) -> String {
    let mut out = String::new();
    for problem in problems {
        let head = terminal.paint(&format!("{label:<9}"), style);
        match problem.pairs.as_slice() {
            [one] => out += &format!("{head} {}: {}\n", printable(one), printable(&problem.text)),
            pairs => {
                out += &format!("{head} {} pairs: {}\n", pairs.len(), printable(&problem.text));
                let shown: Vec<String> = pairs.iter().take(PAIRS_SHOWN).map(|p| printable(p).into_owned()).collect();
                let more = pairs.len().saturating_sub(PAIRS_SHOWN);
                let more = if more > 0 { format!(" and {more} more") } else { String::new() };
                out += &format!("          {}{more}\n", shown.join(", "));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(terminal: Terminal) -> String {
        let mut rows = terminal.table(["action", "model", "why"]);
        rows.row(["submit", "org/a-very-long-model-name-that-goes-on-and-on-7B", "no previous attempt"]);
        rows.row(["skip", "org/B-1B", "finished; evidence: own ledger attempt 12 with a long explanation"]);
        rows.keep(0).render()
    }

    #[test]
    fn a_pipe_gets_plain_columns_never_wrapped() {
        let text = sample(Terminal::pipe());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[1].starts_with("submit  org/a-very-long-model-name-that-goes-on-and-on-7B  no previous attempt"));
        assert!(lines[2].starts_with("skip    org/B-1B"), "{text}");
        assert!(text.lines().all(|l| l == l.trim_end()), "no trailing spaces: {text:?}");
        assert!(!text.contains('\u{1b}'), "no colour in a pipe");
    }

    #[test]
    fn a_terminal_gets_a_table_that_fits_its_width() {
        let text = sample(Terminal::fixed(60));
        assert!(text.lines().all(|l| l.chars().count() <= 60), "{text}");
        assert!(text.lines().nth(1).is_some_and(|l| l.contains('─')), "header underlined: {text}");
        assert!(text.contains("submit") && text.contains("skip"), "{text}");
        assert!(text.lines().count() > 4, "long cells wrap: {text}");
    }

    #[test]
    fn lines_outside_tables_fit_the_terminal() {
        let note = "ranked on tb2; dev_set_v2 is partial-credit: mean only, never ranked\nshort\n";
        assert_eq!(Terminal::pipe().fit(note), note);
        let fitted = Terminal::fixed(30).fit(note);
        assert!(fitted.lines().all(|l| l.chars().count() <= 30), "{fitted}");
        assert_eq!(fitted.split_whitespace().collect::<Vec<_>>(), note.split_whitespace().collect::<Vec<_>>());
        assert!(fitted.ends_with("\nshort\n") && fitted.lines().nth(1).unwrap().starts_with("          "), "{fitted}");
    }

    #[test]
    fn names_from_outside_cannot_forge_rows() {
        let mut rows = Terminal::pipe().table(["model"]);
        rows.row(["evil\nsubmit  fake"]);
        assert_eq!(rows.render().lines().count(), 2);
    }

    #[test]
    fn colour_only_when_wanted() {
        assert_eq!(Terminal::pipe().paint("refused", Style::Problem), "refused");
        assert_eq!(Terminal::fixed(80).paint("refused", Style::Problem), "refused");
        let coloured = Terminal { width: Some(80), color: true }.paint("refused", Style::Problem);
        assert!(coloured.contains('\u{1b}') && coloured.contains("refused"), "{coloured:?}");
    }

    #[test]
    fn shared_problems_are_grouped_with_a_count_and_their_pairs() {
        let items = (0..200)
            .map(|i| (format!("org/M{i}-7B tb2"), "preflight: dataset missing".to_string()))
            .chain([("org/X-1B tb2".to_string(), "held by operator".to_string())]);
        let groups = group_problems(items);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].pairs.len(), 200);
        let text = problem_lines(&Terminal::pipe(), "refused", &groups, Style::Problem);
        assert_eq!(
            text,
            "refused   200 pairs: preflight: dataset missing\n          org/M0-7B tb2, org/M1-7B tb2, org/M2-7B tb2, org/M3-7B tb2, org/M4-7B tb2 and 195 more\nrefused   org/X-1B tb2: held by operator\n"
        );
    }
}
