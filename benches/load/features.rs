//! The features program (`features`): what each capability added in this round of work costs a
//! call, as the same binary with and without it, interleaved round by round the way `ab` does
//! it: run-level flow rules (state in memory, then in Redis), ten conditional access rules, and
//! the output guard on 4 KiB outputs. The MCP door has its own program (`doors`). Prints, per
//! feature, each round and the medians with `with / without` taken per round.

use std::{path::Path, time::Duration};

use crate::{
    ab::{Side, interleave, print_each_round, print_medians},
    catalog::{
        catalog, catalog_with_conditions, catalog_with_flow, catalog_with_redis,
        catalog_without_output_guard,
    },
    load::runtime,
    options::Options,
    otlp_collector,
    processes::{load_average, reserve_collector, start_redis},
    targets::EchoCall,
};

const WITHOUT: &str = "without";
const WITH: &str = "with";

/// One capability priced.
struct Feature {
    /// Heads its tables.
    name: &'static str,
    /// What the "with" binary does that the other does not.
    what: &'static str,
    /// The echoed text's bytes, when the feature needs its own (else `--payload`).
    payload: Option<usize>,
    /// The catalogs without and with it, auditing to the given files; the harness's Redis URL.
    catalogs: fn(without: &Path, with: &Path, redis_url: &str) -> (String, String),
}

const FEATURES: &[Feature] = &[
    Feature {
        name: "flow rules, state in memory",
        what: "echo carries a flow label and a rule governs it (it never fires): every call reads \
               its run's scope before the quotas and records its label after the backend",
        payload: None,
        catalogs: |without, with, _| (catalog(without), catalog_with_flow(&catalog(with))),
    },
    Feature {
        name: "flow rules, state in Redis",
        what: "the same, both binaries with their state (quotas, and the flow scope for the \
               other) in the harness's redis-server: one more script to read the scope and \
               one to record",
        payload: None,
        catalogs: |without, with, url| {
            (
                catalog_with_redis(without, url),
                catalog_with_flow(&catalog_with_redis(with, url)),
            )
        },
    },
    Feature {
        name: "ten conditional rules",
        what: "the tenant has ten deny entries for echo, each with a CEL condition on the \
               arguments that never holds: every call evaluates all ten after bind",
        payload: None,
        catalogs: |without, with, _| (catalog(without), catalog_with_conditions(&catalog(with))),
    },
    Feature {
        name: "the output guard, 4 KiB outputs",
        what: "the default detectors (the eight secret ones) screen each 4 KiB output; the \
               other binary has them off (`output_guard: { secrets: off }`)",
        payload: Some(4096),
        catalogs: |without, with, _| {
            (
                catalog_without_output_guard(&catalog(without)),
                catalog(with),
            )
        },
    },
];

/// Runs every feature's rounds and prints their tables; `Ok(false)` when calls failed.
pub fn features(options: &Options) -> anyhow::Result<bool> {
    let (collector_listener, otlp_endpoint) = reserve_collector()?;
    let load_at_start = load_average();
    let dir = tempfile::tempdir()?;
    let collector_rt = runtime("bench-otlp", 1)?;
    let client_rt = runtime("bench-client", 2)?;
    let collector = collector_rt.block_on(otlp_collector::start_on(collector_listener, 10_000));
    let endpoint = [("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_endpoint.as_str())];
    let redis = start_redis()?;
    println!(
        "toolgate binary: {}; load average at start: {load_at_start}",
        options.binary.display()
    );
    let mut ok = true;
    for (i, feature) in FEATURES.iter().enumerate() {
        println!("\n## {}\n\n{}.\n", feature.name, feature.what);
        let audit = |side: &str| dir.path().join(format!("audit-{i}-{side}.jsonl"));
        let (without, with) = (feature.catalogs)(&audit(WITHOUT), &audit(WITH), &redis.url());
        let call = EchoCall::new(feature.payload.unwrap_or(options.payload))?;
        let measured = interleave(
            options,
            &client_rt,
            dir.path(),
            &endpoint,
            &call,
            [
                Side {
                    name: WITHOUT,
                    exe: &options.binary,
                    catalog: without,
                    service: "toolgate-bench-without",
                },
                Side {
                    name: WITH,
                    exe: &options.binary,
                    catalog: with,
                    service: "toolgate-bench-with",
                },
            ],
        )?;
        ok &= measured.ok;
        print_each_round("binary", &measured.rows, &measured.rounds);
        print_medians(options, &measured.rows, WITHOUT, WITH, "with / without");
    }
    collector_rt.block_on(collector.wait_until_quiet(options.span_quiet, Duration::from_secs(60)));
    println!("\nload average at end: {}", load_average());
    collector_rt.block_on(collector.shutdown());
    Ok(ok)
}
