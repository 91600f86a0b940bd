//! ExplainTool and ExplainListTools: who may ask, and the explanation in proto terms. The
//! explanation itself is the boundary's (`boundary::explain`).

use super::convert;
use crate::{
    boundary::{
        access::Rule,
        explain::{Explanation, FlowTrail, StageResult, StageTrail, Visibility},
    },
    conditions::{Evaluated, Found},
    proto,
};

pub fn explanation(explained: Explanation) -> proto::ExplainToolResponse {
    proto::ExplainToolResponse {
        would_execute: explained.would_execute,
        stages: explained.stages.iter().map(stage).collect(),
        final_arguments_json: explained
            .arguments
            .as_ref()
            .map(crate::canonical::to_string)
            .unwrap_or_default(),
        arguments_sha256: explained.arguments_sha256.unwrap_or_default(),
        bound_override_attempts: explained.override_attempts,
        catalog_revision: explained.catalog_revision,
        conditions: explained.conditions.into_iter().map(condition).collect(),
        decision: Some(convert::tool_result(explained.outcome)),
        flow: explained.flow.map(flow),
    }
}

fn flow(trail: FlowTrail) -> proto::FlowExplanation {
    let (rule, rule_location, rule_action) = trail
        .rule
        .map(|(name, location, action)| (name, location, action.to_owned()))
        .unwrap_or_default();
    proto::FlowExplanation {
        scope: trail.scope.to_owned(),
        seen: trail
            .seen
            .into_iter()
            .map(|(label, calls)| proto::FlowLabel {
                label,
                calls: calls
                    .into_iter()
                    .map(|c| proto::FlowCall {
                        call_id: c.call_id,
                        tool: c.tool,
                    })
                    .collect(),
            })
            .collect(),
        readable: trail.readable,
        adds: trail.adds,
        rule,
        rule_location,
        rule_action,
    }
}

fn condition(evaluated: Evaluated) -> proto::ConditionEvaluation {
    let (value, cost, error) = match evaluated.value {
        Ok(Found::Holds(value)) => (value, None, String::new()),
        Ok(Found::Cost(cells)) => (false, Some(cells), String::new()),
        Err(error) => (false, None, error),
    };
    let variables: serde_json::Map<String, serde_json::Value> = evaluated
        .read
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    proto::ConditionEvaluation {
        location: evaluated.location,
        expression: evaluated.expression,
        value,
        error,
        cost,
        variables_json: serde_json::Value::Object(variables).to_string(),
    }
}

fn stage(trail: &StageTrail) -> proto::StageExplanation {
    proto::StageExplanation {
        stage: trail.stage.as_str().to_owned(),
        result: stage_result(trail.result) as i32,
        detail: trail.detail.clone(),
        rules: trail.rules.iter().map(rule).collect(),
        missing_scope: trail.missing_scope.clone().unwrap_or_default(),
        schema_violations: trail.violations.clone(),
        bound_arguments: trail
            .bound
            .iter()
            .map(|b| proto::BoundArgument {
                path: b.path.clone(),
                value_json: b.value.to_string(),
                source: b.source.to_owned(),
            })
            .collect(),
        quotas: trail
            .quotas
            .iter()
            .map(|q| proto::QuotaExplanation {
                scope: q.scope.to_owned(),
                rate: q.rate.clone(),
                burst: q.burst,
                remaining: q.remaining.unwrap_or(u64::from(q.burst)),
                tracked: q.remaining.is_some(),
            })
            .collect(),
    }
}

fn stage_result(result: StageResult) -> proto::StageResult {
    match result {
        StageResult::Passed => proto::StageResult::Passed,
        StageResult::Refused => proto::StageResult::Refused,
        StageResult::NotReached => proto::StageResult::NotReached,
        StageResult::NotApplicable => proto::StageResult::NotApplicable,
    }
}

fn rule(rule: &Rule) -> proto::CatalogRule {
    proto::CatalogRule {
        location: rule.location.clone(),
        pattern: rule.pattern.clone().unwrap_or_default(),
        effect: rule.effect.to_owned(),
    }
}

pub fn visibility(
    (tools, catalog_revision): (Vec<Visibility>, String),
) -> proto::ExplainListToolsResponse {
    proto::ExplainListToolsResponse {
        tools: tools
            .into_iter()
            .map(|t| {
                let refusal = t.hidden_by.as_ref();
                proto::ToolVisibility {
                    visible: refusal.is_none(),
                    hidden_by: refusal
                        .map(|r| r.stage.as_str().to_owned())
                        .unwrap_or_default(),
                    error_type: refusal
                        .map(|r| r.reason.code().to_owned())
                        .unwrap_or_default(),
                    reason: refusal.map(|r| r.message.clone()).unwrap_or_default(),
                    rule: t.rule.as_ref().map(rule),
                    missing_scope: t.missing_scope.unwrap_or_default(),
                    name: t.name,
                    version: t.version,
                }
            })
            .collect(),
        catalog_revision,
    }
}
