//! Approvals shared through Redis: created on one sidecar, listed and decided through another,
//! redeemed on a third, and kept across restarts of any of them. Every change is one Lua script
//! ([`scripts`], which also describes the key layout), so transitions are atomic across
//! sidecars: of several redeemers at the same moment exactly one gets past `consume`. The rules
//! are [`ApprovalStore`](super::ApprovalStore)'s — the same binding check
//! ([`super::check_binding`]), expiry, single use and per-tenant budgets — with time from Redis.
//!
//! The per-tenant budgets (count and bytes) hold here, kept incrementally so that no script's
//! work grows with the tenant's approvals; the sidecar-wide byte budget does not, since a
//! tenant's keys are all a script may touch on Redis Cluster: bound the whole with Redis's
//! `maxmemory`.

mod scripts;

use std::{collections::HashMap, sync::Arc, time::Duration};

use redis::Script;
use tokio::time::Instant;

use super::{
    Approval, ApprovalState, Binding, Budget, Checked, Cursor, DECISION_RESERVE, DecideError,
    Order, Page, RedeemError, Served, bounded_reason, check_binding, not_found, state_error,
};
use crate::{
    error::Reason,
    identity::Caller,
    settings::RiskLevel,
    state::{
        Concern, Redis, StateError,
        redis::{Op, Reply},
    },
};
use scripts::{
    CONSUME_SCRIPT, CREATE_SCRIPT, DECIDE_SCRIPT, FORGET_SCRIPT, INVALIDATE_SCRIPT, LIST_SCRIPT,
    LOAD_SCRIPT, RELEASE_SCRIPT, WORK,
};

/// Approvals in Redis.
pub struct RedisApprovals {
    redis: Arc<Redis>,
    budget: Budget,
}

impl RedisApprovals {
    pub fn new(redis: Arc<Redis>, budget: Budget) -> Self {
        RedisApprovals { redis, budget }
    }

    /// A script call on `tenant`'s approvals: routed by its totals' key, told its key prefix.
    fn op(&self, script: &'static Script, tenant: &str) -> Op {
        Op::new(script)
            .key(self.redis.key(tenant, format_args!("apr:usage")))
            .arg(self.redis.key(tenant, format_args!("apr:")))
    }

    async fn run(&self, op: &Op) -> Result<Reply, StateError> {
        Reply::new(self.redis.invoke(Concern::Approvals, op).await?)
    }

    /// Creates a pending approval, within the tenant's budgets. Should Redis not answer in
    /// time, an approval it may still have made just before is forgotten again from a task of
    /// its own: nobody was told its id.
    pub async fn create(
        &self,
        binding: Binding,
        arguments_json: String,
        risk_level: RiskLevel,
        needed_because: String,
    ) -> Result<Approval, RedeemError> {
        let mut approval = Approval {
            id: format!("apr_{}", uuid::Uuid::new_v4().simple()),
            binding,
            arguments_json,
            risk_level,
            state: ApprovalState::Pending,
            created_at_ms: 0,
            expires_at_ms: 0,
            decided_by: String::new(),
            decided_at_ms: 0,
            reason: String::new(),
            needed_because: super::bounded_reason(needed_because),
        };
        let size = approval.bytes();
        let tenant = approval.binding.tenant.clone();
        if size > self.budget.max_bytes_per_tenant || size > self.budget.max_bytes {
            return Err((
                Reason::Overloaded,
                format!(
                    "the call's arguments are too large to hold for an approval ({size} bytes)"
                ),
            ));
        }
        let ttl = millis(self.budget.ttl);
        let b = &approval.binding;
        let op = self
            .op(&CREATE_SCRIPT, &tenant)
            .arg(&approval.id)
            .arg(ttl)
            // Kept one more TTL after expiring, so a late redeemer hears "expired".
            .arg(ttl)
            .arg(self.budget.max_per_tenant)
            .arg(self.budget.max_bytes_per_tenant)
            .arg(size)
            .args([
                "tenant",
                b.tenant.as_str(),
                "subject",
                &b.subject,
                "agent",
                &b.agent,
                "run_id",
                &b.run_id,
                "tool",
                &b.tool,
                "version",
                &b.tool_version,
                "definition",
                &b.definition_hash,
                "args_sha",
                &b.arguments_sha256,
                "args",
                &approval.arguments_json,
                "risk",
                approval.risk_level.as_str(),
                "decided_by",
                "",
                "reason",
                "",
                "because",
                &approval.needed_because,
            ]);
        let reply = match self.run(&op).await {
            Ok(reply) => reply,
            Err(err) => {
                if matches!(err, StateError::Timeout(_)) {
                    self.redis.retry_later(
                        Concern::Approvals,
                        self.op(&FORGET_SCRIPT, &tenant).arg(&approval.id),
                        Instant::now() + self.budget.ttl,
                        "forget an approval whose creation timed out",
                    );
                }
                return Err(redeem_unavailable(err));
            }
        };
        if reply.int(0).map_err(redeem_unavailable)? == 0 {
            let why = match reply.text(1).unwrap_or_default().as_str() {
                "busy" => format!(
                    "tenant {tenant} is over its approval budget and {WORK} finished approvals were not enough room; retry shortly"
                ),
                _ => format!(
                    "tenant {tenant} has too many open approvals (its budget is used by open ones); decide some first"
                ),
            };
            return Err((Reason::Overloaded, why));
        }
        approval.created_at_ms = reply.int(1).map_err(redeem_unavailable)?;
        approval.expires_at_ms = reply.int(2).map_err(redeem_unavailable)?;
        Ok(approval)
    }

    /// The approval `id` of `tenant` as of now, if there is one.
    async fn load(&self, tenant: &str, id: &str) -> Result<Option<Approval>, StateError> {
        if !valid_id(id) {
            return Ok(None);
        }
        let reply = self.run(&self.op(&LOAD_SCRIPT, tenant).arg(id)).await?;
        if reply.is_empty() {
            return Ok(None);
        }
        parse(id, &reply).map(Some)
    }

    /// Checks that this call may use approval `id`; changes nothing.
    pub async fn check(&self, id: &str, call: &Binding) -> Result<Checked, RedeemError> {
        let approval = self
            .load(&call.tenant, id)
            .await
            .map_err(redeem_unavailable)?;
        check_binding(approval.as_ref(), id, call)
    }

    /// Uses the approval up: exactly one caller, on any sidecar, gets past this. Should Redis
    /// not answer in time, a use it may still have recorded just before is given back from a
    /// task of its own (the call does not run) — only that use, marked with its own token, so
    /// another redeemer's is never undone.
    pub async fn consume(&self, tenant: &str, id: &str) -> Result<(), RedeemError> {
        if !valid_id(id) {
            return Err(not_found(id));
        }
        let token = uuid::Uuid::new_v4().simple().to_string();
        let reply = match self
            .run(&self.op(&CONSUME_SCRIPT, tenant).arg(id).arg(&token))
            .await
        {
            Ok(reply) => reply,
            Err(err) => {
                if matches!(err, StateError::Timeout(_)) {
                    self.redis.retry_later(
                        Concern::Approvals,
                        self.op(&RELEASE_SCRIPT, tenant).arg(id).arg(&token),
                        Instant::now() + self.budget.ttl,
                        "give back an approval whose use timed out",
                    );
                }
                return Err(redeem_unavailable(err));
            }
        };
        match reply.text(0).map_err(redeem_unavailable)?.as_str() {
            "ok" => Ok(()),
            "missing" => Err(not_found(id)),
            state => {
                let state = parse_state(state).map_err(redeem_unavailable)?;
                let reason = bounded_reason(reply.text(1).unwrap_or_default());
                Err(state_error(id, state, &reason))
            }
        }
    }

    /// Gives a consumed approval back; when Redis cannot be reached it stays used (the caller
    /// then needs a new approval), and that is logged.
    pub async fn release(&self, tenant: &str, id: &str) {
        let op = self.op(&RELEASE_SCRIPT, tenant).arg(id).arg("");
        if let Err(err) = self.redis.invoke(Concern::Approvals, &op).await {
            tracing::warn!(approval_id = %id, error = %err, "could not give back an approval whose call never reached its backend; it stays used");
        }
    }

    /// One page of the approver's tenant's approvals in `state`.
    pub async fn list(
        &self,
        approver: &Caller,
        state: ApprovalState,
        order: Order,
        page_size: usize,
        after: Option<&Cursor>,
    ) -> Result<Page, DecideError> {
        let op = self
            .op(&LIST_SCRIPT, &approver.tenant)
            .arg(ApprovalState::as_str(state))
            .arg(page_size)
            .arg(after.map(member).unwrap_or_default())
            // The page and the one after it, and as many more as may have expired unseen.
            .arg(page_size + 1 + WORK)
            .arg(match order {
                Order::OldestFirst => "oldest",
                Order::NewestFirst => "newest",
            });
        let reply = self.run(&op).await.map_err(decide_unavailable)?;
        let read = || -> Result<Page, StateError> {
            let more = reply.int(0)? == 1;
            let next = reply.text(1)?;
            let mut approvals = Vec::new();
            for i in 2..reply.len() {
                let fields = reply.nested(i)?;
                let id = field_map(&fields)?.get("id").cloned().unwrap_or_default();
                approvals.push(parse(&id, &fields)?);
            }
            Ok(Page {
                approvals,
                next: more.then(|| cursor(&next)).flatten(),
            })
        };
        read().map_err(decide_unavailable)
    }

    /// One approval of the approver's tenant.
    pub async fn get(&self, approver: &Caller, id: &str) -> Result<Approval, DecideError> {
        self.load(&approver.tenant, id)
            .await
            .map_err(decide_unavailable)?
            .ok_or_else(|| DecideError::NotFound(id.to_owned()))
    }

    /// Approves or rejects a pending approval of the approver's tenant.
    pub async fn decide(
        &self,
        approver: &Caller,
        id: &str,
        approve: bool,
        reason: &str,
    ) -> Result<Approval, DecideError> {
        if !valid_id(id) {
            return Err(DecideError::NotFound(id.to_owned()));
        }
        let op = self
            .op(&DECIDE_SCRIPT, &approver.tenant)
            .arg(id)
            .arg(&approver.subject)
            .arg(if approve { "1" } else { "0" })
            .arg(reason)
            .arg(DECISION_RESERVE);
        let reply = self.run(&op).await.map_err(|err| match err {
            // A decision is a write: it may have been applied just before the sidecar gave up.
            StateError::Timeout(_) => DecideError::Unavailable(format!(
                "{}, so the decision may or may not have been applied: read the approval before deciding again",
                err.for_caller()
            )),
            err => decide_unavailable(err),
        })?;
        let read = || -> Result<Result<Approval, DecideError>, StateError> {
            Ok(match reply.text(0)?.as_str() {
                "ok" => Ok(parse(id, &reply.nested(1)?)?),
                "missing" => Err(DecideError::NotFound(id.to_owned())),
                "self" => Err(DecideError::SelfApproval),
                _ => Err(DecideError::NotPending {
                    id: id.to_owned(),
                    state: parse_state(&reply.text(1)?)?,
                }),
            })
        };
        read().map_err(decide_unavailable)?
    }

    /// After a catalog reload: open approvals of the catalog's tenants whose tool definition
    /// changed become invalid, [`WORK`] at a time per script. Redis being unreachable only
    /// delays this: redeeming still compares the definition the approval was requested
    /// against.
    pub async fn invalidate_changed(&self, served: &Served) -> usize {
        let definitions: Vec<&str> = served.definitions().collect();
        // Every open approval of a tenant in pages, and a margin for those created meanwhile.
        let most_pages = self.budget.max_per_tenant / WORK + 2;
        let mut invalidated = 0;
        for tenant in &served.tenants {
            for state in [ApprovalState::Pending, ApprovalState::Approved] {
                let mut after = String::new();
                for _ in 0..most_pages {
                    let op = self
                        .op(&INVALIDATE_SCRIPT, tenant)
                        .arg(ApprovalState::as_str(state))
                        .arg(&after)
                        .args(&definitions);
                    let page = self.run(&op).await.and_then(|reply| {
                        Ok((usize::try_from(reply.int(0)?).unwrap_or(0), reply.text(1)?))
                    });
                    match page {
                        Ok((n, next)) => {
                            invalidated += n;
                            if next.is_empty() {
                                break;
                            }
                            after = next;
                        }
                        Err(err) => {
                            tracing::warn!(tenant = %tenant, error = %err, "could not mark the approvals of changed tools invalid");
                            break;
                        }
                    }
                }
            }
        }
        invalidated
    }
}

/// Ids this sidecar hands out; anything else is not found, without asking Redis (and cannot
/// name another of the tenant's keys).
fn valid_id(id: &str) -> bool {
    id.strip_prefix("apr_")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The index member of a page cursor.
fn member(cursor: &Cursor) -> String {
    format!("{:015}:{}", cursor.created_at_ms, cursor.id)
}

/// The cursor of an index member.
fn cursor(member: &str) -> Option<Cursor> {
    let (time, id) = member.split_once(':')?;
    Some(Cursor {
        created_at_ms: time.parse().ok()?,
        id: id.to_owned(),
    })
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn parse_state(name: &str) -> Result<ApprovalState, StateError> {
    [
        ApprovalState::Pending,
        ApprovalState::Approved,
        ApprovalState::Rejected,
        ApprovalState::Used,
        ApprovalState::Expired,
        ApprovalState::Invalidated,
    ]
    .into_iter()
    .find(|s| ApprovalState::as_str(*s) == name)
    .ok_or_else(|| StateError::Malformed(format!("unknown approval state {name:?}")))
}

/// A flat field/value reply as a map.
fn field_map(reply: &Reply) -> Result<HashMap<String, String>, StateError> {
    let mut map = HashMap::with_capacity(reply.len() / 2);
    for i in (0..reply.len().saturating_sub(1)).step_by(2) {
        map.insert(reply.text(i)?, reply.text(i + 1)?);
    }
    Ok(map)
}

/// An approval from its hash.
fn parse(id: &str, reply: &Reply) -> Result<Approval, StateError> {
    let mut f = field_map(reply)?;
    let mut take = |name: &str| f.remove(name).unwrap_or_default();
    let number = |text: String, name: &str| {
        text.parse::<i64>()
            .map_err(|_| StateError::Malformed(format!("approval field {name} is not a number")))
    };
    let risk = take("risk");
    Ok(Approval {
        id: id.to_owned(),
        binding: Binding {
            tenant: take("tenant"),
            subject: take("subject"),
            agent: take("agent"),
            run_id: take("run_id"),
            tool: take("tool"),
            tool_version: take("version"),
            definition_hash: take("definition"),
            arguments_sha256: take("args_sha"),
        },
        arguments_json: take("args"),
        risk_level: RiskLevel::parse(&risk)
            .ok_or_else(|| StateError::Malformed(format!("unknown risk level {risk:?}")))?,
        state: parse_state(&take("state"))?,
        created_at_ms: number(take("created"), "created")?,
        expires_at_ms: number(take("expires"), "expires")?,
        decided_by: take("decided_by"),
        // Absent on approvals decided before it was kept.
        decided_at_ms: number(take("decided"), "decided").unwrap_or(0),
        reason: bounded_reason(take("reason")),
        needed_because: bounded_reason(take("because")),
    })
}

fn redeem_unavailable(err: StateError) -> RedeemError {
    (
        Reason::StateUnavailable,
        format!(
            "the approval cannot be checked: {}; retry shortly",
            err.for_caller()
        ),
    )
}

fn decide_unavailable(err: StateError) -> DecideError {
    DecideError::Unavailable(err.for_caller())
}
