//! Where a permitted call actually runs. Every backend implements [`Executor`], which only takes a
//! [`Permit`] — a value only the boundary's chain can construct — so no code path can run a call
//! that skipped the checks. Deadlines and cancellation reach backends by dropping their future:
//! an HTTP request's connection is closed, a process group is killed, an MCP request is
//! cancelled.

pub mod builtin;
pub mod http;
pub mod mcp;
#[expect(
    unsafe_code,
    reason = "process groups, the child subreaper, pidfds, rlimits and access(2) go through libc"
)]
pub mod process;

use std::{collections::BTreeMap, path::Path, sync::Arc};

use futures::future::BoxFuture;

use crate::{
    boundary::Permit,
    settings::{Env, FieldError, raw::RawExecutor},
};
pub use builtin::{BuiltinTool, Builtins};
pub use http::{HttpExecutor, HttpTool, Upstream};
pub use mcp::{McpManager, McpTool};
pub use process::{ProcessExecutor, ProcessTool};

/// What building a tool's executor needs from the rest of the config.
pub struct BuildContext<'a> {
    pub upstreams: &'a BTreeMap<String, Arc<Upstream>>,
    pub base_dir: &'a Path,
    pub env: &'a Env,
}

/// How a tool runs, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutorSpec {
    Builtin(BuiltinTool),
    Http(HttpTool),
    Process(Arc<ProcessTool>),
    Mcp(McpTool),
}

impl ExecutorSpec {
    pub fn build(
        raw: &RawExecutor,
        path: &str,
        ctx: &BuildContext<'_>,
    ) -> Result<Self, FieldError> {
        match raw {
            RawExecutor {
                builtin: Some(name),
                http: None,
                process: None,
            } => BuiltinTool::from_name(name)
                .map(ExecutorSpec::Builtin)
                .ok_or_else(|| {
                    FieldError::new(
                        format!("{path}.builtin"),
                        format!(
                            "unknown builtin tool {name:?}; known: {}",
                            BuiltinTool::ALL
                                .iter()
                                .map(|b| b.name())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )
                }),
            RawExecutor {
                builtin: None,
                http: Some(http),
                process: None,
            } => http::http_tool(
                ctx.upstreams,
                &http.upstream,
                &http.path,
                &format!("{path}.http"),
            )
            .map(ExecutorSpec::Http),
            RawExecutor {
                builtin: None,
                http: None,
                process: Some(process),
            } => ProcessTool::build(process, &format!("{path}.process"), ctx.base_dir, ctx.env)
                .map(|p| ExecutorSpec::Process(Arc::new(p))),
            RawExecutor {
                builtin: None,
                http: None,
                process: None,
            } => Err(FieldError::new(
                path,
                "names no executor; set one of builtin, http or process",
            )),
            _ => Err(FieldError::new(
                path,
                "names more than one executor; set exactly one of builtin, http or process",
            )),
        }
    }

    /// The kind of backend, for spans (`gen_ai.tool.type`) and audit.
    pub fn kind(&self) -> &'static str {
        match self {
            ExecutorSpec::Builtin(_) => "builtin",
            ExecutorSpec::Http(_) => "http",
            ExecutorSpec::Process(_) => "process",
            ExecutorSpec::Mcp(_) => "mcp",
        }
    }

    /// Whether a call leaves the sidecar's process (a request or a child process), and so is
    /// worth a CLIENT span of its own and a `traceparent` to pass on.
    pub fn leaves_process(&self) -> bool {
        !matches!(self, ExecutorSpec::Builtin(_))
    }
}

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
    fn execute<'a>(&'a self, permit: &'a Permit) -> BoxFuture<'a, Result<String, ExecError>>;
}

/// All backends of one server.
#[derive(Clone, Default)]
pub struct Executors {
    pub builtins: Arc<Builtins>,
    pub http: Arc<HttpExecutor>,
    pub process: Arc<ProcessExecutor>,
    pub mcp: Arc<McpManager>,
}

impl Executors {
    pub fn for_spec(&self, spec: &ExecutorSpec) -> &dyn Executor {
        match spec {
            ExecutorSpec::Builtin(_) => self.builtins.as_ref(),
            ExecutorSpec::Http(_) => self.http.as_ref(),
            ExecutorSpec::Process(_) => self.process.as_ref(),
            ExecutorSpec::Mcp(_) => self.mcp.as_ref(),
        }
    }
}
