//! Pending approvals for risky calls (stage 9 and the Approvals service). An approval binds the
//! requesting tenant, subject, agent and run, the tool, version and definition, and the SHA-256
//! of the canonical arguments; it expires, and it is used once.
//!
//! Stage 9 only *checks* an approval ([`ApprovalStore::check`]); it is used up
//! ([`ApprovalStore::consume`]) when its call is handed to the backend, and given back
//! ([`ApprovalStore::release`]) if the backend was never reached, so a retryable failure before
//! the tool started does not burn it. Time comes from the injected clock. Memory is bounded per
//! tenant and in total, in count and bytes.
//!
//! [`Approvals`] is what the boundary and the Approvals service call: this in-memory
//! [`ApprovalStore`], or approvals shared by every sidecar through Redis ([`redis`]), which keeps
//! the same rules.

mod memory;
pub mod redis;

pub use memory::ApprovalStore;

use crate::{clock::SharedClock, error::Reason, identity::Caller, settings::RiskLevel, state};
use redis::RedisApprovals;

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

impl ApprovalState {
    /// Its name in lower case, as Redis keeps it and pages show it.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Rejected => "rejected",
            ApprovalState::Used => "used",
            ApprovalState::Expired => "expired",
            ApprovalState::Invalidated => "invalidated",
        }
    }
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
    /// The hash of the tool's definition the approval was requested against.
    pub definition_hash: String,
    pub arguments_sha256: String,
}

impl Binding {
    fn bytes(&self) -> usize {
        self.tenant.len()
            + self.subject.len()
            + self.agent.len()
            + self.run_id.len()
            + self.tool.len()
            + self.tool_version.len()
            + self.definition_hash.len()
            + self.arguments_sha256.len()
    }
}

/// One approval.
#[derive(Debug, Clone)]
pub struct Approval {
    pub id: String,
    pub binding: Binding,
    /// Canonical JSON of the arguments, for the approver to read.
    pub arguments_json: String,
    pub risk_level: RiskLevel,
    pub state: ApprovalState,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    pub decided_by: String,
    /// When it was approved or rejected (Unix ms); 0 while pending, and for approvals decided
    /// before this was kept.
    pub decided_at_ms: i64,
    pub reason: String,
    /// Why the call needs an approval (the tool's risk level, its condition, a flow rule), for
    /// the approver; at most [`MAX_REASON_BYTES`].
    pub needed_because: String,
}

impl Approval {
    fn finished(&self) -> bool {
        !matches!(self.state, ApprovalState::Pending | ApprovalState::Approved)
    }

    /// What keeping it costs, as the budgets count it: from its creation on, with room for its
    /// decision (a reason of up to [`MAX_REASON_BYTES`] and the approver), so deciding never
    /// takes a tenant over its budget.
    pub fn bytes(&self) -> usize {
        APPROVAL_OVERHEAD
            + self.id.len()
            + self.binding.bytes()
            + self.arguments_json.len()
            + self.needed_because.len()
            + (self.decided_by.len() + self.reason.len()).max(DECISION_RESERVE)
    }
}

/// Bytes an approval costs beyond its strings (map slot, timestamps, enum fields).
const APPROVAL_OVERHEAD: usize = 256;
/// The longest reason an approver may give (bytes of UTF-8).
pub const MAX_REASON_BYTES: usize = 1024;
/// What an approval's budget holds for its decision: the longest reason and an approver's name
/// of the default identity limit.
pub const DECISION_RESERVE: usize = MAX_REASON_BYTES + 256;

/// Checks an approver's reason: at most [`MAX_REASON_BYTES`], and printable — no control
/// characters, line or paragraph separators or bidirectional controls, which would break or
/// disguise the audit lines and listings it is shown in. Refused rather than cut: a decision
/// record must say exactly what its approver wrote (a cut can drop the "not" that mattered),
/// and the approver learns at once, before anything is decided.
pub fn check_reason(reason: &str) -> Result<(), DecideError> {
    if reason.len() > MAX_REASON_BYTES {
        return Err(DecideError::InvalidReason(format!(
            "the reason is {} bytes; at most {MAX_REASON_BYTES} are kept",
            reason.len()
        )));
    }
    let unprintable = |c: char| {
        c.is_control()
            || matches!(
                c,
                '\u{2028}' | '\u{2029}' | '\u{061c}' | '\u{200e}' | '\u{200f}'
            )
            || ('\u{202a}'..='\u{202e}').contains(&c)
            || ('\u{2066}'..='\u{2069}').contains(&c)
    };
    if let Some(c) = reason.chars().find(|c| unprintable(*c)) {
        return Err(DecideError::InvalidReason(format!(
            "the reason holds the unprintable character U+{:04X}",
            u32::from(c)
        )));
    }
    Ok(())
}

/// `text` cut to at most [`MAX_REASON_BYTES`] on a character boundary: for reasons stored
/// before the limit existed, so no listing carries more.
pub fn bounded_reason(mut text: String) -> String {
    if text.len() > MAX_REASON_BYTES {
        let mut end = MAX_REASON_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// What a call's approval check found: an approval it may use when it reaches the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub id: String,
    /// Already used by an earlier call: only an idempotent replay of that call may pass.
    pub already_used: bool,
}

/// Budgets of the store.
pub use crate::settings::ApprovalBudget as Budget;

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
    #[error("invalid reason: {0}")]
    InvalidReason(String),
    #[error("invalid page_token: pass the next_page_token of the previous page")]
    InvalidPageToken,
    #[error("the audit log cannot keep up; the decision was not applied")]
    AuditUnavailable,
    #[error("approvals cannot be read or decided now: {0}; retry shortly")]
    Unavailable(String),
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

/// The order of a listing: creation time, then id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// The gRPC service's order: a page token goes on to newer approvals.
    #[default]
    OldestFirst,
    /// The console's inbox: what just arrived on top.
    NewestFirst,
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

/// What a catalog serves, as approvals are bound to it: each tool definition (name, version and
/// definition hash), and the tenants whose approvals a reload may void. The boundary makes it
/// from the catalog (`boundary::approval::served`).
#[derive(Debug, Default)]
pub struct Served {
    pub tenants: Vec<String>,
    /// `name\0version\0definition hash` of each definition.
    definitions: std::collections::BTreeSet<String>,
}

impl Served {
    /// Adds a definition served.
    pub fn serve(&mut self, name: &str, version: &str, definition_hash: &str) {
        self.definitions
            .insert(Self::key(name, version, definition_hash));
    }

    /// Whether this definition is served.
    pub fn serves(&self, name: &str, version: &str, definition_hash: &str) -> bool {
        self.definitions
            .contains(&Self::key(name, version, definition_hash))
    }

    /// How a definition is named here and in the Redis script's arguments.
    fn key(name: &str, version: &str, definition_hash: &str) -> String {
        format!("{name}\0{version}\0{definition_hash}")
    }

    /// Every definition served, as `name\0version\0definition hash`.
    pub fn definitions(&self) -> impl Iterator<Item = &str> {
        self.definitions.iter().map(String::as_str)
    }
}

/// The approvals of a sidecar: in its memory, or shared through Redis.
pub enum Approvals {
    Memory(ApprovalStore),
    Shared(RedisApprovals),
}

impl Approvals {
    /// The store for `backend`.
    pub fn on(backend: &state::Backend, clock: SharedClock, budget: Budget) -> Self {
        match backend {
            state::Backend::Memory => Approvals::Memory(ApprovalStore::new(clock, budget)),
            state::Backend::Redis(redis) => {
                Approvals::Shared(RedisApprovals::new(redis.clone(), budget))
            }
        }
    }

    /// Creates a pending approval (see [`ApprovalStore::create`]).
    pub async fn create(
        &self,
        binding: Binding,
        arguments_json: String,
        risk_level: RiskLevel,
        needed_because: String,
    ) -> Result<Approval, RedeemError> {
        match self {
            Approvals::Memory(store) => {
                store.create(binding, arguments_json, risk_level, needed_because)
            }
            // Boxed here and below: only calls that go to Redis pay for its futures.
            Approvals::Shared(store) => {
                Box::pin(store.create(binding, arguments_json, risk_level, needed_because)).await
            }
        }
    }

    /// Checks that this call may use approval `id`; changes nothing.
    pub async fn check(&self, id: &str, call: &Binding) -> Result<Checked, RedeemError> {
        match self {
            Approvals::Memory(store) => store.check(id, call),
            Approvals::Shared(store) => Box::pin(store.check(id, call)).await,
        }
    }

    /// Uses the approval up as its call reaches the backend; exactly once.
    pub async fn consume(&self, tenant: &str, id: &str) -> Result<(), RedeemError> {
        match self {
            Approvals::Memory(store) => store.consume(id),
            Approvals::Shared(store) => Box::pin(store.consume(tenant, id)).await,
        }
    }

    /// Gives a consumed approval back: its call never reached the backend.
    pub async fn release(&self, tenant: &str, id: &str) {
        match self {
            Approvals::Memory(store) => store.release(id),
            Approvals::Shared(store) => Box::pin(store.release(tenant, id)).await,
        }
    }

    /// One page of the approver's tenant's approvals in `state` (pending when `None`), in
    /// `order`, from just beyond `after`.
    pub async fn list(
        &self,
        approver: &Caller,
        state: Option<ApprovalState>,
        order: Order,
        page_size: usize,
        after: Option<&Cursor>,
    ) -> Result<Page, DecideError> {
        match self {
            Approvals::Memory(store) => store.list(approver, state, order, page_size, after),
            Approvals::Shared(store) => {
                let state = state.unwrap_or(ApprovalState::Pending);
                store.list(approver, state, order, page_size, after).await
            }
        }
    }

    /// One approval of the approver's tenant.
    pub async fn get(&self, approver: &Caller, id: &str) -> Result<Approval, DecideError> {
        match self {
            Approvals::Memory(store) => store.get(approver, id),
            Approvals::Shared(store) => store.get(approver, id).await,
        }
    }

    /// Approves or rejects a pending approval of the approver's own tenant.
    pub async fn decide(
        &self,
        approver: &Caller,
        id: &str,
        approve: bool,
        reason: &str,
    ) -> Result<Approval, DecideError> {
        check_reason(reason)?;
        match self {
            Approvals::Memory(store) => store.decide(approver, id, approve, reason),
            Approvals::Shared(store) => store.decide(approver, id, approve, reason).await,
        }
    }

    /// After a catalog reload: open approvals whose tool definition is no longer `served`
    /// become invalid.
    pub async fn invalidate_changed(&self, served: &Served) -> usize {
        match self {
            Approvals::Memory(store) => store.invalidate_changed(served),
            Approvals::Shared(store) => store.invalidate_changed(served).await,
        }
    }

    /// Approvals waiting for a decision in this sidecar's memory (shared ones are in Redis,
    /// counted there).
    pub fn pending(&self) -> usize {
        match self {
            Approvals::Memory(store) => store.pending(),
            Approvals::Shared(_) => 0,
        }
    }

    /// Bytes held in this sidecar's memory.
    pub fn bytes(&self) -> usize {
        match self {
            Approvals::Memory(store) => store.bytes(),
            Approvals::Shared(_) => 0,
        }
    }
}

/// Whether `call` may use `approval` (found by `id` in the caller's tenant): same caller and
/// run, approved (or used, for a replay), same tool, version, definition and arguments. Shared
/// by both stores, so they refuse alike.
pub fn check_binding(
    approval: Option<&Approval>,
    id: &str,
    call: &Binding,
) -> Result<Checked, RedeemError> {
    let approval = approval.ok_or_else(|| not_found(id))?;
    let bound = &approval.binding;
    if bound.subject != call.subject || bound.agent != call.agent || bound.run_id != call.run_id {
        return Err((
            Reason::ApprovalWrongCaller,
            format!("approval {id} was requested by another caller or run"),
        ));
    }
    let already_used = match approval.state {
        ApprovalState::Approved => false,
        ApprovalState::Used => true,
        other => return Err(state_error(id, other, &approval.reason)),
    };
    if bound.tool != call.tool || bound.tool_version != call.tool_version {
        return Err((
            Reason::ApprovalArgumentsChanged,
            format!(
                "approval {id} is for {} version {}",
                bound.tool, bound.tool_version
            ),
        ));
    }
    if bound.definition_hash != call.definition_hash {
        return Err((
            Reason::ApprovalInvalidated,
            format!(
                "approval {id} was requested against another definition of {}; request a new approval",
                bound.tool
            ),
        ));
    }
    if bound.arguments_sha256 != call.arguments_sha256 {
        return Err((
            Reason::ApprovalArgumentsChanged,
            format!("the arguments differ from the ones approval {id} was granted for"),
        ));
    }
    Ok(Checked {
        id: id.to_owned(),
        already_used,
    })
}

fn not_found(id: &str) -> RedeemError {
    (
        Reason::ApprovalNotFound,
        format!("no approval {id} for this tenant"),
    )
}

/// Why an approval in `state` cannot be used.
pub fn state_error(id: &str, state: ApprovalState, reason: &str) -> RedeemError {
    match state {
        ApprovalState::Pending => (
            Reason::ApprovalPending,
            format!("approval {id} is still pending"),
        ),
        ApprovalState::Rejected => (
            Reason::ApprovalRejected,
            format!("approval {id} was rejected: {reason}"),
        ),
        ApprovalState::Used => (
            Reason::ApprovalAlreadyUsed,
            format!("approval {id} was already used"),
        ),
        ApprovalState::Expired => (
            Reason::ApprovalExpired,
            format!("approval {id} has expired"),
        ),
        ApprovalState::Invalidated => (
            Reason::ApprovalInvalidated,
            format!("approval {id} is invalid: {reason}"),
        ),
        ApprovalState::Approved => (
            Reason::Internal,
            format!("approval {id} is approved but was not usable"),
        ),
    }
}
