//! toolgate's OTLP span exporter: a batch of finished spans is written straight to protobuf
//! ([`encode`]) and sent over gRPC (tonic) or HTTP/protobuf (reqwest), with the standard
//! `OTEL_EXPORTER_OTLP_*` settings ([`ExportSettings`]) and the OTLP retry rules: transient
//! failures are retried with exponential backoff, all within the export timeout.
//!
//! It runs on the span export thread ([`super::batch`]) with a small runtime of its own: both
//! clients need a Tokio reactor, and the export thread is not in the server's runtime.

pub mod encode;

use std::{
    hash::BuildHasher,
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, uri::PathAndQuery};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use opentelemetry_sdk::{
    Resource,
    error::{OTelSdkError, OTelSdkResult},
    trace::{SpanData, SpanExporter},
};
use prost::Message as _;
use tonic::{
    codec::{Codec, EncodeBuf, Encoder},
    metadata::MetadataMap,
    transport::Channel,
};

use super::OtlpProtocol;
use encode::EncodedResource;

/// The export settings, validated when the configuration is loaded
/// ([`super::TelemetryConfig::build`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSettings {
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    /// Sent with every export request (`OTEL_EXPORTER_OTLP_TRACES_HEADERS`, then
    /// `OTEL_EXPORTER_OTLP_HEADERS`): a collector's API key, a tenant header.
    pub headers: HeaderMap,
    /// One export request, retries included.
    pub timeout: Duration,
}

/// The OTLP recommended retry schedule: three retries, 100 ms doubling up to 1.6 s, with up to
/// 100 ms of jitter so that sidecars restarted together do not retry together.
const MAX_RETRIES: u32 = 3;
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(100);
const MAX_RETRY_DELAY: Duration = Duration::from_millis(1_600);
const MAX_JITTER_MS: u64 = 100;

const GRPC_EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

fn user_agent() -> String {
    format!("toolgate/{}", env!("CARGO_PKG_VERSION"))
}

/// Why the exporter could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ExporterError {
    /// Its own runtime could not start.
    #[error("{0}")]
    Runtime(#[source] std::io::Error),
    /// The endpoint is not a URI a gRPC channel can use.
    #[error("invalid OTLP endpoint {endpoint:?}: {source}")]
    GrpcEndpoint {
        endpoint: String,
        source: tonic::transport::Error,
    },
    /// The user agent is not a header value.
    #[error("{0}")]
    UserAgent(#[source] tonic::transport::Error),
    /// The HTTP client could not be built.
    #[error("cannot build the OTLP HTTP client: {0}")]
    HttpClient(#[source] reqwest::Error),
    /// The endpoint is not a URL.
    #[error("invalid OTLP endpoint {endpoint:?}: {source}")]
    HttpEndpoint {
        endpoint: String,
        source: url::ParseError,
    },
}

/// Why one export request failed.
#[derive(Debug, thiserror::Error)]
enum ExportError {
    #[error("gRPC status {code:?}: {message}")]
    Grpc { code: tonic::Code, message: String },
    #[error("HTTP status {status}")]
    HttpStatus {
        status: http::StatusCode,
        retry_after: Option<Duration>,
    },
    #[error("HTTP request failed: {0}")]
    Http(#[source] reqwest::Error),
    #[error("no answer within the export timeout ({0:?})")]
    Timeout(Duration),
}

impl ExportError {
    /// Whether the OTLP specification calls this failure transient, and how long the collector
    /// asked us to wait, if it did.
    fn retry(&self) -> Option<Option<Duration>> {
        use tonic::Code;
        match self {
            // RESOURCE_EXHAUSTED only with the collector's RetryInfo, which is not read here.
            ExportError::Grpc { code, .. } => matches!(
                code,
                Code::Cancelled
                    | Code::DeadlineExceeded
                    | Code::Aborted
                    | Code::OutOfRange
                    | Code::Unavailable
                    | Code::DataLoss
            )
            .then_some(None),
            ExportError::HttpStatus {
                status,
                retry_after,
            } => matches!(status.as_u16(), 429 | 502 | 503 | 504).then_some(*retry_after),
            ExportError::Http(err) => {
                (err.is_connect() || err.is_timeout() || err.is_request()).then_some(None)
            }
            ExportError::Timeout(_) => None,
        }
    }
}

enum Transport {
    Grpc {
        client: tonic::client::Grpc<Channel>,
        metadata: MetadataMap,
    },
    Http {
        client: reqwest::Client,
        url: reqwest::Url,
        headers: HeaderMap,
    },
}

/// Sends batches of spans to an OTLP collector; see the module's documentation.
pub struct OtlpExporter {
    runtime: tokio::runtime::Runtime,
    transport: Transport,
    resource: EncodedResource,
    timeout: Duration,
    /// The last request's size, so the next buffer is allocated once.
    last_request_bytes: AtomicUsize,
    /// Logged once: a partial success names spans the collector rejected.
    partial_success_logged: AtomicBool,
}

impl std::fmt::Debug for OtlpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpExporter")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl OtlpExporter {
    /// An exporter sending to `settings.endpoint`; it connects when the first batch is sent.
    pub fn new(settings: &ExportSettings) -> Result<Self, ExporterError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("toolgate-otlp")
            .build()
            .map_err(ExporterError::Runtime)?;
        let transport = match settings.protocol {
            OtlpProtocol::Grpc => {
                let endpoint = tonic::transport::Endpoint::from_shared(settings.endpoint.clone())
                    .map_err(|source| ExporterError::GrpcEndpoint {
                        endpoint: settings.endpoint.clone(),
                        source,
                    })?
                    .user_agent(user_agent())
                    .map_err(ExporterError::UserAgent)?
                    .connect_timeout(settings.timeout)
                    .timeout(settings.timeout);
                // The channel's connection task runs on the runtime it is made in.
                let channel = {
                    let _entered = runtime.enter();
                    endpoint.connect_lazy()
                };
                Transport::Grpc {
                    client: tonic::client::Grpc::new(channel),
                    metadata: MetadataMap::from_headers(settings.headers.clone()),
                }
            }
            OtlpProtocol::HttpProtobuf => {
                crate::tls::install_crypto_provider();
                let client = reqwest::Client::builder()
                    .user_agent(user_agent())
                    .connect_timeout(settings.timeout)
                    .build()
                    .map_err(ExporterError::HttpClient)?;
                let url = reqwest::Url::parse(&settings.endpoint).map_err(|source| {
                    ExporterError::HttpEndpoint {
                        endpoint: settings.endpoint.clone(),
                        source,
                    }
                })?;
                let mut headers = settings.headers.clone();
                headers.insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/x-protobuf"),
                );
                Transport::Http {
                    client,
                    url,
                    headers,
                }
            }
        };
        Ok(OtlpExporter {
            runtime,
            transport,
            resource: EncodedResource::default(),
            timeout: settings.timeout,
            last_request_bytes: AtomicUsize::new(0),
            partial_success_logged: AtomicBool::new(false),
        })
    }

    /// Sends one encoded request, retrying transient failures until the timeout.
    async fn send(&self, request: Bytes) -> Result<(), ExportError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut retries = 0;
        loop {
            let attempt = tokio::time::timeout_at(deadline, self.send_once(request.clone()));
            let err = match attempt.await {
                Ok(Ok(response)) => {
                    self.check_partial_success(&response);
                    return Ok(());
                }
                Ok(Err(err)) => err,
                Err(_) => return Err(ExportError::Timeout(self.timeout)),
            };
            let Some(asked_delay) = err.retry() else {
                return Err(err);
            };
            if retries == MAX_RETRIES {
                return Err(err);
            }
            let delay = asked_delay.unwrap_or_else(|| backoff(retries));
            if tokio::time::Instant::now() + delay >= deadline {
                return Err(err);
            }
            tokio::time::sleep(delay).await;
            retries += 1;
        }
    }

    async fn send_once(&self, request: Bytes) -> Result<ExportTraceServiceResponse, ExportError> {
        match &self.transport {
            Transport::Grpc { client, metadata } => {
                let mut client = client.clone();
                let grpc_error = |status: tonic::Status| ExportError::Grpc {
                    code: status.code(),
                    message: status.message().to_owned(),
                };
                client.ready().await.map_err(|err| ExportError::Grpc {
                    code: tonic::Code::Unavailable,
                    message: err.to_string(),
                })?;
                let request = tonic::Request::from_parts(
                    metadata.clone(),
                    tonic::Extensions::default(),
                    request,
                );
                client
                    .unary(
                        request,
                        PathAndQuery::from_static(GRPC_EXPORT_PATH),
                        EncodedRequestCodec,
                    )
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(grpc_error)
            }
            Transport::Http {
                client,
                url,
                headers,
            } => {
                let response = client
                    .post(url.clone())
                    .headers(headers.clone())
                    .body(request)
                    .send()
                    .await
                    .map_err(ExportError::Http)?;
                let status = response.status();
                if !status.is_success() {
                    let retry_after = response
                        .headers()
                        .get(http::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    return Err(ExportError::HttpStatus {
                        status,
                        retry_after,
                    });
                }
                let body = response.bytes().await.map_err(ExportError::Http)?;
                // An empty or unreadable body is still a success: the status says so.
                Ok(ExportTraceServiceResponse::decode(body).unwrap_or_default())
            }
        }
    }

    fn check_partial_success(&self, response: &ExportTraceServiceResponse) {
        let Some(partial) = &response.partial_success else {
            return;
        };
        if partial.rejected_spans == 0 && partial.error_message.is_empty() {
            return;
        }
        if !self.partial_success_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                rejected_spans = partial.rejected_spans,
                message = %partial.error_message,
                "the OTLP collector rejected some spans (logged once)"
            );
        }
    }
}

/// The delay before retry number `retries` (from 0): doubling from the first, capped, plus jitter.
fn backoff(retries: u32) -> Duration {
    let doubled = FIRST_RETRY_DELAY.saturating_mul(1 << retries.min(16));
    let jitter_ms =
        std::collections::hash_map::RandomState::new().hash_one(retries) % MAX_JITTER_MS;
    doubled.min(MAX_RETRY_DELAY) + Duration::from_millis(jitter_ms)
}

impl SpanExporter for OtlpExporter {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let last = self.last_request_bytes.load(Ordering::Relaxed);
        // Room for a somewhat larger batch than the last, so the buffer is not reallocated.
        let mut request = Vec::with_capacity(last + last / 8 + 1024);
        encode::export_request(&batch, &self.resource, last, &mut request);
        // The spans' memory goes back before the request is in flight.
        drop(batch);
        self.last_request_bytes
            .store(request.len(), Ordering::Relaxed);
        // Called on the span export thread, never inside another runtime.
        let result = self
            .runtime
            .block_on(self.send(Bytes::from(request)))
            .map_err(|err| OTelSdkError::InternalFailure(err.to_string()));
        std::future::ready(result)
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        // Nothing is held between requests: the batch thread has sent everything by now.
        Ok(())
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = EncodedResource::new(resource);
    }
}

/// Sends an already encoded request as it is, and decodes the collector's answer.
#[derive(Debug, Clone, Copy)]
struct EncodedRequestCodec;

impl Codec for EncodedRequestCodec {
    type Encode = Bytes;
    type Decode = ExportTraceServiceResponse;
    type Encoder = EncodedRequestCodec;
    type Decoder = tonic_prost::ProstDecoder<ExportTraceServiceResponse>;

    fn encoder(&mut self) -> Self::Encoder {
        EncodedRequestCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

impl Encoder for EncodedRequestCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_bounded_jitter() {
        for (retries, base) in [
            (0, 100),
            (1, 200),
            (2, 400),
            (3, 800),
            (4, 1_600),
            (9, 1_600),
        ] {
            let delay = backoff(retries).as_millis() as u64;
            assert!(
                (base..base + MAX_JITTER_MS).contains(&delay),
                "retry {retries}: {delay} ms"
            );
        }
    }

    #[test]
    fn only_transient_failures_are_retried() {
        let grpc = |code| ExportError::Grpc {
            code,
            message: String::new(),
        };
        assert!(grpc(tonic::Code::Unavailable).retry().is_some());
        assert!(grpc(tonic::Code::DeadlineExceeded).retry().is_some());
        assert!(grpc(tonic::Code::InvalidArgument).retry().is_none());
        assert!(grpc(tonic::Code::Unauthenticated).retry().is_none());
        assert!(grpc(tonic::Code::ResourceExhausted).retry().is_none());
        let http = |status: u16, retry_after| ExportError::HttpStatus {
            status: http::StatusCode::from_u16(status).unwrap(),
            retry_after,
        };
        assert_eq!(
            http(429, Some(Duration::from_secs(2))).retry(),
            Some(Some(Duration::from_secs(2)))
        );
        assert_eq!(http(503, None).retry(), Some(None));
        assert_eq!(http(400, None).retry(), None);
        assert_eq!(http(401, None).retry(), None);
        assert!(
            ExportError::Timeout(Duration::from_secs(5))
                .retry()
                .is_none()
        );
    }
}
