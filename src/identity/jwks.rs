//! An issuer's published keys: fetched from its JWKS URL (or the one its OpenID configuration
//! names), refreshed on a schedule, and fetched again when a token names a key not seen yet — at
//! most once per `min_refresh_interval`, so a stream of tokens with random `kid`s costs the
//! issuer one request per interval, not one per token. While the issuer cannot be reached, the
//! last good keys keep verifying for `keep_last_good`; past that, the issuer's tokens are refused
//! (a key the issuer withdrew must not verify forever).
//!
//! Every request goes through [`crate::outbound`]'s guarded client: no proxies from the
//! environment, redirects only within the origin, TLS verified, each answer capped in size and
//! time.

use std::{
    collections::BTreeSet,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering},
    },
    time::Duration,
};

use arc_swap::ArcSwap;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use serde_json::Value;
use sha2::{Digest, Sha256};
use url::Url;

use super::{IdentityError, keys::Key};
use crate::{
    clock::SharedClock,
    outbound::{BodyError, read_capped},
    settings::{FieldError, check_secure_url, parse_duration, raw::RawRemoteJwks},
};

/// Most requests waiting at once for one issuer's keys to be fetched again.
const MAX_WAITING: usize = 64;

/// Where an issuer's keys are published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// The JWKS document itself.
    Url(Url),
    /// The issuer: its `/.well-known/openid-configuration` names the JWKS URL.
    Discover(Url),
}

/// Validated `identity.jwt.jwks` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwksSettings {
    pub source: JwksSource,
    pub refresh: Duration,
    pub min_refresh_interval: Duration,
    pub keep_last_good: Duration,
    pub timeout: Duration,
    pub max_bytes: usize,
}

impl JwksSettings {
    /// `at` is the field's path, e.g. `identity.jwt.jwks`.
    pub fn build(raw: &RawRemoteJwks, at: &str) -> Result<Self, FieldError> {
        let source = match (&raw.url, &raw.discover) {
            (Some(url), None) => JwksSource::Url(check_secure_url(url, &format!("{at}.url"))?),
            (None, Some(issuer)) => {
                JwksSource::Discover(check_secure_url(issuer, &format!("{at}.discover"))?)
            }
            _ => {
                return Err(FieldError::new(
                    at,
                    "set exactly one of url (the JWKS document) or discover (the issuer, whose OpenID configuration names it)",
                ));
            }
        };
        let duration = |value: &Option<String>, field: &str, default: u64| match value {
            Some(text) => parse_duration(text)
                .map_err(|err| FieldError::new(format!("{at}.{field}"), err.to_string())),
            None => Ok(Duration::from_secs(default)),
        };
        let settings = JwksSettings {
            source,
            refresh: duration(&raw.refresh, "refresh", 600)?,
            min_refresh_interval: duration(&raw.min_refresh_interval, "min_refresh_interval", 30)?,
            keep_last_good: duration(&raw.keep_last_good, "keep_last_good", 24 * 3600)?,
            timeout: duration(&raw.timeout, "timeout", 5)?,
            max_bytes: raw.max_bytes.unwrap_or(256 * 1024),
        };
        if settings.max_bytes < 64 {
            return Err(FieldError::new(
                format!("{at}.max_bytes"),
                "must be at least 64 bytes",
            ));
        }
        if settings.min_refresh_interval > settings.refresh {
            return Err(FieldError::new(
                format!("{at}.min_refresh_interval"),
                "cannot be longer than refresh",
            ));
        }
        if settings.keep_last_good < settings.refresh {
            return Err(FieldError::new(
                format!("{at}.keep_last_good"),
                "cannot be shorter than refresh: the keys would expire between two scheduled fetches",
            ));
        }
        Ok(settings)
    }

    /// How logs and refusals name the source.
    fn label(&self) -> String {
        match &self.source {
            JwksSource::Url(url) => format!("the JWKS at {url}"),
            JwksSource::Discover(issuer) => format!("issuer {issuer}"),
        }
    }
}

/// The keys last fetched, and what became of the fetches since.
pub(super) struct KeySet {
    pub keys: Vec<Key>,
    /// The SHA-256 of each key's published JSON: a key replaced under the same `kid`, or a
    /// kid-less key replaced, is a key withdrawn.
    published: BTreeSet<[u8; 32]>,
    /// When a fetch last succeeded (Unix ms); `None` before the first.
    fetched_at: Option<i64>,
    /// Why the last fetch failed, when it did (the good keys stay).
    last_error: Option<String>,
    /// Goes up each time a fetch withdraws a key: a token verified under a withdrawn key is
    /// verified again, not served from the token cache.
    pub generation: u64,
}

/// One issuer's published keys, shared by the verifiers that trust it and kept across reloads
/// that do not change where they come from.
pub struct RemoteKeys {
    settings: JwksSettings,
    label: String,
    client: reqwest::Client,
    clock: SharedClock,
    state: ArcSwap<KeySet>,
    /// Held while fetching: one fetch at a time, and a caller that waited for one uses its keys.
    fetching: tokio::sync::Mutex<()>,
    /// Fetches finished, successful or not.
    finished: AtomicU64,
    /// When the last fetch began (Unix ms), for `min_refresh_interval`.
    last_attempt: AtomicI64,
    /// Requests waiting for a refetch: a few at a time, so a flood of unknown `kid`s while the
    /// issuer is slow is refused at once instead of piling up behind the fetch.
    waiting: tokio::sync::Semaphore,
    refresher_started: AtomicBool,
}

impl std::fmt::Debug for RemoteKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteKeys")
            .field("source", &self.label)
            .finish_non_exhaustive()
    }
}

impl RemoteKeys {
    pub fn new(settings: JwksSettings, clock: SharedClock) -> Result<Self, String> {
        let label = settings.label();
        let client = crate::outbound::issuer_client(&label, settings.timeout)?;
        Ok(RemoteKeys {
            settings,
            label,
            client,
            clock,
            state: ArcSwap::from_pointee(KeySet {
                keys: Vec::new(),
                published: BTreeSet::new(),
                fetched_at: None,
                last_error: None,
                generation: 0,
            }),
            fetching: tokio::sync::Mutex::new(()),
            finished: AtomicU64::new(0),
            last_attempt: AtomicI64::new(i64::MIN),
            waiting: tokio::sync::Semaphore::new(MAX_WAITING),
            refresher_started: AtomicBool::new(false),
        })
    }

    /// Keys from the same source as `previous` under new tunables (refresh, timeouts, limits):
    /// they start with the keys `previous` holds, so a reload that changes only how keys are
    /// fetched loses none (nor the last good set kept while the issuer is down).
    pub fn taking_over(
        previous: &RemoteKeys,
        settings: JwksSettings,
        clock: SharedClock,
    ) -> Result<Self, String> {
        let keys = RemoteKeys::new(settings, clock)?;
        keys.state.store(previous.state.load_full());
        Ok(keys)
    }

    pub fn settings(&self) -> &JwksSettings {
        &self.settings
    }

    /// The keys tokens may be verified with now, or why there are none: never fetched, or the
    /// last good set is older than `keep_last_good`.
    pub(super) fn keys(&self) -> Result<Arc<KeySet>, IdentityError> {
        let set = self.state.load_full();
        let why = |e: &Option<String>| {
            e.as_deref()
                .map(|e| format!(": {e}"))
                .unwrap_or_else(|| " (the first fetch is under way)".to_owned())
        };
        let Some(fetched_at) = set.fetched_at else {
            return Err(IdentityError::KeysUnavailable(format!(
                "the keys of {} have not been fetched yet{}",
                self.label,
                why(&set.last_error)
            )));
        };
        let age = Duration::from_millis(
            u64::try_from(self.clock.unix_ms().saturating_sub(fetched_at)).unwrap_or(0),
        );
        if age > self.settings.keep_last_good {
            return Err(IdentityError::KeysUnavailable(format!(
                "the keys of {} were last fetched {}s ago, longer than keep_last_good ({}s){}",
                self.label,
                age.as_secs(),
                self.settings.keep_last_good.as_secs(),
                why(&set.last_error)
            )));
        }
        Ok(set)
    }

    /// Fetches the keys again for a token that named a key not in the set (or came before the
    /// first fetch). Waits for a fetch already under way and reports it; otherwise fetches only
    /// if the last fetch began at least `min_refresh_interval` ago. Whether keys newer than the
    /// caller's look may now be in the set.
    pub async fn refetch_for_unknown_key(&self) -> bool {
        let Ok(_waiting) = self.waiting.try_acquire() else {
            return false;
        };
        // A fetch under way and this one, each at most two requests (discovery, then keys).
        let most = self.settings.timeout.saturating_mul(4);
        tokio::time::timeout(most, self.refetch_waited())
            .await
            .unwrap_or(false)
    }

    async fn refetch_waited(&self) -> bool {
        let seen = self.finished.load(Ordering::Acquire);
        let _fetching = self.fetching.lock().await;
        if self.finished.load(Ordering::Acquire) != seen {
            return true;
        }
        let now = self.clock.unix_ms();
        let interval = i64::try_from(self.settings.min_refresh_interval.as_millis()).unwrap_or(0);
        if now.saturating_sub(self.last_attempt.load(Ordering::Acquire)) < interval {
            return false;
        }
        self.fetch_and_apply("a token named an unknown key").await
    }

    /// Whether a refetch for an unknown key could happen now (without waiting for one).
    pub fn refetch_allowed(&self) -> bool {
        let interval = i64::try_from(self.settings.min_refresh_interval.as_millis()).unwrap_or(0);
        self.fetching.try_lock().is_err()
            || self
                .clock
                .unix_ms()
                .saturating_sub(self.last_attempt.load(Ordering::Acquire))
                >= interval
    }

    /// Starts the scheduled fetches (the first at once), once per set of keys; they stop when
    /// the keys are no longer used (a reload dropped them).
    pub fn start_refreshing(self: &Arc<Self>) {
        if self.refresher_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut failures: u32 = 0;
            loop {
                let Some(keys) = weak.upgrade() else { return };
                let ok = {
                    let _fetching = keys.fetching.lock().await;
                    keys.fetch_and_apply("scheduled").await
                };
                // After a failure, try again sooner: from min_refresh_interval, doubling, up to
                // the schedule.
                let wait = if ok {
                    failures = 0;
                    keys.settings.refresh
                } else {
                    failures = failures.saturating_add(1);
                    keys.settings
                        .min_refresh_interval
                        .saturating_mul(1 << failures.min(10).saturating_sub(1))
                        .min(keys.settings.refresh)
                };
                drop(keys);
                tokio::time::sleep(wait).await;
            }
        });
    }

    /// One fetch, with `fetching` held by the caller; the set is replaced only by a good one.
    async fn fetch_and_apply(&self, cause: &'static str) -> bool {
        self.last_attempt
            .store(self.clock.unix_ms(), Ordering::Release);
        let result = self.fetch().await;
        let previous = self.state.load_full();
        let ok = result.is_ok();
        let next = match result {
            Ok((keys, published)) => {
                let withdrawn = previous.published.difference(&published).count();
                if previous.published != published {
                    tracing::info!(source = %self.label, cause, keys = keys.len(), withdrawn, "issuer keys changed");
                }
                KeySet {
                    keys,
                    published,
                    fetched_at: Some(self.clock.unix_ms()),
                    last_error: None,
                    generation: previous.generation + u64::from(withdrawn > 0),
                }
            }
            Err(err) => {
                tracing::warn!(source = %self.label, cause, error = %err, kept = previous.keys.len(), "cannot fetch the issuer's keys; the last good ones stay in use");
                KeySet {
                    keys: previous.keys.clone(),
                    published: previous.published.clone(),
                    fetched_at: previous.fetched_at,
                    last_error: Some(err),
                    generation: previous.generation,
                }
            }
        };
        self.state.store(Arc::new(next));
        self.finished.fetch_add(1, Ordering::AcqRel);
        ok
    }

    /// The usable keys, and the SHA-256 of each one's published JSON.
    async fn fetch(&self) -> Result<(Vec<Key>, BTreeSet<[u8; 32]>), String> {
        let jwks_url = match &self.settings.source {
            JwksSource::Url(url) => url.clone(),
            JwksSource::Discover(issuer) => self.discover(issuer).await?,
        };
        let document: Value = self.get_json(&jwks_url).await?;
        let Some(published) = document.get("keys").and_then(Value::as_array) else {
            return Err(format!(
                "{jwks_url} is not a JWKS document (no \"keys\" array)"
            ));
        };
        // Each key alone: a key of a type this build cannot read must not hide the others.
        let readable: Vec<Jwk> = published
            .iter()
            .filter_map(|key| serde_json::from_value(key.clone()).ok())
            .collect();
        let digests: Vec<[u8; 32]> = readable
            .iter()
            .map(|jwk| Sha256::digest(serde_json::to_vec(jwk).unwrap_or_default()).into())
            .collect();
        let (mut keys, mut published) = (Vec::new(), BTreeSet::new());
        for (i, key) in super::keys::signature_keys(&JwkSet { keys: readable }) {
            match key {
                Ok(key) => {
                    keys.push(key);
                    published.extend(digests.get(i));
                }
                Err(err) => {
                    tracing::debug!(source = %self.label, key = i, error = %err, "published key skipped")
                }
            }
        }
        if keys.is_empty() {
            return Err(format!(
                "{jwks_url} publishes no usable signature key ({} keys)",
                published.len()
            ));
        }
        Ok((keys, published))
    }

    /// The JWKS URL the issuer's OpenID configuration names; the configuration must be the
    /// issuer's own (its `issuer` is the configured URL).
    async fn discover(&self, issuer: &Url) -> Result<Url, String> {
        let base = issuer.as_str().trim_end_matches('/');
        let at = Url::parse(&format!("{base}/.well-known/openid-configuration"))
            .map_err(|err| format!("cannot form the discovery URL: {err}"))?;
        let configuration = self.get_json(&at).await?;
        let named = configuration.get("issuer").and_then(Value::as_str);
        if named.map(|n| n.trim_end_matches('/')) != Some(base) {
            return Err(format!(
                "{at} names issuer {:?}, not {base:?}",
                named.unwrap_or("(none)")
            ));
        }
        let jwks_uri = configuration
            .get("jwks_uri")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{at} names no jwks_uri"))?;
        check_secure_url(jwks_uri, "jwks_uri").map_err(|err| format!("{at}: {}", err.message))
    }

    async fn get_json(&self, url: &Url) -> Result<Value, String> {
        let request = async {
            let response = self
                .client
                .get(url.clone())
                .header(reqwest::header::ACCEPT, "application/json")
                .send()
                .await
                .map_err(|err| format!("{url}: {}", crate::outbound::failure_in_words(&err)))?;
            let status = response.status();
            if !status.is_success() {
                return Err(format!("{url} answered {}", status.as_u16()));
            }
            read_capped(response, self.settings.max_bytes)
                .await
                .map_err(|err| match err {
                    BodyError::TooLarge(max) => format!("{url}: the answer is over {max} bytes"),
                    BodyError::Read(err) => {
                        format!("{url}: {}", crate::outbound::failure_in_words(&err))
                    }
                })
        };
        let body = tokio::time::timeout(self.settings.timeout, request)
            .await
            .map_err(|_| {
                format!(
                    "{url} did not answer within {}s",
                    self.settings.timeout.as_secs_f64()
                )
            })??;
        serde_json::from_slice(&body).map_err(|err| format!("{url} answered with no JSON: {err}"))
    }
}
