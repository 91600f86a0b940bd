//! Rate limits (stage 8): per (tenant, tool) quotas from each tool's `rate_limit`, and an
//! optional overall quota per tenant. Both quotas of a call are decided under their locks and
//! committed together, so a call refused by one consumes neither, and decisions are exact under
//! concurrency. The arithmetic is [`gcra`]'s, shared with the Redis backend.
//!
//! Keys are tenants, which the access stage already limited to the catalog's tenants, so the maps
//! stay bounded; [`RateLimits::retain_recent`] also sheds idle keys. Limiter state is keyed by
//! (tool, rate) and carried across catalog reloads for tools whose quota did not change.
//!
//! governor is not used: it decides and commits in one step, so two quotas cannot be checked
//! without one of them consuming a cell for a call the other refuses.
//!
//! [`Quotas`] is what the boundary calls: this memory limiter, or the quotas shared by every
//! sidecar through Redis ([`redis`]). Their metrics are in [`metrics`].

mod in_flight;
pub mod metrics;
pub mod redis;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use crate::gcra::{self, Gcra};
use crate::{
    clock::SharedClock,
    error::{Reason, Refusal, Stage},
    settings::Rate,
    state::{self, StateError},
};
pub use in_flight::{Full, InFlight, VersionCap};
use metrics::QuotaMetrics;
use redis::SharedQuotas;

/// A tool's quota as the limiters key it: the tool's name and its rate (`None`: it has none).
/// The boundary makes it from the catalog's tool (`boundary::quota_of`).
#[derive(Debug, Clone, Copy)]
pub struct ToolQuota<'a> {
    pub name: &'a str,
    pub rate: Option<Rate>,
}

/// What the limiters of one catalog are built for: every tool's quota (a name may have several
/// versions, each with its rate) and every tenant's own rate.
#[derive(Debug, Default)]
pub struct QuotaPlan<'a> {
    pub tools: Vec<ToolQuota<'a>>,
    pub tenants: Vec<(&'a str, Option<Rate>)>,
}

/// The rate limiter of one catalog: this sidecar's memory, or shared through Redis.
pub enum Quotas {
    Memory(RateLimits),
    Shared(SharedQuotas),
}

impl Quotas {
    /// Limiters for `catalog` on `backend`, counting in `metrics`, carrying over `previous` state
    /// where a quota is unchanged (in Redis the key names carry the rate, so that holds by
    /// itself).
    pub fn build(
        plan: &QuotaPlan<'_>,
        clock: SharedClock,
        backend: &state::Backend,
        metrics: &QuotaMetrics,
        previous: Option<&Quotas>,
    ) -> Quotas {
        let previous_local = previous.and_then(|p| match p {
            Quotas::Memory(local) => Some(local),
            Quotas::Shared(shared) => shared.fallback(),
        });
        let local = RateLimits::build(plan, clock, previous_local);
        match backend {
            state::Backend::Memory => Quotas::Memory(local),
            state::Backend::Redis(redis) => {
                let previous_shared = previous.and_then(|p| match p {
                    Quotas::Shared(shared) => Some(shared),
                    Quotas::Memory(_) => None,
                });
                Quotas::Shared(SharedQuotas::new(
                    redis.clone(),
                    metrics.clone(),
                    Some(local),
                    previous_shared,
                ))
            }
        }
    }

    /// Admits one call of `tool` for `tenant` if both its quotas and the budgets it spends
    /// from have room, consuming `cost` cells of the tool's (see [`Cost`]), one of the tenant's
    /// and its share of each budget; otherwise consumes nothing and says how long to wait (or,
    /// for a budget, that no wait helps). `Ok(true)` when the shared state decided.
    pub async fn check(
        &self,
        tenant: &str,
        tool: ToolQuota<'_>,
        tenant_rate: Option<Rate>,
        cost: Cost,
        spend: &Spend<'_>,
    ) -> Result<bool, Refusal> {
        match self {
            Quotas::Memory(local) => spend
                .take_local(|| local.check_cost(tenant, tool, tenant_rate, cost))
                .map(|()| false),
            // Boxed: only calls that go to Redis pay for its future, and every call's future
            // stays small.
            Quotas::Shared(shared) => {
                Box::pin(shared.check(tenant, tool, tenant_rate, cost, spend)).await
            }
        }
    }

    /// What each quota of this call would admit now, consuming nothing.
    pub async fn view(
        &self,
        tenant: &str,
        tool: ToolQuota<'_>,
        tenant_rate: Option<Rate>,
    ) -> Result<Vec<QuotaView>, StateError> {
        match self {
            Quotas::Memory(local) => Ok(local.view(tenant, tool, tenant_rate)),
            Quotas::Shared(shared) => shared.view(tenant, tool, tenant_rate).await,
        }
    }

    /// The in-memory limiter: the only one, or the one that decides during Redis outages.
    fn local(&self) -> Option<&RateLimits> {
        match self {
            Quotas::Memory(local) => Some(local),
            Quotas::Shared(shared) => shared.fallback(),
        }
    }

    /// Forgets in-memory keys whose window has passed (Redis expires its own).
    pub fn retain_recent(&self) {
        if let Some(local) = self.local() {
            local.retain_recent();
        }
    }

    /// Keys held in this sidecar's memory.
    pub fn keys_held(&self) -> usize {
        self.local().map_or(0, RateLimits::keys_held)
    }
}

/// The budgets a call spends from, decided with its quotas (`crate::budgets`).
pub struct Spend<'a> {
    pub charges: &'a [crate::budgets::Charge],
    pub budgets: &'a crate::budgets::Budgets,
    /// Most entries a tenant keeps in memory.
    pub max_entries: usize,
}

impl Spend<'_> {
    /// Takes the charges from this sidecar's memory, with the quotas' decision `quotas` taken
    /// under the same lock.
    fn take_local(&self, quotas: impl FnOnce() -> Result<(), Refusal>) -> Result<(), Refusal> {
        self.budgets
            .take_local(self.charges, self.max_entries, quotas)
            .map_err(|err| match err {
                crate::budgets::TakeError::Exhausted(exhausted) => exhausted.refusal(),
                crate::budgets::TakeError::Other(refusal) => refusal,
            })
    }
}

/// How many cells of its tool's quota a call takes: one, or what the tool's `rate_limit.cost`
/// says for its arguments (checked against the burst before it gets here: [`over_burst`]).
/// The tenant's overall quota counts calls, one each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost(pub u64);

impl Cost {
    pub const ONE: Cost = Cost(1);
}

/// A tenant as the maps know it: shared, so admitting a call clones a pointer, not the name.
type TenantKey = Arc<str>;

/// One quota's state for every tenant: TATs in nanoseconds of the injected clock.
#[derive(Debug)]
struct Cells {
    gcra: Gcra,
    tats: Mutex<HashMap<TenantKey, u64>>,
}

impl Cells {
    fn new(rate: Rate) -> Arc<Self> {
        Arc::new(Cells {
            gcra: Gcra::new(rate),
            tats: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<TenantKey, u64>> {
        // Every update is one insert: a panicking holder cannot leave half a decision.
        self.tats.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// All rate limiters for one catalog. Maps are keyed by `String` and looked up by `&str`, so
/// admitting a call allocates nothing.
#[derive(Clone)]
pub struct RateLimits {
    clock: SharedClock,
    /// The catalog's tenants as map keys.
    tenant_keys: HashMap<String, TenantKey>,
    /// Tool name -> its quotas, one per distinct rate among its versions.
    per_tool: HashMap<String, Vec<(Rate, Arc<Cells>)>>,
    /// Tenant -> its overall quota and that quota's rate.
    per_tenant: HashMap<String, (Rate, Arc<Cells>)>,
}

/// What a quota would do now, for explaining decisions without consuming anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaView {
    /// `tool` or `tenant`.
    pub scope: &'static str,
    pub rate: Rate,
    /// Calls that would be admitted now.
    pub remaining: u64,
}

impl RateLimits {
    /// Limiters for `plan`, reusing `previous` state where a tool's or tenant's rate is unchanged.
    pub fn build(plan: &QuotaPlan<'_>, clock: SharedClock, previous: Option<&RateLimits>) -> Self {
        let mut per_tool: HashMap<String, Vec<(Rate, Arc<Cells>)>> = HashMap::new();
        for tool in &plan.tools {
            let Some(rate) = tool.rate else {
                continue;
            };
            let limiters = per_tool.entry(tool.name.to_owned()).or_default();
            if find_rate(limiters, rate).is_some() {
                continue;
            }
            let cells = previous
                .and_then(|p| find_rate(p.per_tool.get(tool.name)?, rate))
                .unwrap_or_else(|| Cells::new(rate));
            limiters.push((rate, cells));
        }
        let mut per_tenant = HashMap::new();
        for &(tenant, rate) in &plan.tenants {
            let Some(rate) = rate else {
                continue;
            };
            let cells = previous
                .and_then(|p| p.per_tenant.get(tenant))
                .filter(|(previous_rate, _)| *previous_rate == rate)
                .map(|(_, cells)| cells.clone())
                .unwrap_or_else(|| Cells::new(rate));
            per_tenant.insert(tenant.to_owned(), (rate, cells));
        }
        let tenant_keys = plan
            .tenants
            .iter()
            .map(|&(tenant, _)| (tenant.to_owned(), TenantKey::from(tenant)))
            .collect();
        RateLimits {
            clock,
            tenant_keys,
            per_tool,
            per_tenant,
        }
    }

    fn now(&self) -> u64 {
        gcra::nanos(self.clock.monotonic())
    }

    fn tool_cells(&self, tool: ToolQuota<'_>) -> Option<&Arc<Cells>> {
        let rate = tool.rate?;
        self.per_tool
            .get(tool.name)?
            .iter()
            .find(|(r, _)| *r == rate)
            .map(|(_, cells)| cells)
    }

    fn tenant_cells(&self, tenant: &str, tenant_rate: Option<Rate>) -> Option<&(Rate, Arc<Cells>)> {
        let rate = tenant_rate?;
        self.per_tenant.get(tenant).filter(|(r, _)| *r == rate)
    }

    /// Admits one call of `tool` for `tenant` if both its quotas have room, consuming one cell of
    /// each; otherwise consumes nothing and says how long to wait.
    pub fn check(
        &self,
        tenant: &str,
        tool: ToolQuota<'_>,
        tenant_rate: Option<Rate>,
    ) -> Result<(), Refusal> {
        self.check_cost(tenant, tool, tenant_rate, Cost::ONE)
    }

    /// The same, the call taking `cost` cells of the tool's quota (none: the tool's quota is
    /// not touched).
    pub fn check_cost(
        &self,
        tenant: &str,
        tool: ToolQuota<'_>,
        tenant_rate: Option<Rate>,
        Cost(cells): Cost,
    ) -> Result<(), Refusal> {
        let tool_cells = self.tool_cells(tool).filter(|_| cells > 0);
        let tenant_cells = self.tenant_cells(tenant, tenant_rate);
        if tool_cells.is_none() && tenant_cells.is_none() {
            return Ok(());
        }
        // Lock order is always tool, then tenant: no two checks can wait on each other.
        let mut tool_tats = tool_cells.map(|cells| cells.lock());
        let mut tenant_tats = tenant_cells.map(|(_, cells)| cells.lock());
        let now = self.now();
        let tool_decision = tool_cells.zip(tool_tats.as_ref()).map(|(quota, tats)| {
            quota
                .gcra
                .decide_cells(tats.get(tenant).copied(), now, cells)
        });
        let tenant_decision = tenant_cells
            .zip(tenant_tats.as_ref())
            .map(|((_, cells), tats)| cells.gcra.decide(tats.get(tenant).copied(), now));
        if let Some(Err(wait)) = tool_decision
            && let Some(rate) = tool.rate
        {
            return Err(tool_refusal(tenant, tool, rate, wait));
        }
        if let Some(Err(wait)) = tenant_decision
            && let Some((rate, _)) = tenant_cells
        {
            return Err(tenant_refusal(tenant, *rate, wait));
        }
        let key = self.tenant_key(tenant);
        if let (Some(Ok(tat)), Some(tats)) = (tool_decision, tool_tats.as_mut()) {
            tats.insert(key.clone(), tat);
        }
        if let (Some(Ok(tat)), Some(tats)) = (tenant_decision, tenant_tats.as_mut()) {
            tats.insert(key, tat);
        }
        Ok(())
    }

    /// What each quota of this call would leave now, consuming nothing.
    pub fn view(
        &self,
        tenant: &str,
        tool: ToolQuota<'_>,
        tenant_rate: Option<Rate>,
    ) -> Vec<QuotaView> {
        let now = self.now();
        let mut views = Vec::new();
        if let (Some(cells), Some(rate)) = (self.tool_cells(tool), tool.rate) {
            let tat = cells.lock().get(tenant).copied();
            views.push(QuotaView {
                scope: QuotaScope::Tool.as_str(),
                rate,
                remaining: cells.gcra.remaining(tat, now),
            });
        }
        if let Some((rate, cells)) = self.tenant_cells(tenant, tenant_rate) {
            let tat = cells.lock().get(tenant).copied();
            views.push(QuotaView {
                scope: QuotaScope::Tenant.as_str(),
                rate: *rate,
                remaining: cells.gcra.remaining(tat, now),
            });
        }
        views
    }

    /// The map key for a tenant; a tenant outside the catalog (which the access stage has
    /// already refused) gets a key of its own.
    fn tenant_key(&self, tenant: &str) -> TenantKey {
        self.tenant_keys
            .get(tenant)
            .cloned()
            .unwrap_or_else(|| TenantKey::from(tenant))
    }

    fn all_cells(&self) -> impl Iterator<Item = &Arc<Cells>> {
        self.per_tool
            .values()
            .flat_map(|limiters| limiters.iter().map(|(_, cells)| cells))
            .chain(self.per_tenant.values().map(|(_, cells)| cells))
    }

    /// Forgets keys whose state no longer matters (their window has passed).
    pub fn retain_recent(&self) {
        let now = self.now();
        for cells in self.all_cells() {
            let mut tats = cells.lock();
            tats.retain(|_, tat| !Gcra::is_idle(*tat, now));
            tats.shrink_to_fit();
        }
    }

    /// Number of (tenant) keys held across all quotas.
    pub fn keys_held(&self) -> usize {
        self.all_cells().map(|cells| cells.lock().len()).sum()
    }
}

fn find_rate(limiters: &[(Rate, Arc<Cells>)], rate: Rate) -> Option<Arc<Cells>> {
    limiters
        .iter()
        .find(|(limiter_rate, _)| *limiter_rate == rate)
        .map(|(_, cells)| cells.clone())
}

/// How often idle rate-limit keys are shed.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// A call refused by its tool's quota.
fn tool_refusal(tenant: &str, tool: ToolQuota<'_>, rate: Rate, wait: Duration) -> Refusal {
    refusal(exhausted(QuotaScope::Tool, tenant, tool.name, rate), wait)
}

/// A call whose cost is more than its tool's quota can ever admit at once: waiting would not
/// help, so it is not told to.
pub fn over_burst(tenant: &str, tool: &str, rate: Rate, Cost(cells): Cost) -> Refusal {
    Refusal::new(
        Stage::RateLimit,
        Reason::CostOverBurst,
        format!(
            "this call of {tool} costs {cells}, more than the burst of {} that its rate limit {} admits at once for tenant {tenant}; it can never be admitted with these arguments",
            rate.burst,
            describe(rate)
        ),
    )
}

/// A call refused by its tenant's overall quota.
fn tenant_refusal(tenant: &str, rate: Rate, wait: Duration) -> Refusal {
    refusal(exhausted(QuotaScope::Tenant, tenant, "", rate), wait)
}

/// Which of a call's quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaScope {
    /// The tool's quota for the tenant.
    Tool,
    /// The tenant's overall quota.
    Tenant,
}

impl QuotaScope {
    /// The scope's name in quota views and explanations.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaScope::Tool => "tool",
            QuotaScope::Tenant => "tenant",
        }
    }
}

/// What a call refused by an exhausted quota is told (by execution and by explain alike);
/// `tool` is not named for the tenant's quota.
pub fn exhausted(scope: QuotaScope, tenant: &str, tool: &str, rate: Rate) -> String {
    match scope {
        QuotaScope::Tool => format!(
            "rate limit {} for {tool} reached for tenant {tenant}",
            describe(rate)
        ),
        QuotaScope::Tenant => format!(
            "tenant {tenant} reached its overall rate limit {}",
            describe(rate)
        ),
    }
}

fn refusal(message: String, wait: Duration) -> Refusal {
    // Round up so a client that waits exactly this long is admitted.
    let wait = Duration::from_millis(
        u64::try_from(wait.as_nanos().div_ceil(1_000_000))
            .unwrap_or(u64::MAX)
            .max(1),
    );
    Refusal::new(Stage::RateLimit, Reason::RateLimited, message).with_retry_after(wait)
}

/// A rate as catalogs write it, e.g. `5/min`.
pub fn describe(rate: Rate) -> String {
    let unit = match rate.period.as_secs() {
        1 => "s".to_owned(),
        60 => "min".to_owned(),
        3600 => "h".to_owned(),
        other => format!("{other}s"),
    };
    format!("{}/{unit}", rate.count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocations::allocations_in;
    use crate::{
        clock::ManualClock,
        settings::{parse_rate, raw::RawRateLimit},
    };
    use futures::FutureExt;

    /// `text` (e.g. `100/min`) as the catalog would read it.
    fn rate(text: &str) -> Rate {
        parse_rate(&RawRateLimit::Short(text.to_owned()), "rate_limit").unwrap()
    }

    fn quota(name: &'static str, text: Option<&str>) -> ToolQuota<'static> {
        ToolQuota {
            name,
            rate: text.map(rate),
        }
    }

    #[test]
    fn the_memory_limiter_behind_the_enum_allocates_nothing_per_call() {
        let tool = quota("t", Some("100/min"));
        let tenant_rate = Some(rate("1000/min"));
        let plan = QuotaPlan {
            tools: vec![tool],
            tenants: vec![("a", tenant_rate)],
        };
        let quotas = Quotas::build(
            &plan,
            SharedClock::new(ManualClock::new(0)),
            &state::Backend::Memory,
            &QuotaMetrics::register(&crate::metrics::Metrics::new()),
            None,
        );
        let budgets = crate::budgets::Budgets::on(
            &state::Backend::Memory,
            SharedClock::new(ManualClock::new(0)),
            &crate::metrics::Metrics::new(),
        );
        // A catalog without budgets spends from none.
        let spend = Spend {
            charges: &[],
            budgets: &budgets,
            max_entries: 0,
        };
        let check = || {
            quotas
                .check("a", tool, tenant_rate, Cost::ONE, &spend)
                .now_or_never()
                .expect("the memory limiter answers on the first poll")
        };
        // The first call of a tenant makes its map slots; every later one is in place.
        assert!(check().is_ok());
        assert_eq!(allocations_in(|| assert!(check().is_ok())), 0);
        // The counter does count: a refusal builds its message.
        for _ in 0..100 {
            let _ = check();
        }
        assert!(allocations_in(|| assert!(check().is_err())) > 0);
    }

    #[test]
    fn idle_keys_are_shed_and_state_survives_an_unchanged_reload() {
        let tool = quota("t", Some("2/min"));
        let plan = || QuotaPlan {
            tools: vec![tool],
            tenants: vec![("a", None), ("b", None), ("c", None)],
        };
        let clock = ManualClock::new(0);
        let limits = RateLimits::build(&plan(), SharedClock::new(clock.clone()), None);
        for tenant in ["a", "b", "c"] {
            assert!(limits.check(tenant, tool, None).is_ok());
        }
        assert!(limits.check("a", tool, None).is_ok());
        assert!(limits.check("a", tool, None).is_err());
        assert_eq!(limits.keys_held(), 3);

        // A reload with the same quota keeps the state: tenant a is still limited.
        let reloaded = RateLimits::build(&plan(), SharedClock::new(clock.clone()), Some(&limits));
        assert!(reloaded.check("a", tool, None).is_err());

        // Once every key's state is indistinguishable from a fresh one, it goes.
        clock.advance(Duration::from_secs(120));
        reloaded.retain_recent();
        assert_eq!(reloaded.keys_held(), 0);
        assert!(reloaded.check("a", tool, None).is_ok());
    }

    #[test]
    fn a_call_refused_by_one_quota_consumes_neither() {
        let t = quota("t", Some("3/h"));
        let u = quota("u", None);
        let tenant_rate = Some(rate("2/h"));
        let plan = QuotaPlan {
            tools: vec![t, u],
            tenants: vec![("a", tenant_rate)],
        };
        let limits = RateLimits::build(&plan, SharedClock::new(ManualClock::new(0)), None);
        // The tenant quota (2/h) is used up by u; t's own quota (3/h) must stay untouched.
        assert!(limits.check("a", u, tenant_rate).is_ok());
        assert!(limits.check("a", u, tenant_rate).is_ok());
        for _ in 0..5 {
            let refused = limits.check("a", t, tenant_rate).unwrap_err();
            assert!(refused.message.contains("overall"), "{}", refused.message);
        }
        let views = limits.view("a", t, tenant_rate);
        assert_eq!(views[0].scope, "tool");
        assert_eq!(
            views[0].remaining, 3,
            "t's quota was consumed by refused calls"
        );
        assert_eq!(views[1].remaining, 0);
    }
}
