//! How the client verbs reach a running sidecar: the channel to `--addr`, the request with the
//! caller's identity (dev identity headers or a JWT), and a gRPC status as an error.

use std::time::Duration;

use tonic::{Request, metadata::MetadataValue, transport::Channel};

use super::{ClientArgs, Failure, IdentityArgs, chain};
use crate::identity::{AGENT_HEADER, SCOPES_HEADER, SUBJECT_HEADER, TENANT_HEADER};

/// A channel to the sidecar at `--addr`.
pub(super) async fn channel(client: &ClientArgs) -> Result<Channel, Failure> {
    let addr = endpoint_url(&client.addr)?;
    let endpoint = Channel::from_shared(addr.clone())
        .map_err(|err| Failure::error(format_args!("invalid --addr {}: {err}", client.addr)))?
        .connect_timeout(Duration::from_secs(5));
    endpoint
        .connect()
        .await
        .map_err(|err| Failure::error(format_args!("cannot connect to {addr}: {}", chain(&err))))
}

/// `--addr` as a URL: `host:port` means `http://host:port`; other schemes than http(s) are
/// refused with a clear message.
fn endpoint_url(addr: &str) -> Result<String, Failure> {
    match addr.split_once("://") {
        None => Ok(format!("http://{addr}")),
        Some(("http" | "https", _)) => Ok(addr.to_owned()),
        Some((scheme, _)) => Err(Failure::error(format_args!(
            "--addr {addr}: the scheme {scheme:?} is not supported; use host:port or http://host:port"
        ))),
    }
}

/// A request carrying the caller's identity: dev identity headers and, with `--token`, the JWT.
pub(super) fn request<T>(client: &ClientArgs, body: T) -> Result<Request<T>, Failure> {
    let mut request = Request::new(body);
    let metadata = request.metadata_mut();
    let identity = &client.identity;
    let bearer = identity.token.as_ref().map(|t| format!("Bearer {t}"));
    let headers = identity
        .dev_headers()
        .chain(bearer.as_deref().map(|b| ("authorization", "--token", b)));
    for (header, flag, value) in headers {
        let value: MetadataValue<_> = value.parse().map_err(|_| not_text(flag))?;
        metadata.insert(header, value);
    }
    Ok(request)
}

impl IdentityArgs {
    /// The dev identity headers given, each as (header, the flag it came from, value).
    pub(super) fn dev_headers(&self) -> impl Iterator<Item = (&'static str, &'static str, &str)> {
        [
            (TENANT_HEADER, "--tenant", &self.tenant),
            (SUBJECT_HEADER, "--subject", &self.subject),
            (AGENT_HEADER, "--agent", &self.agent),
            (SCOPES_HEADER, "--scopes", &self.scopes),
        ]
        .into_iter()
        .filter_map(|(header, flag, value)| Some((header, flag, value.as_deref()?)))
    }
}

/// An identity flag whose value cannot be sent in a header.
pub(super) fn not_text(flag: &str) -> Failure {
    Failure::error(format_args!("{flag} must be ASCII text"))
}

/// A gRPC status as the error a verb reports: its code and message.
pub(super) fn status_error(status: tonic::Status) -> Failure {
    Failure::error(format_args!("{:?}: {}", status.code(), status.message()))
}
