//! `WWW-Authenticate` read as RFC 9110 says: several header fields, several challenges
//! per field, case-insensitive schemes and parameter names, values as tokens or quoted
//! strings with escapes. Only the `Bearer` challenge matters here.

use std::collections::BTreeMap;

/// The `Bearer` challenge of a 401 or 403.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Challenge {
    /// Parameters by lower-cased name (`resource_metadata`, `scope`, `error`, …).
    pub params: BTreeMap<String, String>,
}

impl Challenge {
    /// The Bearer challenge among `fields` (each a `WWW-Authenticate` value), if any.
    pub fn bearer<'a>(fields: impl IntoIterator<Item = &'a str>) -> Option<Challenge> {
        fields
            .into_iter()
            .flat_map(challenges)
            .find(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, params)| Challenge { params })
    }

    /// One parameter.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }

    /// The scopes it asks for, in order: well-formed ones, each once, at most
    /// [`MAX_SCOPES`](super::MAX_SCOPES) (a step-up asks for no more). A server's header
    /// of 100,000 scopes is not copied into the memos, nor compared scope by scope with
    /// what was denied before.
    pub fn scopes(&self) -> Vec<String> {
        let mut scopes: Vec<String> = Vec::new();
        let named = self.get("scope").unwrap_or_default().split_whitespace();
        for s in named.filter(|s| super::scope_token(s)) {
            if scopes.len() == super::MAX_SCOPES {
                break;
            }
            if !scopes.iter().any(|have| have == s) {
                scopes.push(s.to_string());
            }
        }
        scopes
    }

    /// Whether it says the token lacks scope (a 403 worth a step-up).
    pub fn insufficient_scope(&self) -> bool {
        self.get("error") == Some("insufficient_scope")
    }
}

/// A cursor over one header value.
struct Lexer<'a> {
    s: &'a [u8],
    at: usize,
}

fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

impl Lexer<'_> {
    fn skip_ws(&mut self) {
        while self.at < self.s.len() && matches!(self.s[self.at], b' ' | b'\t') {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn token(&mut self) -> Option<String> {
        let start = self.at;
        while self.peek().is_some_and(is_tchar) {
            self.at += 1;
        }
        (self.at > start).then(|| String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
    }

    /// A token68 (base64-like, may end in `=`), for schemes such as Basic.
    fn token68(&mut self) -> bool {
        let start = self.at;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || b"-._~+/".contains(&c))
        {
            self.at += 1;
        }
        while self.peek() == Some(b'=') {
            self.at += 1;
        }
        self.at > start
    }

    fn quoted(&mut self) -> Option<String> {
        if self.peek() != Some(b'"') {
            return None;
        }
        self.at += 1;
        let mut out = Vec::new();
        while let Some(c) = self.peek() {
            self.at += 1;
            match c {
                b'"' => return Some(String::from_utf8_lossy(&out).into_owned()),
                b'\\' => {
                    if let Some(next) = self.peek() {
                        out.push(next);
                        self.at += 1;
                    }
                }
                c => out.push(c),
            }
        }
        None
    }
}

/// Every (scheme, params) challenge in one header value.
fn challenges(value: &str) -> Vec<(String, BTreeMap<String, String>)> {
    let mut lx = Lexer {
        s: value.as_bytes(),
        at: 0,
    };
    let mut out: Vec<(String, BTreeMap<String, String>)> = Vec::new();
    loop {
        lx.skip_ws();
        while lx.peek() == Some(b',') {
            lx.at += 1;
            lx.skip_ws();
        }
        let Some(word) = lx.token() else { break };
        lx.skip_ws();
        // `word=` continues the current challenge's parameters; otherwise it is a scheme.
        if lx.peek() == Some(b'=') && !out.is_empty() {
            lx.at += 1;
            lx.skip_ws();
            let value = lx.quoted().or_else(|| lx.token()).unwrap_or_default();
            if let Some((_, params)) = out.last_mut() {
                params.entry(word.to_ascii_lowercase()).or_insert(value);
            }
        } else {
            out.push((word, BTreeMap::new()));
            // A token68 credential right after the scheme (`Basic abc==`).
            let save = lx.at;
            if lx.token68() {
                lx.skip_ws();
                if lx.peek().is_some_and(|c| c != b',') {
                    lx.at = save;
                }
            }
        }
        lx.skip_ws();
        match lx.peek() {
            Some(b',') => lx.at += 1,
            None => break,
            Some(_) if lx.peek().is_some_and(is_tchar) => {}
            Some(_) => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parameters_are_read_among_other_challenges_and_fields() {
        let c = Challenge::bearer([
            r#"Basic realm="x", Bearer resource_metadata="https://a.example/.well-known/oauth-protected-resource/mcp", scope="read write""#,
        ])
        .expect("bearer");
        assert_eq!(
            c.get("resource_metadata"),
            Some("https://a.example/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(c.scopes(), ["read", "write"]);
        let c = Challenge::bearer([
            "Basic abc==",
            r#"BEARER Error="insufficient_scope", SCOPE=admin"#,
        ])
        .expect("bearer in a second field");
        assert!(c.insufficient_scope());
        assert_eq!(c.scopes(), ["admin"]);
    }

    #[test]
    fn a_scope_inside_another_quoted_value_is_not_the_scope() {
        let c = Challenge::bearer([
            r#"Bearer error_description="need scope=\"evil\" here", scope="mcp:read""#,
        ])
        .expect("bearer");
        assert_eq!(c.scopes(), ["mcp:read"]);
        assert_eq!(
            c.get("error_description"),
            Some(r#"need scope="evil" here"#)
        );
    }

    #[test]
    fn scopes_are_well_formed_each_once_and_capped() {
        let many: Vec<String> = (0..100_000).map(|i| format!("s{i}")).collect();
        let header = format!(r#"Bearer scope="bad\\one a a {}""#, many.join(" "));
        let c = Challenge::bearer([header.as_str()]).expect("bearer");
        let scopes = c.scopes();
        assert_eq!(scopes.len(), crate::transport::auth::MAX_SCOPES);
        assert_eq!(
            scopes[..3],
            ["a", "s0", "s1"],
            "the bad one left out, `a` once"
        );
    }

    #[test]
    fn garbage_is_no_challenge_and_no_panic() {
        assert_eq!(
            Challenge::bearer(["", ",,,", "=\"", "Bearer \"unterminated"]),
            Some(Challenge::default())
        );
        assert_eq!(Challenge::bearer(["Basic realm=x"]), None);
    }
}
