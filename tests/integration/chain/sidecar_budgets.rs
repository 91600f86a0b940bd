//! Sidecar-wide budgets (issue 12): what all tenants together may hold — request bytes, the
//! parsed arguments of slow calls, idempotency results, open approvals and remembered catalog
//! revisions — stays within its bound, and over a budget the tenant holding the most gives way.

use std::time::Duration;

use futures::future::join_all;
use tonic::Code;
use toolgate::proto::{self, ToolStatus};

use super::hostile_input::{serve_file, status_kib};
use crate::support::{
    STAGES, TestServer,
    binary::{client, stop},
    call, exec, execute_request, http_get, metric, wait_until, who,
};

#[tokio::test]
async fn request_bytes_held_sidecar_wide_are_bounded() {
    let catalog = r#"version: 1
identity: { dev_identity: true }
limits: { max_message_bytes: 4194304, max_request_bytes_in_flight: 4194304, max_arguments_bytes: 3500000, max_arguments_values: 100 }
tenants: { acme: {} }
tools:
  - { name: wait, description: Waits., risk_level: read_only, timeout: 30s, executor: { builtin: slow_task }, input_schema: { type: object, properties: { ms: { type: integer }, pad: { type: string } } } }
"#;
    let server = TestServer::start(catalog).await;
    let pad = "p".repeat(3 * 1024 * 1024);
    let args = format!(r#"{{"ms":30000,"pad":"{pad}"}}"#);
    let held = tokio::spawn({
        let mut grpc = server.client().await;
        let args = args.clone();
        async move { exec(&mut grpc, &who("acme"), call("wait", &args)).await }
    });
    wait_until(server.builtins().watch_slow_in_flight(), |n| n == 1).await;
    // Three more megabytes would be over the four the sidecar may hold.
    let mut second = server.client().await;
    let err = second
        .execute_tool(who("acme").request(execute_request(call("wait", &args))))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("max_request_bytes_in_flight"),
        "{err:?}"
    );
    // Small calls still get through.
    let small = exec(&mut second, &who("acme"), call("wait", r#"{"ms":1}"#)).await;
    assert_eq!(small.status(), ToolStatus::Ok);
    held.abort();
    wait_until(server.builtins().watch_slow_in_flight(), |n| n == 0).await;
    server.stop().await;
}

#[tokio::test]
async fn parsed_arguments_of_slow_calls_are_bounded_sidecar_wide() {
    let yaml = r#"version: 1
identity: { dev_identity: true }
audit: { sink: none }
tenants: { acme: {} }
tools:
  - { name: wait, description: Waits., risk_level: read_only, timeout: 30s, executor: { builtin: slow_task }, input_schema: { type: object, properties: { ms: { type: integer }, pad: { type: array } } } }
"#;
    let dir = tempfile::tempdir().unwrap();
    let server = serve_file(dir.path(), yaml);
    let pid = server.child.id();
    let mut grpc = client(&server.addr).await;
    exec(&mut grpc, &who("acme"), call("wait", r#"{"ms":1}"#)).await;
    let peak_before = status_kib(pid, "VmHWM:");
    // As in the report: 60 slow calls, each ~200 KB of text holding ~100,000 values, 12 MB of
    // requests in all (well under max_request_bytes_in_flight), which parsed would take ~470 MiB.
    let pad = vec!["1"; 99_990].join(",");
    let args = format!(r#"{{"ms":3000,"pad":[{pad}]}}"#);
    let results = join_all((0..60).map(|_| {
        let mut grpc = grpc.clone();
        let args = args.clone();
        async move { exec(&mut grpc, &who("acme"), call("wait", &args)).await }
    }))
    .await;
    let ran = results
        .iter()
        .filter(|r| r.status() == ToolStatus::Ok)
        .count();
    for r in results.iter().filter(|r| r.status() != ToolStatus::Ok) {
        assert_eq!(
            (
                r.status(),
                r.error_type.as_str(),
                r.refused_by.as_str(),
                r.retryable
            ),
            (ToolStatus::Unavailable, "overloaded", "structure", true),
            "{}",
            r.error_message
        );
        assert!(
            r.error_message
                .contains("max_parsed_arguments_bytes_in_flight"),
            "{}",
            r.error_message
        );
    }
    // The default budget (64 MiB) holds a handful of these at once, and refuses the rest.
    assert!((1..60).contains(&ran), "{ran} of 60 ran");
    let grown_mib = (status_kib(pid, "VmHWM:") - peak_before) / 1024;
    assert!(grown_mib < 200, "peak RSS grew by {grown_mib} MiB");
    drop(grpc);
    stop(server).await;
}

/// Calls `echo` with an idempotency key and about 10 KiB of text; whether it was a replay.
async fn keyed_echo(
    grpc: &mut toolgate::proto::tool_gate_client::ToolGateClient<tonic::transport::Channel>,
    tenant: &str,
    key: &str,
) -> bool {
    let mut c = call(
        "echo",
        &format!(r#"{{"text":"{key}{}"}}"#, "t".repeat(10 * 1024)),
    );
    c.idempotency_key = key.to_owned();
    let r = exec(grpc, &who(tenant), c).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{}", r.error_message);
    r.idempotent_replay
}

#[tokio::test]
async fn over_the_sidecar_wide_idempotency_budget_the_tenant_holding_the_most_gives_way() {
    // Each tenant may hold ~64 KiB, the sidecar 96 KiB: less than two tenants' shares.
    let catalog = STAGES.replace(
        "limits: { max_arguments_bytes: 4096,",
        "limits: { idempotency_max_bytes_per_tenant: 65536, idempotency_max_bytes: 98304, max_arguments_bytes: 16384,",
    );
    let server = TestServer::start(&catalog).await;
    let mut grpc = server.client().await;
    // acme keeps five results (~50 KiB), within its own share.
    for i in 0..5 {
        assert!(!keyed_echo(&mut grpc, "acme", &format!("acme-{i}")).await);
    }
    // globex's five (~50 KiB) put the sidecar over its total: acme, holding as much and older,
    // loses its oldest, and only as many as needed.
    for i in 0..5 {
        assert!(!keyed_echo(&mut grpc, "globex", &format!("globex-{i}")).await);
    }
    let (_, page) = http_get(server.admin_addr(), "/metrics").await;
    let held = metric(&page, "toolgate_idempotency_bytes", &[]);
    assert!(held <= 98304.0, "{held} bytes held");
    for i in 0..5 {
        assert!(
            keyed_echo(&mut grpc, "globex", &format!("globex-{i}")).await,
            "globex-{i} was evicted, though globex holds less"
        );
    }
    assert!(
        keyed_echo(&mut grpc, "acme", "acme-4").await,
        "acme's newest was evicted"
    );
    let executed = server.builtins().executions();
    assert!(
        !keyed_echo(&mut grpc, "acme", "acme-0").await,
        "acme's oldest was kept over the total budget"
    );
    assert_eq!(server.builtins().executions(), executed + 1, "it ran again");
    server.stop().await;
}

#[tokio::test]
async fn over_the_sidecar_wide_approvals_budget_the_tenant_holding_the_most_gives_way() {
    let catalog = STAGES
        .replacen(
            "version: 1\n",
            "version: 1\napprovals: { max_bytes_per_tenant: 65536, max_bytes: 98304 }\n",
            1,
        )
        .replace("max_arguments_bytes: 4096", "max_arguments_bytes: 16384");
    let server = TestServer::start(&catalog).await;
    let grpc = server.client().await;
    let mut approvals = server.approvals().await;
    // acme's approvals hold 10 KiB of arguments each, globex's 4 KiB.
    let request = |tenant: &str, order: String| {
        let mut grpc = grpc.clone();
        let tenant = tenant.to_owned();
        let pad = if tenant == "acme" {
            10 * 1024
        } else {
            4 * 1024
        };
        async move {
            let r = exec(
                &mut grpc,
                &who(&tenant).subject("alice"),
                call(
                    "approve_me",
                    &format!(r#"{{"order":"{order}{}"}}"#, "o".repeat(pad)),
                ),
            )
            .await;
            assert_eq!(
                r.status(),
                ToolStatus::ApprovalRequired,
                "{}",
                r.error_message
            );
            r.approval_id
        }
    };
    let approver = |tenant: &str| who(tenant).subject("bob").scopes("toolgate:approve");
    // acme's five approvals, rejected: finished, so they may be forgotten.
    let mut acme = Vec::new();
    for i in 0..5 {
        server.clock.advance(Duration::from_millis(1));
        let id = request("acme", format!("a{i}")).await;
        approvals
            .decide_approval(approver("acme").request(proto::DecideApprovalRequest {
                approval_id: id.clone(),
                decision: proto::ApprovalDecision::Reject as i32,
                reason: "no".into(),
            }))
            .await
            .unwrap();
        acme.push(id);
    }
    // globex's eight (~45 KiB), the first two rejected too: it could give way, but holds less;
    // its last puts the sidecar over the total.
    let mut globex = Vec::new();
    for i in 0..8 {
        let id = request("globex", format!("g{i}")).await;
        if i < 2 {
            approvals
                .decide_approval(approver("globex").request(proto::DecideApprovalRequest {
                    approval_id: id.clone(),
                    decision: proto::ApprovalDecision::Reject as i32,
                    reason: "no".into(),
                }))
                .await
                .unwrap();
        }
        globex.push(id);
    }
    let exists = |tenant: &'static str, id: String| {
        let mut approvals = approvals.clone();
        async move {
            match approvals
                .get_approval(
                    approver(tenant).request(proto::GetApprovalRequest { approval_id: id }),
                )
                .await
            {
                Ok(_) => true,
                Err(status) if status.code() == Code::NotFound => false,
                Err(status) => panic!("{status:?}"),
            }
        }
    };
    for id in &globex {
        assert!(exists("globex", id.clone()).await, "globex lost {id}");
    }
    assert!(!exists("acme", acme[0].clone()).await, "acme's oldest kept");
    assert!(
        exists("acme", acme[4].clone()).await,
        "acme's newest forgotten"
    );
    let (_, page) = http_get(server.admin_addr(), "/metrics").await;
    let held = metric(&page, "toolgate_approvals_bytes", &[]);
    assert!(held <= 98304.0, "{held} bytes held");
    server.stop().await;
}

/// A catalog whose `note` says `note`; acme sees three tools, initech only `echo`.
fn revisions_catalog(note: &str, log_bytes: usize) -> String {
    format!(
        r#"version: 1
identity: {{ dev_identity: true }}
limits: {{ revision_log_max_bytes: {log_bytes} }}
tenants: {{ acme: {{}}, initech: {{ allow: [echo] }} }}
tools:
  - {{ name: echo, description: Echo., risk_level: read_only, executor: {{ builtin: echo }}, input_schema: {{ type: object, properties: {{ text: {{ type: string }} }} }} }}
  - {{ name: note, description: "{note}", risk_level: read_only, executor: {{ builtin: echo }}, input_schema: {{ type: object }} }}
  - {{ name: other, description: Other., risk_level: read_only, executor: {{ builtin: echo }}, input_schema: {{ type: object }} }}
"#
    )
}

/// The revision `tenant`'s model is shown, and the revision log's bytes after listing it.
async fn list_revision(server: &TestServer, tenant: &str) -> (String, f64) {
    let mut grpc = server.client().await;
    let revision = grpc
        .list_tools(who(tenant).request(proto::ListToolsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .catalog_revision;
    let (_, page) = http_get(server.admin_addr(), "/metrics").await;
    (revision, metric(&page, "toolgate_revision_log_bytes", &[]))
}

/// Calls echo as acme, saying the model was shown `revision`.
async fn echo_shown(server: &TestServer, revision: &str) -> proto::ToolResult {
    let mut grpc = server.client().await;
    let mut request = execute_request(call("echo", r#"{"text":"hi"}"#));
    request.catalog_revision = revision.to_owned();
    grpc.execute_tool(who("acme").request(request))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap()
}

#[tokio::test]
async fn forgotten_revisions_are_checked_against_the_current_one() {
    // Room for acme's revision or initech's, not both.
    let small = TestServer::start_file(&revisions_catalog("Notes.", 700)).await;
    let (acme, with_acme) = list_revision(&small, "acme").await;
    let (_, with_initech) = list_revision(&small, "initech").await;
    assert!(
        with_acme > 0.0 && with_initech > 0.0 && with_initech < with_acme && with_acme <= 700.0,
        "acme's revision ({with_acme} bytes) was not replaced by initech's ({with_initech})"
    );
    // Forgotten, but still what acme would be shown now: the call runs (and it is remembered
    // again).
    let r = echo_shown(&small, &acme).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{}", r.error_message);
    list_revision(&small, "initech").await;
    // A reload changes `note`, which the call does not use. A remembered revision would show
    // that echo is unchanged; a forgotten one can only be compared whole with today's.
    let large = TestServer::start_file(&revisions_catalog("Notes.", 1 << 20)).await;
    let (kept, _) = list_revision(&large, "acme").await;
    assert_eq!(kept, acme, "the same catalog, the same revision");
    small.write_catalog(
        &small.catalog_file(),
        &revisions_catalog("Changed notes.", 700),
    );
    large.write_catalog(
        &large.catalog_file(),
        &revisions_catalog("Changed notes.", 1 << 20),
    );
    small.reload().await.expect("reloaded");
    large.reload().await.expect("reloaded");
    let remembered = echo_shown(&large, &acme).await;
    assert_eq!(
        remembered.status(),
        ToolStatus::Ok,
        "{}",
        remembered.error_message
    );
    let forgotten = echo_shown(&small, &acme).await;
    assert_eq!(
        forgotten.status(),
        ToolStatus::StaleCatalog,
        "{}",
        forgotten.error_message
    );
    assert!(
        forgotten
            .error_message
            .contains("not known to this sidecar"),
        "{}",
        forgotten.error_message
    );
    small.stop().await;
    large.stop().await;
}
