//! The shared state's credentials through the real binary: a password read from a file is
//! checked against a real redis-server with `--requirepass` (deploy/README's sidecar side), and
//! no message of `check`, `serve` or a reload ever quotes a password written into the URL by
//! mistake, whatever else is wrong with it.

use std::{path::Path, process::Command};

use toolgate::proto::ToolStatus;

use crate::{
    shared_state::tools,
    support::binary::{spawn, stop},
    support::{RedisServer, call, exec, who},
};

const SECRET: &str = "correct-horse-battery-staple";

fn catalog(redis: &str) -> String {
    format!(
        r#"version: 1
identity: {{ dev_identity: true }}
state:
  backend: redis
  redis: {{ url: "{redis}", timeout: 5s, password_file: redis-password }}
audit: {{ sink: none }}
tenants: {{ acme: {{}} }}
tools:
  - {{ name: limited, description: Five a minute., risk_level: read_only, rate_limit: 5/min, executor: {{ builtin: echo_arguments }}, input_schema: {{ type: object }} }}
"#
    )
}

fn toolgate(args: &[&str], config: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap()
}

#[tokio::test]
async fn the_password_from_a_file_is_checked_against_redis_and_never_logged() {
    let redis = RedisServer::start_with(&["--requirepass", SECRET]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("catalog.yaml");
    std::fs::write(&config, catalog(&redis.url())).unwrap();
    // The file is relative to the catalog, and its trailing newline is not part of it.
    let password = dir.path().join("redis-password");
    std::fs::write(&password, format!("{SECRET}\n")).unwrap();
    let ok = toolgate(&["check", "--connect"], &config);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{ok:?}");
    assert!(
        stdout.contains(&format!("state backend {}: ok", redis.url())),
        "{stdout}"
    );
    // Redis refuses a wrong one, and check says so without quoting either.
    std::fs::write(&password, "wrong-password").unwrap();
    let wrong = toolgate(&["check", "--connect"], &config);
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(wrong.status.code(), Some(1), "{wrong:?}");
    assert!(stderr.contains("state backend"), "{stderr}");
    assert!(!stderr.contains("wrong-password"), "{stderr}");
    // Served with the right one: calls reach Redis, and the password is in no log line.
    std::fs::write(&password, SECRET).unwrap();
    let sidecar = spawn(&["--config", &config.display().to_string()]);
    let mut client = tools(&sidecar).await;
    assert_eq!(
        exec(&mut client, &who("acme"), call("limited", "{}"))
            .await
            .status(),
        ToolStatus::Ok
    );
    let exists = redis.command_authed(
        SECRET,
        &["EXISTS", "toolgate:{acme}:rl:tool:limited:5/60s/5"],
    );
    assert_eq!(exists.await, redis::Value::Int(1));
    drop(client);
    let logs = stop(sidecar).await;
    assert!(!logs.contains(SECRET), "{logs}");
}

/// URLs with a password and one more mistake each; `hunter2` must never be printed.
const MISTAKES: &[(&str, &str)] = &[
    ("http://:hunter2@127.0.0.1", "redis://"),
    ("redis://:hunter2@127.0.0.1:99999", "invalid port"),
    ("redis://u:hunter2@", "empty host"),
    ("redis:hunter2@host", "no host"),
    ("redis://:pa/hunter2@host", "[redacted]"),
    ("redis://:hunter2@127.0.0.1/x", "credentials"),
    ("rediss://user:hunter2@127.0.0.1?tls=1", "credentials"),
];

fn with_url(url: &str) -> String {
    format!(
        "version: 1\nidentity: {{ dev_identity: true }}\nstate:\n  backend: redis\n  redis: {{ url: \"{url}\" }}\ntenants: {{ acme: {{}} }}\ntools: []\n"
    )
}

#[test]
fn check_and_serve_never_quote_a_password_in_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("catalog.yaml");
    for (url, why) in MISTAKES {
        std::fs::write(&config, with_url(url)).unwrap();
        for args in [&["check"][..], &["serve", "--listen", "127.0.0.1:0"][..]] {
            let out = toolgate(args, &config);
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
            assert_eq!(out.status.code(), Some(1), "{args:?} {url}: {stderr}");
            assert!(
                stderr.contains("state.redis.url"),
                "{args:?} {url}: {stderr}"
            );
            assert!(stderr.contains(why), "{args:?} {url}: {stderr}");
            assert!(
                !stdout.contains("hunter2") && !stderr.contains("hunter2"),
                "{args:?} {url}: {stdout}{stderr}"
            );
        }
    }
}

#[tokio::test]
async fn a_reload_never_quotes_a_password_in_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("catalog.yaml");
    let good = with_url("redis://127.0.0.1:1");
    std::fs::write(&config, &good).unwrap();
    let sidecar = spawn(&["--config", &config.display().to_string()]);
    let pid = sidecar.child.id().to_string();
    let sidecar = tokio::task::spawn_blocking(move || {
        for (url, _) in MISTAKES {
            std::fs::write(&config, with_url(url)).unwrap();
            assert!(
                Command::new("kill")
                    .args(["-HUP", &pid])
                    .status()
                    .unwrap()
                    .success()
            );
            sidecar.wait_for_log(
                "catalog reload refused; the previous catalog keeps serving (the file and the files it references are watched for a fix)",
                1,
            );
        }
        sidecar
    })
    .await
    .unwrap();
    let logs = stop(sidecar).await;
    assert!(logs.contains("state.redis.url"), "{logs}");
    assert!(!logs.contains("hunter2"), "{logs}");
}
