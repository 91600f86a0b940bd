//! The profiling helpers (docs/performance.md, "Profiling helpers"), to reproduce a profile by
//! hand against a server started under valgrind or perf: `send-only` sends calls and exits,
//! `serve-collector` counts the spans a binary exports, `write-catalog` writes the bench catalog
//! for a `toolgate serve` started by hand. (The bare echo server is in `bare_echo.rs`.)

use std::{net::SocketAddr, path::Path, time::Duration};

use anyhow::Context;
use clap::Args;

use crate::{
    catalog::{SECRET, SECRET_ENV, bearer, catalog, catalog_with_mcp, mcp_bearer},
    load::{Budget, Connections, closed_loop, execute_request, failure_note, open_loop, runtime},
    mcp::{self, Revision},
    options::{Options, loopback},
    otlp_collector,
    targets::{Door, Target},
};

/// What `send-only` sends, beyond the shared options (`--connections`, `--concurrency`,
/// `--payload`, `--slow-ms`, and `--duration` with `--send-rate`).
#[derive(Args)]
pub struct SendArgs {
    /// The server's loopback address, e.g. 127.0.0.1:50200
    #[arg(value_parser = loopback)]
    addr: SocketAddr,
    /// The tool called: `echo` (with --payload bytes) or `slow` (sleeping --slow-ms)
    #[arg(long, default_value = "echo", value_parser = ["echo", "slow"])]
    tool: String,
    /// Calls sent back to back over connections × concurrency callers
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    calls: u64,
    /// Send at this fixed rate for --duration instead (to profile what a moderate rate costs,
    /// e.g. thread wake-ups under perf)
    #[arg(long, value_name = "RPS", value_parser = clap::value_parser!(u64).range(1..))]
    send_rate: Option<u64>,
    /// Send `echo` as a tools/call to the MCP door at ADDR under this revision, instead of
    /// ExecuteTool (the catalog `write-catalog` writes as bench-mcp.yaml has the door on)
    #[arg(long, value_name = "REVISION", value_parser = ["2025-11-25", "2026-07-28"])]
    mcp: Option<String>,
}

/// `send-only`: the calls of `args` to a server started by hand, over `connections` ×
/// `concurrency` callers; prints what came back. `Ok(false)` when a call failed.
pub fn send_only(options: &Options, args: &SendArgs) -> anyhow::Result<bool> {
    let addr = args.addr;
    let client_rt = runtime("bench-client", 2)?;
    let auth = bearer(None)?;
    let (arguments_json, timeout) = if args.tool == "slow" {
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
    let request = execute_request(&args.tool, arguments_json, "run-bench");
    let mut target = Target {
        timeout,
        ..Target::new("send-only", addr, &request, &auth, "")
    };
    if let Some(revision) = &args.mcp {
        anyhow::ensure!(args.tool == "echo", "--mcp sends `echo` only");
        let revision = match revision.as_str() {
            "2026-07-28" => Revision::V2026_07_28,
            _ => Revision::V2025_11_25,
        };
        let text = "x".repeat(options.payload);
        let call = mcp::Call::echo(revision, &text, &mcp_bearer()?)?;
        target.door = Door::Mcp(std::sync::Arc::new(call));
    }
    let connections = client_rt.block_on(Connections::open(&target, options.connections))?;
    let (stats, elapsed) = match args.send_rate {
        Some(rate) => {
            let sent = open_loop(&client_rt, &connections, &target, rate, options.duration);
            (sent.stats, sent.elapsed)
        }
        None => client_rt.block_on(closed_loop(
            &connections,
            options.concurrency,
            &target,
            Budget::Calls(args.calls),
        )),
    };
    println!(
        "sent {} {} calls to {addr} in {elapsed:.2?}: {} ok, {} failed{}; p50 {:.3} ms, p99 {:.3} ms",
        stats.ok + stats.failed,
        args.tool,
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

/// `serve-collector`: the in-process OTLP collector as a server of its own, for profiling a
/// binary with tracing export on. Runs until SIGINT or SIGTERM (ten minutes at most), then
/// prints what it received.
pub fn serve_collector(addr: SocketAddr) -> anyhow::Result<()> {
    let rt = runtime("bench-otlp", 1)?;
    let listener = std::net::TcpListener::bind(addr)?;
    let received = rt.block_on(async {
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
    })?;
    println!("spans received: {received}");
    Ok(())
}

/// `write-catalog`: the bench catalog to `DIR/bench.yaml` (audit to `DIR/audit.jsonl`) and
/// with the MCP door on to `DIR/bench-mcp.yaml` (audit to `DIR/audit-mcp.jsonl`), and the
/// command lines that serve them.
pub fn write_catalog(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (name, yaml) in [
        ("bench.yaml", catalog(&dir.join("audit.jsonl"))),
        (
            "bench-mcp.yaml",
            catalog_with_mcp(&dir.join("audit-mcp.jsonl")),
        ),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, yaml).with_context(|| format!("cannot write {}", path.display()))?;
        println!(
            "{SECRET_ENV}={SECRET} target/release/toolgate serve --config {} --log-format json",
            path.display()
        );
    }
    Ok(())
}
