//! Audit events: one per boundary decision, per approval decision and per refused caller, written
//! as JSON lines by a single writer behind a bounded queue (a task; for a file, a thread of its
//! own).
//!
//! A call takes its queue slot ([`Reservation`]) before anything happens — before a tool runs or
//! a decision is applied — and its event goes into that slot without waiting, whether the call
//! ends normally, is cancelled, panics or is stopped at shutdown: an executed call cannot lose its
//! event. A full queue makes new calls wait for a slot (backpressure), or in fail-closed mode
//! refuses them. A failing sink is retried from the first byte not written, never skipped and
//! never duplicated; [`AuditLog::flush`] drains the queue before the process exits.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use opentelemetry::trace::{SpanId, TraceId};
use serde::{Serialize, Serializer, ser::SerializeStruct};
use tokio::{
    io::AsyncWriteExt,
    sync::{Notify, mpsc, oneshot},
};

use crate::{
    identity::Caller,
    output_guard::Finding,
    settings::{AuditConfig, AuditSinkConfig, raw::RawFsync},
    tasks::Tasks,
};

mod definition_change;
mod json;
mod otlp;
mod refused;
mod shadow;

pub use definition_change::DefinitionChange;
pub use refused::RefusedCallers;
pub use shadow::{CandidateDecision, ShadowRecord};

/// What an event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    ToolCall,
    ApprovalDecision,
    /// A caller refused before the chain (UNAUTHENTICATED): no token material is recorded.
    AuthenticationFailed,
    /// The shadow catalog would have decided a call differently (`crate::shadow`).
    ShadowDecision,
    /// A pinned MCP tool's server lists another definition than its pin, or the pinned one
    /// again (`crate::catalog::pins`).
    ToolDefinitionChanged,
    /// An emergency deny set, cleared or expired (`crate::emergency`).
    EmergencyDeny,
}

/// One audit event. Raw arguments are never recorded, only their canonical SHA-256.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct AuditEvent {
    pub time: EventTime,
    pub kind: Option<EventKind>,
    pub call_id: Arc<str>,
    pub run_id: Arc<str>,
    pub step: u32,
    /// The door the call or decision came in by (`grpc`, `mcp`, `console`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub door: Option<&'static str>,
    /// `tenant`, `subject` and `agent`.
    #[serde(flatten)]
    pub party: Party,
    pub tool: Arc<str>,
    pub tool_version: Arc<str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub risk_level: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments_sha256: Option<Arc<str>>,
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
    /// What the output guard found in the tool's output: each detector that fired, how many
    /// matches and what it did — never what it matched.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub output_guard: Vec<Finding>,
    /// The flow labels the call added to its flow scope, once it ran.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub flow_labels: Vec<String>,
    /// The credential the backend was called with: kind, subject, actor, audience and the
    /// token's fingerprint, never the token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential: Option<std::sync::Arc<crate::credentials::CredentialUsed>>,
    pub duration_ms: u64,
    /// The call's trace, when traced (lowercase hex).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "as_display")]
    pub trace_id: Option<TraceId>,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "as_display")]
    pub span_id: Option<SpanId>,
    /// The arguments, only for tools with `record_arguments: true`, with `redact` pointers replaced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<serde_json::Value>,
    /// For refused callers: the gRPC method called.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rpc: Option<String>,
    /// For refused callers: the peer's address, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// For refused callers: events of this kind left out since the previous one (rate bound).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suppressed: Option<u64>,
    /// For shadow decisions: what differs, and the candidate catalog's decision.
    #[serde(flatten)]
    pub shadow: Option<Box<ShadowRecord>>,
    /// For tool definition changes: which tool, its pin and what its server lists.
    #[serde(flatten)]
    pub definition_change: Option<Box<DefinitionChange>>,
    /// For emergency denies: the deny.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub emergency_deny: Option<Box<crate::emergency::EmergencyDeny>>,
}

/// When an event happened, in Unix milliseconds; written as RFC 3339 with milliseconds. Kept as a
/// number until the line is written, so making an event formats nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventTime(pub i64);

impl EventTime {
    /// As a `SystemTime` (times before 1970 are written as 1970).
    fn system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(u64::try_from(self.0).unwrap_or(0))
    }
}

impl fmt::Display for EventTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        humantime::format_rfc3339_millis(self.system_time()).fmt(f)
    }
}

impl Serialize for EventTime {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Who an event is about. A tool call's event shares the caller the call was verified as
/// instead of copying its names; other events name theirs (an approval's requester, or nobody
/// for a refused caller).
#[derive(Debug, Clone)]
pub enum Party {
    Caller(Arc<Caller>),
    Named {
        tenant: String,
        subject: String,
        agent: String,
    },
}

impl Party {
    pub fn tenant(&self) -> &str {
        match self {
            Party::Caller(caller) => &caller.tenant,
            Party::Named { tenant, .. } => tenant,
        }
    }

    pub fn subject(&self) -> &str {
        match self {
            Party::Caller(caller) => &caller.subject,
            Party::Named { subject, .. } => subject,
        }
    }

    pub fn agent(&self) -> &str {
        match self {
            Party::Caller(caller) => &caller.agent,
            Party::Named { agent, .. } => agent,
        }
    }

    /// For a sub-agent's call: the chain it was made in, as records name it.
    pub fn delegation(&self) -> Option<DelegationRecord<'_>> {
        match self {
            Party::Caller(caller) => caller.delegation.as_deref().map(|d| DelegationRecord {
                root_subject: &caller.subject,
                agents: &d.chain,
                parent_call_id: &d.parent_call,
                run_id: &d.run,
                depth: d.depth,
                max_depth: d.max_depth,
            }),
            Party::Named { .. } => None,
        }
    }
}

/// A delegated caller's chain in an audit event (`delegation`): the person it works for, the
/// agents that handed off (the root caller's first), the call that handed off, the root run,
/// and the depth.
#[derive(Debug, Serialize)]
pub struct DelegationRecord<'a> {
    pub root_subject: &'a str,
    pub agents: &'a [String],
    pub parent_call_id: &'a str,
    pub run_id: &'a str,
    pub depth: u32,
    pub max_depth: u32,
}

impl Default for Party {
    fn default() -> Self {
        Party::Named {
            tenant: String::new(),
            subject: String::new(),
            agent: String::new(),
        }
    }
}

/// Equal when the recorded names are: how the party is held does not show in the line.
impl PartialEq for Party {
    fn eq(&self, other: &Self) -> bool {
        self.tenant() == other.tenant()
            && self.subject() == other.subject()
            && self.agent() == other.agent()
    }
}

impl Serialize for Party {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let delegation = self.delegation();
        let mut fields =
            serializer.serialize_struct("Party", 3 + usize::from(delegation.is_some()))?;
        fields.serialize_field("tenant", self.tenant())?;
        fields.serialize_field("subject", self.subject())?;
        fields.serialize_field("agent", self.agent())?;
        if let Some(delegation) = delegation {
            fields.serialize_field("delegation", &delegation)?;
        }
        fields.end()
    }
}

/// Serializes an optional id by its `Display` (lowercase hex for trace and span ids).
fn as_display<T: fmt::Display, S: Serializer>(
    value: &Option<T>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(value) => serializer.collect_str(value),
        None => serializer.serialize_none(),
    }
}

enum Message {
    Event(Box<AuditEvent>),
    Flush(oneshot::Sender<()>),
}

/// A slot in the queue, taken before a call or decision does anything; its event is then sent
/// without waiting, from whatever context ends the call (also `Drop`).
pub struct Reservation {
    permit: mpsc::OwnedPermit<Message>,
    urgent: Arc<Notify>,
}

impl Reservation {
    /// Sends the event into the slot; never waits. Past half the queue's capacity, the writer is
    /// told not to wait for the end of its gathering time.
    pub fn send(self, event: Box<AuditEvent>) {
        let queue = self.permit.send(Message::Event(event));
        if queue.capacity() < queue.max_capacity() / 2 {
            self.urgent.notify_one();
        }
    }
}

/// A handle for recording events; cheap to clone.
#[derive(Clone)]
pub struct AuditLog {
    queue: mpsc::Sender<Message>,
    /// Wakes the writer before the end of its gathering time.
    urgent: Arc<Notify>,
    fail_closed: bool,
    dropped: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
    write_errors: Arc<AtomicU64>,
}

/// Where events are written.
enum Sink {
    Stdout(tokio::io::Stdout),
    /// A std file, written with plain blocking writes so the bytes actually written are known: a
    /// retry after a partial write continues from there instead of repeating or tearing lines.
    /// Only the writer's own thread ([`AuditLog::start`]) holds it, so blocking there stalls
    /// nothing else, and a batch costs no hand-off to the blocking pool and back.
    File {
        file: std::fs::File,
        fsync: RawFsync,
    },
    Otlp(otlp::LogsSink),
    Discard,
}

impl Sink {
    /// Writes `lines[*done..]`, advancing `done` past every byte written, also on error.
    async fn write(
        &mut self,
        events: &[Box<AuditEvent>],
        lines: &Arc<Vec<u8>>,
        done: &mut usize,
    ) -> std::io::Result<()> {
        match self {
            Sink::Stdout(out) => {
                while *done < lines.len() {
                    match out.write(&lines[*done..]).await? {
                        0 => return Err(std::io::ErrorKind::WriteZero.into()),
                        n => *done += n,
                    }
                }
                out.flush().await
            }
            Sink::File { file, fsync } => write_file(file, lines, done, *fsync),
            Sink::Otlp(sink) => {
                // A batch is one export: all or nothing (a lost acknowledgement may repeat it).
                sink.export(events).await?;
                *done = lines.len();
                Ok(())
            }
            Sink::Discard => {
                *done = lines.len();
                Ok(())
            }
        }
    }
}

/// Writes `lines[*done..]` to the file, advancing `done` byte by byte as the kernel accepts them;
/// with `fsync: always`, each line is synced before the next is written.
fn write_file(
    file: &mut std::fs::File,
    lines: &[u8],
    done: &mut usize,
    fsync: RawFsync,
) -> std::io::Result<()> {
    use std::io::Write as _;
    let write_to = |file: &mut std::fs::File, end: usize, done: &mut usize| {
        while *done < end {
            match file.write(&lines[*done..end]) {
                Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero)),
                Ok(n) => *done += n,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    };
    if fsync == RawFsync::Always {
        // One durable line at a time: an acknowledged event survives a crash.
        while *done < lines.len() {
            let end = lines[*done..]
                .iter()
                .position(|b| *b == b'\n')
                .map_or(lines.len(), |i| *done + i + 1);
            write_to(file, end, done)?;
            file.sync_data()?;
        }
        return Ok(());
    }
    write_to(file, lines.len(), done)?;
    if fsync == RawFsync::Batch {
        file.sync_data()?;
    }
    Ok(())
}

impl AuditLog {
    /// Starts the writer for the configured sink in `writer`'s group: a task, or for a file a
    /// thread of its own (with a task that stands for it). Stopping the group stops the writer
    /// and closes the sink; [`AuditLog::flush`] first, to write what is queued.
    pub async fn start(config: &AuditConfig, tasks: &Tasks) -> std::io::Result<AuditLog> {
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
        let write_errors = Arc::new(AtomicU64::new(0));
        let urgent = Arc::new(Notify::new());
        let writer = write_loop(
            receiver,
            urgent.clone(),
            sink,
            written.clone(),
            write_errors.clone(),
        );
        if matches!(config.sink, AuditSinkConfig::File(_)) {
            on_own_thread(writer, tasks)?;
        } else {
            tasks.spawn("audit-writer", writer);
        }
        Ok(AuditLog {
            queue,
            urgent,
            fail_closed: config.fail_closed,
            dropped: Arc::new(AtomicU64::new(0)),
            written,
            write_errors,
        })
    }

    /// Whether calls are refused, rather than wait, when the queue is full.
    pub fn fail_closed(&self) -> bool {
        self.fail_closed
    }

    fn reservation(&self, permit: mpsc::OwnedPermit<Message>) -> Reservation {
        Reservation {
            permit,
            urgent: self.urgent.clone(),
        }
    }

    /// Takes a queue slot now, if there is one.
    pub fn try_reserve(&self) -> Option<Reservation> {
        self.queue
            .clone()
            .try_reserve_owned()
            .ok()
            .map(|permit| self.reservation(permit))
    }

    /// Takes a queue slot, waiting for one while the queue is full; `None` only if the writer
    /// has stopped (counted as dropped).
    pub async fn reserve(&self) -> Option<Reservation> {
        match self.queue.clone().reserve_owned().await {
            Ok(permit) => Some(self.reservation(permit)),
            Err(_) => {
                self.note_dropped();
                None
            }
        }
    }

    /// Records one event, waiting for room in the queue.
    pub async fn record(&self, event: Box<AuditEvent>) {
        if let Some(slot) = self.reserve().await {
            slot.send(event);
        }
    }

    /// Waits until every event queued before this call is written and flushed.
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.queue.send(Message::Flush(ack)).await.is_ok() {
            self.urgent.notify_one();
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

    /// Failed writes to the sink so far (each retried until it succeeds).
    pub fn write_errors(&self) -> u64 {
        self.write_errors.load(Ordering::Relaxed)
    }

    /// Events waiting in the queue, and slots reserved by calls in flight.
    pub fn queued(&self) -> usize {
        self.queue.max_capacity() - self.queue.capacity()
    }

    /// A slot for an event that must not be lost, or `None` (counted as dropped) when a call
    /// ends without one — which the boundary never does.
    pub fn note_dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            dropped_total = self.dropped(),
            "audit event dropped: the audit writer has stopped"
        );
    }
}

async fn open_append(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Runs the file writer on a thread of its own, with a single-threaded runtime for its timer and
/// queue: a batch then costs that one thread's wake-ups (the first event of a quiet spell, the
/// end of the gathering time), where a writer task on the shared runtime woke a blocking-pool
/// thread for each write and was woken back by it — two more wake-ups per batch, the largest
/// share of the sidecar's thread hops at moderate rates (docs/performance.md). A task of
/// `tasks` stands for the thread: the thread stops when the group does, and the task ends
/// only once the thread has (the sink closed).
fn on_own_thread(
    writer: impl std::future::Future<Output = ()> + Send + 'static,
    tasks: &Tasks,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let stop = tasks.token();
    let (ended, end) = oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("toolgate-audit".into())
        .spawn(move || {
            runtime.block_on(async move {
                tokio::select! {
                    () = writer => {}
                    () = stop.cancelled() => {}
                }
            });
            let _ = ended.send(());
        })?;
    tasks.spawn_until_stopped("audit-writer", |_| async move {
        let _ = end.await;
    });
    Ok(())
}

/// Events written at once, at most.
const MAX_BATCH: usize = 1024;
/// How long the writer lets events gather before writing them in one go. Senders never wake the
/// writer while it gathers (it is not polling the queue), so a call costs no thread wake-up of
/// its own. After the first event of a quiet spell wakes it, the writer stays on its timer while
/// events keep coming: one wake-up per batch, and none once a tick finds nothing to write.
/// A flush, a queue past half full, or shutdown cut the wait short. Calls never wait for writes.
const GATHER_FOR: std::time::Duration = std::time::Duration::from_millis(10);

/// Waits for the end of the gathering time, unless something needs the writer sooner.
async fn gather(receiver: &mpsc::Receiver<Message>, urgent: &Notify, batch: &[Message]) {
    if batch.iter().any(|m| matches!(m, Message::Flush(_))) || receiver.is_closed() {
        return;
    }
    tokio::select! {
        _ = tokio::time::sleep(GATHER_FOR) => {}
        _ = urgent.notified() => {}
    }
}

async fn write_loop(
    mut receiver: mpsc::Receiver<Message>,
    urgent: Arc<Notify>,
    mut sink: Sink,
    written: Arc<AtomicU64>,
    write_errors: Arc<AtomicU64>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut events = Vec::with_capacity(MAX_BATCH);
    let mut buffer = Vec::with_capacity(64 * 1024);
    // Whether the last batch was written: then the next one gathers on the timer at once, rather
    // than after the first of its events has woken the writer (two wake-ups per batch).
    let mut flowing = false;
    loop {
        if flowing && receiver.is_empty() {
            gather(&receiver, &urgent, &batch).await;
        }
        if receiver.is_empty() {
            // A quiet spell: wait for its first event, then let more gather on the timer.
            if receiver.recv_many(&mut batch, MAX_BATCH).await == 0 {
                return;
            }
            gather(&receiver, &urgent, &batch).await;
        }
        // Whatever is queued now, without waiting (a busy queue is written back to back).
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(message) => batch.push(message),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            if receiver.is_closed() && receiver.is_empty() {
                return;
            }
            flowing = false;
            continue;
        }
        let mut acks = Vec::new();
        for message in batch.drain(..) {
            match message {
                Message::Event(event) => {
                    let line_start = buffer.len();
                    if event.write_json(&mut buffer).is_ok() {
                        buffer.push(b'\n');
                        events.push(event);
                    } else {
                        // Never a torn line in the file.
                        buffer.truncate(line_start);
                    }
                }
                Message::Flush(ack) => acks.push(ack),
            }
        }
        // A failing sink is retried with backoff, never skipped: losing events silently is worse
        // than making callers wait (or, fail-closed, refusing new calls while the queue is full).
        // Each retry starts at the first byte not yet written.
        let lines = Arc::new(std::mem::take(&mut buffer));
        let mut done = 0;
        let mut delay = std::time::Duration::from_millis(10);
        while let Err(err) = sink.write(&events, &lines, &mut done).await {
            write_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %err, written_bytes = done, pending_bytes = lines.len() - done, retry_in_ms = delay.as_millis() as u64, "audit sink write failed");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(std::time::Duration::from_secs(5));
        }
        written.fetch_add(events.len() as u64, Ordering::Relaxed);
        events.clear();
        // Reuse the allocation when the blocking write has given its handle back.
        buffer = Arc::try_unwrap(lines).unwrap_or_default();
        buffer.clear();
        for ack in acks {
            let _ = ack.send(());
        }
        flowing = true;
    }
}

#[cfg(test)]
mod tests {
    use std::{future::Future, pin::Pin, task::Poll};

    use super::*;

    /// The writer's future, counting its polls: each one after the first is a wake-up.
    struct Counted<F> {
        writer: Pin<Box<F>>,
        polls: Arc<AtomicU64>,
    }

    impl<F: Future> Future for Counted<F> {
        type Output = F::Output;

        fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            self.writer.as_mut().poll(cx)
        }
    }

    async fn flush(queue: &mpsc::Sender<Message>) {
        let (ack, done) = oneshot::channel();
        queue.send(Message::Flush(ack)).await.unwrap();
        done.await.unwrap();
    }

    /// At a moderate rate (500 events a second, 5 per gathering time) the writer wakes once per
    /// batch, on its timer, not also for the first event of each; once events stop it parks.
    #[tokio::test(start_paused = true)]
    async fn while_events_flow_the_writer_wakes_once_per_batch_and_never_when_idle() {
        let (queue, receiver) = mpsc::channel(1024);
        let written = Arc::new(AtomicU64::new(0));
        let polls = Arc::new(AtomicU64::new(0));
        let writer = write_loop(
            receiver,
            Arc::new(Notify::new()),
            Sink::Discard,
            written.clone(),
            Arc::default(),
        );
        let task = tokio::spawn(Counted {
            writer: Box::pin(writer),
            polls: polls.clone(),
        });

        let events = 500;
        let every = Duration::from_millis(2);
        let started = tokio::time::Instant::now();
        for _ in 0..events {
            queue
                .send(Message::Event(Box::default()))
                .await
                .expect("the writer runs");
            tokio::time::sleep(every).await;
        }
        let ticks = started.elapsed().as_millis() / GATHER_FOR.as_millis();
        let woken = polls.load(Ordering::Relaxed);
        assert!(
            u128::from(woken) <= ticks + 2,
            "{woken} wake-ups for {events} events over {ticks} gathering times"
        );

        // Written in full; then, with nothing to write, the writer stays parked.
        flush(&queue).await;
        assert_eq!(written.load(Ordering::Relaxed), events);
        let parked = polls.load(Ordering::Relaxed);
        tokio::time::sleep(GATHER_FOR * 100).await;
        assert!(
            polls.load(Ordering::Relaxed) <= parked + 1,
            "the writer woke {} times in a second without events",
            polls.load(Ordering::Relaxed) - parked
        );
        drop(queue);
        task.await.unwrap();
    }
}
