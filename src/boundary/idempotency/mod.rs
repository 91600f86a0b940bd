//! Stage 10: idempotency. A repeat of a key within the window returns the first call's result
//! without running again; a concurrent duplicate waits for the first; the same key with different
//! arguments is refused.
//!
//! - Keys are scoped to the caller: (tenant, subject, agent, tool, key). Another subject using the
//!   same key string never receives someone else's stored result.
//! - Only final outcomes are kept: OK and non-retryable errors. A retryable outcome (a read-only
//!   tool's timeout, `upstream_unavailable`, `overloaded`, …) releases the key so the retry runs.
//!   A call that wrote nothing yet and was cancelled releases it too; a write tool cancelled or
//!   timed out after its backend started keeps the key with an "outcome unknown" result, so a
//!   retry cannot write twice.
//! - Memory is bounded per tenant (entries and bytes) and in total (bytes). A tenant over its
//!   budget forgets its own oldest finished entries; when the total is over budget, the tenant
//!   holding the most bytes gives way. One tenant cannot evict another's entries while under its
//!   own share. With every entry of a tenant still running, new keys are refused (`overloaded`).
//!
//! [`Idempotency`] is what the chain calls: this in-memory [`IdempotencyStore`], or keys shared
//! by every sidecar through Redis ([`redis`]), which keeps the same rules.

mod explain;
pub mod redis;

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::sync::watch;

use crate::{
    clock::SharedClock,
    error::{Reason, Refusal, Stage},
    settings::RiskLevel,
};

/// What a finished execution left: its output or refusal, and the version that ran.
#[derive(Debug, Clone)]
pub struct Stored {
    pub result: Result<String, Refusal>,
    pub tool_version: String,
}

impl Stored {
    pub(crate) fn bytes(&self) -> usize {
        let text = match &self.result {
            Ok(output) => output.len(),
            Err(refusal) => refusal.message.len() + refusal.detail.as_ref().map_or(0, String::len),
        };
        text + self.tool_version.len()
    }
}

/// Who used a key: the caller's identity and the tool, plus the key itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub tenant: String,
    pub subject: String,
    pub agent: String,
    pub tool: String,
    pub key: String,
}

impl Key {
    fn bytes(&self) -> usize {
        self.tenant.len() + self.subject.len() + self.agent.len() + self.tool.len() + self.key.len()
    }

    /// What an entry for this key costs before it holds a result.
    pub(crate) fn entry_bytes(&self) -> usize {
        self.bytes() + SHA_HEX + ENTRY_OVERHEAD
    }
}

/// Budgets of the store.
pub use crate::settings::IdempotencyBudget as Budget;

/// Bytes an entry costs beyond its strings: the map slot, the queue slot, the watch channel.
const ENTRY_OVERHEAD: usize = 256;
/// SHA-256 hex of the arguments.
const SHA_HEX: usize = 64;

/// Where a duplicate waits for the first call's result.
type Waiting = watch::Receiver<Option<Stored>>;

enum State {
    InFlight { generation: u64, done: Waiting },
    Done { stored: Stored, at: Duration },
}

struct Entry {
    arguments_sha256: String,
    state: State,
    bytes: usize,
}

/// One tenant's share: its keys oldest first, and what they cost.
#[derive(Default)]
struct Tenant {
    order: VecDeque<Key>,
    bytes: usize,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    tenants: HashMap<String, Tenant>,
    bytes: usize,
    next_generation: u64,
}

impl Inner {
    fn remove(&mut self, key: &Key) -> Option<Entry> {
        let entry = self.entries.remove(key)?;
        self.bytes = self.bytes.saturating_sub(entry.bytes);
        if let Some(tenant) = self.tenants.get_mut(&key.tenant) {
            tenant.bytes = tenant.bytes.saturating_sub(entry.bytes);
            if let Some(position) = tenant.order.iter().position(|k| k == key) {
                tenant.order.remove(position);
            }
            if tenant.order.is_empty() {
                self.tenants.remove(&key.tenant);
            }
        }
        Some(entry)
    }

    fn insert(&mut self, key: Key, entry: Entry) {
        self.bytes += entry.bytes;
        let tenant = self.tenants.entry(key.tenant.clone()).or_default();
        tenant.bytes += entry.bytes;
        tenant.order.push_back(key.clone());
        self.entries.insert(key, entry);
    }

    /// Changes an entry's size in place (a running claim becoming a stored result).
    fn resize(&mut self, key: &Key, bytes: usize) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let old = std::mem::replace(&mut entry.bytes, bytes);
        self.bytes = self.bytes - old + bytes;
        if let Some(tenant) = self.tenants.get_mut(&key.tenant) {
            tenant.bytes = tenant.bytes - old + bytes;
        }
    }

    /// The oldest finished key of a tenant, other than `keep`.
    fn oldest_done(&self, tenant: &str, keep: &Key) -> Option<Key> {
        self.tenants
            .get(tenant)?
            .order
            .iter()
            .find(|k| {
                *k != keep
                    && matches!(
                        self.entries.get(*k),
                        Some(Entry {
                            state: State::Done { .. },
                            ..
                        })
                    )
            })
            .cloned()
    }
}

/// What claiming a key would find, as [`IdempotencyStore::peek`] reports it.
#[derive(Debug, Clone)]
pub enum Peek {
    /// No live entry: the call would run, and its final result be kept.
    Fresh,
    /// A final result within the window: it would be replayed.
    Replay(Stored),
    /// A call with this key is running: a duplicate would wait for its result.
    InFlight,
    /// The key was used with other arguments: refused as `idempotency_conflict`.
    Conflict,
}

/// The outcome of claiming a key.
pub enum Claim<'a> {
    /// Run the call, then [`Slot::finish`] it.
    Owner(Slot<'a>),
    /// A finished result to return as a replay.
    Replay(Stored),
}

/// The right to run a keyed call. Dropped unfinished (the call was cancelled), it releases the key
/// — unless a write tool's backend had started, when the outcome is unknown and is kept as such.
pub struct Slot<'a> {
    store: &'a IdempotencyStore,
    key: Key,
    generation: u64,
    done: watch::Sender<Option<Stored>>,
    finished: bool,
    /// Set when the call was handed to its backend.
    started: &'a AtomicBool,
    risk_level: RiskLevel,
    tool_version: String,
}

impl Slot<'_> {
    /// Keeps a final result for replays, or releases the key for a retryable one.
    pub fn finish(mut self, result: &Result<String, Refusal>) {
        self.finished = true;
        match result {
            Err(refusal) if refusal.retryable => self.release(),
            _ => self.keep(Stored {
                result: result.clone(),
                tool_version: self.tool_version.clone(),
            }),
        }
    }

    fn keep(&self, stored: Stored) {
        let stored = self.store.keep(&self.key, self.generation, stored);
        self.done.send_replace(Some(stored));
    }

    /// Forgets the claim: a waiting duplicate runs the call itself.
    fn release(&self) {
        let mut inner = self.store.lock();
        if matches!(inner.entries.get(&self.key), Some(Entry { state: State::InFlight { generation, .. }, .. }) if *generation == self.generation)
        {
            inner.remove(&self.key);
        }
        // Dropping `done` wakes waiters with nothing stored.
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if self.started.load(Ordering::Acquire) && self.risk_level != RiskLevel::ReadOnly {
            self.keep(Stored {
                result: Err(outcome_unknown(&self.key.key)),
                tool_version: self.tool_version.clone(),
            });
        } else {
            self.release();
        }
    }
}

/// The idempotency keys of a sidecar: in its memory, or shared through Redis.
pub enum Idempotency {
    Memory(IdempotencyStore),
    Shared(redis::RedisIdempotency),
}

/// The outcome of claiming a key, from either store.
pub enum Claimed<'a> {
    /// Run the call, then [`Owner::finish`] it.
    Owner(Owner<'a>),
    /// A finished result to return as a replay.
    Replay(Stored),
}

/// The right to run a keyed call, from either store.
pub enum Owner<'a> {
    Memory(Slot<'a>),
    Shared(redis::SharedSlot<'a>),
}

impl Owner<'_> {
    /// Keeps a final result for replays, or releases the key for a retryable one.
    pub async fn finish(self, result: &Result<String, Refusal>) {
        match self {
            Owner::Memory(slot) => slot.finish(result),
            // Boxed: only keyed calls on Redis pay for its future.
            Owner::Shared(slot) => Box::pin(slot.finish(result)).await,
        }
    }
}

impl Idempotency {
    /// The store for `backend`.
    pub fn on(backend: &crate::state::Backend, clock: SharedClock, budget: Budget) -> Self {
        match backend {
            crate::state::Backend::Memory => {
                Idempotency::Memory(IdempotencyStore::new(clock, budget))
            }
            crate::state::Backend::Redis(shared) => {
                Idempotency::Shared(redis::RedisIdempotency::new(shared.clone(), budget))
            }
        }
    }

    /// What claiming `key` would find now, changing nothing (ExplainTool, the shadow catalog).
    /// Only the shared store can fail: with Redis unreachable, the refusal a claim would get.
    pub async fn peek(
        &self,
        key: &Key,
        arguments_sha256: &str,
        tool_version: &str,
    ) -> Result<Peek, Refusal> {
        match self {
            Idempotency::Memory(store) => Ok(store.peek(key, arguments_sha256)),
            Idempotency::Shared(store) => {
                Box::pin(store.peek(key, arguments_sha256, tool_version)).await
            }
        }
    }

    /// Claims `key` for a call with these arguments; `started` is set when the call reaches its
    /// backend. A duplicate of a running call waits for its result: in memory until it ends; in
    /// Redis, which has to be polled, until `wait_until`, then `idempotency_in_progress`. A
    /// shared claim lasts `lease` if its sidecar goes silent.
    #[expect(
        clippy::too_many_arguments,
        reason = "the call's key, hash, deadlines and lease, for both stores"
    )]
    pub async fn claim<'a>(
        &'a self,
        key: Key,
        arguments_sha256: &str,
        risk_level: RiskLevel,
        tool_version: &str,
        started: &'a AtomicBool,
        lease: Duration,
        wait_until: tokio::time::Instant,
    ) -> Result<Claimed<'a>, Refusal> {
        Ok(match self {
            Idempotency::Memory(store) => {
                match store
                    .claim(key, arguments_sha256, risk_level, tool_version, started)
                    .await?
                {
                    Claim::Owner(slot) => Claimed::Owner(Owner::Memory(slot)),
                    Claim::Replay(stored) => Claimed::Replay(stored),
                }
            }
            Idempotency::Shared(store) => {
                match Box::pin(store.claim(
                    key,
                    arguments_sha256,
                    risk_level,
                    tool_version,
                    started,
                    lease,
                    wait_until,
                ))
                .await?
                {
                    redis::SharedClaim::Owner(slot) => Claimed::Owner(Owner::Shared(slot)),
                    redis::SharedClaim::Replay(stored) => Claimed::Replay(stored),
                }
            }
        })
    }

    /// Bytes held in this sidecar's memory (shared keys are in Redis).
    pub fn bytes(&self) -> usize {
        match self {
            Idempotency::Memory(store) => store.bytes(),
            Idempotency::Shared(_) => 0,
        }
    }
}

/// Idempotency results of one server, in its memory.
pub struct IdempotencyStore {
    clock: SharedClock,
    budget: Budget,
    inner: Mutex<Inner>,
}

/// How many times a duplicate re-claims after owners released the key before giving up.
const MAX_CLAIMS: usize = 8;

impl IdempotencyStore {
    pub fn new(clock: SharedClock, budget: Budget) -> Self {
        IdempotencyStore {
            clock,
            budget,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every update keeps the maps and byte counts consistent before it can panic.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Claims `key` for a call with these arguments. `started` is set by the caller when the
    /// call reaches its backend.
    pub async fn claim<'a>(
        &'a self,
        key: Key,
        arguments_sha256: &str,
        risk_level: RiskLevel,
        tool_version: &str,
        started: &'a AtomicBool,
    ) -> Result<Claim<'a>, Refusal> {
        for _ in 0..MAX_CLAIMS {
            let mut waiting = match self.try_claim(&key, arguments_sha256)? {
                Ok(generation) => {
                    return Ok(Claim::Owner(Slot {
                        store: self,
                        key,
                        generation: generation.0,
                        done: generation.1,
                        finished: false,
                        started,
                        risk_level,
                        tool_version: tool_version.to_owned(),
                    }));
                }
                Err(Ok(stored)) => return Ok(Claim::Replay(stored)),
                Err(Err(waiting)) => waiting,
            };
            if let Ok(stored) = waiting.wait_for(Option::is_some).await
                && let Some(stored) = stored.clone()
            {
                return Ok(Claim::Replay(stored));
            }
            // The first call ended without a final result; try to become the owner.
        }
        Err(Refusal::new(
            Stage::Idempotency,
            Reason::Overloaded,
            "the calls with this idempotency key keep ending without a result; retry later",
        ))
    }

    /// Claims without waiting: the new claim's generation and sender, a stored result, or where
    /// to wait for the running first call.
    #[expect(
        clippy::type_complexity,
        reason = "the three outcomes of a claim, spelled where they are made"
    )]
    fn try_claim(
        &self,
        key: &Key,
        arguments_sha256: &str,
    ) -> Result<Result<(u64, watch::Sender<Option<Stored>>), Result<Stored, Waiting>>, Refusal>
    {
        let now = self.clock.monotonic();
        let mut inner = self.lock();
        if let Some(entry) = inner.entries.get(key) {
            let live = match &entry.state {
                State::Done { at, .. } => now.saturating_sub(*at) < self.budget.window,
                State::InFlight { .. } => true,
            };
            if live {
                if entry.arguments_sha256 != arguments_sha256 {
                    return Err(conflict(&key.key));
                }
                return Ok(Err(match &entry.state {
                    State::Done { stored, .. } => Ok(stored.clone()),
                    State::InFlight { done, .. } => Err(done.clone()),
                }));
            }
            inner.remove(key);
        }
        let bytes = key.entry_bytes();
        self.make_room(&mut inner, now, key, bytes, true)?;
        let generation = inner.next_generation;
        inner.next_generation += 1;
        let (done, receiver) = watch::channel(None);
        inner.insert(
            key.clone(),
            Entry {
                arguments_sha256: arguments_sha256.to_owned(),
                state: State::InFlight {
                    generation,
                    done: receiver,
                },
                bytes,
            },
        );
        Ok(Ok((generation, done)))
    }

    /// Stores a final result under the claim, within the budgets; a result too large to keep is
    /// replaced by a refusal saying so (the call is not run again either way).
    fn keep(&self, key: &Key, generation: u64, stored: Stored) -> Stored {
        let now = self.clock.monotonic();
        let mut inner = self.lock();
        let current = matches!(inner.entries.get(key), Some(Entry { state: State::InFlight { generation: g, .. }, .. }) if *g == generation);
        if !current {
            return stored;
        }
        let base = key.entry_bytes();
        let mut stored = stored;
        let mut bytes = base + stored.bytes();
        if self
            .make_room(&mut inner, now, key, bytes.saturating_sub(base), false)
            .is_err()
        {
            stored = too_large_to_keep(&key.key, stored);
            bytes = base + stored.bytes();
        }
        inner.resize(key, bytes);
        if let Some(entry) = inner.entries.get_mut(key) {
            entry.state = State::Done {
                stored: stored.clone(),
                at: now,
            };
        }
        stored
    }

    /// Frees room for `adding` more bytes of `key`'s tenant (a new entry when `new`): expired
    /// entries go, then the tenant's own oldest finished ones; when the total is over budget,
    /// the oldest finished entries of the tenant holding the most. Refuses when that is not
    /// enough (everything left is still running).
    fn make_room(
        &self,
        inner: &mut Inner,
        now: Duration,
        key: &Key,
        adding: usize,
        new: bool,
    ) -> Result<(), Refusal> {
        let budget = self.budget;
        let expired: Vec<Key> = inner
            .entries
            .iter()
            .filter(|(_, e)| matches!(e.state, State::Done { at, .. } if now.saturating_sub(at) >= budget.window))
            .map(|(k, _)| k.clone())
            .take(1024)
            .collect();
        for k in expired {
            inner.remove(&k);
        }
        if adding > budget.max_bytes_per_tenant || adding > budget.max_bytes {
            return Err(overloaded());
        }
        let tenant_over = |inner: &Inner| {
            inner.tenants.get(&key.tenant).is_some_and(|t| {
                t.bytes + adding > budget.max_bytes_per_tenant
                    || (new && t.order.len() >= budget.max_entries_per_tenant)
            })
        };
        while tenant_over(inner) {
            let victim = inner.oldest_done(&key.tenant, key).ok_or_else(overloaded)?;
            inner.remove(&victim);
        }
        while inner.bytes + adding > budget.max_bytes {
            let largest = inner
                .tenants
                .iter()
                .filter(|(_, t)| {
                    t.order.iter().any(|k| {
                        k != key
                            && matches!(
                                inner.entries.get(k),
                                Some(Entry {
                                    state: State::Done { .. },
                                    ..
                                })
                            )
                    })
                })
                .max_by_key(|(_, t)| t.bytes)
                .map(|(name, _)| name.clone())
                .ok_or_else(overloaded)?;
            let victim = inner.oldest_done(&largest, key).ok_or_else(overloaded)?;
            inner.remove(&victim);
        }
        Ok(())
    }

    /// What claiming `key` with these arguments would find now, changing nothing: the same
    /// rules as [`Self::claim`], for explanations.
    pub fn peek(&self, key: &Key, arguments_sha256: &str) -> Peek {
        let now = self.clock.monotonic();
        let inner = self.lock();
        let Some(entry) = inner.entries.get(key) else {
            return Peek::Fresh;
        };
        let live = match &entry.state {
            State::Done { at, .. } => now.saturating_sub(*at) < self.budget.window,
            State::InFlight { .. } => true,
        };
        if !live {
            return Peek::Fresh;
        }
        if entry.arguments_sha256 != arguments_sha256 {
            return Peek::Conflict;
        }
        match &entry.state {
            State::Done { stored, .. } => Peek::Replay(stored.clone()),
            State::InFlight { .. } => Peek::InFlight,
        }
    }

    /// Keys held (running and finished).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held, as the budgets count them.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

/// What a replay of a write returns when the first call was cancelled (or its sidecar lost)
/// after the tool started: nobody knows whether it wrote.
fn outcome_unknown(key: &str) -> Refusal {
    Refusal::new(
        Stage::Execute,
        Reason::Cancelled,
        format!(
            "the first call with idempotency key {key:?} was cancelled after the tool started; its outcome is unknown and changes may have been made"
        ),
    )
    .with_retryable(false)
}

/// What is kept instead of a result too large for the budgets: the call is not run again.
fn too_large_to_keep(key: &str, stored: Stored) -> Stored {
    let size = stored.bytes();
    Stored {
        result: Err(Refusal::new(
            Stage::Idempotency,
            Reason::OutputTooLarge,
            format!(
                "the first call with idempotency key {key:?} ran, but its result ({size} bytes) was too large to keep for replays"
            ),
        )),
        tool_version: stored.tool_version,
    }
}

fn overloaded() -> Refusal {
    Refusal::new(
        Stage::Idempotency,
        Reason::Overloaded,
        "too many idempotent calls are running for this tenant; retry shortly",
    )
}

/// A key already used with different arguments (by execution and by explain alike).
pub(super) fn conflict(key: &str) -> Refusal {
    Refusal::new(
        Stage::Idempotency,
        Reason::IdempotencyConflict,
        format!("idempotency key {key:?} was already used with different arguments"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn budget() -> Budget {
        Budget {
            window: Duration::from_secs(60),
            max_entries_per_tenant: 3,
            max_bytes_per_tenant: 4096,
            max_bytes: 6000,
        }
    }

    fn key(tenant: &str, subject: &str, k: &str) -> Key {
        Key {
            tenant: tenant.into(),
            subject: subject.into(),
            agent: String::new(),
            tool: "t".into(),
            key: k.into(),
        }
    }

    async fn run(
        store: &IdempotencyStore,
        key: Key,
        sha: &str,
        result: Result<String, Refusal>,
    ) -> bool {
        let started = AtomicBool::new(true);
        match store
            .claim(key, sha, RiskLevel::WriteDraft, "1", &started)
            .await
            .unwrap()
        {
            Claim::Owner(slot) => {
                slot.finish(&result);
                true
            }
            Claim::Replay(_) => false,
        }
    }

    #[tokio::test]
    async fn repeat_replays_conflict_refuses_and_window_expires() {
        let clock = ManualClock::new(0);
        let store = IdempotencyStore::new(SharedClock::new(clock.clone()), budget());
        assert!(run(&store, key("acme", "alice", "k"), "h", Ok("first".into())).await);
        assert!(!run(&store, key("acme", "alice", "k"), "h", Ok("again".into())).await);
        let started = AtomicBool::new(false);
        let err = store
            .claim(
                key("acme", "alice", "k"),
                "other",
                RiskLevel::ReadOnly,
                "1",
                &started,
            )
            .await
            .err()
            .unwrap();
        assert_eq!(err.reason, Reason::IdempotencyConflict);
        // Another subject with the same key string is another key.
        assert!(run(&store, key("acme", "mallory", "k"), "h", Ok("x".into())).await);
        clock.advance(Duration::from_secs(61));
        assert!(run(&store, key("acme", "alice", "k"), "other", Ok("x".into())).await);
    }

    #[tokio::test]
    async fn retryable_results_release_the_key() {
        let store = IdempotencyStore::new(SharedClock::system(), budget());
        let busy = Refusal::new(Stage::Execute, Reason::UpstreamUnavailable, "down");
        assert!(run(&store, key("acme", "a", "k"), "h", Err(busy)).await);
        assert!(run(&store, key("acme", "a", "k"), "h", Ok("ran".into())).await);
        assert!(!run(&store, key("acme", "a", "k"), "h", Ok("not again".into())).await);
    }

    #[tokio::test]
    async fn one_tenant_cannot_evict_another() {
        let store = IdempotencyStore::new(SharedClock::system(), budget());
        assert!(run(&store, key("acme", "a", "keep"), "h", Ok("acme".into())).await);
        for i in 0..50 {
            run(
                &store,
                key("globex", "g", &format!("k{i}")),
                "h",
                Ok("x".repeat(500)),
            )
            .await;
        }
        assert!(!run(&store, key("acme", "a", "keep"), "h", Ok("again".into())).await);
        assert!(store.bytes() <= budget().max_bytes);
        // A result larger than a tenant's budget is not kept, but the key is.
        let big = "y".repeat(10_000);
        assert!(run(&store, key("acme", "a", "big"), "h", Ok(big)).await);
        assert!(!run(&store, key("acme", "a", "big"), "h", Ok("again".into())).await);
    }
}
