//! Budgets in Redis: one hash per budget (`calls`, `cost`, `first_ms` and `tool:<name>` for the
//! tools counted apart), expiring `keep` after its last call. A call's budgets are checked and
//! spent by the quotas' script ([`crate::limits`]), with its quotas, in one round trip: the two
//! Lua parts below are spliced into it. Times are Redis's own (`TIME`), so sidecar clocks do
//! not matter for the wall time.

use std::sync::LazyLock;

use redis::Script;

use super::{Charge, Exhausted, Limit, Usage};
use crate::state::{
    Concern, Redis,
    redis::{Op, Reply, StateError, script},
};

/// Arguments each budget key takes in the quotas' script.
pub const ARGS_PER_BUDGET: usize = 7;

/// Checks the budgets: KEYS[nq + j] for j = 1..nb, each with [`ARGS_PER_BUDGET`] arguments from
/// ARGV[b] (`b = base + 7 (j - 1)`): most calls, most cost (-1: none), the call's cost, the
/// tool's field ('' when not counted apart), the most calls of it, the wall time in ms (-1:
/// none), and how long to keep the hash in ms. Answers {2, j, limit, used, max} for the first
/// with no room (limit 1 calls, 2 cost, 3 the tool's calls, 4 wall time).
pub const CHECK_LUA: &str = r#"
for j = 1, nb do
  local k = KEYS[nq + j]
  local b = base + 7 * (j - 1)
  local max_calls = tonumber(ARGV[b])
  local max_cost = tonumber(ARGV[b + 1])
  local cost = tonumber(ARGV[b + 2])
  local tool = ARGV[b + 3]
  local max_tool = tonumber(ARGV[b + 4])
  local wall = tonumber(ARGV[b + 5])
  local v = redis.call('HMGET', k, 'calls', 'cost', 'first_ms', tool ~= '' and tool or 'calls')
  local calls = tonumber(v[1] or 0)
  local spent = tonumber(v[2] or 0)
  local first = tonumber(v[3] or now_ms)
  local tool_calls = tonumber(v[4] or 0)
  if wall >= 0 and now_ms - first > wall then return {2, j, 4, now_ms - first, wall} end
  if max_calls >= 0 and calls + 1 > max_calls then return {2, j, 1, calls, max_calls} end
  if max_cost >= 0 and spent + cost > max_cost then return {2, j, 2, spent, max_cost} end
  if tool ~= '' and tool_calls + 1 > max_tool then return {2, j, 3, tool_calls, max_tool} end
end
"#;

/// Spends what [`CHECK_LUA`] checked.
pub const COMMIT_LUA: &str = r#"
for j = 1, nb do
  local k = KEYS[nq + j]
  local b = base + 7 * (j - 1)
  redis.call('HINCRBY', k, 'calls', 1)
  redis.call('HINCRBY', k, 'cost', ARGV[b + 2])
  if ARGV[b + 3] ~= '' then redis.call('HINCRBY', k, ARGV[b + 3], 1) end
  redis.call('HSETNX', k, 'first_ms', now_ms)
  redis.call('PEXPIRE', k, ARGV[b + 6])
end
"#;

/// Gives back a call's spending: per key, its cost and tool field (ARGV, two each). A hash that
/// expired meanwhile stays gone.
static GIVE_BACK: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('HINCRBY', KEYS[i], 'calls', -1)
    redis.call('HINCRBY', KEYS[i], 'cost', -tonumber(ARGV[2 * i - 1]))
    if ARGV[2 * i] ~= '' then redis.call('HINCRBY', KEYS[i], ARGV[2 * i], -1) end
  end
end
return {'OK'}
"#,
    )
});

/// Each key's calls, cost, first call and the tool field (ARGV, one each).
static USAGE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local out = {}
for i = 1, #KEYS do
  local field = ARGV[i] ~= '' and ARGV[i] or 'calls'
  local v = redis.call('HMGET', KEYS[i], 'calls', 'cost', 'first_ms', field)
  out[i] = {tonumber(v[1] or 0), tonumber(v[2] or 0), tonumber(v[3] or -1), tonumber(v[4] or 0)}
end
return out
"#,
    )
});

/// The budget's hash.
pub fn key(redis: &Redis, charge: &Charge) -> String {
    let kind = match charge.key.kind {
        super::Kind::Run => "run",
        super::Kind::CallerDaily => "day",
        super::Kind::Handoff => "handoff",
    };
    redis.key(
        &charge.key.tenant,
        format_args!("budget:{kind}:{}", charge.key.id),
    )
}

fn tool_field(charge: &Charge) -> String {
    charge
        .tool
        .as_ref()
        .map(|(tool, _)| format!("tool:{tool}"))
        .unwrap_or_default()
}

fn limit(value: Option<u64>) -> String {
    value.map_or_else(|| "-1".to_owned(), |v| v.to_string())
}

/// Adds `charge`'s key and arguments to a call of the quotas' script.
pub fn push(op: Op, redis: &Redis, charge: &Charge) -> Op {
    let wall = charge
        .budget
        .max_wall_time
        .map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX));
    op.key(key(redis, charge))
        .arg(limit(charge.budget.max_calls))
        .arg(limit(charge.budget.max_cost))
        .arg(charge.cost)
        .arg(tool_field(charge))
        .arg(limit(charge.tool.as_ref().map(|(_, max)| *max)))
        .arg(limit(wall))
        .arg(charge.keep.as_millis().max(1))
}

/// The budget refusal the script answered ({2, j, limit, used, max}).
pub fn exhausted(charges: &[Charge], reply: &Reply) -> Result<Exhausted, StateError> {
    let malformed = || StateError::Malformed("no such budget".into());
    let index = usize::try_from(reply.int(1)?).map_err(|_| malformed())?;
    let charge = charges.get(index.wrapping_sub(1)).ok_or_else(malformed)?;
    let limit = match reply.int(2)? {
        1 => Limit::Calls,
        2 => Limit::Cost,
        3 => Limit::ToolCalls(
            charge
                .tool
                .as_ref()
                .map(|(tool, _)| tool.clone())
                .unwrap_or_default(),
        ),
        4 => Limit::WallTime,
        _ => return Err(malformed()),
    };
    Ok(Exhausted {
        kind: charge.key.kind,
        limit,
        used: u64::try_from(reply.int(3)?).unwrap_or(0),
        max: u64::try_from(reply.int(4)?).unwrap_or(0),
        whose: charge.whose.clone(),
    })
}

pub(super) async fn give_back(redis: &Redis, charges: &[Charge]) -> Result<(), StateError> {
    let mut op = Op::new(&GIVE_BACK);
    for charge in charges {
        op = op
            .key(key(redis, charge))
            .arg(charge.cost)
            .arg(tool_field(charge));
    }
    redis.invoke(Concern::RateLimits, &op).await.map(|_| ())
}

pub(super) async fn usage(redis: &Redis, charges: &[Charge]) -> Result<Vec<Usage>, StateError> {
    let mut op = Op::new(&USAGE);
    for charge in charges {
        op = op.key(key(redis, charge)).arg(tool_field(charge));
    }
    let reply = Reply::new(redis.invoke(Concern::RateLimits, &op).await?)?;
    (0..charges.len())
        .map(|i| {
            let one = reply.nested(i)?;
            let first = one.int(2)?;
            Ok(Usage {
                calls: u64::try_from(one.int(0)?).unwrap_or(0),
                cost: u64::try_from(one.int(1)?).unwrap_or(0),
                first_ms: (first >= 0).then_some(first),
                tool_calls: u64::try_from(one.int(3)?).unwrap_or(0),
            })
        })
        .collect()
}
