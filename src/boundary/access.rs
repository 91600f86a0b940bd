//! Stage 4: allow/deny lists — global, then the tenant's, then the agent's. Deny wins at every
//! level, a set allow list admits only what it matches, and a tenant not in the catalog gets
//! nothing. Once agents are configured, an agent the catalog does not list (or a caller naming
//! none) gets the `"*"` entry, or nothing: the agent is the caller's claim, so misspelling it must
//! never widen access. The refusal names the rule that matched.

use crate::{
    catalog::{AccessDenial, AccessList, AgentPolicy, Catalog},
    error::{Reason, Refusal, Stage},
    identity::Caller,
};

pub fn check(catalog: &Catalog, caller: &Caller, tool: &str) -> Result<(), Refusal> {
    let Some(tenant) = catalog.tenants.get(&caller.tenant) else {
        return Err(Refusal::new(
            Stage::Access,
            Reason::TenantUnknown,
            format!("tenant {} is not in the catalog", caller.tenant),
        ));
    };
    check_list(&catalog.policy, tool, || "the global policy".to_owned())?;
    check_list(&tenant.access, tool, || format!("tenant {}", caller.tenant))?;
    match catalog.agents.for_agent(&caller.agent) {
        AgentPolicy::Unrestricted => Ok(()),
        AgentPolicy::Named(list) => check_list(list, tool, || format!("agent {}", caller.agent)),
        AgentPolicy::Default(list) => check_list(list, tool, || {
            format!(
                "the default agent policy (agents.\"*\", applied to agent {:?})",
                caller.agent
            )
        }),
        AgentPolicy::Unknown => Err(Refusal::new(
            Stage::Access,
            Reason::DeniedByPolicy,
            format!(
                "agent {:?} is not in the catalog and the catalog has no default agent policy (agents.\"*\")",
                caller.agent
            ),
        )),
    }
}

/// `owner` names the list in a refusal; it is built only then, as most calls are allowed.
fn check_list(
    list: &AccessList,
    tool: &str,
    owner: impl FnOnce() -> String,
) -> Result<(), Refusal> {
    list.check(tool).map_err(|denial| {
        let owner = owner();
        let message = match denial {
            AccessDenial::Denied(pattern) => {
                format!("{tool} is denied by {owner}'s deny rule {pattern:?}")
            }
            AccessDenial::NotAllowed => format!("{tool} is not in {owner}'s allow list"),
        };
        Refusal::new(Stage::Access, Reason::DeniedByPolicy, message)
    })
}
