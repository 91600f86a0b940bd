//! The load harness (docs/performance.md): how much the execution boundary costs on top of the
//! gRPC stack it runs on, and what the sidecar costs in memory and start-up time.
//!
//! ```sh
//! cargo bench --bench load -- [--duration 10s] [--connections N] [--concurrency M] [--rate RPS] [--quick]
//! cargo bench --bench load -- ab PATH_B [--binary PATH_A] [--rounds N]   # interleaved A/B
//! cargo bench --bench load -- vs-bare [--rounds N]                        # toolgate vs bare, alone
//! cargo bench --bench load -- doors [--rounds N]                          # MCP door vs gRPC door
//! cargo bench --bench load -- features [--rounds N]                       # each new capability's cost
//! cargo bench --bench load -- emergency [--rounds N]                      # deny propagation time
//! cargo bench --bench load -- console [--rounds N]                        # the approvals console's pages
//! cargo bench --bench load -- --help                                      # every option and helper
//! ```
//!
//! With no subcommand, the full run ([`run`]), in order, all over loopback on this machine:
//! 1. a bare tonic unary echo (toolgate's own `ToolGate` service with a trivial `ExecuteTool`, so the
//!    codec and message shapes match) — the limit of the stack — in this process, then
//! 2. toolgate started in-process with the whole boundary (JWT, schema, bound argument, rate limit,
//!    audit to a file) and the subscriber the binary installs (JSON logs, OTLP spans to an
//!    in-process collector), then
//! 3. the same pair as separate processes: the bare echo (this executable re-run as
//!    `serve-bare-echo`) and `target/release/toolgate` with the same catalog — the deployed shape,
//!    including whatever logging and OTLP export the binary installs — the binary once more with
//!    its state (both rate limits of every call) in a `redis-server` of its own on loopback, and,
//!    in max-rate mode only, variants of the binary for the CPU split (span export off, audit off)
//!    and one with a shadow catalog (`shadow_catalog`: each call explained again against a
//!    candidate), reported as a ratio of the binary's throughput without; then
//! 4. the doors: the binary with the MCP door on (`server.mcp`), one process called with
//!    ExecuteTool over gRPC and others with `tools/call` over MCP's Streamable HTTP (2025-11-25,
//!    and 2026-07-28 at max rate only), the same catalog, tool and caller, reported as MCP / gRPC;
//!
//! each in max-rate mode (closed loop: N connections × M calls in flight each) and fixed-rate
//! mode (open loop: calls sent on a schedule, latency measured from each call's intended send time
//! so a stall is not hidden by coordinated omission). Then the binary's start-up time to health
//! SERVING, its idle RSS and its RSS with thousands of `slow_task` calls in flight.
//!
//! `--quick` runs every step with tiny durations and counts, as a smoke test. Every loop here is
//! bounded in count and time, and only loopback addresses are used.
//!
//! This file reads the command line and starts the program it names. The parts: [`options`] (what
//! can be set), [`catalog`] (the bench catalog and its tokens), [`targets`] (what is measured, by
//! name), [`processes`] (starting the servers, reading what `/proc` says of them), [`bare_echo`],
//! [`load`] (the client: closed and open loops, slow calls), [`measure`] (one round against one
//! target), [`mcp`] (a `tools/call` over Streamable HTTP), [`report`] (tables and verdicts), and
//! the programs [`run`], [`ab`], [`doors`], [`features`], [`emergency`], [`console`] and
//! [`helpers`] (send-only, the collector, the catalog writer).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark, like a test: a failure is a panic"
)]
#![expect(
    unsafe_code,
    reason = "set_var before any thread, prctl, kill(2) and sysconf, each with its SAFETY comment"
)]

#[path = "../../tests/common/otlp_collector.rs"]
mod otlp_collector;
#[path = "../../tests/common/redis_server.rs"]
mod redis_server;

mod ab;
mod bare_echo;
mod catalog;
mod console;
mod doors;
mod emergency;
mod features;
mod helpers;
mod load;
mod mcp;
mod measure;
mod options;
mod processes;
mod report;
mod run;
mod targets;

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use clap::{Args, CommandFactory, Parser, Subcommand, error::ErrorKind};

use crate::options::{HarnessArgs, Options};

/// The allocator the toolgate binary ships with, so the bare echo (in-process and as its own
/// process) runs the same stack on the same allocator and the ratios measure toolgate's own work.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Bare tonic echo vs toolgate over loopback: throughput, latency, server CPU per call, RSS and
/// start-up time (docs/performance.md). With no subcommand: the full run.
#[derive(Parser)]
#[command(name = "load", bin_name = "cargo bench --bench load --")]
struct Cli {
    #[command(flatten)]
    options: HarnessArgs,
    #[command(subcommand)]
    program: Option<Program>,
}

/// The programs besides the full run. Each also answers to its earlier flag spelling (`--ab PATH`,
/// `--send-only ADDR`, ...), which the results in docs/performance.md quote.
#[derive(Subcommand)]
enum Program {
    /// Interleaved A/B of two toolgate executables (A: --binary, B: PATH_B)
    ///
    /// Each runs as its own process with the bench catalog, audit to a file and spans to the
    /// harness's collector; they are measured in turn every round (the order swapped each round),
    /// at max rate and the fixed rates. Prints a table per round, then the medians and B / A.
    #[command(long_flag_alias = "ab")]
    Ab(ab::AbArgs),
    /// The toolgate binary against the bare stack, alone: the full run's own-process rows
    ///
    /// The bare echo and the binary (--binary, with the bench catalog: audit to a file, JWT,
    /// spans to the harness's collector), each its own process, measured in turn every round
    /// (the order swapped each round) at max rate and the fixed rates. Prints each round, then
    /// CPU and context switches per call with toolgate / bare per round, and the threads a call
    /// wakes.
    VsBare,
    /// The MCP door against the gRPC door, alone: the full run's door rows and checks
    ///
    /// Three binaries (--binary) with the bench catalog and the MCP door on, one called with
    /// ExecuteTool over gRPC, two with tools/call over MCP (2025-11-25; 2026-07-28 at max rate
    /// only), measured in turn every round (the order rotated each round). Prints each round,
    /// then the doors' table (MCP / gRPC per round) and the CPU checks.
    Doors,
    /// What each capability added this round costs: the same binary with and without it
    ///
    /// Flow rules (state in memory, then in Redis), ten conditional rules, and the output guard
    /// on 4 KiB outputs, each as two binaries (--binary) whose catalogs differ only by it,
    /// measured in turn every round (the order swapped each round). Prints each round, then the
    /// medians and with / without.
    Features {
        /// Only the features whose name contains this text (e.g. `credential`)
        only: Option<String>,
    },
    /// How fast an emergency deny reaches another sidecar sharing Redis
    ///
    /// Three binaries (--binary) with their state in one redis-server; each round sets a deny
    /// through the first and calls the third until it refuses, then clears it and calls until
    /// it runs again. Prints each round's times and their medians.
    Emergency,
    /// What the approvals console's pages and decisions take, against /healthz and GetApproval
    ///
    /// One binary (--binary) on the embedded demo (its console with the development sign-in),
    /// approvals made through the gRPC door, an approver signed in; each round times /healthz,
    /// GetApproval over gRPC, the inbox page, an approval's page and a decision, one after
    /// another. Prints medians, 99th percentiles, ratios to /healthz and page sizes.
    Console,
    /// Profiling helper: send calls to a server started by hand (e.g. under valgrind), then exit
    #[command(long_flag_alias = "send-only")]
    SendOnly(helpers::SendArgs),
    /// The bare echo server, until SIGTERM (two hours at most); the full run starts it this way
    #[command(name = bare_echo::SUBCOMMAND, long_flag_alias = bare_echo::SUBCOMMAND)]
    ServeBareEcho(Listen),
    /// An OTLP/gRPC collector that counts spans, until SIGINT or SIGTERM (ten minutes at most)
    #[command(long_flag_alias = "serve-collector")]
    ServeCollector(Listen),
    /// Write the bench catalog to DIR/bench.yaml (audit to DIR/audit.jsonl), with the MCP door on
    /// to DIR/bench-mcp.yaml, and print how to serve them
    #[command(long_flag_alias = "write-catalog")]
    WriteCatalog {
        /// Created if missing
        dir: PathBuf,
    },
}

/// Where a helper server listens.
#[derive(Args)]
struct Listen {
    /// A loopback socket address, e.g. 127.0.0.1:4317 (port 0: the server picks one and says it)
    #[arg(value_parser = options::loopback)]
    addr: SocketAddr,
}

fn main() -> ExitCode {
    // The bare echo process the harness starts is measured (its RSS is the stack's share), so its
    // own spelling skips building the CLI, whose pages and allocations it would otherwise hold.
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    if let [program, addr] = args.as_slice()
        && program.to_str() == Some(bare_echo::SUBCOMMAND)
        && let Some(addr) = addr.to_str().and_then(|a| options::loopback(a).ok())
    {
        return helper("bare echo", bare_echo::serve_process(addr));
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage_error(&err),
    };
    let options = cli.options;
    match cli.program {
        None => harness(options, run::run),
        Some(Program::Ab(args)) => harness(options, |o| ab::ab(o, &args.binary_b)),
        Some(Program::VsBare) => harness(options, ab::vs_bare),
        Some(Program::Doors) => harness(options, doors::doors),
        Some(Program::Features { only }) => harness(options, |options| {
            features::features(options, only.as_deref())
        }),
        Some(Program::Emergency) => harness(options, emergency::emergency),
        Some(Program::Console) => harness(options, console::console),
        Some(Program::SendOnly(args)) => harness(options, |o| helpers::send_only(o, &args)),
        // The servers and the catalog writer take none of the harness's options.
        Some(Program::ServeBareEcho(at)) => helper("bare echo", bare_echo::serve_process(at.addr)),
        Some(Program::ServeCollector(at)) => helper("collector", helpers::serve_collector(at.addr)),
        Some(Program::WriteCatalog { dir }) => {
            helper("write-catalog", helpers::write_catalog(&dir))
        }
    }
}

/// Resolves the options and runs one of the programs that send calls; fails if any call did.
fn harness(args: HarnessArgs, program: impl FnOnce(&Options) -> anyhow::Result<bool>) -> ExitCode {
    let options = match args.resolve() {
        Ok(options) => options,
        Err(message) => {
            return usage_error(&Cli::command().error(ErrorKind::ValueValidation, message));
        }
    };
    match program(&options) {
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

/// A helper server or the catalog writer: a failure is said with `what` in front.
fn helper(what: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{what}: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Prints clap's message: `--help` goes to stdout with status 0, a usage error to stderr with 2.
fn usage_error(err: &clap::Error) -> ExitCode {
    let _ = err.print();
    ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(2))
}
