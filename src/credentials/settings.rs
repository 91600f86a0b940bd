//! `credentials:` of an upstream or an MCP server, validated once at load.

use std::{path::Path, time::Duration};

use jsonwebtoken::{Algorithm, EncodingKey};
use url::Url;

use crate::settings::{
    FieldError, check_secure_url, parse_duration,
    raw::{RawCredentials, RawTokenGrant},
    read_file, resolve_path,
};

/// How the sidecar authenticates each call to one backend.
#[derive(Clone, Debug)]
pub enum CredentialSpec {
    /// RFC 8693: the caller's verified token exchanged for one for this backend.
    TokenExchange(Grant),
    /// The sidecar's own short-lived token (RFC 6749 §4.4), shared by every caller.
    ClientCredentials(Grant),
    /// The caller's own token, only when it names this audience (`aud`).
    PassThrough { audience: String },
}

impl CredentialSpec {
    /// What `toolgate explain`, spans and audit events call it.
    pub fn kind(&self) -> &'static str {
        match self {
            CredentialSpec::TokenExchange(_) => "token_exchange",
            CredentialSpec::ClientCredentials(_) => "client_credentials",
            CredentialSpec::PassThrough { .. } => "pass_through",
        }
    }

    /// The audience the credential is for, as configured.
    pub fn audience(&self) -> Option<&str> {
        match self {
            CredentialSpec::TokenExchange(grant) | CredentialSpec::ClientCredentials(grant) => {
                grant.audience.as_deref().or(grant.resource.as_deref())
            }
            CredentialSpec::PassThrough { audience } => Some(audience),
        }
    }
}

/// A grant at the operator's token endpoint.
#[derive(Clone, Debug)]
pub struct Grant {
    pub token_endpoint: Url,
    pub client_id: String,
    pub client_auth: ClientAuth,
    pub audience: Option<String>,
    pub resource: Option<String>,
    pub scope: Option<String>,
    /// The sidecar's own workload token, sent as `actor_token`; read at each exchange (a
    /// projected service-account token is rewritten as it rotates).
    pub actor_token_file: Option<std::path::PathBuf>,
    pub timeout: Duration,
}

/// How the sidecar proves it is the client. Its `Debug` names the method, never the secret.
#[derive(Clone)]
pub enum ClientAuth {
    /// `client_secret_basic`.
    Secret(String),
    /// `private_key_jwt` (RFC 7523): a short assertion signed with this key.
    PrivateKeyJwt {
        key: EncodingKey,
        algorithm: Algorithm,
        kid: Option<String>,
    },
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientAuth::Secret(_) => f.write_str("client_secret_basic"),
            ClientAuth::PrivateKeyJwt { algorithm, kid, .. } => {
                write!(f, "private_key_jwt({algorithm:?}, kid {kid:?})")
            }
        }
    }
}

/// Largest answer read from a token endpoint.
pub const MAX_TOKEN_RESPONSE_BYTES: usize = 64 * 1024;

impl CredentialSpec {
    /// `at` names the field, e.g. `upstreams.tickets.credentials`.
    pub fn build(raw: &RawCredentials, at: &str, base_dir: &Path) -> Result<Self, FieldError> {
        match (
            &raw.token_exchange,
            &raw.client_credentials,
            &raw.pass_through,
        ) {
            (Some(grant), None, None) => Ok(CredentialSpec::TokenExchange(Grant::build(
                grant,
                &format!("{at}.token_exchange"),
                base_dir,
                true,
            )?)),
            (None, Some(grant), None) => Ok(CredentialSpec::ClientCredentials(Grant::build(
                grant,
                &format!("{at}.client_credentials"),
                base_dir,
                false,
            )?)),
            (None, None, Some(pass)) => {
                if pass.audience.trim().is_empty() {
                    return Err(FieldError::new(
                        format!("{at}.pass_through.audience"),
                        "name the audience the caller's token must be for: a token minted for the sidecar is never passed on",
                    ));
                }
                Ok(CredentialSpec::PassThrough {
                    audience: pass.audience.clone(),
                })
            }
            _ => Err(FieldError::new(
                at,
                "set exactly one of token_exchange, client_credentials or pass_through",
            )),
        }
    }
}

impl Grant {
    fn build(
        raw: &RawTokenGrant,
        at: &str,
        base_dir: &Path,
        exchange: bool,
    ) -> Result<Self, FieldError> {
        let token_endpoint =
            check_secure_url(&raw.token_endpoint, &format!("{at}.token_endpoint"))?;
        if raw.client_id.trim().is_empty() {
            return Err(FieldError::new(
                format!("{at}.client_id"),
                "cannot be empty",
            ));
        }
        let read = |field: &str, file: &str| read_file(base_dir, file, &format!("{at}.{field}"));
        let client_auth = match (&raw.client_secret_file, &raw.client_key_file) {
            (Some(file), None) => {
                let secret = read("client_secret_file", file)?;
                let secret = String::from_utf8(secret)
                    .map_err(|_| {
                        FieldError::new(format!("{at}.client_secret_file"), "is not UTF-8 text")
                    })?
                    .trim()
                    .to_owned();
                if secret.is_empty() {
                    return Err(FieldError::new(
                        format!("{at}.client_secret_file"),
                        "the file is empty",
                    ));
                }
                ClientAuth::Secret(secret)
            }
            (None, Some(file)) => {
                let pem = read("client_key_file", file)?;
                let (key, algorithm) = if let Ok(key) = EncodingKey::from_rsa_pem(&pem) {
                    (key, Algorithm::RS256)
                } else if let Ok(key) = EncodingKey::from_ec_pem(&pem) {
                    (key, Algorithm::ES256)
                } else {
                    return Err(FieldError::new(
                        format!("{at}.client_key_file"),
                        format!("{file} is not an RSA or P-256 private key in PEM form"),
                    ));
                };
                ClientAuth::PrivateKeyJwt {
                    key,
                    algorithm,
                    kid: raw.client_key_id.clone(),
                }
            }
            _ => {
                return Err(FieldError::new(
                    at,
                    "set exactly one of client_secret_file (client_secret_basic) or client_key_file (private_key_jwt)",
                ));
            }
        };
        if raw.client_key_id.is_some() && raw.client_key_file.is_none() {
            return Err(FieldError::new(
                format!("{at}.client_key_id"),
                "only means something with client_key_file",
            ));
        }
        if let Some(file) = &raw.actor_token_file {
            // Read at each exchange; checked here so a wrong path fails the load, not the calls.
            read("actor_token_file", file)?;
        }
        if raw.actor_token_file.is_some() && !exchange {
            return Err(FieldError::new(
                format!("{at}.actor_token_file"),
                "only a token exchange sends an actor token",
            ));
        }
        if exchange && raw.audience.is_none() && raw.resource.is_none() {
            return Err(FieldError::new(
                at,
                "name the backend the exchanged token is for: audience and/or resource",
            ));
        }
        let timeout = match &raw.timeout {
            Some(text) => parse_duration(text)
                .map_err(|err| FieldError::new(format!("{at}.timeout"), err.to_string()))?,
            None => Duration::from_secs(5),
        };
        Ok(Grant {
            token_endpoint,
            client_id: raw.client_id.clone(),
            client_auth,
            audience: raw.audience.clone(),
            resource: raw.resource.clone(),
            scope: raw.scope.clone(),
            actor_token_file: raw
                .actor_token_file
                .as_ref()
                .map(|file| resolve_path(base_dir, file)),
            timeout,
        })
    }
}
