//! Names derived from model ids (docs/design.md §4.5): the served model name, the run tag, the job name.

use sha1::{Digest, Sha1};

/// Harbor's `hosted_vllm/<name>` accepts `^[A-Za-z0-9._-]{1,64}$`.
pub(crate) const SERVED_NAME_MAX: usize = 64;
pub(crate) const RUN_TAG_MAX: usize = 96;

fn sha1_hex8(text: &str) -> String {
    let digest = Sha1::digest(text.as_bytes());
    hex::encode(digest)[..8].to_string()
}

fn sanitise(text: &str) -> String {
    text.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '-' }).collect()
}

/// Keeps `text` when it fits, else its first `max - 9` characters + `-` + 8 hex of sha1(`full`).
fn bounded(text: String, max: usize, full: &str) -> String {
    if text.len() <= max {
        return text;
    }
    format!("{}-{}", &text[..max - 9], sha1_hex8(full))
}

/// The canonical served name: the id's basename, sanitised, ≤ 64 chars (hash suffix when longer;
/// 55 chars + `-` + 8 hex as the Leonardo script did). Deterministic.
pub fn served_name(hf_id: &str) -> String {
    let base = hf_id.trim_end_matches('/').rsplit('/').next().unwrap_or(hf_id);
    let name = sanitise(base);
    let name = if name.is_empty() { "model".to_string() } else { name };
    bounded(name, SERVED_NAME_MAX, hf_id)
}

/// Deterministic from (benchmark, model), so a resubmission resumes the same Harbor job dir, and
/// one-to-one: two (benchmark, model) pairs never share a run dir.
///
/// An ordinary `org/name` id keeps the tag it always had, `<benchmark>__<org>__<name>` (the
/// ledger and existing run dirs rely on it): when the benchmark and the org hold no `__`, neither
/// starts nor ends with `_`, the name does not start with `_` and nothing needed sanitising, the
/// tag splits back uniquely at its first two `__`. Every other id (`a__b/c`, a bare name,
/// `provider/org/name`, characters outside `[A-Za-z0-9._-]`) gets a hash of the exact pair as
/// suffix, so `a/b__c-8B` and `a__b/c-8B` differ.
pub fn run_tag(benchmark: &str, hf_id: &str) -> String {
    let raw = format!("{}__{}", benchmark, hf_id.replace('/', "__"));
    let sanitised = sanitise(&raw);
    let plain_part =
        |part: &str| !part.is_empty() && !part.contains("__") && !part.starts_with('_') && !part.ends_with('_');
    let ordinary = sanitised == raw
        && plain_part(benchmark)
        && match hf_id.split_once('/') {
            Some((org, name)) => plain_part(org) && !name.is_empty() && !name.contains('/') && !name.starts_with('_'),
            None => false,
        };
    if ordinary {
        return bounded(sanitised, RUN_TAG_MAX, &raw);
    }
    // The hash covers the pair with a separator no id or benchmark holds, so it tells apart every
    // pair the readable part confuses.
    let stem: String = sanitised.chars().take(RUN_TAG_MAX - 9).collect();
    format!("{stem}-{}", sha1_hex8(&format!("{benchmark}\n{hf_id}")))
}

/// The run tag of an eval (model, benchmark, Harbor agent): [`run_tag`] for the default agent (so
/// existing run dirs keep their tags), else that with the agent and 8 hex of a hash of all three
/// appended, so two harnesses of one model and benchmark never share a run dir.
pub(crate) fn eval_run_tag(benchmark: &str, hf_id: &str, agent: &str) -> String {
    let tag = run_tag(benchmark, hf_id);
    if agent == launch_spec::spec::DEFAULT_AGENT {
        return tag;
    }
    format!("{tag}-{}-{}", sanitise(agent), sha1_hex8(&format!("{benchmark}\n{hf_id}\nagent {agent}")))
}

/// The run tag of a pair's fresh re-evaluation, its `attempt`-th attempt (docs/decisions.md, "A
/// re-evaluation is a new run"): the pair's tag, `-r<attempt>`, and 8 hex of a hash of both, so
/// it names a run dir of its own and equals no pair's first tag (a model whose name ends in `-r2`
/// does not end in this hash).
pub(crate) fn attempt_run_tag(pair_tag: &str, attempt: u32) -> String {
    format!("{pair_tag}-r{attempt}-{}", sha1_hex8(&format!("{pair_tag}\nattempt {attempt}")))
}

/// The group tag of a shared job (issue 24; `launch_spec::shared`): `<model run-tag stem>-shared-<8 hex>`,
/// the hash over `key` (the legs and their submissions), so each shared submission has a group
/// dir of its own and the same plan names the same dir.
pub(crate) fn shared_group_tag(hf_id: &str, key: &str) -> String {
    let stem = sanitise(&hf_id.replace('/', "__"));
    let stem: String = stem.chars().take(RUN_TAG_MAX - 16).collect();
    format!("{stem}-shared-{}", sha1_hex8(&format!("{hf_id}\nshared {key}")))
}

/// A pool's group tag (issue 37): `<first model>-pool-<8 hex of its legs>`, like a shared job's.
pub(crate) fn pool_group_tag(hf_id: &str, key: &str) -> String {
    let stem = sanitise(&hf_id.replace('/', "__"));
    let stem: String = stem.chars().take(RUN_TAG_MAX - 16).collect();
    format!("{stem}-pool-{}", sha1_hex8(&format!("{hf_id}\npool {key}")))
}

/// Short, human-readable Slurm job name: `<benchmark short tag>_<model basename[:28]>`.
pub fn job_name(benchmark_short: &str, hf_id: &str) -> String {
    let base: String = served_name(hf_id).chars().take(28).collect();
    format!("{benchmark_short}_{base}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_group_tags_name_the_model_and_differ_by_key() {
        let a = shared_group_tag("Qwen/Qwen3-8B", "legs 1");
        assert!(a.starts_with("Qwen__Qwen3-8B-shared-") && a.len() == "Qwen__Qwen3-8B-shared-".len() + 8, "{a}");
        assert_ne!(a, shared_group_tag("Qwen/Qwen3-8B", "legs 2"));
        assert_eq!(a, shared_group_tag("Qwen/Qwen3-8B", "legs 1"));
        assert!(shared_group_tag(&format!("org/{}", "x".repeat(200)), "k").len() <= RUN_TAG_MAX);
    }

    #[test]
    fn served_name_is_basename_and_bounded() {
        assert_eq!(served_name("Qwen/Qwen3-8B"), "Qwen3-8B");
        let long = format!("org/{}", "x".repeat(80));
        let name = served_name(&long);
        assert_eq!(name.len(), 64);
        assert_eq!(&name[..55], &"x".repeat(55));
        assert!(name[56..].chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(served_name(&long), name, "deterministic");
        assert_ne!(served_name(&format!("other/{}", "x".repeat(80))), name, "hash of the full id");
        assert_eq!(served_name("a/b c:d"), "b-c-d");
    }

    #[test]
    fn run_tags_are_one_to_one() {
        let pairs = [
            ("terminal_bench_2", "a/b__c-8B"),
            ("terminal_bench_2", "a__b/c-8B"),
            ("terminal_bench_2", "Qwen/Qwen3 8B"),
            ("terminal_bench_2", "Qwen/Qwen3-8B"),
            ("terminal_bench_2", "Qwen/Qwen3:8B"),
            ("terminal_bench_2", "x/y"),
            ("terminal_bench_2", "x__y"),
            ("terminal_bench_2__x", "y/z"),
            ("terminal_bench_2", "x/y/z"),
            ("terminal_bench_2", "x/y__z"),
            ("terminal_bench_2", "x_/y"),
            ("terminal_bench_2", "x/_y"),
            ("t", "."),
            ("t", ".."),
        ];
        let mut seen = std::collections::HashMap::new();
        for (benchmark, id) in pairs {
            let tag = run_tag(benchmark, id);
            assert!(tag != "." && tag != ".." && tag.len() <= RUN_TAG_MAX, "{tag}");
            assert!(tag.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)), "{tag}");
            if let Some(other) = seen.insert(tag.clone(), (benchmark, id)) {
                panic!("{other:?} and {:?} share run tag {tag}", (benchmark, id));
            }
        }
        // Ordinary ids keep the tags the ledger and old run dirs have.
        assert_eq!(
            run_tag("terminal_bench_2", "laion/Sera-4.5A-Full-T1-v2-1000__Qwen3-8B"),
            "terminal_bench_2__laion__Sera-4.5A-Full-T1-v2-1000__Qwen3-8B"
        );
        assert_eq!(
            run_tag("dev_set_v2", "DCAgent/g1_top8_diverse_3160_32b__Qwen3-32B"),
            "dev_set_v2__DCAgent__g1_top8_diverse_3160_32b__Qwen3-32B"
        );
    }

    #[test]
    fn each_harness_has_a_tag_of_its_own() {
        let terminus = eval_run_tag("terminal_bench_2", "Qwen/Qwen3-8B", "terminus-2");
        assert_eq!(terminus, run_tag("terminal_bench_2", "Qwen/Qwen3-8B"), "existing tags are kept");
        let openhands = eval_run_tag("terminal_bench_2", "Qwen/Qwen3-8B", "openhands");
        assert!(openhands.starts_with(&format!("{terminus}-openhands-")), "{openhands}");
        assert_ne!(openhands, eval_run_tag("terminal_bench_2", "Qwen/Qwen3-8B", "openhands2"));
    }

    #[test]
    fn a_re_evaluation_has_a_tag_of_its_own() {
        let first = run_tag("terminal_bench_2", "Qwen/Qwen3-8B");
        let second = attempt_run_tag(&first, 2);
        assert!(second.starts_with(&format!("{first}-r2-")) && second.len() == first.len() + 12, "{second}");
        assert_ne!(second, attempt_run_tag(&first, 3));
        assert_ne!(second, run_tag("terminal_bench_2", "Qwen/Qwen3-8B-r2"));
    }

    #[test]
    fn run_tag_is_sanitised_deterministic_and_bounded() {
        let tag = run_tag("terminal_bench_2", "Qwen/Qwen3-8B");
        assert_eq!(tag, "terminal_bench_2__Qwen__Qwen3-8B");
        let long = run_tag("dev_set_v2", &format!("laion/{}", "y".repeat(200)));
        assert_eq!(long.len(), RUN_TAG_MAX);
        assert!(long.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)));
    }
}
