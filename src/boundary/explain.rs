//! Explaining a decision without making it: ExplainTool, `toolgate test` and the shadow catalog.
//!
//! Stages 1–7 run through [`super::policy::decide`], the very function the chain runs, and each
//! says what it checked in words kept beside its rule (`explain_passed` in `structure.rs`,
//! `resolve.rs`, `access.rs`, `scopes.rs`, `schema.rs`, `bind.rs`). Stages 7b–10 read the state
//! the chain would change, and change none of it, each explained beside the rule it explains: the flow scope (`flow.rs`), the quota's remaining calls
//! (`rate_limit.rs`, by the same rule the chain's quota look uses), the approval the call
//! redeems (`approval.rs`) and what its idempotency key would find (`idempotency/explain.rs`).
//! Nothing is audited, no approval is created, and no backend is called. The trail says, stage
//! by stage, what passed or refused and why. This file holds the explanation's types, its entry
//! points and the order of its stages.

use serde_json::Value;

use super::{
    Boundary, CallRequest, Turn, access, bind,
    policy::{self, Decided, Seen},
    redaction::redact,
    resolve, schema, scopes, structure, visibility,
};
use crate::{
    catalog::{Catalog, ToolVersion, revision_of},
    conditions::Evaluated,
    error::{Reason, Refusal, Stage},
    identity::{AuthMethod, Caller},
    limits::{Cost, Quotas},
    outcome::CallOutcome,
};

/// The scope a JWT caller needs to call ExplainTool (dev identity callers need none).
pub const EXPLAIN_SCOPE: &str = "toolgate:explain";

/// Why a caller may not have a decision explained.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("explaining decisions needs the scope {EXPLAIN_SCOPE:?}")]
    MissingScope,
}

/// Explaining reveals policy (rule locations, bound values, quotas): a JWT caller needs the
/// scope `toolgate:explain`; dev identity callers, who can claim any scope, need nothing more.
fn authorize(caller: &Caller) -> Result<(), ExplainError> {
    match caller.method == AuthMethod::Dev || caller.has_scope(EXPLAIN_SCOPE) {
        true => Ok(()),
        false => Err(ExplainError::MissingScope),
    }
}

/// The stages an explanation reports, in chain order (`execute` is never run): every stage but
/// the last, `result`.
pub const STAGES: &[Stage] = match Stage::ALL.split_last() {
    Some((_, stages)) => stages,
    None => &[],
};
/// How far a stage got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageResult {
    Passed,
    Refused,
    /// An earlier stage refused (or, for `execute`, explain never runs it).
    NotReached,
    /// The stage has nothing to decide for this call (no approval needed, no idempotency key).
    NotApplicable,
}

/// One stage of an explanation.
#[derive(Debug, Clone)]
pub struct StageTrail {
    pub stage: Stage,
    pub result: StageResult,
    /// One readable sentence: what was checked and what decided.
    pub detail: String,
    /// The catalog rules that decided (access): the deny or allow rule that refused, or the allow
    /// rules that admitted.
    pub rules: Vec<access::Rule>,
    /// The scope the caller lacks (scopes).
    pub missing_scope: Option<String>,
    /// Every schema violation found (schema, bind).
    pub violations: Vec<String>,
    /// The values the server binds, as the backend would receive them (bind).
    pub bound: Vec<BoundValue>,
    /// The call's quotas and what they leave (rate_limit).
    pub quotas: Vec<QuotaTrail>,
}

impl StageTrail {
    pub(super) fn new(stage: Stage, result: StageResult, detail: impl Into<String>) -> Self {
        StageTrail {
            stage,
            result,
            detail: detail.into(),
            rules: Vec::new(),
            missing_scope: None,
            violations: Vec::new(),
            bound: Vec::new(),
            quotas: Vec::new(),
        }
    }
}

/// A server-bound argument as it would be written.
#[derive(Debug, Clone, PartialEq)]
pub struct BoundValue {
    /// Dotted path, as the catalog writes it (`filter.tenant`).
    pub path: String,
    /// The value (redacted when the tool's `redact` covers it).
    pub value: Value,
    /// Where it comes from: `${caller.tenant}`, `${caller.subject}`, `${caller.agent}` or
    /// `constant`.
    pub source: &'static str,
}

/// One quota of a call and what it leaves now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaTrail {
    /// `tool` or `tenant`.
    pub scope: &'static str,
    /// As catalogs write it, e.g. `5/min`.
    pub rate: String,
    pub burst: u32,
    /// Calls that would be admitted now; `None` when no state is kept for this quota (a shadow
    /// catalog's quota that the served catalog does not have).
    pub remaining: Option<u64>,
}

/// What execution would do with a call, and why.
#[derive(Debug, Clone)]
pub struct Explanation {
    /// The result execution would return now. On OK the backend would be called (or a stored
    /// result replayed); `model_text` is then empty, as nothing ran.
    pub outcome: CallOutcome,
    /// Whether execution would call the backend.
    pub would_execute: bool,
    /// Every stage in chain order.
    pub stages: Vec<StageTrail>,
    /// Every condition evaluated on the way (access rules, the approval condition), with its
    /// value or why it could not be evaluated.
    pub conditions: Vec<Evaluated>,
    /// The final arguments the backend would receive: bound values written, canonical, with the
    /// tool's `redact` pointers replaced. `None` when a stage before `bind` refused.
    pub arguments: Option<Value>,
    /// SHA-256 of the canonical final arguments (unredacted), as audit events record it.
    pub arguments_sha256: Option<String>,
    /// Which bound paths the model tried to set itself.
    pub override_attempts: Vec<String>,
    /// The revision of the whole catalog explained against.
    pub catalog_revision: String,
    /// What the call's flow scope has seen and what the flow rules decide; `None` when the
    /// catalog has no flow rules, the tool carries no flow label, or a stage up to bind
    /// refused.
    pub flow: Option<FlowTrail>,
}

/// What an explained call's flow scope has seen, and the flow rule that decides the call.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowTrail {
    /// `run` or `caller`.
    pub scope: &'static str,
    /// The declared labels the scope has seen, with the calls that brought them.
    pub seen: crate::flow::Seen,
    /// False when the scope could not be read.
    pub readable: bool,
    /// The labels the call adds once its backend is called.
    pub adds: Vec<String>,
    /// The rule that decides the call: name, location and `deny` or `require_approval`.
    pub rule: Option<(String, String, &'static str)>,
}

impl Explanation {
    /// The stage that refused, if one did.
    pub fn refused_by(&self) -> Option<Stage> {
        self.outcome.refusal.as_ref().map(|r| r.stage)
    }

    /// The access rule that refused the call, when one did.
    pub fn deciding_rule(&self) -> Option<&access::Rule> {
        self.stages
            .iter()
            .find(|s| s.result == StageResult::Refused)
            .and_then(|s| s.rules.first())
    }
}

/// State changes the call being shadowed made itself before its explanation was made, which the
/// explanation must not count against the call (see `crate::shadow`).
#[derive(Debug, Clone, Copy, Default)]
pub struct OwnEffects {
    /// The call passed the rate limit, taking one cell of each shared quota.
    pub quota: bool,
    /// The call used up the approval it redeems.
    pub approval: bool,
    /// The call claimed its idempotency key and stored its result under it.
    pub idempotency_key: bool,
}

/// Whether a tool is visible to a caller, and if not, what hid it.
#[derive(Debug, Clone)]
pub struct Visibility {
    pub name: String,
    /// The version the caller would see, or would get if it called the tool anyway.
    pub version: String,
    /// Why the tool is hidden; `None` when visible.
    pub hidden_by: Option<Refusal>,
    /// The access rule that hid it.
    pub rule: Option<access::Rule>,
    /// The scope whose absence hid it.
    pub missing_scope: Option<String>,
}

impl Boundary {
    /// ExplainTool: what ExecuteTool would decide for `call` now, for a caller who may ask.
    pub async fn explain_tool(
        &self,
        turn: &Turn,
        call: &CallRequest,
    ) -> Result<Explanation, ExplainError> {
        authorize(&turn.caller)?;
        Ok(self.explain(turn, call, 0).await)
    }

    /// ExplainListTools: which tools the caller sees and what hides the others, for a caller who
    /// may ask; with the revision explained.
    pub fn explain_list_tools(
        &self,
        caller: &Caller,
    ) -> Result<(Vec<Visibility>, String), ExplainError> {
        authorize(caller)?;
        Ok(self.explain_visibility(caller))
    }

    /// Explains `call` (the `index`-th of its turn) against the catalog in force: what
    /// ExecuteTool would decide now, changing nothing. Asks for no scope: for the catalog's own
    /// test cases and the shadow catalog; callers go through [`Self::explain_tool`].
    pub async fn explain(&self, turn: &Turn, call: &CallRequest, index: usize) -> Explanation {
        let state = self.state.load_full();
        let explainer = Explainer {
            boundary: self,
            catalog: &state.catalog,
            rate_limits: &state.rate_limits,
            check_revision: true,
            own: OwnEffects::default(),
            history: None,
        };
        explainer.explain(turn, call, index).await
    }

    /// Like [`Self::explain`], with the call's flow scope taken to have seen what the tools of
    /// `history` brought, in order (`toolgate test`'s `history`), instead of what it has. A
    /// tool of the history that does not resolve for the caller's tenant is an error.
    pub async fn explain_after(
        &self,
        turn: &Turn,
        call: &CallRequest,
        history: &[String],
    ) -> Result<Explanation, String> {
        let state = self.state.load_full();
        let mut seen = crate::flow::Seen::new();
        for (i, name) in history.iter().enumerate() {
            let tool = state
                .catalog
                .resolve(name, None, &turn.caller.tenant)
                .map_err(|_| {
                    format!(
                        "history[{i}]: {name} has no version tenant {} gets",
                        turn.caller.tenant
                    )
                })?;
            if let Some(policy) = state.catalog.flow.as_deref() {
                let source = crate::flow::Source {
                    call_id: format!("history[{i}]"),
                    tool: name.clone(),
                };
                crate::flow::add(&mut seen, &policy.names(tool.flow_labels), &source);
            }
        }
        let explainer = Explainer {
            boundary: self,
            catalog: &state.catalog,
            rate_limits: &state.rate_limits,
            check_revision: true,
            own: OwnEffects::default(),
            history: Some(&seen),
        };
        Ok(explainer.explain(turn, call, 0).await)
    }

    /// Explains `call` against another catalog (a shadow candidate), with the state of the one
    /// in force: quotas are the served catalog's where the candidate's are the same.
    pub(crate) async fn explain_against(
        &self,
        catalog: &Catalog,
        turn: &Turn,
        call: &CallRequest,
        index: usize,
        own: OwnEffects,
    ) -> Explanation {
        let state = self.state.load_full();
        let explainer = Explainer {
            boundary: self,
            catalog,
            rate_limits: &state.rate_limits,
            // The model was shown the served catalog's revisions, not the candidate's.
            check_revision: false,
            own,
            history: None,
        };
        explainer.explain(turn, call, index).await
    }

    /// Every tool of the catalog in force, visible to `caller` or not, with what hid it; and the
    /// revision ListTools would report. Nothing is recorded.
    pub fn explain_visibility(&self, caller: &Caller) -> (Vec<Visibility>, String) {
        let state = self.state.load_full();
        explain_visibility(&state.catalog, &self.emergency, caller)
    }
}

/// See [`Boundary::explain_visibility`].
pub fn explain_visibility(
    catalog: &Catalog,
    denies: &crate::emergency::EmergencyDenies,
    caller: &Caller,
) -> (Vec<Visibility>, String) {
    let mut names: Vec<&str> = catalog.names().chain(catalog.unavailable_names()).collect();
    names.sort_unstable();
    let mut visible = Vec::new();
    let tools = names
        .into_iter()
        .map(|name| match visibility(catalog, denies, caller, name) {
            Ok(tool) => {
                visible.push(tool.clone());
                Visibility {
                    name: name.to_owned(),
                    version: tool.version.to_string(),
                    hidden_by: None,
                    rule: None,
                    missing_scope: None,
                }
            }
            Err(refusal) => {
                let tool = super::resolve::resolve(catalog, name, None, caller).ok();
                let rule = match (refusal.stage, tool) {
                    (Stage::Access, Some(tool)) => {
                        access::explain(catalog, &access::listing(caller, tool))
                            .rules
                            .pop()
                    }
                    _ => None,
                };
                let missing_scope = match (refusal.stage, tool) {
                    (Stage::Scopes, Some(tool)) => scopes::missing(caller, tool).map(str::to_owned),
                    _ => None,
                };
                Visibility {
                    name: name.to_owned(),
                    version: tool.map(|t| t.version.to_string()).unwrap_or_default(),
                    hidden_by: Some(refusal),
                    rule,
                    missing_scope,
                }
            }
        })
        .collect();
    let revision = revision_of(visible.iter().map(|t| t.as_ref()));
    (tools, revision)
}

/// One explanation's inputs.
pub(super) struct Explainer<'a> {
    pub(super) boundary: &'a Boundary,
    pub(super) catalog: &'a Catalog,
    pub(super) rate_limits: &'a Quotas,
    check_revision: bool,
    pub(super) own: OwnEffects,
    /// What the flow scope is taken to have seen instead of what it has (`toolgate test`'s
    /// `history`).
    pub(super) history: Option<&'a crate::flow::Seen>,
}

/// What stage 7b decides: an approval reason a rule adds, or the refusal and the flow rule
/// behind it.
pub(super) type FlowJudged = Result<Option<String>, (Refusal, Option<access::Rule>)>;

/// How stages 8–10 ended.
pub(super) enum Ending {
    /// Every stage passed: the backend would be called.
    Execute {
        approval_id: Option<String>,
    },
    /// A stored result would be replayed (or awaited from the running first call).
    Replay {
        result: Result<(), Refusal>,
        tool_version: String,
    },
    Refused(Refusal),
}

impl Explainer<'_> {
    /// Which credential the backend would be called with, in words; none is fetched.
    fn credential_of(&self, tool: &crate::catalog::ToolVersion) -> Option<String> {
        let state = self.boundary.state.load();
        let executors = &state.executors;
        let ((kind, audience), backend) = match &tool.backend {
            crate::catalog::BackendSpec::Http(target) => (
                executors.http.upstream(&target.upstream)?.credential()?,
                format!("upstream {}", target.upstream),
            ),
            crate::catalog::BackendSpec::A2a(target) => (
                executors.http.upstream(&target.upstream)?.credential()?,
                format!("the agent at upstream {}", target.upstream),
            ),
            crate::catalog::BackendSpec::Mcp(target) => (
                executors.mcp.credential(&target.server)?,
                format!("MCP server {}", target.server),
            ),
            _ => return None,
        };
        Some(format!(
            ", with a {kind} credential{} for {backend} (fetched when the call runs; explain fetches none)",
            audience
                .map(|a| format!(" for audience {a}"))
                .unwrap_or_default(),
        ))
    }

    // Async because the stores it reads may live elsewhere (a shared backend answers later).
    async fn explain(&self, turn: &Turn, call: &CallRequest, index: usize) -> Explanation {
        let limits = &self.boundary.limits;
        let caller = &turn.caller;
        let call_id = structure::reported_call_id(
            &structure::normalize_call_id(&call.call_id, turn.step, index),
            limits.max_identifier_bytes,
        )
        .to_string();
        let mut seen = Seen::default();
        let shown = turn
            .catalog_revision
            .as_deref()
            .filter(|_| self.check_revision)
            .map(|shown| (&self.boundary.revisions, shown));
        let asker = policy::Asker {
            caller,
            run_id: &turn.run_id,
            now: self.boundary.clock.system_time(),
            trace: true,
            apart: &self.boundary.apart,
        };
        let decided = policy::decide(
            limits,
            &self.boundary.arguments_budget,
            self.catalog,
            &self.boundary.emergency,
            shown,
            &asker,
            call,
            &mut seen,
        );
        let mut stages = self.policy_trail(turn, call, &seen, &decided);
        let tool = seen.tool;
        let version = tool.map(|t| t.version.to_string()).unwrap_or_default();
        let (mut arguments, mut arguments_sha256) = (None, None);
        let mut flow = None;
        let ending = match decided {
            Err(refusal) => {
                // Refused after bind (a condition on the arguments): what it was decided on.
                if let Some(refused) = &seen.refused_arguments {
                    let pointers = tool.map_or(&[][..], |t| &t.redact[..]);
                    arguments = Some(redact(refused, pointers));
                    arguments_sha256 = Some(crate::canonical::sha256_hex(refused));
                }
                Ending::Refused(refusal)
            }
            Ok(decided) => 'decided: {
                arguments = Some(redact(&decided.arguments, &decided.tool.redact));
                arguments_sha256 = Some(decided.arguments_sha256.to_string());
                // 7b. Flow rules, on what the scope has seen; a refusal is access's.
                let flow_why = match self.flow(turn, decided.tool).await {
                    None => None,
                    Some((trail, judged)) => {
                        flow = Some(trail);
                        match judged {
                            Ok(why) => why,
                            Err((refusal, rule)) => {
                                if let Some(access) =
                                    stages.iter_mut().find(|s| s.stage == Stage::Access)
                                {
                                    access.result = StageResult::Refused;
                                    access.detail = format!(
                                        "{} (decided after bind, on what the {} has seen)",
                                        refusal.message,
                                        flow.as_ref().map_or("scope", |f| f.scope)
                                    );
                                    access.rules = rule.into_iter().collect();
                                }
                                break 'decided Ending::Refused(refusal);
                            }
                        }
                    }
                };
                // The quota cost and the approval condition, if the tool has them (stages 8
                // and 9 evaluate them the same).
                let (cost, cost_condition) =
                    super::rate_limit::cost(decided.tool, &asker, &decided.arguments);
                seen.conditions.extend(cost_condition);
                let (_, approval_condition) =
                    super::approval::needed(decided.tool, &asker, &decided.arguments);
                seen.conditions.extend(approval_condition);
                self.stateful(turn, call, &decided, cost, flow_why, &mut stages)
                    .await
            }
        };
        for &stage in STAGES {
            if !stages.iter().any(|s| s.stage == stage) {
                let detail = match stage {
                    Stage::Execute => "explain never calls the backend",
                    _ => "",
                };
                stages.push(StageTrail::new(stage, StageResult::NotReached, detail));
            }
        }
        if let Ending::Execute { .. } = &ending
            && let Some(execute) = stages.iter_mut().find(|s| s.stage == Stage::Execute)
            && let Some(tool) = tool
        {
            execute.detail = format!(
                "execution would now hand the final arguments to the {} backend",
                tool.backend.kind()
            );
            if let Some(said) = self.credential_of(tool) {
                execute.detail.push_str(&said);
            }
        }
        let would_execute = matches!(ending, Ending::Execute { .. });
        let outcome = match ending {
            Ending::Execute { approval_id } => {
                let mut outcome =
                    CallOutcome::ok(call_id, call.name.clone(), version, String::new());
                outcome.approval_id = approval_id;
                outcome
            }
            Ending::Replay {
                result,
                tool_version,
            } => {
                let mut outcome = match result {
                    Ok(()) => {
                        CallOutcome::ok(call_id, call.name.clone(), tool_version, String::new())
                    }
                    Err(refusal) => {
                        CallOutcome::refused(call_id, call.name.clone(), tool_version, refusal)
                    }
                };
                outcome.idempotent_replay = true;
                outcome
            }
            // What the caller would be answered (a hidden tool as an unknown one); the stages
            // above say what really refused it.
            Ending::Refused(refusal) => {
                let refusal = super::visibility::as_caller_sees(
                    self.catalog,
                    &self.boundary.emergency,
                    caller,
                    &call.name,
                    refusal,
                );
                let version = match refusal.reason {
                    Reason::ToolNotFound => String::new(),
                    _ => version,
                };
                CallOutcome::refused(call_id, call.name.clone(), version, refusal)
            }
        };
        Explanation {
            outcome,
            would_execute,
            stages,
            conditions: seen
                .conditions
                .into_iter()
                .map(|evaluated| redact_read(evaluated, tool))
                .collect(),
            arguments,
            arguments_sha256,
            override_attempts: seen.override_attempts,
            catalog_revision: self.catalog.revision().to_owned(),
            flow,
        }
    }

    /// The trail of stages 1–7 from what [`policy::decide`] found.
    fn policy_trail(
        &self,
        turn: &Turn,
        call: &CallRequest,
        seen: &Seen<'_>,
        decided: &Result<Decided<'_>, Refusal>,
    ) -> Vec<StageTrail> {
        let caller = &turn.caller;
        let refused_at = decided.as_ref().err().map(|refusal| refusal.stage);
        let mut trail = Vec::new();
        for stage in &STAGES[..6] {
            let stage = *stage;
            if refused_at == Some(stage) {
                let Err(refusal) = decided else { break };
                let mut refused =
                    StageTrail::new(stage, StageResult::Refused, refusal.message.clone());
                refused.violations = seen.violations.clone();
                match (stage, seen.tool) {
                    // Refused after bind by an entry whose condition read the arguments: the
                    // chain kept the rule.
                    (Stage::Access, Some(_)) if !seen.access_rules.is_empty() => {
                        refused.rules = seen.access_rules.clone();
                        refused
                            .detail
                            .push_str(" (decided after bind, on the bound arguments)");
                    }
                    (Stage::Access, Some(tool)) => {
                        refused.rules =
                            access::explain(self.catalog, &access::listing(caller, tool)).rules;
                    }
                    (Stage::Scopes, Some(tool)) => {
                        refused.missing_scope = scopes::missing(caller, tool).map(str::to_owned);
                    }
                    _ => {}
                }
                trail.push(refused);
                // Decided after bind: the stages before that passed, on these arguments.
                if let (Stage::Access, Some(arguments)) = (stage, &seen.refused_arguments) {
                    for stage in [Stage::Scopes, Stage::Schema, Stage::Bind] {
                        trail.extend(self.passed(stage, turn, call, seen, Some(arguments)));
                    }
                }
                break;
            }
            let arguments = decided.as_ref().ok().map(|d| &d.arguments);
            let Some(passed) = self.passed(stage, turn, call, seen, arguments) else {
                break;
            };
            trail.push(passed);
        }
        trail
    }

    /// What a passed stage among 1–7 checked, in the words beside its rule; `None` for a stage
    /// that cannot have passed.
    fn passed(
        &self,
        stage: Stage,
        turn: &Turn,
        call: &CallRequest,
        seen: &Seen<'_>,
        arguments: Option<&Value>,
    ) -> Option<StageTrail> {
        let caller = &turn.caller;
        if stage == Stage::Structure {
            return Some(structure::explain_passed());
        }
        let tool = seen.tool?;
        match stage {
            Stage::Resolve => Some(resolve::explain_passed(
                tool,
                call.version.is_some(),
                &caller.tenant,
                turn.catalog_revision
                    .as_deref()
                    .filter(|_| self.check_revision),
            )),
            // Refused after bind: not passed, whatever the caller and the tool alone allow.
            Stage::Access if seen.refused_arguments.is_some() => None,
            Stage::Access => access::explain_passed(self.catalog, caller, tool),
            Stage::Scopes => Some(scopes::explain_passed(tool)),
            Stage::Schema => Some(schema::explain_passed()),
            Stage::Bind => Some(bind::explain_passed(
                tool,
                arguments?,
                &seen.override_attempts,
            )),
            _ => None,
        }
    }

    /// Stages 8–10 against the live state, which they only read: each explained beside its
    /// rule (`rate_limit.rs`, `approval.rs`, `idempotency/explain.rs`).
    async fn stateful(
        &self,
        turn: &Turn,
        call: &CallRequest,
        decided: &Decided<'_>,
        cost: Result<Cost, Refusal>,
        flow_why: Option<String>,
        stages: &mut Vec<StageTrail>,
    ) -> Ending {
        // 8. Rate limits: what each quota leaves.
        if let Err(refusal) = self.rate_limit(turn, decided, cost, stages).await {
            return Ending::Refused(refusal);
        }
        // 9. Approval: checked, never created.
        let (trail, approval) = self.approval(turn, call, decided, flow_why).await;
        stages.push(trail);
        let approval_id = match approval {
            Ok(id) => id,
            Err(refusal) => return Ending::Refused(refusal),
        };
        // 10. Idempotency: what the key would find, claimed by no one.
        self.idempotency(turn, call, decided, approval_id, stages)
            .await
    }
}

/// A condition's values as records show them: the arguments it read redacted by the tool's
/// `redact` pointers, as the final arguments are.
fn redact_read(mut evaluated: Evaluated, tool: Option<&std::sync::Arc<ToolVersion>>) -> Evaluated {
    if let Some(tool) = tool {
        for (name, value) in &mut evaluated.read {
            if *name == "args" {
                *value = redact(value, &tool.redact);
            }
        }
    }
    evaluated
}
