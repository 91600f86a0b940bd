//! What the Controls service asks of the boundary: set, clear and list emergency denies
//! (`crate::emergency`), each needing the scope `toolgate:admin`. A tenant's admin acts on its
//! own tenant's denies only; the platform's operators — admins of a tenant the catalog names in
//! `identity.platform_tenants`, or dev identity, served only on loopback — on every tenant's and
//! on denies for every tenant. Every set, clear and expiry is an audit event (`emergency_deny`),
//! its slot taken before the change is made, so a change made always has its event.

use std::sync::Arc;

use super::Boundary;
use crate::{
    audit::{AuditEvent, EventKind, EventTime, Party},
    emergency::{ADMIN_SCOPE, Authority, DenyError, EmergencyDenies, EmergencyDeny, NewDeny},
    identity::{AuthMethod, Caller},
};

impl Boundary {
    /// Sets an emergency deny, in force on this sidecar when this returns.
    pub async fn set_emergency_deny(
        &self,
        operator: &Arc<Caller>,
        new: NewDeny,
    ) -> Result<EmergencyDeny, DenyError> {
        let authority = self.authorize(operator)?;
        let slot = self.audit_slot().await?;
        let deny = self.emergency.set(new, operator, &authority).await?;
        tracing::warn!(deny = %deny.id, tools = %deny.tools, tenant = ?deny.tenant, agent = ?deny.agent, reason = %deny.reason, set_by = %deny.set_by, "emergency deny set");
        slot.send(self.deny_event(&deny, "SET", Some(operator)));
        Ok(deny)
    }

    /// Lifts an emergency deny; the deny as it was.
    pub async fn clear_emergency_deny(
        &self,
        operator: &Arc<Caller>,
        id: &str,
    ) -> Result<EmergencyDeny, DenyError> {
        let authority = self.authorize(operator)?;
        let slot = self.audit_slot().await?;
        let deny = self.emergency.clear(id, &authority).await?;
        tracing::warn!(deny = %deny.id, tools = %deny.tools, tenant = ?deny.tenant, cleared_by = %format!("{}/{}", operator.tenant, operator.subject), "emergency deny cleared");
        slot.send(self.deny_event(&deny, "CLEARED", Some(operator)));
        Ok(deny)
    }

    /// The emergency denies in force that `operator` may see: a tenant's admin those on its
    /// tenant, the platform's operators all.
    pub fn list_emergency_denies(
        &self,
        operator: &Caller,
    ) -> Result<Vec<EmergencyDeny>, DenyError> {
        let authority = self.authorize(operator)?;
        Ok(self.emergency.list_for(&authority))
    }

    /// Whose denies `operator` may act on: none without the scope `toolgate:admin`; every
    /// tenant's for the platform's operators (a tenant the catalog names in
    /// `identity.platform_tenants`, or dev identity, which trusts whatever tenant a loopback
    /// caller claims anyway); its own tenant's otherwise.
    fn authorize(&self, operator: &Caller) -> Result<Authority, DenyError> {
        if operator.method == AuthMethod::Dev {
            return Ok(Authority::Platform);
        }
        // A sub-agent acting under a delegation acts only through tool calls.
        if !operator.has_scope(ADMIN_SCOPE) || operator.delegation.is_some() {
            return Err(DenyError::MissingScope);
        }
        let state = self.state.load();
        Ok(match state.catalog.is_platform_tenant(&operator.tenant) {
            true => Authority::Platform,
            false => Authority::Tenant(operator.tenant.clone()),
        })
    }

    /// Whether denies set here hold on every sidecar sharing the state (Redis), not this one only.
    pub fn emergency_denies_are_shared(&self) -> bool {
        self.emergency.is_shared()
    }

    /// Takes out the denies that expired and records each (with Redis, on one sidecar).
    pub async fn expire_emergency_denies(&self) {
        for deny in self.emergency.expire().await {
            tracing::warn!(deny = %deny.id, tools = %deny.tools, "emergency deny expired");
            self.audit
                .record(self.deny_event(&deny, "EXPIRED", None))
                .await;
        }
    }

    /// The denies in force changed: what callers see may have changed (the MCP door announces
    /// it), and the gauge is set.
    pub fn emergency_denies_changed(&self) {
        self.metrics.emergency_denies(self.emergency.list().len());
        self.catalog_changes
            .send_modify(|generation| *generation += 1);
    }

    /// The denies in force, for whoever follows the shared ones and announces changes.
    pub fn emergency_denies(&self) -> &Arc<EmergencyDenies> {
        &self.emergency
    }

    async fn audit_slot(&self) -> Result<crate::audit::Reservation, DenyError> {
        match self.audit.fail_closed() {
            true => self.audit.try_reserve(),
            false => self.audit.reserve().await,
        }
        .ok_or(DenyError::AuditUnavailable)
    }

    /// `operator`: who set or cleared it; none for an expiry.
    fn deny_event(
        &self,
        deny: &EmergencyDeny,
        status: &'static str,
        operator: Option<&Arc<Caller>>,
    ) -> Box<AuditEvent> {
        Box::new(AuditEvent {
            time: EventTime(self.clock.unix_ms()),
            kind: Some(EventKind::EmergencyDeny),
            party: operator.map_or_else(Party::default, |o| Party::Caller(o.clone())),
            tool: deny.tools.as_str().into(),
            status,
            reason: Some(deny.reason.clone()),
            emergency_deny: Some(Box::new(deny.clone())),
            ..AuditEvent::default()
        })
    }
}
