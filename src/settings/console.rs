//! `server.console`: the approvals console's settings, validated into typed values.

use std::{fmt, net::SocketAddr, path::Path, time::Duration};

use url::Url;

use super::{
    Env, FieldError, check_secure_url, is_loopback, is_loopback_host, opt_duration,
    raw::{RawConsole, RawConsoleOidc},
    secret_bytes,
};

/// The console: where it listens, how people sign in, how long a sign-in lasts.
#[derive(Clone)]
pub struct ConsoleConfig {
    pub listen: SocketAddr,
    /// The origin people open it at, when configured; otherwise the address bound.
    pub public_url: Option<Url>,
    pub session_ttl: Duration,
    /// The key signing session cookies; `None`: a random key per process.
    pub session_key: Option<Vec<u8>>,
    pub sign_in: SignIn,
}

/// How a person signs in to the console.
#[derive(Clone)]
pub enum SignIn {
    /// The company's OpenID Connect provider.
    Oidc(OidcClient),
    /// Development: a form taking any tenant, subject and scopes.
    Dev,
}

/// The console's OpenID Connect client settings.
#[derive(Clone)]
pub struct OidcClient {
    pub issuer: Url,
    pub client_id: String,
    /// `None`: a public client (PKCE only).
    pub client_secret: Option<super::Secret>,
    /// Asked for besides `openid`.
    pub scopes: Vec<String>,
    pub timeout: Duration,
}

impl fmt::Debug for ConsoleConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key or the client secret.
        f.debug_struct("ConsoleConfig")
            .field("listen", &self.listen)
            .field("public_url", &self.public_url.as_ref().map(Url::as_str))
            .field("session_key", &self.session_key.is_some())
            .finish_non_exhaustive()
    }
}

/// The shortest session key accepted (HMAC-SHA256).
const MIN_KEY_BYTES: usize = 32;
/// The longest sign-in: a console session is for deciding, not for the day.
const MAX_SESSION: Duration = Duration::from_secs(12 * 3600);

pub fn build(
    raw: &RawConsole,
    jwt_configured: bool,
    dev_identity: bool,
    base_dir: &Path,
    env: &Env,
) -> Result<ConsoleConfig, FieldError> {
    let listen = match raw.listen.as_deref() {
        None => SocketAddr::from(([127, 0, 0, 1], 8766)),
        Some(addr) => addr.parse().map_err(|err| {
            FieldError::new(
                "server.console.listen",
                format!("invalid address {addr:?}: {err}"),
            )
        })?,
    };
    let public_url = raw
        .public_url
        .as_deref()
        .map(|text| public_url(text, listen))
        .transpose()?;
    if public_url.is_none() && !is_loopback(listen.ip()) {
        return Err(FieldError::new(
            "server.console.public_url",
            "required on a non-loopback address: the https origin people open the console at (session cookies are Secure there)",
        ));
    }
    let session_ttl = opt_duration(
        &raw.session_ttl,
        "server.console.session_ttl",
        Duration::from_secs(30 * 60),
    )?;
    if session_ttl > MAX_SESSION || session_ttl < Duration::from_secs(60) {
        return Err(FieldError::new(
            "server.console.session_ttl",
            "must be between 1m and 12h",
        ));
    }
    let session_key = secret_bytes(
        &raw.session_key_file,
        &raw.session_key_env,
        "server.console.session_key",
        base_dir,
        env,
    )?;
    if let Some((field, key)) = &session_key
        && key.len() < MIN_KEY_BYTES
    {
        return Err(FieldError::new(
            field.clone(),
            format!("the key must be at least {MIN_KEY_BYTES} bytes"),
        ));
    }
    let sign_in = match (&raw.oidc, raw.dev_sign_in) {
        (Some(_), true) => {
            return Err(FieldError::new(
                "server.console.dev_sign_in",
                "cannot be combined with oidc: choose one way to sign in",
            ));
        }
        (None, false) => {
            return Err(FieldError::new(
                "server.console",
                "no way to sign in: configure oidc (the company's identity provider), or dev_sign_in: true for development",
            ));
        }
        (None, true) => {
            if !dev_identity {
                return Err(FieldError::new(
                    "server.console.dev_sign_in",
                    "takes whatever name is typed in, so it needs identity.dev_identity: true (development only)",
                ));
            }
            if !is_loopback(listen.ip()) {
                return Err(FieldError::new(
                    "server.console.dev_sign_in",
                    "is served on a loopback listen address only: anyone who reaches it can be anyone",
                ));
            }
            SignIn::Dev
        }
        (Some(oidc), false) => SignIn::Oidc(oidc_client(oidc, jwt_configured, base_dir, env)?),
    };
    Ok(ConsoleConfig {
        listen,
        public_url,
        session_ttl,
        session_key: session_key.map(|(_, key)| key),
        sign_in,
    })
}

/// An origin: http(s), a host, no path, query or fragment; https unless on loopback.
fn public_url(text: &str, listen: SocketAddr) -> Result<Url, FieldError> {
    let at = "server.console.public_url";
    let url = Url::parse(text)
        .map_err(|err| FieldError::new(at, format!("invalid URL {text:?}: {err}")))?;
    if !matches!(url.scheme(), "http" | "https")
        || url.host().is_none()
        || url.path() != "/"
        || url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
    {
        return Err(FieldError::new(
            at,
            "must be an origin: http(s)://host[:port], with no path, query or credentials (the console is served at its root)",
        ));
    }
    if url.scheme() != "https" && !(is_loopback_host(&url) && is_loopback(listen.ip())) {
        return Err(FieldError::new(
            at,
            "must be https off loopback: session cookies must not travel in the clear",
        ));
    }
    Ok(url)
}

fn oidc_client(
    raw: &RawConsoleOidc,
    jwt_configured: bool,
    base_dir: &Path,
    env: &Env,
) -> Result<OidcClient, FieldError> {
    let at = "server.console.oidc";
    if !jwt_configured {
        return Err(FieldError::new(
            at,
            "needs identity.jwt trusting the same issuer: its keys verify the ID token and its claims mapping makes the approver",
        ));
    }
    let issuer = check_secure_url(&raw.issuer, &format!("{at}.issuer"))?;
    if raw.client_id.is_empty() {
        return Err(FieldError::new(
            format!("{at}.client_id"),
            "must not be empty",
        ));
    }
    let client_secret = secret_bytes(
        &raw.client_secret_file,
        &raw.client_secret_env,
        &format!("{at}.client_secret"),
        base_dir,
        env,
    )?
    .map(|(field, bytes)| {
        String::from_utf8(bytes)
            .map(super::Secret::new)
            .map_err(|_| FieldError::new(field, "the client secret is not UTF-8"))
    })
    .transpose()?;
    if let Some(scope) = raw
        .scopes
        .iter()
        .find(|s| s.is_empty() || s.contains(|c: char| c.is_whitespace() || c.is_control()))
    {
        return Err(FieldError::new(
            format!("{at}.scopes"),
            format!("{scope:?} is not a scope (no spaces, not empty)"),
        ));
    }
    Ok(OidcClient {
        issuer,
        client_id: raw.client_id.clone(),
        client_secret,
        scopes: raw
            .scopes
            .iter()
            .filter(|s| *s != "openid")
            .cloned()
            .collect(),
        timeout: opt_duration(
            &raw.timeout,
            &format!("{at}.timeout"),
            Duration::from_secs(5),
        )?,
    })
}
