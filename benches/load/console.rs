//! The console program (`console`): what the approvals console's pages and decisions cost, on
//! the demo catalog, against the same binary's cheapest HTTP answer (the admin `/healthz`) and the
//! gRPC door's `GetApproval` in the same run. One binary (--binary) serving the embedded demo on
//! ports of its own; `pending` approvals made through the gRPC door; an approver signed in with
//! the demo's development form; then, each round, requests one after another (no concurrency:
//! this is what one person waits for):
//! - `/healthz` (admin listener): the HTTP stack and nothing else, the baseline;
//! - `GetApproval` over gRPC: the same read through the other door;
//! - the inbox page (`/approvals`, the newest 20 of the tenant's pending approvals);
//! - one approval's page (`/approvals/{id}`);
//! - a decision (`POST /approvals/{id}`, approve, each on an approval of its own).
//!
//! Latencies are wall time at the client over loopback, printed as medians and 99th percentiles
//! with each row's ratio to `/healthz` of the same round; the page weights as served.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use toolgate::proto::{self, approvals_client::ApprovalsClient, tool_gate_client::ToolGateClient};

use crate::{
    load::runtime,
    options::Options,
    processes::{Binary, Spawned},
};

/// Approvals waiting when the rounds start, and how many more each round decides.
const PENDING: usize = 40;

/// Runs the rounds and prints the table; `Ok(false)` if a request failed.
pub fn console(options: &Options) -> anyhow::Result<bool> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("demo.yaml");
    std::fs::write(&config, demo_on_free_ports())?;
    let client_rt = runtime("bench-client", 2)?;
    let (mut binary, _) = Spawned::spawn(&options.binary, &config, dir.path(), "console", &[])?
        .wait_serving(&client_rt)?;
    let measured = client_rt.block_on(rounds(options, &binary));
    binary.stop()?;
    let rows = measured?;
    println!("toolgate binary: {}", options.binary.display());
    println!("| request | median | p99 | median / healthz | bytes |\n|---|---|---|---|---|");
    let baseline = median(&rows[0].1);
    for (name, times, bytes) in &rows {
        println!(
            "| {name} | {:.2} ms | {:.2} ms | {:.1}× | {} |",
            ms(median(times)),
            ms(percentile(times, 0.99)),
            median(times).as_secs_f64() / baseline.as_secs_f64(),
            match bytes {
                0 => "—".to_owned(),
                n => n.to_string(),
            }
        );
    }
    Ok(true)
}

/// The demo catalog with every listener on a port of its own choosing and a quota that lets
/// this many refunds through.
fn demo_on_free_ports() -> String {
    toolgate::settings::DEMO_CATALOG
        .replace("\"127.0.0.1:50051\"", "\"127.0.0.1:0\"")
        .replace("\"127.0.0.1:9464\"", "\"127.0.0.1:0\"")
        .replace("\"127.0.0.1:8765\"", "\"127.0.0.1:0\"")
        .replace("\"127.0.0.1:8766\"", "\"127.0.0.1:0\"")
        .replace("rate_limit: 5/min", "rate_limit: 1000000/min")
}

type Row = (&'static str, Vec<Duration>, usize);

async fn rounds(options: &Options, binary: &Binary) -> anyhow::Result<Vec<Row>> {
    let console = binary.console.context("the demo serves its console")?;
    let admin = binary.admin.context("the demo serves its admin endpoint")?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", binary.addr))?
        .connect()
        .await?;
    let mut tools = ToolGateClient::new(channel.clone());
    let mut approvals = ApprovalsClient::new(channel);
    let samples = if options.quick { 20 } else { 300 };
    let mut waiting = Vec::new();
    for _ in 0..PENDING + samples * options.rounds {
        waiting.push(ask(&mut tools).await?);
    }
    toolgate::tls::install_crypto_provider();
    let http = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let base = format!("http://{console}");
    let cookie = sign_in(&http, &base).await?;
    let inbox = get(&http, &format!("{base}/approvals"), &cookie).await?;
    let csrf = hidden(&inbox, "csrf").context("the inbox's sign-out form")?;
    let mut rows: Vec<Row> = vec![
        ("/healthz (admin)", Vec::new(), 0),
        ("GetApproval (gRPC)", Vec::new(), 0),
        ("inbox page", Vec::new(), inbox.len()),
        ("approval page", Vec::new(), 0),
        ("decision (POST)", Vec::new(), 0),
    ];
    for _ in 0..options.rounds {
        for _ in 0..samples {
            let id = waiting.pop().context("an approval to decide")?;
            let started = Instant::now();
            get(&http, &format!("http://{admin}/healthz"), "").await?;
            rows[0].1.push(started.elapsed());
            let started = Instant::now();
            approvals
                .get_approval(approver(proto::GetApprovalRequest {
                    approval_id: id.clone(),
                }))
                .await?;
            rows[1].1.push(started.elapsed());
            let started = Instant::now();
            get(&http, &format!("{base}/approvals"), &cookie).await?;
            rows[2].1.push(started.elapsed());
            let started = Instant::now();
            let page = get(&http, &format!("{base}/approvals/{id}"), &cookie).await?;
            rows[3].1.push(started.elapsed());
            rows[3].2 = page.len();
            let started = Instant::now();
            let decided = http
                .post(format!("{base}/approvals/{id}"))
                .header("cookie", &cookie)
                .header("origin", &base)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(format!("csrf={csrf}&decision=approve&reason=bench"))
                .send()
                .await?;
            rows[4].1.push(started.elapsed());
            let status = decided.status();
            let body = decided.text().await?;
            if !status.is_success() || !body.contains("You approved") {
                bail!("the decision was not applied ({status}): {body}");
            }
            rows[4].2 = body.len();
        }
    }
    Ok(rows)
}

fn approver<T>(body: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(body);
    let metadata = request.metadata_mut();
    metadata.insert("x-toolgate-tenant", "acme".parse().unwrap());
    metadata.insert("x-toolgate-subject", "bob".parse().unwrap());
    metadata.insert("x-toolgate-scopes", "toolgate:approve".parse().unwrap());
    request
}

/// alice's refund that waits for an approval; its id.
async fn ask(tools: &mut ToolGateClient<tonic::transport::Channel>) -> anyhow::Result<String> {
    let mut request = tonic::Request::new(proto::ExecuteToolRequest {
        call: Some(proto::ToolCall {
            call_id: "bench".into(),
            name: "refund_order".into(),
            arguments_json: r#"{"order_id":"A-1","amount_cents":2500}"#.into(),
            ..Default::default()
        }),
        run_id: "bench".into(),
        ..Default::default()
    });
    let metadata = request.metadata_mut();
    metadata.insert("x-toolgate-tenant", "acme".parse().unwrap());
    metadata.insert("x-toolgate-subject", "alice".parse().unwrap());
    let result = tools.execute_tool(request).await?.into_inner().result;
    let id = result.map(|r| r.approval_id).unwrap_or_default();
    if id.is_empty() {
        bail!("refund_order did not wait for an approval");
    }
    Ok(id)
}

/// The session cookie of an approver signed in with the demo's development form.
async fn sign_in(http: &reqwest::Client, base: &str) -> anyhow::Result<String> {
    let page = http.get(format!("{base}/sign-in")).send().await?;
    let login = set_cookie(&page).context("the sign-in's cookie")?;
    let state = hidden(&page.text().await?, "state").context("the dev form")?;
    let signed_in = http
        .post(format!("{base}/sign-in/dev"))
        .header("cookie", login)
        .header("origin", base)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!(
            "state={state}&next=%2Fapprovals&tenant=acme&subject=bob&scopes=toolgate%3Aapprove"
        ))
        .send()
        .await?;
    set_cookie(&signed_in).context("the session cookie")
}

/// The first cookie a response sets, as `name=value`.
fn set_cookie(response: &reqwest::Response) -> Option<String> {
    let text = response.headers().get("set-cookie")?.to_str().ok()?;
    Some(text.split(';').next()?.to_owned())
}

async fn get(http: &reqwest::Client, url: &str, cookie: &str) -> anyhow::Result<String> {
    let response = http.get(url).header("cookie", cookie).send().await?;
    if !response.status().is_success() {
        bail!("{url} answered {}", response.status());
    }
    Ok(response.text().await?)
}

fn hidden(page: &str, name: &str) -> Option<String> {
    let marker = format!("name=\"{name}\" value=\"");
    let start = page.find(&marker)? + marker.len();
    Some(page[start..][..page[start..].find('"')?].to_owned())
}

fn median(times: &[Duration]) -> Duration {
    percentile(times, 0.5)
}

fn percentile(times: &[Duration], q: f64) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(at).copied().unwrap_or_default()
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
