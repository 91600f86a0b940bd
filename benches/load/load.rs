//! The client side: the load the harness sends and what it records of it. Closed loops (max
//! rate: each caller sends its next call when the last is answered) and open loops (fixed rate:
//! calls sent on a schedule, each latency from its intended send time), the slow-call test that
//! holds thousands of calls in flight while it samples the server's RSS, and the [`Stats`] they
//! fill. A target is called through its door: ExecuteTool over gRPC, or `tools/call` over MCP
//! (`mcp.rs`). Every loop is bounded in count and time; what is measured and the report are
//! elsewhere.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use tokio::{runtime::Runtime, sync::watch, task::JoinSet};
use tonic::{
    Request,
    metadata::{Ascii, MetadataValue},
    transport::{Channel, Endpoint},
};
use toolgate::proto::{self, tool_gate_client::ToolGateClient};

use crate::{
    catalog::bearer,
    mcp,
    options::Options,
    processes::{Memory, memory},
    targets::{Door, Target},
};

/// Every call's gRPC deadline; also bounds each call in time.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Open loop: calls outstanding beyond this are not sent (and counted), so memory stays bounded.
const MAX_OUTSTANDING: u64 = 50_000;
/// Slow calls per HTTP/2 connection.
const SLOW_CALLS_PER_CONNECTION: usize = 500;
/// Latencies are recorded in nanoseconds, up to a minute.
const HIST_MAX_NS: u64 = 60_000_000_000;

/// A multi-threaded tokio runtime whose threads are called `name`.
pub fn runtime(name: &str, workers: usize) -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(name)
        .enable_all()
        .build()
}

/// An ExecuteTool request for `tool` with these arguments, under the run id `run_id`.
pub fn execute_request(
    tool: &str,
    arguments_json: String,
    run_id: &str,
) -> proto::ExecuteToolRequest {
    proto::ExecuteToolRequest {
        call: Some(proto::ToolCall {
            name: tool.into(),
            arguments_json,
            ..Default::default()
        }),
        run_id: run_id.into(),
        step: 0,
        catalog_revision: String::new(),
    }
}

/// One HTTP/2 connection to `addr`, TCP_NODELAY as toolgate's own listener sets it.
pub async fn connect(addr: SocketAddr) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?)
}

/// `n` connections to `addr`.
pub async fn connect_all(addr: SocketAddr, n: usize) -> anyhow::Result<Vec<Channel>> {
    let mut channels = Vec::with_capacity(n);
    for _ in 0..n {
        channels.push(connect(addr).await?);
    }
    Ok(channels)
}

/// What a target's calls go over: HTTP/2 connections for the gRPC door, or a pool of HTTP/1.1
/// connections for the MCP door (one call at a time each, opened as calls need them).
pub enum Connections {
    Grpc(Vec<Channel>),
    Mcp {
        pool: mcp::Client,
        connections: usize,
    },
}

/// One caller's end of a target's connections.
#[derive(Clone)]
pub enum Caller {
    Grpc(ToolGateClient<Channel>),
    Mcp(mcp::Client),
}

impl Connections {
    /// `n` connections to `target` (for the MCP door, a pool that counts as `n` when callers
    /// are spread over it; HTTP/1.1 opens one per call in flight).
    pub async fn open(target: &Target, n: usize) -> anyhow::Result<Self> {
        Ok(match target.door {
            Door::Grpc { .. } => Connections::Grpc(connect_all(target.addr, n).await?),
            Door::Mcp(_) => Connections::Mcp {
                pool: mcp::Client::new(target.addr)?,
                connections: n,
            },
        })
    }

    /// `per_connection` callers on each connection.
    pub fn callers(&self, per_connection: usize) -> Vec<Caller> {
        match self {
            Connections::Grpc(channels) => channels
                .iter()
                .flat_map(|channel| {
                    std::iter::repeat_n(channel, per_connection)
                        .map(|channel| Caller::Grpc(ToolGateClient::new(channel.clone())))
                })
                .collect(),
            Connections::Mcp { pool, connections } => {
                vec![Caller::Mcp(pool.clone()); connections * per_connection]
            }
        }
    }
}

/// Numbers the tokens of `fresh_tokens` targets, so no two calls send the same one.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(0);

/// One call of `target` through its door; `Ok` is the tool's text, `Err` says why the answer is
/// not an OK result.
pub async fn call_once(caller: &mut Caller, target: &Target) -> Result<String, String> {
    match (caller, &target.door) {
        (Caller::Grpc(client), Door::Grpc { request, auth }) => {
            execute_once(client, target, request, auth).await
        }
        (Caller::Mcp(client), Door::Mcp(call)) => {
            mcp::call_once(client, call, target.timeout).await
        }
        _ => Err("a caller of one door for a target of the other".into()),
    }
}

/// One ExecuteTool call; `Err` says why the answer is not an OK result.
async fn execute_once(
    client: &mut ToolGateClient<Channel>,
    target: &Target,
    request: &proto::ExecuteToolRequest,
    auth: &MetadataValue<Ascii>,
) -> Result<String, String> {
    let mut request = Request::new(request.clone());
    let auth = if target.fresh_tokens {
        let jti = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        bearer(Some(jti)).map_err(|e| format!("{e:#}"))?
    } else {
        auth.clone()
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
    Ok(result.model_text)
}

/// `calls` ExecuteTool calls of `request`, one after another over one connection: traffic before
/// a sidecar goes idle again. `Err` at the first call that is not answered OK.
pub async fn calls_in_turn(
    addr: SocketAddr,
    request: &proto::ExecuteToolRequest,
    auth: &MetadataValue<Ascii>,
    calls: usize,
) -> anyhow::Result<()> {
    let mut client = ToolGateClient::new(connect(addr).await?);
    for i in 0..calls {
        let mut call = Request::new(request.clone());
        call.metadata_mut().insert("authorization", auth.clone());
        call.set_timeout(Duration::from_secs(10));
        let result = client.execute_tool(call).await?.into_inner().result;
        match result {
            Some(r) if r.status() == proto::ToolStatus::Ok => {}
            other => anyhow::bail!("call {i} of {calls} was not answered OK: {other:?}"),
        }
    }
    Ok(())
}

/// Latencies and outcomes of one measurement.
pub struct Stats {
    pub hist: Histogram<u64>,
    pub ok: u64,
    pub failed: u64,
    pub first_failure: Option<String>,
}

impl Stats {
    /// Nothing recorded yet.
    pub fn new() -> Self {
        Stats {
            hist: Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("valid histogram bounds"),
            ok: 0,
            failed: 0,
            first_failure: None,
        }
    }

    /// One call: its latency when it succeeded, else why it failed (the first reason is kept).
    pub fn record(&mut self, outcome: Result<(), String>, latency: Duration) {
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

    /// Adds another caller's calls.
    pub fn merge(&mut self, other: Stats) {
        let _ = self.hist.add(&other.hist);
        self.ok += other.ok;
        self.failed += other.failed;
        if self.first_failure.is_none() {
            self.first_failure = other.first_failure;
        }
    }

    /// The latency at `quantile`, in ms.
    pub fn ms(&self, quantile: f64) -> f64 {
        self.hist.value_at_quantile(quantile) as f64 / 1e6
    }
}

/// `first failure: why`, or nothing when every call succeeded.
pub fn failure_note(stats: &Stats) -> String {
    match &stats.first_failure {
        Some(why) => format!("first failure: {why}"),
        None => String::new(),
    }
}

/// How long a closed loop runs: for a time, or until a number of calls (shared by all callers)
/// has been sent.
#[derive(Clone, Copy)]
pub enum Budget {
    For(Duration),
    Calls(u64),
}

/// Max rate: every connection carries `concurrency` callers that each send their next call as
/// soon as the last one is answered, until the budget is spent.
pub async fn closed_loop(
    connections: &Connections,
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
    for mut caller in connections.callers(concurrency) {
        let (target, remaining) = (target.clone(), remaining.clone());
        callers.spawn(async move {
            let mut stats = Stats::new();
            while end.is_none_or(|end| Instant::now() < end)
                && remaining
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
            {
                let sent = Instant::now();
                let outcome = call_once(&mut caller, &target).await.map(drop);
                stats.record(outcome, sent.elapsed());
            }
            stats
        });
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
pub struct OpenLoop {
    /// Latency from each call's intended send time to its answer.
    pub stats: Stats,
    /// How late calls were sent relative to the schedule (the harness's own delay).
    pub send_lag: Histogram<u64>,
    pub skipped: u64,
    pub elapsed: Duration,
}

/// Fixed rate: calls are started on a schedule (`rate` per second, round-robin over the
/// connections) whether or not earlier ones were answered, and each latency counts from the
/// call's intended start, so a stall shows up in the percentiles instead of pausing the load.
/// This thread paces with `thread::sleep` (tens of µs late, unlike a 1 ms tokio timer).
pub fn open_loop(
    client_rt: &Runtime,
    connections: &Connections,
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
    let clients = connections.callers(1);
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

/// What the slow-call memory test saw.
#[derive(Default)]
pub struct Slow {
    pub calls: usize,
    pub ok: u64,
    pub failed: u64,
    pub first_failure: Option<String>,
    /// The most calls inside the server at one moment (from answer times and server durations).
    pub max_in_flight: usize,
    pub peak: Memory,
    pub after: Memory,
    pub connections: usize,
    /// When the last call started inside the server, since the first was sent.
    pub last_started_ms: i64,
}

/// Opens `options.slow_calls` calls of the slow tool at once, over several connections, and
/// samples the server's RSS every 20 ms until they are answered.
pub async fn slow_calls(
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
        let mut request = Request::new(execute_request(
            "slow",
            arguments_json.clone(),
            "run-bench-slow",
        ));
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
