//! Approvals shared through Redis: created on one sidecar, listed and decided through another,
//! redeemed on a third, and kept across restarts of any of them. Every change is one Lua script,
//! so transitions are atomic across sidecars: of several redeemers at the same moment exactly
//! one gets past `consume`. The rules are [`ApprovalStore`](super::ApprovalStore)'s — the same
//! binding check ([`super::check_binding`]), expiry, single use and per-tenant budgets —
//! with time from Redis (`TIME`).
//!
//! Keys, all under the tenant's hash tag: `apr:<id>` (a hash per approval) and `apr:index` (a
//! sorted set of `<created_at_ms, 15 digits>:<id>` in creation order, for listing and budgets).
//! An approval's key expires one TTL after the approval itself does (it is reported expired
//! meanwhile); the index expires with its newest approval. The per-tenant budgets hold here
//! (count and bytes); the sidecar-wide byte budget does not, since a tenant's keys are all a
//! script may touch on Redis Cluster: bound the whole with Redis's `maxmemory`.

use std::{collections::HashMap, sync::Arc, sync::LazyLock, time::Duration};

use redis::Script;

use super::{
    Approval, ApprovalState, Binding, Budget, Checked, Cursor, DecideError, Page, RedeemError,
    check_binding, not_found, state_error,
};
use crate::{
    catalog::{Catalog, RiskLevel},
    error::Reason,
    identity::Caller,
    state::{
        Concern, Redis, StateError,
        redis::{Op, Reply},
    },
};

/// What every approval script starts with: Redis's time, and an approval's state as of now
/// (pending and approved ones past their expiry are expired, and are saved as such).
const PRELUDE: &str = r#"
local function settle(key, now)
  local f = redis.call('HMGET', key, 'state', 'expires')
  if not f[1] then return nil end
  local state = f[1]
  if (state == 'pending' or state == 'approved') and now >= tonumber(f[2]) then
    state = 'expired'
    redis.call('HSET', key, 'state', state)
  end
  return state
end
local function open(state)
  return state == 'pending' or state == 'approved'
end
"#;

/// KEYS: index, the new approval. ARGV: id, ttl ms, retention ms, max count, max bytes, its
/// size, the tenant's approval key prefix, then its fields as name, value pairs.
/// Forgets index entries whose approval is gone, then the tenant's oldest finished approvals
/// while over budget; refuses ({0}) when only open ones remain. {1, created, expires} otherwise.
const CREATE: &str = r#"
local now = now_ms
local index, key, id = KEYS[1], KEYS[2], ARGV[1]
local ttl, retention = tonumber(ARGV[2]), tonumber(ARGV[3])
local max_count, max_bytes, size, prefix = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local count, bytes, finished = 0, 0, {}
for _, member in ipairs(redis.call('ZRANGE', index, 0, -1)) do
  local other = prefix .. string.sub(member, 17)
  local state = settle(other, now)
  if not state then
    redis.call('ZREM', index, member)
  else
    local b = tonumber(redis.call('HGET', other, 'bytes')) or 0
    count, bytes = count + 1, bytes + b
    if not open(state) then table.insert(finished, {member, other, b}) end
  end
end
local next_victim = 1
while count >= max_count or bytes + size > max_bytes do
  local victim = finished[next_victim]
  if not victim then return {0} end
  redis.call('DEL', victim[2])
  redis.call('ZREM', index, victim[1])
  count, bytes, next_victim = count - 1, bytes - victim[3], next_victim + 1
end
local expires = now + ttl
redis.call('HSET', key, 'id', id, 'created', now, 'expires', expires, 'state', 'pending', 'bytes', size, unpack(ARGV, 8))
redis.call('PEXPIREAT', key, expires + retention)
redis.call('ZADD', index, 0, string.format('%015d', now) .. ':' .. id)
if redis.call('PEXPIRETIME', index) < expires + retention then
  redis.call('PEXPIREAT', index, expires + retention)
end
return {1, now, expires}
"#;

/// KEYS: an approval. Its fields as of now, or {} when there is none.
const LOAD: &str = r#"
if not settle(KEYS[1], now_ms) then return {} end
return redis.call('HGETALL', KEYS[1])
"#;

/// KEYS: an approval. Approved -> used: {'ok'}; otherwise {state, reason} or {'missing'}.
const CONSUME: &str = r#"
local state = settle(KEYS[1], now_ms)
if not state then return {'missing'} end
if state == 'approved' then
  redis.call('HSET', KEYS[1], 'state', 'used')
  return {'ok'}
end
return {state, redis.call('HGET', KEYS[1], 'reason') or ''}
"#;

/// KEYS: an approval. Used -> approved (its call never reached the backend).
const RELEASE: &str = r#"
if redis.call('HGET', KEYS[1], 'state') == 'used' then
  redis.call('HSET', KEYS[1], 'state', 'approved')
end
return 1
"#;

/// KEYS: an approval. ARGV: approver, 1 to approve or 0 to reject, reason.
/// {'ok', fields} | {'missing'} | {'self'} | {'not_pending', state}.
const DECIDE: &str = r#"
local state = settle(KEYS[1], now_ms)
if not state then return {'missing'} end
if redis.call('HGET', KEYS[1], 'subject') == ARGV[1] then return {'self'} end
if state ~= 'pending' then return {'not_pending', state} end
local decided = 'rejected'
if ARGV[2] == '1' then decided = 'approved' end
redis.call('HSET', KEYS[1], 'state', decided, 'decided_by', ARGV[1], 'reason', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'bytes', #ARGV[1] + #ARGV[3])
return {'ok', redis.call('HGETALL', KEYS[1])}
"#;

/// KEYS: index. ARGV: state wanted, page size, index member to start after ('' from the
/// start), the tenant's approval key prefix, most index entries to read.
/// {more (0/1), member the next page starts after, approvals' fields...}.
const LIST: &str = r#"
local now = now_ms
local page, limit, prefix = tonumber(ARGV[2]), tonumber(ARGV[5]), ARGV[4]
local from = '-'
if ARGV[3] ~= '' then from = '(' .. ARGV[3] end
local members = redis.call('ZRANGE', KEYS[1], from, '+', 'BYLEX', 'LIMIT', 0, limit)
local found, last = {}, ''
for _, member in ipairs(members) do
  local key = prefix .. string.sub(member, 17)
  local state = settle(key, now)
  if not state then
    redis.call('ZREM', KEYS[1], member)
  elseif state == ARGV[1] then
    if #found == page then
      local reply = {1, last}
      for _, f in ipairs(found) do table.insert(reply, f) end
      return reply
    end
    table.insert(found, redis.call('HGETALL', key))
    last = member
  end
end
local more, after = 0, ''
if #members == limit then more, after = 1, members[#members] end
local reply = {more, after}
for _, f in ipairs(found) do table.insert(reply, f) end
return reply
"#;

/// KEYS: index. ARGV: the tenant's approval key prefix, then every (tool, version, definition)
/// of the new catalog as `tool\0version\0hash`. Open approvals of anything else become invalid.
const INVALIDATE: &str = r#"
local now = now_ms
local valid = {}
for i = 2, #ARGV do valid[ARGV[i]] = true end
local n = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local key = ARGV[1] .. string.sub(member, 17)
  local state = settle(key, now)
  if state and open(state) then
    local f = redis.call('HMGET', key, 'tool', 'version', 'definition')
    if not valid[f[1] .. '\0' .. f[2] .. '\0' .. f[3]] then
      redis.call('HSET', key, 'state', 'invalidated', 'reason',
        'tool ' .. f[1] .. ' version ' .. f[2] .. ' changed or was removed after the approval was requested')
      n = n + 1
    end
  end
end
return n
"#;

fn script(body: &str) -> Script {
    crate::state::redis::script(&format!("{PRELUDE}{body}"))
}

static CREATE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(CREATE));
static LOAD_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(LOAD));
static CONSUME_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(CONSUME));
static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(RELEASE));
static DECIDE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(DECIDE));
static LIST_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(LIST));
static INVALIDATE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(INVALIDATE));

/// Most index entries one ListApprovals page reads: a page may come back short (with a next
/// token) when a tenant holds many approvals in other states, but no script runs long.
const LIST_SCAN_LIMIT: usize = 1000;

/// Approvals in Redis.
pub struct RedisApprovals {
    redis: Arc<Redis>,
    budget: Budget,
}

impl RedisApprovals {
    pub fn new(redis: Arc<Redis>, budget: Budget) -> Self {
        RedisApprovals { redis, budget }
    }

    fn key(&self, tenant: &str, id: &str) -> String {
        self.redis.key(tenant, format_args!("apr:{id}"))
    }

    fn index(&self, tenant: &str) -> String {
        self.redis.key(tenant, format_args!("apr:index"))
    }

    fn prefix(&self, tenant: &str) -> String {
        self.redis.key(tenant, format_args!("apr:"))
    }

    async fn run(
        &self,
        script: &'static Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<redis::Value, StateError> {
        let mut op = Op::new(script);
        for key in keys {
            op = op.key(*key);
        }
        self.redis
            .invoke(Concern::Approvals, &op.args(args.iter()))
            .await
    }

    /// Creates a pending approval, within the tenant's budgets.
    pub async fn create(
        &self,
        binding: Binding,
        arguments_json: String,
        risk_level: RiskLevel,
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
            reason: String::new(),
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
        let size_text = size.to_string();
        let risk = approval.risk_level.as_str();
        let b = &approval.binding;
        let mut args: Vec<&str> = Vec::with_capacity(32);
        let (ttl_text, max_count, max_bytes) = (
            ttl.to_string(),
            self.budget.max_per_tenant.to_string(),
            self.budget.max_bytes_per_tenant.to_string(),
        );
        let prefix = self.prefix(&tenant);
        args.extend([
            approval.id.as_str(),
            &ttl_text,
            // Kept one more TTL after expiring, so a late redeemer hears "expired".
            &ttl_text,
            &max_count,
            &max_bytes,
            &size_text,
            &prefix,
        ]);
        args.extend([
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
            risk,
            "decided_by",
            "",
            "reason",
            "",
        ]);
        let key = self.key(&tenant, &approval.id);
        let index = self.index(&tenant);
        let reply = self
            .run(&CREATE_SCRIPT, &[&index, &key], &args)
            .await
            .and_then(Reply::new)
            .map_err(redeem_unavailable)?;
        if reply.int(0).map_err(redeem_unavailable)? == 0 {
            return Err((
                Reason::Overloaded,
                format!(
                    "tenant {tenant} has too many open approvals (its budget is used by open ones); decide some first"
                ),
            ));
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
        let key = self.key(tenant, id);
        let reply = Reply::new(self.run(&LOAD_SCRIPT, &[&key], &[]).await?)?;
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

    /// Uses the approval up: exactly one caller, on any sidecar, gets past this.
    pub async fn consume(&self, tenant: &str, id: &str) -> Result<(), RedeemError> {
        if !valid_id(id) {
            return Err(not_found(id));
        }
        let key = self.key(tenant, id);
        let reply = self
            .run(&CONSUME_SCRIPT, &[&key], &[])
            .await
            .and_then(Reply::new)
            .map_err(redeem_unavailable)?;
        match reply.text(0).map_err(redeem_unavailable)?.as_str() {
            "ok" => Ok(()),
            "missing" => Err(not_found(id)),
            state => {
                let state = parse_state(state).map_err(redeem_unavailable)?;
                let reason = reply.text(1).unwrap_or_default();
                Err(state_error(id, state, &reason))
            }
        }
    }

    /// Gives a consumed approval back; when Redis cannot be reached it stays used (the caller
    /// then needs a new approval), and that is logged.
    pub async fn release(&self, tenant: &str, id: &str) {
        let key = self.key(tenant, id);
        if let Err(err) = self.run(&RELEASE_SCRIPT, &[&key], &[]).await {
            tracing::warn!(approval_id = %id, error = %err, "could not give back an approval whose call never reached its backend; it stays used");
        }
    }

    /// One page of the approver's tenant's approvals in `state`.
    pub async fn list(
        &self,
        approver: &Caller,
        state: ApprovalState,
        page_size: usize,
        after: Option<&Cursor>,
    ) -> Result<Page, DecideError> {
        let tenant = &approver.tenant;
        let index = self.index(tenant);
        let prefix = self.prefix(tenant);
        let after = after.map(member).unwrap_or_default();
        let (want, page, limit) = (
            state_name(state),
            page_size.to_string(),
            LIST_SCAN_LIMIT.max(page_size + 1).to_string(),
        );
        let reply = self
            .run(
                &LIST_SCRIPT,
                &[&index],
                &[want, &page, &after, &prefix, &limit],
            )
            .await
            .and_then(Reply::new)
            .map_err(decide_unavailable)?;
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
        let key = self.key(&approver.tenant, id);
        let reply = self
            .run(
                &DECIDE_SCRIPT,
                &[&key],
                &[&approver.subject, if approve { "1" } else { "0" }, reason],
            )
            .await
            .and_then(Reply::new)
            .map_err(decide_unavailable)?;
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
    /// changed become invalid. Redis being unreachable only delays this: redeeming still
    /// compares the definition the approval was requested against.
    pub async fn invalidate_changed(&self, catalog: &Catalog) -> usize {
        let definitions: Vec<String> = catalog
            .versions()
            .map(|v| format!("{}\0{}\0{}", v.name, v.version, v.definition_hash))
            .collect();
        let mut invalidated = 0;
        for tenant in catalog.tenants.keys() {
            let index = self.index(tenant);
            let prefix = self.prefix(tenant);
            let op = Op::new(&INVALIDATE_SCRIPT)
                .key(index)
                .arg(prefix)
                .args(&definitions);
            match self.redis.invoke(Concern::Approvals, &op).await {
                Ok(redis::Value::Int(n)) => invalidated += usize::try_from(n).unwrap_or(0),
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(tenant = %tenant, error = %err, "could not mark the approvals of changed tools invalid");
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

fn state_name(state: ApprovalState) -> &'static str {
    match state {
        ApprovalState::Pending => "pending",
        ApprovalState::Approved => "approved",
        ApprovalState::Rejected => "rejected",
        ApprovalState::Used => "used",
        ApprovalState::Expired => "expired",
        ApprovalState::Invalidated => "invalidated",
    }
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
    .find(|s| state_name(*s) == name)
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
        reason: take("reason"),
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
