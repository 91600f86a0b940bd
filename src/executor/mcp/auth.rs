//! Per-call credentials for a Streamable HTTP MCP server (docs/executors.md#credentials).
//!
//! One session serves every caller, so the credential travels with each request rather than
//! with the connection: a `tools/call` carries its caller's token (exchanged, or the sidecar's
//! own), and the session's own requests (initialize, tools/list, notifications, the event
//! stream) carry the sidecar's token from the same grant (client credentials). rmcp builds the
//! requests; the executor puts a private `_meta` entry on each `tools/call` naming the token it
//! was given, and the HTTP client takes the entry out before the request is sent.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use rmcp::model::{ClientJsonRpcMessage, ClientRequest};
use serde_json::Value;

use crate::{
    clock::SharedClock,
    credentials::{Credential, CredentialError, CredentialSpec, Credentials},
};

/// The `_meta` key naming a call's token; never sent.
const TOKEN_KEY: &str = "dev.toolgate/credential";

/// The tokens one server's requests are made with. Cloned into the server's HTTP client.
#[derive(Clone)]
pub(super) struct McpAuth {
    /// The token each call is made with, as configured.
    pub(super) calls: Arc<Credentials>,
    /// The sidecar's own token, for the session's requests.
    session: Arc<Credentials>,
    /// Tokens of calls in flight, by the number their `_meta` entry carries.
    pending: Arc<Pending>,
}

#[derive(Default)]
struct Pending {
    next: AtomicU64,
    tokens: Mutex<HashMap<u64, Arc<str>>>,
}

/// Keeps a call's token available to the HTTP client while the call is in flight.
pub(super) struct PendingToken {
    id: u64,
    pending: Arc<Pending>,
}

impl Drop for PendingToken {
    fn drop(&mut self) {
        lock(&self.pending.tokens).remove(&self.id);
    }
}

/// How an outgoing request is authenticated: what rmcp's client puts after `Bearer`.
pub(super) type Bearer = Option<String>;

impl McpAuth {
    /// The credentials of server `name` (a token-exchange server's session gets the sidecar's
    /// own token from the same grant); `max_bytes` bounds each cache.
    pub(super) fn new(
        name: &str,
        spec: &CredentialSpec,
        clock: &SharedClock,
        max_bytes: usize,
    ) -> Result<Self, String> {
        let label = format!("MCP server {name}");
        let calls = Arc::new(Credentials::new(
            spec.clone(),
            label.clone(),
            clock.clone(),
            max_bytes,
        )?);
        let session = match spec {
            CredentialSpec::ClientCredentials(_) => calls.clone(),
            CredentialSpec::TokenExchange(grant) => Arc::new(Credentials::new(
                CredentialSpec::ClientCredentials(grant.clone()),
                format!("{label} (its session)"),
                clock.clone(),
                max_bytes,
            )?),
            // Refused when the config is loaded: the session would have no token.
            CredentialSpec::PassThrough { .. } => {
                return Err(format!("{label} cannot pass callers' tokens through"));
            }
        };
        Ok(McpAuth {
            calls,
            session,
            pending: Arc::default(),
        })
    }

    /// Marks a call's `_meta` with `credential`, available to the HTTP client until the guard
    /// is dropped (the call answered, or abandoned).
    pub(super) fn attach(
        &self,
        credential: &Credential,
        meta: &mut serde_json::Map<String, Value>,
    ) -> PendingToken {
        let id = self.pending.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.pending.tokens).insert(id, credential.bearer_token().into());
        meta.insert(TOKEN_KEY.into(), Value::from(id));
        PendingToken {
            id,
            pending: self.pending.clone(),
        }
    }

    /// The token `message` goes with, its private `_meta` entry taken out: the call's own for
    /// a marked `tools/call`, the sidecar's for anything else.
    pub(super) async fn bearer_for(
        &self,
        message: &mut ClientJsonRpcMessage,
    ) -> Result<Bearer, CredentialError> {
        let marked = match message {
            ClientJsonRpcMessage::Request(request) => match &mut request.request {
                ClientRequest::CallToolRequest(call) => {
                    call.params.meta.as_mut().and_then(|meta| {
                        let id = meta.remove(TOKEN_KEY)?;
                        Some(id.as_u64())
                    })
                }
                _ => None,
            },
            _ => None,
        };
        match marked {
            Some(id) => id
                .and_then(|id| lock(&self.pending.tokens).get(&id).cloned())
                .map(|token| Some(token.to_string()))
                // The call was abandoned while its request waited to be sent: send nothing.
                .ok_or_else(|| {
                    CredentialError::Unavailable("the call's credential is gone".to_owned())
                }),
            None => self.session_bearer().await,
        }
    }

    /// The sidecar's own token, for the session's requests.
    pub(super) async fn session_bearer(&self) -> Result<Bearer, CredentialError> {
        let credential = self.session.own().await?;
        Ok(Some(credential.bearer_token().to_owned()))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A map of tokens: no invariant a panicking holder could break halfway.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
