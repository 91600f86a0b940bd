//! Where the sidecar listens: the gRPC server, the MCP door and the approvals console.

use super::*;

/// Listen addresses and shutdown behaviour.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// TCP address to serve gRPC on (default 127.0.0.1:50051); an empty string disables TCP.
    pub listen: Option<String>,
    /// Optional Unix domain socket path to serve gRPC on as well.
    pub unix_socket: Option<String>,
    /// How long in-flight calls may take to finish after SIGTERM (default 10s).
    pub shutdown_grace: Option<String>,
    /// How often the catalog file is checked for changes (default 5s). SIGHUP reloads at once.
    pub reload_interval: Option<String>,
    /// HTTP address for /metrics, /healthz and /readyz (default: off).
    pub admin_listen: Option<String>,
    /// The MCP door: the same tools, served to MCP hosts over Streamable HTTP (default: off).
    pub mcp: Option<RawMcpDoor>,
    /// The approvals console: web pages where approvers sign in and decide (default: off).
    pub console: Option<RawConsole>,
}

/// The approvals console (docs/console.md), on a listener of its own.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawConsole {
    /// TCP address to serve the console on (default 127.0.0.1:8766).
    pub listen: Option<String>,
    /// The URL people open the console at, an origin without a path (default http://{listen}).
    /// Form posts must come from it; the MCP door's approvals_url defaults to
    /// {public_url}/approvals/{approval_id}. https off loopback.
    pub public_url: Option<String>,
    /// How long a sign-in lasts (default 30m, at most 12h).
    pub session_ttl: Option<String>,
    /// File holding the key (at least 32 bytes) that signs session cookies; default: a random
    /// key per process (sessions then end with it and reach only this replica).
    pub session_key_file: Option<String>,
    /// Environment variable holding that key.
    pub session_key_env: Option<String>,
    /// Sign-in with the company's OpenID Connect provider (authorization code flow with PKCE).
    pub oidc: Option<RawConsoleOidc>,
    /// Development only: a sign-in form that takes any tenant, subject and scopes, like
    /// identity.dev_identity's headers (default false). Needs dev_identity and a loopback
    /// listen address; cannot be combined with oidc.
    #[serde(default)]
    pub dev_sign_in: bool,
}

/// The console's OpenID Connect client.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawConsoleOidc {
    /// The issuer's URL: `{issuer}/.well-known/openid-configuration` names its endpoints. It must
    /// be one identity.jwt trusts: that issuer's keys verify the ID token and its claims mapping
    /// makes the approver (tenant, subject, scopes).
    pub issuer: String,
    /// The console's client id at the issuer (the audience of its ID tokens).
    pub client_id: String,
    /// File holding the client secret (client_secret_basic); without one the console is a public
    /// client (PKCE only).
    pub client_secret_file: Option<String>,
    /// Environment variable holding the client secret.
    pub client_secret_env: Option<String>,
    /// Scopes asked for besides openid; without any, only openid is asked for.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Each request to the issuer's time limit (default 5s).
    pub timeout: Option<String>,
}

/// The MCP door (MCP's Streamable HTTP transport), an OAuth 2.1 resource server.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawMcpDoor {
    /// TCP address to serve MCP on (default 127.0.0.1:8765).
    pub listen: Option<String>,
    /// The path of the MCP endpoint (default /mcp).
    pub path: Option<String>,
    /// This resource's canonical URI (RFC 8707, RFC 9728): the audience the door's tokens must
    /// name. Required with identity.jwt on a non-loopback address; otherwise http://{listen}{path}.
    pub resource: Option<String>,
    /// Authorization servers named in /.well-known/oauth-protected-resource.
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    /// Scopes named in the protected-resource metadata (default: required_scopes).
    #[serde(default)]
    pub scopes_supported: Vec<String>,
    /// Scopes every request to the door needs; a token without them gets 403 insufficient_scope.
    #[serde(default)]
    pub required_scopes: Vec<String>,
    /// Host header values accepted (DNS-rebinding protection; default: localhost, 127.0.0.1, ::1).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Origin header values accepted, with scheme (e.g. https://app.example.com:443); a request
    /// with any other Origin gets 403 (default: none accepted).
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// The deadline of a request that does not carry one (default 60s); a call is also bounded by
    /// its tool's timeout.
    pub request_timeout: Option<String>,
    /// Where a person decides an approval, shown to MCP hosts; `{approval_id}` is replaced.
    pub approvals_url: Option<String>,
    /// File holding the key (at least 32 bytes) that seals approval request state; default: a
    /// random key per process (a retry must then reach the same replica).
    pub request_state_key_file: Option<String>,
    /// Environment variable holding that key.
    pub request_state_key_env: Option<String>,
}
