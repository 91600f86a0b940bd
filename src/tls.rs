//! The TLS crypto provider for outbound HTTPS (HTTP upstreams, MCP over Streamable HTTP, OTLP over
//! HTTP): rustls with *ring*. rustls finds its provider through a process-wide default, so it is
//! installed once, before the first HTTP client is built; aws-lc-rs (reqwest's default) would add
//! megabytes of code the sidecar does not need.

/// Installs *ring* as rustls' process default, once; harmless if one is already installed.
pub fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err only when another provider was installed first, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
