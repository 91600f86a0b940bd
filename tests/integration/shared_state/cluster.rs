//! A Redis cluster: each tenant's keys in one slot, every concern working.

use super::*;

#[tokio::test]
async fn on_a_redis_cluster_each_tenant_keeps_to_one_slot_and_every_concern_works() {
    let cluster = crate::redis_server::RedisCluster::start(3);
    let tenants: Vec<String> = (0..12).map(|i| format!("tenant-{i:02}")).collect();
    let yaml = format!(
        r#"version: 1
identity: {{ dev_identity: true }}
state:
  backend: redis
  redis: {{ url: "{url}", cluster: true, timeout: 5s }}
tenants:
{tenants}tools:
  - {{ name: limited, description: Five a minute., risk_level: read_only, rate_limit: 5/min, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
  - {{ name: sign, description: Signs once approved., risk_level: write_confirmed, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
  - {{ name: note, description: Notes., risk_level: write_draft, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
"#,
        url = cluster.url(),
        tenants = tenants
            .iter()
            .map(|t| format!("  {t}: {{ rate_limit: 100/min }}\n"))
            .collect::<String>(),
    );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    let mut approvals = server.approvals().await;
    for tenant in &tenants {
        let caller = who(tenant).subject("alice");
        // Both quotas in one script on the tenant's node: exactly the quota.
        let mut admitted = 0;
        for _ in 0..7 {
            if exec(&mut client, &caller, call("limited", "{}"))
                .await
                .status()
                == ToolStatus::Ok
            {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 5, "{tenant}");
        // An approval: requested, listed, approved, used once.
        let id = exec(&mut client, &caller, call("sign", "{}"))
            .await
            .approval_id;
        let approver = who(tenant).subject("bob").scopes(APPROVE);
        let listed = approvals
            .list_approvals(approver.request(proto::ListApprovalsRequest::default()))
            .await
            .unwrap()
            .into_inner()
            .approvals;
        assert_eq!(listed.len(), 1, "{tenant}");
        approvals
            .decide_approval(approver.request(proto::DecideApprovalRequest {
                approval_id: id.clone(),
                decision: ApprovalDecision::Approve as i32,
                reason: String::new(),
            }))
            .await
            .unwrap();
        let mut redeem = call("sign", "{}");
        redeem.approval_id = id;
        assert_eq!(
            exec(&mut client, &caller, redeem.clone()).await.status(),
            ToolStatus::Ok
        );
        assert_eq!(
            exec(&mut client, &caller, redeem).await.error_type,
            "approval_already_used"
        );
        // An idempotent call, replayed.
        let first = exec(&mut client, &caller, keyed("note", "{}", "k")).await;
        let again = exec(&mut client, &caller, keyed("note", "{}", "k")).await;
        assert_eq!(
            (first.idempotent_replay, again.idempotent_replay),
            (false, true)
        );
    }
    // The tenants' keys are spread over the nodes: it really is a cluster.
    let mut holding = 0;
    for node in &cluster.nodes {
        if node.command(&["DBSIZE"]).await != redis::Value::Int(0) {
            holding += 1;
        }
    }
    assert!(holding >= 2, "all keys on {holding} node(s)");
    // Scripts flushed on every node are loaded again on the node that needs them.
    for node in &cluster.nodes {
        node.command(&["SCRIPT", "FLUSH"]).await;
    }
    let after = exec(&mut client, &who("tenant-00"), keyed("note", "{}", "k2")).await;
    assert_eq!(after.status(), ToolStatus::Ok, "{after:?}");
    server.stop().await;
}
