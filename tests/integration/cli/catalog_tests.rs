//! `toolgate test`, the real binary: the shipped demo cases pass with full coverage; a wrong
//! expectation fails with a readable diff and exit 1; coverage gaps are named; a malformed test
//! file is refused naming the case; JWT claims go through the catalog's claim mapping; and the
//! published JSON Schema of the format is current and accepts the shipped file.

use std::{path::Path, process::Command};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `toolgate test ARGS` with these environment variables: (exit code, stdout, stderr).
fn toolgate_test(args: &[&str], envs: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .arg("test")
        .args(args)
        .envs(envs.iter().copied())
        .current_dir(root())
        .output()
        .expect("toolgate runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Asserts that a `toolgate test` run failed (exit 1) and printed each of `lines`; returns what
/// it printed.
fn assert_fails_printing(run: (Option<i32>, String, String), lines: &[&str]) -> String {
    let (code, stdout, stderr) = run;
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    for line in lines {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
    stdout
}

#[test]
fn the_shipped_demo_cases_pass_and_cover_every_tool_and_deny_rule() {
    let (code, stdout, stderr) = toolgate_test(
        &[
            "--config",
            "examples/demo.yaml",
            "examples/demo.tests.yaml",
            "--coverage",
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains(" 0 failed"), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert!(
        stdout.contains("coverage: 7/7 tools have a case; 2/2 deny rules decided a case"),
        "{stdout}"
    );
    assert!(
        stdout.contains("flow rules: 1/1 decided a case"),
        "{stdout}"
    );
    // Without --config, the embedded demo is the catalog.
    let (code, stdout, _) = toolgate_test(&["examples/demo.tests.yaml"], &[]);
    assert_eq!(code, Some(0), "{stdout}");
}

#[test]
fn a_wrong_expectation_fails_with_a_readable_diff() {
    let dir = tempfile::tempdir().unwrap();
    let tests = write(
        dir.path(),
        "wrong.yaml",
        r#"version: 1
cases:
  - name: globex may delete tickets
    identity: { tenant: globex, subject: bob, scopes: [tickets:write] }
    call: { name: delete_ticket, arguments: { ticket_id: T-1 } }
    expect: { status: APPROVAL_REQUIRED, refused_by: approval }
  - name: echo runs
    identity: { tenant: acme }
    call: { name: echo, arguments: { text: hi } }
    expect: { status: OK }
  - name: rag_search is bound to globex
    identity: { tenant: acme }
    call: { name: rag_search, arguments: { query: q } }
    expect: { bound_arguments: { filter.tenant: globex } }
  - name: support-bot sees refund_order
    identity: { tenant: acme, agent: support-bot }
    expect: { tools: { visible: [refund_order, echo] } }
"#,
    );
    let stdout = assert_fails_printing(
        toolgate_test(&["--config", "examples/demo.yaml", &tests], &[]),
        &[
            "FAIL  globex may delete tickets (cases[0])",
            "  status: expected APPROVAL_REQUIRED, got NOT_FOUND",
            "  refused_by: expected approval, got resolve",
            r#"  call: delete_ticket {"ticket_id":"T-1"} as tenant "globex", subject "bob", agent "", scopes [tickets:write]"#,
            "rule tenants.globex.deny[0] (deny \"delete_ticket\")",
            "ok    echo runs",
            "FAIL  rag_search is bound to globex (cases[2])",
            r#"  bound_arguments.filter.tenant: expected "globex", got "acme""#,
            "FAIL  support-bot sees refund_order (cases[3])",
            "  tools: expected refund_order visible, got hidden by access [denied_by_policy]: refund_order is not in agent support-bot's allow list",
            ": 1 passed, 3 failed",
        ],
    );
    // A field that matches is not reported.
    assert!(
        !stdout.contains("expected refund_order visible, got visible"),
        "{stdout}"
    );
    assert!(!stdout.contains("echo visible"), "{stdout}");
}

#[test]
fn coverage_names_tools_without_a_case_and_deny_rules_that_decided_none() {
    let dir = tempfile::tempdir().unwrap();
    let tests = write(
        dir.path(),
        "thin.yaml",
        r#"version: 1
cases:
  - name: acme echoes
    identity: { tenant: acme }
    call: { name: echo, arguments: { text: hi } }
    expect: { status: OK }
"#,
    );
    let (code, stdout, _) = toolgate_test(&["--config", "examples/demo.yaml", &tests], &[]);
    assert_eq!(code, Some(0), "passing cases without --coverage: {stdout}");
    let (code, stdout, _) = toolgate_test(
        &["--config", "examples/demo.yaml", &tests, "--coverage"],
        &[],
    );
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("coverage: 1/7 tools have a case; 0/2 deny rules decided a case"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  no case calls tool refund_order"),
        "{stdout}"
    );
    assert!(
        stdout.contains(r#"  deny rule tenants.globex.deny[0] ("delete_ticket") decided no case"#),
        "{stdout}"
    );
}

/// A case's `history` is what the flow rules see before the call; a wrong expectation shows
/// the scope in the trail; a history naming no tool is refused; coverage wants every flow rule
/// to decide a case.
#[test]
fn a_history_gives_the_flow_rules_what_ran_before_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let tests = write(
        dir.path(),
        "history.yaml",
        r#"version: 1
cases:
  - name: a small refund after reading a ticket runs at once
    identity: { tenant: acme, subject: alice, scopes: [tickets:read] }
    history: [rag_search, query_ticket]
    call: { name: refund_order, arguments: { order_id: A-1, amount_cents: 500 } }
    expect: { status: OK, flow_rule: "" }
  - name: without a ticket read, it runs at once
    identity: { tenant: acme, subject: alice }
    history: [rag_search]
    call: { name: refund_order, arguments: { order_id: A-1, amount_cents: 500 } }
    expect: { status: OK }
"#,
    );
    assert_fails_printing(
        toolgate_test(
            &["--config", "examples/demo.yaml", &tests, "--coverage"],
            &[],
        ),
        &[
            "FAIL  a small refund after reading a ticket runs at once (cases[0])",
            "  status: expected OK, got APPROVAL_REQUIRED",
            "  flow_rule: expected , got refund_after_reading_a_ticket",
            "flow (run): has seen untrusted_content (call history[1]: query_ticket); this call adds moves_money; rule refund_after_reading_a_ticket (flow.rules[0]) would require an approval",
            "ok    without a ticket read, it runs at once",
            ": 1 passed, 1 failed",
            "flow rules: 1/1 decided a case",
        ],
    );
    // Without a case whose history makes it fire, the rule is not covered.
    let passing = write(
        dir.path(),
        "passing.yaml",
        r#"version: 1
cases:
  - name: without a ticket read, it runs at once
    identity: { tenant: acme, subject: alice }
    history: [rag_search]
    call: { name: refund_order, arguments: { order_id: A-1, amount_cents: 500 } }
    expect: { status: OK }
"#,
    );
    let (code, stdout, _) = toolgate_test(
        &["--config", "examples/demo.yaml", &passing, "--coverage"],
        &[],
    );
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("flow rules: 0/1 decided a case\n  flow rule flow.rules[0] (refund_after_reading_a_ticket) decided no case: give a case a history"),
        "{stdout}"
    );
    let unknown = write(
        dir.path(),
        "unknown.yaml",
        r#"version: 1
cases:
  - name: after a made-up tool
    identity: { tenant: acme }
    history: [fetch_url]
    call: { name: echo, arguments: { text: hi } }
    expect: { status: OK }
"#,
    );
    let (code, stdout, stderr) = toolgate_test(&["--config", "examples/demo.yaml", &unknown], &[]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains(
            r#"cases[0] (after a made-up tool): history: no tool "fetch_url" in the catalog"#
        ),
        "{stderr}"
    );
}

/// A case's emergency denies stop what they name, for that case only; a wrong expectation shows
/// the deny in the trail, and an invalid deny fails its case by name.
#[test]
fn emergency_denies_in_a_case_stop_what_they_name_for_that_case_only() {
    let dir = tempfile::tempdir().unwrap();
    let tests = write(
        dir.path(),
        "denies.yaml",
        r#"version: 1
cases:
  - name: refunds stopped for acme run anyway
    identity: { tenant: acme, subject: alice, agent: billing-bot }
    emergency_denies: [{ tools: "refund_*", tenant: acme, reason: refunds looping }]
    call: { name: refund_order, arguments: { order_id: A-1, amount_cents: 500 } }
    expect: { status: OK }
  - name: the next case has no deny in force
    identity: { tenant: acme, subject: alice }
    call: { name: refund_order, arguments: { order_id: A-1, amount_cents: 500 } }
    expect: { status: OK, tools: { visible: [refund_order] } }
  - name: a deny for another agent leaves this one alone
    identity: { tenant: acme, subject: alice, agent: billing-bot }
    emergency_denies: [{ tools: "refund_*", agent: support-bot }]
    call: { name: refund_order, arguments: { order_id: A-1, amount_cents: 500 } }
    expect: { status: OK }
  - name: a glob that does not parse
    identity: { tenant: acme }
    emergency_denies: [{ tools: "echo" }, { tools: "refund_[" }]
    call: { name: echo, arguments: { text: hi } }
    expect: { status: OK }
  - name: and the valid deny of the failed case was lifted with it
    identity: { tenant: acme }
    call: { name: echo, arguments: { text: hi } }
    expect: { status: OK }
"#,
    );
    assert_fails_printing(
        toolgate_test(&["--config", "examples/demo.yaml", &tests], &[]),
        &[
            "FAIL  refunds stopped for acme run anyway (cases[0])",
            "  status: expected OK, got DENIED",
            "emergency deny emd_",
            "refunds looping",
            "ok    the next case has no deny in force",
            "ok    a deny for another agent leaves this one alone",
            "FAIL  a glob that does not parse (cases[3])",
            "  emergency_denies[1]: invalid tools glob \"refund_[\"",
            "ok    and the valid deny of the failed case was lifted with it",
            ": 3 passed, 2 failed",
        ],
    );
}

/// Every condition must hold in one case and be false in another; an error counts as neither.
#[test]
fn coverage_needs_each_condition_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = write(
        dir.path(),
        "c.yaml",
        r#"version: 1
identity: { dev_identity: true }
tenants:
  acme:
    deny:
      - { tools: [send], when: "!args.to.endsWith('@acme.com')" }
tools:
  - name: send
    description: Sends.
    risk_level: write_confirmed
    approval: { when: "has(args.urgent) && args.urgent" }
    executor: { builtin: echo_arguments }
    input_schema: { type: object, properties: { to: { type: string }, urgent: { type: boolean } }, required: [to] }
"#,
    );
    let case = |name: &str, args: &str, expect: &str| {
        format!(
            "  - name: {name}\n    identity: {{ tenant: acme }}\n    call: {{ name: send, arguments: {args} }}\n    expect: {expect}\n"
        )
    };
    let outside = case(
        "outside",
        "{ to: eve@evil.example }",
        "{ status: DENIED, refused_by: access, rule: 'tenants.acme.deny[0]' }",
    );
    let inside = case("inside", "{ to: bob@acme.com }", "{ status: OK }");
    let urgent = case(
        "urgent",
        "{ to: bob@acme.com, urgent: true }",
        "{ status: APPROVAL_REQUIRED }",
    );
    let half = write(
        dir.path(),
        "half.yaml",
        &format!("version: 1\ncases:\n{outside}"),
    );
    let (code, stdout, _) = toolgate_test(&["--config", &catalog, &half, "--coverage"], &[]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("conditions: 0/2 held in one case and were false in another"),
        "{stdout}"
    );
    assert!(
        stdout.contains(r#"  condition tenants.acme.deny[0] ("!args.to.endsWith('@acme.com')") was false in no case"#),
        "{stdout}"
    );
    // The denied call never reached stage 9: its approval condition was never evaluated.
    assert!(stdout.contains(r#"  condition send@1.approval.when ("has(args.urgent) && args.urgent") held in no case"#), "{stdout}");
    let all = write(
        dir.path(),
        "all.yaml",
        &format!("version: 1\ncases:\n{outside}{inside}{urgent}"),
    );
    let (code, stdout, _) = toolgate_test(&["--config", &catalog, &all, "--coverage"], &[]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("conditions: 2/2 held in one case and were false in another"),
        "{stdout}"
    );
}

#[test]
fn a_malformed_test_file_is_refused_naming_the_case() {
    let dir = tempfile::tempdir().unwrap();
    for (text, expected) in [
        (
            "version: 1\ncases:\n  - name: typo\n    identity: { tenant: acme }\n    call: { name: echo }\n    expect: { stauts: OK }\n",
            "unknown field `stauts`",
        ),
        (
            "version: 1\ncases:\n  - name: bad status\n    identity: { tenant: acme }\n    call: { name: echo }\n    expect: { status: FINE }\n",
            "cases[0] (bad status): expect.status: unknown status \"FINE\"",
        ),
        (
            "version: 1\ncases:\n  - name: no tenant\n    identity: { subject: bob }\n    call: { name: echo }\n    expect: { status: OK }\n",
            "cases[0] (no tenant): identity: a tenant is required",
        ),
        (
            "version: 1\ncases:\n  - name: nothing expected\n    identity: { tenant: acme }\n    call: { name: echo }\n    expect: {}\n",
            "expects nothing",
        ),
        ("version: 2\ncases: []\n", "unsupported test file version 2"),
    ] {
        let tests = write(dir.path(), "bad.yaml", text);
        let (code, stdout, stderr) =
            toolgate_test(&["--config", "examples/demo.yaml", &tests], &[]);
        assert_eq!(code, Some(1), "{stdout}{stderr}");
        assert!(stderr.contains(expected), "no {expected:?} in {stderr}");
    }
}

#[test]
fn jwt_claims_go_through_the_catalogs_claim_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = write(
        dir.path(),
        "catalog.yaml",
        r#"version: 1
identity:
  jwt:
    hs256_secret_env: CATALOG_TESTS_SECRET
    claims: { tenant: org, subject: email, scopes: permissions }
tenants: { acme: {} }
tools:
  - name: whoami
    description: Says who calls.
    risk_level: read_only
    required_scopes: ["me:read"]
    executor: { builtin: echo_arguments }
    input_schema: { type: object, properties: { tenant: { type: string }, subject: { type: string } } }
    bind: { tenant: "${caller.tenant}", subject: "${caller.subject}" }
"#,
    );
    let tests = write(
        dir.path(),
        "tests.yaml",
        r#"version: 1
cases:
  - name: the mapped claims are the caller
    identity: { claims: { org: acme, email: ada@acme.test, permissions: ["me:read"] } }
    call: { name: whoami }
    expect: { status: OK, arguments: { tenant: acme, subject: ada@acme.test } }
  - name: without the scope claim
    identity: { claims: { org: acme, email: ada@acme.test } }
    call: { name: whoami }
    expect: { status: NOT_FOUND, error_type: tool_not_found }
  - name: a token without the tenant claim identifies no one
    identity: { claims: { tenant: acme } }
    call: { name: whoami }
    expect: { status: OK }
"#,
    );
    let (code, stdout, stderr) = toolgate_test(
        &["--config", &catalog, &tests],
        &[(
            "CATALOG_TESTS_SECRET",
            "a-secret-for-catalog-tests-0123456789",
        )],
    );
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains("ok    the mapped claims are the caller"),
        "{stdout}"
    );
    assert!(stdout.contains("ok    without the scope claim"), "{stdout}");
    assert!(
        stdout.contains(r#"  identity: token has no tenant claim "org""#),
        "{stdout}"
    );
}

#[test]
fn the_published_test_file_schema_is_current_and_accepts_the_demo_cases() {
    let path = root().join("docs/catalog-tests.schema.json");
    let generated =
        serde_json::to_string_pretty(&toolgate::cli::test_runner::json_schema()).unwrap() + "\n";
    if std::env::var_os("UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let published = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        published == generated,
        "docs/catalog-tests.schema.json is stale: run `UPDATE_SCHEMA=1 cargo test the_published_test_file_schema`"
    );
    // `toolgate schema --tests` prints the same.
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["schema", "--tests"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), generated);
    let schema: serde_json::Value = serde_json::from_str(&published).unwrap();
    let demo: serde_json::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(root().join("examples/demo.tests.yaml")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&demo)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    // And it refuses what the runner refuses.
    let typo: serde_json::Value = serde_json::json!({"version": 1, "cases": [{"name": "x", "identity": {"tenant": "a"}, "expect": {"stauts": "OK"}}]});
    assert!(!validator.is_valid(&typo));
}

/// The "Explain a decision" and "Test a catalog" sessions of docs/explain-test-shadow.md,
/// replayed command by command against the real binary serving the demo (as the README's "Try
/// it" session is): the output must be exactly what the page shows.
#[test]
fn the_documented_explain_and_test_sessions_are_what_the_binary_prints() {
    let spawned = crate::support::binary::spawn(&[]);
    for heading in ["## Explain a decision", "## Test a catalog"] {
        for (command, expected) in crate::cli::doc_session("docs/explain-test-shadow.md", heading) {
            assert!(command.starts_with("toolgate "), "{command}");
            let (code, stdout, stderr) = crate::cli::run_shell(&command, &spawned.addr);
            assert_eq!(
                crate::cli::masked(&stdout),
                crate::cli::masked(&expected),
                "`{command}` printed (stderr: {stderr})"
            );
            // `explain` exits 4 when execution would not return OK, like `call`.
            let refused = command.starts_with("toolgate explain ")
                && !stdout.starts_with("OK ")
                && !stdout.starts_with("catalog revision");
            assert_eq!(
                code,
                Some(if refused { 4 } else { 0 }),
                "`{command}`: {stderr}"
            );
        }
    }
    crate::support::binary::stop_blocking(spawned);
}

#[test]
fn the_cases_never_touch_the_shared_state() {
    // The demo, with its state in a Redis that would answer nobody: a listener that is never
    // accepted from, so any connection attempt would be left waiting in its backlog.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let demo = std::fs::read_to_string(root().join("examples/demo.yaml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let catalog = write(
        dir.path(),
        "catalog.yaml",
        &demo.replacen(
            "version: 1\n",
            &format!(
                "version: 1\nstate:\n  backend: redis\n  redis: {{ url: \"redis://127.0.0.1:{port}\", timeout: 200ms, connect_timeout: 200ms }}\n"
            ),
            1,
        ),
    );
    let tests = root().join("examples/demo.tests.yaml");
    let (code, stdout, stderr) = toolgate_test(
        &["--config", &catalog, tests.to_str().unwrap(), "--coverage"],
        &[],
    );
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains(" 0 failed"), "{stdout}");
    match listener.accept() {
        Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("toolgate test connected to the shared state: {other:?}"),
    }
}

#[test]
fn explain_json_says_what_the_text_says() {
    let spawned = crate::support::binary::spawn(&[]);
    let run = |command: &str| {
        let (code, stdout, stderr) = crate::cli::run_shell(command, &spawned.addr);
        let value: serde_json::Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("`{command}` printed no JSON ({e}): {stdout}{stderr}"));
        (code, value)
    };
    // A model that picks another tenant's documents: refused by bind, which names the path.
    let (code, refused) = run(
        r#"toolgate explain rag_search --args '{"query":"q","filter":{"tenant":"globex"}}' --tenant acme --subject alice --json"#,
    );
    assert_eq!(code, Some(4));
    assert_eq!(refused["decision"]["status"], "DENIED");
    assert_eq!(refused["decision"]["refused_by"], "bind");
    assert_eq!(refused["decision"]["error_type"], "bound_argument_override");
    assert_eq!(refused["would_execute"], false);
    assert_eq!(
        refused["bound_override_attempts"],
        serde_json::json!(["filter.tenant"])
    );
    let stages: Vec<(&str, &str)> = refused["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["stage"].as_str().unwrap(), s["result"].as_str().unwrap()))
        .collect();
    let refused_at: Vec<&str> = stages
        .iter()
        .filter(|(_, result)| *result == "refused")
        .map(|(stage, _)| *stage)
        .collect();
    assert_eq!(refused_at, ["bind"], "{stages:?}");
    assert!(stages.contains(&("access", "passed")), "{stages:?}");
    assert!(
        stages.contains(&("rate_limit", "not_reached")),
        "{stages:?}"
    );
    // The same call within bounds: it would execute, with the bound value from the caller.
    let (code, allowed) = run(
        r#"toolgate explain rag_search --args '{"query":"q"}' --tenant acme --subject alice --json"#,
    );
    assert_eq!(code, Some(0));
    assert_eq!(allowed["decision"]["status"], "OK");
    assert_eq!(allowed["would_execute"], true);
    assert_eq!(allowed["final_arguments"]["filter"]["tenant"], "acme");
    let bind = allowed["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == "bind")
        .expect("a bind stage");
    assert_eq!(bind["bound_arguments"][0]["path"], "filter.tenant");
    assert_eq!(bind["bound_arguments"][0]["value"], "acme");
    assert_eq!(allowed["arguments_sha256"].as_str().map(str::len), Some(64));
    // The listing: rag_search is visible to acme.
    let (code, list) = run("toolgate explain --list --tenant acme --json");
    assert_eq!(code, Some(0));
    let rag = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "rag_search")
        .expect("rag_search listed");
    assert_eq!(rag["visible"], true);
    assert_eq!(list["catalog_revision"].as_str().map(str::len), Some(32));
    crate::support::binary::stop_blocking(spawned);
}
