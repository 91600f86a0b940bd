//! The real binary: listening on TCP and a Unix socket, and shutting down gracefully on SIGTERM
//! with calls in flight.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use tonic::transport::{Endpoint, Uri};
use toolgate::proto::{ToolStatus, tool_gate_client::ToolGateClient};

use crate::support::{call, exec, who};

/// A started binary: its TCP address, and its log messages as they arrive.
pub(crate) struct Spawned {
    pub(crate) child: Child,
    pub(crate) addr: String,
    /// The admin endpoint's address (/metrics, /healthz, /readyz).
    pub(crate) admin_addr: String,
    /// The MCP door's address.
    pub(crate) mcp_addr: String,
    messages: std::sync::mpsc::Receiver<String>,
    reader: Option<std::thread::JoinHandle<Vec<String>>>,
}

/// A test that panics must not leave a server running.
impl Drop for Spawned {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Spawned {
    /// Everything the child logged; call after it exited.
    pub(crate) fn logs(mut self) -> String {
        self.reader
            .take()
            .map(|r| r.join().unwrap_or_default())
            .unwrap_or_default()
            .join("\n")
    }

    /// Waits (bounded) until `count` log lines with this message have arrived.
    pub(crate) fn wait_for_log(&self, message: &str, count: usize) {
        let mut seen = 0;
        while seen < count {
            let next = self
                .messages
                .recv_timeout(Duration::from_secs(10))
                .expect("log line within 10s");
            if next == message {
                seen += 1;
            }
        }
    }
}

/// Starts the binary and waits for its "SERVING" log line; debug logs of the boundary are on so
/// tests can see when execution starts.
pub(crate) fn spawn(args: &[&str]) -> Spawned {
    spawn_with_env(args, &[])
}

/// Like [`spawn`], with extra environment variables.
pub(crate) fn spawn_with_env(args: &[&str], envs: &[(&str, &str)]) -> Spawned {
    spawn_logging("json", args, envs)
}

/// Like [`spawn_with_env`], with stdout (where audit events go by default) piped: the caller
/// takes `child.stdout` and must keep reading it.
pub(crate) fn spawn_with_stdout(args: &[&str], envs: &[(&str, &str)]) -> Spawned {
    spawn_full(&[], "json", args, envs, Stdio::piped(), None)
}

/// Like [`spawn_with_env`], run under `wrapper` (e.g. `strace -o FILE`), which must pass the
/// program's stderr through.
pub(crate) fn spawn_wrapped(wrapper: &[&str], args: &[&str], envs: &[(&str, &str)]) -> Spawned {
    spawn_full(wrapper, "json", args, envs, Stdio::null(), None)
}

/// Like [`spawn_with_env`], started in `dir` (so relative paths are relative to it).
pub(crate) fn spawn_in(dir: &std::path::Path, args: &[&str], envs: &[(&str, &str)]) -> Spawned {
    spawn_full(&[], "json", args, envs, Stdio::null(), Some(dir))
}

/// Starts the binary with this `--log-format`. JSON lines become their message; other lines are
/// passed on whole (a human "serving gRPC over TCP" line gives the address too).
pub(crate) fn spawn_logging(log_format: &str, args: &[&str], envs: &[(&str, &str)]) -> Spawned {
    spawn_full(&[], log_format, args, envs, Stdio::null(), None)
}

fn spawn_full(
    wrapper: &[&str],
    log_format: &str,
    args: &[&str],
    envs: &[(&str, &str)],
    stdout: Stdio,
    dir: Option<&std::path::Path>,
) -> Spawned {
    let binary = env!("CARGO_BIN_EXE_toolgate");
    let mut command = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut command = Command::new(program);
            command.args(rest).arg(binary);
            command
        }
        None => Command::new(binary),
    };
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let mut child = command
        .args([
            "serve",
            "--log-format",
            log_format,
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--mcp-listen",
            "127.0.0.1:0",
        ])
        .args(args)
        .env("RUST_LOG", "info,toolgate::boundary=debug")
        .envs(envs.iter().copied())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn toolgate");
    let stderr = child.stderr.take().unwrap();
    let (tx, messages) = std::sync::mpsc::channel();
    // Keep reading stderr so the child never blocks on a full pipe; pass on each message.
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            match serde_json::from_str::<serde_json::Value>(&line) {
                Ok(json) => {
                    if json["fields"]["message"] == "serving gRPC over TCP" {
                        let _ = tx.send(format!(
                            "addr {}",
                            json["fields"]["addr"].as_str().unwrap_or_default()
                        ));
                    }
                    if json["fields"]["message"] == "serving MCP over Streamable HTTP" {
                        let _ = tx.send(format!(
                            "mcp {}",
                            json["fields"]["addr"].as_str().unwrap_or_default()
                        ));
                    }
                    if json["fields"]["message"] == "serving /metrics, /healthz and /readyz" {
                        let _ = tx.send(format!(
                            "admin {}",
                            json["fields"]["addr"].as_str().unwrap_or_default()
                        ));
                    }
                    let _ = tx.send(
                        json["fields"]["message"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    );
                }
                Err(_) => {
                    if line.contains("serving gRPC over TCP")
                        && let Some(addr) = line.split("addr=").nth(1)
                    {
                        let addr = addr.split_whitespace().next().unwrap_or_default();
                        let _ = tx.send(format!("addr {}", addr.trim_matches('"')));
                    }
                    let _ = tx.send(line.clone());
                }
            }
            lines.push(line);
        }
        lines
    });
    let mut addr = String::new();
    let mut admin_addr = String::new();
    let mut mcp_addr = String::new();
    loop {
        let message = messages
            .recv_timeout(Duration::from_secs(30))
            .expect("toolgate reports SERVING within 30s");
        if let Some(a) = message.strip_prefix("addr ") {
            addr = a.to_owned();
        }
        if let Some(a) = message.strip_prefix("admin ") {
            admin_addr = a.to_owned();
        }
        if let Some(a) = message.strip_prefix("mcp ") {
            mcp_addr = a.to_owned();
        }
        if message.contains("catalog loaded; SERVING") {
            break;
        }
    }
    Spawned {
        child,
        addr,
        admin_addr,
        mcp_addr,
        messages,
        reader: Some(reader),
    }
}

/// A client of a spawned binary at `addr` (host:port).
pub(crate) async fn client(addr: &str) -> ToolGateClient<tonic::transport::Channel> {
    ToolGateClient::new(
        Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    )
}

/// SIGTERM, then a bounded wait for exit 0; returns the logs. Blocks: from an async test use
/// [`stop`], so the test's clients can still answer the server's GOAWAY meanwhile.
pub(crate) fn stop_blocking(spawned: Spawned) -> String {
    sigterm(&spawned.child);
    let mut spawned = spawned;
    assert_eq!(wait_exit(&mut spawned.child).code(), Some(0));
    spawned.logs()
}

/// [`stop_blocking`] off the test's runtime.
pub(crate) async fn stop(spawned: Spawned) -> String {
    tokio::task::spawn_blocking(move || stop_blocking(spawned))
        .await
        .unwrap()
}

pub(crate) fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits (bounded) for the child to exit; on timeout the Drop guard kills it.
pub(crate) fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    for _ in 0..200 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("toolgate did not exit within 10s of SIGTERM");
}

#[tokio::test]
async fn sigterm_lets_in_flight_calls_finish_and_exits_zero() {
    let spawned = spawn(&[]);
    let channel = Endpoint::from_shared(format!("http://{}", spawned.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = ToolGateClient::new(channel);
    // Three calls that take 400 ms each are running when SIGTERM arrives.
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move {
                exec(
                    &mut client,
                    &who("acme"),
                    call("slow_task", r#"{"ms":400}"#),
                )
                .await
            })
        })
        .collect();
    // SIGTERM only once the server has started all three.
    let spawned = tokio::task::spawn_blocking(move || {
        spawned.wait_for_log("executing", 3);
        spawned
    })
    .await
    .unwrap();
    sigterm(&spawned.child);
    for handle in calls {
        let result = handle.await.unwrap();
        assert_eq!(
            result.status(),
            ToolStatus::Ok,
            "an in-flight call was cut off: {result:?}"
        );
    }
    let (status, spawned) = tokio::task::spawn_blocking(move || {
        let mut spawned = spawned;
        (wait_exit(&mut spawned.child), spawned)
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(0));
    let logs = spawned.logs();
    assert!(
        logs.contains("shutting down") && logs.contains("stopped"),
        "{logs}"
    );
}

#[tokio::test]
async fn serves_on_a_unix_socket_too() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("toolgate.sock");
    let config = dir.path().join("catalog.yaml");
    let demo = toolgate::settings::DEMO_CATALOG.replace(
        "  shutdown_grace: 10s\n",
        &format!(
            "  shutdown_grace: 10s\n  unix_socket: {}\n",
            socket.display()
        ),
    );
    std::fs::write(&config, demo).unwrap();
    let spawned = spawn(&["--config", config.to_str().unwrap()]);
    let path = socket.clone();
    let channel = Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .expect("connect over the unix socket");
    let mut client = ToolGateClient::new(channel);
    let result = exec(
        &mut client,
        &who("acme"),
        call("echo", r#"{"text":"over uds"}"#),
    )
    .await;
    assert_eq!(result.model_text, "over uds");
    crate::process::stop(spawned).await;
    assert!(!socket.exists(), "the socket file is removed on shutdown");
}

#[tokio::test]
async fn sighup_reloads_the_catalog_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("catalog.yaml");
    // Polling is off for practical purposes: only the signal can cause the reload.
    let demo = toolgate::settings::DEMO_CATALOG.replace(
        "  shutdown_grace: 10s\n",
        "  shutdown_grace: 10s\n  reload_interval: 1h\n",
    );
    std::fs::write(&config, &demo).unwrap();
    let spawned = spawn(&["--config", config.to_str().unwrap()]);
    std::fs::write(
        &config,
        demo.replace(
            "Returns the given text unchanged.",
            "Returns the text, reloaded.",
        ),
    )
    .unwrap();
    let pid = spawned.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let spawned = tokio::task::spawn_blocking(move || {
        spawned.wait_for_log("SIGHUP: catalog reloaded", 1);
        spawned
    })
    .await
    .unwrap();
    let channel = Endpoint::from_shared(format!("http://{}", spawned.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ToolGateClient::new(channel);
    let listed = client
        .list_tools(who("acme").request(toolgate::proto::ListToolsRequest {}))
        .await
        .unwrap()
        .into_inner();
    let echo = listed.tools.iter().find(|t| t.name == "echo").unwrap();
    assert_eq!(echo.description, "Returns the text, reloaded.");
    crate::process::stop(spawned).await;
}

/// Human logs carry no colour escape codes when stderr is not a terminal (a file, a pipe,
/// `kubectl logs`).
#[test]
fn human_logs_to_a_pipe_have_no_escape_codes() {
    let mut spawned = spawn_logging("human", &[], &[]);
    sigterm(&spawned.child);
    assert!(wait_exit(&mut spawned.child).success());
    let logs = spawned.logs();
    assert!(!logs.contains('\u{1b}'), "escape codes in {logs:?}");
    assert!(logs.contains(" INFO "), "{logs:?}");
}

/// gRPC health says SERVING as soon as the TCP listener serves, so every other listener must
/// serve, and have said so, before it: a client (the load harness, a readiness probe) that waits
/// for SERVING and then reads the log finds the MCP door's and the admin endpoint's addresses.
#[tokio::test]
async fn the_other_listeners_serve_before_the_grpc_listener_does() {
    let spawned = spawn(&[]);
    let logs = stop(spawned).await;
    let at = |message: &str| {
        logs.find(message)
            .unwrap_or_else(|| panic!("no {message:?} in the log:\n{logs}"))
    };
    let grpc = at("serving gRPC over TCP");
    assert!(at("serving MCP over Streamable HTTP") < grpc, "{logs}");
    assert!(
        at("serving /metrics, /healthz and /readyz") < grpc,
        "{logs}"
    );
}
