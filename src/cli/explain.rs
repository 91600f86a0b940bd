//! `toolgate explain`: ExplainTool and ExplainListTools from the command line, and the readable
//! and JSON forms of an explanation (also used by `toolgate test`).

use std::{fmt::Write as _, sync::LazyLock};

use serde::Serialize;
use serde_json::Value;

use super::{
    ClientArgs, Failure,
    client::{channel, request, status_error},
    print_json,
};
use crate::proto::{self, tool_gate_client::ToolGateClient};

/// Explains one call; exits 0 when execution would return OK, 4 otherwise.
pub async fn explain(
    client: ClientArgs,
    call: proto::ToolCall,
    run_id: String,
) -> Result<(), Failure> {
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
        print_json(&to_json(&response))?;
    } else {
        print!("{}", render(&response, &name));
    }
    let ok = response
        .decision
        .as_ref()
        .is_some_and(|d| d.status() == proto::ToolStatus::Ok);
    match ok {
        true => Ok(()),
        false => Err(Failure::NotOk),
    }
}

/// Lists every tool, visible to the caller or not, with what hides the others.
pub async fn list(client: ClientArgs) -> Result<(), Failure> {
    let mut grpc = ToolGateClient::new(channel(&client).await?);
    let response = grpc
        .explain_list_tools(request(&client, proto::ExplainListToolsRequest {})?)
        .await
        .map_err(status_error)?
        .into_inner();
    if client.json {
        print_json(&list_json(&response))?;
    } else {
        print!("{}", render_list(&response));
    }
    Ok(())
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
        (false, stage) => {
            // A tool hidden from the caller is answered as unknown; the trail says what hid it.
            let hidden_by = response
                .stages
                .iter()
                .find(|s| s.result() == proto::StageResult::Refused && s.stage != stage)
                .map(|s| format!("; hidden from this caller by {}", s.stage))
                .unwrap_or_default();
            writeln!(
                out,
                "{status} {name}{version}: refused by {stage} [{}] (nothing was run{hidden_by})",
                decision.error_type
            )
        }
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
    if let Some(flow) = &response.flow {
        let _ = writeln!(out, "{}", render_flow(flow));
    }
    for condition in &response.conditions {
        let value = match (condition.error.as_str(), condition.cost) {
            ("", Some(cells)) => format!("costs {cells}"),
            ("", None) => condition.value.to_string(),
            (error, _) => format!("error ({error}), decided closed"),
        };
        let _ = writeln!(
            out,
            "condition {} {:?}: {value}",
            condition.location, condition.expression
        );
        if !matches!(condition.variables_json.as_str(), "" | "{}") {
            let _ = writeln!(out, "  read {}", condition.variables_json);
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

/// `flow (run): has seen private_data (call c1: rag_search); this call adds external_send;
/// rule no_exfiltration (flow.rules[0]) would deny it`.
fn render_flow(flow: &proto::FlowExplanation) -> String {
    let seen = match (flow.readable, flow.seen.is_empty()) {
        (false, _) => "cannot be read (the shared state is unreachable)".to_owned(),
        (true, true) => "has seen no label".to_owned(),
        (true, false) => {
            let labels: Vec<String> = flow
                .seen
                .iter()
                .map(|l| {
                    let calls: Vec<String> = l
                        .calls
                        .iter()
                        .map(|c| format!("call {}: {}", c.call_id, c.tool))
                        .collect();
                    format!("{} ({})", l.label, calls.join(", "))
                })
                .collect();
            format!("has seen {}", labels.join(", "))
        }
    };
    let mut line = format!("flow ({}): {seen}", flow.scope);
    if !flow.adds.is_empty() {
        let _ = write!(line, "; this call adds {}", flow.adds.join(", "));
    }
    match flow.rule_action.as_str() {
        "" => line.push_str("; no flow rule applies"),
        action => {
            let does = match action {
                "deny" => "would deny it",
                _ => "would require an approval",
            };
            let _ = write!(line, "; rule {} ({}) {does}", flow.rule, flow.rule_location);
        }
    }
    line
}

/// The explanation as `--json` prints it, with the same names as the proto fields.
pub fn to_json(response: &proto::ExplainToolResponse) -> ExplanationJson<'_> {
    ExplanationJson {
        decision: DecisionJson::of(response.decision.as_ref().unwrap_or(&NO_DECISION)),
        would_execute: response.would_execute,
        stages: response.stages.iter().map(StageJson::of).collect(),
        final_arguments: serde_json::from_str(&response.final_arguments_json).ok(),
        arguments_sha256: &response.arguments_sha256,
        bound_override_attempts: &response.bound_override_attempts,
        catalog_revision: &response.catalog_revision,
        conditions: response.conditions.iter().map(ConditionJson::of).collect(),
        flow: response.flow.as_ref().map(FlowJson::of),
    }
}

/// What an explanation without a decision is read as.
static NO_DECISION: LazyLock<proto::ToolResult> = LazyLock::new(proto::ToolResult::default);

/// `explain --json`: the decision, every stage's trail, and the final arguments.
#[derive(Serialize)]
pub struct ExplanationJson<'a> {
    decision: DecisionJson<'a>,
    would_execute: bool,
    stages: Vec<StageJson<'a>>,
    /// The arguments the backend would get; null when refused before bind.
    final_arguments: Option<Value>,
    arguments_sha256: &'a str,
    bound_override_attempts: &'a [String],
    catalog_revision: &'a str,
    /// Every condition evaluated; left out when there were none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    conditions: Vec<ConditionJson<'a>>,
    /// What the flow scope has seen and the rule that decides; left out without flow rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    flow: Option<FlowJson<'a>>,
}

/// The call's flow scope and the flow rule that decides it.
#[derive(Serialize)]
struct FlowJson<'a> {
    scope: &'a str,
    readable: bool,
    /// Label -> the calls that brought it, as `{call_id, tool}`.
    seen: serde_json::Map<String, Value>,
    adds: &'a [String],
    rule: &'a str,
    rule_location: &'a str,
    rule_action: &'a str,
}

impl<'a> FlowJson<'a> {
    fn of(flow: &'a proto::FlowExplanation) -> Self {
        FlowJson {
            scope: &flow.scope,
            readable: flow.readable,
            seen: flow
                .seen
                .iter()
                .map(|l| {
                    let calls = l
                        .calls
                        .iter()
                        .map(|c| serde_json::json!({ "call_id": c.call_id, "tool": c.tool }))
                        .collect();
                    (l.label.clone(), Value::Array(calls))
                })
                .collect(),
            adds: &flow.adds,
            rule: &flow.rule,
            rule_location: &flow.rule_location,
            rule_action: &flow.rule_action,
        }
    }
}

/// One condition evaluated: its value, or the error it decided closed on.
#[derive(Serialize)]
struct ConditionJson<'a> {
    location: &'a str,
    expression: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<bool>,
    /// A quota cost's cells.
    #[serde(skip_serializing_if = "Option::is_none")]
    cost: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    /// The variables it read, the arguments redacted as records redact them.
    variables: Value,
}

impl<'a> ConditionJson<'a> {
    fn of(condition: &'a proto::ConditionEvaluation) -> Self {
        let failed = !condition.error.is_empty();
        ConditionJson {
            location: &condition.location,
            expression: &condition.expression,
            value: (!failed && condition.cost.is_none()).then_some(condition.value),
            cost: condition.cost.filter(|_| !failed),
            error: failed.then_some(condition.error.as_str()),
            variables: serde_json::from_str(&condition.variables_json)
                .unwrap_or_else(|_| Value::Object(Default::default())),
        }
    }
}

/// What execution would return.
#[derive(Serialize)]
struct DecisionJson<'a> {
    /// The status without its `TOOL_STATUS_` prefix.
    status: &'static str,
    error_type: &'a str,
    error_message: &'a str,
    refused_by: &'a str,
    tool_version: &'a str,
    approval_id: &'a str,
    idempotent_replay: bool,
    retryable: bool,
    model_text: &'a str,
}

impl<'a> DecisionJson<'a> {
    fn of(decision: &'a proto::ToolResult) -> Self {
        DecisionJson {
            status: status_name(decision.status()),
            error_type: &decision.error_type,
            error_message: &decision.error_message,
            refused_by: &decision.refused_by,
            tool_version: &decision.tool_version,
            approval_id: &decision.approval_id,
            idempotent_replay: decision.idempotent_replay,
            retryable: decision.retryable,
            model_text: &decision.model_text,
        }
    }
}

/// One stage of the trail.
#[derive(Serialize)]
struct StageJson<'a> {
    stage: &'a str,
    /// `passed`, `refused`, `not_reached`, `n/a` or `?`.
    result: String,
    detail: &'a str,
    rules: Vec<RuleJson<'a>>,
    missing_scope: &'a str,
    schema_violations: &'a [String],
    bound_arguments: Vec<BoundJson<'a>>,
    quotas: Vec<QuotaJson<'a>>,
}

impl<'a> StageJson<'a> {
    fn of(s: &'a proto::StageExplanation) -> Self {
        StageJson {
            stage: &s.stage,
            result: result_name(s.result())
                .to_ascii_lowercase()
                .replace(' ', "_"),
            detail: &s.detail,
            rules: s.rules.iter().map(RuleJson::of).collect(),
            missing_scope: &s.missing_scope,
            schema_violations: &s.schema_violations,
            bound_arguments: s
                .bound_arguments
                .iter()
                .map(|b| BoundJson {
                    path: &b.path,
                    value: serde_json::from_str(&b.value_json).unwrap_or(Value::Null),
                    source: &b.source,
                })
                .collect(),
            quotas: s
                .quotas
                .iter()
                .map(|q| QuotaJson {
                    scope: &q.scope,
                    rate: &q.rate,
                    burst: q.burst,
                    remaining: q.remaining,
                    tracked: q.tracked,
                })
                .collect(),
        }
    }
}

/// A value the server writes into the arguments, and where it comes from.
#[derive(Serialize)]
struct BoundJson<'a> {
    path: &'a str,
    value: Value,
    source: &'a str,
}

/// A quota a call counts against, and what it leaves.
#[derive(Serialize)]
struct QuotaJson<'a> {
    scope: &'a str,
    rate: &'a str,
    burst: u32,
    remaining: u64,
    tracked: bool,
}

/// A catalog rule that decided, where it is written.
#[derive(Serialize)]
struct RuleJson<'a> {
    location: &'a str,
    pattern: &'a str,
    effect: &'a str,
}

impl<'a> RuleJson<'a> {
    fn of(rule: &'a proto::CatalogRule) -> Self {
        RuleJson {
            location: &rule.location,
            pattern: &rule.pattern,
            effect: &rule.effect,
        }
    }
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

/// The visibility listing as `explain --list --json` prints it.
pub fn list_json(response: &proto::ExplainListToolsResponse) -> ListingJson<'_> {
    let tools = response
        .tools
        .iter()
        .map(|t| VisibilityJson {
            name: &t.name,
            version: &t.version,
            visible: t.visible,
            hidden_by: &t.hidden_by,
            error_type: &t.error_type,
            reason: &t.reason,
            rule: t.rule.as_ref().map(RuleJson::of),
            missing_scope: &t.missing_scope,
        })
        .collect();
    ListingJson {
        catalog_revision: &response.catalog_revision,
        tools,
    }
}

/// `explain --list --json`: every tool, visible or not, and what hides the others.
#[derive(Serialize)]
pub struct ListingJson<'a> {
    catalog_revision: &'a str,
    tools: Vec<VisibilityJson<'a>>,
}

/// One tool of the listing.
#[derive(Serialize)]
struct VisibilityJson<'a> {
    name: &'a str,
    version: &'a str,
    visible: bool,
    hidden_by: &'a str,
    error_type: &'a str,
    reason: &'a str,
    /// The rule that hides it, if one does (null otherwise).
    rule: Option<RuleJson<'a>>,
    missing_scope: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn explanation() -> proto::ExplainToolResponse {
        proto::ExplainToolResponse {
            decision: Some(proto::ToolResult {
                call_id: "tool_step_0_0".into(),
                status: proto::ToolStatus::Denied as i32,
                model_text: "TOOL_ERROR: {\"errorType\":\"bound_argument_override\"}".into(),
                error_type: "bound_argument_override".into(),
                error_message: "argument filter.tenant is set by the server".into(),
                retryable: true,
                user_visible: true,
                tool_version: "3".into(),
                approval_id: "apr_1".into(),
                retry_after_ms: 9,
                duration_ms: 4,
                refused_by: "bind".into(),
                idempotent_replay: true,
                ..Default::default()
            }),
            would_execute: false,
            stages: vec![
                proto::StageExplanation {
                    stage: "access".into(),
                    result: proto::StageResult::Passed as i32,
                    detail: "allowed by agents.*.allow[0] \"*\"".into(),
                    rules: vec![
                        proto::CatalogRule {
                            location: "agents.*.allow[0]".into(),
                            pattern: "*".into(),
                            effect: "allow".into(),
                        },
                        proto::CatalogRule::default(),
                    ],
                    missing_scope: "tickets:read".into(),
                    schema_violations: vec!["/text: not a string".into(), "é\n".into()],
                    bound_arguments: vec![
                        proto::BoundArgument {
                            path: "filter.tenant".into(),
                            value_json: r#"{"b":1,"a":[true,null,1.5]}"#.into(),
                            source: "${caller.tenant}".into(),
                        },
                        proto::BoundArgument {
                            path: "x".into(),
                            value_json: "not json".into(),
                            source: String::new(),
                        },
                    ],
                    quotas: vec![
                        proto::QuotaExplanation {
                            scope: "tenant acme".into(),
                            rate: "2/h".into(),
                            burst: 2,
                            remaining: u64::MAX,
                            tracked: true,
                        },
                        proto::QuotaExplanation::default(),
                    ],
                },
                proto::StageExplanation {
                    stage: "bind".into(),
                    result: proto::StageResult::Refused as i32,
                    ..Default::default()
                },
                proto::StageExplanation {
                    stage: "approval".into(),
                    result: proto::StageResult::NotReached as i32,
                    ..Default::default()
                },
                proto::StageExplanation {
                    stage: "rate_limit".into(),
                    result: proto::StageResult::NotApplicable as i32,
                    ..Default::default()
                },
                proto::StageExplanation {
                    stage: "?".into(),
                    result: proto::StageResult::Unspecified as i32,
                    ..Default::default()
                },
            ],
            final_arguments_json: r#"{"query":"q","filter":{"tenant":"acme"}}"#.into(),
            arguments_sha256: "3658488136e5658a44da1614d87a2a899d6b11210972313867845a8ae31910e9"
                .into(),
            bound_override_attempts: vec!["filter.tenant".into()],
            catalog_revision: "e42c15ad0444703a595d78a7caa1198a".into(),
            conditions: Vec::new(),
            flow: None,
        }
    }

    #[test]
    fn the_flow_scope_and_its_rule_are_shown_in_text_and_json() {
        let mut explanation = explanation();
        explanation.flow = Some(proto::FlowExplanation {
            scope: "run".into(),
            seen: vec![proto::FlowLabel {
                label: "private_data".into(),
                calls: vec![proto::FlowCall {
                    call_id: "c1".into(),
                    tool: "rag_search".into(),
                }],
            }],
            readable: true,
            adds: vec!["external_send".into()],
            rule: "no_exfiltration".into(),
            rule_location: "flow.rules[0]".into(),
            rule_action: "deny".into(),
        });
        let text = render(&explanation, "send_email");
        assert!(
            text.contains("\nflow (run): has seen private_data (call c1: rag_search); this call adds external_send; rule no_exfiltration (flow.rules[0]) would deny it\n"),
            "{text}"
        );
        let json = serde_json::to_string(&to_json(&explanation)).unwrap();
        assert!(
            json.ends_with(concat!(
                r#","flow":{"scope":"run","readable":true,"seen":{"private_data":[{"call_id":"c1","tool":"rag_search"}]},"#,
                r#""adds":["external_send"],"rule":"no_exfiltration","rule_location":"flow.rules[0]","rule_action":"deny"}}"#
            )),
            "{json}"
        );
        explanation.flow = Some(proto::FlowExplanation {
            scope: "caller".into(),
            ..Default::default()
        });
        assert!(
            render(&explanation, "send_email").contains(
                "\nflow (caller): cannot be read (the shared state is unreachable); no flow rule applies\n"
            )
        );
    }

    fn listing() -> proto::ExplainListToolsResponse {
        proto::ExplainListToolsResponse {
            catalog_revision: "1c57ab22e9703acfb82fd6cf3e934db6".into(),
            tools: vec![
                proto::ToolVisibility {
                    name: "delete_ticket".into(),
                    version: "1".into(),
                    visible: false,
                    hidden_by: "access".into(),
                    error_type: "denied_by_policy".into(),
                    reason: "denied by tenant globex's deny rule \"delete_ticket\"".into(),
                    rule: Some(proto::CatalogRule {
                        location: "tenants.globex.deny[0]".into(),
                        pattern: "delete_ticket".into(),
                        effect: "deny".into(),
                    }),
                    missing_scope: "x".into(),
                },
                proto::ToolVisibility {
                    name: "echo".into(),
                    version: "1".into(),
                    visible: true,
                    ..Default::default()
                },
            ],
        }
    }

    // What `--json` prints, byte for byte: docs and scripts read these. (Pinned from the
    // hand-built json! objects these types replaced.)

    #[test]
    fn explain_json_names_the_proto_fields_and_parses_the_json_ones() {
        let explanation = explanation();
        let json = serde_json::to_string(&to_json(&explanation)).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"decision":{"status":"DENIED","error_type":"bound_argument_override","error_message":"argument filter.tenant is set by the server","#,
                r#""refused_by":"bind","tool_version":"3","approval_id":"apr_1","idempotent_replay":true,"#,
                r#""retryable":true,"model_text":"TOOL_ERROR: {\"errorType\":\"bound_argument_override\"}"},"#,
                r#""would_execute":false,"stages":[{"stage":"access","result":"passed","detail":"allowed by agents.*.allow[0] \"*\"","#,
                r#""rules":[{"location":"agents.*.allow[0]","pattern":"*","effect":"allow"},"#,
                r#"{"location":"","pattern":"","effect":""}],"missing_scope":"tickets:read","#,
                r#""schema_violations":["/text: not a string","é\n"],"bound_arguments":[{"path":"filter.tenant","#,
                r#""value":{"b":1,"a":[true,null,1.5]},"source":"${caller.tenant}"},{"path":"x","#,
                r#""value":null,"source":""}],"quotas":[{"scope":"tenant acme","rate":"2/h","#,
                r#""burst":2,"remaining":18446744073709551615,"tracked":true},{"scope":"","#,
                r#""rate":"","burst":0,"remaining":0,"tracked":false}]},{"stage":"bind","result":"refused","#,
                r#""detail":"","rules":[],"missing_scope":"","schema_violations":[],"bound_arguments":[],"#,
                r#""quotas":[]},{"stage":"approval","result":"not_reached","detail":"","rules":[],"#,
                r#""missing_scope":"","schema_violations":[],"bound_arguments":[],"quotas":[]},"#,
                r#"{"stage":"rate_limit","result":"n/a","detail":"","rules":[],"missing_scope":"","#,
                r#""schema_violations":[],"bound_arguments":[],"quotas":[]},{"stage":"?","result":"?","#,
                r#""detail":"","rules":[],"missing_scope":"","schema_violations":[],"bound_arguments":[],"#,
                r#""quotas":[]}],"final_arguments":{"query":"q","filter":{"tenant":"acme"}},"#,
                r#""arguments_sha256":"3658488136e5658a44da1614d87a2a899d6b11210972313867845a8ae31910e9","#,
                r#""bound_override_attempts":["filter.tenant"],"catalog_revision":"e42c15ad0444703a595d78a7caa1198a"}"#,
            )
        );
    }

    #[test]
    fn explain_json_without_a_decision_or_final_arguments() {
        let mut explanation = explanation();
        explanation.decision = None;
        for final_arguments in ["", "{not json"] {
            explanation.final_arguments_json = final_arguments.into();
            let json = serde_json::to_string(&to_json(&explanation)).unwrap();
            assert!(
                json.starts_with(concat!(
                    r#"{"decision":{"status":"UNSPECIFIED","error_type":"","error_message":"","#,
                    r#""refused_by":"","tool_version":"","approval_id":"","#,
                    r#""idempotent_replay":false,"retryable":false,"model_text":""},"#,
                )),
                "{json}"
            );
            assert!(json.contains(r#""final_arguments":null,"#), "{json}");
        }
    }

    #[test]
    fn explain_list_json_has_each_tool_and_its_rule_or_null() {
        let listing = listing();
        let json = serde_json::to_string(&list_json(&listing)).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"{"catalog_revision":"1c57ab22e9703acfb82fd6cf3e934db6","tools":[{"name":"delete_ticket","#,
                r#""version":"1","visible":false,"hidden_by":"access","error_type":"denied_by_policy","#,
                r#""reason":"denied by tenant globex's deny rule \"delete_ticket\"","rule":{"location":"tenants.globex.deny[0]","#,
                r#""pattern":"delete_ticket","effect":"deny"},"missing_scope":"x"},{"name":"echo","#,
                r#""version":"1","visible":true,"hidden_by":"","error_type":"","reason":"","#,
                r#""rule":null,"missing_scope":""}]}"#,
            )
        );
    }
}
