//! Stage 8: the call's quotas — its tool's for the tenant, and the tenant's own — decided
//! together: a call refused by either consumes neither. A tool's `rate_limit.cost` says how many
//! cells of the tool's quota a call takes, from its bound arguments. The arithmetic and the
//! stores (memory, Redis) are `crate::limits`; this is the decision the chain takes.

use serde_json::Value;

use super::{
    CatalogState, Turn,
    explain::{Explainer, QuotaTrail, StageResult, StageTrail},
    policy::{self, Decided},
};
use crate::{
    budgets::{self as budget, Budgets, Charge, Taken},
    catalog::{Catalog, ToolVersion},
    conditions::Evaluated,
    error::{Reason, Refusal, Stage},
    limits::{self, Cost, QuotaPlan, QuotaScope, QuotaView, Spend, ToolQuota, describe},
    settings::Rate,
};

/// A tool's quota as the limiters key it.
pub fn quota_of(tool: &ToolVersion) -> ToolQuota<'_> {
    ToolQuota {
        name: &tool.name,
        rate: tool.rate_limit,
    }
}

/// What the limiters of `catalog` are built for: each tool version's quota and each tenant's.
pub fn quota_plan(catalog: &Catalog) -> QuotaPlan<'_> {
    QuotaPlan {
        tools: catalog.versions().map(|tool| quota_of(tool)).collect(),
        tenants: catalog
            .tenants
            .iter()
            .map(|(tenant, policy)| (tenant.as_str(), policy.rate_limit))
            .collect(),
    }
}

/// Where a tool's quota cost is named in explanations and refusals.
pub fn cost_location(tool: &ToolVersion) -> String {
    format!("{}@{}.rate_limit.cost", tool.name, tool.version)
}

/// Takes the call's cells of each quota that applies and its share of each budget (its run's,
/// its caller's day), or refuses taking none: `run_budget_exhausted` when a budget has no room
/// (checked first: no wait helps); `RATE_LIMITED` while a quota has no room; `cost_over_burst`
/// when the cost is more than the tool's quota ever admits at once; `condition_error` when the
/// cost cannot be evaluated or is negative. What it took of the budgets is given back if the
/// call's backend is never reached.
pub(super) async fn check(
    state: &CatalogState,
    budgets: &Budgets,
    asker: &policy::Asker<'_>,
    tool: &ToolVersion,
    arguments: &Value,
) -> Result<Option<Box<Taken>>, Refusal> {
    let caller = asker.caller;
    let cost = cost(tool, asker, arguments).0?;
    let tenant_rate = state.catalog.tenant_rate(&caller.tenant);
    let delegated = asker
        .caller
        .delegation
        .as_deref()
        .is_some_and(|d| !d.budgets.is_empty());
    if state.catalog.budgets.is_some() || delegated {
        // Boxed: only catalogs with budgets pay for their charges in every call's future.
        return Box::pin(check_with_budgets(state, budgets, asker, tool, cost)).await;
    }
    let spend = Spend {
        charges: &[],
        budgets,
        max_entries: 0,
    };
    state
        .rate_limits
        .check(&caller.tenant, quota_of(tool), tenant_rate, cost, &spend)
        .await?;
    Ok(None)
}

/// [`check`] for a catalog with budgets.
async fn check_with_budgets(
    state: &CatalogState,
    budgets: &Budgets,
    asker: &policy::Asker<'_>,
    tool: &ToolVersion,
    cost: Cost,
) -> Result<Option<Box<Taken>>, Refusal> {
    let caller = asker.caller;
    let tenant_rate = state.catalog.tenant_rate(&caller.tenant);
    let (charges, max_entries) = charges_of(&state.catalog, budgets, asker, tool, cost);
    let spend = Spend {
        charges: &charges,
        budgets,
        max_entries,
    };
    let shared = state
        .rate_limits
        .check(&caller.tenant, quota_of(tool), tenant_rate, cost, &spend)
        .await?;
    Ok((!charges.is_empty()).then(|| Box::new(Taken { charges, shared })))
}

/// The budgets a call spends from — its run's and its caller's day (the catalog's `budgets`),
/// and each handoff's of its chain — and how many entries a tenant keeps in memory. A
/// sub-agent's run is its chain's root run: the whole chain spends one run budget.
pub(super) fn charges_of(
    catalog: &Catalog,
    budgets: &Budgets,
    asker: &policy::Asker<'_>,
    tool: &ToolVersion,
    Cost(cost): Cost,
) -> (Vec<Charge>, usize) {
    let caller = asker.caller;
    let delegation = caller.delegation.as_deref();
    let run_id = delegation.map_or(asker.run_id, |d| d.run.as_str());
    let policy = catalog.budgets.as_deref();
    let mut charges = match policy {
        Some(policy) => budget::charges(
            policy,
            &caller.tenant,
            &caller.subject,
            run_id,
            &tool.name,
            cost,
            budgets.now_ms(),
        ),
        None => Vec::new(),
    };
    let keep = policy.map_or(crate::catalog::budgets::DEFAULT_RUN_WINDOW, |p| {
        p.run_window
    });
    for handoff in delegation.map(|d| d.budgets.as_slice()).unwrap_or_default() {
        charges.push(budget::handoff_charge(
            &caller.tenant,
            handoff,
            &tool.name,
            cost,
            keep,
        ));
    }
    let max_entries = policy.map_or(
        crate::catalog::budgets::DEFAULT_MAX_ENTRIES_PER_TENANT,
        |p| p.max_entries_per_tenant,
    );
    (charges, max_entries)
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
        .view(&caller.tenant, quota_of(tool), tenant_rate)
        .await
    else {
        return Ok(());
    };
    let applying = applying(tool, tenant_rate);
    let left = left(&views, &applying);
    let tool_cells = tool.quota_cost.is_none().then_some(1);
    match short_of(&applying, &left, tool_cells, &caller.tenant, &tool.name) {
        Some(refusal) => Err(refusal),
        None => Ok(()),
    }
}

/// The quotas that apply to a call of `tool` by a tenant whose own rate is `tenant_rate`: the
/// tool's, then the tenant's.
fn applying(tool: &ToolVersion, tenant_rate: Option<Rate>) -> Vec<(QuotaScope, Rate)> {
    [
        (QuotaScope::Tool, tool.rate_limit),
        (QuotaScope::Tenant, tenant_rate),
    ]
    .into_iter()
    .filter_map(|(scope, rate)| Some((scope, rate?)))
    .collect()
}

/// What `views` say each of `applying` has left; `None` where they do not hold it (a quota the
/// served catalog does not keep, taken as unused).
fn left(views: &[QuotaView], applying: &[(QuotaScope, Rate)]) -> Vec<Option<u64>> {
    applying
        .iter()
        .map(|&(scope, rate)| {
            views
                .iter()
                .find(|v| v.scope == scope.as_str() && v.rate == rate)
                .map(|v| v.remaining)
        })
        .collect()
}

/// Stage 8 decided on what the quotas have `left`, consuming nothing: the refusal of the first
/// with less left than the call takes — `tool_cells` of the tool's (`None`: not known yet, so
/// that quota is passed over) and one of the tenant's. The one rule behind the quota look
/// before a long evaluation ([`room`]) and explanations.
fn short_of(
    applying: &[(QuotaScope, Rate)],
    left: &[Option<u64>],
    tool_cells: Option<u64>,
    tenant: &str,
    tool: &str,
) -> Option<Refusal> {
    applying
        .iter()
        .zip(left)
        .find_map(|(&(scope, rate), left)| {
            let takes = takes(scope, tool_cells)?;
            left.is_some_and(|left| left < takes).then(|| {
                Refusal::new(
                    Stage::RateLimit,
                    Reason::RateLimited,
                    limits::exhausted(scope, tenant, tool, rate),
                )
            })
        })
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

/// The cells a call takes of a quota in `scope`: `tool_cells` of its tool's (`None`: not known
/// yet), one of its tenant's.
fn takes(scope: QuotaScope, tool_cells: Option<u64>) -> Option<u64> {
    match scope {
        QuotaScope::Tool => tool_cells,
        QuotaScope::Tenant => Some(1),
    }
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
            &tool.name,
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

impl Explainer<'_> {
    /// Stage 8, reading what each quota leaves and consuming nothing: a quota with less left
    /// than the call takes would refuse, and so would a cost that cannot be taken at all.
    pub(super) async fn rate_limit(
        &self,
        turn: &Turn,
        decided: &Decided<'_>,
        cost: Result<Cost, Refusal>,
        stages: &mut Vec<StageTrail>,
    ) -> Result<(), Refusal> {
        let caller = &turn.caller;
        let tool = decided.tool;
        let Cost(cells) = match cost {
            Ok(cost) => cost,
            Err(refusal) => {
                stages.push(StageTrail::new(
                    Stage::RateLimit,
                    StageResult::Refused,
                    refusal.message.clone(),
                ));
                return Err(refusal);
            }
        };
        let tenant_rate = self.catalog.tenant_rate(&caller.tenant);
        // With the shared state unreachable, what is left is unknown (the trail says so); the
        // quota is not called exhausted on a guess.
        let views = self
            .rate_limits
            .view(&caller.tenant, quota_of(tool), tenant_rate)
            .await;
        let unknown = views.is_err();
        let applying = applying(tool, tenant_rate);
        let left = left(&views.unwrap_or_default(), &applying);
        let quotas: Vec<QuotaTrail> = applying
            .iter()
            .zip(&left)
            .map(|(&(scope, rate), &remaining)| QuotaTrail {
                scope: scope.as_str(),
                rate: describe(rate),
                burst: rate.burst.get(),
                remaining,
            })
            .collect();
        let short = short_of(&applying, &left, Some(cells), &caller.tenant, &tool.name)
            .filter(|_| !self.own.quota);
        let mut rate_trail = match short {
            Some(refusal) => {
                stages.push(StageTrail {
                    quotas: quotas.clone(),
                    ..StageTrail::new(
                        Stage::RateLimit,
                        StageResult::Refused,
                        refusal.message.clone(),
                    )
                });
                return Err(refusal);
            }
            None if quotas.is_empty() => StageTrail::new(
                Stage::RateLimit,
                StageResult::NotApplicable,
                "no quota applies to this call",
            ),
            None if unknown => StageTrail::new(
                Stage::RateLimit,
                StageResult::Passed,
                format!(
                    "what {} leave now is unknown: the shared state cannot be read (nothing was consumed)",
                    quotas
                        .iter()
                        .map(|q| format!("the {} quota {}", q.scope, q.rate))
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            ),
            None if cells == 1 => StageTrail::new(
                Stage::RateLimit,
                StageResult::Passed,
                format!(
                    "would take one call of {} (nothing was consumed)",
                    quotas
                        .iter()
                        .map(describe_quota)
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            ),
            None => StageTrail::new(
                Stage::RateLimit,
                StageResult::Passed,
                format!(
                    "would take {} (nothing was consumed)",
                    applying
                        .iter()
                        .zip(&quotas)
                        .map(|(&(scope, _), quota)| format!(
                            "{} of {}",
                            match takes(scope, Some(cells)).unwrap_or(1) {
                                1 => "one cell".to_owned(),
                                n => format!("{n} cells"),
                            },
                            describe_quota(quota)
                        ))
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            ),
        };
        rate_trail.quotas = quotas;
        if let Err(refusal) = self.budgets(turn, tool, cells, &mut rate_trail).await {
            rate_trail.result = StageResult::Refused;
            rate_trail.detail = refusal.message.clone();
            stages.push(rate_trail);
            return Err(refusal);
        }
        stages.push(rate_trail);
        Ok(())
    }

    /// Stage 8's budgets, reading what each has spent and consuming nothing: what they leave
    /// joins the trail's sentence, or the refusal of one that has no room for the call.
    async fn budgets(
        &self,
        turn: &Turn,
        tool: &ToolVersion,
        cells: u64,
        trail: &mut StageTrail,
    ) -> Result<(), Refusal> {
        let budgets = &self.boundary.budgets;
        let now = budgets.now_ms();
        let asker = policy::Asker {
            caller: &turn.caller,
            run_id: &turn.run_id,
            now: std::time::SystemTime::UNIX_EPOCH,
            trace: false,
            apart: &self.boundary.apart,
        };
        let (charges, _) = charges_of(self.catalog, budgets, &asker, tool, Cost(cells));
        if charges.is_empty() {
            return Ok(());
        }
        let said = match budgets.usage(&charges).await {
            Ok(usage) => {
                let mut said = Vec::new();
                for (charge, usage) in charges.iter().zip(&usage) {
                    if let Err(exhausted) = charge.check(usage, now)
                        && !self.own.quota
                    {
                        return Err(exhausted.refusal());
                    }
                    said.push(charge.left_in_words(usage, now));
                }
                format!("budgets: {}", said.join("; "))
            }
            Err(_) => {
                "what the budgets leave is unknown: the shared state cannot be read".to_owned()
            }
        };
        if trail.result == StageResult::NotApplicable {
            trail.result = StageResult::Passed;
            trail.detail = format!("no quota applies to this call; {said}");
        } else {
            trail.detail = format!("{}; {said}", trail.detail);
        }
        Ok(())
    }
}

fn describe_quota(quota: &QuotaTrail) -> String {
    match quota.remaining {
        Some(left) => format!("the {} quota {} ({left} left now)", quota.scope, quota.rate),
        None => format!(
            "the {} quota {} (not kept by the served catalog: taken as unused, all of it left)",
            quota.scope, quota.rate
        ),
    }
}
