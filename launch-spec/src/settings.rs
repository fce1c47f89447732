//! Where a setting's value comes from, and the one precedence between its sources (docs/design.md,
//! "Settings: one resolver"): the operator's command line > the preset > the cluster profile > the
//! GPU profile > the default. The submitter resolves every setting of a job by [`Layers`] once, and
//! payload's GPU-memory ceiling ([`crate::gpu::effective_gpu_memory_utilization`]) is the same rule
//! over what the launch spec carries.

use serde::Serialize;

/// Where a resolved value came from; `plan` prints it after the value (`n_concurrent 8 (preset tb2)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The operator's command line (`--n-concurrent`, `--partition`, …).
    Cli,
    /// `presets/<name>.yaml`.
    Preset(String),
    /// `clusters/<name>.yaml`.
    Profile(String),
    /// The `clusters/gpus.yaml` entry the GPUs match.
    GpuProfile(String),
    /// The model registry (the model's entry, or its size band in `_timeouts.yaml`).
    Registry(String),
    /// A Harbor job config's own key (`presets/harbor/<file>`).
    HarborConfig(String),
    /// The launch spec's own override, as payload sees it: the command line or the preset,
    /// settled on the login node.
    Spec,
    /// Nothing set it: the built-in default.
    Default,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, name) = match self {
            Source::Cli => return f.write_str("command line"),
            Source::Spec => return f.write_str("launch spec override"),
            Source::Default => return f.write_str("default"),
            Source::Preset(name) => ("preset", name),
            Source::Profile(name) => ("profile", name),
            Source::GpuProfile(name) => ("GPU profile", name),
            Source::Registry(name) => ("registry", name),
            Source::HarborConfig(name) => ("Harbor config", name),
        };
        if name.is_empty() { f.write_str(what) } else { write!(f, "{what} {name}") }
    }
}

/// A value with where it came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sourced<T> {
    pub value: T,
    #[serde(serialize_with = "as_text")]
    pub source: Source,
    /// What happened to it on the way (`capped from 64 (preset tb2) by limits.n_concurrent_ceiling`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

fn as_text<S: serde::Serializer>(source: &Source, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(source)
}

impl<T> Sourced<T> {
    pub fn new(value: T, source: Source) -> Sourced<T> {
        Sourced { value, source, note: None }
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Sourced<U> {
        Sourced { value: f(self.value), source: self.source, note: self.note }
    }
}

impl<T> Sourced<T> {
    /// `8 (preset tb2)` with the value as `show` writes it, and the note after the source.
    pub fn describe_with(&self, show: impl Fn(&T) -> String) -> String {
        match &self.note {
            Some(note) => format!("{} ({}; {note})", show(&self.value), self.source),
            None => format!("{} ({})", show(&self.value), self.source),
        }
    }
}

impl<T: std::fmt::Display> Sourced<T> {
    /// `8 (preset tb2)`, with the note after it when there is one.
    pub fn describe(&self) -> String {
        self.describe_with(T::to_string)
    }
}

/// The first value set in `candidates`, in their order, with its source: the one combinator every
/// precedence is written with.
pub fn first_set<T>(candidates: impl IntoIterator<Item = (Option<T>, Source)>) -> Option<Sourced<T>> {
    candidates.into_iter().find_map(|(value, source)| value.map(|value| Sourced::new(value, source)))
}

/// One setting's values at each level; [`Layers::resolve`] is the precedence, written once.
#[derive(Debug, Clone)]
pub struct Layers<T> {
    /// The command line (or, in payload, the spec's override: [`Source::Spec`]).
    pub cli: Option<(T, Source)>,
    pub preset: Option<(T, Source)>,
    pub profile: Option<(T, Source)>,
    pub gpu_profile: Option<(T, Source)>,
}

impl<T> Default for Layers<T> {
    fn default() -> Self {
        Layers { cli: None, preset: None, profile: None, gpu_profile: None }
    }
}

impl<T> Layers<T> {
    /// Command line > preset > profile > GPU profile; `None` when no level sets it.
    pub fn resolve(self) -> Option<Sourced<T>> {
        let split = |layer: Option<(T, Source)>, unset: Source| match layer {
            Some((value, source)) => (Some(value), source),
            None => (None, unset),
        };
        first_set([
            split(self.cli, Source::Cli),
            split(self.preset, Source::Default),
            split(self.profile, Source::Default),
            split(self.gpu_profile, Source::Default),
        ])
    }

    /// [`Self::resolve`], else `default` ([`Source::Default`]).
    pub fn or_default(self, default: T) -> Sourced<T> {
        self.resolve().unwrap_or_else(|| Sourced::new(default, Source::Default))
    }
}

/// A level's value, when it sets one, named by its source.
pub fn at<T>(value: Option<T>, source: Source) -> Option<(T, Source)> {
    value.map(|value| (value, source))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers(cli: Option<u32>, preset: Option<u32>, profile: Option<u32>, gpu: Option<u32>) -> Layers<u32> {
        Layers {
            cli: at(cli, Source::Cli),
            preset: at(preset, Source::Preset("p".into())),
            profile: at(profile, Source::Profile("c".into())),
            gpu_profile: at(gpu, Source::GpuProfile("g".into())),
        }
    }

    /// Each level wins over every level after it, and only over those.
    #[test]
    fn the_command_line_beats_the_preset_beats_the_profile_beats_the_gpu_profile() {
        let got = |l: Layers<u32>| l.or_default(0).describe();
        assert_eq!(got(layers(Some(1), Some(2), Some(3), Some(4))), "1 (command line)");
        assert_eq!(got(layers(None, Some(2), Some(3), Some(4))), "2 (preset p)");
        assert_eq!(got(layers(None, None, Some(3), Some(4))), "3 (profile c)");
        assert_eq!(got(layers(None, None, None, Some(4))), "4 (GPU profile g)");
        assert_eq!(got(layers(None, None, None, None)), "0 (default)");
        assert_eq!(layers(None, None, None, None).resolve(), None);
    }

    #[test]
    fn sources_read_as_plan_prints_them_and_serialize_as_text() {
        let mut value = Sourced::new(16, Source::Profile("leonardo".into()));
        value.note = Some("capped from 64 (preset tb2)".into());
        assert_eq!(value.describe(), "16 (profile leonardo; capped from 64 (preset tb2))");
        let json = serde_json::to_value(&value).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"value": 16, "source": "profile leonardo", "note": "capped from 64 (preset tb2)"})
        );
        assert_eq!(Source::Preset(String::new()).to_string(), "preset");
        assert_eq!(Source::HarborConfig("a.yaml".into()).to_string(), "Harbor config a.yaml");
    }
}
