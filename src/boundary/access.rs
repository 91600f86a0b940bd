//! Stage 4: allow/deny lists — global, then the tenant's, then the agent's. Deny wins at every
//! level, a set allow list admits only what it matches, and a tenant not in the catalog gets
//! nothing. Once agents are configured, an agent the catalog does not list (or a caller naming
//! none) gets the `"*"` entry, or nothing: the agent is the caller's claim, so misspelling it must
//! never widen access. The refusal names the rule that matched.
//!
//! [`check`] (the chain) and [`explain`] (ExplainTool, `toolgate test`) walk the lists with the
//! same function, so an explanation names the rule that really decided.

use crate::{
    catalog::{AccessList, AgentPolicy, Catalog, Pattern, Verdict},
    error::{Reason, Refusal, Stage},
    identity::Caller,
};

pub fn check(catalog: &Catalog, caller: &Caller, tool: &str) -> Result<(), Refusal> {
    walk(catalog, caller, tool, |_, _| {}, &mut None)
}

/// A rule of the catalog that took part in an access decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Where it is defined, e.g. `tenants.globex.deny[0]`, or the list (`agents.support-bot.allow`)
    /// when no pattern of an allow list matched.
    pub location: String,
    /// The glob, when one pattern decided.
    pub pattern: Option<String>,
    /// `allow` or `deny`.
    pub effect: &'static str,
}

impl Rule {
    fn of(pattern: &Pattern, effect: &'static str) -> Self {
        Rule {
            location: pattern.location.clone(),
            pattern: Some(pattern.text.clone()),
            effect,
        }
    }
}

/// Why access was decided as it was.
#[derive(Debug, Clone)]
pub struct Explained {
    /// The refusal, if access refuses.
    pub refusal: Option<Refusal>,
    /// The rule that refused; or, when access passes, the allow rules that admitted the tool
    /// (none when no level has an allow list).
    pub rules: Vec<Rule>,
}

/// [`check`], saying which rules decided.
pub fn explain(catalog: &Catalog, caller: &Caller, tool: &str) -> Explained {
    let mut allowed = Vec::new();
    let mut denied_by = None;
    let decided = walk(
        catalog,
        caller,
        tool,
        |_, hit| {
            if let Some(pattern) = hit {
                allowed.push(Rule::of(pattern, "allow"));
            }
        },
        &mut denied_by,
    );
    match decided {
        Ok(()) => Explained {
            refusal: None,
            rules: allowed,
        },
        Err(refusal) => Explained {
            refusal: Some(refusal),
            rules: denied_by.into_iter().collect(),
        },
    }
}

/// Every level in order; `passed` hears of each level that admitted the tool and the allow
/// pattern that did (none without an allow list); `denied_by` gets the rule that refused.
fn walk<'c>(
    catalog: &'c Catalog,
    caller: &Caller,
    tool: &str,
    mut passed: impl FnMut(&'c AccessList, Option<&'c Pattern>),
    denied_by: &mut Option<Rule>,
) -> Result<(), Refusal> {
    let Some(tenant) = catalog.tenants.get(&*caller.tenant) else {
        *denied_by = Some(Rule {
            location: "tenants".to_owned(),
            pattern: None,
            effect: "allow",
        });
        return Err(Refusal::new(
            Stage::Access,
            Reason::TenantUnknown,
            format!("tenant {} is not in the catalog", caller.tenant),
        ));
    };
    check_list(&catalog.policy, tool, &mut passed, denied_by, || {
        "the global policy".to_owned()
    })?;
    check_list(&tenant.access, tool, &mut passed, denied_by, || {
        format!("tenant {}", caller.tenant)
    })?;
    match catalog.agents.for_agent(&caller.agent) {
        AgentPolicy::Unrestricted => Ok(()),
        AgentPolicy::Named(list) => check_list(list, tool, &mut passed, denied_by, || {
            format!("agent {}", caller.agent)
        }),
        AgentPolicy::Default(list) => check_list(list, tool, &mut passed, denied_by, || {
            format!(
                "the default agent policy (agents.\"*\", applied to agent {:?})",
                caller.agent
            )
        }),
        AgentPolicy::Unknown => {
            *denied_by = Some(Rule {
                location: "agents".to_owned(),
                pattern: None,
                effect: "allow",
            });
            Err(Refusal::new(
                Stage::Access,
                Reason::DeniedByPolicy,
                format!(
                    "agent {:?} is not in the catalog and the catalog has no default agent policy (agents.\"*\")",
                    caller.agent
                ),
            ))
        }
    }
}

/// `owner` names the list in a refusal; it is built only then, as most calls are allowed.
fn check_list<'c>(
    list: &'c AccessList,
    tool: &str,
    passed: &mut impl FnMut(&'c AccessList, Option<&'c Pattern>),
    denied_by: &mut Option<Rule>,
    owner: impl FnOnce() -> String,
) -> Result<(), Refusal> {
    let (message, rule) = match list.decide(tool) {
        Verdict::Allowed(hit) => {
            passed(list, hit);
            return Ok(());
        }
        Verdict::Denied(pattern) => (
            format!(
                "{tool} is denied by {}'s deny rule {:?}",
                owner(),
                pattern.text
            ),
            Rule::of(pattern, "deny"),
        ),
        Verdict::NotAllowed => (
            format!("{tool} is not in {}'s allow list", owner()),
            Rule {
                location: format!("{}.allow", list.location),
                pattern: None,
                effect: "allow",
            },
        ),
    };
    *denied_by = Some(rule);
    Err(Refusal::new(Stage::Access, Reason::DeniedByPolicy, message))
}
