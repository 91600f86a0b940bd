//! MCP servers that misbehave or are misconfigured: duplicate prefixes, responses over the
//! message limit (stdio and Streamable HTTP), a server in a crash loop, a server that goes away,
//! and the Streamable HTTP client's SSRF guard.

use std::{process::Command, sync::atomic::Ordering, time::Duration};

use toolgate::proto::{ToolStatus, tool_gate_client::ToolGateClient};

use crate::{
    executors::{counting_listener, env_with_path, wait_for_tool},
    support::binary::spawn_with_env,
    support::python,
    support::{TestServer, call, exec, execute_request, spawn_listening, visible, who},
};

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn catalog(servers: &str) -> String {
    format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\nmcp_servers:\n{servers}tools: []\n"
    )
}

#[test]
fn duplicate_prefixes_are_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("catalog.yaml");
    std::fs::write(
        &file,
        catalog(
            "  a:\n    command: [\"true\"]\n    prefix: shared\n    tools: { ping: { risk_level: read_only } }\n\
             \x20 b:\n    command: [\"true\"]\n    prefix: shared\n    tools: { ping: { risk_level: read_only } }\n",
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["check", "--portable", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("mcp_servers.b.prefix")
            && stderr.contains("\"shared\"")
            && stderr.contains("mcp_servers.a"),
        "{stderr}"
    );
}

/// The dynamic fixture over stdio, offering `tools`.
fn dynamic_stdio(name: &str, tools: &str, extra: &str) -> String {
    format!(
        "  {name}:\n    command: [\"{py}\", \"{script}\"]\n    env: [PATH, HOME]\n{extra}    tools:\n{tools}",
        py = python(),
        script = fixture("mcp_dynamic_server.py"),
    )
}

const BIG_TOOLS: &str = "      big: { risk_level: read_only, timeout: 20s, max_output_bytes: 33554432 }\n      wait: { risk_level: read_only }\n";

/// 17 MiB: over rmcp's own 16 MiB line limit and over toolgate's message limit.
const HUGE: &str = r#"{"size": 17825792}"#;

async fn assert_too_large_then_healthy(server: &TestServer, tool_prefix: &str) {
    let mut client = server.client().await;
    let big = format!("{tool_prefix}.big");
    wait_for_tool(server, &who("acme"), &big).await;
    let r = exec(&mut client, &who("acme"), call(&big, HUGE)).await;
    assert_eq!(
        (r.status(), r.error_type.as_str(), r.retryable),
        (ToolStatus::Error, "output_too_large", false),
        "{r:?}"
    );
    // The connection survives: the next call on it works.
    let r = exec(
        &mut client,
        &who("acme"),
        call(&format!("{tool_prefix}.wait"), r#"{"seconds": 0}"#),
    )
    .await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
}

#[tokio::test]
async fn a_response_over_the_message_limit_is_output_too_large_not_a_timeout() {
    let server = TestServer::start_with_env(
        &catalog(&dynamic_stdio("dyn", BIG_TOOLS, "")),
        &env_with_path(),
    )
    .await;
    assert_too_large_then_healthy(&server, "dyn").await;
    server.stop().await;
}

/// Starts the dynamic fixture as a Streamable HTTP server on a port of its choosing.
async fn http_fixture(extra: &[&str]) -> (u16, tokio::process::Child) {
    spawn_listening(
        tokio::process::Command::new(python())
            .arg(fixture("mcp_dynamic_server.py"))
            .arg("--http")
            .args(extra)
            .stderr(std::process::Stdio::null()),
    )
    .await
}

#[tokio::test]
async fn a_response_over_the_message_limit_over_streamable_http_is_output_too_large() {
    // An SSE response stream, and a plain JSON response.
    let (sse_port, _sse) = http_fixture(&[]).await;
    let (json_port, _json) = http_fixture(&["--json"]).await;
    let servers = format!(
        "  sse:\n    url: http://127.0.0.1:{sse_port}/mcp\n    allow_private_addresses: true\n    tools:\n{BIG_TOOLS}\
         \x20 json:\n    url: http://127.0.0.1:{json_port}/mcp\n    allow_private_addresses: true\n    tools:\n{BIG_TOOLS}"
    );
    let server = TestServer::start(&catalog(&servers)).await;
    assert_too_large_then_healthy(&server, "sse").await;
    assert_too_large_then_healthy(&server, "json").await;
    server.stop().await;
}

#[tokio::test]
async fn restarts_back_off_for_a_server_that_connects_and_dies() {
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let servers = format!(
        "  crashy:\n    command: [\"{py}\", \"{script}\"]\n    env: [PATH, HOME]\n    set_env: {{ MCP_START_LOG: \"{log}\" }}\n    tools:\n      ping: {{ risk_level: read_only }}\n",
        py = python(),
        script = fixture("mcp_crashing_server.py"),
        log = starts.display(),
    );
    let server = TestServer::start_with_env(&catalog(&servers), &env_with_path()).await;
    // Seven starts: six restarts after a connection that listed its tools and then died.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let times: Vec<f64> = loop {
        let text = std::fs::read_to_string(&starts).unwrap_or_default();
        let times: Vec<f64> = text.lines().filter_map(|l| l.parse().ok()).collect();
        if times.len() >= 7 {
            break times;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} starts within 60s",
            times.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    server.stop().await;
    // The delay before restart k (from 0) is at least 100 ms · 2^k: each gap is at least that,
    // however slow the machine. Without backoff every gap is the server's short life.
    let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    for (k, gap) in gaps.iter().enumerate() {
        let floor = 0.1 * f64::from(1u32 << k);
        assert!(
            *gap >= floor * 0.95,
            "restart {k} came {gap:.3}s after the previous start; backoff is {floor}s: {gaps:?}"
        );
    }
}

#[tokio::test]
async fn a_server_that_went_down_is_reported_like_one_that_never_came_up() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("down");
    let always_down = dir.path().join("always-down");
    std::fs::write(&always_down, "").unwrap();
    let tools = "      wait: { risk_level: read_only }\n";
    let servers = dynamic_stdio(
        "was_up",
        tools,
        &format!("    set_env: {{ MCP_DOWN_FLAG: \"{}\" }}\n", flag.display()),
    ) + &dynamic_stdio(
        "never_up",
        tools,
        &format!(
            "    set_env: {{ MCP_DOWN_FLAG: \"{}\" }}\n",
            always_down.display()
        ),
    );
    let server = TestServer::start_with_env(&catalog(&servers), &env_with_path()).await;
    wait_for_tool(&server, &who("acme"), "was_up.wait").await;
    let mut client = server.client().await;
    let r = exec(
        &mut client,
        &who("acme"),
        call("was_up.wait", r#"{"seconds": 0}"#),
    )
    .await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");

    // From now on the server cannot start again; kill the running one.
    std::fs::write(&flag, "").unwrap();
    let mcp = server.mcp().clone();
    let pid = mcp.pid("was_up").expect("stdio server pid");
    assert!(
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while visible(&mut client, &who("acme"))
        .await
        .contains(&"was_up.wait".to_owned())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the tool of a server that went down is still listed after 30s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let listed = visible(&mut client, &who("acme")).await;
    assert!(!listed.contains(&"never_up.wait".to_owned()), "{listed:?}");
    let went_down = exec(
        &mut client,
        &who("acme"),
        call("was_up.wait", r#"{"seconds": 0}"#),
    )
    .await;
    let never_up = exec(
        &mut client,
        &who("acme"),
        call("never_up.wait", r#"{"seconds": 0}"#),
    )
    .await;
    let shape = |r: &toolgate::proto::ToolResult| {
        (
            r.status(),
            r.error_type.clone(),
            r.retryable,
            r.refused_by.clone(),
        )
    };
    assert_eq!(
        shape(&went_down),
        (
            ToolStatus::Unavailable,
            "tool_unavailable".to_owned(),
            true,
            "resolve".to_owned()
        ),
        "{went_down:?}"
    );
    assert_eq!(shape(&went_down), shape(&never_up));
    server.stop().await;
}

#[tokio::test]
async fn mcp_calls_carry_a_valid_traceparent_even_without_one_from_the_caller() {
    let server = TestServer::start_with_env(
        &catalog(&dynamic_stdio(
            "dyn",
            "      trace_context: { risk_level: read_only }\n",
            "",
        )),
        &env_with_path(),
    )
    .await;
    wait_for_tool(&server, &who("acme"), "dyn.trace_context").await;
    let mut client = server.client().await;
    let r = exec(&mut client, &who("acme"), call("dyn.trace_context", "{}")).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    assert!(
        crate::support::valid_traceparent(&r.model_text),
        "{}",
        r.model_text
    );
    // A malformed one from the caller is dropped, not passed on.
    let mut request = who("acme").request(execute_request(call("dyn.trace_context", "{}")));
    request
        .metadata_mut()
        .insert("traceparent", "00-zz-zz-01".parse().unwrap());
    let r = client
        .execute_tool(request)
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert!(
        crate::support::valid_traceparent(&r.model_text),
        "{}",
        r.model_text
    );
    server.stop().await;
}

#[tokio::test]
async fn streamable_http_goes_through_the_ssrf_guard_and_ignores_proxies() {
    let (port, _fixture) = http_fixture(&[]).await;
    // A proxy from the environment that must not be used, and a loopback MCP server that is not
    // allowed: both count connections.
    let (proxy, proxied) = counting_listener().await;
    let (private, private_accepted) = counting_listener().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("catalog.yaml");
    std::fs::write(
        &file,
        catalog(&format!(
            "  allowed:\n    url: http://127.0.0.1:{port}/mcp\n    allow_private_addresses: true\n    tools:\n      wait: {{ risk_level: read_only }}\n\
             \x20 private:\n    url: http://127.0.0.1:{}/mcp\n    tools:\n      wait: {{ risk_level: read_only }}\n\
             \x20 named:\n    url: http://internal.test:{}/mcp\n    resolve: {{ internal.test: [\"127.0.0.1\"] }}\n    tools:\n      wait: {{ risk_level: read_only }}\n",
            private.port(),
            private.port()
        )),
    )
    .unwrap();
    let proxy_url = format!("http://{proxy}");
    let spawned = spawn_with_env(
        &["--config", file.to_str().unwrap()],
        &[
            ("HTTP_PROXY", &proxy_url),
            ("http_proxy", &proxy_url),
            ("ALL_PROXY", &proxy_url),
            ("all_proxy", &proxy_url),
        ],
    );
    // Both refusals are logged before anything connects.
    let spawned = tokio::task::spawn_blocking(move || {
        spawned.wait_for_log("refused a non-public MCP server address", 2);
        spawned
    })
    .await
    .unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", spawned.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ToolGateClient::new(channel);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let r = loop {
        let r = exec(
            &mut client,
            &who("acme"),
            call("allowed.wait", r#"{"seconds": 0}"#),
        )
        .await;
        if r.status() == ToolStatus::Ok || tokio::time::Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    for tool in ["private.wait", "named.wait"] {
        let r = exec(&mut client, &who("acme"), call(tool, "{}")).await;
        assert_eq!(r.error_type, "tool_unavailable", "{tool}: {r:?}");
    }
    assert_eq!(
        proxied.load(Ordering::SeqCst),
        0,
        "an environment proxy was used"
    );
    assert_eq!(
        private_accepted.load(Ordering::SeqCst),
        0,
        "a non-public MCP server was connected to"
    );
    crate::support::binary::stop(spawned).await;
}

/// A catalog naming the hostile fixture in `mode` as server `hostile`, logging the `tools/list`
/// requests it is sent to `log`.
fn hostile(mode: &str, log: &std::path::Path) -> String {
    catalog(&format!(
        "  hostile:\n    command: [\"{py}\", \"{script}\", \"{mode}\"]\n    env: [PATH, HOME]\n    set_env: {{ MCP_LOG: \"{log}\" }}\n    startup_timeout: 20s\n    tools:\n      t0: {{ risk_level: read_only }}\n",
        py = python(),
        script = fixture("mcp_hostile_server.py"),
        log = log.display(),
    ))
}

/// The `tools/list` requests the hostile fixture was sent, as seconds of its monotonic clock.
fn listings(log: &std::path::Path) -> Vec<f64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.strip_prefix("list ")?.parse().ok())
        .collect()
}

/// A server that answers `tools/list` without end — page after page, pages of 1 MiB, or 20,000
/// tools at once — is stopped at the bound (64 pages, 16 MiB, 10,000 tools a listing), said in
/// the log, and none of its tools are offered; what the sidecar holds meanwhile is one page and
/// the tools the catalog names. (Issue 52, item 3: every page was collected before filtering,
/// +768 MiB in under 20 s.)
#[tokio::test]
async fn a_server_listing_without_end_is_stopped_at_the_bound() {
    for (mode, pages, said) in [
        ("endless-pages", 64, "more than 64 pages of tools"),
        ("big-pages", 16, "more than 16 MiB of tool definitions"),
        ("many-tools", 1, "more than 10000 tools"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("lists");
        let file = dir.path().join("catalog.yaml");
        std::fs::write(&file, hostile(mode, &log)).unwrap();
        let spawned = spawn_with_env(
            &["--config", file.to_str().unwrap()],
            &[("PATH", &std::env::var("PATH").unwrap())],
        );
        spawned.wait_for_log("MCP server did not list its tools", 1);
        assert_eq!(listings(&log).len(), pages, "{mode}");
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", spawned.addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = ToolGateClient::new(channel);
        assert!(
            visible(&mut client, &who("acme")).await.is_empty(),
            "{mode}"
        );
        let logs = crate::support::binary::stop(spawned).await;
        assert!(logs.contains(said), "{mode}: {logs}");
    }
}

/// A server that says its list changed right after every listing is listed at most once a
/// second, however often it says so. (Issue 52, item 3: each notice made the sidecar list it
/// again at once, without pause.)
#[tokio::test]
async fn a_server_that_keeps_saying_its_list_changed_is_listed_at_most_once_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("lists");
    let server = TestServer::start_with_env(&hostile("list-changed", &log), &env_with_path()).await;
    wait_for_tool(&server, &who("acme"), "hostile.t0").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let times = loop {
        let times = listings(&log);
        if times.len() >= 4 {
            break times;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} listings within 30s",
            times.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    server.stop().await;
    // However slow the machine, each gap is at least the interval; without it, each is the
    // round trip of one listing.
    for gap in times.windows(2).map(|w| w[1] - w[0]) {
        assert!(
            gap >= 0.95,
            "listed again {gap:.3}s after the last: {times:?}"
        );
    }
}
