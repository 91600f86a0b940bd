//! The operator client verbs of the real binary (`toolgate tools`, `call`, `approvals`,
//! `approve`, `reject`, `schema`) against the real binary serving the demo; and YAML past the size
//! and nesting bounds, refused unparsed by `check`, `test` and a reload.
//!
//! The README's "Try it" session is read from README.md when the test runs and replayed command
//! by command, exactly as written (through `sh`, with `toolgate` on PATH and `TOOLGATE_ADDR`
//! pointing at the server); each command's output must equal the README's once approval ids and
//! call durations are masked. So the README cannot drift from what the binary prints.

pub(crate) mod catalog_tests;
pub(crate) mod edges;

use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;

use crate::support::binary::spawn;

/// The first console block under a heading of a Markdown file of the repository (e.g.
/// `doc_session("README.md", "## Try it")`): (command, expected stdout) in order.
pub(crate) fn doc_session(file: &str, heading: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .unwrap_or_else(|err| panic!("{file}: {err}"));
    let section = text
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("a {heading:?} section in {file}"))
        .1;
    let block = section
        .split_once("```console\n")
        .unwrap_or_else(|| panic!("a console block in {heading:?} of {file}"))
        .1
        .split_once("\n```")
        .expect("the console block ends")
        .0;
    let mut session: Vec<(String, String)> = Vec::new();
    for line in block.lines() {
        if let Some(command) = line.strip_prefix("$ ") {
            session.push((command.to_owned(), String::new()));
        } else if let Some((_, output)) = session.last_mut() {
            output.push_str(line);
            output.push('\n');
        } else {
            panic!("the console block starts with output, not a command: {line}");
        }
    }
    for (_, output) in &mut session {
        *output = output.trim_end().to_owned();
    }
    assert!(!session.is_empty(), "{session:?}");
    session
}

/// The first `apr_` id (32 hex digits) in `text`.
fn approval_id(text: &str) -> Option<&str> {
    text.match_indices("apr_").find_map(|(at, _)| {
        let id = text.get(at..at + 36)?;
        id[4..].chars().all(|c| c.is_ascii_hexdigit()).then_some(id)
    })
}

/// What varies from run to run: approval ids, and the duration in `(call ID, N ms`.
pub(crate) fn masked(text: &str) -> String {
    let mut out = text.to_owned();
    while let Some(id) = approval_id(&out) {
        out = out.replace(id, "apr_<id>");
    }
    let mut result = String::new();
    for line in out.lines() {
        let line = match line.split_once("(call ") {
            Some((head, rest)) => match rest.split_once(", ").and_then(|(call_id, tail)| {
                let (number, after) = tail.split_once(" ms")?;
                number
                    .chars()
                    .all(|c| c.is_ascii_digit())
                    .then(|| format!("{head}(call {call_id}, <n> ms{after}"))
            }) {
                Some(line) => line,
                None => line.to_owned(),
            },
            None => line.to_owned(),
        };
        result.push_str(&line);
        result.push('\n');
    }
    result.trim_end().to_owned()
}

/// Runs one command line through `sh`, with the binary under test as `toolgate` on PATH and
/// `TOOLGATE_ADDR` set: (exit code, stdout, stderr).
pub(crate) fn run_shell(command: &str, addr: &str) -> (Option<i32>, String, String) {
    let binary = Path::new(env!("CARGO_BIN_EXE_toolgate"));
    let path = format!(
        "{}:{}",
        binary.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("sh")
        .args(["-c", command])
        .env("PATH", path)
        .env("TOOLGATE_ADDR", format!("http://{addr}"))
        .env_remove("TOOLGATE_TOKEN")
        .output()
        .expect("sh runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `toolgate ARGS` directly: (exit code, stdout, stderr).
fn toolgate(args: &[&str], addr: &str) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(args)
        .env("TOOLGATE_ADDR", format!("http://{addr}"))
        .env_remove("TOOLGATE_TOKEN")
        .output()
        .expect("toolgate runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_readme_try_it_session_is_what_the_binary_prints() {
    let session = doc_session("README.md", "## Try it");
    assert!(session.len() >= 5, "{session:?}");
    let readme_approval = session
        .iter()
        .find_map(|(_, output)| approval_id(output))
        .map(str::to_owned);
    let spawned = spawn(&[]);
    let mut real_approval: Option<String> = None;
    for (command, expected) in &session {
        assert!(command.starts_with("toolgate "), "{command}");
        // The README's approval id is from its own run; this run's replaces it.
        let command = match (&readme_approval, &real_approval) {
            (Some(readme), Some(real)) => command.replace(readme.as_str(), real),
            _ => command.clone(),
        };
        let (code, stdout, stderr) = run_shell(&command, &spawned.addr);
        assert_eq!(
            masked(&stdout),
            masked(expected),
            "`{command}` printed (stderr: {stderr})"
        );
        if real_approval.is_none() {
            real_approval = approval_id(&stdout).map(str::to_owned);
        }
        // `toolgate call` exits 0 on OK and 4 on any other tool status; the others 0.
        let expected_code = match command.split_whitespace().nth(1) {
            Some("call") if !stdout.starts_with("OK ") => 4,
            _ => 0,
        };
        assert_eq!(code, Some(expected_code), "`{command}`: {stdout}{stderr}");
    }
    assert!(
        readme_approval.is_some() && real_approval.is_some(),
        "the session requests an approval"
    );
    crate::support::binary::stop_blocking(spawned);
}

#[test]
fn call_json_approvals_reject_and_exit_codes() {
    let spawned = spawn(&[]);
    let addr = spawned.addr.clone();
    let acme = ["--tenant", "acme"];
    // --json: one object with the result's fields.
    let (code, stdout, _) = toolgate(
        &[
            &["call", "echo", "--args", r#"{"text":"hi"}"#, "--json"][..],
            &acme,
        ]
        .concat(),
        &addr,
    );
    assert_eq!(code, Some(0), "{stdout}");
    let json: Value = serde_json::from_str(stdout.trim()).expect("--json prints one JSON object");
    assert_eq!(
        (
            json["status"].as_str(),
            json["model_text"].as_str(),
            json["call_id"].as_str()
        ),
        (Some("OK"), Some("hi"), Some("tool_step_0_0"))
    );
    // A refusal exits 4, in JSON too.
    let (code, stdout, _) = toolgate(
        &[&["call", "no_such_tool", "--json"][..], &acme].concat(),
        &addr,
    );
    assert_eq!(code, Some(4), "{stdout}");
    let json: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        (json["status"].as_str(), json["error_type"].as_str()),
        (Some("NOT_FOUND"), Some("tool_not_found"))
    );
    // --timeout is the client's deadline.
    let (code, stdout, _) = toolgate(
        &[
            &[
                "call",
                "slow_task",
                "--args",
                r#"{"ms":900}"#,
                "--timeout",
                "300ms",
            ][..],
            &acme,
        ]
        .concat(),
        &addr,
    );
    assert_eq!(code, Some(4), "{stdout}");
    assert!(
        stdout.starts_with("TIMEOUT slow_task") && stdout.contains("the client's deadline"),
        "{stdout}"
    );

    // Two approvals requested; `approvals` lists both, `reject` refuses one through the server.
    let mut ids = Vec::new();
    for order in ["A-1", "A-2"] {
        let args = format!(r#"{{"order_id":"{order}","amount_cents":2500}}"#);
        let (code, stdout, _) = toolgate(
            &[
                &["call", "refund_order", "--args", &args, "--json"][..],
                &acme,
                &["--subject", "alice"],
            ]
            .concat(),
            &addr,
        );
        assert_eq!(code, Some(4));
        let json: Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(json["status"], "APPROVAL_REQUIRED");
        ids.push(json["approval_id"].as_str().unwrap().to_owned());
    }
    let approver = [
        "--tenant",
        "acme",
        "--subject",
        "bob",
        "--scopes",
        "toolgate:approve",
    ];
    let (code, stdout, _) = toolgate(&[&["approvals"][..], &approver].concat(), &addr);
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    for (line, (id, order)) in lines.iter().zip(ids.iter().zip(["A-1", "A-2"])) {
        assert!(
            line.starts_with(&format!("{id}  refund_order v1  by alice (cli)  args "))
                && line.contains(order),
            "{line}"
        );
    }
    let (code, stdout, _) = toolgate(&[&["approvals", "--json"][..], &approver].concat(), &addr);
    assert_eq!(code, Some(0));
    let listed: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        listed
            .iter()
            .map(|a| a["approval_id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ids.iter().map(String::as_str).collect::<Vec<_>>()
    );
    let (code, stdout, _) = toolgate(
        &[
            &["reject", &ids[0], "--reason", "amount unclear"][..],
            &approver,
        ]
        .concat(),
        &addr,
    );
    assert_eq!(code, Some(0));
    assert_eq!(stdout.trim(), format!("{} REJECTED by bob", ids[0]));
    // The server has it as rejected: redeeming it is refused with the approver's reason.
    let (code, stdout, _) = toolgate(
        &[
            &[
                "call",
                "refund_order",
                "--args",
                r#"{"order_id":"A-1","amount_cents":2500}"#,
                "--approval-id",
                &ids[0],
                "--json",
            ][..],
            &acme,
            &["--subject", "alice"],
        ]
        .concat(),
        &addr,
    );
    assert_eq!(code, Some(4));
    let json: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(json["error_type"], "approval_rejected");
    assert!(
        json["error_message"]
            .as_str()
            .unwrap()
            .contains("amount unclear")
    );
    // Only the other one is still pending.
    let (_, stdout, _) = toolgate(&[&["approvals"][..], &approver].concat(), &addr);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.starts_with(&ids[1]), "{stdout}");
    // Deciding without the scope is a gRPC error: exit 1, the code on stderr.
    let (code, _, stderr) = toolgate(
        &["approve", &ids[1], "--tenant", "acme", "--subject", "bob"],
        &addr,
    );
    assert_eq!(code, Some(1));
    assert!(stderr.contains("PermissionDenied"), "{stderr}");
    crate::support::binary::stop_blocking(spawned);

    // Nothing listening: a transport error, exit 1.
    let (_refusing, closed) = crate::support::refusing_port();
    let closed = closed.to_string();
    let (code, stdout, stderr) = toolgate(&["call", "echo", "--tenant", "acme"], &closed);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stderr.contains("cannot connect"), "{stderr}");
}

#[test]
fn token_sends_a_jwt_and_schema_prints_the_published_schema() {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("catalog.yaml");
    let secret = "a-cli-test-secret-that-is-long-enough";
    std::fs::write(
        &config,
        crate::support::demo_with_identity(
            "  dev_identity: false\n  jwt:\n    hs256_secret_env: CLI_TEST_SECRET\n",
        ),
    )
    .unwrap();
    let spawned = crate::support::binary::spawn_with_env(
        &["--config", config.to_str().unwrap()],
        &[("CLI_TEST_SECRET", secret)],
    );
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        + Duration::from_secs(600);
    let token = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &serde_json::json!({"tenant": "acme", "sub": "tokenuser", "exp": exp.as_secs()}),
        &EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap();
    let (code, stdout, stderr) = toolgate(
        &[
            "call",
            "echo",
            "--args",
            r#"{"text":"signed"}"#,
            "--token",
            &token,
        ],
        &spawned.addr,
    );
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("model_text: signed"), "{stdout}");
    // Dev metadata is not trusted here: without the token the call is UNAUTHENTICATED (exit 1).
    let (code, _, stderr) = toolgate(&["call", "echo", "--tenant", "acme"], &spawned.addr);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("Unauthenticated"), "{stderr}");
    crate::support::binary::stop_blocking(spawned);

    // `toolgate schema` prints the published JSON Schema of the catalog format.
    let (code, stdout, _) = toolgate(&["schema"], "127.0.0.1:1");
    assert_eq!(code, Some(0));
    let printed: Value = serde_json::from_str(&stdout).unwrap();
    let published: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(printed, published);
}

/// The demo catalog with one more tool whose input schema nests `depth` flow sequences: what made
/// the YAML parser's work grow with the square of the depth (20,000 levels: 9 s in `check`).
fn deeply_nested_catalog(depth: usize) -> String {
    format!(
        "{}  - name: deep\n    description: d\n    risk_level: read_only\n    executor: {{ builtin: echo }}\n    input_schema: {{ type: object, default: {}{} }}\n",
        toolgate::settings::DEMO_CATALOG,
        "[".repeat(depth),
        "]".repeat(depth)
    )
}

const DEPTH_REFUSAL: &str =
    "collections nested more than 128 levels deep; at most 128 are accepted";

#[test]
fn check_and_test_refuse_yaml_past_the_size_and_nesting_bounds_unparsed() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(path("deep.yaml"), deeply_nested_catalog(20_000)).unwrap();
    // Within the bounds: 100 levels load (as far as the YAML goes).
    std::fs::write(path("fine.yaml"), deeply_nested_catalog(100)).unwrap();
    // A file of comments only, one byte over 16 MiB.
    std::fs::write(path("big.yaml"), "#".repeat(16 * 1024 * 1024 + 1)).unwrap();
    std::fs::write(path("demo.yaml"), toolgate::settings::DEMO_CATALOG).unwrap();
    let cases = format!(
        "version: 1\ncases:\n  - name: deep\n    identity: {{ tenant: acme }}\n    call: {{ name: echo, arguments: {{ text: {}{} }} }}\n    expect: {{ status: OK }}\n",
        "[".repeat(20_000),
        "]".repeat(20_000)
    );
    std::fs::write(path("deep.tests.yaml"), cases).unwrap();
    std::fs::write(path("big.tests.yaml"), "#".repeat(16 * 1024 * 1024 + 1)).unwrap();

    let (code, _, err) = toolgate(&["check", "--config", &path("deep.yaml")], "127.0.0.1:1");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(DEPTH_REFUSAL), "{err}");
    let (code, out, err) = toolgate(&["check", "--config", &path("fine.yaml")], "127.0.0.1:1");
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, _, err) = toolgate(&["check", "--config", &path("big.yaml")], "127.0.0.1:1");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("the file is over 16 MiB"), "{err}");

    for tests in ["deep.tests.yaml", "big.tests.yaml"] {
        let (code, out, err) = toolgate(
            &["test", "--config", &path("demo.yaml"), &path(tests)],
            "127.0.0.1:1",
        );
        assert_eq!(code, Some(1), "{tests}: {out}{err}");
        let expected = if tests.starts_with("deep") {
            DEPTH_REFUSAL
        } else {
            "the file is over 16 MiB"
        };
        assert!(err.contains(expected), "{tests}: {out}{err}");
    }
}

#[tokio::test]
async fn a_reloaded_catalog_past_the_nesting_bound_is_refused_and_the_old_one_keeps_serving() {
    use toolgate::proto::tool_gate_client::ToolGateClient;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("catalog.yaml");
    // Polling is off for practical purposes: only the signal causes the reload.
    let demo = toolgate::settings::DEMO_CATALOG.replace(
        "  shutdown_grace: 10s\n",
        "  shutdown_grace: 10s\n  reload_interval: 1h\n",
    );
    std::fs::write(&config, &demo).unwrap();
    let spawned = spawn(&["--config", config.to_str().unwrap()]);
    std::fs::write(
        &config,
        deeply_nested_catalog(20_000).replace(
            "  shutdown_grace: 10s\n",
            "  shutdown_grace: 10s\n  reload_interval: 1h\n",
        ),
    )
    .unwrap();
    let pid = spawned.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let spawned = tokio::task::spawn_blocking(move || {
        spawned.wait_for_log("SIGHUP: catalog reload refused", 1);
        spawned
    })
    .await
    .unwrap();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", spawned.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ToolGateClient::new(channel);
    let tools = crate::support::visible(&mut client, &crate::support::who("acme")).await;
    assert!(
        tools.contains(&"echo".to_owned()) && !tools.contains(&"deep".to_owned()),
        "{tools:?}"
    );
    let r = crate::support::exec(
        &mut client,
        &crate::support::who("acme"),
        crate::support::call("echo", r#"{"text":"still here"}"#),
    )
    .await;
    assert_eq!(r.model_text, "still here", "{r:?}");
    let logs = crate::support::binary::stop(spawned).await;
    assert!(logs.contains(DEPTH_REFUSAL), "{logs}");
}
