//! Approval expiry and idempotency windows kept on Redis's clock, and approvals listed page by page.

use super::*;

#[tokio::test]
async fn approvals_expire_and_idempotency_windows_end_on_redis_time() {
    let redis = RedisServer::start();
    let yaml = in_process(&redis.url(), "")
        .replace("approvals: { ttl: 5m }", "approvals: { ttl: 1s }\nlimits: { idempotency_window: 1s }")
        .replace(
            "  - { name: pay,",
            "  - { name: sign, description: Signs., risk_level: write_confirmed, executor: { builtin: echo_arguments }, input_schema: { type: object } }\n  - { name: pay,",
        );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    let mut approvals = server.approvals().await;
    let id = exec(&mut client, &alice(), call("sign", "{}"))
        .await
        .approval_id;
    approvals
        .decide_approval(bob().request(proto::DecideApprovalRequest {
            approval_id: id.clone(),
            decision: ApprovalDecision::Approve as i32,
            reason: String::new(),
        }))
        .await
        .unwrap();
    // Redis's clock moves on its own: watch the approval until it expires (bounded).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let state = approvals
            .get_approval(bob().request(proto::GetApprovalRequest {
                approval_id: id.clone(),
            }))
            .await
            .unwrap()
            .into_inner()
            .approval
            .unwrap()
            .state();
        if state == proto::ApprovalState::Expired {
            break;
        }
        assert_eq!(state, proto::ApprovalState::Approved);
        assert!(Instant::now() < deadline, "not expired after its 1 s TTL");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut redeem = call("sign", "{}");
    redeem.approval_id = id;
    let late = exec(&mut client, &alice(), redeem).await;
    assert_eq!(late.error_type, "approval_expired", "{late:?}");

    // Within the window the key belongs to its first arguments; after it, to anyone's.
    let first = exec(&mut client, &alice(), keyed("free", r#"{"text":"a"}"#, "w")).await;
    assert_eq!(first.status(), ToolStatus::Ok);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let other = exec(&mut client, &alice(), keyed("free", r#"{"text":"b"}"#, "w")).await;
        if other.status() == ToolStatus::Ok {
            assert!(!other.idempotent_replay);
            assert_eq!(other.model_text, "b");
            break;
        }
        assert_eq!(other.error_type, "idempotency_conflict", "{other:?}");
        assert!(Instant::now() < deadline, "the 1 s window never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

on_both_backends!(list_approvals_pages_through_the_tenants_approvals_in_creation_order);

async fn list_approvals_pages_through_the_tenants_approvals_in_creation_order(backend: Backend) {
    let server = TestServer::start_on(backend, crate::support::STAGES).await;
    let mut client = server.client().await;
    let mut ids = Vec::new();
    for i in 0..7 {
        // In memory, pairs share a millisecond of the test's clock (Redis's own clock decides
        // there): creation time orders them, then ids within a millisecond.
        if i % 2 == 0 {
            server.clock.advance(std::time::Duration::from_millis(3));
        }
        let id = exec(
            &mut client,
            &alice(),
            call("approve_me", &format!(r#"{{"amount":{i}}}"#)),
        )
        .await
        .approval_id;
        ids.push(id);
    }
    // Another tenant's approval is never on acme's pages.
    let globex = exec(&mut client, &who("globex"), call("approve_me", "{}")).await;
    assert_eq!(globex.status(), ToolStatus::ApprovalRequired);
    let mut approvals = server.approvals().await;
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    for _ in 0..10 {
        let page = approvals
            .list_approvals(bob().request(proto::ListApprovalsRequest {
                page_size: 3,
                page_token: token.clone(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        assert!(page.approvals.len() <= 3);
        seen.extend(
            page.approvals
                .into_iter()
                .map(|a| (a.created_at_unix_ms, a.approval_id)),
        );
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    // Across the pages: oldest first, ties by id, computed from the approvals' own fields.
    let mut by_creation = seen.clone();
    by_creation.sort();
    assert_eq!(seen, by_creation, "the pages' order");
    let mut expected = ids.clone();
    expected.sort();
    let mut got: Vec<String> = seen.iter().map(|(_, id)| id.clone()).collect();
    got.sort();
    assert_eq!(got, expected, "every approval exactly once");
    assert_eq!(pages, 3, "{seen:?}");
    let bad = approvals
        .list_approvals(bob().request(proto::ListApprovalsRequest {
            page_token: "not-a-token".into(),
            ..Default::default()
        }))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    server.stop().await;
}
