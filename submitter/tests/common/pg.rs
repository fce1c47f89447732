//! Where the tests and benchmarks find the local test PostgreSQL. Shared by `tests/it`,
//! `tests/ledger_down.rs` and the benches through `#[path]`, since they are separate crates.
//!
//! The URL carries a password, so it is never written in the source: `$EVAL_TEST_PG_URL` when set,
//! else the `EVAL_TEST_PG_URL=` line of the 0600 secrets file `scripts/services.sh up` writes
//! (`$EVALCI_SECRETS_FILE`, default `/etc/evalci/secrets.env`).

/// The test PostgreSQL URL, or `None` when neither the variable nor the secrets file provides one.
pub(crate) fn test_pg_url() -> Option<String> {
    if let Ok(url) = std::env::var("EVAL_TEST_PG_URL") {
        return Some(url);
    }
    let file = std::env::var("EVALCI_SECRETS_FILE").unwrap_or_else(|_| "/etc/evalci/secrets.env".to_string());
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|line| line.strip_prefix("EVAL_TEST_PG_URL=")).map(|url| url.trim().to_string())
}

/// A password for tests that check a password never reaches an error message: the test role's own
/// (from [`test_pg_url`], so the real secret is what the assertion guards), else one generated for
/// this process. Never a literal in the source.
#[allow(dead_code)] // not every crate that includes this file uses it
pub(crate) fn test_password() -> String {
    let from_url = test_pg_url().and_then(|url| {
        let authority = url.split_once("://")?.1.split('/').next()?.to_string();
        let userinfo = authority.rsplit_once('@')?.0.to_string();
        Some(userinfo.split_once(':')?.1.to_string()).filter(|p| !p.is_empty())
    });
    from_url.unwrap_or_else(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        format!("gen{:016x}", hasher.finish())
    })
}
