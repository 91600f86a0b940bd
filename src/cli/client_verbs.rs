//! The operator client verbs besides `explain`: `tools` (ListTools), `call` (ExecuteTool),
//! `approvals` (ListApprovals, every page), `approve` and `reject` (DecideApproval), each printed
//! as text or, with `--json`, as JSON.

use std::process::ExitCode;

use serde_json::json;

use super::{
    ClientArgs,
    client::{channel, request, status_error},
};
use crate::proto::{self, approvals_client::ApprovalsClient, tool_gate_client::ToolGateClient};

/// `toolgate tools`: the tools ListTools returns to the caller.
pub(super) async fn tools(client: ClientArgs) -> anyhow::Result<ExitCode> {
    let mut grpc = ToolGateClient::new(channel(&client).await?);
    let response = grpc
        .list_tools(request(&client, proto::ListToolsRequest {})?)
        .await
        .map_err(status_error)?
        .into_inner();
    if client.json {
        let tools: Vec<_> = response
            .tools
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "version": t.version,
                    "description": t.description,
                    "input_schema": serde_json::from_str::<serde_json::Value>(&t.input_schema_json).unwrap_or_default(),
                    "risk_level": t.risk_level().as_str_name(),
                    "required_scopes": t.required_scopes,
                    "timeout_ms": t.timeout_ms,
                    "requires_approval": t.requires_approval,
                })
            })
            .collect();
        println!(
            "{}",
            json!({"catalog_revision": response.catalog_revision, "tools": tools})
        );
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
    Ok(ExitCode::SUCCESS)
}

/// `toolgate call`: one ExecuteTool call; exit 4 when its status is not OK.
pub(super) async fn call_tool(
    client: ClientArgs,
    call: proto::ToolCall,
    run_id: String,
    timeout: Option<String>,
) -> anyhow::Result<ExitCode> {
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
        req.set_timeout(crate::config::parse_duration(&timeout).map_err(anyhow::Error::msg)?);
    }
    let result = grpc
        .execute_tool(req)
        .await
        .map_err(status_error)?
        .into_inner()
        .result
        .ok_or_else(|| anyhow::anyhow!("the sidecar answered without a result"))?;
    let status = result
        .status()
        .as_str_name()
        .trim_start_matches("TOOL_STATUS_")
        .to_owned();
    if client.json {
        println!(
            "{}",
            json!({
                "call_id": result.call_id,
                "status": status,
                "model_text": result.model_text,
                "error_type": result.error_type,
                "error_message": result.error_message,
                "retryable": result.retryable,
                "tool_version": result.tool_version,
                "approval_id": result.approval_id,
                "retry_after_ms": result.retry_after_ms,
                "duration_ms": result.duration_ms,
                "refused_by": result.refused_by,
                "idempotent_replay": result.idempotent_replay,
            })
        );
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
    Ok(if status == "OK" {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(4)
    })
}

/// The most ListApprovals pages `toolgate approvals` reads (200 approvals each).
const MAX_PAGES: usize = 1000;

/// `toolgate approvals`: the approvals of the caller's tenant, oldest first.
pub(super) async fn list_approvals(client: ClientArgs) -> anyhow::Result<ExitCode> {
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
            println!(
                "{}",
                json!({"approval_id": a.approval_id, "tool": a.tool, "tool_version": a.tool_version,
                       "subject": a.subject, "agent": a.agent, "run_id": a.run_id,
                       "arguments_preview": a.arguments_preview, "arguments_truncated": a.arguments_truncated,
                       "arguments_sha256": a.arguments_sha256, "expires_at_unix_ms": a.expires_at_unix_ms})
            );
        } else {
            println!(
                "{}  {} v{}  by {} ({})  args {}{more}",
                a.approval_id, a.tool, a.tool_version, a.subject, a.run_id, a.arguments_preview
            );
        }
    }
    if approvals.is_empty() && !client.json {
        println!("no pending approvals");
    }
    Ok(ExitCode::SUCCESS)
}

/// `toolgate approve` and `reject`: DecideApproval.
pub(super) async fn decide(
    client: ClientArgs,
    approval_id: String,
    approve: bool,
    reason: String,
) -> anyhow::Result<ExitCode> {
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
        .ok_or_else(|| anyhow::anyhow!("the sidecar answered without the approval"))?;
    let state = approval
        .state()
        .as_str_name()
        .trim_start_matches("APPROVAL_STATE_")
        .to_owned();
    if client.json {
        println!(
            "{}",
            json!({"approval_id": approval.approval_id, "state": state, "decided_by": approval.decided_by})
        );
    } else {
        println!(
            "{} {} by {}",
            approval.approval_id, state, approval.decided_by
        );
    }
    Ok(ExitCode::SUCCESS)
}
