//! The approvals console over HTTP, in process on the demo catalog (its development sign-in, the
//! test server's manual clock): what the browser tests (tests/python/test_console.py) cannot
//! reach — a session past its end, the headers of every answer, the load-time rules — and the
//! decisions it makes, which must be the boundary's.

use std::collections::BTreeMap;

use http::StatusCode;
use toolgate::proto::{self, ToolStatus};

use crate::support::{TestServer, alice, bob, call, exec};

/// A browser's part: cookies kept, redirects not followed.
struct Visitor {
    base: String,
    http: reqwest::Client,
    cookies: BTreeMap<String, String>,
}

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
}

impl Visitor {
    fn new(server: &TestServer) -> Visitor {
        let addr = server.console_addr().expect("the demo serves its console");
        toolgate::tls::install_crypto_provider();
        Visitor {
            base: format!("http://{addr}"),
            http: reqwest::Client::builder()
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
            cookies: BTreeMap::new(),
        }
    }

    fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    async fn send(&mut self, request: reqwest::RequestBuilder) -> Answer {
        let response = request
            .header("cookie", self.cookie_header())
            .send()
            .await
            .unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        for value in headers.get_all("set-cookie") {
            let text = value.to_str().unwrap();
            let (pair, _) = text.split_once(';').unwrap_or((text, ""));
            let (name, value) = pair.split_once('=').unwrap();
            match value.is_empty() {
                true => self.cookies.remove(name),
                false => self.cookies.insert(name.into(), value.into()),
            };
        }
        Answer {
            status,
            headers,
            body: response.text().await.unwrap(),
        }
    }

    async fn get(&mut self, path: &str) -> Answer {
        let request = self.http.get(format!("{}{path}", self.base));
        self.send(request).await
    }

    async fn post(&mut self, path: &str, form: &[(&str, &str)], origin: Option<&str>) -> Answer {
        let body: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        self.send(request).await
    }

    /// Signs in with the demo's development form.
    async fn sign_in(server: &TestServer, tenant: &str, subject: &str, scopes: &str) -> Visitor {
        let mut visitor = Visitor::new(server);
        let page = visitor.get("/sign-in").await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let state = hidden(&page.body, "state");
        let origin = visitor.base.clone();
        let signed_in = visitor
            .post(
                "/sign-in/dev",
                &[
                    ("state", &state),
                    ("next", "/approvals"),
                    ("tenant", tenant),
                    ("subject", subject),
                    ("scopes", scopes),
                ],
                Some(&origin),
            )
            .await;
        assert_eq!(signed_in.status, StatusCode::OK, "{}", signed_in.body);
        assert!(visitor.cookies.contains_key("toolgate-console"));
        visitor
    }

    /// The CSRF token of the signed-in frame.
    async fn csrf(&mut self) -> String {
        hidden(&self.get("/approvals").await.body, "csrf")
    }

    async fn decide(&mut self, id: &str, decision: &str, csrf: &str) -> Answer {
        let origin = self.base.clone();
        self.post(
            &format!("/approvals/{id}"),
            &[
                ("csrf", csrf),
                ("decision", decision),
                ("reason", "checked"),
            ],
            Some(&origin),
        )
        .await
    }
}

/// The value of the hidden input `name` on a page.
fn hidden(page: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = page
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} in {page}"))
        + marker.len();
    page[start..][..page[start..].find('"').unwrap()].to_owned()
}

/// alice asks for a refund that needs approval; its id.
async fn refund_waiting(server: &TestServer) -> String {
    let mut client = server.client().await;
    let result = exec(
        &mut client,
        &alice(),
        call("refund_order", r#"{"order_id":"A-1","amount_cents":2500}"#),
    )
    .await;
    assert_eq!(result.status(), ToolStatus::ApprovalRequired, "{result:?}");
    result.approval_id
}

async fn state_of(server: &TestServer, id: &str) -> proto::ApprovalState {
    let mut approvals = server.approvals().await;
    approvals
        .get_approval(bob().request(proto::GetApprovalRequest {
            approval_id: id.into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap()
        .state()
}

#[tokio::test]
async fn every_answer_is_locked_down_and_the_session_cookie_is_out_of_scripts_reach() {
    let server = TestServer::demo().await;
    let mut visitor = Visitor::new(&server);
    for path in ["/sign-in", "/approvals", "/nowhere", "/assets/console.js"] {
        let answer = visitor.get(path).await;
        let header = |name: &str| answer.headers.get(name).map(|v| v.to_str().unwrap());
        assert_eq!(
            header("content-security-policy"),
            Some(
                "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
            ),
            "{path}"
        );
        assert_eq!(header("x-frame-options"), Some("DENY"), "{path}");
        assert_eq!(header("x-content-type-options"), Some("nosniff"), "{path}");
    }
    let mut page = Visitor::new(&server);
    let sign_in = page.get("/sign-in").await;
    let login = sign_in.headers.get("set-cookie").unwrap().to_str().unwrap();
    assert!(
        login.contains("HttpOnly") && login.contains("SameSite=Lax"),
        "{login}"
    );
    let state = hidden(&sign_in.body, "state");
    let origin = page.base.clone();
    let signed_in = page
        .post(
            "/sign-in/dev",
            &[
                ("state", &state),
                ("next", "/approvals"),
                ("tenant", "acme"),
                ("subject", "bob"),
                ("scopes", "toolgate:approve"),
            ],
            Some(&origin),
        )
        .await;
    let session = signed_in
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .find(|v| v.starts_with("toolgate-console="))
        .unwrap()
        .to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=1800"] {
        assert!(session.contains(attribute), "{attribute}: {session}");
    }
    // On loopback over http the cookie cannot be Secure; off loopback https is required.
    assert!(!session.contains("Secure"), "{session}");
    // No token in the page: not the session, not in a URL.
    let cookie = page.cookies["toolgate-console"].clone();
    let inbox = page.get("/approvals").await;
    assert!(!inbox.body.contains(cookie.as_str()));
    assert!(!inbox.body.contains("<script>"), "inline script");
    assert!(!inbox.body.contains("style="), "inline style");
}

#[tokio::test]
async fn a_console_decision_is_the_boundarys_and_is_audited_with_its_door() {
    let server = TestServer::demo().await;
    let id = refund_waiting(&server).await;
    let mut bob = Visitor::sign_in(&server, "acme", "bob", "toolgate:approve").await;
    let inbox = bob.get("/approvals").await;
    assert!(inbox.body.contains(&id), "{}", inbox.body);
    let csrf = bob.csrf().await;
    let decided = bob.decide(&id, "approve", &csrf).await;
    assert_eq!(decided.status, StatusCode::OK, "{}", decided.body);
    assert!(decided.body.contains("You approved this request"));
    assert_eq!(state_of(&server, &id).await, proto::ApprovalState::Approved);
    let events = server.audit_events_of("approval_decision").await;
    let event = events
        .iter()
        .find(|e| e["approval_id"] == id.as_str())
        .unwrap();
    assert_eq!(event["door"], "console");
    assert_eq!(event["approver"], "bob");
    assert_eq!(event["reason"], "checked");
    // Decided once: again is a conflict, on a page that shows where it stands.
    let again = bob.decide(&id, "reject", &csrf).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    assert!(again.body.contains("already decided"), "{}", again.body);
    assert!(again.body.contains("Approved by bob"));
    assert_eq!(state_of(&server, &id).await, proto::ApprovalState::Approved);
    // The live update of a page is its main part only.
    let live = bob
        .send(
            bob.http
                .get(format!("{}/approvals/{id}", bob.base))
                .header("x-toolgate-live", "1"),
        )
        .await;
    assert!(live.body.starts_with("<h1>"), "{}", live.body);
}

#[tokio::test]
async fn forged_posts_and_foreign_hosts_change_nothing() {
    let server = TestServer::demo().await;
    let id = refund_waiting(&server).await;
    let mut bob = Visitor::sign_in(&server, "acme", "bob", "toolgate:approve").await;
    let csrf = bob.csrf().await;
    let path = format!("/approvals/{id}");
    let origin = bob.base.clone();
    for (form, origin) in [
        (
            vec![("csrf", "forged"), ("decision", "approve")],
            Some(origin.as_str()),
        ),
        (vec![("decision", "approve")], Some(origin.as_str())),
        (
            vec![("csrf", csrf.as_str()), ("decision", "approve")],
            Some("http://evil.example"),
        ),
        (vec![("csrf", csrf.as_str()), ("decision", "approve")], None),
    ] {
        let answer = bob.post(&path, &form, origin).await;
        assert_eq!(answer.status, StatusCode::FORBIDDEN, "{form:?} {origin:?}");
        assert!(answer.body.contains("Nothing was changed"));
    }
    // Another session's token is not this session's.
    let mut erin = Visitor::sign_in(&server, "acme", "erin", "toolgate:approve").await;
    let erins = erin.csrf().await;
    assert_ne!(erins, csrf);
    let answer = bob
        .post(
            &path,
            &[("csrf", &erins), ("decision", "approve")],
            Some(&origin),
        )
        .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    // DNS rebinding: a page of another name that resolves here is not served.
    let foreign = bob
        .send(
            bob.http
                .get(format!("{}/approvals", bob.base))
                .header("host", "evil.example"),
        )
        .await;
    assert_eq!(foreign.status, StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(state_of(&server, &id).await, proto::ApprovalState::Pending);
}

#[tokio::test]
async fn an_expired_session_asks_to_sign_in_again_and_decides_nothing() {
    let server = TestServer::demo().await;
    let id = refund_waiting(&server).await;
    let mut bob = Visitor::sign_in(&server, "acme", "bob", "toolgate:approve").await;
    let csrf = bob.csrf().await;
    server
        .clock
        .advance(std::time::Duration::from_secs(31 * 60));
    let inbox = bob.get("/approvals").await;
    assert_eq!(inbox.status, StatusCode::SEE_OTHER);
    let to = inbox.headers["location"].to_str().unwrap().to_owned();
    assert_eq!(to, "/sign-in?why=expired&next=%2Fapprovals");
    assert!(bob.get(&to).await.body.contains("Your session has expired"));
    let deep = bob.get(&format!("/approvals/{id}")).await;
    assert!(
        deep.headers["location"]
            .to_str()
            .unwrap()
            .ends_with(&format!("next=%2Fapprovals%2F{id}")),
        "the deep link survives signing in again"
    );
    let decided = bob.decide(&id, "approve", &csrf).await;
    assert_eq!(decided.status, StatusCode::UNAUTHORIZED, "{}", decided.body);
    assert!(decided.body.contains("Nothing was decided"));
    let live = bob
        .send(
            bob.http
                .get(format!("{}/approvals", bob.base))
                .header("x-toolgate-live", "1"),
        )
        .await;
    assert_eq!(live.status, StatusCode::UNAUTHORIZED);
    // Nothing decided it: it expired on its own clock (5 minutes in the demo).
    assert_eq!(state_of(&server, &id).await, proto::ApprovalState::Expired);
}

#[tokio::test]
async fn unknown_and_malformed_requests_get_a_page_not_a_trace() {
    let server = TestServer::demo().await;
    let mut bob = Visitor::sign_in(&server, "acme", "bob", "toolgate:approve").await;
    let unknown = bob
        .get("/approvals/apr_00000000000000000000000000000000")
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert!(unknown.body.contains("No such approval"));
    let markup = bob
        .get("/approvals/%3Cscript%3Ealert(1)%3C%2Fscript%3E")
        .await;
    assert_eq!(markup.status, StatusCode::NOT_FOUND);
    assert!(!markup.body.contains("<script>alert"), "{}", markup.body);
    let page = bob.get("/approvals?after=not-a-token").await;
    assert_eq!(page.status, StatusCode::BAD_REQUEST);
    let csrf = bob.csrf().await;
    let origin = bob.base.clone();
    let huge = "x".repeat(64 * 1024);
    let too_big = bob
        .post(
            "/approvals/apr_00000000000000000000000000000000",
            &[("csrf", &csrf), ("decision", "approve"), ("reason", &huge)],
            Some(&origin),
        )
        .await;
    assert_eq!(too_big.status, StatusCode::FORBIDDEN, "{}", too_big.body);
    let id = refund_waiting(&server).await;
    let long_reason = "r".repeat(1025);
    let refused = bob
        .post(
            &format!("/approvals/{id}"),
            &[
                ("csrf", &csrf),
                ("decision", "approve"),
                ("reason", &long_reason),
            ],
            Some(&origin),
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(
        refused.body.contains("at most 1024 are kept"),
        "{}",
        refused.body
    );
    assert_eq!(state_of(&server, &id).await, proto::ApprovalState::Pending);
}

#[tokio::test]
async fn the_console_is_off_unless_configured() {
    let server = TestServer::start(
        "version: 1\nidentity: { dev_identity: true }\ntools:\n  - { name: echo, description: e, risk_level: read_only, timeout: 1s, executor: { builtin: echo }, input_schema: { type: object } }\n",
    )
    .await;
    assert_eq!(server.console_addr(), None);
}

#[test]
fn the_console_refuses_unsafe_settings_at_load() {
    let env = toolgate::settings::Env::default();
    let load = |server: &str, identity: &str| {
        let yaml = format!(
            "version: 1\nserver:\n  console:\n{server}\nidentity:\n{identity}\ntools: []\n"
        );
        toolgate::config::Config::from_yaml(&yaml, "catalog.yaml", std::path::Path::new("."), &env)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let dev = "  dev_identity: true";
    let jwt = "  jwt: { hs256_secret_env: NOPE }";
    for (server, identity, says) in [
        (
            "    dev_sign_in: true\n    listen: 0.0.0.0:8766\n    public_url: https://a.example",
            dev,
            "loopback listen address only",
        ),
        (
            "    dev_sign_in: true\n    listen: 0.0.0.0:8766",
            dev,
            "required on a non-loopback address",
        ),
        (
            "    dev_sign_in: true",
            "  dev_identity: false\n  jwt: { jwks: { url: \"https://idp.example/jwks\" } }",
            "needs identity.dev_identity",
        ),
        ("    listen: 127.0.0.1:8766", dev, "no way to sign in"),
        (
            "    oidc: { issuer: \"https://idp.example\", client_id: c }",
            dev,
            "needs identity.jwt",
        ),
        (
            "    oidc: { issuer: \"http://idp.example\", client_id: c }\n    public_url: https://a.example",
            jwt,
            "https URL",
        ),
        (
            "    dev_sign_in: true\n    public_url: http://approvals.example",
            dev,
            "https off loopback",
        ),
        (
            "    dev_sign_in: true\n    public_url: https://approvals.example/console",
            dev,
            "no path",
        ),
        (
            "    dev_sign_in: true\n    session_ttl: 2d",
            dev,
            "between 1m and 12h",
        ),
    ] {
        let error = load(server, identity);
        assert!(error.contains(says), "{server}: {error}");
    }
}

/// The console is a door: a decision made in it and one made through DecideApproval leave the
/// same audit event but for the door, and the same refusals come back from the same rules.
#[tokio::test]
async fn a_console_decision_and_a_grpc_decision_differ_in_the_door_alone() {
    let server = TestServer::demo().await;
    let by_grpc = refund_waiting(&server).await;
    let by_console = refund_waiting(&server).await;
    let mut approvals = server.approvals().await;
    approvals
        .decide_approval(bob().request(proto::DecideApprovalRequest {
            approval_id: by_grpc.clone(),
            decision: proto::ApprovalDecision::Approve as i32,
            reason: "checked".into(),
        }))
        .await
        .unwrap();
    let mut console = Visitor::sign_in(&server, "acme", "bob", "toolgate:approve").await;
    let csrf = console.csrf().await;
    assert_eq!(
        console.decide(&by_console, "approve", &csrf).await.status,
        StatusCode::OK
    );
    let events = server.audit_events_of("approval_decision").await;
    let event = |id: &str| {
        let mut event = events
            .iter()
            .find(|e| e["approval_id"] == id)
            .unwrap()
            .clone();
        let map = event.as_object_mut().unwrap();
        let door = map.remove("door").unwrap();
        for differs in ["time", "approval_id"] {
            map.remove(differs);
        }
        (door, event)
    };
    let (grpc_door, grpc) = event(&by_grpc);
    let (console_door, in_console) = event(&by_console);
    assert_eq!(
        (grpc_door.as_str(), console_door.as_str()),
        (Some("grpc"), Some("console"))
    );
    assert_eq!(grpc, in_console);
    // The same rules refuse alike: the requester, and an approver without the scope.
    let by_alice = refund_waiting(&server).await;
    let mut requester = Visitor::sign_in(&server, "acme", "alice", "toolgate:approve").await;
    let token = requester.csrf().await;
    let refused = requester.decide(&by_alice, "approve", &token).await;
    let grpc_refused =
        approvals
            .decide_approval(alice().scopes("toolgate:approve").request(
                proto::DecideApprovalRequest {
                    approval_id: by_alice.clone(),
                    decision: proto::ApprovalDecision::Approve as i32,
                    reason: String::new(),
                },
            ))
            .await
            .unwrap_err();
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(grpc_refused.code(), tonic::Code::PermissionDenied);
    assert!(
        refused.body.contains(grpc_refused.message()),
        "{}",
        refused.body
    );
    assert_eq!(
        state_of(&server, &by_alice).await,
        proto::ApprovalState::Pending
    );
}

crate::support::on_both_backends!(the_inbox_pages_newest_first_and_says_when_each_was_decided);

/// The inbox is the tenant's pending approvals of every replica (in Redis, all of them), newest
/// first, 20 a page; a decision keeps its time.
async fn the_inbox_pages_newest_first_and_says_when_each_was_decided(
    backend: crate::support::Backend,
) {
    let demo =
        toolgate::settings::DEMO_CATALOG.replace("rate_limit: 5/min", "rate_limit: 1000/min");
    let server = TestServer::start_on(backend, &demo).await;
    let mut made = Vec::new();
    for _ in 0..25 {
        made.push(refund_waiting(&server).await);
    }
    // The gRPC door's order: oldest first.
    let mut approvals = server.approvals().await;
    let listed: Vec<String> = approvals
        .list_approvals(bob().request(proto::ListApprovalsRequest {
            page_size: 100,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .approvals
        .into_iter()
        .map(|a| a.approval_id)
        .collect();
    assert_eq!(listed.len(), 25);
    let mut approver = Visitor::sign_in(&server, "acme", "bob", "toolgate:approve").await;
    let ids_on = |page: &str| -> Vec<String> {
        page.split("data-approval=\"")
            .skip(1)
            .map(|rest| rest[..rest.find('"').unwrap()].to_owned())
            .collect()
    };
    let first = approver.get("/approvals").await.body;
    let mut seen = ids_on(&first);
    assert_eq!(seen.len(), 20);
    let next = first
        .split("href=\"/approvals?after=")
        .nth(1)
        .map(|rest| rest[..rest.find('"').unwrap()].to_owned())
        .expect("a link to the older requests");
    let second = approver.get(&format!("/approvals?after={next}")).await.body;
    seen.extend(ids_on(&second));
    assert!(
        !second.contains("?after="),
        "the last page links no further"
    );
    let newest_first: Vec<String> = listed.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
    // Decided: by whom, when (the server's clock), why.
    let csrf = approver.csrf().await;
    let decided = approver.decide(&seen[0], "reject", &csrf).await;
    assert_eq!(decided.status, StatusCode::OK, "{}", decided.body);
    let page = approver.get("/decided").await.body;
    let row = page
        .split("<tr>")
        .find(|row| row.contains(&seen[0]))
        .expect("the rejection is listed");
    assert!(
        row.contains("bob") && row.contains("checked") && row.contains(" UTC"),
        "{row}"
    );
    let read = approvals
        .get_approval(bob().request(proto::GetApprovalRequest {
            approval_id: seen[0].clone(),
        }))
        .await
        .unwrap()
        .into_inner()
        .approval
        .unwrap();
    assert!(read.decided_at_unix_ms > 0, "{read:?}");
    assert!(!approver.get("/approvals").await.body.contains(&seen[0]));
}

/// Served at an https origin (TLS ended in front of it), the cookies are `Secure` and
/// `__Host-` prefixed, and form posts must come from that origin.
#[tokio::test]
async fn behind_https_the_cookies_are_secure_and_host_only() {
    let demo = toolgate::settings::DEMO_CATALOG.replace(
        "    dev_sign_in: true\n",
        "    dev_sign_in: true\n    public_url: https://approvals.example\n",
    );
    let server = TestServer::start(&demo).await;
    let mut visitor = Visitor::new(&server);
    let on_host = |request: reqwest::RequestBuilder| request.header("host", "approvals.example");
    let page = visitor
        .send(on_host(
            visitor.http.get(format!("{}/sign-in", visitor.base)),
        ))
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let login = page.headers["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        login.starts_with("__Host-toolgate-console-login=") && login.contains("; Secure"),
        "{login}"
    );
    let state = hidden(&page.body, "state");
    let form = format!(
        "state={state}&next=%2Fapprovals&tenant=acme&subject=bob&scopes=toolgate%3Aapprove"
    );
    let (http, base) = (visitor.http.clone(), visitor.base.clone());
    let post = |origin: &str| {
        on_host(http.post(format!("{base}/sign-in/dev")))
            .header("origin", origin)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form.clone())
    };
    let elsewhere = visitor.send(post(&base)).await;
    assert_eq!(
        elsewhere.status,
        StatusCode::FORBIDDEN,
        "the loopback origin is not this console's"
    );
    let signed_in = visitor.send(post("https://approvals.example")).await;
    assert_eq!(signed_in.status, StatusCode::OK, "{}", signed_in.body);
    let session = signed_in
        .headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .find(|v| v.starts_with("__Host-toolgate-console="))
        .unwrap()
        .to_owned();
    assert!(
        session.contains("; Secure") && session.contains("SameSite=Strict"),
        "{session}"
    );
    assert_eq!(
        signed_in.headers["strict-transport-security"],
        "max-age=31536000"
    );
    // The loopback name is not this console's any more: DNS rebinding gets nothing.
    let direct = visitor.get("/sign-in").await;
    assert_eq!(direct.status, StatusCode::MISDIRECTED_REQUEST);
}

/// The decided page shows the emergency denies in force to those the Controls service would
/// show them to, read only: the boundary decides who, and it takes dev identity (the demo's
/// development sign-in too) for the platform's operators. With a provider's sign-in, an approver
/// without the admin scope sees none (tests/python/test_console.py).
#[tokio::test]
async fn the_decided_page_shows_emergency_denies_as_the_controls_service_would() {
    let server = TestServer::demo().await;
    let mut controls =
        toolgate::proto::controls_client::ControlsClient::new(server.channel().await);
    controls
        .set_emergency_deny(
            crate::support::who("acme")
                .scopes("toolgate:admin")
                .request(proto::SetEmergencyDenyRequest {
                    tools: "refund_*".into(),
                    tenant: "acme".into(),
                    reason: "refunds <paused> during the audit".into(),
                    ..Default::default()
                }),
        )
        .await
        .unwrap();
    let mut admin =
        Visitor::sign_in(&server, "acme", "carol", "toolgate:approve toolgate:admin").await;
    let page = admin.get("/decided").await.body;
    assert!(page.contains("Emergency denies in force"), "{page}");
    assert!(page.contains("<code>refund_*</code>"), "{page}");
    assert!(
        page.contains("refunds &lt;paused&gt; during the audit"),
        "{page}"
    );
    assert!(!page.contains("<form class=\"deny"), "read only");
    let mut globex = Visitor::sign_in(&server, "globex", "gus", "toolgate:approve").await;
    let page = globex.get("/decided").await.body;
    assert!(
        page.contains("refund_*"),
        "dev identity is a platform operator: {page}"
    );
}

/// With approvals in Redis, the console of one sidecar lists and decides what an agent asked
/// another for, and the other sees the decision: the inbox is the fleet's.
#[tokio::test]
async fn one_sidecars_console_decides_what_another_sidecar_is_waiting_for() {
    let redis = crate::support::RedisServer::start();
    let shared = toolgate::settings::DEMO_CATALOG.replacen(
        "version: 1\n",
        &format!("version: 1\n{}", crate::support::redis_state(&redis.url())),
        1,
    );
    let agents_sidecar = TestServer::start(&shared).await;
    let approvers_sidecar = TestServer::start(&shared).await;
    let id = refund_waiting(&agents_sidecar).await;
    let mut bob = Visitor::sign_in(&approvers_sidecar, "acme", "bob", "toolgate:approve").await;
    assert!(bob.get("/approvals").await.body.contains(&id));
    let csrf = bob.csrf().await;
    assert_eq!(
        bob.decide(&id, "approve", &csrf).await.status,
        StatusCode::OK
    );
    assert_eq!(
        state_of(&agents_sidecar, &id).await,
        proto::ApprovalState::Approved
    );
    let mut client = agents_sidecar.client().await;
    let mut repeat = call("refund_order", r#"{"order_id":"A-1","amount_cents":2500}"#);
    repeat.approval_id = id.clone();
    let result = exec(&mut client, &alice(), repeat).await;
    assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
}
