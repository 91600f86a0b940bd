//! Delegation tokens: what a sidecar hands a sub-agent with a handoff call, so that the
//! sub-agent's own sidecar (any replica, any sidecar of the fleet) takes the caller from it —
//! the person stays the caller, the agent is the sub-agent — and narrows what it may do: the
//! chain of agents, the parent run and call, the depth and its limit, the tools each handoff of
//! the chain allowed, the budgets each gave, and a lifetime never past the parent call's
//! deadline.
//!
//! A token is a JWT (ES256) signed with the operator's key (`identity.delegation.signing_key_file`)
//! and verified with the fleet's public keys (`verify_key_files`, and the signing key's own).
//! It travels in `x-toolgate-delegation`: a request header (gRPC metadata, the MCP door's HTTP
//! header), in A2A message metadata under the same name, never in the model's text.

use std::{collections::BTreeMap, path::Path, sync::Arc};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use super::{AuthMethod, Caller, Claims, IdentityError};
use crate::settings::FieldError;

/// The header (and A2A metadata key) a delegation travels in.
pub const DELEGATION_HEADER: &str = "x-toolgate-delegation";
/// The audience every delegation token names.
const AUDIENCE: &str = "toolgate-delegation";
/// Most handoffs in one chain, whatever a token says.
pub const MAX_DEPTH: u32 = 16;
/// Longest token accepted (bytes).
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// One handoff's tool lists: a tool must match an `allow` entry (when there are any) and no
/// `deny` entry. A delegated caller passes every handoff's lists of its chain.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolLists {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
}

/// A budget one handoff gave its sub-agent, kept under the handoff's call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffBudget {
    /// The handoff call's id (with the root run, the budget's key).
    pub call: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub max_calls_per_tool: BTreeMap<String, u64>,
}

/// A verified delegation: who the sub-agent works for, and within what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegation {
    /// The agents of the chain, the root caller's first, then each that handed off (the
    /// sub-agent itself is the caller's agent, not listed here).
    pub chain: Vec<String>,
    /// The root run: every budget of the chain is spent there.
    pub run: String,
    /// The call that handed off.
    pub parent_call: String,
    /// Handoffs from the root caller to this sub-agent (1 for the first).
    pub depth: u32,
    /// The most the chain may reach (the smallest any handoff of it allowed).
    pub max_depth: u32,
    /// Each handoff's tool lists.
    pub tools: Vec<ToolLists>,
    /// Each handoff's budget.
    #[serde(default)]
    pub budgets: Vec<HandoffBudget>,
    /// The parent call's trace context, for the sub-agent's spans to continue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// When the token expires (Unix seconds): never past the parent call's deadline.
    #[serde(skip)]
    pub expires: u64,
}

/// What a token says, as signed.
#[derive(Debug, Serialize, Deserialize)]
struct TokenClaims {
    iss: String,
    aud: String,
    /// The person (the root caller's subject).
    sub: String,
    tnt: String,
    /// The sub-agent.
    agt: String,
    /// The root caller's scopes: a delegation never holds more.
    #[serde(default)]
    scp: Vec<String>,
    /// The root caller's claims exposed to conditions and bindings.
    #[serde(default)]
    clm: serde_json::Map<String, serde_json::Value>,
    iat: u64,
    exp: u64,
    jti: String,
    dlg: Delegation,
}

/// The fleet's delegation keys: the one this sidecar signs with (if it hands off), and the
/// public keys it verifies with.
pub struct DelegationKeys {
    issuer: String,
    signer: Option<EncodingKey>,
    verifiers: Vec<DecodingKey>,
    /// Longest lifetime a token is issued with (a handoff's own timeout and the parent call's
    /// deadline may shorten it).
    pub max_ttl: std::time::Duration,
}

impl std::fmt::Debug for DelegationKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegationKeys")
            .field("issuer", &self.issuer)
            .field("signs", &self.signer.is_some())
            .field("verifies", &self.verifiers.len())
            .field("max_ttl", &self.max_ttl)
            .finish()
    }
}

/// What a token is issued for.
pub struct Issue<'a> {
    pub caller: &'a Caller,
    pub agent: &'a str,
    pub delegation: Delegation,
    pub now: u64,
}

impl DelegationKeys {
    /// Keys from PEM files: `signing_key` an EC P-256 private key (PKCS#8), `verify` EC public
    /// keys (a sidecar that verifies its own tokens lists its own public key there too).
    pub fn load(
        issuer: &str,
        signing_key: Option<&Path>,
        verify: &[&Path],
        max_ttl: std::time::Duration,
        at: &str,
    ) -> Result<Self, FieldError> {
        let read = |path: &Path, field: &str| {
            std::fs::read(path).map_err(|err| {
                FieldError::new(
                    format!("{at}.{field}"),
                    format!("cannot read {}: {err}", path.display()),
                )
            })
        };
        let mut verifiers = Vec::new();
        let signer = match signing_key {
            Some(path) => {
                let pem = read(path, "signing_key_file")?;
                Some(EncodingKey::from_ec_pem(&pem).map_err(|err| {
                    FieldError::new(
                        format!("{at}.signing_key_file"),
                        format!("not an EC P-256 private key in PEM: {err}"),
                    )
                })?)
            }
            None => None,
        };
        for (i, path) in verify.iter().enumerate() {
            let pem = read(path, &format!("verify_key_files[{i}]"))?;
            let key = DecodingKey::from_ec_pem(&pem).map_err(|err| {
                FieldError::new(
                    format!("{at}.verify_key_files[{i}]"),
                    format!("not an EC P-256 public key in PEM: {err}"),
                )
            })?;
            verifiers.push(key);
        }
        Ok(DelegationKeys {
            issuer: issuer.to_owned(),
            signer,
            verifiers,
            max_ttl,
        })
    }

    /// The fleet's delegation keys, when `identity.delegation` is set.
    pub fn from_raw(
        raw: &crate::settings::raw::RawIdentity,
        base_dir: &Path,
    ) -> Result<Option<Arc<Self>>, FieldError> {
        let Some(delegation) = &raw.delegation else {
            return Ok(None);
        };
        let at = "identity.delegation";
        let max_ttl = match &delegation.max_ttl {
            Some(text) => crate::settings::parse_duration(text)
                .map_err(|err| FieldError::new(format!("{at}.max_ttl"), err.to_string()))?,
            None => std::time::Duration::from_secs(15 * 60),
        };
        let signing = delegation
            .signing_key_file
            .as_ref()
            .map(|f| crate::settings::resolve_path(base_dir, f));
        let verify: Vec<_> = delegation
            .verify_key_files
            .iter()
            .map(|f| crate::settings::resolve_path(base_dir, f))
            .collect();
        if signing.is_none() && verify.is_empty() {
            return Err(FieldError::new(
                at,
                "names no key: give signing_key_file (to hand off), verify_key_files (to accept handoffs) or both",
            ));
        }
        Self::load(
            delegation.issuer.as_deref().unwrap_or("toolgate"),
            signing.as_deref(),
            &verify.iter().map(|p| p.as_path()).collect::<Vec<_>>(),
            max_ttl,
            at,
        )
        .map(|keys| Some(Arc::new(keys)))
    }

    /// Whether this sidecar can issue tokens (it has a signing key).
    pub fn can_issue(&self) -> bool {
        self.signer.is_some()
    }

    /// A signed token for `issue`.
    pub fn issue(&self, issue: Issue<'_>) -> Result<String, String> {
        let key = self.signer.as_ref().ok_or(
            "this sidecar has no delegation signing key (identity.delegation.signing_key_file)",
        )?;
        let caller = issue.caller;
        let claims = TokenClaims {
            iss: self.issuer.clone(),
            aud: AUDIENCE.to_owned(),
            sub: caller.subject.clone(),
            tnt: caller.tenant.to_string(),
            agt: issue.agent.to_owned(),
            scp: caller.scopes.iter().cloned().collect(),
            clm: caller.claims.map().cloned().unwrap_or_default(),
            iat: issue.now,
            exp: issue.delegation.expires,
            jti: uuid::Uuid::new_v4().to_string(),
            dlg: issue.delegation,
        };
        jsonwebtoken::encode(&Header::new(Algorithm::ES256), &claims, key)
            .map_err(|err| err.to_string())
    }

    /// The caller a token names, if it verifies: signed by a fleet key, this issuer and
    /// audience, unexpired (no leeway), within the depth limits.
    pub fn verify(&self, token: &str, max_identity_bytes: usize) -> Result<Caller, IdentityError> {
        let invalid = |why: &str| IdentityError::InvalidDelegation(why.to_owned());
        if token.len() > MAX_TOKEN_BYTES {
            return Err(invalid("the token is too long"));
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| invalid("not a JWT"))?;
        if header.alg != Algorithm::ES256 {
            return Err(invalid("not signed with ES256"));
        }
        if self.verifiers.is_empty() {
            return Err(invalid("this sidecar trusts no delegation keys"));
        }
        let mut validation = Validation::new(Algorithm::ES256);
        validation.set_audience(&[AUDIENCE]);
        validation.set_issuer(&[&self.issuer]);
        validation.leeway = 0;
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let mut last = invalid("signed by a key this sidecar does not trust");
        for key in &self.verifiers {
            match jsonwebtoken::decode::<TokenClaims>(token, key, &validation) {
                Ok(data) => return caller_of(data.claims, max_identity_bytes),
                Err(err) => {
                    last = match err.kind() {
                        jsonwebtoken::errors::ErrorKind::ExpiredSignature => invalid("expired"),
                        jsonwebtoken::errors::ErrorKind::InvalidSignature => {
                            invalid("its signature does not verify")
                        }
                        jsonwebtoken::errors::ErrorKind::InvalidIssuer => {
                            invalid("issued by another issuer")
                        }
                        jsonwebtoken::errors::ErrorKind::InvalidAudience => {
                            invalid("not a delegation token")
                        }
                        _ => invalid("its claims are malformed"),
                    };
                }
            }
        }
        Err(last)
    }
}

fn caller_of(claims: TokenClaims, max_identity_bytes: usize) -> Result<Caller, IdentityError> {
    let invalid = |why: &str| IdentityError::InvalidDelegation(why.to_owned());
    let mut delegation = claims.dlg;
    if delegation.depth == 0
        || delegation.depth > delegation.max_depth
        || delegation.max_depth > MAX_DEPTH
    {
        return Err(invalid("its depth is beyond its limit"));
    }
    if delegation.tools.is_empty() || delegation.chain.is_empty() {
        return Err(invalid("it names no tools or no chain"));
    }
    if claims.tnt.trim().is_empty() {
        return Err(invalid("it names no tenant"));
    }
    delegation.expires = claims.exp;
    let caller = Caller {
        tenant: claims.tnt.into(),
        subject: claims.sub,
        agent: claims.agt.into(),
        scopes: claims.scp.into_iter().collect(),
        method: AuthMethod::Delegation,
        claims: Claims::new(claims.clm),
        token: None,
        delegation: Some(Arc::new(delegation)),
    };
    super::check_lengths(&caller, max_identity_bytes)?;
    Ok(caller)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(issuer: &str) -> DelegationKeys {
        let fixture = |name: &str| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(name)
        };
        DelegationKeys::load(
            issuer,
            Some(&fixture("ec_private.pem")),
            &[&fixture("ec_public.pem")],
            std::time::Duration::from_secs(600),
            "identity.delegation",
        )
        .unwrap()
    }

    fn alice() -> Caller {
        Caller {
            tenant: "acme".into(),
            subject: "alice".into(),
            agent: "support-bot".into(),
            scopes: ["tickets:read".to_owned()].into(),
            method: AuthMethod::Jwt,
            claims: Claims::default(),
            token: None,
            delegation: None,
        }
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn token(keys: &DelegationKeys, depth: u32, max_depth: u32, expires: u64) -> String {
        keys.issue(Issue {
            caller: &alice(),
            agent: "research",
            delegation: Delegation {
                chain: vec!["support-bot".into()],
                run: "r1".into(),
                parent_call: "c1".into(),
                depth,
                max_depth,
                tools: vec![ToolLists {
                    allow: vec!["rag_search".into()],
                    deny: vec![],
                }],
                budgets: vec![],
                traceparent: None,
                expires,
            },
            now: now(),
        })
        .unwrap()
    }

    fn refusal(result: Result<Caller, IdentityError>) -> String {
        result.map(|c| format!("{c:?}")).unwrap_err().to_string()
    }

    #[test]
    fn a_token_names_the_person_the_sub_agent_and_the_chain() {
        let keys = keys("fleet");
        let caller = keys.verify(&token(&keys, 1, 2, now() + 60), 256).unwrap();
        assert_eq!(
            (&*caller.tenant, caller.subject.as_str()),
            ("acme", "alice")
        );
        assert_eq!(
            (&*caller.agent, caller.method),
            ("research", AuthMethod::Delegation)
        );
        assert!(caller.scopes.contains("tickets:read"));
        let delegation = caller.delegation.unwrap();
        assert_eq!((delegation.depth, delegation.max_depth), (1, 2));
        assert_eq!(delegation.chain, ["support-bot"]);
    }

    #[test]
    fn expired_foreign_over_deep_and_other_algorithms_are_refused() {
        let keys = keys("fleet");
        assert!(refusal(keys.verify(&token(&keys, 1, 2, now() - 5), 256)).contains("expired"));
        let other = self::keys("another-fleet");
        assert!(
            refusal(other.verify(&token(&keys, 1, 2, now() + 60), 256))
                .contains("issued by another issuer")
        );
        assert!(refusal(keys.verify(&token(&keys, 3, 2, now() + 60), 256)).contains("depth"));
        let hs256 = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &serde_json::json!({"sub": "alice"}),
            &EncodingKey::from_secret(b"secret").unwrap(),
        )
        .unwrap();
        assert!(refusal(keys.verify(&hs256, 256)).contains("not signed with ES256"));
        let no_keys = DelegationKeys {
            verifiers: Vec::new(),
            ..self::keys("fleet")
        };
        assert!(
            refusal(no_keys.verify(&token(&keys, 1, 2, now() + 60), 256))
                .contains("trusts no delegation keys")
        );
    }
}
