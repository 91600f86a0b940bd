//! What a tool runs on, as plain data: which backend, and what the executors need to run it (a
//! builtin's name, an upstream's *name* and the URL under it, a program, an MCP server and
//! tool). Nothing here connects or holds a connection: the live clients are the executors',
//! looked up by these names (`executor::Executors`), so a catalog can be built, compared and
//! dropped without touching them.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
};

use serde_json::Value;
use url::Url;

pub use super::http_request::{BuiltRequest, MappingError, RequestMapping};
use crate::settings::{
    Env, FieldError, check_url, program_path,
    raw::{RawA2aExecutor, RawExecutor, RawHttpExecutor, RawProcessExecutor},
    resolve_path, runnable,
};

/// What building a tool's backend needs from the rest of the config.
pub struct BackendContext<'a> {
    /// Each upstream's base URL, by name (validated with the upstream).
    pub upstreams: &'a BTreeMap<String, Url>,
    /// Each upstream's configured header names, by upstream name: arguments may not set them.
    pub upstream_headers: BTreeMap<&'a str, BTreeSet<String>>,
    pub base_dir: &'a Path,
    pub env: &'a Env,
}

impl BackendContext<'_> {
    /// The base URL of the upstream a tool at `at` names.
    fn upstream(&self, name: &str, at: &str) -> Result<&Url, FieldError> {
        self.upstreams.get(name).ok_or_else(|| {
            FieldError::new(
                format!("{at}.upstream"),
                format!(
                    "unknown upstream {name:?}; configured: {}",
                    self.upstreams
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
    }
}

/// How a tool runs, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSpec {
    Builtin(BuiltinTool),
    Http(Arc<HttpTarget>),
    Process(Arc<ProcessSpec>),
    Mcp(McpTarget),
    A2a(Arc<A2aTarget>),
}

impl BackendSpec {
    /// A tool's backend; `input_schema` is the tool's (an HTTP tool's request is checked
    /// against it).
    pub fn build(
        raw: &RawExecutor,
        input_schema: &Value,
        path: &str,
        ctx: &BackendContext<'_>,
    ) -> Result<Self, FieldError> {
        let RawExecutor {
            builtin,
            http,
            process,
            a2a,
        } = raw;
        let set = [
            builtin.is_some(),
            http.is_some(),
            process.is_some(),
            a2a.is_some(),
        ];
        match set.iter().filter(|s| **s).count() {
            0 => {
                return Err(FieldError::new(
                    path,
                    "names no executor; set one of builtin, http, process or a2a",
                ));
            }
            1 => {}
            _ => {
                return Err(FieldError::new(
                    path,
                    "names more than one executor; set exactly one of builtin, http, process or a2a",
                ));
            }
        }
        if let Some(name) = builtin {
            return BuiltinTool::from_name(name)
                .map(BackendSpec::Builtin)
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
                });
        }
        if let Some(http) = http {
            return HttpTarget::build(ctx, http, input_schema, &format!("{path}.http"))
                .map(|target| BackendSpec::Http(Arc::new(target)));
        }
        if let Some(a2a) = a2a {
            return A2aTarget::build(ctx, a2a, input_schema, &format!("{path}.a2a"))
                .map(|target| BackendSpec::A2a(Arc::new(target)));
        }
        match process {
            Some(process) => {
                ProcessSpec::build(process, &format!("{path}.process"), ctx.base_dir, ctx.env)
                    .map(|p| BackendSpec::Process(Arc::new(p)))
            }
            None => Err(FieldError::new(path, "names no executor")),
        }
    }

    /// The kind of backend, for spans (`gen_ai.tool.type`) and audit.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendSpec::Builtin(_) => "builtin",
            BackendSpec::Http(_) => "http",
            BackendSpec::Process(_) => "process",
            BackendSpec::Mcp(_) => "mcp",
            BackendSpec::A2a(_) => "a2a",
        }
    }

    /// Whether a call leaves the sidecar's process (a request or a child process), and so is
    /// worth a CLIENT span of its own and a `traceparent` to pass on.
    pub fn leaves_process(&self) -> bool {
        !matches!(self, BackendSpec::Builtin(_))
    }
}

/// The builtin tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltinTool {
    Echo,
    EchoArguments,
    RagSearch,
    QueryTicket,
    CreateTicket,
    DeleteTicket,
    RefundOrder,
    SlowTask,
    /// Panics inside the sidecar (test builds only): a bug in one call must stay in that call.
    #[cfg(feature = "test-faults")]
    Panic,
}

impl BuiltinTool {
    pub const ALL: &'static [BuiltinTool] = &[
        #[cfg(feature = "test-faults")]
        BuiltinTool::Panic,
        BuiltinTool::Echo,
        BuiltinTool::EchoArguments,
        BuiltinTool::RagSearch,
        BuiltinTool::QueryTicket,
        BuiltinTool::CreateTicket,
        BuiltinTool::DeleteTicket,
        BuiltinTool::RefundOrder,
        BuiltinTool::SlowTask,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BuiltinTool::Echo => "echo",
            BuiltinTool::EchoArguments => "echo_arguments",
            BuiltinTool::RagSearch => "rag_search",
            BuiltinTool::QueryTicket => "query_ticket",
            BuiltinTool::CreateTicket => "create_ticket",
            BuiltinTool::DeleteTicket => "delete_ticket",
            BuiltinTool::RefundOrder => "refund_order",
            BuiltinTool::SlowTask => "slow_task",
            #[cfg(feature = "test-faults")]
            BuiltinTool::Panic => "panic",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|b| b.name() == name)
    }
}

/// An HTTP tool: which upstream (by name), its URL, and how arguments become the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpTarget {
    pub upstream: String,
    /// The upstream's URL: the request's path and query are built under it.
    pub url: Url,
    pub request: RequestMapping,
}

impl HttpTarget {
    /// A tool's request under a configured upstream; its path must stay on the upstream's
    /// origin.
    pub fn build(
        ctx: &BackendContext<'_>,
        raw: &RawHttpExecutor,
        input_schema: &Value,
        at: &str,
    ) -> Result<Self, FieldError> {
        let upstream = &raw.upstream;
        let base = ctx.upstream(upstream, at)?;
        let static_headers = ctx
            .upstream_headers
            .get(upstream.as_str())
            .cloned()
            .unwrap_or_default();
        let request = RequestMapping::build(raw, input_schema, &static_headers, at)?;
        // With each slot as one plain segment, the path stays on the upstream's origin.
        let sample = request.path_template().replace(['{', '}'], "");
        url_under(base, &sample, &format!("{at}.path"))?;
        Ok(HttpTarget {
            upstream: upstream.to_owned(),
            url: base.clone(),
            request,
        })
    }
}

/// An A2A tool: the agent an upstream serves, where its card is, and what the message says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct A2aTarget {
    pub upstream: String,
    /// The agent's card, on the upstream's origin.
    pub card_url: Url,
    /// The string argument that is the message's text; `None`: the arguments as JSON text.
    pub message_argument: Option<String>,
}

/// Where an agent's card is unless the tool says otherwise (A2A 1.0's well-known path).
pub const DEFAULT_CARD_PATH: &str = "/.well-known/agent-card.json";

impl A2aTarget {
    pub fn build(
        ctx: &BackendContext<'_>,
        raw: &RawA2aExecutor,
        input_schema: &Value,
        at: &str,
    ) -> Result<Self, FieldError> {
        let upstream = &raw.upstream;
        let base = ctx.upstream(upstream, at)?;
        let card_path = raw.card_path.as_deref().unwrap_or(DEFAULT_CARD_PATH);
        let card_url = url_under(base, card_path, &format!("{at}.card_path"))?;
        if let Some(argument) = &raw.message_argument {
            let declared = input_schema
                .pointer(&format!("/properties/{argument}/type"))
                .and_then(Value::as_str);
            if declared != Some("string") {
                return Err(FieldError::new(
                    format!("{at}.message_argument"),
                    format!("{argument:?} must be a string property of the tool's input_schema"),
                ));
            }
        }
        Ok(A2aTarget {
            upstream: upstream.to_owned(),
            card_url,
            message_argument: raw.message_argument.clone(),
        })
    }
}

fn url_under(base: &Url, path: &str, at: &str) -> Result<Url, FieldError> {
    if path.is_empty() {
        return Ok(base.clone());
    }
    let joined = format!(
        "{}/{}",
        base.as_str().trim_end_matches('/'),
        path.trim_start_matches('/')
    );
    let url = Url::parse(&joined)
        .map_err(|err| FieldError::new(at, format!("invalid path {path:?}: {err}")))?;
    if url.origin() != base.origin() {
        return Err(FieldError::new(
            at,
            "the path must stay on the upstream's host",
        ));
    }
    check_url(&url, at)?;
    Ok(url)
}

/// A configured process tool: the program, its arguments and environment, resolved at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    /// The program: a path, or a name found on the program's PATH at load (kept as written when
    /// it was not found, so the error names it).
    pub command: PathBuf,
    pub args: Vec<String>,
    /// The program's whole environment, resolved at load.
    pub env: BTreeMap<String, String>,
    pub working_dir: PathBuf,
    pub max_stderr_bytes: usize,
    /// Where in the catalog it is configured, for operators' messages.
    pub at: String,
}

impl ProcessSpec {
    pub fn build(
        raw: &RawProcessExecutor,
        at: &str,
        base_dir: &Path,
        env: &Env,
    ) -> Result<Self, FieldError> {
        if raw.command.trim().is_empty() {
            return Err(FieldError::new(
                format!("{at}.command"),
                "must not be blank",
            ));
        }
        let mut program_env = BTreeMap::new();
        for name in &raw.env {
            if let Some(value) = env.get(name) {
                program_env.insert(name.clone(), value.to_owned());
            }
        }
        program_env.extend(raw.set_env.clone());
        let working_dir = raw
            .working_dir
            .as_deref()
            .map(|dir| resolve_path(base_dir, dir))
            .unwrap_or_else(|| base_dir.to_path_buf());
        // The program's own PATH finds a bare name, else the sidecar's (as before).
        let search = program_env
            .get("PATH")
            .map(String::as_str)
            .or_else(|| env.get("PATH"));
        Ok(ProcessSpec {
            command: program_path(&raw.command, base_dir, search),
            args: raw.args.clone(),
            env: program_env,
            working_dir,
            max_stderr_bytes: raw.max_stderr_bytes.unwrap_or(2048),
            at: at.to_owned(),
        })
    }

    /// What about this tool cannot work on this machine: the program is missing or not
    /// executable, the working directory is not a directory. Not load errors, because a catalog
    /// may be checked on another machine than the one that serves it (`toolgate check
    /// --portable`) and a program may be installed after the catalog is loaded.
    pub fn host_problems(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if let Err(why) = runnable(&self.command) {
            problems.push(FieldError::new(
                format!("{}.command", self.at),
                why.to_string(),
            ));
        }
        if !self.working_dir.is_dir() {
            problems.push(FieldError::new(
                format!("{}.working_dir", self.at),
                format!("{} is not a directory", self.working_dir.display()),
            ));
        }
        problems
    }
}

/// Which MCP server and which of its tools a catalog entry runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpTarget {
    pub server: String,
    pub tool: String,
}

/// An MCP server as the catalog knows it: its name, and the prefix its tools' names take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpSource {
    pub name: String,
    pub prefix: String,
}

/// A tool a server listed: what the model will see of it, and what a pin covers besides
/// (`catalog::pins`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DiscoveredTool {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub output_schema: Option<Value>,
    pub annotations: Option<Value>,
}

/// Server name -> the tools it offers that the catalog names; absent while it is not connected.
pub type Discovered = BTreeMap<String, Vec<DiscoveredTool>>;
