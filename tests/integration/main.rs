//! Integration tests: the real server on an ephemeral port, driven through the generated client.

mod approvals;
mod boundary;
mod cli_and_logs;
mod config;
mod execution;
mod executors;
mod http_hardening;
mod identity;
mod list_tools;
mod mcp_hardening;
mod observability;
#[path = "../common/otlp_collector.rs"]
mod otlp_collector;
mod process;
mod process_hardening;
mod properties;
mod rate_limits;
mod reliability;
mod reload;
mod support;
