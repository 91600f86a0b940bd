//! Flow scopes in Redis: one hash per scope, `<prefix>{tenant}:flow:<scope>`, label -> the calls
//! that brought it (JSON, at most [`MAX_SOURCES_PER_LABEL`]), expiring a window after its last
//! labelled call, and one sorted set of each tenant's scopes (`<prefix>{tenant}:flow_scopes`)
//! that bounds how many it keeps. One script adds a call's labels, so concurrent calls on
//! several sidecars never lose one.

use std::{sync::LazyLock, time::Duration};

use redis::Script;

use super::{MAX_SOURCES_PER_LABEL, ScopeKey, Seen, Source};
use crate::state::{
    Concern, Redis,
    redis::{Op, Reply, StateError, script},
};

/// KEYS: the scope's hash, the tenant's scopes (a sorted set of their keys by last labelled
/// call, in microseconds of Redis's clock, so the sidecars' clocks do not matter). ARGV: window
/// (ms), the source (JSON), the most sources per label, the most scopes of the tenant, then the
/// labels. Entries older than the window (their hashes expired) are dropped; past the bound, the
/// tenant's least recently labelled scopes are deleted.
static RECORD: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local window = tonumber(ARGV[1])
local source = ARGV[2]
local most = tonumber(ARGV[3])
local max_scopes = tonumber(ARGV[4])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
for i = 5, #ARGV do
  local label = ARGV[i]
  local sources = redis.call('HGET', KEYS[1], label)
  local list = sources and cjson.decode(sources) or {}
  if #list < most then
    table.insert(list, cjson.decode(source))
    redis.call('HSET', KEYS[1], label, cjson.encode(list))
  end
end
redis.call('PEXPIRE', KEYS[1], window)
redis.call('ZADD', KEYS[2], now, KEYS[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window * 1000)
local over = redis.call('ZCARD', KEYS[2]) - max_scopes
if over > 0 then
  local gone = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #gone, 2 do redis.call('DEL', gone[i]) end
end
redis.call('PEXPIRE', KEYS[2], window)
return {'OK'}
"#,
    )
});

static READ: LazyLock<Script> = LazyLock::new(|| script("return redis.call('HGETALL', KEYS[1])"));

fn key(redis: &Redis, scope: &ScopeKey) -> String {
    redis.key(&scope.tenant, format_args!("flow:{}", scope.id))
}

fn scopes_key(redis: &Redis, scope: &ScopeKey) -> String {
    redis.key(&scope.tenant, format_args!("flow_scopes"))
}

pub(super) async fn seen(redis: &Redis, scope: &ScopeKey) -> Result<Seen, StateError> {
    let op = Op::new(&READ).key(key(redis, scope));
    let reply = Reply::new(redis.invoke(Concern::Flow, &op).await?)?;
    let mut seen = Seen::new();
    for i in (0..reply.len()).step_by(2) {
        let label = reply.text(i)?;
        let sources: Vec<Source> = serde_json::from_str(&reply.text(i + 1)?)
            .map_err(|err| StateError::Malformed(err.to_string()))?;
        seen.insert(label, sources);
    }
    Ok(seen)
}

pub(super) async fn record(
    redis: &Redis,
    scope: &ScopeKey,
    labels: &[&str],
    source: &Source,
    window: Duration,
    max_scopes: usize,
) -> Result<(), StateError> {
    let source =
        serde_json::to_string(source).map_err(|err| StateError::Malformed(err.to_string()))?;
    let op = Op::new(&RECORD)
        .key(key(redis, scope))
        .key(scopes_key(redis, scope))
        .arg(window.as_millis().max(1))
        .arg(source)
        .arg(MAX_SOURCES_PER_LABEL)
        .arg(max_scopes.max(1))
        .args(labels.iter());
    redis.invoke(Concern::Flow, &op).await.map(|_| ())
}
