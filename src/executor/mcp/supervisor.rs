//! Each server's supervisor: connect (over stdio or Streamable HTTP) within the start-up
//! timeout, list the server's tools and publish the ones the catalog names, re-list when the
//! server says its list changed, and when the connection ends withdraw its tools and reconnect
//! with backoff.

use std::{sync::Arc, time::Duration};

use rmcp::{
    ClientHandler, RoleClient,
    model::PaginatedRequestParams,
    service::{NotificationContext, Peer},
};
use serde_json::Value;
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};

use crate::tasks::Tasks;

use super::{
    Discovered, DiscoveredTool, McpServerConfig, Slot, Transport, set, stdio, streamable_http,
};

/// Connecting the same server this long is a success: the restart backoff starts over.
const STABLE_AFTER: Duration = Duration::from_secs(10);

/// Wakes the supervisor when the server says its tool list changed.
#[derive(Clone)]
pub(super) struct ListChanged(Arc<Notify>);

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

/// Most pages one listing of a server's tools reads.
pub const MAX_LIST_PAGES: usize = 64;
/// Most tools one listing reads (named in the catalog or not).
pub const MAX_LIST_TOOLS: usize = 10_000;
/// Most bytes of tool definitions one listing reads, as JSON.
pub const MAX_LIST_BYTES: usize = 16 << 20;
/// Least time between two listings of one server: a server that keeps saying its list changed
/// is listed at most this often.
pub const MIN_RELIST_INTERVAL: Duration = Duration::from_secs(1);

pub(super) async fn supervise(
    config: McpServerConfig,
    slot: Arc<Slot>,
    discovered: watch::Sender<Discovered>,
    tasks: Tasks,
) {
    let mut backoff = BACKOFF_FIRST;
    loop {
        let changed = Arc::new(Notify::new());
        match tokio::time::timeout(
            config.startup_timeout,
            connect(&config, &slot, ListChanged(changed.clone()), &tasks),
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
                let mut listed_at = Instant::now();
                loop {
                    tokio::select! {
                        _ = &mut ended => break,
                        _ = changed.notified() => {
                            // Notices coalesce while this waits: one listing answers them all.
                            tokio::select! {
                                _ = &mut ended => break,
                                () = tokio::time::sleep_until(listed_at + MIN_RELIST_INTERVAL) => {}
                            }
                            listed_at = Instant::now();
                            match list(&config, &peer).await {
                                Ok(tools) => {
                                    tracing::info!(server = %config.name, tools = tools.len(), "MCP tool list changed");
                                    publish(&discovered, &config.name, tools);
                                }
                                Err(err) => tracing::warn!(server = %config.name, error = %err, "MCP server did not list its tools"),
                            }
                        }
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

pub(super) type Service = rmcp::service::RunningService<RoleClient, ListChanged>;

/// A live connection, and for stdio the server's process, ended (with what it started) when
/// this is dropped.
pub(super) struct Connection {
    pub(super) service: Service,
    pub(super) _process: Option<stdio::StdioProcess>,
}

async fn connect(
    config: &McpServerConfig,
    slot: &Slot,
    handler: ListChanged,
    tasks: &Tasks,
) -> Result<Connection, String> {
    match &config.transport {
        Transport::Stdio { program, args, env } => {
            stdio::connect(config, program, args, env, slot, handler, tasks).await
        }
        Transport::Http {
            url, destination, ..
        } => {
            if let Some(why) = &slot.auth_failed {
                return Err(format!("its credentials could not be set up: {why}"));
            }
            streamable_http::connect(config, url, destination, slot.auth.clone(), handler).await
        }
    }
}

/// The server's tools the catalog names, read page by page within the bounds
/// ([`MAX_LIST_PAGES`], [`MAX_LIST_TOOLS`], [`MAX_LIST_BYTES`]) and the start-up timeout: only
/// what the catalog names is kept as it goes, so a server cannot make the sidecar hold more than
/// one page of what it sends. Over a bound, the listing fails, saying which.
async fn list(
    config: &McpServerConfig,
    peer: &Peer<RoleClient>,
) -> Result<Vec<DiscoveredTool>, String> {
    tokio::time::timeout(config.startup_timeout, list_pages(config, peer))
        .await
        .map_err(|_| "listing tools timed out".to_owned())?
}

async fn list_pages(
    config: &McpServerConfig,
    peer: &Peer<RoleClient>,
) -> Result<Vec<DiscoveredTool>, String> {
    let mut kept = Vec::new();
    let (mut tools, mut bytes) = (0, 0);
    let mut cursor = None;
    for _ in 0..MAX_LIST_PAGES {
        let page = peer
            .list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)))
            .await
            .map_err(|err| err.to_string())?;
        tools += page.tools.len();
        bytes += json_size(&page.tools);
        if tools > MAX_LIST_TOOLS {
            return Err(format!(
                "the server listed more than {MAX_LIST_TOOLS} tools; none of its tools are offered"
            ));
        }
        if bytes > MAX_LIST_BYTES {
            return Err(format!(
                "the server listed more than {} MiB of tool definitions; none of its tools are offered",
                MAX_LIST_BYTES >> 20
            ));
        }
        kept.extend(
            page.tools
                .into_iter()
                .filter(|t| config.tools.contains(t.name.as_ref()))
                .map(discovered),
        );
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(kept),
        }
    }
    Err(format!(
        "the server listed more than {MAX_LIST_PAGES} pages of tools; none of its tools are offered"
    ))
}

fn discovered(t: rmcp::model::Tool) -> DiscoveredTool {
    DiscoveredTool {
        name: t.name.to_string(),
        description: t.description.as_deref().unwrap_or("").to_owned(),
        input_schema: Value::Object((*t.input_schema).clone()),
        output_schema: t.output_schema.map(|o| Value::Object((*o).clone())),
        // Annotations are plain data; one that cannot be turned back into JSON is absent.
        annotations: t.annotations.and_then(|a| serde_json::to_value(a).ok()),
    }
}

/// The size of `value` as JSON, counted without writing it anywhere.
fn json_size<T: serde::Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter fails only for values JSON cannot hold, which a parsed page is not.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
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
