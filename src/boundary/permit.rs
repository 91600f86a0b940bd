//! The [`Permit`]: proof that a call passed every stage of the boundary. Only this module's parent
//! can construct one, and executors take nothing else.

use std::sync::Arc;

use serde_json::Value;

use crate::{catalog::ToolVersion, credentials::CredentialUsed, identity::Caller};

/// A call the boundary decided may run, with its final (bound) arguments.
#[derive(Debug)]
pub struct Permit {
    call_id: Arc<str>,
    run_id: Arc<str>,
    tool: Arc<ToolVersion>,
    caller: Arc<Caller>,
    arguments: Value,
    /// W3C trace context to carry to the backend.
    traceparent: Option<String>,
    /// The credential the executor called the backend with, for the call's records.
    credential: std::sync::OnceLock<Arc<CredentialUsed>>,
    /// Private: nothing outside `boundary` can build a permit.
    _sealed: Sealed,
}

#[derive(Debug)]
struct Sealed;

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
            _sealed: Sealed,
        }
    }

    /// Set as the backend is called, from the span made for that.
    pub(super) fn set_traceparent(&mut self, traceparent: Option<String>) {
        self.traceparent = traceparent;
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

    /// Records which credential the backend is called with (the executor says so once it has
    /// one), for the call's span and audit event; never the token.
    pub fn record_credential(&self, used: Arc<CredentialUsed>) {
        let _ = self.credential.set(used);
    }

    /// The credential the backend was called with, if the executor recorded one.
    pub fn credential(&self) -> Option<&Arc<CredentialUsed>> {
        self.credential.get()
    }

    /// The arguments after validation and binding: what the backend receives.
    pub fn arguments(&self) -> &Value {
        &self.arguments
    }
}
