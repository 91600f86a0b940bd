//! Emergency denies in Redis: one hash, `<prefix>{emergency}:denies` (deny id -> the deny as
//! JSON), changed by scripts that also publish on `<prefix>emergency_denies`. Every sidecar
//! subscribes and reads the hash again on each message, and every few seconds regardless (a
//! message missed while its subscription was being made again; a Redis Cluster, where this
//! reads every second instead of subscribing).

use std::{sync::LazyLock, time::Duration};

use futures::StreamExt;
use redis::Script;
use tokio_util::sync::CancellationToken;

use super::{DenyError, EmergencyDenies, EmergencyDeny, MAX_DENIES};
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

static SET: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  return {'TOO_MANY'}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PUBLISH', ARGV[4], ARGV[1])
return {'OK'}
"#,
    )
});

static CLEAR: LazyLock<Script> = LazyLock::new(|| {
    script(
        r#"
local deny = redis.call('HGET', KEYS[1], ARGV[1])
if not deny then
  return {}
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[1])
return {deny}
"#,
    )
});

fn key(redis: &Redis) -> String {
    redis.key("emergency", format_args!("denies"))
}

fn channel(redis: &Redis) -> String {
    redis.channel("emergency_denies")
}

pub(super) async fn set(redis: &Redis, deny: &EmergencyDeny) -> Result<(), DenyError> {
    let json = serde_json::to_string(deny)
        .map_err(|err| DenyError::Unavailable(StateError::Malformed(err.to_string())))?;
    let op = Op::new(&SET)
        .key(key(redis))
        .arg(&deny.id)
        .arg(json)
        .arg(MAX_DENIES)
        .arg(channel(redis));
    let reply = redis
        .invoke(Concern::EmergencyDenies, &op)
        .await
        .and_then(Reply::new)
        .map_err(DenyError::Unavailable)?;
    match reply.text(0).map_err(DenyError::Unavailable)?.as_str() {
        "OK" => Ok(()),
        "TOO_MANY" => Err(DenyError::TooMany),
        other => Err(DenyError::Unavailable(StateError::Malformed(format!(
            "unexpected answer {other:?}"
        )))),
    }
}

/// Takes a deny out; the deny, if this call took it out.
pub(super) async fn clear(redis: &Redis, id: &str) -> Result<Option<EmergencyDeny>, DenyError> {
    let op = Op::new(&CLEAR).key(key(redis)).arg(id).arg(channel(redis));
    let reply = redis
        .invoke(Concern::EmergencyDenies, &op)
        .await
        .and_then(Reply::new)
        .map_err(DenyError::Unavailable)?;
    if reply.is_empty() {
        return Ok(None);
    }
    let json = reply.text(0).map_err(DenyError::Unavailable)?;
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
