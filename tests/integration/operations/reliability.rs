//! Reliability: load from 64 concurrent clients, broken upstreams and stubborn processes, SIGTERM
//! to the real binary under load (hostile requests: `hostile_requests.rs`). Every loop is bounded in count and time, and
//! all traffic stays on loopback.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    time::{Duration, Instant},
};

use futures::future::join_all;
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};
use tonic::{Code, transport::Endpoint};
use toolgate::{
    proto::{self, ToolStatus, tool_gate_client::ToolGateClient},
    settings::Env,
};

use crate::support::python;
use crate::support::{STAGES, TestServer, call, exec, execute_request, who, within};

// --- load ------------------------------------------------------------------------------------------

/// What a load call was, so its result can be checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Echo,
    Limited,
    Approval,
    BadSchema,
    Slow,
}

const KINDS: [Kind; 5] = [
    Kind::Echo,
    Kind::Limited,
    Kind::Approval,
    Kind::BadSchema,
    Kind::Slow,
];

fn load_call(kind: Kind, id: &str) -> proto::ToolCall {
    let mut c = match kind {
        Kind::Echo => call("echo", &format!(r#"{{"text":"{id}"}}"#)),
        Kind::Limited => call("limited", "{}"),
        Kind::Approval => call("approve_me", &format!(r#"{{"amount":1,"order":"{id}"}}"#)),
        Kind::BadSchema => call("typed", r#"{"count":0,"mode":"sideways"}"#),
        Kind::Slow => call("slow", r#"{"ms":5}"#),
    };
    c.call_id = id.to_owned();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_clients_get_exact_outcomes_quotas_and_one_audit_event_per_call() {
    const CLIENTS: usize = 64;
    const CALLS_EACH: usize = 20;
    // The short sleeps must not time out just because the machine is busy.
    let server = TestServer::start(&STAGES.replacen("timeout: 300ms", "timeout: 10s", 1)).await;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(server.client().await); // one connection each
    }
    let started = Instant::now();
    let runs = clients
        .into_iter()
        .enumerate()
        .map(|(c, mut client)| async move {
            let tenant = if c % 2 == 0 { "acme" } else { "globex" };
            let mut results = Vec::new();
            for i in 0..CALLS_EACH {
                let kind = KINDS[(c + i) % KINDS.len()];
                let id = format!("c{c}-{i}");
                let answer = client
                    .execute_tool(who(tenant).request(execute_request(load_call(kind, &id))))
                    .await
                    .map(|r| r.into_inner().result.expect("a result"));
                results.push((tenant, kind, id, answer));
            }
            results
        });
    let results: Vec<_> = within(Duration::from_secs(60), "the load", join_all(runs))
        .await
        .into_iter()
        .flatten()
        .collect();
    let elapsed = started.elapsed();
    assert_eq!(results.len(), CLIENTS * CALLS_EACH);

    let mut admitted: BTreeMap<&str, usize> = BTreeMap::new();
    let mut approval_ids = BTreeSet::new();
    let mut expected_audit = BTreeMap::new();
    for (tenant, kind, id, answer) in &results {
        let r = answer
            .as_ref()
            .unwrap_or_else(|status| panic!("{id} ({kind:?}) got a gRPC error: {status:?}"));
        assert_eq!(&r.call_id, id);
        let outcome = (r.status(), r.error_type.as_str());
        match kind {
            Kind::Echo => {
                assert_eq!(outcome, (ToolStatus::Ok, ""), "{r:?}");
                assert_eq!(&r.model_text, id);
            }
            Kind::Limited => match outcome {
                (ToolStatus::Ok, "") => *admitted.entry(tenant).or_default() += 1,
                (ToolStatus::RateLimited, "rate_limited") => assert!(r.retryable),
                _ => panic!("{r:?}"),
            },
            Kind::Approval => {
                assert_eq!(
                    outcome,
                    (ToolStatus::ApprovalRequired, "approval_required"),
                    "{r:?}"
                );
                assert!(approval_ids.insert(r.approval_id.clone()), "{r:?}");
            }
            Kind::BadSchema => {
                assert_eq!(
                    (outcome, r.refused_by.as_str()),
                    ((ToolStatus::InvalidArguments, "schema_violation"), "schema"),
                    "{r:?}"
                );
            }
            Kind::Slow => {
                assert_eq!(outcome, (ToolStatus::Ok, ""), "{r:?}");
                assert_eq!(r.model_text, r#"{"slept_ms":5}"#);
            }
        }
        expected_audit.insert(
            id.clone(),
            r.status()
                .as_str_name()
                .trim_start_matches("TOOL_STATUS_")
                .to_owned(),
        );
    }
    // 5/min on a clock that does not move: exactly the quota, per tenant, under contention.
    assert_eq!(
        admitted,
        BTreeMap::from([("acme", 5), ("globex", 5)]),
        "rate limit not exact"
    );
    assert_eq!(approval_ids.len(), CLIENTS * CALLS_EACH / KINDS.len());
    assert_eq!(server.boundary().pending_approvals(), approval_ids.len());

    // Exactly one audit event per call, with the status the caller saw.
    let events = server.audit_events().await;
    let mut audited = BTreeMap::new();
    for event in &events {
        assert_eq!(event["kind"], "tool_call", "{event}");
        let id = event["call_id"].as_str().unwrap().to_owned();
        let status = event["status"].as_str().unwrap().to_owned();
        assert!(
            audited.insert(id, status).is_none(),
            "two events for one call: {event}"
        );
    }
    assert_eq!(audited, expected_audit);
    // How long it took is reported, not asserted: the product promises no throughput here, and
    // `within` above already fails a load that hangs.
    eprintln!(
        "load: {} calls from {CLIENTS} clients in {elapsed:?}",
        results.len()
    );
    server.stop().await;
}

// --- faults ----------------------------------------------------------------------------------------

/// How a fake upstream misbehaves on every connection.
#[derive(Clone, Copy)]
enum Misbehaviour {
    /// Reads the request and never answers.
    Hang,
    /// Closes with a TCP reset.
    Reset,
    /// Closes cleanly (FIN), before any response.
    Close,
    /// Answers with bytes that are not HTTP, then closes.
    Garbage,
}

/// A misbehaving upstream. Every connection is counted when accepted; all but `Hang` then hold
/// the request until `release` is sent, so a test can do other things while a faulty call is
/// known to be in progress.
struct Broken {
    addr: SocketAddr,
    accepted: tokio::sync::watch::Receiver<usize>,
    release: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
}

async fn broken_upstream(how: Misbehaviour) -> Broken {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted_tx, accepted) = tokio::sync::watch::channel(0usize);
    let release = std::sync::Arc::new(tokio::sync::watch::channel(false).0);
    let released = release.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            accepted_tx.send_modify(|n| *n += 1);
            let mut go = released.subscribe();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                // The request has arrived (or at least started) before anything else happens.
                let _ = stream.read(&mut buf).await;
                if !matches!(how, Misbehaviour::Hang) {
                    // Bounded like everything else: a test that never releases fails on its own.
                    let _ =
                        tokio::time::timeout(Duration::from_secs(30), go.wait_for(|g| *g)).await;
                }
                match how {
                    Misbehaviour::Hang => {
                        // Until the client gives up and closes, bounded all the same.
                        let mut sink = Vec::new();
                        let _ = tokio::time::timeout(
                            Duration::from_secs(30),
                            stream.read_to_end(&mut sink),
                        )
                        .await;
                    }
                    Misbehaviour::Reset => {
                        stream.set_zero_linger().unwrap();
                        drop(stream);
                    }
                    Misbehaviour::Close => drop(stream),
                    Misbehaviour::Garbage => {
                        let _ = stream
                            .write_all(
                                b"SSH-2.0-OpenSSH_9.0\r\n\x00\xff\xfe garbage \x01\x02\r\n\r\n",
                            )
                            .await;
                        let _ = stream.shutdown().await;
                    }
                }
            });
        }
    });
    Broken {
        addr,
        accepted,
        release,
    }
}

/// True once the process has exited (a zombie has exited too; only its parent has not reaped it).
fn pid_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Runs `fault` and, once `in_progress` says the faulty call is under way, an echo on another
/// connection; `after_echo` runs when the echo is answered. The echo must be answered OK, and
/// before the faulty call ends: the sidecar serves others while one call is stuck. Returns the
/// faulty call's result and how long it took.
async fn with_echo_alongside(
    server: &TestServer,
    fault: impl Future<Output = proto::ToolResult>,
    in_progress: impl Future<Output = ()>,
    after_echo: impl FnOnce(),
) -> (proto::ToolResult, Duration) {
    let mut echo_client = server.client().await;
    let echo_done = std::sync::atomic::AtomicBool::new(false);
    let started = Instant::now();
    let ((result, took, echo_first), echo) =
        within(Duration::from_secs(60), "a faulty call", async {
            tokio::join!(
                async {
                    let r = fault.await;
                    let took = started.elapsed();
                    (r, took, echo_done.load(std::sync::atomic::Ordering::SeqCst))
                },
                async {
                    within(
                        Duration::from_secs(10),
                        "the faulty call to start",
                        in_progress,
                    )
                    .await;
                    let r = exec(
                        &mut echo_client,
                        &who("acme"),
                        call("echo", r#"{"text":"alive"}"#),
                    )
                    .await;
                    echo_done.store(true, std::sync::atomic::Ordering::SeqCst);
                    after_echo();
                    r
                }
            )
        })
        .await;
    assert_eq!(
        (echo.status(), echo.model_text.as_str()),
        (ToolStatus::Ok, "alive"),
        "{echo:?}"
    );
    assert!(
        echo_first,
        "the faulty call ended before the echo beside it was answered: {result:?}"
    );
    (result, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_resetting_and_garbage_upstreams_fail_promptly_while_others_are_served() {
    let mut upstreams = String::new();
    let mut tools = String::new();
    let mut broken = std::collections::HashMap::new();
    // The hang is ended by its 2 s timeout; the others have 30 s, so an answer that waited for
    // the timeout shows up as TIMEOUT instead of the prompt upstream_unavailable expected.
    for (name, how, timeout) in [
        ("hang", Misbehaviour::Hang, "2s"),
        ("reset", Misbehaviour::Reset, "30s"),
        ("close", Misbehaviour::Close, "30s"),
        ("garbage", Misbehaviour::Garbage, "30s"),
    ] {
        let upstream = broken_upstream(how).await;
        upstreams += &format!(
            "  {name}:\n    url: http://{}\n    allow_schemes: [http]\n    allow_private_addresses: true\n",
            upstream.addr
        );
        tools += &format!(
            "  - {{ name: {name}, description: d, risk_level: read_only, timeout: {timeout}, executor: {{ http: {{ upstream: {name}, path: /call }} }}, input_schema: {{ type: object }} }}\n"
        );
        broken.insert(name, upstream);
    }
    let yaml = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\nupstreams:\n{upstreams}tools:\n{tools}  - {{ name: echo, description: d, risk_level: read_only, executor: {{ builtin: echo }}, input_schema: {{ type: object }} }}\n"
    );
    let server = TestServer::start(&yaml).await;
    let client = server.client().await;
    let run = |tool: &'static str| {
        let mut client = client.clone();
        async move { exec(&mut client, &who("acme"), call(tool, "{}")).await }
    };
    let reached = |upstream: &Broken| {
        let mut accepted = upstream.accepted.clone();
        async move {
            accepted.wait_for(|n| *n >= 1).await.unwrap();
        }
    };

    let hang = &broken["hang"];
    let (r, took) = with_echo_alongside(&server, run("hang"), reached(hang), || {}).await;
    assert_eq!(
        (r.status(), r.error_type.as_str(), r.retryable),
        (ToolStatus::Timeout, "timeout", true),
        "{r:?}"
    );
    assert!(r.error_message.contains("2000 ms"), "{}", r.error_message);
    // Never before its timeout (a lower bound cannot flake on a slow machine).
    assert!(
        took >= Duration::from_secs(2),
        "a hanging upstream was given up on after {took:?}, before its 2 s timeout"
    );

    for tool in ["reset", "close", "garbage"] {
        let upstream = &broken[tool];
        let release = upstream.release.clone();
        let (r, _) = with_echo_alongside(&server, run(tool), reached(upstream), move || {
            release.send_replace(true);
        })
        .await;
        assert_eq!(
            (r.status(), r.error_type.as_str(), r.retryable),
            (ToolStatus::Error, "upstream_unavailable", true),
            "{tool}: {r:?}"
        );
        assert!(
            !r.error_message.contains("127.0.0.1"),
            "{tool}: the address leaked: {}",
            r.error_message
        );
    }
    // Every fault and every echo beside it left exactly one audit event.
    assert_eq!(server.audit_events().await.len(), 4 * 2);
    server.stop().await;
}

/// Processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(marker))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_ignores_sigterm_is_killed_at_its_timeout() {
    // A unique argument, to find the program among all processes.
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("stubborn").display().to_string();
    let script =
        "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)";
    let yaml = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\ntools:\n  - name: stubborn\n    description: d\n    risk_level: read_only\n    timeout: 2s\n    input_schema: {{ type: object }}\n    executor:\n      process:\n        command: {}\n        args: [\"-c\", {}, {}]\n        env: [PATH]\n  - {{ name: echo, description: d, risk_level: read_only, executor: {{ builtin: echo }}, input_schema: {{ type: object }} }}\n",
        python(),
        serde_json::to_string(script).unwrap(),
        serde_json::to_string(&marker).unwrap()
    );
    let env = Env::default().with("PATH", &std::env::var("PATH").unwrap_or_default());
    let server = TestServer::start_with_env(&yaml, &env).await;
    let mut client = server.client().await;
    let seen = std::sync::Mutex::new(BTreeSet::new());
    // The program is running (seen in /proc): the call is in progress.
    let running = async {
        loop {
            let pids = processes_with(&marker);
            if !pids.is_empty() {
                seen.lock().unwrap().extend(pids);
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let (r, took) = with_echo_alongside(
        &server,
        async move { exec(&mut client, &who("acme"), call("stubborn", "{}")).await },
        running,
        || {},
    )
    .await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Timeout, "timeout"),
        "{r:?}"
    );
    // Waiting for the program to give in would take its 60 s; the answer comes at the 2 s
    // timeout. 20 s is far from both, so this cannot flake on a busy machine.
    assert!(
        took < Duration::from_secs(20),
        "answered after {took:?}: the sidecar waited for the program instead of killing it"
    );
    let seen = seen.into_inner().unwrap();
    assert!(!seen.is_empty(), "the program was never seen running");
    // SIGKILL, which it cannot ignore, took the whole group down.
    within(Duration::from_secs(5), "the program to die", async {
        while !seen.iter().all(|&pid| pid_gone(pid)) || !processes_with(&marker).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    server.stop().await;
}

// --- shutdown under load -----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_finishes_or_cleanly_refuses_every_call_and_audits_each_once() {
    const CALLS: usize = 100;
    const CHANNELS: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let audit_path = dir.path().join("audit.jsonl");
    let config = dir.path().join("catalog.yaml");
    // slow_task may run 20 s here, so the calls are still running while the test sends more.
    let catalog = toolgate::settings::DEMO_CATALOG
        .replace(
            "audit:\n  sink: stdout\n",
            &format!("audit:\n  sink: file\n  path: {}\n", audit_path.display()),
        )
        .replace("timeout: 1000ms", "timeout: 20s");
    assert_eq!(catalog.matches("timeout: 20s").count(), 1);
    assert!(catalog.contains("sink: file"));
    std::fs::write(&config, catalog).unwrap();
    let spawned = crate::support::binary::spawn(&["--config", config.to_str().unwrap()]);
    let mut channels = Vec::new();
    for _ in 0..CHANNELS {
        channels.push(
            Endpoint::from_shared(format!("http://{}", spawned.addr))
                .unwrap()
                .connect()
                .await
                .unwrap(),
        );
    }
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let mut client = ToolGateClient::new(channels[i % CHANNELS].clone());
            tokio::spawn(async move {
                let mut c = call("slow_task", r#"{"ms":3000}"#);
                c.call_id = format!("shutdown-{i}");
                let answer = client
                    .execute_tool(who("acme").request(execute_request(c)))
                    .await
                    .map(|r| r.into_inner().result.expect("a result"));
                (format!("shutdown-{i}"), answer)
            })
        })
        .collect();
    // The calls hold their own handles: once they are answered, no connection stays open to
    // delay the exit.
    drop(channels);
    // SIGTERM only once the server is executing every one of them.
    let spawned = tokio::task::spawn_blocking(move || {
        spawned.wait_for_log("executing", CALLS);
        spawned
    })
    .await
    .unwrap();
    crate::support::binary::sigterm(&spawned.child);
    // Draining has begun once /readyz says 503.
    let addr: SocketAddr = spawned.addr.parse().unwrap();
    let admin: SocketAddr = spawned.admin_addr.parse().unwrap();
    within(Duration::from_secs(10), "/readyz to answer 503", async {
        while crate::support::http_get(admin, "/readyz").await.0 != 503 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // Calls sent now are refused with UNAVAILABLE while the 100 above are still running (on a
    // connection opened before the signal too: shutdown::a_call_on_a_draining_connection_is_unavailable).
    let late_channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let mut late = Vec::new();
    for j in 0..10 {
        let mut client = ToolGateClient::new(late_channel.clone());
        let mut c = call("echo", r#"{"text":"too late"}"#);
        c.call_id = format!("late-{j}");
        let answer = within(
            Duration::from_secs(10),
            "a call after SIGTERM",
            client.execute_tool(who("acme").request(execute_request(c))),
        )
        .await;
        late.push(answer.map(|r| r.into_inner().result));
    }
    for answer in &late {
        match answer {
            Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
            Ok(result) => panic!("a call sent while draining was answered: {result:?}"),
        }
    }
    // They were refused while the server drained, not after it had gone: calls sent before the
    // signal were still running.
    assert!(
        calls.iter().any(|c| !c.is_finished()),
        "every call had finished before the late calls were sent"
    );
    let mut ok = BTreeSet::new();
    let mut unavailable = 0;
    for handle in calls {
        let (id, answer) = within(Duration::from_secs(15), "a call during shutdown", handle)
            .await
            .unwrap();
        match answer {
            Ok(r) if r.status() == ToolStatus::Ok => {
                ok.insert(id);
            }
            Err(status) if status.code() == Code::Unavailable => unavailable += 1,
            other => panic!("{id}: neither OK nor a clean UNAVAILABLE: {other:?}"),
        }
    }
    let (status, logs) = tokio::task::spawn_blocking(move || {
        let mut spawned = spawned;
        (
            crate::support::binary::wait_exit(&mut spawned.child),
            spawned.logs(),
        )
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(0), "{logs}");
    // Every call sent before the signal reached the boundary, so each has exactly one event
    // (those that finished say OK); the refused late calls have none.
    let text = std::fs::read_to_string(&audit_path).unwrap();
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(events.len(), CALLS, "{text}");
    let ids: BTreeSet<&str> = events
        .iter()
        .map(|e| e["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), CALLS, "an event twice, or one missing");
    for event in &events {
        let id = event["call_id"].as_str().unwrap();
        assert_eq!(
            event["status"] == "OK",
            ok.contains(id),
            "{event} vs what the client saw"
        );
    }
    assert!(ids.iter().all(|id| id.starts_with("shutdown-")), "{ids:?}");
    eprintln!(
        "shutdown under load: {} OK, {unavailable} UNAVAILABLE; {} sent after the signal, all UNAVAILABLE",
        ok.len(),
        late.len()
    );
}

/// Memory per call in flight is mostly the call's future: a sidecar holding 10,000 slow calls
/// holds 10,000 of them. Rare state (the idempotency claim) is boxed so it is paid for only when
/// used, the audit event is built when the call ends, and the stages before the backend run in a
/// future of their own; this guards against any of that creeping back (an unboxed audit event
/// alone added 3 KiB; the future was 1,672 bytes before the split). docs/performance.md has the
/// measured sizes.
#[tokio::test]
async fn the_per_call_future_stays_small() {
    use toolgate::boundary::{CallRequest, Turn};
    let server = TestServer::demo().await;
    let turn = Turn {
        door: toolgate::identity::Door::Grpc,
        caller: std::sync::Arc::new(toolgate::identity::Caller {
            tenant: "acme".into(),
            subject: "alice".into(),
            agent: "".into(),
            scopes: Default::default(),
            method: toolgate::identity::AuthMethod::Dev,
            claims: Default::default(),
            token: None,
            delegation: None,
        }),
        run_id: "run".into(),
        step: 0,
        catalog_revision: None,
        deadline: None,
        trace_parent: Default::default(),
    };
    let call = CallRequest {
        name: "echo".into(),
        arguments_json: r#"{"text":"hi"}"#.into(),
        ..CallRequest::default()
    };
    let budget = toolgate::boundary::ResponseBudget::new(4 << 20, 1);
    let future = server.boundary().execute(&turn, call, 0, &budget);
    let size = std::mem::size_of_val(&future);
    assert!(size <= 1536, "Boundary::execute's future is {size} bytes");
    // Still a working call: the future measured is the real one.
    let outcome = future.await;
    assert_eq!(outcome.status, toolgate::error::Status::Ok, "{outcome:?}");
    server.stop().await;
}

/// TCP_NODELAY on every accepted socket (tonic ignores the builder's setting for a listener it
/// did not bind): with Nagle's algorithm on, a response written in several segments waits for
/// the client's delayed ACK, ~40 ms per call. The server runs in this process, so its accepted
/// sockets are among this process's descriptors.
#[tokio::test]
async fn accepted_connections_have_nagle_off() {
    let server = TestServer::demo().await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut client = ToolGateClient::new(
            Endpoint::from_shared(format!("http://{}", server.addr))
                .unwrap()
                .connect()
                .await
                .unwrap(),
        );
        let result = exec(&mut client, &who("acme"), call("echo", r#"{"text":"hi"}"#)).await;
        assert_eq!(result.status(), ToolStatus::Ok);
        clients.push(client);
    }
    let accepted = accepted_sockets(server.addr.port());
    assert!(accepted.len() >= 3, "found {accepted:?}");
    for (fd, nodelay) in accepted {
        assert!(nodelay, "accepted socket fd {fd} has TCP_NODELAY off");
    }
    drop(clients);
    server.stop().await;
}

/// (descriptor, TCP_NODELAY) of this process's connected TCP sockets whose local port is `port`.
#[expect(
    unsafe_code,
    reason = "getsockname and getsockopt on this process's descriptors"
)]
fn accepted_sockets(port: u16) -> Vec<(i32, bool)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if !std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"))
        {
            continue;
        }
        // SAFETY: plain socket queries on descriptors of this process, with buffers of the sizes
        // passed; nothing is kept.
        unsafe {
            let mut local: libc::sockaddr_in = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            if libc::getsockname(fd, (&raw mut local).cast(), &mut len) != 0
                || i32::from(local.sin_family) != libc::AF_INET
                || u16::from_be(local.sin_port) != port
            {
                continue;
            }
            let mut peer: libc::sockaddr_in = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            // The listener has no peer; accepted sockets do.
            if libc::getpeername(fd, (&raw mut peer).cast(), &mut len) != 0 {
                continue;
            }
            let mut on: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            let ok = libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&raw mut on).cast(),
                &mut len,
            ) == 0;
            found.push((fd, ok && on != 0));
        }
    }
    found
}
