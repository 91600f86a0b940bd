//! The http backend against hostile and mistaken configurations: redirects that leave the origin,
//! private ranges opened one CIDR at a time, cloud metadata that stays closed, URLs the client
//! cannot use, and the request id and trace context every upstream receives.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, atomic::Ordering},
};

use axum::{Router, http::HeaderMap, http::StatusCode, response::IntoResponse, routing::post};
use toolgate::proto::ToolStatus;

use crate::{
    executors::{counting_listener, http_catalog, upstream},
    support::{TestServer, call, exec, execute_request, valid_traceparent, who},
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
         \x20 metadata_mapped:\n    url: http://[::ffff:169.254.169.254]:{cport}\n    allow_schemes: [http]\n    allow_private_cidrs: [\"169.254.0.0/16\"]\n",
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
            &toolgate::config::Env::default(),
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
