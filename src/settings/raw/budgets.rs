//! Budgets for a whole run, and for a caller over a day.

use super::*;

/// Budgets: what one run may spend in all, and what one caller may spend in a day, whatever
/// run ids it sends. Spent as a call is admitted (stage 8, with the quotas) and given back when
/// its backend is never reached.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawBudgets {
    /// What one run may spend: a run is (tenant, subject, the client's run id), shared by every
    /// agent the run hands work to. Calls without a run id are bound by `caller_daily` only.
    pub run: Option<RawBudget>,
    /// What one caller (tenant and subject) may spend in a UTC day, across all its runs: the
    /// bound a client that changes run ids cannot escape.
    pub caller_daily: Option<RawBudget>,
    /// How long a run's spending is remembered after its last call (default 24h; at least its
    /// `max_wall_time`).
    pub run_window: Option<String>,
    /// Most runs (and, apart, callers) one tenant's spending is remembered for in this sidecar's
    /// memory; past it, the least recently used is forgotten (default 10000). Redis keeps every
    /// one until it expires.
    pub max_entries_per_tenant: Option<usize>,
}

/// One budget. Every limit is optional; a budget with none is refused.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawBudget {
    /// Most calls admitted.
    pub max_calls: Option<u64>,
    /// Most cost admitted, in the units quotas count: a tool's `rate_limit.cost` when it has
    /// one, otherwise 1 a call.
    pub max_cost: Option<u64>,
    /// Most calls of one tool, by tool name (e.g. `send_email: 3`).
    #[serde(default)]
    pub max_calls_per_tool: BTreeMap<String, u64>,
    /// How long after its first call a run may go on (runs only), e.g. `15m`.
    pub max_wall_time: Option<String>,
}
