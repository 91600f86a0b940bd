//! The `http` backend: POST a permitted call's bound arguments as JSON to an upstream named in the
//! server's config. The model never supplies a URL, host or port. Requests go through
//! [`crate::outbound`]'s guarded client.

use std::{collections::BTreeMap, path::Path, sync::Arc, time::Duration};

use futures::{FutureExt, future::BoxFuture};
use reqwest::{
    StatusCode,
    header::{HeaderMap, HeaderName, HeaderValue},
};
use tokio::sync::Semaphore;
use url::Url;

use super::{ExecError, Executor};
use crate::{
    boundary::Permit,
    catalog::{BackendSpec, HttpTarget},
    clock::SharedClock,
    credentials::{CredentialSpec, Credentials},
    outbound::{BodyError, Destination, guarded_client, read_capped, refusal_in},
    settings::{
        Env, FieldError, check_url, parse_duration,
        raw::{RawHeaderValue, RawUpstream},
        resolve_path,
    },
};

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
    /// How each call authenticates, as configured; made live by the executor that runs it.
    credential_spec: Option<CredentialSpec>,
    /// What the credentials were built from (their settings and the secret files' contents):
    /// a reload that leaves it unchanged keeps the issued tokens.
    credential_source: Option<String>,
    credentials: Option<Arc<Credentials>>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Header values may be secrets: never print them.
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("base", &self.base.as_str())
            .field("credentials", &self.credential_spec)
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
        let credential_spec = raw
            .credentials
            .as_ref()
            .map(|c| CredentialSpec::build(c, &at("credentials"), base_dir))
            .transpose()?;
        if credential_spec.is_some()
            && let Some(header) = raw
                .headers
                .keys()
                .find(|h| h.eq_ignore_ascii_case("authorization"))
        {
            return Err(FieldError::new(
                at(&format!("headers.{header}")),
                "credentials set the authorization header of each call; a static one cannot be set too",
            ));
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
            credential_source: raw.credentials.as_ref().map(|raw| {
                let digest = |file: &Option<String>| {
                    file.as_ref()
                        .and_then(|f| std::fs::read(resolve_path(base_dir, f)).ok())
                        .map(|bytes| crate::identity::fingerprint(&String::from_utf8_lossy(&bytes)))
                };
                let grants = [&raw.token_exchange, &raw.client_credentials];
                let secrets: Vec<_> = grants
                    .iter()
                    .filter_map(|g| g.as_ref())
                    .map(|g| (digest(&g.client_secret_file), digest(&g.client_key_file)))
                    .collect();
                format!("{raw:?} {secrets:?}")
            }),
            credential_spec,
            credentials: None,
        })
    }

    /// The kind and audience of the credential each call is made with, if any (for explain).
    pub fn credential(&self) -> Option<(&'static str, Option<&str>)> {
        self.credential_spec
            .as_ref()
            .map(|spec| (spec.kind(), spec.audience()))
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

/// The tokens one upstream's credentials keep, in bytes.
const CREDENTIAL_CACHE_BYTES: usize = 4 * 1024 * 1024;

/// Runs `http` tools (and `a2a` tools, whose agents are reached through upstreams too) on the
/// upstreams of one catalog, found by the name the catalog gives.
#[derive(Debug, Default)]
pub struct HttpExecutor {
    upstreams: BTreeMap<String, Arc<Upstream>>,
    /// The A2A agents' endpoints, as their cards last said.
    pub(crate) agent_cards: super::a2a::Cards,
    /// What issued credentials' lifetimes are read on.
    clock: SharedClock,
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
                let kept = self
                    .upstreams
                    .get(&name)
                    .filter(|previous| previous.credential_source == upstream.credential_source)
                    .and_then(|previous| previous.credentials.clone());
                if kept.is_some() {
                    upstream.credentials = kept;
                    return (name, Arc::new(upstream));
                }
                upstream.credentials = upstream.credential_spec.clone().and_then(|spec| {
                    Credentials::new(
                        spec,
                        format!("upstream {name}"),
                        self.clock.clone(),
                        CREDENTIAL_CACHE_BYTES,
                    )
                    .map(Arc::new)
                    .inspect_err(|err| tracing::error!(upstream = %name, error = %err, "cannot set up the upstream's credentials; its calls are refused"))
                    .ok()
                });
                (name, Arc::new(upstream))
            })
            .collect();
        HttpExecutor {
            upstreams,
            agent_cards: super::a2a::Cards::default(),
            clock: self.clock.clone(),
        }
    }

    /// An executor with no upstreams whose credentials read time on `clock`.
    pub fn with_clock(clock: SharedClock) -> HttpExecutor {
        HttpExecutor {
            upstreams: BTreeMap::new(),
            agent_cards: super::a2a::Cards::default(),
            clock,
        }
    }

    /// The upstream of this name.
    pub fn upstream(&self, name: &str) -> Option<&Upstream> {
        self.upstreams.get(name).map(Arc::as_ref)
    }

    /// The upstream a tool names. Built with the catalog that names it, so never missing;
    /// refuse rather than guess.
    fn upstream_of(&self, tool: &HttpTarget) -> Result<&Upstream, ExecError> {
        self.upstream_named(&tool.upstream)
    }

    /// Fetches the caller's credential for `upstream` onto the permit, unless it has one.
    pub(crate) async fn authenticate_on(
        &self,
        upstream: &Upstream,
        permit: &Permit,
    ) -> Result<(), ExecError> {
        if permit.issued_credential().is_some() {
            return Ok(());
        }
        match (&upstream.credential_spec, &upstream.credentials) {
            (None, _) => Ok(()),
            (Some(_), None) => Err(ExecError::Misconfigured(format!(
                "upstream {}'s credentials could not be set up",
                upstream.name
            ))),
            (Some(_), Some(credentials)) => {
                permit.record_credential(credentials.for_call(permit.caller()).await?);
                Ok(())
            }
        }
    }

    async fn run(&self, tool: &HttpTarget, permit: &Permit) -> Result<String, ExecError> {
        let upstream = self.upstream_of(tool)?;
        let _slot = upstream.slot()?;
        upstream.may_reach(&tool.url)?;
        // The caller's credential for this upstream, before anything is sent: without one, the
        // upstream is not called.
        self.authenticate_on(upstream, permit).await?;
        let built = tool
            .request
            .request(&tool.url, permit.arguments())
            .map_err(|err| ExecError::BadArguments(err.0))?;
        let mut request = upstream.request(tool.request.method.clone(), built.url, permit);
        for (name, value) in built.headers {
            request = request.header(name, value);
        }
        if let Some(body) = built.body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let (status, body) = upstream.send(request).await?;
        let text = String::from_utf8_lossy(&body).into_owned();
        if tool.request.is_success(status.as_u16()) {
            return Ok(text);
        }
        Err(upstream.failure(status, &text))
    }
}

impl Upstream {
    /// A slot of the upstream's cap on requests in flight, held for as long as the call runs.
    pub(crate) fn slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ExecError> {
        self.in_flight.clone().try_acquire_owned().map_err(|_| {
            ExecError::Overloaded(format!(
                "upstream {} is at its limit of {} calls in flight",
                self.name, self.max_concurrency
            ))
        })
    }

    /// Whether `url` is one this upstream may be called at: an allowed scheme and, for a
    /// literal address, an allowed destination (names are checked as they resolve).
    pub(crate) fn may_reach(&self, url: &Url) -> Result<(), ExecError> {
        if !self.allow_schemes.iter().any(|s| s == url.scheme()) {
            return Err(ExecError::Refused(format!(
                "upstream {} may not use {}",
                self.name,
                url.scheme()
            )));
        }
        self.destination
            .check_literal(url)
            .map_err(|err| ExecError::Refused(err.to_string()))
    }

    /// A request of a call to this upstream: its configured headers, a fresh request id, the
    /// call's id, its trace context and the caller's credential (fetched before, onto the
    /// permit).
    pub(crate) fn request(
        &self,
        method: reqwest::Method,
        url: Url,
        permit: &Permit,
    ) -> reqwest::RequestBuilder {
        // A fresh id per request: call ids repeat (every first call of a turn without one is
        // tool_step_0_0), so the call id travels in a header of its own.
        let mut request = self
            .client
            .request(method, url)
            .headers(self.headers.clone())
            .header("x-request-id", uuid::Uuid::new_v4().to_string());
        if let Ok(call_id) = HeaderValue::from_str(permit.call_id()) {
            request = request.header("x-toolgate-call-id", call_id);
        }
        if let Some(traceparent) = permit.traceparent() {
            request = request.header("traceparent", traceparent);
        }
        if let Some(credential) = permit.issued_credential() {
            request = request.header(reqwest::header::AUTHORIZATION, credential.header().clone());
        }
        // A handoff's delegation, for the sub-agent to call its own sidecar with.
        if let Some(token) = permit
            .delegation()
            .and_then(|t| HeaderValue::from_str(t).ok())
        {
            request = request.header(crate::identity::delegation::DELEGATION_HEADER, token);
        }
        request
    }

    /// Sends a request and reads its answer, within the upstream's response limit.
    pub(crate) async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(StatusCode, Vec<u8>), ExecError> {
        let response = request
            .send()
            .await
            .map_err(|err| classify(&self.name, &err))?;
        let status = response.status();
        let body = read_capped(response, self.max_response_bytes)
            .await
            .map_err(|err| match err {
                BodyError::TooLarge(max) => ExecError::OutputTooLarge(format!(
                    "upstream {} answered with more than {max} bytes",
                    self.name
                )),
                BodyError::Read(err) => classify(&self.name, &err),
            })?;
        Ok((status, body))
    }

    /// An answer that is not a success: a 5xx is transient (and may have acted), anything else
    /// the upstream's refusal, its first line passed on.
    pub(crate) fn failure(&self, status: StatusCode, text: &str) -> ExecError {
        if status.is_server_error() {
            return ExecError::Unavailable(format!(
                "upstream {} answered {}",
                self.name,
                short_status(status)
            ));
        }
        ExecError::failed_with(
            format!("upstream {} answered {}", self.name, short_status(status)),
            summary(text),
        )
    }

    /// A client for requests that outlive a call (an A2A task's cancel), with the upstream's
    /// headers.
    pub(crate) fn detached(&self) -> (reqwest::Client, HeaderMap) {
        (self.client.clone(), self.headers.clone())
    }
}

impl HttpExecutor {
    /// The upstream of this name, for the executors that call through upstreams (A2A).
    pub(crate) fn upstream_named(&self, name: &str) -> Result<&Upstream, ExecError> {
        self.upstreams
            .get(name)
            .map(Arc::as_ref)
            .ok_or_else(|| ExecError::Misconfigured(format!("upstream {name} is not configured")))
    }
}

impl Executor for HttpExecutor {
    fn authenticate<'a>(
        &'a self,
        permit: &'a Permit,
    ) -> Option<BoxFuture<'a, Result<(), ExecError>>> {
        let name = match &permit.tool().backend {
            BackendSpec::Http(tool) => &tool.upstream,
            BackendSpec::A2a(tool) => &tool.upstream,
            _ => return None,
        };
        // A missing upstream is execute's to report.
        let upstream = self.upstream_named(name).ok()?;
        upstream.credential_spec.as_ref()?;
        Some(self.authenticate_on(upstream, permit).boxed())
    }

    fn execute<'a>(&'a self, permit: &'a Permit) -> BoxFuture<'a, Result<String, ExecError>> {
        async move {
            match &permit.tool().backend {
                BackendSpec::Http(tool) => self.run(tool, permit).await,
                BackendSpec::A2a(tool) => super::a2a::run(self, tool, permit).await,
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
