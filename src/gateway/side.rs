//! The gateway's side listeners (`--metrics`, `--admin`): plain HTTP/1.1, a few
//! connections at once, each held at most a minute, answered by one async function. The
//! bounded accept loop is the main listener's too.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};

/// Connections served at once: scrapers and admins are few.
const MAX_CONNECTIONS: usize = 64;
/// The longest one connection is held (a slow client loses its slot).
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// The next connection on `listener` with the permit that counts it among
/// `connections` (a full set waits for one to close), or `None` once `shutdown` resolves.
/// A failed accept is logged (`what` names the listener) and the next one awaited.
pub(crate) async fn accept(
    what: &str,
    listener: &tokio::net::TcpListener,
    connections: &Arc<tokio::sync::Semaphore>,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Option<(tokio::net::TcpStream, tokio::sync::OwnedSemaphorePermit)> {
    loop {
        let permit = tokio::select! {
            p = connections.clone().acquire_owned() => p.ok()?,
            () = shutdown.as_mut() => return None,
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => return Some((stream, permit)),
                Err(e) => tracing::warn!(listener = what, error = %e, "accept failed"),
            },
            () = shutdown.as_mut() => return None,
        }
    }
}

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
    let mut shutdown = std::pin::pin!(shutdown);
    while let Some((stream, permit)) = accept(what, &listener, &connections, &mut shutdown).await {
        let answer = answer.clone();
        let service = hyper::service::service_fn(move |req| {
            let reply = answer(req);
            async move { Ok::<_, Infallible>(reply.await) }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10))
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
            drop(permit);
        });
    }
}
