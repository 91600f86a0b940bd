//! A handoff tool's call (stage 11, before anything is sent): the delegation its backend hands
//! the sub-agent. It keeps the person as the caller and extends the chain: the caller's agent
//! joins it, the depth grows by one and its limit is the smallest of the chain's, the handoff's
//! tool lists and budget are added to the parent's (a handoff never widens), the run stays the
//! root's, and it expires no later than this call's deadline.

use tokio::time::Instant;

use super::{CatalogState, Permit};
use crate::{
    catalog::Handoff,
    error::{Reason, Refusal, Stage},
    identity::{
        Caller,
        delegation::{Delegation, HandoffBudget, Issue},
    },
};

/// The signed delegation for this call of a handoff tool.
pub(super) fn delegate(
    state: &CatalogState,
    permit: &Permit,
    handoff: &Handoff,
    deadline: Instant,
    now_unix_ms: i64,
) -> Result<String, Refusal> {
    let misconfigured =
        |why: String| Refusal::new(Stage::Execute, Reason::BackendMisconfigured, why);
    let keys = state
        .catalog
        .delegation
        .as_deref()
        .filter(|keys| keys.can_issue())
        .ok_or_else(|| {
            misconfigured(format!(
                "{} hands off, but this sidecar has no delegation signing key",
                permit.tool().name
            ))
        })?;
    let caller = permit.caller();
    let parent = caller.delegation.as_deref();
    let now = u64::try_from(now_unix_ms / 1000).unwrap_or(0);
    // Whole seconds, rounded down: the token never outlives the call.
    let ttl = deadline
        .saturating_duration_since(Instant::now())
        .min(keys.max_ttl)
        .as_secs()
        .max(1);
    let mut chain = parent.map(|p| p.chain.clone()).unwrap_or_default();
    chain.push(caller.agent.to_string());
    let mut tools = parent.map(|p| p.tools.clone()).unwrap_or_default();
    tools.push(handoff.tools.clone());
    let mut budgets = parent.map(|p| p.budgets.clone()).unwrap_or_default();
    if let Some(budget) = &handoff.budget {
        budgets.push(HandoffBudget {
            // Call ids repeat across turns: the budget's key is this handoff's own.
            call: format!("{}/{}", permit.call_id(), uuid::Uuid::new_v4()),
            max_calls: budget.max_calls,
            max_cost: budget.max_cost,
            max_calls_per_tool: budget.max_calls_per_tool.clone(),
        });
    }
    let delegation = Delegation {
        chain,
        run: parent.map_or_else(|| permit.run_id().to_owned(), |p| p.run.clone()),
        parent_call: permit.call_id().to_owned(),
        depth: parent.map_or(0, |p| p.depth).saturating_add(1),
        max_depth: parent.map_or(handoff.max_depth, |p| p.max_depth.min(handoff.max_depth)),
        tools,
        budgets,
        traceparent: permit.traceparent().map(str::to_owned),
        expires: now.saturating_add(ttl),
    };
    // The person's scopes travel (a tool's required scopes still hold), but not the ones
    // that decide approvals or stop tools: a sub-agent acts only through tool calls.
    let narrowed = Caller {
        scopes: caller
            .scopes
            .iter()
            .filter(|s| {
                s.as_str() != crate::approvals::APPROVE_SCOPE
                    && s.as_str() != crate::emergency::ADMIN_SCOPE
            })
            .cloned()
            .collect(),
        ..caller.clone()
    };
    keys.issue(Issue {
        caller: &narrowed,
        agent: &handoff.agent,
        delegation,
        now,
    })
    .map_err(|err| misconfigured(format!("the delegation could not be signed: {err}")))
}
