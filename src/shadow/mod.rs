//! Shadow rollout of a candidate catalog (`shadow_catalog: PATH`). Every call is decided by the
//! catalog in force, as always; afterwards, off the response path, a single worker explains the
//! same call against the candidate (`Boundary::explain_against`: stages 1–7 of the candidate,
//! the live state of stages 8–10 only read) and compares the two decisions. A difference in
//! status, refusing stage, resolved version or bound arguments becomes an audit event of kind
//! `shadow_decision` and is counted in `toolgate_shadow_differences_total{tool, kind}`.
//!
//! The candidate never changes a result, never consumes quota, creates or uses no approval,
//! claims no idempotency key and runs no backend. Its work is bounded: calls wait for it in a
//! queue of at most [`MAX_QUEUED`] calls and [`MAX_QUEUED_BYTES`] bytes of arguments; a call
//! that finds it full is not shadowed and is counted (`toolgate_shadow_skipped_total`).
//!
//! Loading and hot reload of the candidate live in [`candidate`].

pub mod candidate;
mod metrics;

use metrics::ShadowMetrics;

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use arc_swap::ArcSwapOption;
use tokio::sync::{mpsc, watch};

use crate::{
    audit::{AuditEvent, AuditLog, CandidateDecision, EventKind, EventTime, Party, ShadowRecord},
    boundary::{
        Boundary, CallObserver, CallRequest, CallTrail, FinishedCall, Turn,
        explain::{Explanation, OwnEffects},
    },
    catalog::Catalog,
    clock::SharedClock,
    error::{Stage, Status},
    identity::Caller,
    metrics::Metrics,
    outcome::CallOutcome,
};

/// Calls waiting to be shadowed, at most.
pub const MAX_QUEUED: usize = 1024;
/// Bytes of arguments held by calls waiting to be shadowed, at most.
pub const MAX_QUEUED_BYTES: usize = 16 * 1024 * 1024;

/// A loaded candidate catalog.
#[derive(Debug)]
pub struct Candidate {
    pub catalog: Catalog,
    pub path: PathBuf,
    /// A hash of the file's content (and the files it references): which candidate decided.
    /// (The catalog revision hashes tool definitions only, so a policy-only change keeps it.)
    pub revision: String,
}

/// What the candidate's loader did last, for operators and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadStatus {
    /// Load attempts so far (each reload of the file, good or bad).
    pub attempts: u64,
    /// Times the loader looked at the file (every poll, and every forced look).
    pub polls: u64,
    /// Times it parsed the file's text: when the text was new or changed (to learn the files it
    /// references), and for each load attempt. An unchanged file is not parsed.
    pub parses: u64,
    /// The revision of the candidate in use, if any.
    pub revision: Option<String>,
    /// Why the last attempt was refused (the previous candidate, if any, stays in use).
    pub error: Option<String>,
}

/// The candidate and the queue of calls waiting to be explained against it.
pub struct Shadow {
    candidate: ArcSwapOption<Candidate>,
    /// Where the candidate is read from; `None` turns shadowing off.
    path: watch::Sender<Option<PathBuf>>,
    status: watch::Sender<LoadStatus>,
    queue: mpsc::Sender<Job>,
    receiver: Mutex<Option<mpsc::Receiver<Job>>>,
    queued_bytes: AtomicUsize,
    metrics: ShadowMetrics,
}

impl Shadow {
    /// The shadow of `boundary`'s calls: told of each one from now on, compared by [`run`]; its
    /// counters are registered in `metrics`.
    pub fn observe(boundary: &Boundary, metrics: &Metrics) -> Arc<Self> {
        let (queue, receiver) = mpsc::channel(MAX_QUEUED);
        let shadow = Arc::new(Shadow {
            candidate: ArcSwapOption::empty(),
            path: watch::channel(None).0,
            status: watch::channel(LoadStatus::default()).0,
            queue,
            receiver: Mutex::new(Some(receiver)),
            queued_bytes: AtomicUsize::new(0),
            metrics: ShadowMetrics::register(metrics),
        });
        if !boundary.observe_calls(shadow.clone()) {
            tracing::error!(
                "the boundary's calls are observed already; the shadow catalog sees none"
            );
        }
        shadow
    }

    /// Sets where the candidate is read from (the served catalog's `shadow_catalog`), and has
    /// the loader read it now.
    pub fn configure(&self, path: Option<PathBuf>) {
        self.path.send_replace(path);
    }

    /// The candidate in use.
    pub fn candidate(&self) -> Option<Arc<Candidate>> {
        self.candidate.load_full()
    }

    /// Watches what the loader does (attempts, revision, last error).
    pub fn watch_status(&self) -> watch::Receiver<LoadStatus> {
        self.status.subscribe()
    }
}

impl CallObserver for Shadow {
    fn wants_calls(&self) -> bool {
        self.candidate.load().is_some()
    }

    /// Queues a finished call for comparison, if there is room.
    fn finished(&self, finished: FinishedCall<'_>) {
        let FinishedCall {
            turn,
            index,
            request: call,
            outcome,
            trail,
        } = finished;
        let bytes = call.arguments_json.len() + JOB_OVERHEAD;
        let taken = self.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        let had_key = call.idempotency_key.is_some();
        let job = Job {
            caller: turn.caller.clone(),
            run_id: turn.run_id.clone(),
            door: turn.door,
            step: turn.step,
            index,
            call,
            bytes,
            active: Active {
                had_key,
                ..Active::of(outcome, trail)
            },
        };
        if taken + bytes > MAX_QUEUED_BYTES || self.queue.try_send(job).is_err() {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.metrics.skipped("queue_full");
        }
    }
}

/// What a queued call costs beyond its arguments.
const JOB_OVERHEAD: usize = 512;

/// A call waiting to be explained against the candidate.
struct Job {
    caller: Arc<Caller>,
    run_id: Arc<str>,
    door: crate::identity::Door,
    step: u32,
    index: usize,
    call: CallRequest,
    bytes: usize,
    active: Active,
}

/// What the catalog in force decided for a call.
#[derive(Debug, Clone)]
struct Active {
    call_id: String,
    status: Status,
    error_type: Option<&'static str>,
    refused_by: Option<Stage>,
    tool_version: String,
    arguments_sha256: Option<Arc<str>>,
    idempotent_replay: bool,
    had_approval: bool,
    had_key: bool,
}

impl Active {
    fn of(outcome: &CallOutcome, trail: &CallTrail) -> Self {
        let refusal = outcome.refusal.as_ref();
        Active {
            call_id: outcome.call_id.clone(),
            status: outcome.status,
            error_type: refusal.map(|r| r.reason.code()),
            refused_by: refusal.map(|r| r.stage),
            tool_version: outcome.tool_version.clone(),
            arguments_sha256: trail.arguments_sha256.clone(),
            idempotent_replay: outcome.idempotent_replay,
            had_approval: trail.approval_id.is_some() || outcome.approval_id.is_some(),
            had_key: false,
        }
    }

    /// Whether the call got past `stage`.
    fn passed(&self, stage: Stage) -> bool {
        self.refused_by
            .is_none_or(|refused| order(refused) > order(stage))
    }

    /// Whether the backend was reached (or would have been: what the candidate can predict).
    fn reached_backend(&self) -> bool {
        !self.idempotent_replay && self.passed(Stage::Idempotency)
    }

    /// What this call did to the state the candidate reads after it.
    fn own_effects(&self) -> OwnEffects {
        OwnEffects {
            quota: self.passed(Stage::RateLimit),
            approval: self.had_approval && self.reached_backend(),
            idempotency_key: self.had_key && self.reached_backend(),
        }
    }

    /// The decision as the candidate's explanation can state it: a call that reached its
    /// backend counts as OK, whatever the backend then did.
    fn decision(&self) -> (&'static str, Option<Stage>) {
        if self.reached_backend() {
            ("OK", None)
        } else {
            (self.status.as_str(), self.refused_by)
        }
    }
}

/// Stages in chain order; `result` comes last.
fn order(stage: Stage) -> usize {
    crate::boundary::explain::STAGES
        .iter()
        .position(|s| *s == stage)
        .unwrap_or(crate::boundary::explain::STAGES.len())
}

/// Where the worker records the differences it finds: audit events, stamped by the server's
/// clock, naming the tool as the served call's event does.
pub struct Recorder {
    pub audit: AuditLog,
    pub clock: SharedClock,
    /// The served calls' `limits.max_identifier_bytes`, to which tool names are cut.
    pub max_identifier_bytes: usize,
}

/// The worker: explains queued calls against the candidate, one at a time, until the server
/// stops.
pub async fn run(boundary: Arc<Boundary>, shadow: Arc<Shadow>, recorder: Recorder) {
    let receiver = shadow
        .receiver
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    let Some(mut receiver) = receiver else {
        return;
    };
    while let Some(job) = receiver.recv().await {
        shadow.queued_bytes.fetch_sub(job.bytes, Ordering::AcqRel);
        let Some(candidate) = shadow.candidate() else {
            continue;
        };
        compare(&boundary, &shadow, &recorder, &candidate, job).await;
    }
}

async fn compare(
    boundary: &Boundary,
    shadow: &Shadow,
    recorder: &Recorder,
    candidate: &Candidate,
    job: Job,
) {
    let revision = &candidate.revision;
    let candidate = &candidate.catalog;
    let turn = Turn {
        caller: job.caller,
        run_id: job.run_id,
        door: job.door,
        step: job.step,
        catalog_revision: None,
        deadline: None,
        trace_parent: opentelemetry::Context::new(),
    };
    let active = job.active;
    let explained = boundary
        .explain_against(candidate, &turn, &job.call, job.index, active.own_effects())
        .await;
    shadow.metrics.compared();
    let differences = differences(&active, &explained);
    if differences.is_empty() {
        return;
    }
    let served = boundary.catalog();
    let tool = &job.call.name;
    let label = if served.catalog.contains(tool) || candidate.contains(tool) {
        tool.as_str()
    } else {
        crate::metrics::UNKNOWN_TOOL
    };
    for kind in &differences {
        shadow.metrics.difference(label, kind);
    }
    let Some(slot) = recorder.audit.try_reserve() else {
        shadow.metrics.skipped("audit_full");
        return;
    };
    let refusal = explained.outcome.refusal.as_ref();
    let rule = explained.deciding_rule();
    let record = ShadowRecord {
        reached_backend: active.reached_backend(),
        differences,
        catalog_revision: served.catalog.revision().to_owned(),
        candidate: CandidateDecision {
            status: explained.outcome.status.as_str(),
            error_type: refusal.map(|r| r.reason.code()),
            refused_by: refusal.map(|r| r.stage.as_str()),
            reason: refusal.map(|r| r.message.clone()),
            rule: rule.map(|r| r.location.clone()),
            rule_pattern: rule.and_then(|r| r.pattern.clone()),
            tool_version: explained.outcome.tool_version.clone(),
            arguments_sha256: explained.arguments_sha256.clone(),
            bound_arguments: explained
                .stages
                .iter()
                .flat_map(|s| &s.bound)
                .map(|b| b.path.clone())
                .collect(),
            revision: revision.clone(),
        },
    };
    slot.send(Box::new(AuditEvent {
        time: EventTime(recorder.clock.unix_ms()),
        kind: Some(EventKind::ShadowDecision),
        call_id: active.call_id.into(),
        run_id: turn.run_id,
        step: turn.step,
        door: Some(turn.door.as_str()),
        party: Party::Caller(turn.caller.clone()),
        tool: crate::boundary::structure::reported_call_id(
            &job.call.name,
            recorder.max_identifier_bytes,
        ),
        tool_version: active.tool_version.into(),
        arguments_sha256: active.arguments_sha256,
        status: active.status.as_str(),
        error_type: active.error_type,
        refused_by: active.refused_by.map(Stage::as_str),
        idempotent_replay: active.idempotent_replay,
        shadow: Some(Box::new(record)),
        ..AuditEvent::default()
    }));
}

/// What differs between the served decision and the candidate's: `status`, `refused_by`,
/// `tool_version` (when both resolved one) and `bound_arguments` (when both bound).
fn differences(active: &Active, candidate: &Explanation) -> Vec<&'static str> {
    let (status, refused_by) = active.decision();
    let mut differences = Vec::new();
    if status != candidate.outcome.status.as_str() {
        differences.push("status");
    }
    if refused_by != candidate.refused_by() {
        differences.push("refused_by");
    }
    let version = &candidate.outcome.tool_version;
    if !active.tool_version.is_empty() && !version.is_empty() && active.tool_version != *version {
        differences.push("tool_version");
    }
    if let (Some(served), Some(shadow)) = (&active.arguments_sha256, &candidate.arguments_sha256)
        && **served != **shadow
    {
        differences.push("bound_arguments");
    }
    differences
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::Config, settings::Env};

    fn turn() -> Turn {
        Turn {
            caller: Arc::new(Caller {
                tenant: "acme".into(),
                subject: String::new(),
                agent: "".into(),
                scopes: Default::default(),
                method: crate::identity::AuthMethod::Dev,
                claims: Default::default(),
                token: None,
                delegation: None,
            }),
            door: crate::identity::Door::Grpc,
            run_id: "r".into(),
            step: 0,
            catalog_revision: None,
            deadline: None,
            trace_parent: opentelemetry::Context::new(),
        }
    }

    /// With no worker draining it, the queue takes MAX_QUEUED calls (or MAX_QUEUED_BYTES of
    /// arguments); every call beyond is not shadowed, and counted.
    #[tokio::test]
    async fn a_full_queue_skips_and_counts_instead_of_growing() {
        let boundary =
            crate::cli::test_runner::explaining_boundary(Config::demo(&Env::default()).unwrap())
                .await
                .unwrap();
        let catalog = Config::demo(&Env::default()).unwrap().catalog;
        let metrics = Metrics::new();
        let shadow = Shadow::observe(&boundary, &metrics);
        shadow.candidate.store(Some(Arc::new(Candidate {
            catalog,
            path: PathBuf::new(),
            revision: "r".into(),
        })));
        let outcome = CallOutcome::ok("c".into(), "echo".into(), "1".into(), "x".into());
        let turn = turn();
        let trail = CallTrail::default();
        let offer = |arguments: &str| {
            if !shadow.wants_calls() {
                return;
            }
            shadow.finished(FinishedCall {
                turn: &turn,
                index: 0,
                request: CallRequest {
                    name: "echo".into(),
                    arguments_json: arguments.to_owned(),
                    ..CallRequest::default()
                },
                outcome: &outcome,
                trail: &trail,
            })
        };
        let skipped = |metrics: &Metrics| {
            let text = metrics.render();
            text.lines()
                .find(|l| l.starts_with("toolgate_shadow_skipped_total{reason=\"queue_full\"}"))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // Bytes first: three calls of 6 MiB fit in 16 MiB only twice.
        let big = "x".repeat(6 * 1024 * 1024);
        for _ in 0..3 {
            offer(&big);
        }
        assert_eq!(skipped(&metrics), 1);
        assert_eq!(
            shadow.queued_bytes.load(Ordering::Acquire),
            2 * (big.len() + JOB_OVERHEAD)
        );
        // Then the count: MAX_QUEUED in all.
        for _ in 0..MAX_QUEUED {
            offer("{}");
        }
        assert_eq!(skipped(&metrics), 1 + 2);
        // Without a candidate nothing is queued or counted.
        shadow.candidate.store(None);
        offer("{}");
        assert_eq!(skipped(&metrics), 3);
    }
}
