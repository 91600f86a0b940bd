//! Verification keys: the algorithm each is used with, read from PEM files, secrets or a JWKS
//! document (a file, or an issuer's published set).

use jsonwebtoken::{
    Algorithm, DecodingKey,
    jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm, PublicKeyUse},
};

/// One verification key and the algorithm it is used with.
#[derive(Clone)]
pub(super) struct Key {
    pub kid: Option<String>,
    pub algorithm: Algorithm,
    pub key: DecodingKey,
}

impl Key {
    /// Whether this key may verify a token whose header names `alg` and `kid`. A key without a
    /// `kid` is tried for any; a token without one is tried with every key of its algorithm.
    pub fn matches(&self, alg: Algorithm, kid: Option<&str>) -> bool {
        self.algorithm == alg
            && match (kid, &self.kid) {
                (Some(want), Some(have)) => want == have,
                _ => true,
            }
    }
}

/// Why one key of a JWKS document cannot verify signatures.
#[derive(Debug, thiserror::Error)]
pub(super) enum JwkError {
    #[error("key has no usable algorithm (RS256/384/512, PS256/384/512, ES256/384, EdDSA)")]
    Algorithm,
    #[error("unusable key: {0}")]
    Unusable(jsonwebtoken::errors::Error),
}

/// The keys of a JWKS document that are for signatures, each with its position in the document
/// and, for a key that cannot be used, why. Keys published for encryption (`"use": "enc"`) are
/// left out: such a key must never verify a signature (RFC 7517 `use`).
pub(super) fn signature_keys(set: &JwkSet) -> Vec<(usize, Result<Key, JwkError>)> {
    set.keys
        .iter()
        .enumerate()
        .filter(|(_, jwk)| {
            !matches!(
                jwk.common.public_key_use,
                Some(PublicKeyUse::Encryption) | Some(PublicKeyUse::Other(_))
            )
        })
        .map(|(i, jwk)| (i, key_of(jwk)))
        .collect()
}

fn key_of(jwk: &Jwk) -> Result<Key, JwkError> {
    let algorithm = algorithm_of(jwk).ok_or(JwkError::Algorithm)?;
    let key = DecodingKey::from_jwk(jwk).map_err(JwkError::Unusable)?;
    Ok(Key {
        kid: jwk.common.key_id.clone(),
        algorithm,
        key,
    })
}

/// The key's declared algorithm, or the usual one for its type; `None` for anything that is
/// not a signature algorithm with a public key (HMAC keys are never read from a JWKS).
fn algorithm_of(jwk: &Jwk) -> Option<Algorithm> {
    match jwk.common.key_algorithm {
        Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
        Some(KeyAlgorithm::RS384) => Some(Algorithm::RS384),
        Some(KeyAlgorithm::RS512) => Some(Algorithm::RS512),
        Some(KeyAlgorithm::PS256) => Some(Algorithm::PS256),
        Some(KeyAlgorithm::PS384) => Some(Algorithm::PS384),
        Some(KeyAlgorithm::PS512) => Some(Algorithm::PS512),
        Some(KeyAlgorithm::ES256) => Some(Algorithm::ES256),
        Some(KeyAlgorithm::ES384) => Some(Algorithm::ES384),
        Some(KeyAlgorithm::EdDSA) => Some(Algorithm::EdDSA),
        Some(_) => None,
        None => match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
            AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                EllipticCurve::P256 => Some(Algorithm::ES256),
                EllipticCurve::P384 => Some(Algorithm::ES384),
                _ => None,
            },
            AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
                Some(Algorithm::EdDSA)
            }
            _ => None,
        },
    }
}
