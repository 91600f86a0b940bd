//! Audit events for callers refused before the chain (UNAUTHENTICATED): written within a rate
//! bound, never with token material.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{AuditEvent, AuditLog, EventKind, EventTime};

/// Audit events for callers refused before the chain (UNAUTHENTICATED), bounded in rate: a flood
/// of bad tokens costs a counter, not the disk. What the bound leaves out is counted, in the
/// metric and in the next event written.
#[derive(Debug)]
pub struct RefusedCallers {
    quota: crate::gcra::SingleQuota,
    suppressed_since: AtomicU64,
    suppressed_total: AtomicU64,
    clock: crate::clock::SharedClock,
}

/// Longest refusal reason recorded for a refused caller: the reason may quote what the caller
/// sent (a token's `kid`, a header's length), which must not be able to fill the disk.
const MAX_REFUSED_REASON: usize = 256;

impl RefusedCallers {
    pub fn new(rate: crate::settings::Rate, clock: crate::clock::SharedClock) -> Self {
        RefusedCallers {
            quota: crate::gcra::SingleQuota::new(rate, clock.clone()),
            suppressed_since: AtomicU64::new(0),
            suppressed_total: AtomicU64::new(0),
            clock,
        }
    }

    /// Records one refused caller, unless over the rate or the queue is full (then counted).
    /// `reason` must carry no token material.
    pub fn record(&self, log: &AuditLog, rpc: &str, peer: Option<String>, reason: &str) {
        let slot = self.quota.try_take().then(|| log.try_reserve()).flatten();
        let Some(slot) = slot else {
            self.suppressed_since.fetch_add(1, Ordering::Relaxed);
            self.suppressed_total.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let suppressed = self.suppressed_since.swap(0, Ordering::Relaxed);
        let mut reason = reason.to_owned();
        if reason.len() > MAX_REFUSED_REASON {
            let mut cut = MAX_REFUSED_REASON;
            while !reason.is_char_boundary(cut) {
                cut -= 1;
            }
            reason.truncate(cut);
            reason.push('…');
        }
        slot.send(Box::new(AuditEvent {
            time: EventTime(self.clock.unix_ms()),
            kind: Some(EventKind::AuthenticationFailed),
            status: "UNAUTHENTICATED",
            error_type: Some("unauthenticated"),
            reason: Some(reason),
            rpc: Some(rpc.to_owned()),
            peer,
            suppressed: (suppressed > 0).then_some(suppressed),
            ..AuditEvent::default()
        }));
    }

    /// Refused callers left out of the audit log so far.
    pub fn suppressed(&self) -> u64 {
        self.suppressed_total.load(Ordering::Relaxed)
    }
}
