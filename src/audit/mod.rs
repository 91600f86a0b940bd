//! Audit events: one per boundary decision and per approval decision, written as JSON lines by a
//! single writer task behind a bounded queue. A full queue makes callers wait (backpressure), or
//! in fail-closed mode refuses new calls, rather than lose events; a failing sink is retried, not
//! skipped; [`AuditLog::flush`] drains the queue before the process exits.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, UNIX_EPOCH},
};

use serde::Serialize;
use tokio::{
    io::AsyncWriteExt,
    sync::{mpsc, oneshot},
    task::JoinHandle,
};

use crate::config::{AuditConfig, AuditSinkConfig, raw::RawFsync};

/// What an event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    ToolCall,
    ApprovalDecision,
}

/// One audit event. Raw arguments are never recorded, only their canonical SHA-256.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct AuditEvent {
    /// RFC 3339 time with milliseconds.
    pub time: String,
    pub kind: Option<EventKind>,
    pub call_id: String,
    pub run_id: String,
    pub step: u32,
    pub tenant: String,
    pub subject: String,
    pub agent: String,
    pub tool: String,
    pub tool_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub risk_level: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments_sha256: Option<String>,
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused_by: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approver: Option<String>,
    pub idempotent_replay: bool,
    /// Bound argument paths the model tried to set itself.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bound_override_attempts: Vec<String>,
    pub duration_ms: u64,
    /// The call's trace, when traced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
    /// The arguments, only for tools with `record_arguments: true`, with `redact` pointers replaced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<serde_json::Value>,
}

/// Formats a wall-clock time for events.
pub fn rfc3339(unix_ms: i64) -> String {
    let time = UNIX_EPOCH + Duration::from_millis(u64::try_from(unix_ms).unwrap_or(0));
    humantime::format_rfc3339_millis(time).to_string()
}

enum Message {
    Event(Box<AuditEvent>),
    Flush(oneshot::Sender<()>),
}

/// A slot in the queue, taken before a call runs in fail-closed mode; its event is then sent
/// without waiting, even from a cancelled call.
pub struct Reservation(mpsc::OwnedPermit<Message>);

impl Reservation {
    fn send(self, event: Box<AuditEvent>) {
        self.0.send(Message::Event(event));
    }
}

/// A handle for recording events; cheap to clone.
#[derive(Clone)]
pub struct AuditLog {
    queue: mpsc::Sender<Message>,
    fail_closed: bool,
    dropped: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
}

/// Where events are written.
enum Sink {
    Stdout(tokio::io::Stdout),
    File {
        file: tokio::fs::File,
        fsync: RawFsync,
    },
    Otlp(otlp::LogsSink),
    Discard,
}

impl Sink {
    async fn write(&mut self, events: &[Box<AuditEvent>], lines: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::Stdout(out) => {
                out.write_all(lines).await?;
                out.flush().await
            }
            Sink::File { file, fsync } => {
                if *fsync == RawFsync::Always && events.len() > 1 {
                    // One durable line at a time: an acknowledged event survives a crash.
                    for line in lines.split_inclusive(|b| *b == b'\n') {
                        file.write_all(line).await?;
                        file.sync_data().await?;
                    }
                    return Ok(());
                }
                file.write_all(lines).await?;
                file.flush().await?;
                if *fsync != RawFsync::Never {
                    file.sync_data().await?;
                }
                Ok(())
            }
            Sink::Otlp(sink) => sink.export(events).await,
            Sink::Discard => Ok(()),
        }
    }
}

impl AuditLog {
    /// Starts the writer task for the configured sink.
    pub async fn start(config: &AuditConfig) -> std::io::Result<(AuditLog, JoinHandle<()>)> {
        let sink = match &config.sink {
            AuditSinkConfig::Stdout => Sink::Stdout(tokio::io::stdout()),
            AuditSinkConfig::File(path) => Sink::File {
                file: open_append(path).await?,
                fsync: config.fsync,
            },
            AuditSinkConfig::Otlp {
                endpoint,
                service_name,
            } => Sink::Otlp(
                otlp::LogsSink::new(endpoint, service_name).map_err(std::io::Error::other)?,
            ),
            AuditSinkConfig::None => Sink::Discard,
        };
        let (queue, receiver) = mpsc::channel(config.queue_capacity);
        let written = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(write_loop(receiver, sink, written.clone()));
        Ok((
            AuditLog {
                queue,
                fail_closed: config.fail_closed,
                dropped: Arc::new(AtomicU64::new(0)),
                written,
            },
            task,
        ))
    }

    /// Whether calls are refused, rather than wait, when the queue is full.
    pub fn fail_closed(&self) -> bool {
        self.fail_closed
    }

    /// Takes a queue slot now, if there is one.
    pub fn try_reserve(&self) -> Option<Reservation> {
        self.queue.clone().try_reserve_owned().ok().map(Reservation)
    }

    /// Records an event, waiting for room in the queue. Events travel boxed: a call in flight
    /// holds a pointer to its event, not the event, in each state of its future.
    pub fn record(
        &self,
        event: impl Into<Box<AuditEvent>>,
    ) -> impl Future<Output = ()> + Send + '_ {
        let message = Message::Event(event.into());
        async move {
            if self.queue.send(message).await.is_err() {
                self.note_dropped();
            }
        }
    }

    /// Records into a slot taken earlier; never waits.
    pub fn record_reserved(&self, reservation: Reservation, event: Box<AuditEvent>) {
        reservation.send(event);
    }

    /// Records from a context that cannot wait (a dropped, cancelled call): queue now if there is
    /// room, otherwise hand the wait to a task.
    pub fn record_detached(&self, event: Box<AuditEvent>) {
        match self.queue.try_send(Message::Event(event)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(message)) => {
                let log = self.clone();
                match tokio::runtime::Handle::try_current() {
                    Ok(handle) => {
                        handle.spawn(async move {
                            if log.queue.send(message).await.is_err() {
                                log.note_dropped();
                            }
                        });
                    }
                    Err(_) => self.note_dropped(),
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => self.note_dropped(),
        }
    }

    /// Waits until every event queued before this call is written and flushed.
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.queue.send(Message::Flush(ack)).await.is_ok() {
            let _ = done.await;
        }
    }

    /// Events that could not be recorded (only if the writer died).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Events written so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Events waiting in the queue.
    pub fn queued(&self) -> usize {
        self.queue.max_capacity() - self.queue.capacity()
    }

    fn note_dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            dropped_total = self.dropped(),
            "audit event dropped: the audit writer has stopped"
        );
    }
}

async fn open_append(path: &PathBuf) -> std::io::Result<tokio::fs::File> {
    tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await
}

/// Events written at once, at most.
const MAX_BATCH: usize = 256;
/// How long the writer waits for more events before writing what it has. Without it, under load
/// each event or two was a write of its own (a blocking-pool hand-off and a syscall): ~14 µs of
/// CPU per call, a fifth of the sidecar's (docs/performance.md). Calls never wait for the write.
const GATHER_FOR: std::time::Duration = std::time::Duration::from_millis(2);

/// Adds what arrives within [`GATHER_FOR`] to `batch`, up to [`MAX_BATCH`]; returns at once
/// when someone waits for a flush or the queue is closed (shutdown drains, it does not wait).
async fn gather_more(receiver: &mut mpsc::Receiver<Message>, batch: &mut Vec<Message>) {
    let deadline = tokio::time::Instant::now() + GATHER_FOR;
    while batch.len() < MAX_BATCH
        && !batch.iter().any(|m| matches!(m, Message::Flush(_)))
        && !receiver.is_closed()
    {
        let room = MAX_BATCH - batch.len();
        match tokio::time::timeout_at(deadline, receiver.recv_many(batch, room)).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

async fn write_loop(
    mut receiver: mpsc::Receiver<Message>,
    mut sink: Sink,
    written: Arc<AtomicU64>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut events = Vec::with_capacity(MAX_BATCH);
    let mut lines = Vec::with_capacity(64 * 1024);
    while receiver.recv_many(&mut batch, MAX_BATCH).await > 0 {
        gather_more(&mut receiver, &mut batch).await;
        let mut acks = Vec::new();
        for message in batch.drain(..) {
            match message {
                Message::Event(event) => {
                    if serde_json::to_writer(&mut lines, &event).is_ok() {
                        lines.push(b'\n');
                        events.push(event);
                    }
                }
                Message::Flush(ack) => acks.push(ack),
            }
        }
        // A failing sink is retried with backoff, never skipped: losing events silently is worse
        // than making callers wait (or, fail-closed, refusing new calls while the queue is full).
        let mut delay = std::time::Duration::from_millis(10);
        while let Err(err) = sink.write(&events, &lines).await {
            tracing::error!(error = %err, retry_in_ms = delay.as_millis() as u64, "audit sink write failed");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(std::time::Duration::from_secs(5));
        }
        written.fetch_add(events.len() as u64, Ordering::Relaxed);
        events.clear();
        lines.clear();
        for ack in acks {
            let _ = ack.send(());
        }
    }
}

/// The OTLP logs sink: each event is a log record whose body is the event's JSON, with the
/// call's trace context and a few attributes for filtering.
mod otlp {
    use opentelemetry_proto::tonic::{
        collector::logs::v1::{ExportLogsServiceRequest, logs_service_client::LogsServiceClient},
        common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value},
        logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber},
        resource::v1::Resource,
    };
    use tonic::transport::Channel;

    use super::AuditEvent;

    pub struct LogsSink {
        client: LogsServiceClient<Channel>,
        resource: Resource,
    }

    fn text(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.to_owned())),
            }),
            ..Default::default()
        }
    }

    impl LogsSink {
        pub fn new(endpoint: &str, service_name: &str) -> Result<Self, String> {
            let channel = Channel::from_shared(endpoint.to_owned())
                .map_err(|err| format!("invalid audit endpoint {endpoint:?}: {err}"))?
                .connect_timeout(std::time::Duration::from_secs(5))
                .connect_lazy();
            Ok(LogsSink {
                client: LogsServiceClient::new(channel),
                resource: Resource {
                    attributes: vec![text("service.name", service_name)],
                    ..Default::default()
                },
            })
        }

        pub async fn export(&mut self, events: &[Box<AuditEvent>]) -> std::io::Result<()> {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            let records = events
                .iter()
                .map(|event| {
                    let time = humantime::parse_rfc3339(&event.time)
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map_or(now, |d| d.as_nanos() as u64);
                    let mut attributes = vec![
                        text("event.name", "toolgate.audit"),
                        text("toolgate.tenant", &event.tenant),
                        text("gen_ai.tool.name", &event.tool),
                        text("toolgate.status", event.status),
                    ];
                    if !event.call_id.is_empty() {
                        attributes.push(text("gen_ai.tool.call.id", &event.call_id));
                    }
                    LogRecord {
                        time_unix_nano: time,
                        observed_time_unix_nano: now,
                        severity_number: SeverityNumber::Info as i32,
                        severity_text: "INFO".into(),
                        body: Some(AnyValue {
                            value: Some(any_value::Value::StringValue(
                                serde_json::to_string(event).unwrap_or_default(),
                            )),
                        }),
                        attributes,
                        trace_id: event
                            .trace_id
                            .as_deref()
                            .and_then(|t| hex::decode(t).ok())
                            .unwrap_or_default(),
                        span_id: event
                            .span_id
                            .as_deref()
                            .and_then(|s| hex::decode(s).ok())
                            .unwrap_or_default(),
                        ..Default::default()
                    }
                })
                .collect();
            let request = ExportLogsServiceRequest {
                resource_logs: vec![ResourceLogs {
                    resource: Some(self.resource.clone()),
                    scope_logs: vec![ScopeLogs {
                        scope: Some(InstrumentationScope {
                            name: "toolgate.audit".into(),
                            ..Default::default()
                        }),
                        log_records: records,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
            };
            self.client
                .export(request)
                .await
                .map(|_| ())
                .map_err(|status| std::io::Error::other(format!("OTLP logs export: {status}")))
        }
    }
}
