//! Identity holds under attack (issue 11, items 7–9): dev identity is exclusive with JWT and kept
//! to loopback unless the operator says otherwise in so many words; JWKS keys for encryption never
//! verify a signature; identity changes apply on reload (the token cache with them) and changes
//! that need a restart refuse the reload loudly.

use std::{path::Path, process::Command, time::Duration};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tonic::Code;
use toolgate::{config::Config, proto, settings::Env};

use crate::support::{START_UNIX_MS, TestServer, Who, http_get, metric, visible, who};

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn load(yaml: &str) -> Result<Config, toolgate::settings::ConfigError> {
    Config::from_yaml(yaml, "t.yaml", manifest_dir(), &Env::default())
}

const TOOLS: &str = "tenants: { acme: {} }\ntools:\n  - { name: echo, description: Echo., risk_level: read_only, executor: { builtin: echo }, input_schema: { type: object, properties: { text: { type: string } } } }\n";

#[test]
fn dev_identity_is_exclusive_with_jwt_and_kept_to_loopback() {
    let both = format!(
        "version: 1\nidentity:\n  dev_identity: true\n  jwt: {{ hs256_secret_file: tests/fixtures/README }}\n{TOOLS}"
    );
    let err = load(&both).unwrap_err();
    assert_eq!(err.path, "identity.dev_identity", "{err}");
    let exposed = format!(
        "version: 1\nserver: {{ listen: \"0.0.0.0:50051\" }}\nidentity: {{ dev_identity: true }}\n{TOOLS}"
    );
    let err = load(&exposed).unwrap_err();
    assert_eq!(err.path, "server.listen", "{err}");
    assert!(
        err.message
            .contains("allow_unauthenticated_network_callers"),
        "{err}"
    );
    let consented = exposed.replace(
        "dev_identity: true }",
        "dev_identity: true, allow_unauthenticated_network_callers: true }",
    );
    assert!(load(&consented).is_ok());
    let loopback = format!(
        "version: 1\nserver: {{ listen: \"[::1]:50051\" }}\nidentity: {{ dev_identity: true }}\n{TOOLS}"
    );
    assert!(load(&loopback).is_ok());
}

#[test]
fn the_demo_refuses_a_network_listener() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args([
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .env_remove("TOOLGATE_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("0.0.0.0:0 is not a loopback address"),
        "{stderr}"
    );
}

#[test]
fn the_first_log_line_of_the_demo_says_callers_are_not_authenticated() {
    let mut spawned = crate::support::binary::spawn(&[]);
    crate::support::binary::sigterm(&spawned.child);
    assert!(crate::support::binary::wait_exit(&mut spawned.child).success());
    let logs = spawned.logs();
    let first: Value = serde_json::from_str(logs.lines().next().unwrap()).unwrap();
    assert_eq!(first["level"], "WARN", "{first}");
    assert!(
        first["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("callers are NOT authenticated")),
        "{first}"
    );
}

fn rsa_token(kid: &str) -> String {
    let key = EncodingKey::from_rsa_pem(
        &std::fs::read(manifest_dir().join("tests/fixtures/rsa_private.pem")).unwrap(),
    )
    .unwrap();
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(kid.into());
    let claims = json!({"tenant": "acme", "sub": "alice", "exp": START_UNIX_MS / 1000 + 600});
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

#[tokio::test]
async fn a_jwks_key_for_encryption_never_verifies_a_signature() {
    let published: Value = serde_json::from_slice(
        &std::fs::read(manifest_dir().join("tests/fixtures/jwks.json")).unwrap(),
    )
    .unwrap();
    let signing = published["keys"][0].clone();
    // The same public key, published twice: once for signatures, once for encryption.
    let mut encryption = signing.clone();
    encryption["kid"] = json!("enc-key");
    encryption["use"] = json!("enc");
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, json!({"keys": [signing, encryption]}).to_string()).unwrap();
    let catalog = format!(
        "version: 1\nidentity: {{ jwt: {{ jwks_file: {} }} }}\n{TOOLS}",
        jwks.display()
    );
    let server = TestServer::start(&catalog).await;
    let mut client = server.client().await;
    assert_eq!(
        visible(&mut client, &Who::token(&rsa_token("test-rsa"))).await,
        ["echo"]
    );
    let err = client
        .list_tools(Who::token(&rsa_token("enc-key")).request(proto::ListToolsRequest {}))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    server.stop().await;
}

const OLD_SECRET: &str = "the-first-hs256-secret-of-this-test-0001";
const NEW_SECRET: &str = "the-rotated-hs256-secret-of-this-test-02";

fn hs256(secret: &str) -> String {
    let claims = json!({"tenant": "acme", "sub": "alice", "aud": "toolgate", "exp": START_UNIX_MS / 1000 + 600});
    crate::support::hs256_jwt(secret, &claims)
}

/// Files are polled often, so a change is seen quickly (the same in every version of the file:
/// `server` changes need a restart).
const RELOAD: &str = "server: { reload_interval: 100ms }\n";

async fn reloads(server: &TestServer, result: &str) -> f64 {
    let (_, page) = http_get(server.admin_addr(), "/metrics").await;
    metric(
        &page,
        "toolgate_catalog_reloads_total",
        &[("result", result)],
    )
}

#[tokio::test]
async fn identity_changes_apply_on_reload_and_restart_only_sections_refuse_it() {
    let dev = format!("version: 1\n{RELOAD}identity: {{ dev_identity: true }}\n{TOOLS}");
    let server = TestServer::start_file(&dev).await;
    let mut client = server.client().await;
    assert_eq!(visible(&mut client, &who("acme")).await, ["echo"]);

    // Dev identity off, JWT on: headers are no longer trusted, tokens are.
    let secret = server.dir().join("jwt.secret");
    std::fs::write(&secret, OLD_SECRET).unwrap();
    let jwt = format!(
        "version: 1\n{RELOAD}identity: {{ jwt: {{ hs256_secret_file: {}, audience: [toolgate] }} }}\n{TOOLS}",
        secret.display()
    );
    server.write_catalog(&server.catalog_file(), &jwt);
    server.reload().await.expect("the identity change applies");
    let err = client
        .list_tools(who("acme").request(proto::ListToolsRequest {}))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let old_token = hs256(OLD_SECRET);
    assert_eq!(
        visible(&mut client, &Who::token(&old_token)).await,
        ["echo"]
    );

    // The key rotates (only the Secret file changes): a token verified under the old key is not
    // trusted from the cache, and the new key's tokens are accepted — no SIGHUP needed.
    std::fs::write(&secret, NEW_SECRET).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let refused = client
            .list_tools(Who::token(&old_token).request(proto::ListToolsRequest {}))
            .await
            .is_err();
        if refused {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rotated key was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        visible(&mut client, &Who::token(&hs256(NEW_SECRET))).await,
        ["echo"]
    );
    let ok_reloads = reloads(&server, "ok").await;

    // A change to a section that needs a restart is refused, whole, and says which.
    let with_limits_change = jwt
        .replacen(
            "version: 1\n",
            "version: 1\nlimits: { max_parallel: 2 }\n",
            1,
        )
        .replace("echo, description: Echo.", "echo, description: Echo again.");
    server.write_catalog(&server.catalog_file(), &with_limits_change);
    let err = server.reload().await.unwrap_err();
    assert!(err.contains("limits") && err.contains("restart"), "{err}");
    let (_, page) = http_get(server.admin_addr(), "/metrics").await;
    assert_eq!(metric(&page, "toolgate_config_restart_required", &[]), 1.0);
    assert_eq!(reloads(&server, "restart_required").await, 1.0);
    assert_eq!(
        reloads(&server, "ok").await,
        ok_reloads,
        "no success was counted"
    );
    let mut token_client = server.client().await;
    let listed = token_client
        .list_tools(Who::token(&hs256(NEW_SECRET)).request(proto::ListToolsRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        listed.tools[0].description, "Echo.",
        "the tool change was applied"
    );
    server.stop().await;
}
