//! Stage 8: the call's quotas — its tool's for the tenant, and the tenant's own — decided
//! together: a call refused by either consumes neither. The arithmetic and the stores (memory,
//! Redis) are `crate::limits`; this is the decision the chain takes.

use super::CatalogState;
use crate::{catalog::ToolVersion, error::Refusal, identity::Caller};

/// Takes one call of each quota that applies, or refuses `RATE_LIMITED` taking none.
pub(super) async fn check(
    state: &CatalogState,
    caller: &Caller,
    tool: &ToolVersion,
) -> Result<(), Refusal> {
    let tenant_rate = state
        .catalog
        .tenants
        .get(&*caller.tenant)
        .and_then(|t| t.rate_limit);
    state
        .rate_limits
        .check(&caller.tenant, tool, tenant_rate)
        .await
}
