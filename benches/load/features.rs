//! The features program (`features`): what each capability added in this round of work costs a
//! call, as the same binary with and without it, interleaved round by round the way `ab` does
//! it: run-level flow rules (state in memory, then in Redis), ten conditional access rules, the
//! output guard on 4 KiB outputs, and a per-call credential (a token exchange, cached) against a
//! static header on the same HTTP tool. The MCP door has its own program (`doors`). Prints, per
//! feature, each round and the medians with `with / without` taken per round.

use std::{
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use axum::{Router, body::Bytes, routing::post};

use crate::{
    ab::{Side, interleave, print_each_round, print_medians},
    catalog::{
        catalog, catalog_with_conditions, catalog_with_flow, catalog_with_redis,
        catalog_without_output_guard,
    },
    load::runtime,
    options::Options,
    otlp_collector,
    processes::{load_average, reserve_collector, start_redis},
    targets::EchoCall,
};

const WITHOUT: &str = "without";
const WITH: &str = "with";

/// One capability priced.
struct Feature {
    /// Heads its tables.
    name: &'static str,
    /// What the "with" binary does that the other does not.
    what: &'static str,
    /// The echoed text's bytes, when the feature needs its own (else `--payload`).
    payload: Option<usize>,
    /// The catalogs without and with it, auditing to the given files.
    catalogs: fn(without: &Path, with: &Path, places: &Places) -> (String, String),
}

/// What the harness runs beside the binaries for the features to use.
struct Places {
    redis_url: String,
    /// An HTTP upstream answering each call with its `text` argument.
    upstream: SocketAddr,
    /// A token endpoint answering every request with the same token.
    token_endpoint: SocketAddr,
    /// A file holding the client secret the token endpoint is sent.
    client_secret: std::path::PathBuf,
}

/// An access token as long as an IdP's (a signed JWT with a few claims), so the header each
/// call carries costs what a real one would.
fn access_token() -> String {
    format!(
        "eyJhbGciOiJSUzI1NiJ9.{}.{}",
        "c".repeat(300),
        "s".repeat(342)
    )
}

/// `echo` as an HTTP tool on the harness's upstream, called with `credentials` (YAML) or, with
/// `None`, a static `authorization` header as long as an issued token.
fn catalog_with_http_echo(yaml: &str, places: &Places, credentials: Option<&str>) -> String {
    let echo = "    executor: { builtin: echo }\n";
    assert!(yaml.contains(echo) && yaml.contains("\ntools:\n"));
    let auth = match credentials {
        Some(credentials) => format!("    credentials: {credentials}\n"),
        None => format!(
            "    headers: {{ authorization: {{ value: \"Bearer {}\" }} }}\n",
            access_token()
        ),
    };
    yaml.replacen(
        echo,
        "    executor: { http: { upstream: echo, path: /echo } }\n",
        1,
    )
    .replacen(
        "\ntools:\n",
        &format!(
            "\nupstreams:\n  echo:\n    url: http://{}\n    allow_schemes: [http]\n    allow_private_addresses: true\n    max_concurrency: 4096\n{auth}tools:\n",
            places.upstream
        ),
        1,
    )
}

const FEATURES: &[Feature] = &[
    Feature {
        name: "flow rules, state in memory",
        what: "echo carries a flow label and a rule governs it (it never fires): every call reads \
               its run's scope before the quotas and records its label after the backend",
        payload: None,
        catalogs: |without, with, _| (catalog(without), catalog_with_flow(&catalog(with))),
    },
    Feature {
        name: "flow rules, state in Redis",
        what: "the same, both binaries with their state (quotas, and the flow scope for the \
               other) in the harness's redis-server: one more script to read the scope and \
               one to record",
        payload: None,
        catalogs: |without, with, places| {
            (
                catalog_with_redis(without, &places.redis_url),
                catalog_with_flow(&catalog_with_redis(with, &places.redis_url)),
            )
        },
    },
    Feature {
        name: "ten conditional rules",
        what: "the tenant has ten deny entries for echo, each with a CEL condition on the \
               arguments that never holds: every call evaluates all ten after bind",
        payload: None,
        catalogs: |without, with, _| (catalog(without), catalog_with_conditions(&catalog(with))),
    },
    Feature {
        name: "the output guard, 4 KiB outputs",
        what: "the default detectors (the eight secret ones) screen each 4 KiB output; the \
               other binary has them off (`output_guard: { secrets: off }`)",
        payload: Some(4096),
        catalogs: |without, with, _| {
            (
                catalog_without_output_guard(&catalog(without)),
                catalog(with),
            )
        },
    },
    Feature {
        name: "a per-call credential, cached",
        what: "echo is an HTTP tool on the harness's upstream; each call carries a token \
               exchanged (RFC 8693) for the caller's, from the credential cache after the first \
               call, where the other binary sends a static header of the same length",
        payload: None,
        catalogs: |without, with, places| {
            let exchange = format!(
                "{{ token_exchange: {{ token_endpoint: \"http://{}/token\", client_id: bench, client_secret_file: \"{}\", audience: echo }} }}",
                places.token_endpoint,
                places.client_secret.display()
            );
            (
                catalog_with_http_echo(&catalog(without), places, None),
                catalog_with_http_echo(&catalog(with), places, Some(&exchange)),
            )
        },
    },
];

/// The HTTP upstream: answers each POST with the `text` of its JSON body.
async fn start_upstream() -> anyhow::Result<SocketAddr> {
    let app = Router::new().route(
        "/echo",
        post(|body: Bytes| async move {
            serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["text"].as_str().map(str::to_owned))
                .unwrap_or_default()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// The token endpoint: the same token, valid for an hour, to every request; counts them.
async fn start_token_endpoint(requests: Arc<AtomicU64>) -> anyhow::Result<SocketAddr> {
    let app = Router::new().route(
        "/token",
        post(move || {
            requests.fetch_add(1, Ordering::Relaxed);
            async move {
                (
                    [("content-type", "application/json")],
                    serde_json::json!({
                        "access_token": access_token(), "token_type": "Bearer",
                        "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                        "expires_in": 3600,
                    })
                    .to_string(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// Runs every feature's rounds and prints their tables; `Ok(false)` when calls failed.
pub fn features(options: &Options, only: Option<&str>) -> anyhow::Result<bool> {
    let (collector_listener, otlp_endpoint) = reserve_collector()?;
    let load_at_start = load_average();
    let dir = tempfile::tempdir()?;
    let collector_rt = runtime("bench-otlp", 1)?;
    let client_rt = runtime("bench-client", 2)?;
    let collector = collector_rt.block_on(otlp_collector::start_on(collector_listener, 10_000));
    let endpoint = [("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_endpoint.as_str())];
    let redis = start_redis()?;
    let token_requests = Arc::new(AtomicU64::new(0));
    let client_secret = dir.path().join("client-secret");
    std::fs::write(&client_secret, "bench-client-secret")?;
    let places = Places {
        redis_url: redis.url(),
        upstream: collector_rt.block_on(start_upstream())?,
        token_endpoint: collector_rt.block_on(start_token_endpoint(token_requests.clone()))?,
        client_secret,
    };
    println!(
        "toolgate binary: {}; load average at start: {load_at_start}",
        options.binary.display()
    );
    let mut ok = true;
    for (i, feature) in FEATURES.iter().enumerate() {
        if only.is_some_and(|only| !feature.name.contains(only)) {
            continue;
        }
        println!("\n## {}\n\n{}.\n", feature.name, feature.what);
        let audit = |side: &str| dir.path().join(format!("audit-{i}-{side}.jsonl"));
        let (without, with) = (feature.catalogs)(&audit(WITHOUT), &audit(WITH), &places);
        let call = EchoCall::new(feature.payload.unwrap_or(options.payload))?;
        let measured = interleave(
            options,
            &client_rt,
            dir.path(),
            &endpoint,
            &call,
            [
                Side {
                    name: WITHOUT,
                    exe: &options.binary,
                    catalog: without,
                    service: "toolgate-bench-without",
                },
                Side {
                    name: WITH,
                    exe: &options.binary,
                    catalog: with,
                    service: "toolgate-bench-with",
                },
            ],
        )?;
        ok &= measured.ok;
        print_each_round("binary", &measured.rows, &measured.rounds);
        print_medians(options, &measured.rows, WITHOUT, WITH, "with / without");
    }
    println!(
        "\nthe token endpoint was asked {} times (once per binary start and caller token: the rest came from the cache)",
        token_requests.load(Ordering::Relaxed)
    );
    collector_rt.block_on(collector.wait_until_quiet(options.span_quiet, Duration::from_secs(60)));
    println!("\nload average at end: {}", load_average());
    collector_rt.block_on(collector.shutdown());
    Ok(ok)
}
