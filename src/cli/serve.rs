//! `toolgate serve` (also what `toolgate` with no verb does): load the catalog, start telemetry,
//! run the server until SIGTERM or SIGINT, flush pending spans.

use super::{Failure, ServeArgs, check::host_problems, load, signals, start_up_pages};
use crate::{
    app::{StartOptions, run},
    tasks::Tasks,
    telemetry,
};

/// How long after SERVING start-up's pages are let go (`start_up_pages`).
const START_UP_TAIL: std::time::Duration = std::time::Duration::from_secs(1);

/// Serves until a shutdown signal; exit 1 when the catalog does not load or the server fails.
pub(super) async fn serve(args: ServeArgs) -> Result<(), Failure> {
    // The config says where traces go, so it is read before logging starts; errors go to stderr.
    let config = load(args.config.as_ref()).map_err(Failure::error)?;
    signals::ignore_sigxfsz();
    let telemetry =
        telemetry::init(args.log_format, &config.telemetry).map_err(|err| Failure::caused(&err))?;
    // Served anyway: the other tools work, and these answer backend_misconfigured.
    for problem in host_problems(&config) {
        tracing::error!(at = %problem.path, problem = %problem.message, "this tool cannot run on this machine");
    }
    // Descendants of process tools and MCP servers that detach are re-parented to the sidecar
    // (as they would be to it as PID 1 in a container): collect the ones that exit.
    crate::executor::process::descendants::adopt_orphans();
    // The process's own task, stopped once the server (and every process it started) has.
    let reaper = Tasks::new();
    reaper.spawn(
        "orphan-reaper",
        crate::executor::process::descendants::collect_orphans(),
    );
    let options = StartOptions {
        listen: args.listen,
        clock: None,
        reload_on_sighup: true,
        admin_listen: args.admin_listen,
        tracer: telemetry.tracer(),
        mcp_listen: args.mcp_listen,
        console_listen: args.console_listen,
    };
    let signal = shutdown_signal();
    let serving = async move {
        // `run` polls this only once the server is SERVING; the tasks start-up spawned take their
        // first steps meanwhile (threads, first timers, the first catalog poll), so start-up's
        // pages are let go a little later, unless a shutdown comes first.
        tokio::pin!(signal);
        tokio::select! {
            () = &mut signal => return,
            () = tokio::time::sleep(START_UP_TAIL) => start_up_pages::release(),
        }
        signal.await
    };
    let result = run(config, options, serving).await;
    reaper.stop(std::time::Duration::from_secs(1)).await;
    // Pending spans are flushed before the process exits.
    telemetry.shutdown();
    result.map_err(|err| Failure::caused(&err))
}

/// Registers SIGTERM and SIGINT handlers now — before the server starts, so a signal that comes
/// right after start-up is never taken by the default action — and resolves on either.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        match handlers {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                // Without signal handlers, Ctrl-C is still caught.
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}
