//! What the listeners refuse before any call begins — an RPC without identity or over a cap, a
//! body or a handshake that never came, a connection over its listener's cap or idle — counted
//! in `/metrics` (`toolgate_rpcs_refused_total`, `toolgate_connections_closed_total`) and logged.
//! A flood of refusals is what an attack looks like, so the log is bounded: at most one line per
//! reason every [`LOG_INTERVAL`], saying how many were left out since the last.

use std::{collections::HashMap, fmt, sync::Mutex, time::Duration};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
};
use tokio::time::Instant;

use super::connections::Listener;
use crate::metrics::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerReasonLabels {
    listener: &'static str,
    reason: &'static str,
}

/// The shortest time between two log lines of the same reason.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Longest text of a refusal's log line: it may quote what the caller sent.
const MAX_LOGGED: usize = 256;

/// See the module docs.
pub struct Refusals {
    rpcs_refused: Family<ListenerReasonLabels, Counter>,
    connections_open: Family<ListenerLabels, Gauge>,
    connections_closed: Family<ListenerReasonLabels, Counter>,
    logged: Mutex<HashMap<&'static str, Logged>>,
}

struct Logged {
    at: Instant,
    left_out: u64,
}

impl Refusals {
    /// Registers the listeners' metrics: `toolgate_rpcs_refused_total{listener,reason}`,
    /// `toolgate_connections_open{listener}`, `toolgate_connections_closed_total{listener,reason}`.
    pub fn new(metrics: &Metrics) -> Self {
        Refusals {
            rpcs_refused: metrics.registered(
                "rpcs_refused",
                "toolgate RPCs refused before any call began, by listener and reason (unauthenticated, in_flight, tenant_share, request_bytes, body_timeout, draining)",
            ),
            connections_open: metrics.registered(
                "connections_open",
                "Client connections open, by listener",
            ),
            connections_closed: metrics.registered(
                "connections_closed",
                "Client connections the sidecar closed, by listener and reason (over_cap, handshake_timeout, idle)",
            ),
            logged: Mutex::new(HashMap::new()),
        }
    }

    /// An RPC refused by the admission layer, counted and logged.
    pub fn rpc(&self, listener: Listener, reason: &'static str, message: fmt::Arguments<'_>) {
        self.rpc_counted(listener, reason);
        self.log(listener, reason, message);
    }

    /// An RPC refused in the normal course of things (while draining): counted, not logged.
    pub fn rpc_counted(&self, listener: Listener, reason: &'static str) {
        let listener = listener.as_str();
        self.rpcs_refused
            .get_or_create(&ListenerReasonLabels { listener, reason })
            .inc();
    }

    /// A connection the sidecar closed, counted and logged.
    pub fn connection(
        &self,
        listener: Listener,
        reason: &'static str,
        message: fmt::Arguments<'_>,
    ) {
        self.connection_counted(listener, reason);
        self.log(listener, reason, message);
    }

    /// A connection closed as upkeep (idle): counted, not logged.
    pub fn connection_counted(&self, listener: Listener, reason: &'static str) {
        let listener = listener.as_str();
        self.connections_closed
            .get_or_create(&ListenerReasonLabels { listener, reason })
            .inc();
    }

    /// A connection accepted and kept, until [`Self::connection_ended`].
    pub fn connection_opened(&self, listener: Listener) {
        let listener = listener.as_str();
        self.connections_open
            .get_or_create(&ListenerLabels { listener })
            .inc();
    }

    /// A kept connection gone, however it ended.
    pub fn connection_ended(&self, listener: Listener) {
        let listener = listener.as_str();
        self.connections_open
            .get_or_create(&ListenerLabels { listener })
            .dec();
    }

    fn log(&self, listener: Listener, reason: &'static str, message: fmt::Arguments<'_>) {
        let now = Instant::now();
        let left_out = {
            let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
            match logged.get_mut(reason) {
                Some(last) if now < last.at + LOG_INTERVAL => {
                    last.left_out += 1;
                    return;
                }
                Some(last) => {
                    last.at = now;
                    std::mem::take(&mut last.left_out)
                }
                None => {
                    logged.insert(
                        reason,
                        Logged {
                            at: now,
                            left_out: 0,
                        },
                    );
                    0
                }
            }
        };
        let mut text = message.to_string();
        if text.len() > MAX_LOGGED {
            let mut cut = MAX_LOGGED;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push('…');
        }
        tracing::warn!(listener = listener.as_str(), reason, left_out, "{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_flood_logs_one_line_per_interval_and_counts_every_refusal() {
        let metrics = Metrics::new();
        let refusals = Refusals::new(&metrics);
        for _ in 0..1000 {
            refusals.rpc(
                Listener::Tcp,
                "in_flight",
                format_args!("rpc refused: full"),
            );
        }
        let left_out = |refusals: &Refusals| refusals.logged.lock().unwrap()["in_flight"].left_out;
        assert_eq!(left_out(&refusals), 999, "one line, the rest counted");
        tokio::time::advance(LOG_INTERVAL).await;
        refusals.rpc(
            Listener::Tcp,
            "in_flight",
            format_args!("rpc refused: full"),
        );
        assert_eq!(left_out(&refusals), 0, "the next interval logs again");
        let metrics = metrics.render();
        assert!(
            metrics.contains(
                "toolgate_rpcs_refused_total{listener=\"tcp\",reason=\"in_flight\"} 1001"
            ),
            "{metrics}"
        );
    }
}
