//! The `http` backend: POST a permitted call's bound arguments as JSON to an upstream named in the
//! server's config. The model never supplies a URL, host or port.
//!
//! Every outbound HTTP request toolgate makes — to upstreams here, and to MCP servers over
//! Streamable HTTP — goes through a [`guarded_client`]: environment proxies are ignored, every
//! address a host resolves to must pass the destination's [`AddressPolicy`] (the check runs in
//! the client's resolver, so the addresses checked are the addresses connected to; IP-literal
//! hosts, which skip resolvers, are checked with [`check_literal`] before the request), and
//! redirects are followed only within the request's origin (scheme, host and port), so headers
//! configured for an upstream never reach anyone else. The response body is capped.

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

pub use ssrf::{AddressPolicy, non_public_reason};

use super::{ExecError, Executor};
use crate::{
    boundary::Permit,
    catalog::{BackendSpec, HttpTarget},
    settings::{
        Env, FieldError, check_url, parse_duration,
        raw::{RawHeaderValue, RawUpstream},
        resolve_path,
    },
};

/// Where a guarded client may go: its name in messages and logs, the addresses it may reach,
/// and static name resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// How messages name it, e.g. `upstream billing` or `MCP server docs`.
    pub label: String,
    pub policy: AddressPolicy,
    /// Host (lowercase) -> addresses, like curl's `--resolve`; checked like DNS answers.
    pub overrides: HashMap<String, Vec<IpAddr>>,
}

impl Destination {
    /// Validates the address settings shared by upstreams and MCP servers; `at` names a field.
    pub fn build(
        label: String,
        allow_private: bool,
        allow_private_cidrs: &[String],
        resolve: &BTreeMap<String, Vec<String>>,
        at: impl Fn(&str) -> String,
    ) -> Result<Self, FieldError> {
        let policy = AddressPolicy::build(
            allow_private,
            allow_private_cidrs,
            &at("allow_private_cidrs"),
        )?;
        let mut overrides = HashMap::new();
        for (host, addresses) in resolve {
            let ips = addresses
                .iter()
                .map(|a| {
                    a.parse::<IpAddr>().map_err(|_| {
                        FieldError::new(
                            at(&format!("resolve.{host}")),
                            format!("{a:?} is not an IP address"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            overrides.insert(host.to_ascii_lowercase(), ips);
        }
        Ok(Destination {
            label,
            policy,
            overrides,
        })
    }

    /// Refuses an IP-literal host that the policy does not allow. Resolvers never see such hosts,
    /// so this runs before every request to one.
    pub fn check_literal(&self, url: &Url) -> Result<(), AddressRefused> {
        let ip = match url.host() {
            Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip),
            _ => return Ok(()),
        };
        match self.policy.refusal(ip) {
            Some(why) => {
                tracing::warn!(destination = %self.label, address = %ip, reason = why, "refused a non-public address");
                Err(AddressRefused::NonPublic {
                    destination: self.label.clone(),
                    why,
                })
            }
            None => Ok(()),
        }
    }
}

/// Why a destination may not be reached at an address.
#[derive(Debug, thiserror::Error)]
pub enum AddressRefused {
    /// The address is not public and the destination's policy does not allow it.
    #[error("{destination} is a non-public address ({why})")]
    NonPublic {
        /// The destination's label, e.g. `upstream billing`.
        destination: String,
        /// What kind of non-public address it is.
        why: &'static str,
    },
}

/// The HTTP client for one destination. Proxies from the environment are ignored, names resolve
/// through the destination's address policy, and redirects stay within the origin of the
/// request (at most 5), so nothing configured for one origin is ever sent to another.
pub fn guarded_client(
    destination: &Destination,
    connect_timeout: Duration,
) -> Result<reqwest::Client, reqwest::Error> {
    crate::tls::install_crypto_provider();
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(connect_timeout)
        .dns_resolver(CheckedResolver {
            destination: Arc::new(destination.clone()),
        })
        .redirect(reqwest::redirect::Policy::custom(|attempt| {
            let to = attempt.url();
            let elsewhere = match attempt.previous().first() {
                None => Some("another origin"),
                Some(from) if from.scheme() != to.scheme() => {
                    Some("another origin (another scheme)")
                }
                Some(from) if from.host_str() != to.host_str() => {
                    Some("another origin (another host)")
                }
                Some(from) if from.port_or_known_default() != to.port_or_known_default() => {
                    Some("another origin (another port)")
                }
                Some(_) => None,
            };
            if let Some(elsewhere) = elsewhere {
                attempt.error(RedirectRefused(elsewhere))
            } else if attempt.previous().len() > 5 {
                attempt.error(RedirectRefused("too many places"))
            } else {
                attempt.follow()
            }
        }))
        .build()
}

/// A configured upstream and its client.
pub struct Upstream {
    pub name: String,
    base: Url,
    client: reqwest::Client,
    destination: Destination,
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
        check_url(&base, &at("url"))?;
        let destination = Destination::build(
            format!("upstream {name}"),
            raw.allow_private_addresses,
            &raw.allow_private_cidrs,
            &raw.resolve,
            at,
        )?;
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
            Some(text) => parse_duration(text)
                .map_err(|err| FieldError::new(at("connect_timeout"), err.to_string()))?,
            None => Duration::from_secs(5),
        };
        let max_concurrency = raw.max_concurrency.unwrap_or(64);
        if max_concurrency == 0 {
            return Err(FieldError::new(
                at("max_concurrency"),
                "must be greater than 0",
            ));
        }
        let client = guarded_client(&destination, connect_timeout).map_err(|err| {
            FieldError::new(
                format!("upstreams.{name}"),
                format!("cannot build the HTTP client: {err}"),
            )
        })?;
        Ok(Upstream {
            name: name.to_owned(),
            base,
            client,
            destination,
            allow_schemes,
            headers,
            max_response_bytes: raw.max_response_bytes.unwrap_or(1024 * 1024),
            max_concurrency,
            in_flight: Arc::new(Semaphore::new(max_concurrency)),
        })
    }

    /// The URL tools' paths are joined to.
    pub fn base(&self) -> &Url {
        &self.base
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

/// Resolves names (or takes them from the destination's static table) and refuses the lookup if
/// any address is one the destination may not reach.
struct CheckedResolver {
    destination: Arc<Destination>,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_ascii_lowercase();
        let destination = self.destination.clone();
        Box::pin(async move {
            let addresses: Vec<SocketAddr> = match destination.overrides.get(&host) {
                Some(ips) => ips.iter().map(|ip| SocketAddr::new(*ip, 0)).collect(),
                None => tokio::net::lookup_host((host.as_str(), 0)).await?.collect(),
            };
            if addresses.is_empty() {
                return Err(format!("{}: {host} has no addresses", destination.label).into());
            }
            if let Some((ip, why)) = addresses
                .iter()
                .find_map(|a| destination.policy.refusal(a.ip()).map(|w| (a.ip(), w)))
            {
                tracing::warn!(destination = %destination.label, host = %host, address = %ip, reason = why, "refused a non-public address");
                return Err(Box::new(Refused(format!(
                    "{} resolves to a non-public address ({why})",
                    destination.label
                ))) as _);
            }
            Ok(Box::new(addresses.into_iter()) as Addrs)
        })
    }
}

/// An SSRF refusal, recognised in the error chain so it is reported as a refusal, not an outage.
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// A redirect the guarded client would not follow, and where it pointed (in words).
#[derive(Debug)]
struct RedirectRefused(&'static str);

impl std::fmt::Display for RedirectRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "redirected to {}", self.0)
    }
}

impl std::error::Error for RedirectRefused {}

/// The SSRF refusal somewhere in an error's chain, if any: in the resolver, or a redirect.
pub fn refusal_in(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(refused) = e.downcast_ref::<Refused>() {
            return Some(refused.0.clone());
        }
        if let Some(redirect) = e.downcast_ref::<RedirectRefused>() {
            return Some(redirect.to_string());
        }
        source = e.source();
    }
    None
}

/// Runs `http` tools on the upstreams of one catalog, found by the name the catalog gives.
#[derive(Debug, Default)]
pub struct HttpExecutor {
    upstreams: BTreeMap<String, Arc<Upstream>>,
}

impl HttpExecutor {
    /// Whether an upstream of this name is configured.
    pub fn has(&self, upstream: &str) -> bool {
        self.upstreams.contains_key(upstream)
    }

    /// The executor for a catalog with `fresh` upstreams, taking over this one's slots for
    /// requests in flight where an upstream keeps its name and cap: a reload in the middle of
    /// load cannot let twice the cap through.
    pub fn succeeded_by(&self, fresh: BTreeMap<String, Upstream>) -> HttpExecutor {
        let upstreams = fresh
            .into_iter()
            .map(|(name, mut upstream)| {
                if let Some(previous) = self.upstreams.get(&name)
                    && previous.max_concurrency == upstream.max_concurrency
                {
                    upstream.in_flight = previous.in_flight.clone();
                }
                (name, Arc::new(upstream))
            })
            .collect();
        HttpExecutor { upstreams }
    }

    async fn run(&self, tool: &HttpTarget, permit: &Permit) -> Result<String, ExecError> {
        // Built with the catalog that names it, so never missing; refuse rather than guess.
        let upstream = self.upstreams.get(&tool.upstream).ok_or_else(|| {
            ExecError::Misconfigured(format!("upstream {} is not configured", tool.upstream))
        })?;
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
        upstream
            .destination
            .check_literal(&tool.url)
            .map_err(|err| ExecError::Refused(err.to_string()))?;
        let body = serde_json::to_vec(permit.arguments())
            .map_err(|err| ExecError::failed(format!("cannot encode arguments: {err}")))?;
        // A fresh id per request: call ids repeat (every first call of a turn without one is
        // tool_step_0_0), so the call id travels in a header of its own.
        let mut request = upstream
            .client
            .post(tool.url.clone())
            .headers(upstream.headers.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("x-request-id", uuid::Uuid::new_v4().to_string());
        if let Ok(call_id) = HeaderValue::from_str(permit.call_id()) {
            request = request.header("x-toolgate-call-id", call_id);
        }
        if let Some(traceparent) = permit.traceparent() {
            request = request.header("traceparent", traceparent);
        }
        let mut response = request
            .body(body)
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
            match &permit.tool().backend {
                BackendSpec::Http(tool) => self.run(tool, permit).await,
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

/// The first line of an error body, so a 4xx explanation reaches the model (cut by the boundary
/// once the output guard screened it).
fn summary(text: &str) -> String {
    text.lines().next().unwrap_or("").trim().to_owned()
}

/// Maps a client error to a refusal (SSRF), a configuration mistake, an upstream never reached
/// (retryable), or a failure after the request may have reached it (an unknown outcome for a
/// write); never leaks addresses.
fn classify(upstream: &str, err: &reqwest::Error) -> ExecError {
    if let Some(refused) = refusal_in(err) {
        return ExecError::Refused(if err.is_redirect() {
            format!("upstream {upstream}: {refused}")
        } else {
            refused
        });
    }
    if err.is_builder() {
        // Checked at load, so this means a URL or header the client cannot send: retrying it
        // changes nothing.
        tracing::error!(upstream = %upstream, error = %err, "cannot build the upstream request");
        return ExecError::Misconfigured(format!(
            "upstream {upstream} is misconfigured: its request cannot be built"
        ));
    }
    if err.is_connect() {
        // Nothing was sent: the connection was never made (refused, reset during the TLS
        // handshake, or past `connect_timeout`, which is a connect error too).
        return ExecError::NotReached(format!("upstream {upstream} is unreachable"));
    }
    // Anything else failed after the request may have been sent, and may have been acted on.
    if err.is_timeout() {
        return ExecError::Unavailable(format!("upstream {upstream} timed out"));
    }
    ExecError::Unavailable(format!("upstream {upstream} failed: the connection broke"))
}
