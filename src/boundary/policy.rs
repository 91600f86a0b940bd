//! Stages 1–7, the part of the chain decided from the call, the caller and the catalog alone:
//! structure, resolve (and the shown revision), access, scopes, schema, bind and the canonical
//! form. Execution ([`super::Boundary::execute`]) and explanation ([`super::explain`], the shadow
//! catalog) both run exactly this function, so what ExplainTool says cannot drift from what
//! ExecuteTool does. Nothing here reads or writes state kept between calls, except that a shown
//! revision equal to the current one is remembered (as ListTools does).

use std::{sync::Arc, time::SystemTime};

use serde_json::Value;

use super::{CallRequest, Step, access, bind, emergency, resolve, schema, scopes, structure};
use crate::{
    approvals, canonical,
    catalog::{Catalog, ToolVersion},
    conditions::{Apart, CallFacts, Evaluated, Input},
    emergency::EmergencyDenies,
    error::Refusal,
    identity::Caller,
    settings::LimitsConfig,
};

/// Who asks, in which run, and when (the boundary clock's time): what conditions read beside
/// the tool and the arguments.
pub(crate) struct Asker<'a> {
    pub caller: &'a Caller,
    pub run_id: &'a str,
    pub now: SystemTime,
    /// Keep every condition evaluated (explain, catalog tests) in [`Seen::conditions`].
    pub trace: bool,
    /// Where evaluations that can take long run.
    pub apart: &'a Apart,
}

impl<'a> Asker<'a> {
    /// What the conditions of `tool` read for this call, once its arguments are final (stage 7a,
    /// the quota cost, the approval condition), traced when the asker traces.
    pub fn call_input(&self, tool: &'a ToolVersion, arguments: &'a Value) -> Input<'a> {
        let call = CallFacts {
            args: arguments,
            now: self.now,
            run_id: self.run_id,
        };
        Input::of_call(self.caller, tool.facts(), call).traced(self.trace)
    }
}

/// What stages 1–7 let through: the tool and the final arguments the backend would receive.
pub(crate) struct Decided<'c> {
    pub tool: &'c Arc<ToolVersion>,
    /// Bound values written, in canonical form: exactly what is hashed, approved and executed.
    pub arguments: Value,
    pub arguments_sha256: Arc<str>,
    /// The parsed arguments' share of the sidecar's budget, held while they are.
    pub held: structure::ArgumentsHeld,
    /// Whether access is decided again on the call (7a, [`access_on_call`]): an entry's
    /// condition reads it.
    pub provisional: bool,
}

/// What the stages saw on the way, kept for records also when a later stage refuses.
#[derive(Default)]
pub(crate) struct Seen<'c> {
    /// The resolved tool, once stage 3 passed.
    pub tool: Option<&'c Arc<ToolVersion>>,
    /// Bound argument paths the model tried to set itself.
    pub override_attempts: Vec<String>,
    /// Every violation listed when a schema refused the call.
    pub violations: Vec<String>,
    /// The rule that refused the call after bind (7a), whose condition read the arguments.
    pub access_rules: Vec<access::Rule>,
    /// The bound arguments such a rule was decided on (7a only).
    pub refused_arguments: Option<Value>,
    /// Every condition evaluated, when the asker traces.
    pub conditions: Vec<Evaluated>,
    /// The steps reached, in order.
    pub steps: super::chain::Steps,
}

/// Runs stages 1–7a for `call`. `shown` is the revision log and the revision the
/// model was shown, when the client says.
#[expect(
    clippy::too_many_arguments,
    reason = "the chain's inputs, each its own concern"
)]
pub(crate) fn decide<'c>(
    limits: &LimitsConfig,
    budget: &structure::ArgumentsBudget,
    catalog: &'c Catalog,
    denies: &EmergencyDenies,
    shown: Option<(&resolve::RevisionLog, &str)>,
    asker: &Asker<'_>,
    call: &CallRequest,
    seen: &mut Seen<'c>,
) -> Result<Decided<'c>, Refusal> {
    let decided = through_bind(limits, budget, catalog, denies, shown, asker, call, seen)?;
    access_on_call(catalog, asker, &decided, seen)?;
    Ok(decided)
}

/// Stages 1–7 (7a apart): the chain asks for that apart ([`access_on_call`]), after what can
/// refuse a call cheaply.
#[expect(
    clippy::too_many_arguments,
    reason = "the chain's inputs, each its own concern"
)]
pub(crate) fn through_bind<'c>(
    limits: &LimitsConfig,
    budget: &structure::ArgumentsBudget,
    catalog: &'c Catalog,
    denies: &EmergencyDenies,
    shown: Option<(&resolve::RevisionLog, &str)>,
    asker: &Asker<'_>,
    call: &CallRequest,
    seen: &mut Seen<'c>,
) -> Result<Decided<'c>, Refusal> {
    let caller = asker.caller;
    // 1-2. Structure: identifiers within limits and printable; a tool name; one JSON object
    // within the size and depth limits.
    seen.steps.reached(Step::Structure);
    structure::check_identifiers(
        &[
            // The client's own, before a blank one is numbered or a long one is cut.
            ("call_id", Some(call.call_id.trim())),
            ("name", Some(&call.name)),
            ("idempotency_key", call.idempotency_key.as_deref()),
            ("approval_id", call.approval_id.as_deref()),
            ("version", call.version.as_deref()),
        ],
        limits,
    )?;
    let (arguments, held) = structure::check(&call.name, &call.arguments_json, limits, budget)?;
    // 3. Tool and version, and whether the model was shown this definition.
    seen.steps.reached(Step::Resolve);
    let tool = resolve::resolve(catalog, &call.name, call.version.as_deref(), caller)?;
    seen.tool = Some(tool);
    if let Some((revisions, shown)) = shown {
        resolve::check_revision(revisions, shown, tool, || {
            super::visibility::current_revision(catalog, denies, caller)
        })?;
    }
    // 4. Allow/deny lists: global, tenant, agent. Provisional when an entry's condition reads
    // the call: decided again after bind (7a).
    seen.steps.reached(Step::Access);
    let listing = Input::listing(caller, tool.facts()).traced(asker.trace);
    let access = access::check(catalog, &listing);
    seen.conditions.extend(listing.take_trace());
    let access::Provisional(provisional) = access?;
    // A sub-agent's handoff: only the tools it allows, and no handoff past the chain's depth.
    access::handoff(catalog, caller, tool)?;
    // An operator's emergency deny, last of access (told only to callers who would see the
    // tool without it: `visibility::as_caller_sees`).
    emergency::check(denies, tool, caller)?;
    // 5. Scopes.
    seen.steps.reached(Step::Scopes);
    scopes::check(caller, tool)?;
    // The model's attempts to set server-bound arguments are recorded whatever refuses the
    // call next: detecting an attack must not depend on the attacker sending valid arguments.
    if let Some(map) = arguments.as_object() {
        seen.override_attempts = bind::attempted(tool, map);
    }
    // 6. Arguments against the visible JSON Schema.
    seen.steps.reached(Step::Schema);
    schema::check_listing(tool, &arguments, &mut seen.violations)?;
    // 7. Server-bound arguments; then the canonical form, which is what is hashed, approved
    // and handed to the backend, byte for byte.
    seen.steps.reached(Step::Bind);
    let mut arguments = bind::apply(tool, caller, arguments)?;
    schema::check_bound_listing(tool, &arguments, &mut seen.violations)?;
    canonical::normalize(&mut arguments);
    let arguments_sha256 = canonical::sha256_hex_shared(&arguments);
    Ok(Decided {
        tool,
        arguments,
        arguments_sha256,
        held,
        provisional,
    })
}

/// 7a. The allow/deny entries whose conditions read the call, on the validated, bound
/// arguments in canonical form: what the quota cost and the approval condition read too
/// (`2500.0` is the integer `2500` for all of them). Apart from the async workers when one of
/// those conditions can take long.
pub(crate) fn access_on_call<'c>(
    catalog: &'c Catalog,
    asker: &Asker<'_>,
    decided: &Decided<'c>,
    seen: &mut Seen<'c>,
) -> Result<(), Refusal> {
    if !decided.provisional {
        return Ok(());
    }
    let (tool, arguments) = (decided.tool, &decided.arguments);
    let (access, trace, rules) = asker.apart.run(catalog.call_conditions_take_long(), || {
        let input = asker.call_input(tool, arguments);
        let access = access::check(catalog, &input);
        // What was evaluated is taken first: naming the rules evaluates them again.
        let trace = input.take_trace();
        let rules = access
            .is_err()
            .then(|| access::explain(catalog, &input).rules);
        (access, trace, rules)
    });
    seen.conditions.extend(trace);
    if let Err(refusal) = access {
        seen.access_rules = rules.unwrap_or_default();
        seen.refused_arguments = Some(arguments.clone());
        return Err(refusal);
    }
    Ok(())
}

/// What an approval of this call is bound to (stage 9).
pub(crate) fn approval_binding(
    caller: &Caller,
    run_id: &str,
    tool: &ToolVersion,
    arguments_sha256: &str,
) -> approvals::Binding {
    approvals::Binding {
        tenant: caller.tenant.to_string(),
        subject: caller.subject.clone(),
        agent: caller.agent.to_string(),
        run_id: run_id.to_owned(),
        tool: tool.name.clone(),
        tool_version: tool.version.to_string(),
        definition_hash: tool.definition_hash.clone(),
        arguments_sha256: arguments_sha256.to_owned(),
    }
}

/// Whose an idempotency key is (stage 10): the caller's, for this tool.
pub(crate) fn idempotency_key(
    caller: &Caller,
    tool: &ToolVersion,
    key: &str,
) -> super::idempotency::Key {
    super::idempotency::Key {
        tenant: caller.tenant.to_string(),
        subject: caller.subject.clone(),
        agent: caller.agent.to_string(),
        tool: tool.name.clone(),
        key: key.to_owned(),
    }
}
