//! A real OpenID Connect provider on a loopback port (tests/fixtures/idp/server.mjs: the
//! `oidc-provider` npm package with test controls), and the token-verifying upstream beside it
//! (tests/fixtures/idp/whoami_upstream.py). Both are stopped when dropped (killed by PID).

use serde_json::{Value, json};

/// A running IdP. Its issuer is `http://127.0.0.1:PORT`.
pub struct Idp {
    pub issuer: String,
    http: reqwest::Client,
    _child: tokio::process::Child,
}

impl Idp {
    pub async fn start() -> Idp {
        Self::start_with(&[]).await
    }

    /// With extra environment (`IDP_CLIENTS`, `IDP_TOKEN_TTL`).
    pub async fn start_with(envs: &[(&str, &str)]) -> Idp {
        let (port, child) = super::spawn_listening(
            tokio::process::Command::new("node")
                .arg(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/fixtures/idp/server.mjs"
                ))
                .env("PORT", "0")
                .envs(envs.iter().copied())
                .stderr(std::process::Stdio::null()),
        )
        .await;
        toolgate::tls::install_crypto_provider();
        Idp {
            issuer: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            _child: child,
        }
    }

    pub fn jwks_url(&self) -> String {
        format!("{}/jwks", self.issuer)
    }

    pub fn token_endpoint(&self) -> String {
        format!("{}/token", self.issuer)
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let response = self
            .http
            .post(format!("{}{path}", self.issuer))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{path}: {response:?}");
        serde_json::from_str(&response.text().await.unwrap()).unwrap()
    }

    /// A token signed by the IdP's current key, with these claims (`iss` filled in; `exp`
    /// should be given: the IdP's clock is the machine's, the sidecar's may be a test's).
    pub async fn mint(&self, claims: Value) -> String {
        self.post("/test/mint", claims).await["token"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// A new signing key; the old ones stay published unless `drop_old`. The new kid.
    pub async fn rotate(&self, drop_old: bool) -> String {
        self.post("/test/rotate", json!({ "drop_old": drop_old }))
            .await["kid"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// New key material under the current kid, replacing the current key.
    pub async fn replace_key_under_same_kid(&self) {
        self.post("/test/rotate", json!({ "same_kid": true })).await;
    }

    /// Requests served so far: `jwks`, `discovery`, `token` (by grant type), `token_requests`.
    pub async fn stats(&self) -> Value {
        let response = self
            .http
            .get(format!("{}/test/stats", self.issuer))
            .send()
            .await
            .unwrap();
        serde_json::from_str(&response.text().await.unwrap()).unwrap()
    }

    /// How many times the JWKS was fetched.
    pub async fn jwks_fetches(&self) -> u64 {
        self.stats().await["jwks"].as_u64().unwrap()
    }

    /// Makes the token and/or JWKS endpoints misbehave (`{"jwks": "down"}`, …).
    pub async fn mode(&self, mode: Value) {
        self.post("/test/mode", mode).await;
    }
}

/// tests/fixtures/idp/whoami_upstream.py: verifies each bearer token against the IdP's keys
/// (audience `audience`) and answers what it saw; `GET /seen` lists every token's SHA-256.
pub struct Whoami {
    pub url: String,
    http: reqwest::Client,
    _child: tokio::process::Child,
}

impl Whoami {
    pub async fn start(idp: &Idp, audience: &str) -> Whoami {
        let (port, child) = super::spawn_listening(
            tokio::process::Command::new(super::python())
                .arg(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/fixtures/idp/whoami_upstream.py"
                ))
                .args(["--port", "0", "--jwks-url", &idp.jwks_url()])
                .args(["--audience", audience, "--issuer", &idp.issuer])
                .stderr(std::process::Stdio::null()),
        )
        .await;
        Whoami {
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            _child: child,
        }
    }

    /// The SHA-256 (hex) of every bearer token the upstream received.
    pub async fn seen(&self) -> Vec<String> {
        let response = self
            .http
            .get(format!("{}/seen", self.url))
            .send()
            .await
            .unwrap();
        serde_json::from_str(&response.text().await.unwrap()).unwrap()
    }
}

/// tests/fixtures/idp/whoami_mcp_server.py: an MCP server over Streamable HTTP that verifies the
/// bearer token of every request against the IdP's keys (audience `audience`); its tool `whoami`
/// answers what the token of its call said, and `GET /seen` lists every request it received.
pub struct WhoamiMcp {
    pub url: String,
    http: reqwest::Client,
    _child: tokio::process::Child,
}

impl WhoamiMcp {
    pub async fn start(idp: &Idp, audience: &str) -> WhoamiMcp {
        let (port, child) = super::spawn_listening(
            tokio::process::Command::new(super::python())
                .arg(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/fixtures/idp/whoami_mcp_server.py"
                ))
                .args(["--jwks-url", &idp.jwks_url()])
                .args(["--audience", audience, "--issuer", &idp.issuer])
                .stderr(std::process::Stdio::null()),
        )
        .await;
        WhoamiMcp {
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            _child: child,
        }
    }

    /// Every request the server received: `{method, sub, valid, token_sha256}`.
    pub async fn seen(&self) -> Vec<Value> {
        let response = self
            .http
            .get(format!("{}/seen", self.url))
            .send()
            .await
            .unwrap();
        serde_json::from_str(&response.text().await.unwrap()).unwrap()
    }
}
