//! The `mcp` backend: tools from allow-listed MCP servers (a stdio command or a Streamable HTTP
//! URL), through the rmcp client.
//!
//! One supervisor task per server connects, lists the server's tools, publishes the ones the
//! catalog names (the catalog then rebuilds with their schemas), re-lists on
//! `notifications/tools/list_changed`, and reconnects with backoff when the server goes away. A
//! server that is down makes its tools answer UNAVAILABLE quickly; it never takes the sidecar
//! down. An MCP server's own description is never taken as authorization: risk level, scopes,
//! limits and bindings come from the catalog.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

use futures::{FutureExt, future::BoxFuture};
use rmcp::{
    ClientHandler, RoleClient, ServiceExt,
    model::CallToolRequestParams,
    service::{NotificationContext, Peer},
    transport::{StreamableHttpClientTransport, TokioChildProcess},
};
use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    sync::{Notify, watch},
    task::JoinHandle,
};

use super::{ExecError, Executor};
use crate::{
    boundary::Permit,
    config::{Env, FieldError, parse_duration, raw::RawMcpServer},
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

/// Server name -> the tools it offers that the catalog names; absent when never listed.
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
        url: String,
    },
}

/// A validated MCP server entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServerConfig {
    pub name: String,
    pub transport: Transport,
    pub prefix: String,
    pub startup_timeout: Duration,
    /// The server-side names of the tools the catalog exposes.
    pub tools: BTreeSet<String>,
}

impl McpServerConfig {
    pub fn build(name: &str, raw: &RawMcpServer, env: &Env) -> Result<Self, FieldError> {
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
                Transport::Stdio {
                    program: PathBuf::from(program),
                    args: args.to_vec(),
                    env: program_env,
                }
            }
            (None, Some(url)) => {
                let parsed = url::Url::parse(url).map_err(|err| {
                    FieldError::new(at("url"), format!("invalid URL {url:?}: {err}"))
                })?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(FieldError::new(at("url"), "must be an http or https URL"));
                }
                Transport::Http { url: url.clone() }
            }
            _ => {
                return Err(FieldError::new(
                    format!("mcp_servers.{name}"),
                    "set exactly one of command (stdio) or url (Streamable HTTP)",
                ));
            }
        };
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
        Ok(McpServerConfig {
            name: name.to_owned(),
            transport,
            prefix,
            startup_timeout,
            tools: raw.tools.keys().cloned().collect(),
        })
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

/// Reconnect delays grow from the first to the last.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

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
            .map_err(|err| {
                tracing::warn!(server = %tool.server, tool = %tool.tool, error = %err, "MCP call failed");
                ExecError::Unavailable(format!("MCP server {} did not answer the call", tool.server))
            })?;
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
            Ok(Ok(service)) => {
                let peer = service.peer().clone();
                match list(&config, &peer).await {
                    Ok(tools) => {
                        tracing::info!(server = %config.name, tools = tools.len(), "MCP server connected");
                        publish(&discovered, &config.name, tools);
                        backoff = BACKOFF_FIRST;
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
                set(&slot.peer, None);
                set(&slot.pid, None);
                tracing::warn!(server = %config.name, retry_in_ms = backoff.as_millis() as u64, "MCP server disconnected; reconnecting");
            }
            Ok(Err(err)) => {
                tracing::warn!(server = %config.name, error = %err, retry_in_ms = backoff.as_millis() as u64, "cannot connect to MCP server")
            }
            Err(_) => {
                tracing::warn!(server = %config.name, retry_in_ms = backoff.as_millis() as u64, "MCP server did not start in time")
            }
        }
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

async fn connect(
    config: &McpServerConfig,
    slot: &Slot,
    handler: ListChanged,
) -> Result<Service, String> {
    match &config.transport {
        Transport::Stdio { program, args, env } => {
            let mut command = tokio::process::Command::new(program);
            command.args(args).env_clear().envs(env).kill_on_drop(true);
            let (transport, stderr) = TokioChildProcess::builder(command)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|err| format!("cannot start {}: {err}", program.display()))?;
            set(&slot.pid, transport.id());
            if let Some(stderr) = stderr {
                // Keep the pipe drained; the server's own log lines are debug output here.
                let server = config.name.clone();
                tokio::spawn(async move {
                    let mut lines = BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        tracing::debug!(server = %server, line = %line, "MCP server stderr");
                    }
                });
            }
            handler
                .serve(transport)
                .await
                .map_err(|err| err.to_string())
        }
        Transport::Http { url } => {
            let transport = StreamableHttpClientTransport::from_uri(url.clone());
            handler
                .serve(transport)
                .await
                .map_err(|err| err.to_string())
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
