//! The real binary's edges: log lines a caller cannot forge, the demo's telemetry settings from
//! the environment, and the command line's error messages and addresses.

use std::{process::Command, time::Duration};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use toolgate::proto::{self, tool_gate_client::ToolGateClient};

use crate::{
    otlp_collector,
    support::binary::{spawn_logging, spawn_with_env},
    support::{call, exec, who},
};

/// Serves the demo with JWTs on, in log `format`, refuses one caller whose token header carries
/// `alg`, and returns the logs and the refusal's line.
async fn logs_of_a_refused_token(format: &'static str, alg: String) -> (String, String) {
    let logs =
        logs_of_refused_tokens(format, serde_json::json!({"alg": alg, "typ": "JWT"}), 1).await;
    let refusal = logs
        .lines()
        .find(|l| l.contains("caller refused"))
        .unwrap_or_else(|| panic!("no refusal logged: {logs}"))
        .to_owned();
    (logs, refusal)
}

/// The logs of the demo with JWTs on, in log `format`, after `times` callers were refused for
/// tokens with this header.
async fn logs_of_refused_tokens(
    format: &'static str,
    header: serde_json::Value,
    times: usize,
) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("catalog.yaml");
    std::fs::write(
        &file,
        crate::support::demo_with_identity(
            "  dev_identity: false\n  jwt:\n    hs256_secret_env: TEST_JWT_SECRET\n",
        ),
    )
    .unwrap();
    let spawned = tokio::task::spawn_blocking(move || {
        spawn_logging(
            format,
            &["--config", file.to_str().unwrap()],
            &[(
                "TEST_JWT_SECRET",
                "an-hs256-test-secret-that-is-long-enough",
            )],
        )
    })
    .await
    .unwrap();
    let token = format!(
        "{}.{}.c2ln",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(r#"{"tenant":"acme","exp":4102444800}"#)
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", spawned.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ToolGateClient::new(channel);
    for _ in 0..times {
        let mut request = tonic::Request::new(proto::ListToolsRequest {});
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let status = client.list_tools(request).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
    }
    tokio::task::spawn_blocking(move || crate::support::binary::stop_blocking(spawned))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_flood_of_refused_tokens_logs_a_few_short_lines() {
    // The demo verifies HS256 only: an RS256 token's refusal names its kid, here 10 KB of it.
    let kid = "k".repeat(10_000);
    let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": kid});
    let logs = logs_of_refused_tokens("json", header, 50).await;
    let refusals: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("caller refused"))
        .collect();
    // One line per interval (10 s) while refusals keep coming; the rest are counted.
    assert!(
        (1..=2).contains(&refusals.len()),
        "{} refusal lines: {logs}",
        refusals.len()
    );
    for line in &refusals {
        assert!(line.len() < 1024, "a {} byte log line: {line}", line.len());
        assert!(line.contains("kkkk"), "the kid's start is named: {line}");
    }
}

/// What Python's `str.splitlines()` splits on, beyond `\n`: a caller's text that holds one of
/// these turns one log line into two for every reader that splits lines that way.
fn splits_lines(c: char) -> bool {
    matches!(
        c,
        '\r' | '\u{b}'
            | '\u{c}'
            | '\u{1c}'
            | '\u{1d}'
            | '\u{1e}'
            | '\u{85}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

/// Characters that reorder the text around them on display.
fn reorders(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{61c}')
}

#[tokio::test]
async fn human_logs_escape_control_characters_from_callers() {
    // A terminal escape and a line break followed by a forged log line; then the separators
    // splitlines() also breaks on, and a right-to-left override.
    let forged =
        "FORGED 2030-01-01T00:00:00Z  INFO toolgate::server: tenant=globex admin access granted";
    let alg = format!("\u{1b}[2K\r\n{forged}\u{2028}FORGED2\u{2029}\u{85}x\u{202e}dilav\u{2066}");
    let (logs, refusal) = logs_of_a_refused_token("human", alg).await;
    assert!(
        refusal.contains("FORGED") && refusal.contains("FORGED2"),
        "the value is kept, escaped: {refusal}"
    );
    assert!(
        !logs.lines().any(|l| l.starts_with("FORGED")),
        "a caller forged a log line: {logs}"
    );
    assert!(
        !logs
            .chars()
            .any(|c| (c.is_control() && c != '\n') || splits_lines(c) || reorders(c)),
        "raw control, separator or bidirectional characters in the logs: {logs:?}"
    );
}

#[tokio::test]
async fn json_logs_escape_line_separators_and_bidirectional_controls_from_callers() {
    let alg = "a\u{2028}FORGED\u{2029}b\u{85}c\u{202e}d".to_owned();
    let (logs, refusal) = logs_of_a_refused_token("json", alg.clone()).await;
    assert!(
        !logs.chars().any(|c| splits_lines(c) || reorders(c)),
        "raw separator or bidirectional characters in the logs: {logs:?}"
    );
    // Still JSON, and the caller's text is all there once parsed.
    let line: serde_json::Value = serde_json::from_str(&refusal).expect("a JSON line");
    assert!(line.to_string().contains(&alg), "{line}");
}

#[tokio::test]
async fn the_demo_reads_the_otel_environment() {
    let collector = otlp_collector::start().await;
    let endpoint = collector.endpoint();
    let spawned = tokio::task::spawn_blocking(move || {
        spawn_with_env(
            &[],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
                ("OTEL_SERVICE_NAME", "demo-from-env"),
            ],
        )
    })
    .await
    .unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", spawned.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ToolGateClient::new(channel);
    let r = exec(
        &mut client,
        &who("acme"),
        call("echo", r#"{"text":"traced"}"#),
    )
    .await;
    assert_eq!(r.model_text, "traced");
    let spans = collector
        .wait_for_spans(
            |s| s.iter().any(|s| s.name == "execute_tool echo"),
            Duration::from_secs(20),
        )
        .await;
    assert!(!spans.is_empty());
    let resources = collector.resource_spans();
    assert!(
        format!("{resources:?}").contains("demo-from-env"),
        "OTEL_SERVICE_NAME was not used"
    );
    tokio::task::spawn_blocking(move || crate::support::binary::stop_blocking(spawned))
        .await
        .unwrap();
}

#[test]
fn a_busy_listen_address_is_reported_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args([
            "serve",
            "--listen",
            &addr,
            "--admin-listen",
            "127.0.0.1:0",
            "--mcp-listen",
            "127.0.0.1:0",
            "--console-listen",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.matches("Address already in use").count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("cannot listen on {addr}")),
        "{stderr}"
    );
}

#[tokio::test]
async fn client_verbs_take_an_address_without_a_scheme() {
    let spawned = tokio::task::spawn_blocking(|| spawn_with_env(&[], &[]))
        .await
        .unwrap();
    let addr = spawned.addr.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["tools", "--addr", &addr, "--tenant", "acme"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("echo"), "{stdout}");
    // An address that cannot work says why, rather than "transport error".
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["tools", "--addr", "ftp://127.0.0.1:1", "--tenant", "acme"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("http://"), "{stderr}");
    tokio::task::spawn_blocking(move || crate::support::binary::stop_blocking(spawned))
        .await
        .unwrap();
}
