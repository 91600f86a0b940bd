//! Keeps the served catalog current. One task owns what the catalog is built from and rebuilds it
//! when:
//! - MCP servers list (or change) their tools;
//! - the catalog file or a file it references (JWT keys, header values) changes — polled by
//!   content, so an in-place edit, a rename and Kubernetes' ConfigMap/Secret symlink swaps
//!   (`..data`) are all seen, and content that was refused is tried again as soon as any of those
//!   files changes (a Secret often arrives after the ConfigMap that names it);
//! - a reload is asked for (SIGHUP, or [`super::Running::reload`]).
//!
//! A valid new catalog replaces the old one without disturbing calls in flight (they finish on the
//! definition they started with); rate-limit state and concurrency caps carry over where
//! unchanged, and open approvals of tools whose definition changed become invalid. `identity`
//! changes apply too (key rotation, audiences): the new verifier starts with an empty token cache,
//! so no token verified under the old settings is trusted. Changes to sections that need a restart
//! (server, limits, audit, approvals, telemetry, mcp_servers) refuse the whole reload, loudly,
//! naming them, and set `toolgate_config_restart_required`: a success is never logged for a
//! change that did not take effect.
//!
//! The updater's own metrics ([`UpdateMetrics`]) count reloads by result, and the catalog file's
//! polls and parses; the served revision is the boundary's, which swaps it.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};
use tokio::sync::{mpsc, oneshot, watch};

use crate::identity::IdentityHandle;
use crate::{
    boundary::Boundary,
    catalog::{CatalogInputs, Discovered},
    clock::SharedClock,
    config::Config,
    executor::Upstream,
    identity::IdentityResolver,
    metrics::Metrics,
    settings::CatalogWatch,
    settings::{Env, Loaded, catalog_dir},
    shadow::Shadow,
};

/// A reload request and where to send its outcome: the new revision, or why it was refused.
pub type ReloadRequest = oneshot::Sender<Result<String, ReloadError>>;

/// Why a reload applied nothing; the previous catalog keeps serving.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("this sidecar serves the embedded demo catalog; there is no file to reload")]
    NoFile,
    #[error("cannot read {0}")]
    Unreadable(std::path::PathBuf),
    #[error(transparent)]
    Invalid(#[from] crate::settings::ConfigError),
    #[error("the file changes {0}, which take effect only on restart; nothing was applied")]
    RestartRequired(String),
    #[error(transparent)]
    InsecureListener(crate::identity::ListenerError),
    #[error("catalog rebuild failed")]
    RebuildFailed,
    #[error("reload task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// What the updater needs to re-read the catalog file.
pub struct Source {
    pub path: PathBuf,
    pub env: Env,
    pub poll_interval: Duration,
    /// What the served config was built from.
    pub loaded: Loaded,
}

/// What a reload changes besides the catalog.
pub struct Updater {
    pub boundary: Arc<Boundary>,
    /// Counts polls, parses and reload outcomes.
    pub metrics: UpdateMetrics,
    pub identity: IdentityHandle,
    pub clock: SharedClock,
    /// Set while the file holds changes that need a restart.
    pub restart_required: Arc<AtomicBool>,
    /// The MCP door's resource as it was settled at start (reloads keep it).
    pub mcp_resource: Option<String>,
    /// The console's client id as it started (a change takes a restart, like the console).
    pub console_client_id: Option<String>,
    /// The TCP addresses served where callers are identified (the gRPC listener's, the MCP
    /// door's as bound, overrides included), whose exposure dev identity must respect.
    pub listeners: Vec<SocketAddr>,
    /// The shadow candidate, re-read with each reload.
    pub shadow: Arc<Shadow>,
}

/// What the file watcher last saw and last served.
struct Watched {
    /// Fingerprint of the content last tried (served or refused).
    tried: [u8; 32],
    /// What the served config was built from.
    served: Loaded,
    /// What the last poll saw, so that an unchanged file is not read or parsed again.
    polls: CatalogWatch,
}

/// Runs until the server shuts down.
pub async fn run(
    updater: Updater,
    mut inputs: CatalogInputs,
    source: Option<Source>,
    mut discovered: watch::Receiver<Discovered>,
    mut requests: mpsc::Receiver<ReloadRequest>,
) {
    let mut watched = source.as_ref().map(|s| Watched {
        tried: s.loaded.fingerprint,
        served: s.loaded.clone(),
        polls: CatalogWatch::default(),
    });
    let poll_every = source
        .as_ref()
        .map_or(Duration::from_secs(3600), |s| s.poll_interval);
    let mut poll = tokio::time::interval(poll_every);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    poll.tick().await;
    let mut discoveries_open = true;
    loop {
        tokio::select! {
            changed = discovered.changed(), if discoveries_open => {
                if changed.is_err() {
                    discoveries_open = false;
                    continue;
                }
                let snapshot = discovered.borrow_and_update().clone();
                apply(&updater.boundary, &inputs, &snapshot, "MCP servers", None).await;
            }
            request = requests.recv() => {
                let Some(reply) = request else { return };
                let snapshot = discovered.borrow().clone();
                let outcome = match (&source, &mut watched) {
                    (Some(source), Some(watched)) => reload(&updater, &mut inputs, source, &snapshot, watched, true).await,
                    _ => Err(ReloadError::NoFile),
                };
                let _ = reply.send(outcome);
            }
            _ = poll.tick(), if source.is_some() => {
                if let (Some(source), Some(watched)) = (&source, &mut watched) {
                    let snapshot = discovered.borrow().clone();
                    let _ = reload(&updater, &mut inputs, source, &snapshot, watched, false).await;
                }
            }
        }
    }
}

/// Re-reads the file; unless forced, only when it or a file it references changed since the last
/// attempt.
async fn reload(
    updater: &Updater,
    inputs: &mut CatalogInputs,
    source: &Source,
    discovered: &Discovered,
    watched: &mut Watched,
    forced: bool,
) -> Result<String, ReloadError> {
    let boundary = &updater.boundary;
    let metrics = &updater.metrics;
    let path = source.path.clone();
    let env = source.env.clone();
    // Reading, parsing and compiling schemas is blocking work: keep it off the async workers.
    // A poll of an unchanged file reads only the small files it references (CatalogWatch).
    let mut polls = std::mem::take(&mut watched.polls);
    let loaded = tokio::task::spawn_blocking(move || {
        let now = polls.poll(&path, &catalog_dir(&path));
        (now, polls, move || Config::load_file(&path, &env))
    })
    .await?;
    let (now, polls, load) = loaded;
    watched.polls = polls;
    metrics.catalog_file_polled(now.is_some_and(|polled| polled.parsed));
    let Some(now) = now else {
        // Unreadable for now (mid-swap, or removed): keep serving, look again next time.
        return if forced {
            Err(ReloadError::Unreadable(source.path.clone()))
        } else {
            Ok(boundary.catalog().catalog.revision().to_owned())
        };
    };
    if !forced && now.fingerprint == watched.tried {
        return Ok(boundary.catalog().catalog.revision().to_owned());
    }
    watched.tried = now.fingerprint;
    metrics.catalog_file_parsed();
    let config = match tokio::task::spawn_blocking(load).await? {
        Ok(config) => config,
        Err(err) => {
            tracing::error!(error = %err, "catalog reload refused; the previous catalog keeps serving (the file and the files it references are watched for a fix)");
            metrics.reload("refused");
            return Err(err.into());
        }
    };
    // What was parsed, which may be newer than what was fingerprinted a moment ago.
    watched.tried = config.loaded.fingerprint;
    let restart = config.loaded.restart_changes(&watched.served);
    if !restart.is_empty() {
        let sections = restart.join(", ");
        tracing::error!(sections = %sections, "catalog reload refused: these sections changed and take effect only on restart; the previous catalog keeps serving");
        metrics.reload("restart_required");
        updater.restart_required.store(true, Ordering::Relaxed);
        return Err(ReloadError::RestartRequired(sections));
    }
    for &addr in &updater.listeners {
        config.identity.check_listener(addr).map_err(|err| {
            tracing::error!(error = %err, "catalog reload refused");
            metrics.reload("refused");
            ReloadError::InsecureListener(err)
        })?;
    }
    let Config {
        catalog,
        catalog_inputs: mut next,
        upstreams,
        mut identity,
        loaded,
        limits,
        shadow_catalog,
        ..
    } = config;
    // The catalog built at load is rebuilt below with live state carried over; let go of this
    // one first, so a large catalog is not held twice while the next is built.
    drop(catalog);
    // The MCP servers themselves were started with the process; keep their connection settings.
    next.mcp_servers = inputs.mcp_servers.clone();
    let revision = apply(boundary, &next, discovered, "catalog file", Some(upstreams)).await;
    let Some(revision) = revision else {
        metrics.reload("refused");
        return Err(ReloadError::RebuildFailed);
    };
    if loaded.identity_fingerprint != watched.served.identity_fingerprint {
        identity.mcp_resource = updater.mcp_resource.clone();
        identity.console_client_id = updater.console_client_id.clone();
        let previous = updater.identity.load_full();
        match IdentityResolver::new(
            &identity,
            updater.clock.clone(),
            limits.token_cache_max_bytes,
            Some(&previous),
        ) {
            Ok(resolver) => {
                resolver.start_refreshing();
                updater.identity.store(Arc::new(resolver));
                tracing::info!(
                    dev_identity = identity.dev_identity,
                    jwt = identity.jwt.is_some(),
                    "identity settings reloaded; tokens verified under the previous settings are verified again"
                );
            }
            Err(err) => {
                tracing::error!(error = %err, "identity settings not applied; the previous ones keep serving");
            }
        }
    }
    // The shadow candidate is read again too (its path may have changed).
    updater.shadow.configure(shadow_catalog);
    metrics.reload("ok");
    updater.restart_required.store(false, Ordering::Relaxed);
    watched.served = loaded;
    *inputs = next;
    Ok(revision)
}

/// Builds and swaps in a catalog, on `upstreams` when the file was read again (else on the
/// current ones); returns its revision.
async fn apply(
    boundary: &Boundary,
    inputs: &CatalogInputs,
    discovered: &Discovered,
    cause: &'static str,
    upstreams: Option<BTreeMap<String, Upstream>>,
) -> Option<String> {
    let previous = boundary.catalog();
    match inputs.build(discovered) {
        Ok(catalog) => {
            let revision = catalog.revision().to_owned();
            let invalidated = boundary.replace_catalog(catalog, upstreams).await;
            tracing::info!(cause, revision = %revision, previous = %previous.catalog.revision(), approvals_invalidated = invalidated, "catalog updated");
            Some(revision)
        }
        Err(err) => {
            tracing::error!(cause, path = %err.path, error = %err.message, "catalog rebuild failed; keeping the current one");
            None
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: String,
}

/// The catalog updater's metrics: `toolgate_catalog_reloads_total{result}`,
/// `toolgate_catalog_file_polls_total` and `toolgate_catalog_file_parses_total`.
pub struct UpdateMetrics {
    reloads: Family<ReloadLabels, Counter>,
    polls: Counter,
    parses: Counter,
}

impl UpdateMetrics {
    /// The updater's families, registered in `metrics`.
    pub fn register(metrics: &Metrics) -> Self {
        UpdateMetrics {
            reloads: metrics.registered(
                "catalog_reloads",
                "Catalog reloads by result (ok, refused, restart_required)",
            ),
            polls: metrics.registered(
                "catalog_file_polls",
                "Times the catalog file was looked at for changes",
            ),
            parses: metrics.registered(
                "catalog_file_parses",
                "Times the catalog file's text was parsed: when it was new or changed, and for each reload (an unchanged file is not parsed)",
            ),
        }
    }

    /// Records a reload attempt: `ok`, `refused` (invalid) or `restart_required`.
    fn reload(&self, result: &'static str) {
        self.reloads
            .get_or_create(&ReloadLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    /// The catalog file was looked at; `parsed` when its text was parsed.
    fn catalog_file_polled(&self, parsed: bool) {
        self.polls.inc();
        if parsed {
            self.parses.inc();
        }
    }

    /// The catalog file was parsed to be loaded.
    fn catalog_file_parsed(&self) {
        self.parses.inc();
    }
}
