//! Stage 8: the call's quotas — its tool's for the tenant, and the tenant's own — decided
//! together: a call refused by either consumes neither. A tool's `rate_limit.cost` says how many
//! cells of the tool's quota a call takes, from its bound arguments. The arithmetic and the
//! stores (memory, Redis) are `crate::limits`; this is the decision the chain takes.

use serde_json::Value;

use super::{CatalogState, policy};
use crate::{
    catalog::ToolVersion,
    conditions::Evaluated,
    error::{Reason, Refusal, Stage},
    limits::{self, Cost, QuotaScope},
};

/// Where a tool's quota cost is named in explanations and refusals.
pub fn cost_location(tool: &ToolVersion) -> String {
    format!("{}@{}.rate_limit.cost", tool.name, tool.version)
}

/// Takes the call's cells of each quota that applies, or refuses taking none: `RATE_LIMITED`
/// while a quota has no room; `cost_over_burst` when the cost is more than the tool's quota
/// ever admits at once; `condition_error` when the cost cannot be evaluated or is negative.
pub(super) async fn check(
    state: &CatalogState,
    asker: &policy::Asker<'_>,
    tool: &ToolVersion,
    arguments: &Value,
) -> Result<(), Refusal> {
    let caller = asker.caller;
    let cost = cost(tool, asker, arguments).0?;
    let tenant_rate = state.catalog.tenant_rate(&caller.tenant);
    state
        .rate_limits
        .check(&caller.tenant, tool, tenant_rate, cost)
        .await
}

/// Whether the call's quotas have room for it now, consuming nothing: asked before an
/// evaluation that can take long, so a call its quota would refuse anyway is refused without
/// it. Only the shares known before evaluating are looked at: the tenant's quota (one cell), and
/// the tool's unless its cost is a condition (which may come to nothing). When what is left
/// cannot be read, [`check`] decides later, as it always does.
pub(super) async fn room(
    state: &CatalogState,
    caller: &crate::identity::Caller,
    tool: &ToolVersion,
) -> Result<(), Refusal> {
    let tenant_rate = state.catalog.tenant_rate(&caller.tenant);
    let Ok(views) = state
        .rate_limits
        .view(&caller.tenant, tool, tenant_rate)
        .await
    else {
        return Ok(());
    };
    for view in views.iter().filter(|view| view.remaining == 0) {
        let (scope, name) = match view.scope == QuotaScope::Tool.as_str() {
            true if tool.quota_cost.is_some() => continue,
            true => (QuotaScope::Tool, tool.name.as_str()),
            false => (QuotaScope::Tenant, ""),
        };
        return Err(Refusal::new(
            Stage::RateLimit,
            Reason::RateLimited,
            limits::exhausted(scope, &caller.tenant, name, view.rate),
        ));
    }
    Ok(())
}

/// `decided`, unless [`room`] refuses its call.
pub(super) async fn room_for<'c>(
    state: &CatalogState,
    caller: &crate::identity::Caller,
    decided: Result<policy::Decided<'c>, Refusal>,
) -> Result<policy::Decided<'c>, Refusal> {
    let decided = decided?;
    room(state, caller, decided.tool).await?;
    Ok(decided)
}

/// The cells of its tool's quota this call takes, refused as [`check`] says when it has none it
/// could take; and the cost evaluated, when the asker traces.
pub(super) fn cost(
    tool: &ToolVersion,
    asker: &policy::Asker<'_>,
    arguments: &Value,
) -> (Result<Cost, Refusal>, Vec<Evaluated>) {
    let (Some(rate), Some(expression)) = (tool.rate_limit, &tool.quota_cost) else {
        return (Ok(Cost::ONE), Vec::new());
    };
    let (cells, trace) = asker.apart.run(expression.may_take_long(), || {
        let input = asker.call_input(tool, arguments);
        let cells = input.cost_at(|| cost_location(tool), expression);
        (cells, input.take_trace())
    });
    let decided = match cells {
        Ok(cells) if cells > u64::from(rate.burst.get()) => Err(limits::over_burst(
            &asker.caller.tenant,
            tool,
            rate,
            Cost(cells),
        )),
        Ok(cells) => Ok(Cost(cells)),
        Err(error) => Err(Refusal::new(
            Stage::RateLimit,
            Reason::ConditionError,
            format!(
                "{}: the quota cost {:?} could not be decided: {error}",
                cost_location(tool),
                expression.source()
            ),
        )),
    };
    (decided, trace)
}
