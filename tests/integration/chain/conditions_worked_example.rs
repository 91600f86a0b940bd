//! The worked example of docs/conditions.md, replayed exactly as the page writes it: the catalog
//! loads, its cases pass `toolgate test --coverage` (the real binary), and a real server decides
//! and explains its calls as the page says — the e-mail rule on the arguments, the export on a
//! token's claim, the refund's approval condition, the search's quota cost.

use std::{path::Path, process::Command};

use serde_json::{Value, json};
use toolgate::{
    proto::{self, ToolStatus},
    settings::Env,
};

use crate::support::{START_UNIX_MS, TestServer, Who, call, exec};

const SECRET: &str = "any-secret-of-32-bytes-or-more-000";

/// The page's YAML blocks whose first line names a file (`# conditions.example.yaml`).
fn example_files() -> Vec<(String, String)> {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/conditions.md"))
            .unwrap();
    let mut files = Vec::new();
    let mut rest = page.as_str();
    while let Some(start) = rest.find("```yaml\n") {
        let block = &rest[start + "```yaml\n".len()..];
        let end = block.find("```").expect("a closed block");
        let text = &block[..end];
        if let Some(name) = text
            .lines()
            .next()
            .and_then(|first| first.strip_prefix("# conditions.example"))
        {
            files.push((
                format!("conditions.example{}", name.trim()),
                text.to_owned(),
            ));
        }
        rest = &block[end + 3..];
    }
    files
}

fn example(name: &str) -> String {
    example_files()
        .into_iter()
        .find(|(file, _)| file == name)
        .map(|(_, text)| text)
        .unwrap_or_else(|| panic!("docs/conditions.md has no block {name}"))
}

#[test]
fn the_worked_example_passes_its_own_cases_with_full_coverage() {
    let files = example_files();
    assert_eq!(files.len(), 2, "{files:?}");
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in &files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args([
            "test",
            "--config",
            "conditions.example.yaml",
            "conditions.example.tests.yaml",
            "--coverage",
        ])
        .env("TOOLGATE_JWT_SECRET", SECRET)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("8 passed, 0 failed")
            && stdout.contains("conditions: 3/3 held in one case and were false in another"),
        "{stdout}"
    );
}

fn token(claims: Value) -> Who {
    let mut claims = claims;
    claims["exp"] = json!(START_UNIX_MS / 1000 + 600);
    Who::token(&crate::support::hs256_jwt(SECRET, &claims))
}

#[tokio::test]
async fn the_worked_example_decides_and_explains_as_the_page_says() {
    let env = Env::default().with("TOOLGATE_JWT_SECRET", SECRET);
    let server = TestServer::start_with_env(&example("conditions.example.yaml"), &env).await;
    let mut client = server.client().await;
    let alice = token(json!({"tenant": "acme", "sub": "alice", "scope": "toolgate:explain"}));
    // A thousand cells an hour, fifty a search: twenty searches, then none.
    for n in 0..20 {
        let search = exec(
            &mut client,
            &alice,
            call("search_docs", r#"{"query":"refunds","top_k":50}"#),
        )
        .await;
        assert_eq!(search.status(), ToolStatus::Ok, "search {n}: {search:?}");
    }
    let limited = exec(
        &mut client,
        &alice,
        call("search_docs", r#"{"query":"refunds","top_k":1}"#),
    )
    .await;
    assert_eq!(limited.status(), ToolStatus::RateLimited, "{limited:?}");
    // The e-mail rule, explained on the arguments it read.
    let explained = client
        .explain_tool(alice.request(proto::ExplainToolRequest {
            call: Some(call(
                "send_email",
                r#"{"to":"eve@evil.example","text":"hi"}"#,
            )),
            ..Default::default()
        }))
        .await
        .expect("ExplainTool")
        .into_inner();
    let decision = explained.decision.expect("decision");
    assert_eq!(
        (decision.status(), decision.refused_by.as_str()),
        (ToolStatus::Denied, "access"),
        "{decision:?}"
    );
    let rule = &explained.conditions[0];
    assert_eq!(
        (rule.location.as_str(), rule.value),
        ("tenants.acme.deny[0]", true)
    );
    let read: Value = serde_json::from_str(&rule.variables_json).unwrap();
    assert_eq!(read["args"]["to"], "eve@evil.example", "{read}");
    // The export, on the token's exposed claim.
    let finance = token(json!({"tenant": "acme", "sub": "carol", "department": "finance"}));
    let sales = token(json!({"tenant": "acme", "sub": "dave", "department": "sales"}));
    let export = exec(&mut client, &finance, call("export_ledger", "{}")).await;
    assert_eq!(export.status(), ToolStatus::Ok, "{export:?}");
    let export = exec(&mut client, &sales, call("export_ledger", "{}")).await;
    assert_eq!(export.status(), ToolStatus::NotFound, "{export:?}");
    // The refund's approval, only over 500.00.
    let small = exec(
        &mut client,
        &alice,
        call("refund_order", r#"{"order_id":"A-2","amount_cents":2500}"#),
    )
    .await;
    assert_eq!(small.status(), ToolStatus::Ok, "{small:?}");
    let large = exec(
        &mut client,
        &alice,
        call("refund_order", r#"{"order_id":"A-1","amount_cents":60000}"#),
    )
    .await;
    assert_eq!(large.status(), ToolStatus::ApprovalRequired, "{large:?}");
}
