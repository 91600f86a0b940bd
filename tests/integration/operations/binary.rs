//! The real binary: listening on TCP and a Unix socket, and shutting down gracefully on SIGTERM
//! with calls in flight.

use std::process::Command;

use hyper_util::rt::TokioIo;
use tonic::transport::{Endpoint, Uri};
use toolgate::proto::{ToolStatus, tool_gate_client::ToolGateClient};

use crate::support::{
    binary::{sigterm, spawn, spawn_logging, stop, wait_exit},
    call, exec, who,
};

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
    crate::support::binary::stop(spawned).await;
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
    crate::support::binary::stop(spawned).await;
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
