//! `notifications/cancelled` on a stateless door. A 2025-11-25 host sends it as a POST of its own,
//! which no session ties to the call it names, and rmcp's stateless transport drops it. The door
//! keeps the calls in flight by caller and JSON-RPC id instead, so a notice cancels the call of
//! the caller that sent it, and only that one: ids are chosen by hosts and repeat across them, so
//! an id two of the caller's calls share cancels neither (logged). 2026-07-28 hosts cancel by
//! closing the request, which needs none of this.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use axum::{
    body::Body,
    extract::{Request, State},
    middleware::Next,
    response::Response,
};
use http::header;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::{admission::Identified, identity::Caller};

/// The longest body read to look for a cancellation: a notice is a few hundred bytes.
pub const MAX_NOTICE_BYTES: usize = 4096;

/// Who asked, and the id their host gave the request.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct Key {
    tenant: Arc<str>,
    subject: String,
    agent: Arc<str>,
    request_id: String,
}

impl Key {
    fn new(caller: &Caller, request_id: String) -> Self {
        Key {
            tenant: caller.tenant.clone(),
            subject: caller.subject.clone(),
            agent: caller.agent.clone(),
            request_id,
        }
    }
}

#[derive(Default)]
pub struct Cancels {
    calls: Mutex<HashMap<Key, Vec<(u64, CancellationToken)>>>,
    next: AtomicU64,
}

/// A call registered for cancellation; leaves the registry when dropped.
pub struct Registered {
    cancels: Arc<Cancels>,
    key: Key,
    serial: u64,
    pub token: CancellationToken,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut calls = self.cancels.lock();
        if let Some(entries) = calls.get_mut(&self.key) {
            entries.retain(|(serial, _)| *serial != self.serial);
            if entries.is_empty() {
                calls.remove(&self.key);
            }
        }
    }
}

/// What a cancellation notice did.
#[derive(Debug, PartialEq, Eq)]
pub enum Cancelled {
    One,
    NoSuchCall,
    Ambiguous(usize),
}

impl Cancels {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Vec<(u64, CancellationToken)>>> {
        // The map holds plain data; a panic elsewhere leaves it usable.
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn register(self: &Arc<Self>, caller: &Caller, request_id: String) -> Registered {
        let key = Key::new(caller, request_id);
        let serial = self.next.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        self.lock()
            .entry(key.clone())
            .or_default()
            .push((serial, token.clone()));
        Registered {
            cancels: self.clone(),
            key,
            serial,
            token,
        }
    }

    pub fn cancel(&self, caller: &Caller, request_id: String) -> Cancelled {
        let calls = self.lock();
        match calls.get(&Key::new(caller, request_id)).map(Vec::as_slice) {
            None | Some([]) => Cancelled::NoSuchCall,
            Some([(_, token)]) => {
                token.cancel();
                Cancelled::One
            }
            Some(many) => Cancelled::Ambiguous(many.len()),
        }
    }
}

/// The request id a body names, when it is a `notifications/cancelled` (JSON-RPC ids are numbers
/// or strings; both are compared as the door writes call ids).
pub fn cancelled_request_id(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Notice {
        method: String,
        params: Params,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Params {
        request_id: serde_json::Value,
    }
    // Most bodies are not notices: a substring search spares them a second parse.
    memchr::memmem::find(body, b"notifications/cancelled")?;
    let notice: Notice = serde_json::from_slice(body).ok()?;
    if notice.method != "notifications/cancelled" {
        return None;
    }
    match notice.params.request_id {
        serde_json::Value::String(id) => Some(id),
        serde_json::Value::Number(id) => Some(id.to_string()),
        _ => None,
    }
}

/// The middleware in front of the MCP endpoint, inside admission (the caller is known): every
/// request, notice or not, goes on to rmcp unchanged; a small body that is a cancellation notice
/// then cancels the caller's call it names — only once rmcp accepted it (202), so a notice that
/// fails the transport's checks (a `Host` of another site, an `Origin` not allowed: DNS
/// rebinding, a page in the user's browser) acts on nothing.
pub async fn notices(
    State(cancels): State<Arc<Cancels>>,
    request: Request,
    next: Next,
) -> Response {
    let small = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok())
        .is_some_and(|length| length <= MAX_NOTICE_BYTES);
    let caller = request
        .extensions()
        .get::<Identified>()
        .map(|i| i.0.clone());
    let (Some(caller), true) = (caller, small && request.method() == http::Method::POST) else {
        return next.run(request).await;
    };
    let (parts, body) = request.into_parts();
    let body = match super::read_body(body, MAX_NOTICE_BYTES).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let notice = cancelled_request_id(&body);
    let response = next.run(Request::from_parts(parts, Body::from(body))).await;
    if let Some(request_id) = notice.filter(|_| response.status() == http::StatusCode::ACCEPTED) {
        match cancels.cancel(&caller, request_id.clone()) {
            Cancelled::One => tracing::debug!(request_id, "MCP call cancelled by notice"),
            Cancelled::NoSuchCall => {}
            Cancelled::Ambiguous(calls) => tracing::info!(
                request_id,
                calls,
                tenant = %caller.tenant,
                "cancellation notice ignored: the caller has several calls with this request id in flight"
            ),
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::AuthMethod;

    fn caller(subject: &str) -> Caller {
        Caller {
            tenant: "acme".into(),
            subject: subject.to_owned(),
            agent: "bot".into(),
            scopes: Default::default(),
            method: AuthMethod::Dev,
            claims: Default::default(),
            token: None,
            delegation: None,
        }
    }

    #[test]
    fn a_notice_cancels_only_the_senders_call_with_that_id() {
        let cancels = Arc::new(Cancels::default());
        let alice = cancels.register(&caller("alice"), "7".into());
        let bob = cancels.register(&caller("bob"), "7".into());
        assert_eq!(
            cancels.cancel(&caller("mallory"), "7".into()),
            Cancelled::NoSuchCall
        );
        assert_eq!(
            cancels.cancel(&caller("alice"), "8".into()),
            Cancelled::NoSuchCall
        );
        assert_eq!(cancels.cancel(&caller("alice"), "7".into()), Cancelled::One);
        assert!(alice.token.is_cancelled());
        assert!(!bob.token.is_cancelled());
    }

    #[test]
    fn an_id_two_calls_share_cancels_neither_and_calls_leave_when_done() {
        let cancels = Arc::new(Cancels::default());
        let first = cancels.register(&caller("alice"), "1".into());
        let second = cancels.register(&caller("alice"), "1".into());
        assert_eq!(
            cancels.cancel(&caller("alice"), "1".into()),
            Cancelled::Ambiguous(2)
        );
        assert!(!first.token.is_cancelled() && !second.token.is_cancelled());
        drop(first);
        assert_eq!(cancels.cancel(&caller("alice"), "1".into()), Cancelled::One);
        assert!(second.token.is_cancelled());
        drop(second);
        assert!(cancels.lock().is_empty(), "nothing is kept for ended calls");
    }

    #[test]
    fn only_cancellation_notices_name_a_request() {
        let notice = br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3,"reason":"user"}}"#;
        assert_eq!(cancelled_request_id(notice), Some("3".into()));
        let named =
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"a-1"}}"#;
        assert_eq!(cancelled_request_id(named), Some("a-1".into()));
        let call = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"notifications/cancelled"}}}"#;
        assert_eq!(cancelled_request_id(call), None);
        assert_eq!(
            cancelled_request_id(b"{not json notifications/cancelled"),
            None
        );
    }
}
