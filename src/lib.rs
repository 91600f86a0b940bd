//! toolgate: a gRPC sidecar that stands between an AI agent and the tools it calls.
//!
//! A call travels: `server` (proto -> domain, caller from `identity`) -> `boundary` (the ordered
//! chain of stages, using `catalog`, `limits` and `approvals`) -> `executor` (the backend) ->
//! back through `boundary` (result shaping, `audit`) -> `server` (domain -> proto).
//!
//! # Floors
//!
//! Each module imports only modules on its own floor or below, and no two modules import each
//! other, directly or around a loop (`tests/integration/architecture.rs` reads every
//! `crate::` path outside test code and checks both). A type two floors share lives on the
//! lower one.
//!
//! | floor | modules | what lives there |
//! |---|---|---|
//! | 0 | `canonical`, `clock`, `error`, `gcra`, `outcome`, `settings`, `tls` | foundations: canonical JSON, time, the outcome table and a call's outcome, the GCRA arithmetic, plain configuration values (a tool's risk level among them), TLS setup |
//! | 1 | `identity`, `metrics`, `state` | who is calling, the metrics registry, the shared state's connections |
//! | 2 | `catalog`, `executor` | tool definitions and the backends that run them |
//! | 3 | `approvals`, `audit`, `limits`, `telemetry` | what calls leave behind: approvals, audit events, quotas, spans |
//! | 4 | `config` | a catalog file assembled into the parts of a running sidecar |
//! | 5 | `boundary` | the execution boundary: the chain of stages |
//! | 6 | `shadow` | a candidate catalog compared with the boundary's decisions |
//! | 7 | `cli`, `server` | the doors: the command line, and the gRPC services and listeners |
//!
//! Each type has one name: `config` assembles `settings` and re-exports none of it.
//!
//! One import goes up by design: executors take the boundary's sealed [`boundary::Permit`]
//! (`executor` -> `boundary::Permit`), so that only the chain can make what an executor runs.

pub mod approvals;
pub mod audit;
pub mod boundary;
pub mod canonical;
pub mod catalog;
pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod executor;
pub mod gcra;
pub mod identity;
pub mod limits;
pub mod metrics;
pub mod outcome;
pub mod server;
pub mod settings;
pub mod shadow;
pub mod state;
pub mod telemetry;
pub mod tls;

pub use server::{Running, StartError, StartOptions, run, start};

/// Generated `toolgate.v1` types, clients and servers.
pub mod proto {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("toolgate.v1");

    /// The encoded file descriptor set, served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/toolgate_descriptor.bin"));
}
