//! Rate limits (stage 8) over governor: per (tenant, tool) quotas from each tool's `rate_limit`,
//! and an optional overall quota per tenant. Decisions are atomic, so exact under concurrency.
//!
//! Keys are tenants, which the access stage already limited to the catalog's tenants, so the keyed
//! stores stay bounded; [`RateLimits::retain_recent`] also sheds idle keys. Limiter state is keyed
//! by (tool, rate) and carried across catalog reloads for tools whose quota did not change.

use std::{collections::HashMap, sync::Arc, time::Duration};

use governor::{
    Quota, RateLimiter,
    middleware::NoOpMiddleware,
    nanos::Nanos,
    state::{InMemoryState, NotKeyed, keyed::DefaultKeyedStateStore},
};

use crate::{
    catalog::{Catalog, ToolVersion},
    clock::SharedClock,
    config::Rate,
    error::{Reason, Refusal, Stage},
};

/// A tenant as the keyed limiters know it: shared, so a check clones a pointer, not the name.
type TenantKey = Arc<str>;
type KeyedLimiter =
    RateLimiter<TenantKey, DefaultKeyedStateStore<TenantKey>, SharedClock, NoOpMiddleware<Nanos>>;
type DirectLimiter = RateLimiter<NotKeyed, InMemoryState, SharedClock, NoOpMiddleware<Nanos>>;

/// All rate limiters for one catalog. Maps are keyed by `String` and looked up by `&str`, so
/// admitting a call allocates nothing.
#[derive(Clone)]
pub struct RateLimits {
    clock: SharedClock,
    /// The catalog's tenants as limiter keys.
    tenant_keys: HashMap<String, TenantKey>,
    /// Tool name -> its limiters keyed by tenant, one per distinct rate among its versions.
    per_tool: HashMap<String, Vec<(Rate, Arc<KeyedLimiter>)>>,
    /// Tenant -> its overall limiter and that limiter's rate.
    per_tenant: HashMap<String, (Rate, Arc<DirectLimiter>)>,
}

fn quota(rate: Rate) -> Quota {
    let per_cell = rate.period / rate.count.get();
    Quota::with_period(per_cell.max(Duration::from_nanos(1)))
        .unwrap_or_else(|| Quota::per_second(rate.count))
        .allow_burst(rate.burst)
}

impl RateLimits {
    /// Limiters for `catalog`, reusing `previous` state where a tool's or tenant's rate is unchanged.
    pub fn build(catalog: &Catalog, clock: SharedClock, previous: Option<&RateLimits>) -> Self {
        let mut per_tool: HashMap<String, Vec<(Rate, Arc<KeyedLimiter>)>> = HashMap::new();
        for tool in catalog.versions() {
            let Some(rate) = tool.rate_limit else {
                continue;
            };
            let limiters = per_tool.entry(tool.name.clone()).or_default();
            if find_rate(limiters, rate).is_some() {
                continue;
            }
            let limiter = previous
                .and_then(|p| find_rate(p.per_tool.get(&tool.name)?, rate))
                .unwrap_or_else(|| {
                    Arc::new(RateLimiter::new(
                        quota(rate),
                        DefaultKeyedStateStore::default(),
                        clock.clone(),
                    ))
                });
            limiters.push((rate, limiter));
        }
        let mut per_tenant = HashMap::new();
        for (tenant, policy) in &catalog.tenants {
            let Some(rate) = policy.rate_limit else {
                continue;
            };
            let limiter = previous
                .and_then(|p| p.per_tenant.get(tenant))
                .filter(|(previous_rate, _)| *previous_rate == rate)
                .map(|(_, limiter)| limiter.clone())
                .unwrap_or_else(|| {
                    Arc::new(RateLimiter::new(
                        quota(rate),
                        InMemoryState::default(),
                        clock.clone(),
                    ))
                });
            per_tenant.insert(tenant.clone(), (rate, limiter));
        }
        let tenant_keys = catalog
            .tenants
            .keys()
            .map(|tenant| (tenant.clone(), TenantKey::from(tenant.as_str())))
            .collect();
        RateLimits {
            clock,
            tenant_keys,
            per_tool,
            per_tenant,
        }
    }

    /// Admits one call of `tool` for `tenant`, or says how long to wait.
    pub fn check(
        &self,
        tenant: &str,
        tool: &ToolVersion,
        tenant_rate: Option<Rate>,
    ) -> Result<(), Refusal> {
        use governor::clock::Clock as _;
        if let Some(rate) = tool.rate_limit
            && let Some(limiter) = self
                .per_tool
                .get(&tool.name)
                .and_then(|limiters| find_rate(limiters, rate))
            && let Err(not_until) = limiter.check_key(&self.tenant_key(tenant))
        {
            let wait = not_until.wait_time_from(self.clock.now());
            return Err(refusal(
                format!(
                    "rate limit {} for {} reached for tenant {tenant}",
                    describe(rate),
                    tool.name
                ),
                wait,
            ));
        }
        if let Some(rate) = tenant_rate
            && let Some((_, limiter)) = self
                .per_tenant
                .get(tenant)
                .filter(|(limiter_rate, _)| *limiter_rate == rate)
            && let Err(not_until) = limiter.check()
        {
            let wait = not_until.wait_time_from(self.clock.now());
            return Err(refusal(
                format!(
                    "tenant {tenant} reached its overall rate limit {}",
                    describe(rate)
                ),
                wait,
            ));
        }
        Ok(())
    }

    /// The limiter key for a tenant; a tenant outside the catalog (which the access stage has
    /// already refused) gets a key of its own.
    fn tenant_key(&self, tenant: &str) -> TenantKey {
        self.tenant_keys
            .get(tenant)
            .cloned()
            .unwrap_or_else(|| TenantKey::from(tenant))
    }

    fn keyed_limiters(&self) -> impl Iterator<Item = &Arc<KeyedLimiter>> {
        self.per_tool
            .values()
            .flat_map(|limiters| limiters.iter().map(|(_, limiter)| limiter))
    }

    /// Forgets keys whose state no longer matters (their window has passed).
    pub fn retain_recent(&self) {
        for limiter in self.keyed_limiters() {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }

    /// Number of (tenant) keys held across all per-tool limiters.
    pub fn keys_held(&self) -> usize {
        self.keyed_limiters().map(|l| l.len()).sum()
    }
}

fn find_rate(limiters: &[(Rate, Arc<KeyedLimiter>)], rate: Rate) -> Option<Arc<KeyedLimiter>> {
    limiters
        .iter()
        .find(|(limiter_rate, _)| *limiter_rate == rate)
        .map(|(_, limiter)| limiter.clone())
}

/// How often idle rate-limit keys are shed.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

fn refusal(message: String, wait: Duration) -> Refusal {
    // Round up so a client that waits exactly this long is admitted.
    let wait = Duration::from_millis(
        u64::try_from(wait.as_nanos().div_ceil(1_000_000))
            .unwrap_or(u64::MAX)
            .max(1),
    );
    Refusal::new(Stage::RateLimit, Reason::RateLimited, message).with_retry_after(wait)
}

fn describe(rate: Rate) -> String {
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
    use crate::{
        clock::ManualClock,
        config::{Config, Env},
    };

    #[test]
    fn idle_keys_are_shed_and_state_survives_an_unchanged_reload() {
        let yaml = r#"version: 1
identity: { dev_identity: true }
tenants: { a: {}, b: {}, c: {} }
tools:
  - { name: t, description: d, risk_level: read_only, rate_limit: 2/min, executor: { builtin: echo }, input_schema: { type: object } }
"#;
        let catalog = || {
            Config::from_yaml(yaml, "t", std::path::Path::new("."), &Env::default())
                .unwrap()
                .catalog
        };
        let clock = ManualClock::new(0);
        let first = catalog();
        let limits = RateLimits::build(&first, SharedClock::new(clock.clone()), None);
        let tool = first.versions().next().unwrap();
        for tenant in ["a", "b", "c"] {
            assert!(limits.check(tenant, tool, None).is_ok());
        }
        assert!(limits.check("a", tool, None).is_ok());
        assert!(limits.check("a", tool, None).is_err());
        assert_eq!(limits.keys_held(), 3);

        // A reload with the same quota keeps the state: tenant a is still limited.
        let reloaded =
            RateLimits::build(&catalog(), SharedClock::new(clock.clone()), Some(&limits));
        assert!(reloaded.check("a", tool, None).is_err());

        // Once every key's state is indistinguishable from a fresh one, it goes.
        clock.advance(Duration::from_secs(120));
        reloaded.retain_recent();
        assert_eq!(reloaded.keys_held(), 0);
        assert!(reloaded.check("a", tool, None).is_ok());
    }
}
