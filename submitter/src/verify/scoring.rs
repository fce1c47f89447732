//! How a benchmark is scored, as its preset declares it (`scoring:` in `presets/<name>.yaml`,
//! docs/results.md "Scoring"); `results::Scorings` gathers the declarations per benchmark family.

use serde::{Deserialize, Serialize};

/// How a preset's benchmark is scored, as the preset declares it (`scoring:`; docs/results.md):
/// what `results`, `report` and `compare` show for it and whether it ranks models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Scoring {
    pub kind: ScoringKind,
    /// Counts toward the ID mean: a model's mean over every benchmark declaring it, when it has them all.
    #[serde(default)]
    pub in_id_mean: bool,
    /// The team ranks models on it (only a binary benchmark can be: a partial-credit mean is no ranking).
    #[serde(default)]
    pub ranked: bool,
}

/// `binary, in the ID mean, ranked`: as `registry check` names it.
impl std::fmt::Display for Scoring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            ScoringKind::Binary => "binary",
            ScoringKind::PartialCredit => "partial credit",
        };
        let id_mean = if self.in_id_mean { "in the ID mean" } else { "outside the ID mean" };
        write!(f, "{kind}, {id_mean}, {}", if self.ranked { "ranked" } else { "not ranked" })
    }
}

/// What one trial's reward is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoringKind {
    /// 0 or 1 per trial: the mean with its standard error.
    Binary,
    /// A share per trial: the mean only.
    PartialCredit,
}

impl Scoring {
    /// A preset that declares no scoring: the mean only (no claim that rewards are 0/1), outside the
    /// ID mean, never ranked — nothing is claimed that the preset did not say.
    pub const UNDECLARED: Scoring = Scoring { kind: ScoringKind::PartialCredit, in_id_mean: false, ranked: false };

    /// What is wrong with the declaration, if anything.
    pub(crate) fn problem(&self) -> Option<&'static str> {
        (self.ranked && self.kind != ScoringKind::Binary).then_some(
            "scoring: `ranked: true` needs `kind: binary` (a partial-credit mean ranks nobody): set one or the other",
        )
    }
}
