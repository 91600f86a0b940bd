//! The load harness (docs/performance.md): how much the execution boundary costs on top of the
//! gRPC stack it runs on, and what the sidecar costs in memory and start-up time.
//!
//! ```sh
//! cargo bench --bench load -- [--duration 10s] [--connections N] [--concurrency M] [--rate RPS] [--quick]
//! ```
//!
//! In order, all over loopback on this machine:
//! 1. a bare tonic unary echo (toolgate's own `ToolGate` service with a trivial `ExecuteTool`, so the
//!    codec and message shapes match) — the limit of the stack — in this process, then
//! 2. toolgate started in-process with the whole boundary (JWT, schema, bound argument, rate limit,
//!    audit to a file) and the subscriber the binary installs (JSON logs, OTLP spans to an
//!    in-process collector), then
//! 3. the same pair as separate processes: the bare echo (this executable re-run with a hidden
//!    flag) and `target/release/toolgate` with the same catalog — the deployed shape, including
//!    whatever logging and OTLP export the binary installs — the binary once more with its state
//!    (both rate limits of every call) in a `redis-server` of its own on loopback, and, in
//!    max-rate mode only, variants of the binary for the CPU split (span export off, audit off)
//!    and one with a shadow catalog (`shadow_catalog`: each call explained again against a
//!    candidate), reported as a ratio of the binary's throughput without;
//!
//! each in max-rate mode (closed loop: N connections × M calls in flight each) and fixed-rate
//! mode (open loop: calls sent on a schedule, latency measured from each call's intended send time
//! so a stall is not hidden by coordinated omission). Then the binary's start-up time to health
//! SERVING, its idle RSS and its RSS with thousands of `slow_task` calls in flight.
//!
//! `--quick` runs every step with tiny durations and counts, as a smoke test. Every loop here is
//! bounded in count and time, and only loopback addresses are used.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark, like a test: a failure is a panic"
)]
#![expect(
    unsafe_code,
    reason = "set_var before any thread, prctl, kill(2) and sysconf, each with its SAFETY comment"
)]

#[path = "../tests/common/otlp_collector.rs"]
mod otlp_collector;
#[path = "../tests/common/redis_server.rs"]
mod redis_server;

use std::{
    collections::BTreeMap,
    fs::File,
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, anyhow, bail};
use hdrhistogram::Histogram;
use tokio::{runtime::Runtime, sync::watch, task::JoinSet};
use tonic::{
    Request, Response, Status,
    metadata::{Ascii, MetadataValue},
    transport::{Channel, Endpoint},
};
use toolgate::{
    StartOptions,
    config::{Config, Env},
    proto::{
        self,
        tool_gate_client::ToolGateClient,
        tool_gate_server::{ToolGate, ToolGateServer},
    },
    telemetry::LogFormat,
};

const USAGE: &str = "usage: cargo bench --bench load -- [--duration 10s] [--warmup 2s] \
[--connections N] [--concurrency M] [--rate RPS] [--payload BYTES] [--slow-calls N] \
[--slow-ms MS] [--startup-runs N] [--rounds N] [--binary PATH] [--quick]
profiling helper (send calls to a server started by hand, e.g. under valgrind, then exit):
       cargo bench --bench load -- --send-only 127.0.0.1:PORT [--tool echo|slow] [--calls N] \
[--connections N] [--concurrency M] [--payload BYTES] [--slow-ms MS] [--send-rate RPS --duration D]
and the servers to send them to (each runs until SIGINT/SIGTERM; the bare echo two hours at most,
the collector ten minutes):
       cargo bench --bench load -- --write-catalog DIR   (DIR/bench.yaml; audit to DIR/audit.jsonl)
       cargo bench --bench load -- --serve-bare-echo 127.0.0.1:PORT
       cargo bench --bench load -- --serve-collector 127.0.0.1:PORT   (OTLP/gRPC; counts spans)
interleaved A/B of two toolgate executables, each its own process with the bench catalog, audit
to a file and spans to the harness's collector, measured in turn every round (the order swapped
each round), max rate and the fixed rates; a table per round, then the medians and B / A:
       cargo bench --bench load -- --ab PATH_B [--binary PATH_A] [--rounds N] [--duration D] \
[--rate RPS] [--connections N] [--concurrency M]";

/// The rows of the results table.
const BARE: &str = "bare echo, in-process";
const TOOLGATE: &str = "toolgate, in-process";
const BARE_PROCESS: &str = "bare echo, own process";
const BINARY: &str = "toolgate binary, own process";
/// The binary again, each call with a JWT it has never seen (no verified-token cache hits).
const BINARY_FRESH_JWT: &str = "toolgate binary, a new JWT per call";
/// Switch-off variants, for the CPU split: span export off, then audit off too.
const BINARY_NO_EXPORT: &str = "toolgate binary, span export off";
const BINARY_NO_AUDIT: &str = "toolgate binary, span export and audit off";
/// The binary with a shadow catalog: every call also explained against a candidate that decides
/// the bench's calls alike (so it costs the explanation, not audit events for differences).
const BINARY_SHADOW: &str = "toolgate binary, shadow catalog";
/// The binary sampling 10 % of new traces (`parentbased_traceidratio`), as a production pod
/// exporting to a shared collector would.
const BINARY_SAMPLED: &str = "toolgate binary, 10 % of traces sampled";
/// The binary with `state: { backend: redis }`: both quotas of each call in one Lua script.
const BINARY_REDIS: &str = "toolgate binary + Redis, own process";

/// OTEL_SERVICE_NAME of each exporting server, so the collector can count spans per target.
const SERVICE_IN_PROCESS: &str = "toolgate-bench-in-process";
const SERVICE_BINARY: &str = "toolgate-bench-binary";
const SERVICE_FRESH_JWT: &str = "toolgate-bench-fresh-jwt";
const SERVICE_SHADOW: &str = "toolgate-bench-shadow";
const SERVICE_REDIS: &str = "toolgate-bench-redis";
const SERVICE_SAMPLED: &str = "toolgate-bench-sampled";

/// Re-runs this executable as the bare echo server on the given address.
const BARE_SERVER_FLAG: &str = "--serve-bare-echo";
/// What the bare echo process writes on stderr, before its address, once it listens.
const BARE_LISTENING: &str = "bare echo listening on";
/// Profiling helpers: an OTLP collector on the given address; the bench catalog written to a
/// directory, for a `toolgate serve` started by hand.
const COLLECTOR_FLAG: &str = "--serve-collector";
const WRITE_CATALOG_FLAG: &str = "--write-catalog";
/// The HS256 secret's environment variable, named by the catalog.
const SECRET_ENV: &str = "TOOLGATE_BENCH_JWT_SECRET";
const SECRET: &str = "toolgate-bench-hs256-secret-0123456789abcdef";
/// Every call's gRPC deadline; also bounds each call in time.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Open loop: calls outstanding beyond this are not sent (and counted), so memory stays bounded.
const MAX_OUTSTANDING: u64 = 50_000;
/// Slow calls per HTTP/2 connection.
const SLOW_CALLS_PER_CONNECTION: usize = 500;
/// Latencies are recorded in nanoseconds, up to a minute.
const HIST_MAX_NS: u64 = 60_000_000_000;

/// The targets the numbers are judged against (docs/performance.md).
const GOAL_THROUGHPUT_RATIO: f64 = 0.85;
const GOAL_ADDED_P99_MS: f64 = 0.25;
/// Server CPU per call, toolgate over bare, at saturation and at the highest fixed rate.
const GOAL_CPU_RATIO_MAX_RATE: f64 = 1.25;
const GOAL_CPU_RATIO_FIXED_RATE: f64 = 1.3;
const GOAL_IDLE_RSS_MIB: f64 = 10.0;
const GOAL_SLOW_RSS_MIB: f64 = 64.0;
/// What each slow call in flight adds to RSS beyond what the bare echo holds for one.
const GOAL_SLOW_RSS_OVER_BARE_KIB: f64 = 2.0;
const GOAL_START_MS: f64 = 100.0;

/// The catalog: one JWT-identified tenant and agent, `echo` behind every stage that can apply to
/// it (global deny list, agent allow list, a required scope, JSON Schema, a bound argument, tool
/// and tenant rate limits that never refuse, audit to a file), and a slow tool for the RSS test.
const CATALOG: &str = r#"version: 1
server:
  shutdown_grace: 2s
# The RSS step holds up to --slow-calls (at most 100,000) calls at once, 500 per connection; the
# defaults (1,024 in flight, 256 streams per connection) would refuse most of them.
limits:
  max_in_flight: 100000
  max_streams_per_connection: 1000
identity:
  jwt:
    hs256_secret_env: TOOLGATE_BENCH_JWT_SECRET
    issuer: ["https://issuer.bench"]
    audience: [toolgate]
audit:
  sink: file
  path: AUDIT_PATH
policy:
  deny: ["admin_*"]
tenants:
  acme:
    rate_limit: 100000000/s
  globex: {}
agents:
  support-bot:
    allow: ["echo", "slow"]
  "*":
    allow: ["*"]
tools:
  - name: echo
    description: Returns the given text unchanged.
    risk_level: read_only
    timeout: 5s
    required_scopes: ["tools:read"]
    rate_limit: 100000000/s
    executor: { builtin: echo }
    input_schema:
      type: object
      properties:
        text: { type: string, maxLength: 1048576, description: The text to return. }
        tenant: { type: string }
      required: [text, tenant]
      additionalProperties: false
    bind:
      tenant: "${caller.tenant}"
  - name: slow
    description: Sleeps for the given number of milliseconds.
    risk_level: read_only
    timeout: 60s
    executor: { builtin: slow_task }
    input_schema:
      type: object
      properties:
        ms: { type: integer, minimum: 0, maximum: 60000 }
      required: [ms]
      additionalProperties: false
  - name: admin_purge
    description: Denied to everyone by the global policy.
    risk_level: destructive
    executor: { builtin: delete_ticket }
    input_schema: { type: object }
"#;

/// The allocator the toolgate binary ships with, so the bare echo (in-process and as its own
/// process) runs the same stack on the same allocator and the ratios measure toolgate's own work.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value_of = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .map(|at| args.get(at + 1).map(String::as_str))
    };
    if let Some(addr) = value_of(BARE_SERVER_FLAG) {
        return serve_bare_process(addr);
    }
    if let Some(addr) = value_of(COLLECTOR_FLAG) {
        return serve_collector(addr);
    }
    if let Some(dir) = value_of(WRITE_CATALOG_FLAG) {
        return write_catalog(dir);
    }
    let options = match Options::parse(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let result = match (options.send_only, &options.ab) {
        (Some(addr), _) => send_only(&options, addr),
        (None, Some(other)) => ab(&options, other),
        (None, None) => run(&options),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("load harness: some calls failed (see the table)");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("load harness failed: {err:#}");
            ExitCode::FAILURE
        }
    }
}

// --- options -------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Options {
    quick: bool,
    duration: Duration,
    warmup: Duration,
    connections: usize,
    concurrency: usize,
    /// Fixed rates measured (open loop), in calls per second.
    rates: Vec<u64>,
    payload: usize,
    slow_calls: usize,
    slow_ms: u64,
    startup_runs: usize,
    /// Rounds: every target is measured once per round, in turn, so each row has this many
    /// measurements taken under the same conditions as the others' (and shows their spread).
    rounds: usize,
    /// How long without a new span means the exporter has sent everything.
    span_quiet: Duration,
    /// Profiling helper: only send `calls` calls of `tool` to this address, then exit.
    send_only: Option<SocketAddr>,
    /// With `send_only`: send at this fixed rate for `duration` instead of `calls` back to back
    /// (to profile what a moderate rate costs, e.g. thread wake-ups under `perf`).
    send_rate: Option<u64>,
    calls: u64,
    tool: String,
    /// The toolgate executable measured as its own process; by default the one cargo built for
    /// this bench (`target/release/toolgate`).
    binary: PathBuf,
    /// Interleaved A/B: `binary` (A) against this one (B), and nothing else.
    ab: Option<PathBuf>,
}

impl Options {
    fn defaults(quick: bool) -> Self {
        if quick {
            Options {
                quick,
                duration: Duration::from_millis(500),
                warmup: Duration::from_millis(100),
                connections: 2,
                concurrency: 4,
                rates: vec![200, 500],
                payload: 256,
                slow_calls: 200,
                slow_ms: 300,
                startup_runs: 3,
                rounds: 3,
                span_quiet: Duration::from_millis(1300),
                send_only: None,
                send_rate: None,
                calls: 1000,
                tool: "echo".into(),
                binary: PathBuf::from(env!("CARGO_BIN_EXE_toolgate")),
                ab: None,
            }
        } else {
            Options {
                quick,
                duration: Duration::from_secs(10),
                warmup: Duration::from_secs(2),
                connections: 2,
                concurrency: 32,
                rates: vec![500, 3000],
                payload: 256,
                slow_calls: 10_000,
                slow_ms: 5000,
                startup_runs: 7,
                rounds: 3,
                span_quiet: Duration::from_millis(2500),
                send_only: None,
                send_rate: None,
                calls: 1000,
                tool: "echo".into(),
                binary: PathBuf::from(env!("CARGO_BIN_EXE_toolgate")),
                ab: None,
            }
        }
    }

    fn parse(args: &[String]) -> Result<Self, String> {
        let mut options = Self::defaults(args.iter().any(|a| a == "--quick"));
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) => (name, Some(value.to_owned())),
                None => (arg.as_str(), None),
            };
            // `cargo bench` passes --bench to every bench target; --quick was read above.
            if matches!(name, "--bench" | "--quick") {
                continue;
            }
            if matches!(name, "-h" | "--help") {
                return Err(USAGE.to_owned());
            }
            let value = match inline.or_else(|| rest.next().cloned()) {
                Some(value) => value,
                None => return Err(format!("{name} needs a value\n{USAGE}")),
            };
            let bad = |what: &str| format!("{name}: {value:?} is not {what}\n{USAGE}");
            let count = || {
                value
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad("a positive whole number"))
            };
            let duration = || {
                humantime::parse_duration(&value)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| bad("a duration such as 10s or 500ms"))
            };
            match name {
                "--duration" => options.duration = duration()?,
                "--warmup" => options.warmup = duration()?,
                "--connections" => options.connections = count()? as usize,
                "--concurrency" => options.concurrency = count()? as usize,
                "--rate" => {
                    options.rates = value
                        .split(',')
                        .map(|r| r.trim().parse::<u64>().ok().filter(|r| *r > 0))
                        .collect::<Option<Vec<_>>>()
                        .filter(|r| !r.is_empty())
                        .ok_or_else(|| bad("calls per second, or several separated by commas"))?;
                }
                "--payload" => options.payload = count()? as usize,
                "--slow-calls" => options.slow_calls = count()? as usize,
                "--slow-ms" => options.slow_ms = count()?,
                "--startup-runs" => options.startup_runs = count()? as usize,
                "--rounds" => options.rounds = count()? as usize,
                "--calls" => options.calls = count()?,
                "--tool" if matches!(value.as_str(), "echo" | "slow") => options.tool = value,
                "--tool" => return Err(bad("echo or slow")),
                "--binary" if Path::new(&value).is_file() => options.binary = value.into(),
                "--binary" => return Err(bad("the path of a toolgate executable")),
                "--ab" if Path::new(&value).is_file() => options.ab = Some(value.into()),
                "--ab" => return Err(bad("the path of a toolgate executable")),
                "--send-rate" => options.send_rate = Some(count()?.max(1)),
                "--send-only" => {
                    let addr = value
                        .parse::<SocketAddr>()
                        .ok()
                        .filter(|a| a.ip().is_loopback())
                        .ok_or_else(|| bad("a loopback socket address"))?;
                    options.send_only = Some(addr);
                }
                _ => return Err(format!("unknown option {name}\n{USAGE}")),
            }
        }
        if options.payload > 512 * 1024 {
            return Err(format!("--payload is at most 524288 bytes\n{USAGE}"));
        }
        if options.slow_ms > 50_000 {
            return Err(format!(
                "--slow-ms is at most 50000 (the tool's timeout is 60s)\n{USAGE}"
            ));
        }
        if options.rounds > 20 {
            return Err(format!("--rounds is at most 20\n{USAGE}"));
        }
        if options.connections * options.concurrency > 100_000 || options.slow_calls > 100_000 {
            return Err(format!("at most 100000 calls in flight\n{USAGE}"));
        }
        Ok(options)
    }
}

// --- the run -------------------------------------------------------------------------------------

/// Runs every step and prints the tables; `Ok(false)` when calls failed.
fn run(options: &Options) -> anyhow::Result<bool> {
    // The collector's port is reserved now, before any thread exists, so the standard OTLP
    // variable can be set safely for the in-process server and inherited by the binary.
    let collector_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let otlp_endpoint = format!("http://{}", collector_listener.local_addr()?);
    // SAFETY: no other thread exists yet, so nothing reads the environment concurrently.
    unsafe { std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp_endpoint) };

    let load_at_start = load_average();
    let dir = tempfile::tempdir()?;
    let collector_rt = runtime("bench-otlp", 1)?;
    let server_rt = runtime("bench-server", 2)?;
    let client_rt = runtime("bench-client", 2)?;
    let collector = collector_rt.block_on(otlp_collector::start_on(collector_listener, 10_000));

    let text = "x".repeat(options.payload);
    let arguments_json = serde_json::json!({ "text": text }).to_string();
    let auth: MetadataValue<Ascii> = format!("Bearer {}", token(None)?).parse()?;
    let request = proto::ExecuteToolRequest {
        call: Some(proto::ToolCall {
            name: "echo".into(),
            arguments_json: arguments_json.clone(),
            ..Default::default()
        }),
        run_id: "run-bench".into(),
        step: 0,
        catalog_revision: String::new(),
    };

    // Every server is started first; then each round measures every target in turn, so all rows
    // see the same conditions, and a row's spread says how much a number moves between rounds.
    // 1. The bare echo in this process: the limit of the stack.
    let bare = server_rt.block_on(start_bare_in_process())?;
    // 2. toolgate in this process, with the subscriber `toolgate serve` installs (JSON logs to
    // stderr, spans over OTLP to the collector). Its environment is the harness's own, so
    // OTEL_SDK_DISABLED and the other OTEL_* variables reach it as they reach the binary. (The
    // in-process bare echo shares the subscriber; toolgate's filter keeps the stack's own
    // debug spans off, so it sees none.)
    let yaml = catalog(&dir.path().join("audit-in-process.jsonl"));
    let env = Env::from_process()
        .with(SECRET_ENV, SECRET)
        .with("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp_endpoint)
        .with("OTEL_SERVICE_NAME", SERVICE_IN_PROCESS);
    let config = Config::from_yaml(&yaml, "bench.yaml", dir.path(), &env)
        .map_err(|e| anyhow!("bench catalog: {e}"))?;
    let telemetry = toolgate::telemetry::init(LogFormat::Json, &config.telemetry)?;
    let running = server_rt.block_on(toolgate::start(
        config,
        StartOptions {
            listen: Some("127.0.0.1:0".parse()?),
            tracer: telemetry.tracer(),
            ..StartOptions::default()
        },
    ))?;
    let in_process_addr = running.local_addr().context("toolgate listens on TCP")?;
    // 3. The deployed shape: the bare echo (this executable re-run with a hidden flag) and the
    // toolgate binary as processes of their own; the binary also with a new JWT per call, and
    // with span export, then audit too, switched off (for the CPU split).
    let exe = options.binary.clone();
    let (mut bare_child, bare_addr) = spawn_bare(&dir.path().join("bare.log"))?;
    // The state backend of the Redis row: a redis-server of its own on loopback, nothing saved.
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        bail!(
            "the toolgate + Redis row needs redis-server on the PATH (Debian package redis-server)"
        );
    }
    let redis = redis_server::RedisServer::start();
    let write = |name: &str, yaml: String| -> anyhow::Result<PathBuf> {
        let path = dir.path().join(name);
        std::fs::write(&path, yaml)?;
        Ok(path)
    };
    let config_path = write(
        "bench.yaml",
        catalog(&dir.path().join("audit-binary.jsonl")),
    )?;
    let export_off = [("OTEL_SDK_DISABLED", "true")];
    let mut spawned = vec![
        Spawned::spawn(&exe, &config_path, dir.path(), SERVICE_BINARY, &[])?,
        Spawned::spawn(
            &exe,
            &write(
                "bench-fresh.yaml",
                catalog(&dir.path().join("audit-fresh.jsonl")),
            )?,
            dir.path(),
            SERVICE_FRESH_JWT,
            &[],
        )?,
        Spawned::spawn(
            &exe,
            &write(
                "bench-no-export.yaml",
                catalog(&dir.path().join("audit-no-export.jsonl")),
            )?,
            dir.path(),
            "toolgate-bench-no-export",
            &export_off,
        )?,
        Spawned::spawn(
            &exe,
            &write("bench-no-audit.yaml", catalog_without_audit())?,
            dir.path(),
            "toolgate-bench-no-audit",
            &export_off,
        )?,
        Spawned::spawn(
            &exe,
            &write(
                "bench-redis.yaml",
                catalog_with_redis(&dir.path().join("audit-redis.jsonl"), &redis.url()),
            )?,
            dir.path(),
            SERVICE_REDIS,
            &[],
        )?,
    ];
    let candidate = write(
        "bench-candidate.yaml",
        candidate_catalog(&dir.path().join("audit-candidate.jsonl")),
    )?;
    spawned.push(Spawned::spawn(
        &exe,
        &write(
            "bench-shadow.yaml",
            catalog_with_shadow(&dir.path().join("audit-shadow.jsonl"), &candidate),
        )?,
        dir.path(),
        SERVICE_SHADOW,
        &[("TOOLGATE_ADMIN_LISTEN", "127.0.0.1:0")],
    )?);
    spawned.push(Spawned::spawn(
        &exe,
        &write(
            "bench-sampled.yaml",
            catalog(&dir.path().join("audit-sampled.jsonl")),
        )?,
        dir.path(),
        SERVICE_SAMPLED,
        &[
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.1"),
        ],
    )?);
    let mut binaries = Vec::with_capacity(spawned.len());
    for binary in spawned {
        binaries.push(binary.wait_serving(&client_rt)?.0);
    }
    // The candidate loads right after start; measuring before it did would measure nothing.
    let shadow_admin = binaries[5]
        .admin
        .context("the shadow binary said nothing of its admin listener")?;
    wait_shadow_loaded(shadow_admin)?;
    let own = |name, addr, pid: u32, expected: &str| Target {
        server_pid: Some(pid),
        ..Target::new(name, addr, &request, &auth, expected)
    };
    let targets = [
        (
            Target::new(BARE, bare.addr, &request, &auth, &arguments_json),
            true,
        ),
        (
            Target::new(TOOLGATE, in_process_addr, &request, &auth, &text),
            true,
        ),
        (
            own(BARE_PROCESS, bare_addr, bare_child.pid(), &arguments_json),
            true,
        ),
        (
            own(BINARY, binaries[0].addr, binaries[0].pid(), &text),
            true,
        ),
        (
            Target {
                fresh_tokens: true,
                ..own(BINARY_FRESH_JWT, binaries[1].addr, binaries[1].pid(), &text)
            },
            true,
        ),
        // The switch-off variants only give CPU per call, from the max-rate mode.
        (
            own(BINARY_NO_EXPORT, binaries[2].addr, binaries[2].pid(), &text),
            false,
        ),
        (
            own(BINARY_NO_AUDIT, binaries[3].addr, binaries[3].pid(), &text),
            false,
        ),
        (
            Target {
                state_pid: redis.pid(),
                ..own(BINARY_REDIS, binaries[4].addr, binaries[4].pid(), &text)
            },
            true,
        ),
        // The shadow catalog's cost: max rate and CPU per call, against the binary without.
        (
            own(BINARY_SHADOW, binaries[5].addr, binaries[5].pid(), &text),
            false,
        ),
        (
            own(BINARY_SAMPLED, binaries[6].addr, binaries[6].pid(), &text),
            true,
        ),
    ];
    let mut rows: Vec<Row> = Vec::new();
    let mut calls_by_target = vec![0u64; targets.len()];
    let mut all_ok = true;
    let measured = (|| -> anyhow::Result<()> {
        for round in 0..options.rounds {
            eprintln!("round {} of {}", round + 1, options.rounds);
            for (i, (target, fixed)) in targets.iter().enumerate() {
                let measured = measure(options, &client_rt, target, *fixed, &mut rows)?;
                all_ok &= measured.ok;
                calls_by_target[i] += measured.calls;
            }
        }
        Ok(())
    })();
    // What the shadow worker did with the calls it was offered: compared, or skipped (its
    // queue full), so the ratio below is read with what it covered.
    let shadow = shadow_counts(shadow_admin);
    server_rt.block_on(bare.stop());
    server_rt.block_on(running.shutdown());
    bare_child.stop(Duration::from_secs(5))?;
    for binary in &mut binaries {
        binary.stop()?;
    }
    measured?;
    // Why spans went missing, if they did: the binaries log every drop and failed export.
    for binary in &binaries {
        let log = std::fs::read_to_string(&binary.log).unwrap_or_default();
        for line in log.lines().filter(|line| {
            line.to_ascii_lowercase().contains("span")
                && (line.contains("\"WARN\"") || line.contains("\"ERROR\""))
        }) {
            println!("{}: {line}", binary.log.display());
        }
    }
    // Flushes the in-process spans still queued (from this thread: the exporter's runtime is
    // dropped here); the binaries flushed theirs when they stopped.
    telemetry.shutdown();
    collector_rt.block_on(collector.wait_until_quiet(options.span_quiet, options.span_quiet * 4));
    let calls_of = |name: &str| {
        targets
            .iter()
            .position(|(t, _)| t.name == name)
            .map_or(0, |i| calls_by_target[i])
    };
    let spans_report = vec![
        (
            TOOLGATE,
            collector.received_from(SERVICE_IN_PROCESS),
            calls_of(TOOLGATE),
        ),
        (
            BINARY,
            collector.received_from(SERVICE_BINARY),
            calls_of(BINARY),
        ),
        (
            BINARY_FRESH_JWT,
            collector.received_from(SERVICE_FRESH_JWT),
            calls_of(BINARY_FRESH_JWT),
        ),
        (
            BINARY_REDIS,
            collector.received_from(SERVICE_REDIS),
            calls_of(BINARY_REDIS),
        ),
        (
            BINARY_SAMPLED,
            collector.received_from(SERVICE_SAMPLED),
            calls_of(BINARY_SAMPLED),
        ),
    ];

    // 4. Start-up time to health SERVING.
    let mut startups = Vec::new();
    for _ in 0..options.startup_runs {
        let spawned = Spawned::spawn(
            &exe,
            &config_path,
            dir.path(),
            "toolgate-bench-startup",
            &[],
        )?;
        let (mut binary, startup) = spawned.wait_serving(&client_rt)?;
        binary.stop()?;
        startups.push(startup);
    }

    // 5. Idle RSS, then RSS with many slow calls in flight: a fresh process each round.
    let settle = if options.quick {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(1)
    };
    let mut memory_rounds = Vec::new();
    let mut bare_memory_rounds = Vec::new();
    for _ in 0..options.rounds {
        let spawned = Spawned::spawn(&exe, &config_path, dir.path(), "toolgate-bench-rss", &[])?;
        let (mut binary, _) = spawned.wait_serving(&client_rt)?;
        std::thread::sleep(settle);
        let idle = memory(binary.pid()).context("reading the binary's /proc status")?;
        let slow = client_rt.block_on(slow_calls(options, binary.addr, &auth, binary.pid()));
        binary.stop()?;
        let slow = slow?;
        all_ok &= slow.failed == 0;
        memory_rounds.push((idle, slow));

        // The same against the bare echo process: the gRPC stack's own share (diagnostic).
        let (mut bare_child, bare_addr) = spawn_bare(&dir.path().join("bare-rss.log"))?;
        let bare_pid = bare_child.pid();
        std::thread::sleep(settle);
        let bare_slow = memory(bare_pid)
            .context("reading the bare echo's /proc status")
            .and_then(|idle| {
                let slow = client_rt.block_on(slow_calls(options, bare_addr, &auth, bare_pid))?;
                Ok((idle, slow))
            });
        bare_child.stop(Duration::from_secs(5))?;
        let bare_slow = bare_slow?;
        all_ok &= bare_slow.1.failed == 0;
        bare_memory_rounds.push(bare_slow);
    }

    let load_at_end = load_average();
    collector_rt.block_on(collector.shutdown());

    let shadow = shadow?;
    all_ok &= shadow.0 > 0.0;
    print_report(&Report {
        options,
        shadow,
        rows: &rows,
        spans: &spans_report,
        startups: &startups,
        memory: &memory_rounds,
        bare_memory: &bare_memory_rounds,
        load_at_start,
        load_at_end,
        otlp_endpoint: &otlp_endpoint,
    });
    Ok(all_ok)
}

fn runtime(name: &str, workers: usize) -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(name)
        .enable_all()
        .build()
}

fn catalog(audit: &Path) -> String {
    CATALOG.replace("AUDIT_PATH", &audit.display().to_string())
}

/// The bench catalog with its state in the Redis at `url`. The operation timeout is raised from
/// the default 50 ms: this row measures what sharing costs, not outages, on a saturated machine
/// where Redis competes with the load for the same cores.
fn catalog_with_redis(audit: &Path, url: &str) -> String {
    catalog(audit).replacen(
        "version: 1\n",
        &format!(
            "version: 1\nstate:\n  backend: redis\n  redis: {{ url: \"{url}\", timeout: 1s }}\n"
        ),
        1,
    )
}

/// The bench catalog with a shadow candidate.
fn catalog_with_shadow(audit: &Path, candidate: &Path) -> String {
    catalog(audit).replacen(
        "version: 1\n",
        &format!("version: 1\nshadow_catalog: {}\n", candidate.display()),
        1,
    )
}

/// The shadow candidate: the bench catalog with one deny rule narrowed, which changes no decision
/// the bench's calls get.
fn candidate_catalog(audit: &Path) -> String {
    let narrowed = catalog(audit).replace(r#"deny: ["admin_*"]"#, r#"deny: ["admin_purge"]"#);
    assert!(narrowed.contains("admin_purge\"]"));
    narrowed
}

/// The admin endpoint's metrics text (a bare HTTP/1.1 GET, loopback only).
fn admin_metrics(admin: SocketAddr) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect_timeout(&admin, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// The value of an unlabelled sample (or the sum of a family's samples) in Prometheus text.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(name) && !line.starts_with('#'))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, value| sum + value)
}

/// Waits (10 s at most) until the shadow binary has loaded its candidate.
fn wait_shadow_loaded(admin: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = admin_metrics(admin).unwrap_or_default();
        if sample(&text, "toolgate_shadow_catalog_loads_total{result=\"ok\"}") >= 1.0 {
            return Ok(());
        }
        if sample(
            &text,
            "toolgate_shadow_catalog_loads_total{result=\"refused\"}",
        ) >= 1.0
        {
            bail!("the shadow binary refused its candidate catalog");
        }
        if Instant::now() > deadline {
            bail!("the shadow binary did not load its candidate within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// (calls compared, calls skipped because the queue was full, differences) so far.
fn shadow_counts(admin: SocketAddr) -> anyhow::Result<(f64, f64, f64)> {
    let text = admin_metrics(admin)?;
    Ok((
        sample(&text, "toolgate_shadow_compared_total"),
        sample(&text, "toolgate_shadow_skipped_total"),
        sample(&text, "toolgate_shadow_differences_total"),
    ))
}

/// The bench catalog with audit switched off (`sink: none`), for the CPU split.
fn catalog_without_audit() -> String {
    let audit = "audit:\n  sink: file\n  path: AUDIT_PATH\n";
    assert!(CATALOG.contains(audit));
    CATALOG.replace(audit, "audit:\n  sink: none\n")
}

/// A JWT for tenant acme, agent support-bot, with the scope `echo` requires; valid for a day.
/// With `jti`, a token no other call used (so the sidecar has never verified it).
fn token(jti: Option<u64>) -> anyhow::Result<String> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let mut claims = serde_json::json!({
        "sub": "bench", "tenant": "acme", "agent": "support-bot", "scope": "tools:read",
        "iss": "https://issuer.bench", "aud": "toolgate", "exp": now + 86_400,
    });
    if let Some(jti) = jti {
        claims["jti"] = serde_json::json!(jti.to_string());
    }
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes())?;
    Ok(jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &key,
    )?)
}

/// The 1, 5 and 15 minute load averages, as /proc/loadavg says.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

/// The profiling helper: `options.calls` calls of `options.tool` to a server started by hand
/// (see docs/performance.md), over `connections` × `concurrency` callers; prints what came back.
fn send_only(options: &Options, addr: SocketAddr) -> anyhow::Result<bool> {
    let client_rt = runtime("bench-client", 2)?;
    let auth: MetadataValue<Ascii> = format!("Bearer {}", token(None)?).parse()?;
    let (arguments_json, timeout) = if options.tool == "slow" {
        (
            serde_json::json!({ "ms": options.slow_ms }).to_string(),
            Duration::from_millis(options.slow_ms) + Duration::from_secs(120),
        )
    } else {
        (
            serde_json::json!({ "text": "x".repeat(options.payload) }).to_string(),
            // Slow enough for a server under valgrind.
            Duration::from_secs(60),
        )
    };
    let request = proto::ExecuteToolRequest {
        call: Some(proto::ToolCall {
            name: options.tool.clone(),
            arguments_json,
            ..Default::default()
        }),
        run_id: "run-bench".into(),
        step: 0,
        catalog_revision: String::new(),
    };
    let target = Target {
        timeout,
        ..Target::new("send-only", addr, &request, &auth, "")
    };
    let channels = client_rt.block_on(connect_all(addr, options.connections))?;
    let (stats, elapsed) = match options.send_rate {
        Some(rate) => {
            let sent = open_loop(&client_rt, &channels, &target, rate, options.duration);
            (sent.stats, sent.elapsed)
        }
        None => client_rt.block_on(closed_loop(
            &channels,
            options.concurrency,
            &target,
            Budget::Calls(options.calls),
        )),
    };
    println!(
        "sent {} {} calls to {addr} in {elapsed:.2?}: {} ok, {} failed{}; p50 {:.3} ms, p99 {:.3} ms",
        stats.ok + stats.failed,
        options.tool,
        stats.ok,
        stats.failed,
        failure_note(&stats)
            .split_once(": ")
            .map(|(_, why)| format!(" (first: {why})"))
            .unwrap_or_default(),
        stats.ms(0.5),
        stats.ms(0.99)
    );
    Ok(stats.failed == 0)
}

// --- interleaved A/B -----------------------------------------------------------------------------

/// A number read off a row (throughput, a percentile, CPU per call).
type RowValue = fn(&Row) -> Option<f64>;

/// The two executables' rows in the A/B mode.
const AB_A: &str = "A (--binary)";
const AB_B: &str = "B (--ab)";

/// Interleaved A/B (`--ab`): two toolgate executables, started once each with the same catalog
/// (audit to a file, JWT, spans to the collector) and measured in turn within each round, A then B
/// in even rounds and B then A in odd ones, so a slow stretch of the machine lands on both and
/// neither always goes first. Prints each round, then each binary's median (min–max) over the
/// rounds and the ratios B / A taken per round.
fn ab(options: &Options, other: &Path) -> anyhow::Result<bool> {
    let collector_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let otlp_endpoint = format!("http://{}", collector_listener.local_addr()?);
    let load_at_start = load_average();
    let dir = tempfile::tempdir()?;
    let collector_rt = runtime("bench-otlp", 1)?;
    let client_rt = runtime("bench-client", 2)?;
    let collector = collector_rt.block_on(otlp_collector::start_on(collector_listener, 10_000));
    let text = "x".repeat(options.payload);
    let request = proto::ExecuteToolRequest {
        call: Some(proto::ToolCall {
            name: "echo".into(),
            arguments_json: serde_json::json!({ "text": text }).to_string(),
            ..Default::default()
        }),
        run_id: "run-bench".into(),
        step: 0,
        catalog_revision: String::new(),
    };
    let auth: MetadataValue<Ascii> = format!("Bearer {}", token(None)?).parse()?;
    let endpoint = [("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_endpoint.as_str())];
    let mut binaries = Vec::new();
    for (name, exe, service) in [
        (AB_A, options.binary.as_path(), "toolgate-bench-a"),
        (AB_B, other, "toolgate-bench-b"),
    ] {
        let config = dir.path().join(format!("{service}.yaml"));
        std::fs::write(
            &config,
            catalog(&dir.path().join(format!("audit-{service}.jsonl"))),
        )?;
        let binary = Spawned::spawn(exe, &config, dir.path(), service, &endpoint)?
            .wait_serving(&client_rt)?
            .0;
        println!("{name}: {} (pid {})", exe.display(), binary.pid());
        binaries.push((name, binary));
    }
    println!("load average at start: {load_at_start}");
    let mut rows = Vec::new();
    let mut rounds: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    let mut ok = true;
    for round in 0..options.rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for at in order {
            let (name, binary) = &binaries[at];
            let target = Target {
                server_pid: Some(binary.pid()),
                ..Target::new(name, binary.addr, &request, &auth, &text)
            };
            let from = rows.len();
            ok &= measure(options, &client_rt, &target, true, &mut rows)?.ok;
            rounds.push((round, from..rows.len()));
        }
    }
    let received = collector_rt
        .block_on(collector.wait_until_quiet(options.span_quiet, Duration::from_secs(60)));
    for (_, binary) in &mut binaries {
        binary.stop()?;
    }
    println!("\nEach round (server CPU from /proc/PID/stat, per answered call):\n");
    println!(
        "| round | binary | mode | throughput (calls/s) | p50 ms | p99 ms | server CPU µs/call |"
    );
    println!("|---:|---|---|---:|---:|---:|---:|");
    for (round, range) in &rounds {
        for row in &rows[range.clone()] {
            println!(
                "| {} | {} | {} | {:.0} | {:.3} | {:.3} | {} |",
                round + 1,
                row.target,
                row.mode,
                row.throughput,
                row.stats.ms(0.5),
                row.stats.ms(0.99),
                row.server_cpu_us
                    .map_or("—".into(), |us| format!("{us:.1}")),
            );
        }
    }
    // Rows of one binary in one mode, in round order.
    let of = |name: &str, mode: &str| -> Vec<&Row> {
        rows.iter()
            .filter(|r| r.target == name && r.mode == mode)
            .collect()
    };
    let modes: Vec<String> = rows
        .iter()
        .filter(|r| r.target == AB_A)
        .map(|r| r.mode.clone())
        .fold(Vec::new(), |mut modes, mode| {
            if !modes.contains(&mode) {
                modes.push(mode);
            }
            modes
        });
    let show = |values: Vec<f64>, digits: usize| {
        Spread::of(values).map_or("—".into(), |s| s.show(digits))
    };
    println!(
        "\nMedian (min–max) over {} rounds; B / A per round:\n",
        options.rounds
    );
    println!("| mode | what | A | B | B / A |");
    println!("|---|---|---:|---:|---:|");
    for mode in &modes {
        let (a, b) = (of(AB_A, mode), of(AB_B, mode));
        let pairs = || a.iter().zip(b.iter());
        let metrics: [(&str, RowValue, usize); 3] = [
            ("throughput (calls/s)", |r| Some(r.throughput), 0),
            ("p99 ms", |r| Some(r.stats.ms(0.99)), 3),
            ("server CPU µs/call", |r| r.server_cpu_us, 1),
        ];
        for (what, value, digits) in metrics {
            println!(
                "| {mode} | {what} | {} | {} | {} |",
                show(a.iter().filter_map(|r| value(r)).collect(), digits),
                show(b.iter().filter_map(|r| value(r)).collect(), digits),
                show(
                    pairs()
                        .filter_map(|(a, b)| Some(value(b)? / value(a)?))
                        .collect(),
                    3
                ),
            );
        }
    }
    let calls: u64 = rows.iter().map(|r| r.stats.ok).sum();
    println!(
        "\nOTLP spans received: {received} (from A: {}, from B: {}); calls answered in the measured phases: {calls}",
        collector.received_from("toolgate-bench-a"),
        collector.received_from("toolgate-bench-b"),
    );
    println!("load average at end: {}", load_average());
    Ok(ok)
}

// --- the bare echo -------------------------------------------------------------------------------

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
async fn serve_bare(
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

struct BareServer {
    addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl BareServer {
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

async fn start_bare_in_process() -> anyhow::Result<BareServer> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve_bare(listener, async {
        let _ = stopped.await;
    }));
    Ok(BareServer { addr, stop, task })
}

/// The bare echo as a process of its own, on the default runtime like toolgate's binary. It
/// runs until killed (the harness sends SIGTERM) or the harness dies, and for two hours at most
/// (a full run of every target takes about 25 minutes).
fn serve_bare_process(addr: Option<&str>) -> ExitCode {
    let addr = match loopback_address(BARE_SERVER_FLAG, addr) {
        Ok(addr) => addr,
        Err(code) => return code,
    };
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets a signal for this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
    }
    let served = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| {
            rt.block_on(async {
                let listener = tokio::net::TcpListener::bind(addr).await?;
                eprintln!("{BARE_LISTENING} {}", listener.local_addr()?);
                serve_bare(listener, tokio::time::sleep(Duration::from_secs(7200))).await?;
                Ok::<(), anyhow::Error>(())
            })
        });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("bare echo: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn loopback_address(flag: &str, addr: Option<&str>) -> Result<SocketAddr, ExitCode> {
    match addr.and_then(|a| a.parse::<SocketAddr>().ok()) {
        Some(addr) if addr.ip().is_loopback() => Ok(addr),
        _ => {
            eprintln!("{flag} needs a loopback socket address, e.g. 127.0.0.1:4317");
            Err(ExitCode::from(2))
        }
    }
}

/// The in-process OTLP collector as a server of its own, for profiling a binary with tracing
/// export on. Runs until SIGINT or SIGTERM (ten minutes at most), then prints what it received.
fn serve_collector(addr: Option<&str>) -> ExitCode {
    let addr = match loopback_address(COLLECTOR_FLAG, addr) {
        Ok(addr) => addr,
        Err(code) => return code,
    };
    let served = runtime("bench-otlp", 1)
        .map_err(anyhow::Error::from)
        .and_then(|rt| {
            let listener = std::net::TcpListener::bind(addr)?;
            rt.block_on(async {
                let collector = otlp_collector::start_on(listener, 10_000).await;
                eprintln!("OTLP collector on http://{addr}; SIGINT or SIGTERM stops it");
                let mut terminate =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                    () = tokio::time::sleep(Duration::from_secs(600)) => {}
                }
                let received = collector.received();
                collector.shutdown().await;
                Ok::<u64, anyhow::Error>(received)
            })
        });
    match served {
        Ok(received) => {
            println!("spans received: {received}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("collector: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Writes the bench catalog to `DIR/bench.yaml` (audit to `DIR/audit.jsonl`) and prints how to
/// serve it.
fn write_catalog(dir: Option<&str>) -> ExitCode {
    let Some(dir) = dir.map(PathBuf::from) else {
        eprintln!("{WRITE_CATALOG_FLAG} needs a directory");
        return ExitCode::from(2);
    };
    let path = dir.join("bench.yaml");
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&path, catalog(&dir.join("audit.jsonl"))));
    match written {
        Ok(()) => {
            println!(
                "{SECRET_ENV}={SECRET} target/release/toolgate serve --config {} --log-format json",
                path.display()
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("cannot write {}: {err}", path.display());
            ExitCode::FAILURE
        }
    }
}

// --- the toolgate binary -------------------------------------------------------------------------

/// `target/release/toolgate serve` with the bench catalog, started but not yet known to serve.
/// It listens on a port it chooses itself and says which on its log: a port probed here and
/// handed over could be taken by another process (another binary's admin port, say) before the
/// binary binds it.
struct Spawned {
    child: Process,
    spawned: Instant,
    log: PathBuf,
}

/// A binary that answered SERVING, and where.
struct Binary {
    child: Process,
    addr: SocketAddr,
    /// The admin listener (`/metrics`), when the binary's environment asked for one.
    admin: Option<SocketAddr>,
    log: PathBuf,
}

impl Spawned {
    fn spawn(
        exe: &Path,
        config: &Path,
        dir: &Path,
        service: &str,
        envs: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let log = dir.join(format!("{service}.log"));
        let spawned = Instant::now();
        let child = Command::new(exe)
            .arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
            .env(SECRET_ENV, SECRET)
            .env("OTEL_SERVICE_NAME", service)
            .envs(envs.iter().copied())
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        Ok(Spawned {
            child: Process(Some(child)),
            spawned,
            log,
        })
    }

    /// Waits until the health service answers SERVING; returns the binary and how long after
    /// spawning its port accepted a connection and health said SERVING.
    fn wait_serving(mut self, client_rt: &Runtime) -> anyhow::Result<(Binary, Startup)> {
        let mut listening = Duration::ZERO;
        let limit = Duration::from_secs(10);
        let serving = self.child.running().and_then(|child| {
            let addr = announced_addr(child, &self.log, limit, |line| {
                json_log_addr(line, "serving gRPC over TCP")
            })?;
            wait_listening(child, addr, limit)?;
            listening = self.spawned.elapsed();
            client_rt.block_on(health_serving(addr))?;
            let admin = std::fs::read_to_string(&self.log)?
                .lines()
                .find_map(|line| json_log_addr(line, "serving /metrics, /healthz and /readyz"));
            Ok((addr, admin))
        });
        match serving {
            Ok((addr, admin)) => {
                let startup = Startup {
                    listening,
                    serving: self.spawned.elapsed(),
                };
                let binary = Binary {
                    child: self.child,
                    addr,
                    admin,
                    log: self.log,
                };
                Ok((binary, startup))
            }
            Err(err) => {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                Err(err.context(format!("toolgate did not start; its log:\n{log}")))
            }
        }
    }
}

impl Binary {
    fn pid(&self) -> u32 {
        self.child.pid()
    }

    fn stop(&mut self) -> anyhow::Result<()> {
        self.child.stop(Duration::from_secs(15))
    }
}

/// A child process that is killed if it is still running when dropped (an error on the way).
struct Process(Option<Child>);

impl Process {
    fn running(&mut self) -> anyhow::Result<&mut Child> {
        self.0.as_mut().context("the process was already stopped")
    }

    /// Its id; 0 once stopped.
    fn pid(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// SIGTERM, then SIGKILL after `grace` (see [`stop`]); nothing if already stopped.
    fn stop(&mut self, grace: Duration) -> anyhow::Result<()> {
        match self.0.take() {
            Some(child) => stop(child, grace),
            None => Ok(()),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How long one start took.
#[derive(Debug, Clone, Copy)]
struct Startup {
    /// Until the port accepted a TCP connection.
    listening: Duration,
    /// Until the health service answered SERVING.
    serving: Duration,
}

/// The address in toolgate's JSON log line `line` if its message is `message`.
fn json_log_addr(line: &str, message: &str) -> Option<SocketAddr> {
    let event: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = event.get("fields")?;
    if fields.get("message")?.as_str()? != message {
        return None;
    }
    fields.get("addr")?.as_str()?.parse().ok()
}

/// The address a child process says it listens on: reads its log every 200 µs until a line
/// `announced` recognises appears, the child exits, or `limit` passes.
fn announced_addr(
    child: &mut Child,
    log: &Path,
    limit: Duration,
    announced: impl Fn(&str) -> Option<SocketAddr>,
) -> anyhow::Result<SocketAddr> {
    let deadline = Instant::now() + limit;
    loop {
        let text =
            std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
        if let Some(addr) = text.lines().find_map(&announced) {
            return Ok(addr);
        }
        if let Some(status) = child.try_wait()? {
            bail!("the server exited before it said where it listens: {status}");
        }
        if Instant::now() > deadline {
            bail!("the server did not say where it listens within {limit:?}");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The bare echo as a process of its own, on a port it chose itself; returns once it listens.
fn spawn_bare(log: &Path) -> anyhow::Result<(Process, SocketAddr)> {
    let mut child = Process(Some(
        Command::new(std::env::current_exe()?)
            .args([BARE_SERVER_FLAG, "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(log)?)
            .spawn()?,
    ));
    let bare_listening = |line: &str| line.strip_prefix(BARE_LISTENING)?.trim().parse().ok();
    // On an error the process is dropped, and with it killed.
    let addr = announced_addr(
        child.running()?,
        log,
        Duration::from_secs(10),
        bare_listening,
    )?;
    Ok((child, addr))
}

/// Polls a TCP connect every 200 µs until `addr` accepts, the child exits, or `limit` passes.
fn wait_listening(child: &mut Child, addr: SocketAddr, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("the server exited before listening on {addr}: {status}");
        }
        if Instant::now() > deadline {
            bail!("nothing listens on {addr} after {limit:?}");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Asks the standard health service until it says SERVING (bounded).
async fn health_serving(addr: SocketAddr) -> anyhow::Result<()> {
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = String::new();
    while Instant::now() < deadline {
        match connect(addr).await {
            Ok(channel) => {
                let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
                match health.check(HealthCheckRequest::default()).await {
                    Ok(r) if r.get_ref().status == ServingStatus::Serving as i32 => return Ok(()),
                    Ok(r) => last = format!("status {}", r.get_ref().status),
                    Err(status) => last = status.to_string(),
                }
            }
            Err(err) => last = err.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    bail!("health never said SERVING: {last}")
}

/// SIGTERM, then SIGKILL if the process has not exited within `grace`.
fn stop(mut child: Child, grace: Duration) -> anyhow::Result<()> {
    let pid = libc::pid_t::try_from(child.id())?;
    // SAFETY: kill(2) with a pid we spawned and still own (not yet waited for).
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill()?;
    child.wait()?;
    bail!("process {pid} ignored SIGTERM for {grace:?} and was killed")
}

/// A process's resident memory from /proc/PID/status, in KiB: VmRSS (= RssAnon + RssFile +
/// RssShmem), and the anonymous (heap, stacks) and file-backed (pages of the mapped executable,
/// shared with the page cache) parts.
#[derive(Debug, Clone, Copy, Default)]
struct Memory {
    rss_kib: u64,
    anon_kib: u64,
    file_kib: u64,
}

fn memory(pid: u32) -> Option<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse().ok())
    };
    Some(Memory {
        rss_kib: field("VmRSS:")?,
        anon_kib: field("RssAnon:")?,
        file_kib: field("RssFile:")?,
    })
}

// --- load ----------------------------------------------------------------------------------------

/// What the load is sent to, and what a correct answer looks like.
#[derive(Clone)]
struct Target {
    name: &'static str,
    addr: SocketAddr,
    request: proto::ExecuteToolRequest,
    auth: MetadataValue<Ascii>,
    expected_output: String,
    /// Each call's deadline.
    timeout: Duration,
    /// The server's process, when it runs apart from the harness: its CPU time is measured.
    server_pid: Option<u32>,
    /// Sign a new token for every call (the client pays for signing it: a few µs of its CPU).
    fresh_tokens: bool,
    /// The state backend's process (Redis), whose CPU time is measured too.
    state_pid: Option<u32>,
}

impl Target {
    fn new(
        name: &'static str,
        addr: SocketAddr,
        request: &proto::ExecuteToolRequest,
        auth: &MetadataValue<Ascii>,
        expected_output: &str,
    ) -> Self {
        Target {
            name,
            addr,
            request: request.clone(),
            auth: auth.clone(),
            expected_output: expected_output.to_owned(),
            timeout: CALL_TIMEOUT,
            server_pid: None,
            fresh_tokens: false,
            state_pid: None,
        }
    }
}

async fn connect(addr: SocketAddr) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?)
}

async fn connect_all(addr: SocketAddr, n: usize) -> anyhow::Result<Vec<Channel>> {
    let mut channels = Vec::with_capacity(n);
    for _ in 0..n {
        channels.push(connect(addr).await?);
    }
    Ok(channels)
}

/// Numbers the tokens of `fresh_tokens` targets, so no two calls send the same one.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(0);

/// One ExecuteTool call; `Err` says why the answer is not an OK result.
async fn call_once(
    client: &mut ToolGateClient<Channel>,
    target: &Target,
) -> Result<proto::ToolResult, String> {
    let mut request = Request::new(target.request.clone());
    let auth = if target.fresh_tokens {
        let jti = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        let token = token(Some(jti)).map_err(|e| e.to_string())?;
        format!("Bearer {token}")
            .parse::<MetadataValue<Ascii>>()
            .map_err(|e| format!("a token is not metadata: {e}"))?
    } else {
        target.auth.clone()
    };
    request.metadata_mut().insert("authorization", auth);
    request.set_timeout(target.timeout);
    let response = client
        .execute_tool(request)
        .await
        .map_err(|s| format!("gRPC {:?}: {}", s.code(), s.message()))?;
    let result = response
        .into_inner()
        .result
        .ok_or_else(|| "no result".to_owned())?;
    if result.status() != proto::ToolStatus::Ok {
        return Err(format!(
            "{} {}: {}",
            result.status().as_str_name(),
            result.error_type,
            result.error_message
        ));
    }
    Ok(result)
}

/// Latencies and outcomes of one measurement.
struct Stats {
    hist: Histogram<u64>,
    ok: u64,
    failed: u64,
    first_failure: Option<String>,
}

impl Stats {
    fn new() -> Self {
        Stats {
            hist: Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("valid histogram bounds"),
            ok: 0,
            failed: 0,
            first_failure: None,
        }
    }

    fn record(&mut self, outcome: Result<(), String>, latency: Duration) {
        match outcome {
            Ok(()) => {
                self.ok += 1;
                self.hist
                    .saturating_record(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
            }
            Err(why) => {
                self.failed += 1;
                self.first_failure.get_or_insert(why);
            }
        }
    }

    fn merge(&mut self, other: Stats) {
        let _ = self.hist.add(&other.hist);
        self.ok += other.ok;
        self.failed += other.failed;
        if self.first_failure.is_none() {
            self.first_failure = other.first_failure;
        }
    }

    fn ms(&self, quantile: f64) -> f64 {
        self.hist.value_at_quantile(quantile) as f64 / 1e6
    }
}

/// One round of one mode against one target; the table shows each (target, mode) over its
/// rounds.
struct Row {
    target: &'static str,
    mode: String,
    throughput: f64,
    stats: Stats,
    note: String,
    /// The server process's CPU time (user + system) per answered call, when it runs apart.
    server_cpu_us: Option<f64>,
    /// The state backend's (Redis's) CPU time per answered call, for the Redis row.
    state_cpu_us: Option<f64>,
    /// Fixed rate: how late the harness sent calls, p99.
    send_lag_ms: Option<f64>,
    /// The server process's context switches per answered call (voluntary, involuntary), at a
    /// fixed rate, when it runs apart.
    switches: Option<(f64, f64)>,
    /// Its voluntary context switches per answered call by thread name, at a fixed rate: which
    /// threads a call wakes (its thread hops), most first.
    wakeups: Vec<(String, f64)>,
}

/// What measuring one target gave.
struct Measured {
    ok: bool,
    /// Calls sent in all (probe, warm-up and both modes), to compare with spans received.
    calls: u64,
}

/// Probe, warm up, then max rate and (with `fixed`) fixed rate against one target: one round.
fn measure(
    options: &Options,
    client_rt: &Runtime,
    target: &Target,
    fixed: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<Measured> {
    let channels = client_rt.block_on(connect_all(target.addr, options.connections))?;
    // A correct answer first on every connection: the numbers mean nothing if calls are refused.
    for channel in &channels {
        let probe = client_rt
            .block_on(call_once(&mut ToolGateClient::new(channel.clone()), target))
            .map_err(|why| anyhow!("{}: the probe call failed: {why}", target.name))?;
        if probe.model_text != target.expected_output {
            bail!(
                "{}: the probe call returned {:?}, not the echoed text",
                target.name,
                probe.model_text
            );
        }
    }
    let warmup = client_rt.block_on(closed_loop(
        &channels,
        options.concurrency,
        target,
        Budget::For(options.warmup),
    ));
    let cpu_before = target.server_pid.and_then(cpu_seconds);
    let state_cpu_before = target.state_pid.and_then(cpu_seconds);
    let (max, elapsed) = client_rt.block_on(closed_loop(
        &channels,
        options.concurrency,
        target,
        Budget::For(options.duration),
    ));
    let server_cpu_us = cpu_before
        .zip(target.server_pid.and_then(cpu_seconds))
        .filter(|_| max.ok > 0)
        .map(|(before, after)| (after - before) * 1e6 / max.ok as f64);
    let state_cpu_us = state_cpu_before
        .zip(target.state_pid.and_then(cpu_seconds))
        .filter(|_| max.ok > 0)
        .map(|(before, after)| (after - before) * 1e6 / max.ok as f64);
    let calls = channels.len() as u64 + warmup.0.ok + warmup.0.failed + max.ok + max.failed;
    let ok = max.failed == 0 && warmup.0.failed == 0;
    rows.push(Row {
        target: target.name,
        mode: format!("max rate ({}×{})", options.connections, options.concurrency),
        throughput: max.ok as f64 / elapsed.as_secs_f64(),
        note: failure_note(&max),
        stats: max,
        server_cpu_us,
        state_cpu_us,
        send_lag_ms: None,
        switches: None,
        wakeups: Vec::new(),
    });
    if !fixed {
        return Ok(Measured { ok, calls });
    }
    let mut calls = calls;
    let mut ok = ok;
    for &rate in &options.rates {
        let cpu_before = target.server_pid.and_then(cpu_seconds);
        let state_cpu_before = target.state_pid.and_then(cpu_seconds);
        let switches_before = target.server_pid.and_then(switches_by_thread);
        let fixed = open_loop(client_rt, &channels, target, rate, options.duration);
        let answered = fixed.stats.ok;
        let per_call = |total: f64| (answered > 0).then(|| total / answered as f64);
        let server_cpu_us = cpu_before
            .zip(target.server_pid.and_then(cpu_seconds))
            .and_then(|(before, after)| per_call((after - before) * 1e6));
        let state_cpu_us = state_cpu_before
            .zip(target.state_pid.and_then(cpu_seconds))
            .and_then(|(before, after)| per_call((after - before) * 1e6));
        let switches_after = target.server_pid.and_then(switches_by_thread);
        let total = |by: &BTreeMap<String, (u64, u64)>| {
            by.values()
                .fold((0u64, 0u64), |(v, i), (tv, ti)| (v + tv, i + ti))
        };
        let switches = switches_before
            .as_ref()
            .zip(switches_after.as_ref())
            .and_then(|(before, after)| {
                let ((v0, i0), (v1, i1)) = (total(before), total(after));
                Some((
                    per_call(v1.saturating_sub(v0) as f64)?,
                    per_call(i1.saturating_sub(i0) as f64)?,
                ))
            });
        let wakeups = switches_before
            .as_ref()
            .zip(switches_after.as_ref())
            .map(|(before, after)| wakeups_per_call(before, after, answered))
            .unwrap_or_default();
        calls += fixed.stats.ok + fixed.stats.failed;
        ok = ok && fixed.stats.failed == 0;
        let send_lag_ms = fixed.send_lag.value_at_quantile(0.99) as f64 / 1e6;
        let mut notes = Vec::new();
        if fixed.skipped > 0 {
            notes.push(format!("{} not sent (backlog)", fixed.skipped));
        }
        if fixed.stats.first_failure.is_some() {
            notes.push(failure_note(&fixed.stats));
        }
        notes.retain(|n| !n.is_empty());
        let note = notes.join("; ");
        rows.push(Row {
            target: target.name,
            mode: format!("{rate} rps"),
            throughput: fixed.stats.ok as f64 / fixed.elapsed.as_secs_f64(),
            stats: fixed.stats,
            note,
            server_cpu_us,
            state_cpu_us,
            send_lag_ms: Some(send_lag_ms),
            switches,
            wakeups,
        });
    }
    Ok(Measured { ok, calls })
}

/// Context switches (voluntary, involuntary) of every thread of a process so far, from
/// `/proc/PID/task/*/status`, summed per thread name (`Name:`; tokio's workers share one): each
/// voluntary one is a thread going to sleep to wait (for work, a lock, I/O), so per call they
/// count the wake-ups and hand-offs a call costs, and which threads a call wakes — its thread
/// hops.
fn switches_by_thread(pid: u32) -> Option<BTreeMap<String, (u64, u64)>> {
    let mut by_name: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(status) = std::fs::read_to_string(task.ok()?.path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        let mut name = String::new();
        let mut counts = (0, 0);
        for line in status.lines() {
            let field = |key: &str| {
                line.strip_prefix(key)
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            if let Some(n) = line.strip_prefix("Name:") {
                name = n.trim().to_owned();
            } else if let Some(n) = field("voluntary_ctxt_switches:") {
                counts.0 = n;
            } else if let Some(n) = field("nonvoluntary_ctxt_switches:") {
                counts.1 = n;
            }
        }
        let entry = by_name.entry(name).or_default();
        entry.0 += counts.0;
        entry.1 += counts.1;
    }
    Some(by_name)
}

/// Thread hops: for each fixed-rate row, the threads a call wakes and how often (voluntary
/// context switches per call, median over the rounds).
fn print_wakeups(keys: &[(&str, &str)], rows: &[Row]) {
    let mut printed_header = false;
    for (target, mode) in keys {
        let rounds: Vec<&Row> = rows
            .iter()
            .filter(|row| row.target == *target && row.mode == *mode && !row.wakeups.is_empty())
            .collect();
        if rounds.is_empty() {
            continue;
        }
        if !printed_header {
            println!(
                "Wake-ups per call by thread (voluntary context switches per call, median over rounds):"
            );
            println!();
            println!("| target | mode | threads woken per call |");
            println!("|---|---|---|");
            printed_header = true;
        }
        let mut names: Vec<&str> = rounds
            .iter()
            .flat_map(|row| row.wakeups.iter().map(|(name, _)| name.as_str()))
            .collect();
        names.sort_unstable();
        names.dedup();
        let mut medians: Vec<(&str, f64)> = names
            .into_iter()
            .filter_map(|name| {
                let spread = Spread::of(rounds.iter().map(|row| {
                    row.wakeups
                        .iter()
                        .find(|(n, _)| n == name)
                        .map_or(0.0, |(_, v)| *v)
                }))?;
                Some((name, spread.median))
            })
            .collect();
        medians.sort_by(|a, b| b.1.total_cmp(&a.1));
        let listed: Vec<String> = medians
            .iter()
            .map(|(name, n)| format!("`{name}` {n:.2}"))
            .collect();
        println!("| {target} | {mode} | {} |", listed.join(", "));
    }
    if printed_header {
        println!();
    }
}

/// Voluntary switches per call of each thread name with a noticeable share (≥ 0.01 per call),
/// most first.
fn wakeups_per_call(
    before: &BTreeMap<String, (u64, u64)>,
    after: &BTreeMap<String, (u64, u64)>,
    calls: u64,
) -> Vec<(String, f64)> {
    if calls == 0 {
        return Vec::new();
    }
    let mut per_call: Vec<(String, f64)> = after
        .iter()
        .map(|(name, (v, _))| {
            let was = before.get(name).map_or(0, |(v0, _)| *v0);
            (name.clone(), v.saturating_sub(was) as f64 / calls as f64)
        })
        .filter(|(_, n)| *n >= 0.01)
        .collect();
    per_call.sort_by(|a, b| b.1.total_cmp(&a.1));
    per_call
}

/// CPU time (user + system) a process has used so far, from `/proc/PID/stat`.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| ticks as f64 / per_second as f64)
}

fn failure_note(stats: &Stats) -> String {
    match &stats.first_failure {
        Some(why) => format!("first failure: {why}"),
        None => String::new(),
    }
}

/// How long a closed loop runs: for a time, or until a number of calls (shared by all callers)
/// has been sent.
#[derive(Clone, Copy)]
enum Budget {
    For(Duration),
    Calls(u64),
}

/// Max rate: every connection carries `concurrency` callers that each send their next call as
/// soon as the last one is answered, until the budget is spent.
async fn closed_loop(
    channels: &[Channel],
    concurrency: usize,
    target: &Target,
    budget: Budget,
) -> (Stats, Duration) {
    let start = Instant::now();
    let (end, calls) = match budget {
        Budget::For(duration) => (Some(start + duration), u64::MAX),
        Budget::Calls(calls) => (None, calls),
    };
    let remaining = Arc::new(AtomicU64::new(calls));
    let mut callers = JoinSet::new();
    for channel in channels {
        for _ in 0..concurrency {
            let mut client = ToolGateClient::new(channel.clone());
            let (target, remaining) = (target.clone(), remaining.clone());
            callers.spawn(async move {
                let mut stats = Stats::new();
                while end.is_none_or(|end| Instant::now() < end)
                    && remaining
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                        .is_ok()
                {
                    let sent = Instant::now();
                    let outcome = call_once(&mut client, &target).await.map(drop);
                    stats.record(outcome, sent.elapsed());
                }
                stats
            });
        }
    }
    let mut total = Stats::new();
    while let Some(stats) = callers.join_next().await {
        match stats {
            Ok(stats) => total.merge(stats),
            Err(err) => total.record(Err(format!("caller task failed: {err}")), Duration::ZERO),
        }
    }
    (total, start.elapsed())
}

/// What a fixed-rate run gave.
struct OpenLoop {
    /// Latency from each call's intended send time to its answer.
    stats: Stats,
    /// How late calls were sent relative to the schedule (the harness's own delay).
    send_lag: Histogram<u64>,
    skipped: u64,
    elapsed: Duration,
}

/// Fixed rate: calls are started on a schedule (`rate` per second, round-robin over the
/// connections) whether or not earlier ones were answered, and each latency counts from the
/// call's intended start, so a stall shows up in the percentiles instead of pausing the load.
/// This thread paces with `thread::sleep` (tens of µs late, unlike a 1 ms tokio timer).
fn open_loop(
    client_rt: &Runtime,
    channels: &[Channel],
    target: &Target,
    rate: u64,
    duration: Duration,
) -> OpenLoop {
    struct Shared {
        stats: Stats,
        send_lag: Histogram<u64>,
    }
    let shared = Arc::new(Mutex::new(Shared {
        stats: Stats::new(),
        send_lag: Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("valid bounds"),
    }));
    let (outstanding, mut outstanding_rx) = watch::channel(0u64);
    let outstanding = Arc::new(outstanding);
    let answered = Arc::new(AtomicU64::new(0));
    let total = (rate as f64 * duration.as_secs_f64()).round().max(1.0) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let clients: Vec<_> = channels.iter().cloned().map(ToolGateClient::new).collect();
    let mut skipped = 0;
    let start = Instant::now() + Duration::from_millis(5);
    for i in 0..total {
        let intended = start + interval.mul_f64(i as f64);
        let now = Instant::now();
        if intended > now {
            std::thread::sleep(intended - now);
        }
        if *outstanding.borrow() >= MAX_OUTSTANDING {
            skipped += 1;
            continue;
        }
        outstanding.send_modify(|n| *n += 1);
        let mut client = clients[i as usize % clients.len()].clone();
        let target = target.clone();
        let shared = shared.clone();
        let outstanding = outstanding.clone();
        let answered = answered.clone();
        client_rt.spawn(async move {
            let sent = Instant::now();
            let outcome = call_once(&mut client, &target).await.map(drop);
            let latency = intended.elapsed();
            answered.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut shared) = shared.lock() {
                shared.stats.record(outcome, latency);
                let lag = sent.saturating_duration_since(intended);
                shared
                    .send_lag
                    .saturating_record(u64::try_from(lag.as_nanos()).unwrap_or(u64::MAX));
            }
            outstanding.send_modify(|n| *n -= 1);
        });
    }
    // Every call has a deadline, so this wait is bounded too.
    client_rt.block_on(async {
        let _ = tokio::time::timeout(
            CALL_TIMEOUT + Duration::from_secs(5),
            outstanding_rx.wait_for(|n| *n == 0),
        )
        .await;
    });
    let elapsed = start.elapsed();
    let mut shared = shared.lock().unwrap_or_else(|e| e.into_inner());
    let unanswered = total - skipped - answered.load(Ordering::Relaxed);
    for _ in 0..unanswered {
        shared.stats.record(Err("no answer".into()), Duration::ZERO);
    }
    OpenLoop {
        stats: std::mem::replace(&mut shared.stats, Stats::new()),
        send_lag: shared.send_lag.clone(),
        skipped,
        elapsed,
    }
}

// --- slow calls ----------------------------------------------------------------------------------

/// What the slow-call memory test saw.
#[derive(Default)]
struct Slow {
    calls: usize,
    ok: u64,
    failed: u64,
    first_failure: Option<String>,
    /// The most calls inside the server at one moment (from answer times and server durations).
    max_in_flight: usize,
    peak: Memory,
    after: Memory,
    connections: usize,
    /// When the last call started inside the server, since the first was sent.
    last_started_ms: i64,
}

/// Opens `options.slow_calls` calls of the slow tool at once, over several connections, and
/// samples the server's RSS every 20 ms until they are answered.
async fn slow_calls(
    options: &Options,
    addr: SocketAddr,
    auth: &MetadataValue<Ascii>,
    pid: u32,
) -> anyhow::Result<Slow> {
    let connections = options.slow_calls.div_ceil(SLOW_CALLS_PER_CONNECTION);
    let channels = connect_all(addr, connections).await?;
    let arguments_json = serde_json::json!({ "ms": options.slow_ms }).to_string();
    let (done_tx, mut done_rx) = watch::channel(0usize);
    let done_tx = Arc::new(done_tx);
    let started = Instant::now();
    let mut calls = JoinSet::new();
    for i in 0..options.slow_calls {
        let mut client = ToolGateClient::new(channels[i % connections].clone());
        let mut request = Request::new(proto::ExecuteToolRequest {
            call: Some(proto::ToolCall {
                name: "slow".into(),
                arguments_json: arguments_json.clone(),
                ..Default::default()
            }),
            run_id: "run-bench-slow".into(),
            step: 0,
            catalog_revision: String::new(),
        });
        request.metadata_mut().insert("authorization", auth.clone());
        request.set_timeout(Duration::from_millis(options.slow_ms) + Duration::from_secs(30));
        let done_tx = done_tx.clone();
        calls.spawn(async move {
            let answer = client.execute_tool(request).await;
            let answered = started.elapsed();
            done_tx.send_modify(|n| *n += 1);
            match answer {
                Ok(response) => match response.into_inner().result {
                    Some(r) if r.status() == proto::ToolStatus::Ok => Ok((answered, r.duration_ms)),
                    Some(r) => Err(format!("{}: {}", r.error_type, r.error_message)),
                    None => Err("no result".into()),
                },
                Err(status) => Err(format!("gRPC {:?}: {}", status.code(), status.message())),
            }
        });
    }
    // Sample memory until every call is answered (bounded by the calls' own deadlines).
    let mut peak = Memory::default();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let limit = Instant::now() + Duration::from_millis(options.slow_ms) + Duration::from_secs(40);
    while *done_rx.borrow_and_update() < options.slow_calls && Instant::now() < limit {
        tokio::select! {
            _ = tick.tick() => {
                if let Some(m) = memory(pid).filter(|m| m.rss_kib > peak.rss_kib) {
                    peak = m;
                }
            }
            changed = done_rx.changed() => {
                // Every caller is gone (answered or failed): nothing more to wait for.
                if changed.is_err() {
                    break;
                }
            }
        }
    }
    let mut slow = Slow {
        calls: options.slow_calls,
        connections,
        ..Slow::default()
    };
    // (start, +1) and (end, -1) in ms since `started`, server side: answered - duration.
    let mut edges = Vec::with_capacity(options.slow_calls * 2);
    while let Some(answer) = calls.join_next().await {
        match answer.map_err(|e| e.to_string()).and_then(|a| a) {
            Ok((answered, duration_ms)) => {
                slow.ok += 1;
                let end = answered.as_millis() as i64;
                let start = end - duration_ms as i64;
                slow.last_started_ms = slow.last_started_ms.max(start);
                edges.push((start, 1i64));
                edges.push((end, -1));
            }
            Err(why) => {
                slow.failed += 1;
                slow.first_failure.get_or_insert(why);
            }
        }
    }
    // Ends sort before starts at the same millisecond, so touching calls do not count as overlapping.
    edges.sort_unstable();
    let mut now = 0i64;
    for (_, delta) in edges {
        now += delta;
        slow.max_in_flight = slow.max_in_flight.max(now.max(0) as usize);
    }
    slow.peak = peak;
    slow.after = memory(pid).unwrap_or_default();
    Ok(slow)
}

// --- the report ----------------------------------------------------------------------------------

struct Report<'a> {
    options: &'a Options,
    /// The shadow binary's calls compared, skipped (queue full) and differences.
    shadow: (f64, f64, f64),
    /// One per (target, mode, round).
    rows: &'a [Row],
    /// (target, spans received from it, calls sent to it).
    spans: &'a [(&'static str, u64, u64)],
    startups: &'a [Startup],
    /// Per round: idle memory, then the slow-call test.
    memory: &'a [(Memory, Slow)],
    bare_memory: &'a [(Memory, Slow)],
    load_at_start: String,
    load_at_end: String,
    otlp_endpoint: &'a str,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn verdict(quick: bool, met: bool) -> &'static str {
    match (quick, met) {
        (true, _) => "smoke run",
        (false, true) => "met",
        (false, false) => "MISSED",
    }
}

/// The median, minimum and maximum of some rounds' values.
#[derive(Debug, Clone, Copy)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        values.sort_by(f64::total_cmp);
        let n = values.len();
        if n == 0 {
            return None;
        }
        let median = if n % 2 == 1 {
            values[n / 2]
        } else {
            (values[n / 2 - 1] + values[n / 2]) / 2.0
        };
        Some(Spread {
            median,
            min: values[0],
            max: values[n - 1],
        })
    }

    /// `median (min–max)` with `digits` decimals.
    fn show(&self, digits: usize) -> String {
        format!(
            "{:.digits$} ({:.digits$}–{:.digits$})",
            self.median, self.min, self.max
        )
    }
}

/// One target's rows in one mode, a row per round: a fixed rate's, or (`None`) the max-rate ones.
fn rows_of<'r>(rows: &'r [Row], target: &str, rate: Option<u64>) -> Vec<&'r Row> {
    let mode = rate.map(|r| format!("{r} rps"));
    rows.iter()
        .filter(|row| {
            row.target == target
                && match &mode {
                    Some(mode) => &row.mode == mode,
                    None => !row.mode.ends_with("rps"),
                }
        })
        .collect()
}

/// What a call costs the server process at each fixed rate, next to the bare echo's, per round:
/// CPU and context switches per call, and their ratios. At moderate rates the difference is
/// mostly wake-ups and hand-offs between threads, which saturation hides by batching.
fn print_fixed_rate_costs(o: &Options, rows: &[Row]) {
    let per_mode = |target: &str, rate: Option<u64>| rows_of(rows, target, rate);
    println!("### Cost per call of the server process (own processes)");
    println!();
    println!(
        "| mode | server CPU µs/call: bare | toolgate | toolgate / bare | context switches/call \
         (voluntary + involuntary): bare | toolgate | toolgate / bare |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let modes = std::iter::once(None).chain(o.rates.iter().map(|r| Some(*r)));
    for rate in modes {
        let (bare, gate) = (per_mode(BARE_PROCESS, rate), per_mode(BINARY, rate));
        let value = |rows: &[&Row], f: &dyn Fn(&Row) -> Option<f64>| {
            Spread::of(rows.iter().map(|row| f(row).unwrap_or(f64::NAN)))
        };
        let ratio = |f: &dyn Fn(&Row) -> Option<f64>| {
            Spread::of(
                bare.iter()
                    .zip(&gate)
                    .map(|(b, g)| f(g).zip(f(b)).map_or(f64::NAN, |(g, b)| g / b)),
            )
        };
        let cpu = |row: &Row| row.server_cpu_us;
        let switches = |row: &Row| row.switches.map(|(v, i)| v + i);
        let show = |s: Option<Spread>, digits: usize| s.map_or("—".into(), |s| s.show(digits));
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            rate.map_or("max rate".into(), |r| format!("{r} rps")),
            show(value(&bare, &cpu), 1),
            show(value(&gate, &cpu), 1),
            show(ratio(&cpu), 2),
            show(value(&bare, &switches), 2),
            show(value(&gate, &switches), 2),
            show(ratio(&switches), 2),
        );
    }
    println!();
}

fn print_report(r: &Report) {
    let o = r.options;
    // Cargo puts a profile's outputs in a directory named after it; the bench profile's is
    // `release`.
    let profile = match Path::new(env!("CARGO_BIN_EXE_toolgate"))
        .parent()
        .and_then(Path::file_name)
        .and_then(|name| name.to_str())
    {
        _ if cfg!(debug_assertions) => "debug (numbers not meaningful)".to_owned(),
        Some("release") | None => "optimized (bench profile)".to_owned(),
        Some(profile) => format!("optimized ({profile} profile)"),
    };
    println!();
    println!(
        "## toolgate load harness{}",
        if o.quick { " (--quick)" } else { "" }
    );
    println!();
    println!(
        "build {profile}; {} CPUs; load average (1/5/15 min) {} at start, {} at end; {} rounds, \
         every target measured once per round, in turn",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        r.load_at_start,
        r.load_at_end,
        o.rounds
    );
    println!(
        "ExecuteTool of `echo` with a {} B text; max rate: {} connections × {} in flight, \
         {:?} after {:?} warm-up; fixed rates: {} rps for {:?} each; OTLP collector at {}; \
         OTEL_SDK_DISABLED={}",
        o.payload,
        o.connections,
        o.concurrency,
        o.duration,
        o.warmup,
        o.rates
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" and "),
        o.duration,
        r.otlp_endpoint,
        std::env::var("OTEL_SDK_DISABLED").unwrap_or_default()
    );
    println!("toolgate binary: {}", o.binary.display());
    let busy_cpus: f64 = r
        .load_at_start
        .split_whitespace()
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or(0.0);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let worst_lag_ms = r
        .rows
        .iter()
        .filter_map(|row| row.send_lag_ms)
        .fold(0.0, f64::max);
    // The load average at the start says whether something else was running; the harness's own
    // send lag says whether it could keep its schedule, which on few cores it cannot fully while
    // the load generator, the collector and the server share them.
    if busy_cpus > cpus / 2.0 {
        println!(
            "WARNING: the machine was busy before the harness started (load average \
             {busy_cpus:.2} on {cpus} CPUs): max-rate numbers are low and fixed-rate percentiles \
             noisy; rerun when `uptime` shows a quiet machine"
        );
    }
    if worst_lag_ms > 1.0 {
        println!(
            "NOTE: the harness sent calls up to {worst_lag_ms:.1} ms late at p99 (its pacing \
             thread shares {cpus} CPUs with the load generator, the collector and the server): \
             fixed-rate percentiles include that scheduling delay, for bare and toolgate alike"
        );
    }
    println!();
    println!(
        "Each cell: the median of the rounds, and (min–max) over the rounds where it matters."
    );
    println!();
    println!(
        "| target | mode | throughput (calls/s) | p50 ms | p99 ms | p99.9 ms | max ms | ok | failed | server CPU µs/call | notes |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    // (target, mode) in the order first measured.
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for row in r.rows {
        if !keys.contains(&(row.target, row.mode.as_str())) {
            keys.push((row.target, row.mode.as_str()));
        }
    }
    let rounds_of = |target: &str, mode: &str| -> Vec<&Row> {
        r.rows
            .iter()
            .filter(|row| row.target == target && row.mode == mode)
            .collect()
    };
    for (target, mode) in &keys {
        let rounds = rounds_of(target, mode);
        let spread = |f: &dyn Fn(&Row) -> f64| Spread::of(rounds.iter().map(|row| f(row)));
        let show = |s: Option<Spread>, digits: usize, range: bool| match s {
            Some(s) if range => s.show(digits),
            Some(s) => format!("{:.digits$}", s.median),
            None => "—".into(),
        };
        let mut notes: Vec<String> = Vec::new();
        if let Some(lag) = spread(&|row| row.send_lag_ms.unwrap_or(f64::NAN)) {
            notes.push(format!("sent late p99 {} ms (harness)", lag.show(3)));
        }
        if let Some(redis) = spread(&|row| row.state_cpu_us.unwrap_or(f64::NAN)) {
            notes.push(format!("Redis CPU {} µs/call", redis.show(1)));
        }
        notes.extend(
            rounds
                .iter()
                .map(|row| row.note.trim_start_matches("; ").to_owned())
                .filter(|n| !n.is_empty()),
        );
        println!(
            "| {target} | {mode} | {} | {} | {} | {} | {:.3} | {} | {} | {} | {} |",
            show(spread(&|row| row.throughput), 0, true),
            show(spread(&|row| row.stats.ms(0.5)), 3, false),
            show(spread(&|row| row.stats.ms(0.99)), 3, true),
            show(spread(&|row| row.stats.ms(0.999)), 3, false),
            rounds
                .iter()
                .map(|row| row.stats.hist.max() as f64 / 1e6)
                .fold(0.0, f64::max),
            rounds.iter().map(|row| row.stats.ok).sum::<u64>(),
            rounds.iter().map(|row| row.stats.failed).sum::<u64>(),
            show(
                spread(&|row| row.server_cpu_us.unwrap_or(f64::NAN)),
                1,
                true
            ),
            notes.join("; ")
        );
    }
    println!();
    for (target, spans, calls) in r.spans {
        let included = if *spans == 0 {
            "tracing export NOT included in these numbers"
        } else {
            "tracing export included"
        };
        println!("OTLP spans received from {target}: {spans} for {calls} calls ({included})");
    }
    println!();
    print_wakeups(&keys, r.rows);

    // Per round, so a ratio compares measurements taken next to each other.
    let per_mode = |target: &str, rate: Option<u64>| rows_of(r.rows, target, rate);
    let per_round = |target: &str, fixed: bool| -> Vec<&Row> {
        per_mode(target, fixed.then(|| o.rates.last().copied()).flatten())
    };
    let paired = |a: &str, b: &str, fixed: bool, f: &dyn Fn(&Row, &Row) -> f64| {
        Spread::of(
            per_round(a, fixed)
                .iter()
                .zip(per_round(b, fixed))
                .map(|(x, y)| f(x, y)),
        )
    };
    print_fixed_rate_costs(o, r.rows);
    let mut checks: Vec<(String, String, String, &'static str)> = Vec::new();
    for (pair, bare, gate) in [
        ("in-process", BARE, TOOLGATE),
        ("own processes", BARE_PROCESS, BINARY),
        (
            "own processes, a new JWT per call",
            BARE_PROCESS,
            BINARY_FRESH_JWT,
        ),
        (
            "own processes, 10 % of traces sampled",
            BARE_PROCESS,
            BINARY_SAMPLED,
        ),
    ] {
        if let Some(ratio) = paired(bare, gate, false, &|b, g| {
            g.throughput / b.throughput * 100.0
        }) {
            checks.push((
                format!("ExecuteTool max throughput / bare echo ({pair})"),
                format!("{} %", ratio.show(1)),
                format!("≥ {:.0} %", GOAL_THROUGHPUT_RATIO * 100.0),
                verdict(o.quick, ratio.median >= GOAL_THROUGHPUT_RATIO * 100.0),
            ));
        }
        if let Some(added) = paired(bare, gate, true, &|b, g| {
            g.stats.ms(0.99) - b.stats.ms(0.99)
        }) {
            checks.push((
                format!(
                    "added p99 at {} rps ({pair})",
                    o.rates.last().copied().unwrap_or(0)
                ),
                format!("{} ms", added.show(3)),
                format!("≤ {GOAL_ADDED_P99_MS} ms"),
                verdict(o.quick, added.median <= GOAL_ADDED_P99_MS),
            ));
        }
    }
    // What sharing the state costs: the same binary with its quotas in Redis, against memory
    // (diagnostic; docs/performance.md reports it).
    if let Some(ratio) = paired(BINARY, BINARY_REDIS, false, &|m, r| {
        r.throughput / m.throughput * 100.0
    }) {
        checks.push((
            "ExecuteTool max throughput, state in Redis / in memory (own processes)".into(),
            format!("{} %", ratio.show(1)),
            "—".into(),
            "—",
        ));
    }
    if let Some(added) = paired(BINARY, BINARY_REDIS, true, &|m, r| {
        r.stats.ms(0.99) - m.stats.ms(0.99)
    }) {
        checks.push((
            format!(
                "added p99 at {} rps, state in Redis vs memory",
                o.rates.last().copied().unwrap_or(0)
            ),
            format!("{} ms", added.show(3)),
            "—".into(),
            "—",
        ));
    }
    // Native CPU per call, server process only (diagnostic; no target), and what each part
    // costs, from the switch-off variants measured in the same rounds.
    let cpu = |target: &str| -> Vec<f64> {
        per_round(target, false)
            .iter()
            .map(|row| row.server_cpu_us.unwrap_or(f64::NAN))
            .collect()
    };
    let (bare_cpu, full, fresh, no_export, no_audit, shadow_cpu) = (
        cpu(BARE_PROCESS),
        cpu(BINARY),
        cpu(BINARY_FRESH_JWT),
        cpu(BINARY_NO_EXPORT),
        cpu(BINARY_NO_AUDIT),
        cpu(BINARY_SHADOW),
    );
    // The shadow catalog: calls per second with it, as a share of the same binary without.
    if let Some(ratio) = paired(BINARY, BINARY_SHADOW, false, &|plain, shadow| {
        shadow.throughput / plain.throughput * 100.0
    }) {
        let (compared, skipped, differences) = r.shadow;
        checks.push((
            "ExecuteTool max throughput with a shadow catalog / without (own processes)".into(),
            format!(
                "{} % ({compared:.0} calls compared, {skipped:.0} skipped with its queue full, {differences:.0} differences)",
                ratio.show(1)
            ),
            "— (measured)".into(),
            "—",
        ));
    }
    let diff = |a: &[f64], b: &[f64]| Spread::of(a.iter().zip(b).map(|(x, y)| x - y));
    let cpu_ratio = |rate: Option<u64>| {
        Spread::of(
            per_mode(BARE_PROCESS, rate)
                .iter()
                .zip(per_mode(BINARY, rate))
                .map(|(b, g)| {
                    g.server_cpu_us
                        .zip(b.server_cpu_us)
                        .map_or(f64::NAN, |(g, b)| g / b)
                }),
        )
    };
    for (rate, goal) in [
        (None, GOAL_CPU_RATIO_MAX_RATE),
        (o.rates.last().copied(), GOAL_CPU_RATIO_FIXED_RATE),
    ] {
        if let Some(ratio) = cpu_ratio(rate) {
            checks.push((
                format!(
                    "server CPU per call / bare echo at {} (own processes)",
                    rate.map_or("max rate".into(), |r| format!("{r} rps"))
                ),
                format!("{}×", ratio.show(2)),
                format!("≤ {goal}×"),
                verdict(o.quick, ratio.median <= goal),
            ));
        }
    }
    if let (Some(g), Some(b)) = (Spread::of(full.clone()), Spread::of(bare_cpu.clone())) {
        checks.push((
            "server CPU per call at max rate (own processes, diagnostic)".into(),
            format!("{} µs vs {} µs", g.show(1), b.show(1)),
            "—".into(),
            "—",
        ));
    }
    println!("| check | measured: median (min–max) over the rounds | target | verdict |");
    println!("|---|---|---|---|");
    let memory_checks = memory_checks(r);
    for (check, measured, goal, verdict) in checks.into_iter().chain(memory_checks) {
        println!("| {check} | {measured} | {goal} | {verdict} |");
    }
    println!();
    println!(
        "Server CPU per call by part (own processes, max rate; per round, then median (min–max)):"
    );
    println!();
    println!("| part | µs per call | from |");
    println!("|---|---:|---|");
    for (part, spread, from) in [
        (
            "the gRPC stack (bare echo)",
            Spread::of(bare_cpu.clone()),
            BARE_PROCESS,
        ),
        (
            "the boundary: identity, stages, conversion, spans created",
            diff(&no_audit, &bare_cpu),
            "export and audit off − bare echo",
        ),
        (
            "the audit event (to a file)",
            diff(&no_export, &no_audit),
            "export off − export and audit off",
        ),
        (
            "span export (OTLP)",
            diff(&full, &no_export),
            "everything on − export off",
        ),
        (
            "a JWT never seen before (vs the cached one)",
            diff(&fresh, &full),
            "a new JWT per call − everything on",
        ),
        (
            "a shadow catalog (each call explained again, off the response path)",
            diff(&shadow_cpu, &full),
            "shadow catalog − everything on",
        ),
    ] {
        println!(
            "| {part} | {} | {from} |",
            spread.map_or_else(|| "—".into(), |s| s.show(1))
        );
    }
    println!();
}

/// The memory and start-up checks.
fn memory_checks(r: &Report) -> Vec<(String, String, String, &'static str)> {
    let o = r.options;
    let mut checks = Vec::new();
    let idle = |rounds: &[(Memory, Slow)]| {
        (
            Spread::of(rounds.iter().map(|(m, _)| mib(m.rss_kib))),
            Spread::of(rounds.iter().map(|(m, _)| mib(m.anon_kib))),
            Spread::of(rounds.iter().map(|(m, _)| mib(m.file_kib))),
        )
    };
    let describe = |(rss, anon, file): (Option<Spread>, Option<Spread>, Option<Spread>)| match (
        rss, anon, file,
    ) {
        (Some(rss), Some(anon), Some(file)) => format!(
            "{} MiB (anonymous {} + file-backed {})",
            rss.show(1),
            anon.show(1),
            file.show(1)
        ),
        _ => "—".into(),
    };
    let (rss, anon, file) = idle(r.memory);
    checks.push((
        "idle RSS of the toolgate binary".into(),
        describe((rss, anon, file)),
        format!("≤ {GOAL_IDLE_RSS_MIB} MiB"),
        verdict(o.quick, rss.is_some_and(|s| s.median <= GOAL_IDLE_RSS_MIB)),
    ));
    let peak = |rounds: &[(Memory, Slow)]| {
        (
            Spread::of(rounds.iter().map(|(_, s)| mib(s.peak.rss_kib))),
            Spread::of(rounds.iter().map(|(_, s)| mib(s.peak.anon_kib))),
            Spread::of(rounds.iter().map(|(_, s)| mib(s.peak.file_kib))),
        )
    };
    let slow_notes = |rounds: &[(Memory, Slow)]| {
        let calls = rounds.first().map_or(0, |(_, s)| s.calls);
        let all_overlapped = rounds.iter().all(|(_, s)| s.max_in_flight >= s.calls);
        let failed: u64 = rounds.iter().map(|(_, s)| s.failed).sum();
        let first = rounds
            .iter()
            .find_map(|(_, s)| s.first_failure.clone())
            .map(|why| format!("; first failure: {why}"))
            .unwrap_or_default();
        (
            calls,
            all_overlapped,
            format!(
                "{} in flight at once at most (of {calls}, over {} connections), {failed} failed{first}",
                rounds
                    .iter()
                    .map(|(_, s)| s.max_in_flight.to_string())
                    .collect::<Vec<_>>()
                    .join(" / "),
                rounds.first().map_or(0, |(_, s)| s.connections)
            ),
        )
    };
    let (calls, overlapped, notes) = slow_notes(r.memory);
    let (rss, anon, file) = peak(r.memory);
    checks.push((
        format!("RSS with {calls} slow_task calls in flight (peak)"),
        format!("{}; {notes}", describe((rss, anon, file))),
        format!("≤ {GOAL_SLOW_RSS_MIB} MiB"),
        verdict(
            o.quick,
            overlapped && rss.is_some_and(|s| s.median <= GOAL_SLOW_RSS_MIB),
        ),
    ));
    checks.push((
        "idle RSS of the bare echo process (diagnostic)".into(),
        describe(idle(r.bare_memory)),
        "—".into(),
        "—",
    ));
    let (calls, _, notes) = slow_notes(r.bare_memory);
    checks.push((
        format!(
            "RSS of the bare echo process with {calls} slow calls in flight (diagnostic: the gRPC stack's share)"
        ),
        format!("{}; {notes}", describe(peak(r.bare_memory))),
        "—".into(),
        "—",
    ));
    // The issue's per-call number: what each call in flight adds to toolgate's anonymous memory
    // (peak over idle: heap and stacks, where call state lives) beyond what it adds to the bare
    // echo's, in the same round, so neither the stack's own share nor the executables' pages
    // (paged in as code first runs) are counted against toolgate.
    let over_bare = Spread::of(
        r.memory
            .iter()
            .zip(r.bare_memory)
            .filter(|((_, toolgate), (_, bare))| toolgate.max_in_flight.min(bare.max_in_flight) > 0)
            .map(|((toolgate_idle, toolgate), (bare_idle, bare))| {
                let calls = toolgate.max_in_flight.min(bare.max_in_flight);
                let grown =
                    |idle: &Memory, slow: &Slow| slow.peak.anon_kib as f64 - idle.anon_kib as f64;
                (grown(toolgate_idle, toolgate) - grown(bare_idle, bare)) / calls as f64
            }),
    );
    let peak_ratio = Spread::of(
        r.memory
            .iter()
            .zip(r.bare_memory)
            .filter(|(_, (_, bare))| bare.peak.rss_kib > 0)
            .map(|((_, toolgate), (_, bare))| {
                toolgate.peak.rss_kib as f64 / bare.peak.rss_kib as f64
            }),
    );
    checks.push((
        "memory each slow call in flight adds over what it adds to the bare echo (anonymous RSS, (peak − idle) − the bare echo's (peak − idle), per call; same round)"
            .into(),
        match (&over_bare, &peak_ratio) {
            (Some(kib), Some(ratio)) => {
                format!(
                    "{} KiB; peak {}× the bare echo's",
                    kib.show(2),
                    ratio.show(2)
                )
            }
            _ => "—".into(),
        },
        format!("≤ {GOAL_SLOW_RSS_OVER_BARE_KIB} KiB"),
        verdict(
            o.quick,
            overlapped && over_bare.is_some_and(|s| s.median <= GOAL_SLOW_RSS_OVER_BARE_KIB),
        ),
    ));
    let sorted = |of: fn(&Startup) -> Duration| {
        let mut ms: Vec<f64> = r
            .startups
            .iter()
            .map(|s| of(s).as_secs_f64() * 1e3)
            .collect();
        ms.sort_by(f64::total_cmp);
        ms
    };
    let serving = sorted(|s| s.serving);
    let listening = sorted(|s| s.listening);
    if !serving.is_empty() {
        let median = serving[serving.len() / 2];
        checks.push((
            format!("start → health SERVING (median of {})", serving.len()),
            format!(
                "{median:.1} ms (min {:.1}, max {:.1}); port accepting after {:.1} ms (median)",
                serving[0],
                serving[serving.len() - 1],
                listening[listening.len() / 2]
            ),
            format!("≤ {GOAL_START_MS} ms"),
            verdict(o.quick, median <= GOAL_START_MS),
        ));
    }
    checks
}
