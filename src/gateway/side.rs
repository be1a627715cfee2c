//! The gateway's side listeners (`--metrics`, `--admin`): plain HTTP/1.1, a few
//! connections at once and a few per peer address, one request each (scrapers and admins
//! make one), each held at most half a minute, answered by one async function. The
//! bounded accept loop is the main listener's too.
//!
//! A peer that opens connections and sends nothing holds at most [`MAX_PER_PEER`] slots,
//! each for the header timeout: it cannot keep a scraper or an admin on another address
//! out. Peers that share one address (every local user on loopback) share its slots.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};

/// Whether `headers` carry `Authorization: Bearer T` with T one of `tokens` (compared
/// by SHA-256, the only form the config holds).
pub(crate) fn bearer_allowed(headers: &hyper::HeaderMap, tokens: &[super::TokenHash]) -> bool {
    let Some(token) = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .and_then(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer").then_some(token))
    else {
        return false;
    };
    let hash = crate::util::hash::sha256_hex(token.trim().as_bytes());
    tokens.iter().any(|t| t.sha256.eq_ignore_ascii_case(&hash))
}

/// Connections served at once: scrapers and admins are few.
const MAX_CONNECTIONS: usize = 64;
/// Connections served at once from one peer address; more are closed unread.
pub(crate) const MAX_PER_PEER: usize = 8;
/// The longest one connection is held (a slow client loses its slot).
const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// How long a request's headers may take.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// What a connection's headers may take while they are read (a body streams past it):
/// hyper's default, about 400 KiB, times every connection open is memory anyone may
/// take before they are identified.
pub(super) const MAX_HEADER_BUFFER: usize = 128 << 10;

/// Connections open per peer address, each address held to `limit`.
pub(crate) struct Peers {
    open: parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
    limit: usize,
}

/// One connection's place among its peer's; given back when dropped.
pub(crate) struct PeerSlot {
    peers: Arc<Peers>,
    ip: std::net::IpAddr,
}

impl Peers {
    pub(crate) fn new(limit: usize) -> Arc<Peers> {
        Arc::new(Peers {
            open: parking_lot::Mutex::default(),
            limit,
        })
    }

    /// A place for one more connection from `ip`, if it has fewer than the limit.
    pub(crate) fn take(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<PeerSlot> {
        let ip = peer_of(ip);
        let mut open = self.open.lock();
        let n = open.entry(ip).or_default();
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: self.clone(),
            ip,
        })
    }
}

/// The peer an address counts for: an IPv4 address itself (also when it comes mapped
/// into IPv6), an IPv6 address by its /64, which one host is commonly given whole (one
/// peer must not get a share per address it can pick).
fn peer_of(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                std::net::IpAddr::V6(prefix.into())
            }
        },
        v4 => v4,
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock();
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// The next connection on `listener` with the permit that counts it among
/// `connections` (a full set waits for one to close), or `None` once `shutdown` resolves.
/// A failed accept is logged (`what` names the listener; `failures`, the listener's
/// own budget, logs the first ten, then each power of two) and the next one awaited;
/// after a pause unless the failure was one connection's (a peer that reset its own
/// costs no pause, which would slow every other peer): out of file descriptors, the
/// connection waiting stays in the backlog and every accept fails at once, which would
/// spin a worker.
pub(crate) async fn accept(
    what: &str,
    listener: &tokio::net::TcpListener,
    connections: &Arc<tokio::sync::Semaphore>,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    failures: &crate::util::log_budget::LogBudget,
) -> Option<(tokio::net::TcpStream, tokio::sync::OwnedSemaphorePermit)> {
    loop {
        let permit = tokio::select! {
            p = connections.clone().acquire_owned() => p.ok()?,
            () = shutdown.as_mut() => return None,
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => return Some((stream, permit)),
                Err(e) => {
                    if let Some(failed) = failures.log() {
                        tracing::warn!(listener = what, error = %e, failed, "accept failed");
                    }
                    // One connection's own failure passes with it; anything else (out of
                    // descriptors or memory, a security module's refusal) may fail every
                    // accept at once while the connection waits in the backlog.
                    let one_connections = matches!(
                        e.raw_os_error(),
                        Some(
                            libc::ECONNABORTED
                                | libc::ECONNRESET
                                | libc::EPROTO
                                | libc::EINTR
                                | libc::EAGAIN
                                | libc::ENETDOWN
                                | libc::ENETUNREACH
                                | libc::EHOSTDOWN
                                | libc::EHOSTUNREACH
                        )
                    );
                    if !one_connections {
                        tokio::select! {
                            () = tokio::time::sleep(ACCEPT_PAUSE) => {}
                            () = shutdown.as_mut() => return None,
                        }
                    }
                }
            },
            () = shutdown.as_mut() => return None,
        }
    }
}

/// How long a listener waits after a failed accept.
const ACCEPT_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Serves `answer` on `listener` until `shutdown` resolves; `what` names the listener
/// in logs.
pub(crate) async fn serve<F, Fut>(
    what: &'static str,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
    answer: F,
) where
    F: Fn(Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let peers = Peers::new(MAX_PER_PEER);
    let mut shutdown = std::pin::pin!(shutdown);
    let failures = crate::util::log_budget::LogBudget::default();
    while let Some((stream, permit)) =
        accept(what, &listener, &connections, &mut shutdown, &failures).await
    {
        let Ok(peer) = stream.peer_addr() else {
            continue; // gone already
        };
        let Some(slot) = peers.take(peer.ip()) else {
            tracing::debug!(listener = what, peer = %peer.ip(), "connection closed: its peer has {MAX_PER_PEER} open");
            continue;
        };
        let answer = answer.clone();
        let service = hyper::service::service_fn(move |req| {
            let reply = answer(req);
            async move { Ok::<_, Infallible>(reply.await) }
        });
        // One request per connection (each answer says `Connection: close`), so a
        // refused one frees its slot at once.
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .max_buf_size(MAX_HEADER_BUFFER)
            .keep_alive(false)
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
            drop((permit, slot));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::peer_of;

    #[test]
    fn a_peer_is_an_ipv4_address_or_an_ipv6_slash_64() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().expect("ip");
        assert_eq!(peer_of(ip("192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(peer_of(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(peer_of(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(
            peer_of(ip("2001:db8:1:2:ffff:ffff:ffff:ffff")),
            peer_of(ip("2001:db8:1:2::9"))
        );
        assert_ne!(
            peer_of(ip("2001:db8:1:3::1")),
            peer_of(ip("2001:db8:1:2::1"))
        );
    }
}
