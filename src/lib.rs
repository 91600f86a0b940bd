//! toolgate: a gRPC sidecar that stands between an AI agent and the tools it calls.
//!
//! A call travels: `server` (proto -> domain, caller from `identity`) -> `boundary` (the ordered
//! chain of stages, using `catalog`, `limits` and `approvals`) -> `executor` (the backend) ->
//! back through `boundary` (result shaping, `audit`) -> `server` (domain -> proto).

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
