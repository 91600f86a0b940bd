//! Keys from the issuer (docs/identity.md): fetched from a real OpenID provider on loopback
//! (`oidc-provider`, tests/fixtures/idp), found through discovery or named directly; a rotation
//! at the issuer accepted without a restart; a withdrawn key no longer vouching for tokens it
//! verified; a flood of random `kid`s costing the issuer nothing past the rate limit; the last
//! good keys serving while the issuer answers nothing useful, for `keep_last_good` and no longer;
//! several issuers, each with its own keys and claim mapping.

use std::time::Duration;

use serde_json::{Value, json};
use tonic::Code;
use toolgate::proto::ToolStatus;

use crate::support::{START_UNIX_MS, TestServer, Who, call, execute_request, idp::Idp};

const TOOLS: &str = r#"tenants: { acme: {}, payments: {} }
tools:
  - name: whoami
    description: Returns who the server says is calling.
    risk_level: read_only
    executor: { builtin: echo_arguments }
    input_schema: { type: object, properties: { tenant: { type: string }, subject: { type: string } } }
    bind: { tenant: "${caller.tenant}", subject: "${caller.subject}" }
"#;

/// A catalog trusting the IdP's published keys, with these `jwks:` settings.
fn catalog(idp: &Idp, jwks: &str) -> String {
    format!(
        "version: 1\nidentity:\n  jwt:\n    jwks: {jwks}\n    issuer: [\"{}\"]\n    audience: [toolgate]\n{TOOLS}",
        idp.issuer
    )
}

/// A person's token from the IdP, valid on the test server's clock for `hours`.
async fn person(idp: &Idp, sub: &str, hours: i64) -> String {
    idp.mint(json!({"sub": sub, "tenant": "acme", "aud": "toolgate",
                    "exp": START_UNIX_MS / 1000 + hours * 3600}))
        .await
}

async fn whoami(server: &TestServer, token: &str) -> Result<Value, tonic::Status> {
    let mut client = server.client().await;
    let result = client
        .execute_tool(Who::token(token).request(execute_request(call("whoami", "{}"))))
        .await?
        .into_inner()
        .result
        .unwrap();
    assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
    Ok(serde_json::from_str(&result.model_text).unwrap())
}

async fn refused(server: &TestServer, token: &str) -> String {
    let status = whoami(server, token).await.expect_err("refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    status.message().to_owned()
}

#[tokio::test]
async fn keys_found_through_discovery_follow_a_rotation_and_a_withdrawal_without_a_restart() {
    let idp = Idp::start().await;
    let server = TestServer::start(&catalog(
        &idp,
        &format!(
            "{{ discover: \"{}\", refresh: 1h, min_refresh_interval: 1s }}",
            idp.issuer
        ),
    ))
    .await;
    let alice = person(&idp, "alice", 1).await;
    assert_eq!(
        whoami(&server, &alice).await.unwrap(),
        json!({"tenant": "acme", "subject": "alice"})
    );
    let stats = idp.stats().await;
    assert!(stats["discovery"].as_u64().unwrap() >= 1, "{stats}");

    // A new key at the issuer: a token signed with it names a kid the sidecar has not seen, so
    // the sidecar fetches the keys again (once) and accepts it.
    let before = idp.jwks_fetches().await;
    idp.rotate(false).await;
    // (The refetch interval is counted on the sidecar's clock, the test's.)
    server.clock.advance(Duration::from_secs(1));
    let bob = person(&idp, "bob", 1).await;
    assert_eq!(whoami(&server, &bob).await.unwrap()["subject"], "bob");
    assert_eq!(idp.jwks_fetches().await, before + 1);
    // Alice's token, under the old key the issuer still publishes, still verifies (cached).
    assert_eq!(whoami(&server, &alice).await.unwrap()["subject"], "alice");

    // The issuer withdraws the old keys. Once the sidecar has seen the set without them (a
    // token under the newest key makes it look), Alice's token, verified and cached under a
    // withdrawn key, is refused, not served from the cache until it expires.
    idp.rotate(true).await;
    server.clock.advance(Duration::from_secs(1));
    let carol = person(&idp, "carol", 1).await;
    assert_eq!(whoami(&server, &carol).await.unwrap()["subject"], "carol");
    let message = refused(&server, &alice).await;
    assert!(
        message.contains("no key for algorithm RS256 and kid"),
        "{message}"
    );
    server.stop().await;
}

/// The issuer replaces a key under the same `kid` (new key material, same name). A token
/// signed with the new key fails against the old one, which makes the sidecar look at the
/// issuer's keys again (rate-limited like an unknown kid) and accept it; tokens verified under the
/// replaced key are then verified again, and refused, rather than served from the token cache.
#[tokio::test]
async fn a_key_replaced_under_the_same_kid_is_fetched_and_no_longer_vouches_for_its_tokens() {
    let idp = Idp::start().await;
    let server = TestServer::start(&catalog(
        &idp,
        &format!(
            "{{ url: \"{}\", refresh: 1h, min_refresh_interval: 1s }}",
            idp.jwks_url()
        ),
    ))
    .await;
    let alice = person(&idp, "alice", 1).await;
    assert_eq!(whoami(&server, &alice).await.unwrap()["subject"], "alice");
    let before = idp.jwks_fetches().await;
    idp.replace_key_under_same_kid().await;
    server.clock.advance(Duration::from_secs(1));
    let bob = person(&idp, "bob", 1).await;
    assert_eq!(whoami(&server, &bob).await.unwrap()["subject"], "bob");
    assert_eq!(idp.jwks_fetches().await, before + 1);
    let message = refused(&server, &alice).await;
    assert!(message.contains("invalid token"), "{message}");
    // Within the interval, a failing signature fetches nothing more.
    assert_eq!(idp.jwks_fetches().await, before + 1);
    server.stop().await;
}

/// A reload that changes only how keys are fetched (here `refresh`) keeps the keys already
/// fetched: with the issuer down, tokens still verify after it.
#[tokio::test]
async fn a_reload_of_the_fetch_settings_keeps_the_fetched_keys() {
    let idp = Idp::start().await;
    let jwks = |refresh: &str| {
        format!(
            "{{ url: \"{}\", refresh: {refresh}, min_refresh_interval: 1s }}",
            idp.jwks_url()
        )
    };
    let server = TestServer::start_file(&catalog(&idp, &jwks("1h"))).await;
    let alice = person(&idp, "alice", 1).await;
    assert_eq!(whoami(&server, &alice).await.unwrap()["subject"], "alice");
    idp.mode(json!({ "jwks": "down" })).await;
    server.write_catalog(&server.catalog_file(), &catalog(&idp, &jwks("2h")));
    server.reload().await.unwrap();
    // The new verifier's token cache is empty: Alice's token is verified again, with the keys
    // carried over.
    assert_eq!(whoami(&server, &alice).await.unwrap()["subject"], "alice");
    server.stop().await;
}

#[tokio::test]
async fn a_flood_of_unknown_kids_fetches_nothing_within_the_interval() {
    let idp = Idp::start().await;
    let server = TestServer::start(&catalog(
        &idp,
        &format!(
            "{{ url: \"{}\", refresh: 1h, min_refresh_interval: 1h }}",
            idp.jwks_url()
        ),
    ))
    .await;
    assert_eq!(
        whoami(&server, &person(&idp, "alice", 1).await)
            .await
            .unwrap()["subject"],
        "alice"
    );
    let fetched = idp.jwks_fetches().await;
    // 60 tokens, each naming a kid of its own, signed by a key the issuer never published, sent
    // 20 at a time.
    let mut forged = Vec::new();
    for i in 0..60 {
        forged.push(
            idp.mint(
                json!({"sub": "mallory", "tenant": "acme", "aud": "toolgate",
                            "exp": START_UNIX_MS / 1000 + 600,
                            "sign_with": "unpublished", "kid": format!("random-{i}")}),
            )
            .await,
        );
    }
    for batch in forged.chunks(20) {
        let answers = futures::future::join_all(batch.iter().map(|t| whoami(&server, t))).await;
        for answer in answers {
            let status = answer.expect_err("refused");
            assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
            assert!(
                status
                    .message()
                    .contains("no key for algorithm RS256 and kid \"random-"),
                "{status:?}"
            );
        }
    }
    assert_eq!(
        idp.jwks_fetches().await,
        fetched,
        "the flood fetched the keys"
    );
    // The same limit holds for a real rotation within the interval: its tokens wait for the
    // schedule (issuers publish a key before they sign with it, docs/identity.md).
    idp.rotate(false).await;
    let message = refused(&server, &person(&idp, "bob", 1).await).await;
    assert!(
        message.contains("no key for algorithm RS256 and kid"),
        "{message}"
    );
    assert_eq!(idp.jwks_fetches().await, fetched);
    server.stop().await;
}

#[tokio::test]
async fn the_last_good_keys_serve_while_the_issuer_fails_then_stop_after_keep_last_good() {
    let idp = Idp::start().await;
    let server = TestServer::start(&catalog(
        &idp,
        &format!(
            "{{ url: \"{}\", refresh: 1h, min_refresh_interval: 1s, keep_last_good: 2h, max_bytes: 65536 }}",
            idp.jwks_url()
        ),
    ))
    .await;
    let alice = person(&idp, "alice", 5).await;
    assert_eq!(whoami(&server, &alice).await.unwrap()["subject"], "alice");

    // Each failing answer (down, not JSON, over max_bytes) is a failed fetch that keeps the
    // keys: a token under an unknown kid makes the sidecar try, and fail.
    for (mode, why) in [
        ("down", "answered 503"),
        ("garbage", "answered with no JSON"),
        ("huge", "the answer is over 65536 bytes"),
    ] {
        idp.mode(json!({ "jwks": mode })).await;
        server.clock.advance(Duration::from_secs(1));
        let before = idp.jwks_fetches().await;
        let stranger = idp
            .mint(json!({"sub": "x", "tenant": "acme", "aud": "toolgate", "exp": START_UNIX_MS / 1000 + 600,
                         "sign_with": "unpublished", "kid": format!("unknown-{mode}")}))
            .await;
        refused(&server, &stranger).await;
        assert_eq!(idp.jwks_fetches().await, before + 1, "{mode}: one fetch");
        // A token under a key fetched before, never seen by the sidecar, still verifies.
        let fresh = person(&idp, &format!("after-{mode}"), 5).await;
        assert_eq!(
            whoami(&server, &fresh).await.unwrap()["subject"],
            format!("after-{mode}"),
            "{mode}: why it failed: {why}"
        );
    }

    // Past keep_last_good without a good fetch, no token of this issuer is accepted, cached or
    // not, and the refusal says why.
    server.clock.advance(Duration::from_secs(2 * 3600 + 60));
    let message = refused(&server, &alice).await;
    assert!(
        message.contains("longer than keep_last_good (7200s)")
            && message.contains("the answer is over 65536 bytes"),
        "{message}"
    );
    // (That refusal tried a fetch, which failed.) The issuer answers again: once the interval
    // has passed, the next token that finds no keys makes the sidecar fetch.
    idp.mode(json!({ "jwks": "normal" })).await;
    server.clock.advance(Duration::from_secs(1));
    assert_eq!(whoami(&server, &alice).await.unwrap()["subject"], "alice");
    server.stop().await;
}

#[tokio::test]
async fn several_issuers_each_verify_their_own_tokens_with_their_own_claims() {
    let idp = Idp::start().await;
    let jwks = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jwks.json");
    let server = TestServer::start(&format!(
        r#"version: 1
identity:
  jwt:
    - issuer: ["{issuer}"]
      audience: [toolgate]
      jwks: {{ url: "{issuer}/jwks", min_refresh_interval: 1ms }}
    - issuer: ["https://kubernetes.default.svc"]
      audience: [toolgate]
      jwks_file: {jwks}
      claims: {{ tenant: namespace, subject: serviceaccount }}
{TOOLS}"#,
        issuer = idp.issuer
    ))
    .await;
    // A person, from the company IdP.
    assert_eq!(
        whoami(&server, &person(&idp, "alice", 1).await)
            .await
            .unwrap(),
        json!({"tenant": "acme", "subject": "alice"})
    );
    // A workload, from the cluster's issuer (keys from a file), mapped by its own claims.
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(
        &std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/rsa_private.pem"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some("test-rsa".into());
    let workload = |iss: &str| {
        jsonwebtoken::encode(
            &header,
            &json!({"iss": iss, "aud": "toolgate", "namespace": "payments",
                    "serviceaccount": "refund-worker", "exp": START_UNIX_MS / 1000 + 600}),
            &key,
        )
        .unwrap()
    };
    assert_eq!(
        whoami(&server, &workload("https://kubernetes.default.svc"))
            .await
            .unwrap(),
        json!({"tenant": "payments", "subject": "refund-worker"})
    );
    // Each issuer's tokens verify with its own keys only: the cluster's key signing a token
    // that says it is the IdP's, and the IdP signing one that says it is the cluster's.
    let message = refused(&server, &workload(&idp.issuer)).await;
    assert!(
        message.contains("no key for algorithm RS256 and kid \"test-rsa\""),
        "{message}"
    );
    let claimed = idp
        .mint(json!({"iss": "https://kubernetes.default.svc", "aud": "toolgate", "namespace": "payments",
                     "serviceaccount": "x", "exp": START_UNIX_MS / 1000 + 600}))
        .await;
    let message = refused(&server, &claimed).await;
    assert!(message.contains("no key for algorithm RS256"), "{message}");
    // An issuer no entry names.
    let message = refused(&server, &workload("https://elsewhere.test")).await;
    assert!(
        message.contains("issuer \"https://elsewhere.test\" is not one this sidecar trusts"),
        "{message}"
    );
    server.stop().await;
}

#[test]
fn issuer_key_settings_are_checked_at_load() {
    let load = |identity: &str| {
        toolgate::config::Config::from_yaml(
            &format!("version: 1\nidentity:\n{identity}\ntools: []\n"),
            "catalog.yaml",
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
            &toolgate::settings::Env::default(),
        )
        .map(|_| ())
        .map_err(|err| err.to_string())
    };
    for (identity, refusal) in [
        (
            "  jwt: { jwks: { url: \"http://idp.example.com/keys\" } }",
            "identity.jwt.jwks.url: must be an https URL (http is accepted only on a loopback address)",
        ),
        (
            "  jwt: { jwks: { url: \"https://idp.example.com/keys\", discover: \"https://idp.example.com\" } }",
            "identity.jwt.jwks: set exactly one of url",
        ),
        (
            "  jwt: { jwks: { url: \"https://idp.example.com/keys\", refresh: 1m, keep_last_good: 30s } }",
            "identity.jwt.jwks.keep_last_good: cannot be shorter than refresh",
        ),
        (
            "  jwt:\n    - { jwks_file: tests/fixtures/jwks.json, issuer: [a] }\n    - { jwks_file: tests/fixtures/jwks.json }",
            "identity.jwt[1].issuer: with several issuers, each must name its iss value(s)",
        ),
        (
            "  jwt:\n    - { jwks_file: tests/fixtures/jwks.json, issuer: [a] }\n    - { jwks_file: tests/fixtures/jwks.json, issuer: [b, a] }",
            "identity.jwt[1].issuer: \"a\" is named by another issuer too",
        ),
        (
            "  jwt:\n    - { jwks_file: tests/fixtures/jwks.json, issuer: [a], unknown: 1 }",
            "unknown field `unknown`",
        ),
    ] {
        let err = load(identity).expect_err(identity);
        assert!(err.contains(refusal), "{identity}\n{err}");
    }
    // Loopback issuers may speak plain http (tests, a local IdP); one entry or a list of one.
    load("  jwt: { jwks: { url: \"http://127.0.0.1:9/keys\" } }").unwrap();
    load("  jwt: [ { jwks: { discover: \"http://localhost:9\" } } ]").unwrap();
}
