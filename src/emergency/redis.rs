//! Emergency denies in Redis: one hash, `<prefix>{emergency}:denies` (deny id -> the deny as
//! JSON), changed by scripts that also publish on `<prefix>emergency_denies`. Every sidecar
//! subscribes and reads the hash again on each message, and every few seconds regardless (a
//! message missed while its subscription was being made again; a Redis Cluster, where this
//! reads every second instead of subscribing).

use std::{sync::LazyLock, time::Duration};

use futures::StreamExt;
use redis::Script;
use tokio_util::sync::CancellationToken;

use super::{
    Authority, DenyError, EmergencyDenies, EmergencyDeny, MAX_DENIES, MAX_DENIES_PER_TENANT,
    RESERVED_FOR_PLATFORM,
};
use crate::state::{
    Concern, Redis,
    redis::{Op, Reply, StateError, script},
};

/// How often the hash is read again besides on messages.
const RECONCILE: Duration = Duration::from_secs(5);
/// On a cluster, with no subscription.
const RECONCILE_UNSUBSCRIBED: Duration = Duration::from_secs(1);
/// The pause before subscribing again after the subscription ended.
const RESUBSCRIBE: Duration = Duration::from_secs(1);

/// ARGV: id, the deny as JSON, the channel, then the checks [`super::room`] makes: the most
/// denies in all, and for a tenant's admin (ARGV[5], blank for the platform) the most one
/// tenant's admins may set and the most all tenants' may.
static SET: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  local denies = redis.call('HVALS', KEYS[1])
  if #denies >= tonumber(ARGV[4]) then
    return {'TOO_MANY'}
  end
  if ARGV[5] ~= '' then
    local tenants, this_tenant = 0, 0
    for _, json in ipairs(denies) do
      local ok, deny = pcall(cjson.decode, json)
      -- What cannot be read, or says nothing, counts as the platform's (as it is read).
      if ok and type(deny) == 'table' and deny['set_by_platform'] == false then
        tenants = tenants + 1
        if deny['tenant'] == ARGV[5] then
          this_tenant = this_tenant + 1
        end
      end
    end
    if this_tenant >= tonumber(ARGV[6]) then
      return {'TOO_MANY_FOR_TENANT'}
    end
    if tenants >= tonumber(ARGV[7]) then
      return {'TOO_MANY'}
    end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return {'OK'}
"#,
    )
});

/// ARGV: id, the channel, and for a tenant's admin the tenant (blank for the platform): the
/// deny is taken out only when [`super::Authority`] lets it be, in the same step as it is read.
static CLEAR: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local json = redis.call('HGET', KEYS[1], ARGV[1])
if not json then
  return {}
end
if ARGV[3] ~= '' then
  local ok, deny = pcall(cjson.decode, json)
  if not ok or type(deny) ~= 'table' or deny['tenant'] ~= ARGV[3] then
    return {'NOT_FOUND'}
  end
  if deny['set_by_platform'] ~= false then
    return {'SET_BY_PLATFORM'}
  end
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[1])
return {'CLEARED', json}
"#,
    )
});

/// The tenant a script is told of: blank for the platform.
fn tenant_of(authority: &Authority) -> &str {
    match authority {
        Authority::Platform => "",
        Authority::Tenant(tenant) => tenant,
    }
}

fn key(redis: &Redis) -> String {
    redis.key("emergency", format_args!("denies"))
}

fn channel(redis: &Redis) -> String {
    redis.channel("emergency_denies")
}

pub(super) async fn set(
    redis: &Redis,
    deny: &EmergencyDeny,
    authority: &Authority,
) -> Result<(), DenyError> {
    let json = serde_json::to_string(deny)
        .map_err(|err| DenyError::Unavailable(StateError::Malformed(err.to_string())))?;
    let op = Op::new(&SET)
        .key(key(redis))
        .arg(&deny.id)
        .arg(json)
        .arg(channel(redis))
        .arg(MAX_DENIES)
        .arg(tenant_of(authority))
        .arg(MAX_DENIES_PER_TENANT)
        .arg(MAX_DENIES - RESERVED_FOR_PLATFORM);
    let reply = redis
        .invoke(Concern::EmergencyDenies, &op)
        .await
        .and_then(Reply::new)
        .map_err(DenyError::Unavailable)?;
    match reply.text(0).map_err(DenyError::Unavailable)?.as_str() {
        "OK" => Ok(()),
        "TOO_MANY" => Err(DenyError::TooMany),
        "TOO_MANY_FOR_TENANT" => Err(DenyError::TooManyForTenant),
        other => Err(DenyError::Unavailable(StateError::Malformed(format!(
            "unexpected answer {other:?}"
        )))),
    }
}

/// Takes a deny out if `authority` may; the deny, if this call took it out.
pub(super) async fn clear(
    redis: &Redis,
    id: &str,
    authority: &Authority,
) -> Result<Option<EmergencyDeny>, DenyError> {
    let op = Op::new(&CLEAR)
        .key(key(redis))
        .arg(id)
        .arg(channel(redis))
        .arg(tenant_of(authority));
    let reply = redis
        .invoke(Concern::EmergencyDenies, &op)
        .await
        .and_then(Reply::new)
        .map_err(DenyError::Unavailable)?;
    if reply.is_empty() {
        return Ok(None);
    }
    match reply.text(0).map_err(DenyError::Unavailable)?.as_str() {
        "CLEARED" => {}
        "NOT_FOUND" => return Ok(None),
        "SET_BY_PLATFORM" => return Err(DenyError::SetByPlatform(id.to_owned())),
        other => {
            return Err(DenyError::Unavailable(StateError::Malformed(format!(
                "unexpected answer {other:?}"
            ))));
        }
    }
    let json = reply.text(1).map_err(DenyError::Unavailable)?;
    serde_json::from_str(&json)
        .map(Some)
        .map_err(|err| DenyError::Unavailable(StateError::Malformed(err.to_string())))
}

/// Every deny in the hash; one that cannot be read is logged and skipped. `HVALS`, a plain
/// read: each deny holds its id.
pub(super) async fn read_all(redis: &Redis) -> Result<Vec<EmergencyDeny>, StateError> {
    let mut command = redis::cmd("HVALS");
    command.arg(key(redis));
    let reply = Reply::new(redis.read(Concern::EmergencyDenies, command).await?)?;
    // Never more than the bound: the set script keeps it.
    let mut denies = Vec::new();
    for i in (0..reply.len()).take(MAX_DENIES) {
        let json = reply.text(i)?;
        match serde_json::from_str::<EmergencyDeny>(&json) {
            Ok(deny) => denies.push(deny),
            Err(err) => {
                tracing::error!(error = %err, "an emergency deny in the shared state cannot be read; skipped")
            }
        }
    }
    Ok(denies)
}

/// Reads the hash at once, on every message and every [`RECONCILE`], until `stop`.
pub(super) async fn follow(redis: &Redis, denies: &EmergencyDenies, stop: CancellationToken) {
    let channel = channel(redis);
    loop {
        // Subscribe first, then read: a change made in between is in what is read.
        let subscription = match redis.subscribe(&channel).await {
            Ok(subscription) => subscription,
            Err(err) => {
                tracing::warn!(error = %err, "cannot subscribe to emergency deny changes; reading them every second until it can");
                None
            }
        };
        denies.reconcile().await;
        let every = match subscription {
            Some(_) => RECONCILE,
            None => RECONCILE_UNSUBSCRIBED,
        };
        let mut reconcile = tokio::time::interval(every);
        reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        reconcile.tick().await;
        let Some(messages) = subscription else {
            // No subscription: read on the timer, and try subscribing again now and then.
            for _ in 0..5 {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = reconcile.tick() => denies.reconcile().await,
                }
            }
            continue;
        };
        tokio::pin!(messages);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                message = messages.next() => match message {
                    Some(()) => denies.reconcile().await,
                    None => break,
                },
                _ = reconcile.tick() => denies.reconcile().await,
            }
        }
        tracing::warn!("the emergency deny subscription ended; subscribing again");
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(RESUBSCRIBE) => {}
        }
    }
}
