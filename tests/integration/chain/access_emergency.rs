//! Emergency denies (issue 31 A), through real servers and real clients: a deny set over the
//! Controls service hides its tools from ListTools and refuses their calls
//! (`DENIED`/`emergency_denied`, naming the deny), only for whom it names and never telling a
//! caller of a tool hidden from it; it is audited when set, cleared and expired; with
//! `cancel_running` the matching calls already running stop, their backends with them; and on
//! one Redis, three sidecars refuse within a second of the answer on the first, a sidecar
//! started later enforces it from its first call, and a clear on any lifts it everywhere.

use std::time::{Duration, Instant};

use serde_json::Value;
use tonic::transport::Channel;
use toolgate::proto::{self, ToolStatus, controls_client::ControlsClient};

use crate::{
    redis_server::RedisServer,
    shared_state::{connect, tools},
    support::binary::Spawned,
    support::{
        Backend, TestServer, Who, call, exec, hs256, http_get, metric, on_both_backends,
        redis_state, status, visible, who,
    },
};

const CATALOG: &str = r#"version: 1
identity: { dev_identity: true }
tenants:
  acme: {}
  globex: { deny: ["secret_*"] }
tools:
  - { name: send_email, description: Sends an e-mail., risk_level: read_only, executor: { builtin: echo_arguments }, input_schema: { type: object } }
  - { name: search, description: Searches., risk_level: read_only, executor: { builtin: echo_arguments }, input_schema: { type: object } }
  - { name: secret_report, description: Only for acme., risk_level: read_only, executor: { builtin: echo_arguments }, input_schema: { type: object } }
  - name: slow_send
    description: Sends, slowly.
    risk_level: write_draft
    timeout: 600s
    input_schema: { type: object }
    executor:
      process:
        command: /bin/sh
        args: ["-c", "echo $$ > \"$PID_FILE\"; exec sleep 300"]
        env: [PID_FILE]
"#;

fn deny(tools: &str, tenant: &str, reason: &str) -> proto::SetEmergencyDenyRequest {
    proto::SetEmergencyDenyRequest {
        tools: tools.into(),
        tenant: tenant.into(),
        reason: reason.into(),
        ..Default::default()
    }
}

/// An operator's request, by dev identity.
fn operator<T>(body: T) -> tonic::Request<T> {
    who("ops").subject("alice").request(body)
}

async fn controls(channel: Channel) -> ControlsClient<Channel> {
    ControlsClient::new(channel)
}

async fn set(
    client: &mut ControlsClient<Channel>,
    ask: proto::SetEmergencyDenyRequest,
) -> proto::EmergencyDeny {
    client
        .set_emergency_deny(operator(ask))
        .await
        .expect("set")
        .into_inner()
        .deny
        .unwrap()
}

async fn events(server: &TestServer) -> Vec<Value> {
    server.audit_events_of("emergency_deny").await
}

#[tokio::test]
async fn a_deny_hides_and_refuses_what_it_names_tells_nobody_else_and_is_audited() {
    let server = TestServer::start(CATALOG).await;
    let mut controls = controls(server.channel().await).await;
    let mut client = server.client().await;
    let (acme, globex) = (who("acme"), who("globex"));
    let before = client
        .list_tools(acme.request(proto::ListToolsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .catalog_revision;

    let set = set(&mut controls, deny("send_*", "acme", "mail is leaking")).await;
    assert!(set.deny_id.starts_with("emd_"), "{set:?}");
    assert_eq!(set.set_by, "ops/alice");
    // Hidden from acme, the revision changes; globex is not named and keeps it.
    let listed = client
        .list_tools(acme.request(proto::ListToolsRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert!(!listed.tools.iter().any(|t| t.name == "send_email"));
    assert_ne!(listed.catalog_revision, before);
    assert!(
        visible(&mut client, &globex)
            .await
            .contains(&"send_email".to_owned())
    );
    let r = exec(&mut client, &acme, call("send_email", "{}")).await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Denied, "emergency_denied"),
        "{r:?}"
    );
    assert!(!r.retryable);
    assert!(
        r.error_message.contains(&set.deny_id) && r.error_message.contains("mail is leaking"),
        "{}",
        r.error_message
    );
    let r = exec(&mut client, &globex, call("send_email", "{}")).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");

    // A deny of everything tells globex nothing of the tool its own rules hide.
    let all = self::set(&mut controls, deny("*", "", "stop everything")).await;
    let r = exec(&mut client, &globex, call("secret_report", "{}")).await;
    assert_eq!(r.error_type, "tool_not_found", "{r:?}");
    let r = exec(&mut client, &globex, call("search", "{}")).await;
    assert_eq!(r.error_type, "emergency_denied", "{r:?}");
    let listed = controls
        .list_emergency_denies(operator(proto::ListEmergencyDeniesRequest {}))
        .await
        .unwrap()
        .into_inner()
        .denies;
    // Oldest first; these two were set in the same millisecond of the test's clock.
    let mut ids: Vec<&String> = listed.iter().map(|d| &d.deny_id).collect();
    ids.sort();
    let mut expected = vec![&set.deny_id, &all.deny_id];
    expected.sort();
    assert_eq!(ids, expected);
    let (_, text) = http_get(server.admin_addr(), "/metrics").await;
    assert_eq!(metric(&text, "toolgate_emergency_denies", &[]), 2.0);

    // Cleared: served again.
    for id in [&set.deny_id, &all.deny_id] {
        controls
            .clear_emergency_deny(operator(proto::ClearEmergencyDenyRequest {
                deny_id: id.clone(),
            }))
            .await
            .expect("clear");
    }
    let r = exec(&mut client, &acme, call("send_email", "{}")).await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    let gone = controls
        .clear_emergency_deny(operator(proto::ClearEmergencyDenyRequest {
            deny_id: set.deny_id.clone(),
        }))
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound, "{gone:?}");
    let blank = controls
        .set_emergency_deny(operator(deny("send_*", "", " ")))
        .await
        .unwrap_err();
    assert_eq!(blank.code(), tonic::Code::InvalidArgument, "{blank:?}");

    // Audited: who set and cleared what, and why.
    let events = events(&server).await;
    let statuses: Vec<&str> = events
        .iter()
        .map(|e| e["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["SET", "SET", "CLEARED", "CLEARED"],
        "{events:#?}"
    );
    assert_eq!(events[0]["subject"], "alice");
    assert_eq!(events[0]["tool"], "send_*");
    assert_eq!(events[0]["reason"], "mail is leaking");
    assert_eq!(events[0]["emergency_deny"]["id"], set.deny_id.as_str());
    assert_eq!(events[0]["emergency_deny"]["tenant"], "acme");
    server.stop().await;
}

#[tokio::test]
async fn a_deny_that_expires_is_lifted_at_once_and_its_expiry_audited() {
    let server = TestServer::start(CATALOG).await;
    let mut controls = controls(server.channel().await).await;
    let mut client = server.client().await;
    let ask = proto::SetEmergencyDenyRequest {
        ttl_seconds: 60,
        ..deny("search", "", "a looping agent")
    };
    let set = set(&mut controls, ask).await;
    assert!(set.expires_at_unix_ms > set.set_at_unix_ms);
    let r = exec(&mut client, &who("acme"), call("search", "{}")).await;
    assert_eq!(r.error_type, "emergency_denied", "{r:?}");
    server.clock.advance(Duration::from_secs(60));
    let r = exec(&mut client, &who("acme"), call("search", "{}")).await;
    assert_eq!(r.status(), ToolStatus::Ok, "lifted at its expiry: {r:?}");
    // Taken out and audited by the sidecar's upkeep (every second).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = events(&server).await;
        if let Some(expired) = events.iter().find(|e| e["status"] == "EXPIRED") {
            assert_eq!(expired["emergency_deny"]["id"], set.deny_id.as_str());
            break;
        }
        assert!(Instant::now() < deadline, "no expiry event: {events:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_running_stops_the_matching_calls_and_their_backends() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let env = toolgate::settings::Env::default().with("PID_FILE", &pid_file.display().to_string());
    let server = TestServer::start_with_env(CATALOG, &env).await;
    let mut controls = controls(server.channel().await).await;
    let mut client = server.client().await;
    let running =
        tokio::spawn(async move { exec(&mut client, &who("acme"), call("slow_send", "{}")).await });
    // The backend is up once it wrote its pid.
    let deadline = Instant::now() + Duration::from_secs(30);
    let pid: i32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "the backend did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // A deny without cancel_running leaves the call running; one with it stops the call.
    set(&mut controls, deny("slow_*", "globex", "other tenant")).await;
    let ask = proto::SetEmergencyDenyRequest {
        cancel_running: true,
        ..deny("slow_*", "acme", "sending to the wrong list")
    };
    let stop = set(&mut controls, ask).await;
    let r = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the call ended well before its backend would have")
        .unwrap();
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Denied, "emergency_denied"),
        "{r:?}"
    );
    assert!(
        r.error_message.contains("stopped while it ran") && r.error_message.contains(&stop.deny_id),
        "{}",
        r.error_message
    );
    // Its backend was stopped.
    let deadline = Instant::now() + Duration::from_secs(30);
    while unsafe_free_alive(pid) {
        assert!(Instant::now() < deadline, "backend {pid} still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}

/// Whether a process is still there (not yet reaped counts as gone: it is a zombie).
fn unsafe_free_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            // The state follows the command's closing parenthesis.
            !stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

async fn refused_on(sidecar: &Spawned) -> bool {
    let mut client = tools(sidecar).await;
    exec(&mut client, &who("acme"), call("send_email", "{}"))
        .await
        .error_type
        == "emergency_denied"
}

/// Polls `sidecar` until its answer is `refused`, for at most `within`; how long that took.
async fn until_refused(sidecar: &Spawned, refused: bool, within: Duration) -> Duration {
    let started = Instant::now();
    while refused_on(sidecar).await != refused {
        assert!(
            started.elapsed() < within,
            "sidecar {} not {} within {within:?}",
            sidecar.addr,
            if refused { "refusing" } else { "serving" }
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sidecars_on_one_redis_share_a_deny_within_a_second_and_across_restarts() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let yaml = CATALOG.replacen(
        "version: 1\n",
        &format!(
            "version: 1\n{}audit: {{ sink: none }}\n",
            redis_state(&redis.url())
        ),
        1,
    );
    let path = dir.path().join("catalog.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let path = path.display().to_string();
    let spawn = || crate::support::binary::spawn(&["--config", &path]);
    let (a, b, c) = (spawn(), spawn(), spawn());
    for sidecar in [&a, &b, &c] {
        assert!(!refused_on(sidecar).await);
    }
    let mut on_a = controls(connect(&a.addr).await).await;
    let set = set(&mut on_a, deny("send_*", "", "incident 42")).await;
    // From the answer on A: pushed to C (the backstop re-reads only every 5 s).
    let took = until_refused(&c, true, Duration::from_secs(1)).await;
    eprintln!("the deny reached another sidecar in {took:?}");
    assert!(refused_on(&b).await);
    // Kept in Redis: a sidecar started now enforces it from its first call.
    drop(b);
    let d = spawn();
    assert!(
        refused_on(&d).await,
        "a new sidecar enforces the deny at once"
    );
    let mut on_d = controls(connect(&d.addr).await).await;
    let listed = on_d
        .list_emergency_denies(operator(proto::ListEmergencyDeniesRequest {}))
        .await
        .unwrap()
        .into_inner()
        .denies;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].deny_id, set.deny_id);
    // Cleared on C: lifted everywhere.
    let mut on_c = controls(connect(&c.addr).await).await;
    on_c.clear_emergency_deny(operator(proto::ClearEmergencyDenyRequest {
        deny_id: set.deny_id.clone(),
    }))
    .await
    .expect("clear");
    until_refused(&a, false, Duration::from_secs(1)).await;
    until_refused(&d, false, Duration::from_secs(1)).await;
}

#[tokio::test]
async fn the_mcp_door_is_governed_by_the_same_denies() {
    let server = TestServer::start(&CATALOG.replace(
        "identity: { dev_identity: true }",
        "server: { mcp: {} }\nidentity: { dev_identity: true }",
    ))
    .await;
    let mut controls = controls(server.channel().await).await;
    let set = set(&mut controls, deny("send_*", "acme", "mail is leaking")).await;
    toolgate::tls::install_crypto_provider();
    let http = reqwest::Client::new();
    let url = format!("http://{}/mcp", server.mcp_addr().expect("the MCP door"));
    let result = crate::doors::mcp_call(
        &http,
        &url,
        &who("acme"),
        "1",
        "send_email",
        serde_json::json!({}),
        serde_json::json!({}),
    )
    .await;
    assert_eq!(result["isError"], true, "{result}");
    let text = result.to_string();
    assert!(
        text.contains("emergency_denied") && text.contains(&set.deny_id),
        "{text}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_jwt_caller_needs_the_admin_scope() {
    use jsonwebtoken::{EncodingKey, Header};
    let secret = "an-operator-secret-0123456789abcdef";
    let server = TestServer::start_with_env(
        &CATALOG.replace(
            "identity: { dev_identity: true }",
            "identity: { jwt: { hs256_secret_env: OPERATOR_SECRET, audience: [toolgate] } }",
        ),
        &toolgate::settings::Env::default().with("OPERATOR_SECRET", secret),
    )
    .await;
    let token = |scope: &str| {
        let claims = serde_json::json!({
            "tenant": "ops", "sub": "alice", "scope": scope, "aud": "toolgate",
            "exp": crate::support::START_UNIX_MS / 1000 + 3600,
        });
        jsonwebtoken::encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()).unwrap(),
        )
        .unwrap()
    };
    let mut controls = controls(server.channel().await).await;
    let ask = |scope: &str| {
        crate::support::Who::token(&token(scope)).request(proto::ListEmergencyDeniesRequest {})
    };
    let refused = controls
        .list_emergency_denies(ask("toolgate:approve"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("toolgate:admin"), "{refused:?}");
    controls
        .list_emergency_denies(ask("toolgate:admin"))
        .await
        .expect("an operator with the scope");
    server.stop().await;
}

/// The CLI verbs against a real sidecar: set, list, clear, each saying how far the denies reach
/// (this sidecar only with memory state, every sidecar on the Redis with `state: redis`).
#[test]
fn the_cli_verbs_set_list_and_clear_a_deny_and_say_how_far_it_reaches() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("catalog.yaml");
    std::fs::write(
        &path,
        CATALOG.replacen(
            "version: 1\n",
            &format!("version: 1\n{}", redis_state(&redis.url())),
            1,
        ),
    )
    .unwrap();
    let path = path.display().to_string();
    for (sidecar, reach) in [
        (
            crate::support::binary::spawn(&["--config", &path]),
            "hold on every sidecar sharing this one's Redis",
        ),
        (
            crate::support::binary::spawn(&[]),
            "hold on this sidecar only: its state is in memory",
        ),
    ] {
        let sh = |command: &str| crate::cli::run_shell(command, &sidecar.addr);
        let (code, out, err) =
            sh("toolgate deny --tool 'refund_*' --tenant acme --reason 'incident 7' --for 1h");
        assert_eq!(code, Some(0), "{out}{err}");
        assert!(
            out.contains(" set: refund_* for tenant acme, until ") && out.contains(reach),
            "{out}"
        );
        let id = out.split_whitespace().next().unwrap().to_owned();
        assert!(id.starts_with("emd_"), "{out}");
        let (code, out, _) = sh("toolgate denies");
        assert_eq!(code, Some(0));
        assert!(out.contains(&id) && out.contains(reach), "{out}");
        let (_, out, err) = sh("toolgate denies --json");
        let listed: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(listed[0]["deny_id"], id.as_str(), "{out}");
        assert!(err.contains(reach), "--json says it on stderr: {err}");
        let (code, out, _) = sh(&format!("toolgate undeny {id}"));
        assert_eq!(code, Some(0), "{out}");
        assert!(out.contains(&format!("{id} cleared: ")), "{out}");
        let (_, out, _) = sh("toolgate denies");
        assert!(out.starts_with("no emergency denies in force\n"), "{out}");
        crate::support::binary::stop_blocking(sidecar);
    }
}

/// A loopback TCP proxy to a Redis that holds back each `HVALS` (how a sidecar reads the shared
/// denies) until released: a Redis slow to give them.
struct HoldingProxy {
    addr: std::net::SocketAddr,
    held: tokio::sync::watch::Receiver<bool>,
    release: tokio::sync::watch::Sender<bool>,
}

impl HoldingProxy {
    async fn start(upstream: u16) -> HoldingProxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (held_tx, held) = tokio::sync::watch::channel(false);
        let (release, released) = tokio::sync::watch::channel(false);
        let held_tx = std::sync::Arc::new(held_tx);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    return;
                };
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                });
                let (held_tx, mut released) = (held_tx.clone(), released.clone());
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 64 * 1024];
                    loop {
                        let n = match from_client.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if buffer[..n].windows(5).any(|w| w == b"HVALS") {
                            held_tx.send_replace(true);
                            if released.wait_for(|r| *r).await.is_err() {
                                return;
                            }
                        }
                        if to_server.write_all(&buffer[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        HoldingProxy {
            addr,
            held,
            release,
        }
    }
}

/// The binary on a port chosen here (its log says nothing of it until it serves), killed when
/// dropped.
struct Starting(std::process::Child);

impl Drop for Starting {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_sidecar_reads_the_shared_denies_before_it_serves_any_call() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let write_config = |name: &str, url: &str| {
        let yaml = CATALOG.replacen(
            "version: 1\n",
            &format!("version: 1\n{}audit: {{ sink: none }}\n", redis_state(url)),
            1,
        );
        let path = dir.path().join(name);
        std::fs::write(&path, yaml).unwrap();
        path.display().to_string()
    };
    // A deny kept in Redis, set on a sidecar that is gone.
    let direct = write_config("direct.yaml", &redis.url());
    let first = crate::support::binary::spawn(&["--config", &direct]);
    let set = set(
        &mut controls(connect(&first.addr).await).await,
        deny("send_*", "", "incident 43"),
    )
    .await;
    drop(first);

    // A new sidecar whose Redis is slow to give the denies.
    let proxy = HoldingProxy::start(redis.port()).await;
    let slow = write_config("slow.yaml", &format!("redis://{}", proxy.addr));
    let port = crate::redis_server::free_port();
    let addr = format!("127.0.0.1:{port}");
    let _sidecar = Starting(
        std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["serve", "--listen", &addr, "--config", &slow])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn toolgate"),
    );
    let mut held = proxy.held.clone();
    tokio::time::timeout(Duration::from_secs(30), held.wait_for(|h| *h))
        .await
        .expect("the sidecar reads the shared denies within 30s of its start")
        .unwrap();
    // While they are held, a call must not be answered as if there were none. Waiting a
    // second only gives a sidecar that serves too early the chance to show it; one that waits
    // answers once they are read, whenever that is.
    let mut first_call = tokio::spawn({
        let addr = addr.clone();
        async move {
            let mut client = toolgate::proto::tool_gate_client::ToolGateClient::new(
                tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                    .unwrap()
                    .connect_lazy(),
            );
            exec(&mut client, &who("acme"), call("send_email", "{}")).await
        }
    });
    let early = tokio::time::timeout(Duration::from_secs(1), &mut first_call).await;
    proxy.release.send_replace(true);
    let answered_early = early.is_ok();
    let answer = match early {
        Ok(answer) => answer.unwrap(),
        Err(_) => first_call.await.unwrap(),
    };
    assert_eq!(
        (answer.status(), answer.error_type.as_str()),
        (ToolStatus::Denied, "emergency_denied"),
        "the first call (answered before the denies were read: {answered_early}): {answer:?}"
    );
    assert!(answer.error_message.contains(&set.deny_id), "{answer:?}");
}

/// A tenant's admin (a JWT of tenant acme with `toolgate:admin`) sets, lists and clears the
/// denies of its own tenant only; the platform's operators (`identity.platform_tenants`) set
/// them on every tenant and for every tenant, and only they lift theirs. Each set and clear is
/// audited with the operator and the deny's tenant. (Issue 52, item 1: acme's admin could deny
/// globex's tools, deny every tenant's, read globex's reasons and lift the platform's deny.)
async fn a_tenants_admin_acts_only_on_its_own_tenants_denies(backend: Backend) {
    let secret = "a-controls-secret-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, secret).unwrap();
    let yaml = CATALOG.replace(
        "identity: { dev_identity: true }",
        &format!(
            "identity: {{ jwt: {{ hs256_secret_file: {}, audience: [toolgate] }}, platform_tenants: [ops] }}",
            secret_file.display()
        ),
    );
    let server = TestServer::start_on(backend, &yaml).await;
    let as_who = |tenant: &str, subject: &str| {
        let claims = serde_json::json!({
            "tenant": tenant, "sub": subject, "scope": "toolgate:admin", "aud": "toolgate",
            "exp": crate::support::START_UNIX_MS / 1000 + 3600,
        });
        Who::token(&hs256(secret, &claims))
    };
    let (ops, mallory, gina) = (
        as_who("ops", "olga"),
        as_who("acme", "mallory"),
        as_who("globex", "gina"),
    );
    let mut controls = controls(server.channel().await).await;
    let mut client = server.client().await;

    // The platform's operator stops a tool of globex's.
    let incident = controls
        .set_emergency_deny(ops.request(deny(
            "search",
            "globex",
            "globex incident 4711: data leak to competitor",
        )))
        .await
        .expect("the platform sets a deny on any tenant")
        .into_inner()
        .deny
        .unwrap();

    // acme's admin can neither deny globex's tools nor lift globex's deny, nor read it.
    let refused = controls
        .set_emergency_deny(mallory.request(deny("*", "globex", "mine now")))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("own tenant (acme)"),
        "{refused:?}"
    );
    let gone = controls
        .clear_emergency_deny(mallory.request(proto::ClearEmergencyDenyRequest {
            deny_id: incident.deny_id.clone(),
        }))
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound, "{gone:?}");
    // A deny naming no tenant is acme's, not every tenant's.
    let own = controls
        .set_emergency_deny(mallory.request(deny("send_*", "", "our mail leaks")))
        .await
        .expect("a tenant's admin sets its own tenant's denies")
        .into_inner()
        .deny
        .unwrap();
    assert_eq!(own.tenant, "acme");
    assert_eq!(own.set_by, "acme/mallory");
    let r = exec(&mut client, &gina, call("send_email", "{}")).await;
    assert_eq!(status(&r), ToolStatus::Ok, "globex still sends: {r:?}");
    let r = exec(&mut client, &gina, call("search", "{}")).await;
    assert_eq!(
        r.error_type, "emergency_denied",
        "globex's deny holds: {r:?}"
    );
    assert_eq!(
        listed(&mut controls, &mallory).await,
        ["acme our mail leaks"]
    );
    assert_eq!(
        listed(&mut controls, &gina).await,
        ["globex globex incident 4711: data leak to competitor"]
    );
    assert_eq!(listed(&mut controls, &ops).await.len(), 2);

    // The platform's deny on acme shows to acme, and only the platform lifts it.
    let on_acme = controls
        .set_emergency_deny(ops.request(deny("search", "acme", "acme's agent loops")))
        .await
        .unwrap()
        .into_inner()
        .deny
        .unwrap();
    assert_eq!(listed(&mut controls, &mallory).await.len(), 2);
    let kept = controls
        .clear_emergency_deny(mallory.request(proto::ClearEmergencyDenyRequest {
            deny_id: on_acme.deny_id.clone(),
        }))
        .await
        .unwrap_err();
    assert_eq!(kept.code(), tonic::Code::PermissionDenied, "{kept:?}");
    assert!(kept.message().contains("platform"), "{kept:?}");
    controls
        .clear_emergency_deny(mallory.request(proto::ClearEmergencyDenyRequest {
            deny_id: own.deny_id.clone(),
        }))
        .await
        .expect("acme's admin lifts acme's own deny");
    // A deny for every tenant is the platform's to set.
    let fleet = controls
        .set_emergency_deny(ops.request(deny("secret_*", "", "rotating keys")))
        .await
        .unwrap()
        .into_inner()
        .deny
        .unwrap();
    assert_eq!(fleet.tenant, "");
    assert_eq!(listed(&mut controls, &ops).await.len(), 3);

    // Every set and clear names who did it and on which tenant.
    let events = events(&server).await;
    let seen: Vec<(String, String, String, Value)> = events
        .iter()
        .map(|e| {
            (
                e["status"].as_str().unwrap().to_owned(),
                e["tenant"].as_str().unwrap().to_owned(),
                e["subject"].as_str().unwrap().to_owned(),
                e["emergency_deny"]["tenant"].clone(),
            )
        })
        .collect();
    let row =
        |s: &str, t: &str, who: &str, on: Value| (s.to_owned(), t.to_owned(), who.to_owned(), on);
    assert_eq!(
        seen,
        [
            row("SET", "ops", "olga", "globex".into()),
            row("SET", "acme", "mallory", "acme".into()),
            row("SET", "ops", "olga", "acme".into()),
            row("CLEARED", "acme", "mallory", "acme".into()),
            row("SET", "ops", "olga", Value::Null),
        ],
        "{events:#?}"
    );
    server.stop().await;
}

on_both_backends!(a_tenants_admin_acts_only_on_its_own_tenants_denies);

/// The denies `who` is shown, as `tenant reason`, sorted.
async fn listed(controls: &mut ControlsClient<Channel>, who: &Who) -> Vec<String> {
    let denies = controls
        .list_emergency_denies(who.request(proto::ListEmergencyDeniesRequest {}))
        .await
        .expect("a listing")
        .into_inner()
        .denies;
    let mut shown: Vec<String> = denies
        .into_iter()
        .map(|d| format!("{} {}", d.tenant, d.reason))
        .collect();
    shown.sort();
    shown
}
