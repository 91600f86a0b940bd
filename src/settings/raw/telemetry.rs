//! Trace export.

use super::*;

/// Trace export settings. Unset fields come from the standard `OTEL_*` environment variables.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    /// OTLP endpoint, e.g. `http://localhost:4317` (gRPC) or `http://localhost:4318/v1/traces`.
    pub otlp_endpoint: Option<String>,
    /// `grpc` (default) or `http/protobuf`.
    pub otlp_protocol: Option<String>,
    /// `service.name` (default `toolgate`).
    pub service_name: Option<String>,
    /// `always_on`, `always_off`, `traceidratio`, `parentbased_always_on` (default),
    /// `parentbased_always_off` or `parentbased_traceidratio`.
    pub sampler: Option<String>,
    /// The ratio for the ratio samplers.
    pub sampler_arg: Option<f64>,
    /// How long finished spans wait before a batch is sent (default 100ms; OTEL_BSP_SCHEDULE_DELAY).
    pub batch_delay: Option<String>,
}
