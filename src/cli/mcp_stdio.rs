//! `toolgate mcp-stdio`: a stdio MCP server for hosts that only launch local servers. Each
//! `tools/list` and `tools/call` is forwarded to a sidecar's MCP door over Streamable HTTP (rmcp's
//! client) with the caller's identity — a bearer JWT or the dev identity headers — and the door's
//! answer goes back to the host unchanged, refusals (`isError` results) included. It holds no
//! policy: the door admits and the boundary decides, so the audit names door "mcp". stdout is the
//! protocol; logs go to stderr.
//!
//! The door is reached at start, so the host's `initialize` sees its capabilities; a door that
//! is down then is said on stderr and tried again on each request, which fails with a JSON-RPC
//! error naming the URL until it answers.

use std::{borrow::Cow, collections::HashMap, future::Future, sync::Arc, time::Duration};

use http::{HeaderName, HeaderValue};
use rmcp::{
    ErrorData as McpError, RoleClient, RoleServer, ServerHandler, ServiceExt,
    model::{
        CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, Implementation,
        ListToolsResult, PaginatedRequestParams, ProtocolVersion, RequestMetaObject,
        ServerCapabilities, ServerConfig, ServerPeerInfo,
    },
    service::{
        ClientCacheConfig, ClientInitializeError, ClientLifecycleMode, ClientServiceExt, Peer,
        QuitReason, RequestContext, RunningService, ServerInitializeError, ServiceError,
    },
    transport::{
        StreamableHttpClientTransport, stdio_pipes,
        streamable_http_client::{StreamableHttpClientTransportConfig, StreamableHttpError},
    },
};
use serde_json::json;
use tokio::sync::Mutex;

use super::{Failure, McpStdioArgs, chain, client::not_text};
use crate::{
    mcp_door::SERVED_REVISIONS,
    settings::Env,
    telemetry::{self, TelemetryConfig},
};

/// How long reaching the door (its `server/discover` or `initialize`) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the host on stdin and stdout until it closes stdin; exit 1 only for bad flags or a
/// failure to start.
pub(super) async fn run(args: McpStdioArgs) -> Result<(), Failure> {
    // Logs only: an empty environment turns span export off.
    let telemetry_config = TelemetryConfig::build(None, &Env::default())
        .map_err(|err| Failure::error(format_args!("{}: {}", err.path, err.message)))?;
    let telemetry =
        telemetry::init(args.log_format, &telemetry_config).map_err(|err| Failure::caused(&err))?;
    let upstream = Arc::new(Upstream::new(&args).await?);
    if upstream.peer().await.is_ok() {
        tracing::info!(url = %upstream.url, "forwarding MCP from stdio to the sidecar's MCP door");
    }
    let result = match Proxy(upstream.clone()).serve(stdio_pipes()).await {
        Ok(service) => match service.waiting().await {
            Ok(QuitReason::JoinError(err)) | Err(err) => Err(Failure::caused(&err)),
            Ok(_) => Ok(()),
        },
        // The host went away before it initialized: nothing to serve.
        Err(ServerInitializeError::ConnectionClosed(_)) => Ok(()),
        Err(err) => Err(Failure::caused(&err)),
    };
    upstream.close().await;
    tracing::info!("the host closed the connection; exiting");
    telemetry.shutdown();
    result
}

/// The sidecar's MCP door: where it is, who the caller is, and the client connected to it.
struct Upstream {
    url: String,
    http: reqwest::Client,
    /// The JWT, sent as `Authorization: Bearer`.
    token: Option<String>,
    /// The dev identity headers.
    headers: HashMap<HeaderName, HeaderValue>,
    client: Mutex<Option<RunningService<RoleClient, ClientConfig>>>,
    /// What the door said of itself when last reached.
    info: std::sync::Mutex<Option<ServerPeerInfo>>,
}

impl Upstream {
    /// The door of `--url` with the caller's identity; refuses a URL that is not http(s), an
    /// unreadable or empty token file, and values that cannot be sent in a header.
    async fn new(args: &McpStdioArgs) -> Result<Self, Failure> {
        let url = url::Url::parse(&args.url)
            .map_err(|err| Failure::error(format_args!("invalid --url {}: {err}", args.url)))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Failure::error(format_args!(
                "--url {}: the scheme {:?} is not supported; use http:// or https://",
                args.url,
                url.scheme()
            )));
        }
        let token = match (&args.identity.token, &args.token_file) {
            (Some(token), _) => Some(token.trim().to_owned()),
            (None, Some(path)) => {
                let text = tokio::fs::read_to_string(path).await.map_err(|err| {
                    Failure::error(format_args!(
                        "cannot read --token-file {}: {err}",
                        path.display()
                    ))
                })?;
                Some(text.trim().to_owned())
            }
            (None, None) => None,
        };
        if let Some(token) = &token {
            if token.is_empty() {
                return Err(Failure::error("the token is empty"));
            }
            HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| not_text("the token"))?;
        }
        let mut headers = HashMap::new();
        for (header, flag, value) in args.identity.dev_headers() {
            let value = HeaderValue::try_from(value).map_err(|_| not_text(flag))?;
            headers.insert(HeaderName::from_static(header), value);
        }
        crate::tls::install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|err| Failure::error(format_args!("cannot build the HTTP client: {err}")))?;
        Ok(Upstream {
            url: args.url.clone(),
            http,
            token,
            headers,
            client: Mutex::new(None),
            info: std::sync::Mutex::new(None),
        })
    }

    /// The connected client's peer, connecting first if there is none or its transport closed.
    async fn peer(&self) -> Result<Peer<RoleClient>, McpError> {
        let mut client = self.client.lock().await;
        if let Some(running) = client.as_ref()
            && !running.is_transport_closed()
        {
            return Ok(running.peer().clone());
        }
        let mut config = StreamableHttpClientTransportConfig::with_uri(self.url.as_str())
            .custom_headers(self.headers.clone());
        config.auth_header = self.token.clone();
        let transport = StreamableHttpClientTransport::with_client(self.http.clone(), config);
        let lifecycle = ClientLifecycleMode::Auto {
            preferred_versions: SERVED_REVISIONS.to_vec(),
            legacy_version: None,
        };
        let handler = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("toolgate-mcp-stdio", env!("CARGO_PKG_VERSION")),
        );
        let connected = tokio::time::timeout(
            CONNECT_TIMEOUT,
            handler.serve_with_lifecycle(transport, lifecycle),
        )
        .await;
        let running = match connected {
            Ok(Ok(running)) => running,
            Ok(Err(err)) => return Err(self.error(&connect_failure(&err))),
            Err(_) => {
                return Err(self.error(&format!(
                    "did not answer within {} s",
                    CONNECT_TIMEOUT.as_secs()
                )));
            }
        };
        // Every answer is the door's own: a cached or stale listing would not be.
        running
            .peer()
            .set_response_cache_config(ClientCacheConfig::disabled())
            .await;
        if let Some(info) = running.peer().peer_info()
            && let Ok(mut slot) = self.info.lock()
        {
            *slot = Some((*info).clone());
        }
        let peer = running.peer().clone();
        *client = Some(running);
        Ok(peer)
    }

    /// Sends one request with `send`, until it answers or the host cancels the request (which
    /// drops the upstream request; rmcp then tells the door it was cancelled).
    async fn forward<T, F>(
        &self,
        context: &RequestContext<RoleServer>,
        send: impl FnOnce(Peer<RoleClient>) -> F,
    ) -> Result<T, McpError>
    where
        F: Future<Output = Result<T, ServiceError>>,
    {
        let forwarded = async {
            let peer = self.peer().await?;
            send(peer).await.map_err(|err| match err {
                // The door's own JSON-RPC error, as it sent it.
                ServiceError::McpError(error) => error,
                other => self.error(&request_failure(&other)),
            })
        };
        tokio::select! {
            result = forwarded => result,
            () = context.ct.cancelled() => {
                Err(McpError::invalid_request("the request was cancelled", None))
            }
        }
    }

    /// A failure to reach the door, logged on stderr and said to the host with the URL.
    fn error(&self, what: &str) -> McpError {
        tracing::error!(url = %self.url, error = %what, "cannot forward to the sidecar's MCP door");
        McpError::internal_error(
            format!("the sidecar's MCP door at {} {what}", self.url),
            Some(json!({ "url": self.url })),
        )
    }

    /// What the host is told of this server: the door's tools capability, identity and
    /// instructions when it has been reached, a tools capability until then. Never
    /// `listChanged`: no notification is forwarded.
    fn info(&self) -> ServerConfig {
        let door = self.info.lock().ok().and_then(|info| info.clone());
        let mut capabilities = ServerCapabilities::default();
        capabilities.tools = match &door {
            Some(door) => door.capabilities.tools.clone(),
            None => ServerCapabilities::builder().enable_tools().build().tools,
        };
        if let Some(tools) = &mut capabilities.tools {
            tools.list_changed = None;
        }
        let mut info = ServerConfig::new(capabilities);
        info.protocol_version = ProtocolVersion::V_2026_07_28;
        info.server_info = Implementation::new("toolgate", env!("CARGO_PKG_VERSION"));
        if let Some(door) = door {
            info.server_info = door.server_info.unwrap_or(info.server_info);
            info.instructions = door.instructions;
        }
        info
    }

    /// Ends the client (bounded); the door keeps no session to delete.
    async fn close(&self) {
        if let Some(running) = self.client.lock().await.take() {
            let _ = tokio::time::timeout(Duration::from_secs(2), running.cancel()).await;
        }
    }
}

/// Why connecting failed, for the host and the log.
fn connect_failure(err: &ClientInitializeError) -> String {
    match (err.auth_challenge(), err) {
        (Some(challenge), _) => refused(challenge),
        // Its transport error is a field, not its source.
        (None, ClientInitializeError::TransportError { error, .. }) => {
            format!("cannot be reached: {}", transport_cause(error))
        }
        (None, other) => format!("cannot be reached: {}", chain(other)),
    }
}

/// Why a request failed, for the host and the log.
fn request_failure(err: &ServiceError) -> String {
    match err.auth_challenge() {
        Some(challenge) => refused(challenge),
        None => format!("did not answer: {}", transport_cause(err)),
    }
}

/// An error said from the HTTP transport's failure down when it holds one (rmcp's wrappers name
/// their own types and the step that failed, not why), else with its whole chain.
fn transport_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut source = Some(err);
    while let Some(current) = source {
        match current.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
            Some(StreamableHttpError::Client(http)) => return chain(http),
            Some(other) => return chain(other),
            None => source = current.source(),
        }
    }
    chain(err)
}

fn refused(challenge: &str) -> String {
    format!(
        "refused the caller's identity (WWW-Authenticate: {challenge}); check --token, --token-file or the dev identity flags"
    )
}

/// The host's `_meta` to send on, without what describes the host's own connection to this
/// process (the `io.modelcontextprotocol/` keys and its progress token): the upstream client
/// sets those for its own. Everything else (`toolgate/run_id`, `toolgate/approval_id`, trace
/// context, …) goes as it came.
fn forwarded_meta(meta: &RequestMetaObject) -> Option<RequestMetaObject> {
    let mut forwarded = RequestMetaObject::default();
    for (key, value) in meta.0.0.iter() {
        if !(key.starts_with("io.modelcontextprotocol/") || key == "progressToken") {
            forwarded.0.0.insert(key.clone(), value.clone());
        }
    }
    (!forwarded.0.0.is_empty()).then_some(forwarded)
}

/// The host's server: every method it serves is forwarded.
struct Proxy(Arc<Upstream>);

impl ServerHandler for Proxy {
    fn get_info(&self) -> ServerConfig {
        self.0.info()
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(SERVED_REVISIONS)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut params = request.unwrap_or_default();
        params.meta = forwarded_meta(&context.meta);
        self.0
            .forward(&context, |peer| async move {
                peer.list_tools(Some(params)).await
            })
            .await
    }

    async fn call_tool(
        &self,
        mut params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        params.meta = forwarded_meta(&context.meta);
        self.0
            .forward(
                &context,
                |peer| async move { peer.call_tool_once(params).await },
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn the_hosts_meta_goes_on_without_its_own_connections_keys() {
        let meta: RequestMetaObject = serde_json::from_value(json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"url": {}}},
            "progressToken": 7,
            "toolgate/run_id": "run-7",
            "toolgate/approval_id": "apr_1",
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01",
        }))
        .unwrap();
        let forwarded = serde_json::to_value(forwarded_meta(&meta)).unwrap();
        assert_eq!(
            forwarded,
            json!({
                "toolgate/run_id": "run-7",
                "toolgate/approval_id": "apr_1",
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01",
            })
        );
        let only_the_hop: RequestMetaObject =
            serde_json::from_value(json!({"progressToken": "p"})).unwrap();
        assert_eq!(forwarded_meta(&only_the_hop), None);
        assert_eq!(
            serde_json::to_value(forwarded_meta(&RequestMetaObject::default())).unwrap(),
            Value::Null
        );
    }
}
