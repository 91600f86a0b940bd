//! The generic cell rate algorithm (GCRA), on plain numbers so that the in-memory limiter and the
//! Redis script (which runs the same arithmetic server-side) decide alike.
//!
//! A quota of `count` per `period` with `burst` emits one cell every `period / count`; a key's
//! state is its theoretical arrival time (TAT). A call at `now` is admitted when
//! `max(tat, now) - now <= (burst - 1) * emission`, and then moves the TAT one emission later.
//! Deciding and committing are separate steps, so a caller can check several quotas and commit
//! only when all of them admit.

use std::{
    sync::{Mutex, PoisonError},
    time::Duration,
};

use crate::{clock::SharedClock, settings::Rate};

/// One quota, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    /// Time between two cells.
    emission: u64,
    /// How far ahead of `now` the TAT may run: `(burst - 1) * emission`.
    tolerance: u64,
}

/// Nanoseconds in a `Duration`, saturating.
pub fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl Gcra {
    /// A quota in nanoseconds (the in-memory limiter).
    pub fn new(rate: Rate) -> Self {
        Self::in_units(rate, 1)
    }

    /// A quota in microseconds: Redis's clock resolution, and exact in the doubles Lua counts
    /// with. The Redis script ([`super::redis`]) runs [`Self::decide`] on these two numbers.
    pub fn in_micros(rate: Rate) -> Self {
        Self::in_units(rate, 1_000)
    }

    fn in_units(rate: Rate, unit_nanos: u64) -> Self {
        let emission = (nanos(rate.period) / unit_nanos / u64::from(rate.count.get())).max(1);
        Gcra {
            emission,
            tolerance: emission.saturating_mul(u64::from(rate.burst.get()) - 1),
        }
    }

    /// Time between two cells, in this quota's unit.
    pub fn emission(&self) -> u64 {
        self.emission
    }

    /// How far ahead of now the TAT may run, in this quota's unit.
    pub fn tolerance(&self) -> u64 {
        self.tolerance
    }

    /// The new TAT if a call at `now` is admitted, or how long until it would be.
    pub fn decide(&self, tat: Option<u64>, now: u64) -> Result<u64, Duration> {
        self.decide_cells(tat, now, 1)
    }

    /// The same for a call that takes `cells` cells at once (a weighted call: GCRA with a
    /// cost). It needs the room of `cells` calls: the TAT may be at most `tolerance` ahead
    /// after the first `cells - 1` of them, and moves `cells` emissions. A call of more cells
    /// than the burst is never admitted (the wait grows past any TAT); callers refuse it as such
    /// first. Zero cells admits and changes nothing.
    pub fn decide_cells(&self, tat: Option<u64>, now: u64, cells: u64) -> Result<u64, Duration> {
        let tat = tat.unwrap_or(now).max(now);
        let Some(before_last) = cells.checked_sub(1) else {
            return Ok(tat);
        };
        let needed = (tat - now).saturating_add(self.emission.saturating_mul(before_last));
        if needed > self.tolerance {
            // In this quota's unit; the memory limiter counts nanoseconds.
            return Err(Duration::from_nanos(needed - self.tolerance));
        }
        Ok(tat.saturating_add(self.emission.saturating_mul(cells)))
    }

    /// Calls that would be admitted at `now` before the quota refuses (for explaining decisions).
    pub fn remaining(&self, tat: Option<u64>, now: u64) -> u64 {
        let ahead = tat.unwrap_or(now).max(now) - now;
        match self.tolerance.checked_sub(ahead) {
            Some(room) => room / self.emission + 1,
            None => 0,
        }
    }

    /// Whether a TAT says nothing a fresh key would not: the key can be forgotten.
    pub fn is_idle(tat: u64, now: u64) -> bool {
        tat <= now
    }
}

/// One quota with no keys, e.g. for audit events of refused callers: a flood costs a counter,
/// not the disk.
#[derive(Debug)]
pub struct SingleQuota {
    gcra: Gcra,
    tat: Mutex<Option<u64>>,
    clock: SharedClock,
}

impl SingleQuota {
    pub fn new(rate: Rate, clock: SharedClock) -> Self {
        SingleQuota {
            gcra: Gcra::new(rate),
            tat: Mutex::new(None),
            clock,
        }
    }

    /// Takes one cell if there is one.
    pub fn try_take(&self) -> bool {
        let now = nanos(self.clock.monotonic());
        let mut tat = self.tat.lock().unwrap_or_else(PoisonError::into_inner);
        match self.gcra.decide(*tat, now) {
            Ok(next) => {
                *tat = Some(next);
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    fn rate(count: u32, secs: u64, burst: u32) -> Gcra {
        Gcra::new(Rate {
            count: NonZeroU32::new(count).unwrap(),
            period: Duration::from_secs(secs),
            burst: NonZeroU32::new(burst).unwrap(),
        })
    }

    #[test]
    fn a_burst_then_one_cell_per_emission() {
        let quota = rate(5, 60, 5);
        let mut tat = None;
        for _ in 0..5 {
            assert!(quota.remaining(tat, 0) > 0);
            tat = Some(quota.decide(tat, 0).unwrap());
        }
        assert_eq!(quota.remaining(tat, 0), 0);
        // The sixth waits exactly one emission (12 s) from the start.
        assert_eq!(quota.decide(tat, 0), Err(Duration::from_secs(12)));
        let later = 12_000_000_000;
        assert!(quota.decide(tat, later - 1).is_err());
        assert!(quota.decide(tat, later).is_ok());
    }

    #[test]
    fn a_weighted_call_takes_its_cells_at_once() {
        // 10/min with a burst of 10: one cell every 6 s.
        let quota = rate(10, 60, 10);
        let tat = quota.decide_cells(None, 0, 4).unwrap();
        assert_eq!(quota.remaining(Some(tat), 0), 6);
        let tat = quota.decide_cells(Some(tat), 0, 6).unwrap();
        assert_eq!(quota.remaining(Some(tat), 0), 0);
        // Three more cells are there 18 s later, not before.
        let six_secs = 6_000_000_000;
        assert_eq!(
            quota.decide_cells(Some(tat), 0, 3),
            Err(Duration::from_secs(18))
        );
        assert!(quota.decide_cells(Some(tat), 3 * six_secs - 1, 3).is_err());
        assert!(quota.decide_cells(Some(tat), 3 * six_secs, 3).is_ok());
        // One cell is a plain call; none admits without moving the TAT.
        assert_eq!(
            quota.decide_cells(Some(tat), 0, 1),
            quota.decide(Some(tat), 0)
        );
        assert_eq!(quota.decide_cells(Some(tat), 0, 0), Ok(tat));
        // More than the burst never fits, not even in a fresh quota.
        assert!(quota.decide_cells(None, 0, 11).is_err());
        assert!(quota.decide_cells(None, 0, 10).is_ok());
        assert!(quota.decide_cells(None, 0, u64::MAX).is_err());
    }

    #[test]
    fn a_refusal_changes_nothing_and_idle_keys_are_fresh() {
        let quota = rate(1, 1, 1);
        let tat = quota.decide(None, 100).unwrap();
        assert!(quota.decide(Some(tat), 100).is_err());
        assert!(!Gcra::is_idle(tat, 100));
        assert!(Gcra::is_idle(tat, tat));
        assert_eq!(quota.remaining(Some(tat), tat), 1);
    }
}
