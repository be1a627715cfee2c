//! Bearer JWTs from an authorization server: signature checked against its JWKS (a file,
//! or a URL fetched at start and every ten minutes), issuer, audience, expiry and
//! not-before checked, a configured claim as the agent id. Verification is
//! `jsonwebtoken`'s (on `ring`); only asymmetric algorithms are accepted, and only the
//! one each key names (no `alg` confusion, no `none`, no HMAC with a public key).

use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::RwLock;
use serde::Deserialize;
use serde_json::Value;

use super::GatewayError;

/// Largest JWKS read.
const MAX_JWKS: usize = 1 << 20;
/// Longest agent or context claim taken: it names the caller in every log line and
/// audit record.
const MAX_CLAIM: usize = 256;
/// How often a JWKS URL is read again.
const REFRESH: Duration = Duration::from_secs(600);
/// Clock skew allowed on `exp` and `nbf`.
const LEEWAY_SECS: u64 = 30;

/// `[gateway.jwt]`: who issues the tokens the gateway accepts.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The `iss` required, and the authorization server named in the protected resource
    /// metadata.
    pub issuer: String,
    /// The `aud` required: this gateway's resource URL (also the metadata's `resource`).
    pub audience: String,
    /// The issuer's keys, as a JWKS file.
    #[serde(default)]
    pub jwks_file: Option<std::path::PathBuf>,
    /// The issuer's keys, at an HTTPS URL.
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// A CA bundle to trust for `jwks_url` (besides the platform's roots).
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// The claim that names the agent.
    #[serde(default = "default_agent_claim")]
    pub agent_claim: String,
    /// The claim that names the auth context (the user): `private` cache entries and
    /// upstream sign-in are kept per value, as `ISSUER#VALUE` (so no issuer's user, and
    /// no static token's context, can stand for another's). A token without it is
    /// refused.
    #[serde(default = "default_context_claim")]
    pub context_claim: String,
    /// Scopes a token must carry, every one (in its `scope` claim, space-separated, or
    /// `scp`, a list or a string); named in the protected resource metadata and the
    /// challenges. None by default: any token of the issuer for the audience.
    #[serde(default)]
    pub scopes: Vec<String>,
}

fn default_agent_claim() -> String {
    "sub".into()
}
fn default_context_claim() -> String {
    "sub".into()
}

/// Why a JWT was refused (logged; the client gets 401, or 403 for a scope it lacks).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JwtError {
    /// Not a JWT, or its header cannot be read.
    #[error("not a JWT: {0}")]
    Malformed(String),
    /// No key of the issuer has its `kid` (or it names none and there are several).
    #[error("no key for kid {0:?}")]
    UnknownKey(Option<String>),
    /// Its `alg` is not the one its key names, or is not asymmetric.
    #[error("algorithm {0} is not accepted for this key")]
    Algorithm(String),
    /// Signature, issuer, audience, expiry or not-before failed.
    #[error("{0}")]
    Invalid(String),
    /// The agent or context claim is missing, not a string, or not a name (blank,
    /// longer than 256 bytes, or with control or invisible characters).
    #[error("claim {0:?} is missing or not a name")]
    Claim(String),
    /// Valid, but without a scope the gateway asks for (the client gets 403, unless
    /// the agent it names is refused anyway).
    #[error("the token lacks scope {missing:?}")]
    Scope {
        /// The first scope it lacks.
        missing: String,
        /// The agent it names, checked before the scope is said to be what is wrong.
        agent: String,
    },
}

/// What a verified JWT says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The agent claim's value.
    pub agent: String,
    /// The auth context, `ISSUER#VALUE`.
    pub context: String,
    /// When it stops being accepted (its `exp`, with the clock skew allowed).
    pub until: std::time::SystemTime,
}

/// Verifies JWTs for one issuer.
pub struct JwtVerifier {
    config: JwtConfig,
    keys: RwLock<Arc<JwkSet>>,
    /// When the JWKS URL was last read again for an unknown `kid` (at most once a
    /// minute: a rotated key works soon, a flood of bogus kids costs one fetch).
    refetched: parking_lot::Mutex<Option<std::time::Instant>>,
    /// Bumped when a read of the JWKS URL brings other keys: what was opened with a
    /// JWT is checked again then, not only at a reload (a key the issuer took out, a
    /// leaked one, ends what it signed).
    keys_changed: std::sync::atomic::AtomicU64,
    /// Reads of the JWKS URL begun, and the last one whose keys were put in place: a
    /// slow read that ends after a later one does not put back the keys of before.
    reads: std::sync::atomic::AtomicU64,
    applied: parking_lot::Mutex<u64>,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("issuer", &self.config.issuer)
            .field("keys", &self.keys.read().keys.len())
            .finish()
    }
}

/// The keys of a JWKS this crate can read. A key of a type, curve or algorithm it does
/// not know is left out (RFC 7517 §5), not taken for a broken set: an issuer that
/// publishes one beside its signing keys (an encryption key, a new curve) is still
/// served. A set whose every key is left out is refused.
fn parse_jwks(bytes: &[u8]) -> Result<JwkSet, GatewayError> {
    #[derive(Deserialize)]
    struct Keys {
        keys: Vec<Value>,
    }
    if bytes.len() > MAX_JWKS {
        return Err(GatewayError::Config(
            "jwt: the JWKS is larger than 1 MiB".into(),
        ));
    }
    let set: Keys = serde_json::from_slice(bytes)
        .map_err(|e| GatewayError::Config(format!("jwt: bad JWKS: {e}")))?;
    let read = set.keys.len();
    let keys: Vec<_> = set
        .keys
        .into_iter()
        .filter_map(|k| serde_json::from_value(k).ok())
        .collect();
    if keys.len() < read {
        tracing::warn!(
            left_out = read - keys.len(),
            "JWKS keys of a kind this gateway does not read are left out"
        );
    }
    if keys.is_empty() && read > 0 {
        return Err(GatewayError::Config(
            "jwt: the JWKS has no key this gateway can read".into(),
        ));
    }
    Ok(JwkSet { keys })
}

/// How long reading the JWKS file may take (a hung mount).
const JWKS_READ_LIMIT: Duration = Duration::from_secs(30);

/// The JWKS file's text, read as a reloaded config file is, off the async threads: a
/// regular file only (a FIFO put in its place is refused at once, never waited on by a
/// reload that holds the others back), up to 16 MiB, and not when anyone may write or
/// replace it (they would choose whose tokens are taken).
async fn read_jwks_file(path: &std::path::Path) -> Result<String, GatewayError> {
    let owned = path.to_path_buf();
    let read = tokio::task::spawn_blocking(move || crate::config::file::read_keys(&owned));
    match tokio::time::timeout(JWKS_READ_LIMIT, read).await {
        Ok(Ok(Ok(text))) => Ok(text),
        Ok(Ok(Err(e))) => Err(GatewayError::Config(format!("jwt: {e}"))),
        Ok(Err(e)) => Err(GatewayError::Config(format!(
            "jwt: {}: {e}",
            path.display()
        ))),
        Err(_) => Err(GatewayError::Config(format!(
            "jwt: {}: not read within {JWKS_READ_LIMIT:?}",
            path.display()
        ))),
    }
}

impl JwtVerifier {
    /// Reads the keys (the file, or the URL once) and checks the settings.
    pub async fn load(config: JwtConfig) -> Result<Arc<JwtVerifier>, GatewayError> {
        // The gateway's own URL: clients are sent to its metadata by it.
        if !url::Url::parse(&config.audience)
            .is_ok_and(|u| matches!(u.scheme(), "https" | "http") && u.host().is_some())
        {
            return Err(GatewayError::Config(format!(
                "jwt.audience: {:?} is not the gateway's URL (https://HOST/mcp)",
                crate::util::text::one_line(&config.audience, 200)
            )));
        }
        // Scope tokens as RFC 6749 §3.3 has them: each goes into a challenge's quoted
        // `scope`, which a quote or a backslash would break.
        if let Some(bad) = config.scopes.iter().find(|s| {
            s.is_empty()
                || s.len() > 256
                || !s
                    .bytes()
                    .all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b))
        }) {
            return Err(GatewayError::Config(format!(
                "jwt.scopes: {:?} is not a scope (1 to 256 printable characters, no space, quote or backslash)",
                crate::util::text::one_line(bad, 100)
            )));
        }
        let keys = match (&config.jwks_file, &config.jwks_url) {
            (Some(path), None) => parse_jwks(read_jwks_file(path).await?.as_bytes())?,
            (None, Some(url)) => fetch(url, config.ca_file.as_deref()).await?,
            _ => {
                return Err(GatewayError::Config(
                    "jwt: set exactly one of jwks_file and jwks_url".into(),
                ));
            }
        };
        Ok(Arc::new(JwtVerifier {
            config,
            keys: RwLock::new(Arc::new(keys)),
            refetched: parking_lot::Mutex::new(None),
            keys_changed: std::sync::atomic::AtomicU64::new(0),
            reads: std::sync::atomic::AtomicU64::new(0),
            applied: parking_lot::Mutex::new(0),
        }))
    }

    /// How many times a read of the JWKS URL brought other keys: a change of it calls
    /// for what JWTs opened to be checked again ([`super::Identity::admits_with`]).
    pub fn keys_changed(&self) -> u64 {
        self.keys_changed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Puts the keys read in place of those held, and says so when they differ.
    fn replace_keys(&self, keys: JwkSet) {
        let mut held = self.keys.write();
        if **held != keys {
            *held = Arc::new(keys);
            self.keys_changed
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Reads a JWKS URL again every ten minutes while the verifier lives.
    pub fn refresh_in_background(self: &Arc<Self>) {
        let Some(url) = self.config.jwks_url.clone() else {
            return;
        };
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REFRESH).await;
                let Some(me) = weak.upgrade() else { return };
                me.read_again(&url).await;
            }
        });
    }

    /// The settings.
    pub fn config(&self) -> &JwtConfig {
        &self.config
    }

    /// Reads the JWKS URL again in the background, at most once a minute.
    fn refetch_soon(self: &Arc<Self>) {
        let Some(url) = self.config.jwks_url.clone() else {
            return;
        };
        {
            let mut last = self.refetched.lock();
            if last.is_some_and(|t| t.elapsed() < Duration::from_secs(60)) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        let me = self.clone();
        tokio::spawn(async move { me.read_again(&url).await });
    }

    /// Reads the JWKS URL again and puts its keys in place, unless a read begun later
    /// has already, or it holds no key that verifies signatures (an issuer's error
    /// served as `{"keys":[]}` would refuse every token and end every session opened
    /// with one: kept as a failed read is).
    async fn read_again(&self, url: &str) {
        use std::sync::atomic::Ordering;
        let read = self.reads.fetch_add(1, Ordering::SeqCst) + 1;
        match fetch(url, self.config.ca_file.as_deref()).await {
            Ok(keys) if !keys.keys.iter().any(|k| key_algorithm(k).is_some()) => {
                tracing::warn!(
                    "the JWKS read again holds no key that verifies signatures; keeping the keys held"
                )
            }
            Ok(keys) => {
                let mut applied = self.applied.lock();
                if read > *applied {
                    *applied = read;
                    self.replace_keys(keys);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not read the JWKS again; keeping the keys held")
            }
        }
    }

    /// The agent, auth context and end of a verified token.
    pub fn verify(self: &Arc<Self>, token: &str) -> Result<Verified, JwtError> {
        self.verify_as(token, true)
    }

    /// [`JwtVerifier::verify`] but for its expiry: what a token opened is checked again
    /// at a reload for the keys and settings in force, its expiry being its own to
    /// keep (a stream's end; a legacy session outlives one token, the next requests
    /// bringing fresh ones).
    pub fn verify_past_expiry(self: &Arc<Self>, token: &str) -> Result<Verified, JwtError> {
        self.verify_as(token, false)
    }

    fn verify_as(self: &Arc<Self>, token: &str, expiry: bool) -> Result<Verified, JwtError> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| JwtError::Malformed(e.to_string()))?;
        let keys = self.keys.read().clone();
        // The key the token names by its `kid` (an issuer may give one kid to a signing
        // key and an encryption key alike: the one of the token's algorithm), or,
        // without one, the one key of its algorithm (an encryption key beside it does
        // not make it ambiguous).
        let expected = header.alg;
        let of_its_algorithm = |k: &&jsonwebtoken::jwk::Jwk| key_algorithm(k) == Some(expected);
        let jwk = match &header.kid {
            Some(kid) => {
                let mut named = (keys.keys.iter())
                    .filter(|k| k.common.key_id.as_deref() == Some(kid.as_str()))
                    .peekable();
                match named.peek() {
                    None => None,
                    Some(_) => Some(
                        named
                            .find(of_its_algorithm)
                            .ok_or_else(|| JwtError::Algorithm(format!("{expected:?}")))?,
                    ),
                }
            }
            None => {
                let mut usable = keys.keys.iter().filter(of_its_algorithm);
                match (usable.next(), usable.next()) {
                    (Some(one), None) => Some(one),
                    _ => None,
                }
            }
        };
        let Some(jwk) = jwk else {
            // Perhaps the issuer rotated its keys: read them again, soon.
            self.refetch_soon();
            return Err(JwtError::UnknownKey(header.kid.clone()));
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|e| JwtError::Invalid(e.to_string()))?;
        let mut validation = Validation::new(expected);
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[&self.config.audience]);
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        validation.validate_exp = expiry;
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data = jsonwebtoken::decode::<Value>(token, &key, &validation).map_err(|e| {
            // A key the issuer replaced under the same kid: read them again, soon.
            if matches!(e.kind(), jsonwebtoken::errors::ErrorKind::InvalidSignature) {
                self.refetch_soon();
            }
            JwtError::Invalid(e.to_string())
        })?;
        // `decode` checks an `nbf` only when it reads as a u64, and passes any other
        // (a string, a negative number, one past 2^64) unchecked: checked here.
        if let Some(nbf) = data.claims.get("nbf") {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            match nbf.as_f64().filter(|n| n.is_finite() && *n >= 0.0) {
                Some(n) if n <= now.saturating_add(LEEWAY_SECS) as f64 => {}
                Some(_) => return Err(JwtError::Invalid("the token is not valid yet".into())),
                None => return Err(JwtError::Invalid("nbf is not a time".into())),
            }
        }
        // Names that go into logs, audit records and error texts: bounded, one line,
        // nothing a reader does not see.
        let claim = |name: &str| {
            data.claims
                .get(name)
                .and_then(Value::as_str)
                .filter(|s| {
                    !s.trim().is_empty()
                        && s.len() <= MAX_CLAIM
                        && !s
                            .chars()
                            .any(|c| c.is_control() || crate::util::text::hidden(c))
                })
                .map(String::from)
        };
        let agent = claim(&self.config.agent_claim)
            .ok_or_else(|| JwtError::Claim(self.config.agent_claim.clone()))?;
        // Without it the caller would have no auth context: the gateway's own upstream
        // sign-in, and a static token's principal, would be taken for its.
        let context = claim(&self.config.context_claim)
            .ok_or_else(|| JwtError::Claim(self.config.context_claim.clone()))?;
        if let Some(missing) = self.missing_scope(&data.claims) {
            return Err(JwtError::Scope {
                missing: missing.to_string(),
                agent,
            });
        }
        // Present and numeric, or `decode` would have refused it.
        let exp = data
            .claims
            .get("exp")
            .and_then(|v| v.as_u64().or_else(|| v.as_f64().map(|f| f.max(0.0) as u64)))
            .unwrap_or(0);
        Ok(Verified {
            agent,
            context: format!("{}#{context}", self.config.issuer),
            until: std::time::UNIX_EPOCH
                + Duration::from_secs(exp.saturating_add(LEEWAY_SECS).min(1 << 40)),
        })
    }

    /// The first scope the gateway asks for that `claims` lack (`scope`, space-separated
    /// as RFC 8693 and RFC 9068 have it, or `scp`, a list or a string, as some issuers
    /// write it).
    fn missing_scope<'a>(&'a self, claims: &Value) -> Option<&'a str> {
        let granted = |scope: &str| {
            ["scope", "scp"]
                .iter()
                .filter_map(|name| claims.get(*name))
                .any(|v| match v {
                    Value::String(s) => s.split_whitespace().any(|s| s == scope),
                    Value::Array(a) => a.iter().any(|s| s.as_str() == Some(scope)),
                    _ => false,
                })
        };
        // Nothing read when nothing is asked (the default).
        self.config
            .scopes
            .iter()
            .find(|s| !granted(s))
            .map(String::as_str)
    }

    /// The scopes a token must carry, for a challenge's `scope` (RFC 6750 §3), if any.
    pub fn scopes(&self) -> Option<String> {
        (!self.config.scopes.is_empty()).then(|| self.config.scopes.join(" "))
    }

    /// The protected resource metadata (RFC 9728) the gateway serves.
    pub fn resource_metadata(&self) -> Value {
        let mut m = serde_json::json!({
            "resource": self.config.audience,
            "authorization_servers": [self.config.issuer],
            "bearer_methods_supported": ["header"],
        });
        if !self.config.scopes.is_empty() {
            m["scopes_supported"] = serde_json::json!(self.config.scopes);
        }
        m
    }
}

/// The one algorithm a key may verify: the one it names, else the one its curve or type
/// implies; never a symmetric one.
fn key_algorithm(jwk: &jsonwebtoken::jwk::Jwk) -> Option<Algorithm> {
    // An encryption key never verifies a signature.
    if matches!(
        jwk.common.public_key_use,
        Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)
    ) {
        return None;
    }
    // A key naming an algorithm that is not a signature's (RSA-OAEP…) is not used.
    let named = match jwk.common.key_algorithm {
        Some(a) => Some(a.to_string().parse::<Algorithm>().ok()?),
        None => None,
    };
    let asymmetric =
        |a: Algorithm| !matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512);
    match (&jwk.algorithm, named) {
        (AlgorithmParameters::OctetKey(_), _) => None,
        (_, Some(a)) => asymmetric(a).then_some(a),
        (AlgorithmParameters::EllipticCurve(p), None) => match p.curve {
            jsonwebtoken::jwk::EllipticCurve::P256 => Some(Algorithm::ES256),
            jsonwebtoken::jwk::EllipticCurve::P384 => Some(Algorithm::ES384),
            _ => None,
        },
        (AlgorithmParameters::OctetKeyPair(_), None) => Some(Algorithm::EdDSA),
        (AlgorithmParameters::RSA(_), None) => Some(Algorithm::RS256),
    }
}

async fn fetch(url: &str, ca_file: Option<&std::path::Path>) -> Result<JwkSet, GatewayError> {
    // The URL as errors show it: without a key its query or credentials may hold.
    let shown = url::Url::parse(url)
        .map(|u| crate::util::text::url_shown(&u))
        .unwrap_or_else(|_| "jwks_url".into());
    let bad = |why: String| GatewayError::Config(format!("jwt: {shown}: {why}"));
    let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    let loopback = matches!(parsed.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
    if parsed.scheme() != "https" && !loopback {
        return Err(bad("must be https".into()));
    }
    let tls = crate::transport::auth::client_tls(ca_file).map_err(bad)?;
    let client = crate::transport::client_builder(&parsed)
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| bad(e.to_string()))?;
    let mut resp = client
        .get(parsed)
        .send()
        .await
        .map_err(|e| bad(crate::util::text::http_failure(e)))?;
    if !resp.status().is_success() {
        return Err(bad(format!("HTTP {}", resp.status().as_u16())));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| bad(crate::util::text::http_failure(e)))?
    {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_JWKS {
            return Err(bad("larger than 1 MiB".into()));
        }
    }
    parse_jwks(&body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn with_file(path: &std::path::Path) -> JwtConfig {
        JwtConfig {
            issuer: "https://issuer.example".into(),
            audience: "https://gateway.example/mcp".into(),
            jwks_file: Some(path.to_path_buf()),
            jwks_url: None,
            ca_file: None,
            agent_claim: default_agent_claim(),
            context_claim: default_context_claim(),
            scopes: Vec::new(),
        }
    }

    // A FIFO put in the JWKS file's place is refused at once (before, the reload that
    // read it waited for a writer, holding every later reload back), and so is a file
    // anyone may write (whoever wrote a key there would choose whose tokens are taken).
    #[tokio::test]
    async fn a_jwks_file_that_is_a_fifo_or_that_anyone_may_write_is_refused_at_once() {
        let dir = crate::util::scratch::Scratch::new("jwks-file");
        std::fs::create_dir_all(&dir).expect("dir");
        let fifo = dir.join("fifo.json");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        let load = JwtVerifier::load(with_file(&fifo));
        let e = tokio::time::timeout(Duration::from_secs(10), load)
            .await
            .expect("at once")
            .expect_err("a FIFO");
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let file = dir.join("jwks.json");
        std::fs::write(&file, r#"{"keys": []}"#).expect("write");
        let mode = |m| std::fs::set_permissions(&file, std::fs::Permissions::from_mode(m));
        mode(0o666).expect("chmod");
        let e = JwtVerifier::load(with_file(&file))
            .await
            .expect_err("anyone may write it");
        assert!(e.to_string().contains("writable by anyone"), "{e}");
        assert!(e.to_string().contains("whose tokens are taken"), "{e}");
        mode(0o644).expect("chmod");
        JwtVerifier::load(with_file(&file)).await.expect("read");
    }
}
