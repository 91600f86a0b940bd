//! `toolgate explain`: ExplainTool and ExplainListTools from the command line, and the readable
//! and JSON forms of an explanation (also used by `toolgate test`).

use std::{fmt::Write as _, process::ExitCode};

use serde_json::{Value, json};

use super::{
    ClientArgs,
    client::{channel, request, status_error},
};
use crate::proto::{self, tool_gate_client::ToolGateClient};

/// Explains one call; exits 0 when execution would return OK, 4 otherwise.
pub async fn explain(
    client: ClientArgs,
    call: proto::ToolCall,
    run_id: String,
) -> anyhow::Result<ExitCode> {
    let name = call.name.clone();
    let mut grpc = ToolGateClient::new(channel(&client).await?);
    let response = grpc
        .explain_tool(request(
            &client,
            proto::ExplainToolRequest {
                call: Some(call),
                run_id,
                step: 0,
                catalog_revision: String::new(),
            },
        )?)
        .await
        .map_err(status_error)?
        .into_inner();
    if client.json {
        println!("{}", to_json(&response));
    } else {
        print!("{}", render(&response, &name));
    }
    let ok = response
        .decision
        .as_ref()
        .is_some_and(|d| d.status() == proto::ToolStatus::Ok);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(4)
    })
}

/// Lists every tool, visible to the caller or not, with what hides the others.
pub async fn list(client: ClientArgs) -> anyhow::Result<ExitCode> {
    let mut grpc = ToolGateClient::new(channel(&client).await?);
    let response = grpc
        .explain_list_tools(request(&client, proto::ExplainListToolsRequest {})?)
        .await
        .map_err(status_error)?
        .into_inner();
    if client.json {
        println!("{}", list_json(&response));
    } else {
        print!("{}", render_list(&response));
    }
    Ok(ExitCode::SUCCESS)
}

fn status_name(status: proto::ToolStatus) -> &'static str {
    status
        .as_str_name()
        .strip_prefix("TOOL_STATUS_")
        .unwrap_or("UNSPECIFIED")
}

fn result_name(result: proto::StageResult) -> &'static str {
    match result {
        proto::StageResult::Passed => "passed",
        proto::StageResult::Refused => "REFUSED",
        proto::StageResult::NotReached => "not reached",
        proto::StageResult::NotApplicable => "n/a",
        proto::StageResult::Unspecified => "?",
    }
}

/// The explanation as text: the decision, then one line per stage (with the rule, violations
/// and quotas under it), then the final arguments.
pub fn render(response: &proto::ExplainToolResponse, name: &str) -> String {
    let mut out = String::new();
    let decision = response.decision.clone().unwrap_or_default();
    let version = match decision.tool_version.as_str() {
        "" => String::new(),
        v => format!(" v{v}"),
    };
    let status = status_name(decision.status());
    let _ = match (response.would_execute, decision.refused_by.as_str()) {
        (true, _) => writeln!(
            out,
            "{status} {name}{version}: every stage passes; the backend would be called (nothing was run)"
        ),
        (false, "") if decision.idempotent_replay => writeln!(
            out,
            "{status} {name}{version}: the stored result would be replayed (nothing was run)"
        ),
        (false, stage) => writeln!(
            out,
            "{status} {name}{version}: refused by {stage} [{}] (nothing was run)",
            decision.error_type
        ),
    };
    for stage in &response.stages {
        // Explaining never runs the backend: say so rather than "not reached".
        let result = match (stage.stage.as_str(), stage.result()) {
            ("execute", proto::StageResult::NotReached) => "not run",
            (_, result) => result_name(result),
        };
        let line = format!("  {:<12} {:<12} {}", stage.stage, result, stage.detail);
        let _ = writeln!(out, "{}", line.trim_end());
        let more = |out: &mut String, text: String| {
            let _ = writeln!(out, "  {:<12} {:<12}   {text}", "", "");
        };
        for rule in &stage.rules {
            let pattern = match rule.pattern.as_str() {
                "" => String::new(),
                p => format!(" {p:?}"),
            };
            more(
                &mut out,
                format!("rule {} ({}{pattern})", rule.location, rule.effect),
            );
        }
        if !stage.missing_scope.is_empty() {
            more(&mut out, format!("missing scope {:?}", stage.missing_scope));
        }
        for violation in &stage.schema_violations {
            more(&mut out, format!("violation {violation}"));
        }
        for quota in &stage.quotas {
            let left = match quota.tracked {
                true => format!("{} left", quota.remaining),
                false => "not tracked".to_owned(),
            };
            more(
                &mut out,
                format!(
                    "quota {} {} (burst {}): {left}",
                    quota.scope, quota.rate, quota.burst
                ),
            );
        }
    }
    if !response.bound_override_attempts.is_empty() {
        let _ = writeln!(
            out,
            "model tried to set bound arguments: {}",
            response.bound_override_attempts.join(", ")
        );
    }
    match response.final_arguments_json.as_str() {
        "" => {
            let _ = writeln!(out, "final arguments: none (refused before bind)");
        }
        arguments => {
            let _ = writeln!(out, "final arguments: {arguments}");
            let _ = writeln!(out, "arguments sha256: {}", response.arguments_sha256);
        }
    }
    if !decision.model_text.is_empty() {
        let _ = writeln!(out, "model_text: {}", decision.model_text);
    }
    out
}

/// The explanation as JSON, with the same names as the proto fields.
pub fn to_json(response: &proto::ExplainToolResponse) -> Value {
    let decision = response.decision.clone().unwrap_or_default();
    let stages: Vec<Value> = response
        .stages
        .iter()
        .map(|s| {
            json!({
                "stage": s.stage,
                "result": result_name(s.result()).to_ascii_lowercase().replace(' ', "_"),
                "detail": s.detail,
                "rules": s.rules.iter().map(rule_json).collect::<Vec<_>>(),
                "missing_scope": s.missing_scope,
                "schema_violations": s.schema_violations,
                "bound_arguments": s.bound_arguments.iter().map(|b| json!({
                    "path": b.path,
                    "value": serde_json::from_str::<Value>(&b.value_json).unwrap_or(Value::Null),
                    "source": b.source,
                })).collect::<Vec<_>>(),
                "quotas": s.quotas.iter().map(|q| json!({
                    "scope": q.scope, "rate": q.rate, "burst": q.burst,
                    "remaining": q.remaining, "tracked": q.tracked,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "decision": {
            "status": status_name(decision.status()),
            "error_type": decision.error_type,
            "error_message": decision.error_message,
            "refused_by": decision.refused_by,
            "tool_version": decision.tool_version,
            "approval_id": decision.approval_id,
            "idempotent_replay": decision.idempotent_replay,
            "retryable": decision.retryable,
            "model_text": decision.model_text,
        },
        "would_execute": response.would_execute,
        "stages": stages,
        "final_arguments": serde_json::from_str::<Value>(&response.final_arguments_json).ok(),
        "arguments_sha256": response.arguments_sha256,
        "bound_override_attempts": response.bound_override_attempts,
        "catalog_revision": response.catalog_revision,
    })
}

fn rule_json(rule: &proto::CatalogRule) -> Value {
    json!({"location": rule.location, "pattern": rule.pattern, "effect": rule.effect})
}

/// The visibility listing as text.
pub fn render_list(response: &proto::ExplainListToolsResponse) -> String {
    let mut out = format!(
        "catalog revision {} (what ListTools returns to this caller)\n",
        response.catalog_revision
    );
    for tool in &response.tools {
        let version = match tool.version.as_str() {
            "" => String::new(),
            v => format!("v{v}"),
        };
        if tool.visible {
            let _ = writeln!(out, "  visible  {:<24} {version}", tool.name);
            continue;
        }
        let mut why = format!(
            "by {} [{}]: {}",
            tool.hidden_by, tool.error_type, tool.reason
        );
        if let Some(rule) = &tool.rule {
            let _ = write!(why, " (rule {})", rule.location);
        }
        let _ = writeln!(out, "  hidden   {:<24} {version:<5} {why}", tool.name);
    }
    out
}

/// The visibility listing as JSON.
pub fn list_json(response: &proto::ExplainListToolsResponse) -> Value {
    let tools: Vec<Value> = response
        .tools
        .iter()
        .map(|t| {
            json!({
                "name": t.name, "version": t.version, "visible": t.visible,
                "hidden_by": t.hidden_by, "error_type": t.error_type, "reason": t.reason,
                "rule": t.rule.as_ref().map(rule_json), "missing_scope": t.missing_scope,
            })
        })
        .collect();
    json!({"catalog_revision": response.catalog_revision, "tools": tools})
}
