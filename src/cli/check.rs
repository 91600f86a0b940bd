//! `toolgate check`: load a catalog (and its shadow candidate) and report what is wrong with it,
//! including what cannot work on this machine unless `--portable`, and with `--connect` whether
//! the state backend answers.

use std::{path::PathBuf, process::ExitCode};

use super::load;
use crate::config::{Config, Env};

/// What in a loaded catalog cannot work on this machine (missing programs, working
/// directories): not load errors, since a catalog may be checked elsewhere than it is served.
pub(super) fn host_problems(config: &Config) -> Vec<crate::config::FieldError> {
    let tools = config
        .catalog
        .versions()
        .filter_map(|tool| match &tool.executor {
            crate::executor::ExecutorSpec::Process(process) => Some(process.host_problems()),
            _ => None,
        })
        .flatten();
    let servers = config
        .catalog_inputs
        .mcp_servers
        .iter()
        .flat_map(|server| server.host_problems());
    tools.chain(servers).collect()
}

/// `check --connect`: whether the state backend answers.
async fn connect_state(config: &Config) -> Result<String, String> {
    let crate::config::StateBackend::Redis(redis) = &config.state.backend else {
        return Ok("state backend: memory (nothing to connect to)".to_owned());
    };
    let metrics = std::sync::Arc::new(crate::metrics::Metrics::new());
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
) -> anyhow::Result<ExitCode> {
    match load(config.as_ref()) {
        Ok(loaded) => {
            let problems = if portable {
                Vec::new()
            } else {
                host_problems(&loaded)
            };
            for problem in &problems {
                eprintln!(
                    "error: {}: {}: {} (on this machine; --portable skips this check)",
                    loaded.source, problem.path, problem.message
                );
            }
            if !problems.is_empty() {
                return Ok(ExitCode::FAILURE);
            }
            if connect {
                match connect_state(&loaded).await {
                    Ok(line) => println!("{line}"),
                    Err(err) => {
                        eprintln!("error: {}: {err}", loaded.source);
                        return Ok(ExitCode::FAILURE);
                    }
                }
            }
            println!(
                "{}: ok ({} tools, revision {})",
                loaded.source,
                loaded.catalog.versions().count(),
                loaded.catalog.revision()
            );
            // The shadow candidate is checked too: served, a broken one is only refused (logged).
            if let Some(candidate) = &loaded.shadow_catalog {
                match Config::load_file(candidate, &Env::from_process()) {
                    Ok(shadow) => println!(
                        "{}: ok as the shadow catalog ({} tools)",
                        shadow.source,
                        shadow.catalog.versions().count()
                    ),
                    Err(err) => {
                        eprintln!("error: shadow catalog: {err}");
                        return Ok(ExitCode::FAILURE);
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            eprintln!("error: {err}");
            Ok(ExitCode::FAILURE)
        }
    }
}
