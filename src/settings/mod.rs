//! The catalog file's plain settings: YAML -> [`raw`] serde structs (unknown fields refused) ->
//! validated, typed sections (server, limits, approvals, audit, state), and the parsers every
//! module uses for durations, rates and paths. Nothing here imports the sidecar's own modules:
//! the catalog, executors and identity build their parts from these values, and `config`
//! assembles the whole. Every error names the path inside the file and what is wrong. The
//! process environment is passed in as an [`Env`], never read from globals here.

mod console;
mod limits;
mod mcp_door;
pub mod raw;
mod state;
#[expect(
    unsafe_code,
    reason = "access(2): whether this process may execute a program"
)]
mod targets;
mod watch;
pub mod yaml_bounds;

use limits::build_limits;
pub use limits::{
    IdempotencyBudget, LimitsConfig, MAX_ARGUMENTS_DEPTH_CAP, PARSED_VALUE_BYTES,
    RESPONSE_MARGIN_BYTES, RESULT_RESERVE_BYTES, parsed_arguments_bytes,
};

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::SocketAddr,
    num::NonZeroU32,
    path::{Path, PathBuf},
    time::Duration,
};

pub use console::{ConsoleConfig, OidcClient, SignIn};
pub use mcp_door::McpDoorConfig;
use raw::RawConfig;
use sha2::Digest;
pub use state::{OnUnavailable, RedisConfig, Secret, StateBackend, StateConfig};
pub use targets::{
    NotRunnable, check_secure_url, check_url, is_loopback_host, program_path, runnable,
};
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
    /// The MCP door, when configured.
    pub mcp: Option<McpDoorConfig>,
    /// The approvals console, when configured.
    pub console: Option<ConsoleConfig>,
}

enum_with_all! {
/// What a tool can change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RiskLevel {
    ReadOnly,
    WriteDraft,
    WriteConfirmed,
    Destructive,
}
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
        RiskLevel::ALL
            .iter()
            .copied()
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
/// Whether only this host can reach an address bound on `ip`: a loopback address, IPv4's or
/// IPv6's, or IPv4's written as an IPv4-mapped IPv6 address (`::ffff:127.0.0.1`), which a
/// dual-stack socket serves exactly as it serves 127.0.0.1.
pub fn is_loopback(ip: std::net::IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

pub fn parse_yaml(text: &str) -> Result<RawConfig, FieldError> {
    yaml_bounds::check(text).map_err(|err| FieldError::new(".", err.to_string()))?;
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
        let server = build_server(
            &raw.server,
            !raw.identity.jwt.is_empty(),
            raw.identity.dev_identity,
            base_dir,
            env,
        )?;
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

fn build_server(
    raw: &raw::RawServer,
    jwt_configured: bool,
    dev_identity: bool,
    base_dir: &Path,
    env: &Env,
) -> Result<ServerConfig, FieldError> {
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
    let mcp = raw
        .mcp
        .as_ref()
        .map(|mcp| mcp_door::build(mcp, jwt_configured, base_dir, env))
        .transpose()?;
    let console = raw
        .console
        .as_ref()
        .map(|console| console::build(console, jwt_configured, dev_identity, base_dir, env))
        .transpose()?;
    Ok(ServerConfig {
        listen,
        unix_socket,
        admin_listen,
        mcp,
        console,
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

/// What of `mcp_servers` takes effect only on restart: how each server is reached and which of
/// its tools are listed, not the catalog's settings of those tools (risk, scopes, pins,
/// `on_definition_change`), which a reload applies like any tool's.
fn mcp_connections(servers: &serde_yaml_ng::Value) -> serde_yaml_ng::Value {
    let mut servers = servers.clone();
    if let Some(servers) = servers.as_mapping_mut() {
        for (_, server) in servers.iter_mut() {
            if let Some(server) = server.as_mapping_mut() {
                server.remove("on_definition_change");
            }
            if let Some(tools) = server.get_mut("tools").and_then(|t| t.as_mapping_mut()) {
                for (_, settings) in tools.iter_mut() {
                    *settings = serde_yaml_ng::Value::Null;
                }
            }
        }
    }
    servers
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
                .map(|v| {
                    let v = match name {
                        "mcp_servers" => mcp_connections(v),
                        _ => v.clone(),
                    };
                    serde_yaml_ng::to_string(&v).unwrap_or_default()
                })
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
/// A file the catalog names (relative to `base_dir`), read whole; `at` names the field.
pub fn read_file(base_dir: &Path, file: &str, at: &str) -> Result<Vec<u8>, FieldError> {
    let path = resolve_path(base_dir, file);
    std::fs::read(&path)
        .map_err(|err| FieldError::new(at, format!("cannot read {}: {err}", path.display())))
}

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

/// A secret read from a file (`{at}_file`) or an environment variable (`{at}_env`), at most one
/// of them set, trailing whitespace removed (secret files usually end with a newline that is not
/// part of the secret); with the field it came from, for later messages.
fn secret_bytes(
    file: &Option<String>,
    var: &Option<String>,
    at: &str,
    base_dir: &Path,
    env: &Env,
) -> Result<Option<(String, Vec<u8>)>, FieldError> {
    let (field, bytes) = match (file, var) {
        (Some(_), Some(_)) => {
            return Err(FieldError::new(
                format!("{at}_file"),
                format!("set {at}_file or {at}_env, not both"),
            ));
        }
        (Some(file), None) => {
            let field = format!("{at}_file");
            let bytes = read_file(base_dir, file, &field)?;
            (field, bytes)
        }
        (None, Some(var)) => {
            let field = format!("{at}_env");
            let value = env.get(var).ok_or_else(|| {
                FieldError::new(
                    field.clone(),
                    format!("environment variable {var} is not set"),
                )
            })?;
            (field, value.as_bytes().to_vec())
        }
        (None, None) => return Ok(None),
    };
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    Ok(Some((field, bytes[..end].to_vec())))
}

fn opt_duration(
    value: &Option<String>,
    path: &str,
    default: Duration,
) -> Result<Duration, FieldError> {
    value
        .as_deref()
        .map(|text| parse_duration(text).map_err(|err| FieldError::new(path, err.to_string())))
        .transpose()
        .map(|d| d.unwrap_or(default))
}

/// The longest duration a config may give (timeouts, windows, TTLs, grace periods): 30 days.
/// Longer ones are almost certainly typos, and deadlines computed from them must not overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Why a duration was refused; each message quotes the text as given.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DurationError {
    /// Not a duration at all.
    #[error("invalid duration {text:?} ({source}); use e.g. 250ms, 5s, 2m, 1h")]
    Unparsed {
        text: String,
        source: humantime::DurationError,
    },
    /// Zero.
    #[error("invalid duration {text:?}: must be greater than 0")]
    Zero { text: String },
    /// Longer than [`MAX_DURATION`].
    #[error("invalid duration {text:?}: the longest accepted is 30 days")]
    TooLong { text: String },
}

/// Parses durations such as `250ms`, `5s`, `2m`, `1h`, `1m30s`, from 1 ns to [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let duration =
        humantime::parse_duration(text.trim()).map_err(|source| DurationError::Unparsed {
            text: text.to_owned(),
            source,
        })?;
    if duration.is_zero() {
        return Err(DurationError::Zero {
            text: text.to_owned(),
        });
    }
    if duration > MAX_DURATION {
        return Err(DurationError::TooLong {
            text: text.to_owned(),
        });
    }
    Ok(duration)
}

/// Parses a rate limit such as `5/min`, or `{quota: 5/min, burst: 10}`, of a quota that counts
/// calls: one with a `cost` is refused.
pub fn parse_rate(raw: &raw::RawRateLimit, path: &str) -> Result<Rate, FieldError> {
    if raw.cost().is_some() {
        return Err(FieldError::new(
            format!("{path}.cost"),
            "only a tool's rate limit has a cost: this quota counts calls",
        ));
    }
    parse_quota(raw, path)
}

/// Parses a rate limit's quota and burst; its cost, if any, is the caller's to read.
pub fn parse_quota(raw: &raw::RawRateLimit, path: &str) -> Result<Rate, FieldError> {
    let (quota, burst) = match raw {
        raw::RawRateLimit::Short(quota) => (quota.as_str(), None),
        raw::RawRateLimit::Full(full) => (full.quota.as_str(), full.burst),
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
    fn ipv4_mapped_loopback_is_loopback_and_nothing_else_is() {
        for ip in ["127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "0.0.0.0",
            "::",
            "10.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "fe80::1",
        ] {
            assert!(!is_loopback(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn mcp_tool_settings_reload_and_server_connections_need_a_restart() {
        let catalog = |server: &str, tool: &str| {
            format!(
                "version: 1\nmcp_servers:\n  docs:\n    command: [python3, s.py]\n{server}    tools:\n      search: {{ risk_level: read_only{tool} }}\n"
            )
        };
        let base = Loaded::of(&catalog("", ""), Path::new("."));
        let changed = |server: &str, tool: &str| {
            Loaded::of(&catalog(server, tool), Path::new(".")).restart_changes(&base)
        };
        // A tool's settings, a pin and the server's on_definition_change reload.
        assert!(changed("", ", pin: \"sha256:00\"").is_empty());
        assert!(changed("", ", required_scopes: [a]").is_empty());
        assert!(changed("    on_definition_change: warn\n", "").is_empty());
        // How the server is reached, and which tools it lists, do not.
        assert_eq!(changed("    env: [PATH]\n", ""), ["mcp_servers"]);
        let other_tool = Loaded::of(
            &catalog("", "").replace("search:", "fetch:"),
            Path::new("."),
        );
        assert_eq!(other_tool.restart_changes(&base), ["mcp_servers"]);
    }

    #[test]
    fn durations_parse_and_zero_is_refused() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("30days").is_ok());
        assert!(
            parse_duration("300000000000y")
                .unwrap_err()
                .to_string()
                .contains("30 days")
        );
        assert!(parse_duration("31days").is_err());
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .to_string()
                .contains("soon")
        );
    }

    #[test]
    fn rates_parse_with_and_without_burst() {
        let rate = parse_rate(&raw::RawRateLimit::Short("5/min".into()), "p").unwrap();
        assert_eq!(
            (rate.count.get(), rate.period, rate.burst.get()),
            (5, Duration::from_secs(60), 5)
        );
        let rate = parse_rate(
            &raw::RawRateLimit::Full(raw::RawQuota {
                quota: "100/s".into(),
                burst: Some(10),
                cost: None,
            }),
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
