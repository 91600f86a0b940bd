//! What a caller's model may see: the catalog resolved for its tenant, allowed, and within its
//! scopes — the one definition ListTools, `toolgate explain --list` and the shown-revision check
//! share — and the revision of exactly that.

use std::sync::Arc;

use super::{Boundary, access, emergency, resolve, resolve::Definitions, scopes};
use crate::{
    catalog::{Catalog, ToolVersion, revision_of},
    conditions::{CallerValue, Input},
    emergency::EmergencyDenies,
    error::{Reason, Refusal, Stage},
    identity::Caller,
};

impl Boundary {
    /// The tools this caller's model may see, sorted by name, and their revision.
    pub fn list_tools(&self, caller: &Caller) -> (Vec<Arc<ToolVersion>>, String) {
        let state = self.state.load();
        let visible = visible_tools(&state.catalog, &self.emergency, caller);
        let revision = revision_of(visible.iter().map(|t| t.as_ref()));
        self.revisions.record(&revision, || definitions(&visible));
        (visible, revision)
    }
}

/// The tools a caller may see: resolved for its tenant, allowed, within its scopes, and not
/// stopped by an emergency deny.
pub(super) fn visible_tools(
    catalog: &Catalog,
    denies: &EmergencyDenies,
    caller: &Caller,
) -> Vec<Arc<ToolVersion>> {
    // The caller's value is made once for the whole catalog, not once per tool.
    let shared = CallerValue::default();
    catalog
        .names()
        .filter_map(|name| visibility_sharing(catalog, Some(denies), caller, name, &shared).ok())
        .cloned()
        .collect()
}

/// Whether a caller's model sees `name` (the version it would see), or the refusal of the first
/// of resolve, access and scopes that hides it (an emergency deny last). The one definition of
/// visibility: ListTools and `toolgate explain --list` both use it.
pub(crate) fn visibility<'c>(
    catalog: &'c Catalog,
    denies: &EmergencyDenies,
    caller: &Caller,
    name: &str,
) -> Result<&'c Arc<ToolVersion>, Refusal> {
    visibility_sharing(catalog, Some(denies), caller, name, &CallerValue::default())
}

/// [`visibility`], the caller's value for conditions taken from (or made into) `shared`;
/// without `denies`, what the caller would see were no emergency deny in force.
fn visibility_sharing<'c>(
    catalog: &'c Catalog,
    denies: Option<&EmergencyDenies>,
    caller: &Caller,
    name: &str,
    shared: &CallerValue,
) -> Result<&'c Arc<ToolVersion>, Refusal> {
    let tool = resolve::resolve(catalog, name, None, caller)?;
    // Entries whose conditions read the call are provisional here: such a tool is listed, and
    // its calls are decided after bind.
    access::check(
        catalog,
        &Input::listing_sharing(caller, tool.facts(), shared),
    )?;
    access::handoff(catalog, caller, tool)?;
    if let Some(denies) = denies {
        emergency::check(denies, tool, caller)?;
    }
    scopes::check(caller, tool)?;
    Ok(tool)
}

/// Whether `refusal` (of a call of `name`) would tell the caller about a tool it cannot see: a
/// refusal of resolve, access or scopes for a tool hidden from it.
fn reveals_hidden_tool(
    catalog: &Catalog,
    denies: &EmergencyDenies,
    caller: &Caller,
    name: &str,
    refusal: &Refusal,
) -> bool {
    matches!(refusal.stage, Stage::Resolve | Stage::Access | Stage::Scopes)
        // Unknown already; unavailable to everyone (its backend is down, or its definition
        // changed from its pin), which tells the
        // caller nothing about its access and says when to retry; or a tenant the catalog does
        // not know, which sees nothing and is told so.
        && !matches!(
            refusal.reason,
            Reason::ToolNotFound
                | Reason::ToolUnavailable
                | Reason::DefinitionChanged
                | Reason::TenantUnknown
                // Decided after the lists admitted the tool: the person may use it, the
                // sub-agent's handoff does not let it (docs/handoff.md).
                | Reason::HandoffNotAllowed
                | Reason::HandoffTooDeep
        )
        // An emergency deny is told only to a caller that would see the tool without it.
        && match refusal.reason {
            Reason::EmergencyDenied => {
                visibility_sharing(catalog, None, caller, name, &CallerValue::default()).is_err()
            }
            _ => visibility(catalog, denies, caller, name).is_err(),
        }
}

/// The refusal a caller is given: a tool hidden from it (by its tenant's or agent's rules, its
/// scopes, or a version it may not use) is refused exactly as a tool that does not exist, so
/// no refusal tells it what exists. Why it was hidden stays in the record (audit, spans), never
/// in what the caller or the model reads. ExplainTool, for those allowed to ask, tells all.
pub(crate) fn as_caller_sees(
    catalog: &Catalog,
    denies: &EmergencyDenies,
    caller: &Caller,
    name: &str,
    refusal: Refusal,
) -> Refusal {
    if !reveals_hidden_tool(catalog, denies, caller, name, &refusal) {
        return refusal;
    }
    let mut unknown = resolve::unknown_tool(name);
    unknown.recorded_detail = Some(format!(
        "hidden from this caller: {}",
        refusal.text_for_record()
    ));
    unknown
}

pub(super) fn definitions(visible: &[Arc<ToolVersion>]) -> Definitions {
    visible
        .iter()
        .map(|t| (t.name.clone(), t.definition_hash.clone()))
        .collect()
}

pub(super) fn current_revision(
    catalog: &Catalog,
    denies: &EmergencyDenies,
    caller: &Caller,
) -> (String, Definitions) {
    let visible = visible_tools(catalog, denies, caller);
    (
        revision_of(visible.iter().map(|t| t.as_ref())),
        definitions(&visible),
    )
}
