//! The full run (no subcommand): start every server, measure every target once per round, in
//! turn, then the binary's start-up time, its idle RSS and its RSS with many slow calls in
//! flight, and print the report. What the targets are is `targets.rs`'s; how one is measured,
//! `measure.rs`'s; the tables, `report.rs`'s.

use std::{collections::BTreeMap, time::Duration};

use anyhow::{Context, anyhow};
use toolgate::{StartOptions, config::Config, settings::Env, telemetry::LogFormat};

use crate::{
    bare_echo,
    catalog::{SECRET, SECRET_ENV, catalog},
    load::{Slow, calls_in_turn, runtime, slow_calls},
    measure::measure,
    options::Options,
    otlp_collector,
    processes::{
        Memory, Spawned, idle_wakeups, load_average, memory, reserve_collector, shadow_counts,
        spawn_bare, start_redis, wait_shadow_loaded,
    },
    report::{Idle, Report, print_report},
    targets::{self, Binaries, EXPORTING, EchoCall, SERVICE_IN_PROCESS},
};

/// Runs every step and prints the tables; `Ok(false)` when calls failed.
pub fn run(options: &Options) -> anyhow::Result<bool> {
    // The collector's port is reserved now, before any thread exists, so the standard OTLP
    // variable can be set safely for the in-process server and inherited by the binary.
    let (collector_listener, otlp_endpoint) = reserve_collector()?;
    // SAFETY: no other thread exists yet, so nothing reads the environment concurrently.
    unsafe { std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp_endpoint) };

    let load_at_start = load_average();
    let dir = tempfile::tempdir()?;
    let collector_rt = runtime("bench-otlp", 1)?;
    let server_rt = runtime("bench-server", 2)?;
    let client_rt = runtime("bench-client", 2)?;
    let collector = collector_rt.block_on(otlp_collector::start_on(collector_listener, 10_000));
    let call = EchoCall::new(options.payload)?;

    // Every server is started first; then each round measures every target in turn, so all rows
    // see the same conditions, and a row's spread says how much a number moves between rounds.
    // 1. The bare echo in this process: the limit of the stack.
    let bare = server_rt.block_on(bare_echo::start_in_process())?;
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
    // 3. The deployed shape: the bare echo (this executable re-run as `serve-bare-echo`) and the
    // toolgate binaries as processes of their own (targets::Binaries: the binary, with a new JWT
    // per call, with span export and then audit too switched off for the CPU split, with its
    // state in Redis, with a shadow catalog, sampling 10 % of traces).
    let exe = &options.binary;
    let mut bare_process = spawn_bare(&dir.path().join("bare.log"))?;
    let redis = start_redis()?;
    let mut binaries = Binaries::spawn(exe, dir.path(), &redis.url())?
        .try_map(|spawned| Ok(spawned.wait_serving(&client_rt)?.0))?;
    // The candidate loads right after start; measuring before it did would measure nothing.
    let shadow_admin = binaries
        .shadow
        .admin
        .context("the shadow binary said nothing of its admin listener")?;
    wait_shadow_loaded(shadow_admin)?;
    let targets = targets::of_run(
        &call,
        bare.addr,
        in_process_addr,
        &bare_process,
        &binaries,
        redis.pid(),
    )?;
    let mut rows = Vec::new();
    let mut calls_by_target: BTreeMap<&str, u64> = BTreeMap::new();
    let mut all_ok = true;
    let measured = (|| -> anyhow::Result<()> {
        for round in 0..options.rounds {
            eprintln!("round {} of {}", round + 1, options.rounds);
            for target in &targets {
                let measured = measure(options, &client_rt, target, &mut rows)?;
                all_ok &= measured.ok;
                *calls_by_target.entry(target.name).or_default() += measured.calls;
            }
        }
        Ok(())
    })();
    // What the shadow worker did with the calls it was offered: compared, or skipped (its
    // queue full), so the ratio below is read with what it covered.
    let shadow = shadow_counts(shadow_admin);
    server_rt.block_on(bare.stop());
    server_rt.block_on(running.shutdown());
    bare_process.stop()?;
    for binary in binaries.each_mut() {
        binary.stop()?;
    }
    measured?;
    // Why spans went missing, if they did: the binaries log every drop and failed export.
    for binary in binaries.each() {
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
    let spans_report: Vec<(&'static str, u64, u64)> = EXPORTING
        .iter()
        .map(|&(row, service)| {
            let calls = calls_by_target.get(row).copied().unwrap_or(0);
            (row, collector.received_from(service), calls)
        })
        .collect();

    // 4. Start-up time to health SERVING, with the plain binary's catalog.
    let config_path = &binaries.plain.config;
    let mut startups = Vec::new();
    for _ in 0..options.startup_runs {
        let spawned = Spawned::spawn(exe, config_path, dir.path(), "toolgate-bench-startup", &[])?;
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
    // How long an idle sidecar is watched for wake-ups, and the calls it serves before it is
    // idle again (then its memory is what a pod between bursts of calls holds).
    let (idle_window, traffic_calls) = match options.quick {
        true => (Duration::from_millis(300), 100),
        false => (Duration::from_secs(5), 2_000),
    };
    let mut memory_rounds = Vec::new();
    let mut bare_memory_rounds = Vec::new();
    let mut idle_rounds = Vec::new();
    for _ in 0..options.rounds {
        let spawned = Spawned::spawn(exe, config_path, dir.path(), "toolgate-bench-rss", &[])?;
        let (mut binary, _) = spawned.wait_serving(&client_rt)?;
        let pid = binary.pid();
        let measured = (|| -> anyhow::Result<(Idle, Memory, Slow)> {
            std::thread::sleep(settle);
            let wakeups = idle_wakeups(pid, idle_window).context("reading the binary's threads")?;
            // After the window: the binary lets go of start-up's pages a second after SERVING.
            let fresh = memory(pid).context("reading the binary's /proc status")?;
            client_rt.block_on(calls_in_turn(
                binary.addr,
                &call.request,
                &call.auth,
                traffic_calls,
            ))?;
            std::thread::sleep(settle);
            let served = memory(pid).context("reading the binary's /proc status")?;
            let slow = client_rt.block_on(slow_calls(options, binary.addr, &call.auth, pid))?;
            let idle = Idle {
                fresh,
                wakeups,
                traffic_calls,
            };
            Ok((idle, served, slow))
        })();
        binary.stop()?;
        let (idle, served, slow) = measured?;
        all_ok &= slow.failed == 0;
        memory_rounds.push((served, slow));
        idle_rounds.push(idle);

        // The same against the bare echo process: the gRPC stack's own share (diagnostic).
        let mut bare_process = spawn_bare(&dir.path().join("bare-rss.log"))?;
        let bare_pid = bare_process.pid();
        let bare_slow = (|| -> anyhow::Result<(Memory, Slow)> {
            client_rt.block_on(calls_in_turn(
                bare_process.addr,
                &call.request,
                &call.auth,
                traffic_calls,
            ))?;
            std::thread::sleep(settle);
            let served = memory(bare_pid).context("reading the bare echo's /proc status")?;
            let slow =
                client_rt.block_on(slow_calls(options, bare_process.addr, &call.auth, bare_pid))?;
            Ok((served, slow))
        })();
        bare_process.stop()?;
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
        idle: &idle_rounds,
        load_at_start,
        load_at_end,
        otlp_endpoint: &otlp_endpoint,
    });
    Ok(all_ok)
}
