//! The injected clock. Rate limits, approval expiry and idempotency windows read time only through
//! [`Clock`], so tests advance a [`ManualClock`] instead of sleeping.

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

/// A source of monotonic and wall-clock time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Monotonic time since an arbitrary fixed origin.
    fn monotonic(&self) -> Duration;
    /// Wall-clock time, milliseconds since the Unix epoch.
    fn unix_ms(&self) -> i64;
}

/// A cheaply cloned handle to the process's clock.
#[derive(Clone, Debug)]
pub struct SharedClock(Arc<dyn Clock>);

impl SharedClock {
    pub fn new(clock: impl Clock + 'static) -> Self {
        SharedClock(Arc::new(clock))
    }

    /// The real clock.
    pub fn system() -> Self {
        Self::new(SystemClock::new())
    }

    pub fn monotonic(&self) -> Duration {
        self.0.monotonic()
    }

    pub fn unix_ms(&self) -> i64 {
        self.0.unix_ms()
    }

    /// Wall-clock time as a `SystemTime` (what conditions see as `now`).
    pub fn system_time(&self) -> SystemTime {
        let ms = self.unix_ms();
        match u64::try_from(ms) {
            Ok(ms) => UNIX_EPOCH + Duration::from_millis(ms),
            Err(_) => UNIX_EPOCH,
        }
    }
}

impl Default for SharedClock {
    fn default() -> Self {
        Self::system()
    }
}

/// The real clock.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn monotonic(&self) -> Duration {
        self.origin.elapsed()
    }

    fn unix_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to; for tests.
#[derive(Debug, Clone)]
pub struct ManualClock {
    elapsed_nanos: Arc<AtomicU64>,
    start_unix_ms: i64,
}

impl ManualClock {
    /// A clock standing at the given wall-clock time.
    pub fn new(start_unix_ms: i64) -> Self {
        ManualClock {
            elapsed_nanos: Arc::new(AtomicU64::new(1)),
            start_unix_ms,
        }
    }

    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.elapsed_nanos.fetch_add(nanos, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn monotonic(&self) -> Duration {
        Duration::from_nanos(self.elapsed_nanos.load(Ordering::SeqCst))
    }

    fn unix_ms(&self) -> i64 {
        let elapsed_ms = self.monotonic().as_millis();
        self.start_unix_ms + i64::try_from(elapsed_ms).unwrap_or(i64::MAX / 2)
    }
}
