//! Emergency denies: an operator stops the tools matching a glob — for every caller, or one
//! tenant and/or agent — at once, without editing the catalog. The access stage refuses what a
//! deny matches (`emergency_denied`) and ListTools hides it; a deny set with `cancel_running`
//! also stops the matching calls already running.
//!
//! The denies in force are one list swapped whole (read without a lock by every call). In
//! memory they are this sidecar's; with `state: redis` they live in one Redis hash, so they
//! survive restarts and reach every sidecar sharing it: a change is published on a channel
//! every sidecar listens to, and each also reads the hash again every few seconds, the backstop
//! for a message it missed (`redis.rs`). While Redis cannot be reached, setting and clearing
//! fail and every sidecar keeps enforcing the denies it last read.

mod redis;
#[cfg(test)]
mod tests;

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use globset::{Glob, GlobMatcher};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{clock::SharedClock, identity::Caller, state::StateError};

/// Most denies in force at once: each call looks at all of them.
pub const MAX_DENIES: usize = 256;
/// Most denies one tenant's admins may have in force at once.
pub const MAX_DENIES_PER_TENANT: usize = 16;
/// Places kept for the platform's operators: tenants' denies together leave at least these free,
/// so no tenant (nor all of them) can keep the platform from stopping a tool.
pub const RESERVED_FOR_PLATFORM: usize = 32;
/// Longest reason, in bytes.
pub const MAX_REASON_BYTES: usize = 1024;
/// Longest tools glob, tenant or agent, in bytes.
pub const MAX_FIELD_BYTES: usize = 256;
/// Longest a deny may last by itself (a longer stop belongs in the catalog).
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// An emergency deny in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmergencyDeny {
    pub id: String,
    /// A glob over catalog tool names.
    pub tools: String,
    pub tenant: Option<String>,
    pub agent: Option<String>,
    pub reason: String,
    /// `tenant/subject` of the operator who set it.
    pub set_by: String,
    pub set_at_ms: i64,
    pub expires_at_ms: Option<i64>,
    pub cancel_running: bool,
    /// Set by the platform's operators (then only they may clear it), not by a tenant's admin.
    /// A deny stored before tenants' admins could set any was the platform's.
    #[serde(default = "by_platform")]
    pub set_by_platform: bool,
}

fn by_platform() -> bool {
    true
}

/// Whose denies an operator may set, list and clear, as the Controls service authorized them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authority {
    /// The platform's operators: every tenant's denies, and those for every tenant.
    Platform,
    /// A tenant's admin: the denies on that tenant that its admins set, and no others.
    Tenant(Arc<str>),
}

impl Authority {
    /// Whether `deny` is one this authority may see in a listing: the platform every deny, a
    /// tenant those on it (whoever set them: they stop its calls, which are told why anyway).
    pub fn sees(&self, deny: &EmergencyDeny) -> bool {
        match self {
            Authority::Platform => true,
            Authority::Tenant(tenant) => deny.tenant.as_deref() == Some(&**tenant),
        }
    }

    /// Whether this authority may lift `deny`: a tenant's admin only its own tenant's, and not
    /// one the platform set.
    fn may_clear(&self, deny: &EmergencyDeny) -> Result<(), DenyError> {
        match self {
            Authority::Platform => Ok(()),
            Authority::Tenant(_) if !self.sees(deny) => Err(DenyError::NotFound(deny.id.clone())),
            Authority::Tenant(_) if deny.set_by_platform => {
                Err(DenyError::SetByPlatform(deny.id.clone()))
            }
            Authority::Tenant(_) => Ok(()),
        }
    }
}
#[derive(Debug, Clone, Default)]
pub struct NewDeny {
    pub tools: String,
    pub tenant: Option<String>,
    pub agent: Option<String>,
    pub reason: String,
    pub ttl: Option<Duration>,
    pub cancel_running: bool,
}

/// Why a deny could not be set, cleared or listed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DenyError {
    #[error("emergency denies need the scope {ADMIN_SCOPE:?}")]
    MissingScope,
    #[error(
        "a tenant's admin sets emergency denies for its own tenant ({own}) only, not for {asked}; denies on other tenants and on every tenant are the platform's operators' (identity.platform_tenants)"
    )]
    OtherTenant { own: Arc<str>, asked: String },
    #[error("emergency deny {0:?} was set by the platform's operators; only they can clear it")]
    SetByPlatform(String),
    #[error(
        "this tenant has {MAX_DENIES_PER_TENANT} emergency denies in force already; clear one first"
    )]
    TooManyForTenant,
    #[error("invalid tools glob {0:?}: {1}")]
    InvalidTools(String, String),
    #[error("a reason is required: calls it refuses are told why")]
    ReasonMissing,
    #[error("{0} is longer than {1} bytes")]
    TooLong(&'static str, usize),
    #[error("{0} must not be blank when given, nor have surrounding whitespace")]
    Blank(&'static str),
    #[error("a deny lasts at most 30 days (720h); longer stops belong in the catalog")]
    TtlTooLong,
    #[error("{MAX_DENIES} emergency denies are in force already; clear one first")]
    TooMany,
    #[error("no emergency deny {0:?} is in force")]
    NotFound(String),
    #[error("{}", .0.for_caller())]
    Unavailable(StateError),
    #[error("the audit log cannot keep up; nothing was changed")]
    AuditUnavailable,
}

/// The scope a JWT caller needs for the Controls service.
pub const ADMIN_SCOPE: &str = "toolgate:admin";

/// A deny in force with its compiled glob.
#[derive(Debug)]
pub struct Active {
    pub deny: EmergencyDeny,
    matcher: GlobMatcher,
}

impl Active {
    fn new(deny: EmergencyDeny) -> Result<Self, DenyError> {
        let matcher = Glob::new(&deny.tools)
            .map_err(|err| DenyError::InvalidTools(deny.tools.clone(), err.kind().to_string()))?
            .compile_matcher();
        Ok(Active { deny, matcher })
    }

    /// Whether it stops `tool` for this tenant and agent at `now_ms`.
    pub fn matches(&self, tool: &str, tenant: &str, agent: &str, now_ms: i64) -> bool {
        let deny = &self.deny;
        deny.expires_at_ms.is_none_or(|at| now_ms < at)
            && deny.tenant.as_deref().is_none_or(|t| t == tenant)
            && deny.agent.as_deref().is_none_or(|a| a == agent)
            && self.matcher.is_match(tool)
    }
}

/// Where denies are kept.
enum Store {
    Memory(tokio::sync::Mutex<()>),
    Shared(Arc<crate::state::Redis>),
}

/// The denies in force, and the store that shares them.
pub struct EmergencyDenies {
    clock: SharedClock,
    current: ArcSwap<Vec<Arc<Active>>>,
    /// Bumped whenever the list changes (what callers see may have changed).
    changes: watch::Sender<u64>,
    /// What running calls wait on: cancelled (and replaced) when a deny with `cancel_running`
    /// is first seen here, so each call then looks whether one stops it. A child of the calls'
    /// own stop signal once attached ([`Self::attach`]): one wait per call serves both.
    epoch: ArcSwap<CancellationToken>,
    parent: std::sync::OnceLock<CancellationToken>,
    store: Store,
}

impl std::fmt::Debug for EmergencyDenies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmergencyDenies")
            .field("in_force", &self.current.load().len())
            .finish_non_exhaustive()
    }
}

impl EmergencyDenies {
    /// This sidecar's own denies.
    pub fn in_memory(clock: SharedClock) -> Self {
        Self::with_store(clock, Store::Memory(tokio::sync::Mutex::new(())))
    }

    /// Denies shared through `redis` (read from it by [`Self::follow`]).
    pub fn shared(clock: SharedClock, redis: Arc<crate::state::Redis>) -> Self {
        Self::with_store(clock, Store::Shared(redis))
    }

    /// On the backend given: shared with Redis, otherwise in memory.
    pub fn on(backend: &crate::state::Backend, clock: SharedClock) -> Self {
        match backend.redis() {
            Some(redis) => Self::shared(clock, redis.clone()),
            None => Self::in_memory(clock),
        }
    }

    /// Whether the denies are shared with every sidecar on the same Redis (else this one's only).
    pub fn is_shared(&self) -> bool {
        matches!(self.store, Store::Shared(_))
    }

    fn with_store(clock: SharedClock, store: Store) -> Self {
        EmergencyDenies {
            clock,
            current: ArcSwap::from_pointee(Vec::new()),
            changes: watch::channel(0).0,
            epoch: ArcSwap::from_pointee(CancellationToken::new()),
            parent: std::sync::OnceLock::new(),
            store,
        }
    }

    /// The deny stopping `tool` for this tenant and agent now, if one does. Allocates nothing
    /// and takes no lock: every call asks.
    pub fn matching(&self, tool: &str, tenant: &str, agent: &str) -> Option<Arc<Active>> {
        let list = self.current.load();
        if list.is_empty() {
            return None;
        }
        let now = self.clock.unix_ms();
        list.iter()
            .find(|active| active.matches(tool, tenant, agent, now))
            .cloned()
    }

    /// The denies in force now, oldest first.
    pub fn list(&self) -> Vec<EmergencyDeny> {
        self.list_for(&Authority::Platform)
    }

    /// The denies in force now that `authority` may see, oldest first.
    pub fn list_for(&self, authority: &Authority) -> Vec<EmergencyDeny> {
        let now = self.clock.unix_ms();
        self.current
            .load()
            .iter()
            .filter(|a| a.deny.expires_at_ms.is_none_or(|at| now < at) && authority.sees(&a.deny))
            .map(|a| a.deny.clone())
            .collect()
    }

    /// Whether a deny in force has an expiry (only then is there anything to take out).
    pub fn any_expiring(&self) -> bool {
        self.current
            .load()
            .iter()
            .any(|a| a.deny.expires_at_ms.is_some())
    }

    /// Changes each time the denies in force change.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Makes what running calls wait on a child of `stop` (the calls' own stop signal), so a
    /// call waits once for either. Once; later calls are ignored.
    pub fn attach(&self, stop: CancellationToken) {
        if self.parent.set(stop.clone()).is_ok() {
            self.epoch.store(Arc::new(stop.child_token()));
        }
    }

    /// What a call starting now waits on: cancelled when the calls are told to stop, or when a
    /// deny with `cancel_running` is first seen (then ask [`Self::stopping`]). Take it before
    /// the call is decided, so no deny seen after that is missed.
    pub fn epoch(&self) -> Arc<CancellationToken> {
        self.epoch.load_full()
    }

    /// The deny with `cancel_running` in force that stops a running call of `tool` by this
    /// caller, if one does.
    pub fn stopping(&self, tool: &str, caller: &Caller) -> Option<Arc<Active>> {
        let now = self.clock.unix_ms();
        self.current
            .load()
            .iter()
            .find(|a| a.deny.cancel_running && a.matches(tool, &caller.tenant, &caller.agent, now))
            .cloned()
    }

    /// Wakes every running call to look at the denies again.
    fn wake_running(&self) {
        let next = match self.parent.get() {
            Some(parent) => parent.child_token(),
            None => CancellationToken::new(),
        };
        self.epoch.swap(Arc::new(next)).cancel();
    }

    /// Sets a deny; in force here when this returns, and with Redis on every sidecar as soon
    /// as it hears.
    /// A tenant's admin sets a deny on its own tenant only: one that names no tenant is made
    /// its tenant's, one naming another is refused.
    pub async fn set(
        &self,
        new: NewDeny,
        by: &Caller,
        authority: &Authority,
    ) -> Result<EmergencyDeny, DenyError> {
        let now = self.clock.unix_ms();
        let deny = validate(new, by, authority, now)?;
        let active = Arc::new(Active::new(deny.clone())?);
        match &self.store {
            Store::Memory(lock) => {
                let _one_at_a_time = lock.lock().await;
                let mut list: Vec<Arc<Active>> = self.live(now);
                room(
                    list.iter().map(|a| &a.deny),
                    deny.tenant.as_deref(),
                    authority,
                )?;
                list.push(active);
                self.apply(list);
            }
            Store::Shared(redis) => {
                redis::set(redis, &deny, authority).await?;
                self.reconcile().await;
                // Read back or not, this sidecar enforces what it just set.
                if !self.current.load().iter().any(|a| a.deny.id == deny.id) {
                    let mut list = self.live(now);
                    list.push(active);
                    self.apply(list);
                }
            }
        }
        Ok(deny)
    }

    /// Lifts a deny, if `authority` may (a tenant's admin: see [`Authority`]); the deny as it
    /// was. A deny the authority may not see is not found.
    pub async fn clear(&self, id: &str, authority: &Authority) -> Result<EmergencyDeny, DenyError> {
        let now = self.clock.unix_ms();
        match &self.store {
            Store::Memory(lock) => {
                let _one_at_a_time = lock.lock().await;
                let mut list = self.live(now);
                let at = list
                    .iter()
                    .position(|a| a.deny.id == id)
                    .ok_or_else(|| DenyError::NotFound(id.to_owned()))?;
                authority.may_clear(&list[at].deny)?;
                let cleared = list.remove(at).deny.clone();
                self.apply(list);
                Ok(cleared)
            }
            Store::Shared(redis) => {
                let cleared = redis::clear(redis, id, authority)
                    .await?
                    .filter(|d| d.expires_at_ms.is_none_or(|at| now < at))
                    .ok_or_else(|| DenyError::NotFound(id.to_owned()))?;
                let list = self
                    .live(now)
                    .into_iter()
                    .filter(|a| a.deny.id != id)
                    .collect();
                self.apply(list);
                Ok(cleared)
            }
        }
    }

    /// Takes out the denies that expired; those this sidecar took out (with Redis, exactly one
    /// sidecar takes out each), to be recorded.
    pub async fn expire(&self) -> Vec<EmergencyDeny> {
        let now = self.clock.unix_ms();
        let expired: Vec<EmergencyDeny> = self
            .current
            .load()
            .iter()
            .filter(|a| a.deny.expires_at_ms.is_some_and(|at| now >= at))
            .map(|a| a.deny.clone())
            .collect();
        if expired.is_empty() {
            return expired;
        }
        let mine = match &self.store {
            Store::Memory(lock) => {
                let _one_at_a_time = lock.lock().await;
                expired
            }
            Store::Shared(redis) => {
                let mut mine = Vec::new();
                for deny in expired {
                    // Another sidecar took it out, or Redis is away (tried again next time).
                    if let Ok(Some(_)) = redis::clear(redis, &deny.id, &Authority::Platform).await {
                        mine.push(deny);
                    }
                }
                mine
            }
        };
        let gone: BTreeSet<&str> = mine.iter().map(|d| d.id.as_str()).collect();
        let list = self
            .current
            .load()
            .iter()
            .filter(|a| !gone.contains(a.deny.id.as_str()))
            .cloned()
            .collect();
        self.apply(list);
        mine
    }

    /// Reads the shared denies again (Redis only); the list in force is kept when Redis cannot
    /// be read.
    pub async fn reconcile(&self) {
        let Store::Shared(redis) = &self.store else {
            return;
        };
        match redis::read_all(redis).await {
            Ok(denies) => {
                let list = denies
                    .into_iter()
                    .filter_map(|deny| match Active::new(deny) {
                        Ok(active) => Some(Arc::new(active)),
                        Err(err) => {
                            tracing::error!(error = %err, "an emergency deny in the shared state cannot be read; skipped");
                            None
                        }
                    })
                    .collect();
                self.apply(list);
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the shared emergency denies; enforcing those read last");
            }
        }
    }

    /// Follows the shared denies until `stop`: reads them at once, again on every change
    /// published, and every few seconds regardless. Memory only: returns at once.
    pub async fn follow(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let Store::Shared(redis) = &self.store else {
            return;
        };
        let redis = redis.clone();
        redis::follow(&redis, &self, stop).await;
    }

    /// The list in force now without the expired denies.
    fn live(&self, now: i64) -> Vec<Arc<Active>> {
        self.current
            .load()
            .iter()
            .filter(|a| a.deny.expires_at_ms.is_none_or(|at| now < at))
            .cloned()
            .collect()
    }

    /// Puts `list` in force (oldest first); tells who watches what changed.
    fn apply(&self, mut list: Vec<Arc<Active>>) {
        list.sort_by(|a, b| (a.deny.set_at_ms, &a.deny.id).cmp(&(b.deny.set_at_ms, &b.deny.id)));
        let previous = self.current.load_full();
        let same = previous.len() == list.len()
            && previous.iter().zip(&list).all(|(a, b)| a.deny == b.deny);
        if same {
            return;
        }
        let known: BTreeSet<&str> = previous.iter().map(|a| a.deny.id.as_str()).collect();
        let stops_running = list
            .iter()
            .any(|a| a.deny.cancel_running && !known.contains(a.deny.id.as_str()));
        self.current.store(Arc::new(list));
        self.changes.send_modify(|n| *n += 1);
        // After the list is in force: a call woken now finds the deny.
        if stops_running {
            self.wake_running();
        }
    }
}

/// Whether a deny on `tenant` set with `authority` fits beside `in_force`: at most
/// [`MAX_DENIES`] in all, [`MAX_DENIES_PER_TENANT`] set by one tenant's admins, and the tenants'
/// together leaving [`RESERVED_FOR_PLATFORM`] places. (The Redis script checks the same.)
fn room<'d>(
    in_force: impl Iterator<Item = &'d EmergencyDeny>,
    tenant: Option<&str>,
    authority: &Authority,
) -> Result<(), DenyError> {
    let (mut all, mut tenants, mut this_tenant) = (0, 0, 0);
    for deny in in_force {
        all += 1;
        if !deny.set_by_platform {
            tenants += 1;
            this_tenant += usize::from(deny.tenant.as_deref() == tenant);
        }
    }
    if all >= MAX_DENIES {
        return Err(DenyError::TooMany);
    }
    match authority {
        Authority::Platform => Ok(()),
        Authority::Tenant(_) if this_tenant >= MAX_DENIES_PER_TENANT => {
            Err(DenyError::TooManyForTenant)
        }
        Authority::Tenant(_) if tenants >= MAX_DENIES - RESERVED_FOR_PLATFORM => {
            Err(DenyError::TooMany)
        }
        Authority::Tenant(_) => Ok(()),
    }
}

/// Checks what was asked and makes the deny: a tenant's admin's always on its own tenant.
fn validate(
    new: NewDeny,
    by: &Caller,
    authority: &Authority,
    now_ms: i64,
) -> Result<EmergencyDeny, DenyError> {
    let tools = new.tools.trim().to_owned();
    if tools.is_empty() {
        return Err(DenyError::InvalidTools(tools, "blank".into()));
    }
    let reason = new.reason.trim().to_owned();
    if reason.is_empty() {
        return Err(DenyError::ReasonMissing);
    }
    for (field, text, max) in [
        ("tools", tools.as_str(), MAX_FIELD_BYTES),
        ("reason", reason.as_str(), MAX_REASON_BYTES),
        (
            "tenant",
            new.tenant.as_deref().unwrap_or(""),
            MAX_FIELD_BYTES,
        ),
        ("agent", new.agent.as_deref().unwrap_or(""), MAX_FIELD_BYTES),
    ] {
        if text.len() > max {
            return Err(DenyError::TooLong(field, max));
        }
    }
    for (field, value) in [("tenant", &new.tenant), ("agent", &new.agent)] {
        if value
            .as_deref()
            .is_some_and(|v| v.is_empty() || v.trim() != v)
        {
            return Err(DenyError::Blank(field));
        }
    }
    let tenant = match (authority, new.tenant) {
        (Authority::Platform, tenant) => tenant,
        (Authority::Tenant(own), None) => Some(own.to_string()),
        (Authority::Tenant(own), Some(asked)) if asked == **own => Some(asked),
        (Authority::Tenant(own), Some(asked)) => {
            return Err(DenyError::OtherTenant {
                own: own.clone(),
                asked,
            });
        }
    };
    let expires_at_ms = match new.ttl {
        None => None,
        Some(ttl) if ttl > MAX_TTL => return Err(DenyError::TtlTooLong),
        Some(ttl) => {
            Some(now_ms.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)))
        }
    };
    let deny = EmergencyDeny {
        id: format!("emd_{}", uuid::Uuid::new_v4().simple()),
        tools,
        tenant,
        agent: new.agent,
        reason,
        set_by: format!("{}/{}", by.tenant, by.subject),
        set_at_ms: now_ms,
        expires_at_ms,
        cancel_running: new.cancel_running,
        set_by_platform: *authority == Authority::Platform,
    };
    Active::new(deny.clone())?;
    Ok(deny)
}
