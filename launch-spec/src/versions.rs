//! Declared program versions: which vLLM and which Harbor an environment runs, and what follows
//! from them (vLLM's `--swap-space`, the environment variables vLLM still knows, the form of
//! terminus-2's kwargs, Harbor's `--yes`). docs/real-programs.md ("Declared versions") says which
//! versions are verified against the real programs and how to declare another.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The vLLM release the argv is verified against (its own parser accepts every argv we build).
pub const VERIFIED_VLLM: Version = Version::new(0, 33, 0);
/// The Harbor release the harness is verified against (run end to end); the default of an
/// environment that declares none.
pub const VERIFIED_HARBOR: Version = Version::new(0, 25, 0);
/// Every Harbor release the real-Harbor scenarios run against (docs/real-programs.md, "Harbor 0.26.0
/// beside 0.25.0"), oldest first.
pub const VERIFIED_HARBORS: &[Version] = &[Version::new(0, 25, 0), Version::new(0, 26, 0)];
/// The first Harbor whose job config has `schema_version` and `override_error_policy`, whose mean
/// drops trials with an invalid reward (0.25 counted them as 0), and whose retry defaults changed
/// (`BadRequestError`, `ContextLengthExceededError`, `NonZeroAgentExitCodeError` no longer
/// retried; `ApiUsageLimitError` now is).
pub const HARBOR_026: Version = Version::new(0, 26, 0);
/// Newer vLLM releases whose own parser checks every argv though no shipped environment declares
/// them yet (issue 35: 0.34.0 beside 0.16.0 and 0.33.0): the argv built for the verified release,
/// which is the argv such a release gets when its capabilities that shape the argv are the same.
pub const VLLM_CHECKED_BESIDE: &[Version] = &[Version::new(0, 34, 0)];
/// The first vLLM without `--swap-space` (0.17.1 still had it; 0.18.0 dropped it from EngineArgs).
pub const VLLM_SWAP_SPACE_REMOVED: Version = Version::new(0, 18, 0);
/// The first vLLM known to take `--distributed-timeout-seconds` (0.16.0's parser refuses it; 0.33.0
/// takes it; releases between are unchecked, so they go without it and keep vLLM's default).
pub(crate) const VLLM_DISTRIBUTED_TIMEOUT_ADDED: Version = Version::new(0, 33, 0);
/// The oldest Harbor whose terminus-2 has the kwargs schema this crate writes (`parser_name`,
/// `llm_call_kwargs`, unknown options refused).
pub(crate) const HARBOR_MIN: Version = Version::new(0, 25, 0);

/// vLLM environment variables a declared vLLM no longer knows, with the first release known
/// without it (verified against 0.33.0 and 0.34.0's `vllm.envs`; the real removal may be earlier).
pub(crate) const RETIRED_VLLM_ENV: &[(&str, Version)] = &[
    ("VLLM_USE_V1", Version::new(0, 33, 0)),
    ("VLLM_ALL2ALL_BACKEND", Version::new(0, 33, 0)),
    ("VLLM_USE_V2_MODEL_RUNNER", Version::new(0, 34, 0)),
    ("VLLM_MARLIN_INPUT_DTYPE", Version::new(0, 34, 0)),
];

/// A program's version by PEP 440 (what pip reports; parsed by `pep440_rs`): the release
/// `major.minor.patch` and its pre-release (`rc2`), post-release (`.post1`) and dev-release
/// (`.dev3`) parts, kept, printed in PEP 440's normal form and ordered by its rules
/// (`0.11.0.dev1 < 0.11.0rc2 < 0.11.0 < 0.11.0.post1`). A local label (`+cu124`, `+cpu`) names a
/// build of the same release and is dropped. What a version can do follows its release
/// ([`Version::release`]): a pre-release carries the change it precedes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Version {
    pub(crate) major: u32,
    pub(crate) minor: u32,
    pub(crate) patch: u32,
    // u32 parts (not pep440_rs's u64 and `Prerelease`): a Version sits twice in error variants,
    // and this keeps it at 36 bytes.
    pre: Option<(pep440_rs::PrereleaseKind, u32)>,
    post: Option<u32>,
    dev: Option<u32>,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Self { major, minor, patch, pre: None, post: None, dev: None }
    }

    /// The release alone (`0.11.0` for `0.11.0rc2`): what the capability thresholds compare.
    pub const fn release(self) -> Self {
        Self::new(self.major, self.minor, self.patch)
    }

    pub const fn major(self) -> u32 {
        self.major
    }

    pub const fn minor(self) -> u32 {
        self.minor
    }

    fn pep440(&self) -> pep440_rs::Version {
        pep440_rs::Version::new([self.major, self.minor, self.patch].map(u64::from))
            .with_pre(self.pre.map(|(kind, number)| pep440_rs::Prerelease { kind, number: u64::from(number) }))
            .with_post(self.post.map(u64::from))
            .with_dev(self.dev.map(u64::from))
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.pep440().cmp(&other.pep440())
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.pep440().fmt(f)
    }
}

impl FromStr for Version {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad =
            || format!("`{text}` is not a version (write it as MAJOR.MINOR.PATCH, e.g. \"0.33.0\" or \"0.11.0rc2\")");
        let parsed: pep440_rs::Version = text.trim().parse().map_err(|_| bad())?;
        let number = |n: &u64| u32::try_from(*n).map_err(|_| bad());
        let [major, minor, patch] = parsed.release() else { return Err(bad()) };
        if parsed.epoch() != 0 {
            return Err(bad());
        }
        Ok(Version {
            major: number(major)?,
            minor: number(minor)?,
            patch: number(patch)?,
            pre: parsed.pre().map(|p| Ok::<_, String>((p.kind, number(&p.number)?))).transpose()?,
            post: parsed.post().as_ref().map(number).transpose()?,
            dev: parsed.dev().as_ref().map(number).transpose()?,
        })
    }
}

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// What a declared vLLM can do.
pub fn vllm_has_swap_space(vllm: Version) -> bool {
    vllm.release() < VLLM_SWAP_SPACE_REMOVED
}

/// Whether a declared vLLM takes `--distributed-timeout-seconds` (multi-node engines).
pub fn vllm_has_distributed_timeout(vllm: Version) -> bool {
    vllm.release() >= VLLM_DISTRIBUTED_TIMEOUT_ADDED
}

/// Every retired vLLM environment variable with the first release known without it.
pub fn retired_vllm_env() -> &'static [(&'static str, Version)] {
    RETIRED_VLLM_ENV
}

/// The entries of `RETIRED_VLLM_ENV` that `vllm` no longer knows.
pub fn vllm_retired_env(vllm: Version) -> impl Iterator<Item = &'static str> {
    RETIRED_VLLM_ENV.iter().filter(move |(_, since)| vllm.release() >= *since).map(|(name, _)| *name)
}

/// The Harbor command-line and terminus-2 kwargs a Harbor speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum HarborDialect {
    /// Upstream Harbor ≥ 0.25: terminus-2 refuses unknown options, the parser option is
    /// `parser_name`, request-body extras go in `llm_call_kwargs={"extra_body": …}`, `--yes`
    /// answers confirmation prompts, `--print-config` prints the resolved job config.
    #[default]
    #[serde(rename = "harbor-0.25")]
    Harbor025,
    /// Upstream Harbor ≥ 0.26: 0.25's command line and terminus-2 kwargs; its job config adds
    /// `schema_version` (1) and `override_error_policy`, its mean drops trials with an invalid
    /// reward, its retry defaults changed ([`HARBOR_026`]), and its trial `result.json` records
    /// `reward_valid`. 0.25 ignores the two new config keys and resumes a dir 0.26 touched under its
    /// own rules, so the two are told apart (docs/real-programs.md, "Harbor 0.26.0 beside 0.25.0").
    #[serde(rename = "harbor-0.26")]
    Harbor026,
    /// The team's Harbor fork the old scripts ran: terminus-2 takes `extra_body=…` and `parser=…`;
    /// no `--yes` (the old argv never passed it). Unverified against a real install: it is what the
    /// replaced scripts passed.
    #[serde(rename = "extra-body-fork")]
    ExtraBodyFork,
}

/// Named Harbor flavours a cluster profile may declare instead of a version.
pub(crate) const HARBOR_FLAVOURS: &[(&str, HarborDialect)] = &[("extra-body-fork", HarborDialect::ExtraBodyFork)];

impl HarborDialect {
    /// From a declared Harbor: a release (`"0.25.0"`) or a flavour name (`extra-body-fork`).
    pub fn from_declared(text: &str) -> Result<(Self, Option<Version>), String> {
        if let Some((_, dialect)) = HARBOR_FLAVOURS.iter().find(|(name, _)| *name == text.trim()) {
            return Ok((*dialect, None));
        }
        let flavours = HARBOR_FLAVOURS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
        let version: Version = text.parse().map_err(|e| format!("{e}, or name a Harbor flavour ({flavours})"))?;
        if version.release() < HARBOR_MIN {
            return Err(format!(
                "Harbor {version} is older than {HARBOR_MIN}, the oldest release this launcher speaks; upgrade it, or declare the flavour it is ({flavours})"
            ));
        }
        Ok((harbor_release_dialect(version).unwrap_or_default(), Some(version)))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            HarborDialect::Harbor025 => "harbor-0.25",
            HarborDialect::Harbor026 => "harbor-0.26",
            HarborDialect::ExtraBodyFork => "extra-body-fork",
        }
    }

    /// terminus-2's parser option.
    pub fn parser_kwarg(self) -> &'static str {
        match self {
            HarborDialect::Harbor025 | HarborDialect::Harbor026 => "parser_name",
            HarborDialect::ExtraBodyFork => "parser",
        }
    }

    /// Whether `jobs start` takes `--yes` (and needs it: host-variable prompts abort on /dev/null).
    pub fn has_yes(self) -> bool {
        self.is_upstream()
    }

    /// An upstream release's dialect (0.25's command line and kwargs), not the fork's.
    pub fn is_upstream(self) -> bool {
        matches!(self, HarborDialect::Harbor025 | HarborDialect::Harbor026)
    }

    /// Whether `jobs start --print-config` prints the resolved job config and exits.
    pub fn has_print_config(self) -> bool {
        self.is_upstream()
    }

    /// Whether the job config takes `schema_version` and `override_error_policy` (Harbor ≥ 0.26).
    pub fn has_error_policy(self) -> bool {
        matches!(self, HarborDialect::Harbor026)
    }

    /// The `metrics[].type` values the dialect's job config takes. The fork has no `--print-config`
    /// to ask, so its job config's schema is kept here: its metrics code is the release's
    /// (docs/real-programs.md, "The fork's job config").
    pub fn metric_types(self) -> &'static [&'static str] {
        match self {
            HarborDialect::Harbor025 | HarborDialect::Harbor026 | HarborDialect::ExtraBodyFork => METRIC_TYPES_025,
        }
    }

    /// Options terminus-2 accepts, when the dialect's schema is known (Harbor 0.25.0's
    /// `Terminus2Options` plus the shared `AgentOptions`, aliases included; 0.26.0's are the same).
    pub fn terminus2_options(self) -> Option<&'static [&'static str]> {
        match self {
            HarborDialect::Harbor025 | HarborDialect::Harbor026 => Some(TERMINUS2_025_OPTIONS),
            HarborDialect::ExtraBodyFork => None,
        }
    }
}

/// Harbor 0.25.0's metric types (`harbor/models/metric/type.py`, `MetricType`; a job config's
/// `metrics[].type`, default `mean`; 0.26.0's are the same). Checked against the installed Harbors
/// by `tests/tests/harbor_job_schema.rs`.
pub const METRIC_TYPES_025: &[&str] = &["sum", "min", "max", "mean", "uv-script"];

/// The job config keys Harbor 0.26 added: 0.25 (and the fork) parse a config holding them and
/// ignore them, so a config written for 0.26 would run under 0.25 without its error policy.
pub const JOB_CONFIG_KEYS_026: &[&str] = &["schema_version", "override_error_policy"];
/// The fields of one `override_error_policy` entry (Harbor 0.26.0's `ErrorPolicyOverride`,
/// `extra="forbid"`, each a boolean or null).
pub const ERROR_POLICY_FIELDS_026: &[&str] = &["should_retry", "should_grade", "has_valid_reward"];

/// What the dialect's Harbor would refuse in a job config (YAML or JSON, as a value), found from the
/// schema kept here without running Harbor: one line per problem, each naming the field and the fix.
/// Today: `metrics` entries whose type the dialect does not know (a stale metric: a config written
/// for another Harbor, like the old `*-drop-ei` configs), which Harbor refuses only after the model
/// has loaded; Harbor 0.26's keys ([`JOB_CONFIG_KEYS_026`]) for a Harbor before 0.26, which would
/// ignore them; for 0.26, a `schema_version` other than 1 and `override_error_policy` entries that
/// are not `{should_retry, should_grade, has_valid_reward}` booleans, which it refuses.
pub fn job_config_problems(dialect: HarborDialect, config: &serde_json::Value) -> Vec<String> {
    let mut problems = error_policy_problems(dialect, config);
    problems.extend(metric_problems(dialect, config));
    problems
}

fn error_policy_problems(dialect: HarborDialect, config: &serde_json::Value) -> Vec<String> {
    let mut problems = Vec::new();
    if !dialect.has_error_policy() {
        for key in JOB_CONFIG_KEYS_026 {
            if config.get(key).is_some() {
                problems.push(format!(
                    "`{key}` is a Harbor {HARBOR_026} job config key that the {} Harbor ignores (its trials would run without it): remove it, or declare harbor \"{HARBOR_026}\" for the environment",
                    dialect.as_str()
                ));
            }
        }
        return problems;
    }
    match config.get("schema_version") {
        None | Some(serde_json::Value::Null) => {}
        Some(v) if v.as_u64() == Some(1) => {}
        Some(other) => problems.push(format!(
            "`schema_version` {other} is not a job config version Harbor {HARBOR_026} reads: write 1, or remove the key"
        )),
    }
    let fields = ERROR_POLICY_FIELDS_026.join(", ");
    match config.get("override_error_policy") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(entries)) => {
            for (exception, entry) in entries {
                let Some(entry) = entry.as_object() else {
                    problems.push(format!(
                        "override_error_policy.{exception} must be a mapping of {fields} to true/false"
                    ));
                    continue;
                };
                for (field, value) in entry {
                    if !ERROR_POLICY_FIELDS_026.contains(&field.as_str()) {
                        problems.push(format!(
                            "override_error_policy.{exception}.{field} is not a field Harbor {HARBOR_026} knows: use {fields}"
                        ));
                    } else if !lax_bool(value) {
                        problems.push(format!("override_error_policy.{exception}.{field} must be true or false"));
                    }
                }
            }
        }
        Some(_) => problems.push(format!(
            "`override_error_policy` must be a mapping of exception type to {{{fields}}}: write it as `BadRequestError: {{should_retry: true}}`"
        )),
    }
    problems
}

/// What Harbor's pydantic takes for a `bool | None` field in its lax mode: a boolean, null, 0 or 1,
/// or one of the strings it reads as one (`"yes"`, `"off"`, …).
fn lax_bool(value: &serde_json::Value) -> bool {
    const WORDS: &[&str] = &["0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"];
    match value {
        serde_json::Value::Null | serde_json::Value::Bool(_) => true,
        serde_json::Value::Number(n) => n.as_f64().is_some_and(|x| x == 0.0 || x == 1.0),
        serde_json::Value::String(text) => WORDS.contains(&text.to_lowercase().as_str()),
        _ => false,
    }
}

fn metric_problems(dialect: HarborDialect, config: &serde_json::Value) -> Vec<String> {
    let known = dialect.metric_types();
    let fix = format!(
        "remove the entry (Harbor then reports the mean reward) or name one of {} ({} Harbor)",
        known.join(", "),
        dialect.as_str()
    );
    let metrics = match config.get("metrics") {
        None | Some(serde_json::Value::Null) => return Vec::new(),
        Some(serde_json::Value::Array(items)) => items,
        Some(_) => return vec![format!("`metrics` must be a list of {{type, kwargs}} entries: {fix}")],
    };
    let mut problems = Vec::new();
    for (i, entry) in metrics.iter().enumerate() {
        let kind = match entry {
            serde_json::Value::Object(map) => map.get("type"),
            _ => {
                problems.push(format!("metrics[{i}] must be a mapping with `type`: {fix}"));
                continue;
            }
        };
        match kind {
            None => {}
            Some(serde_json::Value::String(t)) if known.contains(&t.as_str()) => {}
            Some(other) => {
                let shown = other.as_str().map_or_else(|| other.to_string(), str::to_string);
                problems.push(format!(
                    "metrics[{i}].type `{shown}` is not a metric the {} Harbor knows (a stale metric): {fix}",
                    dialect.as_str()
                ));
            }
        }
    }
    problems
}

/// Harbor 0.25.0's terminus-2 options (`harbor/agents/terminus_2/terminus_2.py`, `Terminus2Options`
/// with `extra="forbid"`, and `harbor/agents/options.py`, `AgentOptions`).
pub const TERMINUS2_025_OPTIONS: &[&str] = &[
    "base_url",
    "disable_web_search",
    "reasoning_effort",
    "max_turns",
    "episodes",
    "max_episodes",
    "parser_name",
    "api_base",
    "temperature",
    "collect_rollout_details",
    "session_id",
    "enable_summarize",
    "proactive_summarization_threshold",
    "max_thinking_tokens",
    "model_info",
    "trajectory_config",
    "tmux_pane_width",
    "tmux_pane_height",
    "store_all_messages",
    "record_terminal_session",
    "interleaved_thinking",
    "suppress_max_turns_warning",
    "use_responses_api",
    "llm_backend",
    "llm_kwargs",
    "llm_call_kwargs",
    "session_id_headers",
];

/// Why an agent kwarg cannot be given to a Harbor, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KwargError {
    #[error("agent kwarg `{0}` is not KEY=VALUE")]
    NotKeyValue(String),
    #[error("agent kwarg `{key}`: its value is not JSON ({reason}); write it as {key}={{\"…\": …}}")]
    NotJson { key: String, reason: String },
    #[error(
        "agent kwarg `llm_call_kwargs` carries {keys}, which the extra-body-fork Harbor cannot take (it has only `extra_body`); keep only extra_body or declare harbor \"0.25.0\""
    )]
    ForkCallKwargs { keys: String },
}

fn key_value(kv: &str) -> Result<(&str, &str), KwargError> {
    kv.split_once('=')
        .map(|(k, v)| (k.trim(), v.trim()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| KwargError::NotKeyValue(kv.to_string()))
}

fn json_value(key: &str, value: &str) -> Result<serde_json::Value, KwargError> {
    serde_json::from_str(value).map_err(|e| KwargError::NotJson { key: key.to_string(), reason: e.to_string() })
}

/// Rewrites `KEY=VALUE` agent kwargs written in either form into the form `dialect` takes.
/// Upstream Harbor (0.25, and 0.26 with 0.25's terminus-2 options): `extra_body=X` →
/// `llm_call_kwargs={"extra_body":X}` (merged with any other `llm_call_kwargs`, later keys
/// winning), `parser=P` → `parser_name=P`. The fork: the reverse.
/// Idempotent; other kwargs pass unchanged, in order (the merged one at the first one's place).
pub fn translate_agent_kwargs(kwargs: &[String], dialect: HarborDialect) -> Result<Vec<String>, KwargError> {
    let mut out: Vec<String> = Vec::new();
    let mut call: Option<(usize, serde_json::Map<String, serde_json::Value>)> = None;
    for kv in kwargs {
        let (key, value) = key_value(kv)?;
        match (dialect, key) {
            (HarborDialect::Harbor025 | HarborDialect::Harbor026, "extra_body" | "llm_call_kwargs") => {
                let parsed = json_value(key, value)?;
                let slot = call.get_or_insert_with(|| {
                    out.push(String::new());
                    (out.len() - 1, serde_json::Map::new())
                });
                if key == "extra_body" {
                    slot.1.insert("extra_body".to_string(), parsed);
                } else if let serde_json::Value::Object(map) = parsed {
                    slot.1.extend(map);
                } else {
                    return Err(KwargError::NotJson { key: key.to_string(), reason: "not an object".to_string() });
                }
            }
            (HarborDialect::Harbor025 | HarborDialect::Harbor026, "parser") => out.push(format!("parser_name={value}")),
            (HarborDialect::ExtraBodyFork, "llm_call_kwargs") => {
                let parsed = json_value(key, value)?;
                let map = match parsed {
                    serde_json::Value::Object(map) => map,
                    _ => {
                        return Err(KwargError::NotJson { key: key.to_string(), reason: "not an object".to_string() });
                    }
                };
                let others: Vec<&String> = map.keys().filter(|k| *k != "extra_body").collect();
                if !others.is_empty() {
                    let keys = others.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
                    return Err(KwargError::ForkCallKwargs { keys });
                }
                if let Some(body) = map.get("extra_body") {
                    out.push(format!("extra_body={body}"));
                }
            }
            (HarborDialect::ExtraBodyFork, "parser_name") => out.push(format!("parser={value}")),
            _ => out.push(kv.clone()),
        }
    }
    if let Some((index, map)) = call {
        out[index] = format!("llm_call_kwargs={}", serde_json::Value::Object(map));
    }
    Ok(out)
}

/// Keys of translated kwargs that the dialect's terminus-2 would refuse ("Unknown option").
pub fn unknown_terminus2_options(kwargs: &[String], dialect: HarborDialect) -> Vec<String> {
    let Some(known) = dialect.terminus2_options() else { return Vec::new() };
    kwargs
        .iter()
        .filter_map(|kv| key_value(kv).ok().map(|(k, _)| k.to_string()))
        .filter(|k| !known.contains(&k.as_str()))
        .collect()
}

/// The programs whose versions an environment is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    Vllm,
    Harbor,
}

impl Program {
    /// The Python distribution that holds it (what `importlib.metadata` is asked about).
    pub fn distribution(self) -> &'static str {
        match self {
            Program::Vllm => "vllm",
            Program::Harbor => "harbor",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Program::Vllm => "vLLM",
            Program::Harbor => "Harbor",
        }
    }

    /// The key of `environments.<name>` that declares it.
    pub fn key(self) -> &'static str {
        match self {
            Program::Vllm => "vllm",
            Program::Harbor => "harbor",
        }
    }
}

/// What a launch spec was built for: the environments it runs and what the cluster profile
/// declares they hold (`environments.<name>.vllm` / `.harbor`, the verified releases when
/// undeclared). payload and preflight ask the environments and refuse a disagreement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Declared {
    /// The engine's environment (its name in the profile).
    pub engine_environment: String,
    pub vllm: Version,
    /// Harbor's environment (its name in the profile).
    pub harbor_environment: String,
    /// A release (`"0.25.0"`) or a flavour name (`extra-body-fork`), as declared.
    pub harbor: String,
}

/// What a vLLM can do as far as the launcher's argv and environment go: two releases with the same
/// capabilities get the same argv and environment, so a declaration is wrong only when the found
/// release differs here (0.16.0 declared, 0.17.1 found: the same; 0.33.0 found: not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VllmCapabilities {
    pub swap_space: bool,
    pub(crate) distributed_timeout: bool,
    pub(crate) retired_env: Vec<&'static str>,
}

pub(crate) fn vllm_capabilities(vllm: Version) -> VllmCapabilities {
    VllmCapabilities {
        swap_space: vllm_has_swap_space(vllm),
        distributed_timeout: vllm_has_distributed_timeout(vllm),
        retired_env: vllm_retired_env(vllm).collect(),
    }
}

/// Where `found` differs from `declared` in what the launcher builds, one phrase each (empty: they agree).
pub(crate) fn vllm_differences(declared: Version, found: Version) -> Vec<String> {
    let (d, f) = (vllm_capabilities(declared), vllm_capabilities(found));
    let has = |yes: bool| if yes { "has" } else { "lacks" };
    let mut out = Vec::new();
    if d.swap_space != f.swap_space {
        out.push(format!("--swap-space ({declared} {}, {found} {} it)", has(d.swap_space), has(f.swap_space)));
    }
    if d.distributed_timeout != f.distributed_timeout {
        out.push(format!(
            "--distributed-timeout-seconds ({declared} {}, {found} {} it)",
            has(d.distributed_timeout),
            has(f.distributed_timeout)
        ));
    }
    if d.retired_env != f.retired_env {
        let differing: Vec<&str> = RETIRED_VLLM_ENV
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| d.retired_env.contains(n) != f.retired_env.contains(n))
            .collect();
        out.push(format!("the environment variables it knows ({})", differing.join(", ")));
    }
    out
}

/// The dialect a Harbor release speaks by the rule of [`HarborDialect::from_declared`]; None for a
/// release older than [`HARBOR_MIN`] (not 0.25's dialect: the fork, or an old upstream). A release
/// newer than 0.26 is assumed to speak 0.26's.
pub(crate) fn harbor_release_dialect(found: Version) -> Option<HarborDialect> {
    if found.release() >= HARBOR_026 {
        Some(HarborDialect::Harbor026)
    } else {
        (found.release() >= HARBOR_MIN).then_some(HarborDialect::Harbor025)
    }
}

/// An environment that holds another program than the spec was built for, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "environment `{environment}` declares {label} {declared} but holds {label} {found} ({differs}): edit `environments.{environment}.{key}` in cluster profile `{cluster}` ({fix})",
    label = program.label(),
    key = program.key()
)]
pub struct Disagreement {
    pub program: Program,
    pub environment: String,
    pub cluster: String,
    pub declared: String,
    pub found: String,
    pub differs: String,
    pub fix: String,
}

/// Compares what an environment reports (`found`, a version line) with what the spec was built
/// for. Compared is the class the rules above use, not the string: vLLM's capabilities, Harbor's
/// dialect. Not compared (Ok): an answer that is no version, and a declared flavour (it names no
/// release, and a fork may carry any number).
pub fn check_found(declared: &Declared, cluster: &str, program: Program, found: &str) -> Result<(), Box<Disagreement>> {
    let Ok(version) = found.parse::<Version>() else { return Ok(()) };
    let disagreement = |environment: &str, declared: String, differs: String, fix: String| {
        Box::new(Disagreement {
            program,
            environment: environment.to_string(),
            cluster: cluster.to_string(),
            declared,
            found: found.to_string(),
            differs,
            fix,
        })
    };
    match program {
        Program::Vllm => {
            let differs = vllm_differences(declared.vllm, version);
            if differs.is_empty() {
                return Ok(());
            }
            Err(disagreement(
                &declared.engine_environment,
                declared.vllm.to_string(),
                format!("they differ in {}", differs.join(", ")),
                format!("to \"{version}\", or install vLLM {} there", declared.vllm),
            ))
        }
        Program::Harbor => {
            let Ok((dialect, Some(_))) = HarborDialect::from_declared(&declared.harbor) else { return Ok(()) };
            let found_dialect = harbor_release_dialect(version);
            if found_dialect == Some(dialect) {
                return Ok(());
            }
            if let Some(found_dialect) = found_dialect {
                return Err(disagreement(
                    &declared.harbor_environment,
                    declared.harbor.clone(),
                    format!(
                        "it speaks {}, not {}: Harbor {HARBOR_026} drops trials with an invalid reward from its mean, changed its retry defaults and its job config",
                        found_dialect.as_str(),
                        dialect.as_str()
                    ),
                    format!("to \"{version}\", or install Harbor {} there", declared.harbor),
                ));
            }
            let flavours = HARBOR_FLAVOURS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
            Err(disagreement(
                &declared.harbor_environment,
                declared.harbor.clone(),
                format!(
                    "older than {HARBOR_MIN}: it does not speak the {} dialect the kwargs were written for",
                    dialect.as_str()
                ),
                format!("to the flavour it is ({flavours}), or upgrade it to {HARBOR_MIN} or later"),
            ))
        }
    }
}

/// The fast way to ask an environment which release of `program` it holds: its Python's package
/// metadata (`importlib.metadata`, what pip reports), run as `<dir of the program>/python` — a
/// venv's or conda env's `bin`. It imports nothing of the package: `vllm --version` imports vLLM
/// (≈ 40 s on a loaded node) and fails on a host without a GPU (the login node). The caller checks
/// that the Python exists; otherwise it asks `<program> --version`.
pub fn metadata_query(program: &std::path::Path, which: Program) -> (std::path::PathBuf, Vec<String>) {
    let python = program.parent().unwrap_or(std::path::Path::new("/")).join("python");
    let code = format!("import importlib.metadata as m; print(m.version({:?}))", which.distribution());
    (python, vec!["-c".to_string(), code])
}

/// The last stdout line that is a version (`0.16.0`, `0.25.0.dev3+g1a2b`); libraries may print
/// warnings before it.
pub fn version_line(stdout: &str) -> Option<String> {
    stdout
        .lines()
        .rev()
        .map(str::trim)
        .find(|line| {
            line.chars().next().is_some_and(|c| c.is_ascii_digit())
                && line.contains('.')
                && !line.contains(char::is_whitespace)
                && line.len() <= 64
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_metrics_are_refused_for_every_dialect_with_the_fix() {
        let config =
            serde_json::json!({"metrics": [{"type": "mean"}, {"type": "mean-drop-ei", "kwargs": {}}, {"kwargs": {}}]});
        for dialect in [HarborDialect::Harbor025, HarborDialect::ExtraBodyFork] {
            let problems = job_config_problems(dialect, &config);
            assert_eq!(problems.len(), 1, "{problems:#?}");
            assert!(problems[0].starts_with("metrics[1].type `mean-drop-ei` is not a metric"), "{}", problems[0]);
            assert!(
                problems[0].contains("remove the entry") && problems[0].contains(dialect.as_str()),
                "{}",
                problems[0]
            );
        }
        let fine =
            serde_json::json!({"n_attempts": 3, "metrics": [{"type": "uv-script", "kwargs": {"script": "s.py"}}]});
        assert!(job_config_problems(HarborDialect::ExtraBodyFork, &fine).is_empty());
        assert!(job_config_problems(HarborDialect::ExtraBodyFork, &serde_json::json!({})).is_empty());
        let wrong = job_config_problems(HarborDialect::ExtraBodyFork, &serde_json::json!({"metrics": "mean"}));
        assert!(wrong[0].starts_with("`metrics` must be a list"), "{wrong:?}");
    }

    /// Issue 35: 0.26's job config keys are refused for a Harbor that would ignore them, and
    /// checked for 0.26 as it checks them (tests/tests/harbor_job_schema.rs holds both real Harbors
    /// to these verdicts).
    #[test]
    fn the_job_config_of_each_harbor_release_is_the_one_it_accepts() {
        let for_026 = serde_json::json!({"schema_version": 1, "override_error_policy": {
            "BadRequestError": {"should_retry": true}, "ApiUsageLimitError": {"should_retry": false, "has_valid_reward": null}}});
        assert!(job_config_problems(HarborDialect::Harbor026, &for_026).is_empty());
        for dialect in [HarborDialect::Harbor025, HarborDialect::ExtraBodyFork] {
            let problems = job_config_problems(dialect, &for_026);
            assert_eq!(problems.len(), 2, "{problems:#?}");
            assert!(
                problems[1].starts_with("`override_error_policy` is a Harbor 0.26.0 job config key that the")
                    && problems[1].contains("remove it, or declare harbor \"0.26.0\""),
                "{problems:#?}"
            );
        }
        let bad = serde_json::json!({"schema_version": 2, "override_error_policy": {
            "BadRequestError": {"retry": true, "should_grade": "maybe", "should_retry": "yes"}, "X": true}});
        let problems = job_config_problems(HarborDialect::Harbor026, &bad);
        assert_eq!(
            problems,
            [
                "`schema_version` 2 is not a job config version Harbor 0.26.0 reads: write 1, or remove the key",
                "override_error_policy.BadRequestError.retry is not a field Harbor 0.26.0 knows: use should_retry, should_grade, has_valid_reward",
                "override_error_policy.BadRequestError.should_grade must be true or false",
                "override_error_policy.X must be a mapping of should_retry, should_grade, has_valid_reward to true/false",
            ]
        );
        let list = job_config_problems(HarborDialect::Harbor026, &serde_json::json!({"override_error_policy": []}));
        assert!(list[0].starts_with("`override_error_policy` must be a mapping"), "{list:?}");
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn versions_parse_and_order() {
        assert_eq!("0.33.0".parse::<Version>().unwrap(), Version::new(0, 33, 0));
        assert_eq!("v0.25.0".parse::<Version>().unwrap(), Version::new(0, 25, 0));
        for bad in ["", "0.33", "latest", "0.x.1", "1..2", "1!0.1.0", "0.1.2.3"] {
            assert!(bad.parse::<Version>().is_err(), "{bad}");
        }
        assert!(vllm_has_swap_space("0.17.1".parse().unwrap()));
        assert!(!vllm_has_swap_space("0.18.0".parse().unwrap()));
        assert!(!vllm_has_swap_space(VERIFIED_VLLM));
        assert_eq!(vllm_retired_env(VERIFIED_VLLM).collect::<Vec<_>>(), ["VLLM_USE_V1", "VLLM_ALL2ALL_BACKEND"]);
        assert_eq!(
            vllm_retired_env(Version::new(0, 34, 0)).skip(2).collect::<Vec<_>>(),
            ["VLLM_USE_V2_MODEL_RUNNER", "VLLM_MARLIN_INPUT_DTYPE"]
        );
        let differs = vllm_differences(VERIFIED_VLLM, Version::new(0, 34, 0));
        assert_eq!(differs.len(), 1, "{differs:?}");
        assert_eq!(
            differs[0],
            "the environment variables it knows (VLLM_USE_V2_MODEL_RUNNER, VLLM_MARLIN_INPUT_DTYPE)"
        );
        assert_eq!(vllm_retired_env(Version::new(0, 10, 1)).count(), 0);
    }

    /// Issue 36: PEP 440's suffixes are kept (printed in its normal form) and ordered by its rules;
    /// what a version can do follows its release.
    #[test]
    fn versions_keep_their_pep440_suffixes_and_order_by_pep440() {
        let v = |text: &str| text.parse::<Version>().unwrap();
        for (given, shown) in [
            ("0.11.0rc2", "0.11.0rc2"),
            ("0.11.0-RC.2", "0.11.0rc2"),
            ("0.10.1.post1", "0.10.1.post1"),
            ("0.25.0.dev3+g1a2b", "0.25.0.dev3"),
            ("0.32.0+cpu", "0.32.0"),
            ("1.2.3a1", "1.2.3a1"),
        ] {
            assert_eq!(v(given).to_string(), shown, "{given}");
        }
        let order =
            ["0.11.0.dev1", "0.11.0a1", "0.11.0b2", "0.11.0rc1", "0.11.0rc2", "0.11.0", "0.11.0.post1", "0.11.1"];
        for pair in order.windows(2) {
            assert!(v(pair[0]) < v(pair[1]), "{} < {}", pair[0], pair[1]);
        }
        assert_eq!(v("0.11.0rc2").release(), Version::new(0, 11, 0));
        assert_ne!(v("0.11.0rc2"), Version::new(0, 11, 0));
        // A pre-release of 0.18.0 already lacks --swap-space; a post-release of 0.17.1 still has it.
        assert!(!vllm_has_swap_space(v("0.18.0rc1")) && vllm_has_swap_space(v("0.17.1.post1")));
        // Declared versions keep their suffix through the spec (serde).
        let json = serde_json::to_string(&v("0.11.0rc2")).unwrap();
        assert_eq!(json, "\"0.11.0rc2\"");
        assert_eq!(serde_json::from_str::<Version>(&json).unwrap(), v("0.11.0rc2"));
    }

    #[test]
    fn declared_harbor() {
        assert_eq!(HarborDialect::from_declared("0.25.0").unwrap(), (HarborDialect::Harbor025, Some(VERIFIED_HARBOR)));
        assert_eq!(HarborDialect::from_declared("0.26.0").unwrap(), (HarborDialect::Harbor026, Some(HARBOR_026)));
        assert_eq!(HarborDialect::from_declared("0.27.2").unwrap().0, HarborDialect::Harbor026);
        for dialect in [HarborDialect::Harbor025, HarborDialect::Harbor026] {
            assert!(dialect.has_yes() && dialect.has_print_config() && dialect.parser_kwarg() == "parser_name");
        }
        assert!(HarborDialect::Harbor026.has_error_policy() && !HarborDialect::Harbor025.has_error_policy());
        assert_eq!(
            VERIFIED_HARBORS.iter().map(|v| harbor_release_dialect(*v)).collect::<Vec<_>>(),
            [Some(HarborDialect::Harbor025), Some(HarborDialect::Harbor026)]
        );
        assert_eq!(HarborDialect::from_declared("extra-body-fork").unwrap(), (HarborDialect::ExtraBodyFork, None));
        let old = HarborDialect::from_declared("0.1.9").unwrap_err();
        assert!(old.contains("older than 0.25.0") && old.contains("extra-body-fork"), "{old}");
        assert!(HarborDialect::from_declared("forked").unwrap_err().contains("extra-body-fork"));
    }

    #[test]
    fn thinking_kwarg_takes_the_form_of_harbor_025() {
        thinking_kwarg_takes_the_upstream_form(HarborDialect::Harbor025);
    }

    /// 0.26 speaks 0.25's terminus-2 options: given the fork's `extra_body`, its terminus-2 refuses
    /// the run ("Unknown option 'extra_body'", seen with the real 0.26.0 in
    /// `thinking_model_from_the_registry_reaches_the_model_server_on_harbor_026`).
    #[test]
    fn thinking_kwarg_takes_the_form_of_harbor_025_on_harbor_026() {
        thinking_kwarg_takes_the_upstream_form(HarborDialect::Harbor026);
    }

    fn thinking_kwarg_takes_the_upstream_form(dialect: HarborDialect) {
        let think = r#"extra_body={"chat_template_kwargs":{"enable_thinking":true}}"#;
        let out = translate_agent_kwargs(&s(&["temperature=0.7", think, "parser=xml"]), dialect).unwrap();
        assert_eq!(
            out,
            s(&[
                "temperature=0.7",
                r#"llm_call_kwargs={"extra_body":{"chat_template_kwargs":{"enable_thinking":true}}}"#,
                "parser_name=xml",
            ])
        );
        // Idempotent, and merges with an explicit llm_call_kwargs.
        assert_eq!(translate_agent_kwargs(&out, dialect).unwrap(), out);
        let merged =
            translate_agent_kwargs(&s(&[r#"llm_call_kwargs={"top_k":20}"#, r#"extra_body={"a":1}"#]), dialect).unwrap();
        assert_eq!(merged, s(&[r#"llm_call_kwargs={"top_k":20,"extra_body":{"a":1}}"#]));
        assert!(unknown_terminus2_options(&out, dialect).is_empty());
        assert_eq!(unknown_terminus2_options(&s(&[think]), dialect), ["extra_body"]);
    }

    #[test]
    fn the_fork_gets_the_old_form_back() {
        let new = s(&[r#"llm_call_kwargs={"extra_body":{"x":1}}"#, "parser_name=xml", "temperature=1"]);
        let out = translate_agent_kwargs(&new, HarborDialect::ExtraBodyFork).unwrap();
        assert_eq!(out, s(&[r#"extra_body={"x":1}"#, "parser=xml", "temperature=1"]));
        assert_eq!(translate_agent_kwargs(&out, HarborDialect::ExtraBodyFork).unwrap(), out);
        let err =
            translate_agent_kwargs(&s(&[r#"llm_call_kwargs={"top_k":1}"#]), HarborDialect::ExtraBodyFork).unwrap_err();
        assert!(err.to_string().contains("`top_k`"), "{err}");
        assert!(translate_agent_kwargs(&s(&["extra_body={oops"]), HarborDialect::Harbor025).is_err());
        assert!(translate_agent_kwargs(&s(&["novalue"]), HarborDialect::Harbor025).is_err());
    }

    fn declared(vllm: &str, harbor: &str) -> Declared {
        Declared {
            engine_environment: "otagent".into(),
            vllm: vllm.parse().unwrap(),
            harbor_environment: "otagent".into(),
            harbor: harbor.into(),
        }
    }

    #[test]
    fn a_found_vllm_is_compared_by_its_capabilities() {
        let d = declared("0.16.0", "0.25.0");
        assert_eq!(check_found(&d, "vista", Program::Vllm, "0.17.1"), Ok(()), "same class");
        assert_eq!(check_found(&d, "vista", Program::Vllm, "0.16.0.post1"), Ok(()));
        let err = check_found(&d, "vista", Program::Vllm, "0.33.0").unwrap_err().to_string();
        assert_eq!(
            err,
            "environment `otagent` declares vLLM 0.16.0 but holds vLLM 0.33.0 (they differ in --swap-space (0.16.0 has, 0.33.0 lacks it), --distributed-timeout-seconds (0.16.0 lacks, 0.33.0 has it), the environment variables it knows (VLLM_USE_V1, VLLM_ALL2ALL_BACKEND)): edit `environments.otagent.vllm` in cluster profile `vista` (to \"0.33.0\", or install vLLM 0.16.0 there)"
        );
        let up = check_found(&declared("0.33.0", "0.25.0"), "vista", Program::Vllm, "0.16.0").unwrap_err();
        assert!(up.to_string().contains("to \"0.16.0\""), "{up}");
        // Not a version: nothing to compare (recorded as missing by the caller).
        assert_eq!(check_found(&d, "vista", Program::Vllm, "unknown"), Ok(()));
    }

    /// Issue 33: the CPU build reports `0.32.0+cpu` (PEP 440's local version): the same release as
    /// 0.32.0, declared either way, and compared by its capabilities like any other.
    #[test]
    fn a_local_version_suffix_is_the_same_release() {
        assert_eq!("0.32.0+cpu".parse::<Version>().unwrap(), Version::new(0, 32, 0));
        assert_eq!(version_line("0.32.0+cpu\n").as_deref(), Some("0.32.0+cpu"));
        for declared_as in ["0.32.0", "0.32.0+cpu"] {
            let d = declared(declared_as, "0.25.0");
            assert_eq!(check_found(&d, "local", Program::Vllm, "0.32.0+cpu"), Ok(()), "{declared_as}");
            assert_eq!(check_found(&d, "local", Program::Vllm, "0.32.1+cu128"), Ok(()), "{declared_as}");
            let err = check_found(&d, "local", Program::Vllm, "0.33.0+cpu").unwrap_err().to_string();
            assert!(err.contains("holds vLLM 0.33.0+cpu (they differ in --distributed-timeout-seconds"), "{err}");
        }
    }

    #[test]
    fn a_found_harbor_is_compared_by_its_dialect() {
        let d = declared("0.33.0", "0.25.0");
        assert_eq!(check_found(&d, "c", Program::Harbor, "0.25.3"), Ok(()));
        // Issue 35: 0.26 scores and retries by other rules, so it is another class.
        let newer = check_found(&d, "c", Program::Harbor, "0.26.1").unwrap_err().to_string();
        assert!(
            newer.contains("declares Harbor 0.25.0 but holds Harbor 0.26.1 (it speaks harbor-0.26, not harbor-0.25")
                && newer.ends_with("(to \"0.26.1\", or install Harbor 0.25.0 there)"),
            "{newer}"
        );
        assert_eq!(check_found(&declared("0.33.0", "0.26.0"), "c", Program::Harbor, "0.27.0"), Ok(()));
        let older = check_found(&declared("0.33.0", "0.26.0"), "c", Program::Harbor, "0.25.0").unwrap_err();
        assert!(older.to_string().contains("it speaks harbor-0.25, not harbor-0.26"), "{older}");
        let err = check_found(&d, "c", Program::Harbor, "0.1.9").unwrap_err().to_string();
        assert!(
            err.contains("declares Harbor 0.25.0 but holds Harbor 0.1.9")
                && err.contains("`environments.otagent.harbor`")
                && err.contains("extra-body-fork"),
            "{err}"
        );
        // A flavour names no release: the version is recorded, not compared.
        assert_eq!(check_found(&declared("0.33.0", "extra-body-fork"), "c", Program::Harbor, "0.25.0"), Ok(()));
        assert_eq!(check_found(&declared("0.33.0", "extra-body-fork"), "c", Program::Harbor, "0.1.0"), Ok(()));
    }

    #[test]
    fn the_metadata_query_asks_the_python_beside_the_program() {
        let (python, args) = metadata_query(std::path::Path::new("/e/otagent/bin/vllm"), Program::Vllm);
        assert_eq!(python, std::path::Path::new("/e/otagent/bin/python"));
        assert_eq!(args, ["-c", "import importlib.metadata as m; print(m.version(\"vllm\"))"]);
        assert_eq!(version_line("INFO warn\n0.16.0\n").as_deref(), Some("0.16.0"));
        assert_eq!(version_line("usage: vllm [-h]\n"), None);
    }
}
