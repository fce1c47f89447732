//! The JSON document both programs print for a machine (`submitter … --format json`, `payload plan
//! --json`, `payload gpus --json`): an object whose first keys are `format_version` ([`FORMAT_VERSION`])
//! and `kind` (which document, e.g. `"registry.resolve"`, `"payload.plan"`), then the fields of the
//! command's output type. `format_version` goes up when a field is removed, renamed or changes
//! meaning; adding a field does not change it (docs/design.md §11).

use serde::Serialize;

/// The version of every JSON document `submitter` and `payload` print.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Serialize)]
struct Document<'a, T: Serialize> {
    format_version: u32,
    kind: &'a str,
    #[serde(flatten)]
    body: &'a T,
}

/// `body` (a struct or map of output fields) as a pretty JSON document of `kind`, newline-terminated.
pub fn document<T: Serialize>(kind: &str, body: &T) -> String {
    let doc = Document { format_version: FORMAT_VERSION, kind, body };
    // Output types are plain data (strings, numbers, maps with string keys): they always serialise.
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}

/// `body` as one compact JSON document of `kind` on one line (a repeating command's stream).
pub fn document_line<T: Serialize>(kind: &str, body: &T) -> String {
    let doc = Document { format_version: FORMAT_VERSION, kind, body };
    let mut text = serde_json::to_string(&doc).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_lead_with_version_and_kind() {
        #[derive(Serialize)]
        struct Body {
            rows: Vec<u32>,
        }
        let text = document("test.kind", &Body { rows: vec![1] });
        assert!(text.starts_with("{\n  \"format_version\": 1,\n  \"kind\": \"test.kind\",\n  \"rows\""), "{text}");
        assert!(text.ends_with("}\n"));
        assert_eq!(document_line("k", &Body { rows: vec![] }), "{\"format_version\":1,\"kind\":\"k\",\"rows\":[]}\n");
    }
}
