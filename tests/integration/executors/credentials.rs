//! Per-call credentials to upstreams (docs/executors.md#credentials), through real parts: the
//! `oidc-provider` IdP on loopback (tests/fixtures/idp) issues the people's tokens and exchanges
//! them (RFC 8693), and an upstream that verifies every token against the IdP's keys says whom
//! it saw. Two people reach the upstream as themselves, with the sidecar as the actor; an
//! exchanged token is reused until shortly before it expires; concurrent first calls share one
//! exchange; an endpoint that is down, slow, refusing or answering nonsense keeps the call from
//! the upstream with a clear, structured refusal; tokens never reach the model or the audit log.

use std::time::Duration;

use serde_json::{Value, json};
use toolgate::proto::{self, ToolStatus};

use crate::{
    executors::wait_for_tool,
    support::{
        START_UNIX_MS, TestServer, Who, call, execute_request,
        idp::{Idp, Whoami, WhoamiMcp},
    },
};

const AUDIENCE: &str = "https://tickets.test";
/// The MCP door's resource: the audience its callers' tokens name.
const MCP_RESOURCE: &str = "http://toolgate.test/mcp";

struct Setup {
    idp: Idp,
    upstream: Whoami,
    server: TestServer,
    _dir: tempfile::TempDir,
}

/// The IdP, the upstream, and a sidecar with three tools on it: `tickets` (token exchange with
/// the sidecar's workload token as actor), `tickets_as_sidecar` (client credentials) and
/// `tickets_passed_through` (the caller's own token, when it is for the upstream).
async fn setup() -> Setup {
    let idp = Idp::start().await;
    let upstream = Whoami::start(&idp, AUDIENCE).await;
    let dir = tempfile::tempdir().unwrap();
    let catalog = catalog(&idp, &upstream, dir.path()).await;
    let server = TestServer::start(&catalog).await;
    Setup {
        idp,
        upstream,
        server,
        _dir: dir,
    }
}

/// The grants the catalogs use: the client secret and the sidecar's workload token are written
/// to `dir`; `grant(extra)` is a grant for [`AUDIENCE`], `grant(&actor)` one with the workload
/// token as the actor.
async fn grants(idp: &Idp, dir: &std::path::Path) -> (impl Fn(&str) -> String, String) {
    let secret = dir.join("client-secret");
    std::fs::write(&secret, "toolgate-secret-0123456789abcdef\n").unwrap();
    let actor = dir.join("workload-token");
    let workload = idp
        .mint(json!({"sub": "system:serviceaccount:agents:support-bot",
                     "aud": idp.issuer, "exp": START_UNIX_MS / 1000 + 24 * 3600}))
        .await;
    std::fs::write(&actor, workload).unwrap();
    let endpoint = idp.token_endpoint();
    let grant = move |extra: &str| {
        format!(
            "{{ token_endpoint: \"{endpoint}\", client_id: toolgate, client_secret_file: \"{}\", audience: \"{AUDIENCE}\", scope: tickets:read, timeout: 1s{extra} }}",
            secret.display()
        )
    };
    (
        grant,
        format!(", actor_token_file: \"{}\"", actor.display()),
    )
}

/// The catalog [`setup`] serves; its client secret and workload token are written to `dir`.
async fn catalog(idp: &Idp, upstream: &Whoami, dir: &std::path::Path) -> String {
    let (grant, actor) = grants(idp, dir).await;
    // A client the IdP does not allow to exchange tokens: the sidecar's setup is wrong.
    let refused_secret = dir.join("refused-secret");
    std::fs::write(&refused_secret, "refused-secret-0123456789abcdef").unwrap();
    let misconfigured = grant("").replace(
        &format!(
            "client_id: toolgate, client_secret_file: \"{}\"",
            dir.join("client-secret").display()
        ),
        &format!(
            "client_id: refused-client, client_secret_file: \"{}\"",
            refused_secret.display()
        ),
    );
    assert!(misconfigured.contains("refused-client"));
    let upstream_at = |credentials: String| {
        format!(
            "    url: {}\n    allow_schemes: [http]\n    allow_private_addresses: true\n    credentials: {credentials}\n",
            upstream.url
        )
    };
    format!(
        r#"version: 1
server:
  mcp: {{ listen: "127.0.0.1:0", resource: "{MCP_RESOURCE}" }}
identity:
  jwt: {{ jwks: {{ url: "{issuer}/jwks" }}, issuer: ["{issuer}"], audience: [toolgate] }}
tenants: {{ acme: {{}} }}
upstreams:
  tickets:
{exchange}  tickets_sidecar:
{client}  tickets_own:
{pass}  tickets_misconfigured:
{misconfigured}tools:
  - {{ name: tickets, description: d, risk_level: read_only, timeout: 5s, executor: {{ http: {{ upstream: tickets, path: /whoami }} }}, input_schema: {{ type: object }} }}
  - {{ name: tickets_as_sidecar, description: d, risk_level: read_only, timeout: 5s, executor: {{ http: {{ upstream: tickets_sidecar, path: /whoami }} }}, input_schema: {{ type: object }} }}
  - {{ name: tickets_hurried, description: d, risk_level: write_draft, timeout: 300ms, executor: {{ http: {{ upstream: tickets, path: /whoami }} }}, input_schema: {{ type: object }} }}
  - {{ name: tickets_misconfigured, description: d, risk_level: read_only, timeout: 5s, executor: {{ http: {{ upstream: tickets_misconfigured, path: /whoami }} }}, input_schema: {{ type: object }} }}
  - {{ name: tickets_passed_through, description: d, risk_level: read_only, timeout: 5s, executor: {{ http: {{ upstream: tickets_own, path: /whoami }} }}, input_schema: {{ type: object }} }}
"#,
        issuer = idp.issuer,
        exchange = upstream_at(format!("{{ token_exchange: {} }}", grant(&actor))),
        client = upstream_at(format!("{{ client_credentials: {} }}", grant(""))),
        misconfigured = upstream_at(format!("{{ token_exchange: {misconfigured} }}")),
        pass = upstream_at(format!(
            "{{ pass_through: {{ audience: \"{AUDIENCE}\" }} }}"
        )),
    )
}

impl Setup {
    /// A person's token, valid for an hour on both clocks (the test server's and the IdP's).
    async fn person(&self, sub: &str) -> String {
        self.idp
            .mint(json!({"sub": sub, "tenant": "acme", "aud": "toolgate",
                         "exp": START_UNIX_MS / 1000 + 3600}))
            .await
    }

    async fn call(&self, tool: &str, token: &str) -> proto::ToolResult {
        let mut client = self.server.client().await;
        client
            .execute_tool(Who::token(token).request(execute_request(call(tool, "{}"))))
            .await
            .unwrap()
            .into_inner()
            .result
            .unwrap()
    }

    /// What the upstream saw, for a call that reached it.
    async fn seen_by_upstream(&self, tool: &str, token: &str) -> Value {
        let result = self.call(tool, token).await;
        assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
        assert!(
            !result.model_text.contains("eyJ"),
            "a token in model text: {}",
            result.model_text
        );
        serde_json::from_str(&result.model_text).unwrap()
    }

    async fn exchanges(&self) -> u64 {
        self.idp.stats().await["token"]["urn:ietf:params:oauth:grant-type:token-exchange"]
            .as_u64()
            .unwrap_or(0)
    }

    /// A call refused before the upstream was reached: its status, error type and message.
    async fn refused(&self, tool: &str, token: &str) -> proto::ToolResult {
        let before = self.upstream.seen().await.len();
        let result = self.call(tool, token).await;
        assert_ne!(result.status(), ToolStatus::Ok, "{result:?}");
        assert_eq!(
            self.upstream.seen().await.len(),
            before,
            "the upstream was called: {result:?}"
        );
        result
    }
}

#[tokio::test]
async fn each_person_reaches_the_upstream_as_themselves_with_the_agent_as_actor() {
    let s = setup().await;
    let alice = s.person("alice").await;
    let bob = s.person("bob").await;
    let saw_alice = s.seen_by_upstream("tickets", &alice).await;
    let saw_bob = s.seen_by_upstream("tickets", &bob).await;
    for (saw, who) in [(&saw_alice, "alice"), (&saw_bob, "bob")] {
        assert_eq!(saw["sub"], who, "{saw}");
        assert_eq!(saw["aud"], AUDIENCE, "{saw}");
        assert_eq!(saw["scope"], "tickets:read", "{saw}");
        assert_eq!(saw["tenant"], "acme", "{saw}");
        assert_eq!(
            saw["act"],
            json!({"sub": "system:serviceaccount:agents:support-bot"}),
            "{saw}"
        );
    }
    // The audit event names the credential the upstream was called with (its fingerprint is
    // the start of the SHA-256 the upstream computed), never the token.
    let event = s
        .server
        .wait_for_audit(|e| e["tool"] == "tickets" && e["credential"]["subject"] == "bob")
        .await;
    assert_eq!(
        event["credential"],
        json!({"kind": "token_exchange", "subject": "bob",
               "actor": "system:serviceaccount:agents:support-bot", "audience": AUDIENCE,
               "fingerprint": saw_bob["token_sha256"].as_str().unwrap()[..16]}),
        "{event}"
    );
    // Two people, two tokens, neither of them the caller's own.
    assert_ne!(saw_alice["token_sha256"], saw_bob["token_sha256"]);
    let own = hex_sha256(&alice);
    assert!(
        !s.upstream.seen().await.contains(&own),
        "the caller's own token was forwarded"
    );

    // The sidecar's own token (client credentials): the upstream sees the client, not a person.
    let saw = s.seen_by_upstream("tickets_as_sidecar", &alice).await;
    assert_eq!(
        (saw["sub"].as_str(), saw["act"].as_str()),
        (Some("toolgate"), None),
        "{saw}"
    );

    // Pass-through: only a token whose audience names the upstream is passed on.
    let refused = s.refused("tickets_passed_through", &alice).await;
    assert_eq!(
        (
            refused.status(),
            refused.error_type.as_str(),
            refused.retryable
        ),
        (ToolStatus::Denied, "credentials_refused", false),
        "{refused:?}"
    );
    assert!(
        refused.error_message.contains("its audience does not name"),
        "{refused:?}"
    );
    let for_both = s
        .idp
        .mint(
            json!({"sub": "carol", "tenant": "acme", "aud": ["toolgate", AUDIENCE],
                     "exp": START_UNIX_MS / 1000 + 3600}),
        )
        .await;
    let saw = s
        .seen_by_upstream("tickets_passed_through", &for_both)
        .await;
    assert_eq!(saw["token_sha256"], hex_sha256(&for_both));

    // Explain says which credential a call would use, and fetches none.
    let exchanges = s.exchanges().await;
    let explainer = s
        .idp
        .mint(
            json!({"sub": "frank", "tenant": "acme", "aud": "toolgate", "scope": "toolgate:explain",
                     "exp": START_UNIX_MS / 1000 + 3600}),
        )
        .await;
    let explained = s
        .server
        .client()
        .await
        .explain_tool(Who::token(&explainer).request(proto::ExplainToolRequest {
            call: Some(call("tickets", "{}")),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(explained.would_execute, "{explained:?}");
    let execute = explained.stages.last().unwrap();
    assert!(
        execute.detail.contains(&format!(
            "with a token_exchange credential for audience {AUDIENCE} for upstream tickets"
        )),
        "{execute:?}"
    );
    assert_eq!(
        s.exchanges().await,
        exchanges,
        "explain fetched a credential"
    );

    // No token in the audit log.
    let audit = std::fs::read_to_string(&s.server.audit_path).unwrap();
    assert!(!audit.contains("eyJ"), "a token in the audit log");
    s.server.stop().await;
}

#[tokio::test]
async fn one_exchange_per_person_until_it_nears_expiry_and_concurrent_first_calls_share_it() {
    let s = setup().await;
    let alice = s.person("alice").await;
    let before = s.exchanges().await;
    for _ in 0..3 {
        s.seen_by_upstream("tickets", &alice).await;
    }
    assert_eq!(
        s.exchanges().await,
        before + 1,
        "one exchange for three calls"
    );
    // The IdP's tokens live 300 s; past 270 s on the sidecar's clock, a new one is fetched.
    s.server.clock.advance(Duration::from_secs(271));
    s.seen_by_upstream("tickets", &alice).await;
    assert_eq!(s.exchanges().await, before + 2);

    // Ten calls at once for a person with no token yet, while the endpoint takes its time: one
    // exchange, and every call gets its result.
    s.idp.mode(json!({"token": "slow", "delay_ms": 400})).await;
    let dave = s.person("dave").await;
    let before = s.exchanges().await;
    let calls = (0..10).map(|_| s.seen_by_upstream("tickets", &dave));
    for saw in futures::future::join_all(calls).await {
        assert_eq!(saw["sub"], "dave");
    }
    assert_eq!(
        s.exchanges().await,
        before + 1,
        "concurrent first calls shared one exchange"
    );
    s.server.stop().await;
}

#[tokio::test]
async fn a_failing_token_endpoint_keeps_the_call_from_the_upstream() {
    let s = setup().await;
    for (i, (mode, error_type, status, retryable, says)) in [
        (
            "down",
            "credentials_unavailable",
            ToolStatus::Unavailable,
            true,
            "the token endpoint answered 503",
        ),
        (
            "hang",
            "credentials_unavailable",
            ToolStatus::Unavailable,
            true,
            "the token endpoint did not answer within 1s",
        ),
        (
            "garbage",
            "credentials_unavailable",
            ToolStatus::Unavailable,
            true,
            "the token endpoint answered with no JSON",
        ),
        (
            "huge",
            "credentials_unavailable",
            ToolStatus::Unavailable,
            true,
            "the token endpoint answered with more than 65536 bytes",
        ),
        (
            "refuse",
            "credentials_refused",
            ToolStatus::Denied,
            false,
            "the token endpoint refused (400 access_denied)",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        s.idp.mode(json!({ "token": mode })).await;
        // A person with no cached token, so the endpoint is asked.
        let person = s.person(&format!("person-{i}")).await;
        let result = s.refused("tickets", &person).await;
        assert_eq!(
            (
                result.status(),
                result.error_type.as_str(),
                result.retryable
            ),
            (status, error_type, retryable),
            "{mode}: {result:?}"
        );
        assert!(result.error_message.contains(says), "{mode}: {result:?}");
        // The endpoint's description is its own: never passed on.
        assert!(
            !result.error_message.contains("secret detail"),
            "{result:?}"
        );
    }
    // The endpoint is slower than a write tool's timeout: the call is refused for want of a
    // credential, retryably, and not as a write whose outcome is unknown (nothing was sent).
    s.idp
        .mode(json!({ "token": "slow", "delay_ms": 900 }))
        .await;
    let result = s.refused("tickets_hurried", &s.person("hasty").await).await;
    assert_eq!(
        (
            result.status(),
            result.error_type.as_str(),
            result.retryable
        ),
        (ToolStatus::Unavailable, "credentials_unavailable", true),
        "{result:?}"
    );
    assert!(
        result.error_message.contains(
            "no credential for tickets_hurried before its timeout of 300 ms; nothing was sent"
        ),
        "{result:?}"
    );
    // The endpoint recovers: the next call gets its credential.
    s.idp.mode(json!({ "token": "normal" })).await;
    // The endpoint refuses the sidecar's own client: an operator's fault, not the caller's.
    let result = s
        .refused("tickets_misconfigured", &s.person("frank").await)
        .await;
    assert_eq!(
        (
            result.status(),
            result.error_type.as_str(),
            result.retryable
        ),
        (ToolStatus::Error, "backend_misconfigured", false),
        "{result:?}"
    );
    assert!(
        result
            .error_message
            .contains("the token endpoint refused (400 unauthorized_client)"),
        "{result:?}"
    );
    let saw = s.seen_by_upstream("tickets", &s.person("erin").await).await;
    assert_eq!(saw["sub"], "erin");
    s.server.stop().await;
}

/// The sidecar proves it is the client with a signed assertion (`private_key_jwt`) instead of a
/// secret: the IdP knows only its public key.
#[tokio::test]
async fn the_client_can_authenticate_with_a_private_key() {
    let dir = tempfile::tempdir().unwrap();
    let jwks: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/jwks.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let clients = dir.path().join("clients.json");
    std::fs::write(
        &clients,
        json!([{"client_id": "toolgate-pk", "token_endpoint_auth_method": "private_key_jwt",
                "jwks": jwks}])
        .to_string(),
    )
    .unwrap();
    let idp = Idp::start_with(&[("IDP_CLIENTS", clients.to_str().unwrap())]).await;
    let upstream = Whoami::start(&idp, AUDIENCE).await;
    let server = TestServer::start(&format!(
        r#"version: 1
identity:
  jwt: {{ jwks: {{ url: "{issuer}/jwks" }}, issuer: ["{issuer}"], audience: [toolgate] }}
tenants: {{ acme: {{}} }}
upstreams:
  reports:
    url: {url}
    allow_schemes: [http]
    allow_private_addresses: true
    credentials:
      client_credentials:
        token_endpoint: "{issuer}/token"
        client_id: toolgate-pk
        client_key_file: {key}
        client_key_id: test-rsa
        audience: "{AUDIENCE}"
tools:
  - {{ name: report, description: d, risk_level: read_only, executor: {{ http: {{ upstream: reports, path: /r }} }}, input_schema: {{ type: object }} }}
"#,
        issuer = idp.issuer,
        url = upstream.url,
        key = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/rsa_private.pem"),
    ))
    .await;
    let token = idp
        .mint(json!({"sub": "ivan", "tenant": "acme", "aud": "toolgate", "exp": START_UNIX_MS / 1000 + 3600}))
        .await;
    let result = server
        .client()
        .await
        .execute_tool(Who::token(&token).request(execute_request(call("report", "{}"))))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
    let saw: Value = serde_json::from_str(&result.model_text).unwrap();
    assert_eq!(
        (saw["sub"].as_str(), saw["aud"].as_str()),
        (Some("toolgate-pk"), Some(AUDIENCE)),
        "{saw}"
    );
    server.stop().await;
}

/// A reload of the catalog file that leaves an upstream's credentials alone keeps its issued
/// tokens (no new exchange); one that changes them (another scope) starts afresh.
#[tokio::test]
async fn a_reload_keeps_issued_tokens_unless_the_credentials_change() {
    let idp = Idp::start().await;
    let upstream = Whoami::start(&idp, AUDIENCE).await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = catalog(&idp, &upstream, dir.path()).await;
    let server = TestServer::start_file(&yaml).await;
    let s = Setup {
        idp,
        upstream,
        server,
        _dir: dir,
    };
    let alice = s.person("alice").await;
    s.seen_by_upstream("tickets", &alice).await;
    let exchanges = s.exchanges().await;
    let file = s.server.catalog_file();
    // Another tool's description changes: the same credentials, the same token.
    s.server.write_catalog(
        &file,
        &yaml.replacen("description: d,", "description: changed,", 1),
    );
    s.server.reload().await.unwrap();
    assert_eq!(s.seen_by_upstream("tickets", &alice).await["sub"], "alice");
    assert_eq!(
        s.exchanges().await,
        exchanges,
        "the reload dropped the issued token"
    );
    // The scope changes: a new token, with it.
    let rescoped = yaml.replacen(
        "scope: tickets:read, timeout: 1s, actor",
        "scope: tickets:write, timeout: 1s, actor",
        1,
    );
    assert_ne!(rescoped, yaml);
    s.server.write_catalog(&file, &rescoped);
    s.server.reload().await.unwrap();
    assert_eq!(
        s.seen_by_upstream("tickets", &alice).await["scope"],
        "tickets:write"
    );
    assert_eq!(s.exchanges().await, exchanges + 1);
    s.server.stop().await;
}

/// An MCP host's caller: their bearer token (for the door's resource) is the subject token
/// exchanged for the upstream, as for a gRPC caller.
#[tokio::test]
async fn an_mcp_host_s_caller_reaches_the_upstream_as_themselves() {
    let s = setup().await;
    let token = s
        .idp
        .mint(
            json!({"sub": "grace", "tenant": "acme", "aud": MCP_RESOURCE,
                     "exp": START_UNIX_MS / 1000 + 3600}),
        )
        .await;
    let door = s.server.mcp_addr().unwrap();
    let answer: Value = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/mcp", door.port()))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header("host", "localhost")
        .bearer_auth(&token)
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "tickets", "arguments": {}}})
            .to_string(),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(!text.contains("eyJ"), "{answer}");
    let saw: Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("{answer}"));
    assert_eq!(saw["sub"], "grace", "{saw}");
    assert_eq!(
        saw["act"]["sub"], "system:serviceaccount:agents:support-bot",
        "{saw}"
    );
    s.server.stop().await;
}

/// An MCP server over Streamable HTTP that verifies every request's token: each person's call
/// reaches it with their exchanged token (the agent as actor), a client-credentials server's
/// with the sidecar's own, and the shared session's own requests (initialize, tools/list,
/// notifications, the event stream) with the sidecar's token from the same grant: no request
/// ever goes without one, and no caller's own token is sent. A person with no credential (the
/// token endpoint down) never reaches the server.
#[tokio::test]
async fn an_mcp_server_sees_each_person_on_their_calls_and_the_sidecar_on_its_session() {
    let idp = Idp::start().await;
    let mcp = WhoamiMcp::start(&idp, AUDIENCE).await;
    let dir = tempfile::tempdir().unwrap();
    let (grant, actor) = grants(&idp, dir.path()).await;
    let server_at = |credentials: String| {
        format!(
            "{{ url: \"{}/mcp\", allow_private_addresses: true, credentials: {credentials}, tools: {{ whoami: {{ risk_level: read_only }} }} }}",
            mcp.url
        )
    };
    let yaml = format!(
        r#"version: 1
identity:
  jwt: {{ jwks: {{ url: "{issuer}/jwks" }}, issuer: ["{issuer}"], audience: [toolgate] }}
tenants: {{ acme: {{}} }}
mcp_servers:
  people: {people}
  sidecar: {sidecar}
"#,
        issuer = idp.issuer,
        people = server_at(format!("{{ token_exchange: {} }}", grant(&actor))),
        sidecar = server_at(format!("{{ client_credentials: {} }}", grant(""))),
    );
    let server = TestServer::start(&yaml).await;
    let person = |sub: &'static str| {
        idp.mint(json!({"sub": sub, "tenant": "acme", "aud": "toolgate",
                        "exp": START_UNIX_MS / 1000 + 3600}))
    };
    let (alice, bob) = (person("alice").await, person("bob").await);
    wait_for_tool(&server, &Who::token(&alice), "people.whoami").await;
    wait_for_tool(&server, &Who::token(&alice), "sidecar.whoami").await;
    let run = |tool: &'static str, token: String| {
        let server = &server;
        async move {
            server
                .client()
                .await
                .execute_tool(Who::token(&token).request(execute_request(call(tool, "{}"))))
                .await
                .unwrap()
                .into_inner()
                .result
                .unwrap()
        }
    };
    let saw = |result: proto::ToolResult| -> Value {
        assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
        assert!(!result.model_text.contains("eyJ"), "{result:?}");
        serde_json::from_str(&result.model_text).unwrap()
    };
    let exchanges = || async {
        idp.stats().await["token"]["urn:ietf:params:oauth:grant-type:token-exchange"]
            .as_u64()
            .unwrap_or(0)
    };
    let before = exchanges().await;
    let saw_alice = saw(run("people.whoami", alice.clone()).await);
    let saw_bob = saw(run("people.whoami", bob.clone()).await);
    for (saw, who) in [(&saw_alice, "alice"), (&saw_bob, "bob")] {
        assert_eq!(saw["sub"], who, "{saw}");
        assert_eq!(saw["aud"], AUDIENCE, "{saw}");
        assert_eq!(saw["tenant"], "acme", "{saw}");
        assert_eq!(
            saw["act"],
            json!({"sub": "system:serviceaccount:agents:support-bot"}),
            "{saw}"
        );
    }
    // Alice again: her token is reused.
    assert_eq!(saw(run("people.whoami", alice.clone()).await), saw_alice);
    assert_eq!(exchanges().await, before + 2, "one exchange per person");
    // The client-credentials server: the sidecar itself, whoever calls.
    let own = saw(run("sidecar.whoami", bob.clone()).await);
    assert_eq!(
        (own["sub"].as_str(), own["act"].as_str()),
        (Some("toolgate"), None),
        "{own}"
    );
    let event = server
        .wait_for_audit(|e| e["tool"] == "people.whoami" && e["credential"]["subject"] == "bob")
        .await;
    assert_eq!(
        event["credential"]["fingerprint"],
        saw_bob["token_sha256"].as_str().unwrap()[..16],
        "{event}"
    );

    // The token endpoint is down: a person with no token yet is refused, retryably, and the
    // server never sees their call.
    let calls = |seen: &[Value]| seen.iter().filter(|r| r["method"] == "tools/call").count();
    let calls_before = calls(&mcp.seen().await);
    idp.mode(json!({ "token": "down" })).await;
    let refused = run("people.whoami", person("carol").await).await;
    assert_eq!(
        (
            refused.status(),
            refused.error_type.as_str(),
            refused.retryable
        ),
        (ToolStatus::Unavailable, "credentials_unavailable", true),
        "{refused:?}"
    );
    idp.mode(json!({ "token": "normal" })).await;

    let seen = mcp.seen().await;
    assert_eq!(
        calls(&seen),
        calls_before,
        "carol's call reached the server"
    );
    // Every request carried a valid token: the calls the person's (or, for the sidecar server,
    // the sidecar's), everything else the sidecar's.
    assert!(seen.iter().all(|r| r["valid"] == true), "{seen:#?}");
    let call_tokens: Vec<&Value> = seen
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .map(|r| &r["token_sha256"])
        .collect();
    for saw in [&saw_alice, &saw_bob, &own] {
        assert!(call_tokens.contains(&&saw["token_sha256"]), "{seen:#?}");
    }
    // The marker naming a call's token stays in the sidecar.
    assert!(
        seen.iter()
            .flat_map(|r| r["meta_keys"].as_array().into_iter().flatten())
            .all(|key| !key.as_str().unwrap_or_default().contains("toolgate")),
        "{seen:#?}"
    );
    let session: Vec<&Value> = seen
        .iter()
        .filter(|r| r["method"] != "tools/call")
        .collect();
    let methods: Vec<&str> = session
        .iter()
        .filter_map(|r| r["method"].as_str())
        .collect();
    for method in ["initialize", "tools/list", "notifications/initialized"] {
        assert!(methods.contains(&method), "{methods:?}");
    }
    assert!(
        session.iter().all(|r| r["sub"] == "toolgate"),
        "{session:#?}"
    );
    for token in [&alice, &bob] {
        let own = json!(hex_sha256(token));
        assert!(
            seen.iter().all(|r| r["token_sha256"] != own),
            "a caller's own token was sent"
        );
    }
    // No token, the callers' or the issued ones, in the audit log.
    let audit = std::fs::read_to_string(&server.audit_path).unwrap();
    assert!(!audit.contains("eyJ"), "a token in the audit log");
    server.stop().await;
}

/// The real binary's logs (debug for the credentials and the boundary), and stdout, where its
/// audit events go: neither holds the caller's token or the one issued for the upstream, while
/// the logs do say a credential was issued and by which fingerprint.
#[tokio::test]
async fn no_token_reaches_the_binary_s_logs_or_audit() {
    let idp = Idp::start().await;
    let upstream = Whoami::start(&idp, AUDIENCE).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("catalog.yaml");
    std::fs::write(&config, catalog(&idp, &upstream, dir.path()).await).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let text = std::fs::read_to_string(&config).unwrap().replacen(
        "version: 1\n",
        &format!(
            "version: 1\naudit: {{ sink: file, path: \"{}\" }}\n",
            audit.display()
        ),
        1,
    );
    std::fs::write(&config, text).unwrap();
    let spawned = crate::support::binary::spawn_with_env(
        &["--config", config.to_str().unwrap()],
        &[(
            "RUST_LOG",
            "debug,h2=info,hyper=info,reqwest=info,rustls=info,tower=info",
        )],
    );
    // The binary's clock is the machine's: tokens valid from now.
    let token = idp
        .mint(json!({"sub": "heidi", "tenant": "acme", "aud": "toolgate"}))
        .await;
    let mut client = crate::support::binary::client(&spawned.addr).await;
    let result = client
        .execute_tool(Who::token(&token).request(execute_request(call("tickets", "{}"))))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
    let saw: Value = serde_json::from_str(&result.model_text).unwrap();
    assert_eq!(saw["sub"], "heidi");
    let issued_sha256 = saw["token_sha256"].as_str().unwrap().to_owned();
    drop(client);
    let logs = crate::support::binary::stop(spawned).await;
    let audit = std::fs::read_to_string(&audit).unwrap();
    assert!(
        logs.contains("credential issued") && logs.contains(&issued_sha256[..16]),
        "the logs do not say which credential was issued:\n{logs}"
    );
    for (what, text) in [("logs", &logs), ("audit", &audit)] {
        assert!(
            !text.contains(&token),
            "the caller's token is in the {what}"
        );
        assert!(!text.contains("eyJ"), "a token is in the {what}");
    }
}

fn hex_sha256(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}
