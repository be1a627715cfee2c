//! Finding the authorization server (spec: authorization server discovery): the
//! protected resource metadata (RFC 9728) at the URL the 401 names, else the well-known
//! locations in the spec's order; then the authorization server's metadata (RFC 8414,
//! then OpenID discovery, in the spec's order), whose `issuer` must be exactly the one
//! it was looked up for. Every URL is checked before it is fetched: HTTPS (plain HTTP
//! only on loopback, for a loopback server), and the resource metadata on the server's
//! own origin. Nothing here carries a token, and no redirect is followed.

use serde::Deserialize;
use serde_json::Value;
use url::Url;

use super::error::AuthFailure;

/// The protected resource's metadata, as far as the client uses it.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct ResourceMetadata {
    pub(crate) resource: String,
    #[serde(default)]
    pub(crate) authorization_servers: Vec<String>,
    #[serde(default)]
    pub(crate) scopes_supported: Vec<String>,
}

/// The authorization server's metadata, as far as the client uses it.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct ServerMetadata {
    pub(crate) issuer: String,
    pub(crate) authorization_endpoint: Option<String>,
    pub(crate) token_endpoint: String,
    pub(crate) registration_endpoint: Option<String>,
    #[serde(default)]
    pub(crate) response_types_supported: Vec<String>,
    pub(crate) code_challenge_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) scopes_supported: Vec<String>,
    pub(crate) token_endpoint_auth_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) client_id_metadata_document_supported: bool,
    #[serde(default)]
    pub(crate) authorization_response_iss_parameter_supported: bool,
}

/// What discovery found for one server.
#[derive(Clone, Debug)]
pub(crate) struct Discovered {
    pub(crate) resource: ResourceMetadata,
    pub(crate) server: ServerMetadata,
    /// Where the resource metadata was read.
    pub(crate) from: Url,
}

/// Whether `url` names this machine (`localhost`, a loopback address): where a secret
/// may go over plain http.
pub fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// Whether an address is this machine's, or a private, link-local, shared (carrier
/// NAT) or unspecified one, IPv4 forms carried in IPv6 included.
pub(crate) fn is_internal_ip(ip: std::net::IpAddr) -> bool {
    let v4 = |ip: std::net::Ipv4Addr| {
        let [a, b, ..] = ip.octets();
        ip.is_loopback()
            || ip.is_private()
            || ip.is_link_local()
            || ip.is_unspecified()
            || ip.is_broadcast()
            // Carrier-grade NAT (RFC 6598).
            || (a == 100 && (64..128).contains(&b))
            // "This network" (0/8), IETF protocol assignments (192.0.0/24) and the
            // benchmarking range (198.18/15), which some networks route internally.
            || a == 0
            || (a == 192 && b == 0 && ip.octets()[2] == 0)
            || (a == 198 && (b == 18 || b == 19))
    };
    match ip {
        std::net::IpAddr::V4(ip) => v4(ip),
        std::net::IpAddr::V6(ip) => {
            let s = ip.segments();
            let embedded = |hi: u16, lo: u16| {
                std::net::Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)
            };
            ip.is_loopback()
                || ip.is_unspecified()
                // Unique local (fc00::/7) and link-local (fe80::/10).
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                // Site-local (fec0::/10): deprecated, still routed inside some networks.
                || (s[0] & 0xffc0) == 0xfec0
                // IPv4-mapped and IPv4-compatible (::a.b.c.d).
                || ip.to_ipv4().is_some_and(v4)
                // NAT64 (64:ff9b::/96, and the local-use 64:ff9b:1::/48) and 6to4
                // (2002::/16) carry an IPv4 address too.
                || (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] && v4(embedded(s[6], s[7])))
                || (s[..3] == [0x64, 0xff9b, 1] && v4(embedded(s[6], s[7])))
                || (s[0] == 0x2002 && v4(embedded(s[1], s[2])))
                // SIIT's IPv4-translated form (::ffff:0:a.b.c.d, RFC 2765).
                || (s[..6] == [0, 0, 0, 0, 0xffff, 0] && v4(embedded(s[6], s[7])))
                // Teredo (2001::/32): the client's IPv4 address, inverted.
                || (s[..2] == [0x2001, 0] && v4(embedded(!s[6], !s[7])))
        }
    }
}

/// Whether a URL names this machine or an internal address by its literal host. A name
/// that resolves to one is caught when it is resolved ([`super::resolve`]).
pub(crate) fn is_internal(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => is_internal_ip(ip.into()),
        Some(url::Host::Ipv6(ip)) => is_internal_ip(ip.into()),
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost" || d.ends_with(".localhost")
        }
        None => false,
    }
}

/// A URL the client may fetch or send a person to, for a server at `server`. A server
/// on the public network may not point sign-in at this machine or a private network
/// (its discovery and token requests would reach them from inside).
pub(crate) fn checked_url(raw: &str, server: &Url) -> Result<Url, AuthFailure> {
    let bad = |why: &str| AuthFailure::BadUrl {
        url: crate::util::text::one_line(raw, 200),
        why: why.to_string(),
    };
    let url = Url::parse(raw).map_err(|e| bad(&e.to_string()))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("credentials in the URL"));
    }
    if is_internal(&url) && !is_internal(server) {
        return Err(bad(
            "an internal address, named by a server that is not on one",
        ));
    }
    match url.scheme() {
        "https" => Ok(url),
        "http" if is_loopback(&url) && is_loopback(server) => Ok(url),
        "http" => Err(bad("not HTTPS")),
        _ => Err(bad("neither https nor http")),
    }
}

/// The well-known URL for `suffix`, inserted between the origin and the path (RFC 8414
/// section 3.1, RFC 9728 section 3.1): a terminating `/` of the path goes, the query
/// stays, the fragment goes.
fn inserted(base: &Url, suffix: &str) -> Url {
    let mut url = base.clone();
    let path = base.path().trim_end_matches('/');
    let path = if path.is_empty() {
        String::new()
    } else {
        path.to_string()
    };
    url.set_path(&format!("/.well-known/{suffix}{path}"));
    url.set_fragment(None);
    url
}

/// Where to look for the resource metadata: the challenge's URL, else the path-inserted
/// and root well-known locations.
pub(crate) fn resource_metadata_urls(
    server: &Url,
    from_challenge: Option<&str>,
) -> Result<Vec<Url>, AuthFailure> {
    // The token would go to it in clear, and its metadata (which names where to sign
    // in) could be anyone's on the way.
    if server.scheme() != "https" && !is_loopback(server) {
        return Err(AuthFailure::BadUrl {
            url: crate::util::text::url_shown(server),
            why: "the server is not HTTPS: no sign-in over plain HTTP beyond loopback".into(),
        });
    }
    if let Some(raw) = from_challenge {
        // Anywhere HTTPS and public (RFC 9728 puts it where the server says): what it
        // says counts only if its `resource` is this server, as checked once read.
        return Ok(vec![checked_url(raw, server)?]);
    }
    let mut urls = Vec::new();
    let with_path = inserted(server, "oauth-protected-resource");
    let mut root = server.clone();
    root.set_path("/.well-known/oauth-protected-resource");
    root.set_query(None);
    root.set_fragment(None);
    if with_path != root {
        urls.push(with_path);
    }
    urls.push(root);
    Ok(urls)
}

/// Where to look for an issuer's metadata, in the spec's order.
pub(crate) fn server_metadata_urls(issuer: &str, server: &Url) -> Result<Vec<Url>, AuthFailure> {
    let base = checked_url(issuer, server)?;
    let has_path = !base.path().trim_end_matches('/').is_empty();
    let mut urls = vec![
        inserted(&base, "oauth-authorization-server"),
        inserted(&base, "openid-configuration"),
    ];
    if has_path {
        let mut appended = base.clone();
        appended.set_path(&format!(
            "{}/.well-known/openid-configuration",
            base.path().trim_end_matches('/')
        ));
        urls.push(appended);
    }
    Ok(urls)
}

/// Whether metadata naming `resource` may be used for a server at `server`: the same
/// URL, or the same origin with `resource`'s path a prefix of the server's on a `/`.
pub(crate) fn resource_matches(resource: &str, server: &Url) -> bool {
    let Ok(r) = Url::parse(resource) else {
        return false;
    };
    if r.fragment().is_some() || r.origin() != server.origin() {
        return false;
    }
    let (rp, sp) = (
        r.path().trim_end_matches('/'),
        server.path().trim_end_matches('/'),
    );
    rp.is_empty() || sp == rp || sp.starts_with(&format!("{rp}/"))
}

/// Checks what the authorization code grant needs: `code`, and PKCE with S256 (a server
/// that does not say it supports S256 is refused, as the spec requires).
pub(crate) fn check_for_code_grant(m: &ServerMetadata) -> Result<(), AuthFailure> {
    let Some(endpoint) = m.authorization_endpoint.as_deref() else {
        return Err(AuthFailure::Unsupported("no authorization_endpoint".into()));
    };
    // Its own query stays (RFC 6749 3.1), but may not name a parameter the sign-in
    // adds: each may be sent once, and one of the metadata's before the sign-in's own
    // (a `state` known to anyone) is what a reader taking the first would take.
    if let Ok(url) = Url::parse(endpoint)
        && let Some((name, _)) = url
            .query_pairs()
            .find(|(k, _)| AUTHORIZATION_PARAMS.contains(&k.as_ref()))
    {
        return Err(AuthFailure::BadUrl {
            url: crate::util::text::one_line(endpoint, 200),
            why: format!(
                "the authorization endpoint's query names `{}`, which the sign-in sends itself",
                crate::util::text::one_line(&name, 40)
            ),
        });
    }
    if !m.response_types_supported.is_empty()
        && !m.response_types_supported.iter().any(|t| t == "code")
    {
        return Err(AuthFailure::Unsupported(
            "response type code not supported".into(),
        ));
    }
    let s256 = m
        .code_challenge_methods_supported
        .as_ref()
        .is_some_and(|methods| methods.iter().any(|x| x == "S256"));
    if !s256 {
        return Err(AuthFailure::Unsupported(
            "PKCE with S256 not advertised (code_challenge_methods_supported)".into(),
        ));
    }
    Ok(())
}

/// The parameters a sign-in adds to the authorization endpoint's URL.
const AUTHORIZATION_PARAMS: &[&str] = &[
    "response_type",
    "client_id",
    "redirect_uri",
    "code_challenge",
    "code_challenge_method",
    "state",
    "resource",
    "scope",
];

/// The longest URL metadata may give. URLs from it are kept with every token (the
/// issuer, the token endpoint, the resource), whose file is read back only up to its
/// bound: a longer one would be written and then read as no token.
const MAX_METADATA_STRING: usize = 8 * 1024;

/// The fields whose values are kept or used as URLs (the others are not read, and may
/// be as long as they are: a signed metadata JWT, a certificate chain).
const BOUNDED_FIELDS: &[&str] = &[
    "resource",
    "authorization_servers",
    "issuer",
    "authorization_endpoint",
    "token_endpoint",
    "registration_endpoint",
];

/// Whether one of [`BOUNDED_FIELDS`] of `value` holds a string longer than `max` bytes.
fn holds_longer(value: &Value, max: usize) -> bool {
    let Value::Object(map) = value else {
        return false;
    };
    let long = |v: &Value| v.as_str().is_some_and(|s| s.len() > max);
    BOUNDED_FIELDS
        .iter()
        .filter_map(|k| map.get(*k))
        .any(|v| long(v) || v.as_array().is_some_and(|items| items.iter().any(long)))
}

/// Parses metadata JSON into `T`.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, AuthFailure> {
    if holds_longer(&value, MAX_METADATA_STRING) {
        return Err(AuthFailure::Invalid(format!(
            "a value longer than {} KiB",
            MAX_METADATA_STRING / 1024
        )));
    }
    // serde's message quotes the value it could not take: a server's, of any size.
    serde_json::from_value(value)
        .map_err(|e| AuthFailure::Invalid(crate::util::text::one_line(&e.to_string(), 200)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_metadata_says_reaches_an_error_cut_and_escaped() {
        let long = format!("\u{1b}[2J{}", "x".repeat(1 << 20));
        let server = url("https://mcp.example.com/mcp");
        let Err(AuthFailure::BadUrl { url, .. }) = checked_url(&long, &server) else {
            panic!("not a URL");
        };
        assert!(
            url.len() < 300 && !url.contains('\u{1b}'),
            "{} bytes",
            url.len()
        );
        // A string where a list belongs: serde's message quotes the string.
        let wrong_type = serde_json::json!({
            "resource": "https://mcp.example.com/mcp",
            "authorization_servers": long,
        });
        let Err(AuthFailure::Invalid(why)) = parse::<ResourceMetadata>(wrong_type) else {
            panic!("a list where a string belongs");
        };
        assert!(why.len() < 300, "{} bytes", why.len());
    }

    // A URL kept with every token is bounded: one of 900 KB would make a token file
    // too large to read back (read as no token: a sign-in per request).
    #[test]
    fn metadata_with_a_very_long_value_is_refused() {
        let long = format!("https://mcp.example.com/mcp?{}", "q".repeat(900_000));
        let huge = serde_json::json!({"resource": long, "authorization_servers": []});
        let Err(AuthFailure::Invalid(why)) = parse::<ResourceMetadata>(huge) else {
            panic!("a 900 KB resource taken");
        };
        assert!(why.contains("KiB"), "{why}");
        let fine = serde_json::json!({"resource": "https://mcp.example.com/mcp"});
        assert!(parse::<ResourceMetadata>(fine).is_ok());
        // A long value the harness neither keeps nor reads is no reason to refuse.
        let signed = serde_json::json!({
            "resource": "https://mcp.example.com/mcp",
            "signed_metadata": "j".repeat(64 * 1024),
        });
        assert!(parse::<ResourceMetadata>(signed).is_ok());
    }

    fn url(s: &str) -> Url {
        Url::parse(s).expect("url")
    }

    #[test]
    fn well_known_locations_follow_the_specs_order() {
        let s = url("https://example.com/public/mcp");
        let prm: Vec<String> = resource_metadata_urls(&s, None)
            .expect("urls")
            .iter()
            .map(Url::to_string)
            .collect();
        assert_eq!(
            prm,
            [
                "https://example.com/.well-known/oauth-protected-resource/public/mcp",
                "https://example.com/.well-known/oauth-protected-resource"
            ]
        );
        let with_path: Vec<String> = server_metadata_urls("https://auth.example.com/tenant1", &s)
            .expect("urls")
            .iter()
            .map(Url::to_string)
            .collect();
        assert_eq!(
            with_path,
            [
                "https://auth.example.com/.well-known/oauth-authorization-server/tenant1",
                "https://auth.example.com/.well-known/openid-configuration/tenant1",
                "https://auth.example.com/tenant1/.well-known/openid-configuration"
            ]
        );
        let root: Vec<String> = server_metadata_urls("https://auth.example.com", &s)
            .expect("urls")
            .iter()
            .map(Url::to_string)
            .collect();
        assert_eq!(
            root,
            [
                "https://auth.example.com/.well-known/oauth-authorization-server",
                "https://auth.example.com/.well-known/openid-configuration"
            ]
        );
    }

    #[test]
    fn no_sign_in_to_a_plain_http_server_beyond_loopback() {
        for (server, signs_in) in [
            ("http://mcp.example.com/mcp", false),
            ("http://10.0.0.7/mcp", false),
            ("http://127.0.0.1:8080/mcp", true),
            ("http://localhost:8080/mcp", true),
            ("https://mcp.example.com/mcp", true),
        ] {
            let got = resource_metadata_urls(&url(server), None);
            assert_eq!(got.is_ok(), signs_in, "{server}: {got:?}");
            let got = resource_metadata_urls(&url(server), Some(server));
            assert_eq!(got.is_ok(), signs_in, "{server} (challenge): {got:?}");
        }
    }

    #[test]
    fn urls_are_checked_before_use() {
        let s = url("https://mcp.example.com/mcp");
        assert!(checked_url("http://auth.example.com", &s).is_err());
        assert!(checked_url("https://user:pw@auth.example.com", &s).is_err());
        assert!(checked_url("file:///etc/passwd", &s).is_err());
        assert!(
            checked_url("http://127.0.0.1:9/x", &s).is_err(),
            "loopback only for a loopback server"
        );
        assert!(checked_url("http://127.0.0.1:9/x", &url("http://127.0.0.1:8/mcp")).is_ok());
        // A public server may not point sign-in inside, even over HTTPS.
        for inside in [
            "https://127.0.0.1/x",
            "https://localhost:6443/",
            "https://api.localhost/",
            "https://10.1.2.3/token",
            "https://172.20.0.1/",
            "https://192.168.1.1/",
            "https://169.254.169.254/latest/meta-data",
            "https://100.64.0.1/",
            "https://0.0.0.0/",
            "https://[::1]/",
            "https://[fd00::1]/",
            "https://[fe80::1]/",
            "https://[::ffff:10.0.0.1]/",
            "https://[::10.0.0.1]/",
            "https://[64:ff9b::a00:1]/",
            "https://[2002:a00:1::1]/",
            "https://[64:ff9b:1::a00:1]/",
            "https://[fec0::1]/",
            "https://[::ffff:0:10.0.0.1]/",
            // Teredo, its client 10.0.0.1 (inverted: f5ff:fffe).
            "https://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/",
            "https://0.1.2.3/",
            "https://192.0.0.8/",
            "https://198.18.0.1/",
            // Literal forms the URL standard turns into 127.0.0.1.
            "https://2130706433/",
            "https://0177.0.0.1/",
            "https://0x7f.1/",
            "https://127.1/",
            "https://127.0.0.1./",
        ] {
            assert!(checked_url(inside, &s).is_err(), "{inside}");
        }
        assert!(checked_url("https://8.8.8.8/", &s).is_ok());
        assert!(checked_url("https://[2001:0:4136:e378:8000:63bf:f7f7:f7f7]/", &s).is_ok());
        assert!(checked_url("https://[2001:db8::1]/", &s).is_ok());
        // A server on a private network may name its neighbours.
        let private = url("https://10.0.0.5/mcp");
        assert!(checked_url("https://10.0.0.6/", &private).is_ok());
        // Another origin may hold it (its `resource` must still be this server's), but
        // not this machine's nor a private network's.
        assert!(
            resource_metadata_urls(
                &s,
                Some("https://meta.example/.well-known/oauth-protected-resource")
            )
            .is_ok(),
            "another origin"
        );
        assert!(
            resource_metadata_urls(&s, Some("https://127.0.0.1/.well-known/x")).is_err(),
            "this machine"
        );
        assert!(
            resource_metadata_urls(&s, Some("http://meta.example/.well-known/x")).is_err(),
            "plain HTTP"
        );
    }

    #[test]
    fn a_resource_matches_its_server_or_a_path_prefix_on_a_segment() {
        let s = url("https://mcp.example.com/api/mcp");
        assert!(resource_matches("https://mcp.example.com/api/mcp", &s));
        assert!(resource_matches("https://mcp.example.com/api", &s));
        assert!(resource_matches("https://mcp.example.com", &s));
        assert!(!resource_matches("https://mcp.example.com/ap", &s));
        assert!(!resource_matches("https://other.example.com/api/mcp", &s));
        assert!(!resource_matches("https://mcp.example.com/api/mcp#x", &s));
    }
}
