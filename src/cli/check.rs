//! `toolgate check`: load a catalog (and its shadow candidate) and report what is wrong with it,
//! including what cannot work on this machine unless `--portable`, and with `--connect` whether
//! the state backend answers.

use std::path::PathBuf;

use super::{Failure, load};
use crate::{config::Config, settings::Env};

/// What in a loaded catalog cannot work on this machine (missing programs, working
/// directories): not load errors, since a catalog may be checked elsewhere than it is served.
pub(super) fn host_problems(config: &Config) -> Vec<crate::settings::FieldError> {
    let tools = config
        .catalog
        .versions()
        .filter_map(|tool| match &tool.backend {
            crate::catalog::BackendSpec::Process(process) => Some(process.host_problems()),
            _ => None,
        })
        .flatten();
    let servers = config
        .mcp_servers
        .iter()
        .flat_map(|server| server.host_problems());
    tools.chain(servers).collect()
}

/// The MCP tools without a pin, by their place in the file.
fn unpinned(config: &Config) -> Vec<String> {
    config
        .catalog_inputs
        .raw
        .mcp_servers
        .iter()
        .flat_map(|(server, raw)| {
            raw.tools
                .iter()
                .filter(|(_, tool)| tool.pin.is_none())
                .map(move |(tool, _)| format!("mcp_servers.{server}.tools.{tool}.pin"))
        })
        .collect()
}

/// The conditions whose cost grows worse than linearly in the arguments, where each is and
/// what it says.
fn superlinear_conditions(config: &Config) -> Vec<(String, String)> {
    let catalog = &config.catalog;
    let lists = std::iter::once(&catalog.policy)
        .chain(catalog.tenants.values().map(|tenant| &tenant.access))
        .chain(catalog.agents.named.values())
        .chain(catalog.agents.default.iter());
    let rules = lists
        .flat_map(|list| list.deny.iter().chain(list.allow.iter().flatten()))
        .filter_map(|pattern| {
            Some((
                format!("{}.when", pattern.location),
                pattern.when.as_deref()?,
            ))
        });
    let tools = catalog.versions().flat_map(|tool| {
        [
            tool.quota_cost
                .as_deref()
                .map(|cost| (crate::boundary::quota_cost_location(tool), cost)),
            tool.approval_when
                .as_deref()
                .map(|when| (crate::boundary::approval_condition_location(tool), when)),
        ]
        .into_iter()
        .flatten()
    });
    rules
        .chain(tools)
        .filter(|(_, condition)| condition.grows_superlinearly())
        .map(|(location, condition)| (location, condition.source().to_owned()))
        .collect()
}

/// `check --connect`: whether the state backend answers.
async fn connect_state(config: &Config) -> Result<String, String> {
    let crate::settings::StateBackend::Redis(redis) = &config.state.backend else {
        return Ok("state backend: memory (nothing to connect to)".to_owned());
    };
    // Nothing renders them: the state's metrics are only what connecting takes.
    let metrics = crate::state::metrics::StateMetrics::register(&crate::metrics::Metrics::new());
    let shared = crate::state::Redis::connect(redis, &config.state, metrics)
        .map_err(|err| err.to_string())?;
    let started = std::time::Instant::now();
    shared
        .ping()
        .await
        .map_err(|err| format!("state backend {}: {err}", redis.url))?;
    Ok(format!(
        "state backend {}: ok (answered in {} ms)",
        redis.url,
        started.elapsed().as_millis()
    ))
}

/// Checks the catalog; exit 1 with every problem on stderr when it is not fit to serve.
pub(super) async fn check(
    config: Option<PathBuf>,
    portable: bool,
    connect: bool,
    strict_mcp: bool,
    spec_drift: bool,
) -> Result<(), Failure> {
    let loaded = load(config.as_ref()).map_err(Failure::error)?;
    if spec_drift {
        let drifted = drifted(&loaded);
        if !drifted.is_empty() {
            return Err(Failure::Errors(
                drifted
                    .iter()
                    .map(|line| format!("{}: {line}", loaded.source))
                    .collect(),
            ));
        }
    }
    if strict_mcp {
        let unpinned = unpinned(&loaded);
        if !unpinned.is_empty() {
            return Err(Failure::Errors(unpinned.iter().map(|path| format!("{}: {path}: not pinned (--strict-mcp requires a pin for every MCP tool; `toolgate pin --config {} --write` sets them)", loaded.source, loaded.source)).collect()));
        }
    }
    let problems = if portable {
        Vec::new()
    } else {
        host_problems(&loaded)
    };
    if !problems.is_empty() {
        return Err(Failure::Errors(
            problems
                .iter()
                .map(|problem| {
                    format!(
                        "{}: {}: {} (on this machine; --portable skips this check)",
                        loaded.source, problem.path, problem.message
                    )
                })
                .collect(),
        ));
    }
    if connect {
        let line = connect_state(&loaded)
            .await
            .map_err(|err| Failure::error(format_args!("{}: {err}", loaded.source)))?;
        println!("{line}");
    }
    println!(
        "{}: ok ({} tools, revision {})",
        loaded.source,
        loaded.catalog.versions().count(),
        loaded.catalog.revision()
    );
    for (location, source) in superlinear_conditions(&loaded) {
        eprintln!(
            "warning: {}: {location}: the condition {source:?} reads the arguments inside a comprehension over them, so what it costs grows with the product of their sizes; on large arguments its evaluation stops at {} steps and the call is refused (docs/conditions.md)",
            loaded.source,
            crate::conditions::MAX_EVALUATION_STEPS
        );
    }
    for tool in loaded.catalog.versions() {
        if let crate::catalog::BackendSpec::Http(target) = &tool.backend
            && tool.risk_level == crate::settings::RiskLevel::ReadOnly
            // (POST is the default, and RPC-style APIs read with it.)
            && matches!(
                target.request.method,
                http::Method::DELETE | http::Method::PUT | http::Method::PATCH
            )
        {
            eprintln!(
                "warning: {}: tool {} version {}: a {} request marked read_only: if it can change anything, raise its risk_level (read-only tools run without approval and are retried freely)",
                loaded.source, tool.name, tool.version, target.request.method
            );
        }
    }
    // The shadow candidate is checked too: served, a broken one is only refused (logged).
    if let Some(candidate) = &loaded.shadow_catalog {
        let shadow = Config::load_file(candidate, &Env::from_process())
            .map_err(|err| Failure::error(format_args!("shadow catalog: {err}")))?;
        println!(
            "{}: ok as the shadow catalog ({} tools)",
            shadow.source,
            shadow.catalog.versions().count()
        );
    }
    Ok(())
}

/// The imported entries (`openapi:`) whose operation no longer imports as it did when reviewed,
/// each with what changed; a description read once however many entries name it.
fn drifted(loaded: &Config) -> Vec<String> {
    let inputs = &loaded.catalog_inputs;
    let mut documents: std::collections::BTreeMap<String, Result<serde_json::Value, String>> =
        Default::default();
    let mut found = Vec::new();
    for (index, tool) in inputs.raw.tools.iter().enumerate() {
        let Some(source) = &tool.openapi else {
            continue;
        };
        let document = documents.entry(source.spec.clone()).or_insert_with(|| {
            let path = crate::settings::resolve_path(&inputs.base_dir, &source.spec);
            let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            if size > crate::openapi::MAX_SPEC_BYTES as u64 {
                return Err(format!(
                    "{} is over {} bytes",
                    path.display(),
                    crate::openapi::MAX_SPEC_BYTES
                ));
            }
            std::fs::read_to_string(&path)
                .map_err(|err| format!("cannot read {}: {err}", path.display()))
                .and_then(|text| crate::openapi::parse(&text).map_err(|err| err.to_string()))
        });
        let at = format!("tools[{index}] ({})", tool.name);
        match document {
            Err(why) => found.push(format!("{at}: {why}")),
            Ok(document) => match crate::openapi::operation_digest(document, &source.operation) {
                Ok(now) if now == source.sha256 => {}
                Ok(now) => found.push(format!(
                    "{at}: operation {} of {} changed since it was reviewed ({now}); import it again and review the difference",
                    source.operation, source.spec
                )),
                Err(why) => found.push(format!(
                    "{at}: operation {} of {}: {why}",
                    source.operation, source.spec
                )),
            },
        }
    }
    found
}
