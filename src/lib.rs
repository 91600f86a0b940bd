//! toolgate: a gRPC sidecar that stands between an AI agent and the tools it calls.
//!
//! A call travels: a door — `server` (gRPC) or `mcp_door` (MCP) — (protocol -> domain, caller
//! from `identity` through `admission`) -> `boundary` (the ordered
//! chain of stages, using `catalog`, `limits` and `approvals`) -> `executor` (the backend) ->
//! back through `boundary` (result shaping, `audit`) -> the door (domain -> protocol).
//!
//! # Floors
//!
//! Each module imports only modules on its own floor or below, and no two modules import each
//! other, directly or around a loop (`tests/integration/project/architecture.rs` reads every
//! `crate::` path outside test code and checks both). A type two floors share lives on the
//! lower one.
//!
//! | floor | modules | what lives there |
//! |---|---|---|
//! | 0 | `canonical`, `clock`, `error`, `gcra`, `outbound`, `outcome`, `settings`, `tasks`, `tls` | foundations: canonical JSON, time, the outcome table and a call's outcome, the GCRA arithmetic, the guarded client every outbound HTTP request goes through, plain configuration values (a tool's risk level among them), tasks with an owner, TLS setup |
//! | 1 | `conditions`, `credentials`, `identity`, `metrics`, `openapi`, `output_guard`, `state`, `telemetry` | CEL conditions over a call (compiled at load, evaluated by the stages), the per-call credentials backends are called with (exchanged for the caller's token, or the sidecar's own), who is calling, the metrics registry, OpenAPI descriptions read into catalog entries for review (`toolgate import`; nothing at serve time), the detectors screening tool output, the shared state's connections, the tracer and its exporter |
//! | 2 | `catalog`, `executor` | tool definitions as plain data (each names its backend: a builtin, an upstream by name, a program, an MCP server's tool), and the registry of live backends that run them (`executor` reads the catalog's specs; the catalog knows no executor) |
//! | 3 | `approvals`, `audit`, `budgets`, `emergency`, `flow`, `limits` | what calls leave behind and what stops them: approvals, audit events, what each run and caller's day has spent of its budgets, emergency denies, what each flow scope has seen, quotas |
//! | 4 | `config` | a catalog file assembled into the parts of a running sidecar |
//! | 5 | `boundary` | the execution boundary: the chain of stages |
//! | 6 | `admission`, `shadow` | who may come in through a door (identity from the headers, the caps on requests and connections, counted for both doors together); a candidate catalog compared with the boundary's decisions |
//! | 7 | `console`, `mcp_door`, `server` | the doors: the approvals console (web pages where approvers sign in and decide), the MCP door (Streamable HTTP), and the gRPC services and the transport they are served behind |
//! | 8 | `app` | the composition root: the stores, the boundary, admission and the doors wired into a running sidecar, its listeners, upkeep, reload, admin endpoint and shutdown |
//! | 9 | `cli` | the command line: runs the sidecar, and talks to one as a client |
//!
//! Each type has one name: `config` assembles `settings` and re-exports none of it.
//!
//! One import goes up by design: executors take the boundary's sealed [`boundary::Permit`]
//! (`executor` -> `boundary::Permit`), so that only the chain can make what an executor runs.

/// Declares a fieldless enum together with `ALL`, every variant in declaration order, from the
/// one list of variants: a variant cannot be added without being listed (lists written beside
/// exhaustive matches drift; a decoder reading them would fail only at run time).
macro_rules! enum_with_all {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident { $($(#[$variant_meta:meta])* $variant:ident),+ $(,)? }
    ) => {
        $(#[$meta])*
        $vis enum $name { $($(#[$variant_meta])* $variant),+ }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
        }
    };
}

pub mod admission;
pub mod app;
pub mod approvals;
pub mod audit;
pub mod boundary;
pub mod budgets;
pub mod canonical;
pub mod catalog;
pub mod cli;
pub mod clock;
pub mod conditions;
pub mod config;
pub mod console;
pub mod credentials;
pub mod emergency;
pub mod error;
pub mod executor;
pub mod flow;
pub mod gcra;
pub mod identity;
pub mod limits;
pub mod mcp_door;
pub mod metrics;
pub mod openapi;
pub mod outbound;
pub mod outcome;
pub mod output_guard;
pub mod server;
pub mod settings;
pub mod shadow;
pub mod state;
pub mod tasks;
pub mod telemetry;
pub mod tls;

pub use app::{Running, StartError, StartOptions, run, start};

/// The unit tests' allocator: counts the allocations of the thread that makes them (tests run
/// on several threads), to show a path allocates nothing.
#[cfg(test)]
pub(crate) mod allocations {
    use std::{
        alloc::{GlobalAlloc, Layout, System},
        cell::Cell,
    };

    struct Counting;

    thread_local! {
        static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
    }

    #[expect(
        unsafe_code,
        reason = "a counting allocator, to show a path allocates nothing"
    )]
    // SAFETY: every call is passed on to the system allocator unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
            // SAFETY: the caller's contract is System's.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract is System's.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    /// How many allocations `f` made on this thread.
    pub(crate) fn allocations_in(f: impl FnOnce()) -> usize {
        let before = ALLOCATIONS.with(Cell::get);
        f();
        ALLOCATIONS.with(Cell::get) - before
    }
}

/// Generated `toolgate.v1` types, clients and servers.
pub mod proto {
    #![allow(
        missing_docs,
        clippy::all,
        clippy::allow_attributes,
        clippy::allow_attributes_without_reason,
        reason = "generated by tonic-prost-build"
    )]
    tonic::include_proto!("toolgate.v1");

    /// The encoded file descriptor set, served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/toolgate_descriptor.bin"));
}
