//! Approvals beyond the basics in approvals.rs: the requesting agent is part of the binding,
//! `approvals.risk_levels` and `approvals.ttl` are honoured, and `ListApprovals` filters by state.

use std::time::Duration;

use toolgate::proto::{self, ApprovalDecision, ApprovalState, ToolStatus};

use crate::support::bob;
use crate::support::{Backend, STAGES, TestServer, Who, call, exec, on_both_backends, who};

on_both_backends!(
    another_agent_cannot_redeem_an_approval,
    list_approvals_filters_by_state,
);

async fn request(server: &TestServer, caller: &Who, tool: &str, args: &str) -> String {
    let mut client = server.client().await;
    let r = exec(&mut client, caller, call(tool, args)).await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::ApprovalRequired, "approval_required"),
        "{r:?}"
    );
    r.approval_id
}

async fn decide(server: &TestServer, id: &str, decision: ApprovalDecision, reason: &str) {
    let mut approvals = server.approvals().await;
    approvals
        .decide_approval(bob().request(proto::DecideApprovalRequest {
            approval_id: id.into(),
            decision: decision as i32,
            reason: reason.into(),
        }))
        .await
        .unwrap();
}

async fn redeem(
    server: &TestServer,
    caller: &Who,
    tool: &str,
    args: &str,
    id: &str,
) -> proto::ToolResult {
    let mut client = server.client().await;
    let mut c = call(tool, args);
    c.approval_id = id.into();
    exec(&mut client, caller, c).await
}

async fn listed(server: &TestServer, state: ApprovalState) -> Vec<String> {
    let mut approvals = server.approvals().await;
    approvals
        .list_approvals(bob().request(proto::ListApprovalsRequest {
            state: state as i32,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .approvals
        .into_iter()
        .map(|a| {
            assert_eq!(a.state(), state_or_pending(state), "{a:?}");
            a.approval_id
        })
        .collect()
}

fn state_or_pending(state: ApprovalState) -> ApprovalState {
    match state {
        ApprovalState::Unspecified => ApprovalState::Pending,
        other => other,
    }
}

async fn another_agent_cannot_redeem_an_approval(backend: Backend) {
    let server = TestServer::start_on(backend, STAGES).await;
    let requester = who("acme").subject("alice").agent("refund-bot");
    let args = r#"{"order":"o-9","amount":5}"#;
    let id = request(&server, &requester, "approve_me", args).await;
    decide(&server, &id, ApprovalDecision::Approve, "").await;
    // Same subject, run, tool and arguments; another agent.
    let other = redeem(
        &server,
        &who("acme").subject("alice").agent("other-bot"),
        "approve_me",
        args,
        &id,
    )
    .await;
    assert_eq!(
        (other.status(), other.error_type.as_str()),
        (ToolStatus::Denied, "approval_wrong_caller"),
        "{other:?}"
    );
    // No agent at all is another agent too.
    let none = redeem(
        &server,
        &who("acme").subject("alice"),
        "approve_me",
        args,
        &id,
    )
    .await;
    assert_eq!(none.error_type, "approval_wrong_caller");
    // Neither used it up: the requesting agent still can.
    let ran = redeem(&server, &requester, "approve_me", args, &id).await;
    assert_eq!(ran.status(), ToolStatus::Ok, "{ran:?}");
    server.stop().await;
}

#[tokio::test]
async fn custom_risk_levels_and_ttl_are_honoured() {
    // Only write_draft needs approval here, and approvals live 30 s.
    let yaml = STAGES.replacen(
        "version: 1\n",
        "version: 1\napprovals: { risk_levels: [write_draft], ttl: 30s }\n",
        1,
    );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    // write_confirmed, approved by default, runs without one now.
    let r = exec(
        &mut client,
        &who("acme"),
        call("approve_me", r#"{"order":"x"}"#),
    )
    .await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    // write_draft, which runs freely by default, needs one.
    let args = r#"{"ms":1}"#;
    let id = request(&server, &who("acme"), "slow_write", args).await;
    decide(&server, &id, ApprovalDecision::Approve, "").await;
    let mut approvals = server.approvals().await;
    let got = approvals
        .get_approval(bob().request(proto::GetApprovalRequest {
            approval_id: id.clone(),
        }))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert_eq!(
        got.expires_at_unix_ms - got.created_at_unix_ms,
        30_000,
        "{got:?}"
    );
    // Within the 30 s it is valid; a second later than that it has expired.
    server.clock.advance(Duration::from_secs(29));
    let second = request(&server, &who("acme"), "slow_write", r#"{"ms":2}"#).await;
    let ran = redeem(&server, &who("acme"), "slow_write", args, &id).await;
    assert_eq!(ran.status(), ToolStatus::Ok, "{ran:?}");
    decide(&server, &second, ApprovalDecision::Approve, "").await;
    server.clock.advance(Duration::from_secs(31));
    let expired = redeem(&server, &who("acme"), "slow_write", r#"{"ms":2}"#, &second).await;
    assert_eq!(
        (expired.status(), expired.error_type.as_str()),
        (ToolStatus::Denied, "approval_expired"),
        "{expired:?}"
    );
    server.stop().await;
}

async fn list_approvals_filters_by_state(backend: Backend) {
    let server = TestServer::start_on(backend, STAGES).await;
    let alice = who("acme").subject("alice");
    let mut ids = Vec::new();
    for order in ["a", "b", "c", "d"] {
        ids.push(
            request(
                &server,
                &alice,
                "approve_me",
                &format!(r#"{{"order":"{order}"}}"#),
            )
            .await,
        );
    }
    decide(&server, &ids[0], ApprovalDecision::Approve, "").await;
    decide(&server, &ids[1], ApprovalDecision::Reject, "no").await;
    decide(&server, &ids[2], ApprovalDecision::Approve, "").await;
    let used = redeem(&server, &alice, "approve_me", r#"{"order":"c"}"#, &ids[2]).await;
    assert_eq!(used.status(), ToolStatus::Ok);
    assert_eq!(
        listed(&server, ApprovalState::Pending).await,
        [ids[3].clone()]
    );
    assert_eq!(
        listed(&server, ApprovalState::Unspecified).await,
        [ids[3].clone()],
        "unspecified lists pending ones"
    );
    assert_eq!(
        listed(&server, ApprovalState::Approved).await,
        [ids[0].clone()]
    );
    assert_eq!(
        listed(&server, ApprovalState::Rejected).await,
        [ids[1].clone()]
    );
    assert_eq!(listed(&server, ApprovalState::Used).await, [ids[2].clone()]);
    server.stop().await;
}
