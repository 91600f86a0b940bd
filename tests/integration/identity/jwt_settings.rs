//! The JWT settings docs/identity.md documents, each through a real server: `hs256_secret_file`,
//! the `claims:` mapping, scopes as a JSON array, the issuer check, a configured `leeway`, and a
//! token without `exp`.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tonic::Code;
use toolgate::proto::{self, ToolStatus};

use crate::support::{START_UNIX_MS, TestServer, Who, call, exec};

const SECRET: &str = "a-secret-read-from-a-file-0123456789";

fn now() -> i64 {
    START_UNIX_MS / 1000
}

/// A catalog whose JWT settings are all non-default: the secret from a file (with the trailing
/// newline secret files usually have), renamed claims, a 5 s leeway.
fn catalog(secret_file: &std::path::Path) -> String {
    format!(
        r#"version: 1
identity:
  jwt:
    hs256_secret_file: {}
    issuer: ["https://issuer.test"]
    audience: [toolgate]
    leeway: 5s
    claims: {{ tenant: org, subject: email, agent: client_id, scopes: permissions }}
tenants: {{ acme: {{}} }}
agents:
  billing-agent: {{ allow: [whoami] }}
tools:
  - name: whoami
    description: Returns who the server says is calling.
    risk_level: read_only
    required_scopes: ["read:invoices", "write:drafts"]
    executor: {{ builtin: echo_arguments }}
    input_schema: {{ type: object, properties: {{ tenant: {{ type: string }}, subject: {{ type: string }}, agent: {{ type: string }} }} }}
    bind: {{ tenant: "${{caller.tenant}}", subject: "${{caller.subject}}", agent: "${{caller.agent}}" }}
  - name: echo
    description: Returns text.
    risk_level: read_only
    executor: {{ builtin: echo }}
    input_schema: {{ type: object, properties: {{ text: {{ type: string }} }}, required: [text] }}
"#,
        secret_file.display()
    )
}

async fn server() -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("jwt-secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    (TestServer::start(&catalog(&secret_file)).await, dir)
}

fn claims() -> Value {
    json!({
        "org": "acme", "email": "ada@acme.test", "client_id": "billing-agent",
        "permissions": ["read:invoices", "write:drafts"],
        "iss": "https://issuer.test", "aud": "toolgate", "exp": now() + 600,
    })
}

fn token(claims: &Value) -> String {
    crate::support::hs256_jwt(SECRET, claims)
}

async fn whoami(server: &TestServer, claims: &Value) -> Result<proto::ToolResult, tonic::Status> {
    let mut client = server.client().await;
    client
        .execute_tool(
            Who::token(&token(claims))
                .request(crate::support::execute_request(call("whoami", "{}"))),
        )
        .await
        .map(|r| r.into_inner().result.unwrap())
}

async fn refused(server: &TestServer, claims: &Value) -> tonic::Status {
    let status = whoami(server, claims).await.expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    status
}

#[tokio::test]
async fn mapped_claims_and_array_scopes_identify_the_caller() {
    let (server, _dir) = server().await;
    // The secret came from the file (its newline trimmed); every identity field from the mapped
    // claims; both scopes from the JSON array (whoami needs both).
    let r = whoami(&server, &claims()).await.unwrap();
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&r.model_text).unwrap(),
        json!({"tenant": "acme", "subject": "ada@acme.test", "agent": "billing-agent"})
    );
    // One scope short of the two: the tool is hidden from the caller, refused as unknown.
    let mut one_scope = claims();
    one_scope["permissions"] = json!(["read:invoices"]);
    let r = whoami(&server, &one_scope).await.unwrap();
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::NotFound, "tool_not_found")
    );
    assert!(
        !r.error_message.contains("write:drafts"),
        "{}",
        r.error_message
    );
    // The agent comes from client_id: billing-agent may call only whoami.
    let mut client = server.client().await;
    let r = exec(
        &mut client,
        &Who::token(&token(&claims())),
        call("echo", r#"{"text":"x"}"#),
    )
    .await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::NotFound, "tool_not_found"),
        "{r:?}"
    );
    // The default claim names mean nothing here: a token with `tenant` but no `org` has no tenant.
    let mut default_names = claims();
    default_names.as_object_mut().unwrap().remove("org");
    default_names["tenant"] = json!("acme");
    let status = refused(&server, &default_names).await;
    assert!(status.message().contains("org"), "{status:?}");
    // A token signed with another secret is refused (the file's secret is the one in use).
    let other = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims(),
        &EncodingKey::from_secret(b"another-secret-another-secret-0123").unwrap(),
    )
    .unwrap();
    let status = server
        .client()
        .await
        .list_tools(Who::token(&other).request(proto::ListToolsRequest {}))
        .await
        .expect_err("another secret");
    assert!(status.message().contains("bad signature"), "{status:?}");
    server.stop().await;
}

#[tokio::test]
async fn the_issuer_is_checked_and_exp_is_required() {
    let (server, _dir) = server().await;
    let mut wrong_issuer = claims();
    wrong_issuer["iss"] = json!("https://evil.test");
    let status = refused(&server, &wrong_issuer).await;
    assert!(status.message().contains("wrong issuer"), "{status:?}");
    // A token that leaves out a checked claim does not escape the check.
    for claim in ["iss", "aud"] {
        let mut without = claims();
        without.as_object_mut().unwrap().remove(claim);
        let status = refused(&server, &without).await;
        assert!(
            status
                .message()
                .contains(&format!("missing required claim \"{claim}\"")),
            "{status:?}"
        );
    }
    // A token with no exp at all never expires: it is refused.
    let mut no_exp = claims();
    no_exp.as_object_mut().unwrap().remove("exp");
    let status = refused(&server, &no_exp).await;
    assert!(
        status.message().contains("missing required claim \"exp\""),
        "{status:?}"
    );
    // Nothing ran for any of them: the only events are the refused callers'.
    assert_eq!(server.builtins().executions(), 0);
    assert!(server.audit_path.is_file());
    let events = server.audit_events().await;
    assert!(
        !events.is_empty() && events.iter().all(|e| e["kind"] == "authentication_failed"),
        "{events:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_configured_leeway_bounds_exp_and_nbf() {
    let (server, _dir) = server().await;
    let with = |field: &str, value: i64| {
        let mut c = claims();
        c[field] = json!(value);
        c
    };
    // 3 s past exp is within the 5 s leeway; 6 s past is not (the default would allow 30 s).
    let r = whoami(&server, &with("exp", now() - 3)).await.unwrap();
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    let status = refused(&server, &with("exp", now() - 6)).await;
    assert!(status.message().contains("expired"), "{status:?}");
    // The same on the other side: nbf 3 s ahead is accepted, 6 s ahead is not valid yet.
    let r = whoami(&server, &with("nbf", now() + 3)).await.unwrap();
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    let status = refused(&server, &with("nbf", now() + 6)).await;
    assert!(status.message().contains("not valid yet"), "{status:?}");
    server.stop().await;
}

/// The catalog above with `department` exposed to conditions: only finance may export, and a
/// rule on a claim that is not exposed (`role`) never sees it, whatever the token carries.
async fn server_exposing_claims() -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("jwt-secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let yaml = catalog(&secret_file)
        .replace(
            "scopes: permissions }",
            "scopes: permissions, expose: [department] }",
        )
        .replace(
            "billing-agent: { allow: [whoami] }",
            r#"billing-agent:
    allow:
      - whoami
      - echo
      - { tools: [export], when: "caller.claims.department == 'finance'" }
    deny:
      - { tools: [echo], when: "has(caller.claims.role)" }"#,
        )
        .replace(
            "  - name: echo\n",
            "  - name: export\n    description: Exports the books.\n    risk_level: read_only\n    executor: { builtin: echo_arguments }\n    input_schema: { type: object }\n  - name: echo\n",
        );
    (TestServer::start(&yaml).await, dir)
}

#[tokio::test]
async fn conditions_read_only_the_claims_the_catalog_exposes() {
    let (server, _dir) = server_exposing_claims().await;
    let mut client = server.client().await;
    let with = |department: Option<&str>| {
        let mut claims = claims();
        claims["role"] = json!("admin");
        claims["permissions"] = json!(["read:invoices", "write:drafts", "toolgate:explain"]);
        if let Some(department) = department {
            claims["department"] = json!(department);
        }
        Who::token(&token(&claims))
    };
    let listed = |who: Who| {
        let mut client = client.clone();
        async move {
            let tools = client
                .list_tools(who.request(proto::ListToolsRequest::default()))
                .await
                .expect("ListTools")
                .into_inner()
                .tools;
            let mut names: Vec<String> = tools.into_iter().map(|t| t.name).collect();
            names.sort();
            names
        }
    };
    // The condition reads only the caller: decided at list time too.
    assert_eq!(
        listed(with(Some("finance"))).await,
        ["echo", "export", "whoami"]
    );
    assert_eq!(listed(with(Some("sales"))).await, ["echo", "whoami"]);
    // A token without the claim: the condition cannot be evaluated, so it does not allow.
    assert_eq!(listed(with(None)).await, ["echo", "whoami"]);
    let export = exec(&mut client, &with(Some("finance")), call("export", "{}")).await;
    assert_eq!(export.status(), ToolStatus::Ok, "{export:?}");
    let refused = exec(&mut client, &with(Some("sales")), call("export", "{}")).await;
    assert_eq!(refused.status(), ToolStatus::NotFound, "{refused:?}");
    // `role` is in every token above but not exposed: the deny on it never held.
    let echo = exec(&mut client, &with(None), call("echo", r#"{"text":"hi"}"#)).await;
    assert_eq!(echo.status(), ToolStatus::Ok, "{echo:?}");
    // An exposed claim is bounded like the identity: an oversized one refuses the token.
    let mut huge = claims();
    huge["department"] = json!("x".repeat(16 * 256 + 1));
    let status = client
        .list_tools(Who::token(&token(&huge)).request(proto::ListToolsRequest::default()))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("department"), "{status:?}");
    // Explain shows what the condition read, claims included.
    let explained = client
        .explain_tool(with(Some("sales")).request(proto::ExplainToolRequest {
            call: Some(call("export", "{}")),
            ..Default::default()
        }))
        .await
        .expect("ExplainTool")
        .into_inner();
    let condition = explained
        .conditions
        .iter()
        .find(|c| c.location == "agents.billing-agent.allow[2]")
        .expect("the allow entry's condition");
    assert!(
        !condition.value && condition.error.is_empty(),
        "{condition:?}"
    );
    let read: Value = serde_json::from_str(&condition.variables_json).unwrap();
    assert_eq!(
        read["caller"]["claims"],
        json!({"department": "sales"}),
        "{read}"
    );
}

#[test]
fn an_exposed_claim_is_named_once() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("jwt-secret");
    std::fs::write(&secret_file, SECRET).unwrap();
    let yaml = catalog(&secret_file).replace(
        "scopes: permissions }",
        "scopes: permissions, expose: [department, department] }",
    );
    let err = toolgate::config::Config::from_yaml(
        &yaml,
        "catalog.yaml",
        dir.path(),
        &toolgate::settings::Env::default(),
    )
    .map(|_| ())
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("identity.jwt.claims.expose[1]") && err.contains("listed twice"),
        "{err}"
    );
}
