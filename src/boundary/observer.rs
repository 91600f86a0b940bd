//! Who is told of each call the chain finished. The boundary publishes and does not know who
//! listens: the shadow catalog's worker (`crate::shadow`, a floor above) is one, registered by
//! the server at start.

use super::{CallRequest, CallTrail, Turn};
use crate::outcome::CallOutcome;

/// Told of every call whose result is decided, before the result is returned.
pub(crate) trait CallObserver: Send + Sync {
    /// Whether it would take a call now; when not, the call's request is not copied for it.
    fn wants_calls(&self) -> bool;

    /// A finished call. Must not wait: the caller's response waits on it.
    fn finished(&self, call: FinishedCall<'_>);
}

/// A call the chain finished, as an observer sees it.
pub(crate) struct FinishedCall<'a> {
    pub turn: &'a Turn,
    /// Its position in the turn's batch.
    pub index: usize,
    /// The request as the client sent it (the tool name as reported).
    pub request: CallRequest,
    pub outcome: &'a CallOutcome,
    pub trail: &'a CallTrail,
}
