//! How a sidecar reaches Redis: the password from the environment, checked and never logged; rediss verified against the configured CA.

use super::*;

#[tokio::test]
async fn the_password_comes_from_the_environment_is_checked_and_never_logged() {
    let secret = "correct-horse-battery-staple";
    let redis = RedisServer::start_with(&["--requirepass", secret]);
    let dir = tempfile::tempdir().unwrap();
    let yaml = catalog(&redis.url(), "127.0.0.1:9".parse().unwrap(), "").replace(
        "timeout: 5s }",
        "timeout: 5s, password_env: REDIS_PASSWORD }",
    );
    let path = dir.path().join("catalog.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let path = path.display().to_string();
    let check = |password: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["check", "--connect", "--config", &path])
            .env("REDIS_PASSWORD", password)
            .output()
            .unwrap()
    };
    let ok = check(secret);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{ok:?}");
    assert!(
        stdout.contains(&format!("state backend {}: ok", redis.url())),
        "{stdout}"
    );
    let wrong = check("wrong-password");
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(wrong.status.code(), Some(1), "{wrong:?}");
    assert!(stderr.contains("state backend"), "{stderr}");
    assert!(!stderr.contains("wrong-password"), "{stderr}");
    // Served: calls work, and the password appears in no log line.
    let sidecar = spawn_with_env(&["--config", &path], &[("REDIS_PASSWORD", secret)]);
    let mut client = tools(&sidecar).await;
    assert_eq!(
        exec(&mut client, &alice(), call("limited", "{}"))
            .await
            .status(),
        ToolStatus::Ok
    );
    drop(client);
    let logs = stop(sidecar).await;
    assert!(!logs.contains(secret), "{logs}");
}

#[tokio::test]
async fn rediss_is_verified_against_the_configured_ca() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let fixture = |name: &str| fixtures.join(name).display().to_string();
    let redis = RedisServer::start_tls(&[
        "--tls-cert-file",
        &fixture("redis-server.pem"),
        "--tls-key-file",
        &fixture("redis-server-key.pem"),
        "--tls-ca-cert-file",
        &fixture("redis-ca.pem"),
        "--tls-auth-clients",
        "no",
    ]);
    let tls_port = redis.tls_port().expect("started with TLS");
    let url = format!("rediss://127.0.0.1:{tls_port}");
    // Without the test CA, the server's certificate is not trusted: nothing is sent.
    let dir = tempfile::tempdir().unwrap();
    let untrusted = dir.path().join("catalog.yaml");
    std::fs::write(&untrusted, in_process(&url, "")).unwrap();
    let checked = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["check", "--connect", "--config"])
        .arg(&untrusted)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert_eq!(checked.status.code(), Some(1), "{stderr}");
    assert!(stderr.to_lowercase().contains("certificate"), "{stderr}");
    // With it, calls go through TLS to this Redis.
    let yaml = in_process(&url, "").replace(
        "timeout: 5s }",
        "timeout: 5s, ca_file: tests/fixtures/redis-ca.pem }",
    );
    let server = TestServer::start(&yaml).await;
    let mut client = server.client().await;
    let result = exec(&mut client, &alice(), call("limited", "{}")).await;
    assert_eq!(result.status(), ToolStatus::Ok, "{result:?}");
    let exists = redis
        .command(&["EXISTS", "toolgate:{acme}:rl:tool:limited:5/60s/5"])
        .await;
    assert_eq!(exists, redis::Value::Int(1));
    server.stop().await;
}
