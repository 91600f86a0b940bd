//! Pinned MCP tool definitions (issue 32 A), against real MCP servers: our own Python SDK server
//! that changes a tool's definition on command (tests/fixtures/mcp_rug_pull_server.py) and
//! `server-everything` from npm. `toolgate pin` prints and writes the pins, `check --strict-mcp`
//! requires them; a pinned tool whose server lists another definition is withdrawn (not listed,
//! `UNAVAILABLE`/`definition_changed`, not retryable) or with `on_definition_change: warn` kept,
//! audited (`tool_definition_changed`, with the parts that changed) and counted either way; an
//! operator's new pin takes effect on reload, without a restart.

use std::{path::Path, process::Output, time::Duration};

use serde_json::Value;
use toolgate::proto::{self, ToolStatus};

use crate::{
    executors::{env_with_path, everything_server},
    support::python,
    support::{TestServer, call, exec, http_get, metric, who},
};

fn toolgate(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(args)
        .output()
        .expect("toolgate runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A catalog of the rug-pull server's tools, keeping its state in `dir`.
fn rug_catalog(dir: &Path, server_settings: &str) -> String {
    format!(
        r#"version: 1
identity: {{ dev_identity: true }}
tenants: {{ acme: {{}} }}
mcp_servers:
  rug:
    command: ["{py}", "{root}/tests/fixtures/mcp_rug_pull_server.py"]
    env: [PATH, HOME]
    set_env: {{ RUG_STATE: "{state}" }}{server_settings}
    tools:
      search:
        risk_level: read_only   # reviewed by the docs team
      rug_pull: {{ risk_level: read_only }}
      restore: {{ risk_level: read_only }}
tools: []
"#,
        py = python(),
        root = env!("CARGO_MANIFEST_DIR"),
        state = dir.join("rug-state").display(),
    )
}

/// `toolgate pin --write` on the file; its pins by tool, as the file now says.
fn pin_file(file: &Path) -> serde_yaml_ng::Value {
    let out = toolgate(&["pin", "--config", &file.display().to_string(), "--write"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let written: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    written["mcp_servers"]["rug"]["tools"].clone()
}

/// The tool as ListTools shows it to acme, if it does.
async fn listed(server: &TestServer, name: &str) -> Option<proto::ToolDefinition> {
    server
        .client()
        .await
        .list_tools(who("acme").request(proto::ListToolsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .tools
        .into_iter()
        .find(|t| t.name == name)
}

/// Waits (bounded) until ListTools shows `name` as `wanted` says.
async fn until(
    server: &TestServer,
    name: &str,
    wanted: impl Fn(Option<&proto::ToolDefinition>) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !wanted(listed(server, name).await.as_ref()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} not as wanted within 60s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A call of rug.search as acme.
async fn search(
    client: &mut toolgate::proto::tool_gate_client::ToolGateClient<tonic::transport::Channel>,
) -> proto::ToolResult {
    exec(
        client,
        &who("acme"),
        call("rug.search", r#"{"query":"pins"}"#),
    )
    .await
}

/// The `tool_definition_changed` events so far.
async fn changes(server: &TestServer) -> Vec<Value> {
    server.audit_events_of("tool_definition_changed").await
}

async fn changes_metric(server: &TestServer, tool: &str, status: &str) -> f64 {
    let (_, text) = http_get(server.admin_addr(), "/metrics").await;
    metric(
        &text,
        "toolgate_tool_definition_changes_total",
        &[("server", "rug"), ("tool", tool), ("status", status)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_tool_whose_server_changes_it_is_withdrawn_audited_and_served_once_repinned() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("catalog.yaml");
    std::fs::write(&file, rug_catalog(dir.path(), "")).unwrap();
    let path = file.display().to_string();

    // Unpinned, --strict-mcp refuses the catalog, naming each tool.
    let strict = toolgate(&["check", "--strict-mcp", "--config", &path]);
    assert!(!strict.status.success());
    for tool in ["search", "rug_pull", "restore"] {
        assert!(
            text(&strict.stderr).contains(&format!("mcp_servers.rug.tools.{tool}.pin: not pinned")),
            "{}",
            text(&strict.stderr)
        );
    }
    // `toolgate pin` prints the pins and leaves the file alone; --write sets them, keeping
    // comments, and round-trips into check --strict-mcp.
    let printed = toolgate(&["pin", "--config", &path]);
    assert!(printed.status.success(), "{}", text(&printed.stderr));
    let before = std::fs::read_to_string(&file).unwrap();
    assert!(!before.contains("pin:"));
    let pins = pin_file(&file);
    let pin = |tool: &str| pins[tool]["pin"].as_str().unwrap().to_owned();
    for tool in ["search", "rug_pull", "restore"] {
        assert!(pin(tool).starts_with("sha256:"), "{pins:?}");
        assert!(
            text(&printed.stdout).contains(&format!("pin: \"{}\"  # not pinned", pin(tool))),
            "{}",
            text(&printed.stdout)
        );
    }
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(written.contains("# reviewed by the docs team"), "{written}");
    let strict = toolgate(&["check", "--strict-mcp", "--config", &path]);
    assert!(strict.status.success(), "{}", text(&strict.stderr));
    let reviewed = pin("search");

    let server = TestServer::start_file_with_env(&written, &env_with_path()).await;
    until(&server, "rug.search", |t| t.is_some()).await;
    let mut client = server.client().await;
    let acme = who("acme");
    let r = search(&mut client).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    assert!(changes(&server).await.is_empty(), "nothing changed yet");

    // The server changes search's definition and says so.
    let r = exec(&mut client, &acme, call("rug.rug_pull", "{}")).await;
    assert_eq!(r.model_text, "pulled", "{r:?}");
    until(&server, "rug.search", |t| t.is_none()).await;
    let r = search(&mut client).await;
    assert_eq!(r.status(), ToolStatus::Unavailable, "{r:?}");
    assert_eq!(r.error_type, "definition_changed");
    assert!(!r.retryable, "no retry helps until an operator acts");
    assert!(r.error_message.contains("withdrawn"), "{}", r.error_message);
    // The other tools of the server did not change and are still served.
    let r = exec(&mut client, &acme, call("rug.restore", "{}")).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    until(&server, "rug.search", |t| t.is_some()).await;
    let r = exec(&mut client, &acme, call("rug.rug_pull", "{}")).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    until(&server, "rug.search", |t| t.is_none()).await;

    // Audited: withdrawn, restored, withdrawn; each change once, with the parts that changed.
    let events = changes(&server).await;
    let statuses: Vec<&str> = events
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["WITHDRAWN", "RESTORED", "WITHDRAWN"],
        "{events:#?}"
    );
    let withdrawn = &events[0];
    assert_eq!(withdrawn["tool"], "rug.search");
    assert_eq!(withdrawn["server"], "rug");
    assert_eq!(withdrawn["server_tool"], "search");
    assert_eq!(withdrawn["pinned_sha256"], reviewed.as_str());
    assert_eq!(withdrawn["previous_sha256"], reviewed.as_str());
    assert_ne!(withdrawn["listed_sha256"], reviewed.as_str());
    assert_eq!(
        withdrawn["changed"],
        serde_json::json!(["description", "input_schema"])
    );
    assert_eq!(events[1]["listed_sha256"], reviewed.as_str());
    assert_eq!(
        changes_metric(&server, "rug.search", "WITHDRAWN").await,
        2.0
    );
    assert_eq!(changes_metric(&server, "rug.search", "RESTORED").await, 1.0);

    // The operator reviews the new definition and pins it: a reload serves it, no restart.
    let catalog = server.catalog_file();
    let printed = toolgate(&["pin", "--config", &catalog.display().to_string()]);
    assert!(
        text(&printed.stdout).contains(&format!(
            "# the catalog pins {reviewed}: the definition changed"
        )),
        "{}",
        text(&printed.stdout)
    );
    let repinned = pin_file(&catalog);
    assert_ne!(repinned["search"]["pin"].as_str(), Some(reviewed.as_str()));
    server.reload().await.expect("a new pin reloads");
    let shown = listed(&server, "rug.search").await.expect("served again");
    assert!(
        shown.description.contains("evil.example"),
        "the reviewed new text: {shown:?}"
    );
    assert!(shown.input_schema_json.contains("bcc"), "{shown:?}");
    let r = search(&mut client).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    let last = changes(&server).await.pop().unwrap();
    assert_eq!(last["status"], "RESTORED");
    assert_eq!(
        last["pinned_sha256"].as_str(),
        repinned["search"]["pin"].as_str()
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_warn_mode_a_changed_tool_is_kept_with_its_new_definition_and_audited() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("catalog.yaml");
    std::fs::write(
        &file,
        rug_catalog(dir.path(), "\n    on_definition_change: warn"),
    )
    .unwrap();
    let pins = pin_file(&file);
    let written = std::fs::read_to_string(&file).unwrap();
    let server = TestServer::start_file_with_env(&written, &env_with_path()).await;
    until(&server, "rug.search", |t| t.is_some()).await;
    let mut client = server.client().await;
    let r = exec(&mut client, &who("acme"), call("rug.rug_pull", "{}")).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    until(&server, "rug.search", |t| {
        t.is_some_and(|t| t.description.contains("evil.example"))
    })
    .await;
    let r = exec(
        &mut client,
        &who("acme"),
        call("rug.search", r#"{"query":"q"}"#),
    )
    .await;
    assert_eq!(r.status(), ToolStatus::Ok, "kept: {r:?}");
    let events = changes(&server).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["status"], "KEPT");
    assert_eq!(
        events[0]["pinned_sha256"].as_str(),
        pins["search"]["pin"].as_str()
    );
    assert_eq!(
        events[0]["changed"],
        serde_json::json!(["description", "input_schema"])
    );
    assert_eq!(changes_metric(&server, "rug.search", "KEPT").await, 1.0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_tools_are_served_only_as_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("catalog.yaml");
    let catalog = |echo_pin: &str, sum_pin: &str| {
        format!(
            r#"version: 1
identity: {{ dev_identity: true }}
tenants: {{ acme: {{}} }}
mcp_servers:
  everything:
    command: ["node", "{everything}", "stdio"]
    env: [PATH, HOME]
    tools:
      echo: {{ risk_level: read_only{echo_pin} }}
      get-sum: {{ risk_level: read_only{sum_pin} }}
tools: []
"#,
            everything = everything_server()
        )
    };
    std::fs::write(&file, catalog("", "")).unwrap();
    let out = toolgate(&["pin", "--config", &file.display().to_string(), "--write"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let written: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let echo_pin = written["mcp_servers"]["everything"]["tools"]["echo"]["pin"]
        .as_str()
        .unwrap()
        .to_owned();
    let strict = toolgate(&[
        "check",
        "--strict-mcp",
        "--config",
        &file.display().to_string(),
    ]);
    assert!(strict.status.success(), "{}", text(&strict.stderr));
    // get-sum pinned to a definition it never had: withdrawn from the first listing.
    let wrong = format!("sha256:{}", "0".repeat(64));
    let yaml = catalog(
        &format!(", pin: \"{echo_pin}\""),
        &format!(", pin: \"{wrong}\""),
    );
    let server = TestServer::start_file_with_env(&yaml, &env_with_path()).await;
    until(&server, "everything.echo", |t| t.is_some()).await;
    assert!(listed(&server, "everything.get-sum").await.is_none());
    let mut client = server.client().await;
    let r = exec(
        &mut client,
        &who("acme"),
        call("everything.echo", r#"{"message":"hi"}"#),
    )
    .await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    let r = exec(
        &mut client,
        &who("acme"),
        call("everything.get-sum", r#"{"a":1,"b":2}"#),
    )
    .await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Unavailable, "definition_changed"),
        "{r:?}"
    );
    let events = changes(&server).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(event["tool"], "everything.get-sum");
    assert_eq!(event["status"], "WITHDRAWN");
    assert_eq!(event["pinned_sha256"], wrong.as_str());
    // Never seen otherwise by this sidecar: no previous definition, parts unknown.
    assert!(event.get("previous_sha256").is_none(), "{event}");
    assert!(event.get("changed").is_none(), "{event}");
    server.stop().await;
}
