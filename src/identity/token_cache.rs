//! Verified tokens, remembered until they expire.
//!
//! An agent runtime sends the same bearer token with every call of a run; verifying its signature
//! each time was about a tenth of a call's CPU (docs/performance.md). Entries are keyed by the
//! SHA-256 of the whole token, so any change to it (claims or signature) misses and is verified in
//! full; only tokens that verified are stored, and each is still checked against its own `exp` on
//! every hit. The map is bounded, so a flood of distinct tokens costs verification, not memory.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use sha2::{Digest, Sha256};

use super::{Caller, IdentityError};

/// What an entry costs beyond its caller's strings (key, validity, map slot).
const ENTRY_OVERHEAD: usize = 128;

/// The SHA-256 of a token.
pub type TokenKey = [u8; 32];

pub fn key_of(token: &str) -> TokenKey {
    Sha256::digest(token.as_bytes()).into()
}

/// When a token may be used: its `nbf` and `exp` claims, in seconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: Option<u64>,
    pub expires: u64,
}

impl Validity {
    /// Whether the token may be used at `now`, allowing `leeway` seconds of clock skew either way.
    pub fn check(&self, now: u64, leeway: u64) -> Result<(), IdentityError> {
        if self.expires.saturating_add(leeway) < now {
            return Err(IdentityError::InvalidToken("token has expired".into()));
        }
        if self
            .not_before
            .is_some_and(|nbf| nbf > now.saturating_add(leeway))
        {
            return Err(IdentityError::InvalidToken(
                "token is not valid yet (nbf)".into(),
            ));
        }
        Ok(())
    }
}

/// A token whose signature and claims verified.
#[derive(Debug, Clone)]
pub struct Verified {
    /// Shared: every call with this token holds the same caller, not a copy of it.
    pub caller: Arc<Caller>,
    pub validity: Validity,
    /// Which of the configured issuers verified it.
    pub issuer: usize,
    /// The issuer's fetched keys' generation it was verified under; `None` when a fixed key
    /// verified it.
    pub generation: Option<u64>,
    /// The issuer's clock-skew allowance, in seconds.
    pub leeway: u64,
}

impl Verified {
    fn bytes(&self) -> usize {
        let c = &self.caller;
        ENTRY_OVERHEAD
            + c.token.as_ref().map_or(0, |t| t.len())
            + c.tenant.len()
            + c.subject.len()
            + c.agent.len()
            + c.scopes.iter().map(|s| s.len() + 32).sum::<usize>()
    }
}

#[derive(Debug, Default)]
struct Entries {
    map: HashMap<TokenKey, Verified>,
    bytes: usize,
}

/// A sidecar serves one pod, whose agents rarely hold more than a handful of live tokens; the
/// budget is in bytes, because a token's claims (scopes) can be large.
#[derive(Debug)]
pub struct TokenCache {
    entries: Mutex<Entries>,
    max_bytes: usize,
}

impl TokenCache {
    pub fn new(max_bytes: usize) -> Self {
        TokenCache {
            entries: Mutex::new(Entries::default()),
            max_bytes,
        }
    }

    /// Bytes held, as the budget counts them.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// The cached caller for this token, if it verified before and may be used at `now`. An
    /// expired entry is dropped and reported as expired: its signature was good, its time is up.
    pub fn get(&self, key: &TokenKey, now: u64) -> Option<Result<Verified, IdentityError>> {
        let mut entries = self.lock();
        let entry = entries.map.get(key)?;
        match entry.validity.check(now, entry.leeway) {
            Ok(()) => Some(Ok(entry.clone())),
            Err(err) => {
                if let Some(gone) = entries.map.remove(key) {
                    entries.bytes -= gone.bytes();
                }
                Some(Err(err))
            }
        }
    }

    /// Remembers a verified token. When full, expired entries go first, then arbitrary ones down
    /// to three quarters of the budget, so a flood of distinct tokens pays for that scan once per
    /// quarter of the budget rather than on each insert. A token larger than the whole budget is
    /// not kept (it is verified on every call).
    pub fn insert(&self, key: TokenKey, verified: Verified, now: u64) {
        let size = verified.bytes();
        if size > self.max_bytes {
            return;
        }
        let mut entries = self.lock();
        if entries.map.contains_key(&key) {
            return;
        }
        if entries.bytes + size > self.max_bytes {
            entries
                .map
                .retain(|_, entry| entry.validity.check(now, entry.leeway).is_ok());
            entries.bytes = entries.map.values().map(Verified::bytes).sum();
            let target = (self.max_bytes / 4 * 3).min(self.max_bytes - size);
            if entries.bytes > target {
                let mut surplus = entries.bytes - target;
                entries.map.retain(|_, entry| {
                    if surplus == 0 {
                        return true;
                    }
                    surplus = surplus.saturating_sub(entry.bytes());
                    false
                });
                entries.bytes = entries.map.values().map(Verified::bytes).sum();
            }
        }
        entries.bytes += size;
        entries.map.insert(key, verified);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().map.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        // The map holds no invariant a panicking holder could break halfway.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::AuthMethod;

    fn verified(tenant: &str, expires: u64) -> Verified {
        Verified {
            caller: Arc::new(Caller {
                tenant: tenant.into(),
                subject: String::new(),
                agent: "".into(),
                scopes: Default::default(),
                method: AuthMethod::Jwt,
                claims: Default::default(),
                token: None,
                delegation: None,
            }),
            validity: Validity {
                not_before: None,
                expires,
            },
            issuer: 0,
            generation: None,
            leeway: 0,
        }
    }

    #[test]
    fn validity_allows_leeway_on_both_sides() {
        let window = Validity {
            not_before: Some(100),
            expires: 200,
        };
        assert!(window.check(95, 10).is_ok());
        assert!(window.check(89, 10).is_err());
        assert!(window.check(210, 10).is_ok());
        assert!(window.check(211, 10).is_err());
    }

    #[test]
    fn hits_are_checked_against_their_expiry_and_dropped_when_expired() {
        let cache = TokenCache::new(4096);
        let key = key_of("token");
        cache.insert(key, verified("acme", 100), 50);
        assert_eq!(
            &*cache.get(&key, 100).unwrap().unwrap().caller.tenant,
            "acme"
        );
        let expired = cache.get(&key, 101).unwrap();
        assert!(expired.unwrap_err().to_string().contains("expired"));
        assert!(cache.get(&key, 101).is_none());
        assert!(cache.get(&key_of("token2"), 50).is_none());
    }

    #[test]
    fn the_cache_never_grows_past_its_budget() {
        let budget = verified("t", 0).bytes() * 8;
        let cache = TokenCache::new(budget);
        cache.insert(key_of("old"), verified("old", 10), 0);
        for i in 0..100 {
            cache.insert(key_of(&format!("t{i}")), verified("t", 1_000), 20);
            assert!(cache.len() <= 8 && cache.bytes() <= budget);
        }
        // The expired entry was the first to go.
        assert!(cache.get(&key_of("old"), 20).is_none());
        assert!(cache.get(&key_of("t99"), 20).is_some());
    }
}
