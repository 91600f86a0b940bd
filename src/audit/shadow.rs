//! The shape of a `shadow_decision` event's record: what differs between the served catalog's
//! decision of a call and the shadow candidate's. The shadow worker (`crate::shadow`) fills it;
//! the audit log owns its shape, so the audit floor names nothing above it.

use serde::Serialize;

/// What differs and what the candidate would have decided, in a `shadow_decision` event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShadowRecord {
    /// `status`, `refused_by`, `tool_version`, `bound_arguments`: what differs.
    pub differences: Vec<&'static str>,
    /// True when the served catalog's call reached its backend (its status is then the
    /// backend's outcome; the candidate is compared with "would call the backend").
    pub reached_backend: bool,
    /// The served catalog's revision.
    pub catalog_revision: String,
    /// The candidate's decision.
    pub candidate: CandidateDecision,
}

/// The candidate's decision of one call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateDecision {
    /// The status ExecuteTool would return under the candidate (`OK`: the backend would be
    /// called).
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused_by: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Where the access rule that decided is defined, e.g. `tenants.globex.deny[1]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule_pattern: Option<String>,
    pub tool_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments_sha256: Option<String>,
    /// The paths the candidate binds (values are not recorded).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bound_arguments: Vec<String>,
    /// Which candidate file decided: a hash of its content.
    pub revision: String,
}
