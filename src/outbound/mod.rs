//! Outbound HTTP: the guarded client every request toolgate makes goes through — to upstreams,
//! to MCP servers over Streamable HTTP, to identity providers (their keys and token endpoints).
//!
//! A [`guarded_client`]: environment proxies are ignored, every
//! address a host resolves to must pass the destination's [`AddressPolicy`] (the check runs in
//! the client's resolver, so the addresses checked are the addresses connected to; IP-literal
//! hosts, which skip resolvers, are checked with [`Destination::check_literal`] before the request), and
//! redirects are followed only within the request's origin (scheme, host and port), so headers
//! configured for one origin never reach another. Response bodies are read with [`read_capped`].

mod ssrf;

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use url::Url;

pub use ssrf::{AddressPolicy, non_public_reason};

use crate::settings::FieldError;

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

/// The client for an identity provider the operator named (its keys, its endpoints): it may
/// be on a private address (an in-cluster issuer); `label` names it in messages.
pub fn issuer_client(label: &str, connect_timeout: Duration) -> Result<reqwest::Client, String> {
    let destination = Destination::build(label.to_owned(), true, &[], &BTreeMap::new(), |field| {
        field.to_owned()
    })
    .map_err(|err| err.message)?;
    guarded_client(&destination, connect_timeout)
        .map_err(|err| format!("cannot build the HTTP client for {label}: {err}"))
}

/// What went wrong with a request, in words: an SSRF refusal, or which part failed; never the
/// address or the request.
pub fn failure_in_words(err: &reqwest::Error) -> String {
    if let Some(refused) = refusal_in(err) {
        refused
    } else if err.is_connect() {
        "cannot connect".to_owned()
    } else if err.is_timeout() {
        "timed out".to_owned()
    } else {
        "the connection broke".to_owned()
    }
}

/// A response body longer than the reader's limit.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the answer is over {0} bytes")]
    TooLarge(usize),
    #[error(transparent)]
    Read(#[from] reqwest::Error),
}

/// The whole body of `response`, refused as soon as it passes `max` bytes (a declared length
/// over it is refused before reading).
pub async fn read_capped(
    mut response: reqwest::Response,
    max: usize,
) -> Result<Vec<u8>, BodyError> {
    if response
        .content_length()
        .is_some_and(|len| len > max as u64)
    {
        return Err(BodyError::TooLarge(max));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > max {
            return Err(BodyError::TooLarge(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
