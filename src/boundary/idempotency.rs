//! Stage 10: idempotency. A repeat of (tenant, tool, key) within the window returns the first
//! result without running again; a concurrent duplicate waits for the first; the same key with
//! different arguments is refused. Entries are capped; the oldest finished ones go first.

use std::{
    collections::{HashMap, VecDeque},
    sync::Mutex,
    time::Duration,
};

use tokio::sync::watch;

use crate::{
    clock::SharedClock,
    error::{Reason, Refusal, Stage},
};

/// What a finished execution left: its output or refusal, and the version that ran.
#[derive(Debug, Clone)]
pub struct Stored {
    pub result: Result<String, Refusal>,
    pub tool_version: String,
}

type Key = (String, String, String);

/// Where a duplicate waits for the first call's result.
type Waiting = watch::Receiver<Option<Stored>>;

enum Entry {
    InFlight {
        arguments_sha256: String,
        generation: u64,
        done: watch::Receiver<Option<Stored>>,
    },
    Done {
        arguments_sha256: String,
        stored: Stored,
        at: Duration,
    },
}

#[derive(Default)]
struct Inner {
    entries: HashMap<Key, Entry>,
    order: VecDeque<Key>,
    next_generation: u64,
}

/// The outcome of claiming a key.
pub enum Claim<'a> {
    /// Run the call and [`Slot::complete`] it.
    Owner(Slot<'a>),
    /// A finished result to return as a replay.
    Replay(Stored),
}

/// The right to run a keyed call; dropping it unfinished lets a waiting duplicate take over.
pub struct Slot<'a> {
    store: &'a IdempotencyStore,
    key: Key,
    arguments_sha256: String,
    generation: u64,
    done: watch::Sender<Option<Stored>>,
    completed: bool,
}

impl Slot<'_> {
    pub fn complete(mut self, stored: Stored) {
        self.completed = true;
        let mut inner = self.store.lock();
        let now = self.store.clock.monotonic();
        if let Some(entry) = inner.entries.get_mut(&self.key)
            && matches!(entry, Entry::InFlight { generation, .. } if *generation == self.generation)
        {
            *entry = Entry::Done {
                arguments_sha256: std::mem::take(&mut self.arguments_sha256),
                stored: stored.clone(),
                at: now,
            };
        }
        drop(inner);
        self.done.send_replace(Some(stored));
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if self.completed {
            return;
        }
        // Cancelled before finishing: forget the claim so a waiting duplicate runs the call itself.
        let mut inner = self.store.lock();
        if matches!(inner.entries.get(&self.key), Some(Entry::InFlight { generation, .. }) if *generation == self.generation)
        {
            inner.entries.remove(&self.key);
        }
    }
}

/// Idempotency results of one server.
pub struct IdempotencyStore {
    clock: SharedClock,
    window: Duration,
    max_entries: usize,
    inner: Mutex<Inner>,
}

/// How many times a duplicate re-claims after owners were cancelled before giving up.
const MAX_CLAIMS: usize = 8;

impl IdempotencyStore {
    pub fn new(clock: SharedClock, window: Duration, max_entries: usize) -> Self {
        IdempotencyStore {
            clock,
            window,
            max_entries,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Claims (tenant, tool, key) for a call with these arguments.
    pub async fn claim(
        &self,
        tenant: &str,
        tool: &str,
        key: &str,
        arguments_sha256: &str,
    ) -> Result<Claim<'_>, Refusal> {
        let key: Key = (tenant.to_owned(), tool.to_owned(), key.to_owned());
        for _ in 0..MAX_CLAIMS {
            let mut waiting = match self.try_claim(&key, arguments_sha256)? {
                Ok(claim) => return Ok(claim),
                Err(waiting) => waiting,
            };
            if let Ok(stored) = waiting.wait_for(Option::is_some).await
                && let Some(stored) = stored.clone()
            {
                return Ok(Claim::Replay(stored));
            }
            // The first call was cancelled; try to become the owner.
        }
        Err(Refusal::new(
            Stage::Idempotency,
            Reason::Overloaded,
            "the first call with this idempotency key keeps being cancelled",
        ))
    }

    /// Claims without waiting: `Ok(Ok(claim))`, `Ok(Err(waiting))` while the first call runs,
    /// or a refusal.
    fn try_claim(
        &self,
        key: &Key,
        arguments_sha256: &str,
    ) -> Result<Result<Claim<'_>, Waiting>, Refusal> {
        let now = self.clock.monotonic();
        let mut inner = self.lock();
        let conflict = || {
            Refusal::new(
                Stage::Idempotency,
                Reason::IdempotencyConflict,
                format!(
                    "idempotency key {:?} was already used with different arguments",
                    key.2
                ),
            )
        };
        match inner.entries.get(key) {
            Some(Entry::Done {
                arguments_sha256: first,
                stored,
                at,
            }) if now.saturating_sub(*at) < self.window => {
                if first != arguments_sha256 {
                    return Err(conflict());
                }
                return Ok(Ok(Claim::Replay(stored.clone())));
            }
            Some(Entry::InFlight {
                arguments_sha256: first,
                done,
                ..
            }) => {
                if first != arguments_sha256 {
                    return Err(conflict());
                }
                return Ok(Err(done.clone()));
            }
            _ => {}
        }
        self.make_room(&mut inner, now, key)?;
        let generation = inner.next_generation;
        inner.next_generation += 1;
        let (done, receiver) = watch::channel(None);
        inner.entries.insert(
            key.clone(),
            Entry::InFlight {
                arguments_sha256: arguments_sha256.to_owned(),
                generation,
                done: receiver,
            },
        );
        inner.order.push_back(key.clone());
        Ok(Ok(Claim::Owner(Slot {
            store: self,
            key: key.clone(),
            arguments_sha256: arguments_sha256.to_owned(),
            generation,
            done,
            completed: false,
        })))
    }

    /// Drops expired and, if still full, the oldest finished entries; refuses when every entry is
    /// still running.
    fn make_room(&self, inner: &mut Inner, now: Duration, adding: &Key) -> Result<(), Refusal> {
        let Inner { entries, order, .. } = inner;
        // The order queue may hold keys already replaced or removed; skip those.
        order.retain(|k| entries.contains_key(k) && k != adding);
        entries.retain(
            |_, e| !matches!(e, Entry::Done { at, .. } if now.saturating_sub(*at) >= self.window),
        );
        order.retain(|k| entries.contains_key(k));
        entries.remove(adding);
        while entries.len() >= self.max_entries {
            let Some(position) = order
                .iter()
                .position(|k| matches!(entries.get(k), Some(Entry::Done { .. })))
            else {
                return Err(Refusal::new(
                    Stage::Idempotency,
                    Reason::Overloaded,
                    "too many idempotent calls in flight; retry later",
                ));
            };
            if let Some(k) = order.remove(position) {
                entries.remove(&k);
            }
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn stored(text: &str) -> Stored {
        Stored {
            result: Ok(text.into()),
            tool_version: "1".into(),
        }
    }

    #[tokio::test]
    async fn repeat_replays_conflict_refuses_and_window_expires() {
        let clock = ManualClock::new(0);
        let store =
            IdempotencyStore::new(SharedClock::new(clock.clone()), Duration::from_secs(60), 10);
        let Claim::Owner(slot) = store.claim("acme", "t", "k", "h").await.unwrap() else {
            panic!("expected owner")
        };
        slot.complete(stored("first"));
        let Claim::Replay(again) = store.claim("acme", "t", "k", "h").await.unwrap() else {
            panic!("expected replay")
        };
        assert_eq!(again.result, Ok("first".into()));
        let err = store.claim("acme", "t", "k", "other").await.err().unwrap();
        assert_eq!(err.reason, Reason::IdempotencyConflict);
        clock.advance(Duration::from_secs(61));
        assert!(matches!(
            store.claim("acme", "t", "k", "other").await.unwrap(),
            Claim::Owner(_)
        ));
    }

    #[tokio::test]
    async fn a_cancelled_owner_hands_over_and_memory_is_capped() {
        let store = IdempotencyStore::new(SharedClock::system(), Duration::from_secs(60), 2);
        let first = store.claim("acme", "t", "k", "h").await.unwrap();
        drop(first);
        assert!(matches!(
            store.claim("acme", "t", "k", "h").await.unwrap(),
            Claim::Owner(_)
        ));
        for i in 0..10 {
            if let Claim::Owner(slot) = store
                .claim("acme", "t", &format!("k{i}"), "h")
                .await
                .unwrap()
            {
                slot.complete(stored("x"));
            }
        }
        assert!(store.len() <= 2);
    }
}
