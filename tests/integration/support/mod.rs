//! Shared helpers: start the real server in-process on an ephemeral port, talk to it through the
//! generated tonic clients, and read its audit file.

#![allow(dead_code, reason = "each test module uses part of the helpers")]

pub mod binary;
pub mod idp;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde_json::Value;
use tempfile::TempDir;

pub use crate::redis_server::RedisServer;
use tonic::{Request, transport::Channel};
use toolgate::{
    Running, StartOptions,
    clock::{ManualClock, SharedClock},
    config::Config,
    executor::Builtins,
    proto::{self, approvals_client::ApprovalsClient, tool_gate_client::ToolGateClient},
    settings::{DEMO_CATALOG, Env},
};

/// A caller's dev identity.
#[derive(Clone, Debug, Default)]
pub struct Who {
    pub tenant: String,
    pub subject: String,
    pub agent: String,
    pub scopes: String,
    pub token: Option<String>,
}

/// The wall-clock time every test server's clock starts at (2027-01-15); it moves only when a
/// test advances it.
pub const START_UNIX_MS: i64 = 1_800_000_000_000;

/// The approvers' scope.
pub const APPROVE: &str = "toolgate:approve";

/// The demo catalog with `identity` (YAML lines under `identity:`) in place of its dev identity,
/// and without its console, whose development sign-in needs dev identity.
pub fn demo_with_identity(identity: &str) -> String {
    let demo = toolgate::settings::DEMO_CATALOG;
    let start = demo.find("  console:\n").expect("the demo has a console");
    let end = demo[start..]
        .find("\n\n")
        .map_or(demo.len(), |n| start + n + 1);
    let without_console = format!("{}{}", &demo[..start], &demo[end..]);
    assert!(without_console.contains("  dev_identity: true\n"));
    without_console.replace("  dev_identity: true\n", identity)
}

/// acme's alice: the caller of most tests.
pub fn alice() -> Who {
    who("acme").subject("alice")
}

/// acme's bob, who may approve.
pub fn bob() -> Who {
    who("acme").subject("bob").scopes(APPROVE)
}

/// `claims` signed with HS256 and `secret`: the tests' JWTs (the catalogs under test read the
/// secret from the environment).
pub fn hs256_jwt(secret: &str, claims: &serde_json::Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// The Python that runs the tests' helper programs and MCP servers: `TOOLGATE_TEST_PYTHON`, or
/// `python3`.
pub fn python() -> String {
    std::env::var("TOOLGATE_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

pub fn who(tenant: &str) -> Who {
    Who {
        tenant: tenant.into(),
        subject: "alice".into(),
        ..Who::default()
    }
}

impl Who {
    pub fn subject(mut self, subject: &str) -> Self {
        self.subject = subject.into();
        self
    }
    pub fn agent(mut self, agent: &str) -> Self {
        self.agent = agent.into();
        self
    }
    pub fn scopes(mut self, scopes: &str) -> Self {
        self.scopes = scopes.into();
        self
    }
    pub fn token(token: &str) -> Self {
        Who {
            token: Some(token.into()),
            ..Who::default()
        }
    }

    pub fn request<T>(&self, body: T) -> Request<T> {
        let mut request = Request::new(body);
        let md = request.metadata_mut();
        let mut put = |k: &'static str, v: &str| {
            if !v.is_empty() {
                md.insert(k, v.parse().expect("ascii metadata"));
            }
        };
        put("x-toolgate-tenant", &self.tenant);
        put("x-toolgate-subject", &self.subject);
        put("x-toolgate-agent", &self.agent);
        put("x-toolgate-scopes", &self.scopes);
        if let Some(token) = &self.token {
            put("authorization", &format!("Bearer {token}"));
        }
        request
    }
}

/// Where a test server keeps rate limits, approvals and idempotency keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The sidecar's memory (the default).
    Memory,
    /// A throwaway redis-server of the test's own.
    Redis,
}

/// Runs each named `async fn(Backend)` test on both backends, as `name::memory` and
/// `name::redis`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn memory() {
                super::$name(crate::support::Backend::Memory).await
            }
            #[tokio::test]
            async fn redis() {
                super::$name(crate::support::Backend::Redis).await
            }
        }
    )*};
}
pub(crate) use on_both_backends;

/// A catalog's `state:` section for a Redis at `url`. The timeout is generous: these tests are
/// about behaviour, not outages, on a shared, noisy machine.
pub fn redis_state(url: &str) -> String {
    format!("state:\n  backend: redis\n  redis: {{ url: \"{url}\", timeout: 5s }}\n")
}

/// `yaml` with a `state:` section put first.
fn with_state(yaml: &str, state: &str) -> String {
    yaml.replacen("version: 1\n", &format!("version: 1\n{state}"), 1)
}

/// A running server and its audit file.
pub struct TestServer {
    running: Option<Running>,
    pub addr: SocketAddr,
    pub audit_path: PathBuf,
    pub clock: ManualClock,
    /// The server's Redis, with the Redis backend.
    pub redis: Option<RedisServer>,
    /// The `state:` section every catalog it serves carries (a change would need a restart).
    state_section: Option<String>,
    /// The span exporter, when the catalog's telemetry (or its env) names an OTLP endpoint.
    traces: toolgate::telemetry::TelemetryGuard,
    _dir: TempDir,
}

/// Points the catalog's audit at a file (replacing any audit section) so tests can read it.
fn with_audit_file(yaml: &str, path: &std::path::Path) -> String {
    let without: String = yaml.replace("audit:\n  sink: stdout\n", "");
    without.replacen(
        "version: 1\n",
        &format!(
            "version: 1\naudit:\n  sink: file\n  path: {}\n",
            path.display()
        ),
        1,
    )
}

impl TestServer {
    /// The embedded demo catalog.
    pub async fn demo() -> Self {
        Self::start(DEMO_CATALOG).await
    }

    pub async fn start(yaml: &str) -> Self {
        Self::start_with_env(yaml, &Env::default()).await
    }

    /// The embedded demo catalog on `backend`.
    pub async fn demo_on(backend: Backend) -> Self {
        Self::start_on(backend, DEMO_CATALOG).await
    }

    /// A catalog on `backend`: with Redis, a redis-server of its own is started and named in
    /// the catalog's `state:` section.
    pub async fn start_on(backend: Backend, yaml: &str) -> Self {
        match backend {
            Backend::Memory => Self::start(yaml).await,
            Backend::Redis => {
                let redis = RedisServer::start();
                let mut server = Self::start(&with_state(yaml, &redis_state(&redis.url()))).await;
                server.redis = Some(redis);
                server
            }
        }
    }

    /// Like [`Self::start_file`], on `backend`; with Redis, every catalog written with
    /// [`Self::write_catalog`] keeps the same `state:` section.
    pub async fn start_file_on(backend: Backend, yaml: &str) -> Self {
        match backend {
            Backend::Memory => Self::start_file(yaml).await,
            Backend::Redis => {
                let redis = RedisServer::start();
                let state = redis_state(&redis.url());
                let mut server = Self::start_file(&with_state(yaml, &state)).await;
                server.redis = Some(redis);
                server.state_section = Some(state);
                server
            }
        }
    }

    pub async fn start_with_env(yaml: &str, env: &Env) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let audit_path = dir.path().join("audit.jsonl");
        // A catalog with its own audit section names the file `AUDIT_PATH`.
        let text = match yaml.contains("AUDIT_PATH") {
            true => yaml.replace("AUDIT_PATH", &audit_path.display().to_string()),
            false => with_audit_file(yaml, &audit_path),
        };
        let base = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let config = Config::from_yaml(&text, "test.yaml", &base, env)
            .unwrap_or_else(|e| panic!("test catalog: {e}"));
        Self::start_config(config, dir, audit_path).await
    }

    /// Serves a catalog exactly as given (its own audit section included).
    pub async fn start_raw(yaml: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let audit_path = dir.path().join("unused-audit.jsonl");
        let base = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let config = Config::from_yaml(yaml, "test.yaml", &base, &Env::default())
            .unwrap_or_else(|e| panic!("test catalog: {e}"));
        Self::start_config(config, dir, audit_path).await
    }

    /// Serves a catalog file (written into the test's directory), so it can be reloaded.
    pub async fn start_file(yaml: &str) -> Self {
        Self::start_file_with_env(yaml, &Env::default()).await
    }

    /// [`Self::start_file`], with the sidecar's environment.
    pub async fn start_file_with_env(yaml: &str, env: &Env) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let audit_path = dir.path().join("audit.jsonl");
        let file = dir.path().join("catalog.yaml");
        std::fs::write(&file, with_audit_file(yaml, &audit_path)).unwrap();
        let config = Config::load_file(&file, env).unwrap_or_else(|e| panic!("test catalog: {e}"));
        Self::start_config(config, dir, audit_path).await
    }

    async fn start_config(config: Config, dir: TempDir, audit_path: PathBuf) -> Self {
        let clock = ManualClock::new(START_UNIX_MS);
        let traces = toolgate::telemetry::TelemetryGuard::start_export(&config.telemetry)
            .unwrap_or_else(|e| panic!("span exporter: {e}"));
        let tracer = traces.tracer();
        let options = StartOptions {
            tracer,
            listen: Some("127.0.0.1:0".parse().unwrap()),
            clock: Some(SharedClock::new(clock.clone())),
            reload_on_sighup: false,
            admin_listen: Some("127.0.0.1:0".parse().unwrap()),
            // A catalog with `server.mcp` (the demo) gets an MCP door on a port of its own.
            mcp_listen: Some("127.0.0.1:0".parse().unwrap()),
            // And its approvals console, too.
            console_listen: Some("127.0.0.1:0".parse().unwrap()),
        };
        let running = toolgate::start(config, options)
            .await
            .expect("server starts");
        let addr = running.local_addr().expect("tcp address");
        TestServer {
            running: Some(running),
            addr,
            audit_path,
            clock,
            redis: None,
            state_section: None,
            traces,
            _dir: dir,
        }
    }

    /// Exports the spans finished so far (blocks: call outside the runtime, or in
    /// `spawn_blocking`).
    pub fn flush_spans(&self) {
        self.traces.force_flush();
    }

    /// The MCP door's address, when the catalog configures `server.mcp`.
    pub fn mcp_addr(&self) -> Option<SocketAddr> {
        self.running.as_ref().and_then(Running::mcp_addr)
    }

    /// The approvals console's address, when the catalog configures `server.console`.
    pub fn console_addr(&self) -> Option<SocketAddr> {
        self.running.as_ref().and_then(Running::console_addr)
    }

    /// The catalog file of a server started with `start_file`.
    pub fn catalog_file(&self) -> PathBuf {
        self._dir.path().join("catalog.yaml")
    }

    /// Writes a catalog (keeping the test's audit file) to `path`.
    pub fn write_catalog(&self, path: &std::path::Path, yaml: &str) {
        let yaml = match &self.state_section {
            Some(state) => with_state(yaml, state),
            None => yaml.to_owned(),
        };
        // Replaced whole, as a ConfigMap update swaps it: a poll in the middle of a plain write
        // would read half a file, refuse it and parse once more than the test counts on.
        let next = path.with_extension("yaml.next");
        std::fs::write(&next, with_audit_file(&yaml, &self.audit_path)).unwrap();
        std::fs::rename(&next, path).unwrap();
    }

    /// The test's scratch directory.
    pub fn dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    /// The admin HTTP address (/metrics, /healthz, /readyz).
    pub fn admin_addr(&self) -> std::net::SocketAddr {
        self.running().admin_addr().expect("admin endpoint")
    }

    /// Re-reads the catalog file now.
    /// Re-reads the catalog file now; the revision, or why nothing was applied (as the
    /// operator reads it).
    pub async fn reload(&self) -> Result<String, String> {
        self.running().reload().await.map_err(|err| err.to_string())
    }

    fn running(&self) -> &Running {
        self.running.as_ref().expect("server running")
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .expect("connect")
    }

    pub async fn client(&self) -> ToolGateClient<Channel> {
        ToolGateClient::new(self.channel().await)
    }

    pub async fn approvals(&self) -> ApprovalsClient<Channel> {
        ApprovalsClient::new(self.channel().await)
    }

    pub fn boundary(&self) -> &std::sync::Arc<toolgate::boundary::Boundary> {
        self.running().boundary()
    }

    /// The shadow candidate catalog's state.
    pub fn shadow(&self) -> &std::sync::Arc<toolgate::shadow::Shadow> {
        self.running().shadow()
    }

    pub fn builtins(&self) -> std::sync::Arc<Builtins> {
        self.running().executors().builtins
    }

    /// The MCP servers' connections and processes.
    pub fn mcp(&self) -> std::sync::Arc<toolgate::executor::McpManager> {
        self.running().executors().mcp
    }

    /// Every audit event written so far (the queue is flushed first).
    /// The audit events of one kind so far.
    pub async fn audit_events_of(&self, kind: &str) -> Vec<Value> {
        let mut events = self.audit_events().await;
        events.retain(|e| e["kind"] == kind);
        events
    }

    pub async fn audit_events(&self) -> Vec<Value> {
        self.running().audit().flush().await;
        let text = std::fs::read_to_string(&self.audit_path).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
            .collect()
    }

    /// Waits (bounded) until an audit event matches.
    pub async fn wait_for_audit(&self, what: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(event) = self.audit_events().await.into_iter().find(&what) {
                return event;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no matching audit event within 10s"
            );
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown().await;
        }
    }
}

/// A loopback port that refuses connections for as long as the socket lives: bound, not
/// listening. A listener bound and dropped instead frees its port for any other socket to take
/// meanwhile, and a test counting on refusals would then reach someone else's server.
/// `listen` on the socket brings a server up on that very port.
pub fn refusing_port() -> (tokio::net::TcpSocket, SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(([127, 0, 0, 1], 0).into()).unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

/// Spawns a server that picks its own loopback port and prints `listening on PORT` on stdout
/// (tests/fixtures/mcp_dynamic_server.py, or a Node server preloaded with
/// tests/fixtures/print_listen_port.cjs); returns the port once printed (60 s at most). The rest
/// of its stdout is read and dropped, so later writes never meet a closed pipe.
pub async fn spawn_listening(
    command: &mut tokio::process::Command,
) -> (u16, tokio::process::Child) {
    use tokio::io::AsyncBufReadExt;
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the server starts");
    let mut lines =
        tokio::io::BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
    let announced = async {
        while let Some(line) = lines
            .next_line()
            .await
            .expect("reading the server's stdout")
        {
            if let Some(port) = line.strip_prefix("listening on ") {
                return port.trim().parse::<u16>().ok();
            }
        }
        None
    };
    let port = tokio::time::timeout(Duration::from_secs(60), announced)
        .await
        .expect("the server says its port within 60 s")
        .expect("the server printed `listening on PORT` before closing stdout");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (port, child)
}

/// GET `path` with a bare HTTP/1.1 request (the admin endpoint: /metrics, /healthz, /readyz):
/// the status code and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // axum answers HTTP/1.1 with chunked bodies only for streams; these are sized.
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Parses Prometheus text and sums the samples of `name` whose labels include `labels`.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text");
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// Waits (bounded) until a watched counter (e.g. the builtins' calls in flight) satisfies `what`.
pub async fn wait_until(mut rx: tokio::sync::watch::Receiver<u64>, what: impl Fn(u64) -> bool) {
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|n| what(*n)))
        .await
        .expect("condition within 10s")
        .expect("watch open");
}

pub fn call(name: &str, args: &str) -> proto::ToolCall {
    proto::ToolCall {
        name: name.into(),
        arguments_json: args.into(),
        ..Default::default()
    }
}

pub fn execute_request(call: proto::ToolCall) -> proto::ExecuteToolRequest {
    proto::ExecuteToolRequest {
        call: Some(call),
        run_id: "run-1".into(),
        step: 0,
        catalog_revision: String::new(),
    }
}

/// Executes one call and returns its result.
pub async fn exec(
    client: &mut ToolGateClient<Channel>,
    who: &Who,
    call: proto::ToolCall,
) -> proto::ToolResult {
    client
        .execute_tool(who.request(execute_request(call)))
        .await
        .expect("ExecuteTool answers")
        .into_inner()
        .result
        .expect("a result")
}

/// ExplainTool by acme's alice, in `run`: what a call of `tool` with no arguments would get now.
pub async fn explain_in_run(
    server: &TestServer,
    run: &str,
    tool: &str,
) -> proto::ExplainToolResponse {
    let request = execute_request(call(tool, "{}"));
    server
        .client()
        .await
        .explain_tool(
            who("acme")
                .subject("alice")
                .request(proto::ExplainToolRequest {
                    call: request.call,
                    run_id: run.into(),
                    step: 0,
                    catalog_revision: String::new(),
                }),
        )
        .await
        .expect("ExplainTool answers")
        .into_inner()
}

pub fn status(result: &proto::ToolResult) -> proto::ToolStatus {
    result.status()
}

/// Tool names a caller sees.
pub async fn visible(client: &mut ToolGateClient<Channel>, who: &Who) -> Vec<String> {
    client
        .list_tools(who.request(proto::ListToolsRequest {}))
        .await
        .expect("ListTools answers")
        .into_inner()
        .tools
        .into_iter()
        .map(|t| t.name)
        .collect()
}

/// A catalog exercising every stage; tests use it where the demo has no suitable tool.
pub const STAGES: &str = include_str!("../../fixtures/catalogs/stages.yaml");

/// A W3C traceparent: version 00, 32 and 16 lowercase hex digits (not all zero), two for flags.
pub fn valid_traceparent(text: &str) -> bool {
    let parts: Vec<&str> = text.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            && s.bytes().any(|b| b != b'0')
    };
    parts.len() == 4
        && parts[0] == "00"
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && parts[3].len() == 2
        && parts[3].bytes().all(|b| b.is_ascii_hexdigit())
}

/// An HS256 JWT of `claims`, signed with `secret`.
pub fn hs256(secret: &str, claims: &Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).expect("an HS256 key"),
    )
    .expect("a token of JSON claims")
}

/// Makes a FIFO at `path`.
pub fn mkfifo(path: &std::path::Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
}

/// The read end of the FIFO at `path`, opened before any writer (without waiting for one), its
/// buffer shrunk to `buffer_bytes` (one page at least) and checked: so a sink a server opens
/// later blocks once that much is written and unread. Done before the server starts, the shrink
/// cannot race its first writes (`F_SETPIPE_SZ` fails with `EBUSY` once more is buffered).
/// Reads on it block, and end when the last writer closes.
#[expect(unsafe_code, reason = "F_SETPIPE_SZ and F_SETFL have no safe wrapper")]
pub fn stuck_fifo_reader(path: &std::path::Path, buffer_bytes: i32) -> std::fs::File {
    use std::os::{fd::AsRawFd, unix::fs::OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .expect("the FIFO's read end opens without a writer");
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function owns; neither call touches memory.
    let (size, flags) = unsafe {
        (
            libc::fcntl(fd, libc::F_SETPIPE_SZ, buffer_bytes),
            libc::fcntl(fd, libc::F_SETFL, 0),
        )
    };
    assert_eq!(
        size,
        buffer_bytes,
        "F_SETPIPE_SZ: {}",
        std::io::Error::last_os_error()
    );
    assert_eq!(flags, 0, "F_SETFL: {}", std::io::Error::last_os_error());
    file
}

/// The name libtest knows test `name` of module `module` by (`module_path!()`, which begins
/// with the test crate's name), for a test that runs itself again in a process of its own.
pub fn test_name(module: &str, name: &str) -> String {
    let path = module.split_once("::").map_or("", |(_, path)| path);
    format!("{path}::{name}")
}

/// The text of a Redis `INFO` answer.
pub fn info_text(info: redis::Value) -> String {
    match info {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("INFO answered {other:?}"),
    }
}

/// Fails the test instead of hanging it.
pub async fn within<T>(
    limit: std::time::Duration,
    what: &str,
    future: impl Future<Output = T>,
) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
}
