//! The door as an OAuth 2.1 resource server (MCP's authorization spec): every request to the MCP
//! endpoint is admitted as the gRPC door admits an RPC — identity from the headers, then the
//! sidecar's caps — and a caller who cannot be identified is told where to get a token
//! (`401`, `WWW-Authenticate: Bearer resource_metadata=…`, RFC 9728); a token without the door's
//! required scopes gets `403 insufficient_scope`. The metadata document itself is public.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use axum::{
    Json,
    body::Body,
    extract::{ConnectInfo, Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body::Frame;
use serde_json::json;

use crate::{
    admission::{
        AdmissionLayer, Admitted, HeldBytes, Identified, IdentifiedBy, Refused,
        connections::{Connection, Listener},
    },
    identity::IdentityError,
    settings::McpDoorConfig,
};

/// What admission needs of the door's settings.
pub struct Gate {
    pub admission: AdmissionLayer,
    pub resource: String,
    pub metadata_url: String,
    pub authorization_servers: Vec<String>,
    pub scopes_supported: Vec<String>,
    pub required_scopes: Vec<String>,
}

impl Gate {
    pub fn new(config: &McpDoorConfig, resource: String, admission: AdmissionLayer) -> Self {
        Gate {
            admission,
            metadata_url: metadata_url(&resource),
            resource,
            authorization_servers: config.authorization_servers.clone(),
            scopes_supported: config.scopes_supported.clone(),
            required_scopes: config.required_scopes.clone(),
        }
    }
}

/// Where RFC 9728 puts a resource's metadata: `/.well-known/oauth-protected-resource` between
/// its origin and its path.
pub fn metadata_url(resource: &str) -> String {
    match url::Url::parse(resource) {
        Ok(url) => {
            let origin = url.origin().ascii_serialization();
            let path = url.path().trim_end_matches('/');
            format!("{origin}/.well-known/oauth-protected-resource{path}")
        }
        Err(_) => String::new(),
    }
}

/// The path the metadata is served at on this listener, for a resource at `path`.
pub fn metadata_path(path: &str) -> String {
    format!(
        "/.well-known/oauth-protected-resource{}",
        path.trim_end_matches('/')
    )
}

/// `GET /.well-known/oauth-protected-resource[/path]` (RFC 9728).
pub async fn metadata(State(gate): State<Arc<Gate>>) -> Response {
    let mut response = Json(json!({
        "resource": gate.resource,
        "authorization_servers": gate.authorization_servers,
        "scopes_supported": gate.scopes_supported,
        "bearer_methods_supported": ["header"],
        "resource_name": "toolgate",
    }))
    .into_response();
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    response
}

/// The middleware in front of the MCP endpoint; see the module docs.
pub async fn admit(State(gate): State<Arc<Gate>>, mut request: Request, next: Next) -> Response {
    // Admission finds the connection where tonic puts it, as itself.
    if let Some(ConnectInfo(connection)) =
        request.extensions_mut().remove::<ConnectInfo<Connection>>()
    {
        request.extensions_mut().insert(connection);
    }
    let sent_token = request.headers().contains_key(header::AUTHORIZATION);
    let admitted = match gate
        .admission
        .admit(&mut request, IdentifiedBy::McpResource)
        .await
    {
        Ok(admitted) => admitted,
        Err(refused) => return gate.refusal(&refused, sent_token),
    };
    let missing: Vec<&str> = match request.extensions().get::<Identified>() {
        Some(identified) => gate
            .required_scopes
            .iter()
            .filter(|scope| !identified.0.has_scope(scope))
            .map(String::as_str)
            .collect(),
        None => Vec::new(),
    };
    if !missing.is_empty() {
        return gate.insufficient_scope(&missing);
    }
    let (parts, body) = request.into_parts();
    let (body, bytes) = gate
        .admission
        .meter_body(tonic::body::Body::new(body), Listener::Mcp);
    let response = next.run(Request::from_parts(parts, Body::new(body))).await;
    // What the request holds (its call slot, its tenant's share, its bytes) is held until the
    // answer has been sent, also when it streams.
    response.map(|body| {
        Body::new(Holding {
            inner: body,
            held: Some((admitted, bytes)),
        })
    })
}

impl Gate {
    fn challenge(&self, extra: &str) -> HeaderValue {
        let value = format!("Bearer resource_metadata=\"{}\"{extra}", self.metadata_url);
        HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
    }

    fn refusal(&self, refused: &Refused, sent_token: bool) -> Response {
        match refused {
            Refused::Unauthenticated(err) => self.unauthorized(err, sent_token),
            Refused::Draining(message) => {
                error_response(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
            }
            Refused::Exhausted(message) => {
                let mut response =
                    error_response(StatusCode::TOO_MANY_REQUESTS, "resource_exhausted", message);
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                response
            }
        }
    }

    /// No usable credentials: where to get a token. A token that was sent and refused also
    /// says `invalid_token` (RFC 6750).
    fn unauthorized(&self, err: &IdentityError, sent_token: bool) -> Response {
        let extra = match sent_token {
            true => ", error=\"invalid_token\"",
            false => "",
        };
        let mut response = error_response(
            StatusCode::UNAUTHORIZED,
            if sent_token {
                "invalid_token"
            } else {
                "unauthorized"
            },
            &err.to_string(),
        );
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, self.challenge(extra));
        response
    }

    fn insufficient_scope(&self, missing: &[&str]) -> Response {
        let scope = missing.join(" ");
        let mut response = error_response(
            StatusCode::FORBIDDEN,
            "insufficient_scope",
            &format!("this MCP endpoint needs the scope(s) {scope}"),
        );
        let extra = format!(", error=\"insufficient_scope\", scope=\"{scope}\"");
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, self.challenge(&extra));
        response
    }
}

fn error_response(status: StatusCode, error: &str, description: &str) -> Response {
    (
        status,
        Json(json!({ "error": error, "error_description": description })),
    )
        .into_response()
}

/// A response body that holds what its request was admitted with until it ends (or is dropped).
struct Holding {
    inner: Body,
    held: Option<(Admitted, HeldBytes)>,
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.held = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
