//! The `limits:` section: sizes, caps and budgets, each validated at load, with the defaults a
//! 256 MiB pod is sized for (docs/limits.md lists them all).

use std::time::Duration;

use super::*;

/// The deepest `limits.max_arguments_depth` can be set: serde_json refuses deeper input on its
/// own (at 128), and stage 2's check should be the one that speaks.
pub const MAX_ARGUMENTS_DEPTH_CAP: usize = 120;

/// Request size limits, concurrency caps and the memory budgets of what is kept between calls.
/// The defaults fit a 256 MiB pod: the budgets add up to well under half of it.
#[derive(Debug, Clone)]
pub struct LimitsConfig {
    pub max_arguments_bytes: usize,
    pub max_arguments_depth: usize,
    /// Most JSON values in one call's arguments: each costs ~72 bytes once parsed.
    pub max_arguments_values: usize,
    pub max_output_bytes: usize,
    pub max_parallel: usize,
    pub max_batch_calls: usize,
    pub idempotency_window: Duration,
    pub idempotency_max_entries_per_tenant: usize,
    pub idempotency_max_bytes_per_tenant: usize,
    pub idempotency_max_bytes: usize,
    pub max_message_bytes: usize,
    /// Longest call id, run id, idempotency key, approval id and tool name a client may send.
    pub max_identifier_bytes: usize,
    /// Longest tenant, subject or agent (dev metadata or JWT claim); scopes get 16 times this.
    pub max_identity_bytes: usize,
    /// ToolGate RPCs in flight in the whole sidecar; beyond it, RESOURCE_EXHAUSTED at once.
    pub max_in_flight: usize,
    /// Bytes of requests held at once (read and not yet answered); beyond it, RESOURCE_EXHAUSTED.
    pub max_request_bytes_in_flight: usize,
    /// HTTP/2 streams one connection may have open; beyond it the stream is refused.
    pub max_streams_per_connection: u32,
    /// ToolGate RPCs one tenant may have in flight: no tenant takes the whole `max_in_flight`.
    pub max_in_flight_per_tenant: usize,
    /// Of `max_in_flight`, what only the Unix socket (the agent in the pod) may use.
    pub in_flight_reserved_for_unix_socket: usize,
    /// Connections each listener holds at once; beyond it a new connection is closed at once.
    pub max_connections_per_listener: usize,
    /// How long a new connection has to send the HTTP/2 preface and its first frame.
    pub handshake_timeout: Duration,
    /// How long a request's body may take to arrive once its headers have.
    pub request_body_timeout: Duration,
    /// A connection that carries no ToolGate RPC for this long is closed.
    pub idle_connection_timeout: Duration,
    /// Bytes of parsed arguments held by calls in flight (estimated before parsing).
    pub max_parsed_arguments_bytes_in_flight: usize,
    /// Bytes of recently handed-out catalog revisions remembered (for `catalog_revision`).
    pub revision_log_max_bytes: usize,
    /// Bytes of verified JWTs remembered.
    pub token_cache_max_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_arguments_bytes: 1024 * 1024,
            max_arguments_depth: 64,
            max_arguments_values: 100_000,
            max_output_bytes: 1024 * 1024,
            max_parallel: 8,
            max_batch_calls: 128,
            idempotency_window: Duration::from_secs(600),
            idempotency_max_entries_per_tenant: 1000,
            idempotency_max_bytes_per_tenant: 8 * 1024 * 1024,
            idempotency_max_bytes: 32 * 1024 * 1024,
            max_message_bytes: 4 * 1024 * 1024,
            max_identifier_bytes: 256,
            max_identity_bytes: 256,
            max_in_flight: 1024,
            max_request_bytes_in_flight: 32 * 1024 * 1024,
            max_streams_per_connection: 256,
            max_in_flight_per_tenant: 256,
            in_flight_reserved_for_unix_socket: 64,
            max_connections_per_listener: 512,
            handshake_timeout: Duration::from_secs(5),
            request_body_timeout: Duration::from_secs(10),
            idle_connection_timeout: Duration::from_secs(120),
            max_parsed_arguments_bytes_in_flight: 64 * 1024 * 1024,
            revision_log_max_bytes: 8 * 1024 * 1024,
            token_cache_max_bytes: 4 * 1024 * 1024,
        }
    }
}

/// Room set aside in a response for each result: enough for the short refusal that replaces a
/// result too large to send (its ids are at most `limits.max_identifier_bytes`, ≤ 1 KiB).
pub const RESULT_RESERVE_BYTES: usize = 4 * 1024;
/// Room kept for a response's own framing.
pub const RESPONSE_MARGIN_BYTES: usize = 16 * 1024;

/// What one JSON value of a call's arguments is taken to cost once parsed (a `serde_json::Value`
/// and its share of the map or vector holding it; measured at 72–80 bytes).
pub const PARSED_VALUE_BYTES: usize = 80;

/// The most a call's arguments can take once parsed, from what is counted before parsing: the
/// text (strings are copied out of it) and a value's cost for each value.
pub fn parsed_arguments_bytes(text_bytes: usize, values: usize) -> usize {
    text_bytes.saturating_add(values.saturating_mul(PARSED_VALUE_BYTES))
}

/// What the idempotency store may hold.
#[derive(Debug, Clone, Copy)]
pub struct IdempotencyBudget {
    /// How long a key's result is kept.
    pub window: Duration,
    pub max_entries_per_tenant: usize,
    pub max_bytes_per_tenant: usize,
    pub max_bytes: usize,
}

impl LimitsConfig {
    /// The idempotency store's budgets.
    pub fn idempotency_budget(&self) -> IdempotencyBudget {
        IdempotencyBudget {
            window: self.idempotency_window,
            max_entries_per_tenant: self.idempotency_max_entries_per_tenant,
            max_bytes_per_tenant: self.idempotency_max_bytes_per_tenant,
            max_bytes: self.idempotency_max_bytes,
        }
    }
}

pub(super) fn build_limits(raw: &raw::RawLimits) -> Result<LimitsConfig, FieldError> {
    let d = LimitsConfig::default();
    let limits = LimitsConfig {
        max_arguments_bytes: positive(
            raw.max_arguments_bytes,
            "limits.max_arguments_bytes",
            d.max_arguments_bytes,
        )?,
        max_arguments_depth: positive(
            raw.max_arguments_depth,
            "limits.max_arguments_depth",
            d.max_arguments_depth,
        )?
        .min(MAX_ARGUMENTS_DEPTH_CAP),
        max_arguments_values: positive(
            raw.max_arguments_values,
            "limits.max_arguments_values",
            d.max_arguments_values,
        )?,
        max_output_bytes: positive(
            raw.max_output_bytes,
            "limits.max_output_bytes",
            d.max_output_bytes,
        )?,
        max_parallel: positive(raw.max_parallel, "limits.max_parallel", d.max_parallel)?,
        max_batch_calls: positive(
            raw.max_batch_calls,
            "limits.max_batch_calls",
            d.max_batch_calls,
        )?,
        idempotency_window: opt_duration(
            &raw.idempotency_window,
            "limits.idempotency_window",
            d.idempotency_window,
        )?,
        idempotency_max_entries_per_tenant: positive(
            raw.idempotency_max_entries_per_tenant,
            "limits.idempotency_max_entries_per_tenant",
            d.idempotency_max_entries_per_tenant,
        )?,
        idempotency_max_bytes_per_tenant: positive(
            raw.idempotency_max_bytes_per_tenant,
            "limits.idempotency_max_bytes_per_tenant",
            d.idempotency_max_bytes_per_tenant,
        )?,
        idempotency_max_bytes: positive(
            raw.idempotency_max_bytes,
            "limits.idempotency_max_bytes",
            d.idempotency_max_bytes,
        )?,
        max_message_bytes: positive(
            raw.max_message_bytes,
            "limits.max_message_bytes",
            d.max_message_bytes,
        )?,
        max_identifier_bytes: match positive(
            raw.max_identifier_bytes,
            "limits.max_identifier_bytes",
            d.max_identifier_bytes,
        )? {
            // A refusal repeats the call id and tool name: they must fit in its reserved room.
            n if n > 1024 => {
                return Err(FieldError::new(
                    "limits.max_identifier_bytes",
                    "must be at most 1024",
                ));
            }
            n => n,
        },
        max_identity_bytes: positive(
            raw.max_identity_bytes,
            "limits.max_identity_bytes",
            d.max_identity_bytes,
        )?,
        max_in_flight: positive(raw.max_in_flight, "limits.max_in_flight", d.max_in_flight)?,
        max_request_bytes_in_flight: positive(
            raw.max_request_bytes_in_flight,
            "limits.max_request_bytes_in_flight",
            d.max_request_bytes_in_flight,
        )?,
        max_streams_per_connection: u32::try_from(positive(
            raw.max_streams_per_connection,
            "limits.max_streams_per_connection",
            d.max_streams_per_connection as usize,
        )?)
        .map_err(|_| {
            FieldError::new(
                "limits.max_streams_per_connection",
                "must be at most 2^32-1",
            )
        })?,
        max_in_flight_per_tenant: positive(
            raw.max_in_flight_per_tenant,
            "limits.max_in_flight_per_tenant",
            d.max_in_flight_per_tenant,
        )?,
        in_flight_reserved_for_unix_socket: raw
            .in_flight_reserved_for_unix_socket
            .unwrap_or(d.in_flight_reserved_for_unix_socket),
        max_connections_per_listener: positive(
            raw.max_connections_per_listener,
            "limits.max_connections_per_listener",
            d.max_connections_per_listener,
        )?,
        handshake_timeout: opt_duration(
            &raw.handshake_timeout,
            "limits.handshake_timeout",
            d.handshake_timeout,
        )?,
        request_body_timeout: opt_duration(
            &raw.request_body_timeout,
            "limits.request_body_timeout",
            d.request_body_timeout,
        )?,
        idle_connection_timeout: opt_duration(
            &raw.idle_connection_timeout,
            "limits.idle_connection_timeout",
            d.idle_connection_timeout,
        )?,
        max_parsed_arguments_bytes_in_flight: positive(
            raw.max_parsed_arguments_bytes_in_flight,
            "limits.max_parsed_arguments_bytes_in_flight",
            d.max_parsed_arguments_bytes_in_flight,
        )?,
        revision_log_max_bytes: positive(
            raw.revision_log_max_bytes,
            "limits.revision_log_max_bytes",
            d.revision_log_max_bytes,
        )?,
        token_cache_max_bytes: positive(
            raw.token_cache_max_bytes,
            "limits.token_cache_max_bytes",
            d.token_cache_max_bytes,
        )?,
    };
    if limits.max_request_bytes_in_flight < limits.max_message_bytes {
        return Err(FieldError::new(
            "limits.max_request_bytes_in_flight",
            format!(
                "{} is less than limits.max_message_bytes ({}): a request of the largest size could never be read",
                limits.max_request_bytes_in_flight, limits.max_message_bytes
            ),
        ));
    }
    // Defaults that only make sense below max_in_flight follow a smaller max_in_flight, unless
    // set; set explicitly above it, they are an error.
    let limits = LimitsConfig {
        max_in_flight_per_tenant: match raw.max_in_flight_per_tenant {
            None => limits.max_in_flight_per_tenant.min(limits.max_in_flight),
            Some(n) if n > limits.max_in_flight => {
                return Err(FieldError::new(
                    "limits.max_in_flight_per_tenant",
                    format!(
                        "{n} is more than limits.max_in_flight ({})",
                        limits.max_in_flight
                    ),
                ));
            }
            Some(n) => n,
        },
        in_flight_reserved_for_unix_socket: match raw.in_flight_reserved_for_unix_socket {
            None => limits
                .in_flight_reserved_for_unix_socket
                .min(limits.max_in_flight / 4),
            Some(n) if n >= limits.max_in_flight => {
                return Err(FieldError::new(
                    "limits.in_flight_reserved_for_unix_socket",
                    format!(
                        "{n} leaves nothing of limits.max_in_flight ({}) for TCP callers",
                        limits.max_in_flight
                    ),
                ));
            }
            Some(n) => n,
        },
        ..limits
    };
    let largest_call =
        parsed_arguments_bytes(limits.max_arguments_bytes, limits.max_arguments_values);
    if limits.max_parsed_arguments_bytes_in_flight < largest_call {
        return Err(FieldError::new(
            "limits.max_parsed_arguments_bytes_in_flight",
            format!(
                "{} is less than one call of the largest arguments may take parsed ({largest_call}: limits.max_arguments_bytes plus {PARSED_VALUE_BYTES} bytes per value of limits.max_arguments_values)",
                limits.max_parsed_arguments_bytes_in_flight
            ),
        ));
    }
    let reserved = RESULT_RESERVE_BYTES
        .saturating_mul(limits.max_batch_calls)
        .saturating_add(RESPONSE_MARGIN_BYTES);
    if reserved >= limits.max_message_bytes {
        return Err(FieldError::new(
            "limits.max_batch_calls",
            format!(
                "{} calls do not fit in one response of limits.max_message_bytes ({}): each result needs room for at least a short refusal ({} bytes)",
                limits.max_batch_calls, limits.max_message_bytes, RESULT_RESERVE_BYTES
            ),
        ));
    }
    Ok(limits)
}
