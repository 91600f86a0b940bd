//! JWT verification with jsonwebtoken: HS256 shared secrets, RS256/ES256 PEM public keys, or a
//! JWKS file. `exp` is required; `nbf`, `iss` and `aud` are checked; claims map to a [`Caller`].

use std::{fmt, path::Path, sync::Arc, time::Duration};

use jsonwebtoken::{Algorithm, DecodingKey, Validation, jwk::JwkSet};
use serde_json::Value;

use super::{
    AuthMethod, Caller, Claims, IdentityError, split_scopes,
    token_cache::{self, TokenCache, Validity, Verified},
};
use crate::{
    clock::SharedClock,
    settings::{Env, FieldError, parse_duration, raw::RawJwt, resolve_path},
};

/// One verification key and the algorithm it is used with.
#[derive(Clone)]
struct Key {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

/// Validated JWT settings, keys loaded.
#[derive(Clone)]
pub struct JwtSettings {
    keys: Vec<Key>,
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

impl fmt::Debug for JwtSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print key material.
        f.debug_struct("JwtSettings")
            .field("keys", &self.keys.len())
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl JwtSettings {
    /// Loads keys from files or the environment; paths are relative to the config file.
    pub fn build(raw: &RawJwt, base_dir: &Path, env: &Env) -> Result<Self, FieldError> {
        let mut keys = Vec::new();
        let read = |field: &str, file: &str| {
            let path = resolve_path(base_dir, file);
            std::fs::read(&path).map_err(|err| {
                FieldError::new(
                    format!("identity.jwt.{field}"),
                    format!("cannot read {}: {err}", path.display()),
                )
            })
        };
        if let Some(file) = &raw.hs256_secret_file {
            let secret = read("hs256_secret_file", file)?;
            keys.push(hs256_key(
                trim_secret(&secret),
                "identity.jwt.hs256_secret_file",
            )?);
        }
        if let Some(var) = &raw.hs256_secret_env {
            let secret = env.get(var).ok_or_else(|| {
                FieldError::new(
                    "identity.jwt.hs256_secret_env",
                    format!("environment variable {var} is not set"),
                )
            })?;
            keys.push(hs256_key(
                secret.trim().as_bytes(),
                "identity.jwt.hs256_secret_env",
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
                    format!("identity.jwt.public_key_files[{i}]"),
                    format!("{file} is not an RSA or EC public key in PEM form"),
                ));
            };
            keys.push(key);
        }
        if let Some(file) = &raw.jwks_file {
            let bytes = read("jwks_file", file)?;
            let set: JwkSet = serde_json::from_slice(&bytes).map_err(|err| {
                FieldError::new(
                    "identity.jwt.jwks_file",
                    format!("not a JWKS document: {err}"),
                )
            })?;
            for (i, jwk) in set.keys.iter().enumerate() {
                let at = format!("identity.jwt.jwks_file: keys[{i}]");
                // A key published for encryption must never verify a signature (RFC 7517 `use`).
                if matches!(
                    jwk.common.public_key_use,
                    Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)
                        | Some(jsonwebtoken::jwk::PublicKeyUse::Other(_))
                ) {
                    tracing::info!(key = i, kid = ?jwk.common.key_id, "JWKS key is not for signatures (use); skipped");
                    continue;
                }
                let algorithm = jwk_algorithm(jwk).ok_or_else(|| {
                    FieldError::new(&at, "key has no usable algorithm (RS256, ES256)")
                })?;
                let key = DecodingKey::from_jwk(jwk)
                    .map_err(|err| FieldError::new(&at, format!("unusable key: {err}")))?;
                keys.push(Key {
                    kid: jwk.common.key_id.clone(),
                    algorithm,
                    key,
                });
            }
        }
        if keys.is_empty() {
            return Err(FieldError::new(
                "identity.jwt",
                "no verification key: set hs256_secret_file, hs256_secret_env, public_key_files or jwks_file (with at least one key whose use is sig)",
            ));
        }
        let leeway = match &raw.leeway {
            Some(text) => parse_duration(text)
                .map_err(|err| FieldError::new("identity.jwt.leeway", err.to_string()))?,
            None => Duration::from_secs(30),
        };
        let claim = |value: &Option<String>, default: &str| {
            value.clone().unwrap_or_else(|| default.to_owned())
        };
        Ok(JwtSettings {
            keys,
            issuer: raw.issuer.clone(),
            audience: raw.audience.clone(),
            leeway,
            tenant_claim: claim(&raw.claims.tenant, "tenant"),
            subject_claim: claim(&raw.claims.subject, "sub"),
            agent_claim: claim(&raw.claims.agent, "agent"),
            scopes_claim: claim(&raw.claims.scopes, "scope"),
            exposed_claims: exposed_claims(&raw.claims.expose)?,
        })
    }
}

impl JwtSettings {
    /// The same keys, issuer and claims, with `resource` as the only audience accepted.
    pub fn for_audience(&self, resource: &str) -> JwtSettings {
        JwtSettings {
            audience: vec![resource.to_owned()],
            ..self.clone()
        }
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

fn jwk_algorithm(jwk: &jsonwebtoken::jwk::Jwk) -> Option<Algorithm> {
    use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, KeyAlgorithm};
    match jwk.common.key_algorithm {
        Some(KeyAlgorithm::RS256) => return Some(Algorithm::RS256),
        Some(KeyAlgorithm::ES256) => return Some(Algorithm::ES256),
        Some(_) => return None,
        None => {}
    }
    match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
        AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
            Some(Algorithm::ES256)
        }
        _ => None,
    }
}

/// Verifies bearer tokens against the configured keys. Token lifetimes (`exp`, `nbf`) are read
/// on the injected clock, like every other time-dependent decision.
#[derive(Debug)]
pub struct JwtVerifier {
    settings: JwtSettings,
    clock: SharedClock,
    cache: TokenCache,
    max_identity_bytes: usize,
}

/// Most bytes of a token's `kid` a refusal repeats: enough to tell keys apart, not a megabyte.
const MAX_ECHOED_KID: usize = 64;

/// The start of a token's `kid`, cut on a character boundary.
fn echoed_kid(kid: &str) -> &str {
    let mut cut = kid.len().min(MAX_ECHOED_KID);
    while !kid.is_char_boundary(cut) {
        cut -= 1;
    }
    &kid[..cut]
}

impl JwtVerifier {
    /// A verifier with its own, empty token cache: tokens verified under other settings (keys,
    /// audience) are never trusted by it.
    pub fn new(
        settings: &JwtSettings,
        clock: SharedClock,
        cache_bytes: usize,
        max_identity_bytes: usize,
    ) -> Self {
        JwtVerifier {
            settings: settings.clone(),
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
        let leeway = self.settings.leeway.as_secs();
        let key = token_cache::key_of(token);
        if let Some(cached) = self.cache.get(&key, now, leeway) {
            return cached;
        }
        let verified = self.verify_uncached(token)?;
        verified.validity.check(now, leeway)?;
        let caller = verified.caller.clone();
        self.cache.insert(key, verified, now, leeway);
        Ok(caller)
    }

    /// Signature, algorithm, issuer, audience and claims; the time window is checked by the caller.
    fn verify_uncached(&self, token: &str) -> Result<Verified, IdentityError> {
        let s = &self.settings;
        // jsonwebtoken has no `none` algorithm: such a header fails here and nothing is trusted.
        let header = jsonwebtoken::decode_header(token).map_err(|err| {
            IdentityError::InvalidToken(format!(
                "unreadable header or unsupported algorithm ({err})"
            ))
        })?;
        let candidates: Vec<&Key> = s
            .keys
            .iter()
            .filter(|k| k.algorithm == header.alg)
            .filter(|k| match (&header.kid, &k.kid) {
                (Some(want), Some(have)) => want == have,
                _ => true,
            })
            .collect();
        if candidates.is_empty() {
            return Err(IdentityError::InvalidToken(format!(
                "no key for algorithm {:?}{}",
                header.alg,
                header
                    .kid
                    .as_deref()
                    // The kid is the caller's text: only its start is echoed.
                    .map(|k| format!(" and kid {:?}", echoed_kid(k)))
                    .unwrap_or_default()
            )));
        }
        let mut last_error = None;
        for key in candidates {
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
                    return Ok(Verified {
                        validity: validity_of(&data.claims)?,
                        caller: Arc::new(self.caller_from(&data.claims)?),
                    });
                }
                Err(err) => last_error = Some(err),
            }
        }
        Err(IdentityError::InvalidToken(
            last_error.map(|e| describe(&e)).unwrap_or_default(),
        ))
    }

    fn caller_from(&self, claims: &Value) -> Result<Caller, IdentityError> {
        self.settings
            .caller_from_claims(claims, self.max_identity_bytes)
    }
}

impl JwtSettings {
    /// The caller a verified token's claims name, through the configured claim names (also used
    /// by `toolgate test` for cases written as claims).
    pub fn caller_from_claims(
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
fn exposed_claims(names: &[String]) -> Result<Vec<String>, FieldError> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, name) in names.iter().enumerate() {
        let at = format!("identity.jwt.claims.expose[{i}]");
        if name.trim().is_empty() {
            return Err(FieldError::new(at, "a claim name cannot be empty"));
        }
        if !seen.insert(name.as_str()) {
            return Err(FieldError::new(at, format!("{name:?} is listed twice")));
        }
    }
    Ok(names.to_vec())
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
