//! The shared Redis: multiplexed connections that reconnect on their own (to one server, or to
//! every node of a Redis Cluster), one timeout around every operation, Lua scripts sent as
//! EVALSHA (reloaded on NOSCRIPT), key names with the tenant as Redis Cluster hash tag, and
//! whether Redis answers now.
//!
//! Every state change of a concern is one script, so it is atomic across sidecars and costs one
//! round trip. Times come from Redis (`TIME` inside the scripts), so the sidecars' clocks do not
//! matter. Nothing here decides policy; the concerns map a [`StateError`] to their refusals.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use redis::{
    Client, ConnectionInfo, ErrorKind, FromRedisValue, IntoConnectionInfo, RedisError,
    ScriptInvocation, ServerErrorKind, TlsCertificates, Value,
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig},
    cluster::{ClusterClientBuilder, ClusterConfig},
    cluster_async::ClusterConnection,
};
use tokio::{sync::watch, task::JoinHandle};

use super::Concern;
use crate::{
    metrics::Metrics,
    settings::{OnUnavailable, RedisConfig, StateConfig},
};

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

/// How often an idle sidecar checks that Redis answers (and so recovers readiness on its own).
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// A connection to Redis: one server (reconnecting by itself), or a cluster (one connection per
/// node, routing each operation by its first key's slot, following MOVED and ASK).
#[derive(Clone)]
enum Link {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Link {
    async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> Result<Value, RedisError> {
        match self.clone() {
            Link::Node(mut c) => invocation.invoke_async(&mut c).await,
            Link::Cluster(mut c) => invocation.invoke_async(&mut c).await,
        }
    }

    async fn query<T: FromRedisValue>(&self, command: &redis::Cmd) -> Result<T, RedisError> {
        async fn on<C: ConnectionLike, T: FromRedisValue>(
            mut c: C,
            command: &redis::Cmd,
        ) -> Result<T, RedisError> {
            command.query_async(&mut c).await
        }
        match self.clone() {
            Link::Node(c) => on(c, command).await,
            Link::Cluster(c) => on(c, command).await,
        }
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
    metrics: Arc<Metrics>,
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
        metrics: Arc<Metrics>,
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
            (0..config.connections)
                .map(|_| {
                    ConnectionManager::new_lazy_with_config(client.clone(), manager_config.clone())
                        .map(Link::Node)
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(settings)?
        };
        metrics.state_backend_up(false);
        Ok(Redis {
            connections,
            next: AtomicUsize::new(0),
            timeout: config.timeout,
            connect_timeout: config.connect_timeout,
            prefix: config.key_prefix.clone(),
            rate_limits_on_unavailable: state.rate_limits_on_unavailable,
            up: watch::channel(false).0,
            metrics,
        })
    }

    /// What rate limits do while Redis cannot be reached.
    pub fn rate_limits_on_unavailable(&self) -> OnUnavailable {
        self.rate_limits_on_unavailable
    }

    /// The per-operation timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The sidecar's metrics, for the concerns' own counters.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
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

    /// Runs a script within the timeout on the next connection.
    pub async fn invoke(
        &self,
        concern: Concern,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<Value, StateError> {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.connections.len();
        let outcome =
            tokio::time::timeout(self.timeout, self.connections[index].invoke(invocation)).await;
        match outcome {
            Ok(Ok(value)) => {
                self.answered();
                Ok(value)
            }
            Ok(Err(err)) => Err(self.failed(concern, classify(&err))),
            Err(_elapsed) => Err(self.failed(concern, StateError::Timeout(self.timeout))),
        }
    }

    /// PING on every connection. A connection being (re-)established may take the connect
    /// timeout as well as the operation's.
    pub async fn ping(&self) -> Result<(), StateError> {
        let within = self.timeout + self.connect_timeout;
        for connection in &self.connections {
            // On a cluster, PING goes to every node.
            let outcome =
                tokio::time::timeout(within, connection.query::<Value>(&redis::cmd("PING"))).await;
            match outcome {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => return Err(self.failed(Concern::Health, classify(&err))),
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
    /// no call needs it, and connections are re-established before the next call does.
    pub fn check_health(self: &Arc<Self>) -> JoinHandle<()> {
        let redis = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(HEALTH_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(redis) = redis.upgrade() else { return };
                let _ = redis.ping().await;
            }
        })
    }

    fn answered(&self) {
        let changed = self.up.send_if_modified(|up| !std::mem::replace(up, true));
        if changed {
            self.metrics.state_backend_up(true);
            tracing::info!("state backend reachable");
        }
    }

    fn failed(&self, concern: Concern, error: StateError) -> StateError {
        self.metrics.state_failure(concern.as_str());
        let outage = matches!(error, StateError::Timeout(_) | StateError::Unreachable(_));
        if outage {
            let changed = self.up.send_if_modified(|up| std::mem::replace(up, false));
            if changed {
                self.metrics.state_backend_up(false);
                tracing::warn!(concern = concern.as_str(), error = %error, "state backend unreachable");
            }
        } else {
            tracing::error!(concern = concern.as_str(), error = %error, "state backend operation failed");
        }
        error
    }
}

/// Whether a Redis error means it cannot be used now (an outage) or that it refused this one
/// operation.
fn classify(err: &RedisError) -> StateError {
    let refused = matches!(
        err.kind(),
        ErrorKind::Server(
            ServerErrorKind::ResponseError
                | ServerErrorKind::NoScript
                | ServerErrorKind::ExecAbort
                | ServerErrorKind::CrossSlot
                | ServerErrorKind::NoPerm
        ) | ErrorKind::Parse
            | ErrorKind::UnexpectedReturnType
    );
    if refused {
        StateError::Refused(err.to_string())
    } else {
        StateError::Unreachable(err.to_string())
    }
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
            Arc::new(Metrics::default()),
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
