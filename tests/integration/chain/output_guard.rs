//! The output guard (issue 32 B), through the real server: secrets in a tool's output are
//! redacted by default, personal data only when the catalog opts in, a blocking detector
//! withholds the output (`ERROR`/`output_blocked`), a backend's error text is screened like its
//! output, a tool's section overrides the catalog's, the MCP door's structured content carries
//! the screened output, and the audit event and the metric name detectors and counts, never the
//! values.

use serde_json::{Value, json};
use toolgate::{config::Config, proto::ToolStatus, settings::Env};

use crate::{
    chain::conditions::{audited, call_as},
    doors::mcp_call,
    support::{TestServer, exec, http_get, metric, who},
};

const AWS_KEY: &str = "AKIAIOSFODNN7EXAMPLE";
const GITHUB_TOKEN: &str = "ghp_0123456789abcdefghijABCDEFGHIJ012345";
/// Passes the Luhn check: a card.
const CARD: &str = "4111 1111 1111 1111";
/// Sixteen digits that fail it: an order number.
const ORDER_NUMBER: &str = "4111111111111112";

const CATALOG: &str = r#"version: 1
server: { mcp: {} }
identity: { dev_identity: true }
tenants: { acme: {} }
output_guard:
  detectors: { email: redact, payment_card: block }
  custom:
    - { name: ticket_secret, pattern: "TKS-[0-9a-f]{8}" }
tools:
  - name: echo
    description: Echoes its arguments.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    input_schema: { type: object }
    output_schema: { type: object }
  - name: raw_echo
    description: Echoes its arguments, secrets and all.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    input_schema: { type: object }
    output_guard: { secrets: off, detectors: { payment_card: off } }
  - name: failing
    description: Fails, writing what it was given to stderr.
    risk_level: read_only
    input_schema: { type: object }
    executor:
      process:
        command: /bin/sh
        args: ["-c", "cat >&2; exit 3"]
        env: [PATH]
"#;

#[tokio::test]
async fn secrets_are_redacted_and_audited_by_name_and_count_never_value() {
    let server = TestServer::start(CATALOG).await;
    let mut client = server.client().await;
    let acme = who("acme");
    let args = json!({
        "key": AWS_KEY,
        "again": format!("{AWS_KEY} and {GITHUB_TOKEN}"),
        "mail": "bob@acme.com",
        "ticket": "TKS-0badc0de",
        "order": ORDER_NUMBER,
    });
    let result = exec(
        &mut client,
        &acme,
        call_as("redact-1", "echo", &args.to_string()),
    )
    .await;
    assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
    let text = &result.model_text;
    for secret in [AWS_KEY, GITHUB_TOKEN, "bob@acme.com", "TKS-0badc0de"] {
        assert!(!text.contains(secret), "{secret} reached the model: {text}");
    }
    // Still JSON, each value replaced by what found it; the order number is left alone.
    let output: Value = serde_json::from_str(text).expect("still JSON");
    assert_eq!(
        output,
        json!({
            "key": "[REDACTED:aws_access_key]",
            "again": "[REDACTED:aws_access_key] and [REDACTED:github_token]",
            "mail": "[REDACTED:email]",
            "ticket": "[REDACTED:ticket_secret]",
            "order": ORDER_NUMBER,
        })
    );
    let event = audited(&server, "redact-1").await;
    assert_eq!(
        event["output_guard"],
        json!([
            {"detector": "aws_access_key", "matches": 2, "action": "redact"},
            {"detector": "github_token", "matches": 1, "action": "redact"},
            {"detector": "email", "matches": 1, "action": "redact"},
            {"detector": "ticket_secret", "matches": 1, "action": "redact"},
        ]),
        "{event}"
    );
    let line = std::fs::read_to_string(&server.audit_path).unwrap();
    for secret in [AWS_KEY, GITHUB_TOKEN, "bob@acme.com"] {
        assert!(!line.contains(secret), "the audit log carries {secret}");
    }
    let (_, metrics) = http_get(server.admin_addr(), "/metrics").await;
    let labels = [
        ("tool", "echo"),
        ("detector", "aws_access_key"),
        ("action", "redact"),
    ];
    assert_eq!(
        metric(&metrics, "toolgate_output_guard_matches_total", &labels),
        2.0
    );
    // A clean output is returned as it is, and its event has no output_guard.
    let clean = exec(
        &mut client,
        &acme,
        call_as("clean-1", "echo", r#"{"a":"b"}"#),
    )
    .await;
    assert_eq!(clean.model_text, r#"{"a":"b"}"#);
    assert!(
        audited(&server, "clean-1")
            .await
            .get("output_guard")
            .is_none()
    );
}

#[tokio::test]
async fn a_blocking_detector_withholds_the_output_and_says_why_not_what() {
    let server = TestServer::start(CATALOG).await;
    let mut client = server.client().await;
    let acme = who("acme");
    let args = json!({"card": CARD, "key": AWS_KEY}).to_string();
    let result = exec(&mut client, &acme, call_as("block-1", "echo", &args)).await;
    assert_eq!(
        (result.status(), result.error_type.as_str()),
        (ToolStatus::Error, "output_blocked"),
        "{result:?}"
    );
    assert!(!result.retryable);
    for value in [CARD, "4111", AWS_KEY] {
        assert!(!result.model_text.contains(value), "{}", result.model_text);
    }
    assert!(
        result.model_text.contains("payment_card (1 match)"),
        "{}",
        result.model_text
    );
    let event = audited(&server, "block-1").await;
    assert_eq!(event["error_type"], "output_blocked", "{event}");
    assert_eq!(event["refused_by"], "result", "{event}");
    assert_eq!(
        event["output_guard"],
        json!([
            {"detector": "aws_access_key", "matches": 1, "action": "redact"},
            {"detector": "payment_card", "matches": 1, "action": "block"},
        ])
    );
    // A tool whose own section turns the detectors off gets its output back as it is.
    let raw = exec(&mut client, &acme, call_as("raw-1", "raw_echo", &args)).await;
    assert_eq!(raw.status(), ToolStatus::Ok, "{raw:?}");
    assert!(raw.model_text.contains(CARD) && raw.model_text.contains(AWS_KEY));
    // It keeps the catalog's other detectors: e-mail addresses are still redacted.
    let mail = exec(
        &mut client,
        &acme,
        call_as("raw-2", "raw_echo", r#"{"m":"bob@acme.com"}"#),
    )
    .await;
    assert_eq!(mail.model_text, r#"{"m":"[REDACTED:email]"}"#);
}

#[tokio::test]
async fn a_backends_error_text_is_screened_like_its_output() {
    let server = TestServer::start(CATALOG).await;
    let mut client = server.client().await;
    let acme = who("acme");
    let leaked = json!({"token": GITHUB_TOKEN}).to_string();
    let failed = exec(&mut client, &acme, call_as("fail-1", "failing", &leaked)).await;
    assert_eq!(
        (failed.status(), failed.error_type.as_str()),
        (ToolStatus::Error, "tool_failed"),
        "{failed:?}"
    );
    assert!(
        !failed.model_text.contains(GITHUB_TOKEN),
        "{}",
        failed.model_text
    );
    assert!(
        failed.model_text.contains("[REDACTED:github_token]"),
        "{}",
        failed.model_text
    );
    let event = audited(&server, "fail-1").await;
    assert_eq!(
        event["output_guard"],
        json!([{"detector": "github_token", "matches": 1, "action": "redact"}])
    );
    // What a blocking detector finds in the error text withholds it.
    let card = json!({"card": CARD}).to_string();
    let blocked = exec(&mut client, &acme, call_as("fail-2", "failing", &card)).await;
    assert_eq!(blocked.error_type, "output_blocked", "{blocked:?}");
    assert!(
        !blocked.model_text.contains("4111"),
        "{}",
        blocked.model_text
    );
    assert!(
        blocked.model_text.contains("error text was withheld"),
        "{}",
        blocked.model_text
    );
}

#[tokio::test]
async fn the_mcp_doors_structured_content_is_the_screened_output() {
    let server = TestServer::start(CATALOG).await;
    toolgate::tls::install_crypto_provider();
    let http = reqwest::Client::new();
    let url = format!("http://{}/mcp", server.mcp_addr().expect("the MCP door"));
    let result = mcp_call(
        &http,
        &url,
        &who("acme"),
        "1",
        "echo",
        json!({"key": AWS_KEY, "n": 1}),
        json!({}),
    )
    .await;
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(
        result["structuredContent"],
        json!({"key": "[REDACTED:aws_access_key]", "n": 1}),
        "{result}"
    );
    assert!(!result.to_string().contains(AWS_KEY), "{result}");
}

#[test]
fn an_output_guard_that_cannot_work_is_a_load_error_naming_where() {
    let load = |section: &str| {
        let yaml = format!(
            "version: 1\nidentity: {{ dev_identity: true }}\ntools:\n  - name: t\n    description: d\n    risk_level: read_only\n    executor: {{ builtin: echo }}\n    input_schema: {{ type: object }}\n    output_guard: {section}\n"
        );
        Config::from_yaml(&yaml, "c.yaml", std::path::Path::new("."), &Env::default())
            .unwrap_err()
            .to_string()
    };
    let unknown = load("{ detectors: { credit_card: block } }");
    assert!(unknown.contains("tools[0].output_guard"), "{unknown}");
    assert!(
        unknown.contains("unknown detector \"credit_card\""),
        "{unknown}"
    );
    assert!(unknown.contains("payment_card"), "{unknown}");
    let pattern = load("{ custom: [{ name: mine, pattern: '([a-z]' }] }");
    assert!(
        pattern.contains("tools[0].output_guard.custom[0].pattern"),
        "{pattern}"
    );
    let action = load("{ secrets: warn }");
    assert!(action.contains("warn"), "{action}");
}

/// A password in a URL whose `@` comes after the first KiB of a program's stderr.
fn past_the_cut(filler: usize) -> String {
    format!(
        "{} postgres://app:hunter2hunter2@db/orders",
        "e".repeat(filler)
    )
}

/// A backend's error text is screened before it is cut to what is passed on, so a secret that
/// starts in what the model reads is found whole, in a program's stderr, an HTTP error body and
/// an MCP tool's error; and a private key cut before its end loses its body, in error text and in
/// an OK output. (Issue 52, item 5: the text was cut first — 1 KiB of stderr or an MCP error,
/// 200 characters of an HTTP body — so a password whose `@` fell past the cut, and a key's body
/// whose end was past it, reached the model.)
#[tokio::test]
async fn a_secret_across_the_cut_of_error_text_and_a_cut_key_are_screened_whole() {
    use axum::{Router, http::StatusCode, routing::post};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let app = Router::new().route(
        "/fail",
        post(|| async { (StatusCode::BAD_REQUEST, past_the_cut(180)) }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let yaml = format!(
        r#"{CATALOG}  - name: http_failing
    description: Answers 400.
    risk_level: read_only
    input_schema: {{ type: object }}
    executor: {{ http: {{ upstream: api, path: /fail }} }}
upstreams:
  api: {{ url: "http://{upstream}", allow_schemes: [http], allow_private_addresses: true }}
mcp_servers:
  dyn:
    command: ["{py}", "{dir}/tests/fixtures/mcp_dynamic_server.py"]
    env: [PATH, HOME]
    tools:
      fail: {{ risk_level: read_only }}
"#,
        py = crate::support::python(),
        dir = env!("CARGO_MANIFEST_DIR"),
    );
    let server = TestServer::start_with_env(&yaml, &crate::executors::env_with_path()).await;
    crate::executors::wait_for_tool(&server, &who("acme"), "dyn.fail").await;
    let mut client = server.client().await;
    let acme = who("acme");
    let stderr = json!({"line": past_the_cut(990)}).to_string();
    let key = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\nVJTUt9Us8cKjMzEfYyjiWA4R4M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNb";
    let calls = [
        ("failing", stderr.clone(), "connection_string_password"),
        (
            "http_failing",
            "{}".to_owned(),
            "connection_string_password",
        ),
        // After the SDK's "Error executing tool fail: ".
        (
            "dyn.fail",
            json!({"message": past_the_cut(975)}).to_string(),
            "connection_string_password",
        ),
        ("failing", json!({"key": key}).to_string(), "private_key"),
        ("echo", json!({"key": key}).to_string(), "private_key"),
    ];
    for (tool, args, detector) in calls {
        let result = exec(&mut client, &acme, crate::support::call(tool, &args)).await;
        let text = &result.model_text;
        for secret in ["hunter2", "hunt", "MIIEvQIB", "VJTUt9Us"] {
            assert!(
                !text.contains(secret),
                "{tool}: {secret} reached the model: {text}"
            );
        }
        assert!(
            text.contains(&format!("[REDACTED:{detector}]")),
            "{tool}: {text}"
        );
        assert!(
            text.len() < 2048,
            "{tool}: what is passed on is still cut: {text}"
        );
    }
}
