//! The console as an OpenID Connect client of the company's identity provider: the
//! authorization code flow with PKCE (S256), `state` and `nonce`. The issuer's endpoints come
//! from its discovery document (which must name the configured issuer); the ID token is
//! verified by `identity` with the keys and claims mapping of `identity.jwt` for that issuer,
//! its audience the console's client id, so an approver is mapped exactly as a caller with a
//! token of that issuer would be.

use std::{sync::Arc, time::Duration};

use serde_json::Value;
use url::Url;

use crate::{
    clock::SharedClock,
    identity::{Caller, IdentityError, IdentityHandle},
    outbound::{BodyError, failure_in_words, issuer_client, read_capped},
    settings::{OidcClient, check_secure_url},
};

/// Why a sign-in through the issuer did not happen. Each is shown to the person as a page.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// The issuer could not be reached, or answered nonsense.
    #[error("the identity provider at {issuer} cannot be reached: {why}")]
    Unreachable { issuer: String, why: String },
    /// The issuer refused the sign-in (the person declined, the code was used, ...).
    #[error("the identity provider refused the sign-in: {0}")]
    Refused(String),
    /// The ID token does not name a person this sidecar accepts.
    #[error("the identity provider's ID token was not accepted: {0}")]
    Token(String),
}

/// The endpoints the issuer's discovery document names.
#[derive(Debug, Clone)]
struct Endpoints {
    authorization: Url,
    token: Url,
    /// When they were read (Unix ms); read again after [`REDISCOVER_MS`].
    read_ms: i64,
}

/// How long discovered endpoints are used before they are read again.
const REDISCOVER_MS: i64 = 3600 * 1000;
/// The largest discovery document or token response read.
const MAX_RESPONSE: usize = 256 * 1024;

pub struct Provider {
    settings: OidcClient,
    http: reqwest::Client,
    clock: SharedClock,
    identity: IdentityHandle,
    endpoints: tokio::sync::Mutex<Discovered>,
}

/// What discovery last found: the endpoints, or why not and when (a failure is given again for
/// [`RETRY_DISCOVERY_MS`], so sign-ins while the issuer is down do not queue a fetch each).
#[derive(Default)]
struct Discovered {
    endpoints: Option<Endpoints>,
    failed: Option<(i64, String)>,
}

/// How long a failed discovery is answered from memory.
const RETRY_DISCOVERY_MS: i64 = 5_000;

impl Provider {
    pub fn new(
        settings: OidcClient,
        identity: IdentityHandle,
        clock: SharedClock,
    ) -> Result<Self, String> {
        let http = issuer_client(&format!("issuer {}", settings.issuer), settings.timeout)?;
        Ok(Provider {
            settings,
            http,
            clock,
            identity,
            endpoints: tokio::sync::Mutex::new(Discovered::default()),
        })
    }

    /// The issuer, as people are told where they sign in.
    pub fn issuer(&self) -> &Url {
        &self.settings.issuer
    }

    fn unreachable(&self, why: impl Into<String>) -> OidcError {
        OidcError::Unreachable {
            issuer: self.settings.issuer.to_string(),
            why: why.into(),
        }
    }

    /// Where to send the person's browser to sign in.
    pub async fn authorization_url(
        &self,
        redirect_uri: &str,
        state: &str,
        nonce: &str,
        challenge: &str,
    ) -> Result<Url, OidcError> {
        let mut url = self.endpoints().await?.authorization;
        let scope = std::iter::once("openid")
            .chain(self.settings.scopes.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.settings.client_id)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("scope", &scope)
            .append_pair("state", state)
            .append_pair("nonce", nonce)
            .append_pair("code_challenge", challenge)
            .append_pair("code_challenge_method", "S256");
        Ok(url)
    }

    /// Exchanges the code the issuer sent back for the person it names: the ID token verified
    /// (signature, issuer, audience, lifetime) and its `nonce` the one this sign-in sent.
    pub async fn sign_in(
        &self,
        code: &str,
        verifier: &str,
        redirect_uri: &str,
        nonce: &str,
    ) -> Result<Arc<Caller>, OidcError> {
        let endpoints = self.endpoints().await?;
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect_uri),
            ("code_verifier", verifier),
        ];
        let mut request = self
            .http
            .post(endpoints.token.clone())
            .header(reqwest::header::ACCEPT, "application/json");
        match &self.settings.client_secret {
            Some(secret) => {
                request = request.basic_auth(
                    form_encode(&self.settings.client_id),
                    Some(form_encode(secret.expose())),
                );
            }
            None => form.push(("client_id", &self.settings.client_id)),
        }
        let body = form
            .iter()
            .map(|(k, v)| format!("{k}={}", form_encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let response = request
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .send()
            .await
            .map_err(|err| self.unreachable(failure_in_words(&err)))?;
        let status = response.status();
        if !status.is_success() {
            // The error code only: an issuer's description may carry what it should not. A
            // failing issuer may not answer JSON at all.
            let answer = self.json(response).await.unwrap_or(Value::Null);
            let error = answer
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("no error code");
            return Err(match status.is_client_error() {
                true => OidcError::Refused(format!(
                    "its token endpoint answered {} ({})",
                    status.as_u16(),
                    short(error)
                )),
                false => {
                    self.unreachable(format!("its token endpoint answered {}", status.as_u16()))
                }
            });
        }
        let answer = self.json(response).await?;
        let id_token = answer
            .get("id_token")
            .and_then(Value::as_str)
            .ok_or_else(|| OidcError::Token("the token response holds no id_token".into()))?;
        let caller = self.verify(id_token).await?;
        // Verified above: the claims are the issuer's.
        let claims = jsonwebtoken::dangerous::insecure_decode_claims::<Value>(id_token)
            .map_err(|err| OidcError::Token(format!("unreadable claims ({err})")))?;
        // This issuer's, not another one identity.jwt trusts with the same client id.
        let iss = claims
            .get("iss")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if iss.trim_end_matches('/') != self.settings.issuer.as_str().trim_end_matches('/') {
            return Err(OidcError::Token(format!(
                "its issuer {:?} is not the console's",
                short(iss)
            )));
        }
        if claims.get("nonce").and_then(Value::as_str) != Some(nonce) {
            return Err(OidcError::Token(
                "its nonce is not the one this sign-in sent (a replayed token?)".into(),
            ));
        }
        Ok(caller)
    }

    /// The ID token verified as identity.jwt verifies a token of that issuer, with the
    /// console's client id as its audience; once more after fetching the issuer's keys when it
    /// names a key not yet fetched.
    async fn verify(&self, id_token: &str) -> Result<Arc<Caller>, OidcError> {
        let attempt = || {
            let identity = self.identity.load();
            let verifier = identity.console_verifier().ok_or_else(|| {
                OidcError::Token("identity.jwt no longer trusts an issuer for the console".into())
            })?;
            let verified = verifier.verify(id_token);
            let refetch = match &verified {
                Err(
                    IdentityError::NoKey(_)
                    | IdentityError::KeysUnavailable(_)
                    | IdentityError::SignatureMismatch(_),
                ) => verifier.remote_keys_for(id_token).cloned(),
                _ => None,
            };
            Ok::<_, OidcError>((verified, refetch))
        };
        let (verified, refetch) = attempt()?;
        let verified = match (verified, refetch) {
            (Err(_), Some(keys)) if keys.refetch_allowed() => {
                keys.refetch_for_unknown_key().await;
                attempt()?.0
            }
            (verified, _) => verified,
        };
        verified.map_err(|err| OidcError::Token(err.to_string()))
    }

    /// The issuer's endpoints, read from its discovery document when not yet read or read over
    /// an hour ago (one reader at a time; a failure is tried again by the next sign-in).
    async fn endpoints(&self) -> Result<Endpoints, OidcError> {
        let mut cached = self.endpoints.lock().await;
        let now = self.clock.unix_ms();
        if let Some(endpoints) = cached.endpoints.as_ref()
            && now - endpoints.read_ms < REDISCOVER_MS
        {
            return Ok(endpoints.clone());
        }
        if let Some((at, why)) = &cached.failed
            && now - at < RETRY_DISCOVERY_MS
        {
            return Err(self.unreachable(why.clone()));
        }
        let found = self.discover(now).await;
        match &found {
            Ok(endpoints) => {
                *cached = Discovered {
                    endpoints: Some(endpoints.clone()),
                    failed: None,
                }
            }
            Err(OidcError::Unreachable { why, .. }) => cached.failed = Some((now, why.clone())),
            Err(_) => {}
        }
        found
    }

    /// Reads the issuer's discovery document.
    async fn discover(&self, now: i64) -> Result<Endpoints, OidcError> {
        let base = self.settings.issuer.as_str().trim_end_matches('/');
        let at = format!("{base}/.well-known/openid-configuration");
        let response = self
            .http
            .get(&at)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|err| self.unreachable(failure_in_words(&err)))?;
        if !response.status().is_success() {
            return Err(self.unreachable(format!("{at} answered {}", response.status().as_u16())));
        }
        let document = self.json(response).await?;
        let named = document.get("issuer").and_then(Value::as_str);
        if named.map(|n| n.trim_end_matches('/')) != Some(base) {
            return Err(self.unreachable(format!(
                "{at} names issuer {:?}, not this one",
                short(named.unwrap_or("(none)"))
            )));
        }
        let endpoint = |name: &str| {
            let text = document
                .get(name)
                .and_then(Value::as_str)
                .ok_or_else(|| self.unreachable(format!("{at} names no {name}")))?;
            check_secure_url(text, name).map_err(|err| self.unreachable(err.message))
        };
        Ok(Endpoints {
            authorization: endpoint("authorization_endpoint")?,
            token: endpoint("token_endpoint")?,
            read_ms: now,
        })
    }

    async fn json(&self, response: reqwest::Response) -> Result<Value, OidcError> {
        let body = tokio::time::timeout(self.settings.timeout, read_capped(response, MAX_RESPONSE))
            .await
            .map_err(|_| self.unreachable("it did not finish answering in time"))?
            .map_err(|err| match err {
                BodyError::TooLarge(max) => self.unreachable(format!("an answer over {max} bytes")),
                BodyError::Read(err) => self.unreachable(failure_in_words(&err)),
            })?;
        serde_json::from_slice(&body).map_err(|_| self.unreachable("an answer that is not JSON"))
    }
}

/// `application/x-www-form-urlencoded` (also how RFC 6749 §2.3.1 encodes Basic credentials).
fn form_encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// At most 64 characters of an issuer's text.
fn short(text: &str) -> String {
    text.chars().take(64).collect()
}

/// How long a sign-in may take between leaving for the issuer and coming back.
pub const LOGIN_TTL: Duration = Duration::from_secs(600);
