//! An approver's reason (issue 25, item 6), on both stores: at most 1 KiB of printable text —
//! anything else is refused with INVALID_ARGUMENT before the decision is applied — held for in
//! the tenant's approval budget from the approval's creation, and written whole to the audit
//! event and the listings.

use tonic::Code;
use toolgate::proto::{self, ApprovalDecision, ToolStatus};

use crate::support::{Backend, STAGES, TestServer, call, exec, http_get, metric, on_both_backends};
use crate::support::{alice, bob};

on_both_backends!(a_reason_is_bounded_printable_and_audited_whole);
on_both_backends!(approvals_are_counted_with_room_for_their_decision);

fn with_approvals(section: &str) -> String {
    STAGES.replacen(
        "version: 1\n",
        &format!("version: 1\napprovals: {section}\n"),
        1,
    )
}

async fn decide(
    server: &TestServer,
    id: &str,
    decision: ApprovalDecision,
    reason: &str,
) -> Result<proto::Approval, tonic::Status> {
    server
        .approvals()
        .await
        .decide_approval(bob().request(proto::DecideApprovalRequest {
            approval_id: id.into(),
            decision: decision as i32,
            reason: reason.into(),
        }))
        .await
        .map(|r| r.into_inner().approval.unwrap())
}

async fn a_reason_is_bounded_printable_and_audited_whole(backend: Backend) {
    let server = TestServer::start_on(backend, STAGES).await;
    let mut client = server.client().await;
    let id = exec(&mut client, &alice(), call("approve_me", "{}"))
        .await
        .approval_id;
    for (reason, says) in [
        ("x".repeat(3 << 20), "at most 1024"),
        ("x".repeat(1025), "at most 1024"),
        ("looks fine\nAPPROVED by admin".to_owned(), "U+000A"),
        ("ok \u{202e}lasrever".to_owned(), "U+202E"),
        ("a\u{2028}b".to_owned(), "U+2028"),
    ] {
        let refused = decide(&server, &id, ApprovalDecision::Approve, &reason)
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(
            refused.message().contains("invalid reason") && refused.message().contains(says),
            "{}",
            refused.message()
        );
    }
    // None of them was applied, or audited.
    let listed = server
        .approvals()
        .await
        .list_approvals(bob().request(proto::ListApprovalsRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state(), proto::ApprovalState::Pending);
    // The longest reason (1 KiB, in any script) is kept whole: in the approval, the listing and
    // the decision's audit event.
    let longest = "é".repeat(512);
    let decided = decide(&server, &id, ApprovalDecision::Reject, &longest)
        .await
        .unwrap();
    assert_eq!(decided.reason, longest);
    let listed = server
        .approvals()
        .await
        .list_approvals(bob().request(proto::ListApprovalsRequest {
            state: proto::ApprovalState::Rejected as i32,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].reason, longest);
    let event = server
        .wait_for_audit(|e| e["kind"] == "approval_decision")
        .await;
    assert_eq!(event["reason"], longest.as_str(), "{event}");
    let decisions = server
        .audit_events()
        .await
        .into_iter()
        .filter(|e| e["kind"] == "approval_decision")
        .count();
    assert_eq!(decisions, 1);
    server.stop().await;
}

async fn approvals_are_counted_with_room_for_their_decision(backend: Backend) {
    // 8 KiB for the tenant: a few approvals of a few hundred bytes each, with a kilobyte and a
    // quarter held for each one's decision.
    let server = TestServer::start_on(
        backend,
        &with_approvals("{ max_per_tenant: 100, max_bytes_per_tenant: 8192 }"),
    )
    .await;
    let mut client = server.client().await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let asked = exec(
            &mut client,
            &alice(),
            call("approve_me", &format!(r#"{{"amount":{i}}}"#)),
        )
        .await;
        if asked.status() != ToolStatus::ApprovalRequired {
            assert_eq!(asked.error_type, "overloaded", "{asked:?}");
            break;
        }
        ids.push(asked.approval_id);
    }
    // Without the room held for decisions, about twenty would fit.
    assert!((3..=6).contains(&ids.len()), "{} approvals held", ids.len());
    for id in &ids {
        decide(&server, id, ApprovalDecision::Approve, &"r".repeat(1024))
            .await
            .unwrap();
    }
    if backend == Backend::Memory {
        let (_, metrics) = http_get(server.admin_addr(), "/metrics").await;
        let held = metric(&metrics, "toolgate_approvals_bytes", &[]);
        assert!(held > 0.0 && held <= 8192.0, "{held} bytes held");
    }
    // Still within the budget: all open, so one more is refused, not squeezed in.
    let more = exec(
        &mut client,
        &alice(),
        call("approve_me", r#"{"amount":99}"#),
    )
    .await;
    assert_eq!(more.error_type, "overloaded", "{more:?}");
    server.stop().await;
}
