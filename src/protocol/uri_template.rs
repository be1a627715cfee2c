//! Whether a URI could be an expansion of an RFC 6570 URI template, as servers list
//! them in `resources/templates/list`: what routes a read of a URI no list names to the
//! servers whose templates make it first, before the other servers with resources.
//!
//! The match is by shape, not by value: each expression may expand to nothing (an
//! undefined variable) or to its operator's prefix and a run of the characters its
//! expansion can hold; literals match exactly. Templates and URIs are a server's and a
//! caller's: the work is bounded by a budget the caller gives, and a template that is
//! not RFC 6570 (an unclosed brace, a reserved operator) matches nothing.

/// The longest template matched; a longer one matches nothing.
const MAX_TEMPLATE: usize = 1024;
/// The most parts (literals and expressions) of a template matched.
const MAX_PARTS: usize = 64;

/// One part of a template.
#[derive(Debug, PartialEq, Eq)]
enum Part<'a> {
    Literal(&'a str),
    /// An expression: the prefix its expansion begins with (none for simple and
    /// reserved expansion), and the characters its expansion cannot hold.
    Expression {
        prefix: Option<u8>,
        stops: &'static [u8],
    },
}

/// An expression's prefix and stop characters, by its operator (RFC 6570 §3.2).
fn operator(op: Option<u8>) -> Option<(Option<u8>, &'static [u8])> {
    Some(match op {
        None => (None, b"/?#"),
        Some(b'+') => (None, b""),
        Some(b'#') => (Some(b'#'), b""),
        Some(b'.') => (Some(b'.'), b"/?#"),
        Some(b'/') => (Some(b'/'), b"?#"),
        Some(b';') => (Some(b';'), b"/?#"),
        Some(b'?') => (Some(b'?'), b"#"),
        Some(b'&') => (Some(b'&'), b"#"),
        // `=,!@|` are reserved for later operators; anything else is no operator.
        Some(_) => return None,
    })
}

fn is_varchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'%' | b'.' | b',' | b'*' | b':')
}

/// The template's parts, or `None` if it is not one.
fn parse(template: &str) -> Option<Vec<Part<'_>>> {
    if template.len() > MAX_TEMPLATE {
        return None;
    }
    let mut parts = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        let (literal, after) = match rest.find(['{', '}']) {
            Some(at) => rest.split_at(at),
            None => (rest, ""),
        };
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        if after.is_empty() {
            break;
        }
        // A `}` before any `{` is no template.
        let body = after.strip_prefix('{')?;
        let end = body.find('}')?;
        let (expression, after) = (&body[..end], &body[end + 1..]);
        let first = *expression.as_bytes().first()?;
        // Operators and the characters reserved for later ones (a name never begins
        // with `.`, which is the label operator).
        let (op, vars) = if b"+#./;?&=,!@|".contains(&first) {
            (Some(first), &expression[1..])
        } else {
            (None, expression)
        };
        let (prefix, stops) = operator(op)?;
        if vars.is_empty() || !vars.bytes().all(is_varchar) {
            return None;
        }
        parts.push(Part::Expression { prefix, stops });
        if parts.len() > MAX_PARTS {
            return None;
        }
        rest = after;
    }
    Some(parts)
}

/// Whether `uri` could be an expansion of `template`: `Some(true)` or `Some(false)`,
/// or `None` when deciding could take more than what is left of `budget` (byte steps:
/// the template's length times the URI's, which bounds the parse and every part's
/// scan, a literal's compares included; taken from it either way).
pub(crate) fn matches(template: &str, uri: &str, budget: &mut usize) -> Option<bool> {
    // One too long is refused by its length alone.
    let cost = (template.len().clamp(1, MAX_TEMPLATE + 1)).saturating_mul(uri.len() + 1);
    *budget = budget.checked_sub(cost)?;
    let Some(parts) = parse(template) else {
        return Some(false);
    };
    let uri = uri.as_bytes();
    // reach[i]: the first i bytes of `uri` are an expansion of the parts so far.
    let mut reach = vec![false; uri.len() + 1];
    reach[0] = true;
    let mut next = vec![false; uri.len() + 1];
    for part in &parts {
        next.fill(false);
        match part {
            Part::Literal(literal) => {
                let literal = literal.as_bytes();
                for i in 0..=uri.len().saturating_sub(literal.len()) {
                    if reach[i] && uri[i..].starts_with(literal) {
                        next[i + literal.len()] = true;
                    }
                }
            }
            Part::Expression { prefix, stops } => {
                // `open`: some expansion of this expression ends at i and may go on.
                let mut open = false;
                for i in 0..=uri.len() {
                    next[i] = reach[i] || open;
                    let Some(&c) = uri.get(i) else { break };
                    let continues = open && !stops.contains(&c);
                    let begins = reach[i]
                        && match prefix {
                            Some(p) => c == *p,
                            None => !stops.contains(&c),
                        };
                    open = continues || begins;
                }
            }
        }
        std::mem::swap(&mut reach, &mut next);
    }
    Some(reach[uri.len()])
}

/// Whether `template` names its scheme in literal text (`repo://{owner}/…`, not
/// `{+uri}` nor `{scheme}:…`): a template that could make a URI of any scheme claims
/// every URI, and says nothing of where one is.
pub(crate) fn names_its_scheme(template: &str) -> bool {
    let literal = template.split('{').next().unwrap_or("");
    let Some((scheme, _)) = literal.split_once(':') else {
        return false;
    };
    let mut chars = scheme.bytes();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(template: &str, uri: &str) -> bool {
        let mut budget = usize::MAX;
        matches(template, uri, &mut budget).unwrap_or(false)
    }

    #[test]
    fn a_template_names_its_scheme_only_in_literal_text() {
        for named in [
            "repo://{owner}/{repo}/contents{/path*}",
            "demo://echo/{text}",
            "file:///{+path}",
            "urn:isbn:{id}",
            "demo://readme",
        ] {
            assert!(names_its_scheme(named), "{named}");
        }
        for unnamed in [
            "{+uri}",
            "{scheme}://x/{y}",
            "users/{id}",
            "x{a}:b",
            "1ab:{x}",
            ":{x}",
            "",
        ] {
            assert!(!names_its_scheme(unnamed), "{unnamed}");
        }
    }

    #[test]
    fn simple_expressions_take_one_segment() {
        assert!(m("file:///{name}", "file:///notes.txt"));
        assert!(!m("file:///{name}", "file:///a/b"));
        assert!(m("users/{id}/posts/{post}", "users/7/posts/12"));
        assert!(!m("users/{id}/posts/{post}", "users/7/comments/12"));
        assert!(m("demo://echo/{text}", "demo://echo/hello"));
        assert!(!m("demo://echo/{text}", "demo://other/hello"));
        // An undefined variable expands to nothing.
        assert!(m("users/{id}", "users/"));
        assert!(!m("users/{id}", "users/7?x=1"));
    }

    #[test]
    fn operators_have_their_prefixes_and_characters() {
        assert!(m("file:///{+path}", "file:///a/b/c?d#e"));
        assert!(m(
            "repo://{owner}/{repo}/contents{/path*}",
            "repo://o/r/contents/src/lib.rs"
        ));
        assert!(m(
            "repo://{owner}/{repo}/contents{/path*}",
            "repo://o/r/contents"
        ));
        assert!(!m(
            "repo://{owner}/{repo}/contents{/path*}",
            "repo://o/r/contentsX"
        ));
        assert!(m("search{?q,lang}", "search?q=rust&lang=en"));
        assert!(m("search{?q}{&page}", "search?q=x&page=2"));
        assert!(!m("search{?q}", "search&q=x"));
        assert!(m("doc{#section}", "doc#intro"));
        assert!(m("host{.domain*}", "host.example.com"));
        assert!(!m("host{.domain*}", "host.example/com"));
        assert!(m("map{;x,y}", "map;x=1;y=2"));
    }

    #[test]
    fn what_is_no_template_matches_nothing() {
        for bad in [
            "a{b", "a}b", "a{}", "a{=x}", "a{x y}", "a{@x}", "a{|x}", "{{x}}",
        ] {
            assert!(!m(bad, "ab"), "{bad}");
            assert_eq!(parse(bad), None, "{bad}");
        }
        let long = format!("a{}", "x".repeat(MAX_TEMPLATE));
        assert!(!m(&long, &long));
        let many = "{a}".repeat(MAX_PARTS + 1);
        assert!(!m(&many, "x"));
        // No braces at all: the template is its one URI.
        assert!(m("demo://readme", "demo://readme"));
        assert!(!m("demo://readme", "demo://readme2"));
    }

    #[test]
    fn the_budget_bounds_the_work() {
        let uri = "a".repeat(1000);
        let mut budget = 9 * 1001;
        assert_eq!(matches("{a}{b}{c}", &uri, &mut budget), Some(true));
        assert_eq!(budget, 0);
        assert_eq!(matches("{a}", &uri, &mut budget), None, "spent");
        let mut budget = 10;
        assert_eq!(matches("x{a}", &uri, &mut budget), None);
        // One that is no template costs its length all the same.
        let mut budget = 5 * 1001;
        assert_eq!(matches("a{b c", &uri, &mut budget), Some(false));
        assert_eq!(budget, 0);
    }
}
