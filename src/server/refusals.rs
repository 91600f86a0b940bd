//! What the listeners refuse before any call begins — an RPC without identity or over a cap, a
//! body or a handshake that never came, a connection over its listener's cap or idle — counted
//! in `/metrics` (`toolgate_rpcs_refused_total`, `toolgate_connections_closed_total`) and logged.
//! A flood of refusals is what an attack looks like, so the log is bounded: at most one line per
//! reason every [`LOG_INTERVAL`], saying how many were left out since the last.

use std::{collections::HashMap, fmt, sync::Arc, sync::Mutex, time::Duration};

use tokio::time::Instant;

use super::connections::Listener;
use crate::metrics::Metrics;

/// The shortest time between two log lines of the same reason.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Longest text of a refusal's log line: it may quote what the caller sent.
const MAX_LOGGED: usize = 256;

/// See the module docs.
pub struct Refusals {
    metrics: Arc<Metrics>,
    logged: Mutex<HashMap<&'static str, Logged>>,
}

struct Logged {
    at: Instant,
    left_out: u64,
}

impl Refusals {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Refusals {
            metrics,
            logged: Mutex::new(HashMap::new()),
        }
    }

    /// An RPC refused by the admission layer.
    pub fn rpc(&self, listener: Listener, reason: &'static str, message: fmt::Arguments<'_>) {
        self.metrics.rpc_refused(listener.as_str(), reason);
        self.log(listener, reason, message);
    }

    /// A connection the sidecar closed.
    pub fn connection(
        &self,
        listener: Listener,
        reason: &'static str,
        message: fmt::Arguments<'_>,
    ) {
        self.metrics.connection_closed(listener.as_str(), reason);
        self.log(listener, reason, message);
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
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
        let refusals = Refusals::new(Arc::new(Metrics::new()));
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
        let metrics = refusals.metrics().render(Default::default());
        assert!(
            metrics.contains(
                "toolgate_rpcs_refused_total{listener=\"tcp\",reason=\"in_flight\"} 1001"
            ),
            "{metrics}"
        );
    }
}
