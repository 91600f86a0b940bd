//! Run-level information-flow rules, as the catalog declares them: the label names, which tools
//! carry which, and the rules (`after` these labels, `deny` or `require_approval` those). A
//! call is allowed or not on its own; the rules decide sequences — private data and untrusted
//! content read in one run, then a tool that sends data out. Labels are a bit set (at most 64
//! names), so deciding is a few instructions. What a scope has seen lives in `crate::flow`.

use std::time::Duration;

use crate::settings::{
    FieldError, parse_duration,
    raw::{RawFlow, RawFlowScope},
};

/// Most label names a catalog may declare.
pub const MAX_LABELS: usize = 64;
/// Scopes a tenant keeps unless the catalog says otherwise.
pub const DEFAULT_MAX_SCOPES_PER_TENANT: usize = 10_000;
/// The most a catalog may let a tenant keep.
pub const MAX_SCOPES_PER_TENANT: usize = 1_000_000;

/// A set of declared labels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LabelSet(pub u64);

impl LabelSet {
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn contains_all(self, other: LabelSet) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn intersects(self, other: LabelSet) -> bool {
        self.0 & other.0 != 0
    }

    pub fn union(self, other: LabelSet) -> LabelSet {
        LabelSet(self.0 | other.0)
    }

    /// The labels' indices, lowest first.
    pub fn indices(self) -> impl Iterator<Item = usize> {
        (0..MAX_LABELS).filter(move |i| self.0 & (1 << i) != 0)
    }
}

/// Whose history the rules read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowScope {
    Run,
    Caller,
}

/// One rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowRule {
    pub name: String,
    /// Where the catalog defines it: `flow.rules[i]`.
    pub location: String,
    pub after: LabelSet,
    pub deny: LabelSet,
    pub require_approval: LabelSet,
}

/// What the rules decide for a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowVerdict<'a> {
    Allowed,
    /// A rule's `deny` names a label of the tool and all its `after` labels are present.
    Denied(&'a FlowRule),
    /// Likewise for `require_approval` (no rule denies).
    NeedsApproval(&'a FlowRule),
}

/// The catalog's `flow` section.
#[derive(Debug, Clone)]
pub struct FlowPolicy {
    pub scope: FlowScope,
    pub window: Duration,
    /// Most scopes one tenant keeps.
    pub max_scopes_per_tenant: usize,
    labels: Vec<String>,
    pub rules: Vec<FlowRule>,
}

impl FlowPolicy {
    pub fn build(raw: &RawFlow) -> Result<Self, FieldError> {
        if raw.labels.len() > MAX_LABELS {
            return Err(FieldError::new(
                "flow.labels",
                format!("at most {MAX_LABELS} labels"),
            ));
        }
        let mut labels: Vec<String> = Vec::with_capacity(raw.labels.len());
        for (i, label) in raw.labels.iter().enumerate() {
            let valid = !label.is_empty()
                && label.len() <= 64
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !valid {
                return Err(FieldError::new(
                    format!("flow.labels[{i}]"),
                    format!("invalid label {label:?}: use 1-64 of a-z 0-9 _"),
                ));
            }
            if labels.contains(label) {
                return Err(FieldError::new(
                    format!("flow.labels[{i}]"),
                    format!("label {label:?} is declared twice"),
                ));
            }
            labels.push(label.clone());
        }
        let window = match &raw.window {
            None => Duration::from_secs(3600),
            Some(text) => parse_duration(text)
                .map_err(|err| FieldError::new("flow.window", err.to_string()))?,
        };
        let max_scopes_per_tenant = match raw.max_scopes_per_tenant {
            None => DEFAULT_MAX_SCOPES_PER_TENANT,
            Some(n @ 1..=MAX_SCOPES_PER_TENANT) => n,
            Some(n) => {
                return Err(FieldError::new(
                    "flow.max_scopes_per_tenant",
                    format!("{n} is out of range: 1 to {MAX_SCOPES_PER_TENANT}"),
                ));
            }
        };
        let mut policy = FlowPolicy {
            max_scopes_per_tenant,
            scope: match raw.scope {
                RawFlowScope::Run => FlowScope::Run,
                RawFlowScope::Caller => FlowScope::Caller,
            },
            window,
            labels,
            rules: Vec::new(),
        };
        for (i, rule) in raw.rules.iter().enumerate() {
            let path = format!("flow.rules[{i}]");
            let after = policy.set_of(&rule.after, &format!("{path}.after"))?;
            if after.is_empty() {
                return Err(FieldError::new(
                    format!("{path}.after"),
                    "name at least one label",
                ));
            }
            let deny = policy.set_of(&rule.deny, &format!("{path}.deny"))?;
            let require_approval =
                policy.set_of(&rule.require_approval, &format!("{path}.require_approval"))?;
            if deny.is_empty() == require_approval.is_empty() {
                return Err(FieldError::new(
                    path,
                    "a rule takes either deny or require_approval, with at least one label",
                ));
            }
            let name = rule.name.clone().unwrap_or_else(|| path.clone());
            policy.rules.push(FlowRule {
                name,
                location: path,
                after,
                deny,
                require_approval,
            });
        }
        Ok(policy)
    }

    /// The set of declared labels `names`; `path` names the list in an error.
    pub fn set_of(&self, names: &[String], path: &str) -> Result<LabelSet, FieldError> {
        let mut set = LabelSet::default();
        for (i, name) in names.iter().enumerate() {
            let index = self.labels.iter().position(|l| l == name).ok_or_else(|| {
                FieldError::new(
                    format!("{path}[{i}]"),
                    format!(
                        "unknown flow label {name:?}; declare it in flow.labels ({})",
                        self.labels.join(", ")
                    ),
                )
            })?;
            set.0 |= 1 << index;
        }
        Ok(set)
    }

    /// The names of a set's labels, in declaration order.
    pub fn names(&self, set: LabelSet) -> Vec<&str> {
        set.indices()
            .filter_map(|i| self.labels.get(i).map(String::as_str))
            .collect()
    }

    /// The label with this name, if declared.
    pub fn label(&self, name: &str) -> Option<LabelSet> {
        self.labels
            .iter()
            .position(|l| l == name)
            .map(|i| LabelSet(1 << i))
    }

    /// Whether some rule could refuse, or require approval for, a tool carrying `tool`: only
    /// those calls need the scope's history.
    pub fn governs(&self, tool: LabelSet) -> bool {
        self.rules
            .iter()
            .any(|r| tool.intersects(r.deny.union(r.require_approval)))
    }

    /// What the rules decide for a tool carrying `tool` when the scope has seen `present`. A
    /// deny wins over an approval.
    pub fn decide(&self, tool: LabelSet, present: LabelSet) -> FlowVerdict<'_> {
        let applies = |r: &&FlowRule| present.contains_all(r.after);
        if let Some(rule) = self
            .rules
            .iter()
            .filter(applies)
            .find(|r| tool.intersects(r.deny))
        {
            return FlowVerdict::Denied(rule);
        }
        match self
            .rules
            .iter()
            .filter(applies)
            .find(|r| tool.intersects(r.require_approval))
        {
            Some(rule) => FlowVerdict::NeedsApproval(rule),
            None => FlowVerdict::Allowed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::raw::RawFlowRule;

    fn policy() -> FlowPolicy {
        let raw = RawFlow {
            scope: RawFlowScope::Run,
            window: None,
            max_scopes_per_tenant: None,
            labels: vec![
                "private_data".into(),
                "untrusted_content".into(),
                "external_send".into(),
            ],
            rules: vec![
                RawFlowRule {
                    name: Some("no_exfiltration".into()),
                    after: vec!["private_data".into(), "untrusted_content".into()],
                    deny: vec!["external_send".into()],
                    require_approval: vec![],
                },
                RawFlowRule {
                    name: None,
                    after: vec!["untrusted_content".into()],
                    deny: vec![],
                    require_approval: vec!["external_send".into()],
                },
            ],
        };
        FlowPolicy::build(&raw).unwrap()
    }

    #[test]
    fn the_send_is_refused_after_both_reads_and_needs_approval_after_one() {
        let p = policy();
        let label = |n: &str| p.label(n).unwrap();
        let send = label("external_send");
        assert!(p.governs(send));
        assert!(!p.governs(label("private_data")));
        assert_eq!(p.decide(send, LabelSet::default()), FlowVerdict::Allowed);
        assert_eq!(p.decide(send, label("private_data")), FlowVerdict::Allowed);
        assert!(matches!(
            p.decide(send, label("untrusted_content")),
            FlowVerdict::NeedsApproval(r) if r.name == "flow.rules[1]"
        ));
        assert!(matches!(
            p.decide(send, label("private_data").union(label("untrusted_content"))),
            FlowVerdict::Denied(r) if r.name == "no_exfiltration"
        ));
        assert_eq!(
            p.names(label("external_send").union(label("private_data"))),
            ["private_data", "external_send"]
        );
    }

    #[test]
    fn unknown_labels_and_empty_rules_are_load_errors() {
        let p = policy();
        let err = p
            .set_of(&["secret".into()], "tools[0].flow_labels")
            .unwrap_err();
        assert_eq!(err.path, "tools[0].flow_labels[0]");
        assert!(err.message.contains("private_data"), "{}", err.message);
        let raw = RawFlow {
            scope: RawFlowScope::Caller,
            window: Some("10m".into()),
            max_scopes_per_tenant: None,
            labels: vec!["a".into()],
            rules: vec![RawFlowRule {
                name: None,
                after: vec!["a".into()],
                deny: vec![],
                require_approval: vec![],
            }],
        };
        let err = FlowPolicy::build(&raw).unwrap_err();
        assert_eq!(err.path, "flow.rules[0]");
        let many = RawFlow {
            labels: (0..65).map(|i| format!("l{i}")).collect(),
            rules: vec![],
            ..raw.clone()
        };
        assert_eq!(FlowPolicy::build(&many).unwrap_err().path, "flow.labels");
    }
}
