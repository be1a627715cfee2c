//! Name resolution for one server's sign-in requests. A server on the public network
//! may not point discovery, registration or token requests at this machine or a private
//! network ([`super::discovery::checked_url`] refuses such literal addresses); this
//! refuses the names that resolve there. The addresses checked are the ones connected
//! to, so a name cannot resolve one way for the check and another for the request.

use std::net::SocketAddr;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use super::discovery::is_internal_ip;

/// The resolver of the sign-in requests of the server at `host`: a name that resolves
/// to an internal address is refused unless the server's own host resolves to one too
/// (a server on a private network signs in on it).
pub(crate) struct SignInResolver {
    server_host: String,
}

impl SignInResolver {
    pub(crate) fn new(server_host: &str) -> SignInResolver {
        SignInResolver {
            server_host: server_host.to_string(),
        }
    }
}

/// Whether `host` resolves to an internal address; a name that does not resolve is not
/// taken to be internal.
async fn resolves_internal(host: &str) -> bool {
    match tokio::net::lookup_host((host, 0)).await {
        Ok(mut addrs) => addrs.any(|a| is_internal_ip(a.ip())),
        Err(_) => false,
    }
}

impl Resolve for SignInResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_string();
        let server = self.server_host.clone();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            // One internal address among public ones is enough: the connector may try it.
            if addrs.iter().any(|a| is_internal_ip(a.ip())) && !resolves_internal(&server).await {
                return Err(format!(
                    "{host} resolves to an internal address, and the server ({server}) is not on one"
                )
                .into());
            }
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn name(host: &str) -> Name {
        Name::from_str(host).expect("name")
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_this_machine_is_refused_for_a_server_that_is_not_on_it() {
        let public = SignInResolver::new("mcp.example.invalid");
        let refused = match public.resolve(name("localhost")).await {
            Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(e) => e.to_string(),
        };
        assert!(refused.contains("internal address"), "{refused}");
        assert!(refused.contains("mcp.example.invalid"), "{refused}");
    }

    #[tokio::test]
    async fn a_server_on_an_internal_address_signs_in_on_one() {
        let internal = SignInResolver::new("localhost");
        let addrs: Vec<SocketAddr> = internal
            .resolve(name("localhost"))
            .await
            .expect("resolves")
            .collect();
        assert!(!addrs.is_empty());
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_an_error_not_a_pass() {
        let public = SignInResolver::new("mcp.example.invalid");
        assert!(public.resolve(name("auth.example.invalid")).await.is_err());
    }
}
