//! A small in-process OTLP/gRPC trace collector for integration tests and the load benchmark: a
//! tonic server implementing the standard `TraceService` on an ephemeral loopback port, keeping
//! what it receives in memory so tests can assert on spans and their resource.
//!
//! Memory is bounded: at most [`Collector::capacity`] spans are kept (oldest dropped first, and
//! counted in [`Collector::dropped`]); [`Collector::received`] counts every span ever exported.
//! Waiting is event driven: each export bumps a `watch` channel, so [`Collector::wait_for_spans`]
//! wakes on exports instead of sleeping and polling.
//!
//! It also implements the standard `LogsService` on the same address (an OTLP endpoint serves
//! every signal), keeping up to [`MAX_LOG_RECORDS`] log records: toolgate's `sink: otlp` audit
//! events arrive there.
//!
//! Include it with `#[path = "../common/otlp_collector.rs"] mod otlp_collector;` and point the
//! code under test at [`Collector::endpoint`] (e.g. `OTEL_EXPORTER_OTLP_ENDPOINT`).

#![allow(
    dead_code,
    reason = "shared by the integration tests and the load harness, each using part of it"
)]

use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use opentelemetry_proto::tonic::{
    collector::{
        logs::v1::{
            ExportLogsServiceRequest, ExportLogsServiceResponse,
            logs_service_server::{LogsService, LogsServiceServer},
        },
        trace::v1::{
            ExportTraceServiceRequest, ExportTraceServiceResponse,
            trace_service_server::{TraceService, TraceServiceServer},
        },
    },
    common::v1::{KeyValue, any_value},
    logs::v1::LogRecord,
    trace::v1::{ResourceSpans, Span},
};
use tokio::{
    net::TcpListener,
    sync::{oneshot, watch},
    task::JoinHandle,
};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// How many spans a collector keeps unless told otherwise.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// The most log records kept; later ones are counted, not kept.
pub const MAX_LOG_RECORDS: usize = 100_000;

/// The largest export request accepted (the SDK's batches are far smaller).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// A running collector. Dropping it stops the server.
pub struct Collector {
    /// The loopback address it listens on.
    pub addr: SocketAddr,
    store: Arc<Store>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// Starts a collector on `127.0.0.1:0` that keeps up to [`DEFAULT_CAPACITY`] spans.
pub async fn start() -> Collector {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    start_on(listener, DEFAULT_CAPACITY).await
}

/// Starts a collector on an already bound listener, so a caller can learn the port (and, say,
/// set `OTEL_EXPORTER_OTLP_ENDPOINT`) before any runtime or thread exists.
pub async fn start_on(listener: std::net::TcpListener, capacity: usize) -> Collector {
    listener
        .set_nonblocking(true)
        .expect("a non-blocking listener");
    let listener = TcpListener::from_std(listener).expect("a tokio listener");
    let addr = listener.local_addr().expect("a local address");
    let store = Arc::new(Store::new(capacity.max(1)));
    let service = TraceServiceServer::new(Receiver {
        store: store.clone(),
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let logs = LogsServiceServer::new(Receiver {
        store: store.clone(),
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(service)
            .add_service(logs)
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await;
        if let Err(err) = served {
            eprintln!("otlp collector stopped with an error: {err}");
        }
    });
    Collector {
        addr,
        store,
        stop: Some(stop),
        task: Some(task),
    }
}

impl Collector {
    /// Refuses the next `exports` trace exports with `code`, keeping nothing from them.
    pub fn refuse_next(&self, exports: u64, code: tonic::Code) {
        self.store
            .with(|inner| inner.refuse = Some((exports, code)));
    }

    /// Trace exports refused so far (see [`Collector::refuse_next`]).
    pub fn refused(&self) -> u64 {
        self.store.with(|inner| inner.refused)
    }

    /// A request header of the last trace export accepted.
    pub fn last_header(&self, name: &str) -> Option<String> {
        self.store.with(|inner| {
            inner
                .last_headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        })
    }

    /// The endpoint to give an OTLP/gRPC exporter: `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span kept, in arrival order, flattened out of their resource and scope.
    pub fn spans(&self) -> Vec<Span> {
        self.store.with(|inner| {
            inner
                .batches
                .iter()
                .flat_map(|rs| &rs.scope_spans)
                .flat_map(|ss| ss.spans.iter().cloned())
                .collect()
        })
    }

    /// The export batches kept, with their resource (e.g. `service.name`) and scope.
    pub fn resource_spans(&self) -> Vec<ResourceSpans> {
        self.store
            .with(|inner| inner.batches.iter().cloned().collect())
    }

    /// Spans received since the collector started, including dropped ones.
    pub fn received(&self) -> u64 {
        *self.store.received.borrow()
    }

    /// Spans received so far from the resource whose `service.name` is `service`.
    pub fn received_from(&self, service: &str) -> u64 {
        self.store
            .with(|inner| inner.by_service.get(service).copied().unwrap_or(0))
    }

    /// Spans dropped to stay within the capacity.
    pub fn dropped(&self) -> u64 {
        self.store.with(|inner| inner.dropped)
    }

    /// Export requests received.
    pub fn exports(&self) -> u64 {
        self.store.with(|inner| inner.exports)
    }

    /// The most spans kept at once.
    pub fn capacity(&self) -> usize {
        self.store.capacity
    }

    /// Forgets every span kept (counters keep counting).
    pub fn clear(&self) {
        self.store.with(|inner| {
            inner.batches.clear();
            inner.kept = 0;
        });
    }

    /// Waits until `predicate` holds for the spans kept, and returns them; panics with what was
    /// received if it does not hold within `timeout` (for tests).
    pub async fn wait_for_spans(
        &self,
        predicate: impl Fn(&[Span]) -> bool,
        timeout: Duration,
    ) -> Vec<Span> {
        match self.try_wait_for_spans(predicate, timeout).await {
            Ok(spans) => spans,
            Err(spans) => {
                let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
                panic!(
                    "no matching spans within {timeout:?}; {} kept: {names:?}",
                    spans.len()
                )
            }
        }
    }

    /// Like [`Self::wait_for_spans`], but returns `Err` with the spans kept on timeout.
    pub async fn try_wait_for_spans(
        &self,
        predicate: impl Fn(&[Span]) -> bool,
        timeout: Duration,
    ) -> Result<Vec<Span>, Vec<Span>> {
        let deadline = tokio::time::Instant::now() + timeout;
        // Subscribe before looking, so an export landing in between still wakes us.
        let mut exported = self.store.received.subscribe();
        loop {
            let spans = self.spans();
            if predicate(&spans) {
                return Ok(spans);
            }
            match tokio::time::timeout_at(deadline, exported.changed()).await {
                Ok(Ok(())) => continue,
                // Timed out, or the collector is gone: one last look.
                _ => {
                    let spans = self.spans();
                    return if predicate(&spans) {
                        Ok(spans)
                    } else {
                        Err(spans)
                    };
                }
            }
        }
    }

    /// Waits until at least `count` spans were received in all, or `timeout` passes; returns
    /// the number received.
    pub async fn wait_for_received(&self, count: u64, timeout: Duration) -> u64 {
        let mut exported = self.store.received.subscribe();
        let _ = tokio::time::timeout(timeout, exported.wait_for(|n| *n >= count)).await;
        self.received()
    }

    /// Waits until no span arrives for `quiet` (or `limit` passes); returns the number received.
    pub async fn wait_until_quiet(&self, quiet: Duration, limit: Duration) -> u64 {
        let deadline = tokio::time::Instant::now() + limit;
        let mut exported = self.store.received.subscribe();
        loop {
            let until = (tokio::time::Instant::now() + quiet).min(deadline);
            match tokio::time::timeout_at(until, exported.changed()).await {
                Ok(Ok(())) if tokio::time::Instant::now() < deadline => continue,
                _ => return self.received(),
            }
        }
    }

    /// Log records received (kept up to [`MAX_LOG_RECORDS`]), in arrival order.
    pub fn log_records(&self) -> Vec<LogRecord> {
        self.store.with(|inner| inner.logs.clone())
    }

    /// Waits until `predicate` holds for the log records kept, and returns them; panics with
    /// what was received if it does not hold within `timeout`.
    pub async fn wait_for_logs(
        &self,
        predicate: impl Fn(&[LogRecord]) -> bool,
        timeout: Duration,
    ) -> Vec<LogRecord> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut exported = self.store.logs_received.subscribe();
        loop {
            let records = self.log_records();
            if predicate(&records) {
                return records;
            }
            if tokio::time::timeout_at(deadline, exported.changed())
                .await
                .is_err()
            {
                let records = self.log_records();
                assert!(
                    predicate(&records),
                    "no matching log records within {timeout:?}; {} kept",
                    records.len()
                );
                return records;
            }
        }
    }

    /// Stops the server and waits for it to finish.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The string value of attribute `key`, if it is set and a string.
pub fn string_attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|value| match &value.value {
            Some(any_value::Value::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
}

/// The spans kept and the counters, behind one lock; `received` is also a watch channel.
struct Store {
    capacity: usize,
    inner: Mutex<Inner>,
    received: watch::Sender<u64>,
    logs_received: watch::Sender<u64>,
}

#[derive(Default)]
struct Inner {
    /// Export batches in arrival order; none of them is empty.
    batches: VecDeque<ResourceSpans>,
    /// Spans in `batches`.
    kept: usize,
    dropped: u64,
    exports: u64,
    logs: Vec<LogRecord>,
    /// Trace exports still to refuse, and with which code; and how many were refused.
    refuse: Option<(u64, tonic::Code)>,
    refused: u64,
    /// The request headers of the last trace export accepted.
    last_headers: tonic::metadata::MetadataMap,
    /// Spans received per `service.name` (never trimmed).
    by_service: std::collections::HashMap<String, u64>,
}

impl Store {
    fn new(capacity: usize) -> Self {
        Store {
            capacity,
            inner: Mutex::default(),
            received: watch::channel(0).0,
            logs_received: watch::channel(0).0,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        // A panic while holding the lock cannot leave the store inconsistent enough to matter.
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    fn add(&self, batches: Vec<ResourceSpans>) {
        let mut added = 0u64;
        self.with(|inner| {
            inner.exports += 1;
            for mut batch in batches {
                batch.scope_spans.retain(|ss| !ss.spans.is_empty());
                let spans: usize = batch.scope_spans.iter().map(|ss| ss.spans.len()).sum();
                if spans == 0 {
                    continue;
                }
                added += spans as u64;
                let service = batch
                    .resource
                    .as_ref()
                    .and_then(|r| string_attribute(&r.attributes, "service.name"))
                    .unwrap_or_default();
                *inner.by_service.entry(service).or_default() += spans as u64;
                inner.kept += spans;
                inner.batches.push_back(batch);
            }
            inner.trim(self.capacity);
        });
        if added > 0 {
            self.received.send_modify(|n| *n += added);
        }
    }
}

impl Inner {
    /// Drops the oldest spans until at most `capacity` are kept.
    fn trim(&mut self, capacity: usize) {
        while self.kept > capacity {
            let excess = self.kept - capacity;
            let Some(front) = self.batches.front_mut() else {
                self.kept = 0;
                return;
            };
            if let Some(scope) = front.scope_spans.first_mut() {
                let n = excess.min(scope.spans.len());
                scope.spans.drain(..n);
                self.kept -= n;
                self.dropped += n as u64;
                if scope.spans.is_empty() {
                    front.scope_spans.remove(0);
                }
            }
            if front.scope_spans.is_empty() {
                self.batches.pop_front();
            }
        }
    }
}

/// The gRPC service: stores what it is sent and always accepts it whole.
struct Receiver {
    store: Arc<Store>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let refused = self.store.with(|inner| match &mut inner.refuse {
            Some((left, code)) if *left > 0 => {
                *left -= 1;
                inner.refused += 1;
                Some(*code)
            }
            _ => {
                inner.last_headers = request.metadata().clone();
                None
            }
        });
        if let Some(code) = refused {
            return Err(Status::new(code, "refused by the test collector"));
        }
        self.store.add(request.into_inner().resource_spans);
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tonic::async_trait]
impl LogsService for Receiver {
    async fn export(
        &self,
        request: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        let records: Vec<LogRecord> = request
            .into_inner()
            .resource_logs
            .into_iter()
            .flat_map(|r| r.scope_logs)
            .flat_map(|s| s.log_records)
            .collect();
        let added = records.len() as u64;
        self.store.with(|inner| {
            let room = MAX_LOG_RECORDS.saturating_sub(inner.logs.len());
            inner.logs.extend(records.into_iter().take(room));
        });
        self.store.logs_received.send_modify(|n| *n += added);
        Ok(Response::new(ExportLogsServiceResponse {
            partial_success: None,
        }))
    }
}
