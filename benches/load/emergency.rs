//! The emergency deny program (`emergency`): how long a deny set through one sidecar takes to
//! stop calls on another, their state in one `redis-server` (docs/emergency.md). Three binaries
//! with the bench catalog in Redis; each round sets a deny for echo through the first, then
//! calls echo on the third back to back until one is refused `emergency_denied`, then clears
//! the deny through the first and calls the third until echo runs again. Each time is taken
//! from the answer to the set (or clear) to the answer of the first call that shows it. Every
//! wait is bounded (2 s, and a number of calls).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tonic::{
    Request,
    metadata::{Ascii, MetadataValue},
    transport::Channel,
};
use toolgate::proto::{self, controls_client::ControlsClient, tool_gate_client::ToolGateClient};

use crate::{
    catalog::{admin_bearer, catalog_with_redis},
    load::{connect, runtime},
    options::Options,
    processes::{Binary, Spawned, load_average, start_redis},
    report::Spread,
    targets::EchoCall,
};

/// How long one wait may take, and how many calls it may send.
const WAIT_LIMIT: Duration = Duration::from_secs(2);
const MAX_CALLS_PER_WAIT: u64 = 200_000;

/// One round: from the set's answer to the first refusal on the third sidecar, and from the
/// clear's answer to its first OK, with the calls each took.
struct Round {
    stopped: Duration,
    stopped_calls: u64,
    lifted: Duration,
    lifted_calls: u64,
}

/// Runs the rounds and prints them with their medians.
pub fn emergency(options: &Options) -> anyhow::Result<bool> {
    let dir = tempfile::tempdir()?;
    let client_rt = runtime("bench-client", 2)?;
    let redis = start_redis()?;
    println!("load average at start: {}", load_average());
    let mut sidecars: Vec<Binary> = Vec::new();
    for name in ["a", "b", "c"] {
        let service = format!("toolgate-bench-emergency-{name}");
        let config = dir.path().join(format!("{service}.yaml"));
        let audit = dir.path().join(format!("audit-{name}.jsonl"));
        std::fs::write(&config, catalog_with_redis(&audit, &redis.url()))?;
        let spawned = Spawned::spawn(
            &options.binary,
            &config,
            dir.path(),
            &service,
            &[("OTEL_SDK_DISABLED", "true")],
        )?;
        sidecars.push(spawned.wait_serving(&client_rt)?.0);
    }
    let call = EchoCall::new(options.payload)?;
    let (first, third) = (sidecars[0].addr, sidecars[2].addr);
    let rounds = client_rt.block_on(async {
        let mut controls = ControlsClient::new(connect(first).await?);
        let mut calls = ToolGateClient::new(connect(third).await?);
        let admin = admin_bearer()?;
        let mut rounds = Vec::new();
        for _ in 0..options.rounds {
            let deny = controls
                .set_emergency_deny(authorized(
                    &admin,
                    proto::SetEmergencyDenyRequest {
                        tools: "echo".into(),
                        reason: "load harness: propagation".into(),
                        ttl_seconds: 600,
                        ..Default::default()
                    },
                ))
                .await?
                .into_inner()
                .deny
                .context("SetEmergencyDeny answered without the deny")?;
            let (stopped, stopped_calls) =
                until(&mut calls, &call, |r| r.error_type == "emergency_denied").await?;
            controls
                .clear_emergency_deny(authorized(
                    &admin,
                    proto::ClearEmergencyDenyRequest {
                        deny_id: deny.deny_id,
                    },
                ))
                .await?;
            let (lifted, lifted_calls) =
                until(&mut calls, &call, |r| r.status() == proto::ToolStatus::Ok).await?;
            rounds.push(Round {
                stopped,
                stopped_calls,
                lifted,
                lifted_calls,
            });
        }
        anyhow::Ok(rounds)
    });
    for sidecar in &mut sidecars {
        sidecar.stop()?;
    }
    let rounds = rounds?;
    println!(
        "\n| round | set → first refusal on the third sidecar (ms) | calls sent | clear → first OK there (ms) | calls sent |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    for (i, r) in rounds.iter().enumerate() {
        println!(
            "| {} | {:.2} | {} | {:.2} | {} |",
            i + 1,
            ms(r.stopped),
            r.stopped_calls,
            ms(r.lifted),
            r.lifted_calls
        );
    }
    let spread = |of: fn(&Round) -> Duration| {
        Spread::of(rounds.iter().map(|r| ms(of(r)))).map_or("—".into(), |s| s.show(2))
    };
    println!(
        "\nMedian (min–max) over {} rounds: a deny stops the third sidecar's calls in {} ms; a clear lets them run again in {} ms (the bound promised: 1 s)",
        rounds.len(),
        spread(|r| r.stopped),
        spread(|r| r.lifted)
    );
    // A wait the first call ended measured that call, not the propagation: an upper bound.
    let first_call = rounds.iter().filter(|r| r.stopped_calls == 1).count();
    if first_call > 0 {
        println!(
            "In {first_call} of {} rounds the first call after the answer was already refused: there the time is that one call's, an upper bound of the propagation.",
            rounds.len()
        );
    }
    println!("load average at end: {}", load_average());
    Ok(true)
}

/// `message` with the operator's token.
fn authorized<T>(admin: &MetadataValue<Ascii>, message: T) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", admin.clone());
    request
}

/// Calls echo back to back until an answer satisfies `done`: how long from now, and how many
/// calls.
async fn until(
    client: &mut ToolGateClient<Channel>,
    call: &EchoCall,
    done: impl Fn(&proto::ToolResult) -> bool,
) -> anyhow::Result<(Duration, u64)> {
    let start = Instant::now();
    let mut calls = 0;
    while start.elapsed() < WAIT_LIMIT && calls < MAX_CALLS_PER_WAIT {
        let mut request = Request::new(call.request.clone());
        request
            .metadata_mut()
            .insert("authorization", call.auth.clone());
        let result = client
            .execute_tool(request)
            .await?
            .into_inner()
            .result
            .context("ExecuteTool answered without a result")?;
        calls += 1;
        if done(&result) {
            return Ok((start.elapsed(), calls));
        }
    }
    bail!("not seen within {WAIT_LIMIT:?} ({calls} calls)")
}
