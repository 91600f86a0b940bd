//! Keeps the served catalog current: when MCP servers list (or change) their tools, the catalog is
//! rebuilt from the same inputs and swapped in. Calls already running keep the catalog they
//! started with.

use std::sync::Arc;

use tokio::sync::watch;

use crate::{boundary::Boundary, catalog::CatalogInputs, executor::mcp::Discovered};

/// Rebuilds the catalog on every change of the discovered MCP tools, until the watch closes.
pub async fn follow_discoveries(
    boundary: Arc<Boundary>,
    inputs: Arc<CatalogInputs>,
    mut discovered: watch::Receiver<Discovered>,
) {
    while discovered.changed().await.is_ok() {
        let snapshot = discovered.borrow_and_update().clone();
        match inputs.build(&snapshot) {
            Ok(catalog) => {
                let revision = catalog.revision().to_owned();
                let invalidated = boundary.replace_catalog(catalog);
                tracing::info!(revision = %revision, approvals_invalidated = invalidated, "catalog updated from MCP servers");
            }
            // Only configured tools can fail here, and they were valid at load: keep serving.
            Err(err) => {
                tracing::error!(path = %err.path, error = %err.message, "catalog rebuild failed; keeping the current one")
            }
        }
    }
}
