//! docs/executors.md calls examples/http.yaml, process.yaml and mcp.yaml "complete, tested
//! examples": each is served by the real binary and gets the call its comments describe. Only what
//! cannot exist on a test machine is changed, each change asserted to apply exactly once: the
//! billing upstream's URL (there is no billing.internal.example.com; a local HTTP server stands in,
//! which needs plain http and a loopback address), the MCP HTTP server's port (3001 may be taken)
//! and the Python interpreter that has mcp-server-time.

use std::{
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, body::Bytes, http::HeaderMap, routing::post};
use serde_json::{Value, json};
use toolgate::proto::{self, ToolStatus, tool_gate_client::ToolGateClient};

use crate::{
    support::binary::{Spawned, spawn_with_env},
    support::{call, exec, who},
};

fn example(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(name),
    )
    .unwrap()
}

/// Replaces `from` with `to`, which must occur exactly once.
fn patch(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "{from:?} in the example");
    text.replacen(from, to, 1)
}

fn serve(dir: &Path, yaml: &str, envs: &[(&str, &str)]) -> Spawned {
    let config = dir.join("catalog.yaml");
    std::fs::write(&config, yaml).unwrap();
    spawn_with_env(&["--config", config.to_str().unwrap()], envs)
}

async fn client(spawned: &Spawned) -> ToolGateClient<tonic::transport::Channel> {
    crate::support::binary::client(&spawned.addr).await
}

/// What the stand-in billing service was sent: path, headers, body.
type Requests = Arc<Mutex<Vec<(String, HeaderMap, Value)>>>;

async fn billing() -> (SocketAddr, Requests) {
    let seen: Requests = Arc::default();
    let record = seen.clone();
    let app = Router::new().route(
        "/api/invoices/lookup",
        post(move |headers: HeaderMap, body: Bytes| {
            let record = record.clone();
            async move {
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let number = body["invoice_number"].clone();
                record
                    .lock()
                    .unwrap()
                    .push(("/api/invoices/lookup".into(), headers, body));
                json!({"invoice_number": number, "total_cents": 4200}).to_string()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_example_posts_the_bound_arguments_with_the_secret_header() {
    let (addr, seen) = billing().await;
    let yaml = example("http.yaml");
    let yaml = patch(
        &yaml,
        "url: https://billing.internal.example.com/api",
        &format!("url: http://{addr}/api"),
    );
    let yaml = patch(&yaml, "allow_schemes: [https]", "allow_schemes: [http]");
    // The stand-in runs on loopback: allow exactly that range instead of the example's.
    let yaml = patch(&yaml, r#"["10.1.2.0/24"]"#, r#"["127.0.0.0/8"]"#);
    let dir = tempfile::tempdir().unwrap();
    let spawned = serve(
        dir.path(),
        &yaml,
        &[("BILLING_API_TOKEN", "billing-secret")],
    );
    let mut grpc = client(&spawned).await;
    // "Returns an invoice of the caller's company by its number": the tenant is bound.
    let r = exec(
        &mut grpc,
        &who("acme"),
        call("get_invoice", r#"{"invoice_number":"INV-1001"}"#),
    )
    .await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&r.model_text).unwrap(),
        json!({"invoice_number": "INV-1001", "total_cents": 4200})
    );
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        let (_, headers, body) = &seen[0];
        assert_eq!(
            body,
            &json!({"invoice_number": "INV-1001", "tenant": "acme"})
        );
        assert_eq!(headers["authorization"], "Bearer billing-secret");
    }
    // The model may not choose the tenant, nor send a malformed number.
    let r = exec(
        &mut grpc,
        &who("acme"),
        call(
            "get_invoice",
            r#"{"invoice_number":"INV-1","tenant":"globex"}"#,
        ),
    )
    .await;
    assert_eq!(r.error_type, "bound_argument_override");
    let r = exec(
        &mut grpc,
        &who("acme"),
        call("get_invoice", r#"{"invoice_number":"1001"}"#),
    )
    .await;
    assert_eq!(r.error_type, "schema_violation");
    assert_eq!(seen.lock().unwrap().len(), 1);
    drop(grpc);
    crate::support::binary::stop(spawned).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_example_counts_words() {
    let dir = tempfile::tempdir().unwrap();
    let spawned = serve(dir.path(), &example("process.yaml"), &[]);
    let mut grpc = client(&spawned).await;
    let r = exec(
        &mut grpc,
        &who("acme"),
        call("word_count", r#"{"text":"the quick brown fox"}"#),
    )
    .await;
    assert_eq!(
        (r.status(), r.model_text.as_str()),
        (ToolStatus::Ok, "4\n"),
        "{r:?}"
    );
    drop(grpc);
    crate::support::binary::stop(spawned).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_example_serves_both_servers_with_the_catalogs_settings() {
    // `npx @modelcontextprotocol/server-everything streamableHttp`, as the comment says.
    let (port, mut everything) = crate::executors::spawn_everything_over_http().await;
    let python = crate::support::python();
    let yaml = example("mcp.yaml");
    let yaml = patch(
        &yaml,
        r#"command: ["python3", "-m", "mcp_server_time""#,
        &format!(r#"command: ["{python}", "-m", "mcp_server_time""#),
    );
    let yaml = patch(
        &yaml,
        "url: http://127.0.0.1:3001/mcp",
        &format!("url: http://127.0.0.1:{port}/mcp"),
    );
    let dir = tempfile::tempdir().unwrap();
    let spawned = serve(dir.path(), &yaml, &[]);
    let mut grpc = client(&spawned).await;
    let user = who("acme").scopes("demo:use");
    // Both servers' tools appear (the HTTP one once server-everything is up).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let listed = grpc
            .list_tools(user.request(proto::ListToolsRequest {}))
            .await
            .unwrap()
            .into_inner();
        let names: Vec<&str> = listed.tools.iter().map(|t| t.name.as_str()).collect();
        if ["time.get_current_time", "demo.echo", "demo.get-sum"]
            .iter()
            .all(|t| names.contains(t))
        {
            let sum = listed
                .tools
                .iter()
                .find(|t| t.name == "demo.get-sum")
                .unwrap();
            assert_eq!(sum.description, "Adds two numbers (needs approval).");
            assert!(sum.requires_approval);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "tools missing after 60s: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // "hidden from the model, always Paris"
    let r = exec(&mut grpc, &user, call("time.get_current_time", "{}")).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    assert!(r.model_text.contains("Europe/Paris"), "{}", r.model_text);
    // demo.echo needs demo:use.
    let r = exec(
        &mut grpc,
        &user,
        call("demo.echo", r#"{"message":"from the example"}"#),
    )
    .await;
    assert!(r.model_text.contains("from the example"), "{r:?}");
    let r = exec(
        &mut grpc,
        &who("acme"),
        call("demo.echo", r#"{"message":"x"}"#),
    )
    .await;
    // Without its scope the tool is hidden, and refused as one that does not exist.
    assert_eq!(r.error_type, "tool_not_found");
    // "Adds two numbers (needs approval)": the catalog's description and risk level.
    let r = exec(&mut grpc, &user, call("demo.get-sum", r#"{"a":1,"b":2}"#)).await;
    assert_eq!(r.status(), ToolStatus::ApprovalRequired, "{r:?}");
    drop(grpc);
    crate::support::binary::stop(spawned).await;
    let _ = everything.kill().await;
}

/// examples/identity.yaml (issuers' published keys, a token exchange and client credentials) and
/// examples/handoff.yaml (delegation keys, budgets, an A2A handoff) pass `toolgate check` as
/// written: loading validates every setting and fetches nothing (the examples' hosts do not
/// exist), so a catalog can be checked where its IdP or agents cannot be reached.
#[test]
fn the_identity_and_handoff_examples_check_without_reaching_their_peers() {
    for example in ["examples/identity.yaml", "examples/handoff.yaml"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["check", "--config", example])
            .env_remove("TOOLGATE_CONFIG")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(&format!("{example}: ok (2 tools")),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
