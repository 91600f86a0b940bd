//! The composition root: a running sidecar wired from its parts. [`start`] builds the stores,
//! the boundary, identity and admission, and the doors — gRPC (`crate::server`), MCP
//! (`crate::mcp_door`) and the admin endpoint (`admin.rs`) — binds every listener before
//! serving on any, and starts the upkeep (catalog updates and reload in `catalog_updates.rs`,
//! the shadow catalog, emergency denies, the rate-limit sweeper). [`Running::shutdown`] stops
//! them in order: no new calls, the running ones finished within the grace period, the audit
//! queue drained.

mod admin;
mod catalog_updates;

pub use catalog_updates::ReloadError;

use std::{future::Future, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use tokio::{
    net::TcpListener,
    sync::{mpsc, oneshot},
};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::{
    admission::{AdmissionLayer, connections, connections::Listener, refusals::Refusals},
    audit::{AuditLog, RefusedCallers},
    boundary::{Boundary, Stores},
    clock::SharedClock,
    config::Config,
    executor::{Executors, McpManager},
    identity::{IdentityHandle, IdentityResolver},
    metrics::Metrics,
    server::GrpcDoor,
    shadow::Shadow,
    tasks::Tasks,
};
use admin::AdminBinding;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot open the audit sink: {0}")]
    Audit(std::io::Error),
    #[error("cannot build the reflection service: {0}")]
    Reflection(String),
    #[error("cannot install a signal handler: {0}")]
    Signal(String),
    #[error("refusing to start: {0}")]
    Insecure(#[from] crate::identity::ListenerError),
    #[error("cannot set up the state backend: {0}")]
    State(crate::state::StateError),
    #[error("cannot set up identity: {0}")]
    Identity(String),
    #[error("cannot serve the approvals console: {0}")]
    Console(String),
}

/// Options that are not part of the catalog file.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Overrides `server.listen` (e.g. `127.0.0.1:0` in tests).
    pub listen: Option<SocketAddr>,
    /// The clock; the system clock by default.
    pub clock: Option<SharedClock>,
    /// Reload the catalog on SIGHUP (the binary does; in-process tests call `reload`).
    pub reload_on_sighup: bool,
    /// Overrides `server.admin_listen` (e.g. `127.0.0.1:0` in tests).
    pub admin_listen: Option<SocketAddr>,
    /// Makes the spans of calls (`TelemetryGuard::tracer`); none by default.
    pub tracer: crate::telemetry::spans::Tracer,
    /// Overrides `server.mcp.listen` (e.g. `127.0.0.1:0` in tests); the door is served only
    /// when `server.mcp` is configured.
    pub mcp_listen: Option<SocketAddr>,
    /// Overrides `server.console.listen`; the console is served only when `server.console` is
    /// configured.
    pub console_listen: Option<SocketAddr>,
}

/// A started server.
pub struct Running {
    local_addr: Option<SocketAddr>,
    /// The MCP door's address, when it is served.
    mcp_addr: Option<SocketAddr>,
    /// The approvals console's address, when it is served.
    console_addr: Option<SocketAddr>,
    unix_socket: Option<PathBuf>,
    boundary: Arc<Boundary>,
    /// Every task the server started, by what shutdown does with it.
    tasks: ServerTasks,
    grace: Duration,
    health: tonic_health::server::HealthReporter,
    reload: mpsc::Sender<catalog_updates::ReloadRequest>,
    admin: Option<AdminBinding>,
    /// The admission of RPCs (identity, caps on calls in flight); also what shutdown drains.
    in_flight: AdmissionLayer,
    /// The shadow candidate catalog and its queue.
    shadow: Arc<Shadow>,
    /// The MCP servers' connections, which shutdown closes.
    mcp: Arc<McpManager>,
    /// The audit log the boundary and the doors write to; shutdown drains it.
    audit: AuditLog,
    /// Dropped without [`Running::shutdown`], the server still stops its listeners and upkeep.
    _stop_on_drop: DropGuard,
}

/// The server's tasks, one group per step of shutdown.
struct ServerTasks {
    /// With Redis: the state backend's health check and its reporter, stopped first so that
    /// nothing reports SERVING once shutdown has begun.
    state_health: Tasks,
    /// Tells the gRPC listeners to stop accepting and close each connection once its calls are
    /// answered.
    close_listeners: CancellationToken,
    /// The gRPC listeners; stopping the group drops the connections still open.
    listeners: Tasks,
    /// Catalog updates, the shadow catalog's worker and loader, SIGHUP, the rate-limit sweeper
    /// and the admin endpoint.
    upkeep: Tasks,
    /// The audit writer, stopped last (once its queue is written). Not stopped by dropping the
    /// server: it ends by itself when its queue's senders (the boundary, the server's handles)
    /// go.
    audit: Tasks,
}

/// How long a group of tasks told to stop may take before shutdown goes on without them (they
/// stop at their next await, so only a task stuck in a blocking call can take this long).
const TASKS_STOP_WITHIN: Duration = Duration::from_secs(2);

/// How often expired emergency denies are taken out (they stop matching at their expiry
/// anyway; this is when the expiry is audited).
const EMERGENCY_EXPIRY_CHECK: Duration = Duration::from_secs(1);

impl Running {
    /// The TCP address actually bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The MCP door's address (Streamable HTTP), when `server.mcp` is configured.
    pub fn mcp_addr(&self) -> Option<SocketAddr> {
        self.mcp_addr
    }

    /// The approvals console's address, when it is served.
    pub fn console_addr(&self) -> Option<SocketAddr> {
        self.console_addr
    }

    /// The admin HTTP address (/metrics, /healthz, /readyz), when enabled.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|a| a.addr)
    }

    pub fn unix_socket(&self) -> Option<&PathBuf> {
        self.unix_socket.as_ref()
    }

    pub fn boundary(&self) -> &Arc<Boundary> {
        &self.boundary
    }

    /// The shadow candidate catalog (`shadow_catalog`) and what its loader did.
    pub fn shadow(&self) -> &Arc<Shadow> {
        &self.shadow
    }

    /// The backends calls on the served catalog run on (tests reach the builtins and the MCP
    /// servers through them).
    pub fn executors(&self) -> Executors {
        self.boundary.catalog().executors.clone()
    }

    /// The audit log (tests flush it before reading what was written).
    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// Re-reads the catalog file now; returns the new revision, or why the file was refused
    /// (the previous catalog then keeps serving).
    pub async fn reload(&self) -> Result<String, ReloadError> {
        request_reload(&self.reload).await
    }

    /// Stops accepting, waits up to the grace period for in-flight calls, then drains the audit
    /// queue. Calls still running after the grace period are cancelled (and audited as such).
    pub async fn shutdown(self) {
        let tasks = &self.tasks;
        // 1. Nothing may report SERVING again from here on.
        tasks.state_health.stop(TASKS_STOP_WITHIN).await;
        // 2. Refuse new calls, and say so: by the time /readyz says 503 every new call is refused.
        self.in_flight.start_draining();
        if let Some(admin) = &self.admin {
            admin
                .state
                .ready
                .store(false, std::sync::atomic::Ordering::Relaxed);
        }
        crate::server::set_not_serving(&self.health).await;
        // 3. Let the running calls finish: new ones are answered UNAVAILABLE on every connection,
        // old and new, meanwhile. (Closing the listeners first would send GOAWAY, and a client on
        // an open connection would see its next call CANCELLED.)
        let grace = self.grace;
        let drain_until = tokio::time::Instant::now() + grace;
        let _ = tokio::time::timeout_at(drain_until, self.in_flight.idle()).await;
        // 4. Close the listeners; each connection ends once its answers are sent.
        tasks.close_listeners.cancel();
        let closed = tokio::time::timeout_at(
            drain_until.max(tokio::time::Instant::now() + Duration::from_millis(100)),
            tasks.listeners.finished(),
        )
        .await
        .is_ok();
        // 5. Past the grace period: cancel the calls still running (each ends CANCELLED through
        // the boundary, so each is audited), then drop the connections left.
        if !closed {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                in_flight = self.boundary.in_flight(),
                "grace period over; cancelling calls still in flight"
            );
            self.boundary.stop_calls();
            if tokio::time::timeout(TASKS_STOP_WITHIN, self.boundary.calls_finished())
                .await
                .is_err()
            {
                tracing::error!(
                    in_flight = self.boundary.in_flight(),
                    "calls did not end when cancelled"
                );
            }
            tasks.listeners.stop(TASKS_STOP_WITHIN).await;
        }
        // 6. Upkeep and the admin endpoint, then the MCP servers' connections and processes.
        if !tasks.upkeep.stop(TASKS_STOP_WITHIN).await {
            tracing::warn!(
                running = tasks.upkeep.running(),
                "upkeep tasks did not stop in time"
            );
        }
        if !self.mcp.stopped(TASKS_STOP_WITHIN).await {
            tracing::warn!("MCP server connections did not close in time");
        }
        if let Some(path) = &self.unix_socket {
            let _ = std::fs::remove_file(path);
        }
        // 7. Every call has finished or been cancelled and queued its event: drain the queue. A
        // sink stuck for good must not hold the process forever.
        let audit = &self.audit;
        if tokio::time::timeout(grace, audit.flush()).await.is_err() {
            tracing::error!(
                unwritten = audit.queued(),
                "audit sink stuck: gave up draining the audit queue after the grace period"
            );
        }
        // 8. Stop the writer, which closes the sink (e.g. the audit file), before returning.
        if !tasks.audit.stop(TASKS_STOP_WITHIN).await {
            tracing::error!("the audit writer did not stop: its sink is stuck");
        }
    }
}

/// Starts serving `config`; returns once the listeners are bound and health says SERVING.
pub async fn start(config: Config, options: StartOptions) -> Result<Running, StartError> {
    if config.identity.dev_identity {
        // The first thing an operator reads: nothing below authenticates anyone.
        tracing::warn!(
            "dev identity is on: callers are NOT authenticated; x-toolgate-* metadata is trusted as is"
        );
    }
    if let Some(endpoint) = &config.telemetry.endpoint {
        tracing::info!(endpoint = %endpoint, service = %config.telemetry.service_name, "exporting traces over OTLP");
    }
    if let Some(addr) = options.listen.or(config.server.listen) {
        config.identity.check_listener(addr)?;
    }
    if let Some(addr) = options.mcp_listen {
        config.identity.check_listener(addr)?;
    }
    // Let mut: the MCP door's resource is settled once it is bound, and its approvals URL once
    // the console is.
    let mut config = config;
    let console = match &config.server.console {
        Some(console) => {
            if let Some(addr) = options.console_listen {
                check_console_listener(console, addr)?;
            }
            let bound = crate::console::bind(console, options.console_listen)
                .await
                .map_err(|source| StartError::Listen {
                    addr: options.console_listen.unwrap_or(console.listen).to_string(),
                    source,
                })?;
            // The MCP door sends people to the console's page of their approval, unless the
            // operator named another place.
            if let Some(mcp) = config.server.mcp.as_mut()
                && mcp.approvals_url.is_none()
            {
                mcp.approvals_url = Some(bound.approvals_url());
            }
            Some(bound)
        }
        None => None,
    };
    let mcp_door = match &config.server.mcp {
        Some(mcp) => {
            let bound = crate::mcp_door::bind(mcp, options.mcp_listen)
                .await
                .map_err(|source| StartError::Listen {
                    addr: options.mcp_listen.unwrap_or(mcp.listen).to_string(),
                    source,
                })?;
            config.identity.mcp_resource = Some(bound.resource.clone());
            Some(bound)
        }
        None => None,
    };
    let mcp_resource = config.identity.mcp_resource.clone();
    let clock = options.clock.unwrap_or_default();
    // Listeners and upkeep are stopped with the server, even when it is dropped; the audit
    // writer only by shutdown, once its queue is written.
    let root = Tasks::new();
    let tasks = ServerTasks {
        state_health: root.child(),
        close_listeners: root.token().child_token(),
        listeners: root.child(),
        upkeep: root.child(),
        audit: Tasks::new(),
    };
    let audit = AuditLog::start(&config.audit, &tasks.audit)
        .await
        .map_err(StartError::Audit)?;
    // Each concern registers its own families as it is built.
    let metrics = Arc::new(Metrics::new());
    let backend =
        crate::state::Backend::start(&config.state, &metrics).map_err(StartError::State)?;
    let stores = Stores::new(
        backend.clone(),
        &clock,
        config.approvals.budget,
        config.limits.idempotency_budget(),
    );
    let mcp = Arc::new(McpManager::start(&config.mcp_servers, &clock));
    let discovered = mcp.watch_discovered();
    let executors = Executors {
        mcp,
        http: Arc::new(crate::executor::HttpExecutor::with_clock(clock.clone())),
        ..Executors::default()
    }
    .with_upstreams(config.upstreams);
    let limits = config.limits.clone();
    let boundary = Arc::new(
        Boundary::new(
            config.catalog,
            config.limits.clone(),
            stores,
            executors.clone(),
            audit.clone(),
            clock.clone(),
            &metrics,
        )
        .with_tracer(options.tracer.clone()),
    );
    let resolver = IdentityResolver::new(
        &config.identity,
        clock.clone(),
        limits.token_cache_max_bytes,
        None,
    )
    .map_err(StartError::Identity)?;
    resolver.start_refreshing();
    let identity: IdentityHandle = Arc::new(ArcSwap::from_pointee(resolver));
    let refused = Arc::new(RefusedCallers::new(
        config.audit.authentication_failures,
        clock.clone(),
    ));
    let (reload, reload_requests) = mpsc::channel(8);
    let source = config.file.clone().map(|path| catalog_updates::Source {
        path,
        env: config.catalog_inputs.env.clone(),
        poll_interval: config.server.reload_interval,
        loaded: config.loaded.clone(),
    });
    let shadow_loader = crate::shadow::candidate::Loader {
        env: config.catalog_inputs.env.clone(),
        poll_interval: config.server.reload_interval,
        mcp_servers: config.catalog_inputs.mcp_servers.clone(),
        discovered: executors.mcp.watch_discovered(),
    };
    // Every TCP listener callers are identified on, as served.
    let listeners: Vec<SocketAddr> = options
        .listen
        .or(config.server.listen)
        .into_iter()
        .chain(mcp_door.as_ref().map(|bound| bound.addr))
        .collect();
    let restart_required = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The shadow candidate (`shadow_catalog`): told of every call, compared by its worker.
    let shadow = Shadow::observe(&boundary, &metrics);
    let upkeep = &tasks.upkeep;
    upkeep.spawn(
        "catalog-updates",
        catalog_updates::run(
            catalog_updates::Updater {
                boundary: boundary.clone(),
                metrics: catalog_updates::UpdateMetrics::register(&metrics),
                identity: identity.clone(),
                clock: clock.clone(),
                restart_required: restart_required.clone(),
                listeners,
                mcp_resource,
                console_client_id: config.identity.console_client_id.clone(),
                shadow: shadow.clone(),
            },
            config.catalog_inputs,
            source,
            discovered,
            reload_requests,
        ),
    );
    // Its loader and the worker comparing calls.
    shadow.configure(config.shadow_catalog.clone());
    upkeep.spawn(
        "shadow-worker",
        crate::shadow::run(
            boundary.clone(),
            shadow.clone(),
            crate::shadow::Recorder {
                audit: audit.clone(),
                clock: clock.clone(),
                max_identifier_bytes: limits.max_identifier_bytes,
            },
        ),
    );
    upkeep.spawn(
        "shadow-loader",
        crate::shadow::candidate::watch(shadow.clone(), shadow_loader),
    );
    if options.reload_on_sighup {
        upkeep.spawn("sighup-reload", reload_on_sighup(reload.clone())?);
    }
    let refusals = Arc::new(Refusals::new(&metrics));
    let in_flight = AdmissionLayer::new(
        &limits,
        audit.clone(),
        identity.clone(),
        refused.clone(),
        refusals.clone(),
    );
    let grpc = GrpcDoor::new(
        boundary.clone(),
        &limits,
        options.tracer.clone(),
        in_flight.clone(),
    )
    .await
    .map_err(|e| StartError::Reflection(e.to_string()))?;
    let health = grpc.health().clone();
    // With Redis: a health check every second, and its answers reported as gRPC health.
    if let Some(redis) = backend.redis() {
        tasks
            .state_health
            .spawn("state-health-check", redis.check_health());
        tasks.state_health.spawn(
            "state-health-report",
            crate::server::report_state_health(
                redis.watch_reachable(),
                health.clone(),
                config.state.unready_when_unavailable,
            ),
        );
    }

    let signal = || tasks.close_listeners.clone().cancelled_owned();
    // Bind every listener before serving on any, so a bad socket path fails the start cleanly.
    let tcp = match options.listen.or(config.server.listen) {
        Some(addr) => {
            let listen_error = |source| StartError::Listen {
                addr: addr.to_string(),
                source,
            };
            let listener = TcpListener::bind(addr).await.map_err(listen_error)?;
            let bound = listener.local_addr().map_err(listen_error)?;
            Some((listener, bound))
        }
        None => None,
    };
    let unix_socket = config.server.unix_socket.clone();
    let unix = match &unix_socket {
        Some(path) => {
            // A socket file left by a previous run would make bind fail.
            let _ = std::fs::remove_file(path);
            let listener =
                tokio::net::UnixListener::bind(path).map_err(|source| StartError::Listen {
                    addr: path.display().to_string(),
                    source,
                })?;
            Some(listener)
        }
        None => None,
    };
    // The shared emergency denies are read before any listener serves: a restarted sidecar
    // enforces them from its first call. A Redis that does not answer delays this by at most its
    // timeout; the denies read last (none, at start) are enforced then, and the follower reads
    // them again as soon as Redis answers.
    boundary.emergency_denies().reconcile().await;
    boundary.emergency_denies_changed();
    // The MCP door and the admin listener first: gRPC health (on the TCP listener) says SERVING
    // as soon as that listener serves, and by then every other listener serves and said so.
    let mcp_addr = match (&config.server.mcp, mcp_door) {
        (Some(door), Some(bound)) => {
            let addr = bound.addr;
            let parts = crate::mcp_door::Parts {
                boundary: boundary.clone(),
                admission: in_flight.clone(),
                connections: connections::Admission::new(Listener::Mcp, &limits, refusals.clone()),
                limits: limits.clone(),
                tracer: options.tracer.clone(),
                approval_ttl: config.approvals.budget.ttl,
            };
            crate::mcp_door::start(
                door,
                bound,
                parts,
                &tasks.listeners,
                tasks.close_listeners.clone(),
            );
            Some(addr)
        }
        _ => None,
    };
    let console_addr = match (&config.server.console, console) {
        (Some(settings), Some(bound)) => {
            let addr = bound.addr;
            let parts = crate::console::Parts {
                boundary: boundary.clone(),
                identity: identity.clone(),
                clock: clock.clone(),
                connections: connections::Admission::new(
                    Listener::Console,
                    &limits,
                    refusals.clone(),
                ),
                max_identity_bytes: limits.max_identity_bytes,
            };
            crate::console::start(
                settings,
                bound,
                parts,
                &tasks.listeners,
                tasks.close_listeners.clone(),
            )
            .map_err(StartError::Console)?;
            Some(addr)
        }
        _ => None,
    };
    let admin = AdminBinding::start(
        options.admin_listen.or(config.server.admin_listen),
        admin::Readings {
            boundary: boundary.clone(),
            metrics: metrics.clone(),
            audit: audit.clone(),
            tracer: options.tracer.clone(),
            backend: backend.clone(),
            identity: identity.clone(),
            refused: refused.clone(),
            restart_required: restart_required.clone(),
            state_required: config.state.unready_when_unavailable,
        },
        &tasks.upkeep,
    )
    .await?;
    let local_addr = tcp.as_ref().map(|(_, bound)| *bound);
    if let Some((listener, bound)) = tcp {
        let admission = connections::Admission::new(Listener::Tcp, &limits, refusals.clone());
        grpc.serve_tcp(listener, admission, signal(), &tasks.listeners);
        tracing::info!(addr = %bound, "serving gRPC over TCP");
    }
    if let (Some(listener), Some(path)) = (unix, &unix_socket) {
        let admission = connections::Admission::new(Listener::Unix, &limits, refusals.clone());
        grpc.serve_unix(listener, admission, signal(), &tasks.listeners);
        tracing::info!(path = %path.display(), "serving gRPC over a Unix socket");
    }
    // Emergency denies: the shared ones were read before any listener served; now followed,
    // expiries taken out and audited, and each change announced (what callers see changed) and
    // counted.
    let denies = boundary.emergency_denies().clone();
    tasks
        .upkeep
        .spawn_until_stopped("emergency-deny-follower", move |stop| denies.follow(stop));
    let upkeep_boundary = boundary.clone();
    tasks.upkeep.spawn("emergency-deny-upkeep", async move {
        let mut changes = upkeep_boundary.emergency_denies().watch();
        let mut expiry = tokio::time::interval(EMERGENCY_EXPIRY_CHECK);
        expiry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // The timer runs only while a deny can expire: an idle sidecar is not woken for nothing.
            let expiring = upkeep_boundary.emergency_denies().any_expiring();
            tokio::select! {
                _ = expiry.tick(), if expiring => upkeep_boundary.expire_emergency_denies().await,
                changed = changes.changed() => match changed {
                    Ok(()) => upkeep_boundary.emergency_denies_changed(),
                    Err(_) => return,
                },
            }
        }
    });
    // Shed rate-limit keys whose window has passed, so their stores stay small.
    let sweeper = boundary.clone();
    tasks.upkeep.spawn("rate-limit-sweeper", async move {
        let mut tick = tokio::time::interval(crate::limits::SWEEP_INTERVAL);
        loop {
            tick.tick().await;
            sweeper.catalog().rate_limits.retain_recent();
        }
    });
    tracing::info!(
        source = %config.source,
        revision = %boundary.catalog().catalog.revision(),
        tools = boundary.catalog().catalog.names().count(),
        "catalog loaded; SERVING"
    );
    Ok(Running {
        local_addr,
        mcp_addr,
        console_addr,
        unix_socket,
        boundary,
        tasks,
        grace: config.server.shutdown_grace,
        health,
        reload,
        admin,
        in_flight,
        shadow,
        mcp: executors.mcp,
        audit,
        _stop_on_drop: root.stop_on_drop(),
    })
}

async fn request_reload(
    reload: &mpsc::Sender<catalog_updates::ReloadRequest>,
) -> Result<String, ReloadError> {
    let (reply, outcome) = oneshot::channel();
    reload
        .send(reply)
        .await
        .map_err(|_| ReloadError::ShuttingDown)?;
    outcome.await.map_err(|_| ReloadError::ShuttingDown)?
}

/// Installs the SIGHUP handler now — an unhandled SIGHUP would terminate the process — and
/// returns the loop that reloads on each.
fn reload_on_sighup(
    reload: mpsc::Sender<catalog_updates::ReloadRequest>,
) -> Result<impl Future<Output = ()> + Send + 'static, StartError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups =
        signal(SignalKind::hangup()).map_err(|e| StartError::Signal(e.to_string()))?;
    Ok(async move {
        while hangups.recv().await.is_some() {
            match request_reload(&reload).await {
                Ok(revision) => tracing::info!(revision = %revision, "SIGHUP: catalog reloaded"),
                Err(err) => tracing::error!(error = %err, "SIGHUP: catalog reload refused"),
            }
        }
    })
}

/// Serves until `signal` completes, then shuts down gracefully.
pub async fn run(
    config: Config,
    options: StartOptions,
    signal: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let running = start(config, options).await?;
    signal.await;
    tracing::info!("shutting down: no new calls accepted, in-flight calls finishing");
    running.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// The console moved by `--console-listen` keeps its load-time rules: off loopback only with a
/// public URL (its cookies Secure), and never with the development sign-in.
fn check_console_listener(
    console: &crate::settings::ConsoleConfig,
    addr: SocketAddr,
) -> Result<(), StartError> {
    if crate::settings::is_loopback(addr.ip()) {
        return Ok(());
    }
    if matches!(console.sign_in, crate::settings::SignIn::Dev) {
        return Err(StartError::Console(format!(
            "{addr} is not a loopback address, and the development sign-in lets anyone who reaches it be anyone"
        )));
    }
    if console.public_url.is_none() {
        return Err(StartError::Console(format!(
            "{addr} is not a loopback address: set server.console.public_url (the https origin people open it at)"
        )));
    }
    Ok(())
}
