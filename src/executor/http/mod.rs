//! The `http` backend: POST a permitted call's bound arguments as JSON to an upstream named in the
//! server's config. The model never supplies a URL, host or port.
//!
//! Before any connection: the scheme must be one the upstream allows, and every address the host
//! resolves to must be public unless the upstream allows private targets. The check runs in the
//! client's resolver, so the addresses checked are the addresses connected to (no DNS-rebinding
//! gap); IP-literal hosts, which skip resolvers, are checked before the request. Redirects to
//! another host are refused, proxies from the environment are ignored, and the response body is
//! capped.

mod ssrf;

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, SocketAddr},
    path::Path,
    sync::Arc,
    time::Duration,
};

use futures::{FutureExt, future::BoxFuture};
use reqwest::{
    StatusCode,
    dns::{Addrs, Name, Resolve, Resolving},
    header::{HeaderMap, HeaderName, HeaderValue},
};
use tokio::sync::Semaphore;
use url::Url;

pub use ssrf::non_public_reason;

use super::{ExecError, Executor};
use crate::{
    boundary::Permit,
    config::{
        Env, FieldError, parse_duration,
        raw::{RawHeaderValue, RawUpstream},
        resolve_path,
    },
};

/// A configured upstream and its client.
pub struct Upstream {
    pub name: String,
    base: Url,
    client: reqwest::Client,
    allow_private: bool,
    allow_schemes: Vec<String>,
    headers: HeaderMap,
    max_response_bytes: usize,
    max_concurrency: usize,
    in_flight: Arc<Semaphore>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values may be secrets: never print them.
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("base", &self.base.as_str())
            .finish_non_exhaustive()
    }
}

impl Upstream {
    /// Validates an upstream's config and builds its client.
    pub fn build(
        name: &str,
        raw: &RawUpstream,
        base_dir: &Path,
        env: &Env,
    ) -> Result<Self, FieldError> {
        let at = |field: &str| format!("upstreams.{name}.{field}");
        let base = Url::parse(&raw.url).map_err(|err| {
            FieldError::new(at("url"), format!("invalid URL {:?}: {err}", raw.url))
        })?;
        let allow_schemes: Vec<String> = raw
            .allow_schemes
            .clone()
            .unwrap_or_else(|| vec!["https".to_owned()])
            .into_iter()
            .map(|s| s.to_ascii_lowercase())
            .collect();
        if let Some(bad) = allow_schemes
            .iter()
            .find(|s| !matches!(s.as_str(), "http" | "https"))
        {
            return Err(FieldError::new(
                at("allow_schemes"),
                format!("unsupported scheme {bad:?}; use http or https"),
            ));
        }
        if !allow_schemes.iter().any(|s| s == base.scheme()) {
            return Err(FieldError::new(
                at("url"),
                format!(
                    "scheme {:?} is not in allow_schemes {allow_schemes:?}",
                    base.scheme()
                ),
            ));
        }
        let host = base
            .host_str()
            .ok_or_else(|| FieldError::new(at("url"), "the URL has no host"))?
            .to_owned();
        if !base.username().is_empty() || base.password().is_some() {
            return Err(FieldError::new(
                at("url"),
                "credentials in the URL are not allowed; use headers from a secret",
            ));
        }
        let mut overrides = HashMap::new();
        for (override_host, addresses) in &raw.resolve {
            let ips = addresses
                .iter()
                .map(|a| {
                    a.parse::<IpAddr>().map_err(|_| {
                        FieldError::new(
                            at(&format!("resolve.{override_host}")),
                            format!("{a:?} is not an IP address"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            overrides.insert(override_host.to_ascii_lowercase(), ips);
        }
        let mut headers = HeaderMap::new();
        for (header, value) in &raw.headers {
            let path = at(&format!("headers.{header}"));
            let header_name = HeaderName::try_from(header.as_str())
                .map_err(|_| FieldError::new(&path, format!("invalid header name {header:?}")))?;
            let text = header_value(value, &path, base_dir, env)?;
            let secret = value.value.is_none();
            let mut header_value = HeaderValue::try_from(text)
                .map_err(|_| FieldError::new(&path, "invalid header value"))?;
            header_value.set_sensitive(secret);
            headers.insert(header_name, header_value);
        }
        let connect_timeout = match &raw.connect_timeout {
            Some(text) => {
                parse_duration(text).map_err(|m| FieldError::new(at("connect_timeout"), m))?
            }
            None => Duration::from_secs(5),
        };
        let max_concurrency = raw.max_concurrency.unwrap_or(64);
        if max_concurrency == 0 {
            return Err(FieldError::new(
                at("max_concurrency"),
                "must be greater than 0",
            ));
        }
        let resolver = CheckedResolver {
            upstream: name.to_owned(),
            overrides,
            allow_private: raw.allow_private_addresses,
        };
        let redirect_host = host.clone();
        let redirect_schemes = allow_schemes.clone();
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(connect_timeout)
            .dns_resolver(resolver)
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                let same_host = attempt
                    .url()
                    .host_str()
                    .is_some_and(|h| h.eq_ignore_ascii_case(&redirect_host));
                let allowed_scheme = redirect_schemes.iter().any(|s| s == attempt.url().scheme());
                if !same_host {
                    attempt.error("the upstream redirected to another host")
                } else if !allowed_scheme {
                    attempt.error("the upstream redirected to a scheme it may not use")
                } else if attempt.previous().len() >= 5 {
                    attempt.error("too many redirects")
                } else {
                    attempt.follow()
                }
            }))
            .build()
            .map_err(|err| {
                FieldError::new(
                    format!("upstreams.{name}"),
                    format!("cannot build the HTTP client: {err}"),
                )
            })?;
        Ok(Upstream {
            name: name.to_owned(),
            base,
            client,
            allow_private: raw.allow_private_addresses,
            allow_schemes,
            headers,
            max_response_bytes: raw.max_response_bytes.unwrap_or(1024 * 1024),
            max_concurrency,
            in_flight: Arc::new(Semaphore::new(max_concurrency)),
        })
    }

    /// Takes over `previous`'s slots for requests in flight when the cap is unchanged, so a
    /// reload in the middle of load cannot let twice the cap through.
    pub fn adopt_in_flight(&mut self, previous: &Upstream) {
        if previous.max_concurrency == self.max_concurrency {
            self.in_flight = previous.in_flight.clone();
        }
    }

    /// The URL for a tool path under this upstream.
    pub fn url_for(&self, path: &str, at: &str) -> Result<Url, FieldError> {
        if path.is_empty() {
            return Ok(self.base.clone());
        }
        let joined = format!(
            "{}/{}",
            self.base.as_str().trim_end_matches('/'),
            path.trim_start_matches('/')
        );
        let url = Url::parse(&joined)
            .map_err(|err| FieldError::new(at, format!("invalid path {path:?}: {err}")))?;
        if url.host_str() != self.base.host_str()
            || url.port_or_known_default() != self.base.port_or_known_default()
        {
            return Err(FieldError::new(
                at,
                "the path must stay on the upstream's host",
            ));
        }
        Ok(url)
    }
}

fn header_value(
    value: &RawHeaderValue,
    path: &str,
    base_dir: &Path,
    env: &Env,
) -> Result<String, FieldError> {
    let text = match (&value.value, &value.env, &value.file) {
        (Some(literal), None, None) => literal.clone(),
        (None, Some(var), None) => env
            .get(var)
            .ok_or_else(|| FieldError::new(path, format!("environment variable {var} is not set")))?
            .trim()
            .to_owned(),
        (None, None, Some(file)) => {
            let full = resolve_path(base_dir, file);
            std::fs::read_to_string(&full)
                .map_err(|err| {
                    FieldError::new(path, format!("cannot read {}: {err}", full.display()))
                })?
                .trim_end()
                .to_owned()
        }
        _ => {
            return Err(FieldError::new(
                path,
                "set exactly one of value, env or file",
            ));
        }
    };
    Ok(format!("{}{text}", value.prefix.as_deref().unwrap_or("")))
}

/// Resolves names (or takes them from the upstream's static table) and refuses the lookup if any
/// address is not public, unless the upstream allows private targets.
struct CheckedResolver {
    upstream: String,
    overrides: HashMap<String, Vec<IpAddr>>,
    allow_private: bool,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_ascii_lowercase();
        let fixed = self.overrides.get(&host).cloned();
        let allow_private = self.allow_private;
        let upstream = self.upstream.clone();
        Box::pin(async move {
            let addresses: Vec<SocketAddr> = match fixed {
                Some(ips) => ips.into_iter().map(|ip| SocketAddr::new(ip, 0)).collect(),
                None => tokio::net::lookup_host((host.as_str(), 0)).await?.collect(),
            };
            if addresses.is_empty() {
                return Err(format!("upstream {upstream}: {host} has no addresses").into());
            }
            if !allow_private
                && let Some((ip, why)) = addresses
                    .iter()
                    .find_map(|a| non_public_reason(a.ip()).map(|w| (a.ip(), w)))
            {
                tracing::warn!(upstream = %upstream, host = %host, address = %ip, reason = why, "refused a non-public upstream address");
                return Err(Box::new(Refused(format!(
                    "upstream {upstream} resolves to a non-public address ({why})"
                ))) as _);
            }
            Ok(Box::new(addresses.into_iter()) as Addrs)
        })
    }
}

/// An SSRF refusal, recognised in the error chain so it is reported as a refusal, not an outage.
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// An HTTP tool: which upstream, and the URL under it.
#[derive(Clone)]
pub struct HttpTool {
    pub upstream: Arc<Upstream>,
    pub url: Url,
}

impl std::fmt::Debug for HttpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpTool")
            .field("upstream", &self.upstream.name)
            .field("url", &self.url.as_str())
            .finish()
    }
}

impl PartialEq for HttpTool {
    fn eq(&self, other: &Self) -> bool {
        self.upstream.name == other.upstream.name && self.url == other.url
    }
}

impl Eq for HttpTool {}

/// Builds `HttpTool`s from the catalog's tool entries.
pub fn http_tool(
    upstreams: &BTreeMap<String, Arc<Upstream>>,
    upstream: &str,
    path: &str,
    at: &str,
) -> Result<HttpTool, FieldError> {
    let found = upstreams.get(upstream).ok_or_else(|| {
        FieldError::new(
            format!("{at}.upstream"),
            format!(
                "unknown upstream {upstream:?}; configured: {}",
                upstreams.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        )
    })?;
    Ok(HttpTool {
        url: found.url_for(path, &format!("{at}.path"))?,
        upstream: found.clone(),
    })
}

/// Runs `http` tools.
#[derive(Debug, Default)]
pub struct HttpExecutor;

impl HttpExecutor {
    async fn run(&self, tool: &HttpTool, permit: &Permit) -> Result<String, ExecError> {
        let upstream = &tool.upstream;
        let _slot = upstream
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                ExecError::Overloaded(format!(
                    "upstream {} is at its limit of {} calls in flight",
                    upstream.name, upstream.max_concurrency
                ))
            })?;
        if !upstream
            .allow_schemes
            .iter()
            .any(|s| s == tool.url.scheme())
        {
            return Err(ExecError::Refused(format!(
                "upstream {} may not use {}",
                upstream.name,
                tool.url.scheme()
            )));
        }
        // IP-literal hosts never reach the resolver: check them here, before connecting.
        if !upstream.allow_private
            && let Some(url::Host::Ipv4(_) | url::Host::Ipv6(_)) = tool.url.host()
            && let Some(ip) = tool
                .url
                .host_str()
                .and_then(|h| h.trim_matches(['[', ']']).parse::<IpAddr>().ok())
            && let Some(why) = non_public_reason(ip)
        {
            return Err(ExecError::Refused(format!(
                "upstream {} is a non-public address ({why})",
                upstream.name
            )));
        }
        let body = serde_json::to_vec(permit.arguments())
            .map_err(|err| ExecError::failed(format!("cannot encode arguments: {err}")))?;
        let mut request = upstream
            .client
            .post(tool.url.clone())
            .headers(upstream.headers.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("x-request-id", permit.call_id())
            .body(body);
        if let Some(traceparent) = permit.traceparent() {
            request = request.header("traceparent", traceparent);
        }
        let mut response = request
            .send()
            .await
            .map_err(|err| classify(&upstream.name, &err))?;
        let status = response.status();
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|err| classify(&upstream.name, &err))?
        {
            if body.len() + chunk.len() > upstream.max_response_bytes {
                return Err(ExecError::OutputTooLarge(format!(
                    "upstream {} answered with more than {} bytes",
                    upstream.name, upstream.max_response_bytes
                )));
            }
            body.extend_from_slice(&chunk);
        }
        let text = String::from_utf8_lossy(&body).into_owned();
        if status.is_server_error() {
            return Err(ExecError::Unavailable(format!(
                "upstream {} answered {}",
                upstream.name,
                short_status(status)
            )));
        }
        if !status.is_success() {
            return Err(ExecError::failed_with(
                format!(
                    "upstream {} answered {}",
                    upstream.name,
                    short_status(status)
                ),
                summary(&text),
            ));
        }
        Ok(text)
    }
}

impl Executor for HttpExecutor {
    fn execute<'a>(&'a self, permit: &'a Permit) -> BoxFuture<'a, Result<String, ExecError>> {
        async move {
            match &permit.tool().executor {
                super::ExecutorSpec::Http(tool) => self.run(tool, permit).await,
                _ => Err(ExecError::failed("not an http tool")),
            }
        }
        .boxed()
    }
}

fn short_status(status: StatusCode) -> String {
    format!(
        "{} {}",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    )
    .trim_end()
    .to_owned()
}

/// The first line of an error body, bounded, so a 4xx explanation reaches the model.
fn summary(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    match line.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

/// Maps a client error to a refusal (SSRF), or a retryable outage; never leaks addresses.
fn classify(upstream: &str, err: &reqwest::Error) -> ExecError {
    let mut source: Option<&dyn std::error::Error> = Some(err);
    while let Some(e) = source {
        if let Some(refused) = e.downcast_ref::<Refused>() {
            return ExecError::Refused(refused.0.clone());
        }
        source = e.source();
    }
    if err.is_redirect() {
        let why = std::error::Error::source(err)
            .map(|e| e.to_string())
            .unwrap_or_else(|| "redirect refused".into());
        return ExecError::Refused(format!("upstream {upstream}: {why}"));
    }
    if err.is_timeout() {
        return ExecError::Unavailable(format!("upstream {upstream} timed out"));
    }
    if err.is_connect() {
        // Nothing was sent: the connection was never made.
        return ExecError::NotReached(format!("upstream {upstream} is unreachable"));
    }
    ExecError::Unavailable(format!("upstream {upstream} failed: the connection broke"))
}
