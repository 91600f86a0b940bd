//! The shape of a `tool_definition_changed` event's record: a pinned MCP tool that its server
//! now lists with another definition than its pin, or again with the pinned one. The catalog
//! swap fills it (`Boundary::replace_catalog`); the audit log owns its shape.

use serde::Serialize;

/// What changed, in a `tool_definition_changed` event. The event's `tool` is the catalog's
/// name; its `status` says what was done: `WITHDRAWN`, `KEPT` (`on_definition_change: warn`)
/// or `RESTORED` (the server lists the pinned definition again).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DefinitionChange {
    pub server: String,
    /// The server's name for the tool.
    pub server_tool: String,
    /// The pin in the catalog: the definition reviewed.
    pub pinned_sha256: String,
    /// What the server lists now.
    pub listed_sha256: String,
    /// What it listed before, when this sidecar saw it list the tool before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_sha256: Option<String>,
    /// The parts (`name`, `description`, `input_schema`, `output_schema`, `annotations`) that
    /// differ from what it listed before; absent when this sidecar did not see it before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed: Option<Vec<&'static str>>,
}
