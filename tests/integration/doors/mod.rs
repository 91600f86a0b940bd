//! Parity of the two doors: generated callers and calls of the demo, each made through the gRPC
//! door (ExecuteTool) and through the MCP door (`tools/call` over Streamable HTTP, as a host sends
//! it), must get the same status, `model_text`, `error_type` and stage, and leave audit events
//! that differ in the door alone. A door only converts.

pub(crate) mod console;
pub(crate) mod grpc_wire;
pub(crate) mod list_tools;
pub(crate) mod listeners_under_attack;

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use proptest::{
    prelude::*,
    test_runner::{Config as ProptestConfig, RngAlgorithm, TestRng, TestRunner},
};
use serde_json::{Value, json};
use toolgate::proto;

use opentelemetry_proto::tonic::{common::v1::any_value, trace::v1::Span};
use toolgate::settings::{DEMO_CATALOG, Env};

use crate::{
    chain::explain::{Case, arguments_json, cases},
    otlp_collector,
    support::{TestServer, Who},
};

/// The demo's tools whose output differs from call to call.
const WRITES: [&str; 3] = ["create_ticket", "refund_order", "delete_ticket"];

/// An approval's id, made anew by each call that needs one: compared as `apr_*`.
fn without_approval_ids(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("apr_") {
        out.push_str(&rest[..at]);
        out.push_str("apr_*");
        rest = rest[at + 4..].trim_start_matches(|c: char| c.is_ascii_alphanumeric());
    }
    out.push_str(rest);
    out
}

/// The MCP door's answer to one `tools/call`, as a 2025-11-25 host sends it.
pub(crate) async fn mcp_call(
    http: &reqwest::Client,
    url: &str,
    who: &Who,
    id: &str,
    name: &str,
    arguments: Value,
    meta: Value,
) -> Value {
    let mut request = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    for (header, value) in [
        ("x-toolgate-tenant", &who.tenant),
        ("x-toolgate-subject", &who.subject),
        ("x-toolgate-agent", &who.agent),
        ("x-toolgate-scopes", &who.scopes),
    ] {
        if !value.is_empty() {
            request = request.header(header, value.as_str());
        }
    }
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments, "_meta": meta},
    });
    let response = request.json(&body).send().await.expect("the door answers");
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.expect("a JSON-RPC answer");
    answer["result"].clone()
}

/// An audit event with what differs by nature between two calls removed: when, how long, the
/// trace, the run (each door its own), the door, and approval ids.
fn comparable(event: &Value) -> Value {
    let mut event = event.clone();
    let Some(object) = event.as_object_mut() else {
        return event;
    };
    for field in [
        "time",
        "duration_ms",
        "trace_id",
        "span_id",
        "run_id",
        "door",
    ] {
        object.remove(field);
    }
    for field in ["approval_id", "reason"] {
        if let Some(Value::String(text)) = object.get(field) {
            let text = without_approval_ids(text);
            object.insert(field.into(), Value::String(text));
        }
    }
    event
}

/// A call's span, as the two doors must leave it alike: every attribute but the door's name
/// (approval ids, made anew by each call, as `apr_*`), with the span's name and status.
fn call_span(span: &Span) -> (String, BTreeMap<String, String>, i32) {
    let attributes = span
        .attributes
        .iter()
        .filter(|kv| kv.key != "toolgate.door")
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => without_approval_ids(s),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            (kv.key.clone(), value)
        })
        .collect();
    let status = span.status.as_ref().map_or(0, |s| s.code);
    (span.name.clone(), attributes, status)
}

fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.as_str()),
            _ => None,
        })
}

#[test]
fn both_doors_decide_every_generated_call_alike() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Spans go to a real OTLP receiver, so the two doors' spans are compared as exported.
    let collector = rt.block_on(otlp_collector::start());
    let env = Env::default().with("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint());
    let demo = format!("{DEMO_CATALOG}\ntelemetry: {{ batch_delay: 20ms }}\n");
    let server = rt.block_on(TestServer::start_with_env(&demo, &env));
    let client = rt.block_on(server.client());
    let url = format!(
        "http://{}/mcp",
        server.mcp_addr().expect("the demo's MCP door")
    );
    toolgate::tls::install_crypto_provider();
    let http = reqwest::Client::new();
    let next = AtomicUsize::new(0);
    let compared = AtomicUsize::new(0);
    let mut runner = TestRunner::new_with_rng(
        ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let result = runner.run(&cases(), |case: Case| {
        let arguments_text = arguments_json(&case);
        // MCP arguments are a JSON object by the protocol: text that is not one cannot be sent.
        let Ok(Value::Object(arguments)) = serde_json::from_str::<Value>(&arguments_text) else {
            return Ok(());
        };
        let call_id = format!("p{}", next.fetch_add(1, Ordering::Relaxed));
        let who = Who {
            tenant: case.tenant.into(),
            subject: case.subject.into(),
            agent: case.agent.into(),
            scopes: case.scopes.join(","),
            token: None,
        };
        // Each door's keys are its own, so neither replays the other's result.
        let key = |door: &str| {
            case.idempotency_key
                .map(|k| format!("{k}-{door}"))
                .unwrap_or_default()
        };
        let grpc_call = proto::ToolCall {
            call_id: call_id.clone(),
            name: case.tool.into(),
            arguments_json: arguments_text.clone(),
            version: case.version.unwrap_or_default().into(),
            idempotency_key: key("grpc"),
            approval_id: case.approval_id.unwrap_or_default().into(),
        };
        let mut meta = json!({"toolgate/run_id": "parity-mcp"});
        if let Some(version) = case.version {
            meta["toolgate/tool_version"] = json!(version);
        }
        if case.idempotency_key.is_some() {
            meta["toolgate/idempotency_key"] = json!(key("mcp"));
        }
        if let Some(approval_id) = case.approval_id {
            meta["toolgate/approval_id"] = json!(approval_id);
        }
        let mut client = client.clone();
        let (grpc, mcp) = rt.block_on(async {
            // refund_order's quota (5/min) refills by two calls first: both doors' calls of a
            // case meet the same quota. (Only then: stored results last 10 minutes of the
            // clock, and later cases replay them.)
            if case.tool == "refund_order" {
                server.clock.advance(Duration::from_secs(24));
            }
            let request = proto::ExecuteToolRequest {
                call: Some(grpc_call),
                run_id: "parity-grpc".into(),
                step: 0,
                catalog_revision: String::new(),
            };
            let grpc = client
                .execute_tool(who.request(request))
                .await
                .expect("ExecuteTool answers")
                .into_inner()
                .result
                .expect("a result");
            let mcp = mcp_call(
                &http,
                &url,
                &who,
                &call_id,
                case.tool,
                Value::Object(arguments),
                meta,
            )
            .await;
            (grpc, mcp)
        });
        let status = proto::ToolStatus::try_from(grpc.status)
            .map(|s| {
                s.as_str_name()
                    .trim_start_matches("TOOL_STATUS_")
                    .to_owned()
            })
            .unwrap_or_default();
        prop_assert_eq!(
            mcp["_meta"]["toolgate/status"].as_str(),
            Some(status.as_str()),
            "{:?}",
            mcp
        );
        prop_assert_eq!(mcp["isError"].as_bool(), Some(status != "OK"));
        // A refusal's text is the boundary's; an output is the backend's, and a backend that
        // writes (create_ticket numbers its tickets) answers each call anew.
        if status != "OK" || !WRITES.contains(&case.tool) {
            prop_assert_eq!(
                without_approval_ids(mcp["content"][0]["text"].as_str().unwrap_or_default()),
                without_approval_ids(&grpc.model_text)
            );
        }
        prop_assert_eq!(
            mcp["_meta"]["toolgate/error_type"]
                .as_str()
                .unwrap_or_default(),
            grpc.error_type.as_str()
        );
        prop_assert_eq!(
            mcp["_meta"]["toolgate/refused_by"]
                .as_str()
                .unwrap_or_default(),
            grpc.refused_by.as_str()
        );
        prop_assert_eq!(
            mcp["_meta"]["toolgate/version"]
                .as_str()
                .unwrap_or_default(),
            grpc.tool_version.as_str()
        );
        compared.fetch_add(1, Ordering::Relaxed);
        Ok(())
    });
    if let Err(err) = result {
        panic!("{err}");
    }
    assert!(
        compared.load(Ordering::Relaxed) >= 48,
        "too few calls compared"
    );
    // The audit events of each pair differ in the door (and what differs by nature) alone.
    let events = rt.block_on(server.audit_events());
    let of = |run: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["kind"] == "tool_call" && e["run_id"] == run)
            .collect()
    };
    let (grpc, mcp) = (of("parity-grpc"), of("parity-mcp"));
    assert_eq!(grpc.len(), compared.load(Ordering::Relaxed));
    assert_eq!(grpc.len(), mcp.len());
    for (g, m) in grpc.iter().zip(&mcp) {
        assert_eq!(
            (g["door"].as_str(), m["door"].as_str()),
            (Some("grpc"), Some("mcp"))
        );
        assert_eq!(comparable(g), comparable(m));
    }
    // The run reached refusals of many kinds and OK, so the comparison meant something.
    let kinds: std::collections::BTreeSet<&str> = grpc
        .iter()
        .map(|e| e["status"].as_str().unwrap_or_default())
        .collect();
    assert!(kinds.len() >= 5, "{kinds:?}");
    assert!(
        grpc.iter().any(|e| e["idempotent_replay"] == true),
        "no call replayed a stored result"
    );
    // Each pair's spans: alike but for the door.
    server.flush_spans();
    let calls = compared.load(Ordering::Relaxed);
    let is_call = |span: &Span| span.name.starts_with("execute_tool ");
    let spans = rt.block_on(collector.wait_for_spans(
        |spans| spans.iter().filter(|s| is_call(s)).count() >= 2 * calls,
        Duration::from_secs(30),
    ));
    let mut by_door: BTreeMap<(&str, &str), &Span> = BTreeMap::new();
    for span in spans.iter().filter(|s| is_call(s)) {
        let door = attribute(span, "toolgate.door").unwrap_or_default();
        let call_id = attribute(span, "gen_ai.tool.call.id").unwrap_or_default();
        assert!(
            by_door.insert((door, call_id), span).is_none(),
            "two spans of one call: {door} {call_id}"
        );
    }
    let mut pairs = 0;
    for ((door, call_id), grpc_span) in by_door.iter().filter(|((door, _), _)| *door == "grpc") {
        let mcp_span = by_door
            .get(&("mcp", call_id))
            .unwrap_or_else(|| panic!("no MCP span of call {call_id} ({door})"));
        assert_eq!(call_span(grpc_span), call_span(mcp_span), "call {call_id}");
        pairs += 1;
    }
    assert_eq!(
        pairs, calls,
        "every compared call has a span through each door"
    );
    rt.block_on(server.stop());
}

/// A plain `tools/call` (2025-11-25, or 2026-07-28 with its `_meta` and standard headers) is
/// answered by the door itself, not by a per-request rmcp service, and with the very status and
/// JSON rmcp gives: the same call with a `Content-Type` parameter (which rmcp accepts and the
/// plain path leaves to it) gets the same answer, for a result, a refusal and a protocol error.
/// rmcp logs every request it serves ("received request", at debug).
#[tokio::test]
async fn a_plain_tools_call_is_answered_without_rmcp_as_rmcp_answers_it() {
    let spawned = crate::support::binary::spawn_with_env(&[], &[("RUST_LOG", "info,rmcp=debug")]);
    toolgate::tls::install_crypto_provider();
    let http = reqwest::Client::new();
    let url = format!("http://{}/mcp", spawned.mcp_addr);
    let call = call_body;
    let mut cases = Vec::new();
    for modern in [false, true] {
        cases.extend([
            call(
                1,
                "rag_search",
                json!({"query": "refund policy"}),
                json!({}),
                modern,
            ),
            call(2, "no_such_tool", json!({}), json!({}), modern),
            call(
                3,
                "rag_search",
                json!({"query": "x"}),
                json!({"toolgate/step": "a"}),
                modern,
            ),
        ]);
    }
    let mut plain = Vec::new();
    for case in &cases {
        plain.push(mcp_post(&http, &url, "application/json", case).await);
    }
    for (case, plain) in cases.iter().zip(&plain) {
        let by_rmcp = mcp_post(&http, &url, "application/json; charset=utf-8", case).await;
        assert_eq!(plain, &by_rmcp, "{case}");
    }
    for at in [0, 3] {
        assert_eq!(plain[at].2["result"]["_meta"]["toolgate/status"], "OK");
        assert_eq!(
            plain[at + 1].2["result"]["_meta"]["toolgate/error_type"],
            "tool_not_found"
        );
        assert_eq!(
            plain[at + 2].2["error"]["code"],
            -32602,
            "{}",
            plain[at + 2].2
        );
    }
    let logs = crate::support::binary::stop(spawned).await;
    assert_eq!(
        logs.matches(r#""message":"received request""#).count(),
        cases.len(),
        "rmcp served only the calls with a Content-Type parameter"
    );
}

/// Posts a JSON-RPC `body` to the MCP door at `url` as tenant acme (who may write tickets) with
/// this Content-Type (a
/// parameter such as `charset` sends it on to rmcp; plain `application/json` is answered by the
/// door's plain-call path), with the revision's headers; the HTTP status, Content-Type and answer.
async fn mcp_post(
    http: &reqwest::Client,
    url: &str,
    content_type: &'static str,
    body: &Value,
) -> (reqwest::StatusCode, reqwest::header::HeaderValue, Value) {
    let modern = body["params"]["_meta"]
        .get("io.modelcontextprotocol/protocolVersion")
        .is_some();
    let mut request = http
        .post(url)
        .header("content-type", content_type)
        .header("accept", "application/json, text/event-stream")
        .header("x-toolgate-tenant", "acme")
        .header("x-toolgate-scopes", "tickets:write")
        .body(body.to_string());
    request = match modern {
        false => request.header("mcp-protocol-version", "2025-11-25"),
        true => request
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", body["params"]["name"].as_str().unwrap()),
    };
    let response = request.send().await.expect("the door answers");
    let status = response.status();
    let content_type = response.headers()["content-type"].clone();
    let answer: Value = response.json().await.expect("a JSON-RPC answer");
    (status, content_type, answer)
}

/// A `tools/call` body; `modern`: with the `_meta` a 2026-07-28 host sends.
fn call_body(id: u64, name: &str, arguments: Value, mut meta: Value, modern: bool) -> Value {
    if modern {
        meta["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
        meta["io.modelcontextprotocol/clientCapabilities"] = json!({});
        meta["io.modelcontextprotocol/clientInfo"] = json!({"name": "t", "version": "1"});
    }
    json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": name, "arguments": arguments, "_meta": meta},
    })
}

/// Every `toolgate/*` key a host may send, with a value of another type, is a JSON-RPC
/// invalid-params error naming the key — on both revisions, by the plain-call path and by rmcp —
/// never taken as absent; with the right type each acts as the gRPC door's typed field does.
/// (Issue 52, item 6: `toolgate/idempotency_key: 7` was taken as absent, so each retry of
/// `create_ticket` made a new ticket; a number as `catalog_revision` skipped the stale check and
/// `tool_version: 2` ran the default version.)
#[tokio::test]
async fn a_toolgate_meta_value_of_the_wrong_type_is_invalid_params_never_taken_as_absent() {
    let spawned = crate::support::binary::spawn(&[]);
    toolgate::tls::install_crypto_provider();
    let http = reqwest::Client::new();
    let url = format!("http://{}/mcp", spawned.mcp_addr);
    let keys = [
        "toolgate/run_id",
        "toolgate/step",
        "toolgate/catalog_revision",
        "toolgate/idempotency_key",
        "toolgate/approval_id",
        "toolgate/tool_version",
    ];
    let mut id = 0;
    for key in keys {
        let wrong: &[Value] = match key {
            "toolgate/step" => &[json!("1"), json!(-1), json!(1.5), json!(true)],
            _ => &[
                json!(7),
                json!(true),
                json!(["retry-8"]),
                json!({"key": "k"}),
            ],
        };
        for value in wrong {
            for modern in [false, true] {
                for content_type in ["application/json", "application/json; charset=utf-8"] {
                    id += 1;
                    let body = call_body(
                        id,
                        "create_ticket",
                        json!({"title": "printer on fire", "body": "again"}),
                        json!({ key: value }),
                        modern,
                    );
                    let (_, _, answer) = mcp_post(&http, &url, content_type, &body).await;
                    assert_eq!(answer["error"]["code"], -32602, "{key}: {value} {answer}");
                    let message = answer["error"]["message"].as_str().unwrap();
                    assert!(message.contains(key), "{message}");
                }
            }
        }
    }

    // The right types act as the gRPC door's fields do.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", spawned.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let grpc = proto::tool_gate_client::ToolGateClient::new(channel);
    let acme = Who {
        tenant: "acme".into(),
        scopes: "tickets:write".into(),
        ..Who::default()
    };
    let by_grpc = |call: proto::ToolCall| {
        let mut grpc = grpc.clone();
        let request = acme.request(crate::support::execute_request(call));
        async move {
            let result = grpc.execute_tool(request).await.unwrap().into_inner();
            result.result.unwrap()
        }
    };
    let ticket = json!({"title": "printer on fire", "body": "again"});
    for modern in [false, true] {
        // A retried write with its key runs once: the second answer is the first's, replayed.
        let key = format!("retry-{modern}");
        let body = call_body(
            90,
            "create_ticket",
            ticket.clone(),
            json!({"toolgate/idempotency_key": key}),
            modern,
        );
        let (_, _, first) = mcp_post(&http, &url, "application/json", &body).await;
        let (_, _, again) = mcp_post(&http, &url, "application/json", &body).await;
        assert_eq!(first["result"]["_meta"]["toolgate/status"], "OK", "{first}");
        assert_eq!(
            again["result"]["_meta"]["toolgate/idempotent_replay"], true,
            "{again}"
        );
        assert_eq!(first["result"]["content"], again["result"]["content"]);
        let mut call = crate::support::call("create_ticket", &ticket.to_string());
        call.idempotency_key = format!("grpc-{key}");
        let first = by_grpc(call.clone()).await;
        let again = by_grpc(call).await;
        assert!(
            !first.idempotent_replay && again.idempotent_replay,
            "{again:?}"
        );
        assert_eq!(first.model_text, again.model_text);
        // A version and a stale revision are refused alike.
        for (meta, field) in [
            (json!({"toolgate/tool_version": "2"}), "version"),
            (
                json!({"toolgate/catalog_revision": "rev-the-model-never-saw"}),
                "revision",
            ),
        ] {
            let body = call_body(91, "rag_search", json!({"query": "refunds"}), meta, modern);
            let (_, _, by_mcp) = mcp_post(&http, &url, "application/json", &body).await;
            let mut call = crate::support::call("rag_search", r#"{"query": "refunds"}"#);
            let mut turn = crate::support::execute_request(call.clone());
            match field {
                "version" => call.version = "2".into(),
                _ => turn.catalog_revision = "rev-the-model-never-saw".into(),
            }
            turn.call = Some(call);
            let mut grpc = grpc.clone();
            let result = grpc
                .execute_tool(acme.request(turn))
                .await
                .unwrap()
                .into_inner()
                .result
                .unwrap();
            assert!(!result.error_type.is_empty(), "{field}: {result:?}");
            assert_eq!(
                by_mcp["result"]["_meta"]["toolgate/error_type"],
                result.error_type.as_str(),
                "{field}: {by_mcp}"
            );
        }
    }
    crate::support::binary::stop(spawned).await;
}
