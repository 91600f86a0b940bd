//! Integration tests: the real server on an ephemeral port, driven through the generated client.

mod approvals;
mod boundary;
mod config;
mod execution;
mod executors;
mod identity;
mod list_tools;
mod process;
mod rate_limits;
mod reload;
mod support;
