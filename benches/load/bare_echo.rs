//! The bare echo: toolgate's own `ToolGate` service with nothing behind it, on the transport
//! settings toolgate's server uses, so the ratios count what toolgate adds to the stack. It runs
//! in the harness's process ([`start_in_process`]) or as a process of its own
//! ([`serve_process`], the `serve-bare-echo` subcommand, which `processes::spawn_bare` re-runs this
//! executable as).

use std::{net::SocketAddr, time::Duration};

use tonic::{Request, Response, Status};
use toolgate::proto::{
    self,
    tool_gate_server::{ToolGate, ToolGateServer},
};

/// The subcommand that runs the bare echo as a process of its own.
pub const SUBCOMMAND: &str = "serve-bare-echo";
/// What the bare echo process writes on stderr, before its address, once it listens.
pub const LISTENING: &str = "bare echo listening on";

/// `ToolGate` with nothing behind it: `ExecuteTool` answers OK with the arguments as output.
struct BareEcho;

/// A `slow` call sleeps for its `ms` argument first (at most a minute), so the RSS test can be
/// run against the bare stack too.
async fn echo_or_sleep(call: proto::ToolCall) -> proto::ToolResult {
    if call.name != "slow" {
        return echo(call);
    }
    let ms = serde_json::from_str::<serde_json::Value>(&call.arguments_json)
        .ok()
        .and_then(|args| args.get("ms")?.as_u64())
        .unwrap_or(0)
        .min(60_000);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    proto::ToolResult {
        duration_ms: ms,
        ..echo(call)
    }
}

fn echo(call: proto::ToolCall) -> proto::ToolResult {
    proto::ToolResult {
        call_id: if call.call_id.is_empty() {
            "tool_step_0_0".into()
        } else {
            call.call_id
        },
        status: proto::ToolStatus::Ok as i32,
        model_text: call.arguments_json,
        tool_version: "1".into(),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl ToolGate for BareEcho {
    async fn list_tools(
        &self,
        _request: Request<proto::ListToolsRequest>,
    ) -> Result<Response<proto::ListToolsResponse>, Status> {
        Ok(Response::new(proto::ListToolsResponse::default()))
    }

    async fn execute_tool(
        &self,
        request: Request<proto::ExecuteToolRequest>,
    ) -> Result<Response<proto::ExecuteToolResponse>, Status> {
        let call = request
            .into_inner()
            .call
            .ok_or_else(|| Status::invalid_argument("ExecuteToolRequest.call is required"))?;
        Ok(Response::new(proto::ExecuteToolResponse {
            result: Some(echo_or_sleep(call).await),
        }))
    }

    async fn execute_tools(
        &self,
        request: Request<proto::ExecuteToolsRequest>,
    ) -> Result<Response<proto::ExecuteToolsResponse>, Status> {
        Ok(Response::new(proto::ExecuteToolsResponse {
            results: request.into_inner().calls.into_iter().map(echo).collect(),
        }))
    }

    async fn explain_tool(
        &self,
        _request: Request<proto::ExplainToolRequest>,
    ) -> Result<Response<proto::ExplainToolResponse>, Status> {
        Err(Status::unimplemented("the bare echo explains nothing"))
    }

    async fn explain_list_tools(
        &self,
        _request: Request<proto::ExplainListToolsRequest>,
    ) -> Result<Response<proto::ExplainListToolsResponse>, Status> {
        Err(Status::unimplemented("the bare echo explains nothing"))
    }
}

/// Serves the bare echo on `listener` with the transport settings toolgate's server uses
/// (TCP_NODELAY on accepted sockets, their writes joined by `JoinedWrites`, HTTP/2 keep-alive),
/// so the ratios count what toolgate adds, not how its sockets are set up.
async fn serve(
    listener: tokio::net::TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let incoming = toolgate::server::JoinedWrites::each(
        tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
    );
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .add_service(ToolGateServer::new(BareEcho))
        .serve_with_incoming_shutdown(incoming, stop)
        .await
}

/// The bare echo in the harness's process; [`BareServer::stop`] ends it.
pub struct BareServer {
    pub addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl BareServer {
    /// Stops serving, waiting five seconds at most.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

/// Starts the bare echo on a loopback port of its own, in this process.
pub async fn start_in_process() -> anyhow::Result<BareServer> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, async {
        let _ = stopped.await;
    }));
    Ok(BareServer { addr, stop, task })
}

/// The bare echo as a process of its own, on the default runtime like toolgate's binary. It
/// runs until killed (the harness sends SIGTERM) or the harness dies, and for two hours at most
/// (a full run of every target takes about 25 minutes).
pub fn serve_process(addr: SocketAddr) -> anyhow::Result<()> {
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets a signal for this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        eprintln!("{LISTENING} {}", listener.local_addr()?);
        serve(listener, tokio::time::sleep(Duration::from_secs(7200))).await?;
        Ok(())
    })
}
