//! Names derived from model ids (SPEC §4.5): the served model name, the run tag, the job name.

use sha1::{Digest, Sha1};

/// Harbor's `hosted_vllm/<name>` accepts `^[A-Za-z0-9._-]{1,64}$`.
pub const SERVED_NAME_MAX: usize = 64;
pub const RUN_TAG_MAX: usize = 96;

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

/// Deterministic from (benchmark, model), so a resubmission resumes the same Harbor job dir.
pub fn run_tag(benchmark: &str, hf_id: &str) -> String {
    let raw = format!("{}__{}", benchmark, hf_id.replace('/', "__"));
    bounded(sanitise(&raw), RUN_TAG_MAX, &raw)
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
    fn run_tag_is_sanitised_deterministic_and_bounded() {
        let tag = run_tag("terminal_bench_2", "Qwen/Qwen3-8B");
        assert_eq!(tag, "terminal_bench_2__Qwen__Qwen3-8B");
        let long = run_tag("dev_set_v2", &format!("laion/{}", "y".repeat(200)));
        assert_eq!(long.len(), RUN_TAG_MAX);
        assert!(long.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)));
    }
}
