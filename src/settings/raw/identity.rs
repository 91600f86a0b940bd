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
    /// Verify `authorization: Bearer <JWT>`: one issuer's settings, or a list of issuers (each
    /// with its own keys and claim mapping; a token is verified by the one its `iss` names).
    #[serde(default, deserialize_with = "one_or_many")]
    #[schemars(with = "Option<OneOrMany<RawJwt>>")]
    pub jwt: Vec<RawJwt>,
    /// Tenants whose admins (scope `toolgate:admin`) are the platform's operators: in the
    /// Controls service they set, list and clear emergency denies on every tenant and for every
    /// tenant. Any other tenant's admin acts on its own tenant's denies only. Name tenants no
    /// customer can be given.
    #[serde(default)]
    pub platform_tenants: Vec<String>,
    /// Delegation tokens (docs/handoff.md): the key this sidecar signs its handoffs with, and
    /// the fleet's public keys it accepts sub-agents' delegations under.
    pub delegation: Option<RawDelegation>,
}

/// Delegation tokens: signed (ES256) when a handoff tool's call is made, verified when a
/// sub-agent calls with one.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawDelegation {
    /// The tokens' `iss` (default `toolgate`): every sidecar of a fleet names the same.
    pub issuer: Option<String>,
    /// EC P-256 private key (PEM) this sidecar signs its handoffs' tokens with; without one,
    /// its handoff tools are refused.
    pub signing_key_file: Option<String>,
    /// EC P-256 public keys (PEM) of the fleet: a delegation signed by one of them is accepted.
    /// A sidecar that receives its own handoffs lists its own public key here too.
    #[serde(default)]
    pub verify_key_files: Vec<String>,
    /// Longest a token lives (default 15m); a handoff's timeout and the parent call's deadline
    /// shorten it.
    pub max_ttl: Option<String>,
}

/// One value, or a list of them.
#[derive(JsonSchema)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

/// A mapping (one item) or a sequence (several), each item with its own fields' errors (an
/// untagged enum would say only that neither shape matched).
fn one_or_many<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    struct Shape<T>(std::marker::PhantomData<T>);
    impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Shape<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a mapping or a list of mappings")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(|one| vec![one])
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            Vec::<T>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
    }
    deserializer.deserialize_any(Shape(std::marker::PhantomData))
}

/// One issuer's JWT verification settings. At least one key source is required.
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
    /// Keys fetched from the issuer (its JWKS URL, or found through its OpenID configuration),
    /// refreshed on a schedule and when a token names a key not seen yet.
    pub jwks: Option<RawRemoteJwks>,
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

/// Where and how an issuer's published keys are fetched (docs/identity.md).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawRemoteJwks {
    /// The JWKS document's URL. `https`, or `http` on a loopback address.
    pub url: Option<String>,
    /// The issuer's URL instead: `{discover}/.well-known/openid-configuration` names the JWKS
    /// URL, and its `issuer` must be this URL.
    pub discover: Option<String>,
    /// How often the keys are fetched again (default 10m).
    pub refresh: Option<String>,
    /// Least time between fetches that a token naming an unknown `kid` causes (default 30s).
    pub min_refresh_interval: Option<String>,
    /// How long the last good keys keep verifying tokens while the issuer cannot be reached
    /// (default 24h); past it, this issuer's tokens are refused until a fetch succeeds.
    pub keep_last_good: Option<String>,
    /// Each request's time limit (default 5s).
    pub timeout: Option<String>,
    /// Largest document accepted, in bytes (default 256 KiB).
    pub max_bytes: Option<usize>,
}
