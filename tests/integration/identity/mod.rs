//! Caller identity from metadata: JWTs (HS256, RS256, ES256) and dev identity.

pub(crate) mod issuer_keys;
pub(crate) mod jwt_settings;
pub(crate) mod under_attack;

use std::time::Duration;

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tonic::Code;
use toolgate::{proto, settings::Env};

use crate::support::{START_UNIX_MS, TestServer, Who, call, exec, visible, who};

const SECRET: &str = "an-hs256-test-secret-that-is-long-enough";

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// Token lifetimes are checked on the server's injected clock, which starts here.
fn now() -> u64 {
    u64::try_from(START_UNIX_MS / 1000).unwrap()
}

fn claims() -> Value {
    json!({"sub": "alice", "tenant": "acme", "agent": "support-bot", "scope": "tickets:read tickets:write",
           "iss": "https://issuer.test", "aud": "toolgate", "exp": now() + 600})
}

fn sign(alg: Algorithm, key: &EncodingKey, claims: &Value) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, key).unwrap()
}

fn hs256(claims: &Value) -> String {
    crate::support::hs256_jwt(SECRET, claims)
}

/// A catalog that accepts JWTs only: HS256 from the environment, RS256 and ES256 from PEM files.
fn jwt_catalog() -> String {
    crate::support::demo_with_identity(
        "  dev_identity: false\n  jwt:\n    hs256_secret_env: TEST_JWT_SECRET\n    public_key_files: [tests/fixtures/rsa_public.pem, tests/fixtures/ec_public.pem]\n    issuer: [\"https://issuer.test\"]\n    audience: [toolgate]\n",
    )
}

async fn jwt_server() -> TestServer {
    TestServer::start_with_env(
        &jwt_catalog(),
        &Env::default().with("TEST_JWT_SECRET", SECRET),
    )
    .await
}

async fn refused(server: &TestServer, who: &Who) -> tonic::Status {
    let mut client = server.client().await;
    client
        .list_tools(who.request(proto::ListToolsRequest {}))
        .await
        .expect_err("refused")
}

#[tokio::test]
async fn valid_tokens_of_each_algorithm_identify_the_caller() {
    let server = jwt_server().await;
    let mut client = server.client().await;
    let rsa = EncodingKey::from_rsa_pem(&fixture("rsa_private.pem")).unwrap();
    let ec = EncodingKey::from_ec_pem(&fixture("ec_private.pem")).unwrap();
    for token in [
        hs256(&claims()),
        sign(Algorithm::RS256, &rsa, &claims()),
        sign(Algorithm::ES256, &ec, &claims()),
    ] {
        // The agent and scopes come from the token: support-bot's narrow list, with both scopes.
        let seen = visible(&mut client, &Who::token(&token)).await;
        assert_eq!(
            seen,
            ["create_ticket", "echo", "query_ticket", "rag_search"]
        );
    }
    // The tenant from the token binds the RAG filter.
    let result = exec(
        &mut client,
        &Who::token(&hs256(&claims())),
        call("rag_search", r#"{"query":"refund"}"#),
    )
    .await;
    assert_eq!(result.status(), proto::ToolStatus::Ok, "{result:?}");
    assert!(result.model_text.contains("acme-1") && !result.model_text.contains("globex"));
    server.stop().await;
}

#[tokio::test]
async fn bad_tokens_are_unauthenticated_and_nothing_runs() {
    let server = jwt_server().await;
    let expired = hs256(
        &json!({"tenant": "acme", "sub": "a", "iss": "https://issuer.test", "aud": "toolgate", "exp": now() - 3600}),
    );
    let wrong_key = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(b"another-secret-another-secret-another").unwrap(),
        &claims(),
    );
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let body = URL_SAFE_NO_PAD.encode(claims().to_string());
    let alg_none = format!("{header}.{body}.");
    let mut no_tenant = claims();
    no_tenant.as_object_mut().unwrap().remove("tenant");
    let mut wrong_audience = claims();
    wrong_audience["aud"] = json!("someone-else");
    let cases = [
        (expired, "expired"),
        (wrong_key, "bad signature"),
        (alg_none, "unsupported algorithm"),
        (hs256(&no_tenant), "no tenant claim"),
        (hs256(&wrong_audience), "wrong audience"),
        ("not-a-jwt".to_owned(), "invalid token"),
    ];
    for (token, expected) in cases {
        let status = refused(&server, &Who::token(&token)).await;
        assert_eq!(
            status.code(),
            Code::Unauthenticated,
            "{expected}: {status:?}"
        );
        assert!(
            status.message().contains(expected),
            "{expected}: {}",
            status.message()
        );
    }
    // Dev metadata while dev identity is off.
    let status = refused(&server, &who("acme")).await;
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(
        status.message().contains("dev identity is off"),
        "{}",
        status.message()
    );
    // Nothing at all.
    let status = refused(&server, &Who::default()).await;
    assert!(
        status.message().contains("missing credentials"),
        "{}",
        status.message()
    );
    // Refused before the boundary: no call was executed or audited.
    let mut client = server.client().await;
    let err = client
        .execute_tool(
            Who::token("x.y.z").request(crate::support::execute_request(call(
                "echo",
                r#"{"text":"x"}"#,
            ))),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert_eq!(server.builtins().executions(), 0);
    // The audit file is there and live (an empty list would also come from a file never made);
    // nothing ran, so the only events are the refused callers' (no token material in them).
    assert!(
        server.audit_path.is_file(),
        "no audit file at {}",
        server.audit_path.display()
    );
    let events = server.audit_events().await;
    assert!(
        !events.is_empty() && events.iter().all(|e| e["kind"] == "authentication_failed"),
        "{events:?}"
    );
    let refused = events.len();
    // ...and a valid token's call runs and is audited, alone.
    let ran = exec(
        &mut client,
        &Who::token(&hs256(&claims())),
        call("echo", r#"{"text":"x"}"#),
    )
    .await;
    assert_eq!(ran.status(), proto::ToolStatus::Ok, "{ran:?}");
    let events = server.audit_events().await;
    assert_eq!(events.len(), refused + 1, "{events:?}");
    let last = &events[refused];
    assert_eq!(
        (last["tool"].as_str(), last["subject"].as_str()),
        (Some("echo"), Some("alice"))
    );
    server.stop().await;
}

#[tokio::test]
async fn dev_identity_needs_a_tenant() {
    let server = TestServer::demo().await;
    let status = refused(
        &server,
        &Who {
            subject: "alice".into(),
            ..Who::default()
        },
    )
    .await;
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(
        status.message().contains("x-toolgate-tenant"),
        "{}",
        status.message()
    );
    server.stop().await;
}

#[tokio::test]
async fn jwks_keys_are_chosen_by_kid() {
    let yaml = crate::support::demo_with_identity(
        "  dev_identity: false\n  jwt:\n    jwks_file: tests/fixtures/jwks.json\n",
    );
    let server = TestServer::start(&yaml).await;
    let rsa = EncodingKey::from_rsa_pem(&fixture("rsa_private.pem")).unwrap();
    let with_kid = |kid: &str| {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(kid.into());
        jsonwebtoken::encode(&header, &claims(), &rsa).unwrap()
    };
    let mut client = server.client().await;
    let seen = visible(&mut client, &Who::token(&with_kid("test-rsa"))).await;
    assert_eq!(seen.len(), 4, "{seen:?}");
    let status = refused(&server, &Who::token(&with_kid("rotated-away"))).await;
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(
        status.message().contains("kid \"rotated-away\""),
        "{}",
        status.message()
    );
    // An HS256 token cannot be verified with an RSA public key used as a secret.
    let status = refused(&server, &Who::token(&hs256(&claims()))).await;
    assert!(
        status.message().contains("no key for algorithm HS256"),
        "{}",
        status.message()
    );
    server.stop().await;
}

#[tokio::test]
async fn token_lifetimes_follow_the_servers_clock_even_after_a_token_was_accepted() {
    let server = jwt_server().await;
    let mut client = server.client().await;
    // Expires 100 s from now; the configured leeway is the default 30 s.
    let mut short_lived = claims();
    short_lived["exp"] = json!(now() + 100);
    let token = hs256(&short_lived);
    // Not valid for another 60 s, beyond the leeway.
    let mut not_yet = claims();
    not_yet["nbf"] = json!(now() + 60);
    let future = hs256(&not_yet);

    assert!(!visible(&mut client, &Who::token(&token)).await.is_empty());
    let status = refused(&server, &Who::token(&future)).await;
    assert!(status.message().contains("not valid yet"), "{status:?}");
    // The same token, one byte of its signature changed, is a different token: verified, refused.
    let mut tampered = token.clone().into_bytes();
    let last = tampered.len() - 2;
    tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    let status = refused(&server, &Who::token(&tampered)).await;
    assert!(status.message().contains("bad signature"), "{status:?}");

    server.clock.advance(Duration::from_secs(100));
    // Within exp + leeway, the accepted token still works; nbf - leeway has passed for the other.
    assert!(!visible(&mut client, &Who::token(&token)).await.is_empty());
    assert!(!visible(&mut client, &Who::token(&future)).await.is_empty());
    server.clock.advance(Duration::from_secs(31));
    // Past exp + leeway: refused although it was accepted (and remembered) before.
    let status = refused(&server, &Who::token(&token)).await;
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(status.message().contains("expired"), "{status:?}");
    let status = refused(&server, &Who::token(&token)).await;
    assert!(status.message().contains("expired"), "{status:?}");
    server.stop().await;
}

#[tokio::test]
async fn exp_must_be_a_whole_number_of_seconds() {
    let server = jwt_server().await;
    for (exp, expected) in [
        (json!(null), "exp"),
        (json!("tomorrow"), "exp"),
        (json!(1.8e9 + 0.5), "exp"),
    ] {
        let mut bad = claims();
        bad["exp"] = exp.clone();
        let status = refused(&server, &Who::token(&hs256(&bad))).await;
        assert_eq!(status.code(), Code::Unauthenticated, "{exp}");
        assert!(status.message().contains(expected), "{exp}: {status:?}");
    }
    let mut bad = claims();
    bad["nbf"] = json!("soon");
    let status = refused(&server, &Who::token(&hs256(&bad))).await;
    assert!(
        status.message().contains("\"nbf\" is not a whole number"),
        "{status:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn line_separators_and_bidirectional_controls_in_claims_stay_inside_one_audit_line() {
    let server = jwt_server().await;
    let mut client = server.client().await;
    // Printable by Unicode's account, so accepted; each would split or reorder an audit line
    // for a reader that is not a JSON parser (Python's splitlines(), a terminal).
    let subject = "alice\u{2028}{\"kind\":\"forged\"}\u{2029}\u{202e}nimda";
    let mut claims = claims();
    claims["sub"] = json!(subject);
    let r = exec(
        &mut client,
        &Who::token(&hs256(&claims)),
        call("echo", r#"{"text":"hi"}"#),
    )
    .await;
    assert_eq!(r.model_text, "hi");
    let event = server
        .wait_for_audit(|e| e["tool"] == "echo" && e["status"] == "OK")
        .await;
    assert_eq!(event["subject"], subject, "the claim is kept whole");
    let file = std::fs::read_to_string(&server.audit_path).unwrap();
    let forbidden = |c: char| matches!(c, '\u{85}' | '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    assert!(
        !file.chars().any(forbidden),
        "raw in the audit file: {file:?}"
    );
    assert!(
        !file.contains("{\"kind\":\"forged\"}\n"),
        "a claim started an audit line of its own"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_claim_holding_a_control_character_is_refused_as_not_printable() {
    let server = jwt_server().await;
    for (claim, value) in [
        ("tenant", "ac\u{1b}[2Jme"),
        ("sub", "alice\nINFO forged"),
        ("agent", "bot\u{7f}"),
    ] {
        let mut claims = claims();
        claims[claim] = json!(value);
        let status = refused(&server, &Who::token(&hs256(&claims))).await;
        assert_eq!(status.code(), Code::Unauthenticated, "{claim}: {status:?}");
        let field = match claim {
            "sub" => "subject",
            other => other,
        };
        assert_eq!(
            status.message(),
            format!("the caller's {field} holds a control character"),
            "{claim}"
        );
    }
    server.stop().await;
}
