//! The listeners under attack (issue 25, item 1): streams without identity hold nothing, a body
//! or a handshake that never comes is cut off, connections are capped per listener and closed
//! when idle, the Unix socket keeps room TCP callers cannot take, and no tenant takes the whole
//! sidecar. Each attack is made with raw HTTP/2 (the h2 crate) against the real server on a
//! port; legitimate callers use the generated gRPC client. Every wait is on an event, bounded by
//! a generous timeout that only a broken server reaches.

use std::{path::Path, time::Duration};

use bytes::Bytes;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tonic::{
    Code,
    transport::{Endpoint, Uri},
};
use toolgate::proto::{ToolStatus, tool_gate_client::ToolGateClient};

use crate::support::{TestServer, call, exec, execute_request, http_get, metric, wait_until, who};

/// Longer than any wait a working server needs; reached only when the behaviour is broken.
const BOUND: Duration = Duration::from_secs(15);

fn catalog(socket: &Path, limits: &str) -> String {
    format!(
        r#"version: 1
identity: {{ dev_identity: true }}
server: {{ unix_socket: {} }}
limits: {{ {limits} }}
tenants: {{ acme: {{}}, globex: {{}} }}
tools:
  - {{ name: wait, description: Waits., risk_level: read_only, timeout: 30s, executor: {{ builtin: slow_task }}, input_schema: {{ type: object, properties: {{ ms: {{ type: integer }} }} }} }}
  - {{ name: echo, description: Echo., risk_level: read_only, executor: {{ builtin: echo }}, input_schema: {{ type: object, properties: {{ text: {{ type: string }} }} }} }}
"#,
        socket.display()
    )
}

/// A gRPC client over the Unix socket.
async fn unix_client(socket: &Path) -> ToolGateClient<tonic::transport::Channel> {
    let path = socket.to_owned();
    let channel = Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .expect("connect over the unix socket");
    ToolGateClient::new(channel)
}

/// A raw HTTP/2 connection; its driver task ends when the connection does.
async fn h2_connect(
    addr: std::net::SocketAddr,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    (send, tokio::spawn(connection))
}

/// Opens an ExecuteTool stream with these metadata and no body: the request stays open for as
/// long as the returned stream is held.
async fn open_stream(
    send: &mut h2::client::SendRequest<Bytes>,
    metadata: &[(&str, &str)],
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let mut request = http::Request::post("http://toolgate/toolgate.v1.ToolGate/ExecuteTool")
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in metadata {
        request = request.header(*name, *value);
    }
    let mut send = send.clone().ready().await.expect("stream slot");
    send.send_request(request.body(()).unwrap(), false)
        .expect("stream opened")
}

/// The gRPC status of a raw response: from its headers (trailers-only) or its trailers.
async fn grpc_status(response: h2::client::ResponseFuture) -> (i32, String) {
    let response = tokio::time::timeout(BOUND, response)
        .await
        .expect("the server answers the stream")
        .expect("a response");
    let read = |headers: &http::HeaderMap| {
        headers.get("grpc-status").map(|code| {
            (
                code.to_str().unwrap().parse::<i32>().unwrap(),
                headers
                    .get("grpc-message")
                    .map(|m| m.to_str().unwrap().to_owned())
                    .unwrap_or_default(),
            )
        })
    };
    if let Some(status) = read(response.headers()) {
        return status;
    }
    let mut body = response.into_body();
    while let Some(chunk) = tokio::time::timeout(BOUND, body.data())
        .await
        .expect("body")
    {
        chunk.expect("data");
    }
    let trailers = tokio::time::timeout(BOUND, body.trailers())
        .await
        .expect("trailers")
        .expect("trailers")
        .expect("trailers sent");
    read(&trailers).expect("grpc-status in the trailers")
}

async fn metrics(server: &TestServer) -> String {
    http_get(server.admin_addr(), "/metrics").await.1
}

/// Waits until the server has closed `tcp`: a read gives end of file or an error.
async fn closed_by_server(mut tcp: TcpStream) {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(BOUND, async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                // The server's SETTINGS and any GOAWAY before it closes.
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("the server closed the connection");
}

#[tokio::test]
async fn streams_without_identity_hold_nothing_and_every_caller_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("toolgate.sock");
    let server = TestServer::start(&catalog(&socket, "max_in_flight: 8")).await;
    // Four connections, eight streams each, no identity, bodies that never end: four times the
    // sidecar's whole in-flight cap.
    let mut attack = Vec::new();
    let mut connections = Vec::new();
    for _ in 0..4 {
        let (mut send, connection) = h2_connect(server.addr).await;
        for _ in 0..8 {
            attack.push(open_stream(&mut send, &[]).await);
        }
        // And a token that does not verify.
        attack.push(open_stream(&mut send, &[("authorization", "Bearer x.y.z")]).await);
        connections.push((send, connection));
    }
    // Each is refused at once, while its body is still open.
    let mut bodies = Vec::new();
    for (response, body) in attack {
        let (code, message) = grpc_status(response).await;
        assert_eq!(code, Code::Unauthenticated as i32, "{message}");
        bodies.push(body);
    }
    // A caller over TCP and the agent on the Unix socket both run their calls meanwhile.
    let mut tcp = server.client().await;
    let r = exec(&mut tcp, &who("acme"), call("echo", r#"{"text":"tcp"}"#)).await;
    assert_eq!((r.status(), r.model_text.as_str()), (ToolStatus::Ok, "tcp"));
    let mut unix = unix_client(&socket).await;
    let r = exec(&mut unix, &who("acme"), call("echo", r#"{"text":"unix"}"#)).await;
    assert_eq!(
        (r.status(), r.model_text.as_str()),
        (ToolStatus::Ok, "unix")
    );
    // Counted, and audited as refused callers.
    let page = metrics(&server).await;
    assert_eq!(
        metric(
            &page,
            "toolgate_rpcs_refused_total",
            &[("listener", "tcp"), ("reason", "unauthenticated")]
        ),
        36.0,
        "{page}"
    );
    server
        .wait_for_audit(|e| e["kind"] == "authentication_failed" && e["peer"].is_string())
        .await;
    drop((bodies, connections));
    server.stop().await;
}

#[tokio::test]
async fn a_body_that_never_arrives_gives_its_slot_back_at_the_body_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("toolgate.sock");
    let server = TestServer::start(&catalog(
        &socket,
        "max_in_flight: 1, in_flight_reserved_for_unix_socket: 0, request_body_timeout: 300ms",
    ))
    .await;
    let (mut send, _connection) = h2_connect(server.addr).await;
    // An identified caller whose body never comes: it holds the only slot, until its timeout.
    let (response, _body) = open_stream(&mut send, &[("x-toolgate-tenant", "acme")]).await;
    let (code, message) = grpc_status(response).await;
    assert_eq!(code, Code::DeadlineExceeded as i32, "{message}");
    assert!(message.contains("request_body_timeout"), "{message}");
    let mut grpc = server.client().await;
    let r = exec(&mut grpc, &who("acme"), call("echo", r#"{"text":"next"}"#)).await;
    assert_eq!(r.status(), ToolStatus::Ok, "the slot was given back");
    let page = metrics(&server).await;
    assert_eq!(
        metric(
            &page,
            "toolgate_rpcs_refused_total",
            &[("listener", "tcp"), ("reason", "body_timeout")]
        ),
        1.0
    );
    server.stop().await;
}

#[tokio::test]
async fn silent_connections_are_closed_at_the_handshake_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("toolgate.sock");
    let server = TestServer::start(&catalog(&socket, "handshake_timeout: 200ms")).await;
    // One sends nothing at all, one half the preface; both are closed, and their descriptors
    // with them.
    let silent = TcpStream::connect(server.addr).await.unwrap();
    let mut half = TcpStream::connect(server.addr).await.unwrap();
    half.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    closed_by_server(silent).await;
    closed_by_server(half).await;
    let page = metrics(&server).await;
    assert_eq!(
        metric(
            &page,
            "toolgate_connections_closed_total",
            &[("listener", "tcp"), ("reason", "handshake_timeout")]
        ),
        2.0
    );
    // A client that does finish its handshake is served.
    let mut grpc = server.client().await;
    let r = exec(&mut grpc, &who("acme"), call("echo", r#"{"text":"ok"}"#)).await;
    assert_eq!(r.status(), ToolStatus::Ok);
    server.stop().await;
}

#[tokio::test]
async fn each_listener_caps_its_connections_and_the_unix_socket_keeps_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("toolgate.sock");
    let server = TestServer::start(&catalog(&socket, "max_connections_per_listener: 2")).await;
    let mut held = vec![server.client().await, server.client().await];
    // The third TCP connection is closed as soon as it is accepted.
    let third = TcpStream::connect(server.addr).await.unwrap();
    closed_by_server(third).await;
    // The agent's socket has its own cap.
    let mut unix = unix_client(&socket).await;
    let r = exec(&mut unix, &who("acme"), call("echo", r#"{"text":"unix"}"#)).await;
    assert_eq!(r.status(), ToolStatus::Ok);
    // The connections already held keep working.
    let r = exec(&mut held[0], &who("acme"), call("echo", r#"{"text":"a"}"#)).await;
    assert_eq!(r.status(), ToolStatus::Ok);
    let page = metrics(&server).await;
    assert_eq!(
        metric(
            &page,
            "toolgate_connections_closed_total",
            &[("listener", "tcp"), ("reason", "over_cap")]
        ),
        1.0
    );
    assert_eq!(
        metric(&page, "toolgate_connections_open", &[("listener", "tcp")]),
        2.0
    );
    assert_eq!(
        metric(&page, "toolgate_connections_open", &[("listener", "unix")]),
        1.0
    );
    drop(held);
    server.stop().await;
}

#[tokio::test]
async fn a_connection_without_calls_is_closed_when_idle_and_one_with_a_call_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("toolgate.sock");
    let server = TestServer::start(&catalog(&socket, "idle_connection_timeout: 300ms")).await;
    // A call running for longer than the idle timeout keeps its connection.
    let mut busy = server.client().await;
    let r = exec(&mut busy, &who("acme"), call("wait", r#"{"ms":900}"#)).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{}", r.error_message);
    // A handshaken connection that never calls is closed by the server.
    let (_send, connection) = h2_connect(server.addr).await;
    tokio::time::timeout(BOUND, connection)
        .await
        .expect("the idle connection was closed")
        .unwrap()
        .ok();
    let page = metrics(&server).await;
    assert!(
        metric(
            &page,
            "toolgate_connections_closed_total",
            &[("listener", "tcp"), ("reason", "idle")]
        ) >= 1.0,
        "{page}"
    );
    // A client whose idle connection was closed reconnects for its next call.
    let r = exec(&mut busy, &who("acme"), call("echo", r#"{"text":"again"}"#)).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{}", r.error_message);
    server.stop().await;
}

#[tokio::test]
async fn the_unix_socket_keeps_slots_tcp_callers_cannot_take() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("toolgate.sock");
    let server = TestServer::start(&catalog(
        &socket,
        "max_in_flight: 4, in_flight_reserved_for_unix_socket: 2",
    ))
    .await;
    let slow = || call("wait", r#"{"ms":30000}"#);
    let mut running = Vec::new();
    for _ in 0..2 {
        let mut grpc = server.client().await;
        running.push(tokio::spawn(async move {
            exec(&mut grpc, &who("acme"), slow()).await
        }));
    }
    wait_until(server.builtins().watch_slow_in_flight(), |n| n == 2).await;
    let mut tcp = server.client().await;
    let err = tcp
        .execute_tool(who("globex").request(execute_request(slow())))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("in_flight_reserved_for_unix_socket"),
        "{err:?}"
    );
    // The agent on the socket still has its two.
    for _ in 0..2 {
        let mut unix = unix_client(&socket).await;
        running.push(tokio::spawn(async move {
            exec(&mut unix, &who("globex"), slow()).await
        }));
    }
    wait_until(server.builtins().watch_slow_in_flight(), |n| n == 4).await;
    let mut unix = unix_client(&socket).await;
    let err = unix
        .execute_tool(who("globex").request(execute_request(slow())))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("limits.max_in_flight)"), "{err:?}");
    for task in running {
        task.abort();
    }
    wait_until(server.builtins().watch_slow_in_flight(), |n| n == 0).await;
    server.stop().await;
}

#[tokio::test]
async fn one_tenant_cannot_take_the_whole_in_flight_cap() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("toolgate.sock");
    let server = TestServer::start(&catalog(
        &socket,
        "max_in_flight: 4, max_in_flight_per_tenant: 2",
    ))
    .await;
    let mut running = Vec::new();
    for _ in 0..2 {
        let mut grpc = server.client().await;
        running.push(tokio::spawn(async move {
            exec(&mut grpc, &who("acme"), call("wait", r#"{"ms":30000}"#)).await
        }));
    }
    wait_until(server.builtins().watch_slow_in_flight(), |n| n == 2).await;
    let mut grpc = server.client().await;
    let err = grpc
        .execute_tool(who("acme").request(execute_request(call("echo", r#"{"text":"x"}"#))))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("max_in_flight_per_tenant"),
        "{err:?}"
    );
    // Another tenant is not held up by the first.
    let r = exec(&mut grpc, &who("globex"), call("echo", r#"{"text":"x"}"#)).await;
    assert_eq!(r.status(), ToolStatus::Ok);
    let page = metrics(&server).await;
    assert_eq!(
        metric(
            &page,
            "toolgate_rpcs_refused_total",
            &[("listener", "tcp"), ("reason", "tenant_share")]
        ),
        1.0
    );
    for task in running {
        task.abort();
    }
    wait_until(server.builtins().watch_slow_in_flight(), |n| n == 0).await;
    server.stop().await;
}

/// One HTTP/1.1 request on `tcp` (kept open), and the status line of its answer.
async fn mcp_post(tcp: &mut TcpStream, body: &str) -> String {
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\nmcp-protocol-version: 2025-11-25\r\nx-toolgate-tenant: acme\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(BOUND, async {
        // The answer's head and its JSON body, whose end is its closing brace.
        while !answer.ends_with(b"}") {
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(n > 0, "the connection closed before the answer");
            answer.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("an answer");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.lines().next().unwrap_or_default().to_owned()
}

/// Waits (bounded) until the door holds `open` connections: a closed connection gives its place
/// back when the server has dropped it, a moment after its peer sees it closed.
async fn open_mcp_connections_reach(server: &TestServer, open: f64) {
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let page = metrics(server).await;
        if metric(&page, "toolgate_connections_open", &[("listener", "mcp")]) == open {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn mcp_catalog(socket: &Path, limits: &str) -> String {
    catalog(socket, limits).replace(
        &format!("server: {{ unix_socket: {} }}", socket.display()),
        &format!("server: {{ unix_socket: {}, mcp: {{}} }}", socket.display()),
    )
}

#[tokio::test]
async fn the_mcp_listener_caps_its_connections_and_closes_silent_ones() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("toolgate.sock");
    let server = TestServer::start(&mcp_catalog(
        &socket,
        "max_connections_per_listener: 2, handshake_timeout: 300ms",
    ))
    .await;
    let mcp = server.mcp_addr().expect("the MCP door");
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    // Two connections that keep calling hold the door's two places.
    let mut first = TcpStream::connect(mcp).await.unwrap();
    let mut second = TcpStream::connect(mcp).await.unwrap();
    assert_eq!(mcp_post(&mut first, list).await, "HTTP/1.1 200 OK");
    assert_eq!(mcp_post(&mut second, list).await, "HTTP/1.1 200 OK");
    // A third is closed as soon as it is accepted; the gRPC listener's own places are untouched.
    closed_by_server(TcpStream::connect(mcp).await.unwrap()).await;
    let mut grpc = server.client().await;
    let r = exec(&mut grpc, &who("acme"), call("echo", r#"{"text":"grpc"}"#)).await;
    assert_eq!(r.status(), ToolStatus::Ok);
    // One that never sends its request is closed at the handshake timeout, giving its place back.
    drop(second);
    open_mcp_connections_reach(&server, 1.0).await;
    let silent = TcpStream::connect(mcp).await.unwrap();
    closed_by_server(silent).await;
    open_mcp_connections_reach(&server, 1.0).await;
    let mut next = TcpStream::connect(mcp).await.unwrap();
    assert_eq!(mcp_post(&mut next, list).await, "HTTP/1.1 200 OK");
    assert_eq!(mcp_post(&mut first, list).await, "HTTP/1.1 200 OK");
    let page = metrics(&server).await;
    assert_eq!(
        metric(
            &page,
            "toolgate_connections_closed_total",
            &[("listener", "mcp"), ("reason", "over_cap")]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &page,
            "toolgate_connections_closed_total",
            &[("listener", "mcp"), ("reason", "handshake_timeout")]
        ),
        1.0
    );
    assert_eq!(
        metric(&page, "toolgate_connections_open", &[("listener", "mcp")]),
        2.0
    );
    server.stop().await;
}
