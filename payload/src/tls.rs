//! reqwest is built with rustls but without a default crypto provider (`rustls-no-provider`: the
//! default, aws-lc-rs, needs cmake and a C toolchain on every cluster build); this installs ring,
//! which the workspace's rustls compiles anyway. Every client builder calls it first: a rustls
//! client built before a provider is installed would refuse to build.

/// Installs ring as the process's crypto provider (once; later calls do nothing).
pub(crate) fn init() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err only when a provider is already installed, which is what we want.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
