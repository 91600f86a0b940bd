//! The shadow catalog (`shadow_catalog`) through the real server: differences recorded exactly
//! (one `shadow_decision` event per differing call, none for calls decided alike — including
//! calls whose quota, approval or idempotency key the served call itself used), the served
//! decisions unchanged and no backend run for the candidate, `toolgate shadow-report` over the
//! audit file, hot reload, and a broken candidate refused loudly without touching the served
//! catalog.

use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;
use toolgate::{
    proto::{self, ToolStatus},
    shadow::LoadStatus,
};

use crate::support::{TestServer, Who, exec, http_get, metric, who};

/// The served catalog; `CANDIDATE` is replaced by the candidate file's path.
const SERVED: &str = r#"version: 1
identity: { dev_identity: true }
shadow_catalog: CANDIDATE
tenants:
  acme: {}
  globex: { deny: ["limited"] }
tools:
  - name: echo
    description: Returns text.
    risk_level: read_only
    executor: { builtin: echo }
    input_schema: { type: object, properties: { text: { type: string } }, required: [text] }
  - name: create_ticket
    description: Writes a draft ticket.
    risk_level: write_draft
    executor: { builtin: create_ticket }
    input_schema: { type: object, properties: { title: { type: string }, tenant: { type: string } }, required: [title] }
    bind: { tenant: "${caller.tenant}" }
  - name: search
    description: Searches the caller's documents.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    input_schema:
      type: object
      properties:
        query: { type: string }
        filter: { type: object, properties: { owner: { type: string } } }
      required: [query]
    bind: { filter.owner: "${caller.tenant}" }
  - name: lookup
    version: "1"
    description: Looks a record up.
    risk_level: read_only
    executor: { builtin: echo }
    input_schema: { type: object, properties: { text: { type: string } }, required: [text] }
  - name: lookup
    version: "2"
    status: inactive
    description: Looks a record up, faster.
    risk_level: read_only
    executor: { builtin: echo }
    input_schema: { type: object, properties: { text: { type: string } }, required: [text] }
  - name: limited
    description: Returns text; two calls a minute per tenant.
    risk_level: read_only
    rate_limit: 2/min
    executor: { builtin: echo }
    input_schema: { type: object, properties: { text: { type: string } }, required: [text] }
  - name: refund
    description: Refunds an order once a second person approves.
    risk_level: write_confirmed
    executor: { builtin: refund_order }
    input_schema:
      type: object
      properties: { order_id: { type: string }, amount_cents: { type: integer } }
      required: [order_id, amount_cents]
"#;

/// The candidate: globex may no longer create tickets (its second deny rule), search binds the
/// owner from the subject, and lookup's version 2 replaces version 1. The rest is the same.
fn candidate() -> String {
    SERVED
        .replace(
            r#"globex: { deny: ["limited"] }"#,
            r#"globex: { deny: ["limited", "create_*"] }"#,
        )
        .replace(
            r#"bind: { filter.owner: "${caller.tenant}" }"#,
            r#"bind: { filter.owner: "${caller.subject}" }"#,
        )
        .replace(
            "    version: \"1\"\n    description: Looks a record up.\n",
            "    version: \"1\"\n    status: inactive\n    description: Looks a record up.\n",
        )
        .replace(
            "    version: \"2\"\n    status: inactive\n",
            "    version: \"2\"\n",
        )
}

fn served(candidate: &Path) -> String {
    SERVED.replace("CANDIDATE", &candidate.display().to_string())
}

/// Waits (bounded) until the loader has made `attempts` attempts; returns its status.
async fn loaded(server: &TestServer, attempts: u64) -> LoadStatus {
    let mut status = server.shadow().watch_status();
    tokio::time::timeout(
        Duration::from_secs(10),
        status.wait_for(|s| s.attempts >= attempts),
    )
    .await
    .expect("the shadow loader within 10s")
    .expect("loader running")
    .clone()
}

async fn metrics(server: &TestServer) -> String {
    http_get(server.admin_addr(), "/metrics").await.1
}

/// Waits (bounded) until `n` calls have been compared with the candidate.
async fn compared(server: &TestServer, n: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let count = metric(
            &metrics(server).await,
            "toolgate_shadow_compared_total",
            &[],
        );
        if count >= n {
            assert_eq!(count, n, "more calls compared than made");
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {count} of {n} calls compared within 10s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Replaces a file at once (a rename), so the loader never reads half of it.
fn write_atomically(path: &Path, text: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).unwrap();
    std::fs::rename(&partial, path).unwrap();
}

fn with_id(id: &str, name: &str, args: &str) -> proto::ToolCall {
    proto::ToolCall {
        call_id: id.into(),
        ..crate::support::call(name, args)
    }
}

#[tokio::test]
async fn differences_are_recorded_exactly_and_the_served_decisions_are_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let candidate_file = dir.path().join("candidate.yaml");
    std::fs::write(&candidate_file, candidate()).unwrap();
    let server = TestServer::start(&served(&candidate_file)).await;
    let status = loaded(&server, 1).await;
    assert!(
        status.revision.is_some() && status.error.is_none(),
        "{status:?}"
    );
    let mut client = server.client().await;
    let acme = who("acme");
    let globex = who("globex");
    let executions = server.builtins().executions();

    // (call id, caller, call, the served status): what the served catalog must decide, as if
    // there were no candidate.
    let keyed = |id: &str| proto::ToolCall {
        idempotency_key: "k".into(),
        ..with_id(id, "create_ticket", r#"{"title":"t"}"#)
    };
    let calls: Vec<(&Who, proto::ToolCall, ToolStatus)> = vec![
        (
            &acme,
            with_id("same-echo", "echo", r#"{"text":"hi"}"#),
            ToolStatus::Ok,
        ),
        (
            &globex,
            with_id("denied-create", "create_ticket", r#"{"title":"t"}"#),
            ToolStatus::Ok,
        ),
        (&acme, keyed("key-first"), ToolStatus::Ok),
        (&acme, keyed("key-replay"), ToolStatus::Ok),
        (
            &acme,
            with_id("rebound-search", "search", r#"{"query":"q"}"#),
            ToolStatus::Ok,
        ),
        (
            &acme,
            with_id("new-lookup", "lookup", r#"{"text":"x"}"#),
            ToolStatus::Ok,
        ),
        (
            &acme,
            with_id("quota-1", "limited", r#"{"text":"x"}"#),
            ToolStatus::Ok,
        ),
        (
            &acme,
            with_id("quota-2", "limited", r#"{"text":"x"}"#),
            ToolStatus::Ok,
        ),
        (
            &acme,
            with_id("quota-3", "limited", r#"{"text":"x"}"#),
            ToolStatus::RateLimited,
        ),
        (
            &globex,
            with_id("made-up", "made_up", "{}"),
            ToolStatus::NotFound,
        ),
        (
            &acme,
            with_id(
                "refund-ask",
                "refund",
                r#"{"order_id":"A-1","amount_cents":100}"#,
            ),
            ToolStatus::ApprovalRequired,
        ),
    ];
    let mut approval_id = String::new();
    for (caller, call, expected) in calls {
        let result = exec(&mut client, caller, call).await;
        assert_eq!(result.status(), expected, "{result:?}");
        if !result.approval_id.is_empty() {
            approval_id = result.approval_id;
        }
    }
    // The approved refund runs, using up its approval: the candidate must not count that
    // against the call.
    let mut approvals = server.approvals().await;
    approvals
        .decide_approval(
            who("acme")
                .subject("bob")
                .scopes("toolgate:approve")
                .request(proto::DecideApprovalRequest {
                    approval_id: approval_id.clone(),
                    decision: proto::ApprovalDecision::Approve as i32,
                    reason: "ok".into(),
                }),
        )
        .await
        .unwrap();
    let refund = proto::ToolCall {
        approval_id: approval_id.clone(),
        ..with_id(
            "refund-run",
            "refund",
            r#"{"order_id":"A-1","amount_cents":100}"#,
        )
    };
    let result = exec(&mut client, &acme, refund).await;
    assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");

    compared(&server, 12.0).await;
    // The candidate ran no backend: only the served calls did (echo, two creates, search,
    // lookup, limited twice, refund).
    assert_eq!(server.builtins().executions(), executions + 8);

    // Exactly the three calls decided differently, each with what differs.
    let events = server.audit_events().await;
    let shadow: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "shadow_decision")
        .collect();
    let found: Vec<(&str, Vec<&str>)> = shadow
        .iter()
        .map(|e| {
            let differences = e["differences"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_str().unwrap())
                .collect();
            (e["call_id"].as_str().unwrap(), differences)
        })
        .collect();
    assert_eq!(
        found,
        [
            ("denied-create", vec!["status", "refused_by"]),
            ("rebound-search", vec!["bound_arguments"]),
            ("new-lookup", vec!["tool_version"]),
        ]
    );
    // Both decisions and who called.
    let denied = shadow[0];
    assert_eq!(
        (
            denied["tenant"].as_str(),
            denied["tool"].as_str(),
            denied["status"].as_str()
        ),
        (Some("globex"), Some("create_ticket"), Some("OK"))
    );
    assert_eq!(denied["reached_backend"], true);
    let candidate_decision = &denied["candidate"];
    // As the caller would be answered (a tool hidden by the candidate's rule is unknown to it),
    // with the rule that hid it.
    assert_eq!(candidate_decision["status"], "NOT_FOUND");
    assert_eq!(candidate_decision["refused_by"], "resolve");
    assert_eq!(candidate_decision["error_type"], "tool_not_found");
    assert_eq!(candidate_decision["rule"], "tenants.globex.deny[1]");
    assert_eq!(candidate_decision["rule_pattern"], "create_*");
    assert_eq!(
        candidate_decision["revision"].as_str(),
        status.revision.as_deref()
    );
    assert_eq!(
        shadow[1]["candidate"]["bound_arguments"],
        serde_json::json!(["filter.owner"])
    );
    assert_ne!(
        shadow[1]["arguments_sha256"],
        shadow[1]["candidate"]["arguments_sha256"]
    );
    assert_eq!(
        (
            shadow[2]["tool_version"].as_str(),
            shadow[2]["candidate"]["tool_version"].as_str()
        ),
        (Some("1"), Some("2"))
    );

    // Counted by tool and kind.
    let text = metrics(&server).await;
    let differences = |tool: &str, kind: &str| {
        metric(
            &text,
            "toolgate_shadow_differences_total",
            &[("tool", tool), ("kind", kind)],
        )
    };
    assert_eq!(differences("create_ticket", "status"), 1.0);
    assert_eq!(differences("create_ticket", "refused_by"), 1.0);
    assert_eq!(differences("search", "bound_arguments"), 1.0);
    assert_eq!(differences("lookup", "tool_version"), 1.0);
    assert_eq!(metric(&text, "toolgate_shadow_differences_total", &[]), 4.0);
    assert_eq!(metric(&text, "toolgate_shadow_skipped_total", &[]), 0.0);
    // The candidate's revision, as the loader reported it.
    let revision = status.revision.clone().expect("loaded");
    assert_eq!(
        metric(
            &text,
            "toolgate_shadow_catalog_revision_info",
            &[("revision", &revision)]
        ),
        1.0,
        "{text}"
    );

    // The report over the audit file, from the real binary.
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["shadow-report", &server.audit_path.display().to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let report = String::from_utf8_lossy(&out.stdout);
    for line in [
        "3 shadow_decision events",
        r#"1 call of create_ticket that was OK would be NOT_FOUND by resolve [tool_not_found], rule tenants.globex.deny[1] ("create_*")"#,
        "1 call of lookup would resolve to version 2 instead of 1",
        "1 call of search would send other bound arguments (filter.owner)",
    ] {
        assert!(report.contains(line), "no {line:?} in:\n{report}");
    }
    // The same for machines: each group with its count, most frequent first (ties by tool).
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args([
            "shadow-report",
            "--json",
            &server.audit_path.display().to_string(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(report["events"], 3);
    assert_eq!(report["unreadable_lines"], 0);
    assert_eq!(report["candidate_revisions"][&revision], 3);
    assert_eq!(
        report["differences"],
        serde_json::json!([
            {"count": 1, "kind": "decision", "tool": "create_ticket", "was": "OK",
             "status": "NOT_FOUND", "refused_by": "resolve", "error_type": "tool_not_found",
             "rule": "tenants.globex.deny[1]", "rule_pattern": "create_*"},
            {"count": 1, "kind": "tool_version", "tool": "lookup", "was": "1", "would": "2"},
            {"count": 1, "kind": "bound_arguments", "tool": "search", "paths": ["filter.owner"]},
        ])
    );
    server.stop().await;
}

#[tokio::test]
async fn the_candidate_is_hot_reloaded_and_a_broken_one_is_refused_without_touching_the_served_catalog()
 {
    // The served catalog names a candidate that does not exist yet: refused, and served anyway.
    let served_yaml = SERVED.replace("CANDIDATE", "candidate.yaml").replace(
        "version: 1\n",
        "version: 1\nserver: { reload_interval: 50ms }\n",
    );
    let server = TestServer::start_file(&served_yaml).await;
    let candidate_file = server.dir().join("candidate.yaml");
    let status = loaded(&server, 1).await;
    assert!(status.revision.is_none(), "{status:?}");
    let error = status.error.expect("a missing candidate is refused");
    assert!(
        error.contains("candidate.yaml") && error.contains("cannot read"),
        "{error}"
    );
    let mut client = server.client().await;
    let globex = who("globex");
    let create = || crate::support::call("create_ticket", r#"{"title":"t"}"#);
    assert_eq!(
        exec(&mut client, &globex, create()).await.status(),
        ToolStatus::Ok
    );

    // Written, it is picked up by the file watch alone (no reload asked for).
    write_atomically(&candidate_file, &candidate());
    let status = loaded(&server, 2).await;
    let first = status.revision.clone().expect("loaded");
    assert!(status.error.is_none(), "{status:?}");
    let served_revision = server.boundary().catalog().catalog.revision().to_owned();

    // Broken (a deny rule that matches no tool): refused loudly; the served catalog is the same
    // and keeps deciding; the previous candidate keeps being compared.
    write_atomically(
        &candidate_file,
        &candidate().replace(r#""create_*""#, r#""creat_*""#),
    );
    let status = loaded(&server, 3).await;
    let error = status.error.clone().expect("refused");
    assert!(
        error.contains("tenants.globex.deny[1]") && error.contains("matches no tool"),
        "{error}"
    );
    assert_eq!(
        status.revision.as_deref(),
        Some(first.as_str()),
        "the previous candidate stays"
    );
    assert_eq!(
        server.boundary().catalog().catalog.revision(),
        served_revision
    );
    let text = metrics(&server).await;
    assert_eq!(
        metric(
            &text,
            "toolgate_shadow_catalog_loads_total",
            &[("result", "refused")]
        ),
        2.0
    );
    assert_eq!(
        metric(
            &text,
            "toolgate_shadow_catalog_loads_total",
            &[("result", "ok")]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &text,
            "toolgate_catalog_reloads_total",
            &[("result", "refused")]
        ),
        0.0
    );
    let result = exec(&mut client, &globex, create()).await;
    assert_eq!(
        result.status(),
        ToolStatus::Ok,
        "the served decision is the served catalog's"
    );
    let event = server
        .wait_for_audit(|e| e["kind"] == "shadow_decision")
        .await;
    assert_eq!(
        event["candidate"]["revision"].as_str(),
        Some(first.as_str())
    );
    assert_eq!(event["candidate"]["rule"], "tenants.globex.deny[1]");

    // Fixed: picked up, a new candidate.
    write_atomically(
        &candidate_file,
        &candidate().replace("create_*", "create_ticket"),
    );
    let status = loaded(&server, 4).await;
    assert!(status.error.is_none(), "{status:?}");
    assert_ne!(status.revision.as_deref(), Some(first.as_str()));
    // A reload of the served catalog (as SIGHUP asks for) reads the candidate again, even
    // unchanged (the file watch alone would not).
    server.reload().await.expect("served catalog reloads");
    let again = loaded(&server, status.attempts + 1).await;
    assert_eq!(again.revision, status.revision);
    server.stop().await;
}

/// The real binary says so in its log, and `toolgate check` fails on the broken candidate.
#[tokio::test]
async fn the_binary_logs_a_broken_candidate_and_check_fails_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let served_file = dir.path().join("served.yaml");
    std::fs::write(&served_file, SERVED.replace("CANDIDATE", "candidate.yaml")).unwrap();
    std::fs::write(
        dir.path().join("candidate.yaml"),
        "version: 1\nunknown_section: {}\n",
    )
    .unwrap();
    let served_path = served_file.display().to_string();
    let spawned = crate::support::binary::spawn(&["--config", &served_path]);
    // The refusal may be logged before SERVING: wait for its counter, then read the whole log.
    let admin = spawned.admin_addr.parse().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, text) = http_get(admin, "/metrics").await;
        if metric(
            &text,
            "toolgate_shadow_catalog_loads_total",
            &[("result", "refused")],
        ) >= 1.0
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no refused load within 10s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let logs = crate::support::binary::stop(spawned).await;
    let refused = logs
        .lines()
        .find(|line| line.contains("shadow catalog refused"))
        .unwrap_or_else(|| panic!("no refusal in the log:\n{logs}"));
    assert!(
        refused.contains("\"level\":\"ERROR\"") && refused.contains("unknown_section"),
        "{refused}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["check", "--config", &served_path])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("shadow catalog") && stderr.contains("unknown_section"),
        "{stderr}"
    );
}

/// Waits (bounded) until the loader's status satisfies `what`; returns it.
async fn status_when(server: &TestServer, what: impl Fn(&LoadStatus) -> bool) -> LoadStatus {
    let mut status = server.shadow().watch_status();
    tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| what(s)))
        .await
        .expect("the shadow loader within 10s")
        .expect("loader running")
        .clone()
}

#[tokio::test]
async fn an_unchanged_candidate_is_not_parsed_again_on_every_poll() {
    let served_yaml = SERVED.replace("CANDIDATE", "candidate.yaml").replace(
        "version: 1\n",
        "version: 1\nserver: { reload_interval: 20ms }\n",
    );
    let server = TestServer::start_file(&served_yaml).await;
    let candidate_file = server.dir().join("candidate.yaml");
    write_atomically(&candidate_file, &candidate());
    let loaded = status_when(&server, |s| s.revision.is_some()).await;
    let parses = || async {
        metric(
            &metrics(&server).await,
            "toolgate_shadow_catalog_parses_total",
            &[],
        )
    };
    let parsed = parses().await;
    assert!(
        parsed >= 2.0,
        "its text parsed once to fingerprint it, once to load it"
    );

    // Twenty polls of the unchanged file: nothing parsed, nothing loaded.
    let after = status_when(&server, |s| s.polls >= loaded.polls + 20).await;
    assert_eq!(
        (after.parses, after.attempts),
        (loaded.parses, loaded.attempts),
        "{after:?}"
    );
    assert_eq!(parses().await, parsed);

    // Written again with the same bytes (new metadata): read and hashed, still not parsed.
    write_atomically(&candidate_file, &candidate());
    let rewritten = status_when(&server, |s| s.polls >= after.polls + 20).await;
    assert_eq!(
        (rewritten.parses, rewritten.attempts),
        (loaded.parses, loaded.attempts),
        "{rewritten:?}"
    );

    // Changed: parsed to fingerprint it, and loaded.
    write_atomically(&candidate_file, &format!("{}# changed\n", candidate()));
    let changed = status_when(&server, |s| s.attempts > loaded.attempts).await;
    assert_eq!(changed.parses, loaded.parses + 2, "{changed:?}");
    assert_eq!(parses().await, parsed + 2.0);
    server.stop().await;
}

#[tokio::test]
async fn a_quota_the_candidate_adds_or_changes_starts_unused() {
    // The candidate changes limited's quota (2/min to 5/min) and gives echo one it did not have:
    // the served calls built no state for either, so the candidate takes both as unused, as a
    // sidecar serving it would on its first day. (Unchanged quotas are read from the served
    // state: the first test's limited calls differ in nothing.)
    let dir = tempfile::tempdir().unwrap();
    let candidate_file = dir.path().join("candidate.yaml");
    let candidate = SERVED.replace("rate_limit: 2/min", "rate_limit: 5/min").replace(
        "    description: Returns text.\n    risk_level: read_only\n    executor: { builtin: echo }\n",
        "    description: Returns text.\n    risk_level: read_only\n    rate_limit: 1/min\n    executor: { builtin: echo }\n",
    );
    assert_eq!(candidate.matches("rate_limit:").count(), 2);
    std::fs::write(&candidate_file, candidate).unwrap();
    let server = TestServer::start(&served(&candidate_file)).await;
    loaded(&server, 1).await;
    let mut client = server.client().await;
    // Served: two limited calls pass and the third is refused; echo has no quota.
    for (id, tool, status) in [
        ("limited-1", "limited", ToolStatus::Ok),
        ("limited-2", "limited", ToolStatus::Ok),
        ("limited-3", "limited", ToolStatus::RateLimited),
        ("echo-1", "echo", ToolStatus::Ok),
    ] {
        let r = exec(
            &mut client,
            &who("acme"),
            with_id(id, tool, r#"{"text":"x"}"#),
        )
        .await;
        assert_eq!(r.status(), status, "{id}: {r:?}");
    }
    compared(&server, 4.0).await;
    // The candidate's 5/min had all of its calls left for the third; its 1/min for echo had one.
    let events = server.audit_events().await;
    let shadow: Vec<(&str, &str, &str)> = events
        .iter()
        .filter(|e| e["kind"] == "shadow_decision")
        .map(|e| {
            (
                e["call_id"].as_str().unwrap(),
                e["status"].as_str().unwrap(),
                e["candidate"]["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(shadow, [("limited-3", "RATE_LIMITED", "OK")]);
    server.stop().await;
}

#[tokio::test]
async fn a_difference_finding_the_audit_queue_full_is_counted_not_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("audit.fifo");
    crate::support::mkfifo(&fifo);
    // The sink: a FIFO of one page, so a few events fill it, whose reader reads nothing until
    // released.
    let mut file = crate::support::stuck_fifo_reader(&fifo, 4096);
    let (release, released) = std::sync::mpsc::channel::<()>();
    let reader = std::thread::spawn(move || {
        released.recv().unwrap();
        let mut all = String::new();
        std::io::Read::read_to_string(&mut file, &mut all).unwrap();
        all
    });
    // Every echo of acme differs: the candidate denies it.
    let candidate_file = dir.path().join("candidate.yaml");
    std::fs::write(
        &candidate_file,
        SERVED.replace("  acme: {}\n", "  acme: { deny: [echo] }\n"),
    )
    .unwrap();
    let yaml = served(&candidate_file).replacen(
        "version: 1\n",
        &format!(
            "version: 1\nserver: {{ shutdown_grace: 5s }}\naudit: {{ sink: file, path: {}, queue_capacity: 8 }}\n",
            fifo.display()
        ),
        1,
    );
    let server = TestServer::start_raw(&yaml).await;
    loaded(&server, 1).await;
    let executions = server.builtins().executions();
    // Thirty calls at once whose clients give up after 300 ms: the first take the queue's
    // slots (and the pipe's room) before any difference is found; the rest wait.
    let client = server.client().await;
    let calls = (0..30).map(|i| {
        let mut client = client.clone();
        async move {
            let mut request = who("acme").request(crate::support::execute_request(with_id(
                &format!("c-{i}"),
                "echo",
                r#"{"text":"x"}"#,
            )));
            request.set_timeout(Duration::from_millis(300));
            client.execute_tool(request).await.map(|_| ())
        }
    });
    let results = futures::future::join_all(calls).await;
    assert!(results.iter().any(Result::is_err), "the queue never filled");
    let ran = server.builtins().executions() - executions;
    assert!(ran > 0, "nothing ran");
    // Every call that ran is compared, and differs; the differences that found no free slot
    // are counted as skipped, not waited for.
    compared(&server, ran as f64).await;
    let text = metrics(&server).await;
    let skipped = metric(
        &text,
        "toolgate_shadow_skipped_total",
        &[("reason", "audit_full")],
    );
    assert!(skipped >= 1.0, "{text}");
    assert_eq!(
        metric(&text, "toolgate_shadow_differences_total", &[]),
        2.0 * ran as f64,
        "status and refused_by of each, counted whether or not audited"
    );
    release.send(()).unwrap();
    server.stop().await;
    let written: Vec<Value> = reader
        .join()
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("whole JSON lines"))
        .collect();
    let decisions = written
        .iter()
        .filter(|e| e["kind"] == "shadow_decision")
        .count();
    assert_eq!(
        decisions as f64,
        ran as f64 - skipped,
        "each difference audited or skipped"
    );
}

/// A candidate with a condition (issue 30) is compared like any other rule: only the call its
/// condition holds for is decided differently, and the difference names the conditional entry.
#[tokio::test]
async fn a_candidates_conditional_rule_is_compared_on_each_calls_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let candidate_file = dir.path().join("candidate.yaml");
    let candidate = SERVED.replace(
        "  acme: {}\n",
        "  acme:\n    deny:\n      - { tools: [refund], when: \"args.amount_cents > 1000\" }\n",
    );
    assert_ne!(candidate, SERVED);
    std::fs::write(&candidate_file, candidate).unwrap();
    let server = TestServer::start(&served(&candidate_file)).await;
    let status = loaded(&server, 1).await;
    assert!(status.error.is_none(), "{status:?}");
    let mut client = server.client().await;
    let acme = who("acme");
    for (id, amount) in [("small", 100), ("large", 5000)] {
        let args = format!(r#"{{"order_id":"A-1","amount_cents":{amount}}}"#);
        let result = exec(&mut client, &acme, with_id(id, "refund", &args)).await;
        assert_eq!(result.status(), ToolStatus::ApprovalRequired, "{result:?}");
    }
    compared(&server, 2.0).await;
    let events = server.audit_events().await;
    let shadow: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "shadow_decision")
        .collect();
    assert_eq!(shadow.len(), 1, "{shadow:?}");
    assert_eq!(shadow[0]["call_id"], "large");
    let candidate = &shadow[0]["candidate"];
    assert_eq!(candidate["status"], "DENIED", "{candidate}");
    assert_eq!(candidate["refused_by"], "access", "{candidate}");
    assert_eq!(candidate["rule"], "tenants.acme.deny[0]", "{candidate}");
}
