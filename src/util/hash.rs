//! Hashes the harness keys things by: SHA-256 (`sha2`) for content and cache keys, and
//! HMAC-SHA256 (`hmac`) where a plain hash would let anyone holding a guess confirm it
//! (auth contexts in audit records). No cryptography is written here, only wrapping.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
    out
}

/// Hex SHA-256 of what `write` feeds it, piece by piece: the text hashed need not be
/// built whole.
pub fn sha256_hex_fed(write: impl FnOnce(&mut dyn FnMut(&[u8]))) -> String {
    let mut hasher = Sha256::new();
    write(&mut |bytes: &[u8]| hasher.update(bytes));
    hex(&hasher.finalize())
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Hex HMAC-SHA256 of `message` under `key`.
pub fn hmac_sha256_hex(key: &[u8], message: &[u8]) -> String {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    match <Hmac<Sha256> as Mac>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(message);
            hex(&mac.finalize().into_bytes())
        }
        Err(_) => sha256_hex(message),
    }
}

/// Whether `tag_hex` is the hex HMAC-SHA256 of `message` under `key`, compared in
/// constant time (`hmac`'s own check): a forger learns nothing from how long it takes.
pub fn hmac_sha256_verify(key: &[u8], message: &[u8], tag_hex: &[u8]) -> bool {
    let Some(tag) = unhex(tag_hex) else {
        return false;
    };
    match <Hmac<Sha256> as Mac>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(message);
            mac.verify_slice(&tag).is_ok()
        }
        Err(_) => false,
    }
}

/// Lowercase hex to bytes; `None` for anything else.
fn unhex(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| HEX.iter().position(|h| *h == c).map(|d| d as u8);
    text.chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// Incremental SHA-256 over several parts, each length-prefixed so that `("ab","c")`
/// and `("a","bc")` hash apart.
#[derive(Default)]
pub struct Fingerprint(Sha256);

impl Fingerprint {
    /// Adds one part.
    pub fn part(mut self, bytes: &[u8]) -> Fingerprint {
        self.0.update((bytes.len() as u64).to_be_bytes());
        self.0.update(bytes);
        self
    }

    /// The hex digest.
    pub fn finish(self) -> String {
        hex(&self.0.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_hex_and_parts_are_framed() {
        assert_eq!(sha256_hex(b"").len(), 64);
        assert_ne!(
            Fingerprint::default().part(b"ab").part(b"c").finish(),
            Fingerprint::default().part(b"a").part(b"bc").finish()
        );
        assert_ne!(hmac_sha256_hex(b"k1", b"m"), hmac_sha256_hex(b"k2", b"m"));
        // RFC 4231 test case 2.
        assert_eq!(
            hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_tag_verifies_only_for_its_key_and_message() {
        let tag = hmac_sha256_hex(b"key", b"message");
        assert!(hmac_sha256_verify(b"key", b"message", tag.as_bytes()));
        assert!(!hmac_sha256_verify(b"other", b"message", tag.as_bytes()));
        assert!(!hmac_sha256_verify(b"key", b"messagf", tag.as_bytes()));
        assert!(!hmac_sha256_verify(
            b"key",
            b"message",
            &tag.as_bytes()[..62]
        ));
        assert!(!hmac_sha256_verify(
            b"key",
            b"message",
            tag.to_uppercase().as_bytes()
        ));
        assert!(!hmac_sha256_verify(b"key", b"message", b""));
        assert!(!hmac_sha256_verify(b"key", b"message", b"zz"));
    }
}
