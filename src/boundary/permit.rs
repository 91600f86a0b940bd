//! The [`Permit`]: proof that a call passed every stage of the boundary. Only this module's parent
//! can construct one, and executors take nothing else.

use std::sync::Arc;

use serde_json::Value;

use crate::{
    catalog::ToolVersion,
    credentials::{Credential, CredentialUsed},
    identity::Caller,
};

/// A call the boundary decided may run, with its final (bound) arguments.
#[derive(Debug)]
pub struct Permit {
    call_id: Arc<str>,
    run_id: Arc<str>,
    tool: Arc<ToolVersion>,
    caller: Arc<Caller>,
    arguments: Value,
    /// W3C trace context to carry to the backend. (Boxed strings, here and below: every
    /// call's future holds a permit.)
    traceparent: Option<Box<str>>,
    /// The credential the backend is called with: fetched before the call is started, kept for
    /// the executor and (by what it names) the call's records.
    credential: std::sync::OnceLock<Arc<Credential>>,
    /// For a handoff tool: the delegation token its backend hands the sub-agent.
    delegation: std::sync::OnceLock<Box<DelegationToken>>,
    /// Private: nothing outside `boundary` can build a permit.
    _sealed: Sealed,
}

#[derive(Debug)]
struct Sealed;

/// A handoff's signed delegation (boxed whole: a thin pointer in every call's permit).
struct DelegationToken(String);

impl std::fmt::Debug for DelegationToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A bearer credential: never printed.
        f.write_str("DelegationToken(..)")
    }
}

impl Permit {
    pub(super) fn new(
        call_id: Arc<str>,
        run_id: Arc<str>,
        tool: Arc<ToolVersion>,
        caller: Arc<Caller>,
        arguments: Value,
    ) -> Self {
        Permit {
            call_id,
            run_id,
            tool,
            caller,
            arguments,
            traceparent: None,
            credential: std::sync::OnceLock::new(),
            delegation: std::sync::OnceLock::new(),
            _sealed: Sealed,
        }
    }

    /// Set as the backend is called, from the span made for that.
    pub(super) fn set_traceparent(&mut self, traceparent: Option<String>) {
        self.traceparent = traceparent.map(String::into_boxed_str);
    }

    /// The W3C `traceparent` for outbound requests, when the call is traced.
    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    pub fn call_id(&self) -> &str {
        &self.call_id
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    pub fn tool(&self) -> &ToolVersion {
        &self.tool
    }

    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// Keeps the credential the backend is called with (its executor fetched it), for the
    /// executor and the call's span and audit event, which name it, never the token.
    pub fn record_credential(&self, credential: Arc<Credential>) {
        let _ = self.credential.set(credential);
    }

    /// The credential the backend is called with, if one was fetched.
    pub fn issued_credential(&self) -> Option<&Credential> {
        self.credential.get().map(Arc::as_ref)
    }

    /// What names the credential the backend was called with, if one was fetched.
    pub fn credential(&self) -> Option<&Arc<CredentialUsed>> {
        self.credential.get().map(|c| &c.used)
    }

    /// Keeps the delegation token issued for this handoff call.
    pub(super) fn set_delegation(&self, token: String) {
        let _ = self.delegation.set(Box::new(DelegationToken(token)));
    }

    /// For a handoff tool's call: the delegation token its backend passes to the sub-agent
    /// (a header, the A2A message's metadata), never to the model.
    pub fn delegation(&self) -> Option<&str> {
        self.delegation.get().map(|t| t.0.as_str())
    }

    /// The arguments after validation and binding: what the backend receives.
    pub fn arguments(&self) -> &Value {
        &self.arguments
    }
}
