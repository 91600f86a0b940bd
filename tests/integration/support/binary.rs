//! The real binary, spawned: its addresses and log lines as they arrive, a client of it, and
//! a bounded SIGTERM and wait.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::Duration,
};

use tonic::transport::Endpoint;
use toolgate::proto::tool_gate_client::ToolGateClient;

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
            "--console-listen",
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
