//! Every metric docs/observability.md lists appears on /metrics and moves as documented: calls in
//! flight, the duration histogram, refusals, rate limits, pending approvals, catalog reloads and
//! the revision, the audit queue's depth and the events written (dropped stays 0: only a dead audit
//! writer can drop, which no test can cause honestly).

use std::{io::Read, time::Duration};

use toolgate::proto::{self, ApprovalDecision, ToolStatus};

use crate::support::{STAGES, TestServer, call, exec, http_get, metric, who};

async fn scrape(server: &TestServer) -> String {
    let (status, text) = http_get(server.admin_addr(), "/metrics").await;
    assert_eq!(status, 200);
    text
}

/// The value of one exact sample line, e.g. `toolgate_x_bucket{tool="a",le="0.5"}`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listed_metrics_appear_and_move() {
    let server = TestServer::start_file(STAGES).await;
    let mut client = server.client().await;
    let before = scrape(&server).await;
    let revision_before: Vec<&str> = before
        .lines()
        .filter(|l| l.starts_with("toolgate_catalog_revision_info{"))
        .collect();
    assert_eq!(revision_before.len(), 1, "{before}");
    assert_eq!(metric(&before, "toolgate_calls_in_flight", &[]), 0.0);

    // In flight: 1 while a call runs, 0 after.
    let started = server.builtins().watch_executions();
    let slow = tokio::spawn({
        let mut client = client.clone();
        async move { exec(&mut client, &who("acme"), call("slow", r#"{"ms":200}"#)).await }
    });
    tokio::time::timeout(Duration::from_secs(10), {
        let mut started = started.clone();
        async move { started.wait_for(|n| *n >= 1).await.map(|_| ()) }
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        metric(&scrape(&server).await, "toolgate_calls_in_flight", &[]),
        1.0
    );
    assert_eq!(slow.await.unwrap().status(), ToolStatus::Ok);
    let after = scrape(&server).await;
    assert_eq!(metric(&after, "toolgate_calls_in_flight", &[]), 0.0);
    // The duration histogram: one observation for `slow`, at least its 200 ms.
    let bucket = |text: &str, le: &str| {
        sample(
            text,
            &format!("toolgate_tool_call_duration_seconds_bucket{{le=\"{le}\",tool=\"slow\"}}"),
        )
    };
    assert_eq!(
        sample(
            &after,
            "toolgate_tool_call_duration_seconds_count{tool=\"slow\"}"
        ),
        Some(1.0),
        "{after}"
    );
    assert!(
        sample(
            &after,
            "toolgate_tool_call_duration_seconds_sum{tool=\"slow\"}"
        )
        .is_some_and(|s| s >= 0.2),
        "{after}"
    );
    assert_eq!(bucket(&after, "0.128"), Some(0.0), "{after}");
    assert_eq!(bucket(&after, "+Inf"), Some(1.0), "{after}");

    // Refusals by stage and error type; rate limits by tool.
    exec(&mut client, &who("acme"), call("typed", "{}")).await;
    for _ in 0..6 {
        exec(&mut client, &who("acme"), call("limited", "{}")).await;
    }
    // Approvals pending: 1 once requested, 0 once decided.
    let r = exec(&mut client, &who("acme"), call("approve_me", "{}")).await;
    assert_eq!(r.status(), ToolStatus::ApprovalRequired);
    let text = scrape(&server).await;
    assert_eq!(
        metric(
            &text,
            "toolgate_refusals_total",
            &[("stage", "schema"), ("error_type", "schema_violation")]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &text,
            "toolgate_refusals_total",
            &[("stage", "rate_limit"), ("error_type", "rate_limited")]
        ),
        1.0
    );
    assert_eq!(
        metric(&text, "toolgate_rate_limited_total", &[("tool", "limited")]),
        1.0
    );
    assert_eq!(
        metric(
            &text,
            "toolgate_tool_calls_total",
            &[("tool", "limited"), ("status", "OK")]
        ),
        5.0
    );
    assert_eq!(metric(&text, "toolgate_approvals_pending", &[]), 1.0);
    let mut approvals = server.approvals().await;
    approvals
        .decide_approval(
            who("acme")
                .subject("bob")
                .scopes("toolgate:approve")
                .request(proto::DecideApprovalRequest {
                    approval_id: r.approval_id.clone(),
                    decision: ApprovalDecision::Approve as i32,
                    reason: String::new(),
                }),
        )
        .await
        .unwrap();
    let text = scrape(&server).await;
    assert_eq!(metric(&text, "toolgate_approvals_pending", &[]), 0.0);

    // Audit: every event written is counted; nothing is queued at rest; nothing dropped.
    let events = server.audit_events().await.len();
    let text = scrape(&server).await;
    assert_eq!(
        metric(&text, "toolgate_audit_events_written", &[]),
        events as f64
    );
    assert_eq!(metric(&text, "toolgate_audit_queue_depth", &[]), 0.0);
    assert_eq!(metric(&text, "toolgate_audit_events_dropped", &[]), 0.0);

    // Reloads: ok and refused counted; the revision label follows the catalog.
    server.write_catalog(
        &server.catalog_file(),
        &STAGES.replace(
            "description: Returns text.",
            "description: Returns text, v2.",
        ),
    );
    let revision = server.reload().await.expect("a valid catalog reloads");
    server.write_catalog(&server.catalog_file(), "version: 1\nnot_a_field: 1\n");
    server
        .reload()
        .await
        .expect_err("an invalid catalog is refused");
    let text = scrape(&server).await;
    assert_eq!(
        metric(&text, "toolgate_catalog_reloads_total", &[("result", "ok")]),
        1.0
    );
    assert_eq!(
        metric(
            &text,
            "toolgate_catalog_reloads_total",
            &[("result", "refused")]
        ),
        1.0
    );
    let revisions: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("toolgate_catalog_revision_info{"))
        .collect();
    assert_eq!(
        revisions,
        [format!(
            "toolgate_catalog_revision_info{{revision=\"{revision}\"}} 1"
        )],
        "one revision, the new one"
    );
    assert_ne!(revisions[0], revision_before[0]);
    server.stop().await;
}

/// The audit queue's depth rises while the sink is stuck and falls back to 0 once it drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_queue_depth_follows_a_stuck_sink() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("audit.fifo");
    crate::support::mkfifo(&fifo);
    // A reader that holds the pipe open and does not read: once its buffer is full, writes block.
    let mut stuck = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap()
    };
    let yaml = STAGES.replacen(
        "version: 1\n",
        &format!(
            "version: 1\naudit: {{ sink: file, path: {}, queue_capacity: 4, when_full: refuse }}\n",
            fifo.display()
        ),
        1,
    );
    let server = TestServer::start_raw(&yaml).await;
    let mut client = server.client().await;
    let mut ok = 0;
    // Calls run until the queue is full and stays full (a 64 KiB pipe fills within a few hundred
    // events). A refusal alone does not show that: four calls can fill the queue while the writer
    // is still gathering a batch it will write, and the queue is empty again by the scrape.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let text = loop {
        let r = exec(
            &mut client,
            &who("acme"),
            call("echo", &format!(r#"{{"text":"{ok}"}}"#)),
        )
        .await;
        if r.status() == ToolStatus::Unavailable {
            assert_eq!(r.error_type, "audit_unavailable");
            let text = scrape(&server).await;
            if metric(&text, "toolgate_audit_queue_depth", &[]) == 4.0 {
                break text;
            }
        } else {
            assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
            ok += 1;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the audit queue never stayed full ({ok} calls audited)"
        );
    };
    let written = metric(&text, "toolgate_audit_events_written", &[]);
    assert!(written < f64::from(ok), "{written} written of {ok}");
    // Read the pipe: the queue drains, every event of an OK call is written, depth is 0.
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut chunk = [0u8; 65536];
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            match stuck.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => all.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => panic!("{e}"),
            }
        }
        all
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(&server).await;
        if metric(&text, "toolgate_audit_queue_depth", &[]) == 0.0
            && metric(&text, "toolgate_audit_events_written", &[]) == f64::from(ok)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the queue did not drain: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
    let written = reader.join().unwrap();
    assert_eq!(
        written
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .count(),
        ok as usize
    );
}
