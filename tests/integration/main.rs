//! Integration tests: the real server on an ephemeral port, driven through the generated client.

// Helpers outside #[test] functions unwrap too: in a test crate a failure is a panic (clippy.toml
// allows unwrap and expect in tests themselves).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test crate: a failure is a panic"
)]

mod approval_reasons;
mod approvals;
mod approvals_more;
mod architecture;
mod audit;
mod boundary;
mod bounded;
mod catalog_tests;
mod cli;
mod cli_and_logs;
mod conditions;
mod conditions_docs;
mod config;
mod docs;
mod doors;
mod emergency;
mod examples;
mod execution;
mod executors;
mod executors_dns;
mod executors_more;
mod explain;
mod flow;
mod hardening_audit;
mod hardening_identity;
mod hardening_policy;
mod hardening_transport;
mod http_hardening;
mod identity;
mod identity_jwt;
mod list_tools;
mod mcp;
mod mcp_hardening;
mod metrics;
mod observability;
#[path = "../common/otlp_collector.rs"]
mod otlp_collector;
mod output_guard;
mod pins;
mod process;
mod process_hardening;
mod properties;
mod quota_cost;
mod rate_limits;
#[path = "../common/redis_server.rs"]
mod redis_server;
mod reliability;
mod reload;
mod shadow;
mod shared_state;
mod shutdown;
mod state_approvals;
mod state_late;
mod state_refusals;
mod state_secrets;
mod support;
mod traces;
mod transport;
