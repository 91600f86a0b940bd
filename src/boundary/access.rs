//! Stage 4: allow/deny lists — global, then the tenant's, then the agent's. Deny wins at every
//! level, a set allow list admits only what it matches, and a tenant not in the catalog gets
//! nothing. Once agents are configured, an agent the catalog does not list (or a caller naming
//! none) gets the `"*"` entry, or nothing: the agent is the caller's claim, so misspelling it must
//! never widen access. The refusal names the rule that matched.
//!
//! An entry may have a condition (`when:`). One that reads only the caller and the tool is
//! decided here, for ListTools and the chain alike. One that reads the call (`args`, `now`,
//! `run`) cannot be, before the arguments are validated and bound: the answer is then
//! provisional (the tool is listed, the call goes on) and the chain asks again after bind, with
//! the call ([`Provisional`]). A condition that cannot be evaluated decides closed
//! (`condition_error`): a deny entry denies, an allow entry does not allow.
//!
//! [`check`] (the chain) and [`explain`] (ExplainTool, `toolgate test`) walk the lists with the
//! same function, so an explanation names the rule that really decided.

use super::explain::{StageResult, StageTrail};
use crate::{
    catalog::{AccessList, AgentPolicy, Catalog, Pattern, ToolVersion, Verdict},
    conditions::Input,
    error::{Reason, Refusal, Stage},
    identity::Caller,
};

/// Whether access was decided only provisionally: an entry's condition reads the call, which
/// `input` did not have. The chain then checks again once it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Provisional(pub bool);

pub fn check(catalog: &Catalog, input: &Input<'_>) -> Result<Provisional, Refusal> {
    walk(catalog, input, |_, _| {}, &mut None)
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
    /// The entry's condition, when it has one.
    pub when: Option<String>,
}

impl Rule {
    fn of(pattern: &Pattern, effect: &'static str) -> Self {
        Rule {
            location: pattern.location.clone(),
            pattern: Some(pattern.text.clone()),
            effect,
            when: pattern.when.as_ref().map(|c| c.source().to_owned()),
        }
    }

    fn list(location: String) -> Self {
        Rule {
            location,
            pattern: None,
            effect: "allow",
            when: None,
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
pub fn explain(catalog: &Catalog, input: &Input<'_>) -> Explained {
    let mut allowed = Vec::new();
    let mut denied_by = None;
    let decided = walk(
        catalog,
        input,
        |_, hit| {
            if let Some(pattern) = hit {
                allowed.push(Rule::of(pattern, "allow"));
            }
        },
        &mut denied_by,
    );
    match decided {
        Ok(_) => Explained {
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
    input: &Input<'_>,
    mut passed: impl FnMut(&'c AccessList, Option<&'c Pattern>),
    denied_by: &mut Option<Rule>,
) -> Result<Provisional, Refusal> {
    let caller = input.caller();
    let Some(tenant) = catalog.tenants.get(&*caller.tenant) else {
        *denied_by = Some(Rule::list("tenants".to_owned()));
        return Err(Refusal::new(
            Stage::Access,
            Reason::TenantUnknown,
            format!("tenant {} is not in the catalog", caller.tenant),
        ));
    };
    let global = check_list(&catalog.policy, input, &mut passed, denied_by, || {
        "the global policy".to_owned()
    })?;
    let tenant = check_list(&tenant.access, input, &mut passed, denied_by, || {
        format!("tenant {}", caller.tenant)
    })?;
    let agent = match catalog.agents.for_agent(&caller.agent) {
        AgentPolicy::Unrestricted => Ok(Provisional(false)),
        AgentPolicy::Named(list) => check_list(list, input, &mut passed, denied_by, || {
            format!("agent {}", caller.agent)
        }),
        AgentPolicy::Default(list) => check_list(list, input, &mut passed, denied_by, || {
            format!(
                "the default agent policy (agents.\"*\", applied to agent {:?})",
                caller.agent
            )
        }),
        AgentPolicy::Unknown => {
            *denied_by = Some(Rule::list("agents".to_owned()));
            Err(Refusal::new(
                Stage::Access,
                Reason::DeniedByPolicy,
                format!(
                    "agent {:?} is not in the catalog and the catalog has no default agent policy (agents.\"*\")",
                    caller.agent
                ),
            ))
        }
    };
    let agent = agent?;
    Ok(Provisional(global.0 || tenant.0 || agent.0))
}

/// `owner` names the list in a refusal; it is built only then, as most calls are allowed.
fn check_list<'c>(
    list: &'c AccessList,
    input: &Input<'_>,
    passed: &mut impl FnMut(&'c AccessList, Option<&'c Pattern>),
    denied_by: &mut Option<Rule>,
    owner: impl FnOnce() -> String,
) -> Result<Provisional, Refusal> {
    let tool = input.tool().name;
    let decision = list.decide(tool, input);
    let (reason, message, rule) = match decision.verdict {
        Verdict::Allowed(hit) => {
            passed(list, hit);
            return Ok(Provisional(decision.provisional));
        }
        Verdict::Denied(pattern) => (
            Reason::DeniedByPolicy,
            match &pattern.when {
                None => format!(
                    "{tool} is denied by {}'s deny rule {:?}",
                    owner(),
                    pattern.text
                ),
                Some(when) => format!(
                    "{tool} is denied by {}'s deny rule {} ({:?} when {:?})",
                    owner(),
                    pattern.location,
                    pattern.text,
                    when.source()
                ),
            },
            Rule::of(pattern, "deny"),
        ),
        Verdict::DeniedOnError(pattern, error) => (
            Reason::ConditionError,
            format!(
                "{tool} is denied by {}'s deny rule {}: its condition {:?} could not be evaluated ({error}), so it applies",
                owner(),
                pattern.location,
                pattern.when.as_ref().map_or("", |c| c.source()),
            ),
            Rule::of(pattern, "deny"),
        ),
        Verdict::NotAllowed(None) => (
            Reason::DeniedByPolicy,
            format!("{tool} is not in {}'s allow list", owner()),
            Rule::list(format!("{}.allow", list.location)),
        ),
        Verdict::NotAllowed(Some((pattern, error))) => (
            Reason::ConditionError,
            format!(
                "{tool} is not allowed by {}'s allow list: the condition {:?} of its rule {} could not be evaluated ({error}), so it does not allow",
                owner(),
                pattern.when.as_ref().map_or("", |c| c.source()),
                pattern.location,
            ),
            Rule::of(pattern, "allow"),
        ),
    };
    *denied_by = Some(rule);
    Err(Refusal::new(Stage::Access, reason, message))
}

/// What a handoff allows, last of the lists: a sub-agent's call (made under a delegation) only of
/// tools every handoff of its chain allows (`handoff_not_allowed`); and a handoff tool's call
/// only while the chain it would extend stays within its depth (`handoff_too_deep`).
pub fn handoff(catalog: &Catalog, caller: &Caller, tool: &ToolVersion) -> Result<(), Refusal> {
    let delegation = caller.delegation.as_deref();
    // What an agent of the chain could not use, the agents it handed off to cannot either:
    // the lists of each apply, as to the person acting as that agent.
    for agent in delegation.map(|d| d.chain.as_slice()).unwrap_or_default() {
        let as_agent = Caller {
            agent: agent.as_str().into(),
            delegation: None,
            ..caller.clone()
        };
        if let Err(refusal) = check(catalog, &Input::listing(&as_agent, tool.facts())) {
            return Err(Refusal::new(
                Stage::Access,
                Reason::HandoffNotAllowed,
                format!(
                    "{} is not a tool agent {agent} of this chain may use ({}), so no agent it handed off to may",
                    tool.name, refusal.message
                ),
            ));
        }
    }
    if let Some(delegation) = delegation
        && let Some((i, _)) = delegation
            .tools
            .iter()
            .enumerate()
            .find(|(_, lists)| !lists_admit(lists, &tool.name))
    {
        return Err(Refusal::new(
            Stage::Access,
            Reason::HandoffNotAllowed,
            format!(
                "{} is not among the tools the handoff by {} allows this agent ({})",
                tool.name,
                delegation.chain.get(i).map_or("its parent", String::as_str),
                describe_lists(&delegation.tools[i])
            ),
        ));
    }
    if let Some(handoff) = &tool.handoff {
        let depth = delegation.map_or(0, |d| d.depth).saturating_add(1);
        let max = delegation.map_or(handoff.max_depth, |d| d.max_depth.min(handoff.max_depth));
        if depth > max {
            return Err(Refusal::new(
                Stage::Access,
                Reason::HandoffTooDeep,
                format!(
                    "{} would hand off at depth {depth}; the chain allows {max}",
                    tool.name
                ),
            ));
        }
    }
    Ok(())
}

fn lists_admit(lists: &crate::identity::delegation::ToolLists, tool: &str) -> bool {
    let matches = |pattern: &String| {
        globset::Glob::new(pattern).is_ok_and(|glob| glob.compile_matcher().is_match(tool))
    };
    (lists.allow.is_empty() || lists.allow.iter().any(matches)) && !lists.deny.iter().any(matches)
}

fn describe_lists(lists: &crate::identity::delegation::ToolLists) -> String {
    match lists.deny.is_empty() {
        true => format!("allow {:?}", lists.allow),
        false => format!("allow {:?}, deny {:?}", lists.allow, lists.deny),
    }
}

/// What access is explained on without the call: the caller and the tool.
pub(super) fn listing<'a>(caller: &'a Caller, tool: &'a ToolVersion) -> Input<'a> {
    Input::listing(caller, tool.facts())
}

/// Which rules let the tool through, for an explanation; `None` when access did not pass on the
/// caller and the tool alone.
pub(super) fn explain_passed(
    catalog: &Catalog,
    caller: &Caller,
    tool: &ToolVersion,
) -> Option<StageTrail> {
    let explained = explain(catalog, &listing(caller, tool));
    if explained.refusal.is_some() {
        return None;
    }
    let rules = explained.rules;
    let detail = if rules.is_empty() {
        format!(
            "no deny rule matches {} and no allow list applies",
            tool.name
        )
    } else {
        let listed: Vec<String> = rules
            .iter()
            .map(|r| format!("{} {:?}", r.location, r.pattern.as_deref().unwrap_or("")))
            .collect();
        format!(
            "no deny rule matches {}; allowed by {}",
            tool.name,
            listed.join(", ")
        )
    };
    let detail = match caller.delegation.as_deref() {
        Some(delegation) => format!(
            "{detail}; delegated: acting for {} through {} -> {} (depth {} of {}), within the handoffs' tools ({})",
            caller.subject,
            delegation.chain.join(" -> "),
            caller.agent,
            delegation.depth,
            delegation.max_depth,
            delegation
                .tools
                .iter()
                .map(describe_lists)
                .collect::<Vec<_>>()
                .join("; ")
        ),
        None => detail,
    };
    Some(StageTrail {
        rules,
        ..StageTrail::new(Stage::Access, StageResult::Passed, detail)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        allocations::allocations_in,
        config::Config,
        identity::{AuthMethod, Caller},
        settings::Env,
    };

    /// Stage 4 with conditional entries on the caller and the tool, as ListTools and the chain
    /// run it: the allowed path allocates nothing, however many entries it evaluates.
    #[test]
    fn conditions_on_the_caller_cost_no_allocation_per_call() {
        let mut yaml = String::from(
            "version: 1\nidentity: { dev_identity: true }\ntenants:\n  acme:\n    allow:\n      \
             - { tools: ['*'], when: \"'support' in caller.scopes || tool.risk_level == 'READ_ONLY'\" }\n    deny:\n",
        );
        for i in 0..100 {
            yaml.push_str(&format!(
                "      - {{ tools: [send_email], when: \"caller.agent == 'bot-{i}'\" }}\n"
            ));
        }
        yaml.push_str(
            "tools:\n  - { name: send_email, description: d, risk_level: read_only, \
             executor: { builtin: echo }, input_schema: { type: object } }\n",
        );
        let config =
            Config::from_yaml(&yaml, "t", std::path::Path::new("."), &Env::default()).unwrap();
        let caller = Caller {
            tenant: "acme".into(),
            subject: "alice".to_owned(),
            agent: "support-bot".into(),
            scopes: Default::default(),
            method: AuthMethod::Dev,
            claims: Default::default(),
            token: None,
            delegation: None,
        };
        let tool = config.catalog.resolve("send_email", None, "acme").unwrap();
        let input = Input::listing(&caller, tool.facts());
        assert_eq!(
            allocations_in(|| assert_eq!(check(&config.catalog, &input), Ok(Provisional(false)))),
            0
        );
        // A refusal is counted: it builds its message.
        let bot = Caller {
            agent: "bot-99".into(),
            ..caller.clone()
        };
        let input = Input::listing(&bot, tool.facts());
        assert!(allocations_in(|| assert!(check(&config.catalog, &input).is_err())) > 0);
    }
}
