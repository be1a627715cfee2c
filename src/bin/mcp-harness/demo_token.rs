//! The tokens the demo authorization server issues and the demo server checks: the
//! claims as base64url JSON, then an HMAC-SHA-256 over them with a secret both share
//! (the `hmac` crate; a test format, not a JWT). A resource server needs to check a
//! token without calling the authorization server; this is the least that does it.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// What a token says.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Claims {
    /// Who signed in (or the client, for client credentials).
    pub sub: String,
    /// The resource it is for.
    pub aud: String,
    /// The issuer.
    pub iss: String,
    /// Space-separated scopes.
    pub scope: String,
    /// Expiry, unix seconds.
    pub exp: u64,
    /// A unique id, so that two tokens are never equal.
    pub jti: String,
}

fn mac(secret: &str, data: &[u8]) -> Option<Vec<u8>> {
    let mut m = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).ok()?;
    m.update(data);
    Some(m.finalize().into_bytes().to_vec())
}

/// A token carrying `claims`.
pub fn issue(secret: &str, claims: &Claims) -> String {
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).unwrap_or_default());
    let tag = mac(secret, body.as_bytes()).unwrap_or_default();
    format!("{body}.{}", URL_SAFE_NO_PAD.encode(tag))
}

/// The claims of a token this secret issued, if it did.
pub fn verify(secret: &str, token: &str) -> Option<Claims> {
    let (body, tag) = token.split_once('.')?;
    let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
    let mut m = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).ok()?;
    m.update(body.as_bytes());
    m.verify_slice(&tag).ok()?;
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(body).ok()?).ok()
}

/// Unix seconds now.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
