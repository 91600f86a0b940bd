//! The command line: `serve` (default), `check`, `schema`, `test` (a catalog's test cases,
//! `cli/test_runner.rs`), `shadow-report` (`cli/shadow_report.rs`), and operator client verbs
//! (`tools`, `call`, `explain` — `cli/explain.rs` —, `approvals`, `approve`, `reject`) that talk
//! to a running sidecar.
//!
//! Exit codes: 0 success; 1 failure (bad config, cannot start, transport error); 2 usage error;
//! 4 the tool call returned (or, for `explain`, would return) a status other than OK.

mod explain;
pub mod shadow_report;
pub mod test_runner;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand};
use serde_json::json;
use tonic::{Request, metadata::MetadataValue, transport::Channel};

use crate::{
    config::Config,
    identity::{AGENT_HEADER, SCOPES_HEADER, SUBJECT_HEADER, TENANT_HEADER},
    proto::{self, approvals_client::ApprovalsClient, tool_gate_client::ToolGateClient},
    server::{StartOptions, run},
    settings::Env,
    telemetry::{self, LogFormat},
};

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
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs the command line; returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, None | Some(Command::Serve(_))) {
        // Printing verbs end quietly when their reader goes away (`toolgate tools | head`), like
        // other Unix tools. The server keeps Rust's default of ignoring SIGPIPE: a closed audit
        // pipe must be an error it handles, not its death.
        // SAFETY: restoring a signal's default disposition before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            None => serve(cli.serve).await,
            Some(Command::Serve(args)) => serve(args).await,
            Some(Command::Check {
                config,
                portable,
                connect,
            }) => check(config, portable, connect).await,
            Some(Command::Schema { tests }) => {
                let schema = match tests {
                    true => test_runner::json_schema(),
                    false => crate::settings::json_schema(),
                };
                println!(
                    "{}",
                    serde_json::to_string_pretty(&schema).unwrap_or_default()
                );
                Ok(ExitCode::SUCCESS)
            }
            Some(Command::Test {
                config,
                tests,
                coverage,
            }) => test_runner::run(config.as_deref(), &tests, coverage).await,
            Some(Command::ShadowReport { audit, json }) => shadow_report::run(&audit, json),
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
            Some(Command::Tools(client)) => tools(client).await,
            Some(Command::Call {
                name,
                call,
                timeout,
                client,
            }) => {
                let (call, run_id) = call.into_call(name);
                call_tool(client, call, run_id, timeout).await
            }
            Some(Command::Approvals(client)) => list_approvals(client).await,
            Some(Command::Approve {
                approval_id,
                reason,
                client,
            }) => decide(client, approval_id, true, reason).await,
            Some(Command::Reject {
                approval_id,
                reason,
                client,
            }) => decide(client, approval_id, false, reason).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", chain(err.as_ref()));
            ExitCode::FAILURE
        }
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

fn load(config: Option<&PathBuf>) -> Result<Config, crate::settings::ConfigError> {
    let env = Env::from_process();
    match config {
        Some(path) => Config::load_file(path, &env),
        None => Config::demo(&env),
    }
}

/// What in a loaded catalog cannot work on this machine (missing programs, working
/// directories): not load errors, since a catalog may be checked elsewhere than it is served.
fn host_problems(config: &Config) -> Vec<crate::settings::FieldError> {
    let tools = config
        .catalog
        .versions()
        .filter_map(|tool| match &tool.executor {
            crate::executor::ExecutorSpec::Process(process) => Some(process.host_problems()),
            _ => None,
        })
        .flatten();
    let servers = config
        .catalog_inputs
        .mcp_servers
        .iter()
        .flat_map(|server| server.host_problems());
    tools.chain(servers).collect()
}

/// `check --connect`: whether the state backend answers.
async fn connect_state(config: &Config) -> Result<String, String> {
    let crate::settings::StateBackend::Redis(redis) = &config.state.backend else {
        return Ok("state backend: memory (nothing to connect to)".to_owned());
    };
    let metrics = std::sync::Arc::new(crate::metrics::Metrics::new());
    let shared = crate::state::Redis::connect(redis, &config.state, metrics)
        .map_err(|err| err.to_string())?;
    let started = std::time::Instant::now();
    shared
        .ping()
        .await
        .map_err(|err| format!("state backend {}: {err}", redis.url))?;
    Ok(format!(
        "state backend {}: ok (answered in {} ms)",
        redis.url,
        started.elapsed().as_millis()
    ))
}

async fn check(config: Option<PathBuf>, portable: bool, connect: bool) -> anyhow::Result<ExitCode> {
    match load(config.as_ref()) {
        Ok(loaded) => {
            let problems = if portable {
                Vec::new()
            } else {
                host_problems(&loaded)
            };
            for problem in &problems {
                eprintln!(
                    "error: {}: {}: {} (on this machine; --portable skips this check)",
                    loaded.source, problem.path, problem.message
                );
            }
            if !problems.is_empty() {
                return Ok(ExitCode::FAILURE);
            }
            if connect {
                match connect_state(&loaded).await {
                    Ok(line) => println!("{line}"),
                    Err(err) => {
                        eprintln!("error: {}: {err}", loaded.source);
                        return Ok(ExitCode::FAILURE);
                    }
                }
            }
            println!(
                "{}: ok ({} tools, revision {})",
                loaded.source,
                loaded.catalog.versions().count(),
                loaded.catalog.revision()
            );
            // The shadow candidate is checked too: served, a broken one is only refused (logged).
            if let Some(candidate) = &loaded.shadow_catalog {
                match Config::load_file(candidate, &Env::from_process()) {
                    Ok(shadow) => println!(
                        "{}: ok as the shadow catalog ({} tools)",
                        shadow.source,
                        shadow.catalog.versions().count()
                    ),
                    Err(err) => {
                        eprintln!("error: shadow catalog: {err}");
                        return Ok(ExitCode::FAILURE);
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            eprintln!("error: {err}");
            Ok(ExitCode::FAILURE)
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    // The config says where traces go, so it is read before logging starts; errors go to stderr.
    let config = match load(args.config.as_ref()) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("error: {err}");
            return Ok(ExitCode::FAILURE);
        }
    };
    // A file-size limit (RLIMIT_FSIZE) must make an audit write fail, to be retried from the
    // first byte not written, not kill the sidecar with SIGXFSZ.
    // SAFETY: setting a signal's disposition to ignore, before any thread writes files.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    let telemetry = telemetry::init(args.log_format, &config.telemetry)?;
    // Served anyway: the other tools work, and these answer backend_misconfigured.
    for problem in host_problems(&config) {
        tracing::error!(at = %problem.path, problem = %problem.message, "this tool cannot run on this machine");
    }
    // Descendants of process tools and MCP servers that detach are re-parented to the sidecar
    // (as they would be to it as PID 1 in a container): collect the ones that exit.
    crate::executor::process::descendants::adopt_orphans();
    tokio::spawn(crate::executor::process::descendants::collect_orphans());
    let options = StartOptions {
        listen: args.listen,
        clock: None,
        reload_on_sighup: true,
        admin_listen: args.admin_listen,
        tracer: telemetry.tracer(),
    };
    let result = run(config, options, shutdown_signal()).await;
    // Pending spans are flushed before the process exits.
    telemetry.shutdown();
    result?;
    Ok(ExitCode::SUCCESS)
}

/// Registers SIGTERM and SIGINT handlers now — before the server starts, so a signal that comes
/// right after start-up is never taken by the default action — and resolves on either.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        match handlers {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                // Without signal handlers, Ctrl-C is still caught.
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

async fn channel(client: &ClientArgs) -> anyhow::Result<Channel> {
    let addr = endpoint_url(&client.addr)?;
    let endpoint = Channel::from_shared(addr.clone())
        .map_err(|err| anyhow::anyhow!("invalid --addr {}: {err}", client.addr))?
        .connect_timeout(Duration::from_secs(5));
    endpoint
        .connect()
        .await
        .map_err(|err| anyhow::anyhow!("cannot connect to {addr}: {}", chain(&err)))
}

/// `--addr` as a URL: `host:port` means `http://host:port`; other schemes than http(s) are
/// refused with a clear message.
fn endpoint_url(addr: &str) -> anyhow::Result<String> {
    match addr.split_once("://") {
        None => Ok(format!("http://{addr}")),
        Some(("http" | "https", _)) => Ok(addr.to_owned()),
        Some((scheme, _)) => Err(anyhow::anyhow!(
            "--addr {addr}: the scheme {scheme:?} is not supported; use host:port or http://host:port"
        )),
    }
}

fn request<T>(client: &ClientArgs, body: T) -> anyhow::Result<Request<T>> {
    let mut request = Request::new(body);
    let metadata = request.metadata_mut();
    let mut put = |key: &'static str, value: &Option<String>| -> anyhow::Result<()> {
        if let Some(value) = value {
            let value: MetadataValue<_> = value.parse().map_err(|_| {
                anyhow::anyhow!(
                    "--{} must be ASCII text",
                    key.trim_start_matches("x-toolgate-")
                )
            })?;
            metadata.insert(key, value);
        }
        Ok(())
    };
    put(TENANT_HEADER, &client.tenant)?;
    put(SUBJECT_HEADER, &client.subject)?;
    put(AGENT_HEADER, &client.agent)?;
    put(SCOPES_HEADER, &client.scopes)?;
    put(
        "authorization",
        &client.token.as_ref().map(|t| format!("Bearer {t}")),
    )?;
    Ok(request)
}

fn status_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", status.code(), status.message())
}

async fn tools(client: ClientArgs) -> anyhow::Result<ExitCode> {
    let mut grpc = ToolGateClient::new(channel(&client).await?);
    let response = grpc
        .list_tools(request(&client, proto::ListToolsRequest {})?)
        .await
        .map_err(status_error)?
        .into_inner();
    if client.json {
        let tools: Vec<_> = response
            .tools
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "version": t.version,
                    "description": t.description,
                    "input_schema": serde_json::from_str::<serde_json::Value>(&t.input_schema_json).unwrap_or_default(),
                    "risk_level": t.risk_level().as_str_name(),
                    "required_scopes": t.required_scopes,
                    "timeout_ms": t.timeout_ms,
                    "requires_approval": t.requires_approval,
                })
            })
            .collect();
        println!(
            "{}",
            json!({"catalog_revision": response.catalog_revision, "tools": tools})
        );
    } else {
        println!("catalog revision {}", response.catalog_revision);
        for t in &response.tools {
            let risk = t
                .risk_level()
                .as_str_name()
                .trim_start_matches("RISK_LEVEL_");
            let approval = if t.requires_approval {
                " [needs approval]"
            } else {
                ""
            };
            println!(
                "  {:<16} v{:<4} {:<16} {}{approval}",
                t.name, t.version, risk, t.description
            );
            println!("  {:<16}       args {}", "", t.input_schema_json);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn call_tool(
    client: ClientArgs,
    call: proto::ToolCall,
    run_id: String,
    timeout: Option<String>,
) -> anyhow::Result<ExitCode> {
    let mut grpc = ToolGateClient::new(channel(&client).await?);
    let name = call.name.clone();
    let mut req = request(
        &client,
        proto::ExecuteToolRequest {
            call: Some(call),
            run_id,
            step: 0,
            catalog_revision: String::new(),
        },
    )?;
    if let Some(timeout) = timeout {
        req.set_timeout(crate::settings::parse_duration(&timeout).map_err(anyhow::Error::msg)?);
    }
    let result = grpc
        .execute_tool(req)
        .await
        .map_err(status_error)?
        .into_inner()
        .result
        .ok_or_else(|| anyhow::anyhow!("the sidecar answered without a result"))?;
    let status = result
        .status()
        .as_str_name()
        .trim_start_matches("TOOL_STATUS_")
        .to_owned();
    if client.json {
        println!(
            "{}",
            json!({
                "call_id": result.call_id,
                "status": status,
                "model_text": result.model_text,
                "error_type": result.error_type,
                "error_message": result.error_message,
                "retryable": result.retryable,
                "tool_version": result.tool_version,
                "approval_id": result.approval_id,
                "retry_after_ms": result.retry_after_ms,
                "duration_ms": result.duration_ms,
                "refused_by": result.refused_by,
                "idempotent_replay": result.idempotent_replay,
            })
        );
    } else {
        let version = if result.tool_version.is_empty() {
            String::new()
        } else {
            format!(" v{}", result.tool_version)
        };
        let replay = if result.idempotent_replay {
            ", replayed"
        } else {
            ""
        };
        println!(
            "{status} {name}{version} (call {}, {} ms{replay})",
            result.call_id, result.duration_ms
        );
        if !result.refused_by.is_empty() {
            println!(
                "refused by {}: {} [{}]",
                result.refused_by, result.error_message, result.error_type
            );
        } else if !result.error_type.is_empty() {
            println!("{} [{}]", result.error_message, result.error_type);
        }
        if !result.approval_id.is_empty() {
            println!("approval_id: {}", result.approval_id);
        }
        if result.retry_after_ms > 0 {
            println!("retry after {} ms", result.retry_after_ms);
        }
        println!("model_text: {}", result.model_text);
    }
    Ok(if status == "OK" {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(4)
    })
}

/// The most ListApprovals pages `toolgate approvals` reads (200 approvals each).
const MAX_PAGES: usize = 1000;

async fn list_approvals(client: ClientArgs) -> anyhow::Result<ExitCode> {
    let mut grpc = ApprovalsClient::new(channel(&client).await?);
    let mut approvals = Vec::new();
    let mut page_token = String::new();
    // Every page, oldest first; bounded so a misbehaving server cannot keep the loop going.
    for _ in 0..MAX_PAGES {
        let page = grpc
            .list_approvals(request(
                &client,
                proto::ListApprovalsRequest {
                    state: 0,
                    page_size: 0,
                    page_token: std::mem::take(&mut page_token),
                },
            )?)
            .await
            .map_err(status_error)?
            .into_inner();
        approvals.extend(page.approvals);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    for a in &approvals {
        let more = if a.arguments_truncated { "…" } else { "" };
        if client.json {
            println!(
                "{}",
                json!({"approval_id": a.approval_id, "tool": a.tool, "tool_version": a.tool_version,
                       "subject": a.subject, "agent": a.agent, "run_id": a.run_id,
                       "arguments_preview": a.arguments_preview, "arguments_truncated": a.arguments_truncated,
                       "arguments_sha256": a.arguments_sha256, "expires_at_unix_ms": a.expires_at_unix_ms})
            );
        } else {
            println!(
                "{}  {} v{}  by {} ({})  args {}{more}",
                a.approval_id, a.tool, a.tool_version, a.subject, a.run_id, a.arguments_preview
            );
        }
    }
    if approvals.is_empty() && !client.json {
        println!("no pending approvals");
    }
    Ok(ExitCode::SUCCESS)
}

async fn decide(
    client: ClientArgs,
    approval_id: String,
    approve: bool,
    reason: String,
) -> anyhow::Result<ExitCode> {
    let mut grpc = ApprovalsClient::new(channel(&client).await?);
    let decision = if approve {
        proto::ApprovalDecision::Approve
    } else {
        proto::ApprovalDecision::Reject
    };
    let approval = grpc
        .decide_approval(request(
            &client,
            proto::DecideApprovalRequest {
                approval_id,
                decision: decision as i32,
                reason,
            },
        )?)
        .await
        .map_err(status_error)?
        .into_inner()
        .approval
        .ok_or_else(|| anyhow::anyhow!("the sidecar answered without the approval"))?;
    let state = approval
        .state()
        .as_str_name()
        .trim_start_matches("APPROVAL_STATE_")
        .to_owned();
    if client.json {
        println!(
            "{}",
            json!({"approval_id": approval.approval_id, "state": state, "decided_by": approval.decided_by})
        );
    } else {
        println!(
            "{} {} by {}",
            approval.approval_id, state, approval.decided_by
        );
    }
    Ok(ExitCode::SUCCESS)
}
