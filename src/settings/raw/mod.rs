//! The catalog file exactly as written: serde structs that refuse unknown fields. Nothing here is
//! validated beyond its shape; `config::load` turns these into typed values.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

mod access;
mod audit;
mod backends;
mod budgets;
mod flow;
mod identity;
mod limits;
mod output_guard;
mod server;
mod state;
mod telemetry;
mod tools;

pub use access::*;
pub use audit::*;
pub use backends::*;
pub use budgets::*;
pub use flow::*;
pub use identity::*;
pub use limits::*;
pub use output_guard::*;
pub use server::*;
pub use state::*;
pub use telemetry::*;
pub use tools::*;

/// A toolgate catalog file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// Format version of this file; must be 1.
    pub version: u32,
    /// Listen addresses and shutdown behaviour.
    #[serde(default)]
    pub server: RawServer,
    /// How callers are identified.
    #[serde(default)]
    pub identity: RawIdentity,
    /// Request size limits and concurrency caps.
    #[serde(default)]
    pub limits: RawLimits,
    /// Which calls need an approval and how long approvals live.
    #[serde(default)]
    pub approvals: RawApprovals,
    /// Where audit events go.
    #[serde(default)]
    pub audit: RawAudit,
    /// Where rate limits, approvals and idempotency results live: this sidecar's memory (the
    /// default) or a Redis shared by every replica. Changes take effect on restart.
    pub state: Option<RawState>,
    /// Allow/deny lists applied to every caller.
    #[serde(default)]
    pub policy: RawAccessList,
    /// The tenants that may call; a tenant not listed here is refused.
    #[serde(default)]
    pub tenants: BTreeMap<String, RawTenant>,
    /// Agents whose tool lists are narrowed further, by exact (case-sensitive) name. Once any
    /// agent is listed, a caller whose agent is not listed — including a caller that names no
    /// agent — gets the `"*"` entry, or nothing at all when there is no `"*"` entry.
    #[serde(default)]
    pub agents: BTreeMap<String, RawAccessList>,
    /// HTTP upstreams that `http` tools call, by name. The model never supplies a URL.
    #[serde(default)]
    pub upstreams: BTreeMap<String, RawUpstream>,
    /// MCP servers whose tools enter the catalog, by name.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, RawMcpServer>,
    /// Trace export; the standard OTEL_* environment variables fill in what is not set here.
    pub telemetry: Option<RawTelemetry>,
    /// What tool output may carry back to the model: the catalog's detectors (secrets,
    /// personal data, its own patterns) and what each does. Without it, every secret detector
    /// redacts. A tool's own `output_guard` overrides it.
    pub output_guard: Option<RawOutputGuard>,
    /// Run-level information-flow rules: which labels the tools that ran in a run (or for a
    /// caller, over a window) carried, and which tools may not run, or need approval, after
    /// them (e.g. no `external_send` after `private_data` and `untrusted_content`).
    pub flow: Option<RawFlow>,
    /// Budgets for a whole run (calls, cost, calls of one tool, wall time) and for a caller
    /// over a day: exhausted, a call is refused `run_budget_exhausted` (docs/handoff.md).
    pub budgets: Option<RawBudgets>,
    /// The tools, one entry per (name, version).
    #[serde(default)]
    pub tools: Vec<RawTool>,
    /// A candidate catalog file (relative to this one) that every call is also explained
    /// against, off the response path: decisions that differ are audited as `shadow_decision`
    /// events. Reloaded like this file; a broken candidate is refused without affecting this
    /// catalog. A candidate's own `shadow_catalog` is ignored.
    pub shadow_catalog: Option<String>,
}

impl RawConfig {
    /// The files this catalog reads besides itself (JWT keys, header values), relative paths
    /// resolved against `base_dir`. Reloads watch them: Kubernetes updates a Secret and a
    /// ConfigMap at different times.
    pub fn referenced_files(&self, base_dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut files = Vec::new();
        for jwt in &self.identity.jwt {
            files.extend(jwt.hs256_secret_file.iter().cloned());
            files.extend(jwt.public_key_files.iter().cloned());
            files.extend(jwt.jwks_file.iter().cloned());
        }
        for upstream in self.upstreams.values() {
            files.extend(upstream.headers.values().filter_map(|h| h.file.clone()));
        }
        // An upstream's client secret or key rotated is a reload. (Actor tokens are read at each
        // exchange; MCP servers' settings, theirs included, take a restart.)
        let grants = self
            .upstreams
            .values()
            .filter_map(|u| u.credentials.as_ref())
            .flat_map(|c| [&c.token_exchange, &c.client_credentials])
            .flatten();
        for grant in grants {
            files.extend(grant.client_secret_file.iter().cloned());
            files.extend(grant.client_key_file.iter().cloned());
        }
        let mut files: Vec<_> = files
            .iter()
            .map(|f| super::resolve_path(base_dir, f))
            .collect();
        files.sort();
        files.dedup();
        files
    }
}
