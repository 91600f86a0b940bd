//! The interleaved A/B mode (`ab PATH_B [--binary PATH_A]`): two toolgate executables, each its
//! own process with the bench catalog, measured in turn every round, with their own tables (each
//! round's rows, then each binary's median and B / A per round). What a round measures is
//! `measure`'s, as in the full run.

use std::{
    ops::Range,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::Args;
use tokio::runtime::Runtime;

use crate::{
    catalog::catalog,
    load::runtime,
    measure::{Row, measure},
    options::{Options, executable},
    otlp_collector,
    processes::{Binary, Spawned, load_average, reserve_collector, spawn_bare},
    report::{Spread, measured_keys, print_fixed_rate_costs, print_wakeups},
    targets::{BINARY, EchoCall, Target},
};

/// The A/B mode's own argument; A is `--binary`.
#[derive(Args)]
pub struct AbArgs {
    /// The toolgate executable measured as B
    #[arg(value_name = "PATH_B", value_parser = executable)]
    pub binary_b: PathBuf,
}

/// A number read off a row (throughput, a percentile, CPU per call).
type RowValue = fn(&Row) -> Option<f64>;

/// The two executables' rows in the A/B mode (named after the flags of its first spelling,
/// `--ab PATH_B --binary PATH_A`, which still works).
const AB_A: &str = "A (--binary)";
const AB_B: &str = "B (--ab)";

/// Each round's rows, in the order measured: `rounds` are (round, the rows it measured);
/// `what` names the column of the rows' targets.
pub fn print_each_round(what: &str, rows: &[Row], rounds: &[(usize, Range<usize>)]) {
    println!("\nEach round (server CPU from /proc/PID/stat, per answered call):\n");
    println!(
        "| round | {what} | mode | throughput (calls/s) | p50 ms | p99 ms | server CPU µs/call |"
    );
    println!("|---:|---|---|---:|---:|---:|---:|");
    for (round, range) in rounds {
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
    // Failed calls, with the first reason each row kept.
    for (round, range) in rounds {
        for row in rows[range.clone()]
            .iter()
            .filter(|row| row.stats.failed > 0)
        {
            println!(
                "\nround {}, {}, {}: {} calls failed; {}",
                round + 1,
                row.target,
                row.mode,
                row.stats.failed,
                row.note
            );
        }
    }
}

/// One side of an interleaved comparison: the name of its rows, its executable, its catalog
/// and the service name its spans carry.
pub struct Side<'a> {
    pub name: &'static str,
    pub exe: &'a Path,
    pub catalog: String,
    pub service: &'static str,
}

impl Side<'_> {
    /// Starts this side's executable with its catalog (written to `dir`), spans to `endpoint`;
    /// returns once health says SERVING.
    fn start(
        &self,
        client_rt: &Runtime,
        dir: &Path,
        endpoint: &[(&str, &str)],
    ) -> anyhow::Result<Binary> {
        let config = dir.join(format!("{}.yaml", self.service));
        std::fs::write(&config, &self.catalog)?;
        let binary = Spawned::spawn(self.exe, &config, dir, self.service, endpoint)?
            .wait_serving(client_rt)?
            .0;
        println!(
            "{}: {} (pid {})",
            self.name,
            self.exe.display(),
            binary.pid()
        );
        Ok(binary)
    }
}

/// What an interleaved comparison measured: its rows, each round's, and whether every call was
/// answered.
pub struct Interleaved {
    pub rows: Vec<Row>,
    pub rounds: Vec<(usize, Range<usize>)>,
    pub ok: bool,
}

/// Starts both sides, each its own process (catalog and audit in `dir`, spans to `endpoint`),
/// measures them [`in_turn`], then stops them.
pub fn interleave(
    options: &Options,
    client_rt: &Runtime,
    dir: &Path,
    endpoint: &[(&str, &str)],
    call: &EchoCall,
    sides: [Side<'_>; 2],
) -> anyhow::Result<Interleaved> {
    let start = |side: &Side<'_>| side.start(client_rt, dir, endpoint);
    let [first, second] = sides;
    let mut a = start(&first)?;
    let mut b = start(&second)?;
    let measured = in_turn(
        options,
        client_rt,
        [
            Target::binary(first.name, &a, call),
            Target::binary(second.name, &b, call),
        ],
    );
    a.stop()?;
    b.stop()?;
    measured
}

/// Measures two running targets in turn within each round, the first then the second in even
/// rounds and the other way in odd ones, so a slow stretch of the machine lands on both and
/// neither always goes first.
pub fn in_turn(
    options: &Options,
    client_rt: &Runtime,
    targets: [Target; 2],
) -> anyhow::Result<Interleaved> {
    let mut measured = Interleaved {
        rows: Vec::new(),
        rounds: Vec::new(),
        ok: true,
    };
    for round in 0..options.rounds {
        let [first, second] = &targets;
        let order = if round % 2 == 0 {
            [first, second]
        } else {
            [second, first]
        };
        for target in order {
            let from = measured.rows.len();
            measured.ok &= measure(options, client_rt, target, &mut measured.rows)?.ok;
            measured.rounds.push((round, from..measured.rows.len()));
        }
    }
    Ok(measured)
}

/// The medians (min–max) over the rounds of the rows named `a` and `b`, mode by mode, with
/// `b / a` taken per round (`ratio` names it).
pub fn print_medians(options: &Options, rows: &[Row], a: &str, b: &str, ratio: &str) {
    // Rows of one side in one mode, in round order.
    let of = |name: &str, mode: &str| -> Vec<&Row> {
        rows.iter()
            .filter(|r| r.target == name && r.mode == mode)
            .collect()
    };
    let modes: Vec<String> = rows
        .iter()
        .filter(|r| r.target == a)
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
        "\nMedian (min–max) over {} rounds; {ratio} per round:\n",
        options.rounds
    );
    println!("| mode | what | {a} | {b} | {ratio} |");
    println!("|---|---|---:|---:|---:|");
    for mode in &modes {
        let (a, b) = (of(a, mode), of(b, mode));
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
}

/// What an interleaved program runs with: the collector the servers export spans to (on its
/// own runtime), the client's runtime, a directory for catalogs and audit files, and the call.
struct Bench {
    collector_rt: Runtime,
    collector: otlp_collector::Collector,
    client_rt: Runtime,
    dir: tempfile::TempDir,
    call: EchoCall,
    otlp_endpoint: String,
}

impl Bench {
    fn start(options: &Options) -> anyhow::Result<Self> {
        let (collector_listener, otlp_endpoint) = reserve_collector()?;
        println!("load average at start: {}", load_average());
        let collector_rt = runtime("bench-otlp", 1)?;
        let collector = collector_rt.block_on(otlp_collector::start_on(collector_listener, 10_000));
        Ok(Bench {
            collector_rt,
            collector,
            client_rt: runtime("bench-client", 2)?,
            dir: tempfile::tempdir()?,
            call: EchoCall::new(options.payload)?,
            otlp_endpoint,
        })
    }

    fn endpoint(&self) -> [(&'static str, &str); 1] {
        [("OTEL_EXPORTER_OTLP_ENDPOINT", self.otlp_endpoint.as_str())]
    }

    /// A toolgate side named `name` with the bench catalog, its audit file in the directory.
    fn side<'a>(&self, name: &'static str, exe: &'a Path, service: &'static str) -> Side<'a> {
        Side {
            name,
            exe,
            catalog: catalog(&self.dir.path().join(format!("audit-{service}.jsonl"))),
            service,
        }
    }

    /// Waits until the servers' spans stop coming, then prints how many came from each of
    /// `services` next to the calls answered, and the load average.
    fn finish(&self, options: &Options, measured: &Interleaved, services: [&str; 2]) {
        let received = self.collector_rt.block_on(
            self.collector
                .wait_until_quiet(options.span_quiet, Duration::from_secs(60)),
        );
        let calls: u64 = measured.rows.iter().map(|r| r.stats.ok).sum();
        let [a, b] = services;
        println!(
            "\nOTLP spans received: {received} (from {a}: {}, from {b}: {}); calls answered in the measured phases: {calls}",
            self.collector.received_from(a),
            self.collector.received_from(b),
        );
        println!("load average at end: {}", load_average());
    }
}

/// Interleaved A/B (`ab`): two toolgate executables, started once each with the same catalog
/// (audit to a file, JWT, spans to the collector) and measured in turn within each round
/// ([`interleave`]). Prints each round, then each binary's median (min–max) over the rounds and
/// the ratios B / A taken per round.
pub fn ab(options: &Options, other: &Path) -> anyhow::Result<bool> {
    let bench = Bench::start(options)?;
    let (service_a, service_b) = ("toolgate-bench-a", "toolgate-bench-b");
    let measured = interleave(
        options,
        &bench.client_rt,
        bench.dir.path(),
        &bench.endpoint(),
        &bench.call,
        [
            bench.side(AB_A, &options.binary, service_a),
            bench.side(AB_B, other, service_b),
        ],
    )?;
    print_each_round("binary", &measured.rows, &measured.rounds);
    print_medians(options, &measured.rows, AB_A, AB_B, "B / A");
    bench.finish(options, &measured, [service_a, service_b]);
    Ok(measured.ok)
}

/// The toolgate binary against the bare stack, alone (`vs-bare`): the bare echo and the binary
/// (--binary, with the bench catalog: audit to a file, JWT, spans to the collector), each its
/// own process, measured in turn within each round ([`in_turn`]) at max rate and the fixed
/// rates. Prints each round, then the full run's table of CPU and context switches per call with
/// toolgate / bare taken per round, and the threads each call wakes.
pub fn vs_bare(options: &Options) -> anyhow::Result<bool> {
    let bench = Bench::start(options)?;
    let service = "toolgate-bench-binary";
    let mut bare = spawn_bare(&bench.dir.path().join("bare.log"))?;
    println!("bare echo (pid {})", bare.pid());
    let mut binary = bench.side(BINARY, &options.binary, service).start(
        &bench.client_rt,
        bench.dir.path(),
        &bench.endpoint(),
    )?;
    let measured = in_turn(
        options,
        &bench.client_rt,
        [
            Target::bare_process(&bare, &bench.call),
            Target::binary(BINARY, &binary, &bench.call),
        ],
    );
    bare.stop()?;
    binary.stop()?;
    let measured = measured?;
    print_each_round("server", &measured.rows, &measured.rounds);
    println!();
    print_fixed_rate_costs(options, &measured.rows);
    print_wakeups(&measured_keys(&measured.rows), &measured.rows);
    bench.finish(
        options,
        &measured,
        [service, "(none: the bare echo exports nothing)"],
    );
    Ok(measured.ok)
}
