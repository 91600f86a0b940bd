//! JWT verification with jsonwebtoken: HS256 shared secrets, RS256/ES256 PEM public keys, a
//! JWKS file, or the keys an issuer publishes ([`super::jwks`]); one issuer or several, each
//! with its own claim mapping. `exp` is required; `nbf`, `iss` and `aud` are checked; claims map
//! to a [`Caller`].

use std::{fmt, path::Path, sync::Arc, time::Duration};

use jsonwebtoken::{Algorithm, DecodingKey, Validation, jwk::JwkSet};
use serde_json::Value;

use super::{
    AuthMethod, BearerToken, Caller, Claims, IdentityError,
    jwks::{JwksSettings, RemoteKeys},
    keys::{Key, signature_keys},
    split_scopes,
    token_cache::{self, TokenCache, Validity, Verified},
};
use crate::{
    clock::SharedClock,
    settings::{Env, FieldError, parse_duration, raw::RawJwt, read_file},
};

/// Validated JWT settings: one issuer, or several (each with its own keys, audience and claim
/// mapping; a token goes to the one its `iss` names).
#[derive(Debug, Clone)]
pub struct JwtSettings {
    issuers: Vec<IssuerSettings>,
}

/// One issuer's settings, its fixed keys loaded.
#[derive(Clone)]
pub struct IssuerSettings {
    keys: Vec<Key>,
    /// Keys fetched from the issuer, besides the fixed ones.
    jwks: Option<JwksSettings>,
    issuer: Vec<String>,
    audience: Vec<String>,
    leeway: Duration,
    tenant_claim: String,
    subject_claim: String,
    agent_claim: String,
    scopes_claim: String,
    /// Claims given to conditions as `caller.claims`.
    exposed_claims: Vec<String>,
}

impl fmt::Debug for IssuerSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material.
        f.debug_struct("IssuerSettings")
            .field("keys", &self.keys.len())
            .field("jwks", &self.jwks)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl JwtSettings {
    /// Loads keys from files or the environment (paths relative to the config file); `None`
    /// when no issuer is configured. Several issuers must each name theirs, once.
    pub fn build(raws: &[RawJwt], base_dir: &Path, env: &Env) -> Result<Option<Self>, FieldError> {
        let several = raws.len() > 1;
        let mut issuers: Vec<IssuerSettings> = Vec::new();
        for (i, raw) in raws.iter().enumerate() {
            let at = if several {
                format!("identity.jwt[{i}]")
            } else {
                "identity.jwt".to_owned()
            };
            let settings = IssuerSettings::build(raw, &at, base_dir, env)?;
            if several {
                if settings.issuer.is_empty() {
                    return Err(FieldError::new(
                        format!("{at}.issuer"),
                        "with several issuers, each must name its iss value(s): a token is verified by the one its iss names",
                    ));
                }
                if let Some(taken) = settings
                    .issuer
                    .iter()
                    .find(|iss| issuers.iter().any(|other| other.issuer.contains(iss)))
                {
                    return Err(FieldError::new(
                        format!("{at}.issuer"),
                        format!("{taken:?} is named by another issuer too"),
                    ));
                }
            }
            issuers.push(settings);
        }
        Ok((!issuers.is_empty()).then_some(JwtSettings { issuers }))
    }

    /// The same issuers, keys and claims, with `resource` as the only audience accepted.
    pub fn for_audience(&self, resource: &str) -> JwtSettings {
        JwtSettings {
            issuers: self
                .issuers
                .iter()
                .map(|issuer| IssuerSettings {
                    audience: vec![resource.to_owned()],
                    ..issuer.clone()
                })
                .collect(),
        }
    }

    /// Whether a token naming `iss` would be verified by one of these issuers (one issuer that
    /// names none takes any).
    pub fn trusts(&self, iss: &str) -> bool {
        let issuers: Vec<&IssuerSettings> = self.issuers.iter().collect();
        route_refs(&issuers, Some(iss)).is_ok_and(|i| {
            let named = &self.issuers[i].issuer;
            named.is_empty()
                || named
                    .iter()
                    .any(|n| n.trim_end_matches('/') == iss.trim_end_matches('/'))
        })
    }

    /// Where each issuer's keys are fetched from, if they are.
    pub fn remote_keys(&self) -> impl Iterator<Item = Option<&JwksSettings>> {
        self.issuers.iter().map(|issuer| issuer.jwks.as_ref())
    }

    /// The caller a verified token's claims name, through the claim names of the issuer its
    /// `iss` names (also used by `toolgate test` for cases written as claims).
    pub fn caller_from_claims(
        &self,
        claims: &Value,
        max_identity_bytes: usize,
    ) -> Result<Caller, IdentityError> {
        let iss = claims.get("iss").and_then(Value::as_str);
        let issuers: Vec<&IssuerSettings> = self.issuers.iter().collect();
        self.issuers[route_refs(&issuers, iss)?].caller_from_claims(claims, max_identity_bytes)
    }
}

/// The issuer a token with this `iss` goes to: the only one, or the one naming it.
fn route_refs(issuers: &[&IssuerSettings], iss: Option<&str>) -> Result<usize, IdentityError> {
    if issuers.len() == 1 {
        return Ok(0);
    }
    let iss = iss.ok_or_else(|| {
        IdentityError::InvalidToken(
            "missing required claim \"iss\" (this sidecar trusts several issuers)".into(),
        )
    })?;
    issuers
        .iter()
        .position(|issuer| issuer.issuer.iter().any(|name| name == iss))
        .ok_or_else(|| {
            IdentityError::InvalidToken(format!(
                "issuer {:?} is not one this sidecar trusts",
                echoed(iss)
            ))
        })
}

impl IssuerSettings {
    fn build(raw: &RawJwt, at: &str, base_dir: &Path, env: &Env) -> Result<Self, FieldError> {
        let mut keys = Vec::new();
        let read = |field: &str, file: &str| read_file(base_dir, file, &format!("{at}.{field}"));
        if let Some(file) = &raw.hs256_secret_file {
            let secret = read("hs256_secret_file", file)?;
            keys.push(hs256_key(
                trim_secret(&secret),
                &format!("{at}.hs256_secret_file"),
            )?);
        }
        if let Some(var) = &raw.hs256_secret_env {
            let secret = env.get(var).ok_or_else(|| {
                FieldError::new(
                    format!("{at}.hs256_secret_env"),
                    format!("environment variable {var} is not set"),
                )
            })?;
            keys.push(hs256_key(
                secret.trim().as_bytes(),
                &format!("{at}.hs256_secret_env"),
            )?);
        }
        for (i, file) in raw.public_key_files.iter().enumerate() {
            let pem = read(&format!("public_key_files[{i}]"), file)?;
            let key = if let Ok(key) = DecodingKey::from_rsa_pem(&pem) {
                Key {
                    kid: None,
                    algorithm: Algorithm::RS256,
                    key,
                }
            } else if let Ok(key) = DecodingKey::from_ec_pem(&pem) {
                Key {
                    kid: None,
                    algorithm: Algorithm::ES256,
                    key,
                }
            } else {
                return Err(FieldError::new(
                    format!("{at}.public_key_files[{i}]"),
                    format!("{file} is not an RSA or EC public key in PEM form"),
                ));
            };
            keys.push(key);
        }
        if let Some(file) = &raw.jwks_file {
            let bytes = read("jwks_file", file)?;
            let set: JwkSet = serde_json::from_slice(&bytes).map_err(|err| {
                FieldError::new(
                    format!("{at}.jwks_file"),
                    format!("not a JWKS document: {err}"),
                )
            })?;
            for (i, key) in signature_keys(&set) {
                // A file is the operator's own: a key in it that cannot be used is a mistake.
                keys.push(key.map_err(|err| {
                    FieldError::new(format!("{at}.jwks_file: keys[{i}]"), err.to_string())
                })?);
            }
        }
        let jwks = raw
            .jwks
            .as_ref()
            .map(|jwks| JwksSettings::build(jwks, &format!("{at}.jwks")))
            .transpose()?;
        if keys.is_empty() && jwks.is_none() {
            return Err(FieldError::new(
                at,
                "no verification key: set jwks (the issuer's published keys), hs256_secret_file, hs256_secret_env, public_key_files or jwks_file (with at least one key whose use is sig)",
            ));
        }
        let leeway = match &raw.leeway {
            Some(text) => parse_duration(text)
                .map_err(|err| FieldError::new(format!("{at}.leeway"), err.to_string()))?,
            None => Duration::from_secs(30),
        };
        let claim = |value: &Option<String>, default: &str| {
            value.clone().unwrap_or_else(|| default.to_owned())
        };
        // Keys found through an issuer's discovery are that issuer's: its tokens must say so,
        // or a key set shared by several issuers would verify the others' tokens too.
        let issuer = match (
            &raw.issuer[..],
            raw.jwks.as_ref().and_then(|j| j.discover.as_ref()),
        ) {
            ([], Some(discovered)) => vec![discovered.clone()],
            (named, _) => named.to_vec(),
        };
        Ok(IssuerSettings {
            keys,
            jwks,
            issuer,
            audience: raw.audience.clone(),
            leeway,
            tenant_claim: claim(&raw.claims.tenant, "tenant"),
            subject_claim: claim(&raw.claims.subject, "sub"),
            agent_claim: claim(&raw.claims.agent, "agent"),
            scopes_claim: claim(&raw.claims.scopes, "scope"),
            exposed_claims: exposed_claims(&raw.claims.expose, at)?,
        })
    }
}

fn trim_secret(secret: &[u8]) -> &[u8] {
    // Secret files usually end with a newline that is not part of the secret.
    let end = secret
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    &secret[..end]
}

fn hs256_key(secret: &[u8], path: &str) -> Result<Key, FieldError> {
    if secret.len() < 32 {
        return Err(FieldError::new(
            path,
            "HS256 secret must be at least 32 bytes",
        ));
    }
    let key = DecodingKey::from_secret(secret)
        .map_err(|err| FieldError::new(path, format!("unusable secret: {err}")))?;
    Ok(Key {
        kid: None,
        algorithm: Algorithm::HS256,
        key,
    })
}

/// Verifies bearer tokens against the configured issuers' keys. Token lifetimes (`exp`, `nbf`)
/// are read on the injected clock, like every other time-dependent decision.
#[derive(Debug)]
pub struct JwtVerifier {
    issuers: Vec<IssuerVerifier>,
    clock: SharedClock,
    cache: TokenCache,
    max_identity_bytes: usize,
}

/// One issuer's settings and, when they are fetched, its published keys.
#[derive(Debug)]
struct IssuerVerifier {
    settings: IssuerSettings,
    remote: Option<Arc<RemoteKeys>>,
}

/// Most bytes of a token's own text (`kid`, `iss`) a refusal repeats: enough to tell values
/// apart, not a megabyte.
const MAX_ECHOED: usize = 64;

/// The start of a token's text, cut on a character boundary.
fn echoed(text: &str) -> &str {
    let mut cut = text.len().min(MAX_ECHOED);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

/// Only the claim a token is routed by, read before its signature is checked.
#[derive(serde::Deserialize)]
struct Routing {
    iss: Option<String>,
}

impl JwtVerifier {
    /// A verifier with its own, empty token cache: tokens verified under other settings (keys,
    /// audience) are never trusted by it. `remote` holds each issuer's fetched keys, in the
    /// order of `settings` (see [`JwtSettings::remote_keys`]).
    pub fn new(
        settings: &JwtSettings,
        remote: &[Option<Arc<RemoteKeys>>],
        clock: SharedClock,
        cache_bytes: usize,
        max_identity_bytes: usize,
    ) -> Self {
        JwtVerifier {
            issuers: settings
                .issuers
                .iter()
                .enumerate()
                .map(|(i, settings)| IssuerVerifier {
                    settings: settings.clone(),
                    remote: remote.get(i).cloned().flatten(),
                })
                .collect(),
            clock,
            cache: TokenCache::new(cache_bytes),
            max_identity_bytes,
        }
    }

    /// Bytes held by the token cache.
    pub fn cache_bytes(&self) -> usize {
        self.cache.bytes()
    }

    pub fn verify(&self, token: &str) -> Result<Arc<Caller>, IdentityError> {
        let now = u64::try_from(self.clock.unix_ms() / 1000).unwrap_or(0);
        let key = token_cache::key_of(token);
        if let Some(cached) = self.cache.get(&key, now) {
            let verified = cached?;
            let current = match (&self.issuers[verified.issuer].remote, verified.generation) {
                // Fetched keys past keep_last_good vouch for no token, cached or not; a key the
                // issuer has withdrawn since no longer vouches for the token it verified.
                (Some(remote), Some(generation)) => remote.keys()?.generation == generation,
                // Verified by a fixed key: what becomes of the fetched ones does not matter.
                _ => true,
            };
            if current {
                return Ok(verified.caller);
            }
        }
        let verified = self.verify_uncached(token)?;
        verified.validity.check(now, verified.leeway)?;
        let caller = verified.caller.clone();
        self.cache.insert(key, verified, now);
        Ok(caller)
    }

    /// The fetched keys of the issuer `token` would be verified by, if they are fetched.
    pub fn remote_keys_for(&self, token: &str) -> Option<&Arc<RemoteKeys>> {
        self.issuers[self.route(token).ok()?].remote.as_ref()
    }

    fn route(&self, token: &str) -> Result<usize, IdentityError> {
        if self.issuers.len() == 1 {
            return Ok(0);
        }
        let routing: Routing = jsonwebtoken::dangerous::insecure_decode_claims(token)
            .map_err(|err| IdentityError::InvalidToken(format!("unreadable claims ({err})")))?;
        let settings: Vec<&IssuerSettings> = self.issuers.iter().map(|i| &i.settings).collect();
        route_refs(&settings, routing.iss.as_deref())
    }

    /// Signature, algorithm, issuer, audience and claims; the time window is checked by the caller.
    fn verify_uncached(&self, token: &str) -> Result<Verified, IdentityError> {
        let issuer = self.route(token)?;
        let IssuerVerifier {
            settings: s,
            remote,
        } = &self.issuers[issuer];
        // jsonwebtoken has no `none` algorithm: such a header fails here and nothing is trusted.
        let header = jsonwebtoken::decode_header(token).map_err(|err| {
            IdentityError::InvalidToken(format!(
                "unreadable header or unsupported algorithm ({err})"
            ))
        })?;
        let fetched = remote.as_ref().map(|remote| remote.keys()).transpose();
        let (fetched, unavailable) = match fetched {
            Ok(set) => (set, None),
            Err(err) => (None, Some(err)),
        };
        let generation = fetched.as_ref().map(|set| set.generation);
        let kid = header.kid.as_deref();
        // Each with whether it was fetched (its tokens are tied to the fetched set's fate).
        let candidates: Vec<(&Key, bool)> = s
            .keys
            .iter()
            .map(|k| (k, false))
            .chain(
                fetched
                    .iter()
                    .flat_map(|set| set.keys.iter().map(|k| (k, true))),
            )
            .filter(|(k, _)| k.matches(header.alg, kid))
            .collect();
        if candidates.is_empty() {
            // Keys that could not be fetched explain the refusal better than their absence.
            if let Some(unavailable) = unavailable {
                return Err(unavailable);
            }
            return Err(IdentityError::NoKey(format!(
                "no key for algorithm {:?}{}",
                header.alg,
                // The kid is the caller's text: only its start is echoed.
                kid.map(|k| format!(" and kid {:?}", echoed(k)))
                    .unwrap_or_default()
            )));
        }
        let only_fetched = candidates.iter().all(|(_, was_fetched)| *was_fetched);
        let mut last_error = None;
        for (key, was_fetched) in candidates {
            let mut validation = Validation::new(key.algorithm);
            // `exp` must be present (an integer); it and `nbf` are compared with the injected
            // clock in `verify`, not with jsonwebtoken's system time.
            validation.validate_exp = false;
            validation.validate_nbf = false;
            // A configured issuer or audience must be present in the token, not merely not
            // contradicted: a token minted without `aud` is not a token for us.
            let mut required = vec!["exp"];
            if s.issuer.is_empty() {
                validation.iss = None;
            } else {
                validation.set_issuer(&s.issuer);
                required.push("iss");
            }
            if s.audience.is_empty() {
                validation.validate_aud = false;
            } else {
                validation.set_audience(&s.audience);
                required.push("aud");
            }
            validation.set_required_spec_claims(&required);
            match jsonwebtoken::decode::<Value>(token, &key.key, &validation) {
                Ok(data) => {
                    let validity = validity_of(&data.claims)?;
                    let mut caller = s.caller_from_claims(&data.claims, self.max_identity_bytes)?;
                    caller.token = Some(BearerToken::new(
                        token,
                        audience_of(&data.claims),
                        validity.expires,
                    ));
                    return Ok(Verified {
                        validity,
                        caller: Arc::new(caller),
                        issuer,
                        generation: generation.filter(|_| was_fetched),
                        leeway: s.leeway.as_secs(),
                    });
                }
                Err(err) => last_error = Some(err),
            }
        }
        let bad_signature = last_error
            .as_ref()
            .is_some_and(|e| *e.kind() == jsonwebtoken::errors::ErrorKind::InvalidSignature);
        let said = last_error.map(|e| describe(&e)).unwrap_or_default();
        if bad_signature && only_fetched {
            // Worth one look at the issuer's current keys (rate-limited like an unknown kid).
            return Err(IdentityError::SignatureMismatch(said));
        }
        Err(IdentityError::InvalidToken(said))
    }
}

impl IssuerSettings {
    /// The caller a verified token's claims name, through this issuer's claim names.
    fn caller_from_claims(
        &self,
        claims: &Value,
        max_identity_bytes: usize,
    ) -> Result<Caller, IdentityError> {
        let s = self;
        let string = |name: &str| claims.get(name).and_then(Value::as_str).map(str::to_owned);
        let tenant = string(&s.tenant_claim)
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| IdentityError::MissingTenantClaim(s.tenant_claim.clone()))?;
        let scopes = match claims.get(&s.scopes_claim) {
            Some(Value::String(text)) => split_scopes(text),
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            _ => Default::default(),
        };
        let caller = Caller {
            tenant: tenant.into(),
            subject: string(&s.subject_claim).unwrap_or_default(),
            agent: string(&s.agent_claim).unwrap_or_default().into(),
            scopes,
            method: AuthMethod::Jwt,
            claims: self.exposed(claims, max_identity_bytes)?,
            token: None,
            delegation: None,
        };
        super::check_lengths(&caller, max_identity_bytes)?;
        Ok(caller)
    }

    /// The exposed claims the token has. Each is bounded like the identity's fields (its JSON
    /// at most 16 times `limits.max_identity_bytes`): a token carrying a larger one is refused,
    /// not trimmed, so a condition never decides on half a claim.
    fn exposed(&self, claims: &Value, max_identity_bytes: usize) -> Result<Claims, IdentityError> {
        let max = max_identity_bytes.saturating_mul(16);
        let mut exposed = serde_json::Map::new();
        for name in &self.exposed_claims {
            let Some(value) = claims.get(name) else {
                continue;
            };
            let len = value.to_string().len();
            if len > max {
                return Err(IdentityError::InvalidToken(format!(
                    "claim {name:?} is {len} bytes, more than the {max} a condition may read"
                )));
            }
            exposed.insert(name.clone(), value.clone());
        }
        Ok(Claims::new(exposed))
    }
}

/// `identity.jwt.claims.expose`: claim names, each once.
fn exposed_claims(names: &[String], at: &str) -> Result<Vec<String>, FieldError> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, name) in names.iter().enumerate() {
        let at = format!("{at}.claims.expose[{i}]");
        if name.trim().is_empty() {
            return Err(FieldError::new(at, "a claim name cannot be empty"));
        }
        if !seen.insert(name.as_str()) {
            return Err(FieldError::new(at, format!("{name:?} is listed twice")));
        }
    }
    Ok(names.to_vec())
}

/// The token's `aud`: one string or several.
fn audience_of(claims: &Value) -> Vec<String> {
    match claims.get("aud") {
        Some(Value::String(aud)) => vec![aud.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// The token's `exp` (required, checked present by jsonwebtoken) and optional `nbf`.
fn validity_of(claims: &Value) -> Result<Validity, IdentityError> {
    let seconds = |name: &str| match claims.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or_else(|| {
            IdentityError::InvalidToken(format!("claim {name:?} is not a whole number of seconds"))
        }),
    };
    Ok(Validity {
        not_before: seconds("nbf")?,
        expires: seconds("exp")?
            .ok_or_else(|| IdentityError::InvalidToken("missing required claim \"exp\"".into()))?,
    })
}

fn describe(err: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind;
    match err.kind() {
        ErrorKind::ExpiredSignature => "token has expired".into(),
        ErrorKind::ImmatureSignature => "token is not valid yet (nbf)".into(),
        ErrorKind::InvalidSignature => "bad signature".into(),
        ErrorKind::InvalidIssuer => "wrong issuer".into(),
        ErrorKind::InvalidAudience => "wrong audience".into(),
        ErrorKind::MissingRequiredClaim(claim) => format!("missing required claim {claim:?}"),
        other => format!("{other:?}").to_lowercase(),
    }
}
