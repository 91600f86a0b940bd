//! The `a2a` executor against a real A2A agent built with `a2a-sdk` (PyPI; tests/fixtures/a2a/
//! agent.py), over both protocols it speaks: A2A 1.0 (`SendMessage` with `A2A-Version: 1.0`,
//! the card's `supportedInterfaces`) and 0.3 (`message/send`, a 0.3 card). A completed task's
//! artifacts are the output; a failed, rejected or input-asking task is a clear `tool_failed`;
//! a call that times out or is cancelled by its client cancels the agent's task (`CancelTask`);
//! a card that names an endpoint off its upstream is refused before anything is sent there.

use std::time::Duration;

use serde_json::Value;
use toolgate::proto::{self, ToolStatus};

use crate::support::{TestServer, call, execute_request, python, spawn_listening, who, within};

pub(crate) struct Agent {
    pub(crate) url: String,
    http: reqwest::Client,
    _child: tokio::process::Child,
}

impl Agent {
    pub(crate) async fn start(args: &[&str]) -> Agent {
        let (port, child) = spawn_listening(
            tokio::process::Command::new(python())
                .arg(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/fixtures/a2a/agent.py"
                ))
                .args(args)
                .stderr(std::process::Stdio::null()),
        )
        .await;
        toolgate::tls::install_crypto_provider();
        Agent {
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            _child: child,
        }
    }

    async fn get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Every JSON-RPC request the agent received.
    pub(crate) async fn seen(&self) -> Vec<Value> {
        self.get("/_seen")
            .await
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The tasks the agent was asked to cancel, once there are `count` of them.
    async fn cancelled(&self, count: usize) -> Vec<String> {
        within(Duration::from_secs(20), "the agent's task cancels", async {
            loop {
                let cancelled: Vec<String> =
                    serde_json::from_value(self.get("/_cancelled").await).unwrap();
                if cancelled.len() >= count {
                    return cancelled;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
    }
}

fn catalog(agent: &Agent) -> String {
    format!(
        r#"version: 1
identity: {{ dev_identity: true }}
tenants: {{ acme: {{}} }}
upstreams:
  research: {{ url: "{url}", allow_schemes: [http], allow_private_addresses: true, headers: {{ x-agent-key: {{ value: k-1 }} }} }}
tools:
  - name: research
    description: Hands a question to the research agent.
    risk_level: read_only
    timeout: 2s
    executor: {{ a2a: {{ upstream: research, message_argument: question }} }}
    input_schema: {{ type: object, properties: {{ question: {{ type: string }} }}, required: [question] }}
  - name: research_v03
    description: The same agent, as its 0.3 card describes it.
    risk_level: read_only
    executor: {{ a2a: {{ upstream: research, card_path: /v03/agent-card.json, message_argument: question }} }}
    input_schema: {{ type: object, properties: {{ question: {{ type: string }} }}, required: [question] }}
  - name: research_json
    description: The arguments as the message.
    risk_level: read_only
    executor: {{ a2a: {{ upstream: research }} }}
    input_schema: {{ type: object }}
"#,
        url = agent.url
    )
}

async fn ask(server: &TestServer, tool: &str, question: &str) -> proto::ToolResult {
    let mut client = server.client().await;
    let args = serde_json::json!({ "question": question }).to_string();
    crate::support::exec(&mut client, &who("acme"), call(tool, &args)).await
}

#[tokio::test]
async fn a_completed_task_is_the_output_over_both_protocols() {
    let agent = Agent::start(&[]).await;
    let server = TestServer::start(&catalog(&agent)).await;
    let r = ask(&server, "research", "echo the capital of France").await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    assert_eq!(r.model_text, "echo: the capital of France");
    let r = ask(&server, "research_v03", "echo in 0.3").await;
    assert_eq!(r.status(), ToolStatus::Ok, "{r:?}");
    assert_eq!(r.model_text, "echo: in 0.3", "{r:?}");
    // An answer that is a message, not a task.
    let r = ask(&server, "research", "message hello").await;
    assert_eq!(
        (r.status(), r.model_text.as_str()),
        (ToolStatus::Ok, "said: hello")
    );
    // Without a message argument, the arguments are the message, as JSON.
    let mut client = server.client().await;
    let r = crate::support::exec(
        &mut client,
        &who("acme"),
        call("research_json", r#"{"b":1,"a":"x"}"#),
    )
    .await;
    assert_eq!(r.model_text, r#"{"a":"x","b":1}"#, "{r:?}");
    let seen = agent.seen().await;
    let methods: Vec<&str> = seen
        .iter()
        .filter_map(|r| r["body"]["method"].as_str())
        .collect();
    assert!(
        methods.contains(&"SendMessage") && methods.contains(&"message/send"),
        "{methods:?}"
    );
    let first = &seen[0];
    assert_eq!(first["headers"]["a2a-version"], "1.0", "{first}");
    assert_eq!(
        first["headers"]["x-agent-key"], "k-1",
        "the upstream's headers go along"
    );
    assert!(
        first["headers"]["x-toolgate-call-id"].is_string(),
        "{first}"
    );
    let message = &first["body"]["params"]["message"];
    assert_eq!(message["role"], "ROLE_USER");
    assert_eq!(message["parts"][0]["text"], "echo the capital of France");
    server.stop().await;
}

#[tokio::test]
async fn a_task_that_fails_is_refused_or_asks_for_input_is_a_clear_failure() {
    let agent = Agent::start(&[]).await;
    let server = TestServer::start(&catalog(&agent)).await;
    let r = ask(&server, "research", "fail no sources").await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Error, "tool_failed"),
        "{r:?}"
    );
    assert!(
        r.error_message
            .contains("the agent at upstream research failed the task")
            && r.error_message.contains("failing: no sources"),
        "{}",
        r.error_message
    );
    let r = ask(&server, "research_v03", "reject it").await;
    assert_eq!(r.error_type, "tool_failed", "{r:?}");
    assert!(
        r.error_message.contains("rejected the task"),
        "{}",
        r.error_message
    );
    // A task that asks for input cannot get it: it is cancelled.
    let r = ask(&server, "research", "ask which order").await;
    assert_eq!(r.error_type, "tool_failed", "{r:?}");
    assert!(
        r.error_message
            .contains("asked for input toolgate cannot give")
            && r.error_message.contains("which order?"),
        "{}",
        r.error_message
    );
    assert_eq!(agent.cancelled(1).await.len(), 1);
    // The agent's JSON-RPC error reaches the model with its code.
    let r = ask(&server, "research", "crash now").await;
    assert_eq!(r.error_type, "tool_failed", "{r:?}");
    assert!(
        r.error_message.contains("answered error -32603"),
        "{}",
        r.error_message
    );
    server.stop().await;
}

/// The call's deadline passes (the tool's 2 s), and its client cancels another: each cancels
/// its task at the agent.
#[tokio::test]
async fn a_call_that_times_out_or_is_cancelled_cancels_the_agents_task() {
    let agent = Agent::start(&[]).await;
    let server = TestServer::start(&catalog(&agent)).await;
    let r = ask(&server, "research", "slow and steady").await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Timeout, "timeout"),
        "{r:?}"
    );
    let task = |seen: &[Value], i: usize| -> String {
        seen.iter()
            .filter(|r| r["body"]["method"] == "CancelTask")
            .nth(i)
            .map(|r| r["body"]["params"]["id"].as_str().unwrap_or("").to_owned())
            .unwrap_or_default()
    };
    let cancelled = agent.cancelled(1).await;
    assert_eq!(cancelled, [task(&agent.seen().await, 0)]);
    // The client gives up while the task runs.
    let mut client = server.client().await;
    let mut request = execute_request(call("research", r#"{"question":"slow again"}"#));
    request.run_id = "r-cancel".into();
    let running =
        tokio::spawn(async move { client.execute_tool(who("acme").request(request)).await });
    within(Duration::from_secs(20), "the second task starts", async {
        loop {
            let polled = agent
                .seen()
                .await
                .iter()
                .filter(|r| r["body"]["method"] == "GetTask")
                .count();
            let sent = agent
                .seen()
                .await
                .iter()
                .any(|r| r["body"]["params"]["message"]["parts"][0]["text"] == "slow again");
            if sent && polled > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    running.abort();
    let cancelled = agent.cancelled(2).await;
    assert_eq!(cancelled[1], task(&agent.seen().await, 1));
    server.stop().await;
}

#[tokio::test]
async fn a_card_naming_an_endpoint_off_its_upstream_is_refused_before_anything_is_sent() {
    let elsewhere = Agent::start(&[]).await;
    let agent = Agent::start(&["--card-url", &format!("{}/a2a", elsewhere.url)]).await;
    let server = TestServer::start(&catalog(&agent)).await;
    let r = ask(&server, "research", "echo hi").await;
    assert_eq!(
        (r.status(), r.error_type.as_str()),
        (ToolStatus::Denied, "destination_refused"),
        "{r:?}"
    );
    assert!(
        r.error_message.contains("another origin"),
        "{}",
        r.error_message
    );
    assert!(elsewhere.seen().await.is_empty() && agent.seen().await.is_empty());
    server.stop().await;
}
