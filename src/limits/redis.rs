//! Rate limits shared through Redis: both quotas of a call decided by one Lua script, so the
//! decision is atomic across every sidecar and costs one round trip. The script runs
//! [`Gcra::decide`](crate::gcra::Gcra::decide) in microseconds on Redis's own clock (`TIME`), so
//! sidecar clock skew does not matter; a call refused by one quota consumes neither.
//!
//! Keys are `<prefix>{<tenant>}:rl:tool:<tool>:<rate>` and `<prefix>{<tenant>}:rl:tenant:<rate>`:
//! one hash tag, so the script works on Redis Cluster, and the rate in the name, so a quota
//! whose rate changes starts fresh while an unchanged one carries over reloads. Each key
//! expires when its state says nothing a fresh key would not (its TAT has passed).

use std::{
    sync::{
        Arc, LazyLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use redis::Script;

use super::{
    Cost, QuotaScope, QuotaView, RateLimits, Spend, ToolQuota, metrics::QuotaMetrics,
    tenant_refusal, tool_refusal,
};
use crate::budgets::{self, Charge};
use crate::gcra::Gcra;
use crate::{
    error::{Reason, Refusal, Stage},
    settings::{OnUnavailable, Rate},
    state::{
        Concern, Redis, StateError,
        redis::{Op, Reply, script},
    },
};

/// GCRA over the call's quotas (the first ARGV[2] KEYS, at most two, in the order tool then
/// tenant), and the call's budgets (the KEYS after them: [`budgets::redis`]). ARGV[1] is
/// `take` (admit and commit, or refuse and change nothing) or `view` (report what the quotas
/// leave, no budgets); then each quota's emission interval and tolerance in microseconds and
/// the cells the call takes of it (at least one: a quota the call takes none of is not sent);
/// then each budget's arguments. `take` answers {1} when admitted, {2, ...} when a budget has
/// no room (checked first: its refusal is final, a quota's only says wait), or {0, index of the
/// refusing quota, wait in µs}; `view` answers the calls each quota would admit now. The
/// arithmetic is `Gcra::decide_cells`'.
static GCRA: LazyLock<String> = LazyLock::new(|| {
    format!(
        r#"
local now = now_us
local take = ARGV[1] == 'take'
local nq = tonumber(ARGV[2])
local nb = #KEYS - nq
local base = 3 + 3 * nq
if take then
{check}
end
local tats = {{}}
local remaining = {{}}
for i = 1, nq do
  local emission = tonumber(ARGV[3 * i])
  local tolerance = tonumber(ARGV[3 * i + 1])
  local cells = tonumber(ARGV[3 * i + 2])
  local tat = tonumber(redis.call('GET', KEYS[i]) or now)
  if tat < now then tat = now end
  local ahead = tat - now
  if take then
    local needed = ahead + emission * (cells - 1)
    if needed > tolerance then
      return {{0, i, needed - tolerance}}
    end
    tats[i] = tat + emission * cells
  elseif ahead > tolerance then
    remaining[i] = 0
  else
    remaining[i] = math.floor((tolerance - ahead) / emission) + 1
  end
end
if not take then
  return remaining
end
for i = 1, nq do
  redis.call('SET', KEYS[i], string.format('%.0f', tats[i]), 'PX', math.ceil((tats[i] - now) / 1000))
end
{commit}
return {{1}}
"#,
        check = budgets::redis::CHECK_LUA,
        commit = budgets::redis::COMMIT_LUA,
    )
});

static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(&GCRA));

/// The quotas of one catalog, decided in Redis.
pub struct SharedQuotas {
    redis: Arc<Redis>,
    /// Counts the calls decided by `fallback`.
    metrics: QuotaMetrics,
    /// This sidecar's own limiter, deciding while Redis cannot be reached when the config says
    /// `on_unavailable: local`.
    fallback: Option<RateLimits>,
    /// Set while calls are decided locally, so the outage is logged once, not per call.
    falling_back: Arc<AtomicBool>,
}

/// One quota of a call: its key, its arithmetic and the cells the call takes.
struct Quota {
    key: String,
    gcra: Gcra,
    rate: Rate,
    cells: u64,
    scope: QuotaScope,
}

impl SharedQuotas {
    pub fn new(
        redis: Arc<Redis>,
        metrics: QuotaMetrics,
        fallback: Option<RateLimits>,
        previous: Option<&SharedQuotas>,
    ) -> Self {
        let fallback = match redis.rate_limits_on_unavailable() {
            OnUnavailable::Local => fallback,
            OnUnavailable::FailClosed => None,
        };
        SharedQuotas {
            redis,
            metrics,
            fallback,
            falling_back: previous.map(|p| p.falling_back.clone()).unwrap_or_default(),
        }
    }

    /// The local limiter, when outages fall back to it.
    pub fn fallback(&self) -> Option<&RateLimits> {
        self.fallback.as_ref()
    }

    /// The quotas a call of `cost` takes cells of (a view takes none, and sees them all).
    fn quotas(
        &self,
        tenant: &str,
        tool: ToolQuota<'_>,
        tenant_rate: Option<Rate>,
        Cost(cells): Cost,
    ) -> Vec<Quota> {
        let tool_quota = tool.rate.filter(|_| cells > 0).map(|rate| Quota {
            key: self
                .redis
                .key(tenant, format_args!("rl:tool:{}:{}", tool.name, spec(rate))),
            gcra: Gcra::in_micros(rate),
            rate,
            cells,
            scope: QuotaScope::Tool,
        });
        let tenant_quota = tenant_rate.map(|rate| Quota {
            key: self
                .redis
                .key(tenant, format_args!("rl:tenant:{}", spec(rate))),
            gcra: Gcra::in_micros(rate),
            rate,
            cells: 1,
            scope: QuotaScope::Tenant,
        });
        tool_quota.into_iter().chain(tenant_quota).collect()
    }

    async fn run(
        &self,
        mode: &str,
        quotas: &[Quota],
        charges: &[Charge],
    ) -> Result<Reply, StateError> {
        let mut op = Op::new(&SCRIPT).arg(mode).arg(quotas.len());
        for quota in quotas {
            op = op
                .key(quota.key.as_str())
                .arg(quota.gcra.emission())
                .arg(quota.gcra.tolerance())
                .arg(quota.cells);
        }
        for charge in charges {
            op = budgets::redis::push(op, &self.redis, charge);
        }
        Reply::new(self.redis.invoke(Concern::RateLimits, &op).await?)
    }

    /// Admits one call if both its quotas and every budget of `spend` have room, in one round
    /// trip. `Ok(true)`: decided by the shared state; `Ok(false)`: by this sidecar alone, during
    /// an outage.
    pub async fn check(
        &self,
        tenant: &str,
        tool: ToolQuota<'_>,
        tenant_rate: Option<Rate>,
        cost: Cost,
        spend: &Spend<'_>,
    ) -> Result<bool, Refusal> {
        let quotas = self.quotas(tenant, tool, tenant_rate, cost);
        if quotas.is_empty() && spend.charges.is_empty() {
            return Ok(true);
        }
        let reply = match self.run("take", &quotas, spend.charges).await {
            Ok(reply) => reply,
            Err(err) => {
                return self
                    .unavailable(err, tenant, tool, tenant_rate, cost, spend)
                    .map(|()| false);
            }
        };
        if self.falling_back.swap(false, Ordering::Relaxed) {
            tracing::info!("rate limits are shared again");
        }
        let decided = || -> Result<Option<(usize, u64)>, StateError> {
            if reply.int(0)? == 1 {
                return Ok(None);
            }
            let index = usize::try_from(reply.int(1)?).unwrap_or(0);
            let wait = u64::try_from(reply.int(2)?).unwrap_or(0);
            Ok(Some((index, wait)))
        };
        if reply.int(0).is_ok_and(|answer| answer == 2) {
            let exhausted =
                budgets::redis::exhausted(spend.charges, &reply).map_err(unavailable)?;
            spend.budgets.count_exhausted(&exhausted);
            return Err(exhausted.refusal());
        }
        match decided() {
            Ok(None) => Ok(true),
            Ok(Some((index, wait_micros))) => {
                let wait = Duration::from_micros(wait_micros);
                let quota = quotas
                    .get(index.saturating_sub(1))
                    .ok_or_else(|| unavailable(StateError::Malformed("no such quota".into())))?;
                Err(match quota.scope {
                    QuotaScope::Tool => tool_refusal(tenant, tool, quota.rate, wait),
                    QuotaScope::Tenant => tenant_refusal(tenant, quota.rate, wait),
                })
            }
            Err(err) => Err(unavailable(err)),
        }
    }

    /// What each quota of this call would admit now, consuming nothing.
    pub async fn view(
        &self,
        tenant: &str,
        tool: ToolQuota<'_>,
        tenant_rate: Option<Rate>,
    ) -> Result<Vec<QuotaView>, StateError> {
        let quotas = self.quotas(tenant, tool, tenant_rate, Cost::ONE);
        if quotas.is_empty() {
            return Ok(Vec::new());
        }
        let reply = self.run("view", &quotas, &[]).await?;
        quotas
            .iter()
            .enumerate()
            .map(|(i, quota)| {
                Ok(QuotaView {
                    scope: quota.scope.as_str(),
                    rate: quota.rate,
                    remaining: u64::try_from(reply.int(i)?).unwrap_or(0),
                })
            })
            .collect()
    }

    /// Redis did not decide: refuse (fail closed), or — only while it cannot be reached —
    /// decide with this sidecar's own limiter. A Redis that answers but refused this operation
    /// (out of memory, a replica) is still the one deciding everyone else's quotas: deciding
    /// alone would let this sidecar's callers past a quota the others keep.
    fn unavailable(
        &self,
        err: StateError,
        tenant: &str,
        tool: ToolQuota<'_>,
        tenant_rate: Option<Rate>,
        cost: Cost,
        spend: &Spend<'_>,
    ) -> Result<(), Refusal> {
        let outage = matches!(err, StateError::Timeout(_) | StateError::Unreachable(_));
        let Some(local) = self.fallback.as_ref().filter(|_| outage) else {
            return Err(unavailable(err));
        };
        self.metrics.local_decision();
        if !self.falling_back.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %err, "shared rate limits unavailable: this sidecar decides quotas alone until the state backend answers");
        }
        spend.take_local(|| local.check_cost(tenant, tool, tenant_rate, cost))
    }
}

fn unavailable(err: StateError) -> Refusal {
    Refusal::new(
        Stage::RateLimit,
        Reason::StateUnavailable,
        format!(
            "the rate limits and budgets cannot be checked: {}; retry shortly",
            err.for_caller()
        ),
    )
}

/// A rate as part of a key: count, period in seconds and burst.
fn spec(rate: Rate) -> String {
    format!("{}/{}s/{}", rate.count, rate.period.as_secs(), rate.burst)
}
