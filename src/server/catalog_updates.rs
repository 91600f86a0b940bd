//! Keeps the served catalog current. One task owns what the catalog is built from and rebuilds it
//! when:
//! - MCP servers list (or change) their tools;
//! - the catalog file's content changes — polled by content hash, so an in-place edit, a rename
//!   and Kubernetes' ConfigMap symlink swap (`..data`) are all seen;
//! - a reload is asked for (SIGHUP, or [`super::Running::reload`]).
//!
//! A valid new catalog replaces the old one without disturbing calls in flight (they finish on the
//! definition they started with); rate-limit state carries over for unchanged quotas, and open
//! approvals of tools whose definition changed become invalid. An invalid file is refused with a
//! logged error and the old catalog keeps serving. Settings outside the catalog (listen
//! addresses, identity, limits, audit, the set of MCP servers) take effect on restart.

use std::{path::PathBuf, sync::Arc, time::Duration};

use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot, watch};

use crate::{
    boundary::Boundary,
    catalog::CatalogInputs,
    config::{Config, Env},
    executor::mcp::Discovered,
};

/// A reload request and where to send its outcome: the new revision, or why it was refused.
pub type ReloadRequest = oneshot::Sender<Result<String, String>>;

/// What the updater needs to re-read the catalog file.
pub struct Source {
    pub path: PathBuf,
    pub env: Env,
    pub poll_interval: Duration,
    /// Hash of the content the served catalog was built from.
    pub loaded_sha256: Option<[u8; 32]>,
}

/// Runs until the server shuts down.
pub async fn run(
    boundary: Arc<Boundary>,
    mut inputs: CatalogInputs,
    source: Option<Source>,
    mut discovered: watch::Receiver<Discovered>,
    mut requests: mpsc::Receiver<ReloadRequest>,
) {
    let mut last_hash = source.as_ref().and_then(|s| s.loaded_sha256);
    let poll_every = source
        .as_ref()
        .map_or(Duration::from_secs(3600), |s| s.poll_interval);
    let mut poll = tokio::time::interval(poll_every);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    poll.tick().await;
    let mut discoveries_open = true;
    loop {
        tokio::select! {
            changed = discovered.changed(), if discoveries_open => {
                if changed.is_err() {
                    discoveries_open = false;
                    continue;
                }
                let snapshot = discovered.borrow_and_update().clone();
                apply(&boundary, &inputs, &snapshot, "MCP servers");
            }
            request = requests.recv() => {
                let Some(reply) = request else { return };
                let snapshot = discovered.borrow().clone();
                let outcome = match &source {
                    Some(source) => reload(&boundary, &mut inputs, source, &snapshot, &mut last_hash, true).await,
                    None => Err("this sidecar serves the embedded demo catalog; there is no file to reload".to_owned()),
                };
                let _ = reply.send(outcome);
            }
            _ = poll.tick(), if source.is_some() => {
                if let Some(source) = &source {
                    let snapshot = discovered.borrow().clone();
                    let _ = reload(&boundary, &mut inputs, source, &snapshot, &mut last_hash, false).await;
                }
            }
        }
    }
}

/// Re-reads the file; unless forced, only when its content changed.
async fn reload(
    boundary: &Boundary,
    inputs: &mut CatalogInputs,
    source: &Source,
    discovered: &Discovered,
    last_hash: &mut Option<[u8; 32]>,
    forced: bool,
) -> Result<String, String> {
    let hash = file_hash(&source.path).await;
    if !forced && (hash.is_none() || hash == *last_hash) {
        return Ok(boundary.catalog().catalog.revision().to_owned());
    }
    *last_hash = hash;
    let path = source.path.clone();
    let env = source.env.clone();
    // Parsing and compiling schemas is CPU work: keep it off the async workers.
    let loaded = tokio::task::spawn_blocking(move || Config::load_file(&path, &env))
        .await
        .map_err(|err| format!("reload task failed: {err}"))?;
    let config = match loaded {
        Ok(config) => {
            // What was parsed, which may be newer than what was hashed a moment ago.
            *last_hash = config.file_sha256;
            config
        }
        Err(err) => {
            tracing::error!(error = %err, "catalog reload refused; the previous catalog keeps serving");
            boundary.metrics().reload(false);
            return Err(err.to_string());
        }
    };
    let mut next = config.catalog_inputs;
    // The MCP servers themselves were started with the process; keep their connection settings.
    next.mcp_servers = inputs.mcp_servers.clone();
    let revision = apply(boundary, &next, discovered, "catalog file");
    boundary.metrics().reload(revision.is_some());
    let revision = revision.ok_or_else(|| "catalog rebuild failed".to_owned())?;
    *inputs = next;
    Ok(revision)
}

/// Builds and swaps in a catalog; returns its revision.
fn apply(
    boundary: &Boundary,
    inputs: &CatalogInputs,
    discovered: &Discovered,
    cause: &'static str,
) -> Option<String> {
    match inputs.build(discovered) {
        Ok(catalog) => {
            let revision = catalog.revision().to_owned();
            let previous = boundary.catalog().catalog.revision().to_owned();
            let invalidated = boundary.replace_catalog(catalog);
            tracing::info!(cause, revision = %revision, previous = %previous, approvals_invalidated = invalidated, "catalog updated");
            Some(revision)
        }
        Err(err) => {
            tracing::error!(cause, path = %err.path, error = %err.message, "catalog rebuild failed; keeping the current one");
            None
        }
    }
}

async fn file_hash(path: &std::path::Path) -> Option<[u8; 32]> {
    // Reading through the path follows a swapped symlink to the new content.
    let bytes = tokio::fs::read(path).await.ok()?;
    Some(Sha256::digest(&bytes).into())
}
