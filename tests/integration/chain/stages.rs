//! One test per stage and refusal reason of the execution boundary, through the real server.

use serde_json::{Value, json};
use toolgate::{
    config::Config,
    proto::{self, ToolStatus},
    settings::Env,
};

use crate::support::{STAGES, TestServer, call, exec, execute_request, who};

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test]
async fn structure_refusals_name_the_stage_and_blank_call_ids_are_numbered() {
    let server = TestServer::start(STAGES).await;
    let mut client = server.client().await;
    let acme = who("acme");
    let deep = format!("{}1{}", "{\"a\":".repeat(9), "}".repeat(9));
    let cases = [
        (
            call(" ", "{}"),
            ToolStatus::InvalidArguments,
            "tool_name_missing",
        ),
        (
            call("echo", ""),
            ToolStatus::InvalidArguments,
            "arguments_not_json",
        ),
        (
            call("echo", "{\"text\":"),
            ToolStatus::InvalidArguments,
            "arguments_not_json",
        ),
        (
            call("echo", "[\"text\"]"),
            ToolStatus::InvalidArguments,
            "arguments_not_object",
        ),
        (
            call("echo", &format!("{{\"text\":\"{}\"}}", "x".repeat(5000))),
            ToolStatus::InvalidArguments,
            "arguments_too_large",
        ),
        (
            call("echo", &deep),
            ToolStatus::InvalidArguments,
            "arguments_too_deep",
        ),
    ];
    for (c, status, error_type) in cases {
        let result = exec(&mut client, &acme, c).await;
        assert_eq!(
            (
                result.status(),
                result.error_type.as_str(),
                result.refused_by.as_str()
            ),
            (status, error_type, "structure"),
            "{result:?}"
        );
        assert_eq!(result.call_id, "tool_step_0_0");
        assert!(!result.retryable);
    }
    // `{}` is a valid (empty) argument object; a given call id is kept.
    let mut c = call("half", "{}");
    c.call_id = "model-call-9".into();
    let result = exec(&mut client, &acme, c).await;
    assert_eq!(
        (result.status(), result.call_id.as_str()),
        (ToolStatus::Ok, "model-call-9")
    );
    server.stop().await;
}

#[tokio::test]
async fn resolution_refuses_unknown_tools_and_unavailable_versions() {
    let server = TestServer::start(STAGES).await;
    let mut client = server.client().await;
    let result = exec(&mut client, &who("acme"), call("no_such_tool", "{}")).await;
    assert_eq!(
        (result.status(), result.error_type.as_str()),
        (ToolStatus::NotFound, "tool_not_found")
    );
    for (version, says) in [
        ("0", "inactive"),
        ("2", "canary this tenant is not in"),
        ("9", "has no version 9"),
    ] {
        let mut c = call("greet", "{}");
        c.version = version.into();
        let result = exec(&mut client, &who("acme"), c).await;
        assert_eq!(
            (result.status(), result.error_type.as_str()),
            (ToolStatus::NotFound, "version_not_available"),
            "{result:?}"
        );
        assert!(
            result.error_message.contains(says),
            "{}",
            result.error_message
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn canary_routing_is_stable_per_tenant_and_pins_work() {
    let server = TestServer::start(STAGES).await;
    let mut client = server.client().await;
    let version_of = |r: &proto::ToolResult| r.tool_version.clone();
    // Listed tenants get the canary; others the active version, every time.
    for _ in 0..3 {
        assert_eq!(
            version_of(&exec(&mut client, &who("globex"), call("greet", "{}")).await),
            "2"
        );
        assert_eq!(
            version_of(&exec(&mut client, &who("acme"), call("greet", "{}")).await),
            "1"
        );
    }
    // A pinned active version works for everyone; a canary pin only for its tenants.
    let mut pinned = call("greet", "{}");
    pinned.version = "1".into();
    assert_eq!(
        exec(&mut client, &who("globex"), pinned.clone())
            .await
            .status(),
        ToolStatus::Ok
    );
    pinned.version = "2".into();
    assert_eq!(
        version_of(&exec(&mut client, &who("globex"), pinned).await),
        "2"
    );
    // ListTools shows each tenant the version it would execute.
    let listed = client
        .list_tools(who("globex").request(proto::ListToolsRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        listed
            .tools
            .iter()
            .find(|t| t.name == "greet")
            .unwrap()
            .version,
        "2"
    );
    server.stop().await;

    // A percentage canary (`half`: 50 %) splits by a stable hash of the tool and the tenant. The
    // expected versions were computed outside toolgate, with Python's hashlib:
    //   int.from_bytes(sha256(b"half\0" + tenant).digest()[:8], "big") % 100 < 50  ->  "2"
    // (the buckets are in the comments); umbrella and globex sit close to the line on either side.
    let expected = [
        ("acme", "2"),      // 21
        ("globex", "1"),    // 59
        ("umbrella", "2"),  // 49
        ("hooli", "1"),     // 88
        ("stark", "2"),     // 48
        ("wayne", "1"),     // 75
        ("tyrell", "1"),    // 89
        ("cyberdyne", "2"), // 8
        ("soylent", "2"),   // 29
        ("wonka", "2"),     // 22
        ("oscorp", "2"),    // 46
    ];
    let tenants: String = expected
        .iter()
        .filter(|(t, _)| !matches!(*t, "acme" | "globex"))
        .map(|(t, _)| format!("  {t}: {{}}\n"))
        .collect();
    let yaml = STAGES.replacen("tenants:\n", &format!("tenants:\n{tenants}"), 1);
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    for (tenant, version) in expected {
        // The same answer on every call, and ListTools shows the version that runs.
        for _ in 0..3 {
            let r = exec(&mut client, &who(tenant), call("half", "{}")).await;
            assert_eq!(
                (r.status(), r.tool_version.as_str()),
                (ToolStatus::Ok, version),
                "{tenant}: {r:?}"
            );
        }
        let listed = client
            .list_tools(who(tenant).request(proto::ListToolsRequest {}))
            .await
            .unwrap()
            .into_inner();
        let half = listed.tools.iter().find(|t| t.name == "half").unwrap();
        assert_eq!(half.version, version, "{tenant}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_stale_revision_is_refused_only_when_the_tool_changed() {
    let server = TestServer::start(STAGES).await;
    let mut client = server.client().await;
    let acme = who("acme");
    let shown = client
        .list_tools(acme.request(proto::ListToolsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .catalog_revision;
    let run = |name: &str, revision: &str| {
        let mut request = execute_request(call(name, r#"{"text":"hi"}"#));
        request.catalog_revision = revision.into();
        request
    };
    let ok = client
        .execute_tool(acme.request(run("echo", &shown)))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(ok.status(), ToolStatus::Ok);
    let unknown = client
        .execute_tool(acme.request(run("echo", "0123")))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(
        (unknown.status(), unknown.error_type.as_str()),
        (ToolStatus::StaleCatalog, "stale_catalog")
    );

    // Change echo's description (what the model is shown), leave `big_output` as it was.
    let changed = STAGES.replace(
        "description: Returns text.",
        "description: Returns the text, changed.",
    );
    let catalog = Config::from_yaml(&changed, "t", std::path::Path::new("."), &Env::default())
        .unwrap()
        .catalog;
    server.boundary().replace_catalog(catalog, None).await;
    let stale = client
        .execute_tool(acme.request(run("echo", &shown)))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_eq!(stale.status(), ToolStatus::StaleCatalog, "{stale:?}");
    let current = client
        .list_tools(acme.request(proto::ListToolsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .catalog_revision;
    assert_ne!(current, shown);
    assert!(
        stale.error_message.contains(&shown) && stale.error_message.contains(&current),
        "{}",
        stale.error_message
    );
    let unchanged = client
        .execute_tool(acme.request(run("big_output", &shown)))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap();
    assert_ne!(
        unchanged.status(),
        ToolStatus::StaleCatalog,
        "{unchanged:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn access_lists_deny_hide_the_tool_and_the_record_names_the_rule() {
    let server = TestServer::start(STAGES).await;
    let mut client = server.client().await;
    let cases = [
        (
            who("acme"),
            "forbidden_echo",
            "denied by the global policy's deny rule \"forbidden_*\"",
        ),
        (
            who("globex"),
            "secret_echo",
            "denied by tenant globex's deny rule \"secret_echo\"",
        ),
        (
            who("initech"),
            "secret_echo",
            "not in tenant initech's allow list",
        ),
        (
            who("acme").agent("narrow-bot"),
            "secret_echo",
            "not in agent narrow-bot's allow list",
        ),
    ];
    for (caller, tool, says) in cases {
        let result = exec(&mut client, &caller, call(tool, "{}")).await;
        // The caller is answered as for a tool that does not exist: nothing tells it the tool
        // is there, or which rule hides it.
        let unknown = exec(&mut client, &caller, call("no_such_tool", "{}")).await;
        assert_eq!(
            (
                result.status(),
                result.error_type.as_str(),
                result.refused_by.as_str(),
                result.tool_version.as_str(),
            ),
            (ToolStatus::NotFound, "tool_not_found", "resolve", "")
        );
        assert_eq!(
            result.error_message.replace(tool, "X"),
            unknown.error_message.replace("no_such_tool", "X")
        );
        assert!(
            !result.error_message.contains(says),
            "{}",
            result.error_message
        );
        // The record names the rule.
        let events = server.audit_events().await;
        let event = events
            .iter()
            .rev()
            .find(|e| e["tool"] == tool && e["tenant"] == caller.tenant.as_str())
            .expect("the refusal is audited");
        let reason = event["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("hidden from this caller") && reason.contains(says),
            "{reason}"
        );
    }
    let unknown = exec(
        &mut client,
        &who("umbrella"),
        call("echo", r#"{"text":"x"}"#),
    )
    .await;
    assert_eq!(unknown.error_type, "tenant_unknown");
    server.stop().await;
}

#[tokio::test]
async fn missing_scopes_hide_the_tool_and_are_named_in_the_record() {
    let server = TestServer::start(STAGES).await;
    let mut client = server.client().await;
    let denied = exec(
        &mut client,
        &who("acme").scopes("other"),
        call("scoped_echo", r#"{"text":"x"}"#),
    )
    .await;
    assert_eq!(
        (
            denied.status(),
            denied.error_type.as_str(),
            denied.refused_by.as_str()
        ),
        (ToolStatus::NotFound, "tool_not_found", "resolve")
    );
    assert!(!denied.error_message.contains("echo:use"));
    let events = server.audit_events().await;
    let reason = events
        .iter()
        .find(|e| e["tool"] == "scoped_echo")
        .and_then(|e| e["reason"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(reason.contains("\"echo:use\""), "{reason}");
    let ok = exec(
        &mut client,
        &who("acme").scopes("echo:use"),
        call("scoped_echo", r#"{"text":"x"}"#),
    )
    .await;
    assert_eq!(ok.status(), ToolStatus::Ok);
    server.stop().await;
}

#[tokio::test]
async fn schema_violations_are_all_listed_with_pointers() {
    let server = TestServer::start(STAGES).await;
    let mut client = server.client().await;
    let result = exec(
        &mut client,
        &who("acme"),
        call(
            "typed",
            r#"{"count": 0, "mode": "warp", "tags": [1, "ok", true], "extra": 1}"#,
        ),
    )
    .await;
    assert_eq!(
        (
            result.status(),
            result.error_type.as_str(),
            result.refused_by.as_str()
        ),
        (ToolStatus::InvalidArguments, "schema_violation", "schema")
    );
    for pointer in ["/count", "/mode", "/tags/0", "/tags/2", "'extra'"] {
        assert!(
            result.error_message.contains(pointer),
            "{pointer} missing from {}",
            result.error_message
        );
    }
    let missing = exec(&mut client, &who("acme"), call("typed", "{}")).await;
    assert!(
        missing
            .error_message
            .contains("\"count\" is a required property"),
        "{}",
        missing.error_message
    );
    assert!(
        missing
            .model_text
            .starts_with("TOOL_ERROR: {\"errorType\":\"schema_violation\"")
    );
    server.stop().await;
}

#[tokio::test]
async fn bound_arguments_come_from_the_caller_and_model_overrides_are_refused_and_audited() {
    let server = TestServer::start(STAGES).await;
    let mut client = server.client().await;
    let bob = who("acme").subject("bob");
    // The model sees neither `owner` nor `scope.tenant`; `scope` keeps only what it may set.
    let listed = client
        .list_tools(bob.request(proto::ListToolsRequest {}))
        .await
        .unwrap()
        .into_inner();
    let bound = listed.tools.iter().find(|t| t.name == "bound").unwrap();
    let schema = parse(&bound.input_schema_json);
    assert_eq!(
        schema["properties"],
        json!({"note": {"type": "string"}, "scope": {"type": "object", "properties": {"region": {"type": "string"}}, "required": []}})
    );
    assert_eq!(schema["required"], json!([]));

    let ok = exec(&mut client, &bob, call("bound", r#"{"note":"hi"}"#)).await;
    assert_eq!(ok.status(), ToolStatus::Ok, "{ok:?}");
    assert_eq!(
        parse(&ok.model_text),
        json!({"note": "hi", "owner": "bob", "scope": {"tenant": "acme"}})
    );
    // Top-level, nested, and a non-object where the bound object goes: all refused.
    for args in [
        r#"{"owner":"mallory"}"#,
        r#"{"scope":{"tenant":"globex"}}"#,
        r#"{"scope":"globex"}"#,
    ] {
        let result = exec(&mut client, &bob, call("bound", args)).await;
        assert_eq!(
            (
                result.status(),
                result.error_type.as_str(),
                result.refused_by.as_str()
            ),
            (ToolStatus::Denied, "bound_argument_override", "bind"),
            "{args}: {result:?}"
        );
    }
    // A sibling the model may set is kept, with the bound key written next to it.
    let sibling = exec(
        &mut client,
        &bob,
        call("bound", r#"{"scope":{"region":"eu"}}"#),
    )
    .await;
    assert_eq!(sibling.status(), ToolStatus::Ok, "{sibling:?}");
    assert_eq!(
        parse(&sibling.model_text)["scope"],
        json!({"region": "eu", "tenant": "acme"})
    );
    // Overwrite mode: the model's value is replaced, and the attempt still audited.
    let overwritten = exec(
        &mut client,
        &bob,
        call("bound_overwrite", r#"{"owner":"mallory","level":9}"#),
    )
    .await;
    assert_eq!(
        parse(&overwritten.model_text),
        json!({"owner": "bob", "level": 3})
    );
    let events = server.audit_events().await;
    let attempts: Vec<&Value> = events
        .iter()
        .filter(|e| e["bound_override_attempts"].is_array())
        .collect();
    assert_eq!(attempts.len(), 4, "{events:?}");
    assert_eq!(
        attempts[3]["bound_override_attempts"],
        json!(["level", "owner"])
    );
    assert_eq!(attempts[3]["status"], "OK");
    server.stop().await;
}

/// A tenant filter bound under an object (`filter.tenant`), on a tool that refuses what the
/// model sends there and on one that overwrites it, both with schemas that allow nothing else.
const BOUND_FILTER: &str = r#"version: 1
identity: { dev_identity: true }
tenants: { acme: {} }
tools:
  - name: search_refusing
    description: Searches within the caller's tenant.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    input_schema:
      type: object
      properties:
        query: { type: string }
        filter: { type: object, properties: { tenant: { type: string }, year: { type: integer } }, required: [tenant], additionalProperties: false }
      required: [filter]
      additionalProperties: false
    bind: { filter.tenant: "${caller.tenant}" }
  - name: search_overwriting
    description: Searches within the caller's tenant.
    risk_level: read_only
    on_bound_argument: overwrite
    executor: { builtin: echo_arguments }
    input_schema:
      type: object
      properties:
        query: { type: string }
        filter: { type: object, properties: { tenant: { type: string }, year: { type: integer } }, required: [tenant], additionalProperties: false }
      required: [filter]
      additionalProperties: false
    bind: { filter.tenant: "${caller.tenant}" }
"#;

/// Whatever the model sends where a bound value goes — an object (the operator-injection shape
/// `{"$ne": "acme"}`), an array or null, at the bound key or at its parent — is a bound argument
/// the model set: refused where the tool refuses them, replaced by the bound value where it
/// overwrites them, and audited either way. The schema check sees the arguments without the
/// model's bound keys, so an overwritten value never fails validation the model cannot see.
/// (Issue 52, item 12: no test sent an object at a bound path, so the guards for it could be
/// changed without a test failing.)
#[tokio::test]
async fn an_object_array_or_null_where_a_bound_value_goes_is_refused_or_overwritten() {
    let server = TestServer::start(BOUND_FILTER).await;
    let mut client = server.client().await;
    let acme = who("acme").subject("mallory");
    let sent = [
        json!({"query": "q", "filter": {"tenant": {"$ne": "acme"}}}),
        json!({"query": "q", "filter": {"tenant": ["acme", "globex"]}}),
        json!({"query": "q", "filter": {"tenant": null}}),
        json!({"query": "q", "filter": {"tenant": {}}}),
        json!({"query": "q", "filter": ["globex"]}),
        json!({"query": "q", "filter": null}),
        json!({"query": "q", "filter": "globex"}),
    ];
    for args in &sent {
        let refused = exec(
            &mut client,
            &acme,
            call("search_refusing", &args.to_string()),
        )
        .await;
        assert_eq!(
            (
                refused.status(),
                refused.error_type.as_str(),
                refused.refused_by.as_str()
            ),
            (ToolStatus::Denied, "bound_argument_override", "bind"),
            "{args}: {refused:?}"
        );
        let overwritten = exec(
            &mut client,
            &acme,
            call("search_overwriting", &args.to_string()),
        )
        .await;
        assert_eq!(
            overwritten.status(),
            ToolStatus::Ok,
            "{args}: {overwritten:?}"
        );
        assert_eq!(
            parse(&overwritten.model_text),
            json!({"query": "q", "filter": {"tenant": "acme"}}),
            "{args}"
        );
    }
    // What the model may set beside the bound key stays, and is still validated.
    let kept = exec(
        &mut client,
        &acme,
        call(
            "search_overwriting",
            r#"{"filter":{"tenant":{"$ne":"acme"},"year":2024}}"#,
        ),
    )
    .await;
    assert_eq!(
        parse(&kept.model_text),
        json!({"filter": {"tenant": "acme", "year": 2024}})
    );
    let invalid = exec(
        &mut client,
        &acme,
        call(
            "search_overwriting",
            r#"{"filter":{"tenant":"x","year":"last"}}"#,
        ),
    )
    .await;
    assert_eq!(invalid.error_type, "schema_violation", "{invalid:?}");
    let allowed = exec(
        &mut client,
        &acme,
        call("search_refusing", r#"{"filter":{"year":2024}}"#),
    )
    .await;
    assert_eq!(
        parse(&allowed.model_text),
        json!({"filter": {"tenant": "acme", "year": 2024}})
    );
    // Every attempt is audited, refused or overwritten: 7 of each, and the two with a year.
    let events = server.audit_events().await;
    let attempts = events
        .iter()
        .filter(|e| e["bound_override_attempts"] == json!(["filter.tenant"]))
        .count();
    assert_eq!(attempts, 2 * sent.len() + 2, "{events:#?}");
    server.stop().await;
}

#[tokio::test]
async fn rag_search_never_reaches_another_tenants_documents() {
    let server = TestServer::demo().await;
    let mut client = server.client().await;
    let acme = who("acme");
    let attack = exec(
        &mut client,
        &acme,
        call(
            "rag_search",
            r#"{"query":"refund margin secret","filter":{"tenant":"globex"}}"#,
        ),
    )
    .await;
    assert_eq!(attack.status(), ToolStatus::Denied);
    assert!(!attack.model_text.contains("42 percent"));
    let result = exec(
        &mut client,
        &acme,
        call("rag_search", r#"{"query":"refund margin secret"}"#),
    )
    .await;
    assert_eq!(result.status(), ToolStatus::Ok);
    let hits = parse(&result.model_text)["results"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        !hits.is_empty()
            && hits
                .iter()
                .all(|h| h["id"].as_str().unwrap().starts_with("acme-")),
        "{hits:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn backend_failures_oversized_output_and_tool_error_text_are_exact() {
    let server = TestServer::start(STAGES).await;
    let mut client = server.client().await;
    let mut c = call("failing", r#"{"ticket_id":"T-1"}"#);
    c.call_id = "c-7".into();
    let failed = exec(&mut client, &who("acme"), c).await;
    assert_eq!(
        (
            failed.status(),
            failed.error_type.as_str(),
            failed.refused_by.as_str()
        ),
        (ToolStatus::Error, "tool_failed", "execute")
    );
    assert_eq!(
        failed.model_text,
        r#"TOOL_ERROR: {"errorType":"tool_failed","error":"ticket T-1 not found","tool":"failing","callId":"c-7"}"#
    );
    #[expect(
        deprecated,
        reason = "the test checks the deprecated field stays empty"
    )]
    let output = &failed.output;
    assert!(output.is_empty(), "output is deprecated and never set");
    let big = exec(
        &mut client,
        &who("acme"),
        call("big_output", r#"{"text":"123456789"}"#),
    )
    .await;
    assert_eq!(
        (
            big.status(),
            big.error_type.as_str(),
            big.refused_by.as_str()
        ),
        (ToolStatus::Error, "output_too_large", "result")
    );
    let fits = exec(
        &mut client,
        &who("acme"),
        call("big_output", r#"{"text":"12345678"}"#),
    )
    .await;
    assert_eq!(
        (
            fits.status(),
            fits.model_text.as_str(),
            fits.model_text.as_str()
        ),
        (ToolStatus::Ok, "12345678", "12345678")
    );
    assert!(fits.error_type.is_empty() && fits.refused_by.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn every_call_leaves_one_audit_event_without_raw_arguments() {
    let server = TestServer::start(STAGES).await;
    let mut client = server.client().await;
    let secret = "card-4111-1111";
    for c in [
        call("echo", &format!(r#"{{"text":"{secret}"}}"#)),
        call("nope", "{}"),
        call("typed", &format!(r#"{{"count":"{secret}"}}"#)),
    ] {
        exec(&mut client, &who("acme"), c).await;
    }
    let events = server.audit_events().await;
    assert_eq!(events.len(), 3);
    let text = std::fs::read_to_string(&server.audit_path).unwrap();
    assert!(
        !text.contains(secret),
        "raw arguments leaked into the audit log"
    );
    assert_eq!(events[0]["status"], "OK");
    assert_eq!(events[0]["arguments_sha256"].as_str().unwrap().len(), 64);
    assert_eq!(events[1]["error_type"], "tool_not_found");
    assert_eq!(events[2]["refused_by"], "schema");
    for e in &events {
        assert_eq!(e["tenant"], "acme");
        assert_eq!(e["run_id"], "run-1");
        assert!(e["time"].as_str().unwrap().ends_with('Z'));
    }
    server.stop().await;
}
