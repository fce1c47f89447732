//! Where the tests and benchmarks find the local test PostgreSQL. Shared by `tests/it`,
//! `tests/ledger_down.rs` and the benches through `#[path]`, since they are separate crates.
//!
//! The URL carries a password, so it is never written in the source: `$EVAL_TEST_PG_URL` when set,
//! else the `EVAL_TEST_PG_URL=` line of the 0600 secrets file `scripts/services.sh up` writes
//! (`$EVALCI_SECRETS_FILE`, default `/etc/evalci/secrets.env`).

/// The test PostgreSQL URL, or `None` when neither the variable nor the secrets file provides one.
pub fn test_pg_url() -> Option<String> {
    if let Ok(url) = std::env::var("EVAL_TEST_PG_URL") {
        return Some(url);
    }
    let file = std::env::var("EVALCI_SECRETS_FILE").unwrap_or_else(|_| "/etc/evalci/secrets.env".to_string());
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|line| line.strip_prefix("EVAL_TEST_PG_URL=")).map(|url| url.trim().to_string())
}
