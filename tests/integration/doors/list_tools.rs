//! ListTools: what each caller's model may see.

use serde_json::Value;
use toolgate::proto;

use crate::support::{TestServer, visible, who};

#[tokio::test]
async fn each_caller_sees_only_what_its_tenant_agent_and_scopes_allow() {
    let server = TestServer::demo().await;
    let mut client = server.client().await;
    let all = "tickets:read,tickets:write";

    let acme = visible(&mut client, &who("acme").scopes(all)).await;
    assert_eq!(
        acme,
        [
            "create_ticket",
            "delete_ticket",
            "echo",
            "query_ticket",
            "rag_search",
            "refund_order",
            "slow_task"
        ]
    );
    // globex's deny list hides delete_ticket.
    let globex = visible(&mut client, &who("globex").scopes(all)).await;
    assert!(!globex.contains(&"delete_ticket".to_owned()), "{globex:?}");
    assert_eq!(globex.len(), acme.len() - 1);
    // The support bot's allow list is narrower.
    let bot = visible(&mut client, &who("acme").agent("support-bot").scopes(all)).await;
    assert_eq!(bot, ["create_ticket", "echo", "query_ticket", "rag_search"]);
    // Without tickets:write, neither create_ticket nor delete_ticket.
    let reader = visible(&mut client, &who("acme").scopes("tickets:read")).await;
    assert!(
        !reader.contains(&"create_ticket".to_owned())
            && !reader.contains(&"delete_ticket".to_owned())
    );
    assert!(reader.contains(&"query_ticket".to_owned()));
    // A tenant the catalog does not know sees nothing.
    assert!(
        visible(&mut client, &who("initech").scopes(all))
            .await
            .is_empty()
    );
    server.stop().await;
}

#[tokio::test]
async fn definitions_hide_bound_parameters_and_revisions_follow_what_is_seen() {
    let server = TestServer::demo().await;
    let mut client = server.client().await;
    let list = |w: crate::support::Who| {
        let mut client = client.clone();
        async move {
            client
                .list_tools(w.request(proto::ListToolsRequest {}))
                .await
                .unwrap()
                .into_inner()
        }
    };
    let acme = list(who("acme").scopes("tickets:read,tickets:write")).await;
    let rag = acme.tools.iter().find(|t| t.name == "rag_search").unwrap();
    let schema: Value = serde_json::from_str(&rag.input_schema_json).unwrap();
    assert!(schema["properties"].get("filter").is_none(), "{schema}");
    assert_eq!(schema["required"], serde_json::json!(["query"]));
    assert_eq!(rag.risk_level(), proto::RiskLevel::ReadOnly);
    assert_eq!(rag.timeout_ms, 5000);
    let refund = acme
        .tools
        .iter()
        .find(|t| t.name == "refund_order")
        .unwrap();
    assert!(refund.requires_approval);
    assert_eq!(refund.risk_level(), proto::RiskLevel::WriteConfirmed);
    let query = acme
        .tools
        .iter()
        .find(|t| t.name == "query_ticket")
        .unwrap();
    assert_eq!(query.required_scopes, ["tickets:read"]);
    assert!(
        !query.input_schema_json.contains("tenant"),
        "{}",
        query.input_schema_json
    );

    // Same view, same revision; a different view, a different revision.
    let again = list(
        who("acme")
            .subject("bob")
            .scopes("tickets:write,tickets:read"),
    )
    .await;
    assert_eq!(again.catalog_revision, acme.catalog_revision);
    let globex = list(who("globex").scopes("tickets:read,tickets:write")).await;
    assert_ne!(globex.catalog_revision, acme.catalog_revision);
    assert!(!acme.catalog_revision.is_empty());
    let _ = client
        .list_tools(who("acme").request(proto::ListToolsRequest {}))
        .await
        .unwrap();
    server.stop().await;
}
