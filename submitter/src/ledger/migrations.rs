//! Versioned schema migrations, one SQL file per backend and version, applied in order on open.
//!
//! Policy: forward-only. A migration that has shipped is never edited; a change is a new version.
//! The ledger records `(version, name)` in `schema_migrations`; opening a ledger whose schema is
//! newer than this build, or whose recorded name for a version differs from ours, is refused
//! rather than guessed at (an old submitter writing rows into a newer schema could break dedup).

use super::{LedgerError, Result};

#[derive(Debug)]
pub struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sqlite: &'static str,
    pub postgres: &'static str,
}

/// One version's entry, its files named by it: `migrations/<NNNN>_<name>.sqlite.sql` and
/// `….postgres.sql`, so the two backends cannot point at different versions.
macro_rules! migration {
    ($version:literal, $padded:literal, $name:literal) => {
        Migration {
            version: $version,
            name: $name,
            sqlite: include_str!(concat!("migrations/", $padded, "_", $name, ".sqlite.sql")),
            postgres: include_str!(concat!("migrations/", $padded, "_", $name, ".postgres.sql")),
        }
    };
}

pub(crate) const MIGRATIONS: &[Migration] = &[
    migration!(1, "0001", "initial"),
    migration!(2, "0002", "team"),
    migration!(3, "0003", "continuation"),
    migration!(4, "0004", "agent"),
    migration!(5, "0005", "gpu_seconds"),
    migration!(6, "0006", "remediation"),
    migration!(7, "0007", "trials"),
];

/// The schema version this build writes.
pub fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// The migrations still to apply, given the `(version, name)` rows already recorded.
pub(crate) fn pending(location: &str, applied: &[(i64, String)]) -> Result<Vec<&'static Migration>> {
    for (version, name) in applied {
        match MIGRATIONS.iter().find(|m| m.version == *version) {
            Some(known) if known.name == name => {}
            Some(known) => {
                return Err(LedgerError::Migration {
                    location: location.to_string(),
                    version: *version,
                    detail: format!(
                        "the ledger recorded it as {name:?} but this submitter knows it as {:?} — \
                         the ledger was migrated by a different build",
                        known.name
                    ),
                });
            }
            None if *version > latest_version() => {
                return Err(LedgerError::SchemaTooNew {
                    location: location.to_string(),
                    found: *version,
                    supported: latest_version(),
                });
            }
            None => {
                return Err(LedgerError::Migration {
                    location: location.to_string(),
                    version: *version,
                    detail: format!("unknown migration {name:?} recorded in the ledger"),
                });
            }
        }
    }
    Ok(MIGRATIONS.iter().filter(|m| !applied.iter().any(|(v, _)| *v == m.version)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_start_at_one_and_increase() {
        // Parallel changes are assigned their numbers up front, so a build may lack one in between.
        assert_eq!(MIGRATIONS[0].version, 1);
        for pair in MIGRATIONS.windows(2) {
            assert!(pair[1].version > pair[0].version, "{} after {}", pair[1].name, pair[0].name);
        }
    }

    #[test]
    fn both_dialects_define_the_same_objects() {
        // A cheap guard against the two files drifting apart: the same CREATE statements by name.
        fn objects(sql: &str) -> Vec<String> {
            sql.lines()
                .map(str::trim)
                .filter(|l| l.starts_with("CREATE "))
                .map(|l| l.split('(').next().unwrap_or(l).trim().to_string())
                .collect()
        }
        for migration in MIGRATIONS {
            assert_eq!(objects(migration.sqlite), objects(migration.postgres), "{}", migration.name);
        }
    }

    #[test]
    fn newer_schema_is_refused_and_renamed_versions_are_caught() {
        let too_new = pending("sqlite:x", &[(1, "initial".into()), (latest_version() + 1, "future".into())]);
        assert!(matches!(too_new, Err(LedgerError::SchemaTooNew { .. })), "{too_new:?}");
        let renamed = pending("sqlite:x", &[(1, "other".into())]);
        assert!(matches!(renamed, Err(LedgerError::Migration { version: 1, .. })), "{renamed:?}");
        assert_eq!(pending("sqlite:x", &[]).unwrap().len(), MIGRATIONS.len());
        assert_eq!(pending("sqlite:x", &[(1, "initial".into())]).unwrap().len(), MIGRATIONS.len() - 1);
        let all: Vec<(i64, String)> = MIGRATIONS.iter().map(|m| (m.version, m.name.to_string())).collect();
        assert!(pending("sqlite:x", &all).unwrap().is_empty());
    }
}
