//! Where a permitted call actually runs. Every backend implements [`Executor`], which only takes a
//! [`Permit`] — a value only the boundary's chain can construct — so no code path can run a call
//! that skipped the checks. Deadlines and cancellation reach backends by dropping their future:
//! an HTTP request's connection is closed, a process group is killed, an MCP request is
//! cancelled.
//!
//! The catalog names backends as plain data ([`crate::catalog::BackendSpec`]); the live clients
//! they run on are here, in [`Executors`]. A new kind of backend is a variant there with its
//! spec, a folder here with its [`Executor`], and its arm in [`Executors::for_backend`].

pub mod a2a;
pub mod builtin;
pub mod http;
pub mod mcp;
#[expect(
    unsafe_code,
    reason = "process groups, the child subreaper, pidfds, rlimits and access(2) go through libc"
)]
pub mod process;

use std::{collections::BTreeMap, sync::Arc};

use futures::future::BoxFuture;

use crate::{boundary::Permit, catalog::BackendSpec};
pub use builtin::Builtins;
pub use http::{HttpExecutor, Upstream};
pub use mcp::McpManager;
pub use process::ProcessExecutor;

/// A backend failure, before the boundary turns it into a result. Messages are toolgate's own
/// words and are shown to the model: no addresses, paths or internals. Text a backend wrote itself
/// (stderr, an error body, an MCP error) travels separately as `detail`, because it may echo
/// argument values: it reaches the model, but audit events and spans carry it only for tools that
/// record their arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// The tool ran and reported a failure.
    #[error("{message}")]
    Failed {
        message: String,
        detail: Option<String>,
    },
    /// A transient failure after the request may have reached the backend: retryable for
    /// read-only tools, an unknown outcome for the others.
    #[error("{0}")]
    Unavailable(String),
    /// A transient failure before anything reached the backend (connection refused, server not
    /// connected): the call did not start, so an approval it redeems is not used up.
    #[error("{0}")]
    NotReached(String),
    /// The backend is at its concurrency cap; nothing was sent.
    #[error("{0}")]
    Overloaded(String),
    /// The destination is not one this backend may reach (SSRF protection); nothing was sent.
    #[error("{0}")]
    Refused(String),
    /// The tool's configuration cannot work (a missing program, an unusable working directory or
    /// URL): an operator must fix it, so retrying is pointless. Nothing was started.
    #[error("{0}")]
    Misconfigured(String),
    /// The backend's output is over the tool's limit.
    #[error("{0}")]
    OutputTooLarge(String),
    /// No credential for the backend could be had (its token endpoint down, slow, or answering
    /// nonsense): retryable, and the backend was not called.
    #[error("{0}")]
    CredentialsUnavailable(String),
    /// The token endpoint refused this caller a credential for the backend (or the caller's
    /// token may not be passed on): not retryable, and the backend was not called.
    #[error("{0}")]
    CredentialsRefused(String),
    /// The arguments cannot be sent as the tool's request mapping asks (a path segment that
    /// would move the path, a header value with a line break): nothing was sent.
    #[error("{0}")]
    BadArguments(String),
}

impl From<crate::credentials::CredentialError> for ExecError {
    fn from(err: crate::credentials::CredentialError) -> Self {
        use crate::credentials::CredentialError;
        match err {
            CredentialError::Unavailable(m) => ExecError::CredentialsUnavailable(m),
            CredentialError::Refused(m) => ExecError::CredentialsRefused(m),
            CredentialError::Misconfigured(m) => ExecError::Misconfigured(m),
        }
    }
}

impl ExecError {
    /// A failure reported by the tool, in toolgate's words only.
    pub fn failed(message: impl Into<String>) -> Self {
        ExecError::Failed {
            message: message.into(),
            detail: None,
        }
    }

    /// A failure reported by the tool, with the backend's own text.
    pub fn failed_with(message: impl Into<String>, detail: impl Into<String>) -> Self {
        let detail = detail.into();
        ExecError::Failed {
            message: message.into(),
            detail: Some(detail).filter(|d| !d.trim().is_empty()),
        }
    }

    /// Whether a transient failure came after the request may have reached the backend (a 5xx
    /// answer, a connection that broke after sending, an MCP call whose connection closed): the
    /// backend may have acted on it, so for a tool that writes the outcome is unknown and a retry
    /// could write twice. Only failures that provably reached nothing ([`ExecError::NotReached`])
    /// are safe to repeat.
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, ExecError::Unavailable(_))
    }

    /// Whether the request may have reached the backend, so its effects are unknown.
    pub fn reached_backend(&self) -> bool {
        matches!(
            self,
            ExecError::Failed { .. } | ExecError::Unavailable(_) | ExecError::OutputTooLarge(_)
        )
    }
}

/// A backend that runs permitted calls and returns their output text.
pub trait Executor: Send + Sync {
    /// When the backend takes a per-call credential: fetches it onto the permit, sending
    /// nothing to the backend. The boundary runs it before the call is started (before an
    /// approval is spent), so a slow token endpoint is a refusal, not an unknown outcome;
    /// `execute` uses the credential on the permit (and fetches one itself if none is there).
    /// `None` (nothing to fetch) costs a call nothing.
    fn authenticate<'a>(
        &'a self,
        _permit: &'a Permit,
    ) -> Option<BoxFuture<'a, Result<(), ExecError>>> {
        None
    }

    fn execute<'a>(&'a self, permit: &'a Permit) -> BoxFuture<'a, Result<String, ExecError>>;
}

/// The registry of live backends a catalog's plain specs run on: one executor per kind of
/// backend, each owning its clients (the upstreams' HTTP clients and slots, the MCP servers'
/// connections, the builtins' state). One is kept with each catalog, so a call runs on the
/// clients of the catalog it was decided under; a reload makes the next one from the last
/// ([`Executors::with_upstreams`]), carrying over what lives across catalogs.
#[derive(Clone, Default)]
pub struct Executors {
    pub builtins: Arc<Builtins>,
    pub http: Arc<HttpExecutor>,
    pub process: Arc<ProcessExecutor>,
    pub mcp: Arc<McpManager>,
}

impl Executors {
    pub fn for_backend(&self, spec: &BackendSpec) -> &dyn Executor {
        match spec {
            BackendSpec::Builtin(_) => self.builtins.as_ref(),
            BackendSpec::Http(_) | BackendSpec::A2a(_) => self.http.as_ref(),
            BackendSpec::Process(_) => self.process.as_ref(),
            BackendSpec::Mcp(_) => self.mcp.as_ref(),
        }
    }

    /// The same executors on a new set of upstreams (a reloaded catalog file's), which take over
    /// the slots of requests in flight from the upstreams they replace.
    pub fn with_upstreams(&self, upstreams: BTreeMap<String, Upstream>) -> Self {
        Executors {
            http: Arc::new(self.http.succeeded_by(upstreams)),
            ..self.clone()
        }
    }
}
