//! Every exit code payload can end with, in one table (docs/exit-codes.md, "payload exit codes",
//! is held to it both ways by the test below): one code per outcome class
//! (`OutcomeClass::exit_code`), plus the codes that have no outcome class because nothing of the
//! run dir is written.

#[cfg(test)] // used only by the tests
use launch_spec::OutcomeClass;

/// A command's own failure that is no outcome of a run: `payload rank` could not exec its vLLM,
/// `payload plan`/`gpus` could not write their answer. One line on stderr says why.
pub const EXIT_COMMAND_FAILED: i32 = 1;

/// Another payload holds the run dir (crate::runlock): nothing of the run dir is written.
pub(crate) const EXIT_RUN_DIR_BUSY: i32 = 5;

#[cfg(test)] // used only by the tests
/// The codes with no outcome class, and what each means (the doc's class column reads `—`).
pub(crate) const WITHOUT_CLASS: [(i32, &str); 2] =
    [(EXIT_COMMAND_FAILED, "command_failed"), (EXIT_RUN_DIR_BUSY, "run_dir_busy")];

#[cfg(test)] // used only by the tests
/// Every fixed code payload exits with (`interrupted` is 128 + the signal instead of its 130).
pub(crate) fn all_codes() -> Vec<i32> {
    let mut codes: Vec<i32> = OutcomeClass::ALL
        .iter()
        .filter(|c| **c != OutcomeClass::Interrupted)
        .map(|c| c.exit_code())
        .chain(WITHOUT_CLASS.iter().map(|(code, _)| *code))
        .collect();
    codes.sort_unstable();
    codes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The payload table's rows: `| <code> | <class> |` up to the submitter section.
    fn documented() -> Vec<(String, String)> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/exit-codes.md");
        let doc = std::fs::read_to_string(path).expect("docs/exit-codes.md");
        let payload = doc.split("# submitter exit codes").next().unwrap_or_default();
        payload
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (cells.len() > 3 && cells[1].chars().next().is_some_and(|c| c.is_ascii_digit()))
                    .then(|| (cells[1].to_string(), cells[2].to_string()))
            })
            .collect()
    }

    #[test]
    fn the_documented_table_is_the_code_both_ways() {
        let rows = documented();
        let mut codes: Vec<i32> = rows.iter().filter_map(|(code, _)| code.parse().ok()).collect();
        codes.sort_unstable();
        assert_eq!(codes, all_codes(), "docs/exit-codes.md's payload table and payload::exit disagree");
        for class in OutcomeClass::ALL {
            let code =
                if class == OutcomeClass::Interrupted { "128+n".to_string() } else { class.exit_code().to_string() };
            let want = format!("`{}`", class.as_str());
            assert!(
                rows.iter().any(|(c, k)| *c == code && *k == want),
                "no row `| {code} | {want} |` in docs/exit-codes.md"
            );
        }
        for (code, name) in WITHOUT_CLASS {
            let want = format!("— (`{name}`)");
            assert!(rows.iter().any(|(c, k)| *c == code.to_string() && *k == want), "no row `| {code} | {want} |`");
        }
    }
}
