//! The catalog file's plain settings: YAML -> [`raw`] serde structs (unknown fields refused) ->
//! validated, typed sections (server, limits, approvals, audit, state), and the parsers every
//! module uses for durations, rates and paths. Nothing here imports the sidecar's own modules:
//! the catalog, executors and identity build their parts from these values, and `config`
//! assembles the whole. Every error names the path inside the file and what is wrong. The
//! process environment is passed in as an [`Env`], never read from globals here.

pub mod raw;
mod state;
mod watch;
pub mod yaml_bounds;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::SocketAddr,
    num::NonZeroU32,
    path::{Path, PathBuf},
    time::Duration,
};

use raw::RawConfig;
use sha2::Digest;
pub use state::{OnUnavailable, RedisConfig, Secret, StateBackend, StateConfig};
pub use watch::{CatalogWatch, Polled};

/// The embedded demo catalog, served when no config is given.
pub const DEMO_CATALOG: &str = include_str!("../../examples/demo.yaml");
/// The name the embedded demo is reported under in errors and logs.
pub const DEMO_SOURCE: &str = "<embedded demo>";

/// A catalog that could not be loaded: where, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {path}: {message}")]
pub struct ConfigError {
    /// The file (or `<embedded demo>`).
    pub file: String,
    /// Where inside the file, e.g. `tools[2].input_schema`; `.` for the whole file.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// A validation error before the file name is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// Environment variables, passed in so tests never mutate the process environment.
#[derive(Debug, Clone, Default)]
pub struct Env(BTreeMap<String, String>);

impl Env {
    /// The process environment.
    pub fn from_process() -> Self {
        Env(std::env::vars().collect())
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    pub fn with(mut self, name: &str, value: &str) -> Self {
        self.0.insert(name.to_owned(), value.to_owned());
        self
    }
}

/// Listen addresses and shutdown behaviour.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: Option<SocketAddr>,
    pub unix_socket: Option<PathBuf>,
    pub shutdown_grace: Duration,
    pub reload_interval: Duration,
    pub admin_listen: Option<SocketAddr>,
}

/// Request size limits, concurrency caps and the memory budgets of what is kept between calls.
/// The defaults fit a 256 MiB pod: the budgets add up to well under half of it.
#[derive(Debug, Clone)]
pub struct LimitsConfig {
    pub max_arguments_bytes: usize,
    pub max_arguments_depth: usize,
    /// Most JSON values in one call's arguments: each costs ~72 bytes once parsed.
    pub max_arguments_values: usize,
    pub max_output_bytes: usize,
    pub max_parallel: usize,
    pub max_batch_calls: usize,
    pub idempotency_window: Duration,
    pub idempotency_max_entries_per_tenant: usize,
    pub idempotency_max_bytes_per_tenant: usize,
    pub idempotency_max_bytes: usize,
    pub max_message_bytes: usize,
    /// Longest call id, run id, idempotency key, approval id and tool name a client may send.
    pub max_identifier_bytes: usize,
    /// Longest tenant, subject or agent (dev metadata or JWT claim); scopes get 16 times this.
    pub max_identity_bytes: usize,
    /// ToolGate RPCs in flight in the whole sidecar; beyond it, RESOURCE_EXHAUSTED at once.
    pub max_in_flight: usize,
    /// Bytes of requests held at once (read and not yet answered); beyond it, RESOURCE_EXHAUSTED.
    pub max_request_bytes_in_flight: usize,
    /// HTTP/2 streams one connection may have open; beyond it the stream is refused.
    pub max_streams_per_connection: u32,
    /// ToolGate RPCs one tenant may have in flight: no tenant takes the whole `max_in_flight`.
    pub max_in_flight_per_tenant: usize,
    /// Of `max_in_flight`, what only the Unix socket (the agent in the pod) may use.
    pub in_flight_reserved_for_unix_socket: usize,
    /// Connections each listener holds at once; beyond it a new connection is closed at once.
    pub max_connections_per_listener: usize,
    /// How long a new connection has to send the HTTP/2 preface and its first frame.
    pub handshake_timeout: Duration,
    /// How long a request's body may take to arrive once its headers have.
    pub request_body_timeout: Duration,
    /// A connection that carries no ToolGate RPC for this long is closed.
    pub idle_connection_timeout: Duration,
    /// Bytes of parsed arguments held by calls in flight (estimated before parsing).
    pub max_parsed_arguments_bytes_in_flight: usize,
    /// Bytes of recently handed-out catalog revisions remembered (for `catalog_revision`).
    pub revision_log_max_bytes: usize,
    /// Bytes of verified JWTs remembered.
    pub token_cache_max_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_arguments_bytes: 1024 * 1024,
            max_arguments_depth: 64,
            max_arguments_values: 100_000,
            max_output_bytes: 1024 * 1024,
            max_parallel: 8,
            max_batch_calls: 128,
            idempotency_window: Duration::from_secs(600),
            idempotency_max_entries_per_tenant: 1000,
            idempotency_max_bytes_per_tenant: 8 * 1024 * 1024,
            idempotency_max_bytes: 32 * 1024 * 1024,
            max_message_bytes: 4 * 1024 * 1024,
            max_identifier_bytes: 256,
            max_identity_bytes: 256,
            max_in_flight: 1024,
            max_request_bytes_in_flight: 32 * 1024 * 1024,
            max_streams_per_connection: 256,
            max_in_flight_per_tenant: 256,
            in_flight_reserved_for_unix_socket: 64,
            max_connections_per_listener: 512,
            handshake_timeout: Duration::from_secs(5),
            request_body_timeout: Duration::from_secs(10),
            idle_connection_timeout: Duration::from_secs(120),
            max_parsed_arguments_bytes_in_flight: 64 * 1024 * 1024,
            revision_log_max_bytes: 8 * 1024 * 1024,
            token_cache_max_bytes: 4 * 1024 * 1024,
        }
    }
}

/// Room set aside in a response for each result: enough for the short refusal that replaces a
/// result too large to send (its ids are at most `limits.max_identifier_bytes`, ≤ 1 KiB).
pub const RESULT_RESERVE_BYTES: usize = 4 * 1024;
/// Room kept for a response's own framing.
pub const RESPONSE_MARGIN_BYTES: usize = 16 * 1024;

/// What one JSON value of a call's arguments is taken to cost once parsed (a `serde_json::Value`
/// and its share of the map or vector holding it; measured at 72–80 bytes).
pub const PARSED_VALUE_BYTES: usize = 80;

/// The most a call's arguments can take once parsed, from what is counted before parsing: the
/// text (strings are copied out of it) and a value's cost for each value.
pub fn parsed_arguments_bytes(text_bytes: usize, values: usize) -> usize {
    text_bytes.saturating_add(values.saturating_mul(PARSED_VALUE_BYTES))
}

/// What the idempotency store may hold.
#[derive(Debug, Clone, Copy)]
pub struct IdempotencyBudget {
    /// How long a key's result is kept.
    pub window: Duration,
    pub max_entries_per_tenant: usize,
    pub max_bytes_per_tenant: usize,
    pub max_bytes: usize,
}

impl LimitsConfig {
    /// The idempotency store's budgets.
    pub fn idempotency_budget(&self) -> IdempotencyBudget {
        IdempotencyBudget {
            window: self.idempotency_window,
            max_entries_per_tenant: self.idempotency_max_entries_per_tenant,
            max_bytes_per_tenant: self.idempotency_max_bytes_per_tenant,
            max_bytes: self.idempotency_max_bytes,
        }
    }
}

/// What a tool can change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RiskLevel {
    ReadOnly,
    WriteDraft,
    WriteConfirmed,
    Destructive,
}

impl RiskLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            RiskLevel::ReadOnly => "READ_ONLY",
            RiskLevel::WriteDraft => "WRITE_DRAFT",
            RiskLevel::WriteConfirmed => "WRITE_CONFIRMED",
            RiskLevel::Destructive => "DESTRUCTIVE",
        }
    }

    /// Reads [`Self::as_str`] back.
    pub fn parse(text: &str) -> Option<Self> {
        [
            RiskLevel::ReadOnly,
            RiskLevel::WriteDraft,
            RiskLevel::WriteConfirmed,
            RiskLevel::Destructive,
        ]
        .into_iter()
        .find(|level| level.as_str() == text)
    }
}

impl From<raw::RawRiskLevel> for RiskLevel {
    fn from(raw: raw::RawRiskLevel) -> Self {
        match raw {
            raw::RawRiskLevel::ReadOnly => RiskLevel::ReadOnly,
            raw::RawRiskLevel::WriteDraft => RiskLevel::WriteDraft,
            raw::RawRiskLevel::WriteConfirmed => RiskLevel::WriteConfirmed,
            raw::RawRiskLevel::Destructive => RiskLevel::Destructive,
        }
    }
}

/// How long approvals live and how much of them is kept.
#[derive(Debug, Clone, Copy)]
pub struct ApprovalBudget {
    pub ttl: Duration,
    pub max_per_tenant: usize,
    pub max_bytes_per_tenant: usize,
    pub max_bytes: usize,
}

/// Which calls need an approval, how long approvals live and how much of them is kept.
#[derive(Debug, Clone)]
pub struct ApprovalsConfig {
    pub risk_levels: BTreeSet<RiskLevel>,
    pub budget: ApprovalBudget,
}

/// Where audit events go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditSinkConfig {
    Stdout,
    File(PathBuf),
    /// OTLP logs over gRPC to this endpoint, as this service.
    Otlp {
        endpoint: String,
        service_name: String,
    },
    None,
}

/// Audit settings.
#[derive(Debug, Clone)]
pub struct AuditConfig {
    pub sink: AuditSinkConfig,
    /// Events held in memory: queued for the sink, or reserved by calls in flight.
    pub queue_capacity: usize,
    /// Most `authentication_failed` events written; the rest are counted.
    pub authentication_failures: Rate,
    /// Refuse calls rather than wait when the queue is full.
    pub fail_closed: bool,
    pub fsync: raw::RawFsync,
}

/// A rate: `count` calls per `period`, allowing `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    pub count: NonZeroU32,
    pub period: Duration,
    pub burst: NonZeroU32,
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}s", self.count, self.period.as_secs_f64())
    }
}

/// The file as written, its shape checked; a text past [`yaml_bounds`] is refused unparsed.
pub fn parse_yaml(text: &str) -> Result<RawConfig, FieldError> {
    yaml_bounds::check(text).map_err(|message| FieldError::new(".", message))?;
    let deserializer = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let path = err.path().to_string();
        let message = err.into_inner().to_string();
        // serde_yaml_ng already prefixes the path; say it once.
        let message = message
            .strip_prefix(&format!("{path}: "))
            .map(str::to_owned)
            .unwrap_or(message);
        FieldError::new(path, message)
    })
}

/// The catalog's plain sections, validated.
#[derive(Debug)]
pub struct Sections {
    pub server: ServerConfig,
    pub limits: LimitsConfig,
    pub approvals: ApprovalsConfig,
    pub audit: AuditConfig,
    pub state: StateConfig,
}

/// Refuses a file written for another format version.
pub fn check_version(raw: &RawConfig) -> Result<(), FieldError> {
    if raw.version != 1 {
        return Err(FieldError::new(
            "version",
            format!(
                "unsupported config version {}; this toolgate reads version 1",
                raw.version
            ),
        ));
    }
    Ok(())
}

impl Sections {
    /// Validates the plain sections. The audit's OTLP sink shares the traces endpoint when it is
    /// gRPC (`traces_grpc`), under the traces' service name.
    pub fn build(
        raw: &RawConfig,
        base_dir: &Path,
        env: &Env,
        traces_grpc: Option<&str>,
        service_name: &str,
    ) -> Result<Sections, FieldError> {
        let server = build_server(&raw.server)?;
        let limits = build_limits(&raw.limits)?;
        let approvals = build_approvals(&raw.approvals)?;
        let audit = build_audit(&raw.audit, base_dir, traces_grpc, service_name)?;
        let state = StateConfig::build(raw.state.as_ref(), base_dir, env)?;
        Ok(Sections {
            server,
            limits,
            approvals,
            audit,
            state,
        })
    }
}

fn build_approvals(raw: &raw::RawApprovals) -> Result<ApprovalsConfig, FieldError> {
    Ok(ApprovalsConfig {
        risk_levels: raw
            .risk_levels
            .as_ref()
            .map(|levels| levels.iter().copied().map(RiskLevel::from).collect())
            .unwrap_or_else(|| [RiskLevel::WriteConfirmed, RiskLevel::Destructive].into()),
        budget: ApprovalBudget {
            ttl: opt_duration(&raw.ttl, "approvals.ttl", Duration::from_secs(300))?,
            max_per_tenant: positive(raw.max_per_tenant, "approvals.max_per_tenant", 1000)?,
            max_bytes_per_tenant: positive(
                raw.max_bytes_per_tenant,
                "approvals.max_bytes_per_tenant",
                4 * 1024 * 1024,
            )?,
            max_bytes: positive(raw.max_bytes, "approvals.max_bytes", 16 * 1024 * 1024)?,
        },
    })
}

fn build_server(raw: &raw::RawServer) -> Result<ServerConfig, FieldError> {
    let listen = match raw.listen.as_deref() {
        None => Some(SocketAddr::from(([127, 0, 0, 1], 50051))),
        Some("") => None,
        Some(addr) => Some(addr.parse().map_err(|err| {
            FieldError::new("server.listen", format!("invalid address {addr:?}: {err}"))
        })?),
    };
    let unix_socket = raw.unix_socket.as_ref().map(PathBuf::from);
    let admin_listen = raw
        .admin_listen
        .as_deref()
        .map(|addr| {
            addr.parse().map_err(|err| {
                FieldError::new(
                    "server.admin_listen",
                    format!("invalid address {addr:?}: {err}"),
                )
            })
        })
        .transpose()?;
    if listen.is_none() && unix_socket.is_none() {
        return Err(FieldError::new(
            "server",
            "nothing to listen on: set server.listen or server.unix_socket",
        ));
    }
    Ok(ServerConfig {
        listen,
        unix_socket,
        admin_listen,
        shutdown_grace: opt_duration(
            &raw.shutdown_grace,
            "server.shutdown_grace",
            Duration::from_secs(10),
        )?,
        reload_interval: opt_duration(
            &raw.reload_interval,
            "server.reload_interval",
            Duration::from_secs(5),
        )?,
    })
}

fn build_limits(raw: &raw::RawLimits) -> Result<LimitsConfig, FieldError> {
    let d = LimitsConfig::default();
    let limits = LimitsConfig {
        max_arguments_bytes: positive(
            raw.max_arguments_bytes,
            "limits.max_arguments_bytes",
            d.max_arguments_bytes,
        )?,
        max_arguments_depth: positive(
            raw.max_arguments_depth,
            "limits.max_arguments_depth",
            d.max_arguments_depth,
        )?
        // serde_json refuses deeper input on its own; keep our check the one that speaks.
        .min(120),
        max_arguments_values: positive(
            raw.max_arguments_values,
            "limits.max_arguments_values",
            d.max_arguments_values,
        )?,
        max_output_bytes: positive(
            raw.max_output_bytes,
            "limits.max_output_bytes",
            d.max_output_bytes,
        )?,
        max_parallel: positive(raw.max_parallel, "limits.max_parallel", d.max_parallel)?,
        max_batch_calls: positive(
            raw.max_batch_calls,
            "limits.max_batch_calls",
            d.max_batch_calls,
        )?,
        idempotency_window: opt_duration(
            &raw.idempotency_window,
            "limits.idempotency_window",
            d.idempotency_window,
        )?,
        idempotency_max_entries_per_tenant: positive(
            raw.idempotency_max_entries_per_tenant,
            "limits.idempotency_max_entries_per_tenant",
            d.idempotency_max_entries_per_tenant,
        )?,
        idempotency_max_bytes_per_tenant: positive(
            raw.idempotency_max_bytes_per_tenant,
            "limits.idempotency_max_bytes_per_tenant",
            d.idempotency_max_bytes_per_tenant,
        )?,
        idempotency_max_bytes: positive(
            raw.idempotency_max_bytes,
            "limits.idempotency_max_bytes",
            d.idempotency_max_bytes,
        )?,
        max_message_bytes: positive(
            raw.max_message_bytes,
            "limits.max_message_bytes",
            d.max_message_bytes,
        )?,
        max_identifier_bytes: match positive(
            raw.max_identifier_bytes,
            "limits.max_identifier_bytes",
            d.max_identifier_bytes,
        )? {
            // A refusal repeats the call id and tool name: they must fit in its reserved room.
            n if n > 1024 => {
                return Err(FieldError::new(
                    "limits.max_identifier_bytes",
                    "must be at most 1024",
                ));
            }
            n => n,
        },
        max_identity_bytes: positive(
            raw.max_identity_bytes,
            "limits.max_identity_bytes",
            d.max_identity_bytes,
        )?,
        max_in_flight: positive(raw.max_in_flight, "limits.max_in_flight", d.max_in_flight)?,
        max_request_bytes_in_flight: positive(
            raw.max_request_bytes_in_flight,
            "limits.max_request_bytes_in_flight",
            d.max_request_bytes_in_flight,
        )?,
        max_streams_per_connection: u32::try_from(positive(
            raw.max_streams_per_connection,
            "limits.max_streams_per_connection",
            d.max_streams_per_connection as usize,
        )?)
        .map_err(|_| {
            FieldError::new(
                "limits.max_streams_per_connection",
                "must be at most 2^32-1",
            )
        })?,
        max_in_flight_per_tenant: positive(
            raw.max_in_flight_per_tenant,
            "limits.max_in_flight_per_tenant",
            d.max_in_flight_per_tenant,
        )?,
        in_flight_reserved_for_unix_socket: raw
            .in_flight_reserved_for_unix_socket
            .unwrap_or(d.in_flight_reserved_for_unix_socket),
        max_connections_per_listener: positive(
            raw.max_connections_per_listener,
            "limits.max_connections_per_listener",
            d.max_connections_per_listener,
        )?,
        handshake_timeout: opt_duration(
            &raw.handshake_timeout,
            "limits.handshake_timeout",
            d.handshake_timeout,
        )?,
        request_body_timeout: opt_duration(
            &raw.request_body_timeout,
            "limits.request_body_timeout",
            d.request_body_timeout,
        )?,
        idle_connection_timeout: opt_duration(
            &raw.idle_connection_timeout,
            "limits.idle_connection_timeout",
            d.idle_connection_timeout,
        )?,
        max_parsed_arguments_bytes_in_flight: positive(
            raw.max_parsed_arguments_bytes_in_flight,
            "limits.max_parsed_arguments_bytes_in_flight",
            d.max_parsed_arguments_bytes_in_flight,
        )?,
        revision_log_max_bytes: positive(
            raw.revision_log_max_bytes,
            "limits.revision_log_max_bytes",
            d.revision_log_max_bytes,
        )?,
        token_cache_max_bytes: positive(
            raw.token_cache_max_bytes,
            "limits.token_cache_max_bytes",
            d.token_cache_max_bytes,
        )?,
    };
    if limits.max_request_bytes_in_flight < limits.max_message_bytes {
        return Err(FieldError::new(
            "limits.max_request_bytes_in_flight",
            format!(
                "{} is less than limits.max_message_bytes ({}): a request of the largest size could never be read",
                limits.max_request_bytes_in_flight, limits.max_message_bytes
            ),
        ));
    }
    // Defaults that only make sense below max_in_flight follow a smaller max_in_flight, unless
    // set; set explicitly above it, they are an error.
    let limits = LimitsConfig {
        max_in_flight_per_tenant: match raw.max_in_flight_per_tenant {
            None => limits.max_in_flight_per_tenant.min(limits.max_in_flight),
            Some(n) if n > limits.max_in_flight => {
                return Err(FieldError::new(
                    "limits.max_in_flight_per_tenant",
                    format!(
                        "{n} is more than limits.max_in_flight ({})",
                        limits.max_in_flight
                    ),
                ));
            }
            Some(n) => n,
        },
        in_flight_reserved_for_unix_socket: match raw.in_flight_reserved_for_unix_socket {
            None => limits
                .in_flight_reserved_for_unix_socket
                .min(limits.max_in_flight / 4),
            Some(n) if n >= limits.max_in_flight => {
                return Err(FieldError::new(
                    "limits.in_flight_reserved_for_unix_socket",
                    format!(
                        "{n} leaves nothing of limits.max_in_flight ({}) for TCP callers",
                        limits.max_in_flight
                    ),
                ));
            }
            Some(n) => n,
        },
        ..limits
    };
    let largest_call =
        parsed_arguments_bytes(limits.max_arguments_bytes, limits.max_arguments_values);
    if limits.max_parsed_arguments_bytes_in_flight < largest_call {
        return Err(FieldError::new(
            "limits.max_parsed_arguments_bytes_in_flight",
            format!(
                "{} is less than one call of the largest arguments may take parsed ({largest_call}: limits.max_arguments_bytes plus {PARSED_VALUE_BYTES} bytes per value of limits.max_arguments_values)",
                limits.max_parsed_arguments_bytes_in_flight
            ),
        ));
    }
    let reserved = RESULT_RESERVE_BYTES
        .saturating_mul(limits.max_batch_calls)
        .saturating_add(RESPONSE_MARGIN_BYTES);
    if reserved >= limits.max_message_bytes {
        return Err(FieldError::new(
            "limits.max_batch_calls",
            format!(
                "{} calls do not fit in one response of limits.max_message_bytes ({}): each result needs room for at least a short refusal ({} bytes)",
                limits.max_batch_calls, limits.max_message_bytes, RESULT_RESERVE_BYTES
            ),
        ));
    }
    Ok(limits)
}

fn build_audit(
    raw: &raw::RawAudit,
    base_dir: &Path,
    traces_grpc: Option<&str>,
    service_name: &str,
) -> Result<AuditConfig, FieldError> {
    let kind = raw.sink.unwrap_or(raw::RawAuditSink::Stdout);
    if raw.path.is_some() && kind != raw::RawAuditSink::File {
        return Err(FieldError::new(
            "audit.path",
            "a path is only used with sink: file",
        ));
    }
    if raw.endpoint.is_some() && kind != raw::RawAuditSink::Otlp {
        return Err(FieldError::new(
            "audit.endpoint",
            "an endpoint is only used with sink: otlp",
        ));
    }
    let sink = match kind {
        raw::RawAuditSink::File => match &raw.path {
            Some(path) => AuditSinkConfig::File(resolve_path(base_dir, path)),
            None => return Err(FieldError::new("audit.path", "the file sink needs a path")),
        },
        raw::RawAuditSink::Otlp => {
            let endpoint = raw
                .endpoint
                .clone()
                .or(traces_grpc.map(str::to_owned))
                .ok_or_else(|| {
                    FieldError::new(
                        "audit.endpoint",
                        "the otlp sink needs an endpoint (or a gRPC traces endpoint to share)",
                    )
                })?;
            url::Url::parse(&endpoint).map_err(|err| {
                FieldError::new("audit.endpoint", format!("invalid URL {endpoint:?}: {err}"))
            })?;
            AuditSinkConfig::Otlp {
                endpoint,
                service_name: service_name.to_owned(),
            }
        }
        raw::RawAuditSink::Stdout => AuditSinkConfig::Stdout,
        raw::RawAuditSink::None => AuditSinkConfig::None,
    };
    let fsync = raw.fsync.unwrap_or(raw::RawFsync::Never);
    if fsync != raw::RawFsync::Never && !matches!(sink, AuditSinkConfig::File(_)) {
        return Err(FieldError::new(
            "audit.fsync",
            "fsync applies to the file sink only",
        ));
    }
    Ok(AuditConfig {
        sink,
        queue_capacity: positive(raw.queue_capacity, "audit.queue_capacity", 16384)?,
        authentication_failures: match &raw.authentication_failures {
            Some(rate) => parse_rate(rate, "audit.authentication_failures")?,
            None => Rate {
                count: NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN),
                period: Duration::from_secs(1),
                burst: NonZeroU32::new(100).unwrap_or(NonZeroU32::MIN),
            },
        },
        fail_closed: raw.when_full == Some(raw::RawAuditWhenFull::Refuse),
        fsync,
    })
}

/// The directory a catalog file's relative paths are relative to: its own, made absolute, so
/// `--config catalog.yaml` (a bare name) resolves to the working directory, not to "".
pub fn catalog_dir(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    absolute
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Sections whose changes take effect only on restart: a reload that changes one is refused.
pub const RESTART_SECTIONS: &[&str] = &[
    "server",
    "limits",
    "audit",
    "approvals",
    "state",
    "telemetry",
    "mcp_servers",
];

/// What a config was built from: a fingerprint of the catalog text and every file it references
/// (so a Secret arriving after its ConfigMap triggers a retry), and the sections that need a
/// restart, as written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Loaded {
    pub fingerprint: [u8; 32],
    /// The identity section and the files it references, hashed: a change means new keys.
    pub identity_fingerprint: [u8; 32],
    restart_sections: BTreeMap<&'static str, String>,
}

impl Loaded {
    /// Reads what `text` (a catalog in `base_dir`) references; files that cannot be read count
    /// as missing, which is itself part of the fingerprint.
    pub fn of(text: &str, base_dir: &Path) -> Self {
        // A text past the bounds is not parsed here either: its fingerprint is its bytes alone,
        // and loading it is refused with the bound's error.
        let sections: serde_yaml_ng::Mapping = match yaml_bounds::check(text) {
            Ok(()) => serde_yaml_ng::from_str(text).unwrap_or_default(),
            Err(_) => serde_yaml_ng::Mapping::default(),
        };
        let section = |name: &str| {
            sections
                .get(name)
                .map(|v| serde_yaml_ng::to_string(v).unwrap_or_default())
                .unwrap_or_default()
        };
        let referenced = referenced_files(text, base_dir);
        let digests = file_digests(&referenced);
        let mut identity = sha2::Sha256::new();
        identity.update(section("identity").as_bytes());
        hash_files(&mut identity, &referenced, &digests);
        Loaded {
            fingerprint: fingerprint(text.as_bytes(), &referenced, &digests),
            identity_fingerprint: identity.finalize().into(),
            restart_sections: RESTART_SECTIONS
                .iter()
                .map(|name| (*name, section(name)))
                .collect(),
        }
    }

    /// The sections that differ from `other` and need a restart to take effect.
    pub fn restart_changes(&self, other: &Loaded) -> Vec<&'static str> {
        RESTART_SECTIONS
            .iter()
            .filter(|name| self.restart_sections.get(*name) != other.restart_sections.get(*name))
            .copied()
            .collect()
    }
}

/// The files a catalog text (in `base_dir`) references: JWT keys and secrets, header values from
/// `file:`. Parses the text (none for a text that does not parse or is past the bounds).
pub fn referenced_files(text: &str, base_dir: &Path) -> Vec<PathBuf> {
    parse_yaml(text)
        .map(|raw| raw.referenced_files(base_dir))
        .unwrap_or_default()
}

/// The SHA-256 of each file; a file that cannot be read counts as missing (all zeros).
pub fn file_digests(files: &[PathBuf]) -> Vec<[u8; 32]> {
    files
        .iter()
        .map(|file| match std::fs::read(file) {
            Ok(bytes) => sha2::Sha256::digest(&bytes).into(),
            Err(_) => [0; 32],
        })
        .collect()
}

/// A catalog's fingerprint: its text and, by name, the content of every file it references.
pub fn fingerprint(text: &[u8], referenced: &[PathBuf], digests: &[[u8; 32]]) -> [u8; 32] {
    let mut all = sha2::Sha256::new();
    all.update(text);
    hash_files(&mut all, referenced, digests);
    all.finalize().into()
}

fn hash_files(hasher: &mut sha2::Sha256, files: &[PathBuf], digests: &[[u8; 32]]) {
    for (file, digest) in files.iter().zip(digests) {
        hasher.update(file.as_os_str().as_encoded_bytes());
        hasher.update([0]);
        hasher.update(digest);
    }
}

/// A relative path in a config file is relative to that file.
pub fn resolve_path(base_dir: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base_dir.join(path)
    }
}

fn positive(value: Option<usize>, path: &str, default: usize) -> Result<usize, FieldError> {
    match value {
        None => Ok(default),
        Some(0) => Err(FieldError::new(path, "must be greater than 0")),
        Some(v) => Ok(v),
    }
}

fn opt_duration(
    value: &Option<String>,
    path: &str,
    default: Duration,
) -> Result<Duration, FieldError> {
    value
        .as_deref()
        .map(|text| parse_duration(text).map_err(|msg| FieldError::new(path, msg)))
        .transpose()
        .map(|d| d.unwrap_or(default))
}

/// The longest duration a config may give (timeouts, windows, TTLs, grace periods): 30 days.
/// Longer ones are almost certainly typos, and deadlines computed from them must not overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Parses durations such as `250ms`, `5s`, `2m`, `1h`, `1m30s`, from 1 ns to [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text.trim())
        .map_err(|err| format!("invalid duration {text:?} ({err}); use e.g. 250ms, 5s, 2m, 1h"))?;
    if duration.is_zero() {
        return Err(format!("invalid duration {text:?}: must be greater than 0"));
    }
    if duration > MAX_DURATION {
        return Err(format!(
            "invalid duration {text:?}: the longest accepted is 30 days"
        ));
    }
    Ok(duration)
}

/// Parses a rate limit such as `5/min`, or `{quota: 5/min, burst: 10}`.
pub fn parse_rate(raw: &raw::RawRateLimit, path: &str) -> Result<Rate, FieldError> {
    let (quota, burst) = match raw {
        raw::RawRateLimit::Short(quota) => (quota.as_str(), None),
        raw::RawRateLimit::Full { quota, burst } => (quota.as_str(), *burst),
    };
    let bad = |why: &str| {
        FieldError::new(
            path,
            format!("invalid rate limit {quota:?}: {why}; use e.g. 5/min, 100/s, 1000/h"),
        )
    };
    let (count, unit) = quota.split_once('/').ok_or_else(|| bad("missing '/'"))?;
    let count: u32 = count
        .trim()
        .parse()
        .map_err(|_| bad("count is not a whole number"))?;
    let count = NonZeroU32::new(count).ok_or_else(|| bad("count must be greater than 0"))?;
    let period = match unit.trim() {
        "s" | "sec" | "second" => Duration::from_secs(1),
        "m" | "min" | "minute" => Duration::from_secs(60),
        "h" | "hour" => Duration::from_secs(3600),
        _ => return Err(bad("unit must be s, min or h")),
    };
    let burst = match burst {
        None => count,
        Some(b) => NonZeroU32::new(b)
            .ok_or_else(|| FieldError::new(format!("{path}.burst"), "must be greater than 0"))?,
    };
    Ok(Rate {
        count,
        period,
        burst,
    })
}

/// The JSON Schema of the catalog file format, for editors.
pub fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(RawConfig)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_zero_is_refused() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("30days").is_ok());
        assert!(
            parse_duration("300000000000y")
                .unwrap_err()
                .contains("30 days")
        );
        assert!(parse_duration("31days").is_err());
        assert!(parse_duration("soon").unwrap_err().contains("soon"));
    }

    #[test]
    fn rates_parse_with_and_without_burst() {
        let rate = parse_rate(&raw::RawRateLimit::Short("5/min".into()), "p").unwrap();
        assert_eq!(
            (rate.count.get(), rate.period, rate.burst.get()),
            (5, Duration::from_secs(60), 5)
        );
        let rate = parse_rate(
            &raw::RawRateLimit::Full {
                quota: "100/s".into(),
                burst: Some(10),
            },
            "p",
        )
        .unwrap();
        assert_eq!(rate.burst.get(), 10);
        let err = parse_rate(
            &raw::RawRateLimit::Short("5 per min".into()),
            "tools[0].rate_limit",
        )
        .unwrap_err();
        assert_eq!(err.path, "tools[0].rate_limit");
    }
}
