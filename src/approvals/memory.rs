//! Approvals in this sidecar's memory: lost on restart, not shared. The rules are those of
//! [`Approvals`](super::Approvals): the same binding check, expiry, single use and budgets (per
//! tenant and in total, in count and bytes), with time from the injected clock.

use std::{collections::HashMap, sync::Mutex};

use super::*;

/// All approvals of one server, in its memory.
#[derive(Debug)]
pub struct ApprovalStore {
    clock: SharedClock,
    budget: Budget,
    approvals: Mutex<HashMap<String, Approval>>,
}

impl ApprovalStore {
    pub fn new(clock: SharedClock, budget: Budget) -> Self {
        ApprovalStore {
            clock,
            budget,
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

    /// Creates a pending approval. Over the tenant's count or byte budget, the tenant's oldest
    /// finished approvals are forgotten; over the total byte budget, finished ones of the tenant
    /// holding the most bytes. Open approvals are never dropped: when only they remain, the new
    /// one is refused (`overloaded`, retryable once approvers decide or approvals expire).
    pub fn create(
        &self,
        binding: Binding,
        arguments_json: String,
        risk_level: RiskLevel,
        needed_because: String,
    ) -> Result<Approval, RedeemError> {
        let now = self.clock.unix_ms();
        let approval = Approval {
            id: format!("apr_{}", uuid::Uuid::new_v4().simple()),
            binding,
            arguments_json,
            risk_level,
            state: ApprovalState::Pending,
            created_at_ms: now,
            expires_at_ms: now
                .saturating_add(i64::try_from(self.budget.ttl.as_millis()).unwrap_or(i64::MAX)),
            decided_by: String::new(),
            decided_at_ms: 0,
            reason: String::new(),
            needed_because: super::bounded_reason(needed_because),
        };
        let size = approval.bytes();
        let tenant = approval.binding.tenant.clone();
        let full = |why: &str| {
            (
                Reason::Overloaded,
                format!("tenant {tenant} has too many open approvals ({why}); decide some first"),
            )
        };
        if size > self.budget.max_bytes_per_tenant || size > self.budget.max_bytes {
            return Err((
                Reason::Overloaded,
                format!(
                    "the call's arguments are too large to hold for an approval ({size} bytes)"
                ),
            ));
        }
        let mut approvals = self.lock();
        self.expire(&mut approvals);
        loop {
            let (count, bytes) = usage(&approvals, &tenant);
            if count < self.budget.max_per_tenant
                && bytes + size <= self.budget.max_bytes_per_tenant
            {
                break;
            }
            let victim = oldest_finished(&approvals, &tenant)
                .ok_or_else(|| full("its budget is used by open ones"))?;
            approvals.remove(&victim);
        }
        while approvals.values().map(Approval::bytes).sum::<usize>() + size > self.budget.max_bytes
        {
            let largest = largest_with_finished(&approvals)
                .ok_or_else(|| full("the sidecar's approval budget is used by open ones"))?;
            let victim = oldest_finished(&approvals, &largest)
                .ok_or_else(|| full("no finished approval to forget"))?;
            approvals.remove(&victim);
        }
        approvals.insert(approval.id.clone(), approval.clone());
        Ok(approval)
    }

    /// Checks that this call may use approval `id`: same caller, run, tool, version, definition
    /// and arguments, approved and unexpired. Nothing changes; [`Self::consume`] uses it up.
    /// An approval already used passes as `already_used`, for an idempotent replay only.
    pub fn check(&self, id: &str, call: &Binding) -> Result<Checked, RedeemError> {
        let mut approvals = self.lock();
        self.expire(&mut approvals);
        check_binding(
            approvals
                .get(id)
                .filter(|a| a.binding.tenant == call.tenant),
            id,
            call,
        )
    }

    /// Uses the approval up, as its call is handed to the backend: exactly one call gets past
    /// this for each approval, however many passed [`Self::check`] at once.
    pub fn consume(&self, id: &str) -> Result<(), RedeemError> {
        let mut approvals = self.lock();
        self.expire(&mut approvals);
        let approval = approvals.get_mut(id).ok_or_else(|| not_found(id))?;
        match approval.state {
            ApprovalState::Approved => {
                approval.state = ApprovalState::Used;
                Ok(())
            }
            other => Err(state_error(id, other, &approval.reason)),
        }
    }

    /// Gives a consumed approval back: its call never reached the backend.
    pub fn release(&self, id: &str) {
        let mut approvals = self.lock();
        if let Some(approval) = approvals.get_mut(id)
            && approval.state == ApprovalState::Used
        {
            approval.state = ApprovalState::Approved;
        }
        self.expire(&mut approvals);
    }

    /// Bytes held, as the budgets count them.
    pub fn bytes(&self) -> usize {
        self.lock().values().map(Approval::bytes).sum()
    }

    /// One page of the caller's tenant's approvals in `state` (pending when `None`), oldest first,
    /// after `after` (a cursor from [`Page::next`]); at most `page_size`.
    pub fn list(
        &self,
        approver: &Caller,
        state: Option<ApprovalState>,
        order: Order,
        page_size: usize,
        after: Option<&Cursor>,
    ) -> Result<Page, DecideError> {
        let mut approvals = self.lock();
        self.expire(&mut approvals);
        let want = state.unwrap_or(ApprovalState::Pending);
        let beyond = |a: &Approval, c: &Cursor| {
            let (at, cursor) = (
                (a.created_at_ms, a.id.as_str()),
                (c.created_at_ms, c.id.as_str()),
            );
            match order {
                Order::OldestFirst => at > cursor,
                Order::NewestFirst => at < cursor,
            }
        };
        let mut listed: Vec<&Approval> = approvals
            .values()
            .filter(|a| *a.binding.tenant == *approver.tenant && a.state == want)
            .filter(|a| after.is_none_or(|c| beyond(a, c)))
            .collect();
        listed.sort_by(|a, b| a.created_at_ms.cmp(&b.created_at_ms).then(a.id.cmp(&b.id)));
        if order == Order::NewestFirst {
            listed.reverse();
        }
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
        let mut approvals = self.lock();
        self.expire(&mut approvals);
        approvals
            .get(id)
            .filter(|a| *a.binding.tenant == *approver.tenant)
            .cloned()
            .ok_or_else(|| DecideError::NotFound(id.to_owned()))
    }

    /// Approves or rejects a pending approval of the approver's own tenant. A decision that
    /// outgrows what its approval held for it (an approver's name over 256 bytes) makes room
    /// as a new approval would, from the tenant's oldest finished ones.
    pub fn decide(
        &self,
        approver: &Caller,
        id: &str,
        approve: bool,
        reason: &str,
    ) -> Result<Approval, DecideError> {
        check_reason(reason)?;
        let mut approvals = self.lock();
        self.expire(&mut approvals);
        let approval = approvals
            .get_mut(id)
            .filter(|a| *a.binding.tenant == *approver.tenant)
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
        approval.decided_at_ms = self.clock.unix_ms();
        approval.reason = reason.to_owned();
        let decided = approval.clone();
        let tenant = &decided.binding.tenant;
        while usage(&approvals, tenant).1 > self.budget.max_bytes_per_tenant
            || approvals.values().map(Approval::bytes).sum::<usize>() > self.budget.max_bytes
        {
            let Some(victim) = oldest_finished_but(&approvals, tenant, id) else {
                break;
            };
            approvals.remove(&victim);
        }
        Ok(decided)
    }

    /// After a catalog reload: open approvals whose tool definition changed can no longer be used.
    pub fn invalidate_changed(&self, served: &Served) -> usize {
        let mut approvals = self.lock();
        let mut invalidated = 0;
        for approval in approvals.values_mut() {
            if approval.finished() {
                continue;
            }
            let binding = &approval.binding;
            let still_same = served.serves(
                &binding.tool,
                &binding.tool_version,
                &binding.definition_hash,
            );
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

/// A tenant's approvals: how many, and their bytes.
fn usage(approvals: &HashMap<String, Approval>, tenant: &str) -> (usize, usize) {
    approvals
        .values()
        .filter(|a| a.binding.tenant == tenant)
        .fold((0, 0), |(n, bytes), a| (n + 1, bytes + a.bytes()))
}

/// The id of a tenant's oldest finished approval.
fn oldest_finished(approvals: &HashMap<String, Approval>, tenant: &str) -> Option<String> {
    oldest_finished_but(approvals, tenant, "")
}

/// The id of a tenant's oldest finished approval other than `keep`.
fn oldest_finished_but(
    approvals: &HashMap<String, Approval>,
    tenant: &str,
    keep: &str,
) -> Option<String> {
    approvals
        .values()
        .filter(|a| a.binding.tenant == tenant && a.finished() && a.id != keep)
        .min_by(|a, b| a.created_at_ms.cmp(&b.created_at_ms).then(a.id.cmp(&b.id)))
        .map(|a| a.id.clone())
}

/// The tenant holding the most bytes among those with a finished approval to forget.
fn largest_with_finished(approvals: &HashMap<String, Approval>) -> Option<String> {
    let mut bytes: HashMap<&str, usize> = HashMap::new();
    for a in approvals.values() {
        *bytes.entry(&a.binding.tenant).or_default() += a.bytes();
    }
    approvals
        .values()
        .filter(|a| a.finished())
        .map(|a| a.binding.tenant.as_str())
        .max_by_key(|t| bytes.get(t).copied().unwrap_or(0))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{clock::ManualClock, identity::AuthMethod};
    use std::time::Duration;

    fn caller(tenant: &str, subject: &str, scopes: &[&str]) -> Caller {
        Caller {
            tenant: tenant.into(),
            subject: subject.into(),
            agent: "bot".into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            method: AuthMethod::Dev,
            claims: Default::default(),
            token: None,
            delegation: None,
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
            definition_hash: "d".into(),
            arguments_sha256: args.into(),
        }
    }

    fn store(clock: &ManualClock) -> ApprovalStore {
        ApprovalStore::new(
            SharedClock::new(clock.clone()),
            Budget {
                ttl: Duration::from_secs(300),
                max_per_tenant: 3,
                max_bytes_per_tenant: 1 << 20,
                max_bytes: 1 << 20,
            },
        )
    }

    fn create(store: &ApprovalStore, args: &str) -> Approval {
        store
            .create(
                binding(args),
                "{}".into(),
                RiskLevel::WriteConfirmed,
                String::new(),
            )
            .unwrap()
    }

    #[test]
    fn checked_until_consumed_once_and_released_when_the_backend_was_not_reached() {
        let clock = ManualClock::new(1_000_000);
        let store = store(&clock);
        let a = create(&store, "h1");
        assert_eq!(
            store.check(&a.id, &binding("h1")).unwrap_err().0,
            Reason::ApprovalPending
        );
        let bob = caller("acme", "bob", &[APPROVE_SCOPE]);
        store.decide(&bob, &a.id, true, "ok").unwrap();
        assert_eq!(
            store.check(&a.id, &binding("h2")).unwrap_err().0,
            Reason::ApprovalArgumentsChanged
        );
        let other_definition = Binding {
            definition_hash: "d2".into(),
            ..binding("h1")
        };
        assert_eq!(
            store.check(&a.id, &other_definition).unwrap_err().0,
            Reason::ApprovalInvalidated
        );
        // Checking twice uses nothing; consuming is once only.
        assert!(!store.check(&a.id, &binding("h1")).unwrap().already_used);
        assert!(!store.check(&a.id, &binding("h1")).unwrap().already_used);
        store.consume(&a.id).unwrap();
        assert_eq!(
            store.consume(&a.id).unwrap_err().0,
            Reason::ApprovalAlreadyUsed
        );
        assert!(store.check(&a.id, &binding("h1")).unwrap().already_used);
        store.release(&a.id);
        store.consume(&a.id).unwrap();
    }

    #[test]
    fn expiry_follows_the_clock() {
        let clock = ManualClock::new(0);
        let store = store(&clock);
        let a = create(&store, "h");
        store
            .decide(&caller("acme", "bob", &[APPROVE_SCOPE]), &a.id, true, "")
            .unwrap();
        clock.advance(Duration::from_secs(301));
        assert_eq!(
            store.check(&a.id, &binding("h")).unwrap_err().0,
            Reason::ApprovalExpired
        );
    }

    #[test]
    fn approvers_need_their_own_tenant_and_another_subject() {
        let clock = ManualClock::new(0);
        let store = store(&clock);
        let a = create(&store, "h");
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
                .list(
                    &caller("globex", "eve", &[APPROVE_SCOPE]),
                    None,
                    Order::OldestFirst,
                    10,
                    None
                )
                .unwrap()
                .approvals
                .is_empty()
        );
        assert_eq!(
            store
                .list(
                    &caller("acme", "bob", &[APPROVE_SCOPE]),
                    None,
                    Order::OldestFirst,
                    10,
                    None
                )
                .unwrap()
                .approvals
                .len(),
            1
        );
    }

    #[test]
    fn open_approvals_per_tenant_are_capped_in_count_and_bytes() {
        let clock = ManualClock::new(0);
        let store = store(&clock);
        for _ in 0..3 {
            create(&store, "h");
        }
        let err = store
            .create(
                binding("h"),
                "{}".into(),
                RiskLevel::Destructive,
                String::new(),
            )
            .unwrap_err();
        assert_eq!(err.0, Reason::Overloaded);
        clock.advance(Duration::from_secs(301));
        // Expired ones are finished and make room.
        create(&store, "h");
        let huge = "x".repeat(2 << 20);
        let err = store
            .create(binding("h"), huge, RiskLevel::Destructive, String::new())
            .unwrap_err();
        assert_eq!(err.0, Reason::Overloaded);
        // Four small approvals, each with room for its decision: the huge one is not held.
        assert!(store.bytes() < 4 * (DECISION_RESERVE + 1024));
    }

    #[test]
    fn reasons_are_bounded_printable_and_held_for_from_the_start() {
        let clock = ManualClock::new(0);
        let store = store(&clock);
        let a = create(&store, "h");
        let held = store.bytes();
        let bob = caller("acme", "bob", &[APPROVE_SCOPE]);
        for bad in [
            "x".repeat(MAX_REASON_BYTES + 1),
            "two\nlines".into(),
            "tab\there".into(),
            "a\u{2028}b".into(),
            "\u{202e}desrever".into(),
            "\u{2066}isolate".into(),
        ] {
            assert!(
                matches!(
                    store.decide(&bob, &a.id, true, &bad),
                    Err(DecideError::InvalidReason(_))
                ),
                "{bad:?}"
            );
        }
        // Nothing was decided by the refused ones.
        assert_eq!(
            store.get(&bob, &a.id).unwrap().state,
            ApprovalState::Pending
        );
        // The longest reason, in any script, fits what the approval held for it.
        let longest = "é".repeat(MAX_REASON_BYTES / 2);
        let decided = store.decide(&bob, &a.id, false, &longest).unwrap();
        assert_eq!(decided.reason, longest);
        assert_eq!(store.bytes(), held);
        assert_eq!(bounded_reason("é".repeat(600)).len(), MAX_REASON_BYTES);
    }

    #[test]
    fn pages_follow_creation_order() {
        let clock = ManualClock::new(0);
        let store = ApprovalStore::new(
            SharedClock::new(clock.clone()),
            Budget {
                ttl: Duration::from_secs(300),
                max_per_tenant: 100,
                max_bytes_per_tenant: 1 << 20,
                max_bytes: 1 << 20,
            },
        );
        let mut ids = Vec::new();
        for _ in 0..5 {
            ids.push(create(&store, "h").id);
            clock.advance(Duration::from_millis(1));
        }
        let bob = caller("acme", "bob", &[APPROVE_SCOPE]);
        let read_all = |order| {
            let mut seen = Vec::new();
            let mut after: Option<Cursor> = None;
            for _ in 0..10 {
                let page = store.list(&bob, None, order, 2, after.as_ref()).unwrap();
                seen.extend(page.approvals.iter().map(|a| a.id.clone()));
                match page.next {
                    Some(next) => after = Cursor::parse(&next.token()),
                    None => break,
                }
            }
            seen
        };
        assert_eq!(read_all(Order::OldestFirst), ids);
        ids.reverse();
        assert_eq!(read_all(Order::NewestFirst), ids);
    }
}
