//! The http, process and mcp backends against real peers: an in-process HTTP server, real
//! programs, and real MCP servers from PyPI and npm.

pub(crate) mod a2a;
pub(crate) mod credentials;
pub(crate) mod dns;
pub(crate) mod documented;
pub(crate) mod http;
pub(crate) mod http_hostile;
pub(crate) mod mcp;
pub(crate) mod mcp_hostile;
pub(crate) mod pins;
pub(crate) mod process_backend;
pub(crate) mod rest;

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::Bytes,
    extract::Path,
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
    routing::post,
};
use serde_json::{Value, json};
use tokio::sync::watch;
use toolgate::{proto::ToolStatus, settings::Env};

use crate::support::python;
use crate::support::{TestServer, call, exec, execute_request, who};

/// Requests an upstream saw.
#[derive(Clone, Default)]
pub(crate) struct Seen {
    pub(crate) headers: Arc<Mutex<Vec<HeaderMap>>>,
    bodies: Arc<Mutex<Vec<Value>>>,
    /// Slow handlers started.
    slow_started: Arc<watch::Sender<usize>>,
    /// Slow handlers dropped before finishing: the client went away.
    aborted: Arc<watch::Sender<usize>>,
}

/// Counts its drop unless disarmed.
struct DropSignal(Arc<watch::Sender<usize>>, bool);

impl Drop for DropSignal {
    fn drop(&mut self) {
        if self.1 {
            self.0.send_modify(|n| *n += 1);
        }
    }
}

pub(crate) async fn upstream() -> (SocketAddr, Seen) {
    let seen = Seen::default();
    let s = seen.clone();
    let record = move |headers: HeaderMap, body: Bytes| {
        let s = s.clone();
        async move {
            s.headers.lock().unwrap().push(headers);
            let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            s.bodies.lock().unwrap().push(value.clone());
            value.to_string()
        }
    };
    let aborted = seen.aborted.clone();
    let started = seen.slow_started.clone();
    let app = Router::new()
        .route("/echo", post(record))
        .route(
            "/status/{code}",
            post(|Path(code): Path<u16>| async move {
                (
                    StatusCode::from_u16(code).unwrap(),
                    "nope: order is closed\nmore detail",
                )
            }),
        )
        .route("/big", post(|| async { "x".repeat(64 * 1024) }))
        .route(
            "/slow",
            post(move || {
                let aborted = aborted.clone();
                let started = started.clone();
                async move {
                    let mut signal = DropSignal(aborted, true);
                    started.send_modify(|n| *n += 1);
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    signal.1 = false;
                    "late"
                }
            }),
        )
        .route(
            "/redirect-away",
            post(|| async {
                (
                    StatusCode::TEMPORARY_REDIRECT,
                    [("location", "http://elsewhere.test/echo")],
                )
                    .into_response()
            }),
        )
        .route(
            "/redirect-same",
            post(|| async {
                (StatusCode::TEMPORARY_REDIRECT, [("location", "/echo")]).into_response()
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

/// A listener that only counts connections: proof that a refusal happened before connecting.
pub(crate) async fn counting_listener() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            count.fetch_add(1, Ordering::SeqCst);
        }
    });
    (addr, accepted)
}

pub(crate) fn http_catalog(upstreams: &str, tools: &[(&str, &str, &str)]) -> String {
    let mut yaml = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\nupstreams:\n{upstreams}tools:\n"
    );
    for (name, upstream, path) in tools {
        yaml += &format!(
            "  - {{ name: {name}, description: d, risk_level: read_only, timeout: 2s, executor: {{ http: {{ upstream: {upstream}, path: \"{path}\" }} }}, input_schema: {{ type: object }} }}\n"
        );
    }
    yaml
}

pub(crate) fn process_catalog(tool_lines: &str) -> String {
    format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\ntools:\n{tool_lines}"
    )
}

pub(crate) fn process_tool(name: &str, script: &str, extra: &str) -> String {
    let script = serde_json::to_string(script).unwrap();
    format!(
        "  - name: {name}\n    description: d\n    risk_level: read_only\n    timeout: 2s\n    input_schema: {{ type: object }}\n{extra}    executor:\n      process:\n        command: {}\n        args: [\"-c\", {script}]\n        env: [PATH, HOME, ALLOWED_VAR]\n        set_env: {{ SET_BY_CATALOG: \"yes\" }}\n",
        python()
    )
}

pub(crate) fn env_with_path() -> Env {
    let mut env = Env::default()
        .with("ALLOWED_VAR", "fine")
        .with("SIDECAR_SECRET", "do-not-leak");
    for key in ["PATH", "HOME"] {
        if let Ok(value) = std::env::var(key) {
            env = env.with(key, &value);
        }
    }
    env
}

#[tokio::test]
async fn process_tools_read_stdin_write_stdout_and_see_a_clean_environment() {
    let tools = process_tool(
        "run",
        "import json,os,sys; args=json.load(sys.stdin); print(json.dumps({'args': args, 'env': sorted(os.environ)}))",
        "",
    ) + &process_tool(
        "fail",
        "import sys; sys.stderr.write('disk quota exceeded\\n'); sys.exit(3)",
        "",
    );
    let server = TestServer::start_with_env(&process_catalog(&tools), &env_with_path()).await;
    let mut client = server.client().await;
    let r = exec(&mut client, &who("acme"), call("run", r#"{"n": 1}"#)).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    let out: Value = serde_json::from_str(&r.model_text).unwrap();
    assert_eq!(out["args"], json!({"n": 1}));
    let env: Vec<String> = serde_json::from_value(out["env"].clone()).unwrap();
    assert!(
        env.contains(&"ALLOWED_VAR".into()) && env.contains(&"SET_BY_CATALOG".into()),
        "{env:?}"
    );
    assert!(!env.contains(&"SIDECAR_SECRET".into()), "{env:?}");
    let r = exec(&mut client, &who("acme"), call("fail", "{}")).await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Error, "tool_failed")
    );
    assert_eq!(
        r.error_message,
        "the tool exited with status 3: disk quota exceeded"
    );
    server.stop().await;
}

pub(crate) fn pid_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // A zombie has exited; only its parent has not collected it yet.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn a_timeout_kills_the_whole_process_group_and_huge_output_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    // A shell starts in a millisecond, so the pids are written well within the timeout even on
    // a busy machine (a Python interpreter may take longer than 500 ms to start there).
    let script = format!("sleep 30 & echo \"$$ $!\" > {}; wait", pids.display());
    let tools = process_tool("hang", &script, "")
        .replace("timeout: 2s", "timeout: 500ms")
        .replacen(&format!("command: {}", python()), "command: sh", 1)
        + &process_tool(
            "flood",
            "import sys\nwhile True: sys.stdout.write('y' * 65536)",
            "    max_output_bytes: 1000\n",
        )
        .replace("timeout: 2s", "timeout: 30s");
    let server = TestServer::start_with_env(&process_catalog(&tools), &env_with_path()).await;
    let mut client = server.client().await;
    let r = exec(&mut client, &who("acme"), call("hang", "{}")).await;
    assert_eq!(r.status(), ToolStatus::Timeout, "{r:?}");
    let text = std::fs::read_to_string(&pids).expect("the script wrote its pids");
    let pids: Vec<i32> = text
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    // SIGKILL is delivered at once, but the kernel may take a moment to tear the processes down.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !pids.iter().all(|&p| pid_gone(p)) {
        assert!(
            std::time::Instant::now() < deadline,
            "process group still alive: {pids:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Capped as soon as the output passes the limit: an answer that waited for the tool's
    // timeout would be TIMEOUT, not output_too_large.
    let r = exec(&mut client, &who("acme"), call("flood", "{}")).await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Error, "output_too_large"),
        "{r:?}"
    );
    assert!(
        r.error_message.contains("exceeded 1000 bytes"),
        "{}",
        r.error_message
    );
    server.stop().await;
}

pub(crate) fn everything_server() -> String {
    format!(
        "{}/tests/tools/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// `server-everything streamableHttp` on a loopback port of its choosing.
pub(crate) async fn spawn_everything_over_http() -> (u16, tokio::process::Child) {
    crate::support::spawn_listening(
        tokio::process::Command::new("node")
            .arg("--require")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/print_listen_port.cjs"
            ))
            .arg(everything_server())
            .arg("streamableHttp")
            .env("PORT", "0")
            .stderr(std::process::Stdio::null()),
    )
    .await
}

/// Waits (bounded) until the tool appears in ListTools for this caller.
pub(crate) async fn wait_for_tool(server: &TestServer, caller: &crate::support::Who, tool: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut client = server.client().await;
    loop {
        if crate::support::visible(&mut client, caller)
            .await
            .iter()
            .any(|t| t == tool)
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{tool} did not appear within 60s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn mcp_stdio_servers_from_pypi_and_npm_with_catalog_overrides() {
    let yaml = format!(
        r#"version: 1
identity: {{ dev_identity: true }}
tenants: {{ acme: {{}} }}
mcp_servers:
  time:
    command: ["{py}", "-m", "mcp_server_time", "--local-timezone", "UTC"]
    env: [PATH, HOME]
    tools:
      get_current_time: {{ risk_level: read_only, rate_limit: 2/min, bind: {{ timezone: "Europe/Paris" }} }}
  everything:
    command: ["node", "{everything}", "stdio"]
    env: [PATH, HOME]
    tools:
      echo: {{ risk_level: read_only, required_scopes: ["mcp:use"] }}
      get-sum: {{ risk_level: write_confirmed }}
tools: []
"#,
        py = python(),
        everything = everything_server()
    );
    let server = TestServer::start_with_env(&yaml, &env_with_path()).await;
    wait_for_tool(&server, &who("acme"), "time.get_current_time").await;
    let mut client = server.client().await;
    // The model sees the server's schema minus the bound timezone.
    let listed = client
        .list_tools(
            who("acme")
                .scopes("mcp:use")
                .request(toolgate::proto::ListToolsRequest {}),
        )
        .await
        .unwrap()
        .into_inner();
    let time = listed
        .tools
        .iter()
        .find(|t| t.name == "time.get_current_time")
        .unwrap();
    assert!(
        !time.input_schema_json.contains("timezone"),
        "{}",
        time.input_schema_json
    );
    let r = exec(
        &mut client,
        &who("acme"),
        call("time.get_current_time", "{}"),
    )
    .await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    assert!(
        r.model_text.contains("Europe/Paris"),
        "the bound timezone was used: {}",
        r.model_text
    );
    // The catalog's rate limit applies, not anything the server says.
    exec(
        &mut client,
        &who("acme"),
        call("time.get_current_time", "{}"),
    )
    .await;
    let limited = exec(
        &mut client,
        &who("acme"),
        call("time.get_current_time", "{}"),
    )
    .await;
    assert_eq!(limited.status(), ToolStatus::RateLimited);
    let bound = exec(
        &mut client,
        &who("acme"),
        call("time.get_current_time", r#"{"timezone":"Asia/Tokyo"}"#),
    )
    .await;
    assert_eq!(bound.error_type, "bound_argument_override");

    wait_for_tool(&server, &who("acme").scopes("mcp:use"), "everything.echo").await;
    let r = exec(
        &mut client,
        &who("acme").scopes("mcp:use"),
        call("everything.echo", r#"{"message":"hello mcp"}"#),
    )
    .await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    assert!(r.model_text.contains("hello mcp"), "{}", r.model_text);
    assert_eq!(
        exec(
            &mut client,
            &who("acme"),
            call("everything.echo", r#"{"message":"x"}"#)
        )
        .await
        .error_type,
        "tool_not_found"
    );
    // The catalog says get-sum needs approval, whatever the server thinks of it.
    let sum = exec(
        &mut client,
        &who("acme"),
        call("everything.get-sum", r#"{"a":1,"b":2}"#),
    )
    .await;
    assert_eq!(sum.status(), ToolStatus::ApprovalRequired);
    // Tools the catalog does not list are not exposed.
    assert_eq!(
        exec(&mut client, &who("acme"), call("everything.get-env", "{}"))
            .await
            .error_type,
        "tool_not_found"
    );
    server.stop().await;
}

#[tokio::test]
async fn mcp_streamable_http_server() {
    let (port, mut child) = spawn_everything_over_http().await;
    let yaml = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\nmcp_servers:\n  remote:\n    url: http://127.0.0.1:{port}/mcp\n    allow_private_addresses: true\n    tools:\n      get-sum: {{ risk_level: read_only }}\ntools: []\n"
    );
    // The supervisor retries with backoff until the HTTP server is up.
    let server = TestServer::start(&yaml).await;
    wait_for_tool(&server, &who("acme"), "remote.get-sum").await;
    let mut client = server.client().await;
    let r = exec(
        &mut client,
        &who("acme"),
        call("remote.get-sum", r#"{"a":2,"b":40}"#),
    )
    .await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    assert!(r.model_text.contains("42"), "{}", r.model_text);
    server.stop().await;
    let _ = child.kill().await;
}

#[tokio::test]
async fn mcp_list_changed_refreshes_and_a_killed_server_fails_promptly_then_recovers() {
    let yaml = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\nmcp_servers:\n  dyn:\n    command: [\"{py}\", \"{dir}/tests/fixtures/mcp_dynamic_server.py\"]\n    env: [PATH, HOME]\n    tools:\n      unlock: {{ risk_level: read_only }}\n      wait: {{ risk_level: read_only, timeout: 30s }}\n      trace_context: {{ risk_level: read_only }}\n      secret_word: {{ risk_level: read_only }}\ntools: []\n",
        py = python(),
        dir = env!("CARGO_MANIFEST_DIR")
    );
    let server = TestServer::start_with_env(&yaml, &env_with_path()).await;
    wait_for_tool(&server, &who("acme"), "dyn.unlock").await;
    let mut client = server.client().await;
    // The caller's trace context reaches the MCP server in the request's _meta.
    wait_for_tool(&server, &who("acme"), "dyn.trace_context").await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut request = who("acme").request(execute_request(call("dyn.trace_context", "{}")));
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    let carried = client
        .execute_tool(request)
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(carried.model_text, traceparent, "{carried:?}");
    // Configured but not offered yet: a clear, retryable UNAVAILABLE.
    let early = exec(&mut client, &who("acme"), call("dyn.secret_word", "{}")).await;
    assert_eq!(
        (early.status(), early.error_type.as_str(), early.retryable),
        (ToolStatus::Unavailable, "tool_unavailable", true)
    );
    assert_eq!(
        exec(&mut client, &who("acme"), call("dyn.unlock", "{}"))
            .await
            .model_text,
        "unlocked"
    );
    wait_for_tool(&server, &who("acme"), "dyn.secret_word").await;
    assert_eq!(
        exec(&mut client, &who("acme"), call("dyn.secret_word", "{}"))
            .await
            .model_text,
        "swordfish"
    );

    // Kill the server in the middle of a call.
    let mcp = server.mcp().clone();
    let pid = mcp.pid("dyn").expect("stdio server pid");
    let waiting = tokio::spawn({
        let mut client = client.clone();
        async move {
            exec(
                &mut client,
                &who("acme"),
                call("dyn.wait", r#"{"seconds": 20}"#),
            )
            .await
        }
    });
    let mut in_flight = mcp.watch_in_flight();
    tokio::time::timeout(Duration::from_secs(10), in_flight.wait_for(|n| *n >= 1))
        .await
        .expect("the call reached the MCP client")
        .unwrap();
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    let killed = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("a prompt answer, not the 30s timeout")
        .unwrap();
    assert_eq!(
        (
            killed.status(),
            killed.error_type.as_str(),
            killed.retryable
        ),
        (ToolStatus::Error, "upstream_unavailable", true),
        "{killed:?}"
    );
    // The supervisor restarts it; later calls work again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = exec(
            &mut client,
            &who("acme"),
            call("dyn.wait", r#"{"seconds": 0}"#),
        )
        .await;
        if r.status() == ToolStatus::Ok {
            assert_ne!(mcp.pid("dyn"), Some(pid));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no recovery within 30s: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.stop().await;
}
