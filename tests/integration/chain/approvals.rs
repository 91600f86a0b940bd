//! Approvals: bound to caller, run, tool, version and the exact arguments; single use; expiring.

use std::time::Duration;

use tonic::Code;
use toolgate::proto::{self, ApprovalDecision, ToolStatus};

use crate::support::{APPROVE, alice, bob};
use crate::support::{Backend, STAGES, TestServer, Who, call, exec, on_both_backends, who};

on_both_backends!(
    an_approved_call_runs_once_with_the_same_arguments_in_any_key_order,
    changed_arguments_wrong_callers_and_other_runs_are_refused,
    rejected_approvals_say_why,
    approvers_need_the_scope_their_own_tenant_and_to_be_someone_else,
);

async fn request_approval(server: &TestServer, args: &str) -> String {
    let mut client = server.client().await;
    let result = exec(&mut client, &alice(), call("approve_me", args)).await;
    assert_eq!(
        (
            result.status(),
            result.error_type.as_str(),
            result.refused_by.as_str()
        ),
        (
            ToolStatus::ApprovalRequired,
            "approval_required",
            "approval"
        )
    );
    assert!(result.approval_id.starts_with("apr_"), "{result:?}");
    assert!(result.model_text.contains(&result.approval_id));
    result.approval_id
}

async fn decide(
    server: &TestServer,
    approver: &Who,
    id: &str,
    decision: ApprovalDecision,
    reason: &str,
) -> Result<proto::Approval, tonic::Status> {
    let mut approvals = server.approvals().await;
    let body = proto::DecideApprovalRequest {
        approval_id: id.into(),
        decision: decision as i32,
        reason: reason.into(),
    };
    approvals
        .decide_approval(approver.request(body))
        .await
        .map(|r| r.into_inner().approval.unwrap())
}

async fn redeem(server: &TestServer, caller: &Who, args: &str, id: &str) -> proto::ToolResult {
    let mut client = server.client().await;
    let mut c = call("approve_me", args);
    c.approval_id = id.into();
    exec(&mut client, caller, c).await
}

async fn an_approved_call_runs_once_with_the_same_arguments_in_any_key_order(backend: Backend) {
    let server = TestServer::start_on(backend, STAGES).await;
    let id = request_approval(&server, r#"{"order":"o-1","amount":12.0}"#).await;
    // Not decided yet.
    let pending = redeem(&server, &alice(), r#"{"order":"o-1","amount":12.0}"#, &id).await;
    assert_eq!(
        (pending.status(), pending.error_type.as_str()),
        (ToolStatus::Denied, "approval_pending")
    );
    assert!(pending.retryable);

    let mut approvals = server.approvals().await;
    let listed = approvals
        .list_approvals(bob().request(proto::ListApprovalsRequest::default()))
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (
            listed[0].tool.as_str(),
            listed[0].subject.as_str(),
            listed[0].run_id.as_str()
        ),
        ("approve_me", "alice", "run-1")
    );
    // The list shows a bounded preview; GetApproval has the full canonical arguments.
    assert_eq!(listed[0].arguments_json, "");
    assert_eq!(
        listed[0].arguments_preview,
        r#"{"amount":12,"order":"o-1"}"#
    );
    assert!(!listed[0].arguments_truncated);
    assert_eq!(listed[0].arguments_sha256.len(), 64);
    let full = approvals
        .get_approval(bob().request(proto::GetApprovalRequest {
            approval_id: id.clone(),
        }))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(full.arguments_json, r#"{"amount":12,"order":"o-1"}"#);
    assert_eq!(full.arguments_sha256, listed[0].arguments_sha256);

    let decided = decide(
        &server,
        &bob(),
        &id,
        ApprovalDecision::Approve,
        "looks right",
    )
    .await
    .unwrap();
    assert_eq!(
        (decided.state(), decided.decided_by.as_str()),
        (proto::ApprovalState::Approved, "bob")
    );
    // Same arguments, other key order and number spelling.
    let ran = redeem(&server, &alice(), r#"{"amount":12,"order":"o-1"}"#, &id).await;
    assert_eq!(ran.status(), ToolStatus::Ok, "{ran:?}");
    assert_eq!(ran.approval_id, id);
    // Single use.
    let again = redeem(&server, &alice(), r#"{"amount":12,"order":"o-1"}"#, &id).await;
    assert_eq!(
        (again.status(), again.error_type.as_str()),
        (ToolStatus::Denied, "approval_already_used")
    );

    let events = server.audit_events().await;
    let decision = events
        .iter()
        .find(|e| e["kind"] == "approval_decision")
        .expect("decision audited");
    assert_eq!(
        (
            decision["approver"].as_str(),
            decision["approval_id"].as_str()
        ),
        (Some("bob"), Some(id.as_str()))
    );
    let run = events.iter().find(|e| e["status"] == "OK").unwrap();
    assert_eq!(run["approval_id"], id.as_str());
    server.stop().await;
}

async fn changed_arguments_wrong_callers_and_other_runs_are_refused(backend: Backend) {
    let server = TestServer::start_on(backend, STAGES).await;
    let id = request_approval(&server, r#"{"order":"o-1","amount":12}"#).await;
    decide(&server, &bob(), &id, ApprovalDecision::Approve, "")
        .await
        .unwrap();
    let changed = redeem(&server, &alice(), r#"{"order":"o-1","amount":12000}"#, &id).await;
    assert_eq!(
        (changed.status(), changed.error_type.as_str()),
        (ToolStatus::Denied, "approval_arguments_changed")
    );
    let carol = redeem(
        &server,
        &who("acme").subject("carol"),
        r#"{"order":"o-1","amount":12}"#,
        &id,
    )
    .await;
    assert_eq!(carol.error_type, "approval_wrong_caller");
    let mut client = server.client().await;
    let mut c = call("approve_me", r#"{"order":"o-1","amount":12}"#);
    c.approval_id = id.clone();
    let mut other_run = crate::support::execute_request(c);
    other_run.run_id = "run-2".into();
    let result = client
        .execute_tool(alice().request(other_run))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(result.error_type, "approval_wrong_caller");
    let globex = redeem(
        &server,
        &who("globex").subject("alice"),
        r#"{"order":"o-1","amount":12}"#,
        &id,
    )
    .await;
    assert_eq!(globex.error_type, "approval_not_found");
    // None of those used it up.
    assert_eq!(
        redeem(&server, &alice(), r#"{"order":"o-1","amount":12}"#, &id)
            .await
            .status(),
        ToolStatus::Ok
    );
    server.stop().await;
}

#[tokio::test]
async fn approvals_expire_with_the_clock() {
    let server = TestServer::start(STAGES).await;
    let id = request_approval(&server, r#"{"order":"o-2"}"#).await;
    decide(&server, &bob(), &id, ApprovalDecision::Approve, "")
        .await
        .unwrap();
    server.clock.advance(Duration::from_secs(5 * 60 + 1));
    let expired = redeem(&server, &alice(), r#"{"order":"o-2"}"#, &id).await;
    assert_eq!(
        (expired.status(), expired.error_type.as_str()),
        (ToolStatus::Denied, "approval_expired")
    );
    server.stop().await;
}

async fn rejected_approvals_say_why(backend: Backend) {
    let server = TestServer::start_on(backend, STAGES).await;
    let id = request_approval(&server, r#"{"order":"o-3"}"#).await;
    let rejected = decide(
        &server,
        &bob(),
        &id,
        ApprovalDecision::Reject,
        "amount too high",
    )
    .await
    .unwrap();
    assert_eq!(rejected.state(), proto::ApprovalState::Rejected);
    let result = redeem(&server, &alice(), r#"{"order":"o-3"}"#, &id).await;
    assert_eq!(
        (result.status(), result.error_type.as_str()),
        (ToolStatus::Denied, "approval_rejected")
    );
    assert!(result.error_message.contains("amount too high"));
    // A decided approval cannot be decided again.
    let err = decide(&server, &bob(), &id, ApprovalDecision::Approve, "")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    server.stop().await;
}

async fn approvers_need_the_scope_their_own_tenant_and_to_be_someone_else(backend: Backend) {
    let server = TestServer::start_on(backend, STAGES).await;
    let id = request_approval(&server, r#"{"order":"o-4"}"#).await;
    let no_scope = decide(
        &server,
        &who("acme").subject("bob"),
        &id,
        ApprovalDecision::Approve,
        "",
    )
    .await
    .unwrap_err();
    assert_eq!(no_scope.code(), Code::PermissionDenied);
    let own = decide(
        &server,
        &alice().scopes(APPROVE),
        &id,
        ApprovalDecision::Approve,
        "",
    )
    .await
    .unwrap_err();
    assert_eq!(own.code(), Code::PermissionDenied);
    assert!(own.message().contains("own request"));
    let other_tenant = who("globex").subject("eve").scopes(APPROVE);
    assert_eq!(
        decide(&server, &other_tenant, &id, ApprovalDecision::Approve, "")
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    let mut approvals = server.approvals().await;
    let seen = approvals
        .list_approvals(other_tenant.request(proto::ListApprovalsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert!(seen.approvals.is_empty());
    let unspecified = decide(&server, &bob(), &id, ApprovalDecision::Unspecified, "")
        .await
        .unwrap_err();
    assert_eq!(unspecified.code(), Code::InvalidArgument);
    // Still pending after all that.
    let listed = approvals
        .list_approvals(bob().request(proto::ListApprovalsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.approvals.len(), 1);
    server.stop().await;
}
