//! Per-call credentials for backends: how the person behind a call reaches the tool
//! (docs/executors.md#credentials). A backend configured with `credentials:` gets, on each
//! call, a token for that call's caller — the caller's token exchanged at the operator's token
//! endpoint (RFC 8693, optionally with the sidecar's workload token as the actor), the sidecar's
//! own short-lived token (client credentials), or the caller's token itself where it names the
//! backend as its audience — never the sidecar's static secret for everyone.
//!
//! Issued tokens are cached per caller token (the audience and scope are the backend's) until
//! shortly before they expire, within a byte budget, and one request per key is in flight: the
//! calls that need the same token while it is being fetched wait for that one. A credential is
//! never shown to the model, and logs, spans and audit events name it by [`CredentialUsed`]:
//! kind, subject, actor, audience and a fingerprint, never the token.

mod endpoint;
mod settings;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use futures::{
    FutureExt,
    future::{BoxFuture, Shared},
};

pub use settings::{ClientAuth, CredentialSpec, Grant, MAX_TOKEN_RESPONSE_BYTES};

use crate::{
    clock::SharedClock,
    identity::{Caller, fingerprint},
    outbound::{Destination, guarded_client},
};

/// Why a call has no credential for its backend; the backend is never called without one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// The token endpoint could not be reached, was slow, or answered with something unusable:
    /// retryable, nothing was sent to the backend.
    #[error("{0}")]
    Unavailable(String),
    /// The token endpoint (or the rule for passing the caller's token on) refused this caller:
    /// not retryable. Carries the endpoint's error code, never its description.
    #[error("{0}")]
    Refused(String),
    /// The token endpoint refused the sidecar's own client or grant (`invalid_client`,
    /// `unauthorized_client`, `unsupported_grant_type`, `invalid_target`): an operator's to
    /// fix, the same for every caller.
    #[error("{0}")]
    Misconfigured(String),
}

/// Which credential a call was made with, as records name it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CredentialUsed {
    pub kind: &'static str,
    /// Who the token says the call is made as (its `sub`), when it says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// Who acts for them (`act.sub`), when the token says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// The first 16 hex digits of the token's SHA-256.
    pub fingerprint: String,
}

/// A token for one call's backend.
#[derive(Clone)]
pub struct Credential {
    token: Arc<str>,
    /// `Bearer <token>`, made once (marked sensitive): each call clones a reference.
    header: http::HeaderValue,
    /// When it stops being used (Unix ms): shortly before it expires.
    use_until_ms: i64,
    /// Shared: every call with this token records the same value.
    pub used: Arc<CredentialUsed>,
}

impl Credential {
    /// The `authorization` header value that carries it.
    pub fn header(&self) -> &http::HeaderValue {
        &self.header
    }

    /// The token itself, for a client that writes the `Bearer` header (rmcp's).
    pub fn bearer_token(&self) -> &str {
        &self.token
    }

    fn new(
        token: Arc<str>,
        use_until_ms: i64,
        used: CredentialUsed,
        label: &str,
    ) -> Result<Self, CredentialError> {
        let mut header = http::HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| {
            CredentialError::Unavailable(format!(
                "the credential for {label} cannot be sent in a header"
            ))
        })?;
        header.set_sensitive(true);
        Ok(Credential {
            token,
            header,
            use_until_ms,
            used: Arc::new(used),
        })
    }

    fn bytes(&self) -> usize {
        // The key, the entry and its strings.
        160 + self.token.len()
            + self.used.subject.as_ref().map_or(0, String::len)
            + self.used.actor.as_ref().map_or(0, String::len)
            + self.used.audience.as_ref().map_or(0, String::len)
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("used", &self.used)
            .finish_non_exhaustive()
    }
}

/// The cache key: the SHA-256 of the caller's token (all zeros for the sidecar's own).
type Key = [u8; 32];

type Fetch = Shared<BoxFuture<'static, Result<Arc<Credential>, CredentialError>>>;

/// One backend's credentials: its spec, the client for its token endpoint, and the tokens it
/// was issued.
pub struct Credentials {
    spec: CredentialSpec,
    /// `upstream tickets`, `MCP server docs`: how messages name the backend.
    label: String,
    client: Option<reqwest::Client>,
    clock: SharedClock,
    cache: Mutex<Cache>,
    in_flight: Mutex<HashMap<Key, Fetch>>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("kind", &self.spec.kind())
            .field("backend", &self.label)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Cache {
    entries: HashMap<Key, Arc<Credential>>,
    bytes: usize,
    max_bytes: usize,
}

impl Credentials {
    /// `max_bytes` bounds the cached tokens of this backend.
    pub fn new(
        spec: CredentialSpec,
        label: String,
        clock: SharedClock,
        max_bytes: usize,
    ) -> Result<Self, String> {
        let client = match &spec {
            CredentialSpec::TokenExchange(grant) | CredentialSpec::ClientCredentials(grant) => {
                // The operator named the endpoint: it may be private (an in-cluster IdP).
                let destination = Destination::build(
                    format!("the token endpoint of {label}"),
                    true,
                    &[],
                    &Default::default(),
                    |field| field.to_owned(),
                )
                .map_err(|err| err.message)?;
                Some(
                    guarded_client(&destination, grant.timeout)
                        .map_err(|err| format!("cannot build the HTTP client: {err}"))?,
                )
            }
            CredentialSpec::PassThrough { .. } => None,
        };
        Ok(Credentials {
            spec,
            label,
            client,
            clock,
            cache: Mutex::new(Cache {
                max_bytes,
                ..Cache::default()
            }),
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    pub fn spec(&self) -> &CredentialSpec {
        &self.spec
    }

    /// Bytes held by the cache of issued tokens.
    pub fn cache_bytes(&self) -> usize {
        lock(&self.cache).bytes
    }

    /// The token `caller`'s call to this backend is made with: from the cache, or fetched
    /// (once, however many calls need it at the same time).
    pub async fn for_call(
        self: &Arc<Self>,
        caller: &Caller,
    ) -> Result<Arc<Credential>, CredentialError> {
        let key: Key = match &self.spec {
            CredentialSpec::PassThrough { audience } => {
                return self.pass_through(caller, audience).map(Arc::new);
            }
            CredentialSpec::ClientCredentials(_) => [0; 32],
            CredentialSpec::TokenExchange(_) => {
                let token = caller.token.as_ref().ok_or_else(|| {
                    CredentialError::Refused(format!(
                        "{} takes the caller's own credential (token exchange), and this caller was not identified by a token",
                        self.label
                    ))
                })?;
                *token.key()
            }
        };
        // Only an exchange sends the caller's token anywhere.
        let subject = || {
            matches!(self.spec, CredentialSpec::TokenExchange(_))
                .then(|| caller.token.as_ref().map(|t| t.secret().to_owned()))
                .flatten()
        };
        self.issued(key, subject).await
    }

    /// The sidecar's own token (client credentials), for requests made for no caller: an MCP
    /// session's initialize and tools/list. Only a client credentials spec has one.
    pub async fn own(self: &Arc<Self>) -> Result<Arc<Credential>, CredentialError> {
        match self.spec {
            CredentialSpec::ClientCredentials(_) => self.issued([0; 32], || None).await,
            _ => Err(CredentialError::Unavailable(format!(
                "{} has no credential of the sidecar's own",
                self.label
            ))),
        }
    }

    /// The token cached under `key`, or fetched with `subject()` as the subject token (once,
    /// however many calls need it at the same time).
    async fn issued(
        self: &Arc<Self>,
        key: Key,
        subject: impl FnOnce() -> Option<String>,
    ) -> Result<Arc<Credential>, CredentialError> {
        if let Some(hit) = self.cached(&key) {
            return Ok(hit);
        }
        let fetch = {
            let mut in_flight = lock(&self.in_flight);
            match in_flight.get(&key) {
                Some(running) => running.clone(),
                None => {
                    let this = Arc::clone(self);
                    let subject = subject();
                    // Spawned: the request finishes (bounded by the grant's timeout), is cached
                    // and leaves the map even when every call waiting for it is dropped first (a
                    // deadline, a cancel); the map's lock, held here until the entry is in, makes
                    // its removal come after.
                    let task = tokio::spawn(async move {
                        let result = this.fetch(subject).await.map(Arc::new);
                        let mut in_flight = lock(&this.in_flight);
                        in_flight.remove(&key);
                        if let Ok(credential) = &result {
                            this.store(key, credential.clone());
                        }
                        result
                    });
                    let label = self.label.clone();
                    let shared = async move {
                        task.await.unwrap_or_else(|_| {
                            Err(CredentialError::Unavailable(format!(
                                "no credential for {label}: its request ended unexpectedly"
                            )))
                        })
                    }
                    .boxed()
                    .shared();
                    in_flight.insert(key, shared.clone());
                    shared
                }
            }
        };
        fetch.await
    }

    fn cached(&self, key: &Key) -> Option<Arc<Credential>> {
        let mut cache = lock(&self.cache);
        let now = self.clock.unix_ms();
        match cache.entries.get(key) {
            Some(hit) if hit.use_until_ms > now => Some(hit.clone()),
            Some(_) => {
                if let Some(gone) = cache.entries.remove(key) {
                    cache.bytes -= gone.bytes();
                }
                None
            }
            None => None,
        }
    }

    /// Keeps a token: when over the budget, expired ones go first, then arbitrary ones.
    fn store(&self, key: Key, credential: Arc<Credential>) {
        let mut cache = lock(&self.cache);
        let size = credential.bytes();
        if size > cache.max_bytes {
            return;
        }
        if let Some(old) = cache.entries.remove(&key) {
            cache.bytes -= old.bytes();
        }
        if cache.bytes + size > cache.max_bytes {
            let now = self.clock.unix_ms();
            cache.entries.retain(|_, c| c.use_until_ms > now);
            cache.bytes = cache.entries.values().map(|c| c.bytes()).sum();
            while cache.bytes + size > cache.max_bytes {
                let Some(victim) = cache.entries.keys().next().copied() else {
                    break;
                };
                if let Some(gone) = cache.entries.remove(&victim) {
                    cache.bytes -= gone.bytes();
                }
            }
        }
        cache.bytes += size;
        cache.entries.insert(key, credential);
    }

    /// The caller's own token, when it names this backend as its audience.
    fn pass_through(&self, caller: &Caller, audience: &str) -> Result<Credential, CredentialError> {
        let token = caller.token.as_ref().ok_or_else(|| {
            CredentialError::Refused(format!(
                "{} takes the caller's own token, and this caller was not identified by a token",
                self.label
            ))
        })?;
        if !token.audience().iter().any(|aud| aud == audience) {
            return Err(CredentialError::Refused(format!(
                "the caller's token is not for {} (its audience does not name {audience:?}), so it is not passed on",
                self.label
            )));
        }
        Credential::new(
            token.secret().into(),
            i64::try_from(token.expires())
                .unwrap_or(i64::MAX / 1000)
                .saturating_mul(1000),
            CredentialUsed {
                kind: self.spec.kind(),
                subject: (!caller.subject.is_empty()).then(|| caller.subject.clone()),
                actor: None,
                audience: Some(audience.to_owned()),
                fingerprint: fingerprint(token.secret()),
            },
            &self.label,
        )
    }

    async fn fetch(&self, subject_token: Option<String>) -> Result<Credential, CredentialError> {
        let (CredentialSpec::TokenExchange(grant) | CredentialSpec::ClientCredentials(grant)) =
            &self.spec
        else {
            return Err(CredentialError::Unavailable(format!(
                "{} has no token endpoint",
                self.label
            )));
        };
        let Some(client) = &self.client else {
            return Err(CredentialError::Unavailable(format!(
                "{} has no token endpoint client",
                self.label
            )));
        };
        let started = std::time::Instant::now();
        let issued = endpoint::request(
            client,
            grant,
            &self.label,
            subject_token.as_deref(),
            &self.clock,
        )
        .await;
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        match &issued {
            Ok(issued) => tracing::info!(
                backend = %self.label,
                kind = self.spec.kind(),
                subject = issued.used.subject.as_deref().unwrap_or(""),
                actor = issued.used.actor.as_deref().unwrap_or(""),
                audience = issued.used.audience.as_deref().unwrap_or(""),
                fingerprint = %issued.used.fingerprint,
                elapsed_ms,
                "credential issued"
            ),
            Err(err) => {
                tracing::warn!(backend = %self.label, kind = self.spec.kind(), error = %err, elapsed_ms, "no credential");
            }
        }
        let issued = issued?;
        Credential::new(
            issued.token.into(),
            issued.use_until_ms,
            CredentialUsed {
                kind: self.spec.kind(),
                ..issued.used
            },
            &self.label,
        )
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Neither map holds an invariant a panicking holder could break halfway.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
