//! Stage 3: which version of the tool this caller gets, and whether the model was shown it.
//!
//! Revisions are content hashes of what a caller sees, so they survive restarts. The
//! [`RevisionLog`] remembers, for revisions handed out recently, which definition of each tool
//! they contained; a stale revision is refused only when the resolved tool changed since.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex},
};

use crate::{
    catalog::{Catalog, ResolveError, ToolVersion},
    error::{Reason, Refusal, Stage},
    identity::Caller,
};

/// Resolves the tool for this caller; `pin` is the call's optional version.
pub fn resolve<'c>(
    catalog: &'c Catalog,
    name: &str,
    pin: Option<&str>,
    caller: &Caller,
) -> Result<&'c Arc<ToolVersion>, Refusal> {
    catalog
        .resolve(name, pin, &caller.tenant)
        .map_err(|err| match err {
            ResolveError::UnknownTool => Refusal::new(
                Stage::Resolve,
                Reason::ToolNotFound,
                format!("unknown tool {name}"),
            ),
            ResolveError::VersionNotAvailable(why) => {
                Refusal::new(Stage::Resolve, Reason::VersionNotAvailable, why)
            }
            ResolveError::Unavailable(why) => {
                Refusal::new(Stage::Resolve, Reason::ToolUnavailable, why)
            }
        })
}

/// Tool name -> definition hash, for one revision.
pub type Definitions = BTreeMap<String, String>;

/// Revisions by id, and their insertion order for forgetting the oldest.
type Entries = (HashMap<String, Arc<Definitions>>, VecDeque<String>);

/// Recently handed-out revisions and what they contained. Bounded; the oldest are forgotten.
#[derive(Debug)]
pub struct RevisionLog {
    capacity: usize,
    inner: Mutex<Entries>,
}

impl RevisionLog {
    pub fn new(capacity: usize) -> Self {
        RevisionLog {
            capacity,
            inner: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    pub fn record(&self, revision: &str, definitions: impl FnOnce() -> Definitions) {
        let Ok(mut guard) = self.inner.lock() else {
            return;
        };
        let (map, order) = &mut *guard;
        if map.contains_key(revision) {
            return;
        }
        map.insert(revision.to_owned(), Arc::new(definitions()));
        order.push_back(revision.to_owned());
        while order.len() > self.capacity {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }

    pub fn get(&self, revision: &str) -> Option<Arc<Definitions>> {
        self.inner.lock().ok()?.0.get(revision).cloned()
    }
}

/// Refuses a call whose model was shown a revision in which this tool was different or absent.
/// `current` computes the caller's current revision and definitions, only when needed.
pub fn check_revision(
    log: &RevisionLog,
    shown: &str,
    tool: &ToolVersion,
    current: impl FnOnce() -> (String, Definitions),
) -> Result<(), Refusal> {
    if let Some(definitions) = log.get(shown) {
        if definitions.get(&tool.name) == Some(&tool.definition_hash) {
            return Ok(());
        }
        let (now, _) = current();
        return Err(stale(
            shown,
            &now,
            &format!(
                "tool {} changed since the model was shown revision {shown}",
                tool.name
            ),
        ));
    }
    let (now, definitions) = current();
    if now == shown {
        log.record(&now, || definitions);
        return Ok(());
    }
    Err(stale(
        shown,
        &now,
        &format!("catalog revision {shown} is not known to this sidecar"),
    ))
}

fn stale(shown: &str, now: &str, why: &str) -> Refusal {
    Refusal::new(
        Stage::Resolve,
        Reason::StaleCatalog,
        format!(
            "{why}; the current revision is {now}: list the tools again (shown {shown}, current {now})"
        ),
    )
}
