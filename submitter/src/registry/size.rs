//! Size tokens in model ids (docs/design.md §4.2), scanned by hand.
//!
//! The replaced system used `(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)\s*[bB](?![A-Za-z0-9])` (and the same
//! with a leading `[Aa]` for the active size). The `regex` crate has no look-around, and a
//! backtracking engine is a heavy dependency for this: the scanner below is small and faster.
//! The grammar is deterministic: a shorter digit run or dropping the decimal part can never make
//! a failed match succeed, because the next character would then be a digit or `.`.

/// Largest total size in billions of parameters (`Qwen3-30B-A3B` → 30), if any.
pub(crate) fn total_size(id: &str) -> Option<f64> {
    scan(id, false)
}

#[cfg(test)] // used only by the tests
/// Largest active size (`Qwen3-30B-A3B` → 3), if any.
pub(crate) fn active_size(id: &str) -> Option<f64> {
    scan(id, true)
}

/// Bytes per weight the id's quantisation tag implies (`-FP8` → 1, `-AWQ`/`-GPTQ`/`-Int4` → 0.5),
/// else 2 (bf16/fp16). Used only to judge whether weights fit (`registry check`).
pub(crate) fn bytes_per_parameter(id: &str) -> f64 {
    let lower = id.to_ascii_lowercase();
    let tokens: Vec<&str> = lower.split(|c: char| !c.is_ascii_alphanumeric()).collect();
    let has = |names: &[&str]| tokens.iter().any(|t| names.contains(t));
    if has(&["awq", "gptq", "int4", "w4a16", "4bit", "nvfp4", "mxfp4", "fp4"]) {
        0.5
    } else if has(&["fp8", "int8", "w8a8", "8bit"]) {
        1.0
    } else {
        2.0
    }
}

fn blocks_before(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '.'
}

fn scan(id: &str, active: bool) -> Option<f64> {
    let chars: Vec<char> = id.chars().collect();
    let mut best: Option<f64> = None;
    for start in 0..chars.len() {
        // With `active`, the token starts with `A`/`a`; the look-behind applies before it.
        let (prefix_ok, number_start) =
            if active { (matches!(chars[start], 'A' | 'a'), start + 1) } else { (true, start) };
        if !prefix_ok || (start > 0 && blocks_before(chars[start - 1])) {
            continue;
        }
        if let Some(value) = number_then_b(&chars, number_start) {
            best = Some(best.map_or(value, |b: f64| b.max(value)));
        }
    }
    best
}

/// Parses `\d+(\.\d+)?\s*[bB]` at `pos`, followed by a non-alphanumeric or the end.
fn number_then_b(chars: &[char], pos: usize) -> Option<f64> {
    let digits_end = |from: usize| {
        let mut i = from;
        while i < chars.len() && chars[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    let int_end = digits_end(pos);
    if int_end == pos {
        return None;
    }
    let mut end = int_end;
    if end + 1 < chars.len() && chars[end] == '.' && chars[end + 1].is_ascii_digit() {
        end = digits_end(end + 1);
    }
    let number: String = chars[pos..end].iter().collect();
    let mut i = end;
    while i < chars.len() && chars[i].is_whitespace() {
        i += 1;
    }
    if i >= chars.len() || !matches!(chars[i], 'b' | 'B') {
        return None;
    }
    if i + 1 < chars.len() && chars[i + 1].is_ascii_alphanumeric() {
        return None;
    }
    number.parse().ok()
}

#[cfg(test)]
mod tests {

    #[test]
    fn bytes_per_parameter_follows_the_quantisation_tag() {
        assert_eq!(bytes_per_parameter("Qwen/Qwen3-235B-A22B-Instruct-2507"), 2.0);
        assert_eq!(bytes_per_parameter("Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"), 1.0);
        assert_eq!(bytes_per_parameter("Qwen/Qwen2.5-72B-Instruct-AWQ"), 0.5);
        assert_eq!(bytes_per_parameter("org/fp8fan-7B"), 2.0, "a tag is a whole token");
    }

    use super::*;

    #[test]
    fn table_from_the_replaced_system() {
        let cases: &[(&str, Option<f64>, Option<f64>)] = &[
            ("Qwen3-30B-A3B", Some(30.0), Some(3.0)),
            ("Qwen2.5-7B", Some(7.0), None),
            ("Llama-3.1-70B", Some(70.0), None),
            ("model_8B", Some(8.0), None),
            ("model-8b", Some(8.0), None),
            ("Foo-8 B", Some(8.0), None),
            ("Foo-A3B", None, Some(3.0)),
            ("Foo-8B-32B-merge", Some(32.0), None),
            ("Qwen3-8Bx", None, None),
            ("Qwen38B", None, None),
            ("Mixtral-8x7B", None, None),
            ("Foo-v1.5B", None, None),
            ("Qwen2.5-1.5B-Instruct", Some(1.5), None),
            ("Qwen3-235B-A22B", Some(235.0), Some(22.0)),
            ("a3b", None, Some(3.0)),
            ("", None, None),
        ];
        for (id, total, active) in cases {
            assert_eq!(total_size(id), *total, "total of {id}");
            assert_eq!(active_size(id), *active, "active of {id}");
        }
    }
}
