//! The SOCKS egress side: the check that the proxy really carries a request, the proxy environment
//! for Harbor, and the proxychains config.
//!
//! The check is a small hand-written SOCKS5 client (RFC 1928: no-auth greeting, CONNECT by domain
//! name so the *login node* resolves it, as `socks5h://` does). Hand-written because the workspace's
//! reqwest is built without its `socks` and TLS features and adding them would pull a new dependency
//! tree onto every cluster build for ~60 lines of protocol; nothing else here needs them.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Loopback and private ranges: never through the proxy (the agent's `api_base` is loopback).
pub const NO_PROXY_BASE: &[&str] = &[
    "localhost",
    "127.0.0.1",
    "::1",
    "127.0.0.0/8",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
];

/// `(scheme, host, port, path)` of an http(s) URL.
pub fn parse_url(url: &str) -> Option<(&str, String, u16, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let default_port = match scheme {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    let authority = authority.rsplit_once('@').map(|(_, a)| a).unwrap_or(authority);
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, tail) = v6.split_once(']')?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => default_port,
        };
        (h.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().ok()?),
            None => (authority.to_string(), default_port),
        }
    };
    if host.is_empty() {
        return None;
    }
    Some((scheme, host, port, path))
}

fn reply_text(code: u8) -> &'static str {
    match code {
        1 => "general SOCKS server failure",
        2 => "connection not allowed by ruleset",
        3 => "network unreachable",
        4 => "host unreachable",
        5 => "connection refused",
        6 => "TTL expired",
        7 => "command not supported",
        8 => "address type not supported",
        _ => "unknown reply",
    }
}

/// Opens a CONNECT to `host:port` through the SOCKS5 proxy on `127.0.0.1:proxy_port`.
pub async fn connect(proxy_port: u16, host: &str, port: u16) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(("127.0.0.1", proxy_port))
        .await
        .map_err(|e| format!("proxy 127.0.0.1:{proxy_port}: {e}"))?;
    s.write_all(&[5, 1, 0]).await.map_err(|e| format!("SOCKS greeting: {e}"))?;
    let mut hello = [0u8; 2];
    s.read_exact(&mut hello).await.map_err(|e| format!("SOCKS greeting reply: {e}"))?;
    if hello != [5, 0] {
        return Err(format!("SOCKS server refused no-auth (reply {hello:?})"));
    }
    let mut req = vec![5, 1, 0];
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(ip)) => {
            req.push(1);
            req.extend(ip.octets());
        }
        Ok(std::net::IpAddr::V6(ip)) => {
            req.push(4);
            req.extend(ip.octets());
        }
        Err(_) => {
            let name = host.as_bytes();
            if name.len() > 255 {
                return Err("host name too long for SOCKS5".into());
            }
            req.push(3);
            req.push(name.len() as u8);
            req.extend(name);
        }
    }
    req.extend(port.to_be_bytes());
    s.write_all(&req).await.map_err(|e| format!("SOCKS CONNECT: {e}"))?;
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await.map_err(|e| format!("SOCKS CONNECT reply: {e}"))?;
    if head[1] != 0 {
        return Err(format!("SOCKS CONNECT to {host}:{port} failed: {} (code {})", reply_text(head[1]), head[1]));
    }
    let addr_len = match head[3] {
        1 => 4,
        4 => 16,
        3 => {
            let mut n = [0u8; 1];
            s.read_exact(&mut n).await.map_err(|e| format!("SOCKS reply: {e}"))?;
            usize::from(n[0])
        }
        other => return Err(format!("SOCKS reply with address type {other}")),
    };
    let mut rest = vec![0u8; addr_len + 2];
    s.read_exact(&mut rest).await.map_err(|e| format!("SOCKS reply: {e}"))?;
    Ok(s)
}

/// One request through the proxy: CONNECT to the URL's host and port; for `http://` also a GET
/// whose answer must start with an HTTP status line. Returns a one-line summary.
pub async fn check(proxy_port: u16, url: &str, timeout: Duration) -> Result<String, String> {
    let (scheme, host, port, path) = parse_url(url).ok_or_else(|| format!("cannot parse {url}"))?;
    let work = async {
        let mut s = connect(proxy_port, &host, port).await?;
        if scheme == "https" {
            return Ok(format!("SOCKS5 CONNECT {host}:{port} through 127.0.0.1:{proxy_port} succeeded"));
        }
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: payload-tunnel-check\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.map_err(|e| format!("HTTP request through the proxy: {e}"))?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).await.map_err(|e| format!("HTTP answer through the proxy: {e}"))?;
        let line = line.trim_end();
        if line.starts_with("HTTP/") {
            Ok(format!("GET {url} through 127.0.0.1:{proxy_port}: {line}"))
        } else {
            Err(format!("GET {url} through the proxy: no HTTP status line (got {line:?})"))
        }
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| format!("no answer through the proxy within {timeout:?}"))?
}

/// The proxy variables for Harbor (`env` mode): upper and lower case, since tools disagree.
pub fn proxy_env(port: u16, extra_no_proxy: &[String]) -> BTreeMap<String, String> {
    let proxy = format!("socks5h://127.0.0.1:{port}");
    let no_proxy =
        NO_PROXY_BASE.iter().map(|s| s.to_string()).chain(extra_no_proxy.iter().cloned()).collect::<Vec<_>>().join(",");
    let mut env = BTreeMap::new();
    for name in ["ALL_PROXY", "HTTPS_PROXY", "HTTP_PROXY"] {
        env.insert(name.to_string(), proxy.clone());
        env.insert(name.to_ascii_lowercase(), proxy.clone());
    }
    env.insert("NO_PROXY".to_string(), no_proxy.clone());
    env.insert("no_proxy".to_string(), no_proxy);
    env
}

/// The proxychains(-ng) config: strict chain through our SOCKS port; loopback, private and
/// link-local ranges stay local; names are resolved on the far side (`proxy_dns`).
pub fn proxychains_conf(port: u16) -> String {
    format!(
        "# Generated by payload for one run; removed at teardown.\n\
         strict_chain\n\
         proxy_dns\n\
         remote_dns_subnet 224\n\
         tcp_read_time_out 30000\n\
         tcp_connect_time_out 15000\n\
         localnet 127.0.0.0/255.0.0.0\n\
         localnet 10.0.0.0/255.0.0.0\n\
         localnet 172.16.0.0/255.240.0.0\n\
         localnet 192.168.0.0/255.255.0.0\n\
         localnet 169.254.0.0/255.255.0.0\n\
         [ProxyList]\n\
         socks5 127.0.0.1 {port}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(parse_url("https://huggingface.co/"), Some(("https", "huggingface.co".into(), 443, "/".into())));
        assert_eq!(
            parse_url("http://127.0.0.1:8080/ok?x=1"),
            Some(("http", "127.0.0.1".into(), 8080, "/ok?x=1".into()))
        );
        assert_eq!(parse_url("http://[::1]:81"), Some(("http", "::1".into(), 81, "/".into())));
        assert_eq!(parse_url("ftp://x"), None);
        assert_eq!(parse_url("http://:80/"), None);
    }

    #[test]
    fn env_and_conf() {
        let env = proxy_env(40123, &["cluster.local".into()]);
        assert_eq!(env["ALL_PROXY"], "socks5h://127.0.0.1:40123");
        assert_eq!(env["https_proxy"], "socks5h://127.0.0.1:40123");
        assert!(env["NO_PROXY"].starts_with("localhost,127.0.0.1,::1,"));
        assert!(env["no_proxy"].ends_with(",cluster.local"));
        let conf = proxychains_conf(40123);
        assert!(conf.contains("\nstrict_chain\n"));
        assert!(conf.contains("\nlocalnet 127.0.0.0/255.0.0.0\n"));
        assert!(conf.contains("\nlocalnet 172.16.0.0/255.240.0.0\n"));
        assert!(conf.ends_with("[ProxyList]\nsocks5 127.0.0.1 40123\n"));
    }

    /// A minimal in-process SOCKS5 server (no auth, CONNECT) in front of a one-shot HTTP server.
    #[tokio::test(flavor = "current_thread")]
    async fn check_goes_through_a_socks5_server() {
        use tokio::net::TcpListener;
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http_port = http.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut c, _) = http.accept().await.unwrap();
            let mut buf = [0u8; 512];
            let _ = c.read(&mut buf).await;
            let _ = c.write_all(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n").await;
        });
        let socks = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socks_port = socks.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut c, _) = socks.accept().await.unwrap();
                let mut hello = [0u8; 3];
                c.read_exact(&mut hello).await.unwrap();
                c.write_all(&[5, 0]).await.unwrap();
                let mut head = [0u8; 4];
                c.read_exact(&mut head).await.unwrap();
                assert_eq!(head[3], 1, "an IP literal goes as ATYP 1");
                let mut addr = [0u8; 6];
                c.read_exact(&mut addr).await.unwrap();
                let port = u16::from_be_bytes([addr[4], addr[5]]);
                match TcpStream::connect(("127.0.0.1", port)).await {
                    Ok(mut up) => {
                        c.write_all(&[5, 0, 0, 1, 127, 0, 0, 1, 0, 0]).await.unwrap();
                        let _ = tokio::io::copy_bidirectional(&mut c, &mut up).await;
                    }
                    Err(_) => c.write_all(&[5, 5, 0, 1, 0, 0, 0, 0, 0, 0]).await.unwrap(),
                }
            }
        });
        let summary =
            check(socks_port, &format!("http://127.0.0.1:{http_port}/x"), Duration::from_secs(5)).await.unwrap();
        assert!(summary.contains("HTTP/1.1 204"), "{summary}");
        let refused = check(socks_port, "http://127.0.0.1:1/", Duration::from_secs(2)).await.unwrap_err();
        assert!(refused.contains("connection refused (code 5)"), "{refused}");
    }
}
