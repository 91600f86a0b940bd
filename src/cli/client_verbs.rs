//! The operator client verbs besides `explain`: `tools` (ListTools), `call` (ExecuteTool),
//! `approvals` (ListApprovals, every page), `approve` and `reject` (DecideApproval), each printed
//! as text or, with `--json`, as JSON.

use serde::Serialize;
use serde_json::Value;

use super::{
    ClientArgs, Failure,
    client::{channel, request, status_error},
    print_json,
};
use crate::proto::{self, approvals_client::ApprovalsClient, tool_gate_client::ToolGateClient};

/// `toolgate tools`: the tools ListTools returns to the caller.
pub(super) async fn tools(client: ClientArgs) -> Result<(), Failure> {
    let mut grpc = ToolGateClient::new(channel(&client).await?);
    let response = grpc
        .list_tools(request(&client, proto::ListToolsRequest {})?)
        .await
        .map_err(status_error)?
        .into_inner();
    if client.json {
        print_json(&ToolsJson::of(&response))?;
    } else {
        println!("catalog revision {}", response.catalog_revision);
        for t in &response.tools {
            let risk = t
                .risk_level()
                .as_str_name()
                .trim_start_matches("RISK_LEVEL_");
            let approval = if t.requires_approval {
                " [needs approval]"
            } else {
                ""
            };
            println!(
                "  {:<16} v{:<4} {:<16} {}{approval}",
                t.name, t.version, risk, t.description
            );
            println!("  {:<16}       args {}", "", t.input_schema_json);
        }
    }
    Ok(())
}

/// `toolgate call`: one ExecuteTool call; exit 4 when its status is not OK.
pub(super) async fn call_tool(
    client: ClientArgs,
    call: proto::ToolCall,
    run_id: String,
    timeout: Option<String>,
) -> Result<(), Failure> {
    let mut grpc = ToolGateClient::new(channel(&client).await?);
    let name = call.name.clone();
    let mut req = request(
        &client,
        proto::ExecuteToolRequest {
            call: Some(call),
            run_id,
            step: 0,
            catalog_revision: String::new(),
        },
    )?;
    if let Some(timeout) = timeout {
        req.set_timeout(crate::settings::parse_duration(&timeout).map_err(Failure::error)?);
    }
    let result = grpc
        .execute_tool(req)
        .await
        .map_err(status_error)?
        .into_inner()
        .result
        .ok_or_else(|| Failure::error("the sidecar answered without a result"))?;
    let status = result
        .status()
        .as_str_name()
        .trim_start_matches("TOOL_STATUS_")
        .to_owned();
    if client.json {
        print_json(&CallJson::of(&result, &status))?;
    } else {
        let version = if result.tool_version.is_empty() {
            String::new()
        } else {
            format!(" v{}", result.tool_version)
        };
        let replay = if result.idempotent_replay {
            ", replayed"
        } else {
            ""
        };
        println!(
            "{status} {name}{version} (call {}, {} ms{replay})",
            result.call_id, result.duration_ms
        );
        if !result.refused_by.is_empty() {
            println!(
                "refused by {}: {} [{}]",
                result.refused_by, result.error_message, result.error_type
            );
        } else if !result.error_type.is_empty() {
            println!("{} [{}]", result.error_message, result.error_type);
        }
        if !result.approval_id.is_empty() {
            println!("approval_id: {}", result.approval_id);
        }
        if result.retry_after_ms > 0 {
            println!("retry after {} ms", result.retry_after_ms);
        }
        println!("model_text: {}", result.model_text);
    }
    match status.as_str() {
        "OK" => Ok(()),
        _ => Err(Failure::NotOk),
    }
}

/// The most ListApprovals pages `toolgate approvals` reads (200 approvals each).
const MAX_PAGES: usize = 1000;

/// `toolgate approvals`: the approvals of the caller's tenant, oldest first.
pub(super) async fn list_approvals(client: ClientArgs) -> Result<(), Failure> {
    let mut grpc = ApprovalsClient::new(channel(&client).await?);
    let mut approvals = Vec::new();
    let mut page_token = String::new();
    // Every page, oldest first; bounded so a misbehaving server cannot keep the loop going.
    for _ in 0..MAX_PAGES {
        let page = grpc
            .list_approvals(request(
                &client,
                proto::ListApprovalsRequest {
                    state: 0,
                    page_size: 0,
                    page_token: std::mem::take(&mut page_token),
                },
            )?)
            .await
            .map_err(status_error)?
            .into_inner();
        approvals.extend(page.approvals);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    for a in &approvals {
        let more = if a.arguments_truncated { "…" } else { "" };
        if client.json {
            print_json(&ApprovalJson::of(a))?;
        } else {
            // One line per approval, for scripts; why it is needed at its end.
            let because = match a.needed_because.as_str() {
                "" => String::new(),
                why => format!("  (needed: {why})"),
            };
            println!(
                "{}  {} v{}  by {} ({})  args {}{more}{because}",
                a.approval_id, a.tool, a.tool_version, a.subject, a.run_id, a.arguments_preview
            );
        }
    }
    if approvals.is_empty() && !client.json {
        println!("no pending approvals");
    }
    Ok(())
}

/// `toolgate approve` and `reject`: DecideApproval.
pub(super) async fn decide(
    client: ClientArgs,
    approval_id: String,
    approve: bool,
    reason: String,
) -> Result<(), Failure> {
    let mut grpc = ApprovalsClient::new(channel(&client).await?);
    let decision = if approve {
        proto::ApprovalDecision::Approve
    } else {
        proto::ApprovalDecision::Reject
    };
    let approval = grpc
        .decide_approval(request(
            &client,
            proto::DecideApprovalRequest {
                approval_id,
                decision: decision as i32,
                reason,
            },
        )?)
        .await
        .map_err(status_error)?
        .into_inner()
        .approval
        .ok_or_else(|| Failure::error("the sidecar answered without the approval"))?;
    let state = approval
        .state()
        .as_str_name()
        .trim_start_matches("APPROVAL_STATE_")
        .to_owned();
    if client.json {
        print_json(&DecidedJson {
            approval_id: &approval.approval_id,
            state: &state,
            decided_by: &approval.decided_by,
        })?;
    } else {
        println!(
            "{} {} by {}",
            approval.approval_id, state, approval.decided_by
        );
    }
    Ok(())
}

/// `tools --json`: one object, the catalog's revision and the tools.
#[derive(Serialize)]
struct ToolsJson<'a> {
    catalog_revision: &'a str,
    tools: Vec<ToolJson<'a>>,
}

/// One tool of `tools --json`.
#[derive(Serialize)]
struct ToolJson<'a> {
    name: &'a str,
    version: &'a str,
    description: &'a str,
    /// The input schema as JSON (null if the sidecar sent text that is not JSON).
    input_schema: Value,
    risk_level: &'static str,
    required_scopes: &'a [String],
    timeout_ms: u32,
    requires_approval: bool,
}

impl<'a> ToolsJson<'a> {
    fn of(response: &'a proto::ListToolsResponse) -> Self {
        let tools = response
            .tools
            .iter()
            .map(|t| ToolJson {
                name: &t.name,
                version: &t.version,
                description: &t.description,
                input_schema: serde_json::from_str(&t.input_schema_json).unwrap_or_default(),
                risk_level: t.risk_level().as_str_name(),
                required_scopes: &t.required_scopes,
                timeout_ms: t.timeout_ms,
                requires_approval: t.requires_approval,
            })
            .collect();
        ToolsJson {
            catalog_revision: &response.catalog_revision,
            tools,
        }
    }
}

/// `call --json`: one object with the result's fields.
#[derive(Serialize)]
struct CallJson<'a> {
    call_id: &'a str,
    /// The status without its `TOOL_STATUS_` prefix, e.g. `OK`.
    status: &'a str,
    model_text: &'a str,
    error_type: &'a str,
    error_message: &'a str,
    retryable: bool,
    tool_version: &'a str,
    approval_id: &'a str,
    retry_after_ms: u64,
    duration_ms: u64,
    refused_by: &'a str,
    idempotent_replay: bool,
}

impl<'a> CallJson<'a> {
    fn of(result: &'a proto::ToolResult, status: &'a str) -> Self {
        CallJson {
            call_id: &result.call_id,
            status,
            model_text: &result.model_text,
            error_type: &result.error_type,
            error_message: &result.error_message,
            retryable: result.retryable,
            tool_version: &result.tool_version,
            approval_id: &result.approval_id,
            retry_after_ms: result.retry_after_ms,
            duration_ms: result.duration_ms,
            refused_by: &result.refused_by,
            idempotent_replay: result.idempotent_replay,
        }
    }
}

/// One line of `approvals --json` (JSON lines, one approval each).
#[derive(Serialize)]
struct ApprovalJson<'a> {
    approval_id: &'a str,
    tool: &'a str,
    tool_version: &'a str,
    subject: &'a str,
    agent: &'a str,
    run_id: &'a str,
    arguments_preview: &'a str,
    arguments_truncated: bool,
    arguments_sha256: &'a str,
    expires_at_unix_ms: i64,
    needed_because: &'a str,
}

impl<'a> ApprovalJson<'a> {
    fn of(a: &'a proto::Approval) -> Self {
        ApprovalJson {
            approval_id: &a.approval_id,
            tool: &a.tool,
            tool_version: &a.tool_version,
            subject: &a.subject,
            agent: &a.agent,
            run_id: &a.run_id,
            arguments_preview: &a.arguments_preview,
            arguments_truncated: a.arguments_truncated,
            arguments_sha256: &a.arguments_sha256,
            expires_at_unix_ms: a.expires_at_unix_ms,
            needed_because: &a.needed_because,
        }
    }
}

/// `approve --json` and `reject --json`: the approval's new state and who decided.
#[derive(Serialize)]
struct DecidedJson<'a> {
    approval_id: &'a str,
    /// The state without its `APPROVAL_STATE_` prefix, e.g. `APPROVED`.
    state: &'a str,
    decided_by: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing() -> proto::ListToolsResponse {
        proto::ListToolsResponse {
            catalog_revision: "0186ec73f2daed1d056f5c4a89c456ea".into(),
            tools: vec![
                proto::ToolDefinition {
                    name: "refund_order".into(),
                    version: "2".into(),
                    description: "Refunds \"an\" order\n\u{1} — é 🦀 </script>".into(),
                    input_schema_json: r#"{"type":"object","properties":{"z":{"type":"integer","maximum":1e3},"a":{}},"required":["z"]}"#.into(),
                    risk_level: proto::RiskLevel::Destructive as i32,
                    required_scopes: vec!["orders:write".into(), "toolgate:x".into()],
                    timeout_ms: u32::MAX,
                    labels: [("team".to_owned(), "billing".to_owned())].into(),
                    requires_approval: true,
                },
                proto::ToolDefinition {
                    name: "echo".into(),
                    input_schema_json: "{not json".into(),
                    ..Default::default()
                },
            ],
        }
    }

    fn result() -> proto::ToolResult {
        proto::ToolResult {
            call_id: "tool_step_3_1".into(),
            status: proto::ToolStatus::RateLimited as i32,
            model_text: "TOOL_ERROR: {\"errorType\":\"rate_limited\"}\t\u{1f}".into(),
            error_type: "rate_limited".into(),
            error_message: "quota tenant acme 2/h".into(),
            retryable: true,
            user_visible: true,
            tool_version: "1".into(),
            approval_id: "apr_0e27e0902e694df3a3a6073983029762".into(),
            retry_after_ms: u64::MAX,
            duration_ms: 17,
            refused_by: "rate_limit".into(),
            idempotent_replay: true,
            ..Default::default()
        }
    }

    fn approval() -> proto::Approval {
        proto::Approval {
            approval_id: "apr_0e27e0902e694df3a3a6073983029762".into(),
            tenant: "acme".into(),
            subject: "alice".into(),
            agent: "support-bot".into(),
            run_id: "run \"7\"".into(),
            tool: "refund_order".into(),
            tool_version: "1".into(),
            arguments_sha256: "21a174553cffdf2a4452d987320366c19eb5364f346a4f1d4f2b3c0e1f2a3b4c"
                .into(),
            arguments_json: "{}".into(),
            state: proto::ApprovalState::Pending as i32,
            created_at_unix_ms: 1,
            expires_at_unix_ms: -5,
            decided_by: String::new(),
            decided_at_unix_ms: 0,
            reason: String::new(),
            needed_because: "its risk level is write_confirmed".into(),
            risk_level: 3,
            arguments_preview: "{\"amount_cents\":2500,\"order_id\":\"A-1001\"}".into(),
            arguments_truncated: true,
        }
    }

    // What `--json` prints, byte for byte: docs and scripts read these. (Pinned from the
    // hand-built json! objects these types replaced.)

    #[test]
    fn tools_json_is_the_listing_with_each_schema_as_json() {
        let listing = listing();
        let json = serde_json::to_string(&ToolsJson::of(&listing)).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"catalog_revision":"0186ec73f2daed1d056f5c4a89c456ea","tools":[{"name":"refund_order","#,
                r#""version":"2","description":"Refunds \"an\" order\n\u0001 — é 🦀 </script>","#,
                r#""input_schema":{"type":"object","properties":{"z":{"type":"integer","maximum":1000.0},"#,
                r#""a":{}},"required":["z"]},"risk_level":"RISK_LEVEL_DESTRUCTIVE","required_scopes":["orders:write","#,
                r#""toolgate:x"],"timeout_ms":4294967295,"requires_approval":true},{"name":"echo","#,
                r#""version":"","description":"","input_schema":null,"risk_level":"RISK_LEVEL_UNSPECIFIED","#,
                r#""required_scopes":[],"timeout_ms":0,"requires_approval":false}]}"#,
            )
        );
    }

    #[test]
    fn call_json_is_the_results_fields() {
        let result = result();
        let json = serde_json::to_string(&CallJson::of(&result, "RATE_LIMITED")).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"call_id":"tool_step_3_1","status":"RATE_LIMITED","model_text":"TOOL_ERROR: {\"errorType\":\"rate_limited\"}\t\u001f","#,
                r#""error_type":"rate_limited","error_message":"quota tenant acme 2/h","retryable":true,"#,
                r#""tool_version":"1","approval_id":"apr_0e27e0902e694df3a3a6073983029762","#,
                r#""retry_after_ms":18446744073709551615,"duration_ms":17,"refused_by":"rate_limit","#,
                r#""idempotent_replay":true}"#,
            )
        );
    }

    #[test]
    fn approvals_json_is_one_object_per_approval_and_decisions_say_the_state() {
        let approval = approval();
        let json = serde_json::to_string(&ApprovalJson::of(&approval)).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"approval_id":"apr_0e27e0902e694df3a3a6073983029762","tool":"refund_order","#,
                r#""tool_version":"1","subject":"alice","agent":"support-bot","run_id":"run \"7\"","#,
                r#""arguments_preview":"{\"amount_cents\":2500,\"order_id\":\"A-1001\"}","arguments_truncated":true,"#,
                r#""arguments_sha256":"21a174553cffdf2a4452d987320366c19eb5364f346a4f1d4f2b3c0e1f2a3b4c","#,
                r#""expires_at_unix_ms":-5,"needed_because":"its risk level is write_confirmed"}"#,
            )
        );
        let decided = DecidedJson {
            approval_id: &approval.approval_id,
            state: "APPROVED",
            decided_by: "bob \"b\"",
        };
        assert_eq!(
            serde_json::to_string(&decided).unwrap(),
            concat!(
                r#"{"approval_id":"apr_0e27e0902e694df3a3a6073983029762","state":"APPROVED","#,
                r#""decided_by":"bob \"b\""}"#,
            )
        );
    }
}
