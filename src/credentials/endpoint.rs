//! One request to a token endpoint: the grant's form (RFC 8693 token exchange, or client
//! credentials), the client's authentication (a secret, or a `private_key_jwt` assertion), and
//! the answer read within [`MAX_TOKEN_RESPONSE_BYTES`] and the grant's timeout.

use serde_json::Value;

use super::{ClientAuth, CredentialError, CredentialUsed, Grant, MAX_TOKEN_RESPONSE_BYTES};
use crate::{
    clock::SharedClock,
    identity::fingerprint,
    outbound::{BodyError, read_capped},
};

const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN: &str = "urn:ietf:params:oauth:token-type:access_token";
const JWT: &str = "urn:ietf:params:oauth:token-type:jwt";
const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// Longest issued token accepted: it travels in a header.
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// A token the endpoint issued.
pub(super) struct Issued {
    pub token: String,
    pub use_until_ms: i64,
    pub used: CredentialUsed,
}

/// Asks the endpoint for a token: exchanged for `subject_token` when given, else the client's
/// own.
pub(super) async fn request(
    client: &reqwest::Client,
    grant: &Grant,
    label: &str,
    subject_token: Option<&str>,
    clock: &SharedClock,
) -> Result<Issued, CredentialError> {
    let unavailable = |why: String| {
        CredentialError::Unavailable(format!(
            "no credential for {label}: the token endpoint {why}"
        ))
    };
    // The actor token first: the form is built without awaiting anything.
    let actor = match (&grant.actor_token_file, subject_token) {
        (Some(file), Some(_)) => Some(tokio::fs::read_to_string(file).await.map_err(|err| {
            tracing::error!(backend = %label, file = %file.display(), error = %err, "cannot read the actor token");
            CredentialError::Unavailable(format!(
                "no credential for {label}: the sidecar's own token cannot be read"
            ))
        })?),
        _ => None,
    };
    let body = form(grant, label, subject_token, actor.as_deref(), clock)?;
    let mut request = client
        .post(grant.token_endpoint.clone())
        .header(reqwest::header::ACCEPT, "application/json")
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        );
    if let ClientAuth::Secret(secret) = &grant.client_auth {
        // RFC 6749 §2.3.1: each part form-encoded before the Basic encoding.
        let encode =
            |text: &str| url::form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>();
        request = request.basic_auth(encode(&grant.client_id), Some(encode(secret)));
    }
    let exchange = async {
        let response = request
            .body(body)
            .send()
            .await
            .map_err(|err| unavailable(describe(&err)))?;
        let status = response.status();
        let body = read_capped(response, MAX_TOKEN_RESPONSE_BYTES)
            .await
            .map_err(|err| match err {
                BodyError::TooLarge(max) => {
                    unavailable(format!("answered with more than {max} bytes"))
                }
                BodyError::Read(err) => unavailable(describe(&err)),
            })?;
        Ok::<_, CredentialError>((status, body))
    };
    let (status, body) = tokio::time::timeout(grant.timeout, exchange)
        .await
        .map_err(|_| {
            unavailable(format!(
                "did not answer within {}s",
                grant.timeout.as_secs_f64()
            ))
        })??;
    let answer: Option<Value> = serde_json::from_slice(&body).ok();
    if status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408 {
        return Err(unavailable(format!("answered {}", status.as_u16())));
    }
    if !status.is_success() {
        // The endpoint's error code is ours to pass on (RFC 6749 §5.2 codes); its description
        // is not: it may say anything about the token or the person.
        let code = answer
            .as_ref()
            .and_then(|a| a.get("error"))
            .and_then(Value::as_str)
            .filter(|code| {
                code.len() <= 64 && code.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            })
            .unwrap_or("no error code");
        let said = format!(
            "no credential for {label}: the token endpoint refused ({} {code})",
            status.as_u16()
        );
        // These name the sidecar's own setup, not the caller: the same for every caller until
        // an operator fixes the client or the grant.
        if matches!(
            code,
            "invalid_client" | "unauthorized_client" | "unsupported_grant_type" | "invalid_target"
        ) {
            tracing::error!(backend = %label, status = status.as_u16(), code, "the token endpoint refused the sidecar's client or grant: check its credentials settings");
            return Err(CredentialError::Misconfigured(format!(
                "{said}: the sidecar's client or grant is not accepted there; an operator must fix it"
            )));
        }
        return Err(CredentialError::Refused(said));
    }
    let Some(answer) = answer else {
        return Err(unavailable("answered with no JSON".into()));
    };
    let token = answer
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty() && t.len() <= MAX_TOKEN_BYTES)
        .filter(|t| t.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| unavailable("answered with no usable access_token".into()))?;
    let token_type = answer.get("token_type").and_then(Value::as_str);
    if !token_type
        .is_some_and(|t| t.eq_ignore_ascii_case("bearer") || t.eq_ignore_ascii_case("n_a"))
    {
        return Err(unavailable(
            "answered with a token that is not a bearer token".into(),
        ));
    }
    let now = clock.unix_ms();
    // Without expires_in the token is used for one minute; with it, until a tenth of its life
    // (at most 30 s) before it ends, so no call carries a token that expires on the way.
    let lifetime_s = answer
        .get("expires_in")
        .and_then(Value::as_u64)
        .unwrap_or(60)
        .min(24 * 3600);
    let margin_s = (lifetime_s / 10).min(30);
    let use_until_ms =
        now.saturating_add(i64::try_from((lifetime_s - margin_s) * 1000).unwrap_or(0));
    let claims: Option<Value> = jsonwebtoken::dangerous::insecure_decode_claims(token).ok();
    let claim = |name: &str| {
        claims
            .as_ref()
            .and_then(|c| c.get(name))
            .and_then(Value::as_str)
            .map(|s| s.chars().take(256).collect::<String>())
    };
    let actor = claims
        .as_ref()
        .and_then(|c| c.pointer("/act/sub"))
        .and_then(Value::as_str)
        .map(|s| s.chars().take(256).collect());
    Ok(Issued {
        token: token.to_owned(),
        use_until_ms,
        used: CredentialUsed {
            kind: "",
            subject: claim("sub"),
            actor,
            audience: claim("aud")
                .or_else(|| grant.audience.clone().or_else(|| grant.resource.clone())),
            fingerprint: fingerprint(token),
        },
    })
}

/// The request's form: the grant's parameters and, for `private_key_jwt`, the client's signed
/// assertion.
fn form(
    grant: &Grant,
    label: &str,
    subject_token: Option<&str>,
    actor: Option<&str>,
    clock: &SharedClock,
) -> Result<String, CredentialError> {
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    match subject_token {
        Some(subject) => {
            form.append_pair("grant_type", TOKEN_EXCHANGE)
                .append_pair("subject_token", subject)
                .append_pair("subject_token_type", ACCESS_TOKEN)
                .append_pair("requested_token_type", ACCESS_TOKEN);
            if let Some(actor) = actor {
                form.append_pair("actor_token", actor.trim())
                    .append_pair("actor_token_type", JWT);
            }
        }
        None => {
            form.append_pair("grant_type", "client_credentials");
        }
    }
    for (name, value) in [
        ("audience", &grant.audience),
        ("resource", &grant.resource),
        ("scope", &grant.scope),
    ] {
        if let Some(value) = value {
            form.append_pair(name, value);
        }
    }
    if let ClientAuth::PrivateKeyJwt {
        key,
        algorithm,
        kid,
    } = &grant.client_auth
    {
        let now = clock.unix_ms() / 1000;
        let mut header = jsonwebtoken::Header::new(*algorithm);
        header.kid = kid.clone();
        let claims = serde_json::json!({
            "iss": grant.client_id, "sub": grant.client_id,
            "aud": grant.token_endpoint.as_str(),
            "jti": uuid::Uuid::new_v4().to_string(),
            "iat": now, "exp": now + 60,
        });
        let assertion = jsonwebtoken::encode(&header, &claims, key).map_err(|err| {
            tracing::error!(backend = %label, error = %err, "cannot sign the client assertion");
            CredentialError::Unavailable(format!(
                "no credential for {label}: the client assertion cannot be signed"
            ))
        })?;
        form.append_pair("client_id", &grant.client_id)
            .append_pair("client_assertion_type", JWT_BEARER)
            .append_pair("client_assertion", &assertion);
    }
    Ok(form.finish())
}

/// A client error in words, never the address or the request.
fn describe(err: &reqwest::Error) -> String {
    if let Some(refused) = crate::outbound::refusal_in(err) {
        refused
    } else if err.is_connect() {
        "is unreachable".to_owned()
    } else if err.is_timeout() {
        "timed out".to_owned()
    } else {
        "broke the connection".to_owned()
    }
}
