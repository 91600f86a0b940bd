//! Idempotency keys shared through Redis: a key claimed on one sidecar is seen by every other,
//! and its stored result outlives restarts. The rules are the in-memory store's: keys scoped to
//! (tenant, subject, agent, tool, key), only final outcomes kept, a write cancelled after its
//! tool started kept as "outcome unknown", per-tenant budgets in entries and bytes.
//!
//! A duplicate that arrives while the first call is still running — on this sidecar or another —
//! polls the key (10 ms, doubling to 200 ms) until the first call's result is stored, for at most
//! the tool's timeout and never past the caller's deadline; if the first is still running then,
//! it gets a retryable `idempotency_in_progress`. A running claim carries a lease (the tool's
//! timeout plus [`LEASE_MARGIN`]): if its sidecar dies, the claim ends with the lease — a
//! read-only tool's key is then claimed anew, a write's is kept as "outcome unknown", since the
//! tool may have run.
//!
//! Keys, under the tenant's hash tag: `idem:<sha256 of subject, agent, tool and key>` (a hash per
//! key), `idem:index` (when each key's window ends), `idem:sizes` (each key's bytes) and
//! `idem:usage` (the tenant's total). The per-tenant budgets hold; the sidecar-wide byte budget
//! is Redis's own `maxmemory`.

use std::{
    sync::{
        Arc, LazyLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use redis::Script;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::{Budget, Key, Stored, outcome_unknown, overloaded, too_large_to_keep};
use crate::{
    error::{Reason, Refusal, Stage},
    settings::RiskLevel,
    state::{
        self, Concern, Redis, StateError,
        redis::{Op, Reply},
    },
};

/// How much longer than its tool's timeout a claim holds when its sidecar goes silent.
pub const LEASE_MARGIN: Duration = Duration::from_secs(5);
/// Polling a running key: the first pause, and the longest.
const FIRST_POLL: Duration = Duration::from_millis(10);
const MAX_POLL: Duration = Duration::from_millis(200);

const PRELUDE: &str = r#"
local entry, index, sizes, usage = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local function forget(prefix, member)
  local b = tonumber(redis.call('HGET', sizes, member)) or 0
  if b > 0 then redis.call('DECRBY', usage, b) end
  redis.call('HDEL', sizes, member)
  redis.call('ZREM', index, member)
  redis.call('DEL', prefix .. member)
end
local function used()
  return tonumber(redis.call('GET', usage)) or 0
end
local function keep_alive(until_ms)
  for _, key in ipairs({index, sizes, usage}) do
    if redis.call('EXISTS', key) == 1 and redis.call('PEXPIRETIME', key) < until_ms then
      redis.call('PEXPIREAT', key, until_ms)
    end
  end
end
-- Stores a final result under this entry for the window.
local function store(member, result, bytes, window, now)
  local old = tonumber(redis.call('HGET', entry, 'bytes')) or 0
  redis.call('HSET', entry, 'state', 'done', 'result', result, 'bytes', bytes)
  redis.call('PEXPIREAT', entry, now + window)
  redis.call('ZADD', index, now + window, member)
  redis.call('HSET', sizes, member, bytes)
  redis.call('INCRBY', usage, bytes - old)
  keep_alive(now + window)
end
"#;

/// KEYS: entry, index, sizes, usage. ARGV: arguments hash, owner token, lease ms, window ms,
/// max entries, max bytes, the entry's bytes, 1 for a write, the "outcome unknown" result and
/// its bytes, the tenant's entry key prefix, this entry's member.
/// {'owner'} | {'done', result} | {'running', ms left on its lease} | {'conflict'} | {'overloaded'}.
const CLAIM: &str = r#"
local now = now_ms
local prefix, member = ARGV[11], ARGV[12]
local window, lease = tonumber(ARGV[4]), tonumber(ARGV[3])
for _, old in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, 64)) do
  forget(prefix, old)
end
local f = redis.call('HMGET', entry, 'args', 'state', 'lease', 'result', 'write')
if f[1] then
  if f[1] ~= ARGV[1] then return {'conflict'} end
  if f[2] == 'done' then return {'done', f[4]} end
  if now < tonumber(f[3]) then return {'running', tonumber(f[3]) - now} end
  -- The owner's lease ran out: its sidecar died or hung. A write may have happened.
  if f[5] == '1' then
    store(member, ARGV[9], tonumber(ARGV[10]), window, now)
    return {'done', ARGV[9]}
  end
  local ends = now + math.max(window, lease)
  redis.call('HSET', entry, 'owner', ARGV[2], 'lease', now + lease)
  redis.call('PEXPIREAT', entry, ends)
  redis.call('ZADD', index, ends, member)
  keep_alive(ends)
  return {'owner'}
end
-- A new claim. Leftovers of an earlier entry under this name (its window ended, and the sweep
-- above did not reach it) are forgotten first, so the tenant's totals stay exact.
if redis.call('HEXISTS', sizes, member) == 1 then forget(prefix, member) end
local base, max_entries, max_bytes = tonumber(ARGV[7]), tonumber(ARGV[5]), tonumber(ARGV[6])
local function over()
  return redis.call('ZCARD', index) >= max_entries or used() + base > max_bytes
end
if over() then
  -- The oldest finished entries make room; so does a running claim whose lease has passed (its
  -- sidecar went silent): nothing holds it any more, and it is as finished as a write whose
  -- outcome is unknown.
  for _, old in ipairs(redis.call('ZRANGE', index, 0, 255)) do
    if not over() then break end
    local g = redis.call('HMGET', prefix .. old, 'state', 'lease')
    if g[1] ~= 'running' or now >= (tonumber(g[2]) or 0) then forget(prefix, old) end
  end
  if over() then return {'overloaded'} end
end
local ends = now + math.max(window, lease)
redis.call('HSET', entry, 'args', ARGV[1], 'state', 'running', 'owner', ARGV[2],
  'lease', now + lease, 'write', ARGV[8], 'bytes', base)
redis.call('PEXPIREAT', entry, ends)
redis.call('ZADD', index, ends, member)
redis.call('HSET', sizes, member, base)
redis.call('INCRBY', usage, base)
keep_alive(ends)
return {'owner'}
"#;

/// KEYS: entry, index, sizes, usage. ARGV: owner token, result, its bytes, the "too large to
/// keep" result, its bytes, window ms, max bytes, the tenant's entry key prefix, this member.
/// Keeps the result if this owner still holds the claim; over the tenant's byte budget, its
/// oldest finished entries go first, then the result is replaced by the "too large" one.
const FINISH: &str = r#"
local now = now_ms
local f = redis.call('HMGET', entry, 'owner', 'state', 'bytes')
if f[1] ~= ARGV[1] or f[2] ~= 'running' then return 'stale' end
local old = tonumber(f[3]) or 0
local result, bytes, max_bytes = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[7])
local prefix, member = ARGV[8], ARGV[9]
if used() - old + bytes > max_bytes then
  for _, other in ipairs(redis.call('ZRANGE', index, 0, 255)) do
    if used() - old + bytes <= max_bytes then break end
    if other ~= member and redis.call('HGET', prefix .. other, 'state') == 'done' then
      forget(prefix, other)
    end
  end
  if used() - old + bytes > max_bytes then result, bytes = ARGV[4], tonumber(ARGV[5]) end
end
store(member, result, bytes, tonumber(ARGV[6]), now)
return 'kept'
"#;

/// KEYS: entry, index, sizes, usage. ARGV: owner token, the tenant's entry key prefix, this
/// member. Forgets a claim this owner still holds: a retry runs the call.
const RELEASE: &str = r#"
local f = redis.call('HMGET', entry, 'owner', 'state')
if f[1] == ARGV[1] and f[2] == 'running' then forget(ARGV[2], ARGV[3]) end
return 1
"#;

/// KEYS: entry, index, sizes, usage. ARGV: arguments hash. Reads what a claim would find,
/// changing nothing (ExplainTool): {'fresh'} | {'conflict'} | {'done', result} | {'running'} |
/// {'lost', 1 for a write} (the owner's lease ran out).
const PEEK: &str = r#"
local now = now_ms
local f = redis.call('HMGET', entry, 'args', 'state', 'lease', 'result', 'write')
if not f[1] then return {'fresh'} end
if f[1] ~= ARGV[1] then return {'conflict'} end
if f[2] == 'done' then return {'done', f[4]} end
if now < tonumber(f[3]) then return {'running'} end
return {'lost', f[5]}
"#;

fn script(body: &str) -> Script {
    state::redis::script(&format!("{PRELUDE}{body}"))
}

static CLAIM_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(CLAIM));
static FINISH_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(FINISH));
static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(RELEASE));
static PEEK_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(PEEK));

/// Idempotency keys in Redis.
pub struct RedisIdempotency {
    redis: Arc<Redis>,
    budget: Budget,
}

/// The outcome of claiming a key.
pub enum SharedClaim<'a> {
    /// Run the call, then [`SharedSlot::finish`] it.
    Owner(SharedSlot<'a>),
    /// A finished result to return as a replay.
    Replay(Stored),
}

/// The four keys of one idempotency key, and its member in the tenant's index.
#[derive(Clone)]
struct Keys {
    entry: String,
    index: String,
    sizes: String,
    usage: String,
    prefix: String,
    member: String,
}

impl RedisIdempotency {
    pub fn new(redis: Arc<Redis>, budget: Budget) -> Self {
        RedisIdempotency { redis, budget }
    }

    fn keys(&self, key: &Key) -> Keys {
        let mut digest = Sha256::new();
        for part in [&key.subject, &key.agent, &key.tool, &key.key] {
            // Length-prefixed, so no two (subject, agent, tool, key) hash alike.
            digest.update((part.len() as u64).to_be_bytes());
            digest.update(part.as_bytes());
        }
        let member = crate::canonical::lower_hex(&digest.finalize());
        let tenant = &key.tenant;
        Keys {
            entry: self.redis.key(tenant, format_args!("idem:{member}")),
            index: self.redis.key(tenant, format_args!("idem:index")),
            sizes: self.redis.key(tenant, format_args!("idem:sizes")),
            usage: self.redis.key(tenant, format_args!("idem:usage")),
            prefix: self.redis.key(tenant, format_args!("idem:")),
            member,
        }
    }

    async fn run(&self, op: &Op) -> Result<Reply, StateError> {
        read(self.redis.invoke(Concern::Idempotency, op).await?)
    }

    /// What claiming `key` would find now, changing nothing; a claim whose sidecar went silent
    /// reads as a claim would take it over (a write's outcome unknown, a read-only tool fresh).
    pub async fn peek(
        &self,
        key: &Key,
        arguments_sha256: &str,
        tool_version: &str,
    ) -> Result<super::Peek, Refusal> {
        let keys = self.keys(key);
        let reply = self
            .run(&keys.op(&PEEK_SCRIPT).arg(arguments_sha256))
            .await
            .map_err(unavailable)?;
        Ok(match reply.text(0).map_err(unavailable)?.as_str() {
            "conflict" => super::Peek::Conflict,
            "done" => super::Peek::Replay(
                decode(&reply.text(1).map_err(unavailable)?).map_err(unavailable)?,
            ),
            "running" => super::Peek::InFlight,
            "lost" if reply.text(1).is_ok_and(|write| write == "1") => {
                super::Peek::Replay(Stored {
                    result: Err(outcome_unknown(&key.key)),
                    tool_version: tool_version.to_owned(),
                })
            }
            _fresh => super::Peek::Fresh,
        })
    }

    /// Claims `key`: the right to run the call, a stored result, or — after waiting for a
    /// running first call until `wait_until` — `idempotency_in_progress`.
    #[expect(
        clippy::too_many_arguments,
        reason = "the call's key, hash, deadlines and lease, as the memory store takes them"
    )]
    pub async fn claim<'a>(
        &'a self,
        key: Key,
        arguments_sha256: &str,
        risk_level: RiskLevel,
        tool_version: &str,
        started: &'a AtomicBool,
        lease: Duration,
        wait_until: Instant,
    ) -> Result<SharedClaim<'a>, Refusal> {
        let keys = self.keys(&key);
        let owner = uuid::Uuid::new_v4().simple().to_string();
        let write = risk_level != RiskLevel::ReadOnly;
        let unknown = encode(&Stored {
            result: Err(outcome_unknown(&key.key)),
            tool_version: tool_version.to_owned(),
        });
        let base = key.entry_bytes();
        let op = keys.op(&CLAIM_SCRIPT).args([
            arguments_sha256,
            &owner,
            &millis(lease).to_string(),
            &millis(self.budget.window).to_string(),
            &self.budget.max_entries_per_tenant.to_string(),
            &self.budget.max_bytes_per_tenant.to_string(),
            &base.to_string(),
            if write { "1" } else { "0" },
            &unknown.0,
            &(base + unknown.1).to_string(),
            &keys.prefix,
            &keys.member,
        ]);
        let mut pause = FIRST_POLL;
        // Bounded by `wait_until` in time; the count bounds it whatever the clock does.
        for _ in 0..10_000 {
            let claimed_at = Instant::now();
            let reply = match self.run(&op).await {
                Ok(reply) => reply,
                Err(err) => {
                    if matches!(err, StateError::Timeout(_)) {
                        // The claim may have been written just before the sidecar gave up
                        // (a later start does nothing). This call never runs the tool, so the
                        // claim is released — while its lease lasts, after which it is taken
                        // over anyway.
                        self.redis.retry_later(
                            Concern::Idempotency,
                            keys.release(&owner),
                            claimed_at + lease,
                            "release a claim that timed out",
                        );
                    }
                    return Err(unavailable(err));
                }
            };
            match reply.text(0).map_err(unavailable)?.as_str() {
                "owner" => {
                    return Ok(SharedClaim::Owner(SharedSlot {
                        store: self,
                        keys,
                        owner,
                        key: key.key,
                        finished: false,
                        started,
                        write,
                        tool_version: tool_version.to_owned(),
                        base,
                        lease_ends: claimed_at + lease,
                    }));
                }
                "done" => {
                    let stored =
                        decode(&reply.text(1).map_err(unavailable)?).map_err(unavailable)?;
                    return Ok(SharedClaim::Replay(stored));
                }
                "conflict" => {
                    return Err(super::conflict(&key.key));
                }
                "overloaded" => return Err(overloaded()),
                _running => {
                    // The last look is at `wait_until` itself: giving up when the next pause
                    // would overshoot it turned duplicates away while the first was finishing.
                    let now = Instant::now();
                    if now >= wait_until {
                        break;
                    }
                    tokio::time::sleep(pause.min(wait_until - now)).await;
                    pause = (pause * 2).min(MAX_POLL);
                }
            }
        }
        Err(Refusal::new(
            Stage::Idempotency,
            Reason::IdempotencyInProgress,
            format!(
                "the first call with idempotency key {:?} is still running; retry once it has finished to get its result",
                key.key
            ),
        ))
    }
}

impl Keys {
    /// A script call on this key's four keys.
    fn op(&self, script: &'static Script) -> Op {
        Op::new(script)
            .key(self.entry.as_str())
            .key(self.index.as_str())
            .key(self.sizes.as_str())
            .key(self.usage.as_str())
    }

    /// Forgets the claim if `owner` still holds it (safe to repeat).
    fn release(&self, owner: &str) -> Op {
        self.op(&RELEASE_SCRIPT)
            .arg(owner)
            .arg(&self.prefix)
            .arg(&self.member)
    }
}

/// The right to run a keyed call. Dropped unfinished (the call was cancelled), it releases the
/// key — unless a write's tool had started: then its outcome is unknown and kept as such. The
/// drop cannot wait, so that is sent from a task of its own.
pub struct SharedSlot<'a> {
    store: &'a RedisIdempotency,
    keys: Keys,
    owner: String,
    key: String,
    finished: bool,
    started: &'a AtomicBool,
    write: bool,
    tool_version: String,
    /// The entry's bytes before a result, as the in-memory store counts them.
    base: usize,
    /// When the claim ends by itself if nothing settles it (as this sidecar reckons it).
    lease_ends: Instant,
}

impl SharedSlot<'_> {
    /// Keeps a final result for replays, or releases the key for a retryable one. If Redis
    /// does not answer in time, the same is tried again from a task of its own while the lease
    /// lasts (both are safe to repeat: they act only while this owner holds the claim).
    pub async fn finish(mut self, result: &Result<String, Refusal>) {
        self.finished = true;
        let op = match result {
            Err(refusal) if refusal.retryable => self.keys.release(&self.owner),
            _ => self.keep(Stored {
                result: result.clone(),
                tool_version: self.tool_version.clone(),
            }),
        };
        if let Err(err) = self.store.redis.invoke(Concern::Idempotency, &op).await {
            if matches!(err, StateError::Timeout(_)) {
                self.store.redis.retry_later(
                    Concern::Idempotency,
                    op,
                    self.lease_ends,
                    "settle an idempotent call",
                );
            } else {
                // The claim then ends with its lease: a write is kept as "outcome unknown".
                tracing::warn!(error = %err, "could not store an idempotent call's outcome in the shared state");
            }
        }
    }

    /// The script that keeps `stored` under this claim, within the tenant's byte budget.
    fn keep(&self, stored: Stored) -> Op {
        let base = self.base;
        let budget = self.store.budget;
        let too_large = too_large_to_keep(&self.key, stored.clone());
        let stored = if base + stored.bytes() > budget.max_bytes_per_tenant {
            too_large.clone()
        } else {
            stored
        };
        let (result, result_bytes) = encode(&stored);
        let (fallback, fallback_bytes) = encode(&too_large);
        self.keys.op(&FINISH_SCRIPT).args([
            self.owner.as_str(),
            &result,
            &(base + result_bytes).to_string(),
            &fallback,
            &(base + fallback_bytes).to_string(),
            &millis(budget.window).to_string(),
            &budget.max_bytes_per_tenant.to_string(),
            &self.keys.prefix,
            &self.keys.member,
        ])
    }
}

impl Drop for SharedSlot<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // The drop cannot wait: the outcome is sent (and retried) from a task of its own.
        let (op, what) = if self.started.load(Ordering::Acquire) && self.write {
            let unknown = Stored {
                result: Err(outcome_unknown(&self.key)),
                tool_version: self.tool_version.clone(),
            };
            (
                self.keep(unknown),
                "record an idempotent write cancelled after it started",
            )
        } else {
            (
                self.keys.release(&self.owner),
                "release a cancelled idempotent call's key",
            )
        };
        self.store
            .redis
            .retry_later(Concern::Idempotency, op, self.lease_ends, what);
    }
}

/// A script's reply as an array: single answers ('kept', 'stale', 1) are wrapped, so every
/// reply reads alike.
fn read(value: redis::Value) -> Result<Reply, StateError> {
    match value {
        redis::Value::Array(_) => Reply::new(value),
        other => Reply::new(redis::Value::Array(vec![other])),
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn unavailable(err: StateError) -> Refusal {
    Refusal::new(
        Stage::Idempotency,
        Reason::StateUnavailable,
        format!(
            "the idempotency key cannot be checked: {}; the call was not run, retry shortly",
            err.for_caller()
        ),
    )
}

/// A stored result as kept in Redis.
#[derive(Serialize, Deserialize)]
struct Record {
    version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    ok: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<RecordedRefusal>,
}

#[derive(Serialize, Deserialize)]
struct RecordedRefusal {
    stage: String,
    reason: String,
    message: String,
    detail: Option<String>,
    recorded_detail: Option<String>,
    retryable: bool,
    retry_after_ms: Option<u64>,
    approval_id: Option<String>,
}

/// The record's JSON and the bytes the budgets count for it (as in memory).
fn encode(stored: &Stored) -> (String, usize) {
    let record = match &stored.result {
        Ok(output) => Record {
            version: stored.tool_version.clone(),
            ok: Some(output.clone()),
            error: None,
        },
        Err(refusal) => Record {
            version: stored.tool_version.clone(),
            ok: None,
            error: Some(RecordedRefusal {
                stage: refusal.stage.as_str().to_owned(),
                reason: refusal.reason.code().to_owned(),
                message: refusal.message.clone(),
                detail: refusal.detail.clone(),
                recorded_detail: refusal.recorded_detail.clone(),
                retryable: refusal.retryable,
                retry_after_ms: refusal.retry_after.map(millis),
                approval_id: refusal.approval_id.clone(),
            }),
        },
    };
    (
        serde_json::to_string(&record).unwrap_or_default(),
        stored.bytes(),
    )
}

fn decode(text: &str) -> Result<Stored, StateError> {
    let bad = |why: &str| StateError::Malformed(format!("stored idempotency result: {why}"));
    let record: Record = serde_json::from_str(text).map_err(|err| bad(&err.to_string()))?;
    let result = match (record.ok, record.error) {
        (Some(output), None) => Ok(output),
        (None, Some(e)) => Err(Refusal {
            stage: Stage::from_name(&e.stage).ok_or_else(|| bad("unknown stage"))?,
            reason: Reason::from_code(&e.reason).ok_or_else(|| bad("unknown reason"))?,
            message: e.message,
            detail: e.detail,
            recorded_detail: e.recorded_detail,
            retryable: e.retryable,
            retry_after: e.retry_after_ms.map(Duration::from_millis),
            approval_id: e.approval_id,
        }),
        _ => return Err(bad("neither a result nor a refusal")),
    };
    Ok(Stored {
        result,
        tool_version: record.version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_results_read_back_as_they_were() {
        let refusal = Refusal::new(Stage::Execute, Reason::ToolFailed, "it failed")
            .with_retryable(false)
            .with_approval_id("apr_1");
        let refusal = Refusal {
            detail: Some("backend said no".into()),
            ..refusal
        };
        for result in [Ok("{\"a\":1}".to_owned()), Err(refusal)] {
            let stored = Stored {
                result,
                tool_version: "2".into(),
            };
            let (json, bytes) = encode(&stored);
            assert_eq!(bytes, stored.bytes());
            let back = decode(&json).unwrap();
            assert_eq!(back.result, stored.result);
            assert_eq!(back.tool_version, "2");
        }
        assert!(decode("{\"version\":\"1\"}").is_err());
    }
}
