//! The tunnels' end-to-end checks, in-process with reqwest (rustls for the HTTPS public URL and
//! `verify_url`; its `socks` feature for `socks5h://`, so names resolve on the login node):
//!
//! - Pinggy: `GET <public url>/v1/models` with the per-job key must answer 200 and list the served
//!   name — through the public internet, Pinggy, the ssh session and back to vLLM (through the
//!   egress proxy when the node has no internet);
//! - SOCKS: one `GET <verify_url>` through the proxy must get an HTTP answer (any status: the
//!   proxy carried it).
//!
//! The key goes in a header of a request in this process: never in any argv.

use std::time::Duration;

use super::machine::Check;

/// One check's timeout.
pub(crate) const VERIFY_TIMEOUT: Duration = Duration::from_secs(10);

fn client(via_socks: Option<u16>, timeout: Duration) -> Result<reqwest::Client, String> {
    crate::tls::init();
    let mut builder = reqwest::Client::builder().timeout(timeout).connect_timeout(timeout).no_proxy();
    if let Some(port) = via_socks {
        let proxy = reqwest::Proxy::all(format!("socks5h://127.0.0.1:{port}")).map_err(|e| e.to_string())?;
        builder = builder.proxy(proxy);
    }
    builder.build().map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// The error chain in one line (reqwest's top-level message alone says "error sending request").
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// Runs `check`; `Ok(summary)` when it passed. `api_key` authorises the Pinggy check.
pub(crate) async fn run(check: &Check, api_key: Option<&str>, timeout: Duration) -> Result<String, String> {
    match check {
        Check::Socks { port, url } => {
            let client = client(Some(*port), timeout)?;
            let answer = client
                .get(url)
                .send()
                .await
                .map_err(|e| format!("GET {url} through socks5h://127.0.0.1:{port}: {}", chain(&e)))?;
            Ok(format!("GET {url} through socks5h://127.0.0.1:{port}: HTTP {}", answer.status().as_u16()))
        }
        Check::Models { public_url, served_name, via_socks } => {
            let url = models_url(public_url).ok_or_else(|| format!("{public_url} is not an http(s) URL"))?;
            let client = client(*via_socks, timeout)?;
            let mut request = client.get(url.clone());
            if let Some(key) = api_key {
                request = request.bearer_auth(key);
            }
            let answer = request.send().await.map_err(|e| format!("GET {url}: {}", chain(&e)))?;
            let status = answer.status();
            let body = answer.text().await.map_err(|e| format!("GET {url}: {}", chain(&e)))?;
            if !status.is_success() {
                let snippet: String = body.chars().take(120).collect();
                return Err(format!("GET {url}: HTTP {} {snippet}", status.as_u16()));
            }
            let listed = serde_json::from_str::<serde_json::Value>(&body)
                .is_ok_and(|v| crate::engine::models_list(&v, served_name));
            if listed {
                Ok(format!("GET {url}: 200, lists {served_name}"))
            } else {
                Err(format!("GET {url}: 200 but {served_name} is not listed (another server behind this URL?)"))
            }
        }
    }
}

/// `<public url>/v1/models`, keeping any path the public URL has.
pub(crate) fn models_url(public_url: &str) -> Option<url::Url> {
    let mut url = url::Url::parse(public_url).ok().filter(|u| matches!(u.scheme(), "http" | "https"))?;
    let path = format!("{}/v1/models", url.path().trim_end_matches('/'));
    url.set_path(&path);
    Some(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_url_keeps_the_base() {
        assert_eq!(models_url("https://a.a.pinggy.link").unwrap().as_str(), "https://a.a.pinggy.link/v1/models");
        assert_eq!(models_url("http://127.0.0.1:4711/").unwrap().as_str(), "http://127.0.0.1:4711/v1/models");
        assert_eq!(models_url("https://h/base/").unwrap().as_str(), "https://h/base/v1/models");
        assert!(models_url("ftp://h").is_none());
        assert!(models_url("not a url").is_none());
    }

    /// A local HTTP server answering `/v1/models`: the check passes, fails on another name, and
    /// fails on a refused port — the same client code the tunnels use.
    #[tokio::test(flavor = "current_thread")]
    async fn models_check_against_a_local_server() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = server.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut c, _) = server.accept().await.unwrap();
                let mut buf = [0u8; 2048];
                let n = c.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
                let (code, body) = if request.contains("authorization: bearer k1") {
                    ("200 OK", r#"{"object":"list","data":[{"id":"Qwen3-8B","object":"model"}]}"#)
                } else {
                    ("401 Unauthorized", r#"{"error":"no key"}"#)
                };
                let answer =
                    format!("HTTP/1.1 {code}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                let _ = c.write_all(answer.as_bytes()).await;
            }
        });
        let check = |name: &str| Check::Models {
            public_url: format!("http://127.0.0.1:{port}"),
            served_name: name.into(),
            via_socks: None,
        };
        let t = Duration::from_secs(5);
        assert!(run(&check("Qwen3-8B"), Some("k1"), t).await.unwrap().contains("200, lists Qwen3-8B"));
        assert!(run(&check("Qwen3-8B"), None, t).await.unwrap_err().contains("HTTP 401"));
        assert!(run(&check("other"), Some("k1"), t).await.unwrap_err().contains("not listed"));
        let refused =
            Check::Models { public_url: "http://127.0.0.1:1".into(), served_name: "x".into(), via_socks: None };
        assert!(run(&refused, None, t).await.is_err());
    }
}
