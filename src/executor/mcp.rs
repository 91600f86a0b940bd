//! The `mcp` backend: tools from allow-listed MCP servers (a stdio command or a Streamable HTTP
//! URL), through the rmcp client.
//!
//! One supervisor task per server connects, lists the server's tools, publishes the ones the
//! catalog names (the catalog then rebuilds with their schemas), re-lists on
//! `notifications/tools/list_changed`, and reconnects with backoff when the server goes away.
//! A server that is down — never came up, or went away — has its tools withdrawn, so they are
//! hidden from ListTools and answer UNAVAILABLE quickly; it never takes the sidecar down. An MCP
//! server's own description is never taken as authorization: risk level, scopes, limits and
//! bindings come from the catalog.
//!
//! A message from a server over its `max_message_bytes` is never buffered: the call it answers
//! ends at once as `output_too_large` ([`LineGuard`] for stdio, [`LimitedHttp`] for Streamable
//! HTTP). Streamable HTTP goes through the same SSRF-guarded, proxy-ignoring client as the http
//! backend.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    pin::Pin,
    sync::{Arc, RwLock},
    task::{Context, Poll},
    time::Duration,
};

use futures::{FutureExt, StreamExt, future::BoxFuture};
use rmcp::{
    ClientHandler, RoleClient, ServiceExt,
    model::{
        CallToolRequestParams, ClientJsonRpcMessage, ErrorCode, ErrorData, RequestId,
        ServerJsonRpcMessage,
    },
    service::{NotificationContext, Peer, ServiceError},
    transport::{
        StreamableHttpClientTransport,
        async_rw::AsyncRwTransport,
        streamable_http_client::{
            SseError, StreamableHttpClient, StreamableHttpClientTransportConfig,
            StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
        },
    },
};
use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt, AsyncRead, BufReader, ReadBuf},
    sync::{Notify, watch},
    task::JoinHandle,
    time::Instant,
};
use url::Url;

use super::{
    ExecError, Executor,
    http::{Destination, check_url, guarded_client},
    process::{descendants, program_path, runnable},
};
use crate::{
    boundary::Permit,
    settings::{Env, FieldError, parse_duration, raw::RawMcpServer},
};

/// Which MCP server and which of its tools a catalog entry runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpTool {
    pub server: String,
    pub tool: String,
}

/// A tool a server listed, as the model will see it.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveredTool {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// Server name -> the tools it offers that the catalog names; absent while it is not connected.
pub type Discovered = BTreeMap<String, Vec<DiscoveredTool>>;

/// How to reach a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Stdio {
        program: PathBuf,
        args: Vec<String>,
        env: BTreeMap<String, String>,
    },
    Http {
        url: Url,
        destination: Destination,
    },
}

/// A validated MCP server entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServerConfig {
    pub name: String,
    pub transport: Transport,
    pub prefix: String,
    pub startup_timeout: Duration,
    /// The largest single message accepted from the server.
    pub max_message_bytes: usize,
    /// The server-side names of the tools the catalog exposes.
    pub tools: BTreeSet<String>,
}

/// The default largest message from an MCP server: room for a tool output of the default
/// `max_output_bytes` (1 MiB) several times over, JSON escaping and structured content included.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// Connecting the same server this long is a success: the restart backoff starts over.
const STABLE_AFTER: Duration = Duration::from_secs(10);

impl McpServerConfig {
    /// Validates every server; prefixes must be unique, so tool names cannot clash between
    /// servers whatever they list.
    pub fn build_all(
        raw: &BTreeMap<String, RawMcpServer>,
        base_dir: &Path,
        env: &Env,
    ) -> Result<Vec<Self>, FieldError> {
        let mut by_prefix: BTreeMap<String, String> = BTreeMap::new();
        raw.iter()
            .map(|(name, server)| {
                let built = Self::build(name, server, base_dir, env)?;
                if let Some(first) = by_prefix.insert(built.prefix.clone(), name.clone()) {
                    return Err(FieldError::new(
                        format!("mcp_servers.{name}.prefix"),
                        format!(
                            "prefix {:?} is already used by mcp_servers.{first}; give each server its own prefix",
                            built.prefix
                        ),
                    ));
                }
                Ok(built)
            })
            .collect()
    }

    pub fn build(
        name: &str,
        raw: &RawMcpServer,
        base_dir: &Path,
        env: &Env,
    ) -> Result<Self, FieldError> {
        let at = |field: &str| format!("mcp_servers.{name}.{field}");
        let transport = match (&raw.command, &raw.url) {
            (Some(command), None) => {
                let (program, args) = command
                    .split_first()
                    .ok_or_else(|| FieldError::new(at("command"), "must name a program"))?;
                let mut program_env: BTreeMap<String, String> = raw
                    .env
                    .iter()
                    .filter_map(|k| env.get(k).map(|v| (k.clone(), v.to_owned())))
                    .collect();
                program_env.extend(raw.set_env.clone());
                let search = program_env
                    .get("PATH")
                    .map(String::as_str)
                    .or_else(|| env.get("PATH"));
                Transport::Stdio {
                    program: program_path(program, base_dir, search),
                    args: args.to_vec(),
                    env: program_env,
                }
            }
            (None, Some(url)) => {
                let parsed = Url::parse(url).map_err(|err| {
                    FieldError::new(at("url"), format!("invalid URL {url:?}: {err}"))
                })?;
                check_url(&parsed, &at("url"))?;
                Transport::Http {
                    url: parsed,
                    destination: Destination::build(
                        format!("MCP server {name}"),
                        raw.allow_private_addresses,
                        &raw.allow_private_cidrs,
                        &raw.resolve,
                        at,
                    )?,
                }
            }
            _ => {
                return Err(FieldError::new(
                    format!("mcp_servers.{name}"),
                    "set exactly one of command (stdio) or url (Streamable HTTP)",
                ));
            }
        };
        if matches!(transport, Transport::Stdio { .. })
            && (raw.allow_private_addresses
                || !raw.allow_private_cidrs.is_empty()
                || !raw.resolve.is_empty())
        {
            return Err(FieldError::new(
                format!("mcp_servers.{name}"),
                "allow_private_addresses, allow_private_cidrs and resolve apply to url servers only",
            ));
        }
        let prefix = raw.prefix.clone().unwrap_or_else(|| name.to_owned());
        if prefix.is_empty()
            || !prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        {
            return Err(FieldError::new(
                at("prefix"),
                format!("invalid prefix {prefix:?}: use A-Z a-z 0-9 _ -"),
            ));
        }
        let startup_timeout = match &raw.startup_timeout {
            Some(text) => {
                parse_duration(text).map_err(|m| FieldError::new(at("startup_timeout"), m))?
            }
            None => Duration::from_secs(30),
        };
        let max_message_bytes = match raw.max_message_bytes {
            Some(0) => {
                return Err(FieldError::new(
                    at("max_message_bytes"),
                    "must be greater than 0",
                ));
            }
            Some(n) => n,
            None => DEFAULT_MAX_MESSAGE_BYTES,
        };
        Ok(McpServerConfig {
            name: name.to_owned(),
            transport,
            prefix,
            startup_timeout,
            max_message_bytes,
            tools: raw.tools.keys().cloned().collect(),
        })
    }

    /// What about this server cannot work on this machine (a stdio program that is missing or
    /// not executable); see `ProcessTool::host_problems`.
    pub fn host_problems(&self) -> Vec<FieldError> {
        match &self.transport {
            Transport::Stdio { program, .. } => runnable(program)
                .err()
                .map(|why| FieldError::new(format!("mcp_servers.{}.command", self.name), why))
                .into_iter()
                .collect(),
            Transport::Http { .. } => Vec::new(),
        }
    }
}

/// One server's live connection, shared with executions.
#[derive(Default)]
struct Slot {
    peer: RwLock<Option<Peer<RoleClient>>>,
    pid: RwLock<Option<u32>>,
}

/// Connections to every configured MCP server.
pub struct McpManager {
    slots: BTreeMap<String, Arc<Slot>>,
    discovered: watch::Sender<Discovered>,
    supervisors: Vec<JoinHandle<()>>,
    /// Calls sent to MCP servers and not answered yet.
    in_flight: watch::Sender<u64>,
}

impl Default for McpManager {
    fn default() -> Self {
        Self::start(&[])
    }
}

/// Counts one call in flight for as long as it lives.
struct InFlight<'a>(&'a watch::Sender<u64>);

impl<'a> InFlight<'a> {
    fn enter(gauge: &'a watch::Sender<u64>) -> Self {
        gauge.send_modify(|n| *n += 1);
        InFlight(gauge)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Drop for McpManager {
    fn drop(&mut self) {
        self.stop();
    }
}

impl McpManager {
    /// Starts a supervisor per server; tools appear as servers come up.
    pub fn start(servers: &[McpServerConfig]) -> Self {
        let (discovered, _) = watch::channel(Discovered::new());
        let mut slots = BTreeMap::new();
        let mut supervisors = Vec::new();
        for config in servers {
            let slot = Arc::new(Slot::default());
            slots.insert(config.name.clone(), slot.clone());
            supervisors.push(tokio::spawn(supervise(
                config.clone(),
                slot,
                discovered.clone(),
            )));
        }
        McpManager {
            slots,
            discovered,
            supervisors,
            in_flight: watch::channel(0).0,
        }
    }

    /// Watches the number of calls sent to MCP servers and not answered yet.
    pub fn watch_in_flight(&self) -> watch::Receiver<u64> {
        self.in_flight.subscribe()
    }

    /// Stops every supervisor; dropping their connections ends stdio servers' processes.
    pub fn stop(&self) {
        for task in &self.supervisors {
            task.abort();
        }
        for slot in self.slots.values() {
            set(&slot.peer, None);
        }
    }

    /// Watches which tools the servers have listed.
    pub fn watch_discovered(&self) -> watch::Receiver<Discovered> {
        self.discovered.subscribe()
    }

    /// The pid of a stdio server's current process, for operators and tests.
    pub fn pid(&self, server: &str) -> Option<u32> {
        self.slots
            .get(server)
            .and_then(|s| s.pid.read().ok().and_then(|p| *p))
    }

    /// Whether a server is connected now.
    pub fn connected(&self, server: &str) -> bool {
        self.slots
            .get(server)
            .is_some_and(|s| s.peer.read().is_ok_and(|p| p.is_some()))
    }

    async fn run(&self, tool: &McpTool, permit: &Permit) -> Result<String, ExecError> {
        let peer = self
            .slots
            .get(&tool.server)
            .and_then(|slot| slot.peer.read().ok().and_then(|p| p.clone()))
            .ok_or_else(|| {
                ExecError::NotReached(format!(
                    "MCP server {} is not connected; retry later",
                    tool.server
                ))
            })?;
        let arguments = permit.arguments().as_object().cloned().unwrap_or_default();
        let _in_flight = InFlight::enter(&self.in_flight);
        // Dropping this future (deadline, client cancel) cancels the request on the server.
        let mut params = CallToolRequestParams::new(tool.tool.clone()).with_arguments(arguments);
        // The W3C trace context travels in the request's _meta, as MCP's tracing convention has it.
        if let Some(traceparent) = permit.traceparent() {
            let mut meta = serde_json::Map::new();
            meta.insert("traceparent".into(), Value::from(traceparent));
            params.meta = Some(meta.into());
        }
        let result = peer
            .call_tool(params)
            .await
            .map_err(|err| call_error(&tool.server, &tool.tool, err))?;
        let text = render_content(&result.content);
        if result.is_error == Some(true) {
            return Err(ExecError::failed_with(
                "the MCP tool reported an error",
                text,
            ));
        }
        match (&result.structured_content, text.is_empty()) {
            (Some(structured), true) => Ok(structured.to_string()),
            _ => Ok(text),
        }
    }
}

/// Text blocks as they are; other blocks (images, resources) as their JSON.
fn render_content<T: serde::Serialize>(blocks: &[T]) -> String {
    blocks
        .iter()
        .filter_map(|block| serde_json::to_value(block).ok())
        .map(|value| {
            match (
                value.get("type").and_then(Value::as_str),
                value.get("text").and_then(Value::as_str),
            ) {
                (Some("text"), Some(text)) => text.to_owned(),
                _ => value.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl Executor for McpManager {
    fn execute<'a>(&'a self, permit: &'a Permit) -> BoxFuture<'a, Result<String, ExecError>> {
        async move {
            match &permit.tool().executor {
                super::ExecutorSpec::Mcp(tool) => self.run(tool, permit).await,
                _ => Err(ExecError::failed("not an MCP tool")),
            }
        }
        .boxed()
    }
}

/// Maps a failed call: a message over the limit, the server's own JSON-RPC error (a failure of
/// the tool, not an outage), or a broken connection (retryable).
fn call_error(server: &str, tool: &str, err: ServiceError) -> ExecError {
    match err {
        ServiceError::McpError(error) if is_oversized(&error) => {
            ExecError::OutputTooLarge(format!(
                "MCP server {server} answered with a message over its limit of {} bytes",
                error
                    .data
                    .as_ref()
                    .and_then(|d| d.get("limit"))
                    .and_then(Value::as_u64)
                    .unwrap_or_default()
            ))
        }
        // rmcp reports a connection that closed under a pending call as an error "from" it.
        ServiceError::McpError(error)
            if error
                .data
                .as_ref()
                .is_some_and(|d| d.get("io.modelcontextprotocol/transportClosed").is_some()) =>
        {
            tracing::warn!(server = %server, tool = %tool, "MCP connection closed during a call");
            ExecError::Unavailable(format!("MCP server {server} did not answer the call"))
        }
        ServiceError::McpError(error) => ExecError::failed_with(
            format!("MCP server {server} refused the call ({})", error.code.0),
            error.message.into_owned(),
        ),
        other => {
            tracing::warn!(server = %server, tool = %tool, error = %other, "MCP call failed");
            ExecError::Unavailable(format!("MCP server {server} did not answer the call"))
        }
    }
}

/// The JSON-RPC error toolgate answers a call with when the server's reply was over the limit.
/// In the implementation-defined server error range.
const OVERSIZED_CODE: i32 = -32042;
const OVERSIZED_MESSAGE: &str = "toolgate: the MCP server's message was over its size limit";

fn oversized_error(limit: usize) -> ErrorData {
    ErrorData::new(
        ErrorCode(OVERSIZED_CODE),
        OVERSIZED_MESSAGE,
        Some(serde_json::json!({ "limit": limit })),
    )
}

fn is_oversized(error: &ErrorData) -> bool {
    error.code.0 == OVERSIZED_CODE && error.message == OVERSIZED_MESSAGE
}

/// Wakes the supervisor when the server says its tool list changed.
#[derive(Clone)]
struct ListChanged(Arc<Notify>);

impl ClientHandler for ListChanged {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        self.0.notify_one();
        std::future::ready(())
    }
}

/// Reconnect delays double from the first to the last.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

async fn supervise(
    config: McpServerConfig,
    slot: Arc<Slot>,
    discovered: watch::Sender<Discovered>,
) {
    let mut backoff = BACKOFF_FIRST;
    loop {
        let changed = Arc::new(Notify::new());
        match tokio::time::timeout(
            config.startup_timeout,
            connect(&config, &slot, ListChanged(changed.clone())),
        )
        .await
        {
            Ok(Ok(connection)) => {
                let Connection {
                    service,
                    _process: process,
                } = connection;
                let up_since = Instant::now();
                let peer = service.peer().clone();
                match list(&config, &peer).await {
                    Ok(tools) => {
                        tracing::info!(server = %config.name, tools = tools.len(), "MCP server connected");
                        publish(&discovered, &config.name, tools);
                    }
                    Err(err) => {
                        tracing::warn!(server = %config.name, error = %err, "MCP server did not list its tools")
                    }
                }
                set(&slot.peer, Some(peer.clone()));
                let ended = service.waiting();
                tokio::pin!(ended);
                loop {
                    tokio::select! {
                        _ = &mut ended => break,
                        _ = changed.notified() => match list(&config, &peer).await {
                            Ok(tools) => {
                                tracing::info!(server = %config.name, tools = tools.len(), "MCP tool list changed");
                                publish(&discovered, &config.name, tools);
                            }
                            Err(err) => tracing::warn!(server = %config.name, error = %err, "MCP server did not list its tools"),
                        },
                    }
                }
                // Down now: reported exactly like a server that never came up.
                set(&slot.peer, None);
                set(&slot.pid, None);
                withdraw(&discovered, &config.name);
                drop(process);
                // Only a connection that lasted resets the backoff: a server that connects and
                // dies at once must not be restarted ten times a second.
                if up_since.elapsed() >= STABLE_AFTER {
                    backoff = BACKOFF_FIRST;
                }
                tracing::warn!(server = %config.name, retry_in_ms = backoff.as_millis() as u64, "MCP server disconnected; reconnecting");
            }
            Ok(Err(err)) => {
                tracing::warn!(server = %config.name, error = %err, retry_in_ms = backoff.as_millis() as u64, "cannot connect to MCP server")
            }
            Err(_) => {
                tracing::warn!(server = %config.name, retry_in_ms = backoff.as_millis() as u64, "MCP server did not start in time")
            }
        }
        set(&slot.pid, None);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

fn set<T>(lock: &RwLock<Option<T>>, value: Option<T>) {
    match lock.write() {
        Ok(mut guard) => *guard = value,
        Err(poisoned) => *poisoned.into_inner() = value,
    }
}

type Service = rmcp::service::RunningService<RoleClient, ListChanged>;

/// A live connection, and for stdio the server's process, ended (with what it started) when
/// this is dropped.
struct Connection {
    service: Service,
    _process: Option<StdioProcess>,
}

/// A stdio server's process.
struct StdioProcess {
    child: tokio::process::Child,
    started: Option<descendants::Started>,
}

impl Drop for StdioProcess {
    fn drop(&mut self) {
        if let Some(started) = self.started.take() {
            // Killed with everything it started; its own exit is collected by tokio (the
            // child's handle goes to tokio's orphan queue with `self.child`).
            descendants::end(started);
        }
        let _ = self.child.start_kill();
    }
}

async fn connect(
    config: &McpServerConfig,
    slot: &Slot,
    handler: ListChanged,
) -> Result<Connection, String> {
    match &config.transport {
        Transport::Stdio { program, args, env } => {
            let mut command = tokio::process::Command::new(program);
            command
                .args(args)
                .env_clear()
                .envs(env)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            let (mut child, started) = descendants::spawn(&mut command)
                .map_err(|err| format!("cannot start {}: {err}", program.display()))?;
            set(&slot.pid, child.id());
            let (Some(stdin), Some(stdout), Some(stderr)) =
                (child.stdin.take(), child.stdout.take(), child.stderr.take())
            else {
                return Err("the server's process has no pipes".into());
            };
            let process = StdioProcess {
                child,
                started: Some(started),
            };
            // Keep the pipe drained; the server's own log lines are debug output here.
            let server = config.name.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(server = %server, line = %line, "MCP server stderr");
                }
            });
            let reader = LineGuard::new(stdout, config.max_message_bytes, config.name.clone());
            // The guard enforces the limit; rmcp's own (16 MiB) would drop a line silently.
            let transport = AsyncRwTransport::new(reader, stdin).with_max_line_length(usize::MAX);
            let service = handler
                .serve(transport)
                .await
                .map_err(|err| err.to_string())?;
            Ok(Connection {
                service,
                _process: Some(process),
            })
        }
        Transport::Http { url, destination } => {
            destination.check_literal(url).inspect_err(|why| {
                tracing::error!(server = %config.name, reason = %why, "refused a non-public MCP server address");
            })?;
            let client = guarded_client(destination, Duration::from_secs(5))
                .map_err(|err| format!("cannot build the HTTP client: {err}"))?;
            let limit = config.max_message_bytes;
            let transport = StreamableHttpClientTransport::with_client(
                LimitedHttp {
                    inner: client,
                    limit,
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
    }
}

async fn list(
    config: &McpServerConfig,
    peer: &Peer<RoleClient>,
) -> Result<Vec<DiscoveredTool>, String> {
    let tools = tokio::time::timeout(config.startup_timeout, peer.list_all_tools())
        .await
        .map_err(|_| "listing tools timed out".to_owned())?
        .map_err(|err| err.to_string())?;
    Ok(tools
        .into_iter()
        .filter(|t| config.tools.contains(t.name.as_ref()))
        .map(|t| DiscoveredTool {
            name: t.name.to_string(),
            description: t.description.as_deref().unwrap_or("").to_owned(),
            input_schema: Value::Object((*t.input_schema).clone()),
        })
        .collect())
}

fn publish(discovered: &watch::Sender<Discovered>, server: &str, tools: Vec<DiscoveredTool>) {
    discovered.send_if_modified(|all| {
        let changed = all.get(server) != Some(&tools);
        if changed {
            all.insert(server.to_owned(), tools);
        }
        changed
    });
}

/// Withdraws a server's tools: the catalog then treats them as not offered.
fn withdraw(discovered: &watch::Sender<Discovered>, server: &str) {
    discovered.send_if_modified(|all| all.remove(server).is_some());
}

/// Reads a stdio server's output and passes on whole lines (one JSON-RPC message each) of at
/// most `limit` bytes. A longer line is not kept: it is cut off (rmcp then ignores the fragment
/// as unparsable), read to its end while [`IdScanner`] looks for its top-level `id`, and replaced
/// by an error response to that id, so the call it answered ends at once.
pub struct LineGuard<R> {
    inner: R,
    limit: usize,
    server: String,
    /// Bytes of the current line passed on so far.
    line_len: usize,
    /// The current line is over the limit and is being skipped.
    skipping: bool,
    scanner: IdScanner,
    /// Bytes to hand out before reading more (a cut-off line's end, an error response).
    pending: Vec<u8>,
    scratch: Box<[u8]>,
    eof: bool,
}

impl<R> LineGuard<R> {
    pub fn new(inner: R, limit: usize, server: String) -> Self {
        LineGuard {
            inner,
            limit,
            server,
            line_len: 0,
            skipping: false,
            scanner: IdScanner::default(),
            pending: Vec::new(),
            scratch: vec![0; 16 * 1024].into_boxed_slice(),
            eof: false,
        }
    }

    /// Processes `n` bytes of `scratch`, appending what passes to `out`.
    fn process(&mut self, n: usize, out: &mut ReadBuf<'_>) {
        let mut at = 0;
        while at < n {
            let chunk = &self.scratch[at..n];
            let line_end = chunk.iter().position(|b| *b == b'\n');
            let take = line_end.map_or(chunk.len(), |i| i + 1);
            let piece = &chunk[..take];
            self.scanner.feed(piece);
            if !self.skipping && self.line_len + take > self.limit {
                self.skipping = true;
                // End the fragment rmcp has buffered so far; it is discarded as unparsable.
                if self.line_len > 0 {
                    self.pending.push(b'\n');
                }
            }
            if !self.skipping {
                // Behind anything pending, so the order of what rmcp reads is kept.
                if self.pending.is_empty() {
                    out.put_slice(piece);
                } else {
                    self.pending.extend_from_slice(piece);
                }
                self.line_len += take;
            }
            if line_end.is_some() {
                if self.skipping {
                    self.answer_oversized();
                }
                self.line_len = 0;
                self.skipping = false;
                self.scanner = IdScanner::default();
            }
            at += take;
        }
    }

    fn answer_oversized(&mut self) {
        match self.scanner.response_id() {
            Some(id) => {
                tracing::warn!(server = %self.server, limit = self.limit, "an MCP server's response was over its size limit; its call ends as output_too_large");
                let answer = ServerJsonRpcMessage::error(oversized_error(self.limit), Some(id));
                if let Ok(mut line) = serde_json::to_vec(&answer) {
                    line.push(b'\n');
                    self.pending.extend_from_slice(&line);
                }
            }
            None => {
                tracing::warn!(server = %self.server, limit = self.limit, "dropped an MCP server message over its size limit")
            }
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LineGuard<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.pending.is_empty() {
                let n = this.pending.len().min(out.remaining());
                out.put_slice(&this.pending[..n]);
                this.pending.drain(..n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            // Never read more than fits: passed bytes go straight to `out`.
            let want = out.remaining().min(this.scratch.len());
            if want == 0 {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut this.scratch[..want]);
            match Pin::new(&mut this.inner).poll_read(cx, &mut buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Ready(Ok(())) => {}
            }
            let n = buf.filled().len();
            if n == 0 {
                this.eof = true;
                continue;
            }
            let before = out.filled().len();
            this.process(n, out);
            if out.filled().len() > before {
                return Poll::Ready(Ok(()));
            }
            // Everything read was skipped (or is pending): go on.
        }
    }
}

/// Follows one JSON-RPC message, a byte at a time and without keeping it, far enough to know its
/// top-level `id` and whether it has a `method` (a request or notification from the server,
/// whose id is not one of ours).
#[derive(Default)]
pub struct IdScanner {
    state: ScanState,
    depth: u32,
    in_string: bool,
    escaped: bool,
    key: Vec<u8>,
    value_of: ValueOf,
    id: Vec<u8>,
    id_complete: bool,
    has_method: bool,
}

#[derive(Default, PartialEq, Eq)]
enum ScanState {
    #[default]
    Start,
    ExpectKey,
    InKey,
    AfterKey,
    Value,
    Done,
    Broken,
}

#[derive(Default, PartialEq, Eq)]
enum ValueOf {
    #[default]
    Other,
    Id,
}

/// The longest `id` text kept; JSON-RPC ids are short numbers or strings.
const MAX_ID_BYTES: usize = 256;

impl IdScanner {
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.step(b);
        }
    }

    fn step(&mut self, b: u8) {
        let space = matches!(b, b' ' | b'\t' | b'\r' | b'\n');
        match self.state {
            ScanState::Done | ScanState::Broken => {}
            ScanState::Start => match b {
                b'{' => {
                    self.depth = 1;
                    self.state = ScanState::ExpectKey;
                }
                _ if space => {}
                _ => self.state = ScanState::Broken,
            },
            ScanState::ExpectKey => match b {
                b'"' => {
                    self.key.clear();
                    self.escaped = false;
                    self.state = ScanState::InKey;
                }
                b'}' => self.state = ScanState::Done,
                _ if space || b == b',' => {}
                _ => self.state = ScanState::Broken,
            },
            ScanState::InKey => {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.state = ScanState::AfterKey;
                    return;
                }
                if self.key.len() < 16 {
                    self.key.push(b);
                }
            }
            ScanState::AfterKey => match b {
                b':' => {
                    self.value_of = ValueOf::Other;
                    match self.key.as_slice() {
                        b"id" => {
                            self.value_of = ValueOf::Id;
                            self.id.clear();
                            self.id_complete = false;
                        }
                        b"method" => self.has_method = true,
                        _ => {}
                    }
                    self.in_string = false;
                    self.escaped = false;
                    self.state = ScanState::Value;
                }
                _ if space => {}
                _ => self.state = ScanState::Broken,
            },
            ScanState::Value => {
                if self.in_string {
                    if self.escaped {
                        self.escaped = false;
                    } else if b == b'\\' {
                        self.escaped = true;
                    } else if b == b'"' {
                        self.in_string = false;
                    }
                } else {
                    match b {
                        b'"' => self.in_string = true,
                        b'{' | b'[' => self.depth += 1,
                        b'}' | b']' if self.depth > 1 => self.depth -= 1,
                        b'}' if self.depth == 1 => {
                            self.end_value();
                            self.state = ScanState::Done;
                            return;
                        }
                        b',' if self.depth == 1 => {
                            self.end_value();
                            self.state = ScanState::ExpectKey;
                            return;
                        }
                        b']' => {
                            self.state = ScanState::Broken;
                            return;
                        }
                        _ => {}
                    }
                }
                if self.value_of == ValueOf::Id {
                    if self.id.len() < MAX_ID_BYTES {
                        self.id.push(b);
                    } else {
                        self.value_of = ValueOf::Other;
                        self.id.clear();
                    }
                }
            }
        }
    }

    fn end_value(&mut self) {
        if self.value_of == ValueOf::Id {
            self.id_complete = true;
        }
        self.value_of = ValueOf::Other;
    }

    /// The id of a response (a message with an `id` and no `method`), if it was seen whole.
    pub fn response_id(&self) -> Option<RequestId> {
        if self.has_method || !self.id_complete {
            return None;
        }
        match serde_json::from_slice::<Value>(&self.id).ok()? {
            id @ (Value::Number(_) | Value::String(_)) => serde_json::from_value(id).ok(),
            _ => None,
        }
    }
}

/// The Streamable HTTP client: the guarded reqwest client, and a response over the limit turns
/// into an error answer to the request it answered (rmcp would close the stream, or fail the
/// POST, leaving the cause unclear).
#[derive(Clone)]
struct LimitedHttp {
    inner: reqwest::Client,
    limit: usize,
}

type PostResult = Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>;

impl LimitedHttp {
    fn limits(&self) -> StreamableHttpResponseLimits {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = self.limit;
        limits.max_json_response_size = self.limit;
        limits
    }
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
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: std::collections::HashMap<http::HeaderName, http::HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> PostResult {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn id_of(message: &str) -> Option<RequestId> {
        let mut scanner = IdScanner::default();
        scanner.feed(message.as_bytes());
        scanner.response_id()
    }

    #[test]
    fn the_scanner_finds_top_level_ids_anywhere_in_a_response() {
        let number: Option<RequestId> = serde_json::from_value(serde_json::json!(7)).ok();
        let text: Option<RequestId> = serde_json::from_value(serde_json::json!("a,b}")).ok();
        assert_eq!(
            id_of(r#"{"jsonrpc":"2.0","id":7,"result":{"x":1}}"#),
            number
        );
        // After the result, with nested ids, strings with braces and escapes in the way.
        assert_eq!(
            id_of(
                r#"{"result":{"id":99,"t":"}\"{,[","a":[{"id":1}]}, "jsonrpc":"2.0" , "id" : 7 }"#
            ),
            number
        );
        assert_eq!(id_of(r#"{"id":"a,b}","result":{}}"#), text);
        // Requests and notifications from the server carry ids of their own numbering.
        assert_eq!(
            id_of(r#"{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage"}"#),
            None
        );
        assert_eq!(id_of(r#"{"method":"x","id":7}"#), None);
        // Cut off before the id was complete, or no object at all.
        assert_eq!(id_of(r#"{"result":"xxxx"#), None);
        assert_eq!(id_of(r#"{"id":12"#), None);
        assert_eq!(id_of("[1,2]"), None);
        assert_eq!(id_of(r#"{"id":{"no":1},"result":0}"#), None);
    }

    #[tokio::test]
    async fn the_line_guard_passes_small_lines_and_answers_big_ones() {
        use tokio::io::AsyncReadExt;
        let big = format!(
            "{{\"result\":{{\"text\":\"{}\"}},\"jsonrpc\":\"2.0\",\"id\":3}}\n",
            "x".repeat(100_000)
        );
        let input = format!("{{\"id\":1,\"result\":{{}}}}\n{big}{{\"id\":2,\"result\":{{}}}}\n");
        let mut guard = LineGuard::new(input.as_bytes(), 1000, "s".into());
        let mut out = String::new();
        guard.read_to_string(&mut out).await.unwrap();
        let lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(lines[0], r#"{"id":1,"result":{}}"#);
        // The cut-off fragment, which the JSON parser ignores, then the answer for id 3.
        assert!(lines[1].len() <= 1000 && serde_json::from_str::<Value>(lines[1]).is_err());
        let answer: Value = serde_json::from_str(lines[2]).unwrap();
        assert_eq!(answer["id"], 3);
        assert_eq!(answer["error"]["code"], OVERSIZED_CODE);
        assert_eq!(answer["error"]["data"]["limit"], 1000);
        assert_eq!(lines[3], r#"{"id":2,"result":{}}"#);
        assert_eq!(lines.len(), 4);
    }
}
