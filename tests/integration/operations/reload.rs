//! Hot reload of the catalog file: valid catalogs swap in without disturbing calls in flight,
//! invalid ones are refused while the old one keeps serving.

use std::time::Duration;

use futures::future::join_all;
use toolgate::proto::{self, ToolStatus};

use crate::support::{
    Backend, STAGES, TestServer, call, exec, on_both_backends, visible, wait_until, who,
};

async fn revision(server: &TestServer) -> String {
    let mut client = server.client().await;
    client
        .list_tools(who("acme").request(proto::ListToolsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .catalog_revision
}

#[tokio::test]
async fn a_valid_catalog_replaces_the_old_and_an_invalid_one_is_refused() {
    let server = TestServer::start_file(STAGES).await;
    let mut client = server.client().await;
    let before = revision(&server).await;
    assert!(
        !visible(&mut client, &who("acme"))
            .await
            .contains(&"echo2".to_owned())
    );

    let added = STAGES.replace("tools:\n", "tools:\n  - { name: echo2, description: Echo again., risk_level: read_only, executor: { builtin: echo }, input_schema: { type: object } }\n");
    server.write_catalog(&server.catalog_file(), &added);
    let after = server.reload().await.expect("valid catalog reloads");
    assert_ne!(after, before);
    assert!(
        visible(&mut client, &who("acme"))
            .await
            .contains(&"echo2".to_owned())
    );
    assert_ne!(revision(&server).await, before);

    server.write_catalog(
        &server.catalog_file(),
        &added.replace("timeout: 300ms", "timeout: soon"),
    );
    let refused = server
        .reload()
        .await
        .expect_err("invalid catalog is refused");
    assert!(
        refused.contains("invalid duration") && refused.contains("timeout"),
        "{refused}"
    );
    // Still serving the last good one.
    assert!(
        visible(&mut client, &who("acme"))
            .await
            .contains(&"echo2".to_owned())
    );
    assert_eq!(
        exec(
            &mut client,
            &who("acme"),
            call("echo", r#"{"text":"still here"}"#)
        )
        .await
        .model_text,
        "still here"
    );
    server.stop().await;
}

#[tokio::test]
async fn file_changes_are_picked_up_including_a_configmap_style_symlink_swap() {
    // Lay the catalog out as Kubernetes mounts a ConfigMap: catalog.yaml -> ..data/catalog.yaml,
    // ..data -> ..v1; an update writes ..v2 and swaps ..data atomically.
    let yaml = STAGES.replace(
        "identity: { dev_identity: true }\n",
        "identity: { dev_identity: true }\nserver: { reload_interval: 50ms }\n",
    );
    let server = TestServer::start_file(&yaml).await;
    let dir = server.dir().join("cm");
    std::fs::create_dir_all(dir.join("..v1")).unwrap();
    server.write_catalog(&dir.join("..v1/catalog.yaml"), &yaml);
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    // Replace the served file with the symlinked one.
    std::fs::remove_file(server.catalog_file()).unwrap();
    std::os::unix::fs::symlink(dir.join("..data/catalog.yaml"), server.catalog_file()).unwrap();

    let swapped = yaml.replace(
        "description: Returns text.",
        "description: Returns the text, version two.",
    );
    std::fs::create_dir_all(dir.join("..v2")).unwrap();
    server.write_catalog(&dir.join("..v2/catalog.yaml"), &swapped);
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();

    let mut client = server.client().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let listed = client
            .list_tools(who("acme").request(proto::ListToolsRequest {}))
            .await
            .unwrap()
            .into_inner();
        if listed
            .tools
            .iter()
            .any(|t| t.description == "Returns the text, version two.")
        {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("the swapped catalog was not picked up within 10s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn calls_in_flight_finish_on_the_definition_they_started_with() {
    let yaml = STAGES.replace("    timeout: 300ms\n    executor: { builtin: slow_task }\n    input_schema: { type: object, properties: { ms: { type: integer } }, required: [ms] }\n  - name: slow_write", "    timeout: 3s\n    executor: { builtin: slow_task }\n    input_schema: { type: object, properties: { ms: { type: integer } }, required: [ms] }\n  - name: slow_write");
    assert_ne!(yaml, STAGES);
    let server = TestServer::start_file(&yaml).await;
    let started = server.builtins().watch_executions();
    let client = server.client().await;
    let running = tokio::spawn({
        let mut client = client.clone();
        async move { exec(&mut client, &who("acme"), call("slow", r#"{"ms":500}"#)).await }
    });
    tokio::time::timeout(Duration::from_secs(10), {
        let mut s = started.clone();
        async move { s.wait_for(|n| *n >= 1).await.map(|_| ()) }
    })
    .await
    .unwrap()
    .unwrap();
    // The new definition's timeout is shorter than the running call's sleep.
    server.write_catalog(
        &server.catalog_file(),
        &yaml.replace("timeout: 3s", "timeout: 100ms"),
    );
    server.reload().await.unwrap();
    let finished = running.await.unwrap();
    assert_eq!(
        finished.status(),
        ToolStatus::Ok,
        "the running call kept its 3s timeout: {finished:?}"
    );
    let mut c = client.clone();
    assert_eq!(
        exec(&mut c, &who("acme"), call("slow", r#"{"ms":500}"#))
            .await
            .status(),
        ToolStatus::Timeout
    );
    server.stop().await;
}

on_both_backends!(
    rate_limit_state_survives_for_unchanged_tools_and_changed_approvals_are_invalidated
);

async fn rate_limit_state_survives_for_unchanged_tools_and_changed_approvals_are_invalidated(
    backend: Backend,
) {
    let server = TestServer::start_file_on(backend, STAGES).await;
    let mut client = server.client().await;
    for _ in 0..5 {
        assert_eq!(
            exec(&mut client, &who("acme"), call("limited", "{}"))
                .await
                .status(),
            ToolStatus::Ok
        );
    }
    let pending = exec(
        &mut client,
        &who("acme"),
        call("approve_me", r#"{"order":"o-1"}"#),
    )
    .await;
    assert_eq!(pending.status(), ToolStatus::ApprovalRequired);

    // Change approve_me's definition and something unrelated; leave `limited` alone.
    let changed = STAGES.replace(
        "description: Needs an approval.",
        "description: Needs an approval (now for orders only).",
    );
    server.write_catalog(&server.catalog_file(), &changed);
    server.reload().await.unwrap();
    assert_eq!(
        exec(&mut client, &who("acme"), call("limited", "{}"))
            .await
            .status(),
        ToolStatus::RateLimited,
        "limiter state was kept"
    );
    // The approval itself is marked, as approvers list it.
    let state = server
        .approvals()
        .await
        .get_approval(
            who("acme")
                .subject("bob")
                .scopes("toolgate:approve")
                .request(proto::GetApprovalRequest {
                    approval_id: pending.approval_id.clone(),
                }),
        )
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap()
        .state();
    assert_eq!(state, proto::ApprovalState::Invalidated);
    let mut redeem = call("approve_me", r#"{"order":"o-1"}"#);
    redeem.approval_id = pending.approval_id.clone();
    let redeemed = exec(&mut client, &who("acme"), redeem).await;
    assert_eq!(
        (redeemed.status(), redeemed.error_type.as_str()),
        (ToolStatus::Denied, "approval_invalidated")
    );
    assert!(
        redeemed.error_message.contains("changed"),
        "{}",
        redeemed.error_message
    );

    // A tool whose quota changes starts afresh.
    server.write_catalog(
        &server.catalog_file(),
        &changed.replace("rate_limit: 5/min", "rate_limit: 6/min"),
    );
    server.reload().await.unwrap();
    assert_eq!(
        exec(&mut client, &who("acme"), call("limited", "{}"))
            .await
            .status(),
        ToolStatus::Ok
    );
    server.stop().await;
}

#[tokio::test]
async fn reloads_under_concurrent_calls_lose_nothing() {
    let server = TestServer::start_file(STAGES).await;
    let other = STAGES.replace(
        "description: Returns text.",
        "description: Returns text (b).",
    );
    let client = server.client().await;
    let callers = join_all((0..4).map(|i| {
        let mut client = client.clone();
        async move {
            let mut statuses = Vec::new();
            for j in 0..40 {
                statuses.push(
                    exec(
                        &mut client,
                        &who("acme"),
                        call("echo", &format!(r#"{{"text":"{i}-{j}"}}"#)),
                    )
                    .await,
                );
            }
            statuses
        }
    }));
    let reloads = async {
        for k in 0..10 {
            server.write_catalog(
                &server.catalog_file(),
                if k % 2 == 0 { &other } else { STAGES },
            );
            server.reload().await.unwrap();
            tokio::task::yield_now().await;
        }
    };
    let (results, ()) = tokio::join!(callers, reloads);
    let results: Vec<_> = results.into_iter().flatten().collect();
    assert_eq!(results.len(), 160);
    assert!(
        results.iter().all(|r| r.status() == ToolStatus::Ok),
        "{:?}",
        results.iter().find(|r| r.status() != ToolStatus::Ok)
    );
    assert_eq!(server.audit_events().await.len(), 160);
    server.stop().await;
}

/// A counter of the server's /metrics.
async fn counter(server: &TestServer, name: &str) -> f64 {
    let (_, page) = crate::support::http_get(server.admin_addr(), "/metrics").await;
    crate::support::metric(&page, name, &[])
}

/// Waits until the catalog file has been polled `n` more times than `since`.
async fn polled(server: &TestServer, since: f64, n: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while counter(server, "toolgate_catalog_file_polls_total").await < since + n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the catalog file was not polled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_unchanged_catalog_file_is_not_parsed_again_on_every_poll() {
    let yaml = STAGES.replacen(
        "version: 1\n",
        "version: 1\nserver: { reload_interval: 20ms }\n",
        1,
    );
    let server = TestServer::start_file(&yaml).await;
    polled(&server, 0.0, 2.0).await;
    let parses = counter(&server, "toolgate_catalog_file_parses_total").await;
    let polls = counter(&server, "toolgate_catalog_file_polls_total").await;
    // Twenty polls of the same file: nothing parsed.
    polled(&server, polls, 20.0).await;
    assert_eq!(
        counter(&server, "toolgate_catalog_file_parses_total").await,
        parses
    );
    // Written again with the same text: read and hashed, still not parsed.
    server.write_catalog(&server.catalog_file(), &yaml);
    let polls = counter(&server, "toolgate_catalog_file_polls_total").await;
    polled(&server, polls, 20.0).await;
    assert_eq!(
        counter(&server, "toolgate_catalog_file_parses_total").await,
        parses
    );
    // Changed: parsed (to fingerprint it, then to load it) and served.
    let added = yaml.replace("tools:\n", "tools:\n  - { name: echo2, description: Echo again., risk_level: read_only, executor: { builtin: echo }, input_schema: { type: object } }\n");
    server.write_catalog(&server.catalog_file(), &added);
    let mut client = server.client().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !visible(&mut client, &who("acme"))
        .await
        .contains(&"echo2".to_owned())
    {
        assert!(tokio::time::Instant::now() < deadline, "not reloaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        counter(&server, "toolgate_catalog_file_parses_total").await,
        parses + 2.0
    );
    server.stop().await;
}

/// A reload that turns dev identity on is refused when any listener callers are identified on
/// is reachable from other hosts — the MCP door's address as bound too, when an override
/// (`--mcp-listen`) moved it off the catalog's loopback address — and the previous identity
/// keeps serving; an IPv4-mapped loopback address counts as loopback. (Issue 52, item 8: only
/// the gRPC address and the catalog's `server.mcp.listen` were checked, so the door kept serving
/// on 0.0.0.0 and trusted `x-toolgate-*` headers after such a reload.)
#[tokio::test]
async fn a_reload_cannot_turn_dev_identity_on_where_a_listener_is_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "a-reload-secret-0123456789abcdef").unwrap();
    let tools = "tenants: { acme: {} }\ntools:\n  - { name: echo, description: Echo., risk_level: read_only, executor: { builtin: echo }, input_schema: { type: object, properties: { text: { type: string } } } }\n";
    let server =
        "server:\n  mcp: { listen: \"127.0.0.1:0\", resource: \"http://toolgate.test/mcp\" }\n";
    let jwt = format!(
        "version: 1\n{server}identity: {{ jwt: {{ hs256_secret_file: {} }} }}\n{tools}",
        secret.display()
    );
    let dev = format!("version: 1\n{server}identity: {{ dev_identity: true }}\n{tools}");
    let file = dir.path().join("catalog.yaml");
    let start = |mcp_listen: &str| {
        std::fs::write(&file, &jwt).unwrap();
        let config = toolgate::config::Config::load_file(&file, &Default::default()).unwrap();
        let options = toolgate::StartOptions {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            admin_listen: Some("127.0.0.1:0".parse().unwrap()),
            mcp_listen: Some(mcp_listen.parse().unwrap()),
            ..Default::default()
        };
        toolgate::start(config, options)
    };
    let as_dev_caller = |door: std::net::SocketAddr| async move {
        let body = serde_json::json!({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "hi"}},
        });
        reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/mcp", door.port()))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .header("host", "localhost")
            .header("x-toolgate-tenant", "acme")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
            .status()
    };
    toolgate::tls::install_crypto_provider();

    // The door moved to every interface by the override: the reload is refused.
    let running = start("0.0.0.0:0")
        .await
        .expect("a JWT sidecar starts anywhere");
    let door = running.mcp_addr().unwrap();
    assert_eq!(as_dev_caller(door).await, 401, "JWTs are required");
    std::fs::write(&file, &dev).unwrap();
    let refused = running.reload().await.unwrap_err().to_string();
    assert!(refused.contains("is not a loopback address"), "{refused}");
    assert_eq!(as_dev_caller(door).await, 401, "JWTs are still required");
    running.shutdown().await;

    // On an IPv4-mapped loopback address only this host reaches the door: allowed.
    let running = start("[::ffff:127.0.0.1]:0").await.expect("starts");
    std::fs::write(&file, &dev).unwrap();
    running.reload().await.expect("dev identity on loopback");
    running.shutdown().await;
}

#[tokio::test]
async fn a_tools_concurrency_cap_survives_a_reload() {
    let catalog = r#"version: 1
identity: { dev_identity: true }
tenants: { acme: {} }
tools:
  - { name: single, description: One at a time., risk_level: read_only, timeout: 30s, max_concurrency: 1, executor: { builtin: slow_task }, input_schema: { type: object, properties: { ms: { type: integer } } } }
"#;
    let server = TestServer::start_file(catalog).await;
    let mut first = server.client().await;
    let running = tokio::spawn(async move {
        exec(&mut first, &who("acme"), call("single", r#"{"ms":30000}"#)).await
    });
    wait_until(server.builtins().watch_slow_in_flight(), |n| n == 1).await;
    // An unrelated change: the cap of `single` is the same, and so are its calls in flight.
    let changed = catalog.to_owned()
        + "  - { name: other, description: Other., risk_level: read_only, executor: { builtin: echo }, input_schema: { type: object } }\n";
    server.write_catalog(&server.catalog_file(), &changed);
    server.reload().await.expect("reloaded");
    let mut second = server.client().await;
    assert_eq!(
        visible(&mut second, &who("acme")).await,
        ["other", "single"]
    );
    let r = exec(&mut second, &who("acme"), call("single", r#"{"ms":1}"#)).await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Unavailable, "overloaded"),
        "a reload let a second call past a cap of one"
    );
    running.abort();
    wait_until(server.builtins().watch_slow_in_flight(), |n| n == 0).await;
    server.stop().await;
}

#[tokio::test]
async fn a_refused_reload_is_retried_when_the_file_it_references_arrives() {
    let base = "version: 1\nserver: { reload_interval: 50ms }\nidentity: { dev_identity: true }\ntenants: { acme: {} }\ntools:\n  - { name: echo, description: Echo., risk_level: read_only, executor: { builtin: echo }, input_schema: { type: object } }\n";
    let server = TestServer::start_file(base).await;
    let secret = server.dir().join("billing.token");
    // The ConfigMap arrives first: it names a Secret that is not there yet.
    let next = base.replace(
        "tools:\n",
        &format!(
            "upstreams:\n  billing: {{ url: \"https://billing.example.com/\", headers: {{ authorization: {{ file: {} }} }} }}\ntools:\n  - {{ name: invoice, description: Invoice., risk_level: read_only, executor: {{ http: {{ upstream: billing }} }}, input_schema: {{ type: object }} }}\n",
            secret.display()
        ),
    );
    server.write_catalog(&server.catalog_file(), &next);
    let err = server.reload().await.unwrap_err();
    assert!(err.contains("billing.token"), "{err}");
    // Then the Secret: the watcher tries the same catalog again, without a SIGHUP.
    std::fs::write(&secret, "Bearer s3cret").unwrap();
    let mut grpc = server.client().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if visible(&mut grpc, &who("acme"))
            .await
            .contains(&"invoice".to_owned())
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the catalog was not applied once its Secret arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}
