//! Who is calling, from gRPC metadata only — never from the request body or the model.
//!
//! Production callers present `authorization: Bearer <JWT>`, verified by [`jwt`]. When the config
//! turns dev identity on, the unauthenticated `x-toolgate-*` headers are accepted instead.

pub mod delegation;
mod jwks;
mod jwt;
mod keys;
mod token_cache;

use std::{collections::BTreeSet, net::SocketAddr, sync::Arc};

use http::HeaderName;

pub use jwks::{JwksSettings, JwksSource, RemoteKeys};
pub use jwt::{IssuerSettings, JwtSettings, JwtVerifier};

use crate::{clock::SharedClock, settings::FieldError};

/// How callers are identified.
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    pub dev_identity: bool,
    /// The operator's explicit consent to dev identity on a non-loopback TCP listener.
    pub dev_identity_on_network: bool,
    pub jwt: Option<JwtSettings>,
    /// Longest tenant, subject or agent accepted (scopes: 16 times this).
    pub max_identity_bytes: usize,
    /// The MCP door's resource (`server.mcp.resource`): the audience its callers' tokens must
    /// name (RFC 8707), instead of `jwt.audience`.
    pub mcp_resource: Option<String>,
    /// The approvals console's OpenID Connect client id (`server.console.oidc.client_id`): the
    /// audience of the ID tokens people sign in to it with.
    pub console_client_id: Option<String>,
    /// The fleet's delegation keys (`identity.delegation`).
    pub delegation: Option<Arc<delegation::DelegationKeys>>,
}

impl IdentityConfig {
    /// Refuses combinations that would identify no one, or anyone: no method, dev identity next
    /// to JWTs, or dev identity on a TCP listener other hosts can reach.
    pub fn validate(&self, listen: Option<SocketAddr>) -> Result<(), FieldError> {
        if !self.dev_identity && self.jwt.is_none() {
            return Err(FieldError::new(
                "identity",
                "no way to identify callers: configure identity.jwt, or set identity.dev_identity: true for development",
            ));
        }
        if self.dev_identity && self.jwt.is_some() {
            // Trusting headers next to tokens would let any caller skip the token.
            return Err(FieldError::new(
                "identity.dev_identity",
                "dev identity (trusting x-toolgate-* headers) cannot be combined with identity.jwt: choose one",
            ));
        }
        if self.dev_identity_on_network && !self.dev_identity {
            return Err(FieldError::new(
                "identity.allow_unauthenticated_network_callers",
                "only means something with dev_identity: true",
            ));
        }
        if let Some(addr) = listen {
            self.check_listener(addr)
                .map_err(|err| FieldError::new("server.listen", err.to_string()))?;
        }
        Ok(())
    }

    /// Dev identity trusts whatever a caller claims: a TCP listener reachable from other hosts
    /// would let anyone on the network be any tenant. Allowed on loopback (and Unix sockets)
    /// only, unless the operator says so in so many words.
    pub fn check_listener(&self, addr: SocketAddr) -> Result<(), ListenerError> {
        if self.dev_identity
            && !self.dev_identity_on_network
            && !crate::settings::is_loopback(addr.ip())
        {
            return Err(ListenerError::DevIdentityExposed { addr });
        }
        Ok(())
    }
}

/// Why callers may not be identified this way on a listener.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    /// Dev identity on a TCP address other hosts can reach, without the operator's consent.
    #[error(
        "dev identity is on and {addr} is not a loopback address: anyone who can reach it could claim any tenant. Listen on 127.0.0.1 (or a Unix socket), configure identity.jwt, or set identity.allow_unauthenticated_network_callers: true if that is really what you want"
    )]
    DevIdentityExposed { addr: SocketAddr },
}

/// Dev identity metadata keys.
pub const TENANT_HEADER: &str = "x-toolgate-tenant";
pub const SUBJECT_HEADER: &str = "x-toolgate-subject";
pub const AGENT_HEADER: &str = "x-toolgate-agent";
pub const SCOPES_HEADER: &str = "x-toolgate-scopes";

// The same names, made once: a lookup by `&str` parses and checks the name on every call.
static TENANT: HeaderName = HeaderName::from_static(TENANT_HEADER);
static SUBJECT: HeaderName = HeaderName::from_static(SUBJECT_HEADER);
static AGENT: HeaderName = HeaderName::from_static(AGENT_HEADER);
static SCOPES: HeaderName = HeaderName::from_static(SCOPES_HEADER);
static DELEGATION: HeaderName = HeaderName::from_static(delegation::DELEGATION_HEADER);

/// How the caller was identified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMethod {
    Jwt,
    Dev,
    /// A delegation token a sidecar issued with a handoff ([`delegation`]).
    Delegation,
}

/// Which door a request came in by. A door only converts its protocol to the domain call and
/// back; it is named in each call's span (`toolgate.door`) and audit event (`door`), nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Door {
    /// The `toolgate.v1` gRPC services.
    #[default]
    Grpc,
    /// MCP's Streamable HTTP transport (and `toolgate mcp-stdio`, which forwards to it).
    Mcp,
    /// The approvals console: a person deciding approvals in a browser.
    Console,
}

impl Door {
    pub fn as_str(self) -> &'static str {
        match self {
            Door::Grpc => "grpc",
            Door::Mcp => "mcp",
            Door::Console => "console",
        }
    }
}

/// The identity every decision is made for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Shared, not copied, by what records each call (its span's attributes).
    pub tenant: Arc<str>,
    pub subject: String,
    pub agent: Arc<str>,
    pub scopes: BTreeSet<String>,
    pub method: AuthMethod,
    /// The verified token's claims that the catalog exposes to conditions
    /// (`identity.jwt.claims.expose`); none for other identities.
    pub claims: Claims,
    /// The bearer token the caller was verified by; none for other identities.
    pub token: Option<BearerToken>,
    /// For a sub-agent's call made under a handoff: the chain it works in and its limits.
    pub delegation: Option<Arc<delegation::Delegation>>,
}

/// The bearer token a caller was verified by, for the backends that take the person's own
/// credential (exchanged for one of theirs, or passed through where the operator says it is
/// theirs: docs/executors.md). Never printed: its `Debug` shows a fingerprint.
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken {
    text: Arc<str>,
    /// Its SHA-256, computed once when it was verified.
    key: [u8; 32],
    /// Its `aud` claim, one or several.
    audience: Arc<[String]>,
    /// Its `exp` claim (Unix seconds).
    expires: u64,
}

impl BearerToken {
    pub fn new(text: &str, audience: Vec<String>, expires: u64) -> Self {
        BearerToken {
            text: text.into(),
            key: token_cache::key_of(text),
            audience: audience.into(),
            expires,
        }
    }

    /// Its SHA-256: what caches of things issued for it are keyed by.
    pub fn key(&self) -> &[u8; 32] {
        &self.key
    }

    /// The token itself, for the request that carries it.
    pub fn secret(&self) -> &str {
        &self.text
    }

    pub fn len(&self) -> usize {
        self.text.len() + self.audience.iter().map(String::len).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    pub fn audience(&self) -> &[String] {
        &self.audience
    }

    /// When it expires (Unix seconds).
    pub fn expires(&self) -> u64 {
        self.expires
    }

    /// Its SHA-256, the first 16 hex digits: names it in logs, spans and audit events.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.text)
    }
}

/// The first 16 hex digits of a secret's SHA-256: enough to tell two apart in a log, nothing
/// to use.
pub fn fingerprint(secret: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(secret.as_bytes());
    hex::encode(&digest[..8])
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BearerToken(sha256:{})", self.fingerprint())
    }
}

/// Claims of a verified token that conditions may read (`caller.claims`): only those the
/// catalog names, never the whole token. Shared: a cached token's caller clones a pointer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims(Option<Arc<serde_json::Map<String, serde_json::Value>>>);

impl Claims {
    pub fn new(claims: serde_json::Map<String, serde_json::Value>) -> Self {
        Claims((!claims.is_empty()).then(|| Arc::new(claims)))
    }

    /// The claims, by name.
    pub fn map(&self) -> Option<&serde_json::Map<String, serde_json::Value>> {
        self.0.as_deref()
    }
}

impl Caller {
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.contains(scope)
    }
}

/// Why a caller could not be identified; always gRPC UNAUTHENTICATED, and nothing runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("missing credentials: send `authorization: Bearer <JWT>`")]
    MissingCredentials,
    #[error("dev identity headers are not accepted: dev identity is off in this sidecar's config")]
    DevIdentityDisabled,
    #[error("a bearer token was sent but this sidecar has no JWT verification configured")]
    JwtNotConfigured,
    #[error("malformed authorization metadata: expected `Bearer <JWT>`")]
    MalformedAuthorization,
    #[error("metadata {0} is not valid ASCII text")]
    InvalidMetadata(&'static str),
    #[error("invalid token: {0}")]
    InvalidToken(String),
    /// No configured or fetched key matches the token's algorithm and `kid`.
    #[error("invalid token: {0}")]
    NoKey(String),
    /// The signature matches none of the fetched keys the token could be under (and no
    /// configured one): the issuer may have replaced a key under the same `kid`.
    #[error("invalid token: {0}")]
    SignatureMismatch(String),
    /// The issuer's keys were never fetched, or too long ago.
    #[error("cannot verify the token: {0}")]
    KeysUnavailable(String),
    #[error("token has no tenant claim {0:?}")]
    MissingTenantClaim(String),
    #[error("missing tenant: send the x-toolgate-tenant header (gRPC metadata)")]
    MissingTenantHeader,
    #[error("the caller's {field} is {len} bytes; the limit is {max}")]
    TooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("the caller's {0} holds a control character")]
    NotPrintable(&'static str),
    #[error("invalid delegation: {0}")]
    InvalidDelegation(String),
    #[error("a delegation was sent but this sidecar has no delegation keys (identity.delegation)")]
    DelegationNotConfigured,
    #[error(
        "the delegation is for tenant {delegated:?}, but the request's own identity is tenant {own:?}"
    )]
    DelegationOtherTenant { delegated: String, own: String },
}

/// Refuses identities whose parts are longer than the limit (scopes: 16 times it, in total) or
/// hold control characters: they end up in logs, audit lines and limiter keys.
pub(crate) fn check_lengths(caller: &Caller, max: usize) -> Result<(), IdentityError> {
    for (field, value) in [
        ("tenant", &*caller.tenant),
        ("subject", caller.subject.as_str()),
        ("agent", &*caller.agent),
    ] {
        if value.len() > max {
            return Err(IdentityError::TooLong {
                field,
                len: value.len(),
                max,
            });
        }
        if value.chars().any(char::is_control) {
            return Err(IdentityError::NotPrintable(field));
        }
    }
    let scopes: usize = caller.scopes.iter().map(|s| s.len() + 1).sum();
    if scopes > max.saturating_mul(16) {
        return Err(IdentityError::TooLong {
            field: "scopes",
            len: scopes,
            max: max.saturating_mul(16),
        });
    }
    if caller
        .scopes
        .iter()
        .any(|s| s.chars().any(char::is_control))
    {
        return Err(IdentityError::NotPrintable("scopes"));
    }
    Ok(())
}

/// The identity resolver in force; swapped whole when a reload changes `identity` (key rotation),
/// so tokens verified under old keys are forgotten with it.
pub type IdentityHandle = Arc<arc_swap::ArcSwap<IdentityResolver>>;

/// Turns request metadata into a [`Caller`] according to the config.
#[derive(Debug)]
pub struct IdentityResolver {
    dev_identity: bool,
    jwt: Option<JwtVerifier>,
    /// The same keys and claims, with the MCP door's resource as the only audience; its own
    /// token cache, so a token verified for one door is never taken as verified for the other.
    mcp_jwt: Option<JwtVerifier>,
    /// The same keys and claims for the console's ID tokens, whose audience is its client id.
    console_jwt: Option<JwtVerifier>,
    /// Each issuer's fetched keys (shared by both verifiers), in the config's order.
    remote: Vec<Option<Arc<RemoteKeys>>>,
    delegation: Option<Arc<delegation::DelegationKeys>>,
    max_identity_bytes: usize,
}

impl IdentityResolver {
    /// `clock` is what token lifetimes are checked against; verified tokens are remembered within
    /// `cache_bytes`. An issuer's fetched keys are taken over from `previous` (the resolver a
    /// reload replaces) when they come from the same place with the same settings, so a reload
    /// neither fetches them again nor loses the last good set while the issuer is down.
    pub fn new(
        config: &IdentityConfig,
        clock: SharedClock,
        cache_bytes: usize,
        previous: Option<&IdentityResolver>,
    ) -> Result<Self, String> {
        let carried: Vec<&Arc<RemoteKeys>> = previous
            .into_iter()
            .flat_map(|p| p.remote.iter().flatten())
            .collect();
        let remote = config
            .jwt
            .iter()
            .flat_map(|jwt| jwt.remote_keys())
            .map(|settings| {
                settings
                    .map(|settings| {
                        let same_source = carried
                            .iter()
                            .find(|keys| keys.settings().source == settings.source);
                        match same_source {
                            Some(keys) if keys.settings() == settings => Ok(Arc::clone(keys)),
                            Some(keys) => {
                                RemoteKeys::taking_over(keys, settings.clone(), clock.clone())
                                    .map(Arc::new)
                            }
                            None => RemoteKeys::new(settings.clone(), clock.clone()).map(Arc::new),
                        }
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(IdentityResolver {
            dev_identity: config.dev_identity,
            jwt: config.jwt.as_ref().map(|settings| {
                JwtVerifier::new(
                    settings,
                    &remote,
                    clock.clone(),
                    cache_bytes,
                    config.max_identity_bytes,
                )
            }),
            mcp_jwt: config.jwt.as_ref().zip(config.mcp_resource.as_deref()).map(
                |(settings, resource)| {
                    JwtVerifier::new(
                        &settings.for_audience(resource),
                        &remote,
                        clock.clone(),
                        cache_bytes,
                        config.max_identity_bytes,
                    )
                },
            ),
            console_jwt: config
                .jwt
                .as_ref()
                .zip(config.console_client_id.as_deref())
                .map(|(settings, client_id)| {
                    JwtVerifier::new(
                        &settings.for_audience(client_id),
                        &remote,
                        clock,
                        cache_bytes,
                        config.max_identity_bytes,
                    )
                }),
            remote,
            delegation: config.delegation.clone(),
            max_identity_bytes: config.max_identity_bytes,
        })
    }

    /// Starts fetching the issuers' keys (at once, then on their schedule); keys taken over
    /// from a previous resolver are already being fetched.
    pub fn start_refreshing(&self) {
        for keys in self.remote.iter().flatten() {
            keys.start_refreshing();
        }
    }

    /// For a request refused with `err`: the fetched keys that a refetch might let verify it
    /// (the token named a key not in the set, came before the first fetch, or is signed by a
    /// key replaced under a known `kid`), if a refetch is allowed now or one is under way.
    pub fn keys_to_refetch(
        &self,
        err: &IdentityError,
        metadata: &http::HeaderMap,
        for_mcp: bool,
    ) -> Option<Arc<RemoteKeys>> {
        if !matches!(
            err,
            IdentityError::NoKey(_)
                | IdentityError::KeysUnavailable(_)
                | IdentityError::SignatureMismatch(_)
        ) {
            return None;
        }
        let verifier = if for_mcp { &self.mcp_jwt } else { &self.jwt };
        let token = bearer(text(metadata, &http::header::AUTHORIZATION).ok()??).ok()?;
        let keys = verifier.as_ref()?.remote_keys_for(token)?;
        keys.refetch_allowed().then(|| keys.clone())
    }

    /// The verifier of the console's ID tokens (audience: its client id), when it signs in
    /// through an issuer.
    pub fn console_verifier(&self) -> Option<&JwtVerifier> {
        self.console_jwt.as_ref()
    }

    pub fn dev_identity(&self) -> bool {
        self.dev_identity
    }

    /// Bytes held by the token cache.
    pub fn cache_bytes(&self) -> usize {
        [&self.jwt, &self.mcp_jwt, &self.console_jwt]
            .into_iter()
            .flatten()
            .map(JwtVerifier::cache_bytes)
            .sum()
    }

    /// A bearer token wins when present; dev headers are read only when dev identity is on.
    /// The caller named by a request's headers (gRPC metadata).
    pub fn resolve(&self, metadata: &http::HeaderMap) -> Result<Arc<Caller>, IdentityError> {
        self.resolve_with(self.jwt.as_ref(), metadata)
    }

    /// As [`Self::resolve`], for the MCP door: a token must name the door's resource as its
    /// audience.
    pub fn resolve_for_mcp(
        &self,
        metadata: &http::HeaderMap,
    ) -> Result<Arc<Caller>, IdentityError> {
        self.resolve_with(self.mcp_jwt.as_ref(), metadata)
    }

    fn resolve_with(
        &self,
        jwt: Option<&JwtVerifier>,
        metadata: &http::HeaderMap,
    ) -> Result<Arc<Caller>, IdentityError> {
        if let Some(token) = text(metadata, &DELEGATION)? {
            let keys = self
                .delegation
                .as_ref()
                .ok_or(IdentityError::DelegationNotConfigured)?;
            let delegated = keys.verify(token.trim(), self.max_identity_bytes)?;
            // The request's own identity, when it has one, must verify and be the delegation's
            // tenant: a token copied into another tenant's call is refused, and the caller is
            // the delegation's alone (its own identity never widens it).
            if metadata.contains_key(http::header::AUTHORIZATION) || metadata.contains_key(&TENANT)
            {
                let own = self.resolve_own(jwt, metadata)?;
                if own.tenant != delegated.tenant {
                    return Err(IdentityError::DelegationOtherTenant {
                        delegated: delegated.tenant.to_string(),
                        own: own.tenant.to_string(),
                    });
                }
            }
            return Ok(Arc::new(delegated));
        }
        self.resolve_own(jwt, metadata)
    }

    /// The caller the request's own credentials name: its bearer token, or dev headers.
    fn resolve_own(
        &self,
        jwt: Option<&JwtVerifier>,
        metadata: &http::HeaderMap,
    ) -> Result<Arc<Caller>, IdentityError> {
        if let Some(auth) = text(metadata, &http::header::AUTHORIZATION)? {
            let token = bearer(auth)?;
            let verifier = jwt.ok_or(IdentityError::JwtNotConfigured)?;
            return verifier.verify(token);
        }
        let tenant = text(metadata, &TENANT)?;
        if !self.dev_identity {
            return Err(match tenant {
                Some(_) => IdentityError::DevIdentityDisabled,
                None => IdentityError::MissingCredentials,
            });
        }
        let tenant = tenant
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(IdentityError::MissingTenantHeader)?;
        let caller = Caller {
            tenant: tenant.into(),
            subject: text(metadata, &SUBJECT)?.unwrap_or("").trim().to_owned(),
            agent: text(metadata, &AGENT)?.unwrap_or("").trim().into(),
            scopes: split_scopes(text(metadata, &SCOPES)?.unwrap_or("")),
            method: AuthMethod::Dev,
            claims: Default::default(),
            token: None,
            delegation: None,
        };
        check_lengths(&caller, self.max_identity_bytes)?;
        Ok(Arc::new(caller))
    }
}

/// The token of an `authorization: Bearer <token>` value.
fn bearer(auth: &str) -> Result<&str, IdentityError> {
    auth.strip_prefix("Bearer ")
        .or_else(|| auth.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(IdentityError::MalformedAuthorization)
}

fn text<'a>(
    metadata: &'a http::HeaderMap,
    key: &'static HeaderName,
) -> Result<Option<&'a str>, IdentityError> {
    metadata
        .get(key)
        .map(|v| {
            v.to_str()
                .map_err(|_| IdentityError::InvalidMetadata(key.as_str()))
        })
        .transpose()
}

/// Scopes separated by commas and/or spaces.
pub fn split_scopes(text: &str) -> BTreeSet<String> {
    text.split([',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataMap;

    fn resolver(dev: bool) -> IdentityResolver {
        IdentityResolver::new(
            &IdentityConfig {
                dev_identity: dev,
                dev_identity_on_network: false,
                jwt: None,
                max_identity_bytes: 256,
                mcp_resource: None,
                console_client_id: None,
                delegation: None,
            },
            SharedClock::system(),
            1 << 20,
            None,
        )
        .unwrap()
    }

    fn metadata(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut map = MetadataMap::new();
        for (k, v) in pairs {
            map.insert(*k, v.parse().unwrap());
        }
        map.into_headers()
    }

    #[test]
    fn dev_headers_make_a_caller_when_enabled() {
        let caller = resolver(true)
            .resolve(&metadata(&[
                (TENANT_HEADER, "acme"),
                (SUBJECT_HEADER, "alice"),
                (SCOPES_HEADER, "tickets:read, tickets:write"),
            ]))
            .unwrap();
        assert_eq!(&*caller.tenant, "acme");
        assert!(caller.has_scope("tickets:write"));
        assert_eq!(caller.method, AuthMethod::Dev);
    }

    #[test]
    fn dev_headers_are_refused_when_disabled_and_tenant_is_required() {
        let err = resolver(false).resolve(&metadata(&[(TENANT_HEADER, "acme")]));
        assert_eq!(err, Err(IdentityError::DevIdentityDisabled));
        let err = resolver(true).resolve(&metadata(&[(SUBJECT_HEADER, "alice")]));
        assert_eq!(err, Err(IdentityError::MissingTenantHeader));
        let err = resolver(false).resolve(MetadataMap::new().as_ref());
        assert_eq!(err, Err(IdentityError::MissingCredentials));
    }

    #[test]
    fn oversized_or_unprintable_identities_are_refused() {
        let long = "t".repeat(257);
        let err = resolver(true).resolve(&metadata(&[(TENANT_HEADER, &long)]));
        assert!(matches!(
            err,
            Err(IdentityError::TooLong {
                field: "tenant",
                ..
            })
        ));
        let scopes: String = (0..600).map(|i| format!("scope{i} ")).collect();
        let err = resolver(true).resolve(&metadata(&[
            (TENANT_HEADER, "acme"),
            (SCOPES_HEADER, &scopes),
        ]));
        assert!(matches!(
            err,
            Err(IdentityError::TooLong {
                field: "scopes",
                ..
            })
        ));
    }

    #[test]
    fn a_token_without_jwt_config_is_refused_not_ignored() {
        let err = resolver(true).resolve(&metadata(&[
            ("authorization", "Bearer abc.def.ghi"),
            (TENANT_HEADER, "acme"),
        ]));
        assert_eq!(err, Err(IdentityError::JwtNotConfigured));
    }
}
