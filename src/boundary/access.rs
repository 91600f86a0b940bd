//! Stage 4: allow/deny lists — global, then the tenant's, then the agent's. Deny wins at every
//! level, a set allow list admits only what it matches, and a tenant not in the catalog gets
//! nothing. The refusal names the rule that matched.

use crate::{
    catalog::{AccessDenial, AccessList, Catalog},
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
    if let Some(agent) = catalog.agents.get(&caller.agent) {
        check_list(agent, tool, || format!("agent {}", caller.agent))?;
    }
    Ok(())
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
