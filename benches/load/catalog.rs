//! The bench catalog and the credentials its calls carry: the catalog every toolgate the harness
//! runs is given, its variants (state in Redis, a shadow candidate, audit off, the MCP door on),
//! the JWT secret it names and the tokens signed with it. Nothing here starts or measures
//! anything.

use std::{
    path::Path,
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::Context;
use tonic::metadata::{Ascii, MetadataValue};

/// The HS256 secret's environment variable, named by the catalog.
pub const SECRET_ENV: &str = "TOOLGATE_BENCH_JWT_SECRET";
pub const SECRET: &str = "toolgate-bench-hs256-secret-0123456789abcdef";

/// The catalog: one JWT-identified tenant and agent, `echo` behind every stage that can apply to
/// it (global deny list, agent allow list, a required scope, JSON Schema, a bound argument, tool
/// and tenant rate limits that never refuse, audit to a file), and a slow tool for the RSS test.
const CATALOG: &str = r#"version: 1
server:
  shutdown_grace: 2s
# The RSS step holds up to --slow-calls (at most 100,000) calls at once, 500 per connection, all
# of one tenant; the defaults (1,024 in flight, 256 of them a tenant's, 256 streams per
# connection) would refuse most of them.
limits:
  max_in_flight: 100000
  max_in_flight_per_tenant: 100000
  max_streams_per_connection: 1000
identity:
  jwt:
    hs256_secret_env: TOOLGATE_BENCH_JWT_SECRET
    issuer: ["https://issuer.bench"]
    audience: [toolgate]
audit:
  sink: file
  path: AUDIT_PATH
policy:
  deny: ["admin_*"]
tenants:
  acme:
    rate_limit: 100000000/s
  globex: {}
agents:
  support-bot:
    allow: ["echo", "slow"]
  "*":
    allow: ["*"]
tools:
  - name: echo
    description: Returns the given text unchanged.
    risk_level: read_only
    timeout: 5s
    required_scopes: ["tools:read"]
    rate_limit: 100000000/s
    executor: { builtin: echo }
    input_schema:
      type: object
      properties:
        text: { type: string, maxLength: 1048576, description: The text to return. }
        tenant: { type: string }
      required: [text, tenant]
      additionalProperties: false
    bind:
      tenant: "${caller.tenant}"
  - name: slow
    description: Sleeps for the given number of milliseconds.
    risk_level: read_only
    timeout: 60s
    executor: { builtin: slow_task }
    input_schema:
      type: object
      properties:
        ms: { type: integer, minimum: 0, maximum: 60000 }
      required: [ms]
      additionalProperties: false
  - name: admin_purge
    description: Denied to everyone by the global policy.
    risk_level: destructive
    executor: { builtin: delete_ticket }
    input_schema: { type: object }
"#;

/// The MCP door's path and resource (the audience its tokens name) in [`catalog_with_mcp`].
pub const MCP_PATH: &str = "/mcp";
pub const MCP_RESOURCE: &str = "http://127.0.0.1/mcp";

/// The bench catalog, auditing to the file `audit`.
pub fn catalog(audit: &Path) -> String {
    CATALOG.replace("AUDIT_PATH", &audit.display().to_string())
}

/// The bench catalog with its state in the Redis at `url`. The operation timeout is raised from
/// the default 50 ms: this row measures what sharing costs, not outages, on a saturated machine
/// where Redis competes with the load for the same cores.
pub fn catalog_with_redis(audit: &Path, url: &str) -> String {
    catalog(audit).replacen(
        "version: 1\n",
        &format!(
            "version: 1\nstate:\n  backend: redis\n  redis: {{ url: \"{url}\", timeout: 1s }}\n"
        ),
        1,
    )
}

/// The bench catalog with a shadow candidate.
pub fn catalog_with_shadow(audit: &Path, candidate: &Path) -> String {
    catalog(audit).replacen(
        "version: 1\n",
        &format!("version: 1\nshadow_catalog: {}\n", candidate.display()),
        1,
    )
}

/// The shadow candidate: the bench catalog with one deny rule narrowed, which changes no decision
/// the bench's calls get.
pub fn candidate_catalog(audit: &Path) -> String {
    let narrowed = catalog(audit).replace(r#"deny: ["admin_*"]"#, r#"deny: ["admin_purge"]"#);
    assert!(narrowed.contains("admin_purge\"]"));
    narrowed
}

/// The bench catalog with the MCP door on (`server.mcp`, on a port it picks and logs), so the
/// same tools, stages and identity are served over gRPC and over MCP by one catalog.
pub fn catalog_with_mcp(audit: &Path) -> String {
    let server = "server:\n  shutdown_grace: 2s\n";
    assert!(CATALOG.contains(server));
    catalog(audit).replacen(
        server,
        &format!(
            "{server}  mcp: {{ listen: \"127.0.0.1:0\", path: {MCP_PATH}, resource: \"{MCP_RESOURCE}\" }}\n"
        ),
        1,
    )
}

/// `yaml` (the bench catalog or a variant) with run-level flow rules that govern echo without
/// ever refusing it: echo carries the label `reads`, and the one rule denies `reads` after a
/// label no tool carries. So every call reads its run's scope and records its label.
pub fn catalog_with_flow(yaml: &str) -> String {
    let echo = "    executor: { builtin: echo }\n";
    assert!(yaml.contains(echo) && yaml.contains("\ntools:\n"));
    yaml.replacen(echo, &format!("{echo}    flow_labels: [reads]\n"), 1)
        .replacen(
            "\ntools:\n",
            "\nflow:\n  labels: [reads, never_seen]\n  rules:\n    - { name: bench, after: [never_seen], deny: [reads] }\ntools:\n",
            1,
        )
}

/// `yaml` with ten deny entries for echo in tenant acme, each with a CEL condition on the
/// arguments that never holds for the bench's calls.
pub fn catalog_with_conditions(yaml: &str) -> String {
    let acme = "  acme:\n    rate_limit: 100000000/s\n";
    assert!(yaml.contains(acme));
    let entries: String = (0..10)
        .map(|i| format!("      - {{ tools: [echo], when: \"args.text == 'blocked-{i}'\" }}\n"))
        .collect();
    yaml.replacen(acme, &format!("{acme}    deny:\n{entries}"), 1)
}

/// `yaml` with the output guard's secret detectors off.
pub fn catalog_without_output_guard(yaml: &str) -> String {
    yaml.replacen(
        "version: 1\n",
        "version: 1\noutput_guard: { secrets: off }\n",
        1,
    )
}

/// The bench catalog with audit switched off (`sink: none`), for the CPU split.
pub fn catalog_without_audit() -> String {
    let audit = "audit:\n  sink: file\n  path: AUDIT_PATH\n";
    assert!(CATALOG.contains(audit));
    CATALOG.replace(audit, "audit:\n  sink: none\n")
}

/// A JWT for tenant acme, agent support-bot, with the scope `echo` requires, for `audience`;
/// valid for a day. With `jti`, a token no other call used (so the sidecar has never verified
/// it).
fn token(audience: &str, jti: Option<u64>) -> anyhow::Result<String> {
    token_with_scope(audience, jti, "tools:read")
}

/// [`token`] with another scope.
fn token_with_scope(audience: &str, jti: Option<u64>, scope: &str) -> anyhow::Result<String> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let mut claims = serde_json::json!({
        "sub": "bench", "tenant": "acme", "agent": "support-bot", "scope": scope,
        "iss": "https://issuer.bench", "aud": audience, "exp": now + 86_400,
    });
    if let Some(jti) = jti {
        claims["jti"] = serde_json::json!(jti.to_string());
    }
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes())?;
    Ok(jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &key,
    )?)
}

/// The `authorization` value of [`token`]'s JWT for the gRPC door.
pub fn bearer(jti: Option<u64>) -> anyhow::Result<MetadataValue<Ascii>> {
    format!("Bearer {}", token("toolgate", jti)?)
        .parse()
        .context("a token is not metadata")
}

/// The `authorization` value of an operator's JWT for the gRPC door: the scope
/// `toolgate:admin`, which the emergency deny RPCs need.
pub fn admin_bearer() -> anyhow::Result<MetadataValue<Ascii>> {
    format!(
        "Bearer {}",
        token_with_scope("toolgate", None, "toolgate:admin")?
    )
    .parse()
    .context("a token is not metadata")
}

/// The `authorization` value of the same caller's JWT for the MCP door: the same claims, but
/// for the door's resource, the audience its tokens must name.
pub fn mcp_bearer() -> anyhow::Result<String> {
    Ok(format!("Bearer {}", token(MCP_RESOURCE, None)?))
}
