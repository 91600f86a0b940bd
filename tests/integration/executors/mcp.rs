//! MCP promises of docs/executors.md ("mcp"): the catalog revision changes when a server's tool
//! list changes, a server that is down from the start makes its tools answer UNAVAILABLE at once,
//! and a stdio server that fails is restarted with backoff (100 ms doubling to 10 s).

use std::{path::Path, time::Duration};

use toolgate::{proto, settings::Env};

use crate::support::python;
use crate::support::{TestServer, Who, call, exec, who};

fn env_with_path() -> Env {
    let mut env = Env::default();
    for key in ["PATH", "HOME"] {
        if let Ok(value) = std::env::var(key) {
            env = env.with(key, &value);
        }
    }
    env
}

async fn listing(server: &TestServer, caller: &Who) -> proto::ListToolsResponse {
    server
        .client()
        .await
        .list_tools(caller.request(proto::ListToolsRequest {}))
        .await
        .unwrap()
        .into_inner()
}

/// Waits (bounded) until ListTools shows `tool`; returns that listing.
async fn until_listed(server: &TestServer, tool: &str) -> proto::ListToolsResponse {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let listed = listing(server, &who("acme")).await;
        if listed.tools.iter().any(|t| t.name == tool) {
            return listed;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{tool} not listed within 60s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_revision_changes_when_a_server_says_its_tools_changed() {
    let yaml = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\nmcp_servers:\n  dyn:\n    command: [\"{}\", \"{}/tests/fixtures/mcp_dynamic_server.py\"]\n    env: [PATH, HOME]\n    tools:\n      unlock: {{ risk_level: read_only }}\n      secret_word: {{ risk_level: read_only }}\ntools: []\n",
        python(),
        env!("CARGO_MANIFEST_DIR")
    );
    let server = TestServer::start_with_env(&yaml, &env_with_path()).await;
    let before = until_listed(&server, "dyn.unlock").await;
    assert!(!before.tools.iter().any(|t| t.name == "dyn.secret_word"));
    // Stable while nothing changes.
    assert_eq!(
        listing(&server, &who("acme")).await.catalog_revision,
        before.catalog_revision
    );
    let mut client = server.client().await;
    let r = exec(&mut client, &who("acme"), call("dyn.unlock", "{}")).await;
    assert_eq!(r.model_text, "unlocked", "{r:?}");
    // The server sent notifications/tools/list_changed; nothing else tells toolgate to re-list.
    let after = until_listed(&server, "dyn.secret_word").await;
    assert_ne!(after.catalog_revision, before.catalog_revision);
    // A call made against the old revision of a tool that did not change still runs.
    let mut unlock = call("dyn.unlock", "{}");
    unlock.call_id = "again".into();
    let mut request = crate::support::execute_request(unlock);
    request.catalog_revision = before.catalog_revision.clone();
    let r = client
        .execute_tool(who("acme").request(request))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(r.status(), proto::ToolStatus::Ok, "{r:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_from_the_start_makes_its_tools_unavailable_at_once() {
    let (_refusing, closed) = crate::support::refusing_port();
    let yaml = format!(
        r#"version: 1
identity: {{ dev_identity: true }}
tenants: {{ acme: {{}} }}
mcp_servers:
  missing:
    command: ["/nonexistent/mcp-server"]
    tools:
      lookup: {{ risk_level: read_only, timeout: 30s }}
  remote:
    url: http://{closed}/mcp
    tools:
      lookup: {{ risk_level: read_only, timeout: 30s }}
tools:
  - {{ name: echo, description: Echoes., risk_level: read_only, executor: {{ builtin: echo }}, input_schema: {{ type: object }} }}
"#
    );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    // Their tools are not shown, and calls to them answer UNAVAILABLE from the resolve stage —
    // not after their 30 s timeout — while the rest of the catalog serves.
    let shown = listing(&server, &who("acme")).await;
    assert_eq!(
        shown
            .tools
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["echo"]
    );
    for tool in ["missing.lookup", "remote.lookup"] {
        let r = exec(&mut client, &who("acme"), call(tool, "{}")).await;
        assert_eq!(
            (
                r.status(),
                r.error_type.as_str(),
                r.refused_by.as_str(),
                r.retryable
            ),
            (
                proto::ToolStatus::Unavailable,
                "tool_unavailable",
                "resolve",
                true
            ),
            "{tool}: {r:?}"
        );
    }
    let echo = exec(&mut client, &who("acme"), call("echo", r#"{"text":"up"}"#)).await;
    assert_eq!(echo.model_text, "up");
    server.stop().await;
}

/// Reads the start times (CLOCK_MONOTONIC seconds, one per line) a server appended to `log`,
/// waiting (bounded) until there are `count`.
async fn starts(log: &Path, count: usize) -> Vec<f64> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let times: Vec<f64> = std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect();
        if times.len() >= count {
            return times;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} starts within 60s",
            times.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The gap before restart k (k = 0 for the first restart) is at least 100 ms · 2^k: the delay
/// the supervisor sleeps. Lower bounds only, which a busy machine cannot break.
fn assert_backoff(times: &[f64]) {
    for (k, pair) in times.windows(2).enumerate() {
        let gap = pair[1] - pair[0];
        let at_least = (0.1 * 2f64.powi(k as i32)).min(10.0);
        assert!(
            gap >= at_least,
            "restart {k} came {gap:.3} s after the start before it, under the {at_least} s backoff; starts: {times:?}"
        );
    }
}

/// A stdio "server" that records when it starts and exits at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_fails_to_start_is_retried_with_doubling_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("starts");
    let script = format!(
        "import sys,time; open({:?},'a').write(f'{{time.monotonic()}}\\n'); sys.exit(1)",
        log.display().to_string()
    );
    let yaml = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\nmcp_servers:\n  broken:\n    command: [\"{}\", \"-c\", {}]\n    env: [PATH, HOME]\n    tools:\n      lookup: {{ risk_level: read_only }}\ntools: []\n",
        python(),
        serde_json::to_string(&script).unwrap()
    );
    let server = TestServer::start_with_env(&yaml, &env_with_path()).await;
    // 5 starts: gaps of at least 0.1, 0.2, 0.4 and 0.8 s.
    let times = starts(&log, 5).await;
    assert_backoff(&times[..5]);
    let r = exec(
        &mut server.client().await,
        &who("acme"),
        call("broken.lookup", "{}"),
    )
    .await;
    assert_eq!(r.error_type, "tool_unavailable");
    server.stop().await;
}

/// A server that connects and lists its tools, then crashes, over and over: docs/executors.md
/// promises backoff for a crashed server too, so the delay must grow (it is reset only after a
/// connection lasted a while), not restart it every 100 ms forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_looping_server_is_restarted_with_growing_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("starts");
    // The smallest MCP server: answers initialize and tools/list (one tool), then exits.
    let script = format!(
        r#"import json,sys,time
open({log:?},'a').write(f'{{time.monotonic()}}\n')
for line in sys.stdin:
    msg = json.loads(line)
    method = msg.get('method')
    if method == 'initialize':
        result = {{'protocolVersion': msg['params']['protocolVersion'], 'capabilities': {{'tools': {{}}}}, 'serverInfo': {{'name': 'crashy', 'version': '1'}}}}
    elif method == 'tools/list':
        result = {{'tools': [{{'name': 'lookup', 'inputSchema': {{'type': 'object'}}}}]}}
    else:
        continue
    print(json.dumps({{'jsonrpc': '2.0', 'id': msg['id'], 'result': result}}), flush=True)
    if method == 'tools/list':
        sys.exit(1)
"#,
        log = log.display().to_string()
    );
    let yaml = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\nmcp_servers:\n  crashy:\n    command: [\"{}\", \"-c\", {}]\n    env: [PATH, HOME]\n    tools:\n      lookup: {{ risk_level: read_only }}\ntools: []\n",
        python(),
        serde_json::to_string(&script).unwrap()
    );
    let server = TestServer::start_with_env(&yaml, &env_with_path()).await;
    let times = starts(&log, 5).await;
    assert_backoff(&times[..5]);
    server.stop().await;
}
