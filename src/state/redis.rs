//! The shared Redis: multiplexed connections that reconnect on their own (to one server, or to
//! every node of a Redis Cluster), one timeout around every operation, Lua scripts sent as
//! EVALSHA (reloaded on NOSCRIPT), key names with the tenant as Redis Cluster hash tag, and
//! whether Redis answers now.
//!
//! Every state change of a concern is one script, so it is atomic across sidecars and costs one
//! round trip. Times come from Redis (`TIME` inside the scripts), so the sidecars' clocks do not
//! matter. Nothing here decides policy; the concerns map a [`StateError`] to their refusals.
//!
//! An operation the sidecar gave up on must not act later: a command already sent when the
//! timeout fires still runs once Redis gets to it (after a pause, a slow script, a full
//! socket). So every script starts with [`GUARD`], and [`Redis::invoke`] passes it the moment the
//! sidecar gives up, in Redis time: a script that starts later does nothing and answers
//! `TOOLGATE_LATE`. Redis time is reckoned from a lower bound of the offset between Redis's
//! clock and ours ([`RedisClock`]), sampled with `TIME` by the health check every second and
//! before the first operation: a script that passes the guard ran before the sidecar gave up.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use redis::{
    Client, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError, Script, ServerErrorKind,
    TlsCertificates, Value,
    aio::{ConnectionManager, ConnectionManagerConfig},
    cluster::{ClusterClientBuilder, ClusterConfig},
    cluster_async::ClusterConnection,
    cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo},
};
use tokio::{sync::watch, time::Instant};

use super::{Concern, metrics::StateMetrics};
use crate::settings::{OnUnavailable, RedisConfig, StateConfig};

/// Why an operation on the shared state did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("the state backend did not answer within {} ms", .0.as_millis())]
    Timeout(Duration),
    #[error("the state backend cannot be reached: {0}")]
    Unreachable(String),
    #[error("the state backend refused the operation: {0}")]
    Refused(String),
    #[error("unexpected answer from the state backend: {0}")]
    Malformed(String),
    #[error("invalid state backend settings: {0}")]
    Settings(String),
}

impl StateError {
    /// What a caller (and the model) is told: no addresses or server text, which stay in the
    /// sidecar's log.
    pub fn for_caller(&self) -> String {
        match self {
            StateError::Timeout(after) => format!(
                "the shared state did not answer within {} ms",
                after.as_millis()
            ),
            StateError::Unreachable(_) => "the shared state cannot be reached".to_owned(),
            StateError::Refused(_) | StateError::Malformed(_) | StateError::Settings(_) => {
                "the shared state refused the operation".to_owned()
            }
        }
    }
}

/// How often an idle sidecar checks that Redis answers (and so recovers readiness on its own),
/// and samples Redis's clock.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// What every script starts with. The sidecar appends its give-up time (Redis time, µs) as the
/// last argument; a script that starts at or after it does nothing, since nobody waits for its
/// answer any more. `now_us` and `now_ms` are Redis's time for the rest of the script.
pub const GUARD: &str = r#"
local give_up = tonumber(table.remove(ARGV))
local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
if not give_up or now_us >= give_up then
  return redis.error_reply('TOOLGATE_LATE the sidecar gave up on this operation before it started')
end
local now_ms = math.floor(now_us / 1000)
"#;

/// The error code of a script that started after its sidecar gave up.
const LATE: &str = "TOOLGATE_LATE";

/// A script of a concern: `body` after the [`GUARD`], so none can run without it.
pub fn script(body: &str) -> Script {
    Script::new(&format!("{GUARD}{body}"))
}

/// One script call: the script, its keys and its arguments (the give-up time is added by
/// [`Redis::invoke`]). Owned, so it can be sent again by a task of its own.
#[derive(Clone)]
pub struct Op {
    script: &'static Script,
    keys: Vec<String>,
    args: Vec<String>,
}

impl Op {
    pub fn new(script: &'static Script) -> Op {
        Op {
            script,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    pub fn key(mut self, key: impl Into<String>) -> Op {
        self.keys.push(key.into());
        self
    }

    pub fn arg(mut self, arg: impl std::fmt::Display) -> Op {
        self.args.push(arg.to_string());
        self
    }

    pub fn args<I: IntoIterator<Item = T>, T: std::fmt::Display>(mut self, args: I) -> Op {
        self.args.extend(args.into_iter().map(|a| a.to_string()));
        self
    }
}

/// Most a sampled offset is taken to drift per second since it was sampled: 1,000 ppm, twice
/// what NTP slews a clock by, for the two clocks together.
const DRIFT_PER_SECOND_US: i64 = 1_000;
/// A sample older than this is taken again before an operation (the health check normally
/// renews it every second).
const MAX_SAMPLE_AGE: Duration = Duration::from_secs(5);

/// Redis's clock as seen from ours: a lower bound of `redis_time - local_time`. A `TIME` answer
/// received at local time `t` was made at or before `t`, so `answer - t` is never more than the
/// true offset; the deadline a script gets (`give_up + bound`) is then at or before the Redis
/// time at which the sidecar gives up. Assumes Redis's clock does not step backwards between
/// samples (NTP slews it; a step back by a person would let late scripts through for as long).
#[derive(Debug)]
struct RedisClock {
    base: Instant,
    bound: Mutex<Option<Bound>>,
}

#[derive(Debug, Clone, Copy)]
struct Bound {
    offset_us: i64,
    at: Instant,
}

impl RedisClock {
    fn new() -> RedisClock {
        RedisClock {
            base: Instant::now(),
            bound: Mutex::new(None),
        }
    }

    fn local_us(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.base).as_micros()).unwrap_or(i64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Bound>> {
        // One assignment per update: a panic cannot leave half a bound.
        self.bound
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes in a `TIME` answer (µs) received at `received`, keeping the tighter of it and the
    /// previous bound (less the drift since).
    fn record(&self, redis_us: i64, received: Instant) {
        let fresh = redis_us.saturating_sub(self.local_us(received));
        let mut bound = self.lock();
        let kept = bound.map(|old| old.offset_us.saturating_sub(drift(old.at, received)));
        *bound = Some(Bound {
            offset_us: kept.map_or(fresh, |kept| kept.max(fresh)),
            at: received,
        });
    }

    /// The Redis time (µs) at or before which `give_up` falls, if a recent enough sample
    /// allows saying so.
    fn deadline_us(&self, give_up: Instant) -> Option<i64> {
        let bound = (*self.lock())?;
        if Instant::now().saturating_duration_since(bound.at) > MAX_SAMPLE_AGE {
            return None;
        }
        Some(
            self.local_us(give_up)
                .saturating_add(bound.offset_us)
                .saturating_sub(drift(bound.at, give_up)),
        )
    }
}

/// The most two clocks may have drifted apart between `from` and `to` (µs, rounded up).
fn drift(from: Instant, to: Instant) -> i64 {
    let elapsed = i64::try_from(to.saturating_duration_since(from).as_micros()).unwrap_or(i64::MAX);
    (elapsed / 1_000_000)
        .saturating_mul(DRIFT_PER_SECOND_US)
        .saturating_add((elapsed % 1_000_000) * DRIFT_PER_SECOND_US / 1_000_000 + 1)
}

/// A connection to Redis: one server (reconnecting by itself), or a cluster (one connection per
/// node, routing each operation by its first key's slot, following MOVED and ASK).
#[derive(Clone)]
enum Link {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Link {
    async fn invoke(&self, op: &Op, give_up_us: i64) -> Result<Value, RedisError> {
        let mut invocation = op.script.prepare_invoke();
        for key in &op.keys {
            invocation.key(key);
        }
        for arg in &op.args {
            invocation.arg(arg);
        }
        invocation.arg(give_up_us);
        match self.clone() {
            Link::Node(mut c) => invocation.invoke_async(&mut c).await,
            Link::Cluster(mut c) => invocation.invoke_async(&mut c).await,
        }
    }

    /// Redis's `TIME` in µs; on a cluster, the earliest of its primaries' (scripts may run on
    /// any of them, and the earliest clock gives the bound that holds for all).
    async fn time_us(&self) -> Result<i64, RedisError> {
        let command = redis::cmd("TIME");
        let answers = match self.clone() {
            Link::Node(mut c) => vec![command.query_async::<Value>(&mut c).await?],
            Link::Cluster(mut c) => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                match c.route_command(command, routing).await? {
                    Value::Map(nodes) => nodes.into_iter().map(|(_, answer)| answer).collect(),
                    single => vec![single],
                }
            }
        };
        answers
            .iter()
            .map(parse_time)
            .reduce(|a, b| Ok(a?.min(b?)))
            .unwrap_or_else(|| Err(malformed_time()))
    }
}

/// A Redis shared by the sidecars that use the same URL and key prefix.
pub struct Redis {
    connections: Vec<Link>,
    next: AtomicUsize,
    timeout: Duration,
    connect_timeout: Duration,
    prefix: String,
    rate_limits_on_unavailable: OnUnavailable,
    /// Whether the last operation or health check got an answer.
    up: watch::Sender<bool>,
    metrics: StateMetrics,
    /// Redis's clock, for the scripts' give-up times.
    clock: RedisClock,
    /// For subscriptions (one server only: on a cluster, changes are found by reading again).
    subscriber: Option<Client>,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The connection info holds the password: never print it.
        f.debug_struct("Redis")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("connections", &self.connections.len())
            .finish_non_exhaustive()
    }
}

/// The connection settings for `config`, credentials included.
pub fn connection_info(config: &RedisConfig) -> Result<ConnectionInfo, StateError> {
    let info = config
        .url
        .as_str()
        .into_connection_info()
        .map_err(|err| StateError::Settings(err.to_string()))?;
    let mut redis = info.redis_settings().clone();
    if let Some(username) = &config.username {
        redis = redis.set_username(username);
    }
    if let Some(password) = &config.password {
        redis = redis.set_password(password.expose());
    }
    Ok(info.set_redis_settings(redis))
}

impl Redis {
    /// Prepares the connections; none is opened until the first operation or health check.
    pub fn connect(
        config: &RedisConfig,
        state: &StateConfig,
        metrics: StateMetrics,
    ) -> Result<Redis, StateError> {
        let info = connection_info(config)?;
        if config.url.scheme() == "rediss" {
            crate::tls::install_crypto_provider();
        }
        let certificates = config.ca_pem.as_ref().map(|pem| TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.clone()),
        });
        let settings = |err: RedisError| StateError::Settings(err.to_string());
        let mut subscriber = None;
        let connections = if config.cluster {
            let mut builder = ClusterClientBuilder::new([info]);
            if let Some(certificates) = certificates {
                builder = builder.certs(certificates);
            }
            // Connects in the background; operations wait for it only up to their timeout.
            let cluster = builder.build().map_err(settings)?;
            vec![Link::Cluster(
                cluster.get_pending_async_connection_with_config(
                    ClusterConfig::new().set_connection_timeout(config.connect_timeout),
                ),
            )]
        } else {
            let client = match certificates {
                Some(certificates) => Client::build_with_tls(info, certificates),
                None => Client::open(info),
            }
            .map_err(settings)?;
            // Reconnects back off from 10 ms to at most 1 s, so a Redis that comes back is used
            // again within about a second; operations never wait for them longer than their
            // timeout.
            let manager_config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_response_timeout(None)
                .set_min_delay(Duration::from_millis(10))
                .set_max_delay(Duration::from_secs(1))
                .set_number_of_retries(3);
            subscriber = Some(client.clone());
            (0..config.connections)
                .map(|_| {
                    ConnectionManager::new_lazy_with_config(client.clone(), manager_config.clone())
                        .map(Link::Node)
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(settings)?
        };
        metrics.backend_up(false);
        Ok(Redis {
            connections,
            next: AtomicUsize::new(0),
            timeout: config.timeout,
            connect_timeout: config.connect_timeout,
            prefix: config.key_prefix.clone(),
            rate_limits_on_unavailable: state.rate_limits_on_unavailable,
            up: watch::channel(false).0,
            metrics,
            clock: RedisClock::new(),
            subscriber,
        })
    }

    /// A channel's name: `<prefix><name>`, so sidecars with another prefix hear nothing.
    pub fn channel(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Subscribes to `channel` on a connection of its own; a stream that yields at each message
    /// and ends with the connection. `None` on a cluster, where changes are found by reading
    /// again instead.
    pub async fn subscribe(
        &self,
        channel: &str,
    ) -> Result<Option<impl futures::Stream<Item = ()> + Send + 'static>, StateError> {
        let Some(client) = &self.subscriber else {
            return Ok(None);
        };
        let within = self.timeout + self.connect_timeout;
        let subscribed = tokio::time::timeout(within, async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(channel).await?;
            Ok::<_, RedisError>(pubsub)
        })
        .await
        .map_err(|_| StateError::Timeout(within))?
        .map_err(|err| self.classify(&err))?;
        Ok(Some(futures::StreamExt::map(
            subscribed.into_on_message(),
            |_| (),
        )))
    }

    /// What rate limits do while Redis cannot be reached.
    pub fn rate_limits_on_unavailable(&self) -> OnUnavailable {
        self.rate_limits_on_unavailable
    }

    /// The per-operation timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A key of `tenant`: `<prefix>{<tenant>}:<rest>`. The tenant is the hash tag, so all of a
    /// tenant's keys live in one Redis Cluster slot and one script may touch them together.
    /// Braces and `%` in the tenant are escaped, so the tag is exactly the tenant.
    pub fn key(&self, tenant: &str, rest: std::fmt::Arguments<'_>) -> String {
        let mut key = String::with_capacity(self.prefix.len() + tenant.len() + 40);
        key.push_str(&self.prefix);
        key.push('{');
        for c in tenant.chars() {
            match c {
                '%' => key.push_str("%25"),
                '{' => key.push_str("%7B"),
                '}' => key.push_str("%7D"),
                c => key.push(c),
            }
        }
        key.push_str("}:");
        std::fmt::Write::write_fmt(&mut key, rest).unwrap_or_default();
        key
    }

    /// Runs a script on the next connection, giving up after the timeout; the script is told
    /// when that is, so it does nothing should it start later (see [`GUARD`]). Without a recent
    /// sample of Redis's clock, one is taken first, within the same timeout.
    pub async fn invoke(&self, concern: Concern, op: &Op) -> Result<Value, StateError> {
        let give_up = Instant::now() + self.timeout;
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.connections.len();
        let link = &self.connections[index];
        let outcome = tokio::time::timeout_at(give_up, async {
            let give_up_us = match self.clock.deadline_us(give_up) {
                Some(us) => us,
                None => {
                    self.sample(link).await?;
                    self.clock.deadline_us(give_up).ok_or_else(malformed_time)?
                }
            };
            link.invoke(op, give_up_us).await
        })
        .await;
        match outcome {
            Ok(Ok(value)) => {
                self.answered();
                Ok(value)
            }
            Ok(Err(err)) => Err(self.failed(concern, self.classify(&err))),
            Err(_elapsed) => Err(self.failed(concern, StateError::Timeout(self.timeout))),
        }
    }

    /// Runs a command that only reads (no script, so no give-up guard: a read that runs late
    /// changes nothing), within the timeout. For reads that are not part of a call, such as the
    /// emergency denies' reconcile, so they never count as a call's scripts.
    pub async fn read(&self, concern: Concern, command: redis::Cmd) -> Result<Value, StateError> {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.connections.len();
        let link = self.connections[index].clone();
        let outcome = tokio::time::timeout(self.timeout, async move {
            match link {
                Link::Node(mut c) => command.query_async::<Value>(&mut c).await,
                Link::Cluster(mut c) => command.query_async::<Value>(&mut c).await,
            }
        })
        .await;
        match outcome {
            Ok(Ok(value)) => {
                self.answered();
                Ok(value)
            }
            Ok(Err(err)) => Err(self.failed(concern, self.classify(&err))),
            Err(_elapsed) => Err(self.failed(concern, StateError::Timeout(self.timeout))),
        }
    }

    /// Sends `op` again from a task of its own, a few times within `until`, until Redis answers
    /// it: for settling what an operation that timed out may have left (a claim, a used
    /// approval). `op` must be safe to repeat.
    pub fn retry_later(
        self: &Arc<Self>,
        concern: Concern,
        op: Op,
        until: Instant,
        what: &'static str,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let redis = self.clone();
        runtime.spawn(async move {
            let mut pause = Duration::from_millis(50);
            let mut last = None;
            for _ in 0..RETRIES {
                match redis.invoke(concern, &op).await {
                    Ok(_) => return,
                    Err(err) => last = Some(err),
                }
                if Instant::now() + pause + redis.timeout >= until {
                    break;
                }
                tokio::time::sleep(pause).await;
                pause *= 4;
            }
            if let Some(err) = last {
                tracing::warn!(concern = concern.as_str(), operation = what, error = %err, "could not settle an operation that timed out");
            }
        });
    }

    /// Samples Redis's clock on `link`; an answer is also a sign of life.
    async fn sample(&self, link: &Link) -> Result<(), RedisError> {
        let redis_us = link.time_us().await?;
        self.clock.record(redis_us, Instant::now());
        Ok(())
    }

    /// `TIME` on every connection, which also samples Redis's clock. A connection being
    /// (re-)established may take the connect timeout as well as the operation's.
    pub async fn ping(&self) -> Result<(), StateError> {
        let within = self.timeout + self.connect_timeout;
        for connection in &self.connections {
            // On a cluster, TIME goes to every primary.
            let outcome = tokio::time::timeout(within, self.sample(connection)).await;
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(err)) => return Err(self.failed(Concern::Health, self.classify(&err))),
                Err(_) => return Err(self.failed(Concern::Health, StateError::Timeout(within))),
            }
        }
        self.answered();
        Ok(())
    }

    /// Whether Redis answered the last operation or health check.
    pub fn reachable(&self) -> bool {
        *self.up.borrow()
    }

    /// Changes of [`Self::reachable`].
    pub fn watch_reachable(&self) -> watch::Receiver<bool> {
        self.up.subscribe()
    }

    /// Pings every [`HEALTH_INTERVAL`], so reachability (and readiness) follows Redis also when
    /// no call needs it, and connections are re-established before the next call does. The
    /// caller owns the loop (it ends when the backend is dropped or its task is stopped).
    pub fn check_health(self: &Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        let redis = Arc::downgrade(self);
        async move {
            let mut tick = tokio::time::interval(HEALTH_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(redis) = redis.upgrade() else { return };
                let _ = redis.ping().await;
            }
        }
    }

    fn answered(&self) {
        let changed = self.up.send_if_modified(|up| !std::mem::replace(up, true));
        if changed {
            self.metrics.backend_up(true);
            tracing::info!("state backend reachable");
        }
    }

    fn failed(&self, concern: Concern, error: StateError) -> StateError {
        self.metrics.failure(concern.as_str());
        let outage = matches!(error, StateError::Timeout(_) | StateError::Unreachable(_));
        if outage {
            let changed = self.up.send_if_modified(|up| std::mem::replace(up, false));
            if changed {
                self.metrics.backend_up(false);
                tracing::warn!(concern = concern.as_str(), error = %error, "state backend unreachable");
            }
        } else {
            tracing::error!(concern = concern.as_str(), error = %error, "state backend operation failed");
        }
        error
    }
}

/// Times a background settlement is tried.
const RETRIES: usize = 4;

impl Redis {
    /// Whether a Redis error means it cannot be used now (an outage) or that it refused this
    /// one operation. A Redis that answers refuses only that operation — out of memory
    /// (`OOM`, at `maxmemory` with `noeviction`), a replica (`READONLY`), a permission — and
    /// keeps deciding the others, so those are not an outage: the sidecar stays reachable and
    /// rate limits do not fall back to the local limiter. A Redis that cannot run anything
    /// now (`BUSY` in a long script, `LOADING`, a cluster down, a refused login) is one. A
    /// script that started after its give-up time reports as the timeout it was.
    fn classify(&self, err: &RedisError) -> StateError {
        if err.code() == Some(LATE) {
            return StateError::Timeout(self.timeout);
        }
        let outage = match err.kind() {
            ErrorKind::Server(kind) => matches!(
                kind,
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
            ),
            // Writes refused while reads work (NOREPLICAS, MISCONF) are like READONLY.
            ErrorKind::Extension => matches!(err.code(), Some("BUSY" | "NOAUTH" | "WRONGPASS")),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => false,
            _ => true,
        };
        if outage {
            StateError::Unreachable(err.to_string())
        } else {
            StateError::Refused(err.to_string())
        }
    }
}

/// A `TIME` answer in µs.
fn parse_time(value: &Value) -> Result<i64, RedisError> {
    let number = |v: &Value| -> Option<i64> {
        match v {
            Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
            Value::SimpleString(text) => text.parse().ok(),
            Value::Int(n) => Some(*n),
            _ => None,
        }
    };
    match value {
        Value::Array(parts) if parts.len() == 2 => {
            let (Some(seconds), Some(micros)) = (number(&parts[0]), number(&parts[1])) else {
                return Err(malformed_time());
            };
            seconds
                .checked_mul(1_000_000)
                .and_then(|us| us.checked_add(micros))
                .ok_or_else(malformed_time)
        }
        Value::ServerError(err) => Err(RedisError::from(err.clone())),
        _ => Err(malformed_time()),
    }
}

fn malformed_time() -> RedisError {
    RedisError::from((ErrorKind::UnexpectedReturnType, "unexpected answer to TIME"))
}

/// Reads a script's array reply.
pub struct Reply(Vec<Value>);

impl Reply {
    pub fn new(value: Value) -> Result<Reply, StateError> {
        match value {
            Value::Array(items) => Ok(Reply(items)),
            other => Err(StateError::Malformed(format!(
                "expected an array, got {other:?}"
            ))),
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Item `i` as text.
    pub fn text(&self, i: usize) -> Result<String, StateError> {
        match self.0.get(i) {
            Some(Value::BulkString(bytes)) => String::from_utf8(bytes.clone())
                .map_err(|_| StateError::Malformed(format!("item {i} is not UTF-8"))),
            Some(Value::SimpleString(text)) => Ok(text.clone()),
            Some(Value::Int(n)) => Ok(n.to_string()),
            other => Err(StateError::Malformed(format!(
                "item {i}: expected text, got {other:?}"
            ))),
        }
    }

    /// Item `i` as a number.
    pub fn int(&self, i: usize) -> Result<i64, StateError> {
        match self.0.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            Some(Value::BulkString(bytes)) => std::str::from_utf8(bytes)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| StateError::Malformed(format!("item {i} is not a number"))),
            other => Err(StateError::Malformed(format!(
                "item {i}: expected a number, got {other:?}"
            ))),
        }
    }

    /// Item `i` as a nested reply.
    pub fn nested(&self, i: usize) -> Result<Reply, StateError> {
        Reply::new(self.0.get(i).cloned().unwrap_or(Value::Nil))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn redis(prefix: &str) -> Redis {
        let config = RedisConfig {
            url: url::Url::parse("redis://127.0.0.1:1").unwrap(),
            username: None,
            password: None,
            ca_pem: None,
            key_prefix: prefix.into(),
            timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(50),
            connections: 1,
            cluster: false,
        };
        Redis::connect(
            &config,
            &StateConfig::default(),
            StateMetrics::register(&Metrics::default()),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn the_tenant_is_the_whole_hash_tag() {
        let redis = redis("tg:");
        assert_eq!(
            redis.key("acme", format_args!("rl:{}", 1)),
            "tg:{acme}:rl:1"
        );
        // A tenant with braces cannot end the tag early or start another one.
        assert_eq!(
            redis.key("a}b{c%", format_args!("x")),
            "tg:{a%7Db%7Bc%25}:x"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_give_up_time_is_never_later_in_redis_time_than_the_give_up_itself() {
        let clock = RedisClock::new();
        // Redis's clock runs 1,000 s ahead of ours; an answer takes 3 ms to come back, made
        // 1 ms after sending.
        let offset_us = 1_000_000_000;
        let sent = Instant::now();
        let redis_us = clock.local_us(sent) + 1_000 + offset_us;
        tokio::time::advance(Duration::from_millis(3)).await;
        clock.record(redis_us, Instant::now());
        let give_up = Instant::now() + Duration::from_millis(50);
        let deadline = clock.deadline_us(give_up).unwrap();
        let truth = clock.local_us(give_up) + offset_us;
        assert!(deadline <= truth, "{deadline} > {truth}");
        // At most the answer's way back (2 ms) and the drift allowance early.
        assert!(truth - deadline <= 2_000 + 100, "{}", truth - deadline);
        // A looser sample later does not loosen the bound; drift is allowed for as it ages.
        tokio::time::advance(Duration::from_secs(1)).await;
        clock.record(
            clock.local_us(Instant::now()) + offset_us - 40_000,
            Instant::now(),
        );
        let give_up = Instant::now() + Duration::from_millis(50);
        let deadline = clock.deadline_us(give_up).unwrap();
        let truth = clock.local_us(give_up) + offset_us;
        assert!(deadline <= truth && truth - deadline <= 2_000 + 1_100);
        // An old sample is not trusted: the next operation samples again.
        tokio::time::advance(MAX_SAMPLE_AGE + Duration::from_millis(1)).await;
        assert_eq!(clock.deadline_us(Instant::now()), None);
    }

    #[tokio::test]
    async fn an_unreachable_redis_fails_within_the_timeout() {
        // Port 1 on loopback refuses connections.
        let redis = redis("tg:");
        let started = std::time::Instant::now();
        let err = redis.ping().await.unwrap_err();
        assert!(matches!(
            err,
            StateError::Unreachable(_) | StateError::Timeout(_)
        ));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(!redis.reachable());
    }
}
