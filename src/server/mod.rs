//! The gRPC door: tonic services that only convert between proto and domain types and call the
//! boundary (`services.rs`, `convert.rs`), the standard health and reflection services, and
//! the transport stack they are served behind on TCP and Unix-socket listeners. What the door
//! serves, and when it stops, is wired by the composition root (`crate::app`).

pub mod convert;
mod deadline;
pub mod explain;
mod joined_writes;
mod services;

pub use joined_writes::JoinedWrites;

use std::{future::Future, sync::Arc, time::Duration};

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::service::Routes;
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{
    admission::{AdmissionLayer, connections},
    boundary::Boundary,
    proto::{
        self, approvals_server::ApprovalsServer, controls_server::ControlsServer,
        tool_gate_server::ToolGateServer,
    },
    settings::LimitsConfig,
    tasks::Tasks,
    telemetry::spans::{TraceContextLayer, Tracer},
};
use deadline::DeadlineLayer;
use services::{ApprovalsService, ControlsService, ToolGateService};

/// The gRPC door, built: the ToolGate, Approvals and Controls services, health and reflection,
/// behind the transport layers, ready to serve on any number of listeners.
pub struct GrpcDoor {
    routes: Routes,
    health: HealthReporter,
    max_streams_per_connection: u32,
    admission: AdmissionLayer,
}

impl GrpcDoor {
    /// Builds the services and says SERVING for each (no listener serves yet).
    pub async fn new(
        boundary: Arc<Boundary>,
        limits: &LimitsConfig,
        tracer: Tracer,
        admission: AdmissionLayer,
    ) -> Result<Self, tonic_reflection::server::Error> {
        let gate = services::Gate { boundary };
        // Every service gets explicit message limits both ways: nothing it sends or accepts can
        // be larger than the configured message size.
        let max_message = limits.max_message_bytes;
        let toolgate =
            ToolGateServer::new(ToolGateService::new(gate.clone(), limits.clone(), tracer))
                .max_decoding_message_size(max_message)
                .max_encoding_message_size(max_message);
        let approvals = ApprovalsServer::new(ApprovalsService::new(gate.clone()))
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
        let controls = ControlsServer::new(ControlsService::new(gate))
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
        let (health, health_service) = tonic_health::server::health_reporter();
        let health_service = health_service
            .max_decoding_message_size(64 * 1024)
            .max_encoding_message_size(64 * 1024);
        health
            .set_serving::<ToolGateServer<ToolGateService>>()
            .await;
        health
            .set_serving::<ApprovalsServer<ApprovalsService>>()
            .await;
        health
            .set_serving::<ControlsServer<ControlsService>>()
            .await;
        health.set_service_status("", ServingStatus::Serving).await;
        health
            .set_service_status(STATE_HEALTH_SERVICE, ServingStatus::Serving)
            .await;
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
        let routes = Routes::new(toolgate)
            .add_service(approvals)
            .add_service(controls)
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha);
        Ok(GrpcDoor {
            routes,
            health,
            max_streams_per_connection: limits.max_streams_per_connection,
            admission,
        })
    }

    /// The gRPC health the door reports.
    pub fn health(&self) -> &HealthReporter {
        &self.health
    }

    /// Serves on `listener` as the task `grpc-tcp` of `tasks` until `stop` completes; each
    /// connection is admitted by `connections`.
    pub fn serve_tcp(
        &self,
        listener: TcpListener,
        connections: connections::Admission,
        stop: impl Future<Output = ()> + Send + 'static,
        tasks: &Tasks,
    ) {
        let server = self
            .builder()
            .add_routes(self.routes.clone())
            .serve_with_incoming_shutdown(
                // Serving an incoming stream bypasses the builder's tcp_nodelay; without it every
                // small response waits for a delayed ACK (~40 ms).
                connections.each(
                    JoinedWrites::each(
                        tonic::transport::server::TcpIncoming::from(listener)
                            .with_nodelay(Some(true)),
                    ),
                    |io| io.get_ref().peer_addr().ok(),
                ),
                stop,
            );
        tasks.spawn("grpc-tcp", log_end(server));
    }

    /// Serves on the Unix socket `listener` as the task `grpc-unix`, as [`GrpcDoor::serve_tcp`].
    pub fn serve_unix(
        &self,
        listener: UnixListener,
        connections: connections::Admission,
        stop: impl Future<Output = ()> + Send + 'static,
        tasks: &Tasks,
    ) {
        let server = self
            .builder()
            .add_routes(self.routes.clone())
            .serve_with_incoming_shutdown(
                connections.each(
                    JoinedWrites::each(UnixListenerStream::new(listener)),
                    |_| None,
                ),
                stop,
            );
        tasks.spawn("grpc-unix", log_end(server));
    }

    /// The transport stack. Layers are transport concerns only, in this order: admission first
    /// (identity from the headers, then the caps on calls in flight: overload and unknown
    /// callers are refused before any work), then the caller's trace context and deadline. Each
    /// connection may open only so many streams.
    fn builder(&self) -> LayeredServer {
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .tcp_nodelay(true)
            .max_concurrent_streams(Some(self.max_streams_per_connection))
            .layer(self.admission.clone())
            .layer(TraceContextLayer)
            .layer(DeadlineLayer)
    }
}

/// Says NOT_SERVING for every service and the whole server: shutdown has begun.
pub async fn set_not_serving(health: &HealthReporter) {
    for service in SERVICES {
        health
            .set_service_status(service, ServingStatus::NotServing)
            .await;
    }
}

/// The gRPC services whose health is reported by name (and `""`, the whole server).
const SERVICES: [&str; 4] = [
    "",
    "toolgate.v1.ToolGate",
    "toolgate.v1.Approvals",
    "toolgate.v1.Controls",
];

/// The gRPC health service name whose status says whether the state backend answers.
pub const STATE_HEALTH_SERVICE: &str = "toolgate.state";

/// Reports the state backend's reachability as the gRPC health of [`STATE_HEALTH_SERVICE`] and,
/// when it must be reachable to serve, of the whole server.
pub async fn report_state_health(
    mut reachable: watch::Receiver<bool>,
    health: HealthReporter,
    required: bool,
) {
    loop {
        let status = match *reachable.borrow_and_update() {
            true => ServingStatus::Serving,
            false => ServingStatus::NotServing,
        };
        health
            .set_service_status(STATE_HEALTH_SERVICE, status)
            .await;
        if required {
            for service in SERVICES {
                health.set_service_status(service, status).await;
            }
        }
        if reachable.changed().await.is_err() {
            return;
        }
    }
}

/// A listener's serving loop, its error logged when it ends with one.
async fn log_end(server: impl Future<Output = Result<(), tonic::transport::Error>>) {
    if let Err(err) = server.await {
        tracing::error!(error = %err, "gRPC listener ended with an error");
    }
}

/// The server with its transport layers.
type LayeredServer = tonic::transport::server::Server<
    tower::layer::util::Stack<
        DeadlineLayer,
        tower::layer::util::Stack<
            TraceContextLayer,
            tower::layer::util::Stack<AdmissionLayer, tower::layer::util::Identity>,
        >,
    >,
>;
