//! Where audit events go.

use super::*;

/// Where audit events go.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawAudit {
    /// `stdout` (default), `file`, `otlp` (OTLP logs over gRPC) or `none`.
    pub sink: Option<RawAuditSink>,
    /// File path for the `file` sink (appended to).
    pub path: Option<String>,
    /// OTLP/gRPC endpoint for the `otlp` sink (default: the traces endpoint, if that is gRPC).
    pub endpoint: Option<String>,
    /// Events held in memory before callers wait: queued for the sink, or reserved by calls in
    /// flight (each call takes its slot before it runs, so this also bounds calls in flight; keep
    /// it above limits.max_in_flight × limits.max_parallel) (default 16384).
    pub queue_capacity: Option<usize>,
    /// Most `authentication_failed` events written, e.g. `10/s` or `{quota: 10/s, burst: 100}`
    /// (the default); refused callers beyond it are counted, not written.
    pub authentication_failures: Option<RawRateLimit>,
    /// When the queue is full: `wait` (default; calls wait for room) or `refuse` (fail closed:
    /// new calls are refused with UNAVAILABLE rather than run unaudited).
    pub when_full: Option<RawAuditWhenFull>,
    /// For the file sink: `never` (default; the OS decides), `batch` (after each write batch)
    /// or `always` (after every event).
    pub fsync: Option<RawFsync>,
}

/// What to do when the audit queue is full.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawAuditWhenFull {
    Wait,
    Refuse,
}

/// When the audit file is synced to disk.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawFsync {
    Never,
    Batch,
    Always,
}

/// An audit sink.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RawAuditSink {
    Stdout,
    File,
    /// OTLP logs over gRPC.
    Otlp,
    None,
}
