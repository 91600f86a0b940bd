//! The http backend against a real upstream (an in-process axum server): what it sends, how
//! its answers are classed, timeouts and cancels, SSRF refusals, load-time checks, and the
//! upstream's concurrency cap, across reloads too.

use std::{sync::atomic::Ordering, time::Duration};

use serde_json::{Value, json};
use toolgate::{proto::ToolStatus, settings::Env};

use crate::support::{TestServer, call, exec, execute_request, who};

use super::{Seen, counting_listener, http_catalog, upstream};

#[tokio::test]
async fn http_posts_bound_arguments_with_request_id_trace_context_and_secret_headers() {
    let (addr, seen) = upstream().await;
    let upstreams = format!(
        "  orders:\n    url: http://{addr}\n    allow_schemes: [http]\n    allow_private_addresses: true\n    headers:\n      authorization: {{ env: ORDERS_TOKEN, prefix: \"Bearer \" }}\n      x-team: {{ value: support }}\n"
    );
    let mut yaml = http_catalog(&upstreams, &[("lookup", "orders", "/echo")]);
    yaml = yaml.replace("input_schema: { type: object } }", "input_schema: { type: object, properties: { id: { type: string }, tenant: { type: string } } }, bind: { tenant: \"${caller.tenant}\" } }");
    let server =
        TestServer::start_with_env(&yaml, &Env::default().with("ORDERS_TOKEN", "s3cret-token"))
            .await;
    let mut client = server.client().await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut request = who("acme").request(execute_request(call("lookup", r#"{"id":"o-1"}"#)));
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    let result = client
        .execute_tool(request)
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&result.model_text).unwrap(),
        json!({"id": "o-1", "tenant": "acme"})
    );
    let headers = seen.headers.lock().unwrap()[0].clone();
    assert_eq!(headers["x-toolgate-call-id"], result.call_id.as_str());
    assert_ne!(headers["x-request-id"], result.call_id.as_str());
    assert_eq!(headers["traceparent"], traceparent);
    assert_eq!(headers["authorization"], "Bearer s3cret-token");
    assert_eq!(headers["x-team"], "support");
    assert_eq!(headers["content-type"], "application/json");
    let audit = std::fs::read_to_string(&server.audit_path).unwrap_or_default()
        + &format!("{:?}", server.audit_events().await);
    assert!(!audit.contains("s3cret-token"));
    server.stop().await;
}

#[tokio::test]
async fn http_status_classes_oversized_bodies_and_redirects() {
    let (addr, _seen) = upstream().await;
    let upstreams = format!(
        "  svc:\n    url: http://{addr}\n    allow_schemes: [http]\n    allow_private_addresses: true\n    max_response_bytes: 1024\n"
    );
    let yaml = http_catalog(
        &upstreams,
        &[
            ("c404", "svc", "/status/404"),
            ("c503", "svc", "/status/503"),
            ("big", "svc", "/big"),
            ("away", "svc", "/redirect-away"),
            ("same", "svc", "/redirect-same"),
        ],
    );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    let r = exec(&mut client, &who("acme"), call("c404", "{}")).await;
    assert_eq!(
        (r.status(), r.error_type.as_str(), r.retryable),
        (ToolStatus::Error, "tool_failed", false)
    );
    assert!(
        r.error_message
            .contains("404 Not Found: nope: order is closed"),
        "{}",
        r.error_message
    );
    let r = exec(&mut client, &who("acme"), call("c503", "{}")).await;
    assert_eq!(
        (r.status(), r.error_type.as_str(), r.retryable),
        (ToolStatus::Error, "upstream_unavailable", true)
    );
    let r = exec(&mut client, &who("acme"), call("big", "{}")).await;
    assert_eq!(r.status(), ToolStatus::Error);
    assert!(
        r.error_message.contains("more than 1024 bytes"),
        "{}",
        r.error_message
    );
    let r = exec(&mut client, &who("acme"), call("away", "{}")).await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Denied, "destination_refused"),
        "{r:?}"
    );
    assert!(r.error_message.contains("another host"));
    let r = exec(&mut client, &who("acme"), call("same", "{}")).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    // No internal addresses reach the model.
    assert!(!r.model_text.contains("127.0.0.1"));
    server.stop().await;
}

#[tokio::test]
async fn http_timeouts_and_client_cancels_close_the_upstream_request() {
    let (addr, seen) = upstream().await;
    let upstreams = format!(
        "  svc:\n    url: http://{addr}\n    allow_schemes: [http]\n    allow_private_addresses: true\n"
    );
    let yaml = http_catalog(&upstreams, &[("slow", "svc", "/slow")])
        .replace("timeout: 2s", "timeout: 300ms");
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    let r = exec(&mut client, &who("acme"), call("slow", "{}")).await;
    assert_eq!(r.status(), ToolStatus::Timeout);
    let mut aborted = seen.aborted.subscribe();
    tokio::time::timeout(Duration::from_secs(10), aborted.wait_for(|n| *n >= 1))
        .await
        .expect("upstream saw the request abandoned")
        .unwrap();

    // A client cancel: drop the call while the upstream is working on it.
    let yaml = http_catalog(&format!("  svc:\n    url: http://{addr}\n    allow_schemes: [http]\n    allow_private_addresses: true\n"), &[("slow", "svc", "/slow")]).replace("timeout: 2s", "timeout: 20s");
    let server2 = TestServer::start(&yaml).await;
    let mut client2 = server2.client().await;
    let before = *seen.aborted.borrow();
    let mut started = seen.slow_started.subscribe();
    let started_before = *started.borrow();
    let pending =
        tokio::spawn(async move { exec(&mut client2, &who("acme"), call("slow", "{}")).await });
    tokio::time::timeout(
        Duration::from_secs(10),
        started.wait_for(|n| *n > started_before),
    )
    .await
    .expect("upstream got the request")
    .unwrap();
    pending.abort();
    tokio::time::timeout(Duration::from_secs(10), aborted.wait_for(|n| *n > before))
        .await
        .expect("upstream saw the cancel")
        .unwrap();
    let event = server2.wait_for_audit(|e| e["tool"] == "slow").await;
    assert_eq!(event["status"], "CANCELLED");
    server.stop().await;
    server2.stop().await;
}

#[tokio::test]
async fn ssrf_refusals_happen_before_any_connection() {
    let (addr, accepted) = counting_listener().await;
    let port = addr.port();
    let upstreams = format!(
        "  loopback:\n    url: http://127.0.0.1:{port}\n    allow_schemes: [http]\n  mapped:\n    url: http://[::ffff:127.0.0.1]:{port}\n    allow_schemes: [http]\n  named:\n    url: http://internal.test:{port}\n    allow_schemes: [http]\n    resolve: {{ internal.test: [\"127.0.0.1\"] }}\n  metadata:\n    url: http://metadata.test:{port}\n    allow_schemes: [http]\n    resolve: {{ metadata.test: [\"169.254.169.254\"] }}\n"
    );
    let yaml = http_catalog(
        &upstreams,
        &[
            ("a", "loopback", ""),
            ("b", "mapped", ""),
            ("c", "named", ""),
            ("d", "metadata", ""),
        ],
    );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    for (tool, why) in [
        ("a", "loopback"),
        ("b", "loopback"),
        ("c", "loopback"),
        ("d", "link-local"),
    ] {
        let r = exec(&mut client, &who("acme"), call(tool, "{}")).await;
        assert_eq!(
            (r.status(), r.error_type.as_str()),
            (ToolStatus::Denied, "destination_refused"),
            "{tool}: {r:?}"
        );
        assert!(r.error_message.contains(why), "{tool}: {}", r.error_message);
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "a refused upstream was connected to"
    );
    server.stop().await;
}

#[tokio::test]
async fn scheme_rules_and_upstream_names_are_checked_at_load() {
    let base = "version: 1\nidentity: { dev_identity: true }\ntenants: { acme: {} }\n";
    let load = |yaml: String| {
        toolgate::config::Config::from_yaml(
            &yaml,
            "c.yaml",
            std::path::Path::new("."),
            &Env::default(),
        )
        .unwrap_err()
    };
    let err = load(format!(
        "{base}upstreams:\n  u: {{ url: \"http://example.com\" }}\ntools: []\n"
    ));
    assert_eq!(err.path, "upstreams.u.url");
    assert!(err.message.contains("not in allow_schemes"), "{err}");
    let err = load(format!(
        "{base}tools:\n  - {{ name: t, description: d, risk_level: read_only, executor: {{ http: {{ upstream: nope }} }}, input_schema: {{ type: object }} }}\n"
    ));
    assert_eq!(err.path, "tools[0].executor.http.upstream");
    let err = load(format!(
        "{base}upstreams:\n  u: {{ url: \"https://example.com\", headers: {{ authorization: {{ env: MISSING_TOKEN }} }} }}\ntools: []\n"
    ));
    assert!(err.message.contains("MISSING_TOKEN is not set"), "{err}");
}

#[tokio::test]
async fn concurrency_caps_refuse_at_once_and_unreachable_upstreams_are_retryable() {
    let (addr, seen) = upstream().await;
    let (_refusing, closed) = crate::support::refusing_port();
    let upstreams = format!(
        "  svc:\n    url: http://{addr}\n    allow_schemes: [http]\n    allow_private_addresses: true\n    max_concurrency: 1\n  down:\n    url: http://{closed}\n    allow_schemes: [http]\n    allow_private_addresses: true\n"
    );
    // The first call holds the upstream's one slot for up to 30 s, so the second can only
    // be refused (or, were it queued, wait).
    let yaml = http_catalog(
        &upstreams,
        &[("slow", "svc", "/slow"), ("gone", "down", "")],
    )
    .replace("timeout: 2s", "timeout: 30s");
    let server = TestServer::start(&yaml).await;
    let client = server.client().await;
    // The first call is at the upstream: it holds the slot.
    let first = held_at_the_upstream(&client, &seen, "slow").await;
    let mut c = client.clone();
    let second = exec(&mut c, &who("acme"), call("slow", "{}")).await;
    assert_eq!(
        (
            second.status(),
            second.error_type.as_str(),
            second.retryable
        ),
        (ToolStatus::Unavailable, "overloaded", true),
        "{second:?}"
    );
    // Refused at once, not queued: the answer came while the first call still held the slot.
    assert!(!first.is_finished(), "the second call waited for the first");
    assert_eq!(
        *seen.slow_started.borrow(),
        1,
        "the second call reached the upstream"
    );
    first.abort();
    let mut c = client.clone();
    let gone = exec(&mut c, &who("acme"), call("gone", "{}")).await;
    assert_eq!(
        (gone.status(), gone.error_type.as_str(), gone.retryable),
        (ToolStatus::Error, "upstream_unavailable", true),
        "{gone:?}"
    );
    server.stop().await;
}

/// The upstreams' live clients are the executors', not the catalog's: a reload hands an unchanged
/// cap's slots on to the new clients (a call already running still holds one), and the next
/// call runs on the reloaded settings (a new header).
#[tokio::test]
async fn an_upstreams_slots_carry_over_a_reload_and_its_new_settings_apply() {
    let (addr, seen) = upstream().await;
    let upstreams = |team: &str| {
        format!(
            "  svc:\n    url: http://{addr}\n    allow_schemes: [http]\n    allow_private_addresses: true\n    max_concurrency: 1\n    headers: {{ x-team: {{ value: {team} }} }}\n"
        )
    };
    let catalog = |team: &str| {
        http_catalog(
            &upstreams(team),
            &[("slow", "svc", "/slow"), ("look", "svc", "/echo")],
        )
        .replace("timeout: 2s", "timeout: 30s")
    };
    let server = TestServer::start_file(&catalog("support")).await;
    let client = server.client().await;
    // The first call is at the upstream: it holds the slot.
    let first = held_at_the_upstream(&client, &seen, "slow").await;
    // The upstream's header changes, its cap does not.
    server.write_catalog(&server.catalog_file(), &catalog("billing"));
    server.reload().await.expect("reloaded");
    let mut c = client.clone();
    let second = exec(&mut c, &who("acme"), call("look", "{}")).await;
    assert_eq!(
        (second.status(), second.error_type.as_str()),
        (ToolStatus::Unavailable, "overloaded"),
        "a reload let a second call past an upstream's cap of one: {second:?}"
    );
    // The first call ends (its client goes away); its slot comes back.
    first.abort();
    let mut aborted = seen.aborted.subscribe();
    tokio::time::timeout(Duration::from_secs(10), aborted.wait_for(|n| *n >= 1))
        .await
        .expect("the first call was cancelled at the upstream")
        .unwrap();
    // The slot was given back as the sidecar dropped the request, before its connection closed.
    let third = exec(&mut c, &who("acme"), call("look", "{}")).await;
    assert_eq!(third.status(), ToolStatus::Ok, "{third:?}");
    let last_team = seen
        .headers
        .lock()
        .unwrap()
        .last()
        .and_then(|h| h.get("x-team"))
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(
        last_team.as_deref(),
        Some("billing"),
        "the call after the reload ran on the reloaded upstream"
    );
    server.stop().await;
}

/// A call of `tool` (an upstream's `/slow`) started and waiting at the upstream.
async fn held_at_the_upstream(
    client: &toolgate::proto::tool_gate_client::ToolGateClient<tonic::transport::Channel>,
    seen: &Seen,
    tool: &str,
) -> tokio::task::JoinHandle<toolgate::proto::ToolResult> {
    let mut started = seen.slow_started.subscribe();
    let before = *started.borrow();
    let running = tokio::spawn({
        let mut c = client.clone();
        let call = call(tool, "{}");
        async move { exec(&mut c, &who("acme"), call).await }
    });
    tokio::time::timeout(Duration::from_secs(10), started.wait_for(|n| *n > before))
        .await
        .expect("the call reached the upstream")
        .unwrap();
    running
}
