//! Audit events: one per boundary decision and per approval decision, written as JSON lines by a
//! single writer task behind a bounded queue. A full queue makes callers wait (backpressure)
//! rather than lose events; [`AuditLog::flush`] drains the queue before the process exits.

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
    io::{AsyncWrite, AsyncWriteExt},
    sync::{mpsc, oneshot},
    task::JoinHandle,
};

use crate::config::{AuditConfig, AuditSinkConfig};

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

/// A handle for recording events; cheap to clone.
#[derive(Clone)]
pub struct AuditLog {
    queue: mpsc::Sender<Message>,
    dropped: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
}

impl AuditLog {
    /// Starts the writer task for the configured sink.
    pub async fn start(config: &AuditConfig) -> std::io::Result<(AuditLog, JoinHandle<()>)> {
        let sink: Box<dyn AsyncWrite + Send + Unpin> = match &config.sink {
            AuditSinkConfig::Stdout => Box::new(tokio::io::stdout()),
            AuditSinkConfig::File(path) => Box::new(open_append(path).await?),
            AuditSinkConfig::None => Box::new(tokio::io::sink()),
        };
        let (queue, receiver) = mpsc::channel(config.queue_capacity);
        let written = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(write_loop(receiver, sink, written.clone()));
        Ok((
            AuditLog {
                queue,
                dropped: Arc::new(AtomicU64::new(0)),
                written,
            },
            task,
        ))
    }

    /// Records an event, waiting for room in the queue.
    pub async fn record(&self, event: AuditEvent) {
        if self
            .queue
            .send(Message::Event(Box::new(event)))
            .await
            .is_err()
        {
            self.note_dropped();
        }
    }

    /// Records from a context that cannot wait (a dropped, cancelled call): queue now if there is
    /// room, otherwise hand the wait to a task.
    pub fn record_detached(&self, event: AuditEvent) {
        match self.queue.try_send(Message::Event(Box::new(event))) {
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

async fn write_loop(
    mut receiver: mpsc::Receiver<Message>,
    mut sink: Box<dyn AsyncWrite + Send + Unpin>,
    written: Arc<AtomicU64>,
) {
    let mut batch = Vec::with_capacity(256);
    let mut buffer = Vec::with_capacity(64 * 1024);
    while receiver.recv_many(&mut batch, 256).await > 0 {
        let mut acks = Vec::new();
        let mut count = 0;
        for message in batch.drain(..) {
            match message {
                Message::Event(event) => {
                    if serde_json::to_writer(&mut buffer, &event).is_ok() {
                        buffer.push(b'\n');
                        count += 1;
                    }
                }
                Message::Flush(ack) => acks.push(ack),
            }
        }
        // A sink error is logged and retried on the next batch rather than ending the writer,
        // which would make every later call wait forever.
        if let Err(err) = write_all(&mut sink, &buffer, !acks.is_empty()).await {
            tracing::error!(error = %err, "audit sink write failed");
        } else {
            written.fetch_add(count, Ordering::Relaxed);
        }
        buffer.clear();
        for ack in acks {
            let _ = ack.send(());
        }
    }
    let _ = sink.flush().await;
}

async fn write_all(
    sink: &mut (dyn AsyncWrite + Send + Unpin),
    bytes: &[u8],
    flush: bool,
) -> std::io::Result<()> {
    if !bytes.is_empty() {
        sink.write_all(bytes).await?;
    }
    if flush || !bytes.is_empty() {
        sink.flush().await?;
    }
    Ok(())
}
