//! How callers are identified: dev identity or JWTs.

use super::*;

/// How callers are identified.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawIdentity {
    /// Trust the unauthenticated x-toolgate-* metadata headers. For development only; cannot be
    /// combined with `jwt`, and refused on a non-loopback TCP listener unless
    /// `allow_unauthenticated_network_callers` is set.
    #[serde(default)]
    pub dev_identity: bool,
    /// DANGEROUS: with dev identity, also accept callers on a non-loopback TCP listener, so
    /// anyone who can reach the port can claim any tenant, subject and scopes.
    #[serde(default)]
    pub allow_unauthenticated_network_callers: bool,
    /// Verify `authorization: Bearer <JWT>`.
    pub jwt: Option<RawJwt>,
    /// Tenants whose admins (scope `toolgate:admin`) are the platform's operators: in the
    /// Controls service they set, list and clear emergency denies on every tenant and for every
    /// tenant. Any other tenant's admin acts on its own tenant's denies only. Name tenants no
    /// customer can be given.
    #[serde(default)]
    pub platform_tenants: Vec<String>,
}

/// JWT verification settings. Exactly one key source is required.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawJwt {
    /// File holding the HS256 shared secret (relative paths are relative to this file).
    pub hs256_secret_file: Option<String>,
    /// Environment variable holding the HS256 shared secret.
    pub hs256_secret_env: Option<String>,
    /// PEM public keys (RSA for RS256, P-256 for ES256).
    #[serde(default)]
    pub public_key_files: Vec<String>,
    /// A JWKS file of public keys, selected by `kid`.
    pub jwks_file: Option<String>,
    /// Required `iss` value(s).
    #[serde(default)]
    pub issuer: Vec<String>,
    /// Required `aud` value(s).
    #[serde(default)]
    pub audience: Vec<String>,
    /// Clock skew tolerated for `exp` and `nbf` (default 30s).
    pub leeway: Option<String>,
    /// Which claims carry the caller's identity.
    #[serde(default)]
    pub claims: RawClaims,
}

/// Claim names mapped to the caller's identity.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawClaims {
    /// Claim holding the tenant (default `tenant`); required in every token.
    pub tenant: Option<String>,
    /// Claim holding the subject (default `sub`).
    pub subject: Option<String>,
    /// Claim holding the agent (default `agent`).
    pub agent: Option<String>,
    /// Claim holding scopes, space separated or an array (default `scope`).
    pub scopes: Option<String>,
    /// Further claims that conditions may read as `caller.claims.<name>`: only these (none
    /// unless listed), and only from a verified token (docs/conditions.md).
    #[serde(default)]
    pub expose: Vec<String>,
}
