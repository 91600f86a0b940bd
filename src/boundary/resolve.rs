//! Stage 3: which version of the tool this caller gets, and whether the model was shown it.
//!
//! Revisions are content hashes of what a caller sees, so they survive restarts. The
//! [`RevisionLog`] remembers, for revisions handed out recently, which definition of each tool
//! they contained; a stale revision is refused only when the resolved tool changed since.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex},
};

use super::explain::{StageResult, StageTrail};
use crate::{
    catalog::{Catalog, ResolveError, ToolVersion, VersionStatus},
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
            ResolveError::UnknownTool => unknown_tool(name),
            ResolveError::VersionNotAvailable(why) => {
                Refusal::new(Stage::Resolve, Reason::VersionNotAvailable, why)
            }
            ResolveError::Unavailable(why) => {
                Refusal::new(Stage::Resolve, Reason::ToolUnavailable, why)
            }
            ResolveError::DefinitionChanged(why) => {
                Refusal::new(Stage::Resolve, Reason::DefinitionChanged, why)
            }
        })
}

/// The refusal of a call of a tool that does not exist (or that the caller cannot see).
pub fn unknown_tool(name: &str) -> Refusal {
    Refusal::new(
        Stage::Resolve,
        Reason::ToolNotFound,
        format!("unknown tool {name}"),
    )
}

/// Tool name -> definition hash, for one revision.
pub type Definitions = BTreeMap<String, String>;

/// Revisions by id with their size, their insertion order for forgetting the oldest, and the
/// bytes held.
#[derive(Debug, Default)]
struct Entries {
    map: HashMap<String, (Arc<Definitions>, usize)>,
    order: VecDeque<String>,
    bytes: usize,
}

/// Recently handed-out revisions and what they contained. Bounded in bytes (a revision of a
/// 10,000-tool catalog holds a million bytes of names and hashes); the oldest are forgotten.
#[derive(Debug)]
pub struct RevisionLog {
    max_bytes: usize,
    inner: Mutex<Entries>,
}

/// What a revision costs beyond its names and hashes.
const REVISION_OVERHEAD: usize = 128;
/// What each tool in a revision costs beyond its name and hash (the map node).
const DEFINITION_OVERHEAD: usize = 64;

impl RevisionLog {
    pub fn new(max_bytes: usize) -> Self {
        RevisionLog {
            max_bytes,
            inner: Mutex::new(Entries::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // Every update leaves the map, order and byte count consistent before it could panic.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn record(&self, revision: &str, definitions: impl FnOnce() -> Definitions) {
        let mut entries = self.lock();
        if entries.map.contains_key(revision) {
            return;
        }
        let definitions = definitions();
        let size = REVISION_OVERHEAD
            + 2 * revision.len()
            + definitions
                .iter()
                .map(|(name, hash)| name.len() + hash.len() + DEFINITION_OVERHEAD)
                .sum::<usize>();
        if size > self.max_bytes {
            // Not remembered: a call naming it is checked against the current revision instead.
            return;
        }
        while entries.bytes + size > self.max_bytes {
            let Some(old) = entries.order.pop_front() else {
                break;
            };
            if let Some((_, bytes)) = entries.map.remove(&old) {
                entries.bytes -= bytes;
            }
        }
        entries.bytes += size;
        entries
            .map
            .insert(revision.to_owned(), (Arc::new(definitions), size));
        entries.order.push_back(revision.to_owned());
    }

    pub fn get(&self, revision: &str) -> Option<Arc<Definitions>> {
        self.lock().map.get(revision).map(|(d, _)| d.clone())
    }

    /// Bytes held, as the budget counts them.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
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

/// What stage 3 resolved and why, for an explanation; `shown` is the revision the caller says
/// its model was shown, when it was checked.
pub(super) fn explain_passed(
    tool: &ToolVersion,
    pinned: bool,
    tenant: &str,
    shown: Option<&str>,
) -> StageTrail {
    let why = if pinned {
        "the pinned version".to_owned()
    } else {
        match (&tool.status, &tool.canary) {
            (VersionStatus::Canary, Some(canary)) if canary.tenants.contains(tenant) => {
                format!("a canary; tenant {tenant} is listed")
            }
            (VersionStatus::Canary, Some(canary)) => format!(
                "a canary; tenant {tenant} falls in its {}% of tenants",
                canary.percent
            ),
            _ => "the active version".to_owned(),
        }
    };
    let revision = shown
        .map(|shown| format!("; the shown revision {shown} has this definition"))
        .unwrap_or_default();
    StageTrail::new(
        Stage::Resolve,
        StageResult::Passed,
        format!("{} version {} ({why}){revision}", tool.name, tool.version),
    )
}
