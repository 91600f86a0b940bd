//! Integration tests: the real server on an ephemeral port, driven through the generated client.

mod approvals;
mod approvals_more;
mod audit;
mod boundary;
mod cli;
mod config;
mod examples;
mod execution;
mod executors;
mod executors_dns;
mod executors_more;
mod hardening_audit;
mod hardening_identity;
mod hardening_policy;
mod identity;
mod identity_jwt;
mod list_tools;
mod mcp;
mod metrics;
mod observability;
#[path = "../common/otlp_collector.rs"]
mod otlp_collector;
mod process;
mod properties;
mod rate_limits;
mod reliability;
mod reload;
mod shutdown;
mod support;
mod traces;
