//! Pinned MCP tools at each catalog swap: a tool whose server now lists another definition than
//! its pin (withdrawn by the catalog, or kept with `on_definition_change: warn`), or its pinned
//! one again, is audited (`tool_definition_changed`), counted and logged — once per change, not
//! at every rebuild. How each tool was last listed is remembered across its server's
//! disconnects, so a server that restarts with another definition is named as changed.

use std::{collections::BTreeMap, sync::Mutex};

use crate::{
    audit::{AuditEvent, AuditLog, DefinitionChange, EventKind, EventTime},
    catalog::{
        Catalog,
        pins::{self, Outcome, PinnedTool},
    },
    clock::SharedClock,
};

use super::metrics::BoundaryMetrics;

/// How each pinned tool was last listed, by catalog name.
#[derive(Debug, Default)]
pub(super) struct PinWatch {
    seen: Mutex<BTreeMap<String, PinnedTool>>,
}

impl PinWatch {
    /// Records what a swap to `next` changes for pinned tools.
    pub(super) async fn swapped(
        &self,
        next: &Catalog,
        audit: &AuditLog,
        metrics: &BoundaryMetrics,
        clock: &SharedClock,
    ) {
        let events: Vec<Box<AuditEvent>> = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            let events = pins::changes(&seen, next.pinned())
                .into_iter()
                .map(|change| {
                    let now = change.now;
                    let record = DefinitionChange {
                        server: now.server.clone(),
                        server_tool: now.tool.clone(),
                        pinned_sha256: now.pin.clone(),
                        listed_sha256: now.listed.pin.clone(),
                        previous_sha256: change.before.map(|b| b.listed.pin.clone()),
                        changed: change.changed(),
                    };
                    log(change.name, change.outcome, &record);
                    metrics.definition_change(&now.server, change.name, change.outcome);
                    Box::new(AuditEvent {
                        time: EventTime(clock.unix_ms()),
                        kind: Some(EventKind::ToolDefinitionChanged),
                        tool: change.name.into(),
                        status: change.outcome.as_str(),
                        definition_change: Some(Box::new(record)),
                        ..AuditEvent::default()
                    })
                })
                .collect();
            for (name, tool) in next.pinned() {
                seen.insert(name.clone(), tool.clone());
            }
            // Bounded by the catalog: tools it no longer configures are forgotten.
            seen.retain(|name, _| next.contains(name));
            events
        };
        for event in events {
            audit.record(event).await;
        }
    }
}

fn log(tool: &str, outcome: Outcome, record: &DefinitionChange) {
    let changed = record.changed.as_ref().map(|parts| parts.join(","));
    let changed = changed
        .as_deref()
        .unwrap_or("unknown (not listed to this sidecar before)");
    let (server, pinned, listed) = (&record.server, &record.pinned_sha256, &record.listed_sha256);
    match outcome {
        Outcome::Withdrawn => tracing::error!(
            tool,
            server,
            pinned,
            listed,
            changed,
            "MCP tool withdrawn: its server lists a definition other than its pin; review the change, then update the pin (toolgate pin) or restore the server's definition"
        ),
        Outcome::Kept => tracing::warn!(
            tool,
            server,
            pinned,
            listed,
            changed,
            "MCP tool kept although its server lists a definition other than its pin (on_definition_change: warn)"
        ),
        Outcome::Restored => tracing::info!(
            tool,
            server,
            pinned,
            listed,
            "MCP tool served again: its server lists its pinned definition"
        ),
    }
}
