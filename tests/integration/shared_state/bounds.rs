//! What a tenant may keep in Redis, and moving the state elsewhere only on restart.

use super::*;

on_both_backends!(approvals_and_stored_results_are_bounded_per_tenant);

async fn approvals_and_stored_results_are_bounded_per_tenant(backend: Backend) {
    let yaml = crate::support::STAGES
        .replacen(
            "version: 1\n",
            "version: 1\napprovals: { max_per_tenant: 3 }\n",
            1,
        )
        .replace(
            "limits: { max_arguments_bytes: 4096,",
            "limits: { idempotency_max_bytes_per_tenant: 2048, max_arguments_bytes: 8192,",
        );
    let server = TestServer::start_on(backend, &yaml).await;
    let mut client = server.client().await;
    let mut approvals = server.approvals().await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let asked = exec(
            &mut client,
            &alice(),
            call("approve_me", &format!(r#"{{"amount":{i}}}"#)),
        )
        .await;
        assert_eq!(asked.status(), ToolStatus::ApprovalRequired);
        ids.push(asked.approval_id);
    }
    // Three open approvals are the tenant's budget: open ones are never dropped for a fourth.
    let full = exec(&mut client, &alice(), call("approve_me", r#"{"amount":3}"#)).await;
    assert_eq!(
        (full.status(), full.error_type.as_str(), full.retryable),
        (ToolStatus::Unavailable, "overloaded", true),
        "{full:?}"
    );
    // Once one is decided (finished), the oldest finished one makes room.
    approvals
        .decide_approval(bob().request(proto::DecideApprovalRequest {
            approval_id: ids[1].clone(),
            decision: ApprovalDecision::Reject as i32,
            reason: "no".into(),
        }))
        .await
        .unwrap();
    let fourth = exec(&mut client, &alice(), call("approve_me", r#"{"amount":3}"#)).await;
    assert_eq!(fourth.status(), ToolStatus::ApprovalRequired, "{fourth:?}");
    let gone = approvals
        .get_approval(bob().request(proto::GetApprovalRequest {
            approval_id: ids[1].clone(),
        }))
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound);

    // A result larger than the tenant's byte budget is not kept, but its key is: the repeat
    // says so instead of running the tool again.
    let big = "x".repeat(4000);
    let args = format!(r#"{{"text":"{big}"}}"#);
    let first = exec(&mut client, &alice(), keyed("echo", &args, "big")).await;
    assert_eq!(
        (first.status(), first.model_text.len()),
        (ToolStatus::Ok, 4000)
    );
    let runs = server.builtins().executions();
    let again = exec(&mut client, &alice(), keyed("echo", &args, "big")).await;
    assert_eq!(
        (
            again.status(),
            again.error_type.as_str(),
            again.idempotent_replay
        ),
        (ToolStatus::Error, "output_too_large", true),
        "{again:?}"
    );
    assert!(
        again.error_message.contains("too large to keep"),
        "{again:?}"
    );
    assert_eq!(server.builtins().executions(), runs, "the tool ran again");
    server.stop().await;
}

#[tokio::test]
async fn moving_the_state_elsewhere_needs_a_restart() {
    let server = TestServer::start_file(crate::support::STAGES).await;
    let moved = crate::support::STAGES.replacen(
        "version: 1\n",
        &format!("version: 1\n{}", redis_state("redis://127.0.0.1:6379")),
        1,
    );
    server.write_catalog(&server.catalog_file(), &moved);
    let refused = server.reload().await.unwrap_err();
    assert!(
        refused.contains("state") && refused.contains("restart"),
        "{refused}"
    );
    // Still serving from memory.
    let mut client = server.client().await;
    assert_eq!(
        exec(&mut client, &alice(), call("limited", "{}"))
            .await
            .status(),
        ToolStatus::Ok
    );
    server.stop().await;
}
