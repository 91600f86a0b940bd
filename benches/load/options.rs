//! What the harness can be told. [`HarnessArgs`] are the full run's options, which the A/B mode
//! and the send-only helper share (global, so they may also follow the subcommand); they resolve
//! to [`Options`], whose defaults `--quick` makes tiny. The subcommands' own arguments live with
//! their code (`ab.rs`, `helpers.rs`, `main.rs`); the value parsers here serve them all.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, builder::RangedU64ValueParser};

/// At most this many calls in flight at once: at max rate (connections × concurrency) and in
/// the slow-call test. The bench catalog's `max_in_flight` is the same.
const MAX_IN_FLIGHT: u64 = 100_000;

/// The options as given; what is not given takes [`Options::defaults`].
#[derive(Args, Debug)]
pub struct HarnessArgs {
    /// Every step with tiny durations and counts, as a smoke test: same tables, exit 0 unless a
    /// call failed
    #[arg(long, global = true)]
    quick: bool,
    /// Accepted and ignored: `cargo bench` passes it to every bench target
    #[arg(long, global = true, hide = true)]
    bench: bool,
    /// How long each measured phase runs (max rate, and each fixed rate), e.g. 10s
    #[arg(long, global = true, value_name = "DURATION", value_parser = duration)]
    duration: Option<Duration>,
    /// Warm-up before each target's max-rate phase
    #[arg(long, global = true, value_name = "DURATION", value_parser = duration)]
    warmup: Option<Duration>,
    /// HTTP/2 connections to each target
    #[arg(long, global = true, value_name = "N", value_parser = count(MAX_IN_FLIGHT))]
    connections: Option<u64>,
    /// Callers per connection at max rate, each with one call in flight
    #[arg(long, global = true, value_name = "M", value_parser = count(MAX_IN_FLIGHT))]
    concurrency: Option<u64>,
    /// Fixed rates measured, in calls per second, several separated by commas (e.g. 500,3000)
    #[arg(long = "rate", global = true, value_name = "RPS[,RPS...]", value_parser = rates)]
    rates: Option<Rates>,
    /// Size of the echoed text in bytes (at most 512 KiB)
    #[arg(long, global = true, value_name = "BYTES", value_parser = count(512 * 1024))]
    payload: Option<u64>,
    /// Slow calls held in flight at once for the RSS test
    #[arg(long, global = true, value_name = "N", value_parser = count(MAX_IN_FLIGHT))]
    slow_calls: Option<u64>,
    /// How long each slow call sleeps, in ms (at most 50000: the slow tool's timeout is 60s)
    #[arg(long, global = true, value_name = "MS", value_parser = count(50_000))]
    slow_ms: Option<u64>,
    /// Starts of the binary timed to health SERVING
    #[arg(long, global = true, value_name = "N", value_parser = count(u64::MAX))]
    startup_runs: Option<u64>,
    /// Rounds: every target is measured once per round, in turn (at most 20)
    #[arg(long, global = true, value_name = "N", value_parser = count(20))]
    rounds: Option<u64>,
    /// The toolgate executable measured as its own process (A in the A/B mode); by default the
    /// one cargo built for this bench
    #[arg(long, global = true, value_name = "PATH", value_parser = executable)]
    binary: Option<PathBuf>,
}

/// `--rate`'s list as one value, so that a later `--rate` replaces the list rather than adds to it.
#[derive(Debug, Clone)]
pub struct Rates(Vec<u64>);

/// What every program runs with.
#[derive(Debug, Clone)]
pub struct Options {
    pub quick: bool,
    pub duration: Duration,
    pub warmup: Duration,
    pub connections: usize,
    pub concurrency: usize,
    /// Fixed rates measured (open loop), in calls per second.
    pub rates: Vec<u64>,
    pub payload: usize,
    pub slow_calls: usize,
    pub slow_ms: u64,
    pub startup_runs: usize,
    /// Rounds: every target is measured once per round, in turn, so each row has this many
    /// measurements taken under the same conditions as the others' (and shows their spread).
    pub rounds: usize,
    /// How long without a new span means the exporter has sent everything.
    pub span_quiet: Duration,
    /// The toolgate executable measured as its own process; by default the one cargo built for
    /// this bench (`target/release/toolgate`).
    pub binary: PathBuf,
}

impl Options {
    /// The defaults of a full run, or of a smoke run (`quick`).
    fn defaults(quick: bool) -> Self {
        let pick = |smoke: u64, full: u64| if quick { smoke } else { full };
        let ms = |smoke, full| Duration::from_millis(pick(smoke, full));
        Options {
            quick,
            duration: ms(500, 10_000),
            warmup: ms(100, 2000),
            connections: 2,
            concurrency: pick(4, 32) as usize,
            rates: if quick {
                vec![200, 500]
            } else {
                vec![500, 1000, 3000]
            },
            payload: 256,
            slow_calls: pick(200, 10_000) as usize,
            slow_ms: pick(300, 5000),
            startup_runs: pick(3, 7) as usize,
            rounds: 3,
            span_quiet: ms(1300, 2500),
            binary: PathBuf::from(env!("CARGO_BIN_EXE_toolgate")),
        }
    }
}

impl HarnessArgs {
    /// What was given, else the defaults (`--quick`'s when it was given); `Err` says which
    /// combination is refused.
    pub fn resolve(self) -> Result<Options, String> {
        let d = Options::defaults(self.quick);
        let size = |given: Option<u64>, default: usize| given.map_or(default, |n| n as usize);
        let options = Options {
            quick: self.quick,
            duration: self.duration.unwrap_or(d.duration),
            warmup: self.warmup.unwrap_or(d.warmup),
            connections: size(self.connections, d.connections),
            concurrency: size(self.concurrency, d.concurrency),
            rates: self.rates.map_or(d.rates, |rates| rates.0),
            payload: size(self.payload, d.payload),
            slow_calls: size(self.slow_calls, d.slow_calls),
            slow_ms: self.slow_ms.unwrap_or(d.slow_ms),
            startup_runs: size(self.startup_runs, d.startup_runs),
            rounds: size(self.rounds, d.rounds),
            span_quiet: d.span_quiet,
            binary: self.binary.unwrap_or(d.binary),
        };
        let in_flight = options.connections.saturating_mul(options.concurrency);
        if in_flight as u64 > MAX_IN_FLIGHT {
            return Err(format!(
                "at most {MAX_IN_FLIGHT} calls in flight: --connections × --concurrency is {in_flight}"
            ));
        }
        Ok(options)
    }
}

/// A whole number from 1 to `max`.
fn count(max: u64) -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::new().range(1..=max)
}

/// A duration such as `10s` or `500ms`, not zero.
pub fn duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| "not a duration such as 10s or 500ms".into())
}

/// Calls per second, or several separated by commas; none of them zero.
fn rates(value: &str) -> Result<Rates, String> {
    value
        .split(',')
        .map(|r| r.trim().parse::<u64>().ok().filter(|r| *r > 0))
        .collect::<Option<Vec<_>>>()
        .filter(|r| !r.is_empty())
        .map(Rates)
        .ok_or_else(|| "not calls per second, or several separated by commas".into())
}

/// A socket address on loopback: the harness talks to nothing else.
pub fn loopback(value: &str) -> Result<SocketAddr, String> {
    value
        .parse::<SocketAddr>()
        .ok()
        .filter(|a| a.ip().is_loopback())
        .ok_or_else(|| "not a loopback socket address, e.g. 127.0.0.1:4317".into())
}

/// The path of an existing file (a toolgate executable).
pub fn executable(value: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(value);
    if path.is_file() {
        Ok(path)
    } else {
        Err("not the path of a toolgate executable".into())
    }
}
