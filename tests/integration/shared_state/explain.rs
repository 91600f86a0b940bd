//! Explain on one sidecar reads what the others did.

use super::*;

async fn explain_on(
    sidecar: &Spawned,
    who: &Who,
    call: proto::ToolCall,
) -> proto::ExplainToolResponse {
    let request = execute_request(call);
    tools(sidecar)
        .await
        .explain_tool(who.request(proto::ExplainToolRequest {
            call: request.call,
            run_id: request.run_id,
            step: request.step,
            catalog_revision: request.catalog_revision,
        }))
        .await
        .expect("ExplainTool answers")
        .into_inner()
}

fn explained_stage<'a>(
    explained: &'a proto::ExplainToolResponse,
    name: &str,
) -> &'a proto::StageExplanation {
    explained
        .stages
        .iter()
        .find(|s| s.stage == name)
        .unwrap_or_else(|| panic!("no stage {name} in {explained:?}"))
}

/// ExplainTool on one sidecar reads the state the others share: a quota used up, an approval
/// decided and a key stored elsewhere are what it reports, and explaining changes none of them.
#[tokio::test]
async fn explain_on_one_sidecar_reads_what_the_others_did() {
    let redis = RedisServer::start();
    let bank = Bank::open().await;
    let dir = tempfile::tempdir().unwrap();
    let sidecars = sidecars(dir.path(), &catalog(&redis.url(), bank.addr, ""), 2);
    let (a, b) = (&sidecars[0], &sidecars[1]);
    let mut on_a = tools(a).await;

    // The quota, used up on A, is exhausted on B.
    for _ in 0..5 {
        let used = exec(&mut on_a, &alice(), call("limited", "{}")).await;
        assert_eq!(used.status(), ToolStatus::Ok, "{used:?}");
    }
    let explained = explain_on(b, &alice(), call("limited", "{}")).await;
    let decision = explained.decision.clone().unwrap();
    assert_eq!(
        (decision.status(), decision.refused_by.as_str()),
        (ToolStatus::RateLimited, "rate_limit"),
        "{explained:?}"
    );
    assert_eq!(
        explained_stage(&explained, "rate_limit").quotas[0].remaining,
        0
    );

    // A key stored on A would be replayed on B; other arguments under it conflict.
    let charged = exec(
        &mut on_a,
        &alice(),
        keyed("charge", r#"{"amount":9}"#, "order-9"),
    )
    .await;
    assert_eq!(charged.status(), ToolStatus::Ok, "{charged:?}");
    let explained = explain_on(b, &alice(), keyed("charge", r#"{"amount":9}"#, "order-9")).await;
    let decision = explained.decision.clone().unwrap();
    assert_eq!(
        (decision.status(), decision.idempotent_replay),
        (ToolStatus::Ok, true),
        "{explained:?}"
    );
    let explained = explain_on(b, &alice(), keyed("charge", r#"{"amount":10}"#, "order-9")).await;
    assert_eq!(
        explained.decision.clone().unwrap().error_type,
        "idempotency_conflict",
        "{explained:?}"
    );

    // An approval created on A and approved there would be accepted on B.
    let args = r#"{"amount":250}"#;
    let requested = exec(&mut on_a, &alice(), call("pay", args)).await;
    assert_eq!(requested.status(), ToolStatus::ApprovalRequired);
    let id = requested.approval_id.clone();
    let explained = explain_on(b, &alice(), redeeming(args, &id)).await;
    assert_eq!(
        explained.decision.clone().unwrap().error_type,
        "approval_pending",
        "{explained:?}"
    );
    approvals(a)
        .await
        .decide_approval(bob().request(proto::DecideApprovalRequest {
            approval_id: id.clone(),
            decision: ApprovalDecision::Approve as i32,
            reason: "ok".into(),
        }))
        .await
        .unwrap();
    let explained = explain_on(b, &alice(), redeeming(args, &id)).await;
    assert_eq!(
        explained.decision.clone().unwrap().status(),
        ToolStatus::Ok,
        "{explained:?}"
    );
    assert_eq!(
        explained_stage(&explained, "approval").result(),
        proto::StageResult::Passed
    );

    // Explaining changed nothing: the approval is still redeemable once, the key still replays,
    // and the bank was paid once for the charge and once for the approved payment.
    let paid = exec(&mut tools(b).await, &alice(), redeeming(args, &id)).await;
    assert_eq!(paid.status(), ToolStatus::Ok, "{paid:?}");
    let replayed = exec(
        &mut tools(b).await,
        &alice(),
        keyed("charge", r#"{"amount":9}"#, "order-9"),
    )
    .await;
    assert!(replayed.idempotent_replay, "{replayed:?}");
    assert_eq!(bank.paid(), 2);
}
