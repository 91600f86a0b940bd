//! Where a permitted call actually runs. Every backend implements [`Executor`], which only takes a
//! [`Permit`] — a value only the boundary's chain can construct — so no code path can run a call
//! that skipped the checks. Deadlines and cancellation reach backends by dropping their future.

pub mod builtin;

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::{boundary::Permit, config::FieldError, config::raw::RawExecutor};
pub use builtin::{BuiltinTool, Builtins};

/// How a tool runs, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutorSpec {
    Builtin(BuiltinTool),
}

impl ExecutorSpec {
    pub fn build(raw: &RawExecutor, path: &str) -> Result<Self, FieldError> {
        match raw {
            RawExecutor {
                builtin: Some(name),
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
            RawExecutor { builtin: None } => Err(FieldError::new(
                path,
                "names no executor; set e.g. builtin: echo",
            )),
        }
    }

    /// The kind of backend, for spans (`gen_ai.tool.type`) and audit.
    pub fn kind(&self) -> &'static str {
        match self {
            ExecutorSpec::Builtin(_) => "builtin",
        }
    }
}

/// A backend failure, before the boundary turns it into a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// The tool ran and reported a failure; the message is safe to show the model.
    #[error("{0}")]
    Failed(String),
    /// The backend could not be reached or answered with a transient failure.
    #[error("{0}")]
    Unavailable(String),
}

/// A backend that runs permitted calls and returns their output text.
pub trait Executor: Send + Sync {
    fn execute<'a>(&'a self, permit: &'a Permit) -> BoxFuture<'a, Result<String, ExecError>>;
}

/// All backends of one server.
#[derive(Clone, Default)]
pub struct Executors {
    pub builtins: Arc<Builtins>,
}

impl Executors {
    pub fn for_spec(&self, spec: &ExecutorSpec) -> &dyn Executor {
        match spec {
            ExecutorSpec::Builtin(_) => self.builtins.as_ref(),
        }
    }
}
