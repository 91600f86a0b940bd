//! Loading the shadow candidate and keeping it current: the file named by the served catalog's
//! `shadow_catalog` is read at start, whenever the served catalog is reloaded, when MCP servers
//! list their tools, and every `server.reload_interval` when its content (or a file it
//! references) changed — an unchanged one is not parsed again (see [`CatalogWatch`]). A
//! candidate that does not load is refused loudly — an error log, the
//! `toolgate_shadow_catalog_loads_total{result="refused"}` counter, the loader's status — and the
//! previous candidate, if any, keeps being compared; the served catalog is never affected.
//!
//! The candidate is a complete catalog file, validated like one. Only what decides calls is
//! compared (tools, tenants, agents, policy, approvals' risk levels, bindings); the served
//! catalog's limits, identity, audit and MCP servers stay in force, and MCP tools resolve against
//! the servers the sidecar runs.

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::sync::watch;

use super::{Candidate, LoadStatus, Shadow};
use crate::{
    catalog::{Catalog, Discovered, McpSource},
    config::Config,
    settings::CatalogWatch,
    settings::{Env, catalog_dir},
};

/// What the loader needs besides the shadow it loads for.
pub struct Loader {
    pub env: Env,
    pub poll_interval: Duration,
    /// The MCP servers the sidecar runs (the candidate's MCP tools resolve against them).
    pub mcp_servers: Vec<McpSource>,
    pub discovered: watch::Receiver<Discovered>,
}

/// Runs until the server stops.
pub async fn watch(shadow: Arc<Shadow>, mut loader: Loader) {
    let mut path = shadow.path.subscribe();
    let mut poll = tokio::time::interval(loader.poll_interval);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    poll.tick().await;
    let mut discoveries_open = true;
    // The fingerprint of the last content tried, good or bad.
    let mut tried: Option<(PathBuf, [u8; 32])> = None;
    // What the last poll saw, so that an unchanged candidate is not parsed again.
    let mut watched = CatalogWatch::default();
    let mut forced = true;
    loop {
        let current = path.borrow_and_update().clone();
        match current {
            None => {
                if shadow.candidate.swap(None).is_some() {
                    tracing::info!("shadow catalog off");
                    shadow.metrics.revision(None);
                    shadow.status.send_modify(|s| {
                        s.revision = None;
                        s.error = None;
                    });
                }
                tried = None;
            }
            Some(file) => {
                let discovered = loader.discovered.borrow().clone();
                let polled = look(&shadow, file.clone(), watched).await;
                watched = polled.1;
                load(
                    &shadow,
                    &loader,
                    file,
                    polled.0,
                    &discovered,
                    &mut tried,
                    forced,
                )
                .await;
            }
        }
        forced = tokio::select! {
            changed = path.changed() => {
                if changed.is_err() {
                    return;
                }
                true
            }
            changed = loader.discovered.changed(), if discoveries_open => {
                discoveries_open = changed.is_ok();
                true
            }
            _ = poll.tick() => false,
        };
    }
}

/// Looks at the candidate file off the async workers: its fingerprint (`None` when it cannot be
/// read), parsing it only when its text changed. Counts the poll, and the parse if any.
async fn look(
    shadow: &Shadow,
    file: PathBuf,
    mut watched: CatalogWatch,
) -> (Option<[u8; 32]>, CatalogWatch) {
    let (polled, watched) = tokio::task::spawn_blocking(move || {
        let polled = watched.poll(&file, &catalog_dir(&file));
        (polled, watched)
    })
    .await
    // A poll that panicked (it should not) starts over: the next one reads and parses anew.
    .unwrap_or_else(|_| (None, CatalogWatch::default()));
    let parsed = polled.is_some_and(|p| p.parsed);
    if parsed {
        shadow.metrics.parse();
    }
    shadow.status.send_modify(|s| {
        s.polls += 1;
        s.parses += u64::from(parsed);
    });
    (polled.map(|p| p.fingerprint), watched)
}

/// Loads the candidate if it changed since it was last tried (always when `forced`).
async fn load(
    shadow: &Shadow,
    loader: &Loader,
    file: PathBuf,
    fingerprint: Option<[u8; 32]>,
    discovered: &Discovered,
    tried: &mut Option<(PathBuf, [u8; 32])>,
    forced: bool,
) {
    let fingerprint = fingerprint.unwrap_or([0; 32]);
    if !forced && tried.as_ref() == Some(&(file.clone(), fingerprint)) {
        return;
    }
    *tried = Some((file.clone(), fingerprint));
    shadow.metrics.parse();
    shadow.status.send_modify(|s| s.parses += 1);
    let built = {
        let file = file.clone();
        let env = loader.env.clone();
        let servers = loader.mcp_servers.clone();
        let discovered = discovered.clone();
        tokio::task::spawn_blocking(move || build(&file, &env, servers, &discovered))
            .await
            .unwrap_or_else(|err| Err(format!("loading the shadow catalog failed: {err}")))
    };
    match built {
        Ok(catalog) => {
            let revision = crate::canonical::lower_hex(&fingerprint[..16]);
            tracing::info!(file = %file.display(), revision = %revision, "shadow catalog loaded: calls are also explained against it");
            shadow.candidate.store(Some(Arc::new(Candidate {
                catalog,
                path: file,
                revision: revision.clone(),
            })));
            shadow.metrics.load("ok");
            shadow.metrics.revision(Some(&revision));
            shadow.status.send_modify(|s| {
                s.attempts += 1;
                s.revision = Some(revision);
                s.error = None;
            });
        }
        Err(error) => {
            let keeping = shadow.candidate().map(|c| c.revision.clone());
            tracing::error!(file = %file.display(), error = %error, keeping = keeping.as_deref().unwrap_or("none"), "shadow catalog refused; the served catalog is not affected, and the previous candidate (if any) is still compared");
            shadow.metrics.load("refused");
            shadow.status.send_modify(|s| {
                s.attempts += 1;
                s.error = Some(error);
            });
        }
    }
}

/// Reads and validates a candidate file, its MCP tools resolved against the running servers.
fn build(
    file: &std::path::Path,
    env: &Env,
    mcp_servers: Vec<McpSource>,
    discovered: &Discovered,
) -> Result<Catalog, String> {
    let config = Config::load_file(file, env).map_err(|err| err.to_string())?;
    let mut inputs = config.catalog_inputs;
    inputs.mcp_servers = mcp_servers;
    inputs
        .build(discovered)
        .map_err(|err| format!("{}: {}: {}", file.display(), err.path, err.message))
}

impl LoadStatus {
    /// Whether a load has been tried since `attempts`.
    pub fn since(&self, attempts: u64) -> bool {
        self.attempts > attempts
    }
}
