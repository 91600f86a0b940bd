//! Executor promises of docs/executors.md beyond executors.rs: http header values from `file:`, a
//! redirect to a scheme the upstream may not use; process `working_dir` and `max_stderr_bytes`,
//! and a client cancel or oversized output killing the program's whole process group; a tool's
//! own `max_concurrency`; and writes that failed after their backend started (an MCP server gone
//! mid-call, a program killed), which are never reported retryable.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
    routing::post,
};
use toolgate::{proto::ToolStatus, settings::Env};

use crate::support::python;
use crate::support::{STAGES, TestServer, call, exec, who};

/// An upstream that records each request's headers; `/to-https` redirects to the same host
/// over https.
async fn upstream() -> (SocketAddr, Arc<Mutex<Vec<HeaderMap>>>) {
    let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
    let record = seen.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route(
            "/echo",
            post(move |headers: HeaderMap| {
                let record = record.clone();
                async move {
                    record.lock().unwrap().push(headers);
                    "{\"ok\":true}"
                }
            }),
        )
        .route(
            "/to-https",
            post(move || async move {
                (
                    StatusCode::TEMPORARY_REDIRECT,
                    [("location", format!("https://{addr}/echo"))],
                )
                    .into_response()
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

#[tokio::test]
async fn header_values_from_files_and_redirects_to_a_disallowed_scheme() {
    let (addr, seen) = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    // Secret files usually end with a newline; it is not part of the value.
    std::fs::write(&token_file, "file-s3cret\n").unwrap();
    let yaml = format!(
        r#"version: 1
identity: {{ dev_identity: true }}
tenants: {{ acme: {{}} }}
upstreams:
  svc:
    url: http://{addr}
    allow_schemes: [http]
    allow_private_addresses: true
    headers:
      authorization: {{ file: {}, prefix: "Token " }}
tools:
  - {{ name: lookup, description: d, risk_level: read_only, executor: {{ http: {{ upstream: svc, path: /echo }} }}, input_schema: {{ type: object }} }}
  - {{ name: upgrade, description: d, risk_level: read_only, executor: {{ http: {{ upstream: svc, path: /to-https }} }}, input_schema: {{ type: object }} }}
"#,
        token_file.display()
    );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    let r = exec(&mut client, &who("acme"), call("lookup", "{}")).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    assert_eq!(
        seen.lock().unwrap()[0]["authorization"],
        "Token file-s3cret"
    );
    // Same host, but https: another origin (and a scheme this upstream may not use), refused,
    // not followed.
    let r = exec(&mut client, &who("acme"), call("upgrade", "{}")).await;
    assert_eq!(
        (r.status(), r.error_type.as_str(), r.refused_by.as_str()),
        (ToolStatus::Denied, "destination_refused", "execute"),
        "{r:?}"
    );
    assert!(
        r.error_message.contains("redirected to another origin"),
        "{}",
        r.error_message
    );
    assert_eq!(seen.lock().unwrap().len(), 1, "the redirect was followed");
    let audit = std::fs::read_to_string(&server.audit_path).unwrap_or_default()
        + &format!("{:?}", server.audit_events().await);
    assert!(!audit.contains("file-s3cret"));
    server.stop().await;
}

fn process_tool(name: &str, script: &str, extra: &str) -> String {
    format!(
        "  - name: {name}\n    description: d\n    risk_level: read_only\n    timeout: 30s\n    input_schema: {{ type: object }}\n{extra}    executor:\n      process:\n        command: {}\n        args: [\"-c\", {}]\n        env: [PATH, HOME]\n",
        python(),
        serde_json::to_string(script).unwrap()
    )
}

fn env_with_path() -> Env {
    let mut env = Env::default();
    for key in ["PATH", "HOME"] {
        if let Ok(value) = std::env::var(key) {
            env = env.with(key, &value);
        }
    }
    env
}

fn catalog(tools: &str) -> String {
    format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\ntools:\n{tools}"
    )
}

#[tokio::test]
async fn process_working_dir_and_stderr_cap() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = "import os; print(os.getcwd())";
    let tools = process_tool("absolute", cwd, "")
        .replace(
            "        env: [PATH, HOME]\n",
            &format!(
                "        env: [PATH, HOME]\n        working_dir: {}\n",
                dir.path().display()
            ),
        )
        // Relative to the catalog's directory (here the repository root).
        + &process_tool("relative", cwd, "").replace(
            "        env: [PATH, HOME]\n",
            "        env: [PATH, HOME]\n        working_dir: tests/fixtures\n",
        )
        // 1 MiB of stderr, then a failure: the program never blocks on the pipe, and the
        // summary keeps only the first 64 bytes.
        + &process_tool(
            "noisy",
            "import sys; sys.stderr.write('e' * 1048576); sys.stderr.flush(); sys.exit(3)",
            "",
        )
        .replace(
            "        env: [PATH, HOME]\n",
            "        env: [PATH, HOME]\n        max_stderr_bytes: 64\n",
        );
    let server = TestServer::start_with_env(&catalog(&tools), &env_with_path()).await;
    let mut client = server.client().await;
    let r = exec(&mut client, &who("acme"), call("absolute", "{}")).await;
    assert_eq!(
        std::path::Path::new(r.model_text.trim())
            .canonicalize()
            .unwrap(),
        dir.path().canonicalize().unwrap(),
        "{r:?}"
    );
    let r = exec(&mut client, &who("acme"), call("relative", "{}")).await;
    assert_eq!(
        std::path::Path::new(r.model_text.trim())
            .canonicalize()
            .unwrap(),
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .canonicalize()
            .unwrap(),
        "{r:?}"
    );
    let r = exec(&mut client, &who("acme"), call("noisy", "{}")).await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Error, "tool_failed"),
        "{}",
        r.error_message.chars().take(200).collect::<String>()
    );
    assert_eq!(
        r.error_message,
        format!("the tool exited with status 3: {}", "e".repeat(64))
    );
    server.stop().await;
}

/// True once the process has exited (a zombie has exited too; only its parent has not reaped it).
fn pid_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// The program's pid and its child's, once the script has written them.
async fn pids_from(file: &std::path::Path) -> Vec<i32> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = std::fs::read_to_string(file)
            && text.ends_with('\n')
        {
            return text
                .split_whitespace()
                .map(|p| p.parse().unwrap())
                .collect();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the program did not start"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn all_gone(pids: &[i32]) {
    // SIGKILL is delivered at once; the kernel may take a moment to tear the processes down.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !pids.iter().all(|&p| pid_gone(p)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "process group still alive: {pids:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a child that inherits stdin, stdout and stderr (`sleep 60`), writes both pids, then
/// runs `then`.
fn with_grandchild(pids: &std::path::Path, then: &str) -> String {
    format!(
        "import os,subprocess,sys,time\nc=subprocess.Popen(['sleep','60'])\nopen({:?},'w').write(f'{{os.getpid()}} {{c.pid}}\\n')\n{then}",
        pids.display().to_string()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cancel_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let tools = process_tool("hold", &with_grandchild(&pids, "time.sleep(60)"), "");
    let server = TestServer::start_with_env(&catalog(&tools), &env_with_path()).await;
    let mut client = server.client().await;
    let pending =
        tokio::spawn(async move { exec(&mut client, &who("acme"), call("hold", "{}")).await });
    let running = pids_from(&pids).await;
    assert_eq!(running.len(), 2);
    assert!(!running.iter().any(|&p| pid_gone(p)));
    pending.abort();
    all_gone(&running).await;
    let event = server.wait_for_audit(|e| e["tool"] == "hold").await;
    assert_eq!(event["status"], "CANCELLED");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_output_kills_the_whole_process_group_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    // The child holds the output pipes open too: the call must not wait for it to go away.
    let tools = process_tool(
        "flood",
        &with_grandchild(&pids, "while True: sys.stdout.write('y' * 65536)"),
        "    max_output_bytes: 1000\n",
    );
    let server = TestServer::start_with_env(&catalog(&tools), &env_with_path()).await;
    let mut client = server.client().await;
    // The tool may run 30 s: an answer that waited for the child or the timeout would be TIMEOUT.
    let r = exec(&mut client, &who("acme"), call("flood", "{}")).await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Error, "output_too_large"),
        "{r:?}"
    );
    let group = pids_from(&pids).await;
    all_gone(&group).await;
    server.stop().await;
}

#[tokio::test]
async fn a_tools_max_concurrency_refuses_at_once_instead_of_queueing() {
    let yaml = STAGES.replace(
        "  - name: slow\n    description: Sleeps.\n    risk_level: read_only\n    timeout: 300ms\n",
        "  - name: slow\n    description: Sleeps.\n    risk_level: read_only\n    timeout: 30s\n    max_concurrency: 1\n",
    );
    assert_ne!(yaml, STAGES);
    let server = TestServer::start(&yaml).await;
    let client = server.client().await;
    let mut in_flight = server.builtins().watch_slow_in_flight();
    let first = tokio::spawn({
        let mut client = client.clone();
        async move { exec(&mut client, &who("acme"), call("slow", r#"{"ms":20000}"#)).await }
    });
    tokio::time::timeout(Duration::from_secs(10), in_flight.wait_for(|n| *n == 1))
        .await
        .expect("the first call is running")
        .unwrap();
    let mut c = client.clone();
    let second = exec(&mut c, &who("acme"), call("slow", r#"{"ms":1}"#)).await;
    assert_eq!(
        (
            second.status(),
            second.error_type.as_str(),
            second.retryable
        ),
        (ToolStatus::Unavailable, "overloaded", true),
        "{second:?}"
    );
    // Refused while the first still holds the slot: not queued behind it.
    assert!(!first.is_finished());
    assert_eq!(*in_flight.borrow(), 1);
    // Other tools are not limited by it.
    let echo = exec(&mut c, &who("acme"), call("echo", r#"{"text":"x"}"#)).await;
    assert_eq!(echo.status(), ToolStatus::Ok);
    first.abort();
    tokio::time::timeout(Duration::from_secs(10), in_flight.wait_for(|n| *n == 0))
        .await
        .unwrap()
        .unwrap();
    // The slot is free again.
    let third = exec(&mut c, &who("acme"), call("slow", r#"{"ms":1}"#)).await;
    assert_eq!(third.status(), ToolStatus::Ok, "{third:?}");
    server.stop().await;
}

/// A call of a write tool with an idempotency key.
fn keyed(tool: &str, args: &str, key: &str) -> toolgate::proto::ToolCall {
    toolgate::proto::ToolCall {
        idempotency_key: key.into(),
        ..call(tool, args)
    }
}

#[tokio::test]
async fn an_mcp_write_whose_server_went_away_mid_call_is_an_unknown_outcome() {
    let yaml = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\nmcp_servers:\n  dyn:\n    command: [\"{py}\", \"{dir}/tests/fixtures/mcp_dynamic_server.py\"]\n    env: [PATH, HOME]\n    tools:\n      wait: {{ risk_level: write_draft, timeout: 30s }}\ntools: []\n",
        py = python(),
        dir = env!("CARGO_MANIFEST_DIR")
    );
    let server = TestServer::start_with_env(&yaml, &env_with_path()).await;
    crate::executors::wait_for_tool(&server, &who("acme"), "dyn.wait").await;
    let client = server.client().await;
    let mcp = server.mcp().clone();
    let pid = mcp.pid("dyn").expect("stdio server pid");
    let waiting = tokio::spawn({
        let mut client = client.clone();
        async move {
            exec(
                &mut client,
                &who("acme"),
                keyed("dyn.wait", r#"{"seconds": 20}"#, "k-mcp"),
            )
            .await
        }
    });
    // The request was sent (the MCP client holds it in flight); then the server dies.
    let mut in_flight = mcp.watch_in_flight();
    tokio::time::timeout(Duration::from_secs(10), in_flight.wait_for(|n| *n >= 1))
        .await
        .expect("the call reached the MCP client")
        .unwrap();
    std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    let broken = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("an answer before the call's own end")
        .unwrap();
    assert_eq!(
        (
            broken.status(),
            broken.error_type.as_str(),
            broken.retryable
        ),
        (ToolStatus::Error, "upstream_unavailable", false),
        "{broken:?}"
    );
    assert!(
        broken.error_message.contains("the outcome is unknown"),
        "{}",
        broken.error_message
    );
    // The key kept that outcome: once the server is back, the retry is its replay, not a second
    // call (while it is away, resolve refuses the tool, retryably, before any key is looked at).
    crate::executors::wait_for_tool(&server, &who("acme"), "dyn.wait").await;
    assert_ne!(mcp.pid("dyn"), Some(pid), "a new server process");
    let mut client = client.clone();
    let retry = exec(
        &mut client,
        &who("acme"),
        keyed("dyn.wait", r#"{"seconds": 20}"#, "k-mcp"),
    )
    .await;
    assert_eq!(
        (
            retry.error_type.as_str(),
            retry.retryable,
            retry.idempotent_replay
        ),
        ("upstream_unavailable", false, true),
        "{retry:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_process_write_killed_after_writing_is_not_retryable_and_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let writes = dir.path().join("writes");
    let script = format!(
        "import os, signal\nwith open({path:?}, 'a') as f: f.write('w\\n')\nos.kill(os.getpid(), signal.SIGKILL)",
        path = writes.display().to_string()
    );
    let tools = process_tool("killed_write", &script, "")
        .replace("risk_level: read_only", "risk_level: write_draft");
    let server = TestServer::start_with_env(&catalog(&tools), &env_with_path()).await;
    let mut client = server.client().await;
    for attempt in 1..=2 {
        let r = exec(
            &mut client,
            &who("acme"),
            keyed("killed_write", "{}", "k-proc"),
        )
        .await;
        assert_eq!(
            (
                r.status(),
                r.error_type.as_str(),
                r.retryable,
                r.idempotent_replay
            ),
            (ToolStatus::Error, "tool_failed", false, attempt == 2),
            "attempt {attempt}: {r:?}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&writes).unwrap(),
        "w\n",
        "written once"
    );
    server.stop().await;
}
