//! Who is signed in: a session sealed into an `HttpOnly`, `SameSite=Strict` cookie (HMAC-SHA256
//! under the console's key), so any replica sharing the key reads it and nothing is kept per
//! person. A session names its person (tenant, subject, scopes) and a random id; the CSRF token
//! of its forms is derived from that id, so it is bound to the session and changes with it.
//! Signing out revokes the id on this replica until the session would have expired anyway.
//!
//! The sign-in in progress (OpenID Connect `state`, nonce, PKCE verifier, where to go back to)
//! is sealed the same way into a short-lived cookie of its own (`SameSite=Lax`: the issuer's
//! redirect back is a cross-site navigation).

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD as B64};
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use sha2::Sha256;

use crate::identity::{AuthMethod, Caller, Claims};

type HmacSha256 = Hmac<Sha256>;

/// Seals and opens values with the console's key; each use has its own purpose, so a value
/// sealed for one is never accepted as another.
pub struct Sealer {
    key: Vec<u8>,
}

/// The longest sealed value read (a cookie holds at most about 4 KB).
const MAX_SEALED: usize = 4096;

impl Sealer {
    /// `key`: at least 32 bytes (checked at load), or a random key for this process.
    pub fn new(key: Option<&[u8]>) -> Self {
        let key = match key {
            Some(key) => key.to_vec(),
            None => random_bytes().to_vec(),
        };
        Sealer { key }
    }

    fn mac(&self, purpose: &str, data: &[u8]) -> HmacSha256 {
        // HMAC takes keys of any length: `new_from_slice` cannot fail for it.
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        mac.update(purpose.as_bytes());
        mac.update(&[0]);
        mac.update(data);
        mac
    }

    pub fn seal(&self, purpose: &str, value: &impl Serialize) -> String {
        // Plain structs of strings and numbers always serialize.
        let json = serde_json::to_vec(value).unwrap_or_default();
        let tag = self.mac(purpose, &json).finalize().into_bytes();
        format!("{}.{}", B64.encode(&json), B64.encode(tag))
    }

    /// The value, if `text` was sealed by this key for `purpose`.
    pub fn open<T: DeserializeOwned>(&self, purpose: &str, text: &str) -> Option<T> {
        if text.len() > MAX_SEALED {
            return None;
        }
        let (body, tag) = text.split_once('.')?;
        let json = B64.decode(body).ok()?;
        let tag = B64.decode(tag).ok()?;
        self.mac(purpose, &json).verify_slice(&tag).ok()?;
        serde_json::from_slice(&json).ok()
    }

    /// The CSRF token of the forms of session `sid`.
    pub fn csrf_token(&self, sid: &str) -> String {
        B64.encode(self.mac("csrf", sid.as_bytes()).finalize().into_bytes())
    }

    /// Whether `token` is session `sid`'s CSRF token (compared in constant time).
    pub fn csrf_matches(&self, sid: &str, token: &str) -> bool {
        B64.decode(token)
            .is_ok_and(|tag| self.mac("csrf", sid.as_bytes()).verify_slice(&tag).is_ok())
    }
}

/// 32 random bytes (two version-4 UUIDs: 244 random bits, from the operating system's source).
fn random_bytes() -> [u8; 32] {
    let mut bytes = [0; 32];
    bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes
}

/// A random value for a URL or a cookie: an id, a `state`, a nonce, a PKCE verifier (43
/// characters, as RFC 7636 asks).
pub fn random_token() -> String {
    B64.encode(random_bytes())
}

/// The PKCE S256 challenge of `verifier` (RFC 7636 §4.2).
pub fn pkce_challenge(verifier: &str) -> String {
    use sha2::Digest;
    B64.encode(Sha256::digest(verifier.as_bytes()))
}

/// A signed-in person.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Session {
    /// Random: what the CSRF token and a sign-out are bound to.
    pub sid: String,
    pub tenant: String,
    pub subject: String,
    pub scopes: BTreeSet<String>,
    /// Signed in with the development form, not an identity provider.
    pub dev: bool,
    /// When it began and when it ends (Unix ms).
    pub issued_ms: i64,
    pub expires_ms: i64,
}

impl Session {
    /// The approver every decision is made for: the boundary checks its scope and tenant.
    pub fn caller(&self) -> Caller {
        Caller {
            tenant: Arc::from(self.tenant.as_str()),
            subject: self.subject.clone(),
            agent: Arc::from(""),
            scopes: self.scopes.clone(),
            method: if self.dev {
                AuthMethod::Dev
            } else {
                AuthMethod::Jwt
            },
            claims: Claims::default(),
            token: None,
            delegation: None,
        }
    }
}

/// A sign-in under way.
#[derive(Debug, Serialize, Deserialize)]
pub struct Login {
    /// The OpenID Connect `state`, and the dev form's anti-forgery token.
    pub state: String,
    pub nonce: String,
    pub verifier: String,
    /// The console page to go back to.
    pub next: String,
    pub expires_ms: i64,
}

/// Sessions signed out before their end, on this replica: id -> when it would have ended; and
/// a time before which every session is refused, set when too many sign-outs are remembered (so
/// a flood of sign-outs cannot push one out and bring its session back: it fails closed, by
/// signing everyone on this replica out).
#[derive(Default)]
pub struct Revoked(Mutex<RevokedState>);

#[derive(Default)]
pub struct RevokedState {
    ids: HashMap<String, i64>,
    not_before_ms: i64,
}

/// Most sign-outs remembered.
const MAX_REVOKED: usize = 10_000;

impl Revoked {
    pub fn revoke(&self, session: &Session, now_ms: i64) {
        let mut revoked = self.0.lock().unwrap_or_else(|e| e.into_inner());
        revoked.ids.retain(|_, ends| *ends > now_ms);
        if revoked.ids.len() >= MAX_REVOKED {
            tracing::warn!(
                remembered = MAX_REVOKED,
                "console: too many sign-outs to remember; every session begun so far on this replica is signed out"
            );
            revoked.ids.clear();
            revoked.not_before_ms = now_ms + 1;
            return;
        }
        revoked.ids.insert(session.sid.clone(), session.expires_ms);
    }

    pub fn refuses(&self, session: &Session) -> bool {
        let revoked = self.0.lock().unwrap_or_else(|e| e.into_inner());
        session.issued_ms < revoked.not_before_ms || revoked.ids.contains_key(&session.sid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_their_key_and_purpose() {
        let sealer = Sealer::new(Some(&[7; 32]));
        let sealed = sealer.seal("session", &("alice", 3));
        assert_eq!(
            sealer.open::<(String, i32)>("session", &sealed),
            Some(("alice".to_owned(), 3))
        );
        assert_eq!(sealer.open::<(String, i32)>("login", &sealed), None);
        assert_eq!(
            Sealer::new(Some(&[8; 32])).open::<(String, i32)>("session", &sealed),
            None
        );
        let (body, tag) = sealed.split_once('.').unwrap();
        let forged = format!("{}.{tag}", B64.encode(br#"["mallory",3]"#));
        assert_ne!(forged, sealed);
        assert_eq!(sealer.open::<(String, i32)>("session", &forged), None);
        assert_eq!(sealer.open::<(String, i32)>("session", body), None);
    }

    #[test]
    fn a_csrf_token_belongs_to_one_session() {
        let sealer = Sealer::new(None);
        let token = sealer.csrf_token("s1");
        assert!(sealer.csrf_matches("s1", &token));
        assert!(!sealer.csrf_matches("s2", &token));
        assert!(!sealer.csrf_matches("s1", ""));
        assert!(!sealer.csrf_matches("s1", "not base64!"));
    }

    fn session(sid: &str, issued_ms: i64) -> Session {
        Session {
            sid: sid.into(),
            tenant: "acme".into(),
            subject: "bob".into(),
            scopes: BTreeSet::new(),
            dev: false,
            issued_ms,
            expires_ms: issued_ms + 1_000_000,
        }
    }

    #[test]
    fn a_flood_of_sign_outs_signs_everyone_out_rather_than_forget_one() {
        let revoked = Revoked::default();
        let victim = session("victim", 10);
        revoked.revoke(&victim, 100);
        assert!(revoked.refuses(&victim));
        let bystander = session("bystander", 50);
        assert!(!revoked.refuses(&bystander));
        for i in 0..MAX_REVOKED {
            revoked.revoke(&session(&format!("s{i}"), 100), 200);
        }
        // The map is full: nothing is forgotten one by one; everything begun so far is refused.
        assert!(revoked.refuses(&victim));
        assert!(revoked.refuses(&bystander));
        assert!(!revoked.refuses(&session("later", 202)));
    }

    #[test]
    fn the_pkce_challenge_is_rfc_7636s() {
        // RFC 7636, appendix B.
        assert_eq!(
            pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
        assert_eq!(random_token().len(), 43);
    }
}
