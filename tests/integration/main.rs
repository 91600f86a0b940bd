//! Integration tests: the real server on an ephemeral port, driven through the generated client.

// Helpers outside #[test] functions unwrap too: in a test crate a failure is a panic (clippy.toml
// allows unwrap and expect in tests themselves).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test crate: a failure is a panic"
)]

mod chain;
mod cli;
mod doors;
mod executors;
mod identity;
mod operations;
#[path = "../common/otlp_collector.rs"]
mod otlp_collector;
mod project;
#[path = "../common/redis_server.rs"]
mod redis_server;
mod shared_state;
mod support;
