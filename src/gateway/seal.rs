//! Sealed `requestState`: what an upstream server handed out, wrapped so that a
//! downstream client can carry it but not read, change, reuse elsewhere or keep past its
//! expiry.
//!
//! The envelope is `v1.KID.BASE64URL(nonce ‖ ciphertext ‖ tag)`, ChaCha20-Poly1305 from
//! `ring` (already in the tree through rustls; no cryptography here beyond calling it),
//! a random 96-bit nonce per seal, the key id as associated data. Inside: the upstream
//! server and its state, the principal, the method, a digest of the request's params,
//! the issue time, the expiry and the rounds so far. Any process holding the same keys
//! opens it: a round started on one gateway can finish on another.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::GatewayError;

/// Milliseconds since the epoch (0 for a clock before it, so that nothing opens).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How far ahead of this gateway's clock another's may have issued a state (replicas'
/// clocks differ a little; one minutes ahead is wrong).
const ISSUED_AHEAD_MS: u64 = 60_000;

/// Largest sealed state accepted (a bound before any decoding), and so issued.
pub(crate) const MAX_SEALED: usize = 256 * 1024;

/// Why a sealed state was refused. The downstream client gets one message for all of
/// them (invalid params); the log gets the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// Not an envelope of ours, or too large.
    #[error("not a request state this gateway issued")]
    Malformed,
    /// Sealed with a key this gateway does not hold.
    #[error("sealed with unknown key {0:?}")]
    UnknownKey(String),
    /// The tag does not verify: changed, or sealed with another key of the same id.
    #[error("the request state was altered")]
    Tampered,
    /// Past its expiry.
    #[error("the request state expired")]
    Expired,
    /// Issued to another principal.
    #[error("the request state was issued to another caller")]
    OtherPrincipal,
    /// Issued for another method or other params.
    #[error("the request state was issued for another request")]
    OtherRequest,
}

/// What a sealed state holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundState {
    /// The upstream server that issued the round.
    pub server: String,
    /// Its `requestState`, as it sent it (absent if it sent none).
    pub upstream: Option<String>,
    /// The id of a legacy server's question held in this gateway process (a parked
    /// round), apart from `upstream`: whatever state a server issues, it is never
    /// taken for one of the gateway's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked: Option<String>,
    /// The principal: agent id and auth context.
    pub agent: String,
    /// The auth context, if any.
    pub context: Option<String>,
    /// The method (`tools/call`, `prompts/get`, `resources/read`).
    pub method: String,
    /// Hex SHA-256 of the request's params without `_meta`, `inputResponses` and
    /// `requestState`, keys sorted.
    pub digest: String,
    /// Issue time, ms since the epoch.
    pub issued_ms: u64,
    /// Expiry, ms since the epoch.
    pub expires_ms: u64,
    /// Rounds the logical call has had.
    pub rounds: usize,
    /// What the server was when it issued the round (a digest of its command, working
    /// directory and arguments, or its URL): a reload that points its id at another server ends the
    /// round, whose state belongs to the first. Absent from states of before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The form of the state: [`STATE_VERSION`] now; 0 (absent) from a gateway
    /// version before it, when a parked round was named by `upstream` alone.
    #[serde(default, rename = "v")]
    pub version: u8,
}

/// The form of the states this gateway seals (see [`RoundState::version`]).
pub const STATE_VERSION: u8 = 1;

/// The keys: several accepted (for rotation), the first one seals. Cheap to clone.
#[derive(Clone)]
pub struct Sealer {
    keys: std::sync::Arc<Vec<(String, LessSafeKey)>>,
    /// Each key's id and a digest of its bytes ([`Sealer::sealing_key`]): a key
    /// replaced under the same id is another key.
    named: std::sync::Arc<Vec<String>>,
    ttl: Duration,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("Sealer")
            .field("keys", &ids)
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl Sealer {
    /// Keys from text: one `KID:BASE64URL(32 bytes)` per line or comma-separated; `#`
    /// starts a comment. The first key seals; all open.
    pub fn from_text(text: &str, ttl: Duration) -> Result<Sealer, GatewayError> {
        let bad = |why: String| GatewayError::Keys(why);
        let mut keys = Vec::new();
        let mut named = Vec::new();
        for (n, item) in text
            .lines()
            .map(|l| l.split('#').next().unwrap_or(""))
            .flat_map(|l| l.split(','))
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .enumerate()
        {
            let Some((id, key)) = item.split_once(':') else {
                return Err(bad("each key is KID:BASE64URL".into()));
            };
            let id = id.trim();
            if id.is_empty()
                || id.len() > 32
                || !id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                // Not shown: with the fields swapped (`KEY:KID`) it is the key.
                return Err(bad(format!(
                    "the key id of key {} (before its ':') is not 1 to 32 letters, digits, - or _",
                    n + 1
                )));
            }
            let bytes = URL_SAFE_NO_PAD
                .decode(key.trim().trim_end_matches('='))
                .map_err(|_| bad(format!("key {id:?} is not base64url")))?;
            if bytes.len() != 32 {
                return Err(bad(format!(
                    "key {id:?} must be 32 bytes, not {}",
                    bytes.len()
                )));
            }
            if keys.iter().any(|(k, _)| k == id) {
                return Err(bad(format!("key id {id:?} appears twice")));
            }
            let key = UnboundKey::new(&CHACHA20_POLY1305, &bytes)
                .map_err(|_| bad(format!("key {id:?} is unusable")))?;
            let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
            let short: String = (digest.as_ref().iter().take(8))
                .map(|b| format!("{b:02x}"))
                .collect();
            named.push(format!("{id}#{short}"));
            keys.push((id.to_string(), LessSafeKey::new(key)));
        }
        if keys.is_empty() {
            return Err(bad("no keys".into()));
        }
        Ok(Sealer {
            keys: std::sync::Arc::new(keys),
            named: std::sync::Arc::new(named),
            ttl,
        })
    }

    /// A key made now, for development only (states do not survive a restart and no
    /// other process can open them).
    pub fn ephemeral(ttl: Duration) -> Result<Sealer, GatewayError> {
        Sealer::from_text(&format!("dev:{}", new_key()?), ttl)
    }

    /// How long a sealed state stays valid.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The key that seals, named by its id and a digest of its bytes (not secret: a
    /// truncated SHA-256 of a random 32-byte key), for [`Sealer::holds`].
    pub fn sealing_key(&self) -> &str {
        &self.named[0]
    }

    /// Whether the key [`Sealer::sealing_key`] named `named` opens states here: held
    /// under its id, with the same bytes.
    pub fn holds(&self, named: &str) -> bool {
        self.named.iter().any(|k| k == named)
    }

    /// Seals `state`.
    pub fn seal(&self, state: &RoundState) -> Result<String, GatewayError> {
        let (id, key) = &self.keys[0];
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| GatewayError::Keys(e.to_string()))?;
        let mut data = serde_json::to_vec(state).map_err(|e| GatewayError::Keys(e.to_string()))?;
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(id.as_bytes()),
            &mut data,
        )
        .map_err(|_| GatewayError::Keys("sealing failed".into()))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        Ok(format!("v1.{id}.{}", URL_SAFE_NO_PAD.encode(out)))
    }

    /// Opens a sealed state and checks that it belongs to this request: its principal,
    /// method and params, and that it has not expired.
    pub fn open(
        &self,
        sealed: &str,
        agent: &str,
        context: Option<&str>,
        method: &str,
        digest: impl FnOnce() -> String,
    ) -> Result<RoundState, SealError> {
        if sealed.len() > MAX_SEALED {
            return Err(SealError::Malformed);
        }
        let mut parts = sealed.splitn(3, '.');
        let (Some("v1"), Some(id), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(SealError::Malformed);
        };
        let Some((_, key)) = self.keys.iter().find(|(k, _)| k == id) else {
            return Err(SealError::UnknownKey(id.chars().take(32).collect()));
        };
        let raw = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| SealError::Malformed)?;
        if raw.len() < NONCE_LEN {
            return Err(SealError::Malformed);
        }
        let (nonce, rest) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Malformed)?;
        let mut rest = rest.to_vec();
        let plain = key
            .open_in_place(nonce, Aad::from(id.as_bytes()), &mut rest)
            .map_err(|_| SealError::Tampered)?;
        let state: RoundState = serde_json::from_slice(plain).map_err(|_| SealError::Malformed)?;
        let now = now_ms();
        // Valid for this gateway's `state_ttl` at most, whatever the sealer wrote: a
        // ttl cut short (keys leaked) holds for states issued before, and a replica
        // whose clock runs ahead does not lengthen them.
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let expires = state.expires_ms.min(state.issued_ms.saturating_add(ttl_ms));
        // A clock before the epoch reads 0: past nothing, so it must open nothing.
        if now == 0 || now >= expires || state.issued_ms > now.saturating_add(ISSUED_AHEAD_MS) {
            return Err(SealError::Expired);
        }
        if state.agent != agent || state.context.as_deref() != context {
            return Err(SealError::OtherPrincipal);
        }
        // The digest last: it reads the whole params, worth doing for a state that
        // opened, under a key held, for this principal.
        if state.method != method || state.digest != digest() {
            return Err(SealError::OtherRequest);
        }
        Ok(state)
    }
}

/// A new random key, base64url: what `mcp-harness serve --new-key` prints.
pub fn new_key() -> Result<String, GatewayError> {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| GatewayError::Keys(e.to_string()))?;
    Ok(URL_SAFE_NO_PAD.encode(key))
}

/// The digest a sealed state is bound to: the params without what changes between
/// rounds (`_meta`, `inputResponses`, `requestState`), keys sorted at every level.
/// Hashed as it is written: neither the params (of megabytes, perhaps) nor their text is
/// copied.
pub fn params_digest(params: &Value) -> String {
    fn canonical(v: &Value, skip: &[&str], out: &mut dyn FnMut(&[u8])) {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> =
                    map.keys().filter(|k| !skip.contains(&k.as_str())).collect();
                keys.sort();
                out(b"{");
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out(b",");
                    }
                    out(Value::String(k.clone()).to_string().as_bytes());
                    out(b":");
                    canonical(&map[k], &[], out);
                }
                out(b"}");
            }
            Value::Array(items) => {
                out(b"[");
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out(b",");
                    }
                    canonical(item, &[], out);
                }
                out(b"]");
            }
            other => out(other.to_string().as_bytes()),
        }
    }
    crate::util::hash::sha256_hex_fed(|out| {
        canonical(params, &["_meta", "inputResponses", "requestState"], out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // The digest of the params as their canonical text (keys sorted, the round's own
    // fields left out), hashed as it is written: the same as that text's.
    #[test]
    fn the_digest_is_the_canonical_texts() {
        let params = json!({"name": "t", "arguments": {"z": [1, {"b": "\"", "a": null}], "x": 1.5},
            "_meta": {"k": 1}, "inputResponses": {"q": 2}, "requestState": "s"});
        let text = r#"{"arguments":{"x":1.5,"z":[1,{"a":null,"b":"\""}]},"name":"t"}"#;
        assert_eq!(
            params_digest(&params),
            crate::util::hash::sha256_hex(text.as_bytes())
        );
        // Only at the top: a tool's own argument of that name counts.
        let nested = json!({"name": "t", "arguments": {"_meta": 1}});
        assert_ne!(
            params_digest(&nested),
            params_digest(&json!({"name": "t", "arguments": {}}))
        );
    }

    fn state(sealer: &Sealer) -> RoundState {
        let now = now_ms();
        RoundState {
            server: "s".into(),
            upstream: Some("up".into()),
            parked: None,
            agent: "a".into(),
            context: None,
            method: "tools/call".into(),
            digest: params_digest(&json!({"name": "t", "arguments": {"x": 1}})),
            issued_ms: now,
            expires_ms: now + sealer.ttl().as_millis() as u64,
            rounds: 1,
            version: STATE_VERSION,
            target: None,
        }
    }

    #[test]
    fn a_sealed_state_opens_only_for_its_principal_and_request() {
        let sealer = Sealer::ephemeral(Duration::from_secs(60)).expect("key");
        let s = state(&sealer);
        let sealed = sealer.seal(&s).expect("seal");
        let d = s.digest.clone();
        assert_eq!(
            sealer.open(&sealed, "a", None, "tools/call", || d.clone()),
            Ok(s)
        );
        assert_eq!(
            sealer.open(&sealed, "b", None, "tools/call", || d.clone()),
            Err(SealError::OtherPrincipal)
        );
        assert_eq!(
            sealer.open(&sealed, "a", Some("x"), "tools/call", || d.clone()),
            Err(SealError::OtherPrincipal)
        );
        let other = params_digest(&json!({"name": "t", "arguments": {"x": 2}}));
        assert_eq!(
            sealer.open(&sealed, "a", None, "tools/call", || other.clone()),
            Err(SealError::OtherRequest)
        );
        // Flip one character of the body.
        let mut bytes = sealed.into_bytes();
        let last = bytes.len() - 3;
        bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(bytes).expect("ascii");
        assert_eq!(
            sealer.open(&tampered, "a", None, "tools/call", || d.clone()),
            Err(SealError::Tampered)
        );
        assert_eq!(
            sealer.open("garbage", "a", None, "tools/call", || d.clone()),
            Err(SealError::Malformed)
        );
    }

    #[test]
    fn keys_rotate_and_expired_states_are_refused() {
        let (k1, k2) = (new_key().expect("k1"), new_key().expect("k2"));
        let old = Sealer::from_text(&format!("k1:{k1}"), Duration::from_secs(60)).expect("old");
        let new =
            Sealer::from_text(&format!("k2:{k2}\nk1:{k1}"), Duration::from_secs(60)).expect("new");
        let s = state(&old);
        let sealed = old.seal(&s).expect("seal");
        assert!(
            new.open(&sealed, "a", None, "tools/call", || s.digest.clone())
                .is_ok()
        );
        // Held: named by id and bytes, so a key replaced under its id is not.
        assert!(new.holds(old.sealing_key()));
        let replaced =
            Sealer::from_text(&format!("k1:{k2}"), Duration::from_secs(60)).expect("replaced");
        assert!(!replaced.holds(old.sealing_key()));
        assert!(!old.sealing_key().contains(&k1[..8]), "no part of the key");
        let only_new = Sealer::from_text(&format!("k2:{k2}"), Duration::from_secs(60)).expect("k2");
        assert_eq!(
            only_new.open(&sealed, "a", None, "tools/call", || s.digest.clone()),
            Err(SealError::UnknownKey("k1".into()))
        );
        let mut expired = state(&old);
        expired.expires_ms = now_ms() - 1;
        let sealed = old.seal(&expired).expect("seal");
        assert_eq!(
            old.open(&sealed, "a", None, "tools/call", || expired.digest.clone()),
            Err(SealError::Expired)
        );
        // Sealed for an hour, opened by a gateway whose ttl is a minute: issued two
        // minutes ago, it is past that minute.
        let mut long = state(&old);
        long.issued_ms = now_ms() - 120_000;
        long.expires_ms = now_ms() + 3_600_000;
        let sealed = old.seal(&long).expect("seal");
        assert_eq!(
            old.open(&sealed, "a", None, "tools/call", || long.digest.clone()),
            Err(SealError::Expired)
        );
        // Issued by a clock ten minutes ahead: refused, not valid ten minutes longer.
        let mut ahead = state(&old);
        ahead.issued_ms = now_ms() + 600_000;
        ahead.expires_ms = ahead.issued_ms + 60_000;
        let sealed = old.seal(&ahead).expect("seal");
        assert_eq!(
            old.open(&sealed, "a", None, "tools/call", || ahead.digest.clone()),
            Err(SealError::Expired)
        );
    }

    #[test]
    fn the_digest_ignores_key_order_and_what_changes_between_rounds() {
        let a =
            params_digest(&json!({"name": "t", "arguments": {"x": 1, "y": [1, {"b": 2, "a": 1}]}}));
        let b = params_digest(
            &json!({"arguments": {"y": [1, {"a": 1, "b": 2}], "x": 1}, "name": "t",
            "_meta": {"k": 1}, "inputResponses": {"q": {}}, "requestState": "s"}),
        );
        assert_eq!(a, b);
    }

    #[test]
    fn bad_key_text_is_a_clear_error() {
        for (text, want) in [
            ("", "no keys"),
            ("nocolon", "KID:BASE64URL"),
            ("k:AAAA", "32 bytes"),
            ("k:!!!", "base64url"),
        ] {
            let e = Sealer::from_text(text, Duration::from_secs(1)).expect_err(text);
            assert!(e.to_string().contains(want), "{text}: {e}");
        }
        // The fields swapped: the key, where the id goes, is not printed.
        let key = new_key().expect("key");
        let e = Sealer::from_text(&format!("k0:{key}\n{key}:k1"), Duration::from_secs(1))
            .expect_err("swapped");
        assert!(!e.to_string().contains(&key), "{e}");
        assert!(e.to_string().contains("key 2"), "{e}");
    }
}
