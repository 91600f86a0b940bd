//! Rate limits: exact under concurrency, per (tenant, tool), with a sensible retry_after.

use std::time::Duration;

use futures::future::join_all;
use toolgate::proto::ToolStatus;

use crate::support::{Backend, STAGES, TestServer, call, exec, on_both_backends, who};

on_both_backends!(
    exactly_the_quota_is_admitted_under_64_concurrent_clients,
    the_demo_refund_quota_holds_before_approval,
    a_tenant_wide_quota_spans_tools,
);

/// 64 clients, each on its own connection, fire at once; returns the statuses and retry hints.
async fn burst(
    server: &TestServer,
    tool: &str,
    args: &str,
    tenant: &str,
) -> Vec<(ToolStatus, u64)> {
    let mut clients = Vec::new();
    for _ in 0..64 {
        clients.push(server.client().await);
    }
    join_all(clients.into_iter().map(|mut client| {
        let c = call(tool, args);
        async move {
            let result = exec(&mut client, &who(tenant), c).await;
            (result.status(), result.retry_after_ms)
        }
    }))
    .await
}

async fn exactly_the_quota_is_admitted_under_64_concurrent_clients(backend: Backend) {
    let server = TestServer::start_on(backend, STAGES).await;
    let results = burst(&server, "limited", "{}", "acme").await;
    let admitted = results.iter().filter(|(s, _)| *s == ToolStatus::Ok).count();
    let limited: Vec<u64> = results
        .iter()
        .filter(|(s, _)| *s == ToolStatus::RateLimited)
        .map(|(_, r)| *r)
        .collect();
    assert_eq!((admitted, limited.len()), (5, 59), "{results:?}");
    // 5/min refills one call every 12 s: the hint says when the next one fits.
    assert!(
        limited.iter().all(|&ms| ms > 0 && ms <= 12_000),
        "{limited:?}"
    );
    // Another tenant has its own quota.
    let mut client = server.client().await;
    assert_eq!(
        exec(&mut client, &who("globex"), call("limited", "{}"))
            .await
            .status(),
        ToolStatus::Ok
    );
    // Waiting as told admits exactly one more.
    let refused = exec(&mut client, &who("acme"), call("limited", "{}")).await;
    assert_eq!(
        (
            refused.status(),
            refused.error_type.as_str(),
            refused.refused_by.as_str()
        ),
        (ToolStatus::RateLimited, "rate_limited", "rate_limit")
    );
    assert!(refused.retryable);
    if backend == Backend::Redis {
        // Redis keeps its own time, which a test cannot move: 12 s are not waited for here.
        server.stop().await;
        return;
    }
    server
        .clock
        .advance(Duration::from_millis(refused.retry_after_ms));
    assert_eq!(
        exec(&mut client, &who("acme"), call("limited", "{}"))
            .await
            .status(),
        ToolStatus::Ok
    );
    assert_eq!(
        exec(&mut client, &who("acme"), call("limited", "{}"))
            .await
            .status(),
        ToolStatus::RateLimited
    );
    server.stop().await;
}

async fn the_demo_refund_quota_holds_before_approval(backend: Backend) {
    let server = TestServer::demo_on(backend).await;
    let results = burst(
        &server,
        "refund_order",
        r#"{"order_id":"o-1","amount_cents":2500}"#,
        "acme",
    )
    .await;
    let asked = results
        .iter()
        .filter(|(s, _)| *s == ToolStatus::ApprovalRequired)
        .count();
    let limited = results
        .iter()
        .filter(|(s, _)| *s == ToolStatus::RateLimited)
        .count();
    assert_eq!((asked, limited), (5, 59));
    server.stop().await;
}

async fn a_tenant_wide_quota_spans_tools(backend: Backend) {
    let yaml = STAGES.replace("  acme: {}\n", "  acme: { rate_limit: 3/min }\n");
    let server = TestServer::start_on(backend, &yaml).await;
    let mut client = server.client().await;
    let statuses: Vec<ToolStatus> = futures::future::join_all((0..5).map(|i| {
        let mut client = client.clone();
        let tool = if i % 2 == 0 { "half" } else { "greet" };
        async move {
            exec(&mut client, &who("acme"), call(tool, "{}"))
                .await
                .status()
        }
    }))
    .await;
    assert_eq!(
        statuses.iter().filter(|s| **s == ToolStatus::Ok).count(),
        3,
        "{statuses:?}"
    );
    let refused = exec(&mut client, &who("acme"), call("half", "{}")).await;
    assert!(
        refused.error_message.contains("overall rate limit"),
        "{}",
        refused.error_message
    );
    server.stop().await;
}
