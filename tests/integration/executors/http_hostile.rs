//! The http backend against hostile and mistaken configurations: redirects that leave the origin,
//! private ranges opened one CIDR at a time, cloud metadata that stays closed, URLs the client
//! cannot use, the request id and trace context every upstream receives, and writes whose upstream
//! failed after receiving them, which must never be written twice.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex, atomic::Ordering},
};

use axum::{Router, http::HeaderMap, http::StatusCode, response::IntoResponse, routing::post};
use toolgate::proto::ToolStatus;

use crate::{
    executors::{counting_listener, http_catalog, upstream},
    support::{TestServer, call, exec, execute_request, refusing_port, valid_traceparent, who},
};

/// An upstream whose routes redirect to the given targets, recording the headers it saw.
async fn redirecting_upstream(
    routes: &[(&str, String)],
) -> (SocketAddr, Arc<Mutex<Vec<HeaderMap>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut app = Router::new();
    for (path, location) in routes {
        let location = location.clone();
        let seen = seen.clone();
        app =
            app.route(
                path,
                post(move |headers: HeaderMap| {
                    let location = location.clone();
                    seen.lock().unwrap().push(headers);
                    async move {
                        (StatusCode::TEMPORARY_REDIRECT, [("location", location)]).into_response()
                    }
                }),
            );
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

#[tokio::test]
async fn redirects_keep_to_the_same_origin_so_no_header_leaves_it() {
    // Another port on the same host (the reported leak), and another scheme and port, each with a
    // listener that counts connections: a followed redirect would show up there.
    let (other_port, other_port_accepted) = counting_listener().await;
    let (tls_port, tls_port_accepted) = counting_listener().await;
    let (addr, seen) = redirecting_upstream(&[
        (
            "/to-other-port",
            format!("http://127.0.0.1:{}/echo", other_port.port()),
        ),
        (
            "/to-https",
            format!("https://127.0.0.1:{}/echo", tls_port.port()),
        ),
    ])
    .await;
    let upstreams = format!(
        "  svc:\n    url: http://{addr}\n    allow_schemes: [http, https]\n    allow_private_addresses: true\n    headers:\n      x-api-key: {{ value: s3cret-key }}\n"
    );
    let yaml = http_catalog(
        &upstreams,
        &[
            ("port", "svc", "/to-other-port"),
            ("scheme", "svc", "/to-https"),
        ],
    );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    for tool in ["port", "scheme"] {
        let r = exec(&mut client, &who("acme"), call(tool, "{}")).await;
        assert_eq!(
            (r.status(), r.error_type.as_str(), r.retryable),
            (ToolStatus::Denied, "destination_refused", false),
            "{tool}: {r:?}"
        );
        assert!(
            r.error_message.contains("another origin"),
            "{tool}: {}",
            r.error_message
        );
    }
    // The upstream itself got the key (it is the configured origin)…
    assert_eq!(seen.lock().unwrap().len(), 2);
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .all(|h| h["x-api-key"] == "s3cret-key")
    );
    // …and nothing was sent anywhere else, so no header either.
    assert_eq!(
        other_port_accepted.load(Ordering::SeqCst),
        0,
        "followed to another port"
    );
    assert_eq!(
        tls_port_accepted.load(Ordering::SeqCst),
        0,
        "followed to another scheme"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_cidr_allow_list_opens_one_private_range_and_metadata_stays_closed() {
    let (addr, _seen) = upstream().await;
    let (closed, accepted) = counting_listener().await;
    let port = addr.port();
    let upstreams = format!(
        "  one_host:\n    url: http://127.0.0.1:{port}\n    allow_schemes: [http]\n    allow_private_cidrs: [\"127.0.0.1/32\"]\n\
         \x20 named:\n    url: http://internal.test:{port}\n    allow_schemes: [http]\n    resolve: {{ internal.test: [\"127.0.0.1\"] }}\n    allow_private_cidrs: [\"127.0.0.0/8\"]\n\
         \x20 other_range:\n    url: http://127.0.0.1:{cport}\n    allow_schemes: [http]\n    allow_private_cidrs: [\"10.1.2.0/24\", \"127.0.0.2/32\"]\n\
         \x20 metadata_all_private:\n    url: http://metadata.test:{cport}\n    allow_schemes: [http]\n    resolve: {{ metadata.test: [\"169.254.169.254\"] }}\n    allow_private_addresses: true\n\
         \x20 metadata_range:\n    url: http://metadata.test:{cport}\n    allow_schemes: [http]\n    resolve: {{ metadata.test: [\"169.254.169.254\"] }}\n    allow_private_cidrs: [\"169.254.0.0/16\"]\n\
         \x20 metadata_v6:\n    url: http://[fd00:ec2::254]:{cport}\n    allow_schemes: [http]\n    allow_private_addresses: true\n\
         \x20 metadata_mapped:\n    url: http://[::ffff:169.254.169.254]:{cport}\n    allow_schemes: [http]\n    allow_private_cidrs: [\"169.254.0.0/16\"]\n\
         \x20 metadata_pod_identity:\n    url: http://pod-identity.test:{cport}\n    allow_schemes: [http]\n    resolve: {{ pod-identity.test: [\"169.254.170.23\"] }}\n    allow_private_addresses: true\n\
         \x20 metadata_pod_identity_v6:\n    url: http://[fd00:ec2::23]:{cport}\n    allow_schemes: [http]\n    allow_private_cidrs: [\"fd00::/8\"]\n\
         \x20 metadata_oracle:\n    url: http://oracle.test:{cport}\n    allow_schemes: [http]\n    resolve: {{ oracle.test: [\"192.0.0.192\"] }}\n    allow_private_cidrs: [\"192.0.0.0/24\"]\n\
         \x20 metadata_oracle_all_private:\n    url: http://[::ffff:192.0.0.192]:{cport}\n    allow_schemes: [http]\n    allow_private_addresses: true\n",
        cport = closed.port()
    );
    let yaml = http_catalog(
        &upstreams,
        &[
            ("a", "one_host", "/echo"),
            ("b", "named", "/echo"),
            ("c", "other_range", ""),
            ("d", "metadata_all_private", ""),
            ("e", "metadata_range", ""),
            ("f", "metadata_v6", ""),
            ("g", "metadata_mapped", ""),
            ("h", "metadata_pod_identity", ""),
            ("i", "metadata_pod_identity_v6", ""),
            ("j", "metadata_oracle", ""),
            ("k", "metadata_oracle_all_private", ""),
        ],
    );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    for tool in ["a", "b"] {
        let r = exec(&mut client, &who("acme"), call(tool, r#"{"n":1}"#)).await;
        assert_eq!(r.status(), ToolStatus::Ok, "{tool}: {r:?}");
    }
    for (tool, why) in [
        ("c", "loopback"),
        ("d", "metadata"),
        ("e", "metadata"),
        ("f", "metadata"),
        ("g", "metadata"),
        ("h", "metadata"),
        ("i", "metadata"),
        ("j", "metadata"),
        ("k", "metadata"),
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
async fn cidr_entries_and_urls_the_client_cannot_use_are_refused_at_load() {
    let base = "version: 1\nidentity: { dev_identity: true }\ntenants: { acme: {} }\n";
    let load = |upstream: &str| {
        toolgate::config::Config::from_yaml(
            &format!("{base}upstreams:\n  u: {upstream}\ntools: []\n"),
            "c.yaml",
            std::path::Path::new("."),
            &toolgate::settings::Env::default(),
        )
        .unwrap_err()
    };
    let err = load(r#"{ url: "https://example.com", allow_private_cidrs: ["10.0.0.0/33"] }"#);
    assert_eq!(err.path, "upstreams.u.allow_private_cidrs[0]", "{err}");
    // A host the URL parser takes but no HTTP request can carry: today it would fail every call
    // as a retryable outage, so it is a load error.
    let err = load(r#"{ url: "https://ex{ample.com/api" }"#);
    assert_eq!(err.path, "upstreams.u.url", "{err}");
    let err = load(r#"{ url: "https://example.com:0/api" }"#);
    assert_eq!(err.path, "upstreams.u.url", "{err}");
}

/// A version-4 UUID in its usual text form.
fn uuid_v4(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.iter().map(|g| g.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
        && groups[2].starts_with('4')
}

#[tokio::test]
async fn every_call_has_its_own_request_id_and_a_valid_traceparent() {
    let (addr, seen) = upstream().await;
    let upstreams = format!(
        "  svc:\n    url: http://{addr}\n    allow_schemes: [http]\n    allow_private_addresses: true\n"
    );
    let server = TestServer::start(&http_catalog(&upstreams, &[("lookup", "svc", "/echo")])).await;
    let mut client = server.client().await;
    // Two calls without a call id (both get tool_step_0_0) and without trace context.
    let first = exec(&mut client, &who("acme"), call("lookup", "{}")).await;
    let second = exec(&mut client, &who("acme"), call("lookup", "{}")).await;
    // One with a malformed traceparent.
    let mut request = who("acme").request(execute_request(call("lookup", "{}")));
    request
        .metadata_mut()
        .insert("traceparent", "00-not-a-trace-01".parse().unwrap());
    let third = client
        .execute_tool(request)
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    for r in [&first, &second, &third] {
        assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
        assert_eq!(r.call_id, "tool_step_0_0");
    }
    let headers = seen.headers.lock().unwrap().clone();
    assert_eq!(headers.len(), 3);
    let text = |h: &HeaderMap, name: &str| {
        h.get(name)
            .unwrap_or_else(|| panic!("no {name} header"))
            .to_str()
            .unwrap()
            .to_owned()
    };
    let request_ids: Vec<String> = headers.iter().map(|h| text(h, "x-request-id")).collect();
    assert!(request_ids.iter().all(|id| uuid_v4(id)), "{request_ids:?}");
    assert!(
        request_ids[0] != request_ids[1] && request_ids[1] != request_ids[2],
        "{request_ids:?}"
    );
    for h in &headers {
        assert_eq!(text(h, "x-toolgate-call-id"), "tool_step_0_0");
    }
    let traceparents: Vec<String> = headers.iter().map(|h| text(h, "traceparent")).collect();
    assert!(
        traceparents.iter().all(|t| valid_traceparent(t)),
        "{traceparents:?}"
    );
    // Fresh ones: a new trace per call, never the malformed value.
    assert_ne!(traceparents[0][3..35], traceparents[1][3..35]);
    assert_ne!(traceparents[2], "00-not-a-trace-01");
    server.stop().await;
}

/// Complete requests an upstream received, by path: each one a write that reached it.
type Received = Arc<Mutex<HashMap<String, usize>>>;

/// A bare HTTP/1.1 upstream that reads each request whole (headers and `content-length` body),
/// counts it by path, and then answers by path: `/fail500` with a 500, `/break` by closing the
/// connection without a word, anything else 200 `{}`. The upstream of a write that happened and
/// was then reported as failed.
async fn failing_writes_upstream() -> (SocketAddr, Received) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received: Received = Arc::default();
    let counts = received.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counts = counts.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                // Bounded: a request of the tests' size; a client that stops sending is dropped.
                let head_end = loop {
                    if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) if buffer.len() + n > 1 << 20 => return,
                        Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
                let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while buffer.len() < head_end + length {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                    }
                }
                *counts.lock().unwrap().entry(path.clone()).or_default() += 1;
                let answer: &[u8] = match path.as_str() {
                    "/fail500" => b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    // The write happened; the answer never comes.
                    "/break" => return,
                    _ => b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                };
                let _ = stream.write_all(answer).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, received)
}

/// A tool of `risk_level` that POSTs to `path` of `upstream`.
fn http_tool_line(name: &str, risk_level: &str, upstream: &str, path: &str) -> String {
    format!(
        "  - {{ name: {name}, description: d, risk_level: {risk_level}, timeout: 5s, executor: {{ http: {{ upstream: {upstream}, path: \"{path}\" }} }}, input_schema: {{ type: object }} }}\n"
    )
}

fn keyed(tool: &str, key: &str) -> toolgate::proto::ToolCall {
    toolgate::proto::ToolCall {
        idempotency_key: key.into(),
        ..call(tool, r#"{"amount":1}"#)
    }
}

#[tokio::test]
async fn a_write_whose_upstream_failed_after_receiving_it_is_an_unknown_outcome_written_once() {
    let (addr, received) = failing_writes_upstream().await;
    let (_refusing, closed) = refusing_port();
    let yaml = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\nupstreams:\n  svc:\n    url: http://{addr}\n    allow_schemes: [http]\n    allow_private_addresses: true\n  down:\n    url: http://{closed}\n    allow_schemes: [http]\n    allow_private_addresses: true\ntools:\n{}{}{}{}",
        http_tool_line("write_500", "write_draft", "svc", "/fail500"),
        http_tool_line("write_broken", "write_draft", "svc", "/break"),
        http_tool_line("read_500", "read_only", "svc", "/fail500"),
        http_tool_line("write_down", "write_draft", "down", ""),
    );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;

    // The upstream wrote, then answered 500 or broke the connection: the outcome is unknown, so
    // the result is not retryable and the key keeps it. The retry with the same key replays it.
    for (tool, path) in [("write_500", "/fail500"), ("write_broken", "/break")] {
        let key = format!("key-{tool}");
        let first = exec(&mut client, &who("acme"), keyed(tool, &key)).await;
        assert_eq!(
            (
                first.status(),
                first.error_type.as_str(),
                first.retryable,
                first.idempotent_replay
            ),
            (ToolStatus::Error, "upstream_unavailable", false, false),
            "{tool}: {first:?}"
        );
        assert!(
            first.error_message.contains("the outcome is unknown"),
            "{tool}: {}",
            first.error_message
        );
        let retry = exec(&mut client, &who("acme"), keyed(tool, &key)).await;
        assert_eq!(
            (retry.status(), retry.retryable, retry.idempotent_replay),
            (ToolStatus::Error, false, true),
            "{tool}: {retry:?}"
        );
        assert_eq!(
            received.lock().unwrap().get(path).copied(),
            Some(1),
            "{tool} wrote more than once"
        );
        received.lock().unwrap().clear();
    }

    // A read-only tool's 500 stays retryable, and its key is released for the retry.
    let key = "key-read";
    for attempt in 1..=2 {
        let r = exec(&mut client, &who("acme"), keyed("read_500", key)).await;
        assert_eq!(
            (r.error_type.as_str(), r.retryable, r.idempotent_replay),
            ("upstream_unavailable", true, false),
            "attempt {attempt}: {r:?}"
        );
    }
    assert_eq!(received.lock().unwrap().get("/fail500").copied(), Some(2));

    // A write whose upstream refused the connection never reached it: retryable, key released.
    for attempt in 1..=2 {
        let r = exec(&mut client, &who("acme"), keyed("write_down", "key-down")).await;
        assert_eq!(
            (
                r.error_type.as_str(),
                r.retryable,
                r.idempotent_replay,
                r.error_message.contains("unknown")
            ),
            ("upstream_unavailable", true, false, false),
            "attempt {attempt}: {r:?}"
        );
    }
    server.stop().await;
}
