//! Logs and traces. Logs go to stderr (stdout stays free for the audit stream). Traces are
//! exported over OTLP (gRPC or HTTP/protobuf) when the standard `OTEL_*` variables or the
//! catalog's `telemetry:` section name an endpoint; otherwise no exporter exists and no span is
//! made. Spans are made through the OpenTelemetry API directly, not through `tracing`: see
//! [`spans`], which also holds their conventions.

pub mod batch;
pub mod otlp;
pub mod spans;

use std::{sync::Arc, time::Duration};

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::KeyValue;
use opentelemetry_sdk::{
    Resource,
    trace::{Sampler, SpanExporter, SpanProcessor as _},
};
use tracing_subscriber::{EnvFilter, Layer, fmt, prelude::*};

use crate::settings::{Env, FieldError, parse_duration, raw::RawTelemetry};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Readable text.
    Human,
}

/// The OTLP wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    HttpProtobuf,
}

/// Validated trace export settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// Where to send spans; `None` turns export off.
    pub endpoint: Option<String>,
    pub protocol: OtlpProtocol,
    /// Sent with every export request (`OTEL_EXPORTER_OTLP_TRACES_HEADERS`, then
    /// `OTEL_EXPORTER_OTLP_HEADERS`).
    pub headers: HeaderMap,
    /// One export request, retries included (`OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, then
    /// `OTEL_EXPORTER_OTLP_TIMEOUT`, in milliseconds).
    pub export_timeout: Duration,
    /// A compression the standard variables asked for and this exporter does not offer: spans
    /// are sent uncompressed and the start-up log says so (pods often get the variable injected
    /// for every OpenTelemetry SDK in them; refusing to start would be worse).
    pub unsupported_compression: Option<String>,
    pub service_name: String,
    pub resource_attributes: Vec<(String, String)>,
    pub sampler: SamplerConfig,
    /// How long spans wait before a batch is sent.
    pub batch_delay: Duration,
    /// Finished spans waiting for export; beyond it new spans are dropped (counted and logged),
    /// never queued without bound. Memory is held only while spans wait ([`batch`]).
    pub max_queue_size: usize,
    /// Spans per export request.
    pub max_export_batch_size: usize,
}

/// The SDK's defaults (a queue of 2,048, batches of 512) dropped ~8% of spans at ~14,000 spans/s;
/// batches of 2,048 in a queue of 4,096 dropped none there, but 207 of 1.68 million at ~43,000
/// spans/s on a faster machine, while the export thread waited for a CPU. 8,192 holds ~190 ms of
/// spans at that rate, and costs nothing at rest: the queue grows only while spans wait
/// (docs/performance.md). `OTEL_BSP_MAX_QUEUE_SIZE` / `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` override.
pub const DEFAULT_MAX_QUEUE_SIZE: usize = 8_192;
/// How long finished spans wait for more before a batch is sent. Short, so export is a steady
/// trickle rather than a burst of CPU once a second: at 3,000 calls/s, 100 ms instead of 1 s
/// took the p99 from +2.0 to +1.3 ms over the bare stack, p99.9 from 5.4 to 3.3 ms.
pub const DEFAULT_BATCH_DELAY: Duration = Duration::from_millis(100);
pub const DEFAULT_MAX_EXPORT_BATCH_SIZE: usize = 2_048;
/// One export request, retries included. Shorter than the specification's 10 s: the export
/// thread waits for it, and a collector in the pod or on the node answers in milliseconds.
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The sampler, as `OTEL_TRACES_SAMPLER` names them.
#[derive(Debug, Clone, PartialEq)]
pub enum SamplerConfig {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio(f64),
    ParentBasedAlwaysOn,
    ParentBasedAlwaysOff,
    ParentBasedTraceIdRatio(f64),
}

impl TelemetryConfig {
    /// The catalog's `telemetry:` section wins; the standard environment variables fill in the
    /// rest. `OTEL_SDK_DISABLED=true` turns export off.
    pub fn build(raw: Option<&RawTelemetry>, env: &Env) -> Result<Self, FieldError> {
        let raw_default = RawTelemetry::default();
        let raw = raw.unwrap_or(&raw_default);
        let env_text = |name: &str| {
            env.get(name)
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let disabled =
            env_text("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let protocol_text = raw
            .otlp_protocol
            .clone()
            .or_else(|| env_text("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
            .or_else(|| env_text("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .unwrap_or_else(|| "grpc".into());
        let protocol = match protocol_text.as_str() {
            "grpc" => OtlpProtocol::Grpc,
            "http/protobuf" => OtlpProtocol::HttpProtobuf,
            other => {
                return Err(FieldError::new(
                    "telemetry.otlp_protocol",
                    format!("unsupported OTLP protocol {other:?}; use grpc or http/protobuf"),
                ));
            }
        };
        let endpoint = raw
            .otlp_endpoint
            .clone()
            .or_else(|| env_text("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
            .or_else(|| {
                env_text("OTEL_EXPORTER_OTLP_ENDPOINT").map(|base| match protocol {
                    // The generic variable is a base URL; HTTP appends the signal's path.
                    OtlpProtocol::HttpProtobuf => {
                        format!("{}/v1/traces", base.trim_end_matches('/'))
                    }
                    OtlpProtocol::Grpc => base,
                })
            })
            .filter(|_| !disabled);
        if let Some(endpoint) = &endpoint {
            check_endpoint(endpoint, protocol)?;
        }
        let headers = match env_text("OTEL_EXPORTER_OTLP_TRACES_HEADERS") {
            Some(text) => parse_headers("OTEL_EXPORTER_OTLP_TRACES_HEADERS", &text)?,
            None => match env_text("OTEL_EXPORTER_OTLP_HEADERS") {
                Some(text) => parse_headers("OTEL_EXPORTER_OTLP_HEADERS", &text)?,
                None => HeaderMap::new(),
            },
        };
        let unsupported_compression = env_text("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION")
            .or_else(|| env_text("OTEL_EXPORTER_OTLP_COMPRESSION"))
            .filter(|c| !c.eq_ignore_ascii_case("none"));
        let sampler_name = raw
            .sampler
            .clone()
            .or_else(|| env_text("OTEL_TRACES_SAMPLER"))
            .unwrap_or_else(|| "parentbased_always_on".into());
        let ratio = || -> Result<f64, FieldError> {
            let text = raw
                .sampler_arg
                .map(|r| r.to_string())
                .or_else(|| env_text("OTEL_TRACES_SAMPLER_ARG"));
            match text {
                None => Ok(1.0),
                Some(t) => t
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(|| {
                        FieldError::new(
                            "telemetry.sampler_arg",
                            format!("{t:?} is not a ratio between 0 and 1"),
                        )
                    }),
            }
        };
        let sampler = match sampler_name.as_str() {
            "always_on" => SamplerConfig::AlwaysOn,
            "always_off" => SamplerConfig::AlwaysOff,
            "traceidratio" => SamplerConfig::TraceIdRatio(ratio()?),
            "parentbased_always_on" => SamplerConfig::ParentBasedAlwaysOn,
            "parentbased_always_off" => SamplerConfig::ParentBasedAlwaysOff,
            "parentbased_traceidratio" => SamplerConfig::ParentBasedTraceIdRatio(ratio()?),
            other => {
                return Err(FieldError::new(
                    "telemetry.sampler",
                    format!("unknown sampler {other:?}"),
                ));
            }
        };
        let resource_attributes = env_text("OTEL_RESOURCE_ATTRIBUTES")
            .map(|text| {
                text.split(',')
                    .filter_map(|pair| pair.split_once('='))
                    .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                    .filter(|(k, _)| !k.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        // A standard variable holding a whole number of `unit`, at least `min`.
        let number = |name: &str, unit: &str, min: usize| {
            env_text(name)
                .map(|text| {
                    text.trim()
                        .parse::<usize>()
                        .ok()
                        .filter(|n| *n >= min)
                        .ok_or_else(|| {
                            FieldError::new(
                                name,
                                format!(
                                    "{text:?} is not a whole number of {unit} (at least {min})"
                                ),
                            )
                        })
                })
                .transpose()
        };
        let batch_delay = match &raw.batch_delay {
            Some(text) => parse_duration(text)
                .map_err(|err| FieldError::new("telemetry.batch_delay", err.to_string()))?,
            None => number("OTEL_BSP_SCHEDULE_DELAY", "milliseconds", 0)?
                .map_or(DEFAULT_BATCH_DELAY, |ms| Duration::from_millis(ms as u64)),
        };
        let timeout_ms = match number("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "milliseconds", 1)? {
            Some(ms) => Some(ms),
            None => number("OTEL_EXPORTER_OTLP_TIMEOUT", "milliseconds", 1)?,
        };
        let export_timeout = timeout_ms.map_or(DEFAULT_EXPORT_TIMEOUT, |ms| {
            Duration::from_millis(ms as u64)
        });
        let max_queue_size =
            number("OTEL_BSP_MAX_QUEUE_SIZE", "spans", 1)?.unwrap_or(DEFAULT_MAX_QUEUE_SIZE);
        // A batch larger than the queue could never fill.
        let max_export_batch_size = number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "spans", 1)?
            .unwrap_or(DEFAULT_MAX_EXPORT_BATCH_SIZE)
            .min(max_queue_size);
        Ok(TelemetryConfig {
            endpoint,
            protocol,
            headers,
            export_timeout,
            unsupported_compression,
            service_name: raw
                .service_name
                .clone()
                .or_else(|| env_text("OTEL_SERVICE_NAME"))
                .unwrap_or_else(|| "toolgate".into()),
            resource_attributes,
            sampler,
            batch_delay,
            max_queue_size,
            max_export_batch_size,
        })
    }

    fn sampler(&self) -> Sampler {
        match self.sampler {
            SamplerConfig::AlwaysOn => Sampler::AlwaysOn,
            SamplerConfig::AlwaysOff => Sampler::AlwaysOff,
            SamplerConfig::TraceIdRatio(r) => Sampler::TraceIdRatioBased(r),
            SamplerConfig::ParentBasedAlwaysOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
            SamplerConfig::ParentBasedAlwaysOff => {
                Sampler::ParentBased(Box::new(Sampler::AlwaysOff))
            }
            SamplerConfig::ParentBasedTraceIdRatio(r) => {
                Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(r)))
            }
        }
    }
}

/// An endpoint the exporter can send to: an `http://` URL, or `https://` for OTLP/HTTP (TLS with
/// the system's roots). gRPC is sent in plaintext only: a collector beside the sidecar, in the
/// pod or on the node.
fn check_endpoint(endpoint: &str, protocol: OtlpProtocol) -> Result<(), FieldError> {
    let invalid = |why: String| FieldError::new("telemetry.otlp_endpoint", why);
    let url = url::Url::parse(endpoint)
        .map_err(|err| invalid(format!("invalid URL {endpoint:?}: {err}")))?;
    match (url.scheme(), protocol) {
        ("http", _) | ("https", OtlpProtocol::HttpProtobuf) => {}
        ("https", OtlpProtocol::Grpc) => {
            return Err(invalid(format!(
                "{endpoint:?}: OTLP over gRPC is sent in plaintext only; use an http:// \
                 collector endpoint, or OTLP/HTTP (http/protobuf) for TLS"
            )));
        }
        (scheme, _) => {
            return Err(invalid(format!(
                "{endpoint:?}: the scheme must be http or https, not {scheme:?}"
            )));
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid(format!("{endpoint:?} names no host")));
    }
    Ok(())
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `key=value` pairs separated by commas, values percent-encoded
/// (the W3C baggage format the specification names). A malformed pair is an error, not skipped:
/// a missing API key header would otherwise surface only as the collector refusing every batch.
fn parse_headers(variable: &str, text: &str) -> Result<HeaderMap, FieldError> {
    let mut headers = HeaderMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let invalid = |why: &str| {
            // The value may be a secret: only the key is named.
            let key = pair.split_once('=').map_or(pair, |(k, _)| k.trim());
            FieldError::new(variable, format!("header {key:?}: {why}"))
        };
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| invalid("expected key=value"))?;
        let name = HeaderName::from_bytes(key.trim().as_bytes())
            .map_err(|_| invalid("not a valid header name"))?;
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| invalid("the value is not UTF-8 once percent-decoded"))?;
        let value = HeaderValue::from_str(&value)
            .map_err(|_| invalid("the value cannot be sent in a header"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot create the OTLP exporter: {0}")]
    Exporter(#[from] otlp::ExporterError),
    #[error("cannot create the OTLP exporter: cannot start the span export thread: {0}")]
    ExportThread(#[source] std::io::Error),
}

/// The span export, when on: the tracer that makes spans and the queue it sends them to.
/// [`TelemetryGuard::shutdown`] (or dropping it) exports what is queued and stops the export
/// thread.
#[derive(Default)]
pub struct TelemetryGuard {
    queue: Option<Arc<batch::BatchExport>>,
    tracer: spans::Tracer,
}

impl TelemetryGuard {
    /// Starts exporting spans as `telemetry` says: an exporter and its thread when it names an
    /// endpoint, nothing otherwise. Logs are [`init`]'s.
    pub fn start_export(telemetry: &TelemetryConfig) -> Result<Self, TelemetryError> {
        let Some(queue) = export_queue(telemetry)? else {
            return Ok(TelemetryGuard::default());
        };
        let queue = Arc::new(queue);
        Ok(TelemetryGuard {
            tracer: spans::Tracer::new(telemetry.sampler(), queue.clone()),
            queue: Some(queue),
        })
    }

    /// Flushes and stops the exporter, waiting up to 5 seconds. From a plain thread: it blocks.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(queue) = self.queue.take()
            && let Err(err) = queue.shutdown_with_timeout(Duration::from_secs(5))
        {
            eprintln!("telemetry shutdown: {err}");
        }
    }

    /// What makes toolgate's spans: sends them to this exporter, or makes none when export is off.
    pub fn tracer(&self) -> spans::Tracer {
        self.tracer.clone()
    }

    /// Exports everything finished so far (tests, and before exiting). Blocks.
    pub fn force_flush(&self) {
        if let Some(queue) = &self.queue {
            let _ = queue.force_flush();
        }
    }
}

impl Drop for TelemetryGuard {
    /// Nothing queued is lost when the guard goes without [`TelemetryGuard::shutdown`].
    fn drop(&mut self) {
        self.stop();
    }
}

/// What is logged without `RUST_LOG`: `info`, but rmcp only from `warn`. rmcp logs at `info`
/// every service it starts and ends, and the MCP door starts one per request (stateless): three
/// lines, one with the host's whole `initialize` parameters, for every `tools/call`.
const DEFAULT_LOG_FILTER: &str = "info,rmcp=warn";

/// Installs the global subscriber for logs (to stderr) and, when configured, the OTLP span
/// exporter that [`TelemetryGuard::tracer`] sends spans to. `RUST_LOG` replaces the default
/// filter ([`DEFAULT_LOG_FILTER`]) for logs; spans are exported regardless of it.
pub fn init(
    format: LogFormat,
    telemetry: &TelemetryConfig,
) -> Result<TelemetryGuard, TelemetryError> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
    let logs = match format {
        LogFormat::Json => fmt::layer()
            .json()
            .with_writer(|| EscapingWriter(std::io::stderr()))
            .with_current_span(false)
            .boxed(),
        // Colours only for a terminal: escape codes in a log file or `kubectl logs` are noise.
        LogFormat::Human => fmt::layer()
            .fmt_fields(EscapedFields)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
    }
    // Events only: otherwise the formatter renders every span field on every `record`, for
    // output that is never printed (measured: ~45% of the CPU per call).
    .with_filter(tracing_subscriber::filter::filter_fn(|metadata| {
        metadata.is_event()
    }))
    .with_filter(filter);
    let guard = TelemetryGuard::start_export(telemetry)?;
    // Already installed (e.g. by a test harness): keep the existing one.
    let _ = tracing_subscriber::registry().with(logs).try_init();
    // Logged once the subscriber exists, or it would go nowhere.
    if let (Some(compression), Some(_)) = (&telemetry.unsupported_compression, &guard.queue) {
        tracing::warn!(
            compression = %compression,
            "OTLP compression is not supported; spans are sent uncompressed"
        );
    }
    Ok(guard)
}

/// Human log fields with every control character escaped (`\n`, `\u{1b}`, …): field values
/// carry text from callers and backends (a JWT header's `alg`, an error message), and a raw line
/// break or terminal escape in one could forge a log line or rewrite the terminal. The `message`
/// is written bare, string fields quoted, other values as they format themselves.
struct EscapedFields;

impl<'writer> fmt::FormatFields<'writer> for EscapedFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: fmt::format::Writer<'writer>,
        fields: R,
    ) -> std::fmt::Result {
        let mut visitor = EscapingVisitor {
            writer: &mut writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct EscapingVisitor<'a, 'writer> {
    writer: &'a mut fmt::format::Writer<'writer>,
    first: bool,
    result: std::fmt::Result,
}

impl EscapingVisitor<'_, '_> {
    fn write(&mut self, field: &tracing::field::Field, text: &str) {
        if self.result.is_err() {
            return;
        }
        let mut line = String::with_capacity(text.len() + field.name().len() + 2);
        if !self.first {
            line.push(' ');
        }
        self.first = false;
        if field.name() != "message" {
            line.push_str(field.name());
            line.push('=');
        }
        escape_controls(text, &mut line);
        self.result = self.writer.write_str(&line);
    }
}

impl tracing::field::Visit for EscapingVisitor<'_, '_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.write(field, value);
        } else {
            self.write(field, &format!("{value:?}"));
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.write(field, &format!("{value:?}"));
    }
}

/// Appends `text` with control characters (C0, DEL, C1) and line and bidirectional controls
/// (U+2028, U+202E, …) written as escapes.
fn escape_controls(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || crate::canonical::is_line_or_bidi_control(c) => {
                out.push_str(&format!("\\u{{{:x}}}", u32::from(c)))
            }
            c => out.push(c),
        }
    }
}

/// JSON log lines with line and bidirectional controls escaped (serde_json leaves U+2028 and its
/// kin raw, which is valid JSON but splits or reorders a line for other readers). The formatter
/// hands over each event whole, in one write.
struct EscapingWriter<W>(W);

impl<W: std::io::Write> std::io::Write for EscapingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The lead bytes of every such character's UTF-8: without them, nothing to copy.
        if memchr::memchr3(0xc2, 0xd8, 0xe2, buf).is_none() {
            return self.0.write(buf);
        }
        let mut line = buf.to_vec();
        crate::canonical::escape_line_and_bidi_controls(&mut line, 0);
        self.0.write_all(&line)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The queue and thread exporting spans to the configured endpoint, if export is on.
fn export_queue(telemetry: &TelemetryConfig) -> Result<Option<batch::BatchExport>, TelemetryError> {
    let Some(endpoint) = &telemetry.endpoint else {
        return Ok(None);
    };
    let mut exporter = otlp::OtlpExporter::new(&otlp::ExportSettings {
        endpoint: endpoint.clone(),
        protocol: telemetry.protocol,
        headers: telemetry.headers.clone(),
        timeout: telemetry.export_timeout,
    })?;
    let mut attributes = vec![KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))];
    attributes.extend(
        telemetry
            .resource_attributes
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
    );
    let resource = Resource::builder()
        .with_service_name(telemetry.service_name.clone())
        .with_attributes(attributes)
        .build();
    // Set here: the exporter moves to the export thread.
    exporter.set_resource(&resource);
    let queue = batch::BatchExport::start(
        exporter,
        batch::BatchSettings {
            delay: telemetry.batch_delay,
            max_queue_size: telemetry.max_queue_size,
            max_export_batch_size: telemetry.max_export_batch_size,
        },
    )
    .map_err(TelemetryError::ExportThread)?;
    Ok(Some(queue))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        let mut out = String::new();
        escape_controls("a\u{1b}[31mb\nINFO forged\r\t\u{9b}\u{7f}ok é", &mut out);
        assert_eq!(out, "a\\u{1b}[31mb\\nINFO forged\\r\\t\\u{9b}\\u{7f}ok é");
        assert!(!out.chars().any(char::is_control));
    }

    #[test]
    fn export_is_off_without_an_endpoint_and_follows_the_standard_variables() {
        let off = TelemetryConfig::build(None, &Env::default()).unwrap();
        assert_eq!(off.endpoint, None);
        let env = Env::default()
            .with("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
            .with("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
            .with("OTEL_SERVICE_NAME", "sidecar-a")
            .with("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
            .with("OTEL_TRACES_SAMPLER_ARG", "0.25")
            .with(
                "OTEL_RESOURCE_ATTRIBUTES",
                "k8s.pod.name=agent-0, team=support",
            );
        let on = TelemetryConfig::build(None, &env).unwrap();
        assert_eq!(
            on.endpoint.as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(on.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(on.service_name, "sidecar-a");
        assert_eq!(on.sampler, SamplerConfig::ParentBasedTraceIdRatio(0.25));
        assert_eq!(on.resource_attributes[1], ("team".into(), "support".into()));
        let disabled =
            TelemetryConfig::build(None, &env.clone().with("OTEL_SDK_DISABLED", "true")).unwrap();
        assert_eq!(disabled.endpoint, None);
        let bad = TelemetryConfig::build(
            None,
            &Env::default().with("OTEL_TRACES_SAMPLER", "sometimes"),
        );
        assert_eq!(bad.unwrap_err().path, "telemetry.sampler");
    }

    #[test]
    fn export_headers_timeout_and_endpoint_follow_the_standard_variables() {
        let base = Env::default().with("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317");
        let default = TelemetryConfig::build(None, &base).unwrap();
        assert!(default.headers.is_empty());
        assert_eq!(default.export_timeout, DEFAULT_EXPORT_TIMEOUT);
        assert_eq!(default.unsupported_compression, None);

        let set = base
            .clone()
            .with("OTEL_EXPORTER_OTLP_HEADERS", "api-key=generic")
            .with(
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                " Authorization = Basic%20dXNlcg==, x-org=a,x-org=b ,",
            )
            .with("OTEL_EXPORTER_OTLP_TIMEOUT", "900")
            .with("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "250")
            .with("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip");
        let set = TelemetryConfig::build(None, &set).unwrap();
        assert_eq!(set.headers["authorization"], "Basic dXNlcg==");
        assert_eq!(set.headers.get_all("x-org").iter().count(), 2);
        assert!(
            !set.headers.contains_key("api-key"),
            "the signal's variable wins"
        );
        assert_eq!(set.export_timeout, Duration::from_millis(250));
        assert_eq!(set.unsupported_compression.as_deref(), Some("gzip"));
        let none = base.clone().with("OTEL_EXPORTER_OTLP_COMPRESSION", "none");
        assert_eq!(
            TelemetryConfig::build(None, &none)
                .unwrap()
                .unsupported_compression,
            None
        );

        for (bad, said) in [
            ("api-key", "expected key=value"),
            ("bad key=1", "not a valid header name"),
            ("k=%FF", "not UTF-8"),
            ("k=line%0Abreak", "cannot be sent"),
        ] {
            let env = base.clone().with("OTEL_EXPORTER_OTLP_HEADERS", bad);
            let err = TelemetryConfig::build(None, &env).unwrap_err();
            assert_eq!(err.path, "OTEL_EXPORTER_OTLP_HEADERS", "{bad}");
            assert!(err.message.contains(said), "{bad}: {err:?}");
        }
        let secret = base
            .clone()
            .with("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s3cret%0A");
        let err = TelemetryConfig::build(None, &secret).unwrap_err();
        assert!(!err.message.contains("s3cret"), "{err:?}");
        let err =
            TelemetryConfig::build(None, &base.clone().with("OTEL_EXPORTER_OTLP_TIMEOUT", "5s"))
                .unwrap_err();
        assert_eq!(err.path, "OTEL_EXPORTER_OTLP_TIMEOUT");

        for (endpoint, protocol, ok) in [
            ("http://collector:4317", "grpc", true),
            ("https://collector:4317", "grpc", false),
            ("https://otlp.example.com/v1/traces", "http/protobuf", true),
            ("collector:4317", "grpc", false),
            ("unix:///run/otlp.sock", "grpc", false),
        ] {
            let env = Env::default()
                .with("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
                .with("OTEL_EXPORTER_OTLP_PROTOCOL", protocol);
            let built = TelemetryConfig::build(None, &env);
            assert_eq!(built.is_ok(), ok, "{endpoint} over {protocol}: {built:?}");
            if let Err(err) = built {
                assert_eq!(err.path, "telemetry.otlp_endpoint");
            }
        }
    }

    #[test]
    fn the_export_queue_is_sized_for_load_and_follows_the_standard_variable() {
        let default = TelemetryConfig::build(None, &Env::default()).unwrap();
        assert_eq!(default.max_queue_size, DEFAULT_MAX_QUEUE_SIZE);
        assert_eq!(default.max_export_batch_size, DEFAULT_MAX_EXPORT_BATCH_SIZE);
        let set = Env::default()
            .with("OTEL_BSP_MAX_QUEUE_SIZE", "1000")
            .with("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "5000");
        let set = TelemetryConfig::build(None, &set).unwrap();
        assert_eq!(set.max_queue_size, 1000);
        assert_eq!(set.max_export_batch_size, 1000, "clamped to the queue");
        assert_eq!(default.batch_delay, DEFAULT_BATCH_DELAY);
        let env = Env::default().with("OTEL_BSP_SCHEDULE_DELAY", "250");
        assert_eq!(
            TelemetryConfig::build(None, &env).unwrap().batch_delay,
            Duration::from_millis(250)
        );
        let err =
            TelemetryConfig::build(None, &Env::default().with("OTEL_BSP_SCHEDULE_DELAY", "1s"))
                .unwrap_err();
        assert_eq!(err.path, "OTEL_BSP_SCHEDULE_DELAY");
        for bad in ["0", "lots", "-1"] {
            let env = Env::default().with("OTEL_BSP_MAX_QUEUE_SIZE", bad);
            let err = TelemetryConfig::build(None, &env).unwrap_err();
            assert_eq!(err.path, "OTEL_BSP_MAX_QUEUE_SIZE", "{bad}");
        }
    }
}
