//! Running it: the binary, reload, shutdown, audit, traces, metrics, the shadow catalog, the config, the examples, reliability.

pub(crate) mod audit;
pub(crate) mod audit_under_pressure;
pub(crate) mod binary;
pub(crate) mod config;
pub(crate) mod examples;
pub(crate) mod hostile_requests;
pub(crate) mod metrics;
pub(crate) mod observability;
pub(crate) mod reliability;
pub(crate) mod reload;
pub(crate) mod shadow;
pub(crate) mod shutdown;
pub(crate) mod traces;
