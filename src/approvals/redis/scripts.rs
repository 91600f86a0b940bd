//! The Lua scripts of the Redis approvals, and the layout they keep.
//!
//! Keys, all under the tenant's hash tag, `<prefix>{<tenant>}:apr:` then:
//! - `<id>`: a hash per approval (its binding, arguments, state, `created`, `expires`, `forget`
//!   (when it is forgotten), `member` (its index entry), `bytes`, the decision);
//! - `st:<state>`: one sorted set per state of `<created_at_ms, 15 digits>:<id>` (all scores 0,
//!   so ordered by that text: creation time, then id — the listing order);
//! - `due`: the same entries scored by when each must next be looked at: an open approval at
//!   its expiry (it becomes expired), a finished one when it is forgotten;
//! - `sizes` (id -> bytes) and `usage` (`count`, `bytes`): the tenant's totals, kept as
//!   approvals come and go, so no script counts them.
//!
//! So no script reads more than a constant number of entries ([`WORK`]) beyond what it was
//! asked for: a new approval settles at most that many due entries and evicts at most that many
//! finished ones (oldest first: the heads of the finished states' sets), a page reads its
//! state's set from the cursor on, and invalidation walks the open sets a page at a time.
//!
//! An approval's hash expires one retention after it is forgotten (scripts normally forget it
//! first); the tenant's sets and totals live as long as its latest approval's hash. A hash that
//! Redis expired is still forgotten properly: its size is in `sizes`, its entry in `due`.
//!
//! Approvals stored by the previous layout (one `index` set of every approval, totals counted by
//! reading them all) are adopted as scripts meet them: each script that touches the tenant first
//! moves up to [`WORK`] entries of the old `index` into the new sets and totals, and a script
//! that touches one approval adopts it. Nothing pending is lost; until a tenant's old index is
//! empty, its listings may miss the approvals not yet moved (they are decided and redeemed by id
//! as before).

use std::sync::LazyLock;

use redis::Script;

/// Most entries one script settles, evicts, adopts or invalidates beyond what it was asked for.
pub const WORK: usize = 64;

/// Every approval script's start (after the shared guard). KEYS[1] is the tenant's `usage`
/// (it routes the script on a cluster); ARGV[1] is the tenant's approval key prefix.
const PRELUDE: &str = r#"
local P = ARGV[1]
local usage, due, sizes, legacy = KEYS[1], P .. 'due', P .. 'sizes', P .. 'index'
local STATES = {'pending', 'approved', 'rejected', 'used', 'expired', 'invalidated'}
local FINISHED = {'rejected', 'used', 'expired', 'invalidated'}
local function at(state) return P .. 'st:' .. state end
local function open(state) return state == 'pending' or state == 'approved' end
local function id_of(member) return string.sub(member, 17) end
-- The tenant's sets and totals live at least until `until_ms`.
local function keep_alive(until_ms)
  local keys = {usage, due, sizes}
  for _, state in ipairs(STATES) do table.insert(keys, at(state)) end
  for _, key in ipairs(keys) do
    if redis.call('EXISTS', key) == 1 and redis.call('PEXPIRETIME', key) < until_ms then
      redis.call('PEXPIREAT', key, until_ms)
    end
  end
end
-- A set just written to lives as long as the tenant's totals.
local function touch(key)
  local t = redis.call('PEXPIRETIME', usage)
  if t > 0 and redis.call('PEXPIRETIME', key) < t then redis.call('PEXPIREAT', key, t) end
end
-- Moves an approval from one state to another, in its hash and the sets.
local function move(key, member, from, to)
  redis.call('ZREM', at(from), member)
  redis.call('ZADD', at(to), 0, member)
  touch(at(to))
  redis.call('HSET', key, 'state', to)
  local f = redis.call('HMGET', key, 'expires', 'forget')
  if open(to) then
    redis.call('ZADD', due, tonumber(f[1]), member)
  else
    redis.call('ZADD', due, tonumber(f[2]), member)
  end
end
-- Forgets an approval, whether or not its hash is still there.
local function forget(member)
  local id = id_of(member)
  local key = P .. id
  local state = redis.call('HGET', key, 'state')
  if state then
    redis.call('ZREM', at(state), member)
  else
    for _, s in ipairs(STATES) do redis.call('ZREM', at(s), member) end
  end
  redis.call('ZREM', due, member)
  local b = tonumber(redis.call('HGET', sizes, id))
  if b then
    redis.call('HDEL', sizes, id)
    redis.call('HINCRBY', usage, 'count', -1)
    redis.call('HINCRBY', usage, 'bytes', -b)
  end
  redis.call('DEL', key)
end
-- Registers an approval of the previous layout in the sets and totals; false if there is none.
local function adopt(id)
  if redis.call('HEXISTS', sizes, id) == 1 then return true end
  local key = P .. id
  local f = redis.call('HMGET', key, 'state', 'created', 'expires', 'bytes')
  if not f[1] then return false end
  local forget_at = redis.call('PEXPIRETIME', key)
  if forget_at < 0 then forget_at = tonumber(f[3]) end
  local member = string.format('%015d', tonumber(f[2])) .. ':' .. id
  local b = tonumber(f[4]) or 0
  redis.call('HSET', key, 'member', member, 'forget', forget_at)
  redis.call('HSET', sizes, id, b)
  redis.call('HINCRBY', usage, 'count', 1)
  redis.call('HINCRBY', usage, 'bytes', b)
  redis.call('ZADD', at(f[1]), 0, member)
  if open(f[1]) then
    redis.call('ZADD', due, tonumber(f[3]), member)
  else
    redis.call('ZADD', due, forget_at, member)
  end
  keep_alive(forget_at)
  return true
end
-- Moves up to WORK entries of the previous layout's index into the new one.
local function migrate()
  if redis.call('EXISTS', legacy) == 0 then return end
  for _, member in ipairs(redis.call('ZRANGE', legacy, 0, WORK - 1)) do
    adopt(id_of(member))
    redis.call('ZREM', legacy, member)
  end
end
-- An approval's state as of now (an open one past its expiry becomes expired); nil if none.
local function settle(id)
  if not adopt(id) then return nil end
  local key = P .. id
  local f = redis.call('HMGET', key, 'state', 'expires', 'member')
  local state = f[1]
  if state and open(state) and now_ms >= tonumber(f[2]) then
    move(key, f[3], state, 'expired')
    state = 'expired'
  end
  return state
end
-- Up to WORK approvals that are due: open ones past their expiry expire, finished ones past
-- their retention are forgotten.
local function settle_due()
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', now_ms, 'LIMIT', 0, WORK)) do
    local key = P .. id_of(member)
    local f = redis.call('HMGET', key, 'state', 'expires', 'forget')
    if not f[1] or now_ms >= tonumber(f[3]) then
      forget(member)
    elseif open(f[1]) and now_ms >= tonumber(f[2]) then
      move(key, member, f[1], 'expired')
    elseif open(f[1]) then
      redis.call('ZADD', due, tonumber(f[2]), member)
    else
      redis.call('ZADD', due, tonumber(f[3]), member)
    end
  end
end
-- The tenant's oldest finished approval: the earliest head of the finished states' sets.
local function oldest_finished()
  local best
  for _, state in ipairs(FINISHED) do
    local head = redis.call('ZRANGE', at(state), 0, 0)[1]
    if head and (not best or head < best) then best = head end
  end
  return best
end
local function totals()
  local u = redis.call('HMGET', usage, 'count', 'bytes')
  return tonumber(u[1]) or 0, tonumber(u[2]) or 0
end
"#;

/// ARGV: prefix, id, ttl ms, retention ms, max count, max bytes, its size, then its fields as
/// name, value pairs. Makes room by forgetting the tenant's oldest finished approvals (at most
/// WORK): {0, 'open'} when only open ones are left, {0, 'busy'} when WORK were not enough,
/// {1, created, expires} once created.
const CREATE: &str = r#"
local id, ttl, retention = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local max_count, max_bytes, size = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
migrate()
settle_due()
local count, bytes = totals()
local evicted = 0
while count >= max_count or bytes + size > max_bytes do
  local victim = oldest_finished()
  if not victim then return {0, 'open'} end
  if evicted == WORK then return {0, 'busy'} end
  forget(victim)
  evicted = evicted + 1
  count, bytes = totals()
end
local key = P .. id
local expires = now_ms + ttl
local forget_at = expires + retention
local member = string.format('%015d', now_ms) .. ':' .. id
redis.call('HSET', key, 'id', id, 'created', now_ms, 'expires', expires, 'forget', forget_at,
  'member', member, 'state', 'pending', 'bytes', size, unpack(ARGV, 8))
redis.call('PEXPIREAT', key, forget_at + retention)
redis.call('ZADD', at('pending'), 0, member)
redis.call('ZADD', due, expires, member)
redis.call('HSET', sizes, id, size)
redis.call('HINCRBY', usage, 'count', 1)
redis.call('HINCRBY', usage, 'bytes', size)
keep_alive(forget_at + retention)
return {1, now_ms, expires}
"#;

/// ARGV: prefix, id. Its fields as of now, or {} when there is none.
const LOAD: &str = r#"
if not settle(ARGV[2]) then return {} end
return redis.call('HGETALL', P .. ARGV[2])
"#;

/// ARGV: prefix, id, consumer token. Approved -> used by that token: {'ok'}; otherwise
/// {state, reason} or {'missing'}.
const CONSUME: &str = r#"
local key = P .. ARGV[2]
local state = settle(ARGV[2])
if not state then return {'missing'} end
if state == 'approved' then
  move(key, redis.call('HGET', key, 'member'), 'approved', 'used')
  redis.call('HSET', key, 'used_by', ARGV[3])
  return {'ok'}
end
return {state, redis.call('HGET', key, 'reason') or ''}
"#;

/// ARGV: prefix, id, consumer token ('' for the caller whose consume just succeeded). Used ->
/// approved (its call never reached the backend), only if that token used it.
const RELEASE: &str = r#"
local key = P .. ARGV[2]
if not adopt(ARGV[2]) then return 1 end
local f = redis.call('HMGET', key, 'state', 'used_by', 'member')
if f[1] == 'used' and (ARGV[3] == '' or f[2] == ARGV[3]) then
  move(key, f[3], 'used', 'approved')
end
return 1
"#;

/// ARGV: prefix, id, approver, 1 to approve or 0 to reject, reason, bytes held for a decision.
/// {'ok', fields} | {'missing'} | {'self'} | {'not_pending', state}.
const DECIDE: &str = r#"
local id = ARGV[2]
local key = P .. id
local state = settle(id)
if not state then return {'missing'} end
if redis.call('HGET', key, 'subject') == ARGV[3] then return {'self'} end
if state ~= 'pending' then return {'not_pending', state} end
local decided = 'rejected'
if ARGV[4] == '1' then decided = 'approved' end
move(key, redis.call('HGET', key, 'member'), 'pending', decided)
redis.call('HSET', key, 'decided_by', ARGV[3], 'reason', ARGV[5], 'decided', now_ms)
local extra = #ARGV[3] + #ARGV[5] - tonumber(ARGV[6])
if extra > 0 then
  redis.call('HINCRBY', key, 'bytes', extra)
  redis.call('HINCRBY', sizes, id, extra)
  redis.call('HINCRBY', usage, 'bytes', extra)
end
return {'ok', redis.call('HGETALL', key)}
"#;

/// ARGV: prefix, state wanted, page size, index member to start after ('' from the start),
/// most entries to read, `newest` for newest first (oldest first otherwise). {more (0/1),
/// member the next page starts after, approvals' fields...}.
const LIST: &str = r#"
migrate()
settle_due()
local want, page, limit = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[5])
local members
if ARGV[6] == 'newest' then
  local from = '+'
  if ARGV[4] ~= '' then from = '(' .. ARGV[4] end
  members = redis.call('ZRANGE', at(want), from, '-', 'BYLEX', 'REV', 'LIMIT', 0, limit)
else
  local from = '-'
  if ARGV[4] ~= '' then from = '(' .. ARGV[4] end
  members = redis.call('ZRANGE', at(want), from, '+', 'BYLEX', 'LIMIT', 0, limit)
end
local found, last = {}, ''
for _, member in ipairs(members) do
  local state = settle(id_of(member))
  if not state then
    forget(member)
  elseif state == want then
    if #found == page then
      local reply = {1, last}
      for _, f in ipairs(found) do table.insert(reply, f) end
      return reply
    end
    table.insert(found, redis.call('HGETALL', P .. id_of(member)))
    last = member
  end
end
local more, after = 0, ''
if #members == limit then more, after = 1, members[#members] end
local reply = {more, after}
for _, f in ipairs(found) do table.insert(reply, f) end
return reply
"#;

/// ARGV: prefix, open state to walk, member to start after ('' from the start), then every
/// (tool, version, definition) of the new catalog as `tool\0version\0hash`. Up to WORK open
/// approvals of anything else become invalid. {invalidated, member to go on after ('' at the
/// end)}.
const INVALIDATE: &str = r#"
migrate()
local want = ARGV[2]
local valid = {}
for i = 4, #ARGV do valid[ARGV[i]] = true end
local from = '-'
if ARGV[3] ~= '' then from = '(' .. ARGV[3] end
local members = redis.call('ZRANGE', at(want), from, '+', 'BYLEX', 'LIMIT', 0, WORK)
local n = 0
for _, member in ipairs(members) do
  local key = P .. id_of(member)
  local state = settle(id_of(member))
  if not state then
    forget(member)
  elseif open(state) then
    local f = redis.call('HMGET', key, 'tool', 'version', 'definition')
    if not valid[f[1] .. '\0' .. f[2] .. '\0' .. f[3]] then
      move(key, member, state, 'invalidated')
      redis.call('HSET', key, 'reason',
        'tool ' .. f[1] .. ' version ' .. f[2] .. ' changed or was removed after the approval was requested')
      n = n + 1
    end
  end
end
local after = ''
if #members == WORK then after = members[#members] end
return {n, after}
"#;

/// ARGV: prefix, id. Forgets a pending approval whose creation the sidecar gave up on (nobody
/// was told its id); anything else is left alone. Safe to repeat.
const FORGET: &str = r#"
if settle(ARGV[2]) == 'pending' then
  forget(redis.call('HGET', P .. ARGV[2], 'member'))
end
return 1
"#;

fn script(body: &str) -> Script {
    crate::state::redis::script(&format!("local WORK = {WORK}\n{PRELUDE}{body}"))
}

pub static CREATE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(CREATE));
pub static LOAD_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(LOAD));
pub static CONSUME_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(CONSUME));
pub static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(RELEASE));
pub static DECIDE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(DECIDE));
pub static LIST_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(LIST));
pub static INVALIDATE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(INVALIDATE));
pub static FORGET_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(FORGET));
