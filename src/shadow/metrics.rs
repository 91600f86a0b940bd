//! The shadow catalog's metrics, registered by the shadow when the server makes it:
//! `toolgate_shadow_compared_total`, `…_differences_total{tool,kind}`, `…_skipped_total{reason}`,
//! `…_catalog_loads_total{result}`, `…_catalog_parses_total`, `…_catalog_revision_info`.

use std::sync::Mutex;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
};

use crate::metrics::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DifferenceLabels {
    tool: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RevisionLabels {
    revision: String,
}

/// See the module docs.
#[derive(Debug)]
pub struct ShadowMetrics {
    compared: Counter,
    differences: Family<DifferenceLabels, Counter>,
    skipped: Family<ReasonLabels, Counter>,
    loads: Family<ResultLabels, Counter>,
    parses: Counter,
    revision: Family<RevisionLabels, Gauge>,
    current_revision: Mutex<Option<String>>,
}

impl ShadowMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        ShadowMetrics {
            compared: metrics.registered(
                "shadow_compared",
                "Calls explained against the shadow catalog and compared",
            ),
            differences: metrics.registered(
                "shadow_differences",
                "Calls the shadow catalog would decide differently, by tool and what differs (status, refused_by, tool_version, bound_arguments)",
            ),
            skipped: metrics.registered(
                "shadow_skipped",
                "Calls not compared with the shadow catalog (queue_full) or whose difference was not audited (audit_full)",
            ),
            loads: metrics.registered(
                "shadow_catalog_loads",
                "Loads of the shadow catalog file by result (ok, refused)",
            ),
            parses: metrics.registered(
                "shadow_catalog_parses",
                "Times the shadow catalog file's text was parsed: when it was new or changed, and for each load (an unchanged file is not parsed)",
            ),
            revision: metrics.registered(
                "shadow_catalog_revision_info",
                "1 for the shadow catalog revision being compared",
            ),
            current_revision: Mutex::new(None),
        }
    }

    /// A call compared with the shadow catalog.
    pub fn compared(&self) {
        self.compared.inc();
    }

    /// One way the shadow catalog would have decided a call differently.
    pub fn difference(&self, tool: &str, kind: &str) {
        self.differences
            .get_or_create(&DifferenceLabels {
                tool: tool.to_owned(),
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// A call not compared (`queue_full`), or a difference not audited (`audit_full`).
    pub fn skipped(&self, reason: &'static str) {
        self.skipped.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// A load of the shadow catalog file: `ok` or `refused`.
    pub fn load(&self, result: &'static str) {
        self.loads.get_or_create(&ResultLabels { result }).inc();
    }

    /// The shadow catalog file's text was parsed.
    pub fn parse(&self) {
        self.parses.inc();
    }

    /// The shadow catalog revision now compared, if any.
    pub fn revision(&self, revision: Option<&str>) {
        let mut current = self
            .current_revision
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(old) = current.take() {
            self.revision.remove(&RevisionLabels { revision: old });
        }
        if let Some(revision) = revision {
            self.revision
                .get_or_create(&RevisionLabels {
                    revision: revision.to_owned(),
                })
                .set(1);
            *current = Some(revision.to_owned());
        }
    }
}
