//! Logging setup. Logs go to stderr so stdout stays free for the audit stream.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Readable text.
    Human,
}

/// Installs the global subscriber; `RUST_LOG` refines the default `info` filter.
pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .with_writer(std::io::stderr)
                    .with_current_span(false),
            )
            .try_init(),
        LogFormat::Human => registry
            .with(fmt::layer().with_writer(std::io::stderr))
            .try_init(),
    };
    // Already installed (e.g. by a test harness): keep the existing one.
    let _ = result;
}
