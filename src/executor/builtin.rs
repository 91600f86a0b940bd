//! Tools built into toolgate, used by the embedded demo and by tests: `echo`, `echo_arguments`
//! (returns the arguments the backend received, for checking bindings), `rag_search` over a
//! small embedded corpus, in-memory tickets, `refund_order` and `slow_task`. Their state lives in
//! one [`Builtins`] per server; nothing is global.

use std::{
    collections::BTreeMap,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::{FutureExt, future::BoxFuture};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::{ExecError, Executor};
use crate::{
    boundary::Permit,
    canonical,
    catalog::{BackendSpec, BuiltinTool},
};

/// One document of the demo corpus.
struct Document {
    id: &'static str,
    tenant: &'static str,
    title: &'static str,
    text: &'static str,
}

const CORPUS: &[Document] = &[
    Document {
        id: "acme-1",
        tenant: "acme",
        title: "Acme refund policy",
        text: "Acme refunds orders within 30 days of delivery. Refunds over 500 dollars need a manager.",
    },
    Document {
        id: "acme-2",
        tenant: "acme",
        title: "Acme shipping times",
        text: "Acme ships within 2 business days; express shipping arrives the next day.",
    },
    Document {
        id: "acme-3",
        tenant: "acme",
        title: "Acme password reset",
        text: "To reset an Acme account password, use the account page and follow the emailed link.",
    },
    Document {
        id: "globex-1",
        tenant: "globex",
        title: "Globex refund policy",
        text: "Globex refunds orders within 14 days. Secret: Globex margin on refunds is 42 percent.",
    },
    Document {
        id: "globex-2",
        tenant: "globex",
        title: "Globex shipping times",
        text: "Globex ships from three warehouses; standard shipping takes 5 business days.",
    },
    Document {
        id: "globex-3",
        tenant: "globex",
        title: "Globex support hours",
        text: "Globex support answers tickets weekdays from 8 to 18 CET.",
    },
];

/// A ticket in the in-memory demo store.
#[derive(Debug, Clone, serde::Serialize)]
struct Ticket {
    id: String,
    title: String,
    body: String,
    status: &'static str,
    created_by: String,
}

/// State of the builtin tools of one server.
#[derive(Debug)]
pub struct Builtins {
    /// (tenant, ticket id) -> ticket.
    tickets: Mutex<BTreeMap<(String, String), Ticket>>,
    next_ticket: AtomicU64,
    slow_tasks_finished: AtomicU64,
    /// Executions started, observable so callers can wait for "the tool is running".
    started: watch::Sender<u64>,
    /// `slow_task` sleeps running now; a guard decrements it when the sleep ends or is dropped.
    slow_in_flight: watch::Sender<u64>,
    slow_max_in_flight: AtomicU64,
}

impl Default for Builtins {
    fn default() -> Self {
        Builtins {
            tickets: Mutex::default(),
            next_ticket: AtomicU64::default(),
            slow_tasks_finished: AtomicU64::default(),
            started: watch::channel(0).0,
            slow_in_flight: watch::channel(0).0,
            slow_max_in_flight: AtomicU64::default(),
        }
    }
}

/// Counts one running `slow_task` for as long as it lives.
struct InFlight<'a>(&'a Builtins);

impl<'a> InFlight<'a> {
    fn enter(builtins: &'a Builtins) -> Self {
        let mut now = 0;
        builtins.slow_in_flight.send_modify(|n| {
            *n += 1;
            now = *n;
        });
        builtins.slow_max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(builtins)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0
            .slow_in_flight
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Builtins {
    /// How many `slow_task` sleeps ran to completion (cancelled ones do not count).
    pub fn slow_tasks_finished(&self) -> u64 {
        self.slow_tasks_finished.load(Ordering::SeqCst)
    }

    /// How many builtin executions started.
    pub fn executions(&self) -> u64 {
        *self.started.borrow()
    }

    /// Watches the number of executions started.
    pub fn watch_executions(&self) -> watch::Receiver<u64> {
        self.started.subscribe()
    }

    /// Watches the number of `slow_task` sleeps running now.
    pub fn watch_slow_in_flight(&self) -> watch::Receiver<u64> {
        self.slow_in_flight.subscribe()
    }

    /// The most `slow_task` sleeps that ever ran at once.
    pub fn slow_max_in_flight(&self) -> u64 {
        self.slow_max_in_flight.load(Ordering::SeqCst)
    }

    async fn run(&self, permit: &Permit) -> Result<String, ExecError> {
        let args = permit.arguments();
        let BackendSpec::Builtin(tool) = permit.tool().backend else {
            return Err(ExecError::failed("not a builtin tool"));
        };
        self.started.send_modify(|n| *n += 1);
        match tool {
            BuiltinTool::Echo => Ok(str_arg(args, "text")?.to_owned()),
            // The arguments exactly as the backend receives them: after validation and binding.
            BuiltinTool::EchoArguments => Ok(canonical::to_string(args)),
            BuiltinTool::RagSearch => rag_search(args),
            BuiltinTool::QueryTicket => {
                let key = (
                    str_arg(args, "tenant")?.to_owned(),
                    str_arg(args, "ticket_id")?.to_owned(),
                );
                let tickets = self.tickets.lock().map_err(|_| poisoned())?;
                let ticket = tickets
                    .get(&key)
                    .ok_or_else(|| ExecError::failed(format!("ticket {} not found", key.1)))?;
                Ok(json!(ticket).to_string())
            }
            BuiltinTool::CreateTicket => {
                let tenant = str_arg(args, "tenant")?.to_owned();
                let id = format!(
                    "T-{}",
                    1000 + self.next_ticket.fetch_add(1, Ordering::SeqCst)
                );
                let ticket = Ticket {
                    id: id.clone(),
                    title: str_arg(args, "title")?.to_owned(),
                    body: args
                        .get("body")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                    status: "draft",
                    created_by: permit.caller().subject.clone(),
                };
                let out = json!(ticket).to_string();
                self.tickets
                    .lock()
                    .map_err(|_| poisoned())?
                    .insert((tenant, id), ticket);
                Ok(out)
            }
            BuiltinTool::DeleteTicket => {
                let key = (
                    str_arg(args, "tenant")?.to_owned(),
                    str_arg(args, "ticket_id")?.to_owned(),
                );
                let removed = self.tickets.lock().map_err(|_| poisoned())?.remove(&key);
                match removed {
                    Some(_) => Ok(json!({"deleted": key.1}).to_string()),
                    None => Err(ExecError::failed(format!("ticket {} not found", key.1))),
                }
            }
            BuiltinTool::RefundOrder => {
                let order = str_arg(args, "order_id")?;
                let amount = count_arg(args, "amount_cents")?
                    .ok_or_else(|| ExecError::failed("missing argument \"amount_cents\""))?;
                Ok(
                    json!({"refunded": order, "amount_cents": amount, "status": "refunded"})
                        .to_string(),
                )
            }
            #[cfg(feature = "test-faults")]
            BuiltinTool::Panic => panic!("the panic builtin was called"),
            BuiltinTool::SlowTask => {
                let ms = count_arg(args, "ms")?.unwrap_or(0);
                let _running = InFlight::enter(self);
                // Dropping this future (timeout, client cancel) stops the sleep; the counter only
                // moves for sleeps that ran to the end.
                tokio::time::sleep(Duration::from_millis(ms)).await;
                self.slow_tasks_finished.fetch_add(1, Ordering::SeqCst);
                Ok(json!({"slept_ms": ms}).to_string())
            }
        }
    }
}

impl Executor for Builtins {
    fn execute<'a>(&'a self, permit: &'a Permit) -> BoxFuture<'a, Result<String, ExecError>> {
        self.run(permit).boxed()
    }
}

fn poisoned() -> ExecError {
    ExecError::failed("ticket store unavailable")
}

fn str_arg<'a>(args: &'a Value, key: &str) -> Result<&'a str, ExecError> {
    args.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ExecError::failed(format!("missing string argument {key:?}")))
}

/// A whole, non-negative number argument, if present. Anything else present is refused, never
/// read as 0: a tool that quietly turned `2500.5` or `"2500"` into nothing would act on a value
/// nobody approved.
fn count_arg(args: &Value, key: &str) -> Result<Option<u64>, ExecError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or_else(|| {
            ExecError::failed(format!(
                "argument {key:?} must be a whole number of at least 0"
            ))
        }),
    }
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 1)
        .map(str::to_lowercase)
}

/// Keyword search over the corpus, restricted to the bound tenant filter.
fn rag_search(args: &Value) -> Result<String, ExecError> {
    let query = str_arg(args, "query")?;
    // The tenant comes from the caller's identity via a binding; never search without it.
    let tenant = args
        .pointer("/filter/tenant")
        .and_then(Value::as_str)
        .ok_or_else(|| ExecError::failed("search has no tenant filter"))?;
    let top_k = usize::try_from(count_arg(args, "top_k")?.unwrap_or(3)).unwrap_or(usize::MAX);
    let terms: Vec<String> = words(query).collect();
    let mut hits: Vec<(usize, &Document)> = CORPUS
        .iter()
        .filter(|d| d.tenant == tenant)
        .map(|d| {
            let score = words(d.title)
                .chain(words(d.text))
                .filter(|w| terms.contains(w))
                .count();
            (score, d)
        })
        .filter(|(score, _)| *score > 0)
        .collect();
    hits.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.id.cmp(b.1.id)));
    let results: Vec<Value> = hits
        .into_iter()
        .take(top_k)
        .map(|(score, d)| json!({"id": d.id, "title": d.title, "text": d.text, "score": score}))
        .collect();
    Ok(json!({"results": results}).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rag_search_only_returns_the_filtered_tenant() {
        let out =
            rag_search(&json!({"query": "refund policy", "filter": {"tenant": "acme"}})).unwrap();
        assert!(out.contains("acme-1"), "{out}");
        assert!(!out.contains("globex"), "{out}");
        assert!(rag_search(&json!({"query": "refund"})).is_err());
        let unreadable = json!({"query": "refund", "filter": {"tenant": "acme"}, "top_k": 2.5});
        assert!(rag_search(&unreadable).is_err());
    }
}
