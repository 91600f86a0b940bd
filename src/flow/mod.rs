//! What each flow scope has seen: the flow labels (`catalog::flow`) of the tools that ran in it,
//! and the calls that brought each, for the rules to read. A scope is a run (tenant, subject,
//! agent and the client's run id) or a caller (tenant, subject and agent); it is forgotten a
//! window after its last labelled call.
//!
//! A tenant keeps at most `flow.max_scopes_per_tenant` scopes (a new one past that evicts the
//! tenant's least recently labelled). In memory, scopes are this sidecar's. With `state: redis` they live in one hash per scope
//! (`<prefix>{tenant}:flow:<scope>`, label -> the calls that brought it, expiring with the
//! window), so a run that reads on one sidecar cannot send from another.

mod redis;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::{clock::SharedClock, state::StateError};

/// Calls remembered per label of a scope: the first ones that brought it.
pub const MAX_SOURCES_PER_LABEL: usize = 2;

/// One flow scope: its tenant and a digest of who (and, for runs, which run).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeKey {
    pub tenant: Arc<str>,
    pub id: String,
}

impl ScopeKey {
    /// `run`: the client's run id, for run scopes; `None` for caller scopes.
    pub fn new(tenant: &Arc<str>, subject: &str, agent: &str, run: Option<&str>) -> Self {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        for part in [subject, agent, run.unwrap_or("")] {
            hasher.update(part.as_bytes());
            hasher.update([0]);
        }
        hasher.update([u8::from(run.is_some())]);
        ScopeKey {
            tenant: tenant.clone(),
            id: crate::canonical::lower_hex(&hasher.finalize()[..16]),
        }
    }
}

/// A call that brought a label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Source {
    pub call_id: String,
    pub tool: String,
}

/// What a scope has seen: each label's name and the calls that brought it.
pub type Seen = BTreeMap<String, Vec<Source>>;

/// Adds `labels`, brought by `source`, to what a scope has seen (the first calls of each).
pub fn add(seen: &mut Seen, labels: &[&str], source: &Source) {
    for label in labels {
        let sources = seen.entry((*label).to_owned()).or_default();
        if sources.len() < MAX_SOURCES_PER_LABEL {
            sources.push(source.clone());
        }
    }
}

struct Entry {
    seen: Seen,
    expires_at_ms: i64,
    last_ms: i64,
}

/// Scopes in this sidecar's memory.
#[derive(Default)]
pub struct Memory {
    scopes: HashMap<ScopeKey, Entry>,
    /// Each tenant's scopes, least recently labelled first.
    per_tenant: HashMap<Arc<str>, BTreeSet<(i64, ScopeKey)>>,
}

/// Where scopes are kept.
pub enum FlowStore {
    Memory {
        clock: SharedClock,
        inner: Mutex<Memory>,
    },
    Shared(Arc<crate::state::Redis>),
}

impl std::fmt::Debug for FlowStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FlowStore::Memory { .. } => f.write_str("FlowStore::Memory"),
            FlowStore::Shared(_) => f.write_str("FlowStore::Shared"),
        }
    }
}

impl FlowStore {
    pub fn on(backend: &crate::state::Backend, clock: SharedClock) -> Self {
        match backend.redis() {
            Some(redis) => FlowStore::Shared(redis.clone()),
            None => FlowStore::Memory {
                clock,
                inner: Mutex::new(Memory::default()),
            },
        }
    }

    /// What the scope has seen (nothing once forgotten).
    pub async fn seen(&self, key: &ScopeKey) -> Result<Seen, StateError> {
        match self {
            FlowStore::Memory { clock, inner } => {
                let now = clock.unix_ms();
                let memory = inner.lock().unwrap_or_else(|p| p.into_inner());
                Ok(memory
                    .scopes
                    .get(key)
                    .filter(|e| now < e.expires_at_ms)
                    .map(|e| e.seen.clone())
                    .unwrap_or_default())
            }
            FlowStore::Shared(redis) => redis::seen(redis, key).await,
        }
    }

    /// Adds `labels`, brought by this call, to the scope, which is then kept for `window`; a
    /// tenant keeps at most `max_scopes` (its least recently labelled go first).
    pub async fn record(
        &self,
        key: &ScopeKey,
        labels: &[&str],
        source: &Source,
        window: Duration,
        max_scopes: usize,
    ) -> Result<(), StateError> {
        if labels.is_empty() {
            return Ok(());
        }
        match self {
            FlowStore::Memory { clock, inner } => {
                let now = clock.unix_ms();
                let expires_at_ms =
                    now.saturating_add(i64::try_from(window.as_millis()).unwrap_or(i64::MAX));
                let mut memory = inner.lock().unwrap_or_else(|p| p.into_inner());
                memory.record(key, labels, source, now, expires_at_ms, max_scopes);
                Ok(())
            }
            FlowStore::Shared(redis) => {
                redis::record(redis, key, labels, source, window, max_scopes).await
            }
        }
    }
}

impl Memory {
    fn record(
        &mut self,
        key: &ScopeKey,
        labels: &[&str],
        source: &Source,
        now: i64,
        expires_at_ms: i64,
        max_scopes: usize,
    ) {
        let order = self.per_tenant.entry(key.tenant.clone()).or_default();
        let entry = match self.scopes.get_mut(key) {
            Some(entry) => {
                order.remove(&(entry.last_ms, key.clone()));
                if entry.expires_at_ms <= now {
                    entry.seen.clear();
                }
                entry
            }
            None => {
                // Past the bound, the tenant's least recently labelled scopes go (an expired one
                // is among them).
                while order.len() >= max_scopes.max(1) {
                    let Some((_, oldest)) = order.pop_first() else {
                        break;
                    };
                    self.scopes.remove(&oldest);
                }
                self.scopes.entry(key.clone()).or_insert(Entry {
                    seen: Seen::new(),
                    expires_at_ms,
                    last_ms: now,
                })
            }
        };
        add(&mut entry.seen, labels, source);
        entry.expires_at_ms = expires_at_ms;
        entry.last_ms = now;
        order.insert((now, key.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn source(id: &str) -> Source {
        Source {
            call_id: id.into(),
            tool: "rag_search".into(),
        }
    }

    #[tokio::test]
    async fn a_scope_remembers_its_labels_for_the_window_after_its_last_call() {
        let clock = ManualClock::new(1_000_000);
        let store = FlowStore::Memory {
            clock: SharedClock::new(clock.clone()),
            inner: Mutex::new(Memory::default()),
        };
        let acme: Arc<str> = "acme".into();
        let run = ScopeKey::new(&acme, "alice", "bot", Some("r1"));
        let other_run = ScopeKey::new(&acme, "alice", "bot", Some("r2"));
        let caller = ScopeKey::new(&acme, "alice", "bot", None);
        assert_ne!(run, other_run);
        assert_ne!(run, caller);
        let window = Duration::from_secs(60);
        for i in 0..3 {
            store
                .record(
                    &run,
                    &["private_data"],
                    &source(&format!("c{i}")),
                    window,
                    100,
                )
                .await
                .unwrap();
        }
        let seen = store.seen(&run).await.unwrap();
        assert_eq!(seen["private_data"], [source("c0"), source("c1")]);
        assert!(store.seen(&other_run).await.unwrap().is_empty());
        clock.advance(Duration::from_secs(59));
        store
            .record(&run, &["untrusted_content"], &source("c9"), window, 100)
            .await
            .unwrap();
        clock.advance(Duration::from_secs(59));
        assert_eq!(
            store.seen(&run).await.unwrap().len(),
            2,
            "kept after its last call"
        );
        clock.advance(Duration::from_secs(1));
        assert!(store.seen(&run).await.unwrap().is_empty(), "forgotten");
    }

    #[tokio::test]
    async fn a_tenant_keeps_a_bounded_number_of_scopes_the_least_recently_labelled_go_first() {
        let clock = ManualClock::new(0);
        let store = FlowStore::Memory {
            clock: SharedClock::new(clock.clone()),
            inner: Mutex::new(Memory::default()),
        };
        let (acme, globex): (Arc<str>, Arc<str>) = ("acme".into(), "globex".into());
        let window = Duration::from_secs(3600);
        let run = |tenant: &Arc<str>, i: usize| {
            ScopeKey::new(tenant, "alice", "bot", Some(&i.to_string()))
        };
        for i in 0..5 {
            store
                .record(&run(&acme, i), &["a"], &source("c"), window, 3)
                .await
                .unwrap();
            clock.advance(Duration::from_millis(1));
            // Run 0 stays in use: it is never the least recently labelled.
            store
                .record(&run(&acme, 0), &["b"], &source("c"), window, 3)
                .await
                .unwrap();
            clock.advance(Duration::from_millis(1));
        }
        store
            .record(&run(&globex, 0), &["a"], &source("c"), window, 3)
            .await
            .unwrap();
        let FlowStore::Memory { inner, .. } = &store else {
            unreachable!()
        };
        {
            let memory = inner.lock().unwrap();
            assert_eq!(memory.scopes.len(), 4, "three of acme's, one of globex's");
            assert_eq!(memory.per_tenant[&acme].len(), 3);
            assert_eq!(memory.per_tenant[&globex].len(), 1);
        }
        let kept = |i| run(&acme, i);
        assert_eq!(store.seen(&kept(0)).await.unwrap().len(), 2);
        for gone in [1, 2] {
            assert!(
                store.seen(&kept(gone)).await.unwrap().is_empty(),
                "run {gone}"
            );
        }
        for i in [3, 4] {
            assert_eq!(store.seen(&kept(i)).await.unwrap().len(), 1, "run {i}");
        }
    }
}
