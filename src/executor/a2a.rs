//! The `a2a` backend: a call handed to another agent over the Agent2Agent protocol, JSON-RPC
//! binding. The agent is reached through a configured upstream (its origin, TLS, headers and
//! the caller's credential); its card, fetched from the upstream and cached, says where its
//! endpoint is (which must be on the upstream's origin) and which protocol it speaks: A2A 1.0
//! (`SendMessage`, `GetTask`, `CancelTask`, the `A2A-Version: 1.0` header) or 0.3
//! (`message/send`, `tasks/get`, `tasks/cancel`).
//!
//! The message is sent without blocking and the task polled until it ends, so its id is known
//! from the start: a call that is cancelled, or whose deadline passes, drops this future, and
//! the task is cancelled (`CancelTask`) from a task of its own. A task that ends asking for
//! input or authorization is cancelled too: toolgate has no one to ask. The output is the
//! task's artifacts (their text parts, and data parts as JSON), or the agent's message.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::{Value, json};
use tokio::time::Instant;
use url::Url;

use super::{ExecError, http::HttpExecutor, http::Upstream};
use crate::{boundary::Permit, catalog::A2aTarget};

/// How long a card's endpoint is trusted before the card is fetched again.
const CARD_TTL: Duration = Duration::from_secs(300);
/// Polling a task: the first wait, doubled up to the last.
const FIRST_POLL: Duration = Duration::from_millis(20);
const MAX_POLL: Duration = Duration::from_millis(500);
/// How long a task's cancel may take once its call is gone.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);
/// Most cards kept (one per A2A tool's card URL, so a catalog's count; bounded regardless).
const MAX_CARDS: usize = 1024;

/// Which A2A protocol an agent's card says it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    V1,
    V03,
}

impl Protocol {
    fn method(self, method: Method) -> &'static str {
        match (self, method) {
            (Protocol::V1, Method::Send) => "SendMessage",
            (Protocol::V1, Method::Get) => "GetTask",
            (Protocol::V1, Method::Cancel) => "CancelTask",
            (Protocol::V03, Method::Send) => "message/send",
            (Protocol::V03, Method::Get) => "tasks/get",
            (Protocol::V03, Method::Cancel) => "tasks/cancel",
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Method {
    Send,
    Get,
    Cancel,
}

/// An agent's endpoint, as its card said.
#[derive(Debug, Clone)]
struct Card {
    endpoint: Url,
    protocol: Protocol,
    fetched: Instant,
}

/// The cards of one catalog's A2A tools, by card URL.
#[derive(Debug, Default)]
pub struct Cards(Mutex<HashMap<String, Card>>);

impl Cards {
    fn get(&self, url: &Url) -> Option<Card> {
        let cards = self.0.lock().unwrap_or_else(|p| p.into_inner());
        cards
            .get(url.as_str())
            .filter(|card| card.fetched.elapsed() < CARD_TTL)
            .cloned()
    }

    fn put(&self, url: &Url, card: Card) {
        let mut cards = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if cards.len() >= MAX_CARDS {
            cards.clear();
        }
        cards.insert(url.as_str().to_owned(), card);
    }

    fn forget(&self, url: &Url) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(url.as_str());
    }
}

/// Runs one call of an A2A tool.
pub(super) async fn run(
    http: &HttpExecutor,
    tool: &A2aTarget,
    permit: &Permit,
) -> Result<String, ExecError> {
    let upstream = http.upstream_named(&tool.upstream)?;
    let _slot = upstream.slot()?;
    upstream.may_reach(&tool.card_url)?;
    // The caller's credential, before anything is sent: without one, the agent is not called.
    http.authenticate_on(upstream, permit).await?;
    let card = match http.agent_cards.get(&tool.card_url) {
        Some(card) => card,
        None => {
            let card = fetch_card(upstream, tool, permit).await?;
            http.agent_cards.put(&tool.card_url, card.clone());
            card
        }
    };
    let agent = Agent {
        upstream,
        card: &card,
        permit,
    };
    let params = send_params(
        card.protocol,
        message_text(tool, permit.arguments())?,
        permit.delegation(),
    );
    let result = match agent.rpc(Method::Send, params).await {
        Ok(result) => result,
        Err(err) => {
            // The endpoint may have moved: the next call reads the card again.
            if matches!(err, ExecError::NotReached(_)) {
                http.agent_cards.forget(&tool.card_url);
            }
            return Err(err);
        }
    };
    let mut task = match Answer::read(card.protocol, result) {
        Some(Answer::Message(message)) => return Ok(parts_text(&message["parts"])),
        Some(Answer::Task(task)) => task,
        None => return Err(agent.not_a2a()),
    };
    let Some(id) = task.get("id").and_then(Value::as_str).map(str::to_owned) else {
        return Err(agent.not_a2a());
    };
    // From here on, the task is cancelled unless it ended: the call dropped (cancelled, or past
    // its deadline) or an error below.
    let mut cancel = agent.cancel_on_drop(&id);
    let mut wait = FIRST_POLL;
    loop {
        match state(&task).as_deref() {
            Some("completed") => {
                cancel.disarm();
                return Ok(task_output(&task));
            }
            Some(ended @ ("failed" | "rejected" | "canceled")) => {
                cancel.disarm();
                let said = parts_text(&task["status"]["message"]["parts"]);
                return Err(ExecError::failed_with(
                    format!(
                        "the agent at upstream {} {} the task",
                        upstream.name,
                        match ended {
                            "failed" => "failed",
                            "rejected" => "rejected",
                            _ => "canceled",
                        }
                    ),
                    said,
                ));
            }
            Some(asks @ ("input-required" | "auth-required")) => {
                let said = parts_text(&task["status"]["message"]["parts"]);
                return Err(ExecError::failed_with(
                    format!(
                        "the agent at upstream {} asked for {} toolgate cannot give; its task was cancelled",
                        upstream.name,
                        if asks == "input-required" {
                            "input"
                        } else {
                            "authorization"
                        }
                    ),
                    said,
                ));
            }
            Some("submitted" | "working") => {}
            _ => return Err(agent.not_a2a()),
        }
        // Bounded by the call's deadline: the boundary drops this future when it passes.
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(MAX_POLL);
        // Both protocols answer the task itself.
        task = agent.rpc(Method::Get, json!({ "id": id })).await?;
    }
}

/// One call's view of its agent.
struct Agent<'a> {
    upstream: &'a Upstream,
    card: &'a Card,
    permit: &'a Permit,
}

impl Agent<'_> {
    /// A JSON-RPC request to the agent's endpoint: its `result`, or the agent's error.
    async fn rpc(&self, method: Method, params: Value) -> Result<Value, ExecError> {
        let body = json!({
            "jsonrpc": "2.0",
            "id": uuid::Uuid::new_v4().to_string(),
            "method": self.card.protocol.method(method),
            "params": params,
        });
        let mut request = self
            .upstream
            .request(
                reqwest::Method::POST,
                self.card.endpoint.clone(),
                self.permit,
            )
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_string());
        if self.card.protocol == Protocol::V1 {
            request = request.header("A2A-Version", "1.0");
        }
        let (status, bytes) = self.upstream.send(request).await?;
        if !status.is_success() {
            return Err(self
                .upstream
                .failure(status, &String::from_utf8_lossy(&bytes)));
        }
        let answer: Value = serde_json::from_slice(&bytes).map_err(|_| self.not_a2a())?;
        if let Some(error) = answer.get("error") {
            let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
            let message = error.get("message").and_then(Value::as_str).unwrap_or("");
            return Err(ExecError::failed_with(
                format!(
                    "the agent at upstream {} answered error {code}",
                    self.upstream.name
                ),
                message,
            ));
        }
        answer.get("result").cloned().ok_or_else(|| self.not_a2a())
    }

    fn not_a2a(&self) -> ExecError {
        ExecError::failed(format!(
            "the agent at upstream {} answered something that is not A2A",
            self.upstream.name
        ))
    }

    /// A guard that cancels task `id` when dropped armed.
    fn cancel_on_drop(&self, id: &str) -> CancelOnDrop {
        let (client, mut headers) = self.upstream.detached();
        if let Some(credential) = self.permit.issued_credential() {
            headers.insert(reqwest::header::AUTHORIZATION, credential.header().clone());
        }
        if let Some(traceparent) = self
            .permit
            .traceparent()
            .and_then(|t| HeaderValue::from_str(t).ok())
        {
            headers.insert("traceparent", traceparent);
        }
        if self.card.protocol == Protocol::V1 {
            headers.insert("A2A-Version", HeaderValue::from_static("1.0"));
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        CancelOnDrop(Some(Cancel {
            client,
            headers,
            endpoint: self.card.endpoint.clone(),
            body: json!({
                "jsonrpc": "2.0",
                "id": uuid::Uuid::new_v4().to_string(),
                "method": self.card.protocol.method(Method::Cancel),
                "params": { "id": id },
            })
            .to_string(),
            upstream: self.upstream.name.clone(),
        }))
    }
}

/// Reads the agent's card: where its JSON-RPC endpoint is, and which protocol it speaks.
async fn fetch_card(
    upstream: &Upstream,
    tool: &A2aTarget,
    permit: &Permit,
) -> Result<Card, ExecError> {
    let request = upstream.request(reqwest::Method::GET, tool.card_url.clone(), permit);
    let (status, bytes) = upstream.send(request).await?;
    if !status.is_success() {
        return Err(upstream.failure(status, &String::from_utf8_lossy(&bytes)));
    }
    let no_card = |why: &str| {
        ExecError::Misconfigured(format!(
            "the agent card at upstream {} {why}",
            upstream.name
        ))
    };
    let card: Value = serde_json::from_slice(&bytes).map_err(|_| no_card("is not JSON"))?;
    let (endpoint, protocol) = endpoint_of(&card)
        .ok_or_else(|| no_card("names no JSON-RPC endpoint of A2A 1.0 or 0.3"))?;
    let endpoint =
        Url::parse(endpoint).map_err(|_| no_card("names an endpoint that is not a URL"))?;
    if endpoint.origin() != upstream.base().origin() {
        return Err(ExecError::Refused(format!(
            "the agent card at upstream {} names an endpoint on another origin; agents are called only at their upstream",
            upstream.name
        )));
    }
    upstream.may_reach(&endpoint)?;
    Ok(Card {
        endpoint,
        protocol,
        fetched: Instant::now(),
    })
}

/// The card's JSON-RPC endpoint: A2A 1.0's `supportedInterfaces`, else a 0.3 card's `url`.
fn endpoint_of(card: &Value) -> Option<(&str, Protocol)> {
    let v1 = card["supportedInterfaces"]
        .as_array()
        .and_then(|interfaces| {
            interfaces.iter().find(|i| {
                i["protocolBinding"].as_str() == Some("JSONRPC")
                    && i["protocolVersion"]
                        .as_str()
                        .is_some_and(|v| v == "1.0" || v.starts_with("1."))
            })
        });
    if let Some(url) = v1.and_then(|i| i["url"].as_str()) {
        return Some((url, Protocol::V1));
    }
    let v03 = card["protocolVersion"]
        .as_str()
        .is_some_and(|v| v.starts_with("0.3"))
        && card["preferredTransport"]
            .as_str()
            .is_none_or(|t| t.eq_ignore_ascii_case("JSONRPC"));
    match (v03, card["url"].as_str()) {
        (true, Some(url)) => Some((url, Protocol::V03)),
        _ => None,
    }
}

/// The message's text: the tool's message argument, or the arguments as JSON text.
fn message_text(tool: &A2aTarget, arguments: &Value) -> Result<String, ExecError> {
    match &tool.message_argument {
        Some(name) => arguments
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| ExecError::BadArguments(format!("the argument {name} is not a string"))),
        None => Ok(arguments.to_string()),
    }
}

/// The message: its text, and a handoff's delegation in its metadata (for the sub-agent's
/// runtime, not its model).
fn send_params(protocol: Protocol, text: String, delegation: Option<&str>) -> Value {
    let id = uuid::Uuid::new_v4().to_string();
    let mut params = match protocol {
        Protocol::V1 => json!({
            "message": { "role": "ROLE_USER", "messageId": id, "parts": [{ "text": text }] },
            "configuration": { "returnImmediately": true },
        }),
        Protocol::V03 => json!({
            "message": {
                "kind": "message", "role": "user", "messageId": id,
                "parts": [{ "kind": "text", "text": text }],
            },
            "configuration": { "blocking": false },
        }),
    };
    if let Some(token) = delegation {
        params["message"]["metadata"] =
            json!({ crate::identity::delegation::DELEGATION_HEADER: token });
    }
    params
}

/// What `SendMessage` answered.
enum Answer {
    Task(Value),
    Message(Value),
}

impl Answer {
    fn read(protocol: Protocol, result: Value) -> Option<Answer> {
        match protocol {
            Protocol::V1 => {
                let Value::Object(mut result) = result else {
                    return None;
                };
                if let Some(task) = result.remove("task") {
                    return Some(Answer::Task(task));
                }
                result.remove("message").map(Answer::Message)
            }
            Protocol::V03 => match result["kind"].as_str() {
                Some("task") => Some(Answer::Task(result)),
                Some("message") => Some(Answer::Message(result)),
                _ => None,
            },
        }
    }
}

/// A task's state in 0.3's spelling (`TASK_STATE_INPUT_REQUIRED` is `input-required`).
fn state(task: &Value) -> Option<String> {
    let state = task["status"]["state"].as_str()?;
    Some(
        state
            .strip_prefix("TASK_STATE_")
            .unwrap_or(state)
            .to_ascii_lowercase()
            .replace('_', "-"),
    )
}

/// A completed task's output: its artifacts' parts, or else its status message's.
fn task_output(task: &Value) -> String {
    let artifacts: Vec<String> = task["artifacts"]
        .as_array()
        .map(|artifacts| {
            artifacts
                .iter()
                .map(|a| parts_text(&a["parts"]))
                .filter(|t| !t.is_empty())
                .collect()
        })
        .unwrap_or_default();
    match artifacts.is_empty() {
        true => parts_text(&task["status"]["message"]["parts"]),
        false => artifacts.join("\n"),
    }
}

/// Text parts as they are, data parts as JSON, one per line; other parts (files) are not
/// passed on.
fn parts_text(parts: &Value) -> String {
    parts
        .as_array()
        .map(|parts| {
            parts
                .iter()
                .filter_map(|part| match (part.get("text"), part.get("data")) {
                    (Some(Value::String(text)), _) => Some(text.clone()),
                    (_, Some(data)) => Some(data.to_string()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// A task's cancel, sent from a task of its own once its call is gone.
struct Cancel {
    client: reqwest::Client,
    headers: HeaderMap,
    endpoint: Url,
    body: String,
    upstream: String,
}

/// Cancels its task when dropped armed: the call was cancelled, timed out or failed while the
/// task may still run.
struct CancelOnDrop(Option<Cancel>);

impl CancelOnDrop {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(cancel) = self.0.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let sent = cancel
                .client
                .post(cancel.endpoint)
                .headers(cancel.headers)
                .body(cancel.body)
                .timeout(CANCEL_TIMEOUT)
                .send()
                .await;
            match sent {
                Ok(response) if response.status().is_success() => {
                    tracing::debug!(upstream = %cancel.upstream, "an A2A task was cancelled with its call");
                }
                Ok(response) => {
                    tracing::warn!(upstream = %cancel.upstream, status = %response.status(), "an A2A task's cancel was refused");
                }
                Err(err) => {
                    tracing::warn!(upstream = %cancel.upstream, error = %err, "an A2A task could not be cancelled");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cards_of_both_protocols_name_their_endpoint() {
        let v1 = json!({"supportedInterfaces": [
            {"url": "http://a/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
            {"url": "http://a/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]});
        assert_eq!(endpoint_of(&v1), Some(("http://a/rpc", Protocol::V1)));
        let v03 = json!({"url": "http://a/v03", "protocolVersion": "0.3.0"});
        assert_eq!(endpoint_of(&v03), Some(("http://a/v03", Protocol::V03)));
        let rest_only = json!({"url": "http://a/", "protocolVersion": "0.3.0", "preferredTransport": "HTTP+JSON"});
        assert_eq!(endpoint_of(&rest_only), None);
        assert_eq!(endpoint_of(&json!("nonsense")), None);
    }

    #[test]
    fn states_read_alike_in_both_spellings_and_output_joins_parts() {
        assert_eq!(
            state(&json!({"status": {"state": "TASK_STATE_INPUT_REQUIRED"}})).as_deref(),
            Some("input-required")
        );
        assert_eq!(
            state(&json!({"status": {"state": "completed"}})).as_deref(),
            Some("completed")
        );
        let task = json!({"artifacts": [
            {"parts": [{"text": "a"}, {"kind": "data", "data": {"n": 1}}]},
            {"parts": [{"kind": "file", "file": {"uri": "x"}}]}]});
        assert_eq!(task_output(&task), "a\n{\"n\":1}");
    }
}
