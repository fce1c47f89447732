//! The end-to-end check of a reverse tunnel: `GET <public url>/v1/models` must answer 200 and list
//! the served name — through the public internet, Pinggy, the ssh session and back to vLLM.
//!
//! It runs `curl` (present on every cluster node) because the public URL is HTTPS and payload's HTTP
//! client is built without TLS. The URL and the `Authorization` header go to curl on its standard
//! input (`--config -`), so the per-job API key never appears in curl's argv.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// curl's config-file string quoting.
fn quote(value: &str) -> String {
    let mut s = String::from("\"");
    for c in value.chars() {
        match c {
            '"' | '\\' => {
                s.push('\\');
                s.push(c);
            }
            '\n' | '\r' => {}
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// The config curl reads from stdin.
pub fn curl_config(url: &str, api_key: Option<&str>) -> String {
    let mut c = format!("url = {}\nwrite-out = \"\\n%{{http_code}}\"\n", quote(url));
    if let Some(key) = api_key {
        c.push_str(&format!("header = {}\n", quote(&format!("Authorization: Bearer {key}"))));
    }
    c
}

/// `GET <public_url>/v1/models` through curl; `Ok(summary)` when it is 200 and lists `served_name`.
pub async fn models(
    program: &Path,
    env: &BTreeMap<String, String>,
    public_url: &str,
    api_key: Option<&str>,
    served_name: &str,
    timeout: Duration,
) -> Result<String, String> {
    let url = format!("{}/v1/models", public_url.trim_end_matches('/'));
    let secs = timeout.as_secs_f64().max(1.0);
    let mut child = Command::new(program)
        .args(["--silent", "--show-error", "--max-time", &format!("{secs:.0}"), "--config", "-"])
        .env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(curl_config(&url, api_key).as_bytes()).await;
    }
    let out = tokio::time::timeout(timeout + Duration::from_secs(5), child.wait_with_output())
        .await
        .map_err(|_| format!("GET {url}: no answer within {timeout:?}"))?
        .map_err(|e| format!("GET {url}: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let err = err.lines().next().unwrap_or("").trim();
        return Err(format!("GET {url}: curl exit {}: {err}", out.status.code().unwrap_or(-1)));
    }
    let (body, code) = stdout.rsplit_once('\n').unwrap_or(("", stdout.as_ref()));
    let code = code.trim();
    if code != "200" {
        let snippet: String = body.chars().take(120).collect();
        return Err(format!("GET {url}: HTTP {code} {snippet}"));
    }
    let listed =
        serde_json::from_str::<serde_json::Value>(body).is_ok_and(|v| crate::engine::models_list(&v, served_name));
    if listed {
        Ok(format!("GET {url}: 200, lists {served_name}"))
    } else {
        Err(format!("GET {url}: 200 but {served_name} is not listed (another server behind this URL?)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_quotes_and_carries_the_key_off_argv() {
        let c = curl_config("https://a.a.pinggy.link/v1/models", Some("k\"1"));
        assert_eq!(
            c,
            "url = \"https://a.a.pinggy.link/v1/models\"\nwrite-out = \"\\n%{http_code}\"\nheader = \"Authorization: Bearer k\\\"1\"\n"
        );
        assert!(!curl_config("http://x", None).contains("header"));
    }
}
