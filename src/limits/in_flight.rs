//! Calls in flight per tool version (`max_concurrency`), in this sidecar: beyond a version's cap
//! a call is refused at once rather than queued without bound (stage 11). One pool of slots per
//! capped version, kept with each catalog and handed on to the next for a version whose cap is
//! unchanged, so calls already running keep counting: a rebuild (a reload, an MCP server's list
//! changing) in the middle of load cannot let twice the cap through.

use std::{collections::HashMap, sync::Arc};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A version's cap as the pools key it. The boundary makes them from the catalog
/// (`boundary::in_flight_caps`).
#[derive(Debug, Clone, Copy)]
pub struct VersionCap<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub cap: usize,
}

/// The slots of every capped version of one catalog.
#[derive(Debug, Default)]
pub struct InFlight {
    /// Tool name -> version -> its pool.
    pools: HashMap<String, HashMap<String, Pool>>,
}

#[derive(Debug)]
struct Pool {
    cap: usize,
    slots: Arc<Semaphore>,
}

/// A version is at its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("at its limit of calls in flight")]
pub struct Full;

impl InFlight {
    /// The pools for `caps`, taking over `previous`'s pool of each version whose cap is the same.
    pub fn build<'a>(
        caps: impl IntoIterator<Item = VersionCap<'a>>,
        previous: Option<&InFlight>,
    ) -> Self {
        let mut pools: HashMap<String, HashMap<String, Pool>> = HashMap::new();
        for VersionCap { name, version, cap } in caps {
            let slots = previous
                .and_then(|p| p.pool(name, version))
                .filter(|pool| pool.cap == cap)
                .map_or_else(|| Arc::new(Semaphore::new(cap)), |pool| pool.slots.clone());
            pools
                .entry(name.to_owned())
                .or_default()
                .insert(version.to_owned(), Pool { cap, slots });
        }
        InFlight { pools }
    }

    fn pool(&self, name: &str, version: &str) -> Option<&Pool> {
        self.pools.get(name)?.get(version)
    }

    /// A slot for a call of (`name`, `version`), held until dropped; `None` for a version
    /// without a cap.
    pub fn take(&self, name: &str, version: &str) -> Result<Option<OwnedSemaphorePermit>, Full> {
        match self.pool(name, version) {
            Some(pool) => pool
                .slots
                .clone()
                .try_acquire_owned()
                .map(Some)
                .map_err(|_| Full),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(version: &str, cap: usize) -> VersionCap<'_> {
        VersionCap {
            name: "t",
            version,
            cap,
        }
    }

    #[test]
    fn a_version_at_its_cap_is_full_until_a_slot_is_given_back() {
        let pools = InFlight::build([cap("1", 1)], None);
        let held = pools.take("t", "1").unwrap();
        assert!(held.is_some());
        assert_eq!(pools.take("t", "1").unwrap_err(), Full);
        drop(held);
        assert!(pools.take("t", "1").unwrap().is_some());
        assert!(pools.take("t", "2").unwrap().is_none(), "no cap, no slot");
        assert!(pools.take("other", "1").unwrap().is_none());
    }

    #[test]
    fn a_rebuild_keeps_the_slots_in_use_for_an_unchanged_cap_only() {
        let first = InFlight::build([cap("1", 1), cap("2", 1)], None);
        let _one = first.take("t", "1").unwrap();
        let _two = first.take("t", "2").unwrap();
        let next = InFlight::build([cap("1", 1), cap("2", 2)], Some(&first));
        assert_eq!(next.take("t", "1").unwrap_err(), Full, "still held");
        assert!(
            next.take("t", "2").unwrap().is_some(),
            "a new cap, new slots"
        );
    }
}
