//! Who a downstream request comes from: a static bearer token (the config holds its
//! SHA-256, never the token), a JWT of the configured issuer ([`super::jwt`]), or the
//! agent named for anonymous callers.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;

use super::jwt::JwtVerifier;
use crate::util::hash::sha256_hex;

/// One static token: its hex SHA-256 and the principal it names.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// Hex SHA-256 of the token (`printf %s TOKEN | sha256sum`).
    pub sha256: String,
    /// The agent id its requests act as.
    pub agent: String,
    /// The auth context its requests carry (keys `private` cache entries and upstream
    /// sign-in); none by default.
    #[serde(default)]
    pub auth_context: Option<String>,
}

/// Who a request acts as. Shared strings: a request copies its principal, and its
/// caller is made from it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Principal {
    /// The agent id (grants are keyed by it).
    pub agent: Arc<str>,
    /// The auth context, if any.
    pub context: Option<Arc<str>>,
}

/// A request's principal, and until when its credentials hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// Who the request acts as.
    pub principal: Principal,
    /// When its credentials stop being accepted (a JWT's expiry); `None` for a static
    /// token or the anonymous agent, which last until a reload revokes them. A stream
    /// the request opens ends then, as a request after it would be refused.
    pub until: Option<std::time::Instant>,
    /// The bearer token it was admitted with (a configured token, by its hash, or a
    /// JWT): what it opens (a stream, a legacy session) keeps it, and a reload checks
    /// it again ([`Identity::admits_with`]). `None` for the anonymous agent.
    pub credential: Option<Credential>,
}

/// A bearer token, kept by what a request opened with it. Never shown: its `Debug`
/// says only which kind it is.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(Bearer);

#[derive(Clone, PartialEq, Eq)]
enum Bearer {
    /// A configured token, by its SHA-256: one replaced in the config (leaked, rotated
    /// under the same agent) ends what it opened.
    Configured(Arc<str>),
    /// A JWT, whole: checked again under the issuer's keys in force.
    Jwt(Arc<str>),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Bearer::Configured(_) => "Credential(configured token)",
            Bearer::Jwt(_) => "Credential(JWT)",
        })
    }
}

/// Why a request has no principal.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// No credentials, and no agent for anonymous callers.
    #[error("this gateway needs a bearer token")]
    Missing,
    /// A token this gateway does not know.
    #[error("unknown bearer token")]
    Unknown,
    /// An `Authorization` header that is not `Bearer TOKEN` (never anonymous).
    #[error("the Authorization header must be `Bearer TOKEN`")]
    Malformed,
    /// A JWT of the issuer without a scope this gateway asks for (403).
    #[error("the bearer token lacks a scope this gateway asks for")]
    InsufficientScope,
}

/// The gateway's identities.
#[derive(Clone, Debug, Default)]
pub struct Identity {
    tokens: HashMap<String, Principal>,
    anonymous: Option<Arc<str>>,
    jwt: Option<Arc<JwtVerifier>>,
    /// The agents of static tokens and the anonymous agent: a JWT naming one is refused,
    /// as whoever issues the JWTs (perhaps from a claim its users choose) would
    /// otherwise take that agent's grants, settings and approval requests.
    reserved: std::collections::HashSet<Arc<str>>,
    /// The principals of the tokens, for [`Identity::admits`].
    principals: std::collections::HashSet<Principal>,
}

impl Identity {
    /// From the configured tokens and anonymous agent; a hash that is not 64 hex digits
    /// is an error naming its agent.
    pub fn new(
        tokens: &[TokenEntry],
        anonymous: Option<&str>,
        jwt: Option<Arc<JwtVerifier>>,
    ) -> Result<Identity, String> {
        let mut map = HashMap::new();
        for t in tokens {
            let hash = t.sha256.trim().to_ascii_lowercase();
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "the token of agent {:?}: sha256 must be 64 hex digits",
                    t.agent
                ));
            }
            let principal = Principal {
                agent: t.agent.as_str().into(),
                context: t.auth_context.as_deref().map(Arc::from),
            };
            // A token listed twice (a copy-paste slip) would silently stand for the
            // last agent only, and leave the first unreserved against JWT subjects.
            if let Some(first) = map.insert(hash, principal) {
                return Err(format!(
                    "the token of agent {:?} is listed again, for agent {:?}: each token names one principal",
                    first.agent, t.agent
                ));
            }
        }
        if let Some(jwt) = &jwt {
            // Such a token would share the sessions, private cache and upstream sign-in
            // of the JWT callers whose context claim matches.
            let prefix = format!("{}#", jwt.config().issuer);
            if let Some(t) = tokens.iter().find(|t| {
                t.auth_context
                    .as_deref()
                    .is_some_and(|c| c.starts_with(&prefix))
            }) {
                return Err(format!(
                    "the token of agent {:?}: an auth_context starting with {prefix:?} is the JWT issuer's",
                    t.agent
                ));
            }
        }
        let reserved = map
            .values()
            .map(|p| p.agent.clone())
            .chain(anonymous.map(Arc::from))
            .collect();
        let principals = map.values().cloned().collect();
        Ok(Identity {
            tokens: map,
            anonymous: anonymous.map(Arc::from),
            jwt,
            reserved,
            principals,
        })
    }

    /// Whether a request could still come from `principal`: a token in force names it,
    /// it is the anonymous agent, or the JWT issuer vouches for such principals (each
    /// JWT's expiry is its own request's to check). What a reload revoked is not.
    pub fn admits(&self, principal: &Principal) -> bool {
        if self.principals.contains(principal) {
            return true;
        }
        if principal.context.is_none() && self.anonymous.as_deref() == Some(&*principal.agent) {
            return true;
        }
        match (&self.jwt, principal.context.as_deref()) {
            (Some(jwt), Some(context)) => {
                context
                    .strip_prefix(jwt.config().issuer.as_str())
                    .is_some_and(|rest| rest.starts_with('#'))
                    && !self.reserved.contains(&principal.agent)
            }
            _ => false,
        }
    }

    /// Changes to the JWT issuer's keys read since the start ([`JwtVerifier::keys_changed`];
    /// 0 without one): when it moves, what JWTs opened is checked again.
    pub fn keys_changed(&self) -> u64 {
        self.jwt.as_ref().map_or(0, |v| v.keys_changed())
    }

    /// [`Identity::admits`], and that the token it was opened with still admits the
    /// same principal: a configured token still listed for it (one replaced, leaked or
    /// rotated under the same agent, ends what it opened), a JWT that still verifies
    /// under the issuer's keys and settings in force (a reload that removed the key it
    /// was signed with, or changed the issuer or audience, ends it), as a request with
    /// it is refused. A JWT's expiry is not checked here: a stream ends at it on its
    /// own, and a legacy session outlives one token.
    pub fn admits_with(&self, principal: &Principal, credential: Option<&Credential>) -> bool {
        if !self.admits(principal) {
            return false;
        }
        match credential.map(|c| &c.0) {
            None => true,
            Some(Bearer::Configured(hash)) => self.tokens.get(&**hash) == Some(principal),
            Some(Bearer::Jwt(token)) => self.jwt.as_ref().is_some_and(|verifier| {
                verifier.verify_past_expiry(token).is_ok_and(|v| {
                    *v.agent == *principal.agent
                        && principal.context.as_deref() == Some(&*v.context)
                })
            }),
        }
    }

    /// The principal of a request with `authorization` (the header's value, if any).
    pub fn resolve(&self, authorization: Option<&str>) -> Result<Admitted, IdentityError> {
        let token = match authorization {
            None => None,
            Some(h) => {
                let token = h.trim().split_once(' ').and_then(|(scheme, token)| {
                    scheme
                        .eq_ignore_ascii_case("bearer")
                        .then(|| token.trim())
                        .filter(|t| !t.is_empty())
                });
                // Credentials that cannot be read are refused, never taken as anonymous.
                Some(token.ok_or(IdentityError::Malformed)?)
            }
        };
        match token {
            // Looked up by its hash: the map never holds a token, and a guess costs a hash.
            Some(token) => match self.tokens.get_key_value(&sha256_hex(token.as_bytes())) {
                Some((hash, p)) => Ok(Admitted {
                    principal: p.clone(),
                    until: None,
                    credential: Some(Credential(Bearer::Configured(hash.as_str().into()))),
                }),
                None => match &self.jwt {
                    Some(jwt) if token.bytes().filter(|b| *b == b'.').count() == 2 => {
                        let refused = |reason: &str| {
                            // The reason may quote the token's own text.
                            let reason = crate::util::text::one_line(reason, 200);
                            // Debug: anyone can send tokens, and refusals cost them nothing.
                            tracing::debug!(error = %reason, "bearer JWT refused");
                            IdentityError::Unknown
                        };
                        let verified = jwt.verify(token).map_err(|e| match &e {
                            // Its agent refused anyway: no scope would let it in, and a
                            // client told of a scope would sign in again for nothing.
                            super::jwt::JwtError::Scope { agent, .. }
                                if !self.reserved.contains(agent.as_str()) =>
                            {
                                tracing::debug!(error = %e, "bearer JWT refused");
                                IdentityError::InsufficientScope
                            }
                            e => refused(&e.to_string()),
                        })?;
                        if self.reserved.contains(verified.agent.as_str()) {
                            return Err(refused(&format!(
                                "its agent {:?} is a configured token's or the anonymous agent",
                                verified.agent
                            )));
                        }
                        let left = verified
                            .until
                            .duration_since(std::time::SystemTime::now())
                            .unwrap_or_default();
                        Ok(Admitted {
                            principal: Principal {
                                agent: verified.agent.into(),
                                context: Some(verified.context.into()),
                            },
                            until: Some(crate::util::duration::after(
                                std::time::Instant::now(),
                                left,
                            )),
                            credential: Some(Credential(Bearer::Jwt(token.into()))),
                        })
                    }
                    _ => Err(IdentityError::Unknown),
                },
            },
            None => self
                .anonymous
                .as_ref()
                .map(|agent| Admitted {
                    principal: Principal {
                        agent: agent.clone(),
                        context: None,
                    },
                    until: None,
                    credential: None,
                })
                .ok_or(IdentityError::Missing),
        }
    }

    /// The JWT verifier, when JWTs are accepted.
    pub fn jwt(&self) -> Option<&Arc<JwtVerifier>> {
        self.jwt.as_ref()
    }

    /// How many distinct agents requests may act as (a list is `public` only when
    /// there is one).
    pub fn agents(&self) -> usize {
        if self.jwt.is_some() {
            return usize::MAX; // whoever the issuer vouches for
        }
        let mut agents: Vec<&str> = self.tokens.values().map(|p| &*p.agent).collect();
        agents.extend(self.anonymous.as_deref());
        agents.sort_unstable();
        agents.dedup();
        agents.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_matched_by_hash_and_anonymous_callers_need_an_agent() {
        let entry = TokenEntry {
            sha256: sha256_hex(b"s3cret"),
            agent: "planner".into(),
            auth_context: Some("alice".into()),
        };
        let id = Identity::new(std::slice::from_ref(&entry), None, None).expect("identity");
        let admitted = id.resolve(Some("Bearer s3cret")).expect("known");
        assert_eq!(admitted.until, None, "a static token lasts until revoked");
        let p = admitted.principal;
        assert_eq!(
            (&*p.agent, p.context.as_deref()),
            ("planner", Some("alice"))
        );
        assert_eq!(id.resolve(Some("Bearer nope")), Err(IdentityError::Unknown));
        assert_eq!(id.resolve(None), Err(IdentityError::Missing));
        assert_eq!(
            id.resolve(Some("Basic s3cret")),
            Err(IdentityError::Malformed)
        );
        let open =
            Identity::new(std::slice::from_ref(&entry), Some("guest"), None).expect("identity");
        assert_eq!(
            &*open.resolve(None).expect("anonymous").principal.agent,
            "guest"
        );
        for bad in ["Basic x", "Bearer ", "", "Bearer"] {
            assert_eq!(
                open.resolve(Some(bad)),
                Err(IdentityError::Malformed),
                "{bad:?}"
            );
        }
        assert_eq!(open.agents(), 2);
        let bad = TokenEntry {
            sha256: "xyz".into(),
            agent: "a".into(),
            auth_context: None,
        };
        assert!(Identity::new(&[bad], None, None).is_err());
        // One token listed twice (its hash in either case) is an error naming both.
        let again = TokenEntry {
            sha256: sha256_hex(b"s3cret").to_ascii_uppercase(),
            agent: "ops".into(),
            auth_context: None,
        };
        let twice = Identity::new(&[entry, again], None, None)
            .err()
            .unwrap_or_default();
        assert!(
            twice.contains("\"planner\"") && twice.contains("\"ops\""),
            "{twice}"
        );
    }

    /// JWTs of `https://idp` for `https://gw/mcp`, their keys in `jwks`, `sub` naming
    /// both the agent and the context.
    fn issued_by_idp(jwks: std::path::PathBuf) -> super::super::jwt::JwtConfig {
        super::super::jwt::JwtConfig {
            issuer: "https://idp".into(),
            audience: "https://gw/mcp".into(),
            jwks_file: Some(jwks),
            jwks_url: None,
            ca_file: None,
            agent_claim: "sub".into(),
            context_claim: "sub".into(),
            scopes: vec![],
        }
    }

    #[tokio::test]
    async fn a_static_token_may_not_take_a_context_of_the_jwt_issuers() {
        let dir = crate::util::scratch::Scratch::new("identity-jwks");
        std::fs::create_dir_all(&*dir).expect("mkdir");
        let jwks = dir.join("jwks.json");
        std::fs::write(&jwks, r#"{"keys": []}"#).expect("jwks");
        let jwt = JwtVerifier::load(issued_by_idp(jwks))
            .await
            .expect("verifier");
        let token = |context: &str| TokenEntry {
            sha256: sha256_hex(b"t"),
            agent: "a".into(),
            auth_context: Some(context.into()),
        };
        let refused = Identity::new(&[token("https://idp#alice")], None, Some(jwt.clone()));
        assert!(refused.is_err_and(|e| e.contains("JWT issuer")));
        assert!(Identity::new(&[token("https://idp-alice")], None, Some(jwt.clone())).is_ok());
        // The audience is the URL clients are sent to for the metadata.
        for audience in ["api://gw", "gw/mcp", "/mcp", "https://"] {
            let mut config = jwt.config().clone();
            config.audience = audience.into();
            let e = JwtVerifier::load(config).await.expect_err(audience);
            assert!(e.to_string().contains("jwt.audience"), "{e}");
        }
    }

    // What a configured token opened holds while that token is listed for its
    // principal: one replaced under the same agent and context (rotated, leaked) ends
    // it, though the principal is still admitted by the new one.
    #[test]
    fn what_a_configured_token_opened_holds_while_that_token_is_listed() {
        let entry = |token: &[u8]| TokenEntry {
            sha256: sha256_hex(token),
            agent: "planner".into(),
            auth_context: Some("alice".into()),
        };
        let before = Identity::new(&[entry(b"leaked")], None, None).expect("identity");
        let admitted = before.resolve(Some("Bearer leaked")).expect("admitted");
        let credential = admitted.credential.clone();
        assert!(before.admits_with(&admitted.principal, credential.as_ref()));
        let rotated = Identity::new(&[entry(b"fresh")], None, None).expect("identity");
        assert!(
            rotated.admits(&admitted.principal),
            "the principal is still admitted"
        );
        assert!(
            !rotated.admits_with(&admitted.principal, credential.as_ref()),
            "by another token"
        );
        let both =
            Identity::new(&[entry(b"leaked"), entry(b"fresh")], None, None).expect("identity");
        assert!(both.admits_with(&admitted.principal, credential.as_ref()));
        assert!(!format!("{credential:?}").contains(&sha256_hex(b"leaked")));
    }

    /// An ES256 key: its PKCS#8 document and its public JWK named `kid`.
    fn es256(kid: &str) -> (Vec<u8>, serde_json::Value) {
        use base64::Engine;
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
        let rng = ring::rand::SystemRandom::new();
        let alg = &ECDSA_P256_SHA256_FIXED_SIGNING;
        let doc = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("key");
        let pair = EcdsaKeyPair::from_pkcs8(alg, doc.as_ref(), &rng).expect("pair");
        let point = pair.public_key().as_ref();
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let jwk = serde_json::json!({"kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256",
            "x": b64(&point[1..33]), "y": b64(&point[33..65])});
        (doc.as_ref().to_vec(), jwk)
    }

    // What a JWT opened is checked again against the keys in force, not against its
    // expiry (a stream ends at it on its own; a session outlives one token).
    #[tokio::test]
    async fn what_a_jwt_opened_holds_while_its_key_does_whatever_its_expiry() {
        let dir = crate::util::scratch::Scratch::new("identity-recheck");
        std::fs::create_dir_all(&*dir).expect("mkdir");
        let (signing, jwk) = es256("k1");
        let (_, other) = es256("k2");
        let identity = |keys: &serde_json::Value| {
            let jwks = dir.join("jwks.json");
            std::fs::write(&jwks, serde_json::json!({"keys": [keys]}).to_string()).expect("jwks");
            async move {
                let jwt = JwtVerifier::load(issued_by_idp(jwks))
                    .await
                    .expect("verifier");
                Identity::new(&[], None, Some(jwt)).expect("identity")
            }
        };
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some("k1".into());
        let expired = serde_json::json!({"iss": "https://idp", "aud": "https://gw/mcp",
            "sub": "c", "exp": 1_000_000_000u64});
        let key = jsonwebtoken::EncodingKey::from_ec_der(&signing);
        let token = jsonwebtoken::encode(&header, &expired, &key).expect("sign");
        let credential = Credential(Bearer::Jwt(token.as_str().into()));
        let c = Principal {
            agent: "c".into(),
            context: Some("https://idp#c".into()),
        };
        let now = identity(&jwk).await;
        assert!(
            now.admits_with(&c, Some(&credential)),
            "expired, its key in force"
        );
        let d = Principal {
            agent: "d".into(),
            ..c.clone()
        };
        assert!(
            !now.admits_with(&d, Some(&credential)),
            "another principal's"
        );
        let rotated = identity(&other).await;
        assert!(!rotated.admits_with(&c, Some(&credential)), "its key gone");
        assert!(
            format!("{credential:?}").find(&token).is_none(),
            "never shown"
        );
    }
}
