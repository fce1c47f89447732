//! Several models ranked on one benchmark, with ties where their intervals overlap (docs/results.md
//! "Ranking several models"). Pure: the caller gives each model's mean and 95% interval.
//!
//! The rule is the one public leaderboards use for statistical ties (a model's rank is one more
//! than the number of models that are clearly better): with intervals of a few points on a
//! benchmark of a hundred tasks, an order by mean alone would claim differences the data cannot tell.

use serde::Serialize;

use super::Interval;

/// Where a model's interval comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IntervalBasis {
    /// The seeded bootstrap over tasks of its per-trial facts ("invalid as 0").
    BootstrapOverTasks,
    /// mean ± 1.96 · √(p(1−p)/n) over trials: a result without per-trial facts (it understates the
    /// uncertainty when tasks have several attempts).
    NormalOverTrials,
    /// No interval (no standard error): the interval is the mean itself.
    MeanOnly,
}

impl IntervalBasis {
    pub fn describe(self) -> &'static str {
        match self {
            Self::BootstrapOverTasks => "bootstrap over tasks",
            Self::NormalOverTrials => "normal, over trials",
            Self::MeanOnly => "mean only",
        }
    }
}

/// One model's score on the benchmark being ranked.
#[derive(Clone, Debug, PartialEq)]
pub struct Contender {
    pub model: String,
    pub mean: f64,
    pub interval: Option<Interval>,
    pub basis: IntervalBasis,
}

impl Contender {
    /// A result's contender from its mean and the trial-level standard error √(p(1−p)/n), when
    /// it has no per-trial facts: the normal interval, clipped to [0, 1].
    pub fn from_standard_error(model: &str, mean: f64, stderr: Option<f64>) -> Contender {
        let interval = stderr
            .map(|se| Interval { lower: (mean - NORMAL_95 * se).max(0.0), upper: (mean + NORMAL_95 * se).min(1.0) });
        Contender {
            model: model.to_string(),
            mean,
            interval,
            basis: if interval.is_some() { IntervalBasis::NormalOverTrials } else { IntervalBasis::MeanOnly },
        }
    }

    fn bounds(&self) -> (f64, f64) {
        self.interval.map_or((self.mean, self.mean), |i| (i.lower, i.upper))
    }

    /// Clearly better than `other`: its whole interval lies above the other's.
    fn clearly_above(&self, other: &Contender) -> bool {
        self.bounds().0 > other.bounds().1
    }
}

/// The two-sided 95% quantile of the normal distribution.
pub const NORMAL_95: f64 = 1.959_963_984_540_054;

/// A model's place in a ranking.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Standing {
    pub model: String,
    pub mean: f64,
    pub interval: Option<Interval>,
    pub basis: IntervalBasis,
    /// 1 + the number of models whose interval lies wholly above this one's.
    pub rank: usize,
    /// 1, 2, … in the ranking's order (rank, then mean, then name).
    pub position: usize,
    /// The models whose interval overlaps this one's (touching counts), in the ranking's order.
    pub tied_with: Vec<String>,
}

impl Standing {
    pub fn tied(&self) -> bool {
        !self.tied_with.is_empty()
    }

    /// `2` or, when tied with another model, `2=`.
    pub fn rank_label(&self) -> String {
        format!("{}{}", self.rank, if self.tied() { "=" } else { "" })
    }
}

/// Ranks the contenders: each model's rank is 1 + the number of models whose interval lies wholly
/// above its own; two models whose intervals overlap (or touch) are tied. Ordered by rank, then
/// mean (higher first), then name, so the order is total and the same on every run.
pub fn rank(contenders: &[Contender]) -> Vec<Standing> {
    let mut standings: Vec<Standing> = contenders
        .iter()
        .map(|c| Standing {
            model: c.model.clone(),
            mean: c.mean,
            interval: c.interval,
            basis: c.basis,
            rank: 1 + contenders.iter().filter(|other| other.clearly_above(c)).count(),
            position: 0,
            tied_with: Vec::new(),
        })
        .collect();
    standings.sort_by(|a, b| a.rank.cmp(&b.rank).then(b.mean.total_cmp(&a.mean)).then(a.model.cmp(&b.model)));
    let ordered: Vec<&Contender> = standings
        .iter()
        .map(|s| contenders.iter().find(|c| c.model == s.model).expect("every standing has its contender"))
        .collect();
    for (i, standing) in standings.iter_mut().enumerate() {
        standing.position = i + 1;
        let own = ordered[i];
        standing.tied_with = ordered
            .iter()
            .filter(|other| other.model != own.model && !other.clearly_above(own) && !own.clearly_above(other))
            .map(|other| other.model.clone())
            .collect();
    }
    standings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contender(model: &str, mean: f64, lower: f64, upper: f64) -> Contender {
        Contender {
            model: model.into(),
            mean,
            interval: Some(Interval { lower, upper }),
            basis: IntervalBasis::BootstrapOverTasks,
        }
    }

    fn summary(standings: &[Standing]) -> Vec<(String, String, Vec<String>)> {
        standings.iter().map(|s| (s.model.clone(), s.rank_label(), s.tied_with.clone())).collect()
    }

    #[test]
    fn overlapping_intervals_tie_and_a_clear_gap_ranks_below() {
        // A and B overlap; C lies wholly below both; D overlaps C only.
        let standings = rank(&[
            contender("C", 0.20, 0.12, 0.28),
            contender("A", 0.60, 0.50, 0.70),
            contender("B", 0.55, 0.45, 0.65),
            contender("D", 0.30, 0.27, 0.33),
        ]);
        let s =
            |m: &str, r: &str, t: &[&str]| (m.to_string(), r.to_string(), t.iter().map(|x| x.to_string()).collect());
        assert_eq!(
            summary(&standings),
            vec![s("A", "1=", &["B"]), s("B", "1=", &["A"]), s("D", "3=", &["C"]), s("C", "3=", &["D"])]
        );
        assert_eq!(standings.iter().map(|s| s.position).collect::<Vec<_>>(), [1, 2, 3, 4]);
    }

    #[test]
    fn separated_intervals_give_distinct_ranks_and_touching_ones_tie() {
        let standings = rank(&[
            contender("low", 0.1, 0.05, 0.15),
            contender("mid", 0.3, 0.25, 0.35),
            contender("top", 0.5, 0.35, 0.65),
        ]);
        // top's lower bound equals mid's upper bound: touching is overlapping.
        assert_eq!(standings.iter().map(Standing::rank_label).collect::<Vec<_>>(), ["1=", "1=", "3"]);
        assert_eq!(standings[2].model, "low");
        assert!(!standings[2].tied());
    }

    #[test]
    fn a_wide_interval_can_rank_above_a_higher_mean() {
        // X has the higher mean but a narrow interval that Z clears; Y's wide interval reaches Z.
        let standings = rank(&[
            contender("X", 0.50, 0.48, 0.52),
            contender("Y", 0.45, 0.20, 0.70),
            contender("Z", 0.60, 0.55, 0.65),
        ]);
        let order: Vec<(&str, usize)> = standings.iter().map(|s| (s.model.as_str(), s.rank)).collect();
        assert_eq!(order, [("Z", 1), ("Y", 1), ("X", 2)]);
    }

    #[test]
    fn without_intervals_only_equal_means_tie() {
        let standings = rank(&[
            Contender::from_standard_error("a", 0.4, None),
            Contender::from_standard_error("b", 0.4, None),
            Contender::from_standard_error("c", 0.3, None),
        ]);
        assert_eq!(summary(&standings)[0], ("a".into(), "1=".into(), vec!["b".to_string()]));
        assert_eq!(standings[2].rank_label(), "3");
        assert_eq!(standings[0].basis, IntervalBasis::MeanOnly);
        // With a standard error: the normal interval, clipped to the score range.
        let c = Contender::from_standard_error("d", 0.98, Some(0.02));
        let interval = c.interval.unwrap();
        assert!((interval.lower - (0.98 - NORMAL_95 * 0.02)).abs() < 1e-12 && interval.upper == 1.0);
        assert!(rank(&[]).is_empty());
    }
}
