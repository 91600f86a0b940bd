//! The queue between finished spans and the OTLP exporter, and the thread that drains it.
//!
//! The SDK's `BatchSpanProcessor` keeps finished spans in a channel allocated whole when it is
//! made (~370 bytes a slot, touched up front: idle memory for a queue that is empty at rest), and
//! at this machine's maximum call rate its 4,096 slots overflowed now and then while the export
//! thread waited for a CPU: the load harness saw 207 of 1.68 million spans dropped. Here the
//! queue is a `Vec` that grows as spans arrive and is handed whole to the exporter, so memory is
//! held only while spans wait, and the bound can be generous (8,192 by default). A queued span
//! holds ~2 KiB with its attributes: with the collector down the queue fills and the sidecar
//! holds ~17 MiB more until it drains (measured: 22.6 MiB anonymous against 5.5 after 30,000 and
//! after 60,000 calls). Beyond the bound a span is dropped, counted and logged, never queued
//! without limit.
//!
//! The export thread wakes when the queue reaches a batch's size or the batch delay has passed,
//! not per span; a worker only takes a lock and pushes.

use std::{
    sync::{
        Arc, Condvar, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use opentelemetry_sdk::{
    error::{OTelSdkError, OTelSdkResult},
    trace::{SpanData, SpanExporter, SpanProcessor},
};

/// How spans are batched; see [`super::TelemetryConfig`].
#[derive(Debug, Clone, Copy)]
pub struct BatchSettings {
    pub delay: Duration,
    pub max_queue_size: usize,
    pub max_export_batch_size: usize,
}

/// Spans waiting that make an export due before the batch delay has passed, once the last export
/// began at least [`MIN_EXPORT_GAP`] ago. At a few thousand calls a second, one batch per delay
/// is hundreds of spans encoded and sent at once: a burst of CPU that holds up the calls in
/// progress on a two-core pod (+0.3 ms at p99 at 3,000 calls/s, docs/performance.md). Batches of
/// this size spread the same work thinly; at low rates the delay still comes first.
const EARLY_EXPORT_SPANS: usize = 64;
/// The least time between the start of one export and an early one: each request has a fixed
/// cost, so at the highest rates batches grow past [`EARLY_EXPORT_SPANS`] instead of requests
/// multiplying.
const MIN_EXPORT_GAP: Duration = Duration::from_millis(10);

/// Spans that were never exported, by cause, since start; read by the metrics.
#[derive(Debug, Default)]
pub struct SpanLosses {
    queue_full: AtomicU64,
    export_failed: AtomicU64,
}

impl SpanLosses {
    /// Dropped because the export queue was full.
    pub fn queue_full(&self) -> u64 {
        self.queue_full.load(Ordering::Relaxed)
    }

    /// Sent in an export request that failed.
    pub fn export_failed(&self) -> u64 {
        self.export_failed.load(Ordering::Relaxed)
    }
}

/// A span processor that queues sampled spans and exports them in batches from its own thread.
#[derive(Debug)]
pub struct BatchExport {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the export thread: a full batch, a flush, or shutdown.
    wake_exporter: Condvar,
    /// Wakes callers of `force_flush` and `shutdown` when the thread has caught up.
    caught_up: Condvar,
    settings: BatchSettings,
    losses: Arc<SpanLosses>,
}

#[derive(Debug, Default)]
struct State {
    pending: Vec<SpanData>,
    /// Flush requests made, and the last one the export thread has finished.
    flush_requested: u64,
    flush_done: u64,
    shutdown: bool,
    /// Set by the thread when it has exported everything and stopped.
    stopped: bool,
    /// The export thread sleeps until a span arrives (a batch delay passed with none waiting):
    /// the first span wakes it.
    exporter_parked: bool,
    /// How often the export thread has woken up (the tests count them).
    exporter_wakeups: u64,
}

impl BatchExport {
    pub fn start<E>(exporter: E, settings: BatchSettings) -> std::io::Result<Self>
    where
        E: SpanExporter + 'static,
    {
        let settings = BatchSettings {
            max_queue_size: settings.max_queue_size.max(1),
            max_export_batch_size: settings
                .max_export_batch_size
                .clamp(1, settings.max_queue_size.max(1)),
            ..settings
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake_exporter: Condvar::new(),
            caught_up: Condvar::new(),
            settings,
            losses: Arc::default(),
        });
        let thread = std::thread::Builder::new()
            .name("toolgate-spans".into())
            .spawn({
                let shared = shared.clone();
                move || export_loop(&shared, exporter)
            })?;
        Ok(BatchExport {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// What it lost, counted as it happens.
    pub fn losses(&self) -> Arc<SpanLosses> {
        self.shared.losses.clone()
    }

    /// Waits until the export thread has taken everything queued before the call, and
    /// exported it, or until `timeout`.
    fn wait_flushed(&self, timeout: Duration) -> OTelSdkResult {
        let mut state = self.shared.lock();
        if state.stopped {
            return Ok(());
        }
        state.flush_requested += 1;
        let wanted = state.flush_requested;
        self.shared.wake_exporter.notify_one();
        self.shared
            .wait_caught_up(state, timeout, |s| s.flush_done < wanted && !s.stopped)
            .map(drop)
    }
}

impl Shared {
    /// The state; a panic elsewhere while holding the lock leaves it usable (it holds only
    /// plain values, each update complete).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for the export thread while `waiting` holds, at most `timeout`.
    fn wait_caught_up<'a>(
        &self,
        state: MutexGuard<'a, State>,
        timeout: Duration,
        waiting: impl FnMut(&mut State) -> bool,
    ) -> Result<MutexGuard<'a, State>, OTelSdkError> {
        let (state, wait) = self
            .caught_up
            .wait_timeout_while(state, timeout, waiting)
            .unwrap_or_else(PoisonError::into_inner);
        match wait.timed_out() {
            true => Err(OTelSdkError::Timeout(timeout)),
            false => Ok(state),
        }
    }
}

impl SpanProcessor for BatchExport {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let mut state = self.shared.lock();
        if state.shutdown {
            return;
        }
        if state.pending.len() >= self.shared.settings.max_queue_size {
            if self
                .shared
                .losses
                .queue_full
                .fetch_add(1, Ordering::Relaxed)
                == 0
            {
                tracing::warn!(
                    max_queue_size = self.shared.settings.max_queue_size,
                    "span export queue full: spans are being dropped (counted; the total is logged at shutdown)"
                );
            }
            return;
        }
        state.pending.push(span);
        // Only the first span after a quiet spell (the exporter sleeps untimed), or the span that
        // makes an early export due or completes a batch, wakes the exporter; the rest wait for
        // it or for the batch delay.
        let waiting = state.pending.len();
        if std::mem::take(&mut state.exporter_parked)
            || waiting == EARLY_EXPORT_SPANS
            || waiting == self.shared.settings.max_export_batch_size
        {
            self.shared.wake_exporter.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.wait_flushed(Duration::from_secs(5))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        {
            let mut state = self.shared.lock();
            if state.shutdown {
                return Ok(());
            }
            state.shutdown = true;
            self.shared.wake_exporter.notify_one();
        }
        let state = self.shared.lock();
        drop(self.shared.wait_caught_up(state, timeout, |s| !s.stopped)?);
        let dropped = self.shared.losses.queue_full();
        if dropped > 0 {
            tracing::warn!(dropped, "spans dropped with the export queue full, in all");
        }
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        Ok(())
    }
}

/// Exports what is queued whenever a batch is full, enough spans wait for an early export, the
/// delay has passed, a flush is asked for, or at shutdown (then everything, and the exporter is
/// shut down).
fn export_loop<E: SpanExporter>(shared: &Shared, exporter: E) {
    let settings = shared.settings;
    let mut next_export = Instant::now() + settings.delay;
    let mut last_export = Instant::now();
    // Spans lost since export started failing, if it is failing.
    let mut lost = None;
    loop {
        let mut state = shared.lock();
        loop {
            let now = Instant::now();
            let due = now >= next_export && !state.pending.is_empty();
            let early_at =
                (state.pending.len() >= EARLY_EXPORT_SPANS).then_some(last_export + MIN_EXPORT_GAP);
            if state.shutdown
                || state.flush_requested > state.flush_done
                || state.pending.len() >= settings.max_export_batch_size
                || due
                || early_at.is_some_and(|at| now >= at)
            {
                break;
            }
            if now >= next_export {
                if state.pending.is_empty() {
                    // A batch delay passed with nothing to send: sleep until a span comes (or a
                    // flush, or shutdown) instead of waking every delay, which an idle sidecar
                    // would pay forever; the span's batch then gathers for one delay.
                    state.exporter_parked = true;
                    state = shared
                        .wake_exporter
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                    state.exporter_parked = false;
                    state.exporter_wakeups += 1;
                    next_export = Instant::now() + settings.delay;
                    continue;
                }
                next_export = now + settings.delay;
            }
            let wake_at = early_at.map_or(next_export, |at| at.min(next_export));
            let wait = wake_at.saturating_duration_since(now);
            state = shared
                .wake_exporter
                .wait_timeout(state, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            state.exporter_wakeups += 1;
        }
        let batch = std::mem::take(&mut state.pending);
        let flush = state.flush_requested;
        let shutdown = state.shutdown;
        drop(state);
        last_export = Instant::now();
        next_export = last_export + settings.delay;
        export(
            &exporter,
            batch,
            settings.max_export_batch_size,
            &shared.losses,
            &mut lost,
        );
        let mut state = shared.lock();
        state.flush_done = flush;
        if shutdown && state.pending.is_empty() {
            drop(state);
            if let Err(err) = exporter.shutdown() {
                tracing::warn!(error = %err, "span exporter shutdown");
            }
            shared.lock().stopped = true;
            shared.caught_up.notify_all();
            return;
        }
        drop(state);
        shared.caught_up.notify_all();
    }
}

/// Sends `batch` in requests of at most `max_batch` spans. A failed request's spans are lost
/// (counted in the log): the exporter has its own timeout, and holding them would let a dead
/// collector fill memory. Failures are logged when they start and when export recovers, not per
/// request.
fn export<E: SpanExporter>(
    exporter: &E,
    mut batch: Vec<SpanData>,
    max_batch: usize,
    losses: &SpanLosses,
    lost: &mut Option<u64>,
) {
    while !batch.is_empty() {
        let rest = batch.split_off(batch.len().min(max_batch));
        let spans = batch.len() as u64;
        match futures::executor::block_on(exporter.export(batch)) {
            Ok(()) => {
                if let Some(lost) = lost.take() {
                    tracing::info!(lost, "span export works again");
                }
            }
            Err(err) => {
                losses.export_failed.fetch_add(spans, Ordering::Relaxed);
                match lost {
                    Some(lost) => *lost += spans,
                    None => {
                        tracing::warn!(error = %err, spans, "span export failed; spans are lost until it works again");
                        *lost = Some(spans);
                    }
                }
            }
        }
        batch = rest;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TraceFlags, TraceId, TraceState};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Records what it exports; while `hold` is set, each export waits for it to be cleared.
    #[derive(Debug, Default, Clone)]
    struct Recorder {
        batches: Arc<Mutex<Vec<usize>>>,
        hold: Arc<AtomicBool>,
        entered: Arc<(Mutex<bool>, Condvar)>,
    }

    impl SpanExporter for Recorder {
        fn export(
            &self,
            batch: Vec<SpanData>,
        ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
            self.batches.lock().unwrap().push(batch.len());
            {
                let (lock, cvar) = &*self.entered;
                *lock.lock().unwrap() = true;
                cvar.notify_all();
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.hold.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::yield_now();
            }
            std::future::ready(Ok(()))
        }
    }

    impl Recorder {
        fn exported(&self) -> usize {
            self.batches.lock().unwrap().iter().sum()
        }

        fn wait_entered(&self) {
            let (lock, cvar) = &*self.entered;
            let entered = lock.lock().unwrap();
            let (entered, _) = cvar
                .wait_timeout_while(entered, Duration::from_secs(10), |e| !*e)
                .unwrap();
            assert!(*entered, "the exporter was never called");
        }
    }

    fn span(sampled: bool) -> SpanData {
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(1u128),
                SpanId::from(1u64),
                flags,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "s".into(),
            start_time: std::time::SystemTime::UNIX_EPOCH,
            end_time: std::time::SystemTime::UNIX_EPOCH,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Default::default(),
            instrumentation_scope: Default::default(),
        }
    }

    fn settings(max_queue_size: usize, max_export_batch_size: usize) -> BatchSettings {
        BatchSettings {
            // Long: these tests decide when export happens by size, flush and shutdown.
            delay: Duration::from_secs(3600),
            max_queue_size,
            max_export_batch_size,
        }
    }

    #[test]
    fn a_full_batch_is_exported_without_waiting_for_the_delay_and_shutdown_sends_the_rest() {
        let recorder = Recorder::default();
        let batch = BatchExport::start(recorder.clone(), settings(100, 4)).unwrap();
        for _ in 0..4 {
            batch.on_end(span(true));
        }
        recorder.wait_entered();
        batch.on_end(span(true));
        batch.on_end(span(false)); // not sampled: never exported
        batch
            .shutdown_with_timeout(Duration::from_secs(10))
            .unwrap();
        assert_eq!(recorder.exported(), 5);
        assert_eq!(recorder.batches.lock().unwrap()[0], 4);
        batch.on_end(span(true)); // after shutdown: ignored, not queued
        assert_eq!(batch.shared.lock().pending.len(), 0);
    }

    #[test]
    fn the_queue_is_bounded_while_the_exporter_is_stuck_and_drops_are_counted() {
        let recorder = Recorder::default();
        recorder.hold.store(true, Ordering::SeqCst);
        let batch = BatchExport::start(recorder.clone(), settings(8, 2)).unwrap();
        batch.on_end(span(true));
        batch.on_end(span(true));
        // The exporter holds those two; eight more fill the queue, two more are dropped.
        recorder.wait_entered();
        for _ in 0..10 {
            batch.on_end(span(true));
        }
        assert_eq!(batch.shared.lock().pending.len(), 8);
        assert_eq!(batch.losses().queue_full(), 2);
        recorder.hold.store(false, Ordering::SeqCst);
        batch.force_flush().unwrap();
        assert_eq!(recorder.exported(), 10);
        // Requests are capped at the batch size even when more was waiting.
        assert!(recorder.batches.lock().unwrap().iter().all(|&n| n <= 2));
        batch
            .shutdown_with_timeout(Duration::from_secs(10))
            .unwrap();
    }

    /// Regression: the thread woke every batch delay with nothing to send (10 times a second in
    /// every idle sidecar).
    #[test]
    fn an_idle_exporter_sleeps_until_a_span_comes_and_sends_it_after_one_delay() {
        let recorder = Recorder::default();
        let delay = Duration::from_millis(5);
        let settings = BatchSettings {
            delay,
            ..settings(100, 50)
        };
        let batch = BatchExport::start(recorder.clone(), settings).unwrap();
        // Forty batch delays without a span: the first passes, then the thread sleeps.
        std::thread::sleep(delay * 40);
        let woken = batch.shared.lock().exporter_wakeups;
        // One for the first delay; the rest is slack for a spurious wake-up (each costs two).
        assert!(
            woken <= 4,
            "{woken} wake-ups in 40 batch delays without a span"
        );
        // The first span wakes it, and goes out once its delay has passed: no flush needed.
        batch.on_end(span(true));
        recorder.wait_entered();
        assert_eq!(recorder.exported(), 1);
        batch
            .shutdown_with_timeout(Duration::from_secs(10))
            .unwrap();
    }

    /// Long before the delay (an hour here), enough waiting spans are sent in a batch.
    #[test]
    fn enough_waiting_spans_are_exported_before_the_delay() {
        let recorder = Recorder::default();
        let batch = BatchExport::start(recorder.clone(), settings(10_000, 2_048)).unwrap();
        for _ in 0..EARLY_EXPORT_SPANS {
            batch.on_end(span(true));
        }
        recorder.wait_entered();
        assert_eq!(*recorder.batches.lock().unwrap(), [EARLY_EXPORT_SPANS]);
        batch
            .shutdown_with_timeout(Duration::from_secs(10))
            .unwrap();
    }

    #[test]
    fn the_queue_holds_no_memory_once_exported() {
        let recorder = Recorder::default();
        let batch = BatchExport::start(recorder.clone(), settings(10_000, 1_000)).unwrap();
        for _ in 0..500 {
            batch.on_end(span(true));
        }
        batch.force_flush().unwrap();
        assert_eq!(recorder.exported(), 500);
        assert_eq!(batch.shared.lock().pending.capacity(), 0);
        batch
            .shutdown_with_timeout(Duration::from_secs(10))
            .unwrap();
    }
}
