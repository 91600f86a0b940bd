//! A Streamable HTTP MCP server: connected through the http backend's SSRF-guarded client,
//! wrapped in [`LimitedHttp`] so a response over the size limit ends the call it answers as
//! `output_too_large` instead of closing the stream.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use rmcp::{
    ServiceExt,
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::{
        StreamableHttpClientTransport,
        streamable_http_client::{
            SseError, StreamableHttpClient, StreamableHttpClientTransportConfig,
            StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
        },
    },
};
use url::Url;

use super::{
    McpServerConfig,
    auth::{Bearer, McpAuth},
    errors::oversized_error,
    supervisor::{Connection, ListChanged},
};
use crate::outbound::{Destination, guarded_client};

/// Connects to the server's URL, refusing an address its destination policy does not allow.
pub(super) async fn connect(
    config: &McpServerConfig,
    url: &Url,
    destination: &Destination,
    auth: Option<McpAuth>,
    handler: ListChanged,
) -> Result<Connection, String> {
    destination.check_literal(url).map_err(|why| {
        tracing::error!(server = %config.name, reason = %why, "refused a non-public MCP server address");
        why.to_string()
    })?;
    let client = guarded_client(destination, Duration::from_secs(5))
        .map_err(|err| format!("cannot build the HTTP client: {err}"))?;
    let limit = config.max_message_bytes;
    let transport = StreamableHttpClientTransport::with_client(
        LimitedHttp {
            inner: client,
            limit,
            auth,
        },
        StreamableHttpClientTransportConfig::with_uri(url.as_str())
            .max_sse_event_size(limit)
            .max_json_response_size(limit),
    );
    let service = handler.serve(transport).await.map_err(|err| {
        let text = err.to_string();
        // The resolver's refusal is in the error's text: say it plainly for operators.
        if text.contains("non-public address") {
            tracing::error!(server = %config.name, error = %text, "refused a non-public MCP server address");
        }
        text
    })?;
    Ok(Connection {
        service,
        _process: None,
    })
}

/// The Streamable HTTP client: the guarded reqwest client, and a response over the limit turns
/// into an error answer to the request it answered (rmcp would close the stream, or fail the
/// POST, leaving the cause unclear).
#[derive(Clone)]
struct LimitedHttp {
    inner: reqwest::Client,
    limit: usize,
    /// Per-call credentials: each request's token, instead of rmcp's (none).
    auth: Option<McpAuth>,
}

type PostResult = Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>;

impl LimitedHttp {
    fn limits(&self) -> StreamableHttpResponseLimits {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = self.limit;
        limits.max_json_response_size = self.limit;
        limits
    }

    /// The token a request that is not a call goes with.
    async fn session_bearer(
        &self,
        given: Bearer,
    ) -> Result<Bearer, StreamableHttpError<reqwest::Error>> {
        match &self.auth {
            Some(auth) => auth.session_bearer().await.map_err(no_credential),
            None => Ok(given),
        }
    }
}

/// A request that cannot be authenticated is not sent; rmcp fails the request it carried.
fn no_credential(err: crate::credentials::CredentialError) -> StreamableHttpError<reqwest::Error> {
    tracing::warn!(error = %err, "an MCP request was not sent: no credential");
    StreamableHttpError::UnexpectedServerResponse(format!("not sent: {err}").into())
}

/// Whether an SSE stream ended because an event was over the size limit. rmcp's error type for
/// it is private; its text is not.
fn event_too_large(error: &SseError) -> bool {
    error.to_string().contains("exceeded the maximum size")
}

impl StreamableHttpClient for LimitedHttp {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: std::collections::HashMap<http::HeaderName, http::HeaderValue>,
    ) -> PostResult {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            self.limits(),
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        mut message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: std::collections::HashMap<http::HeaderName, http::HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> PostResult {
        let auth_header = match &self.auth {
            Some(auth) => auth.bearer_for(&mut message).await.map_err(no_credential)?,
            None => auth_header,
        };
        let id = match &message {
            ClientJsonRpcMessage::Request(request) => Some(request.id.clone()),
            _ => None,
        };
        let session = session_id.as_deref().map(str::to_owned);
        let result = self
            .inner
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await;
        let limit = self.limit;
        match (result, id) {
            (Err(StreamableHttpError::ResponseBodyTooLarge { .. }), Some(id)) => {
                tracing::warn!(
                    limit,
                    "an MCP server's response was over its size limit; its call ends as output_too_large"
                );
                Ok(StreamableHttpPostResponse::Json(
                    ServerJsonRpcMessage::error(oversized_error(limit), Some(id)),
                    session,
                ))
            }
            (Ok(StreamableHttpPostResponse::Sse(stream, session)), Some(id)) => {
                let answered = stream
                    .scan(false, move |ended, item| {
                        let next = match item {
                            _ if *ended => None,
                            Err(error) if event_too_large(&error) => {
                                *ended = true;
                                tracing::warn!(limit, "an MCP server's response was over its size limit; its call ends as output_too_large");
                                let answer =
                                    ServerJsonRpcMessage::error(oversized_error(limit), Some(id.clone()));
                                Some(Ok(sse_stream::Sse {
                                    event: Some("message".into()),
                                    data: serde_json::to_string(&answer).ok(),
                                    id: None,
                                    retry: None,
                                }))
                            }
                            other => Some(other),
                        };
                        std::future::ready(next)
                    })
                    .boxed();
                Ok(StreamableHttpPostResponse::Sse(answered, session))
            }
            (other, _) => other,
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: std::collections::HashMap<http::HeaderName, http::HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        let auth_header = self.session_bearer(auth_header).await?;
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: std::collections::HashMap<http::HeaderName, http::HeaderValue>,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<sse_stream::Sse, SseError>>,
        StreamableHttpError<Self::Error>,
    > {
        let auth_header = self.session_bearer(auth_header).await?;
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                self.limit,
            )
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: std::collections::HashMap<http::HeaderName, http::HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<
        futures::stream::BoxStream<'static, Result<sse_stream::Sse, SseError>>,
        StreamableHttpError<Self::Error>,
    > {
        let auth_header = self.session_bearer(auth_header).await?;
        self.inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}
