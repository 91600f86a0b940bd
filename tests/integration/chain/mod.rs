//! The chain's stages, one topic each, through the real server.

pub(crate) mod access_emergency;
pub(crate) mod approval_reasons;
pub(crate) mod approvals;
pub(crate) mod approvals_binding;
pub(crate) mod conditions;
pub(crate) mod conditions_worked_example;
pub(crate) mod execution;
pub(crate) mod explain;
pub(crate) mod flow;
pub(crate) mod handoff;
pub(crate) mod hostile_input;
pub(crate) mod not_talked_around;
pub(crate) mod output_guard;
pub(crate) mod properties;
pub(crate) mod quota_cost;
pub(crate) mod rate_limits;
pub(crate) mod run_budgets;
pub(crate) mod sidecar_budgets;
pub(crate) mod stages;
