//! Pending approvals for risky calls (stage 9 and the Approvals service). An approval binds the
//! requesting tenant, subject, agent and run, the tool and version, and the SHA-256 of the
//! canonical arguments; it expires, and it can be redeemed once. Time comes from the injected
//! clock. Memory is bounded per tenant.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use crate::{
    catalog::{Catalog, RiskLevel},
    clock::SharedClock,
    error::Reason,
    identity::Caller,
};

/// The scope an approver needs.
pub const APPROVE_SCOPE: &str = "toolgate:approve";

/// Where an approval is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    Pending,
    Approved,
    Rejected,
    Used,
    Expired,
    Invalidated,
}

/// What a call that needs approval is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub tenant: String,
    pub subject: String,
    pub agent: String,
    pub run_id: String,
    pub tool: String,
    pub tool_version: String,
    pub arguments_sha256: String,
}

/// One approval.
#[derive(Debug, Clone)]
pub struct Approval {
    pub id: String,
    pub binding: Binding,
    /// Canonical JSON of the arguments, for the approver to read.
    pub arguments_json: String,
    pub risk_level: RiskLevel,
    /// The tool definition it was requested against; a reload that changes it invalidates it.
    pub definition_hash: String,
    pub state: ApprovalState,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    pub decided_by: String,
    pub reason: String,
}

impl Approval {
    fn finished(&self) -> bool {
        !matches!(self.state, ApprovalState::Pending | ApprovalState::Approved)
    }
}

/// Why the Approvals service refused a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    #[error("approving needs the scope {APPROVE_SCOPE:?}")]
    MissingScope,
    #[error("no approval {0} in your tenant")]
    NotFound(String),
    #[error("an approver cannot approve their own request")]
    SelfApproval,
    #[error("approval {id} is {state:?}, not pending")]
    NotPending { id: String, state: ApprovalState },
    #[error("a decision must be approve or reject")]
    NoDecision,
    #[error("invalid page_token: pass the next_page_token of the previous page")]
    InvalidPageToken,
}

/// Where a page of approvals ends: the last one's creation time and id (the listing order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub created_at_ms: i64,
    pub id: String,
}

impl Cursor {
    /// The opaque page token clients pass back.
    pub fn token(&self) -> String {
        format!("{}.{}", self.created_at_ms, self.id)
    }

    /// Reads a page token; `None` when it is not one this server handed out.
    pub fn parse(token: &str) -> Option<Cursor> {
        let (time, id) = token.split_once('.')?;
        let valid_id = id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        Some(Cursor {
            created_at_ms: time.parse().ok()?,
            id: id.to_owned(),
        })
        .filter(|_| valid_id)
    }
}

/// One page of a listing.
#[derive(Debug, Clone)]
pub struct Page {
    pub approvals: Vec<Approval>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<Cursor>,
}

/// Why a redemption failed: a reason from the outcome table and a message.
pub type RedeemError = (Reason, String);

/// All approvals of one server.
#[derive(Debug)]
pub struct ApprovalStore {
    clock: SharedClock,
    ttl: Duration,
    max_per_tenant: usize,
    approvals: Mutex<HashMap<String, Approval>>,
}

impl ApprovalStore {
    pub fn new(clock: SharedClock, ttl: Duration, max_per_tenant: usize) -> Self {
        ApprovalStore {
            clock,
            ttl,
            max_per_tenant,
            approvals: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Approval>> {
        // A panic while holding the lock cannot leave a half-written approval: every update is
        // one assignment. Keep serving.
        self.approvals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Marks expired approvals as such; done under the lock by every operation.
    fn expire(&self, approvals: &mut HashMap<String, Approval>) {
        let now = self.clock.unix_ms();
        for approval in approvals.values_mut() {
            if matches!(
                approval.state,
                ApprovalState::Pending | ApprovalState::Approved
            ) && now >= approval.expires_at_ms
            {
                approval.state = ApprovalState::Expired;
            }
        }
    }

    /// Creates a pending approval, forgetting the tenant's oldest finished ones when over the cap.
    pub fn create(
        &self,
        binding: Binding,
        arguments_json: String,
        risk_level: RiskLevel,
        definition_hash: String,
    ) -> Result<Approval, RedeemError> {
        let now = self.clock.unix_ms();
        let mut approvals = self.lock();
        self.expire(&mut approvals);
        let mut own: Vec<(i64, String, bool)> = approvals
            .values()
            .filter(|a| a.binding.tenant == binding.tenant)
            .map(|a| (a.created_at_ms, a.id.clone(), a.finished()))
            .collect();
        if own.len() >= self.max_per_tenant {
            own.sort();
            let excess = own.len() + 1 - self.max_per_tenant;
            let removable: Vec<String> = own
                .iter()
                .filter(|(_, _, done)| *done)
                .take(excess)
                .map(|(_, id, _)| id.clone())
                .collect();
            if removable.len() < excess {
                return Err((
                    Reason::Overloaded,
                    format!(
                        "tenant {} has too many open approvals; decide some first",
                        binding.tenant
                    ),
                ));
            }
            for id in removable {
                approvals.remove(&id);
            }
        }
        let approval = Approval {
            id: format!("apr_{}", uuid::Uuid::new_v4().simple()),
            binding,
            arguments_json,
            risk_level,
            definition_hash,
            state: ApprovalState::Pending,
            created_at_ms: now,
            expires_at_ms: now
                .saturating_add(i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)),
            decided_by: String::new(),
            reason: String::new(),
        };
        approvals.insert(approval.id.clone(), approval.clone());
        Ok(approval)
    }

    /// Redeems an approved approval for exactly this call; single use.
    pub fn redeem(&self, id: &str, call: &Binding) -> Result<Approval, RedeemError> {
        let mut approvals = self.lock();
        self.expire(&mut approvals);
        let approval = approvals
            .get_mut(id)
            .filter(|a| a.binding.tenant == call.tenant)
            .ok_or_else(|| {
                (
                    Reason::ApprovalNotFound,
                    format!("no approval {id} for this tenant"),
                )
            })?;
        let bound = &approval.binding;
        if bound.subject != call.subject || bound.agent != call.agent || bound.run_id != call.run_id
        {
            return Err((
                Reason::ApprovalWrongCaller,
                format!("approval {id} was requested by another caller or run"),
            ));
        }
        match approval.state {
            ApprovalState::Approved => {}
            ApprovalState::Pending => {
                return Err((
                    Reason::ApprovalPending,
                    format!("approval {id} is still pending"),
                ));
            }
            ApprovalState::Rejected => {
                return Err((
                    Reason::ApprovalRejected,
                    format!("approval {id} was rejected: {}", approval.reason),
                ));
            }
            ApprovalState::Used => {
                return Err((
                    Reason::ApprovalAlreadyUsed,
                    format!("approval {id} was already used"),
                ));
            }
            ApprovalState::Expired => {
                return Err((
                    Reason::ApprovalExpired,
                    format!("approval {id} has expired"),
                ));
            }
            ApprovalState::Invalidated => {
                return Err((
                    Reason::ApprovalInvalidated,
                    format!("approval {id} is invalid: {}", approval.reason),
                ));
            }
        }
        if bound.tool != call.tool || bound.tool_version != call.tool_version {
            return Err((
                Reason::ApprovalArgumentsChanged,
                format!(
                    "approval {id} is for {} version {}",
                    bound.tool, bound.tool_version
                ),
            ));
        }
        if bound.arguments_sha256 != call.arguments_sha256 {
            return Err((
                Reason::ApprovalArgumentsChanged,
                format!("the arguments differ from the ones approval {id} was granted for"),
            ));
        }
        approval.state = ApprovalState::Used;
        Ok(approval.clone())
    }

    /// One page of the caller's tenant's approvals in `state` (pending when `None`), oldest first,
    /// after `after` (a cursor from [`Page::next`]); at most `page_size`.
    pub fn list(
        &self,
        approver: &Caller,
        state: Option<ApprovalState>,
        page_size: usize,
        after: Option<&Cursor>,
    ) -> Result<Page, DecideError> {
        if !approver.has_scope(APPROVE_SCOPE) {
            return Err(DecideError::MissingScope);
        }
        let mut approvals = self.lock();
        self.expire(&mut approvals);
        let want = state.unwrap_or(ApprovalState::Pending);
        let mut listed: Vec<&Approval> = approvals
            .values()
            .filter(|a| a.binding.tenant == approver.tenant && a.state == want)
            .filter(|a| {
                after.is_none_or(|c| {
                    (a.created_at_ms, a.id.as_str()) > (c.created_at_ms, c.id.as_str())
                })
            })
            .collect();
        listed.sort_by(|a, b| a.created_at_ms.cmp(&b.created_at_ms).then(a.id.cmp(&b.id)));
        let more = listed.len() > page_size;
        let approvals: Vec<Approval> = listed.into_iter().take(page_size).cloned().collect();
        let next = more.then(|| approvals.last()).flatten().map(|last| Cursor {
            created_at_ms: last.created_at_ms,
            id: last.id.clone(),
        });
        Ok(Page { approvals, next })
    }

    /// One approval of the caller's tenant.
    pub fn get(&self, approver: &Caller, id: &str) -> Result<Approval, DecideError> {
        if !approver.has_scope(APPROVE_SCOPE) {
            return Err(DecideError::MissingScope);
        }
        let mut approvals = self.lock();
        self.expire(&mut approvals);
        approvals
            .get(id)
            .filter(|a| a.binding.tenant == approver.tenant)
            .cloned()
            .ok_or_else(|| DecideError::NotFound(id.to_owned()))
    }

    /// Approves or rejects a pending approval of the approver's own tenant.
    pub fn decide(
        &self,
        approver: &Caller,
        id: &str,
        approve: bool,
        reason: &str,
    ) -> Result<Approval, DecideError> {
        if !approver.has_scope(APPROVE_SCOPE) {
            return Err(DecideError::MissingScope);
        }
        let mut approvals = self.lock();
        self.expire(&mut approvals);
        let approval = approvals
            .get_mut(id)
            .filter(|a| a.binding.tenant == approver.tenant)
            .ok_or_else(|| DecideError::NotFound(id.to_owned()))?;
        if approval.binding.subject == approver.subject {
            return Err(DecideError::SelfApproval);
        }
        if approval.state != ApprovalState::Pending {
            return Err(DecideError::NotPending {
                id: id.to_owned(),
                state: approval.state,
            });
        }
        approval.state = if approve {
            ApprovalState::Approved
        } else {
            ApprovalState::Rejected
        };
        approval.decided_by = approver.subject.clone();
        approval.reason = reason.to_owned();
        Ok(approval.clone())
    }

    /// After a catalog reload: open approvals whose tool definition changed can no longer be used.
    pub fn invalidate_changed(&self, catalog: &Catalog) -> usize {
        let mut approvals = self.lock();
        let mut invalidated = 0;
        for approval in approvals.values_mut() {
            if approval.finished() {
                continue;
            }
            let still_same = catalog.versions().any(|v| {
                v.name == approval.binding.tool
                    && v.version == approval.binding.tool_version
                    && v.definition_hash == approval.definition_hash
            });
            if !still_same {
                approval.state = ApprovalState::Invalidated;
                approval.reason = format!(
                    "tool {} version {} changed or was removed after the approval was requested",
                    approval.binding.tool, approval.binding.tool_version
                );
                invalidated += 1;
            }
        }
        invalidated
    }

    /// Approvals waiting for a decision, across tenants (for metrics).
    pub fn pending(&self) -> usize {
        let mut approvals = self.lock();
        self.expire(&mut approvals);
        approvals
            .values()
            .filter(|a| a.state == ApprovalState::Pending)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{clock::ManualClock, identity::AuthMethod};

    fn caller(tenant: &str, subject: &str, scopes: &[&str]) -> Caller {
        Caller {
            tenant: tenant.into(),
            subject: subject.into(),
            agent: "bot".into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            method: AuthMethod::Dev,
        }
    }

    fn binding(args: &str) -> Binding {
        Binding {
            tenant: "acme".into(),
            subject: "alice".into(),
            agent: "bot".into(),
            run_id: "run-1".into(),
            tool: "refund_order".into(),
            tool_version: "1".into(),
            arguments_sha256: args.into(),
        }
    }

    fn store(clock: &ManualClock) -> ApprovalStore {
        ApprovalStore::new(SharedClock::new(clock.clone()), Duration::from_secs(300), 3)
    }

    #[test]
    fn approved_once_then_used() {
        let clock = ManualClock::new(1_000_000);
        let store = store(&clock);
        let a = store
            .create(
                binding("h1"),
                "{}".into(),
                RiskLevel::WriteConfirmed,
                "d".into(),
            )
            .unwrap();
        assert_eq!(
            store.redeem(&a.id, &binding("h1")).unwrap_err().0,
            Reason::ApprovalPending
        );
        let bob = caller("acme", "bob", &[APPROVE_SCOPE]);
        store.decide(&bob, &a.id, true, "ok").unwrap();
        assert_eq!(
            store.redeem(&a.id, &binding("h2")).unwrap_err().0,
            Reason::ApprovalArgumentsChanged
        );
        assert_eq!(
            store.redeem(&a.id, &binding("h1")).unwrap().state,
            ApprovalState::Used
        );
        assert_eq!(
            store.redeem(&a.id, &binding("h1")).unwrap_err().0,
            Reason::ApprovalAlreadyUsed
        );
    }

    #[test]
    fn expiry_follows_the_clock() {
        let clock = ManualClock::new(0);
        let store = store(&clock);
        let a = store
            .create(
                binding("h"),
                "{}".into(),
                RiskLevel::Destructive,
                "d".into(),
            )
            .unwrap();
        store
            .decide(&caller("acme", "bob", &[APPROVE_SCOPE]), &a.id, true, "")
            .unwrap();
        clock.advance(Duration::from_secs(301));
        assert_eq!(
            store.redeem(&a.id, &binding("h")).unwrap_err().0,
            Reason::ApprovalExpired
        );
    }

    #[test]
    fn approvers_need_scope_own_tenant_and_another_subject() {
        let clock = ManualClock::new(0);
        let store = store(&clock);
        let a = store
            .create(
                binding("h"),
                "{}".into(),
                RiskLevel::Destructive,
                "d".into(),
            )
            .unwrap();
        assert!(matches!(
            store.decide(&caller("acme", "bob", &[]), &a.id, true, ""),
            Err(DecideError::MissingScope)
        ));
        assert!(matches!(
            store.decide(&caller("globex", "eve", &[APPROVE_SCOPE]), &a.id, true, ""),
            Err(DecideError::NotFound(_))
        ));
        assert!(matches!(
            store.decide(&caller("acme", "alice", &[APPROVE_SCOPE]), &a.id, true, ""),
            Err(DecideError::SelfApproval)
        ));
        assert!(
            store
                .list(&caller("globex", "eve", &[APPROVE_SCOPE]), None, 10, None)
                .unwrap()
                .approvals
                .is_empty()
        );
        assert_eq!(
            store
                .list(&caller("acme", "bob", &[APPROVE_SCOPE]), None, 10, None)
                .unwrap()
                .approvals
                .len(),
            1
        );
    }

    #[test]
    fn open_approvals_per_tenant_are_capped() {
        let clock = ManualClock::new(0);
        let store = store(&clock);
        for _ in 0..3 {
            store
                .create(
                    binding("h"),
                    "{}".into(),
                    RiskLevel::Destructive,
                    "d".into(),
                )
                .unwrap();
        }
        let err = store
            .create(
                binding("h"),
                "{}".into(),
                RiskLevel::Destructive,
                "d".into(),
            )
            .unwrap_err();
        assert_eq!(err.0, Reason::Overloaded);
        clock.advance(Duration::from_secs(301));
        // Expired ones are finished and make room.
        assert!(
            store
                .create(
                    binding("h"),
                    "{}".into(),
                    RiskLevel::Destructive,
                    "d".into()
                )
                .is_ok()
        );
    }
}
