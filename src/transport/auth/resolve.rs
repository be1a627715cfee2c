//! Name resolution for one server's sign-in requests. A server on the public network
//! may not point discovery, registration or token requests at this machine or a private
//! network: [`super::discovery::checked_url`] refuses such literal addresses, and this
//! refuses the names that resolve there. The addresses checked are the ones connected
//! to, so a name cannot resolve one way for the check and another for the request.
//!
//! Whether the server itself is on an internal network is never taken from a lookup
//! made for the purpose (its DNS is the server's to answer): it is its literal address
//! when configured by one, else what its own name resolved to when sign-in connected to
//! it: only internal addresses, and never a public one before. An attacker's name that
//! adds one internal address to public ones does not make its server internal (and is
//! connected to on its public addresses only), and one that resolves only internally is connected to
//! there, where TLS for its name fails. The verdict is taken once a request to such an
//! answer is answered (TLS for the server's name held there), not when the name
//! resolves: one answer that did not connect left the server internal for good before,
//! and every name sign-in was later pointed at was let through to internal addresses.
//!
//! Behind a proxy, names are resolved by the proxy: only the proxies' own names (the
//! operator's) reach this resolver unchecked; every name it does see is connected to
//! directly (`NO_PROXY`, a scheme no proxy covers) and is checked.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use parking_lot::Mutex;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use url::Url;

use super::discovery::{is_internal, is_internal_ip};

/// A sign-in request's host resolved to an internal address, named by a server that is
/// not on one.
#[derive(Debug, thiserror::Error)]
#[error(
    "{host} resolves to an internal address ({address}), and the server is not on an internal network"
)]
pub(crate) struct InternalAddress {
    pub(crate) host: String,
    pub(crate) address: IpAddr,
}

/// Addresses of a host name (port 0).
type Lookup = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>
        + Send
        + Sync,
>;

fn system_lookup() -> Lookup {
    Arc::new(|host: String| {
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .map(|a| a.ip())
                .collect())
        })
    })
}

/// Where the server is, as far as sign-in can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ServerAt {
    /// Its configured address, or the addresses its name resolved to for sign-in.
    Internal(bool),
    /// Its name has not been resolved for sign-in yet: treated as public.
    Unknown,
    /// Its name resolved to internal addresses only, and no request there has been
    /// answered yet: treated as public, but for its own name.
    Trying,
}

/// The resolver of one server's sign-in requests.
pub(crate) struct SignInResolver {
    /// The server's host name, when it is configured by one.
    server_host: Option<String>,
    server_at: Mutex<ServerAt>,
    /// The proxies' host names (see the module docs).
    proxies: Vec<String>,
    lookup: Lookup,
}

/// The variables reqwest reads its proxies from.
const PROXY_VARIABLES: [&str; 6] = [
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// The host names of the proxies the environment names (a value with or without a
/// scheme); the names sign-in resolves through them are not ours to check.
fn proxy_hosts() -> Vec<String> {
    PROXY_VARIABLES
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .filter(|v| !v.trim().is_empty())
        .filter_map(|v| {
            let v = v.trim();
            let url = match v.contains("://") {
                true => Url::parse(v),
                false => Url::parse(&format!("http://{v}")),
            };
            url.ok()?.host_str().map(normalized)
        })
        .collect()
}

/// A host name as compared: lowercase, without a final dot.
fn normalized(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

impl SignInResolver {
    /// The resolver for the sign-in of the server at `url`, or `None` when the server is
    /// on this machine or a private network by its literal address (nothing to check).
    pub(crate) fn for_server(url: &Url) -> Option<SignInResolver> {
        Self::with_lookup(url, proxy_hosts(), system_lookup())
    }

    fn with_lookup(url: &Url, proxies: Vec<String>, lookup: Lookup) -> Option<SignInResolver> {
        if is_internal(url) {
            return None;
        }
        let (server_host, server_at) = match url.host() {
            Some(url::Host::Domain(d)) => (Some(normalized(d)), ServerAt::Unknown),
            // A public literal address: nothing to resolve.
            _ => (None, ServerAt::Internal(false)),
        };
        Some(SignInResolver {
            server_host,
            server_at: Mutex::new(server_at),
            proxies,
            lookup,
        })
    }

    /// Whether sign-in has yet to learn where the server is (its name has not been
    /// resolved for a sign-in request).
    pub(crate) fn server_unknown(&self) -> bool {
        matches!(*self.server_at.lock(), ServerAt::Unknown | ServerAt::Trying)
    }

    /// A sign-in request to `url` was answered (`true`) or failed before any answer:
    /// the server is internal once one to its own name, resolved internally only, is
    /// answered.
    pub(crate) fn sent(&self, url: &Url, answered: bool) {
        let ours = url.host_str().map(normalized);
        if ours.is_none() || ours != self.server_host {
            return;
        }
        let mut at = self.server_at.lock();
        if *at == ServerAt::Trying {
            *at = match answered {
                true => ServerAt::Internal(true),
                false => ServerAt::Unknown,
            };
        }
    }

    /// The addresses of `host` that sign-in may connect to.
    async fn checked(
        &self,
        host: String,
    ) -> Result<Vec<IpAddr>, Box<dyn std::error::Error + Send + Sync>> {
        let addrs = (self.lookup)(host.clone()).await?;
        let name = normalized(&host);
        if self.proxies.contains(&name) {
            return Ok(addrs);
        }
        let all_internal = !addrs.is_empty() && addrs.iter().all(|a| is_internal_ip(*a));
        if self.server_host.as_deref() == Some(name.as_str()) {
            // The configured server's own name says where the server is; once public,
            // always public (a name that turns internal later gains nothing).
            let mut at = self.server_at.lock();
            if all_internal && *at != ServerAt::Internal(false) {
                if *at == ServerAt::Unknown {
                    *at = ServerAt::Trying;
                }
                return Ok(addrs);
            }
            if !all_internal {
                *at = ServerAt::Internal(false);
            }
        }
        let server_internal = *self.server_at.lock() == ServerAt::Internal(true);
        if server_internal {
            return Ok(addrs);
        }
        // Only the public addresses are given to the connector (a name with a public A
        // record and a private AAAA one, common with IPv6 ULAs, is reached on the
        // first); one with none is refused.
        let public: Vec<IpAddr> = addrs
            .iter()
            .copied()
            .filter(|a| !is_internal_ip(*a))
            .collect();
        match addrs.iter().copied().find(|a| is_internal_ip(*a)) {
            Some(address) if public.is_empty() => Err(Box::new(InternalAddress { host, address })),
            _ => Ok(public),
        }
    }
}

/// The resolver is shared by the requests of one client.
#[derive(Clone)]
pub(crate) struct SharedResolver(pub(crate) Arc<SignInResolver>);

impl Resolve for SharedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let this = self.0.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs = this.checked(host).await?;
            Ok(Box::new(addrs.into_iter().map(|ip| SocketAddr::new(ip, 0))) as Addrs)
        })
    }
}

/// The refusal in a failed request's causes, if that is why it failed.
pub(crate) fn refusal<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a InternalAddress> {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if let Some(found) = e.downcast_ref::<InternalAddress>() {
            return Some(found);
        }
        cause = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A lookup from a table; names not in it do not resolve.
    fn table(entries: &[(&str, &[&str])]) -> Lookup {
        let map: HashMap<String, Vec<IpAddr>> = entries
            .iter()
            .map(|(h, a)| {
                (
                    h.to_string(),
                    a.iter().map(|a| a.parse().expect("address")).collect(),
                )
            })
            .collect();
        Arc::new(move |host: String| {
            // Names are case-insensitive, and a final dot names the root.
            let found = map.get(&normalized(&host)).cloned();
            Box::pin(async move {
                found.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, host))
            })
        })
    }

    /// [`NAMES`], and `flip.example`, which resolves to `first` once and to `then` after.
    fn flipping(first: &'static str, then: &'static str) -> Lookup {
        let turns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let fallback = table(NAMES);
        Arc::new(move |host: String| {
            if host == "flip.example" {
                let turn = turns.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let ip: IpAddr = if turn == 0 { first } else { then }.parse().expect("ip");
                return Box::pin(async move { Ok(vec![ip]) });
            }
            fallback(host)
        })
    }

    fn resolver(server: &str, lookup: Lookup) -> SignInResolver {
        let url = Url::parse(server).expect("url");
        SignInResolver::with_lookup(&url, Vec::new(), lookup).expect("a resolver")
    }

    fn refused(r: Result<Vec<IpAddr>, Box<dyn std::error::Error + Send + Sync>>) -> String {
        match r {
            Ok(a) => panic!("resolved to {a:?}"),
            Err(e) => {
                assert!(refusal(e.as_ref()).is_some(), "{e}");
                e.to_string()
            }
        }
    }

    const NAMES: &[(&str, &[&str])] = &[
        ("mcp.example", &["203.0.113.5"]),
        ("auth.example", &["203.0.113.6"]),
        ("metadata.example", &["169.254.169.254"]),
        ("mixed.example", &["203.0.113.7", "10.0.0.7"]),
        ("mcp.corp", &["10.1.2.3"]),
        ("auth.corp", &["10.1.2.4"]),
        ("half.example", &["203.0.113.8", "fd00::1"]),
    ];

    #[tokio::test]
    async fn a_public_server_may_not_send_sign_in_to_a_name_that_resolves_internally() {
        let r = resolver("https://mcp.example/mcp", table(NAMES));
        // Before and after the server's own name was resolved.
        let why = refused(r.checked("metadata.example".into()).await);
        assert!(
            why.contains("metadata.example") && why.contains("169.254.169.254"),
            "{why}"
        );
        assert_eq!(
            r.checked("mcp.example".into()).await.expect("server").len(),
            1
        );
        refused(r.checked("metadata.example".into()).await);
        // One internal address among public ones: reached on the public ones only (a
        // ULA beside a public address is common), the internal one never given out.
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert_eq!(
            r.checked("mixed.example".into())
                .await
                .expect("public ones"),
            [ip("203.0.113.7")]
        );
        assert_eq!(
            r.checked("half.example".into()).await.expect("public ones"),
            [ip("203.0.113.8")]
        );
        assert!(r.checked("auth.example".into()).await.is_ok());
    }

    #[tokio::test]
    async fn a_server_by_its_public_address_is_public() {
        let r = resolver("https://203.0.113.5/mcp", table(NAMES));
        refused(r.checked("metadata.example".into()).await);
        assert!(r.checked("auth.example".into()).await.is_ok());
    }

    #[tokio::test]
    async fn a_server_whose_name_resolves_internally_signs_in_internally() {
        let r = resolver("https://mcp.corp/mcp", table(NAMES));
        // Until its name was resolved for sign-in, it counts as public.
        refused(r.checked("auth.corp".into()).await);
        r.checked("mcp.corp.".into()).await.expect("server");
        // Resolved, but not yet answered there: still public.
        refused(r.checked("auth.corp".into()).await);
        let server = Url::parse("https://MCP.corp/.well-known/x").expect("url");
        r.sent(&server, true);
        assert_eq!(
            r.checked("auth.corp".into()).await.expect("allowed"),
            ["10.1.2.4".parse::<IpAddr>().expect("ip")]
        );
    }

    // A server whose DNS answers internally once, for a request that then fails (TLS
    // for its name does not hold there), is not taken for internal: before, that one
    // answer let every later name through to internal addresses, the cloud's metadata
    // among them.
    #[tokio::test]
    async fn an_internal_answer_for_the_servers_name_that_is_never_answered_proves_nothing() {
        let r = resolver(
            "https://flip.example/mcp",
            flipping("10.9.9.9", "203.0.113.9"),
        );
        r.checked("flip.example".into()).await.expect("tried");
        refused(r.checked("metadata.example".into()).await);
        // Another host's answer says nothing of the server.
        r.sent(&Url::parse("https://auth.example/t").expect("url"), true);
        refused(r.checked("metadata.example".into()).await);
        r.sent(&Url::parse("https://flip.example/mcp").expect("url"), false);
        refused(r.checked("metadata.example".into()).await);
        assert!(r.server_unknown());
        // A late answer of a request made then does not count either.
        r.sent(&Url::parse("https://flip.example/mcp").expect("url"), true);
        refused(r.checked("metadata.example".into()).await);
    }

    #[tokio::test]
    async fn a_server_name_that_resolved_public_once_stays_public() {
        let r = resolver(
            "https://flip.example/mcp",
            flipping("203.0.113.9", "10.9.9.9"),
        );
        r.checked("flip.example".into()).await.expect("public");
        // Now internal: refused, and the server stays public.
        refused(r.checked("flip.example".into()).await);
        refused(r.checked("auth.corp".into()).await);
    }

    #[tokio::test]
    async fn names_that_do_not_resolve_fail_and_are_not_refusals() {
        let r = resolver("https://mcp.example/mcp", table(NAMES));
        let e = r
            .checked("nowhere.example".into())
            .await
            .expect_err("no such name");
        assert!(refusal(e.as_ref()).is_none(), "{e}");
    }

    /// A client that resolves through the resolver of server `url` (the names of
    /// [`NAMES`]).
    fn client_of(url: &str) -> reqwest::Client {
        let r = resolver(url, table(NAMES));
        let tls = crate::transport::tls::client_config(None).expect("tls");
        reqwest::Client::builder()
            .no_proxy()
            .tls_backend_preconfigured(tls)
            .dns_resolver(Arc::new(SharedResolver(Arc::new(r))))
            .build()
            .expect("client")
    }

    #[tokio::test]
    async fn a_client_with_the_resolver_fails_with_the_refusal_among_its_causes() {
        let client = client_of("https://mcp.example/mcp");
        let e = client
            .get("http://metadata.example:9/latest")
            .send()
            .await
            .expect_err("refused");
        let found = refusal(&e).unwrap_or_else(|| panic!("not found in {e:?}"));
        assert_eq!(found.host, "metadata.example");
        match super::super::send_failure(e) {
            super::super::AuthFailure::BadUrl { url, why } => {
                assert!(url.starts_with("http://metadata.example:9/"), "{url}");
                assert!(why.contains("internal address"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    // The headless authorizer fetches the authorization URL (the authorization
    // server's to choose) through the server's clients, with their resolver: not its
    // own, which would reach a name that resolves to an internal address.
    #[tokio::test]
    async fn a_headless_sign_in_fetches_through_the_servers_resolver() {
        use crate::transport::auth::{Authorizer, HeadlessAuthorizer, SignInRequest};
        let client = client_of("https://mcp.example/mcp");
        let mut request = SignInRequest::new("s", None, "https://as.example", Vec::new());
        request.clients = Some((client.clone(), client));
        let session = (HeadlessAuthorizer::new(None).expect("authorizer"))
            .start(&request)
            .await
            .expect("start");
        let e = session
            .finish("http://metadata.example:9/authorize".into())
            .await
            .expect_err("refused");
        assert!(e.contains("internal address"), "{e}");
    }

    #[test]
    fn nothing_is_checked_for_a_server_on_an_internal_address() {
        let any = table(NAMES);
        for internal in [
            "http://127.0.0.1:9/mcp",
            "http://localhost:9/mcp",
            "https://10.0.0.1/mcp",
        ] {
            let url = Url::parse(internal).expect("url");
            assert!(
                SignInResolver::with_lookup(&url, Vec::new(), any.clone()).is_none(),
                "{internal}"
            );
        }
        let public = Url::parse("https://mcp.example/mcp").expect("url");
        assert!(SignInResolver::with_lookup(&public, Vec::new(), any).is_some());
    }

    #[tokio::test]
    async fn only_the_proxies_own_names_pass_unchecked() {
        let url = Url::parse("https://mcp.example/mcp").expect("url");
        let r = SignInResolver::with_lookup(&url, vec!["auth.corp".into()], table(NAMES))
            .expect("a resolver");
        assert!(r.checked("AUTH.corp.".into()).await.is_ok(), "the proxy");
        // A name connected to directly (NO_PROXY, say) is checked as ever.
        refused(r.checked("metadata.example".into()).await);
    }

    #[tokio::test]
    async fn the_servers_own_name_is_checked_once_it_is_public() {
        let r = resolver("https://half.example/mcp", table(NAMES));
        // Public and internal addresses: the server is public, and its internal
        // address is not connected to.
        let public = ["203.0.113.8".parse::<IpAddr>().expect("ip")];
        assert_eq!(
            r.checked("half.example".into()).await.expect("public"),
            public
        );
        assert!(!r.server_unknown());
        refused(r.checked("mcp.corp".into()).await);
        // Another port of the server's name is the same name.
        assert_eq!(
            r.checked("HALF.example.".into()).await.expect("public"),
            public
        );
    }
}
