//! The boundary's metrics, registered when the boundary is built: every call it decides
//! (`toolgate_tool_calls_total{tool,status}`, `…_tool_call_duration_seconds{tool}`,
//! `…_refusals_total{stage,error_type}`, `…_rate_limited_total{tool}`, what the output guard
//! found, `…_output_guard_matches_total{tool,detector,action}`), pinned MCP tools' definition
//! changes (`…_tool_definition_changes_total{server,tool,status}`), the emergency denies in
//! force (`toolgate_emergency_denies`) and the catalog revision
//! it serves (`toolgate_catalog_revision_info{revision}`), which it alone
//! swaps.

use std::sync::{Arc, Mutex};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
};

use crate::{
    error::Status,
    metrics::{Metrics, UNKNOWN_TOOL},
    outcome::CallOutcome,
    output_guard::Finding,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: Arc<str>,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    stage: &'static str,
    error_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GuardLabels {
    tool: Arc<str>,
    detector: Arc<str>,
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DefinitionLabels {
    server: String,
    tool: String,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RevisionLabels {
    revision: String,
}

fn duration_histogram() -> Histogram {
    // 0.5 ms to ~33 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 17))
}

/// See the module docs.
pub struct BoundaryMetrics {
    calls: Family<CallLabels, Counter>,
    durations: Family<ToolLabels, Histogram, fn() -> Histogram>,
    refusals: Family<RefusalLabels, Counter>,
    rate_limited: Family<ToolLabels, Counter>,
    output_guard: Family<GuardLabels, Counter>,
    definition_changes: Family<DefinitionLabels, Counter>,
    emergency_denies: Gauge,
    revision: Family<RevisionLabels, Gauge>,
    current_revision: Mutex<String>,
    /// The label of calls to tools the catalog does not have, made once.
    unknown_tool: Arc<str>,
}

impl BoundaryMetrics {
    /// The boundary's families, registered in `metrics`.
    pub fn register(metrics: &Metrics) -> Self {
        BoundaryMetrics {
            calls: metrics.registered("tool_calls", "Tool calls by tool and final status"),
            durations: metrics.registered_with(
                "tool_call_duration_seconds",
                "Time a call spent in the sidecar",
                Family::new_with_constructor(duration_histogram),
            ),
            refusals: metrics.registered(
                "refusals",
                "Calls not OK, by the stage that decided and the error type",
            ),
            rate_limited: metrics.registered("rate_limited", "Calls refused by a rate limit"),
            output_guard: metrics.registered(
                "output_guard_matches",
                "What the output guard's detectors found in tool output, by tool, detector and action",
            ),
            definition_changes: metrics.registered(
                "tool_definition_changes",
                "Pinned MCP tools listed with a definition other than their pin (WITHDRAWN, KEPT) or with it again (RESTORED)",
            ),
            emergency_denies: metrics.registered("emergency_denies", "Emergency denies in force"),
            revision: metrics.registered(
                "catalog_revision_info",
                "1 for the catalog revision being served",
            ),
            current_revision: Mutex::new(String::new()),
            unknown_tool: Arc::from(UNKNOWN_TOOL),
        }
    }

    /// Records a finished call.
    /// `tool`: the name of a tool the catalog has, shared with the call; `None` for any other,
    /// which are counted under one label so a client cannot grow the label sets.
    pub fn observe(&self, outcome: &CallOutcome, tool: Option<&Arc<str>>) {
        // Label sets are looked up by value: the call's shared copy of the name serves all of
        // them, and the rest of each label is static.
        let tool = tool.unwrap_or(&self.unknown_tool).clone();
        self.calls
            .get_or_create(&CallLabels {
                tool: tool.clone(),
                status: outcome.status.as_str(),
            })
            .inc();
        self.durations
            .get_or_create(&ToolLabels { tool: tool.clone() })
            .observe(outcome.duration.as_secs_f64());
        if let Some(refusal) = &outcome.refusal {
            self.refusals
                .get_or_create(&RefusalLabels {
                    stage: refusal.stage.as_str(),
                    error_type: refusal.reason.code(),
                })
                .inc();
            if outcome.status == Status::RateLimited {
                self.rate_limited.get_or_create(&ToolLabels { tool }).inc();
            }
        }
    }

    /// What the output guard found in a call's output (`tool`: the catalog's name).
    pub fn output_guard(&self, tool: &Arc<str>, findings: &[Finding]) {
        for finding in findings {
            self.output_guard
                .get_or_create(&GuardLabels {
                    tool: tool.clone(),
                    detector: finding.detector.clone(),
                    action: finding.action.as_str(),
                })
                .inc_by(finding.matches as u64);
        }
    }

    /// A pinned MCP tool's standing changed (`tool`: the catalog's name).
    pub fn definition_change(
        &self,
        server: &str,
        tool: &str,
        outcome: crate::catalog::pins::Outcome,
    ) {
        self.definition_changes
            .get_or_create(&DefinitionLabels {
                server: server.to_owned(),
                tool: tool.to_owned(),
                status: outcome.as_str(),
            })
            .inc();
    }

    /// The emergency denies in force now.
    pub fn emergency_denies(&self, count: usize) {
        self.emergency_denies
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// The catalog revision now served.
    pub fn serving_revision(&self, revision: &str) {
        let mut current = self
            .current_revision
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *current != revision {
            self.revision.remove(&RevisionLabels {
                revision: current.clone(),
            });
            self.revision
                .get_or_create(&RevisionLabels {
                    revision: revision.to_owned(),
                })
                .set(1);
            *current = revision.to_owned();
        }
    }
}
