//! The `state:` section: where rate limits, approvals and idempotency results live, how to reach
//! Redis, and what each concern does while it cannot be reached. The password is read here from
//! the environment or a file and held as a [`Secret`], which never prints.

use std::{fmt, path::Path, time::Duration};

use super::{
    Env, FieldError, opt_duration,
    raw::{RawFailClosed, RawRateLimitOutage, RawRedis, RawState, RawStateBackend},
    resolve_path,
};

/// A value that must not be logged: its `Debug` says only that it is there.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Secret(value)
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// Where the state lives.
#[derive(Debug, Clone)]
pub enum StateBackend {
    /// This sidecar's memory: not shared, lost on restart.
    Memory,
    /// A Redis shared by every sidecar using it.
    Redis(Box<RedisConfig>),
}

/// How to reach Redis.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `redis://` or `rediss://`, without credentials.
    pub url: url::Url,
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// With `rediss://`: the CA certificates (PEM) to trust instead of the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Put before every key.
    pub key_prefix: String,
    /// How long one operation may take.
    pub timeout: Duration,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// Multiplexed connections.
    pub connections: usize,
    /// `url` is a node of a Redis Cluster.
    pub cluster: bool,
}

/// What rate limits do while the backend cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnavailable {
    /// Refuse calls with a quota (retryable `state_unavailable`).
    FailClosed,
    /// Decide with this sidecar's own in-memory limiter meanwhile.
    Local,
}

/// The validated `state:` section.
#[derive(Debug, Clone)]
pub struct StateConfig {
    pub backend: StateBackend,
    pub rate_limits_on_unavailable: OnUnavailable,
    /// An unreachable backend makes the sidecar not ready.
    pub unready_when_unavailable: bool,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            backend: StateBackend::Memory,
            rate_limits_on_unavailable: OnUnavailable::FailClosed,
            unready_when_unavailable: false,
        }
    }
}

/// The default per-operation timeout: a Redis next to the pod answers in well under a
/// millisecond, and a call must not wait long on one that does not.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// The longest per-operation timeout accepted: beyond it an outage would stall every call.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(10);
/// The most multiplexed connections.
pub const MAX_CONNECTIONS: usize = 16;

impl StateConfig {
    /// Validates the section; reads the password from the environment or its file.
    pub fn build(
        raw: Option<&RawState>,
        base_dir: &Path,
        env: &Env,
    ) -> Result<StateConfig, FieldError> {
        let Some(raw) = raw else {
            return Ok(StateConfig::default());
        };
        let rate_limits_on_unavailable = match raw.on_unavailable.rate_limits {
            None | Some(RawRateLimitOutage::FailClosed) => OnUnavailable::FailClosed,
            Some(RawRateLimitOutage::Local) => OnUnavailable::Local,
        };
        // Approvals and idempotency have one outage behaviour; the fields exist to say so.
        let _: (Option<RawFailClosed>, Option<RawFailClosed>) =
            (raw.on_unavailable.approvals, raw.on_unavailable.idempotency);
        let backend = match raw.backend.unwrap_or(RawStateBackend::Memory) {
            RawStateBackend::Memory => {
                let only_redis = |field: &str| {
                    FieldError::new(
                        format!("state.{field}"),
                        "only means something with backend: redis",
                    )
                };
                if raw.redis.is_some() {
                    return Err(only_redis("redis"));
                }
                if rate_limits_on_unavailable == OnUnavailable::Local {
                    return Err(only_redis("on_unavailable.rate_limits"));
                }
                if raw.unready_when_unavailable {
                    return Err(only_redis("unready_when_unavailable"));
                }
                StateBackend::Memory
            }
            RawStateBackend::Redis => {
                let redis = raw.redis.as_ref().ok_or_else(|| {
                    FieldError::new(
                        "state.redis",
                        "backend redis needs redis: { url: redis://host:6379 }",
                    )
                })?;
                StateBackend::Redis(Box::new(build_redis(redis, base_dir, env)?))
            }
        };
        Ok(StateConfig {
            backend,
            rate_limits_on_unavailable,
            unready_when_unavailable: raw.unready_when_unavailable,
        })
    }
}

fn build_redis(raw: &RawRedis, base_dir: &Path, env: &Env) -> Result<RedisConfig, FieldError> {
    let url = parse_url(&raw.url)?;
    let password = match (&raw.password_env, &raw.password_file) {
        (Some(_), Some(_)) => {
            return Err(FieldError::new(
                "state.redis.password_env",
                "set password_env or password_file, not both",
            ));
        }
        (Some(var), None) => Some(Secret::new(
            env.get(var)
                .ok_or_else(|| {
                    FieldError::new(
                        "state.redis.password_env",
                        format!("environment variable {var} is not set"),
                    )
                })?
                .to_owned(),
        )),
        (None, Some(file)) => {
            let path = resolve_path(base_dir, file);
            let text = std::fs::read_to_string(&path).map_err(|err| {
                FieldError::new(
                    "state.redis.password_file",
                    format!("cannot read {}: {err}", path.display()),
                )
            })?;
            Some(Secret::new(text.trim_end().to_owned()))
        }
        (None, None) => None,
    };
    if password.as_ref().is_some_and(|p| p.expose().is_empty()) {
        let field = match raw.password_env {
            Some(_) => "state.redis.password_env",
            None => "state.redis.password_file",
        };
        return Err(FieldError::new(field, "the password is empty"));
    }
    if let Some(username) = &raw.username
        && (username.is_empty() || !username.bytes().all(|b| b.is_ascii_graphic()))
    {
        return Err(FieldError::new(
            "state.redis.username",
            "must be printable ASCII without spaces",
        ));
    }
    let ca_pem = match &raw.ca_file {
        None => None,
        Some(_) if url.scheme() != "rediss" => {
            return Err(FieldError::new(
                "state.redis.ca_file",
                "only means something with a rediss:// (TLS) URL",
            ));
        }
        Some(file) => {
            let path = resolve_path(base_dir, file);
            let pem = std::fs::read(&path).map_err(|err| {
                FieldError::new(
                    "state.redis.ca_file",
                    format!("cannot read {}: {err}", path.display()),
                )
            })?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                return Err(FieldError::new(
                    "state.redis.ca_file",
                    format!("{} holds no PEM certificate", path.display()),
                ));
            }
            Some(pem)
        }
    };
    let key_prefix = raw.key_prefix.clone().unwrap_or_else(|| "toolgate:".into());
    // A brace would change which part of a key Redis Cluster hashes: keys of one tenant must
    // stay in one slot for their scripts.
    if key_prefix.len() > 64
        || !key_prefix
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
    {
        return Err(FieldError::new(
            "state.redis.key_prefix",
            "must be at most 64 bytes of printable ASCII without spaces, { or }",
        ));
    }
    let timeout = opt_duration(&raw.timeout, "state.redis.timeout", DEFAULT_TIMEOUT)?;
    if timeout > MAX_TIMEOUT {
        return Err(FieldError::new(
            "state.redis.timeout",
            "must be at most 10s: every call that needs the state waits up to this long",
        ));
    }
    let connect_timeout = opt_duration(
        &raw.connect_timeout,
        "state.redis.connect_timeout",
        Duration::from_secs(1),
    )?;
    if raw.cluster && raw.connections.is_some() {
        return Err(FieldError::new(
            "state.redis.connections",
            "a cluster connection keeps one multiplexed connection per node by itself",
        ));
    }
    let connections = match raw.connections {
        None => 1,
        Some(n @ 1..=MAX_CONNECTIONS) => n,
        Some(_) => {
            return Err(FieldError::new(
                "state.redis.connections",
                format!("must be 1 to {MAX_CONNECTIONS}"),
            ));
        }
    };
    Ok(RedisConfig {
        url,
        username: raw.username.clone(),
        password,
        ca_pem,
        key_prefix,
        timeout,
        connect_timeout,
        connections,
        cluster: raw.cluster,
    })
}

/// A Redis URL: `redis://` or `rediss://`, a host, an optional port and database number, and no
/// credentials (they would end up in logs and in the catalog's ConfigMap).
fn parse_url(text: &str) -> Result<url::Url, FieldError> {
    // Every message quotes the URL without what may be credentials: a URL with a password and
    // another mistake would otherwise print the password (in `check`, `serve` and reloads).
    let shown = redacted(text);
    let bad = |why: &str| {
        FieldError::new(
            "state.redis.url",
            format!("invalid Redis URL {shown:?}: {why}"),
        )
    };
    let url = url::Url::parse(text).map_err(|err| bad(&err.to_string()))?;
    if !matches!(url.scheme(), "redis" | "rediss") {
        return Err(bad("use redis:// or rediss:// (TLS)"));
    }
    if url.password().is_some() || !url.username().is_empty() {
        // Say nothing more about what was there: it may be the password.
        return Err(FieldError::new(
            "state.redis.url",
            "credentials in the URL are not allowed; use username and password_env or password_file",
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if url.port() == Some(0) {
        return Err(bad("port 0"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("no query or fragment is read; remove it"));
    }
    let db = url.path().trim_start_matches('/');
    if !db.is_empty() && db.parse::<u16>().is_err() {
        return Err(bad("the path must be a database number, e.g. /0"));
    }
    Ok(url)
}

/// `text` with anything that may be credentials replaced: whatever precedes the last `@` after
/// the scheme (`redis://[redacted]@host`). It works on text that is not a valid URL, and errs
/// towards hiding: a password may itself hold `/`, `:` or `@`.
fn redacted(text: &str) -> String {
    let Some(at) = text.rfind('@') else {
        return text.to_owned();
    };
    let start = text.find("://").map_or(0, |i| i + 3).min(at);
    format!("{}[redacted]{}", &text[..start], &text[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redis(url: &str) -> RawRedis {
        RawRedis {
            url: url.into(),
            ..RawRedis::default()
        }
    }

    #[test]
    fn urls_without_credentials_of_the_two_schemes_only() {
        let env = Env::default();
        let dir = Path::new(".");
        assert!(build_redis(&redis("redis://127.0.0.1:6379/2"), dir, &env).is_ok());
        assert!(build_redis(&redis("rediss://redis.example.com"), dir, &env).is_ok());
        for (url, why) in [
            ("http://127.0.0.1:6379", "redis://"),
            ("redis://:hunter2@127.0.0.1", "credentials"),
            ("redis://u:hunter2@127.0.0.1", "credentials"),
            ("redis://127.0.0.1/x", "database number"),
            ("redis://127.0.0.1?protocol=resp3", "query"),
            ("redis://127.0.0.1:0", "port 0"),
            // A URL with credentials and another mistake: the other mistake is named, the
            // credentials are not quoted.
            ("http://:hunter2@127.0.0.1", "redis://"),
            ("redis://:hunter2@127.0.0.1:99999", "invalid port"),
            ("redis://u:hunter2@", "[redacted]@"),
            ("redis:hunter2@host", "no host"),
            ("redis://:pa/hunter2@h", "[redacted]@h"),
            ("redis://:hunter2@hunter2@h/x", "credentials"),
        ] {
            let err = build_redis(&redis(url), dir, &env).unwrap_err();
            assert!(err.message.contains(why), "{url}: {}", err.message);
            assert!(!err.message.contains("hunter2"), "{}", err.message);
        }
    }

    #[test]
    fn the_password_comes_from_the_environment_or_a_file_and_never_prints() {
        let env = Env::default().with("REDIS_PW", "s3cret");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), "from-file\n").unwrap();
        let from_env = build_redis(
            &RawRedis {
                password_env: Some("REDIS_PW".into()),
                ..redis("redis://h")
            },
            dir.path(),
            &env,
        )
        .unwrap();
        assert_eq!(from_env.password.as_ref().unwrap().expose(), "s3cret");
        assert!(!format!("{from_env:?}").contains("s3cret"));
        let from_file = build_redis(
            &RawRedis {
                password_file: Some("pw".into()),
                ..redis("redis://h")
            },
            dir.path(),
            &env,
        )
        .unwrap();
        assert_eq!(from_file.password.unwrap().expose(), "from-file");
        let missing = build_redis(
            &RawRedis {
                password_env: Some("NOPE".into()),
                ..redis("redis://h")
            },
            dir.path(),
            &env,
        )
        .unwrap_err();
        assert_eq!(missing.path, "state.redis.password_env");
    }

    #[test]
    fn prefixes_cannot_break_hash_tags_and_timeouts_stay_short() {
        let env = Env::default();
        let dir = Path::new(".");
        let prefix = |p: &str| RawRedis {
            key_prefix: Some(p.into()),
            ..redis("redis://h")
        };
        assert!(build_redis(&prefix("app:{x}:"), dir, &env).is_err());
        assert!(build_redis(&prefix("has space"), dir, &env).is_err());
        assert!(build_redis(&prefix("tg:prod:"), dir, &env).is_ok());
        let slow = RawRedis {
            timeout: Some("11s".into()),
            ..redis("redis://h")
        };
        assert_eq!(
            build_redis(&slow, dir, &env).unwrap_err().path,
            "state.redis.timeout"
        );
        // A CA file is for TLS only, and must hold a certificate.
        let plain_ca = RawRedis {
            ca_file: Some("Cargo.toml".into()),
            ..redis("redis://h")
        };
        assert_eq!(
            build_redis(&plain_ca, dir, &env).unwrap_err().path,
            "state.redis.ca_file"
        );
        let not_pem = RawRedis {
            ca_file: Some("Cargo.toml".into()),
            ..redis("rediss://h")
        };
        assert!(
            build_redis(&not_pem, dir, &env)
                .unwrap_err()
                .message
                .contains("no PEM certificate")
        );
        let defaults = build_redis(&redis("redis://h"), dir, &env).unwrap();
        assert_eq!(defaults.timeout, DEFAULT_TIMEOUT);
        assert_eq!(defaults.connections, 1);
        assert_eq!(defaults.key_prefix, "toolgate:");
    }
}
