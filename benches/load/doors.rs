//! The doors program (`doors`): the MCP door against the gRPC door and nothing else, for as many
//! rounds as asked. Three binaries with one catalog (the bench catalog with the MCP door on), one
//! called over gRPC and two over MCP (2025-11-25, and 2026-07-28 at max rate only), measured in
//! turn every round, the order rotated each round; then each round's rows, the doors' table and
//! the checks, as the full run prints them. What a round measures is `measure`'s.

use std::{collections::BTreeMap, ops::Range, time::Duration};

use crate::{
    ab::print_each_round,
    load::runtime,
    measure::measure,
    options::Options,
    otlp_collector,
    processes::{load_average, reserve_collector},
    report::{door_checks, print_doors},
    targets::{
        DOOR_GRPC, DOOR_MCP, DOOR_MCP_MODERN, Doors, EchoCall, SERVICE_DOOR_GRPC, SERVICE_DOOR_MCP,
        SERVICE_DOOR_MCP_MODERN, of_doors,
    },
};

/// Runs the doors' rounds and prints their tables; `Ok(false)` when calls failed.
pub fn doors(options: &Options) -> anyhow::Result<bool> {
    let (collector_listener, otlp_endpoint) = reserve_collector()?;
    let load_at_start = load_average();
    let dir = tempfile::tempdir()?;
    let collector_rt = runtime("bench-otlp", 1)?;
    let client_rt = runtime("bench-client", 2)?;
    let collector = collector_rt.block_on(otlp_collector::start_on(collector_listener, 10_000));
    let call = EchoCall::new(options.payload)?;
    let endpoint = [("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_endpoint.as_str())];
    let mut binaries = Doors::spawn(&options.binary, dir.path(), &endpoint)?
        .try_map(|spawned| Ok(spawned.wait_serving(&client_rt)?.0))?;
    println!(
        "toolgate binary: {}; load average at start: {load_at_start}",
        options.binary.display()
    );
    let targets = of_doors(&call, &binaries)?;
    let mut rows = Vec::new();
    let mut rounds: Vec<(usize, Range<usize>)> = Vec::new();
    let mut calls: BTreeMap<&str, u64> = BTreeMap::new();
    let mut ok = true;
    let measured = (|| -> anyhow::Result<()> {
        for round in 0..options.rounds {
            eprintln!("round {} of {}", round + 1, options.rounds);
            // Rotated, so that no door always goes first.
            for i in 0..targets.len() {
                let target = &targets[(round + i) % targets.len()];
                let from = rows.len();
                let measured = measure(options, &client_rt, target, &mut rows)?;
                ok &= measured.ok;
                *calls.entry(target.name).or_default() += measured.calls;
                rounds.push((round, from..rows.len()));
            }
        }
        Ok(())
    })();
    for binary in binaries.each_mut() {
        binary.stop()?;
    }
    measured?;
    collector_rt.block_on(collector.wait_until_quiet(options.span_quiet, Duration::from_secs(60)));
    print_each_round("target", &rows, &rounds);
    println!();
    print_doors(options, &rows);
    println!("| check | measured: median (min–max) over the rounds | target | verdict |");
    println!("|---|---|---|---|");
    for (check, measured, goal, verdict) in door_checks(options, &rows) {
        println!("| {check} | {measured} | {goal} | {verdict} |");
    }
    println!();
    for (row, service) in [
        (DOOR_GRPC, SERVICE_DOOR_GRPC),
        (DOOR_MCP, SERVICE_DOOR_MCP),
        (DOOR_MCP_MODERN, SERVICE_DOOR_MCP_MODERN),
    ] {
        println!(
            "OTLP spans received from {row}: {} for {} calls",
            collector.received_from(service),
            calls.get(row).copied().unwrap_or(0)
        );
    }
    println!("load average at end: {}", load_average());
    collector_rt.block_on(collector.shutdown());
    Ok(ok)
}
