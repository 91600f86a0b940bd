//! `server.mcp`: the MCP door's settings, validated into typed values.

use std::{fmt, net::SocketAddr, path::Path, time::Duration};

use super::{Env, FieldError, opt_duration, raw::RawMcpDoor, secret_bytes};

/// The MCP door: where it listens, what it tells OAuth clients, what it accepts.
#[derive(Clone)]
pub struct McpDoorConfig {
    pub listen: SocketAddr,
    /// The endpoint's path, `/mcp` by default.
    pub path: String,
    /// The canonical URI of this resource: the audience its tokens must name.
    pub resource: String,
    /// Whether `resource` was configured; if not, it is the address bound (`http://ADDR/path`),
    /// which the server settles once it has bound.
    pub resource_configured: bool,
    pub authorization_servers: Vec<String>,
    pub scopes_supported: Vec<String>,
    pub required_scopes: Vec<String>,
    pub allowed_hosts: Vec<String>,
    pub allowed_origins: Vec<String>,
    pub request_timeout: Duration,
    /// With `{approval_id}` to replace, when configured.
    pub approvals_url: Option<String>,
    /// The key sealing approval request state; `None`: a random key per process.
    pub request_state_key: Option<Vec<u8>>,
}

impl fmt::Debug for McpDoorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.debug_struct("McpDoorConfig")
            .field("listen", &self.listen)
            .field("path", &self.path)
            .field("resource", &self.resource)
            .field("request_state_key", &self.request_state_key.is_some())
            .finish_non_exhaustive()
    }
}

/// Hosts accepted when none are configured: the loopback names.
const LOOPBACK_HOSTS: [&str; 4] = ["localhost", "127.0.0.1", "::1", "[::1]"];

/// The shortest request-state key accepted (HMAC-SHA256).
const MIN_KEY_BYTES: usize = 32;

pub fn build(
    raw: &RawMcpDoor,
    jwt_configured: bool,
    base_dir: &Path,
    env: &Env,
) -> Result<McpDoorConfig, FieldError> {
    let listen = match raw.listen.as_deref() {
        None => SocketAddr::from(([127, 0, 0, 1], 8765)),
        Some(addr) => addr.parse().map_err(|err| {
            FieldError::new(
                "server.mcp.listen",
                format!("invalid address {addr:?}: {err}"),
            )
        })?,
    };
    let path = raw.path.clone().unwrap_or_else(|| "/mcp".to_owned());
    if !path.starts_with('/') || path.starts_with("/.well-known") || path.contains(['?', '#']) {
        return Err(FieldError::new(
            "server.mcp.path",
            format!("{path:?} is not a path of its own (start with /, no query, not /.well-known)"),
        ));
    }
    let resource = match &raw.resource {
        Some(resource) => {
            let url = url::Url::parse(resource).map_err(|err| {
                FieldError::new(
                    "server.mcp.resource",
                    format!("invalid URI {resource:?}: {err}"),
                )
            })?;
            // RFC 8707: an absolute URI without a fragment.
            if url.fragment().is_some() || !matches!(url.scheme(), "https" | "http") {
                return Err(FieldError::new(
                    "server.mcp.resource",
                    "must be an http(s) URI without a fragment",
                ));
            }
            resource.clone()
        }
        // Reachable from other hosts, the door's URI is one the operator knows (a Service's, an
        // ingress's), not its bind address: it must be named.
        None if jwt_configured && !super::is_loopback(listen.ip()) => {
            return Err(FieldError::new(
                "server.mcp.resource",
                "required with identity.jwt on a non-loopback address: the canonical URI hosts reach this door by, the audience its tokens must name (RFC 8707)",
            ));
        }
        // On loopback, hosts reach it by its address; tokens must name exactly that.
        None => format!("http://{listen}{path}"),
    };
    for (field, values) in [
        ("authorization_servers", &raw.authorization_servers),
        ("allowed_origins", &raw.allowed_origins),
    ] {
        for value in values {
            url::Url::parse(value).map_err(|err| {
                FieldError::new(
                    format!("server.mcp.{field}"),
                    format!("invalid URL {value:?}: {err}"),
                )
            })?;
        }
    }
    let allowed_hosts = match raw.allowed_hosts.is_empty() {
        true => LOOPBACK_HOSTS.iter().map(|h| (*h).to_owned()).collect(),
        false => raw.allowed_hosts.clone(),
    };
    let request_state_key = request_state_key(raw, base_dir, env)?;
    if let Some(url) = &raw.approvals_url {
        url::Url::parse(&url.replace("{approval_id}", "x")).map_err(|err| {
            FieldError::new(
                "server.mcp.approvals_url",
                format!("invalid URL {url:?}: {err}"),
            )
        })?;
    }
    let scopes_supported = match raw.scopes_supported.is_empty() {
        true => raw.required_scopes.clone(),
        false => raw.scopes_supported.clone(),
    };
    Ok(McpDoorConfig {
        listen,
        resource_configured: raw.resource.is_some(),
        path,
        resource,
        authorization_servers: raw.authorization_servers.clone(),
        scopes_supported,
        required_scopes: raw.required_scopes.clone(),
        allowed_hosts,
        allowed_origins: raw.allowed_origins.clone(),
        request_timeout: opt_duration(
            &raw.request_timeout,
            "server.mcp.request_timeout",
            Duration::from_secs(60),
        )?,
        approvals_url: raw.approvals_url.clone(),
        request_state_key,
    })
}

impl McpDoorConfig {
    /// The resource once the door is bound at `bound`: as configured, or that address.
    pub fn resource_at(&self, bound: SocketAddr) -> String {
        match self.resource_configured {
            true => self.resource.clone(),
            false => format!("http://{bound}{}", self.path),
        }
    }
}

fn request_state_key(
    raw: &RawMcpDoor,
    base_dir: &Path,
    env: &Env,
) -> Result<Option<Vec<u8>>, FieldError> {
    let Some((field, key)) = secret_bytes(
        &raw.request_state_key_file,
        &raw.request_state_key_env,
        "server.mcp.request_state_key",
        base_dir,
        env,
    )?
    else {
        return Ok(None);
    };
    if key.len() < MIN_KEY_BYTES {
        return Err(FieldError::new(
            field,
            format!("the key must be at least {MIN_KEY_BYTES} bytes"),
        ));
    }
    Ok(Some(key))
}
