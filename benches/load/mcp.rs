//! The client side of the MCP door's rows: a `tools/call` of `echo` over MCP's Streamable HTTP,
//! as a stateless host sends it (no `initialize`: the door serves both revisions statelessly),
//! over hyper-util's pooled HTTP/1.1 client with keep-alive connections and TCP_NODELAY, so the
//! client costs about what tonic's does for the gRPC rows. What is measured and how is
//! `load.rs`'s and `measure.rs`'s; this file only builds, sends and reads one call.

use std::{
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context;
use bytes::Buf;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, header};
use hyper_util::{
    client::legacy::{Client as HttpClient, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde::Deserialize;

use crate::catalog::MCP_PATH;

/// The MCP revision a call is sent under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revision {
    /// `MCP-Protocol-Version: 2025-11-25`, the body as that revision has it.
    V2025_11_25,
    /// 2026-07-28: also `Mcp-Method` and `Mcp-Name`, and the client's context in every
    /// request's `_meta` (SEP-2575).
    V2026_07_28,
}

impl Revision {
    pub fn as_str(self) -> &'static str {
        match self {
            Revision::V2025_11_25 => "2025-11-25",
            Revision::V2026_07_28 => "2026-07-28",
        }
    }
}

/// A pool of HTTP/1.1 keep-alive connections to one MCP endpoint; cloning shares the pool. A
/// connection carries one call at a time, so the pool opens as many as there are calls in
/// flight and keeps them for the next calls.
#[derive(Clone)]
pub struct Client(Arc<Pool>);

struct Pool {
    http: HttpClient<HttpConnector, String>,
    uri: Uri,
}

impl Client {
    /// A pool for the endpoint at `addr`; nothing is connected until the first call.
    pub fn new(addr: std::net::SocketAddr) -> anyhow::Result<Self> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let http = HttpClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(300))
            .build(connector);
        let uri = format!("http://{addr}{MCP_PATH}")
            .parse()
            .context("an MCP endpoint URI")?;
        Ok(Client(Arc::new(Pool { http, uri })))
    }
}

/// The `tools/call` every call to an MCP target sends, but for its JSON-RPC id: its headers
/// and its body around the id.
pub struct Call {
    headers: HeaderMap,
    body_before_id: String,
    body_after_id: String,
}

/// Numbers the JSON-RPC ids, as a host numbers its requests (the door makes each the call's
/// `call_id`).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Call {
    /// `echo` of `text` under `revision`, with `authorization` and the gRPC rows' run id.
    pub fn echo(revision: Revision, text: &str, authorization: &str) -> anyhow::Result<Self> {
        let mut headers = HeaderMap::new();
        let mut set = |name, value: &str| -> anyhow::Result<()> {
            headers.insert(name, HeaderValue::from_str(value)?);
            Ok(())
        };
        set(header::CONTENT_TYPE, "application/json")?;
        set(header::ACCEPT, "application/json, text/event-stream")?;
        set(header::AUTHORIZATION, authorization)?;
        let version = http::HeaderName::from_static("mcp-protocol-version");
        set(version, revision.as_str())?;
        let mut meta = serde_json::json!({ "toolgate/run_id": "run-bench" });
        if revision == Revision::V2026_07_28 {
            set(http::HeaderName::from_static("mcp-method"), "tools/call")?;
            set(http::HeaderName::from_static("mcp-name"), "echo")?;
            meta["io.modelcontextprotocol/protocolVersion"] = revision.as_str().into();
            meta["io.modelcontextprotocol/clientCapabilities"] = serde_json::json!({});
            meta["io.modelcontextprotocol/clientInfo"] =
                serde_json::json!({ "name": "toolgate-load", "version": "1" });
        }
        let params = serde_json::json!({
            "name": "echo",
            "arguments": { "text": text },
            "_meta": meta,
        });
        Ok(Call {
            headers,
            body_before_id: r#"{"jsonrpc":"2.0","id":"#.to_owned(),
            body_after_id: format!(r#","method":"tools/call","params":{params}}}"#),
        })
    }

    fn request(&self, uri: &Uri) -> anyhow::Result<Request<String>> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let body = format!("{}{id}{}", self.body_before_id, self.body_after_id);
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(uri.clone())
            .body(body)?;
        *request.headers_mut() = self.headers.clone();
        Ok(request)
    }
}

/// A JSON-RPC answer, as much of it as the harness reads.
#[derive(Deserialize)]
struct Answer {
    result: Option<ToolResult>,
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ToolResult {
    #[serde(default)]
    content: Vec<Content>,
    #[serde(rename = "isError", default)]
    is_error: bool,
}

#[derive(Deserialize)]
struct Content {
    text: Option<String>,
}

/// One `tools/call`, within `timeout`; `Ok` is the result's text, `Err` says why the answer is
/// not a result without `isError`.
pub async fn call_once(client: &Client, call: &Call, timeout: Duration) -> Result<String, String> {
    let request = call.request(&client.0.uri).map_err(|e| format!("{e:#}"))?;
    let answer = async {
        let response = client
            .0
            .http
            .request(request)
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        let status = response.status();
        let body = read_body(response.into_body()).await?;
        if status != StatusCode::OK {
            return Err(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&body)
                    .chars()
                    .take(200)
                    .collect::<String>()
            ));
        }
        Ok(body)
    };
    let body = tokio::time::timeout(timeout, answer)
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))??;
    let answer: Answer =
        serde_json::from_slice(&body).map_err(|e| format!("not a JSON-RPC answer: {e}"))?;
    let result = match (answer.result, answer.error) {
        (Some(result), None) => result,
        (_, error) => return Err(format!("JSON-RPC error: {}", error.unwrap_or_default())),
    };
    let text = result.content.into_iter().find_map(|c| c.text);
    match (result.is_error, text) {
        (false, Some(text)) => Ok(text),
        (false, None) => Err("a result without text".into()),
        (true, text) => Err(format!("isError: {}", text.unwrap_or_default())),
    }
}

/// The whole body of a response.
async fn read_body<B>(body: B) -> Result<Vec<u8>, String>
where
    B: http_body::Body,
    B::Error: std::fmt::Display,
{
    let mut body = pin!(body);
    let mut bytes = Vec::with_capacity(512);
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(|e| format!("reading the body: {e}"))?;
        if let Ok(mut data) = frame.into_data() {
            while data.has_remaining() {
                let chunk = data.chunk();
                bytes.extend_from_slice(chunk);
                let n = chunk.len();
                data.advance(n);
            }
        }
    }
    Ok(bytes)
}
