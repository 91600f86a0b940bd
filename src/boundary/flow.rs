//! Stage 7b: run-level flow rules (`catalog::flow`), after bind and before the quotas. A tool a
//! rule could refuse, or need an approval for, is checked against what its flow scope has seen
//! (`crate::flow`): refused `flow_denied` (at access, as rules decided after bind are), or
//! handed to the approval stage. The labels of a tool are added to its scope just before its
//! backend is called. A store that cannot be read fails closed for the tools a rule governs, one
//! that cannot be written for the tools that carry labels.

use std::{collections::BTreeMap, sync::Arc};

use super::{
    Turn, access,
    explain::{Explainer, FlowJudged, FlowTrail},
};
use crate::{
    catalog::{
        FlowPolicy, LabelSet, ToolVersion,
        flow::{FlowRule, FlowScope, FlowVerdict},
    },
    error::{Reason, Refusal, Stage},
    flow::{FlowStore, ScopeKey, Seen, Source},
    identity::Caller,
};

/// The call's flow scope under `policy`.
fn scope(policy: &FlowPolicy, caller: &Caller, run_id: &str) -> ScopeKey {
    let run = match policy.scope {
        FlowScope::Run => Some(run_id),
        FlowScope::Caller => None,
    };
    ScopeKey::new(&caller.tenant, &caller.subject, &caller.agent, run)
}

/// What the scope has seen, as the policy's labels.
fn present(policy: &FlowPolicy, seen: &Seen) -> LabelSet {
    seen.keys()
        .filter_map(|name| policy.label(name))
        .fold(LabelSet::default(), LabelSet::union)
}

/// The policy, when one of its rules could refuse this tool or need an approval for it: only
/// then is the scope read (and the check's future, boxed, paid for).
pub(crate) fn governing<'p>(
    policy: Option<&'p Arc<FlowPolicy>>,
    tool: &ToolVersion,
) -> Option<&'p FlowPolicy> {
    policy
        .map(Arc::as_ref)
        .filter(|p| p.governs(tool.flow_labels))
}

/// The policy, when this tool carries labels to record once it ran.
pub(crate) fn labelling<'p>(
    policy: Option<&'p Arc<FlowPolicy>>,
    tool: &ToolVersion,
) -> Option<&'p FlowPolicy> {
    policy
        .map(Arc::as_ref)
        .filter(|_| !tool.flow_labels.is_empty())
}

/// `Ok(Some(why))` when a rule needs an approval for this call (`why` is said after "needs
/// approval"), `Ok(None)` when no rule stands in its way.
pub(crate) async fn check(
    store: &FlowStore,
    policy: &FlowPolicy,
    tool: &ToolVersion,
    caller: &Caller,
    run_id: &str,
) -> Result<Option<String>, Refusal> {
    let seen = read(store, policy, caller, run_id).await;
    let seen = seen.map_err(|err| unreadable(tool, &err))?;
    match judge(policy, tool, &seen) {
        Judged::Allowed => Ok(None),
        Judged::Denied(_, refusal) => Err(refusal),
        Judged::NeedsApproval(_, why) => Ok(Some(why)),
    }
}

/// What the call's scope has seen.
pub(crate) async fn read(
    store: &FlowStore,
    policy: &FlowPolicy,
    caller: &Caller,
    run_id: &str,
) -> Result<Seen, crate::state::StateError> {
    store.seen(&scope(policy, caller, run_id)).await
}

/// A governed tool whose scope cannot be read does not run (fail closed).
pub(crate) fn unreadable(tool: &ToolVersion, err: &crate::state::StateError) -> Refusal {
    let mut refusal = Refusal::new(
        Stage::Access,
        Reason::StateUnavailable,
        format!(
            "{} is governed by flow rules and {}; the call was not run",
            tool.name,
            err.for_caller()
        ),
    );
    refusal.retryable = true;
    refusal
}

/// What the rules decide for a call, with the rule that decided.
pub(crate) enum Judged<'p> {
    Allowed,
    Denied(&'p FlowRule, Refusal),
    /// `why` is said after "needs approval".
    NeedsApproval(&'p FlowRule, String),
}

/// What the rules decide for `tool` once its scope has seen `seen`.
pub(crate) fn judge<'p>(policy: &'p FlowPolicy, tool: &ToolVersion, seen: &Seen) -> Judged<'p> {
    match policy.decide(tool.flow_labels, present(policy, seen)) {
        FlowVerdict::Allowed => Judged::Allowed,
        FlowVerdict::Denied(rule) => Judged::Denied(
            rule,
            Refusal::new(
                Stage::Access,
                Reason::FlowDenied,
                format!(
                    "{} is refused by flow rule {}: this {} has seen {}",
                    tool.name,
                    rule.name,
                    scope_name(policy),
                    brought(policy, rule.after, seen)
                ),
            ),
        ),
        FlowVerdict::NeedsApproval(rule) => Judged::NeedsApproval(
            rule,
            format!(
                " (flow rule {}: this {} has seen {})",
                rule.name,
                scope_name(policy),
                brought(policy, rule.after, seen)
            ),
        ),
    }
}

pub(crate) fn scope_name(policy: &FlowPolicy) -> &'static str {
    match policy.scope {
        FlowScope::Run => "run",
        FlowScope::Caller => "caller",
    }
}

/// `private_data (call c1: rag_search) and untrusted_content (call c2: fetch_url)`.
fn brought(policy: &FlowPolicy, labels: LabelSet, seen: &Seen) -> String {
    policy
        .names(labels)
        .into_iter()
        .map(|label| {
            let calls: Vec<String> = seen
                .get(label)
                .into_iter()
                .flatten()
                .map(|s| format!("call {}: {}", s.call_id, s.tool))
                .collect();
            format!("{label} ({})", calls.join(", "))
        })
        .collect::<Vec<_>>()
        .join(" and ")
}

/// Adds the labels of a tool whose backend is about to be called (or whose stored result is about
/// to be replayed) to its scope; the names added, for the call's audit event. A scope that cannot
/// be written refuses the call before it runs (fail closed, as a scope that cannot be read does):
/// otherwise a rule would later let through what this run has seen.
pub(crate) async fn record(
    store: &FlowStore,
    policy: &FlowPolicy,
    tool: &ToolVersion,
    caller: &Caller,
    run_id: &str,
    call_id: &str,
) -> Result<Vec<String>, Refusal> {
    let labels = policy.names(tool.flow_labels);
    let source = Source {
        call_id: call_id.to_owned(),
        tool: tool.name.clone(),
    };
    let key = scope(policy, caller, run_id);
    store
        .record(
            &key,
            &labels,
            &source,
            policy.window,
            policy.max_scopes_per_tenant,
        )
        .await
        .map_err(|err| {
            tracing::warn!(tool = %tool.name, call_id, error = %err, "the flow labels of a call cannot be recorded; the call was not run");
            let mut refusal = Refusal::new(
                Stage::Access,
                Reason::StateUnavailable,
                format!(
                    "{} carries flow labels and {}, so they cannot be recorded; the call was not run",
                    tool.name,
                    err.for_caller()
                ),
            );
            refusal.retryable = true;
            refusal
        })?;
    Ok(labels.into_iter().map(str::to_owned).collect())
}

impl Explainer<'_> {
    /// Stage 7b, reading the scope (or the given history) and changing nothing: the trail, and
    /// the approval reason a rule adds or the refusal with the rule that decided. `None` when
    /// the catalog has no flow rules or the tool no label.
    pub(super) async fn flow(
        &self,
        turn: &Turn,
        tool: &ToolVersion,
    ) -> Option<(FlowTrail, FlowJudged)> {
        // A tool without labels neither reads nor writes a scope: nothing to show.
        let policy = self
            .catalog
            .flow
            .as_deref()
            .filter(|_| !tool.flow_labels.is_empty())?;
        let seen = match self.history {
            Some(history) => Ok(history.clone()),
            None => read(&self.boundary.flow, policy, &turn.caller, &turn.run_id).await,
        };
        let readable = seen.is_ok();
        let mut trail = FlowTrail {
            scope: scope_name(policy),
            seen: BTreeMap::new(),
            readable,
            adds: policy
                .names(tool.flow_labels)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            rule: None,
        };
        let seen = match seen {
            Ok(seen) => seen,
            Err(err) if policy.governs(tool.flow_labels) => {
                return Some((trail, Err((unreadable(tool, &err), None))));
            }
            Err(_) => return Some((trail, Ok(None))),
        };
        trail.seen = seen
            .into_iter()
            .filter(|(label, _)| policy.label(label).is_some())
            .collect();
        let judged = match judge(policy, tool, &trail.seen) {
            Judged::Allowed => Ok(None),
            Judged::Denied(rule, refusal) => {
                trail.rule = Some((rule.name.clone(), rule.location.clone(), "deny"));
                Err((
                    refusal,
                    Some(access::Rule {
                        location: rule.location.clone(),
                        pattern: Some(rule.name.clone()),
                        effect: "deny",
                        when: None,
                    }),
                ))
            }
            Judged::NeedsApproval(rule, why) => {
                trail.rule = Some((rule.name.clone(), rule.location.clone(), "require_approval"));
                Ok(Some(why))
            }
        };
        Some((trail, judged))
    }
}
