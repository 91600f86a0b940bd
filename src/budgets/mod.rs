//! What each run and each caller's day has spent of its budgets (`catalog::budgets`): calls,
//! cost, calls of the tools a budget counts apart, and when the run began.
//!
//! A call takes its share of every budget that applies as it is admitted (stage 8, decided with
//! the quotas: in memory under one lock, in Redis by the quotas' own script, one round trip),
//! and gives it back when its backend is never reached (a pending approval, an idempotent
//! replay, a backend that could not be reached). Two calls racing for the last unit: exactly one
//! gets it.
//!
//! In memory the spending is this sidecar's, bounded per tenant (least recently used forgotten).
//! With `state: redis` each budget is one hash (`<prefix>{tenant}:budget:run:<id>` or
//! `…:budget:day:<day>:<id>`) that every sidecar of the fleet, and every agent a run hands work
//! to, spends from.

pub mod redis;

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use prometheus_client::metrics::{counter::Counter, family::Family};

use crate::{
    catalog::{Budget, BudgetPolicy},
    clock::SharedClock,
    error::{Reason, Refusal, Stage},
    metrics::Metrics,
    state::StateError,
};

/// Which budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// One run: tenant, subject and the client's run id.
    Run,
    /// One caller (tenant and subject) over a UTC day.
    CallerDaily,
    /// What one handoff gave its sub-agent (and every agent it hands off to).
    Handoff,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Run => "run",
            Kind::CallerDaily => "caller_daily",
            Kind::Handoff => "handoff",
        }
    }
}

/// One budget's spending, as its store keys it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub kind: Kind,
    pub tenant: Arc<str>,
    /// A digest of whose (and which run, or which day).
    pub id: String,
}

/// What a call takes of one budget.
#[derive(Debug, Clone)]
pub struct Charge {
    pub key: Key,
    pub budget: Budget,
    /// Units of cost (what the tool's quota counts: its `rate_limit.cost`, or 1).
    pub cost: u64,
    /// The tool, with the most calls of it the budget admits, when it counts the tool apart.
    pub tool: Option<(String, u64)>,
    /// How long the spending is kept after this call.
    pub keep: Duration,
    /// Whose budget, in words, for refusals: `run "r-1"` or `the caller's day (UTC)`.
    pub whose: String,
}

/// The limit a refused call ran into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limit {
    Calls,
    Cost,
    ToolCalls(String),
    /// Milliseconds since the run's first call.
    WallTime,
}

impl Limit {
    /// As the metrics label it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Limit::Calls => "calls",
            Limit::Cost => "cost",
            Limit::ToolCalls(_) => "tool_calls",
            Limit::WallTime => "wall_time",
        }
    }
}

/// A budget that has no room for a call: which, what ran out, how much was used of how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exhausted {
    pub kind: Kind,
    pub limit: Limit,
    pub used: u64,
    pub max: u64,
    pub whose: String,
}

impl Exhausted {
    pub fn refusal(&self) -> Refusal {
        let budget = match self.kind {
            Kind::Run => "run budget",
            Kind::CallerDaily => "daily budget",
            Kind::Handoff => "handoff's budget",
        };
        let spent = match &self.limit {
            Limit::Calls => format!("{} of its {} calls used", self.used, self.max),
            Limit::Cost => format!("{} of its {} units of cost used", self.used, self.max),
            Limit::ToolCalls(tool) => {
                format!("{} of its {} calls of {tool} used", self.used, self.max)
            }
            Limit::WallTime => format!(
                "its wall time of {} has passed ({} since the run's first call)",
                words(Duration::from_millis(self.max)),
                words(Duration::from_millis(self.used))
            ),
        };
        Refusal::new(
            Stage::RateLimit,
            Reason::RunBudgetExhausted,
            match self.kind {
                Kind::Handoff => format!("the {budget} ({}) is exhausted: {spent}", self.whose),
                _ => format!(
                    "the {budget} ({}: budgets.{}) is exhausted: {spent}",
                    self.whose,
                    self.kind.as_str()
                ),
            },
        )
    }
}

fn words(duration: Duration) -> String {
    humantime::format_duration(Duration::from_secs(duration.as_secs())).to_string()
}

/// What one budget has spent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub calls: u64,
    pub cost: u64,
    /// Calls of the tool the charge counts apart (0 when it counts none).
    pub tool_calls: u64,
    /// When its first call was admitted (Unix ms); `None` before any.
    pub first_ms: Option<i64>,
}

impl Charge {
    /// Whether this charge fits what `usage` has spent, at `now_ms`.
    pub fn check(&self, usage: &Usage, now_ms: i64) -> Result<(), Exhausted> {
        let exhausted = |limit, used, max| Exhausted {
            kind: self.key.kind,
            limit,
            used,
            max,
            whose: self.whose.clone(),
        };
        if let (Some(wall), Some(first)) = (self.budget.max_wall_time, usage.first_ms) {
            let since = u64::try_from(now_ms.saturating_sub(first)).unwrap_or(0);
            let wall = u64::try_from(wall.as_millis()).unwrap_or(u64::MAX);
            if since > wall {
                return Err(exhausted(Limit::WallTime, since, wall));
            }
        }
        if let Some(max) = self.budget.max_calls
            && usage.calls.saturating_add(1) > max
        {
            return Err(exhausted(Limit::Calls, usage.calls, max));
        }
        if let Some(max) = self.budget.max_cost
            && usage.cost.saturating_add(self.cost) > max
        {
            return Err(exhausted(Limit::Cost, usage.cost, max));
        }
        if let Some((tool, max)) = &self.tool
            && usage.tool_calls.saturating_add(1) > *max
        {
            return Err(exhausted(
                Limit::ToolCalls(tool.clone()),
                usage.tool_calls,
                *max,
            ));
        }
        Ok(())
    }
}

impl Charge {
    /// What the budget has left after `usage`, in words, for explanations: `run "r-1": 37 of
    /// 40 calls, 2 of 3 calls of send_email and 13m 20s of 15m left`.
    pub fn left_in_words(&self, usage: &Usage, now_ms: i64) -> String {
        let mut left = Vec::new();
        if let Some(max) = self.budget.max_calls {
            left.push(format!(
                "{} of {max} calls",
                max.saturating_sub(usage.calls)
            ));
        }
        if let Some(max) = self.budget.max_cost {
            left.push(format!(
                "{} of {max} units of cost",
                max.saturating_sub(usage.cost)
            ));
        }
        if let Some((tool, max)) = &self.tool {
            left.push(format!(
                "{} of {max} calls of {tool}",
                max.saturating_sub(usage.tool_calls)
            ));
        }
        if let Some(wall) = self.budget.max_wall_time {
            let since = usage.first_ms.map_or(Duration::ZERO, |first| {
                Duration::from_millis(u64::try_from(now_ms.saturating_sub(first)).unwrap_or(0))
            });
            left.push(format!(
                "{} of {} wall time",
                words(wall.saturating_sub(since)),
                words(wall)
            ));
        }
        match left.is_empty() {
            // A budget that counts only tools other than this one.
            true => format!("{}: nothing this call spends is limited", self.whose),
            false => format!("{}: {} left", self.whose, left.join(", ")),
        }
    }
}

/// The budgets a call of `tool` costing `cost` takes from, under `policy`: its run's (when it
/// names one) and its caller's day.
pub fn charges(
    policy: &BudgetPolicy,
    tenant: &Arc<str>,
    subject: &str,
    run_id: &str,
    tool: &str,
    cost: u64,
    now_ms: i64,
) -> Vec<Charge> {
    let mut charges = Vec::new();
    let tool_of = |budget: &Budget| budget.tool_limit(tool).map(|max| (tool.to_owned(), max));
    if let Some(budget) = &policy.run
        && !run_id.is_empty()
    {
        charges.push(Charge {
            key: Key {
                kind: Kind::Run,
                tenant: tenant.clone(),
                id: digest(&[subject, run_id]),
            },
            tool: tool_of(budget),
            budget: budget.clone(),
            cost,
            keep: policy.run_window,
            whose: format!("run {run_id:?}"),
        });
    }
    if let Some(budget) = &policy.caller_daily {
        let day = now_ms.div_euclid(DAY_MS);
        // Kept an hour past the day's end, so a sidecar whose clock is behind still finds it.
        let until_end = DAY_MS - now_ms.rem_euclid(DAY_MS) + 3_600_000;
        charges.push(Charge {
            key: Key {
                kind: Kind::CallerDaily,
                tenant: tenant.clone(),
                id: format!("{day}:{}", digest(&[subject])),
            },
            tool: tool_of(budget),
            budget: budget.clone(),
            cost,
            keep: Duration::from_millis(u64::try_from(until_end).unwrap_or(0)),
            whose: "this caller's day (UTC)".to_owned(),
        });
    }
    charges
}

const DAY_MS: i64 = 86_400_000;

/// What a call takes of a budget a handoff of its chain gave (`keep`: how long it is kept after
/// the call).
pub fn handoff_charge(
    tenant: &Arc<str>,
    handoff: &crate::identity::delegation::HandoffBudget,
    tool: &str,
    cost: u64,
    keep: Duration,
) -> Charge {
    let budget = Budget {
        max_calls: handoff.max_calls,
        max_cost: handoff.max_cost,
        max_calls_per_tool: handoff.max_calls_per_tool.clone(),
        max_wall_time: None,
    };
    Charge {
        key: Key {
            kind: Kind::Handoff,
            tenant: tenant.clone(),
            id: digest(&[&handoff.call]),
        },
        tool: budget.tool_limit(tool).map(|max| (tool.to_owned(), max)),
        budget,
        cost,
        keep,
        whose: format!(
            "the handoff of call {:?}",
            handoff.call.split('/').next().unwrap_or("")
        ),
    }
}

fn digest(parts: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    crate::canonical::lower_hex(&hasher.finalize()[..16])
}

struct Entry {
    usage: Usage,
    /// Calls of each tool counted apart.
    tools: HashMap<String, u64>,
    expires_at_ms: i64,
    last_ms: i64,
}

/// One tenant's entries of one kind by last use (Unix ms, then id), oldest first.
type Recency = BTreeSet<(i64, String)>;

/// Spending in this sidecar's memory.
#[derive(Default)]
struct Memory {
    entries: HashMap<Key, Entry>,
    /// Each tenant's entries of each kind, least recently used first.
    order: HashMap<(Arc<str>, Kind), Recency>,
}

impl Memory {
    fn usage(&self, charge: &Charge, now_ms: i64) -> Usage {
        self.entries
            .get(&charge.key)
            .filter(|e| now_ms < e.expires_at_ms)
            .map(|e| Usage {
                tool_calls: charge
                    .tool
                    .as_ref()
                    .and_then(|(tool, _)| e.tools.get(tool).copied())
                    .unwrap_or(0),
                ..e.usage.clone()
            })
            .unwrap_or_default()
    }

    fn commit(&mut self, charge: &Charge, now_ms: i64, max_entries: usize) {
        let key = &charge.key;
        let order = self
            .order
            .entry((key.tenant.clone(), key.kind))
            .or_default();
        let expires_at_ms =
            now_ms.saturating_add(i64::try_from(charge.keep.as_millis()).unwrap_or(i64::MAX));
        let entry = match self.entries.get_mut(key) {
            Some(entry) => {
                order.remove(&(entry.last_ms, key.id.clone()));
                if entry.expires_at_ms <= now_ms {
                    entry.usage = Usage::default();
                    entry.tools.clear();
                }
                entry
            }
            None => {
                while order.len() >= max_entries.max(1) {
                    let Some((_, oldest)) = order.pop_first() else {
                        break;
                    };
                    self.entries.remove(&Key {
                        id: oldest,
                        ..key.clone()
                    });
                }
                self.entries.entry(key.clone()).or_insert(Entry {
                    usage: Usage::default(),
                    tools: HashMap::new(),
                    expires_at_ms,
                    last_ms: now_ms,
                })
            }
        };
        entry.usage.calls = entry.usage.calls.saturating_add(1);
        entry.usage.cost = entry.usage.cost.saturating_add(charge.cost);
        entry.usage.first_ms.get_or_insert(now_ms);
        if let Some((tool, _)) = &charge.tool {
            let calls = entry.tools.entry(tool.clone()).or_default();
            *calls = calls.saturating_add(1);
        }
        entry.expires_at_ms = expires_at_ms;
        entry.last_ms = now_ms;
        order.insert((now_ms, key.id.clone()));
    }

    fn give_back(&mut self, charge: &Charge) {
        if let Some(entry) = self.entries.get_mut(&charge.key) {
            entry.usage.calls = entry.usage.calls.saturating_sub(1);
            entry.usage.cost = entry.usage.cost.saturating_sub(charge.cost);
            if let Some((tool, _)) = &charge.tool
                && let Some(calls) = entry.tools.get_mut(tool)
            {
                *calls = calls.saturating_sub(1);
            }
        }
    }
}

/// Where spending is kept: this sidecar's memory (also what decides during a Redis outage when
/// quotas fall back to it), and Redis when the state is shared.
pub struct Budgets {
    clock: SharedClock,
    local: Mutex<Memory>,
    redis: Option<Arc<crate::state::Redis>>,
    metrics: BudgetMetrics,
}

impl std::fmt::Debug for Budgets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budgets")
            .field("shared", &self.redis.is_some())
            .finish_non_exhaustive()
    }
}

impl Budgets {
    pub fn on(backend: &crate::state::Backend, clock: SharedClock, metrics: &Metrics) -> Self {
        Budgets {
            clock,
            local: Mutex::new(Memory::default()),
            redis: backend.redis().cloned(),
            metrics: BudgetMetrics::register(metrics),
        }
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.unix_ms()
    }

    /// Takes `charges` from this sidecar's memory if every one has room and `then` (the quotas'
    /// decision, taken under the same lock) admits the call; otherwise takes nothing.
    pub fn take_local<E>(
        &self,
        charges: &[Charge],
        max_entries: usize,
        then: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), TakeError<E>> {
        if charges.is_empty() {
            return then().map_err(TakeError::Other);
        }
        let now = self.now_ms();
        let mut memory = self.local.lock().unwrap_or_else(|p| p.into_inner());
        for charge in charges {
            if let Err(exhausted) = charge.check(&memory.usage(charge, now), now) {
                self.metrics.exhausted(&exhausted);
                return Err(TakeError::Exhausted(exhausted));
            }
        }
        then().map_err(TakeError::Other)?;
        for charge in charges {
            memory.commit(charge, now, max_entries);
        }
        Ok(())
    }

    /// Counts a budget found exhausted elsewhere (by the shared state's script).
    pub fn count_exhausted(&self, exhausted: &Exhausted) {
        self.metrics.exhausted(exhausted);
    }

    /// Gives back what a call took, its backend never reached. Where it was taken from: Redis
    /// when the state is shared and it answers, otherwise memory. (A call taken from memory
    /// during an outage and given back once Redis answers again gives back to Redis: the outage
    /// rule already made the shared budget approximate.)
    pub async fn give_back(&self, taken: Taken) {
        let Taken { charges, shared } = taken;
        if charges.is_empty() {
            return;
        }
        match (&self.redis, shared) {
            (Some(redis), true) => {
                if let Err(err) = redis::give_back(redis, &charges).await {
                    tracing::warn!(error = %err, "a call's budget could not be given back: its run spent it");
                }
            }
            _ => {
                let mut memory = self.local.lock().unwrap_or_else(|p| p.into_inner());
                for charge in &charges {
                    memory.give_back(charge);
                }
            }
        }
    }

    /// What each budget has spent now (for explanations), consuming nothing.
    pub async fn usage(&self, charges: &[Charge]) -> Result<Vec<Usage>, StateError> {
        match &self.redis {
            Some(redis) => redis::usage(redis, charges).await,
            None => {
                let now = self.now_ms();
                let memory = self.local.lock().unwrap_or_else(|p| p.into_inner());
                Ok(charges.iter().map(|c| memory.usage(c, now)).collect())
            }
        }
    }

    /// Entries held in this sidecar's memory.
    pub fn entries_held(&self) -> usize {
        self.local
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entries
            .len()
    }
}

/// What a call took from its budgets: given back ([`Budgets::give_back`]) if its backend is
/// never reached.
#[derive(Debug, Default)]
pub struct Taken {
    pub charges: Vec<Charge>,
    /// Taken from the shared state (otherwise from this sidecar's memory).
    pub shared: bool,
}

/// Why [`Budgets::take_local`] took nothing.
#[derive(Debug)]
pub enum TakeError<E> {
    Exhausted(Exhausted),
    Other(E),
}

/// `toolgate_run_budget_exhausted_total{budget, limit}`: calls refused by a budget.
#[derive(Clone, Debug)]
struct BudgetMetrics {
    exhausted: Family<Vec<(&'static str, &'static str)>, Counter>,
}

impl BudgetMetrics {
    fn register(metrics: &Metrics) -> Self {
        BudgetMetrics {
            exhausted: metrics.registered(
                "run_budget_exhausted",
                "Calls refused because a budget (budget: run or caller_daily; limit: calls, cost, tool_calls or wall_time) was exhausted",
            ),
        }
    }

    fn exhausted(&self, exhausted: &Exhausted) {
        self.exhausted
            .get_or_create(&vec![
                ("budget", exhausted.kind.as_str()),
                ("limit", exhausted.limit.as_str()),
            ])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn policy(run: Budget) -> BudgetPolicy {
        BudgetPolicy {
            run: Some(run),
            caller_daily: None,
            run_window: Duration::from_secs(3600),
            max_entries_per_tenant: 2,
        }
    }

    fn budgets(clock: &ManualClock) -> Budgets {
        Budgets::on(
            &crate::state::Backend::Memory,
            SharedClock::new(clock.clone()),
            &Metrics::default(),
        )
    }

    fn take(budgets: &Budgets, charges: &[Charge]) -> Result<(), Exhausted> {
        take_keeping(budgets, charges, 100)
    }

    fn take_keeping(budgets: &Budgets, charges: &[Charge], most: usize) -> Result<(), Exhausted> {
        budgets
            .take_local::<()>(charges, most, || Ok(()))
            .map_err(|e| match e {
                TakeError::Exhausted(e) => e,
                TakeError::Other(()) => unreachable!(),
            })
    }

    #[test]
    fn a_run_spends_calls_cost_and_one_tools_calls_until_each_runs_out() {
        let clock = ManualClock::new(1_000_000);
        let budgets = budgets(&clock);
        let policy = policy(Budget {
            max_calls: Some(4),
            max_cost: Some(5),
            max_calls_per_tool: [("send_email".to_owned(), 1)].into(),
            max_wall_time: Some(Duration::from_secs(60)),
        });
        let tenant: Arc<str> = "acme".into();
        let now = budgets.now_ms();
        let send = charges(&policy, &tenant, "alice", "r1", "send_email", 1, now);
        let search = |cost| charges(&policy, &tenant, "alice", "r1", "search", cost, now);
        assert_eq!(take(&budgets, &send), Ok(()));
        let refused = take(&budgets, &send).unwrap_err();
        assert_eq!(refused.limit, Limit::ToolCalls("send_email".into()));
        assert_eq!((refused.used, refused.max), (1, 1));
        // Another run of the same person, and another person's run of the same id, are apart.
        assert!(
            take(
                &budgets,
                &charges(&policy, &tenant, "alice", "r2", "send_email", 1, now)
            )
            .is_ok()
        );
        assert!(
            take(
                &budgets,
                &charges(&policy, &tenant, "bob", "r1", "send_email", 1, now)
            )
            .is_ok()
        );
        assert_eq!(take(&budgets, &search(3)), Ok(()));
        let refused = take(&budgets, &search(2)).unwrap_err();
        assert_eq!(
            (refused.limit.clone(), refused.used, refused.max),
            (Limit::Cost, 4, 5)
        );
        assert!(
            refused
                .refusal()
                .message
                .contains("4 of its 5 units of cost used")
        );
        budgets
            .give_back(Taken {
                charges: search(3),
                shared: false,
            })
            .now_or_never();
        assert_eq!(take(&budgets, &search(2)), Ok(()));
        clock.advance(Duration::from_secs(61));
        let later = charges(
            &policy,
            &tenant,
            "alice",
            "r1",
            "search",
            1,
            budgets.now_ms(),
        );
        let refused = take(&budgets, &later).unwrap_err();
        assert_eq!(refused.limit, Limit::WallTime);
        assert_eq!(refused.refusal().reason, Reason::RunBudgetExhausted);
    }

    #[test]
    fn calls_without_a_run_id_take_only_the_callers_day() {
        let policy = BudgetPolicy {
            caller_daily: Some(Budget {
                max_calls: Some(1),
                ..Budget::default()
            }),
            ..policy(Budget {
                max_calls: Some(1),
                ..Budget::default()
            })
        };
        let tenant: Arc<str> = "acme".into();
        let taken = charges(&policy, &tenant, "alice", "", "search", 1, 0);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].key.kind, Kind::CallerDaily);
        // The next UTC day is another key.
        let tomorrow = charges(&policy, &tenant, "alice", "", "search", 1, DAY_MS);
        assert_ne!(taken[0].key, tomorrow[0].key);
    }

    #[test]
    fn memory_is_bounded_per_tenant_and_kind_and_a_refused_quota_takes_nothing() {
        let clock = ManualClock::new(1_000_000);
        let budgets = budgets(&clock);
        let policy = policy(Budget {
            max_calls: Some(1),
            ..Budget::default()
        });
        let tenant: Arc<str> = "acme".into();
        for run in ["a", "b", "c"] {
            let c = charges(&policy, &tenant, "alice", run, "t", 1, 0);
            assert!(take_keeping(&budgets, &c, 2).is_ok());
            clock.advance(Duration::from_millis(1));
        }
        assert_eq!(budgets.entries_held(), 2);
        let c = charges(&policy, &tenant, "alice", "d", "t", 1, 0);
        let refused = budgets.take_local(&c, 2, || Err("no room"));
        assert!(matches!(refused, Err(TakeError::Other("no room"))));
        assert!(take_keeping(&budgets, &c, 2).is_ok());
        // Run "a" was forgotten for "c"; "c" is still spent.
        let a = charges(&policy, &tenant, "alice", "a", "t", 1, 0);
        let c_again = charges(&policy, &tenant, "alice", "c", "t", 1, 0);
        assert!(take_keeping(&budgets, &c_again, 2).is_err());
        assert!(take_keeping(&budgets, &a, 2).is_ok());
    }

    use futures::FutureExt;
}
