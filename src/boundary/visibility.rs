//! What a caller's model may see: the catalog resolved for its tenant, allowed, and within its
//! scopes — the one definition ListTools, `toolgate explain --list` and the shown-revision check
//! share — and the revision of exactly that.

use std::sync::Arc;

use super::{Boundary, access, resolve, resolve::Definitions, scopes};
use crate::{
    catalog::{Catalog, ToolVersion, revision_of},
    error::Refusal,
    identity::Caller,
};

impl Boundary {
    /// The tools this caller's model may see, sorted by name, and their revision.
    pub fn list_tools(&self, caller: &Caller) -> (Vec<Arc<ToolVersion>>, String) {
        let state = self.state.load();
        let visible = visible_tools(&state.catalog, caller);
        let revision = revision_of(visible.iter().map(|t| t.as_ref()));
        self.revisions.record(&revision, || definitions(&visible));
        (visible, revision)
    }
}

/// The tools a caller may see: resolved for its tenant, allowed, and within its scopes.
pub(super) fn visible_tools(catalog: &Catalog, caller: &Caller) -> Vec<Arc<ToolVersion>> {
    catalog
        .names()
        .filter_map(|name| visibility(catalog, caller, name).ok())
        .cloned()
        .collect()
}

/// Whether a caller's model sees `name` (the version it would see), or the refusal of the first
/// of resolve, access and scopes that hides it. The one definition of visibility: ListTools and
/// `toolgate explain --list` both use it.
pub(crate) fn visibility<'c>(
    catalog: &'c Catalog,
    caller: &Caller,
    name: &str,
) -> Result<&'c Arc<ToolVersion>, Refusal> {
    let tool = resolve::resolve(catalog, name, None, caller)?;
    access::check(catalog, caller, &tool.name)?;
    scopes::check(caller, tool)?;
    Ok(tool)
}

pub(super) fn definitions(visible: &[Arc<ToolVersion>]) -> Definitions {
    visible
        .iter()
        .map(|t| (t.name.clone(), t.definition_hash.clone()))
        .collect()
}

pub(super) fn current_revision(catalog: &Catalog, caller: &Caller) -> (String, Definitions) {
    let visible = visible_tools(catalog, caller);
    (
        revision_of(visible.iter().map(|t| t.as_ref())),
        definitions(&visible),
    )
}
