//! What is measured, by name: the rows of the results table, the service name each exporting
//! server sends its spans under, the call every target is sent ([`EchoCall`]), the [`Target`] a
//! measurement sends its load to (and the [`Door`] it goes through), and the toolgate binaries of
//! the full run as the named fields of [`Binaries`]. A row is bound to its process by name, never
//! by a position in a list.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::Context;

use tonic::metadata::{Ascii, MetadataValue};
use toolgate::proto;

use crate::{
    catalog::{
        bearer, candidate_catalog, catalog, catalog_with_mcp, catalog_with_redis,
        catalog_with_shadow, catalog_without_audit, mcp_bearer,
    },
    load::{CALL_TIMEOUT, execute_request},
    mcp::{self, Revision},
    processes::{BareProcess, Binary, Spawned},
};

/// The rows of the results table.
pub const BARE: &str = "bare echo, in-process";
pub const TOOLGATE: &str = "toolgate, in-process";
pub const BARE_PROCESS: &str = "bare echo, own process";
pub const BINARY: &str = "toolgate binary, own process";
/// The binary again, each call with a JWT it has never seen (no verified-token cache hits).
pub const BINARY_FRESH_JWT: &str = "toolgate binary, a new JWT per call";
/// Switch-off variants, for the CPU split: span export off, then audit off too.
pub const BINARY_NO_EXPORT: &str = "toolgate binary, span export off";
pub const BINARY_NO_AUDIT: &str = "toolgate binary, span export and audit off";
/// The binary with a shadow catalog: every call also explained against a candidate that decides
/// the bench's calls alike (so it costs the explanation, not audit events for differences).
pub const BINARY_SHADOW: &str = "toolgate binary, shadow catalog";
/// The binary sampling 10 % of new traces (`parentbased_traceidratio`), as a production pod
/// exporting to a shared collector would.
pub const BINARY_SAMPLED: &str = "toolgate binary, 10 % of traces sampled";
/// The binary with `state: { backend: redis }`: both quotas of each call in one Lua script.
pub const BINARY_REDIS: &str = "toolgate binary + Redis, own process";
/// The doors compared: binaries with one catalog, the bench catalog with the MCP door on
/// (`catalog_with_mcp`), each its own process, one called over gRPC and the others over MCP.
pub const DOOR_GRPC: &str = "MCP door on: ExecuteTool over gRPC";
pub const DOOR_MCP: &str = "MCP door on: tools/call over MCP 2025-11-25";
/// The newer revision: the client's context in every request's `_meta`, two more headers.
pub const DOOR_MCP_MODERN: &str = "MCP door on: tools/call over MCP 2026-07-28";

/// OTEL_SERVICE_NAME of each exporting server, so the collector can count spans per target.
pub const SERVICE_IN_PROCESS: &str = "toolgate-bench-in-process";
const SERVICE_BINARY: &str = "toolgate-bench-binary";
const SERVICE_FRESH_JWT: &str = "toolgate-bench-fresh-jwt";
const SERVICE_SHADOW: &str = "toolgate-bench-shadow";
const SERVICE_REDIS: &str = "toolgate-bench-redis";
const SERVICE_SAMPLED: &str = "toolgate-bench-sampled";
pub const SERVICE_DOOR_GRPC: &str = "toolgate-bench-door-grpc";
pub const SERVICE_DOOR_MCP: &str = "toolgate-bench-door-mcp";
pub const SERVICE_DOOR_MCP_MODERN: &str = "toolgate-bench-door-mcp-modern";

/// The rows whose spans the report counts, with the service each exports under.
pub const EXPORTING: [(&str, &str); 8] = [
    (TOOLGATE, SERVICE_IN_PROCESS),
    (BINARY, SERVICE_BINARY),
    (BINARY_FRESH_JWT, SERVICE_FRESH_JWT),
    (BINARY_REDIS, SERVICE_REDIS),
    (BINARY_SAMPLED, SERVICE_SAMPLED),
    (DOOR_GRPC, SERVICE_DOOR_GRPC),
    (DOOR_MCP, SERVICE_DOOR_MCP),
    (DOOR_MCP_MODERN, SERVICE_DOOR_MCP_MODERN),
];

/// The `echo` call every target of the full run and the A/B mode is sent, and what each kind of
/// server answers it.
pub struct EchoCall {
    pub request: proto::ExecuteToolRequest,
    pub auth: MetadataValue<Ascii>,
    /// The same caller's `authorization` for the MCP door (its token names the door's resource).
    pub mcp_auth: String,
    /// What toolgate answers: the text.
    pub text: String,
    /// What the bare echo answers: the arguments, as JSON.
    pub arguments_json: String,
}

impl EchoCall {
    /// A call echoing `payload` bytes of text, with a token every call shares.
    pub fn new(payload: usize) -> anyhow::Result<Self> {
        let text = "x".repeat(payload);
        let arguments_json = serde_json::json!({ "text": text }).to_string();
        Ok(EchoCall {
            request: execute_request("echo", arguments_json.clone(), "run-bench"),
            auth: bearer(None)?,
            mcp_auth: mcp_bearer()?,
            text,
            arguments_json,
        })
    }
}

/// Which door of the server a target's calls go through, with what they send.
#[derive(Clone)]
pub enum Door {
    /// ExecuteTool over gRPC.
    Grpc {
        request: Box<proto::ExecuteToolRequest>,
        auth: MetadataValue<Ascii>,
    },
    /// `tools/call` over MCP's Streamable HTTP.
    Mcp(Arc<mcp::Call>),
}

/// What the load is sent to, and what a correct answer looks like.
#[derive(Clone)]
pub struct Target {
    pub name: &'static str,
    pub addr: SocketAddr,
    pub door: Door,
    pub expected_output: String,
    /// Each call's deadline.
    pub timeout: Duration,
    /// The server's process, when it runs apart from the harness: its CPU time is measured.
    pub server_pid: Option<u32>,
    /// Sign a new token for every call (the client pays for signing it: a few µs of its CPU).
    pub fresh_tokens: bool,
    /// The state backend's process (Redis), whose CPU time is measured too.
    pub state_pid: Option<u32>,
    /// Measured at the fixed rates too, not only at max rate.
    pub fixed_rates: bool,
}

impl Target {
    /// `request` sent to `addr`, answered with `expected_output`; measured at every rate.
    pub fn new(
        name: &'static str,
        addr: SocketAddr,
        request: &proto::ExecuteToolRequest,
        auth: &MetadataValue<Ascii>,
        expected_output: &str,
    ) -> Self {
        Target {
            name,
            addr,
            door: Door::Grpc {
                request: Box::new(request.clone()),
                auth: auth.clone(),
            },
            expected_output: expected_output.to_owned(),
            timeout: CALL_TIMEOUT,
            server_pid: None,
            fresh_tokens: false,
            state_pid: None,
            fixed_rates: true,
        }
    }

    /// A toolgate at `addr`, sent `call`: it answers with the text.
    pub fn toolgate(name: &'static str, addr: SocketAddr, call: &EchoCall) -> Self {
        Target::new(name, addr, &call.request, &call.auth, &call.text)
    }

    /// A toolgate binary, sent `call`, with its process's CPU time measured.
    pub fn binary(name: &'static str, binary: &Binary, call: &EchoCall) -> Self {
        Target {
            server_pid: Some(binary.pid()),
            ..Target::toolgate(name, binary.addr, call)
        }
    }

    /// The bare echo at `addr`, sent `call`: it answers with the arguments.
    fn bare(name: &'static str, addr: SocketAddr, call: &EchoCall) -> Self {
        Target::new(name, addr, &call.request, &call.auth, &call.arguments_json)
    }

    /// The bare echo as its own process, with its CPU time measured.
    pub fn bare_process(bare: &BareProcess, call: &EchoCall) -> Self {
        Target {
            server_pid: Some(bare.pid()),
            ..Target::bare(BARE_PROCESS, bare.addr, call)
        }
    }

    /// A toolgate binary's MCP door, sent `call` as a `tools/call` under `revision`, with its
    /// process's CPU time measured.
    pub fn mcp(
        name: &'static str,
        binary: &Binary,
        call: &EchoCall,
        revision: Revision,
    ) -> anyhow::Result<Self> {
        let addr = binary
            .mcp
            .with_context(|| format!("{name}: the binary said nothing of its MCP listener"))?;
        Ok(Target {
            addr,
            door: Door::Mcp(Arc::new(mcp::Call::echo(
                revision,
                &call.text,
                &call.mcp_auth,
            )?)),
            ..Target::binary(name, binary, call)
        })
    }
}

/// The doors compared, in the order a round measures them: the gRPC door, then the MCP door
/// under each revision (the newer one at max rate only), each of its own binary.
pub fn of_doors(call: &EchoCall, doors: &Doors<Binary>) -> anyhow::Result<Vec<Target>> {
    Ok(vec![
        Target::binary(DOOR_GRPC, &doors.grpc, call),
        Target::mcp(DOOR_MCP, &doors.mcp, call, Revision::V2025_11_25)?,
        Target {
            fixed_rates: false,
            ..Target::mcp(
                DOOR_MCP_MODERN,
                &doors.mcp_modern,
                call,
                Revision::V2026_07_28,
            )?
        },
    ])
}

/// The binaries the doors are compared on: each its own process with the same catalog (the
/// bench catalog with the MCP door on, its own audit file) and its own service name.
pub struct Doors<T> {
    /// Called over gRPC.
    pub grpc: T,
    /// Called over MCP, 2025-11-25.
    pub mcp: T,
    /// Called over MCP, 2026-07-28.
    pub mcp_modern: T,
}

impl Doors<Spawned> {
    /// Writes each binary's catalog into `dir` and starts them, none yet waited for; `envs` are
    /// added to each one's environment.
    pub fn spawn(exe: &Path, dir: &Path, envs: &[(&str, &str)]) -> anyhow::Result<Self> {
        let spawn = |service: &str| -> anyhow::Result<Spawned> {
            let config = dir.join(format!("{service}.yaml"));
            let audit = dir.join(format!("audit-{service}.jsonl"));
            std::fs::write(&config, catalog_with_mcp(&audit))?;
            Spawned::spawn(exe, &config, dir, service, envs)
        };
        Ok(Doors {
            grpc: spawn(SERVICE_DOOR_GRPC)?,
            mcp: spawn(SERVICE_DOOR_MCP)?,
            mcp_modern: spawn(SERVICE_DOOR_MCP_MODERN)?,
        })
    }
}

impl<T> Doors<T> {
    /// Each binary through `f`, in field order; on an error the rest are dropped (and a child
    /// process with them, killed).
    pub fn try_map<U>(self, mut f: impl FnMut(T) -> anyhow::Result<U>) -> anyhow::Result<Doors<U>> {
        Ok(Doors {
            grpc: f(self.grpc)?,
            mcp: f(self.mcp)?,
            mcp_modern: f(self.mcp_modern)?,
        })
    }

    /// Every binary, in field order, to change.
    pub fn each_mut(&mut self) -> [&mut T; 3] {
        [&mut self.grpc, &mut self.mcp, &mut self.mcp_modern]
    }

    /// Every binary, in field order.
    pub fn each(&self) -> [&T; 3] {
        [&self.grpc, &self.mcp, &self.mcp_modern]
    }
}

/// Every target of the full run, in the order each round measures them: the two in-process
/// servers, the bare echo process, and each of `binaries` (`redis_pid`: the Redis row's state),
/// the doors last.
pub fn of_run(
    call: &EchoCall,
    bare: SocketAddr,
    toolgate: SocketAddr,
    bare_process: &BareProcess,
    binaries: &Binaries<Binary>,
    redis_pid: Option<u32>,
) -> anyhow::Result<Vec<Target>> {
    let binary = |name, binary| Target::binary(name, binary, call);
    // The switch-off variants and the shadow catalog only give max rate and CPU per call (the
    // shadow's against the binary without).
    let max_rate_only = |target: Target| Target {
        fixed_rates: false,
        ..target
    };
    let mut targets = vec![
        Target::bare(BARE, bare, call),
        Target::toolgate(TOOLGATE, toolgate, call),
        Target::bare_process(bare_process, call),
        binary(BINARY, &binaries.plain),
        Target {
            fresh_tokens: true,
            ..binary(BINARY_FRESH_JWT, &binaries.fresh_jwt)
        },
        max_rate_only(binary(BINARY_NO_EXPORT, &binaries.no_export)),
        max_rate_only(binary(BINARY_NO_AUDIT, &binaries.no_audit)),
        Target {
            state_pid: redis_pid,
            ..binary(BINARY_REDIS, &binaries.redis)
        },
        max_rate_only(binary(BINARY_SHADOW, &binaries.shadow)),
        binary(BINARY_SAMPLED, &binaries.sampled),
    ];
    targets.extend(of_doors(call, &binaries.doors)?);
    Ok(targets)
}

/// The toolgate binaries of the full run, each its own process with its own catalog file and
/// service name; `T` is what is known of them (spawned, then serving).
pub struct Binaries<T> {
    /// The bench catalog, everything on.
    pub plain: T,
    /// The same; the targets send it a new JWT per call.
    pub fresh_jwt: T,
    /// Span export off (`OTEL_SDK_DISABLED`).
    pub no_export: T,
    /// Span export off and `audit: { sink: none }`.
    pub no_audit: T,
    /// Its state (both quotas of each call) in the harness's `redis-server`.
    pub redis: T,
    /// With a shadow candidate that decides the bench's calls alike.
    pub shadow: T,
    /// Sampling 10 % of new traces.
    pub sampled: T,
    /// The doors compared.
    pub doors: Doors<T>,
}

impl Binaries<Spawned> {
    /// Writes each binary's catalog into `dir` and starts them all, none yet waited for, so
    /// they start side by side; the Redis one keeps its state at `redis_url`.
    pub fn spawn(exe: &Path, dir: &Path, redis_url: &str) -> anyhow::Result<Self> {
        let write = |name: &str, yaml: String| -> anyhow::Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, yaml)?;
            Ok(path)
        };
        let audit = |name: &str| dir.join(name);
        let spawn = |config: PathBuf, service: &str, envs: &[(&str, &str)]| {
            Spawned::spawn(exe, &config, dir, service, envs)
        };
        let export_off = [("OTEL_SDK_DISABLED", "true")];
        let plain = write("bench.yaml", catalog(&audit("audit-binary.jsonl")))?;
        Ok(Binaries {
            plain: spawn(plain, SERVICE_BINARY, &[])?,
            fresh_jwt: spawn(
                write("bench-fresh.yaml", catalog(&audit("audit-fresh.jsonl")))?,
                SERVICE_FRESH_JWT,
                &[],
            )?,
            no_export: spawn(
                write(
                    "bench-no-export.yaml",
                    catalog(&audit("audit-no-export.jsonl")),
                )?,
                "toolgate-bench-no-export",
                &export_off,
            )?,
            no_audit: spawn(
                write("bench-no-audit.yaml", catalog_without_audit())?,
                "toolgate-bench-no-audit",
                &export_off,
            )?,
            redis: spawn(
                write(
                    "bench-redis.yaml",
                    catalog_with_redis(&audit("audit-redis.jsonl"), redis_url),
                )?,
                SERVICE_REDIS,
                &[],
            )?,
            shadow: {
                let candidate = write(
                    "bench-candidate.yaml",
                    candidate_catalog(&audit("audit-candidate.jsonl")),
                )?;
                spawn(
                    write(
                        "bench-shadow.yaml",
                        catalog_with_shadow(&audit("audit-shadow.jsonl"), &candidate),
                    )?,
                    SERVICE_SHADOW,
                    // Its admin listener gives the shadow worker's counters.
                    &[("TOOLGATE_ADMIN_LISTEN", "127.0.0.1:0")],
                )?
            },
            sampled: spawn(
                write("bench-sampled.yaml", catalog(&audit("audit-sampled.jsonl")))?,
                SERVICE_SAMPLED,
                &[
                    ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "0.1"),
                ],
            )?,
            doors: Doors::spawn(exe, dir, &[])?,
        })
    }
}

impl<T> Binaries<T> {
    /// Each binary through `f`, in field order; on an error the rest are dropped (and a child
    /// process with them, killed).
    pub fn try_map<U>(
        self,
        mut f: impl FnMut(T) -> anyhow::Result<U>,
    ) -> anyhow::Result<Binaries<U>> {
        Ok(Binaries {
            plain: f(self.plain)?,
            fresh_jwt: f(self.fresh_jwt)?,
            no_export: f(self.no_export)?,
            no_audit: f(self.no_audit)?,
            redis: f(self.redis)?,
            shadow: f(self.shadow)?,
            sampled: f(self.sampled)?,
            doors: self.doors.try_map(&mut f)?,
        })
    }

    /// Every binary, in field order.
    pub fn each(&self) -> Vec<&T> {
        let mut each = vec![
            &self.plain,
            &self.fresh_jwt,
            &self.no_export,
            &self.no_audit,
            &self.redis,
            &self.shadow,
            &self.sampled,
        ];
        each.extend(self.doors.each());
        each
    }

    /// Every binary, in field order, to change.
    pub fn each_mut(&mut self) -> Vec<&mut T> {
        let mut each = vec![
            &mut self.plain,
            &mut self.fresh_jwt,
            &mut self.no_export,
            &mut self.no_audit,
            &mut self.redis,
            &mut self.shadow,
            &mut self.sampled,
        ];
        each.extend(self.doors.each_mut());
        each
    }
}
