//! What each flow scope has seen: the flow labels (`catalog::flow`) of the tools that ran in it,
//! and the calls that brought each, for the rules to read. A scope is a run (tenant, subject,
//! agent and the client's run id) or a caller (tenant, subject and agent); it is forgotten a
//! window after its last labelled call.
//!
//! In memory, scopes are this sidecar's, at most [`MAX_SCOPES_PER_TENANT`] per tenant (a new one
//! past that evicts the tenant's oldest). With `state: redis` they live in one hash per scope
//! (`<prefix>{tenant}:flow:<scope>`, label -> the calls that brought it, expiring with the
//! window), so a run that reads on one sidecar cannot send from another.

mod redis;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::{clock::SharedClock, state::StateError};

/// Most scopes one tenant keeps in a sidecar's memory.
pub const MAX_SCOPES_PER_TENANT: usize = 10_000;
/// Calls remembered per label of a scope: the first ones that brought it.
pub const MAX_SOURCES_PER_LABEL: usize = 2;

/// One flow scope: its tenant and a digest of who (and, for runs, which run).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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

struct Entry {
    seen: Seen,
    expires_at_ms: i64,
    last_ms: i64,
}

/// Scopes in this sidecar's memory.
#[derive(Default)]
pub struct Memory {
    scopes: HashMap<ScopeKey, Entry>,
    per_tenant: HashMap<Arc<str>, usize>,
}

/// Where scopes are kept.
pub enum FlowStore {
    Memory {
        clock: SharedClock,
        inner: Mutex<Memory>,
    },
    Redis(Arc<crate::state::Redis>),
}

impl std::fmt::Debug for FlowStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FlowStore::Memory { .. } => f.write_str("FlowStore::Memory"),
            FlowStore::Redis(_) => f.write_str("FlowStore::Redis"),
        }
    }
}

impl FlowStore {
    pub fn on(backend: &crate::state::Backend, clock: SharedClock) -> Self {
        match backend.redis() {
            Some(redis) => FlowStore::Redis(redis.clone()),
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
            FlowStore::Redis(redis) => redis::seen(redis, key).await,
        }
    }

    /// Adds `labels`, brought by this call, to the scope, which is then kept for `window`.
    pub async fn record(
        &self,
        key: &ScopeKey,
        labels: &[&str],
        source: &Source,
        window: Duration,
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
                memory.record(key, labels, source, now, expires_at_ms);
                Ok(())
            }
            FlowStore::Redis(redis) => redis::record(redis, key, labels, source, window).await,
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
    ) {
        let fresh = match self.scopes.get(key) {
            Some(entry) => entry.expires_at_ms <= now,
            None => true,
        };
        if fresh && !self.scopes.contains_key(key) {
            let count = self.per_tenant.get(&key.tenant).copied().unwrap_or(0);
            if count >= MAX_SCOPES_PER_TENANT {
                self.evict_oldest(&key.tenant, now);
            }
            *self.per_tenant.entry(key.tenant.clone()).or_default() += 1;
        }
        let entry = self.scopes.entry(key.clone()).or_insert_with(|| Entry {
            seen: Seen::new(),
            expires_at_ms,
            last_ms: now,
        });
        if fresh {
            entry.seen.clear();
        }
        for label in labels {
            let sources = entry.seen.entry((*label).to_owned()).or_default();
            if sources.len() < MAX_SOURCES_PER_LABEL {
                sources.push(source.clone());
            }
        }
        entry.expires_at_ms = expires_at_ms;
        entry.last_ms = now;
    }

    /// Makes room for one more scope of `tenant`: its expired scopes go, else its oldest.
    fn evict_oldest(&mut self, tenant: &Arc<str>, now: i64) {
        let mine: Vec<(ScopeKey, i64, bool)> = self
            .scopes
            .iter()
            .filter(|(k, _)| &k.tenant == tenant)
            .map(|(k, e)| (k.clone(), e.last_ms, e.expires_at_ms <= now))
            .collect();
        let mut gone: Vec<ScopeKey> = mine
            .iter()
            .filter(|(_, _, expired)| *expired)
            .map(|(k, _, _)| k.clone())
            .collect();
        if gone.is_empty()
            && let Some((oldest, _, _)) = mine.iter().min_by_key(|(_, last, _)| *last)
        {
            gone.push(oldest.clone());
        }
        for key in gone {
            self.scopes.remove(&key);
            if let Some(count) = self.per_tenant.get_mut(tenant) {
                *count = count.saturating_sub(1);
            }
        }
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
                .record(&run, &["private_data"], &source(&format!("c{i}")), window)
                .await
                .unwrap();
        }
        let seen = store.seen(&run).await.unwrap();
        assert_eq!(seen["private_data"], [source("c0"), source("c1")]);
        assert!(store.seen(&other_run).await.unwrap().is_empty());
        clock.advance(Duration::from_secs(59));
        store
            .record(&run, &["untrusted_content"], &source("c9"), window)
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
    async fn a_tenant_keeps_a_bounded_number_of_scopes() {
        let clock = ManualClock::new(0);
        let store = FlowStore::Memory {
            clock: SharedClock::new(clock.clone()),
            inner: Mutex::new(Memory::default()),
        };
        let acme: Arc<str> = "acme".into();
        let window = Duration::from_secs(3600);
        for i in 0..MAX_SCOPES_PER_TENANT + 5 {
            let key = ScopeKey::new(&acme, "alice", "bot", Some(&i.to_string()));
            store
                .record(&key, &["a"], &source("c"), window)
                .await
                .unwrap();
            clock.advance(Duration::from_millis(1));
        }
        let FlowStore::Memory { inner, .. } = &store else {
            unreachable!()
        };
        {
            let memory = inner.lock().unwrap();
            assert_eq!(memory.scopes.len(), MAX_SCOPES_PER_TENANT);
            assert_eq!(memory.per_tenant[&acme], MAX_SCOPES_PER_TENANT);
        }
        // The oldest went first.
        let first = ScopeKey::new(&acme, "alice", "bot", Some("0"));
        assert!(store.seen(&first).await.unwrap().is_empty());
    }
}
