//! The command line: the clap types of every verb and the dispatch to the file that runs it.
//! `serve` (the default, `serve.rs`), `check` (`check.rs`), `schema` (`schema.rs`), `test` (a
//! catalog's test cases, `test_runner.rs`), `shadow-report` (`shadow_report.rs`), and the
//! operator client verbs that talk to a running sidecar: `tools`, `call`, `approvals`, `approve`,
//! `reject` (`client_verbs.rs`) and `explain` (`explain.rs`), reaching it through `client.rs`; and
//! `mcp-stdio` (`mcp_stdio.rs`), a stdio MCP server forwarding to a sidecar's MCP door. The signal
//! dispositions set at start-up are in `signals.rs`; once `serve` serves, `start_up_pages.rs`
//! lets go of the executable's pages only start-up read.
//!
//! Exit codes: 0 success; 1 failure (bad config, cannot start, transport error); 2 usage error;
//! 4 the tool call returned (or, for `explain`, would return) a status other than OK. Every verb
//! returns `Result<(), Failure>`, and [`Failure`] alone says what is printed on stderr and which
//! code the process exits with.

mod check;
mod client;
mod client_verbs;
mod controls;
mod explain;
mod import;
mod mcp_stdio;
mod pin;
mod schema;
mod serve;
pub mod shadow_report;
#[expect(
    unsafe_code,
    reason = "libc::signal: the dispositions of SIGPIPE and SIGXFSZ have no safe setter in std"
)]
mod signals;
mod start_up_pages;
pub mod test_runner;

use std::{path::PathBuf, process::ExitCode};

use clap::{ArgGroup, Args, Parser, Subcommand};

use crate::{config::Config, proto, settings::Env, telemetry::LogFormat};

#[derive(Debug, Parser)]
#[command(
    name = "toolgate",
    version,
    about = "gRPC sidecar that decides, runs and audits an AI agent's tool calls"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

/// Where `toolgate import` reads tools from.
#[derive(Debug, Subcommand)]
enum ImportSource {
    /// An OpenAPI 3.0 or 3.1 description (JSON or YAML): each chosen operation becomes a tool
    /// entry (name, description, input schema, request mapping, risk level from its method),
    /// printed as YAML; operations that cannot be mapped are listed with why.
    Openapi {
        /// The description file.
        spec: PathBuf,
        /// The upstream (in the catalog's `upstreams`) the tools call.
        #[arg(long)]
        upstream: String,
        /// Only these operations (by operationId, comma-separated).
        #[arg(long, value_delimiter = ',')]
        operations: Vec<String>,
        /// Only operations with this tag (repeatable).
        #[arg(long)]
        tag: Vec<String>,
        /// Only operations whose path starts with this.
        #[arg(long)]
        path_prefix: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve gRPC (the default). Without --config, serves the embedded demo catalog.
    Serve(ServeArgs),
    /// Validate a catalog file and exit non-zero with the error if it is invalid.
    Check {
        /// The catalog file; without it, the embedded demo is checked.
        #[arg(long, env = "TOOLGATE_CONFIG")]
        config: Option<PathBuf>,
        /// Skip what depends on this machine (that process tools' and stdio MCP servers'
        /// programs exist and are executable, that working directories exist), for checking a
        /// catalog somewhere other than where it is served.
        #[arg(long)]
        portable: bool,
        /// Also connect to the state backend (`state.redis`) and check that it answers.
        #[arg(long)]
        connect: bool,
        /// Also fail unless every MCP tool is pinned (`pin:`; `toolgate pin` makes them).
        #[arg(long)]
        strict_mcp: bool,
        /// Also fail when an entry imported from an OpenAPI description (`openapi:`) no longer
        /// matches what its operation imports as now.
        #[arg(long)]
        spec_drift: bool,
    },
    /// Connect to the catalog's MCP servers and print the pin of each tool it lists from them
    /// (the hash of the definition the server lists now), to review and set as `pin:`.
    Pin {
        /// The catalog file.
        #[arg(long, env = "TOOLGATE_CONFIG")]
        config: PathBuf,
        /// Set the pins in the catalog file (comments and layout kept) instead of only printing
        /// them; nothing is written unless every listed tool could be pinned.
        #[arg(long)]
        write: bool,
    },
    /// Print the JSON Schema of the catalog file format (with --tests, of the test file format).
    Schema {
        /// The format of `toolgate test` files instead.
        #[arg(long)]
        tests: bool,
    },
    /// Run a catalog's test cases through the real chain in explain mode (no backend is called,
    /// no state changes); a diff for each failure, exit 1 if any fails.
    Test {
        /// The catalog file; without it, the embedded demo.
        #[arg(long, env = "TOOLGATE_CONFIG")]
        config: Option<PathBuf>,
        /// The test file (YAML; `toolgate schema --tests` prints its format).
        tests: PathBuf,
        /// Also fail unless every tool has a case and every deny rule decides one.
        #[arg(long)]
        coverage: bool,
    },
    /// Write catalog entries for a person to review, from a description of tools elsewhere.
    Import {
        #[command(subcommand)]
        source: ImportSource,
    },
    /// Summarise the shadow catalog's differing decisions (`shadow_decision` events) in an audit
    /// file.
    ShadowReport {
        /// The audit file (JSON lines; other events are skipped).
        audit: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the tools a caller's model may see (ListTools).
    Tools(ClientArgs),
    /// Execute one tool call (ExecuteTool).
    Call {
        /// The tool's name.
        name: String,
        #[command(flatten)]
        call: CallFields,
        /// Client deadline, e.g. 2s.
        #[arg(long)]
        timeout: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Explain what ExecuteTool would decide for a call, stage by stage, changing nothing
    /// (ExplainTool; needs scope toolgate:explain or dev identity). With --list: which tools
    /// the caller sees, and which stage hides each of the others.
    Explain {
        /// The tool's name.
        #[arg(required_unless_present = "list")]
        name: Option<String>,
        /// List every tool, visible or not, instead (ExplainListTools).
        #[arg(long, conflicts_with = "name")]
        list: bool,
        #[command(flatten)]
        call: CallFields,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List approvals of the caller's tenant (needs scope toolgate:approve).
    Approvals(ClientArgs),
    /// Approve a pending approval (needs scope toolgate:approve).
    Approve {
        approval_id: String,
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Reject a pending approval (needs scope toolgate:approve).
    Reject {
        approval_id: String,
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Stop the tools matching a glob at once, for every caller or one tenant and/or agent: an
    /// emergency deny (Controls service; needs scope toolgate:admin, or dev identity). With a
    /// shared state backend it reaches every sidecar sharing it.
    Deny {
        /// A glob over catalog tool names, e.g. 'send_*'.
        #[arg(long = "tool")]
        tools: String,
        /// Only this tenant's calls.
        #[arg(long)]
        tenant: Option<String>,
        /// Only this agent's calls.
        #[arg(long)]
        agent: Option<String>,
        /// Why; calls it refuses are told.
        #[arg(long)]
        reason: String,
        /// How long it lasts, e.g. 2h (default: until cleared).
        #[arg(long = "for")]
        lasts: Option<String>,
        /// Also stop the matching calls running now.
        #[arg(long)]
        cancel_running: bool,
        #[command(flatten)]
        control: ControlArgs,
    },
    /// Lift an emergency deny.
    Undeny {
        deny_id: String,
        #[command(flatten)]
        control: ControlArgs,
    },
    /// List the emergency denies in force.
    Denies(ControlArgs),
    /// Serve a sidecar's tools to an MCP host over stdio, forwarding each request to its MCP door.
    ///
    /// For MCP hosts that only launch local servers. Every `tools/list` and `tools/call` goes to
    /// the door at --url with one identity, a JWT (--token or --token-file) or dev identity
    /// (--tenant, --subject, --agent, --scopes), and the door's answer comes back unchanged,
    /// refusals included. It decides nothing: the door and its boundary do, and the audit names
    /// door "mcp". Logs go to stderr; stdout is the protocol.
    McpStdio(McpStdioArgs),
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// The catalog file; without it, the embedded demo catalog is served.
    #[arg(long, env = "TOOLGATE_CONFIG")]
    config: Option<PathBuf>,
    /// Override the TCP listen address, e.g. 0.0.0.0:50051.
    #[arg(long, env = "TOOLGATE_LISTEN")]
    listen: Option<std::net::SocketAddr>,
    /// Override the admin HTTP address (/metrics, /healthz, /readyz), e.g. 0.0.0.0:9464.
    #[arg(long, env = "TOOLGATE_ADMIN_LISTEN")]
    admin_listen: Option<std::net::SocketAddr>,
    /// Override the MCP door's address (`server.mcp.listen`), e.g. 127.0.0.1:8765; the door is
    /// served only when the catalog configures `server.mcp`.
    #[arg(long, env = "TOOLGATE_MCP_LISTEN")]
    mcp_listen: Option<std::net::SocketAddr>,
    /// Override the approvals console's address (`server.console.listen`), e.g. 127.0.0.1:8766;
    /// the console is served only when the catalog configures `server.console`.
    #[arg(long, env = "TOOLGATE_CONSOLE_LISTEN")]
    console_listen: Option<std::net::SocketAddr>,
    /// Log format.
    #[arg(long, env = "TOOLGATE_LOG_FORMAT", value_enum, default_value = "human")]
    log_format: LogFormat,
}

/// What `call` and `explain` send besides the tool's name.
#[derive(Debug, Args)]
struct CallFields {
    /// The arguments as a JSON object.
    #[arg(long, default_value = "{}")]
    args: String,
    /// Pin a tool version.
    #[arg(long)]
    version: Option<String>,
    /// Make the call idempotent under this key.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Redeem an approval.
    #[arg(long)]
    approval_id: Option<String>,
    /// The run the call belongs to.
    #[arg(long, default_value = "cli")]
    run_id: String,
}

impl CallFields {
    /// The call of tool `name`, and its run id.
    fn into_call(self, name: String) -> (proto::ToolCall, String) {
        let call = proto::ToolCall {
            call_id: String::new(),
            name,
            arguments_json: self.args,
            version: self.version.unwrap_or_default(),
            idempotency_key: self.idempotency_key.unwrap_or_default(),
            approval_id: self.approval_id.unwrap_or_default(),
        };
        (call, self.run_id)
    }
}

#[derive(Debug, Args)]
struct ClientArgs {
    /// The sidecar's address.
    #[arg(long, env = "TOOLGATE_ADDR", default_value = "http://127.0.0.1:50051")]
    addr: String,
    #[command(flatten)]
    identity: IdentityArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Who the caller is, for the verbs that talk to a sidecar: dev identity (sent as the
/// `x-toolgate-*` headers) or a JWT.
#[derive(Debug, Args)]
struct IdentityArgs {
    /// Dev identity: tenant.
    #[arg(long)]
    tenant: Option<String>,
    /// Dev identity: subject.
    #[arg(long)]
    subject: Option<String>,
    /// Dev identity: agent.
    #[arg(long)]
    agent: Option<String>,
    /// Dev identity: scopes, comma separated.
    #[arg(long)]
    scopes: Option<String>,
    /// A JWT to send as `authorization: Bearer`.
    #[arg(long, env = "TOOLGATE_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// The Controls verbs' flags: the sidecar and the operator (`--tenant` and `--agent` narrow a
/// deny instead).
#[derive(Debug, Args)]
struct ControlArgs {
    /// The sidecar's address.
    #[arg(long, env = "TOOLGATE_ADDR", default_value = "http://127.0.0.1:50051")]
    addr: String,
    /// Dev identity of the operator, as TENANT/SUBJECT (default operator/cli, without --token).
    #[arg(long = "as", conflicts_with = "token")]
    operator: Option<String>,
    /// A JWT to send as `authorization: Bearer` (with scope toolgate:admin).
    #[arg(long, env = "TOOLGATE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `mcp-stdio`'s flags: the door to forward to and one identity, a JWT or dev identity.
#[derive(Debug, Args)]
#[command(group(
    ArgGroup::new("caller")
        .args(["token", "token_file", "tenant"])
        .required(true)
        .multiple(true)
))]
#[command(group(
    ArgGroup::new("jwt")
        .args(["token", "token_file"])
        .conflicts_with_all(["tenant", "subject", "agent", "scopes"])
))]
struct McpStdioArgs {
    /// The sidecar's MCP door (its `server.mcp` listen address and path).
    #[arg(
        long,
        env = "TOOLGATE_MCP_URL",
        default_value = "http://127.0.0.1:8765/mcp"
    )]
    url: String,
    #[command(flatten)]
    identity: IdentityArgs,
    /// A file holding the JWT, read once at start (surrounding whitespace trimmed).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Log format (logs go to stderr; stdout is the protocol).
    #[arg(long, env = "TOOLGATE_LOG_FORMAT", value_enum, default_value = "human")]
    log_format: LogFormat,
}

/// Runs the command line; returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // The server and the stdio MCP server handle a closed pipe as an error (see `signals.rs`).
    if !matches!(
        cli.command,
        None | Some(Command::Serve(_) | Command::McpStdio(_))
    ) {
        signals::default_sigpipe();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    let result = match &runtime {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(err) => Err(Failure::error(format_args!(
            "cannot start the async runtime: {err}"
        ))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}

/// Runs the verb the command line names.
async fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        None => serve::serve(cli.serve).await,
        Some(Command::Serve(args)) => serve::serve(args).await,
        Some(Command::Check {
            config,
            portable,
            connect,
            strict_mcp,
            spec_drift,
        }) => check::check(config, portable, connect, strict_mcp, spec_drift).await,
        Some(Command::Pin { config, write }) => pin::run(config, write).await,
        Some(Command::Schema { tests }) => schema::schema(tests),
        Some(Command::Test {
            config,
            tests,
            coverage,
        }) => test_runner::run(config.as_deref(), &tests, coverage).await,
        Some(Command::ShadowReport { audit, json }) => shadow_report::run(&audit, json),
        Some(Command::Import {
            source:
                ImportSource::Openapi {
                    spec,
                    upstream,
                    operations,
                    tag,
                    path_prefix,
                },
        }) => import::openapi(
            &spec,
            &upstream,
            &crate::openapi::Selection {
                operations,
                tags: tag,
                path_prefix,
                spec_name: Some(spec.display().to_string()),
            },
        ),
        Some(Command::Explain {
            name,
            list,
            call,
            client,
        }) => match (list, name) {
            (true, _) | (false, None) => explain::list(client).await,
            (false, Some(name)) => {
                let (call, run_id) = call.into_call(name);
                explain::explain(client, call, run_id).await
            }
        },
        Some(Command::Tools(client)) => client_verbs::tools(client).await,
        Some(Command::Call {
            name,
            call,
            timeout,
            client,
        }) => {
            let (call, run_id) = call.into_call(name);
            client_verbs::call_tool(client, call, run_id, timeout).await
        }
        Some(Command::Approvals(client)) => client_verbs::list_approvals(client).await,
        Some(Command::Approve {
            approval_id,
            reason,
            client,
        }) => client_verbs::decide(client, approval_id, true, reason).await,
        Some(Command::Reject {
            approval_id,
            reason,
            client,
        }) => client_verbs::decide(client, approval_id, false, reason).await,
        Some(Command::Deny {
            tools,
            tenant,
            agent,
            reason,
            lasts,
            cancel_running,
            control,
        }) => {
            let ttl_seconds = match lasts {
                None => 0,
                Some(text) => {
                    let lasts = crate::settings::parse_duration(&text)
                        .map_err(|err| Failure::error(format_args!("--for {text}: {err}")))?;
                    u32::try_from(lasts.as_secs().max(1)).unwrap_or(u32::MAX)
                }
            };
            let ask = proto::SetEmergencyDenyRequest {
                tools,
                tenant: tenant.unwrap_or_default(),
                agent: agent.unwrap_or_default(),
                reason,
                ttl_seconds,
                cancel_running,
            };
            controls::deny(control, ask).await
        }
        Some(Command::Undeny { deny_id, control }) => controls::undeny(control, deny_id).await,
        Some(Command::Denies(control)) => controls::denies(control).await,
        Some(Command::McpStdio(args)) => mcp_stdio::run(args).await,
    }
}

/// Why a verb did not succeed, and so the process's exit code: every verb reports its failures
/// through this one type, and only [`main`] prints them. (A usage error never reaches a verb:
/// clap prints it and exits 2.)
#[derive(Debug)]
pub enum Failure {
    /// Something went wrong (a catalog that does not load, no connection, a gRPC error): each
    /// message is printed on stderr as `error: …`; exit 1.
    Errors(Vec<String>),
    /// What failed is already on stdout (a test case's diff); exit 1.
    Reported,
    /// The tool call returned, or for `explain` would return, a status other than OK (printed on
    /// stdout like any result); exit 4.
    NotOk,
}

impl Failure {
    /// One error, said as its text.
    fn error(message: impl std::fmt::Display) -> Self {
        Failure::Errors(vec![message.to_string()])
    }

    /// One error, said with its causes.
    fn caused(err: &(dyn std::error::Error + 'static)) -> Self {
        Failure::error(chain(err))
    }

    /// Prints the errors on stderr; the exit code.
    fn report(self) -> ExitCode {
        match self {
            Failure::Errors(messages) => {
                for message in messages {
                    eprintln!("error: {message}");
                }
                ExitCode::FAILURE
            }
            Failure::Reported => ExitCode::FAILURE,
            Failure::NotOk => ExitCode::from(4),
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Self {
        Failure::caused(err.as_ref())
    }
}

/// An error and its causes, each said once: many errors already include their source's text.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

/// Prints a `--json` output: one line of compact JSON.
fn print_json(output: &impl serde::Serialize) -> Result<(), Failure> {
    let line = serde_json::to_string(output).map_err(|err| Failure::caused(&err))?;
    println!("{line}");
    Ok(())
}

/// The catalog file, or the embedded demo without one.
fn load(config: Option<&PathBuf>) -> Result<Config, crate::settings::ConfigError> {
    let env = Env::from_process();
    match config {
        Some(path) => Config::load_file(path, &env),
        None => Config::demo(&env),
    }
}
