//! The OTLP logs sink: each event is a log record whose body is the event's JSON, with the
//! call's trace context and a few attributes for filtering.

use opentelemetry_proto::tonic::{
    collector::logs::v1::{ExportLogsServiceRequest, logs_service_client::LogsServiceClient},
    common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value},
    logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber},
    resource::v1::Resource,
};
use tonic::transport::Channel;

use super::AuditEvent;

/// Why the logs sink could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LogsSinkError {
    /// The endpoint is not a URI a gRPC channel can use.
    #[error("invalid audit endpoint {endpoint:?}: {source}")]
    Endpoint {
        endpoint: String,
        source: http::uri::InvalidUri,
    },
}

pub struct LogsSink {
    client: LogsServiceClient<Channel>,
    resource: Resource,
}

fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..Default::default()
    }
}

impl LogsSink {
    /// A sink sending to `endpoint` as `service_name`; it connects when the first batch is sent.
    pub fn new(endpoint: &str, service_name: &str) -> Result<Self, LogsSinkError> {
        let channel = Channel::from_shared(endpoint.to_owned())
            .map_err(|source| LogsSinkError::Endpoint {
                endpoint: endpoint.to_owned(),
                source,
            })?
            .connect_timeout(std::time::Duration::from_secs(5))
            .connect_lazy();
        Ok(LogsSink {
            client: LogsServiceClient::new(channel),
            resource: Resource {
                attributes: vec![text("service.name", service_name)],
                ..Default::default()
            },
        })
    }

    pub async fn export(&mut self, events: &[Box<AuditEvent>]) -> std::io::Result<()> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let records = events
            .iter()
            .map(|event| {
                let time = u64::try_from(event.time.0)
                    .ok()
                    .and_then(|ms| ms.checked_mul(1_000_000))
                    .unwrap_or(now);
                let mut attributes = vec![
                    text("event.name", "toolgate.audit"),
                    text("toolgate.tenant", event.party.tenant()),
                    text("gen_ai.tool.name", &event.tool),
                    text("toolgate.status", event.status),
                ];
                if !event.call_id.is_empty() {
                    attributes.push(text("gen_ai.tool.call.id", &event.call_id));
                }
                LogRecord {
                    time_unix_nano: time,
                    observed_time_unix_nano: now,
                    severity_number: SeverityNumber::Info as i32,
                    severity_text: "INFO".into(),
                    body: Some(AnyValue {
                        value: Some(any_value::Value::StringValue({
                            let mut json = Vec::new();
                            let _ = event.write_json(&mut json);
                            String::from_utf8(json).unwrap_or_default()
                        })),
                    }),
                    attributes,
                    trace_id: event
                        .trace_id
                        .map(|t| t.to_bytes().to_vec())
                        .unwrap_or_default(),
                    span_id: event
                        .span_id
                        .map(|s| s.to_bytes().to_vec())
                        .unwrap_or_default(),
                    ..Default::default()
                }
            })
            .collect();
        let request = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: Some(self.resource.clone()),
                scope_logs: vec![ScopeLogs {
                    scope: Some(InstrumentationScope {
                        name: "toolgate.audit".into(),
                        ..Default::default()
                    }),
                    log_records: records,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        self.client
            .export(request)
            .await
            .map(|_| ())
            .map_err(|status| std::io::Error::other(format!("OTLP logs export: {status}")))
    }
}
