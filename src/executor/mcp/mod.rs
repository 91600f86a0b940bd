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
//! ends at once as `output_too_large` ([`LineGuard`] for stdio, `LimitedHttp` for Streamable
//! HTTP). Streamable HTTP goes through the same SSRF-guarded, proxy-ignoring client as the http
//! backend.
//!
//! This file holds the executor ([`McpManager`]) and the types the catalog sees; beside it:
//! `config` (validating `mcp_servers` entries), `supervisor` (each server's connect, list,
//! reconnect loop), `stdio` (a stdio server's process and its line framing), `scan` (the id
//! scanner the framing uses), `streamable_http` (the size-limited HTTP client) and `errors`
//! (how a failed call maps to an [`ExecError`]).

mod auth;
mod config;
mod errors;
mod scan;
mod stdio;
mod streamable_http;
mod supervisor;

use std::{
    collections::BTreeMap,
    sync::{Arc, RwLock},
};

use futures::{FutureExt, future::BoxFuture};
use rmcp::{RoleClient, model::CallToolRequestParams, service::Peer};
use serde_json::Value;
use tokio::sync::watch;

use super::{ExecError, Executor};
use crate::{
    boundary::Permit,
    catalog::{BackendSpec, Discovered, DiscoveredTool, McpTarget},
    clock::SharedClock,
    tasks::Tasks,
};
use auth::McpAuth;
pub use config::{DEFAULT_MAX_MESSAGE_BYTES, McpServerConfig, Transport};
pub use scan::IdScanner;
pub use stdio::LineGuard;

/// One server's live connection, shared with executions.
#[derive(Default)]
struct Slot {
    peer: RwLock<Option<Peer<RoleClient>>>,
    pid: RwLock<Option<u32>>,
    /// Per-call credentials, kept across reconnects (with the tokens they were issued).
    auth: Option<McpAuth>,
    /// Set when the server's credentials are configured and could not be set up: it is not
    /// connected to.
    auth_failed: Option<String>,
}

/// The tokens one MCP server's credentials keep, in bytes.
const CREDENTIAL_CACHE_BYTES: usize = 4 * 1024 * 1024;

/// Connections to every configured MCP server.
pub struct McpManager {
    slots: BTreeMap<String, Arc<Slot>>,
    discovered: watch::Sender<Discovered>,
    /// The supervisors and what they started (a stdio server's stderr reader).
    tasks: Tasks,
    /// Calls sent to MCP servers and not answered yet.
    in_flight: watch::Sender<u64>,
}

impl Default for McpManager {
    fn default() -> Self {
        Self::start(&[], &SharedClock::default())
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
    /// Starts a supervisor per server; tools appear as servers come up. Issued credentials'
    /// lifetimes are read on `clock`.
    pub fn start(servers: &[McpServerConfig], clock: &SharedClock) -> Self {
        let (discovered, _) = watch::channel(Discovered::new());
        let mut slots = BTreeMap::new();
        let tasks = Tasks::new();
        for config in servers {
            let mut slot = Slot::default();
            if let Some(spec) = &config.credentials {
                match McpAuth::new(&config.name, spec, clock, CREDENTIAL_CACHE_BYTES) {
                    Ok(auth) => slot.auth = Some(auth),
                    Err(err) => {
                        tracing::error!(server = %config.name, error = %err, "cannot set up the MCP server's credentials; its calls are refused");
                        slot.auth_failed = Some(err);
                    }
                }
            }
            let slot = Arc::new(slot);
            slots.insert(config.name.clone(), slot.clone());
            tasks.spawn(
                "mcp-supervisor",
                supervisor::supervise(config.clone(), slot, discovered.clone(), tasks.clone()),
            );
        }
        McpManager {
            slots,
            discovered,
            tasks,
            in_flight: watch::channel(0).0,
        }
    }

    /// Watches the number of calls sent to MCP servers and not answered yet.
    pub fn watch_in_flight(&self) -> watch::Receiver<u64> {
        self.in_flight.subscribe()
    }

    /// Tells every supervisor to stop; dropping their connections ends stdio servers'
    /// processes. [`Self::stopped`] waits for them.
    pub fn stop(&self) {
        self.tasks.cancel();
        for slot in self.slots.values() {
            set(&slot.peer, None);
        }
    }

    /// Stops every supervisor and waits, up to `within`, until each has ended its server's
    /// connection (and process); whether they all did.
    pub async fn stopped(&self, within: std::time::Duration) -> bool {
        self.stop();
        self.tasks.stop(within).await
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

    /// The kind and audience of the credential each call to `server` is made with, if any
    /// (for explain).
    pub fn credential(&self, server: &str) -> Option<(&'static str, Option<&str>)> {
        let spec = self.slots.get(server)?.auth.as_ref()?.calls.spec();
        Some((spec.kind(), spec.audience()))
    }

    /// Whether a server is connected now.
    pub fn connected(&self, server: &str) -> bool {
        self.slots
            .get(server)
            .is_some_and(|s| s.peer.read().is_ok_and(|p| p.is_some()))
    }

    async fn run(&self, tool: &McpTarget, permit: &Permit) -> Result<String, ExecError> {
        let not_connected = || {
            ExecError::NotReached(format!(
                "MCP server {} is not connected; retry later",
                tool.server
            ))
        };
        let slot = self.slots.get(&tool.server).ok_or_else(not_connected)?;
        let peer = slot
            .peer
            .read()
            .ok()
            .and_then(|p| p.clone())
            .ok_or_else(not_connected)?;
        // The caller's credential for this server, before anything is sent: without one, the
        // server is not called.
        authenticate_on(slot, permit).await?;
        let credential = slot.auth.as_ref().zip(permit.issued_credential());
        let arguments = permit.arguments().as_object().cloned().unwrap_or_default();
        let _in_flight = InFlight::enter(&self.in_flight);
        // Dropping this future (deadline, client cancel) cancels the request on the server.
        let mut params = CallToolRequestParams::new(tool.tool.clone()).with_arguments(arguments);
        let mut meta = serde_json::Map::new();
        // The W3C trace context travels in the request's _meta, as MCP's tracing convention has it.
        if let Some(traceparent) = permit.traceparent() {
            meta.insert("traceparent".into(), Value::from(traceparent));
        }
        let _token = credential.map(|(auth, credential)| auth.attach(credential, &mut meta));
        if !meta.is_empty() {
            params.meta = Some(meta.into());
        }
        let result = peer
            .call_tool(params)
            .await
            .map_err(|err| errors::call_error(&tool.server, &tool.tool, err))?;
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

/// Fetches the caller's credential for a server onto the permit, unless it has one.
async fn authenticate_on(slot: &Slot, permit: &Permit) -> Result<(), ExecError> {
    if let (Some(auth), None) = (&slot.auth, permit.issued_credential()) {
        permit.record_credential(auth.calls.for_call(permit.caller()).await?);
    }
    Ok(())
}

impl Executor for McpManager {
    fn authenticate<'a>(
        &'a self,
        permit: &'a Permit,
    ) -> Option<BoxFuture<'a, Result<(), ExecError>>> {
        let BackendSpec::Mcp(tool) = &permit.tool().backend else {
            return None;
        };
        let slot = self.slots.get(&tool.server)?;
        slot.auth.as_ref()?;
        Some(authenticate_on(slot, permit).boxed())
    }

    fn execute<'a>(&'a self, permit: &'a Permit) -> BoxFuture<'a, Result<String, ExecError>> {
        async move {
            match &permit.tool().backend {
                BackendSpec::Mcp(tool) => self.run(tool, permit).await,
                _ => Err(ExecError::failed("not an MCP tool")),
            }
        }
        .boxed()
    }
}

fn set<T>(lock: &RwLock<Option<T>>, value: Option<T>) {
    match lock.write() {
        Ok(mut guard) => *guard = value,
        Err(poisoned) => *poisoned.into_inner() = value,
    }
}
